/* The CUDA backend on a GPU: context and device info, the built-in program
   compiled cold, stored, and reloaded from the disk cache by a fresh process
   that cannot load NVRTC; built-in kernels and a user kernel (RawKernel style)
   checked element by element against host references on poisoned outputs;
   streams, events, large shared memory, and the error paths of the driver.
   Prints the cold compile and warm load times. Every test skips without a GPU
   (`make gpu-test` then prints SKIP and succeeds).
   CAPEX_LIBCUDA_PATH may name a stand-in driver (tests/fake_libcuda.c, run by
   `make ci-extra`) to check the host side of all this without a GPU, or the
   CPU emulator (tests/emu_libcuda.cc), which runs the kernels too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
static void on_lock_wait(void);
#define CAPEX__CACHE_ON_LOCK_WAIT() on_lock_wait()
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include "gpu_test_kernels.h"
#include <dirent.h>
#include <dlfcn.h>
#include <time.h>
#include <pthread.h>

/* The CUDA driver maps memory where ASan's shadow gap lies, and keeps
   allocations for the life of the process. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t rng(uint64_t *s) { /* splitmix64, top 32 bits */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1200];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* One temporary cache directory for the whole run (the cold/warm test fills it). */
static char cache_dir[64];

/* Skips the test (returns NULL) when no GPU is usable; fails on other errors. */
#define OPEN_CTX(ctx)                                                                            \
    do {                                                                                         \
        capex_cuda_context_desc cd_;                                                             \
        capex_result r_;                                                                         \
        int n_ = 0;                                                                              \
        r_ = capex_cuda_device_count(&n_);                                                       \
        if (r_ == CAPEX_ERR_NO_DRIVER || r_ == CAPEX_ERR_NO_DEVICE || (r_ == CAPEX_OK && n_ == 0)) \
            CT_SKIP("no GPU (%s): %.90s...", capex_result_string(r_), r_ == CAPEX_OK ? "0 devices" : capex_last_error()); \
        CT_CHECK(r_ == CAPEX_OK, "%s", capex_last_error());                                      \
        capex_cuda_context_desc_init(&cd_);                                                      \
        cd_.device = 0;                                                                          \
        cd_.cache_dir = cache_dir;                                                               \
        CT_CHECK(capex_cuda_context_create(&cd_, &(ctx)) == CAPEX_OK, "%s", capex_last_error()); \
    } while (0)
/* A context on GPU 0 whose kernel cache is a new temporary directory (dir: a
   mkdtemp template); skips without a GPU or NVRTC. cd stays set for reuse. */
#define OPEN_CTX_NEW_CACHE(ctx, cd, dir)                                                         \
    do {                                                                                         \
        OPEN_CTX(ctx); /* skips without a GPU */                                                 \
        capex_cuda_context_destroy(ctx);                                                         \
        CT_NEED_NVRTC();                                                                         \
        CT_CHECK(mkdtemp(dir) != NULL, "temp dir");                                              \
        capex_cuda_context_desc_init(&(cd));                                                     \
        (cd).device = 0;                                                                         \
        (cd).cache_dir = (dir);                                                                  \
        OK(capex_cuda_context_create(&(cd), &(ctx)));                                            \
    } while (0)

#define OK(call) CT_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())

CT_TEST(device_and_context) {
    capex_cuda_context *ctx = NULL, *ctx2 = NULL;
    const capex_cuda_device_info *info;
    capex_cuda_context_desc cd;
    size_t fr = 0, tot = 0;
    int drv = 0;
    OPEN_CTX(ctx);
    info = capex_cuda_context_device(ctx);
    OK(capex_cuda_driver_version(&drv));
    printf("gpu: %s, sm_%d%d, %d SMs, %.1f GiB, %.0f GB/s peak, driver %d\n", info->name, info->cc_major, info->cc_minor,
           info->sm_count, info->total_bytes / 1073741824.0, info->peak_bandwidth_gbs, drv);
    CT_CHECK(info->name[0] && info->cc_major >= 7 && info->sm_count > 0 && info->total_bytes > ((size_t)1 << 30), "device info");
    OK(capex_cuda_mem_info(ctx, &fr, &tot));
    CT_CHECK(tot > 0 && fr <= tot, "mem info");
    /* a second context on the same GPU shares the primary context; destroying one
       leaves the other working */
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.disk_cache = 0;
    OK(capex_cuda_context_create(&cd, &ctx2));
    capex_cuda_context_destroy(ctx2);
    {
        capex_cuda_ptr p;
        OK(capex_cuda_malloc(ctx, 1024, &p));
        OK(capex_cuda_memset_u32(ctx, p, 7u, 256, NULL));
        OK(capex_cuda_free(ctx, p));
    }
    /* device selection from LOCAL_RANK */
    capex_cuda_context_desc_init(&cd);
    {
        char saved_cvd[256];
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        int had = cvd != NULL, count = 0;
        snprintf(saved_cvd, sizeof saved_cvd, "%s", cvd ? cvd : "");
        OK(capex_cuda_device_count(&count));
        unsetenv("CUDA_VISIBLE_DEVICES");
        setenv("LOCAL_RANK", "999", 1);
        CT_CHECK(capex_cuda_context_create(&cd, &ctx2) == CAPEX_ERR_NO_DEVICE && strstr(capex_last_error(), "LOCAL_RANK=999"),
                 "LOCAL_RANK beyond the GPUs: %s", capex_last_error());
        /* one GPU bound to this process by the launcher: it is used whatever LOCAL_RANK says
           (the variable is only read here; the driver saw its value at cuInit) */
        setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        if (count == 1) {
            OK(capex_cuda_context_create(&cd, &ctx2));
            CT_CHECK(capex_cuda_context_device(ctx2)->ordinal == 0, "the bound GPU");
            capex_cuda_context_destroy(ctx2);
        } else {
            CT_CHECK(capex_cuda_context_create(&cd, &ctx2) == CAPEX_ERR_NO_DEVICE, "several visible GPUs: no guessing");
        }
        if (had) setenv("CUDA_VISIBLE_DEVICES", saved_cvd, 1);
        else unsetenv("CUDA_VISIBLE_DEVICES");
    }
    setenv("LOCAL_RANK", "zero", 1);
    CT_CHECK(capex_cuda_context_create(&cd, &ctx2) == CAPEX_ERR_CONFIG, "LOCAL_RANK not a number: %s", capex_last_error());
    setenv("LOCAL_RANK", "0", 1);
    OK(capex_cuda_context_create(&cd, &ctx2));
    CT_CHECK(capex_cuda_context_device(ctx2)->ordinal == 0, "LOCAL_RANK=0 -> GPU 0");
    capex_cuda_context_destroy(ctx2);
    unsetenv("LOCAL_RANK");
    cd.device = 1 << 20;
    CT_CHECK(capex_cuda_context_create(&cd, &ctx2) == CAPEX_ERR_NO_DEVICE, "explicit ordinal out of range");
    cd.device = -7; /* only -1 means $LOCAL_RANK */
    CT_CHECK(capex_cuda_context_create(&cd, &ctx2) == CAPEX_ERR_INVALID_ARG && ctx2 == NULL, "device -7: %s",
             capex_last_error());
    capex_cuda_context_destroy(ctx);
}

/* A context's allocator needs both functions, as capex_optim_create's: with
   only one, memory from one family would be released by the other (free() on
   an arena block). Refused before any driver use, so this runs without a GPU. */
static int alloc_calls, free_calls;
static void *count_alloc(size_t n, void *u) { (void)u; alloc_calls++; return malloc(n); }
static void count_free(void *p, void *u) { (void)u; free_calls++; free(p); }
CT_TEST(context_allocator_needs_both_functions) {
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    capex_allocator half = {count_alloc, NULL, NULL}, other = {NULL, count_free, NULL}, both = {count_alloc, count_free, NULL};
    capex_result r;
    int n = 0;
    capex_cuda_context_desc_init(&cd);
    cd.disk_cache = 0;
    cd.allocator = &half;
    r = capex_cuda_context_create(&cd, &ctx);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && ctx == NULL && strstr(capex_last_error(), "alloc and free"),
             "alloc without free: %s: %s", capex_result_string(r), capex_last_error());
    capex_cuda_context_destroy(ctx); /* what main returned: free() of the allocator's block */
    ctx = NULL;
    cd.allocator = &other;
    r = capex_cuda_context_create(&cd, &ctx);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && ctx == NULL, "free without alloc: %s: %s", capex_result_string(r),
             capex_last_error());
    capex_cuda_context_destroy(ctx);
    ctx = NULL;
    r = capex_cuda_device_count(&n);
    if (r != CAPEX_OK || n == 0) CT_SKIP("no GPU for the allocator's round trip (%s)", capex_result_string(r));
    alloc_calls = free_calls = 0;
    cd.allocator = &both;
    OK(capex_cuda_context_create(&cd, &ctx));
    capex_cuda_context_destroy(ctx);
    CT_CHECK(alloc_calls > 0 && alloc_calls == free_calls, "allocator used: %d allocs, %d frees", alloc_calls, free_calls);
}

/* A context in a fresh child that must not (and cannot) load NVRTC: kernels
   come from the cache at dir only. */
