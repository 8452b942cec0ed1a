/* The NCCL backend on a real GPU, world size 1 (`make gpu-test`; also part of
   `make test`, where every test SKIPs with the reason when there is no GPU,
   no NCCL, or the driver is the CPU stand-in; `make ci-extra` runs it on the
   CPU emulator driver with the stand-in NCCL, where only the stuck-stream
   test skips):
   - allreduce SUM/AVG, broadcast, allgather, barrier on device buffers in
     f32/f16/bf16/f64/i64 against host references, poisoned outputs;
   - DDP with one rank over NCCL: grads written by a slow kernel on the
     engine's stream, so a missing stream order (comm stream not waiting for
     the user's) shows as unscaled grads; predivide 2 without averaging
     halves every grad, f32 and bf16 (through f32 buckets) checked bit-exact;
   - the abort path: the engine's stream is busy for ~2 s, comm->timeout_s is
     0.3 s: the allreduce returns CAPEX_ERR_TIMEOUT after the deadline,
     ncclCommAbort runs, the comm fails fast afterwards and is destroyed
     without hanging.
   World sizes above 1 need one GPU per rank: run examples under torchrun or
   mpirun on a multi-GPU node (capex_cuda.h, NCCL communicator). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include "gpu_test_kernels.h"
#include "nccl_world.h"

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

#define OK(call) CT_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())

#define OPEN(ctx, comm, user) CT_OPEN_NCCL1(ctx, comm, user, "real NCCL needs a GPU", 0)

static uint64_t seed = 12345;
static double rnd(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 4503599627370496.0 - 1.0;
}

CT_TEST(collectives_on_device) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm c;
    enum { N = 1000 };
    static unsigned char in[N * 8], out[N * 8], back[N * 8];
    capex_cuda_ptr a = 0, b = 0;
    int t, op, i;
    OPEN(ctx, c, user);
    OK(capex_cuda_malloc(ctx, sizeof in, &a));
    OK(capex_cuda_malloc(ctx, sizeof in, &b));
    for (t = 0; t <= 4; t++) {
        size_t es = capex_comm_dtype_size((capex_dtype)t);
        for (i = 0; i < N; i++) {
            double v = rnd() * 100.0;
            float f = (float)v;
            uint16_t h = t == 1 ? capex_f32_to_f16(f) : capex_f32_to_bf16(f);
            int64_t q = (int64_t)(v * 1e15);
            if (t == 0) memcpy(in + i * 4, &f, 4);
            else if (t <= 2) memcpy(in + i * 2, &h, 2);
            else if (t == 3) memcpy(in + i * 8, &v, 8);
            else memcpy(in + i * 8, &q, 8);
        }
        for (op = 0; op < (t == 4 ? 1 : 2); op++) {
            OK(capex_cuda_memcpy_htod(ctx, a, in, N * es, NULL));
            OK(capex_cuda_memset_u8(ctx, b, 0xa5, N * es, NULL));
            OK(capex_comm_allreduce(&c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, N, (capex_dtype)t, (capex_reduce_op)op));
            OK(capex_cuda_memcpy_dtoh(ctx, out, b, N * es, NULL));
            CT_CHECK(memcmp(in, out, N * es) == 0, "allreduce dtype %d op %d: one rank gives its own values", t, op);
        }
        OK(capex_comm_broadcast(&c, (void *)(uintptr_t)b, N, (capex_dtype)t, 0));
        OK(capex_cuda_memset_u8(ctx, a, 0x5a, N * es, NULL));
        OK(capex_comm_allgather(&c, (void *)(uintptr_t)b, (void *)(uintptr_t)a, N, (capex_dtype)t));
        OK(capex_cuda_memcpy_dtoh(ctx, back, a, N * es, NULL));
        CT_CHECK(memcmp(in, back, N * es) == 0, "broadcast + allgather dtype %d", t);
    }
    OK(capex_comm_barrier(&c));
    capex_comm_destroy(&c);
    capex_cuda_free(ctx, a);
    capex_cuda_free(ctx, b);
    capex_cuda_stream_destroy(ctx, user);
    capex_cuda_context_destroy(ctx);
}

static const char *spin_src = gpu_test_spin_src; /* tests/gpu_test_kernels.h */

static capex_result spin_fill(capex_cuda_context *ctx, capex_cuda_stream s, void *x, unsigned long long n, float v,
                              long long cycles) {
    capex_cuda_module *m;
    capex_cuda_function f;
    capex_result r;
    unsigned grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
    capex_cuda_ptr p = (capex_cuda_ptr)(uintptr_t)x;
    void *args[4];
    if ((r = capex_cuda_module_compile(ctx, spin_src, "spin.cu", NULL, 0, &m)) != CAPEX_OK) return r;
    if ((r = capex_cuda_module_get_function(m, "spin_fill", &f)) != CAPEX_OK) return r;
    args[0] = &p; args[1] = &n; args[2] = &v; args[3] = &cycles;
    return capex_cuda_launch(&f, grid, block, 0, s, args);
}

