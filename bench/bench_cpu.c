/* bench_cpu: the machine's copy bandwidth and each fused op's effective
   bandwidth (bytes the op must move / time), in one run, for 1M, 10M and 100M
   elements with 1 and 2 threads. Best of several repetitions.

       make bench-cpu          # builds build/bench/bench_cpu (-O3, -march=native if available)
       build/bench/bench_cpu [max_elements [name part]]   # e.g. 10000000 f16: skip 100M, fp16 rows

   Adding an op: write `static void run_x(bench_ctx *c)` that calls capex on
   c->list[0..nbuf-1] with &c->desc, and add a row to k_ops with the dtypes of
   its buffers and, per buffer, 'r' (read), 'w' (written) or 'b' (both): the
   byte count is derived from that. Buffers start as small finite values. */
#define _POSIX_C_SOURCE 199309L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXBUF 6
#define TENSOR_ELEMS 4000000 /* buffers are split into tensors of this size, like a model */

typedef struct bench_ctx {
    int nbuf;
    capex_tensor_list list[MAXBUF];
    capex_tensor_op_desc desc;
    int found_inf;
    float out[4];
} bench_ctx;

typedef struct bench_op {
    const char *name;
    int nbuf;
    capex_dtype dt[MAXBUF];
    const char *rw; /* per buffer: r, w or b */
    void (*run)(bench_ctx *c);
} bench_op;

/* ---- ops ---------------------------------------------------------------- */
static void run_scale(bench_ctx *c) { capex_multi_tensor_scale(&c->desc, &c->list[0], &c->list[c->nbuf - 1], 0.5f, &c->found_inf); }
static void run_scale_inplace(bench_ctx *c) { capex_multi_tensor_scale(&c->desc, &c->list[0], &c->list[0], 1.0f, &c->found_inf); }
static void run_axpby(bench_ctx *c) {
    capex_multi_tensor_axpby(&c->desc, 0.5f, &c->list[0], 0.25f, &c->list[1], &c->list[2], -1, &c->found_inf);
}
static void run_l2norm(bench_ctx *c) { capex_multi_tensor_l2norm(&c->desc, &c->list[0], &c->out[0], NULL); }
static void run_clip(bench_ctx *c) { /* always clips (max_norm tiny, coef ~ 1: values stay finite) */
    capex_clip_grad_norm(&c->desc, &c->list[0], 1, 1e-30f, &c->out[0]);
}

/* Optimizers (OPTIM section). One optimizer per buffer set and thread count,
   cached across repetitions (creating one zeroes the moments). Bytes per
   element that must move: AdamW f32 28 (g r4, p/m/v r4+w4); AdamW master +
   bf16 grads + bf16 model 28 (g r2, p/m/v r4+w4, model w2); LAMB f32 28 + 4
   (the global grad-norm pass reads g again); SGD momentum f32 20. LAMB's second
   pass (m, v, p again after the per-tensor norms) is counted as overhead, not
   as bytes. */
static capex_optim *optim_get(bench_ctx *c, capex_optim_kind kind, int has_model) {
    static capex_optim *cached = NULL;
    static const void *key = NULL;
    static int key_threads = -1, key_kind = -1;
    const capex_tensor_list *L = c->list;
    size_t t, n = L[0].count;
    capex_optim_desc d;
    capex_optim_param *ps;
    if (cached && key == L[1].tensors[0].data && key_threads == c->desc.num_threads && key_kind == (int)kind)
        return cached;
    capex_optim_destroy(cached);
    cached = NULL;
    capex_optim_desc_init(&d, kind);
    d.exec = c->desc;
    if (kind == CAPEX_OPTIM_SGD) d.defaults.momentum = 0.9f;
    d.defaults.weight_decay = 0.01f;
    ps = (capex_optim_param *)malloc(n * sizeof *ps);
    for (t = 0; t < n; t++) {
        capex_optim_param_init(&ps[t]);
        ps[t].grad = L[0].tensors[t].data; ps[t].grad_dtype = L[0].dtype;
        ps[t].param = (float *)L[1].tensors[t].data; ps[t].numel = L[1].tensors[t].numel;
        ps[t].exp_avg = (float *)L[2].tensors[t].data;
        if (kind != CAPEX_OPTIM_SGD) ps[t].exp_avg_sq = (float *)L[3].tensors[t].data;
        if (has_model) { /* the model copy is the last buffer (SGD has no exp_avg_sq) */
            ps[t].model = L[c->nbuf - 1].tensors[t].data; ps[t].model_dtype = L[c->nbuf - 1].dtype;
        }
    }
    if (capex_optim_create(&d, &cached) != CAPEX_OK || capex_optim_add_group(cached, NULL, ps, n, NULL) != CAPEX_OK) {
        fprintf(stderr, "optimizer setup failed: %s\n", capex_last_error());
        exit(1);
    }
    free(ps);
    key = L[1].tensors[0].data; key_threads = c->desc.num_threads; key_kind = (int)kind;
    return cached;
}
static void run_adamw(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_ADAM, 0), 1.0f, 1.0f, 0); }
static void run_adamw_o2(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_ADAM, 1), 1.0f, 1.0f, 0); }
static void run_lamb(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_LAMB, 0), 1.0f, 1.0f, 0); }
static void run_sgd(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_SGD, 0), 1.0f, 1.0f, 0); }
static void run_lamb_o2(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_LAMB, 1), 1.0f, 1.0f, 0); }
static void run_sgd_o2(bench_ctx *c) { capex_optim_step(optim_get(c, CAPEX_OPTIM_SGD, 1), 1.0f, 1.0f, 0); }

