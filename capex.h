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
/* ---------------------------------------------------------------------------
   Tensor lists, chunk planner, fused multi-tensor ops (CPU backend)

   A tensor is (data, numel); a tensor list is an array of them that share one
   dtype. Several lists passed to one op (grads, params, moments, ...) must have
   the same count and the same numel at each index. Sizes are int64_t
   throughout. Data must be aligned to its element size (4 bytes for f32, 2 for
   f16/bf16); a misaligned, NULL (with numel > 0) or negative-size tensor is
   refused with CAPEX_ERR_INVALID_ARG. Zero-size tensors are fine and skipped.

       capex_tensor g[2] = {{w_grad, 4096}, {b_grad, 64}};
       capex_tensor_list grads = capex_tensor_list_make(CAPEX_F32, g, 2);
       int found_inf = 0; float norm;
       capex_multi_tensor_scale(NULL, &grads, &grads, 1.0f / loss_scale, &found_inf);
       if (!found_inf) capex_clip_grad_norm(NULL, &grads, 1, 1.0f, &norm);

   Work is cut into chunks of 65536 elements (capex_tensor_op_desc.chunk_size)
   by the chunk planner, the same host logic a GPU backend uses to build its
   kernel launches (Apex multi_tensor_apply with 64-bit sizes). With OpenMP
   (-fopenmp) the chunks run in parallel; reductions keep one partial per chunk
   and combine them serially in chunk order, so every result has the same bits
   for any thread count and with or without OpenMP.

   Thread safety: the ops are reentrant; distinct calls may run concurrently
   on distinct outputs. A capex_chunk_plan must not be shared between threads.
   ------------------------------------------------------------------------- */
typedef struct capex_tensor {
    void *data;    /* host pointer here; device pointer for a GPU backend */
    int64_t numel; /* elements, >= 0 */
} capex_tensor;

typedef struct capex_tensor_list {
    capex_dtype dtype;
    size_t count;
    const capex_tensor *tensors; /* count entries (may be NULL if count is 0) */
} capex_tensor_list;

/* Fills the struct (C++ and C89-style code have no compound literals). */
CAPEX_API capex_tensor_list capex_tensor_list_make(capex_dtype dtype, const capex_tensor *tensors, size_t count);
/* Validates one list (dtype, pointers, alignment, sizes); CAPEX_OK or why not. */
CAPEX_API capex_result capex_tensor_list_check(const capex_tensor_list *list);
/* Total elements; -1 if list is invalid. */
CAPEX_API int64_t capex_tensor_list_numel(const capex_tensor_list *list);

/* ---- chunk planner (host arithmetic only, allocates nothing) ------------

   Launch metadata is passed by value to a GPU kernel, so it must fit the
   4096-byte kernel-parameter limit. Its layout for a launch over DEPTH lists
   (addresses of DEPTH tensors per slot) is CAPEX_MTA_META_STRUCT below:
   8*(DEPTH+1)*T + 1608 bytes with T = CAPEX_MTA_MAX_TENSORS(DEPTH) and 320
   blocks, which stays under CAPEX_MTA_META_BYTES (3840: 4096 minus 256 bytes
   kept for the op's own scalar arguments). T by depth 1..6: 139, 93, 69, 55,
   46, 39 (Apex: 110, 64, 48, 36, 30 with 32-bit sizes). Every element of every
   tensor is in exactly one chunk; chunks come in tensor order then offset
   order; a tensor larger than a chunk spans chunks and may span launches;
   empty tensors get no chunk. */
#define CAPEX_CHUNK_SIZE_DEFAULT 65536
#define CAPEX_MTA_MAX_DEPTH 6
#define CAPEX_MTA_MAX_BLOCKS 320
#define CAPEX_MTA_META_BYTES 3840
#define CAPEX_MTA_MAX_TENSORS(depth) \
    ((CAPEX_MTA_META_BYTES - 8 - 5 * CAPEX_MTA_MAX_BLOCKS) / (8 * ((depth) + 1)))
/* Largest capacity (depth 1); bounds the host launch arrays. */
#define CAPEX_MTA_LAUNCH_TENSORS CAPEX_MTA_MAX_TENSORS(1)

/* The by-value kernel argument for DEPTH lists, identical on host and device
   (fixed-width fields, largest first: no padding). Block b works on chunk
   block_chunk[b] of slot block_tensor[b]: elements
   [block_chunk*chunk_size, min(numel, (block_chunk+1)*chunk_size)). */
#define CAPEX_MTA_META_STRUCT(NAME, DEPTH)                            \
    typedef struct NAME {                                             \
        uint64_t addr[DEPTH][CAPEX_MTA_MAX_TENSORS(DEPTH)];           \
        int64_t numel[CAPEX_MTA_MAX_TENSORS(DEPTH)];                  \
        int32_t ntensors, nblocks;                                    \
        uint32_t block_chunk[CAPEX_MTA_MAX_BLOCKS];                   \
        uint8_t block_tensor[CAPEX_MTA_MAX_BLOCKS];                   \
    } NAME
#define CAPEX_MTA_META_SIZE(depth) \
    (8 * ((depth) + 1) * CAPEX_MTA_MAX_TENSORS(depth) + 8 + 5 * CAPEX_MTA_MAX_BLOCKS)

/* Planner state (an iterator; copy it to replay). Read-only for callers. */
typedef struct capex_chunk_plan {
    const capex_tensor *tensors;
    size_t count;
    int64_t chunk_size;
    int max_tensors, max_blocks; /* per launch */
    int64_t total_chunks;        /* chunks over all tensors */
    int64_t total_elements;
    size_t next_tensor;          /* cursor */
    int64_t next_chunk;          /* chunk within next_tensor */
    int64_t chunks_done;         /* global index of the next chunk */
    int64_t launches;            /* launches returned so far */
} capex_chunk_plan;

