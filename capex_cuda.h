/* capex_cuda.h - the CUDA backend of capex: driver, NVRTC and NCCL loaded at run time.

   Do this:
       #define CAPEX_CUDA_IMPLEMENTATION   // also provides capex.h's implementation
       #include "capex_cuda.h"
   in exactly one C or C++ file (the one that would define CAPEX_IMPLEMENTATION);
   every other file includes "capex_cuda.h" alone. Build with
       cc app.c -ldl -lm -lpthread
   No CUDA toolkit at build time: libcuda.so.1, NVRTC and libnccl.so.2 are opened
   with dlopen on first use, and kernels are compiled by NVRTC for the exact GPU.

   Quick start (your own kernel, like CuPy's RawKernel):

       capex_cuda_context_desc cd; capex_cuda_context_desc_init(&cd); // GPU = $LOCAL_RANK
       capex_cuda_context *ctx;
       if (capex_cuda_context_create(&cd, &ctx) != CAPEX_OK) puts(capex_last_error());
       const char *src = "extern \"C\" __global__ void twice(float *x, unsigned long long n)"
                         "{ unsigned long long i = blockIdx.x * 256ull + threadIdx.x;"
                         "  if (i < n) x[i] *= 2.0f; }";
       capex_cuda_module *m;   capex_cuda_module_compile(ctx, src, "twice", NULL, 0, &m);
       capex_cuda_function f; capex_cuda_module_get_function(m, "twice", &f);
       capex_cuda_ptr x;      capex_cuda_malloc(ctx, n * 4, &x);
       unsigned long long nn = n; void *args[] = {&x, &nn};
       unsigned grid[3] = {(unsigned)((n + 255) / 256), 1, 1}, block[3] = {256, 1, 1};
       capex_cuda_launch(&f, grid, block, 0, NULL, args);
       capex_cuda_context_destroy(ctx);

   CONFIGURATION: those of capex.h (CAPEX_STATIC, CAPEX_API, CAPEX_MALLOC, ...;
   capex_cuda.h tests no macro of its own besides CAPEX_CUDA_IMPLEMENTATION).
       CAPEX_NO_DIST     also leaves out the NCCL communicator (capex_nccl_*,
                         capex_comm_init_nccl*, capex_comm_is_nccl) and the GPU
                         SyncBatchNorm: capex_cuda_batch_norm_* take comm NULL only.
                         capex_cuda_nccl_version (the loader's report) stays.
       CAPEX_NO_STATE    nothing here needs the state files: capex_cuda_optim_to_host
                         / from_host stay (save the host copy elsewhere, or not at all).

   ENVIRONMENT
       LOCAL_RANK        GPU ordinal when capex_cuda_context_desc.device is -1
                         (torchrun, mpirun wrappers set it); unset means GPU 0. With
                         CUDA_VISIBLE_DEVICES set and one GPU visible (a launcher that
                         binds a GPU per process), that GPU whatever ordinal LOCAL_RANK
                         gives. A LOCAL_RANK that is not a number is CAPEX_ERR_CONFIG.
       CAPEX_LIBCUDA_PATH  load exactly this driver library instead of libcuda.so.1.
       CAPEX_NVRTC_PATH  load exactly this NVRTC library (no search). Otherwise the
                         sonames libnvrtc.so.13, .12, .11.2, libnvrtc.so are tried, then
                         libnvrtc.so.* in $CUDA_HOME/lib64, $CUDA_PATH/lib64,
                         /usr/local/cuda/lib64, /usr/local/cuda/targets/{x86_64,sbsa}-linux/lib,
                         /opt/cuda/lib64 (a toolkit without ldconfig entries). When the
                         driver is already loaded, candidates no newer than its CUDA
                         major version go first, wherever they are (a driver cannot load
                         newer-major code). A library that opens but is unusable (too
                         old, no architecture list) is skipped, with its reason listed.
       CAPEX_NCCL_PATH   load exactly this NCCL library instead of libnccl.so.2.
       CAPEX_CACHE_DIR   kernel cache directory; set but empty disables the disk cache.
                         Default $XDG_CACHE_HOME/capex, else $HOME/.cache/capex (each
                         used only when absolute; neither: no disk cache, one warning).
       CAPEX_CUDA_PARAMS 4096: the multi-tensor launches pass at most 4 KB of kernel
                         parameters, as before CUDA 12.1 (for a driver that mishandles
                         larger ones); auto (or unset): 32 KB where the driver (12.1+),
                         the GPU (sm_70+) and NVRTC (12.1+) take them, else 4 KB. Read
                         when a context is created; other values are CAPEX_ERR_CONFIG.

   TOPICS
       Loading ........ nothing is loaded until a capex_cuda_* call needs it; each
                        library is opened once per process (pthread_once). A missing
                        piece gives its own status: CAPEX_ERR_NO_DRIVER (libcuda.so.1),
                        CAPEX_ERR_NO_DEVICE (driver but no usable GPU), CAPEX_ERR_NO_NVRTC,
                        CAPEX_ERR_NO_NCCL, with a message naming every path tried and
                        its dlerror. capex.h's CPU backend never needs any of them.
       Contexts ....... capex_cuda_context = one GPU's primary context (shared with the
                        CUDA runtime and PyTorch in the same process), its module cache
                        and disk-cache settings. Calls make it current on the calling
                        thread. Several contexts (GPUs) may live in one process. Creating
                        one fixes its kernel-parameter size (CAPEX_CUDA_PARAMS), loading
                        NVRTC for its version where the driver and GPU take 32 KB.
       JIT ............ one NVRTC program per source; CUBIN for the GPU's exact sm_XY when
                        NVRTC supports it, else PTX for the highest supported arch below
                        it (the driver finishes it), CAPEX_ERR_ARCH below the lowest. The
                        C locale is set around each compile. A failed compile returns
                        CAPEX_ERR_NVRTC with NVRTC's log and the options in the message.
       Cache .......... in memory per context and on disk: one file per
                        SHA-256(source, name, options, GPU arch, format version), holding
                        magic, format version, key, kind (cubin/ptx), target arch, the
                        NVRTC version that made it, length and a SHA-256 checksum. Written
                        to a temp file and renamed (atomic; concurrent writers are fine).
                        A bad entry (truncated, corrupt, foreign, other version, over
                        256 MiB, not a regular file: a FIFO, device or symlink is neither
                        opened blocking nor followed) is never trusted: it is recompiled
                        and overwritten. Trust rule (after ssh's StrictModes): the directory
                        must be owned by the effective user and not group/other-writable
                        unless sticky, a symlink on its path the user's or root's, and no
                        directory on its path or really above it writable by others
                        without the sticky bit: by the world, or by a group other than
                        the user's private one (umask 002 under user private groups: the
                        user's effective group, numbered as the user; not held against
                        $HOME and the directories above it, as ssh stops at the home);
                        else a warning (once) and no reads or writes. The directory is opened once per
                        compile, component by component (openat, O_NOFOLLOW), and every
                        read, lock, write and rename goes through that descriptor: a path
                        component swapped meanwhile redirects nothing. An entry must be
                        the user's, one link (not hard-linked) and not group/other-writable,
                        else it is recompiled over. A parent's owner is not checked (an
                        owner other than you or root can rename what it holds: keep the
                        cache below directories only you or root own). New directories
                        are 0700, entries 0600. A hit does not load
                        NVRTC at all (opening it costs 10 ms warm, 0.4 s cold), so a machine with
                        only the driver runs from a cache filled elsewhere. The NVRTC
                        version is recorded, not keyed: after a toolkit upgrade old entries
                        (valid code for the same GPU) are kept; delete the directory to
                        rebuild them. The key does not cover files NVRTC reads: a
                        source with a #include "file" (or a macro #include), or
                        options with include paths (-I), pre-includes or PCH, is
                        compiled without the disk cache. An unwritable directory (or a path over 1023
                        bytes) warns once and runs uncached. Writes remove temp files
                        over an hour old that a killed writer left. Processes that miss
                        one entry at once (the ranks of a node) compile it once: one
                        holds <entry>.lock (flock, released if it dies; unlinked when
                        done) while it compiles and writes, the others wait (up to 2
                        min) and read the entry; where no lock can be had (a read-only
                        directory, no flock, a link at that path) each compiles. When
                        the holder's source does not compile, those that waited for it
                        return its CAPEX_ERR_NVRTC and log (kept in its lock file, gone
                        with it: a later process compiles again). Precompiles (and
                        background compiles) skip a part whose entry another process
                        holds, compile the free ones, then read or wait for it.
       Built-in kernels  fill, scale, add and f32<->f16/bf16 conversion (bit-exact with
                        capex.h's CPU conversions), the fused optimizers and the norms, in
                        27 parts (capex_cuda_builtin_part_name), each its own program,
                        cache entry and module; capex_cuda_precompile (or context
                        desc.precompile = 1) compiles all missing parts at once on threads;
                        capex_cuda_precompile_async (desc.precompile = 2, and optimizers
                        and scalers for what their step launches) on background threads.
                        A launch whose part is neither loaded nor compiling compiles a
                        variant instead: the part specialized to that launch (its kernels
                        only, its dtypes and switches fixed by -D options: Adam, amsgrad,
                        Adagrad, SGD, LAMB, NovoGrad, unscale, the amp kernels,
                        LayerNorm/RMSNorm; a first AdamW step compiles in about half the
                        NVRTC time of whole parts, amsgrad and Adagrad in a third, a
                        LayerNorm forward and backward in 0.55), cached like a part; a
                        variant that spills on the device is not used (its part runs).

   Thread safety: the loaders are thread-safe. A context may be used from several
   threads (its module cache is locked; capex_cuda_module_compile runs NVRTC
   without that lock, the first use of a built-in part with it); streams follow
   CUDA's rules. Compiles
   may run on several threads at once: each sets LC_NUMERIC "C" for its own
   thread only (uselocale), so neither other compiles nor the program's threads
   see a locale change. (Only where <locale.h> lacks uselocale, in strict C99
   with a system header included before capex, is the process locale switched,
   under a lock, while any compile runs; background threads then compile only
   if the process is in "C" already.)

   License: MIT, see the end of capex.h.
*/
#ifdef CAPEX_CUDA_IMPLEMENTATION
#  ifndef CAPEX_IMPLEMENTATION
#    define CAPEX_IMPLEMENTATION
#  endif
#endif
#include "capex.h"

#ifndef CAPEX_CUDA_H
#define CAPEX_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Handles are plain pointers/integers so CUstream, CUevent and CUdeviceptr from
   cuda.h pass straight in. Streams from capex_cuda_stream_create are
   non-blocking: the driver's NULL (legacy) stream does not wait for them. So a
   copy or memset with stream NULL waits for the whole context and is done on
   return; a kernel launched with stream NULL runs on the legacy stream, ordered
   only against blocking streams. */
typedef void *capex_cuda_stream;
typedef void *capex_cuda_event;
typedef unsigned long long capex_cuda_ptr;

/* ---- versions and libraries (each loads its library on first call) ------ */
CAPEX_API capex_result capex_cuda_driver_version(int *version);  /* e.g. 13000 */
CAPEX_API capex_result capex_cuda_nvrtc_version(int *major, int *minor);
/* Architectures NVRTC can emit CUBIN for, ascending (75 = sm_75); *n gets the count. */
CAPEX_API capex_result capex_cuda_nvrtc_supported_archs(int *archs, int capacity, int *n);
CAPEX_API capex_result capex_cuda_nccl_version(int *version);    /* e.g. 22703 */
/* Path (or soname) NVRTC was loaded from, "" if not loaded. Does not load it. */
CAPEX_API const char *capex_cuda_nvrtc_path(void);
/* 1 when NVRTC has been loaded in this process. Does not load it. */
CAPEX_API int capex_cuda_nvrtc_is_loaded(void);

/* ---- devices ------------------------------------------------------------- */
typedef struct capex_cuda_device_info {
    int ordinal;
    char name[256];
    int cc_major, cc_minor;      /* compute capability: 9, 0 on an H100 */
    int sm_count;
    size_t total_bytes;
    int mem_clock_khz;           /* 0 when the driver does not report it */
    int bus_width_bits;          /* 0 when the driver does not report it */
    double peak_bandwidth_gbs;   /* 2 * clock * bus width; 0 when unknown */
} capex_cuda_device_info;

CAPEX_API capex_result capex_cuda_device_count(int *n);
CAPEX_API capex_result capex_cuda_device_get_info(int ordinal, capex_cuda_device_info *info);

/* ---- arch selection (pure) ------------------------------------------------ */
typedef enum capex_cuda_image_kind {
    CAPEX_CUDA_IMAGE_CUBIN = 1,  /* machine code for one sm_XY */
    CAPEX_CUDA_IMAGE_PTX = 2     /* virtual ISA compute_XY, finished by the driver */
} capex_cuda_image_kind;

typedef struct capex_cuda_target {
    capex_cuda_image_kind kind;
    int arch;                    /* 90: -arch=sm_90 (CUBIN) or -arch=compute_90 (PTX) */
} capex_cuda_target;

/* CUBIN for device_cc when it is in supported[], else PTX for the highest supported
   arch below it, else CAPEX_ERR_ARCH. supported[] need not be sorted. Thread-safe. */
CAPEX_API capex_result capex_cuda_select_target(const int *supported, int n_supported, int device_cc,
                                                capex_cuda_target *out);

/* ---- compiled images and the disk cache ----------------------------------- */
typedef struct capex_cuda_image {
    capex_cuda_image_kind kind;
    int arch;
    int nvrtc_version;           /* major * 1000 + minor * 10 of the NVRTC that made it */
    int from_cache;              /* 1 when read from the disk cache */
    void *data;                  /* CUBIN bytes, or NUL-terminated PTX */
    size_t size;                 /* bytes in data (PTX: including the NUL) */
} capex_cuda_image;

CAPEX_API void capex_cuda_image_free(capex_cuda_image *image);

/* Disk cache settings. Not thread-safe (the warn-once flag): one per context. */
typedef struct capex_cuda_cache {
    char dir[1024];
    int enabled;
    int warned;                  /* an unwritable or untrusted directory was reported */
    uint32_t init_tag; /* set by capex_cuda_cache_init (capex.h "Descriptors") */
} capex_cuda_cache;

/* dir NULL: the environment default (see ENVIRONMENT); "" disables the cache. A
   capex_cuda_cache not made by it is refused (CAPEX_ERR_INVALID_ARG) by its consumers. */
CAPEX_API void capex_cuda_cache_init(capex_cuda_cache *cache, const char *dir);

typedef struct capex_cuda_compile_desc {
    const char *source;
    const char *name;            /* program name, for messages (default "capex_program") */
    const char *const *options;  /* NVRTC options, e.g. "-DN=4"; the arch is added */
    int n_options;
    int device_cc;               /* the GPU's compute capability, 90 for sm_90 */
    capex_cuda_cache *cache;     /* NULL: no disk cache */
    uint32_t init_tag; /* set by capex_cuda_compile_desc_init (capex.h "Descriptors") */
} capex_cuda_compile_desc;

CAPEX_API void capex_cuda_compile_desc_init(capex_cuda_compile_desc *desc);
/* Source -> image through the disk cache (no GPU needed). Loads NVRTC only on a miss. */
CAPEX_API capex_result capex_cuda_compile(const capex_cuda_compile_desc *desc, capex_cuda_image *out);
/* NVRTC compile for an explicit target, no cache (no GPU needed). */
CAPEX_API capex_result capex_cuda_nvrtc_compile(const char *source, const char *name, const char *const *options,
                                                int n_options, capex_cuda_target target, capex_cuda_image *out);

/* The embedded kernel program (assembled once from its fragments) and its options. */
CAPEX_API const char *capex_cuda_builtin_source(void);
CAPEX_API const char *const *capex_cuda_builtin_options(int *n_options);
/* The built-in kernels are compiled in parts, each its own NVRTC program, disk-cache
   entry and module ("basic", "amp", "adam_f16", "norm_fwd", ...), when one of their
   kernels is first launched; see capex_cuda_precompile. Parts are 0..count-1. */
CAPEX_API int capex_cuda_builtin_part_count(void);
CAPEX_API const char *capex_cuda_builtin_part_name(int part);   /* NULL when out of range */
/* The prelude and the part's fragments (a subset of capex_cuda_builtin_source, in its
   order); NULL when out of range or out of memory. Assembled once, immutable. */
CAPEX_API const char *capex_cuda_builtin_part_source(int part);
CAPEX_API int capex_cuda_builtin_kernel_part(const char *kernel); /* the part defining it; -1: none */
/* Compiles every part for device_cc through cache (NULL: no disk cache) on up to
   n_threads threads (<= 0: one per online CPU); images[i] receives part i (an array of
   capex_cuda_builtin_part_count() images; free each). No GPU needed. Thread-safe with
   its own cache struct; sets LC_NUMERIC to "C" around the compiles (see Thread safety).
   The images are the 4 KB-parameter build (CAPEX_CUDA_PARAMS=4096 contexts). */
CAPEX_API capex_result capex_cuda_builtin_compile_parts(int device_cc, capex_cuda_cache *cache, int n_threads,
                                                        capex_cuda_image *images);

/* ---- contexts -------------------------------------------------------------- */
typedef struct capex_cuda_context capex_cuda_context;  /* opaque */

typedef struct capex_cuda_context_desc {
    int device;                  /* GPU ordinal; -1 (default): $LOCAL_RANK, else 0; < -1 is an error */
    const char *cache_dir;       /* NULL (default): environment default; "": none */
    int disk_cache;              /* 1 (default); 0 disables the disk cache */
    const capex_allocator *allocator;  /* host allocations (both functions set); NULL: CAPEX_MALLOC */
    int precompile;              /* 0 (default): each built-in part on first use; 1: all of
                                    them in capex_cuda_context_create, one thread per CPU;
                                    2: all of them on background threads (returns at once;
                                    see capex_cuda_precompile_async) */
    uint32_t init_tag; /* set by capex_cuda_context_desc_init (capex.h "Descriptors") */
} capex_cuda_context_desc;

CAPEX_API void capex_cuda_context_desc_init(capex_cuda_context_desc *desc);
CAPEX_API capex_result capex_cuda_context_create(const capex_cuda_context_desc *desc, capex_cuda_context **out);
/* Unloads its modules and releases the primary context. NULL is a no-op. */
CAPEX_API void capex_cuda_context_destroy(capex_cuda_context *ctx);
CAPEX_API const capex_cuda_device_info *capex_cuda_context_device(const capex_cuda_context *ctx);
/* Waits for all work on the context (tests and tools; not for a training step). */
CAPEX_API capex_result capex_cuda_context_synchronize(capex_cuda_context *ctx);

/* ---- memory, streams, events (thin checked wrappers) ----------------------- */
CAPEX_API capex_result capex_cuda_malloc(capex_cuda_context *ctx, size_t bytes, capex_cuda_ptr *out);
CAPEX_API capex_result capex_cuda_free(capex_cuda_context *ctx, capex_cuda_ptr p);  /* 0 is a no-op */
/* Copies and memsets (bytes; memset_u32's count is of 4-byte words, dst 4-aligned).
   Stream NULL: waits for all work queued on the context
   (every stream), then copies, and returns when the copy is done; else
   asynchronous on the stream. */
CAPEX_API capex_result capex_cuda_memcpy_htod(capex_cuda_context *ctx, capex_cuda_ptr dst, const void *src,
                                              size_t bytes, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_memcpy_dtoh(capex_cuda_context *ctx, void *dst, capex_cuda_ptr src,
                                              size_t bytes, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_memcpy_dtod(capex_cuda_context *ctx, capex_cuda_ptr dst, capex_cuda_ptr src,
                                              size_t bytes, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_memset_u8(capex_cuda_context *ctx, capex_cuda_ptr dst, unsigned char value,
                                            size_t count, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_memset_u32(capex_cuda_context *ctx, capex_cuda_ptr dst, uint32_t value,
                                             size_t count, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_mem_info(capex_cuda_context *ctx, size_t *free_bytes, size_t *total_bytes);

/* Unlike copies, these take stream NULL as the driver does: the legacy stream alone,
   which does not wait for capex's streams (capex_cuda_context_synchronize waits for
   all). An event recorded on stream NULL thus does not follow their work. */
CAPEX_API capex_result capex_cuda_stream_create(capex_cuda_context *ctx, capex_cuda_stream *out); /* non-blocking */
CAPEX_API capex_result capex_cuda_stream_destroy(capex_cuda_context *ctx, capex_cuda_stream s);
CAPEX_API capex_result capex_cuda_stream_synchronize(capex_cuda_context *ctx, capex_cuda_stream s);
CAPEX_API capex_result capex_cuda_stream_wait_event(capex_cuda_context *ctx, capex_cuda_stream s, capex_cuda_event e);
CAPEX_API capex_result capex_cuda_event_create(capex_cuda_context *ctx, int timing, capex_cuda_event *out);
CAPEX_API capex_result capex_cuda_event_destroy(capex_cuda_context *ctx, capex_cuda_event e);
CAPEX_API capex_result capex_cuda_event_record(capex_cuda_context *ctx, capex_cuda_event e, capex_cuda_stream s);
CAPEX_API capex_result capex_cuda_event_synchronize(capex_cuda_context *ctx, capex_cuda_event e);
CAPEX_API capex_result capex_cuda_event_elapsed_ms(capex_cuda_context *ctx, capex_cuda_event start,
                                                   capex_cuda_event end, float *ms);

/* ---- modules and launches (CuPy RawKernel for C) --------------------------- */
typedef struct capex_cuda_module capex_cuda_module;     /* owned by its context */
typedef struct capex_cuda_function {
    void *handle;                /* CUfunction */
    capex_cuda_context *ctx;
} capex_cuda_function;

/* Compiles (or finds in the memory/disk cache) and loads source for the context's
   GPU. Kernels should be extern "C" so they keep their names. The module lives
   until the context is destroyed; compiling the same source again returns it (even
   after a header it includes changed: NVRTC finds a quoted #include next to name,
   a path, or in the working directory for a bare name). */
CAPEX_API capex_result capex_cuda_module_compile(capex_cuda_context *ctx, const char *source, const char *name,
                                                 const char *const *options, int n_options, capex_cuda_module **out);
CAPEX_API capex_result capex_cuda_module_get_function(capex_cuda_module *module, const char *kernel,
                                                      capex_cuda_function *out);
/* How the module was made: its target and whether its image came from the disk cache. */
CAPEX_API capex_result capex_cuda_module_info(const capex_cuda_module *module, capex_cuda_target *target,
                                              int *from_cache);
/* Launches fn; args[i] points at the i-th kernel argument. shmem above 48 KiB opts the
   kernel in to large dynamic shared memory first (raised, never lowered). Errors inside the kernel surface at
   the next synchronizing call. */
CAPEX_API capex_result capex_cuda_launch(const capex_cuda_function *fn, const unsigned grid[3],
                                         const unsigned block[3], unsigned shmem, capex_cuda_stream stream,
                                         void **args);

/* ---- built-in kernels (compiled part by part on first use) ------------------ */
/* Compiles (or loads from the disk cache) every built-in part not loaded yet, on up to
   n_threads threads (<= 0: one per online CPU): for users who want no compile later
   (before CUDA-graph capture, before timing a step). Thread-safe. */
CAPEX_API capex_result capex_cuda_precompile(capex_cuda_context *ctx, int n_threads);
/* Starts compiling, on up to n_threads background threads (<= 0: one per online
   CPU), the parts that define the named built-in kernels (kernels NULL: every
   part), and returns at once. The threads run NVRTC and the disk cache only;
   a part's module is loaded by its first use, which waits for its compile if
   it is still running (or compiles it, if no thread has started it). Compile
   errors are reported by that first use. Also started by context
   desc.precompile = 2 (every part), capex_cuda_optim_add_group (what its step
   launches) and capex_cuda_scaler_create. capex_cuda_context_destroy waits for
   running compiles; do not fork() while compiles run (wait for them first).
   Unknown kernel names: CAPEX_ERR_NOT_FOUND, nothing started. */
CAPEX_API capex_result capex_cuda_precompile_async(capex_cuda_context *ctx, const char *const *kernels, int n_kernels,
                                                   int n_threads);
/* Waits until no background compile is queued or running; returns the first
   failure among the finished ones not used yet (they stay reported at use too). */
CAPEX_API capex_result capex_cuda_precompile_wait(capex_cuda_context *ctx);
/* Part `part`'s module, compiled and loaded now if needed. */
CAPEX_API capex_result capex_cuda_builtin_part_module(capex_cuda_context *ctx, int part, capex_cuda_module **out);
CAPEX_API int capex_cuda_builtin_part_loaded(capex_cuda_context *ctx, int part); /* 1: loaded in ctx */
/* capex_cuda_precompile(ctx, 0), then the "basic" part's module (fill, scale, add, convert). */
CAPEX_API capex_result capex_cuda_builtin_module(capex_cuda_context *ctx, capex_cuda_module **out);
/* fill, scale, add and convert: each pointer aligned to its elements (4 bytes for
   f32, 2 for f16/bf16), else CAPEX_ERR_INVALID_ARG before any launch. */
/* x[i] = value */
CAPEX_API capex_result capex_cuda_fill_f32(capex_cuda_context *ctx, capex_cuda_ptr x, float value, size_t n,
                                           capex_cuda_stream stream);
/* y[i] = a * x[i] (y may equal x; any other overlap: CAPEX_ERR_INVALID_ARG) */
CAPEX_API capex_result capex_cuda_scale_f32(capex_cuda_context *ctx, capex_cuda_ptr y, capex_cuda_ptr x, float a,
                                            size_t n, capex_cuda_stream stream);
/* c[i] = a[i] + b[i] (c may equal a or b; any other overlap: CAPEX_ERR_INVALID_ARG) */
CAPEX_API capex_result capex_cuda_add_f32(capex_cuda_context *ctx, capex_cuda_ptr c, capex_cuda_ptr a,
                                          capex_cuda_ptr b, size_t n, capex_cuda_stream stream);
/* f32 -> f16/bf16 or f16/bf16 -> f32, bit-exact with capex.h's conversions. dst and
   src must not overlap (not in place either): CAPEX_ERR_INVALID_ARG. */
CAPEX_API capex_result capex_cuda_convert(capex_cuda_context *ctx, capex_cuda_ptr dst, capex_dtype dst_type,
                                          capex_cuda_ptr src, capex_dtype src_type, size_t n,
                                          capex_cuda_stream stream);

/* ==== fused GPU optimizer kernels: declarations ==== */
/* ---- fused multi-tensor ops, optimizers and loss scaler on the GPU ---------
   Apex's amp_C kernels and fused optimizers, with every per-step value on the
   device: the loss scale, found_inf, the clip factor, the learning rate and
   the step counts are read by the kernels from device memory, so a whole
   mixed-precision step is launched without waiting on the GPU (it can be
   captured in a CUDA graph). The host reads a value back only when asked
   (capex_cuda_scaler_get_scale, capex_cuda_optim_get_step).

       capex_cuda_scaler *sc;  capex_cuda_scaler_create(ctx, NULL, &sc);  // Apex defaults
       capex_optim_desc d;     capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
       d.defaults.lr = 3e-4f;  d.defaults.weight_decay = 0.1f;            // AdamW
       capex_cuda_optim *opt;  capex_cuda_optim_create(ctx, &d, &opt);
       capex_optim_param p;    capex_optim_param_init(&p);                // DEVICE pointers:
       p.param = (float *)master_f32; p.grad = (void *)grad_bf16; p.grad_dtype = CAPEX_BF16;
       p.model = (void *)model_bf16;  p.model_dtype = CAPEX_BF16; p.numel = n;
       capex_cuda_optim_add_group(opt, NULL, &p, 1, NULL);
       for (each step) {   // forward: loss * (*capex_cuda_scaler_scale_ptr(sc)), backward into grad_bf16
           capex_cuda_scaler_unscale(sc, NULL, &grads, NULL, stream);    // check only: found_inf
           capex_cuda_optim_step(opt, capex_cuda_scaler_inv_scale_ptr(sc), 0,
                                 capex_cuda_scaler_found_inf_ptr(sc), stream); // skips on inf
           capex_cuda_scaler_update(sc, stream);                           // grow / back off
       }

   Math: capex.h's CPU backend, the same source text (capex__optim_math_parts)
   compiled by NVRTC with --fmad=false: Adam/AdamW and SGD weights, moments and
   model copies are bit-identical to capex_optim_step given the same inputs,
   and so is multi_tensor_scale (the bias corrections come from the device's
   double pow, within 2 double ulps of glibc's: the float they round to can
   differ in about one step in 10^8). Norms sum squares in double in a fixed order
   (per-chunk partials to memory, then a fixed-order reduction): the same bits
   on every run, within a few ulps of the CPU's float results (whose order
   differs). LAMB inherits that (trust ratios within 1e-6 relative), and so
   does NovoGrad (its per-tensor norm average v within a few ulps).

   Work is cut into capex.h's chunks (chunk size desc.exec.chunk_size,
   default 65536; the same chunks and order as capex_chunk_plan_*). A launch
   takes the next tensors, all their chunks, with metadata passed by value
   (64-bit sizes): under the 4 KB parameter limit 59 tensors a launch for
   Adam (6 lists) .. 159 for a norm (1 list); with 32 KB parameters (driver
   12.1+, sm_70+; CAPEX_CUDA_PARAMS) about 8.5 times as many. Its grid is sized from the
   device (SMs x cuOccupancyMaxActiveBlocksPerMultiprocessor; 320 blocks when
   the driver cannot say) and each block walks chunks blockIdx.x, +gridDim.x,
   ...; per-chunk partials make every result independent of the grid.
   4-element vector loads/stores (16 bytes of f32) where the pointers are
   aligned, scalar tail otherwise. Tensor lists hold DEVICE pointers in
   capex_tensor.data.

   Device scalars are capex_cuda_ptr addresses of: float scale / inv_scale /
   clip coefficient / norm, uint32 found_inf (kernels only ever store 1 into
   it; start from 0), double workspace. 0 means "none" where documented.

   Thread safety: an optimizer or scaler must not be used from two threads at
   once; distinct objects are independent. Calls enqueue on `stream` (NULL:
   the context's default stream) and return at once, except where noted. */

/* Device bytes of workspace that capex_cuda_multi_tensor_l2norm and
   capex_cuda_clip_grad_norm need for these lists: 8 * (chunks + 1). */
CAPEX_API capex_result capex_cuda_multi_tensor_workspace_size(const capex_tensor_op_desc *desc,
                                                              const capex_tensor_list *lists, size_t nlists,
                                                              size_t *bytes);
/* Apex multi_tensor_scale / GradScaler unscale_: out = in * (*scale) (device
   float), rounded to out's dtype; sets *found_inf (device uint32, 0: none) to 1
   if an input or stored output is inf/NaN. out NULL: check only (reads in,
   writes nothing but found_inf). Same rules as capex_multi_tensor_scale. */
CAPEX_API capex_result capex_cuda_multi_tensor_scale(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                     const capex_tensor_list *in, const capex_tensor_list *out,
                                                     capex_cuda_ptr scale, capex_cuda_ptr found_inf,
                                                     capex_cuda_stream stream);
/* Apex multi_tensor_l2norm: float norms to device memory (either 0: none);
   total_norm one float, per_tensor_norms x->count floats (0 for empty tensors). */
CAPEX_API capex_result capex_cuda_multi_tensor_l2norm(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                      const capex_tensor_list *x, capex_cuda_ptr workspace,
                                                      size_t workspace_bytes, capex_cuda_ptr total_norm,
                                                      capex_cuda_ptr per_tensor_norms, capex_cuda_stream stream);
/* capex_clip_grad_norm on the device: total (float, 0: none) and the factor
   min(1, max_norm / (total + 1e-6)) (float, 0: none; 1 for a non-finite
   total); apply != 0 also multiplies every grad by it where it is < 1 (a
   tensor listed twice, or overlapping another, is refused: it would be
   scaled twice). The factor can go to capex_cuda_optim_step's clip_coef
   instead (apply = 0). */
CAPEX_API capex_result capex_cuda_clip_grad_norm(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                 const capex_tensor_list *grads, size_t nlists, float max_norm,
                                                 capex_cuda_ptr workspace, size_t workspace_bytes,
                                                 capex_cuda_ptr total_norm, capex_cuda_ptr clip_coef, int apply,
                                                 capex_cuda_stream stream);

/* Device-resident dynamic loss scaler: capex_scaler's rule (growth, backoff,
   hysteresis, min/max: bit for bit) as a one-thread kernel. Its found_inf
   flag collects unscale checks until update(), which applies the rule, sets
   inv_scale = f32(1 / f64(scale)) and clears found_inf. The per-optimizer
   call-order state machine of capex_scaler is the caller's job here: one
   found_inf skips every optimizer stepped with it, and set_state clears a
   found_inf not yet consumed by update(). Nothing is logged (desc's
   log_interval and id are unused): read skipped_steps with get_state. */
typedef struct capex_cuda_scaler capex_cuda_scaler;
/* desc NULL: capex_scaler_desc_init's defaults. Allocates 80 device bytes. */
CAPEX_API capex_result capex_cuda_scaler_create(capex_cuda_context *ctx, const capex_scaler_desc *desc,
                                                capex_cuda_scaler **out);
CAPEX_API void capex_cuda_scaler_destroy(capex_cuda_scaler *sc); /* NULL is fine */
/* Device addresses: float scale, float inv_scale, uint32 found_inf. 0 for NULL. */
CAPEX_API capex_cuda_ptr capex_cuda_scaler_scale_ptr(const capex_cuda_scaler *sc);
CAPEX_API capex_cuda_ptr capex_cuda_scaler_inv_scale_ptr(const capex_cuda_scaler *sc);
CAPEX_API capex_cuda_ptr capex_cuda_scaler_found_inf_ptr(const capex_cuda_scaler *sc);
/* grads * inv_scale into out (out may be grads: in place; NULL: check only),
   inf/NaN into the scaler's found_inf. */
CAPEX_API capex_result capex_cuda_scaler_unscale(capex_cuda_scaler *sc, const capex_tensor_op_desc *desc,
                                                 const capex_tensor_list *grads, const capex_tensor_list *out,
                                                 capex_cuda_stream stream);
/* Ends the iteration on the device (one-thread kernel). */
CAPEX_API capex_result capex_cuda_scaler_update(capex_cuda_scaler *sc, capex_cuda_stream stream);
/* Read back / restore (checkpoints, logging). These wait for `stream`. */
CAPEX_API capex_result capex_cuda_scaler_get_state(capex_cuda_scaler *sc, capex_scaler_state *state,
                                                   capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_scaler_set_state(capex_cuda_scaler *sc, const capex_scaler_state *state,
                                                   capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_scaler_get_scale(capex_cuda_scaler *sc, float *scale, capex_cuda_stream stream);

/* Fused optimizers on the device: capex_optim's API with device pointers in
   capex_optim_param (param, grad, model, exp_avg, exp_avg_sq, max_exp_avg_sq).
   add_group allocates missing moment buffers on the device and zeroes all of
   them (Adagrad's sum: initial_accumulator_value). Every kind of capex.h:
   Adam (amsgrad too), LAMB, SGD, Adagrad, NovoGrad; pure_half (O3) params
   are mirrored from the model copy by one exact multi-tensor scale per half
   dtype at add_group and before and after every step. */
typedef struct capex_cuda_optim capex_cuda_optim;
CAPEX_API capex_result capex_cuda_optim_create(capex_cuda_context *ctx, const capex_optim_desc *desc,
                                               capex_cuda_optim **out);
CAPEX_API void capex_cuda_optim_destroy(capex_cuda_optim *opt); /* frees only what it allocated */
/* Validated first; on error the optimizer is unchanged. Waits for the device
   (all streams) before it reads the step counts and again before it returns,
   so steps queued earlier count and the new buffers are zero for any stream. */
CAPEX_API capex_result capex_cuda_optim_add_group(capex_cuda_optim *opt, const capex_optim_hparams *hp,
                                                  const capex_optim_param *params, size_t n, size_t *group_index);
/* One step, enqueued: g = grad * (*inv_scale) * (*clip_coef); the step is
   skipped on the device (no weight, moment, model copy or step count changes)
   when *found_inf != 0. Device addresses (float, float, uint32); 0 means 1, 1
   and 0. A non-finite or non-positive inv_scale, a negative or non-finite
   clip_coef, or a product of the two that is not finite also skips (the
   device cannot report an error; capex_optim_step refuses them) and, as
   there, is no iteration of an attached count_skipped lr schedule: its count
   (capex_cuda_optim_get_lr_iteration) not advancing is how the host sees it. */
CAPEX_API capex_result capex_cuda_optim_step(capex_cuda_optim *opt, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                             capex_cuda_ptr found_inf, capex_cuda_stream stream);
CAPEX_API size_t capex_cuda_optim_num_groups(const capex_cuda_optim *opt);
/* Validated like add_group; enqueued on stream (a later step sees it). */
CAPEX_API capex_result capex_cuda_optim_set_hparams(capex_cuda_optim *opt, size_t group,
                                                    const capex_optim_hparams *hp, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_optim_set_lr(capex_cuda_optim *opt, size_t group, float lr,
                                               capex_cuda_stream stream);
/* Device address of the group's float lr, which each step reads: a schedule
   kernel of yours may write it (no host round trip). 0 for a bad group.
   add_group moves the group table: ask again after it. */
CAPEX_API capex_cuda_ptr capex_cuda_optim_lr_ptr(const capex_cuda_optim *opt, size_t group);
/* Attaches an lr schedule (capex.h's capex_lr_schedule; NULL detaches): each
   step, capex_go_prepare sets every group's lr to capex_lr_at(s, hp.lr,
   steps taken) on the device from its own step count (capex.h's formula
   text; no host round trip, skipped steps do not advance it), or with
   s->count_skipped from the schedule's iteration count, which the device
   advances on every step, skipped by found_inf or not (as
   capex_optim_set_lr_schedule counts it; graph replays count too), except a
   step with inputs capex_optim_step refuses (above). hp.lr stays the
   base; a schedule overrides lrs written through capex_cuda_optim_lr_ptr.
   Detaching sets every group's lr back to its hp.lr. Enqueued on stream. to_host hands the schedule to the host copy and
   from_host takes the host's (keeping this one when the host has none).
   CUDA's double cos/pow may differ from libm by an ulp: the float lr then
   rarely differs from the CPU's by one ulp; the emulator is bit-exact. */
CAPEX_API capex_result capex_cuda_optim_set_lr_schedule(capex_cuda_optim *opt, const capex_lr_schedule *s,
                                                        capex_cuda_stream stream);
/* Steps taken by a group (skipped steps do not count). Waits for stream. */
CAPEX_API capex_result capex_cuda_optim_get_step(capex_cuda_optim *opt, size_t group, int64_t *step,
                                                 capex_cuda_stream stream);
/* The schedule's iteration count (capex_optim_get_lr_iteration's; 0 with no
   schedule attached). Waits for stream. */
CAPEX_API capex_result capex_cuda_optim_get_lr_iteration(capex_cuda_optim *opt, int64_t *iteration,
                                                         capex_cuda_stream stream);
/* The device moment buffers of one parameter (0 where there are none). */
/* Adam amsgrad's max_exp_avg_sq device buffer of one parameter (0 without amsgrad). */
CAPEX_API capex_result capex_cuda_optim_get_max_exp_avg_sq(const capex_cuda_optim *opt, size_t group, size_t index,
                                                           capex_cuda_ptr *max_exp_avg_sq);
CAPEX_API capex_result capex_cuda_optim_get_state(const capex_cuda_optim *opt, size_t group, size_t index,
                                                  capex_cuda_ptr *exp_avg, capex_cuda_ptr *exp_avg_sq);
/* Checkpoints in capex_optim's format (a GPU run resumes on the CPU and back):
   to_host makes a host capex_optim with the same kind, groups and parameters
   holding copies of the device's step counts, hyperparameters, moments and,
   with CAPEX_OPTIM_STATE_PARAMS, fp32 weights and model copies (its grads are
   placeholders: do not step it). Save it with capex_optim_save, or
   capex_optim_load into it and hand it to from_host, which validates that it
   matches (kind, groups, sizes, moment and model buffers, each Adam group's
   amsgrad, SGD momentum only where the device group has buffers) before it
   changes anything on the device. It takes the host's hyperparameters and,
   as capex_optim_load takes a file's, its modes (adam_w_mode, use_nvlamb,
   wd_after_momentum, stochastic_rounding, max_grad_norm, seed; NovoGrad's
   reg_inside_moment, init_zero, norm_type): a checkpoint saved in other
   modes resumes on this device optimizer. capex_cuda_zero's
   optimizer refuses stochastic_rounding (CAPEX_ERR_UNSUPPORTED), as its
   create does. Both wait for `stream`; from_host waits for
   the whole device before and after it copies. The learning rate saved is the
   device's (a kernel may set it through capex_cuda_optim_lr_ptr). from_host
   with CAPEX_OPTIM_STATE_PARAMS refuses (CAPEX_ERR_ORDER) a copy that holds no
   weights (to_host without the flag, not loaded with it). The host
   optimizer is yours: capex_optim_destroy frees it with its copies.

       capex_optim *h;  capex_cuda_optim_to_host(opt, CAPEX_OPTIM_STATE_PARAMS, s, &h);
       capex_optim_save(h, w, "optim", CAPEX_OPTIM_STATE_PARAMS);   // then write w
       ...  capex_optim_load(h, reader, "optim", CAPEX_OPTIM_STATE_PARAMS);
       capex_cuda_optim_from_host(opt, h, CAPEX_OPTIM_STATE_PARAMS, s);  capex_optim_destroy(h); */
CAPEX_API capex_result capex_cuda_optim_to_host(capex_cuda_optim *opt, unsigned flags, capex_cuda_stream stream,
                                                capex_optim **host);
CAPEX_API capex_result capex_cuda_optim_from_host(capex_cuda_optim *opt, const capex_optim *host, unsigned flags,
                                                  capex_cuda_stream stream);

/* ==== NCCL communicator: declarations ==== */
#ifndef CAPEX_NO_DIST /* CAPEX_NO_DIST (capex.h) leaves out the NCCL communicator */

/* ---- NCCL communicator: a capex_comm on device buffers ---------------------

       capex_dist_env env;  capex_dist_env_read(NULL, &env);  // torchrun/mpirun/srun
       capex_cuda_context *ctx; capex_cuda_context_create(NULL, &ctx); // GPU $LOCAL_RANK
       capex_nccl_desc nd;  capex_nccl_desc_init(&nd);
       nd.ctx = ctx;  nd.user_stream = my_stream;   // where your grads are written
       capex_comm comm;     if (capex_comm_init_nccl(&comm, &env, &nd)) puts(capex_last_error());
       capex_ddp *ddp;      capex_ddp_create(&ddp, &comm, params, n, NULL); // device grads

   The unique id goes from rank 0 to all over nd.bootstrap (an MPI capex_comm)
   when given, else over capex.h's TCP rendezvous at MASTER_ADDR:MASTER_PORT
   with the run's nonce and init_timeout_s. Collectives run on the comm's own
   non-blocking stream (comm.stream) after an event recorded on user_stream,
   so they see every grad written there; blocking entries poll an event and
   ncclCommGetAsyncError until comm->timeout_s, then return CAPEX_ERR_TIMEOUT /
   CAPEX_ERR_COMM and the communicator is aborted (ncclCommAbort) instead of
   hanging. The scale/convert/zero/copy entries (DDP's and ZeRO's staging) run
   on user_stream itself, so it never waits for the comm stream. DDP's and
   ZeRO's creates reserve on the comm what their launches use (an event per
   bucket, the f32 scratch of half scales, the scale and convert kernels),
   so a step creates and allocates nothing where one rank could fail alone;
   the comm's init makes the device buffer of their agreements (144 (world
   + 1) bytes; DDP's create grows it to 4 bytes a param for a rebuild's
   ready order), so no agreement allocates either; and a 1 MiB scratch,
   through which AVG of f16/bf16 without ncclAvg is scaled and a gather's
   send shifted onto its own slot is moved, in pieces, so that no call of
   any size allocates. dtypes: f32,
   f16, bf16 (NCCL >= 2.10), and CAPEX_F64 / CAPEX_I64. AVG is ncclAvg on
   NCCL >= 2.10, else a sum then a scale by 1/world. Thread safety: one thread
   at a time per comm (like every capex_comm). If rank 0 cannot make the id (no
   NCCL there) it sends zeros and the others fail at once with CAPEX_ERR_COMM;
   another rank that fails on its own (no NCCL, no stream) does so before the
   exchange, so the others fail at its deadline (init_timeout_s). A rank that
   dies (or never comes) after the exchange: with NCCL >= 2.14 the comm is
   made non-blocking (ncclCommInitRankConfig, blocking = 0) and polled, so the
   others return CAPEX_ERR_TIMEOUT after init_timeout_s (CAPEX_ERR_COMM /
   CAPEX_ERR_NCCL when NCCL reports the failure first), the half-made comm
   aborted. The comm then stays non-blocking: each NCCL call that says
   ncclInProgress is polled to its end under comm->timeout_s. NCCL < 2.14
   has no such init: its blocking ncclCommInitRank waits for a missing rank
   for ever, and init_timeout_s bounds only the exchange; so does
   NCCL_COMM_BLOCKING=1 in the environment (it overrides the config).

   Launching, one process per GPU (LOCAL_RANK picks it):
       torchrun --no-python --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 ./train
       (the id then goes over TCP at MASTER_PORT + 1: torchrun's store holds MASTER_PORT)
       mpirun -np 16 -npernode 8 -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ./train
       srun -N 2 --ntasks-per-node 8 --gpus-per-task 1 ./train  // export MASTER_ADDR/PORT */
typedef struct capex_nccl_unique_id { unsigned char bytes[128]; } capex_nccl_unique_id; /* ncclUniqueId */

typedef struct capex_nccl_desc {
    capex_cuda_context *ctx;       /* required: this rank's GPU                         */
    capex_cuda_stream user_stream; /* where grads are produced (NULL: default stream)   */
    capex_comm *bootstrap;         /* host comm (MPI) for the unique id; NULL: TCP      */
    double init_timeout_s;         /* id exchange and NCCL init deadline (300 s)        */
    double timeout_s;              /* deadline of each collective (default 1800 s)      */
    int use_nccl_avg;              /* 1 (default): ncclAvg when NCCL >= 2.10            */
    int rendezvous_port;           /* TCP bootstrap port; 0: auto (see below)          */
    uint32_t init_tag; /* set by capex_nccl_desc_init (capex.h "Descriptors") */
} capex_nccl_desc;

CAPEX_API void capex_nccl_desc_init(capex_nccl_desc *d);
/* ncclGetUniqueId (no GPU needed). Loads NCCL: CAPEX_ERR_NO_NCCL if missing. */
CAPEX_API capex_result capex_nccl_get_unique_id(capex_nccl_unique_id *id);
/* Rank 0's id (in *id on rank 0) to every rank, over bootstrap when it is a
   multi-rank host comm, else the TCP rendezvous of env (deadline, retries,
   nonce) at MASTER_ADDR and env->rdv_port (MASTER_PORT, or MASTER_PORT + 1
   under torchrun >= 2 whose agent's TCPStore holds MASTER_PORT; CAPEX_PORT
   overrides: see capex_dist_env). An all-zero id from rank 0 means rank 0 failed: the others get
   CAPEX_ERR_COMM at once instead of waiting. timeout_s <= 0: 300 s. */
CAPEX_API capex_result capex_nccl_exchange_unique_id(const capex_dist_env *env, capex_comm *bootstrap,
                                                     capex_nccl_unique_id *id, double timeout_s);
/* The whole bootstrap: id on rank 0, exchange, then capex_comm_init_nccl_id. */
CAPEX_API capex_result capex_comm_init_nccl(capex_comm *c, const capex_dist_env *env, const capex_nccl_desc *d);
/* ncclCommInitRank with an id you distributed yourself. */
CAPEX_API capex_result capex_comm_init_nccl_id(capex_comm *c, const capex_nccl_unique_id *id, int rank, int world_size,
                                               const capex_nccl_desc *d);
/* Changes the stream collectives wait for and DDP's/ZeRO's staging runs on
   (e.g. per step; order the old stream before the new one yourself). Not
   during a DDP backward pass with buckets in flight. */
CAPEX_API capex_result capex_nccl_set_user_stream(capex_comm *c, capex_cuda_stream user_stream);
/* 1 when c is an NCCL communicator. */
CAPEX_API int capex_comm_is_nccl(const capex_comm *c);

/* ---- ZeRO on the GPU: sharded optimizer state over NCCL ---------------------
   capex.h's capex_zero (stage 1 and 2: same buckets, shards, padding,
   reduce-scatter, all-gather and checkpoint format) with device params and a
   capex_cuda_optim over this rank's pieces (fp32 master shards of half
   params in device memory). Every per-step value stays on the device: the
   global norm, found_inf (agreed by all ranks through the allreduced sum of
   squares) and the clip factor are written by a one-thread kernel that the
   optimizer step reads, so no value crosses to the host (the NCCL comm's
   blocking entries do wait for their collective, with its deadline).

       capex_cuda_zero *zg;   // params[i].data: DEVICE pointers; comm: capex_comm_init_nccl
       capex_cuda_zero_create(&zg, &comm, zp, N, &od, NULL, 1, &zd);
       capex_zero *z = capex_cuda_zero_base(zg);   // grad, grad_ready, finalize, zero_grad, save, load
       for (;;) {  // forward scaled by *capex_cuda_scaler_scale_ptr(sc), on the comm's user stream
           // backward: grads into capex_zero_grad(z, i), capex_zero_grad_ready(z, i); then
           capex_zero_finalize(z);
           capex_cuda_zero_grad_norm(zg, capex_cuda_scaler_inv_scale_ptr(sc), max_norm,
                                     capex_cuda_scaler_found_inf_ptr(sc), 0, capex_cuda_zero_clip_coef_ptr(zg));
           capex_cuda_zero_step(zg, capex_cuda_scaler_inv_scale_ptr(sc), capex_cuda_zero_clip_coef_ptr(zg),
                                capex_cuda_scaler_found_inf_ptr(sc));   // skipped on the device on inf
           capex_cuda_scaler_update(sc, user_stream);
           capex_zero_zero_grad(z);
       }

   Kernels run on the comm's user stream (capex_nccl_desc.user_stream).
   Adam/AdamW (amsgrad too), SGD and Adagrad: the update is elementwise, so
   weights are bit-identical to DDP + capex_cuda_optim given the same reduced
   gradients and clip factor (tested in worlds of 1, 2 and 4 on the CPU
   emulator with the stand-in NCCL). LAMB: its global grad norm and each
   tensor's |p|^2, |u|^2 are summed over the pieces on every rank inside the
   device step (two f64 NCCL allreduces per step; the step waits for them,
   values stay on the device), so they match the unsharded sums to ~1e-15
   relative and the weights within a few ulps (tested: 1e-5); NovoGrad's
   per-tensor grad norms alike (one allreduce), its v (one float per tensor)
   kept alike by every rank holding a piece. Stage 2
   accumulates micro-batches (several finalize calls before zero_grad) in the
   shard as the host does (f32 sum, one rounding to f16/bf16). Not yet: bf16
   stochastic rounding (create refuses it with a message). Checkpoints: capex_zero_save/load on the base (the
   unsharded capex_optim format: they load on the CPU, into plain optimizers
   and into any world size); they copy through the host and wait. Thread
   safety: one thread at a time per zero. */
typedef struct capex_cuda_zero capex_cuda_zero;
/* As capex_zero_create, for a comm on device buffers (NCCL) and device
   params. Collective, with the same check that every rank passes the same
   model and settings (its 18 int64 per rank go through the comm's small
   device buffer), and the same last agreement, after this rank's device buffers, optimizer
   and the kernels its steps and grad_norm launch (loaded here, compiled if
   missing: a rank that cannot load one fails every rank here, not alone at
   the first step; a world of 1 loads grad_norm's at its first call). With
   several ranks a later change of the step's kernels (momentum off, an lr
   schedule, a load in other modes) loads them at the change, before it
   changes anything, so no step loads one: capex_cuda_optim_set_hparams,
   _set_lr_schedule and _from_host on capex_cuda_zero_optim fail there, on
   that rank, with nothing changed; capex_zero_load checks before its
   agreement (every rank fails with one that cannot). Those exchanges, and
   capex_zero_save's and capex_zero_load's agreements, allocate nothing: the NCCL comm keeps their device buffer
   (144 (world + 1) bytes, made by its init), so a rank failing its own part
   still takes part and its peers fail with it. */
CAPEX_API capex_result capex_cuda_zero_create(capex_cuda_zero **out, capex_comm *comm, const capex_zero_param *params,
                                              size_t num_params, const capex_optim_desc *od,
                                              const capex_optim_hparams *hparams, size_t num_groups,
                                              const capex_zero_desc *d);
CAPEX_API void capex_cuda_zero_destroy(capex_cuda_zero *z); /* NULL is fine */
/* The capex_zero inside: capex_zero_grad, _grad_ready, _finalize,
   _zero_grad, _set_sync, _wait_param(s), _save, _load, _memory_info. Its
   grad_norm and step refuse: use the two below. */
CAPEX_API capex_zero *capex_cuda_zero_base(capex_cuda_zero *z);
/* The device optimizer over this rank's pieces (set_lr, schedules, get_step;
   add_group is refused: CAPEX_ERR_UNSUPPORTED). */
CAPEX_API capex_cuda_optim *capex_cuda_zero_optim(capex_cuda_zero *z);
/* A device float owned by z, for grad_norm's clip factor (1.0 at create). */
CAPEX_API capex_cuda_ptr capex_cuda_zero_clip_coef_ptr(const capex_cuda_zero *z);
/* After finalize: the shards' sums of squares (f64, fixed order), one NCCL
   allreduce of that double, then one thread writes: *found_inf = 1 when the
   sum is not finite (uint32; never cleared here: the scaler's flag),
   *total_norm = float(sqrt(sum)) of the grads as they are (scaled), and
   *clip_coef = capex_clip_coef(total * *inv_scale, max_norm) (1 on inf;
   max_norm inf: 1). Device addresses; inv_scale 0 means 1, the others 0
   mean "not written". Collective. */
CAPEX_API capex_result capex_cuda_zero_grad_norm(capex_cuda_zero *z, capex_cuda_ptr inv_scale, float max_norm,
                                                 capex_cuda_ptr found_inf, capex_cuda_ptr total_norm,
                                                 capex_cuda_ptr clip_coef);
/* The shard step (capex_cuda_optim_step with these device pointers: skipped
   on the device when *found_inf != 0) and the all-gather of the parameters
   into every params[i].data (also after a skipped step: the host does not
   know). _async leaves the copies out to capex_zero_wait_param(s) on the
   base. Collective. */
CAPEX_API capex_result capex_cuda_zero_step(capex_cuda_zero *z, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                            capex_cuda_ptr found_inf);
CAPEX_API capex_result capex_cuda_zero_step_async(capex_cuda_zero *z, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                                  capex_cuda_ptr found_inf);
#endif /* CAPEX_NO_DIST */

/* ==== GPU LayerNorm/RMSNorm/SyncBatchNorm: declarations ==== */
/* ---------------------------------------------------------------------------
   Norms on the GPU (NORM): capex.h's LayerNorm / RMSNorm / BatchNorm /
   SyncBatchNorm with device pointers. The kernels compile from the same
   per-element math text as the CPU backend (capex.h CAPEX__NORM_MATH), so the
   CPU tests vouch for the formulas; reductions run in another order (a warp
   or block per row), so results match the CPU to rounding, not in bits.
   Semantics, dtypes and argument rules: capex.h's Norms section. LayerNorm
   forward takes rows of at most 2^32 columns (CAPEX_ERR_LIMIT beyond).
   Aliasing as capex.h's (checked on the host, before any launch): outputs
   overlap nothing, the workspace counts as an output, and only forward
   y == x with x_dtype == y_dtype runs in place (the same bits: a warp or
   block has read its whole row before the reduction's sync, and each y
   element is then written by the thread that read its x).

       capex_cuda_norm_args a; capex_cuda_norm_args_init(&a);
       a.rows = T; a.cols = D; a.x_dtype = a.y_dtype = CAPEX_BF16;
       a.x = x; a.y = y; a.weight = g; a.mean = mean; a.rstd = rstd;   // capex_cuda_ptr
       capex_cuda_rms_norm_forward(ctx, NULL, &a, stream);           // NULL desc: eps 1e-5
       a.dy = dy; a.dx = dx; a.dweight = dg;
       a.workspace = ws;  // capex_cuda_norm_workspace_bytes(T, D) bytes, for dweight/dbias
       capex_cuda_rms_norm_backward(ctx, NULL, &a, stream);

   desc.memory_efficient = 1 (capex.h): the backward reads a.y (and a.bias),
   not a.x and a.mean, through kernels of its own. A zero weight is not
   refused here (looking needs a host sync): its column's dx and dweight come
   out non-finite, which the loss scaler's overflow check catches.

   SyncBatchNorm: comm NULL (or a world of one) is BatchNorm. A comm with
   device buffers (NCCL) must use `stream` (comm->stream) where a collective
   runs (training; eval with sync_eval_batch_stats and no running statistics),
   ordered like the comm's collectives: after the work queued on its user
   stream, which then waits for the call's kernels on the GPU. Eval without a
   collective may run on any stream, as plain work queued there. The gather and the
   merge stay on the device (no copies through the host), but the call waits
   for each collective to finish (polled against the comm's deadline, so a
   dead peer gives a status, not a hang). A host comm (MPI, TCP)
   works too: the few floats per channel are staged through host memory (a
   stream synchronisation per collective). The workspace
   (capex_cuda_batch_norm_workspace_bytes) carries the statistics and the
   total count from forward to backward: keep it. Unlike the CPU path, a
   global batch of fewer than 2 values per channel over several ranks is not
   reported (it would need a host synchronisation); as in torch's
   SyncBatchNorm, one value makes running_var NaN (the unbiased variance
   0 * 1/0) and none moves both running statistics toward 0. Thread safety:
   as capex_cuda_launch (streams follow CUDA).
   ------------------------------------------------------------------------- */
typedef struct capex_cuda_norm_args {
    int64_t rows, cols;
    capex_dtype x_dtype, y_dtype, param_dtype;
    capex_cuda_ptr x, weight, bias, y;
    capex_cuda_ptr mean, rstd;     /* [rows] f32 (forward: 0 = not saved; backward: required) */
    capex_cuda_ptr dy, dx, dweight, dbias;
    capex_cuda_ptr workspace;      /* backward with dweight/dbias */
    uint32_t init_tag; /* set by capex_cuda_norm_args_init (capex.h "Descriptors") */
} capex_cuda_norm_args;
CAPEX_API void capex_cuda_norm_args_init(capex_cuda_norm_args *a);
CAPEX_API size_t capex_cuda_norm_workspace_bytes(int64_t rows, int64_t cols);
CAPEX_API capex_result capex_cuda_layer_norm_forward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                     const capex_cuda_norm_args *a, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_layer_norm_backward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                      const capex_cuda_norm_args *a, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_rms_norm_forward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                   const capex_cuda_norm_args *a, capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_rms_norm_backward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                    const capex_cuda_norm_args *a, capex_cuda_stream stream);

typedef struct capex_cuda_batch_norm_args {
    int64_t n, c, s;
    capex_bn_layout layout;
    capex_dtype x_dtype, y_dtype, param_dtype;
    capex_cuda_ptr x, weight, bias, running_mean, running_var, y;
    int64_t *num_batches_tracked;           /* HOST counter or NULL, as capex_batch_norm_args */
    capex_cuda_ptr save_mean, save_invstd;  /* [C] f32, required */
    capex_cuda_ptr dy, dx, dweight, dbias;
    capex_cuda_ptr workspace;               /* capex_cuda_batch_norm_workspace_bytes(c, world), required */
    uint32_t init_tag; /* set by capex_cuda_batch_norm_args_init (capex.h "Descriptors") */
} capex_cuda_batch_norm_args;
CAPEX_API void capex_cuda_batch_norm_args_init(capex_cuda_batch_norm_args *a);
CAPEX_API size_t capex_cuda_batch_norm_workspace_bytes(int64_t channels, int world);
CAPEX_API capex_result capex_cuda_batch_norm_forward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                     capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                     capex_cuda_stream stream);
CAPEX_API capex_result capex_cuda_batch_norm_backward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                      capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                      capex_cuda_stream stream);

#ifdef __cplusplus
}
#endif
#endif /* CAPEX_CUDA_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef CAPEX_CUDA_IMPLEMENTATION
#ifndef CAPEX_CUDA__IMPLEMENTED
#define CAPEX_CUDA__IMPLEMENTED

#include <dlfcn.h>
#include <pthread.h>
#include <locale.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <dirent.h>
#include <sys/file.h> /* flock: the cache's per-entry compile lock */
#include <time.h>

/* No FMA contraction here either, as in capex.h's implementation (which ends
   before this one): host math that feeds the kernels (--fmad=false) or
   mirrors capex.h rounds each product and sum (today single operations:
   inv_scale, AVG's 1/world). And GCC inlines no function given optimize
   options into a caller with other ones ("optimization level attribute
   mismatch"): without the same options here, none of capex.h's helpers
   inlined into this section. Restored at the end; left out where capex.h
   leaves it out (CAPEX__GCC_NO_CONTRACT: its implementation, always in this
   translation unit, decided for GCC's ISO C modes, which do not contract). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(CAPEX__GCC_NO_CONTRACT)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- small helpers --------------------------------------------------------- */

/* Appends printf output to buf (bounded, always terminated). */
CAPEX__PRIVATE void capex__cuda_append(char *buf, size_t cap, const char *fmt, ...) CAPEX__PRINTF(3, 4);
CAPEX__PRIVATE void capex__cuda_append(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    va_list ap;
    if (len + 1 >= cap) return;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* snprintf that may truncate on purpose (messages, paths checked elsewhere). */
CAPEX__PRIVATE void capex__cuda_fmt(char *buf, size_t cap, const char *fmt, ...) CAPEX__PRINTF(3, 4);
CAPEX__PRIVATE void capex__cuda_fmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    if (cap == 0) return;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* Flags written once by a loader and read without its pthread_once (release /
   acquire, so a reader that sees the flag sees what was stored before it). */
#if defined(__GNUC__) || defined(__clang__)
#define CAPEX__ATOMIC_LOAD_INT(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define CAPEX__ATOMIC_STORE_INT(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#else
#define CAPEX__ATOMIC_LOAD_INT(p) (*(volatile int *)(p))
#define CAPEX__ATOMIC_STORE_INT(p, v) (*(volatile int *)(p) = (v))
#endif

/* dlsym result -> function pointer without the object/function pointer cast
   that ISO C leaves undefined (POSIX guarantees the representation). */
#define CAPEX__CUDA_SYM(lib, field, name) do { void *capex__p = dlsym((lib), (name)); memcpy(&(field), &capex__p, sizeof capex__p); } while (0)

/* ---- SHA-256 (FIPS 180-4), for cache keys and checksums --------------------- */

typedef struct capex__sha256 {
    uint32_t h[8];
    uint64_t len;
    unsigned char buf[64];
    size_t n;
} capex__sha256;

static const uint32_t capex__sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

CAPEX__PRIVATE void capex__sha256_init(capex__sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->n = 0;
}

#define CAPEX__ROR32(x, r) (((x) >> (r)) | ((x) << (32 - (r))))
CAPEX__PRIVATE void capex__sha256_block(capex__sha256 *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = CAPEX__ROR32(w[i - 15], 7) ^ CAPEX__ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = CAPEX__ROR32(w[i - 2], 17) ^ CAPEX__ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3];
    e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (i = 0; i < 64; i++) {
        uint32_t t1 = h + (CAPEX__ROR32(e, 6) ^ CAPEX__ROR32(e, 11) ^ CAPEX__ROR32(e, 25)) + ((e & f) ^ (~e & g)) +
                      capex__sha256_k[i] + w[i];
        uint32_t t2 = (CAPEX__ROR32(a, 2) ^ CAPEX__ROR32(a, 13) ^ CAPEX__ROR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d;
    s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

CAPEX__PRIVATE void capex__sha256_update(capex__sha256 *s, const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    s->len += len;
    while (len > 0) {
        size_t take = 64 - s->n < len ? 64 - s->n : len;
        if (s->n == 0 && len >= 64) {
            capex__sha256_block(s, p);
            p += 64;
            len -= 64;
            continue;
        }
        memcpy(s->buf + s->n, p, take);
        s->n += take;
        p += take;
        len -= take;
        if (s->n == 64) {
            capex__sha256_block(s, s->buf);
            s->n = 0;
        }
    }
}

CAPEX__PRIVATE void capex__sha256_final(capex__sha256 *s, unsigned char out[32]) {
    uint64_t bits = s->len * 8u;
    unsigned char pad = 0x80, zero = 0, lenb[8];
    int i;
    capex__sha256_update(s, &pad, 1);
    while (s->n != 56) capex__sha256_update(s, &zero, 1);
    for (i = 0; i < 8; i++) lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
    capex__sha256_update(s, lenb, 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

CAPEX__PRIVATE void capex__sha256_u64(capex__sha256 *s, uint64_t v) {
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    capex__sha256_update(s, b, 8);
}
/* Length-prefixed, so ("-DA", "-DB") and ("-DA-DB") hash differently. */
CAPEX__PRIVATE void capex__sha256_str(capex__sha256 *s, const char *str) {
    size_t n = str ? strlen(str) : 0;
    capex__sha256_u64(s, (uint64_t)n);
    if (n) capex__sha256_update(s, str, n);
}

/* ---- the CUDA driver, loaded once --------------------------------------- */

typedef int capex__CUresult;

typedef struct capex__cuda_driver_lib {
    void *lib;
    capex_result status;
    char message[900];
    int version;
    capex__CUresult (*cuInit)(unsigned);
    capex__CUresult (*cuDriverGetVersion)(int *);
    capex__CUresult (*cuGetErrorName)(capex__CUresult, const char **);
    capex__CUresult (*cuGetErrorString)(capex__CUresult, const char **);
    capex__CUresult (*cuDeviceGetCount)(int *);
    capex__CUresult (*cuDeviceGet)(int *, int);
    capex__CUresult (*cuDeviceGetName)(char *, int, int);
    capex__CUresult (*cuDeviceGetAttribute)(int *, int, int);
    capex__CUresult (*cuDeviceTotalMem_v2)(size_t *, int);
    capex__CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
    capex__CUresult (*cuDevicePrimaryCtxRelease_v2)(int);
    capex__CUresult (*cuCtxGetCurrent)(void **);
    capex__CUresult (*cuCtxSetCurrent)(void *);
    capex__CUresult (*cuCtxSynchronize)(void);
    capex__CUresult (*cuModuleLoadDataEx)(void **, const void *, unsigned, int *, void **);
    capex__CUresult (*cuModuleUnload)(void *);
    capex__CUresult (*cuModuleGetFunction)(void **, void *, const char *);
    capex__CUresult (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      void *, void **, void **);
    capex__CUresult (*cuMemAlloc_v2)(capex_cuda_ptr *, size_t);
    capex__CUresult (*cuMemFree_v2)(capex_cuda_ptr);
    capex__CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    capex__CUresult (*cuMemcpyHtoD_v2)(capex_cuda_ptr, const void *, size_t);
    capex__CUresult (*cuMemcpyDtoH_v2)(void *, capex_cuda_ptr, size_t);
    capex__CUresult (*cuMemcpyDtoD_v2)(capex_cuda_ptr, capex_cuda_ptr, size_t);
    capex__CUresult (*cuMemcpyHtoDAsync_v2)(capex_cuda_ptr, const void *, size_t, void *);
    capex__CUresult (*cuMemcpyDtoHAsync_v2)(void *, capex_cuda_ptr, size_t, void *);
    capex__CUresult (*cuMemcpyDtoDAsync_v2)(capex_cuda_ptr, capex_cuda_ptr, size_t, void *);
    capex__CUresult (*cuMemsetD8_v2)(capex_cuda_ptr, unsigned char, size_t);
    capex__CUresult (*cuMemsetD32_v2)(capex_cuda_ptr, unsigned, size_t);
    capex__CUresult (*cuMemsetD8Async)(capex_cuda_ptr, unsigned char, size_t, void *);
    capex__CUresult (*cuMemsetD32Async)(capex_cuda_ptr, unsigned, size_t, void *);
    capex__CUresult (*cuStreamCreate)(void **, unsigned);
    capex__CUresult (*cuStreamDestroy_v2)(void *);
    capex__CUresult (*cuStreamSynchronize)(void *);
    capex__CUresult (*cuStreamWaitEvent)(void *, void *, unsigned);
    capex__CUresult (*cuEventCreate)(void **, unsigned);
    capex__CUresult (*cuEventDestroy_v2)(void *);
    capex__CUresult (*cuEventRecord)(void *, void *);
    capex__CUresult (*cuEventSynchronize)(void *);
    /* optional */
    capex__CUresult (*cuEventElapsedTime)(float *, void *, void *);
    capex__CUresult (*cuFuncSetAttribute)(void *, int, int);
    capex__CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, void *, int, size_t);
    capex__CUresult (*cuFuncGetAttribute)(int *, int, void *);
} capex__cuda_driver_lib;

static capex__cuda_driver_lib capex__cuda_drv;
static pthread_once_t capex__cuda_drv_once = PTHREAD_ONCE_INIT;
/* The driver's version once it loaded (read by the NVRTC loader without loading it). */
static int capex__cuda_drv_version_seen = 0;

CAPEX__PRIVATE void capex__cuda_drv_load(void) {
    capex__cuda_driver_lib *d = &capex__cuda_drv;
    const char *over = getenv("CAPEX_LIBCUDA_PATH");
    const char *path = over && over[0] ? over : "libcuda.so.1";
    const char *missing = NULL;
    capex__CUresult r;
    d->message[0] = '\0';
    d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        const char *err = dlerror();
        d->status = CAPEX_ERR_NO_DRIVER;
        capex__cuda_fmt(d->message, sizeof d->message,
                 "CUDA driver not found: tried %s%s (%s). It ships with the NVIDIA driver, not the toolkit "
                 "(stubs/libcuda.so is not a driver): install the driver, or run the container with the NVIDIA "
                 "runtime (--gpus all)%s. The CPU backend does not need it.",
                 path, over && over[0] ? " from CAPEX_LIBCUDA_PATH" : "", err ? err : "unknown dlerror",
                 over && over[0] ? ", or unset CAPEX_LIBCUDA_PATH" : ", or set CAPEX_LIBCUDA_PATH to its file");
        return;
    }
#define CAPEX__DRV(name) do { CAPEX__CUDA_SYM(d->lib, d->name, #name); if (!d->name && !missing) missing = #name; } while (0)
    CAPEX__DRV(cuInit); CAPEX__DRV(cuDriverGetVersion); CAPEX__DRV(cuGetErrorName); CAPEX__DRV(cuGetErrorString);
    CAPEX__DRV(cuDeviceGetCount); CAPEX__DRV(cuDeviceGet); CAPEX__DRV(cuDeviceGetName);
    CAPEX__DRV(cuDeviceGetAttribute); CAPEX__DRV(cuDeviceTotalMem_v2); CAPEX__DRV(cuDevicePrimaryCtxRetain);
    CAPEX__DRV(cuDevicePrimaryCtxRelease_v2); CAPEX__DRV(cuCtxGetCurrent); CAPEX__DRV(cuCtxSetCurrent);
    CAPEX__DRV(cuCtxSynchronize); CAPEX__DRV(cuModuleLoadDataEx); CAPEX__DRV(cuModuleUnload);
    CAPEX__DRV(cuModuleGetFunction); CAPEX__DRV(cuLaunchKernel); CAPEX__DRV(cuMemAlloc_v2);
    CAPEX__DRV(cuMemFree_v2); CAPEX__DRV(cuMemGetInfo_v2); CAPEX__DRV(cuMemcpyHtoD_v2); CAPEX__DRV(cuMemcpyDtoH_v2);
    CAPEX__DRV(cuMemcpyDtoD_v2); CAPEX__DRV(cuMemcpyHtoDAsync_v2); CAPEX__DRV(cuMemcpyDtoHAsync_v2);
    CAPEX__DRV(cuMemcpyDtoDAsync_v2); CAPEX__DRV(cuMemsetD8_v2); CAPEX__DRV(cuMemsetD32_v2);
    CAPEX__DRV(cuMemsetD8Async); CAPEX__DRV(cuMemsetD32Async); CAPEX__DRV(cuStreamCreate);
    CAPEX__DRV(cuStreamDestroy_v2); CAPEX__DRV(cuStreamSynchronize); CAPEX__DRV(cuStreamWaitEvent);
    CAPEX__DRV(cuEventCreate); CAPEX__DRV(cuEventDestroy_v2); CAPEX__DRV(cuEventRecord);
    CAPEX__DRV(cuEventSynchronize);
#undef CAPEX__DRV
    /* cuEventElapsedTime_v2 since CUDA 12.8; older drivers have only the first. */
    CAPEX__CUDA_SYM(d->lib, d->cuEventElapsedTime, "cuEventElapsedTime_v2");
    if (!d->cuEventElapsedTime) CAPEX__CUDA_SYM(d->lib, d->cuEventElapsedTime, "cuEventElapsedTime");
    CAPEX__CUDA_SYM(d->lib, d->cuFuncSetAttribute, "cuFuncSetAttribute");
    /* sizes the multi-tensor grids (capex__go_dev_grid); without it: fixed grids */
    CAPEX__CUDA_SYM(d->lib, d->cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    /* a variant that spills is not used (capex__cuda_part_attach_locked); without it: no check */
    CAPEX__CUDA_SYM(d->lib, d->cuFuncGetAttribute, "cuFuncGetAttribute");
    if (missing) {
        d->status = CAPEX_ERR_NO_DRIVER;
        if (!d->cuInit) /* every CUDA driver has it: some other library (a toolkit's, a wrong path) */
            capex__cuda_fmt(d->message, sizeof d->message,
                     "%s%s is not a CUDA driver library (no cuInit): load libcuda.so.1, the NVIDIA driver's "
                     "library%s", path, over && over[0] ? " (CAPEX_LIBCUDA_PATH)" : "",
                     over && over[0] ? ", or unset CAPEX_LIBCUDA_PATH" : "");
        else
            capex__cuda_fmt(d->message, sizeof d->message,
                     "CUDA driver %s lacks %s: the driver is too old for capex (needs CUDA 11.0 or newer); "
                     "update the NVIDIA driver", path, missing);
        dlclose(d->lib);
        /* no pointer into the unmapped library may survive (capex__cu_fail tests them) */
        d->lib = NULL;
        memset((char *)d + offsetof(capex__cuda_driver_lib, cuInit), 0, sizeof *d - offsetof(capex__cuda_driver_lib, cuInit));
        return;
    }
    r = d->cuInit(0);
    if (r != 0) {
        const char *name = NULL, *str = NULL;
        d->cuGetErrorName(r, &name);
        d->cuGetErrorString(r, &str);
        d->status = CAPEX_ERR_NO_DEVICE;
        capex__cuda_fmt(d->message, sizeof d->message,
                 "cuInit failed: %s (%s). The driver (%s) loaded but no GPU is usable: check nvidia-smi, "
                 "CUDA_VISIBLE_DEVICES and that the driver matches the kernel module",
                 name ? name : "unknown error", str ? str : "", path);
        return;
    }
    if (d->cuDriverGetVersion(&d->version) != 0 || d->version <= 0) {
        d->status = CAPEX_ERR_NO_DRIVER;
        capex__cuda_fmt(d->message, sizeof d->message, "cuDriverGetVersion failed in the CUDA driver %s: reinstall the NVIDIA driver", path);
        return;
    }
    d->status = CAPEX_OK;
    CAPEX__ATOMIC_STORE_INT(&capex__cuda_drv_version_seen, d->version);
}

/* The driver table, or NULL with the failure recorded. Thread-safe. */
CAPEX__PRIVATE capex__cuda_driver_lib *capex__cuda_driver(capex_result *res) {
    pthread_once(&capex__cuda_drv_once, capex__cuda_drv_load);
    if (capex__cuda_drv.status != CAPEX_OK) {
        *res = capex__fail(capex__cuda_drv.status, "%s", capex__cuda_drv.message);
        return NULL;
    }
    *res = CAPEX_OK;
    return &capex__cuda_drv;
}

/* Turns a failed driver call into a capex status naming the call and the error. */
CAPEX__PRIVATE capex_result capex__cu_fail(capex__CUresult r, const char *call, const char *hint) {
    const char *name = NULL, *str = NULL;
    if (capex__cuda_drv.cuGetErrorName) capex__cuda_drv.cuGetErrorName(r, &name);
    if (capex__cuda_drv.cuGetErrorString) capex__cuda_drv.cuGetErrorString(r, &str);
    return capex__fail(r == 2 ? CAPEX_ERR_OUT_OF_MEMORY : CAPEX_ERR_CUDA, "%s failed: %s (%d: %s)%s%s", call,
                       name ? name : "CUDA_ERROR_UNKNOWN", (int)r, str ? str : "no description",
                       hint && hint[0] ? "; " : "", hint ? hint : "");
}
#define CAPEX__CU(call, args, hint) do { capex__CUresult capex__r = capex__cuda_drv.call args; \
    if (capex__r != 0) return capex__cu_fail(capex__r, #call, hint); } while (0)

/* ---- NVRTC, loaded once (only when something must be compiled) --------- */

typedef int capex__nvrtcResult;

typedef struct capex__cuda_nvrtc_lib {
    void *lib;
    capex_result status;
    char message[900];
    char path[512];
    int major, minor;
    int n_archs;
    int archs[64];
    const char *(*nvrtcGetErrorString)(capex__nvrtcResult);
    capex__nvrtcResult (*nvrtcVersion)(int *, int *);
    capex__nvrtcResult (*nvrtcGetNumSupportedArchs)(int *);
    capex__nvrtcResult (*nvrtcGetSupportedArchs)(int *);
    capex__nvrtcResult (*nvrtcCreateProgram)(void **, const char *, const char *, int, const char *const *,
                                             const char *const *);
    capex__nvrtcResult (*nvrtcDestroyProgram)(void **);
    capex__nvrtcResult (*nvrtcCompileProgram)(void *, int, const char *const *);
    capex__nvrtcResult (*nvrtcGetPTXSize)(void *, size_t *);
    capex__nvrtcResult (*nvrtcGetPTX)(void *, char *);
    capex__nvrtcResult (*nvrtcGetCUBINSize)(void *, size_t *);
    capex__nvrtcResult (*nvrtcGetCUBIN)(void *, char *);
    capex__nvrtcResult (*nvrtcGetProgramLogSize)(void *, size_t *);
    capex__nvrtcResult (*nvrtcGetProgramLog)(void *, char *);
} capex__cuda_nvrtc_lib;

static capex__cuda_nvrtc_lib capex__cuda_nv;
static pthread_once_t capex__cuda_nv_once = PTHREAD_ONCE_INIT;
static int capex__cuda_nv_loaded = 0; /* set (release) after the table is complete */

/* Opens one candidate and checks that it is a usable NVRTC (every symbol, its
   version, its architectures). 1 on success; else the library is closed, the
   table cleared and "path (reason)" appended to tried. */
CAPEX__PRIVATE int capex__cuda_nv_try(capex__cuda_nvrtc_lib *n, const char *path, char *tried, size_t cap) {
    const char *err, *missing = NULL;
    memset(n, 0, sizeof *n);
    n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        err = dlerror();
        /* dlerror repeats the path; "No such file" for every soname is noise, keep it short */
        if (err && strstr(err, "No such file")) capex__cuda_append(tried, cap, " %s (not found);", path);
        else capex__cuda_append(tried, cap, " %s (%s);", path, err ? err : "?");
        return 0;
    }
#define CAPEX__NV(name) do { CAPEX__CUDA_SYM(n->lib, n->name, #name); if (!n->name && !missing) missing = #name; } while (0)
    CAPEX__NV(nvrtcGetErrorString); CAPEX__NV(nvrtcVersion); CAPEX__NV(nvrtcGetNumSupportedArchs);
    CAPEX__NV(nvrtcGetSupportedArchs); CAPEX__NV(nvrtcCreateProgram); CAPEX__NV(nvrtcDestroyProgram);
    CAPEX__NV(nvrtcCompileProgram); CAPEX__NV(nvrtcGetPTXSize); CAPEX__NV(nvrtcGetPTX);
    CAPEX__NV(nvrtcGetCUBINSize); CAPEX__NV(nvrtcGetCUBIN); CAPEX__NV(nvrtcGetProgramLogSize);
    CAPEX__NV(nvrtcGetProgramLog);
#undef CAPEX__NV
    if (missing) {
        capex__cuda_append(tried, cap, " %s (lacks %s: older than NVRTC 11.2);", path, missing);
    } else if (n->nvrtcVersion(&n->major, &n->minor) != 0 || n->major <= 0) {
        capex__cuda_append(tried, cap, " %s (nvrtcVersion failed);", path);
    } else if (n->nvrtcGetNumSupportedArchs(&n->n_archs) != 0 || n->n_archs <= 0 ||
               n->n_archs > (int)(sizeof n->archs / sizeof n->archs[0]) || n->nvrtcGetSupportedArchs(n->archs) != 0) {
        capex__cuda_append(tried, cap, " %s (NVRTC %d.%d could not list its architectures);", path, n->major, n->minor);
    } else {
        capex__cuda_fmt(n->path, sizeof n->path, "%s", path);
        return 1;
    }
    dlclose(n->lib);
    memset(n, 0, sizeof *n);
    return 0;
}

/* The pass (0 or 1) in which soname is tried: 0 when the loaded driver's CUDA
   major (drv_major, 0: none loaded) is known to run its code; the unversioned
   name ("libnvrtc.so", major unknown) and newer majors wait for pass 1. */
CAPEX__PRIVATE int capex__cuda_nv_pass(const char *soname, int drv_major) {
    int major = strlen(soname) > 12 ? atoi(soname + 12) : 0; /* "libnvrtc.so.13" -> 13 */
    return drv_major && major > 0 && major <= drv_major ? 0 : 1;
}

/* Search order: CAPEX_NVRTC_PATH alone when set; else the sonames (the loader
   path), then libnvrtc.so.* files in $CUDA_HOME/lib64, $CUDA_PATH/lib64 and the
   usual toolkit directories. With the driver loaded, a first pass takes only
   candidates whose CUDA major is no newer than the driver's (a driver cannot
   load CUBIN or PTX from a newer major), wherever they are; the second takes
   the rest. A candidate that opens but is unusable does not end the search. */
CAPEX__PRIVATE void capex__cuda_nv_load(void) {
    static const char *sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
    static const char *dirs[] = {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                                 "/usr/local/cuda/targets/sbsa-linux/lib", "/opt/cuda/lib64"};
    enum { n_sonames = sizeof sonames / sizeof sonames[0], n_dirs = 2 + sizeof dirs / sizeof dirs[0] };
    capex__cuda_nvrtc_lib *n = &capex__cuda_nv;
    const char *over = getenv("CAPEX_NVRTC_PATH");
    char tried[700], dir_tried[n_dirs];
    int drv_major = CAPEX__ATOMIC_LOAD_INT(&capex__cuda_drv_version_seen) / 1000, pass, found = 0;
    size_t i, j;
    tried[0] = '\0';
    memset(dir_tried, 0, sizeof dir_tried);
    if (over && over[0]) {
        if (capex__cuda_nv_try(n, over, tried, sizeof tried)) {
            n->status = CAPEX_OK;
            CAPEX__ATOMIC_STORE_INT(&capex__cuda_nv_loaded, 1);
            return;
        }
        n->status = CAPEX_ERR_NO_NVRTC;
        capex__cuda_fmt(n->message, sizeof n->message,
                 "NVRTC not usable from CAPEX_NVRTC_PATH:%s point it at a libnvrtc.so.* (CUDA 11.2+), "
                 "or unset it to search the usual sonames and toolkit directories", tried);
        return;
    }
    for (pass = drv_major ? 0 : 1; !found && pass < 2; pass++) {
        for (i = 0; !found && i < n_sonames; i++)
            if (capex__cuda_nv_pass(sonames[i], drv_major) == pass) found = capex__cuda_nv_try(n, sonames[i], tried, sizeof tried);
        /* toolkits installed without ldconfig entries */
        for (j = 0; !found && j < n_dirs; j++) {
            char dir[512], path[640];
            const char *env = j == 0 ? getenv("CUDA_HOME") : j == 1 ? getenv("CUDA_PATH") : NULL;
            int any = 0;
            if (j < 2) {
                if (!env || !env[0]) continue;
                capex__cuda_fmt(dir, sizeof dir, "%s/lib64", env);
            } else {
                capex__cuda_fmt(dir, sizeof dir, "%s", dirs[j - 2]);
            }
            for (i = 0; !found && i + 1 < n_sonames; i++) {
                struct stat st;
                if (capex__cuda_nv_pass(sonames[i], drv_major) != pass) continue;
                capex__cuda_fmt(path, sizeof path, "%s/%s", dir, sonames[i]);
                if (stat(path, &st) != 0) continue; /* do not list every absent file */
                any = 1;
                found = capex__cuda_nv_try(n, path, tried, sizeof tried);
            }
            if (!found && !any && pass == 1 && !dir_tried[j]) capex__cuda_append(tried, sizeof tried, " %s/ (no libnvrtc);", dir);
            dir_tried[j] |= (char)any;
        }
    }
    if (!found) {
        n->status = CAPEX_ERR_NO_NVRTC;
        capex__cuda_fmt(n->message, sizeof n->message,
                 "no usable NVRTC (the CUDA runtime compiler); tried:%s install the CUDA toolkit's NVRTC "
                 "(apt: cuda-nvrtc-13-0, pip: nvidia-cuda-nvrtc) and set CAPEX_NVRTC_PATH to its "
                 "libnvrtc.so.* if it is not on the loader path", tried);
        return;
    }
    n->status = CAPEX_OK;
    CAPEX__ATOMIC_STORE_INT(&capex__cuda_nv_loaded, 1);
}

CAPEX__PRIVATE capex__cuda_nvrtc_lib *capex__cuda_nvrtc(capex_result *res) {
    pthread_once(&capex__cuda_nv_once, capex__cuda_nv_load);
    if (capex__cuda_nv.status != CAPEX_OK) {
        *res = capex__fail(capex__cuda_nv.status, "%s", capex__cuda_nv.message);
        return NULL;
    }
    *res = CAPEX_OK;
    return &capex__cuda_nv;
}

/* ---- NCCL, loaded once (the communicator section looks its symbols up) -- */

typedef struct capex__cuda_nccl_lib {
    void *lib;
    capex_result status;
    char message[900];
    int version;
} capex__cuda_nccl_lib;

static capex__cuda_nccl_lib capex__cuda_nccl;
static pthread_once_t capex__cuda_nccl_once = PTHREAD_ONCE_INIT;

CAPEX__PRIVATE void capex__cuda_nccl_load(void) {
    capex__cuda_nccl_lib *c = &capex__cuda_nccl;
    const char *over = getenv("CAPEX_NCCL_PATH");
    const char *path = over && over[0] ? over : "libnccl.so.2";
    int (*get_version)(int *) = NULL;
    c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
        const char *err = dlerror();
        c->status = CAPEX_ERR_NO_NCCL;
        capex__cuda_fmt(c->message, sizeof c->message,
                 "NCCL not found: tried %s%s (%s). Install NCCL (apt: libnccl2, pip: nvidia-nccl-cu12) "
                 "or set CAPEX_NCCL_PATH to its libnccl.so.2; single-GPU and MPI training do not need it",
                 path, over && over[0] ? " from CAPEX_NCCL_PATH" : "", err ? err : "unknown dlerror");
        return;
    }
    CAPEX__CUDA_SYM(c->lib, get_version, "ncclGetVersion");
    if (!get_version || get_version(&c->version) != 0) {
        c->status = CAPEX_ERR_NO_NCCL;
        capex__cuda_fmt(c->message, sizeof c->message, "%s has no working ncclGetVersion: not an NCCL library", path);
        dlclose(c->lib);
        c->lib = NULL;
        return;
    }
    c->status = CAPEX_OK;
}

/* An NCCL symbol (NULL with the failure recorded in *res). Thread-safe. */
CAPEX__PRIVATE void *capex__cuda_nccl_sym(const char *name, capex_result *res) {
    void *p;
    pthread_once(&capex__cuda_nccl_once, capex__cuda_nccl_load);
    if (capex__cuda_nccl.status != CAPEX_OK) {
        *res = capex__fail(capex__cuda_nccl.status, "%s", capex__cuda_nccl.message);
        return NULL;
    }
    p = dlsym(capex__cuda_nccl.lib, name);
    *res = p ? CAPEX_OK : capex__fail(CAPEX_ERR_NO_NCCL, "NCCL %d lacks %s: install a newer NCCL", capex__cuda_nccl.version, name);
    return p;
}

/* ---- versions ------------------------------------------------------------- */

CAPEX_API capex_result capex_cuda_driver_version(int *version) {
    capex_result r;
    capex__cuda_driver_lib *d;
    if (!version) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_driver_version: version is NULL");
    *version = 0;
    d = capex__cuda_driver(&r);
    if (!d) {
        /* the driver answers its version even when cuInit found no GPU */
        if (r == CAPEX_ERR_NO_DEVICE && capex__cuda_drv.cuDriverGetVersion) capex__cuda_drv.cuDriverGetVersion(version);
        return r;
    }
    *version = d->version;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_nvrtc_version(int *major, int *minor) {
    capex_result r;
    capex__cuda_nvrtc_lib *n;
    if (!major || !minor) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_version: NULL argument");
    *major = *minor = 0;
    n = capex__cuda_nvrtc(&r);
    if (!n) return r;
    *major = n->major;
    *minor = n->minor;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_nvrtc_supported_archs(int *archs, int capacity, int *count) {
    capex_result r;
    capex__cuda_nvrtc_lib *n;
    int i;
    if (!count || (capacity > 0 && !archs) || capacity < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_supported_archs: NULL argument or negative capacity");
    *count = 0;
    n = capex__cuda_nvrtc(&r);
    if (!n) return r;
    *count = n->n_archs;
    for (i = 0; i < n->n_archs && i < capacity; i++) archs[i] = n->archs[i];
    if (capacity < n->n_archs)
        return capex__fail(CAPEX_ERR_LIMIT, "capex_cuda_nvrtc_supported_archs: NVRTC lists %d archs, capacity is %d",
                           n->n_archs, capacity);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_nccl_version(int *version) {
    capex_result r;
    if (!version) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nccl_version: version is NULL");
    *version = 0;
    if (!capex__cuda_nccl_sym("ncclGetVersion", &r)) return r;
    *version = capex__cuda_nccl.version;
    return CAPEX_OK;
}

CAPEX_API const char *capex_cuda_nvrtc_path(void) { return CAPEX__ATOMIC_LOAD_INT(&capex__cuda_nv_loaded) ? capex__cuda_nv.path : ""; }
CAPEX_API int capex_cuda_nvrtc_is_loaded(void) { return CAPEX__ATOMIC_LOAD_INT(&capex__cuda_nv_loaded); }

/* ---- devices -------------------------------------------------------------- */

CAPEX_API capex_result capex_cuda_device_count(int *n) {
    capex_result r;
    if (!n) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_device_count: n is NULL");
    *n = 0;
    if (!capex__cuda_driver(&r)) return r;
    CAPEX__CU(cuDeviceGetCount, (n), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_device_get_info(int ordinal, capex_cuda_device_info *info) {
    capex_result r;
    int n = 0, dev = 0;
    if (!info) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_device_get_info: info is NULL");
    memset(info, 0, sizeof *info);
    if (ordinal < 0) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_device_get_info: ordinal %d (GPUs count from 0)", ordinal);
    if ((r = capex_cuda_device_count(&n)) != CAPEX_OK) return r;
    if (ordinal >= n)
        return capex__fail(CAPEX_ERR_NO_DEVICE, "GPU %d requested but %d visible (check CUDA_VISIBLE_DEVICES)", ordinal, n);
    CAPEX__CU(cuDeviceGet, (&dev, ordinal), "");
    info->ordinal = ordinal;
    CAPEX__CU(cuDeviceGetName, (info->name, (int)sizeof info->name, dev), "");
    CAPEX__CU(cuDeviceGetAttribute, (&info->cc_major, 75, dev), "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR");
    CAPEX__CU(cuDeviceGetAttribute, (&info->cc_minor, 76, dev), "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR");
    CAPEX__CU(cuDeviceGetAttribute, (&info->sm_count, 16, dev), "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT");
    CAPEX__CU(cuDeviceTotalMem_v2, (&info->total_bytes, dev), "");
    /* memory clock (36) and bus width (37) are informational: absent on some drivers */
    if (capex__cuda_drv.cuDeviceGetAttribute(&info->mem_clock_khz, 36, dev) != 0) info->mem_clock_khz = 0;
    if (capex__cuda_drv.cuDeviceGetAttribute(&info->bus_width_bits, 37, dev) != 0) info->bus_width_bits = 0;
    /* double data rate: 2 transfers per clock, bus width in bits */
    info->peak_bandwidth_gbs = 2.0 * info->mem_clock_khz * 1e3 * (info->bus_width_bits / 8.0) / 1e9;
    return CAPEX_OK;
}

/* ---- arch selection ---------------------------------------------------------- */

CAPEX_API capex_result capex_cuda_select_target(const int *supported, int n_supported, int device_cc,
                                                capex_cuda_target *out) {
    int i, lowest = 0, below = 0;
    if (!out || (n_supported > 0 && !supported) || n_supported < 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_select_target: NULL argument or negative count");
    out->kind = CAPEX_CUDA_IMAGE_CUBIN;
    out->arch = 0;
    if (device_cc <= 0) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_select_target: device_cc %d (want e.g. 90 for sm_90)", device_cc);
    if (n_supported == 0) return capex__fail(CAPEX_ERR_ARCH, "NVRTC lists no supported architectures");
    for (i = 0; i < n_supported; i++) {
        if (supported[i] == device_cc) {
            out->arch = device_cc;
            return CAPEX_OK;
        }
        if (!lowest || supported[i] < lowest) lowest = supported[i];
        if (supported[i] < device_cc && supported[i] > below) below = supported[i];
    }
    if (below) {
        /* newer GPU than this NVRTC knows: PTX for the best older arch, JIT-finished by the driver */
        out->kind = CAPEX_CUDA_IMAGE_PTX;
        out->arch = below;
        return CAPEX_OK;
    }
    return capex__fail(CAPEX_ERR_ARCH,
                       "GPU sm_%d is older than the oldest architecture this NVRTC supports (sm_%d): use an older "
                       "CUDA toolkit's NVRTC (CAPEX_NVRTC_PATH; CUDA 12 supports sm_50+) or a newer GPU",
                       device_cc, lowest);
}

/* ---- images and the NVRTC compile ---------------------------------------- */

CAPEX_API void capex_cuda_image_free(capex_cuda_image *image) {
    if (!image) return;
    CAPEX_FREE(image->data);
    memset(image, 0, sizeof *image);
}

CAPEX__PRIVATE const char *capex__cuda_nvrtc_err(capex__cuda_nvrtc_lib *n, capex__nvrtcResult r) {
    const char *s = n->nvrtcGetErrorString ? n->nvrtcGetErrorString(r) : NULL;
    return s ? s : "NVRTC_ERROR_UNKNOWN";
}

/* NVRTC parses numbers with the C library, so LC_NUMERIC must be "C" while it
   compiles. The switch is made per thread (uselocale, POSIX 2008): concurrent
   compiles and the program's other threads never see it, and a thread's own
   uselocale() locale is honoured. Where <locale.h> does not declare uselocale
   (strict C99 with a system header included before capex), the process locale
   is switched under a lock with a count of compiles in flight: the first one
   switches, the last one restores (other threads must not change locales then). */
#ifdef LC_NUMERIC_MASK
typedef struct capex__cuda_c_numeric { locale_t c, old; } capex__cuda_c_numeric;
CAPEX__PRIVATE void capex__cuda_c_numeric_enter(capex__cuda_c_numeric *l) {
    locale_t base = duplocale(uselocale((locale_t)0)); /* this thread's locale, other categories kept */
    l->c = base ? newlocale(LC_NUMERIC_MASK, "C", base) : (locale_t)0;
    if (!l->c) {
        if (base) freelocale(base);
        l->c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    }
    l->old = l->c ? uselocale(l->c) : (locale_t)0;
}
CAPEX__PRIVATE void capex__cuda_c_numeric_leave(capex__cuda_c_numeric *l) {
    if (!l->c) return;
    uselocale(l->old);
    freelocale(l->c);
}
CAPEX__PRIVATE int capex__cuda_c_numeric_per_thread(void) { return 1; }
#else
typedef struct capex__cuda_c_numeric { int unused; } capex__cuda_c_numeric;
static pthread_mutex_t capex__cuda_locale_lock = PTHREAD_MUTEX_INITIALIZER;
static int capex__cuda_locale_users, capex__cuda_locale_switched;
static char capex__cuda_locale_saved[128];
CAPEX__PRIVATE void capex__cuda_c_numeric_enter(capex__cuda_c_numeric *l) {
    (void)l;
    pthread_mutex_lock(&capex__cuda_locale_lock);
    if (capex__cuda_locale_users++ == 0) {
        const char *cur = setlocale(LC_NUMERIC, NULL);
        capex__cuda_locale_switched = 0;
        if (cur && strcmp(cur, "C") != 0 && strlen(cur) < sizeof capex__cuda_locale_saved) {
            memcpy(capex__cuda_locale_saved, cur, strlen(cur) + 1); /* copied under the lock: setlocale frees it */
            capex__cuda_locale_switched = setlocale(LC_NUMERIC, "C") != NULL;
        }
    }
    pthread_mutex_unlock(&capex__cuda_locale_lock);
}
CAPEX__PRIVATE void capex__cuda_c_numeric_leave(capex__cuda_c_numeric *l) {
    (void)l;
    pthread_mutex_lock(&capex__cuda_locale_lock);
    if (--capex__cuda_locale_users == 0 && capex__cuda_locale_switched) {
        setlocale(LC_NUMERIC, capex__cuda_locale_saved);
        capex__cuda_locale_switched = 0;
    }
    pthread_mutex_unlock(&capex__cuda_locale_lock);
}
CAPEX__PRIVATE int capex__cuda_c_numeric_per_thread(void) { return 0; }
#endif

/* 1 on a thread whose last NVRTC compile failed in the source itself
   (NVRTC_ERROR_COMPILATION): the same source fails the same way in every
   process, so the disk cache's waiters take that outcome (capex__cuda_compile_ex);
   other failures (no memory, ...) may be transient. */
static CAPEX__THREAD_LOCAL int capex__cuda_source_error;

CAPEX_API capex_result capex_cuda_nvrtc_compile(const char *source, const char *name, const char *const *options,
                                                int n_options, capex_cuda_target target, capex_cuda_image *out) {
    capex_result r;
    capex__cuda_nvrtc_lib *n;
    void *prog = NULL;
    const char **opts;
    char arch_opt[32], optlist[400];
    capex__cuda_c_numeric numeric;
    int i;
    capex__nvrtcResult nr;
    size_t size = 0;
    capex__cuda_source_error = 0;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_compile: out is NULL");
    memset(out, 0, sizeof *out);
    if (!source || n_options < 0 || (n_options > 0 && !options))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_compile: NULL source, or options NULL with n_options %d", n_options);
    for (i = 0; i < n_options; i++)
        if (!options[i]) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_compile: options[%d] is NULL", i);
    if ((target.kind != CAPEX_CUDA_IMAGE_CUBIN && target.kind != CAPEX_CUDA_IMAGE_PTX) || target.arch <= 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_nvrtc_compile: invalid target (kind %d, arch %d)", (int)target.kind, target.arch);
    if (!name || !name[0]) name = "capex_program";
    n = capex__cuda_nvrtc(&r);
    if (!n) return r;
    opts = (const char **)CAPEX_MALLOC(sizeof(char *) * (size_t)(n_options + 1));
    if (!opts) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_nvrtc_compile: out of memory");
    capex__cuda_fmt(arch_opt, sizeof arch_opt, "-arch=%s_%d", target.kind == CAPEX_CUDA_IMAGE_CUBIN ? "sm" : "compute", target.arch);
    for (i = 0; i < n_options; i++) opts[i] = options[i];
    opts[n_options] = arch_opt;
    optlist[0] = '\0';
    for (i = 0; i <= n_options; i++) capex__cuda_append(optlist, sizeof optlist, "%s%s", i ? " " : "", opts[i]);
    if (strlen(optlist) + 1 == sizeof optlist) memcpy(optlist + sizeof optlist - 4, "...", 4); /* cut: say so */

    capex__cuda_c_numeric_enter(&numeric); /* a decimal-comma LC_NUMERIC breaks NVRTC */
    nr = n->nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (nr != 0) {
        r = capex__fail(CAPEX_ERR_NVRTC, "nvrtcCreateProgram('%s') failed: %s", name, capex__cuda_nvrtc_err(n, nr));
        goto done;
    }
    nr = n->nvrtcCompileProgram(prog, n_options + 1, opts);
    if (nr != 0) {
        size_t log_size = 0;
        char *log = NULL;
        if (n->nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 0) {
            log = (char *)CAPEX_MALLOC(log_size + 1);
            if (log && n->nvrtcGetProgramLog(prog, log) == 0) log[log_size] = '\0';
            else if (log) log[0] = '\0';
        }
        capex__cuda_source_error = nr == 6; /* NVRTC_ERROR_COMPILATION */
        /* options first: a long log is cut at the end of the message, they are not */
        r = capex__fail(CAPEX_ERR_NVRTC, "NVRTC %d.%d could not compile '%s' (%s): %s\noptions: %s\nlog:\n%s",
                        n->major, n->minor, name, arch_opt, capex__cuda_nvrtc_err(n, nr), optlist, log ? log : "(no log)");
        CAPEX_FREE(log);
        goto done;
    }
    if (target.kind == CAPEX_CUDA_IMAGE_CUBIN) nr = n->nvrtcGetCUBINSize(prog, &size);
    else nr = n->nvrtcGetPTXSize(prog, &size);
    if (nr != 0 || size == 0) {
        r = capex__fail(CAPEX_ERR_NVRTC, "NVRTC produced no %s for '%s' (%s): %s", target.kind == CAPEX_CUDA_IMAGE_CUBIN ? "CUBIN" : "PTX",
                        name, arch_opt, capex__cuda_nvrtc_err(n, nr));
        goto done;
    }
    out->data = CAPEX_MALLOC(size);
    if (!out->data) {
        r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_nvrtc_compile: %zu bytes for the image", size);
        goto done;
    }
    nr = target.kind == CAPEX_CUDA_IMAGE_CUBIN ? n->nvrtcGetCUBIN(prog, (char *)out->data) : n->nvrtcGetPTX(prog, (char *)out->data);
    if (nr != 0) {
        CAPEX_FREE(out->data);
        out->data = NULL;
        r = capex__fail(CAPEX_ERR_NVRTC, "NVRTC could not return the image of '%s': %s", name, capex__cuda_nvrtc_err(n, nr));
        goto done;
    }
    out->size = size;
    out->kind = target.kind;
    out->arch = target.arch;
    out->nvrtc_version = n->major * 1000 + n->minor * 10;
    r = CAPEX_OK;
done:
    if (prog) n->nvrtcDestroyProgram(&prog);
    capex__cuda_c_numeric_leave(&numeric);
    CAPEX_FREE((void *)opts);
    return r;
}

/* ---- the disk cache ---------------------------------------------------------- */

#define CAPEX__CACHE_FORMAT 1u
#define CAPEX__CACHE_HEADER 96
/* Larger images are not stored: a bad header then costs at most this much memory
   and hashing (1 GiB took 15 s), while NVRTC output stays far below it. */
#define CAPEX__CACHE_MAX_PAYLOAD ((uint64_t)256 << 20)
static const char capex__cache_magic[8] = {'C', 'A', 'P', 'E', 'X', 'J', 'I', 'T'};

#define CAPEX__TAG_CUDA_CACHE CAPEX__TAG('C', 'C', 'H', 'E')
CAPEX_API void capex_cuda_cache_init(capex_cuda_cache *cache, const char *dir) {
    const char *env, *base = "", *tail = "";
    int len;
    if (!cache) return;
    memset(cache, 0, sizeof *cache);
    cache->init_tag = CAPEX__TAG_CUDA_CACHE;
    if (dir) {
        base = dir;
    } else if ((env = getenv("CAPEX_CACHE_DIR")) != NULL) {
        base = env;  /* set but empty: disabled */
    } else if ((env = getenv("XDG_CACHE_HOME")) != NULL && env[0] == '/') {
        base = env, tail = "/capex";
    } else if ((env = getenv("HOME")) != NULL && env[0] == '/') { /* a relative one would follow the working directory */
        base = env, tail = "/.cache/capex";
    } else {
        capex_log(CAPEX_LOG_WARN, "no kernel cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path: "
                  "running without the disk cache (every process compiles its kernels; set CAPEX_CACHE_DIR)");
    }
    len = snprintf(cache->dir, sizeof cache->dir, "%s%s", base, tail);
    if (len < 0 || (size_t)len >= sizeof cache->dir) {
        /* a cut path would put entries in some other directory */
        capex_log(CAPEX_LOG_WARN, "kernel cache directory %.60s... is longer than %d bytes: running without the disk cache "
                  "(set CAPEX_CACHE_DIR to a shorter path)", base, (int)sizeof cache->dir - 1);
        cache->dir[0] = '\0';
        cache->warned = 1;
    }
    cache->enabled = cache->dir[0] != '\0';
}

/* Key of a compile request: every input that changes the produced code, except
   the NVRTC that will make it (recorded in the entry instead, see the manual). */
CAPEX__PRIVATE void capex__cuda_cache_key(const char *source, const char *name, const char *const *options,
                                          int n_options, int device_cc, unsigned char key[32]) {
    capex__sha256 s;
    int i;
    capex__sha256_init(&s);
    capex__sha256_str(&s, "capex-jit-key");
    capex__sha256_u64(&s, CAPEX__CACHE_FORMAT);
    capex__sha256_u64(&s, (uint64_t)(int64_t)device_cc);
    capex__sha256_str(&s, name && name[0] ? name : "capex_program"); /* the name every compile gives NVRTC */
    capex__sha256_u64(&s, (uint64_t)n_options);
    for (i = 0; i < n_options; i++) capex__sha256_str(&s, options[i]);
    capex__sha256_str(&s, source);
    capex__sha256_final(&s, key);
}

/* The entry's file name in the cache directory: hex(key).capexjit */
CAPEX__PRIVATE void capex__cuda_cache_name(const unsigned char key[32], char *buf, size_t cap) {
    char hex[65];
    int i;
    for (i = 0; i < 32; i++) {
        static const char digits[] = "0123456789abcdef";
        hex[2 * i] = digits[key[i] >> 4];
        hex[2 * i + 1] = digits[key[i] & 15];
    }
    hex[64] = '\0';
    capex__cuda_fmt(buf, cap, "%s.capexjit", hex);
}

CAPEX__PRIVATE void capex__cuda_cache_path(const capex_cuda_cache *c, const unsigned char key[32], char *buf, size_t cap) {
    char name[100];
    capex__cuda_cache_name(key, name, sizeof name);
    capex__cuda_fmt(buf, cap, "%s/%s", c->dir, name);
}

CAPEX__PRIVATE void capex__put_u32(unsigned char *p, uint32_t v) {
    int i;
    for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
CAPEX__PRIVATE void capex__put_u64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
CAPEX__PRIVATE uint32_t capex__get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
CAPEX__PRIVATE uint64_t capex__get_u64(const unsigned char *p) {
    return (uint64_t)capex__get_u32(p) | (uint64_t)capex__get_u32(p + 4) << 32;
}

/* Entry layout (little-endian): magic[8] | u32 format | u32 kind | u32 arch |
   u32 nvrtc version | u64 payload size | key[32] | sha256(header[0..64) || payload)[32] | payload */
CAPEX__PRIVATE void capex__cuda_cache_header(unsigned char h[CAPEX__CACHE_HEADER], const unsigned char key[32],
                                             const capex_cuda_image *img) {
    capex__sha256 s;
    memcpy(h, capex__cache_magic, 8);
    capex__put_u32(h + 8, CAPEX__CACHE_FORMAT);
    capex__put_u32(h + 12, (uint32_t)img->kind);
    capex__put_u32(h + 16, (uint32_t)img->arch);
    capex__put_u32(h + 20, (uint32_t)img->nvrtc_version);
    capex__put_u64(h + 24, (uint64_t)img->size);
    memcpy(h + 32, key, 32);
    capex__sha256_init(&s);
    capex__sha256_update(&s, h, 64);
    capex__sha256_update(&s, img->data, img->size);
    capex__sha256_final(&s, h + 64);
}

/* Checks an entry's header against the key and the entry's total size, before
   anything of the payload size is allocated or read. *size: the payload bytes. */
CAPEX__PRIVATE capex_result capex__cuda_cache_check_header(const unsigned char h[CAPEX__CACHE_HEADER], uint64_t total,
                                                           const unsigned char key[32], const char *path,
                                                           uint64_t *size) {
    uint32_t kind;
    if (memcmp(h, capex__cache_magic, 8) != 0)
        return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is not a capex JIT entry (bad magic)", path);
    if (capex__get_u32(h + 8) != CAPEX__CACHE_FORMAT)
        return capex__fail(CAPEX_ERR_VERSION, "cache entry %s has format %u, this capex writes %u", path,
                           (unsigned)capex__get_u32(h + 8), (unsigned)CAPEX__CACHE_FORMAT);
    kind = capex__get_u32(h + 12);
    *size = capex__get_u64(h + 24);
    if ((kind != CAPEX_CUDA_IMAGE_CUBIN && kind != CAPEX_CUDA_IMAGE_PTX) || *size == 0 || *size > CAPEX__CACHE_MAX_PAYLOAD)
        return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s has a bad kind or size", path);
    if (memcmp(h + 32, key, 32) != 0) return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s belongs to another key", path);
    if (total != CAPEX__CACHE_HEADER + *size)
        return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is truncated or has trailing bytes", path);
    return CAPEX_OK;
}

/* Verifies the checksum over header and payload and fills out, which takes the
   payload; frees it when refused. */
CAPEX__PRIVATE capex_result capex__cuda_cache_accept(const unsigned char h[CAPEX__CACHE_HEADER], void *payload,
                                                     uint64_t size, const char *path, capex_cuda_image *out) {
    unsigned char sum[32];
    capex__sha256 s;
    uint32_t kind = capex__get_u32(h + 12);
    capex__sha256_init(&s);
    capex__sha256_update(&s, h, 64);
    capex__sha256_update(&s, payload, (size_t)size);
    capex__sha256_final(&s, sum);
    if (memcmp(sum, h + 64, 32) != 0) {
        CAPEX_FREE(payload);
        return capex__fail(CAPEX_ERR_CHECKSUM, "cache entry %s fails its checksum", path);
    }
    if (kind == CAPEX_CUDA_IMAGE_PTX && ((const char *)payload)[size - 1] != '\0') {
        CAPEX_FREE(payload);
        return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s: PTX not NUL-terminated", path);
    }
    out->data = payload;
    out->kind = (capex_cuda_image_kind)kind;
    out->arch = (int)capex__get_u32(h + 16);
    out->nvrtc_version = (int)capex__get_u32(h + 20);
    out->size = (size_t)size;
    out->from_cache = 1;
    return CAPEX_OK;
}

/* An entry's bytes, read whole, to an image: the reader's checks without the
   file (the fuzz target's entry point, tests/fuzz_cache_entry.c). */
CAPEX__PRIVATE capex_result capex__cuda_cache_parse(const unsigned char *bytes, size_t len, const unsigned char key[32],
                                                    const char *path, capex_cuda_image *out) {
    uint64_t size;
    void *payload;
    capex_result r;
    memset(out, 0, sizeof *out);
    if (len < CAPEX__CACHE_HEADER) return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is truncated (short header)", path);
    if ((r = capex__cuda_cache_check_header(bytes, (uint64_t)len, key, path, &size)) != CAPEX_OK) return r;
    if (!(payload = CAPEX_MALLOC((size_t)size))) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "cache entry %s: out of memory", path);
    memcpy(payload, bytes + CAPEX__CACHE_HEADER, (size_t)size);
    return capex__cuda_cache_accept(bytes, payload, size, path, out);
}

/* O_NOFOLLOW, O_CLOEXEC, O_DIRECTORY and O_PATH are POSIX 2008 or Linux,
   hidden under strict C99 when a system header came before capex; glibc
   still offers them as __O_*. */
#if defined(O_NOFOLLOW)
#  define CAPEX__O_NOFOLLOW O_NOFOLLOW
#elif defined(__O_NOFOLLOW)
#  define CAPEX__O_NOFOLLOW __O_NOFOLLOW
#endif
/* The sticky bit is XSI, hidden under a plain _POSIX_C_SOURCE; its value is fixed everywhere. */
#ifdef S_ISVTX
#  define CAPEX__S_ISVTX S_ISVTX
#else
#  define CAPEX__S_ISVTX 01000
#endif
#if defined(O_CLOEXEC)
#  define CAPEX__O_CLOEXEC O_CLOEXEC
#elif defined(__O_CLOEXEC)
#  define CAPEX__O_CLOEXEC __O_CLOEXEC
#else
#  define CAPEX__O_CLOEXEC 0
#endif
#if defined(O_DIRECTORY)
#  define CAPEX__O_DIRECTORY O_DIRECTORY
#elif defined(__O_DIRECTORY)
#  define CAPEX__O_DIRECTORY __O_DIRECTORY
#endif
/* Directories on the way to the cache are opened only to search them: O_PATH
   needs no read permission (a 0711 /home), where there is one. */
#if defined(O_PATH)
#  define CAPEX__O_SEARCH O_PATH
#elif defined(__O_PATH)
#  define CAPEX__O_SEARCH __O_PATH
#elif defined(O_SEARCH)
#  define CAPEX__O_SEARCH O_SEARCH
#else
#  define CAPEX__O_SEARCH O_RDONLY
#endif
/* The disk cache works on a descriptor of its directory (openat, fstatat,
   renameat, unlinkat, fdopendir: POSIX 2008), so that a path component
   swapped after the checks cannot redirect a read or a write. Strict C99 with
   a system header first hides them in glibc, which has them all (declared
   here then; not where a 32-bit build switches off_t to 64 bits, which renames fstatat).
   Without them the disk cache is off (CAPEX_ERR_CONFIG, one warning). */
#if defined(__GLIBC__) && !defined(__USE_ATFILE) && \
    (!defined(__USE_FILE_OFFSET64) || (defined(__WORDSIZE) && __WORDSIZE == 64))
extern int openat(int, const char *, int, ...);
extern int fstatat(int, const char *, struct stat *, int);
extern int mkdirat(int, const char *, mode_t);
extern int unlinkat(int, const char *, int);
extern int renameat(int, const char *, int, const char *);
extern DIR *fdopendir(int);
#  define CAPEX__AT_FDCWD (-100)
#  define CAPEX__AT_SYMLINK_NOFOLLOW 0x100
#  define CAPEX__CACHE_AT 1
#elif defined(AT_FDCWD) && defined(AT_SYMLINK_NOFOLLOW)
#  define CAPEX__AT_FDCWD AT_FDCWD
#  define CAPEX__AT_SYMLINK_NOFOLLOW AT_SYMLINK_NOFOLLOW
#  define CAPEX__CACHE_AT 1
#endif
#if defined(CAPEX__CACHE_AT) && (!defined(CAPEX__O_NOFOLLOW) || !defined(CAPEX__O_DIRECTORY))
#  undef CAPEX__CACHE_AT
#endif

/* Reads up to n bytes (fewer only at end of file or on an error). */
CAPEX__PRIVATE size_t capex__cuda_read_all(int fd, void *data, size_t n) {
    char *p = (char *)data;
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, p + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    return got;
}

/* A directory in which others than the user may rename or replace what it
   holds: writable by the world, or by a group other than the user's private
   one, without the sticky bit. The private group is told as useradd makes it
   (user private groups, where umask 002 makes group-writable directories):
   the user's effective group, numbered as the user. Its membership is not
   enumerated (that is NSS, an LDAP query on a cluster); an administrator who
   adds others to it gives them the user's files anyway. $HOME and the
   directories above it (looked up only here, for a group-writable one) are
   the system's: only world write counts there (as before, and as ssh, which
   stops at the home), so a home the system shares with a group (a
   container's group-0 home, a project's group home) does not turn the
   default location off. */
#ifdef CAPEX__CACHE_AT
typedef struct capex__cuda_dir_id { dev_t dev; ino_t ino; } capex__cuda_dir_id;
typedef struct capex__cuda_home { capex__cuda_dir_id id[64]; int n, known; } capex__cuda_home;
/* $HOME (when absolute) and the directories above it, up to cap; how many. */
CAPEX__PRIVATE int capex__cuda_home_chain(capex__cuda_dir_id *ids, int cap) {
    const char *home = getenv("HOME");
    struct stat st;
    int n = 0, fd, up;
    if (!home || home[0] != '/' || (fd = open(home, CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC)) < 0) return 0;
    while (n < cap && fstat(fd, &st) == 0 && !(n > 0 && ids[n - 1].dev == st.st_dev && ids[n - 1].ino == st.st_ino)) {
        ids[n].dev = st.st_dev, ids[n].ino = st.st_ino, n++;
        up = openat(fd, "..", CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC);
        close(fd);
        if ((fd = up) < 0) break;
    }
    if (fd >= 0) close(fd);
    return n;
}
CAPEX__PRIVATE int capex__cuda_dir_open_to_others(const struct stat *st, capex__cuda_home *home) {
    int i;
    if (st->st_mode & CAPEX__S_ISVTX) return 0;
    if (st->st_mode & S_IWOTH) return 1;
    if (!(st->st_mode & S_IWGRP) || (st->st_gid == getegid() && (uid_t)st->st_gid == geteuid())) return 0;
    if (!home->known) home->n = capex__cuda_home_chain(home->id, 64), home->known = 1; /* only here: rare */
    for (i = 0; i < home->n; i++)
        if (home->id[i].dev == st->st_dev && home->id[i].ino == st->st_ino) return 0;
    return 1;
}
#endif

/* The trust rule for the disk cache, after OpenSSH's StrictModes (ccache has
   none): the checksum proves integrity, not authorship, so only entries that
   nobody but the user could have written are run. The directory must be
   owned by the effective user and not writable by group or others unless
   sticky. Owner and mode cannot tell an entry the user compiled from a file
   of the user's whose bytes someone else chose (a clone, an unpacked
   archive), so nobody else may point the path at another directory of the
   user's: a symlink on it must be the user's or root's (the kernel's
   fs.protected_symlinks rule; CAPEX_CACHE_DIR=/tmp/capex-$USER made first by
   someone else as a link), and no directory on the path or above the cache
   directory really (through links) may let others rename what it holds
   (capex__cuda_dir_open_to_others: world- or foreign-group-writable, not
   sticky; $HOME and above it: world write alone). The walk opens each
   component from the one before (openat, O_NOFOLLOW; a link is followed only
   once its owner passed), so what is checked is what is used: on success
   *out is a descriptor of the directory (O_PATH where there is one) that
   every read and write of the entries goes through. create: missing components are made, 0700. NOT_FOUND when the
   directory does not exist (and !create); CONFIG when it is not trusted, IO
   when it cannot be examined. */
CAPEX__PRIVATE capex_result capex__cuda_cache_open(const char *dir, int create, int *out) {
#ifdef CAPEX__CACHE_AT
    struct stat st, par;
    char buf[1024];
    size_t i = 0, n = strlen(dir);
    capex__cuda_home home;
    int fd, next, err, depth;
    *out = -1;
    home.n = home.known = 0;
    if (n == 0 || n >= sizeof buf) return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %.60s... is too long", dir);
    memcpy(buf, dir, n + 1);
    if ((fd = open(dir[0] == '/' ? "/" : ".", CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC)) < 0)
        return capex__fail(CAPEX_ERR_IO, "cannot use the kernel cache directory %s: %s", dir, strerror(errno));
    for (;;) {
        char *comp;
        int shown; /* length of the path of fd, the directory that holds comp */
        while (buf[i] == '/') i++;
        if (!buf[i]) break;
        comp = buf + i;
        for (shown = (int)i; shown > 1 && dir[shown - 1] == '/'; shown--) {}
        while (buf[i] && buf[i] != '/') i++;
        if (buf[i]) buf[i++] = '\0';
        /* fd's mode decides who may replace comp */
        if (fstat(fd, &par) != 0) {
            err = errno;
            close(fd);
            return capex__fail(CAPEX_ERR_IO, "cannot use the kernel cache directory %s: %s", dir, strerror(err));
        }
        if (capex__cuda_dir_open_to_others(&par, &home)) {
            close(fd);
            return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s: its parent %.*s is writable by others without "
                               "the sticky bit (mode %03o, group %ld): not trusted", dir, shown ? shown : 1,
                               shown ? dir : (dir[0] == '/' ? "/" : "."), (unsigned)(par.st_mode & 0777), (long)par.st_gid);
        }
        next = openat(fd, comp, CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_NOFOLLOW | CAPEX__O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, comp, 0700) != 0 && errno != EEXIST) {
                err = errno;
                close(fd);
                return capex__fail(CAPEX_ERR_IO, "cannot create the kernel cache directory %s: %s", dir, strerror(err));
            }
            next = openat(fd, comp, CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_NOFOLLOW | CAPEX__O_CLOEXEC);
        }
        if (next < 0 && errno != ENOENT && errno != EACCES) { /* ELOOP, ENOTDIR (O_PATH), EMLINK (BSD): a link? */
            if (fstatat(fd, comp, &st, CAPEX__AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
                if (st.st_uid != geteuid() && st.st_uid != 0) {
                    close(fd);
                    return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s: %.*s is a symlink owned by uid %ld, "
                                       "not by this user (uid %ld) or root: not trusted", dir, (int)(comp - buf + strlen(comp)),
                                       dir, (long)st.st_uid, (long)geteuid());
                }
                /* the user's or root's, in a directory others cannot change: only they can replace it */
                next = openat(fd, comp, CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC);
            } else {
                errno = ENOTDIR;
            }
        }
        err = errno;
        close(fd);
        if (next < 0) {
            if (err == ENOENT) return capex__fail(CAPEX_ERR_NOT_FOUND, "no kernel cache directory %s", dir);
            if (err == ENOTDIR) return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s is not a directory", dir);
            return capex__fail(CAPEX_ERR_IO, "cannot use the kernel cache directory %s: %s", dir, strerror(err));
        }
        fd = next;
    }
    if (fstat(fd, &st) != 0) {
        err = errno;
        close(fd);
        return capex__fail(CAPEX_ERR_IO, "cannot use the kernel cache directory %s: %s", dir, strerror(err));
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s is owned by uid %ld, not by this user (uid %ld): not trusted",
                           dir, (long)st.st_uid, (long)geteuid());
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & CAPEX__S_ISVTX)) {
        close(fd);
        return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s is writable by others (mode %03o): not trusted",
                           dir, (unsigned)(st.st_mode & 0777));
    }
    /* the parents it really has, from the descriptor (through links and from a relative dir) */
    {
        struct stat cur = st;
        int up = openat(fd, "..", CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC);
        for (depth = 1; up >= 0 && depth < 4096; depth++) {
            int above;
            if (fstat(up, &par) != 0 || (par.st_dev == cur.st_dev && par.st_ino == cur.st_ino)) break; /* "/" */
            if (capex__cuda_dir_open_to_others(&par, &home)) {
                close(up);
                close(fd);
                return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s: its parent %d levels up (really) is writable "
                                   "by others without the sticky bit (mode %03o, group %ld): not trusted", dir, depth,
                                   (unsigned)(par.st_mode & 0777), (long)par.st_gid);
            }
            cur = par;
            above = openat(up, "..", CAPEX__O_SEARCH | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC);
            close(up);
            up = above;
        }
        if (up >= 0) close(up);
    }
    *out = fd;
    return CAPEX_OK;
#else
    (void)create;
    *out = -1;
    return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s: this build has no openat (define _POSIX_C_SOURCE "
                       "200809L before any include)", dir);
#endif
}

/* The directory check alone (the test's and the warning's entry point). */
CAPEX__PRIVATE capex_result capex__cuda_cache_dir_check(const char *dir) {
    int fd;
    capex_result r = capex__cuda_cache_open(dir, 0, &fd);
    if (fd >= 0) close(fd);
    return r;
}

/* Reads and verifies the entry name in the directory dfd (shown: its path, for
   messages). CAPEX_ERR_NOT_FOUND when absent; FORMAT, VERSION, CHECKSUM,
   CONFIG (not trusted) or IO when present but unusable (the caller
   recompiles). Nothing blocks and no link is followed: a FIFO, device,
   directory or symlink at the path is refused at once; the header's length
   must match the file's size before the payload is allocated. */
CAPEX__PRIVATE capex_result capex__cuda_cache_read_at(int dfd, const char *name, const char *path, const unsigned char key[32],
                                                      capex_cuda_image *out) {
    unsigned char h[CAPEX__CACHE_HEADER];
    struct stat st;
    uint64_t size;
    capex_result r;
    void *payload;
    int fd;
    memset(out, 0, sizeof *out);
#ifdef CAPEX__CACHE_AT
    fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | CAPEX__O_NOFOLLOW | CAPEX__O_CLOEXEC);
#else
    (void)dfd;
    (void)name;
    fd = -1;
    errno = ENOSYS;
#endif
    if (fd < 0 && errno == ENOENT) return capex__fail(CAPEX_ERR_NOT_FOUND, "no cache entry %s", path);
    if (fd < 0) return capex__fail(CAPEX_ERR_IO, "cannot read the cache entry %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        r = capex__fail(CAPEX_ERR_IO, "cannot read the cache entry %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        r = capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is not a regular file", path);
    } else if (st.st_uid != geteuid()) {
        r = capex__fail(CAPEX_ERR_CONFIG, "cache entry %s is owned by uid %ld, not by this user (uid %ld): not trusted", path,
                        (long)st.st_uid, (long)geteuid());
    } else if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        r = capex__fail(CAPEX_ERR_CONFIG, "cache entry %s is writable by others (mode %03o): not trusted", path,
                        (unsigned)(st.st_mode & 0777));
    } else if (st.st_nlink > 1) {
        /* entries are written once and renamed, so one link (0 once a writer has
           renamed over the one opened); another name may be someone else's (a
           file of the user's that another user hard-linked into a sticky shared
           directory) */
        r = capex__fail(CAPEX_ERR_CONFIG, "cache entry %s has %ld links (capex writes 1): not trusted", path,
                        (long)st.st_nlink);
    } else if (st.st_size < CAPEX__CACHE_HEADER || capex__cuda_read_all(fd, h, sizeof h) != sizeof h) {
        r = capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is truncated (short header)", path);
    } else {
        r = capex__cuda_cache_check_header(h, (uint64_t)st.st_size, key, path, &size);
    }
    if (r != CAPEX_OK) {
        close(fd);
        return r;
    }
    if (!(payload = CAPEX_MALLOC((size_t)size))) {
        close(fd);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "cache entry %s: out of memory", path);
    }
    if (capex__cuda_read_all(fd, payload, (size_t)size) != (size_t)size) {
        close(fd);
        CAPEX_FREE(payload);
        return capex__fail(CAPEX_ERR_FORMAT, "cache entry %s is truncated", path);
    }
    close(fd);
    return capex__cuda_cache_accept(h, payload, size, path, out);
}

/* An entry by its path (the directory not checked; tests and the fuzzer). */
CAPEX__PRIVATE capex_result capex__cuda_cache_read(const char *path, const unsigned char key[32], capex_cuda_image *out) {
#ifdef CAPEX__CACHE_AT
    return capex__cuda_cache_read_at(CAPEX__AT_FDCWD, path, path, key, out);
#else
    return capex__cuda_cache_read_at(-1, path, path, key, out);
#endif
}

CAPEX__PRIVATE int capex__cuda_write_all(int fd, const void *data, size_t n) {
    const char *p = (const char *)data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- per-entry compile lock ---------------------------------------------------
   The ranks of a node that miss the same entry would each compile it (50-330
   ms of CPU a part). One takes <entry>.lock (flock: per open file, so threads
   exclude each other too, and the kernel releases it when the holder dies),
   reads the entry again, compiles and writes it if still missing; the others
   wait, then read it. Any failure (unwritable or untrusted directory, a
   symlink or a file not the user's alone at the lock path, no flock: ENOLCK,
   NFS without locking, no O_NOFOLLOW) means no lock: each compiles, as
   without it. A holder unlinks the lock file before it releases the lock, so
   the directory holds only entries; a waiter that then gets the lock on the
   unlinked file finds the path no longer names it and tries again, so two
   holders are never both valid (a copy of the fd in a child forked meanwhile
   holds only an unlinked file). Holders lock one entry at a time and take no
   other lock while they hold it: no deadlock. The wait is bounded (a stopped
   holder): then it compiles anyway, with a warning.
   A holder whose compile fails in the source (NVRTC_ERROR_COMPILATION, the
   same in every process with that NVRTC) writes the outcome, its status and
   message with NVRTC's log, into the lock file before it unlinks it: the
   waiters have that file open, so they (and only they: a later process
   creates a new file) return it instead of compiling the same failing source
   in turn. It is read
   only from a file its holder unlinked (one that died before that leaves a
   current file: its next holder blanks the record and compiles), so nothing
   outlives the compile: a transient failure poisons no later run. */
#ifndef CAPEX__CACHE_LOCK_WAIT_S
#define CAPEX__CACHE_LOCK_WAIT_S 120.0
#endif
/* Test hooks: called before each pause of a lock wait, and before each NVRTC
   compile of capex__cuda_compile_ex (tests count compiles across processes). */
#ifndef CAPEX__CACHE_ON_LOCK_WAIT
#define CAPEX__CACHE_ON_LOCK_WAIT() ((void)0)
#endif
#ifndef CAPEX__CUDA_ON_NVRTC
#define CAPEX__CUDA_ON_NVRTC() ((void)0)
#endif

/* The failure record: magic[8] | key[32] | u32 status (negated) | u32 NVRTC
   version (major * 1000 + minor * 10) | u32 length | message. A waiter with
   another NVRTC (a node of a cluster sharing the directory) compiles itself. */
static const char capex__cache_fail_magic[8] = {'C', 'A', 'P', 'E', 'X', 'E', 'R', 'R'};
#define CAPEX__CACHE_FAIL_HEADER 52

/* The loaded NVRTC's version as the record has it; 0 when none loads. */
CAPEX__PRIVATE uint32_t capex__cuda_nvrtc_code(void) {
    int major, minor;
    return capex_cuda_nvrtc_version(&major, &minor) == CAPEX_OK ? (uint32_t)(major * 1000 + minor * 10) : 0;
}

/* An fd on the lock file name in dfd (created when create): a regular file of
   the user's, not a link (O_NOFOLLOW) nor hard-linked, not group/other-writable;
   -1 otherwise. */
CAPEX__PRIVATE int capex__cuda_lock_open(int dfd, const char *name, int create) {
#if defined(CAPEX__CACHE_AT) && defined(LOCK_EX) && defined(LOCK_NB)
    struct stat st;
    /* O_RDWR: NFS emulates flock with byte-range locks, which want a writable fd */
    int fd = openat(dfd, name, O_RDWR | O_NONBLOCK | CAPEX__O_NOFOLLOW | CAPEX__O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) return -1;
    /* nlink 0 is a file its holder unlinked just now: capex__cuda_lock_current refuses it */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink > 1 ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
        close(fd);
        return -1;
    }
    return fd;
#else
    (void)dfd;
    (void)name;
    (void)create;
    return -1;
#endif
}

/* 1 when fd is still the file name in dfd names (its holder unlinks it when done). */
CAPEX__PRIVATE int capex__cuda_lock_current(int fd, int dfd, const char *name) {
#ifdef CAPEX__CACHE_AT
    struct stat a, b;
    return fstat(fd, &a) == 0 && fstatat(dfd, name, &b, CAPEX__AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
#else
    (void)fd;
    (void)dfd;
    (void)name;
    return 0;
#endif
}

/* Blanks a failure record a holder left in the lock file fd (one that died
   between writing it and unlinking the file). */
CAPEX__PRIVATE void capex__cuda_lock_blank(int fd) {
    static const char zero[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && lseek(fd, 0, SEEK_SET) == 0 && capex__cuda_write_all(fd, zero, 8) != 0) {
        /* unwritable: a record stays, but it is read only from an unlinked file */
    }
}

/* The holder's failure, into its lock file fd (before it unlinks it). */
CAPEX__PRIVATE void capex__cuda_lock_put_failure(int fd, const unsigned char key[32], capex_result r, const char *msg) {
    unsigned char h[CAPEX__CACHE_FAIL_HEADER];
    size_t len = strlen(msg);
    memcpy(h, capex__cache_fail_magic, 8);
    memcpy(h + 8, key, 32);
    capex__put_u32(h + 40, (uint32_t)-(int32_t)r);
    capex__put_u32(h + 44, capex__cuda_nvrtc_code());
    capex__put_u32(h + 48, (uint32_t)len);
    /* the message after the header, then the magic: a reader never takes a half-written record */
    if (lseek(fd, 8, SEEK_SET) != 8 || capex__cuda_write_all(fd, h + 8, sizeof h - 8) != 0 ||
        capex__cuda_write_all(fd, msg, len) != 0 || lseek(fd, 0, SEEK_SET) != 0)
        return;
    if (capex__cuda_write_all(fd, h, 8) != 0) return;
}

/* The failure its holder recorded in the lock file fd (which the holder has
   unlinked), as this thread's error: its status, or CAPEX_OK when none. */
CAPEX__PRIVATE capex_result capex__cuda_lock_take_failure(int fd, const unsigned char key[32]) {
    unsigned char h[CAPEX__CACHE_FAIL_HEADER];
    char msg[1100];
    uint32_t code, len;
    if (lseek(fd, 0, SEEK_SET) != 0 || capex__cuda_read_all(fd, h, sizeof h) != sizeof h ||
        memcmp(h, capex__cache_fail_magic, 8) != 0 || memcmp(h + 8, key, 32) != 0)
        return CAPEX_OK;
    code = capex__get_u32(h + 40);
    len = capex__get_u32(h + 48);
    if (code != (uint32_t)-(int32_t)CAPEX_ERR_NVRTC || len >= sizeof msg || capex__cuda_read_all(fd, msg, len) != len ||
        capex__get_u32(h + 44) == 0 || capex__get_u32(h + 44) != capex__cuda_nvrtc_code())
        return CAPEX_OK;
    msg[len] = '\0';
    return capex__fail(CAPEX_ERR_NVRTC, "%s", msg);
}

/* Takes the lock name in dfd (the checked cache directory; path: its path, for
   messages); its fd, or -1 for no lock (the caller compiles as without one),
   or -2 with the failure the holder it waited for recorded as this thread's
   error (*failed: its status). Polls (LOCK_NB) with pauses of 1 to 50 ms, up
   to CAPEX__CACHE_LOCK_WAIT_S in all. defer: NULL, wait; *defer < 0, do not
   wait: -3 when another holds it, *defer then the lock file's fd, kept open
   so that its holder's failure record reaches this waiter (a later holder
   makes a new file); *defer >= 0, such an fd, waited on first (consumed). */
CAPEX__PRIVATE int capex__cuda_cache_lock(int dfd, const char *name, const char *path, const unsigned char key[32],
                                          int *defer, capex_result *failed) {
#if defined(LOCK_EX) && defined(LOCK_NB)
    double start = capex_dist_now(), pause = 0.001;
    int attempt, try_only = defer && *defer < 0;
    for (attempt = 0; attempt < 100; attempt++) {
        int fd, got;
        if (defer && *defer >= 0) {
            fd = *defer;
            *defer = -1;
        } else if ((fd = capex__cuda_lock_open(dfd, name, 1)) < 0) {
            return -1;
        }
        while (!(got = flock(fd, LOCK_EX | LOCK_NB) == 0)) {
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) { /* ENOLCK, EINVAL, ...: no locking here */
                close(fd);
                return -1;
            }
            /* unlinked: its holder is done, though a child it forked meanwhile may hold a copy of its fd */
            if (!capex__cuda_lock_current(fd, dfd, name)) break;
            if (try_only) { /* held: the caller does other work first */
                *defer = fd;
                return -3;
            }
            if (capex_dist_now() - start >= CAPEX__CACHE_LOCK_WAIT_S) {
                capex_log(CAPEX_LOG_WARN, "waited %.0f s for %s, which another compile of the same kernel holds; "
                          "compiling here too", capex_dist_now() - start, path);
                close(fd);
                return -1;
            }
            CAPEX__CACHE_ON_LOCK_WAIT();
            capex__sleep_s(pause);
            if (pause < 0.05) pause *= 2;
        }
        if (got && capex__cuda_lock_current(fd, dfd, name)) {
            capex__cuda_lock_blank(fd);
            return fd;
        }
        /* its holder is done: failed in the source (recorded), else the entry is likely there: again */
        if ((*failed = capex__cuda_lock_take_failure(fd, key)) != CAPEX_OK) {
            close(fd);
            return -2;
        }
        close(fd);
    }
    return -1;
#else
    (void)dfd;
    (void)name;
    (void)path;
    (void)key;
    (void)defer;
    (void)failed;
    return -1;
#endif
}

/* Unlinks the lock file, then releases it (the order capex__cuda_cache_lock relies on). */
CAPEX__PRIVATE void capex__cuda_cache_unlock(int fd, int dfd, const char *name) {
    if (fd < 0) return;
#ifdef CAPEX__CACHE_AT
    unlinkat(dfd, name, 0);
#else
    (void)dfd;
    (void)name;
#endif
    close(fd);
}

/* Removes temp files that a killed writer left (older than an hour: no live
   write takes that long), and lock files a killed holder left when nobody
   missed that entry since (taken first, as a holder does: one held or
   replaced meanwhile stays). Runs after each write, which follows a compile
   of 100 ms or more, so the directory listing costs nothing in comparison. */
CAPEX__PRIVATE void capex__cuda_cache_sweep(int dfd) {
#ifdef CAPEX__CACHE_AT
    DIR *d;
    struct dirent *e;
    time_t now = time(NULL);
    int rfd = openat(dfd, ".", O_RDONLY | CAPEX__O_DIRECTORY | CAPEX__O_CLOEXEC);
    if (rfd < 0) return;
    if (!(d = fdopendir(rfd))) {
        close(rfd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        size_t len = strlen(e->d_name);
        int tmp = len > 4 && !strcmp(e->d_name + len - 4, ".tmp") && strstr(e->d_name, ".capexjit.");
        int lock = len > 14 && !strcmp(e->d_name + len - 14, ".capexjit.lock");
        if (!tmp && !lock) continue;
        if (fstatat(dfd, e->d_name, &st, CAPEX__AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || now - st.st_mtime <= 3600)
            continue;
        if (tmp) {
            unlinkat(dfd, e->d_name, 0);
        } else {
#if defined(LOCK_EX) && defined(LOCK_NB)
            int fd = capex__cuda_lock_open(dfd, e->d_name, 0);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && capex__cuda_lock_current(fd, dfd, e->d_name)) {
                capex__cuda_lock_blank(fd); /* a record of a holder that died is no waiter's outcome */
                unlinkat(dfd, e->d_name, 0);
            }
            if (fd >= 0) close(fd);
#endif
        }
    }
    closedir(d);
#else
    (void)dfd;
#endif
}

/* Writes an entry atomically into the checked directory dfd (dir: its path,
   for messages): a private temp file in it, then renameat, so readers see
   either no entry, the old one, or the whole new one. Concurrent writers of
   one key each rename a complete file; the last wins. */
CAPEX__PRIVATE capex_result capex__cuda_cache_write_at(int dfd, const char *dir, const unsigned char key[32],
                                                       const capex_cuda_image *img) {
#ifdef CAPEX__CACHE_AT
    char name[100], tmp[200];
    unsigned char h[CAPEX__CACHE_HEADER];
    int fd = -1, attempt, err;
    capex__cuda_cache_name(key, name, sizeof name);
    for (attempt = 0; attempt < 100 && fd < 0; attempt++) {
        /* pid + a stack address + attempt: unique across processes and threads */
        capex__cuda_fmt(tmp, sizeof tmp, "%s.%ld.%lx.%d.tmp", name, (long)getpid(), (unsigned long)(size_t)&fd, attempt);
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | CAPEX__O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) return capex__fail(CAPEX_ERR_IO, "cannot write to the kernel cache directory %s: %s", dir, strerror(errno));
    capex__cuda_cache_header(h, key, img);
    if (capex__cuda_write_all(fd, h, sizeof h) != 0 || capex__cuda_write_all(fd, img->data, img->size) != 0) {
        err = errno;
        close(fd);
        unlinkat(dfd, tmp, 0);
        return capex__fail(CAPEX_ERR_IO, "cannot write the kernel cache entry %s/%s: %s", dir, tmp, strerror(err));
    }
    if (close(fd) != 0 || renameat(dfd, tmp, dfd, name) != 0) {
        err = errno;
        unlinkat(dfd, tmp, 0);
        return capex__fail(CAPEX_ERR_IO, "cannot install the kernel cache entry %s/%s: %s", dir, name, strerror(err));
    }
    capex__cuda_cache_sweep(dfd);
    return CAPEX_OK;
#else
    (void)dfd;
    (void)key;
    (void)img;
    return capex__fail(CAPEX_ERR_CONFIG, "kernel cache directory %s: this build has no openat", dir);
#endif
}

/* Makes (0700), checks and writes into c's directory (tests and tools). */
CAPEX__PRIVATE capex_result capex__cuda_cache_write(const capex_cuda_cache *c, const unsigned char key[32],
                                                    const capex_cuda_image *img) {
    int dfd;
    capex_result r = capex__cuda_cache_open(c->dir, 1, &dfd);
    if (r != CAPEX_OK) return r;
    r = capex__cuda_cache_write_at(dfd, c->dir, key, img);
    close(dfd);
    return r;
}

#define CAPEX__TAG_CUDA_COMPILE_DESC CAPEX__TAG('C', 'M', 'P', 'D')
CAPEX_API void capex_cuda_compile_desc_init(capex_cuda_compile_desc *desc) {
    if (!desc) return;
    memset(desc, 0, sizeof *desc);
    desc->init_tag = CAPEX__TAG_CUDA_COMPILE_DESC;
    desc->name = "capex_program";
}

/* 1 when NVRTC may read files for this compile, which the cache key cannot
   see: a #include not of the <...> form (a quoted name is found next to the
   program name, a macro may expand to one), or an option that names include
   paths, pre-included files or precompiled headers. Without such options NVRTC
   has no search directories, so <...> reads nothing. Errs towards 1. */
CAPEX__PRIVATE int capex__cuda_reads_files(const char *source, const char *const *options, int n_options) {
    const char *s = source;
    int i;
    for (i = 0; i < n_options; i++) {
        const char *o = options[i];
        if (!strncmp(o, "-D", 2) || !strncmp(o, "-U", 2)) continue; /* a macro may be named anything */
        while (*o == '-') o++; /* -I, --include-path, -include, --pre-include, PCH options */
        if (*o == 'I' || !strncmp(o, "include", 7) || !strncmp(o, "pre-include", 11) || strstr(o, "pch")) return 1;
    }
    while (*s) { /* each line: optional blanks, '#', blanks, "include", blanks, then not '<' */
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#') {
            s++;
            while (*s == ' ' || *s == '\t') s++;
            if (!strncmp(s, "include", 7)) {
                s += 7;
                while (*s == ' ' || *s == '\t') s++;
                if (*s != '<') return 1;
            }
        }
        while (*s && *s != '\n') s++;
        if (*s) s++;
    }
    return 0;
}

/* The NVRTC compile of capex__cuda_compile_ex (no cache). */
CAPEX__PRIVATE capex_result capex__cuda_compile_nvrtc(const capex_cuda_compile_desc *d, int builtin, capex_cuda_image *out) {
    capex__cuda_nvrtc_lib *n;
    capex_cuda_target target;
    capex_result r;
    int i;
    n = capex__cuda_nvrtc(&r);
    if (!n) return r;
    if ((r = capex_cuda_select_target(n->archs, n->n_archs, d->device_cc, &target)) != CAPEX_OK) return r;
    CAPEX__CUDA_ON_NVRTC();
    if (builtin && d->n_options < 16 && (n->major > 12 || (n->major == 12 && n->minor >= 4))) {
        const char *o[17];
        for (i = 0; i < d->n_options; i++) o[i] = d->options[i];
        o[d->n_options] = "-minimal";
        return capex_cuda_nvrtc_compile(d->source, d->name, o, d->n_options + 1, target, out);
    }
    return capex_cuda_nvrtc_compile(d->source, d->name, d->options, d->n_options, target, out);
}

/* The cache-aware compile. skip_read: the caller found the cached image unusable. */
/* Source -> image through the cache. builtin: a built-in unit, compiled with
   NVRTC's -minimal where NVRTC has it (12.4 on): it skips NVRTC's built-in
   headers, which the kernels do not use (-3% CPU per program, the same
   images: tests/test_cuda_jit.c), so it is not part of the cache key.
   defer (see capex__cuda_compile_defer): NULL waits for another process's
   compile of the entry. */
CAPEX__PRIVATE capex_result capex__cuda_compile_at(const capex_cuda_compile_desc *d, int skip_read, int builtin, int *defer,
                                                   capex_cuda_image *out) {
    unsigned char key[32];
    char name[100], lock[110], path[1200];
    capex_result r, failed = CAPEX_OK;
    int i, use_cache, lock_fd = -1, dfd = -1;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_compile: out is NULL");
    memset(out, 0, sizeof *out);
    if (!d || !d->source || d->n_options < 0 || (d->n_options > 0 && !d->options))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_compile: NULL desc or source, or options NULL with n_options > 0");
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_CUDA_COMPILE_DESC, "capex_cuda_compile", "capex_cuda_compile_desc",
                               "capex_cuda_compile_desc_init")) != CAPEX_OK)
        return r;
    /* a garbage cache's dir need not end within it: refused before it is read */
    if (d->cache && (r = capex__desc_check(d->cache->init_tag, CAPEX__TAG_CUDA_CACHE, "capex_cuda_compile",
                                           "capex_cuda_cache", "capex_cuda_cache_init")) != CAPEX_OK)
        return r;
    for (i = 0; i < d->n_options; i++)
        if (!d->options[i]) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_compile: options[%d] is NULL", i);
    if (d->device_cc <= 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_compile: device_cc %d (want e.g. 90 for sm_90)", d->device_cc);
    use_cache = d->cache && d->cache->enabled && d->cache->dir[0] &&
                !capex__cuda_reads_files(d->source, d->options, d->n_options); /* an edited header must not hit */
    if (use_cache) {
        capex__cuda_cache_key(d->source, d->name, d->options, d->n_options, d->device_cc, key);
        capex__cuda_cache_name(key, name, sizeof name);
        capex__cuda_fmt(lock, sizeof lock, "%s.lock", name);
        capex__cuda_cache_path(d->cache, key, path, sizeof path);
        /* every read and write below goes through dfd, the directory checked here */
        r = capex__cuda_cache_open(d->cache->dir, !skip_read, &dfd);
        if (r != CAPEX_OK && r != CAPEX_ERR_NOT_FOUND) {
            /* not the user's alone (or unusable): no reads, no writes */
            if (!d->cache->warned) capex_log(CAPEX_LOG_WARN, "%s; running without the kernel cache (set CAPEX_CACHE_DIR)", capex_last_error());
            d->cache->warned = 1;
            capex_clear_error();
            use_cache = 0;
        } else if (r == CAPEX_OK && !skip_read) {
            r = capex__cuda_cache_read_at(dfd, name, path, key, out);
            if (r == CAPEX_OK) {
                close(dfd);
                return CAPEX_OK;
            }
            if (r != CAPEX_ERR_NOT_FOUND) capex_log(CAPEX_LOG_INFO, "recompiling: %s", capex_last_error());
            /* a miss: compile under the entry's lock, unless another process wrote it
               meanwhile (skip_read: the entry is the one the driver refused, so no wait) */
            lock_fd = capex__cuda_cache_lock(dfd, lock, path, key, defer, &failed);
            if (lock_fd == -3) { /* another process compiles it: deferred (*defer: its lock file) */
                close(dfd);
                return CAPEX_OK;
            }
            if (lock_fd == -2) { /* the holder it waited for failed on this very source: its error, with NVRTC's log */
                close(dfd);
                return failed;
            }
            if (lock_fd >= 0 && capex__cuda_cache_read_at(dfd, name, path, key, out) == CAPEX_OK) {
                capex__cuda_cache_unlock(lock_fd, dfd, lock);
                close(dfd);
                return CAPEX_OK;
            }
        }
    }
    capex__cuda_source_error = 0;
    r = capex__cuda_compile_nvrtc(d, builtin, out);
    if (r == CAPEX_ERR_NVRTC && lock_fd >= 0 && capex__cuda_source_error)
        capex__cuda_lock_put_failure(lock_fd, key, r, capex_last_error());
    /* an image over the reader's cap is not stored (it would never be read) */
    if (r == CAPEX_OK && use_cache && out->size <= CAPEX__CACHE_MAX_PAYLOAD) {
        capex_result w = dfd >= 0 ? CAPEX_OK : capex__cuda_cache_open(d->cache->dir, 1, &dfd);
        if (w == CAPEX_OK) w = capex__cuda_cache_write_at(dfd, d->cache->dir, key, out);
        if (w != CAPEX_OK) {
            if (!d->cache->warned) capex_log(CAPEX_LOG_WARN, "%s; running without the kernel cache (set CAPEX_CACHE_DIR)", capex_last_error());
            d->cache->warned = 1;
            capex_clear_error();
        }
    }
    capex__cuda_cache_unlock(lock_fd, dfd, lock);
    if (dfd >= 0) close(dfd);
    return r;
}

CAPEX__PRIVATE capex_result capex__cuda_compile_ex(const capex_cuda_compile_desc *d, int skip_read, int builtin,
                                                   capex_cuda_image *out) {
    return capex__cuda_compile_at(d, skip_read, builtin, NULL, out);
}

/* capex__cuda_compile_ex for a caller with other compiles to do (the
   precompile pools): with *defer < 0, an entry whose lock another process
   holds is not waited for: CAPEX_OK, no image (out->data NULL) and *defer >= 0
   (the lock file, open). Called again with that *defer, it reads the entry
   (the holder may have written it) or waits as compile_ex does, the holder's
   recorded failure included, and sets *defer to -1; capex__cuda_defer_drop
   closes one never called again. */
CAPEX__PRIVATE capex_result capex__cuda_compile_defer(const capex_cuda_compile_desc *d, int skip_read, int builtin, int *defer,
                                                      capex_cuda_image *out) {
    int held = *defer;
    capex_result r = capex__cuda_compile_at(d, skip_read, builtin, defer, out);
    if (held >= 0 && *defer == held) { /* returned before the lock (a hit, an error): not consumed */
        close(held);
        *defer = -1;
    }
    return r;
}
CAPEX__PRIVATE void capex__cuda_defer_drop(int *defer) {
    if (*defer >= 0) close(*defer);
    *defer = -1;
}

CAPEX__PRIVATE capex_result capex__cuda_compile(const capex_cuda_compile_desc *d, int skip_read, capex_cuda_image *out) {
    return capex__cuda_compile_ex(d, skip_read, 0, out);
}

CAPEX_API capex_result capex_cuda_compile(const capex_cuda_compile_desc *desc, capex_cuda_image *out) {
    return capex__cuda_compile(desc, 0, out);
}

/* ---- the embedded kernel program -------------------------------------------
   One NVRTC program assembled from fragments (each under C99's 4095-character
   literal limit), compiled once per GPU arch. No #include: NVRTC has no CUDA
   headers without include paths, so half types are plain bit arithmetic, the
   same formulas as capex.h's CPU conversions (bit-exact on every input).
   Later sections append fragments: the optimizer and norm math come from
   capex.h as text (the same macros its CPU backend compiles), followed by
   their fused kernels. */

static const char capex__cuda_frag_prelude[] =
    "typedef unsigned short capex_u16;\n"
    "typedef unsigned int capex_u32;\n"
    "typedef unsigned long long capex_u64;\n"
    "#define CAPEX_DEVICE __device__ __forceinline__\n"
    "#define CAPEX_KERNEL extern \"C\" __global__\n"
    "/* for loops that one thread runs a few times with heavy math (double sqrt,\n"
    "   divisions): unrolling them multiplies code and compile time for nothing */\n"
    "#ifdef __CUDA_ARCH__\n"
    "#define CAPEX_NO_UNROLL _Pragma(\"unroll 1\")\n"
    "#else\n"
    "#define CAPEX_NO_UNROLL\n"
    "#endif\n"
    "/* x becomes a value NVVM knows nothing about (no code): it cannot specialise on it */\n"
    "#ifdef __CUDA_ARCH__\n"
    "#define CAPEX_OPAQUE(x) asm(\"\" : \"+r\"(x))\n"
    "#else\n"
    "#define CAPEX_OPAQUE(x) ((void)0)\n"
    "#endif\n"
    "/* the same, re-made at each use (volatile): a loop cannot be unswitched on x\n"
    "   (a loop over tensors keeps one copy, not one per run-time switch) */\n"
    "#ifdef __CUDA_ARCH__\n"
    "#define CAPEX_VARY(x) asm volatile(\"\" : \"+r\"(x))\n"
    "#else\n"
    "#define CAPEX_VARY(x) ((void)0)\n"
    "#endif\n"
    "/* grid-stride loop with 64-bit indices (no INT_MAX limit) */\n"
    "#define CAPEX_FOR_EACH(i, n) for (capex_u64 i = (capex_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); "
    "i += (capex_u64)gridDim.x * blockDim.x)\n"
    "/* f32 -> f16: one cvt.rn.f16.f32 on the GPU (IEEE round to nearest even,\n"
    "   overflow to inf, f16 subnormals kept: the bit arithmetic's value for every\n"
    "   non-NaN input); a NaN keeps the bit arithmetic's quiet NaN with sign and\n"
    "   payload (cvt gives a canonical NaN). Host C++ builds of this text (the\n"
    "   tests' kernel emulation) use the bit arithmetic. (cvt for f16 -> f32 made\n"
    "   the kernels larger, for f32 -> bf16 (sm_80+) 0.6% smaller: not used.) */\n"
    /* the conversions' one definition (capex.h, CAPEX__OPTIM_MATH_HALF) */
    "#define CAPEX__HALF_DEFINED 1\n"
    CAPEX__OPT_XSTR(CAPEX__OPTIM_MATH_HALF(CAPEX_DEVICE, __float_as_uint, __uint_as_float)) "\n"
    "CAPEX_DEVICE capex_u16 capex_f32_to_f16_bits(float f) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "    capex_u32 x = __float_as_uint(f);\n"
    "    capex_u16 h;\n"
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "    return (x & 0x7fffffffu) > 0x7f800000u ? (capex_u16)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu)) : h; /* capex__h16_store's NaN case */\n"
    "#else\n"
    "    return (capex_u16)capex__h16_store(f);\n"
    "#endif\n"
    "}\n"
    "CAPEX_DEVICE float capex_f16_bits_to_f32(capex_u16 h) { return capex__h16_load(h); }\n"
    "CAPEX_DEVICE capex_u16 capex_f32_to_bf16_bits(float f) { return (capex_u16)capex__b16_store(f); }\n"
    "CAPEX_DEVICE float capex_bf16_bits_to_f32(capex_u16 h) { return capex__b16_load(h); }\n";

static const char capex__cuda_frag_basic[] =
    "CAPEX_KERNEL void capex_fill_f32(float *x, float v, capex_u64 n) { CAPEX_FOR_EACH(i, n) x[i] = v; }\n"
    "CAPEX_KERNEL void capex_scale_f32(float *y, const float *x, float a, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) y[i] = __fmul_rn(a, x[i]);\n"
    "}\n"
    "CAPEX_KERNEL void capex_add_f32(float *c, const float *a, const float *b, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) c[i] = __fadd_rn(a[i], b[i]);\n"
    "}\n"
    "CAPEX_KERNEL void capex_f32_to_f16(capex_u16 *dst, const float *src, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) dst[i] = capex_f32_to_f16_bits(src[i]);\n"
    "}\n"
    "CAPEX_KERNEL void capex_f16_to_f32(float *dst, const capex_u16 *src, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) dst[i] = capex_f16_bits_to_f32(src[i]);\n"
    "}\n"
    "CAPEX_KERNEL void capex_f32_to_bf16(capex_u16 *dst, const float *src, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) dst[i] = capex_f32_to_bf16_bits(src[i]);\n"
    "}\n"
    "CAPEX_KERNEL void capex_bf16_to_f32(float *dst, const capex_u16 *src, capex_u64 n) {\n"
    "    CAPEX_FOR_EACH(i, n) dst[i] = capex_bf16_bits_to_f32(src[i]);\n"
    "}\n"
    /* y += x in a half dtype (bf: bfloat16, else float16): f32 sum rounded once, the bits of
       converting both to f32, capex_add_f32, converting back (no f32 scratch) */
    "CAPEX_KERNEL void capex_add_half(capex_u16 *y, const capex_u16 *x, int bf, capex_u64 n) {\n"
    "    if (bf) { CAPEX_FOR_EACH(i, n) y[i] = capex_f32_to_bf16_bits(__fadd_rn(capex_bf16_bits_to_f32(y[i]), capex_bf16_bits_to_f32(x[i]))); }\n"
    "    else { CAPEX_FOR_EACH(i, n) y[i] = capex_f32_to_f16_bits(__fadd_rn(capex_f16_bits_to_f32(y[i]), capex_f16_bits_to_f32(x[i]))); }\n"
    "}\n";

typedef const char *(*capex__cuda_fragment_fn)(void);

/* ==== kernel source fragments and their *_fn getters ==== */
/* Fused optimizer kernels. The per-element math is capex.h's
   (capex__optim_math_parts: the very text its CPU backend compiles), added
   to the program part by part (each under 4095 characters); the program is
   compiled with --fmad=false so that math rounds as the C code does. */
#define CAPEX__GO_MATH_FN(k) \
    CAPEX__PRIVATE const char *capex__cuda_frag_gomath##k##_fn(void) { return capex__optim_math_parts[k]; }
CAPEX__GO_MATH_FN(0)
CAPEX__GO_MATH_FN(1)
CAPEX__GO_MATH_FN(2)
CAPEX__GO_MATH_FN(3)
CAPEX__GO_MATH_FN(4)
CAPEX__GO_MATH_FN(5)
CAPEX__GO_MATH_FN(6) /* NovoGrad: only its parts include it */
CAPEX__GO_MATH_FN(7) /* Adam amsgrad and Adagrad: only their parts include it */
typedef char capex__go_math_parts_are_8[sizeof capex__optim_math_parts / sizeof capex__optim_math_parts[0] == 8 ? 1 : -1];
/* capex.h's lr schedule math (CAPEX__LR_MATH), for capex_go_prepare */
CAPEX__PRIVATE const char *capex__cuda_frag_golr_fn(void) { return capex__lr_math_source; }

/* The multi-tensor launch metadata (capex_go_meta<D> in the kernels, written
   by capex__go_mta), defined once: B bytes hold T = CAPEX__GO_TDEF(B, D)
   slots, each D addresses (addr[D][T]), numel[T] and cend[T] (the launch's
   chunks up to the end of the slot), then ntensors and a pad (int32 each).
   No table per block: a launch may hold any number of chunks and its grid is
   sized from the device. B: CAPEX__GO_META_SMALL under the 4096-byte kernel
   parameter limit (256 bytes left for the args), CAPEX__GO_META_LARGE under
   the 32764 bytes of drivers from CUDA 12.1 on Volta and newer. */
#define CAPEX__GO_TDEF(B, d) (((B) - 8) / (8 * ((d) + 2)))
/* sizeof(capex_go_meta<d>) in B bytes (<= B) */
#define CAPEX__GO_META_SIZE(B, d) (8 * ((d) + 2) * CAPEX__GO_TDEF(B, d) + 8)
#define CAPEX__GO_META_SMALL 3840
#define CAPEX__GO_META_LARGE 32512
/* The grid when the device's occupancy is unknown: the fixed grids of old */
#define CAPEX__GO_GRID_DEFAULT 320

/* The launch structs, defined once: expanded as C (capex__go_args & co.,
   which the host fills) and, as text, into the kernels (capex_go_args & co.).
   S names the struct; U64/I64/I32/U32 are the integer types on each side;
   P(T) is a device pointer to T: `T *` in the kernels, U64 (a capex_cuda_ptr)
   on the host, 8 bytes on both sides. The ABI sizes are checked at compile
   time (capex__go_sizes_ok) and against the kernel text compiled on the host
   (tests/test_gpuopt_emu.c) and the PTX (tests/test_gpuopt.c). */
#define CAPEX__GO_STRUCTS(S, P, U64, I64, I32, U32)                                            \
    S(segs) {                                                                                   \
        I64 start[158], count[158], out[158]; /* CAPEX__GO_NSEG */                              \
        I32 n, pad;                                                                             \
    };                                                                                          \
    /* per parameter group: hyperparameters (host-set), step count, and the                     \
       constants of the current step (written by capex_go_prepare) */                           \
    S(group) {                                                                                  \
        I64 step;                                                                               \
        float lr, beta1, beta2, eps, wd, momentum, dampening;                                   \
        I32 bias_correction, grad_averaging, nesterov, mom_init;                                \
        float gs, bc1, bc2, beta3, clip_div;                                                    \
        U32 skip, first, wd_on, wd_before, wd_after, step_lo, step_hi;                          \
        float lr_decay; /* Adagrad (host-set, like lr .. nesterov) */                           \
    };                                                                                          \
    S(scaler) {                                                                                 \
        double growth_factor, backoff_factor;                                                   \
        I64 growth_interval, growth_tracker, steps, skipped_steps;                              \
        float scale, inv_scale, min_scale, max_scale;                                           \
        I32 dynamic, hysteresis, hysteresis_tracker;                                            \
        U32 found_inf;                                                                          \
    };                                                                                          \
    /* The argument of every optimizer kernel (after its metadata or segments,                  \
       if any): chunk (elements per chunk: the multi-tensor kernels; set by                     \
       capex__go_mta), then op.KERNEL, the kernel's own fields. A null pointer                  \
       means "none" where a kernel says so. group: this launch's parameter                      \
       group; groups: all of them (ngroups); seed: the bf16 stochastic                          \
       rounding seed; model: the model copy's kind, 0 none, 1 f16, 2 bf16, 3                    \
       bf16 stochastic rounding; tgroup: the group index of each tensor. */                     \
    S(args) {                                                                                   \
        U64 chunk;                                                                              \
        union {                                                                                 \
            struct { /* capex_go_scale_IN_OUT: out = in * *factor */                            \
                P(const float) factor;                                                          \
                P(unsigned) found_inf; /* set to 1 on an inf/NaN */                             \
                I32 write_out;         /* 0: check only, no output */                           \
                I32 clip_only;         /* do nothing unless *factor < 1 */                      \
            } scale;                                                                            \
            struct { P(double) partial; } sumsq; /* per-chunk sums of squares out */            \
            struct { /* capex_go_reduce: fixed-order sums of partial[] ranges */                \
                P(const double) partial;                                                        \
                P(double) sumsq; /* sums out (0: none) */                                       \
                P(float) norm;   /* float(sqrt(sum)) out (0: none) */                           \
            } reduce;                                                                           \
            struct { /* capex_go_clip_coef */                                                   \
                P(const double) sumsq; /* the total sum of squares */                           \
                P(float) total;        /* the norm out (0: none) */                             \
                P(float) coef;         /* the clip factor out (0: none) */                      \
                float max_norm;                                                                 \
            } clip;                                                                             \
            struct { /* capex_go_zero_norm */                                                   \
                P(const double) sumsq;    /* over every rank's shard */                         \
                P(const float) inv_scale; /* 0: 1 */                                            \
                P(unsigned) found_inf;    /* set to 1 when sumsq is not finite (0: none) */     \
                P(float) total;           /* float(sqrt(sumsq)) out (0: none) */                \
                P(float) coef;            /* the clip factor out (0: none) */                   \
                float max_norm;                                                                 \
            } znorm;                                                                            \
            struct { /* capex_go_prepare: the step's constants */                               \
                P(S(group)) groups;                                                             \
                P(const unsigned) found_inf; /* 0: none */                                      \
                P(const float) inv_scale;    /* 0: 1 */                                         \
                P(const float) clip_coef;    /* 0: 1 */                                         \
                P(const void) sched; /* 0 or int64 count, capex__lr_p, float base lr per group */\
                I32 ngroups, wd_after_momentum, sgd;                                            \
                I32 sched_groups; /* the groups below it follow sched */                        \
            } prepare;                                                                          \
            struct { P(S(scaler)) state; } scaler;                                              \
            struct { P(const S(group)) group; U64 seed; I32 w_mode, model; } adam;              \
            struct { /* Adam with amsgrad */                                                    \
                P(const S(group)) group;                                                        \
                U64 seed;                                                                       \
                P(const U64) max_bufs; /* per tensor index: its max(v) buffer */                \
                I32 w_mode, model;                                                              \
            } adam_ams;                                                                         \
            struct { P(const S(group)) group; U64 seed; I32 w_mode, model; } adagrad;           \
            struct {                                                                            \
                P(const S(group)) group;                                                        \
                U64 seed;                                                                       \
                I32 momentum; /* momentum buffers exist and momentum is on */                   \
                I32 model;                                                                      \
            } sgd;                                                                              \
            struct { /* LAMB stage 1: per-chunk sums of p^2 and u^2 out */                      \
                P(const S(group)) group;                                                        \
                P(double) p_sumsq;                                                              \
                P(double) u_sumsq;                                                              \
                I32 w_mode;                                                                     \
            } lamb1;                                                                            \
            struct { /* LAMB global-norm clip */                                                \
                P(S(group)) groups;                                                             \
                P(const double) sumsq; /* of the unscaled grads */                              \
                I32 ngroups;                                                                    \
                float max_grad_norm;                                                            \
            } lamb_clip;                                                                        \
            struct { /* LAMB trust ratio per tensor */                                          \
                P(const S(group)) groups;                                                       \
                P(const double) p_sumsq;                                                        \
                P(const double) u_sumsq;                                                        \
                P(float) ratio; /* out */                                                       \
                P(const I32) tgroup;                                                            \
                I32 ntensors, use_nvlamb;                                                       \
            } lamb_ratio;                                                                       \
            struct { /* LAMB stage 2 */                                                         \
                P(const S(group)) group;                                                        \
                U64 seed;                                                                       \
                P(const float) ratio; /* per tensor index */                                    \
                I32 w_mode, model;                                                              \
            } lamb2;                                                                            \
            struct { /* NovoGrad pass 1: per-chunk sums of (g*gs)^2 out */                      \
                P(const S(group)) group;                                                        \
                P(double) partial;                                                              \
                I32 reg_inside_moment, model; /* pass 2's: it picks its variant */     \
            } novo1;                                                                            \
            struct { /* NovoGrad per tensor, between the passes */                              \
                P(const S(group)) groups;                                                       \
                P(const double) sumsq; /* per tensor: sum (g*gs)^2 */                           \
                P(float) v;            /* per tensor: the second moment (in, out) */            \
                P(float) denom;        /* per tensor: out */                                    \
                P(const I32) tgroup;                                                            \
                I32 ntensors, init_zero;                                                        \
            } novo_norm;                                                                        \
            struct { /* NovoGrad pass 2 */                                                      \
                P(const S(group)) group;                                                        \
                U64 seed;                                                                       \
                P(const float) denom; /* per tensor index */                                    \
                I32 reg_inside_moment, model;                                                   \
            } novo2;                                                                            \
        } op;                                                                                   \
    };
/* The address lists of the multi-tensor kernels (capex_go_meta<D>::addr[list][slot]),
   defined once: CAPEX__GO_<KERNEL>_<LIST> on the host (capex__go_class fills
   them, capex__go_mta launches _DEPTH of them), CAPEX_GO_<KERNEL>_<LIST> in
   the kernel text. G grads, P params (fp32 master where there is a model
   copy), M exp_avg (SGD: BUF, the momentum buffer; Adagrad: SUM, the sum of
   squares), V exp_avg_sq, MODEL the f16/bf16 model copy (0: none), T each
   tensor's index into the optimizer's tensors (a number, not an address).
   Adam with amsgrad uses Adam's lists. */
#define CAPEX__GO_LISTS(E)                                                                                 \
    enum { E(SCALE_IN), E(SCALE_OUT), E(SCALE_DEPTH) };                                                    \
    enum { E(SUMSQ_X), E(SUMSQ_DEPTH) };                                                                   \
    enum { E(ADAM_G), E(ADAM_P), E(ADAM_M), E(ADAM_V), E(ADAM_MODEL), E(ADAM_T), E(ADAM_DEPTH) };          \
    enum { E(SGD_G), E(SGD_P), E(SGD_BUF), E(SGD_MODEL), E(SGD_T), E(SGD_DEPTH) };                         \
    enum { E(LAMB1_G), E(LAMB1_P), E(LAMB1_M), E(LAMB1_V), E(LAMB1_T), E(LAMB1_DEPTH) };                   \
    enum { E(LAMB2_P), E(LAMB2_M), E(LAMB2_V), E(LAMB2_MODEL), E(LAMB2_T), E(LAMB2_DEPTH) };               \
    enum { E(NOVO1_G), E(NOVO1_T), E(NOVO1_DEPTH) };                                                       \
    enum { E(NOVO2_G), E(NOVO2_P), E(NOVO2_M), E(NOVO2_MODEL), E(NOVO2_T), E(NOVO2_DEPTH) };               \
    enum { E(ADAGRAD_G), E(ADAGRAD_P), E(ADAGRAD_SUM), E(ADAGRAD_MODEL), E(ADAGRAD_T), E(ADAGRAD_DEPTH) };
#define CAPEX__GO_KLIST(x) CAPEX_GO_##x
#define CAPEX__GO_CLIST(x) CAPEX__GO_##x
#define CAPEX__GO_KSTRUCT(x) struct capex_go_##x
#define CAPEX__GO_CSTRUCT(x) struct capex__go_##x
#define CAPEX__GO_KPTR(T) T *
#define CAPEX__GO_CPTR(T) uint64_t

static const char capex__cuda_frag_go0[] =
    "/* ---- fused multi-tensor kernels (GPUOPT) ----\n"
    "   Launch metadata (capex_go_meta) by value: per slot its addresses, numel\n"
    "   and cend; a block walks chunks c = blockIdx.x + k*gridDim.x (slot found by\n"
    "   binary search in cend); 64-bit element indices.\n"
    "   4-element vectors (16 bytes of f32, 8 of f16/bf16) where every pointer of\n"
    "   the block is aligned, scalar tail otherwise. Reductions: one double per\n"
    "   thread in a fixed order, a fixed shared-memory tree per block (blockDim a\n"
    "   power of two <= 512), partials per chunk to memory: no float atomics. */\n"
    "#ifndef CAPEX_GK\n"
    "#define CAPEX_GK extern \"C\" __global__\n"
    "#endif\n"
    "/* the launch structs below are CAPEX__GO_STRUCTS (capex_cuda.h): each\n"
    "   kernel's own arguments are capex_go_args::op.KERNEL */\n"
    "#define CAPEX_GO_NSEG 158\n"
    CAPEX__OPT_XSTR(CAPEX__GO_STRUCTS(CAPEX__GO_KSTRUCT, CAPEX__GO_KPTR, capex_u64, long long, int, unsigned)) "\n";
/* the multi-tensor launch metadata (CAPEX__GO_TDEF) and the chunk loop */
static const char capex__cuda_frag_go0b[] =
    "/* CAPEX_GO_META: bytes of launch metadata (capex__go_meta_bytes; the host\n"
    "   passes -DCAPEX_GO_META=... for the large-parameter build) */\n"
    "#ifndef CAPEX_GO_META\n"
    "#define CAPEX_GO_META " CAPEX__OPT_XSTR(CAPEX__GO_META_SMALL) "\n"
    "#endif\n"
    "#define CAPEX_GO_T(d) " CAPEX__OPT_XSTR(CAPEX__GO_TDEF(CAPEX_GO_META, d)) "\n"
    "template <int D> struct capex_go_meta {\n"
    "    capex_u64 addr[D][CAPEX_GO_T(D)];\n"
    "    long long numel[CAPEX_GO_T(D)];\n"
    "    long long cend[CAPEX_GO_T(D)]; /* the launch's chunks up to the end of slot s */\n"
    "    int ntensors, pad;\n"
    "};\n"
    "/* resident blocks of 512 threads a multi-tensor kernel keeps (its registers\n"
    "   under the chunk loop: tests/data/sass_table.txt, no spills): 3 or 4 */\n"
    "#define CAPEX_GK_OCC3 CAPEX_GK __launch_bounds__(512, 3)\n"
    "#define CAPEX_GK_OCC4 CAPEX_GK __launch_bounds__(512, 4)\n"
    "/* a block's chunks: c = blockIdx.x, + gridDim.x, ... (grid sized from the device) */\n"
    "#define CAPEX_GO_CHUNKS(m) CAPEX_NO_UNROLL for (long long c = blockIdx.x; c < (m).cend[(m).ntensors - 1]; c += gridDim.x)\n"
    "/* Variants (capex__cuda_unit_desc): -DCAPEX_V_SEL=mask keeps only the kernels\n"
    "   of those selection bits (CAPEX_GO_SEL); -DCAPEX_V_W/_MK/_WR/_CLIP fix a\n"
    "   kernel's run-time switch (w_mode, model, write_out, clip_only) at compile\n"
    "   time, so NVVM and ptxas see only the code it takes. -1: the generic kernel. */\n"
    "#ifndef CAPEX_V_SEL\n#define CAPEX_V_SEL 0xff\n#endif\n"
    "#define CAPEX_GO_SEL(b) (((CAPEX_V_SEL) >> (b)) & 1)\n"
    "#ifndef CAPEX_V_W\n#define CAPEX_V_W -1\n#endif\n"
    "#ifndef CAPEX_V_MK\n#define CAPEX_V_MK -1\n#endif\n"
    "#ifndef CAPEX_V_WR\n#define CAPEX_V_WR -1\n#endif\n"
    "#ifndef CAPEX_V_CLIP\n#define CAPEX_V_CLIP -1\n#endif\n"
    "/* Adam with amsgrad and Adagrad keep one copy of their math for both w modes and\n"
    "   every model kind (capex__sel, capex_go_model4): half the code, the same loads; on\n"
    "   sm_100 that took registers (Adagrad 34-35 -> 35-39, amsgrad 42-43 -> 47-48: one\n"
    "   block of 512 less per SM), so there the tests stay per element as before. */\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000\n"
    "#define CAPEX_GO_ONE_COPY 0\n"
    "#else\n"
    "#define CAPEX_GO_ONE_COPY 1\n"
    "#endif\n";
static const char capex__cuda_frag_go1[] =
    "/* address lists: CAPEX__GO_LISTS (capex_cuda.h) */\n"
    CAPEX__OPT_XSTR(CAPEX__GO_LISTS(CAPEX__GO_KLIST)) "\n"
    "/* chunk c of the launch: its slot (first with cend > c), first element and count */\n"
    "template <int D> CAPEX_DEVICE int capex_go_block(const capex_go_meta<D> &m, capex_u64 chunk, long long c,\n"
    "                                                 capex_u64 *off, capex_u64 *n) {\n"
    "    int s = 0, hi = m.ntensors - 1;\n"
    "    while (s < hi) {\n"
    "        int mid = (s + hi) >> 1;\n"
    "        if (m.cend[mid] <= c) s = mid + 1; else hi = mid;\n"
    "    }\n"
    "    capex_u64 o = (capex_u64)(c - (s ? m.cend[s - 1] : 0)) * chunk, left = (capex_u64)m.numel[s] - o;\n"
    "    *off = o;\n"
    "    *n = left < chunk ? left : chunk;\n"
    "    return s;\n"
    "}\n"
    "/* element codes: 0 f32 (float), 1 f16, 2 bf16 (16-bit codes) */\n"
    "template <int D> struct capex_go_ty { typedef capex_u16 T; };\n"
    "template <> struct capex_go_ty<0> { typedef float T; };\n"
    "CAPEX_DEVICE float capex_go_tof(float v, int) { return v; }\n"
    "CAPEX_DEVICE float capex_go_tof(capex_u16 v, int d) { return d == 1 ? capex__h16_load(v) : capex__b16_load(v); }\n"
    "CAPEX_DEVICE void capex_go_from(float f, float *o, int) { *o = f; }\n"
    "CAPEX_DEVICE void capex_go_from(float f, capex_u16 *o, int d) {\n"
    "    *o = d == 1 ? capex_f32_to_f16_bits(f) : capex_f32_to_bf16_bits(f); /* the prelude's: cvt for f16 on the GPU */\n"
    "}\n"
    "CAPEX_DEVICE unsigned capex_go_nf(float v, int) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }\n"
    "CAPEX_DEVICE unsigned capex_go_nf(capex_u16 v, int d) {\n"
    "    return d == 1 ? (v & 0x7c00u) == 0x7c00u : (v & 0x7f80u) == 0x7f80u;\n"
    "}\n"
    "CAPEX_DEVICE bool capex_go_al(capex_u64 p, capex_u64 off, capex_u64 es) { return ((p + off * es) & (4 * es - 1)) == 0; }\n"
    "CAPEX_DEVICE void capex_go_ld4(const float *p, float *r) {\n"
    "    float4 v = *(const float4 *)p;\n"
    "    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;\n"
    "}\n"
    "CAPEX_DEVICE void capex_go_ld4(const capex_u16 *p, capex_u16 *r) {\n"
    "    uint2 v = *(const uint2 *)p;\n"
    "    r[0] = (capex_u16)v.x; r[1] = (capex_u16)(v.x >> 16); r[2] = (capex_u16)v.y; r[3] = (capex_u16)(v.y >> 16);\n"
    "}\n"
    "CAPEX_DEVICE void capex_go_st4(float *p, const float *r) {\n"
    "    float4 v; v.x = r[0]; v.y = r[1]; v.z = r[2]; v.w = r[3];\n"
    "    *(float4 *)p = v;\n"
    "}\n"
    "CAPEX_DEVICE void capex_go_st4(capex_u16 *p, const capex_u16 *r) {\n"
    "    uint2 v; v.x = r[0] | ((capex_u32)r[1] << 16); v.y = r[2] | ((capex_u32)r[3] << 16);\n"
    "    *(uint2 *)p = v;\n"
    "}\n"
    "/* fixed-order block sum of one double per thread; result in thread 0 */\n"
    "CAPEX_DEVICE double capex_go_bsum(double *sh, double x) {\n"
    "    sh[threadIdx.x] = x;\n"
    "    __syncthreads();\n"
    "    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {\n"
    "        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    x = sh[0];\n"
    "    __syncthreads();\n"
    "    return x;\n"
    "}\n";
static const char capex__cuda_frag_go2[] =
    "/* Unscale + inf/NaN check (Apex multi_tensor_scale): out = float(in) * s\n"
    "   rounded to out's dtype; *found_inf = 1 if an input or stored output is\n"
    "   inf/NaN. s = *a.op.scale.factor (capex_go_args: found_inf, write_out,\n"
    "   clip_only). */\n"
    "template <int I, int O, int VWR = -1, int VCLIP = -1>\n"
    "CAPEX_DEVICE void capex_go_scale(const capex_go_meta<CAPEX_GO_SCALE_DEPTH> &m, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<I>::T IT;\n"
    "    typedef typename capex_go_ty<O>::T OT;\n"
    "    const float s = *a.op.scale.factor;\n"
    "    const int wr = VWR >= 0 ? VWR : a.op.scale.write_out;\n"
    "    capex_u64 off, n, i, k;\n"
    "    unsigned bad = 0;\n"
    "    if ((VCLIP >= 0 ? VCLIP != 0 : a.op.scale.clip_only != 0) && !(s < 1.0f)) return;\n"
    "    int slot = capex_go_block(m, a.chunk, c, &off, &n);\n"
    "    const IT *in = (const IT *)m.addr[CAPEX_GO_SCALE_IN][slot] + off;\n"
    "    OT *out = (OT *)m.addr[CAPEX_GO_SCALE_OUT][slot] + off;\n"
    "    capex_u64 nv = capex_go_al(m.addr[CAPEX_GO_SCALE_IN][slot], off, sizeof(IT)) &&\n"
    "                   (!wr || capex_go_al(m.addr[CAPEX_GO_SCALE_OUT][slot], off, sizeof(OT))) ? n / 4 : 0;\n"
    "    if (!wr) { /* check only: nothing to store, so latency-bound: 4 strides in flight */\n"
    "        for (k = threadIdx.x; k + 3ull * blockDim.x < nv; k += 4ull * blockDim.x) {\n"
    "            IT x[16];\n"
    "            for (int u = 0; u < 4; u++) capex_go_ld4(in + 4 * (k + u * blockDim.x), x + 4 * u);\n"
    "            for (int j = 0; j < 16; j++) {\n"
    "                OT y;\n"
    "                capex_go_from(capex_go_tof(x[j], I) * s, &y, O);\n"
    "                bad |= capex_go_nf(x[j], I) | capex_go_nf(y, O);\n"
    "            }\n"
    "        }\n"
    "    } else k = threadIdx.x;\n"
    "    /* two vectors a thread, both loaded before either is converted: 2 loads in flight */\n"
    "    for (; k < nv; k += 2ull * blockDim.x) {\n"
    "        IT x[8]; OT y[8];\n"
    "        const int two = k + blockDim.x < nv;\n"
    "        const capex_u64 k2 = two ? k + blockDim.x : k; /* the last odd vector loads itself twice: no branch */\n"
    "        capex_go_ld4(in + 4 * k, x);\n"
    "        capex_go_ld4(in + 4 * k2, x + 4);\n"
    "        for (int j = 0; j < 8; j++) {\n"
    "            float f = capex_go_tof(x[j], I) * s;\n"
    "            capex_go_from(f, &y[j], O);\n"
    "            bad |= capex_go_nf(x[j], I) | capex_go_nf(y[j], O);\n"
    "        }\n"
    "        if (wr) { capex_go_st4(out + 4 * k, y); if (two) capex_go_st4(out + 4 * k2, y + 4); }\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        OT y;\n"
    "        capex_go_from(capex_go_tof(in[i], I) * s, &y, O);\n"
    "        bad |= capex_go_nf(in[i], I) | capex_go_nf(y, O);\n"
    "        if (wr) out[i] = y;\n"
    "    }\n"
    "    if (bad && a.op.scale.found_inf) *(volatile unsigned *)a.op.scale.found_inf = 1u;\n"
    "}\n";
static const char capex__cuda_frag_go2b[] =
    "/* Sum of squares of chunk c in double -> op.sumsq.partial[c]. */\n"
    "template <int I> CAPEX_DEVICE void capex_go_sumsq(const capex_go_meta<CAPEX_GO_SUMSQ_DEPTH> &m, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<I>::T IT;\n"
    "    __shared__ double sh[512];\n"
    "    capex_u64 off, n, i, k;\n"
    "    double acc = 0.0;\n"
    "    int slot = capex_go_block(m, a.chunk, c, &off, &n);\n"
    "    const IT *x = (const IT *)m.addr[CAPEX_GO_SUMSQ_X][slot] + off;\n"
    "    capex_u64 nv = capex_go_al(m.addr[CAPEX_GO_SUMSQ_X][slot], off, sizeof(IT)) ? n / 4 : 0, b = blockDim.x;\n"
    "    /* 4 strides loaded before any is summed: 4 loads in flight per thread\n"
    "       (tests/sass_gate.py holds it); same per-thread order as 1 at a time */\n"
    "    for (k = threadIdx.x; k + 3 * b < nv; k += 4 * b) {\n"
    "        IT v[16];\n"
    "        for (int u = 0; u < 4; u++) capex_go_ld4(x + 4 * (k + u * b), v + 4 * u);\n"
    "        for (int j = 0; j < 16; j++) {\n"
    "            double d = (double)capex_go_tof(v[j], I);\n"
    "            acc += d * d;\n"
    "        }\n"
    "    }\n"
    "    for (; k < nv; k += b) {\n"
    "        IT v[4];\n"
    "        capex_go_ld4(x + 4 * k, v);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            double d = (double)capex_go_tof(v[j], I);\n"
    "            acc += d * d;\n"
    "        }\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i + 3 * b < n; i += 4 * b) { /* unaligned: 4 in flight too */\n"
    "        IT v[4];\n"
    "        for (int u = 0; u < 4; u++) v[u] = x[i + u * b];\n"
    "        for (int u = 0; u < 4; u++) {\n"
    "            double d = (double)capex_go_tof(v[u], I);\n"
    "            acc += d * d;\n"
    "        }\n"
    "    }\n"
    "    for (; i < n; i += b) {\n"
    "        double d = (double)capex_go_tof(x[i], I);\n"
    "        acc += d * d;\n"
    "    }\n"
    "    acc = capex_go_bsum(sh, acc);\n"
    "    if (threadIdx.x == 0) a.op.sumsq.partial[c] = acc;\n"
    "}\n";
static const char capex__cuda_frag_go3[] =
    "#if CAPEX_GO_SEL(1) /* amp's norm kernels (capex__cuda_kernel_sel) */\n"
    "/* Segment b: sum of partial[start .. start+count) in a fixed order; writes\n"
    "   it to sumsq[out] and float(sqrt) to norm[out] (0: none) (op.reduce). */\n"
    "CAPEX_GK void capex_go_reduce(capex_go_segs sg, capex_go_args a) {\n"
    "    __shared__ double sh[512];\n"
    "    const double *part = a.op.reduce.partial + sg.start[blockIdx.x];\n"
    "    double acc = 0.0;\n"
    "    long long i = threadIdx.x, c = sg.count[blockIdx.x], b = blockDim.x;\n"
    "    for (; i + 3 * b < c; i += 4 * b) { /* 4 loads in flight, same summation order */\n"
    "        double v0 = part[i], v1 = part[i + b], v2 = part[i + 2 * b], v3 = part[i + 3 * b];\n"
    "        acc += v0; acc += v1; acc += v2; acc += v3;\n"
    "    }\n"
    "    for (; i < c; i += b) acc += part[i];\n"
    "    acc = capex_go_bsum(sh, acc);\n"
    "    if (threadIdx.x == 0) {\n"
    "        if (a.op.reduce.sumsq) a.op.reduce.sumsq[sg.out[blockIdx.x]] = acc;\n"
    "        if (a.op.reduce.norm) a.op.reduce.norm[sg.out[blockIdx.x]] = (float)sqrt(acc);\n"
    "    }\n"
    "}\n"
    "/* Clip by global norm (torch clip_grad_norm_, capex_clip_coef), op.clip:\n"
    "   total = float(sqrt(*sumsq)); coef = min(1, max_norm / (total + 1e-6f)),\n"
    "   1 for a non-finite total (either output 0: none). */\n"
    "CAPEX_GK void capex_go_clip_coef(capex_go_args a) {\n"
    "    const float max_norm = a.op.clip.max_norm;\n"
    "    double sq = *a.op.clip.sumsq;\n"
    "    float total = (float)sqrt(sq), coef = 1.0f;\n"
    "    if (total - total == 0.0f) {\n"
    "        coef = max_norm / (total + 1e-6f);\n"
    "        if (!(coef < 1.0f)) coef = 1.0f;\n"
    "    } else if (sq - sq == 0.0 && max_norm - max_norm == 0.0f) {\n"
    "        coef = 0.0f; /* finite grads, norm beyond f32: PyTorch's max_norm / inf */\n"
    "    }\n"
    "    if (a.op.clip.total) *a.op.clip.total = total;\n"
    "    if (a.op.clip.coef) *a.op.clip.coef = coef;\n"
    "}\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(0) /* the step's */\n"
    "/* One thread per step, before the update kernels (op.prepare): skip =\n"
    "   found_inf or a bad inv_scale / clip_coef; else step += 1 and the group\n"
    "   constants as capex_optim_step computes them. An lr schedule is\n"
    "   capex_go_lr_sched's, launched just before (its own part: the schedule\n"
    "   math is most of this part's compile time). */\n"
    "CAPEX_GK void capex_go_prepare(capex_go_args a) {\n"
    "    capex_go_group *gr = a.op.prepare.groups;\n"
    "    const float *pi = a.op.prepare.inv_scale, *pc = a.op.prepare.clip_coef;\n"
    "    const unsigned *fi = a.op.prepare.found_inf;\n"
    "    float inv = pi ? *pi : 1.0f, cl = pc ? *pc : 1.0f;\n"
    "    float gs = inv * cl;\n"
    "    unsigned skip = (fi && *fi != 0u) || !(inv > 0.0f) || !(cl >= 0.0f) ||\n"
    "                    !(gs - gs == 0.0f);\n"
    "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "    for (int k = 0; k < a.op.prepare.ngroups; k++) {\n"
    "        capex_go_group *g = gr + k;\n"
    "        g->skip = skip;\n"
    "        g->gs = gs;\n"
    "        if (skip) continue;\n"
    "        long long s = g->step + 1;\n"
    "        g->step = s;\n"
    "        g->beta3 = g->grad_averaging ? 1.0f - g->beta1 : 1.0f;\n"
    "        g->bc1 = g->bias_correction ? (float)(1.0 - pow((double)g->beta1, (double)s)) : 1.0f;\n"
    "        g->bc2 = g->bias_correction ? (float)(1.0 - pow((double)g->beta2, (double)s)) : 1.0f;\n"
    "        g->clip_div = 1.0f;\n"
    "        g->first = !g->mom_init ? ~0u : 0u;\n"
    "        if (a.op.prepare.sgd && g->momentum != 0.0f) g->mom_init = 1;\n"
    "        g->wd_on = g->wd != 0.0f ? ~0u : 0u;\n"
    "        g->wd_before = a.op.prepare.wd_after_momentum ? 0u : g->wd_on;\n"
    "        g->wd_after = a.op.prepare.wd_after_momentum ? g->wd_on : 0u;\n"
    "        g->step_lo = (unsigned)((unsigned long long)s & 0xffffffffu);\n"
    "        g->step_hi = (unsigned)((unsigned long long)s >> 32);\n"
    "    }\n"
    "}\n"
    "#endif\n";
/* The lr schedule (its own part, lr_sched): one thread, launched before
   capex_go_prepare with the same arguments when a schedule is attached. */
static const char capex__cuda_frag_golrk[] =
    "/* op.prepare as capex_go_prepare sees it; sched: the schedule's iteration\n"
    "   count, capex__lr_p, base lrs. The count advances on every step, skipped\n"
    "   by found_inf or not (torch's scheduler.step()), but not on one whose\n"
    "   inv_scale / clip_coef capex_optim_step would refuse (nothing counts\n"
    "   there, as on the CPU); on a step prepare will not skip,\n"
    "   groups below sched_groups get lr = capex__lr_eval(base, n) (capex.h's\n"
    "   text), n the count before this step (by_iter) or the group's steps taken\n"
    "   before prepare counts this one. */\n"
    "CAPEX_GK void capex_go_lr_sched(capex_go_args a) {\n"
    "    const float *pi = a.op.prepare.inv_scale, *pc = a.op.prepare.clip_coef;\n"
    "    const unsigned *fi = a.op.prepare.found_inf;\n"
    "    long long *it = (long long *)a.op.prepare.sched;\n"
    "    const capex__lr_p *lp = (const capex__lr_p *)(it + 1);\n"
    "    float inv = pi ? *pi : 1.0f, cl = pc ? *pc : 1.0f, gs = inv * cl;\n"
    "    if (threadIdx.x != 0 || blockIdx.x != 0 || !it) return;\n"
    "    if (!(inv > 0.0f) || !(cl >= 0.0f) || !(gs - gs == 0.0f)) return; /* the CPU refuses: not counted */\n"
    "    long long n = *it;\n"
    "    *it = n + 1;\n"
    "    if (fi && *fi != 0u) return; /* prepare's skip (found_inf): counted */\n"
    "    for (int k = 0; k < a.op.prepare.sched_groups && k < a.op.prepare.ngroups; k++) {\n"
    "        capex_go_group *g = a.op.prepare.groups + k;\n"
    "        g->lr = (float)capex__lr_eval(lp, (double)((const float *)(lp + 1))[k], lp->by_iter ? n : g->step);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go4[] =
    "/* model copy store: mk 1 f16, 2 bf16 (RNE), 3 bf16 stochastic rounding; keys of\n"
    "   the chunk's 2^32-element window and the next (capex__go_mta: chunks <= 2^32) */\n"
    "struct capex_go_sr { unsigned k0, k1, hi0; };\n"
    "CAPEX_DEVICE capex_go_sr capex_go_sr_init(capex_u64 seed, const capex_go_group *g, capex_u64 tensor, capex_u64 off) {\n"
    "    capex_go_sr r;\n"
    "    r.hi0 = (unsigned)(off >> 32);\n"
    "    r.k0 = capex__sr_key((unsigned)seed, (unsigned)(seed >> 32), g->step_lo, g->step_hi, (unsigned)tensor, r.hi0);\n"
    "    r.k1 = capex__sr_key((unsigned)seed, (unsigned)(seed >> 32), g->step_lo, g->step_hi, (unsigned)tensor, r.hi0 + 1u);\n"
    "    return r;\n"
    "}\n"
    "CAPEX_DEVICE capex_u16 capex_go_half(float p, int mk, const capex_go_sr &sr, capex_u64 e) {\n"
    "    if (mk == 1) return capex_f32_to_f16_bits(p);\n"
    "    if (mk == 2) return capex_f32_to_bf16_bits(p);\n"
    "    unsigned key = (unsigned)(e >> 32) == sr.hi0 ? sr.k0 : sr.k1;\n"
    "    return (capex_u16)capex__bf16_round_sr(p, capex__sr_bits(key, (unsigned)e));\n"
    "}\n"
    "/* Adam/AdamW: lists g, p, m, v, model (0: none), tensor index; op.adam. */\n"
    "template <int G, int VW = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_adam(const capex_go_meta<CAPEX_GO_ADAM_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    const capex_go_group *g = a.op.adam.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), w = VW >= 0 ? VW : a.op.adam.w_mode;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.adam.model;\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_ADAM_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_ADAM_P][s] + off, *m = (float *)mt.addr[CAPEX_GO_ADAM_M][s] + off;\n"
    "    float *v = (float *)mt.addr[CAPEX_GO_ADAM_V][s] + off;\n"
    "    capex_u16 *h = (capex_u16 *)mt.addr[CAPEX_GO_ADAM_MODEL][s] + off;\n"
    "    const float gs = g->gs, b1 = g->beta1, b2 = g->beta2, bc1 = g->bc1, bc2 = g->bc2, eps = g->eps, lr = g->lr, wd = g->wd;\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.adam.seed, g, mt.addr[CAPEX_GO_ADAM_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_ADAM_G][s], off, sizeof(GT)) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_P][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_M][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_V][s], off, 4) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_ADAM_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "        GT gg[4]; float pp[4], mm[4], vv[4]; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "        capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp); capex_go_ld4(m + 4 * k, mm); capex_go_ld4(v + 4 * k, vv);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            float gi = capex_go_tof(gg[j], G) * gs;\n"
    "            pp[j] = w ? capex__adam_w_elem(pp[j], gi, &mm[j], &vv[j], b1, b2, bc1, bc2, eps, lr, wd)\n"
    "                      : capex__adam_l2_elem(pp[j], gi, &mm[j], &vv[j], b1, b2, bc1, bc2, eps, lr, wd);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp); capex_go_st4(m + 4 * k, mm); capex_go_st4(v + 4 * k, vv);\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float gi = capex_go_tof(gp[i], G) * gs, mm = m[i], vv = v[i];\n"
    "        float pi = w ? capex__adam_w_elem(p[i], gi, &mm, &vv, b1, b2, bc1, bc2, eps, lr, wd)\n"
    "                     : capex__adam_l2_elem(p[i], gi, &mm, &vv, b1, b2, bc1, bc2, eps, lr, wd);\n"
    "        p[i] = pi; m[i] = mm; v[i] = vv;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go5[] =
    "/* SGD: lists g, p, momentum buffer (0: none), model, tensor index; op.sgd. */\n"
    "template <int G, int VMO = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_sgd(const capex_go_meta<CAPEX_GO_SGD_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    const capex_go_group *g = a.op.sgd.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), mo = VMO >= 0 ? VMO : a.op.sgd.momentum;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.sgd.model;\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_SGD_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_SGD_P][s] + off, *b = (float *)mt.addr[CAPEX_GO_SGD_BUF][s] + off;\n"
    "    capex_u16 *h = (capex_u16 *)mt.addr[CAPEX_GO_SGD_MODEL][s] + off;\n"
    "    const float gs = g->gs, wd = g->wd, mom = g->momentum, damp = g->dampening, lr = g->lr;\n"
    "    const unsigned nes = g->nesterov ? ~0u : 0u, first = g->first, wb = g->wd_before, wa = g->wd_after, won = g->wd_on;\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.sgd.seed, g, mt.addr[CAPEX_GO_SGD_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_SGD_G][s], off, sizeof(GT)) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_SGD_P][s], off, 4) &&\n"
    "                   (!mo || capex_go_al(mt.addr[CAPEX_GO_SGD_BUF][s], off, 4)) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_SGD_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "        GT gg[4]; float pp[4], bb[4] = {0, 0, 0, 0}; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "        capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp);\n"
    "        if (mo) capex_go_ld4(b + 4 * k, bb);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            float gi = capex_go_tof(gg[j], G) * gs;\n"
    "            pp[j] = mo ? capex__sgd_mom_elem(pp[j], gi, &bb[j], wd, mom, damp, lr, nes, first, wb, wa)\n"
    "                       : capex__sgd_elem(pp[j], gi, wd, lr, won);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp);\n"
    "        if (mo) capex_go_st4(b + 4 * k, bb);\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float gi = capex_go_tof(gp[i], G) * gs, bb = mo ? b[i] : 0.0f;\n"
    "        float pi = mo ? capex__sgd_mom_elem(p[i], gi, &bb, wd, mom, damp, lr, nes, first, wb, wa)\n"
    "                      : capex__sgd_elem(p[i], gi, wd, lr, won);\n"
    "        p[i] = pi;\n"
    "        if (mo) b[i] = bb;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go6[] =
    "/* LAMB stage 1: lists g, p, m, v. Moments, and per-chunk sums of p^2 (p\n"
    "   before the update) and u^2 in double -> op.lamb1.p_sumsq[b], u_sumsq[b]. */\n"
    "CAPEX_DEVICE void capex_go_lamb1_elem(float gi, float pk, float *m, float *v, const capex_go_group *g, int w,\n"
    "                                      double *ap, double *au) {\n"
    "    gi = w ? capex__lamb_grad_w(gi, g->clip_div) : capex__lamb_grad_l2(gi, pk, g->clip_div, g->wd);\n"
    "    capex__lamb_moments_elem(gi, m, v, g->beta1, g->beta2, g->beta3);\n"
    "    float u = w ? capex__lamb_update_w(pk, *m, *v, g->bc1, g->bc2, g->eps, g->wd)\n"
    "                : capex__lamb_update_l2(pk, *m, *v, g->bc1, g->bc2, g->eps);\n"
    "    *ap += (double)pk * pk;\n"
    "    *au += (double)u * u;\n"
    "}\n"
    "template <int G, int VW = -1>\n"
    "CAPEX_DEVICE void capex_go_lamb1(const capex_go_meta<CAPEX_GO_LAMB1_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    __shared__ double sh[512];\n"
    "    const capex_go_group *g = a.op.lamb1.group;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), w = VW >= 0 ? VW : a.op.lamb1.w_mode;\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_LAMB1_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_LAMB1_P][s] + off, *m = (float *)mt.addr[CAPEX_GO_LAMB1_M][s] + off;\n"
    "    float *v = (float *)mt.addr[CAPEX_GO_LAMB1_V][s] + off;\n"
    "    const float gs = g->gs;\n"
    "    double ap = 0.0, au = 0.0;\n"
    "    if (!g->skip) {\n"
    "        capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_LAMB1_G][s], off, sizeof(GT)) &&\n"
    "                       capex_go_al(mt.addr[CAPEX_GO_LAMB1_P][s], off, 4) &&\n"
    "                       capex_go_al(mt.addr[CAPEX_GO_LAMB1_M][s], off, 4) &&\n"
    "                       capex_go_al(mt.addr[CAPEX_GO_LAMB1_V][s], off, 4) ? n / 4 : 0;\n"
    "        for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "            GT gg[4]; float pp[4], mm[4], vv[4];\n"
    "            capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp); capex_go_ld4(m + 4 * k, mm); capex_go_ld4(v + 4 * k, vv);\n"
    "            for (int j = 0; j < 4; j++) capex_go_lamb1_elem(capex_go_tof(gg[j], G) * gs, pp[j], &mm[j], &vv[j], g, w, &ap, &au);\n"
    "            capex_go_st4(m + 4 * k, mm); capex_go_st4(v + 4 * k, vv);\n"
    "        }\n"
    "        for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "            float mm = m[i], vv = v[i];\n"
    "            capex_go_lamb1_elem(capex_go_tof(gp[i], G) * gs, p[i], &mm, &vv, g, w, &ap, &au);\n"
    "            m[i] = mm; v[i] = vv;\n"
    "        }\n"
    "    }\n"
    "    ap = capex_go_bsum(sh, ap);\n"
    "    au = capex_go_bsum(sh, au);\n"
    "    if (threadIdx.x == 0) {\n"
    "        a.op.lamb1.p_sumsq[c] = ap;\n"
    "        a.op.lamb1.u_sumsq[c] = au;\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go7[] =
    "/* LAMB global-norm clip (one thread), op.lamb_clip: gnorm =\n"
    "   float(sqrt(*sumsq) * gs); clip_div = gnorm / max_grad_norm when above\n"
    "   it, else 1. */\n"
    "CAPEX_GK void capex_go_lamb_clip(capex_go_args a) {\n"
    "    capex_go_group *gr = a.op.lamb_clip.groups;\n"
    "    const float mx = a.op.lamb_clip.max_grad_norm;\n"
    "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "    CAPEX_NO_UNROLL for (int k = 0; k < a.op.lamb_clip.ngroups; k++) {\n"
    "        float gn = (float)(sqrt(*a.op.lamb_clip.sumsq) * (double)gr[k].gs), cd = 1.0f;\n"
    "        if (mx > 0.0f && gn > mx) cd = gn / mx;\n"
    "        gr[k].clip_div = cd;\n"
    "    }\n"
    "}\n"
    "/* LAMB trust ratio per tensor t (op.lamb_ratio): ratio[t] = lr * |p| / |u|\n"
    "   (Apex) from the sums p_sumsq[t], u_sumsq[t]; lr where it is off. */\n"
    "CAPEX_GK void capex_go_lamb_ratio(capex_go_args a) {\n"
    "    const capex_go_group *gr = a.op.lamb_ratio.groups;\n"
    "    CAPEX_NO_UNROLL for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < a.op.lamb_ratio.ntensors; t += (long long)gridDim.x * blockDim.x) {\n"
    "        const capex_go_group *g = gr + a.op.lamb_ratio.tgroup[t];\n"
    "        float pn = (float)sqrt(a.op.lamb_ratio.p_sumsq[t]), un = (float)sqrt(a.op.lamb_ratio.u_sumsq[t]);\n"
    "        float r = g->lr;\n"
    "        int nv = a.op.lamb_ratio.use_nvlamb;\n"
    "        CAPEX_VARY(nv); /* one copy of the loop, not one per use_nvlamb (a tensor a thread: no bandwidth loop) */\n"
    "        if (nv || g->wd != 0.0f) r = (un != 0.0f && pn != 0.0f) ? g->lr * (pn / un) : g->lr;\n"
    "        a.op.lamb_ratio.ratio[t] = r;\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go8[] =
    "/* LAMB stage 2: lists p, m, v, model, tensor index; p -= ratio[t] * u with u\n"
    "   recomputed from the new m, v (capex.h's choice); op.lamb2. */\n"
    "CAPEX_DEVICE float capex_go_lamb2_elem(float p, float m, float v, const capex_go_group *g, int w, float r) {\n"
    "    float u = w ? capex__lamb_update_w(p, m, v, g->bc1, g->bc2, g->eps, g->wd) : capex__lamb_update_l2(p, m, v, g->bc1, g->bc2, g->eps);\n"
    "    return capex__lamb_apply(p, u, r);\n"
    "}\n"
    "template <int VW = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_lamb2c(const capex_go_meta<CAPEX_GO_LAMB2_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    const capex_go_group *g = a.op.lamb2.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), w = VW >= 0 ? VW : a.op.lamb2.w_mode;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.lamb2.model;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_LAMB2_P][s] + off, *m = (float *)mt.addr[CAPEX_GO_LAMB2_M][s] + off;\n"
    "    float *v = (float *)mt.addr[CAPEX_GO_LAMB2_V][s] + off;\n"
    "    capex_u16 *h = (capex_u16 *)mt.addr[CAPEX_GO_LAMB2_MODEL][s] + off;\n"
    "    const float r = a.op.lamb2.ratio[mt.addr[CAPEX_GO_LAMB2_T][s]];\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.lamb2.seed, g, mt.addr[CAPEX_GO_LAMB2_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_LAMB2_P][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_LAMB2_M][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_LAMB2_V][s], off, 4) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_LAMB2_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "        float pp[4], mm[4], vv[4]; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "        capex_go_ld4(p + 4 * k, pp); capex_go_ld4(m + 4 * k, mm); capex_go_ld4(v + 4 * k, vv);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            pp[j] = capex_go_lamb2_elem(pp[j], mm[j], vv[j], g, w, r);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp);\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float pi = capex_go_lamb2_elem(p[i], m[i], v[i], g, w, r);\n"
    "        p[i] = pi;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n"
    "CAPEX_GK_OCC3 void capex_go_lamb2(capex_go_meta<CAPEX_GO_LAMB2_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_lamb2c<CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go8b[] =
    "/* Loss scaler update on the device (one thread): capex.h's rule\n"
    "   (capex__scaler_rule: growth, backoff, hysteresis, min/max), then steps,\n"
    "   inv_scale = f32(1 / f64(scale)) and found_inf cleared for the next step. */\n"
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK void capex_go_scaler_update(capex_go_args a) {\n"
    "    capex_go_scaler *c = a.op.scaler.state;\n"
    "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "    unsigned fi = c->found_inf != 0u;\n"
    "    if (c->dynamic && fi) {\n"
    "        if (c->hysteresis_tracker > 0) c->hysteresis_tracker--;\n"
    "        c->growth_tracker = 0;\n"
    "        if (c->hysteresis_tracker <= 0) {\n"
    "            float s = (float)((double)c->scale * c->backoff_factor);\n"
    "            if (s < c->min_scale) s = c->min_scale;\n"
    "            c->scale = s;\n"
    "        }\n"
    "    } else if (c->dynamic) {\n"
    "        long long ok = c->growth_tracker + 1;\n"
    "        if (ok == c->growth_interval) {\n"
    "            float s = (float)((double)c->scale * c->growth_factor);\n"
    "            if (s > c->max_scale) s = c->max_scale;\n"
    "            if (s - s == 0.0f) c->scale = s;\n"
    "            c->growth_tracker = 0;\n"
    "        } else {\n"
    "            c->growth_tracker = ok;\n"
    "        }\n"
    "        c->hysteresis_tracker = c->hysteresis;\n"
    "    }\n"
    "    c->steps++;\n"
    "    if (fi) c->skipped_steps++;\n"
    "    c->inv_scale = (float)(1.0 / (double)c->scale);\n"
    "    c->found_inf = 0u;\n"
    "}\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(1)\n"
    "/* ZeRO's global gradient norm (op.znorm), one thread: sumsq is the sum of\n"
    "   squares of the scaled grads over every rank's shard (allreduced).\n"
    "   Non-finite: found_inf = 1 and coef 1; else total = float(sqrt(sumsq)) and\n"
    "   coef = capex_clip_coef(total * inv_scale, max_norm) (capex.h's rule). */\n"
    "CAPEX_GK void capex_go_zero_norm(capex_go_args a) {\n"
    "    double sq = *a.op.znorm.sumsq;\n"
    "    float inv = a.op.znorm.inv_scale ? *a.op.znorm.inv_scale : 1.0f;\n"
    "    float total = (float)sqrt(sq), coef = 1.0f;\n"
    "    if (!(sq - sq == 0.0)) {\n"
    "        if (a.op.znorm.found_inf) *a.op.znorm.found_inf = 1u;\n"
    "    } else {\n"
    "        float t = total * inv;\n"
    "        if (t - t == 0.0f) {\n"
    "            coef = a.op.znorm.max_norm / (t + 1e-6f);\n"
    "            if (!(coef < 1.0f)) coef = 1.0f;\n"
    "        }\n"
    "    }\n"
    "    if (a.op.znorm.total) *a.op.znorm.total = total;\n"
    "    if (a.op.znorm.coef) *a.op.znorm.coef = coef;\n"
    "}\n"
    "#endif\n";
static const char capex__cuda_frag_go10[] =
    "/* NovoGrad pass 1: lists g, tensor index. Per-chunk sum of (g*gs)^2 in\n"
    "   double -> op.novo1.partial[b] (0 on a skipped step). */\n"
    "template <int G> CAPEX_DEVICE void capex_go_novo1(const capex_go_meta<CAPEX_GO_NOVO1_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    __shared__ double sh[512];\n"
    "    const capex_go_group *g = a.op.novo1.group;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n);\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_NOVO1_G][s] + off;\n"
    "    const float gs = g->gs;\n"
    "    double acc = 0.0;\n"
    "    if (!g->skip) {\n"
    "        capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_NOVO1_G][s], off, sizeof(GT)) ? n / 4 : 0, b = blockDim.x;\n"
    "        /* as capex_go_sumsq: 4 strides in flight, the same per-thread order */\n"
    "        for (k = threadIdx.x; k + 3 * b < nv; k += 4 * b) {\n"
    "            GT gg[16];\n"
    "            for (int u = 0; u < 4; u++) capex_go_ld4(gp + 4 * (k + u * b), gg + 4 * u);\n"
    "            for (int j = 0; j < 16; j++) {\n"
    "                double d = (double)(capex_go_tof(gg[j], G) * gs);\n"
    "                acc += d * d;\n"
    "            }\n"
    "        }\n"
    "        for (; k < nv; k += b) {\n"
    "            GT gg[4];\n"
    "            capex_go_ld4(gp + 4 * k, gg);\n"
    "            for (int j = 0; j < 4; j++) {\n"
    "                double d = (double)(capex_go_tof(gg[j], G) * gs);\n"
    "                acc += d * d;\n"
    "            }\n"
    "        }\n"
    "        for (i = 4 * nv + threadIdx.x; i + 3 * b < n; i += 4 * b) {\n"
    "            GT gg[4];\n"
    "            for (int u = 0; u < 4; u++) gg[u] = gp[i + u * b];\n"
    "            for (int u = 0; u < 4; u++) {\n"
    "                double d = (double)(capex_go_tof(gg[u], G) * gs);\n"
    "                acc += d * d;\n"
    "            }\n"
    "        }\n"
    "        for (; i < n; i += b) {\n"
    "            double d = (double)(capex_go_tof(gp[i], G) * gs);\n"
    "            acc += d * d;\n"
    "        }\n"
    "    }\n"
    "    acc = capex_go_bsum(sh, acc);\n"
    "    if (threadIdx.x == 0) a.op.novo1.partial[c] = acc;\n"
    "}\n";
static const char capex__cuda_frag_go11[] =
    "/* NovoGrad pass 2: lists g, p, m, model, tensor index; op.novo2. */\n"
    "template <int G, int VW = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_novo2(const capex_go_meta<CAPEX_GO_NOVO2_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    const capex_go_group *g = a.op.novo2.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), reg = VW >= 0 ? VW : a.op.novo2.reg_inside_moment;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.novo2.model;\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_NOVO2_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_NOVO2_P][s] + off, *m = (float *)mt.addr[CAPEX_GO_NOVO2_M][s] + off;\n"
    "    capex_u16 *h = (capex_u16 *)mt.addr[CAPEX_GO_NOVO2_MODEL][s] + off;\n"
    "    const float gs = g->gs, b1 = g->beta1, b3 = g->beta3, bc1 = g->bc1, lr = g->lr, wd = g->wd;\n"
    "    const float den = a.op.novo2.denom[mt.addr[CAPEX_GO_NOVO2_T][s]];\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.novo2.seed, g, mt.addr[CAPEX_GO_NOVO2_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_NOVO2_G][s], off, sizeof(GT)) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_NOVO2_P][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_NOVO2_M][s], off, 4) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_NOVO2_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "        GT gg[4]; float pp[4], mm[4]; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "        capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp); capex_go_ld4(m + 4 * k, mm);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            float gi = capex_go_tof(gg[j], G) * gs;\n"
    "            pp[j] = reg ? capex__novo_reg_elem(pp[j], gi, &mm[j], b1, b3, bc1, den, lr, wd)\n"
    "                        : capex__novo_mom_elem(pp[j], gi, &mm[j], b1, b3, bc1, den, lr, wd);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp); capex_go_st4(m + 4 * k, mm);\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float gi = capex_go_tof(gp[i], G) * gs, mm = m[i];\n"
    "        float pi = reg ? capex__novo_reg_elem(p[i], gi, &mm, b1, b3, bc1, den, lr, wd)\n"
    "                       : capex__novo_mom_elem(p[i], gi, &mm, b1, b3, bc1, den, lr, wd);\n"
    "        p[i] = pi; m[i] = mm;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go12[] =
    "/* NovoGrad per tensor t, between the passes (op.novo_norm): n2 = sumsq[t],\n"
    "   v[t] blended as Apex (first step: from init_zero ? 0 : |g|), denom[t].\n"
    "   bias_correction2 = sqrt(1 - beta2^step) (a norm). */\n"
    "CAPEX_GK void capex_go_novo_norm(capex_go_args a) {\n"
    "    const capex_go_group *gr = a.op.novo_norm.groups;\n"
    "    CAPEX_NO_UNROLL for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < a.op.novo_norm.ntensors; t += (long long)gridDim.x * blockDim.x) {\n"
    "        const capex_go_group *g = gr + a.op.novo_norm.tgroup[t];\n"
    "        if (g->skip) continue;\n"
    "        float n2 = (float)a.op.novo_norm.sumsq[t], v = a.op.novo_norm.v[t];\n"
    "        float bc2 = g->bias_correction ? (float)sqrt(1.0 - pow((double)g->beta2, (double)g->step)) : 1.0f;\n"
    "        int iz = a.op.novo_norm.init_zero;\n"
    "        CAPEX_VARY(iz); /* one copy of the loop, not one per init_zero (a tensor a thread: no bandwidth loop) */\n"
    "        if (g->step == 1) v = iz ? 0.0f : sqrtf(n2);\n"
    "        v = capex__novo_blend(v, n2, g->beta2);\n"
    "        a.op.novo_norm.v[t] = v;\n"
    "        a.op.novo_norm.denom[t] = capex__novo_denom(v, bc2, g->eps);\n"
    "    }\n"
    "}\n";
/* Adam with amsgrad and Adagrad: one copy of the math (before go13, go14) */
static const char capex__cuda_frag_go13a[] =
    "/* the model copy of 4 elements (e: the first's index), after their math: one mk test\n"
    "   (tested per element, NVVM copied the next elements' math for mk 0) */\n"
    "CAPEX_DEVICE void capex_go_model4(int mk, capex_u16 *h, const float *pp, const capex_go_sr &sr, capex_u64 e) {\n"
    "    if (mk) {\n"
    "        capex_u16 hh[4];\n"
    "        for (int j = 0; j < 4; j++) hh[j] = capex_go_half(pp[j], mk, sr, e + j);\n"
    "        capex_go_st4(h, hh);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go13[] =
    "/* Adam with amsgrad: Adam's lists (g, p, m, v, model, tensor index); the max\n"
    "   buffer of tensor t is op.adam_ams.max_bufs[t] (a table: the lists stay 6\n"
    "   deep). */\n"
    "template <int G, int VW = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_adam_ams(const capex_go_meta<CAPEX_GO_ADAM_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    const capex_go_group *g = a.op.adam_ams.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), w = VW >= 0 ? VW : a.op.adam_ams.w_mode;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.adam_ams.model;\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "    unsigned wm = w ? ~0u : 0u;\n"
    "    if (VW < 0) CAPEX_OPAQUE(wm); /* a run-time mode: one copy of the math (capex__sel) */\n"
    "#endif\n"
    "    capex_u64 xa = a.op.adam_ams.max_bufs[mt.addr[CAPEX_GO_ADAM_T][s]];\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_ADAM_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_ADAM_P][s] + off, *m = (float *)mt.addr[CAPEX_GO_ADAM_M][s] + off;\n"
    "    float *v = (float *)mt.addr[CAPEX_GO_ADAM_V][s] + off;\n"
    "    float *x = (float *)xa + off;\n"
    "    /* no offset on a null pointer */\n"
    "    capex_u16 *h = mk ? (capex_u16 *)mt.addr[CAPEX_GO_ADAM_MODEL][s] + off : (capex_u16 *)0;\n"
    "    const float gs = g->gs, b1 = g->beta1, b2 = g->beta2, bc1 = g->bc1, bc2 = g->bc2, eps = g->eps, lr = g->lr, wd = g->wd;\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.adam_ams.seed, g, mt.addr[CAPEX_GO_ADAM_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_ADAM_G][s], off, sizeof(GT)) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_P][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_M][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAM_V][s], off, 4) && capex_go_al(xa, off, 4) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_ADAM_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        GT gg[4]; float pp[4], mm[4], vv[4], xx[4];\n"
    "#else\n"
    "        GT gg[4]; float pp[4], mm[4], vv[4], xx[4]; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "#endif\n"
    "        capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp); capex_go_ld4(m + 4 * k, mm); capex_go_ld4(v + 4 * k, vv);\n"
    "        capex_go_ld4(x + 4 * k, xx);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            float gi = capex_go_tof(gg[j], G) * gs;\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "            pp[j] = capex__adam_ams_elem(pp[j], gi, &mm[j], &vv[j], &xx[j], b1, b2, bc1, bc2, eps, lr, wd, wm);\n"
    "#else\n"
    "            pp[j] = w ? capex__adam_ams_w_elem(pp[j], gi, &mm[j], &vv[j], &xx[j], b1, b2, bc1, bc2, eps, lr, wd)\n"
    "                      : capex__adam_ams_l2_elem(pp[j], gi, &mm[j], &vv[j], &xx[j], b1, b2, bc1, bc2, eps, lr, wd);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "#endif\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp); capex_go_st4(m + 4 * k, mm); capex_go_st4(v + 4 * k, vv); capex_go_st4(x + 4 * k, xx);\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        capex_go_model4(mk, h + 4 * k, pp, sr, off + 4 * k);\n"
    "#else\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "#endif\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float gi = capex_go_tof(gp[i], G) * gs, mm = m[i], vv = v[i], xx = x[i];\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        float pi = capex__adam_ams_elem(p[i], gi, &mm, &vv, &xx, b1, b2, bc1, bc2, eps, lr, wd, wm);\n"
    "#else\n"
    "        float pi = w ? capex__adam_ams_w_elem(p[i], gi, &mm, &vv, &xx, b1, b2, bc1, bc2, eps, lr, wd)\n"
    "                     : capex__adam_ams_l2_elem(p[i], gi, &mm, &vv, &xx, b1, b2, bc1, bc2, eps, lr, wd);\n"
    "#endif\n"
    "        p[i] = pi; m[i] = mm; v[i] = vv; x[i] = xx;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go14[] =
    "/* Adagrad: lists g, p, sum, model, tensor index; op.adagrad (w_mode:\n"
    "   adagrad_w_mode). clr as capex_optim_step:\n"
    "   f32(lr / (1 + (step-1)*lr_decay)) in double (step already counts this one). */\n"
    "template <int G, int VW = -1, int VMK = -1>\n"
    "CAPEX_DEVICE void capex_go_adagrad(const capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH> &mt, const capex_go_args &a, long long c) {\n"
    "    typedef typename capex_go_ty<G>::T GT;\n"
    "    const capex_go_group *g = a.op.adagrad.group;\n"
    "    if (g->skip) return;\n"
    "    capex_u64 off, n, i, k;\n"
    "    int s = capex_go_block(mt, a.chunk, c, &off, &n), w = VW >= 0 ? VW : a.op.adagrad.w_mode;\n"
    "    int mk = VMK >= 0 ? VMK : a.op.adagrad.model;\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "    unsigned wm = w ? ~0u : 0u;\n"
    "    if (VW < 0) CAPEX_OPAQUE(wm); /* a run-time mode: one copy of the math (capex__sel) */\n"
    "#endif\n"
    "    const GT *gp = (const GT *)mt.addr[CAPEX_GO_ADAGRAD_G][s] + off;\n"
    "    float *p = (float *)mt.addr[CAPEX_GO_ADAGRAD_P][s] + off, *sm = (float *)mt.addr[CAPEX_GO_ADAGRAD_SUM][s] + off;\n"
    "    /* no offset on a null pointer */\n"
    "    capex_u16 *h = mk ? (capex_u16 *)mt.addr[CAPEX_GO_ADAGRAD_MODEL][s] + off : (capex_u16 *)0;\n"
    "    const float gs = g->gs, eps = g->eps, wd = g->wd;\n"
    "    const float clr = (float)((double)g->lr / (1.0 + (double)(g->step - 1) * (double)g->lr_decay));\n"
    "    capex_go_sr sr = capex_go_sr_init(a.op.adagrad.seed, g, mt.addr[CAPEX_GO_ADAGRAD_T][s], off);\n"
    "    capex_u64 nv = capex_go_al(mt.addr[CAPEX_GO_ADAGRAD_G][s], off, sizeof(GT)) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAGRAD_P][s], off, 4) &&\n"
    "                   capex_go_al(mt.addr[CAPEX_GO_ADAGRAD_SUM][s], off, 4) &&\n"
    "                   (!mk || capex_go_al(mt.addr[CAPEX_GO_ADAGRAD_MODEL][s], off, 2)) ? n / 4 : 0;\n"
    "    for (k = threadIdx.x; k < nv; k += blockDim.x) {\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        GT gg[4]; float pp[4], ss[4];\n"
    "#else\n"
    "        GT gg[4]; float pp[4], ss[4]; capex_u16 hh[4] = {0, 0, 0, 0};\n"
    "#endif\n"
    "        capex_go_ld4(gp + 4 * k, gg); capex_go_ld4(p + 4 * k, pp); capex_go_ld4(sm + 4 * k, ss);\n"
    "        for (int j = 0; j < 4; j++) {\n"
    "            float gi = capex_go_tof(gg[j], G) * gs;\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "            pp[j] = capex__adagrad_elem(pp[j], gi, &ss[j], eps, clr, wd, wm);\n"
    "#else\n"
    "            pp[j] = w ? capex__adagrad_w_elem(pp[j], gi, &ss[j], eps, clr, wd) : capex__adagrad_l2_elem(pp[j], gi, &ss[j], eps, clr, wd);\n"
    "            if (mk) hh[j] = capex_go_half(pp[j], mk, sr, off + 4 * k + j);\n"
    "#endif\n"
    "        }\n"
    "        capex_go_st4(p + 4 * k, pp); capex_go_st4(sm + 4 * k, ss);\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        capex_go_model4(mk, h + 4 * k, pp, sr, off + 4 * k);\n"
    "#else\n"
    "        if (mk) capex_go_st4(h + 4 * k, hh);\n"
    "#endif\n"
    "    }\n"
    "    for (i = 4 * nv + threadIdx.x; i < n; i += blockDim.x) {\n"
    "        float gi = capex_go_tof(gp[i], G) * gs, ss = sm[i];\n"
    "#if CAPEX_GO_ONE_COPY\n"
    "        float pi = capex__adagrad_elem(p[i], gi, &ss, eps, clr, wd, wm);\n"
    "#else\n"
    "        float pi = w ? capex__adagrad_w_elem(p[i], gi, &ss, eps, clr, wd) : capex__adagrad_l2_elem(p[i], gi, &ss, eps, clr, wd);\n"
    "#endif\n"
    "        p[i] = pi; sm[i] = ss;\n"
    "        if (mk) h[i] = capex_go_half(pi, mk, sr, off + i);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_go15_ams[] =
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK void capex_go_adam_ams_f32(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam_ams<0, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(1)\n"
    "CAPEX_GK void capex_go_adam_ams_f16(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam_ams<1, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(2)\n"
    "CAPEX_GK void capex_go_adam_ams_bf16(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam_ams<2, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go15_adagrad[] =
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK_OCC3 void capex_go_adagrad_f32(capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adagrad<0, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(1)\n"
    "CAPEX_GK_OCC3 void capex_go_adagrad_f16(capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adagrad<1, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(2)\n"
    "CAPEX_GK_OCC3 void capex_go_adagrad_bf16(capex_go_meta<CAPEX_GO_ADAGRAD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adagrad<2, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n"
    "#endif\n";
/* Template instances: one fragment per part (see capex__cuda_parts). */
/* One sum-of-squares kernel per dtype, each in its dtype's unscale part: a step
   on bf16 grads launches both, and the amp part stays small (first compile). */
static const char capex__cuda_frag_go9_sumsq_f32[] =
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK_OCC4 void capex_go_sumsq_f32(capex_go_meta<CAPEX_GO_SUMSQ_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sumsq<0>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_sumsq_f16[] =
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK_OCC4 void capex_go_sumsq_f16(capex_go_meta<CAPEX_GO_SUMSQ_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sumsq<1>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_sumsq_bf16[] =
    "#if CAPEX_GO_SEL(0)\n"
    "CAPEX_GK_OCC4 void capex_go_sumsq_bf16(capex_go_meta<CAPEX_GO_SUMSQ_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sumsq<2>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_scale_f32[] =
    "#if CAPEX_GO_SEL(1)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f32_f32(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<0, 0, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(2)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f32_f16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<0, 1, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(3)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f32_bf16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<0, 2, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_scale_f16[] =
    "#if CAPEX_GO_SEL(1)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f16_f32(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<1, 0, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(2)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f16_f16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<1, 1, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(3)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_f16_bf16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<1, 2, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_scale_bf16[] =
    "#if CAPEX_GO_SEL(1)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_bf16_f32(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<2, 0, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(2)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_bf16_f16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<2, 1, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n"
    "#if CAPEX_GO_SEL(3)\n"
    "CAPEX_GK_OCC4 void capex_go_scale_bf16_bf16(capex_go_meta<CAPEX_GO_SCALE_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_scale<2, 2, CAPEX_V_WR, CAPEX_V_CLIP>(m, a, c); }\n"
    "#endif\n";
static const char capex__cuda_frag_go9_adam_f32[] =
    "CAPEX_GK_OCC3 void capex_go_adam_f32(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam<0, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_adam_f16[] =
    "CAPEX_GK_OCC3 void capex_go_adam_f16(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam<1, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_adam_bf16[] =
    "CAPEX_GK_OCC3 void capex_go_adam_bf16(capex_go_meta<CAPEX_GO_ADAM_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_adam<2, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_sgd_f32[] =
    "CAPEX_GK_OCC4 void capex_go_sgd_f32(capex_go_meta<CAPEX_GO_SGD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sgd<0, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_sgd_f16[] =
    "CAPEX_GK_OCC4 void capex_go_sgd_f16(capex_go_meta<CAPEX_GO_SGD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sgd<1, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_sgd_bf16[] =
    "CAPEX_GK_OCC4 void capex_go_sgd_bf16(capex_go_meta<CAPEX_GO_SGD_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_sgd<2, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_lamb1_f32[] =
    "CAPEX_GK void capex_go_lamb1_f32(capex_go_meta<CAPEX_GO_LAMB1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_lamb1<0, CAPEX_V_W>(m, a, c); }\n";
static const char capex__cuda_frag_go9_lamb1_f16[] =
    "CAPEX_GK void capex_go_lamb1_f16(capex_go_meta<CAPEX_GO_LAMB1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_lamb1<1, CAPEX_V_W>(m, a, c); }\n";
static const char capex__cuda_frag_go9_lamb1_bf16[] =
    "CAPEX_GK void capex_go_lamb1_bf16(capex_go_meta<CAPEX_GO_LAMB1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_lamb1<2, CAPEX_V_W>(m, a, c); }\n";
static const char capex__cuda_frag_go9_novo_f32[] =
    "CAPEX_GK_OCC4 void capex_go_novo1_f32(capex_go_meta<CAPEX_GO_NOVO1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo1<0>(m, a, c); }\n"
    "CAPEX_GK_OCC3 void capex_go_novo2_f32(capex_go_meta<CAPEX_GO_NOVO2_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo2<0, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_novo_f16[] =
    "CAPEX_GK_OCC4 void capex_go_novo1_f16(capex_go_meta<CAPEX_GO_NOVO1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo1<1>(m, a, c); }\n"
    "CAPEX_GK_OCC3 void capex_go_novo2_f16(capex_go_meta<CAPEX_GO_NOVO2_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo2<1, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";
static const char capex__cuda_frag_go9_novo_bf16[] =
    "CAPEX_GK_OCC4 void capex_go_novo1_bf16(capex_go_meta<CAPEX_GO_NOVO1_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo1<2>(m, a, c); }\n"
    "CAPEX_GK_OCC3 void capex_go_novo2_bf16(capex_go_meta<CAPEX_GO_NOVO2_DEPTH> m, capex_go_args a) { CAPEX_GO_CHUNKS(m) capex_go_novo2<2, CAPEX_V_W, CAPEX_V_MK>(m, a, c); }\n";

CAPEX__PRIVATE const char *capex__cuda_frag_go0_fn(void) { return capex__cuda_frag_go0; }
CAPEX__PRIVATE const char *capex__cuda_frag_go0b_fn(void) { return capex__cuda_frag_go0b; }
CAPEX__PRIVATE const char *capex__cuda_frag_go1_fn(void) { return capex__cuda_frag_go1; }
CAPEX__PRIVATE const char *capex__cuda_frag_go2_fn(void) { return capex__cuda_frag_go2; }
CAPEX__PRIVATE const char *capex__cuda_frag_go2b_fn(void) { return capex__cuda_frag_go2b; }
CAPEX__PRIVATE const char *capex__cuda_frag_go3_fn(void) { return capex__cuda_frag_go3; }
CAPEX__PRIVATE const char *capex__cuda_frag_go4_fn(void) { return capex__cuda_frag_go4; }
CAPEX__PRIVATE const char *capex__cuda_frag_go5_fn(void) { return capex__cuda_frag_go5; }
CAPEX__PRIVATE const char *capex__cuda_frag_go6_fn(void) { return capex__cuda_frag_go6; }
CAPEX__PRIVATE const char *capex__cuda_frag_go7_fn(void) { return capex__cuda_frag_go7; }
CAPEX__PRIVATE const char *capex__cuda_frag_go8_fn(void) { return capex__cuda_frag_go8; }
CAPEX__PRIVATE const char *capex__cuda_frag_go8b_fn(void) { return capex__cuda_frag_go8b; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sumsq_f32_fn(void) { return capex__cuda_frag_go9_sumsq_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sumsq_f16_fn(void) { return capex__cuda_frag_go9_sumsq_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sumsq_bf16_fn(void) { return capex__cuda_frag_go9_sumsq_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_scale_f32_fn(void) { return capex__cuda_frag_go9_scale_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_scale_f16_fn(void) { return capex__cuda_frag_go9_scale_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_scale_bf16_fn(void) { return capex__cuda_frag_go9_scale_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_adam_f32_fn(void) { return capex__cuda_frag_go9_adam_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_adam_f16_fn(void) { return capex__cuda_frag_go9_adam_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_adam_bf16_fn(void) { return capex__cuda_frag_go9_adam_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sgd_f32_fn(void) { return capex__cuda_frag_go9_sgd_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sgd_f16_fn(void) { return capex__cuda_frag_go9_sgd_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_sgd_bf16_fn(void) { return capex__cuda_frag_go9_sgd_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_lamb1_f32_fn(void) { return capex__cuda_frag_go9_lamb1_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_lamb1_f16_fn(void) { return capex__cuda_frag_go9_lamb1_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_lamb1_bf16_fn(void) { return capex__cuda_frag_go9_lamb1_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go10_fn(void) { return capex__cuda_frag_go10; }
CAPEX__PRIVATE const char *capex__cuda_frag_go11_fn(void) { return capex__cuda_frag_go11; }
CAPEX__PRIVATE const char *capex__cuda_frag_go12_fn(void) { return capex__cuda_frag_go12; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_novo_f32_fn(void) { return capex__cuda_frag_go9_novo_f32; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_novo_f16_fn(void) { return capex__cuda_frag_go9_novo_f16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go9_novo_bf16_fn(void) { return capex__cuda_frag_go9_novo_bf16; }
CAPEX__PRIVATE const char *capex__cuda_frag_go13a_fn(void) { return capex__cuda_frag_go13a; }
CAPEX__PRIVATE const char *capex__cuda_frag_go13_fn(void) { return capex__cuda_frag_go13; }
CAPEX__PRIVATE const char *capex__cuda_frag_go14_fn(void) { return capex__cuda_frag_go14; }
CAPEX__PRIVATE const char *capex__cuda_frag_golrk_fn(void) { return capex__cuda_frag_golrk; }
CAPEX__PRIVATE const char *capex__cuda_frag_go15_ams_fn(void) { return capex__cuda_frag_go15_ams; }
CAPEX__PRIVATE const char *capex__cuda_frag_go15_adagrad_fn(void) { return capex__cuda_frag_go15_adagrad; }
/* This section's fragments in program order (after the prelude), for tools
   that compile them elsewhere (tests/test_gpuopt_emu.c runs them on the CPU). */
CAPEX__PRIVATE const capex__cuda_fragment_fn *capex__cuda_go_fragments(size_t *n) {
    static const capex__cuda_fragment_fn f[] = {
        capex__cuda_frag_gomath0_fn, capex__cuda_frag_gomath1_fn, capex__cuda_frag_gomath2_fn, capex__cuda_frag_gomath3_fn,
        capex__cuda_frag_gomath4_fn, capex__cuda_frag_gomath5_fn, capex__cuda_frag_go0_fn, capex__cuda_frag_go0b_fn, capex__cuda_frag_go1_fn,
        capex__cuda_frag_golr_fn, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go3_fn, capex__cuda_frag_golrk_fn, capex__cuda_frag_go4_fn, capex__cuda_frag_go5_fn,
        capex__cuda_frag_go6_fn, capex__cuda_frag_go7_fn, capex__cuda_frag_go8_fn, capex__cuda_frag_go8b_fn,
        capex__cuda_frag_go9_sumsq_f32_fn, capex__cuda_frag_go9_sumsq_f16_fn, capex__cuda_frag_go9_sumsq_bf16_fn,
        capex__cuda_frag_go9_scale_f32_fn, capex__cuda_frag_go9_scale_f16_fn, capex__cuda_frag_go9_scale_bf16_fn, capex__cuda_frag_go9_adam_f32_fn, capex__cuda_frag_go9_adam_f16_fn, capex__cuda_frag_go9_adam_bf16_fn, capex__cuda_frag_go9_sgd_f32_fn, capex__cuda_frag_go9_sgd_f16_fn, capex__cuda_frag_go9_sgd_bf16_fn, capex__cuda_frag_go9_lamb1_f32_fn, capex__cuda_frag_go9_lamb1_f16_fn, capex__cuda_frag_go9_lamb1_bf16_fn,
        capex__cuda_frag_gomath6_fn, capex__cuda_frag_go10_fn, capex__cuda_frag_go11_fn, capex__cuda_frag_go12_fn,
        capex__cuda_frag_go9_novo_f32_fn, capex__cuda_frag_go9_novo_f16_fn,
        capex__cuda_frag_go9_novo_bf16_fn,
        capex__cuda_frag_gomath7_fn, capex__cuda_frag_go13a_fn, capex__cuda_frag_go13_fn, capex__cuda_frag_go14_fn, capex__cuda_frag_go15_ams_fn, capex__cuda_frag_go15_adagrad_fn};
    *n = sizeof f / sizeof f[0];
    return f;
}

/* ==== kernel source fragments and their *_fn getters ==== */
/* ---- norm kernels (NORM) ------------------------------------------------------
   The per-element math comes from capex.h (capex__norm_math_cuda: the
   CAPEX__NORM_MATH text its CPU backend compiles). LayerNorm/RMSNorm: one
   warp per row (block 32 x 4: four rows per block) up to 1024 columns, else
   one block of 256 threads per row; forward loads 4 elements at a time
   (float4 / 8-byte half loads) when cols % 4 == 0 and every pointer is
   16-byte (f32) / 8-byte (half) aligned. Welford per thread, Chan merges by
   __shfl_down_sync then across warps in shared memory; the row's result is
   broadcast from lane 0 so every thread uses the same statistics.
   dweight/dbias: per-part column sums (coalesced over columns) into a
   workspace, summed in part order by a second kernel (deterministic).
   BatchNorm: a block per channel for the reductions, grid-stride loops for
   the elementwise passes; SyncBatchNorm's cross-rank merge runs on the device
   (float64, rank order), so nothing is copied through the host with NCCL. */
static const char capex__cuda_frag_norm_a[] =
    "CAPEX_DEVICE float capex__nm_ld(const void *p, int t, capex_u64 i) {\n"
    "    if (t == 0) return ((const float *)p)[i];\n"
    "    return t == 1 ? capex_f16_bits_to_f32(((const capex_u16 *)p)[i]) : capex_bf16_bits_to_f32(((const capex_u16 *)p)[i]);\n"
    "}\n"
    "CAPEX_DEVICE void capex__nm_st(void *p, int t, capex_u64 i, float v) {\n"
    "    if (t == 0) ((float *)p)[i] = v;\n"
    "    else ((capex_u16 *)p)[i] = t == 1 ? capex_f32_to_f16_bits(v) : capex_f32_to_bf16_bits(v);\n"
    "}\n"
    "CAPEX_DEVICE float capex__nm_h(int t, capex_u32 h) { return t == 1 ? capex_f16_bits_to_f32((capex_u16)h) : capex_bf16_bits_to_f32((capex_u16)h); }\n"
    "CAPEX_DEVICE capex_u32 capex__nm_hs(int t, float v) { return t == 1 ? capex_f32_to_f16_bits(v) : capex_f32_to_bf16_bits(v); }\n"
    "CAPEX_DEVICE void capex__nm_ld4(const void *p, int t, capex_u64 i, float *v) {\n"
    "    if (t == 0) { float4 f = *(const float4 *)((const float *)p + i); v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w; return; }\n"
    "    uint2 u = *(const uint2 *)((const capex_u16 *)p + i);\n"
    "    v[0] = capex__nm_h(t, u.x & 0xffffu); v[1] = capex__nm_h(t, u.x >> 16); v[2] = capex__nm_h(t, u.y & 0xffffu); v[3] = capex__nm_h(t, u.y >> 16);\n"
    "}\n"
    "/* N vectors of 4 at i, i + s, ..., all loaded before any is converted (the\n"
    "   conversions branch: loads after them would wait): N loads in flight */\n"
    "template <int N> CAPEX_DEVICE void capex__nm_ldn(const void *p, int t, capex_u64 i, capex_u64 s, float *v) {\n"
    "    if (t == 0) {\n"
    "        float4 f[N];\n"
    "        for (int r = 0; r < N; r++) f[r] = *(const float4 *)((const float *)p + i + r * s);\n"
    "        for (int r = 0; r < N; r++) { v[4 * r] = f[r].x; v[4 * r + 1] = f[r].y; v[4 * r + 2] = f[r].z; v[4 * r + 3] = f[r].w; }\n"
    "        return;\n"
    "    }\n"
    "    uint2 u[N];\n"
    "    for (int r = 0; r < N; r++) u[r] = *(const uint2 *)((const capex_u16 *)p + i + r * s);\n"
    "    for (int r = 0; r < N; r++) {\n"
    "        v[4 * r] = capex__nm_h(t, u[r].x & 0xffffu); v[4 * r + 1] = capex__nm_h(t, u[r].x >> 16);\n"
    "        v[4 * r + 2] = capex__nm_h(t, u[r].y & 0xffffu); v[4 * r + 3] = capex__nm_h(t, u[r].y >> 16);\n"
    "    }\n"
    "}\n"
    "CAPEX_DEVICE void capex__nm_st4(void *p, int t, capex_u64 i, const float *v) {\n"
    "    if (t == 0) { *(float4 *)((float *)p + i) = make_float4(v[0], v[1], v[2], v[3]); return; }\n"
    "    uint2 u; u.x = capex__nm_hs(t, v[0]) | (capex__nm_hs(t, v[1]) << 16); u.y = capex__nm_hs(t, v[2]) | (capex__nm_hs(t, v[3]) << 16);\n"
    "    *(uint2 *)((capex_u16 *)p + i) = u;\n"
    "}\n"
    "/* Reductions over the blockDim.x threads of a row (blockDim.x == 32, or a multiple of 32 with\n"
    "   blockDim.y == 1); lane 0's result is broadcast to all of them. */\n"
    "CAPEX_DEVICE void capex__nm_reduce3(float *n, float *m, float *q) {\n"
    "    __shared__ float sh[3][33];\n"
    "    for (int off = 16; off > 0; off >>= 1) {\n"
    "        float nb = __shfl_down_sync(0xffffffffu, *n, off), mb = __shfl_down_sync(0xffffffffu, *m, off);\n"
    "        float qb = __shfl_down_sync(0xffffffffu, *q, off);\n"
    "        capex__nm_chan(n, m, q, nb, mb, qb);\n"
    "    }\n"
    "    if (blockDim.x > 32) {\n"
    "        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;\n"
    "        if (lane == 0) { sh[0][warp] = *n; sh[1][warp] = *m; sh[2][warp] = *q; }\n"
    "        __syncthreads();\n"
    "        if (warp == 0) {\n"
    "            *n = lane < nw ? sh[0][lane] : 0.0f; *m = lane < nw ? sh[1][lane] : 0.0f; *q = lane < nw ? sh[2][lane] : 0.0f;\n"
    "            for (int off = 16; off > 0; off >>= 1) {\n"
    "                float nb = __shfl_down_sync(0xffffffffu, *n, off), mb = __shfl_down_sync(0xffffffffu, *m, off);\n"
    "                float qb = __shfl_down_sync(0xffffffffu, *q, off);\n"
    "                capex__nm_chan(n, m, q, nb, mb, qb);\n"
    "            }\n"
    "            if (lane == 0) { sh[0][32] = *n; sh[1][32] = *m; sh[2][32] = *q; }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        *n = sh[0][32]; *m = sh[1][32]; *q = sh[2][32];\n"
    "        __syncthreads();\n"
    "    } else {\n"
    "        *n = __shfl_sync(0xffffffffu, *n, 0); *m = __shfl_sync(0xffffffffu, *m, 0); *q = __shfl_sync(0xffffffffu, *q, 0);\n"
    "    }\n"
    "}\n";

static const char capex__cuda_frag_norm_b0[] =
    "/* Variants (capex__cuda_unit_desc): -DCAPEX_V_XT/_PT/_YT (dtypes) and _RMS fix the\n"
    "   LayerNorm/RMSNorm kernels' arguments of those names to the values the launch\n"
    "   passes (capex__cuda_norm); the tag names them in the image, where the CPU\n"
    "   emulator checks each launch's arguments against it. */\n"
    "#ifndef CAPEX_V_XT\n#define CAPEX_V_XT -1\n#endif\n#ifndef CAPEX_V_PT\n#define CAPEX_V_PT -1\n#endif\n"
    "#ifndef CAPEX_V_YT\n#define CAPEX_V_YT -1\n#endif\n#ifndef CAPEX_V_RMS\n#define CAPEX_V_RMS -1\n#endif\n"
    "#if CAPEX_V_XT >= 0\n"
    "#define CAPEX__NM_TAG2(a, b, c, d) capex_vnorm_##a##_##b##_##c##_##d\n"
    "#define CAPEX__NM_TAG(a, b, c, d) CAPEX__NM_TAG2(a, b, c, d)\n"
    "extern \"C\" __device__ int CAPEX__NM_TAG(CAPEX_V_XT, CAPEX_V_PT, CAPEX_V_YT, CAPEX_V_RMS) = 1;\n"
    "#endif\n"
    "#define CAPEX_NM_FIX(arg, v) arg = (v) >= 0 ? (v) : arg\n"
    "CAPEX_DEVICE void capex__nm_reduce2(float *a, float *b) {\n"
    "    __shared__ float sh2[2][33];\n"
    "    for (int off = 16; off > 0; off >>= 1) { *a += __shfl_down_sync(0xffffffffu, *a, off); *b += __shfl_down_sync(0xffffffffu, *b, off); }\n"
    "    if (blockDim.x > 32) {\n"
    "        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;\n"
    "        if (lane == 0) { sh2[0][warp] = *a; sh2[1][warp] = *b; }\n"
    "        __syncthreads();\n"
    "        if (warp == 0) {\n"
    "            *a = lane < nw ? sh2[0][lane] : 0.0f; *b = lane < nw ? sh2[1][lane] : 0.0f;\n"
    "            for (int off = 16; off > 0; off >>= 1) { *a += __shfl_down_sync(0xffffffffu, *a, off); *b += __shfl_down_sync(0xffffffffu, *b, off); }\n"
    "            if (lane == 0) { sh2[0][32] = *a; sh2[1][32] = *b; }\n"
    "        }\n"
    "        __syncthreads();\n"
    "        *a = sh2[0][32]; *b = sh2[1][32];\n"
    "        __syncthreads();\n"
    "    } else { *a = __shfl_sync(0xffffffffu, *a, 0); *b = __shfl_sync(0xffffffffu, *b, 0); }\n"
    "}\n";
static const char capex__cuda_frag_norm_b1[] =
    "/* LayerNorm (rms 0) / RMSNorm (rms 1) forward; w, b may be NULL; mean_out, rstd_out may be NULL. */\n"
    "CAPEX_KERNEL void capex_norm_fwd(const void *x, int xt, const void *w, const void *b, int pt, void *y, int yt,\n"
    "                                 float *mean_out, float *rstd_out, capex_u64 rows, capex_u64 cols, float eps, int rms, int vec) {\n"
    "    capex_u64 row = (capex_u64)blockIdx.x * blockDim.y + threadIdx.y, base, j, s4 = blockDim.x * 4ull;\n"
    "    float n = 0.0f, m = 0.0f, q = 0.0f, z = 0.0f, var, rstd, v[4], x0;\n"
    "    CAPEX_NM_FIX(xt, CAPEX_V_XT); CAPEX_NM_FIX(pt, CAPEX_V_PT); CAPEX_NM_FIX(yt, CAPEX_V_YT); CAPEX_NM_FIX(rms, CAPEX_V_RMS);\n"
    "    if (row >= rows) return; /* uniform per warp (warp per row) or per block (blockDim.y == 1) */\n"
    "    base = row * cols;\n"
    "    x0 = rms ? 0.0f : capex__nm_ld(x, xt, base); /* Welford on x - x0 (capex.h capex__nm_row_stats) */\n"
    "    if (vec) {\n"
    "        /* 4 strides loaded before any is added: 4 loads in flight per thread\n"
    "           (tests/sass_gate.py holds it), the order of one at a time: the same bits */\n"
    "        for (j = threadIdx.x * 4ull; j + 3 * s4 < cols; j += 4 * s4) {\n"
    "            float u[16];\n"
    "            capex__nm_ldn<4>(x, xt, base + j, s4, u);\n"
    "            for (int k = 0; k < 16; k++) { if (rms) q += u[k] * u[k]; else { n += 1.0f; capex__nm_welford(u[k] - x0, 1.0f / n, &m, &q); } }\n"
    "        }\n"
    "        for (; j < cols; j += s4) {\n"
    "            capex__nm_ld4(x, xt, base + j, v);\n"
    "            for (int k = 0; k < 4; k++) { if (rms) q += v[k] * v[k]; else { n += 1.0f; capex__nm_welford(v[k] - x0, 1.0f / n, &m, &q); } }\n"
    "        }\n"
    "    } else {\n"
    "        for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "            float xv = capex__nm_ld(x, xt, base + j);\n"
    "            if (rms) q += xv * xv; else { n += 1.0f; capex__nm_welford(xv - x0, 1.0f / n, &m, &q); }\n"
    "        }\n"
    "    }\n"
    "    if (rms) { capex__nm_reduce2(&q, &z); m = 0.0f; } else { capex__nm_reduce3(&n, &m, &q); m = x0 + m; }\n"
    "    var = q / (float)cols;\n"
    "    rstd = capex__nm_rstd(var, eps);\n"
    "    if (threadIdx.x == 0) { if (mean_out) mean_out[row] = m; if (rstd_out) rstd_out[row] = rstd; }\n"
    "    if (vec) {\n"
    "        for (j = threadIdx.x * 4ull; j + s4 < cols; j += 2 * s4) { /* 2 strides in flight */\n"
    "            float u[8], wv[8], bv[8];\n"
    "            capex__nm_ldn<2>(x, xt, base + j, s4, u);\n"
    "            if (w) capex__nm_ldn<2>(w, pt, j, s4, wv); else for (int k = 0; k < 8; k++) wv[k] = 1.0f;\n"
    "            if (b) capex__nm_ldn<2>(b, pt, j, s4, bv); else for (int k = 0; k < 8; k++) bv[k] = 0.0f;\n"
    "            for (int k = 0; k < 8; k++) u[k] = rms ? capex__nm_rms_y(u[k], rstd, wv[k]) : capex__nm_ln_y(u[k], m, rstd, wv[k], bv[k]);\n"
    "            for (int r = 0; r < 2; r++) capex__nm_st4(y, yt, base + j + r * s4, u + 4 * r);\n"
    "        }\n"
    "        for (; j < cols; j += s4) {\n"
    "            float wv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, bv[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "            capex__nm_ld4(x, xt, base + j, v);\n"
    "            if (w) capex__nm_ld4(w, pt, j, wv);\n"
    "            if (b) capex__nm_ld4(b, pt, j, bv);\n"
    "            for (int k = 0; k < 4; k++) v[k] = rms ? capex__nm_rms_y(v[k], rstd, wv[k]) : capex__nm_ln_y(v[k], m, rstd, wv[k], bv[k]);\n"
    "            capex__nm_st4(y, yt, base + j, v);\n"
    "        }\n"
    "    } else {\n"
    "        for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "            float xv = capex__nm_ld(x, xt, base + j), wv = w ? capex__nm_ld(w, pt, j) : 1.0f, bv = b ? capex__nm_ld(b, pt, j) : 0.0f;\n"
    "            capex__nm_st(y, yt, base + j, rms ? capex__nm_rms_y(xv, rstd, wv) : capex__nm_ln_y(xv, m, rstd, wv, bv));\n"
    "        }\n"
    "    }\n"
    "}\n";

/* capex_norm_bwd_dx: dx of LayerNorm/RMSNorm (dx may not be NULL; w may be).
   capex_norm_bwd_gamma_part: column partial sums of dy * xhat and dy over rows
   [part*rpp, (part+1)*rpp), part = blockIdx.y.
   vec (cols % 4 == 0; x, dy, dx, w aligned to 4 elements; for the partials the
   workspace to 16 bytes): 4 consecutive columns per load and store (128-bit
   for f32, 64-bit for halves). Each column's partial sums run over the rows in
   the same order either way: dweight/dbias bits do not depend on vec. */
static const char capex__cuda_frag_norm_c[] =
    "CAPEX_KERNEL void capex_norm_bwd_dx(const void *x, int xt, const void *dy, int yt, const void *w, int pt,\n"
    "                                    const float *mean, const float *rstd, void *dx, capex_u64 rows, capex_u64 cols, int rms,\n"
    "                                    int vec) {\n"
    "    capex_u64 row = (capex_u64)blockIdx.x * blockDim.y + threadIdx.y, base, j;\n"
    "    float mu, rs, sg = 0.0f, sgx = 0.0f, mg, mgx, xv[4], dv[4], wv[4] = {1.0f, 1.0f, 1.0f, 1.0f};\n"
    "    CAPEX_NM_FIX(xt, CAPEX_V_XT); CAPEX_NM_FIX(pt, CAPEX_V_PT); CAPEX_NM_FIX(yt, CAPEX_V_YT); CAPEX_NM_FIX(rms, CAPEX_V_RMS);\n"
    "    if (row >= rows) return;\n"
    "    base = row * cols; mu = rms ? 0.0f : mean[row]; rs = rstd[row];\n"
    "    if (vec) {\n"
    "        for (j = threadIdx.x * 4ull; j < cols; j += blockDim.x * 4ull) {\n"
    "            capex__nm_ld4(dy, yt, base + j, dv); capex__nm_ld4(x, xt, base + j, xv);\n"
    "            if (w) capex__nm_ld4(w, pt, j, wv);\n"
    "            for (int k = 0; k < 4; k++) { float g = dv[k] * wv[k], xh = (xv[k] - mu) * rs; sg += g; sgx += g * xh; }\n"
    "        }\n"
    "    } else {\n"
    "        for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "            float g = capex__nm_ld(dy, yt, base + j) * (w ? capex__nm_ld(w, pt, j) : 1.0f);\n"
    "            float xh = (capex__nm_ld(x, xt, base + j) - mu) * rs;\n"
    "            sg += g; sgx += g * xh;\n"
    "        }\n"
    "    }\n"
    "    capex__nm_reduce2(&sg, &sgx);\n"
    "    mg = rms ? 0.0f : sg / (float)cols; mgx = sgx / (float)cols;\n"
    "    if (vec) {\n"
    "        for (j = threadIdx.x * 4ull; j < cols; j += blockDim.x * 4ull) {\n"
    "            capex__nm_ld4(dy, yt, base + j, dv); capex__nm_ld4(x, xt, base + j, xv);\n"
    "            if (w) capex__nm_ld4(w, pt, j, wv);\n"
    "            for (int k = 0; k < 4; k++) xv[k] = capex__nm_ln_dx(dv[k] * wv[k], (xv[k] - mu) * rs, mg, mgx, rs);\n"
    "            capex__nm_st4(dx, xt, base + j, xv);\n"
    "        }\n"
    "        return;\n"
    "    }\n"
    "    for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "        float g = capex__nm_ld(dy, yt, base + j) * (w ? capex__nm_ld(w, pt, j) : 1.0f);\n"
    "        float xh = (capex__nm_ld(x, xt, base + j) - mu) * rs;\n"
    "        capex__nm_st(dx, xt, base + j, capex__nm_ln_dx(g, xh, mg, mgx, rs));\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_norm_c1[] =
    "CAPEX_KERNEL void capex_norm_bwd_gamma_part(const void *x, int xt, const void *dy, int yt, const float *mean,\n"
    "                                            const float *rstd, float *part_w, float *part_b, capex_u64 rows,\n"
    "                                            capex_u64 cols, capex_u64 rpp, int rms, int vec) {\n"
    "    capex_u64 col = (capex_u64)blockIdx.x * blockDim.x + threadIdx.x, r, r0 = (capex_u64)blockIdx.y * rpp, r1;\n"
    "    float sw = 0.0f, sb = 0.0f;\n"
    "    CAPEX_NM_FIX(xt, CAPEX_V_XT); CAPEX_NM_FIX(yt, CAPEX_V_YT); CAPEX_NM_FIX(rms, CAPEX_V_RMS);\n"
    "    r1 = r0 + rpp < rows ? r0 + rpp : rows;\n"
    "    if (vec) {\n"
    "        float vw[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4], xv[4];\n"
    "        col *= 4;\n"
    "        if (col >= cols) return;\n"
    "        for (r = r0; r < r1; r++) {\n"
    "            float mu = rms ? 0.0f : mean[r], rs = rstd[r];\n"
    "            capex__nm_ld4(dy, yt, r * cols + col, d); capex__nm_ld4(x, xt, r * cols + col, xv);\n"
    "            for (int k = 0; k < 4; k++) { vw[k] += d[k] * ((xv[k] - mu) * rs); vb[k] += d[k]; }\n"
    "        }\n"
    "        if (part_w) capex__nm_st4(part_w, 0, blockIdx.y * cols + col, vw);\n"
    "        if (part_b) capex__nm_st4(part_b, 0, blockIdx.y * cols + col, vb);\n"
    "        return;\n"
    "    }\n"
    "    if (col >= cols) return;\n"
    "    for (r = r0; r < r1; r++) {\n"
    "        float d = capex__nm_ld(dy, yt, r * cols + col);\n"
    "        sw += d * ((capex__nm_ld(x, xt, r * cols + col) - (rms ? 0.0f : mean[r])) * rstd[r]);\n"
    "        sb += d;\n"
    "    }\n"
    "    if (part_w) part_w[blockIdx.y * cols + col] = sw;\n"
    "    if (part_b) part_b[blockIdx.y * cols + col] = sb;\n"
    "}\n"
    "CAPEX_KERNEL void capex_norm_bwd_gamma_final(const float *part_w, const float *part_b, capex_u64 nparts,\n"
    "                                             capex_u64 cols, void *dw, void *db, int pt) {\n"
    "    CAPEX_NM_FIX(pt, CAPEX_V_PT);\n"
    "    CAPEX_FOR_EACH(col, cols) {\n"
    "        float sw = 0.0f, sb = 0.0f;\n"
    "        for (capex_u64 p = 0; p < nparts; p++) { if (part_w) sw += part_w[p * cols + col]; if (part_b) sb += part_b[p * cols + col]; }\n"
    "        if (dw) capex__nm_st(dw, pt, col, sw);\n"
    "        if (db) capex__nm_st(db, pt, col, sb);\n"
    "    }\n"
    "}\n";

static const char capex__cuda_frag_norm_d0[] =
    "/* BatchNorm. Element index of (n, ch, s): NCS (n*C + ch)*S + s; NSC (n*S + s)*C + ch. */\n"
    "CAPEX_DEVICE capex_u64 capex__bn_idx(capex_u64 k, capex_u64 ch, capex_u64 C, capex_u64 S, int nsc) {\n"
    "    return nsc ? k * C + ch : ((k / S) * C + ch) * S + k % S; /* k over the channel's N*S values */\n"
    "}\n"
    "CAPEX_DEVICE capex_u64 capex__bn_ch(capex_u64 i, capex_u64 C, capex_u64 S, int nsc) { return nsc ? i % C : (i / S) % C; }\n";
static const char capex__cuda_frag_norm_d1[] =
    "/* Local per-channel (mean, biased var) and the count into pack [mean_hi C, mean_lo C, var C, count_hi, count_lo]\n"
    "   (capex.h capex_syncbn_pack_floats): hi + lo = x0 + m exactly (TwoSum), so the merge sees the mean to 48 bits. */\n"
    "CAPEX_KERNEL void capex_bn_stats(const void *x, int xt, capex_u64 N, capex_u64 C, capex_u64 S, int nsc, float *pack) {\n"
    "    capex_u64 ch = blockIdx.x, M = N * S, cnt = 0;\n"
    "    float n = 0.0f, m = 0.0f, q = 0.0f, x0 = M ? capex__nm_ld(x, xt, capex__bn_idx(0, ch, C, S, nsc)) : 0.0f;\n"
    "    /* Welford on x - x0 (capex.h capex__nm_row_stats). n = f32(count): n += 1.0f stops at 2^24 (a thread's share of over 2^32 values) */\n"
    "    for (capex_u64 k = threadIdx.x; k < M; k += blockDim.x) { n = (float)++cnt; capex__nm_welford(capex__nm_ld(x, xt, capex__bn_idx(k, ch, C, S, nsc)) - x0, 1.0f / n, &m, &q); }\n"
    "    capex__nm_reduce3(&n, &m, &q);\n"
    "    if (threadIdx.x == 0) {\n"
    "        float hi = x0 + m, t = hi - x0, lo = (x0 - (hi - t)) + (m - t);\n"
    "        pack[ch] = hi; pack[C + ch] = hi - hi == 0.0f ? lo : 0.0f; pack[2 * C + ch] = M ? q / (float)M : 0.0f;\n"
    "        if (ch == 0) { pack[3 * C] = (float)(M >> 24); pack[3 * C + 1] = (float)(M & 0xffffffull); }\n"
    "    }\n"
    "}\n"
    "/* Chan's merge of world packs in rank order (float64), invstd, running update (rm NULL: none),\n"
    "   total count into *total. One thread per channel. */\n"
    "CAPEX_KERNEL void capex_bn_merge(const float *g, int world, capex_u64 C, float eps, float momentum, int update,\n"
    "                                 float *mean, float *invstd, void *rm, void *rv, int pt, double *total) {\n"
    "    capex_u64 P = 3 * C + 2;\n"
    "    CAPEX_FOR_EACH(ch, C) {\n"
    "        double n = 0.0, mu = 0.0, q = 0.0;\n"
    "        CAPEX_NO_UNROLL for (int r = 0; r < world; r++) {\n"
    "            const float *p = g + (capex_u64)r * P;\n"
    "            double nb = (double)p[3 * C] * 16777216.0 + (double)p[3 * C + 1], d, N;\n"
    "            if (nb == 0.0) continue;\n"
    "            N = n + nb; d = ((double)p[ch] + (double)p[C + ch]) - mu;\n"
    "            mu += d * nb / N; q += (double)p[2 * C + ch] * nb + d * d * n * nb / N; n = N;\n"
    "        }\n"
    "        float var = n > 0.0 ? (float)(q / n) : 0.0f;\n"
    "        mean[ch] = (float)mu; invstd[ch] = capex__nm_rstd(var, eps);\n"
    "        if (update && rm) {\n"
    "            float unb = (float)((double)var * n / (n - 1.0));\n"
    "            capex__nm_st(rm, pt, ch, (1.0f - momentum) * capex__nm_ld(rm, pt, ch) + momentum * (float)mu);\n"
    "            capex__nm_st(rv, pt, ch, (1.0f - momentum) * capex__nm_ld(rv, pt, ch) + momentum * unb);\n"
    "        }\n"
    "        if (ch == 0) *total = n;\n"
    "    }\n"
    "}\n"
    "CAPEX_KERNEL void capex_bn_eval_stats(const void *rm, const void *rv, int pt, float eps, float *mean, float *invstd, capex_u64 C) {\n"
    "    CAPEX_FOR_EACH(ch, C) { mean[ch] = capex__nm_ld(rm, pt, ch); invstd[ch] = capex__nm_rstd(capex__nm_ld(rv, pt, ch), eps); }\n"
    "}\n"
    "CAPEX_KERNEL void capex_bn_fwd(const void *x, int xt, void *y, int yt, const float *mean, const float *invstd, const void *w,\n"
    "                               const void *b, int pt, capex_u64 total, capex_u64 C, capex_u64 S, int nsc) {\n"
    "    CAPEX_FOR_EACH(i, total) {\n"
    "        capex_u64 ch = capex__bn_ch(i, C, S, nsc);\n"
    "        float wv = w ? capex__nm_ld(w, pt, ch) : 1.0f, bv = b ? capex__nm_ld(b, pt, ch) : 0.0f;\n"
    "        capex__nm_st(y, yt, i, capex__nm_ln_y(capex__nm_ld(x, xt, i), mean[ch], invstd[ch], wv, bv));\n"
    "    }\n"
    "}\n";

static const char capex__cuda_frag_norm_e[] =
    "/* Local sums [sum_dy C, sum_dy_xmu C] (one block per channel) and this rank's dweight/dbias. */\n"
    "CAPEX_KERNEL void capex_bn_bwd_reduce(const void *x, int xt, const void *dy, int yt, const float *mean, const float *invstd,\n"
    "                                      capex_u64 N, capex_u64 C, capex_u64 S, int nsc, float *sums, void *dw, void *db, int pt) {\n"
    "    capex_u64 ch = blockIdx.x, M = N * S;\n"
    "    float s0 = 0.0f, s1 = 0.0f, mu = mean[ch];\n"
    "    for (capex_u64 k = threadIdx.x; k < M; k += blockDim.x) {\n"
    "        capex_u64 i = capex__bn_idx(k, ch, C, S, nsc);\n"
    "        float d = capex__nm_ld(dy, yt, i);\n"
    "        s0 += d; s1 += d * (capex__nm_ld(x, xt, i) - mu);\n"
    "    }\n"
    "    capex__nm_reduce2(&s0, &s1);\n"
    "    if (threadIdx.x == 0) {\n"
    "        sums[ch] = s0; sums[C + ch] = s1;\n"
    "        if (dw) capex__nm_st(dw, pt, ch, s1 * invstd[ch]);\n"
    "        if (db) capex__nm_st(db, pt, ch, s0);\n"
    "    }\n"
    "}\n"
    "/* dx from the (reduced) sums; total NULL: eval, dy * invstd * w (no batch terms: 0 * sum is NaN\n"
    "   for a non-finite sum, which would spread one inf over the channel). */\n"
    "CAPEX_KERNEL void capex_bn_bwd_dx(const void *x, int xt, const void *dy, int yt, void *dx, const float *mean,\n"
    "                                  const float *invstd, const void *w, int pt, const float *sums, const double *total,\n"
    "                                  capex_u64 count, capex_u64 C, capex_u64 S, int nsc) {\n"
    "    float k = total ? (float)(1.0 / *total) : 0.0f;\n"
    "    CAPEX_FOR_EACH(i, count) {\n"
    "        capex_u64 ch = capex__bn_ch(i, C, S, nsc);\n"
    "        float wv = w ? capex__nm_ld(w, pt, ch) : 1.0f, g = capex__nm_ld(dy, yt, i);\n"
    "        capex__nm_st(dx, xt, i, total ? capex__nm_bn_dx(g, capex__nm_ld(x, xt, i) - mean[ch], invstd[ch], wv, sums[ch] * k,\n"
    "                                                        sums[C + ch] * k) : g * (invstd[ch] * wv));\n"
    "    }\n"
    "}\n";

/* Memory-efficient backward (capex_norm_desc.memory_efficient, Apex
   memory_efficient=True): rows of the forward's output y (dtype yt, as dy)
   instead of x, rstd only; xhat = capex__nm_me_xhat(y, w, b) = (y - b) / w
   and sum(g * xhat) as sum(dy * (y - b)) (no division), as capex.h. Kernels
   of their own in a part of their own (norm_bwd_me, variants as norm_bwd's):
   the normal backward's code and compile time stay as they were. A zero w
   gives its column a non-finite dx and dweight (IEEE: --fmad=false, no fast
   math); the CPU refuses it, which needs w on the host. vec as above, with y
   and b aligned too. */
static const char capex__cuda_frag_norm_me[] =
    "/* y and dy (one dtype t) at i + r * s for r < N, every load issued before any\n"
    "   conversion (they branch on t in the part): 2N loads in flight */\n"
    "template <int N> CAPEX_DEVICE void capex__nm_me_ldn(const void *y, const void *dy, int t, capex_u64 i, capex_u64 s, float *yv, float *dv) {\n"
    "    if (t == 0) {\n"
    "        float4 a[N], b[N];\n"
    "        for (int r = 0; r < N; r++) { a[r] = *(const float4 *)((const float *)y + i + r * s); b[r] = *(const float4 *)((const float *)dy + i + r * s); }\n"
    "        for (int r = 0; r < N; r++) {\n"
    "            yv[4 * r] = a[r].x; yv[4 * r + 1] = a[r].y; yv[4 * r + 2] = a[r].z; yv[4 * r + 3] = a[r].w;\n"
    "            dv[4 * r] = b[r].x; dv[4 * r + 1] = b[r].y; dv[4 * r + 2] = b[r].z; dv[4 * r + 3] = b[r].w;\n"
    "        }\n"
    "        return;\n"
    "    }\n"
    "    uint2 a[N], b[N];\n"
    "    for (int r = 0; r < N; r++) { a[r] = *(const uint2 *)((const capex_u16 *)y + i + r * s); b[r] = *(const uint2 *)((const capex_u16 *)dy + i + r * s); }\n"
    "    for (int r = 0; r < N; r++) {\n"
    "        yv[4 * r] = capex__nm_h(t, a[r].x & 0xffffu); yv[4 * r + 1] = capex__nm_h(t, a[r].x >> 16);\n"
    "        yv[4 * r + 2] = capex__nm_h(t, a[r].y & 0xffffu); yv[4 * r + 3] = capex__nm_h(t, a[r].y >> 16);\n"
    "        dv[4 * r] = capex__nm_h(t, b[r].x & 0xffffu); dv[4 * r + 1] = capex__nm_h(t, b[r].x >> 16);\n"
    "        dv[4 * r + 2] = capex__nm_h(t, b[r].y & 0xffffu); dv[4 * r + 3] = capex__nm_h(t, b[r].y >> 16);\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_norm_me1[] =
    "CAPEX_KERNEL void capex_norm_me_dx(const void *y, int yt, const void *dy, const void *w, const void *b, int pt,\n"
    "                                   const float *rstd, void *dx, int xt, capex_u64 rows, capex_u64 cols, int rms, int vec) {\n"
    "    capex_u64 row = (capex_u64)blockIdx.x * blockDim.y + threadIdx.y, base, j;\n"
    "    float rs, sg = 0.0f, sgx = 0.0f, mg, mgx, yv[4], dv[4], wv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, bv[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "    CAPEX_NM_FIX(xt, CAPEX_V_XT); CAPEX_NM_FIX(pt, CAPEX_V_PT); CAPEX_NM_FIX(yt, CAPEX_V_YT); CAPEX_NM_FIX(rms, CAPEX_V_RMS);\n"
    "    if (row >= rows) return;\n"
    "    base = row * cols; rs = rstd[row];\n"
    "    if (vec) {\n"
    "        for (j = threadIdx.x * 4ull; j < cols; j += blockDim.x * 4ull) {\n"
    "            capex__nm_me_ldn<1>(y, dy, yt, base + j, 0, yv, dv);\n"
    "            if (w) capex__nm_ld4(w, pt, j, wv);\n"
    "            if (b) capex__nm_ld4(b, pt, j, bv);\n"
    "            for (int k = 0; k < 4; k++) { sg += dv[k] * wv[k]; sgx += dv[k] * (yv[k] - bv[k]); }\n"
    "        }\n"
    "    } else {\n"
    "        for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "            float d = capex__nm_ld(dy, yt, base + j), wj = w ? capex__nm_ld(w, pt, j) : 1.0f, bj = b ? capex__nm_ld(b, pt, j) : 0.0f;\n"
    "            sg += d * wj; sgx += d * (capex__nm_ld(y, yt, base + j) - bj);\n"
    "        }\n"
    "    }\n"
    "    capex__nm_reduce2(&sg, &sgx);\n"
    "    mg = rms ? 0.0f : sg / (float)cols; mgx = sgx / (float)cols;\n"
    "    if (vec) {\n"
    "        for (j = threadIdx.x * 4ull; j < cols; j += blockDim.x * 4ull) {\n"
    "            capex__nm_me_ldn<1>(y, dy, yt, base + j, 0, yv, dv);\n"
    "            if (w) capex__nm_ld4(w, pt, j, wv);\n"
    "            if (b) capex__nm_ld4(b, pt, j, bv);\n"
    "            for (int k = 0; k < 4; k++) yv[k] = capex__nm_ln_dx(dv[k] * wv[k], capex__nm_me_xhat(yv[k], wv[k], bv[k]), mg, mgx, rs);\n"
    "            capex__nm_st4(dx, xt, base + j, yv);\n"
    "        }\n"
    "        return;\n"
    "    }\n"
    "    for (j = threadIdx.x; j < cols; j += blockDim.x) {\n"
    "        float d = capex__nm_ld(dy, yt, base + j), wj = w ? capex__nm_ld(w, pt, j) : 1.0f, bj = b ? capex__nm_ld(b, pt, j) : 0.0f;\n"
    "        capex__nm_st(dx, xt, base + j, capex__nm_ln_dx(d * wj, capex__nm_me_xhat(capex__nm_ld(y, yt, base + j), wj, bj), mg, mgx, rs));\n"
    "    }\n"
    "}\n";
static const char capex__cuda_frag_norm_me2[] =
    "CAPEX_KERNEL void capex_norm_me_gamma_part(const void *y, int yt, const void *dy, const void *w, const void *b, int pt,\n"
    "                                           float *part_w, float *part_b, capex_u64 rows, capex_u64 cols, capex_u64 rpp, int vec) {\n"
    "    capex_u64 col = (capex_u64)blockIdx.x * blockDim.x + threadIdx.x, r, r0 = (capex_u64)blockIdx.y * rpp, r1;\n"
    "    float sw = 0.0f, sb = 0.0f, wj, bj;\n"
    "    CAPEX_NM_FIX(pt, CAPEX_V_PT); CAPEX_NM_FIX(yt, CAPEX_V_YT);\n"
    "    r1 = r0 + rpp < rows ? r0 + rpp : rows;\n"
    "    if (vec) {\n"
    "        float vw[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[8], yv[8];\n"
    "        float wv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, bv[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "        col *= 4;\n"
    "        if (col >= cols) return;\n"
    "        if (w) capex__nm_ld4(w, pt, col, wv);\n"
    "        if (b) capex__nm_ld4(b, pt, col, bv);\n"
    "        for (r = r0; r + 1 < r1; r += 2) { /* two rows' loads in flight, added in row order: the same bits */\n"
    "            capex__nm_me_ldn<2>(y, dy, yt, r * cols + col, cols, yv, d);\n"
    "            for (int k = 0; k < 8; k++) { vw[k & 3] += d[k] * capex__nm_me_xhat(yv[k], wv[k & 3], bv[k & 3]); vb[k & 3] += d[k]; }\n"
    "        }\n"
    "        if (r < r1) {\n"
    "            capex__nm_me_ldn<1>(y, dy, yt, r * cols + col, 0, yv, d);\n"
    "            for (int k = 0; k < 4; k++) { vw[k] += d[k] * capex__nm_me_xhat(yv[k], wv[k], bv[k]); vb[k] += d[k]; }\n"
    "        }\n"
    "        if (part_w) capex__nm_st4(part_w, 0, blockIdx.y * cols + col, vw);\n"
    "        if (part_b) capex__nm_st4(part_b, 0, blockIdx.y * cols + col, vb);\n"
    "        return;\n"
    "    }\n"
    "    if (col >= cols) return;\n"
    "    wj = w ? capex__nm_ld(w, pt, col) : 1.0f; bj = b ? capex__nm_ld(b, pt, col) : 0.0f;\n"
    "    for (r = r0; r < r1; r++) {\n"
    "        float d = capex__nm_ld(dy, yt, r * cols + col);\n"
    "        sw += d * capex__nm_me_xhat(capex__nm_ld(y, yt, r * cols + col), wj, bj);\n"
    "        sb += d;\n"
    "    }\n"
    "    if (part_w) part_w[blockIdx.y * cols + col] = sw;\n"
    "    if (part_b) part_b[blockIdx.y * cols + col] = sb;\n"
    "}\n";

CAPEX__PRIVATE const char *capex__cuda_frag_norm_a_fn(void) { return capex__cuda_frag_norm_a; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_b0_fn(void) { return capex__cuda_frag_norm_b0; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_b1_fn(void) { return capex__cuda_frag_norm_b1; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_c_fn(void) { return capex__cuda_frag_norm_c; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_c1_fn(void) { return capex__cuda_frag_norm_c1; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_d0_fn(void) { return capex__cuda_frag_norm_d0; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_d1_fn(void) { return capex__cuda_frag_norm_d1; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_e_fn(void) { return capex__cuda_frag_norm_e; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_me_fn(void) { return capex__cuda_frag_norm_me; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_me1_fn(void) { return capex__cuda_frag_norm_me1; }
CAPEX__PRIVATE const char *capex__cuda_frag_norm_me2_fn(void) { return capex__cuda_frag_norm_me2; }

CAPEX__PRIVATE const char *capex__cuda_frag_prelude_fn(void) { return capex__cuda_frag_prelude; }
CAPEX__PRIVATE const char *capex__cuda_frag_basic_fn(void) { return capex__cuda_frag_basic; }

/* The whole program, in order: capex_cuda_builtin_source() (tools compile it as
   host C++; each part below is a subset of it, in the same order). */
static const capex__cuda_fragment_fn capex__cuda_fragments[] = {
    capex__cuda_frag_prelude_fn,
    capex__cuda_frag_basic_fn,
    /* optimizer fragments */
    capex__cuda_frag_gomath0_fn, capex__cuda_frag_gomath1_fn, capex__cuda_frag_gomath2_fn, capex__cuda_frag_gomath3_fn,
    capex__cuda_frag_gomath4_fn, capex__cuda_frag_gomath5_fn,
    capex__cuda_frag_go0_fn, capex__cuda_frag_go0b_fn, capex__cuda_frag_go1_fn, capex__cuda_frag_golr_fn, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go3_fn, capex__cuda_frag_golrk_fn, capex__cuda_frag_go4_fn,
    capex__cuda_frag_go5_fn, capex__cuda_frag_go6_fn, capex__cuda_frag_go7_fn, capex__cuda_frag_go8_fn, capex__cuda_frag_go8b_fn,
    capex__cuda_frag_go9_sumsq_f32_fn, capex__cuda_frag_go9_sumsq_f16_fn, capex__cuda_frag_go9_sumsq_bf16_fn,
        capex__cuda_frag_go9_scale_f32_fn, capex__cuda_frag_go9_scale_f16_fn,
    capex__cuda_frag_go9_scale_bf16_fn, capex__cuda_frag_go9_adam_f32_fn, capex__cuda_frag_go9_adam_f16_fn,
    capex__cuda_frag_go9_adam_bf16_fn, capex__cuda_frag_go9_sgd_f32_fn, capex__cuda_frag_go9_sgd_f16_fn,
    capex__cuda_frag_go9_sgd_bf16_fn, capex__cuda_frag_go9_lamb1_f32_fn, capex__cuda_frag_go9_lamb1_f16_fn,
    capex__cuda_frag_go9_lamb1_bf16_fn, capex__cuda_frag_gomath6_fn, capex__cuda_frag_go10_fn,
    capex__cuda_frag_go11_fn, capex__cuda_frag_go12_fn, capex__cuda_frag_go9_novo_f32_fn,
    capex__cuda_frag_go9_novo_f16_fn, capex__cuda_frag_go9_novo_bf16_fn,
    capex__cuda_frag_gomath7_fn, capex__cuda_frag_go13a_fn, capex__cuda_frag_go13_fn, capex__cuda_frag_go14_fn, capex__cuda_frag_go15_ams_fn, capex__cuda_frag_go15_adagrad_fn,
    /* norm fragments */
    capex__norm_math_cuda, /* capex.h's CAPEX__NORM_MATH, the CPU backend's text */
    capex__cuda_frag_norm_a_fn, capex__cuda_frag_norm_b0_fn, capex__cuda_frag_norm_b1_fn, capex__cuda_frag_norm_c_fn,
    capex__cuda_frag_norm_c1_fn, capex__cuda_frag_norm_d0_fn, capex__cuda_frag_norm_d1_fn, capex__cuda_frag_norm_e_fn,
    capex__cuda_frag_norm_me_fn, capex__cuda_frag_norm_me1_fn, capex__cuda_frag_norm_me2_fn,
};
#define CAPEX__CUDA_N_FRAGMENTS (sizeof capex__cuda_fragments / sizeof capex__cuda_fragments[0])

/* ---- parts: the program split into separately compiled modules ------------
   One NVRTC program for every built-in kernel took seconds (ptxas time grows
   with the kernels: ~0.63 MB of CUBIN), and a training step needs a few
   kernels. So each part below is its own program (the prelude, then its
   fragments in program order), cached on disk and per context on its own,
   compiled when one of its kernels is first launched; capex_cuda_precompile
   compiles all parts on threads. Fragments that only declare types, device
   functions and templates may be in several parts (unused ones produce no
   code); every kernel is defined in exactly one part (tests check both).
   Parts follow what a step uses: the optimizer kernels per gradient dtype. */
enum {
    CAPEX__CP_BASIC, CAPEX__CP_AMP, CAPEX__CP_UNSCALE_F32, CAPEX__CP_UNSCALE_F16, CAPEX__CP_UNSCALE_BF16,
    CAPEX__CP_ADAM_F32, CAPEX__CP_ADAM_F16, CAPEX__CP_ADAM_BF16, CAPEX__CP_SGD_F32, CAPEX__CP_SGD_F16,
    CAPEX__CP_SGD_BF16, CAPEX__CP_LAMB1_F32, CAPEX__CP_LAMB1_F16, CAPEX__CP_LAMB1_BF16, CAPEX__CP_LAMB_RATIO,
    CAPEX__CP_LAMB2, CAPEX__CP_NORM_FWD, CAPEX__CP_NORM_BWD, CAPEX__CP_BN_FWD, CAPEX__CP_BN_BWD,
    CAPEX__CP_NOVO_F32, CAPEX__CP_NOVO_F16, CAPEX__CP_NOVO_BF16, CAPEX__CP_NOVO_NORM,
    CAPEX__CP_ADAM_AMS, CAPEX__CP_ADAGRAD, CAPEX__CP_LR_SCHED, CAPEX__CP_NORM_BWD_ME, CAPEX__CUDA_N_PARTS
};
#define CAPEX__CP_GO                                                                                          \
    capex__cuda_frag_gomath0_fn, capex__cuda_frag_gomath1_fn, capex__cuda_frag_gomath2_fn,                    \
        capex__cuda_frag_gomath3_fn, capex__cuda_frag_gomath4_fn, capex__cuda_frag_gomath5_fn,               \
        capex__cuda_frag_go0_fn, capex__cuda_frag_go0b_fn, capex__cuda_frag_go1_fn
#define CAPEX__CP_NORM capex__norm_math_cuda, capex__cuda_frag_norm_a_fn, capex__cuda_frag_norm_b0_fn
static const capex__cuda_fragment_fn capex__cuda_pf_basic[] = {capex__cuda_frag_basic_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lr_sched[] = {CAPEX__CP_GO, capex__cuda_frag_golr_fn, capex__cuda_frag_golrk_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_amp[] = {CAPEX__CP_GO, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go3_fn,
                                                             capex__cuda_frag_go8b_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_unscale_f32[] = {CAPEX__CP_GO, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go9_sumsq_f32_fn,
    capex__cuda_frag_go9_scale_f32_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_unscale_f16[] = {CAPEX__CP_GO, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go9_sumsq_f16_fn,
    capex__cuda_frag_go9_scale_f16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_unscale_bf16[] = {CAPEX__CP_GO, capex__cuda_frag_go2_fn, capex__cuda_frag_go2b_fn, capex__cuda_frag_go9_sumsq_bf16_fn,
    capex__cuda_frag_go9_scale_bf16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_adam_f32[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go9_adam_f32_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_adam_f16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go9_adam_f16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_adam_bf16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go9_adam_bf16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_sgd_f32[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go5_fn,
                                                                 capex__cuda_frag_go9_sgd_f32_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_sgd_f16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go5_fn,
                                                                 capex__cuda_frag_go9_sgd_f16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_sgd_bf16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go5_fn,
                                                                  capex__cuda_frag_go9_sgd_bf16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lamb1_f32[] = {CAPEX__CP_GO, capex__cuda_frag_go6_fn, capex__cuda_frag_go9_lamb1_f32_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lamb1_f16[] = {CAPEX__CP_GO, capex__cuda_frag_go6_fn, capex__cuda_frag_go9_lamb1_f16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lamb1_bf16[] = {CAPEX__CP_GO, capex__cuda_frag_go6_fn, capex__cuda_frag_go9_lamb1_bf16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lamb_ratio[] = {CAPEX__CP_GO, capex__cuda_frag_go7_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_lamb2[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_go8_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_novo_f32[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_gomath6_fn,
    capex__cuda_frag_go10_fn, capex__cuda_frag_go11_fn, capex__cuda_frag_go9_novo_f32_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_novo_f16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_gomath6_fn,
    capex__cuda_frag_go10_fn, capex__cuda_frag_go11_fn, capex__cuda_frag_go9_novo_f16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_novo_bf16[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_gomath6_fn,
    capex__cuda_frag_go10_fn, capex__cuda_frag_go11_fn, capex__cuda_frag_go9_novo_bf16_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_novo_norm[] = {CAPEX__CP_GO, capex__cuda_frag_gomath6_fn, capex__cuda_frag_go12_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_norm_fwd[] = {CAPEX__CP_NORM, capex__cuda_frag_norm_b1_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_norm_bwd[] = {CAPEX__CP_NORM, capex__cuda_frag_norm_c_fn, capex__cuda_frag_norm_c1_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_norm_bwd_me[] = {CAPEX__CP_NORM, capex__cuda_frag_norm_me_fn, capex__cuda_frag_norm_me1_fn,
                                                                      capex__cuda_frag_norm_me2_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_bn_fwd[] = {CAPEX__CP_NORM, capex__cuda_frag_norm_d0_fn, capex__cuda_frag_norm_d1_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_bn_bwd[] = {CAPEX__CP_NORM, capex__cuda_frag_norm_d0_fn, capex__cuda_frag_norm_e_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_adam_ams[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_gomath7_fn,
    capex__cuda_frag_go13a_fn, capex__cuda_frag_go13_fn, capex__cuda_frag_go15_ams_fn, NULL};
static const capex__cuda_fragment_fn capex__cuda_pf_adagrad[] = {CAPEX__CP_GO, capex__cuda_frag_go4_fn, capex__cuda_frag_gomath7_fn,
    capex__cuda_frag_go13a_fn, capex__cuda_frag_go14_fn, capex__cuda_frag_go15_adagrad_fn, NULL};

typedef struct capex__cuda_part {
    const char *name;                   /* also the NVRTC program name, "capex_builtin_<name>" */
    const capex__cuda_fragment_fn *frags; /* NULL-terminated, after the prelude */
} capex__cuda_part;
static const capex__cuda_part capex__cuda_parts[CAPEX__CUDA_N_PARTS] = {
    {"basic", capex__cuda_pf_basic},           {"amp", capex__cuda_pf_amp},
    {"unscale_f32", capex__cuda_pf_unscale_f32}, {"unscale_f16", capex__cuda_pf_unscale_f16},
    {"unscale_bf16", capex__cuda_pf_unscale_bf16}, {"adam_f32", capex__cuda_pf_adam_f32},
    {"adam_f16", capex__cuda_pf_adam_f16},     {"adam_bf16", capex__cuda_pf_adam_bf16},
    {"sgd_f32", capex__cuda_pf_sgd_f32},       {"sgd_f16", capex__cuda_pf_sgd_f16},
    {"sgd_bf16", capex__cuda_pf_sgd_bf16},     {"lamb1_f32", capex__cuda_pf_lamb1_f32},
    {"lamb1_f16", capex__cuda_pf_lamb1_f16},   {"lamb1_bf16", capex__cuda_pf_lamb1_bf16},
    {"lamb_ratio", capex__cuda_pf_lamb_ratio}, {"lamb2", capex__cuda_pf_lamb2},
    {"norm_fwd", capex__cuda_pf_norm_fwd},     {"norm_bwd", capex__cuda_pf_norm_bwd},
    {"bn_fwd", capex__cuda_pf_bn_fwd},         {"bn_bwd", capex__cuda_pf_bn_bwd},
    {"novo_f32", capex__cuda_pf_novo_f32},     {"novo_f16", capex__cuda_pf_novo_f16},
    {"novo_bf16", capex__cuda_pf_novo_bf16},   {"novo_norm", capex__cuda_pf_novo_norm},
    {"adam_ams", capex__cuda_pf_adam_ams},     {"adagrad", capex__cuda_pf_adagrad},
    {"lr_sched", capex__cuda_pf_lr_sched},     {"norm_bwd_me", capex__cuda_pf_norm_bwd_me},
};

/* The built-in kernels, defined once: (id, kernel name, part that defines it).
   The ids (CAPEX__CK_<id>), the name table (sections index it) and each
   kernel's part are derived from this list; tests check each name against its
   part's image. The order is the launch id order: append, do not reorder
   within a family (CAPEX__GO_K_* add the dtype to a family's first id). */
#define CAPEX__CUDA_KERNELS(X) \
    /* basic kernels */ \
    X(FILL_F32, "capex_fill_f32", BASIC) \
    X(SCALE_F32, "capex_scale_f32", BASIC) \
    X(ADD_F32, "capex_add_f32", BASIC) \
    X(F32_TO_F16, "capex_f32_to_f16", BASIC) \
    X(F16_TO_F32, "capex_f16_to_f32", BASIC) \
    X(F32_TO_BF16, "capex_f32_to_bf16", BASIC) \
    X(BF16_TO_F32, "capex_bf16_to_f32", BASIC) \
    /* optimizer kernels (CAPEX__GO_K_* = id - CAPEX__GO_KBASE) */ \
    X(GO_SCALE_F32_F32, "capex_go_scale_f32_f32", UNSCALE_F32) \
    X(GO_SCALE_F32_F16, "capex_go_scale_f32_f16", UNSCALE_F32) \
    X(GO_SCALE_F32_BF16, "capex_go_scale_f32_bf16", UNSCALE_F32) \
    X(GO_SCALE_F16_F32, "capex_go_scale_f16_f32", UNSCALE_F16) \
    X(GO_SCALE_F16_F16, "capex_go_scale_f16_f16", UNSCALE_F16) \
    X(GO_SCALE_F16_BF16, "capex_go_scale_f16_bf16", UNSCALE_F16) \
    X(GO_SCALE_BF16_F32, "capex_go_scale_bf16_f32", UNSCALE_BF16) \
    X(GO_SCALE_BF16_F16, "capex_go_scale_bf16_f16", UNSCALE_BF16) \
    X(GO_SCALE_BF16_BF16, "capex_go_scale_bf16_bf16", UNSCALE_BF16) \
    X(GO_SUMSQ_F32, "capex_go_sumsq_f32", UNSCALE_F32) \
    X(GO_SUMSQ_F16, "capex_go_sumsq_f16", UNSCALE_F16) \
    X(GO_SUMSQ_BF16, "capex_go_sumsq_bf16", UNSCALE_BF16) \
    X(GO_REDUCE, "capex_go_reduce", AMP) \
    X(GO_CLIP_COEF, "capex_go_clip_coef", AMP) \
    X(GO_PREPARE, "capex_go_prepare", AMP) \
    X(GO_ADAM_F32, "capex_go_adam_f32", ADAM_F32) \
    X(GO_ADAM_F16, "capex_go_adam_f16", ADAM_F16) \
    X(GO_ADAM_BF16, "capex_go_adam_bf16", ADAM_BF16) \
    X(GO_SGD_F32, "capex_go_sgd_f32", SGD_F32) \
    X(GO_SGD_F16, "capex_go_sgd_f16", SGD_F16) \
    X(GO_SGD_BF16, "capex_go_sgd_bf16", SGD_BF16) \
    X(GO_LAMB1_F32, "capex_go_lamb1_f32", LAMB1_F32) \
    X(GO_LAMB1_F16, "capex_go_lamb1_f16", LAMB1_F16) \
    X(GO_LAMB1_BF16, "capex_go_lamb1_bf16", LAMB1_BF16) \
    X(GO_LAMB_CLIP, "capex_go_lamb_clip", LAMB_RATIO) \
    X(GO_LAMB_RATIO, "capex_go_lamb_ratio", LAMB_RATIO) \
    X(GO_LAMB2, "capex_go_lamb2", LAMB2) \
    X(GO_SCALER_UPDATE, "capex_go_scaler_update", AMP) \
    X(GO_NOVO1_F32, "capex_go_novo1_f32", NOVO_F32) \
    X(GO_NOVO1_F16, "capex_go_novo1_f16", NOVO_F16) \
    X(GO_NOVO1_BF16, "capex_go_novo1_bf16", NOVO_BF16) \
    X(GO_NOVO2_F32, "capex_go_novo2_f32", NOVO_F32) \
    X(GO_NOVO2_F16, "capex_go_novo2_f16", NOVO_F16) \
    X(GO_NOVO2_BF16, "capex_go_novo2_bf16", NOVO_BF16) \
    X(GO_NOVO_NORM, "capex_go_novo_norm", NOVO_NORM) \
    /* norm kernels */ \
    X(NORM_FWD, "capex_norm_fwd", NORM_FWD) \
    X(NORM_BWD_DX, "capex_norm_bwd_dx", NORM_BWD) \
    X(NORM_BWD_GAMMA_PART, "capex_norm_bwd_gamma_part", NORM_BWD) \
    X(NORM_BWD_GAMMA_FINAL, "capex_norm_bwd_gamma_final", NORM_BWD) \
    X(BN_STATS, "capex_bn_stats", BN_FWD) \
    X(BN_MERGE, "capex_bn_merge", BN_FWD) \
    X(BN_EVAL_STATS, "capex_bn_eval_stats", BN_FWD) \
    X(BN_FWD, "capex_bn_fwd", BN_FWD) \
    X(BN_BWD_REDUCE, "capex_bn_bwd_reduce", BN_BWD) \
    X(BN_BWD_DX, "capex_bn_bwd_dx", BN_BWD) \
    /* optimizer kernels added later */ \
    X(GO_ADAM_AMS_F32, "capex_go_adam_ams_f32", ADAM_AMS) \
    X(GO_ADAM_AMS_F16, "capex_go_adam_ams_f16", ADAM_AMS) \
    X(GO_ADAM_AMS_BF16, "capex_go_adam_ams_bf16", ADAM_AMS) \
    X(GO_ADAGRAD_F32, "capex_go_adagrad_f32", ADAGRAD) \
    X(GO_ADAGRAD_F16, "capex_go_adagrad_f16", ADAGRAD) \
    X(GO_ADAGRAD_BF16, "capex_go_adagrad_bf16", ADAGRAD) \
    /* ZeRO (capex_cuda_zero) */ \
    X(GO_ZERO_NORM, "capex_go_zero_norm", AMP) \
    X(GO_LR_SCHED, "capex_go_lr_sched", LR_SCHED) \
    /* memory-efficient norm backward */ \
    X(NORM_ME_DX, "capex_norm_me_dx", NORM_BWD_ME) \
    X(NORM_ME_GAMMA_PART, "capex_norm_me_gamma_part", NORM_BWD_ME) \
    /* basic kernels added later */ \
    X(ADD_HALF, "capex_add_half", BASIC)

enum {
#define CAPEX__CK_ID(id, name, part) CAPEX__CK_##id,
    CAPEX__CUDA_KERNELS(CAPEX__CK_ID)
#undef CAPEX__CK_ID
    CAPEX__CK_COUNT
};
static const char *const capex__cuda_builtin_kernels[] = {
#define CAPEX__CK_NAME(id, name, part) name,
    CAPEX__CUDA_KERNELS(CAPEX__CK_NAME)
#undef CAPEX__CK_NAME
};
#define CAPEX__CUDA_N_BUILTIN (sizeof capex__cuda_builtin_kernels / sizeof capex__cuda_builtin_kernels[0])
static const unsigned char capex__cuda_builtin_kernel_part[] = {
#define CAPEX__CK_PART(id, name, part) CAPEX__CP_##part,
    CAPEX__CUDA_KERNELS(CAPEX__CK_PART)
#undef CAPEX__CK_PART
};
typedef char capex__cuda_kernel_parts_ok[sizeof capex__cuda_builtin_kernel_part == CAPEX__CUDA_N_BUILTIN &&
                                         CAPEX__CK_COUNT == CAPEX__CUDA_N_BUILTIN ? 1 : -1];

/* The program and its parts as text, assembled once per process (immutable). */
static char *capex__cuda_builtin_text = NULL;
static char *capex__cuda_part_text[CAPEX__CUDA_N_PARTS];
static char capex__cuda_part_prog[CAPEX__CUDA_N_PARTS][48];
static pthread_once_t capex__cuda_builtin_once = PTHREAD_ONCE_INIT;

/* prelude (when with_prelude) + each fragment + '\n'; NULL when out of memory */
CAPEX__PRIVATE char *capex__cuda_join(const capex__cuda_fragment_fn *f, size_t n, int with_prelude) {
    size_t i, total = 1, at = 0;
    char *s;
    if (with_prelude) total += strlen(capex__cuda_frag_prelude) + 1;
    for (i = 0; i < n; i++) total += strlen(f[i]()) + 1;
    s = (char *)CAPEX_MALLOC(total);
    if (!s) return NULL;
    for (i = 0; i < n + (with_prelude ? 1u : 0u); i++) {
        const char *t = with_prelude ? (i == 0 ? capex__cuda_frag_prelude : f[i - 1]()) : f[i]();
        size_t len = strlen(t);
        memcpy(s + at, t, len);
        at += len;
        s[at++] = '\n';
    }
    s[at] = '\0';
    return s;
}

CAPEX__PRIVATE void capex__cuda_variants_build(void); /* below, with the variants */
CAPEX__PRIVATE void capex__cuda_builtin_build(void) {
    size_t p, n;
    capex__cuda_builtin_text = capex__cuda_join(capex__cuda_fragments, CAPEX__CUDA_N_FRAGMENTS, 0);
    for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) {
        for (n = 0; capex__cuda_parts[p].frags[n]; n++) {}
        capex__cuda_part_text[p] = capex__cuda_join(capex__cuda_parts[p].frags, n, 1);
        capex__cuda_fmt(capex__cuda_part_prog[p], sizeof capex__cuda_part_prog[p], "capex_builtin_%s", capex__cuda_parts[p].name);
    }
    capex__cuda_variants_build();
}

CAPEX_API const char *capex_cuda_builtin_source(void) {
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    return capex__cuda_builtin_text;
}

/* one list for both metadata sizes (capex__cuda_builtin_opts_large adds the -D) */
#define CAPEX__CUDA_BUILTIN_OPTS "-default-device", "--std=c++17", "--fmad=false"
static const char *const capex__cuda_builtin_opts[] = {CAPEX__CUDA_BUILTIN_OPTS};

CAPEX_API const char *const *capex_cuda_builtin_options(int *n_options) {
    if (n_options) *n_options = (int)(sizeof capex__cuda_builtin_opts / sizeof capex__cuda_builtin_opts[0]);
    return capex__cuda_builtin_opts;
}

CAPEX_API int capex_cuda_builtin_part_count(void) { return CAPEX__CUDA_N_PARTS; }

CAPEX_API const char *capex_cuda_builtin_part_name(int part) {
    return part >= 0 && part < CAPEX__CUDA_N_PARTS ? capex__cuda_parts[part].name : NULL;
}

CAPEX_API const char *capex_cuda_builtin_part_source(int part) {
    if (part < 0 || part >= CAPEX__CUDA_N_PARTS) return NULL;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    return capex__cuda_part_text[part];
}

CAPEX_API int capex_cuda_builtin_kernel_part(const char *kernel) {
    size_t k;
    if (!kernel) return -1;
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++)
        if (!strcmp(capex__cuda_builtin_kernels[k], kernel)) return capex__cuda_builtin_kernel_part[k];
    return -1;
}

/* ---- variants: a part specialized to one launch's switches -------------------
   A step's first use of a part compiles a variant instead of the whole part
   (unless the part is loaded or being compiled already): the part's text with
   -D options (capex__cuda_frag_go0b, capex__cuda_frag_norm_b0: CAPEX_V_*) that
   keep only the kernels a launch needs and fix its run-time switches, so NVVM
   and ptxas see far less code (first AdamW step on bf16 grads: issue 18). Same
   text, same math: the same bits (tests/test_gpuopt_emu.c runs each optimizer
   variant's template instance; the CPU emulator checks each norm launch against
   its variant's tag and runs two norm variants' own text, tests/test_norm_gpu.c).
   A unit is a part (0 .. CAPEX__CUDA_N_PARTS-1) or a variant (after them),
   each its own program, disk-cache entry and module; capex_cuda_precompile
   and the public part API compile whole parts only. */
enum {
    CAPEX__CV_ADAM = 0,    /* + 8 grad dtype + 4 w_mode + model (0..3): capex_go_adam_* */
    CAPEX__CV_SCALE = 24,  /* + 4 (3 in + out dtype) + 2 write_out + clip_only: capex_go_scale_* (write_out 0: not fixed) */
    CAPEX__CV_SUMSQ = 60,  /* + dtype: capex_go_sumsq_* alone */
    CAPEX__CV_AMP = 63,    /* + 0: prepare and scaler_update (every step); + 1: reduce, clip_coef, zero_norm */
    CAPEX__CV_AMS = 65,    /* + 8 grad dtype + 4 w_mode + model: capex_go_adam_ams_* (one of the part's three) */
    CAPEX__CV_ADAGRAD = 89, /* the same for capex_go_adagrad_* */
    CAPEX__CV_SGD = 113,   /* + 8 grad dtype + 4 momentum on + model: capex_go_sgd_* */
    CAPEX__CV_LAMB2 = 137, /* + 4 w_mode + model: capex_go_lamb2 */
    CAPEX__CV_LAMB1 = 145, /* + 2 grad dtype + w_mode: capex_go_lamb1_* */
    CAPEX__CV_NORM_FWD = 151, /* + 18 x dtype + 6 param dtype + 2 y (dy) dtype + rms: capex_norm_fwd */
    CAPEX__CV_NORM_BWD = 205, /* the same for the three capex_norm_bwd_* kernels */
    CAPEX__CV_NOVO = 259,  /* + 8 grad dtype + 4 reg_inside_moment + model: capex_go_novo1_* and capex_go_novo2_* */
    CAPEX__CV_NORM_ME = 283, /* as CAPEX__CV_NORM_FWD: the two capex_norm_me_* kernels */
    CAPEX__CUDA_N_VARIANTS = 337
};
#define CAPEX__CUDA_N_UNITS (CAPEX__CUDA_N_PARTS + CAPEX__CUDA_N_VARIANTS)
/* The most kernels a variant holds (norm_bwd's three; tests/test_cuda_jit.c checks it). */
#define CAPEX__CUDA_VAR_MAX_KERNELS 3
/* A launch's switches for capex__cuda_kernel_unit, packed: 0 none (the whole
   part); else 1 | w_mode << 1 | model << 2 | write_out << 4 | clip_only << 5. */
#define CAPEX__CUDA_VB(w, mk, wr, clip) (1u | (unsigned)(w) << 1 | (unsigned)(mk) << 2 | (unsigned)(wr) << 4 | (unsigned)(clip) << 5)
/* The LayerNorm/RMSNorm kernels' switches: 1 | x dtype << 1 | param dtype << 3 |
   y (dy) dtype << 5 | rms << 7, dtypes 0..2 (capex__cuda_norm). */
#define CAPEX__CUDA_NVB(xt, pt, yt, rms) (1u | (unsigned)(xt) << 1 | (unsigned)(pt) << 3 | (unsigned)(yt) << 5 | (unsigned)(rms) << 7)

typedef struct capex__cuda_vdef {
    int part, sel;           /* sel: CAPEX_V_SEL, the kernels' selection bits (capex__cuda_kernel_sel) */
    int w, mk, wr, clip;     /* -1: not fixed */
    int xt, pt, yt, rms;     /* the norm kernels' (-1: not fixed) */
} capex__cuda_vdef;

/* The optimizers whose 24 variants are grad dtype x W (SGD: momentum on;
   NovoGrad: reg_inside_moment) x model kind, v = base + 8 dtype + 4 w + model:
   their three kernels (one per grad dtype) are each alone in a part (part0 +
   dtype), or all three in part0, told apart by selection bit dtype. NovoGrad's
   two passes are two entries with one base: a variant holds both (pass 1 is
   launched with pass 2's switches). */
static const struct { size_t k0; int base, part0, one_part; } capex__cuda_vfam[] = {
    {CAPEX__CK_GO_ADAM_F32, CAPEX__CV_ADAM, CAPEX__CP_ADAM_F32, 0},
    {CAPEX__CK_GO_ADAM_AMS_F32, CAPEX__CV_AMS, CAPEX__CP_ADAM_AMS, 1},
    {CAPEX__CK_GO_ADAGRAD_F32, CAPEX__CV_ADAGRAD, CAPEX__CP_ADAGRAD, 1},
    {CAPEX__CK_GO_SGD_F32, CAPEX__CV_SGD, CAPEX__CP_SGD_F32, 0},
    {CAPEX__CK_GO_NOVO1_F32, CAPEX__CV_NOVO, CAPEX__CP_NOVO_F32, 0},
    {CAPEX__CK_GO_NOVO2_F32, CAPEX__CV_NOVO, CAPEX__CP_NOVO_F32, 0}};
#define CAPEX__CUDA_N_VFAM (sizeof capex__cuda_vfam / sizeof capex__cuda_vfam[0])
/* The family of kernel k (one of its three), or -1. */
CAPEX__PRIVATE int capex__cuda_vfam_of(size_t k) {
    size_t f;
    for (f = 0; f < CAPEX__CUDA_N_VFAM; f++)
        if (k >= capex__cuda_vfam[f].k0 && k < capex__cuda_vfam[f].k0 + 3) return (int)f;
    return -1;
}

CAPEX__PRIVATE capex__cuda_vdef capex__cuda_variant_def(int v) {
    capex__cuda_vdef d;
    size_t f;
    d.part = -1; d.sel = 0; d.w = d.mk = d.wr = d.clip = d.xt = d.pt = d.yt = d.rms = -1;
    for (f = 0; f < CAPEX__CUDA_N_VFAM; f++)
        if (v >= capex__cuda_vfam[f].base && v < capex__cuda_vfam[f].base + 24) {
            int i = v - capex__cuda_vfam[f].base, one = capex__cuda_vfam[f].one_part;
            d.part = capex__cuda_vfam[f].part0 + (one ? 0 : i / 8); d.sel = one ? 1 << (i / 8) : 1; d.w = (i / 4) % 2; d.mk = i % 4;
            return d;
        }
    if (v >= CAPEX__CV_SCALE && v < CAPEX__CV_SUMSQ) {
        int i = v - CAPEX__CV_SCALE, pair = i / 4;
        /* write_out 0 (check only) stays a run-time switch: fixed, ptxas keeps one
           load in flight instead of two (SASS gate's infl, sm_80/90/100) */
        d.part = CAPEX__CP_UNSCALE_F32 + pair / 3; d.sel = 1 << (1 + pair % 3); d.wr = (i / 2) % 2 ? 1 : -1; d.clip = i % 2;
    } else if (v >= CAPEX__CV_SUMSQ && v < CAPEX__CV_AMP) {
        d.part = CAPEX__CP_UNSCALE_F32 + (v - CAPEX__CV_SUMSQ); d.sel = 1;
    } else if (v >= CAPEX__CV_AMP && v < CAPEX__CV_AMS) {
        d.part = CAPEX__CP_AMP; d.sel = 1 << (v - CAPEX__CV_AMP);
    } else if (v >= CAPEX__CV_LAMB2 && v < CAPEX__CV_LAMB1) {
        int i = v - CAPEX__CV_LAMB2;
        d.part = CAPEX__CP_LAMB2; d.sel = 1; d.w = i / 4; d.mk = i % 4;
    } else if (v >= CAPEX__CV_LAMB1 && v < CAPEX__CV_NORM_FWD) {
        int i = v - CAPEX__CV_LAMB1;
        d.part = CAPEX__CP_LAMB1_F32 + i / 2; d.sel = 1; d.w = i % 2;
    } else if (v >= CAPEX__CV_NORM_FWD && v < CAPEX__CV_NOVO) {
        int i = (v - CAPEX__CV_NORM_FWD) % 54; /* every kernel of the part (selection bit 0) */
        d.part = v < CAPEX__CV_NORM_BWD ? CAPEX__CP_NORM_FWD : CAPEX__CP_NORM_BWD; d.sel = 1;
        d.xt = i / 18; d.pt = i / 6 % 3; d.yt = i / 2 % 3; d.rms = i % 2;
    } else if (v >= CAPEX__CV_NORM_ME && v < CAPEX__CV_NORM_ME + 54) {
        int i = v - CAPEX__CV_NORM_ME;
        d.part = CAPEX__CP_NORM_BWD_ME; d.sel = 1;
        d.xt = i / 18; d.pt = i / 6 % 3; d.yt = i / 2 % 3; d.rms = i % 2;
    }
    return d;
}

/* Kernel k's selection bit in its part (the CAPEX_GO_SEL guards of its text). */
CAPEX__PRIVATE int capex__cuda_kernel_sel(size_t k) {
    if (k >= CAPEX__CK_GO_SCALE_F32_F32 && k <= CAPEX__CK_GO_SCALE_BF16_BF16) return 1 + (int)(k - CAPEX__CK_GO_SCALE_F32_F32) % 3;
    int f = capex__cuda_vfam_of(k);
    if (k == CAPEX__CK_GO_REDUCE || k == CAPEX__CK_GO_CLIP_COEF || k == CAPEX__CK_GO_ZERO_NORM) return 1;
    if (f >= 0 && capex__cuda_vfam[f].one_part) return (int)(k - capex__cuda_vfam[f].k0);
    return 0;
}

CAPEX__PRIVATE int capex__cuda_unit_part(int u) {
    return u < CAPEX__CUDA_N_PARTS ? u : capex__cuda_variant_def(u - CAPEX__CUDA_N_PARTS).part;
}

/* Whether unit u defines built-in kernel k. */
CAPEX__PRIVATE int capex__cuda_unit_has(int u, size_t k) {
    if (k >= CAPEX__CUDA_N_BUILTIN || capex__cuda_builtin_kernel_part[k] != capex__cuda_unit_part(u)) return 0;
    return u < CAPEX__CUDA_N_PARTS || ((capex__cuda_variant_def(u - CAPEX__CUDA_N_PARTS).sel >> capex__cuda_kernel_sel(k)) & 1);
}

/* The variant unit a launch of kernel k with switches vb compiles, or its
   part when k has no variant (or vb is 0). */
CAPEX__PRIVATE int capex__cuda_kernel_unit(size_t k, unsigned vb) {
    int v = -1, w = (vb >> 1) & 1, mk = (vb >> 2) & 3, wr = (vb >> 4) & 1, clip = (vb >> 5) & 1, f;
    if (k >= CAPEX__CUDA_N_BUILTIN) return -1;
    if (!vb) return capex__cuda_builtin_kernel_part[k];
    if ((f = capex__cuda_vfam_of(k)) >= 0) v = capex__cuda_vfam[f].base + 8 * (int)(k - capex__cuda_vfam[f].k0) + 4 * w + mk;
    else if (k >= CAPEX__CK_GO_SCALE_F32_F32 && k <= CAPEX__CK_GO_SCALE_BF16_BF16)
        v = CAPEX__CV_SCALE + 4 * (int)(k - CAPEX__CK_GO_SCALE_F32_F32) + 2 * wr + clip;
    else if (k >= CAPEX__CK_GO_SUMSQ_F32 && k <= CAPEX__CK_GO_SUMSQ_BF16) v = CAPEX__CV_SUMSQ + (int)(k - CAPEX__CK_GO_SUMSQ_F32);
    else if (capex__cuda_builtin_kernel_part[k] == CAPEX__CP_AMP) v = CAPEX__CV_AMP + capex__cuda_kernel_sel(k);
    else if (k == CAPEX__CK_GO_LAMB2) v = CAPEX__CV_LAMB2 + 4 * w + mk;
    else if (k >= CAPEX__CK_GO_LAMB1_F32 && k <= CAPEX__CK_GO_LAMB1_BF16) v = CAPEX__CV_LAMB1 + 2 * (int)(k - CAPEX__CK_GO_LAMB1_F32) + w;
    else if ((k >= CAPEX__CK_NORM_FWD && k <= CAPEX__CK_NORM_BWD_GAMMA_FINAL) || k == CAPEX__CK_NORM_ME_DX ||
             k == CAPEX__CK_NORM_ME_GAMMA_PART) {
        int xt = (vb >> 1) & 3, pt = (vb >> 3) & 3, yt = (vb >> 5) & 3;
        if (xt < 3 && pt < 3 && yt < 3) /* else (not a dtype): the whole part */
            v = (k == CAPEX__CK_NORM_FWD ? CAPEX__CV_NORM_FWD : k >= CAPEX__CK_NORM_ME_DX ? CAPEX__CV_NORM_ME : CAPEX__CV_NORM_BWD) +
                18 * xt + 6 * pt + 2 * yt + (int)((vb >> 7) & 1);
    }
    return v < 0 ? capex__cuda_builtin_kernel_part[k] : CAPEX__CUDA_N_PARTS + v;
}

/* The variants' -D options and program names, made once (capex__cuda_builtin_build). */
static char capex__cuda_var_def[CAPEX__CUDA_N_VARIANTS][9][24];
static char capex__cuda_var_prog[CAPEX__CUDA_N_VARIANTS][48];
CAPEX__PRIVATE void capex__cuda_variants_build(void) {
    int v;
    for (v = 0; v < CAPEX__CUDA_N_VARIANTS; v++) {
        capex__cuda_vdef d = capex__cuda_variant_def(v);
        const int val[9] = {d.sel, d.w, d.mk, d.wr, d.clip, d.xt, d.pt, d.yt, d.rms};
        static const char *const name[9] = {"SEL", "W", "MK", "WR", "CLIP", "XT", "PT", "YT", "RMS"};
        int i;
        for (i = 0; i < 9; i++)
            if (val[i] >= 0) capex__cuda_fmt(capex__cuda_var_def[v][i], sizeof capex__cuda_var_def[v][i], "-DCAPEX_V_%s=%d", name[i], val[i]);
        capex__cuda_fmt(capex__cuda_var_prog[v], sizeof capex__cuda_var_prog[v], "capex_builtin_%s_v%d", capex__cuda_parts[d.part].name, v);
    }
}

CAPEX__PRIVATE const char *capex__cuda_unit_name(int u) {
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    return u < CAPEX__CUDA_N_PARTS ? capex__cuda_parts[u].name : capex__cuda_var_prog[u - CAPEX__CUDA_N_PARTS] + 14;
}

/* ---- compiling parts on threads ------------------------------------------------
   NVRTC compiles different programs concurrently (its API is thread-safe per
   program). The calling thread works too; parts are taken heaviest first
   (measured ptxas+front-end cost) so the longest ones do not start last. */
static const unsigned char capex__cuda_part_order[CAPEX__CUDA_N_PARTS] = {
    CAPEX__CP_ADAM_AMS, CAPEX__CP_ADAGRAD, /* three kernels each */
    CAPEX__CP_NORM_FWD, CAPEX__CP_LAMB2, CAPEX__CP_BN_FWD, CAPEX__CP_ADAM_BF16, CAPEX__CP_ADAM_F16, CAPEX__CP_ADAM_F32,
    CAPEX__CP_NORM_BWD, CAPEX__CP_NORM_BWD_ME, CAPEX__CP_SGD_BF16, CAPEX__CP_SGD_F32, CAPEX__CP_LR_SCHED, CAPEX__CP_AMP, CAPEX__CP_UNSCALE_F16,
    CAPEX__CP_LAMB1_F16,
    CAPEX__CP_LAMB_RATIO, CAPEX__CP_BN_BWD, CAPEX__CP_SGD_F16, CAPEX__CP_LAMB1_BF16, CAPEX__CP_LAMB1_F32,
    CAPEX__CP_UNSCALE_BF16, CAPEX__CP_UNSCALE_F32, CAPEX__CP_BASIC, CAPEX__CP_NOVO_F32, CAPEX__CP_NOVO_F16,
    CAPEX__CP_NOVO_BF16, CAPEX__CP_NOVO_NORM};

typedef struct capex__cuda_pjob {
    int part;                    /* the unit: a part, or a variant (capex__cuda_kernel_unit) */
    capex_cuda_cache cache;      /* private copy: the warn-once flag is not thread-safe */
    int use_cache, skip_read;
    int defer;                   /* >= 0: deferred, another process held its entry (capex__cuda_compile_defer) */
    capex_cuda_image img;
    capex_result r;
    char err[2048];
} capex__cuda_pjob;

typedef struct capex__cuda_pool {
    capex__cuda_pjob *jobs;
    int n, next, device_cc, meta_bytes;
    int *deferred, n_deferred, next_deferred; /* jobs deferred, in the order they were */
    pthread_mutex_t lock;
} capex__cuda_pool;

/* The options of built-in part p for a context whose launches carry
   meta_bytes of multi-tensor metadata: the built-in options, and for a part
   with the metadata type (capex__cuda_frag_go0b) -DCAPEX_GO_META=<large> where
   that is the large size. The options are in the cache key: a context never
   finds (in memory or on disk) a module built for the other size. */
static const char *const capex__cuda_builtin_opts_large[] = {
    CAPEX__CUDA_BUILTIN_OPTS, ("-DCAPEX_GO_META=" CAPEX__OPT_XSTR(CAPEX__GO_META_LARGE))};
CAPEX__PRIVATE const char *const *capex__cuda_part_options(int p, int meta_bytes, int *n_options) {
    const capex__cuda_fragment_fn *f;
    if (meta_bytes == CAPEX__GO_META_LARGE)
        for (f = capex__cuda_parts[p].frags; *f; f++)
            if (*f == capex__cuda_frag_go0b_fn) {
                *n_options = (int)(sizeof capex__cuda_builtin_opts_large / sizeof capex__cuda_builtin_opts_large[0]);
                return capex__cuda_builtin_opts_large;
            }
    return capex_cuda_builtin_options(n_options);
}

/* A unit's NVRTC options: its part's (capex__cuda_part_options: the built-in
   ones, and the context's metadata size), then the variant's -D options. The
   one place that makes a built-in compile's option list. */
typedef struct capex__cuda_unit_opts {
    const char *opt[20];
    int n;
} capex__cuda_unit_opts;
CAPEX__PRIVATE void capex__cuda_unit_options(int u, int meta_bytes, capex__cuda_unit_opts *o) {
    int n = 0, i;
    const char *const *base = capex__cuda_part_options(capex__cuda_unit_part(u), meta_bytes, &n);
    o->n = 0;
    for (i = 0; i < n && i < 10; i++) o->opt[o->n++] = base[i];
    if (u >= CAPEX__CUDA_N_PARTS)
        for (i = 0; i < 9; i++)
            if (capex__cuda_var_def[u - CAPEX__CUDA_N_PARTS][i][0]) o->opt[o->n++] = capex__cuda_var_def[u - CAPEX__CUDA_N_PARTS][i];
}

/* The compile of built-in unit u (a part or a variant) for device_cc and
   meta_bytes of launch metadata, through cache (NULL: none); o holds the
   options while d is used. */
CAPEX__PRIVATE void capex__cuda_unit_desc(int u, int device_cc, int meta_bytes, capex_cuda_cache *cache,
                                          capex__cuda_unit_opts *o, capex_cuda_compile_desc *d) {
    int p = capex__cuda_unit_part(u);
    capex_cuda_compile_desc_init(d);
    capex__cuda_unit_options(u, meta_bytes, o);
    d->source = capex__cuda_part_text[p];
    d->name = u < CAPEX__CUDA_N_PARTS ? capex__cuda_part_prog[p] : capex__cuda_var_prog[u - CAPEX__CUDA_N_PARTS];
    d->options = o->opt;
    d->n_options = o->n;
    d->device_cc = device_cc;
    d->cache = cache;
}

/* Compiles (or reads from the disk cache) job j's part: NVRTC only, no CUDA
   call. may_defer: when another process holds the part's cache entry, returns
   1 without waiting (j->defer set), so that the caller compiles other parts
   meanwhile (ranks that precompile the same parts on a cold cache each take
   what nobody holds instead of queueing behind each other); run again, a
   deferred job reads the entry or waits for it. */
CAPEX__PRIVATE int capex__cuda_pjob_run(capex__cuda_pjob *j, int device_cc, int meta_bytes, int may_defer) {
    capex_cuda_compile_desc d;
    capex__cuda_unit_opts o;
    capex__cuda_unit_desc(j->part, device_cc, meta_bytes, j->use_cache ? &j->cache : NULL, &o, &d);
    if (!d.source) j->r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "could not assemble the built-in kernel source");
    else if (may_defer || j->defer >= 0) j->r = capex__cuda_compile_defer(&d, j->skip_read, 1, &j->defer, &j->img);
    else j->r = capex__cuda_compile_ex(&d, j->skip_read, 1, &j->img);
    if (j->r == CAPEX_OK && j->defer >= 0) return 1;
    if (j->r != CAPEX_OK) capex__cuda_fmt(j->err, sizeof j->err, "%s", capex_last_error());
    return 0;
}

/* Takes jobs in order; one whose entry another process holds is deferred and
   run again (reading or waiting) only when no fresh job is left. A thread
   that defers a job loops again, so a deferred job is never left behind. */
CAPEX__PRIVATE void *capex__cuda_pool_work(void *arg) {
    capex__cuda_pool *pool = (capex__cuda_pool *)arg;
    for (;;) {
        capex__cuda_pjob *j = NULL;
        int fresh = 0, i;
        pthread_mutex_lock(&pool->lock);
        if (pool->next < pool->n) {
            i = pool->next++;
            j = &pool->jobs[i];
            fresh = pool->deferred != NULL; /* without the list (no memory): no deferring */
        } else if (pool->next_deferred < pool->n_deferred) {
            i = pool->deferred[pool->next_deferred++];
            j = &pool->jobs[i];
        }
        pthread_mutex_unlock(&pool->lock);
        if (!j) return NULL;
        if (capex__cuda_pjob_run(j, pool->device_cc, pool->meta_bytes, fresh)) {
            pthread_mutex_lock(&pool->lock);
            pool->deferred[pool->n_deferred++] = i;
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

/* Runs jobs[0..n) on up to n_threads threads (<= 0: one per online CPU). */
CAPEX__PRIVATE void capex__cuda_pool_run(capex__cuda_pjob *jobs, int n, int device_cc, int meta_bytes, int n_threads) {
    capex__cuda_pool pool;
    pthread_t th[64];
    int i, started = 0;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > n) n_threads = n;
    if (n_threads > 64) n_threads = 64;
    pool.jobs = jobs;
    pool.n = n;
    pool.next = 0;
    pool.device_cc = device_cc;
    pool.meta_bytes = meta_bytes;
    pool.deferred = n > 0 ? (int *)CAPEX_MALLOC(sizeof(int) * (size_t)n) : NULL;
    pool.n_deferred = pool.next_deferred = 0;
    pthread_mutex_init(&pool.lock, NULL);
    for (i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, capex__cuda_pool_work, &pool) == 0) started++;
    capex__cuda_pool_work(&pool); /* the caller works too (and alone if no thread started) */
    for (i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&pool.lock);
    CAPEX_FREE(pool.deferred);
}

CAPEX__PRIVATE void capex__cuda_pjob_init(capex__cuda_pjob *j, int part, const capex_cuda_cache *cache) {
    memset(j, 0, sizeof *j);
    j->part = part;
    j->defer = -1;
    if (cache && cache->enabled && cache->dir[0]) {
        j->cache = *cache;
        j->cache.warned = 2; /* silent; capex__cuda_compile sets 1 when a write fails or the directory is not trusted */
        j->use_cache = 1;
    }
}

/* Fills jobs for the parts with want[p] set, heaviest first; returns the count. */
CAPEX__PRIVATE int capex__cuda_pool_jobs(capex__cuda_pjob *jobs, const int *want, capex_cuda_cache *cache) {
    int i, n = 0;
    for (i = 0; i < CAPEX__CUDA_N_PARTS; i++) {
        int p = capex__cuda_part_order[i];
        if (!want[p]) continue;
        capex__cuda_pjob_init(&jobs[n++], p, cache);
    }
    return n;
}

/* The first failure (in part order) as the status; one warning for an unwritable cache. */
CAPEX__PRIVATE capex_result capex__cuda_pool_status(capex__cuda_pjob *jobs, int n, capex_cuda_cache *cache) {
    int i, p, write_failed = 0;
    for (i = 0; i < n; i++) write_failed |= jobs[i].use_cache && jobs[i].cache.warned == 1;
    if (write_failed && cache && !cache->warned) {
        capex_result t = capex__cuda_cache_dir_check(cache->dir); /* the reason, when the directory is not trusted */
        if (t != CAPEX_OK && t != CAPEX_ERR_NOT_FOUND)
            capex_log(CAPEX_LOG_WARN, "%s; running without the kernel cache (set CAPEX_CACHE_DIR)", capex_last_error());
        else
            capex_log(CAPEX_LOG_WARN, "could not write kernel cache entries in %s; running without the kernel cache (set CAPEX_CACHE_DIR)",
                      cache->dir);
        capex_clear_error();
        cache->warned = 1;
    }
    for (p = 0; p < CAPEX__CUDA_N_UNITS; p++)
        for (i = 0; i < n; i++)
            if (jobs[i].part == p && jobs[i].r != CAPEX_OK)
                return capex__fail(jobs[i].r, "built-in part '%s': %s", capex__cuda_unit_name(p), jobs[i].err);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_builtin_compile_parts(int device_cc, capex_cuda_cache *cache, int n_threads,
                                                        capex_cuda_image *images) {
    capex__cuda_pjob *jobs;
    int want[CAPEX__CUDA_N_PARTS], i, n;
    capex_result r;
    if (!images) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_builtin_compile_parts: images is NULL");
    memset(images, 0, sizeof *images * CAPEX__CUDA_N_PARTS);
    if (device_cc <= 0)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_builtin_compile_parts: device_cc %d (want e.g. 90 for sm_90)", device_cc);
    if (cache && (r = capex__desc_check(cache->init_tag, CAPEX__TAG_CUDA_CACHE, "capex_cuda_builtin_compile_parts",
                                        "capex_cuda_cache", "capex_cuda_cache_init")) != CAPEX_OK)
        return r;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    jobs = (capex__cuda_pjob *)CAPEX_MALLOC(sizeof *jobs * CAPEX__CUDA_N_PARTS);
    if (!jobs) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_builtin_compile_parts: out of memory");
    for (i = 0; i < CAPEX__CUDA_N_PARTS; i++) want[i] = 1;
    n = capex__cuda_pool_jobs(jobs, want, cache);
    capex__cuda_pool_run(jobs, n, device_cc, CAPEX__GO_META_SMALL, n_threads); /* no context: the 4 KB build */
    r = capex__cuda_pool_status(jobs, n, cache);
    for (i = 0; i < n; i++) {
        if (r == CAPEX_OK) images[jobs[i].part] = jobs[i].img;
        else capex_cuda_image_free(&jobs[i].img);
    }
    CAPEX_FREE(jobs);
    return r;
}

/* ---- contexts ----------------------------------------------------------------- */

struct capex_cuda_module {
    unsigned char key[32];
    void *handle;                /* CUmodule */
    capex_cuda_target target;
    int from_cache;
    capex_cuda_context *ctx;
    struct capex_cuda_module *next;
};

/* Background compiles of one context (see capex__cuda_bg_request below). */
enum { CAPEX__BG_NONE, CAPEX__BG_QUEUED, CAPEX__BG_RUNNING, CAPEX__BG_DONE };
#define CAPEX__BG_MAX_THREADS 64
typedef struct capex__cuda_bg {
    pthread_mutex_t lock;
    pthread_cond_t cv;                       /* a part finished, or a worker left */
    unsigned char state[CAPEX__CUDA_N_UNITS]; /* per unit: parts, then variants */
    unsigned seq[CAPEX__CUDA_N_UNITS];       /* queue order (lowest first) */
    unsigned next_seq;
    capex__cuda_pjob *job[CAPEX__CUDA_N_UNITS]; /* of QUEUED, RUNNING and DONE units (~3 KB each: allocated when queued) */
    pthread_t thread[CAPEX__BG_MAX_THREADS];
    int n_threads, active, stop;             /* threads started (not joined), still working; destroying */
} capex__cuda_bg;

struct capex_cuda_context {
    capex_cuda_device_info info;
    int device;                  /* CUdevice */
    void *cu_ctx;                /* the primary CUcontext */
    int device_cc;
    capex_allocator alloc;
    int has_alloc;
    capex_cuda_cache cache;
    pthread_mutex_t lock;        /* guards modules, part, builtin_fn and cache.warned */
    capex_cuda_module *modules;
    capex_cuda_module *part[CAPEX__CUDA_N_UNITS]; /* built-in units loaded so far: parts, then variants */
    void *builtin_fn[CAPEX__CUDA_N_BUILTIN];      /* set for the kernels of loaded parts */
    int builtin_occ[CAPEX__CUDA_N_BUILTIN];       /* resident blocks per SM (capex__go_dev_grid): 0 not asked, -1 unknown */
    void *var_fn[CAPEX__CUDA_N_VARIANTS][CAPEX__CUDA_VAR_MAX_KERNELS]; /* a loaded variant's kernels (capex__cuda_unit_slot) */
    unsigned char var_spills[CAPEX__CUDA_N_VARIANTS]; /* its image uses local memory here: the part runs it */
    int var_occ[CAPEX__CUDA_N_VARIANTS][CAPEX__CUDA_VAR_MAX_KERNELS]; /* as builtin_occ, per variant kernel */
    int meta_bytes;              /* multi-tensor launch metadata: CAPEX__GO_META_SMALL or _LARGE (capex__cuda_params_choose) */
    capex__cuda_bg bg;           /* background compiles (capex_cuda_precompile_async) */
};

/* ---- background compiles of built-in parts -----------------------------------
   Requests queue parts; worker threads take them (heaviest first) and run
   NVRTC and the disk cache, with no CUDA call and without the context lock, so
   the caller's launches and copies go on. The first thread that needs a part
   (with the context lock held) takes the result and loads the module: a queued
   part it compiles itself, a running one it waits for. Lock order: ctx->lock,
   then bg->lock; workers take only bg->lock. */

/* The queued unit to run next: the first queued, a deferred one (its entry
   held by another process: capex__cuda_pjob_run) only when no other is left. */
CAPEX__PRIVATE int capex__cuda_bg_next_locked(capex__cuda_bg *bg) {
    int p, best = -1, best_deferred = 0;
    for (p = 0; p < CAPEX__CUDA_N_UNITS; p++) {
        int deferred;
        if (bg->state[p] != CAPEX__BG_QUEUED) continue;
        deferred = bg->job[p]->defer >= 0;
        if (best < 0 || deferred < best_deferred || (deferred == best_deferred && bg->seq[p] < bg->seq[best])) {
            best = p;
            best_deferred = deferred;
        }
    }
    return best;
}

/* A background thread must not switch the process's locale: without per-thread
   locales (see capex__cuda_c_numeric_enter) it compiles only if the process is
   in "C" already (the default of any program that never calls setlocale), else
   it leaves the parts to their first use. */
CAPEX__PRIVATE int capex__cuda_bg_may_compile(void) {
    const char *cur;
    if (capex__cuda_c_numeric_per_thread()) return 1;
    cur = setlocale(LC_NUMERIC, NULL);
    return cur && (!strcmp(cur, "C") || !strcmp(cur, "POSIX"));
}

CAPEX__PRIVATE void *capex__cuda_bg_work(void *arg) {
    capex_cuda_context *ctx = (capex_cuda_context *)arg;
    capex__cuda_bg *bg = &ctx->bg;
    int c_ok = capex__cuda_bg_may_compile();
    pthread_mutex_lock(&bg->lock);
    for (;;) {
        int p = c_ok ? capex__cuda_bg_next_locked(bg) : -1, deferred;
        capex__cuda_pjob *job;
        if (p < 0 || bg->stop) break;
        bg->state[p] = CAPEX__BG_RUNNING;
        job = bg->job[p]; /* freed only once DONE (claim, stop) */
        pthread_mutex_unlock(&bg->lock);
        deferred = capex__cuda_pjob_run(job, ctx->device_cc, ctx->meta_bytes, 1);
        pthread_mutex_lock(&bg->lock);
        bg->state[p] = deferred ? CAPEX__BG_QUEUED : CAPEX__BG_DONE; /* deferred: queued again, after the others */
        pthread_cond_broadcast(&bg->cv);
    }
    bg->active--;
    pthread_cond_broadcast(&bg->cv);
    pthread_mutex_unlock(&bg->lock);
    return NULL;
}

/* Queues the units (parts, then variants) with want[u] set that are neither
   loaded nor queued and starts threads for them. Called without ctx->lock. */
CAPEX__PRIVATE void capex__cuda_bg_request(capex_cuda_context *ctx, const int *want, int n_threads) {
    capex__cuda_bg *bg = &ctx->bg;
    capex_cuda_cache cache;
    int loaded[CAPEX__CUDA_N_UNITS], i, queued = 0;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    pthread_mutex_lock(&ctx->lock);
    for (i = 0; i < CAPEX__CUDA_N_UNITS; i++) loaded[i] = ctx->part[i] != NULL;
    cache = ctx->cache;
    pthread_mutex_unlock(&ctx->lock);
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    pthread_mutex_lock(&bg->lock);
    if (bg->stop) {
        pthread_mutex_unlock(&bg->lock);
        return;
    }
    for (i = 0; i < CAPEX__CUDA_N_UNITS; i++) { /* parts heaviest first; variants (lighter) after */
        int p = i < CAPEX__CUDA_N_PARTS ? capex__cuda_part_order[i] : i;
        if (!want[p] || loaded[p] || bg->state[p] != CAPEX__BG_NONE) continue;
        if (!bg->job[p] && (bg->job[p] = (capex__cuda_pjob *)capex__alloc(NULL, sizeof *bg->job[p])) == NULL) continue; /* first use compiles it */
        capex__cuda_pjob_init(bg->job[p], p, &cache);
        bg->state[p] = CAPEX__BG_QUEUED;
        bg->seq[p] = bg->next_seq++;
    }
    for (i = 0; i < CAPEX__CUDA_N_UNITS; i++) queued += bg->state[i] == CAPEX__BG_QUEUED;
    if (bg->active == 0) { /* every earlier worker has left its loop: reclaim their handles */
        for (i = 0; i < bg->n_threads; i++) pthread_join(bg->thread[i], NULL);
        bg->n_threads = 0;
    }
    while (bg->active < n_threads && bg->active < queued && bg->n_threads < CAPEX__BG_MAX_THREADS &&
           pthread_create(&bg->thread[bg->n_threads], NULL, capex__cuda_bg_work, ctx) == 0) {
        bg->n_threads++;
        bg->active++;
    }
    pthread_mutex_unlock(&bg->lock);
}

/* Part p's background result, if any: 1 and *job (its image or error, now the
   caller's), 0 when the caller must compile (never queued, or queued but not
   started: taken off the queue). Waits for a running compile; runs a deferred
   one here (it keeps the lock file that brings the holder's failure). */
CAPEX__PRIVATE int capex__cuda_bg_claim(capex_cuda_context *ctx, int p, capex__cuda_pjob *job) {
    capex__cuda_bg *bg = &ctx->bg;
    int got;
    pthread_mutex_lock(&bg->lock);
    for (;;) { /* a running compile may come back deferred */
        if (bg->state[p] == CAPEX__BG_QUEUED && bg->job[p]->defer >= 0) {
            capex__cuda_pjob *j = bg->job[p];
            bg->state[p] = CAPEX__BG_RUNNING;
            pthread_mutex_unlock(&bg->lock);
            capex__cuda_pjob_run(j, ctx->device_cc, ctx->meta_bytes, 0); /* resumes: reads the entry or waits */
            pthread_mutex_lock(&bg->lock);
            bg->state[p] = CAPEX__BG_DONE;
            pthread_cond_broadcast(&bg->cv);
        } else if (bg->state[p] == CAPEX__BG_RUNNING) {
            pthread_cond_wait(&bg->cv, &bg->lock);
        } else {
            break;
        }
    }
    got = bg->state[p] == CAPEX__BG_DONE;
    if (got) *job = *bg->job[p]; /* the image is now the caller's */
    bg->state[p] = CAPEX__BG_NONE;
    if (bg->job[p]) capex__cuda_defer_drop(&bg->job[p]->defer);
    capex__free(NULL, bg->job[p]);
    bg->job[p] = NULL;
    pthread_mutex_unlock(&bg->lock);
    return got;
}

/* Destroy: no new work, running compiles finish, threads joined, images freed. */
CAPEX__PRIVATE void capex__cuda_bg_stop(capex__cuda_bg *bg) {
    int i;
    pthread_mutex_lock(&bg->lock);
    bg->stop = 1;
    while (bg->active > 0) pthread_cond_wait(&bg->cv, &bg->lock);
    for (i = 0; i < bg->n_threads; i++) pthread_join(bg->thread[i], NULL);
    bg->n_threads = 0;
    for (i = 0; i < CAPEX__CUDA_N_UNITS; i++) {
        if (bg->state[i] == CAPEX__BG_DONE) capex_cuda_image_free(&bg->job[i]->img);
        if (bg->job[i]) capex__cuda_defer_drop(&bg->job[i]->defer);
        capex__free(NULL, bg->job[i]);
        bg->job[i] = NULL;
        bg->state[i] = CAPEX__BG_NONE;
    }
    pthread_mutex_unlock(&bg->lock);
}

#define CAPEX__TAG_CUDA_CONTEXT_DESC CAPEX__TAG('C', 'T', 'X', 'D')
CAPEX_API void capex_cuda_context_desc_init(capex_cuda_context_desc *desc) {
    if (!desc) return;
    memset(desc, 0, sizeof *desc);
    desc->init_tag = CAPEX__TAG_CUDA_CONTEXT_DESC;
    desc->device = -1;
    desc->disk_cache = 1;
}

/* Makes ctx current on this thread (cheap when it already is). */
CAPEX__PRIVATE capex_result capex__cuda_enter(capex_cuda_context *ctx) {
    void *cur = NULL;
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda: context is NULL");
    CAPEX__CU(cuCtxGetCurrent, (&cur), "");
    if (cur != ctx->cu_ctx) CAPEX__CU(cuCtxSetCurrent, (ctx->cu_ctx), "");
    return CAPEX_OK;
}

/* The multi-tensor launch metadata of a context: CAPEX__GO_META_LARGE (32 KB
   of kernel parameters) where the driver (12.1+: driver >= 12010), the GPU
   (sm_70+) and NVRTC (12.1+; older ones refuse kernels over 4 KB of
   parameters) all take it, else CAPEX__GO_META_SMALL. env: CAPEX_CUDA_PARAMS
   ("4096": small whatever the driver; NULL, "" or "auto": as above). nvrtc:
   major * 1000 + minor * 10, 0 when NVRTC is not there (only the disk cache
   can serve then, and large-parameter entries come from a capable NVRTC). */
CAPEX__PRIVATE capex_result capex__cuda_params_choose(const char *env, int driver, int cc, int nvrtc, int *meta_bytes) {
    *meta_bytes = CAPEX__GO_META_SMALL;
    if (env && env[0] && strcmp(env, "auto") != 0) {
        if (!strcmp(env, "4096")) return CAPEX_OK;
        return capex__fail(CAPEX_ERR_CONFIG, "CAPEX_CUDA_PARAMS='%s': want 4096 (4 KB kernel parameters, as before CUDA "
                           "12.1) or auto (32 KB where the driver, the GPU and NVRTC take them)", env);
    }
    if (driver >= 12010 && cc >= 70 && (nvrtc == 0 || nvrtc >= 12010)) *meta_bytes = CAPEX__GO_META_LARGE;
    return CAPEX_OK;
}

/* capex__cuda_params_choose for ctx; NVRTC is loaded only when the rest allows 32 KB. */
CAPEX__PRIVATE capex_result capex__cuda_params_pick(capex_cuda_context *ctx) {
    const char *env = getenv("CAPEX_CUDA_PARAMS");
    capex__cuda_nvrtc_lib *n;
    capex_result r = capex__cuda_params_choose(env, capex__cuda_drv.version, ctx->device_cc, 0, &ctx->meta_bytes);
    if (r != CAPEX_OK || ctx->meta_bytes == CAPEX__GO_META_SMALL) return r;
    if ((n = capex__cuda_nvrtc(&r)) == NULL) capex_clear_error(); /* compiles report it */
    r = capex__cuda_params_choose(env, capex__cuda_drv.version, ctx->device_cc, n ? n->major * 1000 + n->minor * 10 : 0,
                                  &ctx->meta_bytes);
    capex_log(CAPEX_LOG_INFO, "capex_cuda: multi-tensor launches take %d bytes of kernel parameters (driver %d, sm_%d, NVRTC %d)",
              ctx->meta_bytes == CAPEX__GO_META_LARGE ? 32764 : 4096, capex__cuda_drv.version, ctx->device_cc,
              n ? n->major * 1000 + n->minor * 10 : 0);
    return r;
}

CAPEX_API capex_result capex_cuda_context_create(const capex_cuda_context_desc *desc, capex_cuda_context **out) {
    capex_cuda_context_desc def;
    capex_cuda_context *ctx;
    capex_result r;
    int count = 0, ordinal, locks;
    capex__CUresult cr;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_context_create: out is NULL");
    *out = NULL;
    if (!desc) {
        capex_cuda_context_desc_init(&def);
        desc = &def;
    }
    if ((r = capex__desc_check(desc->init_tag, CAPEX__TAG_CUDA_CONTEXT_DESC, "capex_cuda_context_create",
                               "capex_cuda_context_desc", "capex_cuda_context_desc_init")) != CAPEX_OK)
        return r;
    if (desc->precompile < 0 || desc->precompile > 2) /* before any driver use: a typo must not mean 0 */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_context_create: precompile %d (want 0: on first use, 1: all "
                           "now, 2: all in the background)", desc->precompile);
    if (desc->disk_cache != 0 && desc->disk_cache != 1)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_context_create: disk_cache %d (want 1: on, 0: off)",
                           desc->disk_cache);
    if (!capex__allocator_ok(desc->allocator)) /* else one family frees the other's */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_context_create: allocator needs both alloc and free");
    if ((r = capex_cuda_device_count(&count)) != CAPEX_OK) return r;
    if (count == 0) return capex__fail(CAPEX_ERR_NO_DEVICE, "the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES and nvidia-smi)");
    ordinal = desc->device;
    if (ordinal < -1) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_context_create: device %d (want -1 for $LOCAL_RANK, or 0..%d)", ordinal, count - 1);
    if (ordinal < 0) {
        const char *lr = getenv("LOCAL_RANK");
        ordinal = 0;
        if (lr && lr[0]) {
            char *end = NULL;
            long v = strtol(lr, &end, 10);
            if (!end || *end != '\0' || v < 0 || v > 1 << 20)
                return capex__fail(CAPEX_ERR_CONFIG, "LOCAL_RANK='%s' is not a GPU ordinal; set it to 0..%d or pass desc.device", lr, count - 1);
            ordinal = (int)v;
        }
        if (ordinal >= count) {
            const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
            /* a launcher that binds one GPU per process (CUDA_VISIBLE_DEVICES set, one
               visible) keeps LOCAL_RANK as the rank on the node: that GPU is ours */
            if (count == 1 && cvd && cvd[0]) {
                capex_log(CAPEX_LOG_INFO, "LOCAL_RANK=%d with CUDA_VISIBLE_DEVICES=%s: using the one visible GPU", ordinal, cvd);
                ordinal = 0;
            } else {
                return capex__fail(CAPEX_ERR_NO_DEVICE, "LOCAL_RANK=%d selects GPU %d but only %d visible: launch at most %d processes "
                                   "per node or check CUDA_VISIBLE_DEVICES", ordinal, ordinal, count, count);
            }
        }
    } else if (ordinal >= count) {
        return capex__fail(CAPEX_ERR_NO_DEVICE, "GPU %d requested but only %d visible (check CUDA_VISIBLE_DEVICES)", ordinal, count);
    }
    ctx = (capex_cuda_context *)capex__alloc(desc->allocator, sizeof *ctx);
    if (!ctx) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_context_create: out of memory");
    memset(ctx, 0, sizeof *ctx);
    if (desc->allocator) {
        ctx->alloc = *desc->allocator;
        ctx->has_alloc = 1;
    }
    if ((r = capex_cuda_device_get_info(ordinal, &ctx->info)) != CAPEX_OK) {
        capex__free(desc->allocator, ctx);
        return r;
    }
    ctx->device_cc = ctx->info.cc_major * 10 + ctx->info.cc_minor;
    if ((r = capex__cuda_params_pick(ctx)) != CAPEX_OK) {
        capex__free(desc->allocator, ctx);
        return r;
    }
    if ((cr = capex__cuda_drv.cuDeviceGet(&ctx->device, ordinal)) != 0) {
        capex__free(desc->allocator, ctx);
        return capex__cu_fail(cr, "cuDeviceGet", "");
    }
    if ((cr = capex__cuda_drv.cuDevicePrimaryCtxRetain(&ctx->cu_ctx, ctx->device)) != 0) {
        capex__free(desc->allocator, ctx);
        return capex__cu_fail(cr, "cuDevicePrimaryCtxRetain", "another process may hold the GPU in exclusive mode");
    }
    locks = pthread_mutex_init(&ctx->lock, NULL) == 0;
    locks += locks == 1 && pthread_mutex_init(&ctx->bg.lock, NULL) == 0;
    locks += locks == 2 && pthread_cond_init(&ctx->bg.cv, NULL) == 0;
    if (locks < 3) {
        if (locks > 1) pthread_mutex_destroy(&ctx->bg.lock);
        if (locks > 0) pthread_mutex_destroy(&ctx->lock);
        capex__cuda_drv.cuDevicePrimaryCtxRelease_v2(ctx->device);
        capex__free(desc->allocator, ctx);
        return capex__fail(CAPEX_ERR_INTERNAL, "capex_cuda_context_create: pthread_mutex_init/cond_init failed");
    }
    capex_cuda_cache_init(&ctx->cache, desc->cache_dir);
    if (!desc->disk_cache) ctx->cache.enabled = 0;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK ||
        (desc->precompile == 1 && (r = capex_cuda_precompile(ctx, 0)) != CAPEX_OK) ||
        (desc->precompile == 2 && (r = capex_cuda_precompile_async(ctx, NULL, 0, 0)) != CAPEX_OK)) {
        capex_cuda_context_destroy(ctx);
        return r;
    }
    *out = ctx;
    return CAPEX_OK;
}

CAPEX_API void capex_cuda_context_destroy(capex_cuda_context *ctx) {
    capex_cuda_module *m, *next;
    int entered;
    if (!ctx) return;
    capex__cuda_bg_stop(&ctx->bg);
    pthread_cond_destroy(&ctx->bg.cv);
    pthread_mutex_destroy(&ctx->bg.lock);
    /* unloading needs this context current; if it cannot be made current, the
       modules are left to the primary context (freed when it is last released) */
    entered = capex__cuda_enter(ctx) == CAPEX_OK;
    if (!entered) capex_log(CAPEX_LOG_WARN, "capex_cuda_context_destroy: %s; its modules are not unloaded", capex_last_error());
    for (m = ctx->modules; m; m = next) {
        next = m->next;
        if (m->handle && entered) capex__cuda_drv.cuModuleUnload(m->handle);
        capex__free(ctx->has_alloc ? &ctx->alloc : NULL, m);
    }
    capex__cuda_drv.cuDevicePrimaryCtxRelease_v2(ctx->device);
    pthread_mutex_destroy(&ctx->lock);
    {
        capex_allocator a = ctx->alloc;
        int has = ctx->has_alloc;
        capex__free(has ? &a : NULL, ctx);
    }
}

CAPEX_API const capex_cuda_device_info *capex_cuda_context_device(const capex_cuda_context *ctx) {
    return ctx ? &ctx->info : NULL;
}

CAPEX_API capex_result capex_cuda_context_synchronize(capex_cuda_context *ctx) {
    capex_result r;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuCtxSynchronize, (), "an earlier kernel or copy failed (run under compute-sanitizer to find it)");
    return CAPEX_OK;
}

/* ---- memory, streams, events ------------------------------------------------ */

/* Stream NULL means "after all work on the context, and done on return"
   (capex_cuda_context_synchronize before, and after where the call can return
   early). The driver's own NULL (legacy) stream does not wait for capex's
   streams, which are non-blocking: a plain cuMemcpyDtoH read results before the
   step that writes them ran, and cuMemcpyHtoD / DtoD / cuMemset can land after
   later work on those streams (seen on an H100: ZeRO-GPU vs DDP, 2026-11-28). */

CAPEX_API capex_result capex_cuda_malloc(capex_cuda_context *ctx, size_t bytes, capex_cuda_ptr *out) {
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_malloc: out is NULL");
    *out = 0;
    if (bytes == 0) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_malloc: 0 bytes");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuMemAlloc_v2, (out, bytes), "not enough GPU memory for this request");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_free(capex_cuda_context *ctx, capex_cuda_ptr p) {
    capex_result r;
    if (!p) return CAPEX_OK;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuMemFree_v2, (p), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_memcpy_htod(capex_cuda_context *ctx, capex_cuda_ptr dst, const void *src,
                                              size_t bytes, capex_cuda_stream stream) {
    capex_result r;
    if (bytes == 0) return CAPEX_OK;
    if (!dst || !src) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_memcpy_htod: NULL pointer");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (stream) CAPEX__CU(cuMemcpyHtoDAsync_v2, (dst, src, bytes, stream), "");
    else { /* the DMA from pageable memory may still be in flight when cuMemcpyHtoD returns */
        if ((r = capex_cuda_context_synchronize(ctx)) != CAPEX_OK) return r;
        CAPEX__CU(cuMemcpyHtoD_v2, (dst, src, bytes), "");
        return capex_cuda_context_synchronize(ctx);
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_memcpy_dtoh(capex_cuda_context *ctx, void *dst, capex_cuda_ptr src, size_t bytes,
                                              capex_cuda_stream stream) {
    capex_result r;
    if (bytes == 0) return CAPEX_OK;
    if (!dst || !src) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_memcpy_dtoh: NULL pointer");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (stream) CAPEX__CU(cuMemcpyDtoHAsync_v2, (dst, src, bytes, stream), "");
    else {
        if ((r = capex_cuda_context_synchronize(ctx)) != CAPEX_OK) return r;
        CAPEX__CU(cuMemcpyDtoH_v2, (dst, src, bytes), "an earlier kernel may have failed");
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_memcpy_dtod(capex_cuda_context *ctx, capex_cuda_ptr dst, capex_cuda_ptr src,
                                              size_t bytes, capex_cuda_stream stream) {
    capex_result r;
    if (bytes == 0) return CAPEX_OK;
    if (!dst || !src) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_memcpy_dtod: NULL pointer");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (stream) CAPEX__CU(cuMemcpyDtoDAsync_v2, (dst, src, bytes, stream), "");
    else { /* cuMemcpyDtoD returns before the copy is done */
        if ((r = capex_cuda_context_synchronize(ctx)) != CAPEX_OK) return r;
        CAPEX__CU(cuMemcpyDtoD_v2, (dst, src, bytes), "");
        return capex_cuda_context_synchronize(ctx);
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_memset_u8(capex_cuda_context *ctx, capex_cuda_ptr dst, unsigned char value,
                                            size_t count, capex_cuda_stream stream) {
    capex_result r;
    if (count == 0) return CAPEX_OK;
    if (!dst) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_memset_u8: NULL pointer");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (stream) CAPEX__CU(cuMemsetD8Async, (dst, value, count, stream), "");
    else { /* cuMemsetD8 on device memory returns before it is done */
        if ((r = capex_cuda_context_synchronize(ctx)) != CAPEX_OK) return r;
        CAPEX__CU(cuMemsetD8_v2, (dst, value, count), "");
        return capex_cuda_context_synchronize(ctx);
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_memset_u32(capex_cuda_context *ctx, capex_cuda_ptr dst, uint32_t value,
                                             size_t count, capex_cuda_stream stream) {
    capex_result r;
    if (count == 0) return CAPEX_OK;
    if (!dst || (dst & 3u)) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_memset_u32: NULL or unaligned pointer");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (stream) CAPEX__CU(cuMemsetD32Async, (dst, value, count, stream), "");
    else {
        if ((r = capex_cuda_context_synchronize(ctx)) != CAPEX_OK) return r;
        CAPEX__CU(cuMemsetD32_v2, (dst, value, count), "");
        return capex_cuda_context_synchronize(ctx);
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_mem_info(capex_cuda_context *ctx, size_t *free_bytes, size_t *total_bytes) {
    capex_result r;
    size_t f = 0, t = 0;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuMemGetInfo_v2, (&f, &t), "");
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_stream_create(capex_cuda_context *ctx, capex_cuda_stream *out) {
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_stream_create: out is NULL");
    *out = NULL;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuStreamCreate, (out, 1u /* CU_STREAM_NON_BLOCKING */), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_stream_destroy(capex_cuda_context *ctx, capex_cuda_stream s) {
    capex_result r;
    if (!s) return CAPEX_OK;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuStreamDestroy_v2, (s), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_stream_synchronize(capex_cuda_context *ctx, capex_cuda_stream s) {
    capex_result r;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuStreamSynchronize, (s), "an earlier kernel or copy on this stream failed");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_stream_wait_event(capex_cuda_context *ctx, capex_cuda_stream s, capex_cuda_event e) {
    capex_result r;
    if (!e) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_stream_wait_event: event is NULL");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuStreamWaitEvent, (s, e, 0u), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_event_create(capex_cuda_context *ctx, int timing, capex_cuda_event *out) {
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_event_create: out is NULL");
    *out = NULL;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuEventCreate, (out, timing ? 0u : 2u /* CU_EVENT_DISABLE_TIMING */), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_event_destroy(capex_cuda_context *ctx, capex_cuda_event e) {
    capex_result r;
    if (!e) return CAPEX_OK;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuEventDestroy_v2, (e), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_event_record(capex_cuda_context *ctx, capex_cuda_event e, capex_cuda_stream s) {
    capex_result r;
    if (!e) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_event_record: event is NULL");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuEventRecord, (e, s), "");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_event_synchronize(capex_cuda_context *ctx, capex_cuda_event e) {
    capex_result r;
    if (!e) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_event_synchronize: event is NULL");
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuEventSynchronize, (e), "an earlier kernel or copy failed");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_event_elapsed_ms(capex_cuda_context *ctx, capex_cuda_event start,
                                                   capex_cuda_event end, float *ms) {
    capex_result r;
    if (!start || !end || !ms) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_event_elapsed_ms: NULL argument");
    *ms = 0.0f;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    if (!capex__cuda_drv.cuEventElapsedTime)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "this CUDA driver has no cuEventElapsedTime");
    CAPEX__CU(cuEventElapsedTime, (ms, start, end), "both events must be recorded, with timing enabled, and complete");
    return CAPEX_OK;
}

/* ---- modules and launches ------------------------------------------------------ */

/* Errors that say the image itself is unusable (not memory or the context):
   INVALID_IMAGE, NO_BINARY_FOR_GPU, INVALID_PTX, UNSUPPORTED_PTX_VERSION. */
CAPEX__PRIVATE int capex__cuda_image_refused(capex__CUresult cr) { return cr == 200 || cr == 209 || cr == 218 || cr == 222; }

/* Loads an image; for PTX the driver's JIT log goes into the error message.
   *refused: the driver refused the image itself (see capex__cuda_image_refused). */
CAPEX__PRIVATE capex_result capex__cuda_load_image(const capex_cuda_image *img, const char *name, void **module, int *refused) {
    char log[600];
    int opts[2] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
    void *vals[2];
    capex__CUresult cr;
    log[0] = '\0';
    vals[0] = log;
    vals[1] = (void *)(size_t)sizeof log;
    *refused = 0;
    cr = capex__cuda_drv.cuModuleLoadDataEx(module, img->data, 2u, opts, vals);
    if (cr != 0) {
        char hint[900];
        *refused = capex__cuda_image_refused(cr);
        capex__cuda_fmt(hint, sizeof hint, "loading '%s' (%s for %s_%d, NVRTC %d.%d)%s; JIT log: %s", name,
                 img->kind == CAPEX_CUDA_IMAGE_CUBIN ? "CUBIN" : "PTX", img->kind == CAPEX_CUDA_IMAGE_CUBIN ? "sm" : "compute",
                 img->arch, img->nvrtc_version / 1000, (img->nvrtc_version % 1000) / 10,
                 *refused ? "; a driver older than the NVRTC cannot load its output: update the driver or use an "
                            "older NVRTC (CAPEX_NVRTC_PATH)" : "",
                 log[0] ? log : "(empty)");
        *module = NULL;
        return capex__cu_fail(cr, "cuModuleLoadDataEx", hint);
    }
    return CAPEX_OK;
}

/* Loads img (compiled from d, key = its cache key) as a module of ctx. A cached
   image the driver refuses is never retried: recompiled and overwritten (other
   failures, such as out of memory, are returned as they are). Takes img
   (freed). Called with ctx->lock held. */
CAPEX__PRIVATE capex_result capex__cuda_module_load_locked(capex_cuda_context *ctx, const unsigned char key[32],
                                                           const capex_cuda_compile_desc *d, capex_cuda_image *img,
                                                           capex_cuda_module **out) {
    capex_cuda_module *m;
    capex_result r;
    void *handle = NULL;
    int refused = 0;
    r = capex__cuda_load_image(img, d->name, &handle, &refused);
    if (r != CAPEX_OK && refused && img->from_cache) {
        capex_log(CAPEX_LOG_INFO, "cached image of '%s' did not load (%s); recompiling", d->name, capex_last_error());
        capex_cuda_image_free(img);
        if ((r = capex__cuda_compile(d, 1, img)) != CAPEX_OK) return r;
        r = capex__cuda_load_image(img, d->name, &handle, &refused);
    }
    if (r != CAPEX_OK) {
        capex_cuda_image_free(img);
        return r;
    }
    m = (capex_cuda_module *)capex__alloc(ctx->has_alloc ? &ctx->alloc : NULL, sizeof *m);
    if (!m) {
        capex__cuda_drv.cuModuleUnload(handle);
        capex_cuda_image_free(img);
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_module_compile: out of memory");
    }
    memcpy(m->key, key, 32);
    m->handle = handle;
    m->target.kind = img->kind;
    m->target.arch = img->arch;
    m->from_cache = img->from_cache;
    m->ctx = ctx;
    m->next = ctx->modules;
    ctx->modules = m;
    capex_cuda_image_free(img);
    *out = m;
    return CAPEX_OK;
}

CAPEX__PRIVATE capex_cuda_module *capex__cuda_module_find_locked(capex_cuda_context *ctx, const unsigned char key[32]) {
    capex_cuda_module *m;
    for (m = ctx->modules; m; m = m->next)
        if (memcmp(m->key, key, 32) == 0) return m;
    return NULL;
}

/* The compile of (source, name, options) for ctx's GPU through cache. */
CAPEX__PRIVATE void capex__cuda_module_desc(const capex_cuda_context *ctx, const char *source, const char *name,
                                            const char *const *options, int n_options, capex_cuda_cache *cache,
                                            capex_cuda_compile_desc *d) {
    capex_cuda_compile_desc_init(d);
    d->source = source;
    d->name = name;
    d->options = options;
    d->n_options = n_options;
    d->device_cc = ctx->device_cc;
    d->cache = cache;
}

/* Called with ctx->lock held. */
CAPEX__PRIVATE capex_result capex__cuda_module_compile_locked(capex_cuda_context *ctx, const char *source, const char *name,
                                                              const char *const *options, int n_options,
                                                              capex_cuda_module **out) {
    unsigned char key[32];
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    capex_result r;
    capex__cuda_cache_key(source, name, options, n_options, ctx->device_cc, key);
    if ((*out = capex__cuda_module_find_locked(ctx, key)) != NULL) return CAPEX_OK;
    capex__cuda_module_desc(ctx, source, name, options, n_options, &ctx->cache, &d);
    if ((r = capex__cuda_compile(&d, 0, &img)) != CAPEX_OK) return r;
    return capex__cuda_module_load_locked(ctx, key, &d, &img, out);
}

CAPEX_API capex_result capex_cuda_module_compile(capex_cuda_context *ctx, const char *source, const char *name,
                                                 const char *const *options, int n_options, capex_cuda_module **out) {
    unsigned char key[32];
    capex_cuda_compile_desc d;
    capex_cuda_cache cache;
    capex_cuda_image img;
    capex_result r;
    int i;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_compile: out is NULL");
    *out = NULL;
    if (!source || n_options < 0 || (n_options > 0 && !options))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_compile: NULL source, or options NULL with n_options %d", n_options);
    for (i = 0; i < n_options; i++)
        if (!options[i]) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_compile: options[%d] is NULL", i);
    if (!name || !name[0]) name = "capex_program";
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    capex__cuda_cache_key(source, name, options, n_options, ctx->device_cc, key);
    pthread_mutex_lock(&ctx->lock);
    *out = capex__cuda_module_find_locked(ctx, key);
    cache = ctx->cache; /* a private copy: its warn-once flag is written by the compile */
    pthread_mutex_unlock(&ctx->lock);
    if (*out) return CAPEX_OK;
    /* NVRTC and the disk cache run without the context lock, so that other
       threads keep launching (and compiling) meanwhile; the disk cache takes
       concurrent writers. Two threads compiling the same request compile once
       through the disk cache (its per-entry lock: one waits, then reads the
       entry), twice without it; the first to load wins. */
    capex__cuda_module_desc(ctx, source, name, options, n_options, &cache, &d);
    if ((r = capex__cuda_compile(&d, 0, &img)) != CAPEX_OK) return r;
    pthread_mutex_lock(&ctx->lock);
    ctx->cache.warned |= cache.warned;
    if ((*out = capex__cuda_module_find_locked(ctx, key)) != NULL) capex_cuda_image_free(&img);
    else {
        d.cache = &ctx->cache;
        r = capex__cuda_module_load_locked(ctx, key, &d, &img, out);
    }
    pthread_mutex_unlock(&ctx->lock);
    return r;
}

CAPEX_API capex_result capex_cuda_module_get_function(capex_cuda_module *module, const char *kernel,
                                                      capex_cuda_function *out) {
    capex_result r;
    capex__CUresult cr;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_get_function: out is NULL");
    out->handle = NULL;
    out->ctx = NULL;
    if (!module || !kernel) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_get_function: NULL module or name");
    if ((r = capex__cuda_enter(module->ctx)) != CAPEX_OK) return r;
    cr = capex__cuda_drv.cuModuleGetFunction(&out->handle, module->handle, kernel);
    if (cr == 500 /* CUDA_ERROR_NOT_FOUND */)
        return capex__fail(CAPEX_ERR_NOT_FOUND, "kernel '%s' not found in the module: declare it extern \"C\" __global__ "
                           "so its name is not mangled", kernel);
    if (cr != 0) return capex__cu_fail(cr, "cuModuleGetFunction", kernel);
    out->ctx = module->ctx;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_module_info(const capex_cuda_module *module, capex_cuda_target *target, int *from_cache) {
    if (!module) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_module_info: module is NULL");
    if (target) *target = module->target;
    if (from_cache) *from_cache = module->from_cache;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_launch(const capex_cuda_function *fn, const unsigned grid[3], const unsigned block[3],
                                         unsigned shmem, capex_cuda_stream stream, void **args) {
    capex_result r;
    char what[160];
    if (!fn || !fn->handle || !fn->ctx || !grid || !block)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_launch: NULL or unset function, grid or block");
    if (!grid[0] || !grid[1] || !grid[2] || !block[0] || !block[1] || !block[2])
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_launch: empty grid (%u,%u,%u) or block (%u,%u,%u)",
                           grid[0], grid[1], grid[2], block[0], block[1], block[2]);
    if (shmem > 0x7fffffffu) /* cuFuncSetAttribute takes an int */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_launch: %u bytes of dynamic shared memory (no GPU has 2 GiB per block)", shmem);
    if ((r = capex__cuda_enter(fn->ctx)) != CAPEX_OK) return r;
    if (shmem > 48u * 1024u) {
        /* The opt-in is one attribute of the function for every thread: it is
           only ever raised, so that a launch with less cannot lower it between
           another thread's opt-in and that thread's launch. */
        static pthread_mutex_t opt_in_lock = PTHREAD_MUTEX_INITIALIZER;
        capex__CUresult cr = 0;
        int cur = -1;
        if (!capex__cuda_drv.cuFuncSetAttribute)
            return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_cuda_launch: %u bytes of shared memory need cuFuncSetAttribute", shmem);
        pthread_mutex_lock(&opt_in_lock);
        if (!capex__cuda_drv.cuFuncGetAttribute || capex__cuda_drv.cuFuncGetAttribute(&cur, 8, fn->handle) != 0 ||
            cur < (int)shmem)
            cr = capex__cuda_drv.cuFuncSetAttribute(fn->handle, 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */,
                                                    (int)shmem);
        pthread_mutex_unlock(&opt_in_lock);
        if (cr != 0) return capex__cu_fail(cr, "cuFuncSetAttribute", "the GPU offers less dynamic shared memory per block");
    }
    capex__cuda_fmt(what, sizeof what, "grid (%u,%u,%u), block (%u,%u,%u), %u bytes shared", grid[0], grid[1], grid[2],
             block[0], block[1], block[2], shmem);
    CAPEX__CU(cuLaunchKernel, (fn->handle, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream, args, NULL), what);
    return CAPEX_OK;
}

/* ---- built-in kernels ------------------------------------------------------------ */

/* Kernel k's index among the kernels of variant unit u (id order): var_fn's slot. */
CAPEX__PRIVATE int capex__cuda_unit_slot(int u, size_t k) {
    size_t j;
    int slot = 0;
    for (j = 0; j < k; j++) slot += capex__cuda_unit_has(u, j);
    return slot;
}

/* Looks up unit u's kernels in its module m and records the unit as loaded.
   Called with ctx->lock held. */
CAPEX__PRIVATE capex_result capex__cuda_part_attach_locked(capex_cuda_context *ctx, int u, capex_cuda_module *m) {
    size_t k;
    void *fn[CAPEX__CUDA_N_BUILTIN];
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) {
        capex__CUresult cr;
        int local = 0;
        if (!capex__cuda_unit_has(u, k)) continue;
        cr = capex__cuda_drv.cuModuleGetFunction(&fn[k], m->handle, capex__cuda_builtin_kernels[k]);
        if (cr != 0) return capex__cu_fail(cr, "cuModuleGetFunction", capex__cuda_builtin_kernels[k]);
        /* Fixed switches change ptxas's schedule: under the launch bounds' register
           cap some variants spill (4-20 bytes of local memory on sm_80/90/100 for
           some Adam dtype and model combinations) where the part's kernel (SASS
           gate: no local memory) does not. Such a variant is not used: kernel
           speed before compile time. */
        if (u >= CAPEX__CUDA_N_PARTS && capex__cuda_drv.cuFuncGetAttribute &&
            capex__cuda_drv.cuFuncGetAttribute(&local, 3 /* CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES */, fn[k]) == 0 && local > 0) {
            capex_log(CAPEX_LOG_INFO, "built-in variant %s: %s uses %d bytes of local memory; running the part %s instead",
                      capex__cuda_unit_name(u), capex__cuda_builtin_kernels[k], local, capex__cuda_unit_name(capex__cuda_unit_part(u)));
            ctx->var_spills[u - CAPEX__CUDA_N_PARTS] = 1;
            return CAPEX_OK; /* not attached: capex__cuda_pick_unit_locked now says the part */
        }
    }
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) {
        if (!capex__cuda_unit_has(u, k)) continue;
        if (u < CAPEX__CUDA_N_PARTS) ctx->builtin_fn[k] = fn[k];
        else ctx->var_fn[u - CAPEX__CUDA_N_PARTS][capex__cuda_unit_slot(u, k)] = fn[k];
    }
    ctx->part[u] = m;
    return CAPEX_OK;
}

/* Loads unit u from img (taken: freed), compiled by a pool or background job;
   a module with the same key already loaded is used instead. Called with ctx->lock held. */
CAPEX__PRIVATE capex_result capex__cuda_part_load_image_locked(capex_cuda_context *ctx, int u, capex_cuda_image *img) {
    capex_cuda_compile_desc d;
    capex__cuda_unit_opts o;
    capex_cuda_module *m = NULL;
    unsigned char key[32];
    capex_result r = CAPEX_OK;
    capex__cuda_unit_desc(u, ctx->device_cc, ctx->meta_bytes, &ctx->cache, &o, &d);
    capex__cuda_cache_key(d.source, d.name, d.options, d.n_options, ctx->device_cc, key);
    if ((m = capex__cuda_module_find_locked(ctx, key)) != NULL) capex_cuda_image_free(img);
    else r = capex__cuda_module_load_locked(ctx, key, &d, img, &m);
    return r == CAPEX_OK ? capex__cuda_part_attach_locked(ctx, u, m) : r;
}

/* Compiles (or finds in the disk cache, or takes from a background compile)
   and loads unit u (a part or a variant). Called with ctx->lock held. */
CAPEX__PRIVATE capex_result capex__cuda_part_load_locked(capex_cuda_context *ctx, unsigned u) {
    capex_cuda_compile_desc d;
    capex__cuda_unit_opts o;
    unsigned char key[32];
    capex_cuda_module *m = NULL;
    capex_result r;
    capex__cuda_pjob job;
    if (u >= CAPEX__CUDA_N_UNITS) return capex__fail(CAPEX_ERR_INTERNAL, "built-in unit %u does not exist", u);
    if (ctx->part[u]) return CAPEX_OK;
    if (capex__cuda_bg_claim(ctx, (int)u, &job)) {
        if ((r = capex__cuda_pool_status(&job, 1, &ctx->cache)) != CAPEX_OK) return r;
        return capex__cuda_part_load_image_locked(ctx, (int)u, &job.img);
    }
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    capex__cuda_unit_desc((int)u, ctx->device_cc, ctx->meta_bytes, &ctx->cache, &o, &d);
    if (!d.source) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda: could not assemble the built-in kernel source");
    capex__cuda_cache_key(d.source, d.name, d.options, d.n_options, ctx->device_cc, key);
    if ((m = capex__cuda_module_find_locked(ctx, key)) == NULL) {
        capex_cuda_image img;
        if ((r = capex__cuda_compile_ex(&d, 0, 1, &img)) != CAPEX_OK) return r;
        if ((r = capex__cuda_module_load_locked(ctx, key, &d, &img, &m)) != CAPEX_OK) return r;
    }
    return capex__cuda_part_attach_locked(ctx, (int)u, m);
}

/* The unit a launch of kernel k with switches vb (CAPEX__CUDA_VB, 0: none)
   uses: its part when loaded or being compiled (capex_cuda_precompile and
   friends), else the variant. Called with ctx->lock held. */
CAPEX__PRIVATE int capex__cuda_pick_unit_locked(capex_cuda_context *ctx, size_t k, unsigned vb) {
    int u = capex__cuda_kernel_unit(k, vb), p, busy;
    if (u < 0) return 0; /* not reached: callers pass built-in kernels */
    if (u < CAPEX__CUDA_N_PARTS || ctx->part[u]) return u;
    p = capex__cuda_unit_part(u);
    if (ctx->var_spills[u - CAPEX__CUDA_N_PARTS]) return p;
    if (ctx->part[p]) return p;
    pthread_mutex_lock(&ctx->bg.lock);
    busy = ctx->bg.state[p] != CAPEX__BG_NONE;
    pthread_mutex_unlock(&ctx->bg.lock);
    return busy ? p : u;
}

CAPEX_API capex_result capex_cuda_builtin_part_module(capex_cuda_context *ctx, int part, capex_cuda_module **out) {
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_builtin_part_module: out is NULL");
    *out = NULL;
    if (part < 0 || part >= CAPEX__CUDA_N_PARTS)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_builtin_part_module: part %d (0..%d)", part, CAPEX__CUDA_N_PARTS - 1);
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    pthread_mutex_lock(&ctx->lock);
    r = capex__cuda_part_load_locked(ctx, (unsigned)part);
    *out = r == CAPEX_OK ? ctx->part[part] : NULL;
    pthread_mutex_unlock(&ctx->lock);
    return r;
}

CAPEX_API int capex_cuda_builtin_part_loaded(capex_cuda_context *ctx, int part) {
    int loaded;
    if (!ctx || part < 0 || part >= CAPEX__CUDA_N_PARTS) return 0;
    pthread_mutex_lock(&ctx->lock);
    loaded = ctx->part[part] != NULL;
    pthread_mutex_unlock(&ctx->lock);
    return loaded;
}

/* Images of the missing parts are made on threads without the context lock
   (launches and other compiles go on meanwhile), then loaded under it; a part
   another thread loaded in between is kept and the new image dropped. */
CAPEX_API capex_result capex_cuda_precompile(capex_cuda_context *ctx, int n_threads) {
    capex__cuda_pjob *jobs;
    capex_cuda_cache cache;
    int want[CAPEX__CUDA_N_PARTS], in_bg[CAPEX__CUDA_N_PARTS], i, n, missing = 0;
    capex_result r;
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    pthread_mutex_lock(&ctx->lock);
    for (i = 0; i < CAPEX__CUDA_N_PARTS; i++) missing += want[i] = ctx->part[i] == NULL;
    cache = ctx->cache;
    pthread_mutex_unlock(&ctx->lock);
    if (!missing) return CAPEX_OK;
    /* parts a background thread is compiling (or has compiled) are taken from it below */
    pthread_mutex_lock(&ctx->bg.lock);
    for (i = 0; i < CAPEX__CUDA_N_PARTS; i++) {
        /* a deferred one stays: it keeps its lock file (capex__cuda_bg_claim runs it) */
        if (ctx->bg.state[i] == CAPEX__BG_QUEUED && ctx->bg.job[i]->defer < 0) ctx->bg.state[i] = CAPEX__BG_NONE;
        in_bg[i] = want[i] && ctx->bg.state[i] != CAPEX__BG_NONE;
        if (in_bg[i]) want[i] = 0;
    }
    pthread_mutex_unlock(&ctx->bg.lock);
    jobs = (capex__cuda_pjob *)CAPEX_MALLOC(sizeof *jobs * CAPEX__CUDA_N_PARTS);
    if (!jobs) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_precompile: out of memory");
    n = capex__cuda_pool_jobs(jobs, want, &cache);
    capex__cuda_pool_run(jobs, n, ctx->device_cc, ctx->meta_bytes, n_threads);
    pthread_mutex_lock(&ctx->lock);
    r = capex__cuda_pool_status(jobs, n, &ctx->cache);
    for (i = 0; i < n; i++) {
        if (r != CAPEX_OK || ctx->part[jobs[i].part]) capex_cuda_image_free(&jobs[i].img);
        else r = capex__cuda_part_load_image_locked(ctx, jobs[i].part, &jobs[i].img);
    }
    for (i = 0; i < CAPEX__CUDA_N_PARTS && r == CAPEX_OK; i++)
        if (in_bg[i]) r = capex__cuda_part_load_locked(ctx, (unsigned)i); /* waits for the thread */
    pthread_mutex_unlock(&ctx->lock);
    CAPEX_FREE(jobs);
    return r;
}

CAPEX_API capex_result capex_cuda_precompile_async(capex_cuda_context *ctx, const char *const *kernels, int n_kernels,
                                                   int n_threads) {
    int want[CAPEX__CUDA_N_UNITS], i;
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_precompile_async: context is NULL");
    if (n_kernels < 0 || (n_kernels > 0 && !kernels))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_precompile_async: kernels NULL with n_kernels %d", n_kernels);
    for (i = 0; i < CAPEX__CUDA_N_UNITS; i++) want[i] = kernels == NULL && i < CAPEX__CUDA_N_PARTS; /* whole parts */
    for (i = 0; kernels && i < n_kernels; i++) {
        int p = kernels[i] ? capex_cuda_builtin_kernel_part(kernels[i]) : -1;
        if (p < 0)
            return capex__fail(CAPEX_ERR_NOT_FOUND, "capex_cuda_precompile_async: '%s' is not a built-in kernel "
                               "(capex_cuda_builtin_source() lists them)", kernels[i] ? kernels[i] : "(null)");
        want[p] = 1;
    }
    capex__cuda_bg_request(ctx, want, n_threads);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_precompile_wait(capex_cuda_context *ctx) {
    capex__cuda_bg *bg;
    capex_result r = CAPEX_OK;
    int p, busy = 1;
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_precompile_wait: context is NULL");
    bg = &ctx->bg;
    pthread_mutex_lock(&bg->lock);
    while (busy) {
        busy = 0;
        for (p = 0; p < CAPEX__CUDA_N_UNITS; p++)
            busy |= bg->state[p] == CAPEX__BG_RUNNING || (bg->state[p] == CAPEX__BG_QUEUED && bg->active > 0);
        if (busy) pthread_cond_wait(&bg->cv, &bg->lock);
    }
    for (p = 0; p < CAPEX__CUDA_N_UNITS && r == CAPEX_OK; p++)
        if (bg->state[p] == CAPEX__BG_DONE && bg->job[p]->r != CAPEX_OK)
            r = capex__fail(bg->job[p]->r, "built-in part '%s': %s", capex__cuda_unit_name(p), bg->job[p]->err);
    pthread_mutex_unlock(&bg->lock);
    return r;
}

CAPEX_API capex_result capex_cuda_builtin_module(capex_cuda_context *ctx, capex_cuda_module **out) {
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_builtin_module: out is NULL");
    *out = NULL;
    if ((r = capex_cuda_precompile(ctx, 0)) != CAPEX_OK) return r;
    return capex_cuda_builtin_part_module(ctx, CAPEX__CP_BASIC, out);
}

/* Built-in kernel k (an index of capex__cuda_builtin_kernels) for a launch
   with switches vb (CAPEX__CUDA_VB; 0: from its part), its unit compiled and
   loaded on first use; *occ_at (may be NULL) gets where the kernel's
   occupancy is kept (read and written under ctx->lock). Thread-safe. */
CAPEX__PRIVATE capex_result capex__cuda_builtin_get_vb(capex_cuda_context *ctx, size_t k, unsigned vb, capex_cuda_function *fn,
                                                       int **occ_at) {
    capex_result r;
    int u;
    fn->handle = NULL;
    fn->ctx = NULL;
    if (k >= CAPEX__CUDA_N_BUILTIN) return capex__fail(CAPEX_ERR_INTERNAL, "built-in kernel %zu does not exist", k);
    if ((r = capex__cuda_enter(ctx)) != CAPEX_OK) return r;
    pthread_mutex_lock(&ctx->lock);
    u = capex__cuda_pick_unit_locked(ctx, k, vb);
    r = capex__cuda_part_load_locked(ctx, (unsigned)u);
    if (r == CAPEX_OK && !ctx->part[u]) { /* a variant that spills: its part */
        u = capex__cuda_unit_part(u);
        r = capex__cuda_part_load_locked(ctx, (unsigned)u);
    }
    if (u < CAPEX__CUDA_N_PARTS) {
        fn->handle = ctx->builtin_fn[k];
        if (occ_at) *occ_at = &ctx->builtin_occ[k];
    } else {
        int slot = capex__cuda_unit_slot(u, k);
        fn->handle = ctx->var_fn[u - CAPEX__CUDA_N_PARTS][slot];
        if (occ_at) *occ_at = &ctx->var_occ[u - CAPEX__CUDA_N_PARTS][slot];
    }
    pthread_mutex_unlock(&ctx->lock);
    if (r == CAPEX_OK) fn->ctx = ctx;
    else if (r == CAPEX_ERR_NO_NVRTC && ctx->meta_bytes == CAPEX__GO_META_LARGE) { /* a cache of 4 KB builds cannot serve */
        char why[1024];
        capex__cuda_fmt(why, sizeof why, "%s", capex_last_error());
        r = capex__fail(r, "%s (this context takes 32 KB kernel parameters: kernels cached by CAPEX_CUDA_PARAMS=4096 "
                        "runs are found only with that setting)", why);
    }
    return r;
}
CAPEX__PRIVATE capex_result capex__cuda_builtin_get(capex_cuda_context *ctx, size_t k, capex_cuda_function *fn) {
    return capex__cuda_builtin_get_vb(ctx, k, 0, fn, NULL);
}

/* Launches built-in kernel k over n elements (grid-stride, at most 32 blocks per SM). */
CAPEX__PRIVATE capex_result capex__cuda_builtin_launch(capex_cuda_context *ctx, size_t k, size_t n, capex_cuda_stream stream,
                                                       void **args) {
    capex_cuda_function fn;
    capex_result r;
    unsigned grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    size_t blocks = n / 256 + (n % 256 != 0), cap; /* n + 255 would wrap near SIZE_MAX */
    if ((r = capex__cuda_builtin_get(ctx, k, &fn)) != CAPEX_OK) return r;
    cap = (size_t)(ctx->info.sm_count > 0 ? ctx->info.sm_count : 1) * 32u;
    grid[0] = (unsigned)(blocks < cap ? blocks : cap);
    return capex_cuda_launch(&fn, grid, block, 0, stream, args);
}

/* An output [out, out + n * os) that overlaps an input [in, in + n * is)
   other than exactly (same start, same element size) races: threads overwrite
   elements that others have not read yet. */
CAPEX__PRIVATE capex_result capex__cuda_check_overlap(const char *fn, capex_cuda_ptr out, size_t os, capex_cuda_ptr in,
                                                      size_t is, size_t n) {
    uint64_t ob = (uint64_t)n * os, ib = (uint64_t)n * is;
    if ((out == in && os == is) || out >= in + ib || in >= out + ob) return CAPEX_OK;
    return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the output 0x%llx (%llu bytes) and an input 0x%llx (%llu bytes) overlap; "
                       "use separate buffers (only an identical same-type range may be shared)", fn,
                       (unsigned long long)out, (unsigned long long)ob, (unsigned long long)in, (unsigned long long)ib);
}
/* n elements of up to 4 bytes must fit the address space (the byte counts above must not wrap). */
CAPEX__PRIVATE capex_result capex__cuda_check_n(const char *fn, size_t n) {
    if ((uint64_t)n > ((uint64_t)1 << 61)) return capex__fail(CAPEX_ERR_LIMIT, "%s: %zu elements do not fit the address space", fn, n);
    return CAPEX_OK;
}

/* The kernels address p as elements of es bytes: a misaligned one is the
   sticky CUDA_ERROR_MISALIGNED_ADDRESS on a GPU, which ends the context. */
CAPEX__PRIVATE capex_result capex__cuda_check_aligned(const char *fn, const char *name, capex_cuda_ptr p, size_t es) {
    if (p % es == 0) return CAPEX_OK;
    return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: %s 0x%llx is not aligned to its %zu-byte elements (a misaligned "
                       "access would fault the GPU and end the context)", fn, name, (unsigned long long)p, es);
}

CAPEX_API capex_result capex_cuda_fill_f32(capex_cuda_context *ctx, capex_cuda_ptr x, float value, size_t n,
                                           capex_cuda_stream stream) {
    unsigned long long nn = n;
    void *args[3];
    capex_result r;
    if (n == 0) return CAPEX_OK;
    if (!x) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_fill_f32: NULL pointer");
    if ((r = capex__cuda_check_n("capex_cuda_fill_f32", n)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_fill_f32", "x", x, 4)) != CAPEX_OK)
        return r;
    args[0] = &x; args[1] = &value; args[2] = &nn;
    return capex__cuda_builtin_launch(ctx, 0, n, stream, args);
}

CAPEX_API capex_result capex_cuda_scale_f32(capex_cuda_context *ctx, capex_cuda_ptr y, capex_cuda_ptr x, float a,
                                            size_t n, capex_cuda_stream stream) {
    unsigned long long nn = n;
    void *args[4];
    capex_result r;
    if (n == 0) return CAPEX_OK;
    if (!x || !y) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scale_f32: NULL pointer");
    if ((r = capex__cuda_check_n("capex_cuda_scale_f32", n)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_scale_f32", "y", y, 4)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_scale_f32", "x", x, 4)) != CAPEX_OK ||
        (r = capex__cuda_check_overlap("capex_cuda_scale_f32", y, 4, x, 4, n)) != CAPEX_OK)
        return r;
    args[0] = &y; args[1] = &x; args[2] = &a; args[3] = &nn;
    return capex__cuda_builtin_launch(ctx, 1, n, stream, args);
}

CAPEX_API capex_result capex_cuda_add_f32(capex_cuda_context *ctx, capex_cuda_ptr c, capex_cuda_ptr a,
                                          capex_cuda_ptr b, size_t n, capex_cuda_stream stream) {
    unsigned long long nn = n;
    void *args[4];
    capex_result r;
    if (n == 0) return CAPEX_OK;
    if (!a || !b || !c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_add_f32: NULL pointer");
    if ((r = capex__cuda_check_n("capex_cuda_add_f32", n)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_add_f32", "c", c, 4)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_add_f32", "a", a, 4)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_add_f32", "b", b, 4)) != CAPEX_OK ||
        (r = capex__cuda_check_overlap("capex_cuda_add_f32", c, 4, a, 4, n)) != CAPEX_OK ||
        (r = capex__cuda_check_overlap("capex_cuda_add_f32", c, 4, b, 4, n)) != CAPEX_OK)
        return r;
    args[0] = &c; args[1] = &a; args[2] = &b; args[3] = &nn;
    return capex__cuda_builtin_launch(ctx, 2, n, stream, args);
}

CAPEX_API capex_result capex_cuda_convert(capex_cuda_context *ctx, capex_cuda_ptr dst, capex_dtype dst_type,
                                          capex_cuda_ptr src, capex_dtype src_type, size_t n, capex_cuda_stream stream) {
    unsigned long long nn = n;
    void *args[3];
    size_t k;
    capex_result r;
    if (src_type == CAPEX_F32 && dst_type == CAPEX_F16) k = 3;
    else if (src_type == CAPEX_F16 && dst_type == CAPEX_F32) k = 4;
    else if (src_type == CAPEX_F32 && dst_type == CAPEX_BF16) k = 5;
    else if (src_type == CAPEX_BF16 && dst_type == CAPEX_F32) k = 6;
    else
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_cuda_convert: %s -> %s (supported: float32 <-> float16/bfloat16)",
                           capex_dtype_name(src_type), capex_dtype_name(dst_type));
    if (n == 0) return CAPEX_OK;
    if (!dst || !src) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_convert: NULL pointer");
    if ((r = capex__cuda_check_n("capex_cuda_convert", n)) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_convert", "dst", dst, capex_dtype_size(dst_type))) != CAPEX_OK ||
        (r = capex__cuda_check_aligned("capex_cuda_convert", "src", src, capex_dtype_size(src_type))) != CAPEX_OK ||
        (r = capex__cuda_check_overlap("capex_cuda_convert", dst, capex_dtype_size(dst_type), src, capex_dtype_size(src_type),
                                       n)) != CAPEX_OK)
        return r;
    args[0] = &dst; args[1] = &src; args[2] = &nn;
    return capex__cuda_builtin_launch(ctx, k, n, stream, args);
}

/* ==== fused GPU optimizer kernels: implementation ==== */
/* ---- fused multi-tensor ops, optimizers and loss scaler: host side ----------
   Host mirrors of the kernel-side structs (capex__cuda_frag_go0/1), same
   fixed-width fields in the same order (checked by size here and, against
   the kernel text compiled on the host, by tests/test_gpuopt_emu.c). */
#define CAPEX__GO_NSEG 158
CAPEX__GO_STRUCTS(CAPEX__GO_CSTRUCT, CAPEX__GO_CPTR, uint64_t, int64_t, int32_t, uint32_t)
CAPEX__GO_LISTS(CAPEX__GO_CLIST)
typedef char capex__go_depths_ok[(CAPEX__GO_SCALE_DEPTH == 2 && CAPEX__GO_SUMSQ_DEPTH == 1 && CAPEX__GO_ADAM_DEPTH == 6 &&
                                  CAPEX__GO_SGD_DEPTH == 5 && CAPEX__GO_LAMB1_DEPTH == 5 && CAPEX__GO_LAMB2_DEPTH == 5 &&
                                  CAPEX__GO_NOVO1_DEPTH == 2 && CAPEX__GO_NOVO2_DEPTH == 5 &&
                                  CAPEX__GO_ADAGRAD_DEPTH == 5 && CAPEX__GO_ADAM_DEPTH <= CAPEX_MTA_MAX_DEPTH) ? 1 : -1];
typedef struct capex__go_args capex__go_args;
typedef struct capex__go_segs capex__go_segs;
typedef struct capex__go_group capex__go_group;
typedef struct capex__go_scaler capex__go_scaler;
/* args: chunk, then the union of the kernels' own fields, the largest
   capex_go_prepare's (5 pointers, 4 ints): 8 + 56 bytes (80 before, as six
   untyped pointers, two floats and four ints). A field is at the same offset on both sides when the
   sizes match: fixed-width types and 8-byte pointers only. */
typedef char capex__go_sizes_ok[(sizeof(capex__go_args) == 64 && sizeof(((capex__go_args *)0)->op) == 56 &&
                                 offsetof(capex__go_args, op) == 8 && sizeof(capex__go_segs) == 3800 &&
                                 sizeof(capex__go_group) == 104 && sizeof(capex__go_scaler) == 80) ? 1 : -1];
/* every launch's parameters (metadata or segments, then the args) fit 4096
   bytes (32764 with the large metadata); every depth has room for a slot */
typedef char capex__go_params_fit[(CAPEX__GO_META_SMALL + sizeof(capex__go_args) <= 4096 &&
                                   CAPEX__GO_META_LARGE + sizeof(capex__go_args) <= 32764 &&
                                   CAPEX__GO_META_SMALL % 8 == 0 && CAPEX__GO_META_LARGE % 8 == 0 &&
                                   CAPEX__GO_TDEF(CAPEX__GO_META_SMALL, CAPEX_MTA_MAX_DEPTH) >= 32 &&
                                   sizeof(capex__go_segs) + sizeof(capex__go_args) <= 4096) ? 1 : -1];

/* Optimizer kernel ids: positions in CAPEX__CUDA_KERNELS counted from its
   first optimizer kernel (what capex__go_exec launches take). */
#define CAPEX__GO_KBASE CAPEX__CK_GO_SCALE_F32_F32
#define CAPEX__GO_K(id) (CAPEX__CK_##id - CAPEX__GO_KBASE)
enum {
    CAPEX__GO_K_SCALE = CAPEX__GO_K(GO_SCALE_F32_F32), /* + 3 * in dtype + out dtype */
    CAPEX__GO_K_SUMSQ = CAPEX__GO_K(GO_SUMSQ_F32),     /* + dtype */
    CAPEX__GO_K_REDUCE = CAPEX__GO_K(GO_REDUCE), CAPEX__GO_K_CLIP = CAPEX__GO_K(GO_CLIP_COEF),
    CAPEX__GO_K_PREPARE = CAPEX__GO_K(GO_PREPARE),
    CAPEX__GO_K_ADAM = CAPEX__GO_K(GO_ADAM_F32), CAPEX__GO_K_SGD = CAPEX__GO_K(GO_SGD_F32), /* + grad dtype */
    CAPEX__GO_K_LAMB1 = CAPEX__GO_K(GO_LAMB1_F32),                                          /* + grad dtype */
    CAPEX__GO_K_LAMB_CLIP = CAPEX__GO_K(GO_LAMB_CLIP), CAPEX__GO_K_LAMB_RATIO = CAPEX__GO_K(GO_LAMB_RATIO),
    CAPEX__GO_K_LAMB2 = CAPEX__GO_K(GO_LAMB2), CAPEX__GO_K_SCALER = CAPEX__GO_K(GO_SCALER_UPDATE),
    CAPEX__GO_K_NOVO1 = CAPEX__GO_K(GO_NOVO1_F32), CAPEX__GO_K_NOVO2 = CAPEX__GO_K(GO_NOVO2_F32), /* + grad dtype */
    CAPEX__GO_K_NOVO_NORM = CAPEX__GO_K(GO_NOVO_NORM),
    CAPEX__GO_NK = CAPEX__GO_K(NORM_FWD), /* the first family ends where the norm kernels start */
    CAPEX__GO_K_ADAM_AMS = CAPEX__GO_K(GO_ADAM_AMS_F32), CAPEX__GO_K_ADAGRAD = CAPEX__GO_K(GO_ADAGRAD_F32), /* + grad dtype */
    CAPEX__GO_K_ZERO_NORM = CAPEX__GO_K(GO_ZERO_NORM),
    CAPEX__GO_K_LR_SCHED = CAPEX__GO_K(GO_LR_SCHED),
    CAPEX__GO_NK_ALL = CAPEX__GO_K(NORM_ME_DX) /* the optimizer kernels end where the memory-efficient norm kernels start */
};
/* the dtype-indexed families are consecutive f32, f16, bf16 in the list */
typedef char capex__go_kernel_ids_ok[(CAPEX__CK_GO_ADAM_BF16 == CAPEX__CK_GO_ADAM_F32 + 2 &&
    CAPEX__CK_GO_SGD_BF16 == CAPEX__CK_GO_SGD_F32 + 2 && CAPEX__CK_GO_LAMB1_BF16 == CAPEX__CK_GO_LAMB1_F32 + 2 &&
    CAPEX__CK_GO_NOVO1_BF16 == CAPEX__CK_GO_NOVO1_F32 + 2 && CAPEX__CK_GO_NOVO2_BF16 == CAPEX__CK_GO_NOVO2_F32 + 2 &&
    CAPEX__CK_GO_SUMSQ_BF16 == CAPEX__CK_GO_SUMSQ_F32 + 2 && CAPEX__CK_GO_SCALE_BF16_BF16 == CAPEX__CK_GO_SCALE_F32_F32 + 8 &&
    CAPEX__CK_GO_ADAM_AMS_BF16 == CAPEX__CK_GO_ADAM_AMS_F32 + 2 && CAPEX__CK_GO_ADAGRAD_BF16 == CAPEX__CK_GO_ADAGRAD_F32 + 2 &&
    CAPEX__CK_GO_NOVO_NORM + 1 == CAPEX__CK_NORM_FWD) ? 1 : -1];
#define CAPEX__GO_THREADS 512 /* per block: a power of two <= 512 (the kernels' shared arrays) */

/* Where the kernels run: the GPU (capex__go_dev_exec), or in tests a CPU
   emulation of the same kernel source. dtoh waits for the copy. */
typedef struct capex__go_exec {
    /* vb: the launch's switches (CAPEX__CUDA_VB, capex__go_vb): which variant of the kernel runs it */
    capex_result (*launch)(void *user, int kernel, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s);
    capex_result (*alloc)(void *user, size_t bytes, capex_cuda_ptr *out);
    void (*release)(void *user, capex_cuda_ptr p);
    capex_result (*htod)(void *user, capex_cuda_ptr dst, const void *src, size_t bytes, capex_cuda_stream s);
    capex_result (*dtoh)(void *user, void *dst, capex_cuda_ptr src, size_t bytes, capex_cuda_stream s);
    capex_result (*zero)(void *user, capex_cuda_ptr dst, size_t bytes, capex_cuda_stream s);
    /* optional: start compiling these kernels (CAPEX__GO_K_*, each with its
       launch's switches vb[i]) in the background */
    void (*prefetch)(void *user, const int *kernels, const unsigned *vb, int n);
    /* optional: wait for all work on every stream (the copies above without a
       stream use the NULL stream, which is not ordered against the caller's
       non-blocking streams) */
    capex_result (*sync)(void *user);
    /* optional: the blocks of `block` threads of kernel k the device keeps
       resident (SMs x occupancy); 0: unknown (CAPEX__GO_GRID_DEFAULT) */
    unsigned (*grid)(void *user, int kernel, unsigned vb, unsigned block);
    /* optional: load kernel k's unit for switches vb now, launching nothing
       (so that an op fails before its first write, not halfway) */
    capex_result (*load)(void *user, int kernel, unsigned vb);
    /* the metadata size the kernels were compiled for: CAPEX__GO_META_SMALL
       (0 means it too) or CAPEX__GO_META_LARGE */
    int meta_bytes;
    void *user;
} capex__go_exec;

CAPEX__PRIVATE capex_result capex__go_dev_launch(void *user, int k, unsigned vb, unsigned grid, unsigned block, void **args,
                                                 capex_cuda_stream s) {
    capex_cuda_context *ctx = (capex_cuda_context *)user;
    capex_cuda_function fn;
    unsigned g[3], b[3];
    /* compiles its variant (or part) on first use */
    capex_result r = capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + (size_t)k, vb, &fn, NULL);
    if (r != CAPEX_OK) return r;
    g[0] = grid; g[1] = 1; g[2] = 1;
    b[0] = block; b[1] = 1; b[2] = 1;
    return capex_cuda_launch(&fn, g, b, 0, s, args);
}
CAPEX__PRIVATE capex_result capex__go_dev_load(void *user, int k, unsigned vb) {
    capex_cuda_function fn;
    return capex__cuda_builtin_get_vb((capex_cuda_context *)user, CAPEX__GO_KBASE + (size_t)k, vb, &fn, NULL);
}
CAPEX__PRIVATE capex_result capex__go_dev_alloc(void *user, size_t bytes, capex_cuda_ptr *out) {
    return capex_cuda_malloc((capex_cuda_context *)user, bytes, out);
}
CAPEX__PRIVATE void capex__go_dev_release(void *user, capex_cuda_ptr p) { capex_cuda_free((capex_cuda_context *)user, p); }
CAPEX__PRIVATE capex_result capex__go_dev_htod(void *user, capex_cuda_ptr dst, const void *src, size_t bytes,
                                               capex_cuda_stream s) {
    return capex_cuda_memcpy_htod((capex_cuda_context *)user, dst, src, bytes, s);
}
CAPEX__PRIVATE capex_result capex__go_dev_dtoh(void *user, void *dst, capex_cuda_ptr src, size_t bytes,
                                               capex_cuda_stream s) {
    capex_result r = capex_cuda_memcpy_dtoh((capex_cuda_context *)user, dst, src, bytes, s);
    if (r == CAPEX_OK && s) r = capex_cuda_stream_synchronize((capex_cuda_context *)user, s);
    return r;
}
CAPEX__PRIVATE capex_result capex__go_dev_zero(void *user, capex_cuda_ptr dst, size_t bytes, capex_cuda_stream s) {
    return capex_cuda_memset_u8((capex_cuda_context *)user, dst, 0, bytes, s);
}
CAPEX__PRIVATE void capex__go_dev_prefetch(void *user, const int *kernels, const unsigned *vb, int n) {
    capex_cuda_context *ctx = (capex_cuda_context *)user;
    int want[CAPEX__CUDA_N_UNITS], i;
    memset(want, 0, sizeof want);
    pthread_mutex_lock(&ctx->lock);
    for (i = 0; i < n; i++) want[capex__cuda_pick_unit_locked(ctx, CAPEX__GO_KBASE + (size_t)kernels[i], vb[i])] = 1;
    pthread_mutex_unlock(&ctx->lock);
    capex__cuda_bg_request(ctx, want, 0);
}

/* SMs x the blocks of `block` threads of kernel k one SM keeps resident
   (cuOccupancyMaxActiveBlocksPerMultiprocessor, asked once per kernel and
   context); 0 when the driver cannot say (the caller's default then). */
CAPEX__PRIVATE unsigned capex__go_dev_grid(void *user, int k, unsigned vb, unsigned block) {
    capex_cuda_context *ctx = (capex_cuda_context *)user;
    size_t id = CAPEX__GO_KBASE + (size_t)k;
    capex_cuda_function fn;
    int occ = -1, *at = NULL;
    if (id >= CAPEX__CUDA_N_BUILTIN || ctx->info.sm_count <= 0) return 0;
    /* the launch's own kernel (variant or part): compiled here on first use */
    if (capex__cuda_builtin_get_vb(ctx, id, vb, &fn, &at) != CAPEX_OK) return 0; /* the launch will say why */
    pthread_mutex_lock(&ctx->lock);
    occ = *at;
    pthread_mutex_unlock(&ctx->lock);
    if (occ == 0) {
        int n = 0;
        occ = -1;
        if (capex__cuda_drv.cuOccupancyMaxActiveBlocksPerMultiprocessor &&
            capex__cuda_drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn.handle, (int)block, 0) == 0 && n > 0)
            occ = n;
        pthread_mutex_lock(&ctx->lock);
        *at = occ;
        pthread_mutex_unlock(&ctx->lock);
    }
    return occ > 0 ? (unsigned)occ * (unsigned)ctx->info.sm_count : 0u;
}

CAPEX__PRIVATE capex_result capex__go_dev_sync(void *user) {
    return capex_cuda_context_synchronize((capex_cuda_context *)user);
}
CAPEX__PRIVATE capex_result capex__go_sync(const capex__go_exec *ex) { return ex->sync ? ex->sync(ex->user) : CAPEX_OK; }

CAPEX__PRIVATE capex_result capex__go_dev_exec(capex_cuda_context *ctx, const char *fn, capex__go_exec *ex) {
    memset(ex, 0, sizeof *ex);
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: context is NULL; create one with capex_cuda_context_create", fn);
    ex->launch = capex__go_dev_launch;
    ex->alloc = capex__go_dev_alloc;
    ex->release = capex__go_dev_release;
    ex->htod = capex__go_dev_htod;
    ex->dtoh = capex__go_dev_dtoh;
    ex->zero = capex__go_dev_zero;
    ex->prefetch = capex__go_dev_prefetch;
    ex->sync = capex__go_dev_sync;
    ex->grid = capex__go_dev_grid;
    ex->load = capex__go_dev_load;
    ex->meta_bytes = ctx->meta_bytes; /* what its parts were compiled for (capex__cuda_part_options) */
    ex->user = ctx;
    return CAPEX_OK;
}

/* Device addresses of one tensor in each list of an op, in list order. */
typedef struct capex__go_ten {
    uint64_t addr[CAPEX_MTA_MAX_DEPTH];
} capex__go_ten;

/* Bytes of launch metadata the exec's kernels take. */
CAPEX__PRIVATE size_t capex__go_meta_bytes(const capex__go_exec *ex) {
    return ex->meta_bytes == CAPEX__GO_META_LARGE ? CAPEX__GO_META_LARGE : CAPEX__GO_META_SMALL;
}

/* The grid of a multi-tensor launch of `chunks` chunks: the blocks the
   device keeps resident (SMs x occupancy, ex->grid), the default when it
   cannot say, never more than the chunks. Each block loops over its chunks. */
/* A launch's switches for the variant that runs it (capex__cuda_kernel_unit):
   the fields a kernel tests by truth only are packed as 0/1; model is 0..3. */
CAPEX__PRIVATE unsigned capex__go_vb(int k, const capex__go_args *a) {
    if (k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_ADAM + 3) return CAPEX__CUDA_VB(a->op.adam.w_mode != 0, a->op.adam.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_ADAM_AMS && k < CAPEX__GO_K_ADAM_AMS + 3)
        return CAPEX__CUDA_VB(a->op.adam_ams.w_mode != 0, a->op.adam_ams.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_ADAGRAD && k < CAPEX__GO_K_ADAGRAD + 3)
        return CAPEX__CUDA_VB(a->op.adagrad.w_mode != 0, a->op.adagrad.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_SGD && k < CAPEX__GO_K_SGD + 3) return CAPEX__CUDA_VB(a->op.sgd.momentum != 0, a->op.sgd.model & 3, 0, 0);
    if (k == CAPEX__GO_K_LAMB2) return CAPEX__CUDA_VB(a->op.lamb2.w_mode != 0, a->op.lamb2.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB1 + 3) return CAPEX__CUDA_VB(a->op.lamb1.w_mode != 0, 0, 0, 0);
    if (k >= CAPEX__GO_K_NOVO1 && k < CAPEX__GO_K_NOVO1 + 3)
        return CAPEX__CUDA_VB(a->op.novo1.reg_inside_moment != 0, a->op.novo1.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_NOVO2 && k < CAPEX__GO_K_NOVO2 + 3)
        return CAPEX__CUDA_VB(a->op.novo2.reg_inside_moment != 0, a->op.novo2.model & 3, 0, 0);
    if (k >= CAPEX__GO_K_SCALE && k < CAPEX__GO_K_SUMSQ)
        return CAPEX__CUDA_VB(0, 0, a->op.scale.write_out != 0, a->op.scale.clip_only != 0);
    return CAPEX__CUDA_VB(0, 0, 0, 0);
}

CAPEX__PRIVATE unsigned capex__go_grid(const capex__go_exec *ex, int k, unsigned vb, unsigned block, int64_t chunks) {
    unsigned cap = ex->grid ? ex->grid(ex->user, k, vb, block) : 0u;
    if (cap == 0) cap = CAPEX__GO_GRID_DEFAULT;
    return chunks < (int64_t)cap ? (unsigned)chunks : cap;
}

/* Runs kernel k over `count` tensors (numel from shape[], addresses from
   ten[]) launch by launch: a launch takes the next tensors (empty ones
   skipped) until its slots are full, all their chunks, in tensor then offset
   order (capex.h's chunk order). The metadata (capex_go_meta, layout at
   CAPEX__GO_TDEF) is written in place. out0, out1 (each may be NULL): fields
   of *a that address per-chunk double outputs (a->op.sumsq.partial, ...),
   advanced to each launch's first chunk and restored at the end. *chunks
   (may be NULL) gets the chunk count. */
CAPEX__PRIVATE capex_result capex__go_mta(const capex__go_exec *ex, int k, int depth, const capex_tensor *shape,
                                          const capex__go_ten *ten, size_t count, int64_t chunk, capex__go_args *a,
                                          uint64_t *out0, uint64_t *out1, capex_cuda_stream s, int64_t *chunks) {
    uint64_t small[CAPEX__GO_META_SMALL / 8], *meta = small;
    size_t i = 0, bytes = capex__go_meta_bytes(ex), T = (size_t)CAPEX__GO_TDEF(bytes, depth);
    int64_t done = 0;
    uint64_t b0 = out0 ? *out0 : 0, b1 = out1 ? *out1 : 0;
    const unsigned vb = capex__go_vb(k, a);
    /* LAMB stage 1 holds more registers: 256 threads a block */
    unsigned block = k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB_CLIP ? 256u : CAPEX__GO_THREADS;
    capex_result r = CAPEX_OK;
    if (chunk <= 0) chunk = CAPEX_CHUNK_SIZE_DEFAULT;
    /* Without per-chunk outputs the chunking does not change the results. A
       chunk of at most 2^32 elements spans at most two 2^32-element windows:
       the two stochastic-rounding keys a block holds (capex_go_sr); a longer
       one gave the elements of a third window the second key (the CPU's items
       stop at each 2^32 boundary). */
    if (!out0 && !out1 && chunk > ((int64_t)1 << 32)) chunk = (int64_t)1 << 32;
    a->chunk = (uint64_t)chunk;
    if (bytes > sizeof small && !(meta = (uint64_t *)capex__alloc(NULL, bytes)))
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda: out of host memory for %zu bytes of launch metadata", bytes);
    while (r == CAPEX_OK && i < count) {
        int32_t nt = 0;
        int64_t c = 0;
        int d;
        void *args[2];
        memset(meta, 0, bytes);
        for (; i < count && nt < (int32_t)T; i++) {
            int64_t n = shape[i].numel;
            if (n <= 0) continue;
            c += n / chunk + (n % chunk != 0);
            for (d = 0; d < depth; d++) meta[(size_t)d * T + (size_t)nt] = ten[i].addr[d];
            memcpy(meta + (size_t)depth * T + (size_t)nt, &n, 8);            /* numel[nt] */
            memcpy(meta + ((size_t)depth + 1) * T + (size_t)nt, &c, 8);      /* cend[nt] */
            nt++;
        }
        if (nt == 0) break;
        memcpy(meta + ((size_t)depth + 2) * T, &nt, 4); /* ntensors */
        if (out0) *out0 = b0 + 8u * (uint64_t)done;
        if (out1) *out1 = b1 + 8u * (uint64_t)done;
        args[0] = meta;
        args[1] = a;
        r = ex->launch(ex->user, k, vb, capex__go_grid(ex, k, vb, block, c), block, args, s);
        done += c;
    }
    if (meta != small) capex__free(NULL, meta);
    if (out0) *out0 = b0;
    if (out1) *out1 = b1;
    if (chunks) {
        for (done = 0, i = 0; i < count; i++)
            if (shape[i].numel > 0) done += shape[i].numel / chunk + (shape[i].numel % chunk != 0);
        *chunks = done;
    }
    return r;
}

/* One-thread / small kernels that take only the args. */
CAPEX__PRIVATE capex_result capex__go_small(const capex__go_exec *ex, int k, unsigned grid, unsigned block,
                                            capex__go_args *a, capex_cuda_stream s) {
    void *args[1];
    args[0] = a;
    return ex->launch(ex->user, k, capex__go_vb(k, a), grid, block, args, s);
}

/* Fixed-order sums of partial ranges: segment i sums part[start_i ..
   start_i + count_i) into sumsq[out_i] / norm[out_i] (0: not written);
   out NULL: out_i = i. */
CAPEX__PRIVATE capex_result capex__go_reduce_to(const capex__go_exec *ex, capex_cuda_ptr part, const int64_t *start,
                                                const int64_t *count, const int64_t *out, size_t n, capex_cuda_ptr sumsq,
                                                capex_cuda_ptr norm, capex_cuda_stream s) {
    capex__go_segs sg;
    capex__go_args a;
    size_t i = 0, j;
    capex_result r = CAPEX_OK;
    memset(&a, 0, sizeof a);
    a.op.reduce.partial = part;
    a.op.reduce.sumsq = sumsq;
    a.op.reduce.norm = norm;
    while (r == CAPEX_OK && i < n) {
        void *args[2];
        memset(&sg, 0, sizeof sg);
        for (j = 0; j < CAPEX__GO_NSEG && i < n; j++, i++) {
            sg.start[j] = start[i];
            sg.count[j] = count[i];
            sg.out[j] = out ? out[i] : (int64_t)i;
        }
        sg.n = (int32_t)j;
        args[0] = &sg;
        args[1] = &a;
        r = ex->launch(ex->user, CAPEX__GO_K_REDUCE, capex__go_vb(CAPEX__GO_K_REDUCE, &a), (unsigned)j, CAPEX__GO_THREADS, args, s);
    }
    return r;
}
CAPEX__PRIVATE capex_result capex__go_reduce(const capex__go_exec *ex, capex_cuda_ptr part, const int64_t *start,
                                             const int64_t *count, size_t n, capex_cuda_ptr sumsq, capex_cuda_ptr norm,
                                             capex_cuda_stream s) {
    return capex__go_reduce_to(ex, part, start, count, NULL, n, sumsq, norm, s);
}

CAPEX__PRIVATE int64_t capex__go_nchunks(int64_t numel, int64_t chunk) { return numel / chunk + (numel % chunk != 0); }
CAPEX__PRIVATE int64_t capex__go_chunk_of(const capex_tensor_op_desc *desc) {
    return desc && desc->chunk_size ? desc->chunk_size : CAPEX_CHUNK_SIZE_DEFAULT;
}

/* ---- multi-tensor ops ---- */

CAPEX__PRIVATE capex_result capex__go_check_desc(const char *fn, const capex_tensor_op_desc *desc) {
    return desc ? capex__check_desc(fn, desc) : CAPEX_OK;
}

CAPEX__PRIVATE capex_result capex__go_scale(const capex__go_exec *ex, const char *fn, const capex_tensor_op_desc *desc,
                                            const capex_tensor_list *in, const capex_tensor_list *out,
                                            capex_cuda_ptr scale, capex_cuda_ptr found_inf, int clip_mode,
                                            capex_cuda_stream s) {
    capex__go_ten *ten;
    capex__go_args a;
    capex_result r;
    size_t i;
    if ((r = capex__go_check_desc(fn, desc)) != CAPEX_OK) return r;
    if ((r = capex__check_list(fn, "in", in)) != CAPEX_OK) return r;
    if (out) {
        if ((r = capex__check_list(fn, "out", out)) != CAPEX_OK) return r;
        if ((r = capex__check_same(fn, "in", in, "out", out)) != CAPEX_OK) return r;
        if ((r = capex__check_alias(fn, "in", in, "out", out)) != CAPEX_OK) return r;
    }
    if (!scale || (scale & 3u))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: scale must be the device address of a float (got 0x%llx)", fn,
                           (unsigned long long)scale);
    if (found_inf & 3u)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: found_inf 0x%llx is not 4-byte aligned", fn,
                           (unsigned long long)found_inf);
    if (in->count == 0) return CAPEX_OK;
    ten = (capex__go_ten *)capex__alloc(NULL, in->count * sizeof *ten);
    if (!ten) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (i = 0; i < in->count; i++) {
        ten[i].addr[CAPEX__GO_SCALE_IN] = (uint64_t)(uintptr_t)in->tensors[i].data;
        ten[i].addr[CAPEX__GO_SCALE_OUT] = out ? (uint64_t)(uintptr_t)out->tensors[i].data : 0u;
    }
    memset(&a, 0, sizeof a);
    a.op.scale.factor = scale;
    a.op.scale.found_inf = found_inf;
    a.op.scale.write_out = out != NULL;
    a.op.scale.clip_only = clip_mode;
    r = capex__go_mta(ex, CAPEX__GO_K_SCALE + 3 * (int)in->dtype + (int)(out ? out->dtype : in->dtype),
                      CAPEX__GO_SCALE_DEPTH, in->tensors, ten, in->count, capex__go_chunk_of(desc), &a, NULL, NULL, s,
                      NULL);
    capex__free(NULL, ten);
    return r;
}

CAPEX__PRIVATE capex_result capex__go_ws_size(const char *fn, const capex_tensor_op_desc *desc,
                                              const capex_tensor_list *lists, size_t nlists, int64_t *chunks,
                                              size_t *bytes) {
    int64_t c = 0, chunk = capex__go_chunk_of(desc);
    size_t l, i;
    capex_result r;
    char name[32];
    if ((r = capex__go_check_desc(fn, desc)) != CAPEX_OK) return r;
    if (nlists > 0 && !lists) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: lists is NULL with nlists %zu", fn, nlists);
    for (l = 0; l < nlists; l++) {
        snprintf(name, sizeof name, "lists[%zu]", l);
        if ((r = capex__check_list(fn, name, &lists[l])) != CAPEX_OK) return r;
        for (i = 0; i < lists[l].count; i++) {
            int64_t n = capex__go_nchunks(lists[l].tensors[i].numel, chunk);
            /* 8 * (chunks + 1) bytes must fit size_t: a wrapped size would pass the workspace check */
            if ((uint64_t)n > (uint64_t)(SIZE_MAX / 8u - 1u) - (uint64_t)c || n > INT64_MAX - c)
                return capex__fail(CAPEX_ERR_LIMIT, "%s: %s[%zu] brings the lists past %zu chunks of %lld; raise "
                                   "desc.chunk_size", fn, name, i, (size_t)(SIZE_MAX / 8u - 1u), (long long)chunk);
            c += n;
        }
    }
    *chunks = c;
    *bytes = 8u * ((size_t)c + 1u);
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_multi_tensor_workspace_size(const capex_tensor_op_desc *desc,
                                                              const capex_tensor_list *lists, size_t nlists,
                                                              size_t *bytes) {
    int64_t c;
    if (!bytes) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_multi_tensor_workspace_size: bytes is NULL");
    *bytes = 0;
    return capex__go_ws_size("capex_cuda_multi_tensor_workspace_size", desc, lists, nlists, &c, bytes);
}

CAPEX__PRIVATE capex_result capex__go_ws_check(const char *fn, capex_cuda_ptr ws, size_t have, size_t need) {
    if (!ws || (ws & 7u))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: workspace must be an 8-byte aligned device address (got 0x%llx)",
                           fn, (unsigned long long)ws);
    if (have < need)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: workspace has %zu bytes but these lists need %zu "
                           "(capex_cuda_multi_tensor_workspace_size)", fn, have, need);
    return CAPEX_OK;
}

/* Sum of squares of every list into per-chunk partials at ws (lists in
   order), then the fixed-order total into ws[chunks] (double). */
CAPEX__PRIVATE capex_result capex__go_sumsq_lists(const capex__go_exec *ex, const capex_tensor_op_desc *desc,
                                                  const capex_tensor_list *lists, size_t nlists, capex_cuda_ptr ws,
                                                  int64_t chunks, capex_cuda_stream s) {
    capex__go_args a;
    capex_result r = CAPEX_OK;
    int64_t off = 0, zero = 0;
    size_t l, i;
    for (l = 0; l < nlists && r == CAPEX_OK; l++) {
        const capex_tensor_list *x = &lists[l];
        capex__go_ten *ten;
        int64_t c = 0;
        if (x->count == 0) continue;
        ten = (capex__go_ten *)capex__alloc(NULL, x->count * sizeof *ten);
        if (!ten) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "multi-tensor norm: out of host memory");
        for (i = 0; i < x->count; i++) ten[i].addr[CAPEX__GO_SUMSQ_X] = (uint64_t)(uintptr_t)x->tensors[i].data;
        memset(&a, 0, sizeof a);
        a.op.sumsq.partial = ws + 8u * (uint64_t)off;
        r = capex__go_mta(ex, CAPEX__GO_K_SUMSQ + (int)x->dtype, CAPEX__GO_SUMSQ_DEPTH, x->tensors, ten, x->count,
                          capex__go_chunk_of(desc), &a, &a.op.sumsq.partial, NULL, s, &c);
        capex__free(NULL, ten);
        off += c;
    }
    if (r != CAPEX_OK) return r;
    return capex__go_reduce(ex, ws, &zero, &chunks, 1, ws + 8u * (uint64_t)chunks, 0, s);
}

CAPEX__PRIVATE capex_result capex__go_l2norm(const capex__go_exec *ex, const capex_tensor_op_desc *desc,
                                             const capex_tensor_list *x, capex_cuda_ptr ws, size_t ws_bytes,
                                             capex_cuda_ptr total, capex_cuda_ptr per, capex_cuda_stream s) {
    const char *fn = "capex_cuda_multi_tensor_l2norm";
    int64_t chunks, chunk = capex__go_chunk_of(desc), *st;
    size_t need, i;
    capex_result r;
    if ((r = capex__go_ws_size(fn, desc, x, x ? 1 : 0, &chunks, &need)) != CAPEX_OK) return r;
    if (!x) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: x is NULL", fn);
    if ((total & 3u) || (per & 3u)) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: outputs must be float addresses", fn);
    if ((r = capex__go_ws_check(fn, ws, ws_bytes, need)) != CAPEX_OK) return r;
    if ((r = capex__go_sumsq_lists(ex, desc, x, 1, ws, chunks, s)) != CAPEX_OK) return r;
    if (total) {
        int64_t zero = 0;
        if ((r = capex__go_reduce(ex, ws, &zero, &chunks, 1, 0, total, s)) != CAPEX_OK) return r;
    }
    if (!per || x->count == 0) return CAPEX_OK;
    st = (int64_t *)capex__alloc(NULL, 2 * x->count * sizeof *st);
    if (!st) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (i = 0, chunks = 0; i < x->count; i++) { /* a tensor's chunks are consecutive; empty: none (norm 0) */
        st[i] = chunks;
        st[x->count + i] = capex__go_nchunks(x->tensors[i].numel, chunk);
        chunks += st[x->count + i];
    }
    r = capex__go_reduce(ex, ws, st, st + x->count, x->count, 0, per, s);
    capex__free(NULL, st);
    return r;
}

CAPEX__PRIVATE capex_result capex__go_clip(const capex__go_exec *ex, const capex_tensor_op_desc *desc,
                                           const capex_tensor_list *grads, size_t nlists, float max_norm,
                                           capex_cuda_ptr ws, size_t ws_bytes, capex_cuda_ptr total,
                                           capex_cuda_ptr coef, int apply, capex_cuda_stream s) {
    const char *fn = "capex_cuda_clip_grad_norm";
    int64_t chunks;
    size_t need, l;
    capex__go_args a;
    capex_result r;
    if ((r = capex__go_ws_size(fn, desc, grads, nlists, &chunks, &need)) != CAPEX_OK) return r;
    if (max_norm != max_norm || max_norm < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: max_norm is %g; it must be >= 0 (inf: no clipping)", fn,
                           (double)max_norm);
    if ((total & 3u) || (coef & 3u)) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: outputs must be float addresses", fn);
    if ((r = capex__go_ws_check(fn, ws, ws_bytes, need)) != CAPEX_OK) return r;
    /* the in-place scale's check, before anything is launched: the host never sees the
       factor, so a list that cannot be scaled in place would fail after the writes */
    for (l = 0; apply && l < nlists; l++) {
        char name[32], mname[32];
        size_t m;
        snprintf(name, sizeof name, "grads[%zu]", l);
        if ((r = capex__check_alias(fn, name, &grads[l], name, &grads[l])) != CAPEX_OK) return r;
        for (m = 0; m < l; m++) { /* one tensor in two lists: scaled twice */
            snprintf(mname, sizeof mname, "grads[%zu]", m);
            if ((r = capex__check_disjoint(fn, mname, &grads[m], name, &grads[l])) != CAPEX_OK) return r;
        }
    }
    /* each list's scale loaded first: one that cannot be had (no NVRTC, a refused
       image) must fail the call before a list is scaled, not after some were */
    for (l = 0; apply && ex->load && l < nlists; l++) {
        size_t i;
        for (i = 0; i < grads[l].count && grads[l].tensors[i].numel == 0; i++) continue;
        if (i < grads[l].count &&
            (r = ex->load(ex->user, CAPEX__GO_K_SCALE + 4 * (int)grads[l].dtype, CAPEX__CUDA_VB(0, 0, 1, 1))) != CAPEX_OK)
            return r;
    }
    if ((r = capex__go_sumsq_lists(ex, desc, grads, nlists, ws, chunks, s)) != CAPEX_OK) return r;
    /* the partials are dead after the total: the factor may live at ws[0] */
    if (!coef && apply) coef = ws;
    memset(&a, 0, sizeof a);
    a.op.clip.sumsq = ws + 8u * (uint64_t)chunks;
    a.op.clip.total = total;
    a.op.clip.coef = coef;
    a.op.clip.max_norm = max_norm;
    if ((r = capex__go_small(ex, CAPEX__GO_K_CLIP, 1, 1, &a, s)) != CAPEX_OK) return r;
    for (l = 0; apply && l < nlists && r == CAPEX_OK; l++)
        r = capex__go_scale(ex, fn, desc, &grads[l], &grads[l], coef, 0, 1, s);
    return r;
}

CAPEX_API capex_result capex_cuda_multi_tensor_scale(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                     const capex_tensor_list *in, const capex_tensor_list *out,
                                                     capex_cuda_ptr scale, capex_cuda_ptr found_inf,
                                                     capex_cuda_stream stream) {
    capex__go_exec ex;
    capex_result r = capex__go_dev_exec(ctx, "capex_cuda_multi_tensor_scale", &ex);
    if (r != CAPEX_OK) return r;
    return capex__go_scale(&ex, "capex_cuda_multi_tensor_scale", desc, in, out, scale, found_inf, 0, stream);
}

CAPEX_API capex_result capex_cuda_multi_tensor_l2norm(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                      const capex_tensor_list *x, capex_cuda_ptr workspace,
                                                      size_t workspace_bytes, capex_cuda_ptr total_norm,
                                                      capex_cuda_ptr per_tensor_norms, capex_cuda_stream stream) {
    capex__go_exec ex;
    capex_result r = capex__go_dev_exec(ctx, "capex_cuda_multi_tensor_l2norm", &ex);
    if (r != CAPEX_OK) return r;
    return capex__go_l2norm(&ex, desc, x, workspace, workspace_bytes, total_norm, per_tensor_norms, stream);
}

CAPEX_API capex_result capex_cuda_clip_grad_norm(capex_cuda_context *ctx, const capex_tensor_op_desc *desc,
                                                 const capex_tensor_list *grads, size_t nlists, float max_norm,
                                                 capex_cuda_ptr workspace, size_t workspace_bytes,
                                                 capex_cuda_ptr total_norm, capex_cuda_ptr clip_coef, int apply,
                                                 capex_cuda_stream stream) {
    capex__go_exec ex;
    capex_result r = capex__go_dev_exec(ctx, "capex_cuda_clip_grad_norm", &ex);
    if (r != CAPEX_OK) return r;
    return capex__go_clip(&ex, desc, grads, nlists, max_norm, workspace, workspace_bytes, total_norm, clip_coef, apply,
                          stream);
}

/* ---- device-resident loss scaler ---- */

struct capex_cuda_scaler {
    capex__go_exec ex;
    capex_scaler_desc desc;
    capex_cuda_ptr d; /* capex__go_scaler */
};

CAPEX__PRIVATE void capex__go_scaler_fill(capex__go_scaler *g, const capex_scaler_state *st) {
    memset(g, 0, sizeof *g);
    g->growth_factor = st->growth_factor;
    g->backoff_factor = st->backoff_factor;
    g->growth_interval = st->growth_interval;
    g->growth_tracker = st->growth_tracker;
    g->steps = st->steps;
    g->skipped_steps = st->skipped_steps;
    g->scale = st->scale;
    g->inv_scale = (float)(1.0 / (double)st->scale); /* capex_scaler_get_inv_scale */
    g->min_scale = st->min_scale;
    g->max_scale = st->max_scale;
    g->dynamic = st->dynamic;
    g->hysteresis = st->hysteresis;
    g->hysteresis_tracker = st->hysteresis_tracker;
}

CAPEX__PRIVATE capex_result capex__go_scaler_create(const capex__go_exec *ex, const capex_scaler_desc *desc,
                                                    capex_cuda_scaler **out) {
    capex_scaler tmp;
    capex_scaler_state st;
    capex__go_scaler g;
    capex_cuda_scaler *sc;
    capex_scaler_desc def;
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_create: out is NULL");
    *out = NULL;
    if (!desc) { capex_scaler_desc_init(&def); desc = &def; }
    if ((r = capex_scaler_init(&tmp, desc)) != CAPEX_OK) return r; /* validates desc */
    if ((r = capex_scaler_get_state(&tmp, &st)) != CAPEX_OK) return r;
    sc = (capex_cuda_scaler *)capex__alloc(NULL, sizeof *sc);
    if (!sc) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_scaler_create: out of memory");
    memset(sc, 0, sizeof *sc);
    sc->ex = *ex;
    sc->desc = *desc;
    capex__go_scaler_fill(&g, &st);
    if ((r = ex->alloc(ex->user, sizeof g, &sc->d)) != CAPEX_OK || (r = ex->htod(ex->user, sc->d, &g, sizeof g, NULL)) != CAPEX_OK ||
        (r = capex__go_sync(ex)) != CAPEX_OK) { /* the copy is complete before any stream uses the scaler */
        capex_cuda_scaler_destroy(sc);
        return r;
    }
    *out = sc;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_scaler_create(capex_cuda_context *ctx, const capex_scaler_desc *desc,
                                                capex_cuda_scaler **out) {
    capex__go_exec ex;
    capex_result r;
    if (out) *out = NULL;
    if ((r = capex__go_dev_exec(ctx, "capex_cuda_scaler_create", &ex)) != CAPEX_OK) return r;
    if ((r = capex__go_scaler_create(&ex, desc, out)) == CAPEX_OK) {
        int k = CAPEX__GO_K_SCALER; /* its update kernel compiles in the background meanwhile */
        unsigned vb = CAPEX__CUDA_VB(0, 0, 0, 0);
        ex.prefetch(ex.user, &k, &vb, 1);
    }
    return r;
}

CAPEX_API void capex_cuda_scaler_destroy(capex_cuda_scaler *sc) {
    if (!sc) return;
    if (sc->d) sc->ex.release(sc->ex.user, sc->d);
    capex__free(NULL, sc);
}

CAPEX_API capex_cuda_ptr capex_cuda_scaler_scale_ptr(const capex_cuda_scaler *sc) {
    return sc ? sc->d + offsetof(capex__go_scaler, scale) : 0;
}
CAPEX_API capex_cuda_ptr capex_cuda_scaler_inv_scale_ptr(const capex_cuda_scaler *sc) {
    return sc ? sc->d + offsetof(capex__go_scaler, inv_scale) : 0;
}
CAPEX_API capex_cuda_ptr capex_cuda_scaler_found_inf_ptr(const capex_cuda_scaler *sc) {
    return sc ? sc->d + offsetof(capex__go_scaler, found_inf) : 0;
}

CAPEX_API capex_result capex_cuda_scaler_unscale(capex_cuda_scaler *sc, const capex_tensor_op_desc *desc,
                                                 const capex_tensor_list *grads, const capex_tensor_list *out,
                                                 capex_cuda_stream stream) {
    if (!sc) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_unscale: scaler is NULL");
    return capex__go_scale(&sc->ex, "capex_cuda_scaler_unscale", desc, grads, out, capex_cuda_scaler_inv_scale_ptr(sc),
                           capex_cuda_scaler_found_inf_ptr(sc), 0, stream);
}

CAPEX_API capex_result capex_cuda_scaler_update(capex_cuda_scaler *sc, capex_cuda_stream stream) {
    capex__go_args a;
    if (!sc) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_update: scaler is NULL");
    memset(&a, 0, sizeof a);
    a.op.scaler.state = sc->d;
    return capex__go_small(&sc->ex, CAPEX__GO_K_SCALER, 1, 1, &a, stream);
}

CAPEX_API capex_result capex_cuda_scaler_get_state(capex_cuda_scaler *sc, capex_scaler_state *st,
                                                   capex_cuda_stream stream) {
    capex__go_scaler g;
    capex_result r;
    if (!sc || !st) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_get_state: NULL argument");
    if ((r = sc->ex.dtoh(sc->ex.user, &g, sc->d, sizeof g, stream)) != CAPEX_OK) return r;
    memset(st, 0, sizeof *st);
    st->dynamic = g.dynamic;
    st->scale = g.scale;
    st->growth_tracker = g.growth_tracker;
    st->hysteresis_tracker = g.hysteresis_tracker;
    st->init_scale = sc->desc.init_scale;
    st->growth_factor = g.growth_factor;
    st->backoff_factor = g.backoff_factor;
    st->growth_interval = g.growth_interval;
    st->min_scale = g.min_scale;
    st->max_scale = g.max_scale;
    st->hysteresis = g.hysteresis;
    st->steps = g.steps;
    st->skipped_steps = g.skipped_steps;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_scaler_set_state(capex_cuda_scaler *sc, const capex_scaler_state *st,
                                                   capex_cuda_stream stream) {
    capex_scaler tmp;
    capex__go_scaler g;
    capex_result r;
    if (!sc || !st) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_set_state: NULL argument");
    if ((r = capex_scaler_init(&tmp, &sc->desc)) != CAPEX_OK) return r;
    if ((r = capex_scaler_set_state(&tmp, st)) != CAPEX_OK) return r; /* validates every field */
    capex__go_scaler_fill(&g, st);
    if ((r = sc->ex.htod(sc->ex.user, sc->d, &g, sizeof g, stream)) != CAPEX_OK) return r;
    sc->desc.init_scale = st->init_scale;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_scaler_get_scale(capex_cuda_scaler *sc, float *scale, capex_cuda_stream stream) {
    if (!sc || !scale) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_scaler_get_scale: NULL argument");
    return sc->ex.dtoh(sc->ex.user, scale, capex_cuda_scaler_scale_ptr(sc), sizeof(float), stream);
}

/* ---- fused optimizers ---- */

typedef struct capex__go_t {
    capex_optim_param p; /* device pointers; exp_avg / exp_avg_sq: the buffers in use */
    size_t group;
    int mk;              /* model copy: 0 none, 1 f16, 2 bf16, 3 bf16 stochastic rounding */
    unsigned char own_m, own_v;
    unsigned char own_vm; /* amsgrad's max_exp_avg_sq allocated here */
} capex__go_t;

struct capex_cuda_optim {
    capex__go_exec ex;
    capex_optim_desc desc;
    int64_t chunk;
    capex_optim_hparams *hp; /* host copy per group (validation, get) */
    unsigned char *mom_bufs; /* SGD, per group: added with momentum, so it has buffers (the
                                group's config: every ZeRO rank decides alike, pieces or not) */
    size_t ngroups;
    capex_cuda_ptr dgroups;  /* capex__go_group per group */
    capex__go_t *t;
    size_t nt;
    int64_t chunks;          /* over all tensors */
    capex_tensor *shape;     /* per-step scratch, nt each */
    capex__go_ten *ten;
    int64_t *seg;            /* LAMB: 2 * nt (chunk start, chunk count) */
    capex_cuda_ptr dlamb;    /* LAMB: part[2 * chunks] sp[nt] su[nt] g2 | ratio[nt] tgroup[nt] */
    capex_cuda_ptr dnovo;    /* NovoGrad: part[chunks] n2[nt] (double) | v[nt] denom[nt] (f32) tgroup[nt] */
    int has_sched;           /* an lr schedule is attached */
    capex_lr_schedule sched;
    capex_cuda_ptr dsched;   /* the schedule's iteration count (int64, the device's), capex__lr_p, then
                                float base lr per group (dsched_groups of them) */
    size_t dsched_groups, dsched_cap;
    capex_cuda_ptr dvm;      /* Adam amsgrad: u64[nt], each tensor's max_exp_avg_sq (0: none); 0 without amsgrad */
    capex_cuda_ptr one;      /* pure_half: a device float 1.0f (the mirror's scale factor) */
    size_t n_pure;           /* tensors with pure_half */
    /* Sharded LAMB (capex_cuda_zero): where this optimizer's tensors are
       pieces of tensors split across ranks, the step hands its sums to
       reduce_fn on the device, in place, on the step's stream: what 0: the
       squared global grad norm (1 double); what 1: |p|^2 per tensor then
       |u|^2 per tensor (2 * n doubles, n = tensors); what 2: NovoGrad's
       per-tensor sum of squared grads (n doubles). NULL: not sharded. */
    capex_result (*reduce_fn)(void *user, int what, capex_cuda_ptr vals, size_t n, capex_cuda_stream s);
    void *reduce_user;
    int sealed; /* capex_cuda_zero's: its tensors are shard pieces, so add_group is refused */
    int ready;  /* every kernel a step launches is loaded (capex__go_step_ready); reset by what changes them */
    /* capex_cuda_zero over several ranks: a change of what the step launches
       (set_hparams, set_lr_schedule, from_host) loads it then, before it
       changes anything (capex__go_ready_as), so a step loads nothing: a
       load failing there on one rank alone left its peers in the all-gather */
    int load_at_change;
};
CAPEX__PRIVATE capex_result capex__go_sched_upload(capex_cuda_optim *o, capex_cuda_stream stream,
                                                  const int64_t *iter);
CAPEX__PRIVATE capex_result capex__go_ready_as(capex_cuda_optim *o, const char *fn, const capex_optim_desc *desc,
                                               capex_optim_hparams *hps, int sched);
/* A tensor's model copy store (capex__go_t.mk) under the optimizer's modes. */
CAPEX__PRIVATE int capex__go_mk(const capex_cuda_optim *o, const capex_optim_param *p) {
    return !p->model ? 0 : p->model_dtype == CAPEX_F16 ? 1 : o->desc.stochastic_rounding ? 3 : 2;
}

CAPEX__PRIVATE void capex__go_hp_to_group(const capex_optim_hparams *hp, capex__go_group *g) {
    g->lr = hp->lr;
    g->beta1 = hp->beta1;
    g->beta2 = hp->beta2;
    g->eps = hp->eps;
    g->wd = hp->weight_decay;
    g->momentum = hp->momentum;
    g->dampening = hp->dampening;
    g->bias_correction = hp->bias_correction != 0;
    g->grad_averaging = hp->grad_averaging != 0;
    g->nesterov = hp->nesterov != 0;
    g->lr_decay = hp->lr_decay;
}
/* the hyperparameter bytes of capex__go_group: lr .. nesterov */
#define CAPEX__GO_HP_OFF offsetof(capex__go_group, lr)
#define CAPEX__GO_HP_LEN (offsetof(capex__go_group, mom_init) - offsetof(capex__go_group, lr))

CAPEX__PRIVATE capex_result capex__go_optim_create(const capex__go_exec *ex, const capex_optim_desc *desc,
                                                   capex_cuda_optim **out) {
    capex_cuda_optim *o;
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_create: out is NULL");
    *out = NULL;
    if (!desc) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_create: desc is NULL; use capex_optim_desc_init");
    if ((r = capex__optim_check_desc(desc)) != CAPEX_OK) return r;
    o = (capex_cuda_optim *)capex__alloc(NULL, sizeof *o);
    if (!o) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_optim_create: out of memory");
    memset(o, 0, sizeof *o);
    o->ex = *ex;
    o->desc = *desc;
    o->desc.allocator = NULL;
    o->chunk = desc->exec.chunk_size ? desc->exec.chunk_size : CAPEX_CHUNK_SIZE_DEFAULT;
    *out = o;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_optim_create(capex_cuda_context *ctx, const capex_optim_desc *desc,
                                               capex_cuda_optim **out) {
    capex__go_exec ex;
    capex_result r;
    if (out) *out = NULL;
    if ((r = capex__go_dev_exec(ctx, "capex_cuda_optim_create", &ex)) != CAPEX_OK) return r;
    return capex__go_optim_create(&ex, desc, out);
}

CAPEX_API void capex_cuda_optim_destroy(capex_cuda_optim *o) {
    size_t k;
    if (!o) return;
    for (k = 0; k < o->nt; k++) {
        if (o->t[k].own_m) o->ex.release(o->ex.user, (capex_cuda_ptr)(uintptr_t)o->t[k].p.exp_avg);
        if (o->t[k].own_v) o->ex.release(o->ex.user, (capex_cuda_ptr)(uintptr_t)o->t[k].p.exp_avg_sq);
        if (o->t[k].own_vm) o->ex.release(o->ex.user, (capex_cuda_ptr)(uintptr_t)o->t[k].p.max_exp_avg_sq);
    }
    if (o->dgroups) o->ex.release(o->ex.user, o->dgroups);
    if (o->dvm) o->ex.release(o->ex.user, o->dvm);
    if (o->dlamb) o->ex.release(o->ex.user, o->dlamb);
    if (o->dnovo) o->ex.release(o->ex.user, o->dnovo);
    if (o->dsched) o->ex.release(o->ex.user, o->dsched);
    if (o->one) o->ex.release(o->ex.user, o->one);
    capex__free(NULL, o->hp);
    capex__free(NULL, o->mom_bufs);
    capex__free(NULL, o->t);
    capex__free(NULL, o->shape);
    capex__free(NULL, o->ten);
    capex__free(NULL, o->seg);
    capex__free(NULL, o);
}

CAPEX_API size_t capex_cuda_optim_num_groups(const capex_cuda_optim *o) { return o ? o->ngroups : 0; }

/* Sets n floats at dst to x (Adagrad's initial_accumulator_value) by copies
   from a host block: the exec has no fill, and this runs once per add_group. */
CAPEX__PRIVATE capex_result capex__go_fill(const capex__go_exec *ex, capex_cuda_ptr dst, int64_t n, float x) {
    const int64_t fill_n = 16384;
    float *buf = (float *)capex__alloc(NULL, (size_t)fill_n * sizeof *buf);
    capex_result r = CAPEX_OK;
    int64_t i, at;
    if (!buf) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_optim_add_group: out of host memory");
    for (i = 0; i < fill_n; i++) buf[i] = x;
    for (at = 0; at < n && r == CAPEX_OK; at += fill_n) {
        int64_t c = n - at < fill_n ? n - at : fill_n;
        r = ex->htod(ex->user, dst + 4u * (uint64_t)at, buf, (size_t)c * 4u, NULL);
    }
    capex__free(NULL, buf);
    return r;
}

CAPEX__PRIVATE size_t capex__go_lamb_bytes(int64_t chunks, size_t nt) {
    return 8u * (2u * (size_t)chunks + 2u * nt + 1u) + 8u * nt;
}
/* NovoGrad's buffer: offsets of n2 (k 0), v, denom, tgroup, and (k 4) its size */
CAPEX__PRIVATE size_t capex__go_novo_at(int64_t chunks, size_t nt, int k) {
    size_t at = 8u * (size_t)chunks + 8u * nt;
    return k == 0 ? 8u * (size_t)chunks : at + 4u * nt * (size_t)(k - 1);
}

/* pure_half tensors among t[0..n): param = f32(model), one multi-tensor
   scale by 1.0f per model dtype (exact), enqueued on s. */
CAPEX__PRIVATE capex_result capex__go_mirror(capex_cuda_optim *o, const capex__go_t *t, size_t n, const char *fn,
                                             capex_cuda_stream s) {
    capex_tensor *in, *out;
    size_t k, m;
    int dt;
    capex_result r = CAPEX_OK;
    for (k = 0, m = 0; k < n; k++) m += t[k].p.pure_half && t[k].p.numel;
    if (!m) return CAPEX_OK;
    if (!o->one) { /* kept only once written: a later mirror must not scale by garbage */
        float one = 1.0f;
        capex_cuda_ptr d = 0;
        if ((r = o->ex.alloc(o->ex.user, 4, &d)) != CAPEX_OK) return r;
        if ((r = o->ex.htod(o->ex.user, d, &one, 4, NULL)) != CAPEX_OK) {
            o->ex.release(o->ex.user, d);
            return r;
        }
        o->one = d;
    }
    in = (capex_tensor *)capex__alloc(NULL, 2 * m * sizeof *in);
    if (!in) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    out = in + m;
    for (dt = (int)CAPEX_F16; r == CAPEX_OK && dt <= (int)CAPEX_BF16; dt++) {
        capex_tensor_list li, lo;
        size_t c = 0;
        for (k = 0; k < n; k++)
            if (t[k].p.pure_half && t[k].p.numel && (int)t[k].p.model_dtype == dt) {
                in[c].data = t[k].p.model;
                in[c].numel = t[k].p.numel;
                out[c].data = t[k].p.param;
                out[c].numel = t[k].p.numel;
                c++;
            }
        if (!c) continue;
        li = capex_tensor_list_make((capex_dtype)dt, in, c);
        lo = capex_tensor_list_make(CAPEX_F32, out, c);
        r = capex__go_scale(&o->ex, fn, NULL, &li, &lo, o->one, 0, 0, s);
    }
    capex__free(NULL, in);
    return r;
}

CAPEX_API capex_result capex_cuda_optim_add_group(capex_cuda_optim *o, const capex_optim_hparams *hp,
                                                  const capex_optim_param *params, size_t n, size_t *group_index) {
    const char *fn = "capex_cuda_optim_add_group";
    size_t k, nt;
    int need_m, need_v, need_vm, any_vm;
    int64_t chunks = 0;
    capex_result r = CAPEX_OK;
    capex_cuda_ptr *bufs = NULL, dgroups = 0, dlamb = 0, dnovo = 0, dvm = 0;
    capex__go_group *groups = NULL;
    capex_optim_hparams *nhp = NULL;
    unsigned char *nmb = NULL;
    capex__go_t *nt_t = NULL;
    capex_tensor *shape = NULL;
    capex__go_ten *ten = NULL;
    int64_t *seg = NULL;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    if (o->sealed)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: this is capex_cuda_zero_optim's optimizer, over this rank's shard "
                           "pieces; give every param and group to capex_cuda_zero_create instead", fn);
    if (!params && n) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: params is NULL with n = %zu", fn, n);
    if (!hp) hp = &o->desc.defaults;
    if ((r = capex__optim_check_hp(&o->desc, hp)) != CAPEX_OK) return r;
    for (k = 0; k < n; k++) {
        if ((r = capex__optim_check_param(&o->desc, &params[k], k)) != CAPEX_OK) return r;
        chunks += capex__go_nchunks(params[k].numel, o->chunk);
        if (capex__go_nchunks(params[k].numel, o->chunk) > (int64_t)UINT32_MAX + 1)
            return capex__fail(CAPEX_ERR_LIMIT, "%s: params[%zu] needs more than 2^32 chunks; raise desc.exec.chunk_size", fn, k);
    }
    if (o->ngroups + 1 > (size_t)INT32_MAX || o->nt + n > (size_t)INT32_MAX)
        return capex__fail(CAPEX_ERR_LIMIT, "%s: too many groups or tensors", fn);
    if ((r = capex__optim_check_aliases(o->t, sizeof *o->t, o->nt, NULL, params, n, &o->desc, hp, fn)) != CAPEX_OK) return r;
    need_m = o->desc.kind == CAPEX_OPTIM_SGD ? hp->momentum != 0.0f : o->desc.kind != CAPEX_OPTIM_ADAGRAD;
    need_v = o->desc.kind != CAPEX_OPTIM_SGD && o->desc.kind != CAPEX_OPTIM_NOVOGRAD; /* Adagrad: the sum */
    need_vm = o->desc.kind == CAPEX_OPTIM_ADAM && hp->amsgrad;
    nt = o->nt + n;
    /* everything new is built aside; the optimizer changes only at the end */
    bufs = (capex_cuda_ptr *)capex__alloc(NULL, 3 * (n ? n : 1) * sizeof *bufs);
    groups = (capex__go_group *)capex__alloc(NULL, (o->ngroups + 1) * sizeof *groups);
    nhp = (capex_optim_hparams *)capex__alloc(NULL, (o->ngroups + 1) * sizeof *nhp);
    nmb = (unsigned char *)capex__alloc(NULL, o->ngroups + 1);
    nt_t = (capex__go_t *)capex__alloc(NULL, (nt ? nt : 1) * sizeof *nt_t);
    shape = (capex_tensor *)capex__alloc(NULL, (nt ? nt : 1) * sizeof *shape);
    ten = (capex__go_ten *)capex__alloc(NULL, (nt ? nt : 1) * sizeof *ten);
    seg = (int64_t *)capex__alloc(NULL, 2 * (nt ? nt : 1) * sizeof *seg);
    if (!bufs || !groups || !nhp || !nmb || !nt_t || !shape || !ten || !seg) {
        r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        goto fail;
    }
    memset(bufs, 0, 3 * (n ? n : 1) * sizeof *bufs);
    memset(groups, 0, (o->ngroups + 1) * sizeof *groups);
    /* steps queued on the caller's streams must have run before their step
       counts are read here and their group table is freed below */
    if ((r = capex__go_sync(&o->ex)) != CAPEX_OK) goto fail;
    if (o->ngroups && (r = o->ex.dtoh(o->ex.user, groups, o->dgroups, o->ngroups * sizeof *groups, NULL)) != CAPEX_OK)
        goto fail;
    capex__go_hp_to_group(hp, &groups[o->ngroups]);
    for (k = 0; k < n && r == CAPEX_OK; k++) {
        size_t bytes = (size_t)params[k].numel * sizeof(float);
        if (!bytes) continue;
        if (need_m && !params[k].exp_avg) r = o->ex.alloc(o->ex.user, bytes, &bufs[3 * k]);
        if (r == CAPEX_OK && need_v && !params[k].exp_avg_sq) r = o->ex.alloc(o->ex.user, bytes, &bufs[3 * k + 1]);
        if (r == CAPEX_OK && need_vm && !params[k].max_exp_avg_sq) r = o->ex.alloc(o->ex.user, bytes, &bufs[3 * k + 2]);
    }
    if (r != CAPEX_OK) goto fail;
    if ((r = o->ex.alloc(o->ex.user, (o->ngroups + 1) * sizeof *groups, &dgroups)) != CAPEX_OK) goto fail;
    if ((r = o->ex.htod(o->ex.user, dgroups, groups, (o->ngroups + 1) * sizeof *groups, NULL)) != CAPEX_OK) goto fail;
    if (o->desc.kind == CAPEX_OPTIM_LAMB &&
        (r = o->ex.alloc(o->ex.user, capex__go_lamb_bytes(o->chunks + chunks, nt), &dlamb)) != CAPEX_OK)
        goto fail;
    if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) { /* v of the old tensors carried over, 0 for the new; tensor -> group */
        int64_t nc = o->chunks + chunks;
        float *hv = (float *)capex__alloc(NULL, (nt ? nt : 1) * 4u);
        int32_t *tg = (int32_t *)capex__alloc(NULL, (nt ? nt : 1) * 4u);
        if (!hv || !tg) r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        if (r == CAPEX_OK) r = o->ex.alloc(o->ex.user, capex__go_novo_at(nc, nt, 4) + 8u, &dnovo);
        if (r == CAPEX_OK && o->nt)
            r = o->ex.dtoh(o->ex.user, hv, o->dnovo + capex__go_novo_at(o->chunks, o->nt, 1), 4u * o->nt, NULL);
        for (k = 0; r == CAPEX_OK && k < nt; k++) {
            if (k >= o->nt) hv[k] = 0.0f;
            tg[k] = (int32_t)(k < o->nt ? o->t[k].group : o->ngroups);
        }
        if (r == CAPEX_OK && nt) r = o->ex.htod(o->ex.user, dnovo + capex__go_novo_at(nc, nt, 1), hv, 4u * nt, NULL);
        if (r == CAPEX_OK && nt) r = o->ex.htod(o->ex.user, dnovo + capex__go_novo_at(nc, nt, 3), tg, 4u * nt, NULL);
        capex__free(NULL, hv);
        capex__free(NULL, tg);
        if (r != CAPEX_OK) goto fail;
    }
    if (o->nt) memcpy(nt_t, o->t, o->nt * sizeof *nt_t);
    for (k = 0; k < n; k++) {
        capex__go_t *t = &nt_t[o->nt + k];
        memset(t, 0, sizeof *t);
        t->p = params[k];
        t->group = o->ngroups;
        if (bufs[3 * k]) t->p.exp_avg = (float *)(uintptr_t)bufs[3 * k];
        if (bufs[3 * k + 1]) t->p.exp_avg_sq = (float *)(uintptr_t)bufs[3 * k + 1];
        if (bufs[3 * k + 2]) t->p.max_exp_avg_sq = (float *)(uintptr_t)bufs[3 * k + 2];
        t->own_m = bufs[3 * k] != 0;
        t->own_v = bufs[3 * k + 1] != 0;
        t->own_vm = bufs[3 * k + 2] != 0;
        if (!need_m || !t->p.numel) t->p.exp_avg = NULL;
        if (!need_v || !t->p.numel) t->p.exp_avg_sq = NULL;
        if (!need_vm || !t->p.numel) t->p.max_exp_avg_sq = NULL;
        if (!t->p.model || !t->p.numel) t->p.model = NULL;
        t->mk = capex__go_mk(o, &t->p);
        if (t->p.exp_avg && (r = o->ex.zero(o->ex.user, (capex_cuda_ptr)(uintptr_t)t->p.exp_avg, (size_t)t->p.numel * 4u, NULL)) != CAPEX_OK) goto fail;
        if (t->p.exp_avg_sq && (r = o->ex.zero(o->ex.user, (capex_cuda_ptr)(uintptr_t)t->p.exp_avg_sq, (size_t)t->p.numel * 4u, NULL)) != CAPEX_OK) goto fail;
        if (t->p.max_exp_avg_sq && (r = o->ex.zero(o->ex.user, (capex_cuda_ptr)(uintptr_t)t->p.max_exp_avg_sq, (size_t)t->p.numel * 4u, NULL)) != CAPEX_OK) goto fail;
        if (o->desc.kind == CAPEX_OPTIM_ADAGRAD && t->p.exp_avg_sq && hp->initial_accumulator_value != 0.0f &&
            (r = capex__go_fill(&o->ex, (capex_cuda_ptr)(uintptr_t)t->p.exp_avg_sq, t->p.numel, hp->initial_accumulator_value)) != CAPEX_OK)
            goto fail;
    }
    /* amsgrad: the table of max buffers the kernel looks up by tensor index */
    for (k = 0, any_vm = 0; k < nt; k++) any_vm |= nt_t[k].p.max_exp_avg_sq != NULL;
    if (any_vm) {
        uint64_t *tab = (uint64_t *)capex__alloc(NULL, nt * sizeof *tab);
        if (!tab) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn); goto fail; }
        for (k = 0; k < nt; k++) tab[k] = (uint64_t)(uintptr_t)nt_t[k].p.max_exp_avg_sq;
        r = o->ex.alloc(o->ex.user, nt * sizeof *tab, &dvm);
        if (r == CAPEX_OK) r = o->ex.htod(o->ex.user, dvm, tab, nt * sizeof *tab, NULL);
        capex__free(NULL, tab);
        if (r != CAPEX_OK) goto fail;
    }
    if (dlamb) { /* tensor -> group table for the trust-ratio kernel */
        int32_t *tg = (int32_t *)shape; /* scratch: nt * 16 bytes >= nt * 4 */
        for (k = 0; k < nt; k++) tg[k] = (int32_t)nt_t[k].group;
        if ((r = o->ex.htod(o->ex.user, dlamb + capex__go_lamb_bytes(o->chunks + chunks, nt) - 4u * nt, tg, 4u * nt, NULL)) != CAPEX_OK)
            goto fail;
    }
    /* pure_half (O3): the fp32 params start as the model copy's values */
    if ((r = capex__go_mirror(o, nt_t + o->nt, n, fn, NULL)) != CAPEX_OK) goto fail;
    /* the zeroing and copies are done before a step on any stream reads them */
    if ((r = capex__go_sync(&o->ex)) != CAPEX_OK) goto fail;
    if (o->ngroups) memcpy(nhp, o->hp, o->ngroups * sizeof *nhp);
    nhp[o->ngroups] = *hp;
    if (o->ngroups) memcpy(nmb, o->mom_bufs, o->ngroups);
    nmb[o->ngroups] = o->desc.kind == CAPEX_OPTIM_SGD && need_m;
    /* commit */
    if (o->dgroups) o->ex.release(o->ex.user, o->dgroups);
    if (o->dlamb) o->ex.release(o->ex.user, o->dlamb);
    if (o->dnovo) o->ex.release(o->ex.user, o->dnovo);
    if (o->dvm) o->ex.release(o->ex.user, o->dvm);
    capex__free(NULL, o->hp);
    capex__free(NULL, o->mom_bufs);
    capex__free(NULL, o->t);
    capex__free(NULL, o->shape);
    capex__free(NULL, o->ten);
    capex__free(NULL, o->seg);
    o->dgroups = dgroups;
    o->dlamb = dlamb;
    o->dnovo = dnovo;
    o->dvm = dvm;
    o->hp = nhp;
    o->mom_bufs = nmb;
    o->t = nt_t;
    o->shape = shape;
    o->ten = ten;
    o->seg = seg;
    o->nt = nt;
    o->chunks += chunks;
    for (k = 0; k < n; k++) o->n_pure += params[k].pure_half && params[k].numel;
    if (group_index) *group_index = o->ngroups;
    o->ngroups++;
    o->ready = 0;
    capex__free(NULL, bufs);
    capex__free(NULL, groups);
    if (o->ex.prefetch) { /* what a step launches compiles in the background meanwhile */
        int ks[32], nk = 0, seen[3][4], lamb2_seen[4] = {0, 0, 0, 0};
        unsigned vbs[32];
        memset(seen, 0, sizeof seen);
        for (k = 0; k < 32; k++) vbs[k] = CAPEX__CUDA_VB(0, 0, 0, 0);
        ks[nk++] = CAPEX__GO_K_PREPARE;
        if (o->desc.kind == CAPEX_OPTIM_LAMB) ks[nk++] = CAPEX__GO_K_LAMB_RATIO;
        if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) ks[nk++] = CAPEX__GO_K_NOVO_NORM;
        for (k = 0; k < n; k++) { /* the step's launches per grad dtype and model copy kind (capex__go_step) */
            const capex__go_t *t = &o->t[o->nt - n + k];
            int gd = (int)t->p.grad_dtype, mk = t->mk;
            if (gd < 0 || gd > 2 || mk < 0 || mk > 3 || seen[gd][mk]) continue;
            seen[gd][mk] = 1;
            if (o->desc.kind == CAPEX_OPTIM_LAMB && !lamb2_seen[mk]++) { /* stage 2: a launch per model kind */
                vbs[nk] = CAPEX__CUDA_VB(o->desc.adam_w_mode != 0, mk, 0, 0);
                ks[nk++] = CAPEX__GO_K_LAMB2;
            }
            /* the variant's switches (capex__go_vb): SGD's first is momentum on, NovoGrad's reg_inside_moment */
            vbs[nk] = CAPEX__CUDA_VB(o->desc.kind == CAPEX_OPTIM_SGD        ? hp->momentum != 0.0f
                                     : o->desc.kind == CAPEX_OPTIM_NOVOGRAD ? o->desc.reg_inside_moment != 0
                                                                            : o->desc.adam_w_mode != 0,
                                     mk, 0, 0);
            ks[nk++] = (o->desc.kind == CAPEX_OPTIM_ADAM ? (need_vm ? (int)CAPEX__GO_K_ADAM_AMS : (int)CAPEX__GO_K_ADAM)
                        : o->desc.kind == CAPEX_OPTIM_SGD ? (int)CAPEX__GO_K_SGD
                        : o->desc.kind == CAPEX_OPTIM_NOVOGRAD ? (int)CAPEX__GO_K_NOVO2 /* its variant holds pass 1 too */
                        : o->desc.kind == CAPEX_OPTIM_ADAGRAD ? (int)CAPEX__GO_K_ADAGRAD : (int)CAPEX__GO_K_LAMB1) + gd;
        }
        o->ex.prefetch(o->ex.user, ks, vbs, nk);
    }
    if (o->has_sched && (r = capex__go_sched_upload(o, NULL, NULL)) != CAPEX_OK) /* steps leave the group unscheduled */
        return capex__fail(r, "%s: group %zu was added, but the lr schedule could not take its base lr (%s); call "
                           "capex_cuda_optim_set_lr_schedule again", fn, o->ngroups - 1, capex_result_string(r));
    return CAPEX_OK;
fail:
    if (bufs)
        for (k = 0; k < 3 * n; k++)
            if (bufs[k]) o->ex.release(o->ex.user, bufs[k]);
    if (dgroups) o->ex.release(o->ex.user, dgroups);
    if (dlamb) o->ex.release(o->ex.user, dlamb);
    if (dnovo) o->ex.release(o->ex.user, dnovo);
    if (dvm) o->ex.release(o->ex.user, dvm);
    capex__free(NULL, bufs);
    capex__free(NULL, groups);
    capex__free(NULL, nhp);
    capex__free(NULL, nmb);
    capex__free(NULL, nt_t);
    capex__free(NULL, shape);
    capex__free(NULL, ten);
    capex__free(NULL, seg);
    return r;
}

/* After a pass over the c tensors gathered by capex__go_class: tensor t's
   chunk partials start at `at` and lie consecutive in plan order; slot is
   the address list holding the tensor index (CAPEX__GO_*_T). Read by
   capex__go_reduce. */
CAPEX__PRIVATE void capex__go_record_segs(capex_cuda_optim *o, size_t c, int slot, int64_t at) {
    size_t k, nt = o->nt;
    for (k = 0; k < c; k++) {
        size_t t = (size_t)o->ten[k].addr[slot];
        o->seg[t] = at;
        o->seg[nt + t] = capex__go_nchunks(o->shape[k].numel, o->chunk);
        at += o->seg[nt + t];
    }
}

/* Blocks of 256 threads for a kernel with one thread per tensor (it
   grid-strides beyond 1024 blocks). */
CAPEX__PRIVATE unsigned capex__go_tensor_grid(size_t nt) {
    return (unsigned)((nt + 255) / 256 < 1024 ? (nt + 255) / 256 : 1024);
}

/* Gathers the tensors of one class (group, grad dtype or -1 for any, model
   kind or -1) into o->shape / o->ten with the address lists (CAPEX__GO_LISTS)
   of kernel family `kernel` (CAPEX__GO_K_ADAM, ..., the f32 one); returns
   the count. CAPEX__GO_K_SUMSQ: the grads only. */
CAPEX__PRIVATE size_t capex__go_class(capex_cuda_optim *o, size_t group, int gd, int mk, int kernel) {
    size_t k, c = 0;
    for (k = 0; k < o->nt; k++) {
        const capex__go_t *t = &o->t[k];
        uint64_t g = (uint64_t)(uintptr_t)t->p.grad, p = (uint64_t)(uintptr_t)t->p.param;
        uint64_t m = (uint64_t)(uintptr_t)t->p.exp_avg, v = (uint64_t)(uintptr_t)t->p.exp_avg_sq;
        uint64_t h = (uint64_t)(uintptr_t)t->p.model;
        uint64_t *a = o->ten[c].addr;
        if ((group != (size_t)-1 && t->group != group) || (gd >= 0 && (int)t->p.grad_dtype != gd) ||
            (mk >= 0 && t->mk != mk))
            continue;
        memset(a, 0, sizeof o->ten[c].addr);
        switch (kernel) {
        case CAPEX__GO_K_ADAM:
        case CAPEX__GO_K_ADAM_AMS:
            a[CAPEX__GO_ADAM_G] = g; a[CAPEX__GO_ADAM_P] = p; a[CAPEX__GO_ADAM_M] = m; a[CAPEX__GO_ADAM_V] = v;
            a[CAPEX__GO_ADAM_MODEL] = h; a[CAPEX__GO_ADAM_T] = k;
            break;
        case CAPEX__GO_K_SGD: /* exp_avg is the momentum buffer */
            a[CAPEX__GO_SGD_G] = g; a[CAPEX__GO_SGD_P] = p; a[CAPEX__GO_SGD_BUF] = m; a[CAPEX__GO_SGD_MODEL] = h;
            a[CAPEX__GO_SGD_T] = k;
            break;
        case CAPEX__GO_K_LAMB1:
            a[CAPEX__GO_LAMB1_G] = g; a[CAPEX__GO_LAMB1_P] = p; a[CAPEX__GO_LAMB1_M] = m; a[CAPEX__GO_LAMB1_V] = v;
            a[CAPEX__GO_LAMB1_T] = k;
            break;
        case CAPEX__GO_K_LAMB2:
            a[CAPEX__GO_LAMB2_P] = p; a[CAPEX__GO_LAMB2_M] = m; a[CAPEX__GO_LAMB2_V] = v; a[CAPEX__GO_LAMB2_MODEL] = h;
            a[CAPEX__GO_LAMB2_T] = k;
            break;
        case CAPEX__GO_K_NOVO1: a[CAPEX__GO_NOVO1_G] = g; a[CAPEX__GO_NOVO1_T] = k; break;
        case CAPEX__GO_K_NOVO2:
            a[CAPEX__GO_NOVO2_G] = g; a[CAPEX__GO_NOVO2_P] = p; a[CAPEX__GO_NOVO2_M] = m; a[CAPEX__GO_NOVO2_MODEL] = h;
            a[CAPEX__GO_NOVO2_T] = k;
            break;
        case CAPEX__GO_K_ADAGRAD: /* exp_avg_sq is the sum of squares */
            a[CAPEX__GO_ADAGRAD_G] = g; a[CAPEX__GO_ADAGRAD_P] = p; a[CAPEX__GO_ADAGRAD_SUM] = v;
            a[CAPEX__GO_ADAGRAD_MODEL] = h; a[CAPEX__GO_ADAGRAD_T] = k;
            break;
        default: a[CAPEX__GO_SUMSQ_X] = g; break;
        }
        o->shape[c].data = NULL;
        o->shape[c].numel = t->p.numel;
        c++;
    }
    return c;
}

CAPEX__PRIVATE capex_result capex__go_step_lamb(capex_cuda_optim *o, capex_cuda_stream s) {
    capex__go_args a;
    capex_result r = CAPEX_OK;
    size_t g, c, nt = o->nt;
    int gd, mk;
    int64_t off = 0, zero = 0, total = 0;
    capex_cuda_ptr part = o->dlamb, sp = part + 16u * (uint64_t)o->chunks, su = sp + 8u * nt, g2 = su + 8u * nt;
    capex_cuda_ptr ratio = g2 + 8u, tgroup = ratio + 4u * nt;
    const int w = o->desc.adam_w_mode != 0;
    /* 1. global grad norm: per-chunk partials of every grad, one fixed-order total */
    for (gd = 0; gd < 3 && r == CAPEX_OK; gd++) {
        int64_t ch = 0;
        if (!(c = capex__go_class(o, (size_t)-1, gd, -1, CAPEX__GO_K_SUMSQ))) continue;
        memset(&a, 0, sizeof a);
        a.op.sumsq.partial = part + 8u * (uint64_t)off;
        r = capex__go_mta(&o->ex, CAPEX__GO_K_SUMSQ + gd, CAPEX__GO_SUMSQ_DEPTH, o->shape, o->ten, c, o->chunk, &a,
                          &a.op.sumsq.partial, NULL, s, &ch);
        off += ch;
    }
    total = off;
    if (r == CAPEX_OK) r = capex__go_reduce(&o->ex, part, &zero, &total, 1, g2, 0, s);
    if (r == CAPEX_OK && o->reduce_fn) r = o->reduce_fn(o->reduce_user, 0, g2, 1, s); /* sharded: every rank's */
    memset(&a, 0, sizeof a);
    a.op.lamb_clip.groups = o->dgroups;
    a.op.lamb_clip.sumsq = g2;
    a.op.lamb_clip.ngroups = (int32_t)o->ngroups;
    a.op.lamb_clip.max_grad_norm = o->desc.max_grad_norm;
    if (r == CAPEX_OK) r = capex__go_small(&o->ex, CAPEX__GO_K_LAMB_CLIP, 1, 1, &a, s);
    /* 2. stage 1 per (group, grad dtype): moments, |p|^2 and |u|^2 partials */
    off = 0;
    for (g = 0; g < o->ngroups && r == CAPEX_OK; g++)
        for (gd = 0; gd < 3 && r == CAPEX_OK; gd++) {
            int64_t ch = 0, at = off;
            if (!(c = capex__go_class(o, g, gd, -1, CAPEX__GO_K_LAMB1))) continue;
            memset(&a, 0, sizeof a);
            a.op.lamb1.group = o->dgroups + g * sizeof(capex__go_group);
            a.op.lamb1.p_sumsq = part + 8u * (uint64_t)off;
            a.op.lamb1.u_sumsq = part + 8u * (uint64_t)(o->chunks + off);
            a.op.lamb1.w_mode = w;
            r = capex__go_mta(&o->ex, CAPEX__GO_K_LAMB1 + gd, CAPEX__GO_LAMB1_DEPTH, o->shape, o->ten, c, o->chunk, &a,
                              &a.op.lamb1.p_sumsq, &a.op.lamb1.u_sumsq, s, &ch);
            capex__go_record_segs(o, c, CAPEX__GO_LAMB1_T, at);
            off += ch;
        }
    /* 3. per-tensor norms, trust ratios */
    if (r == CAPEX_OK) r = capex__go_reduce(&o->ex, part, o->seg, o->seg + nt, nt, sp, 0, s);
    if (r == CAPEX_OK) r = capex__go_reduce(&o->ex, part + 8u * (uint64_t)o->chunks, o->seg, o->seg + nt, nt, su, 0, s);
    if (r == CAPEX_OK && o->reduce_fn && nt) r = o->reduce_fn(o->reduce_user, 1, sp, nt, s); /* su follows sp */
    memset(&a, 0, sizeof a);
    a.op.lamb_ratio.groups = o->dgroups;
    a.op.lamb_ratio.p_sumsq = sp;
    a.op.lamb_ratio.u_sumsq = su;
    a.op.lamb_ratio.ratio = ratio;
    a.op.lamb_ratio.tgroup = tgroup;
    a.op.lamb_ratio.ntensors = (int32_t)nt;
    a.op.lamb_ratio.use_nvlamb = o->desc.use_nvlamb != 0;
    if (r == CAPEX_OK && nt)
        r = capex__go_small(&o->ex, CAPEX__GO_K_LAMB_RATIO, capex__go_tensor_grid(nt), 256, &a, s);
    /* 4. stage 2 per (group, model kind) */
    for (g = 0; g < o->ngroups && r == CAPEX_OK; g++)
        for (mk = 0; mk < 4 && r == CAPEX_OK; mk++) {
            if (!(c = capex__go_class(o, g, -1, mk, CAPEX__GO_K_LAMB2))) continue;
            memset(&a, 0, sizeof a);
            a.op.lamb2.group = o->dgroups + g * sizeof(capex__go_group);
            a.op.lamb2.seed = o->desc.seed;
            a.op.lamb2.ratio = ratio;
            a.op.lamb2.w_mode = w;
            a.op.lamb2.model = mk;
            r = capex__go_mta(&o->ex, CAPEX__GO_K_LAMB2, CAPEX__GO_LAMB2_DEPTH, o->shape, o->ten, c, o->chunk, &a, NULL,
                              NULL, s, NULL);
        }
    return r;
}

/* NovoGrad: per-chunk sums of (g*gs)^2, per-tensor totals in a fixed order,
   v and denom per tensor, then the element update (capex.h's order). */
CAPEX__PRIVATE capex_result capex__go_step_novo(capex_cuda_optim *o, capex_cuda_stream s) {
    capex__go_args a;
    capex_result r = CAPEX_OK;
    size_t g, c, i, nt = o->nt;
    int gd, mk;
    int64_t off = 0;
    capex_cuda_ptr part = o->dnovo, n2 = part + capex__go_novo_at(o->chunks, nt, 0);
    capex_cuda_ptr v = part + capex__go_novo_at(o->chunks, nt, 1), denom = part + capex__go_novo_at(o->chunks, nt, 2);
    capex_cuda_ptr tgroup = part + capex__go_novo_at(o->chunks, nt, 3);
    for (g = 0; g < o->ngroups && r == CAPEX_OK; g++)
        for (gd = 0; gd < 3 && r == CAPEX_OK; gd++) {
            int64_t ch = 0, at = off;
            if (!(c = capex__go_class(o, g, gd, -1, CAPEX__GO_K_NOVO1))) continue;
            memset(&a, 0, sizeof a);
            a.op.novo1.group = o->dgroups + g * sizeof(capex__go_group);
            a.op.novo1.partial = part + 8u * (uint64_t)off;
            /* pass 2's switches for its first launch here (model kinds go in increasing
               order): one variant holds both passes */
            a.op.novo1.reg_inside_moment = o->desc.reg_inside_moment != 0;
            a.op.novo1.model = 3;
            for (i = 0; i < c; i++) {
                const int tmk = o->t[o->ten[i].addr[CAPEX__GO_NOVO1_T]].mk;
                if (tmk < a.op.novo1.model) a.op.novo1.model = tmk;
            }
            r = capex__go_mta(&o->ex, CAPEX__GO_K_NOVO1 + gd, CAPEX__GO_NOVO1_DEPTH, o->shape, o->ten, c, o->chunk, &a,
                              &a.op.novo1.partial, NULL, s, &ch);
            capex__go_record_segs(o, c, CAPEX__GO_NOVO1_T, at);
            off += ch;
        }
    if (r == CAPEX_OK) r = capex__go_reduce(&o->ex, part, o->seg, o->seg + nt, nt, n2, 0, s);
    if (r == CAPEX_OK && o->reduce_fn && nt) r = o->reduce_fn(o->reduce_user, 2, n2, nt, s); /* sharded: whole tensors' */
    memset(&a, 0, sizeof a);
    a.op.novo_norm.groups = o->dgroups;
    a.op.novo_norm.sumsq = n2;
    a.op.novo_norm.v = v;
    a.op.novo_norm.denom = denom;
    a.op.novo_norm.tgroup = tgroup;
    a.op.novo_norm.ntensors = (int32_t)nt;
    a.op.novo_norm.init_zero = o->desc.init_zero != 0;
    if (r == CAPEX_OK && nt)
        r = capex__go_small(&o->ex, CAPEX__GO_K_NOVO_NORM, capex__go_tensor_grid(nt), 256, &a, s);
    for (g = 0; g < o->ngroups && r == CAPEX_OK; g++)
        for (gd = 0; gd < 3 && r == CAPEX_OK; gd++)
            for (mk = 0; mk < 4 && r == CAPEX_OK; mk++) {
                if (!(c = capex__go_class(o, g, gd, mk, CAPEX__GO_K_NOVO2))) continue;
                memset(&a, 0, sizeof a);
                a.op.novo2.group = o->dgroups + g * sizeof(capex__go_group);
                a.op.novo2.seed = o->desc.seed;
                a.op.novo2.denom = denom;
                a.op.novo2.reg_inside_moment = o->desc.reg_inside_moment != 0;
                a.op.novo2.model = mk;
                r = capex__go_mta(&o->ex, CAPEX__GO_K_NOVO2 + gd, CAPEX__GO_NOVO2_DEPTH, o->shape, o->ten, c, o->chunk, &a,
                                  NULL, NULL, s, NULL);
            }
    return r;
}

/* Writes the schedule's parameters and every group's base lr to dsched
   (grown as groups are added), and the iteration count when iter is given;
   else the device's count stays (steps advance it there, captured ones too),
   carried over when the buffer grows. A step reads it; nothing else is read
   back. */
CAPEX__PRIVATE capex_result capex__go_sched_upload(capex_cuda_optim *o, capex_cuda_stream stream,
                                                  const int64_t *iter) {
    unsigned char *buf;
    capex__lr_p *p;
    float *base;
    int64_t it = iter ? *iter : 0;
    size_t g, bytes;
    int whole = iter != NULL;
    capex_result r;
    if (!o->has_sched) return CAPEX_OK;
    bytes = 8u + sizeof(capex__lr_p) + (o->ngroups ? o->ngroups : 1) * sizeof(float);
    buf = (unsigned char *)capex__alloc(NULL, bytes);
    if (!buf) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "capex_cuda_optim: lr schedule: out of host memory");
    memset(buf, 0, bytes);
    p = (capex__lr_p *)(buf + 8);
    capex__lr_params(&o->sched, p);
    base = (float *)(p + 1);
    for (g = 0; g < o->ngroups; g++) base[g] = o->hp[g].lr;
    if (o->dsched_cap < bytes) {
        capex_cuda_ptr d = 0;
        if ((r = o->ex.alloc(o->ex.user, bytes, &d)) != CAPEX_OK) { capex__free(NULL, buf); return r; }
        if (o->dsched) { /* a step queued on another stream may still read the old one */
            if ((r = capex__go_sync(&o->ex)) != CAPEX_OK ||
                (!iter && (r = o->ex.dtoh(o->ex.user, &it, o->dsched, sizeof it, NULL)) != CAPEX_OK)) {
                o->ex.release(o->ex.user, d);
                capex__free(NULL, buf);
                return r;
            }
            o->ex.release(o->ex.user, o->dsched);
        }
        o->dsched = d;
        o->dsched_cap = bytes;
        o->dsched_groups = 0;
        whole = 1;
    }
    memcpy(buf, &it, sizeof it);
    r = whole ? o->ex.htod(o->ex.user, o->dsched, buf, bytes, stream)
              : o->ex.htod(o->ex.user, o->dsched + 8u, buf + 8, bytes - 8u, stream);
    capex__free(NULL, buf);
    if (r == CAPEX_OK) o->dsched_groups = o->ngroups;
    return r;
}

CAPEX_API capex_result capex_cuda_optim_set_lr_schedule(capex_cuda_optim *o, const capex_lr_schedule *s,
                                                        capex_cuda_stream stream) {
    capex_result r;
    capex_lr_schedule old;
    int had;
    const int64_t zero = 0;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_set_lr_schedule: optimizer is NULL");
    if (!s) { /* the steps wrote scheduled lrs into the groups: back to the base (hp.lr), as the CPU */
        size_t g;
        for (g = 0, r = CAPEX_OK; o->has_sched && g < o->ngroups && r == CAPEX_OK; g++)
            r = o->ex.htod(o->ex.user, capex_cuda_optim_lr_ptr(o, g), &o->hp[g].lr, sizeof(float), stream);
        if (r == CAPEX_OK) o->has_sched = 0;
        return r;
    }
    if ((r = capex_lr_schedule_check(s)) != CAPEX_OK) return r;
    if ((r = capex__go_ready_as(o, "capex_cuda_optim_set_lr_schedule", NULL, NULL, 1)) != CAPEX_OK) return r;
    old = o->sched;
    had = o->has_sched;
    o->sched = *s;
    o->has_sched = 1;
    if (!o->load_at_change) o->ready = 0; /* a step launches the schedule's kernel now */
    /* a new schedule (torch: a new scheduler) counts from 0; a replacing one keeps the count */
    if ((r = capex__go_sched_upload(o, stream, had ? NULL : &zero)) != CAPEX_OK) { o->sched = old; o->has_sched = had; }
    /* its kernel's part compiles in the background meanwhile (load_at_change: loaded above) */
    if (r == CAPEX_OK && !had && !o->load_at_change && o->ex.prefetch) {
        int k = CAPEX__GO_K_LR_SCHED;
        unsigned vb = CAPEX__CUDA_VB(0, 0, 0, 0);
        o->ex.prefetch(o->ex.user, &k, &vb, 1);
    }
    return r;
}

static capex_result capex__go_step(capex_cuda_optim *o, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                    capex_cuda_ptr found_inf, capex_cuda_stream stream);

/* Launch hook of capex__go_step_ready: loads kernel k's unit, launches nothing. */
CAPEX__PRIVATE capex_result capex__go_dev_load_only(void *user, int k, unsigned vb, unsigned grid, unsigned block,
                                                    void **args, capex_cuda_stream s) {
    (void)grid, (void)block, (void)args, (void)s;
    return capex__go_dev_load(user, k, vb);
}

/* Loads every kernel the step launches before anything is enqueued: the step
   once more with launches that only load (capex__go_dev_load_only) and no sharded
   reduction (a collective). Else a kernel that cannot be had (no NVRTC and no
   cache entry, an image the driver refuses, no memory) failed the step after
   prepare had counted it on the device: weights untouched, step count (and
   bias corrections) one ahead, one more per retry. Done once per change of
   the step's kernels (o->ready). */
CAPEX__PRIVATE capex_result capex__go_step_load(capex_cuda_optim *o, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                                capex_cuda_ptr found_inf) {
    capex__go_exec real = o->ex;
    capex_result (*reduce)(void *, int, capex_cuda_ptr, size_t, capex_cuda_stream) = o->reduce_fn;
    capex_result r;
    o->ex.launch = capex__go_dev_load_only;
    o->ex.grid = NULL;
    o->reduce_fn = NULL;
    r = capex__go_step(o, inv_scale, clip_coef, found_inf, NULL); /* the mirror's kernels (O3) come in it too */
    o->ex = real;
    o->reduce_fn = reduce;
    return r;
}
CAPEX__PRIVATE capex_result capex__go_step_ready(capex_cuda_optim *o, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                                 capex_cuda_ptr found_inf) {
    capex_result r = capex__go_step_load(o, inv_scale, clip_coef, found_inf);
    char why[1024];
    if (r == CAPEX_OK) o->ready = 1;
    if (r == CAPEX_OK || r == CAPEX_ERR_INVALID_ARG) return r; /* an argument's message says it all */
    capex__cuda_fmt(why, sizeof why, "%s", capex_last_error());
    return capex__fail(r, "capex_cuda_optim_step: the step was not taken (nothing was enqueued): %s", why);
}
/* o->load_at_change: loads what a step launches with desc (NULL: o's), the
   groups' hparams hps (NULL: o's) and a schedule attached or not, changing
   nothing; the caller makes the change after it (o->ready stays 1). A
   failure is fn's, with nothing changed. The stochastic rounding that would
   change the tensors' model stores (capex__go_mk) is refused on these. */
CAPEX__PRIVATE capex_result capex__go_ready_as(capex_cuda_optim *o, const char *fn, const capex_optim_desc *desc,
                                               capex_optim_hparams *hps, int sched) {
    capex_optim_desc d0 = o->desc;
    capex_optim_hparams *h0 = o->hp;
    int s0 = o->has_sched;
    capex_result r;
    char why[1024];
    if (!o->load_at_change || o->ex.launch != capex__go_dev_launch) return CAPEX_OK;
    if (desc) o->desc = *desc;
    if (hps) o->hp = hps;
    o->has_sched = sched;
    r = capex__go_step_load(o, 0, 0, 0);
    o->desc = d0;
    o->hp = h0;
    o->has_sched = s0;
    if (r == CAPEX_OK) return r;
    capex__cuda_fmt(why, sizeof why, "%s", capex_last_error());
    return capex__fail(r, "%s: nothing was changed: the kernels the next step would launch could not be loaded "
                       "(this optimizer's steps load none: a load failing on one rank there left its peers "
                       "waiting): %s", fn, why);
}

CAPEX_API capex_result capex_cuda_optim_step(capex_cuda_optim *o, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                             capex_cuda_ptr found_inf, capex_cuda_stream stream) {
    capex_result r;
    if (o && !o->ready && o->ex.launch == capex__go_dev_launch &&
        (r = capex__go_step_ready(o, inv_scale, clip_coef, found_inf)) != CAPEX_OK)
        return r;
    r = capex__go_step(o, inv_scale, clip_coef, found_inf, stream);
    /* O3: the weights are the rounded model copy (after a skipped step it is
       unchanged, and so is this) */
    if (r == CAPEX_OK && o->n_pure) r = capex__go_mirror(o, o->t, o->nt, "capex_cuda_optim_step", stream);
    return r;
}

static capex_result capex__go_step(capex_cuda_optim *o, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                    capex_cuda_ptr found_inf, capex_cuda_stream stream) {
    capex__go_args a;
    capex_result r;
    size_t g, c, k;
    int gd, mk;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_step: optimizer is NULL");
    if ((inv_scale & 3u) || (clip_coef & 3u) || (found_inf & 3u))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_step: inv_scale, clip_coef and found_inf must be "
                           "4-byte aligned device addresses (or 0)");
    if (o->ngroups == 0) return CAPEX_OK;
    /* O3: the weights are the model copy, which the engine may have written
       since the last step (restored weights): start from it, as capex_optim_step */
    if (o->n_pure && (r = capex__go_mirror(o, o->t, o->nt, "capex_cuda_optim_step", stream)) != CAPEX_OK) return r;
    /* the step's constants, on the device: nothing is read back */
    memset(&a, 0, sizeof a);
    a.op.prepare.groups = o->dgroups;
    a.op.prepare.found_inf = found_inf;
    a.op.prepare.inv_scale = inv_scale;
    a.op.prepare.clip_coef = clip_coef;
    a.op.prepare.ngroups = (int32_t)o->ngroups;
    a.op.prepare.wd_after_momentum = o->desc.wd_after_momentum != 0;
    a.op.prepare.sgd = o->desc.kind == CAPEX_OPTIM_SGD;
    a.op.prepare.sched = o->has_sched ? o->dsched : 0;
    a.op.prepare.sched_groups = o->has_sched ? (int32_t)o->dsched_groups : 0;
    if (o->has_sched && (r = capex__go_small(&o->ex, CAPEX__GO_K_LR_SCHED, 1, 1, &a, stream)) != CAPEX_OK) return r;
    if ((r = capex__go_small(&o->ex, CAPEX__GO_K_PREPARE, 1, 1, &a, stream)) != CAPEX_OK) return r;
    if (o->desc.kind == CAPEX_OPTIM_LAMB) return capex__go_step_lamb(o, stream);
    if (o->desc.kind == CAPEX_OPTIM_NOVOGRAD) return capex__go_step_novo(o, stream);
    for (g = 0; g < o->ngroups && r == CAPEX_OK; g++)
        for (gd = 0; gd < 3 && r == CAPEX_OK; gd++)
            for (mk = 0; mk < 4 && r == CAPEX_OK; mk++) {
                int adam = o->desc.kind == CAPEX_OPTIM_ADAM;
                if (o->desc.kind == CAPEX_OPTIM_ADAGRAD || (adam && o->hp[g].amsgrad)) {
                    int ada = !adam;
                    if (!(c = capex__go_class(o, g, gd, mk, ada ? CAPEX__GO_K_ADAGRAD : CAPEX__GO_K_ADAM_AMS))) continue;
                    memset(&a, 0, sizeof a);
                    if (ada) { /* adam_w_mode is Adagrad's adagrad_w_mode (capex_optim_desc) */
                        a.op.adagrad.group = o->dgroups + g * sizeof(capex__go_group);
                        a.op.adagrad.seed = o->desc.seed;
                        a.op.adagrad.w_mode = o->desc.adam_w_mode != 0;
                        a.op.adagrad.model = mk;
                    } else {
                        a.op.adam_ams.group = o->dgroups + g * sizeof(capex__go_group);
                        a.op.adam_ams.seed = o->desc.seed;
                        a.op.adam_ams.max_bufs = o->dvm;
                        a.op.adam_ams.w_mode = o->desc.adam_w_mode != 0;
                        a.op.adam_ams.model = mk;
                    }
                    r = capex__go_mta(&o->ex, (ada ? CAPEX__GO_K_ADAGRAD : CAPEX__GO_K_ADAM_AMS) + gd,
                                      ada ? (int)CAPEX__GO_ADAGRAD_DEPTH : (int)CAPEX__GO_ADAM_DEPTH, o->shape, o->ten, c,
                                      o->chunk, &a, NULL, NULL, stream, NULL);
                    continue;
                }
                if (!(c = capex__go_class(o, g, gd, mk, adam ? CAPEX__GO_K_ADAM : CAPEX__GO_K_SGD))) continue;
                memset(&a, 0, sizeof a);
                if (adam) {
                    a.op.adam.group = o->dgroups + g * sizeof(capex__go_group);
                    a.op.adam.seed = o->desc.seed;
                    a.op.adam.w_mode = o->desc.adam_w_mode != 0;
                    a.op.adam.model = mk;
                } else {
                    a.op.sgd.group = o->dgroups + g * sizeof(capex__go_group);
                    a.op.sgd.seed = o->desc.seed;
                    /* momentum buffers, and momentum on now (Apex: if (momentum != 0); a group may turn it off) */
                    for (k = 0; o->hp[g].momentum != 0.0f && k < c; k++)
                        a.op.sgd.momentum |= o->ten[k].addr[CAPEX__GO_SGD_BUF] != 0;
                    a.op.sgd.model = mk;
                }
                r = capex__go_mta(&o->ex, (adam ? CAPEX__GO_K_ADAM : CAPEX__GO_K_SGD) + gd,
                                  adam ? (int)CAPEX__GO_ADAM_DEPTH : (int)CAPEX__GO_SGD_DEPTH, o->shape, o->ten, c, o->chunk,
                                  &a, NULL, NULL, stream, NULL);
            }
    return r;
}

/* lr_only: set_lr's, which launches the same kernels (no load, o->ready kept) */
CAPEX__PRIVATE capex_result capex__go_set_hparams(capex_cuda_optim *o, size_t group, const capex_optim_hparams *hp,
                                                  capex_cuda_stream stream, int lr_only) {
    capex__go_group g;
    capex_result r;
    if (!o || !hp) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_set_hparams: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_set_hparams: group %zu of %zu", group, o->ngroups);
    if ((r = capex__optim_check_hp(&o->desc, hp)) != CAPEX_OK) return r;
    if (o->desc.kind == CAPEX_OPTIM_SGD && hp->momentum != 0.0f && !o->mom_bufs[group])
        return capex__fail(CAPEX_ERR_CONFIG, "SGD: group %zu was created without momentum, so it has no momentum "
                           "buffers; create the group with momentum != 0 to turn momentum on later", group);
    if (o->desc.kind == CAPEX_OPTIM_ADAM && (hp->amsgrad != 0) != (o->hp[group].amsgrad != 0))
        return capex__fail(CAPEX_ERR_CONFIG, "Adam: group %zu was created with amsgrad %d; amsgrad is fixed when the "
                           "group is added (its max_exp_avg_sq buffers exist only then)", group, o->hp[group].amsgrad != 0);
    if (o->load_at_change && !lr_only) { /* SGD's momentum picks the variant */
        capex_optim_hparams was = o->hp[group];
        o->hp[group] = *hp;
        r = capex__go_ready_as(o, "capex_cuda_optim_set_hparams", NULL, NULL, o->has_sched);
        o->hp[group] = was;
        if (r != CAPEX_OK) return r;
    }
    memset(&g, 0, sizeof g);
    capex__go_hp_to_group(hp, &g);
    r = o->ex.htod(o->ex.user, o->dgroups + group * sizeof g + CAPEX__GO_HP_OFF, (const char *)&g + CAPEX__GO_HP_OFF,
                   CAPEX__GO_HP_LEN, stream);
    if (r == CAPEX_OK) /* Adagrad's, outside the lr .. nesterov bytes */
        r = o->ex.htod(o->ex.user, o->dgroups + group * sizeof g + offsetof(capex__go_group, lr_decay), &g.lr_decay,
                       sizeof g.lr_decay, stream);
    if (r == CAPEX_OK) /* SGD's momentum picks the variant (load_at_change: loaded above) */
        o->hp[group] = *hp, o->ready = o->ready && (o->load_at_change || lr_only);
    if (r == CAPEX_OK) r = capex__go_sched_upload(o, stream, NULL); /* the new base lr */
    return r;
}
CAPEX_API capex_result capex_cuda_optim_set_hparams(capex_cuda_optim *o, size_t group, const capex_optim_hparams *hp,
                                                    capex_cuda_stream stream) {
    return capex__go_set_hparams(o, group, hp, stream, 0);
}

CAPEX_API capex_result capex_cuda_optim_set_lr(capex_cuda_optim *o, size_t group, float lr, capex_cuda_stream stream) {
    capex_optim_hparams hp;
    if (!o || group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_set_lr: NULL optimizer or group %zu of %zu", group,
                           o ? o->ngroups : 0);
    hp = o->hp[group];
    hp.lr = lr;
    return capex__go_set_hparams(o, group, &hp, stream, 1);
}

CAPEX_API capex_cuda_ptr capex_cuda_optim_lr_ptr(const capex_cuda_optim *o, size_t group) {
    if (!o || group >= o->ngroups) return 0;
    return o->dgroups + group * sizeof(capex__go_group) + offsetof(capex__go_group, lr);
}

CAPEX_API capex_result capex_cuda_optim_get_step(capex_cuda_optim *o, size_t group, int64_t *step,
                                                 capex_cuda_stream stream) {
    if (!o || !step) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_step: NULL argument");
    if (group >= o->ngroups)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_step: group %zu of %zu", group, o->ngroups);
    return o->ex.dtoh(o->ex.user, step, o->dgroups + group * sizeof(capex__go_group) + offsetof(capex__go_group, step),
                      sizeof *step, stream);
}

CAPEX_API capex_result capex_cuda_optim_get_lr_iteration(capex_cuda_optim *o, int64_t *iteration,
                                                         capex_cuda_stream stream) {
    if (!o || !iteration) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_lr_iteration: NULL argument");
    *iteration = 0;
    if (!o->has_sched) return CAPEX_OK;
    return o->ex.dtoh(o->ex.user, iteration, o->dsched, sizeof *iteration, stream);
}

CAPEX_API capex_result capex_cuda_optim_get_state(const capex_cuda_optim *o, size_t group, size_t index,
                                                  capex_cuda_ptr *exp_avg, capex_cuda_ptr *exp_avg_sq) {
    size_t k, i = 0;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_state: optimizer is NULL");
    for (k = 0; k < o->nt; k++) {
        if (o->t[k].group != group) continue;
        if (i++ != index) continue;
        if (exp_avg) *exp_avg = (capex_cuda_ptr)(uintptr_t)o->t[k].p.exp_avg;
        if (exp_avg_sq) *exp_avg_sq = (capex_cuda_ptr)(uintptr_t)o->t[k].p.exp_avg_sq;
        return CAPEX_OK;
    }
    return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_state: group %zu has no parameter %zu (%zu groups)",
                       group, index, o->ngroups);
}

CAPEX_API capex_result capex_cuda_optim_get_max_exp_avg_sq(const capex_cuda_optim *o, size_t group, size_t index,
                                                           capex_cuda_ptr *max_exp_avg_sq) {
    size_t k, i = 0;
    if (!o) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_max_exp_avg_sq: optimizer is NULL");
    for (k = 0; k < o->nt; k++) {
        if (o->t[k].group != group || i++ != index) continue;
        if (max_exp_avg_sq) *max_exp_avg_sq = (capex_cuda_ptr)(uintptr_t)o->t[k].p.max_exp_avg_sq;
        return CAPEX_OK;
    }
    return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_optim_get_max_exp_avg_sq: group %zu has no parameter %zu "
                       "(%zu groups)", group, index, o->ngroups);
}

/* One host block holds each tensor's fp32 weights, then its model copy, 16-byte aligned. */
CAPEX__PRIVATE size_t capex__go_host_bytes(const capex__go_t *t, size_t *model_at) {
    size_t pb = ((size_t)t->p.numel * 4u + 15u) & ~(size_t)15u;
    *model_at = pb;
    return pb + (t->p.model ? (((size_t)t->p.numel * 2u + 15u) & ~(size_t)15u) : 0);
}
CAPEX__PRIVATE size_t capex__go_host_total(const capex_cuda_optim *o) {
    size_t j, at = 0, m;
    for (j = 0; j < o->nt; j++) at += capex__go_host_bytes(&o->t[j], &m);
    return at;
}

CAPEX_API capex_result capex_cuda_optim_to_host(capex_cuda_optim *o, unsigned flags, capex_cuda_stream stream,
                                                capex_optim **host) {
    const char *fn = "capex_cuda_optim_to_host";
    capex__go_group *groups = NULL;
    capex_optim_param *ps = NULL;
    capex_optim *h = NULL;
    unsigned char *block = NULL;
    capex_result r = CAPEX_OK;
    size_t g, k, at;
    if (host) *host = NULL;
    if (!o || !host) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: optimizer or host is NULL", fn);
    if ((r = capex__optim_flags_ok(flags, fn)) != CAPEX_OK) return r;
    groups = (capex__go_group *)capex__alloc(NULL, (o->ngroups ? o->ngroups : 1) * sizeof *groups);
    ps = (capex_optim_param *)capex__alloc(NULL, (o->nt ? o->nt : 1) * sizeof *ps);
    block = (unsigned char *)capex__alloc(NULL, capex__go_host_total(o) + 16u);
    if (!groups || !ps || !block) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn); goto done; }
    if (o->ngroups && (r = o->ex.dtoh(o->ex.user, groups, o->dgroups, o->ngroups * sizeof *groups, stream)) != CAPEX_OK)
        goto done;
    {
        capex_optim_desc hd = o->desc;
        hd.lamb_low_memory = 1; /* a copy for checkpoints, never stepped: no LAMB update buffer */
        if ((r = capex_optim_create(&hd, &h)) != CAPEX_OK) goto done;
    }
    h->host_block = block; /* freed with h from here on */
    for (k = 0, at = 0; k < o->nt; k++) { /* offsets summed as we go: one pass (it was O(nt^2): 3.5 s for 80k tensors) */
        capex_optim_param *p = &ps[k];
        size_t model_at, bytes = capex__go_host_bytes(&o->t[k], &model_at);
        *p = o->t[k].p;
        p->exp_avg = p->exp_avg_sq = p->max_exp_avg_sq = NULL; /* the host optimizer allocates its own */
        p->param = (float *)(block + at);
        p->grad = p->param; /* placeholder: at least as large as any grad dtype needs */
        p->model = o->t[k].p.model ? (void *)(block + at + model_at) : NULL;
        at += bytes;
    }
    for (g = 0, k = 0; g < o->ngroups && r == CAPEX_OK; g++) {
        size_t first = k;
        while (k < o->nt && o->t[k].group == g) k++;
        /* lr as the device has it: a kernel may drive it (capex_cuda_optim_lr_ptr) */
        if (!o->has_sched) o->hp[g].lr = groups[g].lr; /* scheduled: hp.lr is the base */
        {
            /* SGD with momentum turned off since add_group keeps its buffers (momentum
               resumes from them): add the host group with momentum on so that it has
               them too, then give it the real hyperparameters */
            capex_optim_hparams ah = o->hp[g];
            if (o->mom_bufs[g] && ah.momentum == 0.0f) ah.momentum = 1.0f;
            r = capex_optim_add_group(h, &ah, ps + first, k - first, NULL);
        }
        if (r == CAPEX_OK) {
            h->groups[g].hp = o->hp[g];
            h->groups[g].step = groups[g].step;
            h->groups[g].mom_init = groups[g].mom_init != 0;
        }
    }
    for (k = 0; k < o->nt && r == CAPEX_OK; k++) {
        const capex_optim_param *d = &o->t[k].p;
        capex_optim_param *p = &h->tensors[k].p;
        size_t nb = (size_t)d->numel * 4u;
        if (!nb) continue;
        if (d->exp_avg && p->exp_avg) r = o->ex.dtoh(o->ex.user, p->exp_avg, (capex_cuda_ptr)(uintptr_t)d->exp_avg, nb, stream);
        if (r == CAPEX_OK && d->exp_avg_sq && p->exp_avg_sq)
            r = o->ex.dtoh(o->ex.user, p->exp_avg_sq, (capex_cuda_ptr)(uintptr_t)d->exp_avg_sq, nb, stream);
        if (r == CAPEX_OK && d->max_exp_avg_sq && p->max_exp_avg_sq)
            r = o->ex.dtoh(o->ex.user, p->max_exp_avg_sq, (capex_cuda_ptr)(uintptr_t)d->max_exp_avg_sq, nb, stream);
        if (r == CAPEX_OK && (flags & CAPEX_OPTIM_STATE_PARAMS))
            r = o->ex.dtoh(o->ex.user, p->param, (capex_cuda_ptr)(uintptr_t)d->param, nb, stream);
        if (r == CAPEX_OK && (flags & CAPEX_OPTIM_STATE_PARAMS) && d->model)
            r = o->ex.dtoh(o->ex.user, p->model, (capex_cuda_ptr)(uintptr_t)d->model, nb / 2u, stream);
    }
    if (r == CAPEX_OK && o->desc.kind == CAPEX_OPTIM_NOVOGRAD && o->nt) /* the per-tensor norm average */
        r = o->ex.dtoh(o->ex.user, h->novo_v, o->dnovo + capex__go_novo_at(o->chunks, o->nt, 1), 4u * o->nt, stream);
    if (r == CAPEX_OK && (!(flags & CAPEX_OPTIM_STATE_PARAMS)))
        memset(block, 0, capex__go_host_total(o)); /* defined contents, never saved */
    if (r == CAPEX_OK) h->host_block_params = (flags & CAPEX_OPTIM_STATE_PARAMS) != 0;
    if (r == CAPEX_OK && o->has_sched) r = capex_optim_set_lr_schedule(h, &o->sched);
    if (r == CAPEX_OK && o->has_sched) /* the device's iteration count */
        r = o->ex.dtoh(o->ex.user, &h->sched_iter, o->dsched, sizeof h->sched_iter, stream);
done:
    if (r == CAPEX_OK) *host = h;
    else if (h) capex_optim_destroy(h); /* frees block */
    else capex__free(NULL, block);
    capex__free(NULL, groups);
    capex__free(NULL, ps);
    return r;
}

/* from_host; check_only: its checks alone, the device unchanged (capex_zero_load
   checks on every rank before it agrees to change anything). */
CAPEX__PRIVATE capex_result capex__cuda_optim_from_host(capex_cuda_optim *o, const capex_optim *h, unsigned flags,
                                                        capex_cuda_stream stream, int check_only) {
    const char *fn = "capex_cuda_optim_from_host";
    capex__go_group *groups = NULL;
    capex_optim_desc nd;
    capex_result r = CAPEX_OK;
    size_t g, k;
    if (!o || !h) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: optimizer or host optimizer is NULL", fn);
    if ((r = capex__optim_flags_ok(flags, fn)) != CAPEX_OK) return r;
    if (h->broken) return capex__fail(CAPEX_ERR_ORDER, "%s: the host optimizer's last load failed half-way", fn);
    if ((flags & CAPEX_OPTIM_STATE_PARAMS) && h->host_block && !h->host_block_params)
        return capex__fail(CAPEX_ERR_ORDER, "%s: the host optimizer holds no weights (made by to_host without "
                           "CAPEX_OPTIM_STATE_PARAMS and not loaded with it); copying would zero the device weights", fn);
    if (h->desc.kind != o->desc.kind)
        return capex__fail(CAPEX_ERR_CONFIG, "%s: the host optimizer has kind %d, the device optimizer %d; create the "
                           "device optimizer with the host's (a loaded file's) kind", fn, (int)h->desc.kind,
                           (int)o->desc.kind);
    /* the host's modes, as capex_optim_load takes a file's: the kernels get them per
       launch (arguments, and the variant a launch picks), so they can change */
    nd = o->desc;
    capex__optim_take_modes(&nd, &h->desc);
    if (o->sealed && nd.stochastic_rounding)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "%s: the host optimizer has stochastic_rounding 1; capex_cuda_zero's "
                           "optimizer steps shard pieces and has none (capex_cuda_zero_create refuses it too)", fn);
    if ((r = capex__optim_check_desc(&nd)) != CAPEX_OK) return r;
    if (h->ngroups != o->ngroups || h->ntensors != o->nt)
        return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: host optimizer has %zu groups / %zu params, device %zu / %zu", fn,
                           h->ngroups, h->ntensors, o->ngroups, o->nt);
    for (k = 0; k < o->nt; k++) {
        const capex_optim_param *d = &o->t[k].p, *p = &h->tensors[k].p;
        if (h->tensors[k].group != o->t[k].group || p->numel != d->numel)
            return capex__fail(CAPEX_ERR_SIZE_MISMATCH, "%s: parameter %zu: group %zu, numel %lld on the host; %zu, %lld on the device",
                               fn, k, h->tensors[k].group, (long long)p->numel, o->t[k].group, (long long)d->numel);
        if (!d->numel) continue; /* no buffers to compare or copy */
        if ((!p->exp_avg) != (!d->exp_avg) ||
            (!p->exp_avg_sq) != (!d->exp_avg_sq) || (!p->max_exp_avg_sq) != (!d->max_exp_avg_sq) ||
            ((flags & CAPEX_OPTIM_STATE_PARAMS) && ((!p->model) != (!d->model) || (p->model && p->model_dtype != d->model_dtype))))
            return capex__fail(CAPEX_ERR_SIZE_MISMATCH,
                               "%s: parameter %zu: moment or model buffers differ (optimizer settings or model dtype)", fn, k);
    }
    groups = (capex__go_group *)capex__alloc(NULL, (o->ngroups ? o->ngroups : 1) * sizeof *groups);
    if (!groups) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    /* work queued on any stream (not only `stream`) finishes before the state is replaced */
    if ((r = capex__go_sync(&o->ex)) != CAPEX_OK) goto done;
    if (o->ngroups && (r = o->ex.dtoh(o->ex.user, groups, o->dgroups, o->ngroups * sizeof *groups, stream)) != CAPEX_OK)
        goto done;
    for (g = 0; g < o->ngroups; g++) {
        if ((r = capex__optim_check_hp(&nd, &h->groups[g].hp)) != CAPEX_OK) goto done;
        if (o->desc.kind == CAPEX_OPTIM_ADAM && (h->groups[g].hp.amsgrad != 0) != (o->hp[g].amsgrad != 0)) {
            r = capex__fail(CAPEX_ERR_CONFIG, "%s: group %zu has amsgrad %d on the host, %d on the device; amsgrad is "
                            "fixed when the group is added (its max_exp_avg_sq buffers exist only then)", fn, g,
                            h->groups[g].hp.amsgrad != 0, o->hp[g].amsgrad != 0);
            goto done;
        }
        /* set_hparams' rule: the buffer check above has nothing to compare in a group of empty params */
        if (o->desc.kind == CAPEX_OPTIM_SGD && h->groups[g].hp.momentum != 0.0f && !o->mom_bufs[g]) {
            r = capex__fail(CAPEX_ERR_CONFIG, "%s: group %zu has momentum on the host, but the device group was created "
                            "without it (no momentum buffers)", fn, g);
            goto done;
        }
        if (h->groups[g].step < 0 || h->groups[g].step > CAPEX_STEP_MAX) {
            r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: group %zu has step %lld, outside [0, CAPEX_STEP_MAX = 2^53]", fn,
                            g, (long long)h->groups[g].step);
            goto done;
        }
        capex__go_hp_to_group(&h->groups[g].hp, &groups[g]);
        groups[g].step = h->groups[g].step;
        groups[g].mom_init = h->groups[g].mom_init != 0;
    }
    if (o->load_at_change && o->ngroups) { /* the kernels of the host's modes and hparams, before anything changes:
                                              capex_zero_load checks on every rank, so all fail in its agreement */
        capex_optim_hparams *hps = (capex_optim_hparams *)capex__alloc(NULL, o->ngroups * sizeof *hps);
        if (!hps) { r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn); goto done; }
        for (g = 0; g < o->ngroups; g++) hps[g] = h->groups[g].hp;
        r = capex__go_ready_as(o, fn, &nd, hps, o->has_sched || h->has_sched);
        capex__free(NULL, hps);
        if (r != CAPEX_OK) goto done;
    }
    if (check_only) goto done;
    /* validated: from here the device changes. The read above waited for
       stream, so plain synchronous copies are ordered after its work. */
    for (k = 0; k < o->nt && r == CAPEX_OK; k++) {
        const capex_optim_param *d = &o->t[k].p, *p = &h->tensors[k].p;
        size_t nb = (size_t)d->numel * 4u;
        if (!nb) continue;
        if (d->exp_avg) r = o->ex.htod(o->ex.user, (capex_cuda_ptr)(uintptr_t)d->exp_avg, p->exp_avg, nb, NULL);
        if (r == CAPEX_OK && d->exp_avg_sq)
            r = o->ex.htod(o->ex.user, (capex_cuda_ptr)(uintptr_t)d->exp_avg_sq, p->exp_avg_sq, nb, NULL);
        if (r == CAPEX_OK && d->max_exp_avg_sq)
            r = o->ex.htod(o->ex.user, (capex_cuda_ptr)(uintptr_t)d->max_exp_avg_sq, p->max_exp_avg_sq, nb, NULL);
        if (r == CAPEX_OK && (flags & CAPEX_OPTIM_STATE_PARAMS))
            r = o->ex.htod(o->ex.user, (capex_cuda_ptr)(uintptr_t)d->param, p->param, nb, NULL);
        if (r == CAPEX_OK && (flags & CAPEX_OPTIM_STATE_PARAMS) && d->model)
            r = o->ex.htod(o->ex.user, (capex_cuda_ptr)(uintptr_t)d->model, p->model, nb / 2u, NULL);
    }
    if (r == CAPEX_OK && o->desc.kind == CAPEX_OPTIM_NOVOGRAD && o->nt)
        r = o->ex.htod(o->ex.user, o->dnovo + capex__go_novo_at(o->chunks, o->nt, 1), h->novo_v, 4u * o->nt, NULL);
    if (r == CAPEX_OK && o->ngroups) r = o->ex.htod(o->ex.user, o->dgroups, groups, o->ngroups * sizeof *groups, NULL);
    if (r == CAPEX_OK) r = capex__go_sync(&o->ex); /* landed before a step on any stream reads it */
    if (r == CAPEX_OK) {
        for (g = 0; g < o->ngroups; g++) o->hp[g] = h->groups[g].hp;
        o->ready = o->ready && o->load_at_change; /* the modes pick the kernels' variants (loaded above if so) */
        o->desc = nd;
        for (k = 0; k < o->nt; k++) o->t[k].mk = capex__go_mk(o, &o->t[k].p);
        if (h->has_sched) { o->sched = h->sched; o->has_sched = 1; }
        /* base lrs (and schedule, with its iteration count) from the host */
        r = capex__go_sched_upload(o, NULL, h->has_sched ? &h->sched_iter : NULL);
        if (r == CAPEX_OK) r = capex__go_sync(&o->ex);
    }
done:
    capex__free(NULL, groups);
    return r;
}

CAPEX_API capex_result capex_cuda_optim_from_host(capex_cuda_optim *o, const capex_optim *h, unsigned flags,
                                                  capex_cuda_stream stream) {
    return capex__cuda_optim_from_host(o, h, flags, stream, 0);
}

/* ==== NCCL communicator: implementation ==== */
#ifndef CAPEX_NO_DIST /* CAPEX_NO_DIST: no NCCL communicator */

/* NCCL's ABI, declared here (nccl.h is never included: runtime loading).
   tests/test_nccl_abi.c checks every value against the real nccl.h. */
typedef struct capex__ncclUniqueId { char internal[128]; } capex__ncclUniqueId; /* NCCL_UNIQUE_ID_BYTES */
typedef int capex__ncclResult;
enum { CAPEX__NCCL_SUCCESS = 0, CAPEX__NCCL_UNHANDLED_CUDA_ERROR = 1, CAPEX__NCCL_SYSTEM_ERROR = 2,
       CAPEX__NCCL_INTERNAL_ERROR = 3, CAPEX__NCCL_INVALID_ARGUMENT = 4, CAPEX__NCCL_INVALID_USAGE = 5,
       CAPEX__NCCL_REMOTE_ERROR = 6, CAPEX__NCCL_IN_PROGRESS = 7 };
/* ncclDataType_t (ncclBfloat16 exists since NCCL 2.10) and ncclRedOp_t (ncclAvg since 2.10). */
enum { CAPEX__NCCL_UINT8 = 1, CAPEX__NCCL_INT64 = 4, CAPEX__NCCL_FLOAT16 = 6, CAPEX__NCCL_FLOAT32 = 7,
       CAPEX__NCCL_FLOAT64 = 8, CAPEX__NCCL_BFLOAT16 = 9 };
enum { CAPEX__NCCL_SUM = 0, CAPEX__NCCL_AVG = 4 };
#define CAPEX__NCCL_V2_10 21000 /* NCCL_VERSION(2,10,0): major*10000 + minor*100 + patch since 2.9 */
#define CAPEX__NCCL_V2_14 21400 /* ncclCommInitRankConfig, ncclConfig_t.blocking, ncclInProgress */
/* ncclConfig_t as NCCL 2.14 declared it (newer NCCL: more fields after
   blocking). The struct is versioned: NCCL copies min(size, its own size)
   bytes, checks magic, and gives every field newer than `version` its
   default, so this prefix with version 2.14 is what NCCL_CONFIG_INITIALIZER
   of 2.14 made, with blocking = 0 instead of NCCL_CONFIG_UNDEF_INT. */
typedef struct capex__ncclConfig {
    size_t size;
    unsigned int magic;   /* CAPEX__NCCL_CONFIG_MAGIC */
    unsigned int version; /* CAPEX__NCCL_V2_14 */
    int blocking;
} capex__ncclConfig;
#define CAPEX__NCCL_CONFIG_MAGIC 0xcafebeefu
#define CAPEX__CUDA_ERROR_NOT_READY 600

typedef struct capex__nccl_api {
    int version;
    capex__ncclResult (*GetUniqueId)(capex__ncclUniqueId *);
    capex__ncclResult (*CommInitRank)(void **, int, capex__ncclUniqueId, int);
    capex__ncclResult (*CommDestroy)(void *);
    capex__ncclResult (*CommAbort)(void *);
    capex__ncclResult (*CommGetAsyncError)(void *, capex__ncclResult *);
    capex__ncclResult (*AllReduce)(const void *, void *, size_t, int, int, void *, void *);
    capex__ncclResult (*Broadcast)(const void *, void *, size_t, int, int, void *, void *);
    capex__ncclResult (*AllGather)(const void *, void *, size_t, int, void *, void *);
    capex__ncclResult (*Reduce)(const void *, void *, size_t, int, int, int, void *, void *);
    capex__ncclResult (*GroupStart)(void);
    capex__ncclResult (*GroupEnd)(void);
    const char *(*GetErrorString)(capex__ncclResult);
    const char *(*GetLastError)(void *); /* optional (NCCL 2.13+) */
    capex__ncclResult (*CommInitRankConfig)(void **, int, capex__ncclUniqueId, int, capex__ncclConfig *); /* 2.14+ */
} capex__nccl_api;

/* Looks every symbol up (NCCL itself is loaded once by capex__cuda_nccl_sym). */
CAPEX__PRIVATE capex_result capex__nccl_api_load(capex__nccl_api *a) {
    capex_result r = CAPEX_OK;
    void *p;
    memset(a, 0, sizeof *a);
#define CAPEX__NCCL_SYM(field, name) do { if (r == CAPEX_OK) { p = capex__cuda_nccl_sym(name, &r); memcpy(&a->field, &p, sizeof p); } } while (0)
    CAPEX__NCCL_SYM(GetUniqueId, "ncclGetUniqueId");
    CAPEX__NCCL_SYM(CommInitRank, "ncclCommInitRank");
    CAPEX__NCCL_SYM(CommDestroy, "ncclCommDestroy");
    CAPEX__NCCL_SYM(CommAbort, "ncclCommAbort");
    CAPEX__NCCL_SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    CAPEX__NCCL_SYM(AllReduce, "ncclAllReduce");
    CAPEX__NCCL_SYM(Broadcast, "ncclBroadcast");
    CAPEX__NCCL_SYM(AllGather, "ncclAllGather");
    CAPEX__NCCL_SYM(Reduce, "ncclReduce");
    CAPEX__NCCL_SYM(GroupStart, "ncclGroupStart");
    CAPEX__NCCL_SYM(GroupEnd, "ncclGroupEnd");
    CAPEX__NCCL_SYM(GetErrorString, "ncclGetErrorString");
#undef CAPEX__NCCL_SYM
    if (r != CAPEX_OK) return r;
    p = dlsym(capex__cuda_nccl.lib, "ncclGetLastError");
    memcpy(&a->GetLastError, &p, sizeof p);
    a->version = capex__cuda_nccl.version;
    p = a->version >= CAPEX__NCCL_V2_14 ? dlsym(capex__cuda_nccl.lib, "ncclCommInitRankConfig") : NULL;
    memcpy(&a->CommInitRankConfig, &p, sizeof p);
    return CAPEX_OK;
}

/* A failed NCCL call as CAPEX_ERR_NCCL naming the call (remote errors: COMM). */
CAPEX__PRIVATE capex_result capex__nccl_fail(const capex__nccl_api *a, void *comm, capex__ncclResult e, const char *call) {
    const char *s = a->GetErrorString ? a->GetErrorString(e) : NULL;
    const char *last = a->GetLastError ? a->GetLastError(comm) : NULL;
    return capex__fail(e == CAPEX__NCCL_REMOTE_ERROR || e == CAPEX__NCCL_SYSTEM_ERROR ? CAPEX_ERR_COMM : CAPEX_ERR_NCCL,
                       "%s failed: %s (ncclResult %d)%s%s%s", call, s ? s : "unknown NCCL error", (int)e,
                       last && last[0] ? ": " : "", last ? last : "",
                       e == CAPEX__NCCL_REMOTE_ERROR || e == CAPEX__NCCL_SYSTEM_ERROR
                           ? "; a peer or the network failed: stop the job and restart from a checkpoint"
                           : "; run with NCCL_DEBUG=WARN for NCCL's own log");
}

typedef struct capex__nccl {
    capex__nccl_api api;
    void *comm;                  /* ncclComm_t; NULL after abort                */
    capex_cuda_context *ctx;
    capex_cuda_stream stream;    /* ours, non-blocking                          */
    capex_cuda_stream user;      /* the engine's                                */
    capex_cuda_event ev_user, ev_done;
    capex__CUresult (*cuEventQuery)(void *);
    capex_cuda_ptr scratch;      /* f32 staging (half scale), barrier word      */
    size_t scratch_bytes;
    capex_cuda_ptr uscratch;     /* the same for the memory entries, which run on user */
    size_t uscratch_bytes;
    capex_cuda_ptr hbuf;         /* capex_comm_vtable.host_buffer's (agreements), made at init */
    size_t hbuf_bytes;
    /* request events. [0, n_req_events): nonblocking requests not yet waited
       (a request whose wait failed is never waited again, so destroy frees
       what is left). The last n_idle_events: idle, made by reserve or kept
       after a wait, so that a launch takes one instead of creating it (one
       rank's cuEventCreate failing mid-backward left its peers waiting in the
       collective). */
    capex_cuda_event *req_events;
    size_t n_req_events, n_idle_events, req_events_cap;
    size_t *eq_counts;           /* world_size entries for ZeRO's equal shards (reserve) */
    int use_avg, has_bf16, aborted;
} capex__nccl;

static void capex__nccl_destroy(capex_comm *c); /* identifies an NCCL comm */

CAPEX__PRIVATE capex__nccl *capex__nccl_of(capex_comm *c) { return (capex__nccl *)c->impl; }
#define CAPEX__NCCL_PTR(p) ((capex_cuda_ptr)(uintptr_t)(p))

#define CAPEX__TAG_NCCL_DESC CAPEX__TAG('N', 'C', 'L', 'D')
CAPEX_API void capex_nccl_desc_init(capex_nccl_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->init_tag = CAPEX__TAG_NCCL_DESC;
    d->init_timeout_s = 300.0;
    d->timeout_s = 1800.0;
    d->use_nccl_avg = 1;
}

CAPEX_API int capex_comm_is_nccl(const capex_comm *c) { return c && c->vt && c->vt->destroy == capex__nccl_destroy; }

CAPEX_API capex_result capex_nccl_get_unique_id(capex_nccl_unique_id *id) {
    capex__nccl_api a;
    capex__ncclUniqueId u;
    capex__ncclResult e;
    capex_result r;
    typedef char capex__id_size_ok[sizeof(capex__ncclUniqueId) == sizeof(capex_nccl_unique_id) ? 1 : -1];
    (void)sizeof(capex__id_size_ok);
    if (!id) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_nccl_get_unique_id: id is NULL");
    memset(id, 0, sizeof *id);
    if ((r = capex__nccl_api_load(&a)) != CAPEX_OK) return r;
    memset(&u, 0, sizeof u);
    if ((e = a.GetUniqueId(&u)) != CAPEX__NCCL_SUCCESS) return capex__nccl_fail(&a, NULL, e, "ncclGetUniqueId");
    memcpy(id->bytes, u.internal, sizeof id->bytes);
    return CAPEX_OK;
}

CAPEX__PRIVATE int capex__nccl_id_zero(const capex_nccl_unique_id *id) {
    size_t i;
    for (i = 0; i < sizeof id->bytes; i++) if (id->bytes[i]) return 0;
    return 1;
}

/* port: 0 = auto, else the TCP rendezvous port. */
CAPEX__PRIVATE capex_result capex__nccl_exchange(const capex_dist_env *env, capex_comm *bootstrap, capex_nccl_unique_id *id,
                                                double timeout_s, int port) {
    capex_dist_env local;
    capex_result r;
    int rank;
    if (!id) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_nccl_exchange_unique_id: id is NULL");
    if (!env && !(bootstrap && bootstrap->vt))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_nccl_exchange_unique_id: give env (TCP rendezvous) or a bootstrap comm");
    if (bootstrap && bootstrap->vt && bootstrap->device_buffers)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_nccl_exchange_unique_id: the bootstrap comm must use host buffers "
                                                  "(an MPI or TCP capex_comm), not a device comm");
    if (env && port > 0) { /* an explicit port; 0: env's rdv_port (torchrun's store rule included) */
        local = *env;
        local.rdv_port = port;
        env = &local;
    }
    rank = bootstrap && bootstrap->vt && bootstrap->world_size > 1 ? bootstrap->rank : env ? env->rank : 0;
    if (env && bootstrap && bootstrap->vt && bootstrap->world_size > 1 &&
        (bootstrap->rank != env->rank || bootstrap->world_size != env->world_size))
        return capex__fail(CAPEX_ERR_CONFIG, "capex_nccl_exchange_unique_id: bootstrap comm is rank %d of %d but env says %d of %d",
                           bootstrap->rank, bootstrap->world_size, env->rank, env->world_size);
    if (rank != 0) memset(id, 0, sizeof *id);
    r = capex_dist_broadcast_blob(env, bootstrap, id->bytes, sizeof id->bytes, timeout_s);
    if (r != CAPEX_OK) return r;
    if (rank != 0 && capex__nccl_id_zero(id))
        return capex__fail(CAPEX_ERR_COMM, "NCCL bootstrap: rank 0 could not create the NCCL unique id (see rank 0's "
                                           "error: NCCL missing or failing there)");
    return CAPEX_OK;
}

CAPEX_API capex_result capex_nccl_exchange_unique_id(const capex_dist_env *env, capex_comm *bootstrap,
                                                     capex_nccl_unique_id *id, double timeout_s) {
    return capex__nccl_exchange(env, bootstrap, id, timeout_s, 0);
}

/* -- ordering between the engine's stream and ours -- */

/* Our stream waits for everything already queued on the engine's stream. */
CAPEX__PRIVATE capex_result capex__nccl_after_user(capex__nccl *n) {
    capex_result r;
    if ((r = capex_cuda_event_record(n->ctx, n->ev_user, n->user)) != CAPEX_OK) return r;
    return capex_cuda_stream_wait_event(n->ctx, n->stream, n->ev_user);
}
/* The engine's stream waits (on the GPU) for everything queued on ours. */
CAPEX__PRIVATE capex_result capex__nccl_user_after(capex__nccl *n) {
    capex_result r;
    if ((r = capex_cuda_event_record(n->ctx, n->ev_done, n->stream)) != CAPEX_OK) return r;
    return capex_cuda_stream_wait_event(n->ctx, n->user, n->ev_done);
}

/* Waits for event e with the deadline, polling NCCL's async error: the event
   says the work finished, the async error says a peer or the network failed
   (then the kernels may never finish). Sleeps 20 us between polls after a
   short spin so oversubscribed hosts keep their CPU. */
CAPEX__PRIVATE capex_result capex__nccl_poll(capex_comm *c, capex_cuda_event e, double deadline, const char *what) {
    capex__nccl *n = capex__nccl_of(c);
    long spins = 0;
    for (;;) {
        capex__CUresult q = n->cuEventQuery(e);
        capex__ncclResult ae = CAPEX__NCCL_SUCCESS, ge;
        if (q != 0 && q != CAPEX__CUDA_ERROR_NOT_READY) return capex__cu_fail(q, "cuEventQuery", what);
        if (n->comm && (ge = n->api.CommGetAsyncError(n->comm, &ae)) != CAPEX__NCCL_SUCCESS)
            return capex__nccl_fail(&n->api, n->comm, ge, "ncclCommGetAsyncError");
        if (ae != CAPEX__NCCL_SUCCESS && ae != CAPEX__NCCL_IN_PROGRESS) {
            char msg[700];
            capex__nccl_fail(&n->api, n->comm, ae, "ncclCommGetAsyncError reported");
            capex__cuda_fmt(msg, sizeof msg, "%s", capex_last_error()); /* the message buffer is reused below */
            return capex__fail(CAPEX_ERR_COMM, "%s: %s", what, msg);
        }
        if (q == 0) return CAPEX_OK; /* finished, and NCCL reports no failure */
        if (++spins > 100) {
            if (capex_dist_now() > deadline)
                return capex__fail(CAPEX_ERR_TIMEOUT, "%s did not complete before the deadline (%.1f s): a peer is stuck "
                                                      "or dead; the NCCL communicator is aborted. Raise timeout_s if it "
                                                      "is only slow", what, c->timeout_s);
            capex__sleep_s(20e-6);
        }
    }
}

/* A call that returned ncclInProgress (a non-blocking comm, see
   capex__nccl_init_rank) goes on in NCCL's own thread, and NCCL takes no
   other call on the comm until ncclCommGetAsyncError stops saying
   ncclInProgress. NCCL has no way to make a comm blocking again after its
   init, so every call on it settles here, bounded by the deadline
   (CAPEX_ERR_TIMEOUT; the caller aborts). An error read there is
   CAPEX_ERR_COMM; any other result is the call's own (ncclSuccess:
   CAPEX_OK). Blocking comms never return ncclInProgress. */
CAPEX__PRIVATE capex_result capex__nccl_settle(capex__nccl *n, capex__ncclResult e, double deadline, const char *call) {
    long spins = 0;
    capex__ncclResult ae = e, ge;
    if (e != CAPEX__NCCL_IN_PROGRESS) return e == CAPEX__NCCL_SUCCESS ? CAPEX_OK : capex__nccl_fail(&n->api, n->comm, e, call);
    for (;;) {
        if ((ge = n->api.CommGetAsyncError(n->comm, &ae)) != CAPEX__NCCL_SUCCESS)
            return capex__nccl_fail(&n->api, n->comm, ge, "ncclCommGetAsyncError");
        if (ae == CAPEX__NCCL_SUCCESS) return CAPEX_OK;
        if (ae != CAPEX__NCCL_IN_PROGRESS) { /* it failed in NCCL's thread: the comm is broken */
            char msg[700];
            capex__nccl_fail(&n->api, n->comm, ae, "ncclCommGetAsyncError reported");
            capex__cuda_fmt(msg, sizeof msg, "%s", capex_last_error());
            return capex__fail(CAPEX_ERR_COMM, "%s: %s", call, msg);
        }
        if (++spins > 100) {
            if (capex_dist_now() > deadline)
                return capex__fail(CAPEX_ERR_TIMEOUT, "%s was still in progress at the deadline: a peer is stuck or dead; "
                                                      "the NCCL communicator is aborted", call);
            capex__sleep_s(20e-6);
        }
    }
}

CAPEX__PRIVATE capex_result capex__nccl_dtype(const capex__nccl *n, capex_dtype t, int *out) {
    switch ((int)t) {
    case 0: *out = CAPEX__NCCL_FLOAT32; return CAPEX_OK;
    case 1: *out = CAPEX__NCCL_FLOAT16; return CAPEX_OK;
    case 2:
        if (!n->has_bf16) return capex__fail(CAPEX_ERR_UNSUPPORTED, "NCCL %d has no bfloat16 (needs NCCL >= 2.10): update "
                                                                    "NCCL or reduce bf16 grads in f32 (allreduce_always_fp32)", n->api.version);
        *out = CAPEX__NCCL_BFLOAT16; return CAPEX_OK;
    case 3: *out = CAPEX__NCCL_FLOAT64; return CAPEX_OK;
    case 4: *out = CAPEX__NCCL_INT64; return CAPEX_OK;
    default: break;
    }
    return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: invalid dtype %d", (int)t);
}

/* The comm stream's scratch, made at init (see capex__nccl_prepare). */
#define CAPEX__NCCL_SCRATCH ((size_t)1 << 20)

/* Device scratch of at least `bytes` (grown; old contents dropped): the
   comm stream's (user 0) or the user stream's, each used only on its stream. */
CAPEX__PRIVATE capex_result capex__nccl_scratch_of(capex_comm *c, size_t bytes, int user) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_ptr *p = user ? &n->uscratch : &n->scratch;
    size_t *have = user ? &n->uscratch_bytes : &n->scratch_bytes;
    capex_result r;
    if (*have >= bytes) return CAPEX_OK;
    if (*p) {
        /* queued kernels may still read it: wait for its stream, but under the
           comm's deadline (a collective queued before them may never end);
           a dead peer or the deadline poisons and aborts the comm here too
           (the memory entries that get here have no capex__comm_after) */
        capex_cuda_event e = NULL;
        if ((r = capex_cuda_event_create(n->ctx, 0, &e)) != CAPEX_OK) return r;
        r = capex_cuda_event_record(n->ctx, e, user ? n->user : n->stream);
        if (r == CAPEX_OK)
            r = capex__comm_after(c, capex__nccl_poll(c, e, capex__deadline(c), "growing the NCCL comm's scratch buffer"));
        capex_cuda_event_destroy(n->ctx, e);
        if (r != CAPEX_OK) return r;
        capex_cuda_free(n->ctx, *p);
        *p = 0;
        *have = 0;
    }
    if ((r = capex_cuda_malloc(n->ctx, bytes < 256 ? 256 : bytes, p)) != CAPEX_OK) return r;
    *have = bytes < 256 ? 256 : bytes;
    return CAPEX_OK;
}
CAPEX__PRIVATE capex_result capex__nccl_scratch(capex_comm *c, size_t bytes) { return capex__nccl_scratch_of(c, bytes, 0); }

/* x *= f on our stream (user 1: on the user stream), in f32 and rounded back
   for halfs (capex.h's capex__host_scale, bit for bit: the built-in
   conversions are exact twins). Our stream's halfs (AVG without ncclAvg,
   after the collective) go through the comm's scratch, made at init, in
   pieces of its size: a user's call of any size allocates nothing (before
   2026-11-29 it grew the scratch, and a rank failing that alone returned an
   error with an unscaled sum where its peers averaged). The user stream's
   (DDP's and ZeRO's staging) is grown to the size reserved at their create. */
CAPEX__PRIVATE capex_result capex__nccl_scale_enqueue(capex_comm *c, void *buf, size_t count, capex_dtype t, float f,
                                                      int user) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_ptr x = CAPEX__NCCL_PTR(buf), sc;
    capex_cuda_stream s = user ? n->user : n->stream;
    capex_result r;
    if (t == CAPEX_F32) return capex_cuda_scale_f32(n->ctx, x, x, f, count, s);
    if (t == CAPEX_F16 || t == CAPEX_BF16) {
        size_t bytes, piece, off, k; /* f32 staging: twice the (checked) size of the buffer */
        if (capex__size_mul(count, 4, &bytes))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: %zu elements: the f32 scratch byte size overflows size_t",
                               count);
        if (user && (r = capex__nccl_scratch_of(c, bytes, 1)) != CAPEX_OK) return r;
        sc = user ? n->uscratch : n->scratch;
        piece = (user ? n->uscratch_bytes : n->scratch_bytes) / 4;
        if (!piece) return capex__fail(CAPEX_ERR_INTERNAL, "NCCL comm: no scratch buffer");
        for (off = 0; off < count; off += k, x += 2 * k) {
            k = count - off < piece ? count - off : piece;
            if ((r = capex_cuda_convert(n->ctx, sc, CAPEX_F32, x, t, k, s)) != CAPEX_OK) return r;
            if ((r = capex_cuda_scale_f32(n->ctx, sc, sc, f, k, s)) != CAPEX_OK) return r;
            if ((r = capex_cuda_convert(n->ctx, x, t, sc, CAPEX_F32, k, s)) != CAPEX_OK) return r;
        }
        return CAPEX_OK;
    }
    return capex__fail(CAPEX_ERR_UNSUPPORTED, "NCCL comm: scaling %s on the device is not supported (AVG of float64 "
                                              "needs NCCL >= 2.10's ncclAvg)", t == CAPEX_F64 ? "float64" : "int64");
}

/* Queues the allreduce (and AVG's post-scale without ncclAvg) on our stream
   after the engine's stream, then records `done`. */
CAPEX__PRIVATE capex_result capex__nccl_enqueue_allreduce(capex_comm *c, const void *send, void *recv, size_t count,
                                                         capex_dtype t, capex_reduce_op op, capex_cuda_event done) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    capex__ncclResult e;
    int dt, nop = CAPEX__NCCL_SUM, post = 0;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((r = capex__nccl_dtype(n, t, &dt)) != CAPEX_OK) return r;
    if (op == CAPEX_REDUCE_AVG) {
        if (n->use_avg) nop = CAPEX__NCCL_AVG;
        else post = 1;
    }
    if (post && t == CAPEX_F64 && c->world_size > 1)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "NCCL comm: AVG of float64 needs ncclAvg (NCCL >= 2.10, use_nccl_avg)");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_after_user(n)) != CAPEX_OK) return r;
    e = n->api.AllReduce(send, recv, count, dt, nop, n->comm, n->stream);
    if ((r = capex__nccl_settle(n, e, capex__deadline(c), "ncclAllReduce")) != CAPEX_OK) return r;
    if (post && c->world_size > 1)
        if ((r = capex__nccl_scale_enqueue(c, recv, count, t, (float)(1.0 / (double)c->world_size), 0)) != CAPEX_OK) return r;
    return capex_cuda_event_record(n->ctx, done, n->stream);
}

static capex_result capex__nccl_allreduce(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                         capex_reduce_op op, double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r = capex__nccl_enqueue_allreduce(c, send, recv, count, t, op, n->ev_done);
    return r != CAPEX_OK ? r : capex__nccl_poll(c, n->ev_done, deadline, "ncclAllReduce");
}

static capex_result capex__nccl_broadcast(capex_comm *c, void *buf, size_t count, capex_dtype t, int root, double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    capex__ncclResult e;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_after_user(n)) != CAPEX_OK) return r;
    /* bits, not values: bytes as ncclUint8 (any dtype, any NCCL version) */
    e = n->api.Broadcast(buf, buf, count * capex_comm_dtype_size(t), CAPEX__NCCL_UINT8, root, n->comm, n->stream);
    if ((r = capex__nccl_settle(n, e, deadline, "ncclBroadcast")) != CAPEX_OK) return r;
    if ((r = capex_cuda_event_record(n->ctx, n->ev_done, n->stream)) != CAPEX_OK) return r;
    return capex__nccl_poll(c, n->ev_done, deadline, "ncclBroadcast");
}

/* NCCL gathers run in place only when send is this rank's slot of recv
   (bytes at offset slot); any other overlap is undefined there (a ring reads
   send while the peers' data lands on it). The front-ends allow send ==
   recv, which on ranks > 0 is not that slot, so send elsewhere inside recv
   is first copied to the slot on our stream (capex__mpi_gather_send's twin).
   A send overlapping the slot is moved in pieces (the device copy has no
   memmove), in the direction of the shift so that each piece is read before
   a later one overwrites it: pieces of the shift's size straight, or when
   the shift is smaller than the comm's scratch (made at init), pieces of
   the scratch's size through it. Nothing is allocated: before 2026-11-29 a
   temporary buffer was, and a rank failing that alone left its peers in
   the gather. Call after capex__nccl_after_user. */
static capex_result capex__nccl_gather_send(capex__nccl *n, const void **send, void *recv, size_t slot, size_t bytes,
                                           size_t total) {
    const char *s = (const char *)*send, *at = (const char *)recv + slot;
    size_t d, piece, done, k, off;
    capex_result r = CAPEX_OK;
    if (s == at || !bytes || !(s < (const char *)recv + total && s + bytes > (const char *)recv)) return CAPEX_OK;
    *send = at;
    if (!(s < at + bytes && s + bytes > at)) return capex_cuda_memcpy_dtod(n->ctx, CAPEX__NCCL_PTR(at), CAPEX__NCCL_PTR(s), bytes, n->stream);
    d = s < at ? (size_t)(at - s) : (size_t)(s - at);
    piece = d >= n->scratch_bytes ? d : n->scratch_bytes;
    for (done = 0; r == CAPEX_OK && done < bytes; done += k) {
        k = bytes - done < piece ? bytes - done : piece;
        off = s > at ? done : bytes - done - k; /* down: front first; up: back first */
        if (k <= d) r = capex_cuda_memcpy_dtod(n->ctx, CAPEX__NCCL_PTR(at + off), CAPEX__NCCL_PTR(s + off), k, n->stream);
        else if ((r = capex_cuda_memcpy_dtod(n->ctx, n->scratch, CAPEX__NCCL_PTR(s + off), k, n->stream)) == CAPEX_OK)
            r = capex_cuda_memcpy_dtod(n->ctx, CAPEX__NCCL_PTR(at + off), n->scratch, k, n->stream);
    }
    return r;
}

static capex_result capex__nccl_allgather(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                         double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    size_t bytes = count * capex_comm_dtype_size(t);
    capex_result r;
    capex__ncclResult e;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_after_user(n)) != CAPEX_OK) return r;
    if ((r = capex__nccl_gather_send(n, &send, recv, (size_t)c->rank * bytes, bytes, (size_t)c->world_size * bytes)) != CAPEX_OK)
        return r;
    e = n->api.AllGather(send, recv, bytes, CAPEX__NCCL_UINT8, n->comm, n->stream);
    if ((r = capex__nccl_settle(n, e, deadline, "ncclAllGather")) != CAPEX_OK) return r;
    if ((r = capex_cuda_event_record(n->ctx, n->ev_done, n->stream)) != CAPEX_OK) return r;
    return capex__nccl_poll(c, n->ev_done, deadline, "ncclAllGather");
}

/* Uneven reduce-scatter: one ncclReduce per rank (root p, its counts[p]
   elements) in a group. ncclReduceScatter needs equal counts; padding would
   copy the whole buffer, the grouped reduces move what a ring reduce-scatter
   moves. Sums in the dtype, as ncclAllReduce; AVG via ncclAvg, else this
   rank's slice is scaled after. Queued on our stream after the engine's,
   then `done` is recorded (blocking entry below; ZeRO's nonblocking one
   passes equal counts). */
CAPEX__PRIVATE capex_result capex__nccl_enqueue_reduce_scatter(capex_comm *c, const void *send, void *recv,
                                                              const size_t *counts, capex_dtype t, capex_reduce_op op,
                                                              capex_cuda_event done) {
    capex__nccl *n = capex__nccl_of(c);
    size_t es = capex_comm_dtype_size(t), off = 0;
    capex_result r;
    capex__ncclResult e = CAPEX__NCCL_SUCCESS, ge;
    int dt, nop = CAPEX__NCCL_SUM, post = 0, p;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((r = capex__nccl_dtype(n, t, &dt)) != CAPEX_OK) return r;
    if (op == CAPEX_REDUCE_AVG) {
        if (n->use_avg) nop = CAPEX__NCCL_AVG;
        else post = c->world_size > 1;
    }
    if (post && t == CAPEX_F64)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "NCCL comm: AVG of float64 needs ncclAvg (NCCL >= 2.10, use_nccl_avg)");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_after_user(n)) != CAPEX_OK) return r;
    if ((e = n->api.GroupStart()) != CAPEX__NCCL_SUCCESS) return capex__nccl_fail(&n->api, n->comm, e, "ncclGroupStart");
    for (p = 0; p < c->world_size; off += counts[p], p++) {
        if (!counts[p]) continue; /* every rank skips the same roots */
        e = n->api.Reduce((const char *)send + off * es, p == c->rank ? recv : (void *)((char *)(uintptr_t)send + off * es),
                          counts[p], dt, nop, p, n->comm, n->stream);
        if (e != CAPEX__NCCL_SUCCESS && e != CAPEX__NCCL_IN_PROGRESS) break; /* in a group: settled at its end */
    }
    ge = n->api.GroupEnd(); /* closes the group even after a failed call */
    if (e != CAPEX__NCCL_SUCCESS && e != CAPEX__NCCL_IN_PROGRESS)
        return capex__nccl_fail(&n->api, n->comm, e, "ncclReduce (reduce-scatter)");
    if ((r = capex__nccl_settle(n, ge, capex__deadline(c), "ncclGroupEnd (reduce-scatter)")) != CAPEX_OK) return r;
    if (post && counts[c->rank])
        if ((r = capex__nccl_scale_enqueue(c, recv, counts[c->rank], t, (float)(1.0 / (double)c->world_size), 0)) != CAPEX_OK)
            return r;
    return capex_cuda_event_record(n->ctx, done, n->stream);
}
static capex_result capex__nccl_reduce_scatter(capex_comm *c, const void *send, void *recv, const size_t *counts,
                                              capex_dtype t, capex_reduce_op op, double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r = capex__nccl_enqueue_reduce_scatter(c, send, recv, counts, t, op, n->ev_done);
    return r != CAPEX_OK ? r : capex__nccl_poll(c, n->ev_done, deadline, "ncclReduce (reduce-scatter)");
}

/* Uneven allgather: one ncclBroadcast of bytes per rank (root p) in a group,
   as PyTorch's ProcessGroupNCCL does for uneven shards; `done` recorded after. */
CAPEX__PRIVATE capex_result capex__nccl_enqueue_allgatherv(capex_comm *c, const void *send, void *recv,
                                                          const size_t *counts, capex_dtype t, capex_cuda_event done) {
    capex__nccl *n = capex__nccl_of(c);
    size_t es = capex_comm_dtype_size(t), off = 0, slot, total;
    capex_result r;
    capex__ncclResult e = CAPEX__NCCL_SUCCESS, ge;
    int p;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_after_user(n)) != CAPEX_OK) return r;
    if ((r = capex__comm_counts(c, "NCCL allgatherv", counts, t, &total, &slot)) != CAPEX_OK) return r;
    if ((r = capex__nccl_gather_send(n, &send, recv, slot * es, counts[c->rank] * es, total * es)) != CAPEX_OK) return r;
    if ((e = n->api.GroupStart()) != CAPEX__NCCL_SUCCESS) return capex__nccl_fail(&n->api, n->comm, e, "ncclGroupStart");
    for (p = 0; p < c->world_size; off += counts[p], p++) {
        char *dst = (char *)recv + off * es;
        if (!counts[p]) continue;
        e = n->api.Broadcast(p == c->rank ? send : (const void *)dst, dst, counts[p] * es, CAPEX__NCCL_UINT8, p, n->comm,
                             n->stream);
        if (e != CAPEX__NCCL_SUCCESS && e != CAPEX__NCCL_IN_PROGRESS) break; /* in a group: settled at its end */
    }
    ge = n->api.GroupEnd();
    if (e != CAPEX__NCCL_SUCCESS && e != CAPEX__NCCL_IN_PROGRESS)
        return capex__nccl_fail(&n->api, n->comm, e, "ncclBroadcast (allgatherv)");
    if ((r = capex__nccl_settle(n, ge, capex__deadline(c), "ncclGroupEnd (allgatherv)")) != CAPEX_OK) return r;
    return capex_cuda_event_record(n->ctx, done, n->stream);
}
static capex_result capex__nccl_allgatherv(capex_comm *c, const void *send, void *recv, const size_t *counts, capex_dtype t,
                                          double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r = capex__nccl_enqueue_allgatherv(c, send, recv, counts, t, n->ev_done);
    return r != CAPEX_OK ? r : capex__nccl_poll(c, n->ev_done, deadline, "ncclBroadcast (allgatherv)");
}

/* A one-word allreduce: returns when every rank reached it. */
static capex_result capex__nccl_barrier(capex_comm *c, double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if ((r = capex__nccl_scratch(c, 4)) != CAPEX_OK) return r;
    return capex__nccl_allreduce(c, (const void *)(uintptr_t)n->scratch, (void *)(uintptr_t)n->scratch, 1, CAPEX_F32,
                                 CAPEX_REDUCE_SUM, deadline);
}

/* Room in n->req_events for `need` events, busy and idle together (the idle
   ones move to the new end). */
static capex_result capex__nccl_ev_room(capex__nccl *n, size_t need) {
    capex_cuda_event *q;
    size_t cap = n->req_events_cap ? n->req_events_cap : 16;
    if (need <= n->req_events_cap) return CAPEX_OK;
    while (cap < need)
        if ((cap *= 2) > SIZE_MAX / 2 / sizeof *q) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "NCCL request events: too many");
    if (!(q = (capex_cuda_event *)capex__alloc(NULL, cap * sizeof *q)))
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "NCCL request events: out of memory growing a table to %zu entries", cap);
    if (n->n_req_events) memcpy(q, n->req_events, n->n_req_events * sizeof *q);
    if (n->n_idle_events)
        memcpy(q + cap - n->n_idle_events, n->req_events + n->req_events_cap - n->n_idle_events, n->n_idle_events * sizeof *q);
    capex__free(NULL, n->req_events);
    n->req_events = q;
    n->req_events_cap = cap;
    return CAPEX_OK;
}
/* An event for a request before its collective is queued: an idle one, else
   a new one with its room made first (out of memory then refuses the call
   with nothing queued, never leaves a queued collective untracked). */
static capex_result capex__nccl_req_event(capex_comm *c, capex_cuda_event *e) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    *e = NULL;
    if (n->n_idle_events) {
        *e = n->req_events[n->req_events_cap - n->n_idle_events--];
        return CAPEX_OK;
    }
    if ((r = capex__nccl_ev_room(n, n->n_req_events + 1)) != CAPEX_OK) return r;
    return capex_cuda_event_create(n->ctx, 0, e);
}
/* An event back among the idle ones (its room exists: taken from them, or made with room). */
static void capex__nccl_req_idle(capex__nccl *n, capex_cuda_event e) {
    n->req_events[n->req_events_cap - ++n->n_idle_events] = e;
}
/* A request's event, kept in n->req_events until its wait succeeds. */
static capex_result capex__nccl_req_keep(capex_comm *c, capex_comm_req *req, capex_cuda_event e) {
    capex__nccl *n = capex__nccl_of(c);
    n->req_events[n->n_req_events++] = e;
    req->handle.ptr = e;
    req->active = 1;
    return CAPEX_OK;
}
static void capex__nccl_req_done(capex__nccl *n, capex_cuda_event e) {
    size_t i;
    for (i = 0; i < n->n_req_events; i++)
        if (n->req_events[i] == e) {
            n->req_events[i] = n->req_events[--n->n_req_events];
            capex__nccl_req_idle(n, e); /* its collective is done: reused by a later request */
            return;
        }
    capex_cuda_event_destroy(n->ctx, e);
}

/* capex_comm_vtable.host_buffer: the exchanges of host values go through
   it one at a time, each finished (or the comm failed) before the next, so
   growing frees the old one at once; after a failure a collective may still
   write it: it is kept until destroy, and growing is refused. */
static capex_result capex__nccl_host_buffer(capex_comm *c, size_t bytes, void **dev) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_ptr p = 0;
    capex_result r;
    *dev = NULL;
    if (!n) return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: not initialised");
    if (bytes > n->hbuf_bytes) {
        if (c->failed || n->aborted)
            return capex__fail(CAPEX_ERR_COMM, "NCCL comm failed earlier (a timeout or a peer's failure); restart the job");
        if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
        if ((r = capex_cuda_malloc(n->ctx, bytes, &p)) != CAPEX_OK) return r;
        if (n->hbuf) capex_cuda_free(n->ctx, n->hbuf);
        n->hbuf = p;
        n->hbuf_bytes = bytes;
    }
    *dev = (void *)(uintptr_t)n->hbuf;
    return CAPEX_OK;
}

/* capex_comm_vtable.reserve: what DDP's and ZeRO's launches use, made
   now (under the create's or rebuild's agreement) instead of mid-backward,
   where one rank failing alone left its peers waiting in the collective.
   scales: the scale and convert kernels loaded (on first use they compile
   and load a module); half_count: the memory entries' f32 scratch for a
   half scale; requests: idle events (negative: idle ones destroyed), and
   the shard counts of ZeRO's nonblocking calls. */
static capex_result capex__nccl_reserve(capex_comm *c, int scales, size_t half_count, long requests) {
    static const size_t kernels[] = {1, 3, 4, 5, 6}; /* capex_cuda_scale_f32's, capex_cuda_convert's */
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_function fn;
    capex_result r;
    size_t i, k, bytes;
    if (!n) return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: not initialised");
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if (requests < 0) {
        for (k = (size_t)-(requests + 1) + 1; k && n->n_idle_events; k--)
            capex_cuda_event_destroy(n->ctx, n->req_events[n->req_events_cap - n->n_idle_events--]);
        return CAPEX_OK;
    }
    for (i = 0; scales && i < sizeof kernels / sizeof kernels[0]; i++)
        if ((r = capex__cuda_builtin_get(n->ctx, kernels[i], &fn)) != CAPEX_OK) return r;
    if (half_count) {
        if (capex__size_mul(half_count, 4, &bytes))
            return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: %zu elements: the f32 scratch byte size overflows size_t",
                               half_count);
        if ((r = capex__nccl_scratch_of(c, bytes, 1)) != CAPEX_OK) return r;
    }
    if (!requests) return CAPEX_OK;
    if (!n->eq_counts && !(n->eq_counts = (size_t *)capex__alloc(NULL, sizeof(size_t) * (size_t)c->world_size)))
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "NCCL comm: out of memory (%d shard counts)", c->world_size);
    if ((size_t)requests > SIZE_MAX / 2 - n->n_req_events - n->n_idle_events)
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "NCCL request events: too many");
    if ((r = capex__nccl_ev_room(n, n->n_req_events + n->n_idle_events + (size_t)requests)) != CAPEX_OK) return r;
    for (k = 0; k < (size_t)requests; k++) {
        capex_cuda_event e = NULL;
        if ((r = capex_cuda_event_create(n->ctx, 0, &e)) != CAPEX_OK) {
            while (k--) capex_cuda_event_destroy(n->ctx, n->req_events[n->req_events_cap - n->n_idle_events--]);
            return r;
        }
        capex__nccl_req_idle(n, e);
    }
    return CAPEX_OK;
}

/* Bucket reduce: the event lives in req->handle.ptr until wait. */
static capex_result capex__nccl_iallreduce(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                          capex_reduce_op op, capex_comm_req *req) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_event e = NULL;
    capex_result r;
    memset(req, 0, sizeof *req);
    if ((r = capex__nccl_req_event(c, &e)) != CAPEX_OK) return r;
    if ((r = capex__nccl_enqueue_allreduce(c, send, recv, count, t, op, e)) != CAPEX_OK) {
        capex__nccl_req_idle(n, e);
        return r;
    }
    return capex__nccl_req_keep(c, req, e);
}

/* ZeRO's nonblocking reduce-scatter / all-gather of equal shards: the same
   grouped calls as the blocking entries, with their own event in the req.
   The all-gather's send is this rank's slice of recv, as in place. */
static capex_result capex__nccl_ishards(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                        capex_reduce_op op, capex_comm_req *req, int gather) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_event e = NULL;
    capex_result r;
    size_t *counts;
    int p;
    memset(req, 0, sizeof *req);
    if (!(counts = n->eq_counts) && /* made by reserve; else per call */
        !(counts = (size_t *)capex__alloc(c->allocator, sizeof(size_t) * (size_t)c->world_size)))
        return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "NCCL %s: no memory", gather ? "iallgather" : "ireduce_scatter");
    for (p = 0; p < c->world_size; p++) counts[p] = count;
    if ((r = capex__nccl_req_event(c, &e)) == CAPEX_OK)
        r = gather ? capex__nccl_enqueue_allgatherv(c, send, recv, counts, t, e) /* in place */
                   : capex__nccl_enqueue_reduce_scatter(c, send, recv, counts, t, op, e);
    if (counts != n->eq_counts) capex__free(c->allocator, counts);
    if (r != CAPEX_OK) {
        if (e) capex__nccl_req_idle(n, e);
        return r;
    }
    return capex__nccl_req_keep(c, req, e);
}
static capex_result capex__nccl_ireduce_scatter(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                                capex_reduce_op op, capex_comm_req *req) {
    return capex__nccl_ishards(c, send, recv, count, t, op, req, 0);
}
static capex_result capex__nccl_iallgather(capex_comm *c, const void *send, void *recv, size_t count, capex_dtype t,
                                           capex_comm_req *req) {
    return capex__nccl_ishards(c, send, recv, count, t, CAPEX_REDUCE_SUM, req, 1);
}

static capex_result capex__nccl_wait(capex_comm *c, capex_comm_req *req, double deadline) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    if (!req->active) return CAPEX_OK;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    r = capex__nccl_poll(c, (capex_cuda_event)req->handle.ptr, deadline, "bucket collective (ncclAllReduce, grouped ncclReduce or ncclBroadcast)");
    if (r != CAPEX_OK) return r; /* the event stays (destroy frees it): the kernel may still run until the abort */
    capex__nccl_req_done(n, (capex_cuda_event)req->handle.ptr);
    req->handle.ptr = NULL;
    req->active = 0;
    return CAPEX_OK;
}

static capex_result capex__nccl_test(capex_comm *c, capex_comm_req *req, int *done) {
    capex__nccl *n = capex__nccl_of(c);
    capex__CUresult q;
    capex_result r;
    *done = 1;
    if (!req->active) return CAPEX_OK;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    q = n->cuEventQuery(req->handle.ptr);
    if (q != 0 && q != CAPEX__CUDA_ERROR_NOT_READY) return capex__cu_fail(q, "cuEventQuery", "bucket allreduce");
    *done = q == 0;
    return CAPEX_OK;
}

static capex_result capex__nccl_poll_error(capex_comm *c) {
    capex__nccl *n = capex__nccl_of(c);
    capex__ncclResult ae = CAPEX__NCCL_SUCCESS, ge;
    if (!n->comm) return capex__fail(CAPEX_ERR_COMM, "NCCL comm was aborted; restart the job");
    if ((ge = n->api.CommGetAsyncError(n->comm, &ae)) != CAPEX__NCCL_SUCCESS)
        return capex__nccl_fail(&n->api, n->comm, ge, "ncclCommGetAsyncError");
    if (ae != CAPEX__NCCL_SUCCESS && ae != CAPEX__NCCL_IN_PROGRESS) {
        char msg[700];
        capex__nccl_fail(&n->api, n->comm, ae, "ncclCommGetAsyncError reported");
        capex__cuda_fmt(msg, sizeof msg, "%s", capex_last_error());
        return capex__fail(CAPEX_ERR_COMM, "NCCL communicator failed: %s", msg);
    }
    return CAPEX_OK;
}

/* ncclCommAbort: stops NCCL's kernels and proxy threads so the stream drains
   and the process can exit (ncclCommDestroy would wait for them). */
static void capex__nccl_abort(capex_comm *c) {
    capex__nccl *n = capex__nccl_of(c);
    if (!n || !n->comm) return;
    capex__cuda_enter(n->ctx);
    n->api.CommAbort(n->comm);
    n->comm = NULL;
    n->aborted = 1;
}

static void capex__nccl_destroy(capex_comm *c) {
    capex__nccl *n = capex__nccl_of(c);
    if (!n) return;
    if (capex__cuda_enter(n->ctx) == CAPEX_OK) {
        if (n->comm) {
            /* finished streams first: destroy must not race in-flight
               collectives. Waited for as every collective (deadline, NCCL's
               async error): a comm whose peer is gone is aborted, as NCCL
               asks, not destroyed (ncclCommDestroy would wait for the peer) */
            capex_result r = capex_cuda_event_record(n->ctx, n->ev_done, n->stream);
            if (r == CAPEX_OK) r = capex__nccl_poll(c, n->ev_done, capex__deadline(c), "destroying the NCCL comm");
            if (r == CAPEX_OK) {
                n->api.CommDestroy(n->comm);
                n->comm = NULL;
            } else {
                capex__nccl_abort(c);
            }
        }
        if (!n->aborted) capex_cuda_stream_synchronize(n->ctx, n->stream);
        if (n->scratch) capex_cuda_free(n->ctx, n->scratch);
        if (n->uscratch) capex_cuda_free(n->ctx, n->uscratch);
        if (n->hbuf) capex_cuda_free(n->ctx, n->hbuf);
        while (n->n_req_events) capex_cuda_event_destroy(n->ctx, n->req_events[--n->n_req_events]);
        while (n->n_idle_events) capex_cuda_event_destroy(n->ctx, n->req_events[n->req_events_cap - n->n_idle_events--]);
        capex_cuda_event_destroy(n->ctx, n->ev_user);
        capex_cuda_event_destroy(n->ctx, n->ev_done);
        capex_cuda_stream_destroy(n->ctx, n->stream);
    }
    capex__free(NULL, n->req_events);
    capex__free(NULL, n->eq_counts);
    capex__free(NULL, n);
    c->impl = NULL;
}

/* -- memory entries: device memory, on the engine's stream --
   They run where the engine's own work runs, in its order, and make no
   stream wait for another: a DDP bucket's f32 staging, predivide or copy
   during backward (and ZeRO's lent buffers) would otherwise make the
   engine's stream wait for ours, behind every allreduce already in flight,
   and hide none of them. Safe because each collective waits for the engine's
   stream before it starts (capex__nccl_after_user), and the front-ends touch
   a collective's buffers only after its wait returned on the host. */

static capex_result capex__nccl_mem_alloc(capex_comm *c, void **ptr, size_t bytes) {
    capex__nccl *n = capex__nccl_of(c);
    capex_cuda_ptr p = 0;
    capex_result r = capex_cuda_malloc(n->ctx, bytes ? bytes : 1, &p);
    *ptr = r == CAPEX_OK ? (void *)(uintptr_t)p : NULL;
    return r;
}

static void capex__nccl_mem_free(capex_comm *c, void *ptr) {
    capex__nccl *n = capex__nccl_of(c);
    if (ptr) capex_cuda_free(n->ctx, CAPEX__NCCL_PTR(ptr)); /* cuMemFree waits for queued work */
}

/* Copies and zeros go to the driver's async entries with the user stream as
   it is: a NULL one is the legacy stream, still asynchronous and apart from
   our non-blocking stream (capex_cuda_memcpy_* would synchronise the whole
   context for NULL, NCCL's kernels in flight included, with no deadline). */
static capex_result capex__nccl_mem_copy(capex_comm *c, void *dst, const void *src, size_t bytes, capex_copy_kind kind) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    if (kind == CAPEX_COPY_H2D) CAPEX__CU(cuMemcpyHtoDAsync_v2, (CAPEX__NCCL_PTR(dst), src, bytes, n->user), "");
    else if (kind == CAPEX_COPY_D2H) CAPEX__CU(cuMemcpyDtoHAsync_v2, (dst, CAPEX__NCCL_PTR(src), bytes, n->user), "");
    else CAPEX__CU(cuMemcpyDtoDAsync_v2, (CAPEX__NCCL_PTR(dst), CAPEX__NCCL_PTR(src), bytes, n->user), "");
    /* host memory takes part: finish before returning (rebuild and checkpoints only) */
    if (kind != CAPEX_COPY_D2D) return capex_cuda_stream_synchronize(n->ctx, n->user);
    return CAPEX_OK;
}

static capex_result capex__nccl_mem_zero(capex_comm *c, void *dst, size_t bytes) {
    capex__nccl *n = capex__nccl_of(c);
    capex_result r;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) return r;
    CAPEX__CU(cuMemsetD8Async, (CAPEX__NCCL_PTR(dst), 0, bytes, n->user), "");
    return CAPEX_OK;
}

static capex_result capex__nccl_scale(capex_comm *c, void *buf, size_t count, capex_dtype t, float factor) {
    return capex__nccl_scale_enqueue(c, buf, count, t, factor, 1);
}

static capex_result capex__nccl_convert(capex_comm *c, void *dst, capex_dtype dst_t, const void *src, capex_dtype src_t,
                                       size_t count) {
    capex__nccl *n = capex__nccl_of(c);
    if (dst_t == src_t) return capex__nccl_mem_copy(c, dst, src, count * capex_comm_dtype_size(src_t), CAPEX_COPY_D2D);
    return capex_cuda_convert(n->ctx, CAPEX__NCCL_PTR(dst), dst_t, CAPEX__NCCL_PTR(src), src_t, count, n->user);
}

/* DDP and ZeRO ask at create (capex_comm_vtable.check_dtype); the collectives check again. */
CAPEX__PRIVATE capex_result capex__nccl_check_dtype(capex_comm *c, capex_dtype t) {
    int nt;
    if (!c->impl) return capex__fail(CAPEX_ERR_INVALID_ARG, "NCCL comm: not initialised");
    if ((int)t == 2 && !capex__nccl_of(c)->has_bf16)
        return capex__fail(CAPEX_ERR_UNSUPPORTED, "NCCL %d has no bfloat16 (needs NCCL >= 2.10)", capex__nccl_of(c)->api.version);
    return capex__nccl_dtype(capex__nccl_of(c), t, &nt);
}

static const capex_comm_vtable capex__nccl_vt = {
    "nccl", capex__nccl_allreduce, capex__nccl_broadcast, capex__nccl_allgather, capex__nccl_barrier,
    capex__nccl_iallreduce, capex__nccl_wait, capex__nccl_poll_error, capex__nccl_abort, capex__nccl_destroy,
    capex__nccl_mem_alloc, capex__nccl_mem_free, capex__nccl_mem_copy, capex__nccl_mem_zero, capex__nccl_scale,
    capex__nccl_convert, capex__nccl_test, capex__nccl_reduce_scatter, capex__nccl_allgatherv, capex__nccl_ireduce_scatter,
    capex__nccl_iallgather,
    capex__nccl_check_dtype, capex__nccl_reserve, capex__nccl_host_buffer};

/* Everything of the init that can fail on this rank alone: the desc, NCCL's
   symbols, the driver's cuEventQuery, our stream and events; c holds them
   (vt set, comm NULL) on success, is zeroed on failure. It runs before the
   unique-id exchange: a rank that fails after the id went round leaves its
   peers in ncclCommInitRank, which waits for every rank with no deadline. */
CAPEX__PRIVATE capex_result capex__nccl_prepare(capex_comm *c, const capex_nccl_desc *d, int world_size, const char *fn) {
    capex__nccl *n;
    capex_result r;
    void *q = NULL;
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_NCCL_DESC, fn, "capex_nccl_desc", "capex_nccl_desc_init")) != CAPEX_OK)
        return r;
    if (!d->ctx)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: desc.ctx is NULL; create a capex_cuda_context for this rank's GPU first",
                           fn);
    if (!(d->timeout_s >= 0) || d->timeout_s > 1e9)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: timeout_s %g invalid (0: 1800 s)", fn, d->timeout_s);
    n = (capex__nccl *)capex__alloc(NULL, sizeof *n);
    if (!n) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memset(n, 0, sizeof *n);
    n->ctx = d->ctx;
    n->user = d->user_stream;
    if ((r = capex__nccl_api_load(&n->api)) != CAPEX_OK) { capex__free(NULL, n); return r; }
    n->has_bf16 = n->api.version >= CAPEX__NCCL_V2_10;
    n->use_avg = d->use_nccl_avg && n->api.version >= CAPEX__NCCL_V2_10;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) { capex__free(NULL, n); return r; }
    q = dlsym(capex__cuda_drv.lib, "cuEventQuery");
    memcpy(&n->cuEventQuery, &q, sizeof q);
    if (!n->cuEventQuery) {
        capex__free(NULL, n);
        return capex__fail(CAPEX_ERR_NO_DRIVER, "the CUDA driver lacks cuEventQuery: update the NVIDIA driver");
    }
    c->vt = &capex__nccl_vt; /* destroy below frees what exists so far */
    c->impl = n;
    if ((r = capex_cuda_stream_create(n->ctx, &n->stream)) != CAPEX_OK ||
        (r = capex_cuda_event_create(n->ctx, 0, &n->ev_user)) != CAPEX_OK ||
        (r = capex_cuda_event_create(n->ctx, 0, &n->ev_done)) != CAPEX_OK ||
        /* the barrier's word, AVG's f32 staging of halfs without ncclAvg, a
           shifted gather's pieces: a call allocating on one rank alone could
           leave the others waiting (or averaging where it failed) */
        (r = capex__nccl_scratch(c, CAPEX__NCCL_SCRATCH)) != CAPEX_OK ||
        /* the agreements' buffer, for the same reason (capex__comm_host) */
        (r = capex__nccl_host_buffer(c, capex__comm_host_bytes(world_size), &q)) != CAPEX_OK) {
        capex_comm_destroy(c);
        return r;
    }
    return CAPEX_OK;
}

/* The comm on a prepared c; destroys c on failure. NCCL >= 2.14: non-blocking
   ncclCommInitRankConfig, polled until init_timeout_s: a rank that dies (or
   never comes) after the unique-id exchange would otherwise keep its peers
   in NCCL's init for ever (NVIDIA/nccl#289); at the deadline or on NCCL's
   async error the comm is aborted (ncclCommAbort stops NCCL's init thread).
   The comm stays non-blocking (capex__nccl_settle). Older NCCL: the blocking
   ncclCommInitRank, which has no deadline. */
CAPEX__PRIVATE capex_result capex__nccl_init_rank(capex_comm *c, const capex_nccl_unique_id *id, int rank, int world_size,
                                                 double timeout_s, double init_timeout_s) {
    capex__nccl *n = capex__nccl_of(c);
    capex__ncclUniqueId u;
    capex__ncclResult e;
    capex_result r;
    if ((r = capex__cuda_enter(n->ctx)) != CAPEX_OK) { capex_comm_destroy(c); return r; }
    memcpy(u.internal, id->bytes, sizeof u.internal);
    if (!(init_timeout_s > 0)) init_timeout_s = 300.0; /* as the id exchange takes it (NaN too) */
    if (n->api.CommInitRankConfig) {
        capex__ncclConfig cfg;
        double deadline = capex_dist_now() + init_timeout_s;
        memset(&cfg, 0, sizeof cfg);
        cfg.size = sizeof cfg;
        cfg.magic = CAPEX__NCCL_CONFIG_MAGIC;
        cfg.version = CAPEX__NCCL_V2_14;
        cfg.blocking = 0;
        e = n->api.CommInitRankConfig(&n->comm, world_size, u, rank, &cfg);
        if (e != CAPEX__NCCL_SUCCESS && e != CAPEX__NCCL_IN_PROGRESS) {
            /* failed before it started: NCCL freed the comm */
            capex_result fr = capex__nccl_fail(&n->api, NULL, e, "ncclCommInitRankConfig");
            n->comm = NULL;
            capex_comm_destroy(c);
            return fr;
        }
        if (!n->comm) {
            capex_comm_destroy(c);
            return capex__fail(CAPEX_ERR_NCCL, "ncclCommInitRankConfig returned %d but no communicator", (int)e);
        }
        if ((r = capex__nccl_settle(n, e, deadline, "ncclCommInitRankConfig")) != CAPEX_OK) {
            char msg[700];
            capex__cuda_fmt(msg, sizeof msg, "%s", capex_last_error());
            n->api.CommAbort(n->comm);
            n->comm = NULL;
            n->aborted = 1;
            capex_comm_destroy(c);
            if (r == CAPEX_ERR_TIMEOUT)
                return capex__fail(CAPEX_ERR_TIMEOUT, "NCCL init (ncclCommInitRankConfig, rank %d of %d) did not complete "
                                                      "within init_timeout_s (%.1f s): a rank is missing (it died or never "
                                                      "started after the unique-id exchange); the communicator was aborted",
                                   rank, world_size, init_timeout_s);
            return capex__fail(r, "NCCL init (rank %d of %d) failed, the communicator was aborted: %s", rank, world_size, msg);
        }
    } else if ((e = n->api.CommInitRank(&n->comm, world_size, u, rank)) != CAPEX__NCCL_SUCCESS) {
        capex_result fr = capex__nccl_fail(&n->api, NULL, e, "ncclCommInitRank");
        n->comm = NULL;
        capex_comm_destroy(c);
        return fr;
    }
    c->rank = rank;
    c->world_size = world_size;
    c->device_buffers = 1;
    c->stream = n->stream;
    c->timeout_s = timeout_s > 0 ? timeout_s : 1800.0;
    return CAPEX_OK;
}

CAPEX_API capex_result capex_comm_init_nccl_id(capex_comm *c, const capex_nccl_unique_id *id, int rank, int world_size,
                                               const capex_nccl_desc *d) {
    capex_result r;
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: comm is NULL");
    memset(c, 0, sizeof *c);
    if (!id || !d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: id or desc is NULL");
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_NCCL_DESC, "capex_comm_init_nccl_id", "capex_nccl_desc",
                               "capex_nccl_desc_init")) != CAPEX_OK)
        return r;
    if (!d->ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: desc.ctx is NULL; create a "
                                                           "capex_cuda_context for this rank's GPU first");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: rank %d / world size %d invalid", rank, world_size);
    if (!(d->timeout_s >= 0) || d->timeout_s > 1e9)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: timeout_s %g invalid (0: 1800 s)", d->timeout_s);
    if (capex__nccl_id_zero(id))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl_id: the unique id is all zeros (not from ncclGetUniqueId)");
    if ((r = capex__nccl_prepare(c, d, world_size, "capex_comm_init_nccl_id")) != CAPEX_OK) return r;
    return capex__nccl_init_rank(c, id, rank, world_size, d->timeout_s, d->init_timeout_s);
}

CAPEX_API capex_result capex_comm_init_nccl(capex_comm *c, const capex_dist_env *env, const capex_nccl_desc *d) {
    capex_nccl_unique_id id;
    capex_result r, made;
    char why[512];
    if (!c) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: comm is NULL");
    memset(c, 0, sizeof *c);
    if (!env || !d) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: env or desc is NULL");
    if ((r = capex__desc_check(d->init_tag, CAPEX__TAG_NCCL_DESC, "capex_comm_init_nccl", "capex_nccl_desc",
                               "capex_nccl_desc_init")) != CAPEX_OK)
        return r;
    if (!d->ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: desc.ctx is NULL; create a "
                                                           "capex_cuda_context for this rank's GPU first");
    if (!(d->timeout_s >= 0) || d->timeout_s > 1e9)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: timeout_s %g invalid (0: 1800 s)", d->timeout_s);
    if (env->world_size < 1 || env->rank < 0 || env->rank >= env->world_size)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: rank %d / world size %d invalid", env->rank,
                           env->world_size);
    if (env->world_size > 1 && (d->rendezvous_port < 0 || d->rendezvous_port > 65535))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_comm_init_nccl: rendezvous_port %d not in [0, 65535]",
                           d->rendezvous_port);
    memset(&id, 0, sizeof id);
    why[0] = '\0';
    /* this rank's own part first (capex__nccl_prepare), then the id on rank 0 */
    made = capex__nccl_prepare(c, d, env->world_size, "capex_comm_init_nccl");
    if (made == CAPEX_OK && env->rank == 0) made = capex_nccl_get_unique_id(&id);
    if (made != CAPEX_OK) {
        capex__cuda_fmt(why, sizeof why, "%s", capex_last_error());
        memset(&id, 0, sizeof id);
        capex_comm_destroy(c);
        /* rank 0 still sends the zeros (its peers fail at once); another rank
           stays out of the exchange (its peers fail at the exchange's deadline) */
        if (env->rank != 0 || env->world_size == 1) return capex__fail(made, "%s", why);
    }
    if (env->world_size > 1) {
        r = capex__nccl_exchange(env, d->bootstrap, &id, d->init_timeout_s > 0 ? d->init_timeout_s : 300.0,
                                 d->rendezvous_port);
        if (made != CAPEX_OK) return capex__fail(made, "%s", why);
        if (r != CAPEX_OK) { capex_comm_destroy(c); return r; }
    }
    return capex__nccl_init_rank(c, &id, env->rank, env->world_size, d->timeout_s, d->init_timeout_s);
}

CAPEX_API capex_result capex_nccl_set_user_stream(capex_comm *c, capex_cuda_stream user_stream) {
    if (!capex_comm_is_nccl(c) || !c->impl)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_nccl_set_user_stream: not an NCCL communicator");
    capex__nccl_of(c)->user = user_stream;
    return CAPEX_OK;
}

/* ---- ZeRO on the GPU ---------------------------------------------------------
   capex.h's capex_zero in device mode (capex__zero_create with hooks): it
   plans, reduce-scatters, all-gathers and checkpoints; the hooks below give it
   a capex_cuda_optim over the pieces and the device ops it lacks. */
struct capex_cuda_zero {
    capex_zero *z;
    capex_comm *comm;
    capex_cuda_context *ctx;
    capex_cuda_optim *opt;
    capex_tensor *shards;    /* per bucket with elements: this rank's reduced shard, by dtype */
    capex_tensor_list lists[3];
    size_t nlists;
    int64_t chunks;          /* of the shards, at the default chunk size */
    capex_cuda_ptr ws;       /* per-chunk partials, then the total (double) */
    size_t ws_bytes;
    capex_cuda_ptr coef;     /* float, capex_cuda_zero_clip_coef_ptr */
    capex_cuda_ptr inv_scale, clip_coef, found_inf; /* the step's, for the step hook */
    capex_cuda_ptr lamb;     /* LAMB: |p|^2 then |u|^2 per param (2 * np doubles), summed across ranks */
    int64_t *lamb_idx;       /* LAMB: per piece k: k, 1 (a one-element segment), its param */
    int norm_ready;          /* grad_norm's kernels are loaded (capex__czero_load_norm) */
};

CAPEX__PRIVATE capex_cuda_stream capex__czero_stream(const capex_cuda_zero *zg) { return capex__nccl_of(zg->comm)->user; }

CAPEX__PRIVATE capex_result capex__czero_add_group(void *user, const capex_optim_hparams *hp, const capex_optim_param *pp,
                                                  size_t n) {
    return capex_cuda_optim_add_group(((capex_cuda_zero *)user)->opt, hp, pp, n, NULL);
}
CAPEX__PRIVATE capex_result capex__czero_step(void *user) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    return capex_cuda_optim_step(zg->opt, zg->inv_scale, zg->clip_coef, zg->found_inf, capex__czero_stream(zg));
}
/* Stage 2, a second finalize before zero_grad: gshard += this reduce, as
   the host's axpby(1, x, 1, y): f32 sum, rounded once to a half dtype
   (capex_add_half: no scratch, whose first allocation mid-finalize could
   fail on one rank alone while its peers waited in the next collective). */
CAPEX__PRIVATE capex_result capex__czero_add(void *user, void *y, const void *x, size_t n, capex_dtype t) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    capex_cuda_stream s = capex__czero_stream(zg);
    capex_cuda_ptr Y = (capex_cuda_ptr)(uintptr_t)y, X = (capex_cuda_ptr)(uintptr_t)x;
    unsigned long long nn = n;
    int bf = t == CAPEX_BF16;
    void *args[4];
    if (t == CAPEX_F32) return capex_cuda_add_f32(zg->ctx, Y, Y, X, n, s);
    if (t != CAPEX_F16 && !bf) return capex__fail(CAPEX_ERR_UNSUPPORTED, "capex_cuda_zero: accumulating %s", capex_dtype_name(t));
    if (n == 0) return CAPEX_OK;
    args[0] = &Y; args[1] = &X; args[2] = &bf; args[3] = &nn;
    return capex__cuda_builtin_launch(zg->ctx, CAPEX__CK_ADD_HALF, n, s, args);
}
/* Sharded LAMB's and NovoGrad's sums across ranks, on the device
   (capex_cuda_optim's reduce_fn): the global norm's one double is allreduced
   in place; per-piece sums (LAMB's |p|^2 and |u|^2, NovoGrad's grad sum of
   squares) are moved to their params' slots of a zeroed per-param array
   (one-element segments of the fixed-order reduce kernel), allreduced, and
   moved back. Each allreduce waits for its collective (the
   NCCL comm's blocking entry), no value goes through the host. */
CAPEX__PRIVATE capex_result capex__czero_reduce(void *user, int what, capex_cuda_ptr vals, size_t n, capex_cuda_stream s) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    size_t np = zg->z->np;
    const int64_t *k = zg->lamb_idx, *one = k + n, *param = k + 2 * n;
    const capex__go_exec *ex = &zg->opt->ex;
    capex_cuda_ptr A = zg->lamb, B = zg->lamb + 8u * (uint64_t)np;
    capex_result r;
    if (zg->comm->world_size == 1) return CAPEX_OK;
    if (what == 0) r = capex_comm_allreduce(zg->comm, (void *)(uintptr_t)vals, (void *)(uintptr_t)vals, n, CAPEX_F64, CAPEX_REDUCE_SUM);
    else {
        size_t halves = what == 1 ? 2 : 1; /* LAMB: |p|^2 then |u|^2; NovoGrad: one sum */
        if (n != zg->z->npieces) return capex__fail(CAPEX_ERR_INVALID_ARG, "capex_cuda_zero: sums of %zu tensors, %zu pieces", n, zg->z->npieces);
        r = ex->zero(ex->user, A, 8u * halves * np, s);
        if (r == CAPEX_OK) r = capex__go_reduce_to(ex, vals, k, one, param, n, A, 0, s);
        if (r == CAPEX_OK && halves == 2) r = capex__go_reduce_to(ex, vals + 8u * (uint64_t)n, k, one, param, n, B, 0, s);
        if (r == CAPEX_OK)
            r = capex_comm_allreduce(zg->comm, (void *)(uintptr_t)A, (void *)(uintptr_t)A, halves * np, CAPEX_F64, CAPEX_REDUCE_SUM);
        if (r == CAPEX_OK) r = capex__go_reduce_to(ex, A, param, one, k, n, vals, 0, s);
        if (r == CAPEX_OK && halves == 2) r = capex__go_reduce_to(ex, B, param, one, k, n, vals + 8u * (uint64_t)n, 0, s);
    }
    if (r != CAPEX_OK) zg->z->failed = 1;
    return r;
}

CAPEX__PRIVATE capex_result capex__czero_to_host(void *user, unsigned flags, capex_optim **host) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    return capex_cuda_optim_to_host(zg->opt, flags, capex__czero_stream(zg), host);
}
CAPEX__PRIVATE capex_result capex__czero_from_host(void *user, const capex_optim *host) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    return capex_cuda_optim_from_host(zg->opt, host, 0, capex__czero_stream(zg));
}
CAPEX__PRIVATE capex_result capex__czero_check_host(void *user, const capex_optim *host) {
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    return capex__cuda_optim_from_host(zg->opt, host, 0, capex__czero_stream(zg), 1);
}

CAPEX_API void capex_cuda_zero_destroy(capex_cuda_zero *zg) {
    if (!zg) return;
    capex_zero_destroy(zg->z); /* waits for its collectives */
    capex_cuda_optim_destroy(zg->opt);
    if (zg->ctx) {
        if (zg->lamb) capex_cuda_free(zg->ctx, zg->lamb);
        if (zg->ws) capex_cuda_free(zg->ctx, zg->ws);
        if (zg->coef) capex_cuda_free(zg->ctx, zg->coef);
    }
    capex__free(NULL, zg->shards);
    capex__free(NULL, zg->lamb_idx);
    capex__free(NULL, zg);
}

/* Loads what grad_norm launches (the shards' sums, the norm kernel), launching nothing. */
static capex_result capex__czero_load_norm(capex_cuda_zero *zg) {
    capex__go_exec ex;
    capex__go_args a;
    capex_result r;
    if ((r = capex__go_dev_exec(zg->ctx, "capex_cuda_zero_grad_norm", &ex)) != CAPEX_OK) return r;
    ex.launch = capex__go_dev_load_only; /* as capex_cuda_zero_grad_norm's launches */
    ex.grid = NULL;
    if ((r = capex__go_sumsq_lists(&ex, NULL, zg->lists, zg->nlists, zg->ws, zg->chunks, NULL)) != CAPEX_OK) return r;
    memset(&a, 0, sizeof a);
    if ((r = capex__go_small(&ex, CAPEX__GO_K_ZERO_NORM, 1, 1, &a, NULL)) == CAPEX_OK) zg->norm_ready = 1;
    return r;
}

/* Loads what a step, stage 2's accumulation and (several ranks) grad_norm
   of this zero launch (their kernels' variants, compiled if missing),
   launching nothing: create does it inside its last agreement. On first use
   they loaded at the first grad_norm, step or second finalize, between
   collectives, where one rank failing alone (a module the driver refuses,
   no NVRTC and no cache entry) left its peers in the norm's allreduce or
   the all-gather. A later change of the step's kernels (an lr schedule, a
   switch of modes) loads them at the change (opt->load_at_change). A world
   of 1 has no peers to leave waiting: grad_norm's load at its first call
   (never, where nothing calls it). */
static capex_result capex__czero_load(capex_cuda_zero *zg, const capex_zero *z) {
    capex_cuda_function fn;
    capex_result r;
    size_t k;
    if ((r = capex__go_step_ready(zg->opt, 0, 0, 0)) != CAPEX_OK) return r;
    /* stage 2's accumulation (capex__czero_add): f32 shards' add, half shards' */
    for (k = 0; z->d.stage == 2 && k < z->nb; k++)
        if ((r = capex__cuda_builtin_get(zg->ctx, z->b[k].dtype == CAPEX_F32 ? CAPEX__CK_ADD_F32 : CAPEX__CK_ADD_HALF, &fn)) != CAPEX_OK)
            return r;
    zg->opt->load_at_change = z->comm->world_size > 1;
    return z->comm->world_size > 1 ? capex__czero_load_norm(zg) : CAPEX_OK;
}

/* capex_cuda_zero_create's own setup once the base zero's buffers exist
   (capex__zero_dev.finish): run inside capex__zero_create before its last
   agreement, so a failure here on one rank fails every rank. zg->z is set
   only when create succeeds: on failure the base zero is destroyed there. */
static capex_result capex__czero_finish(void *user, capex_zero *z) {
    static const char *fn = "capex_cuda_zero_create";
    capex_cuda_zero *zg = (capex_cuda_zero *)user;
    capex_result r;
    capex_optim_kind kind;
    size_t k, t, n;
    float one = 1.0f;
    zg->opt->sealed = 1;
    /* this rank's reduced shards (stable for the zero's life), one list per dtype */
    zg->shards = (capex_tensor *)capex__alloc(NULL, sizeof(capex_tensor) * (z->nb + 1));
    if (!zg->shards) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (t = 0, n = 0; t < 3; t++) {
        size_t first = n;
        for (k = 0; k < z->nb; k++) {
            const capex__zbucket *bk = &z->b[k];
            if ((size_t)bk->dtype != t || !bk->shard) continue;
            zg->shards[n].data = z->d.stage == 1
                                     ? (char *)bk->grad + (size_t)z->comm->rank * bk->shard * capex_dtype_size(bk->dtype)
                                     : bk->gshard;
            zg->shards[n++].numel = (int64_t)bk->shard;
        }
        if (n > first) zg->lists[zg->nlists++] = capex_tensor_list_make((capex_dtype)t, zg->shards + first, n - first);
    }
    r = capex__go_ws_size(fn, NULL, zg->lists, zg->nlists, &zg->chunks, &zg->ws_bytes);
    if (r == CAPEX_OK) r = capex_cuda_malloc(zg->ctx, zg->ws_bytes, &zg->ws);
    if (r == CAPEX_OK) r = capex_cuda_malloc(zg->ctx, sizeof(float), &zg->coef);
    if (r == CAPEX_OK) r = capex_cuda_memcpy_htod(zg->ctx, zg->coef, &one, sizeof one, NULL);
    kind = zg->opt->desc.kind;
    if (r == CAPEX_OK && (kind == CAPEX_OPTIM_LAMB || kind == CAPEX_OPTIM_NOVOGRAD)) { /* capex__czero_reduce */
        size_t j, npc = z->npieces;
        if (!(zg->lamb_idx = (int64_t *)capex__alloc(NULL, sizeof(int64_t) * (3 * npc + 1))))
            r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (j = 0; r == CAPEX_OK && j < npc; j++) {
            zg->lamb_idx[j] = (int64_t)j;
            zg->lamb_idx[npc + j] = 1;
            zg->lamb_idx[2 * npc + j] = (int64_t)z->piece_param[j];
        }
        if (r == CAPEX_OK) r = capex_cuda_malloc(zg->ctx, 16u * (z->np + 1), &zg->lamb);
        zg->opt->reduce_fn = capex__czero_reduce;
        zg->opt->reduce_user = zg;
    }
    if (r == CAPEX_OK) r = capex__czero_load(zg, z);
    return r;
}

CAPEX_API capex_result capex_cuda_zero_create(capex_cuda_zero **out, capex_comm *comm, const capex_zero_param *params,
                                              size_t np, const capex_optim_desc *od, const capex_optim_hparams *hp,
                                              size_t ngroups, const capex_zero_desc *d) {
    static const char *fn = "capex_cuda_zero_create";
    capex_cuda_zero *zg = NULL;
    capex__zero_dev dev;
    capex__hostbuf hb = {NULL, 0};
    capex_result r;
    if (!out) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if ((r = capex__comm_check(comm, fn)) != CAPEX_OK) return r;
    /* the exchanges' buffer when the vtable has no host_buffer (capex__zero_create's), before any agreement */
    if ((r = capex__hostbuf_make(comm, &hb, capex__comm_host_bytes(comm->world_size))) != CAPEX_OK) return r;
    /* a refusal here still joins capex__zero_create's model check, so the peers fail with this rank */
    if (!capex_comm_is_nccl(comm) || !comm->impl)
        r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: the comm is %s on host buffers; device params need an NCCL comm "
                        "(capex_comm_init_nccl), host params capex_zero_create", fn, comm->vt->name);
    else if (!od) r = capex__fail(CAPEX_ERR_INVALID_ARG, "%s: od is NULL; make one with capex_optim_desc_init", fn);
    else if (!(zg = (capex_cuda_zero *)capex__alloc(NULL, sizeof *zg)))
        r = capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    else {
        memset(zg, 0, sizeof *zg);
        zg->comm = comm;
        zg->ctx = capex__nccl_of(comm)->ctx;
        if ((r = capex_cuda_optim_create(zg->ctx, od, &zg->opt)) != CAPEX_OK) capex__free(NULL, zg);
    }
    if (r != CAPEX_OK) {
        capex__sig_names nm;
        int64_t sig[CAPEX__SIG_N];
        memset(&nm, 0, sizeof nm);
        nm.api = fn;
        return capex__create_refuse(comm, &hb, sig, r, &nm);
    }
    memset(&dev, 0, sizeof dev);
    dev.user = zg;
    dev.add_group = capex__czero_add_group;
    dev.step = capex__czero_step;
    dev.add = capex__czero_add;
    dev.to_host = capex__czero_to_host;
    dev.from_host = capex__czero_from_host;
    dev.check_host = capex__czero_check_host;
    dev.finish = capex__czero_finish; /* the rest of this create, inside its last agreement */
    if ((r = capex__zero_create(&zg->z, comm, params, np, od, hp, ngroups, d, &dev, &hb, fn)) != CAPEX_OK) {
        capex_cuda_zero_destroy(zg); /* zg->z NULL: the base zero is gone */
        return r;
    }
    *out = zg;
    return CAPEX_OK;
}

CAPEX_API capex_zero *capex_cuda_zero_base(capex_cuda_zero *zg) { return zg ? zg->z : NULL; }
CAPEX_API capex_cuda_optim *capex_cuda_zero_optim(capex_cuda_zero *zg) { return zg ? zg->opt : NULL; }
CAPEX_API capex_cuda_ptr capex_cuda_zero_clip_coef_ptr(const capex_cuda_zero *zg) { return zg ? zg->coef : 0; }

CAPEX_API capex_result capex_cuda_zero_grad_norm(capex_cuda_zero *zg, capex_cuda_ptr inv_scale, float max_norm,
                                                 capex_cuda_ptr found_inf, capex_cuda_ptr total_norm,
                                                 capex_cuda_ptr clip_coef) {
    static const char *fn = "capex_cuda_zero_grad_norm";
    capex__go_exec ex;
    capex__go_args a;
    capex_cuda_ptr sum;
    capex_cuda_stream s;
    capex_result r;
    if (!zg) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: zero is NULL", fn);
    if ((r = capex__zero_check(zg->z, fn)) != CAPEX_OK) return r;
    if ((r = capex__zero_between_iterations(zg->z, fn)) != CAPEX_OK) return r; /* shards not reduced yet */
    if (max_norm != max_norm || max_norm < 0.0f)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: max_norm is %g; it must be >= 0 (inf: no clipping)", fn,
                           (double)max_norm);
    if ((inv_scale & 3u) || (found_inf & 3u) || (total_norm & 3u) || (clip_coef & 3u))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: inv_scale, found_inf, total_norm and clip_coef must be 4-byte "
                           "aligned device addresses (or 0)", fn);
    if ((r = capex__go_dev_exec(zg->ctx, fn, &ex)) != CAPEX_OK) return r;
    /* a world of 1's first call: its kernels, before it launches anything (several ranks: loaded by create) */
    if (!zg->norm_ready && (r = capex__czero_load_norm(zg)) != CAPEX_OK) return r;
    s = capex__czero_stream(zg);
    sum = zg->ws + 8u * (uint64_t)zg->chunks;
    if ((r = capex__go_sumsq_lists(&ex, NULL, zg->lists, zg->nlists, zg->ws, zg->chunks, s)) != CAPEX_OK) return r;
    /* the shards' sums to every rank: after the kernels (the comm waits for its user stream) */
    if (zg->comm->world_size > 1 &&
        (r = capex_comm_allreduce(zg->comm, (void *)(uintptr_t)sum, (void *)(uintptr_t)sum, 1, CAPEX_F64,
                                  CAPEX_REDUCE_SUM)) != CAPEX_OK) {
        zg->z->failed = 1;
        return r;
    }
    memset(&a, 0, sizeof a);
    a.op.znorm.sumsq = sum;
    a.op.znorm.inv_scale = inv_scale;
    a.op.znorm.found_inf = found_inf;
    a.op.znorm.total = total_norm;
    a.op.znorm.coef = clip_coef;
    a.op.znorm.max_norm = max_norm;
    return capex__go_small(&ex, CAPEX__GO_K_ZERO_NORM, 1, 1, &a, s);
}

CAPEX_API capex_result capex_cuda_zero_step_async(capex_cuda_zero *zg, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                                  capex_cuda_ptr found_inf) {
    static const char *fn = "capex_cuda_zero_step_async";
    capex_result r;
    if (!zg) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: zero is NULL", fn);
    if ((r = capex__zero_check(zg->z, fn)) != CAPEX_OK) return r;
    zg->inv_scale = inv_scale;
    zg->clip_coef = clip_coef;
    zg->found_inf = found_inf;
    return capex__zero_step_start(zg->z, 1.0f, 1.0f, 0);
}

CAPEX_API capex_result capex_cuda_zero_step(capex_cuda_zero *zg, capex_cuda_ptr inv_scale, capex_cuda_ptr clip_coef,
                                            capex_cuda_ptr found_inf) {
    capex_result r = capex_cuda_zero_step_async(zg, inv_scale, clip_coef, found_inf);
    return r != CAPEX_OK ? r : capex_zero_wait_params(zg->z);
}
#endif /* CAPEX_NO_DIST */

/* ==== GPU LayerNorm/RMSNorm/SyncBatchNorm: implementation ==== */
/* Built-in kernel k (CAPEX__CK_*) with switches vb (CAPEX__CUDA_NVB for the
   LayerNorm/RMSNorm kernels, 0: none): the first use compiles the kernel's
   variant (or its part). */
CAPEX__PRIVATE capex_result capex__cuda_norm_launch(capex_cuda_context *ctx, size_t k, unsigned vb, unsigned gx, unsigned gy,
                                                    unsigned bx, unsigned by, capex_cuda_stream stream, void **args) {
    capex_cuda_function fn;
    unsigned grid[3], block[3];
    capex_result r;
    if ((r = capex__cuda_builtin_get_vb(ctx, k, vb, &fn, NULL)) != CAPEX_OK) return r;
    grid[0] = gx; grid[1] = gy; grid[2] = 1;
    block[0] = bx; block[1] = by; block[2] = 1;
    return capex_cuda_launch(&fn, grid, block, 0, stream, args);
}
/* Grid-stride launch size: at most 32 blocks of 256 per SM. */
CAPEX__PRIVATE unsigned capex__cuda_norm_blocks(capex_cuda_context *ctx, uint64_t n) {
    uint64_t blocks = (n + 255) / 256, cap = (uint64_t)(ctx->info.sm_count > 0 ? ctx->info.sm_count : 1) * 32u;
    if (blocks < 1) blocks = 1;
    return (unsigned)(blocks < cap ? blocks : cap);
}

#define CAPEX__TAG_CUDA_NORM_ARGS CAPEX__TAG('C', 'N', 'M', 'A')
CAPEX_API void capex_cuda_norm_args_init(capex_cuda_norm_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->init_tag = CAPEX__TAG_CUDA_NORM_ARGS;
    a->x_dtype = a->y_dtype = a->param_dtype = CAPEX_F32;
}
#define CAPEX__TAG_CUDA_BATCH_NORM_ARGS CAPEX__TAG('C', 'B', 'N', 'A')
CAPEX_API void capex_cuda_batch_norm_args_init(capex_cuda_batch_norm_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->init_tag = CAPEX__TAG_CUDA_BATCH_NORM_ARGS;
    a->x_dtype = a->y_dtype = a->param_dtype = CAPEX_F32;
    a->layout = CAPEX_BN_NCS;
}

/* dweight/dbias parts: fixed by rows (deterministic), at most 256. */
CAPEX__PRIVATE uint64_t capex__cuda_norm_parts(int64_t rows) {
    uint64_t p = rows > 0 ? ((uint64_t)rows + 63u) / 64u : 1u;
    return p > 256u ? 256u : p;
}
CAPEX_API size_t capex_cuda_norm_workspace_bytes(int64_t rows, int64_t cols) {
    uint64_t parts = capex__cuda_norm_parts(rows);
    if (rows < 0 || cols < 1 || (uint64_t)cols > (uint64_t)SIZE_MAX / 8u / parts) return 0; /* 0, not a wrapped size */
    return (size_t)(2u * parts * (uint64_t)cols * 4u);
}

/* Host-side checks: the CPU rules on a struct of device pointers. Pointers
   only need to be non-zero here; alignment is checked like the CPU path. */
CAPEX__PRIVATE capex_result capex__cuda_norm_check(const char *fn, const capex_norm_desc *d, const capex_cuda_norm_args *a,
                                                   int rms, int bwd) {
    capex_norm_args h;
    capex_result r;
    if (!a) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: args is NULL", fn);
    if ((r = capex__desc_check(a->init_tag, CAPEX__TAG_CUDA_NORM_ARGS, fn, "capex_cuda_norm_args",
                               "capex_cuda_norm_args_init")) != CAPEX_OK)
        return r;
    capex_norm_args_init(&h);
    h.rows = a->rows; h.cols = a->cols; h.x_dtype = a->x_dtype; h.y_dtype = a->y_dtype; h.param_dtype = a->param_dtype;
    h.x = (const void *)(uintptr_t)a->x; h.weight = (const void *)(uintptr_t)a->weight;
    h.bias = (const void *)(uintptr_t)a->bias; h.y = (void *)(uintptr_t)a->y;
    h.mean = (float *)(uintptr_t)a->mean; h.rstd = (float *)(uintptr_t)a->rstd;
    h.dy = (const void *)(uintptr_t)a->dy; h.dx = (void *)(uintptr_t)a->dx;
    h.dweight = (void *)(uintptr_t)a->dweight; h.dbias = (void *)(uintptr_t)a->dbias;
    /* the workspace takes part in the aliasing rule where the call writes it */
    return capex__nm_check_ws(fn, d, &h, rms, bwd, bwd && (a->dweight || a->dbias) ? a->workspace : 0,
                              capex_cuda_norm_workspace_bytes(a->rows, a->cols));
}

CAPEX__PRIVATE capex_result capex__cuda_norm(capex_cuda_context *ctx, const char *fn, const capex_norm_desc *d,
                                             const capex_cuda_norm_args *a, capex_cuda_stream stream, int rms, int bwd) {
    capex_norm_desc dd;
    capex_result r;
    unsigned long long rows, cols;
    unsigned gx, bx, by, vb;
    int xt, yt, pt, rm = rms;
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!d) { capex_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__cuda_norm_check(fn, d, a, rms, bwd)) != CAPEX_OK) return r;
    if (a->rows == 0) { /* as the CPU: dweight/dbias are written, an empty batch's as 0 (all-zero bits) */
        size_t pb = (size_t)a->cols * capex_dtype_size(a->param_dtype);
        if (bwd && a->dweight && (r = capex_cuda_memset_u8(ctx, a->dweight, 0, pb, stream)) != CAPEX_OK) return r;
        if (bwd && a->dbias && (r = capex_cuda_memset_u8(ctx, a->dbias, 0, pb, stream)) != CAPEX_OK) return r;
        return CAPEX_OK;
    }
    if (bwd && (a->dweight || a->dbias) && !a->workspace)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: dweight/dbias need a workspace of "
                           "capex_cuda_norm_workspace_bytes(rows, cols) = %zu bytes", fn,
                           capex_cuda_norm_workspace_bytes(a->rows, a->cols));
    if (bwd && (a->dweight || a->dbias) && (a->workspace & 3u)) /* floats: a misaligned one faults the context */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: workspace 0x%llx is not 4-byte aligned", fn, (unsigned long long)a->workspace);
    rows = (unsigned long long)a->rows; cols = (unsigned long long)a->cols;
    xt = (int)a->x_dtype; yt = (int)a->y_dtype; pt = (int)a->param_dtype;
    /* the variant fixes these values (the kernels' arguments of the same names) */
    vb = CAPEX__CUDA_NVB(xt, pt, yt, rm); /* dtypes checked above: 0..2 */
    /* a warp per row (4 rows per block) up to 1024 columns, else a block of 256 per row */
    if (cols <= 1024) { bx = 32; by = 4; } else { bx = 256; by = 1; }
    if ((rows + by - 1) / by > 0x7fffffffull) return capex__fail(CAPEX_ERR_LIMIT, "%s: too many rows for one grid", fn);
    /* LayerNorm forward counts each thread's values in a float (Welford: n += 1), exact up
       to 2^24 of them: 2^32 columns at 256 threads a row; beyond, the mean would be wrong */
    if (!bwd && !rms && cols > (1ull << 32))
        return capex__fail(CAPEX_ERR_LIMIT, "%s: %llu columns; the GPU LayerNorm takes rows of at most 2^32", fn, cols);
    gx = (unsigned)((rows + by - 1) / by);
    if (!bwd) {
        float eps = d->eps;
        size_t xs = capex_dtype_size(a->x_dtype), ys = capex_dtype_size(a->y_dtype), ps = capex_dtype_size(a->param_dtype);
        int vec = cols % 4 == 0 && a->x % (4 * xs) == 0 && a->y % (4 * ys) == 0 && a->weight % (4 * ps) == 0 &&
                  a->bias % (4 * ps) == 0;
        void *args[14];
        args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->weight; args[3] = (void *)&a->bias;
        args[4] = &pt; args[5] = (void *)&a->y; args[6] = &yt; args[7] = (void *)&a->mean; args[8] = (void *)&a->rstd;
        args[9] = &rows; args[10] = &cols; args[11] = &eps; args[12] = &rm; args[13] = &vec;
        return capex__cuda_norm_launch(ctx, CAPEX__CK_NORM_FWD, vb, gx, 1, bx, by, stream, args);
    }
    {
        /* from x and mean, or memory_efficient from y and bias (capex_norm_me_*); 4 columns
           per load where the rows read and written are 4-element aligned */
        int me = d->memory_efficient != 0;
        size_t xs = capex_dtype_size(a->x_dtype), ys = capex_dtype_size(a->y_dtype), ps = capex_dtype_size(a->param_dtype);
        int vec = cols % 4 == 0 && a->dy % (4 * ys) == 0 && a->dx % (4 * xs) == 0 && a->weight % (4 * ps) == 0 &&
                  (me ? a->y % (4 * ys) == 0 && a->bias % (4 * ps) == 0 : a->x % (4 * xs) == 0);
        int gvec = vec && a->workspace % 16 == 0; /* float4 partial stores */
        unsigned long long threads = gvec ? cols / 4 : cols;
        /* the dweight/dbias grid, checked before dx is written */
        if ((a->dweight || a->dbias) && (threads + 255) / 256 > 0x7fffffffull)
            return capex__fail(CAPEX_ERR_LIMIT, "%s: too many columns", fn);
        if (a->dx) {
            void *args[13];
            if (me) {
                args[0] = (void *)&a->y; args[1] = &yt; args[2] = (void *)&a->dy; args[3] = (void *)&a->weight;
                args[4] = (void *)&a->bias; args[5] = &pt; args[6] = (void *)&a->rstd; args[7] = (void *)&a->dx; args[8] = &xt;
                args[9] = &rows; args[10] = &cols; args[11] = &rm; args[12] = &vec;
            } else {
                args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->dy; args[3] = &yt; args[4] = (void *)&a->weight;
                args[5] = &pt; args[6] = (void *)&a->mean; args[7] = (void *)&a->rstd; args[8] = (void *)&a->dx;
                args[9] = &rows; args[10] = &cols; args[11] = &rm; args[12] = &vec;
            }
            r = capex__cuda_norm_launch(ctx, me ? CAPEX__CK_NORM_ME_DX : CAPEX__CK_NORM_BWD_DX, vb, gx, 1, bx, by, stream, args);
            if (r != CAPEX_OK) return r;
        }
        if (a->dweight || a->dbias) {
            unsigned long long np = capex__cuda_norm_parts(a->rows), rpp = (rows + np - 1) / np;
            capex_cuda_ptr pw = a->dweight ? a->workspace : 0, pb = a->dbias ? a->workspace + np * cols * 4u : 0;
            void *args[13];
            if (me) {
                args[0] = (void *)&a->y; args[1] = &yt; args[2] = (void *)&a->dy; args[3] = (void *)&a->weight;
                args[4] = (void *)&a->bias; args[5] = &pt; args[6] = &pw; args[7] = &pb; args[8] = &rows; args[9] = &cols;
                args[10] = &rpp; args[11] = &gvec;
            } else {
                args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->dy; args[3] = &yt; args[4] = (void *)&a->mean;
                args[5] = (void *)&a->rstd; args[6] = &pw; args[7] = &pb; args[8] = &rows; args[9] = &cols; args[10] = &rpp;
                args[11] = &rm; args[12] = &gvec;
            }
            r = capex__cuda_norm_launch(ctx, me ? CAPEX__CK_NORM_ME_GAMMA_PART : CAPEX__CK_NORM_BWD_GAMMA_PART, vb,
                                        (unsigned)((threads + 255) / 256), (unsigned)np, 256, 1, stream, args);
            if (r != CAPEX_OK) return r;
            args[0] = &pw; args[1] = &pb; args[2] = &np; args[3] = &cols; args[4] = (void *)&a->dweight;
            args[5] = (void *)&a->dbias; args[6] = &pt;
            return capex__cuda_norm_launch(ctx, CAPEX__CK_NORM_BWD_GAMMA_FINAL, vb, capex__cuda_norm_blocks(ctx, cols), 1, 256, 1,
                                           stream, args);
        }
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_layer_norm_forward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                     const capex_cuda_norm_args *a, capex_cuda_stream stream) {
    return capex__cuda_norm(ctx, "capex_cuda_layer_norm_forward", d, a, stream, 0, 0);
}
CAPEX_API capex_result capex_cuda_layer_norm_backward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                      const capex_cuda_norm_args *a, capex_cuda_stream stream) {
    return capex__cuda_norm(ctx, "capex_cuda_layer_norm_backward", d, a, stream, 0, 1);
}
CAPEX_API capex_result capex_cuda_rms_norm_forward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                   const capex_cuda_norm_args *a, capex_cuda_stream stream) {
    return capex__cuda_norm(ctx, "capex_cuda_rms_norm_forward", d, a, stream, 1, 0);
}
CAPEX_API capex_result capex_cuda_rms_norm_backward(capex_cuda_context *ctx, const capex_norm_desc *d,
                                                    const capex_cuda_norm_args *a, capex_cuda_stream stream) {
    return capex__cuda_norm(ctx, "capex_cuda_rms_norm_backward", d, a, stream, 1, 1);
}

/* BatchNorm workspace: [total f64][pack P][gathered world * P][sums 2C] (floats after the double). */
CAPEX_API size_t capex_cuda_batch_norm_workspace_bytes(int64_t channels, int world) {
    size_t P = capex_syncbn_pack_floats(channels);
    /* floats: (world + 1) * P + 2 * channels < 2 * (world + 1) * P; 0, not a wrapped size */
    if (!P || world < 1 || P > (SIZE_MAX - 8u) / 8u / ((size_t)world + 1u)) return 0;
    return 8u + 4u * (P + (size_t)world * P + 2u * (size_t)channels);
}

CAPEX__PRIVATE capex_result capex__cuda_bn_check(const char *fn, capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                 capex_comm *comm, const capex_cuda_batch_norm_args *a, int bwd,
                                                 capex_cuda_stream stream) {
    capex_batch_norm_args h;
#ifndef CAPEX_NO_DIST
    capex_comm hc;
#endif
    capex_result r;
    if (!ctx) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!a) return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: args is NULL", fn);
    if ((r = capex__desc_check(a->init_tag, CAPEX__TAG_CUDA_BATCH_NORM_ARGS, fn, "capex_cuda_batch_norm_args",
                               "capex_cuda_batch_norm_args_init")) != CAPEX_OK)
        return r;
    capex_batch_norm_args_init(&h);
    h.n = a->n; h.c = a->c; h.s = a->s; h.layout = a->layout;
    h.x_dtype = a->x_dtype; h.y_dtype = a->y_dtype; h.param_dtype = a->param_dtype;
    h.x = (const void *)(uintptr_t)a->x; h.weight = (const void *)(uintptr_t)a->weight;
    h.bias = (const void *)(uintptr_t)a->bias; h.running_mean = (void *)(uintptr_t)a->running_mean;
    h.running_var = (void *)(uintptr_t)a->running_var; h.y = (void *)(uintptr_t)a->y;
    h.num_batches_tracked = a->num_batches_tracked;
    h.save_mean = (float *)(uintptr_t)a->save_mean; h.save_invstd = (float *)(uintptr_t)a->save_invstd;
    h.dy = (const void *)(uintptr_t)a->dy; h.dx = (void *)(uintptr_t)a->dx;
    h.dweight = (void *)(uintptr_t)a->dweight; h.dbias = (void *)(uintptr_t)a->dbias;
#ifdef CAPEX_NO_DIST /* no SyncBatchNorm: capex__bn_check refuses a comm */
    (void)stream;
    if ((r = capex__bn_check_ws(fn, d, comm, &h, bwd, a->workspace, capex_cuda_batch_norm_workspace_bytes(a->c, 1))) !=
        CAPEX_OK)
        return r;
#else
    if (comm) { hc = *comm; hc.device_buffers = 0; } /* device comms are fine here */
    if ((r = capex__bn_check_ws(fn, d, comm ? &hc : NULL, &h, bwd, a->workspace,
                                capex_cuda_batch_norm_workspace_bytes(a->c, capex__bn_world(comm)))) != CAPEX_OK)
        return r;
#endif
    if (!a->save_mean || !a->save_invstd || !a->workspace)
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: save_mean, save_invstd and workspace (capex_cuda_batch_norm_"
                           "workspace_bytes) are required on the GPU", fn);
    if (a->workspace & 7u) /* it starts with doubles: a misaligned one faults the context */
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: workspace 0x%llx is not 8-byte aligned", fn, (unsigned long long)a->workspace);
#ifndef CAPEX_NO_DIST
    /* only where a collective runs (training, or synced eval batch statistics): eval with
       running statistics, or this rank's batch, is local work on any stream */
    if (comm && comm->device_buffers && comm->world_size > 1 && comm->stream != stream &&
        (d->training || (!a->running_mean && d->sync_eval_batch_stats)))
        return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: a device-buffer comm orders work on comm->stream; pass it as "
                           "`stream` (training and synced batch statistics)", fn);
#endif
    return CAPEX_OK;
}

/* Collective on device buffers: directly for a device comm, else staged through host memory. */
CAPEX__PRIVATE capex_result capex__cuda_bn_collective(capex_cuda_context *ctx, capex_comm *comm, int gather,
                                                      capex_cuda_ptr send, capex_cuda_ptr recv, size_t count,
                                                      capex_cuda_stream stream) {
#ifdef CAPEX_NO_DIST /* no comm exists: the world is 1, never called */
    (void)ctx; (void)gather; (void)send; (void)recv; (void)count; (void)stream;
    return capex__bn_collective(comm, 0, NULL, NULL, 0);
#else
    capex_result r;
    float *h;
    size_t out = gather ? count * (size_t)comm->world_size : count;
    if (comm->device_buffers) {
        if (gather) return capex_comm_allgather(comm, (const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, CAPEX_F32);
        return capex_comm_allreduce(comm, (const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, CAPEX_F32,
                                    CAPEX_REDUCE_SUM);
    }
    h = (float *)capex__alloc(comm->allocator, (count + out) * sizeof(float));
    if (!h) return capex__fail(CAPEX_ERR_OUT_OF_MEMORY, "SyncBatchNorm: no host staging memory");
    r = capex_cuda_memcpy_dtoh(ctx, h, send, count * sizeof(float), stream);
    if (r == CAPEX_OK) r = capex_cuda_stream_synchronize(ctx, stream);
    if (r == CAPEX_OK)
        r = gather ? capex_comm_allgather(comm, h, h + count, count, CAPEX_F32)
                   : capex_comm_allreduce(comm, h, h + count, count, CAPEX_F32, CAPEX_REDUCE_SUM);
    if (r == CAPEX_OK) r = capex_cuda_memcpy_htod(ctx, recv, h + count, out * sizeof(float), stream);
    if (r == CAPEX_OK) r = capex_cuda_stream_synchronize(ctx, stream); /* h is freed next */
    capex__free(comm->allocator, h);
    return r;
#endif
}

/* SyncBatchNorm on an NCCL comm runs on comm->stream: like the comm's
   collectives, it starts after the work queued on the comm's user stream (x,
   dy, the parameters); unlike them (the host waits for those) the user stream
   then waits on the GPU for it (y, dx, the statistics), behind whatever the
   comm stream still runs. after 0: before the call's first launch; 1: after
   its last. */
CAPEX__PRIVATE capex_result capex__cuda_bn_order(capex_comm *comm, capex_cuda_stream stream, int after) {
#ifdef CAPEX_NO_DIST
    (void)comm; (void)stream; (void)after;
    return CAPEX_OK;
#else
    if (!capex_comm_is_nccl(comm) || !comm->impl || stream != comm->stream) return CAPEX_OK;
    return after ? capex__nccl_user_after(capex__nccl_of(comm)) : capex__nccl_after_user(capex__nccl_of(comm));
#endif
}

CAPEX__PRIVATE capex_result capex__cuda_batch_norm_forward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                          capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                          capex_cuda_stream stream) {
    static const char *fn = "capex_cuda_batch_norm_forward";
    capex_batch_norm_desc dd;
    capex_result r;
    int world, use_batch, xt, yt, pt, nsc, update;
    unsigned long long N, C, S, total, P;
    capex_cuda_ptr ws_total, ws_pack, ws_gath;
    if (!d) { capex_batch_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__cuda_bn_check(fn, ctx, d, comm, a, 0, stream)) != CAPEX_OK) return r;
    if ((r = capex__cuda_bn_order(comm, stream, 0)) != CAPEX_OK) return r;
    use_batch = d->training || !a->running_mean;
    /* eval without running stats: this rank's batch unless sync_eval_batch_stats (capex.h, torch) */
    world = use_batch && (d->training || d->sync_eval_batch_stats) ? capex__bn_world(comm) : 1;
    N = (unsigned long long)a->n; C = (unsigned long long)a->c; S = (unsigned long long)a->s;
    total = N * C * S; P = capex_syncbn_pack_floats(a->c);
    xt = (int)a->x_dtype; yt = (int)a->y_dtype; pt = (int)a->param_dtype; nsc = a->layout == CAPEX_BN_NSC;
    ws_total = a->workspace; ws_pack = a->workspace + 8u; ws_gath = ws_pack + P * 4u;
    if (use_batch) {
        int w1 = world;
        float eps = d->eps, mom = d->momentum;
        int64_t nb = a->num_batches_tracked ? *a->num_batches_tracked : 0; /* committed once the update is enqueued */
        void *args[12];
        /* use_batch, not only training: eval without running stats takes the batch's
           statistics and torch (bn_training) and the CPU refuse one value there too */
        if (world == 1 && a->n * a->s == 1) /* empty: as torch and the CPU, no statistics, no running update */
            return capex__fail(CAPEX_ERR_INVALID_ARG, "%s: 1 value per channel; batch statistics need more than 1 (PyTorch: "
                               "'Expected more than 1 value per channel when training')", fn);
        if (C > 0x7fffffffull) return capex__fail(CAPEX_ERR_LIMIT, "%s: too many channels for one grid", fn);
        args[0] = (void *)&a->x; args[1] = &xt; args[2] = &N; args[3] = &C; args[4] = &S; args[5] = &nsc; args[6] = &ws_pack;
        if ((r = capex__cuda_norm_launch(ctx, CAPEX__CK_BN_STATS, 0, (unsigned)C, 1, 256, 1, stream, args)) != CAPEX_OK) return r;
        if (world > 1) {
            if ((r = capex__cuda_bn_collective(ctx, comm, 1, ws_pack, ws_gath, P, stream)) != CAPEX_OK) return r;
        } else {
            ws_gath = ws_pack;
        }
        update = d->training && (world > 1 || a->n > 0); /* torch counts an empty batch (nb) but updates nothing */
        if (d->training && a->running_mean) mom = capex_batch_norm_momentum(d, a->num_batches_tracked ? &nb : NULL);
        args[0] = &ws_gath; args[1] = &w1; args[2] = &C; args[3] = &eps; args[4] = &mom; args[5] = &update;
        args[6] = (void *)&a->save_mean; args[7] = (void *)&a->save_invstd; args[8] = (void *)&a->running_mean;
        args[9] = (void *)&a->running_var; args[10] = &pt; args[11] = &ws_total;
        if ((r = capex__cuda_norm_launch(ctx, CAPEX__CK_BN_MERGE, 0, capex__cuda_norm_blocks(ctx, C), 1, 256, 1, stream, args)) !=
            CAPEX_OK)
            return r;
        if (d->training && a->running_mean && a->num_batches_tracked) *a->num_batches_tracked = nb;
    } else {
        float eps = d->eps;
        void *args[7];
        args[0] = (void *)&a->running_mean; args[1] = (void *)&a->running_var; args[2] = &pt; args[3] = &eps;
        args[4] = (void *)&a->save_mean; args[5] = (void *)&a->save_invstd; args[6] = &C;
        if ((r = capex__cuda_norm_launch(ctx, CAPEX__CK_BN_EVAL_STATS, 0, capex__cuda_norm_blocks(ctx, C), 1, 256, 1, stream,
                                         args)) != CAPEX_OK)
            return r;
    }
    if (total > 0) {
        void *args[13];
        args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->y; args[3] = &yt; args[4] = (void *)&a->save_mean;
        args[5] = (void *)&a->save_invstd; args[6] = (void *)&a->weight; args[7] = (void *)&a->bias; args[8] = &pt;
        args[9] = &total; args[10] = &C; args[11] = &S; args[12] = &nsc;
        return capex__cuda_norm_launch(ctx, CAPEX__CK_BN_FWD, 0, capex__cuda_norm_blocks(ctx, total), 1, 256, 1, stream, args);
    }
    return CAPEX_OK;
}

CAPEX_API capex_result capex_cuda_batch_norm_forward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                     capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                     capex_cuda_stream stream) {
    capex_result r = capex__cuda_batch_norm_forward(ctx, d, comm, a, stream);
    return r != CAPEX_OK ? r : capex__cuda_bn_order(comm, stream, 1);
}

CAPEX__PRIVATE capex_result capex__cuda_batch_norm_backward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                           capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                           capex_cuda_stream stream) {
    static const char *fn = "capex_cuda_batch_norm_backward";
    capex_batch_norm_desc dd;
    capex_result r;
    int world, use_batch, xt, yt, pt, nsc;
    unsigned long long N, C, S, total, P;
    capex_cuda_ptr ws_total, ws_sums, tot_ptr;
    void *args[16];
    if (!d) { capex_batch_norm_desc_init(&dd); d = &dd; }
    if ((r = capex__cuda_bn_check(fn, ctx, d, comm, a, 1, stream)) != CAPEX_OK) return r;
    if ((r = capex__cuda_bn_order(comm, stream, 0)) != CAPEX_OK) return r;
    use_batch = d->training || !a->running_mean;
    /* eval without running stats: this rank's batch unless sync_eval_batch_stats (capex.h, torch) */
    world = use_batch && (d->training || d->sync_eval_batch_stats) ? capex__bn_world(comm) : 1;
    N = (unsigned long long)a->n; C = (unsigned long long)a->c; S = (unsigned long long)a->s;
    total = N * C * S; P = capex_syncbn_pack_floats(a->c);
    xt = (int)a->x_dtype; yt = (int)a->y_dtype; pt = (int)a->param_dtype; nsc = a->layout == CAPEX_BN_NSC;
    ws_total = a->workspace;
    ws_sums = a->workspace + 8u + 4u * (P + (unsigned long long)capex__bn_world(comm) * P);
    if (C > 0x7fffffffull) return capex__fail(CAPEX_ERR_LIMIT, "%s: too many channels for one grid", fn);
    if (world == 1 && N * S == 0) { /* as the CPU: 0 (torch), not 0 * inf for eps 0; all-zero bits */
        size_t pb = (size_t)C * capex_dtype_size(a->param_dtype);
        if (a->dweight && (r = capex_cuda_memset_u8(ctx, a->dweight, 0, pb, stream)) != CAPEX_OK) return r;
        if (a->dbias && (r = capex_cuda_memset_u8(ctx, a->dbias, 0, pb, stream)) != CAPEX_OK) return r;
        return CAPEX_OK;
    }
    args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->dy; args[3] = &yt; args[4] = (void *)&a->save_mean;
    args[5] = (void *)&a->save_invstd; args[6] = &N; args[7] = &C; args[8] = &S; args[9] = &nsc; args[10] = &ws_sums;
    args[11] = (void *)&a->dweight; args[12] = (void *)&a->dbias; args[13] = &pt;
    if ((r = capex__cuda_norm_launch(ctx, CAPEX__CK_BN_BWD_REDUCE, 0, (unsigned)C, 1, 256, 1, stream, args)) != CAPEX_OK) return r;
    if (use_batch && world > 1 &&
        (r = capex__cuda_bn_collective(ctx, comm, 0, ws_sums, ws_sums, 2u * C, stream)) != CAPEX_OK)
        return r;
    if (!a->dx || total == 0) return CAPEX_OK;
    tot_ptr = use_batch ? ws_total : 0;
    args[0] = (void *)&a->x; args[1] = &xt; args[2] = (void *)&a->dy; args[3] = &yt; args[4] = (void *)&a->dx;
    args[5] = (void *)&a->save_mean; args[6] = (void *)&a->save_invstd; args[7] = (void *)&a->weight; args[8] = &pt;
    args[9] = &ws_sums; args[10] = &tot_ptr; args[11] = &total; args[12] = &C; args[13] = &S; args[14] = &nsc;
    return capex__cuda_norm_launch(ctx, CAPEX__CK_BN_BWD_DX, 0, capex__cuda_norm_blocks(ctx, total), 1, 256, 1, stream, args);
}

CAPEX_API capex_result capex_cuda_batch_norm_backward(capex_cuda_context *ctx, const capex_batch_norm_desc *d,
                                                      capex_comm *comm, const capex_cuda_batch_norm_args *a,
                                                      capex_cuda_stream stream) {
    capex_result r = capex__cuda_batch_norm_backward(ctx, d, comm, a, stream);
    return r != CAPEX_OK ? r : capex__cuda_bn_order(comm, stream, 1);
}

#ifdef __cplusplus
}
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT DEFAULT
#elif defined(CAPEX__GCC_NO_CONTRACT)
#pragma GCC pop_options
#endif
#endif /* CAPEX_CUDA__IMPLEMENTED */
#endif /* CAPEX_CUDA_IMPLEMENTATION */
