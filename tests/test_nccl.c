/* The NCCL backend (capex_cuda.h) without a GPU, and the comm dtypes f64/i64.
   - NCCL missing: a clean CAPEX_ERR_NO_NCCL naming the path; the real NCCL's
     ncclGetUniqueId (needs no GPU) when installed.
   - The unique-id exchange over capex.h's TCP rendezvous on loopback with
     forked ranks: success, a late rank, an intruder with a foreign nonce, a
     missing rank (deadline), rank 0 failing to make the id.
   - The whole backend on the stand-in driver (tests/fake_libcuda.c) and a
     stand-in NCCL (tests/fake_libnccl.c, world size 1 and forked worlds of 2
     and 3: tests/nccl_world.h): every collective and
     dtype on "device" buffers checked against host references, ncclAvg vs the
     pre-2.10 sum-then-scale path, DDP over NCCL with device buckets
     (predivide, always-fp32 f16 buckets, copy mode), the async-error path
     (CAPEX_ERR_COMM + ncclCommAbort), a stuck collective (CAPEX_ERR_TIMEOUT +
     abort), a failing ncclCommInitRank, and the real NCCL refusing the
     stand-in driver with a message naming ncclCommInitRank.
   - Argument validation, and f64/i64 sums on the single and TCP backends.
   Each library loads once per process, so each scenario runs in a fresh child
   (run_child). The real GPU tests are tests/test_nccl_gpu.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fail_alloc.h" /* g_fail_alloc_size: one chosen allocation fails */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "free_port.h"
#include "cuda_test_util.h"
#define SHARDS_ROUND_EACH_ADD 1 /* NCCL sums halves in the dtype */
#include "dist_shards.h"
#include "nccl_world.h"
#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

#define OK(call) CT_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())

/* build/fake/lib*.so.* next to this binary (build/tests/test_nccl). */
static int fake_path(const char *lib, char *out, size_t cap) {
    return sibling_path("fake", lib, out, cap) && access(out, R_OK) == 0;
}

/* ------------------------------------------------------------ children -- */

static void set_result(child_result *res, capex_result r, int value) {
    res->code = (int)r;
    res->value = value;
    snprintf(res->message, sizeof res->message, "%s", r == CAPEX_OK ? "" : capex_last_error());
}

static void child_no_nccl(const char *arg, child_result *res) {
    capex_nccl_unique_id id;
    int v = 0;
    capex_result r;
    (void)arg;
    setenv("CAPEX_NCCL_PATH", "/nonexistent/libnccl.so.2", 1);
    r = capex_nccl_get_unique_id(&id);
    set_result(res, r, capex_cuda_nccl_version(&v) == CAPEX_ERR_NO_NCCL);
}

static void child_real_id(const char *arg, child_result *res) {
    capex_nccl_unique_id id;
    size_t i;
    int nz = 0;
    capex_result r;
    (void)arg;
    unsetenv("CAPEX_NCCL_PATH");
    r = capex_nccl_get_unique_id(&id);
    for (i = 0; i < sizeof id.bytes; i++) nz |= id.bytes[i];
    set_result(res, r, nz != 0);
}

/* Opens the stand-ins and a context + world-1 NCCL comm on them. */
static capex_result fake_open(capex_cuda_context **ctx, capex_comm *c, int real_nccl) {
    char cu[1200], nc[1200];
    capex_dist_env env;
    capex_nccl_desc nd;
    capex_result r;
    if (!fake_path("libcuda.so.1", cu, sizeof cu) || (!real_nccl && !fake_path("libnccl.so.2", nc, sizeof nc)))
        return capex__fail(CAPEX_ERR_NOT_FOUND, "stand-in libraries not built");
    setenv("CAPEX_LIBCUDA_PATH", cu, 1);
    if (real_nccl) unsetenv("CAPEX_NCCL_PATH");
    else setenv("CAPEX_NCCL_PATH", nc, 1);
    if ((r = capex_cuda_context_create(NULL, ctx)) != CAPEX_OK) return r;
    if ((r = capex_dist_env_read(NULL, &env)) != CAPEX_OK) return r;
    capex_nccl_desc_init(&nd);
    nd.ctx = *ctx;
    return capex_comm_init_nccl(c, &env, &nd);
}

