/* The CPU emulator driver (tests/emu_libcuda.cc, build/emu/libcuda.so.1)
   against CUDA's rules, so that the GPU tests it runs in CI
   (tests/emu.mk) mean something:
   - it carries every kernel of the built-in program (by name);
   - results that need real barriers and shuffles: a block sum through
     __shfl_down_sync and shared memory, a Hillis-Steele scan in dynamic shared
     memory (wrong without both __syncthreads), every shuffle mode with widths
     against CUDA's documented lane rules, 3-D thread/block numbering;
   - faults: a kernel writing past its allocation and a wild pointer argument
     give the sticky CUDA_ERROR_ILLEGAL_ADDRESS (later calls fail too), a block
     whose threads wait at barriers that cannot open, and a full-mask shuffle
     after lanes have returned, give CUDA_ERROR_LAUNCH_FAILED instead of a hang
     or garbage, a kernel in the image but not
     in the emulator fails its launch with CUDA_ERROR_NOT_SUPPORTED;
   - launches over 4 KB of parameters run (the built-in kernels' 32 KB build,
     found by the image's parameter bytes, CUBIN or PTX) and fail with
     CUDA_ERROR_INVALID_VALUE below driver 12.1 or sm_70;
   - CAPEX_EMU_STREAMS=lazy (in a child, against the same checks eager): a
     kernel or memset on a non-blocking stream stays unseen by a synchronous
     copy until its stream is synchronised, an event wait orders two streams
     (and is for the record it saw, when the event is recorded again on
     another stream), legacy-stream work drains a blocking stream (flags 0),
     destroying an event or a stream runs no other stream's work, a stand-in NCCL collective's result
     lands in stream order, a queued timing record is CUDA_ERROR_NOT_READY, and cuEventQuery and a
     download from the stream report a fault in the work they ran;
   - CAPEX_EMU_STREAMS=ahead (against lazy): a host query of an event first
     runs the other streams' queued work (a read of a collective's result
     queued before the host wait reads it stale) and says NOT_READY once.
   Needs NVRTC (the emulator loads real images); skips without the library. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include "gpu_test_kernels.h"
#include <dlfcn.h>

/* The emulator, like a CUDA driver, keeps some allocations for the life of the
   process (and a faulted context cannot release its memory). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

#define OK(call) CT_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())

static char emu_lib[1100], nccl_lib[1100];
static char cache_dir[64];

/* build/emu/libcuda.so.1 next to this binary (build/tests/test_emu). */
static int find_emu(void) {
    return sibling_path("emu", "libcuda.so.1", emu_lib, sizeof emu_lib) && access(emu_lib, R_OK) == 0;
}

/* A context on the emulator and the test kernels' module, or a skip/fail reason. */
static capex_result open_emu(capex_cuda_context **ctx, capex_cuda_module **m, const char *src) {
    capex_cuda_context_desc cd;
    capex_result r;
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    if ((r = capex_cuda_context_create(&cd, ctx)) != CAPEX_OK) return r;
    return capex_cuda_module_compile(*ctx, src, "emu_test.cu", NULL, 0, m);
}

#define OPEN(ctx, m, src)                                                                             \
    do {                                                                                              \
        if (!emu_lib[0]) CT_SKIP("build/emu/libcuda.so.1 not built (tests/emu.mk)");                  \
        CT_NEED_NVRTC();                                                                              \
        OK(open_emu(&(ctx), &(m), (src)));                                                            \
        CT_CHECK(strstr(capex_cuda_context_device(ctx)->name, "emulator") != NULL, "device %s",       \
                 capex_cuda_context_device(ctx)->name);                                               \
    } while (0)

static uint64_t seed = 99;
static int rnd(int lo, int hi) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return lo + (int)((z ^ (z >> 31)) % (uint64_t)(hi - lo + 1));
}

CT_TEST(every_builtin_kernel_is_compiled_in) {
    void *lib;
    int (*has)(const char *) = NULL;
    int (*count)(void) = NULL;
    void *p, *q;
    size_t i;
    if (!emu_lib[0]) CT_SKIP("build/emu/libcuda.so.1 not built (tests/emu.mk)");
    lib = dlopen(emu_lib, RTLD_NOW | RTLD_LOCAL);
    CT_CHECK(lib, "dlopen %s: %s", emu_lib, dlerror());
    p = dlsym(lib, "capex_emu_has_kernel");
    q = dlsym(lib, "capex_emu_kernel_count");
    CT_CHECK(p && q, "the emulator's own entry points");
    memcpy(&has, &p, sizeof p);
    memcpy(&count, &q, sizeof q);
    for (i = 0; i < CAPEX__CUDA_N_BUILTIN; i++)
        CT_CHECK(has(capex__cuda_builtin_kernels[i]), "built-in kernel %s is not in the emulator", capex__cuda_builtin_kernels[i]);
    CT_CHECK(has("emu_block_sum") && has("user_reverse") && !has("no_such_kernel"), "test kernel set");
    CT_CHECK(count() >= (int)CAPEX__CUDA_N_BUILTIN + 8, "%d kernels", count());
    dlclose(lib);
}