/* One launch: up to max_tensors slots and max_blocks chunks. */
typedef struct capex_chunk_launch {
    int ntensors, nblocks;
    int64_t first_chunk;                         /* global index of block 0's chunk */
    size_t tensor[CAPEX_MTA_LAUNCH_TENSORS];     /* slot -> index in the lists */
    int64_t numel[CAPEX_MTA_LAUNCH_TENSORS];     /* slot -> numel */
    uint8_t block_tensor[CAPEX_MTA_MAX_BLOCKS];  /* block -> slot */
    uint32_t block_chunk[CAPEX_MTA_MAX_BLOCKS];  /* block -> chunk index in its tensor */
} capex_chunk_launch;

/* Capacity for a kernel over `depth` lists (1..CAPEX_MTA_MAX_DEPTH); 0 if out of range. */
CAPEX_API int capex_mta_max_tensors(int depth);
/* tensors may have data == NULL: only numel is read. chunk_size 0 means
   CAPEX_CHUNK_SIZE_DEFAULT; max_tensors in 1..CAPEX_MTA_LAUNCH_TENSORS,
   max_blocks in 1..CAPEX_MTA_MAX_BLOCKS (0 for either: the depth-1 maximum).
   A tensor of more than 2^32 chunks gives CAPEX_ERR_LIMIT. */
CAPEX_API capex_result capex_chunk_plan_init(capex_chunk_plan *plan, const capex_tensor *tensors, size_t count,
                                             int64_t chunk_size, int max_tensors, int max_blocks);
/* Fills *launch with the next launch; returns 1, or 0 when the plan is done. */
CAPEX_API int capex_chunk_plan_next(capex_chunk_plan *plan, capex_chunk_launch *launch);
/* Block b of a launch: index in the lists, first element and element count. */
CAPEX_API void capex_chunk_launch_block(const capex_chunk_plan *plan, const capex_chunk_launch *launch, int b,
                                        size_t *tensor, int64_t *offset, int64_t *count);

/* ---- fused ops ---------------------------------------------------------- */

/* Execution settings shared by every multi-tensor op (and the optimizers). */
typedef struct capex_tensor_op_desc {
    int num_threads;               /* OpenMP threads; 0: OpenMP's default (omp_set_num_threads,
                                      OMP_NUM_THREADS). Ignored without OpenMP. */
    int64_t chunk_size;            /* elements per chunk; 0: 65536. Norm bits depend on it
                                      (and on nothing else). */
    int64_t parallel_min_elements; /* launches smaller than this run on the calling thread,
                                      so small lists pay no thread start-up; 0: 262144 */
} capex_tensor_op_desc;
CAPEX_API void capex_tensor_op_desc_init(capex_tensor_op_desc *desc);

/* Sum of squares in float64, per tensor and in total (either output may be
   NULL; per_tensor has x->count entries). Fixed order: in a chunk, element i
   (from the chunk start) is added to lane i%8 as (double)x*(double)x (exact),
   lanes combine as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); chunk partials are
   added in chunk order, starting from 0.0, into the tensor's and the total's
   sum. Worst-case relative error about (chunk_size/8 + chunks) * 2^-53: 1e-12
   at 10M elements (3e-15 measured there against a compensated sum). Never
   overflows for f32 data. */
CAPEX_API capex_result capex_multi_tensor_sumsq(const capex_tensor_op_desc *desc, const capex_tensor_list *x,
                                                double *total_sumsq, double *per_tensor_sumsq);
/* Apex multi_tensor_l2norm (per_tensor=True): float(sqrt(sumsq)) of the above.
   Either output may be NULL. Non-finite inputs give inf/NaN norms. */
CAPEX_API capex_result capex_multi_tensor_l2norm(const capex_tensor_op_desc *desc, const capex_tensor_list *x,
                                                 float *total_norm, float *per_tensor_norms);
/* Apex multi_tensor_scale: out = in * scale, computed in f32 and rounded
   (RNE) to out's dtype. Any dtype to any dtype: unscale f16/bf16 grads into
   f32 master grads, or in place (out == in, same dtype). Sets *found_inf = 1
   if any input or stored output is inf or NaN (never clears it, so calls
   accumulate: start from 0); found_inf may be NULL. Every element is written
   even when found_inf is set. scale must be finite. Tensors of out must not
   partially overlap those of in. */
CAPEX_API capex_result capex_multi_tensor_scale(const capex_tensor_op_desc *desc, const capex_tensor_list *in,
                                                const capex_tensor_list *out, float scale, int *found_inf);

/* Apex multi_tensor_axpby: out = a*x + b*y, any dtype for each list. The
   value is float((double)a*x + (double)b*y) (products exact, one double
   rounding, so no dependence on FMA contraction), rounded RNE to out's dtype.
   arg_to_check: -1 checks x and y, 0 only x, 1 only y for inf/NaN (inputs, as
   Apex); sets *found_inf = 1 when found (may be NULL). a, b must be finite.
   out may be x or y (same dtype), not a partial overlap. */
CAPEX_API capex_result capex_multi_tensor_axpby(const capex_tensor_op_desc *desc, float a, const capex_tensor_list *x,
                                                float b, const capex_tensor_list *y, const capex_tensor_list *out,
                                                int arg_to_check, int *found_inf);

/* PyTorch clip_grad_norm_ (L2) over nlists lists (dtypes may differ):
   total = sqrt(sum of every list's sumsq, lists in order) as float;
   coef = max_norm / (total + 1e-6f) in f32; if coef < 1 every grad is
   multiplied by coef in place (g = float(g) * coef, rounded to its dtype).
   Returns total in *total_norm (may be NULL). Differs from PyTorch on a
   non-finite total: grads are left untouched (PyTorch would write NaN/0);
   the loss scaler skips that step anyway. max_norm: >= 0, not NaN (inf: never clip). */