static int fake_counter(int i) {
    char nc[1200];
    void *h;
    int (*fn)(int);
    void *p;
    if (!fake_path("libnccl.so.2", nc, sizeof nc)) return -1;
    h = dlopen(nc, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return -2;
    p = dlsym(h, "fake_nccl_counter");
    memcpy(&fn, &p, sizeof p);
    return fn ? fn(i) : -3;
}
/* Events the stand-in driver holds (fake_libcuda's count). */
static int fake_cuda_count(const char *name) {
    char lc[1200];
    void *h, *p;
    int (*fn)(void);
    if (!fake_path("libcuda.so.1", lc, sizeof lc)) return -1;
    if (!(h = dlopen(lc, RTLD_NOW | RTLD_NOLOAD))) return -2;
    p = dlsym(h, name);
    memcpy(&fn, &p, sizeof p);
    return fn ? fn() : -3;
}
static int fake_null_stream_waits(void) { return fake_cuda_count("fake_null_stream_waits"); }
static int fake_ctx_syncs(void) { return fake_cuda_count("fake_ctx_syncs"); }
static int fake_live_events(void) { return fake_cuda_count("fake_live_events"); }
enum { C_ALLREDUCE = 0, C_BROADCAST = 1, C_ALLGATHER = 2, C_ABORT = 3, C_DESTROY = 4, C_INIT = 5, C_AVG = 6, C_BAD = 7,
       C_REDUCE = 8, C_GROUP_BAD = 9, C_NB_INIT = 10, C_IN_PROGRESS = 11 };

#define FAIL_IF(cond, ...) do { if (cond) { (void)capex__fail(CAPEX_ERR_INTERNAL, __VA_ARGS__); set_result(res, CAPEX_ERR_INTERNAL, 0); return; } } while (0)
#define RUN(call) do { capex_result r_ = (call); if (r_ != CAPEX_OK) { set_result(res, r_, __LINE__); return; } } while (0)

static void *dev(capex_cuda_context *ctx, size_t bytes) {
    capex_cuda_ptr p = 0;
    if (capex_cuda_malloc(ctx, bytes, &p) != CAPEX_OK) return NULL;
    return (void *)(uintptr_t)p;
}
#define D(p) ((capex_cuda_ptr)(uintptr_t)(p))

/* Every collective and dtype on the stand-ins (world 1: sum = avg = values). */
static void child_fake_collectives(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    float f[5] = {1.5f, -2.25f, 3.0f, 1e-3f, 65504.0f}, fo[5];
    double d[3] = {0.1, -1e300, 3.5}, dout[3];
    int64_t q[3] = {((int64_t)1 << 60) + 7, -5, 42}, qo[3];
    uint16_t h[4], ho[4];
    void *a, *b, *g;
    int t, i;
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    FAIL_IF(!capex_comm_is_nccl(&c) || !c.device_buffers || !c.stream || c.world_size != 1, "comm fields");
    a = dev(ctx, 64); b = dev(ctx, 64); g = dev(ctx, 64);
    FAIL_IF(!a || !b || !g, "malloc");
    /* f32 out of place, SUM then AVG (ncclAvg on "2.28") */
    for (t = 0; t < 2; t++) {
        RUN(capex_cuda_memcpy_htod(ctx, D(a), f, sizeof f, NULL));
        RUN(capex_cuda_memset_u8(ctx, D(b), 0xff, 20, NULL));
        RUN(capex_comm_allreduce(&c, a, b, 5, CAPEX_F32, t ? CAPEX_REDUCE_AVG : CAPEX_REDUCE_SUM));
        RUN(capex_cuda_memcpy_dtoh(ctx, fo, D(b), sizeof fo, NULL));
        FAIL_IF(memcmp(f, fo, sizeof f) != 0, "f32 allreduce op %d", t);
    }
    FAIL_IF(fake_counter(C_AVG) != 1, "AVG must use ncclAvg on NCCL >= 2.10 (%d)", fake_counter(C_AVG));
    /* f16 / bf16 in place */
    for (t = 1; t <= 2; t++) {
        for (i = 0; i < 4; i++) h[i] = (uint16_t)(t == 1 ? capex_f32_to_f16(f[i]) : capex_f32_to_bf16(f[i]));
        RUN(capex_cuda_memcpy_htod(ctx, D(a), h, sizeof h, NULL));
        RUN(capex_comm_allreduce(&c, a, a, 4, (capex_dtype)t, CAPEX_REDUCE_AVG));
        RUN(capex_cuda_memcpy_dtoh(ctx, ho, D(a), sizeof ho, NULL));
        FAIL_IF(memcmp(h, ho, sizeof h) != 0, "half allreduce %d", t);
    }
    /* f64 and i64 */
    RUN(capex_cuda_memcpy_htod(ctx, D(a), d, sizeof d, NULL));
    RUN(capex_comm_allreduce(&c, a, b, 3, CAPEX_F64, CAPEX_REDUCE_SUM));
    RUN(capex_cuda_memcpy_dtoh(ctx, dout, D(b), sizeof dout, NULL));
    FAIL_IF(memcmp(d, dout, sizeof d) != 0, "f64");
    RUN(capex_cuda_memcpy_htod(ctx, D(a), q, sizeof q, NULL));
    RUN(capex_comm_allreduce(&c, a, b, 3, CAPEX_I64, CAPEX_REDUCE_SUM));
    RUN(capex_cuda_memcpy_dtoh(ctx, qo, D(b), sizeof qo, NULL));
    FAIL_IF(memcmp(q, qo, sizeof q) != 0, "i64");
    /* broadcast in place, allgather out of place, barrier */
    RUN(capex_comm_broadcast(&c, a, 3, CAPEX_I64, 0));
    RUN(capex_cuda_memcpy_htod(ctx, D(g), f, sizeof f, NULL));
    RUN(capex_cuda_memset_u8(ctx, D(b), 0, 64, NULL));
    RUN(capex_comm_allgather(&c, g, b, 5, CAPEX_F32));
    RUN(capex_cuda_memcpy_dtoh(ctx, fo, D(b), sizeof fo, NULL));
    FAIL_IF(memcmp(f, fo, sizeof f) != 0, "allgather");
    RUN(capex_comm_barrier(&c));
    FAIL_IF(fake_counter(C_ALLREDUCE) != 7 || fake_counter(C_BROADCAST) != 1 || fake_counter(C_ALLGATHER) != 1,
            "counts %d %d %d", fake_counter(C_ALLREDUCE), fake_counter(C_BROADCAST), fake_counter(C_ALLGATHER));
    FAIL_IF(fake_counter(C_BAD) != 0, "stand-in NCCL saw a bad argument");
    /* front-end checks before NCCL */
    FAIL_IF(capex_comm_allreduce(&c, a, a, 3, CAPEX_I64, CAPEX_REDUCE_AVG) != CAPEX_ERR_INVALID_ARG, "i64 avg");
    FAIL_IF(capex_comm_broadcast(&c, a, 3, CAPEX_F32, 1) != CAPEX_ERR_INVALID_ARG, "root");
    FAIL_IF(capex_nccl_set_user_stream(&c, NULL) != CAPEX_OK, "set stream");
    FAIL_IF(c.failed, "not failed");
    capex_comm_destroy(&c);
    FAIL_IF(fake_counter(C_DESTROY) != 1 || fake_counter(C_ABORT) != 0, "destroy %d abort %d", fake_counter(C_DESTROY),
            fake_counter(C_ABORT));
    capex_cuda_free(ctx, D(a)); capex_cuda_free(ctx, D(b)); capex_cuda_free(ctx, D(g));
    capex_cuda_context_destroy(ctx);
    set_result(res, CAPEX_OK, 1);
}

/* Uneven reduce-scatter / allgatherv through the NCCL backend's grouped
   ncclReduce / ncclBroadcast (the stand-ins' device memory is host memory,
   so tests/dist_shards.h's float64 checks run on it as they are): world 1,
   every dtype, zero shards skipped, groups balanced. */
static void child_fake_shards(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    char why[400] = "";
    int line, reduces, bcasts;
    size_t none[1] = {0};
    float x[2] = {1.0f, 2.0f};
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    line = shards_check_all(&c, 99, why, sizeof why);
    FAIL_IF(line != 0, "dist_shards.h:%d: %s", line, why);
    FAIL_IF(fake_counter(C_ALLREDUCE) != 0 || fake_counter(C_ALLGATHER) != 0, "a fallback ran (allreduce %d, allgather %d)",
            fake_counter(C_ALLREDUCE), fake_counter(C_ALLGATHER));
    line = shards_allreduce_check(&c, 98, 257, why, sizeof why); /* 9 allreduces, each hashed and allgathered */
    FAIL_IF(line != 0, "dist_shards.h:%d: %s", line, why);
    reduces = fake_counter(C_REDUCE);
    bcasts = fake_counter(C_BROADCAST);
    FAIL_IF(reduces < 1 || bcasts < 1 || fake_counter(C_ALLREDUCE) != 9 || fake_counter(C_ALLGATHER) != 9,
            "grouped ncclReduce %d / ncclBroadcast %d; allreduce %d / allgather %d (the allreduce check's 9 each)", reduces,
            bcasts, fake_counter(C_ALLREDUCE), fake_counter(C_ALLGATHER));
    FAIL_IF(fake_counter(C_GROUP_BAD) != 0 || fake_counter(C_BAD) != 0, "unbalanced groups %d, bad arguments %d",
            fake_counter(C_GROUP_BAD), fake_counter(C_BAD));
    /* an empty shard list reaches no NCCL call */
    RUN(capex_comm_reduce_scatter(&c, x, x, none, CAPEX_F32, CAPEX_REDUCE_SUM));
    RUN(capex_comm_allgatherv(&c, x, x, none, CAPEX_F32));
    FAIL_IF(fake_counter(C_REDUCE) != reduces || fake_counter(C_BROADCAST) != bcasts, "empty shards called NCCL");
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    set_result(res, CAPEX_OK, 1);
}

/* NCCL "2.9.7": no ncclAvg (sum, then scale on the device), no bf16: bf16 DDP
   (without allreduce_always_fp32) and bf16 ZeRO refused at create with the
   reason (they failed at the first bucket launch, mid-backward). */
static void child_fake_old_nccl(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    float f[3] = {1.0f, 2.0f, 3.0f}, fo[3];
    void *a;
    capex_result r;
    (void)arg;
    setenv("FAKE_NCCL_VERSION", "2907", 1);
    RUN(fake_open(&ctx, &c, 0));
    a = dev(ctx, 64);
    RUN(capex_cuda_memcpy_htod(ctx, D(a), f, sizeof f, NULL));
    RUN(capex_comm_allreduce(&c, a, a, 3, CAPEX_F32, CAPEX_REDUCE_AVG));
    RUN(capex_cuda_memcpy_dtoh(ctx, fo, D(a), sizeof fo, NULL));
    FAIL_IF(memcmp(f, fo, sizeof f) != 0 || fake_counter(C_AVG) != 0, "avg without ncclAvg");
    r = capex_comm_allreduce(&c, a, a, 3, CAPEX_BF16, CAPEX_REDUCE_SUM);
    FAIL_IF(r != CAPEX_ERR_UNSUPPORTED || !strstr(capex_last_error(), "2.10"), "bf16 on old NCCL: %d %s", (int)r, capex_last_error());
    FAIL_IF(fake_counter(C_BAD) != 0, "bad arguments reached NCCL");
    { /* bf16 DDP and ZeRO are refused at create, not at the first bucket mid-backward;
         allreduce_always_fp32 reduces in f32 and works */
        capex_ddp *ddp = NULL;
        capex_ddp_param p;
        capex_ddp_desc dd;
        capex_cuda_zero *zg = NULL;
        capex_zero_param zp;
        capex_optim_desc od;
        uint16_t gb[3] = {0x3f80, 0x4000, 0x4040}, go[3]; /* bf16 1, 2, 3 */
        memset(&p, 0, sizeof p);
        p.data = a; p.numel = 3; p.dtype = CAPEX_BF16;
        capex_ddp_desc_init(&dd);
        dd.gradient_average = 0;
        r = capex_ddp_create(&ddp, &c, &p, 1, &dd);
        FAIL_IF(r != CAPEX_ERR_UNSUPPORTED || ddp || !strstr(capex_last_error(), "capex_ddp_create: param 0") ||
                !strstr(capex_last_error(), "2.10") || !strstr(capex_last_error(), "allreduce_always_fp32"),
                "bf16 DDP on old NCCL: %d %s", (int)r, capex_last_error());
        dd.allreduce_always_fp32 = 1;
        RUN(capex_ddp_create(&ddp, &c, &p, 1, &dd));
        RUN(capex_cuda_memcpy_htod(ctx, D(capex_ddp_grad(ddp, 0)), gb, sizeof gb, NULL));
        RUN(capex_ddp_grad_ready(ddp, 0));
        RUN(capex_ddp_finalize(ddp));
        RUN(capex_cuda_memcpy_dtoh(ctx, go, D(capex_ddp_grad(ddp, 0)), sizeof go, NULL));
        FAIL_IF(memcmp(gb, go, sizeof gb) != 0, "bf16 through f32 on a world of one");
        capex_ddp_destroy(ddp);
        memset(&zp, 0, sizeof zp);
        zp.data = a; zp.numel = 3; zp.dtype = CAPEX_BF16;
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        r = capex_cuda_zero_create(&zg, &c, &zp, 1, &od, NULL, 1, NULL);
        FAIL_IF(r != CAPEX_ERR_UNSUPPORTED || zg || !strstr(capex_last_error(), "capex_cuda_zero_create: param 0") ||
                !strstr(capex_last_error(), "2.10"), "bf16 ZeRO on old NCCL: %d %s", (int)r, capex_last_error());
    }
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    set_result(res, CAPEX_OK, 1);
}

/* DDP over NCCL, one rank: device buckets, f32 + f16 params, predivide 2
   without averaging (grads come out halved), f16 through f32 buckets, one
   param in copy mode; two iterations. */
static void child_fake_ddp(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[3];
    capex_ddp_desc dd;
    capex_ddp_stats st;
    float w0[6], w1[4], g0[6], g1[4], o0[6], o1[4];
    uint16_t w2[5], g2[5], o2[5];
    void *dw0, *dw1, *dw2, *own1;
    int it, i;
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    for (i = 0; i < 6; i++) w0[i] = (float)i;
    for (i = 0; i < 4; i++) w1[i] = (float)-i;
    for (i = 0; i < 5; i++) w2[i] = capex_f32_to_f16((float)i * 0.5f);
    dw0 = dev(ctx, sizeof w0); dw1 = dev(ctx, sizeof w1); dw2 = dev(ctx, sizeof w2); own1 = dev(ctx, sizeof g1);
    RUN(capex_cuda_memcpy_htod(ctx, D(dw0), w0, sizeof w0, NULL));
    RUN(capex_cuda_memcpy_htod(ctx, D(dw1), w1, sizeof w1, NULL));
    RUN(capex_cuda_memcpy_htod(ctx, D(dw2), w2, sizeof w2, NULL));
    ps[0].data = dw0; ps[0].numel = 6; ps[0].dtype = CAPEX_F32; ps[0].grad = NULL;
    ps[1].data = dw1; ps[1].numel = 4; ps[1].dtype = CAPEX_F32; ps[1].grad = own1;
    ps[2].data = dw2; ps[2].numel = 5; ps[2].dtype = CAPEX_F16; ps[2].grad = NULL;
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 16; dd.bucket_bytes = 16; /* several buckets */
    dd.gradient_average = 0; dd.gradient_predivide_factor = 2.0f; dd.allreduce_always_fp32 = 1;
    RUN(capex_ddp_create(&ddp, &c, ps, 3, &dd));
    for (it = 0; it < 2; it++) {
        for (i = 0; i < 6; i++) g0[i] = (float)(i + 1) * (it ? -3.0f : 1.0f);
        for (i = 0; i < 4; i++) g1[i] = 0.25f * (float)i + (float)it;
        for (i = 0; i < 5; i++) g2[i] = capex_f32_to_f16((float)i - 1.5f + (float)it);
        /* backward: last param first */
        RUN(capex_cuda_memcpy_htod(ctx, D(capex_ddp_grad(ddp, 2)), g2, sizeof g2, NULL));
        RUN(capex_ddp_grad_ready(ddp, 2));
        RUN(capex_cuda_memcpy_htod(ctx, D(own1), g1, sizeof g1, NULL));
        FAIL_IF(capex_ddp_grad(ddp, 1) != own1, "copy-mode grad pointer");
        RUN(capex_ddp_grad_ready(ddp, 1));
        RUN(capex_cuda_memcpy_htod(ctx, D(capex_ddp_grad(ddp, 0)), g0, sizeof g0, NULL));
        RUN(capex_ddp_grad_ready(ddp, 0));
        RUN(capex_ddp_finalize(ddp));
        RUN(capex_cuda_memcpy_dtoh(ctx, o0, D(capex_ddp_grad(ddp, 0)), sizeof o0, NULL));
        RUN(capex_cuda_memcpy_dtoh(ctx, o1, D(own1), sizeof o1, NULL));
        RUN(capex_cuda_memcpy_dtoh(ctx, o2, D(capex_ddp_grad(ddp, 2)), sizeof o2, NULL));
        for (i = 0; i < 6; i++) FAIL_IF(o0[i] != g0[i] * 0.5f, "it %d p0[%d] %g", it, i, (double)o0[i]);
        for (i = 0; i < 4; i++) FAIL_IF(o1[i] != g1[i] * 0.5f, "it %d p1[%d] %g", it, i, (double)o1[i]);
        for (i = 0; i < 5; i++)
            FAIL_IF(o2[i] != capex_f32_to_f16(capex_f16_to_f32(g2[i]) * 0.5f), "it %d p2[%d] %04x", it, i, o2[i]);
        RUN(capex_ddp_zero_grad(ddp));
        RUN(capex_cuda_memcpy_dtoh(ctx, o0, D(capex_ddp_grad(ddp, 0)), sizeof o0, NULL));
        for (i = 0; i < 6; i++) FAIL_IF(o0[i] != 0.0f, "zero_grad");
    }
    capex_ddp_get_stats(ddp, &st);
    FAIL_IF(st.iterations != 2 || st.launches != 2 * capex_ddp_num_buckets(ddp) || capex_ddp_num_buckets(ddp) < 3,
            "stats: %d iterations, %d launches, %d buckets", (int)st.iterations, (int)st.launches, (int)capex_ddp_num_buckets(ddp));
    FAIL_IF(st.launched_in_backward != st.launches, "buckets launched during backward");
    FAIL_IF(fake_counter(C_ALLREDUCE) != (int)st.launches || fake_counter(C_BAD) != 0, "NCCL calls %d", fake_counter(C_ALLREDUCE));
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    set_result(res, CAPEX_OK, 1);
}

/* A peer dies: ncclCommGetAsyncError reports ncclRemoteError. arg "ddp":
   through capex_ddp_finalize; else a blocking allreduce. */
static void child_fake_async_error(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_result r;
    void *a;
    char msg[1024];
    RUN(fake_open(&ctx, &c, 0));
    a = dev(ctx, 64);
    RUN(capex_cuda_memset_u8(ctx, D(a), 0, 64, NULL));
    setenv("FAKE_NCCL_ASYNC_ERROR", "1", 1);
    if (arg && !strcmp(arg, "ddp")) {
        capex_ddp *ddp = NULL;
        capex_ddp_param p;
        p.data = a; p.numel = 4; p.dtype = CAPEX_F32; p.grad = NULL;
        RUN(capex_ddp_create(&ddp, &c, &p, 1, NULL));
        RUN(capex_ddp_grad_ready(ddp, 0));
        r = capex_ddp_finalize(ddp);
        snprintf(msg, sizeof msg, "%s", capex_last_error());
        FAIL_IF(capex_ddp_finalize(ddp) != CAPEX_ERR_COMM, "finalize after failure must fail");
        capex_ddp_destroy(ddp);
    } else {
        r = capex_comm_allreduce(&c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM);
        snprintf(msg, sizeof msg, "%s", capex_last_error());
    }
    FAIL_IF(r != CAPEX_ERR_COMM, "expected CAPEX_ERR_COMM, got %s: %s", capex_result_string(r), msg);
    FAIL_IF(!strstr(msg, "ncclCommGetAsyncError") || !strstr(msg, "remote process"), "message: %s", msg);
    FAIL_IF(!c.failed || fake_counter(C_ABORT) != 1, "aborted once (%d), failed %d", fake_counter(C_ABORT), c.failed);
    FAIL_IF(capex_comm_barrier(&c) != CAPEX_ERR_COMM, "later calls fail fast");
    capex_comm_destroy(&c);
    FAIL_IF(fake_counter(C_DESTROY) != 0 || fake_counter(C_BAD) != 0, "no destroy after abort");
    capex_cuda_context_destroy(ctx);
    /* the failed bucket's event goes with the comm, not leaked */
    FAIL_IF(fake_live_events() != 0, "%d CUDA events left after destroy", fake_live_events());
    set_result(res, CAPEX_OK, 1);
}

/* A peer fails while DDP's first bucket reduces; the next bucket's predivide
   (bf16 in place) runs in the comm's f32 scratch that create reserved, so
   it launches without waiting. A larger scale through the comm's memory
   entry grows the scratch, which waits for the user stream and sees the
   async error: CAPEX_ERR_COMM, and the comm is aborted and marked failed
   there, as every collective does. (Before 2026-11-28 the bucket's own
   predivide grew it, mid-backward.) */
static void child_fake_scratch_async(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    capex_result r;
    char msg[1024];
    void *big;
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    ps[0].data = dev(ctx, 600); ps[0].numel = 300; ps[0].dtype = CAPEX_BF16; ps[0].grad = NULL; /* the last bucket */
    ps[1].data = dev(ctx, 16); ps[1].numel = 8; ps[1].dtype = CAPEX_BF16; ps[1].grad = NULL;    /* the first, small */
    big = dev(ctx, 2000);
    FAIL_IF(!ps[0].data || !ps[1].data || !big, "malloc");
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 16; dd.bucket_bytes = 4096; dd.gradient_predivide_factor = 2.0f;
    RUN(capex_ddp_create(&ddp, &c, ps, 2, &dd));
    FAIL_IF(capex_ddp_num_buckets(ddp) != 2, "%d buckets", (int)capex_ddp_num_buckets(ddp));
    RUN(capex_cuda_memset_u8(ctx, D(capex_ddp_grad(ddp, 0)), 0, 600, NULL));
    RUN(capex_cuda_memset_u8(ctx, D(capex_ddp_grad(ddp, 1)), 0, 16, NULL));
    setenv("FAKE_NCCL_ASYNC_ERROR", "1", 1);
    RUN(capex_ddp_grad_ready(ddp, 1)); /* bucket 0: its allreduce fails on the "GPU" */
    RUN(capex_ddp_grad_ready(ddp, 0)); /* bucket 1: in the reserved scratch */
    FAIL_IF(c.failed, "a launch in the reserved scratch waited for the comm");
    r = c.vt->scale(&c, big, 1000, CAPEX_BF16, 0.5f); /* past it: the scratch grows */
    snprintf(msg, sizeof msg, "%s", capex_last_error());
    FAIL_IF(r != CAPEX_ERR_COMM || !strstr(msg, "scratch"), "expected CAPEX_ERR_COMM growing the scratch, got %s: %s",
            capex_result_string(r), msg);
    FAIL_IF(!c.failed || fake_counter(C_ABORT) != 1, "comm failed %d, aborted %d times", c.failed, fake_counter(C_ABORT));
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&c);
    FAIL_IF(fake_counter(C_DESTROY) != 0 || fake_counter(C_ABORT) != 1, "destroy %d abort %d", fake_counter(C_DESTROY),
            fake_counter(C_ABORT));
    capex_cuda_context_destroy(ctx);
    FAIL_IF(fake_live_events() != 0, "%d CUDA events left after destroy", fake_live_events());
    set_result(res, CAPEX_OK, 1);
}

