/* emu_libcuda.cc - "capex CPU emulator (not a GPU)": a libcuda.so.1 whose
   kernels really run, on the CPU. Built as build/emu/libcuda.so.1 by
   tests/emu.mk and used through CAPEX_LIBCUDA_PATH by `make ci-extra`, so the
   GPU tests (tests/test_*_gpu.c) run their real kernels without a GPU.

   Kernels: build/emu/kernels.inc (tests/emu_gen.c) holds the very text NVRTC
   compiles (capex_cuda_builtin_source(), plus the files in EMU_KERNEL_SOURCES)
   compiled here as host C++ against the CUDA shim below, one namespace per
   set, and a table name -> thunk. cuModuleLoadDataEx still takes the real
   NVRTC image (CUBIN for sm_90, or PTX); cuModuleGetFunction finds the name in
   the image, then in the table; cuLaunchKernel unpacks `void **params` with
   the kernel's own parameter types and runs the grid.

   Execution: blocks one after another; the threads of a block are fibers
   (own stacks, switched only at __syncthreads, __syncwarp and warp
   shuffles), so every barrier is a real rendezvous of all live threads of the
   block (or warp), in a fixed order; CAPEX_EMU_ORDER=reverse runs threads
   and blocks the other way round (a result that changes with it is a race
   between threads or blocks). __shared__ is static storage (one block
   at a time); all of it, and the dynamic shared memory, is filled with 0xFF
   bytes (NaN, -1) before every block, so a read before the block's own write
   shows. A __syncthreads that not every live thread reaches is reported
   (CUDA_ERROR_LAUNCH_FAILED), not hung.
   Memory: device memory is host memory from mmap, each allocation between
   two PROT_NONE guard pages (it ends at the upper one); a pointer argument
   outside every live allocation, or a kernel access that runs into a guard
   page (SIGSEGV while the kernel
   runs), gives the sticky CUDA_ERROR_ILLEGAL_ADDRESS like a real fault.
   Streams and events: work runs synchronously at the call, unless
   CAPEX_EMU_STREAMS=lazy: then work on a stream from cuStreamCreate waits in
   that stream's queue until something needs it (a synchronize of the stream,
   an event or the context, a wait on an event recorded there, cuMemFree,
   cuModuleUnload, a DtoH copy on that stream, its cuStreamDestroy), the
   order a real GPU may take at its latest (cuEventDestroy runs nothing). The legacy stream (NULL, and the synchronous copies
   and memsets) runs at the call and waits only for blocking streams (flags
   0), as on a GPU: work that reads another stream's result without an event
   then reads it before it is written (a missing wait shows).
   CAPEX_EMU_STREAMS=ahead: lazy, but a host wait on an event (query,
   synchronize) first runs every other stream's queued work, as a GPU may,
   and the first query of a record still queued says NOT_READY: work queued
   before the host wait that reads the waited-for result reads it stale
   (lazy alone runs such work late, so a missing host wait shows only here;
   a missing stream wait shows only under lazy). Async uploads
   copy the host data at the call (pageable memory). Stream capture
   (global mode) records kernel launches, async copies and memsets for graph
   replay; a synchronising call while capturing fails and invalidates the
   capture like the real driver (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).

   What it cannot show: the GPU memory model (everything here is sequentially
   consistent), warp scheduling and divergence (lanes run one after another),
   NVRTC's code generation, most -D options given to NVRTC (the text here is
   compiled without them; the built-in program comes twice, for capex's
   -DCAPEX_GO_META=<large> build, picked by the parameter bytes the image
   declares; two LayerNorm/RMSNorm variants come with their -DCAPEX_V_*
   switches, and every norm variant's launch is checked against the switches
   its image names: struct function), speed. */
#include "cuda_image.h"
#include <algorithm>
#include <deque>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
/* Fibers switch with a few lines of assembly on x86-64, with ucontext elsewhere
   (or with -DCAPEX_EMU_UCONTEXT). */
#if defined(__x86_64__) && !defined(CAPEX_EMU_UCONTEXT)
#define EMU_ASM_SWITCH 1
#else
#define EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#define EMU_API extern "C" __attribute__((visibility("default")))

/* ================================ the CUDA shim ================================ */
namespace capex_emu_shim {
struct dim3 { unsigned x, y, z; };
}
/* Current thread/block of the running fiber: set by the scheduler before each
   resume. Not static, so that calls into the scheduler clobber them. */
extern "C" {
extern capex_emu_shim::dim3 capex_emu_threadIdx, capex_emu_blockIdx, capex_emu_blockDim, capex_emu_gridDim;
extern void *capex_emu_dyn_smem;
void capex_emu_syncthreads(void);
void capex_emu_syncwarp(void);
unsigned long long capex_emu_shfl(unsigned long long v, int mode, int arg, int width, unsigned mask);
long long capex_emu_clock64(void);
}

namespace capex_emu_shim {
#define threadIdx capex_emu_threadIdx
#define blockIdx capex_emu_blockIdx
#define blockDim capex_emu_blockDim
#define gridDim capex_emu_gridDim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
/* All static shared memory in one section (the kernel sets have internal
   linkage, see tests/emu_gen.c), poisoned before every block. */
#define __shared__ static __attribute__((section("capex_emu_shared"), used))
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
static const int warpSize = 32;
static inline void __syncthreads() { asm volatile("" ::: "memory"); capex_emu_syncthreads(); asm volatile("" ::: "memory"); }
static inline void __syncwarp(unsigned = 0xffffffffu) { asm volatile("" ::: "memory"); capex_emu_syncwarp(); asm volatile("" ::: "memory"); }
static inline void __threadfence() { asm volatile("" ::: "memory"); }
static inline void __threadfence_block() { asm volatile("" ::: "memory"); }
template <class T> static inline T emu_shfl(T v, int mode, int arg, int width, unsigned mask) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
    unsigned long long u = 0;
    memcpy(&u, &v, sizeof v);
    asm volatile("" ::: "memory");
    u = capex_emu_shfl(u, mode, arg, width, mask);
    asm volatile("" ::: "memory");
    memcpy(&v, &u, sizeof v);
    return v;
}
/* Every lane of the warp takes part (a mask naming an exited or missing lane is
   reported: undefined on a GPU). */
