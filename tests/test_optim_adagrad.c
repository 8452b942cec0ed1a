/* Adagrad (CAPEX_OPTIM_ADAGRAD: Apex FusedAdagrad's L2 and W modes with
   torch's lr_decay and initial_accumulator_value) and Adam amsgrad: float64
   references on fresh random inputs for every grad/model-copy dtype (first
   step onwards, empty tensors, loss scale and clip folded in); Apex's float32
   operation order bit for bit; golden vectors from torch.optim
   (tests/gen_adagrad_golden.py -> tests/data/optim_adagrad_golden.h);
   found_inf skips with NaN/Inf grads; NaN propagation of amsgrad's max;
   state save/load, resume and refusals; bad input. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>

#define OPTIM_TEST_SEED 0x9e3779b97f4a7c15ull
#include "optim_test_util.h"

/* ---- float64 references ---- */

typedef struct cfg {
    capex_optim_kind kind;
    int w;
    capex_optim_hparams hp;
} cfg;

/* One element, double. Adagrad: v is the sum. Adam amsgrad: vm the max. */
static double ref_elem(const cfg *c, int64_t step, double p, double g, double *m, double *v, double *vm) {
    const capex_optim_hparams *hp = &c->hp;
    if (c->kind == CAPEX_OPTIM_ADAGRAD) {
        double clr = (double)hp->lr / (1.0 + (double)(step - 1) * (double)hp->lr_decay);
        if (!c->w) g += (double)hp->weight_decay * p;
        *v += g * g;
        return p - clr * (g / (sqrt(*v) + (double)hp->eps) + (c->w ? (double)hp->weight_decay * p : 0.0));
    } else {
        double b1 = hp->beta1, b2 = hp->beta2, bc1 = 1.0, bc2 = 1.0, u;
        if (hp->bias_correction) { bc1 = 1.0 - pow(b1, (double)step); bc2 = 1.0 - pow(b2, (double)step); }
        if (!c->w) g += (double)hp->weight_decay * p;
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        if (hp->amsgrad && *v > *vm) *vm = *v;
        u = (*m / bc1) / (sqrt((hp->amsgrad ? *vm : *v) / bc2) + (double)hp->eps);
        return p - (double)hp->lr * (u + (c->w ? (double)hp->weight_decay * p : 0.0));
    }
}

#define NT 4
typedef struct problem {
    int64_t sz[NT];
    capex_dtype gt, mt;
    float *p[NT];
    void *g[NT];
    uint16_t *model[NT];
    double *rp[NT], *rm[NT], *rv[NT], *rvm[NT], *rg[NT];
} problem;

static void problem_init(problem *pr, const int64_t *sz, capex_dtype gt, capex_dtype mt, double v0) {
    int t;
    int64_t i;
    memset(pr, 0, sizeof *pr);
    pr->gt = gt; pr->mt = mt;
    for (t = 0; t < NT; t++) {
        size_t n = (size_t)(sz[t] ? sz[t] : 1);
        pr->sz[t] = sz[t];
        pr->p[t] = (float *)malloc(n * 4);
        pr->g[t] = malloc(n * 4);
        pr->model[t] = mt != CAPEX_F32 ? (uint16_t *)malloc(n * 2) : NULL;
        pr->rp[t] = (double *)calloc(n, 8); pr->rm[t] = (double *)calloc(n, 8);
        pr->rv[t] = (double *)calloc(n, 8); pr->rvm[t] = (double *)calloc(n, 8); pr->rg[t] = (double *)calloc(n, 8);
        for (i = 0; i < sz[t]; i++) {
            pr->p[t][i] = (float)nrand();
            pr->rp[t][i] = pr->p[t][i];
            pr->rv[t][i] = v0;
        }
        if (pr->model[t]) memset(pr->model[t], 0xff, n * 2);
    }
}
static void problem_free(problem *pr) {
    int t;
    for (t = 0; t < NT; t++) {
        free(pr->p[t]); free(pr->g[t]); free(pr->model[t]);
        free(pr->rp[t]); free(pr->rm[t]); free(pr->rv[t]); free(pr->rvm[t]); free(pr->rg[t]);
    }
}
static void problem_params(const problem *pr, capex_optim_param *ps) {
    int t;
    for (t = 0; t < NT; t++) {
        capex_optim_param_init(&ps[t]);
        ps[t].param = pr->p[t];
        ps[t].grad = pr->g[t];
        ps[t].grad_dtype = pr->gt;
        ps[t].numel = pr->sz[t];
        if (pr->model[t]) { ps[t].model = pr->model[t]; ps[t].model_dtype = pr->mt; }
    }
}

static int close_to(double got, double want, double rel, double abs_) {
    return fabs(got - want) <= abs_ + rel * fabs(want);
}

/* nsteps on fresh random inputs, compared with float64 after every step
   (the first included). Grad magnitudes change per step so that amsgrad's
   max and the Adagrad sum see both growth and decay. */
