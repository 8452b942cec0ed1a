/* fake_libcuda.c - a stand-in for libcuda.so.1 that runs on the CPU, so the host
   side of capex_cuda.h (symbol loading, contexts, bounds of every copy, launch
   configuration, argument marshalling, module loading of real NVRTC output)
   is exercised in CI without a GPU. Built as build/fake/libcuda.so.1 by
   tests/cuda.mk and used through CAPEX_LIBCUDA_PATH by `make ci-extra`.

   "Device" memory is host memory, checked against the live allocations: a copy
   or kernel that touches bytes outside them fails like the real driver
   (CUDA_ERROR_INVALID_VALUE for copies, a sticky CUDA_ERROR_ILLEGAL_ADDRESS for
   kernels). Modules must be real CUBIN (ELF, machine EM_CUDA) or PTX; a kernel
   name must occur in the image. Kernels run block by block, thread by thread,
   with the grid the caller chose, so a launch that covers too few elements
   leaves them unwritten. Only the kernels listed below exist; user_axpb does
   not know its ALPHA (a compile option), so it writes nothing and the test
   skips that check. FAKE_CUDA_MODULE_LOAD_OOM makes every module load fail with
   CUDA_ERROR_OUT_OF_MEMORY. This is not CUDA: it only proves the host code. */
#define CAPEX_IMPLEMENTATION
#define CAPEX_STATIC
#include "../capex.h"
#include "cuda_image.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define FAKE_API __attribute__((visibility("default")))

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
       INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_PTX = 218, INVALID_HANDLE = 400, NOT_FOUND = 500,
       ILLEGAL_ADDRESS = 700 };

static int inited, retained, sticky;
static __thread void *current;
static int the_ctx;

typedef struct alloc { unsigned char *p; size_t n; } alloc;
static alloc allocs[1024];

/* 1 when [p, p+n) lies inside one live allocation. */
static int in_bounds(CUdeviceptr p, size_t n) {
    size_t i;
    for (i = 0; i < sizeof allocs / sizeof allocs[0]; i++) {
        CUdeviceptr b = (CUdeviceptr)(uintptr_t)allocs[i].p;
        if (allocs[i].p && p >= b && p + n <= b + allocs[i].n && p + n >= p) return 1;
    }
    return 0;
}

#define NEED_CTX() do { if (!inited) return NOT_INITIALIZED; if (sticky) return sticky; \
                        if (current != &the_ctx || !retained) return INVALID_CONTEXT; } while (0)

/* FAKE_CUDA_INIT_FAIL=100 plays a driver without a usable GPU (CUDA_ERROR_NO_DEVICE). */
FAKE_API CUresult cuInit(unsigned flags) {
    const char *e = getenv("FAKE_CUDA_INIT_FAIL");
    if (flags) return INVALID_VALUE;
    if (e && e[0]) return atoi(e);
    inited = 1;
    return OK;
}
/* FAKE_CUDA_DRIVER_VERSION (e.g. 12090) plays an older driver. */
FAKE_API CUresult cuDriverGetVersion(int *v) {
    const char *e = getenv("FAKE_CUDA_DRIVER_VERSION");
    if (!v) return INVALID_VALUE;
    *v = e && e[0] ? atoi(e) : 13000;
    return OK;
}

