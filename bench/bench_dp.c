/* bench_dp.c - CPU data parallel over MPI: capex_ddp step time with buckets
   reducing during backward (overlap) against delay_allreduce (everything at
   finalize), a bucket-size sweep, and the allreduce bus bandwidth.

       mpicc -std=c99 -O2 -DCAPEX_MPI bench/bench_dp.c -o build/bench_dp -lm
       mpirun -np 2 build/bench_dp            (or: make bench-dp)

   The synthetic model: L layers of P f32 parameters each. Backward visits
   the layers last to first; layer l's gradient costs K multiply-adds per
   element (compute proportional to size) and is then handed to
   capex_ddp_grad_ready, as an engine's autograd hook would. A step is
   backward + finalize + zero_grad; its time is the slowest rank's (MPI MAX),
   median of the measured steps. "compute only" is backward without any
   communication: the floor overlap can approach. Bus bandwidth is NCCL-tests'
   busbw = bytes * 2 (n - 1) / n / time for capex_comm_allreduce (MPI).
   hidden = (delay_allreduce step - overlap step) / (delay_allreduce step -
   compute only): the share of the communication time that overlap hid
   behind backward (0: none, 1: all; negative: overlap cost time).
   Prints a markdown table on rank 0. Options: -L layers, -P params per layer,
   -K work per element, -s steps, -q (quick: fewer sizes), -a (allreduce
   table only), -t PORT (also the TCP comm on 127.0.0.1:PORT, ring and
   star, against MPI_Allreduce). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int L = 16, K = 4, STEPS = 5;
static size_t P = 128 * 1024; /* 16 x 512 KiB = 8 MiB of f32 grads */

static double max_all(double x) { double y = x; MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return y; }
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_d); return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

/* g = f(x, layer, rank): K dependent multiply-adds per element. */
static void layer_backward(float *g, const float *x, size_t n, int layer, int rank) {
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        float a = x[i], s = 0.0f;
        for (k = 0; k < K; k++) s = s * 0.999f + a * (float)(k + layer + rank + 1) * 1e-3f;
        g[i] = s;
    }
}

