/* The F16C paths give the bits of the portable ones. Every CPU code path that
   reads fp16 gradients or writes fp16 copies (optimizers: Adam L2/W, SGD with
   and without momentum and with momentum turned on by set_hparams, LAMB with
   u kept or recomputed; unscale; L2 norms) runs twice on the same random inputs, once with the portable conversions
   forced (capex__f16c_state = 1) and once with F16C, and every output bit is
   compared. Inputs include fp16 subnormals, values near the f16 overflow, odd
   sizes, a tensor over one chunk and not a multiple of the 1024 block, and a
   step with inf gradients. Skips where the build or CPU has no F16C. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float urand(void) { return (float)(rnd32() >> 8) / 16777216.0f * 2.0f - 1.0f; }

enum { NT = 4 };
static const int64_t sizes[NT] = {1, 7, 1029, 70001};

/* a gradient element: mostly normal, some fp16 subnormals and near-overflow */
static float grad_value(int64_t i) {
    unsigned r = rnd32() % 64;
    float x = urand();
    if (r == 0) return x * 3e-6f;  /* fp16 subnormal range (below 2^-14) */
    if (r == 1) return x * 60000.0f; /* near the top of the f16 range */
    (void)i;
    return x * 2.0f;
}

typedef struct run_out {
    float *p[NT], *m[NT], *v[NT];
    uint16_t *g[NT], *model[NT];
    int f16vals; /* f32 gradients holding fp16 values */
} run_out;

static void out_alloc(run_out *r, capex_dtype gt) {
    int t;
    r->f16vals = 0;
    for (t = 0; t < NT; t++) {
        r->p[t] = (float *)calloc((size_t)sizes[t], 4);
        r->m[t] = (float *)calloc((size_t)sizes[t], 4);
        r->v[t] = (float *)calloc((size_t)sizes[t], 4);
        r->g[t] = (uint16_t *)calloc((size_t)sizes[t], gt == CAPEX_F32 ? 4 : 2);
        r->model[t] = (uint16_t *)calloc((size_t)sizes[t], 2);
    }
}
static void out_free(run_out *r) {
    int t;
    for (t = 0; t < NT; t++) { free(r->p[t]); free(r->m[t]); free(r->v[t]); free(r->g[t]); free(r->model[t]); }
}

typedef struct ocfg {
    const char *name;
    capex_optim_kind kind;
    int w, lowmem, nesterov;
    float momentum;
    int mom_late; /* SGD: momentum 0 (set_hparams) until step 2, then on: a 4th step */
} ocfg;

/* Runs 3 steps (the second with an inf gradient: skipped; 4 with mom_late,
   momentum on from the third) and leaves the results in r. model: 0 none,
   1 f16, 2 bf16, 3 bf16 stochastic. */