static capex_result ctx_without_nvrtc(const char *dir, capex_cuda_context **ctx) {
    capex_cuda_context_desc cd;
    setenv("CAPEX_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.cache_dir = dir;
    return capex_cuda_context_create(&cd, ctx);
}

/* The child: a fresh process that must not (and cannot) load NVRTC. */
static void child_warm(const char *dir, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_target t;
    capex_cuda_ptr x = 0;
    float host[1000];
    int from_cache = 0, i, bad = 0;
    double t0, t1;
    if ((res->code = ctx_without_nvrtc(dir, &ctx)) != CAPEX_OK) goto out;
    t0 = now_ms();
    res->code = capex_cuda_builtin_module(ctx, &m);
    t1 = now_ms();
    if (res->code != CAPEX_OK) goto out;
    capex_cuda_module_info(m, &t, &from_cache);
    res->value = (int)((t1 - t0) * 1000.0); /* microseconds */
    if (!from_cache || capex_cuda_nvrtc_is_loaded() || dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_NOLOAD) ||
        dlopen("libnvrtc.so.12", RTLD_NOW | RTLD_NOLOAD)) {
        res->code = CAPEX_ERR_INTERNAL;
        snprintf(res->message, sizeof res->message, "from_cache %d, NVRTC loaded %d", from_cache, capex_cuda_nvrtc_is_loaded());
        goto out_ctx;
    }
    /* the cached module runs */
    if ((res->code = capex_cuda_malloc(ctx, sizeof host, &x)) != CAPEX_OK) goto out_ctx;
    if ((res->code = capex_cuda_fill_f32(ctx, x, 2.5f, 1000, NULL)) != CAPEX_OK) goto out_ctx;
    if ((res->code = capex_cuda_memcpy_dtoh(ctx, host, x, sizeof host, NULL)) != CAPEX_OK) goto out_ctx;
    for (i = 0; i < 1000; i++) bad += host[i] != 2.5f;
    if (bad) {
        res->code = CAPEX_ERR_INTERNAL;
        snprintf(res->message, sizeof res->message, "%d wrong values from the cached module", bad);
    }
out_ctx:
    capex_cuda_free(ctx, x);
    capex_cuda_context_destroy(ctx);
out:
    if (res->code != CAPEX_OK && !res->message[0]) snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

CT_TEST(cold_compile_cache_and_warm_reload_without_nvrtc) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL, *m2 = NULL;
    capex_cuda_target t;
    int from_cache = 1, M, mi;
    double t0, t1, t2;
    child_result r;
    OPEN_CTX(ctx);
    t0 = now_ms();
    CT_NEED_NVRTC();
    t1 = now_ms();
    OK(capex_cuda_builtin_module(ctx, &m));
    t2 = now_ms();
    OK(capex_cuda_module_info(m, &t, &from_cache));
    CT_CHECK(!from_cache, "the cache directory was fresh");
    {
        const capex_cuda_device_info *info = capex_cuda_context_device(ctx);
        int cc = info->cc_major * 10 + info->cc_minor;
        capex_cuda_nvrtc_version(&M, &mi);
        printf("gpu-timing: NVRTC %d.%d load %.1f ms; cold compile+load of all %d built-in parts on threads (%zu chars, "
               "%s_%d): %.1f ms\n", M, mi, t1 - t0, capex_cuda_builtin_part_count(), strlen(capex_cuda_builtin_source()),
               t.kind == CAPEX_CUDA_IMAGE_CUBIN ? "sm" : "compute", t.arch, t2 - t1);
        if (cc == 90) CT_CHECK(t.kind == CAPEX_CUDA_IMAGE_CUBIN && t.arch == 90, "H100 gets an sm_90 CUBIN");
    }
    OK(capex_cuda_builtin_module(ctx, &m2));
    CT_CHECK(m2 == m, "second request hits the in-memory cache");
    r = run_child("warm", cache_dir);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK, "warm child: %d %s", r.code, r.message);
    printf("gpu-timing: warm load of all built-in parts from the disk cache in a fresh process (no NVRTC): %.2f ms\n",
           r.value / 1000.0);
    capex_cuda_context_destroy(ctx);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, ".capexjit") != NULL;
    if (d) closedir(d);
    return n;
}

/* builtin_background_compiles_take_free_parts_first: lock files the test holds
   (as another rank compiling those entries would), released from the hook that
   a lock wait calls before each pause. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cv = PTHREAD_COND_INITIALIZER;
static char held_path[2][1300], held_dir[64];
static int held_fd[2] = {-1, -1}, held_release_first = -1, held_entries_at_wait = -1, held_worker_waits;
static pthread_t held_main;
static int count_entries_only(const char *dir) { /* not lock files (NAME.capexjit.lock) */
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += l > 9 && !strcmp(e->d_name + l - 9, ".capexjit");
    }
    if (d) closedir(d);
    return n;
}
static void held_release(int k) { /* as a holder does: unlink, then unlock */
    if (held_fd[k] < 0) return;
    unlink(held_path[k]);
    close(held_fd[k]);
    held_fd[k] = -1;
}
static void on_lock_wait(void) {
    pthread_mutex_lock(&held_mu);
    if (held_dir[0] && !pthread_equal(pthread_self(), held_main)) { /* a background worker */
        if (!held_worker_waits++) {
            held_entries_at_wait = count_entries_only(held_dir);
            if (held_release_first >= 0) held_release(held_release_first);
            pthread_cond_broadcast(&held_cv);
        }
    } else if (held_dir[0]) { /* the caller, claiming part 1: release it */
        held_release(1);
    }
    pthread_mutex_unlock(&held_mu);
}
/* Holds the lock of unit u's entry in ctx's cache as held_fd[k]. */
static int held_take(capex_cuda_context *ctx, int k, int u) {
    capex_cuda_compile_desc d;
    capex__cuda_unit_opts o;
    unsigned char key[32];
    char path[1200];
    capex__cuda_unit_desc(u, ctx->device_cc, ctx->meta_bytes, &ctx->cache, &o, &d);
    capex__cuda_cache_key(d.source, d.name, d.options, d.n_options, ctx->device_cc, key);
    capex__cuda_cache_path(&ctx->cache, key, path, sizeof path);
    snprintf(held_path[k], sizeof held_path[k], "%s.lock", path);
    held_fd[k] = open(held_path[k], O_RDWR | O_CREAT, 0600);
    return held_fd[k] >= 0 && flock(held_fd[k], LOCK_EX | LOCK_NB) == 0;
}

/* Built-in parts compile on first use, one at a time (a fill compiles "basic"
   alone, seen as one new disk-cache entry), and a context created with
   precompile = 1 loads every part (from the disk cache the cold test filled). */
CT_TEST(builtin_parts_load_lazily) {
    capex_cuda_context *ctx = NULL, *ctx2 = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_module *m = NULL;
    capex_cuda_ptr x = 0;
    char dir[] = "/tmp/capex_lazy_XXXXXX";
    float host[256];
    int p, np = capex_cuda_builtin_part_count(), nf = capex_cuda_builtin_kernel_part("capex_norm_fwd"), loaded = 0, fc = 0, warm;
    OPEN_CTX_NEW_CACHE(ctx, cd, dir);
    for (p = 0; p < np; p++) loaded += capex_cuda_builtin_part_loaded(ctx, p);
    CT_CHECK(loaded == 0 && count_entries(dir) == 0, "a new context has compiled nothing (%d)", loaded);
    OK(capex_cuda_malloc(ctx, sizeof host, &x));
    OK(capex_cuda_fill_f32(ctx, x, 3.0f, 256, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, host, x, sizeof host, NULL));
    CT_CHECK(host[0] == 3.0f && host[255] == 3.0f, "fill ran");
    for (p = 0; p < np; p++)
        CT_CHECK(capex_cuda_builtin_part_loaded(ctx, p) == (p == capex_cuda_builtin_kernel_part("capex_fill_f32")),
                 "after a fill, part %s loaded: %d", capex_cuda_builtin_part_name(p), capex_cuda_builtin_part_loaded(ctx, p));
    CT_CHECK(count_entries(dir) == 1, "one cache entry, got %d", count_entries(dir));
    OK(capex_cuda_builtin_part_module(ctx, nf, &m));
    CT_CHECK(m && capex_cuda_builtin_part_loaded(ctx, nf) && count_entries(dir) == 2, "norm_fwd on request");
    CT_CHECK(capex_cuda_builtin_part_module(ctx, np, &m) == CAPEX_ERR_INVALID_ARG && m == NULL, "part out of range");
    CT_CHECK(!capex_cuda_builtin_part_loaded(ctx, -1) && !capex_cuda_builtin_part_loaded(NULL, 0), "loaded: bad args");
    capex_cuda_free(ctx, x);
    capex_cuda_context_destroy(ctx);
    rm_dir(dir);
    /* precompile = 1 in the run's shared cache (cold_compile... filled it: every part a hit) */
    warm = count_entries(cache_dir) == np;
    cd.cache_dir = cache_dir;
    cd.precompile = 1;
    OK(capex_cuda_context_create(&cd, &ctx2));
    for (p = 0, loaded = 0; p < np; p++) {
        int from_cache = 0;
        loaded += capex_cuda_builtin_part_loaded(ctx2, p);
        if (capex_cuda_builtin_part_module(ctx2, p, &m) == CAPEX_OK) capex_cuda_module_info(m, NULL, &from_cache);
        fc += from_cache;
    }
    CT_CHECK(loaded == np && (!warm || fc == np), "precompile = 1: %d loaded, %d from the disk cache, of %d", loaded, fc, np);
    OK(capex_cuda_precompile(ctx2, 2)); /* nothing left to do */
    OK(capex_cuda_builtin_module(ctx2, &m));
    CT_CHECK(m == ctx2->part[capex_cuda_builtin_kernel_part("capex_fill_f32")], "builtin_module is the basic part");
    capex_cuda_context_destroy(ctx2);
}

/* Background compiles (capex_cuda_precompile_async, precompile = 2, and what an
   optimizer's add_group starts): the threads compile into the disk cache, the
   first use loads the module without compiling again, a launch right away
   waits for (or takes over) its part, destroy waits for running compiles. */
