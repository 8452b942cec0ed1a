/* capex.h - mixed-precision training toolkit for C (Apex, as one header).

   Do this:
       #define CAPEX_IMPLEMENTATION
       #include "capex.h"
   in exactly one C or C++ file; every other file includes "capex.h" alone.

   Quick start (dynamic loss scaling around your own forward/backward):

       capex_scaler_desc sd; capex_scaler_desc_init(&sd);   // Apex defaults
       capex_scaler sc;      capex_scaler_init(&sc, &sd);
       for (step...) {
           float scale; capex_scaler_scale(&sc, &scale);      // loss * scale
           my_backward(scale);                                // grads are scaled
           float inv; int found_inf = my_unscale_and_check(); // or capex's fused ops
           capex_scaler_unscale(&sc, 0, found_inf, &inv);
           int do_step; capex_scaler_step(&sc, 0, &do_step);
           if (do_step) my_optimizer_step();
           capex_scaler_update(&sc);                          // grow / back off
       }

   Build: cc app.c -lm        (add -fopenmp for threads, -ldl -lpthread with capex_cuda.h)

   CONFIGURATION (define before including, in the implementation file)
       CAPEX_STATIC          all functions static (private copy per translation unit)
       CAPEX_API             linkage of public functions (default: extern)
       CAPEX_ASSERT(x)       internal invariant checks (default: assert(x))
       CAPEX_MALLOC(sz)      \  allocator used when no runtime capex_allocator is
       CAPEX_REALLOC(p,sz)    > given; define all three or none
       CAPEX_FREE(p)         /
       CAPEX_NO_STDIO        leave out the default stderr logger and file I/O

   TOPICS (each section below starts with its own manual)
       Results and errors ...... every call returns capex_result; capex_last_error()
                                 gives a thread-local message saying what to do.
       Logging ................. capex_set_log_callback(), capex_log_set_rank().
       Allocation .............. capex_allocator, passed to objects that allocate.
       Half types .............. fp16 / bf16 conversions, scalar and bulk.
       Opt levels .............. O0-O3 properties, overrides, report, cast policy.
       Loss scaler ............. dynamic/static scaling and the step state machine.
       State files ............. versioned, checksummed save/restore (safetensors).

   Thread safety: functions on distinct objects may run concurrently; one object
   must not be used from two threads at once unless its section says otherwise.

   License: MIT, see the end of this file.
*/
#ifndef CAPEX_H
#define CAPEX_H

#define CAPEX_VERSION_MAJOR 0
#define CAPEX_VERSION_MINOR 1
#define CAPEX_VERSION_PATCH 0
#define CAPEX_VERSION_STRING "0.1.0"
#define CAPEX_VERSION_NUMBER (CAPEX_VERSION_MAJOR * 10000 + CAPEX_VERSION_MINOR * 100 + CAPEX_VERSION_PATCH)

#include <stddef.h>
#include <stdint.h>

#ifndef CAPEX_API
#  ifdef CAPEX_STATIC
#    if defined(__GNUC__) || defined(__clang__)
#      define CAPEX_API static __attribute__((unused))
#    else
#      define CAPEX_API static
#    endif
#  else
#    define CAPEX_API extern
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
   Results and errors

   Every fallible call returns a capex_result: CAPEX_OK (0) or a negative code.
   capex_result_string(code) names the code; capex_last_error() returns a
   thread-local message from the last failing call on this thread, saying what
   was wrong and how to fix it. Library code never exits or aborts.
   ------------------------------------------------------------------------- */
