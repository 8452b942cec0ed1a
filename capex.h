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
   call fails fast: tear the job down). Thread safety: a capex_comm and a
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
    CAPEX_LAUNCHER_SLURM = 5     /* srun: SLURM_PROCID, SLURM_NTASKS, ...      */
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
} capex_dist_env_desc;

typedef struct capex_dist_env {
    capex_launcher launcher;
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank;          /* rank / local_world_size when uniform, else -1 */
    char master_addr[256];  /* "" when unknown                               */
    int master_port;        /* 0 when unknown                                */
    char run_id[128];       /* CAPEX_RUN_ID, TORCHELASTIC_RUN_ID, SLURM job  */
} capex_dist_env;

CAPEX_API void capex_dist_env_desc_init(capex_dist_env_desc *d);
/* Reads the launcher's variables (d may be NULL: defaults). Precedence, first
   match wins: explicit desc fields > torchrun (RANK) > Open MPI
   (OMPI_COMM_WORLD_RANK) > PMI (PMI_RANK) > Slurm (SLURM_PROCID) > single
   process. Numbers parse strictly (decimal digits only); rank < world etc. are
   validated; errors are CAPEX_ERR_CONFIG naming the variable. Reentrant. */
CAPEX_API capex_result capex_dist_env_read(const capex_dist_env_desc *d, capex_dist_env *out);
CAPEX_API const char *capex_launcher_name(capex_launcher l);
/* Sets the log rank (capex_log_set_rank) so default warnings print once. */
CAPEX_API void capex_dist_log_init(const capex_dist_env *env);

/* -- communicator -- */
typedef enum capex_reduce_op { CAPEX_REDUCE_SUM = 0, CAPEX_REDUCE_AVG = 1 } capex_reduce_op;

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
   With CAPEX_MPI, capex_comm_init_mpi(c, MPI_Comm) takes any communicator. */
CAPEX_API capex_result capex_comm_init_mpi_world(capex_comm *c);
CAPEX_API void capex_comm_destroy(capex_comm *c);
/* TCP star through rank 0 at env's MASTER_ADDR:MASTER_PORT (nonce from
   env's run id): CPU jobs without MPI, e.g. under torchrun --no-python.
   Deterministic (rank-order sums), synchronous, O(world) load on rank 0. */
CAPEX_API capex_result capex_comm_init_tcp(capex_comm *c, const capex_dist_env *env, double connect_timeout_s);
/* The backend for how the job was launched: MPI when built with CAPEX_MPI
   and MPI is initialised (call MPI_Init first), else TCP when env has more
   than one rank (torchrun --no-python, srun), else single. Checks that the
   comm's rank and size agree with env. */
CAPEX_API capex_result capex_comm_init_auto(capex_comm *c, const capex_dist_env *env);
/* Checked front-ends: argument checks, deadline = now + timeout_s, failure
   marking. send == recv (in place) is allowed. AVG = sum, then / world. */
CAPEX_API capex_result capex_comm_allreduce(capex_comm *c, const void *send, void *recv, size_t count,
                                            capex_dtype t, capex_reduce_op op);
CAPEX_API capex_result capex_comm_broadcast(capex_comm *c, void *buf, size_t count, capex_dtype t, int root);
CAPEX_API capex_result capex_comm_allgather(capex_comm *c, const void *send, void *recv, size_t count_per_rank,
                                            capex_dtype t);
CAPEX_API capex_result capex_comm_barrier(capex_comm *c);

/* -- TCP rendezvous: rank 0 sends a small blob to every rank -- */
typedef struct capex_rendezvous_desc {
    const char *addr;      /* MASTER_ADDR (name or numeric); rank 0 binds it */
    int port;              /* MASTER_PORT                                    */
    int rank, world_size;
    uint64_t nonce;        /* per run: capex_rendezvous_nonce(env.run_id)    */
    double timeout_s;      /* whole-call deadline (default 300 s)            */
    double retry_interval_s; /* between connection attempts (default 0.05) */
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
   all. Deadline: CAPEX_ERR_TIMEOUT. Unix only (else CAPEX_ERR_UNSUPPORTED).
   Thread-safe (no shared state). */
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
    float gradient_predivide_factor; /* 1.0 (Apex): x/f before, x*f/world after */
    int allreduce_always_fp32;  /* 0: half buckets reduced through f32 if 1    */
    int find_unused_parameters; /* 0: finalize fails if a param was not ready   */
    int rebuild_buckets;        /* 0: rebuild once from rank 0's ready order    */
    int broadcast_parameters;   /* 1: rank 0's params to all at create          */
} capex_ddp_desc;

typedef struct capex_ddp_bucket_info {
    capex_dtype dtype;          /* of the grads in it                           */
    size_t numel;               /* elements in the bucket                       */
    size_t num_params;
    const size_t *params;       /* param indices, in bucket (ready) order       */
    const size_t *offsets;      /* element offset of each param in the bucket   */
} capex_ddp_bucket_info;

CAPEX_API void capex_ddp_desc_init(capex_ddp_desc *d);
/* Plans buckets (per dtype, params in reverse order: the order backward
   produces them), allocates their buffers and, if asked, broadcasts the
   parameters from rank 0. comm must outlive the ddp. Not thread-safe. */
CAPEX_API capex_result capex_ddp_create(capex_ddp **out, capex_comm *comm, const capex_ddp_param *params,
                                        size_t num_params, const capex_ddp_desc *d);
CAPEX_API void capex_ddp_destroy(capex_ddp *ddp);
/* Broadcasts every parameter's data from rank 0 (done by create unless
   broadcast_parameters is 0; call again after loading a checkpoint on rank 0
   only). Collective: every rank calls it. */
CAPEX_API capex_result capex_ddp_broadcast_parameters(capex_ddp *ddp);
/* Where param i's gradient lives (a view into its bucket; the engine's own
   buffer when it gave one). Changes once if rebuild_buckets rebuilds:
   capex_ddp_layout_version() tells when to ask again. NULL if out of range. */
CAPEX_API void *capex_ddp_grad(capex_ddp *ddp, size_t param);
CAPEX_API int capex_ddp_layout_version(const capex_ddp *ddp);
CAPEX_API size_t capex_ddp_num_buckets(const capex_ddp *ddp);
CAPEX_API capex_result capex_ddp_bucket(const capex_ddp *ddp, size_t bucket, capex_ddp_bucket_info *out);
/* Zeroes every gradient (bucket buffers and the engine's own grads). */
CAPEX_API capex_result capex_ddp_zero_grad(capex_ddp *ddp);
/* sync = 0 is PyTorch's no_sync(): grads accumulate, finalize reduces nothing. */
CAPEX_API capex_result capex_ddp_set_sync(capex_ddp *ddp, int sync);
/* Param i's gradient is complete for this iteration. When its bucket is full
   and every earlier bucket has launched, the bucket's allreduce starts (and
   then any later full buckets, strictly in order). Twice in one iteration or
   an unknown index: CAPEX_ERR_ORDER / CAPEX_ERR_INVALID_ARG. */
