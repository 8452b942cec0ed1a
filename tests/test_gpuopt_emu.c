/* The fused GPU kernels' own source (exactly the text NVRTC compiles, from
   tests/gpuopt_gen.c) compiled as host C++ with a small CUDA shim and run on
   CPU threads: each block's threads are real pthreads (a persistent pool),
   __syncthreads is a barrier, __shared__ is one static array per kernel (one
   block runs at a time), blockDim is 16. The host side is capex_cuda.h's own
   (planner, packing, launch sequence, device state) with an exec whose
   "device memory" is host memory. Checked against capex.h's CPU backend:
   bit-exact for unscale, Adam/AdamW, SGD, the scaler; close for norms, clip
   and LAMB (another summation order). Also: a whole AMP step enqueues no
   copy, allocation or read-back (no host synchronisation).
   What this cannot check: real GPU memory ordering, warp scheduling,
   NVRTC code generation (tests/test_cuda_jit.c compiles the same text for
   every arch; tests/test_gpuopt_gpu.c runs it on a GPU). Built as C++17 by
   tests/gpuopt.mk. */
#ifndef __cplusplus
#error "tests/test_gpuopt_emu.c is C++ (built by tests/gpuopt.mk)"
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include <pthread.h>
#include <math.h>
#include <stddef.h>