typedef enum capex_result {
    CAPEX_OK = 0,
    CAPEX_ERR_INVALID_ARG = -1,   /* null pointer, out-of-range or NaN value   */
    CAPEX_ERR_SIZE_MISMATCH = -2, /* lists or tensors of different lengths     */
    CAPEX_ERR_ORDER = -3,         /* call out of order (state machine)         */
    CAPEX_ERR_OUT_OF_MEMORY = -4,
    CAPEX_ERR_IO = -5,            /* file could not be opened/read/written     */
    CAPEX_ERR_FORMAT = -6,        /* corrupt, truncated or foreign file        */
    CAPEX_ERR_VERSION = -7,       /* file written by an unsupported version    */
    CAPEX_ERR_CHECKSUM = -8,      /* file contents do not match its checksum   */
    CAPEX_ERR_CONFIG = -9,        /* configuration breaks a documented rule    */
    CAPEX_ERR_NOT_FOUND = -10,    /* named entry absent                        */
    CAPEX_ERR_UNSUPPORTED = -11,  /* valid request this build cannot serve     */
    CAPEX_ERR_LIMIT = -12,        /* a fixed capacity was exceeded             */
    CAPEX_ERR_NO_DRIVER = -20,    /* libcuda.so.1 not loadable                 */
    CAPEX_ERR_NO_DEVICE = -21,    /* driver present, no usable GPU             */
    CAPEX_ERR_NO_NVRTC = -22,     /* NVRTC library not loadable                */
    CAPEX_ERR_NO_NCCL = -23,      /* libnccl.so.2 not loadable                 */
    CAPEX_ERR_CUDA = -24,         /* a CUDA driver call failed                 */
    CAPEX_ERR_NVRTC = -25,        /* kernel compilation failed                 */
    CAPEX_ERR_NCCL = -26,         /* an NCCL call failed                       */
    CAPEX_ERR_ARCH = -27,         /* GPU architecture not supported            */
    CAPEX_ERR_COMM = -30,         /* a peer failed or a collective failed      */
    CAPEX_ERR_TIMEOUT = -31,      /* a deadline passed                         */
    CAPEX_ERR_NO_MPI = -32,       /* MPI requested but not built in            */
    CAPEX_ERR_INTERNAL = -99      /* a bug in capex: please report             */
} capex_result;

CAPEX_API const char *capex_result_string(capex_result r);
/* Thread-local message of the last failure on this thread ("" if none). */
CAPEX_API const char *capex_last_error(void);
CAPEX_API void capex_clear_error(void);

/* ---------------------------------------------------------------------------
   Logging

   Silent by default except warnings and errors, written to stderr by the
   process whose log rank is 0 (capex_log_set_rank; data-parallel code sets it
   from the launcher). A callback replaces the default sink for every rank.
   These settings are process-wide: set them before starting threads.
   ------------------------------------------------------------------------- */
typedef enum capex_log_level {
    CAPEX_LOG_ERROR = 0,
    CAPEX_LOG_WARN = 1,
    CAPEX_LOG_INFO = 2,
    CAPEX_LOG_DEBUG = 3
} capex_log_level;

typedef void (*capex_log_fn)(capex_log_level level, const char *message, void *user_data);

/* fn == NULL restores the default stderr sink. */
CAPEX_API void capex_set_log_callback(capex_log_fn fn, void *user_data);
/* Messages above this level are dropped (default CAPEX_LOG_WARN). */
CAPEX_API void capex_set_log_level(capex_log_level max_level);
/* The default sink prints only on rank 0; a callback sees every rank. */
CAPEX_API void capex_log_set_rank(int rank);
CAPEX_API void capex_log(capex_log_level level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---------------------------------------------------------------------------
   Allocation

   Objects that allocate take an optional const capex_allocator* (NULL: the
   CAPEX_MALLOC family, by default malloc). alloc must return memory aligned to
   at least 16 bytes; capex aligns its own large buffers on top of that.
   ------------------------------------------------------------------------- */
typedef struct capex_allocator {
    void *(*alloc)(size_t size, void *user_data);
    void (*free)(void *ptr, void *user_data);
    void *user_data;
} capex_allocator;

/* ---------------------------------------------------------------------------
   Half types

   fp16 (IEEE binary16) and bf16 are stored as uint16_t. Conversions from f32
   round to nearest, ties to even; subnormals, infinities and signed zeros are
   exact; NaN stays NaN (quietened, sign and top payload bits kept). Pure
   integer arithmetic: results do not depend on FTZ/DAZ or the rounding mode.
   ------------------------------------------------------------------------- */
typedef enum capex_dtype {
    CAPEX_F32 = 0,
    CAPEX_F16 = 1,
    CAPEX_BF16 = 2
} capex_dtype;

CAPEX_API const char *capex_dtype_name(capex_dtype t); /* "float32", ... */
CAPEX_API size_t capex_dtype_size(capex_dtype t);      /* 4 or 2; 0 if invalid */

CAPEX_API uint16_t capex_f32_to_f16(float f);
CAPEX_API float capex_f16_to_f32(uint16_t h);
CAPEX_API uint16_t capex_f32_to_bf16(float f);
CAPEX_API float capex_bf16_to_f32(uint16_t h);
/* Bulk versions; src and dst must not overlap. */
CAPEX_API void capex_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);
CAPEX_API void capex_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
CAPEX_API void capex_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);
CAPEX_API void capex_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);