template <class T> static inline T __shfl_sync(unsigned k, T v, int src, int width = 32) { return emu_shfl(v, 0, src, width, k); }
template <class T> static inline T __shfl_up_sync(unsigned k, T v, unsigned d, int width = 32) { return emu_shfl(v, 1, (int)d, width, k); }
template <class T> static inline T __shfl_down_sync(unsigned k, T v, unsigned d, int width = 32) { return emu_shfl(v, 2, (int)d, width, k); }
template <class T> static inline T __shfl_xor_sync(unsigned k, T v, int m, int width = 32) { return emu_shfl(v, 3, m, width, k); }
static inline long long clock64() { return capex_emu_clock64(); }
static inline long long clock() { return capex_emu_clock64(); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
/* IEEE round-to-nearest operations: the host's (the library is built without FMA contraction). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
/* approximations on the GPU; exact here */
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline float __expf(float a) { return expf(a); }
static inline float __logf(float a) { return logf(a); }
static inline float __sinf(float a) { return sinf(a); }
static inline float __cosf(float a) { return cosf(a); }
static inline float __powf(float a, float b) { return powf(a, b); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
using std::isfinite;
using std::isinf;
using std::isnan;
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* atomics: one thread runs at a time */
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <class T> static inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline float2 make_float2(float x, float y) { float2 r = {x, y}; return r; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = {x, y, z, w}; return r; }
static inline int2 make_int2(int x, int y) { int2 r = {x, y}; return r; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 r = {x, y, z, w}; return r; }
static inline uint2 make_uint2(unsigned x, unsigned y) { uint2 r = {x, y}; return r; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 r = {x, y, z, w}; return r; }
static inline double2 make_double2(double x, double y) { double2 r = {x, y}; return r; }
} // namespace capex_emu_shim

/* ============================ kernel tables (generated) ============================ */
namespace capex_emu {
/* One kernel: its name and the thunks generated from its parameter types. */
struct kernel_entry {
    const char *name;
    size_t args_size;                                 /* bytes of the packed argument tuple */
    void (*pack)(void **params, void *out);           /* params[i] -> tuple (placement new) */
    void (*run)(const void *args);                    /* one CUDA thread: the kernel with a copy of the arguments */
    int (*pointers)(const void *args, uint64_t *out); /* the pointer-typed arguments' values */
    size_t param_bytes;                               /* the parameters as the CUDA ABI lays them out */
};
struct kernel_set { const char *source; const kernel_entry *k; size_t n; };

template <class T> static inline void put_ptr(const T &v, uint64_t *out, int &n) {
    if constexpr (std::is_pointer<T>::value) out[n++] = (uint64_t)(uintptr_t)(const void *)v;
}
template <auto F> struct thunk;
template <typename... A, void (*F)(A...)> struct thunk<F> {
    typedef std::tuple<typename std::decay<A>::type...> tup;
    template <size_t... I> static void pack_at(void **p, void *out, std::index_sequence<I...>) {
        new (out) tup(*(const typename std::decay<A>::type *)p[I]...);
    }
    static void pack(void **p, void *out) { pack_at(p, out, std::index_sequence_for<A...>{}); }
    static void run(const void *a) { std::apply(F, *(const tup *)a); }
    template <size_t... I> static int ptrs_at(const void *a, uint64_t *out, std::index_sequence<I...>) {
        int n = 0;
        const tup &t = *(const tup *)a;
        (void)t;
        (void)out;
        (put_ptr(std::get<I>(t), out, n), ...);
        return n;
    }
    static int pointers(const void *a, uint64_t *out) { return ptrs_at(a, out, std::index_sequence_for<A...>{}); }
    /* each parameter at its alignment, in order: what the image declares (EIATTR_CBANK_PARAM_SIZE) */
    static constexpr size_t param_bytes() {
        size_t off = 0;
        ((off = (off + alignof(typename std::decay<A>::type) - 1) / alignof(typename std::decay<A>::type) *
                    alignof(typename std::decay<A>::type) + sizeof(typename std::decay<A>::type)), ...);
        return off;
    }
    static_assert((std::is_trivially_copyable<typename std::decay<A>::type>::value && ...), "kernel arguments must be trivially copyable");
};
} // namespace capex_emu

#define CAPEX_EMU_ENTRY(ns, name)                                                                                   \
    {                                                                                                               \
        #name, sizeof(capex_emu::thunk<&ns::name>::tup), capex_emu::thunk<&ns::name>::pack,                         \
            capex_emu::thunk<&ns::name>::run, capex_emu::thunk<&ns::name>::pointers,                                \
            capex_emu::thunk<&ns::name>::param_bytes()                                                              \
    }

#include "kernels.inc"

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef __shared__
#undef __constant__
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __align__

/* ================================= the fibers ================================= */
extern "C" {
extern char __start_capex_emu_shared[] __attribute__((weak)), __stop_capex_emu_shared[] __attribute__((weak));
capex_emu_shim::dim3 capex_emu_threadIdx, capex_emu_blockIdx, capex_emu_blockDim, capex_emu_gridDim;
void *capex_emu_dyn_smem;
}

namespace {
enum { STACK = 128 * 1024, MAXT = 1024 };
enum { RUN, WAIT_BLOCK, WAIT_WARP, DONE };

#if EMU_ASM_SWITCH
/* callee-saved registers, MXCSR and x87 control word on the stack; rsp swapped */
extern "C" void capex_emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl capex_emu_switch\n"
    ".hidden capex_emu_switch\n"
    ".type capex_emu_switch,@function\n"
    "capex_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size capex_emu_switch, .-capex_emu_switch\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");
#endif

struct fiber {
    void *sp;
#if !EMU_ASM_SWITCH
    ucontext_t uc;
#endif
    char *stack;
    capex_emu_shim::dim3 tid;
    int lin, warp, lane, state;
    unsigned wait_gen, shfl_count;
};

struct barrier_state { int arrived, exited, size; unsigned gen, mask; };

struct engine {
    fiber f[MAXT];
    char *stacks = nullptr;
    void *sched_sp = nullptr;
#if !EMU_ASM_SWITCH
    ucontext_t sched_uc;
#endif
    fiber *cur = nullptr;
    int n = 0, done = 0;
    barrier_state block, warps[MAXT / 32];
    unsigned long long slots[2][MAXT];
    const capex_emu::kernel_entry *k = nullptr;
    const void *args = nullptr;
    long long clock = 0;
    int reverse = 0; /* CAPEX_EMU_ORDER=reverse: threads and blocks in reverse order */
    int bad_shfl = 0;
    char bad_shfl_msg[160];
};
engine *E; /* created on first launch; launches are serialised */

void fiber_main();
#if !EMU_ASM_SWITCH
void fiber_main_uc() { fiber_main(); }
#endif

void to_scheduler(fiber *f) {
#if EMU_ASM_SWITCH
    capex_emu_switch(&f->sp, E->sched_sp);
#else
    swapcontext(&f->uc, &E->sched_uc);
#endif
}

/* Opens a barrier. A shuffle's mask must name only lanes that exist and had
   not exited when the warp met (undefined on a GPU: reported). */
void release(barrier_state *s) {
    if (s != &E->block && s->mask) {
        int w = (int)(s - E->warps);
        for (int l = 0; l < 32 && !E->bad_shfl; l++)
            if ((s->mask >> l & 1u) && (w * 32 + l >= E->n || E->f[w * 32 + l].state == DONE)) {
                snprintf(E->bad_shfl_msg, sizeof E->bad_shfl_msg, "shuffle mask 0x%08x names lane %d of warp %d, which %s",
                         s->mask, l, w, w * 32 + l >= E->n ? "the block does not have" : "has exited");
                E->bad_shfl = 1;
            }
    }
    s->arrived = 0;
    s->gen++;
}

void fiber_main() {
    fiber *f = E->cur;
    E->k->run(E->args);
    f->state = DONE;
    E->done++;
    /* an exited thread no longer holds back its block's or warp's barrier */
    barrier_state *b[2] = {&E->block, &E->warps[f->warp]};
    for (barrier_state *s : b) {
        s->exited++;
        if (s->arrived > 0 && s->arrived + s->exited == s->size) release(s);
    }
    to_scheduler(f);
    abort(); /* never resumed */
}

void wait_at(barrier_state *s, int kind) {
    fiber *f = E->cur;
    if (++s->arrived + s->exited == s->size) { /* the last one releases the others and goes on */
        release(s);
        return;
    }
    f->state = kind;
    f->wait_gen = s->gen;
    to_scheduler(f);
}

/* Runs one block; 0, or -1 when live threads wait at barriers that can never open. */
int run_block(unsigned nthreads) {
    engine &e = *E;
    e.n = (int)nthreads;
    e.done = 0;
    e.block.arrived = e.block.exited = 0;
    e.block.size = e.n;
    for (int w = 0; w * 32 < e.n; w++) {
        e.warps[w].arrived = e.warps[w].exited = 0;
        e.warps[w].mask = 0;
        e.warps[w].size = std::min(32, e.n - w * 32);
    }
    for (int i = 0; i < e.n; i++) {
        fiber &f = e.f[i];
        unsigned bx = capex_emu_blockDim.x, by = capex_emu_blockDim.y;
        f.lin = i;
        f.warp = i / 32;
        f.lane = i % 32;
        f.tid.x = (unsigned)i % bx;
        f.tid.y = ((unsigned)i / bx) % by;
        f.tid.z = (unsigned)i / (bx * by);
        f.state = RUN;
        f.shfl_count = 0;
        f.stack = e.stacks + (size_t)i * (STACK + 4096) + 4096; /* guard page below */
#if EMU_ASM_SWITCH
        uintptr_t top = ((uintptr_t)(f.stack + STACK)) & ~(uintptr_t)15;
        void **sp = (void **)top;
        *--sp = nullptr;                        /* fake return address of fiber_main */
        *--sp = (void *)(uintptr_t)&fiber_main; /* capex_emu_switch returns here */
        for (int r = 0; r < 6; r++) *--sp = nullptr;
        --sp;
        uint32_t csr[2] = {0x1F80u, 0x037Fu};
        memcpy(sp, csr, 8);
        f.sp = sp;
#else
        getcontext(&f.uc);
        f.uc.uc_stack.ss_sp = f.stack;
        f.uc.uc_stack.ss_size = STACK;
        f.uc.uc_link = nullptr;
        makecontext(&f.uc, fiber_main_uc, 0);
#endif
    }
    while (e.done < e.n) {
        int progress = 0;
        for (int j = 0; j < e.n; j++) {
            fiber &f = e.f[e.reverse ? e.n - 1 - j : j];
            if (f.state == DONE) continue;
            if (f.state == WAIT_BLOCK && e.block.gen == f.wait_gen) continue;
            if (f.state == WAIT_WARP && e.warps[f.warp].gen == f.wait_gen) continue;
            f.state = RUN;
            capex_emu_threadIdx = f.tid;
            e.cur = &f;
            progress = 1;
#if EMU_ASM_SWITCH
            capex_emu_switch(&e.sched_sp, f.sp);
#else
            swapcontext(&e.sched_uc, &f.uc);
#endif
        }
        if (!progress) return -1;
    }
    return 0;
}
} // namespace