/* Overlap: during backward, a bucket's f32 staging, predivide and copy of an
   own-grad param run on the engine's stream and make it wait for nothing, so
   its next kernels do not queue behind the allreduces already in flight on
   the comm's stream (ZeRO's lent buffers take the same memory entries). */
static void child_fake_overlap(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_ddp_param ps[3];
    capex_result r;
    int w0, w1, s0, s1;
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    ps[0].data = dev(ctx, 600); ps[0].numel = 300; ps[0].dtype = CAPEX_BF16; ps[0].grad = NULL;
    ps[1].data = dev(ctx, 64); ps[1].numel = 32; ps[1].dtype = CAPEX_BF16; ps[1].grad = NULL;
    ps[2].data = dev(ctx, 64); ps[2].numel = 32; ps[2].dtype = CAPEX_BF16; ps[2].grad = dev(ctx, 64); /* copy mode */
    FAIL_IF(!ps[0].data || !ps[1].data || !ps[2].data || !ps[2].grad, "malloc");
    {
        capex_ddp *ddp = NULL;
        capex_ddp_desc dd;
        capex_ddp_desc_init(&dd);
        dd.first_bucket_bytes = 64; dd.bucket_bytes = 256;
        dd.gradient_predivide_factor = 2.0f; dd.allreduce_always_fp32 = 1;
        RUN(capex_ddp_create(&ddp, &c, ps, 3, &dd));
        FAIL_IF(capex_ddp_num_buckets(ddp) < 2, "%d buckets", (int)capex_ddp_num_buckets(ddp));
        RUN(capex_ddp_zero_grad(ddp));
        w0 = fake_null_stream_waits();
        s0 = fake_ctx_syncs();
        RUN(capex_ddp_grad_ready(ddp, 2));
        RUN(capex_ddp_grad_ready(ddp, 1));
        RUN(capex_ddp_grad_ready(ddp, 0));
        w1 = fake_null_stream_waits();
        s1 = fake_ctx_syncs();
        FAIL_IF(w0 < 0 || w1 != w0, "the engine's stream waited %d times for the comm's stream during backward", w1 - w0);
        /* the engine's stream is the legacy one here: its copies must not wait for the whole context */
        FAIL_IF(s0 < 0 || s1 != s0, "backward synchronised the whole context %d times", s1 - s0);
        r = capex_ddp_finalize(ddp);
        FAIL_IF(r != CAPEX_OK, "finalize: %s", capex_last_error());
        capex_ddp_destroy(ddp);
    }
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    set_result(res, CAPEX_OK, 1);
}