/* ---- the CUDA shim ---- */
namespace capex_emu {
struct dim3_ { unsigned x, y, z; };
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ blockDim, gridDim;
static pthread_barrier_t sync_bar;
static inline void __syncthreads() { pthread_barrier_wait(&sync_bar); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define CAPEX_GK static
#include "go_kernels.inc"
#undef __shared__
} // namespace capex_emu

/* ---- a pool of EMU_THREADS workers = the threads of one block ---- */
#ifndef EMU_THREADS
#define EMU_THREADS 16 /* any power of two <= 512 (16: fewest barrier wake-ups on a small CI machine); -DEMU_THREADS=512 mirrors the GPU launches */
#endif
typedef void (*emu_thunk)(void *);
static struct {
    pthread_t th[EMU_THREADS];
    pthread_barrier_t start, end;
    emu_thunk fn;
    void *arg;
    unsigned bx;
    int quit, started;
} pool;

static void *emu_worker(void *p) {
    unsigned id = (unsigned)(size_t)p;
    capex_emu::threadIdx.x = id;
    capex_emu::threadIdx.y = capex_emu::threadIdx.z = 0;
    for (;;) {
        pthread_barrier_wait(&pool.start);
        if (pool.quit) break;
        capex_emu::blockIdx.x = pool.bx;
        capex_emu::blockIdx.y = capex_emu::blockIdx.z = 0;
        pool.fn(pool.arg);
        pthread_barrier_wait(&pool.end);
    }
    return NULL;
}
static void emu_start(void) {
    if (pool.started) return;
    pthread_barrier_init(&pool.start, NULL, EMU_THREADS + 1);
    pthread_barrier_init(&pool.end, NULL, EMU_THREADS + 1);
    pthread_barrier_init(&capex_emu::sync_bar, NULL, EMU_THREADS);
    for (size_t i = 0; i < EMU_THREADS; i++) pthread_create(&pool.th[i], NULL, emu_worker, (void *)i);
    pool.started = 1;
}
static void emu_stop(void) {
    if (!pool.started) return;
    pool.quit = 1;
    pthread_barrier_wait(&pool.start);
    for (size_t i = 0; i < EMU_THREADS; i++) pthread_join(pool.th[i], NULL);
    pool.started = 0;
}
/* Runs every block of the grid, one after the other. */
static void emu_grid(emu_thunk fn, void *arg, unsigned grid) {
    emu_start();
    capex_emu::blockDim.x = EMU_THREADS;
    capex_emu::blockDim.y = capex_emu::blockDim.z = 1;
    capex_emu::gridDim.x = grid;
    capex_emu::gridDim.y = capex_emu::gridDim.z = 1;
    pool.fn = fn;
    pool.arg = arg;
    for (unsigned b = 0; b < grid; b++) {
        pool.bx = b;
        pthread_barrier_wait(&pool.start);
        pthread_barrier_wait(&pool.end);
    }
}

/* Thunks: unpack cuLaunchKernel-style args (pointers to each parameter). */
template <int D> struct emu_mta_call {
    void (*k)(capex_emu::capex_go_meta<D>, capex_emu::capex_go_args);
    void **args;
};
template <int D> static void emu_mta_thunk(void *p) {
    emu_mta_call<D> *c = (emu_mta_call<D> *)p;
    c->k(*(const capex_emu::capex_go_meta<D> *)c->args[0], *(const capex_emu::capex_go_args *)c->args[1]);
}
template <int D> static void emu_mta(void (*k)(capex_emu::capex_go_meta<D>, capex_emu::capex_go_args), void **args,
                                     unsigned grid) {
    emu_mta_call<D> c = {k, args};
    emu_grid(emu_mta_thunk<D>, &c, grid);
}
struct emu_small_call { void (*k)(capex_emu::capex_go_args); void **args; };
static void emu_small_thunk(void *p) {
    emu_small_call *c = (emu_small_call *)p;
    c->k(*(const capex_emu::capex_go_args *)c->args[0]);
}
static void emu_reduce_thunk(void *p) {
    void **args = (void **)p;
    capex_emu::capex_go_reduce(*(const capex_emu::capex_go_segs *)args[0], *(const capex_emu::capex_go_args *)args[1]);
}

/* ---- the exec: host memory as device memory; counts what a step must not do ---- */
static struct { int launches, copies; } stats;

static capex_result emu_launch(void *user, int k, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    using namespace capex_emu;
    static void (*const scale[9])(capex_go_meta<2>, capex_go_args) = {
        capex_go_scale_f32_f32, capex_go_scale_f32_f16, capex_go_scale_f32_bf16, capex_go_scale_f16_f32, capex_go_scale_f16_f16,
        capex_go_scale_f16_bf16, capex_go_scale_bf16_f32, capex_go_scale_bf16_f16, capex_go_scale_bf16_bf16};
    static void (*const sumsq[3])(capex_go_meta<1>, capex_go_args) = {capex_go_sumsq_f32, capex_go_sumsq_f16, capex_go_sumsq_bf16};
    static void (*const adam[3])(capex_go_meta<6>, capex_go_args) = {capex_go_adam_f32, capex_go_adam_f16, capex_go_adam_bf16};
    static void (*const sgd[3])(capex_go_meta<5>, capex_go_args) = {capex_go_sgd_f32, capex_go_sgd_f16, capex_go_sgd_bf16};
    static void (*const lamb1[3])(capex_go_meta<5>, capex_go_args) = {capex_go_lamb1_f32, capex_go_lamb1_f16, capex_go_lamb1_bf16};
    static void (*const novo1[3])(capex_go_meta<2>, capex_go_args) = {capex_go_novo1_f32, capex_go_novo1_f16, capex_go_novo1_bf16};
    static void (*const novo2[3])(capex_go_meta<5>, capex_go_args) = {capex_go_novo2_f32, capex_go_novo2_f16, capex_go_novo2_bf16};
    static void (*const ams[3])(capex_go_meta<6>, capex_go_args) = {capex_go_adam_ams_f32, capex_go_adam_ams_f16, capex_go_adam_ams_bf16};
    static void (*const adagrad[3])(capex_go_meta<5>, capex_go_args) = {capex_go_adagrad_f32, capex_go_adagrad_f16, capex_go_adagrad_bf16};
    (void)user; (void)s;
    stats.launches++;
    if (grid == 0 || block == 0 || block > 1024 || (block & (block - 1)))
        return capex__fail(CAPEX_ERR_INTERNAL, "emu: bad launch shape grid %u block %u", grid, block);
    if (k >= CAPEX__GO_K_SCALE && k < CAPEX__GO_K_SUMSQ) emu_mta<2>(scale[k - CAPEX__GO_K_SCALE], args, grid);
    else if (k < CAPEX__GO_K_REDUCE) emu_mta<1>(sumsq[k - CAPEX__GO_K_SUMSQ], args, grid);
    else if (k == CAPEX__GO_K_REDUCE) emu_grid(emu_reduce_thunk, args, grid);
    else if (k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_SGD) emu_mta<6>(adam[k - CAPEX__GO_K_ADAM], args, grid);
    else if (k >= CAPEX__GO_K_SGD && k < CAPEX__GO_K_LAMB1) emu_mta<5>(sgd[k - CAPEX__GO_K_SGD], args, grid);
    else if (k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB_CLIP) emu_mta<5>(lamb1[k - CAPEX__GO_K_LAMB1], args, grid);
    else if (k == CAPEX__GO_K_LAMB2) emu_mta<5>(capex_go_lamb2, args, grid);
    else if (k >= CAPEX__GO_K_NOVO1 && k < CAPEX__GO_K_NOVO2) emu_mta<2>(novo1[k - CAPEX__GO_K_NOVO1], args, grid);
    else if (k >= CAPEX__GO_K_NOVO2 && k < CAPEX__GO_K_NOVO_NORM) emu_mta<5>(novo2[k - CAPEX__GO_K_NOVO2], args, grid);
    else if (k >= CAPEX__GO_K_ADAM_AMS && k < CAPEX__GO_K_ADAGRAD) emu_mta<6>(ams[k - CAPEX__GO_K_ADAM_AMS], args, grid);
    else if (k >= CAPEX__GO_K_ADAGRAD && k < CAPEX__GO_K_ADAGRAD + 3) emu_mta<5>(adagrad[k - CAPEX__GO_K_ADAGRAD], args, grid);
    else {
        emu_small_call c;
        c.args = args;
        switch (k) {
        case CAPEX__GO_K_CLIP: c.k = capex_go_clip_coef; break;
        case CAPEX__GO_K_PREPARE: c.k = capex_go_prepare; break;
        case CAPEX__GO_K_LAMB_CLIP: c.k = capex_go_lamb_clip; break;
        case CAPEX__GO_K_LAMB_RATIO: c.k = capex_go_lamb_ratio; break;
        case CAPEX__GO_K_SCALER: c.k = capex_go_scaler_update; break;
        case CAPEX__GO_K_NOVO_NORM: c.k = capex_go_novo_norm; break;
        case CAPEX__GO_K_ZERO_NORM: c.k = capex_go_zero_norm; break;
        default: return capex__fail(CAPEX_ERR_INTERNAL, "emu: unknown kernel %d", k);
        }
        emu_grid(emu_small_thunk, &c, grid);
    }
    return CAPEX_OK;
}
static capex_result emu_alloc(void *user, size_t bytes, capex_cuda_ptr *out) {
    void *p = NULL;
    (void)user;
    stats.copies++;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "emu alloc");
    *out = (capex_cuda_ptr)(uintptr_t)p;
    return CAPEX_OK;
}
static void emu_release(void *user, capex_cuda_ptr p) { (void)user; free((void *)(uintptr_t)p); }
static capex_result emu_htod(void *user, capex_cuda_ptr dst, const void *src, size_t bytes, capex_cuda_stream s) {
    (void)user; (void)s;
    stats.copies++;
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return CAPEX_OK;
}
static capex_result emu_dtoh(void *user, void *dst, capex_cuda_ptr src, size_t bytes, capex_cuda_stream s) {
    (void)user; (void)s;
    stats.copies++;
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CAPEX_OK;
}
static capex_result emu_zero(void *user, capex_cuda_ptr dst, size_t bytes, capex_cuda_stream s) {
    (void)user; (void)s;
    stats.copies++;
    memset((void *)(uintptr_t)dst, 0, bytes);
    return CAPEX_OK;
}

