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
           float inv; int found_inf = my_unscale_and_check(); // or capex_multi_tensor_l2norm
           capex_scaler_unscale(&sc, 0, found_inf, &inv);
           int do_step; capex_scaler_step(&sc, 0, &do_step);
           if (do_step) my_optimizer_step();                  // or capex_optim_step(opt, inv, 1, !do_step)
           capex_scaler_update(&sc);                          // grow / back off
       }

   Build: cc app.c -lm        (add -fopenmp for threads, -ldl -lpthread with capex_cuda.h)

   CONFIGURATION (define before including, in the implementation file)
       CAPEX_STATIC          all functions static (private copy per translation unit)
       CAPEX_API             linkage of public functions (default: extern)
       CAPEX_MALLOC(sz)      \  allocator used when no runtime capex_allocator is
       CAPEX_REALLOC(p,sz)    > given; define all three or none
       CAPEX_FREE(p)         /
       CAPEX_NO_STDIO        leave out the default stderr logger and file I/O
       CAPEX_NO_SOCKETS      leave out the TCP rendezvous and TCP comm (data parallel
                             then has the single-process and MPI backends)
       CAPEX_MPI             build the MPI comm backend (compile with mpicc; adds
                             capex_comm_init_mpi)
       CAPEX_NO_SIMD         portable code only: no F16C/AVX fp16 conversions
                             (same results; without it they are picked by cpuid)
       CAPEX_NO_DIST         leave out data parallel: launcher env, comm vtable and
                             backends (single, MPI, TCP), rendezvous, DDP, ZeRO,
                             SyncBatchNorm, and in capex_cuda.h the NCCL communicator
                             and the GPU SyncBatchNorm. Stays: capex_dist_now, the
                             distributed sampler, BatchNorm (CPU and GPU) with comm
                             NULL (capex_comm is then an incomplete type), all else
       CAPEX_NO_STATE        leave out the state files (safetensors writer and reader,
                             capex_crc32) and every save/load on them: capex_scaler_,
                             capex_optim_ (with its lr schedule) and capex_zero_
                             save/load(_file). Stays: capex_scaler_get/set_state,
                             capex_optim_get_state, capex_cuda_optim_to_host/from_host
                             (CAPEX_OPTIM_STATE_PARAMS), all else. The two switches
                             change declarations too: define them in every file
                             (elsewhere a removed function fails only at link time);
                             both together work and cut the implementation's -O2
                             compile by about a third (bench/RESULTS.md)
       CAPEX_SCALER_MAX_OPTIMIZERS  optimizers per loss scaler (default 8); part of
                             the struct layout: define it alike in every file
   capex_cuda.h's CAPEX_CUDA_IMPLEMENTATION also provides this implementation.

   TOPICS (each section below starts with its own manual)
       Results and errors ...... every call returns capex_result; capex_last_error()
                                 gives a thread-local message saying what to do.
       Logging ................. capex_set_log_callback(), capex_log_set_rank().
       Allocation .............. capex_allocator, passed to objects that allocate.
       Half types .............. fp16 / bf16 conversions, scalar and bulk.
       Opt levels .............. O0-O3 properties, overrides, report, cast policy.
       Loss scaler ............. dynamic/static scaling and the step state machine.
       State files ............. versioned, checksummed save/restore (safetensors).
       Tensor lists ............ (pointer, numel) lists, the multi-tensor chunk
                                 planner, fused scale/unscale, axpby, L2 norms, clip.
       Optimizers .............. Adam/AdamW, LAMB, SGD, Adagrad, NovoGrad (Apex math), fp32 master
                                 weights writing the fp16/bf16 model copy.
       Data parallel ........... launcher env, comm vtable (single, MPI, TCP),
                                 rendezvous, DDP buckets, sampler, deadlines,
                                 ZeRO (sharded optimizer state, stage 1 and 2).
       Norms ................... LayerNorm, RMSNorm, BatchNorm, SyncBatchNorm.
   The CUDA backend (kernels, NCCL) is capex_cuda.h; examples/ has a complete
   training loop (train_charlm.c) and a 43-line one (minimal.c).

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

/* The implementation uses POSIX clocks and sockets (data parallel). Under a
   strict -std=c99 nothing POSIX is visible, so the implementation file asks
   for POSIX 2008 before the first system header; only in strict mode, where
   this adds declarations and hides none. */
#if (defined(CAPEX_IMPLEMENTATION) || defined(CAPEX_CUDA_IMPLEMENTATION)) && defined(__STRICT_ANSI__) && \
    !defined(__cplusplus) && \
    (defined(__unix__) || defined(__APPLE__)) && !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && \
    !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) && !defined(_BSD_SOURCE)
#  define _POSIX_C_SOURCE 200809L
#endif
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

   Descriptors: every struct with an _init function (capex_scaler_desc,
   capex_optim_desc, capex_optim_param, capex_norm_args, capex_ddp_desc,
   capex_zero_desc, ...,
   and capex_cuda.h's) must be made by that _init, then have fields changed.
   A struct made any other way (= {0}, memset, uninitialised) is refused with
   CAPEX_ERR_INVALID_ARG and a message naming the _init to call. Copies of an
   initialised struct are fine. Where a call takes NULL for "defaults", NULL
   stays allowed.
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
   process whose log rank is 0 (capex_log_set_rank, or capex_dist_log_init
   from the launcher's env; comm creation does not set it, so until then every
   process is rank 0 and prints). A callback replaces the default sink for every rank.
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
   at least 16 bytes; capex aligns its own large buffers on top of that. Give
   both alloc and free: creators refuse an allocator without both (CAPEX_ERR_INVALID_ARG),
   and a half-set one is never used to allocate or free.
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
/* Bulk versions (vectorised; bit-identical to the scalar ones in the default
   round-to-nearest FPU mode); src and dst must not overlap. */
CAPEX_API void capex_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);
CAPEX_API void capex_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
CAPEX_API void capex_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);
CAPEX_API void capex_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);

/* ==== opt levels: declarations ==== */
/* ---------------------------------------------------------------------------
   Opt levels

   Apex's amp.initialize(opt_level=..., <overrides>) as plain data: pick O0-O3
   and a half type (fp16 or bf16), optionally override properties, and
   capex_amp_resolve() returns the resolved properties or rejects a
   combination that breaks one of Apex's rules (CAPEX_ERR_CONFIG, naming it).

       capex_amp_overrides ov; capex_amp_overrides_init(&ov);  // all "None"
       ov.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC; ov.loss_scale = 128.0;
       capex_amp_config cfg;
       if (capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &cfg) != CAPEX_OK)
           fprintf(stderr, "%s\n", capex_last_error());
       capex_amp_log_report(&cfg);          // Apex's table, INFO, rank 0
       // cfg.model_dtype: weights in fp16; cfg.use_master_weights: fp32 copy
       capex_dtype t;                       // O1: which type does softmax run in?
       capex_amp_op_dtype(&cfg, CAPEX_OP_SOFTMAX, CAPEX_F16, &t);

   Level defaults (Apex apex/amp/frontend.py):
       level  cast_model_type  patch_torch_functions  keep_batchnorm_fp32  master_weights  loss_scale
       O0     float32          False                  None                 False           1.0
       O1     None             True                   None                 None            dynamic
       O2     half             False                  True                 True            dynamic
       O3     half             False                  False                False           1.0
   capex addition: with half type bf16 a "dynamic" default becomes 1.0 (bf16
   has fp32's exponent range, so gradients do not underflow); an explicit
   loss_scale override still wins.

   Override rules (Apex Properties.__setattr__); everything else is allowed:
       cast_model_type must be None or float32 under O1
       patch_torch_functions=True only with O1
       keep_batchnorm_fp32 must be None under O1
       master_weights must be None under O1
   An override field left at its *_NONE value is "not given", exactly like an
   Apex keyword argument left at None. loss_scale may be overridden anywhere.
   enabled=False behaves like Apex's disabled amp: the overrides are not
   checked against the rules and the result is Apex's inert Properties()
   (no casts, fp32 weights, static loss scale 1.0). Apex's hard_override
   (rules as warnings) is not offered.

   Cast policy: O1's function patching becomes a query the engine makes per op
   class (capex_amp_cast_op): HALF, FP32, or PROMOTE (run in the widest input
   type), from Apex's lists/{functional,torch,tensor}_overrides.py. Without
   patching (O0, O2, O3, disabled) every op runs as its inputs are
   (CAPEX_CAST_NONE), batch norm included: keep_batchnorm_fp32=True (O2)
   keeps only its parameters fp32 (cfg.batchnorm_dtype), and like cuDNN's
   mixed batch norm in Apex it maps a half x to a half y.

   All functions here are pure (no state) and thread-safe.
   ------------------------------------------------------------------------- */
typedef enum capex_opt_level {
    CAPEX_O0 = 0, /* pure fp32 */
    CAPEX_O1 = 1, /* fp32 weights, per-op casts (cast policy) */
    CAPEX_O2 = 2, /* half weights, fp32 batchnorm, fp32 master weights */
    CAPEX_O3 = 3  /* pure half */
} capex_opt_level;

/* Python's None / False / True. Zero is None, so a zeroed override is "unset". */
typedef enum capex_tri {
    CAPEX_TRI_NONE = 0,
    CAPEX_TRI_FALSE = 1,
    CAPEX_TRI_TRUE = 2
} capex_tri;

/* cast_model_type: None (leave the weights as they are, i.e. fp32), float32,
   or the half type given to capex_amp_resolve (Apex's torch.float16). */
typedef enum capex_cast_model {
    CAPEX_CAST_MODEL_NONE = 0,
    CAPEX_CAST_MODEL_FLOAT32 = 1,
    CAPEX_CAST_MODEL_HALF = 2
} capex_cast_model;

typedef enum capex_loss_scale_mode {
    CAPEX_LOSS_SCALE_NONE = 0,    /* overrides only: not given */
    CAPEX_LOSS_SCALE_DYNAMIC = 1, /* "dynamic" */
    CAPEX_LOSS_SCALE_STATIC = 2   /* a fixed number */
} capex_loss_scale_mode;

/* Apex's keyword arguments; *_NONE means "not given". */
typedef struct capex_amp_overrides {
    capex_tri enabled;                     /* NONE: enabled (Apex default True) */
    capex_cast_model cast_model_type;
    capex_tri patch_torch_functions;
    capex_tri keep_batchnorm_fp32;
    capex_tri master_weights;
    capex_loss_scale_mode loss_scale_mode; /* STATIC: loss_scale is used */
    double loss_scale;                     /* finite, FLT_MIN..FLT_MAX */
    uint32_t init_tag;                     /* set by capex_amp_overrides_init (see "Descriptors") */
} capex_amp_overrides;

/* The resolved properties (Apex's Properties.options) plus what they imply.
   Every function taking one refuses a config that capex_amp_resolve cannot
   return (CAPEX_ERR_CONFIG naming the Apex rule it breaks, else
   CAPEX_ERR_INVALID_ARG, e.g. derived fields stale after an edit): change the
   overrides and resolve again. Only loss_scale_mode/loss_scale may be edited. */
typedef struct capex_amp_config {
    int enabled;                           /* 0: amp is off (Apex enabled=False) */
    capex_opt_level opt_level;
    capex_dtype half_type;                 /* CAPEX_F16 or CAPEX_BF16 */
    capex_cast_model cast_model_type;
    int patch_torch_functions;             /* 1: use the cast policy */
    capex_tri keep_batchnorm_fp32;
    capex_tri master_weights;
    capex_loss_scale_mode loss_scale_mode; /* DYNAMIC or STATIC */
    double loss_scale;                     /* STATIC: the scale; DYNAMIC: 0 */
    /* derived, as Apex's _initialize applies them: */
    capex_dtype model_dtype;      /* weights: half_type if cast to half, else F32 */
    capex_dtype batchnorm_dtype;  /* F32 if keep_batchnorm_fp32=True, else model_dtype */
    int use_master_weights;       /* master_weights == True: fp32 master copy */
} capex_amp_config;

/* Everything "not given" (CAPEX_TRI_NONE etc.; loss_scale 1.0, unused). */
CAPEX_API void capex_amp_overrides_init(capex_amp_overrides *ov);
/* ov may be NULL (no overrides). On failure *out is left unchanged.
   CAPEX_ERR_CONFIG: an override breaks a rule (the message names it);
   CAPEX_ERR_INVALID_ARG: NULL out, level/half type/field out of range,
   loss_scale NaN, infinite, <= 0 or outside float32's normal range. */
CAPEX_API capex_result capex_amp_resolve(capex_opt_level level, capex_dtype half_type,
                                         const capex_amp_overrides *ov, capex_amp_config *out);

/* Apex's printout: "Selected optimization level O2:  ...", the level's
   defaults, "Processing user overrides ...", the final options, one
   "name : value" line each (Apex's "{:22} : {}"), plus a capex half_type row.
   Writes at most cap bytes including the NUL (buf may be NULL when cap is 0);
   *needed (may be NULL) gets the full length without the NUL.
   CAPEX_ERR_LIMIT when it did not fit (buf holds a NUL-terminated prefix). */
CAPEX_API capex_result capex_amp_report(const capex_amp_config *cfg, char *buf, size_t cap,
                                        size_t *needed);
/* The report through capex_log at CAPEX_LOG_INFO, one message per line (the
   default sink prints on rank 0 only, after capex_set_log_level(INFO)). */
CAPEX_API capex_result capex_amp_log_report(const capex_amp_config *cfg);

/* Op classes for the cast policy. Under O1: */
typedef enum capex_op_class {
    /* HALF: tensor-core friendly (Apex FP16_FUNCS) */
    CAPEX_OP_MATMUL = 0,     /* matmul mm mv __matmul__ */
    CAPEX_OP_LINEAR,         /* linear */
    CAPEX_OP_CONV,           /* conv1d conv2d conv3d conv_tbc */
    CAPEX_OP_CONV_TRANSPOSE, /* conv_transpose1d/2d/3d */
    CAPEX_OP_BMM,            /* bmm */
    CAPEX_OP_ADDMM,          /* addmm addmv addr */
    CAPEX_OP_BADDBMM,        /* baddbmm addbmm */
    CAPEX_OP_PRELU,          /* prelu */
    /* FP32: need fp32 range or precision (Apex FP32_FUNCS) */
    CAPEX_OP_SOFTMAX,        /* softmax softmin */
    CAPEX_OP_LOG_SOFTMAX,    /* log_softmax */
    CAPEX_OP_LAYER_NORM,     /* layer_norm */
    CAPEX_OP_RMS_NORM,       /* rms_norm (PyTorch autocast: fp32) */
    CAPEX_OP_GROUP_NORM,     /* group_norm local_response_norm */
    CAPEX_OP_BATCH_NORM,     /* batch_norm instance_norm */
    CAPEX_OP_NORM,           /* norm normalize cosine_similarity dist renorm */
    CAPEX_OP_LOSS,           /* cross_entropy nll_loss mse_loss l1_loss kl_div ... */
    CAPEX_OP_EXP,            /* exp expm1 */
    CAPEX_OP_LOG,            /* log log10 log2 log1p */
    CAPEX_OP_POW,            /* pow __pow__ __rpow__ __ipow__ */
    CAPEX_OP_SUM,            /* sum */
    CAPEX_OP_MEAN,           /* mean */
    CAPEX_OP_PROD,           /* prod cumprod */
    CAPEX_OP_CUMSUM,         /* cumsum */
    CAPEX_OP_REDUCTION,      /* std var and other reductions */
    CAPEX_OP_RECIPROCAL,     /* reciprocal */
    CAPEX_OP_RSQRT,          /* rsqrt */
    CAPEX_OP_UNARY_FP32,     /* acos asin cosh sinh tan erfinv softplus */
    CAPEX_OP_INTERPOLATE,    /* interpolate upsample */
    /* PROMOTE: several inputs, run in the widest (Apex CASTS, SEQUENCE_CASTS) */
    CAPEX_OP_ADD,            /* add __add__ __iadd__ __radd__ */
    CAPEX_OP_SUB,            /* sub __sub__ __isub__ __rsub__ */
    CAPEX_OP_MUL,            /* mul __mul__ __imul__ __rmul__ */
    CAPEX_OP_DIV,            /* div __div__ __truediv__ ... */
    CAPEX_OP_CAT,            /* cat concat */
    CAPEX_OP_STACK,          /* stack */
    CAPEX_OP_INDEX_COPY,     /* index_copy */
    CAPEX_OP_ADDCMUL,        /* addcmul */
    CAPEX_OP_ADDCDIV,        /* addcdiv */
    CAPEX_OP_COMPARE,        /* eq ne lt le gt ge equal */
    CAPEX_OP_PAIRWISE,       /* dot cross atan2 bilinear */
    /* NONE at every level: ops Apex does not patch (relu gelu silu tanh ...) */
    CAPEX_OP_OTHER,
    CAPEX_OP_COUNT
} capex_op_class;

typedef enum capex_cast_policy {
    CAPEX_CAST_NONE = 0,   /* no cast: run in the inputs' own type */
    CAPEX_CAST_HALF = 1,   /* cast inputs to cfg->half_type */
    CAPEX_CAST_FP32 = 2,   /* cast inputs to float32 */
    CAPEX_CAST_PROMOTE = 3 /* cast inputs to the widest of them */
} capex_cast_policy;

CAPEX_API capex_result capex_amp_cast_op(const capex_amp_config *cfg, capex_op_class op,
                                         capex_cast_policy *out);
/* By PyTorch/Apex function name ("softmax", "conv2d", "__matmul__", ...) or
   class name (capex_op_class_name: "loss", "compare", ...).
   CAPEX_ERR_NOT_FOUND for a name capex does not know; *out is then
   CAPEX_CAST_NONE, which is what Apex does with functions it does not patch. */
CAPEX_API capex_result capex_amp_cast_op_name(const capex_amp_config *cfg, const char *name,
                                              capex_cast_policy *out);
/* The type op computes in, given the (promoted) type of its inputs. */
CAPEX_API capex_result capex_amp_op_dtype(const capex_amp_config *cfg, capex_op_class op,
                                          capex_dtype input, capex_dtype *out);
/* Widest of two types, PyTorch's promotion: equal types stay, anything with
   float32 is float32, and fp16 with bf16 is float32 (neither holds the other). */
CAPEX_API capex_result capex_amp_promote(capex_dtype a, capex_dtype b, capex_dtype *out);
CAPEX_API capex_result capex_op_class_from_name(const char *name, capex_op_class *out);

/* Names: "O2"; "softmax"; "half"/"fp32"/"promote"/"none"; NULL if invalid. */
CAPEX_API const char *capex_opt_level_name(capex_opt_level level);
CAPEX_API const char *capex_op_class_name(capex_op_class op);
CAPEX_API const char *capex_cast_policy_name(capex_cast_policy p);

/* String parsers for command lines and config files; locale-independent,
   surrounding ASCII blanks ignored, anything else extra is an error
   (CAPEX_ERR_INVALID_ARG, *out unchanged). */
CAPEX_API capex_result capex_opt_level_parse(const char *s, capex_opt_level *out); /* "O0".."O3" */
/* "dynamic", or a decimal number ("128", "128.0", "1e3", "0.5") that is finite,
   > 0 and inside float32's normal range; *value gets 0 for "dynamic".
   Correctly rounded up to 15 significant digits with |exponent| <= 22 (any
   realistic scale), else within a few ulp. */
CAPEX_API capex_result capex_loss_scale_parse(const char *s, capex_loss_scale_mode *mode,
                                              double *value);
/* "True"/"true"/"1", "False"/"false"/"0", "None"/"none". */
CAPEX_API capex_result capex_tri_parse(const char *s, capex_tri *out);
/* "None"/"none", "float32"/"fp32"/"torch.float32", "half". The half type is
   chosen separately (capex_half_type_parse), so "float16" is refused here. */
CAPEX_API capex_result capex_cast_model_parse(const char *s, capex_cast_model *out);
/* "fp16"/"float16"/"torch.float16"/"half" -> CAPEX_F16,
   "bf16"/"bfloat16"/"torch.bfloat16" -> CAPEX_BF16. */
CAPEX_API capex_result capex_half_type_parse(const char *s, capex_dtype *out);

/* ==== loss scaler: declarations ==== */
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
    uint32_t init_tag;       /* set by capex_scaler_desc_init (see "Descriptors")           */
} capex_scaler_desc;

/* Bound on every step counter (scaler steps and skipped_steps, optimizer
   group steps): 2^53, so a count is exact as the double the bias corrections
   take (1 - pow(beta, step)) and a count + 1 can never overflow int64. State
   with a larger or negative count is refused; an update or step that would
   pass the bound fails with CAPEX_ERR_LIMIT and changes nothing. */
#define CAPEX_STEP_MAX ((int64_t)1 << 53)

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
/* The scaler an opt level asks for (what Apex's amp.initialize builds from
   loss_scale): capex_scaler_desc_init's defaults, then dynamic for "dynamic",
   else static at cfg->loss_scale (O0, O3, bf16 and disabled amp: 1.0).
   Change other fields afterwards as usual; a dynamic init_scale must lie in
   [min_scale, max_scale], so a max_scale below 65536 needs init_scale lowered
   too (Apex's max_loss_scale starts the scale at min(max_loss_scale, 2^16)). */
CAPEX_API capex_result capex_scaler_desc_from_amp(const capex_amp_config *cfg, capex_scaler_desc *desc);
/* Validates desc; on error sc is left unusable (every call on it fails). */
CAPEX_API capex_result capex_scaler_init(capex_scaler *sc, const capex_scaler_desc *desc);

/* The scale to multiply the loss by. Repeatable (accumulation) until the
   first unscale() of the iteration. Can fail (CAPEX_ERR_ORDER), hence the
   status; scale, unscale and step write their output even then (NaN, NaN,
   do_step 0), so an unchecked error is never an uninitialised read or a step. */
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

/* The current scale and f32(1 / f64(scale)), any time (they cannot fail on an
   initialised scaler; NULL or an uninitialised one gives NaN and sets
   capex_last_error). */
CAPEX_API float capex_scaler_get_scale(const capex_scaler *sc);
CAPEX_API float capex_scaler_get_inv_scale(const capex_scaler *sc);
/* Between iterations only; same limits as update_to. */
CAPEX_API capex_result capex_scaler_set_scale(capex_scaler *sc, float scale);

/* Export/import for checkpoints. set_state validates every field first and
   leaves sc untouched on error; only between iterations. It restores the rule
   parameters too (like PyTorch load_state_dict) and keeps sc's log_interval
   and id. */
CAPEX_API capex_result capex_scaler_get_state(const capex_scaler *sc, capex_scaler_state *state);
CAPEX_API capex_result capex_scaler_set_state(capex_scaler *sc, const capex_scaler_state *state);

/* ==== state files: declarations ==== */
#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE leaves out the state files (safetensors writer, reader,
                          capex_crc32) and every save/load built on them */
/* ---------------------------------------------------------------------------
   State files

   Save/restore of training state (loss scaler, optimizer, ZeRO and your own
   tensors, in one file or several) as safetensors files: an 8-byte
   little-endian header length N, N bytes of UTF-8 JSON naming each tensor's
   dtype, shape and byte range, then the tensors' bytes, little-endian, tightly
   packed. Python's `safetensors.numpy.load_file` and `head -c` read them.

   capex adds, in "__metadata__": "format": "capex-state",
   "capex_format_version": "1", "capex_version": CAPEX_VERSION_STRING and
   "capex_crc32": 8 lowercase hex digits, the CRC-32 (zlib polynomial) of the
   whole file with those 8 digits read as '0' characters. Numbers are tensors
   (binary, exact), strings are metadata. Checking a file by hand:

       import json, struct, zlib
       b = open("ckpt.safetensors", "rb").read()
       n = struct.unpack("<Q", b[:8])[0]
       crc = json.loads(b[8:8 + n])["__metadata__"]["capex_crc32"]
       i = b.index(b'"capex_crc32":"' + crc.encode() + b'"') + 15
       print("ok" if "%08x" % zlib.crc32(b[:i] + b"00000000" + b[i + 8:]) == crc else "CORRUPT")

       capex_state_writer *w;
       capex_state_writer_create(NULL, &w);
       capex_state_add_f64(w, "scaler.scale", 65536.0);
       capex_state_add_tensor(w, "adam.m", CAPEX_STATE_F32, 1, &n, m); // not copied
       capex_state_add_meta(w, "run", "gpt2-small");
       r = capex_state_write_file(w, "ckpt.safetensors");   // temp + rename
       capex_state_writer_destroy(w);

       capex_state_reader *rd;                              // validates everything
       r = capex_state_reader_open_file("ckpt.safetensors", 0, NULL, &rd);
       r = capex_state_get_f64(rd, "scaler.scale", &scale);
       r = capex_state_read_tensor(rd, "adam.m", CAPEX_STATE_F32, n, m_tmp);
       capex_state_reader_close(rd);

   Opening refuses (leaving nothing half-read) a truncated or corrupt file
   (CAPEX_ERR_FORMAT), another format version (CAPEX_ERR_VERSION), a checksum
   mismatch (CAPEX_ERR_CHECKSUM), or an unreadable file (CAPEX_ERR_IO).
   Loaders built on it read every value into temporaries first and commit
   only when all reads succeeded, so a bad file never changes live state.
   Thread safety: a writer is used by one thread at a time. A memory reader is
   read-only after open and may be shared between threads; a file reader moves
   its FILE position on each read: one thread at a time.
   ------------------------------------------------------------------------- */
/* Values 0..2 equal capex_dtype's, so (capex_state_dtype)CAPEX_BF16 works. */
typedef enum capex_state_dtype {
    CAPEX_STATE_F32 = 0, CAPEX_STATE_F16 = 1, CAPEX_STATE_BF16 = 2,
    CAPEX_STATE_F64 = 3, CAPEX_STATE_I64 = 4, CAPEX_STATE_I32 = 5,
    CAPEX_STATE_I16 = 6, CAPEX_STATE_I8 = 7, CAPEX_STATE_U64 = 8,
    CAPEX_STATE_U32 = 9, CAPEX_STATE_U16 = 10, CAPEX_STATE_U8 = 11,
    CAPEX_STATE_BOOL = 12, CAPEX_STATE_F8_E4M3 = 13, CAPEX_STATE_F8_E5M2 = 14,
    CAPEX_STATE_DTYPE_COUNT = 15
} capex_state_dtype;

#define CAPEX_STATE_FORMAT_VERSION 1
#define CAPEX_STATE_MAX_NDIM 16
/* Largest JSON header accepted or written (the safetensors library's limit). */
#define CAPEX_STATE_MAX_HEADER 100000000u
/* Open flag: also accept plain safetensors files (model weights) that carry
   no capex metadata; such files have no checksum to verify. A file that does
   say "format": "capex-state" is still checked in full. */
#define CAPEX_STATE_OPEN_FOREIGN 1u

/* safetensors' dtype name ("F32", "BF16", "BOOL", ...); NULL if invalid. */
CAPEX_API const char *capex_state_dtype_name(capex_state_dtype t);
/* Bytes per element; 0 if invalid. */
CAPEX_API size_t capex_state_dtype_size(capex_state_dtype t);
/* CRC-32 (IEEE 802.3 / zlib polynomial 0xEDB88320): crc = 0 to start, then feed
   pieces: capex_crc32(capex_crc32(0, a, na), b, nb) == crc of a||b. */
CAPEX_API uint32_t capex_crc32(uint32_t crc, const void *data, size_t n);

typedef struct capex_state_writer capex_state_writer;
CAPEX_API capex_result capex_state_writer_create(const capex_allocator *alloc, capex_state_writer **out);
CAPEX_API void capex_state_writer_destroy(capex_state_writer *w);
/* Adds a tensor of shape[0..ndim) (ndim 0: a scalar, one element). data is in
   host byte order and is NOT copied: it must stay valid and unchanged until
   the last write call. Names are unique UTF-8, not "__metadata__". */
CAPEX_API capex_result capex_state_add_tensor(capex_state_writer *w, const char *name, capex_state_dtype dtype,
                                              int ndim, const int64_t *shape, const void *data);
/* Scalars (shape []), copied. */
CAPEX_API capex_result capex_state_add_f64(capex_state_writer *w, const char *name, double v);
CAPEX_API capex_result capex_state_add_f32(capex_state_writer *w, const char *name, float v);
CAPEX_API capex_result capex_state_add_i64(capex_state_writer *w, const char *name, int64_t v);
/* A string pair in __metadata__ (copied). The capex keys are reserved. */
CAPEX_API capex_result capex_state_add_meta(capex_state_writer *w, const char *key, const char *value);
/* Serialises into buf[0..cap); *len gets the file size. buf == NULL (cap 0)
   only queries the size. cap too small: CAPEX_ERR_SIZE_MISMATCH. */
CAPEX_API capex_result capex_state_write_memory(capex_state_writer *w, void *buf, size_t cap, size_t *len);
/* Writes "<path>.tmp.<pid>.<n>.<id>", flushes and fsyncs it, then renames it over
   path: a reader sees the old file or the new one, never a partial one. On
   failure the temp file is removed and an old file at path is kept. Temps of
   the same path left by killed saves are removed first (POSIX): those of a
   pid that no longer exists, once unmodified for a minute, and this process's
   own once unmodified for an hour; a live process's temp is never touched. */
CAPEX_API capex_result capex_state_write_file(capex_state_writer *w, const char *path);

typedef struct capex_state_reader capex_state_reader;
typedef struct capex_state_tensor_info {
    const char *name;             /* valid until the reader is closed */
    capex_state_dtype dtype;
    int ndim;
    int64_t shape[CAPEX_STATE_MAX_NDIM];
    uint64_t numel;               /* 1 for a scalar */
    uint64_t nbytes;
    uint64_t file_offset;         /* absolute offset of the first byte */
} capex_state_tensor_info;

/* Both validate the whole file before returning (see the manual above). A
   file reader keeps the file open and reads only the header plus one
   streaming checksum pass (1 MiB buffer); tensors are read at their offsets
   on request (the checksum was verified at open; capex never rewrites a file
   in place, so an open reader keeps the verified contents even if a new save
   renames over the path). A memory reader references buf, which must outlive it. */
CAPEX_API capex_result capex_state_reader_open_file(const char *path, unsigned flags, const capex_allocator *alloc,
                                                    capex_state_reader **out);
CAPEX_API capex_result capex_state_reader_open_memory(const void *buf, size_t len, unsigned flags,
                                                      const capex_allocator *alloc, capex_state_reader **out);
CAPEX_API void capex_state_reader_close(capex_state_reader *r);
/* 1 when the file carries capex metadata and a verified checksum. */
CAPEX_API int capex_state_is_capex(const capex_state_reader *r);
/* Tensors in the order of their data in the file (i < count); for capex's
   files also the header's order, for foreign ones not necessarily. */
CAPEX_API size_t capex_state_tensor_count(const capex_state_reader *r);
CAPEX_API capex_result capex_state_tensor_at(const capex_state_reader *r, size_t i, capex_state_tensor_info *info);
/* CAPEX_ERR_NOT_FOUND when absent. */
CAPEX_API capex_result capex_state_find(const capex_state_reader *r, const char *name, capex_state_tensor_info *info);
/* Copies a tensor into dst (host byte order). dtype and element count must
   match the file exactly (CAPEX_ERR_SIZE_MISMATCH otherwise): no conversion. */
CAPEX_API capex_result capex_state_read_tensor(capex_state_reader *r, const char *name, capex_state_dtype dtype,
                                               uint64_t expected_numel, void *dst);
/* Scalars: one element of exactly that dtype (F64 / F32 / I64). */
CAPEX_API capex_result capex_state_get_f64(capex_state_reader *r, const char *name, double *v);
CAPEX_API capex_result capex_state_get_f32(capex_state_reader *r, const char *name, float *v);
CAPEX_API capex_result capex_state_get_i64(capex_state_reader *r, const char *name, int64_t *v);
/* Metadata strings, including the capex keys; valid until close. */
CAPEX_API size_t capex_state_meta_count(const capex_state_reader *r);
CAPEX_API capex_result capex_state_meta_at(const capex_state_reader *r, size_t i, const char **key, const char **value);
CAPEX_API capex_result capex_state_get_meta(const capex_state_reader *r, const char *key, const char **value);

/* Loss scaler in a state file: tensors "<prefix>scale", "<prefix>growth_tracker",
   ... (every field of capex_scaler_state, exact binary) and the metadata
   "<prefix>format" = "capex-scaler/1". Use one prefix per scaler, e.g.
   "scaler.0.". Loading reads everything first and then calls
   capex_scaler_set_state, so a bad or incomplete file leaves sc untouched;
   like set_state it is allowed only between iterations. */
#define CAPEX_SCALER_STATE_FORMAT "capex-scaler/1"
CAPEX_API capex_result capex_scaler_save(const capex_scaler *sc, capex_state_writer *w, const char *prefix);
CAPEX_API capex_result capex_scaler_load(capex_scaler *sc, capex_state_reader *r, const char *prefix);
#endif /* CAPEX_NO_STATE */

/* ==== tensor lists, chunk planner, fused ops: declarations ==== */
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
   empty tensors get no chunk. This is the layout for your own kernels;
   capex_cuda.h's kernels use their own (no per-block table, 32 KB of
   parameters where the driver takes them). */
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
/* Block b of a launch: index in the lists, first element and element count
   (all 0 for b outside [0, nblocks) or a NULL plan or launch). */
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
    uint32_t init_tag;             /* set by capex_tensor_op_desc_init (see "Descriptors") */
} capex_tensor_op_desc;
CAPEX_API void capex_tensor_op_desc_init(capex_tensor_op_desc *desc);

/* Sum of squares in float64, per tensor and in total (either output may be
   NULL; per_tensor has x->count entries). Fixed order: in a chunk, element i
   (from the chunk start) is added to lane i%16 as (double)x*(double)x (exact),
   lanes fold as m_j = l_j + l_(j+8) and combine as
   ((m0+m1)+(m2+m3))+((m4+m5)+(m6+m7)); chunk partials are added in chunk
   order, starting from 0.0, into the tensor's and the total's sum (before
   2026-11-25: 8 lanes, no fold). Worst-case relative error about
   (chunk_size/16 + chunks) * 2^-53: 1e-12
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
   even when found_inf is set. scale must be finite. An out tensor may be its
   own in tensor (same dtype); any other overlap with in or out is refused. */
CAPEX_API capex_result capex_multi_tensor_scale(const capex_tensor_op_desc *desc, const capex_tensor_list *in,
                                                const capex_tensor_list *out, float scale, int *found_inf);

/* Apex multi_tensor_axpby: out = a*x + b*y, any dtype for each list. The
   value is float((double)a*x + (double)b*y) (products exact, one double
   rounding, so no dependence on FMA contraction), rounded RNE to out's dtype.
   arg_to_check: -1 checks x and y, 0 only x, 1 only y for inf/NaN (inputs, as
   Apex); sets *found_inf = 1 when found (may be NULL). a, b must be finite.
   out may be x or y (same dtype); any other overlap is refused. */
CAPEX_API capex_result capex_multi_tensor_axpby(const capex_tensor_op_desc *desc, float a, const capex_tensor_list *x,
                                                float b, const capex_tensor_list *y, const capex_tensor_list *out,
                                                int arg_to_check, int *found_inf);

/* PyTorch clip_grad_norm_ (L2) over nlists lists (dtypes may differ):
   total = sqrt(sum of every list's sumsq, lists in order) as float;
   coef = max_norm / (total + 1e-6f) in f32; if coef < 1 every grad is
   multiplied by coef in place (g = float(g) * coef, rounded to its dtype).
   Returns total in *total_norm (may be NULL). Differs from PyTorch when a
   grad is inf/NaN: grads are left untouched (PyTorch would write NaN/0); the
   loss scaler skips that step anyway. Finite grads whose norm overflows f32
   (total = inf) get coef 0, as in PyTorch. max_norm: >= 0, not NaN (inf: never clip).
   A tensor listed twice, or overlapping another, is refused (it would be scaled twice). */
CAPEX_API capex_result capex_clip_grad_norm(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                            size_t nlists, float max_norm, float *total_norm);
/* The same, computing only: *clip_coef = min(1, coef) (1 when a grad is
   inf/NaN, 0 when finite grads overflow the f32 norm) for an optimizer to
   fold into g; grads are not written. */
CAPEX_API capex_result capex_clip_grad_norm_coef(const capex_tensor_op_desc *desc, const capex_tensor_list *grads,
                                                 size_t nlists, float max_norm, float *total_norm, float *clip_coef);
/* min(1, max_norm / (total_norm + 1e-6f)) in f32; 1 if that is NaN or total is not finite. */
CAPEX_API float capex_clip_coef(float total_norm, float max_norm);

/* ==== optimizers: declarations ==== */
/* ---------------------------------------------------------------------------
   Optimizers (Apex FusedAdam / FusedLAMB / FusedSGD / FusedAdagrad / FusedNovoGrad math, on the CPU)

   An optimizer owns parameter groups; each group has its own hyperparameters
   and its own step count (as Apex and torch.optim). A parameter is an fp32
   tensor updated in place (fp32 params, or the fp32 master weights of O2),
   its gradient (f32, f16 or bf16, possibly loss-scaled) and optionally a
   fp16/bf16 model copy that the same pass writes from the new fp32 value.

       capex_optim_desc d; capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM); // Apex defaults
       d.defaults.lr = 3e-4f; d.defaults.weight_decay = 0.1f;         // AdamW
       capex_optim *opt;   capex_optim_create(&d, &opt);
       capex_optim_param p; capex_optim_param_init(&p);
       p.param = master_w; p.numel = n; p.grad = grad_bf16; p.grad_dtype = CAPEX_BF16;
       p.model = model_w_bf16; p.model_dtype = CAPEX_BF16;         // O2 copy
       capex_optim_add_group(opt, NULL, &p, 1, NULL);              // NULL: d.defaults
       for (each step) {
           ... backward into grad_bf16 (scaled by S) ...
           capex_optim_step(opt, 1.0f / S, 1.0f, found_inf);      // skip when found_inf
       }
       capex_optim_destroy(opt);

   Math (per element, fp32, in Apex's exact operation order; g = grad*inv_scale*clip):
     Adam L2 (adam_w_mode 0): g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
                              p -= lr * (m/bc1) / (sqrt(v/bc2) + eps)
     AdamW (adam_w_mode 1):   m, v as above; p -= lr * ((m/bc1)/(sqrt(v/bc2)+eps) + wd*p)
     LAMB: G = global L2 norm of g over all groups; g /= (G > max_grad_norm ? G/max_grad_norm : 1);
           m = m*b1 + b3*g (b3 = grad_averaging ? 1-b1 : 1); v = v*b2 + (1-b2)*g*g;
           u = (m/bc1)/(sqrt(v/bc2)+eps) (+ wd*p in W mode; L2 mode adds wd*p to g first);
           ratio = (use_nvlamb || wd != 0) && |p| != 0 && |u| != 0 ? lr*|p|/|u| : lr;
           p -= ratio*u  (|p|, |u| per tensor; |p| before the update)
     SGD:  g += wd*p (unless wd_after_momentum); with momentum: buf = first ? g :
           momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf;
           g += wd*p (if wd_after_momentum); p -= lr*g
           (momentum runs only while the group's momentum is nonzero, as Apex's
           `if (momentum != 0)`: a group set to 0 later steps as plain SGD and
           keeps its buffer, which momentum resumes from, as torch keeps
           momentum_buffer; CPU and GPU alike)
     NovoGrad: n = |g| per tensor (L2); v (one float per tensor, a norm, not a square):
           first step v = init_zero ? 0 : n; then always v = sqrt(b2*v*v + (1-b2)*n*n);
           denom = v/bc2n + eps with bc2n = sqrt(1 - b2^step); b3 = grad_averaging ? 1-b1 : 1;
           default: m = b1*m + b3*g;  p -= lr*((m/bc1)/denom + wd*p)
           reg_inside_moment: g = g/denom + wd*p; m = b1*m + b3*g; p -= lr*(m/bc1)
     Adam amsgrad (torch's; not in Apex): m, v as above; vmax = max(vmax, v) (NaN
           propagates, as torch.maximum); vmax replaces v in the denominator
     Adagrad (Apex FusedAdagrad; lr_decay, initial_accumulator_value from torch):
           clr = f32(lr / (1 + (step-1)*lr_decay)) in double; sum starts at
           initial_accumulator_value; L2 (adagrad_w_mode 0): g += wd*p; sum += g*g;
           p -= clr * (g/(sqrt(sum)+eps)); W mode: sum += g*g;
           p -= clr * (g/(sqrt(sum)+eps) + wd*p)
   bc1 = 1 - b1^step, bc2 = 1 - b2^step (1 when bias_correction is off).
   torch.optim.AdamW scales p by (1-lr*wd) first and divides by sqrt(bc2)
   outside the sqrt: a few ulps apart (2e-7 relative after 5 steps); capex
   follows Apex in both modes.

   Thread safety: one optimizer must not be used from two threads at once;
   distinct optimizers are independent. capex_optim_step uses OpenMP threads
   inside when built with -fopenmp (desc.exec.num_threads; 0: OpenMP's
   default); results are bitwise identical for any thread count and without
   OpenMP. LAMB's global grad norm is capex_multi_tensor_sumsq per grad dtype.
   ------------------------------------------------------------------------- */
typedef enum capex_optim_kind {
    CAPEX_OPTIM_ADAM = 0, /* Adam / AdamW (Apex FusedAdam) */
    CAPEX_OPTIM_LAMB = 1, /* LAMB (Apex FusedLAMB)        */
    CAPEX_OPTIM_SGD = 2,  /* SGD (Apex FusedSGD)          */
    CAPEX_OPTIM_ADAGRAD = 3, /* Adagrad (Apex FusedAdagrad, torch.optim.Adagrad) */
    CAPEX_OPTIM_NOVOGRAD = 4 /* NovoGrad (Apex FusedNovoGrad) */
} capex_optim_kind;

/* Per-group hyperparameters (Apex: param_groups entries). Fields an
   optimizer does not use are ignored. */
typedef struct capex_optim_hparams {
    float lr;              /* all; Apex default 1e-3 (FusedSGD has no default: ours 1e-3) */
    float beta1, beta2;    /* Adam, LAMB: 0.9, 0.999 */
    float eps;             /* Adam 1e-8, LAMB 1e-6 */
    float weight_decay;    /* Adam 0, LAMB 0.01, SGD 0 (torch.optim.AdamW's is 0.01: set it) */
    int bias_correction;   /* Adam, LAMB: 1 */
    int grad_averaging;    /* LAMB: 1 (beta3 = 1-beta1), 0: beta3 = 1 */
    float momentum;        /* SGD: 0. A group added with 0 has no momentum buffers: set_hparams
                              cannot turn it on later (CAPEX_ERR_CONFIG); one added with
                              momentum keeps its buffers while set to 0 (saved, resumed) */
    float dampening;       /* SGD: 0 */
    int nesterov;          /* SGD: 0 (needs momentum > 0 and dampening 0) */
    /* Adagrad (torch.optim.Adagrad's; Apex FusedAdagrad has neither: 0, 0) */
    float lr_decay;        /* step t uses lr / (1 + (t-1)*lr_decay); 0 */
    float initial_accumulator_value; /* the sum buffer's start value; 0 (read by add_group only:
                                        a later change has no effect, as torch's) */
    int amsgrad;           /* Adam: 1 keeps max(v) and divides by it (torch's amsgrad); 0.
                              Fixed when the group is added (the max buffer exists only then) */
} capex_optim_hparams;

typedef struct capex_optim_desc {
    capex_optim_kind kind;
    capex_optim_hparams defaults; /* used by capex_optim_add_group(..., NULL, ...) */
    int adam_w_mode;              /* Adam, LAMB: 1 decoupled decay (default), 0 L2; Adagrad:
                                     Apex's adagrad_w_mode (default 0: L2, as torch) */
    int use_nvlamb;               /* LAMB: trust ratio also where wd == 0 (default 0) */
    float max_grad_norm;          /* LAMB: global-norm clip threshold (default 1.0; 0 = no clip) */
    int wd_after_momentum;        /* SGD: apply decay after momentum (default 0) */
    int stochastic_rounding;      /* 1: bf16 model copies use stochastic rounding (default 0); a
                                     copy then cannot be rebuilt from the masters: to resume
                                     bit for bit, save with CAPEX_OPTIM_STATE_PARAMS */
    uint64_t seed;                /* stochastic rounding seed (default 0) */
    capex_tensor_op_desc exec;    /* threads, chunk size, parallel threshold (tensor ops' settings) */
    const capex_allocator *allocator; /* moments and bookkeeping; NULL: CAPEX_MALLOC */
    int lamb_low_memory;          /* LAMB on the CPU: 0 (default) keeps each update u (4 bytes per
                                     parameter) between the two passes; 1 recomputes it in the
                                     second pass (same bits; 1.25x slower on the 2-core Zen 1 VM
                                     of bench/RESULTS.md). The CUDA backend always recomputes. */
    /* NovoGrad (Apex FusedNovoGrad constructor arguments) */
    int reg_inside_moment;        /* 1: g/denom + wd*p goes into the moment (Apex moment_mode 0);
                                     0 (default): m from raw g, decay on the update (mode 1) */
    int init_zero;                /* 1: the per-tensor norm average starts at 0; 0 (default): at
                                     the first step's norm (the first blend changes nothing) */
    int norm_type;                /* 2 (default): L2 norm per tensor; Apex's 0 (inf norm) is refused */
    uint32_t init_tag;            /* set by capex_optim_desc_init: a desc made any other way
                                     (zeroed: lr 0, weights that never move) is refused */
} capex_optim_desc;

/* One parameter tensor. exp_avg/exp_avg_sq/max_exp_avg_sq may point at user
   buffers of numel floats (SGD uses exp_avg as the momentum buffer, Adagrad
   exp_avg_sq as its sum); NULL lets the optimizer allocate them. Either way
   add_group zeroes them (Adagrad's sum: initial_accumulator_value): a new group
   starts fresh. */
typedef struct capex_optim_param {
    float *param;            /* fp32 weights or fp32 master weights, updated in place */
    const void *grad;        /* gradient, numel elements of grad_dtype */
    capex_dtype grad_dtype;  /* CAPEX_F32 (default), CAPEX_F16, CAPEX_BF16 */
    void *model;             /* optional fp16/bf16 model copy written each step; NULL: none */
    capex_dtype model_dtype; /* CAPEX_BF16 (default) or CAPEX_F16 when model != NULL: set it
                                for an fp16 model (capex_optim_param_from_amp does) */
    int64_t numel;           /* elements; 0 is allowed (nothing to do) */
    float *exp_avg;          /* optional user buffer: Adam/LAMB/NovoGrad m, SGD momentum */
    float *exp_avg_sq;       /* optional user buffer: Adam/LAMB v, Adagrad's sum (torch "sum"); NovoGrad: unused */
    float *max_exp_avg_sq;   /* optional user buffer: Adam with amsgrad, max of v so far */
    int pure_half;           /* 1: no master weights (Apex O3): param is kept equal to the model
                                copy's values (set from it at add_group and before every step,
                                rounded to it after every step), so the weights are the fp16/bf16
                                model alone and may be written between steps; needs model */
    uint32_t init_tag; /* set by capex_optim_param_init (see "Descriptors") */
} capex_optim_param;

/* Apex defaults for the kind (see capex_optim_hparams). */
CAPEX_API void capex_optim_desc_init(capex_optim_desc *desc, capex_optim_kind kind);
CAPEX_API void capex_optim_param_init(capex_optim_param *p);
/* One parameter wired as the opt level says (amp.initialize's master
   weights and model copy), after capex_optim_param_init:
     fp32 model (O0, O1, disabled): param = fp32_weights, grads f32, no copy;
     half model with master weights (O2): param = fp32_weights (the fp32
       masters), model = half_weights of cfg->model_dtype, grads in it;
     half model without (O3): the same with pure_half = 1.
   half_weights may be NULL for an fp32 model; exp_avg etc. stay as they were.
   The scaler's side is capex_scaler_desc_from_amp. */
CAPEX_API capex_result capex_optim_param_from_amp(const capex_amp_config *cfg, float *fp32_weights, void *half_weights,
                                                  const void *grad, int64_t numel, capex_optim_param *p);

typedef struct capex_optim capex_optim;

CAPEX_API capex_result capex_optim_create(const capex_optim_desc *desc, capex_optim **out);
/* Frees what the optimizer allocated (never user buffers). NULL is fine. */
CAPEX_API void capex_optim_destroy(capex_optim *opt);
/* Adds a group of n parameters with hyperparameters hp (NULL: desc.defaults);
   *group_index (optional) receives its index. Everything is validated first:
   on error the optimizer is unchanged. */
CAPEX_API capex_result capex_optim_add_group(capex_optim *opt, const capex_optim_hparams *hp,
                                             const capex_optim_param *params, size_t n, size_t *group_index);
/* One step over every group. g = grad * inv_scale * clip_coef (inv_scale =
   1/loss_scale, clip_coef e.g. from clipping by global norm; pass 1, 1 for
   neither; their product must be a finite float). found_inf != 0 skips the
   step: no weight, moment, model copy or step count changes (Apex: skipped
   step on overflow); only an attached schedule's iteration count advances. */
CAPEX_API capex_result capex_optim_step(capex_optim *opt, float inv_scale, float clip_coef, int found_inf);

CAPEX_API size_t capex_optim_num_groups(const capex_optim *opt);
CAPEX_API capex_result capex_optim_get_hparams(const capex_optim *opt, size_t group, capex_optim_hparams *hp);
/* Validated like add_group; takes effect at the next step (LR schedules). */
CAPEX_API capex_result capex_optim_set_hparams(capex_optim *opt, size_t group, const capex_optim_hparams *hp);
CAPEX_API capex_result capex_optim_set_lr(capex_optim *opt, size_t group, float lr);
/* Steps taken by a group (skipped steps do not count). */
CAPEX_API capex_result capex_optim_get_step(const capex_optim *opt, size_t group, int64_t *step);
/* Points a parameter at a new gradient buffer (same numel). */
CAPEX_API capex_result capex_optim_set_grad(capex_optim *opt, size_t group, size_t index, const void *grad,
                                            capex_dtype grad_dtype);
/* The moment buffers of one parameter (NULL where the optimizer has none). */
CAPEX_API capex_result capex_optim_get_state(const capex_optim *opt, size_t group, size_t index, float **exp_avg,
                                             float **exp_avg_sq);
/* NovoGrad: the per-tensor average gradient norm v of one parameter (0 before
   the first step). Other kinds: CAPEX_ERR_CONFIG. Reads only; not with a
   concurrent step on the same optimizer. */
CAPEX_API capex_result capex_optim_get_novograd_norm(const capex_optim *opt, size_t group, size_t index, float *v);
/* Adam amsgrad's max_exp_avg_sq buffer of one parameter (NULL without amsgrad). */
CAPEX_API capex_result capex_optim_get_max_exp_avg_sq(const capex_optim *opt, size_t group, size_t index,
                                                      float **max_exp_avg_sq);

/* Flag of the optimizer save/load functions below, capex_zero_save/load and
   capex_cuda_optim_to_host/from_host: the weights too (kept under CAPEX_NO_STATE).
   They refuse other bits (CAPEX_ERR_INVALID_ARG). */
#define CAPEX_OPTIM_STATE_PARAMS 1u
#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE: no optimizer save/load (they need the state files) */
/* ---- optimizer state save/restore (State files container) -----------------

   Saved under names "<prefix>.*" (prefix NULL: "optim"): kind and modes,
   max_grad_norm, the stochastic-rounding seed (the rounding is counter-based:
   seed + step counts are its whole RNG state), per group its hyperparameters,
   step count and tensor count, the attached lr schedule ("<prefix>.lr_schedule.*",
   its iteration count too (files from before it: the most steps a group
   took); absent when none: loading such a file keeps the optimizer's own), per
   parameter its numel and moment buffers (f32, shape [numel]); NovoGrad adds
   its modes (novograd_reg_inside_moment, _init_zero, _norm_type) and v, one
   f32 per parameter (novograd_grad_norm_avg, shape [num_params]). With
   CAPEX_OPTIM_STATE_PARAMS also the fp32 params /
   master weights and the fp16/bf16 model copies, which a lossy half model
   checkpoint cannot restore exactly. Loading resumes bit-identically.

       capex_state_writer *w; capex_state_writer_create(NULL, &w);
       capex_optim_save(opt, w, NULL, CAPEX_OPTIM_STATE_PARAMS);
       capex_scaler_save(...same writer...);             // one file, many parts
       capex_state_write_file(w, "ckpt.safetensors"); capex_state_writer_destroy(w);
       // later, an optimizer built with the same groups and sizes:
       capex_optim_load_file(opt, "ckpt.safetensors", CAPEX_OPTIM_STATE_PARAMS);

   Load checks everything (kind, group and tensor counts, every numel, dtypes,
   shapes, hyperparameter validity) before changing the optimizer; then it
   copies the tensors in. Hyperparameters, modes and seed come from the file
   (torch's load_state_dict restores param_groups too). Only an I/O error
   during that copy (after the file's checksum was verified) can leave the
   optimizer half-loaded; it then refuses to step and to save (CAPEX_ERR_ORDER)
   until a load succeeds. save keeps pointers into the optimizer: write the file
   before the next step. Not thread-safe with a concurrent step. */
CAPEX_API capex_result capex_optim_save(const capex_optim *opt, capex_state_writer *w, const char *prefix,
                                        unsigned flags);
CAPEX_API capex_result capex_optim_load(capex_optim *opt, capex_state_reader *r, const char *prefix, unsigned flags);
/* One-call versions: a file holding only this optimizer (prefix "optim"). */
CAPEX_API capex_result capex_optim_save_file(const capex_optim *opt, const char *path, unsigned flags);
CAPEX_API capex_result capex_optim_load_file(capex_optim *opt, const char *path, unsigned flags);
#endif /* CAPEX_NO_STATE */

/* ==== learning-rate schedules: declarations ==== */
/* ---------------------------------------------------------------------------
   Learning-rate schedules (torch.optim.lr_scheduler values, as a pure function
   of the step)

       capex_lr_schedule s; capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
       s.warmup_steps = 500; s.total_steps = 10000;  // warmup, then cosine to 0
       capex_optim_set_lr_schedule(opt, &s);         // base lr: each group's hp.lr
       for (each step) capex_optim_step(opt, inv_scale, 1.0f, found_inf);

   lr(step) = capex_lr_at(&s, base_lr, step), float64, step = steps taken
   before this one. With warmup_steps W > 0, steps 0..W-1 are torch's
   LinearLR(start_factor=warmup_start_factor, total_iters=W) and the decay
   runs on t = step - W (torch: SequentialLR([LinearLR, decay], milestones=[W])).
   warmup_llmc = 1 makes the warmup base*(step+1)/W instead (llm.c's and
   nanoGPT's; no LinearLR start_factor gives it); with COSINE that is llm.c's
   get_learning_rate, min_factor its final_learning_rate_frac:
     CONSTANT    base
     COSINE      eta + (base-eta)*(1+cos(pi*t/T))/2, eta = base*min_factor,
                 T = total_steps - W   (CosineAnnealingLR, T_max = T)
     LINEAR      base*(1 + (min_factor-1)*min(T,t)/T)   (LinearLR, end_factor)
     POLYNOMIAL  eta + (base-eta)*(1 - min(T,t)/T)^power  (PolynomialLR: eta 0)
     STEP        base*gamma^(t / step_size)              (StepLR)
     MULTISTEP   base*gamma^(milestones <= t)            (MultiStepLR)
     EXPONENTIAL base*gamma^t                            (ExponentialLR)
     ONECYCLE    torch OneCycleLR with max_lr = base, over total_steps
                 (pct_start, div_factor, final_div_factor, anneal_linear,
                 three_phase; lr only: momentum is not cycled; no warmup)
   Values equal torch's closed forms (_get_closed_form_lr; OneCycleLR's
   get_lr) to the last bit or so; torch's step() uses chainable recurrences
   that drift from them by ~1e-15 relative per step. Past the end of the
   schedule the value holds: torch's CosineAnnealingLR would rise again after
   T_max and OneCycleLR raises; ours stays at the last value.

   On an optimizer the schedule is driven by each group's own step count,
   which skipped (overflow) steps do not advance, so a skipped step does not
   consume schedule. torch's scheduler.step() (called every iteration)
   advances on skipped steps too: for its curve set count_skipped = 1, and
   every group follows the schedule's own iteration count (torch's one
   last_epoch for all groups), which every step call advances, skipped or
   not: the lr of a step taken at iteration i is capex_lr_at(&s, base_lr, i).
   The CUDA optimizer computes the lr on the device from those counts.
   The schedule and counts are saved with the optimizer's state, so a
   resumed run continues the curve exactly. Pure functions: thread-safe.
   ------------------------------------------------------------------------- */
typedef enum capex_lr_kind {
    CAPEX_LR_CONSTANT = 0,
    CAPEX_LR_COSINE = 1,
    CAPEX_LR_LINEAR = 2,
    CAPEX_LR_POLYNOMIAL = 3,
    CAPEX_LR_STEP = 4,
    CAPEX_LR_MULTISTEP = 5,
    CAPEX_LR_EXPONENTIAL = 6,
    CAPEX_LR_ONECYCLE = 7
} capex_lr_kind;

#define CAPEX_LR_MAX_MILESTONES 16

typedef struct capex_lr_schedule {
    capex_lr_kind kind;
    int64_t warmup_steps;         /* linear warmup steps before the decay (default 0; not ONECYCLE) */
    double warmup_start_factor;   /* lr factor at step 0 of the warmup, in [0, 1] (torch LinearLR: 1/3) */
    int64_t total_steps;          /* COSINE, LINEAR, POLYNOMIAL: warmup + decay; ONECYCLE: the cycle */
    double min_factor;            /* COSINE eta_min, LINEAR end_factor, POLYNOMIAL floor, as a fraction of
                                     the base lr, in [0, 1] (default 0) */
    double power;                 /* POLYNOMIAL (default 1) */
    int64_t step_size;            /* STEP (default 1) */
    double gamma;                 /* STEP, MULTISTEP, EXPONENTIAL (default 0.1) */
    int num_milestones;           /* MULTISTEP: steps after warmup, non-decreasing */
    int64_t milestones[CAPEX_LR_MAX_MILESTONES];
    double pct_start;             /* ONECYCLE: 0.3 */
    double div_factor;            /* ONECYCLE: initial lr = base / div_factor (25) */
    double final_div_factor;      /* ONECYCLE: min lr = initial lr / final_div_factor (1e4) */
    int anneal_linear;            /* ONECYCLE: 0 cosine (torch 'cos', default), 1 'linear' */
    int three_phase;              /* ONECYCLE: torch three_phase (default 0) */
    int warmup_llmc;              /* 1: warmup lr = base*(step+1)/W (llm.c, nanoGPT): the base lr at step
                                     W-1, warmup_start_factor unused; 0: torch LinearLR (default) */
    int count_skipped;            /* 1: on an optimizer, driven by its iteration count, which skipped steps
                                     advance too (torch's scheduler.step() every iteration); 0: by each
                                     group's step count, which they do not (default) */
    uint32_t init_tag;            /* set by capex_lr_schedule_init; any other struct is refused */
} capex_lr_schedule;

/* torch's defaults for the kind (above); total_steps 0 (set it where used). */
CAPEX_API void capex_lr_schedule_init(capex_lr_schedule *s, capex_lr_kind kind);
/* CAPEX_OK, or the first bad field with a message saying what to set. */
CAPEX_API capex_result capex_lr_schedule_check(const capex_lr_schedule *s);
/* The lr of step `step` (0: the first step) for a group whose base lr is
   base_lr. NaN (and capex_last_error) for a bad schedule, step < 0, a
   base_lr that is negative or not finite, or an lr that overflows (gamma > 1
   run long, tiny OneCycle div factors). */
CAPEX_API double capex_lr_at(const capex_lr_schedule *s, double base_lr, int64_t step);
/* Goyal et al. linear scaling rule: base_lr * global_batch / base_batch
   (pair it with warmup). NaN (and capex_last_error) when a batch is <= 0,
   base_lr is negative or not finite, or the product overflows. */
CAPEX_API double capex_lr_scale_linear(double base_lr, int64_t global_batch, int64_t base_batch);

/* Attaches a copy of s to the optimizer (NULL: detach). Each step then uses
   lr = (float)capex_lr_at(s, group's hp.lr, n), n = the group's step count,
   or with s->count_skipped the schedule's iteration count: the step calls
   made while a schedule was attached (skipped ones too; refused ones not),
   0 when one is attached to an optimizer that had none (a new torch
   scheduler), kept when one replaces another. hp.lr stays the base lr
   (capex_optim_set_lr changes the base). Validated first. A step whose lr
   is not a finite float fails (CAPEX_ERR_INVALID_ARG, nothing changed) on
   the CPU; the CUDA optimizer computes it on the device and cannot refuse. */
CAPEX_API capex_result capex_optim_set_lr_schedule(capex_optim *opt, const capex_lr_schedule *s);
/* *s = the attached schedule; *attached = 0 when none (then *s is untouched). */
CAPEX_API capex_result capex_optim_get_lr_schedule(const capex_optim *opt, capex_lr_schedule *s, int *attached);
/* The schedule's iteration count (above; torch's scheduler.last_epoch);
   0 without a schedule. */
CAPEX_API capex_result capex_optim_get_lr_iteration(const capex_optim *opt, int64_t *iteration);
/* The lr the group's next step will use (its hp.lr without a schedule);
   CAPEX_ERR_INVALID_ARG (*lr set) when the schedule's is not a finite float. */
CAPEX_API capex_result capex_optim_get_lr(const capex_optim *opt, size_t group, float *lr);

/* ==== data parallel: declarations ==== */
#ifdef CAPEX_NO_DIST /* CAPEX_NO_DIST leaves out launcher env, comms, rendezvous, TCP, DDP, ZeRO and
                        SyncBatchNorm; the clock and the distributed sampler stay */
typedef struct capex_comm capex_comm; /* incomplete: batch norm's comm argument must be NULL */
/* Seconds on a monotonic clock. */
CAPEX_API double capex_dist_now(void);
#else

/* ---------------------------------------------------------------------------
   Data parallel (DIST)

   Launcher environment, a comm vtable (single process, MPI with CAPEX_MPI,
   NCCL in capex_cuda.h), a TCP rendezvous for small blobs (NCCL's unique id),
   DDP gradient buckets (PyTorch reducer / Apex DDP semantics) and PyTorch's
   DistributedSampler.

       capex_dist_env env;  capex_dist_env_read(NULL, &env);  // torchrun/mpirun/srun
       capex_dist_log_init(&env);                             // warnings on rank 0 only
       capex_comm comm;     capex_comm_init_single(&comm);    // or _mpi (CAPEX_MPI)
       capex_ddp_param ps[2] = {{w, nw, CAPEX_F32, NULL}, {b, nb, CAPEX_F32, NULL}};
       capex_ddp_desc dd;   capex_ddp_desc_init(&dd);
       capex_ddp *ddp;      capex_ddp_create(&ddp, &comm, ps, 2, &dd); // broadcasts params
       for (step...) {
           float *gb = (float *)capex_ddp_grad(ddp, 1);  // grads live in the buckets
           backward_bias(gb);  capex_ddp_grad_ready(ddp, 1);  // bucket reduce may start
           float *gw = (float *)capex_ddp_grad(ddp, 0);
           backward_w(gw);     capex_ddp_grad_ready(ddp, 0);
           if (capex_ddp_finalize(ddp) != CAPEX_OK) break;   // never step on failure
           sgd_step(); capex_ddp_zero_grad(ddp);
       }

   Counts are elements, never bytes. Every collective has a deadline
   (comm->timeout_s); past it the call returns CAPEX_ERR_TIMEOUT, a failed peer
   gives CAPEX_ERR_COMM, and the communicator is marked failed (every later
   call fails fast: tear the job down). With Open MPI a killed rank normally
   makes mpirun end the whole job; under mpirun --enable-recovery the
   survivors stay alive and get CAPEX_ERR_TIMEOUT from finalize within the
   deadline. Thread safety: a capex_comm and a
   capex_ddp are used by one thread at a time; capex_dist_env_read and the
   sampler functions are reentrant.
   ------------------------------------------------------------------------- */

/* -- launcher environment -- */
typedef enum capex_launcher {
    CAPEX_LAUNCHER_NONE = 0,     /* no launcher variables: single process     */
    CAPEX_LAUNCHER_EXPLICIT = 1, /* rank and world size given in the desc     */
    CAPEX_LAUNCHER_TORCHRUN = 2, /* RANK, WORLD_SIZE, LOCAL_RANK, ...          */
    CAPEX_LAUNCHER_OPENMPI = 3,  /* OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_*     */
    CAPEX_LAUNCHER_PMI = 4,      /* MPICH / Intel MPI: PMI_RANK, PMI_SIZE      */
    CAPEX_LAUNCHER_SLURM = 5,    /* srun: SLURM_PROCID, SLURM_NTASKS, ...      */
    CAPEX_LAUNCHER_FLUX = 6      /* flux run: FLUX_TASK_RANK, FLUX_JOB_SIZE, ... */
} capex_launcher;

/* getenv-like lookup: return the value or NULL. Injectable for tests. */
typedef const char *(*capex_getenv_fn)(const char *name, void *user_data);

typedef struct capex_dist_env_desc {
    capex_getenv_fn getenv_fn; /* NULL: the process environment (getenv)     */
    void *getenv_user;
    /* Explicit overrides; -1 (or NULL) means "from the environment".        */
    int rank, world_size, local_rank, local_world_size;
    const char *master_addr;
    int master_port;
    const char *run_id;
    uint32_t init_tag; /* set by capex_dist_env_desc_init (see "Descriptors") */
} capex_dist_env_desc;

typedef struct capex_dist_env {
    capex_launcher launcher;
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank;          /* rank / local_world_size for uniform block
                               placement (local_rank == rank % local size), else -1 */
    char master_addr[256];  /* "" when unknown                               */
    int master_port;        /* 0 when unknown                                */
    char run_id[128];       /* CAPEX_RUN_ID, TORCHELASTIC_RUN_ID, SLURM job  */
    int rdv_port;           /* where capex's own TCP rendezvous and comm listen
                               on MASTER_ADDR: CAPEX_PORT if set, else
                               MASTER_PORT + 1 under torchrun >= 2 (its agent's
                               TCPStore holds MASTER_PORT:
                               TORCHELASTIC_USE_AGENT_STORE=True), else
                               MASTER_PORT; 0 when unknown. An env filled by
                               hand may leave it 0: the same rule then applies
                               but for CAPEX_PORT (set rdv_port for that), and
                               MASTER_PORT=65535 under the agent store is
                               refused too (CAPEX_ERR_CONFIG). */
} capex_dist_env;

CAPEX_API void capex_dist_env_desc_init(capex_dist_env_desc *d);
/* Reads the launcher's variables (d may be NULL: defaults). Precedence, first
   match wins: explicit desc fields > torchrun (RANK) > Open MPI
   (OMPI_COMM_WORLD_RANK) > PMI (PMI_RANK) > Flux (FLUX_TASK_RANK,
   FLUX_JOB_SIZE, FLUX_TASK_LOCAL_ID; no local size: taken as the world's) >
   Slurm (SLURM_PROCID) > single process. Numbers parse strictly (decimal
   digits only); rank < world etc. are validated; errors are CAPEX_ERR_CONFIG
   naming the variable. PMI without MPI_LOCALRANKID (srun --mpi=pmi2, Flux's
   PMI) takes local ranks from Flux's, else Slurm's variables when they
   describe the same task. Reentrant. */
CAPEX_API capex_result capex_dist_env_read(const capex_dist_env_desc *d, capex_dist_env *out);
CAPEX_API const char *capex_launcher_name(capex_launcher l);
/* Sets the log rank (capex_log_set_rank) so default warnings print once. */
CAPEX_API void capex_dist_log_init(const capex_dist_env *env);

/* -- communicator -- */
typedef enum capex_reduce_op { CAPEX_REDUCE_SUM = 0, CAPEX_REDUCE_AVG = 1 } capex_reduce_op;

/* Collective-only element types: f64 sums (SyncBatchNorm statistics, metrics)
   and exact int64 sums (counts). Not tensor dtypes: only the capex_comm_*
   calls and the comm backends take them (DDP buckets, tensor lists and
   optimizers keep F32/F16/BF16). Same values as capex_state_dtype's. AVG is
   for floating types only. */
#define CAPEX_F64 ((capex_dtype)3)
#define CAPEX_I64 ((capex_dtype)4)
/* Bytes per element of a comm dtype (4, 2, 2, 8, 8); 0 if invalid. */
CAPEX_API size_t capex_comm_dtype_size(capex_dtype t);

typedef struct capex_comm capex_comm;

/* Direction of a mem_copy (device backends; host backends ignore it). */
typedef enum capex_copy_kind { CAPEX_COPY_D2D = 0, CAPEX_COPY_H2D = 1, CAPEX_COPY_D2H = 2 } capex_copy_kind;

/* An in-flight collective. Storage is opaque to callers; backends keep their
   handle (MPI_Request, CUevent, ...) and scratch pointers here. */
typedef struct capex_comm_req {
    int active;
    void *p[4];
    size_t n[4];
    union { void *ptr; uint64_t u64; double d; unsigned char bytes[64]; } handle;
} capex_comm_req;

/* Backend vtable. Buffers are host memory, or device memory when
   comm->device_buffers is set (NCCL: then `stream` is the CUstream to order
   work on and the optional mem/scale/convert entries must be given).
   Broadcast and allgather move bits (no arithmetic) for every dtype. Every
   entry returns CAPEX_ERR_TIMEOUT past `deadline` (seconds on
   capex_dist_now()'s clock) and CAPEX_ERR_COMM on a peer failure. */
typedef struct capex_comm_vtable {
    const char *name;
    capex_result (*allreduce)(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                              capex_reduce_op op, double deadline);
    capex_result (*broadcast)(capex_comm *c, void *buf, size_t count, capex_dtype t, int root, double deadline);
    capex_result (*allgather)(capex_comm *c, const void *send, void *recv, size_t count_per_rank,
                              capex_dtype t, double deadline);
    capex_result (*barrier)(capex_comm *c, double deadline);
    /* Optional (NULL: buckets reduce synchronously with `allreduce`). */
    capex_result (*iallreduce)(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                               capex_reduce_op op, capex_comm_req *req);
    capex_result (*wait)(capex_comm *c, capex_comm_req *req, double deadline);
    /* Optional: async error check (NCCL: ncclCommGetAsyncError). */
    capex_result (*poll_error)(capex_comm *c);
    /* Optional: tear down in-flight work after a failure (ncclCommAbort). */
    void (*abort)(capex_comm *c);
    void (*destroy)(capex_comm *c);
    /* Optional memory entries for device buffers (NULL: host malloc/memcpy/loops). */
    capex_result (*mem_alloc)(capex_comm *c, void **ptr, size_t bytes);
    void (*mem_free)(capex_comm *c, void *ptr);
    capex_result (*mem_copy)(capex_comm *c, void *dst, const void *src, size_t bytes, capex_copy_kind kind);
    capex_result (*mem_zero)(capex_comm *c, void *dst, size_t bytes);
    /* x *= factor, computed in f32 and rounded back for f16/bf16. */
    capex_result (*scale)(capex_comm *c, void *buf, size_t count, capex_dtype t, float factor);
    /* dst = (dst_t)src, element-wise, round to nearest even. */
    capex_result (*convert)(capex_comm *c, void *dst, capex_dtype dst_t, const void *src, capex_dtype src_t,
                            size_t count);
    /* Optional: non-blocking completion check (*done = 1 when finished). The
       bucket tracker calls it from grad_ready so that MPI, which progresses
       only inside MPI calls, keeps reducing while backward runs. */
    capex_result (*test)(capex_comm *c, capex_comm_req *req, int *done);
    /* Optional (NULL: the front-ends fall back to allreduce into scratch /
       allgather of padded shards). Uneven shards: counts[world_size], the
       same on every rank; displ(p) = counts[0] + ... + counts[p-1]. */
    capex_result (*reduce_scatter)(capex_comm *c, const void *send, void *recv, const size_t *counts, capex_dtype t,
                                   capex_reduce_op op, double deadline);
    capex_result (*allgatherv)(capex_comm *c, const void *send, void *recv, const size_t *counts, capex_dtype t,
                               double deadline);
    /* Optional, nonblocking, equal shards of count elements (ZeRO's buckets;
       NULL or CAPEX_ERR_UNSUPPORTED: the caller goes blocking); finished by
       wait, progressed by test. reduce_scatter: rank r gets elements
       [r*count, (r+1)*count) of the sum (half types summed as the backend's
       allreduce sums them: MPI, TCP in f32, rounded once; NCCL in the
       dtype); in place when recv == send + r*count. allgather: send is this
       rank's count elements, in place when send == recv + r*count. */
    capex_result (*ireduce_scatter)(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                    capex_reduce_op op, capex_comm_req *req);
    capex_result (*iallgather)(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                               capex_comm_req *req);
    /* Optional (NULL: every dtype): CAPEX_OK when the reductions take dtype t,
       else the status and the reason (NCCL before 2.10 has no bf16). DDP and
       ZeRO ask at create, so a missing type fails there, not mid-backward. */
    capex_result (*check_dtype)(capex_comm *c, capex_dtype t);
    /* Optional: room made now, so that the calls of a bucket launch and
       finalize allocate and create nothing (a failure there on one rank
       left its peers in the collective): with scales, what scale and
       convert run (NCCL: the built-in kernels); scale of up to half_count
       f16/bf16 elements (NCCL stages them in f32); `requests` more
       nonblocking requests in flight at once (negative: gives back an
       earlier reservation). DDP and ZeRO call it at create (DDP at a
       rebuild too), before their agreement, and at destroy. */
    capex_result (*reserve)(capex_comm *c, int scales, size_t half_count, long requests);
    /* Optional (device comms): a device buffer of at least `bytes`, kept by
       the comm, for capex's small exchanges of host values (the creates'
       model check, agreements, DDP's ready order); only those use it, one
       at a time. Grown when smaller (an allocation: a rank failing it alone
       would leave its peers in the exchange), so the comm makes it at init
       for the fixed ones and DDP asks for its ready order at create. NULL:
       DDP and ZeRO allocate one (mem_alloc) at create, first, and keep it
       until destroy (a rank failing that one allocation alone cannot join
       the model check: its peers fail at their deadline). */
    capex_result (*host_buffer)(capex_comm *c, size_t bytes, void **dev);
} capex_comm_vtable;

struct capex_comm {
    const capex_comm_vtable *vt;
    void *impl;              /* backend state                                 */
    int rank, world_size;
    int device_buffers;      /* 1: buffers are device pointers                */
    void *stream;            /* backend stream (CUstream for NCCL), or NULL   */
    double timeout_s;        /* deadline of each collective (default 1800 s)  */
    int failed;              /* set after a timeout/peer failure: calls fail  */
    const capex_allocator *allocator;
};

/* Seconds on a monotonic clock (deadlines are absolute on this clock). */
CAPEX_API double capex_dist_now(void);
/* World of one: collectives are copies / no-ops. */
CAPEX_API capex_result capex_comm_init_single(capex_comm *c);
/* MPI over MPI_COMM_WORLD (duplicated, errors return instead of aborting).
   MPI must be initialised by the caller. Without CAPEX_MPI: CAPEX_ERR_NO_MPI.
   With CAPEX_MPI, capex_comm_init_mpi(c, MPI_Comm) takes any intracommunicator
   (MPI_COMM_NULL and intercommunicators: CAPEX_ERR_INVALID_ARG). Destroy
   it before MPI_Finalize; calls after that return CAPEX_ERR_ORDER. */
CAPEX_API capex_result capex_comm_init_mpi_world(capex_comm *c);
CAPEX_API void capex_comm_destroy(capex_comm *c);
/* TCP through rank 0 at env's MASTER_ADDR:MASTER_PORT (nonce from env's
   run id): CPU jobs without MPI, e.g. under torchrun --no-python. Small
   messages go through rank 0 (a star: rank-order sums); from 256 KiB,
   allreduce, reduce-scatter and allgatherv run on a ring (bandwidth-optimal:
   each rank sends 2 (W-1)/W of the data; chunk k summed in rank order k+1,
   ..., k). Deterministic either way: the same bits on every rank and run to
   run. Synchronous; rank 0 carries the star's O(world) load, so meant for a
   node or a few. Ranks 2..W-1 also listen on an ephemeral port (the address
   their connection to rank 0 uses) for their ring link. Ranks whose calls
   differ (order, byte count, counts arrays, a reduction's dtype or op, a
   broadcast's root) get CAPEX_ERR_COMM in that call (broadcast and
   allgather move bits: f32 x 4 against f16 x 8 passes); for that check a broadcast waits for a word from every peer
   (a round trip through rank 0). */
CAPEX_API capex_result capex_comm_init_tcp(capex_comm *c, const capex_dist_env *env, double connect_timeout_s);
/* The backend for how the job was launched: MPI when built with CAPEX_MPI
   and MPI is initialised (call MPI_Init first), else TCP when env has more
   than one rank (torchrun --no-python, srun), else single. Checks that the
   comm's rank and size agree with env. */
CAPEX_API capex_result capex_comm_init_auto(capex_comm *c, const capex_dist_env *env);
/* Checked front-ends: argument checks, deadline = now + timeout_s, failure
   marking. send == recv (in place) is allowed. AVG = sum, then / world.
   No elements (count 0, or counts summing to 0) is still a collective on a
   multi-rank host comm (a barrier): every rank must make the call. So is a
   call refused with CAPEX_ERR_INVALID_ARG, or failing before any traffic
   with CAPEX_ERR_OUT_OF_MEMORY or CAPEX_ERR_LIMIT: ranks refusing alike keep
   the comm, peers that made the call fail at once (CAPEX_ERR_COMM). A rank
   failing alone mid-call (TCP: no memory for its scratch) returns its status,
   fails the comm and its peers (CAPEX_ERR_COMM) at once. */
CAPEX_API capex_result capex_comm_allreduce(capex_comm *c, const void *send, void *recv, size_t count,
                                            capex_dtype t, capex_reduce_op op);
CAPEX_API capex_result capex_comm_broadcast(capex_comm *c, void *buf, size_t count, capex_dtype t, int root);
CAPEX_API capex_result capex_comm_allgather(capex_comm *c, const void *send, void *recv, size_t count_per_rank,
                                            capex_dtype t);
CAPEX_API capex_result capex_comm_barrier(capex_comm *c);
/* Reduce-scatter with uneven shards (the sharded optimizer's gradient step):
   counts has world_size entries, equal on every rank, zeros allowed; send
   holds total = sum(counts) elements on every rank; recv gets this rank's
   slice of the reduction, elements [displ, displ + counts[rank]) with
   displ = counts[0] + ... + counts[rank-1]. In place when recv == send +
   displ elements; otherwise recv must not overlap send. Half types are summed
   in f32 and rounded once (host backends; NCCL sums in the dtype, as its
   allreduce). The sum order is each backend's own (bits may differ from
   allreduce's), every rank gets its slice of one reduction. */
CAPEX_API capex_result capex_comm_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                                 capex_dtype t, capex_reduce_op op);
/* All-gather with uneven shards: send holds counts[rank] elements; recv
   (total elements) gets rank p's at displ(p). In place when send == recv +
   displ(rank) elements. Moves bits (no arithmetic) for every dtype. */
CAPEX_API capex_result capex_comm_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                             capex_dtype t);

/* -- TCP rendezvous: rank 0 sends a small blob to every rank -- */
typedef struct capex_rendezvous_desc {
    const char *addr;      /* MASTER_ADDR (name or numeric); rank 0 binds it */
    int port;              /* MASTER_PORT                                    */
    int rank, world_size;
    uint64_t nonce;        /* per run: capex_rendezvous_nonce(env.run_id)    */
    double timeout_s;      /* whole-call deadline (default 300 s)            */
    double retry_interval_s; /* between connection attempts (default 0.05) */
    uint32_t init_tag; /* set by capex_rendezvous_desc_init (see "Descriptors") */
} capex_rendezvous_desc;

CAPEX_API void capex_rendezvous_desc_init(capex_rendezvous_desc *d);
/* FNV-1a 64 of the run id (NULL or "" gives a fixed value: no protection). */
CAPEX_API uint64_t capex_rendezvous_nonce(const char *run_id);
/* Rank 0 listens at addr:port and waits for world_size-1 peers; each peer
   connects (retrying until the deadline), and is checked: magic, version,
   nonce, world size, rank, blob size. A peer with a foreign nonce is refused
   and rank 0 keeps waiting (a stale job cannot break a new one); a peer of
   this run with a wrong world size, rank or size, or a rank seen twice, fails
   the call with CAPEX_ERR_COMM. Then blob (size bytes) goes from rank 0 to
   all. Deadline: CAPEX_ERR_TIMEOUT. Rank 0 serves all connections at once:
   one that has not sent a valid hello within 2 s is dropped, one that sends
   bytes no hello begins with at once, and at most 64 wait at a time, so
   stray, idle or garbage connections to the port cannot delay the job (a
   real peer dropped this way reconnects). Unix only (else
   CAPEX_ERR_UNSUPPORTED). Thread-safe (no shared state). */
CAPEX_API capex_result capex_rendezvous_broadcast(const capex_rendezvous_desc *d, void *blob, size_t size);
/* The bootstrap path for NCCL's unique id (or any small blob), rank 0 to all:
   over `comm` when it spans more than one rank with host buffers (an MPI
   comm), else over the TCP rendezvous at env's MASTER_ADDR:MASTER_PORT with
   the nonce of env's run id. timeout_s <= 0: 300 s. */
CAPEX_API capex_result capex_dist_broadcast_blob(const capex_dist_env *env, capex_comm *comm, void *blob, size_t size,
                                                 double timeout_s);

/* -- DDP gradient buckets -- */
typedef struct capex_ddp capex_ddp;

typedef struct capex_ddp_param {
    void *data;          /* parameter values (broadcast from rank 0 at start) */
    size_t numel;
    capex_dtype dtype;   /* of the gradient (and of data)                     */
    void *grad;          /* NULL: the grad is a view into its bucket (no copy;
                            ask capex_ddp_grad). Else the engine's own buffer:
                            copied in at grad_ready, reduced result copied back */
} capex_ddp_param;

typedef struct capex_ddp_desc {
    size_t first_bucket_bytes;  /* 1 MiB (PyTorch _DEFAULT_FIRST_BUCKET_BYTES) */
    size_t bucket_bytes;        /* 25 MiB (bucket_cap_mb)                      */
    size_t message_size;        /* Apex, in elements: >0 replaces both limits  */
    int delay_allreduce;        /* 0: launch buckets during backward           */
    int gradient_average;       /* 1: divide by world size                     */
    float gradient_predivide_factor; /* 1.0 (Apex): x/f before, x*f/world after.
                                   torch divides by world before the sum: set
                                   f = world for that (with 1.0 a half sum can
                                   overflow to Inf where the average fits) */
    int allreduce_always_fp32;  /* 0; 1: half buckets reduced through f32       */
    int find_unused_parameters; /* 0: finalize fails if a param was not ready   */
    int rebuild_buckets;        /* 0; 1: rebuild once from rank 0's ready order */
    int broadcast_parameters;   /* 1: rank 0's params to all at create          */
    uint32_t init_tag; /* set by capex_ddp_desc_init (see "Descriptors") */
} capex_ddp_desc;

typedef struct capex_ddp_bucket_info {
    capex_dtype dtype;          /* of the grads in it                           */
    size_t numel;               /* elements in the bucket, alignment gaps included */
    size_t num_params;
    const size_t *params;       /* param indices, in bucket (ready) order       */
    const size_t *offsets;      /* element offset of each param in the bucket:
                                   16-byte aligned (gaps of zeros between views) */
} capex_ddp_bucket_info;

CAPEX_API void capex_ddp_desc_init(capex_ddp_desc *d);
/* Plans buckets (per dtype, params in reverse order: the order backward
   produces them), allocates their buffers and, if asked, broadcasts the
   parameters from rank 0. comm must outlive the ddp. Not thread-safe.
   Collective: before the broadcast every rank checks that all ranks pass
   the same model and descriptor (PyTorch DDP's parameter shape check), in
   one allgather of 18 int64 per rank (none in a world of 1). Every rank
   then fails alike, with a message naming the ranks and what differs:
   CAPEX_ERR_SIZE_MISMATCH for a different param count, elements, sizes or
   dtypes; CAPEX_ERR_CONFIG for different bucket limits (first_bucket_bytes,
   bucket_bytes, message_size), gradient_average, gradient_predivide_factor,
   allreduce_always_fp32, find_unused_parameters, rebuild_buckets,
   broadcast_parameters or delay_allreduce (grad pointers may differ); a
   rank refusing its own arguments returns its error and the others
   CAPEX_ERR_COMM. The comm stays usable after such a failure. Over MPI a
   half bucket also holds its f32 copy (MPI's staging) from here on, so
   that no launch allocates (a launch failing on one rank hung the others);
   over NCCL the comm gets here what launches and finalizes use (an event
   per bucket, the f32 scratch of the largest half bucket's scale, the
   scale and convert kernels: capex_comm_vtable.reserve). */
CAPEX_API capex_result capex_ddp_create(capex_ddp **out, capex_comm *comm, const capex_ddp_param *params,
                                        size_t num_params, const capex_ddp_desc *d);
CAPEX_API void capex_ddp_destroy(capex_ddp *ddp);
/* Broadcasts every parameter's data from rank 0 (done by create unless
   broadcast_parameters is 0; call again after loading weights on rank 0
   only). Collective: every rank calls it. It sends params[i].data only: under
   O2 that is the half model copy, so broadcast the fp32 master weights
   yourself (capex_comm_broadcast) or start every rank from the same ones, and
   load optimizer and scaler state on every rank. */
CAPEX_API capex_result capex_ddp_broadcast_parameters(capex_ddp *ddp);
/* Where param i's gradient lives (a view into its bucket; the engine's own
   buffer when it gave one). Changes once if rebuild_buckets rebuilds (in the
   first synced finalize): pointers taken before it stay valid, holding the
   reduced grads for that step, until the next iteration begins (zero_grad,
   grad_ready, mark_unused or finalize); ask again then
   (capex_ddp_layout_version() tells when). NULL if out of range. */
CAPEX_API void *capex_ddp_grad(capex_ddp *ddp, size_t param);
CAPEX_API int capex_ddp_layout_version(const capex_ddp *ddp);
CAPEX_API size_t capex_ddp_num_buckets(const capex_ddp *ddp);
CAPEX_API capex_result capex_ddp_bucket(const capex_ddp *ddp, size_t bucket, capex_ddp_bucket_info *out);
/* Zeroes every gradient (bucket buffers and the engine's own grads). */
CAPEX_API capex_result capex_ddp_zero_grad(capex_ddp *ddp);
/* sync = 0 is PyTorch's no_sync(): finalize reduces nothing. Between
   iterations only (after finalize). Each micro-batch still makes every param
   ready and finalizes; the grads stay in place, so add the next micro-batch's
   into capex_ddp_grad (zero_grad clears them) and set sync = 1 for the last. */
CAPEX_API capex_result capex_ddp_set_sync(capex_ddp *ddp, int sync);
/* Param i's gradient is complete for this iteration. When its bucket is full
   and every earlier bucket has launched, the bucket's allreduce starts (and
   then any later full buckets, strictly in order). Twice in one iteration or
   an unknown index: CAPEX_ERR_ORDER / CAPEX_ERR_INVALID_ARG. Ranks may report
   in different orders (buckets launch in bucket order everywhere), but then
   another collective on the same comm during backward (SyncBatchNorm's
   backward, a metric) can pair with a bucket's allreduce on another rank:
   the data mix silently when the sizes match, else the collectives fail or
   hang (torch's caveat too). Give it a second comm, or set delay_allreduce
   (buckets then start in finalize). */
CAPEX_API capex_result capex_ddp_grad_ready(capex_ddp *ddp, size_t param);
/* Param i takes no part in this iteration (its grad counts as zero; what
   grad_ready gave it under set_sync(0) still counts, as torch's no_sync). */
CAPEX_API capex_result capex_ddp_mark_unused(capex_ddp *ddp, size_t param);
/* Launches what is left (all of it with delay_allreduce), waits for every
   bucket, scales, and leaves averaged gradients in place. Not-ready params:
   zero grads with find_unused_parameters, else CAPEX_ERR_ORDER before any
   communication. On any failure do not step: gradients are undefined. */
CAPEX_API capex_result capex_ddp_finalize(capex_ddp *ddp);
/* Statistics for tests and tuning. */
typedef struct capex_ddp_stats {
    uint64_t iterations;        /* synced finalizes that succeeded              */
    uint64_t launches;          /* bucket allreduces started                    */
    uint64_t launched_in_backward; /* of those, before finalize was called      */
    uint64_t progress_polls;    /* comm->vt->test calls made from grad_ready    */
} capex_ddp_stats;
CAPEX_API void capex_ddp_get_stats(const capex_ddp *ddp, capex_ddp_stats *out);

/* -- ZeRO: sharded optimizer state (stage 1 and 2) --------------------------

   What Apex's DistributedFusedAdam, DeepSpeed ZeRO and torch's
   ZeroRedundancyOptimizer do, on any capex comm (single, MPI, TCP). The
   gradients are bucketed as DDP's (per dtype, reverse registration order,
   16-byte aligned views) and each bucket is padded to world_size equal
   shards. Rank r owns shard r of every bucket: the reduce-scatter leaves it
   the reduced gradients of that shard only, it keeps the optimizer state of
   that shard only (fp32 master weights for fp16/bf16 params, moments), steps
   it, and an all-gather gives every rank the updated parameters.

       capex_zero_param zp[N];   // data, numel, dtype, group for every param
       capex_zero_desc zd; capex_zero_desc_init(&zd); zd.stage = 2;
       capex_optim_desc od; capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
       capex_zero *z;
       capex_zero_create(&z, &comm, zp, N, &od, NULL, 1, &zd);  // NULL: od.defaults
       for (;;) {
           capex_scaler_scale(&sc, &scale);
           // backward: write param i's grad into capex_zero_grad(z, i), then
           capex_zero_grad_ready(z, i);   // full buckets reduce-scatter in order
           capex_zero_finalize(z);        // the rest; this rank's shard is reduced
           capex_zero_grad_norm(z, &found_inf, &norm);  // one allreduce for both
           capex_scaler_unscale(&sc, 0, found_inf, &inv_scale);
           clip = found_inf ? 1 : capex_clip_coef(norm * inv_scale, max_norm);
           capex_scaler_step(&sc, 0, &do_step);
           capex_zero_step(z, inv_scale, clip, !do_step);  // shard step + all-gather
           capex_scaler_update(&sc);
           capex_zero_zero_grad(z);
       }

   Stages. 1: gradient buckets stay allocated at full size (as DDP's), so
   capex_zero_grad pointers are stable and gradient accumulation works as
   DDP's no_sync (capex_zero_set_sync(z, 0): nothing is reduced). 2: only
   the reduced shard is kept between steps; a bucket's full-size buffer is
   lent from a pool from the first capex_zero_grad of one of its params in an
   iteration until the bucket is reduced, so ask capex_zero_grad again every
   iteration and write the gradient before its grad_ready; every finalize
   reduces and adds into the shard (micro-batches accumulate there; zero_grad
   clears it). Peak gradient memory: the open buckets, typically one or two.
   Over several ranks create allocates the pool's buffers that a backward
   in reverse registration order lends (its peak of open buckets), so no
   rank allocates alone in that first step; another order may grow it.

   Equivalence with DDP + capex_optim: the parameter update is elementwise
   (Adam/AdamW, SGD, Adagrad), so a shard steps exactly as the same elements
   of the unsharded step; the only differences are the order of the gradient
   sum (reduce-scatter vs allreduce: none for 2 ranks, or for sums that are
   exact) and the global norm (per-shard sums of squares added across ranks:
   ~1e-15 relative, so a clip coefficient may move by an ulp). Tested bit for
   bit against DDP + capex_optim under mpirun -np 2/4 and TCP.
   LAMB's global gradient norm and per-tensor |p| and |u|, and NovoGrad's
   per-tensor gradient norms, are sums over the pieces of each tensor on
   every rank (one f64 allreduce each per step), so they match the unsharded
   ones to ~1e-15 relative, not bit for bit; the weights then agree to a few
   ulps (tested). NovoGrad's v (one float per tensor) is kept alike by every
   rank holding a piece. bf16 stochastic rounding draws the unsharded
   optimizer's bits (each piece keyed by its tensor's index and element
   offset; tensors under 2^32 elements), also after a checkpoint (seed and
   mode come from the file, as for every optimizer setting). Device (NCCL) params:
   capex_cuda_zero in capex_cuda.h runs this code with a device optimizer
   (capex_zero_create refuses a device comm with a message). */
typedef struct capex_zero capex_zero;

typedef struct capex_zero_param {
    void *data;        /* the full parameter, numel elements of dtype, on every rank: read at
                          create (after rank 0's broadcast), rewritten by each step's all-gather */
    size_t numel;      /* 0 is allowed */
    capex_dtype dtype; /* of data and of its gradient; F16/BF16 get an fp32 master shard */
    size_t group;      /* optimizer parameter group: index into create's hparams */
} capex_zero_param;

typedef struct capex_zero_desc {
    int stage;                /* 1 (default): optimizer state sharded; 2: gradients too */
    size_t bucket_bytes;      /* gradient bytes per reduce-scatter (25 MiB, DDP's bucket_cap_mb) */
    int gradient_average;     /* 1: reduced gradients are divided by world size (as DDP) */
    int broadcast_parameters; /* 1: rank 0's parameters to every rank at create */
    uint32_t init_tag;        /* set by capex_zero_desc_init (see "Descriptors") */
} capex_zero_desc;

/* Bytes this rank holds (the test of "total / world size"). */
typedef struct capex_zero_memory {
    size_t master_bytes;          /* fp32 master weights of the shard (half params only) */
    size_t moment_bytes;          /* optimizer moments of the shard (Adam 8, SGD 4 or 0 per element) */
    size_t optimizer_state_bytes; /* master_bytes + moment_bytes */
    size_t unsharded_state_bytes; /* the same state for every element, what one DDP rank holds */
    size_t grad_bytes;            /* stage 1: full buckets; stage 2: shards + the pool's peak (MPI: + f32 staging) */
    size_t param_buffer_bytes;    /* flat parameter buffers of the all-gather (full size) */
    size_t shard_elements;        /* elements this rank owns, padding included */
    size_t padding_elements;      /* of those, alignment and shard padding */
    size_t buckets;               /* gradient buckets (each padded to world_size shards) */
    size_t lent_buffers;          /* stage 2: full-size bucket buffers allocated so far (peak in use; W > 1: from create) */
} capex_zero_memory;

CAPEX_API void capex_zero_desc_init(capex_zero_desc *d);
/* Plans buckets and shards, broadcasts (if asked) and copies in the
   parameters, and builds this rank's optimizer from od over the pieces of
   params in its shards: group g gets hparams[g] (hparams NULL: od->defaults
   for every group; num_groups >= 1 + the largest params[i].group). comm
   must outlive z. Collective: every rank calls it with the same arguments
   (pointers aside), checked before the broadcast as capex_ddp_create does
   (one allgather of 18 int64 per rank): params' numels, dtypes and groups
   (CAPEX_ERR_SIZE_MISMATCH), stage, bucket_bytes, gradient_average,
   broadcast_parameters, num_groups, od's kind and settings and each
   group's hparams, the fields the kind reads (CAPEX_ERR_CONFIG; od's exec,
   allocator and lamb_low_memory may differ, and fields the kind ignores). Every rank fails alike; the comm stays usable.
   After the broadcast, one more small allreduce (2 int64): a rank that then
   fails on its own (out of memory for its buckets or optimizer) fails every
   rank (its peers: CAPEX_ERR_COMM naming it), none keeping a zero alone.
   Over MPI the gradient buffers also hold MPI's f32 reduce-scatter staging
   from here on, so that no launch allocates (one failing hung the others). */
CAPEX_API capex_result capex_zero_create(capex_zero **out, capex_comm *comm, const capex_zero_param *params,
                                         size_t num_params, const capex_optim_desc *od,
                                         const capex_optim_hparams *hparams, size_t num_groups,
                                         const capex_zero_desc *d);
CAPEX_API void capex_zero_destroy(capex_zero *z);
/* Where to write param i's gradient (its dtype, numel elements). Stage 1:
   stable for z's life. Stage 2: valid until the bucket holding i is reduced
   (the grad_ready that completes it, or finalize); the first call in an
   iteration lends the bucket a zeroed buffer. NULL on error (the message
   says why). */
CAPEX_API void *capex_zero_grad(capex_zero *z, size_t param);
/* Param i's gradient is complete; full buckets reduce-scatter, in order. */
CAPEX_API capex_result capex_zero_grad_ready(capex_zero *z, size_t param);
/* Reduces what is left. Every param must have been made ready (an unused
   one: grad_ready without writing its gradient, which is then zero); one
   never made ready is CAPEX_ERR_ORDER and finalize changes nothing: ready it
   and call finalize again. After it, this rank's shards hold the reduced (averaged)
   gradients; the rest of the stage-1 buffers is undefined. */
CAPEX_API capex_result capex_zero_finalize(capex_zero *z);
/* One f64 allreduce of the shards' sums of squares: *found_inf = 1 when some
   reduced gradient on some rank is inf/NaN (then *norm is inf or NaN), and
   *norm = float(sqrt(sum)) of the gradients as they are (scaled: multiply
   by inv_scale). Either output may be NULL. Collective. */
CAPEX_API capex_result capex_zero_grad_norm(capex_zero *z, int *found_inf, float *norm);
/* Steps this rank's shard with capex_optim_step(inv_scale, clip_coef,
   found_inf) and all-gathers the parameters into every params[i].data;
   found_inf != 0 changes nothing (and gathers nothing). Collective. */
CAPEX_API capex_result capex_zero_step(capex_zero *z, float inv_scale, float clip_coef, int found_inf);
/* capex_zero_step in two halves, so the engine can run the next forward
   while parameters arrive (MPI: nonblocking all-gathers, first layers'
   buckets first; comms without them gather at once): step_async steps the
   shard and starts the all-gathers; wait_param(i) returns once params[i].data
   holds the update (call it before the forward reads param i), wait_params
   for all of them. Until then that data is the previous step's. The next
   step_async, save or destroy waits for whatever is left. */
CAPEX_API capex_result capex_zero_step_async(capex_zero *z, float inv_scale, float clip_coef, int found_inf);
CAPEX_API capex_result capex_zero_wait_param(capex_zero *z, size_t param);
CAPEX_API capex_result capex_zero_wait_params(capex_zero *z);
/* Zeroes the gradients (stage 1 buckets; stage 2 shards). */
CAPEX_API capex_result capex_zero_zero_grad(capex_zero *z);
/* Stage 1 only: sync = 0 is DDP's no_sync (finalize reduces nothing). */
CAPEX_API capex_result capex_zero_set_sync(capex_zero *z, int sync);
/* This rank's optimizer over its pieces (set_lr, lr schedules, get_step;
   add_group is refused: CAPEX_ERR_UNSUPPORTED). Its tensors are pieces of
   params, not params. */
CAPEX_API capex_optim *capex_zero_optim(capex_zero *z);
/* All zeros for NULL. Not counted: what create reserves on an NCCL comm
   (the comm's, shared by every DDP and ZeRO on it: an f32 scratch of the
   largest half shard, 4 bytes per element, and an event per bucket). */
CAPEX_API capex_zero_memory capex_zero_memory_info(const capex_zero *z);
#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE: no ZeRO checkpoints */
/* Checkpoints in capex_optim's own format, as the unsharded optimizer
   (params group by group, in index order, over whole tensors) would save
   them: independent of the world size (load into any number of ranks: a
   resharding), and loadable by capex_optim_load into a plain optimizer built
   that way (and the other way round). save is collective: one small
   allreduce first (a rank failing its own part, e.g. out of memory, fails
   every rank at once: its peers get CAPEX_ERR_COMM naming it), then shards
   are all-gathered bucket by bucket and rank 0 (which must give a writer; the
   others may pass NULL; rank 0 without one still takes part, then returns
   CAPEX_ERR_INVALID_ARG) adds the whole state; it holds that copy until the
   next save or destroy, so write the file before the next step. load is
   collective too (every rank must call it, each with a reader of the same
   file): every rank reads the whole file into temporary storage (with
   CAPEX_OPTIM_STATE_PARAMS a copy of the params too) and checks it
   (capex_optim_load's checks), then one small allreduce, then every rank
   takes its pieces or none does: a rank whose read or check failed (a
   corrupt or missing file, an I/O error, out of memory) returns its own
   error, its peers CAPEX_ERR_COMM naming it, nothing changed anywhere.
   Ranks calling save and load (or another agreed call) at the same point
   all fail with CAPEX_ERR_CONFIG. With CAPEX_OPTIM_STATE_PARAMS the fp32
   masters and params (and half model copies, into params[i].data) are
   restored bit for bit; without it the masters are rebuilt from the
   params' data as they are. After the agreement the host zero's commit
   cannot fail; the device zero's device copies can: a device error there
   fails that rank's zero for good (every later call refused, as after a
   failed collective; its peers fail at their next collective's deadline). */
CAPEX_API capex_result capex_zero_save(capex_zero *z, capex_state_writer *w, const char *prefix, unsigned flags);
CAPEX_API capex_result capex_zero_load(capex_zero *z, capex_state_reader *rd, const char *prefix, unsigned flags);
/* One file holding only this optimizer (prefix "optim"); rank 0 writes it
   to its path (the others may pass NULL), then frees the unsharded copy
   (save's) at once. Every rank returns rank 0's status, once the file is
   written (one more broadcast). */
CAPEX_API capex_result capex_zero_save_file(capex_zero *z, const char *path, unsigned flags);
CAPEX_API capex_result capex_zero_load_file(capex_zero *z, const char *path, unsigned flags);
#endif /* CAPEX_NO_STATE */
#endif /* CAPEX_NO_DIST */

/* -- distributed sampler (PyTorch DistributedSampler) --
   torch's sharding (rank r takes every num_replicas-th index), padding and
   drop_last; the shuffle is capex_permute_index, not torch.randperm: the same
   seed and epoch give a different order than a PyTorch run. */
typedef struct capex_sampler_desc {
    uint64_t dataset_size;
    int num_replicas;   /* world size                                           */
    int rank;
    int shuffle;        /* 1                                                    */
    uint64_t seed;      /* 0                                                    */
    int drop_last;      /* 0: pad by repeating the start of the permutation     */
    uint32_t init_tag; /* set by capex_sampler_desc_init (see "Descriptors") */
} capex_sampler_desc;

typedef struct capex_sampler {
    capex_sampler_desc d;
    uint64_t epoch;
    uint64_t num_samples;  /* per rank: ceil(N/R), or floor(N/R) with drop_last */
    uint64_t total_size;   /* num_samples * R                                  */
} capex_sampler;

CAPEX_API void capex_sampler_desc_init(capex_sampler_desc *d);
/* On error *s is zeroed: index/indices refuse it, as they refuse a sampler
   whose sizes no longer match its desc (fields edited after init). */
CAPEX_API capex_result capex_sampler_init(capex_sampler *s, const capex_sampler_desc *d);
CAPEX_API void capex_sampler_set_epoch(capex_sampler *s, uint64_t epoch);
/* The k-th index (k < num_samples) of this rank, O(1): no allocation. It
   reads the epoch at each call (torch's iterator fixes it at iter()): a batch
   that crosses an epoch end must set the new epoch before its first index
   past it (running position t: epoch t / num_samples, k = t % num_samples),
   else it repeats the old epoch's first indices and skips the new one's. */
CAPEX_API capex_result capex_sampler_index(const capex_sampler *s, uint64_t k, uint64_t *index);
/* Writes all num_samples indices of this rank into out[0..cap). */
CAPEX_API capex_result capex_sampler_indices(const capex_sampler *s, uint64_t *out, size_t cap);
/* The shuffle: a bijection of [0, n) keyed by `key` (seed + epoch). */
CAPEX_API uint64_t capex_permute_index(uint64_t i, uint64_t n, uint64_t key);

#if defined(CAPEX_MPI) && !defined(CAPEX_NO_DIST)
#  ifdef __cplusplus
}
#  endif
#  include <mpi.h>
#  ifdef __cplusplus
extern "C" {
#  endif
/* Duplicates mc (so capex's traffic never mixes with yours) and sets
   MPI_ERRORS_RETURN on the duplicate. MPI must be initialised. */
CAPEX_API capex_result capex_comm_init_mpi(capex_comm *c, MPI_Comm mc);
#endif

/* ==== LayerNorm/RMSNorm/BatchNorm/SyncBatchNorm: declarations ==== */
/* ---------------------------------------------------------------------------
   Norms (NORM): LayerNorm, RMSNorm, BatchNorm and SyncBatchNorm, forward and
   backward, on the CPU (capex_cuda.h has the GPU kernels, from the same math).

       capex_norm_desc nd;  capex_norm_desc_init(&nd);      // eps 1e-5
       capex_norm_args a;   capex_norm_args_init(&a);       // all f32, all NULL
       a.rows = tokens; a.cols = dim;
       a.x = x; a.x_dtype = CAPEX_BF16;                     // input, any dtype
       a.weight = g; a.bias = b; a.param_dtype = CAPEX_F32; // Apex "Mixed" variant
       a.y = y; a.y_dtype = CAPEX_F32;                      // Mixed: y in param dtype
       a.mean = mean; a.rstd = rstd;                        // [rows] f32, saved
       capex_layer_norm_forward(&nd, &a);
       ... a.dy = dy (y_dtype); a.dx = dx (x_dtype); a.dweight = dg; a.dbias = db;
       capex_layer_norm_backward(&nd, &a);

   LayerNorm (torch.nn.functional.layer_norm over the last dim, Apex
   FusedLayerNorm): mean and biased variance per row by Welford in f32,
   rstd = 1/sqrt(var + eps), y = (x - mean) * rstd * w + b.
   RMSNorm (torch rms_norm, Apex FusedRMSNorm): rstd = 1/sqrt(mean(x^2) + eps)
   (eps inside the sqrt), y = x * rstd * w; no bias (a bias is refused).
   Statistics are always f32 whatever the input dtype; weight/bias (and
   dweight/dbias) are f32 or the input's half type; y and dy may be any dtype
   (Apex's Mixed variants write y in the parameter dtype). weight NULL: no
   affine (w = 1, b = 0). Backward writes dx (x_dtype) and, when not NULL,
   dweight and dbias (param_dtype): written, not accumulated.

   BatchNorm over [N, C, S] (CAPEX_BN_NCS: NCHW with S = H*W) or [N, S, C]
   (CAPEX_BN_NSC: channels last), torch batch_norm semantics: training
   normalises by the batch's biased variance and updates running_mean and
   running_var with `momentum` and the UNBIASED variance (n/(n-1)); eval
   normalises by the running statistics. With a comm of more than one rank it
   is SyncBatchNorm (torch.nn.SyncBatchNorm, Apex convert_syncbn_model): each
   rank's per-channel (mean, biased var, count) is allgathered and merged by
   Chan's formula in float64 in rank order, so ranks may hold unequal batches
   (even empty ones); the mean travels as an f32 pair (hi + lo, 48 bits; one
   f32, as torch, put its rounding into the between-rank term: invstd 1.2e-5
   off at mean 1e3, 1.1e-3 at 1e5, std 1, 2 ranks), 12 C + 8 bytes per rank; backward allreduces (sum_dy, sum_dy_xmu). In eval without
   running statistics torch's SyncBatchNorm does not sync: each rank
   normalises by its own batch (plain batch_norm) and so does this, forward
   and backward, unless desc.sync_eval_batch_stats = 1 (then the global
   batch, as in training, without a running update). As in PyTorch,
   dweight and dbias are this rank's share (the DDP gradient allreduce sums
   them). Parameters and running statistics use param_dtype
   (capex_batch_norm_amp_dtypes: f32 under keep_batchnorm_fp32).

   An empty batch (n = 0) without a collective is torch's: an empty output,
   the running statistics left as they are (*num_batches_tracked still counts
   it), save_mean 0, save_invstd 1/sqrt(eps), total_count 0; its backward
   writes dweight and dbias as 0.

   Aliasing (every norm call, CPU and GPU): no output (y, mean, rstd,
   save_mean, save_invstd, running statistics in training, dx, dweight,
   dbias; the GPU workspace) may share a byte with an input the call reads or
   with another output, partly or wholly; the one exception is forward in
   place, y == x exactly with x_dtype == y_dtype (LayerNorm, RMSNorm,
   BatchNorm), which gives the out-of-place bits: a row (BatchNorm: all of x)
   is read before any of it is written. Backward never runs in place (one
   rule for all: the GPU LayerNorm/RMSNorm backward re-reads dy and x for
   dweight after writing dx). A violation is
   CAPEX_ERR_INVALID_ARG naming both buffers; buffers a call ignores (y in
   backward, dy in forward) do not count.

   Memory-efficient backward (Apex memory_efficient=True): with
   desc.memory_efficient = 1 the LayerNorm/RMSNorm backward reads the
   forward's output y (y_dtype, like dy) instead of x, and rstd (not mean):
   xhat = (y - b) / w (RMSNorm y / w; no affine: y), sum(g * xhat) as
   sum(dy * (y - b)), so x (often the residual stream) need not be kept:
   the forward may even write y over x (in place).
   x and mean are ignored, y and bias count as inputs for the aliasing rule.
   xhat carries y's rounding: |error| <= ulp(y) / (2 |w|), up to 2^-8 |y| / |w|
   for a bf16 y (2^-11 f16, 2^-24 f32): small |w| under a large |b| costs
   digits; keep y in f32 (y_dtype) where that matters. A zero weight loses xhat
   (y == b there): the CPU refuses it (CAPEX_ERR_INVALID_ARG naming the
   column, nothing written); the GPU cannot look without a host sync and
   gives that column a non-finite dx and dweight, which the loss scaler sees
   as an overflow. Apex instead clamps |w| to eps and returns finite but
   wrong gradients there (and for every |w| < eps); capex does not clamp.

   Errors: zero columns/channels, NULL pointers, NaN or negative eps,
   momentum outside [0, 1], bad dtypes, overlapping buffers (above), a
   batch of exactly 1 value per channel taking batch statistics (PyTorch's
   error), a SyncBatchNorm batch empty on every rank give CAPEX_ERR_INVALID_ARG /
   CAPEX_ERR_SIZE_MISMATCH with the reason; nothing is written then.
   Results are identical with and without OpenMP and for any thread count
   (fixed reduction blocks), and a backward output's bits do not depend on
   which other outputs are asked. Sums run in f32 over at most 64 steps, then
   in float64: row sums, and column sums (dweight, dbias, channels-last
   BatchNorm) over any number of rows (<= 1.2e-7 off float64 measured at 2^20
   rows). Thread safety: reentrant; concurrent calls need
   distinct outputs. SyncBatchNorm calls are collective over comm (every rank
   calls, in the same order) and use comm like any collective.
   ------------------------------------------------------------------------- */
typedef struct capex_norm_desc {
    float eps;              /* 1e-5 (torch layer_norm, Apex FusedLayerNorm/RMSNorm); >= 0 */
    int num_threads;        /* OpenMP threads; 0: OpenMP's default. Ignored without OpenMP */
    int memory_efficient;   /* 0; 1: LayerNorm/RMSNorm backward reads y, not x (above). Forward ignores it */
    const capex_allocator *allocator; /* scratch memory; NULL: CAPEX_MALLOC */
    uint32_t init_tag; /* set by capex_norm_desc_init (see "Descriptors") */
} capex_norm_desc;
CAPEX_API void capex_norm_desc_init(capex_norm_desc *d);

/* Tensors of one LayerNorm/RMSNorm call, row-major [rows, cols]. */
typedef struct capex_norm_args {
    int64_t rows, cols;       /* rows >= 0, cols >= 1 */
    capex_dtype x_dtype;      /* x and dx */
    capex_dtype y_dtype;      /* y and dy */
    capex_dtype param_dtype;  /* weight, bias, dweight, dbias */
    const void *x;            /* [rows, cols] input */
    const void *weight;       /* [cols] or NULL (no affine) */
    const void *bias;         /* [cols] or NULL (LayerNorm only) */
    void *y;                  /* forward: [rows, cols] output */
    float *mean;              /* [rows]: forward writes (may be NULL), backward reads (LayerNorm) */
    float *rstd;              /* [rows]: 1/sqrt(var+eps); forward writes (may be NULL), backward reads */
    const void *dy;           /* backward: [rows, cols] gradient of y */
    void *dx;                 /* backward: [rows, cols] gradient of x (may be NULL: not wanted) */
    void *dweight;            /* backward: [cols] or NULL */
    void *dbias;              /* backward: [cols] or NULL (LayerNorm only) */
    uint32_t init_tag; /* set by capex_norm_args_init (see "Descriptors") */
} capex_norm_args;
CAPEX_API void capex_norm_args_init(capex_norm_args *a);

CAPEX_API capex_result capex_layer_norm_forward(const capex_norm_desc *d, const capex_norm_args *a);
CAPEX_API capex_result capex_layer_norm_backward(const capex_norm_desc *d, const capex_norm_args *a);
CAPEX_API capex_result capex_rms_norm_forward(const capex_norm_desc *d, const capex_norm_args *a);
CAPEX_API capex_result capex_rms_norm_backward(const capex_norm_desc *d, const capex_norm_args *a);

typedef enum capex_bn_layout {
    CAPEX_BN_NCS = 0,         /* [N, C, S]: NCHW, NCL, NC (S = 1) */
    CAPEX_BN_NSC = 1          /* [N, S, C]: channels last (NHWC) */
} capex_bn_layout;

typedef struct capex_batch_norm_desc {
    float eps;                /* 1e-5 */
    float momentum;           /* 0.1: running = (1 - m) * running + m * batch; in [0, 1] */
    int cumulative_average;   /* 1: torch momentum=None: m = 1 / num_batches_tracked (needs the counter) */
    int training;             /* 1: batch statistics (and running update); 0: running statistics */
    int num_threads;          /* as capex_norm_desc */
    const capex_allocator *allocator;
    int sync_eval_batch_stats; /* SyncBatchNorm, eval without running statistics: 0 (torch) this
                                  rank's batch, no communication; 1: the global batch, synced */
    uint32_t init_tag; /* set by capex_batch_norm_desc_init (see "Descriptors") */
} capex_batch_norm_desc;
CAPEX_API void capex_batch_norm_desc_init(capex_batch_norm_desc *d);

typedef struct capex_batch_norm_args {
    int64_t n, c, s;          /* this rank's batch (n >= 0), channels >= 1, spatial >= 1 */
    capex_bn_layout layout;
    capex_dtype x_dtype;      /* x and dx */
    capex_dtype y_dtype;      /* y and dy */
    capex_dtype param_dtype;  /* weight, bias, running_*, dweight, dbias */
    const void *x;            /* input */
    const void *weight;       /* [C] or NULL (affine=False) */
    const void *bias;         /* [C] or NULL */
    void *running_mean;       /* [C] or NULL (track_running_stats=False: eval needs them) */
    void *running_var;        /* [C] or NULL (both or neither) */
    int64_t *num_batches_tracked; /* host counter or NULL: +1 per training forward with running stats (torch) */
    void *y;                  /* forward output */
    float *save_mean;         /* [C]: forward writes, backward reads */
    float *save_invstd;       /* [C]: 1/sqrt(var + eps); forward writes, backward reads */
    int64_t total_count;      /* forward writes N*S summed over ranks; backward reads */
    const void *dy;           /* backward input */
    void *dx;                 /* backward output (may be NULL) */
    void *dweight;            /* [C] or NULL: this rank's sum(dy * xhat) */
    void *dbias;              /* [C] or NULL: this rank's sum(dy) */
    uint32_t init_tag; /* set by capex_batch_norm_args_init (see "Descriptors") */
} capex_batch_norm_args;
CAPEX_API void capex_batch_norm_args_init(capex_batch_norm_args *a);

/* The running-statistics factor of one training forward with running stats:
   d->momentum, or with cumulative_average 1 / (*num_batches_tracked + 1)
   (torch momentum=None). Increments *num_batches_tracked when not NULL (as
   torch does in either mode). The forward calls it; other backends too. */
CAPEX_API float capex_batch_norm_momentum(const capex_batch_norm_desc *d, int64_t *num_batches_tracked);

/* comm NULL (or a world of one): BatchNorm. Else SyncBatchNorm over comm
   (host buffers; a device-buffer comm is refused here, see capex_cuda.h). */
CAPEX_API capex_result capex_batch_norm_forward(const capex_batch_norm_desc *d, capex_comm *comm,
                                                capex_batch_norm_args *a);
CAPEX_API capex_result capex_batch_norm_backward(const capex_batch_norm_desc *d, capex_comm *comm,
                                                 const capex_batch_norm_args *a);

/* Opt-level policy: param_dtype = cfg->batchnorm_dtype (f32 under
   keep_batchnorm_fp32, whatever the input); y_dtype = the type the cast
   policy runs batch norm in for this input (capex_amp_op_dtype: f32 under
   O1, else the input's type, so O2 keeps half activations as Apex does).
   Either output may be NULL. */
CAPEX_API capex_result capex_batch_norm_amp_dtypes(const capex_amp_config *cfg, capex_dtype input,
                                                   capex_dtype *param_dtype, capex_dtype *y_dtype);

/* SyncBatchNorm's pieces, for other backends (capex_cuda.h) and tests.
   Per-channel partial statistics are packed per rank as
   [mean_hi[C], mean_lo[C], var[C] (biased), count_hi, count_lo] floats
   (mean = mean_hi + mean_lo in float64, mean_hi = f32(mean); count =
   count_hi * 2^24 + count_lo, exact). merge combines world such blocks in
   rank order by Chan's formula in float64: mean, biased var, total count. */
CAPEX_API size_t capex_syncbn_pack_floats(int64_t channels);
CAPEX_API capex_result capex_syncbn_merge(const float *gathered, int world, int64_t channels, float *mean,
                                          float *var, int64_t *total_count);

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

/* No FMA contraction in the implementation: the GPU kernels compile with
   NVRTC --fmad=false and the golden values (Apex, torch) are unfused, so the
   CPU must round a*b+c twice too. GCC's GNU modes (-std=gnu*, its default)
   fuse wherever the target has FMA: always on aarch64, x86 with -mfma;
   clang fuses within one expression by default. Scoped to this section:
   GCC restores the caller's options (pop_options, at the end), clang its
   command-line mode (DEFAULT). GCC's ISO C modes (-std=c99, c11; not C++)
   do not contract, so there it is left out: GCC inlines no function with
   optimize options into a caller with others (a single-file user's loops).
   An explicit -ffp-contract=fast (or -ffast-math, which also reorders sums)
   fuses anyway; clang's ignores the pragma: the row sums are kept unfused
   there too (CAPEX__NM_OPAQUE). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !(defined(__STRICT_ANSI__) && !defined(__cplusplus))
#define CAPEX__GCC_NO_CONTRACT 1
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(CAPEX_MALLOC) && defined(CAPEX_FREE) && defined(CAPEX_REALLOC)
#elif !defined(CAPEX_MALLOC) && !defined(CAPEX_FREE) && !defined(CAPEX_REALLOC)
#  define CAPEX_MALLOC(sz) malloc(sz)
#  define CAPEX_REALLOC(p, sz) realloc(p, sz)
#  define CAPEX_FREE(p) free(p)
#else
#  error "capex: define all of CAPEX_MALLOC, CAPEX_REALLOC and CAPEX_FREE, or none"
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

/* Records the thread-local message; capex__fail then yields code, so call
   sites read `return capex__fail(CAPEX_ERR_..., "what; how to fix", ...);`.
   A macro so that the compiler sees each failing path return its (nonzero)
   status: with CAPEX_STATIC and -O2, gcc would otherwise warn that outputs
   set only on success "may be used uninitialized" in the caller. code is
   evaluated once, after the message is recorded. */
CAPEX__PRIVATE void capex__fail_msg(const char *fmt, ...) CAPEX__PRINTF(1, 2);
CAPEX__PRIVATE void capex__fail_msg(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(capex__error_message, sizeof capex__error_message, fmt, ap);
    va_end(ap);
}
#define capex__fail(code, ...) (capex__fail_msg(__VA_ARGS__), (capex_result)(code))

/* Every descriptor (a struct with an _init function) is made by that _init,
   which stamps init_tag with the type's own tag; consumers refuse any other
   value. A zeroed or uninitialised struct would otherwise run with zero
   rates, sizes or flags (a zeroed optimizer desc trained at lr 0). */
#define CAPEX__TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
CAPEX__PRIVATE capex_result capex__desc_check(uint32_t tag, uint32_t want, const char *fn, const char *type,
                                             const char *init) {
    if (tag == want) return CAPEX_OK;
    return capex__fail(CAPEX_ERR_INVALID_ARG,
                       "%s: this %s was not made by %s (zeroed or uninitialised); call %s on it first, then "
                       "change the fields you need",
                       fn, type, init, init);
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

/* An allocator is used only when it has both functions: the entry points that
   take one refuse a half-set one, and nothing frees a block with the other
   family's function where one does not (e.g. a norm desc's scratch). */
CAPEX__PRIVATE int capex__allocator_ok(const capex_allocator *a) { return !a || (a->alloc && a->free); }
CAPEX__PRIVATE void *capex__alloc(const capex_allocator *a, size_t size) {
    if (size == 0) size = 1;
    if (a && a->alloc && a->free) return a->alloc(size, a->user_data);
    return CAPEX_MALLOC(size);
}
CAPEX__PRIVATE void capex__free(const capex_allocator *a, void *p) {
    if (!p) return;
    if (a && a->alloc && a->free) a->free(p, a->user_data);
    else CAPEX_FREE(p);
}

/* Grows *arr (its first `used` elements of es bytes kept) to hold at least
   `need`, doubling from 16; the allocator has no realloc, so allocate, copy,
   free. On failure *arr is unchanged and the message starts with `what`. */
CAPEX__PRIVATE capex_result capex__grow(const capex_allocator *a, void **arr, size_t *cap, size_t used, size_t need,
                                        size_t es, const char *what) {
    size_t nc;
    void *q;
    if (need <= *cap) return CAPEX_OK;
    for (nc = *cap ? *cap : 16; nc < need; nc *= 2)
        if (nc > SIZE_MAX / 2) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: too many entries", what);
    if (nc > SIZE_MAX / es) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: too many entries", what);
    if (!(q = capex__alloc(a, nc * es)))
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory growing a table to %zu entries", what, nc);
    if (*arr && used) memcpy(q, *arr, used * es);
    capex__free(a, *arr);
    *arr = q;
    *cap = nc;
    return CAPEX_OK;
}

/* Byte sizes from user counts: *out = a * b (or a + b); nonzero when the
   result wraps size_t (the caller refuses: a wrapped size means a short
   buffer and a heap overflow later). *out is left alone on overflow. */
CAPEX__PRIVATE int capex__size_mul(size_t a, size_t b, size_t *out) {
    if (b && a > SIZE_MAX / b) return 1;
    *out = a * b;
    return 0;
}
CAPEX__PRIVATE int capex__size_add(size_t a, size_t b, size_t *out) {
    if (a > SIZE_MAX - b) return 1;
    *out = a + b;
    return 0;
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

/* fp16 / bf16 <-> f32: the one definition of the conversions, integer-only
   (RNE; overflow to inf; NaN stays NaN, quietened, sign and payload kept).
   Expanded here as C (capex_f32_to_f16 & co., the CPU kernels) and, as
   text, into the CUDA kernel prelude (capex_cuda.h) and the optimizer math
   source: NVRTC has no cuda_fp16.h. Q: qualifiers; F2U/U2F: bit casts. */
#define CAPEX__OPTIM_MATH_HALF(Q, F2U, U2F)                                                  \
    Q float capex__h16_load(unsigned int h) {                                                \
        unsigned int sign = (h & 0x8000U) << 16, e = (h >> 10) & 0x1fU, m = h & 0x3ffU;      \
        unsigned int sub = F2U((float)m * 5.9604644775390625e-8f);                           \
        unsigned int out = e == 0x1fU ? (0x7f800000U | (m << 13))                            \
                         : e == 0U ? sub : (((e + 112U) << 23) | (m << 13));                 \
        return U2F(sign | out);                                                              \
    }                                                                                        \
    Q unsigned int capex__h16_store(float f) {                                               \
        unsigned int x = F2U(f), sign = (x >> 16) & 0x8000U, ax = x & 0x7fffffffU;          \
        unsigned int e = ax >> 23;                                                           \
        unsigned int normal = (ax - (112U << 23) + 0xfffU + ((ax >> 13) & 1U)) >> 13;        \
        unsigned int m = (ax & 0x7fffffU) | 0x800000U;                                       \
        unsigned int shift = e >= 126U ? 1U : (126U - e > 25U ? 25U : 126U - e);             \
        unsigned int r = m >> shift, rem = m & ((1U << shift) - 1U), half = 1U << (shift - 1U); \
        unsigned int sub = r + ((rem > half) | ((rem == half) & (r & 1U)));                  \
        unsigned int nan = 0x7e00U | ((ax >> 13) & 0x3ffU);                                  \
        unsigned int out = ax > 0x7f800000U ? nan : ax >= 0x477ff000U ? 0x7c00U              \
                         : ax < 0x38800000U ? sub : normal;                                  \
        return sign | out;                                                                   \
    }                                                                                        \
    Q float capex__b16_load(unsigned int h) { return U2F(h << 16); }                         \
    Q unsigned int capex__b16_store(float f) {                                               \
        unsigned int x = F2U(f);                                                             \
        unsigned int rounded = (x + 0x7fffU + ((x >> 16) & 1U)) >> 16;                       \
        return (x & 0x7fffffffU) > 0x7f800000U ? ((x >> 16) | 0x40U) : rounded;              \
    }

CAPEX__OPTIM_MATH_HALF(static inline, capex__f32_bits, capex__bits_f32)

/* Vectorisable half codecs for bulk loops, bit-identical to the scalar
   conversions (test_half checks every code and the rounding boundaries). The
   paths are computed unconditionally and merged with bit masks: GCC will not
   if-convert a float op it might have to trap on, nor some mixes of
   comparison booleans, so branchy versions stay scalar (2-3x slower). The
   f32 -> f16 subnormal path lets the FPU round, so it assumes the default
   round-to-nearest mode; capex_f32_to_f16 itself is integer-only. */
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

CAPEX_API uint16_t capex_f32_to_f16(float f) { return (uint16_t)capex__h16_store(f); }
CAPEX_API float capex_f16_to_f32(uint16_t h) { return capex__f16_to_f32_v(h); }
CAPEX_API uint16_t capex_f32_to_bf16(float f) { return (uint16_t)capex__b16_store(f); }
CAPEX_API float capex_bf16_to_f32(uint16_t h) { return capex__bits_f32((uint32_t)h << 16); }

/* Bulk fp16 codecs. Portable loops (vectorised selects, above), and on x86-64
   with GCC/clang the F16C instructions (vcvtph2ps/vcvtps2ph, 8 per op): 2-3x
   fewer instructions per element, the same bits (test_half compares both
   paths with the integer reference on every f16 code and 70M f32 inputs).
   Used when the compiler targets F16C (-mf16c, -march=native) or, otherwise,
   when cpuid says so at run time (per-function target attributes, so the
   header still builds for any x86-64). -DCAPEX_NO_SIMD: portable only.
   The hardware quiets signalling NaNs on f16 -> f32 and capex keeps them, so
   groups of 8 with a NaN take the portable path; vcvtps2ph with
   round-to-nearest-even is capex's rounding, overflow and NaN payload. */
CAPEX__PRIVATE void capex__f16_load_port(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__f16_to_f32_v(src[i]);
}
CAPEX__PRIVATE void capex__f16_store_port(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__f32_to_f16_v(src[i]);
}
#if !defined(CAPEX_NO_SIMD) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CAPEX__F16C 1
#include <immintrin.h>
#include <cpuid.h>
#define CAPEX__F16C_FN __attribute__((target("avx,f16c")))
CAPEX__F16C_FN CAPEX__PRIVATE void capex__f16_load_f16c(const uint16_t *src, float *dst, size_t n) {
    const __m128i mag = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, mag), inf))) /* a NaN: keep its bits */
            capex__f16_load_port(src + i, dst + i, 8);
        else
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    capex__f16_load_port(src + i, dst + i, n - i);
}
CAPEX__F16C_FN CAPEX__PRIVATE void capex__f16_store_f16c(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    capex__f16_store_port(src + i, dst + i, n - i);
}
/* CPU features, each probed once into a state word (0 not probed, 1 no, 2
   yes; tests store 1 to force the portable path, 0 to probe again). A feature
   the compiler targets (-mavx, -march=native) needs no probe. Racing threads
   store the same value (atomics keep that well-defined). */
CAPEX__PRIVATE int capex__cpu_probe(int *state, int compiled_in, int (*detect)(void)) {
    int st = __atomic_load_n(state, __ATOMIC_RELAXED);
    if (compiled_in) return st != 1;
    if (!st) {
        st = detect() ? 2 : 1;
        __atomic_store_n(state, st, __ATOMIC_RELAXED);
    }
    return st == 2;
}
/* cpuid(1).ecx bit 29: F16C; "avx" also says the OS saves the ymm registers */
CAPEX__PRIVATE int capex__detect_f16c(void) {
    unsigned int a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u) && __builtin_cpu_supports("avx");
}
CAPEX__PRIVATE int capex__detect_avx(void) { return __builtin_cpu_supports("avx") != 0; }
CAPEX__PRIVATE int capex__detect_fma(void) { return __builtin_cpu_supports("fma") != 0; }
#if defined(__F16C__) && defined(__AVX__)
#define CAPEX__F16C_COMPILED 1
#else
#define CAPEX__F16C_COMPILED 0
#endif
#if defined(__AVX__)
#define CAPEX__AVX_COMPILED 1
#else
#define CAPEX__AVX_COMPILED 0
#endif
#if defined(__FMA__) && defined(__AVX__)
#define CAPEX__FMA_COMPILED 1
#else
#define CAPEX__FMA_COMPILED 0
#endif
/* 1: use F16C (the bulk fp16 codecs) */
static int capex__f16c_state;
CAPEX__PRIVATE int capex__f16c_ok(void) { return capex__cpu_probe(&capex__f16c_state, CAPEX__F16C_COMPILED, capex__detect_f16c); }
#define CAPEX__F16C_ON() capex__f16c_ok()
/* 1: use AVX (the norms' reductions) */
#define CAPEX__AVX_FN __attribute__((target("avx")))
static int capex__avx_state;
CAPEX__PRIVATE int capex__avx_ok(void) { return capex__cpu_probe(&capex__avx_state, CAPEX__AVX_COMPILED, capex__detect_avx); }
#define CAPEX__AVX_ON() capex__avx_ok()
/* 1: AVX with FMA (the sum of squares); off whenever AVX is */
static int capex__fma_state;
CAPEX__PRIVATE int capex__fma_ok(void) { return capex__cpu_probe(&capex__fma_state, CAPEX__FMA_COMPILED, capex__detect_fma); }
#define CAPEX__FMA_ON() (CAPEX__AVX_ON() && capex__fma_ok())
#else
#define CAPEX__F16C_ON() 0
#define CAPEX__AVX_ON() 0
#define CAPEX__FMA_ON() 0
#endif
/* fp16 -> f32 / f32 -> fp16 for n elements, the fastest path this CPU has */
static inline void capex__f16_load_n(const uint16_t *src, float *dst, size_t n) {
#ifdef CAPEX__F16C
    if (CAPEX__F16C_ON()) { capex__f16_load_f16c(src, dst, n); return; }
#endif
    capex__f16_load_port(src, dst, n);
}
static inline void capex__f16_store_n(const float *src, uint16_t *dst, size_t n) {
#ifdef CAPEX__F16C
    if (CAPEX__F16C_ON()) { capex__f16_store_f16c(src, dst, n); return; }
#endif
    capex__f16_store_port(src, dst, n);
}

CAPEX_API void capex_f32_to_f16_array(const float *src, uint16_t *dst, size_t n) { capex__f16_store_n(src, dst, n); }
CAPEX_API void capex_f16_to_f32_array(const uint16_t *src, float *dst, size_t n) { capex__f16_load_n(src, dst, n); }
CAPEX_API void capex_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = (uint16_t)capex__b16_store(src[i]);
}
CAPEX_API void capex_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = capex__bits_f32((uint32_t)src[i] << 16);
}

/* ==== opt levels: implementation ==== */
/* ---- opt levels ---------------------------------------------------------- */

#define CAPEX__FLT_MIN_NORMAL 1.17549435082228750797e-38 /* FLT_MIN, without <float.h> */
#define CAPEX__FLT_MAX 3.40282346638528859812e+38

CAPEX_API const char *capex_opt_level_name(capex_opt_level level) {
    switch (level) {
    case CAPEX_O0: return "O0";
    case CAPEX_O1: return "O1";
    case CAPEX_O2: return "O2";
    case CAPEX_O3: return "O3";
    }
    return NULL;
}

#define CAPEX__TAG_AMP_OVERRIDES CAPEX__TAG('A', 'M', 'P', 'O')
CAPEX_API void capex_amp_overrides_init(capex_amp_overrides *ov) {
    if (!ov) return;
    memset(ov, 0, sizeof *ov);
    ov->init_tag = CAPEX__TAG_AMP_OVERRIDES;
    ov->enabled = CAPEX_TRI_NONE;
    ov->cast_model_type = CAPEX_CAST_MODEL_NONE;
    ov->patch_torch_functions = CAPEX_TRI_NONE;
    ov->keep_batchnorm_fp32 = CAPEX_TRI_NONE;
    ov->master_weights = CAPEX_TRI_NONE;
    ov->loss_scale_mode = CAPEX_LOSS_SCALE_NONE;
    ov->loss_scale = 1.0;
}

/* Apex frontend.py O0..O3.__call__, with capex's bf16 loss-scale default. */
CAPEX__PRIVATE void capex__amp_defaults(capex_opt_level level, capex_dtype half, capex_amp_config *c) {
    static const struct { unsigned char cast, patch, bn, master, dynamic; } t[4] = {
        {CAPEX_CAST_MODEL_FLOAT32, 0, CAPEX_TRI_NONE, CAPEX_TRI_FALSE, 0}, /* O0 */
        {CAPEX_CAST_MODEL_NONE, 1, CAPEX_TRI_NONE, CAPEX_TRI_NONE, 1},     /* O1 */
        {CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_TRUE, CAPEX_TRI_TRUE, 1},     /* O2 */
        {CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_FALSE, CAPEX_TRI_FALSE, 0},   /* O3 */
    };
    int dynamic = t[level].dynamic && half != CAPEX_BF16; /* bf16: fp32's exponent range */
    memset(c, 0, sizeof *c);
    c->enabled = 1;
    c->opt_level = level;
    c->half_type = half;
    c->cast_model_type = (capex_cast_model)t[level].cast;
    c->patch_torch_functions = t[level].patch;
    c->keep_batchnorm_fp32 = (capex_tri)t[level].bn;
    c->master_weights = (capex_tri)t[level].master;
    c->loss_scale_mode = dynamic ? CAPEX_LOSS_SCALE_DYNAMIC : CAPEX_LOSS_SCALE_STATIC;
    c->loss_scale = dynamic ? 0.0 : 1.0;
}

/* What Apex's _initialize does with the properties: cast the model if
   cast_model_type is set, keeping batchnorm fp32 if keep_batchnorm_fp32 is
   truthy; master weights if master_weights is truthy. */
CAPEX__PRIVATE void capex__amp_derive(capex_amp_config *c) {
    int half = c->enabled && c->cast_model_type == CAPEX_CAST_MODEL_HALF;
    c->model_dtype = half ? c->half_type : CAPEX_F32;
    c->batchnorm_dtype = half && c->keep_batchnorm_fp32 == CAPEX_TRI_TRUE ? CAPEX_F32 : c->model_dtype;
    c->use_master_weights = c->enabled && c->master_weights == CAPEX_TRI_TRUE;
}

CAPEX__PRIVATE int capex__tri_ok(capex_tri t) { return (int)t >= 0 && (int)t <= 2; }

CAPEX__PRIVATE capex_result capex__check_loss_scale(double v, const char *who) {
    if (!(v == v)) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: loss_scale is NaN; give a positive number or \"dynamic\"", who);
    if (v <= 0.0) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: loss_scale %g must be > 0 (the loss is multiplied by it)", who, v);
    if (v > CAPEX__FLT_MAX)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: loss_scale %g overflows float32 (max 3.4e38); the scaled loss would be inf", who, v);
    if (v < CAPEX__FLT_MIN_NORMAL)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: loss_scale %g is below float32's normal range (1.2e-38); scaled values would flush to 0", who, v);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_amp_resolve(capex_opt_level level, capex_dtype half_type,
                                         const capex_amp_overrides *ov, capex_amp_config *out) {
    static const char *who = "capex_amp_resolve";
    capex_amp_config c;
    const char *lv;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: out is NULL; pass a capex_amp_config to fill", who);
    if ((int)level < 0 || (int)level > 3)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: opt_level %d is not one of CAPEX_O0..CAPEX_O3", who, (int)level);
    if (half_type != CAPEX_F16 && half_type != CAPEX_BF16)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: half_type %d must be CAPEX_F16 or CAPEX_BF16", who, (int)half_type);
    if (ov) {
        capex_result tr = capex__desc_check(ov->init_tag, CAPEX__TAG_AMP_OVERRIDES, who, "capex_amp_overrides",
                                            "capex_amp_overrides_init");
        if (tr != CAPEX_OK) return tr;
        if (!capex__tri_ok(ov->enabled) || !capex__tri_ok(ov->patch_torch_functions) ||
            !capex__tri_ok(ov->keep_batchnorm_fp32) || !capex__tri_ok(ov->master_weights))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: an override (enabled %d, patch_torch_functions %d, keep_batchnorm_fp32 %d, "
                               "master_weights %d) is not a capex_tri; start from capex_amp_overrides_init()", who,
                               (int)ov->enabled, (int)ov->patch_torch_functions, (int)ov->keep_batchnorm_fp32, (int)ov->master_weights);
        if ((int)ov->cast_model_type < 0 || (int)ov->cast_model_type > 2)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cast_model_type override %d is not a capex_cast_model", who, (int)ov->cast_model_type);
        if ((int)ov->loss_scale_mode < 0 || (int)ov->loss_scale_mode > 2)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: loss_scale_mode override %d is not a capex_loss_scale_mode", who, (int)ov->loss_scale_mode);
        if (ov->loss_scale_mode == CAPEX_LOSS_SCALE_STATIC) {
            capex_result r = capex__check_loss_scale(ov->loss_scale, who);
            if (r != CAPEX_OK) return r;
        }
    }
    if (ov && ov->enabled == CAPEX_TRI_FALSE) {
        /* Apex returns before applying the level or checking overrides and
           leaves Properties() as constructed: inert, loss scale 1.0. */
        memset(&c, 0, sizeof c);
        c.enabled = 0;
        c.opt_level = level;
        c.half_type = half_type;
        c.cast_model_type = CAPEX_CAST_MODEL_NONE;
        c.patch_torch_functions = 0;
        c.keep_batchnorm_fp32 = CAPEX_TRI_NONE;
        c.master_weights = CAPEX_TRI_NONE;
        c.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
        c.loss_scale = 1.0;
        capex__amp_derive(&c);
        *out = c;
        return CAPEX_OK;
    }
    capex__amp_defaults(level, half_type, &c);
    lv = capex_opt_level_name(level);
    if (ov) {
        /* The rules of Apex's Properties.__setattr__, in its order. */
        if (level == CAPEX_O1 && ov->cast_model_type == CAPEX_CAST_MODEL_HALF)
            return capex__fail(CAPEX_ERR_CONFIG,
                               "%s: override rejected (rule: cast_model_type must be None or float32 under O1): O1 casts "
                               "inputs around each op and keeps the model's weights in float32; to cast the model to "
                               "half use opt_level O2 or O3", who);
        if (level != CAPEX_O1 && ov->patch_torch_functions == CAPEX_TRI_TRUE)
            return capex__fail(CAPEX_ERR_CONFIG,
                               "%s: override rejected (rule: patch_torch_functions=True only with O1): per-op casting is "
                               "what O1 is; select opt_level O1 instead of %s with patch_torch_functions", who, lv);
        if (level == CAPEX_O1 && ov->keep_batchnorm_fp32 != CAPEX_TRI_NONE)
            return capex__fail(CAPEX_ERR_CONFIG,
                               "%s: override rejected (rule: keep_batchnorm_fp32 must be None under O1): O1 already runs "
                               "batchnorm in float32 through the cast policy and does not cast the model; leave "
                               "keep_batchnorm_fp32 unset (CAPEX_TRI_NONE) or use O2/O3", who);
        if (level == CAPEX_O1 && ov->master_weights != CAPEX_TRI_NONE)
            return capex__fail(CAPEX_ERR_CONFIG,
                               "%s: override rejected (rule: master_weights must be None under O1): with O1 the model's "
                               "weights are already float32, so a float32 master copy means nothing; leave "
                               "master_weights unset (CAPEX_TRI_NONE) or use O2", who);
        if (ov->cast_model_type != CAPEX_CAST_MODEL_NONE) c.cast_model_type = ov->cast_model_type;
        if (ov->patch_torch_functions != CAPEX_TRI_NONE) c.patch_torch_functions = ov->patch_torch_functions == CAPEX_TRI_TRUE;
        if (ov->keep_batchnorm_fp32 != CAPEX_TRI_NONE) c.keep_batchnorm_fp32 = ov->keep_batchnorm_fp32;
        if (ov->master_weights != CAPEX_TRI_NONE) c.master_weights = ov->master_weights;
        if (ov->loss_scale_mode != CAPEX_LOSS_SCALE_NONE) {
            c.loss_scale_mode = ov->loss_scale_mode;
            c.loss_scale = ov->loss_scale_mode == CAPEX_LOSS_SCALE_STATIC ? ov->loss_scale : 0.0;
        }
    }
    capex__amp_derive(&c);
    *out = c;
    return CAPEX_OK;
}

/* -- locale-independent decimal numbers ----------------------------------- */

CAPEX__PRIVATE int capex__is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

/* Trims ASCII blanks: [*b, *e). */
CAPEX__PRIVATE void capex__trim(const char *s, const char **b, const char **e) {
    const char *end = s + strlen(s);
    while (*s && capex__is_blank(*s)) s++;
    while (end > s && capex__is_blank(end[-1])) end--;
    *b = s;
    *e = end;
}

CAPEX__PRIVATE int capex__span_is(const char *b, const char *e, const char *word) {
    size_t n = strlen(word);
    return (size_t)(e - b) == n && memcmp(b, word, n) == 0;
}

/* [+-]digits[.digits][(e|E)[+-]digits] over exactly [b, e); 0 if malformed.
   Value = mant * 10^exp10 with up to 19 significant digits kept (more are
   dropped: truncation well below float32's precision). When mant < 2^53 and
   |exp10| <= 22 both factors are exact doubles, so one IEEE multiply or
   divide rounds correctly (Clinger's fast path); otherwise long double. */
CAPEX__PRIVATE int capex__parse_decimal(const char *b, const char *e, double *out) {
    static const double p10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    uint64_t mant = 0;
    long exp10 = 0, ex = 0;
    int neg = 0, ndig = 0, sig = 0, exneg = 0;
    double v;
    if (b < e && (*b == '+' || *b == '-')) neg = *b++ == '-';
    for (; b < e && *b >= '0' && *b <= '9'; b++, ndig++) {
        if (sig < 19) { if (mant || *b != '0') { mant = mant * 10 + (uint64_t)(*b - '0'); sig += mant != 0; } }
        else exp10++;
    }
    if (b < e && *b == '.') {
        for (b++; b < e && *b >= '0' && *b <= '9'; b++, ndig++) {
            if (sig < 19) { if (mant || *b != '0') { mant = mant * 10 + (uint64_t)(*b - '0'); sig += mant != 0; } exp10--; }
        }
    }
    if (ndig == 0) return 0;
    if (b < e && (*b == 'e' || *b == 'E')) {
        int nd = 0;
        b++;
        if (b < e && (*b == '+' || *b == '-')) exneg = *b++ == '-';
        for (; b < e && *b >= '0' && *b <= '9'; b++, nd++) if (ex < 100000) ex = ex * 10 + (*b - '0');
        if (nd == 0) return 0;
    }
    if (b != e) return 0;
    exp10 += exneg ? -ex : ex;
    if (mant == 0) v = 0.0;
    else if (mant < ((uint64_t)1 << 53) && exp10 >= -22 && exp10 <= 22)
        v = exp10 >= 0 ? (double)mant * p10[exp10] : (double)mant / p10[-exp10];
    else if (exp10 > 400) v = HUGE_VAL;
    else if (exp10 < -400) v = 0.0;
    else {
        long double r = (long double)mant, p = 10.0L, acc = 1.0L;
        long k = exp10 < 0 ? -exp10 : exp10;
        for (; k; k >>= 1, p *= p) if (k & 1) acc *= p;
        v = (double)(exp10 < 0 ? r / acc : r * acc);
    }
    *out = neg ? -v : v;
    return 1;
}

/* Python's repr(float) for positive finite v: the shortest digits that read
   back as v, fixed notation when -4 <= exponent < 16, else d.ddde+XX. The
   digits come from "%.*e", read past whatever radix character the locale
   uses, so the output is the same in every locale. */
CAPEX__PRIVATE void capex__format_pyfloat(double v, char *out, size_t cap) {
    char tmp[64], dig[24], canon[48];
    int nd = 0, e10 = 0, p, i, pos = 0;
    for (p = 1; p <= 17; p++) {
        const char *q = tmp;
        int eneg = 0;
        double back;
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        nd = 0;
        e10 = 0;
        for (; *q && *q != 'e' && *q != 'E'; q++)
            if (*q >= '0' && *q <= '9' && nd < 20) dig[nd++] = *q;
        if (*q) q++;
        if (*q == '-' || *q == '+') eneg = *q++ == '-';
        for (; *q >= '0' && *q <= '9'; q++) e10 = e10 * 10 + (*q - '0');
        if (eneg) e10 = -e10;
        dig[nd] = '\0';
        snprintf(canon, sizeof canon, "%se%d", dig, e10 - (nd - 1));
        if (capex__parse_decimal(canon, canon + strlen(canon), &back) && back == v) break;
    }
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = '\0';
    if (e10 >= -4 && e10 < 16) {
        if (e10 < 0) {
            pos += snprintf(tmp + pos, sizeof tmp - (size_t)pos, "0.");
            for (i = 0; i < -e10 - 1; i++) tmp[pos++] = '0';
            for (i = 0; i < nd; i++) tmp[pos++] = dig[i];
        } else {
            for (i = 0; i <= e10; i++) tmp[pos++] = i < nd ? dig[i] : '0';
            tmp[pos++] = '.';
            if (nd > e10 + 1) {
                for (i = e10 + 1; i < nd; i++) tmp[pos++] = dig[i];
            } else {
                tmp[pos++] = '0';
            }
        }
        tmp[pos] = '\0';
    } else {
        tmp[pos++] = dig[0];
        if (nd > 1) { tmp[pos++] = '.'; for (i = 1; i < nd; i++) tmp[pos++] = dig[i]; }
        snprintf(tmp + pos, sizeof tmp - (size_t)pos, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
    }
    snprintf(out, cap, "%s", tmp);
}

/* -- parsers --------------------------------------------------------------- */

CAPEX_API capex_result capex_opt_level_parse(const char *s, capex_opt_level *out) {
    const char *b, *e;
    if (!s || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_opt_level_parse: s or out is NULL");
    capex__trim(s, &b, &e);
    if (e - b == 2 && b[0] == 'O' && b[1] >= '0' && b[1] <= '3') {
        *out = (capex_opt_level)(b[1] - '0');
        return CAPEX_OK;
    }
    return capex__fail(CAPEX_ERR_INVALID_ARG, "Unexpected optimization level '%s'. Options are 'O0', 'O1', 'O2', 'O3' "
                       "(the letter O, then a digit)", s);
}

CAPEX_API capex_result capex_loss_scale_parse(const char *s, capex_loss_scale_mode *mode, double *value) {
    const char *b, *e;
    double v;
    capex_result r;
    if (!s || !mode || !value) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_loss_scale_parse: s, mode or value is NULL");
    capex__trim(s, &b, &e);
    if (capex__span_is(b, e, "dynamic")) {
        *mode = CAPEX_LOSS_SCALE_DYNAMIC;
        *value = 0.0;
        return CAPEX_OK;
    }
    if (!capex__parse_decimal(b, e, &v))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "loss_scale '%s' is neither \"dynamic\" nor a decimal number such as \"128.0\"", s);
    r = capex__check_loss_scale(v, "capex_loss_scale_parse");
    if (r != CAPEX_OK) return r;
    *mode = CAPEX_LOSS_SCALE_STATIC;
    *value = v;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_tri_parse(const char *s, capex_tri *out) {
    const char *b, *e;
    if (!s || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_tri_parse: s or out is NULL");
    capex__trim(s, &b, &e);
    if (capex__span_is(b, e, "True") || capex__span_is(b, e, "true") || capex__span_is(b, e, "1")) *out = CAPEX_TRI_TRUE;
    else if (capex__span_is(b, e, "False") || capex__span_is(b, e, "false") || capex__span_is(b, e, "0")) *out = CAPEX_TRI_FALSE;
    else if (capex__span_is(b, e, "None") || capex__span_is(b, e, "none")) *out = CAPEX_TRI_NONE;
    else return capex__fail(CAPEX_ERR_INVALID_ARG, "'%s' is not True/true/1, False/false/0 or None/none", s);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cast_model_parse(const char *s, capex_cast_model *out) {
    const char *b, *e;
    if (!s || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cast_model_parse: s or out is NULL");
    capex__trim(s, &b, &e);
    if (capex__span_is(b, e, "None") || capex__span_is(b, e, "none")) *out = CAPEX_CAST_MODEL_NONE;
    else if (capex__span_is(b, e, "float32") || capex__span_is(b, e, "fp32") || capex__span_is(b, e, "torch.float32"))
        *out = CAPEX_CAST_MODEL_FLOAT32;
    else if (capex__span_is(b, e, "half")) *out = CAPEX_CAST_MODEL_HALF;
    else return capex__fail(CAPEX_ERR_INVALID_ARG, "cast_model_type '%s': use None, float32 or half (fp16 vs bf16 is the "
                            "separate half type, see capex_half_type_parse)", s);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_half_type_parse(const char *s, capex_dtype *out) {
    const char *b, *e;
    if (!s || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_half_type_parse: s or out is NULL");
    capex__trim(s, &b, &e);
    if (capex__span_is(b, e, "fp16") || capex__span_is(b, e, "float16") || capex__span_is(b, e, "torch.float16") ||
        capex__span_is(b, e, "half"))
        *out = CAPEX_F16;
    else if (capex__span_is(b, e, "bf16") || capex__span_is(b, e, "bfloat16") || capex__span_is(b, e, "torch.bfloat16"))
        *out = CAPEX_BF16;
    else return capex__fail(CAPEX_ERR_INVALID_ARG, "half type '%s': use fp16 (float16) or bf16 (bfloat16)", s);
    return CAPEX_OK;
}

/* -- report ---------------------------------------------------------------- */

typedef struct capex__strbuf { char *buf; size_t cap, len; } capex__strbuf;

/* Appends s; counts the length even past cap so callers learn the size. */
CAPEX__PRIVATE void capex__sb_puts(capex__strbuf *sb, const char *s) {
    for (; *s; s++, sb->len++)
        if (sb->len + 1 < sb->cap) sb->buf[sb->len] = *s;
}

CAPEX__PRIVATE const char *capex__tri_str(capex_tri t) { return t == CAPEX_TRI_TRUE ? "True" : t == CAPEX_TRI_FALSE ? "False" : "None"; }

CAPEX__PRIVATE void capex__sb_row(capex__strbuf *sb, const char *name, const char *value) {
    size_t n = strlen(name);
    capex__sb_puts(sb, name);
    for (; n < 22; n++) capex__sb_puts(sb, " "); /* Apex: "{:22} : {}" */
    capex__sb_puts(sb, " : ");
    capex__sb_puts(sb, value);
    capex__sb_puts(sb, "\n");
}

CAPEX__PRIVATE void capex__sb_table(capex__strbuf *sb, const capex_amp_config *c) {
    const char *half = c->half_type == CAPEX_BF16 ? "torch.bfloat16" : "torch.float16";
    char num[64];
    capex__sb_row(sb, "enabled", c->enabled ? "True" : "False");
    capex__sb_row(sb, "opt_level", capex_opt_level_name(c->opt_level));
    capex__sb_row(sb, "cast_model_type", c->cast_model_type == CAPEX_CAST_MODEL_HALF ? half
                                         : c->cast_model_type == CAPEX_CAST_MODEL_FLOAT32 ? "torch.float32" : "None");
    capex__sb_row(sb, "patch_torch_functions", c->patch_torch_functions ? "True" : "False");
    capex__sb_row(sb, "keep_batchnorm_fp32", capex__tri_str(c->keep_batchnorm_fp32));
    capex__sb_row(sb, "master_weights", capex__tri_str(c->master_weights));
    if (c->loss_scale_mode == CAPEX_LOSS_SCALE_DYNAMIC) snprintf(num, sizeof num, "dynamic");
    else capex__format_pyfloat(c->loss_scale, num, sizeof num);
    capex__sb_row(sb, "loss_scale", num);
    capex__sb_row(sb, "half_type", half);
}

/* A config in range must also be one capex_amp_resolve can return: edited
   afterwards, its derived fields would be stale (weights wired one way,
   reported another) or an Apex rule bypassed (Apex checks its rules on every
   later assignment to amp's properties too). Editing the loss scale alone
   stays allowed: nothing is derived from it. */
CAPEX__PRIVATE capex_result capex__check_config_state(const capex_amp_config *c, const char *who) {
    static const char *again = "edit the overrides and call capex_amp_resolve again instead of editing its output";
    capex_amp_config d = *c;
    const char *rule = NULL;
    if ((c->enabled != 0 && c->enabled != 1) || (c->patch_torch_functions != 0 && c->patch_torch_functions != 1))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cfg.enabled %d / patch_torch_functions %d must be 0 or 1; fill it "
                           "with capex_amp_resolve", who, c->enabled, c->patch_torch_functions);
    if (!c->enabled) {
        if (c->cast_model_type != CAPEX_CAST_MODEL_NONE || c->patch_torch_functions ||
            c->keep_batchnorm_fp32 != CAPEX_TRI_NONE || c->master_weights != CAPEX_TRI_NONE ||
            c->loss_scale_mode != CAPEX_LOSS_SCALE_STATIC || c->loss_scale != 1.0)
            return capex__fail(CAPEX_ERR_CONFIG, "%s: cfg is disabled (enabled=0) but not inert (Apex's disabled amp casts "
                               "nothing and scales by 1.0); %s", who, again);
    } else if (c->opt_level == CAPEX_O1 && c->cast_model_type == CAPEX_CAST_MODEL_HALF) {
        rule = "cast_model_type must be None or float32 under O1";
    } else if (c->opt_level != CAPEX_O1 && c->patch_torch_functions) {
        rule = "patch_torch_functions=True only with O1";
    } else if (c->opt_level == CAPEX_O1 && c->keep_batchnorm_fp32 != CAPEX_TRI_NONE) {
        rule = "keep_batchnorm_fp32 must be None under O1";
    } else if (c->opt_level == CAPEX_O1 && c->master_weights != CAPEX_TRI_NONE) {
        rule = "master_weights must be None under O1";
    }
    if (rule) return capex__fail(CAPEX_ERR_CONFIG, "%s: cfg breaks an Apex rule (rule: %s); %s", who, rule, again);
    if (c->loss_scale_mode == CAPEX_LOSS_SCALE_STATIC) {
        capex_result r = capex__check_loss_scale(c->loss_scale, who);
        if (r != CAPEX_OK) return r;
    }
    capex__amp_derive(&d);
    if (d.model_dtype != c->model_dtype || d.batchnorm_dtype != c->batchnorm_dtype ||
        d.use_master_weights != c->use_master_weights)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cfg's model_dtype %d, batchnorm_dtype %d, use_master_weights %d do not "
                           "follow from its properties (want %d, %d, %d): it was edited after capex_amp_resolve; %s",
                           who, (int)c->model_dtype, (int)c->batchnorm_dtype, c->use_master_weights, (int)d.model_dtype,
                           (int)d.batchnorm_dtype, d.use_master_weights, again);
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__check_config(const capex_amp_config *c, const char *who) {
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cfg is NULL; pass a config from capex_amp_resolve", who);
    if ((int)c->opt_level < 0 || (int)c->opt_level > 3 || (c->half_type != CAPEX_F16 && c->half_type != CAPEX_BF16) ||
        (int)c->cast_model_type < 0 || (int)c->cast_model_type > 2 || !capex__tri_ok(c->keep_batchnorm_fp32) ||
        !capex__tri_ok(c->master_weights) ||
        (c->loss_scale_mode != CAPEX_LOSS_SCALE_DYNAMIC && c->loss_scale_mode != CAPEX_LOSS_SCALE_STATIC))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cfg has out-of-range fields; fill it with capex_amp_resolve", who);
    return capex__check_config_state(c, who);
}

CAPEX_API capex_result capex_amp_report(const capex_amp_config *cfg, char *buf, size_t cap, size_t *needed) {
    capex__strbuf sb;
    capex_amp_config d;
    char line[160], title[96];
    const char *hn;
    capex_result r = capex__check_config(cfg, "capex_amp_report");
    if (r != CAPEX_OK) return r;
    if (!buf && cap) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_report: buf is NULL but cap is %lu", (unsigned long)cap);
    sb.buf = buf;
    sb.cap = cap;
    sb.len = 0;
    hn = cfg->half_type == CAPEX_BF16 ? "BF16" : "FP16";
    if (!cfg->enabled) {
        snprintf(line, sizeof line, "Amp disabled (enabled=False): opt_level %s is not applied; no casts, float32 "
                 "weights, loss scale 1.0.\n", capex_opt_level_name(cfg->opt_level));
        capex__sb_puts(&sb, line);
    } else {
        /* Apex's brief strings; O2/O3 name the half type actually used. */
        if (cfg->opt_level == CAPEX_O0) snprintf(title, sizeof title, "Pure FP32 training.");
        else if (cfg->opt_level == CAPEX_O1)
            snprintf(title, sizeof title, "Insert automatic casts around Pytorch functions and Tensor methods.");
        else if (cfg->opt_level == CAPEX_O2)
            snprintf(title, sizeof title, "%s training with FP32 batchnorm and FP32 master weights.", hn);
        else snprintf(title, sizeof title, "Pure %s training.", hn);
        snprintf(line, sizeof line, "Selected optimization level %s:  %s\n", capex_opt_level_name(cfg->opt_level), title);
        capex__sb_puts(&sb, line);
        capex__sb_puts(&sb, "Defaults for this optimization level are:\n");
        capex__amp_defaults(cfg->opt_level, cfg->half_type, &d);
        capex__sb_table(&sb, &d);
        if (cfg->half_type == CAPEX_BF16 && (cfg->opt_level == CAPEX_O1 || cfg->opt_level == CAPEX_O2))
            capex__sb_puts(&sb, "(bf16: loss_scale defaults to 1.0 instead of dynamic; bf16 has float32's exponent range)\n");
        capex__sb_puts(&sb, "Processing user overrides (additional kwargs that are not None)...\n");
    }
    capex__sb_puts(&sb, "After processing overrides, optimization options are:\n");
    capex__sb_table(&sb, cfg);
    if (cap) sb.buf[sb.len < cap ? sb.len : cap - 1] = '\0';
    if (needed) *needed = sb.len;
    if (sb.len >= cap)
        return capex__fail(CAPEX_ERR_LIMIT, "capex_amp_report: the report needs %lu bytes plus the NUL, buffer has %lu",
                           (unsigned long)sb.len, (unsigned long)cap);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_amp_log_report(const capex_amp_config *cfg) {
    char text[2048];
    char *p, *nl;
    capex_result r = capex_amp_report(cfg, text, sizeof text, NULL);
    if (r != CAPEX_OK) return r; /* at most ~1.6 KB: LIMIT here would be a capex bug */
    for (p = text; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) { capex_log(CAPEX_LOG_INFO, "%s", p); break; }
        *nl = '\0';
        capex_log(CAPEX_LOG_INFO, "%s", p);
    }
    return CAPEX_OK;
}

/* -- cast policy ----------------------------------------------------------- */

static const char *const capex__op_class_names[CAPEX_OP_COUNT] = {
    "matmul", "linear", "conv", "conv_transpose", "bmm", "addmm", "baddbmm", "prelu",
    "softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm", "norm", "loss",
    "exp", "log", "pow", "sum", "mean", "prod", "cumsum", "reduction", "reciprocal", "rsqrt",
    "unary_fp32", "interpolate",
    "add", "sub", "mul", "div", "cat", "stack", "index_copy", "addcmul", "addcdiv", "compare", "pairwise",
    "other"};

/* Function names from Apex's lists/{functional,torch,tensor}_overrides.py
   (plus PyTorch autocast's rms_norm, index_copy, log1p), mapped to classes. */
static const struct { const char *name; unsigned char op; } capex__op_names[] = {
    {"matmul", CAPEX_OP_MATMUL}, {"mm", CAPEX_OP_MATMUL}, {"mv", CAPEX_OP_MATMUL}, {"__matmul__", CAPEX_OP_MATMUL},
    {"linear", CAPEX_OP_LINEAR},
    {"conv1d", CAPEX_OP_CONV}, {"conv2d", CAPEX_OP_CONV}, {"conv3d", CAPEX_OP_CONV}, {"conv_tbc", CAPEX_OP_CONV},
    {"conv_transpose1d", CAPEX_OP_CONV_TRANSPOSE}, {"conv_transpose2d", CAPEX_OP_CONV_TRANSPOSE},
    {"conv_transpose3d", CAPEX_OP_CONV_TRANSPOSE},
    {"bmm", CAPEX_OP_BMM},
    {"addmm", CAPEX_OP_ADDMM}, {"addmv", CAPEX_OP_ADDMM}, {"addr", CAPEX_OP_ADDMM},
    {"baddbmm", CAPEX_OP_BADDBMM}, {"addbmm", CAPEX_OP_BADDBMM},
    {"prelu", CAPEX_OP_PRELU},
    {"softmax", CAPEX_OP_SOFTMAX}, {"softmin", CAPEX_OP_SOFTMAX},
    {"log_softmax", CAPEX_OP_LOG_SOFTMAX},
    {"layer_norm", CAPEX_OP_LAYER_NORM}, {"rms_norm", CAPEX_OP_RMS_NORM},
    {"group_norm", CAPEX_OP_GROUP_NORM}, {"local_response_norm", CAPEX_OP_GROUP_NORM},
    {"batch_norm", CAPEX_OP_BATCH_NORM}, {"instance_norm", CAPEX_OP_BATCH_NORM},
    {"norm", CAPEX_OP_NORM}, {"normalize", CAPEX_OP_NORM}, {"cosine_similarity", CAPEX_OP_NORM},
    {"dist", CAPEX_OP_NORM}, {"renorm", CAPEX_OP_NORM},
    {"cross_entropy", CAPEX_OP_LOSS}, {"nll_loss", CAPEX_OP_LOSS}, {"poisson_nll_loss", CAPEX_OP_LOSS},
    {"mse_loss", CAPEX_OP_LOSS}, {"l1_loss", CAPEX_OP_LOSS}, {"smooth_l1_loss", CAPEX_OP_LOSS},
    {"kl_div", CAPEX_OP_LOSS}, {"binary_cross_entropy_with_logits", CAPEX_OP_LOSS},
    {"binary_cross_entropy", CAPEX_OP_LOSS}, /* Apex bans it under O1; computing it in fp32 is the safe reading */
    {"cosine_embedding_loss", CAPEX_OP_LOSS}, {"hinge_embedding_loss", CAPEX_OP_LOSS},
    {"margin_ranking_loss", CAPEX_OP_LOSS}, {"multilabel_margin_loss", CAPEX_OP_LOSS},
    {"multilabel_soft_margin_loss", CAPEX_OP_LOSS}, {"multi_margin_loss", CAPEX_OP_LOSS},
    {"soft_margin_loss", CAPEX_OP_LOSS}, {"triplet_margin_loss", CAPEX_OP_LOSS},
    {"exp", CAPEX_OP_EXP}, {"expm1", CAPEX_OP_EXP},
    {"log", CAPEX_OP_LOG}, {"log10", CAPEX_OP_LOG}, {"log2", CAPEX_OP_LOG}, {"log1p", CAPEX_OP_LOG},
    {"pow", CAPEX_OP_POW}, {"__pow__", CAPEX_OP_POW}, {"__rpow__", CAPEX_OP_POW}, {"__ipow__", CAPEX_OP_POW},
    {"sum", CAPEX_OP_SUM}, {"mean", CAPEX_OP_MEAN},
    {"prod", CAPEX_OP_PROD}, {"cumprod", CAPEX_OP_PROD}, {"cumsum", CAPEX_OP_CUMSUM},
    {"std", CAPEX_OP_REDUCTION}, {"var", CAPEX_OP_REDUCTION},
    {"reciprocal", CAPEX_OP_RECIPROCAL}, {"rsqrt", CAPEX_OP_RSQRT},
    {"acos", CAPEX_OP_UNARY_FP32}, {"asin", CAPEX_OP_UNARY_FP32}, {"cosh", CAPEX_OP_UNARY_FP32},
    {"sinh", CAPEX_OP_UNARY_FP32}, {"tan", CAPEX_OP_UNARY_FP32}, {"erfinv", CAPEX_OP_UNARY_FP32},
    {"softplus", CAPEX_OP_UNARY_FP32},
    {"interpolate", CAPEX_OP_INTERPOLATE}, {"upsample", CAPEX_OP_INTERPOLATE},
    {"add", CAPEX_OP_ADD}, {"__add__", CAPEX_OP_ADD}, {"__iadd__", CAPEX_OP_ADD}, {"__radd__", CAPEX_OP_ADD},
    {"sub", CAPEX_OP_SUB}, {"__sub__", CAPEX_OP_SUB}, {"__isub__", CAPEX_OP_SUB}, {"__rsub__", CAPEX_OP_SUB},
    {"mul", CAPEX_OP_MUL}, {"__mul__", CAPEX_OP_MUL}, {"__imul__", CAPEX_OP_MUL}, {"__rmul__", CAPEX_OP_MUL},
    {"div", CAPEX_OP_DIV}, {"__div__", CAPEX_OP_DIV}, {"__idiv__", CAPEX_OP_DIV}, {"__rdiv__", CAPEX_OP_DIV},
    {"__truediv__", CAPEX_OP_DIV}, {"__itruediv__", CAPEX_OP_DIV}, {"__rtruediv__", CAPEX_OP_DIV},
    {"cat", CAPEX_OP_CAT}, {"concat", CAPEX_OP_CAT}, {"stack", CAPEX_OP_STACK},
    {"index_copy", CAPEX_OP_INDEX_COPY}, {"addcmul", CAPEX_OP_ADDCMUL}, {"addcdiv", CAPEX_OP_ADDCDIV},
    {"eq", CAPEX_OP_COMPARE}, {"ne", CAPEX_OP_COMPARE}, {"lt", CAPEX_OP_COMPARE}, {"le", CAPEX_OP_COMPARE},
    {"gt", CAPEX_OP_COMPARE}, {"ge", CAPEX_OP_COMPARE}, {"equal", CAPEX_OP_COMPARE},
    {"__eq__", CAPEX_OP_COMPARE}, {"__ne__", CAPEX_OP_COMPARE}, {"__lt__", CAPEX_OP_COMPARE},
    {"__le__", CAPEX_OP_COMPARE}, {"__gt__", CAPEX_OP_COMPARE}, {"__ge__", CAPEX_OP_COMPARE},
    {"dot", CAPEX_OP_PAIRWISE}, {"cross", CAPEX_OP_PAIRWISE}, {"atan2", CAPEX_OP_PAIRWISE},
    {"bilinear", CAPEX_OP_PAIRWISE},
    /* common ops Apex leaves alone: they run as their inputs are */
    {"relu", CAPEX_OP_OTHER}, {"gelu", CAPEX_OP_OTHER}, {"silu", CAPEX_OP_OTHER}, {"tanh", CAPEX_OP_OTHER},
    {"sigmoid", CAPEX_OP_OTHER}, {"dropout", CAPEX_OP_OTHER}, {"embedding", CAPEX_OP_OTHER},
    {"other", CAPEX_OP_OTHER}};

CAPEX_API const char *capex_op_class_name(capex_op_class op) {
    return (int)op >= 0 && (int)op < CAPEX_OP_COUNT ? capex__op_class_names[op] : NULL;
}

CAPEX_API const char *capex_cast_policy_name(capex_cast_policy p) {
    switch (p) {
    case CAPEX_CAST_NONE: return "none";
    case CAPEX_CAST_HALF: return "half";
    case CAPEX_CAST_FP32: return "fp32";
    case CAPEX_CAST_PROMOTE: return "promote";
    }
    return NULL;
}

CAPEX_API capex_result capex_op_class_from_name(const char *name, capex_op_class *out) {
    size_t i;
    if (!name || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_op_class_from_name: name or out is NULL");
    for (i = 0; i < CAPEX_OP_COUNT; i++) /* the class names themselves ("loss", "compare", ...) */
        if (strcmp(name, capex__op_class_names[i]) == 0) {
            *out = (capex_op_class)i;
            return CAPEX_OK;
        }
    for (i = 0; i < sizeof capex__op_names / sizeof capex__op_names[0]; i++)
        if (strcmp(name, capex__op_names[i].name) == 0) {
            *out = (capex_op_class)capex__op_names[i].op;
            return CAPEX_OK;
        }
    return capex__fail(CAPEX_ERR_NOT_FOUND, "op '%s' is not in capex's cast lists; Apex leaves such functions alone "
                       "(run them as their inputs are), or map it to a capex_op_class yourself", name);
}

CAPEX_API capex_result capex_amp_cast_op(const capex_amp_config *cfg, capex_op_class op, capex_cast_policy *out) {
    capex_result r = capex__check_config(cfg, "capex_amp_cast_op");
    if (r != CAPEX_OK) return r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_cast_op: out is NULL");
    if ((int)op < 0 || (int)op >= CAPEX_OP_COUNT)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_cast_op: op %d is not a capex_op_class", (int)op);
    if (cfg->enabled && cfg->patch_torch_functions) {
        /* The enum is laid out in Apex's list order: FP16, FP32, CASTS, rest. */
        *out = op <= CAPEX_OP_PRELU ? CAPEX_CAST_HALF
             : op <= CAPEX_OP_INTERPOLATE ? CAPEX_CAST_FP32
             : op <= CAPEX_OP_PAIRWISE ? CAPEX_CAST_PROMOTE : CAPEX_CAST_NONE;
    } else {
        /* Nothing is patched. keep_batchnorm_fp32 (O2) keeps batchnorm's
           parameters fp32 (cfg->batchnorm_dtype), not its activations: cuDNN's
           batch norm takes a half x with fp32 parameters and returns a half y. */
        *out = CAPEX_CAST_NONE;
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_amp_cast_op_name(const capex_amp_config *cfg, const char *name, capex_cast_policy *out) {
    capex_op_class op;
    capex_result r = capex__check_config(cfg, "capex_amp_cast_op_name");
    if (r != CAPEX_OK) return r;
    if (!name || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_cast_op_name: name or out is NULL");
    r = capex_op_class_from_name(name, &op);
    if (r != CAPEX_OK) {
        *out = CAPEX_CAST_NONE;
        return r;
    }
    return capex_amp_cast_op(cfg, op, out);
}

CAPEX_API capex_result capex_amp_promote(capex_dtype a, capex_dtype b, capex_dtype *out) {
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_promote: out is NULL");
    if (capex_dtype_size(a) == 0 || capex_dtype_size(b) == 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_promote: dtype %d or %d is not a capex_dtype", (int)a, (int)b);
    *out = a == b ? a : CAPEX_F32;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_amp_op_dtype(const capex_amp_config *cfg, capex_op_class op, capex_dtype input, capex_dtype *out) {
    capex_cast_policy p = CAPEX_CAST_NONE;
    capex_result r;
    if (capex_dtype_size(input) == 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_op_dtype: input dtype %d is not a capex_dtype", (int)input);
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_amp_op_dtype: out is NULL");
    r = capex_amp_cast_op(cfg, op, &p);
    if (r != CAPEX_OK) return r;
    *out = p == CAPEX_CAST_HALF ? cfg->half_type : p == CAPEX_CAST_FP32 ? CAPEX_F32 : input;
    return CAPEX_OK;
}

/* ==== loss scaler: implementation ==== */
/* ---- loss scaler -------------------------------------------------------- */

#define CAPEX__SCALER_MAGIC 0x53434c52u /* "SCLR": catches use before init */
enum { CAPEX__OPT_READY = 0, CAPEX__OPT_UNSCALED = 1, CAPEX__OPT_STEPPED = 2 };

#define CAPEX__TAG_SCALER_DESC CAPEX__TAG('S', 'C', 'L', 'D')
CAPEX_API void capex_scaler_desc_init(capex_scaler_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_SCALER_DESC;
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

CAPEX_API capex_result capex_scaler_desc_from_amp(const capex_amp_config *cfg, capex_scaler_desc *d) {
    capex_scaler_desc t;
    capex_result r;
    if (!cfg || !d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_desc_from_amp: NULL argument");
    if ((r = capex__check_config(cfg, "capex_scaler_desc_from_amp")) != CAPEX_OK) return r;
    capex_scaler_desc_init(&t);
    if (cfg->loss_scale_mode == CAPEX_LOSS_SCALE_DYNAMIC) {
        t.dynamic = 1;
    } else { /* STATIC: capex__check_config allows nothing else */
        t.dynamic = 0;
        t.init_scale = (float)cfg->loss_scale;
    }
    if ((r = capex_scaler_desc_check(&t)) != CAPEX_OK) return r;
    *d = t;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_scaler_desc_check(const capex_scaler_desc *d) {
    capex_result r;
    if (!d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_desc is NULL: pass one set by capex_scaler_desc_init");
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_SCALER_DESC, "capex_scaler_init", "capex_scaler_desc",
                               "capex_scaler_desc_init")) != CAPEX_OK)
        return r;
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

/* scale, unscale and step write their output on every path (NaN, NaN, 0 on
   an error), so an unchecked error never leaves it uninitialised nor steps. */
CAPEX_API capex_result capex_scaler_scale(capex_scaler *sc, float *scale) {
    capex_result r;
    int i;
    if (scale) *scale = (float)NAN;
    r = capex__scaler_ok(sc, "capex_scaler_scale");
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
    capex_result r;
    if (inv_scale) *inv_scale = (float)NAN;
    r = capex__scaler_opt_ok(sc, opt, "capex_scaler_unscale");
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
    capex_result r;
    if (do_step) *do_step = 0;
    r = capex__scaler_opt_ok(sc, opt, "capex_scaler_step");
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

/* steps stops at CAPEX_STEP_MAX instead of wrapping (2^53 iterations). */
CAPEX__PRIVATE capex_result capex__scaler_count_ok(const capex_scaler *sc, const char *fn) {
    if (sc->steps >= CAPEX_STEP_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "%s: the scaler has counted CAPEX_STEP_MAX (2^53) iterations; nothing was "
                           "changed (restore a state with a smaller count)", fn);
    return CAPEX_OK;
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
    if ((r = capex__scaler_count_ok(sc, "capex_scaler_update")) != CAPEX_OK) return r;
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
    if ((r = capex__scaler_count_ok(sc, "capex_scaler_update_to")) != CAPEX_OK) return r;
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

CAPEX_API float capex_scaler_get_scale(const capex_scaler *sc) {
    if (capex__scaler_ok(sc, "capex_scaler_get_scale") != CAPEX_OK) return (float)NAN;
    return sc->scale;
}

CAPEX_API float capex_scaler_get_inv_scale(const capex_scaler *sc) {
    if (capex__scaler_ok(sc, "capex_scaler_get_inv_scale") != CAPEX_OK) return (float)NAN;
    return capex__scaler_inv(sc->scale);
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
    if (st->steps > CAPEX_STEP_MAX) /* skipped_steps <= steps: bounded too */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s.steps = %lld exceeds CAPEX_STEP_MAX (2^53): a corrupt or forged "
                           "state (the next update would overflow the count)", w, (long long)st->steps);
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

/* ==== state files: implementation ==== */
#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE: no state files, scaler save/load */
/* ---- state files -------------------------------------------------------- */
/* Layout and rules: see the "State files" manual in the declarations. The
   parser is schema-directed (top object -> entry object -> array of integers,
   never deeper), so nesting depth is bounded by construction and it needs no
   recursion; every number is checked for overflow before use. */
#include <limits.h>
#include <errno.h>
#if !defined(CAPEX_NO_STDIO) && (defined(__unix__) || defined(__APPLE__))
#  include <unistd.h>
#  include <fcntl.h>
#  include <dirent.h>
#  include <signal.h>
#  include <time.h>
#  include <sys/stat.h>
#  define CAPEX__STATE_POSIX 1
/* The stale-temp sweep needs kill(), which a strict -std=c99 build hides
   when the user's file included a system header before capex (glibc then
   fixed its feature set before capex could ask for POSIX): saves skip the
   sweep there. */
#  if defined(__GLIBC__) ? defined(__USE_POSIX) : (defined(__APPLE__) || defined(_POSIX_C_SOURCE) || \
      defined(_POSIX_SOURCE) || defined(_XOPEN_SOURCE) || defined(_DEFAULT_SOURCE) || defined(_GNU_SOURCE) || \
      defined(_BSD_SOURCE))
#    define CAPEX__STATE_SWEEP 1
#  endif
#endif
/* 64-bit file offsets: long is 64-bit on LP64 Unix; Windows needs _fseeki64. */
#ifdef _WIN32
typedef long long capex__off;
#  define CAPEX__FSEEK(f, o, w) _fseeki64((f), (o), (w))
#  define CAPEX__FTELL(f) _ftelli64(f)
#  define CAPEX__OFF_MAX LLONG_MAX
#else
typedef long capex__off;
#  define CAPEX__FSEEK(f, o, w) fseek((f), (o), (w))
#  define CAPEX__FTELL(f) ftell(f)
#  define CAPEX__OFF_MAX LONG_MAX
#endif

static const char *const capex__st_dtype_names[CAPEX_STATE_DTYPE_COUNT] = {
    "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
static const unsigned char capex__st_dtype_sizes[CAPEX_STATE_DTYPE_COUNT] = {4, 2, 2, 8, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};

CAPEX_API const char *capex_state_dtype_name(capex_state_dtype t) {
    return (int)t >= 0 && (int)t < CAPEX_STATE_DTYPE_COUNT ? capex__st_dtype_names[(int)t] : NULL;
}
CAPEX_API size_t capex_state_dtype_size(capex_state_dtype t) {
    return (int)t >= 0 && (int)t < CAPEX_STATE_DTYPE_COUNT ? capex__st_dtype_sizes[(int)t] : 0;
}

/* CRC-32, reflected polynomial 0xEDB88320 (zlib's crc32()). */
static const uint32_t capex__crc32_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du
};

CAPEX_API uint32_t capex_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (n--) crc = capex__crc32_table[(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

/* Slicing-by-8 (Intel's method): 8 table lookups per 8 bytes, several times the
   byte loop's speed, for checksumming GBs of optimizer state. The tables live in
   the writer/reader object (8 KiB), derived from the constant one. */
typedef struct capex__crc8 { uint32_t t[8][256]; } capex__crc8;
CAPEX__PRIVATE void capex__crc8_init(capex__crc8 *c) {
    int i, k;
    for (i = 0; i < 256; i++) c->t[0][i] = capex__crc32_table[i];
    for (k = 1; k < 8; k++)
        for (i = 0; i < 256; i++) c->t[k][i] = (c->t[k - 1][i] >> 8) ^ c->t[0][c->t[k - 1][i] & 0xffu];
}
CAPEX__PRIVATE uint32_t capex__crc8_update(const capex__crc8 *c, uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = c->t[7][lo & 0xffu] ^ c->t[6][(lo >> 8) & 0xffu] ^ c->t[5][(lo >> 16) & 0xffu] ^ c->t[4][lo >> 24] ^
              c->t[3][hi & 0xffu] ^ c->t[2][(hi >> 8) & 0xffu] ^ c->t[1][(hi >> 16) & 0xffu] ^ c->t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = c->t[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

CAPEX__PRIVATE int capex__host_is_le(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}
/* Reverses the bytes of each es-byte element (host <-> little-endian on a
   big-endian host). dst == src is allowed. */
CAPEX__PRIVATE void capex__st_swap_copy(void *dst, const void *src, size_t nbytes, size_t es) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t i, k;
    unsigned char tmp[8];
    if (es <= 1) {
        if (d != s) memmove(d, s, nbytes);
        return;
    }
    for (i = 0; i + es <= nbytes; i += es) {
        for (k = 0; k < es; k++) tmp[k] = s[i + es - 1 - k];
        memcpy(d + i, tmp, es);
    }
}

CAPEX__PRIVATE uint64_t capex__st_le64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF.
   Returns the length of the valid sequence at p (1..4), 0 if invalid. */
CAPEX__PRIVATE size_t capex__st_utf8_seq(const unsigned char *p, size_t avail) {
    unsigned char c = p[0];
    size_t len, i;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else return 0;
    if (avail < len) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return len;
}
CAPEX__PRIVATE int capex__st_utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;
    while (i < n) {
        size_t k = capex__st_utf8_seq(p + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static const char *const capex__st_reserved[4] = {"format", "capex_format_version", "capex_version", "capex_crc32"};

CAPEX__PRIVATE char *capex__st_strdup(const capex_allocator *a, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = (char *)capex__alloc(a, n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- state writer ---- */

typedef struct capex__st_wtensor {
    char *name;
    capex_state_dtype dtype;
    int ndim;
    int64_t shape[CAPEX_STATE_MAX_NDIM];
    uint64_t nbytes, offset;
    const void *data;          /* NULL: the value is in scalar[] (copied) */
    unsigned char scalar[8];
} capex__st_wtensor;
typedef struct capex__st_kv { char *key, *value; } capex__st_kv;

struct capex_state_writer {
    capex_allocator alloc;
    capex__st_wtensor *t;
    size_t nt, capt;
    capex__st_kv *m;
    size_t nm, capm;
    unsigned long serial;
    int swap; /* host is big-endian: byte-swap elements (tests force it on) */
    capex__crc8 crc;
};

CAPEX_API capex_result capex_state_writer_create(const capex_allocator *alloc, capex_state_writer **out) {
    capex_state_writer *w;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_writer_create: out is NULL");
    *out = NULL;
    if (!capex__allocator_ok(alloc)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_writer_create: allocator needs both alloc and free");
    w = (capex_state_writer *)capex__alloc(alloc, sizeof *w);
    if (!w) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_writer_create: out of memory");
    memset(w, 0, sizeof *w);
    if (alloc) w->alloc = *alloc;
    w->swap = !capex__host_is_le();
    capex__crc8_init(&w->crc);
    *out = w;
    return CAPEX_OK;
}

CAPEX_API void capex_state_writer_destroy(capex_state_writer *w) {
    size_t i;
    capex_allocator a;
    if (!w) return;
    a = w->alloc;
    for (i = 0; i < w->nt; i++) capex__free(&a, w->t[i].name);
    for (i = 0; i < w->nm; i++) {
        capex__free(&a, w->m[i].key);
        capex__free(&a, w->m[i].value);
    }
    capex__free(&a, w->t);
    capex__free(&a, w->m);
    capex__free(&a, w);
}

CAPEX__PRIVATE capex_result capex__st_add(capex_state_writer *w, const char *name, capex_state_dtype dtype, int ndim,
                                          const int64_t *shape, const void *data, const void *scalar) {
    capex__st_wtensor *e;
    uint64_t numel = 1, es;
    int i;
    capex_result r;
    if (!w || !name) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor: writer or name is NULL");
    if (!capex_state_dtype_size(dtype))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor('%s'): invalid dtype %d; use a capex_state_dtype", name, (int)dtype);
    if (!capex__st_utf8_valid(name) || strcmp(name, "__metadata__") == 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor: name must be valid UTF-8 and not \"__metadata__\"");
    if (ndim < 0 || ndim > CAPEX_STATE_MAX_NDIM || (ndim > 0 && !shape))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor('%s'): ndim %d must be 0..%d with a shape array",
                           name, ndim, CAPEX_STATE_MAX_NDIM);
    es = capex_state_dtype_size(dtype);
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor('%s'): shape[%d] = %lld is negative", name, i,
                               (long long)shape[i]);
        if (shape[i] != 0 && numel > UINT64_MAX / (uint64_t)shape[i]) numel = UINT64_MAX;
        else numel *= (uint64_t)shape[i];
    }
    if (numel > (uint64_t)INT64_MAX / es || numel * es > (uint64_t)SIZE_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "capex_state_add_tensor('%s'): size overflows 64-bit byte counts", name);
    if (!data && !scalar && numel * es > 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_tensor('%s'): data is NULL", name);
    r = capex__grow(&w->alloc, (void **)&w->t, &w->capt, w->nt, w->nt + 1, sizeof *w->t, "state");
    if (r) return r;
    e = &w->t[w->nt];
    memset(e, 0, sizeof *e);
    e->name = capex__st_strdup(&w->alloc, name);
    if (!e->name) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_add_tensor: out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = numel * es;
    e->data = data;
    if (scalar) memcpy(e->scalar, scalar, (size_t)es);
    w->nt++;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_state_add_tensor(capex_state_writer *w, const char *name, capex_state_dtype dtype, int ndim,
                                              const int64_t *shape, const void *data) {
    return capex__st_add(w, name, dtype, ndim, shape, data, NULL);
}
CAPEX_API capex_result capex_state_add_f64(capex_state_writer *w, const char *name, double v) {
    return capex__st_add(w, name, CAPEX_STATE_F64, 0, NULL, NULL, &v);
}
CAPEX_API capex_result capex_state_add_f32(capex_state_writer *w, const char *name, float v) {
    return capex__st_add(w, name, CAPEX_STATE_F32, 0, NULL, NULL, &v);
}
CAPEX_API capex_result capex_state_add_i64(capex_state_writer *w, const char *name, int64_t v) {
    return capex__st_add(w, name, CAPEX_STATE_I64, 0, NULL, NULL, &v);
}

CAPEX_API capex_result capex_state_add_meta(capex_state_writer *w, const char *key, const char *value) {
    size_t i;
    capex_result r;
    capex__st_kv *kv;
    if (!w || !key || !value) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_meta: writer, key or value is NULL");
    if (!capex__st_utf8_valid(key) || !capex__st_utf8_valid(value))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_meta: key and value must be valid UTF-8");
    for (i = 0; i < 4; i++)
        if (strcmp(key, capex__st_reserved[i]) == 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_meta: key \"%s\" is reserved; capex writes it itself", key);
    for (i = 0; i < w->nm; i++)
        if (strcmp(key, w->m[i].key) == 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_add_meta: key \"%s\" was already added", key);
    r = capex__grow(&w->alloc, (void **)&w->m, &w->capm, w->nm, w->nm + 1, sizeof *w->m, "state");
    if (r) return r;
    kv = &w->m[w->nm];
    kv->key = capex__st_strdup(&w->alloc, key);
    kv->value = capex__st_strdup(&w->alloc, value);
    if (!kv->key || !kv->value) {
        capex__free(&w->alloc, kv->key);
        capex__free(&w->alloc, kv->value);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_add_meta: out of memory");
    }
    w->nm++;
    return CAPEX_OK;
}

/* Header text builder: counts only when p is NULL (first pass sizes it). */
typedef struct capex__st_sb { char *p; size_t n; } capex__st_sb;
CAPEX__PRIVATE void capex__st_put(capex__st_sb *b, const char *s, size_t n) {
    if (b->p) memcpy(b->p + b->n, s, n);
    b->n += n;
}
CAPEX__PRIVATE void capex__st_puts(capex__st_sb *b, const char *s) { capex__st_put(b, s, strlen(s)); }
CAPEX__PRIVATE void capex__st_putu(capex__st_sb *b, uint64_t v) {
    char tmp[24];
    int i = 24;
    do { tmp[--i] = (char)('0' + (int)(v % 10)); v /= 10; } while (v);
    capex__st_put(b, tmp + i, (size_t)(24 - i));
}
/* JSON string: escape '"', '\\' and control characters; UTF-8 passes through. */
CAPEX__PRIVATE void capex__st_putstr(capex__st_sb *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    capex__st_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2];
            e[0] = '\\';
            e[1] = (char)c;
            capex__st_put(b, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', 0, 0};
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            capex__st_put(b, e, 6);
        } else capex__st_put(b, s, 1);
    }
    capex__st_put(b, "\"", 1);
}

static int capex__st_cmp_kv(const void *a, const void *b) {
    return strcmp(((const capex__st_kv *)a)->key, ((const capex__st_kv *)b)->key);
}
static int capex__st_cmp_wname(const void *a, const void *b) {
    return strcmp((*(const capex__st_wtensor *const *)a)->name, (*(const capex__st_wtensor *const *)b)->name);
}
/* Data order: widest elements first, then by name (the safetensors library's
   order), so every tensor starts aligned to its element size. */
static int capex__st_cmp_wdata(const void *a, const void *b) {
    const capex__st_wtensor *x = *(const capex__st_wtensor *const *)a, *y = *(const capex__st_wtensor *const *)b;
    size_t sx = capex_state_dtype_size(x->dtype), sy = capex_state_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Builds the header (into b, or counting) in the given tensor order. *crc_at
   gets the offset of the checksum digits inside the header text. */
CAPEX__PRIVATE void capex__st_header(const capex_state_writer *w, capex__st_wtensor **order, capex__st_sb *b, size_t *crc_at) {
    size_t i;
    int d;
    capex__st_puts(b, "{\"__metadata__\":{\"format\":\"capex-state\",\"capex_format_version\":\"");
    capex__st_putu(b, CAPEX_STATE_FORMAT_VERSION);
    capex__st_puts(b, "\",\"capex_version\":\"" CAPEX_VERSION_STRING "\",\"capex_crc32\":\"");
    *crc_at = b->n;
    capex__st_puts(b, "00000000\"");
    for (i = 0; i < w->nm; i++) {
        capex__st_put(b, ",", 1);
        capex__st_putstr(b, w->m[i].key);
        capex__st_put(b, ":", 1);
        capex__st_putstr(b, w->m[i].value);
    }
    capex__st_put(b, "}", 1);
    for (i = 0; i < w->nt; i++) {
        const capex__st_wtensor *e = order[i];
        capex__st_put(b, ",", 1);
        capex__st_putstr(b, e->name);
        capex__st_puts(b, ":{\"dtype\":\"");
        capex__st_puts(b, capex_state_dtype_name(e->dtype));
        capex__st_puts(b, "\",\"shape\":[");
        for (d = 0; d < e->ndim; d++) {
            if (d) capex__st_put(b, ",", 1);
            capex__st_putu(b, (uint64_t)e->shape[d]);
        }
        capex__st_puts(b, "],\"data_offsets\":[");
        capex__st_putu(b, e->offset);
        capex__st_put(b, ",", 1);
        capex__st_putu(b, e->offset + e->nbytes);
        capex__st_puts(b, "]}");
    }
    capex__st_put(b, "}", 1);
    /* pad with spaces so the data starts 8-byte aligned in the file */
    while ((8 + b->n) % 8) capex__st_put(b, " ", 1);
}

/* A sink is a memory buffer or a FILE; it checksums what passes through. */
typedef struct capex__st_sink {
    unsigned char *mem;
    FILE *f;
    uint64_t pos;
    uint32_t crc;
    const capex__crc8 *tab;
    int failed;
} capex__st_sink;
CAPEX__PRIVATE void capex__st_emit(capex__st_sink *s, const void *p, size_t n) {
    if (s->failed || n == 0) return;
    s->crc = capex__crc8_update(s->tab, s->crc, p, n);
    if (s->mem) memcpy(s->mem + s->pos, p, n);
#ifndef CAPEX_NO_STDIO
    else if (s->f && fwrite(p, 1, n, s->f) != n) s->failed = 1;
#endif
    s->pos += n;
}

/* Plans a write: checks names, sorts metadata and tensors, assigns offsets,
   builds the header. On success *hdr (caller frees) holds it. */
CAPEX__PRIVATE capex_result capex__st_plan(capex_state_writer *w, capex__st_wtensor ***order_out, char **hdr, size_t *hlen,
                                           size_t *crc_at, uint64_t *total) {
    capex__st_wtensor **order;
    capex__st_sb b;
    uint64_t off = 0;
    size_t i;
    *order_out = NULL;
    *hdr = NULL;
    order = (capex__st_wtensor **)capex__alloc(&w->alloc, (w->nt ? w->nt : 1) * sizeof *order);
    if (!order) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_write: out of memory");
    for (i = 0; i < w->nt; i++) order[i] = &w->t[i];
    if (w->nt > 1) {
        qsort(order, w->nt, sizeof *order, capex__st_cmp_wname);
        for (i = 1; i < w->nt; i++)
            if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
                capex_result r = capex__fail(CAPEX_ERR_INVALID_ARG,
                                             "capex_state_write: tensor name \"%s\" was added twice; names must be unique", order[i]->name);
                capex__free(&w->alloc, order);
                return r;
            }
        qsort(order, w->nt, sizeof *order, capex__st_cmp_wdata);
    }
    if (w->nm > 1) qsort(w->m, w->nm, sizeof *w->m, capex__st_cmp_kv);
    for (i = 0; i < w->nt; i++) {
        order[i]->offset = off;
        off += order[i]->nbytes; /* each < 2^63 and sizes were checked at add time */
        if (off > (uint64_t)INT64_MAX) {
            capex__free(&w->alloc, order);
            return capex__fail(CAPEX_ERR_LIMIT, "capex_state_write: total tensor bytes exceed 2^63");
        }
    }
    b.p = NULL;
    b.n = 0;
    capex__st_header(w, order, &b, crc_at);
    if (b.n > CAPEX_STATE_MAX_HEADER) {
        capex__free(&w->alloc, order);
        return capex__fail(CAPEX_ERR_LIMIT, "capex_state_write: JSON header would be %zu bytes, above the %u-byte limit of safetensors readers; "
                           "use fewer, larger tensors", b.n, CAPEX_STATE_MAX_HEADER);
    }
    b.p = (char *)capex__alloc(&w->alloc, b.n);
    if (!b.p) {
        capex__free(&w->alloc, order);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_write: out of memory for a %zu-byte header", b.n);
    }
    *hlen = b.n;
    b.n = 0;
    capex__st_header(w, order, &b, crc_at);
    *order_out = order;
    *hdr = b.p;
    *total = 8 + (uint64_t)*hlen + off;
    return CAPEX_OK;
}

/* Streams length, header and tensors through the sink (converting to
   little-endian on big-endian hosts via a small bounce buffer). The checksum
   digits are '0' while streaming; the caller patches them afterwards, so the
   data is read once and never copied whole. */
CAPEX__PRIVATE void capex__st_stream(capex_state_writer *w, capex__st_wtensor **order, const char *hdr, size_t hlen, capex__st_sink *s) {
    unsigned char len8[8], bounce[4096];
    uint64_t n = hlen;
    size_t i;
    int k, le = !w->swap;
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)(n >> (8 * k));
    capex__st_emit(s, len8, 8);
    capex__st_emit(s, hdr, hlen);
    for (i = 0; i < w->nt; i++) {
        const capex__st_wtensor *e = order[i];
        const unsigned char *p = e->data ? (const unsigned char *)e->data : e->scalar;
        size_t es = capex_state_dtype_size(e->dtype), left = (size_t)e->nbytes;
        if (le || es == 1) {
            capex__st_emit(s, p, left);
            continue;
        }
        while (left) {
            size_t c = left < sizeof bounce ? left : sizeof bounce;
            capex__st_swap_copy(bounce, p, c, es); /* 4096 is a multiple of every es */
            capex__st_emit(s, bounce, c);
            p += c;
            left -= c;
        }
    }
}

CAPEX__PRIVATE void capex__st_hex8(char *out, uint32_t v) {
    static const char hex[] = "0123456789abcdef";
    int i;
    for (i = 0; i < 8; i++) out[i] = hex[(v >> (28 - 4 * i)) & 15u];
}

CAPEX_API capex_result capex_state_write_memory(capex_state_writer *w, void *buf, size_t cap, size_t *len) {
    capex__st_wtensor **order;
    char *hdr;
    size_t hlen, crc_at;
    uint64_t total;
    capex__st_sink s;
    capex_result r;
    if (!w || !len) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_write_memory: writer or len is NULL");
    r = capex__st_plan(w, &order, &hdr, &hlen, &crc_at, &total);
    if (r) return r;
    if (total > (uint64_t)SIZE_MAX) {
        capex__free(&w->alloc, order);
        capex__free(&w->alloc, hdr);
        return capex__fail(CAPEX_ERR_LIMIT, "capex_state_write_memory: file would not fit in memory; use capex_state_write_file");
    }
    *len = (size_t)total;
    if (!buf || cap < (size_t)total) {
        capex__free(&w->alloc, order);
        capex__free(&w->alloc, hdr);
        if (!buf && cap == 0) return CAPEX_OK;
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "capex_state_write_memory: buffer holds %zu bytes, the file needs %zu; "
                           "query the size with buf = NULL, cap = 0", cap, (size_t)total);
    }
    memset(&s, 0, sizeof s);
    s.mem = (unsigned char *)buf;
    s.tab = &w->crc;
    capex__st_stream(w, order, hdr, hlen, &s);
    capex__st_hex8((char *)buf + 8 + crc_at, s.crc);
    capex__free(&w->alloc, order);
    capex__free(&w->alloc, hdr);
    return CAPEX_OK;
}

#ifdef CAPEX__STATE_SWEEP
/* Parses "<base>.tmp.<pid>.<serial>.<hex id>" (the temp names of
   capex_state_write_file for base); 1 with *pid on a match. */
CAPEX__PRIVATE int capex__st_temp_pid(const char *name, const char *base, size_t blen, long *pid) {
    const char *q = name + blen + 5;
    long v = 0;
    int nd = 0, k;
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0) return 0;
    for (; *q >= '0' && *q <= '9' && nd < 18; q++, nd++) v = v * 10 + (*q - '0');
    if (!nd || *q++ != '.') return 0;
    for (k = 0; *q >= '0' && *q <= '9'; q++) k = 1;
    if (!k || *q++ != '.') return 0;
    for (k = 0; (*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f'); q++) k = 1;
    if (!k || *q) return 0;
    *pid = v;
    return 1;
}

/* Removes the temp files that killed saves of `path` left beside it (issue:
   hundreds of MB after a few kills). The kernel cache's sweep removes temps
   unmodified for an hour; a save can tell more from the pid in the name:
   - a pid that no longer exists here: its writer is dead; removed once
     unmodified for a minute (a writer on another host of a shared file
     system keeps its temp's mtime fresh while it writes);
   - this process's pid: another writer of ours may be saving right now;
     removed only past the hour (a restarted container reuses the pid);
   - a live pid (another process): never removed.
   Best effort: errors are ignored. Only regular files are removed. */
CAPEX__PRIVATE void capex__st_sweep_temps(const capex_allocator *a, const char *path) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0, blen = strlen(base);
    char *buf;
    DIR *d;
    struct dirent *e;
    time_t now = time(NULL);
    long self = (long)getpid();
    if (!blen || !(buf = (char *)capex__alloc(a, dlen + 4096))) return;
    if (dlen) memcpy(buf, path, dlen);
    buf[dlen] = '\0';
    d = opendir(dlen ? buf : ".");
    if (d) {
        while ((e = readdir(d)) != NULL) {
            struct stat st;
            long pid;
            double age;
            size_t nlen = strlen(e->d_name);
            if (nlen >= 4096 - 1 || !capex__st_temp_pid(e->d_name, base, blen, &pid)) continue;
            memcpy(buf + dlen, e->d_name, nlen + 1);
            /* stat, not lstat (hidden by a strict C99 build): a link with a temp's name
               is removed itself, never its target */
            if (stat(buf, &st) != 0 || !S_ISREG(st.st_mode)) continue;
            age = difftime(now, st.st_mtime);
            if (pid == self ? age > 3600.0
                            : pid > 0 && (pid_t)pid == pid && kill((pid_t)pid, 0) != 0 && errno == ESRCH && age > 60.0)
                (void)unlink(buf);
        }
        closedir(d);
    }
    capex__free(a, buf);
}
#endif

CAPEX_API capex_result capex_state_write_file(capex_state_writer *w, const char *path) {
#ifdef CAPEX_NO_STDIO
    (void)w;
    (void)path;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_state_write_file: built with CAPEX_NO_STDIO; use capex_state_write_memory");
#else
    capex__st_wtensor **order;
    char *hdr, *tmp, digits[8];
    size_t hlen, crc_at, plen;
    uint64_t total;
    capex__st_sink s;
    capex_result r;
    FILE *f;
    unsigned long pid = 0;
    int ok, attempt;
    if (!w || !path || !*path) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_write_file: writer or path is NULL/empty");
    r = capex__st_plan(w, &order, &hdr, &hlen, &crc_at, &total);
    if (r) return r;
    plen = strlen(path);
    tmp = (char *)capex__alloc(&w->alloc, plen + 64);
    if (!tmp) {
        capex__free(&w->alloc, order);
        capex__free(&w->alloc, hdr);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_write_file: out of memory");
    }
#ifdef CAPEX__STATE_POSIX
    pid = (unsigned long)getpid();
#ifdef CAPEX__STATE_SWEEP
    capex__st_sweep_temps(&w->alloc, path); /* before ours: frees the space a full disk needs */
#endif
#endif
    /* pid + per-writer serial + object address: unique among concurrent writers;
       "x" (C11, glibc, musl, macOS, MSVC) refuses to reuse an existing name. */
    /* a temp file left by a killed job with the same pid (containers) and writer
       address takes the name: the next serials are tried, never the old file */
    for (attempt = 0; attempt < 16; attempt++) {
        sprintf(tmp, "%s.tmp.%lu.%lu.%lx", path, pid, ++w->serial, (unsigned long)((size_t)w & 0xffffffu));
        if ((f = fopen(tmp, "wbx")) != NULL || errno != EEXIST) break;
    }
    if (!f) {
        r = capex__fail(CAPEX_ERR_IO, "capex_state_write_file: cannot create temp file '%s' (%s); check that the directory "
                        "exists and is writable", tmp, strerror(errno));
        capex__free(&w->alloc, tmp);
        capex__free(&w->alloc, order);
        capex__free(&w->alloc, hdr);
        return r;
    }
    memset(&s, 0, sizeof s);
    s.f = f;
    s.tab = &w->crc;
    capex__st_stream(w, order, hdr, hlen, &s);
    capex__st_hex8(digits, s.crc);
    /* patch the checksum digits in place (the header is at most 100 MB: fits a long) */
    ok = !s.failed && CAPEX__FSEEK(f, (capex__off)(8 + crc_at), SEEK_SET) == 0 && fwrite(digits, 1, 8, f) == 8 && fflush(f) == 0;
    if (fclose(f) != 0) ok = 0;
#ifdef CAPEX__STATE_POSIX
    if (ok) { /* data on disk before the rename makes it visible (crash safety) */
        int fd = open(tmp, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) ok = 0;
        if (fd >= 0) close(fd);
    }
#endif
    if (!ok) {
        r = capex__fail(CAPEX_ERR_IO, "capex_state_write_file: writing %llu bytes to '%s' failed (%s; disk full or file size "
                        "limit?); '%s' was left unchanged", (unsigned long long)total, tmp, strerror(errno), path);
        remove(tmp);
    } else if (rename(tmp, path) != 0
#ifdef _WIN32
               /* Windows' rename does not replace: remove, then rename (not atomic;
                  a crash in between leaves the complete temp file to recover) */
               && (remove(path) != 0 || rename(tmp, path) != 0)
#endif
    ) {
        r = capex__fail(CAPEX_ERR_IO, "capex_state_write_file: cannot rename '%s' to '%s' (%s); '%s' was left unchanged",
                        tmp, path, strerror(errno), path);
        remove(tmp);
    } else {
#ifdef CAPEX__STATE_POSIX
        /* make the rename itself durable: fsync the directory (best effort) */
        const char *slash = strrchr(path, '/');
        int fd;
        if (slash && slash != path) {
            memcpy(tmp, path, (size_t)(slash - path));
            tmp[slash - path] = '\0';
        } else strcpy(tmp, slash ? "/" : ".");
        fd = open(tmp, O_RDONLY);
        if (fd >= 0) {
            (void)fsync(fd);
            close(fd);
        }
#endif
        r = CAPEX_OK;
    }
    capex__free(&w->alloc, tmp);
    capex__free(&w->alloc, order);
    capex__free(&w->alloc, hdr);
    return r;
#endif
}

/* ---- state reader ---- */

typedef struct capex__st_rtensor {
    const char *name;
    capex_state_dtype dtype;
    int ndim;
    int64_t shape[CAPEX_STATE_MAX_NDIM];
    uint64_t begin, end, numel;
} capex__st_rtensor;
typedef struct capex__st_rkv { const char *key, *value; size_t raw_at, raw_len; } capex__st_rkv;

struct capex_state_reader {
    capex_allocator alloc;
    const unsigned char *mem;  /* memory reader: the whole file */
    FILE *f;                   /* file reader */
    unsigned char *head;       /* file reader: the 8 + N header bytes */
    uint64_t data_start, file_len;
    char *arena;               /* decoded strings */
    size_t arena_used;
    capex__st_rtensor *t;
    size_t nt, capt;
    size_t *by_name;
    capex__st_rkv *m;
    size_t nm, capm;
    int is_capex;
    int swap; /* host is big-endian: byte-swap elements (tests force it on) */
    capex__crc8 crc;
};

/* Parser over the header bytes h[0..n); messages give absolute file offsets. */
typedef struct capex__st_p { const unsigned char *h; size_t n, pos; capex_state_reader *r; } capex__st_p;

#define CAPEX__ST_FAIL(P, ...) capex__st_perr((P), __VA_ARGS__)
CAPEX__PRIVATE capex_result capex__st_perr(capex__st_p *p, const char *what) {
    if (p->pos >= p->n)
        return capex__fail(CAPEX_ERR_FORMAT, "state file header: %s at byte %zu (end of the %zu-byte JSON header); the file is "
                           "truncated or corrupt", what, 8 + p->pos, p->n);
    return capex__fail(CAPEX_ERR_FORMAT, "state file header: %s at byte %zu (found 0x%02x '%c'); the file is corrupt or not "
                       "safetensors", what, 8 + p->pos, p->h[p->pos], p->h[p->pos] >= 0x20 && p->h[p->pos] < 0x7f ? p->h[p->pos] : '?');
}
CAPEX__PRIVATE void capex__st_ws(capex__st_p *p) {
    while (p->pos < p->n && (p->h[p->pos] == ' ' || p->h[p->pos] == '\t' || p->h[p->pos] == '\n' || p->h[p->pos] == '\r'))
        p->pos++;
}
CAPEX__PRIVATE int capex__st_peek(capex__st_p *p) { return p->pos < p->n ? p->h[p->pos] : -1; }
CAPEX__PRIVATE capex_result capex__st_expect(capex__st_p *p, int c, const char *what) {
    capex__st_ws(p);
    if (capex__st_peek(p) != c) return capex__st_perr(p, what);
    p->pos++;
    return CAPEX_OK;
}
CAPEX__PRIVATE int capex__st_hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
CAPEX__PRIVATE int capex__st_u4(capex__st_p *p, unsigned *v) {
    int i;
    *v = 0;
    if (p->pos + 4 > p->n) return 0;
    for (i = 0; i < 4; i++) {
        int d = capex__st_hexval(p->h[p->pos + i]);
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    p->pos += 4;
    return 1;
}
/* A JSON string, decoded (escapes, strict UTF-8) into the arena. A decoded
   string plus its NUL is never longer than its quoted form, so an arena of n
   bytes always suffices. raw_at/raw_len: the bytes between the quotes. */
CAPEX__PRIVATE capex_result capex__st_string(capex__st_p *p, const char **out, size_t *raw_at, size_t *raw_len) {
    capex_state_reader *r = p->r;
    char *o = r->arena + r->arena_used;
    size_t k = 0;
    capex__st_ws(p);
    if (capex__st_peek(p) != '"') return capex__st_perr(p, "expected a string");
    p->pos++;
    if (raw_at) *raw_at = p->pos;
    for (;;) {
        int c = capex__st_peek(p);
        if (c < 0) return capex__st_perr(p, "unterminated string");
        if (c == '"') break;
        if (c < 0x20) return capex__st_perr(p, "control character in a string (must be escaped)");
        if (c == '\\') {
            unsigned u;
            p->pos++;
            c = capex__st_peek(p);
            p->pos++;
            switch (c) {
            case '"': o[k++] = '"'; continue;
            case '\\': o[k++] = '\\'; continue;
            case '/': o[k++] = '/'; continue;
            case 'b': o[k++] = '\b'; continue;
            case 'f': o[k++] = '\f'; continue;
            case 'n': o[k++] = '\n'; continue;
            case 'r': o[k++] = '\r'; continue;
            case 't': o[k++] = '\t'; continue;
            case 'u': break;
            default: p->pos--; return capex__st_perr(p, "invalid escape in a string");
            }
            if (!capex__st_u4(p, &u)) return capex__st_perr(p, "\\u needs 4 hex digits");
            if (u >= 0xdc00 && u <= 0xdfff) return capex__st_perr(p, "lone low surrogate \\u escape");
            if (u >= 0xd800 && u <= 0xdbff) {
                unsigned lo;
                if (p->pos + 2 > p->n || p->h[p->pos] != '\\' || p->h[p->pos + 1] != 'u')
                    return capex__st_perr(p, "high surrogate \\u escape without its low half");
                p->pos += 2;
                if (!capex__st_u4(p, &lo) || lo < 0xdc00 || lo > 0xdfff)
                    return capex__st_perr(p, "high surrogate \\u escape without its low half");
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (u == 0) return capex__st_perr(p, "\\u0000 (NUL) in a string is not supported");
            if (u < 0x80) o[k++] = (char)u;
            else if (u < 0x800) {
                o[k++] = (char)(0xc0 | (u >> 6));
                o[k++] = (char)(0x80 | (u & 0x3f));
            } else if (u < 0x10000) {
                o[k++] = (char)(0xe0 | (u >> 12));
                o[k++] = (char)(0x80 | ((u >> 6) & 0x3f));
                o[k++] = (char)(0x80 | (u & 0x3f));
            } else {
                o[k++] = (char)(0xf0 | (u >> 18));
                o[k++] = (char)(0x80 | ((u >> 12) & 0x3f));
                o[k++] = (char)(0x80 | ((u >> 6) & 0x3f));
                o[k++] = (char)(0x80 | (u & 0x3f));
            }
        } else {
            size_t len = capex__st_utf8_seq(p->h + p->pos, p->n - p->pos);
            if (!len) return capex__st_perr(p, "invalid UTF-8 in a string");
            memcpy(o + k, p->h + p->pos, len);
            k += len;
            p->pos += len;
        }
    }
    if (raw_len) *raw_len = p->pos - *raw_at;
    p->pos++; /* closing quote */
    o[k++] = '\0';
    r->arena_used += k;
    *out = o;
    return CAPEX_OK;
}
/* A non-negative integer <= 2^63-1, no sign, fraction, exponent or leading 0. */
CAPEX__PRIVATE capex_result capex__st_uint(capex__st_p *p, uint64_t *v) {
    int c;
    capex__st_ws(p);
    c = capex__st_peek(p);
    if (c < '0' || c > '9') return capex__st_perr(p, "expected a non-negative integer");
    *v = 0;
    if (c == '0') {
        p->pos++;
        c = capex__st_peek(p);
        if (c >= '0' && c <= '9') return capex__st_perr(p, "integer with a leading zero");
    } else {
        while ((c = capex__st_peek(p)) >= '0' && c <= '9') {
            if (*v > ((uint64_t)INT64_MAX - (uint64_t)(c - '0')) / 10) return capex__st_perr(p, "integer above 2^63-1");
            *v = *v * 10 + (uint64_t)(c - '0');
            p->pos++;
        }
    }
    if (c == '.' || c == 'e' || c == 'E') return capex__st_perr(p, "expected an integer, found a fraction or exponent");
    return CAPEX_OK;
}
/* Array of unsigned integers: [] or [a, b, ...], at most max items. */
CAPEX__PRIVATE capex_result capex__st_uarray(capex__st_p *p, uint64_t *out, int max, int *count, const char *what) {
    capex_result r;
    int n = 0;
    if ((r = capex__st_expect(p, '[', what))) return r;
    capex__st_ws(p);
    if (capex__st_peek(p) == ']') {
        p->pos++;
        *count = 0;
        return CAPEX_OK;
    }
    for (;;) {
        if (n == max) return capex__st_perr(p, "array has too many elements (shape above CAPEX_STATE_MAX_NDIM, or data_offsets not 2)");
        if ((r = capex__st_uint(p, &out[n]))) return r;
        n++;
        capex__st_ws(p);
        if (capex__st_peek(p) == ']') break;
        if ((r = capex__st_expect(p, ',', "expected ',' or ']' in an array"))) return r;
    }
    p->pos++;
    *count = n;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__st_entry(capex__st_p *p, const char *name) {
    capex_state_reader *r = p->r;
    capex__st_rtensor *e;
    capex_result rc;
    int seen = 0, i, cnt = 0;
    uint64_t sh[CAPEX_STATE_MAX_NDIM], off[2];
    if ((rc = capex__grow(&r->alloc, (void **)&r->t, &r->capt, r->nt, r->nt + 1, sizeof *r->t, "state"))) return rc;
    e = &r->t[r->nt];
    memset(e, 0, sizeof *e);
    e->name = name;
    if ((rc = capex__st_expect(p, '{', "expected '{' starting a tensor entry"))) return rc;
    for (;;) {
        const char *field;
        int bit;
        if ((rc = capex__st_string(p, &field, NULL, NULL))) return rc;
        if ((rc = capex__st_expect(p, ':', "expected ':' after a field name"))) return rc;
        if (strcmp(field, "dtype") == 0) bit = 1;
        else if (strcmp(field, "shape") == 0) bit = 2;
        else if (strcmp(field, "data_offsets") == 0) bit = 4;
        else return capex__st_perr(p, "unknown field in a tensor entry (only dtype, shape, data_offsets)");
        if (seen & bit) return capex__st_perr(p, "field repeated in a tensor entry");
        seen |= bit;
        if (bit == 1) {
            const char *dt;
            size_t at = p->pos;
            if ((rc = capex__st_string(p, &dt, NULL, NULL))) return rc;
            for (i = 0; i < CAPEX_STATE_DTYPE_COUNT; i++)
                if (strcmp(dt, capex__st_dtype_names[i]) == 0) break;
            if (i == CAPEX_STATE_DTYPE_COUNT) {
                p->pos = at;
                capex__st_ws(p);
                return capex__fail(CAPEX_ERR_UNSUPPORTED, "state file header: tensor \"%s\" has dtype \"%s\" at byte %zu, which "
                                   "capex does not support (F32 F16 BF16 F64 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2)",
                                   name, dt, 8 + p->pos);
            }
            e->dtype = (capex_state_dtype)i;
        } else if (bit == 2) {
            if ((rc = capex__st_uarray(p, sh, CAPEX_STATE_MAX_NDIM, &cnt, "expected '[' starting shape"))) return rc;
            e->ndim = cnt;
            for (i = 0; i < cnt; i++) e->shape[i] = (int64_t)sh[i];
        } else {
            if ((rc = capex__st_uarray(p, off, 2, &cnt, "expected '[' starting data_offsets"))) return rc;
            if (cnt != 2) return capex__st_perr(p, "data_offsets must be [begin, end]");
            e->begin = off[0];
            e->end = off[1];
        }
        capex__st_ws(p);
        if (capex__st_peek(p) == '}') break;
        if ((rc = capex__st_expect(p, ',', "expected ',' or '}' in a tensor entry"))) return rc;
    }
    if (seen != 7)
        return capex__fail(CAPEX_ERR_FORMAT, "state file header: tensor \"%s\" lacks %s (entry ending at byte %zu); the file "
                           "is corrupt", name, !(seen & 1) ? "dtype" : !(seen & 2) ? "shape" : "data_offsets", 8 + p->pos);
    p->pos++;
    r->nt++;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__st_meta(capex__st_p *p) {
    capex_state_reader *r = p->r;
    capex_result rc;
    if ((rc = capex__st_expect(p, '{', "expected '{' starting __metadata__"))) return rc;
    capex__st_ws(p);
    if (capex__st_peek(p) == '}') {
        p->pos++;
        return CAPEX_OK;
    }
    for (;;) {
        capex__st_rkv *kv;
        if ((rc = capex__grow(&r->alloc, (void **)&r->m, &r->capm, r->nm, r->nm + 1, sizeof *r->m, "state"))) return rc;
        kv = &r->m[r->nm];
        if ((rc = capex__st_string(p, &kv->key, NULL, NULL))) return rc;
        if ((rc = capex__st_expect(p, ':', "expected ':' after a metadata key"))) return rc;
        capex__st_ws(p);
        if (capex__st_peek(p) != '"') return capex__st_perr(p, "metadata values must be strings");
        if ((rc = capex__st_string(p, &kv->value, &kv->raw_at, &kv->raw_len))) return rc;
        r->nm++;
        capex__st_ws(p);
        if (capex__st_peek(p) == '}') break;
        if ((rc = capex__st_expect(p, ',', "expected ',' or '}' in __metadata__"))) return rc;
    }
    p->pos++;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__st_parse(capex_state_reader *r, const unsigned char *h, size_t n) {
    capex__st_p p;
    capex_result rc;
    int seen_meta = 0;
    p.h = h;
    p.n = n;
    p.pos = 0;
    p.r = r;
    r->arena = (char *)capex__alloc(&r->alloc, n + 1);
    if (!r->arena) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "state: out of memory for a %zu-byte header", n);
    if (capex__st_peek(&p) != '{') return capex__st_perr(&p, "the JSON header must start with '{'");
    p.pos++;
    capex__st_ws(&p);
    if (capex__st_peek(&p) == '}') p.pos++;
    else
        for (;;) {
            const char *key;
            if ((rc = capex__st_string(&p, &key, NULL, NULL))) return rc;
            if ((rc = capex__st_expect(&p, ':', "expected ':' after a tensor name"))) return rc;
            if (strcmp(key, "__metadata__") == 0) {
                if (seen_meta) return capex__st_perr(&p, "__metadata__ appears twice");
                seen_meta = 1;
                if ((rc = capex__st_meta(&p))) return rc;
            } else if ((rc = capex__st_entry(&p, key))) return rc;
            capex__st_ws(&p);
            if (capex__st_peek(&p) == '}') {
                p.pos++;
                break;
            }
            if ((rc = capex__st_expect(&p, ',', "expected ',' or '}' after a header entry"))) return rc;
        }
    capex__st_ws(&p);
    if (p.pos != n) return capex__st_perr(&p, "bytes after the JSON header's closing '}' (only space padding is allowed)");
    return CAPEX_OK;
}

static int capex__st_cmp_offsets(const void *a, const void *b) {
    const capex__st_rtensor *x = (const capex__st_rtensor *)a, *y = (const capex__st_rtensor *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}
/* qsort has no context pointer: sort pointers to the names' owners instead */
static int capex__st_cmp_rname(const void *a, const void *b) {
    return strcmp((*(const capex__st_rtensor *const *)a)->name, (*(const capex__st_rtensor *const *)b)->name);
}
static int capex__st_cmp_rkv(const void *a, const void *b) {
    return strcmp(((const capex__st_rkv *)a)->key, ((const capex__st_rkv *)b)->key);
}

/* Everything but the checksum: sizes against dtype*shape, offsets in bounds,
   the data area covered exactly once, unique names, capex metadata. */
CAPEX__PRIVATE capex_result capex__st_validate(capex_state_reader *r, unsigned flags, uint64_t data_len, size_t *crc_at) {
    size_t i;
    uint64_t expect = 0;
    capex__st_rtensor **idx;
    const capex__st_rkv *fmt = NULL, *ver = NULL, *crc = NULL;
    for (i = 0; i < r->nt; i++) {
        capex__st_rtensor *e = &r->t[i];
        uint64_t numel = 1, es = capex_state_dtype_size(e->dtype);
        int d, over = 0;
        for (d = 0; d < e->ndim; d++) {
            uint64_t s = (uint64_t)e->shape[d];
            if (s != 0 && numel > UINT64_MAX / s) over = 1, numel = UINT64_MAX;
            else numel *= s;
        }
        if (numel == 0) over = 0;
        if (over || numel > (uint64_t)INT64_MAX / es)
            return capex__fail(CAPEX_ERR_FORMAT, "state file: tensor \"%s\" has a shape whose byte size overflows 64 bits; "
                               "the file is corrupt", e->name);
        e->numel = numel;
        if (e->begin > e->end || e->end - e->begin != numel * es)
            return capex__fail(CAPEX_ERR_FORMAT, "state file: tensor \"%s\" (%s, %llu elements = %llu bytes) has data_offsets "
                               "[%llu, %llu]; the file is corrupt", e->name, capex__st_dtype_names[e->dtype],
                               (unsigned long long)numel, (unsigned long long)(numel * es), (unsigned long long)e->begin,
                               (unsigned long long)e->end);
        if (e->end > data_len)
            return capex__fail(CAPEX_ERR_FORMAT, "state file: tensor \"%s\" ends at data byte %llu but the file has only %llu "
                               "bytes of tensor data: the file is truncated", e->name, (unsigned long long)e->end,
                               (unsigned long long)data_len);
    }
    if (r->nt > 1) qsort(r->t, r->nt, sizeof *r->t, capex__st_cmp_offsets);
    for (i = 0; i < r->nt; i++) {
        if (r->t[i].begin != expect)
            return capex__fail(CAPEX_ERR_FORMAT, "state file: tensor \"%s\" starts at data byte %llu, expected %llu: tensors %s",
                               r->t[i].name, (unsigned long long)r->t[i].begin, (unsigned long long)expect,
                               r->t[i].begin < expect ? "overlap" : "leave a hole (safetensors packs them tightly)");
        expect = r->t[i].end;
    }
    if (expect != data_len)
        return capex__fail(CAPEX_ERR_FORMAT, "state file: %llu bytes after the last tensor belong to no tensor; the file is "
                           "corrupt or has trailing garbage", (unsigned long long)(data_len - expect));
    idx = (capex__st_rtensor **)capex__alloc(&r->alloc, (r->nt ? r->nt : 1) * sizeof *idx);
    r->by_name = (size_t *)capex__alloc(&r->alloc, (r->nt ? r->nt : 1) * sizeof *r->by_name);
    if (!idx || !r->by_name) {
        capex__free(&r->alloc, idx);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "state: out of memory");
    }
    for (i = 0; i < r->nt; i++) idx[i] = &r->t[i];
    if (r->nt > 1) qsort(idx, r->nt, sizeof *idx, capex__st_cmp_rname);
    for (i = 0; i < r->nt; i++) {
        if (i && strcmp(idx[i - 1]->name, idx[i]->name) == 0) {
            capex_result rc = capex__fail(CAPEX_ERR_FORMAT, "state file: tensor name \"%s\" appears twice; the file is corrupt",
                                          idx[i]->name);
            capex__free(&r->alloc, idx);
            return rc;
        }
        r->by_name[i] = (size_t)(idx[i] - r->t);
    }
    capex__free(&r->alloc, idx);
    if (r->nm > 1) qsort(r->m, r->nm, sizeof *r->m, capex__st_cmp_rkv);
    for (i = 0; i < r->nm; i++) {
        if (i && strcmp(r->m[i - 1].key, r->m[i].key) == 0)
            return capex__fail(CAPEX_ERR_FORMAT, "state file: metadata key \"%s\" appears twice; the file is corrupt", r->m[i].key);
        if (strcmp(r->m[i].key, "format") == 0) fmt = &r->m[i];
        if (strcmp(r->m[i].key, "capex_format_version") == 0) ver = &r->m[i];
        if (strcmp(r->m[i].key, "capex_crc32") == 0) crc = &r->m[i];
    }
    *crc_at = 0;
    if (!fmt || strcmp(fmt->value, "capex-state") != 0) {
        if (flags & CAPEX_STATE_OPEN_FOREIGN) return CAPEX_OK;
        return capex__fail(CAPEX_ERR_FORMAT, "not a capex state file: __metadata__.format is %s%s%s, not \"capex-state\"; to read "
                           "plain safetensors (e.g. model weights) open with CAPEX_STATE_OPEN_FOREIGN", fmt ? "\"" : "",
                           fmt ? fmt->value : "absent", fmt ? "\"" : "");
    }
    if (!ver) return capex__fail(CAPEX_ERR_FORMAT, "capex state file without capex_format_version; the file is corrupt");
    if (strcmp(ver->value, "1") != 0)
        return capex__fail(CAPEX_ERR_VERSION, "capex state file has format version \"%s\"; this capex (%s) reads version %d: "
                           "load it with the capex release that wrote it (or the file is corrupt)", ver->value,
                           CAPEX_VERSION_STRING, CAPEX_STATE_FORMAT_VERSION);
    if (!crc) return capex__fail(CAPEX_ERR_FORMAT, "capex state file without capex_crc32; the file is corrupt");
    for (i = 0; i < 8 && crc->raw_len == 8; i++)
        if (!((crc->value[i] >= '0' && crc->value[i] <= '9') || (crc->value[i] >= 'a' && crc->value[i] <= 'f'))) break;
    if (crc->raw_len != 8 || i != 8 || crc->value[8] != '\0')
        return capex__fail(CAPEX_ERR_FORMAT, "capex state file: capex_crc32 \"%s\" is not 8 lowercase hex digits; the file is corrupt",
                           crc->value);
    *crc_at = crc->raw_at;
    r->is_capex = 1;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__st_crc_fail(uint32_t got, const char *want) {
    return capex__fail(CAPEX_ERR_CHECKSUM, "capex state file: contents have CRC-32 %08lx but capex_crc32 says %s: the file was "
                       "damaged or modified after writing; use another checkpoint", (unsigned long)got, want);
}

CAPEX__PRIVATE capex_result capex__st_reader_new(const capex_allocator *alloc, capex_state_reader **out) {
    capex_state_reader *r;
    if (!capex__allocator_ok(alloc)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open: allocator needs both alloc and free");
    r = (capex_state_reader *)capex__alloc(alloc, sizeof *r);
    if (!r) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_state_reader_open: out of memory");
    memset(r, 0, sizeof *r);
    if (alloc) r->alloc = *alloc;
    r->swap = !capex__host_is_le();
    capex__crc8_init(&r->crc);
    *out = r;
    return CAPEX_OK;
}

CAPEX_API void capex_state_reader_close(capex_state_reader *r) {
    capex_allocator a;
    if (!r) return;
    a = r->alloc;
#ifndef CAPEX_NO_STDIO
    if (r->f) fclose(r->f);
#endif
    capex__free(&a, r->head);
    capex__free(&a, r->arena);
    capex__free(&a, r->t);
    capex__free(&a, r->by_name);
    capex__free(&a, r->m);
    capex__free(&a, r);
}

CAPEX_API capex_result capex_state_reader_open_memory(const void *buf, size_t len, unsigned flags, const capex_allocator *alloc,
                                                      capex_state_reader **out) {
    const unsigned char *b = (const unsigned char *)buf;
    capex_state_reader *r;
    capex_result rc;
    uint64_t n;
    size_t crc_at;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open_memory: out is NULL");
    *out = NULL;
    if (!buf && len) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open_memory: buf is NULL");
    if (flags & ~CAPEX_STATE_OPEN_FOREIGN) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open: unknown flags 0x%x", flags);
    if (len < 8)
        return capex__fail(CAPEX_ERR_FORMAT, "state file is %zu bytes, shorter than the 8-byte header length: truncated", len);
    n = capex__st_le64(b);
    if (n > CAPEX_STATE_MAX_HEADER)
        return capex__fail(CAPEX_ERR_FORMAT, "state file: header length %llu (first 8 bytes) exceeds the %u-byte limit; corrupt "
                           "or not safetensors", (unsigned long long)n, CAPEX_STATE_MAX_HEADER);
    if (n > len - 8)
        return capex__fail(CAPEX_ERR_FORMAT, "state file: header length %llu but only %zu bytes follow: truncated",
                           (unsigned long long)n, len - 8);
    if ((rc = capex__st_reader_new(alloc, &r))) return rc;
    r->mem = b;
    r->file_len = len;
    r->data_start = 8 + n;
    if ((rc = capex__st_parse(r, b + 8, (size_t)n)) || (rc = capex__st_validate(r, flags, len - 8 - n, &crc_at))) {
        capex_state_reader_close(r);
        return rc;
    }
    if (r->is_capex) {
        uint32_t c = capex__crc8_update(&r->crc, 0, b, 8 + crc_at);
        c = capex__crc8_update(&r->crc, c, "00000000", 8);
        c = capex__crc8_update(&r->crc, c, b + 16 + crc_at, len - 16 - crc_at);
        char want[9];
        memcpy(want, b + 8 + crc_at, 8);
        want[8] = '\0';
        if (strtoul(want, NULL, 16) != c) {
            rc = capex__st_crc_fail(c, want);
            capex_state_reader_close(r);
            return rc;
        }
    }
    *out = r;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_state_reader_open_file(const char *path, unsigned flags, const capex_allocator *alloc,
                                                    capex_state_reader **out) {
#ifdef CAPEX_NO_STDIO
    (void)path; (void)flags; (void)alloc;
    if (out) *out = NULL;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_state_reader_open_file: built with CAPEX_NO_STDIO; use open_memory");
#else
    capex_state_reader *r;
    capex_result rc;
    FILE *f;
    capex__off flen;
    uint64_t n, len;
    size_t crc_at;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open_file: out is NULL");
    *out = NULL;
    if (!path) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open_file: path is NULL");
    if (flags & ~CAPEX_STATE_OPEN_FOREIGN) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_reader_open: unknown flags 0x%x", flags);
    f = fopen(path, "rb");
    if (!f) return capex__fail(CAPEX_ERR_IO, "cannot open state file '%s' (%s)", path, strerror(errno));
    if (CAPEX__FSEEK(f, 0, SEEK_END) != 0 || (flen = CAPEX__FTELL(f)) < 0 || CAPEX__FSEEK(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return capex__fail(CAPEX_ERR_IO, "cannot determine the size of '%s' (%s); is it a regular file?", path, strerror(errno));
    }
    if ((rc = capex__st_reader_new(alloc, &r))) {
        fclose(f);
        return rc;
    }
    r->f = f;
    len = (uint64_t)flen;
    r->file_len = len;
    rc = CAPEX_OK;
    r->head = (unsigned char *)capex__alloc(&r->alloc, 8);
    if (!r->head) rc = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "state: out of memory");
    else if (len < 8)
        rc = capex__fail(CAPEX_ERR_FORMAT, "state file '%s' is %llu bytes, shorter than the 8-byte header length: truncated",
                         path, (unsigned long long)len);
    else if (fread(r->head, 1, 8, f) != 8) rc = capex__fail(CAPEX_ERR_IO, "reading '%s' failed", path);
    if (rc) goto fail;
    n = capex__st_le64(r->head);
    if (n > CAPEX_STATE_MAX_HEADER)
        rc = capex__fail(CAPEX_ERR_FORMAT, "state file '%s': header length %llu (first 8 bytes) exceeds the %u-byte limit; "
                         "corrupt or not safetensors", path, (unsigned long long)n, CAPEX_STATE_MAX_HEADER);
    else if (n > len - 8)
        rc = capex__fail(CAPEX_ERR_FORMAT, "state file '%s': header length %llu but only %llu bytes follow: truncated", path,
                         (unsigned long long)n, (unsigned long long)(len - 8));
    if (rc) goto fail;
    {
        unsigned char *h = (unsigned char *)capex__alloc(&r->alloc, (size_t)(8 + n));
        if (!h) {
            rc = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "state: out of memory for a %llu-byte header", (unsigned long long)n);
            goto fail;
        }
        memcpy(h, r->head, 8);
        capex__free(&r->alloc, r->head);
        r->head = h;
        if (fread(h + 8, 1, (size_t)n, f) != (size_t)n) {
            rc = capex__fail(CAPEX_ERR_IO, "reading the header of '%s' failed (file changed while reading?)", path);
            goto fail;
        }
    }
    r->data_start = 8 + n;
    if ((rc = capex__st_parse(r, r->head + 8, (size_t)n)) || (rc = capex__st_validate(r, flags, len - 8 - n, &crc_at))) goto fail;
    if (r->is_capex) { /* one streaming pass over the data: no whole-file copy */
        char want[9];
        uint64_t left = len - 8 - n;
        size_t chunk = 1u << 20;
        unsigned char *buf = (unsigned char *)capex__alloc(&r->alloc, chunk);
        uint32_t c;
        if (!buf) {
            rc = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "state: out of memory");
            goto fail;
        }
        memcpy(want, r->head + 8 + crc_at, 8);
        want[8] = '\0';
        c = capex__crc8_update(&r->crc, 0, r->head, 8 + crc_at);
        c = capex__crc8_update(&r->crc, c, "00000000", 8);
        c = capex__crc8_update(&r->crc, c, r->head + 16 + crc_at, (size_t)(n - 8 - crc_at));
        while (left) {
            size_t k = left < chunk ? (size_t)left : chunk;
            if (fread(buf, 1, k, f) != k) break;
            c = capex__crc8_update(&r->crc, c, buf, k);
            left -= k;
        }
        capex__free(&r->alloc, buf);
        if (left) rc = capex__fail(CAPEX_ERR_IO, "reading the data of '%s' failed (file shrank while reading?)", path);
        else if (strtoul(want, NULL, 16) != c) rc = capex__st_crc_fail(c, want);
        if (rc) goto fail;
    }
    *out = r;
    return CAPEX_OK;
fail:
    capex_state_reader_close(r);
    return rc;
#endif
}

CAPEX_API int capex_state_is_capex(const capex_state_reader *r) { return r ? r->is_capex : 0; }
CAPEX_API size_t capex_state_tensor_count(const capex_state_reader *r) { return r ? r->nt : 0; }

CAPEX__PRIVATE void capex__st_info(const capex_state_reader *r, const capex__st_rtensor *e, capex_state_tensor_info *info) {
    int d;
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->dtype = e->dtype;
    info->ndim = e->ndim;
    for (d = 0; d < e->ndim; d++) info->shape[d] = e->shape[d];
    info->numel = e->numel;
    info->nbytes = e->end - e->begin;
    info->file_offset = r->data_start + e->begin;
}

CAPEX_API capex_result capex_state_tensor_at(const capex_state_reader *r, size_t i, capex_state_tensor_info *info) {
    if (!r || !info) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_tensor_at: reader or info is NULL");
    if (i >= r->nt) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_tensor_at: index %zu >= count %zu", i, r->nt);
    capex__st_info(r, &r->t[i], info);
    return CAPEX_OK;
}

CAPEX__PRIVATE const capex__st_rtensor *capex__st_lookup(const capex_state_reader *r, const char *name) {
    size_t lo = 0, hi = r->nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->t[r->by_name[mid]].name, name);
        if (c == 0) return &r->t[r->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

CAPEX_API capex_result capex_state_find(const capex_state_reader *r, const char *name, capex_state_tensor_info *info) {
    const capex__st_rtensor *e;
    if (!r || !name || !info) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_find: reader, name or info is NULL");
    e = capex__st_lookup(r, name);
    if (!e) return capex__fail(CAPEX_ERR_NOT_FOUND, "state file has no tensor named \"%s\"", name);
    capex__st_info(r, e, info);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_state_read_tensor(capex_state_reader *r, const char *name, capex_state_dtype dtype,
                                               uint64_t expected_numel, void *dst) {
    const capex__st_rtensor *e;
    uint64_t nbytes;
    if (!r || !name) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_read_tensor: reader or name is NULL");
    e = capex__st_lookup(r, name);
    if (!e) return capex__fail(CAPEX_ERR_NOT_FOUND, "state file has no tensor named \"%s\"", name);
    if (e->dtype != dtype || e->numel != expected_numel)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "tensor \"%s\" in the state file is %s with %llu elements; the caller expects "
                           "%s with %llu (model or optimizer configuration changed since the save?)", name,
                           capex__st_dtype_names[e->dtype], (unsigned long long)e->numel,
                           capex_state_dtype_name(dtype) ? capex_state_dtype_name(dtype) : "an invalid dtype",
                           (unsigned long long)expected_numel);
    nbytes = e->end - e->begin;
    if (nbytes == 0) return CAPEX_OK;
    if (!dst) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_read_tensor(\"%s\"): dst is NULL", name);
    if (nbytes > (uint64_t)SIZE_MAX) return capex__fail(CAPEX_ERR_LIMIT, "tensor \"%s\" does not fit in memory", name);
    if (r->mem) memcpy(dst, r->mem + r->data_start + e->begin, (size_t)nbytes);
#ifndef CAPEX_NO_STDIO
    else {
        uint64_t at = r->data_start + e->begin;
        if (at > (uint64_t)CAPEX__OFF_MAX)
            return capex__fail(CAPEX_ERR_UNSUPPORTED, "tensor \"%s\" lies beyond this platform's fseek range", name);
        if (CAPEX__FSEEK(r->f, (capex__off)at, SEEK_SET) != 0 || fread(dst, 1, (size_t)nbytes, r->f) != (size_t)nbytes)
            return capex__fail(CAPEX_ERR_IO, "reading tensor \"%s\" (%llu bytes at offset %llu) failed; was the file truncated "
                               "after it was opened?", name, (unsigned long long)nbytes, (unsigned long long)at);
    }
#endif
    if (r->swap) capex__st_swap_copy(dst, dst, (size_t)nbytes, capex__st_dtype_sizes[e->dtype]);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_state_get_f64(capex_state_reader *r, const char *name, double *v) {
    if (!v) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_get_f64: v is NULL");
    return capex_state_read_tensor(r, name, CAPEX_STATE_F64, 1, v);
}
CAPEX_API capex_result capex_state_get_f32(capex_state_reader *r, const char *name, float *v) {
    if (!v) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_get_f32: v is NULL");
    return capex_state_read_tensor(r, name, CAPEX_STATE_F32, 1, v);
}
CAPEX_API capex_result capex_state_get_i64(capex_state_reader *r, const char *name, int64_t *v) {
    if (!v) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_get_i64: v is NULL");
    return capex_state_read_tensor(r, name, CAPEX_STATE_I64, 1, v);
}

CAPEX_API size_t capex_state_meta_count(const capex_state_reader *r) { return r ? r->nm : 0; }
CAPEX_API capex_result capex_state_meta_at(const capex_state_reader *r, size_t i, const char **key, const char **value) {
    if (!r || !key || !value) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_meta_at: reader, key or value is NULL");
    if (i >= r->nm) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_meta_at: index %zu >= count %zu", i, r->nm);
    *key = r->m[i].key;
    *value = r->m[i].value;
    return CAPEX_OK;
}
CAPEX_API capex_result capex_state_get_meta(const capex_state_reader *r, const char *key, const char **value) {
    size_t i;
    if (!r || !key || !value) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_state_get_meta: reader, key or value is NULL");
    for (i = 0; i < r->nm; i++)
        if (strcmp(r->m[i].key, key) == 0) {
            *value = r->m[i].value;
            return CAPEX_OK;
        }
    return capex__fail(CAPEX_ERR_NOT_FOUND, "state file has no metadata key \"%s\"", key);
}

/* ---- loss scaler <-> state file ----------------------------------------- */

/* "<prefix><field>" into buf; fails instead of truncating. */
CAPEX__PRIVATE capex_result capex__state_name(char *buf, size_t cap, const char *prefix, const char *field) {
    int n = snprintf(buf, cap, "%s%s", prefix, field);
    if (n < 0 || (size_t)n >= cap)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "state entry name \"%s%s\" is longer than %u bytes; use a shorter prefix",
                           prefix, field, (unsigned)(cap - 1));
    return CAPEX_OK;
}

/* One table drives both directions so save and load cannot drift apart. */
typedef enum { CAPEX__SF_F32, CAPEX__SF_F64, CAPEX__SF_I64, CAPEX__SF_INT } capex__sf_kind;
typedef struct { const char *name; capex__sf_kind kind; size_t offset; } capex__scaler_field;
#define CAPEX__SF(f, k) { #f, k, offsetof(capex_scaler_state, f) }
static const capex__scaler_field capex__scaler_fields[] = {
    CAPEX__SF(dynamic, CAPEX__SF_INT),        CAPEX__SF(scale, CAPEX__SF_F32),
    CAPEX__SF(growth_tracker, CAPEX__SF_I64), CAPEX__SF(hysteresis_tracker, CAPEX__SF_INT),
    CAPEX__SF(init_scale, CAPEX__SF_F32),     CAPEX__SF(growth_factor, CAPEX__SF_F64),
    CAPEX__SF(backoff_factor, CAPEX__SF_F64), CAPEX__SF(growth_interval, CAPEX__SF_I64),
    CAPEX__SF(min_scale, CAPEX__SF_F32),      CAPEX__SF(max_scale, CAPEX__SF_F32),
    CAPEX__SF(hysteresis, CAPEX__SF_INT),     CAPEX__SF(steps, CAPEX__SF_I64),
    CAPEX__SF(skipped_steps, CAPEX__SF_I64),
};
#undef CAPEX__SF

CAPEX_API capex_result capex_scaler_save(const capex_scaler *sc, capex_state_writer *w, const char *prefix) {
    capex_scaler_state st;
    char name[256];
    size_t i;
    capex_result r;
    if (!sc || !w || !prefix) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_save: sc, w and prefix must not be NULL");
    if (!prefix[0]) /* checked before anything is added: "<prefix>format" would be the file's own key */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_save: the prefix must not be empty (use e.g. \"scaler.\")");
    if ((r = capex_scaler_get_state(sc, &st)) != CAPEX_OK) return r;
    for (i = 0; i < sizeof capex__scaler_fields / sizeof capex__scaler_fields[0]; i++) {
        const capex__scaler_field *f = &capex__scaler_fields[i];
        const char *p = (const char *)&st + f->offset;
        if ((r = capex__state_name(name, sizeof name, prefix, f->name)) != CAPEX_OK) return r;
        switch (f->kind) {
        case CAPEX__SF_F32: { float v; memcpy(&v, p, sizeof v); r = capex_state_add_f32(w, name, v); break; }
        case CAPEX__SF_F64: { double v; memcpy(&v, p, sizeof v); r = capex_state_add_f64(w, name, v); break; }
        case CAPEX__SF_I64: { int64_t v; memcpy(&v, p, sizeof v); r = capex_state_add_i64(w, name, v); break; }
        case CAPEX__SF_INT: { int v; memcpy(&v, p, sizeof v); r = capex_state_add_i64(w, name, (int64_t)v); break; }
        }
        if (r != CAPEX_OK) return r;
    }
    if ((r = capex__state_name(name, sizeof name, prefix, "format")) != CAPEX_OK) return r;
    return capex_state_add_meta(w, name, CAPEX_SCALER_STATE_FORMAT);
}

CAPEX_API capex_result capex_scaler_load(capex_scaler *sc, capex_state_reader *r, const char *prefix) {
    capex_scaler_state st;
    char name[256];
    const char *format = NULL;
    size_t i;
    capex_result res;
    if (!sc || !r || !prefix) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_load: sc, r and prefix must not be NULL");
    if (!prefix[0]) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_scaler_load: the prefix must not be empty (use e.g. \"scaler.\")");
    if ((res = capex__state_name(name, sizeof name, prefix, "format")) != CAPEX_OK) return res;
    if (capex_state_get_meta(r, name, &format) != CAPEX_OK)
        return capex__fail(CAPEX_ERR_NOT_FOUND, "capex_scaler_load: no loss scaler saved under prefix \"%s\" (metadata \"%s\" "
                           "missing); check the prefix given to capex_scaler_save", prefix, name);
    if (strcmp(format, CAPEX_SCALER_STATE_FORMAT) != 0)
        return capex__fail(CAPEX_ERR_VERSION, "capex_scaler_load: scaler state \"%s\" is \"%s\", this capex reads \"%s\"",
                           prefix, format, CAPEX_SCALER_STATE_FORMAT);
    memset(&st, 0, sizeof st);
    for (i = 0; i < sizeof capex__scaler_fields / sizeof capex__scaler_fields[0]; i++) {
        const capex__scaler_field *f = &capex__scaler_fields[i];
        char *p = (char *)&st + f->offset;
        if ((res = capex__state_name(name, sizeof name, prefix, f->name)) != CAPEX_OK) return res;
        switch (f->kind) {
        case CAPEX__SF_F32: { float v; res = capex_state_get_f32(r, name, &v); memcpy(p, &v, sizeof v); break; }
        case CAPEX__SF_F64: { double v; res = capex_state_get_f64(r, name, &v); memcpy(p, &v, sizeof v); break; }
        case CAPEX__SF_I64: { int64_t v; res = capex_state_get_i64(r, name, &v); memcpy(p, &v, sizeof v); break; }
        case CAPEX__SF_INT: {
            int64_t v = 0;
            int iv;
            res = capex_state_get_i64(r, name, &v);
            if (res == CAPEX_OK && (v < -2147483647 - 1 || v > 2147483647))
                return capex__fail(CAPEX_ERR_FORMAT, "capex_scaler_load: \"%s\" = %lld is out of range", name, (long long)v);
            iv = (int)v;
            memcpy(p, &iv, sizeof iv);
            break;
        }
        }
        if (res != CAPEX_OK) return res; /* message names the entry */
    }
    return capex_scaler_set_state(sc, &st); /* validates; sc untouched on error */
}
#endif /* CAPEX_NO_STATE */

/* ==== tensor lists, chunk planner, fused ops: implementation ==== */
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

typedef struct capex__ptr_at { uintptr_t p, e; size_t i; int is_out; } capex__ptr_at; /* [p, e) */
static int capex__ptr_at_cmp(const void *x, const void *y) {
    const capex__ptr_at *a = (const capex__ptr_at *)x, *b = (const capex__ptr_at *)y;
    return a->p < b->p ? -1 : a->p > b->p ? 1 : a->is_out - b->is_out;
}

/* out may alias in exactly (in place) only tensor for tensor (out[i] is
   in[i]) and only when both have the same dtype; out[i] starting where in[j]
   or out[j] (j != i) starts would read what another tensor already wrote.
   Any other overlap of an output with an input or another output is refused
   too (chunks would read elements other chunks already wrote); inputs may
   overlap each other. */
CAPEX__PRIVATE capex_result capex__check_alias(const char *fn, const char *nin, const capex_tensor_list *in,
                                               const char *nout, const capex_tensor_list *out) {
    size_t i, n = 0, cap = in->count + out->count;
    capex__ptr_at *v;
    capex_result r = CAPEX_OK;
    if (!cap) return CAPEX_OK;
    if (!(v = (capex__ptr_at *)capex__alloc(NULL, cap * sizeof *v))) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (i = 0; i < in->count + out->count; i++) {
        const capex_tensor *t = i < in->count ? &in->tensors[i] : &out->tensors[i - in->count];
        uintptr_t bytes = (uintptr_t)t->numel * capex_dtype_size(i < in->count ? in->dtype : out->dtype);
        if (t->numel <= 0) continue;
        v[n].p = (uintptr_t)t->data;
        v[n].e = v[n].p > UINTPTR_MAX - bytes ? UINTPTR_MAX : v[n].p + bytes;
        v[n].is_out = i >= in->count;
        v[n].i = v[n].is_out ? i - in->count : i;
        n++;
    }
    qsort(v, n, sizeof *v, capex__ptr_at_cmp);
    for (i = 1; i < n && r == CAPEX_OK; i++) {
        const capex__ptr_at *a = &v[i - 1], *b = &v[i];
        size_t k = i - 1;
        if (a->p != b->p || !b->is_out) continue; /* inputs may repeat: they are only read */
        /* in place; every other input at this address (sorted before it) must be the same tensor too */
        while (!a->is_out && a->i == b->i && in->dtype == out->dtype && k > 0 && v[k - 1].p == b->p) a = &v[--k];
        if (!a->is_out && a->i == b->i && in->dtype == out->dtype) continue;
        if (a->is_out)
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] and %s[%zu] are the same memory", fn, nout, a->i, nout, b->i);
        else if (a->i != b->i)
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] is the memory of %s[%zu]; in place, each output must be "
                            "its own input", fn, nout, b->i, nin, a->i);
        else
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] (%s) and %s[%zu] (%s) are the same memory; in-place "
                            "needs one dtype, use a separate output buffer", fn, nin, a->i,
                            capex_dtype_name(in->dtype), nout, b->i, capex_dtype_name(out->dtype));
    }
    /* Partial overlaps, in address order: an entry starting before the end of
       an earlier output, or an output starting before the end of an input
       that starts earlier. Inputs at an output's own address passed above (its
       in-place twin, same extent); inputs sort before outputs at one address. */
    {
        uintptr_t in_end = 0, grp_end = 0, out_end = 0;
        size_t in_i = 0, grp_i = 0, out_i = 0;
        for (i = 0; i < n && r == CAPEX_OK; i++) {
            const capex__ptr_at *b = &v[i];
            if (i > 0 && v[i - 1].p != b->p && grp_end > in_end) { in_end = grp_end; in_i = grp_i; }
            if (i > 0 && v[i - 1].p != b->p) grp_end = 0;
            if (b->p < out_end)
                r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] and %s[%zu] overlap in part; an output may only be "
                                "exactly its own input", fn, b->is_out ? nout : nin, b->i, nout, out_i);
            else if (b->is_out && b->p < in_end)
                r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] and %s[%zu] overlap in part; an output may only be "
                                "exactly its own input", fn, nin, in_i, nout, b->i);
            if (b->is_out && b->e > out_end) { out_end = b->e; out_i = b->i; }
            if (!b->is_out && b->e > grp_end) { grp_end = b->e; grp_i = b->i; }
        }
    }
    capex__free(NULL, v);
    return r;
}

/* No tensor of list a overlaps one of list b (any dtypes): clipping in place
   over several lists would scale memory in two of them twice. */
CAPEX__PRIVATE capex_result capex__check_disjoint(const char *fn, const char *na, const capex_tensor_list *a,
                                                  const char *nb, const capex_tensor_list *b) {
    size_t i, n = 0, cap = a->count + b->count, ai = 0, bi = 0;
    uintptr_t a_end = 0, b_end = 0;
    capex__ptr_at *v;
    capex_result r = CAPEX_OK;
    if (!cap) return CAPEX_OK;
    if (!(v = (capex__ptr_at *)capex__alloc(NULL, cap * sizeof *v))) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (i = 0; i < cap; i++) {
        const capex_tensor *t = i < a->count ? &a->tensors[i] : &b->tensors[i - a->count];
        uintptr_t bytes = (uintptr_t)t->numel * capex_dtype_size(i < a->count ? a->dtype : b->dtype);
        if (t->numel <= 0) continue;
        v[n].p = (uintptr_t)t->data;
        v[n].e = v[n].p > UINTPTR_MAX - bytes ? UINTPTR_MAX : v[n].p + bytes;
        v[n].is_out = i >= a->count; /* here: in list b */
        v[n].i = v[n].is_out ? i - a->count : i;
        n++;
    }
    qsort(v, n, sizeof *v, capex__ptr_at_cmp);
    for (i = 0; i < n && r == CAPEX_OK; i++) {
        if (v[i].is_out ? v[i].p < a_end : v[i].p < b_end)
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s[%zu] and %s[%zu] overlap; in place, that memory would be "
                            "scaled twice", fn, na, v[i].is_out ? ai : v[i].i, nb, v[i].is_out ? v[i].i : bi);
        if (v[i].is_out && v[i].e > b_end) { b_end = v[i].e; bi = v[i].i; }
        if (!v[i].is_out && v[i].e > a_end) { a_end = v[i].e; ai = v[i].i; }
    }
    capex__free(NULL, v);
    return r;
}

CAPEX_API capex_result capex_tensor_list_check(const capex_tensor_list *list) {
    return capex__check_list("capex_tensor_list_check", "list", list);
}

CAPEX_API int64_t capex_tensor_list_numel(const capex_tensor_list *list) {
    int64_t n = 0;
    size_t i;
    if (!list || (list->count && !list->tensors) || !capex_dtype_size(list->dtype)) return -1;
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
    int slot;
    if (!plan || !launch || b < 0 || b >= launch->nblocks) { /* no such block: an empty range */
        if (tensor) *tensor = 0;
        if (offset) *offset = 0;
        if (count) *count = 0;
        return;
    }
    slot = launch->block_tensor[b];
    int64_t off = (int64_t)launch->block_chunk[b] * plan->chunk_size;
    int64_t left = launch->numel[slot] - off;
    if (tensor) *tensor = launch->tensor[slot];
    if (offset) *offset = off;
    if (count) *count = left < plan->chunk_size ? left : plan->chunk_size;
}

/* ---- execution: chunks in parallel, partials combined in chunk order ---- */

#define CAPEX__TAG_TENSOR_OP_DESC CAPEX__TAG('T', 'O', 'P', 'D')
CAPEX_API void capex_tensor_op_desc_init(capex_tensor_op_desc *desc) {
    if (!desc) return;
    memset(desc, 0, sizeof *desc);
    desc->init_tag = CAPEX__TAG_TENSOR_OP_DESC;
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
    capex_result r = capex__desc_check(d->init_tag, CAPEX__TAG_TENSOR_OP_DESC, fn, "capex_tensor_op_desc",
                                       "capex_tensor_op_desc_init");
    if (r != CAPEX_OK) return r;
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
#define CAPEX__T_F32 float
#define CAPEX__T_F16 uint16_t
#define CAPEX__T_BF16 uint16_t
#define CAPEX__TOF_F32(v) (v)
#define CAPEX__TOF_F16(v) capex__f16_to_f32_v(v)
#define CAPEX__TOF_BF16(v) capex__bits_f32((uint32_t)(v) << 16)
#define CAPEX__FROMF_F32(f) (f)
#define CAPEX__FROMF_F16(f) capex__f32_to_f16_v(f)
#define CAPEX__FROMF_BF16(f) (uint16_t)capex__b16_store(f)
#define CAPEX__NF_F32(v) ((uint32_t)((capex__f32_bits(v) & 0x7f800000u) == 0x7f800000u))
#define CAPEX__NF_F16(v) ((uint32_t)(((v) & 0x7c00u) == 0x7c00u))
#define CAPEX__NF_BF16(v) ((uint32_t)(((v) & 0x7f80u) == 0x7f80u))

/* Sum of squares of one chunk, fixed order (see capex_multi_tensor_sumsq):
   element i to lane i%16, lanes folded as l_j + l_(j+8), then the tree. Each
   lane is one chain of double adds; 16 of them hide the add latency that
   bounded 8. Squares of f32 values are exact in double, so FMA contraction
   cannot change a bit. */
static double capex__sumsq_lanes_total(const double *s) {
    double t[8], r;
    int j;
    for (j = 0; j < 8; j++) t[j] = s[j] + s[j + 8];
    r = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    /* Which of two NaNs an add passes on (sign, payload) follows the operand
       order the compiler picks, and it picks differently in the paths' lanes
       and in each inlined copy of this tree: a NaN sum is one canonical NaN. */
    return r == r ? r : (double)NAN;
}
/* lanes s[16] += squares of x[0, n), n a multiple of 16. With AVX, four
   4-double accumulators (lanes 0-3, 4-7, 8-11, 12-15): the same operations
   per lane, in intrinsics since GCC 12 splits its own f32->f64 vector
   conversions into 128-bit halves. Written once (CAPEX__SUMSQ_AVX) for AVX
   (mul, add) and AVX+FMA (one fused op): the square of an f32 or bf16 value
   is exact in double, so fma(d, d, a) rounds once, like a + d*d: same bits.
   bf16: each 32-bit word of a load holds codes 2k (low half) and 2k+1 (high
   half): a shift and a mask give their f32 values without shuffles, so the
   accumulators hold the even and the odd lanes. */
#ifdef CAPEX__F16C
#define CAPEX__SUMSQ_AVX(SFX, TARGET, MADD)                                                                       \
    __attribute__((target(TARGET))) CAPEX__PRIVATE void capex__sumsq_f32_lanes_##SFX(const float *x, int64_t n,  \
                                                                                    double *s) {                \
        __m256d a0 = _mm256_loadu_pd(s), a1 = _mm256_loadu_pd(s + 4), a2 = _mm256_loadu_pd(s + 8),            \
                a3 = _mm256_loadu_pd(s + 12), d0, d1, d2, d3;                                                   \
        int64_t i;                                                                                              \
        for (i = 0; i < n; i += 16) {                                                                           \
            d0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));                                                          \
            d1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));                                                      \
            d2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));                                                      \
            d3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));                                                     \
            a0 = MADD(d0, a0); a1 = MADD(d1, a1); a2 = MADD(d2, a2); a3 = MADD(d3, a3);                         \
        }                                                                                                       \
        _mm256_storeu_pd(s, a0); _mm256_storeu_pd(s + 4, a1); _mm256_storeu_pd(s + 8, a2);                     \
        _mm256_storeu_pd(s + 12, a3);                                                                           \
    }                                                                                                           \
    __attribute__((target(TARGET))) CAPEX__PRIVATE void capex__sumsq_bf16_lanes_##SFX(const uint16_t *x,       \
                                                                                     int64_t n, double *s) {    \
        __m256d e0 = _mm256_setr_pd(s[0], s[2], s[4], s[6]), o0 = _mm256_setr_pd(s[1], s[3], s[5], s[7]);      \
        __m256d e1 = _mm256_setr_pd(s[8], s[10], s[12], s[14]), o1 = _mm256_setr_pd(s[9], s[11], s[13], s[15]); \
        __m256d d0, d1, d2, d3;                                                                                 \
        const __m128i hi = _mm_set1_epi32((int)0xffff0000u);                                                    \
        double t[16];                                                                                           \
        int64_t i;                                                                                              \
        int j;                                                                                                  \
        for (i = 0; i < n; i += 16) {                                                                           \
            __m128i h0 = _mm_loadu_si128((const __m128i *)(const void *)(x + i));                               \
            __m128i h1 = _mm_loadu_si128((const __m128i *)(const void *)(x + i + 8));                           \
            d0 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h0, 16)));                                     \
            d1 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(h0, hi)));                                      \
            d2 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h1, 16)));                                     \
            d3 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(h1, hi)));                                      \
            e0 = MADD(d0, e0); o0 = MADD(d1, o0); e1 = MADD(d2, e1); o1 = MADD(d3, o1);                         \
        }                                                                                                       \
        _mm256_storeu_pd(t, e0); _mm256_storeu_pd(t + 4, o0); _mm256_storeu_pd(t + 8, e1);                     \
        _mm256_storeu_pd(t + 12, o1);                                                                           \
        for (j = 0; j < 4; j++) {                                                                               \
            s[2 * j] = t[j]; s[2 * j + 1] = t[4 + j];                                                           \
            s[8 + 2 * j] = t[8 + j]; s[9 + 2 * j] = t[12 + j];                                                  \
        }                                                                                                       \
    }
#define CAPEX__SQ_ADD_AVX(d, a) _mm256_add_pd((a), _mm256_mul_pd((d), (d)))
#define CAPEX__SQ_ADD_FMA(d, a) _mm256_fmadd_pd((d), (d), (a))
CAPEX__SUMSQ_AVX(avx, "avx", CAPEX__SQ_ADD_AVX)
CAPEX__SUMSQ_AVX(fma, "avx,fma", CAPEX__SQ_ADD_FMA)
/* fp16 lanes: vcvtph2ps in registers, then as f32 (lanes 0-7 from the first
   8 codes, 8-15 from the next). vcvtph2ps quiets a signalling NaN where the
   software codec keeps it, but vcvtps2pd quiets it the same way next, so the
   double is the same either way (test_f16c sumsq_same_bits has both NaNs).
   Converting into a buffer first cost 1.5x the bf16 sum (Zen 4). */
#define CAPEX__SUMSQ_F16C(SFX, TARGET, MADD)                                                                      \
    __attribute__((target(TARGET))) CAPEX__PRIVATE void capex__sumsq_f16_lanes_##SFX(const uint16_t *x,        \
                                                                                    int64_t n, double *s) {     \
        __m256d a0 = _mm256_loadu_pd(s), a1 = _mm256_loadu_pd(s + 4), a2 = _mm256_loadu_pd(s + 8),            \
                a3 = _mm256_loadu_pd(s + 12);                                                                   \
        int64_t i;                                                                                              \
        for (i = 0; i < n; i += 16) {                                                                           \
            __m128i h0 = _mm_loadu_si128((const __m128i *)(const void *)(x + i));                               \
            __m128i h1 = _mm_loadu_si128((const __m128i *)(const void *)(x + i + 8));                           \
            __m256 f0 = _mm256_cvtph_ps(h0), f1 = _mm256_cvtph_ps(h1);                                         \
            a0 = MADD(_mm256_cvtps_pd(_mm256_castps256_ps128(f0)), a0);                                         \
            a1 = MADD(_mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)), a1);                                       \
            a2 = MADD(_mm256_cvtps_pd(_mm256_castps256_ps128(f1)), a2);                                         \
            a3 = MADD(_mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)), a3);                                       \
        }                                                                                                       \
        _mm256_storeu_pd(s, a0); _mm256_storeu_pd(s + 4, a1); _mm256_storeu_pd(s + 8, a2);                     \
        _mm256_storeu_pd(s + 12, a3);                                                                           \
    }
CAPEX__SUMSQ_F16C(avx, "avx,f16c", CAPEX__SQ_ADD_AVX)
CAPEX__SUMSQ_F16C(fma, "avx,fma,f16c", CAPEX__SQ_ADD_FMA)
#endif
static void capex__sumsq_f32_lanes(const float *x, int64_t n, double *s) {
    int64_t i;
    int j;
#ifdef CAPEX__F16C
    if (CAPEX__FMA_ON()) { capex__sumsq_f32_lanes_fma(x, n, s); return; }
    if (CAPEX__AVX_ON()) { capex__sumsq_f32_lanes_avx(x, n, s); return; }
#endif
    for (i = 0; i < n; i += 16)
        for (j = 0; j < 16; j++) s[j] += (double)x[i + j] * (double)x[i + j];
}
static void capex__sumsq_bf16_lanes(const uint16_t *x, int64_t n, double *s) {
    int64_t i;
    int j;
#ifdef CAPEX__F16C
    if (CAPEX__FMA_ON()) { capex__sumsq_bf16_lanes_fma(x, n, s); return; }
    if (CAPEX__AVX_ON()) { capex__sumsq_bf16_lanes_avx(x, n, s); return; }
#endif
    for (i = 0; i < n; i += 16)
        for (j = 0; j < 16; j++) {
            double v = (double)CAPEX__TOF_BF16(x[i + j]);
            s[j] += v * v;
        }
}
CAPEX__PRIVATE double capex__sumsq_F32(const void *x_, int64_t n) {
    const float *x = (const float *)x_;
    double s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int64_t m = n / 16 * 16, i;
    capex__sumsq_f32_lanes(x, m, s);
    for (i = m; i < n; i++) s[i & 15] += (double)x[i] * (double)x[i];
    return capex__sumsq_lanes_total(s);
}
CAPEX__PRIVATE double capex__sumsq_BF16(const void *x_, int64_t n) {
    const uint16_t *x = (const uint16_t *)x_;
    double s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int64_t m = n / 16 * 16, i;
    capex__sumsq_bf16_lanes(x, m, s);
    for (i = m; i < n; i++) {
        double v = (double)CAPEX__TOF_BF16(x[i]);
        s[i & 15] += v * v;
    }
    return capex__sumsq_lanes_total(s);
}
/* fp16: F16C in registers where the CPU has it; elsewhere blocks of 256
   converted first, then the f32 lanes; blocks are whole lane rounds, so the
   same order as f32 either way. */
CAPEX__PRIVATE double capex__sumsq_F16(const void *x_, int64_t n) {
    const uint16_t *x = (const uint16_t *)x_;
    double s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    float b[256];
    int64_t i = 0, k;
#ifdef CAPEX__F16C
    if (CAPEX__F16C_ON() && CAPEX__AVX_ON()) {
        i = n / 16 * 16;
        if (CAPEX__FMA_ON()) capex__sumsq_f16_lanes_fma(x, i, s);
        else capex__sumsq_f16_lanes_avx(x, i, s);
        for (k = i; k < n; k++) {
            double v = (double)capex__f16_to_f32_v(x[k]);
            s[k & 15] += v * v;
        }
        return capex__sumsq_lanes_total(s);
    }
#endif
    while (i < n) {
        int64_t nb = n - i < 256 ? n - i : 256, m = nb / 16 * 16;
        capex__f16_load_n(x + i, b, (size_t)nb);
        capex__sumsq_f32_lanes(b, m, s);
        for (k = m; k < nb; k++) s[k & 15] += (double)b[k] * (double)b[k];
        i += nb;
    }
    return capex__sumsq_lanes_total(s);
}

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
    if (desc && (r = capex__check_desc(name, desc)) != CAPEX_OK) return r; /* before any output is written */
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
    size_t l, m;
    capex_result r;
    if (desc && (r = capex__check_desc(fn, desc)) != CAPEX_OK) return r; /* also with no lists (no sum checks it) */
    if (nlists > 0 && !grads) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: grads is NULL with nlists %zu", fn, nlists);
    if (max_norm != max_norm || max_norm < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: max_norm is %g; it must be >= 0 (inf: no clipping)", fn,
                           (double)max_norm);
    for (l = 0; l < nlists; l++) {
        char name[32];
        snprintf(name, sizeof name, "grads[%zu]", l);
        if ((r = capex__check_list(fn, name, &grads[l])) != CAPEX_OK) return r;
        /* in place: a tensor listed twice would be scaled twice (as on the GPU) */
        if (apply && (r = capex__check_alias(fn, name, &grads[l], name, &grads[l])) != CAPEX_OK) return r;
        for (m = 0; apply && m < l; m++) {
            char mname[32];
            snprintf(mname, sizeof mname, "grads[%zu]", m);
            if ((r = capex__check_disjoint(fn, mname, &grads[m], name, &grads[l])) != CAPEX_OK) return r;
        }
    }
    for (l = 0; l < nlists; l++) {
        double s = 0.0;
        if ((r = capex__sumsq(fn, desc, &grads[l], &s, NULL, NULL)) != CAPEX_OK) return r;
        sq += s;
    }
    total = (float)sqrt(sq);
    coef = capex_clip_coef(total, max_norm);
    /* every grad finite but the norm beyond f32: PyTorch's max_norm / inf = 0 */
    if (sq - sq == 0.0 && !(total - total == 0.0f) && max_norm - max_norm == 0.0f) coef = 0.0f;
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

/* ==== optimizers: implementation ==== */
/* ---- optimizers ----------------------------------------------------------

   Layout: the per-element math lives ONCE in the CAPEX__OPTIM_MATH_* macros
   below. They expand to `static inline` C here and, stringified, to the
   `__device__ __forceinline__` source that capex_cuda.h compiles with NVRTC
   (capex__optim_math_source), so the CPU tests vouch for the GPU math. The
   operation order is Apex's (csrc/multi_tensor_adam.cu, multi_tensor_lamb.cu,
   multi_tensor_sgd_kernel.cu); for bit parity the GPU side must compile with
   FMA contraction off (NVRTC --fmad=false), as C does under -std=c99.

   Work is split into chunks of 65536 elements of one tensor (Apex's chunk
   size); chunks run in parallel under OpenMP. Reductions (LAMB norms) keep one
   partial per chunk with a fixed in-chunk order and add partials in chunk
   order, so results do not depend on the thread count. */

#if defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER)
#  define CAPEX__OPT_RESTRICT __restrict
#else
#  define CAPEX__OPT_RESTRICT
#endif
/* GCC at -O2 vectorises only trip counts it can see; `omp simd` lifts that.
   Clang vectorises these loops by itself (and warns where it cannot). */
#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__)
#  define CAPEX__OPT_SIMD _Pragma("omp simd")
#else
#  define CAPEX__OPT_SIMD
#endif
#define CAPEX__OPT_STR(...) #__VA_ARGS__
#define CAPEX__OPT_XSTR(...) CAPEX__OPT_STR(__VA_ARGS__)

/* Q: function qualifiers; F2U: float -> uint32 bit cast.
   Only C99 + CUDA common ground: float/unsigned int, sqrtf, no libc. */

/* Counter-based stochastic rounding to bf16: 16 random bits from a hash of
   (seed, step, tensor index, element index), added to the f32 bits below the
   bf16 mantissa, then truncated: rounds away from zero with probability equal
   to the dropped fraction (unbiased). Same bits for any thread count, on
   resume and on the GPU. mix32 is Chris Wellons' "lowbias32" integer hash. */
#define CAPEX__OPTIM_MATH_RNG(Q, F2U)                                                        \
    Q unsigned int capex__mix32(unsigned int x) {                                            \
        x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;        \
        return x;                                                                            \
    }                                                                                        \
    Q unsigned int capex__sr_key(unsigned int seed_lo, unsigned int seed_hi, unsigned int step_lo, \
                                 unsigned int step_hi, unsigned int tensor, unsigned int index_hi) { \
        unsigned int k = capex__mix32(seed_lo ^ 0x9e3779b9U);                                \
        k = capex__mix32(k ^ seed_hi); k = capex__mix32(k + step_lo);                        \
        k = capex__mix32(k ^ step_hi); k = capex__mix32(k + tensor);                         \
        return capex__mix32(k ^ index_hi);                                                   \
    }                                                                                        \
    Q unsigned int capex__sr_bits(unsigned int key, unsigned int index_lo) {                 \
        return capex__mix32(capex__mix32(index_lo ^ key) + key) & 0xffffU;                   \
    }                                                                                        \
    Q unsigned int capex__bf16_round_sr(float x, unsigned int r16) {                         \
        unsigned int u = F2U(x);                                                             \
        return (u & 0x7fffffffU) > 0x7f800000U ? ((u >> 16) | 0x40U) : ((u + r16) >> 16);    \
    }

/* Adam (FusedAdam AdamFunctor): L2 mode adds wd*p to g before the moments;
   W mode adds wd*p to the update (decoupled decay, Loshchilov & Hutter).
   torch.optim.AdamW instead scales p by (1-lr*wd) first and divides by
   sqrt(bc2) outside the sqrt: equal in exact arithmetic, not in bits. */
#define CAPEX__OPTIM_MATH_ADAM(Q)                                                            \
    Q float capex__adam_l2_elem(float p, float g, float *m, float *v, float beta1, float beta2, \
                                float bc1, float bc2, float eps, float lr, float wd) {       \
        float mm, vv, denom;                                                                 \
        g = g + (wd * p);                                                                    \
        mm = beta1 * *m + (1.0f - beta1) * g;                                                \
        vv = beta2 * *v + (1.0f - beta2) * g * g;                                            \
        *m = mm; *v = vv;                                                                    \
        denom = sqrtf(vv / bc2) + eps;                                                       \
        return p - (lr * ((mm / bc1) / denom));                                              \
    }                                                                                        \
    Q float capex__adam_w_elem(float p, float g, float *m, float *v, float beta1, float beta2, \
                               float bc1, float bc2, float eps, float lr, float wd) {        \
        float mm, vv, denom;                                                                 \
        mm = beta1 * *m + (1.0f - beta1) * g;                                                \
        vv = beta2 * *v + (1.0f - beta2) * g * g;                                            \
        *m = mm; *v = vv;                                                                    \
        denom = sqrtf(vv / bc2) + eps;                                                       \
        return p - (lr * (((mm / bc1) / denom) + (wd * p)));                                 \
    }

/* LAMB (FusedLAMB LAMBStage1Functor / LAMBStage2Functor). g arrives already
   multiplied by inv_scale*clip; clip_div is Apex's clipped_global_grad_norm.
   Stage 2 recomputes u from the stored m, v and p (same ops, same bits)
   instead of keeping u in the gradient buffer as Apex does: no scratch
   memory and the user's (possibly half) gradients stay intact. */
#define CAPEX__OPTIM_MATH_LAMB(Q)                                                            \
    Q void capex__lamb_moments_elem(float g, float *m, float *v, float beta1, float beta2,  \
                                    float beta3) {                                           \
        *m = *m * beta1 + beta3 * g;                                                         \
        *v = *v * beta2 + (1.0f - beta2) * g * g;                                            \
    }                                                                                        \
    Q float capex__lamb_grad_l2(float g, float p, float clip_div, float wd) {               \
        return (g / clip_div) + wd * p;                                                      \
    }                                                                                        \
    Q float capex__lamb_grad_w(float g, float clip_div) { return g / clip_div; }            \
    Q float capex__lamb_update_l2(float p, float m, float v, float bc1, float bc2, float eps) { \
        (void)p;                                                                             \
        return (m / bc1) / (sqrtf(v / bc2) + eps);                                           \
    }                                                                                        \
    Q float capex__lamb_update_w(float p, float m, float v, float bc1, float bc2, float eps, \
                                 float wd) {                                                 \
        return ((m / bc1) / (sqrtf(v / bc2) + eps)) + (wd * p);                              \
    }                                                                                        \
    Q float capex__lamb_apply(float p, float u, float ratio) { return p - (ratio * u); }

/* SGD (FusedSGD SGDFunctor): weight decay before momentum unless
   wd_after_momentum; on the first momentum step buf = g (torch: clone(g)).
   Apex's `if (wd != 0 && !wd_after)` tests arrive as all-ones/zero masks
   computed once per step and pick between both arms bitwise (capex__sel):
   the same values as Apex's branches, but GCC at -O2 turns a loop-invariant
   `flag ? a : b` on floats into a branch and then cannot vectorise. */
#define CAPEX__OPTIM_MATH_SGD(Q, F2U, U2F)                                                   \
    Q float capex__sel(unsigned int mask, float a, float b) {                                \
        return U2F((F2U(a) & mask) | (F2U(b) & ~mask));                                      \
    }                                                                                        \
    Q float capex__sgd_elem(float p, float g, float wd, float lr, unsigned int wd_on) {      \
        g = capex__sel(wd_on, g + wd * p, g);                                                \
        return p + (-lr * g);                                                                \
    }                                                                                        \
    Q float capex__sgd_mom_elem(float p, float g, float *buf, float wd, float momentum,     \
                                float dampening, float lr, unsigned int nesterov,           \
                                unsigned int first, unsigned int wd_before,                 \
                                unsigned int wd_after) {                                    \
        float b;                                                                             \
        g = capex__sel(wd_before, g + wd * p, g);                                            \
        b = capex__sel(first, g, *buf * momentum + (1.0f - dampening) * g);                  \
        *buf = b;                                                                            \
        g = capex__sel(nesterov, g + momentum * b, b);                                       \
        g = capex__sel(wd_after, g + wd * p, g);                                             \
        return p + (-lr * g);                                                                \
    }

/* NovoGrad (FusedNovoGrad: multi_tensor_novograd.cu NovoGradFunctor, and the
   per-tensor blend of multi_tensor_l2norm_kernel.cu cleanup_v2). v is a norm
   per tensor, blended as Apex does in f32: v = sqrt(b2*v*v + (1-b2)*n2) with
   n2 the tensor's sum of g^2. denom = v/bc2 + eps is one value per tensor
   (bc2 = sqrt(1 - b2^step)); Apex computes it per element with the same ops.
   _mom: moment_mode 1 (default); _reg: moment_mode 0 (reg_inside_moment). */
#define CAPEX__OPTIM_MATH_NOVOGRAD(Q)                                                        \
    Q float capex__novo_blend(float v, float n2, float beta2) {                             \
        return sqrtf(beta2 * v * v + (1.0f - beta2) * n2);                                   \
    }                                                                                        \
    Q float capex__novo_denom(float v, float bc2, float eps) { return (v / bc2) + eps; }    \
    Q float capex__novo_mom_elem(float p, float g, float *m, float beta1, float beta3, float bc1, \
                                 float denom, float lr, float wd) {                          \
        float mm = beta1 * *m + beta3 * g;                                                   \
        *m = mm;                                                                             \
        return p - (lr * (((mm / bc1) / denom) + (wd * p)));                                 \
    }                                                                                        \
    Q float capex__novo_reg_elem(float p, float g, float *m, float beta1, float beta3, float bc1, \
                                 float denom, float lr, float wd) {                          \
        float mm;                                                                            \
        g = (g / denom) + (wd * p);                                                          \
        mm = beta1 * *m + beta3 * g;                                                         \
        *m = mm;                                                                             \
        return p - (lr * (mm / bc1));                                                        \
    }

/* Adam with amsgrad (torch.optim.Adam amsgrad=True; Apex has none): the moments
   as Apex's Adam, then vmax = max(vmax, v), NaN propagating as torch.maximum,
   and vmax in the denominator in Apex's order (sqrt(vmax/bc2) + eps; torch's
   sqrt(vmax)/sqrt(bc2) + eps is equal in exact arithmetic).
   Adagrad (Apex FusedAdagrad AdagradFunctor): L2 mode adds wd*p to g before
   the sum, W mode (adagrad_w_mode) adds wd*p to the update. clr is torch's
   lr / (1 + (step-1)*lr_decay) (Apex: lr). */
#define CAPEX__OPTIM_MATH_AMS_ADAGRAD(Q)                                                     \
    /* | rather than ||: one select, so the CPU loop vectorises (2x faster) */                \
    Q float capex__ams_max(float vmax, float v) { return ((v > vmax) | (v != v)) ? v : vmax; } \
    Q float capex__adam_ams_l2_elem(float p, float g, float *m, float *v, float *vm, float beta1, \
                                    float beta2, float bc1, float bc2, float eps, float lr, float wd) { \
        float mm, vv, vx, denom;                                                             \
        g = g + (wd * p);                                                                    \
        mm = beta1 * *m + (1.0f - beta1) * g;                                                \
        vv = beta2 * *v + (1.0f - beta2) * g * g;                                            \
        vx = capex__ams_max(*vm, vv);                                                        \
        *m = mm; *v = vv; *vm = vx;                                                          \
        denom = sqrtf(vx / bc2) + eps;                                                       \
        return p - (lr * ((mm / bc1) / denom));                                              \
    }                                                                                        \
    Q float capex__adam_ams_w_elem(float p, float g, float *m, float *v, float *vm, float beta1, \
                                   float beta2, float bc1, float bc2, float eps, float lr, float wd) { \
        float mm, vv, vx, denom;                                                             \
        mm = beta1 * *m + (1.0f - beta1) * g;                                                \
        vv = beta2 * *v + (1.0f - beta2) * g * g;                                            \
        vx = capex__ams_max(*vm, vv);                                                        \
        *m = mm; *v = vv; *vm = vx;                                                          \
        denom = sqrtf(vx / bc2) + eps;                                                       \
        return p - (lr * (((mm / bc1) / denom) + (wd * p)));                                 \
    }                                                                                        \
    /* Both modes in one body for a run-time mode on the GPU (capex_cuda.h: one copy of   \
       the divisions, not one per mode): wm ~0 W, 0 L2; the same ops as the _w/_l2       \
       functions, picked with bits (capex__sel) so that NVVM keeps one copy. */           \
    Q float capex__adam_ams_elem(float p, float g, float *m, float *v, float *vm, float beta1, \
                                 float beta2, float bc1, float bc2, float eps, float lr, float wd, \
                                 unsigned int wm) {                                          \
        float mm, vv, vx, denom;                                                             \
        g = capex__sel(wm, g, g + (wd * p));                                                 \
        mm = beta1 * *m + (1.0f - beta1) * g;                                                \
        vv = beta2 * *v + (1.0f - beta2) * g * g;                                            \
        vx = capex__ams_max(*vm, vv);                                                        \
        *m = mm; *v = vv; *vm = vx;                                                          \
        denom = sqrtf(vx / bc2) + eps;                                                       \
        return p - (lr * capex__sel(wm, ((mm / bc1) / denom) + (wd * p), (mm / bc1) / denom)); \
    }                                                                                        \
    Q float capex__adagrad_elem(float p, float g, float *h, float eps, float clr, float wd,  \
                                unsigned int wm) {                                           \
        float hh;                                                                            \
        g = capex__sel(wm, g, g + (wd * p));                                                 \
        hh = *h + g * g;                                                                     \
        *h = hh;                                                                             \
        return p - (clr * capex__sel(wm, (g / (sqrtf(hh) + eps)) + (wd * p), g / (sqrtf(hh) + eps))); \
    }                                                                                        \
    Q float capex__adagrad_l2_elem(float p, float g, float *h, float eps, float clr, float wd) { \
        float hh;                                                                            \
        g = g + (wd * p);                                                                    \
        hh = *h + g * g;                                                                     \
        *h = hh;                                                                             \
        return p - (clr * (g / (sqrtf(hh) + eps)));                                          \
    }                                                                                        \
    Q float capex__adagrad_w_elem(float p, float g, float *h, float eps, float clr, float wd) { \
        float hh;                                                                            \
        hh = *h + g * g;                                                                     \
        *h = hh;                                                                             \
        return p - (clr * ((g / (sqrtf(hh) + eps)) + (wd * p)));                             \
    }

/* Vectorisation: GCC and clang keep an errno path around sqrtf unless built
   with -fno-math-errno (GCC ignores it as a pragma/attribute), which blocks
   vectorising the Adam/LAMB loops; add -fno-math-errno (results do not
   change: IEEE sqrt either way). SGD and the model-copy stores vectorise
   regardless. */
CAPEX__OPTIM_MATH_RNG(static inline, capex__f32_bits)
CAPEX__OPTIM_MATH_ADAM(static inline)
CAPEX__OPTIM_MATH_LAMB(static inline)
CAPEX__OPTIM_MATH_SGD(static inline, capex__f32_bits, capex__bits_f32)
CAPEX__OPTIM_MATH_NOVOGRAD(static inline)
CAPEX__OPTIM_MATH_AMS_ADAGRAD(static inline)

/* The same math as CUDA source (each part < 4095 chars, ISO C's minimum
   string length). The qualifiers stay placeholder tokens, defined by the
   preamble, so compiling capex.h with nvcc cannot expand them here. */
static const char *const capex__optim_math_parts[] = {
    "#define CAPEX__QUAL __device__ __forceinline__\n#define CAPEX__F2U __float_as_uint\n#define CAPEX__U2F __uint_as_float\n",
    /* capex_cuda.h's kernel prelude already holds these (CAPEX__HALF_DEFINED) */
    "#ifndef CAPEX__HALF_DEFINED\n" CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_HALF(CAPEX__QUAL, CAPEX__F2U, CAPEX__U2F)) "\n#endif\n",
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_RNG(CAPEX__QUAL, CAPEX__F2U)),
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_ADAM(CAPEX__QUAL)),
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_LAMB(CAPEX__QUAL)),
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_SGD(CAPEX__QUAL, CAPEX__F2U, CAPEX__U2F)),
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_NOVOGRAD(CAPEX__QUAL)),
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_AMS_ADAGRAD(CAPEX__QUAL)),
};

/* For capex_cuda.h: writes the optimizer math as CUDA source into dst
   (NUL-terminated, truncated to cap) and returns its full length; call with
   cap 0 to size the buffer. */
CAPEX__PRIVATE size_t capex__optim_math_source(char *dst, size_t cap) {
    size_t k, len = 0;
    for (k = 0; k < sizeof capex__optim_math_parts / sizeof capex__optim_math_parts[0]; k++) {
        const char *s = capex__optim_math_parts[k];
        size_t n = strlen(s);
        size_t j;
        for (j = 0; j <= n; j++) { /* each part followed by a newline */
            char ch = j < n ? s[j] : '\n';
            if (dst && len + 1 < cap) dst[len] = ch;
            len++;
        }
    }
    if (dst && cap) dst[len < cap ? len : cap - 1] = '\0';
    return len;
}

/* ---- learning-rate schedules ----
   The formula lives once in CAPEX__LR_MATH: `static` C here and, stringified,
   the device function that capex_cuda.h's capex_go_prepare calls, so the GPU
   computes each step's lr from its own step count (no host round trip).
   Operation order is torch's (lr_scheduler.py closed forms and OneCycleLR),
   in float64; pi is Python's math.pi. Kinds are capex_lr_kind's numbers.
   U: nothing in C, CAPEX_NO_UNROLL on the GPU (a loop one thread runs once a step). */
#define CAPEX__LR_MATH(Q, U)                                                                 \
    typedef struct capex__lr_p {                                                             \
        long long kind, warmup, total, step_size, nmil, anneal_linear, three_phase, llmc;    \
        long long by_iter; /* count_skipped: the device's lr_sched reads it */               \
        long long mil[16];                                                                   \
        double start_factor, min_factor, power, gamma, pct_start, div_factor, final_div;     \
    } capex__lr_p;                                                                           \
    Q double capex__lr_anneal(double start, double end, double pct, long long lin) {         \
        /* OneCycleLR._annealing_linear / _annealing_cos */                                 \
        if (lin) return (end - start) * pct + start;                                         \
        return end + (start - end) / 2.0 * (cos(3.141592653589793 * pct) + 1.0);            \
    }                                                                                        \
    Q double capex__lr_eval(const capex__lr_p *p, double base, long long s) {                \
        long long t, T, k, n;                                                                \
        double eta, x, y;                                                                    \
        if (p->kind == 7) { /* OneCycleLR, max_lr = base; holds its last value */            \
            /* the phase picks the ends and the fraction; one anneal call (the GPU      \
               inlines each call: one copy of its cos, not five) */                         \
            double init = base / p->div_factor, mn = init / p->final_div, sn, e1, e2, e3;    \
            double a = init, b = base, lo = 0.0, hi;                                         \
            if (s > p->total - 1) s = p->total - 1;                                          \
            sn = (double)s;                                                                  \
            e1 = p->pct_start * (double)p->total - 1.0;                                      \
            e3 = (double)(p->total - 1);                                                     \
            hi = e1;                                                                         \
            if (!(sn <= e1) && !p->three_phase) { a = base; b = mn; lo = e1; hi = e3; }     \
            else if (!(sn <= e1)) {                                                          \
                e2 = 2.0 * p->pct_start * (double)p->total - 2.0;                            \
                if (sn <= e2) { a = base; b = init; lo = e1; hi = e2; }                      \
                else { a = init; b = mn; lo = e2; hi = e3; }                                 \
            }                                                                                \
            return capex__lr_anneal(a, b, (sn - lo) / (hi - lo), p->anneal_linear);          \
        }                                                                                    \
        if (s < p->warmup && p->llmc) /* llm.c: lr * (step + 1) / warmup_iterations */       \
            return base * (double)(s + 1) / (double)p->warmup;                               \
        if (s < p->warmup) /* LinearLR(start_factor, 1.0, total_iters=warmup) */             \
            return base * (p->start_factor + (1.0 - p->start_factor) * (double)s / (double)p->warmup); \
        t = s - p->warmup;                                                                   \
        T = p->total - p->warmup;                                                            \
        eta = base * p->min_factor;                                                          \
        switch (p->kind) {                                                                   \
        case 1: /* CosineAnnealingLR(T_max = T, eta_min), held at eta past T */              \
            if (t > T) t = T;                                                                \
            return eta + (base - eta) * (1.0 + cos(3.141592653589793 * (double)t / (double)T)) / 2.0; \
        case 2: /* LinearLR(1.0, end_factor = min_factor, total_iters = T) */                \
            if (t > T) t = T;                                                                \
            return base * (1.0 + (p->min_factor - 1.0) * (double)t / (double)T);             \
        /* the power kinds pick pow's arguments: one pow (the GPU inlines each call) */      \
        case 3: /* PolynomialLR(total_iters = T, power), floor eta */                        \
            if (t > T) t = T;                                                                \
            x = 1.0 - (double)t / (double)T; y = p->power;                                   \
            break;                                                                           \
        case 4: /* StepLR */                                                                 \
            x = p->gamma; y = (double)(t / p->step_size);                                    \
            break;                                                                           \
        case 5: /* MultiStepLR: bisect_right(milestones, t) */                               \
            U for (k = 0, n = 0; k < p->nmil; k++) n += p->mil[k] <= t;                      \
            x = p->gamma; y = (double)n;                                                     \
            break;                                                                           \
        case 6: /* ExponentialLR */                                                          \
            x = p->gamma; y = (double)t;                                                     \
            break;                                                                           \
        default: /* constant */                                                              \
            return base;                                                                     \
        }                                                                                    \
        y = pow(x, y);                                                                       \
        return p->kind == 3 ? eta + (base - eta) * y : base * y;                             \
    }

CAPEX__LR_MATH(static, )
typedef char capex__lr_milestones_fit[CAPEX_LR_MAX_MILESTONES == 16 ? 1 : -1];

/* For capex_cuda.h: the schedule math as CUDA source (__device__ functions). */
static const char capex__lr_math_source[] =
    "#define CAPEX__LRQ __device__ __forceinline__\n" CAPEX__OPT_XSTR(CAPEX__LR_MATH(CAPEX__LRQ, CAPEX_NO_UNROLL)) "\n";

#define CAPEX__LR_TAG 0x5348524cu /* "LRHS" */
CAPEX_API void capex_lr_schedule_init(capex_lr_schedule *s, capex_lr_kind kind) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->init_tag = CAPEX__LR_TAG;
    s->kind = kind;
    s->warmup_start_factor = 1.0 / 3.0; /* torch LinearLR's default start_factor */
    s->power = 1.0;
    s->step_size = 1;
    s->gamma = 0.1;
    s->pct_start = 0.3;
    s->div_factor = 25.0;
    s->final_div_factor = 1e4;
}

static int capex__lr_finite(double x) { return (x - x) == 0.0; }

CAPEX_API capex_result capex_lr_schedule_check(const capex_lr_schedule *s) {
    int k;
    if (!s) return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: NULL; use capex_lr_schedule_init");
    if (s->init_tag != CAPEX__LR_TAG)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_schedule was not made by capex_lr_schedule_init (zeroed or "
                           "uninitialised); call capex_lr_schedule_init(&s, kind), then change fields");
    if ((int)s->kind < (int)CAPEX_LR_CONSTANT || (int)s->kind > (int)CAPEX_LR_ONECYCLE)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: unknown kind %d; use a CAPEX_LR_* value", (int)s->kind);
    if (s->warmup_steps < 0 || s->warmup_steps > CAPEX_STEP_MAX)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: warmup_steps is %lld; it must lie in [0, 2^53]",
                           (long long)s->warmup_steps);
    if (s->warmup_llmc != 0 && s->warmup_llmc != 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: warmup_llmc is %d; use 0 (torch LinearLR warmup) or 1 "
                           "(llm.c's (step+1)/W)", s->warmup_llmc);
    if (s->count_skipped != 0 && s->count_skipped != 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: count_skipped is %d; use 0 (each group's step count) "
                           "or 1 (the iteration count, skipped steps too: torch's)", s->count_skipped);
    if (!(s->warmup_start_factor >= 0.0 && s->warmup_start_factor <= 1.0))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: warmup_start_factor is %g; it must lie in [0, 1]",
                           s->warmup_start_factor);
    if (s->total_steps < 0 || s->total_steps > CAPEX_STEP_MAX)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: total_steps is %lld; it must lie in [0, 2^53]",
                           (long long)s->total_steps);
    switch (s->kind) {
    case CAPEX_LR_COSINE: case CAPEX_LR_LINEAR: case CAPEX_LR_POLYNOMIAL:
        if (s->total_steps <= s->warmup_steps)
            return capex__fail(CAPEX_ERR_CONFIG, "lr schedule: total_steps (%lld) must exceed warmup_steps (%lld): the "
                               "decay runs total_steps - warmup_steps steps", (long long)s->total_steps,
                               (long long)s->warmup_steps);
        if (!(s->min_factor >= 0.0 && s->min_factor <= 1.0))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: min_factor is %g; it must lie in [0, 1]",
                               s->min_factor);
        if (s->kind == CAPEX_LR_POLYNOMIAL && !(capex__lr_finite(s->power) && s->power >= 0.0))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: power is %g; it must be finite and >= 0", s->power);
        break;
    case CAPEX_LR_STEP: case CAPEX_LR_MULTISTEP: case CAPEX_LR_EXPONENTIAL:
        if (!(capex__lr_finite(s->gamma) && s->gamma >= 0.0))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: gamma is %g; it must be finite and >= 0", s->gamma);
        if (s->kind == CAPEX_LR_STEP && s->step_size <= 0)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: step_size is %lld; it must be > 0",
                               (long long)s->step_size);
        if (s->kind == CAPEX_LR_MULTISTEP) {
            if (s->num_milestones < 0 || s->num_milestones > CAPEX_LR_MAX_MILESTONES)
                return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: num_milestones is %d; it must lie in [0, "
                                   "CAPEX_LR_MAX_MILESTONES = %d]", s->num_milestones, CAPEX_LR_MAX_MILESTONES);
            for (k = 0; k < s->num_milestones; k++)
                if (s->milestones[k] < 0 || (k > 0 && s->milestones[k] < s->milestones[k - 1]))
                    return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: milestones[%d] is %lld; milestones must "
                                       "be >= 0 and non-decreasing", k, (long long)s->milestones[k]);
        }
        break;
    case CAPEX_LR_ONECYCLE: {
        double e1, e2;
        if (s->warmup_steps != 0)
            return capex__fail(CAPEX_ERR_CONFIG, "lr schedule: ONECYCLE has its own warmup phase (pct_start); set "
                               "warmup_steps to 0");
        if (s->total_steps <= 0)
            return capex__fail(CAPEX_ERR_CONFIG, "lr schedule: ONECYCLE needs total_steps > 0");
        if (!(s->pct_start >= 0.0 && s->pct_start <= 1.0))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: pct_start is %g; it must lie in [0, 1]",
                               s->pct_start);
        if (!(capex__lr_finite(s->div_factor) && s->div_factor > 0.0) ||
            !(capex__lr_finite(s->final_div_factor) && s->final_div_factor > 0.0))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "lr schedule: div_factor (%g) and final_div_factor (%g) must be "
                               "finite and > 0", s->div_factor, s->final_div_factor);
        /* torch divides by each phase's length: a zero-length phase is its ZeroDivisionError */
        e1 = s->pct_start * (double)s->total_steps - 1.0;
        e2 = 2.0 * s->pct_start * (double)s->total_steps - 2.0;
        if (e1 == 0.0 || (s->three_phase ? (e2 == e1 || (double)(s->total_steps - 1) == e2)
                                         : (double)(s->total_steps - 1) == e1))
            return capex__fail(CAPEX_ERR_CONFIG, "lr schedule: ONECYCLE with total_steps %lld and pct_start %g has a "
                               "phase of zero steps (torch divides by zero there); change either",
                               (long long)s->total_steps, s->pct_start);
        break;
    }
    default:
        break;
    }
    return CAPEX_OK;
}

static void capex__lr_params(const capex_lr_schedule *s, capex__lr_p *p) {
    int k;
    memset(p, 0, sizeof *p);
    p->kind = (long long)s->kind;
    p->warmup = s->kind == CAPEX_LR_ONECYCLE ? 0 : (long long)s->warmup_steps;
    p->total = (long long)s->total_steps;
    p->step_size = (long long)s->step_size;
    p->nmil = s->kind == CAPEX_LR_MULTISTEP ? s->num_milestones : 0;
    p->anneal_linear = s->anneal_linear != 0;
    p->three_phase = s->three_phase != 0;
    p->llmc = s->warmup_llmc;
    p->by_iter = s->count_skipped != 0;
    for (k = 0; k < (int)p->nmil; k++) p->mil[k] = (long long)s->milestones[k];
    p->start_factor = s->warmup_start_factor;
    p->min_factor = s->min_factor;
    p->power = s->power;
    p->gamma = s->gamma;
    p->pct_start = s->pct_start;
    p->div_factor = s->div_factor;
    p->final_div = s->final_div_factor;
}

CAPEX_API double capex_lr_at(const capex_lr_schedule *s, double base_lr, int64_t step) {
    capex__lr_p p;
    double v;
    if (capex_lr_schedule_check(s) != CAPEX_OK) return NAN;
    if (step < 0 || step > CAPEX_STEP_MAX) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_at: step is %lld; it must lie in [0, 2^53]", (long long)step);
        return NAN;
    }
    if (!(capex__lr_finite(base_lr) && base_lr >= 0.0)) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_at: base_lr is %g; it must be finite and >= 0", base_lr);
        return NAN;
    }
    capex__lr_params(s, &p);
    v = capex__lr_eval(&p, base_lr, (long long)step);
    if (!capex__lr_finite(v)) { /* gamma > 1 run long, or OneCycle's tiny div factors */
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_at: the lr at step %lld overflows (%g with base_lr %g); "
                          "check gamma, div_factor and final_div_factor", (long long)step, v, base_lr);
        return NAN;
    }
    return v;
}

CAPEX_API double capex_lr_scale_linear(double base_lr, int64_t global_batch, int64_t base_batch) {
    double v;
    if (global_batch <= 0 || base_batch <= 0) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_scale_linear: batches are %lld (global) and %lld (base); both "
                    "must be > 0", (long long)global_batch, (long long)base_batch);
        return NAN;
    }
    if (!(capex__lr_finite(base_lr) && base_lr >= 0.0)) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_scale_linear: base_lr is %g; it must be finite and >= 0",
                          base_lr);
        return NAN;
    }
    v = base_lr * (double)global_batch / (double)base_batch;
    if (!capex__lr_finite(v)) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "capex_lr_scale_linear: base_lr %g * %lld / %lld overflows a double",
                          base_lr, (long long)global_batch, (long long)base_batch);
        return NAN;
    }
    return v;
}

/* ---- optimizer object ---- */

typedef struct capex__optim_tensor {
    capex_optim_param p; /* exp_avg / exp_avg_sq: the buffers in use */
    size_t group;
    unsigned char own_m, own_v;
    unsigned char own_vm; /* amsgrad's max_exp_avg_sq allocated here */
    /* stochastic rounding's tensor id and first element index: this tensor's
       own (index, 0), or, for a ZeRO piece, those of the unsharded tensor it
       is cut from, so the rounding draws the same bits */
    size_t sr_tensor;
    int64_t sr_base;
} capex__optim_tensor;

typedef struct capex__optim_group {
    capex_optim_hparams hp;
    int64_t step;
    int mom_init; /* SGD: momentum buffers hold a value (torch: buffer exists) */
    int mom_bufs; /* SGD: added with momentum, so its tensors have buffers (from the config
                     alone: a ZeRO rank holding no piece of the group decides as the others) */
    size_t first, count;
} capex__optim_group;

typedef struct capex__optim_item {
    size_t tensor;
    int64_t off, n;
    int64_t at;     /* first element over all tensors (LAMB's update buffer) */
} capex__optim_item;

/* Per-group constants of one step. */
typedef struct capex__optim_gc {
    float lr, beta1, beta2, beta3, bc1, bc2, eps, wd, momentum, dampening;
    float clip_div; /* LAMB: Apex's clipped_global_grad_norm */
    unsigned int nesterov, first, wd_on, wd_before, wd_after; /* SGD: masks, ~0u or 0 */
    unsigned int step_lo, step_hi;
    float clr; /* Adagrad: lr / (1 + (step-1)*lr_decay) */
} capex__optim_gc;

struct capex_optim {
    capex_optim_desc desc;
    capex_allocator alloc;
    capex__optim_group *groups;
    capex__optim_gc *gc;
    size_t ngroups, cap_groups;
    capex__optim_tensor *tensors;
    size_t ntensors, cap_tensors;
    capex__optim_item *items;
    size_t nitems, cap_items;
    int64_t chunk;  /* elements per item (desc.exec.chunk_size) */
    capex_tensor *glist; /* LAMB: grads sorted by dtype, for capex_multi_tensor_sumsq */
    double *part;   /* LAMB: 2 partial sums per item */
    float *ratio;   /* LAMB: trust ratio per tensor */
    float *lamb_u;  /* LAMB: the update u of every element between the passes (NULL: recomputed) */
    float *novo_v;  /* NovoGrad: the average grad norm v per tensor (its state); ratio holds denom */
    int64_t total;  /* elements over all tensors */
    int broken;     /* a load failed half-way: refuse to step */
    void *host_block; /* capex_cuda_optim_to_host: the param/model copies it owns */
    int host_block_params; /* they hold weights (to_host or a load with CAPEX_OPTIM_STATE_PARAMS) */
    int has_sched;         /* an lr schedule is attached: lr = capex__lr_eval(sched_p, hp.lr, step) */
    capex_lr_schedule sched;
    capex__lr_p sched_p;
    int64_t sched_iter;    /* step calls (skipped ones too) while a schedule was attached */
    /* Sharded LAMB (capex_zero): where this optimizer's tensors are pieces of
       params split across ranks. what 0: vals[0], the sum of squares of the
       raw grads here, becomes the global one; what 1: vals[2k], vals[2k+1]
       (|p|^2, |u|^2 of tensor k) become those of k's whole parameter. */
    capex_result (*reduce_fn)(void *user, int what, double *vals, size_t n);
    void *reduce_user;
    int sealed; /* capex_zero's: its tensors are shard pieces, so add_group is refused */
};

typedef struct capex__optim_job {
    const void *g;
    float *p, *m, *v;
    void *h;
    int64_t n;
    float gs, ratio;
    unsigned int key, base_lo;
    const capex__optim_gc *c;
    double *acc; /* LAMB: [0] sum p^2 or g^2, [1] sum u^2 */
    float *u;    /* LAMB: the item's updates, written by stage 1, read by stage 2; NULL: recompute */
    float *vm;   /* Adam amsgrad: max_exp_avg_sq; NULL: none */
} capex__optim_job;

typedef void (*capex__optim_kfn)(const capex__optim_job *j);

#define CAPEX__OPT_GT_f32 float
#define CAPEX__OPT_GT_f16 uint16_t
#define CAPEX__OPT_GT_bf16 uint16_t
#define CAPEX__OPT_LD_f32(x) (x)
/* fp16 on the CPU goes through the core's select-only conversions (the same
   bits as capex__h16_load/store, tested exhaustively): GCC vectorises loops
   with them, while the kernels' versions kept every fp16 loop scalar
   (AdamW master + fp16 at 1M elements: 4.58 -> 1.22 ms, 1 thread). */
#define CAPEX__OPT_LD_f16(x) capex__f16_to_f32_v(x)
#define CAPEX__OPT_LD_bf16(x) capex__b16_load(x)
#define CAPEX__OPT_ST_none(h, i, x, j) (void)0
#define CAPEX__OPT_ST_f16(h, i, x, j) (h)[i] = capex__f32_to_f16_v(x)
#define CAPEX__OPT_ST_bf16(h, i, x, j) (h)[i] = (uint16_t)capex__b16_store(x)
#define CAPEX__OPT_ST_bf16sr(h, i, x, j) \
    (h)[i] = (uint16_t)capex__bf16_round_sr(x, capex__sr_bits((j)->key, (j)->base_lo + (unsigned int)(i)))

/* Instantiate K for every (grad dtype, model copy) pair / each alone. */
#define CAPEX__OPT_FOR_GM(K)                                                   \
    K(f32, none) K(f32, f16) K(f32, bf16) K(f32, bf16sr)                       \
    K(f16, none) K(f16, f16) K(f16, bf16) K(f16, bf16sr)                       \
    K(bf16, none) K(bf16, f16) K(bf16, bf16) K(bf16, bf16sr)
#define CAPEX__OPT_FOR_G(K) K(f32) K(f16) K(bf16)
#define CAPEX__OPT_FOR_M(K) K(none) K(f16) K(bf16) K(bf16sr)

#define CAPEX__OPT_PROLOGUE(GN)                                                \
    const CAPEX__OPT_GT_##GN *CAPEX__OPT_RESTRICT g = (const CAPEX__OPT_GT_##GN *)j->g; \
    float *CAPEX__OPT_RESTRICT p = j->p;                                       \
    float *CAPEX__OPT_RESTRICT m = j->m;                                       \
    float *CAPEX__OPT_RESTRICT v = j->v;                                       \
    uint16_t *CAPEX__OPT_RESTRICT h = (uint16_t *)j->h;                        \
    const capex__optim_gc c = *j->c;                                           \
    const float gs = j->gs;                                                    \
    const int64_t n = j->n;                                                    \
    int64_t i;                                                                 \
    (void)g; (void)m; (void)v; (void)h; (void)c; (void)gs

#define CAPEX__OPT_K_ADAM(GN, MN)                                              \
    CAPEX__PRIVATE void capex__k_adam_l2_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__adam_l2_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &m[i], &v[i], c.beta1, \
                                           c.beta2, c.bc1, c.bc2, c.eps, c.lr, c.wd); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }                                                                          \
    CAPEX__PRIVATE void capex__k_adam_w_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__adam_w_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &m[i], &v[i], c.beta1, \
                                          c.beta2, c.bc1, c.bc2, c.eps, c.lr, c.wd); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }

#define CAPEX__OPT_K_SGD(GN, MN)                                               \
    CAPEX__PRIVATE void capex__k_sgd_##GN##_##MN(const capex__optim_job *j) {  \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__sgd_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, c.wd, c.lr, c.wd_on); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }                                                                          \
    CAPEX__PRIVATE void capex__k_sgdm_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__sgd_mom_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &m[i], c.wd, c.momentum, \
                                           c.dampening, c.lr, c.nesterov, c.first, c.wd_before, c.wd_after); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }

/* LAMB stage 1: moments, and |p|^2 (before the update) and |u|^2 partials in
   double, lane i%8, lanes combined by the 8-lane tree (capex_multi_tensor_sumsq
   now uses 16 lanes; these partials are internal to LAMB). */
#define CAPEX__OPT_LAMB1_ELEM(GN, MODE, P, M, V, k, gk)                        \
    do {                                                                       \
        float gi = CAPEX__OPT_BLD_##GN(gk) * gs;                               \
        float pk = P[k];                                                       \
        gi = CAPEX__OPT_LAMB_G_##MODE(gi, pk, c);                              \
        capex__lamb_moments_elem(gi, &M[k], &V[k], c.beta1, c.beta2, c.beta3); \
        uu = CAPEX__OPT_LAMB_U_##MODE(pk, M[k], V[k], c);                      \
    } while (0)
#define CAPEX__OPT_LAMB_G_l2(gi, pk, c) capex__lamb_grad_l2(gi, pk, (c).clip_div, (c).wd)
#define CAPEX__OPT_LAMB_G_w(gi, pk, c) capex__lamb_grad_w(gi, (c).clip_div)
#define CAPEX__OPT_LAMB_U_l2(pk, mk, vk, c) capex__lamb_update_l2(pk, mk, vk, (c).bc1, (c).bc2, (c).eps)
#define CAPEX__OPT_LAMB_U_w(pk, mk, vk, c) capex__lamb_update_w(pk, mk, vk, (c).bc1, (c).bc2, (c).eps, (c).wd)

/* LAMB stage 1 reads its gradients a block at a time: fp16 ones converted
   into a buffer first (F16C where the CPU has it; the same values). */
#define CAPEX__OPT_BT_f32 float
#define CAPEX__OPT_BT_f16 float
#define CAPEX__OPT_BT_bf16 uint16_t
#define CAPEX__OPT_BLK_f32(g, i, nb, buf) ((void)(buf), (g) + (i))
#define CAPEX__OPT_BLK_f16(g, i, nb, buf) (capex__f16_load_n((g) + (i), (buf), (size_t)(nb)), (const float *)(buf))
#define CAPEX__OPT_BLK_bf16(g, i, nb, buf) ((void)(buf), (g) + (i))
#define CAPEX__OPT_BLD_f32(x) (x)
#define CAPEX__OPT_BLD_f16(x) (x)
#define CAPEX__OPT_BLD_bf16(x) capex__b16_load(x)
/* The two halves' update loop: restrict parameters (not block-scope
   pointers, which GCC does not trust, nor inlined ones, whose restrict GCC
   drops) let it vectorise both chains. */
#if defined(__GNUC__) || defined(__clang__)
#  define CAPEX__OPT_NOINLINE __attribute__((noinline))
#else
#  define CAPEX__OPT_NOINLINE
#endif
#define CAPEX__OPT_K_LAMB1_UPD(GN, MODE)                                       \
    CAPEX__OPT_NOINLINE CAPEX__PRIVATE void capex__lamb1_upd_##MODE##_##GN(    \
        const CAPEX__OPT_BT_##GN *CAPEX__OPT_RESTRICT g0, const CAPEX__OPT_BT_##GN *CAPEX__OPT_RESTRICT g1, \
        float *CAPEX__OPT_RESTRICT p0, float *CAPEX__OPT_RESTRICT p1, float *CAPEX__OPT_RESTRICT m0, \
        float *CAPEX__OPT_RESTRICT m1, float *CAPEX__OPT_RESTRICT v0, float *CAPEX__OPT_RESTRICT v1, \
        float *CAPEX__OPT_RESTRICT u0, float *CAPEX__OPT_RESTRICT u1, int64_t h2, \
        const capex__optim_gc *cp, float gs) {                                 \
        const capex__optim_gc c = *cp;                                         \
        int64_t l;                                                             \
        CAPEX__OPT_SIMD for (l = 0; l < h2; l++) {                             \
            float uu;                                                          \
            CAPEX__OPT_LAMB1_ELEM(GN, MODE, p0, m0, v0, l, g0[l]);             \
            u0[l] = uu;                                                        \
            CAPEX__OPT_LAMB1_ELEM(GN, MODE, p1, m1, v1, l, g1[l]);             \
            u1[l] = uu;                                                        \
        }                                                                      \
    }
#define CAPEX__OPT_K_LAMB1(GN)                                                 \
    CAPEX__OPT_K_LAMB1_UPD(GN, l2) CAPEX__OPT_K_LAMB1_UPD(GN, w)               \
    CAPEX__OPT_K_LAMB1_MODE(GN, l2) CAPEX__OPT_K_LAMB1_MODE(GN, w)
#define CAPEX__OPT_K_LAMB1_MODE(GN, MODE)                                      \
    CAPEX__PRIVATE void capex__k_lamb1_##MODE##_##GN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        double ap[8] = {0, 0, 0, 0, 0, 0, 0, 0}, au[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sp, su; \
        int64_t l;                                                             \
        float ub[256], gbuf[256];                                              \
        /* blocks of up to 256: the update loop and the squares loop each run  \
           long enough to vectorise and overlap; lane l still sums elements l, \
           l+8, ... in order (the bits of one 8-wide loop). The update loop    \
           walks the block's two halves side by side: two independent chains  \
           of 4 divisions and a square root per iteration keep the divider     \
           busy (one chain left f32/fp16 gradients 1.3x slower than bf16,      \
           whose narrow loads made GCC do two vectors per iteration). */       \
        for (i = 0; i < n;) {                                                  \
            int64_t nb = n - i < 256 ? n - i : 256, b, h2 = nb / 2;            \
            float *CAPEX__OPT_RESTRICT u = j->u ? j->u + i : ub;               \
            const CAPEX__OPT_BT_##GN *CAPEX__OPT_RESTRICT gb = CAPEX__OPT_BLK_##GN(g, i, nb, gbuf); \
            capex__lamb1_upd_##MODE##_##GN(gb, gb + h2, p + i, p + i + h2, m + i, m + i + h2, v + i, v + i + h2, \
                                           u, u + h2, h2, &c, gs);             \
            if (nb & 1) {                                                      \
                float uu;                                                      \
                CAPEX__OPT_LAMB1_ELEM(GN, MODE, p, m, v, i + nb - 1, gb[nb - 1]); \
                u[nb - 1] = uu;                                                \
            }                                                                  \
            for (b = 0; b + 8 <= nb; b += 8)                                   \
                for (l = 0; l < 8; l++) {                                      \
                    ap[l] += (double)p[i + b + l] * p[i + b + l];              \
                    au[l] += (double)u[b + l] * u[b + l];                      \
                }                                                              \
            for (l = 0; b + l < nb; l++) {                                     \
                ap[l] += (double)p[i + b + l] * p[i + b + l];                  \
                au[l] += (double)u[b + l] * u[b + l];                          \
            }                                                                  \
            i += nb;                                                           \
        }                                                                      \
        sp = ((ap[0] + ap[1]) + (ap[2] + ap[3])) + ((ap[4] + ap[5]) + (ap[6] + ap[7])); \
        su = ((au[0] + au[1]) + (au[2] + au[3])) + ((au[4] + au[5]) + (au[6] + au[7])); \
        j->acc[0] = sp;                                                        \
        j->acc[1] = su;                                                        \
    }

/* LAMB stage 2: p -= ratio*u, u as stage 1 left it, or recomputed from the
   new m, v and old p (the same operations: the same bits). */
#define CAPEX__OPT_K_LAMB2(MN)                                                 \
    CAPEX__PRIVATE void capex__k_lamb2_u_##MN(const capex__optim_job *j) {     \
        CAPEX__OPT_PROLOGUE(f32);                                              \
        const float r = j->ratio;                                              \
        const float *CAPEX__OPT_RESTRICT u = j->u;                             \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__lamb_apply(p[i], u[i], r);                       \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }                                                                          \
    CAPEX__PRIVATE void capex__k_lamb2_l2_##MN(const capex__optim_job *j) {    \
        CAPEX__OPT_PROLOGUE(f32);                                              \
        const float r = j->ratio;                                              \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__lamb_apply(p[i], capex__lamb_update_l2(p[i], m[i], v[i], c.bc1, c.bc2, c.eps), r); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }                                                                          \
    CAPEX__PRIVATE void capex__k_lamb2_w_##MN(const capex__optim_job *j) {     \
        CAPEX__OPT_PROLOGUE(f32);                                              \
        const float r = j->ratio;                                              \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__lamb_apply(p[i], capex__lamb_update_w(p[i], m[i], v[i], c.bc1, c.bc2, c.eps, c.wd), r); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }

/* NovoGrad pass 1: sum of (g*gs)^2 of the item in double, lane i%8, lanes
   combined as capex_multi_tensor_sumsq does: the grads the update sees. */
#define CAPEX__OPT_K_NOVO1(GN)                                                 \
    CAPEX__PRIVATE void capex__k_novo1_##GN(const capex__optim_job *j) {       \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        double a8[8] = {0, 0, 0, 0, 0, 0, 0, 0};                               \
        int64_t l;                                                             \
        (void)p;                                                               \
        for (i = 0; i + 8 <= n; i += 8)                                        \
            for (l = 0; l < 8; l++) {                                          \
                double x = (double)(CAPEX__OPT_LD_##GN(g[i + l]) * gs);        \
                a8[l] += x * x;                                                \
            }                                                                  \
        for (l = 0; i + l < n; l++) {                                          \
            double x = (double)(CAPEX__OPT_LD_##GN(g[i + l]) * gs);            \
            a8[l] += x * x;                                                    \
        }                                                                      \
        j->acc[0] = ((a8[0] + a8[1]) + (a8[2] + a8[3])) + ((a8[4] + a8[5]) + (a8[6] + a8[7])); \
    }
/* NovoGrad pass 2: the element update; j->ratio carries the tensor's denom. */
#define CAPEX__OPT_K_NOVO(GN, MN)                                              \
    CAPEX__OPT_K_NOVO_MODE(GN, MN, mom) CAPEX__OPT_K_NOVO_MODE(GN, MN, reg)
#define CAPEX__OPT_K_NOVO_MODE(GN, MN, MODE)                                   \
    CAPEX__PRIVATE void capex__k_novo_##MODE##_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        const float denom = j->ratio;                                          \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__novo_##MODE##_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &m[i], c.beta1, \
                                                 c.beta3, c.bc1, denom, c.lr, c.wd); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }
/* Adam amsgrad and Adagrad (v: Adagrad's sum). */
#define CAPEX__OPT_K_AMS_ADAGRAD(GN, MN)                                       \
    CAPEX__OPT_K_AMS_MODE(GN, MN, l2) CAPEX__OPT_K_AMS_MODE(GN, MN, w)         \
    CAPEX__OPT_K_ADAGRAD_MODE(GN, MN, l2) CAPEX__OPT_K_ADAGRAD_MODE(GN, MN, w)
#define CAPEX__OPT_K_AMS_MODE(GN, MN, MODE)                                    \
    CAPEX__PRIVATE void capex__k_adam_ams_##MODE##_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        float *CAPEX__OPT_RESTRICT vm = j->vm;                                 \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__adam_ams_##MODE##_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &m[i], &v[i], &vm[i], \
                                                     c.beta1, c.beta2, c.bc1, c.bc2, c.eps, c.lr, c.wd); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }
#define CAPEX__OPT_K_ADAGRAD_MODE(GN, MN, MODE)                                \
    CAPEX__PRIVATE void capex__k_adagrad_##MODE##_##GN##_##MN(const capex__optim_job *j) { \
        CAPEX__OPT_PROLOGUE(GN);                                               \
        CAPEX__OPT_SIMD for (i = 0; i < n; i++) {                              \
            float pi = capex__adagrad_##MODE##_elem(p[i], CAPEX__OPT_LD_##GN(g[i]) * gs, &v[i], c.eps, c.clr, c.wd); \
            p[i] = pi;                                                         \
            CAPEX__OPT_ST_##MN(h, i, pi, j);                                   \
        }                                                                      \
    }

CAPEX__OPT_FOR_GM(CAPEX__OPT_K_ADAM)
CAPEX__OPT_FOR_GM(CAPEX__OPT_K_SGD)
CAPEX__OPT_FOR_G(CAPEX__OPT_K_NOVO1)
CAPEX__OPT_FOR_GM(CAPEX__OPT_K_NOVO)
CAPEX__OPT_FOR_GM(CAPEX__OPT_K_AMS_ADAGRAD)
CAPEX__OPT_FOR_G(CAPEX__OPT_K_LAMB1)
CAPEX__OPT_FOR_M(CAPEX__OPT_K_LAMB2)

#define CAPEX__OPT_ROW(name, GN) {name##_##GN##_none, name##_##GN##_f16, name##_##GN##_bf16, name##_##GN##_bf16sr}
#define CAPEX__OPT_TAB(name) {CAPEX__OPT_ROW(name, f32), CAPEX__OPT_ROW(name, f16), CAPEX__OPT_ROW(name, bf16)}
static const capex__optim_kfn capex__k_adam_l2_tab[3][4] = CAPEX__OPT_TAB(capex__k_adam_l2);
static const capex__optim_kfn capex__k_adam_w_tab[3][4] = CAPEX__OPT_TAB(capex__k_adam_w);
static const capex__optim_kfn capex__k_sgd_tab[3][4] = CAPEX__OPT_TAB(capex__k_sgd);
static const capex__optim_kfn capex__k_sgdm_tab[3][4] = CAPEX__OPT_TAB(capex__k_sgdm);
static const capex__optim_kfn capex__k_novo1_tab[3] = {capex__k_novo1_f32, capex__k_novo1_f16, capex__k_novo1_bf16};
static const capex__optim_kfn capex__k_novo_mom_tab[3][4] = CAPEX__OPT_TAB(capex__k_novo_mom);
static const capex__optim_kfn capex__k_novo_reg_tab[3][4] = CAPEX__OPT_TAB(capex__k_novo_reg);
static const capex__optim_kfn capex__k_adam_ams_tab[2][3][4] = {CAPEX__OPT_TAB(capex__k_adam_ams_l2),
                                                                CAPEX__OPT_TAB(capex__k_adam_ams_w)};
static const capex__optim_kfn capex__k_adagrad_tab[2][3][4] = {CAPEX__OPT_TAB(capex__k_adagrad_l2),
                                                               CAPEX__OPT_TAB(capex__k_adagrad_w)};
static const capex__optim_kfn capex__k_lamb1_tab[2][3] = {
    {capex__k_lamb1_l2_f32, capex__k_lamb1_l2_f16, capex__k_lamb1_l2_bf16},
    {capex__k_lamb1_w_f32, capex__k_lamb1_w_f16, capex__k_lamb1_w_bf16}};
static const capex__optim_kfn capex__k_lamb2_tab[3][4] = {
    {capex__k_lamb2_l2_none, capex__k_lamb2_l2_f16, capex__k_lamb2_l2_bf16, capex__k_lamb2_l2_bf16sr},
    {capex__k_lamb2_w_none, capex__k_lamb2_w_f16, capex__k_lamb2_w_bf16, capex__k_lamb2_w_bf16sr},
    {capex__k_lamb2_u_none, capex__k_lamb2_u_f16, capex__k_lamb2_u_bf16, capex__k_lamb2_u_bf16sr}}; /* [2]: u kept */

/* ---- public API ---- */

static int capex__opt_finite(float x) { return (x - x) == 0.0f; }

#define CAPEX__OPTIM_DESC_TAG CAPEX__TAG('O', 'P', 'T', 'M')
CAPEX_API void capex_optim_desc_init(capex_optim_desc *d, capex_optim_kind kind) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__OPTIM_DESC_TAG;
    d->kind = kind;
    d->defaults.lr = 1e-3f;
    d->defaults.beta1 = 0.9f;
    d->defaults.beta2 = 0.999f;
    d->defaults.eps = kind == CAPEX_OPTIM_LAMB ? 1e-6f : 1e-8f;
    d->defaults.weight_decay = kind == CAPEX_OPTIM_LAMB ? 0.01f : 0.0f;
    d->defaults.bias_correction = 1;
    d->defaults.grad_averaging = 1;
    d->adam_w_mode = 1;
    d->max_grad_norm = 1.0f;
    d->norm_type = 2; /* NovoGrad: Apex's default L2 */
    if (kind == CAPEX_OPTIM_ADAGRAD) { /* Apex FusedAdagrad / torch.optim.Adagrad defaults */
        d->defaults.lr = 1e-2f;
        d->defaults.eps = 1e-10f;
        d->adam_w_mode = 0;
    }
    capex_tensor_op_desc_init(&d->exec);
}

#define CAPEX__TAG_OPTIM_PARAM CAPEX__TAG('O', 'P', 'R', 'M')
CAPEX_API void capex_optim_param_init(capex_optim_param *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->init_tag = CAPEX__TAG_OPTIM_PARAM;
    p->grad_dtype = CAPEX_F32;
    p->model_dtype = CAPEX_BF16;
}

static capex_result capex__optim_check_hp(const capex_optim_desc *d, const capex_optim_hparams *hp) {
    if (!capex__opt_finite(hp->lr) || hp->lr < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: lr is %g; it must be finite and >= 0", (double)hp->lr);
    if (!capex__opt_finite(hp->weight_decay) || hp->weight_decay < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: weight_decay is %g; it must be finite and >= 0",
                           (double)hp->weight_decay);
    if (d->kind == CAPEX_OPTIM_SGD) {
        if (!capex__opt_finite(hp->momentum) || hp->momentum < 0.0f)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "SGD: momentum is %g; it must be finite and >= 0",
                               (double)hp->momentum);
        if (!capex__opt_finite(hp->dampening))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "SGD: dampening is %g; it must be finite", (double)hp->dampening);
        if (hp->nesterov && (hp->momentum <= 0.0f || hp->dampening != 0.0f))
            return capex__fail(CAPEX_ERR_CONFIG,
                               "SGD: nesterov momentum requires momentum > 0 and dampening 0 (got momentum %g, "
                               "dampening %g), as torch.optim.SGD and Apex FusedSGD",
                               (double)hp->momentum, (double)hp->dampening);
    } else if (d->kind == CAPEX_OPTIM_ADAGRAD) {
        /* torch.optim.Adagrad's checks */
        if (!capex__opt_finite(hp->lr_decay) || hp->lr_decay < 0.0f)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "Adagrad: lr_decay is %g; it must be finite and >= 0",
                               (double)hp->lr_decay);
        if (!capex__opt_finite(hp->initial_accumulator_value) || hp->initial_accumulator_value < 0.0f)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "Adagrad: initial_accumulator_value is %g; it must be finite "
                               "and >= 0", (double)hp->initial_accumulator_value);
        if (!capex__opt_finite(hp->eps) || hp->eps < 0.0f)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "Adagrad: eps is %g; it must be finite and >= 0", (double)hp->eps);
    } else {
        if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: betas are (%g, %g); each must be in [0, 1)",
                               (double)hp->beta1, (double)hp->beta2);
        if (!capex__opt_finite(hp->eps) || hp->eps < 0.0f)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: eps is %g; it must be finite and >= 0",
                               (double)hp->eps);
    }
    return CAPEX_OK;
}

static capex_result capex__optim_check_desc(const capex_optim_desc *d) {
    if (d->init_tag != CAPEX__OPTIM_DESC_TAG)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_desc was not made by capex_optim_desc_init (zeroed or "
                           "uninitialised: its lr would be 0); call capex_optim_desc_init(&desc, kind), then change fields");
    if (d->kind != CAPEX_OPTIM_ADAM && d->kind != CAPEX_OPTIM_LAMB && d->kind != CAPEX_OPTIM_SGD &&
        d->kind != CAPEX_OPTIM_NOVOGRAD && d->kind != CAPEX_OPTIM_ADAGRAD)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: unknown kind %d; use CAPEX_OPTIM_ADAM, _LAMB, _SGD, "
                           "_ADAGRAD or _NOVOGRAD", (int)d->kind);
    if (d->kind == CAPEX_OPTIM_NOVOGRAD && d->norm_type != 2)
        return capex__fail(CAPEX_ERR_CONFIG, "NovoGrad: norm_type %d is not supported; only 2 (per-tensor L2 norm, "
                           "Apex's default) is; Apex's 0 (inf norm) is not implemented", d->norm_type);
    if (!capex__opt_finite(d->max_grad_norm) || d->max_grad_norm < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "LAMB: max_grad_norm is %g; it must be finite and >= 0 (0: no clip)",
                           (double)d->max_grad_norm);
    if (capex__check_desc("capex_optim_create (desc.exec)", &d->exec) != CAPEX_OK) return CAPEX_ERR_INVALID_ARG;
    if (!capex__allocator_ok(d->allocator))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: allocator needs both alloc and free");
    return capex__optim_check_hp(d, &d->defaults);
}

static int capex__opt_misaligned(const void *p, size_t a) { return ((uintptr_t)p % a) != 0; }

static capex_result capex__optim_check_param(const capex_optim_desc *d, const capex_optim_param *p, size_t k) {
    if (p->init_tag != CAPEX__TAG_OPTIM_PARAM)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer add_group: params[%zu] was not made by capex_optim_param_init "
                           "(zeroed or uninitialised); call capex_optim_param_init on it first, then set its fields", k);
    if (p->numel < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: params[%zu].numel is %lld; it must be >= 0", k,
                           (long long)p->numel);
    if ((uint64_t)p->numel > (uint64_t)(SIZE_MAX / 4))
        return capex__fail(CAPEX_ERR_LIMIT, "optimizer: params[%zu].numel %lld does not fit in memory", k,
                           (long long)p->numel);
    if (p->grad_dtype != CAPEX_F32 && p->grad_dtype != CAPEX_F16 && p->grad_dtype != CAPEX_BF16)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: params[%zu].grad_dtype %d is not f32, f16 or bf16", k,
                           (int)p->grad_dtype);
    if (p->model && p->model_dtype != CAPEX_F16 && p->model_dtype != CAPEX_BF16)
        return capex__fail(CAPEX_ERR_INVALID_ARG,
                           "optimizer: params[%zu].model_dtype must be CAPEX_F16 or CAPEX_BF16 for a model copy", k);
    if (p->pure_half && !p->model && p->numel)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: params[%zu].pure_half needs the fp16/bf16 weights in "
                           "model (the fp32 param then only mirrors them)", k);
    if (p->numel == 0) return CAPEX_OK;
    if (!p->param || !p->grad)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer: params[%zu] has a NULL %s pointer", k,
                           p->param ? "grad" : "param");
    if (capex__opt_misaligned(p->param, 4) || capex__opt_misaligned(p->grad, capex_dtype_size(p->grad_dtype)) ||
        (p->model && capex__opt_misaligned(p->model, 2)) || (p->exp_avg && capex__opt_misaligned(p->exp_avg, 4)) ||
        (p->exp_avg_sq && capex__opt_misaligned(p->exp_avg_sq, 4)) ||
        (p->max_exp_avg_sq && capex__opt_misaligned(p->max_exp_avg_sq, 4)))
        return capex__fail(CAPEX_ERR_INVALID_ARG,
                           "optimizer: params[%zu] has a pointer not aligned to its element size", k);
    (void)d;
    return CAPEX_OK;
}

/* The byte range [lo, hi) of one buffer an optimizer writes. */
typedef struct capex__span { uintptr_t lo, hi; } capex__span;
static int capex__span_cmp(const void *a, const void *b) {
    uintptr_t x = ((const capex__span *)a)->lo, y = ((const capex__span *)b)->lo;
    return x < y ? -1 : x > y;
}
/* p's written buffers (param, moments, model copy; sizes checked before) into
   v[0..4]; returns how many. used: bit j for pt[j] below, the ones the kind
   and hparams use (capex__optim_used); the others are ignored, as by add_group. */
static size_t capex__optim_spans(const capex_optim_param *p, unsigned used, capex__span *v) {
    const void *pt[5];
    static const uintptr_t es[5] = {4, 4, 4, 2, 4};
    size_t j, c = 0;
    if (p->numel <= 0) return 0;
    pt[0] = p->param; pt[1] = p->exp_avg; pt[2] = p->exp_avg_sq; pt[3] = p->model; pt[4] = p->max_exp_avg_sq;
    for (j = 0; j < 5; j++)
        if (pt[j] && (used >> j & 1u)) {
            v[c].lo = (uintptr_t)pt[j];
            v[c].hi = v[c].lo + (uintptr_t)p->numel * es[j];
            c++;
        }
    return c;
}

/* torch.optim: "some parameters appear in more than one parameter group". A
   param, moment buffer or model copy given twice (in this group, or already in
   the optimizer) would be updated twice per step, or read as m and written as
   v (the kernels declare them restrict); so would one overlapping another. */
/* The slots of capex__optim_spans that kind d with hparams hp reads and writes
   (add_group allocates and keeps exactly these moments): param and model,
   m (not Adagrad; SGD with momentum only), v (not SGD, NovoGrad), max v (amsgrad). */
static unsigned capex__optim_used(const capex_optim_desc *d, const capex_optim_hparams *hp) {
    int m = d->kind == CAPEX_OPTIM_SGD ? hp->momentum != 0.0f : d->kind != CAPEX_OPTIM_ADAGRAD;
    int v = d->kind != CAPEX_OPTIM_SGD && d->kind != CAPEX_OPTIM_NOVOGRAD;
    int vm = d->kind == CAPEX_OPTIM_ADAM && hp->amsgrad;
    return 1u | 8u | (m ? 2u : 0u) | (v ? 4u : 0u) | (vm ? 16u : 0u);
}

CAPEX__PRIVATE capex_result capex__optim_check_aliases(const void *old, size_t old_stride, size_t n_old,
                                                      const capex_allocator *a, const capex_optim_param *params, size_t n,
                                                      const capex_optim_desc *d, const capex_optim_hparams *hp,
                                                      const char *fn) {
    size_t cap = 5 * (n_old + n), cnt = 0, i, k;
    capex__span *v, dup = {0, 0}, mine[5];
    uintptr_t end = 0;
    unsigned used = capex__optim_used(d, hp); /* old tensors: their unused slots are NULL already */
    capex_result r = CAPEX_OK;
    if (!cap) return CAPEX_OK;
    if (!(v = (capex__span *)capex__alloc(a, cap * sizeof *v))) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* old: n_old records of old_stride bytes, each starting with a capex_optim_param */
    for (k = 0; k < n_old; k++)
        cnt += capex__optim_spans((const capex_optim_param *)(const void *)((const char *)old + k * old_stride), 31u, v + cnt);
    for (k = 0; k < n; k++) cnt += capex__optim_spans(&params[k], used, v + cnt);
    qsort(v, cnt, sizeof *v, capex__span_cmp);
    for (i = 0; i < cnt; i++) { /* sorted by start: one starting before the furthest end so far overlaps */
        if (i > 0 && v[i].lo < end) { dup = v[i]; break; }
        if (v[i].hi > end) end = v[i].hi;
    }
    capex__free(a, v);
    for (k = 0; dup.hi && k < n; k++) {
        size_t j, c = capex__optim_spans(&params[k], used, mine);
        for (j = 0; j < c; j++)
            if (mine[j].lo < dup.hi && dup.lo < mine[j].hi) break;
        if (j < c) {
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: params[%zu] gives a param, moment buffer or model copy that "
                            "appears more than once or overlaps another (at %p, in this group or an earlier one); "
                            "each tensor may belong to one group only and its buffers may not overlap", fn, k,
                            (void *)dup.lo);
            break;
        }
    }
    if (dup.hi && r == CAPEX_OK)
        r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: a param, moment buffer or model copy overlaps another (at %p)", fn,
                        (void *)dup.lo);
    return r;
}

/* Items never cross a multiple of 2^32 elements, so the stochastic-rounding
   key's high index word is constant within an item. */
static int64_t capex__optim_item_len(int64_t numel, int64_t off, int64_t chunk) {
    int64_t n = numel - off < chunk ? numel - off : chunk;
    int64_t to_boundary = (int64_t)(((uint64_t)off | 0xffffffffull) + 1 - (uint64_t)off);
    return n < to_boundary ? n : to_boundary;
}
static size_t capex__optim_count_items(int64_t numel, int64_t chunk) {
    size_t k = 0;
    int64_t off = 0;
    if (chunk > ((int64_t)1 << 32)) chunk = (int64_t)1 << 32; /* items stop at 2^32 boundaries anyway (no overflow below) */
    if (((int64_t)1 << 32) % chunk == 0) /* common case: closed form */
        return (size_t)((numel + chunk - 1) / chunk);
    while (off < numel) { off += capex__optim_item_len(numel, off, chunk); k++; }
    return k;
}

/* LAMB: sum of squares of every (raw) grad, one capex_multi_tensor_sumsq per
   grad dtype (f32, f16, bf16 lists, added in that order). */
static capex_result capex__optim_grad_sumsq(capex_optim *o, double *g2) {
    size_t k, cnt[3] = {0, 0, 0}, start[3];
    int d;
    *g2 = 0.0;
    for (k = 0; k < o->ntensors; k++) cnt[o->tensors[k].p.grad_dtype]++;
    start[0] = 0; start[1] = cnt[0]; start[2] = cnt[0] + cnt[1];
    for (k = 0; k < o->ntensors; k++) {
        const capex__optim_tensor *t = &o->tensors[k];
        capex_tensor *x = &o->glist[start[t->p.grad_dtype]++];
        x->data = (void *)t->p.grad;
        x->numel = t->p.numel;
    }
    for (d = 0; d < 3; d++) {
        capex_tensor_list l;
        double s = 0.0;
        capex_result r;
        if (!cnt[d]) continue;
        l = capex_tensor_list_make((capex_dtype)d, o->glist + (start[d] - cnt[d]), cnt[d]);
        r = capex_multi_tensor_sumsq(&o->desc.exec, &l, &s, NULL);
        if (r != CAPEX_OK) return r;
        *g2 += s;
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_create(const capex_optim_desc *desc, capex_optim **out) {
    capex_optim *o;
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_create: out is NULL");
    *out = NULL;
    if (!desc) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_create: desc is NULL; use capex_optim_desc_init");
    if ((r = capex__optim_check_desc(desc)) != CAPEX_OK) return r;
    o = (capex_optim *)capex__alloc(desc->allocator, sizeof *o);
    if (!o) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_create: out of memory");
    memset(o, 0, sizeof *o);
    o->desc = *desc;
    if (desc->allocator) o->alloc = *desc->allocator;
    o->desc.allocator = NULL;
    o->chunk = desc->exec.chunk_size ? desc->exec.chunk_size : 65536;
    *out = o;
    return CAPEX_OK;
}

static const capex_allocator *capex__optim_alloc(const capex_optim *o) { return o->alloc.alloc ? &o->alloc : NULL; }

CAPEX_API void capex_optim_destroy(capex_optim *o) {
    size_t k;
    const capex_allocator *a;
    if (!o) return;
    a = capex__optim_alloc(o);
    for (k = 0; k < o->ntensors; k++) {
        if (o->tensors[k].own_m) capex__free(a, o->tensors[k].p.exp_avg);
        if (o->tensors[k].own_v) capex__free(a, o->tensors[k].p.exp_avg_sq);
        if (o->tensors[k].own_vm) capex__free(a, o->tensors[k].p.max_exp_avg_sq);
    }
    capex__free(a, o->groups);
    capex__free(a, o->gc);
    capex__free(a, o->tensors);
    capex__free(a, o->items);
    capex__free(a, o->part);
    capex__free(a, o->ratio);
    capex__free(a, o->lamb_u);
    capex__free(a, o->novo_v);
    capex__free(a, o->glist);
    capex__free(a, o->host_block);
    {
        capex_allocator copy = o->alloc;
        capex__free(copy.alloc ? &copy : NULL, o);
    }
}

/* pure_half: param = f32(model), elementwise (exact). */
static void capex__optim_mirror_model(const capex_optim_param *p) {
    if (p->model_dtype == CAPEX_F16) capex_f16_to_f32_array((const uint16_t *)p->model, p->param, (size_t)p->numel);
    else capex_bf16_to_f32_array((const uint16_t *)p->model, p->param, (size_t)p->numel);
}

CAPEX_API capex_result capex_optim_param_from_amp(const capex_amp_config *cfg, float *fp32_weights, void *half_weights,
                                                  const void *grad, int64_t numel, capex_optim_param *p) {
    static const char *fn = "capex_optim_param_from_amp";
    capex_result r;
    if (!p) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: p is NULL", fn);
    if (p->init_tag != CAPEX__TAG_OPTIM_PARAM)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: p was not made by capex_optim_param_init; call it first", fn);
    if ((r = capex__check_config(cfg, fn)) != CAPEX_OK) return r;
    if (cfg->model_dtype != CAPEX_F32 && !half_weights && numel)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the opt level keeps the model in %s: give its half_weights", fn,
                           cfg->model_dtype == CAPEX_F16 ? "fp16" : "bf16");
    p->param = fp32_weights;
    p->grad = grad;
    p->numel = numel;
    p->grad_dtype = cfg->model_dtype; /* grads have the dtype of the weights they belong to */
    p->model = cfg->model_dtype == CAPEX_F32 ? NULL : half_weights;
    p->model_dtype = cfg->model_dtype == CAPEX_F32 ? CAPEX_BF16 : cfg->model_dtype;
    p->pure_half = cfg->model_dtype != CAPEX_F32 && !cfg->use_master_weights;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_add_group(capex_optim *o, const capex_optim_hparams *hp,
                                             const capex_optim_param *params, size_t n, size_t *group_index) {
    const capex_allocator *a;
    capex_result r;
    size_t k, nitems = 0, t0, it, sum;
    int need_m, need_v, need_vm;
    float **bufs;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_add_group: optimizer is NULL");
    if (o->sealed)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_optim_add_group: this is capex_zero_optim's optimizer, over "
                           "this rank's shard pieces; give every param and group to capex_zero_create instead");
    if (!params && n) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_add_group: params is NULL with n = %zu", n);
    if (!hp) hp = &o->desc.defaults;
    if ((r = capex__optim_check_hp(&o->desc, hp)) != CAPEX_OK) return r;
    for (k = 0, sum = (size_t)o->total; k < n; k++) {
        if ((r = capex__optim_check_param(&o->desc, &params[k], k)) != CAPEX_OK) return r;
        /* the optimizer's element total (int64) and its item count must not wrap */
        if (capex__size_add(sum, (size_t)params[k].numel, &sum) || (uint64_t)sum > (uint64_t)INT64_MAX ||
            capex__size_add(nitems, capex__optim_count_items(params[k].numel, o->chunk), &nitems))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_add_group: params 0..%zu bring the optimizer's element "
                               "count past int64: the byte size overflows", k);
    }
    a = capex__optim_alloc(o);
    if ((r = capex__optim_check_aliases(o->tensors, sizeof *o->tensors, o->ntensors, a, params, n, &o->desc, hp,
                                        "capex_optim_add_group")) != CAPEX_OK)
        return r;
    /* grow bookkeeping first (contents kept, so a failure leaves the optimizer as it was) */
    if ((r = capex__grow(a, (void **)&o->groups, &o->cap_groups, o->ngroups, o->ngroups + 1, sizeof *o->groups, "optimizer")) ||
        (r = capex__grow(a, (void **)&o->tensors, &o->cap_tensors, o->ntensors, o->ntensors + n, sizeof *o->tensors,
                         "optimizer")) ||
        (r = capex__grow(a, (void **)&o->items, &o->cap_items, o->nitems, o->nitems + nitems, sizeof *o->items, "optimizer")))
        return r;
    {
        /* per-group constants, per-item partials, per-tensor ratios: resized to fit */
        capex__optim_gc *gc = (capex__optim_gc *)capex__alloc(a, (o->ngroups + 1) * sizeof *gc);
        double *part = (double *)capex__alloc(a, 2 * (o->nitems + nitems) * sizeof *part);
        float *ratio = (float *)capex__alloc(a, (o->ntensors + n) * sizeof *ratio);
        capex_tensor *glist = (capex_tensor *)capex__alloc(a, (o->ntensors + n) * sizeof *glist);
        float *lamb_u = NULL;
        float *novo_v = NULL;
        int64_t total = o->total;
        int keep_u = o->desc.kind == CAPEX_OPTIM_LAMB && !o->desc.lamb_low_memory;
        for (k = 0; k < n; k++) total += params[k].numel;
        need_m = o->desc.kind == CAPEX_OPTIM_SGD ? hp->momentum != 0.0f : o->desc.kind != CAPEX_OPTIM_ADAGRAD;
        need_v = o->desc.kind != CAPEX_OPTIM_SGD && o->desc.kind != CAPEX_OPTIM_NOVOGRAD;
        need_vm = o->desc.kind == CAPEX_OPTIM_ADAM && hp->amsgrad;
        bufs = NULL;
        if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD &&
            (novo_v = (float *)capex__alloc(a, (o->ntensors + n ? o->ntensors + n : 1) * sizeof *novo_v)) != NULL) {
            if (o->ntensors) memcpy(novo_v, o->novo_v, o->ntensors * sizeof *novo_v);
            for (k = 0; k < n; k++) novo_v[o->ntensors + k] = 0.0f; /* a new group starts fresh */
        }
        if (!gc || !part || !ratio || !glist || (o->desc.kind == CAPEX_OPTIM_NOVOGRAD && !novo_v)) {
            r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_add_group: out of memory");
        } else if (keep_u && (uint64_t)total > (uint64_t)(SIZE_MAX / sizeof(float))) {
            r = capex__fail(CAPEX_ERR_LIMIT, "capex_optim_add_group: LAMB update buffer too large; set desc.lamb_low_memory = 1");
        } else if (keep_u && total > 0 && !(lamb_u = (float *)capex__alloc(a, (size_t)total * sizeof(float)))) {
            r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_add_group: out of memory for LAMB's update buffer (%lld "
                            "floats); set desc.lamb_low_memory = 1 to recompute instead", (long long)total);
        } else if (!(bufs = (float **)capex__alloc(a, 3 * (n ? n : 1) * sizeof *bufs))) {
            r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_add_group: out of memory");
        } else {
            memset(bufs, 0, 3 * (n ? n : 1) * sizeof *bufs);
            for (k = 0; k < n; k++) {
                size_t bytes = (size_t)params[k].numel * sizeof(float);
                if (need_m && !params[k].exp_avg && !(bufs[3 * k] = (float *)capex__alloc(a, bytes))) break;
                if (need_v && !params[k].exp_avg_sq && !(bufs[3 * k + 1] = (float *)capex__alloc(a, bytes))) break;
                if (need_vm && !params[k].max_exp_avg_sq && !(bufs[3 * k + 2] = (float *)capex__alloc(a, bytes))) break;
            }
            if (k < n) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_add_group: out of memory for the moments");
        }
        if (r != CAPEX_OK) { /* nothing of the optimizer changed */
            if (bufs)
                for (k = 0; k < 3 * n; k++) capex__free(a, bufs[k]);
            capex__free(a, bufs); capex__free(a, gc); capex__free(a, part); capex__free(a, ratio); capex__free(a, glist);
            capex__free(a, lamb_u); capex__free(a, novo_v);
            return r;
        }
        capex__free(a, o->gc); o->gc = gc;
        capex__free(a, o->part); o->part = part;
        capex__free(a, o->ratio); o->ratio = ratio;
        capex__free(a, o->glist); o->glist = glist;
        capex__free(a, o->lamb_u); o->lamb_u = lamb_u;
        if (novo_v) { capex__free(a, o->novo_v); o->novo_v = novo_v; }
    }
    /* commit */
    t0 = o->ntensors;
    it = o->nitems;
    for (k = 0; k < n; k++) {
        capex__optim_tensor *t = &o->tensors[t0 + k];
        int64_t off;
        t->p = params[k];
        t->group = o->ngroups;
        t->sr_tensor = t0 + k;
        t->sr_base = 0;
        t->own_m = bufs[3 * k] != NULL;
        t->own_v = bufs[3 * k + 1] != NULL;
        t->own_vm = bufs[3 * k + 2] != NULL;
        if (t->own_m) t->p.exp_avg = bufs[3 * k];
        if (t->own_v) t->p.exp_avg_sq = bufs[3 * k + 1];
        if (t->own_vm) t->p.max_exp_avg_sq = bufs[3 * k + 2];
        if (!need_m) t->p.exp_avg = NULL;
        if (!need_v) t->p.exp_avg_sq = NULL;
        if (!need_vm) t->p.max_exp_avg_sq = NULL;
        if (t->p.exp_avg && t->p.numel) memset(t->p.exp_avg, 0, (size_t)t->p.numel * sizeof(float));
        if (t->p.exp_avg_sq && t->p.numel) memset(t->p.exp_avg_sq, 0, (size_t)t->p.numel * sizeof(float));
        if (t->p.max_exp_avg_sq && t->p.numel) memset(t->p.max_exp_avg_sq, 0, (size_t)t->p.numel * sizeof(float));
        if (o->desc.kind == CAPEX_OPTIM_ADAGRAD && t->p.exp_avg_sq) { /* torch: full_like(p, initial_accumulator_value) */
            int64_t e;
            for (e = 0; e < t->p.numel; e++) t->p.exp_avg_sq[e] = hp->initial_accumulator_value;
        }
        if (!t->p.model) t->p.model_dtype = CAPEX_BF16;
        if (t->p.pure_half && t->p.numel) capex__optim_mirror_model(&t->p);
        for (off = 0; off < t->p.numel; off += o->items[it++].n) {
            o->items[it].tensor = t0 + k;
            o->items[it].off = off;
            o->items[it].n = capex__optim_item_len(t->p.numel, off, o->chunk);
            o->items[it].at = o->total + off;
        }
        o->total += t->p.numel;
    }
    capex__free(a, bufs);
    memset(&o->groups[o->ngroups], 0, sizeof o->groups[0]);
    o->groups[o->ngroups].hp = *hp;
    o->groups[o->ngroups].mom_bufs = o->desc.kind == CAPEX_OPTIM_SGD && need_m;
    o->groups[o->ngroups].first = t0;
    o->groups[o->ngroups].count = n;
    if (group_index) *group_index = o->ngroups;
    o->ngroups++;
    o->ntensors += n;
    o->nitems = it;
    return CAPEX_OK;
}

/* Runs phase k over every chunk; chunks are independent. */
enum { CAPEX__OPT_PH_MAIN = 0, CAPEX__OPT_PH_LAMB1 = 1, CAPEX__OPT_PH_LAMB2 = 2, CAPEX__OPT_PH_NOVO1 = 3 };

/* fp16 gradients or model copy where the CPU has F16C: the f32-gradient /
   no-copy kernel runs on blocks, the gradients converted by vcvtph2ps into a
   buffer first and the copy written from the new master by vcvtps2ph after.
   Each element sees the same operations on the same f32 values as in the
   fp16 kernel (whose per-element portable codecs cost 2x bf16's): the same
   bits (test_f16c). Not for LAMB stage 1, whose lane sums span the item. */
#define CAPEX__OPT_F16C_BLOCK 1024
static void capex__optim_f16c_blocks(capex__optim_kfn f, const capex__optim_job *j0, size_t gsz, int g16, int m16) {
    float gb[CAPEX__OPT_F16C_BLOCK];
    capex__optim_job j = *j0;
    int64_t o;
    for (o = 0; o < j0->n; o += CAPEX__OPT_F16C_BLOCK) {
        int64_t nb = j0->n - o < CAPEX__OPT_F16C_BLOCK ? j0->n - o : CAPEX__OPT_F16C_BLOCK;
        j.g = g16 ? (const void *)gb : j0->g ? (const void *)((const char *)j0->g + (size_t)o * gsz) : NULL;
        j.p = j0->p + o;
        j.m = j0->m ? j0->m + o : NULL;
        j.v = j0->v ? j0->v + o : NULL;
        j.u = j0->u ? j0->u + o : NULL;
        j.vm = j0->vm ? j0->vm + o : NULL; /* amsgrad's max */
        j.h = m16 || !j0->h ? NULL : (void *)((uint16_t *)j0->h + o);
        j.base_lo = j0->base_lo + (unsigned int)o; /* stochastic rounding's element index */
        j.n = nb;
        if (g16) capex__f16_load_n((const uint16_t *)j0->g + o, gb, (size_t)nb);
        f(&j);
        if (m16) capex__f16_store_n(j.p, (uint16_t *)j0->h + o, (size_t)nb);
    }
}

static void capex__optim_run_item(const capex_optim *o, int phase, size_t k, float gs) {
    const capex__optim_item *item = &o->items[k];
    const capex__optim_tensor *t = &o->tensors[item->tensor];
    const capex__optim_group *grp = &o->groups[t->group];
    capex__optim_job j;
    size_t gsz = capex_dtype_size(t->p.grad_dtype);
    int gi = (int)t->p.grad_dtype;
    int mi = !t->p.model ? 0 : t->p.model_dtype == CAPEX_F16 ? 1 : o->desc.stochastic_rounding ? 3 : 2;
    int w = o->desc.adam_w_mode != 0;
    j.g = (const char *)t->p.grad + (size_t)item->off * gsz;
    j.p = t->p.param + item->off;
    j.m = t->p.exp_avg ? t->p.exp_avg + item->off : NULL;
    j.v = t->p.exp_avg_sq ? t->p.exp_avg_sq + item->off : NULL;
    j.h = t->p.model ? (void *)((uint16_t *)t->p.model + item->off) : NULL;
    j.n = item->n;
    j.gs = gs;
    j.ratio = o->ratio[item->tensor];
    j.c = &o->gc[t->group];
    j.acc = o->part + 2 * k;
    j.u = o->lamb_u ? o->lamb_u + item->at : NULL;
    j.vm = t->p.max_exp_avg_sq ? t->p.max_exp_avg_sq + item->off : NULL;
    j.base_lo = (unsigned int)((uint64_t)(t->sr_base + item->off) & 0xffffffffu);
    j.key = mi == 3 ? capex__sr_key((unsigned int)(o->desc.seed & 0xffffffffu), (unsigned int)(o->desc.seed >> 32),
                                    j.c->step_lo, j.c->step_hi, (unsigned int)t->sr_tensor,
                                    (unsigned int)((uint64_t)(t->sr_base + item->off) >> 32))
                    : 0u;
    (void)grp;
    /* kinds listed by name: a new kind takes the switch below until it is added here */
    if ((mi == 1 || (gi == (int)CAPEX_F16 && phase == CAPEX__OPT_PH_MAIN)) &&
        ((phase == CAPEX__OPT_PH_MAIN && (o->desc.kind == CAPEX_OPTIM_ADAM || o->desc.kind == CAPEX_OPTIM_SGD ||
                                          o->desc.kind == CAPEX_OPTIM_NOVOGRAD || o->desc.kind == CAPEX_OPTIM_ADAGRAD)) ||
         (phase == CAPEX__OPT_PH_LAMB2 && o->desc.kind == CAPEX_OPTIM_LAMB)) && CAPEX__F16C_ON()) {
        int g16 = gi == (int)CAPEX_F16 && phase == CAPEX__OPT_PH_MAIN, bg = g16 ? (int)CAPEX_F32 : gi, bm = mi == 1 ? 0 : mi;
        capex__optim_kfn f;
        if (phase == CAPEX__OPT_PH_LAMB2) f = capex__k_lamb2_tab[j.u ? 2 : w][bm];
        else if (o->desc.kind == CAPEX_OPTIM_ADAGRAD) f = capex__k_adagrad_tab[w][bg][bm];
        else if (o->desc.kind == CAPEX_OPTIM_ADAM && j.vm && grp->hp.amsgrad) f = capex__k_adam_ams_tab[w][bg][bm];
        else if (o->desc.kind == CAPEX_OPTIM_ADAM) f = (w ? capex__k_adam_w_tab : capex__k_adam_l2_tab)[bg][bm];
        else if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD)
            f = (o->desc.reg_inside_moment ? capex__k_novo_reg_tab : capex__k_novo_mom_tab)[bg][bm];
        else if (j.m && j.c->momentum != 0.0f) f = capex__k_sgdm_tab[bg][bm];
        else f = capex__k_sgd_tab[bg][bm];
        capex__optim_f16c_blocks(f, &j, gsz, g16, mi == 1);
        return;
    }
    switch (phase) {
    case CAPEX__OPT_PH_MAIN:
        if (o->desc.kind == CAPEX_OPTIM_ADAGRAD) capex__k_adagrad_tab[w][gi][mi](&j);
        else if (o->desc.kind == CAPEX_OPTIM_ADAM && j.vm && grp->hp.amsgrad) capex__k_adam_ams_tab[w][gi][mi](&j);
        else if (o->desc.kind == CAPEX_OPTIM_ADAM) (w ? capex__k_adam_w_tab : capex__k_adam_l2_tab)[gi][mi](&j);
        else if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD)
            (o->desc.reg_inside_moment ? capex__k_novo_reg_tab : capex__k_novo_mom_tab)[gi][mi](&j);
        else if (j.m && j.c->momentum != 0.0f) capex__k_sgdm_tab[gi][mi](&j); /* Apex: if (momentum != 0) */
        else capex__k_sgd_tab[gi][mi](&j);
        break;
    case CAPEX__OPT_PH_LAMB1: capex__k_lamb1_tab[w][gi](&j); break;
    case CAPEX__OPT_PH_NOVO1: capex__k_novo1_tab[gi](&j); break;
    default: capex__k_lamb2_tab[j.u ? 2 : w][mi](&j); break;
    }
}

static void capex__optim_run(const capex_optim *o, int phase, float gs) {
    int64_t k, n = (int64_t)o->nitems;
#ifdef _OPENMP
    int64_t minel = o->desc.exec.parallel_min_elements ? o->desc.exec.parallel_min_elements : 262144;
    int par = n > 1 && o->total >= minel;
    if (o->desc.exec.num_threads > 0) {
        int nt = o->desc.exec.num_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
        for (k = 0; k < n; k++) capex__optim_run_item(o, phase, (size_t)k, gs);
    } else {
#pragma omp parallel for schedule(static) if (par)
        for (k = 0; k < n; k++) capex__optim_run_item(o, phase, (size_t)k, gs);
    }
#else
    for (k = 0; k < n; k++) capex__optim_run_item(o, phase, (size_t)k, gs);
#endif
}

/* NovoGrad between the passes: per tensor, n2 = the sum of its items'
   partials (part[k*stride], in item order: deterministic), then Apex's
   blend into v (first step: v starts at init_zero ? 0 : sqrt(n2), so the
   blend leaves it at n) and the tensor's denom into o->ratio. */
CAPEX__PRIVATE void capex__optim_novo_norms(capex_optim *o, const double *part, size_t stride, const double *tsum) {
    size_t k, i0 = 0;
    for (k = 0; k < o->ntensors; k++) {
        const capex__optim_tensor *t = &o->tensors[k];
        const capex__optim_gc *c = &o->gc[t->group];
        double ss = 0.0;
        float n2, v = o->novo_v[k];
        while (i0 < o->nitems && o->items[i0].tensor == k) ss += part[stride * i0++];
        if (tsum) ss = tsum[2 * k]; /* sharded: the whole tensor's, summed across ranks */
        n2 = (float)ss;
        if (o->groups[t->group].step == 0) v = o->desc.init_zero ? 0.0f : sqrtf(n2);
        v = capex__novo_blend(v, n2, c->beta2);
        o->novo_v[k] = v;
        o->ratio[k] = capex__novo_denom(v, c->bc2, c->eps);
    }
}

/* The step count that drives group g's scheduled lr. */
static int64_t capex__optim_sched_n(const capex_optim *o, size_t g) {
    return o->sched.count_skipped ? o->sched_iter : o->groups[g].step;
}

static capex_result capex__optim_step(capex_optim *o, float inv_scale, float clip_coef, int found_inf);
CAPEX_API capex_result capex_optim_step(capex_optim *o, float inv_scale, float clip_coef, int found_inf) {
    capex_result r;
    if (o && o->has_sched && o->sched_iter >= CAPEX_STEP_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "capex_optim_step: the lr schedule has counted CAPEX_STEP_MAX (2^53) "
                           "iterations; nothing was changed");
    r = capex__optim_step(o, inv_scale, clip_coef, found_inf);
    /* skipped or not: torch's scheduler.step(); a step with no groups launches nothing on the device either */
    if (r == CAPEX_OK && o->has_sched && o->ngroups) o->sched_iter++;
    return r;
}

static capex_result capex__optim_step(capex_optim *o, float inv_scale, float clip_coef, int found_inf) {
    size_t gidx, k;
    float gs;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_step: optimizer is NULL");
    if (!capex__opt_finite(inv_scale) || inv_scale <= 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_step: inv_scale is %g; it must be finite and > 0 "
                           "(1/loss_scale, or 1)", (double)inv_scale);
    if (!capex__opt_finite(clip_coef) || clip_coef < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_step: clip_coef is %g; it must be finite and >= 0 "
                           "(1: no clipping)", (double)clip_coef);
    if (!capex__opt_finite(inv_scale * clip_coef)) /* g * inf would turn every weight to NaN */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_step: inv_scale %g * clip_coef %g overflows a float; "
                           "nothing was changed", (double)inv_scale, (double)clip_coef);
    if (o->broken)
        return capex__fail(CAPEX_ERR_ORDER, "capex_optim_step: a state load failed part-way (I/O error); load the "
                           "state again before stepping");
    if (found_inf) return CAPEX_OK; /* skipped step: nothing changes (Apex/torch.amp) */
    for (gidx = 0; gidx < o->ngroups; gidx++)
        if (o->groups[gidx].step >= CAPEX_STEP_MAX)
            return capex__fail(CAPEX_ERR_LIMIT, "capex_optim_step: group %zu has taken CAPEX_STEP_MAX (2^53) steps; "
                               "nothing was changed", gidx);
    gs = inv_scale * clip_coef;
    for (gidx = 0; gidx < o->ngroups; gidx++) {
        capex__optim_group *g = &o->groups[gidx];
        capex__optim_gc *c = &o->gc[gidx];
        const capex_optim_hparams *hp = &g->hp;
        uint64_t s = (uint64_t)g->step + 1;
        c->lr = o->has_sched ? (float)capex__lr_eval(&o->sched_p, (double)hp->lr, capex__optim_sched_n(o, gidx))
                             : hp->lr;
        if (!capex__opt_finite(c->lr)) /* only a schedule can get here: hp.lr is checked finite */
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_step: the lr schedule gives group %zu the lr %g at "
                               "step %lld, not a finite float; nothing was changed", gidx, (double)c->lr,
                               (long long)capex__optim_sched_n(o, gidx));
        c->beta1 = hp->beta1;
        c->beta2 = hp->beta2;
        c->beta3 = hp->grad_averaging ? 1.0f - hp->beta1 : 1.0f;
        /* Apex: bias_correction1 = 1 - std::pow(beta1, step), in double, stored as float */
        c->bc1 = hp->bias_correction ? (float)(1.0 - pow((double)hp->beta1, (double)s)) : 1.0f;
        c->bc2 = hp->bias_correction ? (float)(1.0 - pow((double)hp->beta2, (double)s)) : 1.0f;
        /* NovoGrad: bias_correction2 = std::sqrt(1 - std::pow(beta2, step)) (a norm, not a square) */
        if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD && hp->bias_correction)
            c->bc2 = (float)sqrt(1.0 - pow((double)hp->beta2, (double)s));
        c->eps = hp->eps;
        c->wd = hp->weight_decay;
        c->momentum = hp->momentum;
        c->dampening = hp->dampening;
        c->clip_div = 1.0f;
        c->nesterov = hp->nesterov ? ~0u : 0u;
        c->first = !g->mom_init ? ~0u : 0u;
        /* Apex: `if (wd != 0 && !wd_after_momentum)` / `if (wd != 0 && wd_after_momentum)` */
        c->wd_on = hp->weight_decay != 0.0f ? ~0u : 0u;
        c->wd_before = o->desc.wd_after_momentum ? 0u : c->wd_on;
        c->wd_after = o->desc.wd_after_momentum ? c->wd_on : 0u;
        c->step_lo = (unsigned int)(s & 0xffffffffu);
        c->step_hi = (unsigned int)(s >> 32);
        /* torch.optim.Adagrad: clr = lr / (1 + (step - 1) * lr_decay), in double; lr as
           scheduled (a torch scheduler sets group['lr'], and capex_go_prepare sets g->lr) */
        c->clr = (float)((double)c->lr / (1.0 + (double)(s - 1) * (double)hp->lr_decay));
    }
    /* O3: the weights are the model copy (Apex steps the half model itself),
       which the engine may have written since add_group or the last step
       (restored or pretrained weights): start from it. Exact, and a no-op
       when nobody did. */
    for (k = 0; k < o->ntensors; k++)
        if (o->tensors[k].p.pure_half && o->tensors[k].p.numel) capex__optim_mirror_model(&o->tensors[k].p);
    if (o->desc.kind == CAPEX_OPTIM_LAMB) {
        double g2 = 0.0;
        float gnorm, clip_div = 1.0f;
        double *tsum = NULL;
        capex_result r = capex__optim_grad_sumsq(o, &g2);
        if (r != CAPEX_OK) return r; /* nothing changed yet */
        if (o->reduce_fn) {
            tsum = (double *)capex__alloc(capex__optim_alloc(o), sizeof(double) * (2 * o->ntensors + 2));
            if (!tsum) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_step: out of memory (sharded LAMB)");
            if ((r = o->reduce_fn(o->reduce_user, 0, &g2, 1)) != CAPEX_OK) {
                capex__free(capex__optim_alloc(o), tsum);
                return r;
            }
        }
        /* Apex: global norm over all grads (per-dtype norms blended); ours is
           the norm of the scaled grads g*inv_scale*clip */
        gnorm = (float)(sqrt(g2) * (double)gs);
        if (o->desc.max_grad_norm > 0.0f && gnorm > o->desc.max_grad_norm) clip_div = gnorm / o->desc.max_grad_norm;
        for (gidx = 0; gidx < o->ngroups; gidx++) o->gc[gidx].clip_div = clip_div;
        capex__optim_run(o, CAPEX__OPT_PH_LAMB1, gs);
        for (k = 0; k < o->ntensors; k++) o->ratio[k] = 0.0f;
        {
            /* per-tensor norms: items of a tensor are consecutive, added in order */
            size_t i0 = 0;
            if (tsum) {
                for (k = 0; k < o->ntensors; k++) {
                    tsum[2 * k] = tsum[2 * k + 1] = 0.0;
                    while (i0 < o->nitems && o->items[i0].tensor == k) {
                        tsum[2 * k] += o->part[2 * i0];
                        tsum[2 * k + 1] += o->part[2 * i0 + 1];
                        i0++;
                    }
                }
                r = o->reduce_fn(o->reduce_user, 1, tsum, 2 * o->ntensors);
                if (r != CAPEX_OK) { /* the moments moved: a failed comm ends the job anyway */
                    capex__free(capex__optim_alloc(o), tsum);
                    return r;
                }
                i0 = 0;
            }
            for (k = 0; k < o->ntensors; k++) {
                const capex__optim_tensor *t = &o->tensors[k];
                const capex_optim_hparams *hp = &o->groups[t->group].hp;
                double sp = 0.0, su = 0.0;
                float pn, un, lr = o->gc[t->group].lr, ratio = lr;
                while (!tsum && i0 < o->nitems && o->items[i0].tensor == k) {
                    sp += o->part[2 * i0];
                    su += o->part[2 * i0 + 1];
                    i0++;
                }
                if (tsum) { sp = tsum[2 * k]; su = tsum[2 * k + 1]; }
                pn = (float)sqrt(sp);
                un = (float)sqrt(su);
                /* Apex: nvlamb applies the trust ratio everywhere, else only where wd != 0 */
                if (o->desc.use_nvlamb || hp->weight_decay != 0.0f)
                    ratio = (un != 0.0f && pn != 0.0f) ? lr * (pn / un) : lr;
                o->ratio[k] = ratio;
            }
        }
        capex__free(capex__optim_alloc(o), tsum);
        capex__optim_run(o, CAPEX__OPT_PH_LAMB2, gs);
    } else if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) {
        double *tsum = NULL;
        if (o->reduce_fn) { /* sharded: per-tensor sums of squares across ranks (nothing changed yet) */
            size_t i0 = 0;
            capex_result r;
            tsum = (double *)capex__alloc(capex__optim_alloc(o), sizeof(double) * (2 * o->ntensors + 2));
            if (!tsum) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_step: out of memory (sharded NovoGrad)");
            capex__optim_run(o, CAPEX__OPT_PH_NOVO1, gs);
            for (k = 0; k < o->ntensors; k++) {
                tsum[2 * k] = tsum[2 * k + 1] = 0.0;
                while (i0 < o->nitems && o->items[i0].tensor == k) tsum[2 * k] += o->part[2 * i0++];
            }
            if ((r = o->reduce_fn(o->reduce_user, 1, tsum, 2 * o->ntensors)) != CAPEX_OK) {
                capex__free(capex__optim_alloc(o), tsum);
                return r;
            }
        } else
            capex__optim_run(o, CAPEX__OPT_PH_NOVO1, gs);
        capex__optim_novo_norms(o, o->part, 2, tsum);
        capex__free(capex__optim_alloc(o), tsum);
        capex__optim_run(o, CAPEX__OPT_PH_MAIN, gs);
    } else {
        capex__optim_run(o, CAPEX__OPT_PH_MAIN, gs);
    }
    for (k = 0; k < o->ntensors; k++) /* O3: the weights are the rounded model copy */
        if (o->tensors[k].p.pure_half && o->tensors[k].p.numel) capex__optim_mirror_model(&o->tensors[k].p);
    for (gidx = 0; gidx < o->ngroups; gidx++) {
        o->groups[gidx].step++;
        if (o->desc.kind == CAPEX_OPTIM_SGD && o->groups[gidx].hp.momentum != 0.0f) o->groups[gidx].mom_init = 1;
    }
    return CAPEX_OK;
}

CAPEX_API size_t capex_optim_num_groups(const capex_optim *o) { return o ? o->ngroups : 0; }

CAPEX_API capex_result capex_optim_get_hparams(const capex_optim *o, size_t group, capex_optim_hparams *hp) {
    if (!o || !hp) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_hparams: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_hparams: group %zu of %zu", group, o->ngroups);
    *hp = o->groups[group].hp;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_set_hparams(capex_optim *o, size_t group, const capex_optim_hparams *hp) {
    capex_result r;
    if (!o || !hp) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_set_hparams: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_set_hparams: group %zu of %zu", group, o->ngroups);
    if ((r = capex__optim_check_hp(&o->desc, hp)) != CAPEX_OK) return r;
    if (o->desc.kind == CAPEX_OPTIM_SGD && hp->momentum != 0.0f && !o->groups[group].mom_bufs)
        return capex__fail(CAPEX_ERR_CONFIG, "SGD: group %zu was created without momentum, so it has no momentum "
                           "buffers; create the group with momentum != 0 to turn momentum on later", group);
    if (o->desc.kind == CAPEX_OPTIM_ADAM && (hp->amsgrad != 0) != (o->groups[group].hp.amsgrad != 0))
        return capex__fail(CAPEX_ERR_CONFIG, "Adam: group %zu was created with amsgrad %d; amsgrad is fixed when the "
                           "group is added (its max_exp_avg_sq buffers exist only then)", group,
                           o->groups[group].hp.amsgrad != 0);
    o->groups[group].hp = *hp;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_set_lr(capex_optim *o, size_t group, float lr) {
    capex_optim_hparams hp;
    capex_result r = capex_optim_get_hparams(o, group, &hp);
    if (r != CAPEX_OK) return r;
    hp.lr = lr;
    return capex_optim_set_hparams(o, group, &hp);
}

CAPEX_API capex_result capex_optim_get_step(const capex_optim *o, size_t group, int64_t *step) {
    if (!o || !step) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_step: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_step: group %zu of %zu", group, o->ngroups);
    *step = o->groups[group].step;
    return CAPEX_OK;
}

static capex_result capex__optim_tensor_at(const capex_optim *o, size_t group, size_t index, const char *fn,
                                           capex__optim_tensor **t) {
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    if (group >= o->ngroups) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: group %zu of %zu", fn, group, o->ngroups);
    if (index >= o->groups[group].count)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: parameter %zu of %zu in group %zu", fn, index,
                           o->groups[group].count, group);
    *t = &o->tensors[o->groups[group].first + index];
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_set_grad(capex_optim *o, size_t group, size_t index, const void *grad,
                                            capex_dtype grad_dtype) {
    capex__optim_tensor *t = NULL;
    capex_optim_param p;
    capex_result r = capex__optim_tensor_at(o, group, index, "capex_optim_set_grad", &t);
    if (r != CAPEX_OK) return r;
    p = t->p;
    p.grad = grad;
    p.grad_dtype = grad_dtype;
    if ((r = capex__optim_check_param(&o->desc, &p, index)) != CAPEX_OK) return r;
    t->p.grad = grad;
    t->p.grad_dtype = grad_dtype;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_state(const capex_optim *o, size_t group, size_t index, float **exp_avg,
                                             float **exp_avg_sq) {
    capex__optim_tensor *t = NULL;
    capex_result r = capex__optim_tensor_at(o, group, index, "capex_optim_get_state", &t);
    if (r != CAPEX_OK) return r;
    if (exp_avg) *exp_avg = t->p.exp_avg;
    if (exp_avg_sq) *exp_avg_sq = t->p.exp_avg_sq;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_novograd_norm(const capex_optim *o, size_t group, size_t index, float *v) {
    capex__optim_tensor *t = NULL;
    capex_result r = capex__optim_tensor_at(o, group, index, "capex_optim_get_novograd_norm", &t);
    if (r != CAPEX_OK) return r;
    if (!v) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_novograd_norm: v is NULL");
    if (o->desc.kind != CAPEX_OPTIM_NOVOGRAD)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_optim_get_novograd_norm: the optimizer is kind %d, not NovoGrad",
                           (int)o->desc.kind);
    *v = o->novo_v[(size_t)(t - o->tensors)];
    return CAPEX_OK;
}

/* ---- optimizer lr schedule ---- */

CAPEX_API capex_result capex_optim_set_lr_schedule(capex_optim *o, const capex_lr_schedule *s) {
    capex_result r;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_set_lr_schedule: optimizer is NULL");
    if (!s) {
        o->has_sched = 0;
        return CAPEX_OK;
    }
    if ((r = capex_lr_schedule_check(s)) != CAPEX_OK) return r;
    if (!o->has_sched) o->sched_iter = 0; /* a new schedule (torch: a new scheduler) starts counting */
    o->sched = *s;
    capex__lr_params(s, &o->sched_p);
    o->has_sched = 1;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_lr_iteration(const capex_optim *o, int64_t *iteration) {
    if (!o || !iteration) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_lr_iteration: NULL argument");
    *iteration = o->has_sched ? o->sched_iter : 0;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_lr_schedule(const capex_optim *o, capex_lr_schedule *s, int *attached) {
    if (!o || !s || !attached) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_lr_schedule: NULL argument");
    *attached = o->has_sched;
    if (o->has_sched) *s = o->sched;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_lr(const capex_optim *o, size_t group, float *lr) {
    const capex__optim_group *g;
    if (!o || !lr) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_lr: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_lr: group %zu of %zu", group, o->ngroups);
    g = &o->groups[group];
    *lr = o->has_sched ? (float)capex__lr_eval(&o->sched_p, (double)g->hp.lr, capex__optim_sched_n(o, group))
                       : g->hp.lr;
    if (!capex__opt_finite(*lr)) /* the step would refuse it */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_get_lr: the lr schedule gives group %zu the lr %g at "
                           "step %lld, not a finite float", group, (double)*lr, (long long)capex__optim_sched_n(o, group));
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_get_max_exp_avg_sq(const capex_optim *o, size_t group, size_t index,
                                                      float **max_exp_avg_sq) {
    capex__optim_tensor *t = NULL;
    capex_result r = capex__optim_tensor_at(o, group, index, "capex_optim_get_max_exp_avg_sq", &t);
    if (r != CAPEX_OK) return r;
    if (max_exp_avg_sq) *max_exp_avg_sq = t->p.max_exp_avg_sq;
    return CAPEX_OK;
}

/* Bits this capex does not know are refused: a caller's mistake is not ignored
   (also capex_cuda_optim_to_host/from_host, kept under CAPEX_NO_STATE). */
CAPEX__PRIVATE capex_result capex__optim_flags_ok(unsigned flags, const char *fn) {
    if (flags & ~CAPEX_OPTIM_STATE_PARAMS)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown flags 0x%x (only CAPEX_OPTIM_STATE_PARAMS)", fn,
                           flags & ~CAPEX_OPTIM_STATE_PARAMS);
    return CAPEX_OK;
}

/* The optimizer-wide settings a state file holds, from a loaded optimizer's
   desc into another's, as capex_optim_load takes them from the file
   (NovoGrad's only for NovoGrad, the one kind whose file holds them). */
CAPEX__PRIVATE void capex__optim_take_modes(capex_optim_desc *d, const capex_optim_desc *from) {
    d->adam_w_mode = from->adam_w_mode != 0;
    d->use_nvlamb = from->use_nvlamb != 0;
    d->wd_after_momentum = from->wd_after_momentum != 0;
    d->stochastic_rounding = from->stochastic_rounding != 0;
    d->max_grad_norm = from->max_grad_norm;
    d->seed = from->seed;
    if (d->kind == CAPEX_OPTIM_NOVOGRAD) {
        d->reg_inside_moment = from->reg_inside_moment != 0;
        d->init_zero = from->init_zero != 0;
        d->norm_type = from->norm_type;
    }
}

/* ---- optimizer state save/restore ---- */
#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE: no optimizer save/load */

#define CAPEX__OPT_NAME_MAX 160

static capex_result capex__optim_name(char *buf, const char *prefix, const char *fmt, size_t a, const char *b) {
    char tail[96];
    if (b) snprintf(tail, sizeof tail, fmt, a, b);
    else snprintf(tail, sizeof tail, fmt, a);
    if ((size_t)snprintf(buf, CAPEX__OPT_NAME_MAX, "%s.%s", prefix, tail) >= CAPEX__OPT_NAME_MAX)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer state: prefix '%s' is too long", prefix);
    return CAPEX_OK;
}

/* Per-group hyperparameters as saved: scalars "<prefix>.group<g>.<name>". */
static const char *const capex__optim_hp_f32_names[7] = {"lr", "beta1", "beta2", "eps", "weight_decay", "momentum",
                                                         "dampening"};
static const char *const capex__optim_hp_i64_names[3] = {"bias_correction", "grad_averaging", "nesterov"};
static float *capex__optim_hp_f32(capex_optim_hparams *hp, int i) {
    float *f[7];
    f[0] = &hp->lr; f[1] = &hp->beta1; f[2] = &hp->beta2; f[3] = &hp->eps; f[4] = &hp->weight_decay;
    f[5] = &hp->momentum; f[6] = &hp->dampening;
    return f[i];
}
static int *capex__optim_hp_int(capex_optim_hparams *hp, int i) {
    return i == 0 ? &hp->bias_correction : i == 1 ? &hp->grad_averaging : &hp->nesterov;
}

static capex_result capex__optim_expect(capex_state_reader *rd, const char *nm, capex_state_dtype dt, int64_t numel);
static capex_result capex__optim_get_i64(capex_state_reader *rd, const char *nm, int64_t *v);
/* The attached lr schedule as saved: "<prefix>.lr_schedule.<field>" (absent
   when none is attached; files from before schedules have none either). */
static const char *const capex__lr_i64_names[7] = {"kind", "warmup_steps", "total_steps", "step_size",
                                                   "num_milestones", "anneal_linear", "three_phase"};
static const char *const capex__lr_f64_names[7] = {"warmup_start_factor", "min_factor", "power", "gamma",
                                                   "pct_start", "div_factor", "final_div_factor"};
static double *capex__lr_f64(capex_lr_schedule *s, int i) {
    double *f[7];
    f[0] = &s->warmup_start_factor; f[1] = &s->min_factor; f[2] = &s->power; f[3] = &s->gamma;
    f[4] = &s->pct_start; f[5] = &s->div_factor; f[6] = &s->final_div_factor;
    return f[i];
}

static capex_result capex__lr_name(char *buf, const char *prefix, const char *field) {
    if ((size_t)snprintf(buf, CAPEX__OPT_NAME_MAX, "%s.lr_schedule.%s", prefix, field) >= CAPEX__OPT_NAME_MAX)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "optimizer state: prefix '%s' is too long", prefix);
    return CAPEX_OK;
}

static capex_result capex__optim_sched_save(const capex_optim *o, capex_state_writer *w, const char *prefix) {
    char nm[CAPEX__OPT_NAME_MAX];
    capex_result r;
    capex_lr_schedule s = o->sched;
    int64_t iv[7], shape = CAPEX_LR_MAX_MILESTONES;
    int i;
    if (!o->has_sched) return CAPEX_OK;
    iv[0] = (int64_t)s.kind; iv[1] = s.warmup_steps; iv[2] = s.total_steps; iv[3] = s.step_size;
    iv[4] = s.num_milestones; iv[5] = s.anneal_linear != 0; iv[6] = s.three_phase != 0;
    for (i = 0; i < 7; i++) {
        if ((r = capex__lr_name(nm, prefix, capex__lr_i64_names[i])) != CAPEX_OK) return r;
        if ((r = capex_state_add_i64(w, nm, iv[i])) != CAPEX_OK) return r;
    }
    for (i = 0; i < 7; i++) {
        if ((r = capex__lr_name(nm, prefix, capex__lr_f64_names[i])) != CAPEX_OK) return r;
        if ((r = capex_state_add_f64(w, nm, *capex__lr_f64(&s, i))) != CAPEX_OK) return r;
    }
    if ((r = capex__lr_name(nm, prefix, "warmup_llmc")) != CAPEX_OK) return r;
    if ((r = capex_state_add_i64(w, nm, s.warmup_llmc)) != CAPEX_OK) return r;
    if ((r = capex__lr_name(nm, prefix, "count_skipped")) != CAPEX_OK) return r;
    if ((r = capex_state_add_i64(w, nm, s.count_skipped)) != CAPEX_OK) return r;
    if ((r = capex__lr_name(nm, prefix, "iteration")) != CAPEX_OK) return r;
    if ((r = capex_state_add_i64(w, nm, o->sched_iter)) != CAPEX_OK) return r;
    if ((r = capex__lr_name(nm, prefix, "milestones")) != CAPEX_OK) return r;
    return capex_state_add_tensor(w, nm, CAPEX_STATE_I64, 1, &shape, o->sched.milestones);
}

/* *present = 0 when the file has no schedule; else *s is the file's, checked,
   and *iter its iteration count (-1: a file from before it was saved). */
static capex_result capex__optim_sched_load(capex_state_reader *rd, const char *prefix, capex_lr_schedule *s,
                                            int *present, int64_t *iter) {
    char nm[CAPEX__OPT_NAME_MAX];
    capex_state_tensor_info info;
    capex_result r;
    int64_t iv[7];
    int i;
    *present = 0;
    *iter = -1;
    if ((r = capex__lr_name(nm, prefix, "kind")) != CAPEX_OK) return r;
    if (capex_state_find(rd, nm, &info) != CAPEX_OK) return CAPEX_OK;
    for (i = 0; i < 7; i++) {
        if ((r = capex__lr_name(nm, prefix, capex__lr_i64_names[i])) != CAPEX_OK) return r;
        if ((r = capex__optim_get_i64(rd, nm, &iv[i])) != CAPEX_OK) return r;
    }
    if (iv[0] < 0 || iv[0] > CAPEX_LR_ONECYCLE || iv[4] < 0 || iv[4] > CAPEX_LR_MAX_MILESTONES)
        return capex__fail(CAPEX_ERR_FORMAT, "optimizer state: lr schedule kind %lld / num_milestones %lld out of "
                           "range (a corrupt or newer file)", (long long)iv[0], (long long)iv[4]);
    capex_lr_schedule_init(s, (capex_lr_kind)iv[0]);
    s->warmup_steps = iv[1]; s->total_steps = iv[2]; s->step_size = iv[3];
    s->num_milestones = (int)iv[4]; s->anneal_linear = iv[5] != 0; s->three_phase = iv[6] != 0;
    for (i = 0; i < 7; i++) {
        if ((r = capex__lr_name(nm, prefix, capex__lr_f64_names[i])) != CAPEX_OK) return r;
        if ((r = capex_state_get_f64(rd, nm, capex__lr_f64(s, i))) != CAPEX_OK)
            return capex__fail(r, "optimizer state: cannot read '%s'", nm);
    }
    /* absent in files from before it existed: 0, the warmup they were saved with */
    if ((r = capex__lr_name(nm, prefix, "warmup_llmc")) != CAPEX_OK) return r;
    if (capex_state_find(rd, nm, &info) == CAPEX_OK) {
        int64_t v;
        if ((r = capex__optim_get_i64(rd, nm, &v)) != CAPEX_OK) return r;
        s->warmup_llmc = v == 0 || v == 1 ? (int)v : 2; /* 2: refused by the check below */
    }
    /* these two too: 0 (group step counts), and -1 */
    if ((r = capex__lr_name(nm, prefix, "count_skipped")) != CAPEX_OK) return r;
    if (capex_state_find(rd, nm, &info) == CAPEX_OK) {
        int64_t v;
        if ((r = capex__optim_get_i64(rd, nm, &v)) != CAPEX_OK) return r;
        s->count_skipped = v == 0 || v == 1 ? (int)v : 2; /* 2: refused by the check below */
    }
    if ((r = capex__lr_name(nm, prefix, "iteration")) != CAPEX_OK) return r;
    if (capex_state_find(rd, nm, &info) == CAPEX_OK) {
        if ((r = capex__optim_get_i64(rd, nm, iter)) != CAPEX_OK) return r;
        if (*iter < 0 || *iter > CAPEX_STEP_MAX)
            return capex__fail(CAPEX_ERR_FORMAT, "optimizer state: lr schedule iteration %lld; it must lie in [0, "
                               "CAPEX_STEP_MAX = 2^53] (a corrupt or forged file)", (long long)*iter);
    }
    if ((r = capex__lr_name(nm, prefix, "milestones")) != CAPEX_OK) return r;
    if ((r = capex__optim_expect(rd, nm, CAPEX_STATE_I64, CAPEX_LR_MAX_MILESTONES)) != CAPEX_OK) return r;
    if ((r = capex_state_read_tensor(rd, nm, CAPEX_STATE_I64, CAPEX_LR_MAX_MILESTONES, s->milestones)) != CAPEX_OK)
        return capex__fail(r, "optimizer state: cannot read '%s'", nm);
    if ((r = capex_lr_schedule_check(s)) != CAPEX_OK) {
        char why[256];
        size_t n = strlen(capex_last_error());
        if (n >= sizeof why) n = sizeof why - 1;
        memcpy(why, capex_last_error(), n); /* the message buffer is rewritten below */
        why[n] = '\0';
        return capex__fail(CAPEX_ERR_FORMAT, "optimizer state: the saved lr schedule is invalid (%s)", why);
    }
    *present = 1;
    return CAPEX_OK;
}

/* The second moment's tensor name: Adagrad's is torch's state "sum". */
static const char *capex__optim_v_name(const capex_optim *o) {
    return o->desc.kind == CAPEX_OPTIM_ADAGRAD ? "param%zu.sum" : "param%zu.exp_avg_sq";
}

/* Optional scalar (absent in files from before it existed: v keeps its value). */
static capex_result capex__optim_opt_f32(capex_state_reader *rd, const char *nm, float *v) {
    capex_state_tensor_info info;
    capex_result r;
    if (capex_state_find(rd, nm, &info) != CAPEX_OK) return CAPEX_OK;
    if ((r = capex_state_get_f32(rd, nm, v)) != CAPEX_OK) return capex__fail(r, "optimizer state: cannot read '%s'", nm);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_save(const capex_optim *o, capex_state_writer *w, const char *prefix,
                                        unsigned flags) {
    char nm[CAPEX__OPT_NAME_MAX];
    capex_result r;
    size_t g, k;
    int64_t shape;
    if (!o || !w) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_save: optimizer or writer is NULL");
    if ((r = capex__optim_flags_ok(flags, "capex_optim_save")) != CAPEX_OK) return r;
    if (o->broken) /* it holds part of the failed load's state and part of the old one */
        return capex__fail(CAPEX_ERR_ORDER, "capex_optim_save: a state load failed part-way (I/O error); load the "
                           "state again before saving");
    if (!prefix) prefix = "optim";
#define CAPEX__OPT_TRY(x) do { if ((r = (x)) != CAPEX_OK) return r; } while (0)
    {
        const char *names[7] = {"kind", "adam_w_mode", "use_nvlamb", "wd_after_momentum", "stochastic_rounding",
                                "num_groups", "num_params"};
        int64_t vals[7];
        int i;
        vals[0] = (int64_t)o->desc.kind; vals[1] = o->desc.adam_w_mode != 0; vals[2] = o->desc.use_nvlamb != 0;
        vals[3] = o->desc.wd_after_momentum != 0; vals[4] = o->desc.stochastic_rounding != 0;
        vals[5] = (int64_t)o->ngroups; vals[6] = (int64_t)o->ntensors;
        for (i = 0; i < 7; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, names[i], 0, NULL));
            CAPEX__OPT_TRY(capex_state_add_i64(w, nm, vals[i]));
        }
    }
    CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "max_grad_norm", 0, NULL));
    CAPEX__OPT_TRY(capex_state_add_f32(w, nm, o->desc.max_grad_norm));
    CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "seed", 0, NULL));
    CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_U64, 0, NULL, &o->desc.seed));
    if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) { /* its modes, and v: one f32 per parameter */
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_reg_inside_moment", 0, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, o->desc.reg_inside_moment != 0));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_init_zero", 0, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, o->desc.init_zero != 0));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_norm_type", 0, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, o->desc.norm_type));
        if (o->ntensors) {
            shape = (int64_t)o->ntensors;
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_grad_norm_avg", 0, NULL));
            CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_F32, 1, &shape, o->novo_v));
        }
    }
    CAPEX__OPT_TRY(capex__optim_sched_save(o, w, prefix));
    for (g = 0; g < o->ngroups; g++) {
        capex__optim_group *gr = &o->groups[g];
        int i;
        for (i = 0; i < 7; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.%s", g, capex__optim_hp_f32_names[i]));
            CAPEX__OPT_TRY(capex_state_add_f32(w, nm, *capex__optim_hp_f32(&gr->hp, i)));
        }
        for (i = 0; i < 3; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.%s", g, capex__optim_hp_i64_names[i]));
            CAPEX__OPT_TRY(capex_state_add_i64(w, nm, *capex__optim_hp_int(&gr->hp, i)));
        }
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.step", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, gr->step));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.momentum_init", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, gr->mom_init));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.count", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, (int64_t)gr->count));
        /* Adagrad's and amsgrad's (files from before them lack these: 0) */
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.lr_decay", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_f32(w, nm, gr->hp.lr_decay));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.initial_accumulator_value", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_f32(w, nm, gr->hp.initial_accumulator_value));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.amsgrad", g, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, gr->hp.amsgrad != 0));
    }
    for (k = 0; k < o->ntensors; k++) {
        const capex_optim_param *p = &o->tensors[k].p;
        shape = p->numel;
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.numel", k, NULL));
        CAPEX__OPT_TRY(capex_state_add_i64(w, nm, p->numel));
        if (p->exp_avg) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.exp_avg", k, NULL));
            CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_F32, 1, &shape, p->exp_avg));
        }
        if (p->exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, capex__optim_v_name(o), k, NULL));
            CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_F32, 1, &shape, p->exp_avg_sq));
        }
        if (p->max_exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.max_exp_avg_sq", k, NULL));
            CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_F32, 1, &shape, p->max_exp_avg_sq));
        }
        if ((flags & CAPEX_OPTIM_STATE_PARAMS) && p->numel) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.param", k, NULL));
            CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, CAPEX_STATE_F32, 1, &shape, p->param));
            if (p->model) {
                CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.model", k, NULL));
                CAPEX__OPT_TRY(capex_state_add_tensor(w, nm, (capex_state_dtype)p->model_dtype, 1, &shape, p->model));
            }
        }
    }
    return CAPEX_OK;
}

/* Checks that name exists with dtype and numel (shape [numel]). */
static capex_result capex__optim_expect(capex_state_reader *rd, const char *nm, capex_state_dtype dt, int64_t numel) {
    capex_state_tensor_info info;
    capex_result r = capex_state_find(rd, nm, &info);
    if (r != CAPEX_OK)
        return capex__fail(r, "optimizer state: '%s' is missing; was the file saved from an optimizer with the same "
                           "groups and parameters (and flags)?", nm);
    if (info.dtype != dt || info.ndim != 1 || info.shape[0] != numel)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "optimizer state: '%s' is %s with %lld elements; expected %s [%lld]",
                           nm, capex_state_dtype_name(info.dtype), (long long)info.numel, capex_state_dtype_name(dt),
                           (long long)numel);
    return CAPEX_OK;
}

static capex_result capex__optim_get_i64(capex_state_reader *rd, const char *nm, int64_t *v) {
    capex_result r = capex_state_get_i64(rd, nm, v);
    if (r != CAPEX_OK)
        return capex__fail(r, "optimizer state: cannot read '%s' (%s); is this an optimizer state file?", nm,
                           capex_result_string(r));
    return CAPEX_OK;
}

CAPEX_API capex_result capex_optim_load(capex_optim *o, capex_state_reader *rd, const char *prefix, unsigned flags) {
    char nm[CAPEX__OPT_NAME_MAX];
    capex_result r;
    size_t g, k;
    int64_t kind, modes[7], v;
    float mgn;
    uint64_t seed;
    capex_optim_desc nd;
    capex_lr_schedule sched;
    int has_sched = 0;
    int64_t sched_iter = -1;
    capex_optim_hparams *hps = NULL;
    int64_t *steps = NULL;
    const capex_allocator *a;
    if (!o || !rd) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_load: optimizer or reader is NULL");
    if ((r = capex__optim_flags_ok(flags, "capex_optim_load")) != CAPEX_OK) return r;
    if (!prefix) prefix = "optim";
    a = capex__optim_alloc(o);
    /* 1. optimizer-wide settings */
    {
        const char *names[7] = {"kind", "adam_w_mode", "use_nvlamb", "wd_after_momentum", "stochastic_rounding",
                                "num_groups", "num_params"};
        int i;
        for (i = 0; i < 7; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, names[i], 0, NULL));
            CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &modes[i]));
        }
    }
    kind = modes[0];
    if (kind != (int64_t)o->desc.kind)
        return capex__fail(CAPEX_ERR_CONFIG, "optimizer state: the file holds optimizer kind %lld, this optimizer is "
                           "kind %d (0 Adam, 1 LAMB, 2 SGD, 3 Adagrad, 4 NovoGrad)", (long long)kind, (int)o->desc.kind);
    if (modes[5] != (int64_t)o->ngroups || modes[6] != (int64_t)o->ntensors)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "optimizer state: the file has %lld groups and %lld parameters, "
                           "this optimizer %zu and %zu; add the same groups before loading", (long long)modes[5],
                           (long long)modes[6], o->ngroups, o->ntensors);
    CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "max_grad_norm", 0, NULL));
    if ((r = capex_state_get_f32(rd, nm, &mgn)) != CAPEX_OK)
        return capex__fail(r, "optimizer state: cannot read '%s'", nm);
    CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "seed", 0, NULL));
    if ((r = capex_state_read_tensor(rd, nm, CAPEX_STATE_U64, 1, &seed)) != CAPEX_OK)
        return capex__fail(r, "optimizer state: cannot read '%s'", nm);
    nd = o->desc;
    nd.adam_w_mode = modes[1] != 0; nd.use_nvlamb = modes[2] != 0; nd.wd_after_momentum = modes[3] != 0;
    nd.stochastic_rounding = modes[4] != 0; nd.max_grad_norm = mgn; nd.seed = seed;
    if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) {
        int64_t nv[3];
        const char *names[3] = {"novograd_reg_inside_moment", "novograd_init_zero", "novograd_norm_type"};
        int i;
        for (i = 0; i < 3; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, names[i], 0, NULL));
            CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &nv[i]));
        }
        nd.reg_inside_moment = nv[0] != 0; nd.init_zero = nv[1] != 0;
        nd.norm_type = nv[2] >= -1000 && nv[2] <= 1000 ? (int)nv[2] : -1; /* check_desc refuses all but 2 */
        if (o->ntensors) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_grad_norm_avg", 0, NULL));
            CAPEX__OPT_TRY(capex__optim_expect(rd, nm, CAPEX_STATE_F32, (int64_t)o->ntensors));
        }
    }
    if ((r = capex__optim_check_desc(&nd)) != CAPEX_OK) return r;
    CAPEX__OPT_TRY(capex__optim_sched_load(rd, prefix, &sched, &has_sched, &sched_iter));
    /* 2. groups */
    hps = (capex_optim_hparams *)capex__alloc(a, (o->ngroups + 1) * sizeof *hps);
    steps = (int64_t *)capex__alloc(a, 2 * (o->ngroups + 1) * sizeof *steps);
    if (!hps || !steps) {
        capex__free(a, hps); capex__free(a, steps);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_optim_load: out of memory");
    }
#undef CAPEX__OPT_TRY
#define CAPEX__OPT_TRY(x) do { if ((r = (x)) != CAPEX_OK) goto done; } while (0)
    for (g = 0; g < o->ngroups; g++) {
        int i;
        memset(&hps[g], 0, sizeof hps[g]);
        for (i = 0; i < 7; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.%s", g, capex__optim_hp_f32_names[i]));
            if ((r = capex_state_get_f32(rd, nm, capex__optim_hp_f32(&hps[g], i))) != CAPEX_OK) {
                r = capex__fail(r, "optimizer state: cannot read '%s'", nm);
                goto done;
            }
        }
        for (i = 0; i < 3; i++) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.%s", g, capex__optim_hp_i64_names[i]));
            CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &v));
            *capex__optim_hp_int(&hps[g], i) = v != 0;
        }
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.lr_decay", g, NULL));
        CAPEX__OPT_TRY(capex__optim_opt_f32(rd, nm, &hps[g].lr_decay));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.initial_accumulator_value", g, NULL));
        CAPEX__OPT_TRY(capex__optim_opt_f32(rd, nm, &hps[g].initial_accumulator_value));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.amsgrad", g, NULL));
        {
            capex_state_tensor_info info;
            if (capex_state_find(rd, nm, &info) == CAPEX_OK) {
                CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &v));
                hps[g].amsgrad = v != 0;
            }
        }
        if (o->desc.kind == CAPEX_OPTIM_ADAM && (hps[g].amsgrad != 0) != (o->groups[g].hp.amsgrad != 0)) {
            r = capex__fail(CAPEX_ERR_CONFIG, "optimizer state: group %zu has amsgrad %d in the file and %d here; "
                            "create the group with the file's amsgrad", g, hps[g].amsgrad != 0,
                            o->groups[g].hp.amsgrad != 0);
            goto done;
        }
        CAPEX__OPT_TRY(capex__optim_check_hp(&nd, &hps[g]));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.step", g, NULL));
        CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &steps[2 * g]));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.momentum_init", g, NULL));
        CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &steps[2 * g + 1]));
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "group%zu.count", g, NULL));
        CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &v));
        if (steps[2 * g] < 0 || steps[2 * g] > CAPEX_STEP_MAX) {
            r = capex__fail(CAPEX_ERR_FORMAT, "optimizer state: group %zu has step %lld; it must lie in [0, "
                            "CAPEX_STEP_MAX = 2^53] (a corrupt or forged file)", g, (long long)steps[2 * g]);
            goto done;
        }
        if (v != (int64_t)o->groups[g].count) {
            r = capex__fail(CAPEX_ERR_SIZE_MISMATCH, "optimizer state: group %zu has %lld parameters (step %lld) in the "
                            "file, %zu here", g, (long long)v, (long long)steps[2 * g], o->groups[g].count);
            goto done;
        }
        if (o->desc.kind == CAPEX_OPTIM_SGD && hps[g].momentum != 0.0f && !o->groups[g].mom_bufs) {
            r = capex__fail(CAPEX_ERR_CONFIG, "optimizer state: group %zu uses momentum in the file but was created "
                            "here without it (no buffers)", g);
            goto done;
        }
    }
    /* 3. every tensor's presence, dtype and shape */
    for (k = 0; k < o->ntensors; k++) {
        const capex_optim_param *p = &o->tensors[k].p;
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.numel", k, NULL));
        CAPEX__OPT_TRY(capex__optim_get_i64(rd, nm, &v));
        if (v != p->numel) {
            r = capex__fail(CAPEX_ERR_SIZE_MISMATCH, "optimizer state: parameter %zu has %lld elements in the file, "
                            "%lld here", k, (long long)v, (long long)p->numel);
            goto done;
        }
        if (p->exp_avg) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.exp_avg", k, NULL));
            CAPEX__OPT_TRY(capex__optim_expect(rd, nm, CAPEX_STATE_F32, p->numel));
        }
        if (p->exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, capex__optim_v_name(o), k, NULL));
            CAPEX__OPT_TRY(capex__optim_expect(rd, nm, CAPEX_STATE_F32, p->numel));
        }
        if (p->max_exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.max_exp_avg_sq", k, NULL));
            CAPEX__OPT_TRY(capex__optim_expect(rd, nm, CAPEX_STATE_F32, p->numel));
        }
        if ((flags & CAPEX_OPTIM_STATE_PARAMS) && p->numel) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.param", k, NULL));
            CAPEX__OPT_TRY(capex__optim_expect(rd, nm, CAPEX_STATE_F32, p->numel));
            if (p->model) {
                CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.model", k, NULL));
                CAPEX__OPT_TRY(capex__optim_expect(rd, nm, (capex_state_dtype)p->model_dtype, p->numel));
            }
        }
    }
    /* 4. commit: copy tensors in (only I/O can fail now), then the scalars */
    o->broken = 1;
    if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD && o->ntensors) {
        CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "novograd_grad_norm_avg", 0, NULL));
        CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, CAPEX_STATE_F32, (uint64_t)o->ntensors, o->novo_v));
    }
    for (k = 0; k < o->ntensors; k++) {
        const capex_optim_param *p = &o->tensors[k].p;
        uint64_t n = (uint64_t)p->numel;
        if (!n) continue;
        if (p->exp_avg) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.exp_avg", k, NULL));
            CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, CAPEX_STATE_F32, n, p->exp_avg));
        }
        if (p->exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, capex__optim_v_name(o), k, NULL));
            CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, CAPEX_STATE_F32, n, p->exp_avg_sq));
        }
        if (p->max_exp_avg_sq) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.max_exp_avg_sq", k, NULL));
            CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, CAPEX_STATE_F32, n, p->max_exp_avg_sq));
        }
        if (flags & CAPEX_OPTIM_STATE_PARAMS) {
            CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.param", k, NULL));
            CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, CAPEX_STATE_F32, n, p->param));
            if (p->model) {
                CAPEX__OPT_TRY(capex__optim_name(nm, prefix, "param%zu.model", k, NULL));
                CAPEX__OPT_TRY(capex_state_read_tensor(rd, nm, (capex_state_dtype)p->model_dtype, n, p->model));
            }
        }
    }
    for (g = 0; g < o->ngroups; g++) {
        o->groups[g].hp = hps[g];
        o->groups[g].step = steps[2 * g];
        o->groups[g].mom_init = steps[2 * g + 1] != 0;
    }
    nd.allocator = NULL;
    o->desc = nd;
    if (has_sched) { /* checked above; else keep the attached one */
        (void)capex_optim_set_lr_schedule(o, &sched);
        /* a file from before the count: the most steps a group took, exact when none was skipped */
        if (sched_iter < 0)
            for (g = 0, sched_iter = 0; g < o->ngroups; g++)
                if (o->groups[g].step > sched_iter) sched_iter = o->groups[g].step;
        o->sched_iter = sched_iter;
    }
    o->broken = 0;
    if (flags & CAPEX_OPTIM_STATE_PARAMS) o->host_block_params = 1;
done:
    capex__free(a, hps);
    capex__free(a, steps);
    return r;
#undef CAPEX__OPT_TRY
}

CAPEX_API capex_result capex_optim_save_file(const capex_optim *o, const char *path, unsigned flags) {
    capex_state_writer *w = NULL;
    capex_result r;
    if (!o || !path) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_save_file: optimizer or path is NULL");
    if ((r = capex_state_writer_create(capex__optim_alloc(o), &w)) != CAPEX_OK) return r;
    r = capex_optim_save(o, w, NULL, flags);
    if (r == CAPEX_OK) r = capex_state_write_file(w, path);
    capex_state_writer_destroy(w);
    return r;
}

CAPEX_API capex_result capex_optim_load_file(capex_optim *o, const char *path, unsigned flags) {
    capex_state_reader *rd = NULL;
    capex_result r;
    if (!o || !path) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_optim_load_file: optimizer or path is NULL");
    if ((r = capex_state_reader_open_file(path, 0, capex__optim_alloc(o), &rd)) != CAPEX_OK) return r;
    r = capex_optim_load(o, rd, NULL, flags);
    capex_state_reader_close(rd);
    return r;
}
#endif /* CAPEX_NO_STATE */

/* ==== data parallel: implementation ==== */

/* ---- data parallel: platform ------------------------------------------- */
/* POSIX pieces (clock, sockets) are guarded: a build where they are hidden
   (strict -std=c99 with a system header included before capex.h) falls back
   to time() and numeric IPv4 addresses; CAPEX_NO_SOCKETS leaves the
   rendezvous out entirely (CAPEX_NO_DIST all of data parallel but this clock). */
#if (defined(__unix__) || defined(__APPLE__)) && !defined(CAPEX_NO_SOCKETS) && !defined(CAPEX_NO_DIST)
#  define CAPEX__HAVE_SOCKETS 1
#  include <errno.h>
#  include <fcntl.h>
#  include <poll.h>
#  include <unistd.h>
#  include <sys/types.h>
#  include <sys/socket.h>
#  include <netinet/in.h>
#  include <netinet/tcp.h>
#  include <arpa/inet.h>
#  include <netdb.h>
#endif
#include <time.h>
#include <limits.h>

CAPEX_API double capex_dist_now(void) {
#if defined(CLOCK_MONOTONIC) && (defined(__unix__) || defined(__APPLE__))
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#endif
    return (double)time(NULL);
}

/* Sleeps about s seconds (used between polls and connection retries). */
CAPEX__PRIVATE void capex__sleep_s(double s) {
    if (s <= 0) return;
#if defined(CLOCK_MONOTONIC) && (defined(__unix__) || defined(__APPLE__))
    {
        struct timespec ts;
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
#elif defined(CAPEX__HAVE_SOCKETS)
    poll(NULL, 0, s < 0.001 ? 1 : (int)(s * 1000.0));
#else
    { double end = capex_dist_now() + s; while (capex_dist_now() < end) { } }
#endif
}

#ifndef CAPEX_NO_DIST /* CAPEX_NO_DIST: from here to the sampler, all of data parallel */
/* ---- data parallel: launcher environment -------------------------------- */

static const char *capex__getenv_default(const char *name, void *user) {
    (void)user;
    return getenv(name);
}

#define CAPEX__TAG_DIST_ENV_DESC CAPEX__TAG('D', 'E', 'N', 'V')
CAPEX_API void capex_dist_env_desc_init(capex_dist_env_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_DIST_ENV_DESC;
    d->getenv_fn = NULL;
    d->rank = d->world_size = d->local_rank = d->local_world_size = -1;
    d->master_addr = NULL;
    d->master_port = -1;
    d->run_id = NULL;
}

CAPEX_API const char *capex_launcher_name(capex_launcher l) {
    switch (l) {
    case CAPEX_LAUNCHER_NONE: return "none (single process)";
    case CAPEX_LAUNCHER_EXPLICIT: return "explicit";
    case CAPEX_LAUNCHER_TORCHRUN: return "torchrun";
    case CAPEX_LAUNCHER_OPENMPI: return "Open MPI";
    case CAPEX_LAUNCHER_PMI: return "PMI (MPICH/Intel MPI)";
    case CAPEX_LAUNCHER_SLURM: return "Slurm";
    case CAPEX_LAUNCHER_FLUX: return "Flux";
    }
    return "unknown launcher";
}

/* Strict decimal: digits only, no sign, no spaces, value <= INT_MAX. */
CAPEX__PRIVATE int capex__parse_int(const char *s, int *out) {
    long long v = 0;
    if (!s || !*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        v = v * 10 + (*s - '0');
        if (v > INT_MAX) return 0;
    }
    *out = (int)v;
    return 1;
}

typedef struct capex__envctx { capex_getenv_fn fn; void *user; } capex__envctx;

/* *out untouched and *found = 0 when the variable is unset. */
CAPEX__PRIVATE capex_result capex__env_int(const capex__envctx *e, const char *name, int *out, int *found) {
    const char *v = e->fn(name, e->user);
    *found = 0;
    if (!v) return CAPEX_OK;
    if (!capex__parse_int(v, out))
        return capex__fail(CAPEX_ERR_CONFIG, "environment variable %s='%.64s' is not a non-negative decimal integer; "
                                             "fix the launcher setup or unset it", name, v);
    *found = 1;
    return CAPEX_OK;
}

/* Slurm's SLURM_TASKS_PER_NODE: "2(x3),1" = 2 tasks on each of 3 nodes,
   then 1. Returns the count of node `node`, or 0 on a malformed string. */
CAPEX__PRIVATE int capex__slurm_tasks_on_node(const char *s, int node) {
    long long seen = 0;
    int found = 0;
    if (!s || node < 0) return 0;
    /* the whole string must parse, even past the entry we need */
    while (*s) {
        long long tasks = 0, rep = 1;
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') { tasks = tasks * 10 + (*s++ - '0'); if (tasks > INT_MAX) return 0; }
        if (*s == '(') {
            s++;
            if (*s++ != 'x') return 0;
            if (*s < '0' || *s > '9') return 0;
            rep = 0;
            while (*s >= '0' && *s <= '9') { rep = rep * 10 + (*s++ - '0'); if (rep > INT_MAX) return 0; }
            if (*s++ != ')') return 0;
        }
        if (tasks == 0 || rep == 0) return 0;
        if (!found && node < seen + rep) found = (int)tasks;
        seen += rep;
        if (*s == ',') { s++; if (!*s) return 0; }
        else if (*s) return 0;
    }
    return found;
}

CAPEX__PRIVATE void capex__copy_str(char *dst, size_t cap, const char *src) {
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

CAPEX_API capex_result capex_dist_env_read(const capex_dist_env_desc *desc, capex_dist_env *out) {
    capex_dist_env_desc dd;
    capex__envctx e;
    capex_dist_env r;
    capex_result res;
    int found = 0, lr_found = 0, lw_found = 0, v = 0, slurm_list = 0;
    const char *rank_var = "", *size_var = "", *s;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_env_read: out is NULL");
    if (!desc) { capex_dist_env_desc_init(&dd); desc = &dd; }
    if ((res = capex__desc_check(desc->init_tag, CAPEX__TAG_DIST_ENV_DESC, "capex_dist_env_read", "capex_dist_env_desc",
                                 "capex_dist_env_desc_init")) != CAPEX_OK)
        return res;
    e.fn = desc->getenv_fn ? desc->getenv_fn : capex__getenv_default;
    e.user = desc->getenv_user;
    memset(&r, 0, sizeof r);
    r.rank = 0; r.world_size = 1; r.local_rank = 0; r.local_world_size = 1;

    if (desc->rank >= 0 || desc->world_size >= 0) {
        if (desc->rank < 0 || desc->world_size < 0)
            return capex__fail(CAPEX_ERR_CONFIG, "capex_dist_env_read: give both rank (%d) and world_size (%d) "
                                                 "as explicit overrides, or neither (-1)", desc->rank, desc->world_size);
        r.launcher = CAPEX_LAUNCHER_EXPLICIT;
        r.rank = desc->rank; r.world_size = desc->world_size;
        rank_var = "desc.rank"; size_var = "desc.world_size";
    } else {
        /* torchrun before MPI and Slurm: torchrun inside an srun/mpirun step
           spawns several workers per task and RANK is theirs. Flux before
           Slurm: the tasks of a Flux instance started by srun inherit its
           broker's Slurm variables. Flux has no local size variable (NULL). */
        static const char *const names[5][5] = {
            {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL},
            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL},
            {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL},
            {"FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID", NULL, NULL},
            {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", NULL}};
        static const capex_launcher kinds[5] = {CAPEX_LAUNCHER_TORCHRUN, CAPEX_LAUNCHER_OPENMPI, CAPEX_LAUNCHER_PMI,
                                                CAPEX_LAUNCHER_FLUX, CAPEX_LAUNCHER_SLURM};
        int k, lk; /* lk: whose local variables (PMI under srun or Flux: Slurm's or Flux's); 4 is Slurm */
        for (k = 0; k < 5; k++) {
            if (!e.fn(names[k][0], e.user)) continue;
            rank_var = names[k][0]; size_var = names[k][1];
            if ((res = capex__env_int(&e, names[k][0], &r.rank, &found)) != CAPEX_OK) return res;
            if ((res = capex__env_int(&e, names[k][1], &r.world_size, &found)) != CAPEX_OK) return res;
            if (!found && k == 4) {
                if ((res = capex__env_int(&e, "SLURM_NPROCS", &r.world_size, &found)) != CAPEX_OK) return res;
                size_var = "SLURM_NPROCS";
            }
            if (!found)
                return capex__fail(CAPEX_ERR_CONFIG, "%s is set but %s is not: the %s launch is incomplete; set both",
                                   names[k][0], names[k][1], capex_launcher_name(kinds[k]));
            lk = k;
            if (k == 2 && !e.fn(names[2][2], e.user) && !e.fn(names[2][3], e.user)) {
                /* srun --mpi=pmi2 and Flux's PMI set PMI_RANK and PMI_SIZE but
                   no local variables: Flux's or Slurm's, when they describe
                   this same task */
                int sp = -1, sn = -1;
                const char *n = e.fn("SLURM_NTASKS", e.user);
                if (capex__parse_int(e.fn("FLUX_TASK_RANK", e.user), &sp) &&
                    capex__parse_int(e.fn("FLUX_JOB_SIZE", e.user), &sn) && sp == r.rank && sn == r.world_size)
                    lk = 3;
                else if (capex__parse_int(e.fn("SLURM_PROCID", e.user), &sp) &&
                         capex__parse_int(n ? n : e.fn("SLURM_NPROCS", e.user), &sn) && sp == r.rank &&
                         sn == r.world_size)
                    lk = 4;
            }
            if ((res = capex__env_int(&e, names[lk][2], &r.local_rank, &lr_found)) != CAPEX_OK) return res;
            s = names[lk][3] ? e.fn(names[lk][3], e.user) : NULL;
            if (lk == 4 && s && !capex__parse_int(s, &v)) {
                /* SLURM_NTASKS_PER_NODE may be a list like "2(x3)" or "2,1": only
                   SLURM_TASKS_PER_NODE and SLURM_NODEID (below) can be used */
                if (!strchr(s, '(') && !strchr(s, ','))
                    return capex__fail(CAPEX_ERR_CONFIG, "SLURM_NTASKS_PER_NODE='%.64s' is neither a task count nor a "
                                                         "Slurm list like 2(x3),1", s);
                s = NULL;
            }
            if (lk == 4) {
                /* the layout (SLURM_TASKS_PER_NODE's entry for SLURM_NODEID) wins
                   over SLURM_NTASKS_PER_NODE, only the --ntasks-per-node request:
                   a node may hold fewer (the last of -n 5 at 2 a node) */
                int node = 0, nf = 0;
                const char *tl = e.fn("SLURM_TASKS_PER_NODE", e.user);
                if ((res = capex__env_int(&e, "SLURM_NODEID", &node, &nf)) != CAPEX_OK) return res;
                if (nf && tl) {
                    int t = capex__slurm_tasks_on_node(tl, node);
                    if (t <= 0)
                        return capex__fail(CAPEX_ERR_CONFIG, "SLURM_TASKS_PER_NODE='%.64s' is malformed or has no "
                                                             "entry for SLURM_NODEID=%d", tl, node);
                    r.local_world_size = t;
                    lw_found = 1;
                    slurm_list = strchr(tl, ',') != NULL;
                    s = NULL;
                }
            }
            if (s && (res = capex__env_int(&e, names[lk][3], &r.local_world_size, &lw_found)) != CAPEX_OK) return res;
            r.launcher = kinds[k];
            break;
        }
    }
    if (desc->local_rank >= 0) { r.local_rank = desc->local_rank; lr_found = 1; }
    if (desc->local_world_size >= 0) { r.local_world_size = desc->local_world_size; lw_found = 1; }
    /* Missing local information: assume one node (local = global) unless the
       local world size alone is known (then block placement). */
    if (!lr_found && !lw_found) { r.local_rank = r.rank; r.local_world_size = r.world_size; }
    else if (!lr_found) r.local_rank = r.local_world_size > 0 ? r.rank % r.local_world_size : 0;
    else if (!lw_found) r.local_world_size = r.world_size;

    if (r.world_size < 1)
        return capex__fail(CAPEX_ERR_CONFIG, "world size %s=%d must be at least 1", size_var, r.world_size);
    if (r.rank < 0 || r.rank >= r.world_size)
        return capex__fail(CAPEX_ERR_CONFIG, "rank %s=%d must be in [0, %d) (world size from %s)", rank_var, r.rank,
                           r.world_size, size_var);
    if (r.local_world_size < 1 || r.local_world_size > r.world_size)
        return capex__fail(CAPEX_ERR_CONFIG, "local world size %d must be in [1, world size %d]", r.local_world_size,
                           r.world_size);
    if (r.local_rank < 0 || r.local_rank >= r.local_world_size)
        return capex__fail(CAPEX_ERR_CONFIG, "local rank %d must be in [0, local world size %d)", r.local_rank,
                           r.local_world_size);
    /* uniform block placement only: a cyclic one (mpirun --map-by node,
       srun -m cyclic) puts rank r at local rank != r % local world size,
       and a Slurm list with several entries ("2(x2),4") is not uniform */
    r.node_rank = r.world_size % r.local_world_size == 0 && r.local_rank == r.rank % r.local_world_size && !slurm_list
                      ? r.rank / r.local_world_size : -1;

    s = desc->master_addr ? desc->master_addr : e.fn("MASTER_ADDR", e.user);
    if (s && strlen(s) >= sizeof r.master_addr)
        return capex__fail(CAPEX_ERR_CONFIG, "MASTER_ADDR is longer than %u characters", (unsigned)sizeof r.master_addr - 1);
    capex__copy_str(r.master_addr, sizeof r.master_addr, s);
    if (desc->master_port >= 0) {
        r.master_port = desc->master_port;
        if (r.master_port < 1 || r.master_port > 65535)
            return capex__fail(CAPEX_ERR_CONFIG, "desc.master_port=%d must be in [1, 65535]", r.master_port);
    } else {
        if ((res = capex__env_int(&e, "MASTER_PORT", &r.master_port, &found)) != CAPEX_OK) return res;
        if (found && (r.master_port < 1 || r.master_port > 65535))
            return capex__fail(CAPEX_ERR_CONFIG, "MASTER_PORT=%d must be in [1, 65535]", r.master_port);
    }
    r.rdv_port = r.master_port;
    if ((res = capex__env_int(&e, "CAPEX_PORT", &r.rdv_port, &found)) != CAPEX_OK) return res;
    if (found && (r.rdv_port < 1 || r.rdv_port > 65535))
        return capex__fail(CAPEX_ERR_CONFIG, "CAPEX_PORT=%d must be in [1, 65535]", r.rdv_port);
    if (!found && desc->master_port < 0 && r.launcher == CAPEX_LAUNCHER_TORCHRUN && r.master_port > 0) {
        s = e.fn("TORCHELASTIC_USE_AGENT_STORE", e.user);
        if (s && (!strcmp(s, "True") || !strcmp(s, "true") || !strcmp(s, "1"))) {
            if (r.master_port == 65535)
                return capex__fail(CAPEX_ERR_CONFIG, "torchrun's store holds MASTER_PORT=65535 and capex would listen on the "
                                                     "next port: choose another MASTER_PORT or set CAPEX_PORT");
            r.rdv_port = r.master_port + 1;
        }
    }
    if (desc->run_id) s = desc->run_id;
    else if ((s = e.fn("CAPEX_RUN_ID", e.user)) != NULL) { }
    else if ((s = e.fn("TORCHELASTIC_RUN_ID", e.user)) != NULL) { }
    else if ((s = e.fn("OMPI_MCA_ess_base_jobid", e.user)) != NULL) { }
    else if ((s = e.fn("FLUX_JOB_ID", e.user)) != NULL) { /* before Slurm's: Flux may run inside a Slurm job */
        char buf[128];
        snprintf(buf, sizeof buf, "flux-%.100s", s);
        capex__copy_str(r.run_id, sizeof r.run_id, buf);
        s = NULL;
    } else if ((s = e.fn("SLURM_JOB_ID", e.user)) != NULL) {
        const char *step = e.fn("SLURM_STEP_ID", e.user);
        char buf[128];
        snprintf(buf, sizeof buf, "slurm-%.60s.%.60s", s, step ? step : "");
        capex__copy_str(r.run_id, sizeof r.run_id, buf);
        s = NULL;
    }
    if (s) {
        if (strlen(s) >= sizeof r.run_id)
            return capex__fail(CAPEX_ERR_CONFIG, "run id '%.32s...' is longer than %u characters", s,
                               (unsigned)sizeof r.run_id - 1);
        capex__copy_str(r.run_id, sizeof r.run_id, s);
    }
    *out = r;
    return CAPEX_OK;
}

CAPEX_API void capex_dist_log_init(const capex_dist_env *env) {
    if (env) capex_log_set_rank(env->rank);
}

/* ---- data parallel: host element helpers -------------------------------- */

CAPEX__PRIVATE int capex__dtype_ok(capex_dtype t) { return t == CAPEX_F32 || t == CAPEX_F16 || t == CAPEX_BF16; }
CAPEX_API size_t capex_comm_dtype_size(capex_dtype t) {
    int v = (int)t;
    return v == 3 || v == 4 ? 8 : capex_dtype_size(t);
}
CAPEX__PRIVATE int capex__comm_dtype_ok(capex_dtype t) { return capex_comm_dtype_size(t) != 0; }
CAPEX__PRIVATE int capex__comm_wide(capex_dtype t) { return t == CAPEX_F64 || t == CAPEX_I64; }
/* sum += x for the 8-byte types (int64 wraps like two's complement, as MPI/NCCL). */
CAPEX__PRIVATE void capex__host_add_wide(void *acc, const void *x, size_t n, capex_dtype t) {
    size_t i;
    if (t == CAPEX_F64) { double *a = (double *)acc; const double *b = (const double *)x; for (i = 0; i < n; i++) a[i] += b[i]; }
    else { uint64_t *a = (uint64_t *)acc; const uint64_t *b = (const uint64_t *)x; for (i = 0; i < n; i++) a[i] += b[i]; }
}

CAPEX__PRIVATE float capex__load(const void *p, capex_dtype t, size_t i) {
    if (t == CAPEX_F32) return ((const float *)p)[i];
    if (t == CAPEX_F16) return capex__f16_to_f32_v(((const uint16_t *)p)[i]);
    return capex__bits_f32((uint32_t)((const uint16_t *)p)[i] << 16);
}
CAPEX__PRIVATE void capex__store(void *p, capex_dtype t, size_t i, float v) {
    if (t == CAPEX_F32) ((float *)p)[i] = v;
    else if (t == CAPEX_F16) ((uint16_t *)p)[i] = (uint16_t)capex__h16_store(v);
    else ((uint16_t *)p)[i] = (uint16_t)capex__b16_store(v);
}
/* x *= factor in f32 (Apex's tensor.mul_(python float) on an f32 tensor). */
CAPEX__PRIVATE void capex__host_scale(void *buf, size_t n, capex_dtype t, float factor) {
    size_t i;
    if (t == CAPEX_F32) { float *f = (float *)buf; for (i = 0; i < n; i++) f[i] *= factor; return; }
    for (i = 0; i < n; i++) capex__store(buf, t, i, capex__load(buf, t, i) * factor);
}
/* x /= d (PyTorch's AVG: sum, then divide by the world size). */
CAPEX__PRIVATE void capex__host_div(void *buf, size_t n, capex_dtype t, float d) {
    size_t i;
    if (t == CAPEX_F32) { float *f = (float *)buf; for (i = 0; i < n; i++) f[i] /= d; return; }
    for (i = 0; i < n; i++) capex__store(buf, t, i, capex__load(buf, t, i) / d);
}
CAPEX__PRIVATE void capex__host_convert(void *dst, capex_dtype dt, const void *src, capex_dtype st, size_t n) {
    size_t i;
    if (dt == st) { memmove(dst, src, n * capex_dtype_size(st)); return; }
    if (st == CAPEX_F32 && dt == CAPEX_F16) { capex_f32_to_f16_array((const float *)src, (uint16_t *)dst, n); return; }
    if (st == CAPEX_F32 && dt == CAPEX_BF16) { capex_f32_to_bf16_array((const float *)src, (uint16_t *)dst, n); return; }
    if (st == CAPEX_F16 && dt == CAPEX_F32) { capex_f16_to_f32_array((const uint16_t *)src, (float *)dst, n); return; }
    if (st == CAPEX_BF16 && dt == CAPEX_F32) { capex_bf16_to_f32_array((const uint16_t *)src, (float *)dst, n); return; }
    for (i = 0; i < n; i++) capex__store(dst, dt, i, capex__load(src, st, i));
}

/* Memory entries of a comm, host defaults when the backend has none. */
CAPEX__PRIVATE capex_result capex__comm_alloc(capex_comm *c, void **p, size_t bytes) {
    *p = NULL;
    if (c->vt->mem_alloc) return c->vt->mem_alloc(c, p, bytes);
    *p = capex__alloc(c->allocator, bytes);
    if (!*p) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "out of memory allocating %lu bytes for a comm buffer",
                                (unsigned long)bytes);
    return CAPEX_OK;
}
CAPEX__PRIVATE void capex__comm_free(capex_comm *c, void *p) {
    if (!p) return;
    if (c->vt->mem_free) c->vt->mem_free(c, p);
    else capex__free(c->allocator, p);
}
/* The device buffer of a front-end's (DDP's, ZeRO's) small exchanges of
   host values (capex__comm_host) on a device comm without host_buffer (a
   custom vtable): made once at create, before the create's agreement, and
   grown at create only, so no agreement allocates where one rank failing
   alone would leave its peers in the exchange. Growth folds into the
   create's agreement: the smaller buffer serves that one. Unused (zero) on
   host comms and on comms with host_buffer. */
typedef struct capex__hostbuf { void *dev; size_t bytes; } capex__hostbuf;
/* Exchanges are blocking, so none is in flight; but after a timeout on a
   comm with no abort a late peer may still write it: leaked then. */
CAPEX__PRIVATE void capex__hostbuf_free(capex_comm *c, capex__hostbuf *hb) {
    if (hb->dev && c && c->vt && !(c->failed && !c->vt->abort)) capex__comm_free(c, hb->dev);
    hb->dev = NULL;
    hb->bytes = 0;
}
CAPEX__PRIVATE capex_result capex__hostbuf_make(capex_comm *c, capex__hostbuf *hb, size_t bytes) {
    void *p = NULL;
    capex_result r;
    if (!c->device_buffers || c->world_size <= 1 || c->vt->host_buffer || bytes <= hb->bytes) return CAPEX_OK;
    if ((r = capex__comm_alloc(c, &p, bytes)) != CAPEX_OK) return r; /* the old one stays usable */
    capex__hostbuf_free(c, hb);
    hb->dev = p;
    hb->bytes = bytes;
    return CAPEX_OK;
}
CAPEX__PRIVATE capex_result capex__comm_copy(capex_comm *c, void *dst, const void *src, size_t bytes, capex_copy_kind k) {
    if (!bytes || dst == src) return CAPEX_OK;
    if (c->vt->mem_copy) return c->vt->mem_copy(c, dst, src, bytes, k);
    memmove(dst, src, bytes);
    return CAPEX_OK;
}
CAPEX__PRIVATE capex_result capex__comm_zero(capex_comm *c, void *dst, size_t bytes) {
    if (!bytes) return CAPEX_OK;
    if (c->vt->mem_zero) return c->vt->mem_zero(c, dst, bytes);
    memset(dst, 0, bytes);
    return CAPEX_OK;
}
CAPEX__PRIVATE capex_result capex__comm_scale(capex_comm *c, void *buf, size_t n, capex_dtype t, float f) {
    if (f == 1.0f || !n) return CAPEX_OK;
    if (c->vt->scale) return c->vt->scale(c, buf, n, t, f);
    capex__host_scale(buf, n, t, f);
    return CAPEX_OK;
}
CAPEX__PRIVATE capex_result capex__comm_convert(capex_comm *c, void *dst, capex_dtype dt, const void *src, capex_dtype st,
                                               size_t n) {
    if (!n) return CAPEX_OK;
    if (c->vt->convert) return c->vt->convert(c, dst, dt, src, st, n);
    capex__host_convert(dst, dt, src, st, n);
    return CAPEX_OK;
}

/* ---- data parallel: checked front-ends ---------------------------------- */

CAPEX__PRIVATE capex_result capex__comm_check(const capex_comm *c, const char *what) {
    if (!c || !c->vt) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: comm is NULL or not initialised", what);
    if (c->failed)
        return capex__fail(CAPEX_ERR_COMM, "%s: this communicator failed earlier (a timeout, a dead or failing peer, "
                                           "or a local failure mid-collective: the first error says which); its state "
                                           "is unknown: stop the job and restart from a checkpoint", what);
    return CAPEX_OK;
}

/* The comm's answer for param i's reduction dtype (capex_comm_vtable.check_dtype), its reason
   prefixed with fn and the param and followed by hint. */
CAPEX__PRIVATE capex_result capex__comm_dtype_check(capex_comm *c, capex_dtype t, const char *fn, size_t i,
                                                    const char *hint) {
    char why[256];
    capex_result r;
    if (!c->vt->check_dtype || (r = c->vt->check_dtype(c, t)) == CAPEX_OK) return CAPEX_OK;
    snprintf(why, sizeof why, "%.200s", capex_last_error()); /* the message buffer is rewritten next */
    return capex__fail(r, "%s: param %zu reduces in %s, which comm '%s' cannot: %s%s", fn, i, capex_dtype_name(t),
                       c->vt->name ? c->vt->name : "?", why, hint);
}

/* A timeout or peer failure poisons the communicator (in-flight MPI/NCCL
   collectives cannot be cancelled); abort lets NCCL tear down its kernels. */
CAPEX__PRIVATE capex_result capex__comm_after(capex_comm *c, capex_result r) {
    if (r == CAPEX_ERR_COMM || r == CAPEX_ERR_TIMEOUT || r == CAPEX_ERR_NCCL) {
        if (!c->failed && c->vt->abort) c->vt->abort(c);
        c->failed = 1;
    }
    return r;
}

/* A collective still in flight on a failed comm that had no abort entry to
   stop it (MPI cannot cancel a collective) may yet read or write its buffers
   when a late peer turns up: owners leak those buffers instead of freeing them. */
CAPEX__PRIVATE int capex__req_orphaned(const capex_comm *c, const capex_comm_req *q) {
    return q->active && c && c->failed && !(c->vt && c->vt->abort);
}

/* count elements of t, times `copies` (allgather: world), must fit size_t. */
CAPEX__PRIVATE capex_result capex__comm_size_check(const char *fn, size_t count, capex_dtype t, size_t copies) {
    size_t bytes;
    if (capex__size_mul(count, capex_comm_dtype_size(t), &bytes) || capex__size_mul(bytes, copies, &bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %zu elements of %zu bytes%s: the byte size overflows size_t", fn,
                           count, capex_comm_dtype_size(t), copies > 1 ? " per rank" : "");
    return CAPEX_OK;
}

CAPEX__PRIVATE double capex__deadline(const capex_comm *c) {
    double t = c->timeout_s > 0 ? c->timeout_s : 1800.0;
    return capex_dist_now() + t;
}

/* A collective of no elements is still a collective on a multi-rank host
   comm: a barrier, so that a rank passing 0 while the others pass n fails
   with them (TCP: op mismatch) instead of returning at once and pairing
   its next call with their data. */
CAPEX__PRIVATE capex_result capex__comm_empty(capex_comm *c) {
    if (c->world_size <= 1 || c->device_buffers) return CAPEX_OK;
    return capex__comm_after(c, c->vt->barrier(c, capex__deadline(c)));
}

/* A call this rank refuses or cannot start (CAPEX_ERR_INVALID_ARG: its
   arguments, or a size the backend refuses; CAPEX_ERR_OUT_OF_MEMORY or
   CAPEX_ERR_LIMIT before any traffic: the fallbacks' scratch, MPI's staging
   and int counts) is still a collective on a multi-rank host comm: a barrier
   stands in for it, as for no elements, so that peers making the real call
   fail at once (TCP: op mismatch; MPI: the arrival check) instead of waiting
   out their deadline, and this rank's next call cannot pair with their
   pending one. Ranks that all refuse alike meet in the barrier and the comm
   stays usable. A failure after traffic began has failed the comm (TCP:
   capex__tcp_local_fail) and is left alone. Keeps r and its message. */
CAPEX__PRIVATE capex_result capex__comm_refused(capex_comm *c, capex_result r) {
    char why[sizeof capex__error_message];
    if ((r != CAPEX_ERR_INVALID_ARG && r != CAPEX_ERR_OUT_OF_MEMORY && r != CAPEX_ERR_LIMIT) || !c || !c->vt || c->failed ||
        c->world_size <= 1 || c->device_buffers)
        return r;
    memcpy(why, capex__error_message, sizeof why);
    (void)capex__comm_empty(c);
    return capex__fail(r, "%s", why);
}

CAPEX__PRIVATE capex_result capex__comm_allreduce_checked(capex_comm *c, const void *send, void *recv, size_t count,
                                                          capex_dtype t, capex_reduce_op op) {
    capex_result r = capex__comm_check(c, "capex_comm_allreduce");
    if (r) return r;
    if (!capex__comm_dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: invalid dtype %d", (int)t);
    if (op != CAPEX_REDUCE_SUM && op != CAPEX_REDUCE_AVG)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: op %d is not SUM or AVG", (int)op);
    if (op == CAPEX_REDUCE_AVG && t == CAPEX_I64)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: AVG of int64 is not defined; SUM and divide");
    if (count && (!send || !recv)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: NULL buffer");
    if (!count) return capex__comm_empty(c);
    if ((r = capex__comm_size_check("capex_comm_allreduce", count, t, 1)) != CAPEX_OK) return r;
    return capex__comm_after(c, c->vt->allreduce(c, send, recv, count, t, op, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_allreduce(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                            capex_reduce_op op) {
    return capex__comm_refused(c, capex__comm_allreduce_checked(c, send, recv, count, t, op));
}

CAPEX__PRIVATE capex_result capex__comm_broadcast_checked(capex_comm *c, void *buf, size_t count, capex_dtype t, int root) {
    capex_result r = capex__comm_check(c, "capex_comm_broadcast");
    if (r) return r;
    if (!capex__comm_dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: invalid dtype %d", (int)t);
    if (root < 0 || root >= c->world_size)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: root %d not in [0, %d)", root, c->world_size);
    if (count && !buf) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: NULL buffer");
    if (!count) return capex__comm_empty(c);
    if ((r = capex__comm_size_check("capex_comm_broadcast", count, t, 1)) != CAPEX_OK) return r;
    return capex__comm_after(c, c->vt->broadcast(c, buf, count, t, root, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_broadcast(capex_comm *c, void *buf, size_t count, capex_dtype t, int root) {
    return capex__comm_refused(c, capex__comm_broadcast_checked(c, buf, count, t, root));
}

CAPEX__PRIVATE capex_result capex__comm_allgather_checked(capex_comm *c, const void *send, void *recv,
                                                          size_t count_per_rank, capex_dtype t) {
    capex_result r = capex__comm_check(c, "capex_comm_allgather");
    if (r) return r;
    if (!capex__comm_dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allgather: invalid dtype %d", (int)t);
    if (count_per_rank && (!send || !recv)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allgather: NULL buffer");
    if (!count_per_rank) return capex__comm_empty(c);
    if ((r = capex__comm_size_check("capex_comm_allgather", count_per_rank, t, (size_t)c->world_size)) != CAPEX_OK) return r;
    return capex__comm_after(c, c->vt->allgather(c, send, recv, count_per_rank, t, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_allgather(capex_comm *c, const void *send, void *recv, size_t count_per_rank,
                                            capex_dtype t) {
    return capex__comm_refused(c, capex__comm_allgather_checked(c, send, recv, count_per_rank, t));
}

CAPEX_API capex_result capex_comm_barrier(capex_comm *c) {
    capex_result r = capex__comm_check(c, "capex_comm_barrier");
    if (r) return r;
    return capex__comm_after(c, c->vt->barrier(c, capex__deadline(c)));
}

/* Sum of counts (elements) and this rank's displacement; refuses totals
   whose byte size wraps. */
CAPEX__PRIVATE capex_result capex__comm_counts(const capex_comm *c, const char *fn, const size_t *counts, capex_dtype t,
                                              size_t *total, size_t *displ) {
    size_t sum = 0, bytes;
    int p;
    *displ = 0;
    for (p = 0; p < c->world_size; p++) {
        if (p == c->rank) *displ = sum;
        if (counts[p] > SIZE_MAX - sum)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the counts (rank %d's is %zu) sum past SIZE_MAX", fn, p, counts[p]);
        sum += counts[p];
    }
    if (capex__size_mul(sum, capex_comm_dtype_size(t), &bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %zu elements of %zu bytes in all: the byte size overflows size_t", fn,
                           sum, capex_comm_dtype_size(t));
    *total = sum;
    return CAPEX_OK;
}

/* Backends without the entry: allreduce the whole buffer into scratch and
   keep this rank's slice (correct, not bandwidth-optimal). */
CAPEX__PRIVATE capex_result capex__comm_reduce_scatter_fallback(capex_comm *c, const void *send, void *recv,
                                                               const size_t *counts, capex_dtype t, capex_reduce_op op,
                                                               size_t total, size_t displ, double deadline) {
    size_t es = capex_comm_dtype_size(t);
    void *tmp = NULL;
    capex_result r = capex__comm_alloc(c, &tmp, total * es);
    if (r != CAPEX_OK) return r;
    r = c->vt->allreduce(c, send, tmp, total, t, op, deadline);
    if (r == CAPEX_OK) r = capex__comm_copy(c, recv, (char *)tmp + displ * es, counts[c->rank] * es, CAPEX_COPY_D2D);
    if (r != CAPEX_ERR_TIMEOUT) capex__comm_free(c, tmp); /* else a transport may still write it */
    return r;
}

/* ... and allgather of shards padded to the largest count, then compacted. */
CAPEX__PRIVATE capex_result capex__comm_allgatherv_fallback(capex_comm *c, const void *send, void *recv,
                                                           const size_t *counts, capex_dtype t, double deadline) {
    size_t es = capex_comm_dtype_size(t), m = 0, bytes, off = 0;
    void *tmp = NULL;
    capex_result r;
    int p;
    for (p = 0; p < c->world_size; p++) if (counts[p] > m) m = counts[p];
    if (capex__size_mul(m, es, &bytes) || capex__size_mul(bytes, (size_t)c->world_size * 2, &bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allgatherv: padded shards of %zu elements overflow size_t", m);
    if ((r = capex__comm_alloc(c, &tmp, bytes)) != CAPEX_OK) return r;
    /* tmp = [my padded shard | world padded shards] */
    r = capex__comm_zero(c, tmp, m * es);
    if (r == CAPEX_OK) r = capex__comm_copy(c, tmp, send, counts[c->rank] * es, CAPEX_COPY_D2D);
    if (r == CAPEX_OK) r = c->vt->allgather(c, tmp, (char *)tmp + m * es, m, t, deadline);
    for (p = 0; r == CAPEX_OK && p < c->world_size; p++) {
        r = capex__comm_copy(c, (char *)recv + off * es, (char *)tmp + m * es * (size_t)(p + 1), counts[p] * es,
                             CAPEX_COPY_D2D);
        off += counts[p];
    }
    if (r != CAPEX_ERR_TIMEOUT) capex__comm_free(c, tmp);
    return r;
}

CAPEX__PRIVATE capex_result capex__comm_reduce_scatter_checked(capex_comm *c, const void *send, void *recv,
                                                               const size_t *counts, capex_dtype t, capex_reduce_op op) {
    const char *fn = "capex_comm_reduce_scatter";
    size_t total = 0, displ = 0;
    double deadline;
    capex_result r = capex__comm_check(c, fn);
    if (r) return r;
    if (!capex__comm_dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: invalid dtype %d", fn, (int)t);
    if (op != CAPEX_REDUCE_SUM && op != CAPEX_REDUCE_AVG)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: op %d is not SUM or AVG", fn, (int)op);
    if (op == CAPEX_REDUCE_AVG && t == CAPEX_I64)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: AVG of int64 is not defined; SUM and divide", fn);
    if (!counts) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: counts is NULL (give world_size entries)", fn);
    if ((r = capex__comm_counts(c, fn, counts, t, &total, &displ)) != CAPEX_OK) return r;
    if (total && !send) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: send is NULL", fn);
    if (counts[c->rank] && !recv) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: recv is NULL", fn);
    if (!total) return capex__comm_empty(c);
    deadline = capex__deadline(c);
    if (!c->vt->reduce_scatter)
        return capex__comm_after(c, capex__comm_reduce_scatter_fallback(c, send, recv, counts, t, op, total, displ, deadline));
    return capex__comm_after(c, c->vt->reduce_scatter(c, send, recv, counts, t, op, deadline));
}

CAPEX_API capex_result capex_comm_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                                 capex_dtype t, capex_reduce_op op) {
    return capex__comm_refused(c, capex__comm_reduce_scatter_checked(c, send, recv, counts, t, op));
}

CAPEX__PRIVATE capex_result capex__comm_allgatherv_checked(capex_comm *c, const void *send, void *recv,
                                                           const size_t *counts, capex_dtype t) {
    const char *fn = "capex_comm_allgatherv";
    size_t total = 0, displ = 0;
    double deadline;
    capex_result r = capex__comm_check(c, fn);
    if (r) return r;
    if (!capex__comm_dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: invalid dtype %d", fn, (int)t);
    if (!counts) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: counts is NULL (give world_size entries)", fn);
    if ((r = capex__comm_counts(c, fn, counts, t, &total, &displ)) != CAPEX_OK) return r;
    if (counts[c->rank] && !send) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: send is NULL", fn);
    if (total && !recv) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: recv is NULL", fn);
    if (!total) return capex__comm_empty(c);
    deadline = capex__deadline(c);
    if (!c->vt->allgatherv) return capex__comm_after(c, capex__comm_allgatherv_fallback(c, send, recv, counts, t, deadline));
    return capex__comm_after(c, c->vt->allgatherv(c, send, recv, counts, t, deadline));
}

CAPEX_API capex_result capex_comm_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                             capex_dtype t) {
    return capex__comm_refused(c, capex__comm_allgatherv_checked(c, send, recv, counts, t));
}

CAPEX_API void capex_comm_destroy(capex_comm *c) {
    if (!c || !c->vt) return;
    if (c->vt->destroy) c->vt->destroy(c);
    memset(c, 0, sizeof *c);
}

/* ---- data parallel: single-process backend ------------------------------ */

static capex_result capex__single_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                           capex_reduce_op op, double deadline) {
    (void)op; (void)deadline; /* sum or mean over one rank: the values themselves */
    return capex__comm_copy(c, recv, send, n * capex_comm_dtype_size(t), CAPEX_COPY_D2D);
}
static capex_result capex__single_broadcast(capex_comm *c, void *buf, size_t n, capex_dtype t, int root, double deadline) {
    (void)c; (void)buf; (void)n; (void)t; (void)root; (void)deadline;
    return CAPEX_OK;
}
static capex_result capex__single_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                           double deadline) {
    (void)deadline;
    return capex__comm_copy(c, recv, send, n * capex_comm_dtype_size(t), CAPEX_COPY_D2D);
}
static capex_result capex__single_barrier(capex_comm *c, double deadline) { (void)c; (void)deadline; return CAPEX_OK; }
static capex_result capex__single_iallreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                            capex_reduce_op op, capex_comm_req *req) {
    req->active = 1;
    return capex__single_allreduce(c, send, recv, n, t, op, 0);
}
static capex_result capex__single_wait(capex_comm *c, capex_comm_req *req, double deadline) {
    (void)c; (void)deadline;
    req->active = 0;
    return CAPEX_OK;
}

/* World of one: the shard is the whole buffer (counts[0] elements). */
static capex_result capex__single_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                                capex_dtype t, capex_reduce_op op, double deadline) {
    (void)op; (void)deadline;
    return capex__comm_copy(c, recv, send, counts[0] * capex_comm_dtype_size(t), CAPEX_COPY_D2D);
}
static capex_result capex__single_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                            capex_dtype t, double deadline) {
    (void)deadline;
    return capex__comm_copy(c, recv, send, counts[0] * capex_comm_dtype_size(t), CAPEX_COPY_D2D);
}

static const capex_comm_vtable capex__single_vt = {
    "single", capex__single_allreduce, capex__single_broadcast, capex__single_allgather, capex__single_barrier,
    capex__single_iallreduce, capex__single_wait, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    capex__single_reduce_scatter, capex__single_allgatherv, NULL, NULL, NULL, NULL, NULL};

CAPEX_API capex_result capex_comm_init_single(capex_comm *c) {
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_single: comm is NULL");
    memset(c, 0, sizeof *c);
    c->vt = &capex__single_vt;
    c->rank = 0;
    c->world_size = 1;
    c->timeout_s = 1800.0;
    return CAPEX_OK;
}

/* ---- data parallel: MPI backend (CAPEX_MPI) ----------------------------- */
#ifdef CAPEX_MPI

/* Blocking collectives: every rank first enters an MPI_Ibarrier polled with
   MPI_Test until the deadline (a stuck or absent peer gives CAPEX_ERR_TIMEOUT
   rather than a hang), checks that every rank called the same collective
   (capex__mpi_arrive: ranks that disagree get CAPEX_ERR_COMM), then runs
   MPI's blocking collective. The blocking call
   uses MPI's tuned algorithms and progress loop: the nonblocking twins
   (Open MPI's libnbc) polled with MPI_Test ran 1.4-1.8x slower at 64 KiB-64 MiB
   on np 2 (bench/RESULTS.md), and far worse when the polling rank competed
   for the core with its peer. Once every rank has arrived, a peer that dies
   mid-transfer is MPI's to report (MPI_ERRORS_RETURN) or mpirun's to tear
   down. Half types are summed in f32 and rounded once. Counts above INT_MAX
   are split into chunks. */
#define CAPEX__MPI_CHUNK ((size_t)1 << 30)

typedef struct capex__mpi { MPI_Comm comm; } capex__mpi;

static MPI_Comm capex__mpi_comm(capex_comm *c) { return ((capex__mpi *)c->impl)->comm; }

static capex_result capex__mpi_err(int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    msg[0] = '\0';
    MPI_Error_string(code, msg, &len);
    return capex__fail(CAPEX_ERR_COMM, "%s failed: %s (a peer probably died or the network failed)", what, msg);
}

/* MPI aborts the process on nearly any call after MPI_Finalize: a comm
   used then gets CAPEX_ERR_ORDER instead (a request left in flight is
   finished, so wait and test clear it). */
static capex_result capex__mpi_live(const char *what) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return capex__fail(CAPEX_ERR_ORDER, "%s: MPI_Finalize was called: destroy capex comms (and DDP / ZeRO) first", what);
    return CAPEX_OK;
}

/* Polls req until done or the deadline: spins briefly, then yields the CPU
   between tests after 2 ms so oversubscribed ranks let their peers run. (A 50 us sleep
   here throttled large messages to ~0.13 GB/s: MPI moves one fragment per
   test; bench/bench_dp.c measured it.) */
#if defined(__unix__) || defined(__APPLE__)
#  include <sched.h>
#  define CAPEX__MPI_YIELD() sched_yield()
#else
#  define CAPEX__MPI_YIELD() capex__sleep_s(50e-6)
#endif
static capex_result capex__mpi_poll(MPI_Request *req, double deadline, const char *what) {
    long spins = 0;
    double start = 0.0, now;
    for (;;) {
        int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, what);
        if (flag) return CAPEX_OK;
        if (++spins > 200) {
            now = capex_dist_now();
            if (spins == 201) start = now;
            if (now > deadline)
                return capex__fail(CAPEX_ERR_TIMEOUT, "%s did not complete before the deadline: a peer is stuck or "
                                                      "dead; raise comm->timeout_s if it is only slow", what);
            if (now - start > 2e-3) CAPEX__MPI_YIELD(); /* spin 2 ms like MPI's own wait, then share the CPU */
        }
    }
}

/* Every rank of the comm has reached this collective (an MPI_Ibarrier
   polled against the deadline), then every rank checks that all called the
   same one: a blocking MAX-allreduce of this call's key (kind, size, detail)
   and of its complement (so the minimum too). A rank whose call differs
   (another count or dtype or root, no elements, which the front-ends make a
   barrier, or another order) fails every rank with CAPEX_ERR_COMM, as over
   TCP; the barrier alone matched any call, returned CAPEX_OK on that rank
   and left the others in MPI's blocking collective with no deadline. (The
   key goes after the barrier: a polled MPI_Iallreduce cost ~4 us a call, a
   blocking one after the barrier ~1 us, np 2.) */
enum { CAPEX__MPI_ALLREDUCE = 1, CAPEX__MPI_BROADCAST = 2, CAPEX__MPI_ALLGATHER = 3, CAPEX__MPI_BARRIER = 4,
       CAPEX__MPI_REDUCE_SCATTER = 5, CAPEX__MPI_ALLGATHERV = 6 };
static capex_result capex__mpi_arrive(capex_comm *c, double deadline, const char *what, unsigned kind, uint64_t size,
                                      uint64_t detail) {
    static const char *names[7] = {"?", "allreduce", "broadcast", "allgather", "barrier", "reduce-scatter", "allgatherv"};
    uint64_t mine[6], all[6];
    MPI_Request q;
    capex_result r = capex__mpi_live(what);
    int i, rc;
    if (r != CAPEX_OK) return r;
    rc = MPI_Ibarrier(capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Ibarrier");
    if ((r = capex__mpi_poll(&q, deadline, what)) != CAPEX_OK) return r;
    mine[0] = kind; mine[1] = size; mine[2] = detail;
    for (i = 0; i < 3; i++) mine[3 + i] = ~mine[i];
    rc = MPI_Allreduce(mine, all, 6, MPI_UINT64_T, MPI_MAX, capex__mpi_comm(c));
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Allreduce (arrival check)");
    if (memcmp(mine, all, sizeof mine) != 0)
        return capex__fail(CAPEX_ERR_COMM, "MPI %s: the ranks called different collectives or sizes (this rank: %s of "
                                           "%llu, detail %llu; across ranks: kinds %llu..%llu, sizes %llu..%llu; a call "
                                           "with no elements is a barrier): every rank must make the same calls in the "
                                           "same order", names[kind < 7 ? kind : 0], names[kind < 7 ? kind : 0],
                           (unsigned long long)size, (unsigned long long)detail, (unsigned long long)~all[3],
                           (unsigned long long)all[0], (unsigned long long)~all[4], (unsigned long long)all[1]);
    return CAPEX_OK;
}

/* FNV-1a of the counts array (reduce-scatter / allgatherv: every rank must pass the same). */
static uint64_t capex__mpi_counts_hash(const size_t *counts, int n) {
    uint64_t h = 14695981039346656037ull;
    int p;
    for (p = 0; p < n; p++) { h ^= (uint64_t)counts[p]; h *= 1099511628211ull; }
    return h;
}

static capex_result capex__mpi_allreduce_f32(capex_comm *c, const float *send, float *recv, size_t n, uint64_t detail,
                                            double deadline) {
    size_t off;
    for (off = 0; off < n; off += CAPEX__MPI_CHUNK) {
        int m = (int)(n - off < CAPEX__MPI_CHUNK ? n - off : CAPEX__MPI_CHUNK), rc;
        if ((rc = capex__mpi_arrive(c, deadline, "MPI allreduce (waiting for every rank)", CAPEX__MPI_ALLREDUCE, (uint64_t)m,
                                    detail)) != CAPEX_OK)
            return (capex_result)rc;
        rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : (const void *)(send + off), recv + off, m, MPI_FLOAT, MPI_SUM,
                           capex__mpi_comm(c));
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Allreduce");
    }
    return CAPEX_OK;
}

/* f64 / int64: native MPI sums, chunked like f32. */
static capex_result capex__mpi_allreduce_wide(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                             uint64_t detail, double deadline) {
    size_t off;
    MPI_Datatype dt = t == CAPEX_F64 ? MPI_DOUBLE : MPI_INT64_T;
    for (off = 0; off < n; off += CAPEX__MPI_CHUNK) {
        int m = (int)(n - off < CAPEX__MPI_CHUNK ? n - off : CAPEX__MPI_CHUNK), rc;
        if ((rc = capex__mpi_arrive(c, deadline, "MPI allreduce (waiting for every rank)", CAPEX__MPI_ALLREDUCE, (uint64_t)m,
                                    detail)) != CAPEX_OK)
            return (capex_result)rc;
        rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : (const void *)((const char *)send + off * 8),
                           (char *)recv + off * 8, m, dt, MPI_SUM, capex__mpi_comm(c));
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Allreduce");
    }
    return CAPEX_OK;
}

static capex_result capex__mpi_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                        capex_reduce_op op, double deadline) {
    capex_result r;
    uint64_t detail = (uint64_t)t | (uint64_t)op << 8;
    if (capex__comm_wide(t)) {
        size_t i;
        r = capex__mpi_allreduce_wide(c, send, recv, n, t, detail, deadline);
        if (r == CAPEX_OK && op == CAPEX_REDUCE_AVG && t == CAPEX_F64)
            for (i = 0; i < n; i++) ((double *)recv)[i] /= (double)c->world_size;
        return r;
    }
    if (t == CAPEX_F32) {
        r = capex__mpi_allreduce_f32(c, (const float *)send, (float *)recv, n, detail, deadline);
    } else {
        size_t bytes;
        float *tmp;
        if (capex__size_mul(n, sizeof(float), &bytes))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "MPI allreduce: %zu elements: the f32 staging byte size overflows size_t", n);
        tmp = (float *)capex__alloc(c->allocator, bytes);
        if (!tmp) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "MPI allreduce: no memory for the f32 staging buffer");
        capex__host_convert(tmp, CAPEX_F32, send, t, n);
        r = capex__mpi_allreduce_f32(c, tmp, tmp, n, detail, deadline);
        if (r == CAPEX_OK) {
            if (op == CAPEX_REDUCE_AVG) capex__host_div(tmp, n, CAPEX_F32, (float)c->world_size);
            capex__host_convert(recv, t, tmp, CAPEX_F32, n);
        }
        if (r != CAPEX_ERR_TIMEOUT) capex__free(c->allocator, tmp); /* else MPI may still write it */
        return r;
    }
    if (r == CAPEX_OK && op == CAPEX_REDUCE_AVG) capex__host_div(recv, n, t, (float)c->world_size);
    return r;
}

static capex_result capex__mpi_broadcast(capex_comm *c, void *buf, size_t n, capex_dtype t, int root, double deadline) {
    size_t bytes = n * capex_comm_dtype_size(t), off;
    for (off = 0; off < bytes; off += CAPEX__MPI_CHUNK) {
        int m = (int)(bytes - off < CAPEX__MPI_CHUNK ? bytes - off : CAPEX__MPI_CHUNK), rc;
        if ((rc = capex__mpi_arrive(c, deadline, "MPI broadcast (waiting for every rank)", CAPEX__MPI_BROADCAST, (uint64_t)m,
                                    (uint64_t)root)) != CAPEX_OK)
            return (capex_result)rc;
        rc = MPI_Bcast((char *)buf + off, m, MPI_BYTE, root, capex__mpi_comm(c));
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Bcast");
    }
    return CAPEX_OK;
}

/* MPI's gathers take this rank's data in place (MPI_IN_PLACE) only at its
   slot of recv and forbid any other overlap; the front-ends allow send ==
   recv, which on ranks > 0 is not that slot (MPI then gathered garbage), so
   send elsewhere inside recv is first moved to the slot. */
static const void *capex__mpi_gather_send(const void *send, void *recv, size_t slot, size_t bytes, size_t total) {
    char *at = (char *)recv + slot;
    if ((const char *)send == at) return MPI_IN_PLACE;
    if (bytes && (const char *)send < (char *)recv + total && (const char *)send + bytes > (char *)recv) {
        memmove(at, send, bytes);
        return MPI_IN_PLACE;
    }
    return send;
}

static capex_result capex__mpi_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                        double deadline) {
    size_t bytes = n * capex_comm_dtype_size(t);
    int rc;
    if (bytes > (size_t)INT_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "MPI allgather: %lu bytes per rank exceed INT_MAX; gather in pieces",
                           (unsigned long)bytes);
    if ((rc = capex__mpi_arrive(c, deadline, "MPI allgather (waiting for every rank)", CAPEX__MPI_ALLGATHER, (uint64_t)bytes,
                                0)) != CAPEX_OK)
        return (capex_result)rc;
    rc = MPI_Allgather(capex__mpi_gather_send(send, recv, bytes * (size_t)c->rank, bytes, bytes * (size_t)c->world_size),
                       (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, capex__mpi_comm(c));
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Allgather");
    return CAPEX_OK;
}

static capex_result capex__mpi_barrier(capex_comm *c, double deadline) {
    return capex__mpi_arrive(c, deadline, "MPI barrier", CAPEX__MPI_BARRIER, 0, 0);
}

/* req: p[0] = f32 staging (half types) or NULL, p[1] = recv, p[2] =
   ireduce_scatter's f32 send staging, p[3] = the collective's name (a string
   literal), n[0] = count, n[1] = dtype, n[2] = op; handle = the MPI_Request. */
/* Records a started MPI request and what wait must do with it: convert the
   f32 staging p[0] (n elements) into recv as t, divide for AVG. */
static capex_result capex__mpi_req_started(capex_comm_req *req, MPI_Request q, void *recv, size_t n, capex_dtype t,
                                           capex_reduce_op op, const char *what) {
    memcpy(req->handle.bytes, &q, sizeof q);
    req->p[1] = recv;
    req->p[3] = (void *)(uintptr_t)what; /* names the collective in wait's timeout message */
    req->n[0] = n;
    req->n[1] = (size_t)t;
    req->n[2] = (size_t)op;
    req->active = 1;
    return CAPEX_OK;
}

static capex_result capex__mpi_iallreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                         capex_reduce_op op, capex_comm_req *req) {
    MPI_Request q;
    float *buf = (float *)recv;
    int rc;
    typedef char capex__request_fits[sizeof(MPI_Request) <= sizeof req->handle ? 1 : -1];
    (void)sizeof(capex__request_fits);
    if (n > (size_t)INT_MAX || capex__comm_wide(t)) return CAPEX_ERR_UNSUPPORTED; /* caller: blocking path */
    if (capex__mpi_live("MPI iallreduce") != CAPEX_OK) return CAPEX_ERR_ORDER;
    memset(req, 0, sizeof *req);
    if (t != CAPEX_F32) {
        buf = (float *)capex__alloc(c->allocator, n * sizeof(float));
        if (!buf) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "MPI iallreduce: no memory for the f32 staging buffer");
        capex__host_convert(buf, CAPEX_F32, send, t, n);
        send = buf;
        req->p[0] = buf;
    }
    rc = MPI_Iallreduce(send == (const void *)buf ? MPI_IN_PLACE : send, buf, (int)n, MPI_FLOAT, MPI_SUM,
                        capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) {
        capex__free(c->allocator, req->p[0]);
        req->p[0] = NULL;
        return capex__mpi_err(rc, "MPI_Iallreduce");
    }
    return capex__mpi_req_started(req, q, recv, n, t, op, "MPI allreduce (bucket)");
}

/* MPI_Ireduce_scatter_block in f32 into an f32 staging block (MPI_IN_PLACE
   would leave the result at the start of the buffer, not at this rank's
   slice) that wait converts or copies into recv; half types' send is staged
   to f32 too. f32 with recv outside send (ZeRO's own staging) goes straight. */
static capex_result capex__mpi_ireduce_scatter(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                              capex_reduce_op op, capex_comm_req *req) {
    size_t W = (size_t)c->world_size, total = count * W;
    float *out, *in = (float *)(uintptr_t)send;
    MPI_Request q;
    int rc;
    if (t != CAPEX_F32 && t != CAPEX_F16 && t != CAPEX_BF16) return CAPEX_ERR_UNSUPPORTED;
    if (total > (size_t)INT_MAX) return CAPEX_ERR_UNSUPPORTED; /* caller: blocking path (CAPEX_ERR_LIMIT there) */
    if (capex__mpi_live("MPI ireduce_scatter") != CAPEX_OK) return CAPEX_ERR_ORDER;
    memset(req, 0, sizeof *req);
    if (t == CAPEX_F32 && ((const float *)recv + count <= in || (const float *)recv >= in + total)) {
        rc = MPI_Ireduce_scatter_block(in, recv, (int)count, MPI_FLOAT, MPI_SUM, capex__mpi_comm(c), &q);
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Ireduce_scatter_block");
        return capex__mpi_req_started(req, q, recv, count, t, op, "MPI reduce-scatter (bucket)");
    }
    out = (float *)capex__alloc(c->allocator, count * sizeof(float) + 1);
    if (t != CAPEX_F32) in = (float *)capex__alloc(c->allocator, total * sizeof(float) + 1);
    if (!out || !in) {
        capex__free(c->allocator, out);
        if (t != CAPEX_F32) capex__free(c->allocator, in);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "MPI ireduce_scatter: no memory for the f32 staging buffers");
    }
    if (t != CAPEX_F32) {
        capex__host_convert(in, CAPEX_F32, send, t, total);
        req->p[2] = in;
    }
    req->p[0] = out;
    rc = MPI_Ireduce_scatter_block(in, out, (int)count, MPI_FLOAT, MPI_SUM, capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) {
        capex__free(c->allocator, req->p[0]);
        capex__free(c->allocator, req->p[2]);
        memset(req, 0, sizeof *req);
        return capex__mpi_err(rc, "MPI_Ireduce_scatter_block");
    }
    return capex__mpi_req_started(req, q, recv, count, t, op, "MPI reduce-scatter (bucket)");
}

static capex_result capex__mpi_iallgather(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                         capex_comm_req *req) {
    size_t es = capex_comm_dtype_size(t), bytes = count * es;
    MPI_Request q;
    int rc;
    if (bytes > (size_t)INT_MAX || bytes * (size_t)c->world_size > (size_t)INT_MAX) return CAPEX_ERR_UNSUPPORTED;
    if (capex__mpi_live("MPI iallgather") != CAPEX_OK) return CAPEX_ERR_ORDER;
    memset(req, 0, sizeof *req);
    rc = MPI_Iallgather(capex__mpi_gather_send(send, recv, (size_t)c->rank * bytes, bytes, bytes * (size_t)c->world_size),
                        (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Iallgather");
    return capex__mpi_req_started(req, q, recv, count, t, CAPEX_REDUCE_SUM, /* nothing to convert or divide */
                                  "MPI all-gather (bucket)");
}

static capex_result capex__mpi_wait(capex_comm *c, capex_comm_req *req, double deadline) {
    MPI_Request q;
    capex_result r;
    capex_dtype t = (capex_dtype)req->n[1];
    if (!req->active) return CAPEX_OK;
    if ((r = capex__mpi_live("MPI wait")) != CAPEX_OK) { req->active = 0; return r; } /* MPI is gone: nothing writes now */
    memcpy(&q, req->handle.bytes, sizeof q);
    r = capex__mpi_poll(&q, deadline, req->p[3] ? (const char *)req->p[3] : "MPI collective (bucket)");
    if (r != CAPEX_OK) return r; /* the staging buffer stays: MPI may still write it */
    memcpy(req->handle.bytes, &q, sizeof q);
    req->active = 0;
    if (req->p[0]) {
        if ((capex_reduce_op)req->n[2] == CAPEX_REDUCE_AVG)
            capex__host_div(req->p[0], req->n[0], CAPEX_F32, (float)c->world_size);
        capex__host_convert(req->p[1], t, req->p[0], CAPEX_F32, req->n[0]);
        capex__free(c->allocator, req->p[0]);
        req->p[0] = NULL;
        capex__free(c->allocator, req->p[2]); /* ireduce_scatter's f32 send staging */
        req->p[2] = NULL;
    } else if ((capex_reduce_op)req->n[2] == CAPEX_REDUCE_AVG) {
        capex__host_div(req->p[1], req->n[0], CAPEX_F32, (float)c->world_size);
    }
    return CAPEX_OK;
}

static capex_result capex__mpi_test(capex_comm *c, capex_comm_req *req, int *done) {
    MPI_Request q;
    int flag = 0, rc;
    (void)c;
    *done = 1;
    if (!req->active) return CAPEX_OK;
    if (capex__mpi_live("MPI test") != CAPEX_OK) return CAPEX_ERR_ORDER; /* wait clears the request */
    memcpy(&q, req->handle.bytes, sizeof q);
    rc = MPI_Test(&q, &flag, MPI_STATUS_IGNORE); /* drives progress; wait finishes the job */
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Test (bucket)");
    memcpy(req->handle.bytes, &q, sizeof q);
    *done = flag;
    return CAPEX_OK;
}

static void capex__mpi_destroy(capex_comm *c) {
    capex__mpi *m = (capex__mpi *)c->impl;
    int fin = 0;
    if (!m) return;
    MPI_Finalized(&fin);
    /* A failed communicator may have collectives in flight: freeing it could
       block, so it is left to MPI_Finalize / process exit. */
    if (!fin && !c->failed) MPI_Comm_free(&m->comm);
    capex__free(NULL, m);
    c->impl = NULL;
}

/* MPI takes int counts and displacements: totals past INT_MAX (elements, or
   bytes for allgatherv) are refused before any traffic, alike on every rank. */
static capex_result capex__mpi_int_counts(capex_comm *c, const char *what, const size_t *counts, size_t scale, int **out) {
    size_t sum = 0;
    int p, *v;
    *out = NULL;
    for (p = 0; p < c->world_size; p++) sum += counts[p]; /* no wrap: the front checked sum * dtype size */
    if (sum > (size_t)INT_MAX / scale)
        return capex__fail(CAPEX_ERR_LIMIT, "%s: %zu elements in all exceed MPI's int counts; split the call", what, sum);
    v = (int *)capex__alloc(NULL, sizeof(int) * 2 * (size_t)c->world_size);
    if (!v) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    for (p = 0, sum = 0; p < c->world_size; p++) {
        v[p] = (int)(counts[p] * scale);
        v[c->world_size + p] = (int)sum; /* displacements */
        sum += counts[p] * scale;
    }
    *out = v;
    return CAPEX_OK;
}

/* MPI_Reduce_scatter in f32 (half types staged through f32, rounded once),
   f64 or int64; the result goes through scratch when recv is inside send. */
static capex_result capex__mpi_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                             capex_dtype t, capex_reduce_op op, double deadline) {
    const char *what = "MPI reduce-scatter";
    size_t es = capex_comm_dtype_size(t), total = 0, mine = counts[c->rank], i;
    int *cnt = NULL, rc, wide = capex__comm_wide(t);
    capex_result r;
    void *in = (void *)(uintptr_t)send, *out = recv, *stage = NULL;
    for (i = 0; i < (size_t)c->world_size; i++) total += counts[i];
    if ((r = capex__mpi_int_counts(c, what, counts, 1, &cnt)) != CAPEX_OK) return r;
    if (t != CAPEX_F32 && !wide) { /* f32 staging: the whole input, then this rank's slice */
        stage = capex__alloc(c->allocator, (total + mine) * sizeof(float));
        if (!stage) { capex__free(NULL, cnt); return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: no memory for f32 staging", what); }
        capex__host_convert(stage, CAPEX_F32, send, t, total);
        in = stage;
        out = (float *)stage + total;
    } else if ((const char *)recv < (const char *)send + total * es && (const char *)recv + mine * es > (const char *)send) {
        stage = capex__alloc(c->allocator, mine * es + 1);
        if (!stage) { capex__free(NULL, cnt); return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: no memory for scratch", what); }
        out = stage;
    }
    r = capex__mpi_arrive(c, deadline, "MPI reduce-scatter (waiting for every rank)", CAPEX__MPI_REDUCE_SCATTER, (uint64_t)total,
                          capex__mpi_counts_hash(counts, c->world_size) ^ ((uint64_t)t | (uint64_t)op << 8));
    if (r == CAPEX_OK) {
        rc = MPI_Reduce_scatter(in, out, cnt, t == CAPEX_F64 ? MPI_DOUBLE : t == CAPEX_I64 ? MPI_INT64_T : MPI_FLOAT,
                                MPI_SUM, capex__mpi_comm(c));
        if (rc != MPI_SUCCESS) r = capex__mpi_err(rc, "MPI_Reduce_scatter");
    }
    if (r == CAPEX_OK) {
        if (op == CAPEX_REDUCE_AVG) {
            if (t == CAPEX_F64) for (i = 0; i < mine; i++) ((double *)out)[i] /= (double)c->world_size;
            else capex__host_div(out, mine, CAPEX_F32, (float)c->world_size);
        }
        if (out != recv && mine) {
            if (wide || t == CAPEX_F32) memmove(recv, out, mine * es);
            else capex__host_convert(recv, t, out, CAPEX_F32, mine);
        }
    }
    capex__free(NULL, cnt);
    if (r != CAPEX_ERR_TIMEOUT) capex__free(c->allocator, stage);
    return r;
}

/* MPI_Allgatherv of bytes (every dtype moves bits). */
static capex_result capex__mpi_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts, capex_dtype t,
                                         double deadline) {
    size_t es = capex_comm_dtype_size(t);
    int *cnt = NULL, rc;
    capex_result r = capex__mpi_int_counts(c, "MPI allgatherv", counts, es, &cnt);
    if (r != CAPEX_OK) return r;
    r = capex__mpi_arrive(c, deadline, "MPI allgatherv (waiting for every rank)", CAPEX__MPI_ALLGATHERV,
                          (uint64_t)cnt[2 * c->world_size - 1] + (uint64_t)cnt[c->world_size - 1],
                          capex__mpi_counts_hash(counts, c->world_size) ^ (uint64_t)t);
    if (r == CAPEX_OK) {
        size_t all = (size_t)cnt[2 * c->world_size - 1] + (size_t)cnt[c->world_size - 1]; /* last displ + count */
        rc = MPI_Allgatherv(capex__mpi_gather_send(send, recv, (size_t)cnt[c->world_size + c->rank], (size_t)cnt[c->rank], all),
                            cnt[c->rank], MPI_BYTE, recv, cnt, cnt + c->world_size, MPI_BYTE, capex__mpi_comm(c));
        if (rc != MPI_SUCCESS) r = capex__mpi_err(rc, "MPI_Allgatherv");
    }
    capex__free(NULL, cnt);
    return r;
}

static const capex_comm_vtable capex__mpi_vt = {
    "mpi", capex__mpi_allreduce, capex__mpi_broadcast, capex__mpi_allgather, capex__mpi_barrier,
    capex__mpi_iallreduce, capex__mpi_wait, NULL, NULL, capex__mpi_destroy, NULL, NULL, NULL, NULL, NULL, NULL,
    capex__mpi_test, capex__mpi_reduce_scatter, capex__mpi_allgatherv, capex__mpi_ireduce_scatter, capex__mpi_iallgather, NULL, NULL, NULL};

CAPEX_API capex_result capex_comm_init_mpi(capex_comm *c, MPI_Comm mc) {
    int init = 0, fin = 0, rc;
    capex__mpi *m;
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_mpi: comm is NULL");
    memset(c, 0, sizeof *c);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return capex__fail(CAPEX_ERR_ORDER, "capex_comm_init_mpi: call MPI_Init first (and not after MPI_Finalize)");
    /* MPI calls on MPI_COMM_NULL raise MPI_COMM_WORLD's handler: by default, abort the job */
    if (mc == MPI_COMM_NULL)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_mpi: the communicator is MPI_COMM_NULL (this rank is "
                                                  "not in it: MPI_Comm_split with MPI_UNDEFINED?)");
    {
        int inter = 0; /* rank and size would be the local group's, the sums the remote group's */
        MPI_Comm_test_inter(mc, &inter);
        if (inter)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_mpi: the communicator is an intercommunicator; "
                                                      "give an intracommunicator (MPI_Intercomm_merge)");
    }
    m = (capex__mpi *)capex__alloc(NULL, sizeof *m);
    if (!m) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_comm_init_mpi: out of memory");
    {
        /* the duplicate is a collective: nonblocking and polled against the
           comm's default timeout_s (init takes no other), so a rank that never
           arrives gives CAPEX_ERR_TIMEOUT instead of a hang; errors come back
           from the caller's communicator for its duration only (its own
           handler is put back) */
        MPI_Errhandler user_eh;
        MPI_Request q;
        capex_result r = CAPEX_OK;
        MPI_Comm_get_errhandler(mc, &user_eh);
        MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
        rc = MPI_Comm_idup(mc, &m->comm, &q);
        if (rc != MPI_SUCCESS) r = capex__mpi_err(rc, "MPI_Comm_idup");
        else r = capex__mpi_poll(&q, capex_dist_now() + 1800.0, "MPI_Comm_idup (capex_comm_init_mpi)");
        MPI_Comm_set_errhandler(mc, user_eh);
        MPI_Errhandler_free(&user_eh);
        /* timed out: the idup is still in flight and writes m->comm when it
           completes (MPI cannot cancel it), so m is left to process exit */
        if (r != CAPEX_OK && r != CAPEX_ERR_TIMEOUT) capex__free(NULL, m);
        if (r != CAPEX_OK) return r;
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &c->rank);
    MPI_Comm_size(m->comm, &c->world_size);
    c->vt = &capex__mpi_vt;
    c->impl = m;
    c->timeout_s = 1800.0;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_comm_init_mpi_world(capex_comm *c) { return capex_comm_init_mpi(c, MPI_COMM_WORLD); }

#else
CAPEX_API capex_result capex_comm_init_mpi_world(capex_comm *c) {
    if (c) memset(c, 0, sizeof *c);
    return capex__fail(CAPEX_ERR_NO_MPI, "capex_comm_init_mpi_world: this build has no MPI; define CAPEX_MPI before "
                                         "including capex.h and build with mpicc");
}
#endif /* CAPEX_MPI */

/* ---- data parallel: TCP rendezvous -------------------------------------- */
/* Wire format (little-endian): hello = magic "CPXR", version, rank, world,
   nonce u64, size u64 (32 bytes); reply = magic, status, nonce u64, size u64
   (24 bytes), then the blob when status is 0. */
#define CAPEX__RDV_MAGIC 0x52585043u
/* 2: the TCP comm's headers carry a reduction's dtype and op, and rank 0
   opens each barrier; 3: a broadcast's root in its headers, every peer's word
   to rank 0 first, and ring announcements; 4: that word carries the
   broadcast's byte count, and reduce-scatter and allgatherv headers a hash
   of their counts. A rank speaking an older version is refused here
   ("protocol or version mismatch") instead of failing or hanging in a later
   collective. */
#define CAPEX__RDV_VERSION 4u
enum { CAPEX__RDV_OK = 0, CAPEX__RDV_BAD_NONCE = 1, CAPEX__RDV_BAD_WORLD = 2, CAPEX__RDV_BAD_RANK = 3,
       CAPEX__RDV_BAD_SIZE = 4, CAPEX__RDV_DUP_RANK = 5, CAPEX__RDV_BAD_PROTO = 6, CAPEX__RDV_BUSY = 7 };

#define CAPEX__TAG_RENDEZVOUS_DESC CAPEX__TAG('R', 'D', 'V', 'D')
CAPEX_API void capex_rendezvous_desc_init(capex_rendezvous_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_RENDEZVOUS_DESC;
    d->addr = "127.0.0.1";
    d->port = 29500; /* torchrun's default MASTER_PORT */
    d->rank = 0;
    d->world_size = 1;
    d->nonce = capex_rendezvous_nonce(NULL);
    d->timeout_s = 300.0;
    d->retry_interval_s = 0.05;
}

CAPEX_API uint64_t capex_rendezvous_nonce(const char *run_id) {
    uint64_t h = 14695981039346656037ull; /* FNV-1a 64 */
    const unsigned char *s = (const unsigned char *)(run_id ? run_id : "");
    for (; *s; s++) { h ^= *s; h *= 1099511628211ull; }
    return h;
}

CAPEX__PRIVATE void capex__put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
CAPEX__PRIVATE void capex__put64(unsigned char *p, uint64_t v) { capex__put32(p, (uint32_t)v); capex__put32(p + 4, (uint32_t)(v >> 32)); }
CAPEX__PRIVATE uint32_t capex__get32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
CAPEX__PRIVATE uint64_t capex__get64(const unsigned char *p) { return capex__get32(p) | ((uint64_t)capex__get32(p + 4) << 32); }

CAPEX__PRIVATE void capex__rdv_put_hello(unsigned char *m, const capex_rendezvous_desc *d, uint64_t size) {
    capex__put32(m, CAPEX__RDV_MAGIC);
    capex__put32(m + 4, CAPEX__RDV_VERSION);
    capex__put32(m + 8, (uint32_t)d->rank);
    capex__put32(m + 12, (uint32_t)d->world_size);
    capex__put64(m + 16, d->nonce);
    capex__put64(m + 24, size);
}
CAPEX__PRIVATE void capex__rdv_put_answer(unsigned char *m, uint32_t status, uint64_t nonce, uint64_t size) {
    capex__put32(m, CAPEX__RDV_MAGIC);
    capex__put32(m + 4, status);
    capex__put64(m + 8, nonce);
    capex__put64(m + 16, size);
}

/* Rank 0's check of the first `have` bytes (at most 32) of a hello: -1 while
   more are needed, else a CAPEX__RDV_* status (*prank, *pworld read from it
   once all 32 are in). Bytes that cannot begin a hello (magic, version) are
   refused as soon as they arrive, so garbage is closed at once. The
   duplicate-rank check is the caller's. Pure: fuzzed by tests/fuzz_rdv.c. */
CAPEX__PRIVATE int capex__rdv_parse_hello(const unsigned char *m, size_t have, uint64_t nonce, int world, uint64_t size,
                                          uint32_t *prank, uint32_t *pworld) {
    unsigned char head[8];
    size_t i;
    capex__put32(head, CAPEX__RDV_MAGIC);
    capex__put32(head + 4, CAPEX__RDV_VERSION);
    for (i = 0; i < have && i < 8; i++) if (m[i] != head[i]) return CAPEX__RDV_BAD_PROTO;
    if (have < 32) return -1;
    *prank = capex__get32(m + 8);
    *pworld = capex__get32(m + 12);
    if (capex__get64(m + 16) != nonce) return CAPEX__RDV_BAD_NONCE;
    if (*pworld != (uint32_t)world) return CAPEX__RDV_BAD_WORLD;
    if (*prank == 0 || *prank >= (uint32_t)world) return CAPEX__RDV_BAD_RANK;
    if (capex__get64(m + 24) != size) return CAPEX__RDV_BAD_SIZE;
    return CAPEX__RDV_OK;
}

#ifdef CAPEX__HAVE_SOCKETS

CAPEX__PRIVATE int capex__ms_left(double deadline) {
    double left = deadline - capex_dist_now();
    if (left <= 0) return 0;
    if (left > 1e6) return 1000000000;
    return (int)(left * 1000.0) + 1;
}

CAPEX__PRIVATE void capex__set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
#if defined(SO_NOSIGPIPE)
    { int one = 1; setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one); }
#endif
}

/* 0 ok, -1 I/O error or EOF, -2 deadline. */
CAPEX__PRIVATE int capex__io_all(int fd, void *buf, size_t n, int writing, double deadline) {
    unsigned char *p = (unsigned char *)buf;
    while (n) {
        ssize_t k;
        struct pollfd pf;
        int ms = capex__ms_left(deadline);
        if (ms <= 0) return -2;
        pf.fd = fd;
        pf.events = (short)(writing ? POLLOUT : POLLIN);
        pf.revents = 0;
        k = poll(&pf, 1, ms);
        if (k < 0) { if (errno == EINTR) continue; return -1; }
        if (k == 0) continue; /* deadline re-checked above */
#ifdef MSG_NOSIGNAL
        k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
#else
        k = writing ? send(fd, p, n, 0) : recv(fd, p, n, 0);
#endif
        if (k < 0) { if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue; return -1; }
        if (k == 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Resolves addr:port into a sockaddr (IPv4 or IPv6). getaddrinfo when the
   headers declare it, else numeric IPv4 and "localhost". */
typedef struct capex__sockaddr { struct sockaddr_storage ss; socklen_t len; int family; } capex__sockaddr;

CAPEX__PRIVATE capex_result capex__resolve(const char *addr, int port, capex__sockaddr *out) {
    memset(out, 0, sizeof *out);
#if defined(AI_NUMERICSERV)
    {
        struct addrinfo hints, *res = NULL;
        char portbuf[16];
        int rc;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        snprintf(portbuf, sizeof portbuf, "%d", port);
        rc = getaddrinfo(addr, portbuf, &hints, &res);
        if (rc != 0 || !res)
            return capex__fail(CAPEX_ERR_COMM, "cannot resolve MASTER_ADDR '%s': %s; check the address", addr,
                               rc ? gai_strerror(rc) : "no result");
        memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
        out->len = (socklen_t)res->ai_addrlen;
        out->family = res->ai_family;
        freeaddrinfo(res);
        return CAPEX_OK;
    }
#else
    {
        struct sockaddr_in *sin = (struct sockaddr_in *)&out->ss;
        const char *a = strcmp(addr, "localhost") == 0 ? "127.0.0.1" : addr;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((unsigned short)port);
        if (inet_pton(AF_INET, a, &sin->sin_addr) != 1)
            return capex__fail(CAPEX_ERR_COMM, "MASTER_ADDR '%s' is not a numeric IPv4 address, and this build has no "
                                               "getaddrinfo (define _POSIX_C_SOURCE 200809L before any include)", addr);
        out->len = (socklen_t)sizeof *sin;
        out->family = AF_INET;
        return CAPEX_OK;
    }
#endif
}

CAPEX__PRIVATE const char *capex__rdv_status_name(uint32_t st) {
    switch (st) {
    case CAPEX__RDV_BAD_NONCE: return "run nonce mismatch (a stale or foreign job: check CAPEX_RUN_ID / TORCHELASTIC_RUN_ID)";
    case CAPEX__RDV_BAD_WORLD: return "world size mismatch";
    case CAPEX__RDV_BAD_RANK: return "rank out of range";
    case CAPEX__RDV_BAD_SIZE: return "blob size mismatch";
    case CAPEX__RDV_DUP_RANK: return "rank already joined (two processes with one rank)";
    case CAPEX__RDV_BAD_PROTO: return "protocol or version mismatch";
    case CAPEX__RDV_BUSY: return "rank 0 dropped the connection before its hello (busy); reconnect";
    }
    return "unknown refusal";
}

/* A peer's check of rank 0's 24-byte answer: CAPEX_OK (the blob follows), or
   *busy = 1 when rank 0 dropped this connection before reading its hello
   (reconnect), else an error naming the refusal. Pure: fuzzed by
   tests/fuzz_rdv.c. */
CAPEX__PRIVATE capex_result capex__rdv_parse_answer(const capex_rendezvous_desc *d, const unsigned char *m, uint64_t size,
                                                    int *busy) {
    uint32_t st = capex__get32(m + 4);
    *busy = 0;
    if (capex__get32(m) != CAPEX__RDV_MAGIC)
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: %s:%d is not a capex rendezvous (bad magic)", d->addr, d->port);
    if (st == CAPEX__RDV_BUSY) { *busy = 1; return CAPEX_OK; }
    if (st != CAPEX__RDV_OK)
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 at %s:%d refused rank %d: %s", d->addr, d->port, d->rank,
                           capex__rdv_status_name(st));
    if (capex__get64(m + 8) != d->nonce || capex__get64(m + 16) != size)
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0's answer has another nonce or size (foreign job)");
    return CAPEX_OK;
}

/* Rank 0 serves every pending connection at once (poll), so connections to
   MASTER_PORT that stay idle, trickle or send garbage cannot hold up the
   real ranks: an unidentified connection gets CAPEX__RDV_HELLO_BUDGET_S to
   send its hello, at most CAPEX__RDV_MAX_PENDING wait at a time (a new one
   pushes out the oldest), and bytes that cannot begin a hello close it at
   once. A connection dropped unheard is answered CAPEX__RDV_BUSY, on which a
   real peer reconnects. */
#ifndef CAPEX__RDV_HELLO_BUDGET_S
#define CAPEX__RDV_HELLO_BUDGET_S 2.0
#endif
#ifndef CAPEX__RDV_MAX_PENDING
#define CAPEX__RDV_MAX_PENDING 64
#endif
/* Called before each of rank 0's polls: tests count them (a spin shows as
   thousands) instead of timing rank 0. */
#ifndef CAPEX__RDV_ON_POLL
#define CAPEX__RDV_ON_POLL() ((void)0)
#endif

typedef struct capex__rdv_conn { int fd; size_t have; double since; unsigned char m[32]; } capex__rdv_conn;

/* Reads what has arrived of a pending hello (non-blocking socket): -1 more
   bytes needed, -2 closed or failed before a whole hello, else a
   CAPEX__RDV_* status from capex__rdv_parse_hello. */
CAPEX__PRIVATE int capex__rdv_conn_read(capex__rdv_conn *pc, const capex_rendezvous_desc *d, uint64_t size, uint32_t *prank,
                                        uint32_t *pworld) {
    for (;;) {
        ssize_t k;
        int st = capex__rdv_parse_hello(pc->m, pc->have, d->nonce, d->world_size, size, prank, pworld);
        if (st != -1) return st;
        k = recv(pc->fd, pc->m + pc->have, sizeof pc->m - pc->have, 0);
        if (k > 0) { pc->have += (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
        return -2;
    }
}

/* accept() failed for want of a descriptor or memory (the listening socket
   stays readable, so polling again at once would spin until the deadline). */
CAPEX__PRIVATE int capex__accept_starved(int e) { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }

/* Answers a connection that rank 0 gives up and closes it; never blocks
   (24 bytes fit the empty send buffer of a fresh socket). */
CAPEX__PRIVATE void capex__rdv_drop(int fd, uint32_t status, uint64_t nonce, uint64_t size) {
    unsigned char m[24];
    capex__rdv_put_answer(m, status, nonce, size);
#ifdef MSG_NOSIGNAL
    (void)send(fd, m, sizeof m, MSG_NOSIGNAL);
#else
    (void)send(fd, m, sizeof m, 0);
#endif
    close(fd);
}

/* Gives up the pending connection that has waited longest (np >= 1). */
CAPEX__PRIVATE void capex__rdv_drop_oldest(capex__rdv_conn *pend, int *np, uint64_t nonce, uint64_t size) {
    int o = 0, i;
    for (i = 1; i < *np; i++) if (pend[i].since < pend[o].since) o = i;
    capex__rdv_drop(pend[o].fd, CAPEX__RDV_BUSY, nonce, size);
    pend[o] = pend[--*np];
}

/* keep (world entries) non-NULL: the peer sockets stay open and move there
   (the TCP comm backend); else they are closed. */
static capex_result capex__rdv_root(const capex_rendezvous_desc *d, void *blob, size_t size, double deadline, int *keep) {
    capex__sockaddr sa;
    capex_result r = capex__resolve(d->addr, d->port, &sa);
    int ls, one = 1, joined = 0, i, np = 0, refused_foreign = 0, dropped = 0, backlog, starved = 0;
    double accept_paused_until = 0.0;
    int *fds;
    capex__rdv_conn pend[CAPEX__RDV_MAX_PENDING];
    struct pollfd pfd[CAPEX__RDV_MAX_PENDING + 1];
    unsigned char msg[24];
    if (r) return r;
    fds = (int *)capex__alloc(NULL, sizeof(int) * (size_t)d->world_size);
    if (!fds) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "rendezvous: out of memory");
    for (i = 0; i < d->world_size; i++) fds[i] = -1;
    ls = socket(sa.family, SOCK_STREAM, 0);
    if (ls < 0) { capex__free(NULL, fds); return capex__fail(CAPEX_ERR_COMM, "rendezvous: socket() failed: %s", strerror(errno)); }
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* room in the accept queue for the ranks and a burst of strays */
    backlog = (d->world_size < 1024 ? d->world_size : 1024) + CAPEX__RDV_MAX_PENDING;
    if (bind(ls, (struct sockaddr *)&sa.ss, sa.len) != 0 || listen(ls, backlog) != 0) {
        int e = errno;
        close(ls);
        capex__free(NULL, fds);
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 cannot listen on %s:%d: %s (port in use? another job "
                                           "or a leftover process; pick another MASTER_PORT)", d->addr, d->port, strerror(e));
    }
    capex__set_nonblock(ls);
    r = CAPEX_OK;
    while (joined < d->world_size - 1) {
        double now = capex_dist_now(), wake = deadline;
        int n;
        if (now >= deadline) {
            char missing[256];
            size_t len = 0;
            missing[0] = '\0';
            for (i = 1; i < d->world_size && len + 12 < sizeof missing; i++)
                if (fds[i] < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", i);
            r = capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: rank 0 timed out at %s:%d with %d of %d ranks joined "
                                               "(missing: %s; %d foreign peers refused, %d silent connections dropped)%s%s",
                            d->addr, d->port, joined + 1, d->world_size, missing, refused_foreign, dropped,
                            starved ? "; accept() failed: " : "", starved ? strerror(starved) : "");
            break;
        }
        /* connections whose hello budget is spent go; the next expiry bounds the wait */
        for (i = 0; i < np;) {
            double end = pend[i].since + CAPEX__RDV_HELLO_BUDGET_S;
            if (now >= end) {
                capex__rdv_drop(pend[i].fd, CAPEX__RDV_BUSY, d->nonce, (uint64_t)size);
                dropped++;
                pend[i] = pend[--np];
                continue;
            }
            if (end < wake) wake = end;
            i++;
        }
        /* out of descriptors with none pending to give up: stop polling the
           listening socket for a moment instead of spinning on it */
        pfd[0].fd = ls; pfd[0].events = now < accept_paused_until ? 0 : POLLIN; pfd[0].revents = 0;
        if (now < accept_paused_until && accept_paused_until < wake) wake = accept_paused_until;
        for (i = 0; i < np; i++) { pfd[i + 1].fd = pend[i].fd; pfd[i + 1].events = POLLIN; pfd[i + 1].revents = 0; }
        CAPEX__RDV_ON_POLL();
        if (poll(pfd, (nfds_t)(np + 1), capex__ms_left(wake)) <= 0) continue;
        /* hellos first (backwards: removal moves the last entry into i), so
           a burst of new connections cannot push out one whose hello is in */
        for (i = np; i-- > 0;) {
            uint32_t prank = 0, pworld = 0;
            int st, fd;
            if (!pfd[i + 1].revents) continue;
            st = capex__rdv_conn_read(&pend[i], d, (uint64_t)size, &prank, &pworld);
            if (st == -1) continue;
            fd = pend[i].fd;
            pend[i] = pend[--np];
            if (st == -2) { close(fd); continue; }
            if (st == CAPEX__RDV_OK && fds[prank] >= 0) st = CAPEX__RDV_DUP_RANK;
            if (st == CAPEX__RDV_OK) { fds[prank] = fd; joined++; continue; }
            capex__rdv_drop(fd, (uint32_t)st, d->nonce, (uint64_t)size);
            if (st == CAPEX__RDV_BAD_NONCE || st == CAPEX__RDV_BAD_PROTO) { refused_foreign++; continue; }
            r = capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 refused a peer of this run (rank %u, world %u): %s",
                            (unsigned)prank, (unsigned)pworld, capex__rdv_status_name((uint32_t)st));
            break;
        }
        if (r != CAPEX_OK) break;
        for (n = 0; n < 16 && (pfd[0].revents & POLLIN); n++) {
            int fd = accept(ls, NULL, NULL), nd = 1;
            if (fd < 0 && capex__accept_starved(errno)) {
                starved = errno;
                if (np > 0) { /* give up the oldest pending connection: its descriptor takes the next */
                    capex__rdv_drop_oldest(pend, &np, d->nonce, (uint64_t)size);
                    dropped++;
                    continue;
                }
                accept_paused_until = capex_dist_now() + 0.05;
                break;
            }
            if (fd < 0) break;
            if (np == CAPEX__RDV_MAX_PENDING) { /* full: the oldest has had the longest to speak */
                capex__rdv_drop_oldest(pend, &np, d->nonce, (uint64_t)size);
                dropped++;
            }
            capex__set_nonblock(fd);
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof nd);
            pend[np].fd = fd;
            pend[np].have = 0;
            pend[np].since = capex_dist_now();
            np++;
        }
    }
    close(ls);
    for (i = 0; i < np; i++) close(pend[i].fd); /* strays left when the ranks are complete (or on failure) */
    if (r == CAPEX_OK) {
        capex__rdv_put_answer(msg, CAPEX__RDV_OK, d->nonce, (uint64_t)size);
        for (i = 1; i < d->world_size && r == CAPEX_OK; i++) {
            int e = capex__io_all(fds[i], msg, 24, 1, deadline);
            if (e == 0 && size) e = capex__io_all(fds[i], blob, size, 1, deadline);
            if (e == -2) r = capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: sending to rank %d passed the deadline", i);
            else if (e) r = capex__fail(CAPEX_ERR_COMM, "rendezvous: rank %d dropped its connection", i);
        }
    }
    for (i = 0; i < d->world_size; i++) {
        if (keep && r == CAPEX_OK) keep[i] = fds[i];
        else if (fds[i] >= 0) close(fds[i]);
    }
    capex__free(NULL, fds);
    return r;
}

/* One attempt of a peer over a connected socket: hello out, answer and blob
   in. *again: 1 rank 0 was busy (reconnect after the retry interval), 2 the
   deadline passed before the answer (the caller reports it). */
CAPEX__PRIVATE capex_result capex__rdv_peer_exchange(const capex_rendezvous_desc *d, int fd, void *blob, size_t size,
                                                     double deadline, int *again) {
    unsigned char msg[32];
    capex_result r;
    int e, busy = 0;
    *again = 0;
    capex__rdv_put_hello(msg, d, (uint64_t)size);
    e = capex__io_all(fd, msg, 32, 1, deadline);
    if (e == 0) e = capex__io_all(fd, msg, 24, 0, deadline);
    if (e == -2) { *again = 2; return CAPEX_ERR_TIMEOUT; }
    if (e)
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 at %s:%d closed the connection before answering "
                                           "rank %d (it failed or refused this run)", d->addr, d->port, d->rank);
    if ((r = capex__rdv_parse_answer(d, msg, (uint64_t)size, &busy)) != CAPEX_OK) return r;
    if (busy) { *again = 1; return CAPEX_ERR_COMM; }
    e = size ? capex__io_all(fd, blob, size, 0, deadline) : 0;
    if (e == -2) return capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: rank %d: the blob did not arrive before the deadline", d->rank);
    if (e) return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank %d: connection lost while receiving the blob", d->rank);
    return CAPEX_OK;
}

static capex_result capex__rdv_peer(const capex_rendezvous_desc *d, void *blob, size_t size, double deadline, int *keep) {
    capex__sockaddr sa;
    capex_result r = capex__resolve(d->addr, d->port, &sa);
    int attempts = 0, last_err = 0;
    double retry = d->retry_interval_s > 0 ? d->retry_interval_s : 0.05;
    if (r) return r;
    for (;;) {
        int fd, again = 0;
        if (capex_dist_now() >= deadline)
            return capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: rank %d could not reach rank 0 at %s:%d before the "
                                                  "deadline (%d attempts, last error: %s); is rank 0 running and "
                                                  "MASTER_ADDR/MASTER_PORT right?", d->rank, d->addr, d->port, attempts,
                               last_err ? strerror(last_err) : "none");
        attempts++;
        fd = socket(sa.family, SOCK_STREAM, 0);
        if (fd < 0) return capex__fail(CAPEX_ERR_COMM, "rendezvous: socket() failed: %s", strerror(errno));
        capex__set_nonblock(fd);
        if (connect(fd, (struct sockaddr *)&sa.ss, sa.len) != 0) {
            if (errno == EINPROGRESS || errno == EINTR) {
                struct pollfd pf;
                int so = 0;
                socklen_t sl = (socklen_t)sizeof so;
                pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
                if (poll(&pf, 1, capex__ms_left(deadline)) <= 0) { close(fd); last_err = ETIMEDOUT; continue; }
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
                    last_err = so ? so : errno;
                    close(fd);
                    capex__sleep_s(retry);
                    continue;
                }
            } else {
                last_err = errno;
                close(fd);
                capex__sleep_s(retry);
                continue;
            }
        }
        { int nd = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof nd); }
        r = capex__rdv_peer_exchange(d, fd, blob, size, deadline, &again);
        if (keep && r == CAPEX_OK) *keep = fd;
        else close(fd);
        if (again == 1) { last_err = EAGAIN; capex__sleep_s(retry); continue; } /* rank 0 busy: reconnect */
        if (again == 2) continue; /* reported as a timeout at the loop top */
        return r;
    }
}

/* ---- data parallel: TCP comm backend (star through rank 0, ring) ------- */
/* For CPU jobs without MPI (torchrun --no-python, srun): every rank keeps
   the rendezvous socket to rank 0; below the ring threshold rank 0 reduces
   in rank order (so every rank gets the same bits; half types summed in
   f32, rounded once) and sends the result back: O(world) traffic at rank 0.
   Large allreduce / reduce-scatter / allgatherv use the ring (below).
   Meant for a node or a few, not for large clusters (use MPI or NCCL there).
   Synchronous: buckets reduce when they fill, without overlap. Each message
   carries an op, a sequence number, its size and a reduction's dtype and
   reduce op (a broadcast's root; reduce-scatter and allgatherv: also their
   counts' hash), so ranks calling collectives in different orders, sizes,
   counts, dtypes, reduce ops or roots get CAPEX_ERR_COMM instead of garbage. (The protocol is the rendezvous' version: CAPEX__RDV_VERSION.) */
#define CAPEX__TCP_MAGIC 0x43585043u
enum { CAPEX__TCP_ALLREDUCE = 1, CAPEX__TCP_BROADCAST = 2, CAPEX__TCP_ALLGATHER = 3, CAPEX__TCP_BARRIER = 4,
       CAPEX__TCP_REDUCE_SCATTER = 5, CAPEX__TCP_ALLGATHERV = 6 };
/* A broadcast's tag: its root. Rank 0's notice to its peers that it
   refused a collective whose headers differed (so they fail saying so). A
   ring collective's header-only announcement to rank 0 (op | VIA_RING). */
#define CAPEX__TCP_TAG_ROOT 0x80000000u
#define CAPEX__TCP_TAG_REFUSED 0xffffffffu
#define CAPEX__TCP_VIA_RING 0x100u

typedef struct capex__tcp {
    int *fds;      /* rank 0: socket of each peer (fds[0] unused); else fds[0] = rank 0 */
    uint32_t seq;
    uint32_t tag;  /* the reduction's dtype and op (capex__tcp_tag), a broadcast's root, the counts' hash
                      (reduce-scatter, allgatherv: capex__tcp_counts_tag), 0 for the others */
    int bad_header; /* the last failed receive read a header that differed (not an I/O failure) */
    void *tmp;
    size_t tmp_bytes;
    /* Ring (set up by capex_comm_init_tcp; ring = 0 keeps everything on the
       star): next_fd to rank+1, prev_fd from rank-1; links to or from rank 0
       (and both at world 2) are star sockets, the others are owned here. */
    int ring, next_fd, prev_fd, own_next, own_prev;
} capex__tcp;

static capex_result capex__tcp_io_fail(int e, int peer, const char *what) {
    if (e == -2) return capex__fail(CAPEX_ERR_TIMEOUT, "TCP comm: %s with rank %d passed the deadline (stuck peer?)", what, peer);
    return capex__fail(CAPEX_ERR_COMM, "TCP comm: %s: rank %d closed the connection (it died or failed)", what, peer);
}

/* A reduction's dtype and op, so that ranks reducing the same bytes as
   another type (f32 x4, f16 x8) or with another op (SUM, AVG) fail instead
   of summing one type's bits as another's or averaging on some ranks only. */
CAPEX__PRIVATE uint32_t capex__tcp_tag(capex_dtype ty, capex_reduce_op op) {
    return 1u + (uint32_t)ty + ((uint32_t)op << 8);
}
/* Reduce-scatter and allgatherv also carry a hash of their counts (tag bits
   12-30: clear of the dtype/op, the root bit and the refusal), so ranks
   passing different counts with the same total fail instead of cutting the
   data at different offsets (the headers' byte sizes do not always differ). */
#define CAPEX__TCP_TAG_COUNTS 0x7ffff000u
CAPEX__PRIVATE uint32_t capex__tcp_counts_tag(const size_t *counts, int world) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    int p;
    for (p = 0; p < world; p++) {
        h = (h ^ (uint64_t)counts[p]) * 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return (uint32_t)(h >> 20) & CAPEX__TCP_TAG_COUNTS;
}

CAPEX__PRIVATE void capex__tcp_put_header(unsigned char *h, const capex__tcp *t, uint32_t op, uint64_t bytes) {
    capex__put32(h, CAPEX__TCP_MAGIC);
    capex__put32(h + 4, op);
    capex__put32(h + 8, t->seq);
    capex__put32(h + 12, t->tag);
    capex__put64(h + 16, bytes);
}

/* A mismatch where the peer sent a barrier (op 4) for another call: the
   barrier that stands in for a call it refused or had no elements for. */
static const char *capex__tcp_why(uint32_t got, uint32_t want) {
    return got == CAPEX__TCP_BARRIER && want != CAPEX__TCP_BARRIER
               ? " (its op 4 is the barrier standing in for a call that rank refused or had no elements for: its "
                 "own error says why)"
               : "";
}

/* CAPEX_OK when header h from `peer` is (op, this call's seq and tag,
   bytes), else CAPEX_ERR_COMM saying what differs. */
static capex_result capex__tcp_check_header(capex_comm *c, const unsigned char *h, int peer, uint32_t op, uint64_t bytes,
                                           const char *where) {
    capex__tcp *t = (capex__tcp *)c->impl;
    uint32_t hop = capex__get32(h + 4), hseq = capex__get32(h + 8), htag = capex__get32(h + 12);
    uint64_t hbytes = capex__get64(h + 16);
    int same = capex__get32(h) == CAPEX__TCP_MAGIC && hseq == t->seq;
    if (same && hop == op && htag == t->tag && hbytes == bytes) return CAPEX_OK;
    t->bad_header = 1;
    if (capex__get32(h) == CAPEX__TCP_MAGIC && htag == CAPEX__TCP_TAG_REFUSED)
        return capex__fail(CAPEX_ERR_COMM, "TCP comm: rank 0 refused collective #%u (this rank's #%u): the ranks called "
                                           "it with different ops, sizes, dtypes, reduce ops or roots (rank 0's error says "
                                           "which)", (unsigned)hseq, (unsigned)t->seq);
    if (same && hop == op && op == CAPEX__TCP_BROADCAST && htag != t->tag && (htag & CAPEX__TCP_TAG_ROOT) &&
        (t->tag & CAPEX__TCP_TAG_ROOT))
        return capex__fail(CAPEX_ERR_COMM, "TCP comm: broadcast #%u: rank %d passed root %u, rank %d root %u: every rank "
                                           "must pass the same root", (unsigned)hseq, peer,
                           (unsigned)(htag & ~CAPEX__TCP_TAG_ROOT), c->rank, (unsigned)(t->tag & ~CAPEX__TCP_TAG_ROOT));
    if (same && (hop ^ op) == CAPEX__TCP_VIA_RING && (htag & ~CAPEX__TCP_TAG_COUNTS) == (t->tag & ~CAPEX__TCP_TAG_COUNTS))
        return capex__fail(CAPEX_ERR_COMM, "TCP comm: collective #%u: rank %d's count (%llu bytes) goes over the %s, rank "
                                           "%d's (%llu bytes) over the %s: every rank must pass the same count",
                           (unsigned)hseq, peer, (unsigned long long)hbytes, (hop & CAPEX__TCP_VIA_RING) ? "ring" : "star",
                           c->rank, (unsigned long long)bytes, (op & CAPEX__TCP_VIA_RING) ? "ring" : "star");
    return capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d sent op %u #%u (tag %#x) of %llu bytes%s, expected op %u #%u "
                                       "(tag %#x) of %llu bytes: ranks called collectives in different orders, sizes, "
                                       "counts, dtypes, reduce ops or roots%s", peer, (unsigned)hop, (unsigned)hseq, (unsigned)htag,
                       (unsigned long long)hbytes, where, (unsigned)op, (unsigned)t->seq, (unsigned)t->tag,
                       (unsigned long long)bytes, capex__tcp_why(hop, op));
}

static capex_result capex__tcp_send(capex_comm *c, int fd, int peer, uint32_t op, const void *data, size_t bytes, double deadline) {
    unsigned char h[24];
    int e;
    capex__tcp_put_header(h, (const capex__tcp *)c->impl, op, (uint64_t)bytes);
    e = capex__io_all(fd, h, 24, 1, deadline);
    if (e == 0 && bytes) e = capex__io_all(fd, (void *)(uintptr_t)data, bytes, 1, deadline);
    return e ? capex__tcp_io_fail(e, peer, "send") : CAPEX_OK;
}


static capex_result capex__tcp_recv(capex_comm *c, int fd, int peer, uint32_t op, void *data, size_t bytes, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    unsigned char h[24];
    capex_result r;
    int e = capex__io_all(fd, h, 24, 0, deadline);
    t->bad_header = 0;
    if (e) return capex__tcp_io_fail(e, peer, "receive");
    if ((r = capex__tcp_check_header(c, h, peer, op, (uint64_t)bytes, "")) != CAPEX_OK) return r;
    if (bytes && (e = capex__io_all(fd, data, bytes, 0, deadline)) != 0) return capex__tcp_io_fail(e, peer, "receive");
    return CAPEX_OK;
}

/* A header alone (no payload follows) naming `bytes`: a broadcast's word to
   rank 0 and its go, a ring collective's announcement. */
static capex_result capex__tcp_send_word(capex_comm *c, int fd, int peer, uint32_t op, size_t bytes, double deadline) {
    unsigned char h[24];
    int e;
    capex__tcp_put_header(h, (const capex__tcp *)c->impl, op, (uint64_t)bytes);
    e = capex__io_all(fd, h, 24, 1, deadline);
    return e ? capex__tcp_io_fail(e, peer, "send") : CAPEX_OK;
}
static capex_result capex__tcp_recv_word(capex_comm *c, int fd, int peer, uint32_t op, size_t bytes, double deadline) {
    unsigned char h[24];
    int e = capex__io_all(fd, h, 24, 0, deadline);
    ((capex__tcp *)c->impl)->bad_header = 0;
    if (e) return capex__tcp_io_fail(e, peer, "receive");
    return capex__tcp_check_header(c, h, peer, op, (uint64_t)bytes, "");
}

/* Rank 0, having refused a collective whose headers differed: a header-only
   notice to every peer, which all wait on rank 0 in a broadcast (best
   effort: the caller's abort follows and fails them anyway). */
static void capex__tcp_notify_refused(capex_comm *c, uint32_t op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    unsigned char h[24];
    int p;
    uint32_t tag = t->tag;
    t->tag = CAPEX__TCP_TAG_REFUSED;
    capex__tcp_put_header(h, t, op, 0);
    t->tag = tag;
    for (p = 1; p < c->world_size; p++)
        if (t->fds[p] >= 0) (void)capex__io_all(t->fds[p], h, 24, 1, deadline);
}

static void capex__tcp_abort(capex_comm *c);
/* A failure of this rank alone after its sequence number moved on (no
   memory for the scratch): its peers are already in the collective, waiting
   on it. Shut the sockets down so they fail at once (CAPEX_ERR_COMM) instead
   of at their deadline, and mark the comm failed: this rank is out of step. */
static capex_result capex__tcp_local_fail(capex_comm *c, capex_result r) {
    capex__tcp_abort(c);
    c->failed = 1;
    return r;
}

/* Rank 0's scratch per element: an accumulator and one peer's values. It is
   larger than the dtype, so the front's size check is not enough; every rank
   checks it (before any traffic) so that all refuse the same call alike. */
CAPEX__PRIVATE size_t capex__tcp_scratch_elem(capex_dtype ty) {
    return capex__comm_wide(ty) ? 2 * 8 : 4 + capex_comm_dtype_size(ty);
}
static capex_result capex__tcp_scratch(capex_comm *c, size_t n, size_t elem_bytes, void **out) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t bytes;
    *out = NULL;
    if (capex__size_mul(n, elem_bytes, &bytes)) /* called mid-collective: see capex__tcp_local_fail */
        return capex__tcp_local_fail(c, capex__fail(CAPEX_ERR_INVALID_ARG, "TCP comm: %zu elements: the scratch byte "
                                                                           "size overflows size_t", n));
    if (t->tmp_bytes < bytes) {
        capex__free(c->allocator, t->tmp);
        t->tmp = capex__alloc(c->allocator, bytes);
        t->tmp_bytes = t->tmp ? bytes : 0;
    }
    if (!t->tmp)
        return capex__tcp_local_fail(c, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "TCP comm: no memory for %zu elements", n));
    *out = t->tmp;
    return CAPEX_OK;
}

/* acc (f32 sums or the 8-byte type) elements [off, off + n) as the dtype. */
CAPEX__PRIVATE void capex__tcp_acc_out(void *dst, const void *acc, size_t off, size_t n, capex_dtype ty) {
    if (capex__comm_wide(ty)) memmove(dst, (const char *)acc + off * 8, n * 8);
    else capex__host_convert(dst, ty, (const float *)acc + off, CAPEX_F32, n);
}

/* ---- TCP ring: bandwidth-optimal reduce-scatter / allgather ----------- */
/* Above CAPEX__TCP_RING_MIN_BYTES the ring moves 2 (W-1)/W of the data per
   rank, both directions at once, instead of the star's W-fold load on rank 0.
   Reduce-scatter step s (0 .. W-2): rank r sends chunk (r-s-1) mod W to
   rank r+1 and adds chunk (r-s-2) mod W from rank r-1 into its own; chunk k
   is summed in the fixed rank order k+1, k+2, ..., k (mod W), once, on one
   rank: deterministic run to run, and allreduce's allgather then copies the
   same bits to every rank. (The star sums in rank order 0, 1, ...: bits may
   differ between the two paths.) Half types ride the ring as f32 partial
   sums and are rounded once at the end. */
#define CAPEX__TCP_RING_MIN_BYTES ((size_t)256 << 10)

/* Sends (op, sbytes) to fd_out while receiving the same op's rbytes from
   fd_in (the same socket at world 2): both headers are checked like
   capex__tcp_recv's. 0 or a capex_result. */
static capex_result capex__tcp_duplex(capex_comm *c, int fd_out, int peer_out, const void *sbuf, size_t sbytes, int fd_in,
                                     int peer_in, void *rbuf, size_t rbytes, uint32_t op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    unsigned char sh[24], rh[24];
    size_t sdone = 0, rdone = 0, stot = 24 + sbytes, rtot = 24 + rbytes;
    capex__tcp_put_header(sh, t, op, (uint64_t)sbytes);
    while (sdone < stot || rdone < rtot) {
        struct pollfd pf[2];
        int np = 0, ms = capex__ms_left(deadline), k, si = -1, ri = -1;
        if (ms <= 0) return capex__tcp_io_fail(-2, sdone < stot ? peer_out : peer_in, "ring transfer");
        if (sdone < stot) { pf[np].fd = fd_out; pf[np].events = POLLOUT; pf[np].revents = 0; si = np++; }
        if (rdone < rtot) {
            if (si >= 0 && fd_in == fd_out) { pf[si].events |= POLLIN; ri = si; }
            else { pf[np].fd = fd_in; pf[np].events = POLLIN; pf[np].revents = 0; ri = np++; }
        }
        k = poll(pf, (nfds_t)np, ms);
        if (k < 0) { if (errno == EINTR) continue; return capex__tcp_io_fail(-1, peer_out, "ring transfer (poll)"); }
        if (k == 0) continue;
        if (si >= 0 && (pf[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            const unsigned char *src = sdone < 24 ? sh + sdone : (const unsigned char *)sbuf + (sdone - 24);
            size_t len = sdone < 24 ? 24 - sdone : stot - sdone;
            ssize_t w;
#ifdef MSG_NOSIGNAL
            w = send(fd_out, src, len, MSG_NOSIGNAL);
#else
            w = send(fd_out, src, len, 0);
#endif
            if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
                return capex__tcp_io_fail(-1, peer_out, "ring send");
            if (w > 0) sdone += (size_t)w;
        }
        if (ri >= 0 && (pf[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            unsigned char *dst = rdone < 24 ? rh + rdone : (unsigned char *)rbuf + (rdone - 24);
            size_t len = rdone < 24 ? 24 - rdone : rtot - rdone;
            ssize_t g = recv(fd_in, dst, len, 0);
            if (g == 0 || (g < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
                return capex__tcp_io_fail(-1, peer_in, "ring receive");
            if (g > 0) {
                rdone += (size_t)g;
                if (rdone == 24) {
                    capex_result res = capex__tcp_check_header(c, rh, peer_in, op, (uint64_t)rbytes, " on the ring");
                    if (res != CAPEX_OK) return res;
                }
            }
        }
    }
    return CAPEX_OK;
}

/* Chunk k of the ring: elements [displ[k], displ[k] + counts[k]). */
CAPEX__PRIVATE size_t capex__ring_displ(const size_t *counts, int k) {
    size_t d = 0;
    int p;
    for (p = 0; p < k; p++) d += counts[p];
    return d;
}

/* Ring reduce-scatter in place on work (wt: F32, F64 or I64): afterwards
   work's chunk `rank` holds the full sum. stage: room for the largest chunk. */
static capex_result capex__tcp_ring_rs(capex_comm *c, void *work, const size_t *counts, capex_dtype wt, void *stage,
                                      uint32_t op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    int W = c->world_size, r = c->rank, s, prev = (r + W - 1) % W, next = (r + 1) % W;
    size_t es = wt == CAPEX_F32 ? 4 : 8, i;
    capex_result res;
    for (s = 0; s < W - 1; s++) {
        int ks = ((r - s - 1) % W + W) % W, kr = ((r - s - 2) % W + W) % W;
        size_t ds = capex__ring_displ(counts, ks), dr = capex__ring_displ(counts, kr), n = counts[kr];
        res = capex__tcp_duplex(c, t->next_fd, next, (char *)work + ds * es, counts[ks] * es, t->prev_fd, prev, stage,
                                n * es, op, deadline);
        if (res != CAPEX_OK) return res;
        if (wt == CAPEX_F32) {
            float *a = (float *)work + dr;
            const float *x = (const float *)stage;
            for (i = 0; i < n; i++) a[i] = x[i] + a[i]; /* earlier ranks' partial sum, then this rank's value */
        } else if (wt == CAPEX_F64) {
            double *a = (double *)work + dr;
            const double *x = (const double *)stage;
            for (i = 0; i < n; i++) a[i] = x[i] + a[i];
        } else {
            capex__host_add_wide((char *)work + dr * 8, stage, n, CAPEX_I64);
        }
    }
    return CAPEX_OK;
}

/* Ring allgather in place on buf (es bytes an element): chunk `rank` is
   this rank's; step s sends chunk (r-s) mod W and receives (r-s-1) mod W. */
static capex_result capex__tcp_ring_ag(capex_comm *c, void *buf, const size_t *counts, size_t es, uint32_t op,
                                      double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    int W = c->world_size, r = c->rank, s, prev = (r + W - 1) % W, next = (r + 1) % W;
    capex_result res;
    for (s = 0; s < W - 1; s++) {
        int ks = ((r - s) % W + W) % W, kr = ((r - s - 1) % W + W) % W;
        res = capex__tcp_duplex(c, t->next_fd, next, (char *)buf + capex__ring_displ(counts, ks) * es, counts[ks] * es,
                                t->prev_fd, prev, (char *)buf + capex__ring_displ(counts, kr) * es, counts[kr] * es, op,
                                deadline);
        if (res != CAPEX_OK) return res;
    }
    return CAPEX_OK;
}

/* The ring's scratch: total work elements (f32 for the float types, else
   the 8-byte type), then staging for the largest chunk. Checked sizes. */
static capex_result capex__tcp_ring_work(capex_comm *c, size_t total, size_t maxchunk, capex_dtype ty, void **work,
                                        void **stage) {
    size_t wes = capex__comm_wide(ty) ? 8 : 4, a, b;
    void *mem;
    capex_result r;
    if (capex__size_mul(total, wes, &a) || capex__size_mul(maxchunk, wes, &b) || a > SIZE_MAX - b)
        return capex__tcp_local_fail(c, capex__fail(CAPEX_ERR_INVALID_ARG, "TCP comm: %zu elements: the ring's scratch "
                                                                           "byte size overflows size_t", total));
    if ((r = capex__tcp_scratch(c, a + b, 1, &mem)) != CAPEX_OK) return r;
    *work = mem;
    *stage = (char *)mem + a;
    return CAPEX_OK;
}

/* World >= 3, before a ring collective: each peer announces it to rank 0
   (a header only: op | VIA_RING, the collective's bytes), and rank 0 reads
   every announcement before its own ring steps. Ranks passing different
   counts may pick star and ring differently; without this a star rank and
   the ring ranks wait on links nobody writes until the deadline. Rank 0
   fails at once, and its abort fails the others (their links shut in turn).
   World 2's ring runs on the star socket, where the headers already differ. */
static capex_result capex__tcp_ring_announce(capex_comm *c, uint32_t op, size_t bytes, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    capex_result r;
    int p;
    if (c->world_size < 3) return CAPEX_OK;
    if (c->rank != 0) return capex__tcp_send_word(c, t->fds[0], 0, op | CAPEX__TCP_VIA_RING, bytes, deadline);
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_recv_word(c, t->fds[p], p, op | CAPEX__TCP_VIA_RING, bytes, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

/* Ring reduce-scatter of send into recv (this rank's counts[rank] elements). */
static capex_result capex__tcp_ring_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                                  capex_dtype ty, capex_reduce_op op, uint32_t opcode, double deadline) {
    size_t total = 0, maxc = 0, mine = counts[c->rank], d = capex__ring_displ(counts, c->rank), i;
    int p, wide = capex__comm_wide(ty);
    capex_dtype wt = wide ? ty : CAPEX_F32;
    void *work, *stage;
    capex_result r;
    for (p = 0; p < c->world_size; p++) { total += counts[p]; if (counts[p] > maxc) maxc = counts[p]; }
    if ((r = capex__tcp_ring_work(c, total, maxc, ty, &work, &stage)) != CAPEX_OK) return r;
    if (wide) memmove(work, send, total * 8);
    else capex__host_convert(work, CAPEX_F32, send, ty, total);
    if ((r = capex__tcp_ring_rs(c, work, counts, wt, stage, opcode, deadline)) != CAPEX_OK) return r;
    if (op == CAPEX_REDUCE_AVG) {
        if (ty == CAPEX_F64) for (i = 0; i < mine; i++) ((double *)work)[d + i] /= (double)c->world_size;
        else capex__host_div((float *)work + d, mine, CAPEX_F32, (float)c->world_size);
    }
    if (mine) capex__tcp_acc_out(recv, work, d, mine, ty);
    return CAPEX_OK;
}

/* Ring allreduce: reduce-scatter into near-equal chunks, then allgather the
   finished chunks as bits (f32 for the half types, rounded at the end). */
static capex_result capex__tcp_ring_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype ty,
                                             capex_reduce_op op, double deadline) {
    size_t counts[256], *cnt = counts, maxc = 0, wes = capex__comm_wide(ty) ? 8 : 4, i;
    int W = c->world_size, p, wide = capex__comm_wide(ty);
    void *work, *stage;
    capex_result r;
    if (W > 256) {
        cnt = (size_t *)capex__alloc(NULL, sizeof(size_t) * (size_t)W);
        if (!cnt) return capex__tcp_local_fail(c, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "TCP comm: out of memory"));
    }
    for (p = 0; p < W; p++) { cnt[p] = n / (size_t)W + ((size_t)p < n % (size_t)W); if (cnt[p] > maxc) maxc = cnt[p]; }
    r = capex__tcp_ring_work(c, n, maxc, ty, &work, &stage);
    if (r == CAPEX_OK) {
        if (wide) memmove(work, send, n * 8);
        else capex__host_convert(work, CAPEX_F32, send, ty, n);
        r = capex__tcp_ring_rs(c, work, cnt, wide ? ty : CAPEX_F32, stage, CAPEX__TCP_ALLREDUCE, deadline);
    }
    if (r == CAPEX_OK) r = capex__tcp_ring_ag(c, work, cnt, wes, CAPEX__TCP_ALLREDUCE, deadline);
    if (r == CAPEX_OK) {
        if (op == CAPEX_REDUCE_AVG) {
            if (ty == CAPEX_F64) for (i = 0; i < n; i++) ((double *)work)[i] /= (double)W;
            else if (!wide) capex__host_div(work, n, CAPEX_F32, (float)W);
        }
        capex__tcp_acc_out(recv, work, 0, n, ty);
    }
    if (cnt != counts) capex__free(NULL, cnt);
    return r;
}

/* Rank 0's half of a reduction: its own n elements of `send`, then each
   peer's (message `op`) added in rank order, ((x0 + x1) + x2) + ..., into its
   scratch: f32 sums for the float types (rounded once by the caller), f64 or
   int64 for the wide ones; AVG divided there. *acc points at the sums, and
   the scratch after them (n elements of the dtype at least) is free. */
static capex_result capex__tcp_reduce_root(capex_comm *c, const void *send, size_t n, capex_dtype ty, capex_reduce_op op,
                                          uint32_t opcode, double deadline, void **acc_out) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t es = capex_comm_dtype_size(ty), i;
    capex_result r;
    void *mem;
    int p;
    *acc_out = NULL;
    if ((r = capex__tcp_scratch(c, n, capex__tcp_scratch_elem(ty), &mem)) != CAPEX_OK) return r;
    if (capex__comm_wide(ty)) {
        unsigned char *acc = (unsigned char *)mem;
        memmove(acc, send, n * 8);
        for (p = 1; p < c->world_size; p++) {
            if ((r = capex__tcp_recv(c, t->fds[p], p, opcode, acc + n * 8, n * 8, deadline)) != CAPEX_OK) return r;
            capex__host_add_wide(acc, acc + n * 8, n, ty);
        }
        if (op == CAPEX_REDUCE_AVG && ty == CAPEX_F64)
            for (i = 0; i < n; i++) ((double *)(void *)acc)[i] /= (double)c->world_size;
    } else {
        float *acc = (float *)mem;
        void *in = (char *)acc + n * 4;
        capex__host_convert(acc, CAPEX_F32, send, ty, n);
        for (p = 1; p < c->world_size; p++) {
            if ((r = capex__tcp_recv(c, t->fds[p], p, opcode, in, n * es, deadline)) != CAPEX_OK) return r;
            if (ty == CAPEX_F32) { const float *x = (const float *)in; for (i = 0; i < n; i++) acc[i] += x[i]; }
            else for (i = 0; i < n; i++) acc[i] += capex__load(in, ty, i);
        }
        if (op == CAPEX_REDUCE_AVG) capex__host_div(acc, n, CAPEX_F32, (float)c->world_size);
    }
    *acc_out = mem;
    return CAPEX_OK;
}

/* Peers send their values to rank 0 and receive the result; rank 0 reduces. */
static capex_result capex__tcp_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype ty,
                                        capex_reduce_op op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t es = capex_comm_dtype_size(ty), i;
    capex_result r = CAPEX_OK;
    void *acc;
    int p;
    if (capex__size_mul(n, capex__tcp_scratch_elem(ty), &i))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "TCP comm: %zu elements: rank 0's scratch byte size overflows size_t", n);
    t->seq++;
    t->tag = capex__tcp_tag(ty, op);
    if (t->ring && n * es >= CAPEX__TCP_RING_MIN_BYTES)
        return (r = capex__tcp_ring_announce(c, CAPEX__TCP_ALLREDUCE, n * es, deadline)) != CAPEX_OK
                   ? r : capex__tcp_ring_allreduce(c, send, recv, n, ty, op, deadline);
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_ALLREDUCE, send, n * es, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_ALLREDUCE, recv, n * es, deadline);
    }
    if ((r = capex__tcp_reduce_root(c, send, n, ty, op, CAPEX__TCP_ALLREDUCE, deadline, &acc)) != CAPEX_OK) return r;
    capex__tcp_acc_out(recv, acc, 0, n, ty);
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_ALLREDUCE, recv, n * es, deadline)) != CAPEX_OK) return r;
    return r;
}

/* Star reduce-scatter: rank 0 reduces everything (as allreduce), then sends
   each peer its slice only. */
static capex_result capex__tcp_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                             capex_dtype ty, capex_reduce_op op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t es = capex_comm_dtype_size(ty), total = 0, off, i;
    capex_result r;
    void *acc;
    int p;
    for (p = 0; p < c->world_size; p++) total += counts[p];
    if (capex__size_mul(total, capex__tcp_scratch_elem(ty), &i))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "TCP comm: %zu elements: rank 0's scratch byte size overflows size_t", total);
    t->seq++;
    t->tag = capex__tcp_tag(ty, op) | capex__tcp_counts_tag(counts, c->world_size);
    if (t->ring && total * es >= CAPEX__TCP_RING_MIN_BYTES)
        return (r = capex__tcp_ring_announce(c, CAPEX__TCP_REDUCE_SCATTER, total * es, deadline)) != CAPEX_OK
                   ? r : capex__tcp_ring_reduce_scatter(c, send, recv, counts, ty, op, CAPEX__TCP_REDUCE_SCATTER, deadline);
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_REDUCE_SCATTER, send, total * es, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_REDUCE_SCATTER, recv, counts[c->rank] * es, deadline);
    }
    if ((r = capex__tcp_reduce_root(c, send, total, ty, op, CAPEX__TCP_REDUCE_SCATTER, deadline, &acc)) != CAPEX_OK) return r;
    if (counts[0]) capex__tcp_acc_out(recv, acc, 0, counts[0], ty);
    for (p = 1, off = counts[0]; p < c->world_size; off += counts[p], p++) {
        /* the scratch past the sums is free: stage the slice there */
        void *slice = (char *)acc + total * (capex__comm_wide(ty) ? 8 : 4);
        capex__tcp_acc_out(slice, acc, off, counts[p], ty);
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_REDUCE_SCATTER, slice, counts[p] * es, deadline)) != CAPEX_OK)
            return r;
    }
    return CAPEX_OK;
}

/* Star allgatherv: rank 0 collects every shard in place, then sends all. */
static capex_result capex__tcp_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts, capex_dtype ty,
                                         double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t es = capex_comm_dtype_size(ty), total = 0, off;
    capex_result r;
    int p;
    for (p = 0; p < c->world_size; p++) total += counts[p];
    t->seq++;
    t->tag = capex__tcp_counts_tag(counts, c->world_size);
    if (t->ring && total * es >= CAPEX__TCP_RING_MIN_BYTES) {
        size_t d = capex__ring_displ(counts, c->rank);
        if ((r = capex__tcp_ring_announce(c, CAPEX__TCP_ALLGATHERV, total * es, deadline)) != CAPEX_OK) return r;
        if (counts[c->rank]) memmove((char *)recv + d * es, send, counts[c->rank] * es);
        return capex__tcp_ring_ag(c, recv, counts, es, CAPEX__TCP_ALLGATHERV, deadline);
    }
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_ALLGATHERV, send, counts[c->rank] * es, deadline)) != CAPEX_OK)
            return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_ALLGATHERV, recv, total * es, deadline);
    }
    if (counts[0]) memmove(recv, send, counts[0] * es); /* send may be NULL with no elements */
    for (p = 1, off = counts[0]; p < c->world_size; off += counts[p], p++)
        if ((r = capex__tcp_recv(c, t->fds[p], p, CAPEX__TCP_ALLGATHERV, (char *)recv + off * es, counts[p] * es, deadline)) !=
            CAPEX_OK)
            return r;
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_ALLGATHERV, recv, total * es, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

/* Every peer first sends rank 0 a header alone naming its root and byte
   count; rank 0 reads them all before any data moves, so ranks passing
   different roots or counts all fail at once (rank 0 names what differs,
   its notice tells the peers) instead of the root returning CAPEX_OK, the
   others pairing with the next collective or waiting out the deadline. A
   root other than 0 sends its data when rank 0 says go (a header alone). */
static capex_result capex__tcp_broadcast(capex_comm *c, void *buf, size_t n, capex_dtype ty, int root, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t bytes = n * capex_comm_dtype_size(ty);
    capex_result r;
    int p;
    t->seq++;
    t->tag = CAPEX__TCP_TAG_ROOT | (uint32_t)root;
    if (c->rank != 0) {
        if ((r = capex__tcp_send_word(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, bytes, deadline)) != CAPEX_OK) return r;
        if (c->rank != root) return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, buf, bytes, deadline);
        if ((r = capex__tcp_recv_word(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, bytes, deadline)) != CAPEX_OK) return r;
        return capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, buf, bytes, deadline);
    }
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_recv_word(c, t->fds[p], p, CAPEX__TCP_BROADCAST, bytes, deadline)) != CAPEX_OK) {
            if (t->bad_header) capex__tcp_notify_refused(c, CAPEX__TCP_BROADCAST, deadline);
            return r;
        }
    if (root != 0 && ((r = capex__tcp_send_word(c, t->fds[root], root, CAPEX__TCP_BROADCAST, bytes, deadline)) != CAPEX_OK ||
                      (r = capex__tcp_recv(c, t->fds[root], root, CAPEX__TCP_BROADCAST, buf, bytes, deadline)) != CAPEX_OK))
        return r;
    for (p = 1; p < c->world_size; p++)
        if (p != root && (r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_BROADCAST, buf, bytes, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

static capex_result capex__tcp_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype ty, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t bytes = n * capex_comm_dtype_size(ty), all = bytes * (size_t)c->world_size;
    capex_result r;
    int p;
    t->seq++;
    t->tag = 0;
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_ALLGATHER, send, bytes, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_ALLGATHER, recv, all, deadline);
    }
    memmove(recv, send, bytes);
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_recv(c, t->fds[p], p, CAPEX__TCP_ALLGATHER, (char *)recv + bytes * (size_t)p, bytes, deadline)) != CAPEX_OK)
            return r;
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_ALLGATHER, recv, all, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

/* Rank 0 first tells every peer it has arrived, then waits for theirs, then
   releases them. That first message makes a peer waiting to read from rank 0
   in another call (a broadcast from rank 0, the ring's rank 1) fail at once
   on the op mismatch when this barrier stands in for a call rank 0 alone
   refused or had no elements for (capex__comm_refused, capex__comm_empty);
   rank 0 reading first would wait for a message they never send. */
static capex_result capex__tcp_barrier(capex_comm *c, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    capex_result r;
    int p;
    t->seq++;
    t->tag = 0;
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
        if ((r = capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_BARRIER, NULL, 0, deadline);
    }
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_recv(c, t->fds[p], p, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
    for (p = 1; p < c->world_size; p++)
        if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

static void capex__tcp_destroy(capex_comm *c) {
    capex__tcp *t = (capex__tcp *)c->impl;
    int p;
    if (!t) return;
    for (p = 0; t->fds && p < c->world_size; p++) if (t->fds[p] >= 0) close(t->fds[p]);
    if (t->own_next) close(t->next_fd);
    if (t->own_prev) close(t->prev_fd);
    capex__free(NULL, t->fds);
    capex__free(c->allocator, t->tmp);
    capex__free(NULL, t);
    c->impl = NULL;
}

/* After a failure: shut every connection down (the sockets stay open until
   destroy), so that peers blocked on this rank see EOF and fail at once
   (CAPEX_ERR_COMM) instead of waiting out their own deadline. */
static void capex__tcp_abort(capex_comm *c) {
    capex__tcp *t = (capex__tcp *)c->impl;
    int p;
    for (p = 0; t && t->fds && p < c->world_size; p++) if (t->fds[p] >= 0) shutdown(t->fds[p], SHUT_RDWR);
    if (t && t->own_next) shutdown(t->next_fd, SHUT_RDWR);
    if (t && t->own_prev) shutdown(t->prev_fd, SHUT_RDWR);
}

static const capex_comm_vtable capex__tcp_vt = {
    "tcp", capex__tcp_allreduce, capex__tcp_broadcast, capex__tcp_allgather, capex__tcp_barrier,
    NULL, NULL, NULL, capex__tcp_abort, capex__tcp_destroy, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    capex__tcp_reduce_scatter, capex__tcp_allgatherv, NULL, NULL, NULL, NULL, NULL};
#endif /* CAPEX__HAVE_SOCKETS */

#ifdef CAPEX__HAVE_SOCKETS
/* Ring links for world >= 3 (world 2 uses its one star socket both ways):
   ranks 2..W-1 listen on an ephemeral port at the address their star socket
   uses and tell rank 0 (op 7: port); rank 0 tells each rank 1..W-2 where
   rank+1 listens (op 8: family 4/6, port, 16 address bytes, as rank 0's
   socket to that rank sees it); rank r connects and says "CPXG", its rank
   and the run nonce; rank r+1 accepts until that hello arrives (strays are
   dropped). Ends with a star barrier so every rank's links exist. */
#define CAPEX__TCP_RING_HELLO 0x47585043u
static capex_result capex__tcp_ring_setup(capex_comm *c, uint64_t nonce, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    int W = c->world_size, r = c->rank, ls = -1, p, e, starved = 0;
    unsigned char m[24];
    capex_result res = CAPEX_OK;
    t->next_fd = r == 0 ? t->fds[1] : r == W - 1 ? t->fds[0] : -1;
    t->prev_fd = r == 0 ? t->fds[W - 1] : r == 1 ? t->fds[0] : -1;
    if (W == 2) { t->ring = 1; return CAPEX_OK; }
    t->seq++;
    t->tag = 0;
    if (r >= 2) { /* listen where the star socket's local address is */
        struct sockaddr_storage ss;
        socklen_t sl = (socklen_t)sizeof ss;
        int one = 1;
        memset(&ss, 0, sizeof ss);
        if (getsockname(t->fds[0], (struct sockaddr *)&ss, &sl) != 0)
            return capex__fail(CAPEX_ERR_COMM, "TCP comm: getsockname failed: %s", strerror(errno));
        if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
        else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
        ls = socket(ss.ss_family, SOCK_STREAM, 0);
        if (ls < 0) return capex__fail(CAPEX_ERR_COMM, "TCP comm: socket() failed: %s", strerror(errno));
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&ss, sl) != 0 || listen(ls, 16) != 0 ||
            getsockname(ls, (struct sockaddr *)&ss, &sl) != 0) {
            close(ls);
            return capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d cannot listen for its ring link: %s", r, strerror(errno));
        }
        capex__set_nonblock(ls);
        capex__put32(m, (uint32_t)ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                                 : ((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        capex__put32(m, 0);
    }
    if (r != 0) {
        res = capex__tcp_send(c, t->fds[0], 0, 7, m, 4, deadline);
        if (res == CAPEX_OK) res = capex__tcp_recv(c, t->fds[0], 0, 8, m, 24, deadline);
    } else {
        uint32_t *ports = (uint32_t *)capex__alloc(NULL, sizeof(uint32_t) * (size_t)W);
        if (!ports) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "TCP comm: out of memory");
        for (p = 1; p < W && res == CAPEX_OK; p++) {
            res = capex__tcp_recv(c, t->fds[p], p, 7, m, 4, deadline);
            ports[p] = capex__get32(m);
            if (res == CAPEX_OK && (p >= 2) != (ports[p] != 0))
                res = capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d sent ring port %u", p, (unsigned)ports[p]);
        }
        for (p = 1; p < W && res == CAPEX_OK; p++) { /* where rank p+1 listens, as rank 0 sees that rank */
            struct sockaddr_storage ss;
            socklen_t sl = (socklen_t)sizeof ss;
            memset(m, 0, sizeof m);
            if (p + 1 < W) {
                if (getpeername(t->fds[p + 1], (struct sockaddr *)&ss, &sl) != 0) {
                    res = capex__fail(CAPEX_ERR_COMM, "TCP comm: getpeername failed: %s", strerror(errno));
                    break;
                }
                capex__put32(m + 4, ports[p + 1]);
                if (ss.ss_family == AF_INET) {
                    capex__put32(m, 4);
                    memcpy(m + 8, &((struct sockaddr_in *)&ss)->sin_addr, 4);
                } else {
                    capex__put32(m, 6);
                    memcpy(m + 8, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
                }
            }
            res = capex__tcp_send(c, t->fds[p], p, 8, m, 24, deadline);
        }
        capex__free(NULL, ports);
    }
    if (res == CAPEX_OK && r >= 1 && r <= W - 2) { /* connect to rank r+1 and say who we are */
        struct sockaddr_storage ss;
        socklen_t sl;
        uint32_t fam = capex__get32(m), port = capex__get32(m + 4);
        int fd;
        memset(&ss, 0, sizeof ss);
        if (fam == 4) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            a->sin_family = AF_INET; a->sin_port = htons((unsigned short)port); memcpy(&a->sin_addr, m + 8, 4);
            sl = (socklen_t)sizeof *a;
        } else {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            a->sin6_family = AF_INET6; a->sin6_port = htons((unsigned short)port); memcpy(&a->sin6_addr, m + 8, 16);
            sl = (socklen_t)sizeof *a;
        }
        fd = (fam == 4 || fam == 6) && port && port < 65536 ? socket(ss.ss_family, SOCK_STREAM, 0) : -1;
        if (fd < 0) res = capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d: bad ring address from rank 0 or socket(): %s", r,
                                      strerror(errno));
        if (res == CAPEX_OK) {
            int nd = 1;
            capex__set_nonblock(fd);
            if (connect(fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS && errno != EINTR) e = -1;
            else {
                struct pollfd pf;
                int so = 0;
                socklen_t l2 = (socklen_t)sizeof so;
                pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
                e = poll(&pf, 1, capex__ms_left(deadline)) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &l2) == 0 && !so
                        ? 0 : -1;
            }
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof nd);
            if (e == 0) {
                capex__put32(m, CAPEX__TCP_RING_HELLO);
                capex__put32(m + 4, (uint32_t)r);
                capex__put64(m + 8, nonce);
                e = capex__io_all(fd, m, 16, 1, deadline);
            }
            if (e) { close(fd); res = capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d cannot reach rank %d's ring port", r, r + 1); }
            else { t->next_fd = fd; t->own_next = 1; }
        }
    }
    while (res == CAPEX_OK && r >= 2) { /* accept rank r-1's link; anything else is dropped */
        struct pollfd pf;
        int fd, k;
        pf.fd = ls; pf.events = POLLIN; pf.revents = 0;
        k = poll(&pf, 1, capex__ms_left(deadline));
        if (k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            res = capex__fail(CAPEX_ERR_TIMEOUT, "TCP comm: rank %d: rank %d's ring link did not arrive before the deadline%s%s",
                              r, r - 1, starved ? "; accept() failed: " : "", starved ? strerror(starved) : "");
            break;
        }
        fd = accept(ls, NULL, NULL);
        if (fd < 0 && capex__accept_starved(errno)) { /* wait for a descriptor rather than spin; say so at the deadline */
            starved = errno;
            capex__sleep_s(0.05);
            continue;
        }
        if (fd < 0) continue;
        capex__set_nonblock(fd);
        e = capex__io_all(fd, m, 16, 0, capex_dist_now() + 2.0 < deadline ? capex_dist_now() + 2.0 : deadline);
        if (e == 0 && capex__get32(m) == CAPEX__TCP_RING_HELLO && capex__get32(m + 4) == (uint32_t)(r - 1) &&
            capex__get64(m + 8) == nonce) {
            int nd = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof nd);
            t->prev_fd = fd;
            t->own_prev = 1;
            break;
        }
        close(fd);
    }
    if (ls >= 0) close(ls);
    if (res == CAPEX_OK) res = capex__tcp_barrier(c, deadline);
    if (res == CAPEX_OK) t->ring = 1;
    return res;
}
#endif

/* *port = env->rdv_port, or for an env filled by hand (rdv_port 0) the rule
   of capex_dist_env_read applied to the process environment, refusing what
   it refuses: the store on MASTER_PORT=65535 leaves no next port. */
CAPEX__PRIVATE capex_result capex__dist_rdv_port(const capex_dist_env *env, const char *fn, int *port) {
    const char *agent;
    *port = env->rdv_port > 0 ? env->rdv_port : env->master_port;
    if (env->rdv_port > 0) return CAPEX_OK;
    agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (env->launcher == CAPEX_LAUNCHER_TORCHRUN && env->master_port > 0 && agent &&
        (!strcmp(agent, "True") || !strcmp(agent, "true") || !strcmp(agent, "1"))) {
        if (env->master_port == 65535)
            return capex__fail(CAPEX_ERR_CONFIG, "%s: torchrun's store (TORCHELASTIC_USE_AGENT_STORE) holds "
                               "MASTER_PORT=65535 and capex would listen on the next port: choose another "
                               "MASTER_PORT or set the env's rdv_port", fn);
        *port = env->master_port + 1;
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_comm_init_tcp(capex_comm *c, const capex_dist_env *env, double connect_timeout_s) {
#ifdef CAPEX__HAVE_SOCKETS
    capex_rendezvous_desc d;
    capex__tcp *t;
    capex_result r;
    int p;
    double deadline;
#endif
    if (!c || !env) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_tcp: NULL argument");
    memset(c, 0, sizeof *c);
    if (env->world_size == 1) return capex_comm_init_single(c);
#ifdef CAPEX__HAVE_SOCKETS
    if ((r = capex__dist_rdv_port(env, "capex_comm_init_tcp", &p)) != CAPEX_OK) return r;
    if (!env->master_addr[0] || !p)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_comm_init_tcp: %d ranks need MASTER_ADDR and MASTER_PORT", env->world_size);
    capex_rendezvous_desc_init(&d);
    d.addr = env->master_addr;
    d.port = p;
    d.rank = env->rank;
    d.world_size = env->world_size;
    d.nonce = capex_rendezvous_nonce(env->run_id);
    if (connect_timeout_s > 0) d.timeout_s = connect_timeout_s;
    if (d.port < 1 || d.port > 65535) /* getaddrinfo takes "70000" as port 4464 */
        return capex__fail(CAPEX_ERR_CONFIG, "capex_comm_init_tcp: port %d (env's rdv_port or master_port) is not in "
                                             "[1, 65535]", d.port);
    if (d.rank < 0 || d.rank >= d.world_size) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_tcp: bad rank");
    t = (capex__tcp *)capex__alloc(NULL, sizeof *t);
    if (!t) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_comm_init_tcp: out of memory");
    memset(t, 0, sizeof *t);
    t->fds = (int *)capex__alloc(NULL, sizeof(int) * (size_t)env->world_size);
    if (!t->fds) { capex__free(NULL, t); return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_comm_init_tcp: out of memory"); }
    for (p = 0; p < env->world_size; p++) t->fds[p] = -1;
    deadline = capex_dist_now() + d.timeout_s;
    r = d.rank == 0 ? capex__rdv_root(&d, NULL, 0, deadline, t->fds) : capex__rdv_peer(&d, NULL, 0, deadline, &t->fds[0]);
    if (r != CAPEX_OK) { capex__free(NULL, t->fds); capex__free(NULL, t); return r; }
    c->vt = &capex__tcp_vt;
    c->impl = t;
    c->rank = env->rank;
    c->world_size = env->world_size;
    c->timeout_s = 1800.0;
    if ((r = capex__tcp_ring_setup(c, d.nonce, deadline)) != CAPEX_OK) {
        capex__tcp_abort(c); /* peers waiting on this rank fail at once */
        capex_comm_destroy(c);
        return r;
    }
    return CAPEX_OK;
#else
    (void)connect_timeout_s;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_comm_init_tcp: no sockets on this platform/build");
#endif
}

CAPEX_API capex_result capex_rendezvous_broadcast(const capex_rendezvous_desc *d, void *blob, size_t size) {
    double deadline;
    if (!d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_rendezvous_broadcast: desc is NULL");
    if (d->init_tag != CAPEX__TAG_RENDEZVOUS_DESC)
        return capex__desc_check(d->init_tag, CAPEX__TAG_RENDEZVOUS_DESC, "capex_rendezvous_broadcast",
                                 "capex_rendezvous_desc", "capex_rendezvous_desc_init");
    if (d->world_size < 1 || d->rank < 0 || d->rank >= d->world_size)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_rendezvous_broadcast: rank %d / world size %d invalid", d->rank,
                           d->world_size);
    if (size && !blob) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_rendezvous_broadcast: blob is NULL");
    if (!(d->timeout_s > 0)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_rendezvous_broadcast: timeout_s must be > 0");
    if (d->world_size == 1) return CAPEX_OK;
    if (!d->addr || !*d->addr)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_rendezvous_broadcast: no address; set MASTER_ADDR (rank 0's host)");
    if (d->port < 1 || d->port > 65535)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_rendezvous_broadcast: port %d not in [1, 65535]; set MASTER_PORT", d->port);
#ifdef CAPEX__HAVE_SOCKETS
    deadline = capex_dist_now() + d->timeout_s;
    return d->rank == 0 ? capex__rdv_root(d, blob, size, deadline, NULL) : capex__rdv_peer(d, blob, size, deadline, NULL);
#else
    (void)deadline;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_rendezvous_broadcast: no sockets on this platform/build");
#endif
}

CAPEX_API capex_result capex_dist_broadcast_blob(const capex_dist_env *env, capex_comm *comm, void *blob, size_t size,
                                                 double timeout_s) {
    capex_rendezvous_desc d;
    capex_result pr;
    int port;
    if (size && !blob) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_broadcast_blob: blob is NULL");
    if (comm && comm->vt && comm->world_size > 1 && !comm->device_buffers) {
        /* broadcast moves bits: carry the bytes as f32 words */
        size_t words = size / 4 + (size % 4 != 0); /* (size + 3) / 4 wraps near SIZE_MAX */
        float *tmp;
        capex_result r;
        double saved = comm->timeout_s;
        if (words > SIZE_MAX / 4)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_broadcast_blob: size %zu: the byte size overflows size_t", size);
        tmp = (float *)capex__alloc(comm->allocator, words * 4);
        if (!tmp) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_dist_broadcast_blob: out of memory");
        memset(tmp, 0, words * 4);
        if (comm->rank == 0 && size) memcpy(tmp, blob, size);
        if (timeout_s > 0) comm->timeout_s = timeout_s;
        r = capex_comm_broadcast(comm, tmp, words, CAPEX_F32, 0);
        comm->timeout_s = saved;
        if (r == CAPEX_OK && size) memcpy(blob, tmp, size);
        capex__free(comm->allocator, tmp);
        return r;
    }
    if (!env) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_broadcast_blob: no multi-rank comm and no env");
    if (env->world_size == 1) return CAPEX_OK;
    if ((pr = capex__dist_rdv_port(env, "capex_dist_broadcast_blob", &port)) != CAPEX_OK) return pr;
    if (!env->master_addr[0] || !port)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_dist_broadcast_blob: %d ranks need MASTER_ADDR and MASTER_PORT "
                                             "(rank 0's host and a free port) for the TCP rendezvous", env->world_size);
    capex_rendezvous_desc_init(&d);
    d.addr = env->master_addr;
    d.port = port;
    d.rank = env->rank;
    d.world_size = env->world_size;
    d.nonce = capex_rendezvous_nonce(env->run_id);
    if (timeout_s > 0) d.timeout_s = timeout_s;
    return capex_rendezvous_broadcast(&d, blob, size);
}

CAPEX_API capex_result capex_comm_init_auto(capex_comm *c, const capex_dist_env *env) {
    capex_result r;
    if (!c || !env) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_auto: NULL argument");
#ifdef CAPEX_MPI
    {
        int init = 0, fin = 0;
        MPI_Initialized(&init);
        MPI_Finalized(&fin);
        if (init && !fin) {
            if ((r = capex_comm_init_mpi(c, MPI_COMM_WORLD)) != CAPEX_OK) return r;
            if (c->rank != env->rank || c->world_size != env->world_size) {
                int rk = c->rank, ws = c->world_size;
                capex_comm_destroy(c);
                return capex__fail(CAPEX_ERR_CONFIG, "capex_comm_init_auto: MPI says rank %d of %d but the launcher "
                                                     "environment (%s) says %d of %d", rk, ws,
                                   capex_launcher_name(env->launcher), env->rank, env->world_size);
            }
            return CAPEX_OK;
        }
    }
#endif
    if (env->world_size > 1) {
        if ((r = capex_comm_init_tcp(c, env, 0)) != CAPEX_OK) return r;
        return CAPEX_OK;
    }
    return capex_comm_init_single(c);
}

/* ---- data parallel: DDP buckets ----------------------------------------- */

typedef struct capex__bucket {
    capex_dtype dtype;
    size_t numel;
    size_t first, count;   /* slice of ddp->bparams / ddp->boffsets          */
    void *buf;             /* numel grads, contiguous (comm memory)          */
    void *buf32;           /* f32 copy for allreduce_always_fp32 half buckets */
    int stage32;           /* buf32 only stands in for the backend's f32 staging */
    size_t pending;        /* params not yet ready this iteration            */
    int launched, waited;
    int sync_done;         /* reduced synchronously at launch                */
    int test_done;         /* test said finished: not polled again          */
    capex_comm_req req;
} capex__bucket;

struct capex_ddp {
    capex_comm *comm;
    capex_ddp_desc d;
    size_t np;
    capex_ddp_param *params;
    size_t *bucket_of, *offset_of;   /* per param                          */
    size_t *bparams, *boffsets;      /* per bucket slices                  */
    unsigned char *ready, *accum;    /* this iteration; since last sync    */
    size_t *ready_order;             /* observed order (rebuild)           */
    size_t n_ready_order;
    size_t nb;
    capex__bucket *b;
    capex__bucket *retired;          /* buckets before a rebuild: freed when */
    size_t n_retired;                /* the next iteration starts            */
    size_t next_launch;
    size_t reserved;                 /* requests reserved on the comm (vt->reserve) */
    capex__hostbuf hb;               /* the exchanges' device buffer without vt->host_buffer */
    int sync, layout_version, rebuilt, failed, in_finalize;
    capex_ddp_stats st;
};

/* ---- data parallel: the same model on every rank (checked at create) ----

   capex_ddp_create and capex_zero_create (and capex_cuda_zero_create)
   allgather one signature of CAPEX__SIG_N int64 per rank before their first
   collective, as PyTorch DDP's _verify_param_shape_across_processes: whether
   this rank refused its own arguments, which create it is, the param count
   and elements, hashes of the per-param numels, dtypes (ZeRO: groups), and
   the descriptor fields every rank must share (those that shape the buckets,
   decide which collectives run or what they carry, or change the result).
   Every rank sees every signature and takes the same decision: a mismatch
   fails every rank at once with one message, where it used to hang (MPI,
   NCCL), fail late (TCP) or give silently wrong results. The exchange
   succeeded, so the comm stays usable. World size 1: nothing is sent. */
enum {
    CAPEX__SIG_API, CAPEX__SIG_REFUSED, CAPEX__SIG_NP, CAPEX__SIG_NUMEL, CAPEX__SIG_H_NUMEL, CAPEX__SIG_H_DTYPE,
    CAPEX__SIG_H_GROUP, CAPEX__SIG_DESC, CAPEX__SIG_N = 18
};
#define CAPEX__SIG_MAGIC 0x4361705369670000ll /* "CapSig", then the API in the low byte */
#define CAPEX__SIG_DDP (CAPEX__SIG_MAGIC | 1)
#define CAPEX__SIG_ZERO (CAPEX__SIG_MAGIC | 2)

/* An order-sensitive 64-bit hash step (boost's combine, then a multiply to spread the bits). */
CAPEX__PRIVATE uint64_t capex__sig_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* The model's part of a signature; the rest (the descriptor's) zeroed. */
CAPEX__PRIVATE void capex__sig_model(int64_t *sig, int64_t api, size_t np, uint64_t total, uint64_t h_numel,
                                     uint64_t h_dtype) {
    memset(sig, 0, sizeof(int64_t) * CAPEX__SIG_N);
    sig[CAPEX__SIG_API] = api;
    sig[CAPEX__SIG_NP] = (int64_t)np;
    sig[CAPEX__SIG_NUMEL] = (int64_t)total;
    sig[CAPEX__SIG_H_NUMEL] = (int64_t)h_numel;
    sig[CAPEX__SIG_H_DTYPE] = (int64_t)h_dtype;
}

/* desc[k] names signature slot CAPEX__SIG_DESC + k (NULL: unused); a name
   starting with '#' is a hash (no values to print); float_slots: the slots
   (bit k) holding f32 bits. */
typedef struct capex__sig_names {
    const char *api;  /* what the message calls the create */
    const char *desc_type;
    const char *desc[CAPEX__SIG_N - CAPEX__SIG_DESC];
    unsigned float_slots;
} capex__sig_names;

CAPEX__PRIVATE void capex__sig_value(char *buf, size_t n, const capex__sig_names *nm, int k, int64_t v) {
    if ((nm->float_slots >> k) & 1u) snprintf(buf, n, "%g", (double)capex__bits_f32((uint32_t)v));
    else snprintf(buf, n, "%lld", (long long)v);
}

/* The device bytes of the fixed-size exchanges of capex__comm_host on a
   world of W: the creates' model check (an allgather of CAPEX__SIG_N int64
   and its send slot) is the largest; agreements take 32, ZeRO's save status
   8. A device comm's host_buffer is made this large at init. */
CAPEX__PRIVATE size_t capex__comm_host_bytes(int W) { return sizeof(int64_t) * CAPEX__SIG_N * ((size_t)(W > 1 ? W : 1) + 1); }

/* A collective on a small host array (the model check, agreements, DDP's
   ready order, ZeRO's save status), through a device buffer when the
   transport needs one (NCCL): the comm's own (vt->host_buffer; made at
   init, and for DDP's ready order at create, so nothing is allocated here
   where a rank failing alone would leave its peers in the collective),
   else the caller's hb (a device comm without host_buffer: made at the
   front-end's create), else one allocated per call. ALLGATHER: send holds count, recv
   world_size x count; ALLREDUCE (sum) and BROADCAST work in place on recv.
   On a timeout an allocated device buffer is not freed: a transport may
   still write it. */
enum { CAPEX__HOST_ALLGATHER, CAPEX__HOST_ALLREDUCE, CAPEX__HOST_BROADCAST };
CAPEX__PRIVATE capex_result capex__comm_host(capex_comm *c, capex__hostbuf *hb, int kind, const void *send, void *recv,
                                             size_t count, capex_dtype t, int root) {
    size_t es = capex_comm_dtype_size(t), nout = kind == CAPEX__HOST_ALLGATHER ? count * (size_t)c->world_size : count;
    size_t need = es * (kind == CAPEX__HOST_ALLGATHER ? nout + count : nout);
    void *dev = NULL, *in;
    int kept = c->vt->host_buffer != NULL || (hb && hb->dev && hb->bytes >= need);
    capex_result r;
    if (!c->device_buffers) {
        if (kind == CAPEX__HOST_ALLGATHER) r = capex__comm_allgather_checked(c, send, recv, count, t);
        else if (kind == CAPEX__HOST_ALLREDUCE) r = capex__comm_allreduce_checked(c, recv, recv, count, t, CAPEX_REDUCE_SUM);
        else r = capex__comm_broadcast_checked(c, recv, count, t, root);
        return capex__comm_refused(c, r);
    }
    /* allgather: the send slot after the world_size receive slots */
    if (c->vt->host_buffer) r = c->vt->host_buffer(c, need, &dev);
    else if (kept) r = CAPEX_OK, dev = hb->dev;
    else r = capex__comm_alloc(c, &dev, need);
    if (r != CAPEX_OK) return r;
    in = kind == CAPEX__HOST_ALLGATHER ? (char *)dev + es * nout : dev;
    r = capex__comm_copy(c, in, kind == CAPEX__HOST_ALLGATHER ? send : recv, es * count, CAPEX_COPY_H2D);
    if (r == CAPEX_OK) {
        if (kind == CAPEX__HOST_ALLGATHER) r = capex__comm_allgather_checked(c, in, dev, count, t);
        else if (kind == CAPEX__HOST_ALLREDUCE) r = capex__comm_allreduce_checked(c, dev, dev, count, t, CAPEX_REDUCE_SUM);
        else r = capex__comm_broadcast_checked(c, dev, count, t, root);
    }
    if (r == CAPEX_OK) r = capex__comm_copy(c, recv, dev, es * nout, CAPEX_COPY_D2H);
    if (!kept && r != CAPEX_ERR_TIMEOUT) capex__comm_free(c, dev);
    return r;
}

/* Allgathers this rank's signature (sig[CAPEX__SIG_N]) and checks every
   rank's against rank 0's. local: this rank's verdict on its own arguments
   (its message is kept); a refusing rank still takes part, so its peers fail
   with it instead of waiting in the next collective. Returns local when it
   failed; else CAPEX_ERR_COMM when a peer refused, CAPEX_ERR_SIZE_MISMATCH
   when the models differ, CAPEX_ERR_CONFIG when the descriptors differ (the
   same verdict and message on every rank). Device comms (NCCL) exchange
   through the comm's own device buffer (capex__comm_host_bytes, made at
   init): a rank that failed its own part still takes part (before
   2026-11-28 the buffer was allocated here, and a rank that could not
   left its peers in the allgather until their deadline). */
CAPEX__PRIVATE capex_result capex__create_agree(capex_comm *c, capex__hostbuf *hb, int64_t *sig, capex_result local,
                                                const capex__sig_names *nm) {
    char keep[sizeof capex__error_message], a[48], b[48], also[160];
    const size_t N = CAPEX__SIG_N;
    size_t W, k;
    int64_t *all;
    int p, first = -1, nbad = 0;
    capex_result r;
    if (c->world_size <= 1) return local;
    W = (size_t)c->world_size;
    if (local != CAPEX_OK) {
        memcpy(keep, capex__error_message, sizeof keep);
        for (k = 0; k < N; k++) sig[k] = 0; /* arguments not checked: only the refusal counts */
        sig[CAPEX__SIG_API] = CAPEX__SIG_MAGIC;
        sig[CAPEX__SIG_REFUSED] = 1;
    }
    all = (int64_t *)capex__alloc(NULL, sizeof(int64_t) * N * W);
    if (!all) /* host comms: a barrier stands in, so the peers fail too */
        r = capex__comm_refused(c, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory for the model check (%zu "
                                               "ranks)", nm->api, W));
    else r = capex__comm_host(c, hb, CAPEX__HOST_ALLGATHER, sig, all, N, CAPEX_I64, 0);
    if (r != CAPEX_OK || local != CAPEX_OK) {
        capex__free(NULL, all);
        if (local != CAPEX_OK) return capex__fail(local, "%s", keep);
        return r;
    }
#define CAPEX__SIG(p, k) all[(size_t)(p) * N + (k)]
    /* a rank that skipped create and made another collective paired with this one: its slot is no signature */
    for (p = 0; p < (int)W && first < 0; p++)
        if ((CAPEX__SIG(p, CAPEX__SIG_API) & ~(int64_t)0xff) != CAPEX__SIG_MAGIC) first = p;
    if (first >= 0) {
        r = capex__fail(CAPEX_ERR_CONFIG, "%s: rank %d sent no create signature: it made another collective here (it "
                        "skipped or failed an earlier call, or runs another capex); every rank must make the same calls "
                        "in the same order", nm->api, first);
        goto done;
    }
    for (p = 0; p < (int)W; p++)
        if (CAPEX__SIG(p, CAPEX__SIG_REFUSED)) { if (first < 0) first = p; nbad++; }
    if (first >= 0) {
        r = capex__fail(CAPEX_ERR_COMM, "%s: rank %d refused its arguments (%d of %zu ranks did; their own errors "
                        "say why); no rank created it", nm->api, first, nbad, W);
        goto done;
    }
    for (p = 1; p < (int)W && first < 0; p++)
        if (CAPEX__SIG(p, CAPEX__SIG_API) != CAPEX__SIG(0, CAPEX__SIG_API)) first = p;
    if (first >= 0) {
        r = capex__fail(CAPEX_ERR_CONFIG, "%s: rank %d did not call the same create as rank 0 (every rank must call "
                        "capex_ddp_create, or every rank the ZeRO create, at the same point)", nm->api, first);
        goto done;
    }
    for (p = 1; p < (int)W && first < 0; p++)
        if (CAPEX__SIG(p, CAPEX__SIG_NP) != CAPEX__SIG(0, CAPEX__SIG_NP) ||
            CAPEX__SIG(p, CAPEX__SIG_NUMEL) != CAPEX__SIG(0, CAPEX__SIG_NUMEL)) first = p;
    if (first >= 0) {
        r = capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: ranks hold different models: rank %d has %lld params (%lld "
                        "elements), rank 0 has %lld (%lld); every rank must pass the same parameters", nm->api, first,
                        (long long)CAPEX__SIG(first, CAPEX__SIG_NP), (long long)CAPEX__SIG(first, CAPEX__SIG_NUMEL),
                        (long long)CAPEX__SIG(0, CAPEX__SIG_NP), (long long)CAPEX__SIG(0, CAPEX__SIG_NUMEL));
        goto done;
    }
    for (p = 1; p < (int)W && first < 0; p++)
        for (k = CAPEX__SIG_H_NUMEL; k <= CAPEX__SIG_H_GROUP; k++)
            if (CAPEX__SIG(p, k) != CAPEX__SIG(0, k)) first = p;
    if (first >= 0) {
        int dn = CAPEX__SIG(first, CAPEX__SIG_H_NUMEL) != CAPEX__SIG(0, CAPEX__SIG_H_NUMEL);
        int dt = CAPEX__SIG(first, CAPEX__SIG_H_DTYPE) != CAPEX__SIG(0, CAPEX__SIG_H_DTYPE);
        int dg = CAPEX__SIG(first, CAPEX__SIG_H_GROUP) != CAPEX__SIG(0, CAPEX__SIG_H_GROUP);
        r = capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: ranks hold different models: same param count (%lld) and "
                        "elements, but param %s%s%s%s%s differ from rank 0's (first differing rank %d)", nm->api,
                        (long long)CAPEX__SIG(0, CAPEX__SIG_NP), dn ? "sizes" : "", dn && (dt || dg) ? " and " : "",
                        dt ? "dtypes" : "", dt && dg ? " and " : "", dg ? "groups" : "", first);
        goto done;
    }
    for (p = 1; p < (int)W && first < 0; p++)
        for (k = CAPEX__SIG_DESC; k < N; k++)
            if (CAPEX__SIG(p, k) != CAPEX__SIG(0, k)) first = p;
    if (first >= 0) {
        size_t k0 = N, used = 0;
        also[0] = '\0';
        for (k = CAPEX__SIG_DESC; k < N; k++) {
            const char *name = nm->desc[k - CAPEX__SIG_DESC];
            if (CAPEX__SIG(first, k) == CAPEX__SIG(0, k)) continue;
            if (k0 == N) { k0 = k; continue; }
            if (used < sizeof also - 1)
                used += (size_t)snprintf(also + used, sizeof also - used, "%s%s", used ? ", " : "; also ",
                                         name ? name + (name[0] == '#') : "?");
        }
        {
            const char *name = nm->desc[k0 - CAPEX__SIG_DESC] ? nm->desc[k0 - CAPEX__SIG_DESC] : "?";
            if (name[0] == '#')
                r = capex__fail(CAPEX_ERR_CONFIG, "%s: descriptor fields differ across ranks: rank %d's %s differ from "
                                "rank 0's%s (every rank must pass the same %s)", nm->api, first, name + 1, also,
                                nm->desc_type);
            else {
                capex__sig_value(a, sizeof a, nm, (int)(k0 - CAPEX__SIG_DESC), CAPEX__SIG(first, k0));
                capex__sig_value(b, sizeof b, nm, (int)(k0 - CAPEX__SIG_DESC), CAPEX__SIG(0, k0));
                r = capex__fail(CAPEX_ERR_CONFIG, "%s: descriptor fields differ across ranks: rank %d has %s %s, rank 0 "
                                "has %s%s (every rank must pass the same %s)", nm->api, first, name, a, b, also,
                                nm->desc_type);
            }
        }
        goto done;
    }
    r = CAPEX_OK;
done:
#undef CAPEX__SIG
    capex__free(NULL, all);
    return r;
}

/* One small allreduce that tells every rank whether any rank failed its
   local part of a collective API (allocations, device copies) before the
   traffic that needs every rank: a rank that failed still takes part, so its
   peers fail at once with it instead of waiting out their deadline in the
   next collective (or pairing it with the failed rank's next call). fn also
   tags the call: ranks agreeing in different APIs (one saves, another loads:
   the same small allreduce) all fail with CAPEX_ERR_CONFIG. Returns local
   when it failed (its message kept); else that CONFIG; CAPEX_ERR_COMM naming
   the rank when a peer failed; the exchange's own error. Device comms go
   through the comm's own device buffer (allocated at init, not here, where
   one rank failing alone left its peers waiting until their deadline).
   World size 1: nothing is sent. */
CAPEX__PRIVATE capex_result capex__comm_agree(capex_comm *c, capex__hostbuf *hb, capex_result local, const char *fn) {
    char keep[sizeof capex__error_message];
    int64_t v[4], tag = 0;
    const char *s;
    capex_result r;
    if (c->world_size <= 1) return local;
    if (local != CAPEX_OK) memcpy(keep, capex__error_message, sizeof keep);
    for (s = fn; *s; s++) tag = (tag * 131 + (unsigned char)*s) % 1000003; /* < 2^20: W tag^2 fits in int64 */
    tag++;
    v[0] = local != CAPEX_OK;          /* failing ranks */
    v[1] = local != CAPEX_OK ? c->rank : 0; /* the failing rank when only one did */
    v[2] = tag;                        /* sums of tag and tag^2 equal W times this rank's only when all tags are */
    v[3] = tag * tag;
    r = capex__comm_host(c, hb, CAPEX__HOST_ALLREDUCE, NULL, v, 4, CAPEX_I64, 0);
    if (local != CAPEX_OK) return capex__fail(local, "%s", keep);
    if (r != CAPEX_OK) return r;
    if (v[2] != c->world_size * tag || v[3] != c->world_size * tag * tag)
        return capex__fail(CAPEX_ERR_CONFIG, "%s: not every rank called %s here (another rank is in another collective "
                           "call, e.g. capex_zero_save while this one loads); every rank must make the same calls in the "
                           "same order; no rank went on", fn, fn);
    if (v[0] == 1) return capex__fail(CAPEX_ERR_COMM, "%s: rank %lld failed (its own error says why); no rank went on",
                                      fn, (long long)v[1]);
    if (v[0]) return capex__fail(CAPEX_ERR_COMM, "%s: %lld of %d ranks failed (their own errors say why); no rank went on",
                                 fn, (long long)v[0], c->world_size);
    return CAPEX_OK;
}

/* A create's refusal before its object holds hb: the model check, then hb freed. */
CAPEX__PRIVATE capex_result capex__create_refuse(capex_comm *c, capex__hostbuf *hb, int64_t *sig, capex_result local,
                                                const capex__sig_names *nm) {
    capex_result r = capex__create_agree(c, hb, sig, local, nm);
    capex__hostbuf_free(c, hb);
    return r;
}

#define CAPEX__TAG_DDP_DESC CAPEX__TAG('D', 'D', 'P', 'D')
CAPEX_API void capex_ddp_desc_init(capex_ddp_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_DDP_DESC;
    d->first_bucket_bytes = (size_t)1 << 20;
    d->bucket_bytes = (size_t)25 << 20;
    d->message_size = 0;
    d->delay_allreduce = 0;
    d->gradient_average = 1;
    d->gradient_predivide_factor = 1.0f;
    d->allreduce_always_fp32 = 0;
    d->find_unused_parameters = 0;
    d->rebuild_buckets = 0;
    d->broadcast_parameters = 1;
}

static void capex__ddp_free_bucket_array(capex_ddp *g, capex__bucket *b, size_t nb) {
    size_t i;
    if (!b) return;
    for (i = 0; i < nb; i++) {
        if (capex__req_orphaned(g->comm, &b[i].req)) continue; /* leaked: MPI may still write it */
        capex__comm_free(g->comm, b[i].buf);
        capex__comm_free(g->comm, b[i].buf32);
    }
    capex__free(NULL, b);
}
static void capex__ddp_free_buckets(capex_ddp *g) {
    capex__ddp_free_bucket_array(g, g->b, g->nb);
    g->b = NULL;
    g->nb = 0;
}
/* The buckets a rebuild replaced hold the reduced grads that the step after
   that finalize reads through pointers taken before it: they live until the
   next iteration begins (zero_grad, grad_ready, mark_unused, finalize). */
static void capex__ddp_free_retired(capex_ddp *g) {
    capex__ddp_free_bucket_array(g, g->retired, g->n_retired);
    g->retired = NULL;
    g->n_retired = 0;
}

/* PyTorch's compute_bucket_assignment_by_size over `order` (the expected
   ready order): one open bucket per dtype; a bucket closes once its size
   reaches its limit (first limit, then the later one, per dtype); leftovers
   close at the end; buckets are sorted by the position of their first param.
   Sizes are bytes, or elements with Apex's message_size. On success the new
   layout replaces g->b / bparams / boffsets / bucket_of / offset_of (buffers
   not yet allocated). */
#define CAPEX__DDP_ALIGN_BYTES 16
static capex_result capex__ddp_plan(capex_ddp *g, const size_t *order) {
    size_t np = g->np, i, nb = 0;
    size_t open_id[3], open_size[3], limit_idx[3];
    size_t *first_pos = NULL, *fill = NULL;
    capex__bucket *b = NULL;
    capex_result r = CAPEX_OK;
    for (i = 0; i < 3; i++) { open_id[i] = (size_t)-1; open_size[i] = 0; limit_idx[i] = 0; }
    first_pos = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    fill = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    if (!first_pos || !fill) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "ddp: out of memory planning buckets"); goto done; }
    /* pass 1: bucket id (in opening order) of each param */
    for (i = 0; i < np; i++) {
        size_t p = order[i], t = (size_t)g->params[p].dtype, limit;
        if (open_id[t] == (size_t)-1) { open_id[t] = nb; first_pos[nb] = i; nb++; open_size[t] = 0; }
        g->bucket_of[p] = open_id[t];
        open_size[t] += g->d.message_size ? g->params[p].numel : g->params[p].numel * capex_dtype_size(g->params[p].dtype);
        limit = g->d.message_size ? g->d.message_size : (limit_idx[t] == 0 ? g->d.first_bucket_bytes : g->d.bucket_bytes);
        if (open_size[t] >= limit) { open_id[t] = (size_t)-1; limit_idx[t] = 1; }
    }
    /* opening order == order of first positions, so ids are already sorted */
    b = (capex__bucket *)capex__alloc(NULL, sizeof(capex__bucket) * (nb ? nb : 1));
    if (!b) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "ddp: out of memory planning buckets"); goto done; }
    memset(b, 0, sizeof(capex__bucket) * (nb ? nb : 1));
    for (i = 0; i < np; i++) b[g->bucket_of[order[i]]].count++;
    for (i = 0; i < nb; i++) { b[i].first = i ? b[i - 1].first + b[i - 1].count : 0; fill[i] = 0; }
    for (i = 0; i < np; i++) {
        size_t p = order[i], k = g->bucket_of[p];
        capex__bucket *bk = &b[k];
        /* each view starts 16-byte aligned (4 f32 / 8 half elements), so vector
           loads cover whole tensors; the gap elements are zero and reduce to zero */
        size_t a = CAPEX__DDP_ALIGN_BYTES / capex_dtype_size(g->params[p].dtype), off = (bk->numel + a - 1) / a * a;
        g->bparams[bk->first + fill[k]] = p;
        g->boffsets[bk->first + fill[k]] = off;
        g->offset_of[p] = off;
        bk->numel = off + g->params[p].numel;
        bk->dtype = g->params[p].dtype;
        fill[k]++;
    }
    capex__ddp_free_buckets(g);
    g->b = b;
    g->nb = nb;
    b = NULL;
done:
    capex__free(NULL, b);
    capex__free(NULL, first_pos);
    capex__free(NULL, fill);
    return r;
}

/* MPI reduces half types through an f32 staging buffer it allocates per
   call. A launch that failed that allocation on one rank left its peers in
   the allreduce until their deadline (MPI pairs collectives by order: no
   barrier can stand in), so DDP owns the staging from create (buf32,
   stage32) and a launch allocates nothing. The math stays in the half type
   (predivide before, average after), so the bits are MPI's own. Matched by
   name: test and user wrappers copy the vtable. ZeRO's reduce-scatter
   staging is owned likewise (capex__zero_grad_bytes). */
static int capex__comm_stages_f32(const capex_comm *c) {
    return !c->device_buffers && c->world_size > 1 && c->vt->name && strcmp(c->vt->name, "mpi") == 0;
}

/* The comm's room for what the launches and finalizes of these buckets use
   (capex_comm_vtable.reserve): a request per bucket, the scale of the half
   buckets scaled in their type, the kernels when anything is scaled or
   converted. Reserved requests grow to the largest layout's (a rebuild) and
   are given back at destroy. */
static capex_result capex__ddp_reserve(capex_ddp *g) {
    capex_comm *c = g->comm;
    size_t i, half = 0, more = g->nb > g->reserved ? g->nb - g->reserved : 0;
    float f = g->d.gradient_predivide_factor;
    float post = g->d.gradient_average ? (float)((double)f / (double)c->world_size) : 1.0f; /* capex_ddp_finalize's */
    int scales = f != 1.0f || post != 1.0f;
    capex_result r;
    if (g->d.rebuild_buckets && !g->rebuilt && c->world_size > 1 && c->device_buffers) {
        void *dev; /* the rebuild's broadcast of rank 0's ready order (u32 per param) */
        if (g->np > SIZE_MAX / 4) return capex__fail(CAPEX_ERR_LIMIT, "capex_ddp_create: %zu params", g->np);
        if (c->vt->host_buffer) r = c->vt->host_buffer(c, g->np * 4, &dev);
        else r = capex__hostbuf_make(c, &g->hb, g->np * 4);
        if (r != CAPEX_OK) return r;
    }
    if (!c->vt->reserve) return CAPEX_OK;
    for (i = 0; i < g->nb; i++) {
        const capex__bucket *bk = &g->b[i];
        if (bk->buf32 && !bk->stage32) scales = 1; /* converted to f32 and back */
        else if ((bk->dtype == CAPEX_F16 || bk->dtype == CAPEX_BF16) && bk->numel > half) half = bk->numel;
    }
    if ((r = c->vt->reserve(c, scales, scales ? half : 0, (long)more)) != CAPEX_OK) return r;
    g->reserved += more;
    return CAPEX_OK;
}

static capex_result capex__ddp_alloc_buffers(capex_ddp *g) {
    size_t i;
    capex_result r;
    for (i = 0; i < g->nb; i++) {
        capex__bucket *bk = &g->b[i];
        size_t bytes = bk->numel * capex_dtype_size(bk->dtype);
        if ((r = capex__comm_alloc(g->comm, &bk->buf, bytes)) != CAPEX_OK) return r;
        if ((r = capex__comm_zero(g->comm, bk->buf, bytes)) != CAPEX_OK) return r;
        bk->stage32 = !g->d.allreduce_always_fp32 && (bk->dtype == CAPEX_F16 || bk->dtype == CAPEX_BF16) &&
                      capex__comm_stages_f32(g->comm);
        if ((g->d.allreduce_always_fp32 || bk->stage32) && bk->dtype != CAPEX_F32)
            if ((r = capex__comm_alloc(g->comm, &bk->buf32, bk->numel * sizeof(float))) != CAPEX_OK) return r;
        bk->pending = bk->count;
    }
    return capex__ddp_reserve(g);
}

CAPEX_API void capex_ddp_destroy(capex_ddp *g) {
    size_t i;
    if (!g) return;
    /* buckets launched but not finalized: their collectives write into the
       buffers freed below (and hold backend resources); a failed wait aborts
       the comm, which stops them (NCCL), or their buffers are leaked (MPI) */
    if (g->comm && g->comm->vt && g->comm->vt->wait && !g->comm->failed)
        for (i = 0; i < g->nb && !g->comm->failed; i++)
            if (g->b[i].req.active)
                (void)capex__comm_after(g->comm, g->comm->vt->wait(g->comm, &g->b[i].req, capex__deadline(g->comm)));
    if (g->reserved && g->comm && g->comm->vt && g->comm->vt->reserve) (void)g->comm->vt->reserve(g->comm, 0, 0, -(long)g->reserved);
    if (g->comm) capex__ddp_free_buckets(g), capex__ddp_free_retired(g), capex__hostbuf_free(g->comm, &g->hb);
    capex__free(NULL, g->params);
    capex__free(NULL, g->bucket_of);
    capex__free(NULL, g->offset_of);
    capex__free(NULL, g->bparams);
    capex__free(NULL, g->boffsets);
    capex__free(NULL, g->ready);
    capex__free(NULL, g->accum);
    capex__free(NULL, g->ready_order);
    capex__free(NULL, g);
}

/* This rank's own checks of create's arguments (comm and desc are checked). */
static capex_result capex__ddp_check_args(capex_comm *comm, const capex_ddp_param *params, size_t np,
                                          const capex_ddp_desc *desc) {
    capex_result r;
    size_t i, total, bytes;
    if (np && !params) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: params is NULL");
    if ((r = capex__desc_check(desc->init_tag, CAPEX__TAG_DDP_DESC, "capex_ddp_create", "capex_ddp_desc",
                               "capex_ddp_desc_init")) != CAPEX_OK)
        return r;
    if (!desc->message_size && (!desc->first_bucket_bytes || !desc->bucket_bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: bucket limits must be > 0 (defaults: 1 MiB, 25 MiB)");
    if (!(desc->gradient_predivide_factor > 0.0f) || desc->gradient_predivide_factor > 3.0e38f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: gradient_predivide_factor %g must be finite and > 0",
                           (double)desc->gradient_predivide_factor);
    if (1.0 / (double)desc->gradient_predivide_factor > CAPEX__FLT_MAX) /* the predivide x * (1/f) in f32 */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: gradient_predivide_factor %g: its reciprocal "
                           "overflows float (every grad would become Inf or NaN)", (double)desc->gradient_predivide_factor);
    /* np + 1 entries of the largest bookkeeping struct */
    if (np >= SIZE_MAX / sizeof(capex_ddp_param))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: %zu params: the byte size overflows size_t", np);
    for (i = 0, total = 0; i < np; i++) {
        if (!capex__dtype_ok(params[i].dtype))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: param %lu has invalid dtype %d", (unsigned long)i,
                               (int)params[i].dtype);
        /* Buckets (and their f32 copies) hold sums of numels of up to 4-byte
           elements: bounding the total 4-byte size bounds every bucket size. */
        if (capex__size_add(total, params[i].numel, &total) || capex__size_mul(total, sizeof(float), &bytes))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: params 0..%lu hold more elements than size_t "
                               "bytes can address: the byte size overflows size_t", (unsigned long)i);
        if (params[i].numel && desc->broadcast_parameters && !params[i].data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: param %lu has no data pointer to broadcast",
                               (unsigned long)i);
        /* the dtype its bucket is reduced in: here, not at the first launch mid-backward */
        if ((r = capex__comm_dtype_check(comm, desc->allreduce_always_fp32 ? CAPEX_F32 : params[i].dtype, "capex_ddp_create",
                                         i, "; set allreduce_always_fp32 to reduce half grads in f32")) != CAPEX_OK)
            return r;
    }
    /* plus at most 7 alignment elements per view (np * 8 fits: np < SIZE_MAX / sizeof(capex_ddp_param)) */
    if (capex__size_add(total, np * 8, &total) || capex__size_mul(total, sizeof(float), &bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: %lu params with their alignment hold more elements "
                           "than size_t bytes can address: the byte size overflows size_t", (unsigned long)np);
    return CAPEX_OK;
}

/* The signature every rank must share (see capex__create_agree): the
   bucket layout (limits; message_size replaces both), what the allreduces
   carry and how they are scaled, which collectives run (rebuild's
   broadcast, the parameter broadcast) and find_unused_parameters (without
   it a rank fails before communicating where its peers reduce), and
   delay_allreduce: it moves the bucket launches behind or ahead of other
   collectives made during backward (SyncBatchNorm's, a metric's). */
static void capex__ddp_signature(int64_t *sig, const capex_ddp_param *params, size_t np, const capex_ddp_desc *d) {
    uint64_t hn = 0, ht = 0, total = 0;
    size_t i;
    for (i = 0; i < np; i++) {
        hn = capex__sig_mix(hn, (uint64_t)params[i].numel);
        ht = capex__sig_mix(ht, (uint64_t)params[i].dtype);
        total += (uint64_t)params[i].numel;
    }
    capex__sig_model(sig, CAPEX__SIG_DDP, np, total, hn, ht);
    sig[CAPEX__SIG_DESC + 0] = d->message_size ? 0 : (int64_t)d->first_bucket_bytes;
    sig[CAPEX__SIG_DESC + 1] = d->message_size ? 0 : (int64_t)d->bucket_bytes;
    sig[CAPEX__SIG_DESC + 2] = (int64_t)d->message_size;
    sig[CAPEX__SIG_DESC + 3] = d->gradient_average != 0;
    sig[CAPEX__SIG_DESC + 4] = (int64_t)capex__f32_bits(d->gradient_predivide_factor);
    sig[CAPEX__SIG_DESC + 5] = d->allreduce_always_fp32 != 0;
    sig[CAPEX__SIG_DESC + 6] = d->find_unused_parameters != 0;
    sig[CAPEX__SIG_DESC + 7] = d->rebuild_buckets != 0;
    sig[CAPEX__SIG_DESC + 8] = d->broadcast_parameters != 0;
    sig[CAPEX__SIG_DESC + 9] = d->delay_allreduce != 0;
}
static const capex__sig_names capex__ddp_sig_names = {
    "capex_ddp_create", "capex_ddp_desc",
    {"first_bucket_bytes", "bucket_bytes", "message_size", "gradient_average", "gradient_predivide_factor",
     "allreduce_always_fp32", "find_unused_parameters", "rebuild_buckets", "broadcast_parameters", "delay_allreduce"},
    1u << 4};

CAPEX_API capex_result capex_ddp_create(capex_ddp **out, capex_comm *comm, const capex_ddp_param *params, size_t np,
                                        const capex_ddp_desc *desc) {
    capex_ddp *g;
    capex_ddp_desc dd;
    capex_result r;
    size_t i, *order;
    int64_t sig[CAPEX__SIG_N];
    capex__hostbuf hb = {NULL, 0};
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: out is NULL");
    *out = NULL;
    if ((r = capex__comm_check(comm, "capex_ddp_create")) != CAPEX_OK) return r;
    if (!desc) { capex_ddp_desc_init(&dd); desc = &dd; }
    /* a device comm without host_buffer: the exchanges' buffer, first, so
       every agreement below has it (a rank failing this one allocation
       cannot join the model check: its peers fail at their deadline) */
    if ((r = capex__hostbuf_make(comm, &hb, capex__comm_host_bytes(comm->world_size))) != CAPEX_OK) return r;
    /* a rank refusing its arguments still joins the model check, so its peers fail with it */
    if ((r = capex__ddp_check_args(comm, params, np, desc)) != CAPEX_OK)
        return capex__create_refuse(comm, &hb, sig, r, &capex__ddp_sig_names);
    capex__ddp_signature(sig, params, np, desc);
    g = (capex_ddp *)capex__alloc(NULL, sizeof *g);
    if (!g)
        return capex__create_refuse(comm, &hb, sig, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_ddp_create: out of memory"),
                                    &capex__ddp_sig_names);
    memset(g, 0, sizeof *g);
    g->comm = comm;
    g->d = *desc;
    g->np = np;
    g->sync = 1;
    g->params = (capex_ddp_param *)capex__alloc(NULL, sizeof(capex_ddp_param) * (np + 1));
    g->bucket_of = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    g->offset_of = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    g->bparams = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    g->boffsets = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    g->ready = (unsigned char *)capex__alloc(NULL, np + 1);
    g->accum = (unsigned char *)capex__alloc(NULL, np + 1);
    g->ready_order = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    if (!g->params || !g->bucket_of || !g->offset_of || !g->bparams || !g->boffsets || !g->ready || !g->accum ||
        !g->ready_order) {
        capex_ddp_destroy(g);
        return capex__create_refuse(comm, &hb, sig, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_ddp_create: out of memory"),
                                    &capex__ddp_sig_names);
    }
    g->hb = hb; /* destroy frees it from here on */
    if (np) memcpy(g->params, params, sizeof(capex_ddp_param) * np);
    memset(g->ready, 0, np + 1);
    memset(g->accum, 0, np + 1);
    /* backward produces grads roughly in reverse registration order */
    order = g->ready_order;
    for (i = 0; i < np; i++) order[i] = np - 1 - i;
    if ((r = capex__ddp_plan(g, order)) == CAPEX_OK) r = capex__ddp_alloc_buffers(g);
    /* every rank's signature before the first collective (the broadcast): a
       rank that failed above, or a mismatch, fails every rank here */
    if ((r = capex__create_agree(comm, &g->hb, sig, r, &capex__ddp_sig_names)) != CAPEX_OK) {
        capex_ddp_destroy(g);
        return r;
    }
    if (desc->broadcast_parameters && (r = capex_ddp_broadcast_parameters(g)) != CAPEX_OK) {
        capex_ddp_destroy(g);
        return r;
    }
    *out = g;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_ddp_broadcast_parameters(capex_ddp *g) {
    size_t i;
    capex_result r;
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_broadcast_parameters: ddp is NULL");
    if (g->failed) /* buckets may be in flight on a comm other ranks still use */
        return capex__fail(CAPEX_ERR_COMM, "capex_ddp_broadcast_parameters: this ddp failed earlier; stop the job");
    if (g->comm->world_size == 1) return CAPEX_OK;
    for (i = 0; i < g->np; i++) {
        if (!g->params[i].numel) continue;
        if (!g->params[i].data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_broadcast_parameters: param %lu has no data pointer",
                               (unsigned long)i);
        if ((r = capex_comm_broadcast(g->comm, g->params[i].data, g->params[i].numel, g->params[i].dtype, 0)) != CAPEX_OK) {
            g->failed = 1;
            return r;
        }
    }
    return CAPEX_OK;
}

CAPEX_API void *capex_ddp_grad(capex_ddp *g, size_t p) {
    if (!g || p >= g->np) return NULL;
    if (g->params[p].grad) return g->params[p].grad;
    return (char *)g->b[g->bucket_of[p]].buf + g->offset_of[p] * capex_dtype_size(g->params[p].dtype);
}
CAPEX_API int capex_ddp_layout_version(const capex_ddp *g) { return g ? g->layout_version : -1; }
CAPEX_API size_t capex_ddp_num_buckets(const capex_ddp *g) { return g ? g->nb : 0; }

CAPEX_API capex_result capex_ddp_bucket(const capex_ddp *g, size_t k, capex_ddp_bucket_info *out) {
    if (!g || !out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_bucket: NULL argument");
    if (k >= g->nb) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_bucket: bucket %lu of %lu", (unsigned long)k, (unsigned long)g->nb);
    out->dtype = g->b[k].dtype;
    out->numel = g->b[k].numel;
    out->num_params = g->b[k].count;
    out->params = g->bparams + g->b[k].first;
    out->offsets = g->boffsets + g->b[k].first;
    return CAPEX_OK;
}

CAPEX_API void capex_ddp_get_stats(const capex_ddp *g, capex_ddp_stats *out) {
    if (!out) return;
    if (!g) { memset(out, 0, sizeof *out); return; }
    *out = g->st;
}

CAPEX_API capex_result capex_ddp_zero_grad(capex_ddp *g) {
    size_t i;
    capex_result r;
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_zero_grad: ddp is NULL");
    if (g->failed) /* its buckets may still be in flight: leave them; say why, not "call finalize" */
        return capex__fail(CAPEX_ERR_COMM, "capex_ddp_zero_grad: this ddp failed earlier; stop the job");
    for (i = 0; i < g->np; i++) /* mid-backward the buckets are being reduced (MPI: in place, in flight) */
        if (g->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "capex_ddp_zero_grad: parameter %zu is ready in this iteration; zero "
                               "the gradients between iterations (after capex_ddp_finalize)", i);
    capex__ddp_free_retired(g);
    for (i = 0; i < g->nb; i++)
        if ((r = capex__comm_zero(g->comm, g->b[i].buf, g->b[i].numel * capex_dtype_size(g->b[i].dtype))) != CAPEX_OK) return r;
    for (i = 0; i < g->np; i++)
        if (g->params[i].grad)
            if ((r = capex__comm_zero(g->comm, g->params[i].grad, g->params[i].numel * capex_dtype_size(g->params[i].dtype))) != CAPEX_OK)
                return r;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_ddp_set_sync(capex_ddp *g, int sync) {
    size_t i;
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_set_sync: ddp is NULL");
    if (g->failed) return capex__fail(CAPEX_ERR_COMM, "capex_ddp_set_sync: this ddp failed earlier; stop the job");
    for (i = 0; i < g->np; i++)
        if (g->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "capex_ddp_set_sync: change sync mode between iterations (after "
                                                "capex_ddp_finalize), not in the middle of a backward pass");
    g->sync = sync ? 1 : 0;
    return CAPEX_OK;
}

/* Starts bucket k's allreduce: optional f32 staging (allreduce_always_fp32),
   Apex's predivide x *= 1/f, then SUM; the post-scale f/world comes after
   the wait (Apex DDP allreduce_bucket). With stage32 the predivide is in the
   half type, then the f32 copy goes out (what MPI's staging did). */
static capex_result capex__ddp_launch(capex_ddp *g, size_t k) {
    capex__bucket *bk = &g->b[k];
    capex_comm *c = g->comm;
    void *buf = bk->buf;
    capex_dtype t = bk->dtype;
    capex_result r;
    float pre = g->d.gradient_predivide_factor;
    bk->launched = 1;
    g->st.launches++;
    if (!g->in_finalize) g->st.launched_in_backward++;
    if (bk->buf32 && !bk->stage32) {
        if ((r = capex__comm_convert(c, bk->buf32, CAPEX_F32, bk->buf, bk->dtype, bk->numel)) != CAPEX_OK) return r;
        buf = bk->buf32;
        t = CAPEX_F32;
    }
    if (pre != 1.0f)
        if ((r = capex__comm_scale(c, buf, bk->numel, t, (float)(1.0 / (double)pre))) != CAPEX_OK) return r;
    if (bk->stage32) {
        if ((r = capex__comm_convert(c, bk->buf32, CAPEX_F32, bk->buf, bk->dtype, bk->numel)) != CAPEX_OK) return r;
        buf = bk->buf32;
        t = CAPEX_F32;
    }
    if (!bk->numel) { bk->sync_done = 1; return CAPEX_OK; }
    if (c->vt->iallreduce && c->vt->wait) {
        r = c->vt->iallreduce(c, buf, buf, bk->numel, t, CAPEX_REDUCE_SUM, &bk->req);
        if (r != CAPEX_ERR_UNSUPPORTED) return capex__comm_after(c, r);
    }
    /* no async entry (or too large for it): reduce now, synchronously */
    r = c->vt->allreduce(c, buf, buf, bk->numel, t, CAPEX_REDUCE_SUM, capex__deadline(c));
    bk->sync_done = 1;
    return capex__comm_after(c, r);
}

static capex_result capex__ddp_launch_ready(capex_ddp *g) {
    capex_result r;
    while (g->next_launch < g->nb && g->b[g->next_launch].pending == 0) {
        size_t k = g->next_launch++;
        if ((r = capex__ddp_launch(g, k)) != CAPEX_OK) { g->failed = 1; return r; }
    }
    return CAPEX_OK;
}

static capex_result capex__ddp_check_param(capex_ddp *g, size_t p, const char *what) {
    capex_result r;
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: ddp is NULL", what);
    if (g->failed)
        return capex__fail(CAPEX_ERR_COMM, "%s: this ddp failed in an earlier collective; stop and restart from a checkpoint", what);
    /* a communicator that failed in any call (a barrier, a metrics allreduce)
       has collectives in an unknown state: nothing more may go through it */
    if ((r = capex__comm_check(g->comm, what)) != CAPEX_OK) { g->failed = 1; return r; }
    if (p >= g->np)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown parameter %lu (there are %lu)", what, (unsigned long)p,
                           (unsigned long)g->np);
    if (g->ready[p])
        return capex__fail(CAPEX_ERR_ORDER, "%s: parameter %lu is already ready in this iteration (grad_ready twice? "
                                            "call capex_ddp_finalize once per backward)", what, (unsigned long)p);
    capex__ddp_free_retired(g);
    return CAPEX_OK;
}

/* Lets in-flight bucket reductions progress (MPI moves data only inside MPI
   calls): tests the oldest unfinished ones, in order, without blocking. */
static capex_result capex__ddp_progress(capex_ddp *g) {
    capex_comm *c = g->comm;
    size_t k;
    if (!c->vt->test) return CAPEX_OK;
    for (k = 0; k < g->next_launch; k++) {
        capex__bucket *bk = &g->b[k];
        int done = 1;
        capex_result r;
        if (bk->sync_done || bk->test_done || !bk->req.active) continue;
        r = c->vt->test(c, &bk->req, &done);
        if (r != CAPEX_OK) { g->failed = 1; return capex__comm_after(c, r); }
        g->st.progress_polls++;
        if (!done) break;
        bk->test_done = 1;
    }
    return CAPEX_OK;
}

/* Marks p ready; `zero` fills its bucket slot with zeros (an unused param). */
static capex_result capex__ddp_ready(capex_ddp *g, size_t p, int zero) {
    capex_comm *c = g->comm;
    size_t es = capex_dtype_size(g->params[p].dtype);
    void *slot = (char *)g->b[g->bucket_of[p]].buf + g->offset_of[p] * es;
    capex_result r = CAPEX_OK;
    g->ready[p] = 1;
    if (g->sync && g->d.rebuild_buckets && !g->rebuilt && g->n_ready_order < g->np) g->ready_order[g->n_ready_order++] = p;
    if (!g->sync) { if (!zero) g->accum[p] = 1; return CAPEX_OK; }
    if (zero && g->accum[p]) zero = 0; /* grads accumulated under no_sync still count */
    if (zero) r = capex__comm_zero(c, slot, g->params[p].numel * es);
    else if (g->params[p].grad) r = capex__comm_copy(c, slot, g->params[p].grad, g->params[p].numel * es, CAPEX_COPY_D2D);
    if (r != CAPEX_OK) { g->failed = 1; return r; }
    g->b[g->bucket_of[p]].pending--;
    if (g->d.delay_allreduce) return CAPEX_OK;
    if ((r = capex__ddp_launch_ready(g)) != CAPEX_OK) return r;
    return capex__ddp_progress(g);
}

CAPEX_API capex_result capex_ddp_grad_ready(capex_ddp *g, size_t p) {
    capex_result r = capex__ddp_check_param(g, p, "capex_ddp_grad_ready");
    return r ? r : capex__ddp_ready(g, p, 0);
}

CAPEX_API capex_result capex_ddp_mark_unused(capex_ddp *g, size_t p) {
    capex_result r = capex__ddp_check_param(g, p, "capex_ddp_mark_unused");
    return r ? r : capex__ddp_ready(g, p, 1);
}

static void capex__ddp_reset_iteration(capex_ddp *g) {
    size_t i;
    memset(g->ready, 0, g->np + 1);
    for (i = 0; i < g->nb; i++) {
        g->b[i].pending = g->b[i].count;
        g->b[i].launched = g->b[i].waited = g->b[i].sync_done = g->b[i].test_done = 0;
    }
    g->next_launch = 0;
}

/* Rebuild once from rank 0's observed ready order (PyTorch rebuild_buckets),
   broadcast as u32 bits, moving the already reduced grads to the new slots.
   A rank failing its own part (memory, a device copy) still agrees before
   and after the broadcast (capex__comm_agree): its peers fail this finalize
   with it instead of waiting in the broadcast or the next bucket. */
static capex_result capex__ddp_rebuild(capex_ddp *g) {
    capex_comm *c = g->comm;
    size_t np = g->np, i, nb_old = g->nb;
    uint32_t *ord32 = NULL;
    size_t *order = NULL, *old_bucket = NULL, *old_offset = NULL;
    capex__bucket *old_b = g->b;
    capex_result r = CAPEX_OK;
    unsigned char *seen = NULL;
    g->rebuilt = 1;
    if (np == 0 || np > 0xffffffffu) return CAPEX_OK;
    ord32 = (uint32_t *)capex__alloc(NULL, np * 4);
    order = (size_t *)capex__alloc(NULL, np * sizeof(size_t));
    old_bucket = (size_t *)capex__alloc(NULL, np * sizeof(size_t));
    old_offset = (size_t *)capex__alloc(NULL, np * sizeof(size_t));
    seen = (unsigned char *)capex__alloc(NULL, np);
    if (!ord32 || !order || !old_bucket || !old_offset || !seen) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "ddp rebuild: out of memory");
    if ((r = capex__comm_agree(c, &g->hb, r, "capex_ddp_finalize (bucket rebuild)")) != CAPEX_OK) goto done;
    for (i = 0; i < np; i++) ord32[i] = (uint32_t)g->ready_order[i];
    if (c->world_size > 1 && (r = capex__comm_host(c, &g->hb, CAPEX__HOST_BROADCAST, NULL, ord32, np, CAPEX_F32, 0)) != CAPEX_OK)
        goto done;
    memset(seen, 0, np);
    for (i = 0; i < np; i++) {
        if (ord32[i] >= np || seen[ord32[i]]) { r = capex__fail(CAPEX_ERR_COMM, "ddp rebuild: rank 0's ready order is corrupt"); goto done; }
        seen[ord32[i]] = 1;
        order[i] = ord32[i];
    }
    memcpy(old_bucket, g->bucket_of, np * sizeof(size_t));
    memcpy(old_offset, g->offset_of, np * sizeof(size_t));
    g->b = NULL; /* keep the old buffers until the grads moved */
    g->nb = 0;
    if ((r = capex__ddp_plan(g, order)) != CAPEX_OK || (r = capex__ddp_alloc_buffers(g)) != CAPEX_OK) {
        capex__ddp_free_buckets(g);
        g->b = old_b; g->nb = nb_old;
        memcpy(g->bucket_of, old_bucket, np * sizeof(size_t));
        memcpy(g->offset_of, old_offset, np * sizeof(size_t));
        old_b = NULL;
        r = capex__comm_agree(c, &g->hb, r, "capex_ddp_finalize (bucket rebuild)"); /* keeps r */
        goto done;
    }
    for (i = 0; i < np; i++) {
        size_t es = capex_dtype_size(g->params[i].dtype);
        r = capex__comm_copy(c, (char *)g->b[g->bucket_of[i]].buf + g->offset_of[i] * es,
                             (char *)old_b[old_bucket[i]].buf + old_offset[i] * es, g->params[i].numel * es, CAPEX_COPY_D2D);
        if (r != CAPEX_OK) break;
    }
    r = capex__comm_agree(c, &g->hb, r, "capex_ddp_finalize (bucket rebuild)");
    g->layout_version++;
    capex__ddp_free_retired(g);
    g->retired = old_b; /* the step after this finalize may still read them */
    g->n_retired = nb_old;
    old_b = NULL;
done:
    capex__free(NULL, ord32);
    capex__free(NULL, order);
    capex__free(NULL, old_bucket);
    capex__free(NULL, old_offset);
    capex__free(NULL, seen);
    return r;
}

CAPEX_API capex_result capex_ddp_finalize(capex_ddp *g) {
    capex_comm *c;
    size_t i, missing = 0, first_missing = 0;
    capex_result r = CAPEX_OK;
    double deadline;
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_finalize: ddp is NULL");
    if (g->failed)
        return capex__fail(CAPEX_ERR_COMM, "capex_ddp_finalize: this ddp failed earlier; do not step, stop the job");
    c = g->comm;
    if ((r = capex__comm_check(c, "capex_ddp_finalize")) != CAPEX_OK) { g->failed = 1; return r; }
    capex__ddp_free_retired(g);
    if (!g->sync) { /* no_sync: grads stay local and keep accumulating (accum: set by grad_ready only) */
        capex__ddp_reset_iteration(g);
        return CAPEX_OK;
    }
    for (i = 0; i < g->np; i++)
        if (!g->ready[i]) { if (!missing) first_missing = i; missing++; }
    if (missing && !g->d.find_unused_parameters)
        return capex__fail(CAPEX_ERR_ORDER, "capex_ddp_finalize: %lu parameter(s) never reported ready (first: %lu); "
                                            "call capex_ddp_grad_ready or capex_ddp_mark_unused for them, or set "
                                            "find_unused_parameters (nothing was stepped; fix and call finalize again)",
                           (unsigned long)missing, (unsigned long)first_missing);
    g->in_finalize = 1;
    /* unused params: zero grads, in reverse order (their place in backward) */
    for (i = g->np; missing && i-- > 0;)
        if (!g->ready[i] && (r = capex__ddp_ready(g, i, 1)) != CAPEX_OK) break;
    if (r == CAPEX_OK) r = capex__ddp_launch_ready(g);
    deadline = capex__deadline(c);
    for (i = 0; r == CAPEX_OK && i < g->nb; i++) {
        capex__bucket *bk = &g->b[i];
        int in32 = bk->buf32 && !bk->stage32; /* the post-scale in f32 (allreduce_always_fp32) */
        void *buf = in32 ? bk->buf32 : bk->buf;
        capex_dtype t = in32 ? CAPEX_F32 : bk->dtype;
        float post = g->d.gradient_average ? (float)((double)g->d.gradient_predivide_factor / (double)c->world_size) : 1.0f;
        if (!bk->launched) { r = capex__fail(CAPEX_ERR_INTERNAL, "ddp: bucket %lu not launched at finalize", (unsigned long)i); break; }
        if (!bk->sync_done) {
            r = capex__comm_after(c, c->vt->wait(c, &bk->req, deadline));
            if (r != CAPEX_OK) break;
        }
        if (c->vt->poll_error && (r = capex__comm_after(c, c->vt->poll_error(c))) != CAPEX_OK) break;
        bk->waited = 1;
        if (bk->stage32 && (r = capex__comm_convert(c, bk->buf, bk->dtype, bk->buf32, CAPEX_F32, bk->numel)) != CAPEX_OK) break;
        if ((r = capex__comm_scale(c, buf, bk->numel, t, post)) != CAPEX_OK) break;
        if (in32 && (r = capex__comm_convert(c, bk->buf, bk->dtype, bk->buf32, CAPEX_F32, bk->numel)) != CAPEX_OK) break;
    }
    for (i = 0; r == CAPEX_OK && i < g->np; i++) {
        size_t es = capex_dtype_size(g->params[i].dtype);
        if (g->params[i].grad)
            r = capex__comm_copy(c, g->params[i].grad, (char *)g->b[g->bucket_of[i]].buf + g->offset_of[i] * es,
                                 g->params[i].numel * es, CAPEX_COPY_D2D);
    }
    g->in_finalize = 0;
    if (r != CAPEX_OK) { g->failed = 1; return r; }
    if (g->d.rebuild_buckets && !g->rebuilt && g->n_ready_order == g->np) {
        if ((r = capex__ddp_rebuild(g)) != CAPEX_OK) { g->failed = 1; return r; }
    }
    memset(g->accum, 0, g->np + 1);
    capex__ddp_reset_iteration(g);
    g->st.iterations++;
    return CAPEX_OK;
}

/* ---- data parallel: ZeRO (sharded optimizer state) ----------------------- */

typedef struct capex__zbucket {
    capex_dtype dtype;
    size_t numel;          /* views and their alignment gaps                    */
    size_t shard;          /* S: elements per rank (16-byte multiple)           */
    size_t first, count;   /* slice of z->bparams                               */
    size_t pending;        /* params not yet ready this iteration               */
    void *grad;            /* stage 1: S*W elements, always; stage 2: lent      */
    void *gshard;          /* stage 2: the reduced shard (S elements)           */
    void *param;           /* S*W elements: the flat parameters                 */
    float *master;         /* S floats (half buckets)                           */
    int launched;
    int reducing;          /* reduce-scatter in flight (req)                    */
    int test_done;         /* test said that reduce-scatter finished: not polled again */
    int gathering;         /* step's all-gather started, params not copied out */
    int staged;            /* the reduce-scatter in flight went through z's f32 staging */
    capex_comm_req req;
} capex__zbucket;

/* Device mode (capex_cuda.h's capex_cuda_zero): capex_zero plans, buckets,
   reduce-scatters, all-gathers and checkpoints as on the host; the optimizer
   over this rank's pieces is the device's, behind these hooks (z->opt stays
   NULL but during save/load, where it is a host copy from to_host). */
typedef struct capex__zero_dev {
    void *user;
    capex_result (*add_group)(void *user, const capex_optim_hparams *hp, const capex_optim_param *pp, size_t n);
    capex_result (*step)(void *user);                                           /* enqueues the shard step */
    capex_result (*add)(void *user, void *y, const void *x, size_t n, capex_dtype t); /* y += x (stage 2) */
    capex_result (*to_host)(void *user, unsigned flags, capex_optim **host);    /* host copy of the pieces' state */
    capex_result (*from_host)(void *user, const capex_optim *host);             /* moments, steps, hparams back */
    capex_result (*check_host)(void *user, const capex_optim *host);            /* optional: from_host's checks alone */
    capex_result (*finish)(void *user, capex_zero *z); /* optional: the device zero's own setup, before create's last agreement */
} capex__zero_dev;

struct capex_zero {
    capex_comm *comm;
    int has_dev;           /* device mode: dev's optimizer, masters in comm memory */
    capex__zero_dev dev;
    unsigned char *save_host; /* device mode, rank 0: host copies of the params of the last save */
    capex_zero_desc d;
    size_t np, nb, ngroups;
    capex_zero_param *params;
    size_t *bucket_of, *offset_of, *bparams;
    unsigned char *ready;
    capex__zbucket *b;
    void **pool;           /* stage 2: free full-size buffers                   */
    size_t npool, pool_allocated, pool_bytes;
    size_t next_launch;
    int sync, failed, accumulated; /* accumulated: stage 2 shards hold a sum     */
    int stages;            /* capex__comm_stages_f32: grad buffers carry the f32 staging */
    size_t reserved;       /* requests reserved on the comm (vt->reserve) */
    capex__hostbuf hb;     /* the exchanges' device buffer without vt->host_buffer */
    capex_optim *opt;
    size_t npieces, *piece_param, *piece_start; /* the optimizer's tensors, in its order */
    size_t *piece_k;        /* piece j's index within its group of opt                  */
    size_t *full_pos;       /* per param: index in its group, tensor index (unsharded)  */
    unsigned char *mom_bufs; /* SGD, per group: created with momentum, so it has momentum buffers
                                (kept when set_hparams turns momentum off: checkpoints carry them) */
    capex_optim *save_tmp;  /* rank 0: the unsharded state of the last save */
    int save_synced;        /* the last save's collectives ran on every rank */
    float *save_masters;
    double *lamb_sums;      /* LAMB: |p|^2, |u|^2 per param, summed across ranks */
    size_t *counts;         /* world_size entries: the equal shard counts of a collective */
    capex_zero_memory mem;
};

#define CAPEX__TAG_ZERO_DESC CAPEX__TAG('Z', 'R', 'O', 'D')
CAPEX_API void capex_zero_desc_init(capex_zero_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_ZERO_DESC;
    d->stage = 1;
    d->bucket_bytes = (size_t)25 << 20;
    d->gradient_average = 1;
    d->broadcast_parameters = 1;
}

CAPEX_API void capex_zero_destroy(capex_zero *z) {
    size_t i;
    if (!z) return;
    /* requests in flight write into buffers freed below; a failed wait aborts
       the comm (as capex_ddp_destroy), which stops them: a live NCCL comm's
       destroy and cuMemFree would wait for kernels a dead peer never ends */
    if (z->b && z->comm->vt && z->comm->vt->wait && !z->comm->failed)
        for (i = 0; i < z->nb && !z->comm->failed; i++)
            if (z->b[i].req.active)
                (void)capex__comm_after(z->comm, z->comm->vt->wait(z->comm, &z->b[i].req, capex__deadline(z->comm)));
    if (z->reserved && z->comm->vt && z->comm->vt->reserve) (void)z->comm->vt->reserve(z->comm, 0, 0, -(long)z->reserved);
    capex__hostbuf_free(z->comm, &z->hb);
    capex_optim_destroy(z->opt);
    capex_optim_destroy(z->save_tmp);
    capex__free(NULL, z->save_masters);
    capex__free(NULL, z->save_host);
    capex__free(NULL, z->lamb_sums);
    capex__free(NULL, z->counts);
    capex__free(NULL, z->piece_param);
    capex__free(NULL, z->piece_start);
    capex__free(NULL, z->piece_k);
    capex__free(NULL, z->full_pos);
    capex__free(NULL, z->mom_bufs);
    for (i = 0; z->b && i < z->nb; i++) {
        if (capex__req_orphaned(z->comm, &z->b[i].req)) continue; /* leaked: MPI may still use them */
        capex__comm_free(z->comm, z->b[i].grad); /* stage 1's own buffer, or stage 2's lent one */
        capex__comm_free(z->comm, z->b[i].gshard);
        capex__comm_free(z->comm, z->b[i].param);
        if (z->has_dev) capex__comm_free(z->comm, z->b[i].master);
        else capex__free(NULL, z->b[i].master);
    }
    for (i = 0; i < z->npool; i++) capex__comm_free(z->comm, z->pool[i]);
    capex__free(NULL, z->pool);
    capex__free(NULL, z->b);
    capex__free(NULL, z->params);
    capex__free(NULL, z->bucket_of);
    capex__free(NULL, z->offset_of);
    capex__free(NULL, z->bparams);
    capex__free(NULL, z->ready);
    capex__free(NULL, z);
}

/* MPI reduce-scatters through f32 buffers it allocated per launch (the
   output; half types also an f32 copy of the input): a launch failing that
   on one rank left its peers in the collective until their deadline. With
   z->stages each bucket's grad buffer (stage 2: each lent one) carries them
   after its S*W elements, from create, so a launch allocates nothing:
   [grad][half: S*W f32 input][S f32 output]. */
static size_t capex__zero_stage_off(const capex__zbucket *bk, size_t W) {
    return (bk->shard * W * capex_dtype_size(bk->dtype) + 15) / 16 * 16;
}
static size_t capex__zero_grad_bytes(const capex_zero *z, const capex__zbucket *bk) {
    size_t W = (size_t)z->comm->world_size, full = bk->shard * W;
    if (!z->stages) return full * capex_dtype_size(bk->dtype);
    return capex__zero_stage_off(bk, W) + ((bk->dtype != CAPEX_F32 ? full : 0) + bk->shard) * sizeof(float);
}

/* DDP's bucket assignment (one open bucket per dtype, reverse registration
   order, closed at bucket_bytes), then each bucket padded to W shards of a
   16-byte multiple. */
static capex_result capex__zero_plan(capex_zero *z) {
    size_t np = z->np, i, nb = 0, W = (size_t)z->comm->world_size;
    size_t open_id[3], open_size[3], *fill = NULL;
    for (i = 0; i < 3; i++) { open_id[i] = (size_t)-1; open_size[i] = 0; }
    for (i = np; i-- > 0;) {
        size_t t = (size_t)z->params[i].dtype;
        if (open_id[t] == (size_t)-1) { open_id[t] = nb++; open_size[t] = 0; }
        z->bucket_of[i] = open_id[t];
        open_size[t] += z->params[i].numel * capex_dtype_size(z->params[i].dtype);
        if (open_size[t] >= z->d.bucket_bytes) open_id[t] = (size_t)-1;
    }
    z->b = (capex__zbucket *)capex__alloc(NULL, sizeof(capex__zbucket) * (nb ? nb : 1));
    fill = (size_t *)capex__alloc(NULL, sizeof(size_t) * (nb ? nb : 1));
    z->pool = (void **)capex__alloc(NULL, sizeof(void *) * (nb ? nb : 1));
    if (!z->b || !fill || !z->pool) { capex__free(NULL, fill); return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_zero_create: out of memory"); }
    memset(z->b, 0, sizeof(capex__zbucket) * (nb ? nb : 1));
    z->nb = nb;
    for (i = 0; i < np; i++) z->b[z->bucket_of[i]].count++;
    for (i = 0; i < nb; i++) { z->b[i].first = i ? z->b[i - 1].first + z->b[i - 1].count : 0; fill[i] = 0; }
    for (i = np; i-- > 0;) {
        size_t k = z->bucket_of[i], a = CAPEX__DDP_ALIGN_BYTES / capex_dtype_size(z->params[i].dtype);
        capex__zbucket *bk = &z->b[k];
        size_t off = (bk->numel + a - 1) / a * a;
        z->bparams[bk->first + fill[k]++] = i;
        z->offset_of[i] = off;
        bk->numel = off + z->params[i].numel;
        bk->dtype = z->params[i].dtype;
    }
    for (i = 0; i < nb; i++) {
        size_t a = CAPEX__DDP_ALIGN_BYTES / capex_dtype_size(z->b[i].dtype);
        z->b[i].shard = ((z->b[i].numel + W - 1) / W + a - 1) / a * a;
        z->b[i].pending = z->b[i].count;
    }
    capex__free(NULL, fill);
    return CAPEX_OK;
}

/* Param i's index within its group in the full (unsharded) optimizer. */
CAPEX__PRIVATE size_t capex__zero_full_index(const capex_zero *z, size_t i) { return z->full_pos[2 * i]; }

/* Sharded LAMB's sums across ranks (capex_optim's reduce_fn). */
static capex_result capex__zero_reduce(void *user, int what, double *vals, size_t n) {
    capex_zero *z = (capex_zero *)user;
    size_t k;
    capex_result r;
    if (z->comm->world_size == 1) return CAPEX_OK;
    if (what == 0) r = capex_comm_allreduce(z->comm, vals, vals, n, CAPEX_F64, CAPEX_REDUCE_SUM);
    else { /* per piece -> per param (zeros where this rank has no piece), summed, and back */
        for (k = 0; k < 2 * z->np; k++) z->lamb_sums[k] = 0.0;
        for (k = 0; k < n / 2; k++) {
            z->lamb_sums[2 * z->piece_param[k]] = vals[2 * k];
            z->lamb_sums[2 * z->piece_param[k] + 1] = vals[2 * k + 1];
        }
        r = capex_comm_allreduce(z->comm, z->lamb_sums, z->lamb_sums, 2 * z->np, CAPEX_F64, CAPEX_REDUCE_SUM);
        for (k = 0; r == CAPEX_OK && k < n / 2; k++) {
            vals[2 * k] = z->lamb_sums[2 * z->piece_param[k]];
            vals[2 * k + 1] = z->lamb_sums[2 * z->piece_param[k] + 1];
        }
    }
    if (r != CAPEX_OK) z->failed = 1;
    return r;
}

/* The pieces of this rank's shards, per group, as optimizer tensors. */
static capex_result capex__zero_build_optim(capex_zero *z, const capex_optim_desc *od, const capex_optim_hparams *hp) {
    size_t g, k, j, r = (size_t)z->comm->rank, n;
    capex_optim_param *pp = (capex_optim_param *)capex__alloc(NULL, sizeof(capex_optim_param) * (z->np + 1));
    capex_result res = CAPEX_OK;
    if (!pp) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_zero_create: out of memory");
    if (!z->has_dev && (res = capex_optim_create(od, &z->opt)) != CAPEX_OK) { capex__free(NULL, pp); return res; }
    for (g = 0; res == CAPEX_OK && g < z->ngroups; g++) {
        for (k = 0, n = 0; k < z->nb; k++) {
            capex__zbucket *bk = &z->b[k];
            size_t es = capex_dtype_size(bk->dtype), lo = r * bk->shard, hi = lo + bk->shard;
            char *gsh = z->d.stage == 1 ? (char *)bk->grad + lo * es : (char *)bk->gshard;
            for (j = 0; j < bk->count; j++) {
                size_t i = z->bparams[bk->first + j], a = z->offset_of[i], e = a + z->params[i].numel;
                if (z->params[i].group != g) continue;
                if (a < lo) a = lo;
                if (e > hi) e = hi;
                if (a >= e) continue;
                z->piece_param[z->npieces] = i;
                z->piece_k[z->npieces] = n;
                z->piece_start[z->npieces++] = a - z->offset_of[i];
                capex_optim_param_init(&pp[n]);
                pp[n].numel = (int64_t)(e - a);
                pp[n].grad = gsh + (a - lo) * es;
                pp[n].grad_dtype = bk->dtype;
                if (bk->dtype == CAPEX_F32) pp[n].param = (float *)bk->param + a;
                else {
                    pp[n].param = bk->master + (a - lo);
                    pp[n].model = (char *)bk->param + a * es;
                    pp[n].model_dtype = bk->dtype;
                }
                n++;
            }
        }
        if (z->has_dev) res = z->dev.add_group(z->dev.user, hp ? &hp[g] : NULL, pp, n);
        else res = capex_optim_add_group(z->opt, hp ? &hp[g] : NULL, pp, n, NULL);
    }
    capex__free(NULL, pp);
    if (!z->has_dev && res == CAPEX_OK) z->opt->sealed = 1;
    if (z->has_dev) return res; /* the device optimizer: no stochastic rounding (create refuses it); capex_cuda_zero hooks LAMB/NovoGrad sums */
    if (res == CAPEX_OK) { /* stochastic rounding keyed as the unsharded optimizer's tensors and elements */
        size_t j;
        for (j = 0; j < z->npieces; j++) {
            z->opt->tensors[j].sr_tensor = z->full_pos[2 * z->piece_param[j] + 1];
            z->opt->tensors[j].sr_base = (int64_t)z->piece_start[j];
        }
    }
    if (res == CAPEX_OK && (od->kind == CAPEX_OPTIM_LAMB || od->kind == CAPEX_OPTIM_NOVOGRAD)) {
        if (!(z->lamb_sums = (double *)capex__alloc(NULL, sizeof(double) * (2 * z->np + 2))))
            return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_zero_create: out of memory");
        z->opt->reduce_fn = capex__zero_reduce;
        z->opt->reduce_user = z;
    }
    return res;
}

/* Moment floats per element that capex_optim_add_group allocates. */
static size_t capex__zero_floats(const capex_optim_desc *od, const capex_optim_hparams *hp) {
    if (od->kind == CAPEX_OPTIM_SGD) return hp->momentum != 0.0f;
    if (od->kind == CAPEX_OPTIM_ADAGRAD) return 1;
    if (od->kind == CAPEX_OPTIM_LAMB) return 2 + !od->lamb_low_memory; /* m, v and the kept update u */
    if (od->kind == CAPEX_OPTIM_NOVOGRAD) return 1;                    /* m (v is one float per tensor) */
    return 2 + (hp->amsgrad != 0);
}

/* This rank's own checks of create's arguments (comm checked; desc non-NULL). */
static capex_result capex__zero_check_args(capex_comm *comm, const capex_zero_param *params, size_t np,
                                           const capex_optim_desc *od, size_t ngroups, const capex_zero_desc *desc,
                                           const capex__zero_dev *dev, const char *fn) {
    capex_result r;
    size_t i, total = 0, bytes, W;
    if (comm->device_buffers && !dev)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the comm works on device (NCCL) buffers; the sharded optimizer "
                           "for device params is capex_cuda_zero_create (capex_cuda.h)", fn);
    if (!comm->device_buffers && dev)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the comm works on host buffers (%s); device params need an NCCL "
                           "comm (capex_comm_init_nccl), host params capex_zero_create", fn, comm->vt->name);
    if (np && !params) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: params is NULL with num_params %zu", fn, np);
    if (!od) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: od is NULL; make one with capex_optim_desc_init", fn);
    if ((r = capex__desc_check(od->init_tag, CAPEX__OPTIM_DESC_TAG, fn, "capex_optim_desc", "capex_optim_desc_init")) != CAPEX_OK)
        return r;
    if (dev && od->stochastic_rounding)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: bf16 stochastic rounding with sharding on the GPU is not "
                           "supported yet", fn);
    if ((r = capex__desc_check(desc->init_tag, CAPEX__TAG_ZERO_DESC, fn, "capex_zero_desc", "capex_zero_desc_init")) != CAPEX_OK)
        return r;
    if (desc->stage != 1 && desc->stage != 2)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: stage is %d; it must be 1 (optimizer state) or 2 (and gradients)", fn,
                           desc->stage);
    if (!desc->bucket_bytes) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: bucket_bytes must be > 0 (default 25 MiB)", fn);
    if (!ngroups) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: num_groups is 0 (one group at least)", fn);
    if (np >= SIZE_MAX / sizeof(capex_zero_param))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %zu params: the byte size overflows size_t", fn, np);
    W = (size_t)comm->world_size;
    for (i = 0; i < np; i++) {
        if (!capex__dtype_ok(params[i].dtype))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: param %zu has invalid dtype %d", fn, i, (int)params[i].dtype);
        if (params[i].numel && !params[i].data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: param %zu has no data pointer", fn, i);
        if (params[i].group >= ngroups)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: param %zu is in group %zu of %zu (num_groups)", fn, i,
                               params[i].group, ngroups);
        if ((r = capex__comm_dtype_check(comm, params[i].dtype, fn, i, " (ZeRO reduces each gradient in its own "
                                         "dtype)")) != CAPEX_OK)
            return r;
        if (od->stochastic_rounding && (uint64_t)params[i].numel > 0xffffffffull) /* items would cross 2^32 */
            return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: param %zu has 2^32 elements or more; stochastic rounding "
                               "with sharding takes smaller tensors", fn, i);
        if (capex__size_add(total, params[i].numel, &total))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: params 0..%zu hold more elements than size_t can count", fn, i);
    }
    /* alignment (<= 7 per view) and shard padding (<= W*8 per bucket, <= np buckets + 3) */
    if (capex__size_add(total, (np + 3) * 8, &total) || capex__size_mul(W * 8 + 8, np + 3, &bytes) ||
        capex__size_add(total, bytes, &total) || capex__size_mul(total, sizeof(float), &bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the padded buffers' byte size overflows size_t", fn);
    return CAPEX_OK;
}

/* The signature every rank must share (see capex__create_agree): params
   with their groups, the stage, the bucket size (the shard layout), the
   scaling, the parameter broadcast, and the optimizer: its kind (LAMB and
   NovoGrad add allreduces), its settings and each group's hparams (every
   rank steps its own shard with them). Not exec, allocator or
   lamb_low_memory: local choices that give the same bits. */
static void capex__zero_signature(int64_t *sig, const capex_zero_param *params, size_t np, const capex_optim_desc *od,
                                  const capex_optim_hparams *hparams, size_t ngroups, const capex_zero_desc *d) {
    uint64_t hn = 0, ht = 0, hg = 0, ho = 0, hh = 0, total = 0;
    size_t i;
    capex_optim_kind k;
    int adam, lamb, sgd, novo, adagrad;
    for (i = 0; i < np; i++) {
        hn = capex__sig_mix(hn, (uint64_t)params[i].numel);
        ht = capex__sig_mix(ht, (uint64_t)params[i].dtype);
        hg = capex__sig_mix(hg, (uint64_t)params[i].group);
        total += (uint64_t)params[i].numel;
    }
    /* only what the kind reads: a field it ignores may differ (or be left unset) */
    k = od->kind;
    adam = k == CAPEX_OPTIM_ADAM, lamb = k == CAPEX_OPTIM_LAMB, sgd = k == CAPEX_OPTIM_SGD;
    novo = k == CAPEX_OPTIM_NOVOGRAD, adagrad = k == CAPEX_OPTIM_ADAGRAD;
    if (adam || lamb || adagrad) ho = capex__sig_mix(ho, (uint64_t)od->adam_w_mode);
    if (lamb) ho = capex__sig_mix(ho, (uint64_t)od->use_nvlamb);
    if (lamb) ho = capex__sig_mix(ho, capex__f32_bits(od->max_grad_norm));
    if (sgd) ho = capex__sig_mix(ho, (uint64_t)od->wd_after_momentum);
    ho = capex__sig_mix(ho, (uint64_t)od->stochastic_rounding);
    if (od->stochastic_rounding) ho = capex__sig_mix(ho, od->seed);
    if (novo) ho = capex__sig_mix(ho, (uint64_t)od->reg_inside_moment);
    if (novo) ho = capex__sig_mix(ho, (uint64_t)od->init_zero);
    if (novo) ho = capex__sig_mix(ho, (uint64_t)od->norm_type);
    for (i = 0; i < ngroups; i++) { /* the values each group runs with (NULL: od->defaults) */
        const capex_optim_hparams *h = hparams ? &hparams[i] : &od->defaults;
        /* lr, beta1, beta2, eps, weight_decay, momentum, dampening, lr_decay, initial_accumulator_value */
        const float f[9] = {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->momentum, h->dampening, h->lr_decay,
                            h->initial_accumulator_value};
        const unsigned read = adam || lamb || novo ? 0x1Fu : sgd ? 0x71u : adagrad ? 0x199u : 0x1FFu;
        size_t j;
        for (j = 0; j < 9; j++)
            if (read >> j & 1u) hh = capex__sig_mix(hh, capex__f32_bits(f[j]));
        if (adam || lamb || novo) hh = capex__sig_mix(hh, (uint64_t)h->bias_correction);
        if (lamb || novo) hh = capex__sig_mix(hh, (uint64_t)h->grad_averaging);
        if (sgd) hh = capex__sig_mix(hh, (uint64_t)h->nesterov);
        if (adam) hh = capex__sig_mix(hh, (uint64_t)h->amsgrad);
    }
    capex__sig_model(sig, CAPEX__SIG_ZERO, np, total, hn, ht);
    sig[CAPEX__SIG_H_GROUP] = (int64_t)hg;
    sig[CAPEX__SIG_DESC + 0] = d->stage;
    sig[CAPEX__SIG_DESC + 1] = (int64_t)d->bucket_bytes;
    sig[CAPEX__SIG_DESC + 2] = d->gradient_average != 0;
    sig[CAPEX__SIG_DESC + 3] = d->broadcast_parameters != 0;
    sig[CAPEX__SIG_DESC + 4] = (int64_t)ngroups;
    sig[CAPEX__SIG_DESC + 5] = (int64_t)od->kind;
    sig[CAPEX__SIG_DESC + 6] = (int64_t)ho;
    sig[CAPEX__SIG_DESC + 7] = (int64_t)hh;
}

/* Stage 2 over several ranks: the pool gets now (under create's last
   agreement) the buffers that a backward in reverse registration order
   lends: buckets open from their first grad until they launch, in bucket
   order, and a lend with the pool empty takes the buffer of a launched
   bucket; so the peak of open buckets (one per dtype when dtypes fill
   side by side). Lent on first use instead, they were allocated in the first step,
   where one rank failing alone left its peers in a reduce-scatter. The
   first iteration in that order allocates the same (the pool keeps them);
   another order may need more (the pool then grows at a lend, as before)
   or fewer. A world of 1 has no peer to strand and allocates on use. */
static capex_result capex__zero_fill_pool(capex_zero *z) {
    size_t *left, i, k, next = 0, open = 0, peak = 0;
    unsigned char *lent;
    capex_result r = CAPEX_OK;
    if (!z->pool_bytes || !z->nb) return CAPEX_OK;
    left = (size_t *)capex__alloc(NULL, sizeof(size_t) * z->nb);
    lent = (unsigned char *)capex__alloc(NULL, z->nb);
    if (!left || !lent) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_zero_create: out of memory");
    for (k = 0; r == CAPEX_OK && k < z->nb; k++) left[k] = z->b[k].count, lent[k] = 0;
    for (i = z->np; r == CAPEX_OK && i-- > 0;) {
        k = z->bucket_of[i];
        if (!lent[k]) lent[k] = 1, peak = ++open > peak ? open : peak;
        left[k]--;
        for (; next < z->nb && !left[next]; next++) open -= lent[next]; /* launched in bucket order */
    }
    capex__free(NULL, left);
    capex__free(NULL, lent);
    while (r == CAPEX_OK && z->npool < peak) {
        void *b = NULL;
        if ((r = capex__comm_alloc(z->comm, &b, z->pool_bytes)) != CAPEX_OK) break;
        z->pool[z->npool++] = b;
        z->pool_allocated++;
        z->mem.lent_buffers++;
        z->mem.grad_bytes += z->pool_bytes;
    }
    return r;
}

/* capex_zero_create, and capex_cuda_zero_create's device mode (dev non-NULL).
   hb: the caller's capex__hostbuf, made before its own agreement (NULL:
   made here); taken over (z->hb) or freed. */
CAPEX__PRIVATE capex_result capex__zero_create(capex_zero **out, capex_comm *comm, const capex_zero_param *params,
                                              size_t np, const capex_optim_desc *od, const capex_optim_hparams *hparams,
                                              size_t ngroups, const capex_zero_desc *desc, const capex__zero_dev *dev,
                                              capex__hostbuf *hb_in, const char *fn) {
    capex_zero *z;
    capex_zero_desc dd;
    capex_result r;
    size_t i, k, W;
    int64_t sig[CAPEX__SIG_N];
    capex__hostbuf own = {NULL, 0}, *hb = hb_in ? hb_in : &own;
    capex__sig_names nm = {NULL, "capex_zero_desc, optim desc and hparams",
                           {"stage", "bucket_bytes", "gradient_average", "broadcast_parameters", "num_groups",
                            "optimizer kind", "#optimizer settings (capex_optim_desc)", "#hparams", NULL},
                           0u};
    nm.api = fn;
    if (out) *out = NULL;
    if (!out) r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: out is NULL", fn);
    else r = capex__comm_check(comm, fn);
    if (r != CAPEX_OK) {
        if (hb_in && comm && comm->vt) capex__hostbuf_free(comm, hb_in);
        return r;
    }
    if (!desc) { capex_zero_desc_init(&dd); desc = &dd; }
    /* as DDP's: the exchanges' buffer first (a device comm without host_buffer) */
    if ((r = capex__hostbuf_make(comm, hb, capex__comm_host_bytes(comm->world_size))) != CAPEX_OK) {
        capex__hostbuf_free(comm, hb);
        return r;
    }
    /* a rank refusing its arguments still joins the model check, so its peers fail with it */
    if ((r = capex__zero_check_args(comm, params, np, od, ngroups, desc, dev, fn)) != CAPEX_OK)
        return capex__create_refuse(comm, hb, sig, r, &nm);
    capex__zero_signature(sig, params, np, od, hparams, ngroups, desc);
    W = (size_t)comm->world_size;
    z = (capex_zero *)capex__alloc(NULL, sizeof *z);
    if (!z) return capex__create_refuse(comm, hb, sig, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn), &nm);
    memset(z, 0, sizeof *z);
    z->comm = comm;
    z->hb = *hb; /* destroy frees it from here on */
    hb->dev = NULL;
    hb->bytes = 0;
    if (dev) { z->has_dev = 1; z->dev = *dev; }
    z->d = *desc;
    z->np = np;
    z->ngroups = ngroups;
    z->sync = 1;
    z->stages = capex__comm_stages_f32(comm);
    z->params = (capex_zero_param *)capex__alloc(NULL, sizeof(capex_zero_param) * (np + 1));
    z->bucket_of = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    z->offset_of = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    z->bparams = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    z->ready = (unsigned char *)capex__alloc(NULL, np + 1);
    z->piece_param = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1)); /* a shard cuts a param once */
    z->piece_start = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    z->piece_k = (size_t *)capex__alloc(NULL, sizeof(size_t) * (np + 1));
    z->full_pos = (size_t *)capex__alloc(NULL, sizeof(size_t) * (2 * np + 1));
    z->counts = (size_t *)capex__alloc(NULL, sizeof(size_t) * W);
    z->mom_bufs = (unsigned char *)capex__alloc(NULL, ngroups);
    if (!z->params || !z->bucket_of || !z->offset_of || !z->bparams || !z->ready || !z->piece_param || !z->piece_start ||
        !z->piece_k || !z->full_pos || !z->counts || !z->mom_bufs) {
        r = capex__create_agree(comm, &z->hb, sig, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn), &nm);
        capex_zero_destroy(z);
        return r;
    }
    for (i = 0; i < ngroups; i++) /* as capex_optim_add_group decides */
        z->mom_bufs[i] = od->kind == CAPEX_OPTIM_SGD && (hparams ? hparams[i].momentum : od->defaults.momentum) != 0.0f;
    if (np) memcpy(z->params, params, sizeof(capex_zero_param) * np);
    memset(z->ready, 0, np + 1);
    {   /* the unsharded optimizer's order: group by group, params in index order */
        size_t *cnt = (size_t *)capex__alloc(NULL, sizeof(size_t) * (ngroups + 1)), g, first;
        if (!cnt) {
            r = capex__create_agree(comm, &z->hb, sig, capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn), &nm);
            capex_zero_destroy(z);
            return r;
        }
        for (g = 0; g <= ngroups; g++) cnt[g] = 0;
        for (i = 0; i < np; i++) z->full_pos[2 * i] = cnt[params[i].group]++;
        for (g = 0, first = 0; g < ngroups; g++) { size_t c2 = cnt[g]; cnt[g] = first; first += c2; }
        for (i = 0; i < np; i++) z->full_pos[2 * i + 1] = cnt[params[i].group] + z->full_pos[2 * i];
        capex__free(NULL, cnt);
    }
    /* every rank's signature before the first collective (the broadcast): a
       rank that failed above, or a mismatch, fails every rank here */
    r = capex__zero_plan(z);
    if ((r = capex__create_agree(comm, &z->hb, sig, r, &nm)) != CAPEX_OK) { capex_zero_destroy(z); return r; }
    /* rank 0's parameters everywhere, then into the flat buffers */
    for (i = 0; desc->broadcast_parameters && W > 1 && i < np; i++)
        if (params[i].numel && (r = capex_comm_broadcast(comm, params[i].data, params[i].numel, params[i].dtype, 0)) != CAPEX_OK) {
            capex_zero_destroy(z);
            return r;
        }
    for (k = 0; r == CAPEX_OK && k < z->nb; k++) {
        capex__zbucket *bk = &z->b[k];
        size_t es = capex_dtype_size(bk->dtype), full = bk->shard * W, lo = (size_t)comm->rank * bk->shard, j;
        size_t gb = capex__zero_grad_bytes(z, bk); /* with the f32 staging (z->stages) */
        r = capex__comm_alloc(comm, &bk->param, full * es != 0 ? full * es : 1);
        if (r == CAPEX_OK) r = capex__comm_zero(comm, bk->param, full * es);
        if (r == CAPEX_OK && z->d.stage == 1) {
            r = capex__comm_alloc(comm, &bk->grad, gb != 0 ? gb : 1);
            if (r == CAPEX_OK) r = capex__comm_zero(comm, bk->grad, full * es);
        }
        if (r == CAPEX_OK && z->d.stage == 2) {
            r = capex__comm_alloc(comm, &bk->gshard, bk->shard * es != 0 ? bk->shard * es : 1);
            if (r == CAPEX_OK) r = capex__comm_zero(comm, bk->gshard, bk->shard * es);
            if (gb > z->pool_bytes) z->pool_bytes = gb;
        }
        for (j = 0; r == CAPEX_OK && j < bk->count; j++) {
            size_t i2 = z->bparams[bk->first + j];
            r = capex__comm_copy(comm, (char *)bk->param + z->offset_of[i2] * es, params[i2].data, params[i2].numel * es,
                                 CAPEX_COPY_D2D);
        }
        if (r == CAPEX_OK && bk->dtype != CAPEX_F32) {
            if (z->has_dev) r = capex__comm_alloc(comm, (void **)&bk->master, sizeof(float) * (bk->shard ? bk->shard : 1));
            else if (!(bk->master = (float *)capex__alloc(NULL, sizeof(float) * (bk->shard ? bk->shard : 1))))
                r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory (master weights)", fn);
            if (r == CAPEX_OK)
                r = capex__comm_convert(comm, bk->master, CAPEX_F32, (char *)bk->param + lo * es, bk->dtype, bk->shard);
        }
    }
    if (r == CAPEX_OK) r = capex__zero_build_optim(z, od, hparams);
    if (r == CAPEX_OK && comm->vt->reserve) { /* as DDP's: a request per bucket, the half shards' average */
        int scales = z->d.gradient_average && W > 1;
        size_t half = 0;
        for (k = 0; k < z->nb; k++)
            if ((z->b[k].dtype == CAPEX_F16 || z->b[k].dtype == CAPEX_BF16) && z->b[k].shard > half) half = z->b[k].shard;
        if ((r = comm->vt->reserve(comm, scales, scales ? half : 0, (long)z->nb)) == CAPEX_OK) z->reserved = z->nb;
    }
    if (r == CAPEX_OK && z->d.stage == 2 && W > 1) r = capex__zero_fill_pool(z);
    if (r == CAPEX_OK && z->has_dev && z->dev.finish) r = z->dev.finish(z->dev.user, z);
    /* a failure here (buffers, the optimizer) is this rank's alone: one more
       small agreement, so that its peers fail with it instead of returning a
       zero whose next collective pairs with something else */
    if ((r = capex__comm_agree(comm, &z->hb, r, fn)) != CAPEX_OK) { capex_zero_destroy(z); return r; }
    {   /* memory report (the stage-2 pool's peak is added as buffers are lent) */
        capex_zero_memory *m = &z->mem;
        m->buckets = z->nb;
        for (k = 0; k < z->nb; k++) {
            size_t es = capex_dtype_size(z->b[k].dtype);
            m->shard_elements += z->b[k].shard;
            if (z->b[k].master) m->master_bytes += z->b[k].shard * sizeof(float);
            m->param_buffer_bytes += z->b[k].shard * W * es;
            m->grad_bytes += z->d.stage == 1 ? capex__zero_grad_bytes(z, &z->b[k]) : z->b[k].shard * es;
        }
        m->padding_elements = m->shard_elements;
        for (i = 0; i < np; i++) {
            const capex__zbucket *bk = &z->b[z->bucket_of[i]];
            size_t lo = (size_t)comm->rank * bk->shard, hi = lo + bk->shard, a = z->offset_of[i] > lo ? z->offset_of[i] : lo;
            size_t e = z->offset_of[i] + params[i].numel, f = capex__zero_floats(od, hparams ? &hparams[params[i].group] : &od->defaults);
            if (z->has_dev && od->kind == CAPEX_OPTIM_LAMB && !od->lamb_low_memory) f--; /* the device LAMB keeps no update */
            if (e > hi) e = hi;
            if (a < e) { m->moment_bytes += f * (e - a) * sizeof(float); m->padding_elements -= e - a; }
            m->unsharded_state_bytes += (f + (params[i].dtype != CAPEX_F32)) * params[i].numel * sizeof(float);
        }
        m->optimizer_state_bytes = m->master_bytes + m->moment_bytes;
    }
    *out = z;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_create(capex_zero **out, capex_comm *comm, const capex_zero_param *params,
                                         size_t np, const capex_optim_desc *od, const capex_optim_hparams *hparams,
                                         size_t ngroups, const capex_zero_desc *desc) {
    return capex__zero_create(out, comm, params, np, od, hparams, ngroups, desc, NULL, NULL, "capex_zero_create");
}

/* The counts of a collective over equal shards of `shard` elements. */
static const size_t *capex__zero_counts(capex_zero *z, size_t shard) {
    int q;
    for (q = 0; q < z->comm->world_size; q++) z->counts[q] = shard;
    return z->counts;
}

static capex_result capex__zero_check(capex_zero *z, const char *fn) {
    capex_result r;
    if (!z) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: zero is NULL", fn);
    if (z->failed)
        return capex__fail(CAPEX_ERR_COMM, "%s: this zero failed in an earlier collective; stop and restart from a checkpoint", fn);
    if ((r = capex__comm_check(z->comm, fn)) != CAPEX_OK) { z->failed = 1; return r; }
    return CAPEX_OK;
}

static capex_result capex__zero_finish_reduces(capex_zero *z, int all);
static capex_result capex__zero_finish_gather(capex_zero *z, size_t k, double deadline);

/* Between grad_ready and finalize the shards hold unreduced (or, with
   nonblocking reduce-scatters, in-flight) gradients: reading them would
   silently use the wrong values. */
static capex_result capex__zero_between_iterations(const capex_zero *z, const char *fn) {
    size_t i;
    for (i = 0; i < z->np; i++)
        if (z->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "%s: parameter %zu was made ready but capex_zero_finalize was not called: "
                               "the gradient shards are not reduced yet; finalize first", fn, i);
    return CAPEX_OK;
}

/* Stage 2: lends bucket k a zeroed full-size buffer: from the pool; else the
   oldest in-flight reduce-scatter is finished first to free its buffer; a
   new one only when nothing is in flight (so at most the open buckets plus
   one are ever allocated). */
static capex_result capex__zero_lend(capex_zero *z, size_t k) {
    capex__zbucket *bk = &z->b[k];
    capex_result r;
    if (bk->grad) return CAPEX_OK;
    if (!z->npool && (r = capex__zero_finish_reduces(z, 0)) != CAPEX_OK) return r;
    if (z->npool) bk->grad = z->pool[--z->npool];
    else {
        if ((r = capex__comm_alloc(z->comm, &bk->grad, z->pool_bytes ? z->pool_bytes : 1)) != CAPEX_OK) return r;
        z->pool_allocated++;
        z->mem.lent_buffers++;
        z->mem.grad_bytes += z->pool_bytes;
    }
    return capex__comm_zero(z->comm, bk->grad, bk->shard * (size_t)z->comm->world_size * capex_dtype_size(bk->dtype));
}

CAPEX_API void *capex_zero_grad(capex_zero *z, size_t p) {
    static const char *fn = "capex_zero_grad";
    capex__zbucket *bk;
    if (capex__zero_check(z, fn) != CAPEX_OK) return NULL;
    if (p >= z->np) {
        (void)capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown parameter %zu (there are %zu)", fn, p, z->np);
        return NULL;
    }
    bk = &z->b[z->bucket_of[p]];
    if (z->d.stage == 2 && (!bk->grad || bk->launched)) {
        if (bk->launched) {
            (void)capex__fail(CAPEX_ERR_ORDER, "%s: parameter %zu's bucket was already reduced in this iteration (stage 2 "
                        "lends a bucket its buffer until then); call capex_zero_finalize first", fn, p);
            return NULL;
        }
        if (capex__zero_lend(z, z->bucket_of[p]) != CAPEX_OK) { z->failed = 1; return NULL; }
    }
    return (char *)bk->grad + z->offset_of[p] * capex_dtype_size(z->params[p].dtype);
}

/* After bucket k's reduce-scatter: the shard averaged as DDP does (sum,
   then times f32(1/world)); stage 2 copies or adds it into gshard and gives
   the lent buffer back to the pool. */
static capex_result capex__zero_post(capex_zero *z, size_t k) {
    capex__zbucket *bk = &z->b[k];
    capex_comm *c = z->comm;
    size_t W = (size_t)c->world_size, es = capex_dtype_size(bk->dtype);
    void *mine = (char *)bk->grad + (size_t)c->rank * bk->shard * es;
    capex_result r = CAPEX_OK;
    if (bk->staged) { /* the f32 sum out of z's staging, rounded once (as MPI's wait did) */
        const float *out = (const float *)((char *)bk->grad + capex__zero_stage_off(bk, W));
        if (bk->dtype != CAPEX_F32) out += bk->shard * W; /* past the input copy */
        bk->staged = 0;
        r = capex__comm_convert(c, mine, bk->dtype, out, CAPEX_F32, bk->shard);
    }
    if (r == CAPEX_OK && z->d.gradient_average && W > 1)
        r = capex__comm_scale(c, mine, bk->shard, bk->dtype, (float)(1.0 / (double)W));
    if (r == CAPEX_OK && z->d.stage == 2) {
        if (!z->accumulated) r = capex__comm_copy(c, bk->gshard, mine, bk->shard * es, CAPEX_COPY_D2D);
        else if (z->has_dev) r = z->dev.add(z->dev.user, bk->gshard, mine, bk->shard, bk->dtype);
        else {
            capex_tensor tx = {0, 0}, ty = {0, 0};
            capex_tensor_list lx, ly;
            tx.data = mine; tx.numel = (int64_t)bk->shard;
            ty.data = bk->gshard; ty.numel = (int64_t)bk->shard;
            lx = capex_tensor_list_make(bk->dtype, &tx, 1);
            ly = capex_tensor_list_make(bk->dtype, &ty, 1);
            r = capex_multi_tensor_axpby(NULL, 1.0f, &lx, 1.0f, &ly, &ly, -1, NULL);
        }
        z->pool[z->npool++] = bk->grad; /* back to the pool */
        bk->grad = NULL;
    }
    return r;
}

/* Starts bucket k's reduce-scatter: nonblocking where the comm has
   ireduce_scatter (finished in order by capex__zero_finish_reduces), else
   blocking and post-processed at once. */
static capex_result capex__zero_launch(capex_zero *z, size_t k) {
    capex__zbucket *bk = &z->b[k];
    capex_comm *c = z->comm;
    size_t W = (size_t)c->world_size, es = capex_dtype_size(bk->dtype), lo = (size_t)c->rank * bk->shard;
    capex_result r = CAPEX_OK;
    void *mine;
    bk->launched = 1;
    if (!bk->shard) { /* empty params only: nothing to reduce; a lent buffer goes back to the pool */
        if (bk->grad && z->d.stage == 2) { z->pool[z->npool++] = bk->grad; bk->grad = NULL; }
        return CAPEX_OK;
    }
    /* the last step's all-gather of this bucket (params nobody waited for)
       holds bk->req: finish it before the reduce-scatter takes the request */
    if ((r = capex__zero_finish_gather(z, k, capex__deadline(c))) != CAPEX_OK) return r;
    if (z->d.stage == 2 && (r = capex__zero_lend(z, k)) != CAPEX_OK) return r; /* a bucket nobody wrote */
    mine = (char *)bk->grad + lo * es;
    if (W > 1 && c->vt->ireduce_scatter && c->vt->wait) {
        const void *in = bk->grad;
        void *out = mine;
        capex_dtype t = bk->dtype;
        if (z->stages) { /* MPI's staging, z's own (capex__zero_grad_bytes) */
            float *s32 = (float *)((char *)bk->grad + capex__zero_stage_off(bk, W));
            if (t != CAPEX_F32) {
                if ((r = capex__comm_convert(c, s32, CAPEX_F32, bk->grad, t, bk->shard * W)) != CAPEX_OK) return r;
                in = s32;
                s32 += bk->shard * W;
            }
            out = s32;
            t = CAPEX_F32;
        }
        r = c->vt->ireduce_scatter(c, in, out, bk->shard, t, CAPEX_REDUCE_SUM, &bk->req);
        if (r == CAPEX_OK) { bk->reducing = 1; bk->test_done = 0; bk->staged = z->stages; return CAPEX_OK; }
        if (r != CAPEX_ERR_UNSUPPORTED) return capex__comm_after(c, r);
    }
    r = capex_comm_reduce_scatter(c, bk->grad, mine, capex__zero_counts(z, bk->shard), bk->dtype, CAPEX_REDUCE_SUM);
    return r == CAPEX_OK ? capex__zero_post(z, k) : r;
}

/* Lets in-flight reduce-scatters progress (MPI moves data only inside MPI
   calls): tests the oldest, in order, without blocking. */
static capex_result capex__zero_progress(capex_zero *z) {
    capex_comm *c = z->comm;
    size_t k;
    if (!c->vt->test) return CAPEX_OK;
    for (k = 0; k < z->next_launch; k++) {
        int done = 1;
        capex_result r;
        if (!z->b[k].reducing || z->b[k].test_done) continue;
        if ((r = c->vt->test(c, &z->b[k].req, &done)) != CAPEX_OK) { z->failed = 1; return capex__comm_after(c, r); }
        if (!done) break;
        z->b[k].test_done = 1;
    }
    return CAPEX_OK;
}

/* Finishes in-flight reduce-scatters in bucket order: the oldest only
   (`all` 0), or every one. */
static capex_result capex__zero_finish_reduces(capex_zero *z, int all) {
    capex_comm *c = z->comm;
    double deadline = capex__deadline(c);
    size_t k;
    capex_result r;
    for (k = 0; k < z->nb; k++) {
        if (!z->b[k].reducing) continue;
        if ((r = capex__comm_after(c, c->vt->wait(c, &z->b[k].req, deadline))) != CAPEX_OK) { z->failed = 1; return r; }
        z->b[k].reducing = 0;
        if ((r = capex__zero_post(z, k)) != CAPEX_OK) { z->failed = 1; return r; }
        if (!all) break;
    }
    return CAPEX_OK;
}

static capex_result capex__zero_launch_ready(capex_zero *z) {
    capex_result r;
    while (z->next_launch < z->nb && z->b[z->next_launch].pending == 0)
        if ((r = capex__zero_launch(z, z->next_launch++)) != CAPEX_OK) { z->failed = 1; return r; }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_grad_ready(capex_zero *z, size_t p) {
    static const char *fn = "capex_zero_grad_ready";
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if (p >= z->np) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown parameter %zu (there are %zu)", fn, p, z->np);
    if (z->ready[p])
        return capex__fail(CAPEX_ERR_ORDER, "%s: parameter %zu is already ready in this iteration (grad_ready twice? "
                           "call capex_zero_finalize once per backward)", fn, p);
    if (z->d.stage == 2 && !z->b[z->bucket_of[p]].grad && !z->b[z->bucket_of[p]].launched &&
        (r = capex__zero_lend(z, z->bucket_of[p])) != CAPEX_OK) { z->failed = 1; return r; } /* a zero gradient */
    z->ready[p] = 1;
    z->b[z->bucket_of[p]].pending--;
    if (!z->sync) return CAPEX_OK;
    if ((r = capex__zero_launch_ready(z)) != CAPEX_OK) return r;
    return capex__zero_progress(z);
}

CAPEX_API capex_result capex_zero_finalize(capex_zero *z) {
    static const char *fn = "capex_zero_finalize";
    size_t i;
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    for (i = 0; i < z->np; i++)
        if (!z->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "%s: parameter %zu never reported ready; call capex_zero_grad_ready for "
                               "every parameter (an unused one without writing its gradient: it is zero), then "
                               "finalize again", fn, i);
    if (z->sync) {
        if ((r = capex__zero_launch_ready(z)) != CAPEX_OK) return r;
        if ((r = capex__zero_finish_reduces(z, 1)) != CAPEX_OK) return r;
        if (z->d.stage == 2) z->accumulated = 1;
    }
    memset(z->ready, 0, z->np + 1);
    for (i = 0; i < z->nb; i++) { z->b[i].pending = z->b[i].count; z->b[i].launched = 0; }
    z->next_launch = 0;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_grad_norm(capex_zero *z, int *found_inf, float *norm) {
    static const char *fn = "capex_zero_grad_norm";
    size_t k, n = 0, es;
    double sum = 0.0;
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if (z->has_dev)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: this zero's gradients are on the device; use "
                           "capex_cuda_zero_grad_norm (found_inf and clip factor stay on the device)", fn);
    if ((r = capex__zero_between_iterations(z, fn)) != CAPEX_OK) return r;
    for (k = 0; k < z->nb; k++) {
        const capex__zbucket *bk = &z->b[k];
        capex_tensor t;
        capex_tensor_list l;
        double s = 0.0;
        if (!bk->shard) continue;
        es = capex_dtype_size(bk->dtype);
        t.data = z->d.stage == 1 ? (char *)bk->grad + (size_t)z->comm->rank * bk->shard * es : bk->gshard;
        t.numel = (int64_t)bk->shard;
        l = capex_tensor_list_make(bk->dtype, &t, 1);
        if ((r = capex_multi_tensor_sumsq(NULL, &l, &s, NULL)) != CAPEX_OK) return r;
        sum += s;
        n++;
    }
    if (z->comm->world_size > 1 && (r = capex_comm_allreduce(z->comm, &sum, &sum, 1, CAPEX_F64, CAPEX_REDUCE_SUM)) != CAPEX_OK) {
        z->failed = 1;
        return r;
    }
    (void)n;
    if (found_inf) *found_inf = !(sum - sum == 0.0);
    if (norm) *norm = (float)sqrt(sum);
    return CAPEX_OK;
}

/* Copies bucket k's params out of the flat buffer once its gather is done. */
static capex_result capex__zero_finish_gather(capex_zero *z, size_t k, double deadline) {
    capex__zbucket *bk = &z->b[k];
    size_t es = capex_dtype_size(bk->dtype), j;
    capex_result r;
    if (!bk->gathering) return CAPEX_OK;
    if (bk->req.active && (r = capex__comm_after(z->comm, z->comm->vt->wait(z->comm, &bk->req, deadline))) != CAPEX_OK) {
        z->failed = 1;
        return r;
    }
    bk->gathering = 0;
    for (j = 0; j < bk->count; j++) {
        size_t p = z->bparams[bk->first + j];
        if ((r = capex__comm_copy(z->comm, z->params[p].data, (char *)bk->param + z->offset_of[p] * es,
                                  z->params[p].numel * es, CAPEX_COPY_D2D)) != CAPEX_OK)
            return r;
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_wait_params(capex_zero *z) {
    static const char *fn = "capex_zero_wait_params";
    size_t k;
    double deadline;
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    deadline = capex__deadline(z->comm);
    for (k = z->nb; k-- > 0;) /* forward order */
        if ((r = capex__zero_finish_gather(z, k, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_wait_param(capex_zero *z, size_t p) {
    static const char *fn = "capex_zero_wait_param";
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if (p >= z->np) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown parameter %zu (there are %zu)", fn, p, z->np);
    return capex__zero_finish_gather(z, z->bucket_of[p], capex__deadline(z->comm));
}

/* The shard step (host optimizer, or the device's: found_inf is on the
   device then, and every step gathers) and the start of the all-gathers. */
CAPEX__PRIVATE capex_result capex__zero_step_start(capex_zero *z, float inv_scale, float clip_coef, int found_inf) {
    size_t k, W;
    capex_comm *c = z->comm;
    capex_result r;
    if ((r = capex__zero_between_iterations(z, "capex_zero_step")) != CAPEX_OK) return r;
    if ((r = capex_zero_wait_params(z)) != CAPEX_OK) return r; /* the last step's gathers, if nobody waited */
    if (z->has_dev) r = z->dev.step(z->dev.user);
    else r = capex_optim_step(z->opt, inv_scale, clip_coef, found_inf);
    if (r != CAPEX_OK) return r;
    if (found_inf && !z->has_dev) return CAPEX_OK;
    W = (size_t)c->world_size;
    for (k = z->nb; k-- > 0;) { /* the first layers' buckets first: the next forward needs them first */
        capex__zbucket *bk = &z->b[k];
        size_t es = capex_dtype_size(bk->dtype);
        void *mine = (char *)bk->param + (size_t)c->rank * bk->shard * es;
        bk->gathering = 1;
        if (W == 1 || !bk->shard) continue;
        if (c->vt->iallgather && c->vt->wait) {
            r = c->vt->iallgather(c, mine, bk->param, bk->shard, bk->dtype, &bk->req);
            if (r == CAPEX_OK) continue;
            if (r != CAPEX_ERR_UNSUPPORTED) { z->failed = 1; return capex__comm_after(c, r); }
        }
        r = capex_comm_allgatherv(c, mine, bk->param, capex__zero_counts(z, bk->shard), bk->dtype);
        if (r != CAPEX_OK) { z->failed = 1; return r; }
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_step_async(capex_zero *z, float inv_scale, float clip_coef, int found_inf) {
    static const char *fn = "capex_zero_step_async";
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if (z->has_dev)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: this zero steps on the device; use capex_cuda_zero_step(_async) "
                           "with device inv_scale / clip_coef / found_inf", fn);
    return capex__zero_step_start(z, inv_scale, clip_coef, found_inf);
}

CAPEX_API capex_result capex_zero_step(capex_zero *z, float inv_scale, float clip_coef, int found_inf) {
    capex_result r = capex_zero_step_async(z, inv_scale, clip_coef, found_inf);
    return r != CAPEX_OK ? r : capex_zero_wait_params(z);
}

CAPEX_API capex_result capex_zero_zero_grad(capex_zero *z) {
    static const char *fn = "capex_zero_zero_grad";
    size_t k, W;
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if ((r = capex__zero_between_iterations(z, fn)) != CAPEX_OK) return r; /* reduce-scatters may read the buffers */
    W = (size_t)z->comm->world_size;
    for (k = 0; k < z->nb; k++) {
        capex__zbucket *bk = &z->b[k];
        size_t es = capex_dtype_size(bk->dtype);
        if (z->d.stage == 1) r = capex__comm_zero(z->comm, bk->grad, bk->shard * W * es);
        else r = capex__comm_zero(z->comm, bk->gshard, bk->shard * es);
        if (r != CAPEX_OK) return r;
    }
    z->accumulated = 0;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_zero_set_sync(capex_zero *z, int sync) {
    static const char *fn = "capex_zero_set_sync";
    size_t i;
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    if (z->d.stage != 1)
        return capex__fail(CAPEX_ERR_CONFIG, "%s: stage 2 reduces every backward and accumulates in the shard; "
                           "no_sync is for stage 1", fn);
    for (i = 0; i < z->np; i++)
        if (z->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "%s: change sync mode between iterations (after capex_zero_finalize)", fn);
    z->sync = sync ? 1 : 0;
    return CAPEX_OK;
}

#ifndef CAPEX_NO_STATE /* CAPEX_NO_STATE: no ZeRO checkpoints */
/* ---- ZeRO checkpoints: the unsharded capex_optim format ---- */

/* An unsharded optimizer over the whole params (group by group, params in
   index order): f32 params are params[i].data, half params an fp32 master
   (in *masters) with data as the model copy. Its moments are its own. In
   device mode the data are host copies of the params (in *host, params in
   index order, 4-byte aligned), and so with `copy` (a load: nothing of the
   params' own changes before every rank agrees). */
static capex_result capex__zero_full_optim(capex_zero *z, int copy, capex_optim **out, float **masters, unsigned char **host) {
    capex_optim_desc d = z->opt->desc;
    capex_optim_param *pp = NULL;
    size_t i, g, n, half = 0, at = 0, hb = 0, *hoff = NULL;
    capex_result r = CAPEX_OK;
    *out = NULL;
    *masters = NULL;
    *host = NULL;
    for (i = 0; i < z->np; i++) if (z->params[i].dtype != CAPEX_F32) half += z->params[i].numel;
    pp = (capex_optim_param *)capex__alloc(NULL, sizeof(capex_optim_param) * (z->np + 1));
    *masters = (float *)capex__alloc(NULL, sizeof(float) * (half + 1));
    if ((z->has_dev || copy) && pp && *masters) {
        hoff = (size_t *)capex__alloc(NULL, sizeof(size_t) * (z->np + 1));
        for (i = 0; hoff && i < z->np; i++) {
            hoff[i] = hb;
            hb += (z->params[i].numel * capex_dtype_size(z->params[i].dtype) + 3) / 4 * 4;
        }
        if (hoff) *host = (unsigned char *)capex__alloc(NULL, hb + 4);
        if (!hoff || !*host) { capex__free(NULL, *masters); *masters = NULL; } /* reported below */
        for (i = 0; *host && r == CAPEX_OK && i < z->np; i++)
            r = capex__comm_copy(z->comm, *host + hoff[i], z->params[i].data,
                                 z->params[i].numel * capex_dtype_size(z->params[i].dtype), CAPEX_COPY_D2H);
    }
    if (!pp || !*masters || r != CAPEX_OK) {
        capex__free(NULL, pp);
        capex__free(NULL, hoff);
        capex__free(NULL, *masters);
        capex__free(NULL, *host);
        *masters = NULL;
        *host = NULL;
        return r != CAPEX_OK ? r : capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_zero: out of memory (checkpoint)");
    }
    d.allocator = NULL;
    d.lamb_low_memory = 1; /* never stepped: no update buffer */
    if ((r = capex_optim_create(&d, out)) == CAPEX_OK)
    for (g = 0; r == CAPEX_OK && g < z->ngroups; g++) {
        capex_optim_hparams hp;
        for (i = 0, n = 0; i < z->np; i++) {
            const capex_zero_param *zp = &z->params[i];
            void *data = *host ? (void *)(*host + hoff[i]) : zp->data;
            if (zp->group != g) continue;
            capex_optim_param_init(&pp[n]);
            pp[n].numel = (int64_t)zp->numel;
            pp[n].grad = data; /* never stepped: any readable buffer of the grad dtype */
            pp[n].grad_dtype = zp->dtype;
            if (zp->dtype == CAPEX_F32) pp[n].param = (float *)data;
            else { pp[n].param = *masters + at; at += zp->numel; pp[n].model = data; pp[n].model_dtype = zp->dtype; }
            n++;
        }
        if ((r = capex_optim_get_hparams(z->opt, g, &hp)) == CAPEX_OK) {
            capex_optim_hparams ah = hp; /* momentum on where the pieces have buffers, so that the copy has them */
            if (z->mom_bufs[g] && ah.momentum == 0.0f) ah.momentum = 1.0f;
            if ((r = capex_optim_add_group(*out, &ah, pp, n, NULL)) == CAPEX_OK) (*out)->groups[g].hp = hp;
        }
    }
    capex__free(NULL, pp);
    capex__free(NULL, hoff);
    if (r != CAPEX_OK) {
        capex_optim_destroy(*out);
        *out = NULL;
        capex__free(NULL, *masters);
        *masters = NULL;
        capex__free(NULL, *host);
        *host = NULL;
    }
    return r;
}

/* The buffer of state `what` (0 master/param, 1 exp_avg, 2 exp_avg_sq, 3 max)
   of tensor k of group g of optimizer o; NULL if it has none. */
static float *capex__zero_state_ptr(const capex_optim *o, size_t g, size_t k, int what) {
    const capex__optim_tensor *t = &o->tensors[o->groups[g].first + k];
    return what == 0 ? t->p.param : what == 1 ? t->p.exp_avg : what == 2 ? t->p.exp_avg_sq : t->p.max_exp_avg_sq;
}

/* Elements of local piece j. */
static int64_t capex__zero_piece_numel(const capex_zero *z, size_t j) {
    size_t i = z->piece_param[j], k = z->bucket_of[i], hi = ((size_t)z->comm->rank + 1) * z->b[k].shard;
    size_t a = z->offset_of[i] + z->piece_start[j], e = z->offset_of[i] + z->params[i].numel;
    return (int64_t)((e < hi ? e : hi) - a);
}

/* Local piece j's group and index in z->opt. */
static void capex__zero_piece_pos(const capex_zero *z, size_t j, size_t *g, size_t *k) {
    *g = z->params[z->piece_param[j]].group;
    *k = z->piece_k[j];
}

/* Frees rank 0's unsharded copy of the last save (the writer pointed into it). */
static void capex__zero_save_drop(capex_zero *z) {
    capex_optim_destroy(z->save_tmp);
    capex__free(NULL, z->save_masters);
    capex__free(NULL, z->save_host);
    z->save_tmp = NULL;
    z->save_masters = NULL;
    z->save_host = NULL;
}

CAPEX_API capex_result capex_zero_save(capex_zero *z, capex_state_writer *w, const char *prefix, unsigned flags) {
    static const char *fn = "capex_zero_save";
    capex_comm *c;
    size_t k, j, g, W, maxshard = 0;
    int what, root;
    float *pack = NULL, *full = NULL;
    void *dpack = NULL, *dfull = NULL; /* device mode: the collective's buffers */
    capex_result r = capex__zero_check(z, fn);
    if (r) return r;
    c = z->comm;
    /* rank 0 without a writer is refused only after the collectives, which it
       joins as a non-root: returning first would leave its peers waiting in
       them until the deadline, or pair them with its next collective */
    root = c->rank == 0 && w;
    if ((r = capex_zero_wait_params(z)) != CAPEX_OK) return r;
    W = (size_t)c->world_size;
    capex__zero_save_drop(z);
    /* this rank's own part first (the device state to the host, rank 0's
       unsharded copy, the buffers), then one small agreement: a rank that
       failed here fails every rank at once, none left in the all-gathers */
    if (z->has_dev) r = z->dev.to_host(z->dev.user, CAPEX_OPTIM_STATE_PARAMS, &z->opt);
    if (r == CAPEX_OK) r = capex__optim_flags_ok(flags, fn); /* before the agreement: every rank fails alike */
    if (r == CAPEX_OK && !z->has_dev && z->opt->broken)
        r = capex__fail(CAPEX_ERR_ORDER, "%s: a state load failed part-way (I/O error); load the state again before "
                        "saving", fn);
    if (r == CAPEX_OK && root) r = capex__zero_full_optim(z, 0, &z->save_tmp, &z->save_masters, &z->save_host);
    for (k = 0; k < z->nb; k++) if (z->b[k].shard > maxshard) maxshard = z->b[k].shard;
    if (r == CAPEX_OK) {
        pack = (float *)capex__alloc(NULL, sizeof(float) * (maxshard + 1));
        full = (float *)capex__alloc(NULL, sizeof(float) * (maxshard * W + 1));
        if (!pack || !full) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    if (r == CAPEX_OK && z->has_dev && (r = capex__comm_alloc(c, &dpack, sizeof(float) * (maxshard + 1))) == CAPEX_OK)
        r = capex__comm_alloc(c, &dfull, sizeof(float) * (maxshard * W + 1));
    if ((r = capex__comm_agree(c, &z->hb, r, fn)) != CAPEX_OK) { capex__zero_save_drop(z); goto done; } /* nothing points into it yet */
    /* every state buffer, bucket by bucket: shards packed, all-gathered, unpacked by rank 0 */
    for (what = 0; r == CAPEX_OK && what < 4; what++)
        for (k = 0; r == CAPEX_OK && k < z->nb; k++) {
            capex__zbucket *bk = &z->b[k];
            size_t lo = (size_t)c->rank * bk->shard;
            if (!bk->shard || (what == 0 && bk->dtype == CAPEX_F32)) continue; /* f32 params are the data */
            memset(pack, 0, sizeof(float) * bk->shard);
            for (j = 0; j < z->npieces; j++) {
                size_t i = z->piece_param[j], gi, ki;
                float *src;
                if (z->bucket_of[i] != k) continue;
                capex__zero_piece_pos(z, j, &gi, &ki);
                if (!(src = capex__zero_state_ptr(z->opt, gi, ki, what))) continue;
                memcpy(pack + (z->offset_of[i] + z->piece_start[j] - lo), src, sizeof(float) * (size_t)capex__zero_piece_numel(z, j));
            }
            /* every kind of every bucket, zeros where a piece has none: the same
               collectives on every rank without agreeing on anything first */
            if (!z->has_dev) r = capex_comm_allgatherv(c, pack, full, capex__zero_counts(z, bk->shard), CAPEX_F32);
            else if ((r = capex__comm_copy(c, dpack, pack, sizeof(float) * bk->shard, CAPEX_COPY_H2D)) == CAPEX_OK &&
                     (r = capex_comm_allgatherv(c, dpack, dfull, capex__zero_counts(z, bk->shard), CAPEX_F32)) == CAPEX_OK &&
                     root)
                r = capex__comm_copy(c, full, dfull, sizeof(float) * bk->shard * W, CAPEX_COPY_D2H);
            if (r != CAPEX_OK) { z->failed = 1; break; }
            for (j = 0; root && j < bk->count; j++) {
                size_t i = z->bparams[bk->first + j];
                float *dst = capex__zero_state_ptr(z->save_tmp, z->params[i].group, capex__zero_full_index(z, i), what);
                if (dst && z->params[i].numel) memcpy(dst, full + z->offset_of[i], sizeof(float) * z->params[i].numel);
            }
        }
    if (r == CAPEX_OK && z->opt->desc.kind == CAPEX_OPTIM_NOVOGRAD && z->np) {
        /* v, one float per param: from the rank holding the param's first element */
        double *vv = (double *)capex__alloc(NULL, sizeof(double) * z->np);
        if (!vv) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (j = 0; r == CAPEX_OK && j < z->np; j++) vv[j] = 0.0;
        for (j = 0; r == CAPEX_OK && j < z->npieces; j++)
            if (z->piece_start[j] == 0) vv[z->piece_param[j]] = (double)z->opt->novo_v[j];
        if (r == CAPEX_OK && W > 1 && !z->has_dev) r = capex_comm_allreduce(c, vv, vv, z->np, CAPEX_F64, CAPEX_REDUCE_SUM);
        if (r == CAPEX_OK && W > 1 && z->has_dev) { /* the collective on device memory */
            void *dv = NULL;
            if ((r = capex__comm_alloc(c, &dv, sizeof(double) * z->np)) == CAPEX_OK &&
                (r = capex__comm_copy(c, dv, vv, sizeof(double) * z->np, CAPEX_COPY_H2D)) == CAPEX_OK &&
                (r = capex_comm_allreduce(c, dv, dv, z->np, CAPEX_F64, CAPEX_REDUCE_SUM)) == CAPEX_OK)
                r = capex__comm_copy(c, vv, dv, sizeof(double) * z->np, CAPEX_COPY_D2H);
            capex__comm_free(c, dv);
        }
        for (j = 0; r == CAPEX_OK && root && j < z->np; j++)
            z->save_tmp->novo_v[z->full_pos[2 * j + 1]] = (float)vv[j];
        capex__free(NULL, vv);
        if (r != CAPEX_OK) z->failed = 1;
    }
    if (r == CAPEX_OK) z->save_synced = 1;
    if (r == CAPEX_OK && root) {
        capex_optim *t = z->save_tmp;
        for (g = 0; g < z->ngroups; g++) {
            t->groups[g].step = z->opt->groups[g].step;
            t->groups[g].mom_init = z->opt->groups[g].mom_init;
        }
        if (z->opt->has_sched) r = capex_optim_set_lr_schedule(t, &z->opt->sched);
        t->sched_iter = z->opt->sched_iter;
        if (r == CAPEX_OK) r = capex_optim_save(t, w, prefix, flags);
    }
    if (r == CAPEX_OK && c->rank == 0 && !w)
        r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: rank 0 needs a writer (other ranks may pass NULL)", fn);
done:
    capex__free(NULL, pack);
    capex__free(NULL, full);
    capex__comm_free(c, dpack);
    capex__comm_free(c, dfull);
    if (z->has_dev) { capex_optim_destroy(z->opt); z->opt = NULL; }
    return r;
}

/* Refills the flat parameter buffers from params[i].data and the fp32
   masters of this rank's half pieces from them (or, where `full_masters` is
   given, from those exact fp32 values). */
static capex_result capex__zero_refresh(capex_zero *z, const capex_optim *full) {
    size_t k, j;
    capex_result r = CAPEX_OK;
    for (k = 0; r == CAPEX_OK && k < z->nb; k++) {
        capex__zbucket *bk = &z->b[k];
        size_t es = capex_dtype_size(bk->dtype), lo = (size_t)z->comm->rank * bk->shard;
        for (j = 0; r == CAPEX_OK && j < bk->count; j++) {
            size_t i = z->bparams[bk->first + j];
            r = capex__comm_copy(z->comm, (char *)bk->param + z->offset_of[i] * es, z->params[i].data,
                                 z->params[i].numel * es, CAPEX_COPY_D2D);
        }
        if (r == CAPEX_OK && bk->master)
            r = capex__comm_convert(z->comm, bk->master, CAPEX_F32, (char *)bk->param + lo * es, bk->dtype, bk->shard);
    }
    for (j = 0; r == CAPEX_OK && full && j < z->npieces; j++) {
        size_t i = z->piece_param[j], k2 = z->bucket_of[i];
        const float *src;
        if (z->params[i].dtype == CAPEX_F32) continue;
        src = capex__zero_state_ptr(full, z->params[i].group, capex__zero_full_index(z, i), 0) + z->piece_start[j];
        r = capex__comm_copy(z->comm, z->b[k2].master + (z->offset_of[i] + z->piece_start[j] - (size_t)z->comm->rank * z->b[k2].shard),
                             src, sizeof(float) * (size_t)capex__zero_piece_numel(z, j), CAPEX_COPY_H2D);
    }
    return r;
}

/* The loaded unsharded state's pieces, steps, hparams and settings into z->opt. */
static void capex__zero_load_pieces(capex_zero *z, const capex_optim *full) {
    size_t j, g;
    int what;
    for (j = 0; j < z->npieces; j++) {
        size_t gi, ki, fi = capex__zero_full_index(z, z->piece_param[j]);
        capex__zero_piece_pos(z, j, &gi, &ki);
        if (z->opt->novo_v) z->opt->novo_v[j] = full->novo_v[full->groups[gi].first + fi];
        for (what = 1; what < 4; what++) {
            float *dst = capex__zero_state_ptr(z->opt, gi, ki, what);
            const float *src = capex__zero_state_ptr(full, gi, fi, what);
            if (dst && src) memcpy(dst, src + z->piece_start[j], sizeof(float) * (size_t)capex__zero_piece_numel(z, j));
        }
    }
    for (g = 0; g < z->ngroups; g++) {
        z->opt->groups[g].hp = full->groups[g].hp;
        z->opt->groups[g].step = full->groups[g].step;
        z->opt->groups[g].mom_init = full->groups[g].mom_init;
    }
    /* every optimizer-wide setting the file holds (the unsharded optimizer that
       loads this file steps with them; stochastic rounding keyed as its) */
    capex__optim_take_modes(&z->opt->desc, &full->desc);
    if (full->has_sched) {
        (void)capex_optim_set_lr_schedule(z->opt, &full->sched);
        z->opt->sched_iter = full->sched_iter;
    }
}

/* load, with `pre` a failure this rank already had (load_file's open; its
   message kept): every rank reads and checks into temporary storage, then
   one agreement, then every rank commits or none does. */
static capex_result capex__zero_load(capex_zero *z, capex_state_reader *rd, const char *prefix, unsigned flags,
                                     capex_result pre) {
    static const char *fn = "capex_zero_load";
    capex_optim *full = NULL;
    float *masters = NULL;
    unsigned char *host = NULL;
    size_t j, i;
    int params = (flags & CAPEX_OPTIM_STATE_PARAMS) != 0;
    char keep[sizeof capex__error_message];
    capex_result r;
    if (pre != CAPEX_OK) memcpy(keep, capex__error_message, sizeof keep);
    if ((r = capex__zero_check(z, fn)) != CAPEX_OK) return r; /* no comm to agree on */
    if ((r = capex_zero_wait_params(z)) != CAPEX_OK) return r;
    /* this rank's part, changing nothing: a failure is kept for the agreement */
    if (pre != CAPEX_OK) r = capex__fail(pre, "%s", keep);
    else if (!rd) r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: reader is NULL", fn);
    else r = capex__optim_flags_ok(flags, fn);
    if (r == CAPEX_OK) { /* stochastic rounding keys a piece by its element offset in 32 bits (create's
                            check), and the device zero has none */
        char nm[CAPEX__OPT_NAME_MAX];
        int64_t sr = 0;
        size_t big = 0;
        for (i = 0; i < z->np; i++) big |= (uint64_t)z->params[i].numel > 0xffffffffull;
        if ((z->has_dev || big) && capex__optim_name(nm, prefix ? prefix : "optim", "stochastic_rounding", 0, NULL) == CAPEX_OK &&
            capex_state_get_i64(rd, nm, &sr) == CAPEX_OK && sr)
            r = capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: the file's optimizer uses stochastic rounding, which %s", fn,
                            z->has_dev ? "the device zero does not support" : "sharding supports only for params under "
                            "2^32 elements");
    }
    if (r == CAPEX_OK && z->has_dev) r = z->dev.to_host(z->dev.user, 0, &z->opt);
    /* the whole state, read and checked by the full optimizer (capex_optim_load's
       checks) into its own buffers: with CAPEX_OPTIM_STATE_PARAMS host copies of
       the params' data, so an I/O error midway leaves the params as they were */
    if (r == CAPEX_OK) r = capex__zero_full_optim(z, params, &full, &masters, &host);
    if (r == CAPEX_OK) r = capex_optim_load(full, rd, prefix, flags);
    /* the device zero's z->opt is a host copy: filled and checked before the agreement */
    if (r == CAPEX_OK && z->has_dev) {
        capex__zero_load_pieces(z, full);
        if (z->dev.check_host) r = z->dev.check_host(z->dev.user, z->opt);
    }
    /* one small allreduce: every rank commits or none does */
    if ((r = capex__comm_agree(z->comm, &z->hb, r, fn)) != CAPEX_OK) goto done;
    /* commit. The host zero's copies cannot fail from here; the device zero's
       device copies can (a device error) */
    if (!z->has_dev) {
        z->opt->broken = 0;
        capex__zero_load_pieces(z, full);
    }
    if (z->has_dev) r = z->dev.from_host(z->dev.user, z->opt); /* the pieces' state to the device */
    /* the loaded params (host copies) to params[i].data */
    for (i = 0, j = 0; params && r == CAPEX_OK && i < z->np; i++) {
        size_t bytes = z->params[i].numel * capex_dtype_size(z->params[i].dtype);
        r = capex__comm_copy(z->comm, z->params[i].data, host + j, bytes, CAPEX_COPY_H2D);
        j += (bytes + 3) / 4 * 4;
    }
    if (r == CAPEX_OK) r = capex__zero_refresh(z, params ? full : NULL);
    if (r != CAPEX_OK) z->failed = 1; /* device error, half committed: refuse every later call */
done:
    capex_optim_destroy(full);
    capex__free(NULL, masters);
    capex__free(NULL, host);
    if (z->has_dev) { capex_optim_destroy(z->opt); z->opt = NULL; }
    return r;
}

CAPEX_API capex_result capex_zero_load(capex_zero *z, capex_state_reader *rd, const char *prefix, unsigned flags) {
    return capex__zero_load(z, rd, prefix, flags, CAPEX_OK);
}

/* save_file: rank 0's status after its write, to every rank: all return
   it, and none returns before the file is there (a load may follow). */
static capex_result capex__zero_save_status(capex_zero *z, capex_result r, const char *path) {
    capex_comm *c = z->comm;
    double v = (double)r;
    capex_result b = capex__comm_host(c, &z->hb, CAPEX__HOST_BROADCAST, NULL, &v, 1, CAPEX_F64, 0);
    if (b != CAPEX_OK) {
        z->failed = 1;
        return r != CAPEX_OK ? r : b;
    }
    if (c->rank != 0 && v != 0.0)
        return capex__fail((capex_result)(int)v, "capex_zero_save_file: rank 0 could not save '%s' (%s; its capex_last_error says why)",
                           path ? path : "(rank 0's path)", capex_result_string((capex_result)(int)v));
    return r;
}

CAPEX_API capex_result capex_zero_save_file(capex_zero *z, const char *path, unsigned flags) {
    capex_state_writer *w = NULL;
    capex_result r, wr = CAPEX_OK;
    char why[sizeof capex__error_message];
    /* path is rank 0's only (the others write nothing): a NULL one is refused
       by its write, after the collectives, so every rank gets that status
       instead of its peers waiting in the save's all-gathers. So is rank 0
       without memory for its writer: it takes part in the save without one */
    if (!z) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_zero_save_file: zero is NULL");
    if (z->comm->rank == 0 && (wr = capex_state_writer_create(NULL, &w)) != CAPEX_OK)
        memcpy(why, capex__error_message, sizeof why);
    z->save_synced = 0;
    r = capex_zero_save(z, w, NULL, flags);
    if (wr != CAPEX_OK && (r == CAPEX_OK || r == CAPEX_ERR_INVALID_ARG)) r = capex__fail(wr, "%s", why); /* not "needs a writer" */
    if (r == CAPEX_OK && w) r = capex_state_write_file(w, path);
    capex_state_writer_destroy(w);
    capex__zero_save_drop(z); /* written: rank 0 need not hold the whole state until the next save */
    if (z->save_synced && z->comm->world_size > 1) r = capex__zero_save_status(z, r, path);
    return r;
}

CAPEX_API capex_result capex_zero_load_file(capex_zero *z, const char *path, unsigned flags) {
    capex_state_reader *rd = NULL;
    capex_result r;
    if (!z) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_zero_load_file: zero is NULL");
    /* a NULL path or a file this rank cannot open still takes part in the agreement */
    if (!path) r = capex__fail(CAPEX_ERR_INVALID_ARG, "capex_zero_load_file: path is NULL");
    else r = capex_state_reader_open_file(path, 0, NULL, &rd);
    r = capex__zero_load(z, rd, NULL, flags, r);
    capex_state_reader_close(rd);
    return r;
}
#endif /* CAPEX_NO_STATE */

CAPEX_API capex_optim *capex_zero_optim(capex_zero *z) { return z ? z->opt : NULL; }

CAPEX_API capex_zero_memory capex_zero_memory_info(const capex_zero *z) {
    capex_zero_memory m;
    if (z) return z->mem;
    memset(&m, 0, sizeof m);
    return m;
}

#endif /* CAPEX_NO_DIST */

/* ---- data parallel: distributed sampler --------------------------------- */

CAPEX__PRIVATE uint64_t capex__mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A 6-round Feistel network on b bits (b even, 2^b < 4n) keyed by
   splitmix64(key), cycle-walked into [0, n): a bijection, O(1) per index, the
   same bits on every platform. Not torch.randperm's order (that needs
   PyTorch's Mersenne Twister and randperm algorithm), same semantics. */
CAPEX_API uint64_t capex_permute_index(uint64_t i, uint64_t n, uint64_t key) {
    unsigned bits = 2, half, r;
    uint64_t mask, x = i, k[6], s = key;
    if (n <= 1 || i >= n) return i;
    while (bits < 64 && ((uint64_t)1 << bits) < n) bits++;
    if (bits & 1) bits++;
    half = bits / 2;
    mask = half >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << half) - 1);
    for (r = 0; r < 6; r++) { s += 0x9e3779b97f4a7c15ull; k[r] = capex__mix64(s); }
    do {
        uint64_t L = (x >> half) & mask, R = x & mask;
        for (r = 0; r < 6; r++) {
            uint64_t F = capex__mix64(R ^ k[r]) & mask, nl = R;
            R = L ^ F;
            L = nl;
        }
        x = (L << half) | R;
    } while (x >= n);
    return x;
}

#define CAPEX__TAG_SAMPLER_DESC CAPEX__TAG('S', 'M', 'P', 'D')
CAPEX_API void capex_sampler_desc_init(capex_sampler_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_SAMPLER_DESC;
    d->num_replicas = 1;
    d->rank = 0;
    d->shuffle = 1;
    d->seed = 0;
    d->drop_last = 0;
}

/* Per-rank and padded sizes for d, with init's checks; fn names the caller. */
CAPEX__PRIVATE capex_result capex__sampler_shape(const capex_sampler_desc *d, const char *fn, uint64_t *num_samples) {
    uint64_t n, rr, ns;
    if (d->init_tag != CAPEX__TAG_SAMPLER_DESC)
        return capex__desc_check(d->init_tag, CAPEX__TAG_SAMPLER_DESC, fn, "capex_sampler_desc", "capex_sampler_desc_init");
    if (d->num_replicas < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: num_replicas %d must be >= 1", fn, d->num_replicas);
    if (d->rank < 0 || d->rank >= d->num_replicas) /* torch: "Invalid rank ..., rank should be in the interval" */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: invalid rank %d, rank should be in the interval [0, %d]", fn,
                           d->rank, d->num_replicas - 1);
    n = d->dataset_size;
    rr = (uint64_t)d->num_replicas;
    /* torch: drop_last and N % R != 0: ceil((N - R) / R) == floor(N / R);
       else ceil(N / R) */
    ns = d->drop_last ? n / rr : n / rr + (n % rr != 0);
    if (ns > UINT64_MAX / rr) /* the padded total (and rank + k * R) would wrap */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: dataset_size %llu padded to a multiple of %d overflows uint64; "
                           "set drop_last", fn, (unsigned long long)n, d->num_replicas);
    *num_samples = ns;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_sampler_init(capex_sampler *s, const capex_sampler_desc *d) {
    capex_sampler_desc dd;
    uint64_t ns = 0;
    capex_result r;
    if (!d) {
        if (s) memset(s, 0, sizeof *s);
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_init: NULL argument");
    }
    dd = *d; /* d may be &s->d */
    if (!s) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_init: NULL argument");
    memset(s, 0, sizeof *s); /* a failed init leaves a sampler that index/indices refuse */
    if ((r = capex__sampler_shape(&dd, "capex_sampler_init", &ns)) != CAPEX_OK) return r;
    s->d = dd;
    s->num_samples = ns;
    s->total_size = ns * (uint64_t)dd.num_replicas;
    return CAPEX_OK;
}

CAPEX_API void capex_sampler_set_epoch(capex_sampler *s, uint64_t epoch) {
    if (s) s->epoch = epoch;
}

/* The sampler as capex_sampler_init leaves it: its sizes still match its desc
   (a zeroed, failed or edited sampler is refused, never divided by 0). */
CAPEX__PRIVATE capex_result capex__sampler_ok(const capex_sampler *s, const char *fn) {
    uint64_t ns = 0;
    if (s->d.init_tag != CAPEX__TAG_SAMPLER_DESC || capex__sampler_shape(&s->d, fn, &ns) != CAPEX_OK ||
        s->num_samples != ns || s->total_size != ns * (uint64_t)s->d.num_replicas)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the sampler is not initialised, its capex_sampler_init failed, or "
                           "its fields were changed afterwards; call capex_sampler_init", fn);
    return CAPEX_OK;
}

/* k < num_samples of a checked sampler, so dataset_size > 0 */
CAPEX__PRIVATE uint64_t capex__sampler_at(const capex_sampler *s, uint64_t k) {
    uint64_t n = s->d.dataset_size;
    /* indices[rank : total_size : R]; positions past N repeat the start */
    uint64_t j = ((uint64_t)s->d.rank + k * (uint64_t)s->d.num_replicas) % n;
    return s->d.shuffle ? capex_permute_index(j, n, s->d.seed + s->epoch) : j;
}

CAPEX_API capex_result capex_sampler_index(const capex_sampler *s, uint64_t k, uint64_t *index) {
    capex_result r;
    if (!s || !index) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_index: NULL argument");
    if ((r = capex__sampler_ok(s, "capex_sampler_index")) != CAPEX_OK) return r;
    if (k >= s->num_samples)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_index: k=%llu but this rank has %llu samples",
                           (unsigned long long)k, (unsigned long long)s->num_samples);
    *index = capex__sampler_at(s, k);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_sampler_indices(const capex_sampler *s, uint64_t *out, size_t cap) {
    uint64_t k;
    capex_result r;
    if (!s) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_indices: NULL argument");
    if ((r = capex__sampler_ok(s, "capex_sampler_indices")) != CAPEX_OK) return r;
    if (!out && s->num_samples) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_indices: NULL argument");
    if ((uint64_t)cap < s->num_samples)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "capex_sampler_indices: room for %lu indices, need num_samples=%llu",
                           (unsigned long)cap, (unsigned long long)s->num_samples);
    for (k = 0; k < s->num_samples; k++) out[k] = capex__sampler_at(s, k);
    return CAPEX_OK;
}

/* ==== LayerNorm/RMSNorm/BatchNorm/SyncBatchNorm: implementation ==== */
/* ---- norms -----------------------------------------------------------------

   Layout: the per-element math (Welford update, Chan's merge, rstd, the
   forward and backward formulas) lives ONCE in CAPEX__NORM_MATH below: it
   expands to `static inline` C here and, stringified, to the
   `__device__ __forceinline__` source of capex_cuda.h's norm kernels
   (capex__norm_math_cuda), so the CPU tests vouch for the GPU math.
   Reductions differ in order between CPU (16 or 8 f32 lanes per row, each
   flushed into a double every 64 rounds; column sums in f32 over at most 64
   rows of a block, then in double) and GPU (a warp or block per row), so
   results agree to rounding, not in bits.

   Welford (1962) per lane: d = x - mean; mean += d * (1/n); m2 += d * (x - mean)
   (1/n once per step for all lanes: a multiply, not a divide, on the chain).
   Chan et al. (1979) merge of (na, ma, qa) and (nb, mb, qb):
   n = na + nb; d = mb - ma; ma += d * nb / n; qa += qb + d^2 * na * nb / n; an empty
   (nb = 0) side is skipped, not multiplied by 0: d^2 overflows past |d| ~ 1.8e19.
   LayerNorm backward, xhat = (x - mean) * rstd, g = dy * w:
   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); RMSNorm drops mean(g).
   Memory-efficient (from y): xhat = (y - b) / w, g * xhat = dy * (y - b).
   BatchNorm backward (PyTorch batch_norm_backward_elemt):
   dx = (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu) * invstd * w. */
#define CAPEX__NORM_MATH(Q)                                                                    \
    Q void capex__nm_welford(float x, float inv_n, float *mean, float *m2) {                   \
        float d = x - *mean;                                                                   \
        *mean = *mean + d * inv_n;                                                             \
        *m2 = *m2 + d * (x - *mean);                                                           \
    }                                                                                          \
    Q void capex__nm_chan(float *na, float *ma, float *qa, float nb, float mb, float qb) {      \
        float n = *na + nb, d = mb - *ma, f;                                                   \
        if (nb == 0.0f) return; /* empty side: d * d * 0 is NaN where d * d overflows */       \
        f = nb / n;                                                                            \
        *ma = *ma + d * f;                                                                     \
        *qa = *qa + qb + d * d * *na * f;                                                      \
        *na = n;                                                                               \
    }                                                                                          \
    Q float capex__nm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }          \
    Q float capex__nm_ln_y(float x, float mean, float rstd, float w, float b) {                \
        return (x - mean) * rstd * w + b;                                                      \
    }                                                                                          \
    Q float capex__nm_rms_y(float x, float rstd, float w) { return x * rstd * w; }            \
    Q float capex__nm_me_xhat(float y, float w, float b) { return (y - b) / w; }              \
    Q float capex__nm_ln_dx(float g, float xhat, float mean_g, float mean_gx, float rstd) {    \
        return rstd * ((g - mean_g) - xhat * mean_gx);                                         \
    }                                                                                          \
    Q float capex__nm_bn_dx(float dy, float xmu, float invstd, float w, float mean_dy,         \
                            float mean_dy_xmu) {                                               \
        return ((dy - mean_dy) - xmu * (invstd * invstd) * mean_dy_xmu) * (invstd * w);        \
    }

CAPEX__NORM_MATH(static inline)

/* The same math as CUDA source for capex_cuda.h (one literal < 4095 chars). */
CAPEX__PRIVATE const char *capex__norm_math_cuda(void) {
    return "#define CAPEX__NQ __device__ __forceinline__\n" CAPEX__OPT_XSTR(CAPEX__NORM_MATH(CAPEX__NQ)) "\n";
}

#ifdef _OPENMP
#  ifdef __cplusplus
}
#  endif
#  include <omp.h>
#  ifdef __cplusplus
extern "C" {
#  endif
#endif

#define CAPEX__TAG_NORM_DESC CAPEX__TAG('N', 'R', 'M', 'D')
CAPEX_API void capex_norm_desc_init(capex_norm_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_NORM_DESC;
    d->eps = 1e-5f;
}
#define CAPEX__TAG_NORM_ARGS CAPEX__TAG('N', 'R', 'M', 'A')
CAPEX_API void capex_norm_args_init(capex_norm_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->init_tag = CAPEX__TAG_NORM_ARGS;
    a->x_dtype = a->y_dtype = a->param_dtype = CAPEX_F32;
}
#define CAPEX__TAG_BATCH_NORM_DESC CAPEX__TAG('B', 'N', 'R', 'D')
CAPEX_API void capex_batch_norm_desc_init(capex_batch_norm_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_BATCH_NORM_DESC;
    d->eps = 1e-5f;
    d->momentum = 0.1f;
    d->training = 1;
}
#define CAPEX__TAG_BATCH_NORM_ARGS CAPEX__TAG('B', 'N', 'R', 'A')
CAPEX_API void capex_batch_norm_args_init(capex_batch_norm_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->init_tag = CAPEX__TAG_BATCH_NORM_ARGS;
    a->x_dtype = a->y_dtype = a->param_dtype = CAPEX_F32;
    a->layout = CAPEX_BN_NCS;
}

/* ---- shared helpers ---- */

/* Workers: items [0, n) split into T contiguous ranges, worker w owning
   scratch + w * per. Work (elements) below 32768 stays on this thread. */
typedef void (*capex__nm_work_fn)(void *ctx, int64_t begin, int64_t end, float *scratch);

static int capex__nm_threads(int req, int64_t items, int64_t work) {
#ifdef _OPENMP
    int t = req > 0 ? req : omp_get_max_threads();
    if (work < 32768) t = 1;
    if ((int64_t)t > items) t = (int)items;
    return t < 1 ? 1 : t;
#else
    (void)req; (void)items; (void)work;
    return 1;
#endif
}

static void capex__nm_run(int T, int64_t items, capex__nm_work_fn fn, void *ctx, float *scratch, size_t per) {
    int w;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
#endif
    for (w = 0; w < T; w++) {
        int64_t b = (int64_t)((double)items * w / T), e = (int64_t)((double)items * (w + 1) / T);
        if (w == T - 1) e = items;
        fn(ctx, b, e, scratch ? scratch + per * (size_t)w : NULL);
    }
}

/* Row p[off, off+n) as f32: the data itself for f32, else converted into buf. */
static const float *capex__nm_load(const void *p, capex_dtype t, int64_t off, int64_t n, float *buf) {
    int64_t i;
    const uint16_t *h = (const uint16_t *)p + off;
    if (t == CAPEX_F32) return (const float *)p + off;
    if (t == CAPEX_F16) { capex__f16_load_n(h, buf, (size_t)n); } /* F16C where present */
    else { for (i = 0; i < n; i++) buf[i] = capex__b16_load(h[i]); }
    return buf;
}
/* Where to compute an output row: in place for f32, else in buf (then store). */
static float *capex__nm_out(void *p, capex_dtype t, int64_t off, float *buf) {
    return t == CAPEX_F32 ? (float *)p + off : buf;
}
static void capex__nm_store(void *p, capex_dtype t, int64_t off, int64_t n, const float *v) {
    int64_t i;
    uint16_t *h = (uint16_t *)p + off;
    if (t == CAPEX_F32) return; /* computed in place */
    if (t == CAPEX_F16) { capex__f16_store_n(v, h, (size_t)n); }
    else { for (i = 0; i < n; i++) h[i] = (uint16_t)capex__b16_store(v[i]); }
}
static void capex__nm_store_one(void *p, capex_dtype t, int64_t i, float v) {
    if (t == CAPEX_F32) ((float *)p)[i] = v;
    else if (t == CAPEX_F16) ((uint16_t *)p)[i] = (uint16_t)capex__h16_store(v);
    else ((uint16_t *)p)[i] = (uint16_t)capex__b16_store(v);
}

/* Blocks for the long row reductions below: each f32 lane chain runs
   CAPEX__NM_BLK rounds, then is flushed into a double per lane. One f32 chain
   per lane over a whole row lost up to 1.4e-4 relative at 2^20 columns of
   nearly equal values (every add rounds the same way: RMSNorm's rstd 7e-5 off,
   LayerNorm backward's dx 9e-4); chains of 64 stay within a few ulp, like
   torch's cascade sums.
   The order depends on n alone: the same bits for any thread count and in the
   vector and plain loops. */
#define CAPEX__NM_BLK 64
/* Chan's merge (as capex__nm_chan) in double, for the lanes' running totals. */
static void capex__nm_chan_d(double *na, double *ma, double *qa, double nb, double mb, double qb) {
    double n = *na + nb, d = mb - *ma, f;
    if (nb == 0.0) return;
    f = nb == *na ? 0.5 : nb / n; /* equal counts: exactly nb / n, without the divide's latency */
    *ma += d * f;
    *qa += qb + d * d * *na * f;
    *na = n;
}

/* Mean and biased variance of x[0, n) (n >= 1): Welford in 16 f32 lanes (lane
   l takes elements l, l+16, ...: 16 independent chains hide the latency),
   restarted every CAPEX__NM_BLK rounds and merged (Chan) into one double per
   lane; the 16 lanes then merged by Chan in a fixed tree. Welford runs on
   x - x0 (shifted data; the GPU kernels too) and *mean_s is the mean of
   x - x0: on a large mean over a small spread (1e4 + 1e-2 noise) a chain's
   d / n falls below half an ulp of the mean, which then stops moving (rstd
   was 1-4% off); the shifted mean stays near the noise, and a caller merging
   several pieces keeps it unrounded (x0 + mean_s in f32 would round it to the
   mean's ulp). */
#define CAPEX__NM_LANES 16
static void capex__nm_row_stats(const float *x, int64_t n, float x0, float *mean_s, float *var) {
    float mu[CAPEX__NM_LANES], q[CAPEX__NM_LANES];
    double dm[CAPEX__NM_LANES], dq[CAPEX__NM_LANES], dn[CAPEX__NM_LANES], m = 0.0;
    int64_t K = n / CAPEX__NM_LANES, k = 0, k0, k1;
    int l, r = (int)(n % CAPEX__NM_LANES), s;
    for (l = 0; l < CAPEX__NM_LANES; l++) { dm[l] = 0.0; dq[l] = 0.0; }
    while (k < K) {
        double f;
        k0 = k;
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;
        for (l = 0; l < CAPEX__NM_LANES; l++) { mu[l] = 0.0f; q[l] = 0.0f; }
        for (; k < k1; k++) {
            const float inv = 1.0f / (float)(k - k0 + 1);
            const float *xk = x + CAPEX__NM_LANES * k;
            for (l = 0; l < CAPEX__NM_LANES; l++) capex__nm_welford(xk[l] - x0, inv, &mu[l], &q[l]);
        }
        /* every lane has m rounds before and k1 - k0 in this block: one f for all */
        f = (double)(k1 - k0) / (m + (double)(k1 - k0));
        for (l = 0; l < CAPEX__NM_LANES; l++) {
            double d = (double)mu[l] - dm[l];
            dm[l] += d * f;
            dq[l] += (double)q[l] + d * d * m * f;
        }
        m += (double)(k1 - k0);
    }
    for (l = 0; l < CAPEX__NM_LANES; l++) dn[l] = m;
    for (l = 0; l < r; l++) /* the tail: one value more in lanes 0..r-1 */
        capex__nm_chan_d(&dn[l], &dm[l], &dq[l], 1.0, (double)(x[CAPEX__NM_LANES * K + l] - x0), 0.0);
    for (s = 1; s < CAPEX__NM_LANES; s *= 2)
        for (l = 0; l < CAPEX__NM_LANES; l += 2 * s)
            capex__nm_chan_d(&dn[l], &dm[l], &dq[l], dn[l + s], dm[l + s], dq[l + s]);
    *mean_s = (float)dm[0];
    *var = (float)(dq[0] / (double)n);
}

/* Long row sums (RMSNorm's sum of squares, the backward's row dots): element
   i goes to f32 lane i%8 (8 independent chains, one 8-float vector), each
   lane flushed into its own double every CAPEX__NM_BLK rounds (512 elements);
   the n % 8 tail goes straight into the doubles, which meet in a fixed tree. */
static float capex__nm_tree8(const double *d) {
    return (float)(((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7])));
}
/* With GCC/clang the 8 lanes are one 8-float vector (the vectorisers
   otherwise either stay scalar or shuffle 16-wide on AVX-512); lane by lane
   the operations are those of the plain loop. */
#if defined(__GNUC__) || defined(__clang__)
typedef float capex__v8f __attribute__((vector_size(32))); /* locals only: no ABI question */
typedef double capex__v4d __attribute__((vector_size(32)));
/* A product kept from being contracted into the sum it goes to: under
   -ffp-contract=fast GCC's FMA heuristics (znver tuning: no FMA chains in
   reductions) fused g * xhat into the backward's sum in one output set's loop
   and not in another's, so dx with dweight asked and dx alone differed in
   bits. The row sums never fuse: the same bits from every loop, tuning and
   target, even where the FP_CONTRACT pragma above is ignored (clang
   -ffp-contract=fast). An empty asm that claims to change v in a register:
   x86 (only AVX has FMA; a 32-byte vector is one register), aarch64 (FMA
   always; two 16-byte halves, "w": a SIMD register); elsewhere a round trip
   through memory ("+m", slower, any target). */
#if defined(__AVX__) && (defined(__x86_64__) || defined(__i386__))
#define CAPEX__NM_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define CAPEX__NM_OPAQUE(v) (void)0 /* no FMA without AVX */
#elif defined(__aarch64__)
typedef float capex__v4f __attribute__((vector_size(16)));
#define CAPEX__NM_OPAQUE(v)                                                                             \
    do {                                                                                                \
        capex__v4f lo_ = {(v)[0], (v)[1], (v)[2], (v)[3]}, hi_ = {(v)[4], (v)[5], (v)[6], (v)[7]};      \
        __asm__("" : "+w"(lo_), "+w"(hi_));                                                             \
        capex__v8f v_ = {lo_[0], lo_[1], lo_[2], lo_[3], hi_[0], hi_[1], hi_[2], hi_[3]};               \
        (v) = v_;                                                                                       \
    } while (0)
#else
#define CAPEX__NM_OPAQUE(v) __asm__("" : "+m"(v))
#endif
/* d[0..3] += (double)v[0..3], d[4..7] += (double)v[4..7]: the plain loop's flush, in
   two vector converts and adds (lane by lane the same operations). */
#define CAPEX__NM_FLUSH(dlo, dhi, v)                                              \
    do {                                                                          \
        capex__v4d lo_ = {(v)[0], (v)[1], (v)[2], (v)[3]}, hi_ = {(v)[4], (v)[5], (v)[6], (v)[7]}; \
        (dlo) += lo_;                                                             \
        (dhi) += hi_;                                                             \
    } while (0)
#endif
/* Sum of a[i]*b[i] (b NULL: of a[i]). */
static float capex__nm_dot(const float *a, const float *b, int64_t n) {
    double d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t K = n / 8, k = 0, k1;
    int l;
#if defined(__GNUC__) || defined(__clang__)
    capex__v4d dlo = {0, 0, 0, 0}, dhi = {0, 0, 0, 0};
    while (k < K) { /* whole blocks of up to CAPEX__NM_BLK rounds, then the tail alone */
        capex__v8f sv = {0, 0, 0, 0, 0, 0, 0, 0}, av, bv;
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;
        if (b) {
            for (; k < k1; k++) {
                memcpy(&av, a + 8 * k, sizeof av); memcpy(&bv, b + 8 * k, sizeof bv);
                av = av * bv;
                CAPEX__NM_OPAQUE(av);
                sv += av;
            }
        } else {
            for (; k < k1; k++) { memcpy(&av, a + 8 * k, sizeof av); sv += av; }
        }
        CAPEX__NM_FLUSH(dlo, dhi, sv);
    }
    memcpy(d, &dlo, sizeof dlo);
    memcpy(d + 4, &dhi, sizeof dhi);
#else
    while (k < K) {
        float s[8];
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;
        for (l = 0; l < 8; l++) s[l] = 0.0f;
        if (b) { /* the product its own statement: ISO C contracts only within one expression */
            for (; k < k1; k++) for (l = 0; l < 8; l++) { const float p = a[8 * k + l] * b[8 * k + l]; s[l] += p; }
        }
        else { for (; k < k1; k++) for (l = 0; l < 8; l++) s[l] += a[8 * k + l]; }
        for (l = 0; l < 8; l++) d[l] += (double)s[l];
    }
#endif
    for (l = 0; l < (int)(n % 8); l++) d[l] += (double)(b ? a[8 * K + l] * b[8 * K + l] : a[8 * K + l]);
    return capex__nm_tree8(d);
}

/* LayerNorm/RMSNorm backward of one row in two passes over x and dy (RMSNorm:
   mean 0). Pass 1: xhat = (x-mean)*rstd and g = dy*w, the dweight / dbias
   partials (pw, pb: each may be NULL), and sum(g), sum(g*xhat) in the 8
   lanes, blocks and tree of capex__nm_dot; pass 2 (capex__nm_bwd_dx)
   recomputes xhat and g (the same operations, the same values) for dx. The 8
   lanes are one vector as in capex__nm_dot. UPD: the partials' update of one
   8-vector (one loop per case, no branch inside). Parameters, not locals,
   carry restrict: GCC ignores it on local pointers. */
#if defined(__GNUC__) || defined(__clang__)
#define CAPEX__NM_BWD_LOOP(UPD)                                                                         \
    while (k < K) { /* blocks of CAPEX__NM_BLK rounds flushed into double lanes, as capex__nm_dot */    \
        capex__v8f sv = {0, 0, 0, 0, 0, 0, 0, 0}, tv = {0, 0, 0, 0, 0, 0, 0, 0}, xv, d, w;               \
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;                                              \
        for (; k < k1; k++) {                                                                           \
            memcpy(&xv, x + 8 * k, sizeof xv); memcpy(&d, dy + 8 * k, sizeof d); memcpy(&w, wf + 8 * k, sizeof w); \
            xv = (xv - mv) * rv;                                                                        \
            UPD                                                                                         \
            w = d * w; /* g */                                                                          \
            sv += w;                                                                                    \
            w = w * xv;                                                                                 \
            CAPEX__NM_OPAQUE(w);                                                                        \
            tv += w;                                                                                    \
        }                                                                                               \
        CAPEX__NM_FLUSH(slo, shi, sv);                                                                  \
        CAPEX__NM_FLUSH(tlo, thi, tv);                                                                  \
    }
#define CAPEX__NM_BWD_PW { capex__v8f a_; memcpy(&a_, pw + 8 * k, sizeof a_); a_ += d * xv; memcpy(pw + 8 * k, &a_, sizeof a_); }
#define CAPEX__NM_BWD_PB { capex__v8f b_; memcpy(&b_, pb + 8 * k, sizeof b_); b_ += d; memcpy(pb + 8 * k, &b_, sizeof b_); }
#endif
static void capex__nm_bwd_pass(const float *CAPEX__OPT_RESTRICT x, const float *CAPEX__OPT_RESTRICT dy,
                               const float *CAPEX__OPT_RESTRICT wf, float *CAPEX__OPT_RESTRICT pw,
                               float *CAPEX__OPT_RESTRICT pb, float mean, float rstd, int64_t n, float *sg,
                               float *sgx) {
    double ds[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t K = n / 8, k = 0, k1, i;
    int l;
#if defined(__GNUC__) || defined(__clang__)
    {
        const capex__v8f mv = {mean, mean, mean, mean, mean, mean, mean, mean};
        const capex__v8f rv = {rstd, rstd, rstd, rstd, rstd, rstd, rstd, rstd};
        capex__v4d slo = {0, 0, 0, 0}, shi = {0, 0, 0, 0}, tlo = {0, 0, 0, 0}, thi = {0, 0, 0, 0};
        if (pw && pb) { CAPEX__NM_BWD_LOOP(CAPEX__NM_BWD_PW CAPEX__NM_BWD_PB) }
        else if (pw) { CAPEX__NM_BWD_LOOP(CAPEX__NM_BWD_PW) }
        else if (pb) { CAPEX__NM_BWD_LOOP(CAPEX__NM_BWD_PB) }
        else { CAPEX__NM_BWD_LOOP(;) }
        memcpy(ds, &slo, sizeof slo); memcpy(ds + 4, &shi, sizeof shi);
        memcpy(dt, &tlo, sizeof tlo); memcpy(dt + 4, &thi, sizeof thi);
    }
#else
    while (k < K) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;
        for (; k < k1; k++)
            for (l = 0; l < 8; l++) {
                float xv, d, gv;
                i = 8 * k + l;
                xv = (x[i] - mean) * rstd; d = dy[i]; gv = d * wf[i];
                if (pw) pw[i] += d * xv;
                if (pb) pb[i] += d;
                s[l] += gv; gv *= xv; t[l] += gv; /* unfused, as capex__nm_dot's */
            }
        for (l = 0; l < 8; l++) { ds[l] += (double)s[l]; dt[l] += (double)t[l]; }
    }
#endif
    for (l = 0; l < (int)(n % 8); l++) { /* the tail: one more value in lanes 0..n%8-1 */
        float xv, d, gv;
        i = 8 * K + l;
        xv = (x[i] - mean) * rstd; d = dy[i]; gv = d * wf[i];
        if (pw) pw[i] += d * xv;
        if (pb) pb[i] += d;
        ds[l] += (double)gv; dt[l] += (double)(gv * xv);
    }
    *sg = capex__nm_tree8(ds);
    *sgx = capex__nm_tree8(dt);
}
/* The partials alone (no dx): pass 1's updates of pw / pb, the same
   operations on the same lanes (the same bits), without its row sums (bf16
   rows of 1024: 0.80 -> 0.68 ms with dweight and dbias). */
static void capex__nm_bwd_params(const float *CAPEX__OPT_RESTRICT x, const float *CAPEX__OPT_RESTRICT dy,
                                 float *CAPEX__OPT_RESTRICT pw, float *CAPEX__OPT_RESTRICT pb, float mean, float rstd,
                                 int64_t n) {
    const int64_t K = n / 8;
    int64_t i;
#if defined(__GNUC__) || defined(__clang__)
    const capex__v8f mv = {mean, mean, mean, mean, mean, mean, mean, mean};
    const capex__v8f rv = {rstd, rstd, rstd, rstd, rstd, rstd, rstd, rstd};
    capex__v8f xv, d;
    int64_t k;
#define CAPEX__NM_PARAMS_LOOP(UPD)                                                                      \
    for (k = 0; k < K; k++) {                                                                           \
        memcpy(&xv, x + 8 * k, sizeof xv); memcpy(&d, dy + 8 * k, sizeof d);                            \
        xv = (xv - mv) * rv;                                                                            \
        UPD                                                                                             \
    }
    if (pw && pb) { CAPEX__NM_PARAMS_LOOP(CAPEX__NM_BWD_PW CAPEX__NM_BWD_PB) }
    else if (pw) { CAPEX__NM_PARAMS_LOOP(CAPEX__NM_BWD_PW) }
    else if (pb) { for (k = 0; k < K; k++) { memcpy(&d, dy + 8 * k, sizeof d); CAPEX__NM_BWD_PB } }
#undef CAPEX__NM_PARAMS_LOOP
#else
    for (i = 0; i < 8 * K; i++) {
        const float xv = (x[i] - mean) * rstd, d = dy[i];
        if (pw) pw[i] += d * xv;
        if (pb) pb[i] += d;
    }
#endif
    for (i = 8 * K; i < n; i++) { /* the tail, as pass 1's */
        const float xv = (x[i] - mean) * rstd, d = dy[i];
        if (pw) pw[i] += d * xv;
        if (pb) pb[i] += d;
    }
}
/* Column sums (dweight, dbias, BatchNorm channels-last) run in f32 partial
   rows per block of rows. A block of more than CAPEX__NM_BLK rows (calls of
   more than 4096 rows) adds its partial row into a double row every
   CAPEX__NM_BLK rows and restarts it, and ends with the double row rounded
   into it: one f32 chain over a block of 16384 rows (2^20 rows) was up to
   3.7e-6 relative off. Blocks of at most CAPEX__NM_BLK rows keep the plain
   f32 partial (no extra traffic; the bits they always had). */
static void capex__nm_flush_cols(double *CAPEX__OPT_RESTRICT d, float *CAPEX__OPT_RESTRICT f, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) { d[i] += (double)f[i]; f[i] = 0.0f; }
}
static void capex__nm_round_cols(float *CAPEX__OPT_RESTRICT f, const double *CAPEX__OPT_RESTRICT d, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) f[i] = (float)d[i];
}
/* dx of one row, xhat given as XH(index) (LayerNorm/RMSNorm from x, or the
   memory-efficient backward from y). stream: non-temporal 16-byte stores
   (SSE, part of x86-64) for an f32 dx too large to stay cached: a plain store
   first reads the line it writes (write-allocate), a third more memory
   traffic in a pass that reads x and dy and writes dx. Values are computed as
   in the plain loop (into t[], then copied), so the bits do not depend on the
   path. */
#ifdef CAPEX__F16C
#define CAPEX__NM_DX_STREAM(XH)                                                                         \
    if (stream) {                                                                                       \
        float t[64];                                                                                    \
        int j;                                                                                          \
        for (; i < n && ((uintptr_t)(dx + i) & 15) != 0; i++) /* up to the first 16-byte boundary */    \
            dx[i] = capex__nm_ln_dx(dy[i] * wf[i], XH(i), mg, mgx, rstd);                              \
        for (; i + 64 <= n; i += 64) {                                                                  \
            for (j = 0; j < 64; j++) t[j] = capex__nm_ln_dx(dy[i + j] * wf[i + j], XH(i + j), mg, mgx, rstd); \
            for (j = 0; j < 64; j += 4) _mm_stream_ps(dx + i + j, _mm_loadu_ps(t + j));                \
        }                                                                                               \
    }
#else
#define CAPEX__NM_DX_STREAM(XH) (void)stream;
#endif
#define CAPEX__NM_DX_LOOP(XH)                                                                           \
    CAPEX__NM_DX_STREAM(XH)                                                                             \
    for (; i < n; i++) dx[i] = capex__nm_ln_dx(dy[i] * wf[i], XH(i), mg, mgx, rstd);
#define CAPEX__NM_LN_XHAT(j) ((x[j] - mean) * rstd)
static void capex__nm_bwd_dx(const float *CAPEX__OPT_RESTRICT x, const float *CAPEX__OPT_RESTRICT dy,
                             const float *CAPEX__OPT_RESTRICT wf, float *CAPEX__OPT_RESTRICT dx, float mean, float rstd,
                             float mg, float mgx, int64_t n, int stream) {
    int64_t i = 0;
    CAPEX__NM_DX_LOOP(CAPEX__NM_LN_XHAT)
}

static int capex__nm_dtype_ok(capex_dtype t) { return t == CAPEX_F32 || t == CAPEX_F16 || t == CAPEX_BF16; }
static int capex__nm_aligned(const void *p, capex_dtype t) {
    return ((uintptr_t)p % capex_dtype_size(t)) == 0;
}
/* A named pointer: must be non-NULL when required, aligned when given. */
static capex_result capex__nm_ptr(const char *fn, const char *name, const void *p, capex_dtype t, int required) {
    if (!p) {
        if (required) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s is NULL; pass the buffer", fn, name);
        return CAPEX_OK;
    }
    if (!capex__nm_aligned(p, t))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s is not aligned to its %s element size", fn, name,
                           capex_dtype_name(t));
    return CAPEX_OK;
}
/* The aliasing rule of every norm call (CPU and GPU): an output may share no
   byte with an input or another output, except forward y == x exactly with
   x_dtype == y_dtype (in place). Forward reads a whole row (LayerNorm/RMSNorm)
   or all of x (BatchNorm's statistics pass) before writing any of y, and each
   y element is computed from the x element at its own index only: in place
   is safe there and nowhere else (partly overlapping rows race across threads;
   the GPU backward re-reads dy and x for dweight after dx is written). Only
   buffers the call reads or writes take part: [p, p + bytes), end clamped
   against wrap. */
typedef struct capex__nm_buf {
    const char *name;
    uint64_t p, bytes;
    int out, in_place; /* in_place: y or x of a same-dtype forward */
} capex__nm_buf;
CAPEX__PRIVATE void capex__nm_buf_bytes(capex__nm_buf *b, int *n, const char *name, uint64_t p, uint64_t bytes, int out,
                                        int in_place) {
    if (!p || !bytes) return; /* absent or empty: shares no byte */
    b[*n].name = name; b[*n].p = p; b[*n].bytes = bytes; b[*n].out = out; b[*n].in_place = in_place;
    ++*n;
}
static void capex__nm_buf_add(capex__nm_buf *b, int *n, const char *name, const void *p, int64_t count, capex_dtype t,
                              int out, int in_place) {
    if (count > 0) /* counts checked by the caller: count * 4 does not wrap */
        capex__nm_buf_bytes(b, n, name, (uint64_t)(uintptr_t)p, (uint64_t)count * capex_dtype_size(t), out, in_place);
}
CAPEX__PRIVATE capex_result capex__nm_overlap(const char *fn, const capex__nm_buf *b, int n) {
    int i, j;
    for (i = 0; i < n; i++) {
        uint64_t ei = b[i].p > UINT64_MAX - b[i].bytes ? UINT64_MAX : b[i].p + b[i].bytes;
        if (!b[i].out) continue;
        for (j = 0; j < n; j++) {
            uint64_t ej = b[j].p > UINT64_MAX - b[j].bytes ? UINT64_MAX : b[j].p + b[j].bytes;
            if (j == i || (b[j].out && j < i)) continue; /* each pair of outputs once */
            if (b[i].p >= ej || b[j].p >= ei) continue;
            if (b[i].in_place && b[j].in_place && b[i].p == b[j].p && b[i].bytes == b[j].bytes) continue;
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s [0x%llx, +%llu bytes) overlaps %s [0x%llx, +%llu bytes); "
                               "outputs may share no memory with an input or another output (only forward y == x "
                               "with x_dtype == y_dtype runs in place)", fn, b[i].name, (unsigned long long)b[i].p,
                               (unsigned long long)b[i].bytes, b[j].name, (unsigned long long)b[j].p,
                               (unsigned long long)b[j].bytes);
        }
    }
    return CAPEX_OK;
}
/* Row p[off, off+n) as f32, always a copy in buf: in place (y == x, f32) the
   output row is then computed over memory no restrict pointer reads. */
static const float *capex__nm_load_copy(const void *p, capex_dtype t, int64_t off, int64_t n, float *buf) {
    if (t == CAPEX_F32) { memcpy(buf, (const float *)p + off, (size_t)n * sizeof(float)); return buf; }
    return capex__nm_load(p, t, off, n, buf);
}

/* Params as f32 arrays (weight 1 and bias 0 when absent) in buf[2 * n]. */
static void capex__nm_params(const void *w, const void *b, capex_dtype t, int64_t n, float *buf, const float **wf,
                             const float **bf) {
    int64_t i;
    if (w) *wf = capex__nm_load(w, t, 0, n, buf);
    else { for (i = 0; i < n; i++) buf[i] = 1.0f; *wf = buf; }
    if (b) *bf = capex__nm_load(b, t, 0, n, buf + n);
    else { for (i = 0; i < n; i++) buf[n + i] = 0.0f; *bf = buf + n; }
}

/* ---- LayerNorm / RMSNorm ---- */

typedef struct capex__nm_ctx {
    const capex_norm_args *a;
    float eps;
    int rms;
    const float *wf, *bf;   /* params as f32 (1 / 0 when absent) */
    float *pw, *pb;         /* backward: per-block partial dweight / dbias [nblk][n], or NULL */
    int64_t brows;          /* backward: rows per block */
    int stream_dx;          /* backward: f32 dx of >= CAPEX__NM_STREAM_BYTES, non-temporal stores */
    int in_place;           /* forward y == x: each row read from a copy */
    int me;                 /* backward memory_efficient: rows of y, xhat = (y - b) / w */
} capex__nm_ctx;
/* dx at least this large is written with non-temporal stores: a quarter of a
   typical server L3 and far past any L2; LayerNorm backward reads twice as
   many bytes of x and dy as it writes, so a dx this size would mostly be
   evicted before the next layer reads it anyway. */
#define CAPEX__NM_STREAM_BYTES ((int64_t)8 << 20)

/* ws, ws_bytes: the GPU backward's workspace (an output), else 0. */
CAPEX__PRIVATE capex_result capex__nm_check_ws(const char *fn, const capex_norm_desc *d, const capex_norm_args *a, int rms,
                                               int bwd, uint64_t ws, uint64_t ws_bytes) {
    capex_result r;
    capex__nm_buf bl[9];
    int need = a && a->rows > 0, nb = 0;
    int64_t rc;
    if (!a) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: args is NULL", fn);
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_NORM_DESC, fn, "capex_norm_desc", "capex_norm_desc_init")) !=
            CAPEX_OK ||
        (r = capex__desc_check(a->init_tag, CAPEX__TAG_NORM_ARGS, fn, "capex_norm_args", "capex_norm_args_init")) !=
            CAPEX_OK)
        return r;
    if (!(d->eps >= 0.0f) || d->eps > 3.4e38f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: eps %g must be finite and >= 0", fn, (double)d->eps);
    if (a->cols < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cols = %lld; a row needs at least one column", fn,
                           (long long)a->cols);
    if (a->rows < 0) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: rows = %lld is negative", fn, (long long)a->rows);
    if (a->rows > (int64_t)(SIZE_MAX / 8) / a->cols)
        return capex__fail(CAPEX_ERR_LIMIT, "%s: rows * cols overflows", fn);
    if (!capex__nm_dtype_ok(a->x_dtype) || !capex__nm_dtype_ok(a->y_dtype) || !capex__nm_dtype_ok(a->param_dtype))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: x_dtype, y_dtype and param_dtype must be CAPEX_F32/F16/BF16", fn);
    if (d->memory_efficient != 0 && d->memory_efficient != 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: memory_efficient = %d must be 0 or 1", fn, d->memory_efficient);
    if (rms && (a->bias || (bwd && a->dbias)))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: RMSNorm has no bias (Apex FusedRMSNorm); pass bias/dbias NULL", fn);
    if ((r = capex__nm_ptr(fn, "weight", a->weight, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "bias", a->bias, a->param_dtype, 0)) != CAPEX_OK) return r;
    rc = a->rows * a->cols;
    capex__nm_buf_add(bl, &nb, "weight", a->weight, a->cols, a->param_dtype, 0, 0);
    if (bwd && d->memory_efficient) { /* reads y (the forward's output), weight, bias, rstd; x and mean ignored */
        if ((r = capex__nm_ptr(fn, "y (memory_efficient: the forward's output)", a->y, a->y_dtype, need)) != CAPEX_OK)
            return r;
        capex__nm_buf_add(bl, &nb, "y", a->y, rc, a->y_dtype, 0, 0);
        capex__nm_buf_add(bl, &nb, "bias", a->bias, a->cols, a->param_dtype, 0, 0);
    } else {
        if ((r = capex__nm_ptr(fn, "x", a->x, a->x_dtype, need)) != CAPEX_OK) return r;
        capex__nm_buf_add(bl, &nb, "x", a->x, rc, a->x_dtype, 0, !bwd && a->x_dtype == a->y_dtype);
    }
    if (!bwd) {
        if ((r = capex__nm_ptr(fn, "y", a->y, a->y_dtype, need)) != CAPEX_OK) return r;
        if ((r = capex__nm_ptr(fn, "mean", a->mean, CAPEX_F32, 0)) != CAPEX_OK) return r;
        if ((r = capex__nm_ptr(fn, "rstd", a->rstd, CAPEX_F32, 0)) != CAPEX_OK) return r;
        capex__nm_buf_add(bl, &nb, "bias", a->bias, a->cols, a->param_dtype, 0, 0);
        capex__nm_buf_add(bl, &nb, "y", a->y, rc, a->y_dtype, 1, a->x_dtype == a->y_dtype);
        capex__nm_buf_add(bl, &nb, "mean", a->mean, a->rows, CAPEX_F32, 1, 0);
        capex__nm_buf_add(bl, &nb, "rstd", a->rstd, a->rows, CAPEX_F32, 1, 0);
        return capex__nm_overlap(fn, bl, nb);
    }
    if ((r = capex__nm_ptr(fn, "dy", a->dy, a->y_dtype, need)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "rstd (saved by forward)", a->rstd, CAPEX_F32, need)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "mean (saved by forward)", a->mean, CAPEX_F32, need && !rms && !d->memory_efficient)) !=
        CAPEX_OK)
        return r;
    if ((r = capex__nm_ptr(fn, "dx", a->dx, a->x_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "dweight", a->dweight, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "dbias", a->dbias, a->param_dtype, 0)) != CAPEX_OK) return r;
    if (a->dweight && !a->weight)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: dweight given without weight (no affine: pass dweight NULL)", fn);
    /* dbias without weight is fine: torch's layer_norm(weight=None, bias=b) has a bias grad, sum(dy) */
    /* backward reads x, dy, weight, rstd and (LayerNorm) mean; y and bias are not read (memory_efficient:
       y, dy, weight, bias and rstd) */
    capex__nm_buf_add(bl, &nb, "dy", a->dy, rc, a->y_dtype, 0, 0);
    if (!rms && !d->memory_efficient) capex__nm_buf_add(bl, &nb, "mean", a->mean, a->rows, CAPEX_F32, 0, 0);
    capex__nm_buf_add(bl, &nb, "rstd", a->rstd, a->rows, CAPEX_F32, 0, 0);
    capex__nm_buf_add(bl, &nb, "dx", a->dx, rc, a->x_dtype, 1, 0);
    capex__nm_buf_add(bl, &nb, "dweight", a->dweight, a->cols, a->param_dtype, 1, 0);
    capex__nm_buf_add(bl, &nb, "dbias", a->dbias, a->cols, a->param_dtype, 1, 0);
    capex__nm_buf_bytes(bl, &nb, "workspace", ws, ws_bytes, 1, 0);
    return capex__nm_overlap(fn, bl, nb);
}
static capex_result capex__nm_check(const char *fn, const capex_norm_desc *d, const capex_norm_args *a, int rms,
                                    int bwd) {
    return capex__nm_check_ws(fn, d, a, rms, bwd, 0, 0);
}

static void capex__nm_fwd_rows(void *vc, int64_t begin, int64_t end, float *scratch) {
    const capex__nm_ctx *c = (const capex__nm_ctx *)vc;
    const capex_norm_args *a = c->a;
    const int64_t n = a->cols;
    const float *CAPEX__OPT_RESTRICT wf = c->wf, *CAPEX__OPT_RESTRICT bf = c->bf;
    int64_t row, i;
    for (row = begin; row < end; row++) {
        const float *CAPEX__OPT_RESTRICT x = c->in_place ? capex__nm_load_copy(a->x, a->x_dtype, row * n, n, scratch)
                                                         : capex__nm_load(a->x, a->x_dtype, row * n, n, scratch);
        float *CAPEX__OPT_RESTRICT y = capex__nm_out(a->y, a->y_dtype, row * n, scratch + n);
        float mean = 0.0f, var, rstd;
        if (c->rms) var = capex__nm_dot(x, x, n) / (float)n;
        else { capex__nm_row_stats(x, n, x[0], &mean, &var); mean = x[0] + mean; }
        rstd = capex__nm_rstd(var, c->eps);
        if (a->mean) a->mean[row] = mean;
        if (a->rstd) a->rstd[row] = rstd;
        if (c->rms) { for (i = 0; i < n; i++) y[i] = capex__nm_rms_y(x[i], rstd, wf[i]); }
        else { for (i = 0; i < n; i++) y[i] = capex__nm_ln_y(x[i], mean, rstd, wf[i], bf[i]); }
        capex__nm_store(a->y, a->y_dtype, row * n, n, y);
    }
}

/* Memory-efficient backward of one row (Apex memory_efficient=True): from y,
   xhat = (y - b) / w; sum(g * xhat) = sum(dy * (y - b)), without the division
   (Apex's too). Two passes over y and dy like capex__nm_bwd_pass /
   capex__nm_bwd_dx: pass 1 gives the dweight / dbias partials and sum(g),
   sum(dy * (y - b)) in capex__nm_dot's lanes, blocks and tree (the values of
   the former scratch-row version: dot(g), dot(dy, y - b)); pass 2 recomputes
   g for dx, and xhat unless pass 1 kept it in xs (with pw: it divides once
   per element, not twice). UPD: the partials' update of one 8-vector (pw, pb
   may each be NULL: one loop per case, no branch inside). YB: y - b into yv
   (and the weight into w); G: g = dy * w into w. aff: 2 a bias (and a
   weight or the all-ones row), 1 a weight alone, 0 neither. Without a bias
   y - (+0) is y, without a weight d * 1 is d, exactly: aff 1 skips the
   all-zeros row (YB only loads w), aff 0 both rows (G is w = d), same bits. */
#if defined(__GNUC__) || defined(__clang__)
#define CAPEX__NM_ME_LOOP(YB, G, UPD)                                                                   \
    while (k < K) {                                                                                     \
        capex__v8f sv = {0, 0, 0, 0, 0, 0, 0, 0}, tv = {0, 0, 0, 0, 0, 0, 0, 0}, yv, d, w;               \
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;                                              \
        for (; k < k1; k++) {                                                                           \
            memcpy(&yv, y + 8 * k, sizeof yv); memcpy(&d, dy + 8 * k, sizeof d);                        \
            YB                                                                                          \
            UPD                                                                                         \
            G                                                                                           \
            sv += w;                                                                                    \
            w = d * yv;                                                                                 \
            CAPEX__NM_OPAQUE(w); /* unfused, as capex__nm_dot's */                                      \
            tv += w;                                                                                    \
        }                                                                                               \
        CAPEX__NM_FLUSH(slo, shi, sv);                                                                  \
        CAPEX__NM_FLUSH(tlo, thi, tv);                                                                  \
    }
#define CAPEX__NM_ME_YB { /* y - b; w: the weight */                                                    \
        capex__v8f bv_;                                                                                 \
        memcpy(&w, wf + 8 * k, sizeof w); memcpy(&bv_, bf + 8 * k, sizeof bv_);                         \
        yv = yv - bv_; }
#define CAPEX__NM_ME_W memcpy(&w, wf + 8 * k, sizeof w); /* y - (+0) is y */
#define CAPEX__NM_ME_G w = d * w; /* g */
#define CAPEX__NM_ME_PW { /* pw += dy * xhat, xhat = (y - b) / w kept in xs */                       \
        capex__v8f a_, x_ = yv / w;                                                                     \
        memcpy(&a_, pw + 8 * k, sizeof a_); a_ += d * x_;                                               \
        memcpy(pw + 8 * k, &a_, sizeof a_); memcpy(xs + 8 * k, &x_, sizeof x_); }
#define CAPEX__NM_ME_PB { capex__v8f b_; memcpy(&b_, pb + 8 * k, sizeof b_); b_ += d; memcpy(pb + 8 * k, &b_, sizeof b_); }
#endif
static void capex__nm_bwd_me_pass(const float *CAPEX__OPT_RESTRICT y, const float *CAPEX__OPT_RESTRICT dy,
                                  const float *CAPEX__OPT_RESTRICT wf, const float *CAPEX__OPT_RESTRICT bf,
                                  float *CAPEX__OPT_RESTRICT pw, float *CAPEX__OPT_RESTRICT pb,
                                  float *CAPEX__OPT_RESTRICT xs, int aff, int64_t n, float *sg, float *sgx) {
    double ds[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t K = n / 8, k = 0, k1, i;
    int l;
#if defined(__GNUC__) || defined(__clang__)
    {
        capex__v4d slo = {0, 0, 0, 0}, shi = {0, 0, 0, 0}, tlo = {0, 0, 0, 0}, thi = {0, 0, 0, 0};
        if (aff == 0) { /* pw needs a weight: dbias at most */
            if (pb) { CAPEX__NM_ME_LOOP(;, w = d;, CAPEX__NM_ME_PB) }
            else { CAPEX__NM_ME_LOOP(;, w = d;, ;) }
        } else if (aff == 1) {
            if (pw && pb) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_W, CAPEX__NM_ME_G, CAPEX__NM_ME_PW CAPEX__NM_ME_PB) }
            else if (pw) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_W, CAPEX__NM_ME_G, CAPEX__NM_ME_PW) }
            else if (pb) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_W, CAPEX__NM_ME_G, CAPEX__NM_ME_PB) }
            else { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_W, CAPEX__NM_ME_G, ;) }
        }
        else if (pw && pb) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_YB, CAPEX__NM_ME_G, CAPEX__NM_ME_PW CAPEX__NM_ME_PB) }
        else if (pw) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_YB, CAPEX__NM_ME_G, CAPEX__NM_ME_PW) }
        else if (pb) { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_YB, CAPEX__NM_ME_G, CAPEX__NM_ME_PB) }
        else { CAPEX__NM_ME_LOOP(CAPEX__NM_ME_YB, CAPEX__NM_ME_G, ;) }
        memcpy(ds, &slo, sizeof slo); memcpy(ds + 4, &shi, sizeof shi);
        memcpy(dt, &tlo, sizeof tlo); memcpy(dt + 4, &thi, sizeof thi);
    }
#else
    (void)aff; /* the all-ones / all-zeros rows give the same values */
    while (k < K) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        k1 = K - k > CAPEX__NM_BLK ? k + CAPEX__NM_BLK : K;
        for (; k < k1; k++)
            for (l = 0; l < 8; l++) {
                float yb, d, gv;
                i = 8 * k + l;
                yb = y[i] - bf[i]; d = dy[i]; gv = d * wf[i];
                if (pw) { xs[i] = yb / wf[i]; pw[i] += d * xs[i]; }
                if (pb) pb[i] += d;
                s[l] += gv; gv = d * yb; t[l] += gv; /* unfused, as capex__nm_dot's */
            }
        for (l = 0; l < 8; l++) { ds[l] += (double)s[l]; dt[l] += (double)t[l]; }
    }
#endif
    for (l = 0; l < (int)(n % 8); l++) { /* the tail: one more value in lanes 0..n%8-1 */
        float yb, d, gv;
        i = 8 * K + l;
        yb = y[i] - bf[i]; d = dy[i]; gv = d * wf[i];
        if (pw) { xs[i] = yb / wf[i]; pw[i] += d * xs[i]; }
        if (pb) pb[i] += d;
        ds[l] += (double)gv; dt[l] += (double)(d * yb);
    }
    *sg = capex__nm_tree8(ds);
    *sgx = capex__nm_tree8(dt);
}
/* The partials alone (no dx): pass 1's updates of pw / pb, the same
   operations on the same lanes (the same bits), without its row sums, as
   capex__nm_bwd_params; y is read only for pw (y NULL otherwise). */
static void capex__nm_bwd_me_params(const float *CAPEX__OPT_RESTRICT y, const float *CAPEX__OPT_RESTRICT dy,
                                    const float *CAPEX__OPT_RESTRICT wf, const float *CAPEX__OPT_RESTRICT bf,
                                    float *CAPEX__OPT_RESTRICT pw, float *CAPEX__OPT_RESTRICT pb, int aff, int64_t n) {
    int64_t i;
#if defined(__GNUC__) || defined(__clang__)
    const int64_t K = n / 8;
    capex__v8f yv, d, w;
    int64_t k;
#define CAPEX__NM_ME_PARAMS_LOOP(YB, UPD)                                                               \
    for (k = 0; k < K; k++) {                                                                           \
        capex__v8f a_;                                                                                  \
        memcpy(&yv, y + 8 * k, sizeof yv); memcpy(&d, dy + 8 * k, sizeof d);                            \
        YB                                                                                              \
        yv = yv / w; /* xhat */                                                                         \
        memcpy(&a_, pw + 8 * k, sizeof a_); a_ += d * yv; memcpy(pw + 8 * k, &a_, sizeof a_);           \
        UPD                                                                                             \
    }
    if (pw && aff == 1) { /* pw: a weight */
        if (pb) { CAPEX__NM_ME_PARAMS_LOOP(CAPEX__NM_ME_W, CAPEX__NM_ME_PB) }
        else { CAPEX__NM_ME_PARAMS_LOOP(CAPEX__NM_ME_W, ;) }
    }
    else if (pw && pb) { CAPEX__NM_ME_PARAMS_LOOP(CAPEX__NM_ME_YB, CAPEX__NM_ME_PB) }
    else if (pw) { CAPEX__NM_ME_PARAMS_LOOP(CAPEX__NM_ME_YB, ;) }
    else if (pb) { for (k = 0; k < K; k++) { memcpy(&d, dy + 8 * k, sizeof d); CAPEX__NM_ME_PB } }
#undef CAPEX__NM_ME_PARAMS_LOOP
    i = 8 * K;
#else
    (void)aff;
    i = 0;
#endif
    for (; i < n; i++) { /* the tail, as pass 1's (without vectors: the whole row) */
        const float d = dy[i];
        if (pw) { const float xh = (y[i] - bf[i]) / wf[i]; pw[i] += d * xh; }
        if (pb) pb[i] += d;
    }
}
/* xs: xhat from pass 1, or NULL (then (y - b) / w again: the same value;
   bf NULL: no bias, y / w, the same value without the all-zeros row). */
#define CAPEX__NM_ME_XS(j) xs[j]
#define CAPEX__NM_ME_XR(j) capex__nm_me_xhat(y[j], wf[j], bf[j])
#define CAPEX__NM_ME_XW(j) (y[j] / wf[j])
static void capex__nm_bwd_me_dx(const float *CAPEX__OPT_RESTRICT y, const float *CAPEX__OPT_RESTRICT dy,
                                const float *CAPEX__OPT_RESTRICT wf, const float *CAPEX__OPT_RESTRICT bf,
                                const float *CAPEX__OPT_RESTRICT xs, float *CAPEX__OPT_RESTRICT dx, float rstd,
                                float mg, float mgx, int64_t n, int stream) {
    int64_t i = 0;
    if (xs) { CAPEX__NM_DX_LOOP(CAPEX__NM_ME_XS) }
    else if (!bf) { CAPEX__NM_DX_LOOP(CAPEX__NM_ME_XW) }
    else { CAPEX__NM_DX_LOOP(CAPEX__NM_ME_XR) }
}
static void capex__nm_bwd_me_row(const capex__nm_ctx *c, int64_t row, float *CAPEX__OPT_RESTRICT pw,
                                 float *CAPEX__OPT_RESTRICT pb, float *scratch) {
    const capex_norm_args *a = c->a;
    const int64_t n = a->cols;
    /* y: for dx or dweight (dbias alone is a sum of dy) */
    const float *y = a->dx || pw ? capex__nm_load(a->y, a->y_dtype, row * n, n, scratch) : NULL;
    const float *dy = capex__nm_load(a->dy, a->y_dtype, row * n, n, scratch + n);
    const int aff = a->bias ? 2 : a->weight ? 1 : 0;
    float sg, sgx;
    float *xs = scratch + 2 * n; /* xhat, when pass 1 computes it (pw) */
    if (!a->dx) { /* no row sums to compute (the normal backward's capex__nm_bwd_params) */
        capex__nm_bwd_me_params(y, dy, c->wf, c->bf, pw, pb, aff, n);
        return;
    }
    /* no affine (w 1, b +0): y - b is y exactly and the pass's sum(dy * y) has the lanes, blocks, tail,
       tree and unfused products (CAPEX__NM_OPAQUE) of capex__nm_dot(dy, y, n), so it is the normal
       backward's sum(g * xhat), bit for bit, without a second read of dy and y */
    capex__nm_bwd_me_pass(y, dy, c->wf, c->bf, pw, pb, xs, aff, n, &sg, &sgx);
    {
        float *dx = capex__nm_out(a->dx, a->x_dtype, row * n, scratch + 3 * n);
        /* no affine: (y - 0) / 1 is y exactly, so xhat is read from y, without a divide per element */
        const float *xh = pw ? xs : !aff ? y : NULL;
        capex__nm_bwd_me_dx(y, dy, c->wf, aff == 2 ? c->bf : NULL, xh, dx, a->rstd[row],
                            c->rms ? 0.0f : sg / (float)n, sgx / (float)n, n, c->stream_dx);
        capex__nm_store(a->dx, a->x_dtype, row * n, n, dx);
    }
}

/* Row blocks [begin, end). Scratch 8n (8-byte aligned): x (or y), dy, xhat
   (memory-efficient), dx, then the double rows of dweight and dbias
   (capex__nm_flush_cols). */
static void capex__nm_bwd_blocks(void *vc, int64_t begin, int64_t end, float *scratch) {
    const capex__nm_ctx *c = (const capex__nm_ctx *)vc;
    const capex_norm_args *a = c->a;
    const int64_t n = a->cols;
    const float *CAPEX__OPT_RESTRICT wf = c->wf;
    const int flush = c->brows > CAPEX__NM_BLK;
    double *dw = (double *)(void *)(scratch + 4 * n), *db = (double *)(void *)(scratch + 6 * n);
    int64_t blk, row, i;
    for (blk = begin; blk < end; blk++) {
        int64_t r0 = blk * c->brows, r1 = r0 + c->brows < a->rows ? r0 + c->brows : a->rows;
        float *CAPEX__OPT_RESTRICT pw = c->pw ? c->pw + blk * n : NULL;
        float *CAPEX__OPT_RESTRICT pb = c->pb ? c->pb + blk * n : NULL;
        if (pw) for (i = 0; i < n; i++) pw[i] = 0.0f;
        if (pb) for (i = 0; i < n; i++) pb[i] = 0.0f;
        if (pw && flush) for (i = 0; i < n; i++) dw[i] = 0.0;
        if (pb && flush) for (i = 0; i < n; i++) db[i] = 0.0;
        for (row = r0; row < r1; row++) {
            if (c->me) capex__nm_bwd_me_row(c, row, pw, pb, scratch);
            else {
                const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, row * n, n, scratch);
                const float *CAPEX__OPT_RESTRICT dy = capex__nm_load(a->dy, a->y_dtype, row * n, n, scratch + n);
                const float rstd = a->rstd[row], mean = c->rms ? 0.0f : a->mean[row];
                float mg, mgx;
                if (!a->dx) capex__nm_bwd_params(x, dy, pw, pb, mean, rstd, n);
                else {
                    float *CAPEX__OPT_RESTRICT dx = capex__nm_out(a->dx, a->x_dtype, row * n, scratch + 3 * n);
                    capex__nm_bwd_pass(x, dy, wf, pw, pb, mean, rstd, n, &mg, &mgx);
                    capex__nm_bwd_dx(x, dy, wf, dx, mean, rstd, c->rms ? 0.0f : mg / (float)n, mgx / (float)n, n,
                                     c->stream_dx);
                    capex__nm_store(a->dx, a->x_dtype, row * n, n, dx);
                }
            }
            if (flush && ((row - r0) % CAPEX__NM_BLK == CAPEX__NM_BLK - 1 || row == r1 - 1)) { /* from the block's start */
                if (pw) capex__nm_flush_cols(dw, pw, n);
                if (pb) capex__nm_flush_cols(db, pb, n);
            }
        }
        if (pw && flush) capex__nm_round_cols(pw, dw, n);
        if (pb && flush) capex__nm_round_cols(pb, db, n);
    }
#ifdef CAPEX__F16C
    if (c->stream_dx) _mm_sfence(); /* non-temporal stores are weakly ordered: done before the join */
#endif
}

/* Sums per-block partials [nblk][n] in block order in float64 into out (dtype t). */
static void capex__nm_finish_partials(const float *part, int64_t nblk, int64_t n, double *acc, void *out,
                                      capex_dtype t) {
    int64_t b, i;
    for (i = 0; i < n; i++) acc[i] = 0.0;
    for (b = 0; b < nblk; b++)
        for (i = 0; i < n; i++) acc[i] += (double)part[b * n + i];
    for (i = 0; i < n; i++) capex__nm_store_one(out, t, i, (float)acc[i]);
}

static capex_result capex__nm_norm(const char *fn, const capex_norm_desc *d, const capex_norm_args *a, int rms,
                                   int bwd) {
    capex_norm_desc dd;
    capex__nm_ctx c;
    capex_result r;
    int64_t n, nblk = 0;
    int T;
    size_t per, total;
    float *mem;
    if (!d) { capex_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__nm_check(fn, d, a, rms, bwd)) != CAPEX_OK) return r;
    if (a->rows == 0) { /* dweight/dbias are written, not accumulated: an empty batch's are 0 (torch) */
        int64_t i;
        for (i = 0; bwd && i < a->cols; i++) {
            if (a->dweight) capex__nm_store_one(a->dweight, a->param_dtype, i, 0.0f);
            if (a->dbias) capex__nm_store_one(a->dbias, a->param_dtype, i, 0.0f);
        }
        return CAPEX_OK;
    }
    n = a->cols;
    if (bwd && d->memory_efficient && a->weight && (a->dx || a->dweight)) { /* y == b where w == 0: xhat is gone */
        int64_t i;
        for (i = 0; i < n; i++) {
            uint32_t bits = a->param_dtype == CAPEX_F32 ? capex__f32_bits(((const float *)a->weight)[i])
                                                        : ((const uint16_t *)a->weight)[i];
            if ((bits & (a->param_dtype == CAPEX_F32 ? 0x7fffffffu : 0x7fffu)) == 0)
                return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: memory_efficient: weight[%lld] is 0, so x_hat = (y - b) / w "
                                   "cannot be recovered from y there; use memory_efficient = 0 (pass x and mean) for "
                                   "this layer", fn, (long long)i);
        }
    }
    memset(&c, 0, sizeof c);
    c.a = a; c.eps = d->eps; c.rms = rms; c.in_place = !bwd && a->y == a->x; c.me = bwd && d->memory_efficient;
    if (bwd) {
        /* fixed blocks (from rows alone): the same partials for any thread count */
        c.stream_dx = a->dx && a->x_dtype == CAPEX_F32 && a->rows * n >= CAPEX__NM_STREAM_BYTES / 4;
        c.brows = (a->rows + 63) / 64;
        if (c.brows < 16) c.brows = 16;
        nblk = (a->rows + c.brows - 1) / c.brows;
    }
    T = capex__nm_threads(d->num_threads, bwd ? nblk : a->rows, a->rows * n);
    per = (size_t)n * (bwd ? 8u : 2u); /* even: each worker's double rows stay 8-byte aligned */
    total = 2u * (size_t)n + per * (size_t)T;
    if (bwd && (a->dweight || a->dbias)) total += 2u * (size_t)nblk * (size_t)n + 2u * (size_t)n * 2u;
    if (total > SIZE_MAX / sizeof(float)) return capex__fail(CAPEX_ERR_LIMIT, "%s: scratch size overflows", fn);
    mem = (float *)capex__alloc(d->allocator, total * sizeof(float));
    if (!mem) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes of scratch", fn,
                                 total * sizeof(float));
    capex__nm_params(a->weight, bwd && !c.me ? NULL : a->bias, a->param_dtype, n, mem, &c.wf, &c.bf);
    if (bwd && (a->dweight || a->dbias)) {
        float *p = mem + 2 * (size_t)n + per * (size_t)T;
        c.pw = a->dweight ? p : NULL;
        c.pb = a->dbias ? p + (size_t)nblk * (size_t)n : NULL;
    }
    if (bwd) {
        capex__nm_run(T, nblk, capex__nm_bwd_blocks, &c, mem + 2 * (size_t)n, per);
        if (c.pw || c.pb) {
            size_t off = 2 * (size_t)n + per * (size_t)T + 2u * (size_t)nblk * (size_t)n;
            double *acc = (double *)(void *)(mem + ((off + 1u) & ~(size_t)1)); /* 8-byte aligned */
            if (c.pw) capex__nm_finish_partials(c.pw, nblk, n, acc, a->dweight, a->param_dtype);
            if (c.pb) capex__nm_finish_partials(c.pb, nblk, n, acc, a->dbias, a->param_dtype);
        }
    } else {
        capex__nm_run(T, a->rows, capex__nm_fwd_rows, &c, mem + 2 * (size_t)n, per);
    }
    capex__free(d->allocator, mem);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_layer_norm_forward(const capex_norm_desc *d, const capex_norm_args *a) {
    return capex__nm_norm("capex_layer_norm_forward", d, a, 0, 0);
}
CAPEX_API capex_result capex_layer_norm_backward(const capex_norm_desc *d, const capex_norm_args *a) {
    return capex__nm_norm("capex_layer_norm_backward", d, a, 0, 1);
}
CAPEX_API capex_result capex_rms_norm_forward(const capex_norm_desc *d, const capex_norm_args *a) {
    return capex__nm_norm("capex_rms_norm_forward", d, a, 1, 0);
}
CAPEX_API capex_result capex_rms_norm_backward(const capex_norm_desc *d, const capex_norm_args *a) {
    return capex__nm_norm("capex_rms_norm_backward", d, a, 1, 1);
}

/* ---- BatchNorm / SyncBatchNorm ---- */

CAPEX_API size_t capex_syncbn_pack_floats(int64_t channels) {
    return channels > 0 ? 3u * (size_t)channels + 2u : 0u;
}

CAPEX_API capex_result capex_syncbn_merge(const float *g, int world, int64_t C, float *mean, float *var,
                                          int64_t *total_count) {
    size_t P = capex_syncbn_pack_floats(C);
    int64_t tot = 0, ch;
    int r;
    if (!g || !mean || !var) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_syncbn_merge: NULL pointer");
    if (world < 1 || C < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_syncbn_merge: world %d and channels %lld must be >= 1", world,
                           (long long)C);
    for (r = 0; r < world; r++) {
        float hi = g[(size_t)r * P + 3u * (size_t)C], lo = g[(size_t)r * P + 3u * (size_t)C + 1u];
        if (!(hi >= 0.0f && hi < 16777216.0f && lo >= 0.0f && lo < 16777216.0f) || hi != (float)(int64_t)hi ||
            lo != (float)(int64_t)lo)
            return capex__fail(CAPEX_ERR_FORMAT, "capex_syncbn_merge: rank %d sent a corrupt count (%g, %g); did every "
                               "rank pass the same channel count?", r, (double)hi, (double)lo);
        tot += ((int64_t)hi << 24) + (int64_t)lo;
    }
    for (ch = 0; ch < C; ch++) {
        double n = 0.0, m = 0.0, q = 0.0;
        for (r = 0; r < world; r++) {
            const float *p = g + (size_t)r * P;
            double nb = (double)(((int64_t)p[3 * C] << 24) + (int64_t)p[3 * C + 1]), N, dd;
            double mb = (double)p[ch] + (double)p[C + ch]; /* hi + lo: exact in float64 */
            if (nb == 0.0) continue; /* an empty rank adds nothing (and may send anything) */
            N = n + nb;
            dd = mb - m;
            m += dd * nb / N;
            q += (double)p[2 * C + ch] * nb + dd * dd * n * nb / N; /* Chan et al. */
            n = N;
        }
        mean[ch] = (float)m;
        var[ch] = n > 0.0 ? (float)(q / n) : 0.0f;
    }
    if (total_count) *total_count = tot;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_batch_norm_amp_dtypes(const capex_amp_config *cfg, capex_dtype input,
                                                   capex_dtype *param_dtype, capex_dtype *y_dtype) {
    capex_dtype t;
    capex_result r;
    if (!cfg) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_batch_norm_amp_dtypes: cfg is NULL");
    if (!capex__nm_dtype_ok(input))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_batch_norm_amp_dtypes: input dtype %d is not F32/F16/BF16",
                           (int)input);
    if ((r = capex_amp_op_dtype(cfg, CAPEX_OP_BATCH_NORM, input, &t)) != CAPEX_OK) return r;
    if (param_dtype) *param_dtype = cfg->batchnorm_dtype;
    if (y_dtype) *y_dtype = t;
    return CAPEX_OK;
}

static float capex__nm_get(const void *p, capex_dtype t, int64_t i) {
    if (t == CAPEX_F32) return ((const float *)p)[i];
    if (t == CAPEX_F16) return capex__h16_load(((const uint16_t *)p)[i]);
    return capex__b16_load(((const uint16_t *)p)[i]);
}

typedef struct capex__bn_ctx {
    const capex_batch_norm_args *a;
    float *pk;                      /* local stats: pack (capex_syncbn_pack_floats) */
    float *p0, *p1;                 /* NSC per-block partials [nblk][C] */
    int64_t dofs;                   /* NSC: a worker's 2C double rows at scratch + dofs (8-byte aligned) */
    double *s0, *s1;                /* NCS backward: per-channel sums */
    const float *mean, *invstd, *wf, *bf;
    float mdy_scale;                /* 1/total (training backward) or 0 */
    int eval;                       /* backward by running stats: dx = dy * invstd * w */
    const float *sdy, *sdyx;        /* reduced sums (backward) */
    int64_t brows, rows;            /* NSC: rows per block, rows = N*S */
    int in_place;                   /* forward y == x: each segment read from a copy */
} capex__bn_ctx;

/* A rank's mean into the pack as hi = f32(m), lo = f32(m - hi): 48 bits, so the
   merge's between-rank term (mean differences) keeps float64 accuracy when
   |mean| >> std; a non-finite mean sends lo 0. */
static void capex__bn_pack_mean(float *pk, int64_t C, int64_t ch, double m) {
    const float hi = (float)m;
    pk[ch] = hi;
    pk[C + ch] = hi - hi == 0.0f ? (float)(m - (double)hi) : 0.0f;
}
/* NCS forward stats: channels [b, e), scratch S floats. */
static void capex__bn_stats_ncs(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    int64_t ch, i;
    for (ch = b; ch < e; ch++) {
        double n = 0.0, m = 0.0, q = 0.0, nb = (double)a->s;
        const float x0 = capex__nm_get(a->x, a->x_dtype, ch * a->s); /* one shift for the channel's rows */
        for (i = 0; i < a->n; i++) {
            float mu, v;
            double dd;
            capex__nm_row_stats(capex__nm_load(a->x, a->x_dtype, (i * a->c + ch) * a->s, a->s, buf), a->s, x0, &mu, &v);
            dd = (double)mu - m;
            m += dd * nb / (n + nb);
            q += (double)v * nb + dd * dd * n * nb / (n + nb);
            n += nb;
        }
        capex__bn_pack_mean(c->pk, a->c, ch, (double)x0 + m);
        c->pk[2 * a->c + ch] = n > 0.0 ? (float)(q / n) : 0.0f;
    }
}
/* NSC forward stats: row blocks [b, e), per-block Welford vectorised over channels,
   on x - (row 0) as capex__nm_row_stats; the block means stay shifted for the
   merge. A block of more than CAPEX__NM_BLK rows restarts its f32 chains every
   CAPEX__NM_BLK rows and merges them (Chan) into double rows, as
   capex__nm_row_stats; its partials are those rounded. */
static void capex__bn_stats_nsc(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t C = a->c;
    const int flush = c->brows > CAPEX__NM_BLK;
    double *CAPEX__OPT_RESTRICT dm = (double *)(void *)(buf + c->dofs), *CAPEX__OPT_RESTRICT dq = dm + C;
    int64_t blk, row, ch, k0, k1;
    float *CAPEX__OPT_RESTRICT x0 = buf + C;
    memcpy(x0, capex__nm_load(a->x, a->x_dtype, 0, C, buf), (size_t)C * sizeof(float));
    for (blk = b; blk < e; blk++) {
        float *CAPEX__OPT_RESTRICT pm = c->p0 + blk * C, *CAPEX__OPT_RESTRICT pq = c->p1 + blk * C;
        int64_t r0 = blk * c->brows, r1 = r0 + c->brows < c->rows ? r0 + c->brows : c->rows;
        double m = 0.0, f;
        if (flush) for (ch = 0; ch < C; ch++) { dm[ch] = 0.0; dq[ch] = 0.0; }
        for (row = r0; row < r1;) {
            k0 = row;
            k1 = flush && r1 - row > CAPEX__NM_BLK ? row + CAPEX__NM_BLK : r1;
            for (ch = 0; ch < C; ch++) { pm[ch] = 0.0f; pq[ch] = 0.0f; }
            for (; row < k1; row++) {
                const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, row * C, C, buf);
                const float inv = 1.0f / (float)(row - k0 + 1);
                for (ch = 0; ch < C; ch++) capex__nm_welford(x[ch] - x0[ch], inv, &pm[ch], &pq[ch]);
            }
            if (!flush) break;
            f = (double)(k1 - k0) / (m + (double)(k1 - k0)); /* Chan, m rows before: one f for all channels */
            for (ch = 0; ch < C; ch++) {
                const double d = (double)pm[ch] - dm[ch];
                dm[ch] += d * f;
                dq[ch] += (double)pq[ch] + d * d * m * f;
            }
            m += (double)(k1 - k0);
        }
        if (flush) { capex__nm_round_cols(pm, dm, C); capex__nm_round_cols(pq, dq, C); }
    }
}
/* y over items: NCS (n, c) segments, NSC rows. Scratch 2 * max(S, C). */
static void capex__bn_fwd_ncs(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t S = a->s;
    int64_t it, i;
    for (it = b; it < e; it++) {
        const int64_t ch = it % a->c;
        const float *CAPEX__OPT_RESTRICT x = c->in_place ? capex__nm_load_copy(a->x, a->x_dtype, it * S, S, buf)
                                                         : capex__nm_load(a->x, a->x_dtype, it * S, S, buf);
        float *CAPEX__OPT_RESTRICT y = capex__nm_out(a->y, a->y_dtype, it * S, buf + S);
        const float m = c->mean[ch], is = c->invstd[ch], w = c->wf[ch], bb = c->bf[ch];
        for (i = 0; i < S; i++) y[i] = capex__nm_ln_y(x[i], m, is, w, bb);
        capex__nm_store(a->y, a->y_dtype, it * S, S, y);
    }
}
static void capex__bn_fwd_nsc(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t C = a->c;
    const float *CAPEX__OPT_RESTRICT m = c->mean, *CAPEX__OPT_RESTRICT is = c->invstd;
    const float *CAPEX__OPT_RESTRICT w = c->wf, *CAPEX__OPT_RESTRICT bb = c->bf;
    int64_t row, i;
    for (row = b; row < e; row++) {
        const float *CAPEX__OPT_RESTRICT x = c->in_place ? capex__nm_load_copy(a->x, a->x_dtype, row * C, C, buf)
                                                         : capex__nm_load(a->x, a->x_dtype, row * C, C, buf);
        float *CAPEX__OPT_RESTRICT y = capex__nm_out(a->y, a->y_dtype, row * C, buf + C);
        for (i = 0; i < C; i++) y[i] = capex__nm_ln_y(x[i], m[i], is[i], w[i], bb[i]);
        capex__nm_store(a->y, a->y_dtype, row * C, C, y);
    }
}
/* Backward sums (sum_dy, sum_dy_xmu) per channel. NCS: channels, scratch 3S. */
static void capex__bn_sums_ncs(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t S = a->s;
    int64_t ch, i, k;
    for (ch = b; ch < e; ch++) {
        double s0 = 0.0, s1 = 0.0;
        const float m = c->mean[ch];
        for (i = 0; i < a->n; i++) {
            const int64_t off = (i * a->c + ch) * S;
            const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, off, S, buf);
            const float *CAPEX__OPT_RESTRICT dy = capex__nm_load(a->dy, a->y_dtype, off, S, buf + S);
            float *CAPEX__OPT_RESTRICT xm = buf + 2 * S;
            for (k = 0; k < S; k++) xm[k] = x[k] - m;
            s0 += (double)capex__nm_dot(dy, NULL, S);
            s1 += (double)capex__nm_dot(dy, xm, S);
        }
        c->s0[ch] = s0;
        c->s1[ch] = s1;
    }
}
/* NSC: row blocks, per-block partials (flushed into double rows as the
   LayerNorm backward's, capex__nm_flush_cols). Scratch 2C + the double rows. */
static void capex__bn_sums_nsc(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t C = a->c;
    const float *CAPEX__OPT_RESTRICT m = c->mean;
    const int flush = c->brows > CAPEX__NM_BLK;
    double *d0 = (double *)(void *)(buf + c->dofs), *d1 = d0 + C;
    int64_t blk, row, ch;
    for (blk = b; blk < e; blk++) {
        float *CAPEX__OPT_RESTRICT p0 = c->p0 + blk * C, *CAPEX__OPT_RESTRICT p1 = c->p1 + blk * C;
        int64_t r0 = blk * c->brows, r1 = r0 + c->brows < c->rows ? r0 + c->brows : c->rows;
        for (ch = 0; ch < C; ch++) { p0[ch] = 0.0f; p1[ch] = 0.0f; }
        if (flush) for (ch = 0; ch < C; ch++) { d0[ch] = 0.0; d1[ch] = 0.0; }
        for (row = r0; row < r1; row++) {
            const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, row * C, C, buf);
            const float *CAPEX__OPT_RESTRICT dy = capex__nm_load(a->dy, a->y_dtype, row * C, C, buf + C);
            for (ch = 0; ch < C; ch++) { p0[ch] += dy[ch]; p1[ch] += dy[ch] * (x[ch] - m[ch]); }
            if (flush && ((row - r0) % CAPEX__NM_BLK == CAPEX__NM_BLK - 1 || row == r1 - 1)) {
                capex__nm_flush_cols(d0, p0, C);
                capex__nm_flush_cols(d1, p1, C);
            }
        }
        if (flush) { capex__nm_round_cols(p0, d0, C); capex__nm_round_cols(p1, d1, C); }
    }
}
/* dx over items (as forward). Scratch 3 * max(S, C). */
static void capex__bn_dx_ncs(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t S = a->s;
    int64_t it, i;
    for (it = b; it < e; it++) {
        const int64_t ch = it % a->c;
        const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, it * S, S, buf);
        const float *CAPEX__OPT_RESTRICT dy = capex__nm_load(a->dy, a->y_dtype, it * S, S, buf + S);
        float *CAPEX__OPT_RESTRICT dx = capex__nm_out(a->dx, a->x_dtype, it * S, buf + 2 * S);
        const float m = c->mean[ch], is = c->invstd[ch], w = c->wf[ch];
        const float mdy = c->sdy[ch] * c->mdy_scale, mdyx = c->sdyx[ch] * c->mdy_scale;
        if (c->eval) for (i = 0; i < S; i++) dx[i] = dy[i] * (is * w);
        else for (i = 0; i < S; i++) dx[i] = capex__nm_bn_dx(dy[i], x[i] - m, is, w, mdy, mdyx);
        capex__nm_store(a->dx, a->x_dtype, it * S, S, dx);
    }
}
static void capex__bn_dx_nsc(void *vc, int64_t b, int64_t e, float *buf) {
    const capex__bn_ctx *c = (const capex__bn_ctx *)vc;
    const capex_batch_norm_args *a = c->a;
    const int64_t C = a->c;
    const float *CAPEX__OPT_RESTRICT m = c->mean, *CAPEX__OPT_RESTRICT is = c->invstd, *CAPEX__OPT_RESTRICT w = c->wf;
    const float *CAPEX__OPT_RESTRICT sdy = c->sdy, *CAPEX__OPT_RESTRICT sdyx = c->sdyx;
    const float k = c->mdy_scale;
    int64_t row, i;
    for (row = b; row < e; row++) {
        const float *CAPEX__OPT_RESTRICT x = capex__nm_load(a->x, a->x_dtype, row * C, C, buf);
        const float *CAPEX__OPT_RESTRICT dy = capex__nm_load(a->dy, a->y_dtype, row * C, C, buf + C);
        float *CAPEX__OPT_RESTRICT dx = capex__nm_out(a->dx, a->x_dtype, row * C, buf + 2 * C);
        if (c->eval) for (i = 0; i < C; i++) dx[i] = dy[i] * (is[i] * w[i]);
        else for (i = 0; i < C; i++) dx[i] = capex__nm_bn_dx(dy[i], x[i] - m[i], is[i], w[i], sdy[i] * k, sdyx[i] * k);
        capex__nm_store(a->dx, a->x_dtype, row * C, C, dx);
    }
}

CAPEX_API float capex_batch_norm_momentum(const capex_batch_norm_desc *d, int64_t *num_batches_tracked) {
    int64_t nb = 0;
    if (num_batches_tracked) nb = ++*num_batches_tracked;
    if (d && d->cumulative_average) return nb > 0 ? (float)(1.0 / (double)nb) : 1.0f;
    return d ? d->momentum : 0.1f;
}

/* SyncBatchNorm's comm: its world size (1 without one) and its two collectives
   (gather: n floats per rank allgathered; else n floats summed in place). With
   CAPEX_NO_DIST there is no comm: the world is 1 and they are never called. */
CAPEX__PRIVATE int capex__bn_world(const capex_comm *comm) {
#ifdef CAPEX_NO_DIST
    (void)comm;
    return 1;
#else
    return comm ? comm->world_size : 1;
#endif
}
CAPEX__PRIVATE capex_result capex__bn_collective(capex_comm *comm, int gather, const float *send, float *recv, size_t n) {
#ifdef CAPEX_NO_DIST
    (void)comm; (void)gather; (void)send; (void)recv; (void)n;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "SyncBatchNorm: built with CAPEX_NO_DIST");
#else
    if (gather) return capex_comm_allgather(comm, send, recv, n, CAPEX_F32);
    return capex_comm_allreduce(comm, send, recv, n, CAPEX_F32, CAPEX_REDUCE_SUM);
#endif
}

/* ws, ws_bytes: the GPU workspace (an output), else 0. */
CAPEX__PRIVATE capex_result capex__bn_check_ws(const char *fn, const capex_batch_norm_desc *d, capex_comm *comm,
                                               const capex_batch_norm_args *a, int bwd, uint64_t ws, uint64_t ws_bytes) {
    capex_result r;
    capex__nm_buf bl[10];
    int need, nb = 0, run_out;
    int64_t nx;
    if (!a) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: args is NULL", fn);
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_BATCH_NORM_DESC, fn, "capex_batch_norm_desc",
                               "capex_batch_norm_desc_init")) != CAPEX_OK ||
        (r = capex__desc_check(a->init_tag, CAPEX__TAG_BATCH_NORM_ARGS, fn, "capex_batch_norm_args",
                               "capex_batch_norm_args_init")) != CAPEX_OK)
        return r;
    if (!(d->eps >= 0.0f) || d->eps > 3.4e38f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: eps %g must be finite and >= 0", fn, (double)d->eps);
    if (!(d->momentum >= 0.0f && d->momentum <= 1.0f))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: momentum %g must be in [0, 1]", fn, (double)d->momentum);
    if (!bwd && d->cumulative_average && d->training && a->running_mean && (!a->num_batches_tracked || *a->num_batches_tracked < 0))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: cumulative_average (momentum=None) needs num_batches_tracked "
                           "(a counter >= 0, saved with the running statistics)", fn);
    if (a->c < 1 || a->s < 1 || a->n < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: shape n=%lld c=%lld s=%lld: need n >= 0, c >= 1, s >= 1", fn,
                           (long long)a->n, (long long)a->c, (long long)a->s);
    if (a->c > (int64_t)(SIZE_MAX / 64) / a->s || a->n > (int64_t)(SIZE_MAX / 8) / (a->c * a->s))
        return capex__fail(CAPEX_ERR_LIMIT, "%s: n * c * s overflows", fn);
    if (a->layout != CAPEX_BN_NCS && a->layout != CAPEX_BN_NSC)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: layout must be CAPEX_BN_NCS or CAPEX_BN_NSC", fn);
    if (!capex__nm_dtype_ok(a->x_dtype) || !capex__nm_dtype_ok(a->y_dtype) || !capex__nm_dtype_ok(a->param_dtype))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: x_dtype, y_dtype and param_dtype must be CAPEX_F32/F16/BF16", fn);
#ifdef CAPEX_NO_DIST
    if (comm)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: built with CAPEX_NO_DIST (no SyncBatchNorm): pass comm NULL", fn);
#else
    if (comm && (!comm->vt || comm->world_size < 1))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: comm is not initialised", fn);
    if (comm && comm->device_buffers && comm->world_size > 1)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: comm '%s' takes device buffers; use the GPU SyncBatchNorm "
                           "(capex_cuda.h) or a host comm (MPI, TCP)", fn, comm->vt->name ? comm->vt->name : "?");
#endif
    if (!a->running_mean != !a->running_var)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: give both running_mean and running_var, or neither", fn);
    need = a->n > 0;
    if ((r = capex__nm_ptr(fn, "x", a->x, a->x_dtype, need)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "weight", a->weight, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "bias", a->bias, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "running_mean", a->running_mean, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "running_var", a->running_var, a->param_dtype, 0)) != CAPEX_OK) return r;
    nx = a->n * a->c * a->s;
    capex__nm_buf_add(bl, &nb, "x", a->x, nx, a->x_dtype, 0, !bwd && a->x_dtype == a->y_dtype);
    capex__nm_buf_add(bl, &nb, "weight", a->weight, a->c, a->param_dtype, 0, 0);
    capex__nm_buf_bytes(bl, &nb, "workspace", ws, ws_bytes, 1, 0);
    if (!bwd) {
        if ((r = capex__nm_ptr(fn, "y", a->y, a->y_dtype, need)) != CAPEX_OK) return r;
        if ((r = capex__nm_ptr(fn, "save_mean", a->save_mean, CAPEX_F32, 0)) != CAPEX_OK) return r;
        if ((r = capex__nm_ptr(fn, "save_invstd", a->save_invstd, CAPEX_F32, 0)) != CAPEX_OK) return r;
        /* running statistics: updated in training, read in eval */
        run_out = d->training != 0;
        capex__nm_buf_add(bl, &nb, "bias", a->bias, a->c, a->param_dtype, 0, 0);
        capex__nm_buf_add(bl, &nb, "running_mean", a->running_mean, a->c, a->param_dtype, run_out, 0);
        capex__nm_buf_add(bl, &nb, "running_var", a->running_var, a->c, a->param_dtype, run_out, 0);
        capex__nm_buf_add(bl, &nb, "y", a->y, nx, a->y_dtype, 1, a->x_dtype == a->y_dtype);
        capex__nm_buf_add(bl, &nb, "save_mean", a->save_mean, a->c, CAPEX_F32, 1, 0);
        capex__nm_buf_add(bl, &nb, "save_invstd", a->save_invstd, a->c, CAPEX_F32, 1, 0);
        return capex__nm_overlap(fn, bl, nb);
    }
    if ((r = capex__nm_ptr(fn, "dy", a->dy, a->y_dtype, need)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "save_mean (from forward)", a->save_mean, CAPEX_F32, 1)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "save_invstd (from forward)", a->save_invstd, CAPEX_F32, 1)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "dx", a->dx, a->x_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "dweight", a->dweight, a->param_dtype, 0)) != CAPEX_OK) return r;
    if ((r = capex__nm_ptr(fn, "dbias", a->dbias, a->param_dtype, 0)) != CAPEX_OK) return r;
    /* backward reads x, dy, weight, save_mean, save_invstd (the running statistics only as present/absent) */
    capex__nm_buf_add(bl, &nb, "dy", a->dy, nx, a->y_dtype, 0, 0);
    capex__nm_buf_add(bl, &nb, "save_mean", a->save_mean, a->c, CAPEX_F32, 0, 0);
    capex__nm_buf_add(bl, &nb, "save_invstd", a->save_invstd, a->c, CAPEX_F32, 0, 0);
    capex__nm_buf_add(bl, &nb, "dx", a->dx, nx, a->x_dtype, 1, 0);
    capex__nm_buf_add(bl, &nb, "dweight", a->dweight, a->c, a->param_dtype, 1, 0);
    capex__nm_buf_add(bl, &nb, "dbias", a->dbias, a->c, a->param_dtype, 1, 0);
    return capex__nm_overlap(fn, bl, nb);
}
static capex_result capex__bn_check(const char *fn, const capex_batch_norm_desc *d, capex_comm *comm,
                                    const capex_batch_norm_args *a, int bwd) {
    return capex__bn_check_ws(fn, d, comm, a, bwd, 0, 0);
}

/* Scratch of a BN call: params (2C), mean/invstd (2C), pack (world * P),
   reduce (2C), NSC partials (2 * nblk * C), per-worker buffers (3 * max(S, C),
   then 2C doubles at dofs, 8-byte aligned), NCS sums (2C doubles). */
typedef struct capex__bn_mem {
    float *all, *wf, *mean, *invstd, *pack, *gath, *red, *p0, *work;
    double *s;
    int64_t dofs;
    size_t per;
    int T;
    int64_t nblk;
} capex__bn_mem;

static capex_result capex__bn_alloc(const char *fn, const capex_batch_norm_args *a, int world, int nt,
                                    int64_t items, const capex_allocator *al, capex__bn_mem *m) {
    const size_t C = (size_t)a->c, P = capex_syncbn_pack_floats(a->c);
    size_t total, at = 0;
    int64_t rows = a->n * a->s;
    memset(m, 0, sizeof *m);
    m->nblk = 0;
    if (a->layout == CAPEX_BN_NSC && rows > 0) {
        int64_t brows = (rows + 63) / 64;
        if (brows < 16) brows = 16;
        m->nblk = (rows + brows - 1) / brows;
    }
    m->T = capex__nm_threads(nt, items, rows * a->c);
    m->dofs = (int64_t)((3u * (size_t)(a->s > a->c ? a->s : a->c) + 1u) & ~(size_t)1);
    m->per = (size_t)m->dofs + 4 * C; /* even */
    total = 2 * C + 2 * C + P + (size_t)world * P + 2 * C + 2u * (size_t)m->nblk * C + m->per * (size_t)m->T + 4 * C + 4;
    if (total > SIZE_MAX / sizeof(float)) return capex__fail(CAPEX_ERR_LIMIT, "%s: scratch size overflows", fn);
    m->all = (float *)capex__alloc(al, total * sizeof(float));
    if (!m->all)
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes of scratch", fn, total * sizeof(float));
    m->wf = m->all; at = 2 * C;
    m->mean = m->all + at; m->invstd = m->mean + C; at += 2 * C;
    m->pack = m->all + at; at += P;
    m->gath = m->all + at; at += (size_t)world * P;
    m->red = m->all + at; at += 2 * C;
    m->p0 = m->all + at; at += 2u * (size_t)m->nblk * C;
    at = (at + 1u) & ~(size_t)1; /* workers' double rows 8-byte aligned */
    m->work = m->all + at; at += m->per * (size_t)m->T;
    m->s = (double *)(void *)(m->all + at);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_batch_norm_forward(const capex_batch_norm_desc *d, capex_comm *comm,
                                                capex_batch_norm_args *a) {
    static const char *fn = "capex_batch_norm_forward";
    capex_batch_norm_desc dd;
    capex__bn_ctx c;
    capex__bn_mem m;
    capex_result r;
    int world = capex__bn_world(comm), use_batch;
    int64_t C, rows, ch, total = 0, local;
    const float *wf, *bf;
    if (!d) { capex_batch_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__bn_check(fn, d, comm, a, 0)) != CAPEX_OK) return r;
    /* torch: batch statistics in training, or when there are no running stats;
       synced in training only (eval: this rank's batch) unless asked */
    use_batch = d->training || !a->running_mean;
    if (!use_batch || world < 1 || !(d->training || d->sync_eval_batch_stats)) world = 1;
    C = a->c; rows = a->n * a->s; local = rows;
    if ((r = capex__bn_alloc(fn, a, world, d->num_threads,
                             a->layout == CAPEX_BN_NCS ? a->n * C : rows, d->allocator, &m)) != CAPEX_OK)
        return r;
    memset(&c, 0, sizeof c);
    c.a = a; c.rows = rows; c.in_place = a->y == a->x;
    capex__nm_params(a->weight, a->bias, a->param_dtype, C, m.wf, &wf, &bf);
    if (use_batch) {
        float *pk = m.pack;
        c.pk = pk;
        for (ch = 0; ch < 3 * C; ch++) pk[ch] = 0.0f;
        if (rows > 0 && a->layout == CAPEX_BN_NCS) {
            int T = capex__nm_threads(d->num_threads, C, rows * C);
            if (T > m.T) T = m.T;
            capex__nm_run(T, C, capex__bn_stats_ncs, &c, m.work, m.per);
        } else if (rows > 0) {
            int64_t b, brows = (rows + 63) / 64;
            int T = capex__nm_threads(d->num_threads, m.nblk, rows * C);
            if (brows < 16) brows = 16;
            if (T > m.T) T = m.T;
            c.brows = brows; c.p0 = m.p0; c.p1 = m.p0 + m.nblk * C; c.dofs = m.dofs;
            capex__nm_run(T, m.nblk, capex__bn_stats_nsc, &c, m.work, m.per);
            for (ch = 0; ch < C; ch++) { /* blocks merged in order, float64 */
                double n = 0.0, mu = 0.0, q = 0.0;
                for (b = 0; b < m.nblk; b++) {
                    double nb = (double)((b + 1) * brows < rows ? brows : rows - b * brows), dm;
                    dm = (double)c.p0[b * C + ch] - mu;
                    mu += dm * nb / (n + nb);
                    q += (double)c.p1[b * C + ch] + dm * dm * n * nb / (n + nb);
                    n += nb;
                }
                capex__bn_pack_mean(pk, C, ch, (double)capex__nm_get(a->x, a->x_dtype, ch) + mu); /* the blocks' shift, row 0 */
                pk[2 * C + ch] = (float)(q / n);
            }
        }
        pk[3 * C] = (float)(local >> 24);
        pk[3 * C + 1] = (float)(local & 0xffffff);
        if (world > 1) {
            r = capex__bn_collective(comm, 1, pk, m.gath, capex_syncbn_pack_floats(C));
            if (r != CAPEX_OK) { capex__free(d->allocator, m.all); return r; }
        } else {
            memcpy(m.gath, pk, capex_syncbn_pack_floats(C) * sizeof(float));
        }
        r = capex_syncbn_merge(m.gath, world, C, m.mean, m.red, &total);
        /* torch: an empty batch without a collective gives an empty output and leaves the
           running statistics (it still counts the batch); SyncBatchNorm has no global
           statistics when every rank is empty */
        if (r == CAPEX_OK && total < 1 && world > 1)
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the batch is empty on every rank: no statistics", fn);
        if (r == CAPEX_OK && total == 1) /* use_batch: torch's batch-statistics path checks this in eval too */
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %lld value(s) per channel over all ranks; training needs "
                            "more than 1 (PyTorch: 'Expected more than 1 value per channel when training')", fn,
                            (long long)total);
        if (r != CAPEX_OK) { capex__free(d->allocator, m.all); return r; }
        for (ch = 0; ch < C; ch++) m.invstd[ch] = capex__nm_rstd(m.red[ch], d->eps);
        if (d->training && a->running_mean && total == 0) {
            if (a->num_batches_tracked) ++*a->num_batches_tracked;
        } else if (d->training && a->running_mean) {
            const float mo = capex_batch_norm_momentum(d, a->num_batches_tracked);
            for (ch = 0; ch < C; ch++) {
                double unbiased = (double)m.red[ch] * (double)total / (double)(total - 1);
                float rm = capex__nm_get(a->running_mean, a->param_dtype, ch);
                float rv = capex__nm_get(a->running_var, a->param_dtype, ch);
                capex__nm_store_one(a->running_mean, a->param_dtype, ch, (1.0f - mo) * rm + mo * m.mean[ch]);
                capex__nm_store_one(a->running_var, a->param_dtype, ch, (1.0f - mo) * rv + mo * (float)unbiased);
            }
        }
    } else {
        total = local;
        for (ch = 0; ch < C; ch++) {
            m.mean[ch] = capex__nm_get(a->running_mean, a->param_dtype, ch);
            m.invstd[ch] = capex__nm_rstd(capex__nm_get(a->running_var, a->param_dtype, ch), d->eps);
        }
    }
    if (a->save_mean) memcpy(a->save_mean, m.mean, (size_t)C * sizeof(float));
    if (a->save_invstd) memcpy(a->save_invstd, m.invstd, (size_t)C * sizeof(float));
    a->total_count = use_batch ? total : 0;
    c.mean = m.mean; c.invstd = m.invstd; c.wf = wf; c.bf = bf;
    if (rows > 0) {
        int64_t items = a->layout == CAPEX_BN_NCS ? a->n * C : rows;
        int T = capex__nm_threads(d->num_threads, items, rows * C);
        if (T > m.T) T = m.T;
        capex__nm_run(T, items, a->layout == CAPEX_BN_NCS ? capex__bn_fwd_ncs : capex__bn_fwd_nsc, &c, m.work, m.per);
    }
    capex__free(d->allocator, m.all);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_batch_norm_backward(const capex_batch_norm_desc *d, capex_comm *comm,
                                                 const capex_batch_norm_args *a) {
    static const char *fn = "capex_batch_norm_backward";
    capex_batch_norm_desc dd;
    capex__bn_ctx c;
    capex__bn_mem m;
    capex_result r;
    int world = capex__bn_world(comm), use_batch;
    int64_t C, rows, ch;
    const float *wf, *bf;
    float *sdy, *sdyx;
    if (!d) { capex_batch_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__bn_check(fn, d, comm, a, 1)) != CAPEX_OK) return r;
    use_batch = d->training || !a->running_mean;
    if (!use_batch || world < 1 || !(d->training || d->sync_eval_batch_stats)) world = 1; /* as forward */
    C = a->c; rows = a->n * a->s;
    if (use_batch && a->total_count < 1 && !(rows == 0 && world == 1)) /* an empty batch's forward writes 0 */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: total_count %lld: pass the args forward filled in (it "
                           "writes total_count)", fn, (long long)a->total_count);
    if ((r = capex__bn_alloc(fn, a, world, d->num_threads, a->layout == CAPEX_BN_NCS ? C : rows,
                             d->allocator, &m)) != CAPEX_OK)
        return r;
    memset(&c, 0, sizeof c);
    c.a = a; c.rows = rows; c.mean = a->save_mean; c.invstd = a->save_invstd;
    capex__nm_params(a->weight, NULL, a->param_dtype, C, m.wf, &wf, &bf);
    c.wf = wf;
    sdy = m.red; sdyx = m.red + C;
    for (ch = 0; ch < 2 * C; ch++) m.red[ch] = 0.0f;
    if (rows > 0 && a->layout == CAPEX_BN_NCS) {
        int T = capex__nm_threads(d->num_threads, C, rows * C);
        if (T > m.T) T = m.T;
        c.s0 = m.s; c.s1 = m.s + C;
        capex__nm_run(T, C, capex__bn_sums_ncs, &c, m.work, m.per);
        for (ch = 0; ch < C; ch++) { sdy[ch] = (float)c.s0[ch]; sdyx[ch] = (float)c.s1[ch]; }
    } else if (rows > 0) {
        int64_t b, brows = (rows + 63) / 64;
        int T;
        if (brows < 16) brows = 16;
        T = capex__nm_threads(d->num_threads, m.nblk, rows * C);
        if (T > m.T) T = m.T;
        c.brows = brows; c.p0 = m.p0; c.p1 = m.p0 + m.nblk * C; c.dofs = m.dofs;
        capex__nm_run(T, m.nblk, capex__bn_sums_nsc, &c, m.work, m.per);
        for (ch = 0; ch < C; ch++) {
            double s0 = 0.0, s1 = 0.0;
            for (b = 0; b < m.nblk; b++) { s0 += (double)c.p0[b * C + ch]; s1 += (double)c.p1[b * C + ch]; }
            sdy[ch] = (float)s0; sdyx[ch] = (float)s1;
        }
    }
    /* PyTorch: grad_weight/grad_bias from this rank's sums (DDP reduces them) */
    for (ch = 0; ch < C; ch++) { /* an empty batch alone: 0 (torch), not 0 * inf for eps 0 */
        if (a->dweight)
            capex__nm_store_one(a->dweight, a->param_dtype, ch, rows == 0 && world == 1 ? 0.0f : sdyx[ch] * a->save_invstd[ch]);
        if (a->dbias) capex__nm_store_one(a->dbias, a->param_dtype, ch, sdy[ch]);
    }
    if (use_batch && world > 1) {
        r = capex__bn_collective(comm, 0, m.red, m.red, 2u * (size_t)C);
        if (r != CAPEX_OK) { capex__free(d->allocator, m.all); return r; }
    }
    if (a->dx && rows > 0) {
        int64_t items = a->layout == CAPEX_BN_NCS ? a->n * C : rows;
        int T = capex__nm_threads(d->num_threads, items, rows * C);
        if (T > m.T) T = m.T;
        c.sdy = sdy; c.sdyx = sdyx;
        c.mdy_scale = use_batch ? (float)(1.0 / (double)a->total_count) : 0.0f;
        /* eval has no batch terms (torch): not 0 * sum, NaN for a non-finite sum (one inf in the
           channel's dy or x would make all its dx NaN). Same bits as the formula otherwise. */
        c.eval = !use_batch;
        capex__nm_run(T, items, a->layout == CAPEX_BN_NCS ? capex__bn_dx_ncs : capex__bn_dx_nsc, &c, m.work, m.per);
    }
    capex__free(d->allocator, m.all);
    return CAPEX_OK;
}

#ifdef __cplusplus
}
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT DEFAULT
#elif defined(CAPEX__GCC_NO_CONTRACT)
#pragma GCC pop_options
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