CT_TEST(ddp_one_rank_stream_order) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm c;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    capex_cuda_ptr w0 = 0, w1 = 0;
    enum { N0 = 3000, N1 = 700 };
    static float g0[N0], f1[N1];
    static uint16_t g1[N1];
    int it, i;
    long long cycles;
    OPEN(ctx, c, user);
    CT_NEED_NVRTC();
    cycles = 50000000LL; /* ~25-50 ms at 1-2 GHz */
    OK(capex_cuda_malloc(ctx, N0 * 4, &w0));
    OK(capex_cuda_malloc(ctx, N1 * 2, &w1));
    OK(capex_cuda_memset_u8(ctx, w0, 0, N0 * 4, NULL));
    OK(capex_cuda_memset_u8(ctx, w1, 0, N1 * 2, NULL));
    ps[0].data = (void *)(uintptr_t)w0; ps[0].numel = N0; ps[0].dtype = CAPEX_F32; ps[0].grad = NULL;
    ps[1].data = (void *)(uintptr_t)w1; ps[1].numel = N1; ps[1].dtype = CAPEX_BF16; ps[1].grad = NULL;
    capex_ddp_desc_init(&dd);
    dd.gradient_average = 0; dd.gradient_predivide_factor = 2.0f; dd.allreduce_always_fp32 = 1;
    dd.first_bucket_bytes = 4096; dd.bucket_bytes = 4096;
    OK(capex_ddp_create(&ddp, &c, ps, 2, &dd));
    for (it = 0; it < 3; it++) {
        float v = 0.5f + (float)it;
        /* bf16 grads: written by a host copy after the f32 ones; the f32 grads by a slow kernel */
        for (i = 0; i < N1; i++) g1[i] = capex_f32_to_bf16((float)rnd());
        OK(capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, 1), g1, sizeof g1, user));
        OK(capex_cuda_stream_synchronize(ctx, user)); /* g1 is a host buffer reused next iteration */
        OK(capex_ddp_grad_ready(ddp, 1));
        OK(spin_fill(ctx, user, capex_ddp_grad(ddp, 0), N0, v, cycles));
        OK(capex_ddp_grad_ready(ddp, 0)); /* returns at once; the kernel is still spinning */
        OK(capex_ddp_finalize(ddp));
        OK(capex_cuda_memcpy_dtoh(ctx, g0, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, 0), sizeof g0, user));
        OK(capex_cuda_memcpy_dtoh(ctx, f1, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, 1), N1 * 2, user));
        OK(capex_cuda_stream_synchronize(ctx, user));
        for (i = 0; i < N0; i++)
            CT_CHECK(g0[i] == v * (float)(i + 1) * 0.5f, "it %d: f32 grad %d = %g, want %g (stream order?)", it, i,
                     (double)g0[i], (double)(v * (float)(i + 1) * 0.5f));
        for (i = 0; i < N1; i++) {
            uint16_t got;
            memcpy(&got, (const char *)f1 + i * 2, 2);
            CT_CHECK(got == capex_f32_to_bf16(capex_bf16_to_f32(g1[i]) * 0.5f), "it %d: bf16 grad %d", it, i);
        }
        OK(capex_ddp_zero_grad(ddp));
    }
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&c);
    capex_cuda_free(ctx, w0);
    capex_cuda_free(ctx, w1);
    capex_cuda_stream_destroy(ctx, user);
    capex_cuda_context_destroy(ctx);
}

CT_TEST(stuck_stream_times_out_and_aborts) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm c;
    capex_cuda_ptr a = 0;
    capex_result r;
    double t0, dt;
    char msg[600];
    OPEN(ctx, c, user);
    if (strstr(capex_cuda_context_device(ctx)->name, "emulator")) { /* tests/emu_libcuda.cc */
        capex_comm_destroy(&c);
        capex_cuda_stream_destroy(ctx, user);
        capex_cuda_context_destroy(ctx);
        CT_SKIP("the CPU emulator runs each launch to completion before returning: no stream can stay busy");
    }
    CT_NEED_NVRTC();
    OK(capex_cuda_malloc(ctx, 4096, &a));
    /* ~2 s at 1-2 GHz: the collective waits behind it */
    OK(spin_fill(ctx, user, (void *)(uintptr_t)a, 1024, 1.0f, 3000000000LL));
    c.timeout_s = 0.3;
    t0 = capex_dist_now();
    r = capex_comm_allreduce(&c, (void *)(uintptr_t)a, (void *)(uintptr_t)a, 1024, CAPEX_F32, CAPEX_REDUCE_SUM);
    dt = capex_dist_now() - t0;
    snprintf(msg, sizeof msg, "%s", capex_last_error());
    CT_CHECK(r == CAPEX_ERR_TIMEOUT, "%s: %s", capex_result_string(r), msg);
    /* the abort inside the call may wait for kernels already queued (NCCL frees
       device memory): no upper bound, the point is that it returns (a lower
       bound only: load cannot make the wait shorter) */
    CT_CHECK(dt >= 0.29, "returned after %.2f s (deadline 0.3 s)", dt);
    CT_CHECK(c.failed, "comm marked failed");
    CT_CHECK(capex_comm_barrier(&c) == CAPEX_ERR_COMM, "fails fast after the abort");
    capex_comm_destroy(&c);
    OK(capex_cuda_stream_synchronize(ctx, user));
    capex_cuda_free(ctx, a);
    capex_cuda_stream_destroy(ctx, user);
    capex_cuda_context_destroy(ctx);
}

/* Overlap on a real GPU: DDP's staging of a bucket during backward (f32
   copy, predivide) must not make the engine's stream wait for the comm's
   stream, where earlier allreduces may still run. A kernel on the comm's
   stream stands in for such an allreduce: it waits (up to ~2 s) for a flag
   that the engine's stream sets after two buckets' grad_ready. If the
   engine's stream were held behind it, the flag would come too late. */
static capex_result flag_fns(capex_cuda_context *ctx, capex_cuda_function *wait_fn, capex_cuda_function *set_fn) {
    capex_cuda_module *m;
    capex_result r;
    if ((r = capex_cuda_module_compile(ctx, gpu_test_flag_src, "flag.cu", NULL, 0, &m)) != CAPEX_OK) return r;
    if ((r = capex_cuda_module_get_function(m, "wait_flag", wait_fn)) != CAPEX_OK) return r;
    return capex_cuda_module_get_function(m, "set_flag", set_fn);
}
CT_TEST(ddp_backward_overlaps_inflight_allreduce) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm c;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    capex_cuda_function wait_fn, set_fn;
    capex_cuda_ptr w0 = 0, w1 = 0, flag = 0, seen = 0;
    unsigned one[3] = {1, 1, 1}, got = 7;
    long long cycles = 4000000000LL; /* ~2 s at 2 GHz: only a bound, met when the overlap is lost */
    int it;
    OPEN(ctx, c, user);
    CT_NEED_NVRTC();
    OK(flag_fns(ctx, &wait_fn, &set_fn)); /* loaded before: a module load may wait for the device */
    if (strstr(capex_cuda_context_device(ctx)->name, "emulator")) { /* tests/emu_libcuda.cc */
        capex_comm_destroy(&c);
        capex_cuda_stream_destroy(ctx, user);
        capex_cuda_context_destroy(ctx);
        CT_SKIP("the CPU emulator runs each launch to completion before returning: two streams never run at once "
                "(the kernels compiled)");
    }
    OK(capex_cuda_malloc(ctx, 2048 * 2, &w0));
    OK(capex_cuda_malloc(ctx, 2048 * 2, &w1));
    OK(capex_cuda_malloc(ctx, 8, &flag));
    seen = flag + 4;
    OK(capex_cuda_memset_u8(ctx, w0, 0, 2048 * 2, NULL));
    OK(capex_cuda_memset_u8(ctx, w1, 0, 2048 * 2, NULL));
    ps[0].data = (void *)(uintptr_t)w0; ps[0].numel = 2048; ps[0].dtype = CAPEX_BF16; ps[0].grad = NULL;
    ps[1].data = (void *)(uintptr_t)w1; ps[1].numel = 2048; ps[1].dtype = CAPEX_BF16; ps[1].grad = NULL;
    capex_ddp_desc_init(&dd);
    dd.gradient_predivide_factor = 2.0f; dd.allreduce_always_fp32 = 1;
    dd.first_bucket_bytes = 4096; dd.bucket_bytes = 4096;
    OK(capex_ddp_create(&ddp, &c, ps, 2, &dd));
    CT_CHECK(capex_ddp_num_buckets(ddp) == 2, "%d buckets", (int)capex_ddp_num_buckets(ddp));
    for (it = 0; it < 2; it++) { /* the first loads the kernels and sizes the scratch */
        void *wargs[3], *sargs[1];
        OK(capex_cuda_memset_u8(ctx, flag, 0, 8, NULL));
        OK(capex_cuda_stream_synchronize(ctx, NULL)); /* the comm's stream does not order after the legacy one */
        wargs[0] = &flag; wargs[1] = &seen; wargs[2] = &cycles;
        sargs[0] = &flag;
        if (it == 1) OK(capex_cuda_launch(&wait_fn, one, one, 0, (capex_cuda_stream)c.stream, wargs));
        OK(capex_ddp_grad_ready(ddp, 1));
        OK(capex_ddp_grad_ready(ddp, 0));
        OK(capex_cuda_launch(&set_fn, one, one, 0, user, sargs));
        OK(capex_ddp_finalize(ddp));
        OK(capex_cuda_stream_synchronize(ctx, user));
        OK(capex_ddp_zero_grad(ddp));
    }
    OK(capex_cuda_memcpy_dtoh(ctx, &got, seen, 4, NULL));
    CT_CHECK(got == 1, "the engine's stream set the flag only after the comm stream's kernel gave up waiting (%u): "
                       "bucket staging made it wait for the comm stream", got);
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&c);
    capex_cuda_free(ctx, w0);
    capex_cuda_free(ctx, w1);
    capex_cuda_free(ctx, flag);
    capex_cuda_stream_destroy(ctx, user);
    capex_cuda_context_destroy(ctx);
}