CT_TEST(builtin_parts_compile_in_background) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_module *m = NULL;
    capex_cuda_optim *opt = NULL;
    capex_cuda_scaler *sc = NULL;
    capex_optim_desc od;
    capex_scaler_desc sd;
    capex_optim_param pa;
    capex_cuda_ptr x = 0, g = 0;
    char dir[] = "/tmp/capex_bg_XXXXXX", dir2[] = "/tmp/capex_bg_XXXXXX";
    float host[256];
    const char *names[] = {"capex_norm_fwd", "capex_go_adam_bf16"}, *bad[] = {"capex_go_adam_f64"};
    int p, np = capex_cuda_builtin_part_count(), loaded = 0, from_cache = 1;
    OPEN_CTX(ctx); /* skips without a GPU */
    capex_cuda_context_destroy(ctx);
    CT_NEED_NVRTC();
    CT_CHECK(mkdtemp(dir) != NULL && mkdtemp(dir2) != NULL, "temp dirs");
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    /* destroy while every part is queued or compiling: waits, frees (ASan) */
    cd.cache_dir = dir2;
    cd.precompile = 2;
    OK(capex_cuda_context_create(&cd, &ctx));
    capex_cuda_context_destroy(ctx);
    rm_dir(dir2);
    /* named kernels: their two parts only, into the cache; loaded on first use */
    cd.cache_dir = dir;
    cd.precompile = 0;
    OK(capex_cuda_context_create(&cd, &ctx));
    CT_CHECK(capex_cuda_precompile_async(ctx, bad, 1, 2) == CAPEX_ERR_NOT_FOUND && strstr(capex_last_error(), "adam_f64"),
             "unknown kernel: %s", capex_last_error());
    CT_CHECK(capex_cuda_precompile_async(ctx, NULL, 1, 2) == CAPEX_ERR_INVALID_ARG &&
             capex_cuda_precompile_async(NULL, NULL, 0, 2) == CAPEX_ERR_INVALID_ARG &&
             capex_cuda_precompile_wait(NULL) == CAPEX_ERR_INVALID_ARG, "bad arguments");
    OK(capex_cuda_precompile_async(ctx, names, 2, 2));
    OK(capex_cuda_precompile_wait(ctx));
    for (p = 0; p < np; p++) loaded += capex_cuda_builtin_part_loaded(ctx, p);
    CT_CHECK(count_entries(dir) == 2 && loaded == 0, "after the wait: %d cache entries (want 2), %d parts loaded (want 0)",
             count_entries(dir), loaded);
    OK(capex_cuda_builtin_part_module(ctx, capex_cuda_builtin_kernel_part("capex_norm_fwd"), &m));
    OK(capex_cuda_module_info(m, NULL, &from_cache));
    CT_CHECK(!from_cache && count_entries(dir) == 2, "norm_fwd: the thread's image (from_cache %d, %d entries)", from_cache,
             count_entries(dir));
    /* an optimizer's add_group starts what its step launches: the variant of
       amp with prepare and scaler_update (new; the scaler's kernel is there
       too) and the adam_bf16 part (done already, not loaded yet: taken as it is) */
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    capex_optim_param_init(&pa);
    OK(capex_cuda_malloc(ctx, 256 * sizeof(float), &x));
    OK(capex_cuda_malloc(ctx, 256 * 2, &g));
    OK(capex_cuda_memset_u8(ctx, x, 0, 256 * sizeof(float), NULL));
    OK(capex_cuda_memset_u8(ctx, g, 0, 256 * 2, NULL));
    pa.param = (float *)(uintptr_t)x;
    pa.grad = (const void *)(uintptr_t)g;
    pa.grad_dtype = CAPEX_BF16;
    pa.numel = 256;
    OK(capex_cuda_optim_create(ctx, &od, &opt));
    OK(capex_cuda_optim_add_group(opt, NULL, &pa, 1, NULL));
    capex_scaler_desc_init(&sd);
    OK(capex_cuda_scaler_create(ctx, &sd, &sc));
    OK(capex_cuda_precompile_wait(ctx));
    CT_CHECK(count_entries(dir) == 3, "after add_group: %d cache entries (want 3: + amp's step variant)", count_entries(dir));
    { /* what the step's launches take (no launch: the stand-in driver runs none) */
        capex_cuda_function f;
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_PREPARE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_ADAM_BF16, CAPEX__CUDA_VB(1, 0, 0, 0), &f, NULL));
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_SCALER_UPDATE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    }
    m = ctx->part[CAPEX__CUDA_N_PARTS + CAPEX__CV_AMP];
    CT_CHECK(m && capex_cuda_module_info(m, NULL, &from_cache) == CAPEX_OK && !from_cache, "amp's variant: compiled by a thread");
    CT_CHECK(!capex_cuda_builtin_part_loaded(ctx, capex_cuda_builtin_kernel_part("capex_go_prepare")), "not the whole amp part");
    CT_CHECK(capex_cuda_builtin_part_loaded(ctx, capex_cuda_builtin_kernel_part("capex_go_adam_bf16")) && count_entries(dir) == 3,
             "adam_bf16: the earlier request's part, not a variant compiled again (%d entries)", count_entries(dir));
    capex_cuda_scaler_destroy(sc);
    capex_cuda_optim_destroy(opt);
    capex_cuda_free(ctx, g);
    capex_cuda_free(ctx, x);
    capex_cuda_context_destroy(ctx);
    rm_dir(dir);
    /* everything in the background, a fill at once (takes over or waits for its
       part), then precompile takes the rest from the threads */
    cd.cache_dir = cache_dir;
    cd.precompile = 2;
    OK(capex_cuda_context_create(&cd, &ctx));
    OK(capex_cuda_malloc(ctx, sizeof host, &x));
    OK(capex_cuda_fill_f32(ctx, x, 5.0f, 256, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, host, x, sizeof host, NULL));
    CT_CHECK(host[0] == 5.0f && host[255] == 5.0f, "fill during background compiles");
    OK(capex_cuda_precompile(ctx, 2));
    for (p = 0, loaded = 0; p < np; p++) loaded += capex_cuda_builtin_part_loaded(ctx, p);
    CT_CHECK(loaded == np, "precompile after precompile = 2: %d of %d parts loaded", loaded, np);
    capex_cuda_free(ctx, x);
    capex_cuda_context_destroy(ctx);
}

/* Background compiles of parts A (the heavier) and B on one thread while
   another rank holds A's cache entry: the thread compiles B instead of waiting
   for A, then waits for A (main waited for A first: ranks convoyed). Then with
   both held: the thread defers both and waits for A; the caller claiming B
   runs B's deferred compile itself (its lock file kept: the holder's outcome
   reaches it) once B is released, and A's comes when A is. */
CT_TEST(builtin_background_compiles_take_free_parts_first) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_module *m = NULL;
    char dir[] = "/tmp/capex_bgdefer_XXXXXX";
    const char *names[2];
    int pa = capex_cuda_builtin_kernel_part("capex_go_adam_bf16"), pb = capex_cuda_builtin_kernel_part("capex_norm_fwd");
    int i, a = -1, b = -1, round, held, from_cache = 1;
    OPEN_CTX_NEW_CACHE(ctx, cd, dir);
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    for (i = 0; i < CAPEX__CUDA_N_PARTS; i++) { /* A: the one queued first */
        if (a < 0 && (capex__cuda_part_order[i] == pa || capex__cuda_part_order[i] == pb)) a = capex__cuda_part_order[i];
    }
    b = a == pa ? pb : pa;
    names[0] = a == pa ? "capex_go_adam_bf16" : "capex_norm_fwd";
    names[1] = a == pa ? "capex_norm_fwd" : "capex_go_adam_bf16";
    for (round = 0; round < 2; round++) {
        pthread_mutex_lock(&held_mu);
        held = held_take(ctx, 0, a) && (round == 0 || held_take(ctx, 1, b));
        held_main = pthread_self();
        held_worker_waits = 0;
        held_entries_at_wait = -1;
        held_release_first = round == 0 ? 0 : -1;
        snprintf(held_dir, sizeof held_dir, "%s", dir);
        pthread_mutex_unlock(&held_mu);
        CT_CHECK(held, "round %d: the test holds the entries' locks", round);
        OK(capex_cuda_precompile_async(ctx, names, 2, 1)); /* one thread: the queue's order */
        if (round == 1) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += (time_t)CT_HANG_GUARD_S;
            pthread_mutex_lock(&held_mu); /* until the thread waits for A (B deferred too) */
            while (!held_worker_waits && pthread_cond_timedwait(&held_cv, &held_mu, &until) == 0) {}
            pthread_mutex_unlock(&held_mu);
            CT_CHECK(held_worker_waits, "the thread waits for A");
            OK(capex_cuda_builtin_part_module(ctx, b, &m)); /* runs B's deferred compile; waits until B is released */
            OK(capex_cuda_module_info(m, NULL, &from_cache));
            CT_CHECK(!from_cache && count_entries_only(dir) == 1 && held_fd[1] < 0, "B compiled by the caller (from_cache %d, %d entries)",
                     from_cache, count_entries_only(dir));
            pthread_mutex_lock(&held_mu);
            held_release(0);
            pthread_mutex_unlock(&held_mu);
        }
        OK(capex_cuda_precompile_wait(ctx));
        pthread_mutex_lock(&held_mu);
        held_release(0); /* in case nothing waited */
        held_release(1);
        held_dir[0] = '\0';
        pthread_mutex_unlock(&held_mu);
        if (round == 0)
            CT_CHECK(held_entries_at_wait == 1, "B compiled before the thread waited for A (%d entries then)", held_entries_at_wait);
        else
            CT_CHECK(held_entries_at_wait == 0, "both deferred before the thread waited (%d entries then)", held_entries_at_wait);
        CT_CHECK(count_entries_only(dir) == 2, "round %d: two entries, got %d", round, count_entries_only(dir));
        OK(capex_cuda_builtin_part_module(ctx, a, &m));
        OK(capex_cuda_builtin_part_module(ctx, b, &m));
        capex_cuda_context_destroy(ctx);
        rm_dir(dir);
        ctx = NULL;
        if (round == 0) {
            char next[] = "/tmp/capex_bgdefer_XXXXXX";
            CT_CHECK(mkdtemp(next) != NULL, "temp dir");
            memcpy(dir, next, sizeof dir);
            cd.cache_dir = dir;
            OK(capex_cuda_context_create(&cd, &ctx));
        }
    }
}