#include "gpuopt_parity.h"

static env emu_env(uint64_t seed) {
    env e;
    memset(&e, 0, sizeof e);
    e.ex.launch = emu_launch;
    e.ex.alloc = emu_alloc;
    e.ex.release = emu_release;
    e.ex.htod = emu_htod;
    e.ex.dtoh = emu_dtoh;
    e.ex.zero = emu_zero;
    e.seed = seed;
    return e;
}

/* ---- the kernel structs are the host mirrors, field for field ---- */
CT_TEST(layouts_match_the_kernels) {
    using namespace capex_emu;
    CT_CHECK(sizeof(capex_go_meta<1>) == CAPEX_MTA_META_SIZE(1) && sizeof(capex_go_meta<2>) == CAPEX_MTA_META_SIZE(2) &&
                 sizeof(capex_go_meta<5>) == CAPEX_MTA_META_SIZE(5) && sizeof(capex_go_meta<6>) == CAPEX_MTA_META_SIZE(6),
             "metadata sizes");
    CT_CHECK(offsetof(capex_go_meta<5>, block_tensor) == offsetof(capex__go_meta5, block_tensor) &&
                 offsetof(capex_go_meta<5>, numel) == offsetof(capex__go_meta5, numel),
             "metadata layout");
    /* every kernel's own fields: the last of each (and the pointers before it) */
#define ARGS_AT(f) (offsetof(capex_go_args, op.f) == offsetof(capex__go_args, op.f))
    CT_CHECK(sizeof(capex_go_args) == sizeof(capex__go_args) && sizeof(capex_go_args) == 64 && ARGS_AT(scale.clip_only) &&
                 ARGS_AT(sumsq.partial) && ARGS_AT(reduce.norm) && ARGS_AT(clip.max_norm) && ARGS_AT(prepare.sched) &&
                 ARGS_AT(prepare.sched_groups) && ARGS_AT(scaler.state) && ARGS_AT(adam.model) &&
                 ARGS_AT(adam_ams.max_bufs) && ARGS_AT(adam_ams.model) && ARGS_AT(adagrad.model) && ARGS_AT(sgd.model) &&
                 ARGS_AT(lamb1.w_mode) && ARGS_AT(lamb_clip.max_grad_norm) && ARGS_AT(lamb_ratio.tgroup) &&
                 ARGS_AT(lamb_ratio.use_nvlamb) && ARGS_AT(lamb2.model) && ARGS_AT(novo1.partial) &&
                 ARGS_AT(novo_norm.init_zero) && ARGS_AT(novo2.model),
             "args");
#undef ARGS_AT
    CT_CHECK(sizeof(capex_go_segs) == sizeof(capex__go_segs) && offsetof(capex_go_segs, n) == offsetof(capex__go_segs, n),
             "segments");
    CT_CHECK(sizeof(capex_go_group) == sizeof(capex__go_group) &&
                 offsetof(capex_go_group, lr) == offsetof(capex__go_group, lr) &&
                 offsetof(capex_go_group, mom_init) == offsetof(capex__go_group, mom_init) &&
                 offsetof(capex_go_group, clip_div) == offsetof(capex__go_group, clip_div) &&
                 offsetof(capex_go_group, step_hi) == offsetof(capex__go_group, step_hi),
             "group");
    CT_CHECK(sizeof(capex_go_scaler) == sizeof(capex__go_scaler) &&
                 offsetof(capex_go_scaler, scale) == offsetof(capex__go_scaler, scale) &&
                 offsetof(capex_go_scaler, found_inf) == offsetof(capex__go_scaler, found_inf) &&
                 offsetof(capex_go_scaler, hysteresis_tracker) == offsetof(capex__go_scaler, hysteresis_tracker),
             "scaler");
}