/* DDP over a world of 2 (forked ranks, the stand-in NCCL on the emulator):
   grads written and read on the comm's user stream, ready in an order that
   is not the registration order (rebuild_buckets moves them after the first
   step), f32/bf16/f16 params through f32 buckets, predivide 2, one param in
   copy mode, one unused every other step (find_unused_parameters). The
   grads k/16 + rank + it average exactly in every dtype. g_half: half
   buckets reduced in their dtype, predivide 4 (then times 2): the scales of
   half buckets go through the comm's f32 scratch on the user stream. */
static int g_half;
enum { W_NP = 4 };
static const size_t w_numel[W_NP] = {500, 300, 200, 100};
static const capex_dtype w_dt[W_NP] = {CAPEX_F32, CAPEX_BF16, CAPEX_F32, CAPEX_F16};
static float w_grad(int rank, int it, int p, size_t e) { return (float)((e + (size_t)p) % 16) / 16.0f + (float)rank + (float)it; }
static void w_put(capex_dtype t, void *b, size_t e, float v) {
    if (t == CAPEX_F32) ((float *)b)[e] = v;
    else ((uint16_t *)b)[e] = t == CAPEX_F16 ? capex_f32_to_f16(v) : capex_f32_to_bf16(v);
}
static float w_get(capex_dtype t, const void *b, size_t e) {
    if (t == CAPEX_F32) return ((const float *)b)[e];
    return t == CAPEX_F16 ? capex_f16_to_f32(((const uint16_t *)b)[e]) : capex_bf16_to_f32(((const uint16_t *)b)[e]);
}
static int ddp_world_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    static const int order[W_NP] = {1, 0, 3, 2};
    capex_cuda_stream st = NULL;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[W_NP];
    capex_ddp_desc dd;
    capex_cuda_ptr data[W_NP], own = 0;
    static unsigned char buf[500 * 4];
    int it, k, p;
    size_t e;
    (void)user;
    if (capex_cuda_stream_create(ctx, &st) != CAPEX_OK || capex_nccl_set_user_stream(c, st) != CAPEX_OK) return 30;
    for (p = 0; p < W_NP; p++) {
        if (capex_cuda_malloc(ctx, w_numel[p] * 4, &data[p]) != CAPEX_OK ||
            capex_cuda_memset_u8(ctx, data[p], 0, w_numel[p] * 4, NULL) != CAPEX_OK) return 31;
        ps[p].data = (void *)(uintptr_t)data[p]; ps[p].numel = w_numel[p]; ps[p].dtype = w_dt[p]; ps[p].grad = NULL;
    }
    if (capex_cuda_malloc(ctx, w_numel[2] * 4, &own) != CAPEX_OK) return 32;
    ps[2].grad = (void *)(uintptr_t)own;
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 512; dd.bucket_bytes = 1024; dd.rebuild_buckets = 1; dd.allreduce_always_fp32 = !g_half;
    dd.gradient_predivide_factor = g_half ? 4.0f : 2.0f; dd.find_unused_parameters = 1;
    if (capex_ddp_create(&ddp, c, ps, W_NP, &dd) != CAPEX_OK) return 33;
    for (it = 0; it < 4; it++) {
        for (k = 0; k < W_NP; k++) {
            p = order[k];
            if (p == 3 && (it & 1)) continue; /* unused this step: zero grad */
            for (e = 0; e < w_numel[p]; e++) w_put(w_dt[p], buf, e, w_grad(rank, it, p, e));
            if (capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p), buf,
                                       w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
                capex_ddp_grad_ready(ddp, (size_t)p) != CAPEX_OK) return 34;
        }
        if (capex_ddp_finalize(ddp) != CAPEX_OK) return 35;
        for (p = 0; p < W_NP; p++) {
            if (capex_cuda_memcpy_dtoh(ctx, buf, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p),
                                       w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
                capex_cuda_stream_synchronize(ctx, st) != CAPEX_OK) return 36;
            for (e = 0; e < w_numel[p]; e++) {
                float want = p == 3 && (it & 1) ? 0.0f : (w_grad(0, it, p, e) + w_grad(1, it, p, e)) / 2.0f;
                if (w_get(w_dt[p], buf, e) != want) {
                    fprintf(stderr, "rank %d it %d param %d [%zu]: %g, want %g\n", rank, it, p, e,
                            (double)w_get(w_dt[p], buf, e), (double)want);
                    return 37;
                }
            }
        }
        if (capex_ddp_zero_grad(ddp) != CAPEX_OK) return 38;
    }
    if (world != 2 || capex_ddp_layout_version(ddp) != 1) return 39; /* rebuilt once */
    capex_ddp_destroy(ddp);
    for (p = 0; p < W_NP; p++) capex_cuda_free(ctx, data[p]);
    capex_cuda_free(ctx, own);
    capex_nccl_set_user_stream(c, NULL);
    capex_cuda_stream_destroy(ctx, st);
    return 0;
}
static void child_ddp_world(const char *arg, child_result *res) {
    g_half = arg && !strcmp(arg, "half");
    nccl_world2_child(ddp_world_rank, res);
}
CT_TEST(ddp_world2_user_stream_rebuild) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("ddp_world", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}
CT_TEST(ddp_world2_half_buckets_scaled_on_user_stream) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("ddp_world", "half");
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* Rank 1's device allocations, event creations or kernel loads fail after
   create (the emulator's CAPEX_EMU_FAIL_ALLOC, _EVENT, _MODULE, set in rank
   1 alone; one kind per run): no launch or finalize may need one, since a
   rank failing there alone leaves its peers in ncclAllReduce. Create makes
   what they use (the half buckets' f32 scale scratch, an event per bucket,
   the scale and convert kernels), so two steps of f16, bf16 and f32 buckets
   with predivide 4 (half scales in f32 on the user stream) average exactly
   on both ranks. Before 2026-11-28 rank 1 failed its first launch alone: the
   scratch grew there, each launch created its event, the kernels loaded on
   first use. */