CT_TEST(block_sum_and_scan_need_barriers_and_shuffles) {
    enum { N = 100000 };
    static int hx[N], hy[N];
    static long long hs[N / 96 + 2];
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function fsum, fscan;
    capex_cuda_ptr x = 0, y = 0, s = 0;
    unsigned blocks[2] = {1024, 96}, k;
    int n = N, i;
    OPEN(ctx, m, gpu_test_emu_src);
    OK(capex_cuda_module_get_function(m, "emu_block_sum", &fsum));
    OK(capex_cuda_module_get_function(m, "emu_scan", &fscan));
    for (i = 0; i < N; i++) hx[i] = rnd(-1000, 1000);
    OK(capex_cuda_malloc(ctx, sizeof hx, &x));
    OK(capex_cuda_malloc(ctx, sizeof hx, &y));
    OK(capex_cuda_malloc(ctx, sizeof hs, &s));
    OK(capex_cuda_memcpy_htod(ctx, x, hx, sizeof hx, NULL));
    for (k = 0; k < 2; k++) {
        unsigned bs = blocks[k], grid[3] = {(N + bs - 1) / bs, 1, 1}, block[3] = {bs, 1, 1}, b;
        void *args[3];
        args[0] = &x; args[1] = &s; args[2] = &n;
        OK(capex_cuda_memset_u8(ctx, s, 0xff, sizeof hs, NULL));
        OK(capex_cuda_launch(&fsum, grid, block, 0, NULL, args));
        OK(capex_cuda_memcpy_dtoh(ctx, hs, s, sizeof hs, NULL));
        for (b = 0; b < grid[0]; b++) {
            long long want = 0;
            for (i = (int)(b * bs); i < N && i < (int)((b + 1) * bs); i++) want += hx[i];
            CT_CHECK(hs[b] == want, "block %u of %u threads: sum %lld, want %lld", b, bs, hs[b], want);
        }
    }
    {
        unsigned grid[3] = {N / 500, 1, 1}, block[3] = {500, 1, 1}, b, t;
        void *args[2];
        args[0] = &x; args[1] = &y;
        OK(capex_cuda_launch(&fscan, grid, block, 500 * 4, NULL, args));
        OK(capex_cuda_memcpy_dtoh(ctx, hy, y, sizeof hy, NULL));
        for (b = 0; b < grid[0]; b++) {
            int acc = 0;
            for (t = 0; t < 500; t++) {
                acc += hx[b * 500 + t];
                CT_CHECK(hy[b * 500 + t] == acc, "scan block %u thread %u: %d, want %d", b, t, hy[b * 500 + t], acc);
            }
        }
    }
    capex_cuda_free(ctx, x);
    capex_cuda_free(ctx, y);
    capex_cuda_free(ctx, s);
    capex_cuda_context_destroy(ctx);
}

CT_TEST(shuffle_modes_and_thread_numbering) {
    enum { T = 64 };
    static int out[4 * T];
    static unsigned ids[3 * 2 * 2 * 30];
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function fs, fi;
    capex_cuda_ptr d = 0, e = 0;
    unsigned grid[3] = {1, 1, 1}, block[3] = {32, 2, 1}, t;
    void *args[1];
    OPEN(ctx, m, gpu_test_emu_src);
    OK(capex_cuda_module_get_function(m, "emu_shuffles", &fs));
    OK(capex_cuda_module_get_function(m, "emu_ids", &fi));
    OK(capex_cuda_malloc(ctx, sizeof out, &d));
    args[0] = &d;
    OK(capex_cuda_launch(&fs, grid, block, 0, NULL, args));
    OK(capex_cuda_memcpy_dtoh(ctx, out, d, sizeof out, NULL));
    for (t = 0; t < T; t++) {
        unsigned lane = t % 32, w = t - lane;
        int want[4];
        /* CUDA's rules: idx within the width group; up/down keep their own value past the group's edge */
        want[0] = (int)(1000 * (w + (lane & ~7u) + 3) + 7);
        want[1] = (int)(1000 * (lane >= 2 ? t - 2 : t) + 7);
        want[2] = (int)(1000 * ((lane % 16) + 5 < 16 ? t + 5 : t) + 7);
        want[3] = (int)(1000 * (w + (lane ^ 5)) + 7);
        for (int k = 0; k < 4; k++) CT_CHECK(out[4 * t + k] == want[k], "thread %u mode %d: %d, want %d", t, k, out[4 * t + k], want[k]);
    }
    {
        unsigned g3[3] = {3, 2, 2}, b3[3] = {5, 3, 2}, bx, by, bz, tx, ty, tz;
        OK(capex_cuda_malloc(ctx, sizeof ids, &e));
        OK(capex_cuda_memset_u8(ctx, e, 0xff, sizeof ids, NULL));
        args[0] = &e;
        OK(capex_cuda_launch(&fi, g3, b3, 0, NULL, args));
        OK(capex_cuda_memcpy_dtoh(ctx, ids, e, sizeof ids, NULL));
        for (bz = 0; bz < 2; bz++) for (by = 0; by < 2; by++) for (bx = 0; bx < 3; bx++)
            for (tz = 0; tz < 2; tz++) for (ty = 0; ty < 3; ty++) for (tx = 0; tx < 5; tx++) {
                unsigned b = bx + 3 * (by + 2 * bz), th = tx + 5 * (ty + 3 * tz);
                unsigned want = (bz << 24) | (by << 16) | (bx << 8) | (tz << 6) | (ty << 3) | tx;
                CT_CHECK(ids[b * 30 + th] == want, "block (%u,%u,%u) thread (%u,%u,%u): %08x", bx, by, bz, tx, ty, tz, ids[b * 30 + th]);
            }
    }
    capex_cuda_free(ctx, d);
    capex_cuda_free(ctx, e);
    capex_cuda_context_destroy(ctx);
}

