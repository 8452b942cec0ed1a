/* Runs the multi-rank MPI tests (tests/mpi/test_dist_mpi.c, built by
   tests/dist.mk with mpicc -DCAPEX_MPI) under Open MPI's mpirun, with a hard
   time bound (coreutils `timeout`) on every run, and checks their output:
   -np 2 and -np 4 --oversubscribe for the training/bucket tests, a rank that
   stalls mid-step (the others return CAPEX_ERR_TIMEOUT within the 2 s
   deadline and apply no step), and a rank SIGKILLed mid-step (the job ends
   instead of hanging; with --enable-recovery the survivors themselves report
   the failure within the deadline), and DDP / ZeRO buffers whose collective
   timed out are not freed (MPI still completes it when the peer turns up). SKIPs, with the reason, when mpirun or
   the MPI test binary is missing. */
#define _POSIX_C_SOURCE 200809L
#include "capex_test.h"
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>

static char g_bin[1024], g_out[1100], g_skip[1200];

/* Runs cmd with output to g_out; returns the exit status (-1 if abnormal). */
static int run(const char *args, double bound_s) {
    char cmd[4096];
    int st;
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 %d mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none %s > '%s' 2>&1",
             (int)bound_s, args, g_out);
    fflush(stdout);
    st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

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

static int count(const char *hay, const char *needle) {
    int c = 0;
    const char *p = hay;
    while ((p = strstr(p, needle)) != NULL) { c++; p += strlen(needle); }
    return c;
}

/* Shows the MPI output indented, so its lines never look like a summary. */
static void show(const char *out) {
    const char *p = out;
    while (p && *p) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        printf("    | %.*s\n", len, p);
        p = e ? e + 1 : NULL;
    }
}

static int ready(ct_state *ct) {
    if (g_skip[0]) { snprintf(ct->why, sizeof ct->why, "%.400s", g_skip); ct->skipped = 1; return 0; }
    return 1;
}

static void suite(ct_state *ct, int np) {
    char args[1200], want[64];
    int rc;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np %d '%s'", np, g_bin);
    rc = run(args, 600); /* a hang guard: np 4 oversubscribed on a loaded 2-core VM outran 120 s */
    out = slurp();
    snprintf(want, sizeof want, "mpi-summary: 19 passed, 0 failed");
    if (rc != 0 || !out || !strstr(out, want)) show(out);
    CT_CHECK(out && strstr(out, want), "np %d: no '%s' (exit %d)", np, want, rc);
    CT_CHECK(rc == 0, "np %d: mpirun exit %d", np, rc);
    free(out);
}

CT_TEST(mpi_np2) { suite(ct, 2); }
CT_TEST(mpi_np4_oversubscribe) { suite(ct, 4); }

CT_TEST(mpi_stalled_rank_others_time_out) {
    char args[1200];
    int rc, n;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np 4 '%s' stall", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    n = count(out, "finalize -> CAPEX_ERR_TIMEOUT");
    if (n < 1 || rc == 124 || strstr(out, "CHANGED") || strstr(out, "finished all steps")) show(out);
    CT_CHECK(rc != 124 && rc != 0, "the job must end with an error, not hang (exit %d)", rc);
    CT_CHECK(n >= 1, "a survivor must report CAPEX_ERR_TIMEOUT from finalize");
    CT_CHECK(count(out, "no step applied") == n && !strstr(out, "CHANGED"), "no half-applied step");
    CT_CHECK(!strstr(out, "finished all steps"), "nobody trains past the failure");
    free(out);
}

CT_TEST(mpi_stalled_rank_blocking_collectives_time_out) {
    char args[1200];
    int rc;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np 2 '%s' stall_blocking", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    if (rc == 124 || !out || count(out, "-> CAPEX_ERR_TIMEOUT") != 5) show(out);
    CT_CHECK(rc != 124 && rc != 0, "the job must end with an error, not hang (exit %d)", rc);
    CT_CHECK(out && strstr(out, "blocking allreduce -> CAPEX_ERR_TIMEOUT"), "allreduce must time out");
    CT_CHECK(out && strstr(out, "blocking broadcast -> CAPEX_ERR_TIMEOUT"), "broadcast must time out");
    CT_CHECK(out && strstr(out, "blocking allgather -> CAPEX_ERR_TIMEOUT"), "allgather must time out");
    CT_CHECK(out && strstr(out, "blocking reduce-scatter -> CAPEX_ERR_TIMEOUT"), "reduce-scatter must time out");
    CT_CHECK(out && strstr(out, "blocking allgatherv -> CAPEX_ERR_TIMEOUT"), "allgatherv must time out");
    free(out);
}

CT_TEST(mpi_killed_rank_job_ends) {
    char args[1200];
    int rc;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np 4 '%s' kill", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    if (rc == 124 || rc == 0) show(out);
    CT_CHECK(rc != 124 && rc != 0, "the job must end with an error, not hang (exit %d)", rc);
    CT_CHECK(!strstr(out, "finished all steps") && !strstr(out, "CHANGED"), "no survivor stepped past the failure");
    free(out);
}