/* A collective that never completes: CAPEX_ERR_TIMEOUT at the deadline, abort. */
static void child_fake_timeout(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_result r;
    void *a;
    double t0;
    char msg[1024];
    (void)arg;
    RUN(fake_open(&ctx, &c, 0));
    a = dev(ctx, 64);
    setenv("FAKE_CUDA_EVENT_NOT_READY", "1", 1);
    c.timeout_s = 0.2;
    t0 = capex_dist_now();
    r = capex_comm_allreduce(&c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM);
    snprintf(msg, sizeof msg, "%s", capex_last_error());
    FAIL_IF(r != CAPEX_ERR_TIMEOUT || !strstr(msg, "ncclAllReduce"), "%s: %s", capex_result_string(r), msg);
    FAIL_IF(capex_dist_now() - t0 < 0.19, "returned before the deadline");
    FAIL_IF(fake_counter(C_ABORT) != 1 || !c.failed, "abort");
    unsetenv("FAKE_CUDA_EVENT_NOT_READY");
    FAIL_IF(capex_comm_allreduce(&c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_ERR_COMM, "fails fast after");
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    FAIL_IF(fake_live_events() != 0, "%d CUDA events left after destroy", fake_live_events());
    set_result(res, CAPEX_OK, 1);
}

/* arg "old": NCCL 2.13, whose blocking ncclCommInitRank fails; else the
   non-blocking init fails later (its async error) and is aborted. */
static void child_fake_init_fail(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_result r;
    int old = arg && !strcmp(arg, "old");
    setenv("FAKE_NCCL_INIT_FAIL", "1", 1);
    if (old) setenv("FAKE_NCCL_VERSION", "21303", 1);
    r = fake_open(&ctx, &c, 0);
    set_result(res, r, c.vt == NULL && fake_counter(C_INIT) == 0 && fake_counter(C_BAD) == 0 &&
                       fake_counter(C_NB_INIT) == !old && fake_counter(C_ABORT) == !old);
    capex_cuda_context_destroy(ctx);
}

/* The real NCCL on the stand-in driver: its runtime finds no GPU. */
static void child_real_nccl_fake_driver(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_comm c;
    capex_result r;
    (void)arg;
    setenv("NCCL_DEBUG", "NONE", 1);
    r = fake_open(&ctx, &c, 1);
    set_result(res, r, c.vt == NULL);
    capex_cuda_context_destroy(ctx);
}

/* Several ranks on the stand-in NCCL (forked, one shared file): every
   collective and dtype against float64 through tests/dist_shards.h, pieces
   past the stand-in's 1 MiB slot, broadcast from the last rank, and DDP over
   device buckets averaging rank-dependent gradients. */
static int world_checks(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    char why[400] = "";
    int line, i, it;
    float w[2][700], gf[700], out[700];
    uint16_t wb[300], gb[300], outb[300];
    capex_ddp *ddp = NULL;
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    void *a;
    (void)user;
    if (c->world_size != world || c->rank != rank) return 1;
    if ((line = shards_check_all(c, 301, why, sizeof why)) != 0) { fprintf(stderr, "dist_shards.h:%d: %s\n", line, why); return 2; }
    if ((line = shards_allreduce_check(c, 302, 300000, why, sizeof why)) != 0) {
        fprintf(stderr, "dist_shards.h:%d: %s\n", line, why);
        return 3;
    }
    { /* ZeRO's nonblocking entries (equal shards of 300): in place and not, f32 and bf16 */
        float *buf = (float *)dev(ctx, 4 * 300 * (size_t)world), *mine = (float *)dev(ctx, 4 * 300), hb[300];
        uint16_t *hbuf = (uint16_t *)dev(ctx, 2 * 300 * (size_t)world), hh[300];
        capex_comm_req q;
        int ip, k;
        if (!c->vt->ireduce_scatter || !c->vt->iallgather) return 30;
        for (ip = 0; ip < 2; ip++) {
            float *fs = (float *)malloc(4 * 300 * (size_t)world);
            uint16_t *hs = (uint16_t *)malloc(2 * 300 * (size_t)world);
            for (k = 0; k < 300 * world; k++) { fs[k] = (float)(k % 97) * 0.25f + (float)rank; hs[k] = capex_f32_to_bf16(fs[k]); }
            if (capex_cuda_memcpy_htod(ctx, D(buf), fs, 4 * 300 * (size_t)world, NULL) != CAPEX_OK ||
                capex_cuda_memcpy_htod(ctx, D(hbuf), hs, 2 * 300 * (size_t)world, NULL) != CAPEX_OK) return 31;
            if (c->vt->ireduce_scatter(c, buf, ip ? (void *)(buf + 300 * rank) : (void *)mine, 300, CAPEX_F32,
                                       CAPEX_REDUCE_SUM, &q) != CAPEX_OK || c->vt->wait(c, &q, capex_dist_now() + 30) != CAPEX_OK)
                return 32;
            if (capex_cuda_memcpy_dtoh(ctx, hb, D(ip ? buf + 300 * rank : mine), sizeof hb, NULL) != CAPEX_OK) return 33;
            for (k = 0; k < 300; k++) { /* sum over ranks q of (j % 97) / 4 + q, j = rank * 300 + k: exact */
                double want = world * (double)((rank * 300 + k) % 97) * 0.25 + world * (world - 1) / 2.0;
                if ((double)hb[k] != want) { fprintf(stderr, "ireduce_scatter f32 [%d]: %g vs %g\n", k, (double)hb[k], want); return 34; }
            }
            if (c->vt->ireduce_scatter(c, hbuf, hbuf + 300 * rank, 300, CAPEX_BF16, CAPEX_REDUCE_SUM, &q) != CAPEX_OK ||
                c->vt->wait(c, &q, capex_dist_now() + 30) != CAPEX_OK ||
                capex_cuda_memcpy_dtoh(ctx, hh, D(hbuf + 300 * rank), sizeof hh, NULL) != CAPEX_OK) return 35;
            for (k = 0; k < 300; k++) { /* rank order, rounded after each addition (the stand-in, as NCCL) */
                float acc = capex_bf16_to_f32(capex_f32_to_bf16((float)((rank * 300 + k) % 97) * 0.25f)); /* rank 0's */
                int qq;
                for (qq = 1; qq < world; qq++)
                    acc = capex_bf16_to_f32(capex_f32_to_bf16(acc + capex_bf16_to_f32(capex_f32_to_bf16((float)((rank * 300 + k) % 97) * 0.25f + (float)qq))));
                if (hh[k] != capex_f32_to_bf16(acc)) { fprintf(stderr, "ireduce_scatter bf16 [%d]\n", k); return 36; }
            }
            /* all-gather: each rank's slice k + 1000 * rank */
            for (k = 0; k < 300; k++) hb[k] = (float)(k + 1000 * rank);
            if (capex_cuda_memcpy_htod(ctx, D(ip ? buf + 300 * rank : mine), hb, sizeof hb, NULL) != CAPEX_OK) return 37;
            if (c->vt->iallgather(c, ip ? (void *)(buf + 300 * rank) : (void *)mine, buf, 300, CAPEX_F32, &q) != CAPEX_OK ||
                c->vt->wait(c, &q, capex_dist_now() + 30) != CAPEX_OK ||
                capex_cuda_memcpy_dtoh(ctx, fs, D(buf), 4 * 300 * (size_t)world, NULL) != CAPEX_OK) return 38;
            for (k = 0; k < 300 * world; k++)
                if (fs[k] != (float)(k % 300 + 1000 * (k / 300))) { fprintf(stderr, "iallgather [%d] %g\n", k, (double)fs[k]); return 39; }
            free(fs); free(hs);
        }
    }
    a = dev(ctx, sizeof gf);
    for (i = 0; i < 700; i++) gf[i] = (float)(rank * 1000 + i);
    if (capex_cuda_memcpy_htod(ctx, D(a), gf, sizeof gf, NULL) != CAPEX_OK) return 4;
    if (capex_comm_broadcast(c, a, 700, CAPEX_F32, world - 1) != CAPEX_OK) return 5;
    if (capex_cuda_memcpy_dtoh(ctx, out, D(a), sizeof out, NULL) != CAPEX_OK) return 6;
    for (i = 0; i < 700; i++) if (out[i] != (float)((world - 1) * 1000 + i)) { fprintf(stderr, "broadcast [%d] %g\n", i, (double)out[i]); return 7; }
    /* DDP: grads k/16 + rank (exact in any order); the average is their mean */
    for (i = 0; i < 700; i++) w[0][i] = (float)i;
    for (i = 0; i < 300; i++) wb[i] = capex_f32_to_bf16((float)i);
    ps[0].data = dev(ctx, sizeof w[0]); ps[0].numel = 700; ps[0].dtype = CAPEX_F32; ps[0].grad = NULL;
    ps[1].data = dev(ctx, sizeof wb); ps[1].numel = 300; ps[1].dtype = CAPEX_BF16; ps[1].grad = NULL;
    if (capex_cuda_memcpy_htod(ctx, D(ps[0].data), w[0], sizeof w[0], NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, D(ps[1].data), wb, sizeof wb, NULL) != CAPEX_OK) return 8;
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 256; dd.bucket_bytes = 1024;
    if (capex_ddp_create(&ddp, c, ps, 2, &dd) != CAPEX_OK) return 9;
    for (it = 0; it < 2; it++) {
        double mean;
        for (i = 0; i < 300; i++) gb[i] = capex_f32_to_bf16((float)(i % 16) / 16.0f + (float)(rank + it));
        for (i = 0; i < 700; i++) gf[i] = (float)(i % 64) / 16.0f - (float)(rank * (it + 1));
        if (capex_cuda_memcpy_htod(ctx, D(capex_ddp_grad(ddp, 1)), gb, sizeof gb, NULL) != CAPEX_OK ||
            capex_ddp_grad_ready(ddp, 1) != CAPEX_OK ||
            capex_cuda_memcpy_htod(ctx, D(capex_ddp_grad(ddp, 0)), gf, sizeof gf, NULL) != CAPEX_OK ||
            capex_ddp_grad_ready(ddp, 0) != CAPEX_OK || capex_ddp_finalize(ddp) != CAPEX_OK) return 10;
        if (capex_cuda_memcpy_dtoh(ctx, out, D(capex_ddp_grad(ddp, 0)), sizeof out, NULL) != CAPEX_OK ||
            capex_cuda_memcpy_dtoh(ctx, outb, D(capex_ddp_grad(ddp, 1)), sizeof outb, NULL) != CAPEX_OK) return 11;
        mean = (double)(world - 1) / 2.0; /* mean rank */
        for (i = 0; i < 700; i++)
            if ((double)out[i] != (double)(i % 64) / 16.0 - mean * (it + 1)) {
                fprintf(stderr, "ddp f32 it %d [%d]: %g\n", it, i, (double)out[i]);
                return 12;
            }
        for (i = 0; i < 300; i++)
            if (outb[i] != capex_f32_to_bf16((float)((double)(i % 16) / 16.0 + mean + it))) {
                fprintf(stderr, "ddp bf16 it %d [%d]: %g\n", it, i, (double)capex_bf16_to_f32(outb[i]));
                return 13;
            }
        if (capex_ddp_zero_grad(ddp) != CAPEX_OK) return 14;
    }
    capex_ddp_destroy(ddp);
    return 0;
}
/* The last rank leaves after init: the others' next collective fails with
   CAPEX_ERR_COMM (the stand-in's async error), well before any deadline. */
static int world_dead_peer(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    void *a = dev(ctx, 64);
    capex_result r;
    (void)user;
    if (rank == world - 1) return 0;
    r = capex_comm_allreduce(c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM);
    if (r != CAPEX_ERR_COMM || !strstr(capex_last_error(), "remote process")) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, capex_result_string(r), capex_last_error());
        return 20;
    }
    /* seen dead (the stand-in's words: its rank that noticed, then the rest),
       not waited out: past FAKE_NCCL_TIMEOUT "peers did not reach the collective in time" */
    if (!strstr(capex_last_error(), "a peer process exited") && !strstr(capex_last_error(), "a peer failed")) {
        fprintf(stderr, "rank %d: not told by the peer's exit: %s\n", rank, capex_last_error());
        return 21;
    }
    return capex_comm_allreduce(c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_COMM ? 0 : 22;
}
/* The last rank leaves after init, with nothing in flight; rank 0 waits
   until NCCL (the stand-in with FAKE_NCCL_WATCH_PEERS) reports the dead
   peer as an async error, then destroys its comm: that must be
   ncclCommAbort, not ncclCommDestroy (which waits for the peer: NCCL's
   contract is to abort a comm with an async error). */