/* A kernel NVRTC compiled but the emulator does not carry: the launch says so. */
CT_TEST(kernel_not_compiled_in_is_refused) {
    static const char src[] = "extern \"C\" __global__ void emu_not_compiled_in(int *x) { x[threadIdx.x] = 1; }\n";
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function f;
    capex_cuda_ptr d = 0;
    unsigned grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    void *args[1];
    capex_result r;
    OPEN(ctx, m, src);
    OK(capex_cuda_module_get_function(m, "emu_not_compiled_in", &f));
    OK(capex_cuda_malloc(ctx, 128, &d));
    args[0] = &d;
    setenv("CAPEX_EMU_QUIET", "1", 1);
    r = capex_cuda_launch(&f, grid, block, 0, NULL, args);
    unsetenv("CAPEX_EMU_QUIET");
    CT_CHECK(r == CAPEX_ERR_CUDA && strstr(capex_last_error(), "CUDA_ERROR_NOT_SUPPORTED"), "%s", capex_last_error());
    OK(capex_cuda_context_synchronize(ctx)); /* not sticky */
    capex_cuda_free(ctx, d);
    capex_cuda_context_destroy(ctx);
}

/* ---- faults, each in a fresh process (a sticky error ends the context) ---- */
static void child_fault(const char *what, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function f;
    capex_cuda_ptr d = 0, wild = 0x1000, more = 0;
    unsigned grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
    long long n = 1000;
    int v = 5;
    void *args[3];
    capex_result r;
    setenv("CAPEX_EMU_QUIET", "1", 1); /* these faults are on purpose */
    if ((res->code = open_emu(&ctx, &m, gpu_test_emu_src)) != CAPEX_OK) goto out;
    if ((res->code = capex_cuda_malloc(ctx, 1000 * 4, &d)) != CAPEX_OK) goto out;
    args[0] = &d; args[1] = &n; args[2] = &v;
    if (!strcmp(what, "overrun")) n = 100000; /* 400 KB into a 4000-byte allocation */
    if (!strcmp(what, "wild")) args[0] = &wild;
    if (!strcmp(what, "barrier") || !strcmp(what, "mask")) {
        block[0] = 32;
        grid[0] = 1;
        res->code = capex_cuda_module_get_function(m, what[0] == 'b' ? "emu_bad_barrier" : "emu_bad_mask", &f);
    } else res->code = capex_cuda_module_get_function(m, "emu_fill", &f);
    if (res->code != CAPEX_OK) goto out;
    if ((res->code = capex_cuda_launch(&f, grid, block, 0, NULL, args)) != CAPEX_OK) goto out;
    r = capex_cuda_context_synchronize(ctx);
    res->code = r;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    /* sticky: the next call fails the same way */
    res->value = capex_cuda_malloc(ctx, 64, &more) != CAPEX_OK;
    capex_cuda_context_destroy(ctx);
    return;
out:
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_context_destroy(ctx);
}

CT_TEST(faults_are_sticky_errors) {
    static const char *const what[4] = {"overrun", "wild", "barrier", "mask"};
    static const char *const want[4] = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED",
                                        "CUDA_ERROR_LAUNCH_FAILED"};
    int i;
    if (!emu_lib[0]) CT_SKIP("build/emu/libcuda.so.1 not built (tests/emu.mk)");
    CT_NEED_NVRTC();
    for (i = 0; i < 4; i++) {
        child_result r = run_child("fault", what[i]);
        CT_CHECK(r.exited_ok && r.code == CAPEX_ERR_CUDA && strstr(r.message, want[i]), "%s: code %d: %s", what[i], r.code, r.message);
        CT_CHECK(r.value == 1, "%s: the error is sticky", what[i]);
    }
}

/* ---- CAPEX_EMU_STREAMS=lazy (read once per process: each mode in a child) ----
   Raw driver calls (capex's own copies with stream NULL synchronise the
   context, which would hide what is tested here). */
