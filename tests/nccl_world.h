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
#include <string.h>
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

#ifdef __GNUC__
#define NCCL_WORLD_UNUSED __attribute__((unused))
#else
#define NCCL_WORLD_UNUSED
#endif
/* A child entry's work (cuda_test_util.h's run_child; include it first): body
   on a world of 2 on the stand-in NCCL; res->code 0 when both ranks pass. */
/* guard_s: the stand-in NCCL's FAKE_NCCL_TIMEOUT, a hang guard: a stuck
   test fails instead of hanging (shorter where a hang is what is tested) */
NCCL_WORLD_UNUSED static void nccl_world2_child_guard(nccl_world_body body, child_result *res, const char *guard_s) {
    int codes[16] = {0}, r;
    setenv("FAKE_NCCL_TIMEOUT", guard_s, 1);
    r = nccl_world_run(2, body, NULL, codes);
    res->code = r || codes[1] ? 1 : 0;
    snprintf(res->message, sizeof res->message, "rank 0: %d, rank 1: %d (their stderr says why)", codes[0], codes[1]);
}
NCCL_WORLD_UNUSED static void nccl_world2_child(nccl_world_body body, child_result *res) {
    nccl_world2_child_guard(body, res, "120");
}
/* Why a world test on the emulator cannot run here, or NULL. */
NCCL_WORLD_UNUSED static const char *nccl_world_skip_reason(void) {
    const char *np = getenv("CAPEX_NCCL_PATH"), *lp = getenv("CAPEX_LIBCUDA_PATH");
    if (!np || !strstr(np, "fake")) return "two ranks need a GPU each; the stand-in NCCL runs them on the emulator";
    if (!lp || strstr(lp, "fake")) return "kernels and device buffers need the emulator driver (CAPEX_LIBCUDA_PATH)";
    return NULL;
}
#endif