static int world_exit_then_destroy(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    double t0 = capex_dist_now();
    (void)ctx; (void)user;
    if (rank == world - 1) return 0;
    while (c->vt->poll_error(c) == CAPEX_OK)
        if (capex_dist_now() - t0 > CT_HANG_GUARD_S) { /* a hang guard */
            fprintf(stderr, "rank %d: no async error after %.0f s\n", rank, CT_HANG_GUARD_S);
            return 23;
        }
    if (c->failed) return 24; /* the poll alone marks nothing: only the destroy below sees the state */
    capex_comm_destroy(c);
    if (fake_counter(C_ABORT) != 1 || fake_counter(C_DESTROY) != 0) {
        fprintf(stderr, "rank %d: destroy of a comm with an async error: %d aborts, %d ncclCommDestroy\n", rank,
                fake_counter(C_ABORT), fake_counter(C_DESTROY));
        return 25;
    }
    return 0;
}
/* world_checks, then which init and how many ncclInProgress this rank saw:
   NCCL >= 2.14 a non-blocking comm (init, each ungrouped collective and each
   group's end say ncclInProgress, every one settled: nothing counted bad),
   older the blocking ncclCommInitRank and no ncclInProgress. */
static int world_checks_counted(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    int e = world_checks(ctx, c, rank, world, user), old = atoi(getenv("FAKE_NCCL_VERSION") ? getenv("FAKE_NCCL_VERSION") : "0");
    int nb = fake_counter(C_NB_INIT), ip = fake_counter(C_IN_PROGRESS), calls;
    if (e) return e;
    calls = fake_counter(C_ALLREDUCE) + fake_counter(C_ALLGATHER);
    if (fake_counter(C_INIT) != 1 || fake_counter(C_BAD) != 0 || fake_counter(C_GROUP_BAD) != 0 ||
        (old ? nb != 0 || ip != 0 : nb != 1 || ip < 1 + calls)) {
        fprintf(stderr, "rank %d (NCCL %d): %d inits, %d non-blocking, %d ncclInProgress for %d allreduce/allgather, "
                "%d bad calls\n", rank, old, fake_counter(C_INIT), nb, ip, calls, fake_counter(C_BAD));
        return 26;
    }
    return 0;
}
/* Ranks passing different models or descriptors to capex_ddp_create and
   capex_cuda_zero_create over NCCL (the signatures go through a device
   buffer): a different param count, bucket_bytes, a rank refusing its own
   arguments, a different ZeRO model, a rank refusing capex_cuda_zero_create's
   own arguments (od NULL). The last rank is the odd one. Every rank
   fails at create (before the check: a hang in the parameter broadcast or
   different buckets), the comm still works after each, and a matching
   create then works. */
static int world_model_check(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    float h[8], s = (float)(rank + 1);
    void *a = dev(ctx, 64), *b = dev(ctx, 64), *one = dev(ctx, 4);
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    capex_ddp *ddp = NULL;
    capex_zero_param zp[2];
    capex_optim_desc od;
    capex_cuda_zero *zg = NULL;
    int me = rank == world - 1, mode, i;
    char msg[160];
    (void)user;
    for (i = 0; i < 8; i++) h[i] = (float)(rank * 10 + i);
    if (capex_cuda_memcpy_htod(ctx, D(a), h, sizeof h, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, D(b), h, sizeof h, NULL) != CAPEX_OK) return 40;
    memset(ps, 0, sizeof ps);
    memset(zp, 0, sizeof zp);
    for (i = 0; i < 2; i++) {
        ps[i].data = zp[i].data = i ? b : a;
        ps[i].numel = zp[i].numel = 8;
        ps[i].dtype = zp[i].dtype = CAPEX_F32;
    }
    for (mode = 0; mode < 5; mode++) {
        capex_result r, want = mode == 1 ? CAPEX_ERR_CONFIG : mode == 2 || mode == 4 ? (me ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_COMM)
                                                                                     : CAPEX_ERR_SIZE_MISMATCH;
        if (mode == 0 || mode == 3)
            snprintf(msg, sizeof msg, "ranks hold different models: rank %d has 1 params (8 elements), rank 0 has 2 (16)",
                     world - 1);
        else if (mode == 1) snprintf(msg, sizeof msg, "rank %d has bucket_bytes 64, rank 0 has 26214400", world - 1);
        else if (me) snprintf(msg, sizeof msg, "%s", mode == 2 ? "invalid dtype 99" : "od is NULL");
        else snprintf(msg, sizeof msg, "rank %d refused its arguments", world - 1);
        capex_ddp_desc_init(&dd);
        if (me && mode == 1) dd.bucket_bytes = 64;
        ps[1].dtype = me && mode == 2 ? (capex_dtype)99 : CAPEX_F32;
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        r = mode < 3 ? capex_ddp_create(&ddp, c, ps, me && mode == 0 ? 1 : 2, &dd)
                     : capex_cuda_zero_create(&zg, c, zp, me && mode == 3 ? 1 : 2, me && mode == 4 ? NULL : &od, NULL, 1, NULL);
        if (r != want || ddp || zg || !strstr(capex_last_error(), msg)) {
            fprintf(stderr, "rank %d, model check %d: %d %s\n", rank, mode, (int)r, capex_last_error());
            return 41 + mode;
        }
        s = (float)(rank + 1); /* the comm still works */
        if (capex_cuda_memcpy_htod(ctx, D(one), &s, 4, NULL) != CAPEX_OK ||
            capex_comm_allreduce(c, one, one, 1, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK ||
            capex_cuda_memcpy_dtoh(ctx, &s, D(one), 4, NULL) != CAPEX_OK || s != (float)(world * (world + 1) / 2))
            return 45;
    }
    capex_ddp_desc_init(&dd);
    if (capex_ddp_create(&ddp, c, ps, 2, &dd) != CAPEX_OK) return 46;
    if (capex_cuda_memcpy_dtoh(ctx, h, D(b), sizeof h, NULL) != CAPEX_OK || h[7] != 7.0f) return 47; /* rank 0's */
    capex_ddp_destroy(ddp);
    return 0;
}
/* Rank 0 has no memory to track its first nonblocking allreduce (the
   request list's first 16 slots): refused with nothing queued, so its retry
   is the collective that pairs with rank 1's. The slot was taken after the
   collective was queued: the untracked one paired with rank 1's, and the
   retry waited for a peer collective that never came. */
static int world_req_oom(capex_cuda_context *ctx, capex_comm *c, int rank, int world, void *user) {
    float h[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    void *a = dev(ctx, sizeof h);
    capex_comm_req req;
    capex_result r;
    int i;
    (void)user;
    for (i = 0; i < 4; i++) h[i] *= (float)(rank + 1);
    if (capex_cuda_memcpy_htod(ctx, D(a), h, sizeof h, NULL) != CAPEX_OK) return 50;
    if (rank == 0) {
        g_fail_alloc_size = 16 * sizeof(capex_cuda_event);
        r = c->vt->iallreduce(c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM, &req);
        if (g_fail_alloc_size || r != CAPEX_ERR_OUT_OF_MEMORY || req.active) {
            fprintf(stderr, "rank 0: iallreduce without memory to track it: %s (%s)\n", capex_result_string(r),
                    capex_last_error());
            g_fail_alloc_size = 0;
            return 51;
        }
    }
    if ((r = c->vt->iallreduce(c, a, a, 4, CAPEX_F32, CAPEX_REDUCE_SUM, &req)) != CAPEX_OK ||
        (r = c->vt->wait(c, &req, capex_dist_now() + CT_HANG_GUARD_S)) != CAPEX_OK) {
        fprintf(stderr, "rank %d: iallreduce: %s\n", rank, capex_last_error());
        return 52;
    }
    if (capex_cuda_memcpy_dtoh(ctx, h, D(a), sizeof h, NULL) != CAPEX_OK) return 53;
    for (i = 0; i < 4; i++)
        if (h[i] != (float)(i + 1) * (float)(world * (world + 1) / 2)) {
            fprintf(stderr, "rank %d: element %d is %g\n", rank, i, (double)h[i]);
            return 54;
        }
    return 0;
}
static void child_fake_world(const char *arg, child_result *res) {
    char cu[1200], nc[1200];
    int codes[16] = {0}, world = atoi(arg ? arg : "2"), dead = arg && strstr(arg, "dead") != NULL, i, r;
    nccl_world_body body = world_checks;
    FAIL_IF(!fake_path("libcuda.so.1", cu, sizeof cu) || !fake_path("libnccl.so.2", nc, sizeof nc), "stand-ins not built");
    setenv("CAPEX_LIBCUDA_PATH", cu, 1);
    setenv("CAPEX_NCCL_PATH", nc, 1);
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a hang guard: a stuck test fails instead of hanging */
    if (arg && strstr(arg, "exit")) setenv("FAKE_NCCL_WATCH_PEERS", "1", 1);
    if (arg && strstr(arg, "counted")) body = world_checks_counted;
    if (arg && strstr(arg, "models")) body = world_model_check;
    if (arg && strstr(arg, "reqoom")) { body = world_req_oom; setenv("FAKE_NCCL_TIMEOUT", "60", 1); }
    if (arg && strstr(arg, "old")) setenv("FAKE_NCCL_VERSION", "21303", 1); /* before ncclCommInitRankConfig */
    r = nccl_world_run(world, arg && strstr(arg, "exit") ? world_exit_then_destroy : dead ? world_dead_peer : body,
                       NULL, codes);
    for (i = 0; i < world; i++) FAIL_IF(codes[i] != 0, "world %d: rank %d failed (%d; its stderr says why)", world, i, codes[i]);
    FAIL_IF(r != 0, "rank 0 failed");
    set_result(res, CAPEX_OK, 1);
}

/* One rank of 2 has no NCCL (a node without it), the other the stand-in.
   arg "1": rank 1 lacks it and must fail before it takes part in the
   unique-id exchange: once the id has gone round, rank 0 is in
   ncclCommInitRank, which waits for every rank with no deadline (the
   stand-in gives up after FAKE_NCCL_TIMEOUT; the real NCCL never does), so
   rank 0 fails at the exchange's deadline with the rendezvous' status
   instead. arg "0": rank 0 lacks it, still sends the all-zero id, and rank 1
   fails at once with CAPEX_ERR_COMM. Exit codes: 0 as expected, 1 reached
   ncclCommInitRank or the wrong status, 2 the rank without NCCL not
   CAPEX_ERR_NO_NCCL, 3 succeeded, 4 setup. */
static int missing_rank(int rank, int missing, int port, const char *cu, const char *nc) {
    capex_cuda_context *ctx = NULL;
    capex_dist_env env;
    capex_nccl_desc nd;
    capex_comm c;
    capex_result r;
    int entered;
    setenv("CAPEX_LIBCUDA_PATH", cu, 1);
    setenv("CAPEX_NCCL_PATH", rank != missing ? nc : "/nonexistent/libnccl.so.2", 1);
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) return 4;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = 2;
    strcpy(env.master_addr, "127.0.0.1"); env.master_port = port;
    snprintf(env.run_id, sizeof env.run_id, "missing-nccl");
    capex_nccl_desc_init(&nd);
    nd.ctx = ctx;
    /* missing 1: rank 0 must time out in the exchange (rank 1 never joins);
       missing 0: rank 1 fails on rank 0's zero id, its deadline a hang guard */
    nd.init_timeout_s = missing == 1 ? 2.0 : CT_HANG_GUARD_S;
    r = capex_comm_init_nccl(&c, &env, &nd);
    fprintf(stderr, "rank %d: %s: %s\n", rank, capex_result_string(r), r ? capex_last_error() : "");
    capex_cuda_context_destroy(ctx);
    if (rank == missing) return r == CAPEX_ERR_NO_NCCL && c.vt == NULL ? 0 : 2;
    if (r == CAPEX_OK) { capex_comm_destroy(&c); return 3; }
    entered = strstr(capex_last_error(), "ncclCommInitRank") != NULL || c.vt != NULL;
    if (missing == 0) return !entered && r == CAPEX_ERR_COMM && strstr(capex_last_error(), "rank 0 could not") ? 0 : 1;
    return entered ? 1 : 0;
}
static void child_missing_nccl_rank(const char *arg, child_result *res) {
    char cu[1200], nc[1200];
    int port = free_port(), codes[2], i, missing = arg ? atoi(arg) : 1;
    pid_t pids[2];
    FAIL_IF(!fake_path("libcuda.so.1", cu, sizeof cu) || !fake_path("libnccl.so.2", nc, sizeof nc), "stand-ins not built");
    setenv("FAKE_NCCL_TIMEOUT", "8", 1);
    fflush(stdout);
    fflush(stderr);
    for (i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(missing_rank(i, missing, port, cu, nc));
    }
    for (i = 0; i < 2; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    FAIL_IF(codes[missing] != 0, "rank %d (no NCCL): code %d (its stderr says why)", missing, codes[missing]);
    FAIL_IF(codes[1 - missing] != 0, "rank %d: code %d (1: it waited in ncclCommInitRank for a rank that had failed, or "
            "did not fail at once)", 1 - missing, codes[1 - missing]);
    set_result(res, CAPEX_OK, 1);
}

/* capex_nccl_desc.rendezvous_port: the unique id goes over that port, not
   MASTER_PORT's rule. MASTER_PORT is held by a socket that listens and never
   answers (as torchrun's store would hold it), so an ignored option fails
   rank 0's bind; the two ranks must build the comm and pass a barrier.
   Never run before 2026-11-28. Exit codes: 0 ok, 1 init, 2 barrier, 3 setup. */
static int rdv_port_rank(int rank, int held, int port, const char *cu, const char *nc) {
    capex_cuda_context *ctx = NULL;
    capex_dist_env env;
    capex_nccl_desc nd;
    capex_comm c;
    capex_result r;
    setenv("CAPEX_LIBCUDA_PATH", cu, 1);
    setenv("CAPEX_NCCL_PATH", nc, 1);
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) return 3;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = 2;
    strcpy(env.master_addr, "127.0.0.1"); env.master_port = held;
    snprintf(env.run_id, sizeof env.run_id, "rdv-port");
    capex_nccl_desc_init(&nd);
    nd.ctx = ctx;
    nd.init_timeout_s = CT_HANG_GUARD_S;
    nd.rendezvous_port = port;
    r = capex_comm_init_nccl(&c, &env, &nd);
    if (r != CAPEX_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, capex_result_string(r), capex_last_error());
        capex_cuda_context_destroy(ctx);
        return 1;
    }
    r = capex_comm_barrier(&c);
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    return r == CAPEX_OK ? 0 : 2;
}
static void child_rdv_port(const char *arg, child_result *res) {
    char cu[1200], nc[1200];
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0), held, port, codes[2], i;
    pid_t pids[2];
    (void)arg;
    FAIL_IF(!fake_path("libcuda.so.1", cu, sizeof cu) || !fake_path("libnccl.so.2", nc, sizeof nc), "stand-ins not built");
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FAIL_IF(s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0 ||
            getsockname(s, (struct sockaddr *)&a, &len) != 0, "holding MASTER_PORT");
    held = ntohs(a.sin_port);
    do port = free_port(); while (port == held);
    setenv("FAKE_NCCL_TIMEOUT", "120", 1);
    fflush(stdout);
    fflush(stderr);
    for (i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(rdv_port_rank(i, held, port, cu, nc));
    }
    for (i = 0; i < 2; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    close(s);
    FAIL_IF(codes[0] || codes[1], "rank 0: %d, rank 1: %d (1: init failed, 2: barrier; their stderr says why)", codes[0], codes[1]);
    set_result(res, CAPEX_OK, 1);
}