static int run_vs_ref(ct_state *ct, const cfg *c, capex_dtype gt, capex_dtype mt, int nsteps, const char *what) {
    const int64_t big = gt == CAPEX_F32 && mt == CAPEX_F32 ? 70001 : 1003;
    const int64_t sz[NT] = {257, 1, 0, big}; /* an empty tensor among them */
    static const double gmul[6] = {1.0, 0.05, 3.0, 0.2, 1.0, 0.5};
    const float scale = gt == CAPEX_BF16 ? 1.0f : 1024.0f, clip = 0.5f;
    double v0 = c->kind == CAPEX_OPTIM_ADAGRAD ? (double)c->hp.initial_accumulator_value : 0.0;
    problem pr;
    capex_optim_desc d;
    capex_optim *opt = NULL;
    capex_optim_param ps[NT];
    int s, t;
    int64_t i;
    problem_init(&pr, sz, gt, mt, v0);
    capex_optim_desc_init(&d, c->kind);
    d.defaults = c->hp;
    d.adam_w_mode = c->w;
    problem_params(&pr, ps);
    REQ(capex_optim_create(&d, &opt) == CAPEX_OK, "%s: create: %s", what, capex_last_error());
    REQ(capex_optim_add_group(opt, NULL, ps, NT, NULL) == CAPEX_OK, "%s: add_group: %s", what, capex_last_error());
    for (s = 1; s <= nsteps; s++) {
        double unscale = (double)(1.0f / scale) * (double)clip;
        for (t = 0; t < NT; t++)
            for (i = 0; i < sz[t]; i++) {
                float stored = put(pr.g[t], gt, (size_t)i, (float)(nrand() * 0.1 * gmul[(s - 1) % 6] * scale));
                pr.rg[t][i] = (double)stored * unscale;
                pr.rp[t][i] = ref_elem(c, s, pr.rp[t][i], pr.rg[t][i], &pr.rm[t][i], &pr.rv[t][i], &pr.rvm[t][i]);
            }
        REQ(capex_optim_step(opt, 1.0f / scale, clip, 0) == CAPEX_OK, "%s: step: %s", what, capex_last_error());
        for (t = 0; t < NT; t++) {
            float *m = NULL, *v = NULL, *vm = NULL;
            capex_optim_get_state(opt, 0, (size_t)t, &m, &v);
            capex_optim_get_max_exp_avg_sq(opt, 0, (size_t)t, &vm);
            REQ(c->kind == CAPEX_OPTIM_ADAGRAD ? !m : (m != NULL || !sz[t]), "%s: exp_avg presence", what);
            REQ(!sz[t] || (vm != NULL) == (c->kind == CAPEX_OPTIM_ADAM && c->hp.amsgrad), "%s: max buffer presence", what);
            for (i = 0; i < sz[t]; i++) {
                double want = pr.rp[t][i], got = pr.p[t][i];
                if (!close_to(got, want, 2e-5, 2e-5))
                    REQ(0, "%s: step %d tensor %d [%lld]: p %.9g want %.9g", what, s, t, (long long)i, got, want);
                if (m && !close_to(m[i], pr.rm[t][i], 1e-5, 1e-6))
                    REQ(0, "%s: step %d tensor %d [%lld]: m %.9g want %.9g", what, s, t, (long long)i, (double)m[i],
                        pr.rm[t][i]);
                if (!close_to(v[i], pr.rv[t][i], 1e-5, 1e-9))
                    REQ(0, "%s: step %d tensor %d [%lld]: v/sum %.9g want %.9g", what, s, t, (long long)i,
                        (double)v[i], pr.rv[t][i]);
                if (vm && !close_to(vm[i], pr.rvm[t][i], 1e-5, 1e-9))
                    REQ(0, "%s: step %d tensor %d [%lld]: max_exp_avg_sq %.9g want %.9g", what, s, t, (long long)i,
                        (double)vm[i], pr.rvm[t][i]);
                if (pr.model[t]) {
                    uint16_t wh = mt == CAPEX_F16 ? capex_f32_to_f16(pr.p[t][i]) : capex_f32_to_bf16(pr.p[t][i]);
                    if (pr.model[t][i] != wh)
                        REQ(0, "%s: tensor %d [%lld]: model 0x%04x want 0x%04x", what, t, (long long)i, pr.model[t][i],
                            wh);
                }
            }
        }
    }
    capex_optim_destroy(opt);
    problem_free(&pr);
    return 0;
}

static int run_all_dtypes(ct_state *ct, const cfg *c, int nsteps, const char *what) {
    static const capex_dtype gts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const capex_dtype mts[3] = {CAPEX_F32 /* none */, CAPEX_F16, CAPEX_BF16};
    int a, b;
    char name[200];
    for (a = 0; a < 3; a++)
        for (b = 0; b < 3; b++) {
            snprintf(name, sizeof name, "%s grad %s model %s", what, capex_dtype_name(gts[a]),
                     mts[b] == CAPEX_F32 ? "none" : capex_dtype_name(mts[b]));
            if (run_vs_ref(ct, c, gts[a], mts[b], nsteps, name)) return 1;
        }
    return 0;
}

static cfg make_cfg(capex_optim_kind kind) {
    cfg c;
    capex_optim_desc d;
    capex_optim_desc_init(&d, kind);
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.hp = d.defaults;
    c.w = d.adam_w_mode;
    return c;
}

