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
/* ---------------------------------------------------------------------------
   Loss scaler

   One capex_scaler per loss (Apex num_losses): a plain struct, no allocation,
   on the stack or inside your engine's state. Each iteration, per optimizer:

       float s;   capex_scaler_scale(&sc, &s);          // loss * s, then backward
                  (several scale()+backward for accumulation are fine)
       int inf  = any_inf_or_nan(grads);                // over ALL ranks (allreduce max)
       float inv; capex_scaler_unscale(&sc, opt, inf, &inv); // at most once per iteration
       int go;    capex_scaler_step(&sc, opt, &go);     // go == !inf for this optimizer
       if (go) optimizer_step(grads * inv);             // skipped: touch nothing
       capex_scaler_update(&sc);                        // once, after every optimizer

   Fused kernels that unscale in place take capex_scaler_get_inv_scale() first
   and report their found_inf to capex_scaler_unscale (inv_scale may be NULL).

   Dynamic rule (PyTorch _amp_update_scale_ plus Apex's min/max scale and
   update_scale_hysteresis): on inf/NaN, hysteresis_tracker -= 1; while it is
   still > 0 only the growth tracker resets; else scale = max(min_scale,
   f32(scale * backoff)) and the growth tracker resets. On a clean step the
   growth tracker counts up; at growth_interval, s' = min(max_scale,
   f32(scale * growth)) is taken only if finite, the tracker resets; the
   hysteresis tracker refills. With hysteresis 1, min 0 and max INFINITY this is
   bit for bit PyTorch's GradScaler. Static scalers (dynamic = 0, Apex
   loss_scale=<number>) never change the scale but still skip inf/NaN steps
   (Apex's static mode would step on them).

   Order errors (CAPEX_ERR_ORDER, the scaler unchanged): scale() after an
   optimizer of this iteration was unscaled; unscale() twice or after step();
   step() before unscale() or twice; update() with no optimizer unscaled;
   set_scale()/set_state() inside an iteration. Like PyTorch, update() folds in
   every optimizer unscaled this iteration (stepped or not) and step()'s answer
   is each optimizer's own found_inf.

   Overflows are logged (capex_log WARN, Apex's wording "Gradient overflow.
   Skipping step, loss scaler 0 reducing loss scale to ...") for the first one,
   then at most one message per log_interval iterations with the count of those
   not shown.

   Not thread-safe: one scaler, one thread at a time. Distinct scalers are
   independent (logging goes through the process-wide capex_log sink).
   ------------------------------------------------------------------------- */

/* Optimizers per scaler (index 0..N-1). Part of the struct layout: define it
   identically in every file that includes capex.h. */
#ifndef CAPEX_SCALER_MAX_OPTIMIZERS
#define CAPEX_SCALER_MAX_OPTIMIZERS 8
#endif

typedef struct capex_scaler_desc {
    int dynamic;             /* 1: dynamic (default); 0: static, scale fixed at init_scale */
    float init_scale;        /* 65536 (2^16, Apex and PyTorch)                             */
    double growth_factor;    /* 2.0, must be > 1                                           */
    double backoff_factor;   /* 0.5, in (0, 1)                                             */
    int64_t growth_interval; /* 2000 clean steps before growing, >= 1                      */
    float min_scale;         /* 0 = no floor (Apex min_loss_scale=None)                    */
    float max_scale;         /* 16777216 (2^24, Apex max_loss_scale); INFINITY = no cap    */
    int hysteresis;          /* 1 = back off on every overflow (PyTorch); Apex/Megatron 2  */
    int64_t log_interval;    /* 100: at most one overflow message per this many iterations;
                                0 = no overflow messages                                   */
    int id;                  /* loss index shown in messages (Apex "loss scaler 0")        */
} capex_scaler_desc;

/* The scaler's persistent state, for checkpoints (the state-file code writes
   these fields; PyTorch's GradScaler.state_dict() holds the same plus ours). */