CAPEX_API capex_result capex_clip_grad_norm(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                            size_t nlists, float max_norm, float *total_norm);
/* The same, computing only: *clip_coef = min(1, coef) (1 for a non-finite
   total) for an optimizer to fold into g; grads are not written. */
CAPEX_API capex_result capex_clip_grad_norm_coef(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                                 size_t nlists, float max_norm, float *total_norm, float *clip_coef);
/* min(1, max_norm / (total_norm + 1e-6f)) in f32; 1 if that is NaN or total is not finite. */
CAPEX_API float capex_clip_coef(float total_norm, float max_norm);

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
/* ---- tensor lists ------------------------------------------------------- */

/* The kernel metadata must fit the kernel-parameter budget at every depth
   (negative array size = compile error). */
CAPEX_MTA_META_STRUCT(capex__mta_meta1, 1);
CAPEX_MTA_META_STRUCT(capex__mta_meta6, CAPEX_MTA_MAX_DEPTH);
typedef char capex__mta_meta1_fits[(sizeof(capex__mta_meta1) == CAPEX_MTA_META_SIZE(1) &&
                                    sizeof(capex__mta_meta1) <= CAPEX_MTA_META_BYTES) ? 1 : -1];
typedef char capex__mta_meta6_fits[(sizeof(capex__mta_meta6) == CAPEX_MTA_META_SIZE(CAPEX_MTA_MAX_DEPTH) &&
                                    sizeof(capex__mta_meta6) <= CAPEX_MTA_META_BYTES) ? 1 : -1];
typedef char capex__mta_slots_fit_u8[CAPEX_MTA_LAUNCH_TENSORS <= 256 ? 1 : -1];

CAPEX_API capex_tensor_list capex_tensor_list_make(capex_dtype dtype, const capex_tensor *tensors, size_t count) {
    capex_tensor_list l;
    l.dtype = dtype;
    l.count = count;
    l.tensors = tensors;
    return l;
}

/* Validates one list; fn and name make the message say where. */
CAPEX__PRIVATE capex_result capex__check_list(const char *fn, const char *name, const capex_tensor_list *l) {
    size_t i, es;
    if (!l) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s is NULL; pass a capex_tensor_list", fn, name);
    es = capex_dtype_size(l->dtype);
    if (es == 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s has invalid dtype %d; use CAPEX_F32, CAPEX_F16 or CAPEX_BF16",
                           fn, name, (int)l->dtype);
    if (l->count > 0 && !l->tensors)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s has count %zu but tensors == NULL", fn, name, l->count);
    for (i = 0; i < l->count; i++) {
        const capex_tensor *t = &l->tensors[i];
        if (t->numel < 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu].numel is %lld; sizes must be >= 0", fn, name, i,
                               (long long)t->numel);
        if (t->numel == 0) continue;
        if (!t->data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu].data is NULL with numel %lld", fn, name, i,
                               (long long)t->numel);
        if ((uint64_t)t->numel > (uint64_t)PTRDIFF_MAX / es)
            return capex__fail(CAPEX_ERR_LIMIT, "%s: %s[%zu].numel %lld does not fit this address space", fn, name, i,
                               (long long)t->numel);
        if ((uintptr_t)t->data % es != 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG,
                               "%s: %s[%zu].data = %p is misaligned for %s (needs %zu-byte alignment); "
                               "allocate with malloc or copy to an aligned buffer",
                               fn, name, i, t->data, capex_dtype_name(l->dtype), es);
    }
    return CAPEX_OK;
}

/* Same count and same numel at every index. */
CAPEX__PRIVATE capex_result capex__check_same(const char *fn, const char *na, const capex_tensor_list *a,
                                              const char *nb, const capex_tensor_list *b) {
    size_t i;
    if (a->count != b->count)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: %s has %zu tensors but %s has %zu; lists must match", fn, na,
                           a->count, nb, b->count);
    for (i = 0; i < a->count; i++)
        if (a->tensors[i].numel != b->tensors[i].numel)
            return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: %s[%zu] has %lld elements but %s[%zu] has %lld", fn, na, i,
                               (long long)a->tensors[i].numel, nb, i, (long long)b->tensors[i].numel);
    return CAPEX_OK;
}

/* out may alias in exactly (in place) only when both have the same dtype. */
CAPEX__PRIVATE capex_result capex__check_alias(const char *fn, const char *nin, const capex_tensor_list *in,
                                               const char *nout, const capex_tensor_list *out) {
    size_t i;
    if (in->dtype == out->dtype) return CAPEX_OK;
    for (i = 0; i < in->count; i++)
        if (in->tensors[i].numel > 0 && in->tensors[i].data == out->tensors[i].data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] (%s) and %s[%zu] (%s) are the same memory; in-place "
                               "needs one dtype, use a separate output buffer", fn, nin, i,
                               capex_dtype_name(in->dtype), nout, i, capex_dtype_name(out->dtype));
    return CAPEX_OK;
}

CAPEX_API capex_result capex_tensor_list_check(const capex_tensor_list *list) {
    return capex__check_list("capex_tensor_list_check", "list", list);
}

CAPEX_API int64_t capex_tensor_list_numel(const capex_tensor_list *list) {
    int64_t n = 0;
    size_t i;
    if (!list || (list->count && !list->tensors)) return -1;
    for (i = 0; i < list->count; i++) {
        if (list->tensors[i].numel < 0 || list->tensors[i].numel > INT64_MAX - n) return -1;
        n += list->tensors[i].numel;
    }
    return n;
}

/* ---- chunk planner ------------------------------------------------------ */

CAPEX_API int capex_mta_max_tensors(int depth) {
    if (depth < 1 || depth > CAPEX_MTA_MAX_DEPTH) return 0;
    return (int)CAPEX_MTA_MAX_TENSORS(depth);
}

