/* GPU benchmark of capex_cuda.h's fused kernels (`make bench-gpu`).

   For each size (parameters; default 1M, 10M, 100M, 1B) it measures, in one
   run on one GPU: the device copy bandwidth (cuMemcpyDtoD, read + write) and
   each kernel's effective bandwidth = the bytes it must move at least (each
   input read once, each output written once) / time, and the ratio to copy.
   Timed with CUDA events over several launches after a warm-up; the first
   call also JIT-compiles the kernels (not timed).

       bench_gpu [--sizes 1000000,10000000] [--csv out.csv] [--iters N]

   Rows (bytes per parameter):
     copy            f32 copy: 8
     unscale_f32     in-place unscale + inf check of f32 grads: 8
     check_bf16      inf/NaN check only of bf16 grads: 2
     l2norm_f32      global L2 norm of f32 grads (partials + reduction): 4
     adamw_f32       AdamW, f32 params and grads (torch fused AdamW's case): 28
     adamw_mixed     AdamW, f32 master + bf16 model copy + bf16 grads: 28
     sgd_momentum    SGD with momentum, f32: 20
     lamb_mixed      LAMB, f32 master + bf16 model + bf16 grads (norms,
                     stage 1, stage 2; counted as 28, its minimum traffic)
   CSV columns: kernel,params,bytes,ms,gbps,ratio_to_copy. A markdown table
   goes to stdout. Needs a GPU; prints why and exits 0 without one.

       bench_gpu --norms [--csv out.csv] [--iters N]

   LayerNorm and RMSNorm forward and backward (dx, dweight, dbias) on bf16
   activations and bf16 weights, 2^24 elements as rows x width for widths
   768, 1024, 4096, 8192 (random data); bytes per element: forward 4 (x read,
   y written), backward 6 (x, dy read, dx written); the ratio is to a copy of
   the same 2^24 bf16 values (4 bytes per element). bench_torch.py --norms
   times torch.nn.functional.layer_norm / rms_norm on the same shapes. */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_row {
    const char *kernel;
    long long params;
    double bytes, ms, gbps, ratio;
} bench_row;

static int check(capex_result r, const char *what) {
    if (r == CAPEX_OK) return 1;
    fprintf(stderr, "bench_gpu: %s: %s\n", what, capex_last_error());
    return 0;
}

/* Mean milliseconds per call of fn(arg) over iters calls (after one warm-up),
   events on stream st, where every call queues its work. */
typedef capex_result (*bench_fn)(void *arg);
static double time_ms(capex_cuda_context *ctx, capex_cuda_stream st, bench_fn fn, void *arg, int iters) {
    capex_cuda_event a = NULL, b = NULL;
    float ms = 0.0f;
    int i;
    if (!check(fn(arg), "warm-up") || !check(capex_cuda_context_synchronize(ctx), "sync")) return -1.0;
    if (!check(capex_cuda_event_create(ctx, 1, &a), "event") || !check(capex_cuda_event_create(ctx, 1, &b), "event"))
        return -1.0;
    capex_cuda_event_record(ctx, a, st);
    for (i = 0; i < iters; i++)
        if (!check(fn(arg), "launch")) return -1.0;
    capex_cuda_event_record(ctx, b, st);
    if (!check(capex_cuda_event_synchronize(ctx, b), "sync") || !check(capex_cuda_event_elapsed_ms(ctx, a, b, &ms), "elapsed"))
        return -1.0;
    capex_cuda_event_destroy(ctx, a);
    capex_cuda_event_destroy(ctx, b);
    return (double)ms / iters;
}

typedef struct bench_state {
    capex_cuda_context *ctx;
    capex_cuda_stream st; /* every op's stream (stream NULL copies would wait for the whole context) */
    long long n;
    capex_cuda_ptr p, g32, g16, m, v, h, ws, scal, found;
    size_t ws_bytes;
    capex_tensor tg32, tg16;
    capex_tensor_list lg32, lg16;
    capex_cuda_optim *opt;
} bench_state;

