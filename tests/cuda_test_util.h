/* Helpers shared by the CUDA backend's tests: NVRTC requirement, running a
   check in a fresh child process (the libraries load once per process), and
   byte search. Include after capex_test.h and capex_cuda.h. */
#ifndef CAPEX_CUDA_TEST_UTIL_H
#define CAPEX_CUDA_TEST_UTIL_H
#include <sys/wait.h>
/* Messages from capex_last_error() (1 KiB) are cut to the harness's 512 bytes on purpose. */
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include <unistd.h>

/* dir/../sub/name relative to this test binary's directory (build/tests),
   e.g. sibling_path("fake", "libnccl.so.2") -> build/tests/../fake/libnccl.so.2.
   0 when /proc/self/exe cannot be read. */
static inline int sibling_path(const char *sub, const char *name, char *out, size_t cap) {
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash;
    if (n <= 0) return 0;
    exe[n] = '\0';
    if (!(slash = strrchr(exe, '/'))) return 0;
    *slash = '\0';
    snprintf(out, cap, "%s/../%s/%s", exe, sub, name);
    return 1;
}

/* NVRTC must load in CI ("kernel sources are always compiled by NVRTC in CI");
   only CAPEX_TEST_NO_NVRTC=1 (a machine documented to have no toolkit) skips. */
#define CT_NEED_NVRTC()                                                                          \
    do {                                                                                         \
        int ct_M_, ct_m_;                                                                        \
        if (capex_cuda_nvrtc_version(&ct_M_, &ct_m_) != CAPEX_OK) {                              \
            const char *ct_e_ = getenv("CAPEX_TEST_NO_NVRTC");                                   \
            if (ct_e_ && ct_e_[0] == '1') CT_SKIP("CAPEX_TEST_NO_NVRTC=1: %s", capex_last_error()); \
            CT_CHECK(0, "NVRTC must be loadable (run `make ci-deps`, or set CAPEX_TEST_NO_NVRTC=1 " \
                        "on a machine without a CUDA toolkit): %s", capex_last_error());         \
        }                                                                                        \
    } while (0)

/* Result of a child: its status code, a value and capex_last_error(). */
typedef struct child_result { int code; int value; char message[1024]; int exited_ok; } child_result;
typedef void (*child_fn)(const char *arg, child_result *res);
typedef struct child_entry { const char *name; child_fn fn; } child_entry;

/* Runs child function `name` in a fresh process (fork + exec of this test
   program: the libraries load once per process, and a forked copy would
   inherit the parent's loaded state) and returns what it reported. */
static child_result run_child(const char *name, const char *arg) {
    child_result res;
    int fds[2], status = 0;
    pid_t pid;
    memset(&res, 0, sizeof res);
    res.code = -1000;
    if (pipe(fds) != 0) return res;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        close(fds[1]);
        execl("/proc/self/exe", "capex-test-child", "--child", name, arg ? arg : "", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    {
        size_t off = 0;
        while (off < sizeof res) {
            ssize_t n = read(fds[0], (char *)&res + off, sizeof res - off);
            if (n <= 0) break;
            off += (size_t)n;
        }
        if (off != sizeof res) res.code = -1001;
    }
    close(fds[0]);
    waitpid(pid, &status, 0);
    res.exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    return res;
}

/* In main(): `if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(...)`. */
static int child_main(const child_entry *table, size_t n, int argc, char **argv) {
    child_result r;
    size_t i, off = 0;
    memset(&r, 0, sizeof r);
    r.code = -1002;
    for (i = 0; argc > 3 && i < n; i++)
        if (!strcmp(table[i].name, argv[2])) table[i].fn(argv[3][0] ? argv[3] : NULL, &r);
    fflush(stdout);
    while (off < sizeof r) {
        ssize_t w = write(1, (char *)&r + off, sizeof r - off);
        if (w <= 0) return 1;
        off += (size_t)w;
    }
    return 0;
}

static __attribute__((unused)) int contains_bytes(const void *hay, size_t n, const char *needle) {
    size_t m = strlen(needle), i;
    const char *h = (const char *)hay;
    if (m == 0 || m > n) return 0;
    for (i = 0; i + m <= n; i++)
        if (h[i] == needle[0] && memcmp(h + i, needle, m) == 0) return 1;
    return 0;
}
/* A context, a user stream and a world-1 NCCL comm on it (tests of the real
   NCCL and the emulator), or SKIP with the reason. fake_why: the skip
   message under the stand-in driver; need_nvrtc: also SKIP without NVRTC. */
#define CT_OPEN_NCCL1(ctx, comm, user, fake_why, need_nvrtc)                                          \
    do {                                                                                             \
        capex_result r_;                                                                             \
        int n_ = 0, v_ = 0;                                                                          \
        capex_dist_env env_;                                                                         \
        capex_nccl_desc nd_;                                                                         \
        const char *lp_ = getenv("CAPEX_LIBCUDA_PATH");                                              \
        if (lp_ && strstr(lp_, "fake")) CT_SKIP("stand-in driver: %s", fake_why);                   \
        r_ = capex_cuda_device_count(&n_);                                                           \
        if (r_ != CAPEX_OK || n_ == 0) CT_SKIP("no GPU (%s): %.100s", capex_result_string(r_), r_ ? capex_last_error() : "0 devices"); \
        if (capex_cuda_nccl_version(&v_) != CAPEX_OK) CT_SKIP("no NCCL: %.160s", capex_last_error()); \
        if ((need_nvrtc) && capex_cuda_nvrtc_version(&n_, &v_) != CAPEX_OK) CT_SKIP("no NVRTC: %.160s", capex_last_error()); \
        CT_CHECK(capex_cuda_context_create(NULL, &(ctx)) == CAPEX_OK, "context: %s", capex_last_error()); \
        CT_CHECK(capex_cuda_stream_create((ctx), &(user)) == CAPEX_OK, "stream: %s", capex_last_error()); \
        memset(&env_, 0, sizeof env_);                                                               \
        env_.world_size = 1;                                                                         \
        capex_nccl_desc_init(&nd_);                                                                  \
        nd_.ctx = (ctx);                                                                             \
        nd_.user_stream = (user);                                                                    \
        CT_CHECK(capex_comm_init_nccl(&(comm), &env_, &nd_) == CAPEX_OK, "NCCL: %s", capex_last_error()); \
    } while (0)

#endif