CAPEX_API capex_result capex_chunk_plan_init(capex_chunk_plan *plan, const capex_tensor *tensors, size_t count,
                                             int64_t chunk_size, int max_tensors, int max_blocks) {
    size_t i;
    if (!plan) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_chunk_plan_init: plan is NULL");
    memset(plan, 0, sizeof *plan);
    if (count > 0 && !tensors)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_chunk_plan_init: count is %zu but tensors is NULL", count);
    if (chunk_size == 0) chunk_size = CAPEX_CHUNK_SIZE_DEFAULT;
    if (max_tensors == 0) max_tensors = (int)CAPEX_MTA_LAUNCH_TENSORS;
    if (max_blocks == 0) max_blocks = CAPEX_MTA_MAX_BLOCKS;
    if (chunk_size < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_chunk_plan_init: chunk_size %lld must be > 0 (0: default)",
                           (long long)chunk_size);
    if (max_tensors < 1 || max_tensors > (int)CAPEX_MTA_LAUNCH_TENSORS || max_blocks < 1 ||
        max_blocks > CAPEX_MTA_MAX_BLOCKS)
        return capex__fail(CAPEX_ERR_INVALID_ARG,
                           "capex_chunk_plan_init: max_tensors %d / max_blocks %d out of range 1..%d / 1..%d", max_tensors,
                           max_blocks, (int)CAPEX_MTA_LAUNCH_TENSORS, CAPEX_MTA_MAX_BLOCKS);
    for (i = 0; i < count; i++) {
        int64_t n = tensors[i].numel, nch;
        if (n < 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_chunk_plan_init: tensors[%zu].numel is %lld; must be >= 0",
                               i, (long long)n);
        nch = n / chunk_size + (n % chunk_size != 0);
        if (nch > (int64_t)UINT32_MAX + 1)
            return capex__fail(CAPEX_ERR_LIMIT, "capex_chunk_plan_init: tensors[%zu] needs %lld chunks (max 2^32); "
                               "use a larger chunk_size", i, (long long)nch);
        if (n > INT64_MAX - plan->total_elements)
            return capex__fail(CAPEX_ERR_LIMIT, "capex_chunk_plan_init: total size overflows int64");
        plan->total_elements += n;
        plan->total_chunks += nch;
    }
    plan->tensors = tensors;
    plan->count = count;
    plan->chunk_size = chunk_size;
    plan->max_tensors = max_tensors;
    plan->max_blocks = max_blocks;
    return CAPEX_OK;
}

/* Apex multi_tensor_apply's loop as an iterator: a launch closes when its
   blocks or its tensor slots are full; a tensor cut by a full launch carries
   on in slot 0 of the next one. */
CAPEX_API int capex_chunk_plan_next(capex_chunk_plan *plan, capex_chunk_launch *launch) {
    if (!plan || !launch) return 0;
    launch->ntensors = 0;
    launch->nblocks = 0;
    launch->first_chunk = plan->chunks_done;
    while (plan->next_tensor < plan->count && launch->nblocks < plan->max_blocks) {
        size_t t = plan->next_tensor;
        int64_t n = plan->tensors[t].numel;
        int64_t nch = n / plan->chunk_size + (n % plan->chunk_size != 0);
        int slot;
        if (n <= 0) { plan->next_tensor++; plan->next_chunk = 0; continue; }
        if (launch->ntensors == plan->max_tensors) break;
        slot = launch->ntensors++;
        launch->tensor[slot] = t;
        launch->numel[slot] = n;
        while (plan->next_chunk < nch && launch->nblocks < plan->max_blocks) {
            launch->block_tensor[launch->nblocks] = (uint8_t)slot;
            launch->block_chunk[launch->nblocks] = (uint32_t)plan->next_chunk;
            launch->nblocks++;
            plan->next_chunk++;
        }
        if (plan->next_chunk == nch) { plan->next_tensor++; plan->next_chunk = 0; }
    }
    if (launch->nblocks == 0) return 0;
    plan->chunks_done += launch->nblocks;
    plan->launches++;
    return 1;
}

CAPEX_API void capex_chunk_launch_block(const capex_chunk_plan *plan, const capex_chunk_launch *launch, int b,
                                        size_t *tensor, int64_t *offset, int64_t *count) {
    int slot = launch->block_tensor[b];
    int64_t off = (int64_t)launch->block_chunk[b] * plan->chunk_size;
    int64_t left = launch->numel[slot] - off;
    if (tensor) *tensor = launch->tensor[slot];
    if (offset) *offset = off;
    if (count) *count = left < plan->chunk_size ? left : plan->chunk_size;
}

/* ---- execution: chunks in parallel, partials combined in chunk order ---- */

CAPEX_API void capex_tensor_op_desc_init(capex_tensor_op_desc *desc) {
    if (!desc) return;
    desc->num_threads = 0;
    desc->chunk_size = CAPEX_CHUNK_SIZE_DEFAULT;
    desc->parallel_min_elements = 262144;
}

/* Per-chunk work: elements [off, off+n) of tensor t. Writes its own bad flag
   and partial (one slot per block: no sharing between threads). */
typedef void (*capex__chunk_fn)(void *ctx, size_t t, int64_t off, int64_t n, uint32_t *bad, double *part);
/* Serial, in chunk order: folds a chunk's partial. */
typedef void (*capex__fold_fn)(void *ctx, size_t t, double part);

typedef struct capex__launch_job {
    const capex_chunk_plan *plan;
    const capex_chunk_launch *launch;
    capex__chunk_fn fn;
    void *ctx;
    uint32_t *bad;
    double *part;
} capex__launch_job;

CAPEX__PRIVATE void capex__run_block(const capex__launch_job *j, int b) {
    size_t t;
    int64_t off, n;
    capex_chunk_launch_block(j->plan, j->launch, b, &t, &off, &n);
    j->bad[b] = 0;
    j->part[b] = 0.0;
    j->fn(j->ctx, t, off, n, &j->bad[b], &j->part[b]);
}