struct emu_drv {
    int (*alloc)(capex_cuda_ptr *, size_t);
    int (*memset32)(capex_cuda_ptr, unsigned, size_t);
    int (*memset32_async)(capex_cuda_ptr, unsigned, size_t, void *);
    int (*dtoh)(void *, capex_cuda_ptr, size_t);
    int (*dtoh_async)(void *, capex_cuda_ptr, size_t, void *);
    int (*dtod_async)(capex_cuda_ptr, capex_cuda_ptr, size_t, void *);
    int (*stream_create)(void **, unsigned);
    int (*stream_sync)(void *);
    int (*stream_destroy)(void *);
    int (*wait_event)(void *, void *, unsigned);
    int (*event_create)(void **, unsigned);
    int (*event_record)(void *, void *);
    int (*event_destroy)(void *);
    int (*event_query)(void *);
    int (*elapsed)(float *, void *, void *);
};
static int emu_sym(void *lib, const char *name, void *fn) {
    void *p = dlsym(lib, name);
    memcpy(fn, &p, sizeof p); /* no object-to-function pointer cast */
    return p != NULL;
}
/* The stand-in NCCL (tests/fake_libnccl.c): a world of one, for its lazy-stream result. */
typedef struct { char internal[128]; } emu_nccl_id;
struct emu_nccl {
    int (*get_id)(emu_nccl_id *);
    int (*init)(void **, int, emu_nccl_id, int);
    int (*allreduce)(const void *, void *, size_t, int, int, void *, void *);
    int (*destroy)(void *);
};
/* The value of the first int at d, read by a synchronous copy (the legacy stream). */
static int emu_peek(const struct emu_drv *D, capex_cuda_ptr d) {
    int v = -1;
    return D->dtoh(&v, d, sizeof v) == 0 ? v : -2;
}
#define LZ(cond, ...)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            res->code = __LINE__;                                                       \
            snprintf(res->message, sizeof res->message, __VA_ARGS__);                   \
            goto out;                                                                   \
        }                                                                               \
    } while (0)
