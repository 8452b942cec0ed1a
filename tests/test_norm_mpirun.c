/* Runs the SyncBatchNorm MPI test (tests/mpi/test_norm_mpi.c, built by
   tests/norm.mk with mpicc -DCAPEX_MPI) under Open MPI's mpirun -np 2 and
   -np 3 --oversubscribe, each bounded by coreutils `timeout`, and requires
   its summary line. SKIPs, with the reason, when mpirun or the binary is
   missing. */
#define _POSIX_C_SOURCE 200809L
#include "capex_test.h"
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>

static char g_bin[1024], g_out[1100], g_skip[1200];

static char *slurp(void) {
    FILE *f = fopen(g_out, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char *)malloc((size_t)n + 1);
    n = (long)fread(buf, 1, (size_t)n, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void run_np(ct_state *ct, int np) {
    char cmd[4096];
    int st, rc;
    char *out;
    const int cases = 12;
    char want[64];
    if (g_skip[0]) CT_SKIP("%.400s", g_skip);
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none "
             "-np %d '%s' > '%s' 2>&1", np, g_bin, g_out);
    fflush(stdout);
    st = system(cmd);
    rc = st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
    out = slurp();
    snprintf(want, sizeof want, "norm-mpi-summary: %d passed, 0 failed", cases);
    if (rc != 0 || !out || !strstr(out, want)) printf("%s\n", out ? out : "(no output)");
    CT_CHECK(out && strstr(out, want), "np %d: no '%s' (exit %d)", np, want, rc);
    CT_CHECK(rc == 0, "np %d: mpirun exit %d", np, rc);
    free(out);
}

CT_TEST(syncbn_mpi_np2) { run_np(ct, 2); }
CT_TEST(syncbn_mpi_np3_oversubscribe) { run_np(ct, 3); }

static const ct_case cases[] = {
    CT_CASE(syncbn_mpi_np2),
    CT_CASE(syncbn_mpi_np3_oversubscribe),
};

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    int dirlen = slash ? (int)(slash - argv[0]) : 1;
    const char *dir = slash ? argv[0] : ".";
    snprintf(g_bin, sizeof g_bin, "%.*s/mpi/test_norm_mpi", dirlen, dir);
    snprintf(g_out, sizeof g_out, "%.*s/mpi/norm-out-%ld.txt", dirlen, dir, (long)getpid());
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        snprintf(g_skip, sizeof g_skip, "no mpirun on PATH (make ci-deps installs Open MPI)");
    else if (system("mpirun --version 2>&1 | grep -q 'Open MPI'") != 0)
        snprintf(g_skip, sizeof g_skip, "mpirun is not Open MPI (the flags used here are Open MPI's)");
    else if (system("command -v timeout >/dev/null 2>&1") != 0)
        snprintf(g_skip, sizeof g_skip, "no coreutils timeout to bound the runs");
    else if (access(g_bin, X_OK) != 0)
        snprintf(g_skip, sizeof g_skip, "%.900s not built (needs mpicc: make ci-deps)", g_bin);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    {
        int rc = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
        remove(g_out);
        return rc;
    }
}
