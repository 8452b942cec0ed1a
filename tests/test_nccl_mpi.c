/* Two programs in one file.
   - Built by tests/nccl.mk with mpicc -DCAPEX_MPI (build/tests/mpi/test_nccl_mpi):
     under mpirun, the MPI backend's f64 / i64 collectives (f64 sums in rank
     order, int64 sums exact past 2^53, AVG of f64, broadcast, allgather, the
     AVG-of-int64 refusal) and the NCCL unique-id exchange over an MPI
     bootstrap comm (rank 0's 128 bytes on every rank, a zero id from rank 0
     failing the others with CAPEX_ERR_COMM). Prints "rank R ok" per rank.
   - Built as a plain test (make test): runs that binary under
     `mpirun -np 2` and `-np 3 --oversubscribe` (bounded by `timeout`) and
     checks every rank said ok. SKIPs when mpirun or the binary is missing. */
#ifdef CAPEX_MPI
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdio.h>

static int wide(capex_comm *c) {
    double d[3], da[3], s = 0.0;
    int64_t q[3], g[16];
    int r = c->rank, w = c->world_size, k;
    d[0] = 0.1 * (r + 1); d[1] = 1e300; d[2] = -(double)r;
    q[0] = ((int64_t)1 << 60) + r; q[1] = -r; q[2] = (int64_t)1 << 53;
    if (capex_comm_allreduce(c, d, da, 3, CAPEX_F64, CAPEX_REDUCE_SUM)) return 1;
    for (k = 0; k < w; k++) s += 0.1 * (k + 1);
    /* MPI may sum in any order: compare within an ulp-scale bound, the rest exactly */
    if (da[0] < s * (1 - 1e-15) || da[0] > s * (1 + 1e-15) || da[1] != 1e300 * w || da[2] != -(double)(w * (w - 1) / 2)) return 2;
    if (capex_comm_allreduce(c, d, d, 3, CAPEX_F64, CAPEX_REDUCE_AVG)) return 3;
    if (d[1] != 1e300 * w / w) return 4;
    if (capex_comm_allreduce(c, q, q, 3, CAPEX_I64, CAPEX_REDUCE_SUM)) return 5;
    if (q[0] != ((int64_t)1 << 60) * w + w * (w - 1) / 2 || q[1] != -(int64_t)(w * (w - 1) / 2) || q[2] != ((int64_t)1 << 53) * w) return 6;
    q[0] = 1000 + r;
    if (capex_comm_allgather(c, q, g, 1, CAPEX_I64)) return 7;
    for (k = 0; k < w; k++) if (g[k] != 1000 + k) return 8;
    d[0] = r == 0 ? 0.3 : -1.0;
    if (capex_comm_broadcast(c, d, 1, CAPEX_F64, 0) || d[0] != 0.3) return 9;
    if (capex_comm_allreduce(c, q, q, 1, CAPEX_I64, CAPEX_REDUCE_AVG) != CAPEX_ERR_INVALID_ARG) return 10;
    return 0;
}

static int exchange(capex_comm *c) {
    capex_nccl_unique_id id;
    capex_dist_env env;
    size_t i;
    capex_result r;
    if (capex_dist_env_read(NULL, &env)) return 20;
    for (i = 0; i < sizeof id.bytes; i++) id.bytes[i] = c->rank == 0 ? (unsigned char)(i * 5 + 1) : 0xee;
    if ((r = capex_nccl_exchange_unique_id(&env, c, &id, 10.0)) != CAPEX_OK) return 21;
    for (i = 0; i < sizeof id.bytes; i++) if (id.bytes[i] != (unsigned char)(i * 5 + 1)) return 22;
    /* rank 0 failed to make its id: zeros; the others must refuse at once */
    if (c->rank == 0) memset(&id, 0, sizeof id);
    r = capex_nccl_exchange_unique_id(&env, c, &id, 10.0);
    if (c->rank != 0 && (r != CAPEX_ERR_COMM || !strstr(capex_last_error(), "rank 0 could not"))) return 23;
    if (c->rank == 0 && r != CAPEX_OK) return 24;
    return 0;
}

int main(int argc, char **argv) {
    capex_comm c;
    int e;
    MPI_Init(&argc, &argv);
    if (capex_comm_init_mpi_world(&c) != CAPEX_OK) { printf("init: %s\n", capex_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
    c.timeout_s = 20.0;
    e = wide(&c);
    if (!e) e = exchange(&c);
    if (e) printf("rank %d FAILED check %d: %s\n", c.rank, e, capex_last_error());
    else printf("rank %d ok\n", c.rank);
    fflush(stdout);
    capex_comm_destroy(&c);
    MPI_Finalize();
    return e ? 1 : 0;
}

#else /* the driver, run by make test */
#define _POSIX_C_SOURCE 200809L
#include "capex_test.h"
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>

static char g_bin[1100], g_out[1100], g_skip[1300];

static int run_np(int np, char *out, size_t cap) {
    char cmd[4096];
    FILE *f;
    size_t n;
    int st;
    snprintf(cmd, sizeof cmd,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 60 mpirun --allow-run-as-root "
             "--oversubscribe --mca btl_vader_single_copy_mechanism none -np %d '%s' > '%s' 2>&1", np, g_bin, g_out);
    fflush(stdout);
    st = system(cmd);
    out[0] = '\0';
    if ((f = fopen(g_out, "rb")) != NULL) { n = fread(out, 1, cap - 1, f); out[n] = '\0'; fclose(f); }
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

static void check_np(ct_state *ct, int np) {
    static char out[16384];
    char want[32];
    int rc, r;
    if (g_skip[0]) CT_SKIP("%s", g_skip);
    rc = run_np(np, out, sizeof out);
    CT_CHECK(rc == 0, "np %d: exit %d:\n%.400s", np, rc, out);
    for (r = 0; r < np; r++) {
        snprintf(want, sizeof want, "rank %d ok", r);
        CT_CHECK(strstr(out, want) != NULL, "np %d: no '%s' in:\n%.400s", np, want, out);
    }
}

CT_TEST(mpi_wide_dtypes_and_id_exchange_np2) { check_np(ct, 2); }
CT_TEST(mpi_wide_dtypes_and_id_exchange_np3) { check_np(ct, 3); }

static const ct_case cases[] = {CT_CASE(mpi_wide_dtypes_and_id_exchange_np2), CT_CASE(mpi_wide_dtypes_and_id_exchange_np3)};

int main(int argc, char **argv) {
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash;
    if (n > 0) {
        exe[n] = '\0';
        if ((slash = strrchr(exe, '/')) != NULL) *slash = '\0';
        snprintf(g_bin, sizeof g_bin, "%s/mpi/test_nccl_mpi", exe);
        snprintf(g_out, sizeof g_out, "%s/test_nccl_mpi.out", exe);
    }
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        snprintf(g_skip, sizeof g_skip, "no mpirun on PATH (make ci-deps installs Open MPI)");
    else if (system("mpirun --version 2>&1 | grep -q 'Open MPI'") != 0)
        snprintf(g_skip, sizeof g_skip, "mpirun is not Open MPI (the flags used here are Open MPI's)");
    else if (access(g_bin, X_OK) != 0)
        snprintf(g_skip, sizeof g_skip, "%s not built (needs mpicc; make ci-deps installs Open MPI)", g_bin);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
#endif
