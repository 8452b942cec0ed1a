/* bench_norm: LayerNorm / RMSNorm forward and backward effective bandwidth on
   the CPU (bytes the op must move / time) against a memcpy of the same bytes
   (the roofline), for widths 1024..8192, 1 and 2 threads, in one run. Best of
   several repetitions.

       make bench-norm && build/bench/bench_norm [rows [max_threads]]   # 4096 rows, 2 threads

   Bytes per element that must move (f32): forward x r4 + y w4 = 8;
   backward x r4 + dy r4 + dx w4 = 12 (mean/rstd/weight/dweight per row or
   column are counted too). bf16 input/output: half of those for x, y, dy, dx.
   Pass "bwdme" is the memory-efficient backward (desc.memory_efficient: reads
   y, not x, and the bias too), the same 12 bytes per element.

       build/bench/bench_norm parts [threads]   # backward with part of its outputs

   "parts": the backward per output set (all; dx alone; dweight/dbias alone)
   on 4096x1024, 512x8192 and 64x65536, f32 and bf16, and BatchNorm forward +
   backward in both layouts, in ms (best of 7), to compare builds of capex.h
   against each other.

       build/bench/bench_norm noaffine [rows [cols [threads]]]   # no weight/bias, dx: bwd vs bwdme
       build/bench/bench_norm affine [rows [cols [threads]]]     # dweight alone, all outputs: bwd vs bwdme */
#define _POSIX_C_SOURCE 199309L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* memcpy of `bytes` split in read/write halves: the copy roofline (GB/s of read + write). */
static double copy_gbs(size_t bytes) {
    size_t half = bytes / 2;
    char *a = (char *)malloc(half), *b = (char *)malloc(half);
    double best = 1e30;
    int k;
    memset(a, 1, half); memset(b, 2, half);
    for (k = 0; k < 7; k++) {
        double t0 = now_s();
        memcpy(b, a, half);
        t0 = now_s() - t0;
        if (t0 < best) best = t0;
        a[k] = b[half - 1 - k]; /* keep the copy observable */
    }
    free(a); free(b);
    return 2.0 * (double)half / best / 1e9;
}

/* Backward time (best of 7) for one shape, dtype and output set (bits: 1 dx, 2 dweight and dbias, 4 dweight). */
static double bench_part(int rms, int me, int64_t rows, int64_t C, capex_dtype dt, int outs, int threads, int affine) {
    const int64_t N = rows * C;
    const size_t es = capex_dtype_size(dt);
    void *x = malloc((size_t)N * es), *y = malloc((size_t)N * es), *dy = malloc((size_t)N * es), *dx = malloc((size_t)N * es);
    float *w = (float *)malloc((size_t)C * 4), *b = (float *)malloc((size_t)C * 4);
    float *dw = (float *)malloc((size_t)C * 4), *db = (float *)malloc((size_t)C * 4);
    float *mean = (float *)malloc((size_t)rows * 4), *rstd = (float *)malloc((size_t)rows * 4);
    capex_norm_desc nd;
    capex_norm_args a;
    double best = 1e30;
    int64_t i;
    int k;
    for (i = 0; i < N; i++) {
        float v = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        if (dt == CAPEX_F32) { ((float *)x)[i] = v; ((float *)dy)[i] = -v; }
        else { ((uint16_t *)x)[i] = capex_f32_to_bf16(v); ((uint16_t *)dy)[i] = capex_f32_to_bf16(-v); }
    }
    for (i = 0; i < C; i++) { w[i] = 1.0f + (float)(i % 7) * 0.01f; b[i] = 0.01f * (float)(i % 5); }
    capex_norm_desc_init(&nd);
    nd.num_threads = threads;
    capex_norm_args_init(&a);
    a.rows = rows; a.cols = C; a.x_dtype = a.y_dtype = dt; a.x = x; a.y = y;
    a.weight = affine ? w : NULL; a.bias = affine && !rms ? b : NULL; a.mean = mean; a.rstd = rstd;
    if (rms) capex_rms_norm_forward(&nd, &a); else capex_layer_norm_forward(&nd, &a);
    nd.memory_efficient = me;
    a.dy = dy;
    a.dx = outs & 1 ? dx : NULL;
    a.dweight = outs & 6 && affine ? dw : NULL;
    a.dbias = outs & 2 && !rms ? db : NULL;
    for (k = 0; k < 7; k++) {
        double t0 = now_s();
        capex_result r = rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a);
        t0 = now_s() - t0;
        if (r != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); exit(1); }
        if (t0 < best) best = t0;
    }
    free(x); free(y); free(dy); free(dx); free(w); free(b); free(dw); free(db); free(mean); free(rstd);
    return best;
}