CAPEX_API capex_result capex_ddp_grad_ready(capex_ddp *ddp, size_t param);
/* Param i takes no part in this iteration (its grad counts as zero). */
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

/* -- distributed sampler (PyTorch DistributedSampler) -- */
typedef struct capex_sampler_desc {
    uint64_t dataset_size;
    int num_replicas;   /* world size                                           */
    int rank;
    int shuffle;        /* 1                                                    */
    uint64_t seed;      /* 0                                                    */
    int drop_last;      /* 0: pad by repeating the start of the permutation     */
} capex_sampler_desc;

typedef struct capex_sampler {
    capex_sampler_desc d;
    uint64_t epoch;
    uint64_t num_samples;  /* per rank: ceil(N/R), or floor(N/R) with drop_last */
    uint64_t total_size;   /* num_samples * R                                  */
} capex_sampler;

CAPEX_API void capex_sampler_desc_init(capex_sampler_desc *d);
CAPEX_API capex_result capex_sampler_init(capex_sampler *s, const capex_sampler_desc *d);
CAPEX_API void capex_sampler_set_epoch(capex_sampler *s, uint64_t epoch);
/* The k-th index (k < num_samples) of this rank, O(1): no allocation. */
CAPEX_API capex_result capex_sampler_index(const capex_sampler *s, uint64_t k, uint64_t *index);
/* Writes all num_samples indices of this rank into out[0..cap). */
CAPEX_API capex_result capex_sampler_indices(const capex_sampler *s, uint64_t *out, size_t cap);
/* The shuffle: a bijection of [0, n) keyed by `key` (seed + epoch). */
CAPEX_API uint64_t capex_permute_index(uint64_t i, uint64_t n, uint64_t key);

#ifdef CAPEX_MPI
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

/* ---- data parallel: platform ------------------------------------------- */
/* POSIX pieces (clock, sockets) are guarded: a build where they are hidden
   (strict -std=c99 with a system header included before capex.h) falls back
   to time() and numeric IPv4 addresses; CAPEX_NO_SOCKETS leaves the
   rendezvous out entirely. */
#if (defined(__unix__) || defined(__APPLE__)) && !defined(CAPEX_NO_SOCKETS)
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

/* ---- data parallel: launcher environment -------------------------------- */

static const char *capex__getenv_default(const char *name, void *user) {
    (void)user;
    return getenv(name);
}

