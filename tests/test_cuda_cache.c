/* The kernel cache on files: SHA-256 against FIPS vectors, the key covers every
   input, entries round-trip, every kind of damage is detected and recompiled
   over, writes are atomic (readers never see a partial entry, even with
   concurrent writers in several processes), a hit needs no NVRTC, an
   unwritable directory warns once and runs uncached, and the built-in parts
   each get their own entry (filled on threads, damage recompiles one part). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
/* The largest CAPEX_MALLOC request while tracking is on (set only while the
   calling thread is the only one allocating through capex). */
static size_t biggest_alloc;
static int tracking_allocs;
static void *tracked_malloc(size_t n) {
    if (tracking_allocs && n > biggest_alloc) biggest_alloc = n;
    return malloc(n);
}
#define CAPEX_MALLOC(sz) tracked_malloc(sz)
#define CAPEX_REALLOC(p, sz) realloc(p, sz)
#define CAPEX_FREE(p) free(p)
/* capex_cuda.h's private hooks: this process's NVRTC compiles (children
   report theirs), a first compile that reports on a pipe and then stops (a
   lock holder the test kills), a first lock wait that reports on a pipe, and
   the lock's wait limit. */
static void on_nvrtc(void);
static void on_lock_wait(void);
static double lock_wait_s = 120.0;
#define CAPEX__CUDA_ON_NVRTC() on_nvrtc()
#define CAPEX__CACHE_ON_LOCK_WAIT() on_lock_wait()
#define CAPEX__CACHE_LOCK_WAIT_S lock_wait_s
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include <dirent.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/resource.h>
#include <signal.h>
#include <poll.h>
#include <utime.h>

static pthread_mutex_t nvrtc_mu = PTHREAD_MUTEX_INITIALIZER;
static int nvrtc_compiles; /* under nvrtc_mu: compiles run on threads too */
static int hold_fd = -1, wait_fd = -1, waits_reported;
static int fork_go_r = -1, fork_rel_r = -1, fork_rel_w = -1; /* lock_forked_copy_of_a_held_lock */
static int hold_go_r = -1; /* lock_waiters_take_the_holders_compile_error */
static char swap_dir[300], swap_aside[300], swap_link_to[300]; /* cache_dir_swapped_during_a_compile */
static void on_nvrtc(void) {
    pthread_mutex_lock(&nvrtc_mu);
    nvrtc_compiles++;
    pthread_mutex_unlock(&nvrtc_mu);
    if (swap_dir[0]) { /* the cache directory moved aside, a symlink to another one of the user's in its place */
        if (rename(swap_dir, swap_aside) != 0 || symlink(swap_link_to, swap_dir) != 0) swap_aside[0] = '\0';
        swap_dir[0] = '\0';
    }
    if (hold_fd >= 0 && hold_go_r >= 0) { /* holding the lock: tell the parent, go on (to a failing compile) when told */
        char c;
        if (write(hold_fd, "h", 1) != 1 || read(hold_go_r, &c, 1) != 1) _exit(3);
    } else if (hold_fd >= 0 && fork_go_r >= 0) { /* holding the lock: fork a child that keeps a copy of it, report, go on when told */
        char c;
        close(fork_rel_w);
        if (fork() == 0) { /* holds the lock file's copy until the parent test releases it */
            if (read(fork_rel_r, &c, 1) < 0) _exit(0);
            _exit(0);
        }
        if (write(hold_fd, "h", 1) != 1 || read(fork_go_r, &c, 1) != 1) _exit(3);
    } else if (hold_fd >= 0) { /* holding the entry's lock: tell the parent, then wait to be killed */
        if (write(hold_fd, "h", 1) != 1) _exit(3);
        for (;;) pause();
    }
}
static int release_w = -1, first_wait_compiles = -1; /* lock_precompile_takes_free_parts_first */
static int compiles_now(void);
static void on_lock_wait(void) {
    if (wait_fd >= 0 && !waits_reported++ && write(wait_fd, "w", 1) != 1) _exit(3);
    if (release_w >= 0) { /* the first wait: note the compiles so far, let the holder go on */
        first_wait_compiles = compiles_now();
        if (write(release_w, "g", 1) != 1) first_wait_compiles = -2;
        release_w = -1;
    }
}
static int compiles_now(void) {
    int n;
    pthread_mutex_lock(&nvrtc_mu);
    n = nvrtc_compiles;
    pthread_mutex_unlock(&nvrtc_mu);
    return n;
}

#if defined(__clang__) || defined(__GNUC__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libnvrtc-builtins\n"; }
#endif

static const char *user_src = "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = VALUE; }\n";

/* A fresh directory under /tmp, removed by rm_dir. */
static void make_dir(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/capex_cache_test_XXXXXX");
    if (!mkdtemp(buf)) buf[0] = '\0';
}
static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        if (l >= s && !strcmp(e->d_name + l - s, suffix)) n++;
    }
    if (d) closedir(d);
    return n;
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