CT_TEST(mpi_killed_rank_survivors_fail_within_deadline) {
    char args[1200];
    int rc, n;
    char *out;
    if (!ready(ct)) return;
    /* --enable-recovery: mpirun keeps the survivors alive, so they must find
       out by themselves, through capex's deadline */
    snprintf(args, sizeof args, "--enable-recovery -np 4 '%s' kill", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    n = count(out, "finalize -> CAPEX_ERR_TIMEOUT") + count(out, "finalize -> CAPEX_ERR_COMM");
    if (n < 1 || rc == 124) show(out);
    CT_CHECK(rc != 124, "hung (killed by the time bound)");
    CT_CHECK(n >= 1, "a survivor must report the failure");
    CT_CHECK(count(out, "no step applied") == n && !strstr(out, "finished all steps"), "no half-applied step");
    free(out);
}

/* rank 0 times out and destroys its DDP and ZeRO; rank 1 arrives late and
   the collectives MPI could not cancel complete into rank 0's buffers */
CT_TEST(mpi_abandoned_ddp_and_zero_buffers_not_freed) {
    char args[1200];
    int rc;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np 2 '%s' late", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    if (rc != 0 || !out || !strstr(out, "freed buffers intact")) show(out);
    CT_CHECK(rc == 0, "mpirun exit %d", rc);
    CT_CHECK(out && strstr(out, "rank 0: finalize -> CAPEX_ERR_TIMEOUT (MPI allreduce (bucket) did not complete"),
             "rank 0's DDP finalize must time out, naming the allreduce");
    CT_CHECK(out && strstr(out, "rank 0: wait_params -> CAPEX_ERR_TIMEOUT (MPI all-gather (bucket) did not complete"),
             "rank 0's ZeRO all-gather must time out, naming the all-gather (not an allreduce)");
    CT_CHECK(out && strstr(out, "rank 1: finalize -> CAPEX_OK") && strstr(out, "rank 1: wait_params -> CAPEX_OK"),
             "rank 1 completes both");
    CT_CHECK(out && strstr(out, "freed buffers intact"), "a late collective wrote into a buffer DDP or ZeRO had freed");
    free(out);
}

CT_TEST(mpi_comm_after_finalize_is_an_order_error) {
    char args[1200];
    int rc;
    char *out;
    if (!ready(ct)) return;
    snprintf(args, sizeof args, "-np 2 '%s' after_finalize", g_bin);
    rc = run(args, 300); /* a hang guard */
    out = slurp();
    CT_CHECK(out != NULL, "no output");
    if (rc != 0 || !out || count(out, "after finalize: CAPEX_ERR_ORDER CAPEX_ERR_ORDER CAPEX_ERR_ORDER CAPEX_ERR_ORDER "
                                      "CAPEX_ERR_ORDER: ") != 2)
        show(out);
    CT_CHECK(rc == 0, "mpirun exit %d", rc);
    CT_CHECK(out && count(out, "after finalize: CAPEX_ERR_ORDER CAPEX_ERR_ORDER CAPEX_ERR_ORDER CAPEX_ERR_ORDER "
                               "CAPEX_ERR_ORDER: ") == 2, "every call on both ranks must return CAPEX_ERR_ORDER");
    free(out);
}

static const ct_case cases[] = {
    CT_CASE(mpi_np2),
    CT_CASE(mpi_np4_oversubscribe),
    CT_CASE(mpi_stalled_rank_others_time_out),
    CT_CASE(mpi_stalled_rank_blocking_collectives_time_out),
    CT_CASE(mpi_killed_rank_job_ends),
    CT_CASE(mpi_killed_rank_survivors_fail_within_deadline),
    CT_CASE(mpi_abandoned_ddp_and_zero_buffers_not_freed),
    CT_CASE(mpi_comm_after_finalize_is_an_order_error),
};

int main(int argc, char **argv) {
    const char *slash = strrchr(argv[0], '/');
    int dirlen = slash ? (int)(slash - argv[0]) : 1;
    const char *dir = slash ? argv[0] : ".";
    snprintf(g_bin, sizeof g_bin, "%.*s/mpi/test_dist_mpi", dirlen, dir);
    snprintf(g_out, sizeof g_out, "%.*s/mpi/out-%ld.txt", dirlen, dir, (long)getpid());
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        snprintf(g_skip, sizeof g_skip, "no mpirun on PATH (make ci-deps installs Open MPI)");
    else if (system("mpirun --version 2>&1 | grep -q 'Open MPI'") != 0)
        snprintf(g_skip, sizeof g_skip, "mpirun is not Open MPI (the flags used here are Open MPI's)");
    else if (system("command -v timeout >/dev/null 2>&1") != 0)
        snprintf(g_skip, sizeof g_skip, "no coreutils timeout to bound the runs");
    else if (access(g_bin, X_OK) != 0)
        snprintf(g_skip, sizeof g_skip, "%.900s not built (needs mpicc: make ci-deps)", g_bin);
    /* CI runs as root; Open MPI refuses root without these */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    {
        int rc = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
        remove(g_out);
        return rc;
    }
}
