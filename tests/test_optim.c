/* Optimizers: Adam/AdamW, LAMB, SGD against float64 references on random
   inputs for every mode and dtype combination; Apex's exact float32 operation
   order bit for bit; golden vectors from PyTorch (tests/gen_golden.py);
   found_inf skips; bitwise determinism across thread counts; stochastic
   rounding; bad input. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>

#define OPTIM_TEST_SEED 0x1234567887654321ull
#include "optim_test_util.h"

static float f_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- float64 reference (the formulas of Apex, in double) ---- */

typedef struct refcfg {
    capex_optim_kind kind;
    int w, nvlamb, wd_after;
    float max_grad_norm;
    capex_optim_hparams hp;
    int mom_on_step; /* SGD: > 0 adds the group with hp.momentum, sets it to 0, and back on at this step */
} refcfg;

/* One step on nt tensors; g already scaled (grad*inv_scale*clip). */
static void ref_step(const refcfg *c, int64_t step, int *mom_init, int nt, const int64_t *sz, double **p, double **m,
                     double **v, double **g) {
    const capex_optim_hparams *hp = &c->hp;
    double b1 = hp->beta1, b2 = hp->beta2, wd = hp->weight_decay, lr = hp->lr;
    double bc1 = hp->bias_correction ? 1.0 - pow(b1, (double)step) : 1.0;
    double bc2 = hp->bias_correction ? 1.0 - pow(b2, (double)step) : 1.0;
    int t;
    int64_t i;
    if (c->kind == CAPEX_OPTIM_ADAM) {
        for (t = 0; t < nt; t++)
            for (i = 0; i < sz[t]; i++) {
                double gi = g[t][i], pi = p[t][i], u;
                if (!c->w) gi += wd * pi;
                m[t][i] = b1 * m[t][i] + (1 - b1) * gi;
                v[t][i] = b2 * v[t][i] + (1 - b2) * gi * gi;
                u = (m[t][i] / bc1) / (sqrt(v[t][i] / bc2) + hp->eps);
                if (c->w) u += wd * pi;
                p[t][i] = pi - lr * u;
            }
    } else if (c->kind == CAPEX_OPTIM_SGD) {
        for (t = 0; t < nt; t++)
            for (i = 0; i < sz[t]; i++) {
                double gi = g[t][i], pi = p[t][i];
                if (wd != 0 && !(c->wd_after && hp->momentum != 0)) gi += wd * pi;
                if (hp->momentum != 0) {
                    m[t][i] = *mom_init ? hp->momentum * m[t][i] + (1 - hp->dampening) * gi : gi;
                    gi = hp->nesterov ? gi + hp->momentum * m[t][i] : m[t][i];
                    if (wd != 0 && c->wd_after) gi += wd * pi;
                }
                p[t][i] = pi - lr * gi;
            }
        if (hp->momentum != 0) *mom_init = 1;
    } else {
        double gn = 0, clip = 1, b3 = hp->grad_averaging ? 1 - b1 : 1;
        for (t = 0; t < nt; t++)
            for (i = 0; i < sz[t]; i++) gn += g[t][i] * g[t][i];
        gn = sqrt(gn);
        if (c->max_grad_norm > 0 && gn > c->max_grad_norm) clip = gn / c->max_grad_norm;
        for (t = 0; t < nt; t++) {
            double pn = 0, un = 0, ratio = lr;
            double *u = (double *)malloc((size_t)(sz[t] ? sz[t] : 1) * sizeof(double));
            for (i = 0; i < sz[t]; i++) {
                double gi = g[t][i] / clip, pi = p[t][i];
                if (!c->w) gi += wd * pi;
                m[t][i] = m[t][i] * b1 + b3 * gi;
                v[t][i] = v[t][i] * b2 + (1 - b2) * gi * gi;
                u[i] = (m[t][i] / bc1) / (sqrt(v[t][i] / bc2) + hp->eps);
                if (c->w) u[i] += wd * pi;
                pn += pi * pi;
                un += u[i] * u[i];
            }
            pn = sqrt(pn);
            un = sqrt(un);
            if (c->nvlamb || wd != 0) ratio = (pn != 0 && un != 0) ? lr * pn / un : lr;
            for (i = 0; i < sz[t]; i++) p[t][i] -= ratio * u[i];
            free(u);
        }
    }
}

/* ---- a random problem: nt tensors in one group ---- */

#define MAXT 4
typedef struct problem {
    int nt;
    int64_t sz[MAXT];
    capex_dtype gt, mt; /* grad dtype; model dtype (CAPEX_F32 = no model copy) */
    float *p[MAXT];
    void *g[MAXT];
    uint16_t *model[MAXT];
    double *rp[MAXT], *rm[MAXT], *rv[MAXT], *rg[MAXT];
} problem;

static void problem_init(problem *pr, int nt, const int64_t *sz, capex_dtype gt, capex_dtype mt) {
    int t;
    int64_t i;
    memset(pr, 0, sizeof *pr);
    pr->nt = nt; pr->gt = gt; pr->mt = mt;
    for (t = 0; t < nt; t++) {
        size_t n = (size_t)(sz[t] ? sz[t] : 1);
        pr->sz[t] = sz[t];
        pr->p[t] = (float *)malloc(n * 4);
        pr->g[t] = malloc(n * 4);
        pr->model[t] = mt != CAPEX_F32 ? (uint16_t *)malloc(n * 2) : NULL;
        pr->rp[t] = (double *)calloc(n, 8); pr->rm[t] = (double *)calloc(n, 8);
        pr->rv[t] = (double *)calloc(n, 8); pr->rg[t] = (double *)calloc(n, 8);
        for (i = 0; i < sz[t]; i++) {
            pr->p[t][i] = (float)nrand();
            pr->rp[t][i] = pr->p[t][i];
        }
        if (pr->model[t]) memset(pr->model[t], 0xff, n * 2); /* poison: NaN pattern */
    }
}
static void problem_free(problem *pr) {
    int t;
    for (t = 0; t < pr->nt; t++) {
        free(pr->p[t]); free(pr->g[t]); free(pr->model[t]);
        free(pr->rp[t]); free(pr->rm[t]); free(pr->rv[t]); free(pr->rg[t]);
    }
}
/* New random grads (scaled by gscale in storage); reference gets the stored
   value times inv_scale*clip. */
static void problem_grads(problem *pr, float gscale, double unscale) {
    int t;
    int64_t i;
    for (t = 0; t < pr->nt; t++)
        for (i = 0; i < pr->sz[t]; i++) {
            float stored = put(pr->g[t], pr->gt, (size_t)i, (float)(nrand() * gscale));
            pr->rg[t][i] = (double)stored * unscale;
        }
}
static void problem_params(const problem *pr, capex_optim_param *ps) {
    int t;
    for (t = 0; t < pr->nt; t++) {
        capex_optim_param_init(&ps[t]);
        ps[t].param = pr->p[t];
        ps[t].grad = pr->g[t];
        ps[t].grad_dtype = pr->gt;
        ps[t].numel = pr->sz[t];
        if (pr->model[t]) { ps[t].model = pr->model[t]; ps[t].model_dtype = pr->mt; }
    }
}

/* Runs nsteps on a fresh problem and compares with the float64 reference. */
static int run_vs_ref(ct_state *ct, const refcfg *rc, capex_dtype gt, capex_dtype mt, int nsteps, const char *what) {
    /* odd sizes; one over a 65536-element chunk for the plain f32 case */
    const int64_t big = gt == CAPEX_F32 && mt == CAPEX_F32 ? 70001 : 1003;
    const int64_t sz[3] = {257, 1, big};
    problem pr;
    capex_optim_desc d;
    capex_optim *opt = NULL;
    capex_optim_param ps[MAXT];
    int s, t, mom_init = 0;
    int64_t i;
    /* scaled grads: loss scale 1024 (f16 range), clip 0.5 */
    const float scale = gt == CAPEX_BF16 ? 1.0f : 1024.0f, clip = 0.5f;
    problem_init(&pr, 3, sz, gt, mt);
    capex_optim_desc_init(&d, rc->kind);
    d.defaults = rc->hp;
    d.adam_w_mode = rc->w;
    d.use_nvlamb = rc->nvlamb;
    d.wd_after_momentum = rc->wd_after;
    d.max_grad_norm = rc->max_grad_norm;
    problem_params(&pr, ps);
    REQ(capex_optim_create(&d, &opt) == CAPEX_OK, "%s: create: %s", what, capex_last_error());
    REQ(capex_optim_add_group(opt, NULL, ps, 3, NULL) == CAPEX_OK, "%s: add_group: %s", what,
             capex_last_error());
    if (rc->mom_on_step > 0) { /* momentum 0 at first: the buffers exist, torch's momentum_buffer not yet */
        capex_optim_hparams h = rc->hp;
        h.momentum = 0.0f; h.nesterov = 0;
        REQ(capex_optim_set_hparams(opt, 0, &h) == CAPEX_OK, "%s: set_hparams: %s", what, capex_last_error());
    }
    for (s = 1; s <= nsteps; s++) {
        refcfg now = *rc;
        if (rc->mom_on_step > 0 && s < rc->mom_on_step) { now.hp.momentum = 0.0f; now.hp.nesterov = 0; }
        if (rc->mom_on_step > 0 && s == rc->mom_on_step)
            REQ(capex_optim_set_hparams(opt, 0, &rc->hp) == CAPEX_OK, "%s: set_hparams: %s", what, capex_last_error());
        problem_grads(&pr, 0.1f * scale, (double)(1.0f / scale) * (double)clip);
        ref_step(&now, s, &mom_init, 3, sz, pr.rp, pr.rm, pr.rv, pr.rg);
        REQ(capex_optim_step(opt, 1.0f / scale, clip, 0) == CAPEX_OK, "%s: step: %s", what, capex_last_error());
    }
    for (t = 0; t < 3; t++) {
        float *m = NULL, *v = NULL;
        capex_optim_get_state(opt, 0, (size_t)t, &m, &v);
        for (i = 0; i < sz[t]; i++) {
            double want = pr.rp[t][i], got = pr.p[t][i];
            double tol = 2e-5 * (1.0 + fabs(want));
            if (!(fabs(got - want) <= tol)) {
                REQ(0, "%s: tensor %d [%lld]: p %.9g want %.9g", what, t, (long long)i, got, want);
            }
            if (m) {
                double mw = pr.rm[t][i];
                if (!(fabs(m[i] - mw) <= 1e-6 + 1e-5 * fabs(mw)))
                    REQ(0, "%s: tensor %d [%lld]: m %.9g want %.9g", what, t, (long long)i, (double)m[i], mw);
            }
            if (v) {
                double vw = pr.rv[t][i];
                if (!(fabs(v[i] - vw) <= 1e-9 + 1e-5 * fabs(vw)))
                    REQ(0, "%s: tensor %d [%lld]: v %.9g want %.9g", what, t, (long long)i, (double)v[i], vw);
            }
            if (pr.model[t]) { /* the model copy is the master rounded to nearest even */
                uint16_t want_h = mt == CAPEX_F16 ? capex_f32_to_f16(pr.p[t][i]) : capex_f32_to_bf16(pr.p[t][i]);
                if (pr.model[t][i] != want_h)
                    REQ(0, "%s: tensor %d [%lld]: model 0x%04x want 0x%04x", what, t, (long long)i,
                             pr.model[t][i], want_h);
            }
        }
    }
    capex_optim_destroy(opt);
    problem_free(&pr);
    return 0;
}

