/* nccl_world.h - a world of ranks on the stand-in NCCL (tests/fake_libnccl.c)
   as forked processes: each rank gets a context on the driver named by
   CAPEX_LIBCUDA_PATH (tests/fake_libcuda.c or the emulator) and an NCCL comm
   from one unique id, then runs the body. Set CAPEX_LIBCUDA_PATH and
   CAPEX_NCCL_PATH first; no library may have started threads (fork). Include
   after capex_cuda.h. */
#ifndef CAPEX_TEST_NCCL_WORLD_H
#define CAPEX_TEST_NCCL_WORLD_H
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*nccl_world_body)(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user);

static int nccl_world_rank(const capex_nccl_unique_id *id, int rank, int world, nccl_world_body body, void *user) {
    capex_cuda_context *ctx = NULL;
    capex_nccl_desc nd;
    capex_comm c;
    int e;
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) {
        fprintf(stderr, "rank %d: context: %s\n", rank, capex_last_error());
        return 60;
    }
    capex_nccl_desc_init(&nd);
    nd.ctx = ctx;
    if (capex_comm_init_nccl_id(&c, id, rank, world, &nd) != CAPEX_OK) {
        fprintf(stderr, "rank %d: NCCL init: %s\n", rank, capex_last_error());
        capex_cuda_context_destroy(ctx);
        return 61;
    }
    e = body(ctx, &c, rank, world, user);
    if (e) fprintf(stderr, "rank %d of %d: body failed (%d): %s\n", rank, world, e, capex_last_error());
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    return e;
}

/* Runs body on ranks 1..world-1 in forked children and rank 0 here. Returns
   rank 0's result (nonzero: failed); codes[i] is rank i's exit status (100:
   it did not exit normally). At most 16 ranks. */
static int nccl_world_run(int world, nccl_world_body body, void *user, int *codes) {
    capex_nccl_unique_id id;
    pid_t pids[16];
    int r, i;
    if (world < 1 || world > 16) return 62;
    if (capex_nccl_get_unique_id(&id) != CAPEX_OK) {
        fprintf(stderr, "unique id: %s\n", capex_last_error());
        return 63;
    }
    fflush(stdout);
    fflush(stderr);
    for (i = 1; i < world; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(nccl_world_rank(&id, i, world, body, user) & 0x7f);
    }
    r = nccl_world_rank(&id, 0, world, body, user);
    codes[0] = r;
    for (i = 1; i < world; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    return r;
}
#endif