/* A step compiles variants (capex__cuda_kernel_unit), not whole parts: an
   AdamW step on bf16 grads with a bf16 model copy and a dynamic scaler
   (unscale in place, step, update) loads amp's step variant, the bf16 in-place
   unscale variant and the adam_bf16 variant of (W mode, bf16 copy), one cache
   entry each, and no part. A variant whose kernel uses local memory (spills;
   the emulator says so for CAPEX_EMU_LOCAL_KERNEL) is not used: its part
   runs the step. Once the parts are loaded (capex_cuda_precompile), a launch
   with other switches takes its part: no new variant. */
CT_TEST(builtin_step_compiles_variants) {
    enum { N = 1000 };
    capex_cuda_context *ctx = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_optim *opt = NULL, *opt2 = NULL, *opt3 = NULL;
    capex_cuda_scaler *sc = NULL;
    capex_optim_desc od;
    capex_scaler_desc sd;
    capex_optim_param pa;
    capex_tensor gt;
    capex_tensor_list gl;
    capex_cuda_ptr w = 0, g = 0, h = 0, g32 = 0;
    char dir[] = "/tmp/capex_var_XXXXXX";
    const int uv_amp = CAPEX__CUDA_N_PARTS + CAPEX__CV_AMP;
    const int uv_scale = capex__cuda_kernel_unit(CAPEX__CK_GO_SCALE_BF16_BF16, CAPEX__CUDA_VB(0, 0, 1, 0));
    const int uv_adam = capex__cuda_kernel_unit(CAPEX__CK_GO_ADAM_BF16, CAPEX__CUDA_VB(1, 2, 0, 0));
    const int uv_adam0 = capex__cuda_kernel_unit(CAPEX__CK_GO_ADAM_BF16, CAPEX__CUDA_VB(1, 0, 0, 0));
    const int uv_f32 = capex__cuda_kernel_unit(CAPEX__CK_GO_ADAM_F32, CAPEX__CUDA_VB(1, 0, 0, 0));
    int emu = 0, fake = 0;
    capex_cuda_function f;
    int u, loaded = 0;
    OPEN_CTX_NEW_CACHE(ctx, cd, dir);
    OK(capex_cuda_malloc(ctx, N * 4, &w));
    OK(capex_cuda_malloc(ctx, N * 2, &g));
    OK(capex_cuda_malloc(ctx, N * 2, &h));
    OK(capex_cuda_malloc(ctx, N * 4, &g32));
    OK(capex_cuda_memset_u8(ctx, g32, 0, N * 4, NULL));
    OK(capex_cuda_memset_u8(ctx, w, 0, N * 4, NULL));
    OK(capex_cuda_memset_u8(ctx, g, 0, N * 2, NULL));
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.adam_w_mode = 1;
    capex_optim_param_init(&pa);
    pa.param = (float *)(uintptr_t)w;
    pa.grad = (const void *)(uintptr_t)g;
    pa.grad_dtype = CAPEX_BF16;
    pa.model = (void *)(uintptr_t)h;
    pa.model_dtype = CAPEX_BF16;
    pa.numel = N;
    capex_scaler_desc_init(&sd);
    OK(capex_cuda_scaler_create(ctx, &sd, &sc));
    OK(capex_cuda_optim_create(ctx, &od, &opt));
    OK(capex_cuda_optim_add_group(opt, NULL, &pa, 1, NULL));
    gt.data = (void *)(uintptr_t)g;
    gt.numel = N;
    gl = capex_tensor_list_make(CAPEX_BF16, &gt, 1);
    fake = !strncmp(capex_cuda_context_device(ctx)->name, "capex fake", 10);
    emu = strstr(capex_cuda_context_device(ctx)->name, "capex CPU emulator") != NULL;
    if (!fake) {
        OK(capex_cuda_scaler_unscale(sc, NULL, &gl, &gl, NULL));
        OK(capex_cuda_optim_step(opt, capex_cuda_scaler_inv_scale_ptr(sc), 0, capex_cuda_scaler_found_inf_ptr(sc), NULL));
        OK(capex_cuda_scaler_update(sc, NULL));
        OK(capex_cuda_context_synchronize(ctx));
    } else { /* the stand-in driver runs no optimizer kernel: what the launches would take */
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_SCALE_BF16_BF16, CAPEX__CUDA_VB(0, 0, 1, 0), &f, NULL));
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_PREPARE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_ADAM_BF16, CAPEX__CUDA_VB(1, 2, 0, 0), &f, NULL));
        OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_SCALER_UPDATE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    }
    for (u = 0; u < CAPEX__CUDA_N_PARTS; u++) loaded += capex_cuda_builtin_part_loaded(ctx, u);
    CT_CHECK(loaded == 0, "%d whole parts loaded", loaded);
    CT_CHECK(ctx->part[uv_amp] && ctx->part[uv_scale] && ctx->part[uv_adam], "variants loaded: amp %d, scale %d, adam %d",
             ctx->part[uv_amp] != NULL, ctx->part[uv_scale] != NULL, ctx->part[uv_adam] != NULL);
    CT_CHECK(count_entries(dir) == 3, "%d cache entries (want 3)", count_entries(dir));
    /* a variant that spills (on the emulator: as it says) gives way to its part */
    if (emu) {
        setenv("CAPEX_EMU_LOCAL_KERNEL", "capex_go_adam_f32", 1);
        pa.model = NULL;
        pa.grad = (const void *)(uintptr_t)g32;
        pa.grad_dtype = CAPEX_F32;
        OK(capex_cuda_optim_create(ctx, &od, &opt3));
        OK(capex_cuda_optim_add_group(opt3, NULL, &pa, 1, NULL));
        OK(capex_cuda_optim_step(opt3, 0, 0, 0, NULL));
        OK(capex_cuda_context_synchronize(ctx));
        unsetenv("CAPEX_EMU_LOCAL_KERNEL");
        CT_CHECK(!ctx->part[uv_f32] && ctx->var_spills[uv_f32 - CAPEX__CUDA_N_PARTS] &&
                     capex_cuda_builtin_part_loaded(ctx, CAPEX__CP_ADAM_F32),
                 "spilling variant: part loaded %d, variant %d", capex_cuda_builtin_part_loaded(ctx, CAPEX__CP_ADAM_F32),
                 ctx->part[uv_f32] != NULL);
        pa.grad = (const void *)(uintptr_t)g;
        pa.grad_dtype = CAPEX_BF16;
    }
    /* every part now; a step without a model copy (another Adam variant) takes the part */
    OK(capex_cuda_precompile(ctx, 2));
    pa.model = NULL;
    OK(capex_cuda_optim_create(ctx, &od, &opt2));
    OK(capex_cuda_optim_add_group(opt2, NULL, &pa, 1, NULL));
    if (!fake) OK(capex_cuda_optim_step(opt2, 0, 0, 0, NULL));
    else OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_ADAM_BF16, CAPEX__CUDA_VB(1, 0, 0, 0), &f, NULL));
    OK(capex_cuda_context_synchronize(ctx));
    CT_CHECK(!ctx->part[uv_adam0], "after precompile the part runs it, not a new variant");
    capex_cuda_optim_destroy(opt3);
    capex_cuda_optim_destroy(opt2);
    capex_cuda_optim_destroy(opt);
    capex_cuda_scaler_destroy(sc);
    capex_cuda_free(ctx, g32);
    capex_cuda_free(ctx, h);
    capex_cuda_free(ctx, g);
    capex_cuda_free(ctx, w);
    capex_cuda_context_destroy(ctx);
    rm_dir(dir);
}

