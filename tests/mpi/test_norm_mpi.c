/* SyncBatchNorm over MPI (build: mpicc -DCAPEX_MPI; run: mpirun -np 2 / -np 3
   --oversubscribe; tests/test_norm_mpirun.c does both). Every rank makes the
   same global batch, takes its own unequal slice (one rank gets an empty
   slice in one case), runs SyncBatchNorm forward + backward over
   capex_comm_init_mpi_world, and compares with BatchNorm on the whole batch
   computed locally: y, dx, save_mean/invstd, running statistics, and the
   allreduced sum of the ranks' dweight/dbias, all within fp32 tolerance.
   Rank 0 prints "norm-mpi-summary: N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#ifndef CAPEX_MPI
#define CAPEX_MPI
#endif
#define CAPEX_IMPLEMENTATION
#include "../../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int g_rank, g_world;
static char g_why[512];
#define CHECK(cond, ...) do { if (!(cond)) { snprintf(g_why, sizeof g_why, __VA_ARGS__); return 1; } } while (0)

static float val(uint64_t i) { /* deterministic in [-1, 1) */
    i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    i ^= i >> 31;
    i *= 0x94d049bb133111ebull;
    i ^= i >> 29;
    return (float)((double)(i >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float getf(capex_dtype t, const void *p, int64_t i) {
    if (t == CAPEX_F32) return ((const float *)p)[i];
    if (t == CAPEX_F16) return capex_f16_to_f32(((const uint16_t *)p)[i]);
    return capex_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void setf(capex_dtype t, void *p, int64_t i, float v) {
    if (t == CAPEX_F32) ((float *)p)[i] = v;
    else if (t == CAPEX_F16) ((uint16_t *)p)[i] = capex_f32_to_f16(v);
    else ((uint16_t *)p)[i] = capex_f32_to_bf16(v);
}

/* batch of rank r: sizes[r % 5], or 0 for rank 1 when `empty` */
static int64_t batch_of(int r, int empty) {
    static const int64_t sizes[5] = {3, 5, 2, 7, 1};
    return empty && r == 1 ? 0 : sizes[r % 5];
}

static int run_case(capex_comm *comm, capex_bn_layout lay, capex_dtype xt, int empty) {
    const int64_t C = 6, S = 5;
    int64_t N = 0, off = 0, i, ch, n = batch_of(g_rank, empty);
    int r;
    size_t es = capex_dtype_size(xt);
    float w[6], b[6], rm[6], rv[6], sm[6], si[6], dw[6], db[6];
    float rmc[6], rvc[6], smc[6], sic[6], dwc[6], dbc[6], sums[12];
    void *x, *dy, *y, *dx, *yc, *dxc;
    capex_batch_norm_args a, ca;
    capex_result res;
    for (r = 0; r < g_world; r++) { if (r < g_rank) off += batch_of(r, empty); N += batch_of(r, empty); }
    x = calloc((size_t)(N * C * S), es); dy = calloc((size_t)(N * C * S), es);
    y = calloc((size_t)(N * C * S), es); dx = calloc((size_t)(N * C * S), es);
    yc = calloc((size_t)(N * C * S), es); dxc = calloc((size_t)(N * C * S), es);
    for (i = 0; i < N * C * S; i++) { setf(xt, x, i, 2.0f + 3.0f * val((uint64_t)i)); setf(xt, dy, i, val(1000000u + (uint64_t)i)); }
    for (ch = 0; ch < C; ch++) {
        w[ch] = 1.0f + 0.5f * val(5000u + (uint64_t)ch); b[ch] = val(6000u + (uint64_t)ch);
        rm[ch] = rmc[ch] = 0.0f; rv[ch] = rvc[ch] = 1.0f;
    }
    /* reference: the concatenated batch, no comm */
    capex_batch_norm_args_init(&ca);
    ca.n = N; ca.c = C; ca.s = S; ca.layout = lay; ca.x_dtype = ca.y_dtype = xt;
    ca.x = x; ca.y = yc; ca.weight = w; ca.bias = b; ca.running_mean = rmc; ca.running_var = rvc;
    ca.save_mean = smc; ca.save_invstd = sic; ca.dy = dy; ca.dx = dxc; ca.dweight = dwc; ca.dbias = dbc;
    CHECK(capex_batch_norm_forward(NULL, NULL, &ca) == CAPEX_OK, "reference forward: %.400s", capex_last_error());
    CHECK(capex_batch_norm_backward(NULL, NULL, &ca) == CAPEX_OK, "reference backward: %.400s", capex_last_error());
    /* this rank's slice */
    capex_batch_norm_args_init(&a);
    a.n = n; a.c = C; a.s = S; a.layout = lay; a.x_dtype = a.y_dtype = xt;
    a.x = n ? (char *)x + (size_t)(off * C * S) * es : NULL;
    a.y = n ? (char *)y + (size_t)(off * C * S) * es : NULL;
    a.dy = n ? (char *)dy + (size_t)(off * C * S) * es : NULL;
    a.dx = n ? (char *)dx + (size_t)(off * C * S) * es : NULL;
    a.weight = w; a.bias = b; a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si;
    a.dweight = dw; a.dbias = db;
    res = capex_batch_norm_forward(NULL, comm, &a);
    CHECK(res == CAPEX_OK, "sync forward: %.400s", capex_last_error());
    res = capex_batch_norm_backward(NULL, comm, &a);
    CHECK(res == CAPEX_OK, "sync backward: %.400s", capex_last_error());
    CHECK(a.total_count == N * S, "total_count %lld, want %lld", (long long)a.total_count, (long long)(N * S));
    for (ch = 0; ch < C; ch++) {
        CHECK(fabsf(sm[ch] - smc[ch]) <= 1e-5f * (1 + fabsf(smc[ch])), "mean[%lld] %g vs %g", (long long)ch,
              (double)sm[ch], (double)smc[ch]);
        CHECK(fabsf(si[ch] - sic[ch]) <= 1e-5f * sic[ch], "invstd[%lld] %g vs %g", (long long)ch, (double)si[ch],
              (double)sic[ch]);
        CHECK(fabsf(rm[ch] - rmc[ch]) <= 1e-5f && fabsf(rv[ch] - rvc[ch]) <= 1e-5f, "running stats[%lld]", (long long)ch);
        sums[ch] = dw[ch]; sums[C + ch] = db[ch];
    }
    {   /* what DDP would do with the parameter grads: sum the ranks' shares */
        float tot[12];
        CHECK(capex_comm_allreduce(comm, sums, tot, 12, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK, "allreduce");
        for (ch = 0; ch < C; ch++)
            CHECK(fabsf(tot[ch] - dwc[ch]) <= 1e-4f * (1 + fabsf(dwc[ch])) &&
                  fabsf(tot[C + ch] - dbc[ch]) <= 1e-4f * (1 + fabsf(dbc[ch])),
                  "dweight/dbias[%lld]: %g %g vs %g %g", (long long)ch, (double)tot[ch], (double)tot[C + ch],
                  (double)dwc[ch], (double)dbc[ch]);
    }
    for (i = off * C * S; i < (off + n) * C * S; i++) {
        float tol = xt == CAPEX_F32 ? 2e-5f : xt == CAPEX_F16 ? 2e-3f : 1.6e-2f;
        float gy = getf(xt, y, i), wy = getf(xt, yc, i), gx = getf(xt, dx, i), wx = getf(xt, dxc, i);
        CHECK(fabsf(gy - wy) <= tol * (1 + fabsf(wy)), "y[%lld] %g vs %g", (long long)i, (double)gy, (double)wy);
        CHECK(fabsf(gx - wx) <= 5 * tol * (1 + fabsf(wx)), "dx[%lld] %g vs %g", (long long)i, (double)gx, (double)wx);
    }
    free(x); free(dy); free(y); free(dx); free(yc); free(dxc);
    return 0;
}

int main(int argc, char **argv) {
    capex_comm comm;
    int passed = 0, failed = 0, lay, ti, empty;
    static const capex_dtype ts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    if (capex_comm_init_mpi_world(&comm) != CAPEX_OK) {
        fprintf(stderr, "rank %d: capex_comm_init_mpi_world: %s\n", g_rank, capex_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    comm.timeout_s = 60;
    for (empty = 0; empty < 2; empty++)
        for (lay = 0; lay < 2; lay++)
            for (ti = 0; ti < 3; ti++) {
                int bad = run_case(&comm, (capex_bn_layout)lay, ts[ti], empty), any = 0;
                MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
                if (bad) printf("norm-mpi: rank %d FAIL layout %d dtype %s empty %d: %s\n", g_rank, lay,
                                capex_dtype_name(ts[ti]), empty, g_why);
                if (g_rank == 0) {
                    printf("norm-mpi: %s syncbn np=%d layout=%s dtype=%s%s\n", any ? "FAIL" : "ok  ", g_world,
                           lay ? "NSC" : "NCS", capex_dtype_name(ts[ti]), empty ? " (rank 1 empty)" : "");
                }
                if (any) failed++; else passed++;
                fflush(stdout);
            }
    if (g_rank == 0) printf("norm-mpi-summary: %d passed, %d failed\n", passed, failed);
    fflush(stdout);
    capex_comm_destroy(&comm);
    MPI_Finalize();
    return failed ? 1 : 0;
}