static capex_result b_copy(void *s_) {
    bench_state *s = (bench_state *)s_;
    return capex_cuda_memcpy_dtod(s->ctx, s->m, s->p, (size_t)s->n * 4, s->st);
}
static capex_result b_unscale(void *s_) {
    bench_state *s = (bench_state *)s_;
    return capex_cuda_multi_tensor_scale(s->ctx, NULL, &s->lg32, &s->lg32, s->scal, s->found, s->st);
}
static capex_result b_check(void *s_) {
    bench_state *s = (bench_state *)s_;
    return capex_cuda_multi_tensor_scale(s->ctx, NULL, &s->lg16, NULL, s->scal, s->found, s->st);
}
static capex_result b_norm(void *s_) {
    bench_state *s = (bench_state *)s_;
    return capex_cuda_multi_tensor_l2norm(s->ctx, NULL, &s->lg32, s->ws, s->ws_bytes, s->scal + 4, 0, s->st);
}
static capex_result b_step(void *s_) {
    bench_state *s = (bench_state *)s_;
    return capex_cuda_optim_step(s->opt, s->scal, 0, 0, s->st);
}

/* A fresh optimizer over the state's buffers. kind, grads bf16?, model copy? */
static int make_opt(bench_state *s, capex_optim_kind kind, int mixed) {
    capex_optim_desc d;
    capex_optim_param p;
    capex_optim_desc_init(&d, kind);
    d.defaults.weight_decay = 0.01f;
    if (kind == CAPEX_OPTIM_SGD) d.defaults.momentum = 0.9f;
    capex_optim_param_init(&p);
    p.param = (float *)(uintptr_t)s->p;
    p.grad = (const void *)(uintptr_t)(mixed ? s->g16 : s->g32);
    p.grad_dtype = mixed ? CAPEX_BF16 : CAPEX_F32;
    p.model = mixed ? (void *)(uintptr_t)s->h : NULL;
    p.model_dtype = CAPEX_BF16;
    p.numel = s->n;
    p.exp_avg = (float *)(uintptr_t)s->m;
    p.exp_avg_sq = kind == CAPEX_OPTIM_SGD ? NULL : (float *)(uintptr_t)s->v;
    capex_cuda_optim_destroy(s->opt);
    s->opt = NULL;
    return check(capex_cuda_optim_create(s->ctx, &d, &s->opt), "optimizer") &&
           check(capex_cuda_optim_add_group(s->opt, NULL, &p, 1, NULL), "add_group");
}

typedef struct norm_state {
    capex_cuda_context *ctx;
    capex_cuda_stream st;
    capex_cuda_norm_args a;
    int rms, backward;
    capex_cuda_ptr src, dst; /* the copy */
    size_t copy_bytes;
} norm_state;

static capex_result n_run(void *s_) {
    norm_state *s = (norm_state *)s_;
    if (!s->backward)
        return s->rms ? capex_cuda_rms_norm_forward(s->ctx, NULL, &s->a, s->st) : capex_cuda_layer_norm_forward(s->ctx, NULL, &s->a, s->st);
    return s->rms ? capex_cuda_rms_norm_backward(s->ctx, NULL, &s->a, s->st) : capex_cuda_layer_norm_backward(s->ctx, NULL, &s->a, s->st);
}
static capex_result n_copy(void *s_) {
    norm_state *s = (norm_state *)s_;
    return capex_cuda_memcpy_dtod(s->ctx, s->dst, s->src, s->copy_bytes, s->st);
}

/* bf16 of a uniform value in [lo, hi) (xorshift) */
static uint16_t rand_bf16(uint64_t *r, float lo, float hi) {
    float f;
    *r ^= *r << 13; *r ^= *r >> 7; *r ^= *r << 17;
    f = lo + (hi - lo) * (float)((*r >> 40) * (1.0 / 16777216.0));
    return capex_f32_to_bf16(f);
}