CT_TEST(adagrad_vs_float64) {
    cfg c = make_cfg(CAPEX_OPTIM_ADAGRAD);
    int w;
    CT_CHECK(c.w == 0 && c.hp.lr == 1e-2f && c.hp.eps == 1e-10f && c.hp.weight_decay == 0.0f &&
             c.hp.lr_decay == 0.0f && c.hp.initial_accumulator_value == 0.0f,
             "Adagrad defaults are Apex FusedAdagrad's / torch's (lr 1e-2, eps 1e-10, L2 mode)");
    for (w = 0; w < 2; w++) {
        char what[96];
        c.w = w;
        c.hp.lr = 0.05f; c.hp.lr_decay = 0.1f; c.hp.initial_accumulator_value = 0.25f;
        c.hp.weight_decay = w ? 0.05f : 0.02f;
        snprintf(what, sizeof what, "adagrad w=%d", w);
        if (run_all_dtypes(ct, &c, 5, what)) return;
    }
    /* plain: no decay of any kind, sum from 0 (first step: p -= lr*g/(|g|+eps)) */
    c = make_cfg(CAPEX_OPTIM_ADAGRAD);
    c.hp.eps = 1e-6f;
    if (run_vs_ref(ct, &c, CAPEX_F32, CAPEX_F32, 3, "adagrad defaults")) return;
}

CT_TEST(adam_amsgrad_vs_float64) {
    cfg c = make_cfg(CAPEX_OPTIM_ADAM);
    int w, bc;
    CT_CHECK(c.hp.amsgrad == 0, "amsgrad defaults to off");
    for (w = 0; w < 2; w++)
        for (bc = 0; bc < 2; bc++) {
            char what[96];
            c.w = w;
            c.hp.amsgrad = 1;
            c.hp.bias_correction = bc;
            c.hp.lr = 1e-2f; c.hp.beta2 = 0.9f; /* a short v memory: the max differs from v */
            c.hp.weight_decay = w ? 0.1f : 0.01f;
            snprintf(what, sizeof what, "adam amsgrad w=%d bc=%d", w, bc);
            if (run_all_dtypes(ct, &c, 6, what)) return;
        }
}

/* ---- Apex's float32 order, bit for bit ---- */

/* Transcriptions of AdagradFunctor (csrc/multi_tensor_adagrad.cu, MATH_T =
   float) and of AdamFunctor with torch's max inserted before the denominator. */
static float apex_adagrad(float p, float g, float *h, float eps, float lr, int w, float wd) {
    if (!w) {
        g = g + wd * p;
        *h = *h + g * g;
        return p - lr * (g / (sqrtf(*h) + eps));
    }
    *h = *h + g * g;
    return p - lr * (g / (sqrtf(*h) + eps) + wd * p);
}
static float apex_adam_ams(float p, float g, float *m, float *v, float *vm, float b1, float b2, float bc1, float bc2,
                           float eps, float lr, int w, float wd) {
    float denom, update;
    if (!w) g = g + (wd * p);
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    if (*v > *vm) *vm = *v;
    denom = sqrtf(*vm / bc2) + eps;
    update = (*m / bc1) / denom;
    if (w) update = update + (wd * p);
    return p - (lr * update);
}

CT_TEST(apex_order_bitexact) {
    int kind, w, s;
    int64_t i, n = 3001;
    float *p = (float *)malloc((size_t)n * 4), *g = (float *)malloc((size_t)n * 4);
    float *rp = (float *)malloc((size_t)n * 4), *rm = (float *)calloc((size_t)n, 4), *rv = (float *)calloc((size_t)n, 4);
    float *rvm = (float *)calloc((size_t)n, 4);
    for (kind = 0; kind < 2; kind++)
        for (w = 0; w < 2; w++) {
            capex_optim_desc d;
            capex_optim *opt = NULL;
            capex_optim_param ps;
            float *m = NULL, *v = NULL, *vm = NULL;
            capex_optim_desc_init(&d, kind ? CAPEX_OPTIM_ADAGRAD : CAPEX_OPTIM_ADAM);
            d.adam_w_mode = w;
            d.defaults.lr = 0.03f; d.defaults.weight_decay = 0.07f; d.defaults.beta2 = 0.8f;
            d.defaults.amsgrad = !kind; d.defaults.lr_decay = 0.3f; d.defaults.initial_accumulator_value = 0.5f;
            for (i = 0; i < n; i++) {
                p[i] = rp[i] = (float)nrand();
                rm[i] = 0.0f; rvm[i] = 0.0f; rv[i] = kind ? 0.5f : 0.0f;
            }
            capex_optim_param_init(&ps);
            ps.param = p; ps.grad = g; ps.numel = n;
            CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK && capex_optim_add_group(opt, NULL, &ps, 1, NULL) == CAPEX_OK,
                     "%.300s", capex_last_error());
            for (s = 1; s <= 4; s++) {
                float bc1 = (float)(1.0 - pow((double)d.defaults.beta1, (double)s));
                float bc2 = (float)(1.0 - pow((double)d.defaults.beta2, (double)s));
                float clr = (float)((double)d.defaults.lr / (1.0 + (double)(s - 1) * (double)d.defaults.lr_decay));
                for (i = 0; i < n; i++) {
                    g[i] = (float)(nrand() * (s == 2 ? 0.01 : 1.0));
                    rp[i] = kind ? apex_adagrad(rp[i], g[i], &rv[i], d.defaults.eps, clr, w, d.defaults.weight_decay)
                                 : apex_adam_ams(rp[i], g[i], &rm[i], &rv[i], &rvm[i], d.defaults.beta1, d.defaults.beta2,
                                                 bc1, bc2, d.defaults.eps, d.defaults.lr, w, d.defaults.weight_decay);
                }
                CT_CHECK(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%.300s", capex_last_error());
            }
            capex_optim_get_state(opt, 0, 0, &m, &v);
            capex_optim_get_max_exp_avg_sq(opt, 0, 0, &vm);
            for (i = 0; i < n; i++) {
                CT_CHECK(f_bits(p[i]) == f_bits(rp[i]) && f_bits(v[i]) == f_bits(rv[i]),
                         "%s w=%d [%lld]: p %.9g want %.9g, v %.9g want %.9g", kind ? "adagrad" : "amsgrad", w,
                         (long long)i, (double)p[i], (double)rp[i], (double)v[i], (double)rv[i]);
                if (!kind)
                    CT_CHECK(f_bits(m[i]) == f_bits(rm[i]) && f_bits(vm[i]) == f_bits(rvm[i]), "amsgrad w=%d [%lld] m/vmax",
                             w, (long long)i);
            }
            capex_optim_destroy(opt);
        }
    free(p); free(g); free(rp); free(rm); free(rv); free(rvm);
}