/* ---- every optimizer x mode x dtype combination against float64 ---- */

static const capex_dtype grad_types[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
static const capex_dtype model_types[3] = {CAPEX_F32 /* none */, CAPEX_F16, CAPEX_BF16};

static int run_all_dtypes(ct_state *ct, const refcfg *rc, int nsteps, const char *what) {
    int a, b;
    char name[160];
    for (a = 0; a < 3; a++)
        for (b = 0; b < 3; b++) {
            snprintf(name, sizeof name, "%s grad %s model %s", what, capex_dtype_name(grad_types[a]),
                     model_types[b] == CAPEX_F32 ? "none" : capex_dtype_name(model_types[b]));
            if (run_vs_ref(ct, rc, grad_types[a], model_types[b], nsteps, name)) return 1;
        }
    return 0;
}

static refcfg cfg(capex_optim_kind kind) {
    refcfg c;
    capex_optim_desc d;
    capex_optim_desc_init(&d, kind);
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.hp = d.defaults;
    c.w = d.adam_w_mode;
    c.max_grad_norm = d.max_grad_norm;
    return c;
}

CT_TEST(adam_vs_float64) {
    refcfg c = cfg(CAPEX_OPTIM_ADAM);
    int w, bc;
    for (w = 0; w < 2; w++)
        for (bc = 0; bc < 2; bc++) {
            char what[64];
            c.w = w;
            c.hp.bias_correction = bc;
            c.hp.lr = 1e-2f;
            c.hp.weight_decay = w ? 0.1f : 0.01f;
            snprintf(what, sizeof what, "adam w=%d bc=%d", w, bc);
            if (run_all_dtypes(ct, &c, 4, what)) return;
        }
    c.w = 1; c.hp.bias_correction = 1; c.hp.weight_decay = 0.0f; c.hp.beta1 = 0.0f; c.hp.beta2 = 0.5f;
    if (run_vs_ref(ct, &c, CAPEX_F32, CAPEX_F32, 3, "adam wd 0 beta1 0")) return;
}

CT_TEST(lamb_vs_float64) {
    refcfg c = cfg(CAPEX_OPTIM_LAMB);
    int w, nv, avg;
    for (w = 0; w < 2; w++)
        for (nv = 0; nv < 2; nv++)
            for (avg = 0; avg < 2; avg++) {
                char what[80];
                c.w = w; c.nvlamb = nv; c.hp.grad_averaging = avg;
                c.hp.lr = 1e-2f;
                c.hp.weight_decay = nv ? 0.0f : 0.01f; /* nvlamb matters where wd == 0 */
                c.max_grad_norm = avg ? 1.0f : 0.0f;   /* clipping on / off */
                snprintf(what, sizeof what, "lamb w=%d nvlamb=%d avg=%d", w, nv, avg);
                if (run_all_dtypes(ct, &c, 3, what)) return;
            }
    c.w = 1; c.nvlamb = 0; c.hp.weight_decay = 0.01f; c.hp.bias_correction = 0; c.max_grad_norm = 1e6f;
    if (run_vs_ref(ct, &c, CAPEX_F32, CAPEX_F32, 3, "lamb bc=0 no clip")) return;
}

CT_TEST(sgd_vs_float64) {
    static const struct { float mom, damp, wd; int nest, after; } cases[] = {
        {0.0f, 0.0f, 0.0f, 0, 0}, {0.0f, 0.0f, 0.01f, 0, 0}, {0.9f, 0.0f, 0.0f, 0, 0}, {0.9f, 0.1f, 0.01f, 0, 0},
        {0.9f, 0.0f, 0.01f, 1, 0}, {0.9f, 0.1f, 0.01f, 0, 1}, {0.9f, 0.0f, 0.01f, 1, 1}, {0.5f, 0.5f, 0.0f, 0, 0}};
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        refcfg c = cfg(CAPEX_OPTIM_SGD);
        char what[96];
        c.hp.lr = 0.05f; c.hp.momentum = cases[k].mom; c.hp.dampening = cases[k].damp;
        c.hp.weight_decay = cases[k].wd; c.hp.nesterov = cases[k].nest; c.wd_after = cases[k].after;
        snprintf(what, sizeof what, "sgd mom=%g damp=%g wd=%g nesterov=%d after=%d", (double)c.hp.momentum,
                 (double)c.hp.dampening, (double)c.hp.weight_decay, c.hp.nesterov, c.wd_after);
        if (run_all_dtypes(ct, &c, 4, what)) return;
    }
}

/* A group added with momentum, set to 0 before its first step and turned on
   at step 3 (set_hparams): two plain steps, then buf = g at the first momentum
   step (torch creates momentum_buffer there; the zeroed buffer is not blended
   in), blended after. Every grad/model dtype, so fp16 grads and fp16/bf16
   copies take the F16C kernels where the CPU has them. */
CT_TEST(sgd_momentum_turned_on_later_vs_float64) {
    static const struct { float mom, damp, wd; int nest, after; } cases[] = {
        {0.9f, 0.0f, 0.0f, 0, 0}, {0.9f, 0.1f, 0.01f, 0, 0}, {0.9f, 0.0f, 0.01f, 1, 1}, {0.5f, 0.5f, 0.01f, 0, 1}};
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        refcfg c = cfg(CAPEX_OPTIM_SGD);
        char what[112];
        c.hp.lr = 0.05f; c.hp.momentum = cases[k].mom; c.hp.dampening = cases[k].damp;
        c.hp.weight_decay = cases[k].wd; c.hp.nesterov = cases[k].nest; c.wd_after = cases[k].after;
        c.mom_on_step = 3;
        snprintf(what, sizeof what, "sgd momentum on at step 3: mom=%g damp=%g wd=%g nesterov=%d after=%d",
                 (double)c.hp.momentum, (double)c.hp.dampening, (double)c.hp.weight_decay, c.hp.nesterov, c.wd_after);
        if (run_all_dtypes(ct, &c, 5, what)) return;
    }
}

/* ---- Apex's float32 operation order, bit for bit ---- */

/* Straight transcriptions of AdamFunctor and SGDFunctor (MATH_T = float). */
static float apex_adam(float p, float g, float *m, float *v, float b1, float b2, float bc1, float bc2, float eps,
                       float lr, int w, float decay) {
    float nm, nv, denom, update;
    if (!w) {
        g = g + (decay * p);
        *m = b1 * *m + (1 - b1) * g;
        *v = b2 * *v + (1 - b2) * g * g;
        nm = *m / bc1; nv = *v / bc2;
        denom = sqrtf(nv) + eps;
        update = nm / denom;
    } else {
        *m = b1 * *m + (1 - b1) * g;
        *v = b2 * *v + (1 - b2) * g * g;
        nm = *m / bc1; nv = *v / bc2;
        denom = sqrtf(nv) + eps;
        update = (nm / denom) + (decay * p);
    }
    return p - (lr * update);
}
static float apex_sgd(float w, float g, float *mom, float wd, float momentum, float dampening, float lr, int nesterov,
                      int first, int after) {
    if (wd != 0.f && !after) g += wd * w;
    if (momentum != 0.f) {
        if (!first) *mom = *mom * momentum + (1.f - dampening) * g;
        else *mom = g;
        if (nesterov) g += momentum * *mom;
        else g = *mom;
    }
    if (wd != 0.f && after) g += wd * w;
    w += (-lr * g);
    return w;
}