CT_TEST(builtin_kernels_exact) {
    enum { N = 5000003, PAD = 64 }; /* not a multiple of 256; more than one grid-stride pass */
    capex_cuda_context *ctx = NULL;
    capex_cuda_ptr a = 0, b = 0, c = 0;
    float *ha = NULL, *hb = NULL, *hc = NULL;
    size_t i, bytes = (size_t)(N + PAD) * 4;
    OPEN_CTX(ctx);
    ha = (float *)malloc(bytes);
    hb = (float *)malloc(bytes);
    hc = (float *)malloc(bytes);
    CT_CHECK(ha && hb && hc, "host memory");
    {
        uint64_t s = 1;
        for (i = 0; i < N; i++) {
            ha[i] = (float)((int)(rng(&s) % 2000001) - 1000000) * 1e-3f;
            hb[i] = u2f((rng(&s) & 0x807fffffu) | 0x3f000000u); /* [0.5, 1) with random sign */
        }
    }
    OK(capex_cuda_malloc(ctx, bytes, &a));
    OK(capex_cuda_malloc(ctx, bytes, &b));
    OK(capex_cuda_malloc(ctx, bytes, &c));
    OK(capex_cuda_memcpy_htod(ctx, a, ha, (size_t)N * 4, NULL));
    OK(capex_cuda_memcpy_htod(ctx, b, hb, (size_t)N * 4, NULL));

    /* fill; output poisoned with NaN (0xFF bytes), pad must stay poisoned */
    OK(capex_cuda_memset_u8(ctx, c, 0xFF, bytes, NULL));
    OK(capex_cuda_fill_f32(ctx, c, -3.25f, N, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, hc, c, bytes, NULL));
    for (i = 0; i < N; i++) CT_CHECK(hc[i] == -3.25f, "fill[%zu] = %g", i, hc[i]);
    for (i = N; i < N + PAD; i++) CT_CHECK(f2u(hc[i]) == 0xFFFFFFFFu, "fill wrote past n at %zu", i);

    /* scale: one IEEE multiply, bit-exact with the host */
    OK(capex_cuda_memset_u8(ctx, c, 0xFF, bytes, NULL));
    OK(capex_cuda_scale_f32(ctx, c, a, 0.1f, N, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, hc, c, bytes, NULL));
    for (i = 0; i < N; i++) CT_CHECK(f2u(hc[i]) == f2u(0.1f * ha[i]), "scale[%zu]: %a vs %a", i, hc[i], 0.1f * ha[i]);
    for (i = N; i < N + PAD; i++) CT_CHECK(f2u(hc[i]) == 0xFFFFFFFFu, "scale wrote past n at %zu", i);
    /* in place (y == x) */
    OK(capex_cuda_memcpy_dtod(ctx, c, a, (size_t)N * 4, NULL));
    OK(capex_cuda_scale_f32(ctx, c, c, -2.0f, N, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, hc, c, (size_t)N * 4, NULL));
    for (i = 0; i < N; i++) CT_CHECK(hc[i] == -2.0f * ha[i], "in-place scale[%zu]", i);

    /* add */
    OK(capex_cuda_memset_u8(ctx, c, 0xFF, bytes, NULL));
    OK(capex_cuda_add_f32(ctx, c, a, b, N, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, hc, c, bytes, NULL));
    for (i = 0; i < N; i++) CT_CHECK(f2u(hc[i]) == f2u(ha[i] + hb[i]), "add[%zu]", i);
    for (i = N; i < N + PAD; i++) CT_CHECK(f2u(hc[i]) == 0xFFFFFFFFu, "add wrote past n at %zu", i);

    /* n = 0 is a no-op, bad pointers are refused */
    OK(capex_cuda_fill_f32(ctx, c, 1.0f, 0, NULL));
    CT_CHECK(capex_cuda_fill_f32(ctx, 0, 1.0f, 10, NULL) == CAPEX_ERR_INVALID_ARG, "NULL device pointer");
    /* an output that overlaps an input anywhere but exactly (threads read what
       others already wrote: silent garbage) is refused; exact aliasing is fine */
    OK(capex_cuda_add_f32(ctx, c, c, b, 16, NULL));
    OK(capex_cuda_add_f32(ctx, c, a, c, 16, NULL));
    CT_CHECK(capex_cuda_add_f32(ctx, c + 4, c, b, 16, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "overlap"), "add into a shifted input: %s", capex_last_error());
    CT_CHECK(capex_cuda_add_f32(ctx, c, a, c + 60, 16, NULL) == CAPEX_ERR_INVALID_ARG, "add from a shifted output");
    CT_CHECK(capex_cuda_scale_f32(ctx, c, c + 4, 2.0f, 16, NULL) == CAPEX_ERR_INVALID_ARG, "scale into a shifted input");
    OK(capex_cuda_add_f32(ctx, c + 64, c, b, 16, NULL)); /* adjacent, not overlapping */
    if (sizeof(size_t) == 8) /* counts whose byte sizes or grid would wrap */
        CT_CHECK(capex_cuda_add_f32(ctx, c, a, b, (size_t)1 << 62, NULL) == CAPEX_ERR_LIMIT &&
                 capex_cuda_convert(ctx, c, CAPEX_F16, a, CAPEX_F32, ~(size_t)0, NULL) == CAPEX_ERR_LIMIT &&
                 capex_cuda_fill_f32(ctx, c, 1.0f, ~(size_t)0, NULL) == CAPEX_ERR_LIMIT &&
                 capex_cuda_scale_f32(ctx, c, a, 2.0f, ~(size_t)0 - 100, NULL) == CAPEX_ERR_LIMIT, "%s", capex_last_error());
    capex_cuda_free(ctx, a);
    capex_cuda_free(ctx, b);
    capex_cuda_free(ctx, c);
    free(ha);
    free(hb);
    free(hc);
    capex_cuda_context_destroy(ctx);
}

/* f16/bf16 <-> f32 on the GPU must equal capex.h's CPU conversions bit for bit. */
CT_TEST(conversions_match_cpu_bit_exact) {
    enum { NH = 65536, NF = 1 << 21 };
    capex_cuda_context *ctx = NULL;
    capex_cuda_ptr d16 = 0, d32 = 0;
    uint16_t *h16 = NULL;
    float *h32 = NULL;
    size_t i;
    int pass;
    OPEN_CTX(ctx);
    h16 = (uint16_t *)malloc((size_t)NF * 2);
    h32 = (float *)malloc((size_t)NF * 4);
    CT_CHECK(h16 && h32, "host memory");
    OK(capex_cuda_malloc(ctx, (size_t)NF * 2, &d16));
    OK(capex_cuda_malloc(ctx, (size_t)NF * 4, &d32));
    for (pass = 0; pass < 2; pass++) {
        capex_dtype t = pass ? CAPEX_BF16 : CAPEX_F16;
        /* every 16-bit code -> f32 */
        for (i = 0; i < NH; i++) h16[i] = (uint16_t)i;
        OK(capex_cuda_memcpy_htod(ctx, d16, h16, NH * 2, NULL));
        OK(capex_cuda_memset_u8(ctx, d32, 0xFF, (size_t)NH * 4, NULL));
        OK(capex_cuda_convert(ctx, d32, CAPEX_F32, d16, t, NH, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, h32, d32, (size_t)NH * 4, NULL));
        for (i = 0; i < NH; i++) {
            float ref = pass ? capex_bf16_to_f32((uint16_t)i) : capex_f16_to_f32((uint16_t)i);
            CT_CHECK(f2u(h32[i]) == f2u(ref), "%s code 0x%04zx: gpu %08x cpu %08x", capex_dtype_name(t), i, f2u(h32[i]), f2u(ref));
        }
        /* f32 -> 16 bits: every code's value, the midpoints and neighbours, random bit patterns */
        for (i = 0; i < NF; i++) {
            uint64_t s = i * 2654435761u + (uint64_t)pass;
            uint32_t code = (uint32_t)(i % NH);
            if (i < NH) h32[i] = pass ? capex_bf16_to_f32((uint16_t)code) : capex_f16_to_f32((uint16_t)code);
            else if (i < 4 * NH) {
                uint32_t base = f2u(pass ? capex_bf16_to_f32((uint16_t)code) : capex_f16_to_f32((uint16_t)code));
                uint32_t half_ulp = pass ? 0x8000u : 0x1000u;
                h32[i] = u2f(base + half_ulp + (uint32_t)(i / NH) - 2u); /* midpoint -1, 0, +1 */
            } else h32[i] = u2f(rng(&s));
        }
        { /* f32 rounding boundaries (overflow, subnormal, tie at the smallest step), specials, NaN payloads */
            static const uint32_t edge[] = {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x7f7fffffu,
                                            0x7f7f7fffu, 0x7f7f8000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33400000u,
                                            0x33800000u, 0x387fe000u, 0x387fffffu, 0x38800000u, 0x00000001u, 0x007fffffu,
                                            0x00800000u, 0x00000000u, 0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu,
                                            0x7fa00000u, 0x7f802000u, 0x7f801fffu, 0x00008000u, 0x00018000u};
            size_t e;
            for (e = 0; e < sizeof edge / sizeof edge[0]; e++) {
                h32[4 * NH + 2 * e] = u2f(edge[e]);
                h32[4 * NH + 2 * e + 1] = u2f(edge[e] | 0x80000000u);
            }
        }
        OK(capex_cuda_memcpy_htod(ctx, d32, h32, (size_t)NF * 4, NULL));
        OK(capex_cuda_memset_u8(ctx, d16, 0xFF, (size_t)NF * 2, NULL));
        OK(capex_cuda_convert(ctx, d16, t, d32, CAPEX_F32, NF, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, h16, d16, (size_t)NF * 2, NULL));
        for (i = 0; i < NF; i++) {
            uint16_t ref = pass ? capex_f32_to_bf16(h32[i]) : capex_f32_to_f16(h32[i]);
            CT_CHECK(h16[i] == ref, "%s from %08x: gpu %04x cpu %04x", capex_dtype_name(t), f2u(h32[i]), h16[i], ref);
        }
    }
    CT_CHECK(capex_cuda_convert(ctx, d16, CAPEX_F16, d32, CAPEX_BF16, 4, NULL) == CAPEX_ERR_UNSUPPORTED, "f16<-bf16 refused");
    /* in place or overlapping: element sizes differ, so threads overwrite inputs others have not read */
    CT_CHECK(capex_cuda_convert(ctx, d32, CAPEX_F16, d32, CAPEX_F32, 1024, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "overlap"), "f32 -> f16 in place: %s", capex_last_error());
    CT_CHECK(capex_cuda_convert(ctx, d32, CAPEX_F32, d32 + 2048, CAPEX_BF16, 1024, NULL) == CAPEX_ERR_INVALID_ARG,
             "bf16 -> f32 into its own tail");
    OK(capex_cuda_convert(ctx, d32, CAPEX_F32, d32 + 4096, CAPEX_BF16, 1024, NULL)); /* adjacent */
    capex_cuda_free(ctx, d16);
    capex_cuda_free(ctx, d32);
    free(h16);
    free(h32);
    capex_cuda_context_destroy(ctx);
}

static const char *user_src = gpu_test_user_src; /* tests/gpu_test_kernels.h */