typedef struct capex_scaler_state {
    int dynamic;
    float scale;
    int64_t growth_tracker;   /* clean steps since the last growth/backoff, [0, interval) */
    int hysteresis_tracker;   /* overflows left before backing off, [0, hysteresis]     */
    float init_scale;
    double growth_factor;
    double backoff_factor;
    int64_t growth_interval;
    float min_scale;
    float max_scale;
    int hysteresis;
    int64_t steps;            /* iterations ended by update()/update_to()               */
    int64_t skipped_steps;    /* of which had inf/NaN                                   */
} capex_scaler_state;

/* Read the fields through the functions below; the layout may change. */
typedef struct capex_scaler {
    uint32_t magic;
    capex_scaler_desc desc;
    float scale;
    int64_t growth_tracker;
    int hysteresis_tracker;
    int64_t steps, skipped_steps;
    int scaled;                                          /* scale() this iteration */
    unsigned char stage[CAPEX_SCALER_MAX_OPTIMIZERS];    /* READY/UNSCALED/STEPPED */
    unsigned char found_inf[CAPEX_SCALER_MAX_OPTIMIZERS];
    int64_t last_report;                                 /* steps at last message, -1 none */
    int64_t suppressed;                                  /* overflows not yet reported */
} capex_scaler;

/* Apex/PyTorch defaults (see the field comments). NULL is ignored. */
CAPEX_API void capex_scaler_desc_init(capex_scaler_desc *desc);
/* CAPEX_ERR_INVALID_ARG naming the bad field, or CAPEX_OK. */
CAPEX_API capex_result capex_scaler_desc_check(const capex_scaler_desc *desc);
/* Validates desc; on error sc is left unusable (every call on it fails). */
CAPEX_API capex_result capex_scaler_init(capex_scaler *sc, const capex_scaler_desc *desc);

/* The scale to multiply the loss by. Repeatable (accumulation) until the
   first unscale() of the iteration. */
CAPEX_API capex_result capex_scaler_scale(capex_scaler *sc, float *scale);
/* Records optimizer opt's inf/NaN check (found_inf != 0: some gradient, on
   some rank, was not finite) and gives inv_scale = f32(1 / f64(scale))
   (PyTorch's reciprocal in float64); inv_scale may be NULL. */
CAPEX_API capex_result capex_scaler_unscale(capex_scaler *sc, int opt, int found_inf, float *inv_scale);
/* *do_step = 1 when optimizer opt may step, 0 when this step is skipped
   (leave weights and optimizer state untouched). After unscale(), once. */
CAPEX_API capex_result capex_scaler_step(capex_scaler *sc, int opt, int *do_step);
/* Ends the iteration: applies the rule to the OR of the found_inf of every
   optimizer unscaled this iteration, reports overflows, resets the optimizers. */
CAPEX_API capex_result capex_scaler_update(capex_scaler *sc);
/* PyTorch update(new_scale): ends the iteration with this scale instead of
   the rule (growth tracker kept). new_scale finite, > 0, within [min, max]
   for a dynamic scaler. No inf check needed. */
CAPEX_API capex_result capex_scaler_update_to(capex_scaler *sc, float new_scale);
/* Forgets this iteration's scale/unscale/step calls (after an error in your
   own code); scale, trackers and counters are kept. */
CAPEX_API capex_result capex_scaler_discard_iteration(capex_scaler *sc);

CAPEX_API capex_result capex_scaler_get_scale(const capex_scaler *sc, float *scale);
CAPEX_API capex_result capex_scaler_get_inv_scale(const capex_scaler *sc, float *inv_scale);
/* Between iterations only; same limits as update_to. */
CAPEX_API capex_result capex_scaler_set_scale(capex_scaler *sc, float scale);