static void hex(const unsigned char *d, char *out) {
    int i;
    for (i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

/* ---- SHA-256 ---------------------------------------------------------------- */

CT_TEST(sha256_fips_vectors) {
    static const struct { const char *msg; const char *digest; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    unsigned char d[32];
    char h[65];
    size_t i;
    capex__sha256 s;
    for (i = 0; i < sizeof v / sizeof v[0]; i++) {
        capex__sha256_init(&s);
        capex__sha256_update(&s, v[i].msg, strlen(v[i].msg));
        capex__sha256_final(&s, d);
        hex(d, h);
        CT_CHECK(!strcmp(h, v[i].digest), "sha256(\"%s\") = %s", v[i].msg, h);
    }
    /* one million 'a', fed in uneven pieces (exercises the buffering paths) */
    {
        static char a[1000];
        size_t fed = 0, piece = 1;
        memset(a, 'a', sizeof a);
        capex__sha256_init(&s);
        while (fed < 1000000) {
            size_t k = piece < 1000000 - fed ? piece : 1000000 - fed;
            if (k > sizeof a) k = sizeof a;
            capex__sha256_update(&s, a, k);
            fed += k;
            piece = piece * 7 % 997 + 1;
        }
        capex__sha256_final(&s, d);
        hex(d, h);
        CT_CHECK(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "million a: %s", h);
    }
}

/* ---- the key ---------------------------------------------------------------- */

CT_TEST(key_changes_with_each_input) {
    static const char *o1[] = {"-DVALUE=1", "-DB"};
    static const char *o2[] = {"-DVALUE=2", "-DB"};
    static const char *o3[] = {"-DVALUE=1-DB"};      /* same bytes, split differently */
    static const char *o4[] = {"-DB", "-DVALUE=1"};  /* same options, other order */
    unsigned char base[32], k[32], again[32];
    capex__cuda_cache_key(user_src, "p", o1, 2, 90, base);
    capex__cuda_cache_key(user_src, "p", o1, 2, 90, again);
    CT_CHECK(!memcmp(base, again, 32), "deterministic");
    capex__cuda_cache_key("extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = VALUE+1; }\n", "p", o1, 2, 90, k);
    CT_CHECK(memcmp(base, k, 32), "source");
    capex__cuda_cache_key(user_src, "q", o1, 2, 90, k);
    CT_CHECK(memcmp(base, k, 32), "name");
    capex__cuda_cache_key(user_src, "p", o2, 2, 90, k);
    CT_CHECK(memcmp(base, k, 32), "option value");
    capex__cuda_cache_key(user_src, "p", o3, 1, 90, k);
    CT_CHECK(memcmp(base, k, 32), "option split");
    capex__cuda_cache_key(user_src, "p", o4, 2, 90, k);
    CT_CHECK(memcmp(base, k, 32), "option order");
    capex__cuda_cache_key(user_src, "p", o1, 1, 90, k);
    CT_CHECK(memcmp(base, k, 32), "option count");
    capex__cuda_cache_key(user_src, "p", o1, 2, 89, k);
    CT_CHECK(memcmp(base, k, 32), "device arch");
}

/* ---- entries on disk ----------------------------------------------------------- */

static void fake_image(capex_cuda_image *img, size_t n, int kind, unsigned seed) {
    size_t i;
    memset(img, 0, sizeof *img);
    img->data = malloc(n);
    img->size = n;
    img->kind = (capex_cuda_image_kind)kind;
    img->arch = 90;
    img->nvrtc_version = 13000;
    for (i = 0; i < n; i++) ((unsigned char *)img->data)[i] = (unsigned char)(i * 31u + seed);
    if (kind == CAPEX_CUDA_IMAGE_PTX) ((char *)img->data)[n - 1] = '\0';
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* XORs byte `at` of a file with a nonzero mask (at < 0: counts from the end). */
static void poke(const char *path, long at, unsigned char mask) {
    FILE *f = fopen(path, "r+b");
    int c;
    if (!f) return;
    fseek(f, at >= 0 ? at : file_size(path) + at, SEEK_SET);
    c = fgetc(f);
    fseek(f, at >= 0 ? at : file_size(path) + at, SEEK_SET);
    fputc((c ^ mask) & 0xff, f);
    fclose(f);
}
static void copy_file(const char *from, const char *to, long keep) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int c;
    long n = 0;
    while (a && b && (keep < 0 || n < keep) && (c = fgetc(a)) != EOF) { fputc(c, b); n++; }
    if (a) fclose(a);
    if (b) fclose(b);
}

CT_TEST(entry_round_trip_and_damage) {
    char dir[64], path[1200], saved[1300], other_path[1200];
    unsigned char key[32], other[32];
    capex_cuda_cache c;
    capex_cuda_image img, back;
    capex_result r;
    long size;
    make_dir(dir, sizeof dir);
    CT_CHECK(dir[0], "temp dir");
    capex_cuda_cache_init(&c, dir);
    CT_CHECK(c.enabled && !strcmp(c.dir, dir), "explicit dir");
    capex__cuda_cache_key(user_src, "p", NULL, 0, 90, key);
    capex__cuda_cache_key(user_src, "p", NULL, 0, 80, other);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    capex__cuda_cache_path(&c, other, other_path, sizeof other_path);
    snprintf(saved, sizeof saved, "%s.saved", path);

    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_NOT_FOUND, "empty cache: not found");
    fake_image(&img, 5000, CAPEX_CUDA_IMAGE_CUBIN, 7);
    CT_CHECK(capex__cuda_cache_write(&c, key, &img) == CAPEX_OK, "%s", capex_last_error());
    size = file_size(path);
    CT_CHECK(size == 96 + 5000, "entry = 96-byte header + payload, got %ld", size);
    CT_CHECK(count_files(dir, ".tmp") == 0, "no temp file left behind");
    r = capex__cuda_cache_read(path, key, &back);
    CT_CHECK(r == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(back.size == img.size && !memcmp(back.data, img.data, img.size), "payload round-trips");
    CT_CHECK(back.kind == img.kind && back.arch == 90 && back.nvrtc_version == 13000 && back.from_cache == 1, "fields");
    capex_cuda_image_free(&back);
    copy_file(path, saved, -1);

    /* each kind of damage; the entry is restored from `saved` after each */
#define DAMAGE_CASE(what, action, expect)                                                               \
    do {                                                                                                \
        copy_file(saved, path, -1);                                                                     \
        action;                                                                                         \
        r = capex__cuda_cache_read(path, key, &back);                                                  \
        CT_CHECK(r == (expect), "%s: got %s (%s)", what, capex_result_string(r), capex_last_error());   \
        CT_CHECK(back.data == NULL, "%s: no image returned", what);                                   \
    } while (0)
    DAMAGE_CASE("payload byte flipped", poke(path, 96 + 1234, 0x55), CAPEX_ERR_CHECKSUM);
    DAMAGE_CASE("last byte flipped", poke(path, -1, 0xAA), CAPEX_ERR_CHECKSUM);
    DAMAGE_CASE("arch field changed", poke(path, 16, 0x30), CAPEX_ERR_CHECKSUM);
    DAMAGE_CASE("nvrtc field changed", poke(path, 20, 1), CAPEX_ERR_CHECKSUM);
    DAMAGE_CASE("checksum changed", poke(path, 64, 0x01), CAPEX_ERR_CHECKSUM);
    DAMAGE_CASE("kind invalid", poke(path, 12, 9), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("magic", poke(path, 0, 0x20), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("format version", poke(path, 8, 2), CAPEX_ERR_VERSION);
    DAMAGE_CASE("size field larger", poke(path, 25, 0x7f), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("truncated payload", copy_file(saved, path, 96 + 4999), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("truncated header", copy_file(saved, path, 50), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("empty file", copy_file(saved, path, 0), CAPEX_ERR_FORMAT);
    DAMAGE_CASE("trailing bytes", { FILE *f = fopen(path, "ab"); if (f) { fputc(0, f); fclose(f); } }, CAPEX_ERR_FORMAT);
    /* a valid entry of another key placed under this key's name */
    copy_file(saved, other_path, -1);
    r = capex__cuda_cache_read(other_path, other, &back);
    CT_CHECK(r == CAPEX_ERR_FORMAT && strstr(capex_last_error(), "another key"), "foreign entry: %s", capex_last_error());
#undef DAMAGE_CASE
    /* PTX must be NUL-terminated even when its checksum is right */
    capex_cuda_image_free(&img);
    fake_image(&img, 300, CAPEX_CUDA_IMAGE_PTX, 3);
    ((char *)img.data)[299] = 'x';
    CT_CHECK(capex__cuda_cache_write(&c, key, &img) == CAPEX_OK, "write");
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_FORMAT, "unterminated PTX refused");
    capex_cuda_image_free(&img);
    rm_dir(dir);
}

static int warnings;
static void count_warn(capex_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == CAPEX_LOG_WARN && strstr(msg, "cache")) warnings++;
}

CT_TEST(cache_dir_from_environment) {
    capex_cuda_cache c;
    char *old_dir = getenv("CAPEX_CACHE_DIR"), *old_xdg = getenv("XDG_CACHE_HOME"), *old_home = getenv("HOME");
    char sd[1024] = "", sx[1024] = "", sh[1024] = "";
    int had_d = old_dir != NULL, had_x = old_xdg != NULL, had_h = old_home != NULL;
    if (had_d) snprintf(sd, sizeof sd, "%s", old_dir);
    if (had_x) snprintf(sx, sizeof sx, "%s", old_xdg);
    if (had_h) snprintf(sh, sizeof sh, "%s", old_home);
    setenv("CAPEX_CACHE_DIR", "/tmp/a", 1);
    setenv("XDG_CACHE_HOME", "/tmp/x", 1);
    setenv("HOME", "/tmp/h", 1);
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(c.enabled && !strcmp(c.dir, "/tmp/a"), "CAPEX_CACHE_DIR first: %s", c.dir);
    setenv("CAPEX_CACHE_DIR", "", 1);
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(!c.enabled, "CAPEX_CACHE_DIR set but empty disables");
    unsetenv("CAPEX_CACHE_DIR");
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(c.enabled && !strcmp(c.dir, "/tmp/x/capex"), "XDG_CACHE_HOME/capex: %s", c.dir);
    setenv("XDG_CACHE_HOME", "relative/path", 1); /* XDG says: ignore relative paths */
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(c.enabled && !strcmp(c.dir, "/tmp/h/.cache/capex"), "HOME/.cache/capex: %s", c.dir);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "rel/home", 1); /* would follow the working directory */
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(!c.enabled, "relative HOME: disabled, not %s", c.dir);
    unsetenv("HOME");
    capex_cuda_cache_init(&c, NULL);
    CT_CHECK(!c.enabled, "no HOME: disabled");
    capex_cuda_cache_init(&c, "");
    CT_CHECK(!c.enabled, "explicit \"\" disables");
    capex_cuda_cache_init(&c, "/tmp/explicit");
    CT_CHECK(c.enabled && !strcmp(c.dir, "/tmp/explicit"), "explicit dir wins");
    /* a path that does not fit is never cut short into another directory */
    {
        char longdir[1100];
        memset(longdir, 'd', sizeof longdir);
        longdir[0] = '/';
        longdir[1023] = '\0'; /* 1023 bytes: fits exactly */
        capex_cuda_cache_init(&c, longdir);
        CT_CHECK(c.enabled && strlen(c.dir) == 1023, "1023-byte dir kept whole");
        longdir[1023] = 'd';
        longdir[sizeof longdir - 1] = '\0';
        warnings = 0;
        capex_set_log_callback(count_warn, NULL);
        capex_cuda_cache_init(&c, longdir);
        CT_CHECK(!c.enabled && !c.dir[0] && warnings == 1, "1099-byte dir: disabled with a warning (%d)", warnings);
        longdir[1020] = '\0'; /* + "/capex" no longer fits */
        setenv("XDG_CACHE_HOME", longdir, 1);
        capex_cuda_cache_init(&c, NULL);
        capex_set_log_callback(NULL, NULL);
        CT_CHECK(!c.enabled && warnings == 2, "XDG_CACHE_HOME + /capex over the limit: disabled");
        unsetenv("XDG_CACHE_HOME");
    }
    if (had_d) setenv("CAPEX_CACHE_DIR", sd, 1);
    if (had_x) setenv("XDG_CACHE_HOME", sx, 1);
    if (had_h) setenv("HOME", sh, 1);
}

/* ---- through the compiler (NVRTC) ------------------------------------------------ */

static void user_desc(capex_cuda_compile_desc *d, capex_cuda_cache *c, const char *const *opts) {
    capex_cuda_compile_desc_init(d);
    d->source = user_src;
    d->name = "user";
    d->options = opts;
    d->n_options = 1;
    d->device_cc = 90;
    d->cache = c;
}

/* A fresh cache directory, the user program's compile through it, and the
   path and key of its entry. */
static void user_cache_setup(char *dir, size_t dir_cap, capex_cuda_cache *c, capex_cuda_compile_desc *d,
                             const char *const *opts, char *path, size_t path_cap, unsigned char key[32]) {
    make_dir(dir, dir_cap);
    capex_cuda_cache_init(c, dir);
    user_desc(d, c, opts);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    capex__cuda_cache_path(c, key, path, path_cap);
}

CT_TEST(compile_through_cache_recompiles_bad_entries) {
    static const char *opts[] = {"-DVALUE=77"};
    char dir[64], path[1200];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image cold, warm, again;
    CT_NEED_NVRTC();
    user_cache_setup(dir, sizeof dir, &c, &d, opts, path, sizeof path, key);

    CT_CHECK(capex_cuda_compile(&d, &cold) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(!cold.from_cache && file_size(path) == (long)(96 + cold.size), "miss compiles and stores");
    CT_CHECK(capex_cuda_compile(&d, &warm) == CAPEX_OK && warm.from_cache, "second is a hit");
    CT_CHECK(warm.size == cold.size && !memcmp(warm.data, cold.data, cold.size), "hit returns the same bytes");
    CT_CHECK(warm.kind == CAPEX_CUDA_IMAGE_CUBIN && warm.arch == 90, "target kept");
    capex_cuda_image_free(&warm);

    /* corrupt, truncated, wrong-version entries: recompiled and overwritten */
    {
        static const long spots[] = {200, 8, -1};
        size_t i;
        for (i = 0; i < 3; i++) {
            if (spots[i] == -1) CT_CHECK(truncate(path, 150) == 0, "truncate");
            else poke(path, spots[i], 0x42);
            CT_CHECK(capex_cuda_compile(&d, &again) == CAPEX_OK && !again.from_cache, "damage %zu recompiled", i);
            CT_CHECK(again.size == cold.size && !memcmp(again.data, cold.data, cold.size), "same code");
            capex_cuda_image_free(&again);
            CT_CHECK(capex__cuda_cache_read(path, key, &again) == CAPEX_OK, "entry rewritten valid (%zu)", i);
            capex_cuda_image_free(&again);
        }
    }
    CT_CHECK(count_files(dir, ".capexjit") == 1 && count_files(dir, ".tmp") == 0, "one entry, no temp files");

    /* disabled cache: compiles, writes nothing */
    {
        capex_cuda_cache off;
        char dir2[64];
        make_dir(dir2, sizeof dir2);
        capex_cuda_cache_init(&off, dir2);
        off.enabled = 0;
        d.cache = &off;
        CT_CHECK(capex_cuda_compile(&d, &again) == CAPEX_OK && !again.from_cache, "uncached compile");
        capex_cuda_image_free(&again);
        CT_CHECK(count_files(dir2, "") == 0, "nothing written when disabled");
        rm_dir(dir2);
    }
    capex_cuda_image_free(&cold);
    rm_dir(dir);
}

/* The key covers source, name and options, not the files NVRTC reads: a quoted
   #include (found next to the program name) or an include/PCH option. Such
   compiles skip the disk cache, else an edited header runs the old kernel. */
static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}
CT_TEST(compiles_that_read_files_skip_the_disk_cache) {
    static const char *quoted = "#include \"capex_alpha.h\"\n"
                                "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = ALPHA; }\n";
    static const char *angled = "#  include <capex_alpha.h>\n"
                                "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = ALPHA; }\n";
    static const char *plain = "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = ALPHA; }\n";
    char dir[64], hdr_dir[64], hdr[200], name[200], inc[200], pre[240];
    const char *opts_i[1], *opts_pre[2], *opts_def[2] = {"-Dmy_include_pch=1", "--no-source-include"}; /* reads nothing */
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    capex_result r;
    int round;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    make_dir(hdr_dir, sizeof hdr_dir);
    CT_CHECK(dir[0] && hdr_dir[0], "temp dirs");
    snprintf(hdr, sizeof hdr, "%s/capex_alpha.h", hdr_dir);
    snprintf(name, sizeof name, "%s/user.cu", hdr_dir); /* quoted includes resolve next to it */
    snprintf(inc, sizeof inc, "-I%s", hdr_dir);
    snprintf(pre, sizeof pre, "--pre-include=%s", hdr);
    opts_i[0] = inc;
    opts_pre[0] = "-DUNUSED=1";
    opts_pre[1] = pre;
    capex_cuda_cache_init(&c, dir);
    for (round = 0; round < 3; round++) {
        capex_cuda_compile_desc_init(&d);
        d.device_cc = 90;
        d.cache = &c;
        if (round == 0) { d.source = quoted; d.name = name; }
        else if (round == 1) { d.source = angled; d.options = opts_i; d.n_options = 1; }
        else { d.source = plain; d.options = opts_pre; d.n_options = 2; }
        write_file(hdr, "#define ALPHA 3\n");
        r = capex_cuda_compile(&d, &img);
        CT_CHECK(r == CAPEX_OK && !img.from_cache, "round %d: first compile: %s", round, capex_last_error());
        capex_cuda_image_free(&img);
        CT_CHECK(count_files(dir, ".capexjit") == 0, "round %d: stored an entry keyed without the header", round);
        write_file(hdr, "#error capex_alpha.h changed\n");
        r = capex_cuda_compile(&d, &img);
        CT_CHECK(r == CAPEX_ERR_NVRTC && strstr(capex_last_error(), "capex_alpha.h changed"),
                 "round %d: the edited header was not read (%s, from_cache %d)", round, capex_result_string(r), img.from_cache);
        capex_cuda_image_free(&img);
    }
    /* a source without a file include keeps the cache (an angled include alone
       reads nothing: NVRTC has no search directories without -I) */
    capex_cuda_compile_desc_init(&d);
    d.device_cc = 90;
    d.cache = &c;
    d.options = opts_def;
    d.n_options = 2;
    d.source = "#define ALPHA 5 /* not a directive: #include \"x.h\" */\n"
               "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = ALPHA; }\n";
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    CT_CHECK(count_files(dir, ".capexjit") == 1, "a plain source is cached");
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache, "and hits: %s", capex_last_error());
    capex_cuda_image_free(&img);
    unlink(hdr);
    rm_dir(hdr_dir);
    rm_dir(dir);
}

/* In a fresh process whose NVRTC path points nowhere: a hit works, a miss fails. */
static void child_hit_without_nvrtc(const char *dir, child_result *res) {
    static const char *opts[] = {"-DVALUE=78"};
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    setenv("CAPEX_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    res->code = capex_cuda_compile(&d, &img);
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    res->value = res->code == CAPEX_OK && img.from_cache && !capex_cuda_nvrtc_is_loaded();
    capex_cuda_image_free(&img);
    d.device_cc = 89; /* not cached: needs NVRTC */
    if (capex_cuda_compile(&d, &img) != CAPEX_ERR_NO_NVRTC) res->value = 0;
}

CT_TEST(hit_needs_no_nvrtc) {
    static const char *opts[] = {"-DVALUE=78"};
    char dir[64];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    child_result r;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    r = run_child("hit", dir);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK, "hit in a process without NVRTC: %d %s", r.code, r.message);
    CT_CHECK(r.value, "came from the cache, NVRTC never loaded, a miss gives CAPEX_ERR_NO_NVRTC");
    rm_dir(dir);
}

/* Writers hammer one key with distinct payloads while a reader checks that every
   read is either "not yet there" or a complete valid entry. */
static void child_writer(const char *arg, child_result *res) {
    char dir[600];
    unsigned seed = 0;
    capex_cuda_cache c;
    capex_cuda_image img;
    unsigned char key[32];
    int i, failures = 0;
    sscanf(arg, "%599[^:]:%u", dir, &seed);
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key("concurrent", "p", NULL, 0, 90, key);
    fake_image(&img, 200000, CAPEX_CUDA_IMAGE_CUBIN, seed);
    img.nvrtc_version = (int)seed;
    for (i = 0; i < 100; i++)
        if (capex__cuda_cache_write(&c, key, &img) != CAPEX_OK) failures++;
    res->code = failures ? CAPEX_ERR_IO : CAPEX_OK;
    res->value = failures;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_image_free(&img);
}

static void child_reader(const char *dir, child_result *res) {
    capex_cuda_cache c;
    capex_cuda_image img;
    unsigned char key[32];
    char path[1200], done[700];
    int i, bad = 0, ok = 0;
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key("concurrent", "p", NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    snprintf(done, sizeof done, "%s/writers.done", dir);
    /* reads for as long as the writers run (the parent creates `done`) */
    for (i = 0; i < 200000 && access(done, F_OK) != 0; i++) {
        capex_result r = capex__cuda_cache_read(path, key, &img);
        if (r == CAPEX_OK) {
            ok++;
            if (img.size != 200000 || (img.nvrtc_version != 1 && img.nvrtc_version != 2)) bad++;
            capex_cuda_image_free(&img);
        } else if (r != CAPEX_ERR_NOT_FOUND) {
            bad++;
            snprintf(res->message, sizeof res->message, "%s", capex_last_error());
        }
    }
    res->code = bad ? CAPEX_ERR_FORMAT : CAPEX_OK;
    res->value = ok;
}

/* Runs a child function in a forked child (no NVRTC involved) writing its result to fd. */
static pid_t spawn(void (*fn)(const char *, child_result *), const char *arg, int *fd) {
    int fds[2];
    pid_t pid;
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        child_result r;
        memset(&r, 0, sizeof r);
        close(fds[0]);
        fn(arg, &r);
        if (write(fds[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    *fd = fds[0];
    return pid;
}
static child_result collect(pid_t pid, int fd) {
    child_result r;
    int status = 0;
    memset(&r, 0, sizeof r);
    if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r.code = -1001;
    close(fd);
    waitpid(pid, &status, 0);
    r.exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    return r;
}

CT_TEST(concurrent_writers_and_reader) {
    char dir[64], a1[200], a2[200], path[1200];
    int fd1, fd2, fd3;
    pid_t p1, p2, p3;
    child_result r1, r2, r3;
    capex_cuda_cache c;
    capex_cuda_image img;
    unsigned char key[32];
    make_dir(dir, sizeof dir);
    snprintf(a1, sizeof a1, "%s:1", dir);
    snprintf(a2, sizeof a2, "%s:2", dir);
    p3 = spawn(child_reader, dir, &fd3);
    p1 = spawn(child_writer, a1, &fd1);
    p2 = spawn(child_writer, a2, &fd2);
    CT_CHECK(p1 > 0 && p2 > 0 && p3 > 0, "fork");
    r1 = collect(p1, fd1);
    r2 = collect(p2, fd2);
    snprintf(a1, sizeof a1, "%s/writers.done", dir);
    { FILE *f = fopen(a1, "w"); if (f) fclose(f); }
    r3 = collect(p3, fd3);
    CT_CHECK(r1.exited_ok && r1.code == CAPEX_OK, "writer 1: %d failures: %s", r1.value, r1.message);
    CT_CHECK(r2.exited_ok && r2.code == CAPEX_OK, "writer 2: %d failures: %s", r2.value, r2.message);
    CT_CHECK(r3.exited_ok && r3.code == CAPEX_OK, "reader saw a partial entry: %s", r3.message);
    CT_CHECK(r3.value > 0, "the reader saw complete entries");
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key("concurrent", "p", NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    CT_CHECK(capex__cuda_cache_read(path, key, &img) == CAPEX_OK, "final entry valid: %s", capex_last_error());
    CT_CHECK(img.nvrtc_version == 1 || img.nvrtc_version == 2, "final entry is one writer's");
    capex_cuda_image_free(&img);
    CT_CHECK(count_files(dir, ".tmp") == 0 && count_files(dir, ".capexjit") == 1, "one entry, no temp files");
    rm_dir(dir);
}

/* Eight processes (the ranks of a node) compile the same source at once into
   one cache whose directories none of them has made yet (real NVRTC): each
   makes the path, compiles, writes and renames; none fails or warns. */
static int child_warnings;
static void count_child_warn(capex_log_level level, const char *msg, void *user) {
    (void)user;
    (void)msg;
    if (level == CAPEX_LOG_WARN) child_warnings++;
}
static void child_compile(const char *dir, child_result *res) {
    static const char *opts[] = {"-DVALUE=79"};
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    alarm(300); /* a hang guard: eight NVRTC compiles on two loaded cores, maybe under sanitizers */
    capex_set_log_callback(count_child_warn, NULL);
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    res->code = capex_cuda_compile(&d, &img);
    if (res->code == CAPEX_OK && child_warnings) res->code = CAPEX_ERR_IO;
    res->value = (int)img.size;
    snprintf(res->message, sizeof res->message, "%d warnings; %s", child_warnings, capex_last_error());
    capex_cuda_image_free(&img);
}

CT_TEST(concurrent_compiles) {
    static const char *opts[] = {"-DVALUE=79"};
    enum { N = 8 };
    char top[64], a[200], dir[200];
    int fd[N], i;
    pid_t p[N];
    child_result r[N];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    CT_NEED_NVRTC();
    make_dir(top, sizeof top);
    snprintf(dir, sizeof dir, "%s/a/b/cache", top);
    /* fork is safe here: NVRTC holds no threads or driver state */
    for (i = 0; i < N; i++) p[i] = spawn(child_compile, dir, &fd[i]);
    for (i = 0; i < N; i++) r[i] = collect(p[i], fd[i]);
    for (i = 0; i < N; i++)
        CT_CHECK(r[i].exited_ok && r[i].code == CAPEX_OK && r[i].value == r[0].value, "process %d: %d %s", i, r[i].code,
                 r[i].message);
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache && (int)img.size == r[0].value, "entry valid");
    capex_cuda_image_free(&img);
    CT_CHECK(count_files(dir, ".tmp") == 0 && count_files(dir, ".capexjit") == 1, "one entry, no temp files");
    rm_dir(dir);
    snprintf(a, sizeof a, "%s/a/b", top);
    rmdir(a);
    snprintf(a, sizeof a, "%s/a", top);
    rmdir(a);
    rm_dir(top);
}

/* ---- the per-entry compile lock ---------------------------------------------------
   Processes that miss one entry at once compile it once: the lock holder
   compiles and writes, the others wait and read. Counted with the NVRTC hook
   (each child reports its own compiles), never timed. */

static const char *lock_opts[] = {"-DVALUE=90"};
static const char *const *child_opts = lock_opts; /* what child_lock_compile compiles */
static int go_r = -1, go_w = -1; /* children spawned with them wait for the parent's close: all start at once */
static int lock_warnings;
static void count_lock_warn(capex_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == CAPEX_LOG_WARN && strstr(msg, "compiling here too")) lock_warnings++;
}

/* Compiles the lock tests' program through dir's cache. Reports the status,
   this process's NVRTC compiles (value) and "SIZE SHA-256 wWARNINGS" of the image. */
static void child_lock_compile(const char *dir, child_result *res) {
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    capex__sha256 s;
    unsigned char sum[32];
    char hx[65] = "", ch;
    alarm((unsigned)(2 * CT_HANG_GUARD_S)); /* a hang guard (and the end of a holder nobody killed) */
    nvrtc_compiles = 0;                     /* the parent's compiles are not ours */
    waits_reported = 0;
    capex_set_log_callback(count_lock_warn, NULL);
    if (go_r >= 0) {
        close(go_w);
        if (read(go_r, &ch, 1) < 0) _exit(4);
    }
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, child_opts);
    res->code = capex_cuda_compile(&d, &img);
    res->value = compiles_now();
    if (res->code == CAPEX_OK) {
        capex__sha256_init(&s);
        capex__sha256_update(&s, img.data, img.size);
        capex__sha256_final(&s, sum);
        hex(sum, hx);
        snprintf(res->message, sizeof res->message, "%lu %s w%d", (unsigned long)img.size, hx, lock_warnings);
    } else {
        snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    }
    capex_cuda_image_free(&img);
}

/* Reads n bytes from fd, or fewer when the writers are gone or after the hang guard. */
static int read_bytes(int fd, int n) {
    int got = 0;
    while (got < n) {
        struct pollfd pf;
        char b[16];
        ssize_t k;
        pf.fd = fd;
        pf.events = POLLIN;
        if (poll(&pf, 1, (int)(CT_HANG_GUARD_S * 1000)) != 1) break;
        k = read(fd, b, (size_t)(n - got) < sizeof b ? (size_t)(n - got) : sizeof b);
        if (k <= 0) break;
        got += (int)k;
    }
    return got;
}

static void lock_path(const char *dir, char *lock, size_t cap) {
    capex_cuda_cache c;
    unsigned char key[32];
    char path[1200];
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key(user_src, "user", lock_opts, 1, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    snprintf(lock, cap, "%s.lock", path);
}

/* The entry is there, valid, and read without NVRTC; no lock or temp file is left. */
static int entry_ok(const char *dir, const char *want_message, int *lock_files) {
    child_result r;
    memset(&r, 0, sizeof r);
    child_lock_compile(dir, &r);
    alarm(0);
    capex_set_log_callback(NULL, NULL);
    *lock_files = count_files(dir, ".lock") + count_files(dir, ".tmp");
    return r.code == CAPEX_OK && r.value == 0 && strchr(want_message, 'w') &&
           !strncmp(r.message, want_message, (size_t)(strrchr(want_message, 'w') - want_message)); /* the image, not the warnings */
}

/* Four ranks start at once on a cache directory none has made: exactly one
   runs NVRTC, all get the same image (without the lock: 4 compiles). */
CT_TEST(lock_ranks_compile_a_cold_entry_once) {
    enum { N = 4 };
    char top[64], dir[200];
    int fd[N], go[2], i, total = 0, left = -1;
    pid_t p[N];
    child_result r[N];
    CT_NEED_NVRTC();
    make_dir(top, sizeof top);
    snprintf(dir, sizeof dir, "%s/cache", top);
    CT_CHECK(pipe(go) == 0, "pipe");
    go_r = go[0], go_w = go[1];
    for (i = 0; i < N; i++) p[i] = spawn(child_lock_compile, dir, &fd[i]);
    go_r = go_w = -1;
    close(go[0]);
    close(go[1]); /* go */
    for (i = 0; i < N; i++) r[i] = collect(p[i], fd[i]);
    for (i = 0; i < N; i++) {
        CT_CHECK(r[i].exited_ok && r[i].code == CAPEX_OK && !strcmp(r[i].message, r[0].message),
                 "rank %d: %d %s (rank 0: %s)", i, r[i].code, r[i].message, r[0].message);
        total += r[i].value;
    }
    CT_CHECK(total == 1, "one NVRTC compile among %d ranks, got %d", N, total);
    CT_CHECK(strstr(r[0].message, " w0"), "no lock warning: %s", r[0].message);
    CT_CHECK(entry_ok(dir, r[0].message, &left) && left == 0, "entry valid, no lock or temp file left (%d)", left);
    rm_dir(dir);
    rm_dir(top);
}

/* The lock holder is killed (SIGKILL, while it compiles) with three ranks
   waiting for it: the kernel frees its lock, one of them compiles, the
   others read its entry. */
CT_TEST(lock_holder_killed_others_proceed) {
    enum { N = 3 };
    char dir[64];
    int hold[2], wt[2], fd[N], hfd, i, total = 0, held, waiting, left = -1;
    pid_t holder, p[N];
    child_result r[N];
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    CT_CHECK(pipe(hold) == 0 && pipe(wt) == 0, "pipe");
    hold_fd = hold[1];
    holder = spawn(child_lock_compile, dir, &hfd);
    hold_fd = -1;
    close(hold[1]);
    held = read_bytes(hold[0], 1);
    wait_fd = wt[1];
    for (i = 0; i < N; i++) p[i] = spawn(child_lock_compile, dir, &fd[i]);
    wait_fd = -1;
    close(wt[1]);
    waiting = held == 1 ? read_bytes(wt[0], N) : 0;
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    close(hfd);
    close(hold[0]);
    close(wt[0]);
    for (i = 0; i < N; i++) r[i] = collect(p[i], fd[i]);
    CT_CHECK(held == 1, "the holder reached NVRTC");
    CT_CHECK(waiting == N, "all %d ranks waited for the lock (%d did)", N, waiting);
    for (i = 0; i < N; i++) {
        CT_CHECK(r[i].exited_ok && r[i].code == CAPEX_OK && !strcmp(r[i].message, r[0].message),
                 "rank %d: %d %s (rank 0: %s)", i, r[i].code, r[i].message, r[0].message);
        total += r[i].value;
    }
    CT_CHECK(total == 1, "one NVRTC compile after the holder died, got %d", total);
    CT_CHECK(entry_ok(dir, r[0].message, &left) && left == 0, "entry valid, the dead holder's lock file gone (%d)", left);
    rm_dir(dir);
}

/* A source that does not compile, missed by three ranks at once: the holder's
   NVRTC fails and the two that waited for it return its error (status and
   message, NVRTC's log included) without compiling it in turn: one NVRTC run,
   not three. The outcome lives in the lock file the holder unlinks, so a
   process that comes later compiles again (a transient failure poisons no
   later run) and nothing is left in the directory. main compiled it 3 times. */
static const char *failing_opts[] = {"-DVALUE=no_such_identifier"};
CT_TEST(lock_waiters_take_the_holders_compile_error) {
    enum { N = 2 };
    char dir[64];
    int hold[2], go[2], wt[2], fd[N], hfd, i, total = 0, held, waiting, left;
    pid_t holder, p[N];
    child_result r[N], hr, later;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    CT_CHECK(pipe(hold) == 0 && pipe(go) == 0 && pipe(wt) == 0, "pipe");
    child_opts = failing_opts;
    hold_fd = hold[1], hold_go_r = go[0];
    holder = spawn(child_lock_compile, dir, &hfd);
    hold_fd = hold_go_r = -1;
    close(hold[1]);
    close(go[0]);
    held = read_bytes(hold[0], 1);
    wait_fd = wt[1];
    for (i = 0; i < N; i++) p[i] = spawn(child_lock_compile, dir, &fd[i]);
    wait_fd = -1;
    close(wt[1]);
    waiting = held == 1 ? read_bytes(wt[0], N) : 0;
    if (write(go[1], "g", 1) != 1) held = -1; /* the holder goes on: its compile fails */
    hr = collect(holder, hfd);
    for (i = 0; i < N; i++) r[i] = collect(p[i], fd[i]);
    close(go[1]);
    close(hold[0]);
    close(wt[0]);
    CT_CHECK(held == 1 && waiting == N, "the holder reached NVRTC (%d), %d of %d waited", held, waiting, N);
    CT_CHECK(hr.exited_ok && hr.code == CAPEX_ERR_NVRTC && hr.value == 1 && strstr(hr.message, "no_such_identifier"),
             "the holder's compile failed, with the log: %d, %d compiles, %s", hr.code, hr.value, hr.message);
    for (i = 0; i < N; i++) {
        CT_CHECK(r[i].exited_ok && r[i].code == CAPEX_ERR_NVRTC && !strcmp(r[i].message, hr.message),
                 "rank %d: %d %s (holder: %s)", i, r[i].code, r[i].message, hr.message);
        total += r[i].value;
    }
    CT_CHECK(total == 0, "the waiters took the holder's outcome (%d compiled it again)", total);
    left = count_files(dir, "");
    CT_CHECK(left == 0, "no lock, entry or marker left (%d files)", left);
    memset(&later, 0, sizeof later);
    child_lock_compile(dir, &later); /* a later process: compiles, fails again */
    alarm(0);
    capex_set_log_callback(NULL, NULL);
    child_opts = lock_opts;
    CT_CHECK(later.code == CAPEX_ERR_NVRTC && later.value == 1 && !strcmp(later.message, hr.message),
             "a later compile runs NVRTC again: %d, %d compiles", later.code, later.value);
    CT_CHECK(count_files(dir, "") == 0, "still nothing left");
    rm_dir(dir);
}

/* Compiles built-in part (int)arg's (default: the heaviest) through dir's cache, as a
   rank's precompile would, reporting its status and NVRTC compiles. */
static int held_part = -1;
static void child_part_compile(const char *dir, child_result *res) {
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex__cuda_unit_opts o;
    capex_cuda_image img;
    alarm((unsigned)(2 * CT_HANG_GUARD_S));
    nvrtc_compiles = 0;
    capex_cuda_cache_init(&c, dir);
    capex__cuda_unit_desc(held_part, 90, CAPEX__GO_META_SMALL, &c, &o, &d);
    res->code = capex__cuda_compile_ex(&d, 0, 1, &img);
    res->value = compiles_now();
    snprintf(res->message, sizeof res->message, "%s", res->code == CAPEX_OK ? "" : capex_last_error());
    capex_cuda_image_free(&img);
}

/* Two ranks precompile parts A (the heaviest) and B on a cold cache; while
   one holds A's entry, the other compiles B instead of waiting for A, then
   reads A from the cache: one NVRTC run per entry, and the first lock wait
   comes after B's compile (main waited for A first, with B not started:
   ranks convoyed behind each other's compiles). The holder is released at
   that first wait, so neither order hangs. */
CT_TEST(lock_precompile_takes_free_parts_first) {
    enum { NP = CAPEX__CUDA_N_PARTS };
    char dir[64];
    int hold[2], go[2], hfd, held, n0, nj, want[NP], left, i;
    pid_t holder;
    child_result hr;
    capex__cuda_pjob jobs[2];
    capex_cuda_cache c;
    CT_NEED_NVRTC();
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    make_dir(dir, sizeof dir);
    CT_CHECK(pipe(hold) == 0 && pipe(go) == 0, "pipe");
    held_part = capex__cuda_part_order[0];
    hold_fd = hold[1], hold_go_r = go[0];
    holder = spawn(child_part_compile, dir, &hfd);
    hold_fd = hold_go_r = -1;
    close(hold[1]);
    close(go[0]);
    held = read_bytes(hold[0], 1);
    for (i = 0; i < NP; i++) want[i] = i == capex__cuda_part_order[0] || i == capex__cuda_part_order[NP - 1];
    capex_cuda_cache_init(&c, dir);
    nj = capex__cuda_pool_jobs(jobs, want, &c);
    n0 = compiles_now();
    first_wait_compiles = -1;
    release_w = go[1];
    capex__cuda_pool_run(jobs, nj, 90, CAPEX__GO_META_SMALL, 1); /* one thread: the order is the pool's */
    if (release_w >= 0 && write(go[1], "g", 1) != 1) held = -1; /* never waited: release it anyway */
    release_w = -1;
    hr = collect(holder, hfd);
    close(go[1]);
    close(hold[0]);
    CT_CHECK(held == 1, "the holder reached NVRTC");
    CT_CHECK(hr.exited_ok && hr.code == CAPEX_OK && hr.value == 1, "the holder compiled A: %d, %d compiles, %s", hr.code,
             hr.value, hr.message);
    CT_CHECK(nj == 2 && jobs[0].part == capex__cuda_part_order[0], "jobs: %d, A first", nj);
    for (i = 0; i < nj; i++) CT_CHECK(jobs[i].r == CAPEX_OK && jobs[i].img.data, "part %d: %s", jobs[i].part, jobs[i].err);
    CT_CHECK(nj == 2 && jobs[0].img.from_cache && !jobs[1].img.from_cache, "A read from the holder's entry, B compiled");
    CT_CHECK(compiles_now() - n0 == 1, "one NVRTC run here (B), got %d", compiles_now() - n0);
    CT_CHECK(first_wait_compiles - n0 == 1, "B compiled before the first wait for A (%d compiles by then)",
             first_wait_compiles < 0 ? first_wait_compiles : first_wait_compiles - n0);
    for (i = 0; i < nj; i++) capex_cuda_image_free(&jobs[i].img);
    left = count_files(dir, ".lock") + count_files(dir, ".tmp");
    CT_CHECK(left == 0 && count_files(dir, ".capexjit") == 2, "two entries, no lock or temp file (%d)", left);
    rm_dir(dir);
}

/* A compile deferred while another process holds its entry keeps the lock
   file open: resumed after that holder is done and the file unlinked, it
   takes the holder's failure (a failing source: no NVRTC run here) or reads
   its entry, and leaves no descriptor behind. */
CT_TEST(lock_deferred_compile_keeps_the_holders_outcome) {
    const char *const *srcs[2];
    int k;
    srcs[0] = failing_opts;
    srcs[1] = lock_opts;
    CT_NEED_NVRTC();
    for (k = 0; k < 2; k++) {
        char dir[64];
        int hold[2], go[2], hfd, held, n0, defer = -1, deferred, left;
        pid_t holder;
        child_result hr;
        capex_cuda_cache c;
        capex_cuda_compile_desc d;
        capex_cuda_image img;
        capex_result r;
        make_dir(dir, sizeof dir);
        CT_CHECK(pipe(hold) == 0 && pipe(go) == 0, "pipe");
        child_opts = srcs[k];
        hold_fd = hold[1], hold_go_r = go[0];
        holder = spawn(child_lock_compile, dir, &hfd);
        hold_fd = hold_go_r = -1;
        close(hold[1]);
        close(go[0]);
        held = read_bytes(hold[0], 1);
        capex_cuda_cache_init(&c, dir);
        user_desc(&d, &c, srcs[k]);
        n0 = compiles_now();
        r = capex__cuda_compile_defer(&d, 0, 0, &defer, &img);
        deferred = r == CAPEX_OK && defer >= 0 && !img.data;
        if (write(go[1], "g", 1) != 1) held = -1;
        hr = collect(holder, hfd); /* done: its lock file unlinked */
        close(go[1]);
        close(hold[0]);
        child_opts = lock_opts;
        CT_CHECK(held == 1 && deferred, "source %d: deferred while held (%d, fd %d)", k, r, defer);
        CT_CHECK(count_files(dir, ".lock") == 0, "the holder's lock file is gone");
        r = capex__cuda_compile_defer(&d, 0, 0, &defer, &img);
        CT_CHECK(defer == -1, "the lock file closed");
        CT_CHECK(compiles_now() == n0, "source %d: no NVRTC run here (%d)", k, compiles_now() - n0);
        if (k == 0)
            CT_CHECK(r == CAPEX_ERR_NVRTC && hr.code == CAPEX_ERR_NVRTC && !strcmp(capex_last_error(), hr.message),
                     "the holder's error: %d %s (holder: %s)", r, capex_last_error(), hr.message);
        else
            CT_CHECK(r == CAPEX_OK && img.from_cache && hr.code == CAPEX_OK, "read the holder's entry: %d %s", r, capex_last_error());
        capex_cuda_image_free(&img);
        left = count_files(dir, ".lock") + count_files(dir, ".tmp");
        CT_CHECK(left == 0 && count_files(dir, ".capexjit") == k, "%d entries, no lock or temp file (%d)", k, left);
        capex_set_log_callback(NULL, NULL);
        rm_dir(dir);
    }
}

/* A failure record in a lock file that is still current (its holder died
   between writing it and unlinking the file): the next holder blanks it and
   compiles, so the rank that waits for that holder reads its entry instead of
   taking the dead one's failure. */
CT_TEST(lock_record_of_a_dead_holder_is_no_outcome) {
    char dir[64], lock[1300], head[8];
    unsigned char key[32];
    int hold[2], go[2], wt[2], fd, hfd, lfd, held, waiting, blanked;
    pid_t holder, p;
    child_result r, hr;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    lock_path(dir, lock, sizeof lock);
    capex__cuda_cache_key(user_src, "user", lock_opts, 1, 90, key);
    lfd = open(lock, O_RDWR | O_CREAT, 0600);
    CT_CHECK(lfd >= 0, "lock file: %s", strerror(errno));
    capex__cuda_lock_put_failure(lfd, key, CAPEX_ERR_NVRTC, "a planted failure");
    close(lfd);
    CT_CHECK(pipe(hold) == 0 && pipe(go) == 0 && pipe(wt) == 0, "pipe");
    hold_fd = hold[1], hold_go_r = go[0];
    holder = spawn(child_lock_compile, dir, &hfd);
    hold_fd = hold_go_r = -1;
    close(hold[1]);
    close(go[0]);
    held = read_bytes(hold[0], 1);
    lfd = open(lock, O_RDONLY);
    blanked = lfd >= 0 && read(lfd, head, 8) == 8 && memcmp(head, "CAPEXERR", 8) != 0;
    if (lfd >= 0) close(lfd);
    wait_fd = wt[1];
    p = spawn(child_lock_compile, dir, &fd);
    wait_fd = -1;
    close(wt[1]);
    waiting = held == 1 ? read_bytes(wt[0], 1) : 0;
    if (write(go[1], "g", 1) != 1) held = -1;
    hr = collect(holder, hfd);
    r = collect(p, fd);
    close(go[1]);
    close(hold[0]);
    close(wt[0]);
    CT_CHECK(held == 1 && waiting == 1, "the holder reached NVRTC (%d), the other waited (%d)", held, waiting);
    CT_CHECK(blanked, "the holder blanked the record it found");
    CT_CHECK(hr.exited_ok && hr.code == CAPEX_OK && hr.value == 1, "the holder compiled: %d %s", hr.code, hr.message);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK && r.value == 0 && !strcmp(r.message, hr.message),
             "the waiter read its entry: %d, %d compiles, %s", r.code, r.value, r.message);
    rm_dir(dir);
}

/* A holder that never finishes (stopped, stuck): a waiter gives up after the
   wait limit, compiles with one warning and writes the entry. The lock file
   the holder keeps survives a write's sweep while held, even when old; once
   the holder is dead an old one is swept. */
CT_TEST(lock_wait_limit_and_stale_lock_files) {
    char dir[64], lock[1300];
    int hold[2], hfd, fd, held, held_file_kept, stale_swept, ok, left = -1;
    pid_t holder, p;
    child_result r;
    capex_cuda_cache c;
    capex_cuda_image img;
    unsigned char key[32];
    struct stat st;
    struct utimbuf old;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    lock_path(dir, lock, sizeof lock);
    CT_CHECK(pipe(hold) == 0, "pipe");
    hold_fd = hold[1];
    holder = spawn(child_lock_compile, dir, &hfd);
    hold_fd = -1;
    close(hold[1]);
    held = read_bytes(hold[0], 1);
    lock_wait_s = 0.2; /* the wait the test expects to end; the holder is held until the waiter has returned */
    p = spawn(child_lock_compile, dir, &fd);
    lock_wait_s = 120.0;
    r = collect(p, fd);
    old.actime = old.modtime = time(NULL) - 7200;
    utime(lock, &old);
    capex_cuda_cache_init(&c, dir);
    fake_image(&img, 1000, CAPEX_CUDA_IMAGE_CUBIN, 5);
    capex__cuda_cache_key("other", "p", NULL, 0, 90, key);
    capex__cuda_cache_write(&c, key, &img); /* sweeps */
    held_file_kept = lstat(lock, &st) == 0 && S_ISREG(st.st_mode);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    close(hfd);
    close(hold[0]);
    capex__cuda_cache_write(&c, key, &img); /* sweeps again */
    stale_swept = lstat(lock, &st) != 0 && errno == ENOENT;
    capex_cuda_image_free(&img);
    CT_CHECK(held == 1, "the holder reached NVRTC");
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK && r.value == 1 && strstr(r.message, " w1"),
             "the waiter compiled after the limit, with one warning: %d, %d compiles, %s", r.code, r.value, r.message);
    CT_CHECK(held_file_kept, "a held lock file is not swept, however old");
    CT_CHECK(stale_swept, "an old lock file nobody holds is swept");
    ok = entry_ok(dir, r.message, &left);
    CT_CHECK(ok && left == 0, "the waiter's entry is read (%d files left)", left);
    rm_dir(dir);
}

/* The holder forks while it holds the lock (a data loader's workers, forked
   during a background compile): the child's copy of the fd keeps the lock on
   the file after the holder unlinked it. Waiters see the path no longer names
   it, and read the entry at once (they waited for the child before: the whole
   wait limit, then compiled). */
CT_TEST(lock_forked_copy_of_a_held_lock) {
    enum { N = 2 };
    char dir[64];
    int hold[2], go[2], rel[2], wt[2], fd[N], hfd, i, total = 0, held, waiting, left = -1;
    pid_t holder, p[N];
    child_result r[N], hr;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    CT_CHECK(pipe(hold) == 0 && pipe(go) == 0 && pipe(rel) == 0 && pipe(wt) == 0, "pipe");
    hold_fd = hold[1], fork_go_r = go[0], fork_rel_r = rel[0], fork_rel_w = rel[1];
    holder = spawn(child_lock_compile, dir, &hfd);
    hold_fd = fork_go_r = fork_rel_r = fork_rel_w = -1;
    close(hold[1]);
    close(go[0]);
    close(rel[0]);
    held = read_bytes(hold[0], 1);
    wait_fd = wt[1];
    for (i = 0; i < N; i++) p[i] = spawn(child_lock_compile, dir, &fd[i]);
    wait_fd = -1;
    close(wt[1]);
    waiting = held == 1 ? read_bytes(wt[0], N) : 0;
    if (write(go[1], "g", 1) != 1) held = -1; /* the holder goes on: compiles, writes, unlinks, exits */
    hr = collect(holder, hfd);
    for (i = 0; i < N; i++) r[i] = collect(p[i], fd[i]);
    close(rel[1]); /* the forked copy's end */
    close(go[1]);
    close(hold[0]);
    close(wt[0]);
    CT_CHECK(held == 1 && waiting == N, "the holder reached NVRTC (%d), %d of %d waited", held, waiting, N);
    CT_CHECK(hr.exited_ok && hr.code == CAPEX_OK && hr.value == 1, "the holder compiled: %d %s", hr.code, hr.message);
    for (i = 0; i < N; i++) {
        CT_CHECK(r[i].exited_ok && r[i].code == CAPEX_OK && !strcmp(r[i].message, hr.message),
                 "rank %d: %d %s (holder: %s)", i, r[i].code, r[i].message, hr.message);
        total += r[i].value;
    }
    CT_CHECK(total == 0, "the waiters read the holder's entry, without a wait-limit warning (%d compiled)", total);
    CT_CHECK(entry_ok(dir, hr.message, &left) && left == 0, "entry valid, no lock file left (%d)", left);
    rm_dir(dir);
}

/* Something other than a lock file of the user's at the lock path (a symlink,
   dangling or to a file of the user's; a directory; a FIFO; a hard-linked,
   a group/other-writable or another user's file) is neither followed nor
   used nor removed: the compile runs without the lock, silently, and writes
   the entry. A read-only cache directory (not for root) likewise. */
CT_TEST(lock_path_not_a_plain_file_of_ours) {
    int v;
    for (v = 0; v < 8; v++) {
        char dir[64], lock[1300], other[1300], probe[64];
        struct stat before, after, ost;
        capex_cuda_cache c;
        capex_cuda_compile_desc d;
        capex_cuda_image img;
        capex_result r;
        int n0, compiled, kept, other_kept = 1, made = 0, hit;
        FILE *f;
        make_dir(dir, sizeof dir);
        lock_path(dir, lock, sizeof lock);
        snprintf(other, sizeof other, "%s/other", dir);
        if (v == 1 || v == 4) { /* a file of the user's, with a byte in it */
            f = fopen(other, "w");
            made = f && fputc('x', f) != EOF;
            if (f) fclose(f);
        }
        switch (v) {
        case 0: made = symlink(other, lock) == 0; break; /* dangling: O_CREAT would create other */
        case 1: made = made && symlink(other, lock) == 0; break;
        case 2: made = mkdir(lock, 0700) == 0; break;
        case 3: made = mkfifo(lock, 0600) == 0; break;
        case 4: made = made && link(other, lock) == 0; break;
        case 5: made = (f = fopen(lock, "w")) != NULL && (fclose(f), chmod(lock, 0666) == 0); break;
        case 6:
            if (geteuid() != 0) { rm_dir(dir); continue; } /* only root gives a file away */
            made = (f = fopen(lock, "w")) != NULL && (fclose(f), chown(lock, 65534, 65534) == 0);
            break;
        default:
            if (geteuid() == 0) { rm_dir(dir); continue; } /* root writes anyway */
            made = chmod(dir, 0500) == 0;
        }
        snprintf(probe, sizeof probe, "case %d", v);
        CT_CHECK(made, "%s: planting failed: %s", probe, strerror(errno));
        if (v < 7) lstat(lock, &before);
        capex_cuda_cache_init(&c, dir);
        user_desc(&d, &c, lock_opts);
        warnings = 0;
        capex_set_log_callback(count_warn, NULL);
        n0 = compiles_now();
        r = capex_cuda_compile(&d, &img);
        capex_set_log_callback(NULL, NULL);
        compiled = compiles_now() - n0;
        CT_CHECK(r == CAPEX_OK && !img.from_cache && img.size > 0, "%s: %d %s", probe, r, capex_last_error());
        capex_cuda_image_free(&img);
        if (v == 7) {
            chmod(dir, 0700);
            CT_CHECK(compiled == 1 && warnings == 1 && count_files(dir, ".lock") == 0,
                     "read-only dir: compiled (%d), the write's one warning (%d), no lock file", compiled, warnings);
            rm_dir(dir);
            continue;
        }
        kept = lstat(lock, &after) == 0 && after.st_ino == before.st_ino && after.st_mode == before.st_mode;
        if (v == 0) other_kept = lstat(other, &ost) != 0; /* not created through the link */
        if (v == 1 || v == 4) other_kept = stat(other, &ost) == 0 && ost.st_size == 1;
        hit = capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache;
        capex_cuda_image_free(&img);
        CT_CHECK(compiled == 1 && warnings == 0, "%s: compiled without the lock, silently (%d, %d warnings)", probe, compiled, warnings);
        CT_CHECK(kept && other_kept, "%s: the planted file left as it was (%d %d)", probe, kept, other_kept);
        CT_CHECK(hit, "%s: the entry was written", probe);
        if (v == 2) rmdir(lock);
        rm_dir(dir);
    }
}

/* Two threads of one process compiling one entry at once: flock is per open
   file, each compile opens its own, so one waits for the other; no deadlock,
   one NVRTC compile. */
typedef struct lock_thread { capex_cuda_cache c; capex_cuda_image img; capex_result r; } lock_thread;
static void *lock_thread_compile(void *arg) {
    lock_thread *t = (lock_thread *)arg;
    capex_cuda_compile_desc d;
    user_desc(&d, &t->c, lock_opts);
    t->r = capex_cuda_compile(&d, &t->img);
    return NULL;
}
CT_TEST(lock_threads_of_one_process) {
    char dir[64];
    lock_thread t[2];
    pthread_t th;
    int n0, started, same, left;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    capex_cuda_cache_init(&t[0].c, dir);
    capex_cuda_cache_init(&t[1].c, dir); /* one each: the warn-once flag is not thread-safe */
    n0 = compiles_now();
    started = pthread_create(&th, NULL, lock_thread_compile, &t[1]) == 0;
    lock_thread_compile(&t[0]);
    if (started) pthread_join(th, NULL);
    CT_CHECK(started, "pthread_create");
    same = t[0].r == CAPEX_OK && t[1].r == CAPEX_OK && t[0].img.size == t[1].img.size &&
           !memcmp(t[0].img.data, t[1].img.data, t[0].img.size);
    capex_cuda_image_free(&t[0].img);
    capex_cuda_image_free(&t[1].img);
    CT_CHECK(same, "both compiled, the same image: %d %d", t[0].r, t[1].r);
    CT_CHECK(compiles_now() - n0 == 1, "one NVRTC compile for two threads, got %d", compiles_now() - n0);
    left = count_files(dir, ".lock") + count_files(dir, ".tmp");
    CT_CHECK(left == 0 && count_files(dir, ".capexjit") == 1, "one entry, no lock or temp file (%d)", left);
    rm_dir(dir);
}

/* A write that fails part way (a full disk; here the file-size limit with
   SIGXFSZ ignored, which works for root too) leaves no temp file and the old
   entry as it was, and the compile works, uncached, with one warning. */
static void child_compile_size_limited(const char *dir, child_result *res) {
    static const char *opts[] = {"-DVALUE=88"};
    struct rlimit lim;
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    int i;
    alarm(120); /* a hang guard */
    signal(SIGXFSZ, SIG_IGN);
    lim.rlim_cur = lim.rlim_max = 200; /* the header and part of the image */
    setrlimit(RLIMIT_FSIZE, &lim);
    capex_set_log_callback(count_child_warn, NULL);
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    for (i = 0; i < 2; i++) {
        res->code = capex_cuda_compile(&d, &img);
        if (res->code != CAPEX_OK || img.from_cache || !img.size) break;
        capex_cuda_image_free(&img);
    }
    capex_cuda_image_free(&img);
    res->value = child_warnings;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

CT_TEST(write_that_fails_part_way) {
    static const char *opts[] = {"-DVALUE=88"};
    char dir[64], path[1200];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_image old, back;
    child_result r;
    int fd;
    pid_t pid;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    fake_image(&old, 1000, CAPEX_CUDA_IMAGE_CUBIN, 3);
    CT_CHECK(capex__cuda_cache_write(&c, key, &old) == CAPEX_OK, "%s", capex_last_error());
    poke(path, 500, 0x10); /* damaged: the compile recompiles and tries to write over it */
    pid = spawn(child_compile_size_limited, dir, &fd);
    r = collect(pid, fd);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK, "compiles with a failing write: exited %d, %d %s", r.exited_ok, r.code, r.message);
    CT_CHECK(r.value == 1, "warned once (%d)", r.value);
    CT_CHECK(count_files(dir, ".tmp") == 0 && file_size(path) == 96 + 1000, "no temp file, the old entry in place");
    poke(path, 500, 0x10);
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_OK && back.size == 1000, "the old entry unchanged");
    capex_cuda_image_free(&back);
    capex_cuda_image_free(&old);
    rm_dir(dir);
}


CT_TEST(unwritable_dir_warns_once) {
    static const char *opts[] = {"-DVALUE=80"};
    char dir[64], blocked[200];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    FILE *f;
    int i;
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    /* a directory below a regular file cannot be created, even by root */
    snprintf(blocked, sizeof blocked, "%s/file", dir);
    f = fopen(blocked, "w");
    CT_CHECK(f != NULL, "create blocker");
    fclose(f);
    snprintf(blocked, sizeof blocked, "%s/file/cache", dir);
    capex_cuda_cache_init(&c, blocked);
    user_desc(&d, &c, opts);
    warnings = 0;
    capex_set_log_callback(count_warn, NULL);
    for (i = 0; i < 2; i++) {
        capex_result r = capex_cuda_compile(&d, &img);
        if (r != CAPEX_OK) capex_set_log_callback(NULL, NULL);
        CT_CHECK(r == CAPEX_OK && !img.from_cache && img.size > 0, "compile %d still works: %s", i, capex_last_error());
        capex_cuda_image_free(&img);
    }
    capex_set_log_callback(NULL, NULL);
    CT_CHECK(warnings == 1 && c.warned, "warned once, got %d", warnings);
    rm_dir(dir);
}

static char info_seen[1024];
static void keep_info(capex_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == CAPEX_LOG_INFO) snprintf(info_seen, sizeof info_seen, "%s", msg);
}

/* An entry that exists but cannot be opened is reported as such (not as a miss)
   and recompiled over; a write removes temp files a killed writer left long ago. */
CT_TEST(unreadable_entry_and_stale_temp_files) {
    static const char *opts[] = {"-DVALUE=81"}, *opts2[] = {"-DVALUE=82"};
    char dir[64], path[1200], stale[1300], fresh[1300];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    struct timeval old_times[2];
    FILE *f;
    CT_NEED_NVRTC();
    user_cache_setup(dir, sizeof dir, &c, &d, opts, path, sizeof path, key);
    CT_CHECK(symlink(path, path) == 0, "a symlink loop in place of the entry");
    info_seen[0] = '\0';
    capex_set_log_level(CAPEX_LOG_INFO);
    capex_set_log_callback(keep_info, NULL);
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "recompiled: %s", capex_last_error());
    capex_set_log_callback(NULL, NULL);
    capex_set_log_level(CAPEX_LOG_WARN);
    capex_cuda_image_free(&img);
    CT_CHECK(strstr(info_seen, "cannot read the cache entry") && strstr(info_seen, path), "reported: %s", info_seen);
    CT_CHECK(capex__cuda_cache_read(path, key, &img) == CAPEX_OK, "entry written over the loop: %s", capex_last_error());
    capex_cuda_image_free(&img);

    snprintf(stale, sizeof stale, "%s.%ld.1.0.tmp", path, 99999L);
    snprintf(fresh, sizeof fresh, "%s.%ld.2.0.tmp", path, 99999L);
    f = fopen(stale, "w");
    if (f) fclose(f);
    f = fopen(fresh, "w");
    if (f) fclose(f);
    old_times[0].tv_sec = old_times[1].tv_sec = time(NULL) - 7200;
    old_times[0].tv_usec = old_times[1].tv_usec = 0;
    CT_CHECK(utimes(stale, old_times) == 0, "age the stale temp file");
    user_desc(&d, &c, opts2); /* a miss: compile and write */
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    CT_CHECK(access(stale, F_OK) != 0, "a 2-hour-old temp file is removed");
    CT_CHECK(access(fresh, F_OK) == 0, "a fresh one (a writer at work) is kept");
    rm_dir(dir);
}

/* ---- entries that are not plain files, or claim too much ------------------------ */

/* Reads the entry of arg ("dir") in a forked child under a deadline: a read
   that blocks (a FIFO opened by fopen) is killed by the alarm instead of
   hanging the test. */
static void child_read_entry(const char *dir, child_result *res) {
    capex_cuda_cache c;
    capex_cuda_image img;
    unsigned char key[32];
    char path[1200];
    alarm(60); /* a hang guard: a plain read takes milliseconds */
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key(user_src, "p", NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    res->code = capex__cuda_cache_read(path, key, &img);
    res->value = img.data != NULL;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_image_free(&img);
}

/* The user program's compile through arg's cache, in a forked child under a
   deadline; value: 1 when it came from the cache. */
static void child_compile_user(const char *dir, child_result *res) {
    static const char *opts[] = {"-DVALUE=83"};
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    alarm(120); /* a hang guard: NVRTC under sanitizers on a loaded machine is slow */
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, opts);
    res->code = capex_cuda_compile(&d, &img);
    res->value = img.from_cache;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_image_free(&img);
}

/* A FIFO, a directory or a symlink (even to a valid entry) at an entry's path is
   refused at once, never blocking and never followed, and a compile through
   the cache replaces it with a real entry. */
CT_TEST(entry_that_is_not_a_regular_file) {
    static const char *opts[] = {"-DVALUE=83"};
    char dir[64], other_dir[64], path[1200], other_path[1200];
    unsigned char key[32];
    capex_cuda_cache c, other;
    capex_cuda_image img, back;
    child_result r;
    struct stat st;
    int fd;
    pid_t pid;
    make_dir(dir, sizeof dir);
    make_dir(other_dir, sizeof other_dir);
    capex_cuda_cache_init(&c, dir);
    capex_cuda_cache_init(&other, other_dir);
    capex__cuda_cache_key(user_src, "p", NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    capex__cuda_cache_path(&other, key, other_path, sizeof other_path);

    CT_CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    pid = spawn(child_read_entry, dir, &fd);
    r = collect(pid, fd);
    CT_CHECK(r.exited_ok, "reading a FIFO entry did not return within 20 s (it blocks)");
    CT_CHECK(r.code == CAPEX_ERR_FORMAT && strstr(r.message, "not a regular file") && !r.value, "FIFO: %d %s", r.code,
             r.message);
    unlink(path);

    CT_CHECK(mkdir(path, 0700) == 0, "mkdir");
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_FORMAT && !back.data, "directory: %s", capex_last_error());
    rmdir(path);

    /* a valid entry of this very key elsewhere, linked in */
    fake_image(&img, 4000, CAPEX_CUDA_IMAGE_CUBIN, 5);
    CT_CHECK(capex__cuda_cache_write(&other, key, &img) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex__cuda_cache_read(other_path, key, &back) == CAPEX_OK, "the target itself is valid");
    capex_cuda_image_free(&back);
    CT_CHECK(symlink(other_path, path) == 0, "symlink");
    CT_CHECK(capex__cuda_cache_read(path, key, &back) != CAPEX_OK && !back.data, "symlink to a valid entry followed");
    CT_CHECK(back.data == NULL && strstr(capex_last_error(), path), "refused: %s", capex_last_error());
    capex_cuda_image_free(&back);
    unlink(path);

    /* through the compiler: a FIFO and a symlink are recompiled over */
    CT_NEED_NVRTC();
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    CT_CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    pid = spawn(child_compile_user, dir, &fd);
    r = collect(pid, fd);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK && !r.value, "compile over a FIFO: exited %d, %d %s", r.exited_ok, r.code,
             r.message);
    CT_CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the FIFO was replaced by an entry");
    capex__cuda_cache_path(&other, key, other_path, sizeof other_path);
    CT_CHECK(capex__cuda_cache_write(&other, key, &img) == CAPEX_OK, "%s", capex_last_error());
    unlink(path);
    CT_CHECK(symlink(other_path, path) == 0, "symlink");
    pid = spawn(child_compile_user, dir, &fd);
    r = collect(pid, fd);
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK && !r.value, "compile over a symlink: %d %s", r.code, r.message);
    CT_CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the symlink was replaced by an entry");
    CT_CHECK(capex__cuda_cache_read(other_path, key, &back) == CAPEX_OK && back.size == 4000, "its target is untouched");
    capex_cuda_image_free(&back);
    capex_cuda_image_free(&img);
    rm_dir(dir);
    rm_dir(other_dir);
}