static void child_streams(const char *arg, child_result *res) {
    struct emu_drv D;
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function f;
    capex_cuda_ptr x = 0, y = 0, bad = 0x1000;
    void *a = NULL, *b = NULL, *c = NULL, *blk = NULL, *e = NULL, *e2 = NULL, *t0 = NULL, *t1 = NULL, *d = NULL, *lib, *args[3];
    unsigned grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    long long n = 4;
    int v = 9, lazy = arg && !strncmp(arg, "lazy", 4), q;
    float ms;
    struct emu_nccl N;
    emu_nccl_id id;
    void *nlib, *comm = NULL;
    memset(&D, 0, sizeof D);
    res->code = -1;
    LZ(open_emu(&ctx, &m, gpu_test_emu_src) == CAPEX_OK, "context and module: %s", capex_last_error());
    lib = dlopen(emu_lib, RTLD_NOW | RTLD_NOLOAD);
    LZ(lib && emu_sym(lib, "cuMemAlloc_v2", &D.alloc) && emu_sym(lib, "cuMemsetD32_v2", &D.memset32) &&
           emu_sym(lib, "cuMemsetD32Async", &D.memset32_async) && emu_sym(lib, "cuMemcpyDtoH_v2", &D.dtoh) &&
           emu_sym(lib, "cuMemcpyDtoHAsync_v2", &D.dtoh_async) &&
           emu_sym(lib, "cuMemcpyDtoDAsync_v2", &D.dtod_async) && emu_sym(lib, "cuStreamCreate", &D.stream_create) &&
           emu_sym(lib, "cuStreamSynchronize", &D.stream_sync) &&
           emu_sym(lib, "cuStreamDestroy_v2", &D.stream_destroy) && emu_sym(lib, "cuStreamWaitEvent", &D.wait_event) &&
           emu_sym(lib, "cuEventCreate", &D.event_create) && emu_sym(lib, "cuEventRecord", &D.event_record) &&
           emu_sym(lib, "cuEventDestroy_v2", &D.event_destroy) &&
           emu_sym(lib, "cuEventQuery", &D.event_query) && emu_sym(lib, "cuEventElapsedTime_v2", &D.elapsed),
       "the emulator's driver entry points");
    LZ(D.alloc(&x, 64) == 0 && D.alloc(&y, 64) == 0, "cuMemAlloc");
    LZ(D.stream_create(&a, 1) == 0 && D.stream_create(&b, 1) == 0 && D.stream_create(&c, 1) == 0 &&
           D.stream_create(&blk, 0) == 0 && D.event_create(&e, 2) == 0 && D.event_create(&e2, 2) == 0 && D.event_create(&t0, 0) == 0 &&
           D.event_create(&t1, 0) == 0,
       "streams and events");
    LZ(capex_cuda_module_get_function(m, "emu_fill", &f) == CAPEX_OK, "%s", capex_last_error());
    /* 1. a kernel and a memset on a non-blocking stream: the legacy stream's copy does not wait for them */
    LZ(D.memset32(x, 1, 4) == 0 && emu_peek(&D, x) == 1, "legacy memset");
    args[0] = &x; args[1] = &n; args[2] = &v;
    LZ(capex_cuda_launch(&f, grid, block, 0, a, args) == CAPEX_OK, "%s", capex_last_error());
    q = emu_peek(&D, x);
    LZ(q == (lazy ? 1 : 9), "kernel on a non-blocking stream, read without a wait: %d", q);
    LZ(D.memset32_async(x, 2, 4, a) == 0, "memset");
    q = emu_peek(&D, x);
    LZ(q == (lazy ? 1 : 2), "memset on a non-blocking stream, read without a wait: %d", q);
    LZ(D.stream_sync(a) == 0 && emu_peek(&D, x) == 2, "after cuStreamSynchronize");
    /* 2. an event orders two streams; without it the reader is ahead */
    LZ(D.memset32_async(x, 3, 4, a) == 0 && D.event_record(e, a) == 0 && D.wait_event(b, e, 0) == 0 &&
           D.dtod_async(y, x, 16, b) == 0 && D.stream_sync(b) == 0,
       "event wait");
    q = emu_peek(&D, y);
    LZ(q == 3, "b waited for a's memset: %d", q);
    LZ(D.memset32_async(x, 4, 4, a) == 0 && D.dtod_async(y, x, 16, b) == 0 && D.stream_sync(b) == 0, "no wait");
    q = emu_peek(&D, y);
    LZ(q == (lazy ? 3 : 4), "b did not wait for a: %d", q);
    LZ(D.stream_sync(a) == 0, "sync a");
    /* 3. a blocking stream (flags 0): legacy-stream work waits for it */
    LZ(D.memset32_async(x, 5, 4, blk) == 0, "memset on the blocking stream");
    q = emu_peek(&D, x);
    LZ(q == 5, "the legacy stream's copy after a blocking stream's memset: %d", q);
    /* 4. a wait is for the record it saw: the event recorded again on another
       stream (which runs first) does not release it */
    LZ(D.memset32_async(x, 6, 4, a) == 0 && D.event_record(e, a) == 0 && D.wait_event(b, e, 0) == 0 &&
           D.dtod_async(y, x, 16, b) == 0 && D.event_record(e, c) == 0 && D.stream_sync(c) == 0 && D.stream_sync(b) == 0,
       "re-recorded event");
    q = emu_peek(&D, y);
    LZ(q == 6, "b waited for the record on a, then e was recorded on c: %d", q);
    LZ(D.stream_sync(a) == 0, "sync a");
    /* 5. elapsed time: a queued record is NOT_READY (600), not INVALID_HANDLE */
    LZ(D.event_record(t0, a) == 0 && D.memset32_async(x, 7, 4, a) == 0 && D.event_record(t1, a) == 0, "timing records");
    q = D.elapsed(&ms, t0, t1);
    LZ(q == (lazy ? 600 : 0), "cuEventElapsedTime before the records ran: %d", q);
    LZ(D.stream_sync(a) == 0 && D.elapsed(&ms, t0, t1) == 0 && ms >= 0, "cuEventElapsedTime after");
    /* 7. destroying an event runs nothing (on a GPU it returns at once), and a
       wait already queued on it still holds */
    LZ(D.memset32_async(x, 8, 4, a) == 0 && D.event_record(e2, a) == 0 && D.wait_event(b, e2, 0) == 0 &&
           D.dtod_async(y, x, 16, b) == 0 && D.event_destroy(e2) == 0,
       "event destroyed with a wait on it queued");
    q = emu_peek(&D, x);
    LZ(q == (lazy ? 7 : 8), "a's memset after the event's destroy, read without a wait: %d", q);
    LZ(D.stream_sync(b) == 0 && emu_peek(&D, y) == 8, "b waited for a's record of the destroyed event: %d", emu_peek(&D, y));
    LZ(D.stream_sync(a) == 0, "sync a");
    /* ... nor does destroying another stream */
    LZ(D.memset32_async(x, 12, 4, a) == 0 && D.stream_create(&d, 1) == 0 && D.memset32_async(y, 13, 4, d) == 0 &&
           D.stream_destroy(d) == 0,
       "stream destroyed");
    q = emu_peek(&D, x);
    LZ(q == (lazy ? 8 : 12), "a's memset after another stream's destroy, read without a wait: %d", q);
    q = emu_peek(&D, y);
    LZ(q == 13, "the destroyed stream's own work ran: %d", q);
    LZ(D.stream_sync(a) == 0, "sync a");
    /* 8. a stand-in NCCL all-reduce (a world of one: a copy) on a: its result
       lands when a runs that far, so b's read without a wait is stale */
    nlib = dlopen(nccl_lib, RTLD_NOW | RTLD_LOCAL);
    LZ(nlib && emu_sym(nlib, "ncclGetUniqueId", &N.get_id) && emu_sym(nlib, "ncclCommInitRank", &N.init) &&
           emu_sym(nlib, "ncclAllReduce", &N.allreduce) && emu_sym(nlib, "ncclCommDestroy", &N.destroy),
       "the stand-in NCCL %s: %s", nccl_lib, dlerror());
    LZ(N.get_id(&id) == 0 && N.init(&comm, 1, id, 0) == 0, "a world of one");
    LZ(D.memset32(x, 10, 4) == 0 && D.memset32(y, 11, 4) == 0 &&
           N.allreduce((void *)(uintptr_t)x, (void *)(uintptr_t)y, 4, 7 /* ncclFloat32 */, 0, comm, a) == 0 &&
           D.dtod_async(x, y, 16, b) == 0 && D.stream_sync(b) == 0,
       "all-reduce on a, read on b");
    q = emu_peek(&D, x);
    LZ(q == (lazy ? 11 : 10), "b read the all-reduce's result without a wait: %d", q);
    LZ(D.event_record(e, a) == 0 && D.wait_event(b, e, 0) == 0 && D.dtod_async(x, y, 16, b) == 0 && D.stream_sync(b) == 0 &&
           emu_peek(&D, x) == 10,
       "b waited for the all-reduce: %d", emu_peek(&D, x));
    N.destroy(comm);
    /* 6. a query, or a download from the stream ("lazy-dtoh": the fault is
       sticky, so one per process), that runs a faulting kernel reports the
       fault (CUDA_ERROR_ILLEGAL_ADDRESS, 700) */
    setenv("CAPEX_EMU_QUIET", "1", 1); /* on purpose */
    args[0] = &bad;
    LZ(capex_cuda_launch(&f, grid, block, 0, a, args) == CAPEX_OK, "wild launch: %s", capex_last_error());
    q = D.event_query(e); /* e's latest record is on c: complete */
    if (lazy && !strcmp(arg, "lazy-dtoh")) {
        q = D.dtoh_async(&v, x, sizeof v, a);
    } else if (lazy) {
        LZ(D.event_record(e, a) == 0, "record after the wild kernel");
        q = D.event_query(e);
    }
    LZ(q == 700, "cuEventQuery or cuMemcpyDtoHAsync after a faulting kernel: %d", q);
    res->code = 0;
    res->value = lazy;
out:
    if (res->code) res->value = -1;
    capex_cuda_context_destroy(ctx);
}
#undef LZ