CAPEX__PRIVATE capex_result capex__check_desc(const char *fn, const capex_tensor_op_desc *d) {
    if (d->num_threads < 0 || d->chunk_size < 0 || d->parallel_min_elements < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: desc has negative num_threads/chunk_size/parallel_min_elements; "
                           "start from capex_tensor_op_desc_init()", fn);
    return CAPEX_OK;
}

/* Runs fn on every chunk of `tensors` (the shape of the op's lists); ORs the
   chunks' bad flags into *bad_out and folds partials in chunk order. */
CAPEX__PRIVATE capex_result capex__for_chunks(const char *name, const capex_tensor_op_desc *desc,
                                              const capex_tensor *tensors, size_t count, capex__chunk_fn fn,
                                              capex__fold_fn fold, void *ctx, uint32_t *bad_out) {
    capex_tensor_op_desc dd;
    capex_chunk_plan plan;
    capex_chunk_launch launch;
    uint32_t bad[CAPEX_MTA_MAX_BLOCKS];
    double part[CAPEX_MTA_MAX_BLOCKS];
    uint32_t anybad = 0;
    capex_result r;
    if (!desc) { capex_tensor_op_desc_init(&dd); desc = &dd; }
    if ((r = capex__check_desc(name, desc)) != CAPEX_OK) return r;
    if ((r = capex_chunk_plan_init(&plan, tensors, count, desc->chunk_size, 0, 0)) != CAPEX_OK) return r;
    while (capex_chunk_plan_next(&plan, &launch)) {
        capex__launch_job job;
        int b;
        job.plan = &plan; job.launch = &launch; job.fn = fn; job.ctx = ctx; job.bad = bad; job.part = part;
#ifdef _OPENMP
        {
            int64_t elems = 0;
            int par, nt = desc->num_threads;
            int64_t minel = desc->parallel_min_elements ? desc->parallel_min_elements : 262144;
            for (b = 0; b < launch.nblocks; b++) {
                int64_t n;
                capex_chunk_launch_block(&plan, &launch, b, NULL, NULL, &n);
                elems += n;
            }
            par = elems >= minel && nt != 1 && launch.nblocks > 1;
            if (nt > 0) {
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
                for (b = 0; b < launch.nblocks; b++) capex__run_block(&job, b);
            } else {
#pragma omp parallel for schedule(static) if (par)
                for (b = 0; b < launch.nblocks; b++) capex__run_block(&job, b);
            }
        }
#else
        for (b = 0; b < launch.nblocks; b++) capex__run_block(&job, b);
#endif
        for (b = 0; b < launch.nblocks; b++) {
            anybad |= bad[b];
            if (fold) fold(ctx, launch.tensor[launch.block_tensor[b]], part[b]);
        }
    }
    if (bad_out) *bad_out |= anybad;
    return CAPEX_OK;
}

/* ---- element codecs: value <-> code, and "code is inf or NaN" -----------
   Loops below are specialised per dtype combination by these macros, so the
   inner loops have no calls through pointers and no dtype branches. */
/* Vectorisable half codecs, bit-identical to capex_f16_to_f32 and
   capex_f32_to_f16 (checked by the tests). The paths are computed
   unconditionally and merged with bit masks: GCC will not if-convert a
   float op it might have to trap on, nor some mixes of comparison booleans,
   so the core versions keep these loops scalar (2-3x slower). */
static inline float capex__f16_to_f32_v(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    /* subnormal: m * 2^-24, exact, and a normal f32 (no FTZ/DAZ effect) */
    uint32_t sub = capex__f32_bits((float)(int32_t)m * 5.9604644775390625e-8f);
    uint32_t normal = ((e + 112u) << 23) | (m << 13);
    uint32_t infnan = 0u - (uint32_t)(e == 0x1fu), zero = 0u - (uint32_t)(e == 0u);
    normal |= infnan & 0x7f800000u; /* e = 31: exponent 255, mantissa kept */
    return capex__bits_f32(sign | (zero & sub) | (~zero & normal));
}
static inline uint16_t capex__f32_to_f16_v(float f) {
    uint32_t x = capex__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* normal: rebias, round the 13 dropped bits to nearest even */
    uint32_t normal = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    /* |x| < 2^-14: adding 0.5 puts the 10 f16 mantissa bits at the bottom of
       the f32 mantissa, rounded to nearest even by the FPU (default mode) */
    uint32_t sub = capex__f32_bits(capex__bits_f32(ax) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
    uint32_t ms = 0u - (uint32_t)(ax < 0x38800000u);
    uint32_t mo = 0u - (uint32_t)(ax >= 0x477ff000u); /* >= 65520 rounds to inf */
    uint32_t mn = 0u - (uint32_t)(ax > 0x7f800000u);
    uint32_t out = (ms & sub) | (~ms & normal);
    out = (mo & 0x7c00u) | (~mo & out);
    out = (mn & nan) | (~mn & out);
    return (uint16_t)(sign | out);
}

#define CAPEX__T_F32 float
#define CAPEX__T_F16 uint16_t
#define CAPEX__T_BF16 uint16_t
#define CAPEX__TOF_F32(v) (v)
#define CAPEX__TOF_F16(v) capex__f16_to_f32_v(v)
#define CAPEX__TOF_BF16(v) capex__bits_f32((uint32_t)(v) << 16)
#define CAPEX__FROMF_F32(f) (f)
#define CAPEX__FROMF_F16(f) capex__f32_to_f16_v(f)
#define CAPEX__FROMF_BF16(f) capex__bf16_from_bits(capex__f32_bits(f))
#define CAPEX__NF_F32(v) ((uint32_t)((capex__f32_bits(v) & 0x7f800000u) == 0x7f800000u))
#define CAPEX__NF_F16(v) ((uint32_t)(((v) & 0x7c00u) == 0x7c00u))
#define CAPEX__NF_BF16(v) ((uint32_t)(((v) & 0x7f80u) == 0x7f80u))

/* sum of squares of one chunk, fixed order (see capex_multi_tensor_sumsq) */
#define CAPEX__SUMSQ_KERNEL(X)                                                         \
    CAPEX__PRIVATE double capex__sumsq_##X(const void *x_, int64_t n) {                \
        const CAPEX__T_##X *x = (const CAPEX__T_##X *)x_;                              \
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                        \
        int64_t i = 0;                                                                 \
        for (; i + 8 <= n; i += 8)                                                     \
            for (int j = 0; j < 8; j++) {                                              \
                double v = (double)CAPEX__TOF_##X(x[i + j]);                           \
                s[j] += v * v;                                                         \
            }                                                                          \
        for (; i < n; i++) {                                                           \
            double v = (double)CAPEX__TOF_##X(x[i]);                                   \
            s[i & 7] += v * v;                                                         \
        }                                                                              \
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));     \
    }