CT_TEST(apex_order_bitexact) {
    enum { N = 200003 };
    int w, s;
    float *p = (float *)malloc(N * 4), *g = (float *)malloc(N * 4), *q = (float *)malloc(N * 4);
    float *m = (float *)calloc(N, 4), *v = (float *)calloc(N, 4);
    for (w = 0; w < 4; w++) {
        capex_optim_desc d;
        capex_optim *opt;
        capex_optim_param pa;
        float *om, *ov;
        int64_t i;
        int kind_sgd = w >= 2;
        capex_optim_desc_init(&d, kind_sgd ? CAPEX_OPTIM_SGD : CAPEX_OPTIM_ADAM);
        d.adam_w_mode = w & 1;
        d.wd_after_momentum = w == 3;
        d.defaults.lr = 0.01f; d.defaults.weight_decay = 0.05f;
        d.defaults.momentum = 0.9f; d.defaults.dampening = w == 2 ? 0.2f : 0.0f; d.defaults.nesterov = w == 3;
        for (i = 0; i < N; i++) { p[i] = q[i] = (float)nrand(); m[i] = v[i] = 0; }
        capex_optim_param_init(&pa);
        pa.param = p; pa.grad = g; pa.numel = N;
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
        capex_optim_get_state(opt, 0, 0, &om, &ov);
        for (s = 1; s <= 3; s++) {
            float bc1 = (float)(1.0 - pow(0.9f, s)), bc2 = (float)(1.0 - pow(0.999f, s));
            for (i = 0; i < N; i++) g[i] = (float)nrand();
            CT_CHECK(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%.300s", capex_last_error());
            for (i = 0; i < N; i++)
                q[i] = kind_sgd ? apex_sgd(q[i], g[i], &m[i], 0.05f, 0.9f, d.defaults.dampening, 0.01f, w == 3, s == 1,
                                           w == 3)
                                : apex_adam(q[i], g[i], &m[i], &v[i], 0.9f, 0.999f, bc1, bc2, 1e-8f, 0.01f, w & 1, 0.05f);
            for (i = 0; i < N; i++) {
                CT_CHECK(f_bits(p[i]) == f_bits(q[i]), "case %d step %d [%lld]: %.9g vs Apex order %.9g", w, s,
                         (long long)i, (double)p[i], (double)q[i]);
                CT_CHECK(f_bits(om[i]) == f_bits(m[i]), "case %d step %d [%lld]: moment differs", w, s, (long long)i);
                if (!kind_sgd) CT_CHECK(f_bits(ov[i]) == f_bits(v[i]), "case %d: v differs", w);
            }
        }
        capex_optim_destroy(opt);
    }
    free(p); free(g); free(q); free(m); free(v);
}

/* ---- golden vectors from PyTorch (tests/gen_golden.py) ---- */

static int read_golden(ct_state *ct, const char *name) {
    char path[256], kind[16];
    FILE *f;
    int w, nt, ns, t, s;
    double hpv[12];
    int64_t sz[8], total = 0, i;
    float *p, *g, *want;
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[8];
    double maxerr = 0;
    snprintf(path, sizeof path, "tests/data/optim_%s.txt", name);
    f = fopen(path, "r");
    REQ(f != NULL, "cannot open %s: run the tests from the repository root (make test); regenerate with "
                   "python3 tests/gen_golden.py", path);
    REQ(fscanf(f, "%15s %d %d %d", kind, &w, &nt, &ns) == 4 && nt > 0 && nt <= 8 && ns > 0, "%s: bad header", path);
    for (i = 0; i < 12; i++) REQ(fscanf(f, "%lf", &hpv[i]) == 1, "%s: bad hyperparameters", path);
    for (t = 0; t < nt; t++) { long long z; REQ(fscanf(f, "%lld", &z) == 1 && z >= 0, "%s: bad size", path); sz[t] = z; total += z; }
    p = (float *)malloc((size_t)total * 4);
    g = (float *)malloc((size_t)total * ns * 4);
    want = (float *)malloc((size_t)total * 4);
    for (i = 0; i < total; i++) REQ(fscanf(f, "%f", &p[i]) == 1, "%s: short params", path);
    for (i = 0; i < total * ns; i++) REQ(fscanf(f, "%f", &g[i]) == 1, "%s: short grads", path);
    for (i = 0; i < total; i++) REQ(fscanf(f, "%f", &want[i]) == 1, "%s: short results", path);
    fclose(f);
    capex_optim_desc_init(&d, !strcmp(kind, "adam") ? CAPEX_OPTIM_ADAM : !strcmp(kind, "lamb") ? CAPEX_OPTIM_LAMB
                                                                                               : CAPEX_OPTIM_SGD);
    d.adam_w_mode = w;
    d.defaults.lr = (float)hpv[0]; d.defaults.beta1 = (float)hpv[1]; d.defaults.beta2 = (float)hpv[2];
    d.defaults.eps = (float)hpv[3]; d.defaults.weight_decay = (float)hpv[4]; d.defaults.momentum = (float)hpv[5];
    d.defaults.dampening = (float)hpv[6]; d.defaults.nesterov = (int)hpv[7]; d.defaults.bias_correction = (int)hpv[8];
    d.defaults.grad_averaging = (int)hpv[9]; d.max_grad_norm = (float)hpv[10]; d.use_nvlamb = (int)hpv[11];
    REQ(capex_optim_create(&d, &opt) == CAPEX_OK, "%s: %.300s", path, capex_last_error());
    {
        int64_t off = 0;
        for (t = 0; t < nt; t++) {
            capex_optim_param_init(&ps[t]);
            ps[t].param = p + off; ps[t].grad = g + off; ps[t].numel = sz[t];
            off += sz[t];
        }
    }
    REQ(capex_optim_add_group(opt, NULL, ps, (size_t)nt, NULL) == CAPEX_OK, "%s: %.300s", path, capex_last_error());
    for (s = 0; s < ns; s++) {
        int64_t off = 0;
        for (t = 0; t < nt; t++) {
            REQ(capex_optim_set_grad(opt, 0, (size_t)t, g + (size_t)s * total + off, CAPEX_F32) == CAPEX_OK, "%s",
                capex_last_error());
            off += sz[t];
        }
        REQ(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s: %.300s", path, capex_last_error());
    }
    for (i = 0; i < total; i++) {
        double e = fabs((double)p[i] - want[i]) / (1.0 + fabs(want[i]));
        if (e > maxerr) maxerr = e;
        REQ(e <= 1e-6, "%s [%lld]: got %.9g, PyTorch/reference %.9g", path, (long long)i, (double)p[i],
            (double)want[i]);
    }
    if (getenv("CT_VERBOSE")) printf("golden %s: max relative error %.3g\n", name, maxerr);
    capex_optim_destroy(opt);
    free(p); free(g); free(want);
    return 0;
}

CT_TEST(golden_torch_adamw) { if (read_golden(ct, "adamw")) return; }
CT_TEST(golden_torch_adam_l2) { if (read_golden(ct, "adam_l2")) return; }
CT_TEST(golden_torch_sgd) {
    if (read_golden(ct, "sgd_momentum") || read_golden(ct, "sgd_nesterov") || read_golden(ct, "sgd_plain")) return;
}
CT_TEST(golden_apex_lamb) {
    if (read_golden(ct, "lamb") || read_golden(ct, "lamb_l2_nvlamb") || read_golden(ct, "lamb_noavg")) return;
}

/* ---- found_inf skips, thread counts, stochastic rounding ---- */

typedef struct rig { /* two tensors, bf16 model copies, one group */
    int64_t n[2];
    float *p[2];
    uint16_t *g[2], *model[2];
    capex_optim *opt;
} rig;

static int rig_make(ct_state *ct, rig *r, capex_optim_kind kind, int threads, int sr, uint64_t seed, int64_t n0,
                    int64_t n1) {
    capex_optim_desc d;
    capex_optim_param ps[2];
    int t;
    uint64_t save = rng_state;
    memset(r, 0, sizeof *r);
    r->n[0] = n0; r->n[1] = n1;
    rng_state = 99; /* same data for every rig */
    for (t = 0; t < 2; t++) {
        int64_t i;
        r->p[t] = (float *)malloc((size_t)r->n[t] * 4);
        r->g[t] = (uint16_t *)malloc((size_t)r->n[t] * 2);
        r->model[t] = (uint16_t *)malloc((size_t)r->n[t] * 2);
        memset(r->model[t], 0xff, (size_t)r->n[t] * 2);
        for (i = 0; i < r->n[t]; i++) r->p[t][i] = (float)nrand();
        capex_optim_param_init(&ps[t]);
        ps[t].param = r->p[t]; ps[t].grad = r->g[t]; ps[t].grad_dtype = CAPEX_BF16;
        ps[t].model = r->model[t]; ps[t].model_dtype = CAPEX_BF16; ps[t].numel = r->n[t];
    }
    rng_state = save;
    capex_optim_desc_init(&d, kind);
    d.exec.num_threads = threads;
    d.exec.parallel_min_elements = 1; /* threads even for small tests */
    d.stochastic_rounding = sr;
    d.seed = seed;
    d.defaults.momentum = 0.9f;
    d.defaults.weight_decay = 0.01f;
    REQ(capex_optim_create(&d, &r->opt) == CAPEX_OK, "%.300s", capex_last_error());
    REQ(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    return 0;
}
static void rig_grads(rig *r, int step) {
    int t;
    int64_t i;
    uint64_t save = rng_state;
    rng_state = 1000 + (uint64_t)step;
    for (t = 0; t < 2; t++)
        for (i = 0; i < r->n[t]; i++) r->g[t][i] = capex_f32_to_bf16((float)(nrand() * 0.5));
    rng_state = save;
}
static void rig_free(rig *r) {
    int t;
    capex_optim_destroy(r->opt);
    for (t = 0; t < 2; t++) { free(r->p[t]); free(r->g[t]); free(r->model[t]); }
}
static int rig_same(ct_state *ct, const rig *a, const rig *b, const char *what) {
    int t;
    for (t = 0; t < 2; t++) {
        float *ma = NULL, *va = NULL, *mb = NULL, *vb = NULL;
        size_t n = (size_t)a->n[t];
        capex_optim_get_state(a->opt, 0, (size_t)t, &ma, &va);
        capex_optim_get_state(b->opt, 0, (size_t)t, &mb, &vb);
        REQ(!memcmp(a->p[t], b->p[t], n * 4), "%s: params differ in tensor %d", what, t);
        REQ(!memcmp(a->model[t], b->model[t], n * 2), "%s: model copies differ in tensor %d", what, t);
        REQ(!ma == !mb && (!ma || !memcmp(ma, mb, n * 4)), "%s: exp_avg differs in tensor %d", what, t);
        REQ(!va == !vb && (!va || !memcmp(va, vb, n * 4)), "%s: exp_avg_sq differs in tensor %d", what, t);
    }
    return 0;
}

CT_TEST(found_inf_skips_bit_identical) {
    capex_optim_kind kinds[3] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD};
    int k;
    for (k = 0; k < 3; k++) {
        rig a, b;
        int64_t sa = -1, sb = -1;
        if (rig_make(ct, &a, kinds[k], 0, 1, 7, 1001, 70000) || rig_make(ct, &b, kinds[k], 0, 1, 7, 1001, 70000)) return;
        rig_grads(&a, 1); rig_grads(&b, 1);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK && capex_optim_step(b.opt, 1.0f, 1.0f, 0) == CAPEX_OK,
                 "%.300s", capex_last_error());
        /* b sees an overflowing step: garbage grads, found_inf set */
        memset(b.g[0], 0x7f, (size_t)b.n[0] * 2);
        CT_CHECK(capex_optim_step(b.opt, 1.0f, 1.0f, 1) == CAPEX_OK, "%.300s", capex_last_error());
        if (rig_same(ct, &a, &b, "after a skipped step")) return;
        capex_optim_get_step(a.opt, 0, &sa); capex_optim_get_step(b.opt, 0, &sb);
        CT_CHECK(sa == 1 && sb == 1, "step counts %lld %lld, want 1 1 (skips do not count)", (long long)sa, (long long)sb);
        /* the next real step continues exactly as if the skip never happened */
        rig_grads(&a, 2); rig_grads(&b, 2);
        capex_optim_step(a.opt, 1.0f, 1.0f, 0); capex_optim_step(b.opt, 1.0f, 1.0f, 0);
        if (rig_same(ct, &a, &b, "after skip + step")) return;
        rig_free(&a); rig_free(&b);
    }
}

CT_TEST(same_bits_any_thread_count) {
#ifndef _OPENMP
    CT_SKIP("built without OpenMP: one thread only");
#else
    capex_optim_kind kinds[3] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD};
    int k, s;
    for (k = 0; k < 3; k++) {
        rig a, b;
        if (rig_make(ct, &a, kinds[k], 1, 1, 42, 2 * 65536 + 5, 70001) ||
            rig_make(ct, &b, kinds[k], 2, 1, 42, 2 * 65536 + 5, 70001))
            return;
        for (s = 1; s <= 2; s++) {
            rig_grads(&a, s); rig_grads(&b, s);
            capex_optim_step(a.opt, 0.5f, 1.0f, 0);
            capex_optim_step(b.opt, 0.5f, 1.0f, 0);
        }
        if (rig_same(ct, &a, &b, "1 vs 2 threads")) return;
        rig_free(&a); rig_free(&b);
    }
#endif
}

/* LAMB keeps each update u between its passes unless lamb_low_memory = 1,
   which recomputes it: the same operations, so the same bits; both modes,
   tensors of several items with ragged tails, and a second group added
   later (the buffer grows, items keep their offsets). */