/* A world of 3 over the TCP rendezvous where rank 2 takes the unique id
   and exits (NVIDIA/nccl#289: its peers would wait in NCCL's init for
   ever). Ranks 0 and 1 must return CAPEX_ERR_TIMEOUT from the non-blocking
   init at init_timeout_s, the half-made comm aborted. The stand-in's own
   wait ends after FAKE_NCCL_TIMEOUT (20 s) with ncclRemoteError, so an init
   without a deadline fails with CAPEX_ERR_COMM instead; alarm() ends a rank
   that hangs (exit 100). Exit codes: 0 as expected, 1 wrong status or
   message, 2 comm not zeroed or not aborted once, 3 setup. */
static int dead_after_exchange_rank(int rank, int port, const char *cu, const char *nc) {
    capex_cuda_context *ctx = NULL;
    capex_dist_env env;
    capex_nccl_desc nd;
    capex_comm c;
    capex_result r;
    alarm(120);
    setenv("CAPEX_LIBCUDA_PATH", cu, 1);
    setenv("CAPEX_NCCL_PATH", nc, 1);
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = 3;
    strcpy(env.master_addr, "127.0.0.1"); env.master_port = port;
    snprintf(env.run_id, sizeof env.run_id, "dead-after-exchange");
    if (rank == 2) { /* takes the id, then dies */
        capex_nccl_unique_id id;
        memset(&id, 0, sizeof id);
        return capex_nccl_exchange_unique_id(&env, NULL, &id, CT_HANG_GUARD_S) == CAPEX_OK ? 0 : 3;
    }
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) return 3;
    capex_nccl_desc_init(&nd);
    nd.ctx = ctx;
    /* the exchange's deadline too: 6 s lets a loaded machine bring all three
       ranks to it; the stand-in's 20 s wait stays well behind */
    nd.init_timeout_s = 6.0;
    r = capex_comm_init_nccl(&c, &env, &nd);
    fprintf(stderr, "rank %d: %s: %s\n", rank, capex_result_string(r), r ? capex_last_error() : "");
    if (r == CAPEX_OK) capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    if (r != CAPEX_ERR_TIMEOUT || !strstr(capex_last_error(), "ncclCommInitRankConfig") ||
        !strstr(capex_last_error(), "init_timeout_s"))
        return 1;
    return c.vt == NULL && fake_counter(C_ABORT) == 1 && fake_counter(C_NB_INIT) == 1 && fake_counter(C_INIT) == 0 ? 0 : 2;
}
static void child_dead_after_exchange(const char *arg, child_result *res) {
    char cu[1200], nc[1200];
    int port = free_port(), codes[3], i;
    pid_t pids[3];
    (void)arg;
    FAIL_IF(!fake_path("libcuda.so.1", cu, sizeof cu) || !fake_path("libnccl.so.2", nc, sizeof nc), "stand-ins not built");
    setenv("FAKE_NCCL_TIMEOUT", "20", 1);
    fflush(stdout);
    fflush(stderr);
    for (i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(dead_after_exchange_rank(i, port, cu, nc));
    }
    for (i = 0; i < 3; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    FAIL_IF(codes[2] != 0, "rank 2 (takes the id, then exits): code %d", codes[2]);
    for (i = 0; i < 2; i++)
        FAIL_IF(codes[i] != 0, "rank %d: code %d (1: not CAPEX_ERR_TIMEOUT from ncclCommInitRankConfig at init_timeout_s, "
                "2: comm not zeroed or not aborted once, 100: hung; its stderr says why)", i, codes[i]);
    set_result(res, CAPEX_OK, 1);
}

static const child_entry children[] = {
    {"no_nccl", child_no_nccl}, {"real_id", child_real_id}, {"fake_collectives", child_fake_collectives},
    {"fake_old_nccl", child_fake_old_nccl}, {"fake_shards", child_fake_shards}, {"fake_ddp", child_fake_ddp}, {"fake_async", child_fake_async_error},
    {"fake_timeout", child_fake_timeout}, {"fake_scratch_async", child_fake_scratch_async},
    {"fake_overlap", child_fake_overlap},
    {"missing_nccl_rank", child_missing_nccl_rank}, {"fake_init_fail", child_fake_init_fail},
    {"real_nccl_fake_driver", child_real_nccl_fake_driver}, {"fake_world", child_fake_world},
    {"dead_after_exchange", child_dead_after_exchange}, {"rdv_port", child_rdv_port}};

/* --------------------------------------------------------------- tests -- */

CT_TEST(missing_nccl_is_a_clean_status) {
    child_result r = run_child("no_nccl", NULL);
    CT_CHECK(r.exited_ok, "child crashed (code %d)", r.code);
    CT_CHECK(r.code == CAPEX_ERR_NO_NCCL, "code %d: %s", r.code, r.message);
    CT_CHECK(strstr(r.message, "/nonexistent/libnccl.so.2") && strstr(r.message, "CAPEX_NCCL_PATH"), "names the path: %s", r.message);
    CT_CHECK(r.value == 1, "capex_cuda_nccl_version says NO_NCCL too");
}

CT_TEST(real_nccl_unique_id_without_gpu) {
    child_result r = run_child("real_id", NULL);
    CT_CHECK(r.exited_ok, "child crashed");
    if (r.code == CAPEX_ERR_NO_NCCL) CT_SKIP("NCCL not installed: %.200s", r.message);
    CT_CHECK(r.code == CAPEX_OK, "ncclGetUniqueId: %s", r.message);
    CT_CHECK(r.value == 1, "the id is not all zeros");
}

static int fakes_built(void) {
    char p[1200];
    return fake_path("libcuda.so.1", p, sizeof p) && fake_path("libnccl.so.2", p, sizeof p);
}
#define NEED_FAKES() do { if (!fakes_built()) CT_SKIP("build/fake/libcuda.so.1 / libnccl.so.2 not built (make builds them)"); } while (0)
#define CHILD_OK(name, arg) do { child_result r_ = run_child(name, arg); \
    CT_CHECK(r_.exited_ok && r_.code == CAPEX_OK, "%s: %s (code %d, line %d)", name, r_.message, r_.code, r_.value); } while (0)