extern "C" void capex_emu_syncthreads(void) { wait_at(&E->block, WAIT_BLOCK); }
extern "C" void capex_emu_syncwarp(void) {
    E->warps[E->cur->warp].mask = 0;
    wait_at(&E->warps[E->cur->warp], WAIT_WARP);
}

/* Warp shuffle: every lane publishes its value, the warp meets, each reads its
   source lane's value. Two slot buffers alternate, so one rendezvous suffices:
   a lane writes buffer b again only after the next rendezvous, which every lane
   passes after its read of b. mode 0 idx, 1 up, 2 down, 3 xor. */
extern "C" unsigned long long capex_emu_shfl(unsigned long long v, int mode, int arg, int width, unsigned mask) {
    fiber *f = E->cur;
    unsigned buf = f->shfl_count++ & 1u;
    int lane = f->lane, seg, src;
    if (width <= 0 || width > 32 || (width & (width - 1))) width = 32;
    seg = lane & ~(width - 1);
    switch (mode) {
    case 0: src = seg + (arg & (width - 1)); break;
    case 1: src = (lane - seg) < arg ? lane : lane - arg; break;
    case 2: src = (lane - seg) + arg >= width ? lane : lane + arg; break;
    default: src = lane ^ arg; if (src >= seg + width) src = lane; break; /* later groups: own value (CUDA) */
    }
    E->slots[buf][f->lin] = v;
    E->warps[f->warp].mask = mask;
    wait_at(&E->warps[f->warp], WAIT_WARP);
    f = E->cur;

    int s = f->warp * 32 + src;
    return s < E->n ? E->slots[buf][s] : v;
}

/* A clock that moves 4096 "cycles" per read: spin loops end quickly. */
extern "C" long long capex_emu_clock64(void) { return E->clock += 4096; }

/* ============================ driver state ============================ */
namespace {
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
    INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_PTX = 218, INVALID_HANDLE = 400, ILLEGAL_STATE = 401,
    NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_ADDRESS = 700, LAUNCH_FAILED = 719, NOT_SUPPORTED = 801,
    CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901, CAPTURE_IMPLICIT = 906
};

std::mutex mu;       /* driver state */
std::mutex launch_mu; /* one launch at a time */
int inited, retained;
std::atomic<int> sticky{0};
thread_local void *current;
int the_ctx;

/* live allocations: user pointer -> (bytes, mapping, mapping bytes) */
struct alloc { size_t n; void *map; size_t map_n; };
std::map<CUdeviceptr, alloc> allocs;

size_t meminfo(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t kb = 0, klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':') { kb = (size_t)strtoull(line + klen + 1, nullptr, 10); break; }
    if (f) fclose(f);
    return kb * 1024;
}

/* The "device memory": the host's, at most CAPEX_EMU_MEMORY_GB (default 16) GiB,
   so that a test sized for a big GPU skips for memory instead of running for
   an hour on the CPU. Free = that minus live allocations, at most MemAvailable. */
size_t emu_total() {
    const char *e = getenv("CAPEX_EMU_MEMORY_GB");
    size_t cap = (size_t)16 << 30, t = meminfo("MemTotal");
    if (e && e[0]) cap = (size_t)(atof(e) * 1073741824.0);
    return t && t < cap ? t : cap;
}
size_t emu_used() {
    size_t u = 0;
    for (auto &a : allocs) u += a.second.n;
    return u;
}

/* 1 when [p, p+n) lies inside one live allocation (n 0: p inside or at its end). */
int in_bounds(CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> g(mu);
    auto it = allocs.upper_bound(p);
    if (it == allocs.begin()) return 0;
    --it;
    return p + n >= p && p + n <= it->first + it->second.n;
}

#define NEED_CTX()                                                                        \
    do {                                                                                  \
        if (!inited) return NOT_INITIALIZED;                                              \
        if (int s_ = sticky.load()) return s_;                                            \
        if (current != &the_ctx || !retained) return INVALID_CONTEXT;                     \
    } while (0)

/* ---- stream capture and graphs ---- */
struct op;
struct stream { int magic; unsigned flags; std::deque<op> *q; };
/* gen: records enqueued; done: the last that ran (lazy streams); rs: its stream */
struct event { int magic, timing, recorded; double t; stream *rs; unsigned long long gen, done, asked; };
struct op {
    int kind = 0; /* 0 kernel, 1 memset8, 2 memset32, 3 HtoD, 4 DtoH, 5 DtoD, 6 event record (n: its gen),
                     7 wait for event ev's record n on stream ws (lazy streams) */
    const capex_emu::kernel_entry *k = nullptr;
    unsigned g[3] = {0, 0, 0}, b[3] = {0, 0, 0}, shmem = 0;
    std::shared_ptr<unsigned char> args; /* packed kernel arguments, shared by graph copies */
    CUdeviceptr d = 0, s = 0;
    const void *hs = nullptr;
    void *hd = nullptr;
    size_t n = 0;
    unsigned v = 0;
    event *ev = nullptr;
    stream *ws = nullptr; /* kind 7: the stream that record n of ev was queued on */
};
struct graph { int magic; std::vector<op> ops; };
stream *capturing;      /* the stream being captured (global mode), or null */
int capture_invalid;
std::vector<op> captured;

/* A call that would synchronise or touch the legacy stream while a capture is on:
   the real driver refuses it and invalidates the capture. */
#define CAPTURE_GUARD(code)                                                    \
    do {                                                                       \
        if (capturing) { capture_invalid = 1; return (code); }                \
    } while (0)
/* An async call: recorded when on the capturing stream; on the legacy stream it is refused. */
int captured_here(void *s, CUresult *r) {
    if (!capturing) return 0;
    if (s == capturing) { *r = OK; return 1; }
    if (!s) { capture_invalid = 1; *r = CAPTURE_IMPLICIT; return 1; }
    return 0;
}