/* A header claiming 1 GiB is refused before anything of that size is
   allocated or read: in a small file (the size check), and in a sparse file
   that really is that long (over the payload cap). */
CT_TEST(entry_claiming_a_huge_payload) {
    char dir[64], path[1200];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_image img, back;
    capex_result r;
    make_dir(dir, sizeof dir);
    capex_cuda_cache_init(&c, dir);
    capex__cuda_cache_key(user_src, "p", NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    fake_image(&img, 1000, CAPEX_CUDA_IMAGE_CUBIN, 9);
    CT_CHECK(capex__cuda_cache_write(&c, key, &img) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    { /* the size field (offset 24) claims 1 GiB */
        FILE *f = fopen(path, "r+b");
        unsigned char size[8];
        capex__put_u64(size, (uint64_t)1 << 30);
        CT_CHECK(f && fseek(f, 24, SEEK_SET) == 0 && fwrite(size, 1, 8, f) == 8, "patch the header");
        if (f) fclose(f);
    }
    biggest_alloc = 0;
    tracking_allocs = 1;
    r = capex__cuda_cache_read(path, key, &back);
    tracking_allocs = 0;
    CT_CHECK(r == CAPEX_ERR_FORMAT && !back.data, "small file: %s", capex_last_error());
    CT_CHECK(biggest_alloc < 65536, "small file: allocated %zu bytes", biggest_alloc);
    CT_CHECK(truncate(path, 96 + ((off_t)1 << 30)) == 0, "sparse 1 GiB file");
    biggest_alloc = 0;
    tracking_allocs = 1;
    r = capex__cuda_cache_read(path, key, &back);
    tracking_allocs = 0;
    capex_cuda_image_free(&back);
    CT_CHECK(r == CAPEX_ERR_FORMAT && strstr(capex_last_error(), "bad kind or size"), "sparse file: %s (%s)",
             capex_result_string(r), capex_last_error());
    CT_CHECK(biggest_alloc < 65536, "sparse file: allocated %zu bytes", biggest_alloc);
    rm_dir(dir);
}

/* ---- the trust rule ------------------------------------------------------------- */

static char warn_seen[1024];
static void keep_warn(capex_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == CAPEX_LOG_WARN && strstr(msg, "cache")) {
        warnings++;
        snprintf(warn_seen, sizeof warn_seen, "%s", msg);
    }
}

static int mode_of(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* Compiles d twice with warnings counted; 1 when both worked and neither came
   from the cache. */
static int compile_uncached_twice(capex_cuda_compile_desc *d) {
    capex_cuda_image img;
    int i, ok = 1;
    warnings = 0;
    warn_seen[0] = '\0';
    capex_set_log_callback(keep_warn, NULL);
    for (i = 0; i < 2; i++) {
        ok &= capex_cuda_compile(d, &img) == CAPEX_OK && !img.from_cache && img.size > 0;
        capex_cuda_image_free(&img);
    }
    capex_set_log_callback(NULL, NULL);
    return ok;
}

/* Entries are used only from a directory the user owns that others cannot
   write (unless sticky), and only when the entry is the user's and writable
   by no one else. Otherwise the directory warns once and runs uncached (no
   read, no write), and an entry is recompiled over. New directories are
   0700, entries 0600. */
CT_TEST(cache_trust_rule) {
    static const char *opts[] = {"-DVALUE=84"};
    char top[64], dir[200], cdir[200], path[1200];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img, back;
    CT_NEED_NVRTC();
    make_dir(top, sizeof top);
    snprintf(cdir, sizeof cdir, "%s/made/cache", top);
    capex_cuda_cache_init(&c, cdir);
    user_desc(&d, &c, opts);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);

    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    snprintf(dir, sizeof dir, "%s/made", top);
    CT_CHECK((mode_of(dir) & 077) == 0 && (mode_of(c.dir) & 077) == 0, "created directories are private: %o %o",
             mode_of(dir), mode_of(c.dir));
    CT_CHECK(mode_of(path) == 0600, "entry mode %o", mode_of(path));
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache, "a hit in the user's own directory");
    capex_cuda_image_free(&img);

    /* world-writable: warned once, the valid entry is not read, nothing is written */
    CT_CHECK(chmod(c.dir, 0777) == 0, "chmod");
    CT_CHECK(compile_uncached_twice(&d), "compiles uncached in a world-writable directory: %s", capex_last_error());
    CT_CHECK(warnings == 1 && strstr(warn_seen, "writable by others") && strstr(warn_seen, c.dir), "warned once (%d): %s",
             warnings, warn_seen);
    unlink(path);
    CT_CHECK(compile_uncached_twice(&d) && warnings == 0, "still uncached, no second warning (%d)", warnings);
    CT_CHECK(count_files(c.dir, "") == 0, "nothing written in a world-writable directory");
    /* a fresh cache struct warns again, for group write too */
    CT_CHECK(chmod(c.dir, 0770) == 0, "chmod");
    capex_cuda_cache_init(&c, cdir);
    CT_CHECK(compile_uncached_twice(&d) && warnings == 1, "group-writable: uncached, warned (%d)", warnings);
    CT_CHECK(count_files(c.dir, "") == 0, "nothing written in a group-writable directory");
    /* the built-in parts on threads: one warning, no entries */
    {
        capex_cuda_image parts[CAPEX__CUDA_N_PARTS];
        int p;
        capex_cuda_cache_init(&c, cdir);
        warnings = 0;
        capex_set_log_callback(keep_warn, NULL);
        CT_CHECK(capex_cuda_builtin_compile_parts(90, &c, 2, parts) == CAPEX_OK, "%s", capex_last_error());
        capex_set_log_callback(NULL, NULL);
        for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) capex_cuda_image_free(&parts[p]);
        CT_CHECK(warnings == 1 && strstr(warn_seen, "writable by others"), "parts: one warning (%d): %s", warnings, warn_seen);
        CT_CHECK(count_files(c.dir, "") == 0, "no part entries written");
    }
    /* sticky and the user's: trusted (others may add files, never replace the user's) */
    CT_CHECK(chmod(c.dir, 01777) == 0, "chmod");
    capex_cuda_cache_init(&c, cdir);
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache && mode_of(path) == 0600, "sticky: written");
    capex_cuda_image_free(&img);
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache, "sticky: a hit");
    capex_cuda_image_free(&img);
    CT_CHECK(chmod(c.dir, 0700) == 0, "chmod");

    /* an entry writable by others is not trusted: refused, recompiled over */
    CT_CHECK(chmod(path, 0666) == 0, "chmod entry");
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_CONFIG && !back.data, "0666 entry: %s", capex_last_error());
    CT_CHECK(strstr(capex_last_error(), "writable by others"), "%s", capex_last_error());
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "0666 entry recompiled");
    capex_cuda_image_free(&img);
    CT_CHECK(mode_of(path) == 0600 && capex__cuda_cache_read(path, key, &back) == CAPEX_OK, "rewritten 0600");
    capex_cuda_image_free(&back);

    /* another user's entry (root in CI may chown; elsewhere this part skips) */
    if (chown(path, 12345, (gid_t)-1) != 0) {
        rm_dir(c.dir);
        rm_dir(dir);
        rm_dir(top);
        CT_SKIP("chown needs root: %s", strerror(errno));
    }
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_CONFIG && !back.data, "foreign entry: %s", capex_last_error());
    CT_CHECK(strstr(capex_last_error(), "uid 12345"), "%s", capex_last_error());
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "foreign entry recompiled");
    capex_cuda_image_free(&img);
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_OK, "rewritten as the user's: %s", capex_last_error());
    capex_cuda_image_free(&back);
    /* another user's directory: warned, uncached */
    CT_CHECK(chown(c.dir, 12345, (gid_t)-1) == 0, "chown dir");
    capex_cuda_cache_init(&c, cdir);
    CT_CHECK(compile_uncached_twice(&d) && warnings == 1 && strstr(warn_seen, "owned by uid 12345"), "foreign dir (%d): %s",
             warnings, warn_seen);
    rm_dir(c.dir);
    rm_dir(dir);
    rm_dir(top);
}