static const char *names[][2] = {
    {"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"}, {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"}};
FAKE_API CUresult cuGetErrorName(CUresult r, const char **s) {
    if (r >= 0 && r <= 3) *s = names[r][0];
    else if (r == INVALID_DEVICE) *s = "CUDA_ERROR_INVALID_DEVICE";
    else if (r == 100) *s = "CUDA_ERROR_NO_DEVICE";
    else if (r == INVALID_IMAGE) *s = "CUDA_ERROR_INVALID_IMAGE";
    else if (r == INVALID_CONTEXT) *s = "CUDA_ERROR_INVALID_CONTEXT";
    else if (r == INVALID_PTX) *s = "CUDA_ERROR_INVALID_PTX";
    else if (r == INVALID_HANDLE) *s = "CUDA_ERROR_INVALID_HANDLE";
    else if (r == NOT_FOUND) *s = "CUDA_ERROR_NOT_FOUND";
    else if (r == ILLEGAL_ADDRESS) *s = "CUDA_ERROR_ILLEGAL_ADDRESS";
    else { *s = NULL; return INVALID_VALUE; }
    return OK;
}
FAKE_API CUresult cuGetErrorString(CUresult r, const char **s) {
    if (r >= 0 && r <= 3) { *s = names[r][1]; return OK; }
    return cuGetErrorName(r, s);
}

FAKE_API CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 1; return OK; }
FAKE_API CUresult cuDeviceGet(int *d, int ordinal) {
    if (!inited) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
FAKE_API CUresult cuDeviceGetName(char *name, int len, int dev) {
    if (dev != 0 || len < 2) return INVALID_VALUE;
    strncpy(name, "capex fake GPU (CPU stand-in)", (size_t)len - 1);
    name[len - 1] = '\0';
    return OK;
}
FAKE_API CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (dev != 0) return INVALID_DEVICE;
    switch (attr) {
    case 75: *v = 9; return OK;        /* compute capability 9.0 */
    case 76: *v = 0; return OK;
    case 16: *v = 4; return OK;        /* SMs: small, so grid-stride loops take several passes */
    case 36: *v = 2619000; return OK;
    case 37: *v = 5120; return OK;
    }
    return INVALID_VALUE;
}
FAKE_API CUresult cuDeviceTotalMem_v2(size_t *b, int dev) { if (dev != 0) return INVALID_DEVICE; *b = (size_t)80 << 30; return OK; }
FAKE_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (!inited) return NOT_INITIALIZED;
    if (dev != 0) return INVALID_DEVICE;
    retained++;
    *ctx = &the_ctx;
    return OK;
}
FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev != 0) return INVALID_DEVICE;
    if (retained == 0) return INVALID_CONTEXT;
    retained--;
    return OK;
}
FAKE_API CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }
FAKE_API CUresult cuCtxSetCurrent(void *ctx) { if (ctx && ctx != &the_ctx) return INVALID_CONTEXT; current = ctx; return OK; }
/* Whole-context waits: a test checks that backward's bucket staging on the
   legacy stream makes none (it would wait for NCCL's kernels in flight). */
static int ctx_syncs;
FAKE_API int fake_ctx_syncs(void) { return __atomic_load_n(&ctx_syncs, __ATOMIC_SEQ_CST); }
FAKE_API CUresult cuCtxSynchronize(void) { NEED_CTX(); __atomic_add_fetch(&ctx_syncs, 1, __ATOMIC_SEQ_CST); return OK; }

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    size_t i;
    NEED_CTX();
    if (n == 0) return INVALID_VALUE;
    if (n > ((size_t)1 << 36)) return OUT_OF_MEMORY;
    for (i = 0; i < sizeof allocs / sizeof allocs[0]; i++)
        if (!allocs[i].p) {
            allocs[i].p = (unsigned char *)malloc(n);
            if (!allocs[i].p) return OUT_OF_MEMORY;
            memset(allocs[i].p, 0xA5, n); /* cudaMalloc memory is not zeroed */
            allocs[i].n = n;
            *p = (CUdeviceptr)(uintptr_t)allocs[i].p;
            return OK;
        }
    return OUT_OF_MEMORY;
}
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
    size_t i;
    NEED_CTX();
    for (i = 0; i < sizeof allocs / sizeof allocs[0]; i++)
        if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == p) {
            free(allocs[i].p);
            allocs[i].p = NULL;
            return OK;
        }
    return INVALID_VALUE;
}
FAKE_API CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { NEED_CTX(); *f = (size_t)70 << 30; *t = (size_t)80 << 30; return OK; }

static void *host(CUdeviceptr p) { return (void *)(uintptr_t)p; }
FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
    NEED_CTX();
    if (!in_bounds(d, n)) return INVALID_VALUE;
    memcpy(host(d), s, n);
    return OK;
}
FAKE_API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
    NEED_CTX();
    if (!in_bounds(s, n)) return INVALID_VALUE;
    memcpy(d, host(s), n);
    return OK;
}
FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    NEED_CTX();
    if (!in_bounds(d, n) || !in_bounds(s, n)) return INVALID_VALUE;
    memmove(host(d), host(s), n);
    return OK;
}
FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { (void)st; return cuMemcpyHtoD_v2(d, s, n); }
FAKE_API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoD_v2(d, s, n); }
FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    NEED_CTX();
    if (!in_bounds(d, n)) return INVALID_VALUE;
    memset(host(d), v, n);
    return OK;
}
FAKE_API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) {
    size_t i;
    NEED_CTX();
    if ((d & 3) || !in_bounds(d, n * 4)) return INVALID_VALUE;
    for (i = 0; i < n; i++) memcpy((unsigned char *)host(d) + 4 * i, &v, 4);
    return OK;
}
FAKE_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) { (void)s; return cuMemsetD8_v2(d, v, n); }
FAKE_API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s) { (void)s; return cuMemsetD32_v2(d, v, n); }