CT_TEST(user_kernel_raw_kernel_style) {
    enum { N = 100000, PAD = 32 };
    static const char *opts[] = {"-DALPHA=3.0f"};
    static const char *opts2[] = {"-DALPHA=5.0f"};
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL, *again = NULL, *other = NULL;
    capex_cuda_function axpb, rev, missing;
    capex_cuda_ptr x = 0, y = 0;
    float *hx = NULL, *hy = NULL, b = 0.5f;
    unsigned long long n = N;
    unsigned grid[3] = {(N + 255) / 256, 1, 1}, block[3] = {256, 1, 1};
    void *args[4];
    size_t i;
    int fake;
    OPEN_CTX(ctx);
    /* the CPU stand-in driver and the CPU emulator (tests/emu_libcuda.cc) cannot see ALPHA
       (an NVRTC option): they check the launch and the bounds only */
    fake = !strncmp(capex_cuda_context_device(ctx)->name, "capex fake", 10) ||
           strstr(capex_cuda_context_device(ctx)->name, "emulator") != NULL;
    CT_NEED_NVRTC();
    OK(capex_cuda_module_compile(ctx, user_src, "user.cu", opts, 1, &m));
    OK(capex_cuda_module_compile(ctx, user_src, "user.cu", opts, 1, &again));
    CT_CHECK(again == m, "same source and options: the same module");
    OK(capex_cuda_module_compile(ctx, user_src, "user.cu", opts2, 1, &other));
    CT_CHECK(other != m, "other options: another module");
    OK(capex_cuda_module_get_function(m, "user_axpb", &axpb));
    OK(capex_cuda_module_get_function(m, "user_reverse", &rev));
    CT_CHECK(capex_cuda_module_get_function(m, "no_such_kernel", &missing) == CAPEX_ERR_NOT_FOUND &&
             strstr(capex_last_error(), "no_such_kernel"), "missing kernel: %s", capex_last_error());

    hx = (float *)malloc((N + PAD) * 4);
    hy = (float *)malloc((N + PAD) * 4);
    CT_CHECK(hx && hy, "host memory");
    for (i = 0; i < N; i++) hx[i] = (float)((int)(i % 2001) - 1000); /* integers: 3x + 0.5 is exact */
    OK(capex_cuda_malloc(ctx, (N + PAD) * 4, &x));
    OK(capex_cuda_malloc(ctx, (N + PAD) * 4, &y));
    OK(capex_cuda_memcpy_htod(ctx, x, hx, N * 4, NULL));
    OK(capex_cuda_memset_u8(ctx, y, 0xFF, (N + PAD) * 4, NULL));
    args[0] = &y; args[1] = &x; args[2] = &b; args[3] = &n;
    OK(capex_cuda_launch(&axpb, grid, block, 0, NULL, args));
    OK(capex_cuda_memcpy_dtoh(ctx, hy, y, (N + PAD) * 4, NULL));
    for (i = 0; i < N && !fake; i++) CT_CHECK(hy[i] == (float)(3.0 * hx[i] + 0.5), "axpb[%zu] = %g, want %g", i, hy[i], 3.0 * hx[i] + 0.5);
    for (i = N; i < N + PAD; i++) CT_CHECK(f2u(hy[i]) == 0xFFFFFFFFu, "wrote past n at %zu", i);

    /* the other module really has ALPHA = 5 */
    {
        capex_cuda_function f5;
        OK(capex_cuda_module_get_function(other, "user_axpb", &f5));
        OK(capex_cuda_launch(&f5, grid, block, 0, NULL, args));
        OK(capex_cuda_memcpy_dtoh(ctx, hy, y, N * 4, NULL));
        for (i = 0; i < N && !fake; i++) CT_CHECK(hy[i] == (float)(5.0 * hx[i] + 0.5), "ALPHA=5 [%zu]", i);
    }

    /* dynamic shared memory above 48 KiB (the opt-in path), on a stream with events */
    {
        capex_cuda_stream s = NULL;
        capex_cuda_event e0 = NULL, e1 = NULL;
        unsigned g2[3] = {N / 1000, 1, 1}, b2[3] = {1000, 1, 1};
        void *a2[2];
        float ms = -1.0f;
        a2[0] = &y; a2[1] = &x;
        OK(capex_cuda_stream_create(ctx, &s));
        OK(capex_cuda_event_create(ctx, 1, &e0));
        OK(capex_cuda_event_create(ctx, 1, &e1));
        OK(capex_cuda_memset_u8(ctx, y, 0xFF, N * 4, s));
        OK(capex_cuda_event_record(ctx, e0, s));
        OK(capex_cuda_launch(&rev, g2, b2, 64u * 1024u, s, a2));
        OK(capex_cuda_event_record(ctx, e1, s));
        OK(capex_cuda_memcpy_dtoh(ctx, hy, y, N * 4, s));
        OK(capex_cuda_stream_synchronize(ctx, s));
        OK(capex_cuda_event_elapsed_ms(ctx, e0, e1, &ms));
        CT_CHECK(ms >= 0.0f, "elapsed %g ms", ms);
        for (i = 0; i < N; i++) {
            size_t blk = i / 1000, t = i % 1000;
            CT_CHECK(hy[i] == hx[blk * 1000 + 999 - t], "reverse[%zu]", i);
        }
        OK(capex_cuda_event_destroy(ctx, e0));
        OK(capex_cuda_event_destroy(ctx, e1));
        OK(capex_cuda_stream_destroy(ctx, s));
    }
    capex_cuda_free(ctx, x);
    capex_cuda_free(ctx, y);
    free(hx);
    free(hy);
    capex_cuda_context_destroy(ctx);
}

CT_TEST(driver_errors_are_reported) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function f;
    capex_cuda_ptr p = 0;
    unsigned grid[3] = {1, 1, 1}, block[3] = {4096, 1, 1};
    void *args[4];
    float b = 0;
    unsigned long long n = 0;
    capex_result r;
    OPEN_CTX(ctx);
    r = capex_cuda_malloc(ctx, (size_t)1 << 52, &p);
    CT_CHECK(r == CAPEX_ERR_OUT_OF_MEMORY && strstr(capex_last_error(), "cuMemAlloc_v2") &&
             strstr(capex_last_error(), "CUDA_ERROR_OUT_OF_MEMORY"), "4 PiB: %s", capex_last_error());
    CT_CHECK(p == 0, "no pointer on failure");
    CT_NEED_NVRTC();
    r = capex_cuda_module_compile(ctx, user_src, "user.cu", NULL, 0, &m);
    CT_CHECK(r == CAPEX_ERR_NVRTC && strstr(capex_last_error(), "ALPHA"), "NVRTC log names the undefined macro: %s",
             capex_last_error());
    {
        static const char *opts[] = {"-DALPHA=1.0f"};
        OK(capex_cuda_module_compile(ctx, user_src, "user.cu", opts, 1, &m));
    }
    OK(capex_cuda_module_get_function(m, "user_axpb", &f));
    args[0] = &p; args[1] = &p; args[2] = &b; args[3] = &n;
    r = capex_cuda_launch(&f, grid, block, 0, NULL, args);
    CT_CHECK(r == CAPEX_ERR_CUDA && strstr(capex_last_error(), "cuLaunchKernel") && strstr(capex_last_error(), "block (4096"),
             "oversized block: %s", capex_last_error());
    block[0] = 32;
    r = capex_cuda_launch(&f, grid, block, 0x90000000u, NULL, args); /* over INT_MAX: would wrap in the driver's int */
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "shared memory"), "2.25 GiB shared: %s",
             capex_last_error());
    OK(capex_cuda_context_synchronize(ctx));
    capex_cuda_context_destroy(ctx);
}

/* fill, scale, add and convert address their elements as float or 16-bit
   words: a pointer that is not aligned to its element faults a GPU with the
   sticky CUDA_ERROR_MISALIGNED_ADDRESS, which ends the context. Each is
   refused before any launch, naming the pointer; the context works after.
   (Before: all were launched and returned CAPEX_OK; the stand-in driver and
   the emulator, on host memory, do not fault on them.) */
CT_TEST(builtin_ops_refuse_misaligned_pointers) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_ptr p = 0;
    float host[4] = {0, 0, 0, 0};
    OPEN_CTX(ctx);
    OK(capex_cuda_malloc(ctx, 4096, &p));
#define MISALIGNED(call, what)                                                                                    \
    do {                                                                                                         \
        capex_result r_ = (call);                                                                                \
        CT_CHECK(r_ == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "aligned") &&                          \
                     strstr(capex_last_error(), what), "%s: %s: %s", #call, capex_result_string(r_), capex_last_error()); \
    } while (0)
    MISALIGNED(capex_cuda_fill_f32(ctx, p + 2, 1.0f, 4, NULL), "x");
    MISALIGNED(capex_cuda_scale_f32(ctx, p + 2, p + 1024, 2.0f, 4, NULL), "y");
    MISALIGNED(capex_cuda_scale_f32(ctx, p + 1024, p + 1, 2.0f, 4, NULL), "x");
    MISALIGNED(capex_cuda_add_f32(ctx, p + 6, p + 1024, p + 2048, 4, NULL), "c");
    MISALIGNED(capex_cuda_add_f32(ctx, p, p + 1026, p + 2048, 4, NULL), "a");
    MISALIGNED(capex_cuda_add_f32(ctx, p, p + 1024, p + 2049, 4, NULL), "b");
    MISALIGNED(capex_cuda_convert(ctx, p + 1, CAPEX_F16, p + 1024, CAPEX_F32, 4, NULL), "dst");
    MISALIGNED(capex_cuda_convert(ctx, p, CAPEX_BF16, p + 1026, CAPEX_F32, 4, NULL), "src");
    MISALIGNED(capex_cuda_convert(ctx, p, CAPEX_F32, p + 1025, CAPEX_F16, 4, NULL), "src");
#undef MISALIGNED
    /* 2-byte alignment is enough for 16-bit data */
    OK(capex_cuda_convert(ctx, p + 2050, CAPEX_F16, p + 1024, CAPEX_F32, 4, NULL));
    OK(capex_cuda_fill_f32(ctx, p, 3.0f, 4, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, host, p, sizeof host, NULL));
    CT_CHECK(host[0] == 3.0f && host[3] == 3.0f, "the context works after the refusals: %g %g", host[0], host[3]);
    OK(capex_cuda_free(ctx, p));
    capex_cuda_context_destroy(ctx);
}

/* The child of step_that_cannot_load_a_kernel_changes_nothing: a process
   without NVRTC whose cache (arg) holds the step's prepare kernel but not its
   Adam kernel. res->code: the step's status; res->value: the group's step
   count after it. */