/* A file of the user's whose bytes someone else chose (a git clone, an unpacked
   archive, a download), made a valid entry for a public key (the built-in parts'
   keys are fixed). In a sticky shared cache directory another user may hard-link
   it under the entry's name (the kernel allows it with fs.protected_hardlinks=0),
   and owner and mode then say "the user's": an entry with more than one link is
   refused and recompiled over (the rename leaves it one link). main ran it. */
CT_TEST(hard_linked_entry_is_not_trusted) {
    static const char *opts[] = {"-DVALUE=85"};
    char dir[64], other_dir[64], path[1200], planted[1200];
    unsigned char key[32];
    capex_cuda_cache c, other;
    capex_cuda_compile_desc d;
    capex_cuda_image crafted, back;
    struct stat st;
    make_dir(dir, sizeof dir);
    make_dir(other_dir, sizeof other_dir);
    CT_CHECK(chmod(dir, 01777) == 0, "a sticky shared directory (trusted: the user's)");
    capex_cuda_cache_init(&c, dir);
    capex_cuda_cache_init(&other, other_dir);
    user_desc(&d, &c, opts);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    capex__cuda_cache_path(&other, key, planted, sizeof planted);
    fake_image(&crafted, 3000, CAPEX_CUDA_IMAGE_CUBIN, 7);
    CT_CHECK(capex__cuda_cache_write(&other, key, &crafted) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(link(planted, path) == 0, "link: %s", strerror(errno));
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_ERR_CONFIG && !back.data, "a hard-linked entry was read: %s",
             back.data ? "the planted image" : capex_last_error());
    CT_CHECK(strstr(capex_last_error(), "links"), "%s", capex_last_error());
    capex_cuda_image_free(&back);
    CT_NEED_NVRTC();
    CT_CHECK(capex_cuda_compile(&d, &back) == CAPEX_OK && !back.from_cache, "recompiled: %s", capex_last_error());
    CT_CHECK(back.size != crafted.size || memcmp(back.data, crafted.data, crafted.size), "the planted image ran");
    capex_cuda_image_free(&back);
    CT_CHECK(lstat(path, &st) == 0 && st.st_nlink == 1 && mode_of(path) == 0600, "replaced by the user's own entry");
    CT_CHECK(capex_cuda_compile(&d, &back) == CAPEX_OK && back.from_cache, "then a hit");
    capex_cuda_image_free(&back);
    CT_CHECK(capex__cuda_cache_read(planted, key, &back) == CAPEX_OK && back.size == 3000, "the linked file is untouched");
    capex_cuda_image_free(&back);
    capex_cuda_image_free(&crafted);
    rm_dir(dir);
    rm_dir(other_dir);
}