CT_TEST(lazy_streams_defer_and_order_like_a_gpu) {
    static const char *const mode[3] = {"eager", "lazy", "lazy-dtoh"};
    int i;
    if (!emu_lib[0]) CT_SKIP("build/emu/libcuda.so.1 not built (tests/emu.mk)");
    CT_NEED_NVRTC();
    for (i = 0; i < 3; i++) {
        child_result r;
        if (i) setenv("CAPEX_EMU_STREAMS", "lazy", 1);
        else unsetenv("CAPEX_EMU_STREAMS");
        r = run_child("streams", mode[i]);
        unsetenv("CAPEX_EMU_STREAMS");
        CT_CHECK(r.exited_ok && r.code == 0 && r.value == (i > 0), "%s streams: check at line %d: %s", mode[i], r.code, r.message);
    }
}

/* CAPEX_EMU_STREAMS=ahead against lazy (arg): a stand-in all-reduce on
   stream a, then on stream b a read of its result without a wait, then a
   host query of an event recorded on a after the all-reduce. */
#define LZ(cond, ...)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            res->code = __LINE__;                                                       \
            snprintf(res->message, sizeof res->message, __VA_ARGS__);                   \
            goto out;                                                                   \
        }                                                                               \
    } while (0)
static void child_ahead(const char *arg, child_result *res) {
    struct emu_drv D;
    struct emu_nccl N;
    emu_nccl_id id;
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_ptr x = 0, y = 0, z = 0;
    void *a = NULL, *b = NULL, *e = NULL, *lib, *nlib, *comm = NULL;
    int ahead = arg && !strcmp(arg, "ahead"), q;
    memset(&D, 0, sizeof D);
    res->code = -1;
    LZ(open_emu(&ctx, &m, gpu_test_emu_src) == CAPEX_OK, "context and module: %s", capex_last_error());
    lib = dlopen(emu_lib, RTLD_NOW | RTLD_NOLOAD);
    LZ(lib && emu_sym(lib, "cuMemAlloc_v2", &D.alloc) && emu_sym(lib, "cuMemsetD32_v2", &D.memset32) &&
           emu_sym(lib, "cuMemcpyDtoH_v2", &D.dtoh) && emu_sym(lib, "cuMemcpyDtoDAsync_v2", &D.dtod_async) &&
           emu_sym(lib, "cuStreamCreate", &D.stream_create) && emu_sym(lib, "cuStreamSynchronize", &D.stream_sync) &&
           emu_sym(lib, "cuEventCreate", &D.event_create) && emu_sym(lib, "cuEventRecord", &D.event_record) &&
           emu_sym(lib, "cuEventQuery", &D.event_query),
       "the emulator's driver entry points");
    nlib = dlopen(nccl_lib, RTLD_NOW | RTLD_LOCAL);
    LZ(nlib && emu_sym(nlib, "ncclGetUniqueId", &N.get_id) && emu_sym(nlib, "ncclCommInitRank", &N.init) &&
           emu_sym(nlib, "ncclAllReduce", &N.allreduce) && emu_sym(nlib, "ncclCommDestroy", &N.destroy),
       "the stand-in NCCL %s: %s", nccl_lib, dlerror());
    LZ(N.get_id(&id) == 0 && N.init(&comm, 1, id, 0) == 0, "a world of one");
    LZ(D.alloc(&x, 64) == 0 && D.alloc(&y, 64) == 0 && D.alloc(&z, 64) == 0 && D.stream_create(&a, 1) == 0 &&
           D.stream_create(&b, 1) == 0 && D.event_create(&e, 2) == 0,
       "buffers, streams, event");
    LZ(D.memset32(x, 10, 4) == 0 && D.memset32(y, 11, 4) == 0 && D.memset32(z, 12, 4) == 0 &&
           N.allreduce((void *)(uintptr_t)x, (void *)(uintptr_t)y, 4, 7 /* ncclFloat32 */, 0, comm, a) == 0 &&
           D.event_record(e, a) == 0 && D.dtod_async(z, y, 16, b) == 0,
       "all-reduce and record on a, read on b");
    q = D.event_query(e);
    LZ(q == (ahead ? 600 : 0), "first query of the record: %d", q);
    q = emu_peek(&D, z);
    LZ(q == (ahead ? 11 : 12), "b's read before the host wait on a %s: %d", ahead ? "ran first (stale)" : "still queued", q);
    LZ(D.event_query(e) == 0 && emu_peek(&D, y) == 10, "second query: the all-reduce's result landed: %d", emu_peek(&D, y));
    LZ(D.stream_sync(b) == 0, "sync b");
    q = emu_peek(&D, z);
    LZ(q == (ahead ? 11 : 10), "b's read, run %s the all-reduce: %d", ahead ? "before" : "after", q);
    N.destroy(comm);
    res->code = 0;
    res->value = ahead;
out:
    if (res->code) res->value = -1;
    capex_cuda_context_destroy(ctx);
}
#undef LZ