/* Export/import for checkpoints. set_state validates every field first and
   leaves sc untouched on error; only between iterations. It restores the rule
   parameters too (like PyTorch load_state_dict) and keeps sc's log_interval
   and id. */
CAPEX_API capex_result capex_scaler_get_state(const capex_scaler *sc, capex_scaler_state *state);
CAPEX_API capex_result capex_scaler_set_state(capex_scaler *sc, const capex_scaler_state *state);

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
/* ---- loss scaler -------------------------------------------------------- */

#define CAPEX__SCALER_MAGIC 0x53434c52u /* "SCLR": catches use before init */
enum { CAPEX__OPT_READY = 0, CAPEX__OPT_UNSCALED = 1, CAPEX__OPT_STEPPED = 2 };

CAPEX_API void capex_scaler_desc_init(capex_scaler_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->dynamic = 1;
    d->init_scale = 65536.0f;        /* 2^16: PyTorch init_scale, Apex LossScaler */
    d->growth_factor = 2.0;
    d->backoff_factor = 0.5;
    d->growth_interval = 2000;
    d->min_scale = 0.0f;             /* Apex min_loss_scale=None */
    d->max_scale = 16777216.0f;      /* 2^24: Apex max_loss_scale */
    d->hysteresis = 1;
    d->log_interval = 100;
    d->id = 0;
}