static const bench_op k_ops[] = {
    {"unscale f32 in place", 1, {CAPEX_F32}, "b", run_scale_inplace},
    {"unscale f16->f32", 2, {CAPEX_F16, CAPEX_F32}, "rw", run_scale},
    {"unscale bf16->f32", 2, {CAPEX_BF16, CAPEX_F32}, "rw", run_scale},
    {"copy f32->bf16 (scale)", 2, {CAPEX_F32, CAPEX_BF16}, "rw", run_scale},
    {"axpby f32,f32->f32", 3, {CAPEX_F32, CAPEX_F32, CAPEX_F32}, "rrw", run_axpby},
    {"l2norm f32", 1, {CAPEX_F32}, "r", run_l2norm},
    {"l2norm bf16", 1, {CAPEX_BF16}, "r", run_l2norm},
    {"l2norm f16", 1, {CAPEX_F16}, "r", run_l2norm},
    {"clip_grad_norm f32", 1, {CAPEX_F32}, "b", run_clip}, /* norm pass reads: counted below */
    {"AdamW f32", 4, {CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_F32}, "rbbb", run_adamw},
    {"AdamW master+bf16 (bf16 g)", 5, {CAPEX_BF16, CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_BF16}, "rbbbw", run_adamw_o2},
    {"AdamW master+f16 (f16 g)", 5, {CAPEX_F16, CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_F16}, "rbbbw", run_adamw_o2},
    {"LAMB f32", 4, {CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_F32}, "rbbb", run_lamb},
    {"LAMB master+bf16 (bf16 g)", 5, {CAPEX_BF16, CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_BF16}, "rbbbw", run_lamb_o2},
    {"LAMB master+f16 (f16 g)", 5, {CAPEX_F16, CAPEX_F32, CAPEX_F32, CAPEX_F32, CAPEX_F16}, "rbbbw", run_lamb_o2},
    {"SGD momentum f32", 3, {CAPEX_F32, CAPEX_F32, CAPEX_F32}, "rbb", run_sgd},
    {"SGD mom. master+bf16", 4, {CAPEX_BF16, CAPEX_F32, CAPEX_F32, CAPEX_BF16}, "rbbw", run_sgd_o2},
    {"SGD mom. master+f16", 4, {CAPEX_F16, CAPEX_F32, CAPEX_F32, CAPEX_F16}, "rbbw", run_sgd_o2},
};
/* extra bytes per element beyond the rw string (clip reads once for the norm) */
static double extra_bytes(const bench_op *op) { return op->run == run_clip || op->run == run_lamb ? 4.0 : op->run == run_lamb_o2 ? 2.0 : 0.0; }

/* ---- timing --------------------------------------------------------------- */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* process CPU time: cpu% = cpu / (wall * threads) shows how much of the
   machine the run got (well under 100%: other work was running) */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int reps_for(int64_t n) { return n <= 1000000 ? 30 : n <= 10000000 ? 6 : 3; }

static void copy_loop(float *restrict d, const float *restrict s, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) d[i] = s[i];
}
/* best seconds for copying n floats with t threads, memcpy (which=0) or loop (1) */
static double time_copy(float *d, const float *s, int64_t n, int t, int which, double *cpu) {
    double best = 1e30;
    int r, reps = reps_for(n);
    for (r = 0; r < reps; r++) {
        double t0 = now(), c0 = cpu_now(), dt;
        int k;
#ifdef _OPENMP
#pragma omp parallel for num_threads(t) schedule(static)
#endif
        for (k = 0; k < t; k++) {
            int64_t lo = n * k / t, hi = n * (k + 1) / t;
            if (which == 0) memcpy(d + lo, s + lo, (size_t)(hi - lo) * 4);
            else copy_loop(d + lo, s + lo, hi - lo);
        }
        dt = now() - t0;
        if (dt < best) { best = dt; *cpu = cpu_now() - c0; }
    }
#ifndef _OPENMP
    (void)t;
#endif
    return best;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) { fprintf(stderr, "bench_cpu: out of memory (%zu bytes)\n", n); exit(1); }
    return p;
}