/* streams: everything runs synchronously */
typedef struct stream { int magic; } stream;
FAKE_API CUresult cuStreamCreate(void **s, unsigned flags) {
    stream *p;
    NEED_CTX();
    if (flags > 1) return INVALID_VALUE;
    p = (stream *)malloc(sizeof *p);
    p->magic = 0x5743;
    *s = p;
    return OK;
}
FAKE_API CUresult cuStreamDestroy_v2(void *s) {
    NEED_CTX();
    if (!s || ((stream *)s)->magic != 0x5743) return INVALID_HANDLE;
    ((stream *)s)->magic = 0;
    free(s);
    return OK;
}
FAKE_API CUresult cuStreamSynchronize(void *s) { NEED_CTX(); if (s && ((stream *)s)->magic != 0x5743) return INVALID_HANDLE; return OK; }
typedef struct event { int magic, timing, recorded; double t; } event;
/* Waits queued on the legacy (NULL) stream, the engine's stream of the NCCL
   tests: a test checks that backward's bucket staging makes it wait for none. */
static int null_stream_waits;
FAKE_API int fake_null_stream_waits(void) { return __atomic_load_n(&null_stream_waits, __ATOMIC_SEQ_CST); }
FAKE_API CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) {
    NEED_CTX();
    (void)f;
    if (!e) return INVALID_HANDLE;
    if (!s) __atomic_add_fetch(&null_stream_waits, 1, __ATOMIC_SEQ_CST);
    return OK;
}
/* Events created and not yet destroyed: a test checks that none is left
   after the comm and the context are gone (leaks on failure paths). */
static int live_events;
FAKE_API int fake_live_events(void) { return __atomic_load_n(&live_events, __ATOMIC_SEQ_CST); }
FAKE_API CUresult cuEventCreate(void **e, unsigned flags) {
    event *p;
    NEED_CTX();
    p = (event *)calloc(1, sizeof *p);
    p->magic = 0xE7;
    p->timing = !(flags & 2u);
    *e = p;
    __atomic_add_fetch(&live_events, 1, __ATOMIC_SEQ_CST);
    return OK;
}
FAKE_API CUresult cuEventDestroy_v2(void *e) {
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    ((event *)e)->magic = 0;
    free(e);
    __atomic_sub_fetch(&live_events, 1, __ATOMIC_SEQ_CST);
    return OK;
}
FAKE_API CUresult cuEventRecord(void *e, void *s) {
    struct timespec t;
    (void)s;
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    clock_gettime(CLOCK_MONOTONIC, &t);
    ((event *)e)->t = t.tv_sec * 1e3 + t.tv_nsec / 1e6;
    ((event *)e)->recorded = 1;
    return OK;
}
FAKE_API CUresult cuEventSynchronize(void *e) { NEED_CTX(); return e && ((event *)e)->magic == 0xE7 ? OK : INVALID_HANDLE; }
/* Work is synchronous, so a recorded event is complete; FAKE_CUDA_EVENT_NOT_READY=1
   plays a collective that never finishes (CUDA_ERROR_NOT_READY), for deadline tests. */
FAKE_API CUresult cuEventQuery(void *e) {
    const char *nr = getenv("FAKE_CUDA_EVENT_NOT_READY");
    NEED_CTX();
    if (!e || ((event *)e)->magic != 0xE7) return INVALID_HANDLE;
    return nr && nr[0] == '1' ? 600 : OK;
}
FAKE_API CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    event *x = (event *)a, *y = (event *)b;
    NEED_CTX();
    if (!x || !y || !x->timing || !y->timing || !x->recorded || !y->recorded) return INVALID_HANDLE;
    *ms = (float)(y->t - x->t);
    return OK;
}