/* BatchNorm forward + backward time (best of 7), channels-last or NCS, f32. */
static double bench_bn(int64_t n, int64_t c, int64_t sp, int nsc, int threads) {
    const int64_t T = n * c * sp;
    float *x = (float *)malloc((size_t)T * 4), *y = (float *)malloc((size_t)T * 4), *dy = (float *)malloc((size_t)T * 4);
    float *dx = (float *)malloc((size_t)T * 4), *w = (float *)malloc((size_t)c * 4), *b = (float *)malloc((size_t)c * 4);
    float *sm = (float *)malloc((size_t)c * 4), *si = (float *)malloc((size_t)c * 4), *dw = (float *)malloc((size_t)c * 4);
    float *db = (float *)malloc((size_t)c * 4);
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    double best = 1e30;
    int64_t i;
    int k;
    for (i = 0; i < T; i++) { x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f; dy[i] = -x[i]; }
    for (i = 0; i < c; i++) { w[i] = 1.0f; b[i] = 0.0f; }
    capex_batch_norm_desc_init(&d);
    d.num_threads = threads;
    capex_batch_norm_args_init(&a);
    a.n = n; a.c = c; a.s = sp; a.layout = nsc ? CAPEX_BN_NSC : CAPEX_BN_NCS;
    a.x = x; a.y = y; a.weight = w; a.bias = b; a.save_mean = sm; a.save_invstd = si;
    a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
    for (k = 0; k < 7; k++) {
        double t0 = now_s();
        if (capex_batch_norm_forward(&d, NULL, &a) != CAPEX_OK || capex_batch_norm_backward(&d, NULL, &a) != CAPEX_OK) {
            fprintf(stderr, "%s\n", capex_last_error());
            exit(1);
        }
        t0 = now_s() - t0;
        if (t0 < best) best = t0;
    }
    free(x); free(y); free(dy); free(dx); free(w); free(b); free(sm); free(si); free(dw); free(db);
    return best;
}

static int bench_parts(int threads) {
    static const int64_t shapes[][2] = {{4096, 1024}, {512, 8192}, {64, 65536}};
    static const char *outn[] = {"", "dx", "dw", "all"};
    size_t si;
    int di, rms, outs;
    printf("# bench_norm parts: backward ms (best of 7), %d thread(s)\n", threads);
    printf("%-9s %-4s %-5s %12s %9s\n", "op", "outs", "dtype", "rows x cols", "ms");
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (di = 0; di < 2; di++)
            for (rms = 0; rms < 2; rms++)
                for (outs = 3; outs >= 1; outs--) {
                    const capex_dtype dt = di ? CAPEX_BF16 : CAPEX_F32;
                    double t = bench_part(rms, 0, shapes[si][0], shapes[si][1], dt, outs, threads, 1);
                    printf("%-9s %-4s %-5s %5lldx%-6lld %9.3f\n", rms ? "rmsnorm" : "layernorm", outn[outs],
                           di ? "bf16" : "f32", (long long)shapes[si][0], (long long)shapes[si][1], t * 1e3);
                    if (rms && outs == 3) {
                        t = bench_part(rms, 1, shapes[si][0], shapes[si][1], dt, outs, threads, 1);
                        printf("%-9s %-4s %-5s %5lldx%-6lld %9.3f\n", "rmsnormME", outn[outs], di ? "bf16" : "f32",
                               (long long)shapes[si][0], (long long)shapes[si][1], t * 1e3);
                    }
                    fflush(stdout);
                }
    for (si = 0; si < 2; si++) { /* n x c x s = 64 x 256 x 1024 (rows 65536 of 256 channels when channels-last) */
        printf("%-9s %-4s %-5s %12s %9.3f\n", "batchnorm", si ? "nsc" : "ncs", "f32", "64x256x1024",
               bench_bn(64, 256, 1024, (int)si, threads) * 1e3);
        fflush(stdout);
    }
    return 0;
}

/* Without weight and bias: the normal and memory-efficient backward, dx alone, f32 and bf16, LayerNorm
   and RMSNorm, in ms (best of 7). */
static int bench_noaffine(int64_t rows, int64_t C, int threads) {
    int di, rms, me;
    printf("# bench_norm noaffine: backward dx ms (best of 7), %lldx%lld, %d thread(s)\n", (long long)rows,
           (long long)C, threads);
    for (di = 0; di < 2; di++)
        for (rms = 0; rms < 2; rms++)
            for (me = 0; me < 2; me++) {
                printf("%-9s %-5s %-5s %9.3f\n", rms ? "rmsnorm" : "layernorm", me ? "bwdme" : "bwd", di ? "bf16" : "f32",
                       bench_part(rms, me, rows, C, di ? CAPEX_BF16 : CAPEX_F32, 1, threads, 0) * 1e3);
                fflush(stdout);
            }
    return 0;
}

/* Weight (and bias for LayerNorm; RMSNorm: weight alone): dweight alone (no dx, no dbias) and all outputs,
   the normal and memory-efficient backward, f32 and bf16, in ms (best of 7). */
static int bench_affine(int64_t rows, int64_t C, int threads) {
    int di, rms, me, all;
    printf("# bench_norm affine: backward ms (best of 7), %lldx%lld, %d thread(s)\n", (long long)rows, (long long)C,
           threads);
    for (all = 0; all < 2; all++)
        for (di = 0; di < 2; di++)
            for (rms = 0; rms < 2; rms++)
                for (me = 0; me < 2; me++) {
                    printf("%-9s %-5s %-3s %-5s %9.3f\n", rms ? "rmsnorm" : "layernorm", me ? "bwdme" : "bwd",
                           all ? "all" : "dw", di ? "bf16" : "f32",
                           bench_part(rms, me, rows, C, di ? CAPEX_BF16 : CAPEX_F32, all ? 3 : 4, threads, 1) * 1e3);
                    fflush(stdout);
                }
    return 0;
}