/* Shared by desc_check and set_state; `what` names the struct in messages. */
CAPEX__PRIVATE capex_result capex__scaler_check_params(const char *what, int dynamic, float init_scale,
                                                       double growth, double backoff, int64_t interval,
                                                       float min_scale, float max_scale, int hysteresis) {
    if (dynamic != 0 && dynamic != 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.dynamic = %d: use 1 (dynamic) or 0 (static)", what, dynamic);
    if (!(init_scale > 0.0f) || !isfinite(init_scale))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.init_scale = %g: must be finite and > 0 (default 65536)", what,
                           (double)init_scale);
    if (!(growth > 1.0) || !isfinite(growth))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.growth_factor = %g: must be finite and > 1 (default 2)", what,
                           growth);
    if (!(backoff > 0.0 && backoff < 1.0))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.backoff_factor = %g: must lie in (0, 1) (default 0.5)", what,
                           backoff);
    if (interval < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.growth_interval = %lld: must be >= 1 (default 2000)", what,
                           (long long)interval);
    if (!(min_scale >= 0.0f) || !isfinite(min_scale))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.min_scale = %g: must be finite and >= 0 (0 = no floor)", what,
                           (double)min_scale);
    if (!(max_scale > 0.0f))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.max_scale = %g: must be > 0 (INFINITY = no cap)", what,
                           (double)max_scale);
    if (min_scale > max_scale)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.min_scale = %g > max_scale = %g: swap them", what,
                           (double)min_scale, (double)max_scale);
    if (hysteresis < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.hysteresis = %d: must be >= 1 (1 = back off on every overflow)",
                           what, hysteresis);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_desc_check(const capex_scaler_desc *d) {
    capex_result r;
    if (!d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_desc is NULL: pass one set by capex_scaler_desc_init");
    r = capex__scaler_check_params("capex_scaler_desc", d->dynamic, d->init_scale, d->growth_factor, d->backoff_factor,
                                   d->growth_interval, d->min_scale, d->max_scale, d->hysteresis);
    if (r != CAPEX_OK) return r;
    if (d->dynamic && (d->init_scale < d->min_scale || d->init_scale > d->max_scale))
        return capex__fail(CAPEX_ERR_INVALID_ARG,
                           "capex_scaler_desc.init_scale = %g lies outside [min_scale, max_scale] = [%g, %g]",
                           (double)d->init_scale, (double)d->min_scale, (double)d->max_scale);
    if (d->log_interval < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_desc.log_interval = %lld: must be >= 0 (0 = silent)",
                           (long long)d->log_interval);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_init(capex_scaler *sc, const capex_scaler_desc *desc) {
    capex_result r;
    if (!sc) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_init: sc is NULL");
    memset(sc, 0, sizeof *sc); /* magic 0: unusable until validated */
    if ((r = capex_scaler_desc_check(desc)) != CAPEX_OK) return r;
    sc->desc = *desc;
    sc->scale = desc->init_scale;
    sc->hysteresis_tracker = desc->hysteresis;
    sc->last_report = -1;
    sc->magic = CAPEX__SCALER_MAGIC;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__scaler_ok(const capex_scaler *sc, const char *fn) {
    if (!sc) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scaler is NULL", fn);
    if (sc->magic != CAPEX__SCALER_MAGIC)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scaler not initialised (or its init failed): call capex_scaler_init",
                           fn);
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__scaler_opt_ok(const capex_scaler *sc, int opt, const char *fn) {
    capex_result r = capex__scaler_ok(sc, fn);
    if (r != CAPEX_OK) return r;
    if (opt < 0 || opt >= CAPEX_SCALER_MAX_OPTIMIZERS)
        return capex__fail(CAPEX_ERR_INVALID_ARG,
                           "%s: optimizer index %d outside [0, %d): raise CAPEX_SCALER_MAX_OPTIMIZERS (in every file)",
                           fn, opt, CAPEX_SCALER_MAX_OPTIMIZERS);
    return CAPEX_OK;
}

/* Idle = no scale/unscale/step since the last update. */
CAPEX__PRIVATE int capex__scaler_idle(const capex_scaler *sc) {
    int i;
    if (sc->scaled) return 0;
    for (i = 0; i < CAPEX_SCALER_MAX_OPTIMIZERS; i++)
        if (sc->stage[i] != CAPEX__OPT_READY) return 0;
    return 1;
}

/* f32(1 / f64(scale)), as PyTorch's scale.double().reciprocal().float(). A
   scale that underflowed to 0 (min_scale 0, as in PyTorch) gives +inf. */
CAPEX__PRIVATE float capex__scaler_inv(float scale) {
    return scale == 0.0f ? (float)INFINITY : (float)(1.0 / (double)scale);
}

CAPEX_API capex_result capex_scaler_scale(capex_scaler *sc, float *scale) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_scale");
    int i;
    if (r != CAPEX_OK) return r;
    if (!scale) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_scale: scale output is NULL");
    for (i = 0; i < CAPEX_SCALER_MAX_OPTIMIZERS; i++)
        if (sc->stage[i] != CAPEX__OPT_READY)
            return capex__fail(CAPEX_ERR_ORDER,
                               "capex_scaler_scale after optimizer %d was unscaled this iteration: scaled and unscaled "
                               "gradients would mix; run every backward before the first unscale, then update()",
                               i);
    sc->scaled = 1;
    *scale = sc->scale;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_unscale(capex_scaler *sc, int opt, int found_inf, float *inv_scale) {
    capex_result r = capex__scaler_opt_ok(sc, opt, "capex_scaler_unscale");
    if (r != CAPEX_OK) return r;
    if (sc->stage[opt] == CAPEX__OPT_UNSCALED)
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_unscale has already been called on optimizer %d since the last update(): "
                           "unscale each optimizer at most once per iteration",
                           opt);
    if (sc->stage[opt] == CAPEX__OPT_STEPPED)
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_unscale on optimizer %d after its step(): call update() to end the iteration",
                           opt);
    sc->stage[opt] = CAPEX__OPT_UNSCALED;
    sc->found_inf[opt] = found_inf != 0;
    if (inv_scale) *inv_scale = capex__scaler_inv(sc->scale);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_step(capex_scaler *sc, int opt, int *do_step) {
    capex_result r = capex__scaler_opt_ok(sc, opt, "capex_scaler_step");
    if (r != CAPEX_OK) return r;
    if (!do_step) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_step: do_step output is NULL");
    if (sc->stage[opt] == CAPEX__OPT_STEPPED)
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_step has already been called on optimizer %d since the last update()", opt);
    if (sc->stage[opt] == CAPEX__OPT_READY)
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_step on optimizer %d before its inf check: call "
                           "capex_scaler_unscale(sc, %d, found_inf, &inv_scale) first",
                           opt, opt);
    sc->stage[opt] = CAPEX__OPT_STEPPED;
    *do_step = !sc->found_inf[opt];
    return CAPEX_OK;
}

/* Apex update_scale_hysteresis (csrc/update_scale_hysteresis.cu), which with
   hysteresis 1 is PyTorch's _amp_update_scale_ (AmpGradScalerKernels.cpp):
   products in float64, rounded to the float32 scale; growth only to a finite
   value. Plus Apex LossScaler's clamps: max(min, .) on backoff, min(max, .)
   on growth. Our hysteresis tracker stops at 0 where Apex's goes negative:
   both back off on every overflow below 1, so the scales are identical. */
CAPEX__PRIVATE void capex__scaler_rule(capex_scaler *sc, int found_inf) {
    const capex_scaler_desc *d = &sc->desc;
    if (!d->dynamic) return;
    if (found_inf) {
        float s;
        if (sc->hysteresis_tracker > 0) sc->hysteresis_tracker--;
        sc->growth_tracker = 0;
        if (sc->hysteresis_tracker > 0) return; /* absorbed: keep the scale */
        s = (float)((double)sc->scale * d->backoff_factor);
        if (s < d->min_scale) s = d->min_scale;
        sc->scale = s;
    } else {
        int64_t successful = sc->growth_tracker + 1;
        if (successful == d->growth_interval) {
            float s = (float)((double)sc->scale * d->growth_factor);
            if (s > d->max_scale) s = d->max_scale; /* an inf under a finite cap becomes the cap */
            if (isfinite(s)) sc->scale = s;
            sc->growth_tracker = 0;
        } else {
            sc->growth_tracker = successful;
        }
        sc->hysteresis_tracker = d->hysteresis;
    }
}

/* First overflow at once, then at most one message per log_interval
   iterations, carrying the count of overflows not shown. A clean iteration
   flushes that count once the interval has passed. */
CAPEX__PRIVATE void capex__scaler_report(capex_scaler *sc, int found_inf) {
    const capex_scaler_desc *d = &sc->desc;
    int due;
    char more[128];
    if (d->log_interval <= 0) return;
    due = sc->last_report < 0 || sc->steps - sc->last_report >= d->log_interval;
    if (!due) {
        if (found_inf) sc->suppressed++;
        return;
    }
    more[0] = '\0';
    if (sc->suppressed > 0)
        snprintf(more, sizeof more, " (%lld earlier overflow%s in the last %lld iterations not shown)",
                 (long long)sc->suppressed, sc->suppressed == 1 ? "" : "s", (long long)(sc->steps - sc->last_report));
    if (found_inf) {
        if (!d->dynamic)
            capex_log(CAPEX_LOG_WARN, "Gradient overflow.  Skipping step, loss scaler %d keeping static loss scale %.9g%s",
                      d->id, (double)sc->scale, more);
        else if (sc->hysteresis_tracker > 0)
            capex_log(CAPEX_LOG_WARN,
                      "Gradient overflow.  Skipping step, loss scaler %d keeping loss scale %.9g (hysteresis: %d more "
                      "overflow%s before backing off)%s",
                      d->id, (double)sc->scale, sc->hysteresis_tracker, sc->hysteresis_tracker == 1 ? "" : "s", more);
        else
            capex_log(CAPEX_LOG_WARN, "Gradient overflow.  Skipping step, loss scaler %d reducing loss scale to %.9g%s",
                      d->id, (double)sc->scale, more);
    } else if (sc->suppressed > 0) {
        capex_log(CAPEX_LOG_WARN,
                  "loss scaler %d: %lld gradient overflow%s (skipped steps) in the last %lld iterations not shown; "
                  "loss scale is now %.9g",
                  d->id, (long long)sc->suppressed, sc->suppressed == 1 ? "" : "s",
                  (long long)(sc->steps - sc->last_report), (double)sc->scale);
    } else {
        return; /* nothing to say */
    }
    sc->suppressed = 0;
    sc->last_report = sc->steps;
}

CAPEX__PRIVATE void capex__scaler_end_iteration(capex_scaler *sc) {
    memset(sc->stage, CAPEX__OPT_READY, sizeof sc->stage);
    memset(sc->found_inf, 0, sizeof sc->found_inf);
    sc->scaled = 0;
}

/* OR of found_inf over the optimizers unscaled this iteration; -1 if none. */
CAPEX__PRIVATE int capex__scaler_found_inf(const capex_scaler *sc) {
    int i, any = -1;
    for (i = 0; i < CAPEX_SCALER_MAX_OPTIMIZERS; i++) {
        if (sc->stage[i] == CAPEX__OPT_READY) continue;
        if (any < 0) any = 0;
        if (sc->found_inf[i]) any = 1;
    }
    return any;
}

CAPEX_API capex_result capex_scaler_update(capex_scaler *sc) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_update");
    int found_inf;
    if (r != CAPEX_OK) return r;
    found_inf = capex__scaler_found_inf(sc);
    if (found_inf < 0)
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_update: no inf checks were recorded prior to update: call "
                           "capex_scaler_unscale for each optimizer (and capex_scaler_step) first");
    capex__scaler_rule(sc, found_inf);
    sc->steps++;
    if (found_inf) sc->skipped_steps++;
    capex__scaler_report(sc, found_inf);
    capex__scaler_end_iteration(sc);
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__scaler_check_new_scale(const capex_scaler *sc, float s, const char *fn) {
    if (!(s > 0.0f) || !isfinite(s))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scale %g must be finite and > 0", fn, (double)s);
    if (sc->desc.dynamic && (s < sc->desc.min_scale || s > sc->desc.max_scale))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scale %g lies outside [min_scale, max_scale] = [%g, %g]", fn,
                           (double)s, (double)sc->desc.min_scale, (double)sc->desc.max_scale);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_update_to(capex_scaler *sc, float new_scale) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_update_to");
    int found_inf;
    if (r != CAPEX_OK) return r;
    if ((r = capex__scaler_check_new_scale(sc, new_scale, "capex_scaler_update_to")) != CAPEX_OK) return r;
    found_inf = capex__scaler_found_inf(sc);
    sc->scale = new_scale;
    sc->steps++;
    if (found_inf > 0) sc->skipped_steps++;
    capex__scaler_end_iteration(sc);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_discard_iteration(capex_scaler *sc) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_discard_iteration");
    if (r != CAPEX_OK) return r;
    capex__scaler_end_iteration(sc);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_get_scale(const capex_scaler *sc, float *scale) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_get_scale");
    if (r != CAPEX_OK) return r;
    if (!scale) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_get_scale: scale output is NULL");
    *scale = sc->scale;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_get_inv_scale(const capex_scaler *sc, float *inv_scale) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_get_inv_scale");
    if (r != CAPEX_OK) return r;
    if (!inv_scale) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_get_inv_scale: inv_scale output is NULL");
    *inv_scale = capex__scaler_inv(sc->scale);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_set_scale(capex_scaler *sc, float scale) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_set_scale");
    if (r != CAPEX_OK) return r;
    if (!capex__scaler_idle(sc))
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_set_scale inside an iteration: the loss was already scaled with %g; use "
                           "capex_scaler_update_to(sc, scale) to end the iteration with a new scale",
                           (double)sc->scale);
    if ((r = capex__scaler_check_new_scale(sc, scale, "capex_scaler_set_scale")) != CAPEX_OK) return r;
    sc->scale = scale;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_get_state(const capex_scaler *sc, capex_scaler_state *st) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_get_state");
    if (r != CAPEX_OK) return r;
    if (!st) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_get_state: state output is NULL");
    memset(st, 0, sizeof *st);
    st->dynamic = sc->desc.dynamic;
    st->scale = sc->scale;
    st->growth_tracker = sc->growth_tracker;
    st->hysteresis_tracker = sc->hysteresis_tracker;
    st->init_scale = sc->desc.init_scale;
    st->growth_factor = sc->desc.growth_factor;
    st->backoff_factor = sc->desc.backoff_factor;
    st->growth_interval = sc->desc.growth_interval;
    st->min_scale = sc->desc.min_scale;
    st->max_scale = sc->desc.max_scale;
    st->hysteresis = sc->desc.hysteresis;
    st->steps = sc->steps;
    st->skipped_steps = sc->skipped_steps;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_set_state(capex_scaler *sc, const capex_scaler_state *st) {
    capex_result r = capex__scaler_ok(sc, "capex_scaler_set_state");
    const char *w = "capex_scaler_state";
    if (r != CAPEX_OK) return r;
    if (!st) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_set_state: state is NULL");
    if (!capex__scaler_idle(sc))
        return capex__fail(CAPEX_ERR_ORDER,
                           "capex_scaler_set_state inside an iteration: restore before the first scale() or after "
                           "update() (or capex_scaler_discard_iteration)");
    r = capex__scaler_check_params(w, st->dynamic, st->init_scale, st->growth_factor, st->backoff_factor,
                                   st->growth_interval, st->min_scale, st->max_scale, st->hysteresis);
    if (r != CAPEX_OK) return r;
    /* A dynamic scale stays in [min, max]; with no floor it may have
       underflowed to 0 exactly as PyTorch's does after ~150 overflows. */
    if (!isfinite(st->scale) || !(st->scale >= 0.0f) || (st->scale == 0.0f && (!st->dynamic || st->min_scale > 0.0f)))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.scale = %g: must be finite and > 0", w, (double)st->scale);
    if (st->dynamic && (st->scale < st->min_scale || st->scale > st->max_scale))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.scale = %g lies outside [min_scale, max_scale] = [%g, %g]", w,
                           (double)st->scale, (double)st->min_scale, (double)st->max_scale);
    if (st->growth_tracker < 0 || st->growth_tracker >= st->growth_interval)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.growth_tracker = %lld: must lie in [0, growth_interval = %lld)", w,
                           (long long)st->growth_tracker, (long long)st->growth_interval);
    if (st->hysteresis_tracker < 0 || st->hysteresis_tracker > st->hysteresis)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.hysteresis_tracker = %d: must lie in [0, hysteresis = %d]", w,
                           st->hysteresis_tracker, st->hysteresis);
    if (st->steps < 0 || st->skipped_steps < 0 || st->skipped_steps > st->steps)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: steps = %lld, skipped_steps = %lld: need 0 <= skipped <= steps", w,
                           (long long)st->steps, (long long)st->skipped_steps);
    sc->desc.dynamic = st->dynamic;
    sc->desc.init_scale = st->init_scale;
    sc->desc.growth_factor = st->growth_factor;
    sc->desc.backoff_factor = st->backoff_factor;
    sc->desc.growth_interval = st->growth_interval;
    sc->desc.min_scale = st->min_scale;
    sc->desc.max_scale = st->max_scale;
    sc->desc.hysteresis = st->hysteresis;
    sc->scale = st->scale;
    sc->growth_tracker = st->growth_tracker;
    sc->hysteresis_tracker = st->hysteresis_tracker;
    sc->steps = st->steps;
    sc->skipped_steps = st->skipped_steps;
    sc->last_report = -1;
    sc->suppressed = 0;
    return CAPEX_OK;
}

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