/* modules */
typedef struct module { unsigned char *img; size_t n; } module;
typedef struct function { int kind; int max_dyn_shmem; } function;
static const char *kernels[] = {"capex_fill_f32", "capex_scale_f32", "capex_add_f32", "capex_f32_to_f16",
                                "capex_f16_to_f32", "capex_f32_to_bf16", "capex_bf16_to_f32", "user_axpb", "user_reverse"};
enum { NK = sizeof kernels / sizeof kernels[0] };
static function funcs[NK];
/* Any other kernel present in the image (later sections' built-ins): found, so
   the built-in module loads, but not emulated (launching it is an error). */
static function unemulated = {-1, 0};

FAKE_API CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n_opts, int *opts, void **vals) {
    const unsigned char *p = (const unsigned char *)img;
    size_t n;
    int bad_ptx = 0;
    module *mod;
    (void)n_opts; (void)opts; (void)vals;
    NEED_CTX();
    if (!img) return INVALID_VALUE;
    if (getenv("FAKE_CUDA_MODULE_LOAD_OOM")) return 2; /* CUDA_ERROR_OUT_OF_MEMORY: not the image's fault */
    n = cuda_image_size(p, &bad_ptx);
    if (!n) return bad_ptx ? INVALID_PTX : INVALID_IMAGE;
    mod = (module *)malloc(sizeof *mod);
    mod->img = (unsigned char *)malloc(n);
    memcpy(mod->img, p, n);
    mod->n = n;
    *m = mod;
    return OK;
}
FAKE_API CUresult cuModuleUnload(void *m) {
    NEED_CTX();
    if (!m) return INVALID_HANDLE;
    free(((module *)m)->img);
    free(m);
    return OK;
}
static int has(const module *m, const char *name) {
    size_t k = strlen(name), i;
    for (i = 0; i + k <= m->n; i++)
        if (!memcmp(m->img + i, name, k) && (i + k == m->n || m->img[i + k] == '\0' || m->img[i + k] == '(' ||
                                             m->img[i + k] == '\n' || m->img[i + k] == ' '))
            return 1;
    return 0;
}
FAKE_API CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    int k;
    NEED_CTX();
    if (!m || !name) return INVALID_VALUE;
    for (k = 0; k < NK; k++)
        if (!strcmp(name, kernels[k]) && has((const module *)m, name)) {
            funcs[k].kind = k;
            *f = &funcs[k];
            return OK;
        }
    if (has((const module *)m, name)) { *f = &unemulated; return OK; }
    return NOT_FOUND;
}
FAKE_API CUresult cuFuncSetAttribute(void *f, int attr, int v) {
    NEED_CTX();
    if (!f || attr != 8 || v < 0 || v > 227 * 1024) return INVALID_VALUE;
    ((function *)f)->max_dyn_shmem = v;
    return OK;
}

/* Attributes capex asks for: the dynamic shared memory opt-in (8) as set, no local memory (3). */
FAKE_API CUresult cuFuncGetAttribute(int *v, int attr, void *f) {
    NEED_CTX();
    if (!v || !f || (attr != 8 && attr != 3)) return INVALID_VALUE;
    *v = attr == 8 ? ((function *)f)->max_dyn_shmem : 0;
    return OK;
}

/* FAKE_CUDA_PAIR_BIG_LAUNCHES=1: the first launch with over 48 KiB of shared
   memory waits, after entering the driver, until a second such launch has
   entered; fake_wait_parked() returns once the first one waits. A test thus
   interleaves two threads' launches of one function deterministically (the
   attribute is checked when the first launch goes on). */
static pthread_mutex_t pair_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pair_cv = PTHREAD_COND_INITIALIZER;
static int pair_entered;
FAKE_API void fake_wait_parked(void) {
    pthread_mutex_lock(&pair_lock);
    while (pair_entered < 1) pthread_cond_wait(&pair_cv, &pair_lock);
    pthread_mutex_unlock(&pair_lock);
}
static void pair_big_launch(void) {
    const char *e = getenv("FAKE_CUDA_PAIR_BIG_LAUNCHES");
    if (!e || e[0] != '1') return;
    pthread_mutex_lock(&pair_lock);
    if (++pair_entered == 1) {
        pthread_cond_broadcast(&pair_cv);
        while (pair_entered < 2) pthread_cond_wait(&pair_cv, &pair_lock);
    } else {
        pthread_cond_broadcast(&pair_cv);
    }
    pthread_mutex_unlock(&pair_lock);
}

