/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read
   it back, close): for tests that start rendezvous servers. 0 on failure. */
#ifndef CAPEX_TEST_FREE_PORT_H
#define CAPEX_TEST_FREE_PORT_H
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

static int free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001u);
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}
#endif