/* CAPEX_CACHE_DIR=/tmp/capex-$USER (a common per-user cache in a shared
   directory) that another user made first as a symlink to a directory of the
   user's holding planted entries (see above): directory and entries pass every
   owner and mode check, so a symlink on the path must itself be the user's (or
   root's), as the kernel's fs.protected_symlinks has it. Needs root (lchown).
   main followed it and ran the planted image. */
CT_TEST(cache_dir_through_another_users_symlink) {
    static const char *opts[] = {"-DVALUE=86"};
    char top[64], victim[64], link_dir[200], deep[300], path[1200];
    unsigned char key[32];
    capex_cuda_cache c, v;
    capex_cuda_compile_desc d;
    capex_cuda_image crafted, back;
    make_dir(top, sizeof top);
    make_dir(victim, sizeof victim);
    CT_CHECK(chmod(top, 01777) == 0, "a /tmp-like directory");
    capex_cuda_cache_init(&v, victim);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    fake_image(&crafted, 3000, CAPEX_CUDA_IMAGE_CUBIN, 11);
    CT_CHECK(capex__cuda_cache_write(&v, key, &crafted) == CAPEX_OK, "%s", capex_last_error());
    snprintf(link_dir, sizeof link_dir, "%s/capex-user", top);
    CT_CHECK(symlink(victim, link_dir) == 0, "symlink");
    capex_cuda_cache_init(&c, link_dir);
    user_desc(&d, &c, opts);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_OK, "the user's own symlink is followed: %s", capex_last_error());
    capex_cuda_image_free(&back);
    if (lchown(link_dir, 12345, 12345) != 0) {
        unlink(link_dir);
        rm_dir(victim);
        rm_dir(top);
        capex_cuda_image_free(&crafted);
        CT_SKIP("lchown needs root: %s", strerror(errno));
    }
    CT_CHECK(capex__cuda_cache_dir_check(c.dir) == CAPEX_ERR_CONFIG, "another user's symlink trusted");
    CT_CHECK(strstr(capex_last_error(), "symlink") && strstr(capex_last_error(), "12345"), "%s", capex_last_error());
    /* deeper on the path too: <link>/sub */
    CT_CHECK(mkdir(strcat(strcpy(deep, victim), "/sub"), 0700) == 0, "mkdir");
    snprintf(deep, sizeof deep, "%s/sub", link_dir);
    CT_CHECK(capex__cuda_cache_dir_check(deep) == CAPEX_ERR_CONFIG, "a symlink above the directory: %s", capex_last_error());
    CT_NEED_NVRTC();
    CT_CHECK(compile_uncached_twice(&d), "compiled, not read: %s", capex_last_error());
    CT_CHECK(warnings == 1 && strstr(warn_seen, "symlink"), "warned once (%d): %s", warnings, warn_seen);
    CT_CHECK(count_files(victim, ".capexjit") == 1 && count_files(victim, ".tmp") == 0, "nothing written through it");
    /* root's symlinks (an admin's /scratch -> /lustre/scratch) are followed */
    CT_CHECK(lchown(link_dir, 0, 0) == 0, "lchown");
    CT_CHECK(capex__cuda_cache_dir_check(c.dir) == CAPEX_OK, "root's symlink: %s", capex_last_error());
    unlink(link_dir);
    rmdir(strcat(strcpy(deep, victim), "/sub"));
    rm_dir(victim);
    rm_dir(top);
    capex_cuda_image_free(&crafted);
}