/* @@SECTION:OPTLEVEL:DECL@@ (opt levels: declarations) */

/* @@SECTION:SCALER:DECL@@ (loss scaler: declarations) */

/* @@SECTION:STATE:DECL@@ (state files: declarations) */

/* @@SECTION:TENSOR:DECL@@ (tensor lists, chunk planner, fused ops: declarations) */

/* @@SECTION:OPTIM:DECL@@ (optimizers: declarations) */

/* @@SECTION:DIST:DECL@@ (data parallel: declarations) */

#ifdef __cplusplus
}
#endif
#endif /* CAPEX_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef CAPEX_IMPLEMENTATION
#ifndef CAPEX__IMPLEMENTED
#define CAPEX__IMPLEMENTED

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(CAPEX_MALLOC) && defined(CAPEX_FREE) && defined(CAPEX_REALLOC)
#elif !defined(CAPEX_MALLOC) && !defined(CAPEX_FREE) && !defined(CAPEX_REALLOC)
#  define CAPEX_MALLOC(sz) malloc(sz)
#  define CAPEX_REALLOC(p, sz) realloc(p, sz)
#  define CAPEX_FREE(p) free(p)
#else
#  error "capex: define all of CAPEX_MALLOC, CAPEX_REALLOC and CAPEX_FREE, or none"
#endif

#ifndef CAPEX_ASSERT
#  include <assert.h>
#  define CAPEX_ASSERT(x) assert(x)
#endif

/* Private functions are static; CAPEX_STATIC builds mark them unused-ok. */
#if defined(__GNUC__) || defined(__clang__)
#  define CAPEX__PRIVATE static __attribute__((unused))
#  define CAPEX__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define CAPEX__PRIVATE static
#  define CAPEX__PRINTF(a, b)
#endif

/* Thread-local storage: C++11, C11, then compiler extensions for C99. */
#if defined(__cplusplus) && __cplusplus >= 201103L
#  define CAPEX__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#  define CAPEX__THREAD_LOCAL _Thread_local
#elif defined(_MSC_VER)
#  define CAPEX__THREAD_LOCAL __declspec(thread)
#else
#  define CAPEX__THREAD_LOCAL __thread
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- results and errors ------------------------------------------------- */

static CAPEX__THREAD_LOCAL char capex__error_message[1024];