/* What went wrong, on stderr (CAPEX_EMU_QUIET=1: not, for tests that fault on purpose). */
void emu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void emu_log(const char *fmt, ...) {
    const char *q = getenv("CAPEX_EMU_QUIET");
    va_list ap;
    if (q && q[0] == '1') return;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

double now_ms() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- faults inside a kernel ---- */
thread_local sigjmp_buf *fault_jmp;
thread_local void *fault_addr;
void on_fault(int sig, siginfo_t *si, void *) {
    if (fault_jmp) {
        fault_addr = si->si_addr;
        siglongjmp(*fault_jmp, 1);
    }
    signal(sig, SIG_DFL); /* not ours: crash as usual */
}

/* vtag: a LayerNorm/RMSNorm variant's fixed switches (x, param, y dtype, rms) from
   the tag its image carries (capex_vnorm_X_P_Y_R, capex_cuda.h's norm text), or
   vtag[0] < 0: none. The text here is compiled without the variant's -D options,
   so a launch whose arguments differ from them would run the generic kernel and
   hide the mismatch: cuLaunchKernel refuses it instead. vtext: k is the
   variant's own text (compiled with its switches by tests/emu_gen.c). */
struct function { const capex_emu::kernel_entry *k; std::string name; int max_dyn_shmem; int vtag[4]; int vtext; };
struct module { std::vector<unsigned char> img; std::vector<std::unique_ptr<function>> funcs; };

/* The kernel called name whose parameters take param_bytes (the image's; < 0:
   unknown, the first of that name): the built-in kernels come in two sets,
   4 KB and 32 KB of launch metadata (tests/emu_gen.c). NULL when the sets
   differ for this name and none matches: running the other layout would give
   wrong values, not an error. */
const capex_emu::kernel_entry *find_kernel(const char *name, long param_bytes = -1) {
    const capex_emu::kernel_entry *first = nullptr;
    bool differ = false;
    for (const capex_emu::kernel_set &s : capex_emu_sets)
        for (size_t i = 0; i < s.n; i++)
            if (!strcmp(s.k[i].name, name)) {
                if (param_bytes < 0 || (long)s.k[i].param_bytes == param_bytes) return &s.k[i];
                if (!first) first = &s.k[i];
                else if (first->param_bytes != s.k[i].param_bytes) differ = true;
            }
    return differ ? nullptr : first;
}

/* Bytes of kernel parameters that kernel `name` takes in the image: a CUBIN's
   .nv.info.NAME EIATTR_CBANK_PARAM_SIZE (format 3, attribute 0x19), a PTX
   .entry's .param list laid out at each one's alignment; -1: not found. */
long cubin_param_bytes(const unsigned char *p, size_t n, const char *name) {
    uint64_t shoff, stroff;
    uint16_t shentsize, shnum, shstrndx;
    std::string want = std::string(".nv.info.") + name;
    memcpy(&shoff, p + 40, 8);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    memcpy(&shstrndx, p + 62, 2);
    if (shstrndx >= shnum || shoff + (uint64_t)shentsize * shnum > n) return -1;
    memcpy(&stroff, p + shoff + (uint64_t)shstrndx * shentsize + 24, 8);
    for (unsigned i = 0; i < shnum; i++) {
        const unsigned char *h = p + shoff + (uint64_t)i * shentsize;
        uint32_t nm;
        uint64_t off, sz;
        memcpy(&nm, h, 4);
        memcpy(&off, h + 24, 8);
        memcpy(&sz, h + 32, 8);
        if (stroff + nm >= n || off + sz > n || strncmp((const char *)p + stroff + nm, want.c_str(), n - stroff - nm) != 0)
            continue;
        for (const unsigned char *q = p + off, *e = q + sz; q + 4 <= e;) {
            uint16_t v;
            memcpy(&v, q + 2, 2);
            if (q[0] == 3 && q[1] == 0x19) return v;
            q += q[0] == 4 ? 4u + v : 4u; /* EIFMT_SVAL: u16 size, then the data; the others: 4 bytes */
        }
        return -1;
    }
    return -1;
}
long ptx_param_bytes(const char *t, const char *name) {
    std::string key = std::string(".entry ") + name + "(";
    const char *p = strstr(t, key.c_str()), *end;
    long off = 0;
    if (!p) return -1;
    p += key.size();
    if (!(end = strchr(p, ')'))) return -1;
    while (p < end) {
        const char *c = (const char *)memchr(p, ',', (size_t)(end - p)), *stop = c ? c : end;
        std::string item(p, stop);
        static const struct { const char *t; long size; } types[] = {
            {".b8", 1}, {".u8", 1}, {".s8", 1}, {".b16", 2}, {".u16", 2}, {".s16", 2}, {".f16", 2}, {".b32", 4}, {".u32", 4},
            {".s32", 4}, {".f32", 4}, {".b64", 8}, {".u64", 8}, {".s64", 8}, {".f64", 8}};
        long size = 0, align = 0;
        for (const auto &ty : types) {
            size_t at = item.find(std::string(ty.t) + " ");
            if (at != std::string::npos) { size = ty.size; break; }
        }
        if (size == 0) return -1;
        size_t br = item.find('[');
        if (br != std::string::npos) { /* .param .align N .b8 name[COUNT] */
            size_t al = item.find(".align ");
            align = al != std::string::npos ? atol(item.c_str() + al + 7) : size;
            size *= atol(item.c_str() + br + 1);
        } else {
            align = size; /* a scalar (a pointer's ".ptr .align" is its target's) */
        }
        if (align <= 0) return -1;
        off = (off + align - 1) / align * align + size;
        p = stop + 1;
    }
    return off;
}
long image_param_bytes(const std::vector<unsigned char> &img, const char *name) {
    if (img.size() >= 64 && !memcmp(img.data(), "\177ELF", 4)) return cubin_param_bytes(img.data(), img.size(), name);
    return ptx_param_bytes((const char *)img.data(), name);
}

/* The blocks of a grid; a fault (SIGSEGV/SIGBUS) lands back here. Plain data
   only between sigsetjmp and siglongjmp. */
int guarded_grid(const unsigned g[3], const unsigned b[3], size_t dyn_n) {
    sigjmp_buf jb;
    volatile int failed = 0;
    volatile unsigned bz = 0, by = 0, bx = 0;
    if (sigsetjmp(jb, 1) == 0) {
        fault_jmp = &jb;
        for (bz = 0; bz < g[2] && !failed; bz++)
            for (by = 0; by < g[1] && !failed; by++)
                for (bx = 0; bx < g[0] && !failed; bx++) {
                    memset(capex_emu_dyn_smem, 0xFF, dyn_n);
                    if (__start_capex_emu_shared)
                        memset(__start_capex_emu_shared, 0xFF, (size_t)(__stop_capex_emu_shared - __start_capex_emu_shared));
                    if (E->reverse) capex_emu_blockIdx = {g[0] - 1 - bx, g[1] - 1 - by, g[2] - 1 - bz};
                    else capex_emu_blockIdx = {bx, by, bz};
                    if (run_block(b[0] * b[1] * b[2]) != 0) {
                        emu_log("capex emu: %s: block (%u,%u,%u): threads wait at a barrier that not every live "
                                "thread of the block (or warp) reaches\n", E->k->name, capex_emu_blockIdx.x, capex_emu_blockIdx.y, capex_emu_blockIdx.z);
                        failed = LAUNCH_FAILED;
                    }
                }
    } else {
        emu_log("capex emu: %s: block (%u,%u,%u) thread (%u,%u,%u): access to unmapped address %p\n", E->k->name,
                capex_emu_blockIdx.x, capex_emu_blockIdx.y, capex_emu_blockIdx.z, capex_emu_threadIdx.x,
                capex_emu_threadIdx.y, capex_emu_threadIdx.z, fault_addr);
        failed = ILLEGAL_ADDRESS;
    }
    fault_jmp = nullptr;
    return failed;
}

/* Runs a grid with packed arguments. Returns OK, or sets the sticky error like a fault. */
CUresult run_grid(const capex_emu::kernel_entry *k, const unsigned g[3], const unsigned b[3], unsigned shmem,
                  const void *args) {
    uint64_t ptrs[256];
    int np = k->pointers(args, ptrs);
    for (int i = 0; i < np; i++)
        if (ptrs[i] && !in_bounds(ptrs[i], 0)) {
            emu_log("capex emu: %s: pointer argument %d (0x%llx) is outside every live allocation\n", k->name, i,
                    (unsigned long long)ptrs[i]);
            sticky = ILLEGAL_ADDRESS;
            return OK; /* like a real fault: reported by the next call */
        }
    std::lock_guard<std::mutex> lg(launch_mu);
    if (!E) {
        E = new engine();
        E->stacks = (char *)mmap(nullptr, (size_t)MAXT * (STACK + 4096), PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (E->stacks == MAP_FAILED) { delete E; E = nullptr; return OUT_OF_MEMORY; }
        for (int i = 0; i < MAXT; i++) mprotect(E->stacks + (size_t)i * (STACK + 4096), 4096, PROT_NONE);
        const char *order = getenv("CAPEX_EMU_ORDER");
        E->reverse = order && !strcmp(order, "reverse");
    }
    std::vector<unsigned char> dyn(shmem ? shmem : 1); /* poisoned per block below */
    capex_emu_dyn_smem = dyn.data();
    capex_emu_blockDim = {b[0], b[1], b[2]};
    capex_emu_gridDim = {g[0], g[1], g[2]};
    E->k = k;
    E->args = args;
    /* faults: SIGSEGV/SIGBUS while the kernel runs end the launch with ILLEGAL_ADDRESS */
    struct sigaction sa, old_segv, old_bus;
    stack_t alt, old_alt;
    std::vector<char> altmem(64 * 1024);
    alt.ss_sp = altmem.data();
    alt.ss_size = altmem.size();
    alt.ss_flags = 0;
    sigaltstack(&alt, &old_alt);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    E->bad_shfl = 0;
    int failed = guarded_grid(g, b, dyn.size());
    if (!failed && E->bad_shfl) {
        emu_log("capex emu: %s: %s\n", k->name, E->bad_shfl_msg);
        failed = LAUNCH_FAILED;
    }
    fault_jmp = nullptr;
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaltstack(&old_alt, nullptr);
    capex_emu_dyn_smem = nullptr;
    if (failed) sticky = failed;
    return OK;
}

/* The bounds (and alignment) a copy or memset faults on: run_op checks them, and
   lazy streams at the call, as the driver does, before queueing. */
CUresult check_op(const op &o) {
    switch (o.kind) {
    case 1: return in_bounds(o.d, o.n) ? OK : INVALID_VALUE;
    case 2: return !(o.d & 3) && in_bounds(o.d, o.n * 4) ? OK : INVALID_VALUE;
    case 3: return in_bounds(o.d, o.n) ? OK : INVALID_VALUE;
    case 4: return in_bounds(o.s, o.n) ? OK : INVALID_VALUE;
    case 5: return in_bounds(o.d, o.n) && in_bounds(o.s, o.n) ? OK : INVALID_VALUE;
    }
    return OK;
}

CUresult run_op(const op &o) {
    CUresult r = check_op(o);
    if (r != OK) return r;
    switch (o.kind) {
    case 0: return run_grid(o.k, o.g, o.b, o.shmem, o.args.get());
    case 1: memset((void *)(uintptr_t)o.d, (int)o.v, o.n); return OK;
    case 2: for (size_t i = 0; i < o.n; i++) memcpy((unsigned char *)(uintptr_t)o.d + 4 * i, &o.v, 4); return OK;
    case 3: memcpy((void *)(uintptr_t)o.d, o.hs, o.n); return OK;
    case 4: memcpy(o.hd, (const void *)(uintptr_t)o.s, o.n); return OK;
    case 5: memmove((void *)(uintptr_t)o.d, (const void *)(uintptr_t)o.s, o.n); return OK;
    case 6: /* an older record (re-recorded on another stream) that runs late does not undo a newer one */
        if (!o.n || o.n > o.ev->done) { o.ev->t = now_ms(); o.ev->recorded = 1; if (o.n) o.ev->done = o.n; }
        return OK;
    case 7: return OK; /* run_lazy_op drains the recording stream first */
    }
    return INVALID_VALUE;
}

/* ---- CAPEX_EMU_STREAMS=lazy: per-stream queues (see the top of the file) ---- */
int lazy_streams() {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CAPEX_EMU_STREAMS");
        v = e && (!strcmp(e, "lazy") || !strcmp(e, "ahead"));
    }
    return v;
}
/* CAPEX_EMU_STREAMS=ahead: lazy streams that run ahead (host_wait_record). */
int ahead_streams() {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CAPEX_EMU_STREAMS");
        v = e && !strcmp(e, "ahead");
    }
    return v;
}
std::recursive_mutex qmu; /* the queues; held while draining (one drain at a time) */
std::vector<stream *> live_streams;
CUresult drain(stream *s, const event *until, unsigned long long gen);
/* Runs stream w up to record gen of ev, if that record still waits there. Per
   record, not per event: a wait queued before ev was recorded again (on
   another stream) still waits for the record it saw. */
