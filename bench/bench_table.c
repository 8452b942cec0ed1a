/* bench_table: the capex side of the capex-vs-torch CPU table (issue 17):
   48M parameters in 12 tensors of 4M, one thread, best of REPS runs, one CSV
   line per op: "op,wall ms,cpu ms" (best of each). bench/bench_cpu_torch.py runs this and the torch
   peers and prints the table; alone:

       make bench-table && build/bench/bench_table [elements] [reps] [threads]

   Ops (the names bench_cpu_torch.py matches):
     adamw_bf16   AdamW, fp32 master, bf16 grads, bf16 model copy written
     adamw_f16    the same with fp16 grads and an fp16 model copy
     sgd_bf16/f16 SGD momentum 0.9, fp32 master, half grads and model copy
     lamb_bf16/f16 LAMB, fp32 master, half grads and model copy
     l2norm_f32/bf16/f16  per-tensor and total L2 norm (capex_multi_tensor_l2norm)
     unscale_f16  fp16 grads * (1/1024) into fp32 master grads, inf check
     ln_fwd_f32 / ln_bwd_f32  LayerNorm 4096 x 1024 forward / backward (dx, dw, db) */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE (glibc) */
#define _POSIX_C_SOURCE 200112L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define NT 12

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
/* Best wall and best process-CPU time over the runs after a warm-up. CPU time
   is what a shared machine disturbs least (waiting for a core is not counted). */
typedef struct timer { double w0, c0, best_w, best_c; int run; } timer;
static void tm_init(timer *t) { t->best_w = t->best_c = 1e30; t->run = 0; }
static void tm_start(timer *t) { t->w0 = now_s(); t->c0 = cpu_s(); }
static void tm_stop(timer *t) {
    double w = now_s() - t->w0, c = cpu_s() - t->c0;
    if (t->run++ == 0) return; /* warm-up */
    if (w < t->best_w) t->best_w = w;
    if (c < t->best_c) t->best_c = c;
}
/* CAPEX_BENCH_HUGE_PAGES=1: 2 MB-aligned buffers advised onto huge pages
   (bench_cpu_torch.py --huge-pages gives torch's tensors the same). */
static void *xmalloc(size_t n) {
    void *p = NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (getenv("CAPEX_BENCH_HUGE_PAGES") && n >= (2u << 20)) {
        if (posix_memalign(&p, 2u << 20, n) != 0) p = NULL;
        else (void)madvise(p, n, MADV_HUGEPAGE);
    } else
#endif
        p = malloc(n);
    if (!p) { fprintf(stderr, "bench_table: out of memory\n"); exit(1); }
    return p;
}
static void die(const char *what) {
    fprintf(stderr, "bench_table: %s: %s\n", what, capex_last_error());
    exit(1);
}

static int64_t N = 48000000;
static int REPS = 5, THREADS = 1;

typedef struct bufs {
    float *p, *m, *v, *g32;
    uint16_t *g16, *h16;
} bufs;

static void report(const char *op, const timer *t) {
    printf("%s,%.3f,%.3f\n", op, t->best_w * 1e3, t->best_c * 1e3);
    fflush(stdout);
}

static void bench_optim(bufs *b, capex_optim_kind kind, capex_dtype half, const char *name) {
    capex_optim_desc d;
    capex_optim *o = NULL;
    capex_optim_param ps[NT];
    int t, r;
    timer tm;
    tm_init(&tm);
    capex_optim_desc_init(&d, kind);
    d.exec.num_threads = THREADS;
    d.defaults.weight_decay = 0.01f;
    if (kind == CAPEX_OPTIM_SGD) d.defaults.momentum = 0.9f;
    for (t = 0; t < NT; t++) {
        int64_t off = N / NT * t;
        capex_optim_param_init(&ps[t]);
        ps[t].param = b->p + off; ps[t].numel = N / NT;
        ps[t].grad = b->g16 + off; ps[t].grad_dtype = half;
        ps[t].model = b->h16 + off; ps[t].model_dtype = half;
        ps[t].exp_avg = b->m + off;
        ps[t].exp_avg_sq = kind == CAPEX_OPTIM_SGD ? NULL : b->v + off;
    }
    if (capex_optim_create(&d, &o) != CAPEX_OK || capex_optim_add_group(o, NULL, ps, NT, NULL) != CAPEX_OK) die(name);
    for (r = 0; r <= REPS; r++) {
        tm_start(&tm);
        if (capex_optim_step(o, 1.0f, 1.0f, 0) != CAPEX_OK) die(name);
        tm_stop(&tm);
    }
    capex_optim_destroy(o);
    report(name, &tm);
}

static void fill_half(uint16_t *h, capex_dtype dt) {
    int64_t i;
    for (i = 0; i < N; i++) {
        float v = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
        h[i] = dt == CAPEX_F16 ? capex_f32_to_f16(v) : capex_f32_to_bf16(v);
    }
}

static void bench_norm(bufs *b, capex_dtype dt, const char *name) {
    capex_tensor ts[NT];
    capex_tensor_list l;
    capex_tensor_op_desc d;
    float tot, per[NT];
    int t, r;
    timer tm;
    size_t es = capex_dtype_size(dt);
    tm_init(&tm);
    capex_tensor_op_desc_init(&d);
    d.num_threads = THREADS;
    for (t = 0; t < NT; t++) {
        ts[t].data = (char *)(dt == CAPEX_F32 ? (void *)b->g32 : (void *)b->g16) + (size_t)(N / NT * t) * es;
        ts[t].numel = N / NT;
    }
    l = capex_tensor_list_make(dt, ts, NT);
    for (r = 0; r <= REPS; r++) {
        tm_start(&tm);
        if (capex_multi_tensor_l2norm(&d, &l, &tot, per) != CAPEX_OK) die(name);
        tm_stop(&tm);
    }
    report(name, &tm);
}