CT_TEST(ahead_streams_run_other_streams_before_a_host_wait) {
    static const char *const mode[2] = {"lazy", "ahead"};
    int i;
    if (!emu_lib[0]) CT_SKIP("build/emu/libcuda.so.1 not built (tests/emu.mk)");
    CT_NEED_NVRTC();
    for (i = 0; i < 2; i++) {
        child_result r;
        setenv("CAPEX_EMU_STREAMS", mode[i], 1);
        r = run_child("ahead", mode[i]);
        unsetenv("CAPEX_EMU_STREAMS");
        CT_CHECK(r.exited_ok && r.code == 0 && r.value == i, "%s streams: check at line %d: %s", mode[i], r.code, r.message);
    }
}

/* ---- kernel parameters over 4 KB: CUDA 12.1+ drivers on sm_70+ only ----
   A context on the default emulated driver (13.0, sm_90) builds its
   multi-tensor parts for 32 KB of parameters; the emulator picks the kernel
   set by the parameter bytes the image declares (CUBIN, or PTX where NVRTC has
   no CUBIN for the arch) and refuses such launches, like a real driver, when
   it plays a driver before 12.1 or a GPU before sm_70. */
static capex_result emu_scale(capex_cuda_context *ctx, int *right) {
    static const int64_t n[3] = {5, 1, 700};
    float h[706], back[706], half = 0.5f;
    capex_tensor in[3], out[3];
    capex_tensor_list li, lo;
    capex__go_exec ex;
    capex_cuda_ptr d = 0, s = 0;
    capex_result r;
    int i, at = 0;
    *right = 0;
    for (i = 0; i < 706; i++) h[i] = (float)i - 300.0f;
    if ((r = capex__go_dev_exec(ctx, "test", &ex)) != CAPEX_OK || (r = capex_cuda_malloc(ctx, 2 * sizeof h, &d)) != CAPEX_OK ||
        (r = capex_cuda_malloc(ctx, 4, &s)) != CAPEX_OK || (r = capex_cuda_memcpy_htod(ctx, s, &half, 4, NULL)) != CAPEX_OK ||
        (r = capex_cuda_memcpy_htod(ctx, d, h, sizeof h, NULL)) != CAPEX_OK)
        goto out;
    for (i = 0; i < 3; i++) {
        in[i].numel = out[i].numel = n[i];
        in[i].data = (void *)(uintptr_t)(d + (uint64_t)at * 4);
        out[i].data = (void *)(uintptr_t)(d + sizeof h + (uint64_t)at * 4);
        at += (int)n[i];
    }
    li = capex_tensor_list_make(CAPEX_F32, in, 3);
    lo = capex_tensor_list_make(CAPEX_F32, out, 3);
    if ((r = capex__go_scale(&ex, "t", NULL, &li, &lo, s, 0, 0, NULL)) != CAPEX_OK ||
        (r = capex_cuda_memcpy_dtoh(ctx, back, d + sizeof h, sizeof back, NULL)) != CAPEX_OK)
        goto out;
    *right = 1;
    for (i = 0; i < 706; i++) *right &= back[i] == h[i] * 0.5f;
out:
    capex_cuda_free(ctx, d);
    capex_cuda_free(ctx, s);
    return r;
}