int main(int argc, char **argv) {
    static const int64_t sizes[3] = {1000000, 10000000, 100000000};
    static const int threads[2] = {1, 2};
    int64_t maxn = argc > 1 ? atoll(argv[1]) : 100000000;
    double copy_gbs[3][2];
    double t_start = now();
    int si, ti;
    size_t oi;
#ifdef _OPENMP
    const char *omp = "with OpenMP";
#else
    const char *omp = "without OpenMP (thread counts have no effect)";
#endif
    printf("capex bench_cpu %s, built %s; best of 30/6/3 reps for 1M/10M/100M\n", CAPEX_VERSION_STRING, omp);
    {
        FILE *la = fopen("/proc/loadavg", "r");
        char buf[64] = "";
        if (la) { if (!fgets(buf, sizeof buf, la)) buf[0] = 0; fclose(la); }
        if (buf[0]) printf("load average at start: %s", buf); /* other work on the machine makes numbers noisy */
    }
    printf("GB/s = bytes the op must move / time (1 GB = 1e9 B); ratio = GB/s / copy GB/s (same size, same threads)\n\n");
    printf("cpu%% = process CPU time / (wall time * threads) of the best rep (meaningful above ~10 ms): well below 100, other work shared the cores\n");
    printf("%-26s %10s %3s %10s %9s %7s %5s\n", "op", "elements", "thr", "ms", "GB/s", "ratio", "cpu%");
    for (si = 0; si < 3; si++) {
        int64_t n = sizes[si];
        float *a, *b;
        if (n > maxn) continue;
        a = (float *)xmalloc((size_t)n * 4);
        b = (float *)xmalloc((size_t)n * 4);
        memset(a, 0, (size_t)n * 4);
        memset(b, 0, (size_t)n * 4);
        for (ti = 0; ti < 2; ti++) {
            double cm = 0, cl = 0;
            double tm = time_copy(b, a, n, threads[ti], 0, &cm), tl = time_copy(b, a, n, threads[ti], 1, &cl);
            double gm = 8.0 * (double)n / tm / 1e9, gl = 8.0 * (double)n / tl / 1e9;
            copy_gbs[si][ti] = gm > gl ? gm : gl;
            printf("%-26s %10lld %3d %10.3f %9.2f %7s %5.0f\n", "copy memcpy", (long long)n, threads[ti], tm * 1e3, gm, "-",
                   100.0 * cm / (tm * threads[ti]));
            printf("%-26s %10lld %3d %10.3f %9.2f %7s %5.0f\n", "copy C loop", (long long)n, threads[ti], tl * 1e3, gl, "-",
                   100.0 * cl / (tl * threads[ti]));
        }
        free(a);
        free(b);
        for (oi = 0; oi < sizeof k_ops / sizeof k_ops[0]; oi++) {
            const bench_op *op = &k_ops[oi];
            bench_ctx c;
            void *buf[MAXBUF];
            capex_tensor *ts[MAXBUF];
            size_t nt = (size_t)((n + TENSOR_ELEMS - 1) / TENSOR_ELEMS), k;
            double bytes = extra_bytes(op) * (double)n;
            int bi;
            if (argc > 2 && !strstr(op->name, argv[2])) continue; /* optional filter: ops whose name has argv[2] */
            memset(&c, 0, sizeof c);
            c.nbuf = op->nbuf;
            for (bi = 0; bi < op->nbuf; bi++) {
                size_t es = capex_dtype_size(op->dt[bi]);
                int64_t j;
                buf[bi] = xmalloc((size_t)n * es);
                ts[bi] = (capex_tensor *)xmalloc(nt * sizeof(capex_tensor));
                if (es == 4) for (j = 0; j < n; j++) ((float *)buf[bi])[j] = 1e-3f * (float)(j % 17);
                else for (j = 0; j < n; j++) ((uint16_t *)buf[bi])[j] = op->dt[bi] == CAPEX_F16 ? 0x1400 : 0x3a83; /* ~1e-3 */
                for (k = 0; k < nt; k++) {
                    int64_t lo = (int64_t)k * TENSOR_ELEMS, hi = lo + TENSOR_ELEMS < n ? lo + TENSOR_ELEMS : n;
                    ts[bi][k].data = (char *)buf[bi] + (size_t)lo * es;
                    ts[bi][k].numel = hi - lo;
                }
                c.list[bi] = capex_tensor_list_make(op->dt[bi], ts[bi], nt);
                bytes += (double)n * (double)es * (op->rw[bi] == 'b' ? 2.0 : 1.0);
            }
            for (ti = 0; ti < 2; ti++) {
                double best = 1e30, bestcpu = 0, gbs;
                int r, reps = reps_for(n);
                capex_tensor_op_desc_init(&c.desc);
                c.desc.num_threads = threads[ti];
                op->run(&c); /* warm-up */
                for (r = 0; r < reps; r++) {
                    double t0 = now(), c0 = cpu_now(), dt;
                    op->run(&c);
                    dt = now() - t0;
                    if (dt < best) { best = dt; bestcpu = cpu_now() - c0; }
                }
                gbs = bytes / best / 1e9;
                printf("%-26s %10lld %3d %10.3f %9.2f %7.2f %5.0f\n", op->name, (long long)n, threads[ti], best * 1e3, gbs,
                       gbs / copy_gbs[si][ti], 100.0 * bestcpu / (best * threads[ti]));
                fflush(stdout);
            }
            for (bi = 0; bi < op->nbuf; bi++) { free(buf[bi]); free(ts[bi]); }
        }
    }
    printf("\ntotal %.1f s\n", now() - t_start);
    return 0;
}