CAPEX__SUMSQ_KERNEL(F32)
CAPEX__SUMSQ_KERNEL(F16)
CAPEX__SUMSQ_KERNEL(BF16)

typedef double (*capex__sumsq_kern)(const void *, int64_t);
/* Chunks arrive in tensor order, so per-tensor sums need one running
   accumulator, flushed when the tensor changes: no allocation. */
typedef struct capex__sumsq_ctx {
    const capex_tensor_list *x;
    capex__sumsq_kern kern;
    size_t es;
    double total, acc;
    size_t cur;
    int open;
    double *per_d;
    float *per_f;
} capex__sumsq_ctx;

CAPEX__PRIVATE void capex__sumsq_chunk(void *c_, size_t t, int64_t off, int64_t n, uint32_t *bad, double *part) {
    capex__sumsq_ctx *c = (capex__sumsq_ctx *)c_;
    (void)bad;
    *part = c->kern((const char *)c->x->tensors[t].data + (size_t)off * c->es, n);
}
CAPEX__PRIVATE void capex__sumsq_flush(capex__sumsq_ctx *c) {
    if (!c->open) return;
    if (c->per_d) c->per_d[c->cur] = c->acc;
    if (c->per_f) c->per_f[c->cur] = (float)sqrt(c->acc);
    c->open = 0;
}
CAPEX__PRIVATE void capex__sumsq_fold(void *c_, size_t t, double part) {
    capex__sumsq_ctx *c = (capex__sumsq_ctx *)c_;
    c->total += part;
    if (c->open && c->cur != t) capex__sumsq_flush(c);
    if (!c->open) { c->cur = t; c->acc = 0.0; c->open = 1; }
    c->acc += part;
}

/* Validated-list core shared by norm and clip (and the optimizers): total
   and per-tensor sums of squares (double and/or float sqrt); any output may be NULL. */
CAPEX__PRIVATE capex_result capex__sumsq(const char *name, const capex_tensor_op_desc *desc,
                                         const capex_tensor_list *x, double *total, double *per_d, float *per_f) {
    capex__sumsq_ctx c;
    capex_result r;
    size_t i;
    memset(&c, 0, sizeof c);
    c.x = x;
    c.kern = x->dtype == CAPEX_F32 ? capex__sumsq_F32 : x->dtype == CAPEX_F16 ? capex__sumsq_F16 : capex__sumsq_BF16;
    c.es = capex_dtype_size(x->dtype);
    c.per_d = per_d;
    c.per_f = per_f;
    for (i = 0; i < x->count; i++) { /* empty tensors get no chunk: 0 */
        if (per_d) per_d[i] = 0.0;
        if (per_f) per_f[i] = 0.0f;
    }
    r = capex__for_chunks(name, desc, x->tensors, x->count, capex__sumsq_chunk, capex__sumsq_fold, &c, NULL);
    capex__sumsq_flush(&c);
    if (r == CAPEX_OK && total) *total = c.total;
    return r;
}

CAPEX_API capex_result capex_multi_tensor_sumsq(const capex_tensor_op_desc *desc, const capex_tensor_list *x,
                                                double *total_sumsq, double *per_tensor_sumsq) {
    const char *fn = "capex_multi_tensor_sumsq";
    capex_result r = capex__check_list(fn, "x", x);
    if (r != CAPEX_OK) return r;
    return capex__sumsq(fn, desc, x, total_sumsq, per_tensor_sumsq, NULL);
}

CAPEX_API capex_result capex_multi_tensor_l2norm(const capex_tensor_op_desc *desc, const capex_tensor_list *x,
                                                 float *total_norm, float *per_tensor_norms) {
    const char *fn = "capex_multi_tensor_l2norm";
    double total = 0.0;
    capex_result r = capex__check_list(fn, "x", x);
    if (r != CAPEX_OK) return r;
    r = capex__sumsq(fn, desc, x, &total, NULL, per_tensor_norms);
    if (r == CAPEX_OK && total_norm) *total_norm = (float)sqrt(total);
    return r;
}

/* out = in * s in f32, stored in out's dtype; flags inf/NaN in input or stored output. */
#define CAPEX__SCALE_KERNEL(I, O)                                                                    \
    CAPEX__PRIVATE void capex__scale_##I##_##O(const void *in_, void *out_, int64_t n, float s,       \
                                               uint32_t *bad) {                                       \
        const CAPEX__T_##I *in = (const CAPEX__T_##I *)in_;                                           \
        CAPEX__T_##O *out = (CAPEX__T_##O *)out_;                                                     \
        uint32_t b = 0;                                                                               \
        for (int64_t i = 0; i < n; i++) {                                                             \
            CAPEX__T_##I v = in[i];                                                                   \
            CAPEX__T_##O o = CAPEX__FROMF_##O(CAPEX__TOF_##I(v) * s);                                 \
            out[i] = o;                                                                               \
            b |= CAPEX__NF_##I(v) | CAPEX__NF_##O(o);                                                 \
        }                                                                                             \
        *bad |= b;                                                                                    \
    }