CT_TEST(fake_driver_collectives_all_dtypes) { NEED_FAKES(); CHILD_OK("fake_collectives", NULL); }
CT_TEST(fake_driver_reduce_scatter_allgatherv_vs_float64) { NEED_FAKES(); CHILD_OK("fake_shards", NULL); }
CT_TEST(fake_driver_nccl_before_2_10) { NEED_FAKES(); CHILD_OK("fake_old_nccl", NULL); }
CT_TEST(fake_driver_ddp_device_buckets) { NEED_FAKES(); CHILD_OK("fake_ddp", NULL); }
CT_TEST(fake_driver_async_error_aborts) { NEED_FAKES(); CHILD_OK("fake_async", NULL); CHILD_OK("fake_async", "ddp"); }
CT_TEST(fake_world_collectives_and_ddp) {
    NEED_FAKES();
    CHILD_OK("fake_world", "2");
    CHILD_OK("fake_world", "3");
}
CT_TEST(fake_world_create_refuses_different_models_on_every_rank) {
    NEED_FAKES();
    CHILD_OK("fake_world", "2 models");
    CHILD_OK("fake_world", "3 models");
}
CT_TEST(fake_world_untracked_request_never_queued) { NEED_FAKES(); CHILD_OK("fake_world", "2 reqoom"); }
CT_TEST(fake_world_dead_peer) { NEED_FAKES(); CHILD_OK("fake_world", "3 dead"); }
CT_TEST(fake_world_destroy_after_peer_exit_aborts) { NEED_FAKES(); CHILD_OK("fake_world", "2 exit"); }
CT_TEST(fake_driver_stuck_collective_times_out) { NEED_FAKES(); CHILD_OK("fake_timeout", NULL); }
CT_TEST(fake_driver_ddp_backward_never_waits_for_comm_stream) { NEED_FAKES(); CHILD_OK("fake_overlap", NULL); }
CT_TEST(fake_driver_scratch_growth_async_error_aborts) { NEED_FAKES(); CHILD_OK("fake_scratch_async", NULL); }
CT_TEST(rank_without_nccl_fails_before_the_id_exchange) {
    NEED_FAKES();
    CHILD_OK("missing_nccl_rank", "1");
    CHILD_OK("missing_nccl_rank", "0");
}

CT_TEST(rank_dead_after_the_id_exchange_times_out_the_init) { NEED_FAKES(); CHILD_OK("dead_after_exchange", NULL); }
CT_TEST(fake_world_init_nonblocking_and_blocking) {
    NEED_FAKES();
    CHILD_OK("fake_world", "2 counted");
    CHILD_OK("fake_world", "2 counted old");
}

CT_TEST(fake_driver_init_failure) {
    child_result r;
    int old;
    NEED_FAKES();
    for (old = 0; old < 2; old++) {
        r = run_child("fake_init_fail", old ? "old" : NULL);
        CT_CHECK(r.exited_ok && r.code == CAPEX_ERR_COMM, "code %d: %s", r.code, r.message);
        CT_CHECK(strstr(r.message, old ? "ncclCommInitRank failed" : "ncclCommInitRankConfig") &&
                 strstr(r.message, "bootstrap failed"), "message: %s", r.message);
        CT_CHECK(r.value == 1, "comm left zeroed; the non-blocking comm aborted (old NCCL %d)", old);
    }
}

CT_TEST(real_nccl_refuses_stand_in_driver) {
    child_result r;
    char p[1200];
    if (!fake_path("libcuda.so.1", p, sizeof p)) CT_SKIP("build/fake/libcuda.so.1 not built");
    r = run_child("real_id", NULL);
    if (r.code == CAPEX_ERR_NO_NCCL) CT_SKIP("NCCL not installed");
    r = run_child("real_nccl_fake_driver", NULL);
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_NCCL || r.code == CAPEX_ERR_COMM, "code %d: %s", r.code, r.message);
    CT_CHECK(strstr(r.message, "ncclCommInitRank"), "names the call: %s", r.message); /* ...Config on NCCL >= 2.14 */
    CT_CHECK(r.value == 1, "comm left zeroed");
}

CT_TEST(argument_validation) {
    capex_comm c, single;
    capex_nccl_desc nd;
    capex_dist_env env;
    capex_nccl_unique_id id;
    capex_nccl_desc_init(&nd);
    CT_CHECK(nd.timeout_s == 1800.0 && nd.init_timeout_s == 300.0 && nd.use_nccl_avg == 1 && !nd.ctx, "defaults");
    memset(&env, 0, sizeof env);
    env.world_size = 1;
    CT_CHECK(capex_comm_init_nccl(NULL, &env, &nd) == CAPEX_ERR_INVALID_ARG, "NULL comm");
    CT_CHECK(capex_comm_init_nccl(&c, NULL, &nd) == CAPEX_ERR_INVALID_ARG, "NULL env");
    CT_CHECK(capex_comm_init_nccl(&c, &env, NULL) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    CT_CHECK(capex_comm_init_nccl(&c, &env, &nd) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "ctx"), "no ctx");
    nd.ctx = (capex_cuda_context *)(uintptr_t)1; /* never dereferenced: the checks come first */
    env.rank = 2;
    CT_CHECK(capex_comm_init_nccl(&c, &env, &nd) == CAPEX_ERR_INVALID_ARG, "rank >= world");
    memset(&id, 0, sizeof id);
    CT_CHECK(capex_comm_init_nccl_id(&c, &id, 0, 1, &nd) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "zeros"), "zero id");
    id.bytes[3] = 1;
    CT_CHECK(capex_comm_init_nccl_id(&c, &id, 1, 1, &nd) == CAPEX_ERR_INVALID_ARG, "rank");
    CT_CHECK(capex_comm_init_nccl_id(&c, NULL, 0, 1, &nd) == CAPEX_ERR_INVALID_ARG, "NULL id");
    nd.timeout_s = -1.0;
    CT_CHECK(capex_comm_init_nccl_id(&c, &id, 0, 1, &nd) == CAPEX_ERR_INVALID_ARG, "negative timeout");
    CT_CHECK(c.vt == NULL, "comm zeroed on failure");
    CT_CHECK(capex_nccl_get_unique_id(NULL) == CAPEX_ERR_INVALID_ARG, "NULL id out");
    OK(capex_comm_init_single(&single));
    CT_CHECK(!capex_comm_is_nccl(&single) && !capex_comm_is_nccl(NULL), "is_nccl");
    CT_CHECK(capex_nccl_set_user_stream(&single, NULL) == CAPEX_ERR_INVALID_ARG, "set stream on a host comm");
    CT_CHECK(capex_nccl_exchange_unique_id(NULL, NULL, &id, 1.0) == CAPEX_ERR_INVALID_ARG, "no env, no comm");
    CT_CHECK(capex_nccl_exchange_unique_id(&env, NULL, NULL, 1.0) == CAPEX_ERR_INVALID_ARG, "NULL id");
    single.device_buffers = 1;
    CT_CHECK(capex_nccl_exchange_unique_id(&env, &single, &id, 1.0) == CAPEX_ERR_INVALID_ARG, "device bootstrap");
    single.device_buffers = 0;
    env.rank = 0;
    OK(capex_nccl_exchange_unique_id(&env, &single, &id, 1.0)); /* world 1: nothing to send */
    CT_CHECK(id.bytes[3] == 1, "rank 0 keeps its id");
    env.world_size = 2;
    env.master_addr[0] = '\0';
    CT_CHECK(capex_nccl_exchange_unique_id(&env, NULL, &id, 1.0) == CAPEX_ERR_CONFIG, "no MASTER_ADDR");
    capex_comm_destroy(&single);
}

/* ------------------------------------------- unique id over TCP (forks) -- */


typedef struct xspec { int rank, world; const char *run; double delay, timeout; int zero_id, torchrun; } xspec;

/* exit code: 0 = ok with rank 0's id, 1 = wrong id, else 10 - result */
static int exchange_rank(int port, const xspec *s) {
    capex_dist_env env;
    capex_nccl_unique_id id;
    capex_result r;
    size_t i;
    if (s->delay > 0) capex__sleep_s(s->delay);
    memset(&env, 0, sizeof env);
    env.rank = s->rank; env.world_size = s->world;
    strcpy(env.master_addr, "127.0.0.1"); env.master_port = port;
    snprintf(env.run_id, sizeof env.run_id, "%s", s->run);
    if (s->torchrun) { env.launcher = CAPEX_LAUNCHER_TORCHRUN; setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); }
    memset(&id, 0xee, sizeof id);
    if (s->rank == 0) for (i = 0; i < sizeof id.bytes; i++) id.bytes[i] = s->zero_id ? 0 : (unsigned char)(i * 13 + 5);
    r = capex_nccl_exchange_unique_id(&env, NULL, &id, s->timeout);
    if (r != CAPEX_OK) return 10 - (int)r;
    for (i = 0; i < sizeof id.bytes; i++) if (id.bytes[i] != (unsigned char)(i * 13 + 5)) return 1;
    return 0;
}