/* torch.maximum propagates NaN from either side; so does capex__ams_max. */
CT_TEST(amsgrad_max_propagates_nan) {
    float nan = (float)NAN, inf = (float)INFINITY;
    CT_CHECK(capex__ams_max(1.0f, 2.0f) == 2.0f && capex__ams_max(2.0f, 1.0f) == 2.0f, "max");
    CT_CHECK(capex__ams_max(1.0f, inf) == inf, "inf wins");
    CT_CHECK(capex__ams_max(1.0f, nan) != capex__ams_max(1.0f, nan), "NaN v propagates");
    CT_CHECK(capex__ams_max(nan, 1.0f) != capex__ams_max(nan, 1.0f), "NaN max stays NaN");
}

/* ---- golden vectors from torch.optim (and Apex's W mode in float64) ---- */

typedef struct golden_case {
    const char *name;
    int kind, w, nsteps;
    float lr, beta1, beta2, eps, wd, lr_decay, init_acc;
    int amsgrad;
    const float *p0, *grads, *pfinal, *state;
} golden_case;
#include "data/optim_adagrad_golden.h"

CT_TEST(golden_torch) {
    size_t c;
    int t, s;
    int64_t total = 0, i, off;
    for (t = 0; t < (int)(sizeof golden_sizes / sizeof golden_sizes[0]); t++) total += golden_sizes[t];
    for (c = 0; c < sizeof golden_cases / sizeof golden_cases[0]; c++) {
        const golden_case *gc = &golden_cases[c];
        capex_optim_desc d;
        capex_optim *opt = NULL;
        capex_optim_param ps[3];
        float *p = (float *)malloc((size_t)total * 4), *g = (float *)malloc((size_t)total * 4);
        capex_optim_desc_init(&d, (capex_optim_kind)gc->kind);
        d.adam_w_mode = gc->w;
        d.defaults.lr = gc->lr; d.defaults.eps = gc->eps; d.defaults.weight_decay = gc->wd;
        if (gc->kind == CAPEX_OPTIM_ADAM) { d.defaults.beta1 = gc->beta1; d.defaults.beta2 = gc->beta2; }
        d.defaults.lr_decay = gc->lr_decay; d.defaults.initial_accumulator_value = gc->init_acc;
        d.defaults.amsgrad = gc->amsgrad;
        memcpy(p, gc->p0, (size_t)total * 4);
        for (t = 0, off = 0; t < 3; off += golden_sizes[t], t++) {
            capex_optim_param_init(&ps[t]);
            ps[t].param = p + off; ps[t].grad = g + off; ps[t].numel = golden_sizes[t];
        }
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK && capex_optim_add_group(opt, NULL, ps, 3, NULL) == CAPEX_OK,
                 "%s: %.300s", gc->name, capex_last_error());
        for (s = 0; s < gc->nsteps; s++) {
            memcpy(g, gc->grads + (size_t)s * (size_t)total, (size_t)total * 4);
            CT_CHECK(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%.300s", capex_last_error());
        }
        for (t = 0, off = 0; t < 3; off += golden_sizes[t], t++) {
            float *m = NULL, *v = NULL, *vm = NULL, *st;
            capex_optim_get_state(opt, 0, (size_t)t, &m, &v);
            capex_optim_get_max_exp_avg_sq(opt, 0, (size_t)t, &vm);
            st = gc->amsgrad ? vm : v;
            CT_CHECK(st != NULL, "%s: state buffer", gc->name);
            for (i = 0; i < golden_sizes[t]; i++) {
                double want = gc->pfinal[off + i], wst = gc->state[off + i];
                CT_CHECK(close_to(p[off + i], want, 1e-5, 1e-6), "%s: tensor %d [%lld]: p %.9g torch %.9g", gc->name, t,
                         (long long)i, (double)p[off + i], want);
                CT_CHECK(close_to(st[i], wst, 1e-5, 1e-9), "%s: tensor %d [%lld]: %s %.9g torch %.9g", gc->name, t,
                         (long long)i, gc->amsgrad ? "max_exp_avg_sq" : "sum", (double)st[i], wst);
            }
        }
        capex_optim_destroy(opt);
        free(p); free(g);
    }
}