CAPEX_API const char *capex_result_string(capex_result r) {
    switch (r) {
    case CAPEX_OK: return "CAPEX_OK";
    case CAPEX_ERR_INVALID_ARG: return "CAPEX_ERR_INVALID_ARG";
    case CAPEX_ERR_SIZE_MISMATCH: return "CAPEX_ERR_SIZE_MISMATCH";
    case CAPEX_ERR_ORDER: return "CAPEX_ERR_ORDER";
    case CAPEX_ERR_OUT_OF_MEMORY: return "CAPEX_ERR_OUT_OF_MEMORY";
    case CAPEX_ERR_IO: return "CAPEX_ERR_IO";
    case CAPEX_ERR_FORMAT: return "CAPEX_ERR_FORMAT";
    case CAPEX_ERR_VERSION: return "CAPEX_ERR_VERSION";
    case CAPEX_ERR_CHECKSUM: return "CAPEX_ERR_CHECKSUM";
    case CAPEX_ERR_CONFIG: return "CAPEX_ERR_CONFIG";
    case CAPEX_ERR_NOT_FOUND: return "CAPEX_ERR_NOT_FOUND";
    case CAPEX_ERR_UNSUPPORTED: return "CAPEX_ERR_UNSUPPORTED";
    case CAPEX_ERR_LIMIT: return "CAPEX_ERR_LIMIT";
    case CAPEX_ERR_NO_DRIVER: return "CAPEX_ERR_NO_DRIVER";
    case CAPEX_ERR_NO_DEVICE: return "CAPEX_ERR_NO_DEVICE";
    case CAPEX_ERR_NO_NVRTC: return "CAPEX_ERR_NO_NVRTC";
    case CAPEX_ERR_NO_NCCL: return "CAPEX_ERR_NO_NCCL";
    case CAPEX_ERR_CUDA: return "CAPEX_ERR_CUDA";
    case CAPEX_ERR_NVRTC: return "CAPEX_ERR_NVRTC";
    case CAPEX_ERR_NCCL: return "CAPEX_ERR_NCCL";
    case CAPEX_ERR_ARCH: return "CAPEX_ERR_ARCH";
    case CAPEX_ERR_COMM: return "CAPEX_ERR_COMM";
    case CAPEX_ERR_TIMEOUT: return "CAPEX_ERR_TIMEOUT";
    case CAPEX_ERR_NO_MPI: return "CAPEX_ERR_NO_MPI";
    case CAPEX_ERR_INTERNAL: return "CAPEX_ERR_INTERNAL";
    }
    return "CAPEX_ERR_UNKNOWN";
}

CAPEX_API const char *capex_last_error(void) { return capex__error_message; }
CAPEX_API void capex_clear_error(void) { capex__error_message[0] = '\0'; }

/* Records the thread-local message and returns code, so call sites read
   `return capex__fail(CAPEX_ERR_..., "what; how to fix", ...);`. */
