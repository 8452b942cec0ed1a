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
namespace capex_emu_shim {
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
} // namespace capex_emu_shim
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define CAPEX_GK static
#define __launch_bounds__(...)
/* the kernels twice: with the 4 KB metadata (the default) and with the large
   one (what the host compiles with -DCAPEX_GO_META=... where the driver takes
   32764 bytes of parameters) */
namespace capex_emu {
using namespace capex_emu_shim;
#include "go_kernels.inc"
} // namespace capex_emu
#undef CAPEX_GO_META
#define CAPEX_GO_META CAPEX__GO_META_LARGE
namespace capex_emu_big {
using namespace capex_emu_shim;
#include "go_kernels.inc"
} // namespace capex_emu_big
#undef __shared__

/* The variants (capex__cuda_kernel_unit): each kernel's template instance
   with its switches fixed, as NVRTC compiles them under -DCAPEX_V_*; the
   "variants" mode below runs them in place of the generic kernels. */
namespace capex_emu {
template <int G, int W, int MK> static void adam_v(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_adam<G, W, MK>(m, a, c);
}
template <int G, int W, int MK> static void ams_v(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_adam_ams<G, W, MK>(m, a, c);
}
template <int G, int W, int MK> static void adagrad_v(capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_adagrad<G, W, MK>(m, a, c);
}
template <int G, int MO, int MK> static void sgd_v(capex_go_meta<CAPEX_GO_SGD_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_sgd<G, MO, MK>(m, a, c);
}
template <int G, int W, int MK> static void novo2_v(capex_go_meta<CAPEX_GO_NOVO2_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_novo2<G, W, MK>(m, a, c);
}
template <int G, int W> static void lamb1_v(capex_go_meta<CAPEX_GO_LAMB1_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_lamb1<G, W>(m, a, c);
}
template <int W, int MK> static void lamb2_v(capex_go_meta<CAPEX_GO_LAMB2_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_lamb2c<W, MK>(m, a, c);
}
template <int I, int O, int WR, int CL> static void scale_v(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) {
    CAPEX_GO_CHUNKS(m) capex_go_scale<I, O, WR, CL>(m, a, c);
}
#define EMU_A4(F, G, W) F<G, W, 0>, F<G, W, 1>, F<G, W, 2>, F<G, W, 3>
#define EMU_A24(F) {{{EMU_A4(F, 0, 0)}, {EMU_A4(F, 0, 1)}}, {{EMU_A4(F, 1, 0)}, {EMU_A4(F, 1, 1)}}, {{EMU_A4(F, 2, 0)}, {EMU_A4(F, 2, 1)}}}
static void (*const adam_var[3][2][4])(capex_go_meta<CAPEX_GO_ADAM_DEPTH>, capex_go_args) = EMU_A24(adam_v);
static void (*const ams_var[3][2][4])(capex_go_meta<CAPEX_GO_ADAM_DEPTH>, capex_go_args) = EMU_A24(ams_v);
static void (*const adagrad_var[3][2][4])(capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH>, capex_go_args) = EMU_A24(adagrad_v);
static void (*const sgd_var[3][2][4])(capex_go_meta<CAPEX_GO_SGD_DEPTH>, capex_go_args) = EMU_A24(sgd_v); /* [dtype][momentum on][model] */
static void (*const novo2_var[3][2][4])(capex_go_meta<CAPEX_GO_NOVO2_DEPTH>, capex_go_args) = EMU_A24(novo2_v); /* [dtype][reg][model] */
static void (*const lamb2_var[2][4])(capex_go_meta<CAPEX_GO_LAMB2_DEPTH>, capex_go_args) = {
    {lamb2_v<0, 0>, lamb2_v<0, 1>, lamb2_v<0, 2>, lamb2_v<0, 3>}, {lamb2_v<1, 0>, lamb2_v<1, 1>, lamb2_v<1, 2>, lamb2_v<1, 3>}};
static void (*const lamb1_var[3][2])(capex_go_meta<CAPEX_GO_LAMB1_DEPTH>, capex_go_args) = {
    {lamb1_v<0, 0>, lamb1_v<0, 1>}, {lamb1_v<1, 0>, lamb1_v<1, 1>}, {lamb1_v<2, 0>, lamb1_v<2, 1>}};
/* [write_out fixed to 1][clip_only]: a check-only launch's variant keeps write_out at run time (-1) */
#define EMU_S4(I, O) {{scale_v<I, O, -1, 0>, scale_v<I, O, -1, 1>}, {scale_v<I, O, 1, 0>, scale_v<I, O, 1, 1>}}
static void (*const scale_var[9][2][2])(capex_go_meta<CAPEX_GO_SCALE_DEPTH>, capex_go_args) = {
    EMU_S4(0, 0), EMU_S4(0, 1), EMU_S4(0, 2), EMU_S4(1, 0), EMU_S4(1, 1), EMU_S4(1, 2), EMU_S4(2, 0), EMU_S4(2, 1), EMU_S4(2, 2)};
#undef EMU_A4
#undef EMU_A24
#undef EMU_S4
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
    capex_emu_shim::threadIdx.x = id;
    capex_emu_shim::threadIdx.y = capex_emu_shim::threadIdx.z = 0;
    for (;;) {
        pthread_barrier_wait(&pool.start);
        if (pool.quit) break;
        capex_emu_shim::blockIdx.x = pool.bx;
        capex_emu_shim::blockIdx.y = capex_emu_shim::blockIdx.z = 0;
        pool.fn(pool.arg);
        pthread_barrier_wait(&pool.end);
    }
    return NULL;
}
static void emu_start(void) {
    if (pool.started) return;
    pthread_barrier_init(&pool.start, NULL, EMU_THREADS + 1);
    pthread_barrier_init(&pool.end, NULL, EMU_THREADS + 1);
    pthread_barrier_init(&capex_emu_shim::sync_bar, NULL, EMU_THREADS);
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
    capex_emu_shim::blockDim.x = EMU_THREADS;
    capex_emu_shim::blockDim.y = capex_emu_shim::blockDim.z = 1;
    capex_emu_shim::gridDim.x = grid;
    capex_emu_shim::gridDim.y = capex_emu_shim::gridDim.z = 1;
    pool.fn = fn;
    pool.arg = arg;
    for (unsigned b = 0; b < grid; b++) {
        pool.bx = b;
        pthread_barrier_wait(&pool.start);
        pthread_barrier_wait(&pool.end);
    }
}