static void child_step_no_nvrtc(const char *dir, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_optim *opt = NULL;
    capex_optim_desc od;
    capex_optim_param pa;
    capex_cuda_ptr x = 0, g = 0;
    int64_t step = -1;
    capex_result r;
    res->value = -1;
    if ((res->code = ctx_without_nvrtc(dir, &ctx)) != CAPEX_OK) goto out;
    if ((res->code = capex_cuda_malloc(ctx, 256 * sizeof(float), &x)) != CAPEX_OK ||
        (res->code = capex_cuda_malloc(ctx, 256 * sizeof(float), &g)) != CAPEX_OK ||
        (res->code = capex_cuda_memset_u8(ctx, x, 0, 256 * sizeof(float), NULL)) != CAPEX_OK ||
        (res->code = capex_cuda_memset_u8(ctx, g, 0, 256 * sizeof(float), NULL)) != CAPEX_OK)
        goto out_ctx;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    capex_optim_param_init(&pa);
    pa.param = (float *)(uintptr_t)x;
    pa.grad = (const void *)(uintptr_t)g;
    pa.numel = 256;
    if ((res->code = capex_cuda_optim_create(ctx, &od, &opt)) != CAPEX_OK ||
        (res->code = capex_cuda_optim_add_group(opt, NULL, &pa, 1, NULL)) != CAPEX_OK)
        goto out_ctx;
    capex_cuda_precompile_wait(ctx); /* the Adam variant's background compile fails: no NVRTC */
    r = capex_cuda_optim_step(opt, 0, 0, 0, NULL);
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    res->code = r;
    if (capex_cuda_optim_get_step(opt, 0, &step, NULL) != CAPEX_OK || capex_cuda_context_synchronize(ctx) != CAPEX_OK)
        snprintf(res->message, sizeof res->message, "get_step after the step: %s", capex_last_error());
    res->value = (int)step;
out_ctx:
    capex_cuda_optim_destroy(opt);
    capex_cuda_free(ctx, g);
    capex_cuda_free(ctx, x);
    capex_cuda_context_destroy(ctx);
out:
    if (res->code != CAPEX_OK && !res->message[0]) snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

/* A step whose kernels cannot all be loaded (here: no NVRTC, and a disk cache
   that holds prepare's unit but not Adam's) fails with nothing enqueued.
   Before, prepare ran and counted the step on the device (step 1, weights
   untouched), and each retry counted another: the bias corrections of every
   later step were off. On the stand-in driver (which runs no optimizer kernel)
   the step failed at prepare's launch instead of with CAPEX_ERR_NO_NVRTC. */
CT_TEST(step_that_cannot_load_a_kernel_changes_nothing) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_function f;
    char dir[] = "/tmp/capex_half_step_XXXXXX";
    child_result r;
    OPEN_CTX_NEW_CACHE(ctx, cd, dir);
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_GO_PREPARE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    capex_cuda_context_destroy(ctx);
    CT_CHECK(count_entries(dir) == 1, "the cache holds prepare's unit alone: %d entries", count_entries(dir));
    r = run_child("step_no_nvrtc", dir);
    rm_dir(dir);
    CT_CHECK(r.exited_ok && r.code == CAPEX_ERR_NO_NVRTC && r.value == 0 && strstr(r.message, "not taken"),
             "child: step %s (want CAPEX_ERR_NO_NVRTC), step count after it %d (want 0): %s",
             capex_result_string((capex_result)r.code), r.value, r.message);
}

/* The child of clip_that_cannot_load_a_kernel_scales_nothing: a process
   without NVRTC whose cache holds every kernel of a clip over an f32 and an
   f16 list but the f16 list's scale. res->code: the clip's status;
   res->value: f32 grads no longer 1.0 after it. */
static void child_clip_no_nvrtc(const char *dir, child_result *res) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_ptr g32 = 0, g16 = 0, ws = 0;
    capex_tensor t32, t16;
    capex_tensor_list l[2];
    float host[256];
    unsigned short ones[256];
    size_t need = 0;
    int i;
    res->value = -1;
    if ((res->code = ctx_without_nvrtc(dir, &ctx)) != CAPEX_OK) goto out;
    for (i = 0; i < 256; i++) host[i] = 1.0f, ones[i] = 0x3c00; /* f16 1.0 */
    if ((res->code = capex_cuda_malloc(ctx, sizeof host, &g32)) != CAPEX_OK ||
        (res->code = capex_cuda_malloc(ctx, sizeof ones, &g16)) != CAPEX_OK ||
        (res->code = capex_cuda_memcpy_htod(ctx, g32, host, sizeof host, NULL)) != CAPEX_OK ||
        (res->code = capex_cuda_memcpy_htod(ctx, g16, ones, sizeof ones, NULL)) != CAPEX_OK)
        goto out_ctx;
    t32.data = (void *)(uintptr_t)g32; t32.numel = 256;
    t16.data = (void *)(uintptr_t)g16; t16.numel = 256;
    l[0].tensors = &t32; l[0].count = 1; l[0].dtype = CAPEX_F32;
    l[1].tensors = &t16; l[1].count = 1; l[1].dtype = CAPEX_F16;
    if ((res->code = capex_cuda_multi_tensor_workspace_size(NULL, l, 2, &need)) != CAPEX_OK ||
        (res->code = capex_cuda_malloc(ctx, need, &ws)) != CAPEX_OK)
        goto out_ctx;
    res->code = capex_cuda_clip_grad_norm(ctx, NULL, l, 2, 0.5f, ws, need, 0, 0, 1, NULL); /* norm 32: factor 1/64 */
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    if (capex_cuda_memcpy_dtoh(ctx, host, g32, sizeof host, NULL) != CAPEX_OK) {
        snprintf(res->message, sizeof res->message, "read back: %s", capex_last_error());
        goto out_ctx;
    }
    for (res->value = 0, i = 0; i < 256; i++) res->value += host[i] != 1.0f;
out_ctx:
    capex_cuda_free(ctx, ws);
    capex_cuda_free(ctx, g16);
    capex_cuda_free(ctx, g32);
    capex_cuda_context_destroy(ctx);
out:
    if (res->code != CAPEX_OK && !res->message[0]) snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

/* Likewise a clip that applies its factor: when one list's scale cannot be
   loaded it fails with no grad scaled. Before, the f32 list was scaled (by
   1/64 on the emulator) and then the f16 list's scale failed: a retry scaled
   the f32 grads twice. */
CT_TEST(clip_that_cannot_load_a_kernel_scales_nothing) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_context_desc cd;
    capex_cuda_function f;
    char dir[] = "/tmp/capex_half_clip_XXXXXX";
    child_result r;
    OPEN_CTX_NEW_CACHE(ctx, cd, dir);
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + CAPEX__GO_K_SUMSQ + CAPEX_F32, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + CAPEX__GO_K_SUMSQ + CAPEX_F16, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + CAPEX__GO_K_REDUCE, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + CAPEX__GO_K_CLIP, CAPEX__CUDA_VB(0, 0, 0, 0), &f, NULL));
    OK(capex__cuda_builtin_get_vb(ctx, CAPEX__GO_KBASE + CAPEX__GO_K_SCALE + 4 * CAPEX_F32, CAPEX__CUDA_VB(0, 0, 1, 1), &f, NULL));
    capex_cuda_context_destroy(ctx);
    r = run_child("clip_no_nvrtc", dir);
    rm_dir(dir);
    CT_CHECK(r.exited_ok && r.code == CAPEX_ERR_NO_NVRTC && r.value == 0,
             "child: clip %s (want CAPEX_ERR_NO_NVRTC), %d f32 grads scaled (want 0): %s",
             capex_result_string((capex_result)r.code), r.value, r.message);
}

/* Several threads compile into one context at once: each gets a working module,
   equal requests share one module, and the built-in program is compiled once. */
typedef struct thread_job { capex_cuda_context *ctx; int alpha; capex_result r; capex_cuda_module *m, *builtin; char err[256]; } thread_job;
static void *compile_thread(void *arg) {
    thread_job *j = (thread_job *)arg;
    char opt[32];
    const char *opts[1];
    snprintf(opt, sizeof opt, "-DALPHA=%d.0f", j->alpha);
    opts[0] = opt;
    j->r = capex_cuda_module_compile(j->ctx, user_src, "user.cu", opts, 1, &j->m);
    if (j->r == CAPEX_OK) j->r = capex_cuda_builtin_module(j->ctx, &j->builtin);
    if (j->r != CAPEX_OK) snprintf(j->err, sizeof j->err, "%s", capex_last_error());
    return NULL;
}

CT_TEST(threads_share_a_context) {
    enum { T = 4 };
    capex_cuda_context *ctx = NULL;
    pthread_t th[T];
    thread_job jobs[T];
    int i;
    OPEN_CTX(ctx);
    CT_NEED_NVRTC();
    for (i = 0; i < T; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].ctx = ctx;
        jobs[i].alpha = 10 + i % 2; /* two distinct sources, each requested twice */
        CT_CHECK(pthread_create(&th[i], NULL, compile_thread, &jobs[i]) == 0, "pthread_create");
    }
    for (i = 0; i < T; i++) pthread_join(th[i], NULL);
    for (i = 0; i < T; i++) CT_CHECK(jobs[i].r == CAPEX_OK && jobs[i].m, "thread %d: %s", i, jobs[i].err);
    CT_CHECK(jobs[0].m == jobs[2].m && jobs[1].m == jobs[3].m && jobs[0].m != jobs[1].m, "equal requests share a module");
    CT_CHECK(jobs[0].builtin == jobs[1].builtin && jobs[1].builtin == jobs[2].builtin && jobs[2].builtin == jobs[3].builtin,
             "one built-in module");
    /* the modules work from this thread too */
    {
        capex_cuda_function f;
        capex_cuda_ptr x = 0;
        float v[256];
        OK(capex_cuda_module_get_function(jobs[1].m, "user_axpb", &f));
        OK(capex_cuda_malloc(ctx, sizeof v, &x));
        OK(capex_cuda_fill_f32(ctx, x, 1.0f, 256, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, v, x, sizeof v, NULL));
        for (i = 0; i < 256; i++) CT_CHECK(v[i] == 1.0f, "fill after threaded compile [%d]", i);
        capex_cuda_free(ctx, x);
    }
    capex_cuda_context_destroy(ctx);
}