#define CAPEX__SCALE_ROW(I) CAPEX__SCALE_KERNEL(I, F32) CAPEX__SCALE_KERNEL(I, F16) CAPEX__SCALE_KERNEL(I, BF16)
CAPEX__SCALE_ROW(F32)
CAPEX__SCALE_ROW(F16)
CAPEX__SCALE_ROW(BF16)

typedef void (*capex__scale_kern)(const void *, void *, int64_t, float, uint32_t *);
/* [in dtype][out dtype], dtype values 0..2 */
static const capex__scale_kern capex__scale_kerns[3][3] = {
    {capex__scale_F32_F32, capex__scale_F32_F16, capex__scale_F32_BF16},
    {capex__scale_F16_F32, capex__scale_F16_F16, capex__scale_F16_BF16},
    {capex__scale_BF16_F32, capex__scale_BF16_F16, capex__scale_BF16_BF16}};

typedef struct capex__scale_ctx {
    const capex_tensor_list *in, *out;
    capex__scale_kern kern;
    size_t ies, oes;
    float s;
} capex__scale_ctx;

CAPEX__PRIVATE void capex__scale_chunk(void *c_, size_t t, int64_t off, int64_t n, uint32_t *bad, double *part) {
    capex__scale_ctx *c = (capex__scale_ctx *)c_;
    (void)part;
    c->kern((const char *)c->in->tensors[t].data + (size_t)off * c->ies,
            (char *)c->out->tensors[t].data + (size_t)off * c->oes, n, c->s, bad);
}

/* Validated-list core (also used by clipping). */
CAPEX__PRIVATE capex_result capex__scale(const char *name, const capex_tensor_op_desc *desc,
                                         const capex_tensor_list *in, const capex_tensor_list *out, float s,
                                         uint32_t *bad) {
    capex__scale_ctx c;
    c.in = in;
    c.out = out;
    c.kern = capex__scale_kerns[in->dtype][out->dtype];
    c.ies = capex_dtype_size(in->dtype);
    c.oes = capex_dtype_size(out->dtype);
    c.s = s;
    return capex__for_chunks(name, desc, in->tensors, in->count, capex__scale_chunk, NULL, &c, bad);
}

CAPEX_API capex_result capex_multi_tensor_scale(const capex_tensor_op_desc *desc, const capex_tensor_list *in,
                                                const capex_tensor_list *out, float scale, int *found_inf) {
    const char *fn = "capex_multi_tensor_scale";
    uint32_t bad = 0;
    capex_result r;
    if ((r = capex__check_list(fn, "in", in)) != CAPEX_OK) return r;
    if ((r = capex__check_list(fn, "out", out)) != CAPEX_OK) return r;
    if ((r = capex__check_same(fn, "in", in, "out", out)) != CAPEX_OK) return r;
    if ((r = capex__check_alias(fn, "in", in, "out", out)) != CAPEX_OK) return r;
    if (!(scale - scale == 0.0f))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scale is %g; it must be finite", fn, (double)scale);
    r = capex__scale(fn, desc, in, out, scale, &bad);
    if (r == CAPEX_OK && bad && found_inf) *found_inf = 1;
    return r;
}