/* ---- found_inf: NaN/Inf grads, step skipped, nothing changes ---- */

typedef struct rig {
    capex_optim *opt;
    int64_t n;
    float *p, *gf;
    uint16_t *g, *model;
} rig;

static int rig_make(ct_state *ct, rig *r, capex_optim_kind kind, int w, int64_t n) {
    capex_optim_desc d;
    capex_optim_param ps;
    int64_t i;
    uint64_t keep = rng_state;
    rng_state = 0x1234567ull; /* both rigs start equal */
    memset(r, 0, sizeof *r);
    r->n = n;
    r->p = (float *)malloc((size_t)n * 4);
    r->g = (uint16_t *)malloc((size_t)n * 2);
    r->model = (uint16_t *)malloc((size_t)n * 2);
    for (i = 0; i < n; i++) r->p[i] = (float)nrand();
    rng_state = keep;
    capex_optim_desc_init(&d, kind);
    d.adam_w_mode = w;
    d.defaults.weight_decay = 0.01f; d.defaults.lr_decay = 0.01f; d.defaults.initial_accumulator_value = 0.1f;
    d.defaults.amsgrad = kind == CAPEX_OPTIM_ADAM;
    capex_optim_param_init(&ps);
    ps.param = r->p; ps.grad = r->g; ps.grad_dtype = CAPEX_F16; ps.numel = n;
    ps.model = r->model; ps.model_dtype = CAPEX_BF16;
    REQ(capex_optim_create(&d, &r->opt) == CAPEX_OK && capex_optim_add_group(r->opt, NULL, &ps, 1, NULL) == CAPEX_OK,
        "%.300s", capex_last_error());
    return 0;
}
static void rig_grads(rig *r, int step) {
    uint64_t keep = rng_state;
    int64_t i;
    rng_state = 0xabcdefull + (uint64_t)step;
    for (i = 0; i < r->n; i++) r->g[i] = capex_f32_to_f16((float)(nrand() * 100.0));
    rng_state = keep;
}
static void rig_free(rig *r) {
    capex_optim_destroy(r->opt);
    free(r->p); free(r->g); free(r->model);
}
static int rig_same(ct_state *ct, const rig *a, const rig *b, const char *what) {
    float *ma, *va, *mb, *vb, *xa, *xb;
    int64_t sa = -1, sb = -2;
    capex_optim_get_state(a->opt, 0, 0, &ma, &va);
    capex_optim_get_state(b->opt, 0, 0, &mb, &vb);
    capex_optim_get_max_exp_avg_sq(a->opt, 0, 0, &xa);
    capex_optim_get_max_exp_avg_sq(b->opt, 0, 0, &xb);
    capex_optim_get_step(a->opt, 0, &sa);
    capex_optim_get_step(b->opt, 0, &sb);
    REQ(sa == sb, "%s: step %lld vs %lld", what, (long long)sa, (long long)sb);
    REQ(!memcmp(a->p, b->p, (size_t)a->n * 4) && !memcmp(a->model, b->model, (size_t)a->n * 2), "%s: params/model", what);
    REQ(!memcmp(va, vb, (size_t)a->n * 4), "%s: v/sum", what);
    REQ((!ma && !mb) || !memcmp(ma, mb, (size_t)a->n * 4), "%s: m", what);
    REQ((!xa && !xb) || !memcmp(xa, xb, (size_t)a->n * 4), "%s: max_exp_avg_sq", what);
    return 0;
}

CT_TEST(found_inf_skips_bit_identical) {
    int k, w;
    int64_t i;
    for (k = 0; k < 2; k++)
        for (w = 0; w < 2; w++) {
            rig a, b;
            capex_optim_kind kind = k ? CAPEX_OPTIM_ADAGRAD : CAPEX_OPTIM_ADAM;
            if (rig_make(ct, &a, kind, w, 70003) || rig_make(ct, &b, kind, w, 70003)) return;
            rig_grads(&a, 1); rig_grads(&b, 1);
            CT_CHECK(capex_optim_step(a.opt, 0.01f, 1.0f, 0) == CAPEX_OK && capex_optim_step(b.opt, 0.01f, 1.0f, 0) == CAPEX_OK,
                     "%.300s", capex_last_error());
            /* b: an overflowing step, Inf and NaN grads, found_inf set */
            for (i = 0; i < b.n; i++) b.g[i] = i % 2 ? 0x7c00u : 0x7e00u;
            CT_CHECK(capex_optim_step(b.opt, 0.01f, 1.0f, 1) == CAPEX_OK, "%.300s", capex_last_error());
            if (rig_same(ct, &a, &b, "after a skipped step")) return;
            rig_grads(&a, 2); rig_grads(&b, 2);
            capex_optim_step(a.opt, 0.01f, 0.5f, 0); capex_optim_step(b.opt, 0.01f, 0.5f, 0);
            if (rig_same(ct, &a, &b, "after skip + step")) return;
            rig_free(&a); rig_free(&b);
        }
}

