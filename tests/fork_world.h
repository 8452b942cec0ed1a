/* fork_world.h - a world of ranks as forked processes on one free
   loopback port, for the TCP tests (tests/test_dist.c, tests/test_zero.c). */
#ifndef CAPEX_TEST_FORK_WORLD_H
#define CAPEX_TEST_FORK_WORLD_H
#include "free_port.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
/* Runs body(rank, world, port, mode) for ranks 1..world-1 in forked children
   (exit status 0 when body returns 0) and rank 0 here, on a free port; waits
   for the children. Returns rank 0's result; codes[i] is rank i's exit status
   (100: it did not exit normally). At most 8 ranks. */
typedef int (*fork_world_body)(int rank, int world, int port, int mode);
static int fork_world(int world, int mode, int *codes, fork_world_body body) {
    pid_t pids[8];
    int port = free_port(), r, i;
    fflush(stdout);
    fflush(stderr);
    for (i = 1; i < world; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(body(i, world, port, mode) ? 1 : 0);
    }
    r = body(0, world, port, mode);
    for (i = 1; i < world; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    return r;
}
#endif