static void exchange_run_port(const xspec *s, int n, int *codes, int port) {
    pid_t pids[8];
    int i;
    fflush(stdout);
    for (i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(exchange_rank(port, &s[i]));
    }
    for (i = 0; i < n; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
}
static void exchange_run(const xspec *s, int n, int *codes) { exchange_run_port(s, n, codes, free_port()); }
#define XCODE(res) (10 - (int)(res))

/* torchrun >= 2: its agent's TCPStore listens on MASTER_PORT, so the id goes
   over MASTER_PORT + 1 (TORCHELASTIC_USE_AGENT_STORE=True). Checked for real
   with torchrun --no-python; here a listener plays the agent's store. */
CT_TEST(unique_id_exchange_beside_torchrun_store) {
    int codes[8], i, port = 0, fd;
    struct sockaddr_in a;
    xspec s[3];
    for (i = 0; i < 20 && !port; i++) {
        int p = free_port(), q;
        if (p <= 0 || p >= 65535) continue;
        fd = socket(AF_INET, SOCK_STREAM, 0);
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(0x7f000001u);
        a.sin_port = htons((uint16_t)p);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0) {
            /* the port above must be free for capex */
            q = socket(AF_INET, SOCK_STREAM, 0);
            a.sin_port = htons((uint16_t)(p + 1));
            if (q >= 0 && bind(q, (struct sockaddr *)&a, sizeof a) == 0) port = p;
            if (q >= 0) close(q);
        }
        if (!port) close(fd);
    }
    if (!port) CT_SKIP("no two adjacent free ports on loopback");
    for (i = 0; i < 3; i++) { s[i].rank = i; s[i].world = 3; s[i].run = "tr-1"; s[i].delay = 0; s[i].timeout = 5; s[i].zero_id = 0; s[i].torchrun = 1; }
    exchange_run_port(s, 3, codes, port);
    close(fd);
    for (i = 0; i < 3; i++) CT_CHECK(codes[i] == 0, "rank %d: code %d", i, codes[i]);
}

CT_TEST(unique_id_exchange_tcp) {
    int codes[8], i;
    xspec s[4];
    /* 4 ranks, rank 2 late, rank 0 later still */
    for (i = 0; i < 4; i++) { s[i].rank = i; s[i].world = 4; s[i].run = "job-1"; s[i].delay = 0; s[i].timeout = 5; s[i].zero_id = 0; s[i].torchrun = 0; }
    s[2].delay = 0.3; s[0].delay = 0.5;
    exchange_run(s, 4, codes);
    for (i = 0; i < 4; i++) CT_CHECK(codes[i] == 0, "rank %d: code %d", i, codes[i]);
}

CT_TEST(unique_id_exchange_foreign_nonce) {
    int codes[8], i;
    xspec s[3];
    for (i = 0; i < 3; i++) { s[i].world = 2; s[i].run = "job-2"; s[i].delay = 0; s[i].timeout = 5; s[i].zero_id = 0; s[i].torchrun = 0; }
    s[0].rank = 0; s[0].delay = 0.2;
    s[1].rank = 1; s[1].run = "stale-job"; s[1].timeout = 1.5; /* an old job's rank 1 knocks first */
    s[2].rank = 1; s[2].delay = 0.4;
    exchange_run(s, 3, codes);
    CT_CHECK(codes[0] == 0 && codes[2] == 0, "this run's ranks succeed: %d %d", codes[0], codes[2]);
    CT_CHECK(codes[1] == XCODE(CAPEX_ERR_COMM) || codes[1] == XCODE(CAPEX_ERR_TIMEOUT), "intruder refused: %d", codes[1]);
}

CT_TEST(unique_id_exchange_missing_rank) {
    int codes[8], i;
    xspec s[2];
    for (i = 0; i < 2; i++) { s[i].rank = i; s[i].world = 3; s[i].run = "job-3"; s[i].delay = 0; s[i].timeout = 0.5; s[i].zero_id = 0; s[i].torchrun = 0; }
    exchange_run(s, 2, codes); /* rank 2 never comes */
    CT_CHECK(codes[0] == XCODE(CAPEX_ERR_TIMEOUT), "rank 0 times out: %d", codes[0]);
    CT_CHECK(codes[1] == XCODE(CAPEX_ERR_TIMEOUT) || codes[1] == XCODE(CAPEX_ERR_COMM), "rank 1 fails: %d", codes[1]);
}

CT_TEST(unique_id_exchange_rank0_failed) {
    int codes[8], i;
    xspec s[3];
    for (i = 0; i < 3; i++) { s[i].rank = i; s[i].world = 3; s[i].run = "job-4"; s[i].delay = 0; s[i].timeout = 5; s[i].zero_id = i == 0; s[i].torchrun = 0; }
    exchange_run(s, 3, codes);
    CT_CHECK(codes[0] == 1, "rank 0 sent zeros (its own check: %d)", codes[0]);
    CT_CHECK(codes[1] == XCODE(CAPEX_ERR_COMM) && codes[2] == XCODE(CAPEX_ERR_COMM), "peers fail at once: %d %d", codes[1], codes[2]);
}

/* ------------------------------------------------- f64 / i64 on host -- */

static int wide_checks(capex_comm *c) {
    double d[3], da[3];
    int64_t q[3], g[9];
    int r = c->rank, w = c->world_size, k;
    d[0] = 0.1 * (r + 1); d[1] = 1e300; d[2] = -(double)r;
    q[0] = ((int64_t)1 << 60) + r; q[1] = -r; q[2] = (int64_t)1 << 53;
    if (capex_comm_allreduce(c, d, da, 3, CAPEX_F64, CAPEX_REDUCE_SUM)) return 1;
    {   /* rank-order sum in f64, like the backends */
        double s = 0.0;
        for (k = 0; k < w; k++) s += 0.1 * (k + 1);
        if (da[0] != s || da[1] != 1e300 * w || da[2] != -(double)(w * (w - 1) / 2)) return 2;
    }
    if (capex_comm_allreduce(c, d, d, 3, CAPEX_F64, CAPEX_REDUCE_AVG)) return 3;
    if (d[1] != 1e300 * w / w) return 4;
    if (capex_comm_allreduce(c, q, q, 3, CAPEX_I64, CAPEX_REDUCE_SUM)) return 5;
    /* exact beyond 2^53: f64 or f32 staging would round these */
    if (q[0] != ((int64_t)1 << 60) * w + w * (w - 1) / 2 || q[1] != -(int64_t)(w * (w - 1) / 2) || q[2] != ((int64_t)1 << 53) * w) return 6;
    q[0] = 1000 + r;
    if (capex_comm_allgather(c, q, g, 1, CAPEX_I64)) return 7;
    for (k = 0; k < w; k++) if (g[k] != 1000 + k) return 8;
    d[0] = r == 0 ? 0.3 : -1.0;
    if (capex_comm_broadcast(c, d, 1, CAPEX_F64, 0) || d[0] != 0.3) return 9;
    if (capex_comm_allreduce(c, q, q, 1, CAPEX_I64, CAPEX_REDUCE_AVG) != CAPEX_ERR_INVALID_ARG) return 10;
    if (capex_comm_allreduce(c, q, q, 1, (capex_dtype)5, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG) return 11;
    return 0;
}

CT_TEST(wide_dtypes_single_backend) {
    capex_comm c;
    int e;
    OK(capex_comm_init_single(&c));
    e = wide_checks(&c);
    CT_CHECK(e == 0, "check %d: %s", e, capex_last_error());
    CT_CHECK(capex_comm_dtype_size(CAPEX_F64) == 8 && capex_comm_dtype_size(CAPEX_I64) == 8 &&
             capex_comm_dtype_size(CAPEX_BF16) == 2 && capex_comm_dtype_size((capex_dtype)5) == 0, "sizes");
    capex_comm_destroy(&c);
}

CT_TEST(wide_dtypes_tcp_backend) {
    int port = free_port(), i, codes[2], e;
    pid_t pids[2];
    capex_dist_env env;
    capex_comm c;
    fflush(stdout);
    for (i = 1; i <= 2; i++) {
        pids[i - 1] = fork();
        if (pids[i - 1] == 0) {
            capex_dist_env ev;
            capex_comm cc;
            memset(&ev, 0, sizeof ev);
            ev.rank = i; ev.world_size = 3; strcpy(ev.master_addr, "127.0.0.1"); ev.master_port = port;
            strcpy(ev.run_id, "wide");
            if (capex_comm_init_tcp(&cc, &ev, CT_HANG_GUARD_S)) _exit(50);
            cc.timeout_s = CT_HANG_GUARD_S;
            e = wide_checks(&cc);
            capex_comm_destroy(&cc);
            _exit(e);
        }
    }
    memset(&env, 0, sizeof env);
    env.rank = 0; env.world_size = 3; strcpy(env.master_addr, "127.0.0.1"); env.master_port = port;
    strcpy(env.run_id, "wide");
    e = capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) ? 50 : 0;
    if (!e) { c.timeout_s = CT_HANG_GUARD_S; e = wide_checks(&c); capex_comm_destroy(&c); }
    for (i = 0; i < 2; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    CT_CHECK(e == 0 && codes[0] == 0 && codes[1] == 0, "checks: rank 0 %d, rank 1 %d, rank 2 %d (%s)", e, codes[0], codes[1],
             capex_last_error());
}

CT_TEST(init_nccl_rendezvous_port) {
    child_result r;
    NEED_FAKES();
    r = run_child("rdv_port", NULL);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK, "%s", r.message);
}

static const ct_case cases[] = {
    CT_CASE(missing_nccl_is_a_clean_status), CT_CASE(real_nccl_unique_id_without_gpu),
    CT_CASE(fake_driver_collectives_all_dtypes), CT_CASE(fake_driver_reduce_scatter_allgatherv_vs_float64),
    CT_CASE(fake_driver_nccl_before_2_10),
    CT_CASE(fake_driver_ddp_device_buckets), CT_CASE(fake_driver_async_error_aborts),
    CT_CASE(fake_world_collectives_and_ddp), CT_CASE(fake_world_create_refuses_different_models_on_every_rank),
    CT_CASE(fake_world_untracked_request_never_queued), CT_CASE(fake_world_dead_peer), CT_CASE(fake_world_destroy_after_peer_exit_aborts),
    CT_CASE(fake_driver_stuck_collective_times_out), CT_CASE(fake_driver_scratch_growth_async_error_aborts),
    CT_CASE(fake_driver_ddp_backward_never_waits_for_comm_stream),
    CT_CASE(rank_without_nccl_fails_before_the_id_exchange), CT_CASE(rank_dead_after_the_id_exchange_times_out_the_init),
    CT_CASE(fake_world_init_nonblocking_and_blocking),
    CT_CASE(fake_driver_init_failure),
    CT_CASE(real_nccl_refuses_stand_in_driver), CT_CASE(argument_validation), CT_CASE(unique_id_exchange_tcp),
    CT_CASE(unique_id_exchange_foreign_nonce), CT_CASE(unique_id_exchange_missing_rank),
    CT_CASE(unique_id_exchange_rank0_failed), CT_CASE(unique_id_exchange_beside_torchrun_store), CT_CASE(wide_dtypes_single_backend), CT_CASE(wide_dtypes_tcp_backend),
    CT_CASE(init_nccl_rendezvous_port)};

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