/* ---- state: resume, refusals, old files ---- */

static int save_mem(ct_state *ct, const capex_optim *opt, unsigned flags, void **buf, size_t *len) {
    capex_state_writer *w;
    REQ(capex_state_writer_create(NULL, &w) == CAPEX_OK, "%.300s", capex_last_error());
    REQ(capex_optim_save(opt, w, NULL, flags) == CAPEX_OK, "save: %.300s", capex_last_error());
    REQ(capex_state_write_memory(w, NULL, 0, len) == CAPEX_OK, "%.300s", capex_last_error());
    *buf = malloc(*len);
    REQ(capex_state_write_memory(w, *buf, *len, len) == CAPEX_OK, "%.300s", capex_last_error());
    capex_state_writer_destroy(w);
    return 0;
}
static capex_result load_mem(capex_optim *opt, const void *buf, size_t len, unsigned flags) {
    capex_state_reader *rd;
    capex_result r = capex_state_reader_open_memory(buf, len, 0, NULL, &rd);
    if (r != CAPEX_OK) return r;
    r = capex_optim_load(opt, rd, NULL, flags);
    capex_state_reader_close(rd);
    return r;
}
/* A copy of a state file without the entries whose names end in one of drop
   (NULL-terminated): a file as an older capex wrote it. */
static int strip_mem(ct_state *ct, const void *buf, size_t len, const char *const *drop, void **out, size_t *olen) {
    capex_state_reader *rd;
    capex_state_writer *w;
    size_t k, n;
    void **keep;
    REQ(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "%.300s", capex_last_error());
    REQ(capex_state_writer_create(NULL, &w) == CAPEX_OK, "%.300s", capex_last_error());
    n = capex_state_tensor_count(rd);
    keep = (void **)calloc(n + 1, sizeof *keep);
    for (k = 0; k < n; k++) {
        capex_state_tensor_info info;
        const char *const *d;
        int skip = 0;
        void *data;
        REQ(capex_state_tensor_at(rd, k, &info) == CAPEX_OK, "%.300s", capex_last_error());
        for (d = drop; *d; d++) {
            size_t a = strlen(info.name), b = strlen(*d);
            if (a >= b && !strcmp(info.name + a - b, *d)) skip = 1;
        }
        if (skip) continue;
        data = malloc((size_t)info.numel * capex_state_dtype_size(info.dtype) + 8);
        REQ(capex_state_read_tensor(rd, info.name, info.dtype, (uint64_t)info.numel, data) == CAPEX_OK, "%.300s",
            capex_last_error());
        REQ(capex_state_add_tensor(w, info.name, info.dtype, info.ndim, info.shape, data) == CAPEX_OK, "%.300s",
            capex_last_error());
        keep[k] = data; /* the writer keeps the pointer until it writes */
    }
    REQ(capex_state_write_memory(w, NULL, 0, olen) == CAPEX_OK, "%.300s", capex_last_error());
    *out = malloc(*olen);
    REQ(capex_state_write_memory(w, *out, *olen, olen) == CAPEX_OK, "%.300s", capex_last_error());
    capex_state_writer_destroy(w);
    capex_state_reader_close(rd);
    for (k = 0; k < n; k++) free(keep[k]);
    free(keep);
    return 0;
}