/* One measured configuration: returns the median step time (s) over ranks. */
static double run_steps(capex_comm *comm, float **w, size_t bucket_bytes, int delay, int communicate, capex_ddp_stats *st) {
    capex_ddp *ddp = NULL;
    capex_ddp_param *ps = (capex_ddp_param *)malloc(sizeof *ps * (size_t)L);
    capex_ddp_desc dd;
    float **own = NULL;
    double t[64];
    int s, l;
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = dd.bucket_bytes = bucket_bytes;
    dd.delay_allreduce = delay;
    dd.broadcast_parameters = 0;
    for (l = 0; l < L; l++) { ps[l].data = w[l]; ps[l].numel = P; ps[l].dtype = CAPEX_F32; ps[l].grad = NULL; }
    if (communicate) {
        if (capex_ddp_create(&ddp, comm, ps, (size_t)L, &dd) != CAPEX_OK) {
            fprintf(stderr, "ddp_create: %s\n", capex_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    } else {
        own = (float **)malloc(sizeof *own * (size_t)L);
        for (l = 0; l < L; l++) own[l] = (float *)calloc(P, sizeof(float));
    }
    for (s = 0; s < STEPS + 1; s++) {
        double t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = capex_dist_now();
        for (l = L - 1; l >= 0; l--) {
            float *g = communicate ? (float *)capex_ddp_grad(ddp, (size_t)l) : own[l];
            layer_backward(g, w[l], P, l, comm->rank);
            if (communicate && capex_ddp_grad_ready(ddp, (size_t)l) != CAPEX_OK) MPI_Abort(MPI_COMM_WORLD, 2);
        }
        if (communicate) {
            if (capex_ddp_finalize(ddp) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); MPI_Abort(MPI_COMM_WORLD, 3); }
            capex_ddp_zero_grad(ddp);
        }
        t[s] = max_all(capex_dist_now() - t0);
    }
    if (communicate) { capex_ddp_get_stats(ddp, st); capex_ddp_destroy(ddp); }
    else { for (l = 0; l < L; l++) free(own[l]); free(own); }
    free(ps);
    return median(t + 1, STEPS); /* the first step warms caches and MPI */
}

int main(int argc, char **argv) {
    capex_comm comm;
    float **w;
    int l, i, quick = 0, only_ar = 0, tcp_port = 0, np, rank;
    char host[256] = "";
    static const size_t sweep[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
    size_t ns = sizeof sweep / sizeof sweep[0];
    MPI_Init(&argc, &argv);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-L") && i + 1 < argc) L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-P") && i + 1 < argc) P = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-K") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) STEPS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-q")) quick = 1;
        else if (!strcmp(argv[i], "-a")) only_ar = 1;
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) tcp_port = atoi(argv[++i]);
    }
    if (L < 1 || L > 4096 || P < 1 || K < 1 || STEPS < 1 || STEPS > 63) { fprintf(stderr, "bad options\n"); MPI_Finalize(); return 2; }
    if (capex_comm_init_mpi_world(&comm) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
    comm.timeout_s = 120.0;
    np = comm.world_size;
    rank = comm.rank;
    w = (float **)malloc(sizeof *w * (size_t)L);
    for (l = 0; l < L; l++) {
        w[l] = (float *)malloc(P * sizeof(float));
        for (i = 0; i < (int)P; i++) w[l][i] = (float)((i * 7 + l) % 13) * 0.1f;
    }
    gethostname(host, sizeof host - 1);
    if (rank == 0 && !only_ar) {
        printf("### np %d: %d layers x %lu f32 params (%.1f MiB of grads), %d multiply-adds per element, median of %d steps\n\n",
               np, L, (unsigned long)P, (double)L * (double)P * 4.0 / 1048576.0, K, STEPS);
        printf("| bucket | overlap step ms | delay_allreduce step ms | overlap gain | hidden | buckets | launched in backward |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    if (!only_ar) {
        capex_ddp_stats st;
        double compute = run_steps(&comm, w, (size_t)25 << 20, 0, 0, &st);
        size_t k;
        for (k = 0; k < ns; k++) {
            capex_ddp_stats so, sd;
            double to, td;
            if (quick && (k == 1 || k == 3)) continue;
            to = run_steps(&comm, w, sweep[k], 0, 1, &so);
            td = run_steps(&comm, w, sweep[k], 1, 1, &sd);
            if (rank == 0) {
                char b[32];
                if (sweep[k] >= (1u << 20)) snprintf(b, sizeof b, "%lu MiB", (unsigned long)(sweep[k] >> 20));
                else snprintf(b, sizeof b, "%lu KiB", (unsigned long)(sweep[k] >> 10));
                printf("| %s | %.1f | %.1f | %.2fx | %.0f%% | %lu | %lu/%lu |\n", b, to * 1e3, td * 1e3, td / to,
                       td > compute ? 100.0 * (td - to) / (td - compute) : 0.0,
                       (unsigned long)(so.launches / (STEPS + 1)), (unsigned long)(so.launched_in_backward / (STEPS + 1)),
                       (unsigned long)(so.launches / (STEPS + 1)));
            }
        }
        if (rank == 0) printf("\ncompute only (backward, no communication): %.1f ms per step\n\n", compute * 1e3);
    }
    /* allreduce bus bandwidth (MPI through capex_comm_allreduce, f32 SUM, in place) */
    if (rank == 0)
        printf("| allreduce size | capex ms | capex busbw GB/s | MPI_Allreduce ms | MPI_Allreduce busbw GB/s | capex / MPI |\n"
               "|---:|---:|---:|---:|---:|---:|\n");
    {
        size_t bytes;
        for (bytes = (size_t)64 << 10; bytes <= ((size_t)64 << 20); bytes *= quick ? 16 : 4) {
            size_t n = bytes / 4;
            float *x = (float *)calloc(n, sizeof(float));
            double t[16], u[16], med, mu;
            int it, iters = bytes >= ((size_t)16 << 20) ? 6 : 14;
            for (it = 0; it < iters + 1; it++) {
                double t0;
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = capex_dist_now();
                if (capex_comm_allreduce(&comm, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) MPI_Abort(MPI_COMM_WORLD, 4);
                t[it] = max_all(capex_dist_now() - t0);
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = capex_dist_now(); /* the peer: a blocking MPI_Allreduce (MPI's own progress loop) */
                MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                u[it] = max_all(capex_dist_now() - t0);
            }
            med = median(t + 1, iters);
            mu = median(u + 1, iters);
            if (rank == 0) {
                double f = 2.0 * (np - 1) / np / 1e9 * (double)bytes;
                printf("| %lu KiB | %.3f | %.2f | %.3f | %.2f | %.2f |\n", (unsigned long)(bytes >> 10), med * 1e3, f / med,
                       mu * 1e3, f / mu, med / mu);
            }
            free(x);
        }
    }
    if (rank == 0) printf("\n");
    if (tcp_port > 0) { /* the TCP comm on loopback: ring (auto) and star forced, against MPI_Allreduce */
        capex_dist_env env;
        capex_comm tc;
        size_t bytes;
        memset(&env, 0, sizeof env);
        env.rank = rank; env.world_size = np; env.local_rank = rank; env.local_world_size = np;
        strcpy(env.master_addr, "127.0.0.1");
        env.master_port = tcp_port;
        strcpy(env.run_id, "bench_dp");
        if (capex_comm_init_tcp(&tc, &env, 30.0) != CAPEX_OK) { fprintf(stderr, "tcp: %s\n", capex_last_error()); MPI_Abort(MPI_COMM_WORLD, 5); }
        tc.timeout_s = 120.0;
        if (rank == 0)
            printf("| allreduce size | MPI_Allreduce ms | capex TCP ms | TCP busbw GB/s | TCP / MPI | TCP star only ms |\n"
                   "|---:|---:|---:|---:|---:|---:|\n");
        for (bytes = (size_t)64 << 10; bytes <= ((size_t)64 << 20); bytes *= quick ? 16 : 4) {
            size_t n = bytes / 4;
            float *x = (float *)calloc(n, sizeof(float));
            double t[16], u[16], v[16];
            int it, iters = bytes >= ((size_t)16 << 20) ? 6 : 14;
            capex__tcp *ti = (capex__tcp *)tc.impl;
            for (it = 0; it < iters + 1; it++) {
                double t0;
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = capex_dist_now();
                MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                u[it] = max_all(capex_dist_now() - t0);
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = capex_dist_now();
                if (capex_comm_allreduce(&tc, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) MPI_Abort(MPI_COMM_WORLD, 6);
                t[it] = max_all(capex_dist_now() - t0);
                MPI_Barrier(MPI_COMM_WORLD);
                ti->ring = 0; /* the star, for comparison */
                t0 = capex_dist_now();
                if (capex_comm_allreduce(&tc, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) MPI_Abort(MPI_COMM_WORLD, 7);
                v[it] = max_all(capex_dist_now() - t0);
                ti->ring = 1;
            }
            if (rank == 0) {
                double mt = median(t + 1, iters), mu = median(u + 1, iters), mv = median(v + 1, iters);
                double f = 2.0 * (np - 1) / np / 1e9 * (double)bytes;
                printf("| %lu KiB | %.3f | %.3f | %.2f | %.2f | %.3f |\n", (unsigned long)(bytes >> 10), mu * 1e3, mt * 1e3,
                       f / mt, mt / mu, mv * 1e3);
            }
            free(x);
        }
        if (rank == 0) printf("\n");
        capex_comm_destroy(&tc);
    }
    for (l = 0; l < L; l++) free(w[l]);
    free(w);
    capex_comm_destroy(&comm);
    MPI_Finalize();
    return 0;
}