CAPEX__PRIVATE capex_result capex__fail(capex_result code, const char *fmt, ...) CAPEX__PRINTF(2, 3);
CAPEX__PRIVATE capex_result capex__fail(capex_result code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(capex__error_message, sizeof capex__error_message, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- logging ------------------------------------------------------------ */

static capex_log_fn capex__log_fn = NULL;
static void *capex__log_user = NULL;
static capex_log_level capex__log_max = CAPEX_LOG_WARN;
static int capex__log_rank = 0;

CAPEX_API void capex_set_log_callback(capex_log_fn fn, void *user_data) {
    capex__log_fn = fn;
    capex__log_user = user_data;
}
CAPEX_API void capex_set_log_level(capex_log_level max_level) { capex__log_max = max_level; }
CAPEX_API void capex_log_set_rank(int rank) { capex__log_rank = rank; }

CAPEX_API void capex_log(capex_log_level level, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    if (level > capex__log_max) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (capex__log_fn) {
        capex__log_fn(level, buf, capex__log_user);
        return;
    }
#ifndef CAPEX_NO_STDIO
    if (capex__log_rank == 0) {
        static const char *names[] = {"error", "warning", "info", "debug"};
        fprintf(stderr, "capex %s: %s\n", names[(int)level & 3], buf);
    }
#endif
}

/* ---- allocation --------------------------------------------------------- */

CAPEX__PRIVATE void *capex__alloc(const capex_allocator *a, size_t size) {
    if (size == 0) size = 1;
    if (a && a->alloc) return a->alloc(size, a->user_data);
    return CAPEX_MALLOC(size);
}
CAPEX__PRIVATE void capex__free(const capex_allocator *a, void *p) {
    if (!p) return;
    if (a && a->free) a->free(p, a->user_data);
    else CAPEX_FREE(p);
}

/* ---- half types --------------------------------------------------------- */

CAPEX_API const char *capex_dtype_name(capex_dtype t) {
    switch (t) {
    case CAPEX_F32: return "float32";
    case CAPEX_F16: return "float16";
    case CAPEX_BF16: return "bfloat16";
    }
    return "invalid dtype";
}
CAPEX_API size_t capex_dtype_size(capex_dtype t) {
    switch (t) {
    case CAPEX_F32: return 4;
    case CAPEX_F16: return 2;
    case CAPEX_BF16: return 2;
    }
    return 0;
}

static inline uint32_t capex__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float capex__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Written with selects rather than early returns so the bulk loops vectorise. */
static inline uint16_t capex__f16_from_bits(uint32_t x) {
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t e = ax >> 23;
    /* normal range: rebias the exponent, round the 13 dropped bits RNE */
    uint32_t normal = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    /* subnormal range (|x| < 2^-14): value = m * 2^(e-150) = (m >> (126-e)) * 2^-24 */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = e >= 126u ? 1u : (126u - e > 25u ? 25u : 126u - e);
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    uint32_t sub = r + ((rem > half) | ((rem == half) & (r & 1u)));
    uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
    uint32_t out = ax > 0x7f800000u ? nan
                 : ax >= 0x477ff000u ? 0x7c00u /* >= 65520 rounds to inf */
                 : ax < 0x38800000u ? sub
                 : normal;
    return (uint16_t)(sign | out);
}

static inline float capex__f16_to_f32_inline(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    /* m * 2^-24 is exact in f32 and lands in the normal range: no FTZ issue */
    uint32_t sub = capex__f32_bits((float)m * 5.9604644775390625e-8f);
    uint32_t out = e == 0x1fu ? (0x7f800000u | (m << 13))
                 : e == 0u ? sub
                 : (((e + 112u) << 23) | (m << 13));
    return capex__bits_f32(sign | out);
}

static inline uint16_t capex__bf16_from_bits(uint32_t x) {
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

CAPEX_API uint16_t capex_f32_to_f16(float f) { return capex__f16_from_bits(capex__f32_bits(f)); }
CAPEX_API float capex_f16_to_f32(uint16_t h) { return capex__f16_to_f32_inline(h); }
CAPEX_API uint16_t capex_f32_to_bf16(float f) { return capex__bf16_from_bits(capex__f32_bits(f)); }
CAPEX_API float capex_bf16_to_f32(uint16_t h) { return capex__bits_f32((uint32_t)h << 16); }

CAPEX_API void capex_f32_to_f16_array(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__f16_from_bits(capex__f32_bits(src[i]));
}
CAPEX_API void capex_f16_to_f32_array(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__f16_to_f32_inline(src[i]);
}
CAPEX_API void capex_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__bf16_from_bits(capex__f32_bits(src[i]));
}
CAPEX_API void capex_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__bits_f32((uint32_t)src[i] << 16);
}

/* @@SECTION:OPTLEVEL:IMPL@@ (opt levels: implementation) */

/* @@SECTION:SCALER:IMPL@@ (loss scaler: implementation) */

/* @@SECTION:STATE:IMPL@@ (state files: implementation) */

/* @@SECTION:TENSOR:IMPL@@ (tensor lists, chunk planner, fused ops: implementation) */

/* @@SECTION:OPTIM:IMPL@@ (optimizers: implementation) */

/* @@SECTION:DIST:IMPL@@ (data parallel: implementation) */

#ifdef __cplusplus
}
#endif
#endif /* CAPEX__IMPLEMENTED */
#endif /* CAPEX_IMPLEMENTATION */

/*
   MIT License

   Copyright (c) 2026 the capex authors

   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to
   deal in the Software without restriction, including without limitation the
   rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
   sell copies of the Software, and to permit persons to whom the Software is
   furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in
   all copies or substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
   FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS
   IN THE SOFTWARE.
*/