CT_TEST(large_params_need_driver_12_1_and_volta) {
    capex_cuda_context *ctx = NULL, *small = NULL, *ptx = NULL;
    capex_cuda_module *m = NULL, *unused = NULL;
    capex_cuda_target t;
    int right = 0, M = 0, mi = 0;
    capex_result r;
    memset(&t, 0, sizeof t);
    OPEN(ctx, m, gpu_test_emu_src);
    CT_CHECK(capex_cuda_nvrtc_version(&M, &mi) == CAPEX_OK, "%s", capex_last_error());
    if (M * 1000 + mi * 10 < 12010) CT_SKIP("NVRTC %d.%d builds no kernel over 4 KB of parameters", M, mi);
    CT_CHECK(ctx->meta_bytes == CAPEX__GO_META_LARGE, "driver 13.0, sm_90: %d bytes of metadata", ctx->meta_bytes);
    OK(emu_scale(ctx, &right));
    CT_CHECK(right, "32 KB launch: wrong values");
    setenv("CAPEX_EMU_QUIET", "1", 1);
    setenv("CAPEX_EMU_DRIVER_VERSION", "12000", 1); /* read at every call */
    r = emu_scale(ctx, &right);
    CT_CHECK(r == CAPEX_ERR_CUDA && strstr(capex_last_error(), "CUDA_ERROR_INVALID_VALUE"), "driver 12.0: %d %s", r,
             capex_last_error());
    unsetenv("CAPEX_EMU_DRIVER_VERSION");
    setenv("CAPEX_EMU_CC", "61", 1);
    r = emu_scale(ctx, &right);
    CT_CHECK(r == CAPEX_ERR_CUDA && strstr(capex_last_error(), "CUDA_ERROR_INVALID_VALUE"), "sm_61: %d %s", r, capex_last_error());
    unsetenv("CAPEX_EMU_CC");
    OK(capex_cuda_context_synchronize(ctx)); /* not sticky */
    OK(emu_scale(ctx, &right));
    CT_CHECK(right, "again");
    /* a 4 KB context runs where the driver is 12.0 */
    setenv("CAPEX_CUDA_PARAMS", "4096", 1);
    r = open_emu(&small, &unused, gpu_test_emu_src);
    unsetenv("CAPEX_CUDA_PARAMS");
    OK(r);
    CT_CHECK(small->meta_bytes == CAPEX__GO_META_SMALL, "CAPEX_CUDA_PARAMS=4096: %d", small->meta_bytes);
    setenv("CAPEX_EMU_DRIVER_VERSION", "12000", 1);
    r = emu_scale(small, &right);
    unsetenv("CAPEX_EMU_DRIVER_VERSION");
    OK(r);
    CT_CHECK(right, "4 KB launch on driver 12.0: wrong values");
    /* sm_91: NVRTC has no CUBIN for it, PTX for sm_90: the emulator reads the PTX .entry's parameters */
    setenv("CAPEX_EMU_CC", "91", 1);
    r = open_emu(&ptx, &unused, gpu_test_emu_src);
    if (r == CAPEX_OK) r = emu_scale(ptx, &right);
    if (r == CAPEX_OK) r = capex_cuda_builtin_part_module(ptx, CAPEX__CP_UNSCALE_F32, &m);
    unsetenv("CAPEX_EMU_CC");
    unsetenv("CAPEX_EMU_QUIET");
    OK(r);
    CT_CHECK(capex_cuda_module_info(m, &t, NULL) == CAPEX_OK && t.kind == CAPEX_CUDA_IMAGE_PTX, "sm_91: image kind %d", (int)t.kind);
    CT_CHECK(ptx->meta_bytes == CAPEX__GO_META_LARGE && right, "PTX, 32 KB: %d bytes, values right %d", ptx->meta_bytes, right);
    capex_cuda_context_destroy(ptx);
    capex_cuda_context_destroy(small);
    capex_cuda_context_destroy(ctx);
}

static const ct_case cases[] = {
    CT_CASE(every_builtin_kernel_is_compiled_in), CT_CASE(block_sum_and_scan_need_barriers_and_shuffles),
    CT_CASE(shuffle_modes_and_thread_numbering), CT_CASE(kernel_not_compiled_in_is_refused), CT_CASE(faults_are_sticky_errors),
    CT_CASE(large_params_need_driver_12_1_and_volta), CT_CASE(lazy_streams_defer_and_order_like_a_gpu),
    CT_CASE(ahead_streams_run_other_streams_before_a_host_wait),
};
static const child_entry children[] = {{"fault", child_fault}, {"streams", child_streams}, {"ahead", child_ahead}};

int main(int argc, char **argv) {
    int rc;
    if (find_emu()) setenv("CAPEX_LIBCUDA_PATH", emu_lib, 1);
    else emu_lib[0] = '\0';
    if (!sibling_path("fake", "libnccl.so.2", nccl_lib, sizeof nccl_lib)) nccl_lib[0] = '\0';
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    /* one kernel cache for this run and its children (the test program compiles once) */
    snprintf(cache_dir, sizeof cache_dir, "/tmp/capex_emu_test_XXXXXX");
    if (mkdtemp(cache_dir)) setenv("CAPEX_CACHE_DIR", cache_dir, 1);
    else cache_dir[0] = '\0';
    rc = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    if (cache_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
    }
    return rc;
}