CAPEX_API void capex_dist_env_desc_init(capex_dist_env_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
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
    int found = 0, lr_found = 0, lw_found = 0, v = 0;
    const char *rank_var = "", *size_var = "", *s;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_env_read: out is NULL");
    if (!desc) { capex_dist_env_desc_init(&dd); desc = &dd; }
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
           spawns several workers per task and RANK is theirs. */
        static const char *const names[4][5] = {
            {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL},
            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL},
            {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL},
            {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", NULL}};
        static const capex_launcher kinds[4] = {CAPEX_LAUNCHER_TORCHRUN, CAPEX_LAUNCHER_OPENMPI, CAPEX_LAUNCHER_PMI,
                                                CAPEX_LAUNCHER_SLURM};
        int k;
        for (k = 0; k < 4; k++) {
            if (!e.fn(names[k][0], e.user)) continue;
            rank_var = names[k][0]; size_var = names[k][1];
            if ((res = capex__env_int(&e, names[k][0], &r.rank, &found)) != CAPEX_OK) return res;
            if ((res = capex__env_int(&e, names[k][1], &r.world_size, &found)) != CAPEX_OK) return res;
            if (!found && k == 3) {
                if ((res = capex__env_int(&e, "SLURM_NPROCS", &r.world_size, &found)) != CAPEX_OK) return res;
                size_var = "SLURM_NPROCS";
            }
            if (!found)
                return capex__fail(CAPEX_ERR_CONFIG, "%s is set but %s is not: the %s launch is incomplete; set both",
                                   names[k][0], names[k][1], capex_launcher_name(kinds[k]));
            if ((res = capex__env_int(&e, names[k][2], &r.local_rank, &lr_found)) != CAPEX_OK) return res;
            s = e.fn(names[k][3], e.user);
            if (k == 3 && s && !capex__parse_int(s, &v)) {
                /* SLURM_NTASKS_PER_NODE may be a list like "2(x3)": use
                   SLURM_TASKS_PER_NODE and SLURM_NODEID instead below. */
                s = NULL;
            }
            if (s) {
                if ((res = capex__env_int(&e, names[k][3], &r.local_world_size, &lw_found)) != CAPEX_OK) return res;
            } else if (k == 3) {
                int node = 0, nf = 0;
                if ((res = capex__env_int(&e, "SLURM_NODEID", &node, &nf)) != CAPEX_OK) return res;
                s = e.fn("SLURM_TASKS_PER_NODE", e.user);
                if (nf && s) {
                    int t = capex__slurm_tasks_on_node(s, node);
                    if (t <= 0)
                        return capex__fail(CAPEX_ERR_CONFIG, "SLURM_TASKS_PER_NODE='%.64s' is malformed or has no "
                                                             "entry for SLURM_NODEID=%d", s, node);
                    r.local_world_size = t;
                    lw_found = 1;
                }
            }
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
    r.node_rank = r.world_size % r.local_world_size == 0 ? r.rank / r.local_world_size : -1;

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
    if (desc->run_id) s = desc->run_id;
    else if ((s = e.fn("CAPEX_RUN_ID", e.user)) != NULL) { }
    else if ((s = e.fn("TORCHELASTIC_RUN_ID", e.user)) != NULL) { }
    else if ((s = e.fn("OMPI_MCA_ess_base_jobid", e.user)) != NULL) { }
    else if ((s = e.fn("SLURM_JOB_ID", e.user)) != NULL) {
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

CAPEX__PRIVATE float capex__load(const void *p, capex_dtype t, size_t i) {
    if (t == CAPEX_F32) return ((const float *)p)[i];
    if (t == CAPEX_F16) return capex__f16_to_f32_inline(((const uint16_t *)p)[i]);
    return capex__bits_f32((uint32_t)((const uint16_t *)p)[i] << 16);
}
CAPEX__PRIVATE void capex__store(void *p, capex_dtype t, size_t i, float v) {
    if (t == CAPEX_F32) ((float *)p)[i] = v;
    else if (t == CAPEX_F16) ((uint16_t *)p)[i] = capex__f16_from_bits(capex__f32_bits(v));
    else ((uint16_t *)p)[i] = capex__bf16_from_bits(capex__f32_bits(v));
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
        return capex__fail(CAPEX_ERR_COMM, "%s: this communicator failed earlier (timeout or dead peer); its state "
                                           "is unknown: stop the job and restart from a checkpoint", what);
    return CAPEX_OK;
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

CAPEX__PRIVATE double capex__deadline(const capex_comm *c) {
    double t = c->timeout_s > 0 ? c->timeout_s : 1800.0;
    return capex_dist_now() + t;
}

CAPEX_API capex_result capex_comm_allreduce(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                            capex_reduce_op op) {
    capex_result r = capex__comm_check(c, "capex_comm_allreduce");
    if (r) return r;
    if (!capex__dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: invalid dtype %d", (int)t);
    if (op != CAPEX_REDUCE_SUM && op != CAPEX_REDUCE_AVG)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: op %d is not SUM or AVG", (int)op);
    if (count && (!send || !recv)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allreduce: NULL buffer");
    if (!count) return CAPEX_OK;
    return capex__comm_after(c, c->vt->allreduce(c, send, recv, count, t, op, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_broadcast(capex_comm *c, void *buf, size_t count, capex_dtype t, int root) {
    capex_result r = capex__comm_check(c, "capex_comm_broadcast");
    if (r) return r;
    if (!capex__dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: invalid dtype %d", (int)t);
    if (root < 0 || root >= c->world_size)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: root %d not in [0, %d)", root, c->world_size);
    if (count && !buf) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_broadcast: NULL buffer");
    if (!count) return CAPEX_OK;
    return capex__comm_after(c, c->vt->broadcast(c, buf, count, t, root, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_allgather(capex_comm *c, const void *send, void *recv, size_t count_per_rank,
                                            capex_dtype t) {
    capex_result r = capex__comm_check(c, "capex_comm_allgather");
    if (r) return r;
    if (!capex__dtype_ok(t)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allgather: invalid dtype %d", (int)t);
    if (count_per_rank && (!send || !recv)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_allgather: NULL buffer");
    if (!count_per_rank) return CAPEX_OK;
    return capex__comm_after(c, c->vt->allgather(c, send, recv, count_per_rank, t, capex__deadline(c)));
}

CAPEX_API capex_result capex_comm_barrier(capex_comm *c) {
    capex_result r = capex__comm_check(c, "capex_comm_barrier");
    if (r) return r;
    return capex__comm_after(c, c->vt->barrier(c, capex__deadline(c)));
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
    return capex__comm_copy(c, recv, send, n * capex_dtype_size(t), CAPEX_COPY_D2D);
}
static capex_result capex__single_broadcast(capex_comm *c, void *buf, size_t n, capex_dtype t, int root, double deadline) {
    (void)c; (void)buf; (void)n; (void)t; (void)root; (void)deadline;
    return CAPEX_OK;
}
static capex_result capex__single_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                           double deadline) {
    (void)deadline;
    return capex__comm_copy(c, recv, send, n * capex_dtype_size(t), CAPEX_COPY_D2D);
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

static const capex_comm_vtable capex__single_vt = {
    "single", capex__single_allreduce, capex__single_broadcast, capex__single_allgather, capex__single_barrier,
    capex__single_iallreduce, capex__single_wait, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

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

/* Blocking collectives are run as their MPI-3 nonblocking twins polled with
   MPI_Test until the deadline, so a stuck peer gives CAPEX_ERR_TIMEOUT rather
   than a hang. Half types are summed in f32 and rounded once. Counts above
   INT_MAX are split into chunks. */
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

/* Polls req until done or the deadline: spins briefly, then sleeps 50 us
   between tests so oversubscribed ranks leave the CPU to their peers. */
static capex_result capex__mpi_poll(MPI_Request *req, double deadline, const char *what) {
    long spins = 0;
    for (;;) {
        int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, what);
        if (flag) return CAPEX_OK;
        if (++spins > 200) {
            if (capex_dist_now() > deadline)
                return capex__fail(CAPEX_ERR_TIMEOUT, "%s did not complete before the deadline: a peer is stuck or "
                                                      "dead; raise comm->timeout_s if it is only slow", what);
            capex__sleep_s(50e-6);
        }
    }
}

static capex_result capex__mpi_allreduce_f32(capex_comm *c, const float *send, float *recv, size_t n, double deadline) {
    size_t off;
    for (off = 0; off < n; off += CAPEX__MPI_CHUNK) {
        int m = (int)(n - off < CAPEX__MPI_CHUNK ? n - off : CAPEX__MPI_CHUNK), rc;
        MPI_Request q;
        rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : (const void *)(send + off), recv + off, m, MPI_FLOAT, MPI_SUM,
                            capex__mpi_comm(c), &q);
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Iallreduce");
        if ((rc = capex__mpi_poll(&q, deadline, "MPI allreduce")) != CAPEX_OK) return (capex_result)rc;
    }
    return CAPEX_OK;
}

static capex_result capex__mpi_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                        capex_reduce_op op, double deadline) {
    capex_result r;
    if (t == CAPEX_F32) {
        r = capex__mpi_allreduce_f32(c, (const float *)send, (float *)recv, n, deadline);
    } else {
        float *tmp = (float *)capex__alloc(c->allocator, n * sizeof(float));
        if (!tmp) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "MPI allreduce: no memory for the f32 staging buffer");
        capex__host_convert(tmp, CAPEX_F32, send, t, n);
        r = capex__mpi_allreduce_f32(c, tmp, tmp, n, deadline);
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
    size_t bytes = n * capex_dtype_size(t), off;
    for (off = 0; off < bytes; off += CAPEX__MPI_CHUNK) {
        int m = (int)(bytes - off < CAPEX__MPI_CHUNK ? bytes - off : CAPEX__MPI_CHUNK), rc;
        MPI_Request q;
        rc = MPI_Ibcast((char *)buf + off, m, MPI_BYTE, root, capex__mpi_comm(c), &q);
        if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Ibcast");
        if ((rc = capex__mpi_poll(&q, deadline, "MPI broadcast")) != CAPEX_OK) return (capex_result)rc;
    }
    return CAPEX_OK;
}

static capex_result capex__mpi_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                        double deadline) {
    size_t bytes = n * capex_dtype_size(t);
    MPI_Request q;
    int rc;
    if (bytes > (size_t)INT_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "MPI allgather: %lu bytes per rank exceed INT_MAX; gather in pieces",
                           (unsigned long)bytes);
    rc = MPI_Iallgather(send == (const char *)recv + bytes * (size_t)c->rank ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE,
                        recv, (int)bytes, MPI_BYTE, capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Iallgather");
    return capex__mpi_poll(&q, deadline, "MPI allgather");
}

static capex_result capex__mpi_barrier(capex_comm *c, double deadline) {
    MPI_Request q;
    int rc = MPI_Ibarrier(capex__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return capex__mpi_err(rc, "MPI_Ibarrier");
    return capex__mpi_poll(&q, deadline, "MPI barrier");
}

/* req: p[0] = f32 staging (half types) or NULL, p[1] = recv, n[0] = count,
   n[1] = dtype, n[2] = op; handle = the MPI_Request. */
static capex_result capex__mpi_iallreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                         capex_reduce_op op, capex_comm_req *req) {
    MPI_Request q;
    float *buf = (float *)recv;
    int rc;
    typedef char capex__request_fits[sizeof(MPI_Request) <= sizeof req->handle ? 1 : -1];
    (void)sizeof(capex__request_fits);
    if (n > (size_t)INT_MAX) return CAPEX_ERR_UNSUPPORTED; /* caller falls back to the chunked blocking path */
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
    memcpy(req->handle.bytes, &q, sizeof q);
    req->p[1] = recv;
    req->n[0] = n;
    req->n[1] = (size_t)t;
    req->n[2] = (size_t)op;
    req->active = 1;
    return CAPEX_OK;
}

static capex_result capex__mpi_wait(capex_comm *c, capex_comm_req *req, double deadline) {
    MPI_Request q;
    capex_result r;
    capex_dtype t = (capex_dtype)req->n[1];
    if (!req->active) return CAPEX_OK;
    memcpy(&q, req->handle.bytes, sizeof q);
    r = capex__mpi_poll(&q, deadline, "MPI allreduce (bucket)");
    if (r != CAPEX_OK) return r; /* the staging buffer stays: MPI may still write it */
    memcpy(req->handle.bytes, &q, sizeof q);
    req->active = 0;
    if (req->p[0]) {
        if ((capex_reduce_op)req->n[2] == CAPEX_REDUCE_AVG)
            capex__host_div(req->p[0], req->n[0], CAPEX_F32, (float)c->world_size);
        capex__host_convert(req->p[1], t, req->p[0], CAPEX_F32, req->n[0]);
        capex__free(c->allocator, req->p[0]);
        req->p[0] = NULL;
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

static const capex_comm_vtable capex__mpi_vt = {
    "mpi", capex__mpi_allreduce, capex__mpi_broadcast, capex__mpi_allgather, capex__mpi_barrier,
    capex__mpi_iallreduce, capex__mpi_wait, NULL, NULL, capex__mpi_destroy, NULL, NULL, NULL, NULL, NULL, NULL,
    capex__mpi_test};

CAPEX_API capex_result capex_comm_init_mpi(capex_comm *c, MPI_Comm mc) {
    int init = 0, fin = 0, rc;
    capex__mpi *m;
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_mpi: comm is NULL");
    memset(c, 0, sizeof *c);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return capex__fail(CAPEX_ERR_ORDER, "capex_comm_init_mpi: call MPI_Init first (and not after MPI_Finalize)");
    m = (capex__mpi *)capex__alloc(NULL, sizeof *m);
    if (!m) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_comm_init_mpi: out of memory");
    if ((rc = MPI_Comm_dup(mc, &m->comm)) != MPI_SUCCESS) { capex__free(NULL, m); return capex__mpi_err(rc, "MPI_Comm_dup"); }
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
#define CAPEX__RDV_VERSION 1u
enum { CAPEX__RDV_OK = 0, CAPEX__RDV_BAD_NONCE = 1, CAPEX__RDV_BAD_WORLD = 2, CAPEX__RDV_BAD_RANK = 3,
       CAPEX__RDV_BAD_SIZE = 4, CAPEX__RDV_DUP_RANK = 5, CAPEX__RDV_BAD_PROTO = 6 };

CAPEX_API void capex_rendezvous_desc_init(capex_rendezvous_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
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
    }
    return "unknown refusal";
}

/* keep (world entries) non-NULL: the peer sockets stay open and move there
   (the TCP comm backend); else they are closed. */
static capex_result capex__rdv_root(const capex_rendezvous_desc *d, void *blob, size_t size, double deadline, int *keep) {
    capex__sockaddr sa;
    capex_result r = capex__resolve(d->addr, d->port, &sa);
    int ls, one = 1, joined = 0, i, refused_foreign = 0;
    int *fds;
    unsigned char msg[32];
    if (r) return r;
    fds = (int *)capex__alloc(NULL, sizeof(int) * (size_t)d->world_size);
    if (!fds) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "rendezvous: out of memory");
    for (i = 0; i < d->world_size; i++) fds[i] = -1;
    ls = socket(sa.family, SOCK_STREAM, 0);
    if (ls < 0) { capex__free(NULL, fds); return capex__fail(CAPEX_ERR_COMM, "rendezvous: socket() failed: %s", strerror(errno)); }
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&sa.ss, sa.len) != 0 || listen(ls, d->world_size < 64 ? d->world_size : 64) != 0) {
        int e = errno;
        close(ls);
        capex__free(NULL, fds);
        return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 cannot listen on %s:%d: %s (port in use? another job "
                                           "or a leftover process; pick another MASTER_PORT)", d->addr, d->port, strerror(e));
    }
    capex__set_nonblock(ls);
    r = CAPEX_OK;
    while (joined < d->world_size - 1) {
        struct pollfd pf;
        int ms = capex__ms_left(deadline), fd, k;
        uint32_t st = CAPEX__RDV_OK, prank, pworld;
        if (ms <= 0) {
            char missing[256];
            size_t len = 0;
            missing[0] = '\0';
            for (i = 1; i < d->world_size && len + 12 < sizeof missing; i++)
                if (fds[i] < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", i);
            r = capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: rank 0 timed out at %s:%d with %d of %d ranks joined "
                                               "(missing: %s; %d foreign peers refused)", d->addr, d->port, joined + 1,
                            d->world_size, missing, refused_foreign);
            break;
        }
        pf.fd = ls; pf.events = POLLIN; pf.revents = 0;
        k = poll(&pf, 1, ms);
        if (k <= 0) continue;
        fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        capex__set_nonblock(fd);
        { int nd = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof nd); }
        /* A peer that connects but never speaks gets at most 10 s. */
        if (capex__io_all(fd, msg, 32, 0, deadline < capex_dist_now() + 10.0 ? deadline : capex_dist_now() + 10.0) != 0) {
            close(fd);
            continue;
        }
        prank = capex__get32(msg + 8);
        pworld = capex__get32(msg + 12);
        if (capex__get32(msg) != CAPEX__RDV_MAGIC || capex__get32(msg + 4) != CAPEX__RDV_VERSION) st = CAPEX__RDV_BAD_PROTO;
        else if (capex__get64(msg + 16) != d->nonce) st = CAPEX__RDV_BAD_NONCE;
        else if (pworld != (uint32_t)d->world_size) st = CAPEX__RDV_BAD_WORLD;
        else if (prank == 0 || prank >= (uint32_t)d->world_size) st = CAPEX__RDV_BAD_RANK;
        else if (capex__get64(msg + 24) != (uint64_t)size) st = CAPEX__RDV_BAD_SIZE;
        else if (fds[prank] >= 0) st = CAPEX__RDV_DUP_RANK;
        if (st == CAPEX__RDV_OK) { fds[prank] = fd; joined++; continue; }
        capex__put32(msg, CAPEX__RDV_MAGIC);
        capex__put32(msg + 4, st);
        capex__put64(msg + 8, d->nonce);
        capex__put64(msg + 16, (uint64_t)size);
        (void)capex__io_all(fd, msg, 24, 1, capex_dist_now() + 1.0);
        close(fd);
        if (st == CAPEX__RDV_BAD_NONCE || st == CAPEX__RDV_BAD_PROTO) { refused_foreign++; continue; }
        r = capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 refused a peer of this run (rank %u, world %u): %s",
                        (unsigned)prank, (unsigned)pworld, capex__rdv_status_name(st));
        break;
    }
    close(ls);
    if (r == CAPEX_OK) {
        capex__put32(msg, CAPEX__RDV_MAGIC);
        capex__put32(msg + 4, CAPEX__RDV_OK);
        capex__put64(msg + 8, d->nonce);
        capex__put64(msg + 16, (uint64_t)size);
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

static capex_result capex__rdv_peer(const capex_rendezvous_desc *d, void *blob, size_t size, double deadline, int *keep) {
    capex__sockaddr sa;
    capex_result r = capex__resolve(d->addr, d->port, &sa);
    unsigned char msg[32];
    int attempts = 0, last_err = 0;
    double retry = d->retry_interval_s > 0 ? d->retry_interval_s : 0.05;
    if (r) return r;
    for (;;) {
        int fd, e;
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
        capex__put32(msg, CAPEX__RDV_MAGIC);
        capex__put32(msg + 4, CAPEX__RDV_VERSION);
        capex__put32(msg + 8, (uint32_t)d->rank);
        capex__put32(msg + 12, (uint32_t)d->world_size);
        capex__put64(msg + 16, d->nonce);
        capex__put64(msg + 24, (uint64_t)size);
        e = capex__io_all(fd, msg, 32, 1, deadline);
        if (e == 0) e = capex__io_all(fd, msg, 24, 0, deadline);
        if (e == -2) { close(fd); continue; } /* reported as a timeout at the loop top */
        if (e) {
            close(fd);
            return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 at %s:%d closed the connection before answering "
                                               "rank %d (it failed or refused this run)", d->addr, d->port, d->rank);
        }
        if (capex__get32(msg) != CAPEX__RDV_MAGIC) {
            close(fd);
            return capex__fail(CAPEX_ERR_COMM, "rendezvous: %s:%d is not a capex rendezvous (bad magic)", d->addr, d->port);
        }
        if (capex__get32(msg + 4) != CAPEX__RDV_OK) {
            uint32_t st = capex__get32(msg + 4);
            close(fd);
            return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0 at %s:%d refused rank %d: %s", d->addr, d->port,
                               d->rank, capex__rdv_status_name(st));
        }
        if (capex__get64(msg + 8) != d->nonce || capex__get64(msg + 16) != (uint64_t)size) {
            close(fd);
            return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank 0's answer has another nonce or size (foreign job)");
        }
        e = size ? capex__io_all(fd, blob, size, 0, deadline) : 0;
        if (keep && e == 0) *keep = fd;
        else close(fd);
        if (e == -2) return capex__fail(CAPEX_ERR_TIMEOUT, "rendezvous: rank %d: the blob did not arrive before the deadline", d->rank);
        if (e) return capex__fail(CAPEX_ERR_COMM, "rendezvous: rank %d: connection lost while receiving the blob", d->rank);
        return CAPEX_OK;
    }
}

/* ---- data parallel: TCP comm backend (star through rank 0) -------------- */
/* For CPU jobs without MPI (torchrun --no-python, srun): every rank keeps
   the rendezvous socket to rank 0; rank 0 reduces in rank order (so every
   rank gets the same bits; half types summed in f32, rounded once) and sends
   the result back. O(world) traffic at rank 0: meant for a node or a few,
   not for large clusters (use MPI or NCCL there). Synchronous: buckets
   reduce when they fill, without overlap. Each message carries an op and a
   sequence number, so ranks calling collectives in different orders get
   CAPEX_ERR_COMM instead of garbage. */
#define CAPEX__TCP_MAGIC 0x43585043u
enum { CAPEX__TCP_ALLREDUCE = 1, CAPEX__TCP_BROADCAST = 2, CAPEX__TCP_ALLGATHER = 3, CAPEX__TCP_BARRIER = 4 };

typedef struct capex__tcp {
    int *fds;      /* rank 0: socket of each peer (fds[0] unused); else fds[0] = rank 0 */
    uint32_t seq;
    void *tmp;
    size_t tmp_bytes;
} capex__tcp;

static capex_result capex__tcp_io_fail(int e, int peer, const char *what) {
    if (e == -2) return capex__fail(CAPEX_ERR_TIMEOUT, "TCP comm: %s with rank %d passed the deadline (stuck peer?)", what, peer);
    return capex__fail(CAPEX_ERR_COMM, "TCP comm: %s: rank %d closed the connection (it died or failed)", what, peer);
}

static capex_result capex__tcp_send(capex_comm *c, int fd, int peer, uint32_t op, const void *data, size_t bytes, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    unsigned char h[24];
    int e;
    capex__put32(h, CAPEX__TCP_MAGIC);
    capex__put32(h + 4, op);
    capex__put32(h + 8, t->seq);
    capex__put32(h + 12, 0);
    capex__put64(h + 16, (uint64_t)bytes);
    e = capex__io_all(fd, h, 24, 1, deadline);
    if (e == 0 && bytes) e = capex__io_all(fd, (void *)(uintptr_t)data, bytes, 1, deadline);
    return e ? capex__tcp_io_fail(e, peer, "send") : CAPEX_OK;
}

static capex_result capex__tcp_recv(capex_comm *c, int fd, int peer, uint32_t op, void *data, size_t bytes, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    unsigned char h[24];
    int e = capex__io_all(fd, h, 24, 0, deadline);
    if (e) return capex__tcp_io_fail(e, peer, "receive");
    if (capex__get32(h) != CAPEX__TCP_MAGIC || capex__get32(h + 4) != op || capex__get32(h + 8) != t->seq ||
        capex__get64(h + 16) != (uint64_t)bytes)
        return capex__fail(CAPEX_ERR_COMM, "TCP comm: rank %d sent op %u #%u of %llu bytes, expected op %u #%u of %llu "
                                           "bytes: ranks called collectives in different orders or sizes", peer,
                           (unsigned)capex__get32(h + 4), (unsigned)capex__get32(h + 8),
                           (unsigned long long)capex__get64(h + 16), (unsigned)op, (unsigned)t->seq, (unsigned long long)bytes);
    if (bytes && (e = capex__io_all(fd, data, bytes, 0, deadline)) != 0) return capex__tcp_io_fail(e, peer, "receive");
    return CAPEX_OK;
}

static void *capex__tcp_scratch(capex_comm *c, size_t bytes) {
    capex__tcp *t = (capex__tcp *)c->impl;
    if (t->tmp_bytes < bytes) {
        capex__free(c->allocator, t->tmp);
        t->tmp = capex__alloc(c->allocator, bytes);
        t->tmp_bytes = t->tmp ? bytes : 0;
    }
    return t->tmp;
}

/* rank 0 gathers from every peer in rank order into `gather` callback, then
   sends `out` (out_bytes) back to all; peers send `in` and receive `out`. */
static capex_result capex__tcp_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype ty,
                                        capex_reduce_op op, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t es = capex_dtype_size(ty), i;
    capex_result r = CAPEX_OK;
    int p;
    t->seq++;
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_ALLREDUCE, send, n * es, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_ALLREDUCE, recv, n * es, deadline);
    } else {
        /* acc: f32 sums ((x0 + x1) + x2) + ... ; staging for one peer after it */
        float *acc = (float *)capex__tcp_scratch(c, n * 4 + n * es);
        void *in;
        if (!acc) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "TCP comm: no memory for %lu elements", (unsigned long)n);
        in = (char *)acc + n * 4;
        capex__host_convert(acc, CAPEX_F32, send, ty, n);
        for (p = 1; p < c->world_size; p++) {
            if ((r = capex__tcp_recv(c, t->fds[p], p, CAPEX__TCP_ALLREDUCE, in, n * es, deadline)) != CAPEX_OK) return r;
            if (ty == CAPEX_F32) { const float *x = (const float *)in; for (i = 0; i < n; i++) acc[i] += x[i]; }
            else for (i = 0; i < n; i++) acc[i] += capex__load(in, ty, i);
        }
        if (op == CAPEX_REDUCE_AVG) capex__host_div(acc, n, CAPEX_F32, (float)c->world_size);
        capex__host_convert(recv, ty, acc, CAPEX_F32, n);
        for (p = 1; p < c->world_size; p++)
            if ((r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_ALLREDUCE, recv, n * es, deadline)) != CAPEX_OK) return r;
    }
    return r;
}

static capex_result capex__tcp_broadcast(capex_comm *c, void *buf, size_t n, capex_dtype ty, int root, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t bytes = n * capex_dtype_size(ty);
    capex_result r;
    int p;
    t->seq++;
    if (c->rank != 0) {
        if (c->rank == root) return capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, buf, bytes, deadline);
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_BROADCAST, buf, bytes, deadline);
    }
    if (root != 0 && (r = capex__tcp_recv(c, t->fds[root], root, CAPEX__TCP_BROADCAST, buf, bytes, deadline)) != CAPEX_OK) return r;
    for (p = 1; p < c->world_size; p++)
        if (p != root && (r = capex__tcp_send(c, t->fds[p], p, CAPEX__TCP_BROADCAST, buf, bytes, deadline)) != CAPEX_OK) return r;
    return CAPEX_OK;
}

static capex_result capex__tcp_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype ty, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    size_t bytes = n * capex_dtype_size(ty), all = bytes * (size_t)c->world_size;
    capex_result r;
    int p;
    t->seq++;
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

static capex_result capex__tcp_barrier(capex_comm *c, double deadline) {
    capex__tcp *t = (capex__tcp *)c->impl;
    capex_result r;
    int p;
    t->seq++;
    if (c->rank != 0) {
        if ((r = capex__tcp_send(c, t->fds[0], 0, CAPEX__TCP_BARRIER, NULL, 0, deadline)) != CAPEX_OK) return r;
        return capex__tcp_recv(c, t->fds[0], 0, CAPEX__TCP_BARRIER, NULL, 0, deadline);
    }
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
    capex__free(NULL, t->fds);
    capex__free(c->allocator, t->tmp);
    capex__free(NULL, t);
    c->impl = NULL;
}

static const capex_comm_vtable capex__tcp_vt = {
    "tcp", capex__tcp_allreduce, capex__tcp_broadcast, capex__tcp_allgather, capex__tcp_barrier,
    NULL, NULL, NULL, NULL, capex__tcp_destroy, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif /* CAPEX__HAVE_SOCKETS */

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
    if (!env->master_addr[0] || !env->master_port)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_comm_init_tcp: %d ranks need MASTER_ADDR and MASTER_PORT", env->world_size);
    capex_rendezvous_desc_init(&d);
    d.addr = env->master_addr;
    d.port = env->master_port;
    d.rank = env->rank;
    d.world_size = env->world_size;
    d.nonce = capex_rendezvous_nonce(env->run_id);
    if (connect_timeout_s > 0) d.timeout_s = connect_timeout_s;
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
    return CAPEX_OK;
#else
    (void)connect_timeout_s;
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_comm_init_tcp: no sockets on this platform/build");
#endif
}

CAPEX_API capex_result capex_rendezvous_broadcast(const capex_rendezvous_desc *d, void *blob, size_t size) {
    double deadline;
    if (!d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_rendezvous_broadcast: desc is NULL");
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
    if (size && !blob) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_dist_broadcast_blob: blob is NULL");
    if (comm && comm->vt && comm->world_size > 1 && !comm->device_buffers) {
        /* broadcast moves bits: carry the bytes as f32 words */
        size_t words = (size + 3) / 4;
        float *tmp = (float *)capex__alloc(comm->allocator, words * 4);
        capex_result r;
        double saved = comm->timeout_s;
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
    if (!env->master_addr[0] || !env->master_port)
        return capex__fail(CAPEX_ERR_CONFIG, "capex_dist_broadcast_blob: %d ranks need MASTER_ADDR and MASTER_PORT "
                                             "(rank 0's host and a free port) for the TCP rendezvous", env->world_size);
    capex_rendezvous_desc_init(&d);
    d.addr = env->master_addr;
    d.port = env->master_port;
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
    size_t pending;        /* params not yet ready this iteration            */
    int launched, waited;
    int sync_done;         /* reduced synchronously at launch                */
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
    size_t next_launch;
    int sync, layout_version, rebuilt, failed, in_finalize;
    capex_ddp_stats st;
};

CAPEX_API void capex_ddp_desc_init(capex_ddp_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
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

static void capex__ddp_free_buckets(capex_ddp *g) {
    size_t i;
    if (!g->b) return;
    for (i = 0; i < g->nb; i++) {
        capex__comm_free(g->comm, g->b[i].buf);
        capex__comm_free(g->comm, g->b[i].buf32);
    }
    capex__free(NULL, g->b);
    g->b = NULL;
    g->nb = 0;
}

/* PyTorch's compute_bucket_assignment_by_size over `order` (the expected
   ready order): one open bucket per dtype; a bucket closes once its size
   reaches its limit (first limit, then the later one, per dtype); leftovers
   close at the end; buckets are sorted by the position of their first param.
   Sizes are bytes, or elements with Apex's message_size. On success the new
   layout replaces g->b / bparams / boffsets / bucket_of / offset_of (buffers
   not yet allocated). */
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
        g->bparams[bk->first + fill[k]] = p;
        g->boffsets[bk->first + fill[k]] = bk->numel;
        g->offset_of[p] = bk->numel;
        bk->numel += g->params[p].numel;
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

static capex_result capex__ddp_alloc_buffers(capex_ddp *g) {
    size_t i;
    capex_result r;
    for (i = 0; i < g->nb; i++) {
        capex__bucket *bk = &g->b[i];
        size_t bytes = bk->numel * capex_dtype_size(bk->dtype);
        if ((r = capex__comm_alloc(g->comm, &bk->buf, bytes)) != CAPEX_OK) return r;
        if ((r = capex__comm_zero(g->comm, bk->buf, bytes)) != CAPEX_OK) return r;
        if (g->d.allreduce_always_fp32 && bk->dtype != CAPEX_F32)
            if ((r = capex__comm_alloc(g->comm, &bk->buf32, bk->numel * sizeof(float))) != CAPEX_OK) return r;
        bk->pending = bk->count;
    }
    return CAPEX_OK;
}

CAPEX_API void capex_ddp_destroy(capex_ddp *g) {
    if (!g) return;
    if (g->comm) capex__ddp_free_buckets(g);
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

CAPEX_API capex_result capex_ddp_create(capex_ddp **out, capex_comm *comm, const capex_ddp_param *params, size_t np,
                                        const capex_ddp_desc *desc) {
    capex_ddp *g;
    capex_ddp_desc dd;
    capex_result r;
    size_t i, *order;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: out is NULL");
    *out = NULL;
    if ((r = capex__comm_check(comm, "capex_ddp_create")) != CAPEX_OK) return r;
    if (np && !params) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: params is NULL");
    if (!desc) { capex_ddp_desc_init(&dd); desc = &dd; }
    if (!desc->message_size && (!desc->first_bucket_bytes || !desc->bucket_bytes))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: bucket limits must be > 0 (defaults: 1 MiB, 25 MiB)");
    if (!(desc->gradient_predivide_factor > 0.0f) || desc->gradient_predivide_factor > 3.0e38f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: gradient_predivide_factor %g must be finite and > 0",
                           (double)desc->gradient_predivide_factor);
    for (i = 0; i < np; i++) {
        if (!capex__dtype_ok(params[i].dtype))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: param %lu has invalid dtype %d", (unsigned long)i,
                               (int)params[i].dtype);
        if (params[i].numel && desc->broadcast_parameters && !params[i].data)
            return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_ddp_create: param %lu has no data pointer to broadcast",
                               (unsigned long)i);
    }
    g = (capex_ddp *)capex__alloc(NULL, sizeof *g);
    if (!g) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_ddp_create: out of memory");
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
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_ddp_create: out of memory");
    }
    if (np) memcpy(g->params, params, sizeof(capex_ddp_param) * np);
    memset(g->ready, 0, np + 1);
    memset(g->accum, 0, np + 1);
    /* backward produces grads roughly in reverse registration order */
    order = g->ready_order;
    for (i = 0; i < np; i++) order[i] = np - 1 - i;
    if ((r = capex__ddp_plan(g, order)) != CAPEX_OK || (r = capex__ddp_alloc_buffers(g)) != CAPEX_OK) {
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
    for (i = 0; i < g->np; i++)
        if (g->ready[i])
            return capex__fail(CAPEX_ERR_ORDER, "capex_ddp_set_sync: change sync mode between iterations (after "
                                                "capex_ddp_finalize), not in the middle of a backward pass");
    g->sync = sync ? 1 : 0;
    return CAPEX_OK;
}

/* Starts bucket k's allreduce: optional f32 staging (allreduce_always_fp32),
   Apex's predivide x *= 1/f, then SUM; the post-scale f/world comes after
   the wait (Apex DDP allreduce_bucket). */
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
    if (bk->buf32) {
        if ((r = capex__comm_convert(c, bk->buf32, CAPEX_F32, bk->buf, bk->dtype, bk->numel)) != CAPEX_OK) return r;
        buf = bk->buf32;
        t = CAPEX_F32;
    }
    if (pre != 1.0f)
        if ((r = capex__comm_scale(c, buf, bk->numel, t, (float)(1.0 / (double)pre))) != CAPEX_OK) return r;
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
    if (!g) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: ddp is NULL", what);
    if (g->failed)
        return capex__fail(CAPEX_ERR_COMM, "%s: this ddp failed in an earlier collective; stop and restart from a checkpoint", what);
    if (p >= g->np)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: unknown parameter %lu (there are %lu)", what, (unsigned long)p,
                           (unsigned long)g->np);
    if (g->ready[p])
        return capex__fail(CAPEX_ERR_ORDER, "%s: parameter %lu is already ready in this iteration (grad_ready twice? "
                                            "call capex_ddp_finalize once per backward)", what, (unsigned long)p);
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
        if (bk->sync_done || !bk->req.active) continue;
        r = c->vt->test(c, &bk->req, &done);
        if (r != CAPEX_OK) { g->failed = 1; return capex__comm_after(c, r); }
        g->st.progress_polls++;
        if (!done) break;
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
        g->b[i].launched = g->b[i].waited = g->b[i].sync_done = 0;
    }
    g->next_launch = 0;
}

/* Rebuild once from rank 0's observed ready order (PyTorch rebuild_buckets),
   broadcast as u32 bits, moving the already reduced grads to the new slots. */
static capex_result capex__ddp_rebuild(capex_ddp *g) {
    capex_comm *c = g->comm;
    size_t np = g->np, i, nb_old = g->nb;
    uint32_t *ord32 = NULL;
    void *dev = NULL;
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
    if (!ord32 || !order || !old_bucket || !old_offset || !seen) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "ddp rebuild: out of memory"); goto done; }
    for (i = 0; i < np; i++) ord32[i] = (uint32_t)g->ready_order[i];
    if (c->world_size > 1) {
        if (c->device_buffers) {
            if ((r = capex__comm_alloc(c, &dev, np * 4)) != CAPEX_OK) goto done;
            if ((r = capex__comm_copy(c, dev, ord32, np * 4, CAPEX_COPY_H2D)) != CAPEX_OK) goto done;
            if ((r = capex_comm_broadcast(c, dev, np, CAPEX_F32, 0)) != CAPEX_OK) goto done;
            if ((r = capex__comm_copy(c, ord32, dev, np * 4, CAPEX_COPY_D2H)) != CAPEX_OK) goto done;
        } else if ((r = capex_comm_broadcast(c, ord32, np, CAPEX_F32, 0)) != CAPEX_OK) goto done;
    }
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
        goto done;
    }
    for (i = 0; i < np; i++) {
        size_t es = capex_dtype_size(g->params[i].dtype);
        r = capex__comm_copy(c, (char *)g->b[g->bucket_of[i]].buf + g->offset_of[i] * es,
                             (char *)old_b[old_bucket[i]].buf + old_offset[i] * es, g->params[i].numel * es, CAPEX_COPY_D2D);
        if (r != CAPEX_OK) break;
    }
    g->layout_version++;
    for (i = 0; old_b && i < nb_old; i++) {
        capex__comm_free(c, old_b[i].buf);
        capex__comm_free(c, old_b[i].buf32);
    }
    capex__free(NULL, old_b);
    old_b = NULL;
done:
    if (dev) capex__comm_free(c, dev);
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
    if (!g->sync) { /* no_sync: grads stay local and keep accumulating */
        for (i = 0; i < g->np; i++) if (g->ready[i]) g->accum[i] = 1;
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
        void *buf = bk->buf32 ? bk->buf32 : bk->buf;
        capex_dtype t = bk->buf32 ? CAPEX_F32 : bk->dtype;
        float post = g->d.gradient_average ? (float)((double)g->d.gradient_predivide_factor / (double)c->world_size) : 1.0f;
        if (!bk->launched) { r = capex__fail(CAPEX_ERR_INTERNAL, "ddp: bucket %lu not launched at finalize", (unsigned long)i); break; }
        if (!bk->sync_done) {
            r = capex__comm_after(c, c->vt->wait(c, &bk->req, deadline));
            if (r != CAPEX_OK) break;
        }
        if (c->vt->poll_error && (r = capex__comm_after(c, c->vt->poll_error(c))) != CAPEX_OK) break;
        bk->waited = 1;
        if ((r = capex__comm_scale(c, buf, bk->numel, t, post)) != CAPEX_OK) break;
        if (bk->buf32 && (r = capex__comm_convert(c, bk->buf, bk->dtype, bk->buf32, CAPEX_F32, bk->numel)) != CAPEX_OK) break;
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

CAPEX_API void capex_sampler_desc_init(capex_sampler_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->num_replicas = 1;
    d->rank = 0;
    d->shuffle = 1;
    d->seed = 0;
    d->drop_last = 0;
}

CAPEX_API capex_result capex_sampler_init(capex_sampler *s, const capex_sampler_desc *d) {
    uint64_t n, rr;
    if (!s || !d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_init: NULL argument");
    if (d->num_replicas < 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_init: num_replicas %d must be >= 1", d->num_replicas);
    if (d->rank < 0 || d->rank >= d->num_replicas) /* torch: "Invalid rank ..., rank should be in the interval" */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_init: invalid rank %d, rank should be in the interval "
                                                  "[0, %d]", d->rank, d->num_replicas - 1);
    memset(s, 0, sizeof *s);
    s->d = *d;
    n = d->dataset_size;
    rr = (uint64_t)d->num_replicas;
    /* torch: drop_last and N % R != 0: ceil((N - R) / R) == floor(N / R);
       else ceil(N / R) */
    s->num_samples = d->drop_last ? n / rr : n / rr + (n % rr != 0);
    s->total_size = s->num_samples * rr;
    return CAPEX_OK;
}

CAPEX_API void capex_sampler_set_epoch(capex_sampler *s, uint64_t epoch) {
    if (s) s->epoch = epoch;
}

CAPEX_API capex_result capex_sampler_index(const capex_sampler *s, uint64_t k, uint64_t *index) {
    uint64_t j, n;
    if (!s || !index) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_index: NULL argument");
    if (k >= s->num_samples)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_index: k=%llu but this rank has %llu samples",
                           (unsigned long long)k, (unsigned long long)s->num_samples);
    n = s->d.dataset_size;
    /* indices[rank : total_size : R]; positions past N repeat the start */
    j = ((uint64_t)s->d.rank + k * (uint64_t)s->d.num_replicas) % n;
    *index = s->d.shuffle ? capex_permute_index(j, n, s->d.seed + s->epoch) : j;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_sampler_indices(const capex_sampler *s, uint64_t *out, size_t cap) {
    uint64_t k;
    if (!s || (!out && s && s->num_samples)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_sampler_indices: NULL argument");
    if ((uint64_t)cap < s->num_samples)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "capex_sampler_indices: room for %lu indices, need num_samples=%llu",
                           (unsigned long)cap, (unsigned long long)s->num_samples);
    for (k = 0; k < s->num_samples; k++) capex_sampler_index(s, k, &out[k]);
    return CAPEX_OK;
}

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