/* The dynamic shared memory opt-in is one attribute of the function, shared by
   every thread: a launch with less (64 KiB) between another thread's opt-in
   (100 KiB) and its launch must not lower it under that launch. The stand-in
   driver orders the two launches (FAKE_CUDA_PAIR_BIG_LAUNCHES): the first
   waits inside the driver until the second has entered. Fake driver only. */
typedef struct shmem_job { capex_cuda_function *f; capex_cuda_ptr y, x; capex_result r; void (*wait_parked)(void); } shmem_job;
static void *small_shmem_launch(void *arg) {
    shmem_job *j = (shmem_job *)arg;
    unsigned g[3] = {4, 1, 1}, b[3] = {1000, 1, 1};
    void *a[2];
    a[0] = &j->y; a[1] = &j->x;
    j->wait_parked();
    j->r = capex_cuda_launch(j->f, g, b, 64u * 1024u, NULL, a);
    return NULL;
}
CT_TEST(shared_memory_opt_in_is_never_lowered_under_a_launch) {
    static const char *opts[] = {"-DALPHA=1.0f"};
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function rev;
    shmem_job job;
    pthread_t th;
    unsigned g[3] = {4, 1, 1}, b[3] = {1000, 1, 1};
    void *a[2], *lib;
    const char *path = getenv("CAPEX_LIBCUDA_PATH");
    capex_result r;
    OPEN_CTX(ctx);
    if (strncmp(capex_cuda_context_device(ctx)->name, "capex fake", 10) != 0) {
        capex_cuda_context_destroy(ctx);
        CT_SKIP("needs the stand-in driver's launch pairing (tests/fake_libcuda.c)");
    }
    CT_NEED_NVRTC();
    memset(&job, 0, sizeof job);
    lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    {
        void *sym = lib ? dlsym(lib, "fake_wait_parked") : NULL;
        if (sym) memcpy(&job.wait_parked, &sym, sizeof sym);
    }
    CT_CHECK(job.wait_parked != NULL, "the stand-in driver exports fake_wait_parked");
    OK(capex_cuda_module_compile(ctx, user_src, "user.cu", opts, 1, &m));
    OK(capex_cuda_module_get_function(m, "user_reverse", &rev));
    OK(capex_cuda_malloc(ctx, 4000 * 4, &job.y));
    OK(capex_cuda_malloc(ctx, 4000 * 4, &job.x));
    job.f = &rev;
    setenv("FAKE_CUDA_PAIR_BIG_LAUNCHES", "1", 1);
    CT_CHECK(pthread_create(&th, NULL, small_shmem_launch, &job) == 0, "pthread_create");
    a[0] = &job.y; a[1] = &job.x;
    r = capex_cuda_launch(&rev, g, b, 100u * 1024u, NULL, a);
    pthread_join(th, NULL);
    unsetenv("FAKE_CUDA_PAIR_BIG_LAUNCHES");
    CT_CHECK(job.r == CAPEX_OK, "64 KiB launch: %s", capex_result_string(job.r));
    CT_CHECK(r == CAPEX_OK, "100 KiB launch, the other thread's 64 KiB opt-in landed before it: %s", capex_last_error());
    OK(capex_cuda_context_synchronize(ctx));
    capex_cuda_free(ctx, job.x);
    capex_cuda_free(ctx, job.y);
    if (lib) dlclose(lib);
    capex_cuda_context_destroy(ctx);
}

/* Stream NULL means after every stream's work and done on return. The
   driver's legacy stream alone does not wait for capex's non-blocking streams:
   a read raced the kernel before it, and a pageable upload or a memset could
   land after the kernel queued behind it (ZeRO-GPU's H100 test, 2026-11-28).
   The kernel spins ~0.05 s first, so an unordered copy loses every time.
   On the CPU emulator with CAPEX_EMU_STREAMS=lazy the stream's kernel waits
   until something synchronises it, so it loses there too. */
CT_TEST(null_stream_copies_wait_for_every_stream) {
    enum { BIG = 16 << 20 }; /* 64 MB of pageable memory: its DMA outlasts the call that starts it */
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_function spin, spin_copy;
    capex_cuda_stream st = NULL;
    capex_cuda_ptr d = 0, big = 0, big2 = 0;
    unsigned *host = NULL, got = 0, v;
    unsigned long long n = BIG;
    long long cycles = 100000000; /* ~0.05 s at 2 GHz */
    unsigned one[3] = {1, 1, 1};
    void *args[4];
    int k;
    OPEN_CTX(ctx);
    if (!strncmp(capex_cuda_context_device(ctx)->name, "capex fake", 10) ||
        (strstr(capex_cuda_context_device(ctx)->name, "emulator") != NULL &&
         !(getenv("CAPEX_EMU_STREAMS") && !strcmp(getenv("CAPEX_EMU_STREAMS"), "lazy")))) {
        capex_cuda_context_destroy(ctx);
        CT_SKIP("needs a real GPU or the emulator's lazy streams: the CPU drivers run every stream in order");
    }
    CT_NEED_NVRTC();
    OK(capex_cuda_module_compile(ctx, gpu_test_order_src, "order.cu", NULL, 0, &m));
    OK(capex_cuda_module_get_function(m, "spin_then_write", &spin));
    OK(capex_cuda_module_get_function(m, "spin_then_copy_last", &spin_copy));
    OK(capex_cuda_stream_create(ctx, &st));
    OK(capex_cuda_malloc(ctx, 4, &d));
    OK(capex_cuda_malloc(ctx, (size_t)BIG * 4, &big));
    OK(capex_cuda_malloc(ctx, (size_t)BIG * 4, &big2));
    host = (unsigned *)malloc((size_t)BIG * 4);
    CT_CHECK(host != NULL, "host memory");
    if (ct->failed) goto done;
    for (k = 0; k < 3; k++) {
        /* a read waits for the kernel before it */
        v = 100u + (unsigned)k;
        OK(capex_cuda_memset_u32(ctx, d, 0, 1, NULL));
        args[0] = &d; args[1] = &v; args[2] = &cycles;
        OK(capex_cuda_launch(&spin, one, one, 0, st, args));
        OK(capex_cuda_memcpy_dtoh(ctx, &got, d, 4, NULL));
        CT_CHECK(got == v, "round %d: dtoh(NULL) read %u before the kernel on a stream wrote %u", k, got, v);
        /* a memset lands after the kernel before it */
        OK(capex_cuda_launch(&spin, one, one, 0, st, args));
        OK(capex_cuda_memset_u32(ctx, d, 9, 1, NULL));
        OK(capex_cuda_stream_synchronize(ctx, st));
        OK(capex_cuda_memcpy_dtoh(ctx, &got, d, 4, st));
        OK(capex_cuda_stream_synchronize(ctx, st));
        CT_CHECK(got == 9, "round %d: memset(NULL) ran before the kernel queued ahead of it (read %u)", k, got);
        /* an upload from pageable memory is done before the next kernel reads it */
        host[BIG - 1] = 0xC0DE0000u + (unsigned)k;
        OK(capex_cuda_memcpy_htod(ctx, big, host, (size_t)BIG * 4, NULL));
        cycles = 0;
        args[0] = &d; args[1] = &big; args[2] = &n; args[3] = &cycles;
        OK(capex_cuda_launch(&spin_copy, one, one, 0, st, args));
        OK(capex_cuda_memcpy_dtoh(ctx, &got, d, 4, NULL));
        CT_CHECK(got == host[BIG - 1], "round %d: a kernel after htod(NULL) read %#x, want %#x", k, got, host[BIG - 1]);
        /* a device copy likewise */
        OK(capex_cuda_memcpy_dtod(ctx, big2, big, (size_t)BIG * 4, NULL));
        args[1] = &big2;
        OK(capex_cuda_launch(&spin_copy, one, one, 0, st, args));
        OK(capex_cuda_memcpy_dtoh(ctx, &got, d, 4, NULL));
        CT_CHECK(got == host[BIG - 1], "round %d: a kernel after dtod(NULL) read %#x, want %#x", k, got, host[BIG - 1]);
        cycles = 100000000;
        if (ct->failed) break;
    }
done:
    free(host);
    if (st) capex_cuda_stream_destroy(ctx, st);
    capex_cuda_free(ctx, d);
    capex_cuda_free(ctx, big);
    capex_cuda_free(ctx, big2);
    capex_cuda_context_destroy(ctx);
}

static const ct_case cases[] = {
    CT_CASE(device_and_context),
    CT_CASE(context_allocator_needs_both_functions),
    CT_CASE(cold_compile_cache_and_warm_reload_without_nvrtc),
    CT_CASE(builtin_parts_load_lazily),
    CT_CASE(builtin_parts_compile_in_background), CT_CASE(builtin_background_compiles_take_free_parts_first),
    CT_CASE(builtin_step_compiles_variants),
    CT_CASE(builtin_kernels_exact),
    CT_CASE(conversions_match_cpu_bit_exact),
    CT_CASE(user_kernel_raw_kernel_style),
    CT_CASE(null_stream_copies_wait_for_every_stream),
    CT_CASE(driver_errors_are_reported),
    CT_CASE(shared_memory_opt_in_is_never_lowered_under_a_launch),
    CT_CASE(threads_share_a_context),
    CT_CASE(builtin_ops_refuse_misaligned_pointers),
    CT_CASE(step_that_cannot_load_a_kernel_changes_nothing),
    CT_CASE(clip_that_cannot_load_a_kernel_scales_nothing),
};
static const child_entry children[] = {{"warm", child_warm}, {"step_no_nvrtc", child_step_no_nvrtc},
                                       {"clip_no_nvrtc", child_clip_no_nvrtc}};

int main(int argc, char **argv) {
    int rc;
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    snprintf(cache_dir, sizeof cache_dir, "/tmp/capex_gpu_test_XXXXXX");
    if (!mkdtemp(cache_dir)) cache_dir[0] = '\0'; /* "" = no disk cache; the warm test then fails */
    rc = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    if (cache_dir[0]) rm_dir(cache_dir);
    return rc;
}
