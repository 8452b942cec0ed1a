/* Two ranks of an example's training over the TCP backend, for tests that
   check the replicas stay bit-identical. Rank 0 runs in the test; rank 1 in a
   fresh exec of the test program ("--rank1 PORT FD": main() hands those to
   two_ranks_child_main), because libgomp's thread pool does not survive
   fork(), so a forked child that trains would hang. Include after capex.h and
   capex_test.h. */
#ifndef CAPEX_TEST_TWO_RANKS_H
#define CAPEX_TEST_TWO_RANKS_H
#include "capex_test.h" /* CT_HANG_GUARD_S */
#include "free_port.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Trains this rank on comm; 1 on success, with the weights' crc32 in *crc. */
typedef int (*two_ranks_train_fn)(capex_comm *comm, int rank, uint32_t *crc);

static int two_ranks_rank(two_ranks_train_fn train_rank, int rank, int port, uint32_t *crc) {
    capex_dist_env env;
    capex_comm comm;
    int ok;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = 2; env.local_rank = rank; env.local_world_size = 2;
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    env.master_port = port;
    if (capex_comm_init_tcp(&comm, &env, CT_HANG_GUARD_S) != CAPEX_OK) return 0;
    comm.timeout_s = CT_HANG_GUARD_S; /* a dead or stuck peer fails the test instead of hanging it */
    ok = train_rank(&comm, rank, crc);
    capex_comm_destroy(&comm);
    return ok;
}

/* Rank 1's process: trains, writes its crc to FD; exit status 0 on success. */
static int two_ranks_child_main(two_ranks_train_fn train_rank, const char *port_s, const char *fd_s) {
    uint32_t crc = 0;
    int ok = two_ranks_rank(train_rank, 1, atoi(port_s), &crc);
    ssize_t w = write(atoi(fd_s), &crc, sizeof crc);
    return ok && w == (ssize_t)sizeof crc ? 0 : 1;
}

/* Runs both ranks; the test fails (message in ct) unless both succeed and
   report their weights' crc32 in *crc0 and *crc1. */
static void two_ranks_run(ct_state *ct, const char *prog, two_ranks_train_fn train_rank, uint32_t *crc0,
                          uint32_t *crc1) {
    int fds[2], port = free_port(), st = 0, ok0;
    pid_t pid;
    CT_CHECK(port > 0 && pipe(fds) == 0, "port / pipe");
    fflush(stdout);
    pid = fork();
    CT_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        char port_s[16], fd_s[16];
        snprintf(port_s, sizeof port_s, "%d", port);
        snprintf(fd_s, sizeof fd_s, "%d", fds[1]);
        close(fds[0]);
        execl("/proc/self/exe", prog, "--rank1", port_s, fd_s, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    ok0 = two_ranks_rank(train_rank, 0, port, crc0);
    waitpid(pid, &st, 0);
    CT_CHECK(read(fds[0], crc1, sizeof *crc1) == (ssize_t)sizeof *crc1, "rank 1 reported (status %d)", st);
    close(fds[0]);
    CT_CHECK(ok0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 0 ok %d, rank 1 status %d: %s", ok0, st,
             capex_last_error());
}
#endif