/* A cache directory below a world-writable directory without the sticky bit:
   anyone may rename a directory of the user's holding planted entries (see
   above) into its place, and the directory and its entries then pass every
   check, so such a parent is not trusted (warned, uncached). A sticky one
   (/tmp) is: there only the owner renames. main ran the planted image. */
CT_TEST(cache_dir_below_a_world_writable_parent) {
    static const char *opts[] = {"-DVALUE=87"};
    char top[64], planted[200], cdir[200], path[1200];
    unsigned char key[32];
    capex_cuda_cache c, v;
    capex_cuda_compile_desc d;
    capex_cuda_image crafted, back;
    make_dir(top, sizeof top);
    snprintf(planted, sizeof planted, "%s/clone", top);
    snprintf(cdir, sizeof cdir, "%s/cache", top);
    CT_CHECK(mkdir(planted, 0755) == 0, "mkdir");
    capex_cuda_cache_init(&v, planted);
    capex__cuda_cache_key(user_src, "user", opts, 1, 90, key);
    fake_image(&crafted, 3000, CAPEX_CUDA_IMAGE_CUBIN, 13);
    CT_CHECK(capex__cuda_cache_write(&v, key, &crafted) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(chmod(top, 0777) == 0, "a world-writable directory, not sticky");
    CT_CHECK(rename(planted, cdir) == 0, "renamed into place (anyone may, in a 0777 directory)");
    capex_cuda_cache_init(&c, cdir);
    user_desc(&d, &c, opts);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    CT_CHECK(capex__cuda_cache_dir_check(c.dir) == CAPEX_ERR_CONFIG, "a directory below a 0777 parent trusted");
    CT_CHECK(strstr(capex_last_error(), top) && strstr(capex_last_error(), "writable by others"), "%s", capex_last_error());
    { /* reached through the user's own link from a private directory: its real parent counts */
        char safe[64], via[200];
        make_dir(safe, sizeof safe);
        snprintf(via, sizeof via, "%s/link", safe);
        CT_CHECK(symlink(cdir, via) == 0, "symlink");
        CT_CHECK(capex__cuda_cache_dir_check(via) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "writable by others"),
                 "through a link: %s", capex_last_error());
        unlink(via);
        rm_dir(safe);
    }
    CT_CHECK(chmod(top, 01777) == 0, "sticky");
    CT_CHECK(capex__cuda_cache_dir_check(c.dir) == CAPEX_OK, "below a sticky parent: %s", capex_last_error());
    CT_CHECK(chmod(top, 0777) == 0, "not sticky");
    CT_NEED_NVRTC();
    CT_CHECK(compile_uncached_twice(&d), "compiled, not read: %s", capex_last_error());
    CT_CHECK(warnings == 1 && strstr(warn_seen, "writable by others"), "warned once (%d): %s", warnings, warn_seen);
    CT_CHECK(capex__cuda_cache_read(path, key, &back) == CAPEX_OK && back.size == 3000, "nothing written there");
    capex_cuda_image_free(&back);
    capex_cuda_image_free(&crafted);
    rm_dir(cdir);
    rm_dir(top);
}