CT_TEST(resume_is_bit_identical) {
    int k, s;
    for (k = 0; k < 2; k++) {
        rig a, b;
        void *buf = NULL;
        size_t len = 0;
        capex_optim_kind kind = k ? CAPEX_OPTIM_ADAGRAD : CAPEX_OPTIM_ADAM;
        if (rig_make(ct, &a, kind, 0, 5003) || rig_make(ct, &b, kind, 0, 5003)) return;
        for (s = 1; s <= 2; s++) { rig_grads(&a, s); capex_optim_step(a.opt, 0.01f, 1.0f, 0); }
        if (save_mem(ct, a.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
        CT_CHECK(load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %.300s", capex_last_error());
        if (rig_same(ct, &a, &b, "after load")) return;
        for (s = 3; s <= 4; s++) {
            rig_grads(&a, s); rig_grads(&b, s);
            capex_optim_step(a.opt, 0.01f, 1.0f, 0); capex_optim_step(b.opt, 0.01f, 1.0f, 0);
        }
        if (rig_same(ct, &a, &b, "resumed")) return;
        {
            capex_state_reader *rd;
            capex_state_tensor_info info;
            CT_CHECK(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "reopen");
            CT_CHECK(capex_state_find(rd, k ? "optim.param0.sum" : "optim.param0.max_exp_avg_sq", &info) == CAPEX_OK,
                     "the file names Adagrad's sum 'sum' (torch) and amsgrad's 'max_exp_avg_sq'");
            CT_CHECK(capex_state_find(rd, k ? "optim.param0.exp_avg" : "optim.param0.sum", &info) != CAPEX_OK,
                     "no buffer the optimizer does not have");
            capex_state_reader_close(rd);
        }
        free(buf);
        rig_free(&a); rig_free(&b);
    }
}

CT_TEST(load_refusals_and_old_files) {
    rig ada, ams, plain;
    void *buf = NULL, *old = NULL;
    size_t len = 0, olen = 0;
    static const char *const new_scalars[] = {".lr_decay", ".initial_accumulator_value", ".amsgrad", NULL};
    capex_optim_desc d;
    capex_optim_param ps;
    float pb[8] = {0}, gb[8] = {0}, *pp;
    capex_optim_hparams hp;
    if (rig_make(ct, &ada, CAPEX_OPTIM_ADAGRAD, 0, 64) || rig_make(ct, &ams, CAPEX_OPTIM_ADAM, 0, 64)) return;
    /* an Adagrad file refused by Adam, and the other way round */
    if (save_mem(ct, ada.opt, 0, &buf, &len)) return;
    CT_CHECK(load_mem(ams.opt, buf, len, 0) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "3 Adagrad"),
             "Adagrad file into Adam: %.300s", capex_last_error());
    free(buf);
    if (save_mem(ct, ams.opt, 0, &buf, &len)) return;
    CT_CHECK(load_mem(ada.opt, buf, len, 0) == CAPEX_ERR_CONFIG, "Adam file into Adagrad");
    /* an amsgrad file refused by a plain Adam and the other way round */
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    capex_optim_param_init(&ps);
    ps.param = pb; ps.grad = gb; ps.numel = 8;
    memset(&plain, 0, sizeof plain);
    CT_CHECK(capex_optim_create(&d, &plain.opt) == CAPEX_OK && capex_optim_add_group(plain.opt, NULL, &ps, 1, NULL) == CAPEX_OK,
             "%.300s", capex_last_error());
    capex_optim_get_max_exp_avg_sq(plain.opt, 0, 0, &pp);
    CT_CHECK(pp == NULL, "no max buffer without amsgrad");
    free(buf);
    {
        /* same sizes as plain: a one-tensor amsgrad optimizer of 8 */
        capex_optim *o2 = NULL;
        float p2[8] = {0}, g2[8] = {0};
        capex_optim_param q = ps;
        q.param = p2; q.grad = g2;
        d.defaults.amsgrad = 1;
        CT_CHECK(capex_optim_create(&d, &o2) == CAPEX_OK && capex_optim_add_group(o2, NULL, &q, 1, NULL) == CAPEX_OK,
                 "%.300s", capex_last_error());
        if (save_mem(ct, o2, 0, &buf, &len)) return;
        CT_CHECK(load_mem(plain.opt, buf, len, 0) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "amsgrad"),
                 "amsgrad file into plain Adam: %.300s", capex_last_error());
        free(buf);
        if (save_mem(ct, plain.opt, 0, &buf, &len)) return;
        CT_CHECK(load_mem(o2, buf, len, 0) == CAPEX_ERR_CONFIG, "plain file into amsgrad Adam");
        /* a file from before these fields (no lr_decay/initial_accumulator_value/
           amsgrad scalars) loads into a plain Adam, and is refused by amsgrad */
        if (strip_mem(ct, buf, len, new_scalars, &old, &olen)) return;
        CT_CHECK(load_mem(plain.opt, old, olen, 0) == CAPEX_OK, "old file: %.300s", capex_last_error());
        CT_CHECK(load_mem(o2, old, olen, 0) == CAPEX_ERR_CONFIG, "old file into amsgrad Adam");
        free(old); free(buf);
        /* amsgrad cannot be switched after add_group */
        CT_CHECK(capex_optim_get_hparams(plain.opt, 0, &hp) == CAPEX_OK, "get");
        hp.amsgrad = 1;
        CT_CHECK(capex_optim_set_hparams(plain.opt, 0, &hp) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "amsgrad"),
                 "turning amsgrad on later: %.300s", capex_last_error());
        capex_optim_get_hparams(o2, 0, &hp);
        hp.amsgrad = 0;
        CT_CHECK(capex_optim_set_hparams(o2, 0, &hp) == CAPEX_ERR_CONFIG, "turning amsgrad off later");
        capex_optim_destroy(o2);
    }
    /* an Adagrad file missing its sum is refused, nothing changed */
    if (save_mem(ct, ada.opt, 0, &buf, &len)) return;
    {
        static const char *const sum[] = {".sum", NULL};
        float *v0 = NULL, keep;
        capex_optim_get_state(ada.opt, 0, 0, NULL, &v0);
        keep = v0[0];
        if (strip_mem(ct, buf, len, sum, &old, &olen)) return;
        CT_CHECK(load_mem(ada.opt, old, olen, 0) != CAPEX_OK && strstr(capex_last_error(), "sum"),
                 "file without sum: %.300s", capex_last_error());
        CT_CHECK(f_bits(v0[0]) == f_bits(keep), "refused load changed the sum");
        free(old);
    }
    free(buf);
    rig_free(&ada); rig_free(&ams);
    capex_optim_destroy(plain.opt);
}

/* ---- buffers, bad input ---- */