void run_record(const event *ev, stream *w, unsigned long long gen) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    if (!w || !gen || std::find(live_streams.begin(), live_streams.end(), w) == live_streams.end()) return;
    for (const op &o : *w->q)
        if (o.kind == 6 && o.ev == ev && o.n == gen) { drain(w, ev, gen); return; }
}
/* Runs what ev's latest record waits for (its synchronize, query, a wait on the legacy stream). */
void run_latest_record(const event *ev) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    run_record(ev, ev->rs, ev->gen);
}
/* A host wait on ev: under CAPEX_EMU_STREAMS=ahead the other streams' queued
   work first, and a query of a record still queued says NOT_READY once
   (a poll's first look finds the GPU busy) before it runs it. */
CUresult host_wait_record(event *ev, int query) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    if (ahead_streams()) {
        for (size_t i = 0; i < live_streams.size(); i++)
            if (live_streams[i] != ev->rs) drain(live_streams[i], nullptr, 0);
        if (query && ev->done < ev->gen && ev->asked != ev->gen) {
            ev->asked = ev->gen;
            return NOT_READY;
        }
    }
    run_latest_record(ev);
    return OK;
}
CUresult run_lazy_op(const op &o) {
    if (o.kind == 7) { run_record(o.ev, o.ws, o.n); return OK; }
    return run_op(o);
}
/* Destroyed events (lazy): freed once no queued record or wait refers to them. */
std::vector<event *> dead_events;
void reap_events() {
    std::lock_guard<std::recursive_mutex> g(qmu);
    auto used = [](const event *ev) {
        for (const stream *s : live_streams)
            for (const op &o : *s->q)
                if ((o.kind == 6 || o.kind == 7) && o.ev == ev) return true;
        return false;
    };
    for (size_t i = 0; i < dead_events.size();)
        if (!used(dead_events[i])) { delete dead_events[i]; dead_events[i] = dead_events.back(); dead_events.pop_back(); }
        else i++;
}
/* Runs s's queue in order, through event until's record gen (until NULL: all). An
   error becomes the context's sticky error, like a fault in async work, and
   the rest of the queue is dropped. */
CUresult drain(stream *s, const event *until, unsigned long long gen) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    while (!s->q->empty()) {
        op o = s->q->front();
        s->q->pop_front();
        CUresult r = sticky ? OK : run_lazy_op(o);
        if (r != OK && !sticky) sticky = r;
        if (until && o.kind == 6 && o.ev == until && o.n == gen) break;
    }
    return OK;
}
void drain_all(int blocking_only) {
    std::lock_guard<std::recursive_mutex> g(qmu);
    for (bool again = true; again;) { /* a wait drains other streams, so until all are empty */
        again = false;
        for (stream *s : live_streams)
            if ((!blocking_only || s->flags == 0) && !s->q->empty()) { drain(s, nullptr, 0); again = true; }
    }
}
/* Work on the legacy stream: after the blocking streams' work, done now. */
CUresult run_legacy(const op &o) {
    if (lazy_streams()) drain_all(1);
    return run_op(o);
}

/* An async operation: recorded while its stream is captured; lazy: queued on
   its stream (the legacy stream: run_legacy); else done now. */
CUresult submit(const op &o, void *s) {
    CUresult r;
    if (captured_here(s, &r)) {
        if (r == OK) captured.push_back(o);
        return r;
    }
    if (lazy_streams() && s) {
        std::lock_guard<std::recursive_mutex> g(qmu);
        stream *st = (stream *)s;
        if ((r = check_op(o)) != OK) return r;
        if (o.kind == 4) { /* into pageable memory: returns when done, with the error of the work it waited for */
            drain(st, nullptr, 0);
            return sticky ? sticky.load() : run_op(o);
        }
        if (o.kind == 3) { /* from pageable memory: the data as it is now */
            op c = o;
            unsigned char *b = (unsigned char *)malloc(o.n ? o.n : 1);
            if (!b) return OUT_OF_MEMORY;
            memcpy(b, o.hs, o.n);
            c.args = std::shared_ptr<unsigned char>(b, free);
            c.hs = b;
            st->q->push_back(c);
            return OK;
        }
        st->q->push_back(o);
        return OK;
    }
    return s ? run_op(o) : run_legacy(o);
}
op make_op(int kind) { op o; o.kind = kind; return o; }
} // namespace