static const char *g_inject;
static int ddp_nofail_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    capex_cuda_stream st = NULL;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[W_NP];
    capex_ddp_desc dd;
    capex_cuda_ptr data[W_NP];
    static unsigned char buf[500 * 4];
    int it, p, bad = 0;
    size_t e;
    (void)user;
    if (world != 2 || capex_cuda_stream_create(ctx, &st) != CAPEX_OK || capex_nccl_set_user_stream(c, st) != CAPEX_OK) return 30;
    for (p = 0; p < W_NP; p++) {
        if (capex_cuda_malloc(ctx, w_numel[p] * 4, &data[p]) != CAPEX_OK ||
            capex_cuda_memset_u8(ctx, data[p], 0, w_numel[p] * 4, NULL) != CAPEX_OK) return 31;
        ps[p].data = (void *)(uintptr_t)data[p]; ps[p].numel = w_numel[p]; ps[p].dtype = w_dt[p]; ps[p].grad = NULL;
    }
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 512; dd.bucket_bytes = 1024; dd.gradient_predivide_factor = 4.0f;
    if (capex_ddp_create(&ddp, c, ps, W_NP, &dd) != CAPEX_OK) return 33;
    if (rank == 1) setenv(g_inject, "0", 1); /* from here on every one fails on rank 1 */
    for (it = 0; it < 2 && !bad; it++) {
        for (p = W_NP; p-- > 0 && !bad;) {
            for (e = 0; e < w_numel[p]; e++) w_put(w_dt[p], buf, e, w_grad(rank, it, p, e));
            if (capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p), buf,
                                       w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK) bad = 34;
            else if (capex_ddp_grad_ready(ddp, (size_t)p) != CAPEX_OK) {
                fprintf(stderr, "rank %d (%s=0) it %d param %d: grad_ready: %s\n", rank, g_inject, it, p, capex_last_error());
                bad = 35;
            }
        }
        if (!bad && capex_ddp_finalize(ddp) != CAPEX_OK) {
            fprintf(stderr, "rank %d (%s=0) it %d: finalize: %s\n", rank, g_inject, it, capex_last_error());
            bad = 36;
        }
        for (p = 0; p < W_NP && !bad; p++) {
            if (capex_cuda_memcpy_dtoh(ctx, buf, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p),
                                       w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
                capex_cuda_stream_synchronize(ctx, st) != CAPEX_OK) bad = 37;
            for (e = 0; e < w_numel[p] && !bad; e++) {
                float want = (w_grad(0, it, p, e) + w_grad(1, it, p, e)) / 2.0f;
                if (w_get(w_dt[p], buf, e) != want) {
                    fprintf(stderr, "rank %d it %d param %d [%zu]: %g, want %g\n", rank, it, p, e,
                            (double)w_get(w_dt[p], buf, e), (double)want);
                    bad = 38;
                }
            }
        }
        if (!bad && capex_ddp_zero_grad(ddp) != CAPEX_OK) bad = 39;
    }
    if (rank == 1) unsetenv(g_inject);
    capex_ddp_destroy(ddp);
    for (p = 0; p < W_NP; p++) capex_cuda_free(ctx, data[p]);
    capex_nccl_set_user_stream(c, NULL);
    capex_cuda_stream_destroy(ctx, st);
    return bad;
}
static void child_ddp_nofail(const char *arg, child_result *res) {
    g_inject = arg;
    nccl_world2_child(ddp_nofail_rank, res);
}
static void nofail_case(ct_state *ct, const char *kind) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("ddp_nofail", kind);
    CT_CHECK(r.exited_ok && r.code == 0, "%s=0 on rank 1 after create: %s", kind, r.message);
}
CT_TEST(ddp_world2_launch_allocates_no_device_memory) { nofail_case(ct, "CAPEX_EMU_FAIL_ALLOC"); }
CT_TEST(ddp_world2_launch_creates_no_event) { nofail_case(ct, "CAPEX_EMU_FAIL_EVENT"); }
CT_TEST(ddp_world2_launch_loads_no_kernel) { nofail_case(ct, "CAPEX_EMU_FAIL_MODULE"); }

/* Agreements over NCCL allocate nothing: rank 1's device allocations fail
   (CAPEX_EMU_FAIL_ALLOC=0, rank 1 alone) from just before DDP's create
   ("create": its buckets fail) or after it ("rebuild": the rebuilt buckets
   fail at the first finalize, after the broadcast of rank 0's ready order).
   Rank 1 still takes part in the agreement that follows (create's model
   check, the rebuild's), through the comm's own buffer, so rank 0 fails
   there at once with CAPEX_ERR_COMM and rank 1 with its out-of-memory; the
   comm stays usable: a second create (allocations back) and a step average
   exactly on both ranks. Before 2026-11-28 each agreement allocated its
   device buffer: rank 1 left it, and rank 0 stayed in the collective (here
   until the stand-in's FAKE_NCCL_TIMEOUT or rank 1's next collective).
   "novt": the same on a device comm whose vtable has no host_buffer (a
   custom one; here NCCL's without it): DDP makes the exchanges' buffer at
   create, first (so "create" fails from rank 1's second allocation on,
   CAPEX_EMU_FAIL_ALLOC=1), and its agreements and the rebuild's broadcast
   use it. Before 2026-11-29 each of them allocated its own there: rank 1
   failed that alone and left rank 0 in the collective. */