/* out = float((double)a*x + (double)b*y); flags inf/NaN of checked inputs. */
#define CAPEX__AXPBY_KERNEL(X, Y, O)                                                                  \
    CAPEX__PRIVATE void capex__axpby_##X##_##Y##_##O(float a, const void *x_, float b, const void *y_, \
                                                     void *out_, int64_t n, uint32_t cx, uint32_t cy,  \
                                                     uint32_t *bad) {                                  \
        const CAPEX__T_##X *x = (const CAPEX__T_##X *)x_;                                              \
        const CAPEX__T_##Y *y = (const CAPEX__T_##Y *)y_;                                              \
        CAPEX__T_##O *out = (CAPEX__T_##O *)out_;                                                      \
        double da = (double)a, db = (double)b;                                                         \
        uint32_t f = 0;                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                              \
            CAPEX__T_##X xv = x[i];                                                                    \
            CAPEX__T_##Y yv = y[i];                                                                    \
            float r = (float)(da * (double)CAPEX__TOF_##X(xv) + db * (double)CAPEX__TOF_##Y(yv));      \
            out[i] = CAPEX__FROMF_##O(r);                                                              \
            f |= (cx & CAPEX__NF_##X(xv)) | (cy & CAPEX__NF_##Y(yv));                                  \
        }                                                                                              \
        *bad |= f;                                                                                     \
    }
#define CAPEX__AXPBY_O(X, Y) CAPEX__AXPBY_KERNEL(X, Y, F32) CAPEX__AXPBY_KERNEL(X, Y, F16) CAPEX__AXPBY_KERNEL(X, Y, BF16)
#define CAPEX__AXPBY_Y(X) CAPEX__AXPBY_O(X, F32) CAPEX__AXPBY_O(X, F16) CAPEX__AXPBY_O(X, BF16)
CAPEX__AXPBY_Y(F32)
CAPEX__AXPBY_Y(F16)
CAPEX__AXPBY_Y(BF16)

typedef void (*capex__axpby_kern)(float, const void *, float, const void *, void *, int64_t, uint32_t, uint32_t,
                                  uint32_t *);
#define CAPEX__AXPBY_ENT(X, Y) {capex__axpby_##X##_##Y##_F32, capex__axpby_##X##_##Y##_F16, capex__axpby_##X##_##Y##_BF16}
/* [x dtype][y dtype][out dtype] */
static const capex__axpby_kern capex__axpby_kerns[3][3][3] = {
    {CAPEX__AXPBY_ENT(F32, F32), CAPEX__AXPBY_ENT(F32, F16), CAPEX__AXPBY_ENT(F32, BF16)},
    {CAPEX__AXPBY_ENT(F16, F32), CAPEX__AXPBY_ENT(F16, F16), CAPEX__AXPBY_ENT(F16, BF16)},
    {CAPEX__AXPBY_ENT(BF16, F32), CAPEX__AXPBY_ENT(BF16, F16), CAPEX__AXPBY_ENT(BF16, BF16)}};

typedef struct capex__axpby_ctx {
    const capex_tensor_list *x, *y, *out;
    capex__axpby_kern kern;
    size_t xes, yes, oes;
    float a, b;
    uint32_t cx, cy;
} capex__axpby_ctx;

CAPEX__PRIVATE void capex__axpby_chunk(void *c_, size_t t, int64_t off, int64_t n, uint32_t *bad, double *part) {
    capex__axpby_ctx *c = (capex__axpby_ctx *)c_;
    (void)part;
    c->kern(c->a, (const char *)c->x->tensors[t].data + (size_t)off * c->xes, c->b,
            (const char *)c->y->tensors[t].data + (size_t)off * c->yes,
            (char *)c->out->tensors[t].data + (size_t)off * c->oes, n, c->cx, c->cy, bad);
}

CAPEX_API capex_result capex_multi_tensor_axpby(const capex_tensor_op_desc *desc, float a, const capex_tensor_list *x,
                                                float b, const capex_tensor_list *y, const capex_tensor_list *out,
                                                int arg_to_check, int *found_inf) {
    const char *fn = "capex_multi_tensor_axpby";
    capex__axpby_ctx c;
    uint32_t bad = 0;
    capex_result r;
    if ((r = capex__check_list(fn, "x", x)) != CAPEX_OK) return r;
    if ((r = capex__check_list(fn, "y", y)) != CAPEX_OK) return r;
    if ((r = capex__check_list(fn, "out", out)) != CAPEX_OK) return r;
    if ((r = capex__check_same(fn, "x", x, "y", y)) != CAPEX_OK) return r;
    if ((r = capex__check_same(fn, "x", x, "out", out)) != CAPEX_OK) return r;
    if ((r = capex__check_alias(fn, "x", x, "out", out)) != CAPEX_OK) return r;
    if ((r = capex__check_alias(fn, "y", y, "out", out)) != CAPEX_OK) return r;
    if (!(a - a == 0.0f) || !(b - b == 0.0f))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: a = %g, b = %g; both must be finite", fn, (double)a, (double)b);
    if (arg_to_check < -1 || arg_to_check > 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: arg_to_check is %d; use -1 (x and y), 0 (x) or 1 (y)", fn,
                           arg_to_check);
    c.x = x; c.y = y; c.out = out;
    c.kern = capex__axpby_kerns[x->dtype][y->dtype][out->dtype];
    c.xes = capex_dtype_size(x->dtype);
    c.yes = capex_dtype_size(y->dtype);
    c.oes = capex_dtype_size(out->dtype);
    c.a = a; c.b = b;
    c.cx = arg_to_check != 1;
    c.cy = arg_to_check != 0;
    r = capex__for_chunks(fn, desc, x->tensors, x->count, capex__axpby_chunk, NULL, &c, &bad);
    if (r == CAPEX_OK && bad && found_inf) *found_inf = 1;
    return r;
}

/* ---- gradient clipping (PyTorch clip_grad_norm_, L2) -------------------- */

CAPEX_API float capex_clip_coef(float total_norm, float max_norm) {
    float coef;
    if (!(total_norm - total_norm == 0.0f)) return 1.0f;
    coef = max_norm / (total_norm + 1e-6f); /* torch: max_norm / (total_norm + 1e-6), f32 */
    return coef < 1.0f ? coef : 1.0f;       /* NaN (never here: total finite, max_norm >= 0) -> 1 */
}

CAPEX__PRIVATE capex_result capex__clip(const char *fn, const capex_tensor_op_desc *desc,
                                        const capex_tensor_list *grads, size_t nlists, float max_norm,
                                        float *total_norm, float *clip_coef, int apply) {
    double sq = 0.0;
    float total, coef;
    size_t l;
    capex_result r;
    if (nlists > 0 && !grads) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: grads is NULL with nlists %zu", fn, nlists);
    if (max_norm != max_norm || max_norm < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: max_norm is %g; it must be >= 0 (inf: no clipping)", fn,
                           (double)max_norm);
    for (l = 0; l < nlists; l++) {
        char name[32];
        snprintf(name, sizeof name, "grads[%zu]", l);
        if ((r = capex__check_list(fn, name, &grads[l])) != CAPEX_OK) return r;
    }
    for (l = 0; l < nlists; l++) {
        double s = 0.0;
        if ((r = capex__sumsq(fn, desc, &grads[l], &s, NULL, NULL)) != CAPEX_OK) return r;
        sq += s;
    }
    total = (float)sqrt(sq);
    coef = capex_clip_coef(total, max_norm);
    if (apply && coef < 1.0f)
        for (l = 0; l < nlists; l++)
            if ((r = capex__scale(fn, desc, &grads[l], &grads[l], coef, NULL)) != CAPEX_OK) return r;
    if (total_norm) *total_norm = total;
    if (clip_coef) *clip_coef = coef;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_clip_grad_norm(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                            size_t nlists, float max_norm, float *total_norm) {
    return capex__clip("capex_clip_grad_norm", desc, grads, nlists, max_norm, total_norm, NULL, 1);
}

CAPEX_API capex_result capex_clip_grad_norm_coef(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                                 size_t nlists, float max_norm, float *total_norm, float *clip_coef) {
    return capex__clip("capex_clip_grad_norm_coef", desc, grads, nlists, max_norm, total_norm, clip_coef, 0);
}

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