/* ================================ the driver API ================================ */
EMU_API CUresult cuInit(unsigned flags) {
    if (flags) return INVALID_VALUE;
    inited = 1;
    return OK;
}
/* The device's shape, from the environment (the multi-tensor grids are sized
   from it: tests/emu.mk runs the GPU tests with few SMs and with many):
   CAPEX_EMU_SMS (default 4), CAPEX_EMU_OCCUPANCY (resident blocks per SM;
   default 2048 threads / block size; 0: cuOccupancyMaxActiveBlocksPerMultiprocessor
   fails, as without the symbol), CAPEX_EMU_DRIVER_VERSION (default 13000),
   CAPEX_EMU_CC (compute capability, default 90). Launches over 4096 bytes of
   parameters fail with CUDA_ERROR_INVALID_VALUE below driver 12010 or cc 70,
   as on a real driver (CUDA 12.1 raised the limit to 32764 on Volta and newer). */
namespace {
int env_int(const char *name, int dflt, int lo, int hi) {
    const char *e = getenv(name);
    char *end;
    long v;
    if (!e || !e[0]) return dflt;
    v = strtol(e, &end, 10);
    return *end || v < lo || v > hi ? dflt : (int)v;
}
int emu_driver_version() { return env_int("CAPEX_EMU_DRIVER_VERSION", 13000, 1000, 99999); }
int emu_cc() { return env_int("CAPEX_EMU_CC", 90, 30, 199); }
} // namespace
EMU_API CUresult cuDriverGetVersion(int *v) {
    if (!v) return INVALID_VALUE;
    *v = emu_driver_version();
    return OK;
}

namespace {
static const struct { int code; const char *name, *text; } err_table[] = {
    {OK, "CUDA_SUCCESS", "no error"}, {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
};
} // namespace
EMU_API CUresult cuGetErrorName(CUresult r, const char **s) {
    for (const auto &e : err_table)
        if (e.code == r) { *s = e.name; return OK; }
    *s = nullptr;
    return INVALID_VALUE;
}
EMU_API CUresult cuGetErrorString(CUresult r, const char **s) {
    for (const auto &e : err_table)
        if (e.code == r) { *s = e.text; return OK; }
    *s = nullptr;
    return INVALID_VALUE;
}

EMU_API CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 1; return OK; }
EMU_API CUresult cuDeviceGet(int *d, int ordinal) {
    if (!inited) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
EMU_API CUresult cuDeviceGetName(char *name, int len, int dev) {
    if (dev != 0 || len < 2) return INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", "capex CPU emulator (not a GPU)");
    return OK;
}
EMU_API CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (dev != 0) return INVALID_DEVICE;
    switch (attr) {
    case 75: *v = emu_cc() / 10; return OK; /* default 9.0: NVRTC builds a real sm_90 CUBIN */
    case 76: *v = emu_cc() % 10; return OK;
    case 16: *v = env_int("CAPEX_EMU_SMS", 4, 1, 1024); return OK; /* SMs: few by default, so grid-stride loops take several passes */
    case 36: *v = 1000000; return OK; /* "memory clock" and "bus width": a nominal 16 GB/s */
    case 37: *v = 64; return OK;
    }
    return INVALID_VALUE;
}
EMU_API CUresult cuDeviceTotalMem_v2(size_t *b, int dev) {
    if (dev != 0) return INVALID_DEVICE;
    *b = emu_total();
    return OK;
}
EMU_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (!inited) return NOT_INITIALIZED;
    if (dev != 0) return INVALID_DEVICE;
    std::lock_guard<std::mutex> g(mu);
    retained++;
    *ctx = &the_ctx;
    return OK;
}
EMU_API CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev != 0) return INVALID_DEVICE;
    std::lock_guard<std::mutex> g(mu);
    if (retained == 0) return INVALID_CONTEXT;
    retained--;
    return OK;
}
EMU_API CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }
EMU_API CUresult cuCtxSetCurrent(void *ctx) { if (ctx && ctx != &the_ctx) return INVALID_CONTEXT; current = ctx; return OK; }
EMU_API CUresult cuCtxSynchronize(void) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    if (lazy_streams()) drain_all(0);
    return sticky.load();
}

/* Failure injection, for tests: CAPEX_EMU_FAIL_ALLOC, CAPEX_EMU_FAIL_EVENT,
   CAPEX_EMU_FAIL_MODULE = n: from the first call that sees the variable set,
   n calls succeed and every later one fails with CUDA_ERROR_OUT_OF_MEMORY
   (cuMemAlloc_v2, cuEventCreate, cuModuleLoadDataEx), as on a device out of
   memory. Read at every call, so a forked rank sets it for itself alone;
   unset, the count starts over. */
namespace {
std::atomic<long> fail_alloc_n{-1}, fail_event_n{-1}, fail_module_n{-1};
int injected_failure(const char *name, std::atomic<long> &count) {
    const char *e = getenv(name);
    if (!e || !e[0]) { count.store(-1); return 0; }
    long n = strtol(e, nullptr, 10), none = -1;
    count.compare_exchange_strong(none, 0);
    return count.fetch_add(1) >= n;
}
} // namespace

/* Device memory: mmap'd, 256-byte aligned, ending at a PROT_NONE guard page. */
EMU_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    if (n == 0) return INVALID_VALUE;
    if (injected_failure("CAPEX_EMU_FAIL_ALLOC", fail_alloc_n)) return OUT_OF_MEMORY;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    {
        std::lock_guard<std::mutex> g(mu);
        if (n > emu_total() || emu_used() + n > emu_total()) return OUT_OF_MEMORY;
    }
    size_t body = (n + 255) & ~(size_t)255, map_n = ((body + page - 1) / page + 2) * page;
    void *m = mmap(nullptr, map_n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    unsigned char *guard = (unsigned char *)m + map_n - page;
    mprotect(guard, page, PROT_NONE);
    mprotect(m, page, PROT_NONE); /* and one below */
    unsigned char *user = guard - body;
    memset(user, 0xA5, n); /* cudaMalloc memory is not zeroed */
    std::lock_guard<std::mutex> g(mu);
    allocs[(CUdeviceptr)(uintptr_t)user] = alloc{n, m, map_n};
    *p = (CUdeviceptr)(uintptr_t)user;
    return OK;
}
EMU_API CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    if (lazy_streams()) drain_all(0); /* cuMemFree waits for the device */
    std::lock_guard<std::mutex> g(mu);
    auto it = allocs.find(p);
    if (it == allocs.end()) return INVALID_VALUE;
    munmap(it->second.map, it->second.map_n);
    allocs.erase(it);
    return OK;
}
EMU_API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    NEED_CTX();
    std::lock_guard<std::mutex> g(mu);
    size_t total = emu_total(), used = emu_used(), avail = meminfo("MemAvailable");
    *t = total;
    *f = used < total ? total - used : 0;
    if (avail && *f > avail) *f = avail;
    return OK;
}

EMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    op o = make_op(3); o.d = d; o.hs = s; o.n = n;
    return run_legacy(o);
}
EMU_API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    op o = make_op(4); o.hd = d; o.s = s; o.n = n;
    return run_legacy(o);
}
EMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    op o = make_op(5); o.d = d; o.s = s; o.n = n;
    return run_legacy(o);
}
EMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
    NEED_CTX();
    op o = make_op(3); o.d = d; o.hs = s; o.n = n;
    return submit(o, st);
}
EMU_API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
    NEED_CTX();
    op o = make_op(4); o.hd = d; o.s = s; o.n = n;
    return submit(o, st);
}
EMU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
    NEED_CTX();
    op o = make_op(5); o.d = d; o.s = s; o.n = n;
    return submit(o, st);
}
EMU_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    op o = make_op(1); o.d = d; o.v = v; o.n = n;
    return run_legacy(o);
}
EMU_API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) {
    NEED_CTX();
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    op o = make_op(2); o.d = d; o.v = v; o.n = n;
    return run_legacy(o);
}
EMU_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) {
    NEED_CTX();
    op o = make_op(1); o.d = d; o.v = v; o.n = n;
    return submit(o, s);
}
EMU_API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s) {
    NEED_CTX();
    op o = make_op(2); o.d = d; o.v = v; o.n = n;
    return submit(o, s);
}