/* The cache directory's path is swapped (moved aside, a symlink of the user's
   to another directory of the user's holding a planted entry in its place:
   both pass every check) while a rank waits for another's compile lock: the
   waiter goes on in the directory it checked and opened (a descriptor), reads
   the entry its holder wrote there, and never the planted one. main followed
   the path and ran the planted image. */
static void child_read_user_entry(const char *dir, child_result *res) {
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    alarm((unsigned)(2 * CT_HANG_GUARD_S));
    waits_reported = 0;
    capex_cuda_cache_init(&c, dir);
    user_desc(&d, &c, lock_opts);
    res->code = capex_cuda_compile(&d, &img);
    res->value = res->code == CAPEX_OK && img.from_cache ? (int)img.size : -1;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_image_free(&img);
}
CT_TEST(cache_dir_swapped_while_waiting) {
    char top[64], cdir[200], aside[200], planted[200], lock[1300];
    unsigned char key[32];
    capex_cuda_cache c;
    capex_cuda_image mine, crafted;
    int wt[2], fd, lfd, waited;
    pid_t p;
    child_result r;
    make_dir(top, sizeof top);
    snprintf(cdir, sizeof cdir, "%s/cache", top);
    snprintf(aside, sizeof aside, "%s/cache.aside", top);
    snprintf(planted, sizeof planted, "%s/clone", top);
    capex__cuda_cache_key(user_src, "user", lock_opts, 1, 90, key);
    fake_image(&crafted, 3000, CAPEX_CUDA_IMAGE_CUBIN, 17);
    fake_image(&mine, 1000, CAPEX_CUDA_IMAGE_CUBIN, 5);
    capex_cuda_cache_init(&c, planted);
    CT_CHECK(capex__cuda_cache_write(&c, key, &crafted) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(mkdir(cdir, 0700) == 0, "mkdir");
    lock_path(cdir, lock, sizeof lock);
    lfd = open(lock, O_RDWR | O_CREAT, 0600);
    CT_CHECK(lfd >= 0 && flock(lfd, LOCK_EX) == 0, "holding the entry's lock: %s", strerror(errno));
    CT_CHECK(pipe(wt) == 0, "pipe");
    wait_fd = wt[1];
    p = spawn(child_read_user_entry, cdir, &fd);
    wait_fd = -1;
    close(wt[1]);
    waited = read_bytes(wt[0], 1);
    close(wt[0]);
    CT_CHECK(rename(cdir, aside) == 0 && symlink(planted, cdir) == 0, "swap: %s", strerror(errno));
    capex_cuda_cache_init(&c, aside); /* the holder writes the entry where it began, and is done */
    CT_CHECK(capex__cuda_cache_write(&c, key, &mine) == CAPEX_OK, "%s", capex_last_error());
    lock_path(aside, lock, sizeof lock);
    unlink(lock);
    close(lfd);
    r = collect(p, fd);
    CT_CHECK(waited == 1, "the child waited for the lock");
    CT_CHECK(r.exited_ok && r.code == CAPEX_OK && r.value == 1000, "read the planted entry (3000 bytes) or none: %d, %d bytes, %s",
             r.code, r.value, r.message);
    CT_CHECK(count_files(planted, ".lock") == 0 && count_files(aside, ".lock") == 0, "no lock file made through the link");
    capex_cuda_image_free(&mine);
    capex_cuda_image_free(&crafted);
    unlink(cdir);
    rm_dir(aside);
    rm_dir(planted);
    rm_dir(top);
}

/* The same swap while a compile runs (real NVRTC): the entry is written into
   the directory that was checked, not through the symlink now at its path,
   and its lock file removed from there. main wrote into the other directory. */
CT_TEST(cache_dir_swapped_during_a_compile) {
    static const char *opts[] = {"-DVALUE=88"};
    char top[64], cdir[200], planted[200];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    capex_result r;
    CT_NEED_NVRTC();
    make_dir(top, sizeof top);
    snprintf(cdir, sizeof cdir, "%s/cache", top);
    snprintf(planted, sizeof planted, "%s/clone", top);
    CT_CHECK(mkdir(cdir, 0700) == 0 && mkdir(planted, 0700) == 0, "mkdir");
    snprintf(swap_dir, sizeof swap_dir, "%s", cdir);
    snprintf(swap_aside, sizeof swap_aside, "%s/cache.aside", top);
    snprintf(swap_link_to, sizeof swap_link_to, "%s", planted);
    capex_cuda_cache_init(&c, cdir);
    user_desc(&d, &c, opts);
    r = capex_cuda_compile(&d, &img);
    capex_cuda_image_free(&img);
    swap_dir[0] = '\0';
    CT_CHECK(r == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(swap_aside[0], "the hook swapped the directory");
    CT_CHECK(count_files(planted, "") == 0, "%d files written through the swapped-in symlink", count_files(planted, ""));
    CT_CHECK(count_files(swap_aside, ".capexjit") == 1 && count_files(swap_aside, "") == 1,
             "the entry (alone, no lock file) in the directory checked: %d files", count_files(swap_aside, ""));
    unlink(cdir);
    rm_dir(swap_aside);
    rm_dir(planted);
    rm_dir(top);
}

/* A cache directory below a group-writable parent (not sticky) whose group is
   not the user's private one: any member may rename a directory of the user's
   with planted entries into its place, so it is not trusted (warned once,
   compiled uncached, nothing written), on the path or really above it
   (through a link), unless it is $HOME or above it (the system's, as ssh has
   it). Sticky, or the user's private group (umask 002 under user private
   groups: numbered as the user, its effective group) is trusted.
   Needs root (chown to another group). main trusted every group-writable
   parent. */
CT_TEST(cache_dir_below_a_group_writable_parent) {
    static const char *opts[] = {"-DVALUE=89"};
    char top[64], shared[200], cdir[200], safe[64], via[200];
    capex_cuda_cache c;
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    int upg;
    make_dir(top, sizeof top);
    snprintf(shared, sizeof shared, "%s/shared", top);
    snprintf(cdir, sizeof cdir, "%s/cache", shared);
    CT_CHECK(mkdir(shared, 0770) == 0 && chmod(shared, 0770) == 0 && mkdir(cdir, 0700) == 0, "mkdir");
    if (chown(shared, (uid_t)-1, 12345) != 0) {
        rm_dir(cdir);
        rm_dir(shared);
        rm_dir(top);
        CT_SKIP("chown to another group needs root: %s", strerror(errno));
    }
    CT_CHECK(capex__cuda_cache_dir_check(cdir) == CAPEX_ERR_CONFIG, "a directory below a group-writable parent trusted");
    CT_CHECK(strstr(capex_last_error(), shared) && strstr(capex_last_error(), "writable by others") &&
             strstr(capex_last_error(), "group 12345"), "%s", capex_last_error());
    make_dir(safe, sizeof safe);
    snprintf(via, sizeof via, "%s/link", safe);
    CT_CHECK(symlink(cdir, via) == 0, "symlink");
    CT_CHECK(capex__cuda_cache_dir_check(via) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "writable by others"),
             "through a link: %s", capex_last_error());
    unlink(via);
    rm_dir(safe);
    { /* $HOME and the directories above it are the system's: group write is not held against them; below it, it is */
        char *env = getenv("HOME"), saved[1024] = "", sub[300], subcache[300];
        int had = env != NULL, home_ok, below_home, sub_refused = 0, made;
        capex_result sub_r = CAPEX_OK;
        if (had) snprintf(saved, sizeof saved, "%s", env);
        snprintf(sub, sizeof sub, "%s/sub", shared);
        snprintf(subcache, sizeof subcache, "%s/cache", sub);
        made = mkdir(sub, 0770) == 0 && chmod(sub, 0770) == 0 && chown(sub, (uid_t)-1, 12345) == 0 && mkdir(subcache, 0700) == 0;
        setenv("HOME", shared, 1);
        home_ok = capex__cuda_cache_dir_check(cdir) == CAPEX_OK;
        if (made) {
            sub_r = capex__cuda_cache_dir_check(subcache);
            sub_refused = sub_r == CAPEX_ERR_CONFIG && strstr(capex_last_error(), sub) != NULL;
        }
        setenv("HOME", top, 1);
        below_home = capex__cuda_cache_dir_check(cdir) == CAPEX_ERR_CONFIG;
        if (had) setenv("HOME", saved, 1);
        else unsetenv("HOME");
        rmdir(subcache);
        rmdir(sub);
        CT_CHECK(made, "mkdir sub");
        CT_CHECK(home_ok, "a group-writable home is the system's");
        CT_CHECK(sub_refused, "a group-writable directory below the home: %d", sub_r);
        CT_CHECK(below_home, "a group-writable directory below the home (the cache's parent): trusted");
    }
    CT_CHECK(chmod(shared, 02770) == 0 && capex__cuda_cache_dir_check(cdir) == CAPEX_ERR_CONFIG, "setgid is not sticky");
    CT_CHECK(chmod(shared, 01770) == 0 && capex__cuda_cache_dir_check(cdir) == CAPEX_OK, "sticky: %s", capex_last_error());
    CT_CHECK(chmod(shared, 0770) == 0, "chmod");
    upg = getegid() == (gid_t)geteuid(); /* root's group 0 too */
    if (upg)
        CT_CHECK(chown(shared, (uid_t)-1, getegid()) == 0 && capex__cuda_cache_dir_check(cdir) == CAPEX_OK,
                 "the user's private group: %s", capex_last_error());
    CT_NEED_NVRTC();
    CT_CHECK(chown(shared, (uid_t)-1, 12345) == 0 && chmod(shared, 0770) == 0, "chown");
    capex_cuda_cache_init(&c, cdir);
    user_desc(&d, &c, opts);
    CT_CHECK(compile_uncached_twice(&d), "compiled, not cached: %s", capex_last_error());
    CT_CHECK(warnings == 1 && strstr(warn_seen, "writable by others"), "warned once (%d): %s", warnings, warn_seen);
    CT_CHECK(count_files(cdir, "") == 0, "nothing written");
    if (upg) {
        CT_CHECK(chown(shared, (uid_t)-1, getegid()) == 0 && chmod(shared, 0770) == 0, "chown");
        capex_cuda_cache_init(&c, cdir);
        CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && !img.from_cache, "%s", capex_last_error());
        capex_cuda_image_free(&img);
        CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK && img.from_cache, "then a hit: %s", capex_last_error());
        capex_cuda_image_free(&img);
    }
    rm_dir(cdir);
    rm_dir(shared);
    rm_dir(top);
}