static int g_agree_rebuild, g_agree_novt;
static capex_comm_vtable g_novt_vt;
static int ddp_agree_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    capex_cuda_stream st = NULL;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[W_NP];
    capex_ddp_desc dd;
    capex_cuda_ptr data[W_NP];
    static unsigned char buf[500 * 4];
    capex_result r, want = rank == 0 ? CAPEX_ERR_COMM : CAPEX_ERR_OUT_OF_MEMORY;
    const capex_comm_vtable *vt0 = c->vt;
    const char *fail_from = g_agree_novt ? "1" : "0"; /* novt: DDP's exchange buffer is its first allocation */
    int it, p, bad = 0;
    size_t e;
    (void)user;
    if (world != 2 || capex_cuda_stream_create(ctx, &st) != CAPEX_OK || capex_nccl_set_user_stream(c, st) != CAPEX_OK) return 30;
    if (g_agree_novt) {
        g_novt_vt = *c->vt;
        g_novt_vt.host_buffer = NULL;
        c->vt = &g_novt_vt;
    }
    for (p = 0; p < W_NP; p++) {
        if (capex_cuda_malloc(ctx, w_numel[p] * 4, &data[p]) != CAPEX_OK ||
            capex_cuda_memset_u8(ctx, data[p], 0, w_numel[p] * 4, NULL) != CAPEX_OK) return 31;
        ps[p].data = (void *)(uintptr_t)data[p]; ps[p].numel = w_numel[p]; ps[p].dtype = w_dt[p]; ps[p].grad = NULL;
    }
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 512; dd.bucket_bytes = 1024; dd.rebuild_buckets = g_agree_rebuild;
    if (rank == 1 && !g_agree_rebuild) setenv("CAPEX_EMU_FAIL_ALLOC", fail_from, 1);
    r = capex_ddp_create(&ddp, c, ps, W_NP, &dd);
    if (!g_agree_rebuild && r != want) {
        fprintf(stderr, "rank %d: create: %s (%s), want %s\n", rank, capex_result_string(r), capex_last_error(), capex_result_string(want));
        bad = 40;
    }
    if (g_agree_rebuild && r != CAPEX_OK) bad = 41;
    for (it = 0; g_agree_rebuild && it < 1 && !bad; it++) { /* a step in another order: the first finalize rebuilds */
        if (rank == 1) setenv("CAPEX_EMU_FAIL_ALLOC", "0", 1);
        for (p = 0; p < W_NP && !bad; p++) {
            for (e = 0; e < w_numel[p]; e++) w_put(w_dt[p], buf, e, w_grad(rank, it, p, e));
            if (capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p), buf,
                                       w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
                capex_ddp_grad_ready(ddp, (size_t)p) != CAPEX_OK) bad = 42;
        }
        if (!bad && (r = capex_ddp_finalize(ddp)) != want) {
            fprintf(stderr, "rank %d: finalize (rebuild): %s (%s), want %s\n", rank, capex_result_string(r), capex_last_error(),
                    capex_result_string(want));
            bad = 43;
        }
    }
    if (rank == 1) unsetenv("CAPEX_EMU_FAIL_ALLOC");
    capex_ddp_destroy(ddp);
    ddp = NULL;
    /* the comm still works: a create and a step */
    dd.rebuild_buckets = 0;
    if (!bad && capex_ddp_create(&ddp, c, ps, W_NP, &dd) != CAPEX_OK) bad = 44;
    for (p = W_NP; p-- > 0 && !bad;) {
        for (e = 0; e < w_numel[p]; e++) w_put(w_dt[p], buf, e, w_grad(rank, 0, p, e));
        if (capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p), buf,
                                   w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
            capex_ddp_grad_ready(ddp, (size_t)p) != CAPEX_OK) bad = 45;
    }
    if (!bad && capex_ddp_finalize(ddp) != CAPEX_OK) bad = 46;
    for (p = 0; p < W_NP && !bad; p++) {
        if (capex_cuda_memcpy_dtoh(ctx, buf, (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)p),
                                   w_numel[p] * capex_dtype_size(w_dt[p]), st) != CAPEX_OK ||
            capex_cuda_stream_synchronize(ctx, st) != CAPEX_OK) bad = 47;
        for (e = 0; e < w_numel[p] && !bad; e++)
            if (w_get(w_dt[p], buf, e) != (w_grad(0, 0, p, e) + w_grad(1, 0, p, e)) / 2.0f) bad = 48;
    }
    capex_ddp_destroy(ddp);
    for (p = 0; p < W_NP; p++) capex_cuda_free(ctx, data[p]);
    capex_nccl_set_user_stream(c, NULL);
    capex_cuda_stream_destroy(ctx, st);
    c->vt = vt0;
    return bad;
}
/* world2 of body with the stand-in's hang guard at 30 s: a test that fails
   by leaving a rank in a collective fails in about that. */
static void child_ddp_agree(const char *arg, child_result *res) {
    g_agree_rebuild = arg && strstr(arg, "rebuild");
    g_agree_novt = arg && strstr(arg, "novt");
    if (g_agree_novt) nccl_world2_child_guard(ddp_agree_rank, res, "30");
    else nccl_world2_child(ddp_agree_rank, res);
}
static void agree_case(ct_state *ct, const char *when) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("ddp_agree", when);
    CT_CHECK(r.exited_ok && r.code == 0, "rank 1's allocations failing (%s): %s", when, r.message);
}
CT_TEST(ddp_world2_create_agrees_without_allocating) { agree_case(ct, "create"); }
CT_TEST(ddp_world2_rebuild_agrees_without_allocating) { agree_case(ct, "rebuild"); }
CT_TEST(ddp_world2_no_host_buffer_create_agrees_without_allocating) { agree_case(ct, "create novt"); }
CT_TEST(ddp_world2_no_host_buffer_rebuild_agrees_without_allocating) { agree_case(ct, "rebuild novt"); }

/* Gathers whose send lies inside recv but not at this rank's slot (send ==
   recv on rank 1, the other rank's slot, allgatherv's uneven slots): NCCL is
   in place only at the slot and undefined otherwise (the stand-in refuses
   such an allgather; its grouped broadcasts overwrite such a send), so capex
   moves send to the slot first, in pieces where send overlaps the slot
   (uneven counts, a shifted send). */