/* Thunks: unpack cuLaunchKernel-style args (pointers to each parameter). */
template <class M, class A> struct emu_mta_call {
    void (*k)(M, A);
    void **args;
};
template <class M, class A> static void emu_mta_thunk(void *p) {
    emu_mta_call<M, A> *c = (emu_mta_call<M, A> *)p;
    c->k(*(const M *)c->args[0], *(const A *)c->args[1]);
}
template <class M, class A> static void emu_mta(void (*k)(M, A), void **args, unsigned grid) {
    emu_mta_call<M, A> c = {k, args};
    emu_grid(emu_mta_thunk<M, A>, &c, grid);
}
template <class A> struct emu_small_call { void (*k)(A); void **args; };
template <class A> static void emu_small_thunk(void *p) {
    emu_small_call<A> *c = (emu_small_call<A> *)p;
    c->k(*(const A *)c->args[0]);
}
template <class S, class A> struct emu_reduce_call { void (*k)(S, A); void **args; };
template <class S, class A> static void emu_reduce_thunk(void *p) {
    emu_reduce_call<S, A> *c = (emu_reduce_call<S, A> *)p;
    c->k(*(const S *)c->args[0], *(const A *)c->args[1]);
}

/* ---- the exec: host memory as device memory; counts what a step must not do ---- */
static struct { int launches, copies; unsigned max_grid; } stats;
/* where the exec's kernels run: ex.user points to one (NULL: small, default grid) */
typedef struct emu_mode { int large; unsigned grid; int variants; } emu_mode;
/* launches each variant ran (the variants mode); NovoGrad: pass 2's launches
   per variant, and per step (pass 1's launches, then pass 2's) the variants
   each pass loaded: every one pass 1 loads must be one pass 2 loads too (one
   compile for both); steps seen, and those where it was not */
static int var_runs[CAPEX__CUDA_N_VARIANTS], novo2_runs[24], novo_in1[24], novo_in2[24], novo_steps, novo_steps_bad;
static void novo_step_end(void) {
    int v, bad = 0, any = 0;
    for (v = 0; v < 24; v++) { any |= novo_in1[v]; bad |= novo_in1[v] && !novo_in2[v]; }
    novo_steps += any;
    novo_steps_bad += bad;
    memset(novo_in1, 0, sizeof novo_in1);
    memset(novo_in2, 0, sizeof novo_in2);
}

/* kernel k of one namespace's set (capex_emu or capex_emu_big) */
#define EMU_DISPATCH(NS)                                                                                                  \
    static capex_result emu_launch_##NS(int k, unsigned grid, void **args) {                                             \
        using namespace NS;                                                                                               \
        static void (*const scale[9])(capex_go_meta<2>, capex_go_args) = {                                                \
            capex_go_scale_f32_f32, capex_go_scale_f32_f16, capex_go_scale_f32_bf16, capex_go_scale_f16_f32,              \
            capex_go_scale_f16_f16, capex_go_scale_f16_bf16, capex_go_scale_bf16_f32, capex_go_scale_bf16_f16,            \
            capex_go_scale_bf16_bf16};                                                                                    \
        static void (*const sumsq[3])(capex_go_meta<1>, capex_go_args) = {capex_go_sumsq_f32, capex_go_sumsq_f16, capex_go_sumsq_bf16}; \
        static void (*const adam[3])(capex_go_meta<6>, capex_go_args) = {capex_go_adam_f32, capex_go_adam_f16, capex_go_adam_bf16}; \
        static void (*const sgd[3])(capex_go_meta<5>, capex_go_args) = {capex_go_sgd_f32, capex_go_sgd_f16, capex_go_sgd_bf16}; \
        static void (*const lamb1[3])(capex_go_meta<5>, capex_go_args) = {capex_go_lamb1_f32, capex_go_lamb1_f16, capex_go_lamb1_bf16}; \
        static void (*const novo1[3])(capex_go_meta<2>, capex_go_args) = {capex_go_novo1_f32, capex_go_novo1_f16, capex_go_novo1_bf16}; \
        static void (*const novo2[3])(capex_go_meta<5>, capex_go_args) = {capex_go_novo2_f32, capex_go_novo2_f16, capex_go_novo2_bf16}; \
        static void (*const ams[3])(capex_go_meta<6>, capex_go_args) = {capex_go_adam_ams_f32, capex_go_adam_ams_f16, capex_go_adam_ams_bf16}; \
        static void (*const adagrad[3])(capex_go_meta<5>, capex_go_args) = {capex_go_adagrad_f32, capex_go_adagrad_f16, capex_go_adagrad_bf16}; \
        if (k >= CAPEX__GO_K_SCALE && k < CAPEX__GO_K_SUMSQ) emu_mta(scale[k - CAPEX__GO_K_SCALE], args, grid);          \
        else if (k < CAPEX__GO_K_REDUCE) emu_mta(sumsq[k - CAPEX__GO_K_SUMSQ], args, grid);                              \
        else if (k == CAPEX__GO_K_REDUCE) {                                                                               \
            emu_reduce_call<capex_go_segs, capex_go_args> c = {capex_go_reduce, args};                                    \
            emu_grid(emu_reduce_thunk<capex_go_segs, capex_go_args>, &c, grid);                                           \
        } else if (k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_SGD) emu_mta(adam[k - CAPEX__GO_K_ADAM], args, grid);         \
        else if (k >= CAPEX__GO_K_SGD && k < CAPEX__GO_K_LAMB1) emu_mta(sgd[k - CAPEX__GO_K_SGD], args, grid);            \
        else if (k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB_CLIP) emu_mta(lamb1[k - CAPEX__GO_K_LAMB1], args, grid);  \
        else if (k == CAPEX__GO_K_LAMB2) emu_mta(capex_go_lamb2, args, grid);                                            \
        else if (k >= CAPEX__GO_K_NOVO1 && k < CAPEX__GO_K_NOVO2) emu_mta(novo1[k - CAPEX__GO_K_NOVO1], args, grid);      \
        else if (k >= CAPEX__GO_K_NOVO2 && k < CAPEX__GO_K_NOVO_NORM) emu_mta(novo2[k - CAPEX__GO_K_NOVO2], args, grid);  \
        else if (k >= CAPEX__GO_K_ADAM_AMS && k < CAPEX__GO_K_ADAGRAD) emu_mta(ams[k - CAPEX__GO_K_ADAM_AMS], args, grid); \
        else if (k >= CAPEX__GO_K_ADAGRAD && k < CAPEX__GO_K_ADAGRAD + 3) emu_mta(adagrad[k - CAPEX__GO_K_ADAGRAD], args, grid); \
        else {                                                                                                            \
            emu_small_call<capex_go_args> c;                                                                              \
            c.args = args;                                                                                                \
            switch (k) {                                                                                                  \
            case CAPEX__GO_K_CLIP: c.k = capex_go_clip_coef; break;                                                       \
            case CAPEX__GO_K_PREPARE: c.k = capex_go_prepare; break;                                                      \
            case CAPEX__GO_K_LAMB_CLIP: c.k = capex_go_lamb_clip; break;                                                  \
            case CAPEX__GO_K_LAMB_RATIO: c.k = capex_go_lamb_ratio; break;                                                \
            case CAPEX__GO_K_SCALER: c.k = capex_go_scaler_update; break;                                                 \
            case CAPEX__GO_K_NOVO_NORM: c.k = capex_go_novo_norm; break;                                                  \
            case CAPEX__GO_K_ZERO_NORM: c.k = capex_go_zero_norm; break;                                                  \
            case CAPEX__GO_K_LR_SCHED: c.k = capex_go_lr_sched; break;                                                    \
            default: return capex__fail(CAPEX_ERR_INTERNAL, "emu: unknown kernel %d", k);                                \
            }                                                                                                             \
            emu_grid(emu_small_thunk<capex_go_args>, &c, grid);                                                           \
        }                                                                                                                 \
        return CAPEX_OK;                                                                                                  \
    }