/* The built-in parts through the disk cache: one entry per part under its own key,
   filled concurrently, read back whole; a damaged entry is recompiled alone. */
CT_TEST(builtin_parts_cache_entries) {
    enum { NP = CAPEX__CUDA_N_PARTS };
    unsigned char keys[NP + 1][32];
    char dir[64], path[1200];
    capex_cuda_cache c;
    capex_cuda_image cold[NP], warm[NP];
    int p, q, n = 0;
    const char *const *opts = capex_cuda_builtin_options(&n);
    FILE *f;
    for (p = 0; p < NP; p++)
        capex__cuda_cache_key(capex_cuda_builtin_part_source(p), capex__cuda_part_prog[p], opts, n, 90, keys[p]);
    capex__cuda_cache_key(capex_cuda_builtin_source(), "capex_builtin", opts, n, 90, keys[NP]);
    for (p = 0; p <= NP; p++)
        for (q = 0; q < p; q++) CT_CHECK(memcmp(keys[p], keys[q], 32) != 0, "parts %d and %d share a key", p, q);
    CT_NEED_NVRTC();
    make_dir(dir, sizeof dir);
    capex_cuda_cache_init(&c, dir);
    CT_CHECK(capex_cuda_builtin_compile_parts(90, &c, 2, cold) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(count_files(dir, ".capexjit") == NP && count_files(dir, ".tmp") == 0, "%d entries for %d parts",
             count_files(dir, ".capexjit"), NP);
    CT_CHECK(capex_cuda_builtin_compile_parts(90, &c, 2, warm) == CAPEX_OK, "%s", capex_last_error());
    for (p = 0; p < NP; p++) {
        CT_CHECK(!cold[p].from_cache && warm[p].from_cache, "part %d: cold %d warm %d", p, cold[p].from_cache, warm[p].from_cache);
        CT_CHECK(cold[p].size == warm[p].size && !memcmp(cold[p].data, warm[p].data, cold[p].size), "part %d bytes", p);
        capex_cuda_image_free(&warm[p]);
    }
    /* truncate one entry: that part alone is recompiled (and rewritten) */
    capex__cuda_cache_path(&c, keys[CAPEX__CP_BASIC], path, sizeof path);
    f = fopen(path, "r+b");
    CT_CHECK(f != NULL && ftruncate(fileno(f), 100) == 0, "truncate %s", path);
    if (f) fclose(f);
    CT_CHECK(capex_cuda_builtin_compile_parts(90, &c, 1, warm) == CAPEX_OK, "%s", capex_last_error());
    for (p = 0; p < NP; p++) {
        CT_CHECK(warm[p].from_cache == (p != CAPEX__CP_BASIC), "part %d from_cache %d", p, warm[p].from_cache);
        CT_CHECK(cold[p].size == warm[p].size && !memcmp(cold[p].data, warm[p].data, cold[p].size), "part %d bytes", p);
        capex_cuda_image_free(&warm[p]);
        capex_cuda_image_free(&cold[p]);
    }
    CT_CHECK(count_files(dir, ".capexjit") == NP, "rewritten in place");
    rm_dir(dir);
}

static const ct_case cases[] = {
    CT_CASE(sha256_fips_vectors),
    CT_CASE(key_changes_with_each_input),
    CT_CASE(entry_round_trip_and_damage),
    CT_CASE(cache_dir_from_environment),
    CT_CASE(compile_through_cache_recompiles_bad_entries),
    CT_CASE(compiles_that_read_files_skip_the_disk_cache),
    CT_CASE(hit_needs_no_nvrtc),
    CT_CASE(concurrent_writers_and_reader),
    CT_CASE(concurrent_compiles),
    CT_CASE(lock_ranks_compile_a_cold_entry_once),
    CT_CASE(lock_holder_killed_others_proceed),
    CT_CASE(lock_wait_limit_and_stale_lock_files),
    CT_CASE(lock_forked_copy_of_a_held_lock),
    CT_CASE(lock_path_not_a_plain_file_of_ours),
    CT_CASE(lock_threads_of_one_process),
    CT_CASE(lock_waiters_take_the_holders_compile_error),
    CT_CASE(lock_record_of_a_dead_holder_is_no_outcome),
    CT_CASE(lock_precompile_takes_free_parts_first),
    CT_CASE(lock_deferred_compile_keeps_the_holders_outcome),
    CT_CASE(write_that_fails_part_way),
    CT_CASE(unwritable_dir_warns_once),
    CT_CASE(unreadable_entry_and_stale_temp_files),
    CT_CASE(builtin_parts_cache_entries),
    CT_CASE(entry_that_is_not_a_regular_file),
    CT_CASE(entry_claiming_a_huge_payload),
    CT_CASE(cache_trust_rule),
    CT_CASE(hard_linked_entry_is_not_trusted),
    CT_CASE(cache_dir_through_another_users_symlink),
    CT_CASE(cache_dir_below_a_world_writable_parent),
    CT_CASE(cache_dir_swapped_while_waiting),
    CT_CASE(cache_dir_swapped_during_a_compile),
    CT_CASE(cache_dir_below_a_group_writable_parent),
};
static const child_entry children[] = {{"hit", child_hit_without_nvrtc}};

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
