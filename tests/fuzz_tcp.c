/* libFuzzer target for the TCP comm backend's receive paths in both
   directions: the collectives of tests/fuzz_tcp.h run on one rank whose
   sockets (socketpairs) were filled with the input and then closed, so every
   message header and payload it reads comes from the fuzzer. Input: byte 0
   bit 0 = rank under test (0 or 1), bit 1 = world of 3 (else 2); bytes 1-2 =
   length of the first stream (rank 0 in a world of 3 reads two: peer 1's,
   then the rest for peer 2); the streams follow. Every collective must end
   in CAPEX_OK or CAPEX_ERR_COMM (never a crash, a wait or another error).
   Seeds: tests/corpus/fuzz_tcp (tests/fuzz_net_seeds.c).
   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_tcp.c */
#define _POSIX_C_SOURCE 200809L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "fuzz_tcp.h"
#include <stdlib.h>
#include <signal.h>

/* A socket for the comm (fds[0] of the pair) whose peer end has sent `n`
   bytes and shut down writing; *other keeps that end open for the comm's sends. */
static int filled_socket(const uint8_t *p, size_t n, int *other) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    capex__set_nonblock(sv[0]);
    if (n && capex__io_all(sv[1], (void *)(uintptr_t)p, n, 1, capex_dist_now() + 5.0) != 0) abort(); /* fits: -max_len */
    shutdown(sv[1], SHUT_WR);
    *other = sv[1];
    return sv[0];
}

static int verbose; /* FUZZ_VERBOSE=1: print each input's verdict (to check seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    signal(SIGPIPE, SIG_IGN);
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    return 0;
}

/* An oracle independent of capex__tcp_recv: a stream that let the whole
   sequence succeed is a run of well-formed messages (magic, a known op,
   sequence numbers that never fall (a broadcast's messages share one), a
   payload that fits) up to the barrier, #8. words: the stream's first
   broadcast header of a sequence number is a word alone (its byte count, no
   payload): what rank 0 reads from each peer, and the root's go. */
static int stream_well_formed(const uint8_t *p, size_t n, int words) {
    size_t pos = 0;
    uint32_t last = 0, word_seq = 0;
    while (pos + 24 <= n) {
        uint32_t op = capex__get32(p + pos + 4), seq = capex__get32(p + pos + 8);
        uint64_t len = capex__get64(p + pos + 16);
        if (words && op == CAPEX__TCP_BROADCAST && seq != word_seq) { word_seq = seq; len = 0; }
        if (capex__get32(p + pos) != CAPEX__TCP_MAGIC || op < 1 || op > 4 || seq < last || len > n - pos - 24) return 0;
        if (seq == 8) return op == CAPEX__TCP_BARRIER;
        last = seq;
        pos += 24 + (size_t)len;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int rank, world, fds[3] = {-1, -1, -1}, other[3] = {-1, -1, -1}, p;
    size_t first;
    capex_comm c;
    capex_result r;
    if (size < 3 || size > 65536) return 0;
    rank = data[0] & 1;
    world = data[0] & 2 ? 3 : 2;
    first = (size_t)data[1] | ((size_t)data[2] << 8);
    data += 3;
    size -= 3;
    if (first > size) first = size;
    if (rank == 1) fds[0] = filled_socket(data, size, &other[0]);
    else if (world == 2) fds[1] = filled_socket(data, size, &other[1]);
    else {
        fds[1] = filled_socket(data, first, &other[1]);
        fds[2] = filled_socket(data + first, size - first, &other[2]);
    }
    if (fuzz_tcp_comm(&c, rank, world, fds) != 0) abort();
    r = fuzz_tcp_sequence(&c);
    if (verbose) fprintf(stderr, "rank %d of %d: %s\n", rank, world, capex_result_string(r));
    if (r != CAPEX_OK && r != CAPEX_ERR_COMM) {
        fprintf(stderr, "unexpected %s: %s\n", capex_result_string(r), capex_last_error());
        abort();
    }
    /* rank 1 reads words only as the broadcast's root (world 2) */
    if (r == CAPEX_OK && !(rank == 1 || world == 2 ? stream_well_formed(data, size, rank == 0 || world == 2)
                                                   : stream_well_formed(data, first, 1) &&
                                                         stream_well_formed(data + first, size - first, 1)))
        abort();
    capex_comm_destroy(&c);
    for (p = 0; p < 3; p++) if (other[p] >= 0) close(other[p]);
    return 0;
}