#define P(i, T) (*(T *)params[i])
FAKE_API CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned shmem, void *stream, void **params, void **extra) {
    function *f = (function *)fn;
    unsigned long long b, t, stride, i, n = 0;
    (void)stream;
    NEED_CTX();
    if (!f || extra || !params) return INVALID_VALUE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024 || gy > 65535 || gz > 65535)
        return INVALID_VALUE;
    if (shmem > 48u * 1024u) pair_big_launch();
    if (shmem > 48u * 1024u && (int)shmem > f->max_dyn_shmem) return INVALID_VALUE;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1) return INVALID_VALUE; /* the fake runs 1-D grids only */
    stride = (unsigned long long)gx * bx;
    switch (f->kind) {
    case 0: case 1: case 2: case 3: case 4: case 5: case 6: {
        static const int out_size[] = {4, 4, 4, 2, 4, 2, 4}, in_size[] = {0, 4, 4, 4, 2, 4, 2};
        int k = f->kind, last = k == 0 ? 2 : (k == 1 || k == 2) ? 3 : 2;
        n = P(last, unsigned long long);
        if (!in_bounds(P(0, CUdeviceptr), n * (size_t)out_size[k]) ||
            (in_size[k] && !in_bounds(P(1, CUdeviceptr), n * (size_t)in_size[k])) ||
            (k == 2 && !in_bounds(P(2, CUdeviceptr), n * 4))) {
            sticky = ILLEGAL_ADDRESS;
            return OK; /* like a real fault: reported by the next call */
        }
        for (b = 0; b < gx; b++)
            for (t = 0; t < bx; t++)
                for (i = b * bx + t; i < n; i += stride) {
                    float *of = (float *)host(P(0, CUdeviceptr));
                    uint16_t *oh = (uint16_t *)host(P(0, CUdeviceptr));
                    switch (k) {
                    case 0: of[i] = P(1, float); break;
                    case 1: of[i] = P(2, float) * ((const float *)host(P(1, CUdeviceptr)))[i]; break;
                    case 2: of[i] = ((const float *)host(P(1, CUdeviceptr)))[i] + ((const float *)host(P(2, CUdeviceptr)))[i]; break;
                    case 3: oh[i] = capex_f32_to_f16(((const float *)host(P(1, CUdeviceptr)))[i]); break;
                    case 4: of[i] = capex_f16_to_f32(((const uint16_t *)host(P(1, CUdeviceptr)))[i]); break;
                    case 5: oh[i] = capex_f32_to_bf16(((const float *)host(P(1, CUdeviceptr)))[i]); break;
                    case 6: of[i] = capex_bf16_to_f32(((const uint16_t *)host(P(1, CUdeviceptr)))[i]); break;
                    }
                }
        return OK;
    }
    case 7: /* user_axpb: ALPHA is a compile-time constant the fake cannot see */
        n = P(3, unsigned long long);
        if (!in_bounds(P(0, CUdeviceptr), n * 4) || !in_bounds(P(1, CUdeviceptr), n * 4)) sticky = ILLEGAL_ADDRESS;
        return OK;
    case 8: { /* user_reverse: y[base + t] = x[base + bx - 1 - t] through shared memory */
        float *y = (float *)host(P(0, CUdeviceptr));
        const float *x = (const float *)host(P(1, CUdeviceptr));
        if ((size_t)bx * 4 > shmem || !in_bounds(P(0, CUdeviceptr), (size_t)gx * bx * 4) ||
            !in_bounds(P(1, CUdeviceptr), (size_t)gx * bx * 4)) {
            sticky = ILLEGAL_ADDRESS;
            return OK;
        }
        for (b = 0; b < gx; b++)
            for (t = 0; t < bx; t++) y[b * bx + t] = x[b * bx + bx - 1 - t];
        return OK;
    }
    }
    /* FAKE_CUDA_NOOP_KERNELS=1: other kernels do nothing (host-side timing) */
    return getenv("FAKE_CUDA_NOOP_KERNELS") ? OK : INVALID_VALUE;
}