int main(int argc, char **argv) {
    static const int64_t widths[] = {1024, 2048, 4096, 8192};
    static const capex_dtype dts[] = {CAPEX_F32, CAPEX_BF16};
    int64_t rows;
    if (argc > 1 && strcmp(argv[1], "parts") == 0) return bench_parts(argc > 2 ? atoi(argv[2]) : 1);
    if (argc > 1 && strcmp(argv[1], "noaffine") == 0)
        return bench_noaffine(argc > 2 ? atoll(argv[2]) : 4096, argc > 3 ? atoll(argv[3]) : 1024,
                              argc > 4 ? atoi(argv[4]) : 1);
    if (argc > 1 && strcmp(argv[1], "affine") == 0)
        return bench_affine(argc > 2 ? atoll(argv[2]) : 4096, argc > 3 ? atoll(argv[3]) : 1024,
                            argc > 4 ? atoi(argv[4]) : 1);
    rows = argc > 1 ? atoll(argv[1]) : 4096;
    int max_threads = argc > 2 ? atoi(argv[2]) : 2;
    size_t wi, di;
    int threads, rms, bwd; /* bwd: 0 forward, 1 backward, 2 memory-efficient backward */
    printf("# bench_norm: rows=%lld; GB/s = bytes that must move / best time; copy = memcpy of the same bytes\n",
           (long long)rows);
    printf("%-9s %-5s %-5s %6s %3s %9s %9s %7s\n", "op", "pass", "dtype", "width", "thr", "ms", "GB/s", "vs copy");
    for (di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            const int64_t C = widths[wi], N = rows * C;
            const capex_dtype dt = dts[di];
            const size_t es = capex_dtype_size(dt);
            void *x = malloc((size_t)N * es), *y = malloc((size_t)N * es), *dy = malloc((size_t)N * es),
                 *dx = malloc((size_t)N * es);
            float *w = (float *)malloc((size_t)C * 4), *b = (float *)malloc((size_t)C * 4);
            float *dw = (float *)malloc((size_t)C * 4), *db = (float *)malloc((size_t)C * 4);
            float *mean = (float *)malloc((size_t)rows * 4), *rstd = (float *)malloc((size_t)rows * 4);
            int64_t i;
            for (i = 0; i < N; i++) {
                float v = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
                if (dt == CAPEX_F32) { ((float *)x)[i] = v; ((float *)dy)[i] = -v; }
                else { ((uint16_t *)x)[i] = capex_f32_to_bf16(v); ((uint16_t *)dy)[i] = capex_f32_to_bf16(-v); }
            }
            for (i = 0; i < C; i++) { w[i] = 1.0f + (float)(i % 7) * 0.01f; b[i] = 0.01f * (float)(i % 5); }
            for (rms = 0; rms < 2; rms++)
                for (bwd = 0; bwd < 3; bwd++)
                    for (threads = 1; threads <= max_threads; threads++) {
                        capex_norm_desc nd;
                        capex_norm_args a;
                        double best = 1e30, bytes, gbs, roof;
                        int k;
                        capex_norm_desc_init(&nd);
                        nd.num_threads = threads;
                        nd.memory_efficient = bwd == 2;
                        capex_norm_args_init(&a);
                        a.rows = rows; a.cols = C; a.x_dtype = a.y_dtype = dt; a.x = x; a.y = y;
                        a.weight = w; a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd;
                        a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
                        if (rms) capex_rms_norm_forward(&nd, &a); else capex_layer_norm_forward(&nd, &a);
                        for (k = 0; k < 5; k++) {
                            double t0 = now_s();
                            capex_result r = bwd ? (rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a))
                                                 : (rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a));
                            t0 = now_s() - t0;
                            if (r != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
                            if (t0 < best) best = t0;
                        }
                        bytes = (double)N * (double)es * (bwd ? 3.0 : 2.0) + (double)rows * 8.0 +
                                (double)C * 4.0 * (bwd ? (rms ? 2.0 : 3.0 + (bwd == 2)) : (rms ? 1.0 : 2.0));
                        gbs = bytes / best / 1e9;
                        roof = copy_gbs((size_t)bytes);
                        printf("%-9s %-5s %-5s %6lld %3d %9.3f %9.2f %6.0f%%\n", rms ? "rmsnorm" : "layernorm",
                               bwd == 2 ? "bwdme" : bwd ? "bwd" : "fwd", dt == CAPEX_F32 ? "f32" : "bf16", (long long)C, threads,
                               best * 1e3, gbs, 100.0 * gbs / roof);
                        fflush(stdout);
                    }
            free(x); free(y); free(dy); free(dx); free(w); free(b); free(dw); free(db); free(mean); free(rstd);
        }
    return 0;
}