static void bench_unscale(bufs *b) {
    capex_tensor hi[NT], fo[NT];
    capex_tensor_list li, lo;
    capex_tensor_op_desc d;
    int t, r, inf = 0;
    timer tm;
    tm_init(&tm);
    capex_tensor_op_desc_init(&d);
    d.num_threads = THREADS;
    for (t = 0; t < NT; t++) {
        hi[t].data = b->g16 + N / NT * t; hi[t].numel = N / NT;
        fo[t].data = b->g32 + N / NT * t; fo[t].numel = N / NT;
    }
    li = capex_tensor_list_make(CAPEX_F16, hi, NT);
    lo = capex_tensor_list_make(CAPEX_F32, fo, NT);
    for (r = 0; r <= REPS; r++) {
        tm_start(&tm);
        if (capex_multi_tensor_scale(&d, &li, &lo, 1.0f / 1024, &inf) != CAPEX_OK) die("unscale");
        tm_stop(&tm);
    }
    report("unscale_f16", &tm);
}

static void bench_ln(void) {
    const int64_t R = 4096, C = 1024;
    float *x = (float *)xmalloc((size_t)(R * C) * 4), *y = (float *)xmalloc((size_t)(R * C) * 4);
    float *dy = (float *)xmalloc((size_t)(R * C) * 4), *dx = (float *)xmalloc((size_t)(R * C) * 4);
    float w[1024], bb[1024], dw[1024], db[1024], *mean = (float *)xmalloc(4096 * 4), *rstd = (float *)xmalloc(4096 * 4);
    capex_norm_desc nd;
    capex_norm_args a;
    int64_t i;
    int bwd, r;
    for (i = 0; i < R * C; i++) {
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        dy[i] = (float)((i * 40503u) % 997) / 498.0f - 1.0f;
    }
    for (i = 0; i < C; i++) { w[i] = 1.0f + (float)(i % 7) * 0.01f; bb[i] = 0.01f * (float)(i % 5); }
    capex_norm_desc_init(&nd);
    nd.num_threads = THREADS;
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = CAPEX_F32; a.x = x; a.y = y;
    a.weight = w; a.bias = bb; a.mean = mean; a.rstd = rstd;
    a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
    for (bwd = 0; bwd < 2; bwd++) {
        timer tm;
        tm_init(&tm);
        for (r = 0; r <= 3 * REPS; r++) {
            tm_start(&tm);
            if ((bwd ? capex_layer_norm_backward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) != CAPEX_OK) die("layernorm");
            tm_stop(&tm);
        }
        report(bwd ? "ln_bwd_f32" : "ln_fwd_f32", &tm);
    }
    free(x); free(y); free(dy); free(dx); free(mean); free(rstd);
}

int main(int argc, char **argv) {
    bufs b;
    int64_t i;
    if (argc > 1) N = atoll(argv[1]) / NT * NT;
    if (argc > 2) REPS = atoi(argv[2]);
    if (argc > 3) THREADS = atoi(argv[3]);
    if (N < NT || REPS < 1 || THREADS < 1) { fprintf(stderr, "usage: bench_table [elements] [reps] [threads]\n"); return 2; }
    b.p = (float *)xmalloc((size_t)N * 4); b.m = (float *)xmalloc((size_t)N * 4);
    b.v = (float *)xmalloc((size_t)N * 4); b.g32 = (float *)xmalloc((size_t)N * 4);
    b.g16 = (uint16_t *)xmalloc((size_t)N * 2); b.h16 = (uint16_t *)xmalloc((size_t)N * 2);
    for (i = 0; i < N; i++) { b.p[i] = 1e-3f * (float)(i % 17); b.g32[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f; }
    memset(b.h16, 0, (size_t)N * 2);
    printf("# capex %s, %lld elements in %d tensors, %d thread(s), best of %d\n", CAPEX_VERSION_STRING, (long long)N, NT,
           THREADS, REPS);
    fill_half(b.g16, CAPEX_BF16);
    bench_optim(&b, CAPEX_OPTIM_ADAM, CAPEX_BF16, "adamw_bf16");
    bench_optim(&b, CAPEX_OPTIM_SGD, CAPEX_BF16, "sgd_bf16");
    bench_optim(&b, CAPEX_OPTIM_LAMB, CAPEX_BF16, "lamb_bf16");
    bench_norm(&b, CAPEX_BF16, "l2norm_bf16");
    fill_half(b.g16, CAPEX_F16);
    bench_optim(&b, CAPEX_OPTIM_ADAM, CAPEX_F16, "adamw_f16");
    bench_optim(&b, CAPEX_OPTIM_SGD, CAPEX_F16, "sgd_f16");
    bench_optim(&b, CAPEX_OPTIM_LAMB, CAPEX_F16, "lamb_f16");
    bench_norm(&b, CAPEX_F16, "l2norm_f16");
    bench_unscale(&b);
    for (i = 0; i < N; i++) b.g32[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    bench_norm(&b, CAPEX_F32, "l2norm_f32");
    bench_ln();
    free(b.p); free(b.m); free(b.v); free(b.g32); free(b.g16); free(b.h16);
    return 0;
}