static int ga_check(capex_cuda_context *ctx, capex_cuda_ptr a, const size_t *counts, int code) {
    static float h[2000];
    size_t p, e, off = 0;
    if (capex_cuda_memcpy_dtoh(ctx, h, a, (counts[0] + counts[1]) * 4, NULL) != CAPEX_OK) return code;
    for (p = 0; p < 2; off += counts[p], p++)
        for (e = 0; e < counts[p]; e++)
            if (h[off + e] != (float)(p * 10000 + e)) {
                fprintf(stderr, "check %d: element %zu of rank %zu's part is %g\n", code, e, p, (double)h[off + e]);
                return code;
            }
    return 0;
}
static int gather_alias_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    static float h[1000];
    const size_t even[2] = {1000, 1000}, uneven[2] = {300, 700};
    const size_t other = (size_t)(1 - rank) * 1000 * 4;
    capex_cuda_ptr a = 0;
    capex_result r;
    size_t e;
    int bad;
    (void)user;
    for (e = 0; e < 1000; e++) h[e] = (float)((size_t)rank * 10000 + e);
    if (world != 2 || capex_cuda_malloc(ctx, 2000 * 4, &a) != CAPEX_OK) return 40;
    /* send == recv */
    if (capex_cuda_memset_u8(ctx, a, 0xa5, 2000 * 4, NULL) != CAPEX_OK || capex_cuda_memcpy_htod(ctx, a, h, 1000 * 4, NULL) != CAPEX_OK ||
        capex_comm_allgather(c, (void *)(uintptr_t)a, (void *)(uintptr_t)a, 1000, CAPEX_F32) != CAPEX_OK) return 41;
    if ((bad = ga_check(ctx, a, even, 42)) != 0) return bad;
    /* send at the other rank's slot */
    if (capex_cuda_memset_u8(ctx, a, 0xa5, 2000 * 4, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, a + other, h, 1000 * 4, NULL) != CAPEX_OK ||
        capex_comm_allgather(c, (void *)(uintptr_t)(a + other), (void *)(uintptr_t)a, 1000, CAPEX_F32) != CAPEX_OK) return 43;
    if ((bad = ga_check(ctx, a, even, 44)) != 0) return bad;
    /* allgatherv, send == recv, uneven counts */
    if (capex_cuda_memset_u8(ctx, a, 0xa5, 2000 * 4, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, a, h, uneven[rank] * 4, NULL) != CAPEX_OK ||
        capex_comm_allgatherv(c, (void *)(uintptr_t)a, (void *)(uintptr_t)a, uneven, CAPEX_F32) != CAPEX_OK) return 45;
    if ((bad = ga_check(ctx, a, uneven, 46)) != 0) return bad;
    /* send half a slot into recv on both ranks: it overlaps this rank's slot (moved in pieces) */
    if (capex_cuda_memset_u8(ctx, a, 0xa5, 2000 * 4, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, a + 2000, h, 1000 * 4, NULL) != CAPEX_OK) return 47;
    r = capex_comm_allgather(c, (void *)(uintptr_t)(a + 2000), (void *)(uintptr_t)a, 1000, CAPEX_F32);
    if (r != CAPEX_OK) {
        fprintf(stderr, "rank %d: shifted send: %s (%s)\n", rank, capex_result_string(r), capex_last_error());
        return 48;
    }
    if ((bad = ga_check(ctx, a, even, 49)) != 0) return bad;
    capex_cuda_free(ctx, a);
    return 0;
}
static void child_gather_alias(const char *arg, child_result *res) { (void)arg; nccl_world2_child(gather_alias_rank, res); }
CT_TEST(world2_gathers_with_send_inside_recv) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("gather_alias", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* AVG without ncclAvg (NCCL < 2.10, or use_nccl_avg 0): the sum, then this
   rank's result scaled by 1/world on the device (f16 through the comm's f32
   scratch); float64 refused (no exact device scale), bf16 refused (no NCCL
   bf16 before 2.10). Values k/16 + rank: sums and halves exact in f32 and
   f16, so every element must equal the float64 average exactly (a missing,
   doubled or wrong post-scale changes it). Never run before 2026-11-28. */