CT_TEST(emu_scale_every_dtype_pair) { env e = emu_env(1); par_scale(ct, &e); }
CT_TEST(emu_scale_many_tensors) { env e = emu_env(2); par_scale_many(ct, &e); }
CT_TEST(emu_l2norm) { env e = emu_env(3); par_norms(ct, &e); }
CT_TEST(emu_sumsq_order) { env e = emu_env(13); par_sumsq_order(ct, &e, EMU_THREADS); }
CT_TEST(emu_clip) { env e = emu_env(4); par_clip(ct, &e); }
CT_TEST(emu_adam) { env e = emu_env(5); par_adam(ct, &e); }
CT_TEST(emu_sgd) { env e = emu_env(6); par_sgd(ct, &e); }
CT_TEST(emu_lamb) { env e = emu_env(7); par_lamb(ct, &e); }
CT_TEST(emu_scaler) { env e = emu_env(8); par_scaler(ct, &e); }
static int emu_count(env *e) { (void)e; return stats.copies; }
CT_TEST(emu_amp_loop_no_host_sync) { env e = emu_env(9); par_amp_loop(ct, &e, emu_count); }
CT_TEST(emu_checkpoint_roundtrip) { env e = emu_env(10); par_checkpoint(ct, &e); }
CT_TEST(emu_novograd) { env e = emu_env(11); par_novograd(ct, &e); }
CT_TEST(emu_lr_schedule) { env e = emu_env(12); par_schedule(ct, &e, 1); }
CT_TEST(emu_adagrad) { env e = emu_env(13); par_adagrad(ct, &e); }
CT_TEST(emu_adam_amsgrad) { env e = emu_env(14); par_adam_amsgrad(ct, &e); }
CT_TEST(emu_pure_half) { env e = emu_env(15); par_pure_half_steps(ct, &e); }

static const ct_case cases[] = {
    CT_CASE(layouts_match_the_kernels), CT_CASE(emu_scale_every_dtype_pair), CT_CASE(emu_scale_many_tensors),
    CT_CASE(emu_l2norm), CT_CASE(emu_sumsq_order), CT_CASE(emu_clip), CT_CASE(emu_adam), CT_CASE(emu_pure_half), CT_CASE(emu_sgd), CT_CASE(emu_lamb), CT_CASE(emu_scaler),
    CT_CASE(emu_amp_loop_no_host_sync), CT_CASE(emu_checkpoint_roundtrip), CT_CASE(emu_novograd),
    CT_CASE(emu_lr_schedule),
    CT_CASE(emu_adagrad), CT_CASE(emu_adam_amsgrad),
};

int main(int argc, char **argv) {
    int r = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    emu_stop();
    return r;
}