CT_TEST(buffers_and_user_buffers) {
    capex_optim_desc d;
    capex_optim *o = NULL;
    capex_optim_param ps[2];
    float p[5] = {1, 2, 3, 4, 5}, g[5] = {1, 1, 1, 1, 1}, sum[5], mx[5] = {9, 9, 9, 9, 9}, *m, *v, *vm;
    int i;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
    d.defaults.initial_accumulator_value = 0.75f;
    capex_optim_param_init(&ps[0]); capex_optim_param_init(&ps[1]);
    ps[0].param = p; ps[0].grad = g; ps[0].numel = 5; ps[0].exp_avg_sq = sum;
    ps[1].numel = 0; /* empty: fine, nothing to do */
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK && capex_optim_add_group(o, NULL, ps, 2, NULL) == CAPEX_OK,
             "%.300s", capex_last_error());
    capex_optim_get_state(o, 0, 0, &m, &v);
    CT_CHECK(!m && v == sum, "Adagrad: no exp_avg, the user's sum buffer");
    for (i = 0; i < 5; i++) CT_CHECK(sum[i] == 0.75f, "sum starts at initial_accumulator_value");
    CT_CHECK(capex_optim_step(o, 1.0f, 1.0f, 0) == CAPEX_OK, "%.300s", capex_last_error());
    /* first step: sum = 0.75 + 1, p -= 0.01 * 1/(sqrt(1.75) + 1e-10) */
    CT_CHECK(sum[0] == 1.75f && p[0] == 1.0f - 0.01f * (1.0f / (sqrtf(1.75f) + 1e-10f)), "first step %.9g", (double)p[0]);
    capex_optim_destroy(o);
    /* amsgrad: the user's max buffer, zeroed by add_group */
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.amsgrad = 1;
    ps[0].exp_avg_sq = NULL; ps[0].max_exp_avg_sq = mx;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK && capex_optim_add_group(o, NULL, ps, 2, NULL) == CAPEX_OK,
             "%.300s", capex_last_error());
    capex_optim_get_max_exp_avg_sq(o, 0, 0, &vm);
    CT_CHECK(vm == mx && mx[0] == 0.0f && mx[4] == 0.0f, "user max buffer, zeroed");
    capex_optim_destroy(o);
    /* the same buffer as v and max is refused */
    ps[0].exp_avg_sq = mx;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK, "create");
    CT_CHECK(capex_optim_add_group(o, NULL, ps, 1, NULL) == CAPEX_ERR_INVALID_ARG, "aliased max buffer accepted");
    capex_optim_destroy(o);
}

CT_TEST(bad_input) {
    capex_optim_desc d;
    capex_optim *o = NULL;
    capex_optim_hparams hp;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
    d.defaults.lr_decay = -0.1f;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG && !o && strstr(capex_last_error(), "lr_decay"),
             "negative lr_decay: %.300s", capex_last_error());
    d.defaults.lr_decay = (float)NAN;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG, "NaN lr_decay");
    d.defaults.lr_decay = 0.0f;
    d.defaults.initial_accumulator_value = -1.0f;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "initial_accumulator"),
             "negative initial_accumulator_value: %.300s", capex_last_error());
    d.defaults.initial_accumulator_value = (float)INFINITY;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG, "inf initial_accumulator_value");
    d.defaults.initial_accumulator_value = 0.0f;
    d.defaults.eps = -1e-10f;
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "eps"), "negative eps");
    d.defaults.eps = 1e-10f;
    d.defaults.beta1 = 5.0f; /* Adagrad has no betas: ignored */
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(o, NULL, NULL, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_get_hparams(o, 0, &hp);
    hp.lr_decay = -1.0f;
    CT_CHECK(capex_optim_set_hparams(o, 0, &hp) == CAPEX_ERR_INVALID_ARG, "set_hparams validates lr_decay");
    CT_CHECK(capex_optim_step(o, 1.0f, 1.0f, 0) == CAPEX_OK, "empty optimizer steps");
    capex_optim_destroy(o);
    capex_optim_desc_init(&d, (capex_optim_kind)5);
    CT_CHECK(capex_optim_create(&d, &o) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "_ADAGRAD"),
             "unknown kind: %.300s", capex_last_error());
    CT_CHECK(capex_optim_get_max_exp_avg_sq(NULL, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "NULL optimizer");
}

CT_TEST(math_source_for_cuda) {
    size_t n = capex__optim_math_source(NULL, 0), k;
    char *buf = (char *)malloc(n + 1);
    capex__optim_math_source(buf, n + 1);
    CT_CHECK(strstr(buf, "CAPEX__QUAL float capex__adagrad_w_elem(") && strstr(buf, "capex__adagrad_l2_elem") &&
             strstr(buf, "capex__adam_ams_w_elem") && strstr(buf, "capex__ams_max"), "Adagrad/amsgrad math present");
    for (k = 0; k < sizeof capex__optim_math_parts / sizeof capex__optim_math_parts[0]; k++)
        CT_CHECK(strlen(capex__optim_math_parts[k]) < 4095, "part %zu too long for ISO C", k);
    free(buf);
}

static const ct_case cases[] = {
    CT_CASE(adagrad_vs_float64), CT_CASE(adam_amsgrad_vs_float64), CT_CASE(apex_order_bitexact),
    CT_CASE(amsgrad_max_propagates_nan), CT_CASE(golden_torch), CT_CASE(found_inf_skips_bit_identical),
    CT_CASE(resume_is_bit_identical), CT_CASE(load_refusals_and_old_files), CT_CASE(buffers_and_user_buffers),
    CT_CASE(bad_input), CT_CASE(math_source_for_cuda),
};
CT_MAIN(cases)