static int bench_norms(capex_cuda_context *ctx, const char *csv, int iters_arg) {
    static const int64_t widths[] = {768, 1024, 4096, 8192};
#ifndef BENCH_NORM_LOG2
#define BENCH_NORM_LOG2 24 /* smaller for a quick run on the CPU emulator */
#endif
    const int64_t total = (int64_t)1 << BENCH_NORM_LOG2;
    bench_row rows[4 * 5];
    int nrows = 0, w, k, i;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    norm_state s;
    uint16_t *h = (uint16_t *)malloc((size_t)total * 2);
    capex_cuda_ptr x = 0, y = 0, dy = 0, dx = 0, wt = 0, bs = 0, dw = 0, db = 0, mean = 0, rstd = 0, ws = 0;
    char names[4 * 5][40];
    FILE *f;
    if (!h) return 1;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    if (!check(capex_cuda_stream_create(ctx, &s.st), "stream")) return 1;
    for (w = 0; w < 4; w++) {
        int64_t cols = widths[w], nr = total / cols, e = nr * cols;
        int iters = iters_arg > 0 ? iters_arg : 50;
        size_t wsb = capex_cuda_norm_workspace_bytes(nr, cols);
        if (!check(capex_cuda_malloc(ctx, (size_t)e * 2, &x), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)e * 2, &y), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)e * 2, &dy), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)e * 2, &dx), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)cols * 2, &wt), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)cols * 2, &bs), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)cols * 2, &dw), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)cols * 2, &db), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)nr * 4, &mean), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)nr * 4, &rstd), "alloc") ||
            !check(capex_cuda_malloc(ctx, wsb ? wsb : 4, &ws), "alloc"))
            return 1;
        for (i = 0; i < e; i++) h[i] = rand_bf16(&rng, -2.0f, 2.0f);
        if (!check(capex_cuda_memcpy_htod(ctx, x, h, (size_t)e * 2, NULL), "upload")) return 1;
        for (i = 0; i < e; i++) h[i] = rand_bf16(&rng, -1.0f, 1.0f);
        if (!check(capex_cuda_memcpy_htod(ctx, dy, h, (size_t)e * 2, NULL), "upload")) return 1;
        for (i = 0; i < cols; i++) h[i] = rand_bf16(&rng, 0.5f, 1.5f);
        if (!check(capex_cuda_memcpy_htod(ctx, wt, h, (size_t)cols * 2, NULL), "upload")) return 1;
        for (i = 0; i < cols; i++) h[i] = rand_bf16(&rng, -0.5f, 0.5f);
        if (!check(capex_cuda_memcpy_htod(ctx, bs, h, (size_t)cols * 2, NULL), "upload")) return 1;
        capex_cuda_norm_args_init(&s.a);
        s.a.rows = nr; s.a.cols = cols;
        s.a.x_dtype = s.a.y_dtype = s.a.param_dtype = CAPEX_BF16;
        s.a.x = x; s.a.y = y; s.a.weight = wt; s.a.mean = mean; s.a.rstd = rstd;
        s.a.dy = dy; s.a.dx = dx; s.a.dweight = dw; s.a.workspace = ws;
        s.src = x; s.dst = y; s.copy_bytes = (size_t)e * 2;
        for (k = 0; k < 5; k++) {
            bench_row *r = &rows[nrows];
            double copy_gbps = nrows && k ? rows[nrows - k].gbps : 0.0;
            s.rms = k >= 3;
            s.backward = k == 2 || k == 4;
            s.a.bias = s.rms ? 0 : bs;
            s.a.dbias = s.rms ? 0 : db;
            if (k >= 1 && !s.backward && !check(n_run(&s), "forward")) return 1;
            if (k >= 1 && s.backward) { /* the forward's mean/rstd first */
                s.backward = 0;
                if (!check(n_run(&s), "forward")) return 1;
                s.backward = 1;
            }
            r->ms = time_ms(ctx, s.st, k ? n_run : n_copy, &s, iters);
            if (r->ms < 0) return 1;
            snprintf(names[nrows], sizeof names[nrows], "%s_w%lld", k == 0 ? "copy_bf16" : k == 1 ? "layernorm_fwd" :
                     k == 2 ? "layernorm_bwd" : k == 3 ? "rmsnorm_fwd" : "rmsnorm_bwd", (long long)cols);
            r->kernel = names[nrows];
            r->params = e;
            r->bytes = (s.backward ? 6.0 : 4.0) * (double)e;
            r->gbps = r->bytes / (r->ms * 1e-3) / 1e9;
            r->ratio = k ? r->gbps / copy_gbps : 1.0;
            nrows++;
        }
        capex_cuda_free(ctx, x); capex_cuda_free(ctx, y); capex_cuda_free(ctx, dy); capex_cuda_free(ctx, dx);
        capex_cuda_free(ctx, wt); capex_cuda_free(ctx, bs); capex_cuda_free(ctx, dw); capex_cuda_free(ctx, db);
        capex_cuda_free(ctx, mean); capex_cuda_free(ctx, rstd); capex_cuda_free(ctx, ws);
    }
    free(h);
    capex_cuda_stream_destroy(ctx, s.st);
    printf("| kernel | elements | us | GB/s | / copy |\n|---|---:|---:|---:|---:|\n");
    for (i = 0; i < nrows; i++)
        printf("| %s | %lld | %.1f | %.1f | %.2f |\n", rows[i].kernel, rows[i].params, rows[i].ms * 1e3, rows[i].gbps, rows[i].ratio);
    if (csv) {
        if (!(f = fopen(csv, "w"))) return 1;
        fprintf(f, "kernel,elements,bytes,ms,gbps,ratio_to_copy\n");
        for (i = 0; i < nrows; i++)
            fprintf(f, "capex_%s,%lld,%.0f,%.6f,%.3f,%.4f\n", rows[i].kernel, rows[i].params, rows[i].bytes, rows[i].ms,
                    rows[i].gbps, rows[i].ratio);
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv) {
    long long sizes[16] = {1000000LL, 10000000LL, 100000000LL, 1000000000LL};
    int nsizes = 4, iters_arg = 0, i, k, nrows = 0, norms = 0;
    const char *csv = NULL;
    bench_row rows[16 * 8];
    capex_cuda_context *ctx = NULL;
    const capex_cuda_device_info *info;
    FILE *f;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            char *q = argv[++i];
            nsizes = 0;
            while (*q && nsizes < 16) {
                sizes[nsizes++] = strtoll(q, &q, 10);
                if (*q == ',') q++;
            }
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv = argv[++i];
        } else if (!strcmp(argv[i], "--norms")) {
            norms = 1;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters_arg = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--sizes N,N,...] [--norms] [--csv file] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) {
        printf("bench_gpu: no GPU, nothing measured (%s)\n", capex_last_error());
        return 0;
    }
    info = capex_cuda_context_device(ctx);
    printf("# capex GPU kernels on %s (sm_%d%d, %d SMs, peak %.0f GB/s)\n\n", info->name, info->cc_major, info->cc_minor,
           info->sm_count, info->peak_bandwidth_gbs);
    if (norms) {
        int r = bench_norms(ctx, csv, iters_arg);
        capex_cuda_context_destroy(ctx);
        return r;
    }
    for (i = 0; i < nsizes; i++) {
        bench_state s;
        double copy_gbps = 0.0;
        size_t fr = 0, tot = 0;
        long long n = sizes[i];
        int iters = iters_arg > 0 ? iters_arg : (int)(n >= 500000000LL ? 5 : n >= 50000000LL ? 20 : 100);
        static const struct { const char *name; double bpp; int kind; } runs[] = {
            {"copy", 8, -1}, {"unscale_f32", 8, -2}, {"check_bf16", 2, -3}, {"l2norm_f32", 4, -4},
            {"adamw_f32", 28, 0}, {"adamw_mixed", 28, 1}, {"sgd_momentum", 20, 2}, {"lamb_mixed", 28, 3}};
        memset(&s, 0, sizeof s);
        s.ctx = ctx;
        s.n = n;
        if (!check(capex_cuda_stream_create(ctx, &s.st), "stream")) return 1;
        capex_cuda_mem_info(ctx, &fr, &tot);
        if ((double)fr < (double)n * 26.0 + 1e9) {
            printf("skipping %lld params: %.1f GB free, %.1f GB needed\n", n, fr / 1e9, n * 26.0 / 1e9 + 1);
            continue;
        }
        if (!check(capex_cuda_malloc(ctx, (size_t)n * 4, &s.p), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)n * 4, &s.g32), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)n * 2, &s.g16), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)n * 4, &s.m), "alloc") ||
            !check(capex_cuda_malloc(ctx, (size_t)n * 4, &s.v), "alloc") || !check(capex_cuda_malloc(ctx, (size_t)n * 2, &s.h), "alloc") ||
            !check(capex_cuda_malloc(ctx, 64, &s.scal), "alloc") || !check(capex_cuda_malloc(ctx, 4, &s.found), "alloc"))
            return 1;
        capex_cuda_fill_f32(ctx, s.p, 0.5f, (size_t)n, NULL);
        capex_cuda_fill_f32(ctx, s.g32, 1e-3f, (size_t)n, NULL);
        capex_cuda_memset_u8(ctx, s.g16, 0x3a, (size_t)n * 2, NULL); /* bf16 0x3a3a ~ 7e-4 */
        capex_cuda_fill_f32(ctx, s.scal, 1.0f, 16, NULL);
        capex_cuda_memset_u32(ctx, s.found, 0, 1, NULL);
        s.tg32.data = (void *)(uintptr_t)s.g32; s.tg32.numel = n;
        s.tg16.data = (void *)(uintptr_t)s.g16; s.tg16.numel = n;
        s.lg32 = capex_tensor_list_make(CAPEX_F32, &s.tg32, 1);
        s.lg16 = capex_tensor_list_make(CAPEX_BF16, &s.tg16, 1);
        if (!check(capex_cuda_multi_tensor_workspace_size(NULL, &s.lg32, 1, &s.ws_bytes), "workspace") ||
            !check(capex_cuda_malloc(ctx, s.ws_bytes, &s.ws), "alloc"))
            return 1;
        for (k = 0; k < (int)(sizeof runs / sizeof runs[0]); k++) {
            bench_fn fn = runs[k].kind == -1 ? b_copy : runs[k].kind == -2 ? b_unscale : runs[k].kind == -3 ? b_check
                        : runs[k].kind == -4 ? b_norm : b_step;
            double ms;
            bench_row *r = &rows[nrows];
            if (runs[k].kind >= 0) {
                capex_optim_kind kind = runs[k].kind == 2 ? CAPEX_OPTIM_SGD : runs[k].kind == 3 ? CAPEX_OPTIM_LAMB : CAPEX_OPTIM_ADAM;
                if (!make_opt(&s, kind, runs[k].kind == 1 || runs[k].kind == 3)) return 1;
            }
            ms = time_ms(ctx, s.st, fn, &s, iters);
            if (ms < 0) return 1;
            r->kernel = runs[k].name;
            r->params = n;
            r->bytes = runs[k].bpp * (double)n;
            r->ms = ms;
            r->gbps = r->bytes / (ms * 1e-3) / 1e9;
            if (runs[k].kind == -1) copy_gbps = r->gbps;
            r->ratio = copy_gbps > 0 ? r->gbps / copy_gbps : 0.0;
            nrows++;
        }
        capex_cuda_optim_destroy(s.opt);
        capex_cuda_free(ctx, s.p); capex_cuda_free(ctx, s.g32); capex_cuda_free(ctx, s.g16); capex_cuda_free(ctx, s.m);
        capex_cuda_free(ctx, s.v); capex_cuda_free(ctx, s.h); capex_cuda_free(ctx, s.ws); capex_cuda_free(ctx, s.scal);
        capex_cuda_free(ctx, s.found);
        capex_cuda_stream_destroy(ctx, s.st);
    }
    printf("| kernel | params | ms | GB/s | / copy |\n|---|---:|---:|---:|---:|\n");
    for (i = 0; i < nrows; i++)
        printf("| %s | %lld | %.4f | %.1f | %.2f |\n", rows[i].kernel, rows[i].params, rows[i].ms, rows[i].gbps, rows[i].ratio);
    if (csv) {
        f = fopen(csv, "w");
        if (!f) {
            fprintf(stderr, "bench_gpu: cannot write %s\n", csv);
            return 1;
        }
        fprintf(f, "kernel,params,bytes,ms,gbps,ratio_to_copy\n");
        for (i = 0; i < nrows; i++)
            fprintf(f, "capex_%s,%lld,%.0f,%.6f,%.3f,%.4f\n", rows[i].kernel, rows[i].params, rows[i].bytes, rows[i].ms,
                    rows[i].gbps, rows[i].ratio);
        fclose(f);
    }
    capex_cuda_context_destroy(ctx);
    return 0;
}