/* streams: work runs at the call */
EMU_API CUresult cuStreamCreate(void **s, unsigned flags) {
    NEED_CTX();
    if (flags > 1) return INVALID_VALUE;
    stream *p = new stream;
    p->magic = 0x5743;
    p->flags = flags;
    p->q = new std::deque<op>;
    {
        std::lock_guard<std::recursive_mutex> g(qmu);
        live_streams.push_back(p);
    }
    *s = p;
    return OK;
}
EMU_API CUresult cuStreamDestroy_v2(void *s) {
    NEED_CTX();
    if (!s || ((stream *)s)->magic != 0x5743) return INVALID_HANDLE;
    if (s == capturing) return ILLEGAL_STATE;
    {
        std::lock_guard<std::recursive_mutex> g(qmu);
        drain((stream *)s, nullptr, 0); /* its own work (and what it waits for), no other stream's */
        live_streams.erase(std::find(live_streams.begin(), live_streams.end(), (stream *)s));
    }
    ((stream *)s)->magic = 0;
    delete ((stream *)s)->q;
    delete (stream *)s;
    return OK;
}
EMU_API CUresult cuStreamSynchronize(void *s) {
    NEED_CTX();
    if (s && ((stream *)s)->magic != 0x5743) return INVALID_HANDLE;
    if (capturing && (s == capturing || !s)) { capture_invalid = 1; return CAPTURE_UNSUPPORTED; }
    if (lazy_streams()) {
        if (s) drain((stream *)s, nullptr, 0);
        else drain_all(1);
    }
    return sticky.load();
}
EMU_API CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) {
    NEED_CTX();
    (void)f;
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    if (capturing && !s) { capture_invalid = 1; return CAPTURE_IMPLICIT; }
    if (lazy_streams() && !(capturing && s == capturing)) {
        event *ev = (event *)e;
        std::lock_guard<std::recursive_mutex> g(qmu);
        if (!s) { run_latest_record(ev); return OK; }
        op o = make_op(7);
        o.ev = ev;
        o.n = ev->gen;
        o.ws = ev->rs;
        ((stream *)s)->q->push_back(o);
    }
    return OK;
}
EMU_API CUresult cuEventCreate(void **e, unsigned flags) {
    NEED_CTX();
    if (injected_failure("CAPEX_EMU_FAIL_EVENT", fail_event_n)) return OUT_OF_MEMORY;
    event *p = new event();
    p->magic = 0xE7;
    p->timing = !(flags & 2u);
    *e = p;
    return OK;
}
EMU_API CUresult cuEventDestroy_v2(void *e) {
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    ((event *)e)->magic = 0;
    if (lazy_streams()) { /* runs nothing, as on a GPU: queued records and waits keep it until they ran */
        std::lock_guard<std::recursive_mutex> g(qmu);
        dead_events.push_back((event *)e);
        reap_events();
        return OK;
    }
    delete (event *)e;
    return OK;
}
EMU_API CUresult cuEventRecord(void *e, void *s) {
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    op o = make_op(6);
    o.ev = (event *)e;
    if (!capturing || (s && s != capturing)) { /* a captured record is replayed later, outside this count */
        std::lock_guard<std::recursive_mutex> g(qmu);
        o.n = ++o.ev->gen;
        o.ev->rs = (stream *)s;
    }
    return submit(o, s);
}
EMU_API CUresult cuEventSynchronize(void *e) {
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    if (lazy_streams()) host_wait_record((event *)e, 0);
    return sticky.load();
}
EMU_API CUresult cuEventQuery(void *e) {
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    CAPTURE_GUARD(CAPTURE_UNSUPPORTED);
    /* work is synchronous: a recorded event is complete; lazy: a query runs what
       the record waits for (a poll loop makes progress), and reports its failure */
    if (lazy_streams() && host_wait_record((event *)e, 1) != OK && !sticky) return NOT_READY;
    return sticky.load();
}
EMU_API CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    event *x = (event *)a, *y = (event *)b;
    NEED_CTX();
    if (!x || !y || x->magic != 0xE7 || y->magic != 0xE7 || !x->timing || !y->timing || (!x->recorded && !x->gen) ||
        (!y->recorded && !y->gen))
        return INVALID_HANDLE; /* never recorded; recorded but still queued (lazy) is NOT_READY */
    std::lock_guard<std::recursive_mutex> g(qmu);
    if (x->done < x->gen || y->done < y->gen) return NOT_READY;
    *ms = (float)(y->t - x->t);
    return OK;
}
EMU_API CUresult cuEventElapsedTime(float *ms, void *a, void *b) { return cuEventElapsedTime_v2(ms, a, b); }

/* modules: the real NVRTC image is checked and kept; kernels come from the tables */
EMU_API CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n_opts, int *opts, void **vals) {
    const unsigned char *p = (const unsigned char *)img;
    size_t n;
    int bad_ptx = 0;
    (void)n_opts; (void)opts; (void)vals;
    NEED_CTX();
    if (!img) return INVALID_VALUE;
    if (injected_failure("CAPEX_EMU_FAIL_MODULE", fail_module_n)) return OUT_OF_MEMORY;
    n = cuda_image_size(p, &bad_ptx);
    if (!n) return bad_ptx ? INVALID_PTX : INVALID_IMAGE;
    module *mod = new module;
    mod->img.assign(p, p + n);
    *m = mod;
    return OK;
}
EMU_API CUresult cuModuleUnload(void *m) {
    NEED_CTX();
    if (!m) return INVALID_HANDLE;
    if (lazy_streams()) drain_all(0);
    delete (module *)m;
    return OK;
}
/* The norm variant tag in m's image (see struct function): 1 and its four
   values (dtypes 0..2, rms 0..1), 0 when there is none, -1 when the prefix is
   there but the rest is not a tag (the launches are then refused, not run
   unchecked). */
static int image_vtag(const module *m, int v[4]) {
    static const char pre[] = "capex_vnorm_";
    const unsigned char *p = m->img.data();
    size_t n = m->img.size(), k = sizeof pre - 1;
    int found = 0;
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(p + i, pre, k)) {
            const unsigned char *q = p + i + k;
            int j;
            found = -1;
            if (i + k + 8 > n) continue; /* 7 characters and the end of the name */
            for (j = 0; j < 4 && q[2 * j] >= '0' && q[2 * j] <= (j == 3 ? '1' : '2') && (j == 3 || q[2 * j + 1] == '_'); j++)
                v[j] = q[2 * j] - '0';
            if (j == 4 && !isalnum(q[7]) && q[7] != '_') return 1;
        }
    return found;
}
static int image_has(const module *m, const char *name) {
    size_t k = strlen(name);
    const unsigned char *p = m->img.data();
    size_t n = m->img.size();
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(p + i, name, k) && (i == 0 || p[i - 1] == '\0' || p[i - 1] == ' ' || p[i - 1] == '\t') &&
            (i + k == n || p[i + k] == '\0' || p[i + k] == '(' || p[i + k] == '\n' || p[i + k] == ' '))
            return 1;
    return 0;
}
EMU_API CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    NEED_CTX();
    if (!m || !name) return INVALID_VALUE;
    module *mod = (module *)m;
    if (!image_has(mod, name)) return NOT_FOUND;
    std::lock_guard<std::mutex> g(mu);
    for (auto &fn : mod->funcs)
        if (fn->name == name) { *f = fn.get(); return OK; }
    /* found in the image but maybe not compiled into the emulator: launching it says so */
    mod->funcs.emplace_back(new function{find_kernel(name, image_param_bytes(mod->img, name)), name, 0, {-1, -1, -1, -1}, 0});
    function *fn = mod->funcs.back().get();
    int tag = image_vtag(mod, fn->vtag);
    if (tag < 0) {
        emu_log("capex emu: %s: the image has a norm variant tag the emulator cannot read\n", name);
        fn->k = nullptr; /* launching it fails */
    }
    if (tag <= 0) fn->vtag[0] = -1;
    else { /* the variant's own text where tests/emu_gen.c compiled it with the same -D switches */
        char label[32];
        snprintf(label, sizeof label, "vnorm_%d_%d_%d_%d", fn->vtag[0], fn->vtag[1], fn->vtag[2], fn->vtag[3]);
        for (const capex_emu::kernel_set &s : capex_emu_sets)
            for (size_t i = 0; i < s.n && !strcmp(s.source, label); i++)
                if (!strcmp(s.k[i].name, name)) { fn->k = &s.k[i]; fn->vtext = 1; }
    }
    *f = mod->funcs.back().get();
    return OK;
}
EMU_API CUresult cuFuncSetAttribute(void *f, int attr, int v) {
    NEED_CTX();
    if (!f || attr != 8 || v < 0 || v > 227 * 1024) return INVALID_VALUE;
    ((function *)f)->max_dyn_shmem = v;
    return OK;
}