CT_TEST(lamb_kept_update_matches_recompute) {
    int w, s, t;
    for (w = 0; w < 2; w++) {
        rig a, b;
        capex_optim_desc d;
        capex_optim_param ps[2], extra[2];
        float *xp[2], *xg[2];
        int64_t i, xn = 70003;
        if (rig_make(ct, &a, CAPEX_OPTIM_LAMB, 2, 1, 5, 2 * 65536 + 5, 70001) ||
            rig_make(ct, &b, CAPEX_OPTIM_LAMB, 2, 1, 5, 2 * 65536 + 5, 70001))
            return;
        CT_CHECK(a.opt->lamb_u != NULL, "the default keeps the update");
        for (t = 0; t < 2; t++) { /* rebuild both with this mode, b with lamb_low_memory */
            rig *r = t ? &b : &a;
            capex_optim_destroy(r->opt);
            capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
            d.adam_w_mode = w; d.exec.num_threads = 2; d.exec.parallel_min_elements = 1;
            d.stochastic_rounding = 1; d.seed = 5; d.defaults.weight_decay = 0.01f;
            d.lamb_low_memory = t;
            for (i = 0; i < 2; i++) {
                capex_optim_param_init(&ps[i]);
                ps[i].param = r->p[i]; ps[i].grad = r->g[i]; ps[i].grad_dtype = CAPEX_BF16;
                ps[i].model = r->model[i]; ps[i].model_dtype = CAPEX_BF16; ps[i].numel = r->n[i];
            }
            xp[t] = (float *)malloc((size_t)xn * 4);
            xg[t] = (float *)malloc((size_t)xn * 4);
            CT_CHECK(xp[t] && xg[t], "memory");
            for (i = 0; i < xn; i++) { xp[t][i] = (float)(i % 97) * 0.01f - 0.4f; xg[t][i] = (float)(i % 13) * 0.003f - 0.02f; }
            capex_optim_param_init(&extra[t]);
            extra[t].param = xp[t]; extra[t].grad = xg[t]; extra[t].numel = xn;
            CT_CHECK(capex_optim_create(&d, &r->opt) == CAPEX_OK && capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK &&
                     capex_optim_add_group(r->opt, NULL, &extra[t], 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
            CT_CHECK((r->opt->lamb_u != NULL) == !t, "mode %d: update buffer %p", t, (void *)r->opt->lamb_u);
        }
        for (s = 1; s <= 3; s++) {
            rig_grads(&a, s); rig_grads(&b, s);
            CT_CHECK(capex_optim_step(a.opt, 0.5f, 1.0f, 0) == CAPEX_OK && capex_optim_step(b.opt, 0.5f, 1.0f, 0) == CAPEX_OK,
                     "%.300s", capex_last_error());
        }
        if (rig_same(ct, &a, &b, "kept vs recomputed update")) return;
        for (i = 0; i < xn; i++)
            CT_CHECK(f_bits(xp[0][i]) == f_bits(xp[1][i]), "w %d: second group element %lld differs", w, (long long)i);
        free(xp[0]); free(xp[1]); free(xg[0]); free(xg[1]);
        rig_free(&a); rig_free(&b);
    }
}

CT_TEST(stochastic_rounding) {
    rig a, b, c, off;
    int64_t i, ups = 0, downs = 0, stochastic = 0;
    if (rig_make(ct, &a, CAPEX_OPTIM_ADAM, 0, 1, 5, 4000, 3000) || rig_make(ct, &b, CAPEX_OPTIM_ADAM, 0, 1, 5, 4000, 3000) ||
        rig_make(ct, &c, CAPEX_OPTIM_ADAM, 0, 1, 6, 4000, 3000) || rig_make(ct, &off, CAPEX_OPTIM_ADAM, 0, 0, 5, 4000, 3000))
        return;
    rig_grads(&a, 1); rig_grads(&b, 1); rig_grads(&c, 1); rig_grads(&off, 1);
    capex_optim_step(a.opt, 1, 1, 0); capex_optim_step(b.opt, 1, 1, 0);
    capex_optim_step(c.opt, 1, 1, 0); capex_optim_step(off.opt, 1, 1, 0);
    if (rig_same(ct, &a, &b, "same seed")) return;
    CT_CHECK(!memcmp(a.p[0], c.p[0], 4000 * 4), "the seed must not change the fp32 master");
    CT_CHECK(memcmp(a.model[0], c.model[0], 4000 * 2) != 0, "a different seed must give different roundings");
    for (i = 0; i < 4000; i++) {
        float x = a.p[0][i];
        uint16_t lo = (uint16_t)(f_bits(x) >> 16), h = a.model[0][i];
        /* SR result is x truncated or one bf16 step away from zero */
        CT_CHECK(h == lo || h == (uint16_t)(lo + 1), "[%lld] SR gave 0x%04x for %.9g", (long long)i, h, (double)x);
        ups += h != lo; downs += h == lo && (f_bits(x) & 0xffff);
        stochastic += h != capex_f32_to_bf16(x);
        /* off: round to nearest even */
        CT_CHECK(off.model[0][i] == capex_f32_to_bf16(off.p[0][i]), "SR off must round to nearest even");
    }
    CT_CHECK(ups > 100 && downs > 100 && stochastic > 100, "SR looks deterministic: up %lld down %lld",
             (long long)ups, (long long)downs);
    rig_free(&a); rig_free(&b); rig_free(&c); rig_free(&off);
}

/* Mean of SR(x) over many counters equals x (unbiased), here for values at
   several fractional positions between two bf16 neighbours. */
CT_TEST(stochastic_rounding_unbiased) {
    static const float fracs[] = {0.5f, 0.25f, 0.1f, 0.9f, 0.01f, 0.7f};
    const int N = 200000;
    size_t k;
    for (k = 0; k < sizeof fracs / sizeof fracs[0]; k++) {
        int sgn;
        for (sgn = 0; sgn < 2; sgn++) {
            float base = sgn ? -1.3125f : 3.0f; /* exact in bf16 */
            uint32_t b = f_bits(base);
            float x = f_from_bits(b + (uint32_t)(fracs[k] * 65536.0f));
            double sum = 0, sd, mean;
            unsigned key = capex__sr_key(11, 0, 3, 0, 2, 0);
            int i;
            for (i = 0; i < N; i++) sum += capex_bf16_to_f32((uint16_t)capex__bf16_round_sr(x, capex__sr_bits(key, (unsigned)i)));
            mean = sum / N;
            /* std of one sample is ulp*sqrt(f(1-f)); allow 5 sigma of the mean */
            sd = fabs(capex_bf16_to_f32((uint16_t)((b >> 16) + 1)) - base) * sqrt(fracs[k] * (1 - fracs[k]) / N);
            CT_CHECK(fabs(mean - x) <= 5 * sd + 1e-12, "frac %g: mean %.9g want %.9g (5 sigma %.3g)", (double)fracs[k],
                     mean, (double)x, 5 * sd);
        }
    }
    /* specials: inf stays inf, NaN stays NaN, exact values stay exact */
    CT_CHECK(capex__bf16_round_sr(f_from_bits(0x7f800000u), 0xffffu) == 0x7f80u, "inf");
    CT_CHECK(capex__bf16_round_sr(f_from_bits(0xff800000u), 0xffffu) == 0xff80u, "-inf");
    CT_CHECK((capex__bf16_round_sr(f_from_bits(0x7fc00001u), 0x1234u) & 0x7fc0u) == 0x7fc0u, "NaN");
    CT_CHECK(capex__bf16_round_sr(1.5f, 0xffffu) == capex_f32_to_bf16(1.5f), "exact");
}

/* ---- groups, buffers, allocator, zero sizes ---- */

static int n_alloc, n_free;
static void *count_alloc(size_t n, void *u) { (void)u; n_alloc++; return malloc(n); }
static void count_free(void *p, void *u) { (void)u; if (p) n_free++; free(p); }

CT_TEST(groups_own_step_counts_and_hparams) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param pa, pb;
    capex_optim_hparams h2;
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 3, 4, 5}, ga[5] = {.1f, .2f, .3f, .4f, .5f};
    float keep[5];
    double rp[5], rm[5] = {0}, rv[5] = {0}, rg[5], *P = rp, *M = rm, *V = rv, *G = rg;
    refcfg rc = cfg(CAPEX_OPTIM_ADAM);
    int64_t s0 = -1, s1 = -1, sz = 5;
    int i, mi = 0;
    size_t gi;
    capex_allocator al;
    al.alloc = count_alloc; al.free = count_free; al.user_data = NULL;
    n_alloc = n_free = 0;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.allocator = &al;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_param_init(&pa); pa.param = a; pa.grad = ga; pa.numel = 5;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, &gi) == CAPEX_OK && gi == 0, "%.300s", capex_last_error());
    capex_optim_step(opt, 1, 1, 0);
    capex_optim_step(opt, 1, 1, 0);
    /* a second group added later starts at step 0, with its own lr */
    h2 = d.defaults; h2.lr = 0.5f; h2.weight_decay = 0.1f;
    capex_optim_param_init(&pb); pb.param = b; pb.grad = ga; pb.numel = 5;
    CT_CHECK(capex_optim_add_group(opt, &h2, &pb, 1, &gi) == CAPEX_OK && gi == 1, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_num_groups(opt) == 2, "two groups");
    capex_optim_step(opt, 1, 1, 0);
    capex_optim_get_step(opt, 0, &s0); capex_optim_get_step(opt, 1, &s1);
    CT_CHECK(s0 == 3 && s1 == 1, "steps %lld %lld, want 3 1", (long long)s0, (long long)s1);
    rc.hp = h2;
    for (i = 0; i < 5; i++) { rp[i] = 1 + i; rg[i] = ga[i]; }
    ref_step(&rc, 1, &mi, 1, &sz, &P, &M, &V, &G);
    for (i = 0; i < 5; i++) CT_CHECK(fabs(b[i] - rp[i]) <= 1e-6 * (1 + fabs(rp[i])), "group 1 [%d]: %.9g want %.9g", i, (double)b[i], rp[i]);
    /* lr schedule */
    CT_CHECK(capex_optim_set_lr(opt, 1, 0.0f) == CAPEX_OK, "%.300s", capex_last_error());
    memcpy(keep, b, sizeof b);
    capex_optim_step(opt, 1, 1, 0);
    CT_CHECK(!memcmp(keep, b, sizeof b), "lr 0 must leave the weights (decoupled decay is lr*wd*p)");
    CT_CHECK(capex_optim_get_hparams(opt, 1, &h2) == CAPEX_OK && h2.lr == 0.0f, "get_hparams");
    capex_optim_destroy(opt);
    CT_CHECK(n_alloc > 0 && n_alloc == n_free, "allocator: %d allocs, %d frees", n_alloc, n_free);
}

/* add_group when the k-th allocation fails, for every k: CAPEX_ERR_OUT_OF_MEMORY,
   the optimizer unchanged (still steps its first group, bit-identical to one
   that never failed), nothing leaked. LAMB, with and without its update buffer. */
static int fail_at;
static int n_tries;
static void *failing_alloc(size_t n, void *u) {
    (void)u;
    if (n_tries++ == fail_at) return NULL;
    n_alloc++;
    return malloc(n);
}