static void run_optim(ct_state *ct, const ocfg *oc, capex_dtype gt, int model, int threads, uint64_t seed, run_out *r) {
    capex_optim_desc d;
    capex_optim *o = NULL;
    capex_optim_param ps[NT];
    int t, s;
    int64_t i;
    rng = seed;
    capex_optim_desc_init(&d, oc->kind);
    d.adam_w_mode = oc->w;
    d.lamb_low_memory = oc->lowmem;
    d.reg_inside_moment = oc->kind == CAPEX_OPTIM_NOVOGRAD && oc->w; /* NovoGrad: w picks the moment mode */
    d.defaults.weight_decay = 0.01f;
    d.defaults.momentum = oc->momentum;
    d.defaults.nesterov = oc->nesterov;
    d.stochastic_rounding = model == 3;
    d.seed = 12345;
    d.exec.num_threads = threads;
    for (t = 0; t < NT; t++) {
        for (i = 0; i < sizes[t]; i++) r->p[t][i] = urand();
        capex_optim_param_init(&ps[t]);
        ps[t].param = r->p[t]; ps[t].numel = sizes[t];
        ps[t].grad = r->g[t]; ps[t].grad_dtype = gt;
        ps[t].exp_avg = r->m[t]; ps[t].exp_avg_sq = oc->kind == CAPEX_OPTIM_SGD || oc->kind == CAPEX_OPTIM_NOVOGRAD ? NULL : r->v[t];
        if (model) { ps[t].model = r->model[t]; ps[t].model_dtype = model == 1 ? CAPEX_F16 : CAPEX_BF16; }
    }
    if (capex_optim_create(&d, &o) != CAPEX_OK || capex_optim_add_group(o, NULL, ps, NT, NULL) != CAPEX_OK) {
        capex_optim_destroy(o);
        CT_CHECK(0, "%s: setup: %s", oc->name, capex_last_error());
    }
    for (s = 0; s < 3 + (oc->mom_late != 0); s++) {
        if (oc->mom_late && (s == 0 || s == 2)) { /* off before the first step, on at the third */
            capex_optim_hparams h = d.defaults;
            if (s == 0) { h.momentum = 0.0f; h.nesterov = 0; }
            if (capex_optim_set_hparams(o, 0, &h) != CAPEX_OK) break;
        }
        for (t = 0; t < NT; t++)
            for (i = 0; i < sizes[t]; i++) {
                float x = grad_value(i);
                if (s == 1 && t == 2 && i == 77) x = INFINITY;
                if (r->f16vals) x = capex_f16_to_f32(capex_f32_to_f16(x));
                if (gt == CAPEX_F32) ((float *)(void *)r->g[t])[i] = x;
                else r->g[t][i] = gt == CAPEX_F16 ? capex_f32_to_f16(x) : capex_f32_to_bf16(x);
            }
        if (capex_optim_step(o, 0.5f, 1.0f, s == 1) != CAPEX_OK) break;
    }
    capex_optim_destroy(o);
    CT_CHECK(s == 3 + (oc->mom_late != 0), "%s: step: %s", oc->name, capex_last_error());
}

static int same_bits(const void *a, const void *b, int64_t n, size_t es) { return memcmp(a, b, (size_t)n * es) == 0; }

#ifdef CAPEX__F16C
/* 1: the portable conversions and reductions; 0: probe again (F16C, AVX) */
static void force_portable(int on) {
    __atomic_store_n(&capex__f16c_state, on ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&capex__avx_state, on ? 1 : 0, __ATOMIC_RELAXED);
}
#endif