EMU_DISPATCH(capex_emu)
EMU_DISPATCH(capex_emu_big)

/* The variant the device would compile for this launch (the same functions
   that make its -D options), run as its template instance; kernels whose
   variant only drops other kernels run as they are. */
static capex_result emu_launch_variant(int k, unsigned vb, unsigned grid, void **args, int *ran) {
    size_t id = CAPEX__GO_KBASE + (size_t)k;
    int u = capex__cuda_kernel_unit(id, vb);
    capex__cuda_vdef d;
    *ran = 0;
    if (u < CAPEX__CUDA_N_PARTS) return CAPEX_OK;
    if (!capex__cuda_unit_has(u, id))
        return capex__fail(CAPEX_ERR_INTERNAL, "emu: variant %s lacks %s", capex__cuda_unit_name(u), capex__cuda_builtin_kernels[id]);
    d = capex__cuda_variant_def(u - CAPEX__CUDA_N_PARTS);
    var_runs[u - CAPEX__CUDA_N_PARTS]++;
    if (k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_ADAM + 3) {
        if (d.w < 0 || d.mk < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: adam variant without switches");
        emu_mta(capex_emu::adam_var[k - CAPEX__GO_K_ADAM][d.w][d.mk], args, grid);
        *ran = 1;
    } else if ((k >= CAPEX__GO_K_ADAM_AMS && k < CAPEX__GO_K_ADAM_AMS + 3) || (k >= CAPEX__GO_K_ADAGRAD && k < CAPEX__GO_K_ADAGRAD + 3)) {
        if (d.w < 0 || d.mk < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: amsgrad/Adagrad variant without switches");
        if (k < CAPEX__GO_K_ADAGRAD) emu_mta(capex_emu::ams_var[k - CAPEX__GO_K_ADAM_AMS][d.w][d.mk], args, grid);
        else emu_mta(capex_emu::adagrad_var[k - CAPEX__GO_K_ADAGRAD][d.w][d.mk], args, grid);
        *ran = 1;
    } else if ((k >= CAPEX__GO_K_SGD && k < CAPEX__GO_K_SGD + 3) || k == CAPEX__GO_K_LAMB2) {
        if (d.w < 0 || d.mk < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: SGD/LAMB2 variant without switches");
        if (k == CAPEX__GO_K_LAMB2) emu_mta(capex_emu::lamb2_var[d.w][d.mk], args, grid);
        else emu_mta(capex_emu::sgd_var[k - CAPEX__GO_K_SGD][d.w][d.mk], args, grid);
        *ran = 1;
    } else if (k >= CAPEX__GO_K_NOVO1 && k < CAPEX__GO_K_NOVO1 + 3) { /* no switch: it runs as it is */
        int v, in2 = 0;
        for (v = 0; v < 24; v++) in2 |= novo_in2[v];
        if (in2) novo_step_end(); /* pass 1 after pass 2: the next step */
        novo_in1[u - CAPEX__CUDA_N_PARTS - CAPEX__CV_NOVO] = 1;
    } else if (k >= CAPEX__GO_K_NOVO2 && k < CAPEX__GO_K_NOVO2 + 3) {
        if (d.w < 0 || d.mk < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: NovoGrad variant without switches");
        novo_in2[u - CAPEX__CUDA_N_PARTS - CAPEX__CV_NOVO] = 1;
        novo2_runs[u - CAPEX__CUDA_N_PARTS - CAPEX__CV_NOVO]++;
        emu_mta(capex_emu::novo2_var[k - CAPEX__GO_K_NOVO2][d.w][d.mk], args, grid);
        *ran = 1;
    } else if (k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB1 + 3) {
        if (d.w < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: LAMB1 variant without its switch");
        emu_mta(capex_emu::lamb1_var[k - CAPEX__GO_K_LAMB1][d.w], args, grid);
        *ran = 1;
    } else if (k >= CAPEX__GO_K_SCALE && k < CAPEX__GO_K_SUMSQ) {
        if (d.wr == 0 || d.clip < 0) return capex__fail(CAPEX_ERR_INTERNAL, "emu: scale variant switches wr %d clip %d", d.wr, d.clip);
        emu_mta(capex_emu::scale_var[k - CAPEX__GO_K_SCALE][d.wr > 0][d.clip], args, grid);
        *ran = 1;
    }
    return CAPEX_OK;
}

static capex_result emu_launch(void *user, int k, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    const emu_mode *m = (const emu_mode *)user;
    (void)s;
    stats.launches++;
    if (grid > stats.max_grid) stats.max_grid = grid;
    if (grid == 0 || block == 0 || block > 1024 || (block & (block - 1)))
        return capex__fail(CAPEX_ERR_INTERNAL, "emu: bad launch shape grid %u block %u", grid, block);
    if (m && m->variants) {
        int ran = 0;
        capex_result r = emu_launch_variant(k, vb, grid, args, &ran);
        if (r != CAPEX_OK || ran) return r;
    }
    return m && m->large ? emu_launch_capex_emu_big(k, grid, args) : emu_launch_capex_emu(k, grid, args);
}
static unsigned emu_grid_of(void *user, int k, unsigned vb, unsigned block) {
    (void)k; (void)vb; (void)block;
    return user ? ((const emu_mode *)user)->grid : 0u;
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

/* The default: the 4 KB metadata on a "device" that keeps 3 blocks resident
   (grids of 3: every block walks several chunks). */
static emu_mode mode_small3 = {0, 3, 0}, mode_small_default = {0, 0, 0}, mode_large_h100 = {1, 528, 0}, mode_large1 = {1, 1, 0};
static emu_mode mode_variants = {0, 3, 1};
static env emu_env_mode(uint64_t seed, emu_mode *m) {
    env e;
    memset(&e, 0, sizeof e);
    e.ex.user = m;
    e.ex.grid = emu_grid_of;
    e.ex.meta_bytes = m->large ? CAPEX__GO_META_LARGE : CAPEX__GO_META_SMALL;
    e.ex.launch = emu_launch;
    e.ex.alloc = emu_alloc;
    e.ex.release = emu_release;
    e.ex.htod = emu_htod;
    e.ex.dtoh = emu_dtoh;
    e.ex.zero = emu_zero;
    e.seed = seed;
    return e;
}
static env emu_env(uint64_t seed) { return emu_env_mode(seed, &mode_small3); }

/* ---- the kernel structs are the host mirrors, field for field ---- */
CT_TEST(layouts_match_the_kernels) {
    using namespace capex_emu;
    /* the metadata: capex__go_mta writes it by CAPEX__GO_TDEF's offsets */
#define META_OK(NS, B, D)                                                                                          \
    (sizeof(NS::capex_go_meta<D>) == CAPEX__GO_META_SIZE(B, D) && sizeof(NS::capex_go_meta<D>) <= (B) &&             \
     offsetof(NS::capex_go_meta<D>, numel) == 8 * (D) * CAPEX__GO_TDEF(B, D) &&                                      \
     offsetof(NS::capex_go_meta<D>, cend) == 8 * ((D) + 1) * CAPEX__GO_TDEF(B, D) &&                                 \
     offsetof(NS::capex_go_meta<D>, ntensors) == 8 * ((D) + 2) * CAPEX__GO_TDEF(B, D))
    CT_CHECK(META_OK(capex_emu, CAPEX__GO_META_SMALL, 1) && META_OK(capex_emu, CAPEX__GO_META_SMALL, 2) &&
                 META_OK(capex_emu, CAPEX__GO_META_SMALL, 5) && META_OK(capex_emu, CAPEX__GO_META_SMALL, 6),
             "4 KB metadata layout");
    CT_CHECK(META_OK(capex_emu_big, CAPEX__GO_META_LARGE, 1) && META_OK(capex_emu_big, CAPEX__GO_META_LARGE, 2) &&
                 META_OK(capex_emu_big, CAPEX__GO_META_LARGE, 5) && META_OK(capex_emu_big, CAPEX__GO_META_LARGE, 6),
             "large metadata layout");
#undef META_OK
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
CT_TEST(emu_scale_check_positions) { env e = emu_env(16); par_scale_check_positions(ct, &e, EMU_THREADS); }
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
CT_TEST(emu_resume_other_modes) { env e = emu_env(44); par_resume_modes(ct, &e); }
CT_TEST(emu_novograd) { env e = emu_env(11); par_novograd(ct, &e); }
CT_TEST(emu_lr_schedule) { env e = emu_env(12); par_schedule(ct, &e, 1); }
CT_TEST(emu_adagrad) { env e = emu_env(13); par_adagrad(ct, &e); }
CT_TEST(emu_adam_amsgrad) { env e = emu_env(14); par_adam_amsgrad(ct, &e); }
CT_TEST(emu_pure_half) { env e = emu_env(15); par_pure_half_steps(ct, &e); }
CT_TEST(emu_options_mid_training) { env e = emu_env(32); par_options(ct, &e); }

/* Every launch through the variant the device would compile for it (its
   switches fixed at compile time): the same CPU parity, bit for bit (Adam,
   unscale, amsgrad, Adagrad, SGD; LAMB close, as always; the other kernels'
   variants only drop kernels). Each Adam, amsgrad, Adagrad and SGD variant (3
   grad dtypes x W/L2 (SGD: momentum off/on) x model none/f16/bf16/bf16
   stochastic rounding), each LAMB variant (stage 1: grad dtype x W/L2; stage 2:
   W/L2 x model), each NovoGrad variant (grad dtype x reg_inside_moment x
   model: pass 2's launches; in each step pass 1 may only load variants pass
   2 loads, one compile for both) and the scale variants the unscale, clip and
   pure_half paths take must run. NovoGrad and LAMB are close to the CPU, not
   bit-exact (other summation orders), as in their own tests. */
CT_TEST(emu_variants_bit_exact) {
    env e = emu_env_mode(31, &mode_variants);
    int v, adam = 0, ams = 0, adagrad = 0, sgd = 0, lamb1 = 0, lamb2 = 0, novo = 0, scale = 0;
    memset(var_runs, 0, sizeof var_runs);
    memset(novo2_runs, 0, sizeof novo2_runs);
    novo_step_end();
    novo_steps = novo_steps_bad = 0;
    par_scale(ct, &e);
    if (!ct->failed) par_scale_many(ct, &e);
    if (!ct->failed) par_clip(ct, &e);
    if (!ct->failed) par_adam(ct, &e);
    if (!ct->failed) par_amp_loop(ct, &e, emu_count);
    if (!ct->failed) par_pure_half_steps(ct, &e);
    if (!ct->failed) par_adam_amsgrad(ct, &e);
    if (!ct->failed) par_adagrad(ct, &e);
    if (!ct->failed) par_sgd(ct, &e);
    if (!ct->failed) par_lamb(ct, &e);
    if (!ct->failed) par_novograd(ct, &e);
    if (ct->failed) return; /* the first failure's message */
    novo_step_end();
    for (v = 0; v < 24; v++) {
        adam += var_runs[CAPEX__CV_ADAM + v] > 0;
        ams += var_runs[CAPEX__CV_AMS + v] > 0;
        adagrad += var_runs[CAPEX__CV_ADAGRAD + v] > 0;
        sgd += var_runs[CAPEX__CV_SGD + v] > 0;
        novo += novo2_runs[v] > 0;
        lamb2 += v < 8 && var_runs[CAPEX__CV_LAMB2 + v] > 0;
        lamb1 += v < 6 && var_runs[CAPEX__CV_LAMB1 + v] > 0;
    }
    CT_CHECK(adam == 24 && ams == 24 && adagrad == 24 && sgd == 24 && novo == 24 && lamb1 == 6 && lamb2 == 8,
             "variants that ran: Adam %d, amsgrad %d, Adagrad %d, SGD %d, NovoGrad %d of 24 each, LAMB stage 1 %d of 6, stage 2 %d of 8",
             adam, ams, adagrad, sgd, novo, lamb1, lamb2);
    CT_CHECK(novo_steps > 0 && novo_steps_bad == 0, "NovoGrad: pass 1 loaded a variant pass 2 did not in %d of %d steps",
             novo_steps_bad, novo_steps);
    for (v = CAPEX__CV_SCALE; v < CAPEX__CV_SUMSQ; v++) {
        capex__cuda_vdef d = capex__cuda_variant_def(v);
        int pair = (v - CAPEX__CV_SCALE) / 4, in = pair / 3, out = pair % 3;
        /* written out: every pair; check only and clip (in place): in == out */
        int want = d.wr == 1 ? (d.clip == 0 || in == out) : (in == out && d.clip == 0);
        scale += var_runs[v] > 0;
        CT_CHECK(!want || var_runs[v] > 0, "scale variant %s (wr %d clip %d) did not run", capex__cuda_unit_name(CAPEX__CUDA_N_PARTS + v),
                 d.wr, d.clip);
    }
    CT_CHECK(var_runs[CAPEX__CV_AMP] > 0 && var_runs[CAPEX__CV_AMP + 1] > 0 && var_runs[CAPEX__CV_SUMSQ + 2] > 0,
             "the amp and sum-of-squares variants were picked");
}

/* The large metadata (32 KB of parameters) on an H100-sized grid, and on a
   grid of 1 (one block walks every chunk); the 4 KB metadata with the default
   grid: the same CPU parity, the same bits. */
CT_TEST(emu_large_params) {
    env e = emu_env_mode(21, &mode_large_h100), e1 = emu_env_mode(22, &mode_large1), e2 = emu_env_mode(23, &mode_small_default);
    par_scale_many(ct, &e);
    par_norms(ct, &e);
    par_sumsq_order(ct, &e, EMU_THREADS);
    par_sumsq_order(ct, &e1, EMU_THREADS);
    par_sumsq_order(ct, &e2, EMU_THREADS);
    par_adam(ct, &e);
    par_lamb(ct, &e1);
    par_novograd(ct, &e);
}

/* 500 small tensors (1 .. ~4100 elements, some misaligned, 30 empty):
   launches per op = ceil(470 / slots): unscale 4 (4 KB) or 1 (large), sum of
   squares 3 or 1 (the old layout: 93 and 139 tensors a launch, 6 and 4
   launches); the unscaled outputs equal the CPU's bit for bit and the sums of
   squares (per-chunk partials, the total) have the same bits whatever the
   metadata size and grid. */
CT_TEST(emu_many_small_tensors) {
    enum { N = 500 };
    static capex_tensor hin[N], hout[N], din[N], dout[N];
    static emu_mode *const modes[4] = {&mode_small3, &mode_small_default, &mode_large_h100, &mode_large1};
    double part0[N + 8], tot0 = 0.0;
    size_t i, nonempty = 0;
    int mi, found = 0;
    uint64_t seed = 31;
    capex_tensor_list hi, ho;
    for (i = 0; i < N; i++) {
        int64_t n = i % 17 == 5 ? 0 : (int64_t)(par_rng(&seed) % 4100) + 1;
        size_t off = i % 3 == 1 ? 2 : 0; /* bf16: one element past 16-byte alignment */
        void *pin = NULL;
        CT_CHECK(posix_memalign(&pin, 64, (size_t)n * 2 + 64) == 0, "alloc");
        hin[i].numel = din[i].numel = hout[i].numel = dout[i].numel = n;
        hin[i].data = (char *)pin + off;
        din[i].data = hin[i].data;
        par_fill(&seed, CAPEX_BF16, hin[i].data, n, 4.0f, 0);
        hout[i].data = malloc((size_t)n * 4 + 4);
        dout[i].data = malloc((size_t)n * 4 + 4);
        CT_CHECK(hout[i].data && dout[i].data, "alloc");
        nonempty += n > 0;
    }
    hi = capex_tensor_list_make(CAPEX_BF16, hin, N);
    ho = capex_tensor_list_make(CAPEX_F32, hout, N);
    CT_CHECK(capex_multi_tensor_scale(NULL, &hi, &ho, 0.25f, &found) == CAPEX_OK && !found, "cpu");
    for (mi = 0; mi < 4; mi++) {
        env e = emu_env_mode(40 + (uint64_t)mi, modes[mi]);
        size_t bytes = (size_t)e.ex.meta_bytes, ws_bytes = 0;
        capex_tensor_list di = capex_tensor_list_make(CAPEX_BF16, din, N), dl = capex_tensor_list_make(CAPEX_F32, dout, N);
        capex_cuda_ptr dscale = par_alloc(&e, 4), ws, dtot = par_alloc(&e, 8);
        float s = 0.25f;
        double part[N + 8], tot;
        int64_t nch = 0, zero = 0;
        int want;
        CT_CHECK(dscale && dtot && par_up(&e, dscale, &s, 4), "alloc");
        for (i = 0; i < N; i++) memset(dout[i].data, 0xA5, (size_t)dout[i].numel * 4);
        stats.launches = 0;
        stats.max_grid = 0;
        CT_CHECK(capex__go_scale(&e.ex, "t", NULL, &di, &dl, dscale, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        want = (int)((nonempty + CAPEX__GO_TDEF(bytes, 2) - 1) / CAPEX__GO_TDEF(bytes, 2));
        CT_CHECK(stats.launches == want && want == (modes[mi]->large ? 1 : 4), "mode %d: unscale of %zu tensors in %d launches, "
                 "want %d", mi, nonempty, stats.launches, want);
        { /* each tensor is one chunk: a launch's grid is min(its tensors, the device's blocks or 320) */
            size_t per = nonempty < CAPEX__GO_TDEF(bytes, 2) ? nonempty : CAPEX__GO_TDEF(bytes, 2);
            unsigned cap = modes[mi]->grid ? modes[mi]->grid : 320u;
            CT_CHECK(stats.max_grid == (per < cap ? (unsigned)per : cap), "mode %d: grid %u", mi, stats.max_grid);
        }
        for (i = 0; i < N; i++)
            CT_CHECK(!memcmp(dout[i].data, hout[i].data, (size_t)hout[i].numel * 4), "mode %d: tensor %zu differs from the CPU", mi, i);
        /* sums of squares: partials per chunk, then the fixed-order total */
        CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &di, 1, &ws_bytes) == CAPEX_OK && ws_bytes <= sizeof part, "ws");
        ws = par_alloc(&e, ws_bytes);
        CT_CHECK(ws, "alloc");
        stats.launches = 0;
        CT_CHECK(capex__go_l2norm(&e.ex, NULL, &di, ws, ws_bytes, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        want = (int)((nonempty + CAPEX__GO_TDEF(bytes, 1) - 1) / CAPEX__GO_TDEF(bytes, 1));
        CT_CHECK(stats.launches >= want && want == (modes[mi]->large ? 1 : 3), "mode %d: sum of squares %d launches", mi, want);
        for (i = 0; i < N; i++) nch += capex__go_nchunks(din[i].numel, CAPEX_CHUNK_SIZE_DEFAULT);
        CT_CHECK(par_down(&e, part, ws, (size_t)nch * 8), "down");
        CT_CHECK(capex__go_reduce(&e.ex, ws, &zero, &nch, 1, dtot, 0, NULL) == CAPEX_OK && par_down(&e, &tot, dtot, 8), "reduce");
        if (mi == 0) {
            double ref = 0.0;
            memcpy(part0, part, (size_t)nch * 8);
            tot0 = tot;
            for (i = 0; i < N; i++) {
                int64_t j;
                for (j = 0; j < hin[i].numel; j++) {
                    double v = (double)capex_bf16_to_f32(((const uint16_t *)hin[i].data)[j]);
                    ref += v * v;
                }
            }
            CT_CHECK(fabs(tot - ref) <= 1e-12 * ref, "total %.17g, float64 %.17g", tot, ref);
        } else {
            CT_CHECK(!memcmp(part, part0, (size_t)nch * 8), "mode %d: per-chunk partials differ from mode 0", mi);
            CT_CHECK(!memcmp(&tot, &tot0, 8), "mode %d: total %.17g, mode 0 %.17g", mi, tot, tot0);
        }
        par_free(&e, ws);
        par_free(&e, dscale);
        par_free(&e, dtot);
    }
    for (i = 0; i < N; i++) {
        free((char *)hin[i].data - (i % 3 == 1 ? 2 : 0));
        free(hout[i].data);
        free(dout[i].data);
    }
}

/* ---- a device failure inside add_group changes nothing ----
   Every allocation, copy, zeroing and launch add_group makes fails in turn
   (a countdown in the exec): each failure returns its error, leaves the
   group count and the live device allocations as they were, and the
   optimizer then adds the group and steps bit for bit like a twin that never
   failed (Adam amsgrad with a pure_half f16 group, LAMB, NovoGrad, Adagrad
   with an initial accumulator, SGD momentum; each with a group and two steps
   before). Never run before 2026-11-28 (add_group's cleanup path). */
static int fi_countdown = -1; /* device operations left before one fails; -1: none fails */
static long fi_live;          /* live allocations of the failing exec */
static int fi_fail(void) { return fi_countdown >= 0 && fi_countdown-- == 0; }
static capex_result fi_alloc(void *u, size_t bytes, capex_cuda_ptr *out) {
    capex_result r;
    if (fi_fail()) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "injected: alloc of %zu bytes", bytes);
    if ((r = emu_alloc(u, bytes, out)) == CAPEX_OK) fi_live++;
    return r;
}
static void fi_release(void *u, capex_cuda_ptr p) { fi_live--; emu_release(u, p); }
static capex_result fi_htod(void *u, capex_cuda_ptr d, const void *s, size_t n, capex_cuda_stream st) {
    return fi_fail() ? capex__fail(CAPEX_ERR_CUDA, "injected: htod") : emu_htod(u, d, s, n, st);
}
static capex_result fi_dtoh(void *u, void *d, capex_cuda_ptr s, size_t n, capex_cuda_stream st) {
    return fi_fail() ? capex__fail(CAPEX_ERR_CUDA, "injected: dtoh") : emu_dtoh(u, d, s, n, st);
}
static capex_result fi_zero(void *u, capex_cuda_ptr d, size_t n, capex_cuda_stream st) {
    return fi_fail() ? capex__fail(CAPEX_ERR_CUDA, "injected: zero") : emu_zero(u, d, n, st);
}
static capex_result fi_launch(void *u, int k, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    return fi_fail() ? capex__fail(CAPEX_ERR_CUDA, "injected: launch") : emu_launch(u, k, vb, grid, block, args, s);
}
static capex_result fi_sync(void *u) { (void)u; return fi_fail() ? capex__fail(CAPEX_ERR_CUDA, "injected: sync") : CAPEX_OK; }

enum { FI_NT = 5 };
static const int64_t fi_numel[FI_NT] = {37, 70001, 5, 100, 0}; /* group 0: 0..2; group 1: 3, 4 */
typedef struct fi_twin {
    float *p[FI_NT], *g[FI_NT];
    uint16_t *m[FI_NT];
    capex_cuda_optim *o;
} fi_twin;
static void fi_params(fi_twin *t, int first, int n, int pure, capex_optim_param *ps) {
    int i;
    for (i = 0; i < n; i++) {
        int k = first + i;
        capex_optim_param_init(&ps[i]);
        ps[i].param = t->p[k];
        ps[i].grad = t->g[k];
        ps[i].numel = fi_numel[k];
        if (pure && k == 3) { ps[i].model = t->m[k]; ps[i].model_dtype = CAPEX_F16; ps[i].pure_half = 1; }
    }
}
static void fi_make(fi_twin *t, uint64_t seed) {
    int k;
    int64_t i;
    for (k = 0; k < FI_NT; k++) {
        uint64_t s = seed + (uint64_t)k;
        size_t n = (size_t)fi_numel[k] + 1;
        t->p[k] = (float *)malloc(n * 4);
        t->g[k] = (float *)malloc(n * 4);
        t->m[k] = (uint16_t *)malloc(n * 2);
        for (i = 0; i < fi_numel[k]; i++) {
            t->p[k][i] = par_uniform(&s);
            t->g[k][i] = par_uniform(&s) * 0.1f;
            t->m[k][i] = capex_f32_to_f16(par_uniform(&s));
        }
    }
    t->o = NULL;
}
static void fi_free(fi_twin *t) {
    int k;
    capex_cuda_optim_destroy(t->o);
    for (k = 0; k < FI_NT; k++) { free(t->p[k]); free(t->g[k]); free(t->m[k]); }
}
static int fi_same(const fi_twin *a, const fi_twin *b, int nt) {
    int k;
    size_t j;
    for (k = 0; k < nt; k++) {
        capex_cuda_ptr ma, va, mb, vb, xa = 0, xb = 0;
        size_t g = k < 3 ? 0 : 1, idx = k < 3 ? (size_t)k : (size_t)k - 3, bytes = (size_t)fi_numel[k] * 4;
        if (memcmp(a->p[k], b->p[k], bytes) || memcmp(a->m[k], b->m[k], (size_t)fi_numel[k] * 2)) return 0;
        if (capex_cuda_optim_get_state(a->o, g, idx, &ma, &va) != CAPEX_OK ||
            capex_cuda_optim_get_state(b->o, g, idx, &mb, &vb) != CAPEX_OK ||
            capex_cuda_optim_get_max_exp_avg_sq(a->o, g, idx, &xa) != CAPEX_OK ||
            capex_cuda_optim_get_max_exp_avg_sq(b->o, g, idx, &xb) != CAPEX_OK) return 0;
        if (!ma != !mb || !va != !vb || !xa != !xb) return 0;
        for (j = 0; j < bytes / 4; j++) {
            if (ma && ((float *)(uintptr_t)ma)[j] != ((float *)(uintptr_t)mb)[j]) return 0;
            if (va && ((float *)(uintptr_t)va)[j] != ((float *)(uintptr_t)vb)[j]) return 0;
            if (xa && ((float *)(uintptr_t)xa)[j] != ((float *)(uintptr_t)xb)[j]) return 0;
        }
    }
    return 1;
}
CT_TEST(emu_add_group_device_failure_changes_nothing) {
    static const capex_optim_kind kinds[5] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_NOVOGRAD, CAPEX_OPTIM_ADAGRAD,
                                              CAPEX_OPTIM_SGD};
    env plain = emu_env(41), failing = emu_env(41);
    int ki;
    failing.ex.alloc = fi_alloc;
    failing.ex.release = fi_release;
    failing.ex.htod = fi_htod;
    failing.ex.dtoh = fi_dtoh;
    failing.ex.zero = fi_zero;
    failing.ex.launch = fi_launch;
    failing.ex.sync = fi_sync;
    for (ki = 0; ki < 5; ki++) {
        capex_optim_desc d;
        capex_optim_hparams hp;
        capex_optim_param ps[3];
        fi_twin a, b;
        int step, at, pure = kinds[ki] == CAPEX_OPTIM_ADAM, failures = 0;
        capex_result r = CAPEX_OK;
        capex_optim_desc_init(&d, kinds[ki]);
        d.exec.chunk_size = 65536;
        d.defaults.lr = 1e-2f;
        d.defaults.weight_decay = 0.01f;
        if (kinds[ki] == CAPEX_OPTIM_SGD) d.defaults.momentum = 0.9f;
        if (kinds[ki] == CAPEX_OPTIM_ADAGRAD) d.defaults.initial_accumulator_value = 0.1f;
        hp = d.defaults;
        if (kinds[ki] == CAPEX_OPTIM_ADAM) hp.amsgrad = 1;
        fi_make(&a, 7);
        fi_make(&b, 7);
        fi_countdown = -1;
        fi_live = 0;
        CT_CHECK(capex__go_optim_create(&plain.ex, &d, &a.o) == CAPEX_OK && capex__go_optim_create(&failing.ex, &d, &b.o) == CAPEX_OK,
                 "%s", capex_last_error());
        fi_params(&a, 0, 3, 0, ps);
        CT_CHECK(capex_cuda_optim_add_group(a.o, &hp, ps, 3, NULL) == CAPEX_OK, "%s", capex_last_error());
        fi_params(&b, 0, 3, 0, ps);
        CT_CHECK(capex_cuda_optim_add_group(b.o, &hp, ps, 3, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (step = 0; step < 2; step++)
            CT_CHECK(capex_cuda_optim_step(a.o, 0, 0, 0, NULL) == CAPEX_OK && capex_cuda_optim_step(b.o, 0, 0, 0, NULL) == CAPEX_OK,
                     "%s", capex_last_error());
        for (at = 0; at < 1000; at++) {
            long live = fi_live;
            int had_one = b.o->one != 0; /* pure_half's device 1.0f, kept once written */
            fi_params(&b, 3, 2, pure, ps);
            fi_countdown = at;
            r = capex_cuda_optim_add_group(b.o, NULL, ps, 2, NULL);
            fi_countdown = -1;
            if (r == CAPEX_OK) break;
            failures++;
            CT_CHECK(strstr(capex_last_error(), "injected") != NULL, "kind %d, failure %d: %s", (int)kinds[ki], at,
                     capex_last_error());
            CT_CHECK(capex_cuda_optim_num_groups(b.o) == 1, "kind %d, failure %d: %zu groups", (int)kinds[ki], at,
                     capex_cuda_optim_num_groups(b.o));
            CT_CHECK(fi_live == live + (b.o->one && !had_one), "kind %d, failure at device operation %d: %ld allocations leaked",
                     (int)kinds[ki], at, fi_live - live);
        }
        CT_CHECK(r == CAPEX_OK && failures >= 3, "kind %d: %d failures, then %s", (int)kinds[ki], failures, capex_last_error());
        fi_params(&a, 3, 2, pure, ps);
        CT_CHECK(capex_cuda_optim_add_group(a.o, NULL, ps, 2, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (step = 0; step < 3; step++)
            CT_CHECK(capex_cuda_optim_step(a.o, 0, 0, 0, NULL) == CAPEX_OK && capex_cuda_optim_step(b.o, 0, 0, 0, NULL) == CAPEX_OK,
                     "%s", capex_last_error());
        CT_CHECK(fi_same(&a, &b, FI_NT), "kind %d: the optimizer that saw %d failed add_groups differs from its twin",
                 (int)kinds[ki], failures);
        fi_free(&a);
        b.o = (capex_cuda_optim_destroy(b.o), (capex_cuda_optim *)NULL);
        CT_CHECK(fi_live == 0, "kind %d: %ld device allocations left after destroy", (int)kinds[ki], fi_live);
        fi_free(&b);
    }
}

/* The scaler's create: its allocation, upload or sync failing returns the
   error, no scaler and no device memory held; then it is made with the
   desc's scale (never run before 2026-11-28). */
CT_TEST(emu_scaler_create_device_failure) {
    env failing = emu_env(45);
    capex_scaler_desc d;
    capex_cuda_scaler *sc = (capex_cuda_scaler *)&d;
    capex_result r = CAPEX_OK;
    float scale = 0;
    int at, failures = 0;
    failing.ex.alloc = fi_alloc;
    failing.ex.release = fi_release;
    failing.ex.htod = fi_htod;
    failing.ex.sync = fi_sync;
    capex_scaler_desc_init(&d);
    d.init_scale = 1024.0f;
    fi_live = 0;
    for (at = 0; at < 10; at++) {
        fi_countdown = at;
        r = capex__go_scaler_create(&failing.ex, &d, &sc);
        fi_countdown = -1;
        if (r == CAPEX_OK) break;
        failures++;
        CT_CHECK(sc == NULL && fi_live == 0 && strstr(capex_last_error(), "injected"), "failure %d: scaler %p, %ld allocations, %s",
                 at, (void *)sc, fi_live, capex_last_error());
    }
    CT_CHECK(r == CAPEX_OK && failures == 3, "%d failures, then %s", failures, capex_last_error());
    CT_CHECK(capex_cuda_scaler_get_scale(sc, &scale, NULL) == CAPEX_OK && scale == 1024.0f, "scale %g", (double)scale);
    capex_cuda_scaler_destroy(sc);
    CT_CHECK(fi_live == 0, "%ld allocations left", fi_live);
}

/* ---- from_host refuses a host optimizer that does not match, before any copy ----
   A parameter's numel, its group, a group's amsgrad (a group of empty
   tensors: no buffers to compare), a model copy present on one side only
   (with CAPEX_OPTIM_STATE_PARAMS) and a step past CAPEX_STEP_MAX (with a
   mode the device would take): each refused with its code and the device's
   weights, moments, step counts and modes unchanged; the optimizer's own to_host copy is then taken. Never run
   before 2026-11-28 (the checks guard copies sized by the device's numel). */
static float fh_mem[4][64];
static capex_optim *fh_host(const int64_t *numel, const int *group, int ams1, int model0) {
    static uint16_t model[64];
    capex_optim_desc d;
    capex_optim *h = NULL;
    int g, k;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    if (capex_optim_create(&d, &h) != CAPEX_OK) return NULL;
    for (g = 0; g < 2; g++) {
        capex_optim_param ps[3];
        capex_optim_hparams hp = d.defaults;
        size_t n = 0;
        hp.amsgrad = g == 1 && ams1;
        for (k = 0; k < 3; k++) {
            if (group[k] != g) continue;
            capex_optim_param_init(&ps[n]);
            ps[n].param = fh_mem[k];
            ps[n].grad = fh_mem[3];
            ps[n].numel = numel[k];
            if (k == 0 && model0) { ps[n].model = model; ps[n].model_dtype = CAPEX_F16; }
            n++;
        }
        if (capex_optim_add_group(h, &hp, ps, n, NULL) != CAPEX_OK) { capex_optim_destroy(h); return NULL; }
    }
    return h;
}
CT_TEST(emu_from_host_refuses_mismatches) {
    static const int64_t dn[3] = {37, 5, 0};
    static const int dg[3] = {0, 0, 1};
    static float p[3][64], g[64], before[3][3][64];
    static const int64_t n_other[3] = {37, 6, 0};
    static const int g_other[3] = {0, 1, 1};
    env e = emu_env(43);
    capex_optim_desc d;
    capex_cuda_optim *o = NULL;
    capex_optim *h;
    capex_result r;
    int k, c, i;
    int64_t st0 = 0, st1 = 0;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex__go_optim_create(&e.ex, &d, &o) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 64; i++) { g[i] = 0.01f * (float)(i % 7) - 0.03f; for (k = 0; k < 3; k++) p[k][i] = 0.1f * (float)k + 0.001f * (float)i; }
    for (c = 0; c < 2; c++) {
        capex_optim_param ps[2];
        size_t n = 0;
        for (k = 0; k < 3; k++) {
            if (dg[k] != c) continue;
            capex_optim_param_init(&ps[n]);
            ps[n].param = p[k];
            ps[n].grad = g;
            ps[n].numel = dn[k];
            n++;
        }
        CT_CHECK(capex_cuda_optim_add_group(o, NULL, ps, n, NULL) == CAPEX_OK, "%s", capex_last_error());
    }
    CT_CHECK(capex_cuda_optim_step(o, 0, 0, 0, NULL) == CAPEX_OK && capex_cuda_optim_step(o, 0, 0, 0, NULL) == CAPEX_OK, "%s",
             capex_last_error());
    for (k = 0; k < 2; k++) { /* weights, m, v of the non-empty params */
        capex_cuda_ptr m, v;
        CT_CHECK(capex_cuda_optim_get_state(o, 0, (size_t)k, &m, &v) == CAPEX_OK, "%s", capex_last_error());
        memcpy(before[k][0], p[k], 4 * (size_t)dn[k]);
        memcpy(before[k][1], (void *)(uintptr_t)m, 4 * (size_t)dn[k]);
        memcpy(before[k][2], (void *)(uintptr_t)v, 4 * (size_t)dn[k]);
    }
    for (c = 0; c < 5; c++) {
        static const capex_result want[5] = {CAPEX_ERR_SIZE_MISMATCH, CAPEX_ERR_SIZE_MISMATCH, CAPEX_ERR_CONFIG,
                                             CAPEX_ERR_SIZE_MISMATCH, CAPEX_ERR_INVALID_ARG};
        unsigned flags = c == 3 ? CAPEX_OPTIM_STATE_PARAMS : 0;
        h = c == 0 ? fh_host(n_other, dg, 0, 0) : c == 1 ? fh_host(dn, g_other, 0, 0) : c == 2 ? fh_host(dn, dg, 1, 0)
          : c == 3 ? fh_host(dn, dg, 0, 1) : NULL;
        if (c == 4) {
            CT_CHECK(capex_cuda_optim_to_host(o, 0, NULL, &h) == CAPEX_OK, "%s", capex_last_error());
            h->groups[0].step = CAPEX_STEP_MAX + 1;
            h->desc.adam_w_mode = 0; /* a mode the device would take: not taken when refused */
        }
        CT_CHECK(h != NULL, "case %d: host optimizer: %s", c, capex_last_error());
        r = capex_cuda_optim_from_host(o, h, flags, NULL);
        CT_CHECK(r == want[c], "case %d: %s (%s), want %s", c, capex_result_string(r), capex_last_error(),
                 capex_result_string(want[c]));
        capex_optim_destroy(h);
        for (k = 0; k < 2; k++) {
            capex_cuda_ptr m, v;
            CT_CHECK(capex_cuda_optim_get_state(o, 0, (size_t)k, &m, &v) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(!memcmp(before[k][0], p[k], 4 * (size_t)dn[k]) && !memcmp(before[k][1], (void *)(uintptr_t)m, 4 * (size_t)dn[k]) &&
                     !memcmp(before[k][2], (void *)(uintptr_t)v, 4 * (size_t)dn[k]), "case %d: param %d changed", c, k);
        }
        CT_CHECK(capex_cuda_optim_get_step(o, 0, &st0, NULL) == CAPEX_OK && capex_cuda_optim_get_step(o, 1, &st1, NULL) == CAPEX_OK &&
                 st0 == 2 && st1 == 2, "case %d: steps %lld %lld", c, (long long)st0, (long long)st1);
        CT_CHECK(o->desc.adam_w_mode == 1, "case %d: the device's adam_w_mode changed", c);
    }
    CT_CHECK(capex_cuda_optim_to_host(o, CAPEX_OPTIM_STATE_PARAMS, NULL, &h) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_from_host(o, h, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_OK, "own copy: %s", capex_last_error());
    capex_optim_destroy(h);
    capex_cuda_optim_destroy(o);
}

static const ct_case cases[] = {
    CT_CASE(layouts_match_the_kernels), CT_CASE(emu_scale_every_dtype_pair), CT_CASE(emu_scale_check_positions), CT_CASE(emu_scale_many_tensors),
    CT_CASE(emu_l2norm), CT_CASE(emu_sumsq_order), CT_CASE(emu_clip), CT_CASE(emu_adam), CT_CASE(emu_pure_half), CT_CASE(emu_options_mid_training), CT_CASE(emu_variants_bit_exact), CT_CASE(emu_sgd), CT_CASE(emu_lamb), CT_CASE(emu_scaler),
    CT_CASE(emu_amp_loop_no_host_sync), CT_CASE(emu_checkpoint_roundtrip), CT_CASE(emu_resume_other_modes), CT_CASE(emu_novograd),
    CT_CASE(emu_lr_schedule),
    CT_CASE(emu_adagrad), CT_CASE(emu_adam_amsgrad), CT_CASE(emu_add_group_device_failure_changes_nothing), CT_CASE(emu_from_host_refuses_mismatches), CT_CASE(emu_scaler_create_device_failure), CT_CASE(emu_large_params), CT_CASE(emu_many_small_tensors),
};

int main(int argc, char **argv) {
    int r = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    emu_stop();
    return r;
}