CT_TEST(add_group_out_of_memory_changes_nothing) {
    int low, k, i;
    for (low = 0; low < 2; low++) {
        for (k = 0;; k++) {
            capex_optim_desc d;
            capex_optim *opt, *ref;
            capex_optim_param pa, pb;
            float a[70], ar[70], b[70], ga[70];
            capex_allocator al;
            capex_result r;
            for (i = 0; i < 70; i++) { a[i] = ar[i] = b[i] = 0.01f * (float)i; ga[i] = 0.003f * (float)(i % 7) - 0.01f; }
            al.alloc = failing_alloc; al.free = count_free; al.user_data = NULL;
            capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
            d.lamb_low_memory = low;
            d.exec.chunk_size = 16; /* several items per tensor */
            CT_CHECK(capex_optim_create(&d, &ref) == CAPEX_OK, "%.300s", capex_last_error());
            d.allocator = &al;
            n_alloc = n_free = n_tries = 0;
            fail_at = -1;
            CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
            capex_optim_param_init(&pa); pa.param = a; pa.grad = ga; pa.numel = 70;
            capex_optim_param_init(&pb); pb.param = b; pb.grad = ga; pb.numel = 70;
            CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
            pa.param = ar;
            CT_CHECK(capex_optim_add_group(ref, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
            fail_at = n_tries + k;
            r = capex_optim_add_group(opt, NULL, &pb, 1, NULL);
            fail_at = -1;
            if (r == CAPEX_OK) {
                CT_CHECK(k >= 4, "add_group made only %d allocations", k);
                capex_optim_destroy(opt);
                capex_optim_destroy(ref);
                CT_CHECK(n_alloc == n_free, "allocator: %d allocs, %d frees", n_alloc, n_free);
                break;
            }
            CT_CHECK(r == CAPEX_ERR_OUT_OF_MEMORY && strstr(capex_last_error(), "out of memory"),
                     "allocation %d failing: %s: %s", k, capex_result_string(r), capex_last_error());
            CT_CHECK(capex_optim_num_groups(opt) == 1, "allocation %d failing: %zu groups", k, capex_optim_num_groups(opt));
            CT_CHECK(capex_optim_step(opt, 1, 1, 0) == CAPEX_OK && capex_optim_step(ref, 1, 1, 0) == CAPEX_OK, "%.300s",
                     capex_last_error());
            for (i = 0; i < 70; i++)
                CT_CHECK(f_bits(a[i]) == f_bits(ar[i]), "allocation %d failing: the first group stepped differently", k);
            capex_optim_destroy(opt);
            capex_optim_destroy(ref);
            CT_CHECK(n_alloc == n_free, "allocation %d failing: %d allocs, %d frees", k, n_alloc, n_free);
        }
    }
}

CT_TEST(user_buffers_and_zero_sizes) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[3];
    float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, m[4] = {9, 9, 9, 9}, v[4] = {9, 9, 9, 9}, *om, *ov;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_param_init(&ps[0]); /* zero-size with NULL pointers is fine */
    capex_optim_param_init(&ps[1]); ps[1].param = p; ps[1].grad = g; ps[1].numel = 4; ps[1].exp_avg = m; ps[1].exp_avg_sq = v;
    capex_optim_param_init(&ps[2]); ps[2].param = p; ps[2].grad = g; ps[2].numel = 0;
    CT_CHECK(capex_optim_add_group(opt, NULL, ps, 3, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(opt, NULL, NULL, 0, NULL) == CAPEX_OK, "an empty group is fine");
    CT_CHECK(capex_optim_get_state(opt, 0, 1, &om, &ov) == CAPEX_OK && om == m && ov == v, "user buffers used");
    CT_CHECK(m[0] == 0 && v[3] == 0, "user buffers are zeroed by add_group");
    CT_CHECK(capex_optim_step(opt, 1, 1, 0) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(m[0] != 0 && p[0] < 1, "the step used them");
    capex_optim_destroy(opt);
    capex_optim_destroy(NULL);
}

/* Element counts whose sum passes int64 (the optimizer's running total) are
   refused before anything is allocated or counted. */
CT_TEST(element_total_that_wraps_is_refused) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[3];
    float w[3][4], g[4], m[3][4], v[3][4];
    size_t i;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 3; i++) { /* each numel alone passes the per-param limit */
        capex_optim_param_init(&ps[i]);
        ps[i].param = w[i]; ps[i].grad = g; ps[i].exp_avg = m[i]; ps[i].exp_avg_sq = v[i];
        ps[i].numel = (int64_t)(SIZE_MAX / 4 < (size_t)INT64_MAX ? SIZE_MAX / 4 : (size_t)INT64_MAX / 2);
    }
    CT_CHECK(capex_optim_add_group(opt, NULL, ps, 3, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "overflows"), "%.300s", capex_last_error());
    CT_CHECK(capex_optim_num_groups(opt) == 0, "nothing added");
    capex_optim_destroy(opt);
}

CT_TEST(bad_input) {
    capex_optim_desc d;
    capex_optim *opt = NULL;
    capex_optim_param pa;
    capex_optim_hparams h;
    float p[4] = {0}, g[4] = {0};
    char *bytes = (char *)p;
    int64_t st;
    CT_CHECK(capex_optim_create(NULL, &opt) == CAPEX_ERR_INVALID_ARG && strlen(capex_last_error()) > 0, "NULL desc");
    memset(&d, 0, sizeof d); /* = {0}: accepted before, with lr 0 the weights never moved */
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG && opt == NULL &&
             strstr(capex_last_error(), "capex_optim_desc_init") != NULL, "zeroed desc: %s", capex_last_error());
    memset(&d, 0xa5, sizeof d); /* garbage */
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG && opt == NULL, "garbage desc");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    d.defaults.lr = NAN;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG && opt == NULL, "NaN lr");
    d.defaults.lr = -1;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "negative lr");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM); d.defaults.beta1 = 1.0f;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "beta1 1");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM); d.defaults.beta2 = NAN;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "NaN beta2");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM); d.defaults.eps = INFINITY;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "inf eps");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM); d.defaults.weight_decay = -0.1f;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "negative wd");
    capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB); d.max_grad_norm = NAN;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "NaN max_grad_norm");
    capex_optim_desc_init(&d, (capex_optim_kind)7);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "bad kind");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD); d.defaults.nesterov = 1;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_CONFIG, "nesterov without momentum");
    d.defaults.momentum = 0.9f; d.defaults.dampening = 0.1f;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "nesterov"),
             "nesterov with dampening: %s", capex_last_error());
    d.defaults.dampening = 0; d.defaults.momentum = NAN;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG, "NaN momentum");

    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(NULL, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL optimizer");
    CT_CHECK(capex_optim_add_group(opt, NULL, NULL, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL params");
    capex_optim_param_init(&pa); pa.param = p; pa.grad = NULL; pa.numel = 4;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL grad");
    pa.grad = g; pa.param = NULL;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL param");
    pa.param = p; pa.numel = -1;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "negative numel");
    pa.numel = 2; pa.grad_dtype = (capex_dtype)9;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "bad grad dtype");
    pa.grad_dtype = CAPEX_F32; pa.model = g; pa.model_dtype = CAPEX_F32;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "f32 model copy");
    pa.model = NULL; pa.param = (float *)(bytes + 2);
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "aligned"), "misaligned param");
    pa.param = p; pa.grad = bytes + 1; pa.grad_dtype = CAPEX_F16;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned grad");
    pa.grad = g; pa.grad_dtype = CAPEX_F32;
    h = d.defaults; h.lr = NAN;
    CT_CHECK(capex_optim_add_group(opt, &h, &pa, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NaN lr in a group");
    CT_CHECK(capex_optim_num_groups(opt) == 0, "failed add_group changes nothing");
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_step(NULL, 1, 1, 0) == CAPEX_ERR_INVALID_ARG, "NULL step");
    CT_CHECK(capex_optim_step(opt, NAN, 1, 0) == CAPEX_ERR_INVALID_ARG, "NaN inv_scale");
    CT_CHECK(capex_optim_step(opt, 0, 1, 0) == CAPEX_ERR_INVALID_ARG, "zero inv_scale");
    CT_CHECK(capex_optim_step(opt, -1, 1, 0) == CAPEX_ERR_INVALID_ARG, "negative inv_scale");
    CT_CHECK(capex_optim_step(opt, 1, INFINITY, 0) == CAPEX_ERR_INVALID_ARG, "inf clip");
    CT_CHECK(capex_optim_get_step(opt, 0, &st) == CAPEX_OK && st == 0, "bad steps do not count");
    CT_CHECK(capex_optim_get_step(opt, 5, &st) == CAPEX_ERR_INVALID_ARG, "bad group");
    CT_CHECK(capex_optim_set_lr(opt, 0, NAN) == CAPEX_ERR_INVALID_ARG, "NaN lr");
    CT_CHECK(capex_optim_set_lr(opt, 3, 0.1f) == CAPEX_ERR_INVALID_ARG, "bad group");
    CT_CHECK(capex_optim_set_grad(opt, 0, 1, g, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "bad index");
    CT_CHECK(capex_optim_set_grad(opt, 0, 0, NULL, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "NULL grad");
    CT_CHECK(capex_optim_get_state(opt, 1, 0, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "bad group");
    capex_optim_destroy(opt);
    /* SGD group without momentum cannot turn it on later (no buffers) */
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    h = d.defaults; h.momentum = 0.9f;
    CT_CHECK(capex_optim_set_hparams(opt, 0, &h) == CAPEX_ERR_CONFIG, "momentum on without buffers");
    /* decided by the group's config, not by whether it holds tensors: an empty
       group is a ZeRO rank's view of a group whose params sit on other ranks */
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_set_hparams(opt, 1, &h) == CAPEX_ERR_CONFIG, "momentum on for an empty group without buffers");
    capex_optim_destroy(opt);
}


/* ---- state save/restore: resume equals an uninterrupted run ---- */

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

CT_TEST(resume_is_bit_identical) {
    capex_optim_kind kinds[3] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD};
    int k, s;
    for (k = 0; k < 3; k++) {
        rig a, b;
        void *buf;
        size_t len;
        int64_t st = -1;
        /* a: 10 steps straight. b: 5 steps, save (with params), a fresh
           optimizer on fresh (garbage) buffers, load, 5 more steps. SR on. */
        if (rig_make(ct, &a, kinds[k], 0, 1, 77, 70001, 333)) return;
        for (s = 1; s <= 10; s++) { rig_grads(&a, s); capex_optim_step(a.opt, 0.25f, 1.0f, 0); }
        if (rig_make(ct, &b, kinds[k], 0, 1, 77, 70001, 333)) return;
        for (s = 1; s <= 5; s++) { rig_grads(&b, s); capex_optim_step(b.opt, 0.25f, 1.0f, 0); }
        if (save_mem(ct, b.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
        rig_free(&b);
        /* different seed and hparams in the new desc: the file's win */
        if (rig_make(ct, &b, kinds[k], 0, 1, 12345, 70001, 333)) return;
        memset(b.p[0], 0, 70001 * 4); memset(b.model[1], 0, 333 * 2);
        CT_CHECK(load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %.300s", capex_last_error());
        CT_CHECK(capex_optim_get_step(b.opt, 0, &st) == CAPEX_OK && st == 5, "restored step %lld", (long long)st);
        for (s = 6; s <= 10; s++) { rig_grads(&b, s); capex_optim_step(b.opt, 0.25f, 1.0f, 0); }
        if (rig_same(ct, &a, &b, "10 steps vs 5 + save/load + 5")) return;
        free(buf);
        rig_free(&a); rig_free(&b);
    }
}

CT_TEST(load_validates_before_changing) {
    rig a, b, c;
    void *buf, *nopar;
    size_t len, len2;
    float *m0;
    float keep_p, keep_m;
    char path[64];
    if (rig_make(ct, &a, CAPEX_OPTIM_ADAM, 0, 0, 1, 1000, 10) || rig_make(ct, &b, CAPEX_OPTIM_ADAM, 0, 0, 1, 1000, 11) ||
        rig_make(ct, &c, CAPEX_OPTIM_SGD, 0, 0, 1, 1000, 10))
        return;
    rig_grads(&a, 1); capex_optim_step(a.opt, 1, 1, 0);
    rig_grads(&b, 1); capex_optim_step(b.opt, 1, 1, 0);
    if (save_mem(ct, a.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len) || save_mem(ct, a.opt, 0, &nopar, &len2)) return;
    capex_optim_get_state(b.opt, 0, 0, &m0, NULL);
    keep_p = b.p[0][3]; keep_m = m0[3];
    /* sizes differ (tensor 1: 10 vs 11) */
    CT_CHECK(load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_SIZE_MISMATCH &&
             strstr(capex_last_error(), "parameter 1"), "size mismatch: %.300s", capex_last_error());
    CT_CHECK(b.p[0][3] == keep_p && m0[3] == keep_m, "a failed load must not touch the optimizer");
    /* kind differs */
    CT_CHECK(load_mem(c.opt, buf, len, 0) == CAPEX_ERR_CONFIG, "kind mismatch: %.300s", capex_last_error());
    /* params requested but not saved */
    rig_free(&b);
    if (rig_make(ct, &b, CAPEX_OPTIM_ADAM, 0, 0, 1, 1000, 10)) return;
    CT_CHECK(load_mem(b.opt, nopar, len2, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_NOT_FOUND, "missing params: %.300s",
             capex_last_error());
    CT_CHECK(load_mem(b.opt, nopar, len2, 0) == CAPEX_OK, "moments only: %.300s", capex_last_error());
    /* corrupt byte: the container's checksum refuses it */
    ((unsigned char *)buf)[len - 5] ^= 1;
    CT_CHECK(load_mem(b.opt, buf, len, 0) == CAPEX_ERR_CHECKSUM, "corrupt: %s", capex_result_string(load_mem(b.opt, buf, len, 0)));
    /* another prefix in the same file is not found */
    {
        capex_state_reader *rd;
        capex_state_reader_open_memory(nopar, len2, 0, NULL, &rd);
        CT_CHECK(capex_optim_load(b.opt, rd, "other", 0) == CAPEX_ERR_NOT_FOUND, "prefix: %.300s", capex_last_error());
        CT_CHECK(capex_optim_load(NULL, rd, NULL, 0) == CAPEX_ERR_INVALID_ARG, "NULL optimizer");
        /* flags it does not know are refused, not ignored (before 2026-11-28 they were: a
           caller's mistaken bit, e.g. CAPEX_STATE_OPEN_FOREIGN's value 1 is ours, passed) */
        CT_CHECK(capex_optim_load(b.opt, rd, NULL, 2u) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "flags"),
                 "unknown load flags: %.300s", capex_last_error());
        capex_state_reader_close(rd);
    }
    {
        capex_state_writer *w;
        size_t n0 = 0, n1 = 1;
        CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK && capex_state_write_memory(w, NULL, 0, &n0) == CAPEX_OK,
                 "%.300s", capex_last_error());
        CT_CHECK(capex_optim_save(b.opt, w, NULL, 0x80u | CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "flags"), "unknown save flags: %.300s", capex_last_error());
        CT_CHECK(capex_state_write_memory(w, NULL, 0, &n1) == CAPEX_OK && n1 == n0, "a refused save added entries");
        capex_state_writer_destroy(w);
    }
    /* file round trip */
    snprintf(path, sizeof path, "/tmp/capex_optim_test_%ld.safetensors", (long)(uintptr_t)&path % 100000);
    CT_CHECK(capex_optim_save_file(a.opt, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_load_file(b.opt, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%.300s", capex_last_error());
    remove(path);
    if (rig_same(ct, &a, &b, "file round trip")) return;
    CT_CHECK(capex_optim_load_file(b.opt, "/nonexistent/dir/x.safetensors", 0) == CAPEX_ERR_IO, "missing file");
    free(buf); free(nopar);
    rig_free(&a); rig_free(&b); rig_free(&c);
}

/* A load that fails part-way through copying (the file shrank after it was
   opened) leaves a mix of old and new state: step refuses it, and so does
   save (a checkpoint of the mix would load "successfully" later); a good
   load makes the optimizer usable again. */
CT_TEST(load_io_error_midway_refuses_step_and_save) {
    rig a, b;
    char path[64];
    capex_state_reader *rd = NULL;
    capex_state_writer *w = NULL;
    void *buf;
    size_t len;
    FILE *f;
    if (rig_make(ct, &a, CAPEX_OPTIM_ADAM, 0, 0, 1, 1000, 10) || rig_make(ct, &b, CAPEX_OPTIM_ADAM, 0, 0, 1, 1000, 10))
        return;
    rig_grads(&a, 1); capex_optim_step(a.opt, 1, 1, 0);
    snprintf(path, sizeof path, "/tmp/capex_optim_io_%ld.safetensors", (long)(uintptr_t)&path % 100000);
    CT_CHECK(capex_optim_save_file(a.opt, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_state_reader_open_file(path, 0, NULL, &rd) == CAPEX_OK, "%.300s", capex_last_error());
    if (!rd) return;
    /* cut under the open reader: the scalars read, the last tensor (param1.model, bf16) does not */
    if (save_mem(ct, a.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
    f = fopen(path, "wb");
    CT_CHECK(f && fwrite(buf, 1, len - 10, f) == len - 10, "rewriting %s", path);
    if (f) fclose(f);
    free(buf);
    CT_CHECK(capex_optim_load(b.opt, rd, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_IO, "load: %.300s",
             capex_last_error());
    capex_state_reader_close(rd);
    remove(path);
    rig_grads(&b, 2);
    CT_CHECK(capex_optim_step(b.opt, 1, 1, 0) == CAPEX_ERR_ORDER, "step after a failed load: %.300s", capex_last_error());
    CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_save(b.opt, w, NULL, 0) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "load"),
             "save after a failed load: %.300s", capex_last_error());
    capex_state_writer_destroy(w);
    CT_CHECK(capex_optim_save_file(b.opt, path, 0) == CAPEX_ERR_ORDER, "save_file after a failed load");
    remove(path);
    if (save_mem(ct, a.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
    CT_CHECK(load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%.300s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_step(b.opt, 1, 1, 0) == CAPEX_OK, "step after a good load: %.300s", capex_last_error());
    rig_free(&a); rig_free(&b);
}

/* Writes v into the i64 entry nm of a saved file and re-stamps capex_crc32
   (the documented rule), so the edit gets past the checksum. */
static int patch_i64(void *buf, size_t len, const char *nm, int64_t v) {
    const char *key = "\"capex_crc32\":\"";
    unsigned char *b = (unsigned char *)buf, *at = NULL;
    capex_state_reader *rd;
    capex_state_tensor_info info;
    size_t i, kl = strlen(key);
    int k;
    if (capex_state_reader_open_memory(buf, len, 0, NULL, &rd) != CAPEX_OK) return -1;
    k = capex_state_find(rd, nm, &info) == CAPEX_OK && info.dtype == CAPEX_STATE_I64 && info.numel == 1;
    capex_state_reader_close(rd);
    if (!k) return -1;
    for (k = 0; k < 8; k++) b[info.file_offset + (size_t)k] = (unsigned char)((uint64_t)v >> (8 * k));
    for (i = 0; i + kl + 8 <= len; i++)
        if (memcmp(b + i, key, kl) == 0) { at = b + i + kl; break; }
    if (!at) return -1;
    memset(at, '0', 8);
    snprintf((char *)at, 9, "%08lx", (unsigned long)capex_crc32(0, b, len));
    at[8] = '"';
    return 0;
}

/* Issue 16 item 2: a checkpoint with a valid checksum and step INT64_MAX was
   loaded, and the next step overflowed the count. Steps outside
   [0, CAPEX_STEP_MAX] are refused with the optimizer untouched; a step that
   would pass the bound fails with CAPEX_ERR_LIMIT and changes nothing. */
CT_TEST(load_refuses_step_counts_near_overflow) {
    const int64_t bad[4] = {INT64_MAX, INT64_MAX - 1, CAPEX_STEP_MAX + 1, -1};
    rig a, b, keep;
    void *buf;
    size_t len;
    int64_t st = -1;
    int i;
    capex_result r;
    if (rig_make(ct, &a, CAPEX_OPTIM_ADAM, 0, 1, 5, 40, 7) || rig_make(ct, &b, CAPEX_OPTIM_ADAM, 0, 1, 5, 40, 7) ||
        rig_make(ct, &keep, CAPEX_OPTIM_ADAM, 0, 1, 5, 40, 7))
        return;
    rig_grads(&a, 1); capex_optim_step(a.opt, 1, 1, 0);
    rig_grads(&b, 2); capex_optim_step(b.opt, 1, 1, 0); capex_optim_step(b.opt, 1, 1, 0);
    rig_grads(&keep, 2); capex_optim_step(keep.opt, 1, 1, 0); capex_optim_step(keep.opt, 1, 1, 0);
    if (save_mem(ct, a.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
    for (i = 0; i < 4; i++) {
        CT_CHECK(patch_i64(buf, len, "optim.group0.step", bad[i]) == 0, "patch");
        r = load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS);
        CT_CHECK(r == CAPEX_ERR_FORMAT && strstr(capex_last_error(), "CAPEX_STEP_MAX"), "step %lld: %s %.300s",
                 (long long)bad[i], capex_result_string(r), capex_last_error());
        if (rig_same(ct, &b, &keep, "a refused step count")) return;
        CT_CHECK(capex_optim_get_step(b.opt, 0, &st) == CAPEX_OK && st == 2, "step changed to %lld", (long long)st);
    }
    /* the last countable step, then the bound */
    CT_CHECK(patch_i64(buf, len, "optim.group0.step", CAPEX_STEP_MAX - 1) == 0, "patch");
    CT_CHECK(load_mem(b.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "step 2^53 - 1: %.300s", capex_last_error());
    CT_CHECK(capex_optim_step(b.opt, 1, 1, 0) == CAPEX_OK, "step to 2^53: %.300s", capex_last_error());
    CT_CHECK(capex_optim_get_step(b.opt, 0, &st) == CAPEX_OK && st == CAPEX_STEP_MAX, "step %lld", (long long)st);
    free(buf);
    if (save_mem(ct, b.opt, CAPEX_OPTIM_STATE_PARAMS, &buf, &len)) return;
    CT_CHECK(load_mem(keep.opt, buf, len, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "2^53 loads: %.300s", capex_last_error());
    r = capex_optim_step(b.opt, 1, 1, 0);
    CT_CHECK(r == CAPEX_ERR_LIMIT && strstr(capex_last_error(), "CAPEX_STEP_MAX"), "step past the bound: %s",
             capex_result_string(r));
    if (rig_same(ct, &b, &keep, "a refused step")) return;
    CT_CHECK(capex_optim_get_step(b.opt, 0, &st) == CAPEX_OK && st == CAPEX_STEP_MAX, "step %lld", (long long)st);
    CT_CHECK(capex_optim_step(b.opt, 1, 1, 1) == CAPEX_OK, "a skipped step still succeeds");
    free(buf);
    rig_free(&a); rig_free(&b); rig_free(&keep);
}


/* The kernels' own half conversions (shared with the GPU source) equal the
   core's, which test_half checks exhaustively. */
CT_TEST(kernel_half_conversions_match_core) {
    uint64_t u;
    unsigned c;
    for (c = 0; c < 65536; c++) {
        float a = capex__h16_load(c), b = capex_f16_to_f32((uint16_t)c);
        CT_CHECK(f_bits(a) == f_bits(b) || (a != a && b != b), "f16 load 0x%04x", c);
        CT_CHECK(f_bits(capex__b16_load(c)) == f_bits(capex_bf16_to_f32((uint16_t)c)), "bf16 load 0x%04x", c);
    }
    for (u = 0; u < 0x100000000ull; u += 4093) {
        float f = f_from_bits((uint32_t)u);
        CT_CHECK(capex__h16_store(f) == capex_f32_to_f16(f), "f16 store 0x%08x", (unsigned)u);
        CT_CHECK(capex__b16_store(f) == capex_f32_to_bf16(f), "bf16 store 0x%08x", (unsigned)u);
    }
    for (c = 0; c < 65536; c++) { /* every f16 rounding midpoint and its neighbours */
        float lo = capex_f16_to_f32((uint16_t)c);
        uint32_t b = f_bits(lo) + 0x1000u;
        int d;
        if ((c & 0x7c00u) == 0x7c00u || (c & 0x7fffu) == 0x7bffu) continue;
        for (d = -1; d <= 1; d++) {
            float f = f_from_bits(b + (uint32_t)d);
            CT_CHECK(capex__h16_store(f) == capex_f32_to_f16(f), "f16 store near 0x%04x", c);
        }
    }
}

/* Chunk size and thread threshold change nothing elementwise. */
CT_TEST(chunk_size_does_not_change_adam_sgd) {
    capex_optim_kind kinds[2] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_SGD};
    int k, s;
    for (k = 0; k < 2; k++) {
        rig a, b;
        capex_optim_desc d;
        capex_optim_param ps[2];
        int t;
        if (rig_make(ct, &a, kinds[k], 0, 1, 3, 5000, 777) || rig_make(ct, &b, kinds[k], 0, 1, 3, 5000, 777)) return;
        /* rebuild b's optimizer with 1000-element chunks */
        capex_optim_destroy(b.opt);
        capex_optim_desc_init(&d, kinds[k]);
        d.exec.chunk_size = 1000; d.exec.parallel_min_elements = 1;
        d.stochastic_rounding = 1; d.seed = 3; d.defaults.momentum = 0.9f; d.defaults.weight_decay = 0.01f;
        for (t = 0; t < 2; t++) {
            capex_optim_param_init(&ps[t]);
            ps[t].param = b.p[t]; ps[t].grad = b.g[t]; ps[t].grad_dtype = CAPEX_BF16;
            ps[t].model = b.model[t]; ps[t].model_dtype = CAPEX_BF16; ps[t].numel = b.n[t];
        }
        CT_CHECK(capex_optim_create(&d, &b.opt) == CAPEX_OK && capex_optim_add_group(b.opt, NULL, ps, 2, NULL) == CAPEX_OK,
                 "%.300s", capex_last_error());
        for (s = 1; s <= 3; s++) {
            rig_grads(&a, s); rig_grads(&b, s);
            capex_optim_step(a.opt, 1, 1, 0); capex_optim_step(b.opt, 1, 1, 0);
        }
        if (rig_same(ct, &a, &b, "chunk 65536 vs 1000")) return;
        rig_free(&a); rig_free(&b);
    }
}

/* A group whose momentum is set to 0 later runs plain SGD (Apex and torch:
   `if momentum != 0`), leaves its buffer alone, and resumes from that buffer
   when momentum comes back (torch keeps momentum_buffer). */
CT_TEST(sgd_momentum_turned_off_later) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param pa;
    capex_optim_hparams h;
    float w = 1.0f, g = 1.0f, buf = 0.0f;
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.defaults.lr = 0.1f; d.defaults.momentum = 0.9f; d.defaults.dampening = 0.5f;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_param_init(&pa); pa.param = &w; pa.grad = &g; pa.numel = 1; pa.exp_avg = &buf;
    CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_step(opt, 1, 1, 0); /* buf = g = 1; w = 1 - 0.1 */
    CT_CHECK(w == 0.9f && buf == 1.0f, "step 1: w %.9g buf %.9g", (double)w, (double)buf);
    h = d.defaults; h.momentum = 0.0f;
    CT_CHECK(capex_optim_set_hparams(opt, 0, &h) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_step(opt, 1, 1, 0);
    CT_CHECK(w == 0.9f - 0.1f && buf == 1.0f, "momentum 0: plain SGD (w %.9g, want %.9g), buffer kept (%.9g)", (double)w,
             (double)(0.9f - 0.1f), (double)buf);
    h.momentum = 0.9f;
    CT_CHECK(capex_optim_set_hparams(opt, 0, &h) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_step(opt, 1, 1, 0); /* buf = 0.9 * 1 + 0.5 * 1 = 1.4 */
    CT_CHECK(buf == 0.9f * 1.0f + (1.0f - 0.5f) * 1.0f, "momentum back: from the kept buffer (%.9g)", (double)buf);
    capex_optim_destroy(opt);
}

/* Chunk sizes above 2^32 (up to "one chunk per tensor", INT64_MAX) plan the
   same items as 2^32: no overflow in the count, no write past the plan. */
CT_TEST(huge_chunk_sizes) {
    static const int64_t chunks[] = {INT64_MAX, ((int64_t)1 << 40) + 3, ((int64_t)1 << 32) + 1};
    size_t c;
    for (c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        capex_optim_desc d;
        capex_optim *opt;
        capex_optim_param pa;
        float w[100], g[100];
        int i;
        for (i = 0; i < 100; i++) w[i] = 1.0f, g[i] = 0.5f;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        d.exec.chunk_size = chunks[c];
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
        capex_optim_param_init(&pa); pa.param = w; pa.grad = g; pa.numel = 100;
        CT_CHECK(capex_optim_add_group(opt, NULL, &pa, 1, NULL) == CAPEX_OK, "chunk %lld: %.300s", (long long)chunks[c],
                 capex_last_error());
        CT_CHECK(capex_optim_step(opt, 1, 1, 0) == CAPEX_OK, "%.300s", capex_last_error());
        for (i = 0; i < 100; i++) CT_CHECK(w[i] < 1.0f && w[i] > 0.99f, "chunk %lld: w[%d] = %.9g", (long long)chunks[c], i, (double)w[i]);
        capex_optim_destroy(opt);
    }
}

/* torch.optim refuses a parameter in two groups; capex too (it would be
   stepped twice), and moment buffers shared between tensors or between m and v. */
CT_TEST(aliased_params_and_buffers_are_refused) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[2];
    float w[4] = {1, 1, 1, 1}, w2[4] = {1, 1, 1, 1}, g[4] = {1, 1, 1, 1}, m[4], v[4];
    size_t ng;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    capex_optim_param_init(&ps[0]); ps[0].param = w; ps[0].grad = g; ps[0].numel = 4;
    ps[1] = ps[0];
    CT_CHECK(capex_optim_add_group(opt, NULL, ps, 2, NULL) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "more than once"),
             "same param twice in a group: %.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(opt, NULL, ps, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_optim_add_group(opt, NULL, ps, 1, NULL) == CAPEX_ERR_INVALID_ARG, "same param in a second group");
    ps[1].param = w2; ps[1].exp_avg = m; ps[1].exp_avg_sq = m;
    CT_CHECK(capex_optim_add_group(opt, NULL, ps + 1, 1, NULL) == CAPEX_ERR_INVALID_ARG, "exp_avg == exp_avg_sq");
    ps[1].exp_avg_sq = v;
    CT_CHECK(capex_optim_add_group(opt, NULL, ps + 1, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    ng = capex_optim_num_groups(opt);
    CT_CHECK(ng == 2, "refusals added nothing (%lu groups)", (unsigned long)ng);
    capex_optim_step(opt, 1, 1, 0);
    CT_CHECK(fabs(w[0] - (1.0 - 1e-3)) < 1e-6, "stepped once: %.9g", (double)w[0]);
    capex_optim_destroy(opt);
    { /* partial overlaps (a buffer starting inside another) are refused as exact repeats are:
         each step would update the shared elements twice, through both tensors */
        static float big[32], mom[32];
        static uint16_t half[32];
        float gg[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        int c;
        for (c = 0; c < 4; c++) {
            capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
            CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
            capex_optim_param_init(&ps[0]); ps[0].param = big; ps[0].grad = gg; ps[0].numel = 8;
            capex_optim_param_init(&ps[1]); ps[1].param = big + 8; ps[1].grad = gg; ps[1].numel = 8;
            if (c == 0) ps[1].param = big + 7;                               /* masters overlap */
            if (c == 1) { ps[0].exp_avg = mom; ps[1].exp_avg = mom + 4; }   /* moments overlap */
            if (c == 2) { ps[1].exp_avg = big + 4; }                         /* a moment inside the other's master */
            if (c == 3) { ps[0].model = half; ps[0].model_dtype = CAPEX_BF16; ps[1].model = half + 7; ps[1].model_dtype = CAPEX_BF16; }
            CT_CHECK(capex_optim_add_group(opt, NULL, ps, 2, NULL) == CAPEX_ERR_INVALID_ARG &&
                     strstr(capex_last_error(), "overlap"), "case %d: partial overlap in a group: %.300s", c,
                     capex_last_error());
            CT_CHECK(capex_optim_add_group(opt, NULL, ps, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
            CT_CHECK(capex_optim_add_group(opt, NULL, ps + 1, 1, NULL) == CAPEX_ERR_INVALID_ARG, "case %d: across groups", c);
            capex_optim_destroy(opt);
        }
        /* adjacent, not overlapping: fine */
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
        capex_optim_param_init(&ps[0]); ps[0].param = big; ps[0].grad = gg; ps[0].numel = 8;
        ps[0].model = half; ps[0].model_dtype = CAPEX_BF16;
        capex_optim_param_init(&ps[1]); ps[1].param = big + 8; ps[1].grad = gg; ps[1].numel = 8;
        ps[1].model = half + 8; ps[1].model_dtype = CAPEX_BF16;
        CT_CHECK(capex_optim_add_group(opt, NULL, ps, 2, NULL) == CAPEX_OK, "adjacent tensors: %.300s", capex_last_error());
        capex_optim_destroy(opt);
    }
    { /* a buffer the kind does not use is ignored (NovoGrad's exp_avg_sq, Adam's max_exp_avg_sq
         without amsgrad, SGD's exp_avg without momentum, Adagrad's exp_avg): not in the check
         either, as before exact repeats of such a slot were the only refusal. Here per-tensor
         floats v + k, as NovoGrad's v is per tensor */
        static float big[32], v2[4], spare[8];
        float gg[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        static const capex_optim_kind kinds[4] = {CAPEX_OPTIM_NOVOGRAD, CAPEX_OPTIM_ADAM, CAPEX_OPTIM_SGD, CAPEX_OPTIM_ADAGRAD};
        int c, k;
        for (c = 0; c < 4; c++) {
            capex_optim_desc_init(&d, kinds[c]);
            CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
            for (k = 0; k < 2; k++) {
                capex_optim_param_init(&ps[k]); ps[k].param = big + 8 * k; ps[k].grad = gg; ps[k].numel = 8;
                if (c == 0) ps[k].exp_avg_sq = v2 + k;
                if (c == 1) ps[k].max_exp_avg_sq = spare + k;
                if (c >= 2) ps[k].exp_avg = spare + k;
            }
            CT_CHECK(capex_optim_add_group(opt, NULL, ps, 2, NULL) == CAPEX_OK, "kind %d: an unused buffer: %.300s",
                     (int)kinds[c], capex_last_error());
            CT_CHECK(capex_optim_step(opt, 1, 1, 0) == CAPEX_OK, "%.300s", capex_last_error());
            CT_CHECK(v2[0] == 0.0f && spare[0] == 0.0f, "kind %d: the unused buffer was left alone", (int)kinds[c]);
            capex_optim_destroy(opt);
        }
    }
}

/* ---- the math, as CUDA source ---- */

CT_TEST(math_source_for_cuda) {
    size_t n = capex__optim_math_source(NULL, 0), k;
    char *buf = (char *)malloc(n + 1), small[16];
    CT_CHECK(n > 1000, "source length %zu", n);
    CT_CHECK(capex__optim_math_source(buf, n + 1) == n && strlen(buf) == n, "full copy");
    CT_CHECK(strstr(buf, "CAPEX__QUAL float capex__adam_w_elem(") && strstr(buf, "capex__lamb_update_w") &&
             strstr(buf, "capex__sgd_mom_elem") && strstr(buf, "capex__bf16_round_sr") &&
             strstr(buf, "#define CAPEX__QUAL __device__ __forceinline__"), "functions present");
    CT_CHECK(!strstr(buf, "static inline") && !strstr(buf, "capex__f32_bits"), "no host-only pieces");
    for (k = 0; k < sizeof capex__optim_math_parts / sizeof capex__optim_math_parts[0]; k++)
        CT_CHECK(strlen(capex__optim_math_parts[k]) < 4095, "part %zu too long for ISO C", k);
    CT_CHECK(capex__optim_math_source(small, sizeof small) == n && strlen(small) == sizeof small - 1, "truncation");
    free(buf);
}

/* capex_optim_param_from_amp wires each opt level; O3's pure_half keeps the
   fp32 param equal to the half model after add_group and every step: the
   same bits as a plain master + model copy optimizer whose param is reset
   to f32(model) by hand after each step (what examples did before). */
CT_TEST(amp_wiring_and_pure_half) {
    static const capex_opt_level lv[4] = {CAPEX_O0, CAPEX_O1, CAPEX_O2, CAPEX_O3};
    enum { N = 300 };
    float w[N], g[N], wref[N];
    uint16_t h[N], href[N], gh[N];
    int li, hi, kind, step;
    capex_optim_param p;
    capex_amp_overrides ov;
    capex_amp_config cfg;
    for (hi = 0; hi < 2; hi++)
        for (li = 0; li < 4; li++) {
            capex_dtype ht = hi ? CAPEX_BF16 : CAPEX_F16;
            capex_amp_overrides_init(&ov);
            CT_CHECK(capex_amp_resolve(lv[li], ht, &ov, &cfg) == CAPEX_OK, "resolve: %s", capex_last_error());
            capex_optim_param_init(&p);
            CT_CHECK(capex_optim_param_from_amp(&cfg, w, h, g, N, &p) == CAPEX_OK, "from_amp: %s", capex_last_error());
            CT_CHECK(p.param == w && p.grad == g && p.numel == N, "pointers");
            if (li < 2) CT_CHECK(p.grad_dtype == CAPEX_F32 && !p.model && !p.pure_half, "O%d: fp32 weights, no copy", li);
            else CT_CHECK(p.grad_dtype == ht && p.model == h && p.model_dtype == ht && p.pure_half == (li == 3),
                          "O%d: half copy, grads %d, pure_half %d", li, (int)p.grad_dtype, p.pure_half);
            if (li >= 2) {
                capex_optim_param q;
                capex_optim_param_init(&q);
                CT_CHECK(capex_optim_param_from_amp(&cfg, w, NULL, g, N, &q) == CAPEX_ERR_INVALID_ARG, "no half weights");
            }
        }
    {
        capex_optim_param zeroed;
        memset(&zeroed, 0, sizeof zeroed);
        CT_CHECK(capex_optim_param_from_amp(&cfg, w, h, g, N, &zeroed) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "capex_optim_param_init"), "zeroed param");
        CT_CHECK(capex_optim_param_from_amp(NULL, w, h, g, N, &p) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
    }
    for (kind = 0; kind < 3; kind++)
        for (hi = 0; hi < 2; hi++) {
            capex_optim_kind k = kind == 0 ? CAPEX_OPTIM_ADAM : kind == 1 ? CAPEX_OPTIM_SGD : CAPEX_OPTIM_LAMB;
            capex_dtype ht = hi ? CAPEX_BF16 : CAPEX_F16;
            capex_optim_desc d;
            capex_optim *o3 = NULL, *ref = NULL;
            capex_optim_param pr;
            int i;
            for (i = 0; i < N; i++) {
                float v = (float)sin(0.37 * i) * 0.8f;
                w[i] = v + 1e-4f * (float)i; /* not half values: add_group must round them */
                h[i] = href[i] = hi ? capex_f32_to_bf16(v) : capex_f32_to_f16(v);
                wref[i] = hi ? capex_bf16_to_f32(h[i]) : capex_f16_to_f32(h[i]);
            }
            capex_optim_desc_init(&d, k);
            d.defaults.lr = 1e-2f;
            d.defaults.momentum = 0.9f;
            capex_optim_param_init(&p);
            p.param = w; p.grad = gh; p.grad_dtype = ht; p.model = h; p.model_dtype = ht; p.numel = N; p.pure_half = 1;
            capex_optim_param_init(&pr);
            pr = p; pr.param = wref; pr.model = href; pr.pure_half = 0;
            CT_CHECK(capex_optim_create(&d, &o3) == CAPEX_OK && capex_optim_create(&d, &ref) == CAPEX_OK, "create");
            CT_CHECK(capex_optim_add_group(o3, NULL, &p, 1, NULL) == CAPEX_OK, "add pure_half: %s", capex_last_error());
            CT_CHECK(capex_optim_add_group(ref, NULL, &pr, 1, NULL) == CAPEX_OK, "add ref");
            CT_CHECK(memcmp(w, wref, sizeof w) == 0, "add_group sets param to f32(model)");
            for (step = 0; step < 6; step++) {
                for (i = 0; i < N; i++) {
                    float gv = (float)cos(0.11 * i * (step + 1)) * 0.5f;
                    gh[i] = hi ? capex_f32_to_bf16(gv) : capex_f32_to_f16(gv);
                }
                CT_CHECK(capex_optim_step(o3, 1.0f, 1.0f, step == 3) == CAPEX_OK, "step: %s", capex_last_error());
                CT_CHECK(capex_optim_step(ref, 1.0f, 1.0f, step == 3) == CAPEX_OK, "ref step");
                for (i = 0; i < N; i++) wref[i] = hi ? capex_bf16_to_f32(href[i]) : capex_f16_to_f32(href[i]);
                CT_CHECK(memcmp(h, href, sizeof h) == 0 && memcmp(w, wref, sizeof w) == 0,
                         "kind %d %s step %d: pure_half differs from the hand-mirrored reference", kind, hi ? "bf16" : "f16", step);
            }
            CT_CHECK(memcmp(w, wref, sizeof w) == 0, "mirror");
            for (i = 0; i < N; i++)
                CT_CHECK(w[i] == (hi ? capex_bf16_to_f32(h[i]) : capex_f16_to_f32(h[i])), "param %d is not its half value", i);
            capex_optim_destroy(o3);
            capex_optim_destroy(ref);
        }
    {   /* pure_half without a model copy is refused */
        capex_optim_desc d;
        capex_optim *o = NULL;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        capex_optim_param_init(&p);
        p.param = w; p.grad = g; p.numel = N; p.pure_half = 1;
        CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK, "create");
        CT_CHECK(capex_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "pure_half"),
                 "no model: %s", capex_last_error());
        capex_optim_destroy(o);
    }
}

/* O3 has no master weights (Apex steps the half model itself), so the model
   copy is the weights: one written after add_group (a restored model
   checkpoint, pretrained weights loaded late) is what the next step updates,
   the same bits as an optimizer built on it. On main a step reverted it to
   the weights of add_group time. */
CT_TEST(pure_half_steps_the_model_as_written) {
    enum { N = 37 };
    int kind, hi, i, step;
    for (kind = 0; kind < 3; kind++)
        for (hi = 0; hi < 2; hi++) {
            capex_optim_kind k = kind == 0 ? CAPEX_OPTIM_ADAM : kind == 1 ? CAPEX_OPTIM_SGD : CAPEX_OPTIM_LAMB;
            capex_dtype ht = hi ? CAPEX_BF16 : CAPEX_F16;
            float w[N], wref[N];
            uint16_t h[N], href[N], gh[N];
            capex_optim_desc d;
            capex_optim_param p, pr;
            capex_optim *o = NULL, *ref = NULL;
            capex_amp_config cfg;
            CT_CHECK(capex_amp_resolve(CAPEX_O3, ht, NULL, &cfg) == CAPEX_OK, "resolve");
            for (i = 0; i < N; i++) {
                h[i] = hi ? capex_f32_to_bf16(0.25f * (float)i) : capex_f32_to_f16(0.25f * (float)i); /* init */
                gh[i] = hi ? capex_f32_to_bf16((float)sin(0.7 * i)) : capex_f32_to_f16((float)sin(0.7 * i));
            }
            capex_optim_desc_init(&d, k);
            d.defaults.lr = 1e-2f;
            d.defaults.momentum = 0.9f;
            capex_optim_param_init(&p);
            CT_CHECK(capex_optim_param_from_amp(&cfg, w, h, gh, N, &p) == CAPEX_OK && p.pure_half, "%s", capex_last_error());
            CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK && capex_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_OK, "add");
            for (i = 0; i < N; i++) { /* the restored weights, written after add_group */
                float v = (float)cos(0.3 * i) - 2.0f;
                h[i] = href[i] = hi ? capex_f32_to_bf16(v) : capex_f32_to_f16(v);
            }
            pr = p;
            pr.param = wref;
            pr.model = href;
            CT_CHECK(capex_optim_create(&d, &ref) == CAPEX_OK && capex_optim_add_group(ref, NULL, &pr, 1, NULL) == CAPEX_OK,
                     "ref");
            for (step = 0; step < 3; step++) {
                CT_CHECK(capex_optim_step(o, 1.0f, 1.0f, step == 1) == CAPEX_OK && capex_optim_step(ref, 1.0f, 1.0f, step == 1) == CAPEX_OK,
                         "step: %s", capex_last_error());
                CT_CHECK(memcmp(h, href, sizeof h) == 0 && memcmp(w, wref, sizeof w) == 0,
                         "kind %d %s step %d: the step did not start from the model copy written after add_group (model[1] "
                         "%g, want %g)", kind, capex_dtype_name(ht), step,
                         (double)(hi ? capex_bf16_to_f32(h[1]) : capex_f16_to_f32(h[1])),
                         (double)(hi ? capex_bf16_to_f32(href[1]) : capex_f16_to_f32(href[1])));
            }
            capex_optim_destroy(o);
            capex_optim_destroy(ref);
        }
}

static const ct_case cases[] = {
    CT_CASE(adam_vs_float64), CT_CASE(lamb_vs_float64), CT_CASE(sgd_vs_float64), CT_CASE(sgd_momentum_turned_on_later_vs_float64), CT_CASE(apex_order_bitexact),
    CT_CASE(golden_torch_adamw), CT_CASE(golden_torch_adam_l2), CT_CASE(golden_torch_sgd), CT_CASE(golden_apex_lamb),
    CT_CASE(found_inf_skips_bit_identical), CT_CASE(same_bits_any_thread_count), CT_CASE(lamb_kept_update_matches_recompute), CT_CASE(add_group_out_of_memory_changes_nothing), CT_CASE(stochastic_rounding),
    CT_CASE(stochastic_rounding_unbiased), CT_CASE(groups_own_step_counts_and_hparams),
    CT_CASE(user_buffers_and_zero_sizes),
    CT_CASE(element_total_that_wraps_is_refused), CT_CASE(bad_input), CT_CASE(resume_is_bit_identical),
    CT_CASE(load_validates_before_changing), CT_CASE(load_io_error_midway_refuses_step_and_save), CT_CASE(load_refuses_step_counts_near_overflow),
    CT_CASE(kernel_half_conversions_match_core),
    CT_CASE(chunk_size_does_not_change_adam_sgd),
    CT_CASE(sgd_momentum_turned_off_later),
    CT_CASE(huge_chunk_sizes),
    CT_CASE(aliased_params_and_buffers_are_refused), CT_CASE(math_source_for_cuda),
    CT_CASE(amp_wiring_and_pure_half), CT_CASE(pure_half_steps_the_model_as_written),
};
CT_MAIN(cases)