/* Attributes capex asks for: the shared memory opt-in (8) as set;
   CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (3) is 0 (no
   spills here) unless CAPEX_EMU_LOCAL_KERNEL names the kernel (then 16: as if
   ptxas had spilled it; tests capex's refusal of spilling variants). */
EMU_API CUresult cuFuncGetAttribute(int *v, int attr, void *fn) {
    const char *spill = getenv("CAPEX_EMU_LOCAL_KERNEL");
    NEED_CTX();
    if (!v || !fn) return INVALID_VALUE;
    if (attr == 8) { /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, as set */
        *v = ((function *)fn)->max_dyn_shmem;
        return OK;
    }
    if (attr != 3) return NOT_SUPPORTED;
    *v = spill && ((function *)fn)->name == spill ? 16 : 0;
    return OK;
}

EMU_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *fn, int block, size_t dyn_smem) {
    int occ = env_int("CAPEX_EMU_OCCUPANCY", -1, 0, 64);
    NEED_CTX();
    if (!n || !fn || block <= 0 || block > 1024) return INVALID_VALUE;
    (void)dyn_smem;
    if (occ == 0) return NOT_SUPPORTED;
    *n = occ > 0 ? occ : 2048 / block;
    return OK;
}

/* Launches whose arguments were checked against a variant tag, and of those the
   ones that ran the variant's own text (capex_emu_vtag_checks). */
static std::atomic<int> vtag_checks{0}, vtag_runs{0};
/* A launch of a tagged variant: its int arguments x dtype, param dtype, y (dy)
   dtype and rms must equal the tag's values (parameter positions of each norm
   kernel, -1: it has no such argument). 0 when they do. */
static int vtag_mismatch(const function *f, void **params) {
    static const struct { const char *name; int at[4]; } pos[] = {
        {"capex_norm_fwd", {1, 4, 6, 12}}, {"capex_norm_bwd_dx", {1, 5, 3, 11}},
        {"capex_norm_bwd_gamma_part", {1, -1, 3, 11}}, {"capex_norm_bwd_gamma_final", {-1, 6, -1, -1}},
        {"capex_norm_me_dx", {8, 5, 1, 11}}, {"capex_norm_me_gamma_part", {-1, 5, 1, -1}}};
    for (const auto &e : pos)
        if (f->name == e.name) {
            for (int j = 0; j < 4; j++)
                if (e.at[j] >= 0 && *(const int *)params[e.at[j]] != f->vtag[j]) {
                    emu_log("capex emu: %s launched with switch %d = %d, but its variant's image fixes %d\n", f->name.c_str(), j,
                            *(const int *)params[e.at[j]], f->vtag[j]);
                    return 1;
                }
            vtag_checks++;
            if (f->vtext) vtag_runs++;
            return 0;
        }
    emu_log("capex emu: %s is in a norm variant's image, but the emulator does not know its switch arguments\n", f->name.c_str());
    return 1;
}

EMU_API CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned shmem, void *st, void **params, void **extra) {
    function *f = (function *)fn;
    NEED_CTX();
    if (!f || extra) return INVALID_VALUE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024 || bx > 1024 || by > 1024 ||
        bz > 64 || gx > 0x7fffffffu || gy > 65535 || gz > 65535)
        return INVALID_VALUE;
    if (shmem > 48u * 1024u && (int)shmem > f->max_dyn_shmem) return INVALID_VALUE;
    if (!f->k) {
        emu_log("capex emu: kernel %s is not compiled into the emulator: add its source file to "
                "EMU_KERNEL_SOURCES (tests/emu.mk)\n", f->name.c_str());
        return NOT_SUPPORTED;
    }
    if (!params && f->k->args_size > 1) return INVALID_VALUE;
    if (f->vtag[0] >= 0 && vtag_mismatch(f, params)) return INVALID_VALUE;
    if (f->k->param_bytes > 4096 && (emu_driver_version() < 12010 || emu_cc() < 70)) return INVALID_VALUE;
    op o = make_op(0);
    o.k = f->k;
    o.g[0] = gx; o.g[1] = gy; o.g[2] = gz;
    o.b[0] = bx; o.b[1] = by; o.b[2] = bz;
    o.shmem = shmem;
    unsigned char *a = (unsigned char *)aligned_alloc(64, (f->k->args_size + 63) & ~(size_t)63);
    if (!a) return OUT_OF_MEMORY;
    f->k->pack(params, a);
    o.args = std::shared_ptr<unsigned char>(a, free);
    return submit(o, st);
}

/* ---- stream capture (global mode) and graphs: replayed in recorded order ---- */
EMU_API CUresult cuStreamBeginCapture_v2(void *s, int mode) {
    NEED_CTX();
    if (!s) return CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (((stream *)s)->magic != 0x5743) return INVALID_HANDLE;
    if (mode != 0) return NOT_SUPPORTED; /* only CU_STREAM_CAPTURE_MODE_GLOBAL is emulated */
    if (capturing) return ILLEGAL_STATE;
    capturing = (stream *)s;
    capture_invalid = 0;
    captured.clear();
    return OK;
}
EMU_API CUresult cuStreamEndCapture(void *s, void **g) {
    NEED_CTX();
    if (!g) return INVALID_VALUE;
    *g = nullptr;
    if (!capturing || s != capturing) return ILLEGAL_STATE;
    capturing = nullptr;
    if (capture_invalid) { captured.clear(); return CAPTURE_INVALIDATED; }
    graph *gr = new graph;
    gr->magic = 0x6A;
    gr->ops.swap(captured);
    *g = gr;
    return OK;
}
EMU_API CUresult cuStreamIsCapturing(void *s, int *status) {
    NEED_CTX();
    *status = capturing && s == capturing ? (capture_invalid ? 2 : 1) : 0;
    return OK;
}
EMU_API CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
    NEED_CTX();
    (void)flags;
    if (!exec || !g || ((graph *)g)->magic != 0x6A) return INVALID_VALUE;
    graph *e = new graph(*(graph *)g); /* arguments are shared, immutable */
    e->magic = 0x6B;
    *exec = e;
    return OK;
}
EMU_API CUresult cuGraphLaunch(void *exec, void *s) {
    NEED_CTX();
    graph *e = (graph *)exec;
    if (!e || e->magic != 0x6B) return INVALID_HANDLE;
    if (lazy_streams() && s) { /* its nodes join the stream's queue */
        std::lock_guard<std::recursive_mutex> g(qmu);
        for (const op &o : e->ops) ((stream *)s)->q->push_back(o);
        return OK;
    }
    if (lazy_streams()) drain_all(1);
    for (const op &o : e->ops) {
        CUresult r = run_op(o);
        if (r != OK) return r;
        if (sticky) return OK;
    }
    return OK;
}
EMU_API CUresult cuGraphDestroy(void *g) {
    if (!g || ((graph *)g)->magic != 0x6A) return INVALID_VALUE;
    ((graph *)g)->magic = 0;
    delete (graph *)g;
    return OK;
}
EMU_API CUresult cuGraphExecDestroy(void *e) {
    if (!e || ((graph *)e)->magic != 0x6B) return INVALID_VALUE;
    ((graph *)e)->magic = 0;
    delete (graph *)e;
    return OK;
}

/* For tests/test_emu.c: how many kernels the emulator carries, and whether it has one. */
EMU_API int capex_emu_kernel_count(void) {
    int n = 0;
    for (const capex_emu::kernel_set &s : capex_emu_sets) n += (int)s.n;
    return n;
}
EMU_API int capex_emu_has_kernel(const char *name) { return find_kernel(name) != nullptr; }
/* For tests/test_norm_gpu.c: launches checked against a norm variant's tag
   (runs 0), and those that ran the variant's text compiled with its switches (runs 1). */
EMU_API int capex_emu_vtag_checks(int runs) { return runs ? vtag_runs.load() : vtag_checks.load(); }