enum { AV_N = 1000 };
static int av_check(capex_cuda_context *ctx, capex_cuda_ptr d, capex_dtype t, size_t off, size_t n, int code) {
    static unsigned char h[AV_N * 4];
    size_t e;
    if (capex_cuda_memcpy_dtoh(ctx, h, d, n * capex_dtype_size(t), NULL) != CAPEX_OK) return code;
    for (e = 0; e < n; e++) {
        double want = ((double)((off + e) % 64) / 16.0 * 2.0 + 1.0) / 2.0; /* (x0 + x1) / 2, x_r = k/16 + r */
        double got = t == CAPEX_F32 ? (double)((const float *)h)[e] : (double)capex_f16_to_f32(((const uint16_t *)h)[e]);
        if (got != want) {
            fprintf(stderr, "check %d: dtype %d element %zu: %.9g, want %.9g\n", code, (int)t, off + e, got, want);
            return code;
        }
    }
    return 0;
}
static void av_fill(unsigned char *h, capex_dtype t, int rank) {
    size_t e;
    for (e = 0; e < AV_N; e++) w_put(t, h, e, (float)(e % 64) / 16.0f + (float)rank);
}
static int avg_fallback_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    static unsigned char h[AV_N * 8];
    const size_t counts[2] = {300, 700};
    const capex_dtype ts[2] = {CAPEX_F32, CAPEX_F16};
    capex_cuda_ptr a = 0, b = 0;
    capex_comm_req req;
    capex_result r;
    int i, bad;
    (void)user;
    if (world != 2 || !capex_comm_is_nccl(c) || capex_cuda_malloc(ctx, AV_N * 8, &a) != CAPEX_OK ||
        capex_cuda_malloc(ctx, AV_N * 8, &b) != CAPEX_OK) return 50;
    for (i = 0; i < 2; i++) {
        capex_dtype t = ts[i];
        size_t es = capex_dtype_size(t), mine = rank ? counts[0] : 0;
        av_fill(h, t, rank);
        /* out of place, then in place */
        if (capex_cuda_memcpy_htod(ctx, a, h, AV_N * es, NULL) != CAPEX_OK || capex_cuda_memset_u8(ctx, b, 0xa5, AV_N * es, NULL) != CAPEX_OK ||
            capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, AV_N, t, CAPEX_REDUCE_AVG) != CAPEX_OK) return 51;
        if ((bad = av_check(ctx, b, t, 0, AV_N, 52)) != 0) return bad;
        if (capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)a, AV_N, t, CAPEX_REDUCE_AVG) != CAPEX_OK) return 53;
        if ((bad = av_check(ctx, a, t, 0, AV_N, 54)) != 0) return bad;
        /* nonblocking (DDP's bucket allreduce) */
        if (capex_cuda_memcpy_htod(ctx, a, h, AV_N * es, NULL) != CAPEX_OK ||
            c->vt->iallreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, AV_N, t, CAPEX_REDUCE_AVG, &req) != CAPEX_OK ||
            c->vt->wait(c, &req, capex__deadline(c)) != CAPEX_OK) return 55;
        if ((bad = av_check(ctx, b, t, 0, AV_N, 56)) != 0) return bad;
        /* uneven reduce-scatter: this rank's slice, scaled */
        if (capex_cuda_memcpy_htod(ctx, a, h, AV_N * es, NULL) != CAPEX_OK || capex_cuda_memset_u8(ctx, b, 0xa5, AV_N * es, NULL) != CAPEX_OK ||
            capex_comm_reduce_scatter(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, counts, t, CAPEX_REDUCE_AVG) != CAPEX_OK) return 57;
        if ((bad = av_check(ctx, b, t, mine, counts[rank], 58)) != 0) return bad;
    }
    /* SUM stays a sum */
    av_fill(h, CAPEX_F32, rank);
    if (capex_cuda_memcpy_htod(ctx, a, h, AV_N * 4, NULL) != CAPEX_OK ||
        capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, AV_N, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(ctx, h, b, AV_N * 4, NULL) != CAPEX_OK) return 59;
    for (i = 0; i < AV_N; i++)
        if (((float *)h)[i] != (float)(i % 64) / 8.0f + 1.0f) return 60;
    /* refused, nothing queued (the peer refuses the same call) */
    r = capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, 10, CAPEX_F64, CAPEX_REDUCE_AVG);
    if (r != CAPEX_ERR_UNSUPPORTED || !strstr(capex_last_error(), "ncclAvg")) return 61;
    r = capex_comm_reduce_scatter(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, counts, CAPEX_F64, CAPEX_REDUCE_AVG);
    if (r != CAPEX_ERR_UNSUPPORTED || !strstr(capex_last_error(), "ncclAvg")) return 62;
    r = capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, 10, CAPEX_BF16, CAPEX_REDUCE_SUM);
    if (r != CAPEX_ERR_UNSUPPORTED || !strstr(capex_last_error(), "bfloat16")) return 63;
    if (capex_comm_barrier(c) != CAPEX_OK) return 64;
    capex_cuda_free(ctx, a);
    capex_cuda_free(ctx, b);
    return 0;
}
static void child_avg_fallback(const char *arg, child_result *res) {
    (void)arg;
    setenv("FAKE_NCCL_VERSION", "20903", 1); /* 2.9.3: no ncclAvg, no bf16, no ncclCommInitRankConfig */
    nccl_world2_child(avg_fallback_rank, res);
}
CT_TEST(world2_avg_without_ncclavg) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("avg_fallback", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}
/* DDP's averaging on that NCCL (f32 buckets; bf16 params through them). */
static void child_ddp_world_old(const char *arg, child_result *res) {
    (void)arg;
    g_half = 0;
    setenv("FAKE_NCCL_VERSION", "20903", 1);
    nccl_world2_child(ddp_world_rank, res);
}
CT_TEST(ddp_world2_nccl_2_9) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("ddp_world_old", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* Shifted gathers allocate nothing: rank 1's device allocations fail
   (CAPEX_EMU_FAIL_ALLOC=0, rank 1 alone) once the buffers exist, and each
   rank's send overlaps its own slot of recv, shifted: by 4 bytes (moved in
   scratch-sized pieces through the comm's scratch, two of them), by 1.2 MB
   (more than the scratch: straight pieces of the shift), by half a slot
   (0.8 MB: a piece through the scratch, then a straight one), each down on
   rank 0 and up on rank 1; and allgatherv's send == recv with uneven counts.
   Every slot must hold its rank's values. Before 2026-11-29 such a send went
   through a temporary buffer allocated in the call: rank 1 failed it alone
   and left rank 0 in the gather. */
enum { GN = 400000 }; /* f32 per rank: 1.6 MB, more than the comm's 1 MiB scratch */
static int gn_check(capex_cuda_context *ctx, capex_cuda_ptr a, const size_t *counts, const char *what) {
    static float h[2 * GN];
    size_t p, e, off = 0;
    if (capex_cuda_memcpy_dtoh(ctx, h, a, (counts[0] + counts[1]) * 4, NULL) != CAPEX_OK) return 1;
    for (p = 0; p < 2; off += counts[p], p++)
        for (e = 0; e < counts[p]; e++)
            if (h[off + e] != (float)(p * 1000000 + e)) {
                fprintf(stderr, "%s: element %zu of rank %zu's part is %.9g\n", what, e, p, (double)h[off + e]);
                return 1;
            }
    return 0;
}
static int gather_noalloc_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    static float h[GN];
    const size_t even[2] = {GN, GN}, uneven[2] = {300000, GN};
    const size_t slot = (size_t)rank * GN * 4;
    const long shifts[3] = {4, 1200000, 800000}; /* bytes, toward lower addresses on rank 0, higher on rank 1 */
    capex_cuda_ptr a = 0;
    capex_result r;
    size_t e;
    int i, bad = 0;
    (void)user;
    for (e = 0; e < GN; e++) h[e] = (float)((size_t)rank * 1000000 + e);
    if (world != 2 || capex_cuda_malloc(ctx, 2 * GN * 4, &a) != CAPEX_OK) return 40;
    if (rank == 1) setenv("CAPEX_EMU_FAIL_ALLOC", "0", 1);
    for (i = 0; i < 3; i++) { /* every rank makes every call, whatever failed */
        capex_cuda_ptr send = rank == 0 ? a + (capex_cuda_ptr)shifts[i] : a + slot - (capex_cuda_ptr)shifts[i];
        char what[64];
        snprintf(what, sizeof what, "rank %d, send shifted by %ld bytes", rank, shifts[i]);
        if (capex_cuda_memset_u8(ctx, a, 0xa5, 2 * GN * 4, NULL) != CAPEX_OK ||
            capex_cuda_memcpy_htod(ctx, send, h, GN * 4, NULL) != CAPEX_OK) bad = 41;
        r = capex_comm_allgather(c, (void *)(uintptr_t)send, (void *)(uintptr_t)a, GN, CAPEX_F32);
        if (r != CAPEX_OK) {
            fprintf(stderr, "%s: %s (%s)\n", what, capex_result_string(r), capex_last_error());
            bad = 42;
        } else if (gn_check(ctx, a, even, what)) bad = 43;
    }
    if (capex_cuda_memset_u8(ctx, a, 0xa5, 2 * GN * 4, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, a, h, uneven[rank] * 4, NULL) != CAPEX_OK) bad = 44;
    r = capex_comm_allgatherv(c, (void *)(uintptr_t)a, (void *)(uintptr_t)a, uneven, CAPEX_F32);
    if (r != CAPEX_OK) {
        fprintf(stderr, "rank %d: allgatherv, send == recv: %s (%s)\n", rank, capex_result_string(r), capex_last_error());
        bad = 45;
    } else if (gn_check(ctx, a, uneven, "allgatherv, send == recv")) bad = 46;
    if (rank == 1) unsetenv("CAPEX_EMU_FAIL_ALLOC");
    capex_cuda_free(ctx, a);
    return bad;
}
static void child_gather_noalloc(const char *arg, child_result *res) { (void)arg; nccl_world2_child_guard(gather_noalloc_rank, res, "30"); }
CT_TEST(world2_shifted_gathers_allocate_nothing) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("gather_noalloc", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* AVG of f16 without ncclAvg (NCCL 2.9) allocates nothing: rank 1's device
   allocations fail (CAPEX_EMU_FAIL_ALLOC=0, rank 1 alone) after a small
   AVG loaded the kernels; an allreduce of 300000 f16 (its f32 staging is
   1.2 MB: two pieces of the comm's 1 MiB scratch) and an uneven
   reduce-scatter must average exactly on both ranks (values k/16 + rank:
   exact). Before 2026-11-29 the post-scale grew the scratch: rank 1 failed
   alone with its sum unscaled while rank 0 averaged. */
enum { AN = 300000 };
static int an_check(capex_cuda_context *ctx, capex_cuda_ptr d, size_t off, size_t n, const char *what) {
    static uint16_t h[AN];
    size_t e;
    if (capex_cuda_memcpy_dtoh(ctx, h, d, n * 2, NULL) != CAPEX_OK) return 1;
    for (e = 0; e < n; e++) {
        double want = (double)((off + e) % 64) / 16.0 + 0.5, got = (double)capex_f16_to_f32(h[e]);
        if (got != want) {
            fprintf(stderr, "%s: element %zu: %.9g, want %.9g\n", what, off + e, got, want);
            return 1;
        }
    }
    return 0;
}
static int avg_noalloc_rank(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    static uint16_t h[AN];
    const size_t counts[2] = {100000, 200000};
    capex_cuda_ptr a = 0, b = 0;
    capex_result r;
    size_t e;
    int bad = 0;
    (void)user;
    for (e = 0; e < AN; e++) h[e] = capex_f32_to_f16((float)(e % 64) / 16.0f + (float)rank);
    if (world != 2 || capex_cuda_malloc(ctx, AN * 2, &a) != CAPEX_OK || capex_cuda_malloc(ctx, AN * 2, &b) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, a, h, AN * 2, NULL) != CAPEX_OK) return 70;
    if (capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, 64, CAPEX_F16, CAPEX_REDUCE_AVG) != CAPEX_OK) return 71;
    if (rank == 1) setenv("CAPEX_EMU_FAIL_ALLOC", "0", 1);
    r = capex_comm_allreduce(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, AN, CAPEX_F16, CAPEX_REDUCE_AVG);
    if (r != CAPEX_OK) {
        fprintf(stderr, "rank %d: AVG allreduce: %s (%s)\n", rank, capex_result_string(r), capex_last_error());
        bad = 72;
    } else if (an_check(ctx, b, 0, AN, rank ? "rank 1: AVG allreduce" : "rank 0: AVG allreduce")) bad = 73;
    r = capex_comm_reduce_scatter(c, (void *)(uintptr_t)a, (void *)(uintptr_t)b, counts, CAPEX_F16, CAPEX_REDUCE_AVG);
    if (r != CAPEX_OK) {
        fprintf(stderr, "rank %d: AVG reduce-scatter: %s (%s)\n", rank, capex_result_string(r), capex_last_error());
        bad = 74;
    } else if (an_check(ctx, b, rank ? counts[0] : 0, counts[rank], rank ? "rank 1: AVG reduce-scatter" : "rank 0: AVG reduce-scatter"))
        bad = 75;
    if (rank == 1) unsetenv("CAPEX_EMU_FAIL_ALLOC");
    capex_cuda_free(ctx, a);
    capex_cuda_free(ctx, b);
    return bad;
}
static void child_avg_noalloc(const char *arg, child_result *res) {
    (void)arg;
    setenv("FAKE_NCCL_VERSION", "20903", 1); /* no ncclAvg */
    nccl_world2_child_guard(avg_noalloc_rank, res, "30");
}
CT_TEST(world2_avg_half_without_ncclavg_allocates_nothing) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("avg_noalloc", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

static const ct_case cases[] = {CT_CASE(collectives_on_device), CT_CASE(ddp_one_rank_stream_order),
                                CT_CASE(stuck_stream_times_out_and_aborts), CT_CASE(ddp_world2_user_stream_rebuild),
                                CT_CASE(ddp_world2_half_buckets_scaled_on_user_stream),
                                CT_CASE(world2_gathers_with_send_inside_recv), CT_CASE(ddp_backward_overlaps_inflight_allreduce),
                                CT_CASE(world2_avg_without_ncclavg), CT_CASE(ddp_world2_nccl_2_9),
                                CT_CASE(ddp_world2_launch_allocates_no_device_memory), CT_CASE(ddp_world2_launch_creates_no_event),
                                CT_CASE(ddp_world2_launch_loads_no_kernel), CT_CASE(ddp_world2_create_agrees_without_allocating),
                                CT_CASE(ddp_world2_rebuild_agrees_without_allocating),
                                CT_CASE(ddp_world2_no_host_buffer_create_agrees_without_allocating),
                                CT_CASE(ddp_world2_no_host_buffer_rebuild_agrees_without_allocating),
                                CT_CASE(world2_shifted_gathers_allocate_nothing),
                                CT_CASE(world2_avg_half_without_ncclavg_allocates_nothing)};
static const child_entry children[] = {{"ddp_world", child_ddp_world}, {"gather_alias", child_gather_alias},
                                       {"avg_fallback", child_avg_fallback}, {"ddp_world_old", child_ddp_world_old},
                                       {"ddp_nofail", child_ddp_nofail}, {"ddp_agree", child_ddp_agree},
                                       {"gather_noalloc", child_gather_noalloc}, {"avg_noalloc", child_avg_noalloc}};
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