CT_TEST(optimizers_same_bits) {
#ifndef CAPEX__F16C
    CT_SKIP("built without F16C");
#else
    static const ocfg cfgs[] = {
        {"adam l2", CAPEX_OPTIM_ADAM, 0, 0, 0, 0.0f, 0}, {"adamw", CAPEX_OPTIM_ADAM, 1, 0, 0, 0.0f, 0},
        {"sgd", CAPEX_OPTIM_SGD, 0, 0, 0, 0.0f, 0}, {"sgd momentum", CAPEX_OPTIM_SGD, 0, 0, 0, 0.9f, 0},
        {"sgd nesterov", CAPEX_OPTIM_SGD, 0, 0, 1, 0.9f, 0}, {"lamb", CAPEX_OPTIM_LAMB, 1, 0, 0, 0.0f, 0},
        {"lamb l2 low-memory", CAPEX_OPTIM_LAMB, 0, 1, 0, 0.0f, 0}, {"lamb low-memory", CAPEX_OPTIM_LAMB, 1, 1, 0, 0.0f, 0},
        {"novograd", CAPEX_OPTIM_NOVOGRAD, 0, 0, 0, 0.0f, 0}, {"novograd reg_inside_moment", CAPEX_OPTIM_NOVOGRAD, 1, 0, 0, 0.0f, 0},
        {"sgd momentum turned on later", CAPEX_OPTIM_SGD, 0, 0, 0, 0.9f, 1},
        {"sgd nesterov turned on later", CAPEX_OPTIM_SGD, 0, 0, 1, 0.9f, 1},
    };
    static const capex_dtype gts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    size_t c;
    int gi, model, th, t;
    force_portable(0);
    if (!capex__f16c_ok()) CT_SKIP("this CPU has no F16C");
    for (c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (gi = 0; gi < 3; gi++)
            for (model = 0; model < 4; model++) {
                run_out a, b;
                if (gts[gi] != CAPEX_F16 && model != 1) continue; /* no fp16: one path only */
                for (th = 1; th <= 2; th++) {
                    uint64_t seed = 0x1234567ull + c * 131 + (uint64_t)gi * 17 + (uint64_t)model;
                    out_alloc(&a, gts[gi]);
                    out_alloc(&b, gts[gi]);
                    force_portable(1);
                    run_optim(ct, &cfgs[c], gts[gi], model, th, seed, &a);
                    force_portable(0);
                    run_optim(ct, &cfgs[c], gts[gi], model, th, seed, &b);
                    for (t = 0; t < NT && !ct->failed; t++) {
                        CT_CHECK(same_bits(a.p[t], b.p[t], sizes[t], 4), "%s grad %s model %d threads %d: p of tensor %d",
                                 cfgs[c].name, capex_dtype_name(gts[gi]), model, th, t);
                        CT_CHECK(same_bits(a.m[t], b.m[t], sizes[t], 4), "%s: m of tensor %d", cfgs[c].name, t);
                        CT_CHECK(same_bits(a.v[t], b.v[t], sizes[t], 4), "%s: v of tensor %d", cfgs[c].name, t);
                        CT_CHECK(same_bits(a.model[t], b.model[t], sizes[t], 2), "%s grad %s model %d: model copy of tensor %d",
                                 cfgs[c].name, capex_dtype_name(gts[gi]), model, t);
                    }
                    /* the run did something: the copy is the rounded master */
                    if (model == 1)
                        CT_CHECK(b.model[3][5] == capex_f32_to_f16(b.p[3][5]) && b.p[3][5] != 0.0f, "%s: copy", cfgs[c].name);
                    out_free(&a);
                    out_free(&b);
                    if (ct->failed) return;
                }
            }
#endif
}

/* fp16 gradients give the bits of f32 gradients holding the same values
   (the conversion is exact), whichever path converts them and however the
   kernels block them: checks the blocked loops on any CPU. */
CT_TEST(f16_grads_equal_f32_grads) {
    static const ocfg cfgs[] = {
        {"adam l2", CAPEX_OPTIM_ADAM, 0, 0, 0, 0.0f, 0}, {"adamw", CAPEX_OPTIM_ADAM, 1, 0, 0, 0.0f, 0},
        {"sgd momentum", CAPEX_OPTIM_SGD, 0, 0, 0, 0.9f, 0}, {"lamb", CAPEX_OPTIM_LAMB, 1, 0, 0, 0.0f, 0},
        {"lamb l2 low-memory", CAPEX_OPTIM_LAMB, 0, 1, 0, 0.0f, 0}, {"novograd", CAPEX_OPTIM_NOVOGRAD, 0, 0, 0, 0.0f, 0},
        {"novograd reg_inside_moment", CAPEX_OPTIM_NOVOGRAD, 1, 0, 0, 0.0f, 0},
        {"sgd momentum turned on later", CAPEX_OPTIM_SGD, 0, 0, 0, 0.9f, 1},
    };
    size_t c;
    int model, t;
    for (c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (model = 0; model < 4; model++) {
            run_out a, b;
            uint64_t seed = 0xabcdefull + c * 7 + (uint64_t)model;
            out_alloc(&a, CAPEX_F16);
            out_alloc(&b, CAPEX_F32);
            b.f16vals = 1;
            run_optim(ct, &cfgs[c], CAPEX_F16, model, 2, seed, &a);
            run_optim(ct, &cfgs[c], CAPEX_F32, model, 2, seed, &b);
            for (t = 0; t < NT && !ct->failed; t++) {
                CT_CHECK(same_bits(a.p[t], b.p[t], sizes[t], 4) && same_bits(a.m[t], b.m[t], sizes[t], 4) &&
                             same_bits(a.v[t], b.v[t], sizes[t], 4) && same_bits(a.model[t], b.model[t], sizes[t], 2),
                         "%s model %d: tensor %d differs between fp16 and f32 gradients", cfgs[c].name, model, t);
            }
            out_free(&a);
            out_free(&b);
            if (ct->failed) return;
        }
}

/* The sums of squares of f32, bf16 and fp16 data (AVX lanes with FMA, AVX
   without it, and the plain loop; fp16 also F16C off), odd sizes and offsets,
   values over many decades (fp16 subnormals included), inf and NaN. */
CT_TEST(sumsq_same_bits) {
#ifndef CAPEX__F16C
    CT_SKIP("built without x86 SIMD paths");
#else
    static float x[70001];
    static uint16_t b[70001], h[70001];
    int64_t i, n, off;
    force_portable(0);
    if (!capex__avx_ok()) CT_SKIP("this CPU has no AVX");
    rng = 99;
    for (i = 0; i < 70001; i++) {
        x[i] = urand() * (float)(1u << (rnd32() % 24)) / 4096.0f;
        b[i] = capex_f32_to_bf16(x[i]);
        h[i] = capex_f32_to_f16(x[i]);
    }
    h[4000] = 0x7c01; /* a signalling NaN (kept by the software path) */
    h[9001] = 0xfe03; /* a quiet NaN with a payload */
    for (n = 0; n < 300; n++)
        for (off = 0; off < 3; off++) {
            double p32, a32, p16, a16, ph, ah;
            int fma;
            force_portable(1);
            p32 = capex__sumsq_F32(x + off, n * 233 + off);
            p16 = capex__sumsq_BF16(b + off, n * 233 + off);
            ph = capex__sumsq_F16(h + off, n * 233 + off);
            for (fma = 0; fma < 2; fma++) { /* AVX alone, then AVX+FMA where the CPU has it */
                force_portable(0);
                __atomic_store_n(&capex__fma_state, fma ? 0 : 1, __ATOMIC_RELAXED);
                a32 = capex__sumsq_F32(x + off, n * 233 + off);
                a16 = capex__sumsq_BF16(b + off, n * 233 + off);
                CT_CHECK(same_bits(&p32, &a32, 1, 8), "f32 fma %d n %lld: %.17g vs %.17g", fma,
                         (long long)(n * 233 + off), p32, a32);
                CT_CHECK(same_bits(&p16, &a16, 1, 8), "bf16 fma %d n %lld: %.17g vs %.17g", fma,
                         (long long)(n * 233 + off), p16, a16);
                ah = capex__sumsq_F16(h + off, n * 233 + off);
                CT_CHECK(same_bits(&ph, &ah, 1, 8), "fp16 fma %d n %lld: %.17g vs %.17g", fma,
                         (long long)(n * 233 + off), ph, ah);
                __atomic_store_n(&capex__f16c_state, 1, __ATOMIC_RELAXED); /* fp16 blocks converted in software */
                ah = capex__sumsq_F16(h + off, n * 233 + off);
                CT_CHECK(same_bits(&ph, &ah, 1, 8), "fp16 no F16C fma %d n %lld: %.17g vs %.17g", fma,
                         (long long)(n * 233 + off), ph, ah);
                __atomic_store_n(&capex__f16c_state, 0, __ATOMIC_RELAXED);
            }
            if (ct->failed) return;
        }
    CT_CHECK(capex__fma_ok() == !!__builtin_cpu_supports("fma"), "FMA probe");
    x[5] = INFINITY; b[17] = 0x7fc1;
    CT_CHECK(capex__sumsq_F32(x, 100) == INFINITY && capex__sumsq_BF16(b, 100) != capex__sumsq_BF16(b, 100), "inf, NaN");
#endif
}

/* Two NaNs of opposite sign in every pair of lanes (the same lane too), for
   each dtype: every path gives the same NaN bits. Which input NaN an add
   passes on follows the operand order the compiler picks, and gcc -O3
   -march=native picks differently in the F16C branch (fp16 total -nan where
   the portable loop gave nan) and within the AVX lanes; sums that are NaN
   come out as one canonical NaN. */
CT_TEST(sumsq_nan_pairs_same_bits) {
#ifndef CAPEX__F16C
    CT_SKIP("built without x86 SIMD paths");
#else
    static const int64_t ns[] = {32, 47, 300, 1999};
    static float x[2000];
    static uint16_t h[2000], b[2000];
    const uint32_t qp = 0x7fc00001u, qn = 0xffc00003u;
    int la, lb, k, dt, path;
    int64_t i;
    force_portable(0);
    if (!capex__avx_ok()) CT_SKIP("this CPU has no AVX");
    for (la = 0; la < 16; la++)
        for (lb = 0; lb < 16; lb++)
            for (k = 0; k < 4; k++) {
                for (i = 0; i < 2000; i++) {
                    x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
                    h[i] = capex_f32_to_f16(x[i]);
                    b[i] = capex_f32_to_bf16(x[i]);
                }
                memcpy(&x[la], &qp, 4); memcpy(&x[16 + lb], &qn, 4);
                h[la] = 0x7c01; h[16 + lb] = 0xfe03; /* a signalling and a negative quiet NaN */
                b[la] = 0x7fc1; b[16 + lb] = 0xffc3;
                for (dt = 0; dt < 3; dt++) {
                    double ref = 0.0, s;
                    for (path = 0; path < 4; path++) { /* portable; AVX; AVX+FMA; AVX with fp16 converted first */
                        force_portable(path == 0);
                        __atomic_store_n(&capex__fma_state, path == 2 ? 0 : 1, __ATOMIC_RELAXED);
                        if (path == 3) __atomic_store_n(&capex__f16c_state, 1, __ATOMIC_RELAXED);
                        s = dt == 0 ? capex__sumsq_F32(x, ns[k]) : dt == 1 ? capex__sumsq_F16(h, ns[k]) : capex__sumsq_BF16(b, ns[k]);
                        if (path == 0) ref = s;
                        CT_CHECK(s != s && same_bits(&ref, &s, 1, 8), "dtype %d lanes %d %d n %lld path %d: %a vs %a", dt,
                                 la, lb, (long long)ns[k], path, ref, s);
                    }
                }
            }
    force_portable(0);
    __atomic_store_n(&capex__fma_state, 0, __ATOMIC_RELAXED);
#endif
}

/* LayerNorm / RMSNorm forward and backward on fp16 x, y, dy, dx. */
CT_TEST(norms_fp16_same_bits) {
#ifndef CAPEX__F16C
    CT_SKIP("built without F16C");
#else
    enum { R = 37, C = 1029, N = R * C };
    static uint16_t x[N], dy[N], y[2][N], dx[2][N];
    static float w[C], b[C], mean[2][R], rstd[2][R], dw[2][C], db[2][C];
    int k, rms;
    int64_t i;
    force_portable(0);
    if (!capex__f16c_ok()) CT_SKIP("this CPU has no F16C");
    rng = 5;
    for (i = 0; i < N; i++) { x[i] = capex_f32_to_f16(grad_value(i)); dy[i] = capex_f32_to_f16(urand()); }
    for (i = 0; i < C; i++) { w[i] = 1.0f + 0.1f * urand(); b[i] = 0.1f * urand(); }
    for (rms = 0; rms < 2; rms++) {
        for (k = 0; k < 2; k++) {
            capex_norm_desc d;
            capex_norm_args a;
            force_portable(k == 0);
            capex_norm_desc_init(&d);
            capex_norm_args_init(&a);
            a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = CAPEX_F16;
            a.x = x; a.y = y[k]; a.weight = w; a.bias = rms ? NULL : b; a.mean = mean[k]; a.rstd = rstd[k];
            a.dy = dy; a.dx = dx[k]; a.dweight = dw[k]; a.dbias = rms ? NULL : db[k];
            CT_CHECK((rms ? capex_rms_norm_forward(&d, &a) : capex_layer_norm_forward(&d, &a)) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK((rms ? capex_rms_norm_backward(&d, &a) : capex_layer_norm_backward(&d, &a)) == CAPEX_OK, "%s", capex_last_error());
        }
        CT_CHECK(same_bits(y[0], y[1], N, 2) && same_bits(rstd[0], rstd[1], R, 4) && same_bits(mean[0], mean[1], R, 4),
                 "%s forward differs between F16C and portable", rms ? "rms" : "layer");
        CT_CHECK(same_bits(dx[0], dx[1], N, 2) && same_bits(dw[0], dw[1], C, 4) && (rms || same_bits(db[0], db[1], C, 4)),
                 "%s backward differs between F16C and portable", rms ? "rms" : "layer");
    }
#endif
}

/* Unscale (f16 -> f32, f32 -> f16, f16 in place) and the norms of fp16 data. */
CT_TEST(tensor_ops_same_bits) {
#ifndef CAPEX__F16C
    CT_SKIP("built without F16C");
#else
    capex_tensor_op_desc d;
    capex_tensor ht[NT], ft[NT], ot[NT];
    uint16_t *h[NT], *o[NT][2];
    float *f[NT][2], tot[2], per[2][NT];
    double sts[2];
    int t, k;
    int64_t i;
    force_portable(0);
    if (!capex__f16c_ok()) CT_SKIP("this CPU has no F16C");
    rng = 77;
    capex_tensor_op_desc_init(&d);
    for (t = 0; t < NT; t++) {
        h[t] = (uint16_t *)malloc((size_t)sizes[t] * 2);
        for (i = 0; i < sizes[t]; i++) h[t][i] = capex_f32_to_f16(grad_value(i));
        if (t == 1) h[t][3] = 0x7d01; /* a signalling NaN in a group of 8 */
        ht[t].data = h[t]; ht[t].numel = sizes[t];
        for (k = 0; k < 2; k++) {
            f[t][k] = (float *)malloc((size_t)sizes[t] * 4);
            o[t][k] = (uint16_t *)malloc((size_t)sizes[t] * 2);
        }
    }
    for (k = 0; k < 2; k++) {
        capex_tensor_list hl, fl, ol;
        double st, sp[NT];
        int inf1 = 0, inf2 = 0;
        force_portable(k == 0);
        for (t = 0; t < NT; t++) { ft[t].data = f[t][k]; ft[t].numel = sizes[t]; ot[t].data = o[t][k]; ot[t].numel = sizes[t]; }
        hl = capex_tensor_list_make(CAPEX_F16, ht, NT);
        fl = capex_tensor_list_make(CAPEX_F32, ft, NT);
        ol = capex_tensor_list_make(CAPEX_F16, ot, NT);
        CT_CHECK(capex_multi_tensor_scale(&d, &hl, &fl, 1.0f / 1024, &inf1) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_multi_tensor_scale(&d, &fl, &ol, 3.0f, &inf2) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(inf1 == 1 && inf2 == 1, "the NaN is found (%d %d)", inf1, inf2);
        h[1][3] = 0x3c00; /* norms of finite data */
        CT_CHECK(capex_multi_tensor_l2norm(&d, &hl, &tot[k], per[k]) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_multi_tensor_sumsq(&d, &hl, &st, sp) == CAPEX_OK, "%s", capex_last_error());
        h[1][3] = 0x7d01;
        sts[k] = st;
        if (k == 1) {
            for (t = 0; t < NT; t++) {
                CT_CHECK(same_bits(f[t][0], f[t][1], sizes[t], 4), "unscale f16->f32 tensor %d", t);
                CT_CHECK(same_bits(o[t][0], o[t][1], sizes[t], 2), "scale f32->f16 tensor %d", t);
                CT_CHECK(same_bits(&per[0][t], &per[1][t], 1, 4), "l2norm tensor %d: %.9g vs %.9g", t, per[0][t], per[1][t]);
            }
            CT_CHECK(same_bits(&tot[0], &tot[1], 1, 4) && same_bits(&sts[0], &sts[1], 1, 8), "total l2norm / sumsq");
        }
    }
    for (t = 0; t < NT; t++) {
        free(h[t]);
        for (k = 0; k < 2; k++) { free(f[t][k]); free(o[t][k]); }
    }
#endif
}

static const ct_case cases[] = {CT_CASE(optimizers_same_bits), CT_CASE(f16_grads_equal_f32_grads), CT_CASE(sumsq_same_bits), CT_CASE(sumsq_nan_pairs_same_bits),
                                CT_CASE(norms_fp16_same_bits), CT_CASE(tensor_ops_same_bits)};
CT_MAIN(cases)
