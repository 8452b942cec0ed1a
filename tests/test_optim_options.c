/* Optimizer options and how they interact: several groups with different
   hyperparameters in one optimizer (Adam L2/W with and without amsgrad and
   bias correction, LAMB with nvlamb / grad averaging / global clip across
   groups, SGD with nesterov / dampening / wd_after_momentum / momentum turned
   off and on, NovoGrad modes, Adagrad lr_decay and initial accumulator),
   changed mid-training by capex_optim_set_hparams, a group added after steps,
   an lr schedule on top, a skipped step, zero grads, zero params and empty
   tensors: every state buffer compared after every step with a float64
   reference written here from Apex's and torch's definitions. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>

#define OPTIM_TEST_SEED 0x0badc0ffee123457ull
#include "optim_test_util.h"

#define MAXG 4
#define TPG 4 /* tensors per group: random, zero grads, zero params, empty */
#define MAXT (MAXG * TPG)

typedef struct rgroup {
    capex_optim_hparams hp;
    int64_t step;
    int mom_init;
} rgroup;

typedef struct rtens {
    int64_t n;
    int grp, kind_of; /* kind_of: 0 random, 1 zero grads, 2 zero params, 3 empty */
    float *p, *g;
    uint16_t *model;
    capex_dtype mt;
    double *rp, *rm, *rv, *rvm, *rg;
    double nv; /* NovoGrad's per-tensor norm average */
} rtens;

typedef struct rig {
    capex_optim_desc d;
    capex_optim *opt;
    rgroup G[MAXG];
    rtens T[MAXT];
    int ng, nt;
    int sched_on;
    capex_lr_schedule sched;
} rig;

static void tens_make(rtens *t, int grp, int kind_of, int64_t n, capex_dtype mt, double v0) {
    int64_t i;
    size_t sz = (size_t)(n ? n : 1);
    memset(t, 0, sizeof *t);
    t->n = n; t->grp = grp; t->kind_of = kind_of; t->mt = mt;
    t->p = (float *)malloc(sz * 4);
    t->g = (float *)calloc(sz, 4);
    t->model = mt != CAPEX_F32 ? (uint16_t *)malloc(sz * 2) : NULL;
    t->rp = (double *)calloc(sz, 8); t->rm = (double *)calloc(sz, 8); t->rv = (double *)calloc(sz, 8);
    t->rvm = (double *)calloc(sz, 8); t->rg = (double *)calloc(sz, 8);
    for (i = 0; i < n; i++) {
        t->p[i] = kind_of == 2 ? 0.0f : (float)nrand();
        t->rp[i] = t->p[i];
        t->rv[i] = v0;
    }
    if (t->model) memset(t->model, 0xff, sz * 2);
}
static void tens_free(rtens *t) {
    free(t->p); free(t->g); free(t->model); free(t->rp); free(t->rm); free(t->rv); free(t->rvm); free(t->rg);
}

/* Adds a group of TPG tensors (random, zero grads, zero params, empty) to both. */
static int rig_add_group(ct_state *ct, rig *r, const capex_optim_hparams *hp) {
    static const int64_t sizes[TPG] = {301, 17, 40, 0};
    static const capex_dtype mts[MAXG] = {CAPEX_BF16, CAPEX_F16, CAPEX_F32, CAPEX_BF16};
    capex_optim_param ps[TPG];
    int k, gi = r->ng;
    double v0 = r->d.kind == CAPEX_OPTIM_ADAGRAD ? (double)hp->initial_accumulator_value : 0.0;
    for (k = 0; k < TPG; k++) {
        rtens *t = &r->T[r->nt + k];
        tens_make(t, gi, k, sizes[k], mts[gi], v0);
        capex_optim_param_init(&ps[k]);
        ps[k].param = t->p; ps[k].grad = t->g; ps[k].numel = t->n;
        if (t->model) { ps[k].model = t->model; ps[k].model_dtype = t->mt; }
    }
    REQ(capex_optim_add_group(r->opt, hp, ps, TPG, NULL) == CAPEX_OK, "add_group: %s", capex_last_error());
    memset(&r->G[gi], 0, sizeof r->G[gi]);
    r->G[gi].hp = *hp;
    r->ng++;
    r->nt += TPG;
    return 0;
}

static void rig_free(rig *r) {
    int k;
    capex_optim_destroy(r->opt);
    for (k = 0; k < r->nt; k++) tens_free(&r->T[k]);
}

/* New stored grads (f32, scaled by 1/gs); the reference sees them times gs. */
static void rig_grads(rig *r, double mag, float gs) {
    int k;
    int64_t i;
    for (k = 0; k < r->nt; k++) {
        rtens *t = &r->T[k];
        for (i = 0; i < t->n; i++) {
            float stored = put(t->g, CAPEX_F32, (size_t)i, t->kind_of == 1 ? 0.0f : (float)(nrand() * mag / gs));
            t->rg[i] = (double)(stored * gs);
        }
    }
}

/* One step of the whole optimizer in float64 (Apex / torch definitions). */
static void ref_step(rig *r) {
    const capex_optim_desc *d = &r->d;
    double gn = 0.0, clip = 1.0;
    int k, gi;
    int64_t i;
    if (d->kind == CAPEX_OPTIM_LAMB) { /* global norm over every group */
        for (k = 0; k < r->nt; k++)
            for (i = 0; i < r->T[k].n; i++) gn += r->T[k].rg[i] * r->T[k].rg[i];
        gn = sqrt(gn);
        if (d->max_grad_norm > 0.0f && gn > d->max_grad_norm) clip = gn / d->max_grad_norm;
    }
    for (k = 0; k < r->nt; k++) {
        rtens *t = &r->T[k];
        const rgroup *G = &r->G[t->grp];
        const capex_optim_hparams *hp = &G->hp;
        double s = (double)(G->step + 1);
        double lr = r->sched_on ? (double)(float)capex_lr_at(&r->sched, (double)hp->lr, G->step) : (double)hp->lr;
        double b1 = hp->beta1, b2 = hp->beta2, wd = hp->weight_decay, eps = hp->eps;
        double bc1 = hp->bias_correction ? 1.0 - pow(b1, s) : 1.0;
        double bc2 = hp->bias_correction ? 1.0 - pow(b2, s) : 1.0;
        double b3 = hp->grad_averaging ? 1.0 - b1 : 1.0;
        switch (d->kind) {
        case CAPEX_OPTIM_ADAM:
            for (i = 0; i < t->n; i++) {
                double g = t->rg[i], p = t->rp[i], u, vv;
                if (!d->adam_w_mode) g += wd * p;
                t->rm[i] = b1 * t->rm[i] + (1 - b1) * g;
                t->rv[i] = b2 * t->rv[i] + (1 - b2) * g * g;
                if (hp->amsgrad && t->rv[i] > t->rvm[i]) t->rvm[i] = t->rv[i];
                vv = hp->amsgrad ? t->rvm[i] : t->rv[i];
                u = (t->rm[i] / bc1) / (sqrt(vv / bc2) + eps);
                if (d->adam_w_mode) u += wd * p;
                t->rp[i] = p - lr * u;
            }
            break;
        case CAPEX_OPTIM_LAMB: {
            double pn = 0.0, un = 0.0, ratio = lr;
            for (i = 0; i < t->n; i++) {
                double g = t->rg[i] / clip, p = t->rp[i];
                if (!d->adam_w_mode) g += wd * p;
                t->rm[i] = t->rm[i] * b1 + b3 * g;
                t->rv[i] = t->rv[i] * b2 + (1 - b2) * g * g;
                t->rvm[i] = (t->rm[i] / bc1) / (sqrt(t->rv[i] / bc2) + eps) + (d->adam_w_mode ? wd * p : 0.0);
                pn += p * p;
                un += t->rvm[i] * t->rvm[i];
            }
            pn = sqrt(pn); un = sqrt(un);
            if (d->use_nvlamb || wd != 0.0) ratio = (pn != 0.0 && un != 0.0) ? lr * pn / un : lr;
            for (i = 0; i < t->n; i++) { t->rp[i] -= ratio * t->rvm[i]; t->rvm[i] = 0.0; }
            break;
        }
        case CAPEX_OPTIM_SGD:
            for (i = 0; i < t->n; i++) {
                double g = t->rg[i], p = t->rp[i];
                if (wd != 0.0 && !(d->wd_after_momentum && hp->momentum != 0.0f)) g += wd * p;
                if (hp->momentum != 0.0f) {
                    t->rm[i] = G->mom_init ? hp->momentum * t->rm[i] + (1 - (double)hp->dampening) * g : g;
                    g = hp->nesterov ? g + hp->momentum * t->rm[i] : t->rm[i];
                    if (wd != 0.0 && d->wd_after_momentum) g += wd * p;
                }
                t->rp[i] = p - lr * g;
            }
            break;
        case CAPEX_OPTIM_NOVOGRAD: {
            double n2 = 0.0, den, bc2n = hp->bias_correction ? sqrt(1.0 - pow(b2, s)) : 1.0;
            for (i = 0; i < t->n; i++) n2 += t->rg[i] * t->rg[i];
            if (G->step == 0) t->nv = d->init_zero ? 0.0 : sqrt(n2);
            t->nv = sqrt(b2 * t->nv * t->nv + (1 - b2) * n2);
            den = t->nv / bc2n + eps;
            for (i = 0; i < t->n; i++) {
                double g = t->rg[i], p = t->rp[i];
                if (d->reg_inside_moment) {
                    g = g / den + wd * p;
                    t->rm[i] = b1 * t->rm[i] + b3 * g;
                    t->rp[i] = p - lr * (t->rm[i] / bc1);
                } else {
                    t->rm[i] = b1 * t->rm[i] + b3 * g;
                    t->rp[i] = p - lr * ((t->rm[i] / bc1) / den + wd * p);
                }
            }
            break;
        }
        default: { /* Adagrad */
            double clr = lr / (1.0 + (s - 1.0) * (double)hp->lr_decay);
            for (i = 0; i < t->n; i++) {
                double g = t->rg[i], p = t->rp[i];
                if (!d->adam_w_mode) g += wd * p;
                t->rv[i] += g * g;
                t->rp[i] = p - clr * (g / (sqrt(t->rv[i]) + eps) + (d->adam_w_mode ? wd * p : 0.0));
            }
        }
        }
    }
    for (gi = 0; gi < r->ng; gi++) {
        r->G[gi].step++;
        if (d->kind == CAPEX_OPTIM_SGD && r->G[gi].hp.momentum != 0.0f) r->G[gi].mom_init = 1;
    }
}

static int close_to(double got, double want, double rel, double abs_) {
    return fabs(got - want) <= abs_ + rel * fabs(want);
}

/* Every buffer of every tensor against the reference. */
static int rig_check(ct_state *ct, rig *r, int step, const char *what) {
    int k, gi;
    int64_t i;
    for (gi = 0; gi < r->ng; gi++) {
        int64_t st = -1;
        REQ(capex_optim_get_step(r->opt, (size_t)gi, &st) == CAPEX_OK && st == r->G[gi].step,
            "%s: step %d: group %d step %lld, want %lld", what, step, gi, (long long)st, (long long)r->G[gi].step);
    }
    for (k = 0; k < r->nt; k++) {
        rtens *t = &r->T[k];
        size_t gi_ = (size_t)t->grp, idx = (size_t)(k % TPG);
        float *m = NULL, *v = NULL, *vm = NULL;
        REQ(capex_optim_get_state(r->opt, gi_, idx, &m, &v) == CAPEX_OK, "%s: get_state", what);
        if (r->d.kind == CAPEX_OPTIM_ADAM)
            REQ(capex_optim_get_max_exp_avg_sq(r->opt, gi_, idx, &vm) == CAPEX_OK, "%s: get_max", what);
        if (r->d.kind == CAPEX_OPTIM_NOVOGRAD) {
            float nv = -1.0f;
            REQ(capex_optim_get_novograd_norm(r->opt, gi_, idx, &nv) == CAPEX_OK, "%s: get_novograd_norm", what);
            REQ(close_to(nv, t->nv, 1e-5, 1e-9), "%s: step %d group %d tensor %d: novograd v %.9g want %.9g", what,
                step, t->grp, (int)idx, (double)nv, t->nv);
        }
        for (i = 0; i < t->n; i++) {
            if (!close_to(t->p[i], t->rp[i], 3e-5, 3e-6))
                REQ(0, "%s: step %d group %d tensor %d [%lld]: p %.9g want %.9g", what, step, t->grp, (int)idx,
                    (long long)i, (double)t->p[i], t->rp[i]);
            if (m && !close_to(m[i], t->rm[i], 2e-5, 1e-7))
                REQ(0, "%s: step %d group %d tensor %d [%lld]: m %.9g want %.9g", what, step, t->grp, (int)idx,
                    (long long)i, (double)m[i], t->rm[i]);
            if (v && !close_to(v[i], t->rv[i], 2e-5, 1e-10))
                REQ(0, "%s: step %d group %d tensor %d [%lld]: v %.9g want %.9g", what, step, t->grp, (int)idx,
                    (long long)i, (double)v[i], t->rv[i]);
            if (vm && !close_to(vm[i], t->rvm[i], 2e-5, 1e-10))
                REQ(0, "%s: step %d group %d tensor %d [%lld]: vmax %.9g want %.9g", what, step, t->grp, (int)idx,
                    (long long)i, (double)vm[i], t->rvm[i]);
            if (t->model) {
                float x = t->p[i];
                uint16_t h = t->model[i];
                if (t->mt == CAPEX_F16) {
                    REQ(h == capex_f32_to_f16(x), "%s: f16 model copy 0x%04x of %.9g", what, h, (double)x);
                } else if (!r->d.stochastic_rounding) {
                    REQ(h == capex_f32_to_bf16(x), "%s: bf16 model copy 0x%04x of %.9g", what, h, (double)x);
                } else { /* one of the two bf16 neighbours of x */
                    uint32_t u = f_bits(x), lo = u >> 16;
                    REQ(h == lo || h == lo + 1u, "%s: stochastic bf16 copy 0x%04x of %.9g (0x%08x)", what, h,
                        (double)x, u);
                }
            }
        }
    }
    return 0;
}

static int rig_step(ct_state *ct, rig *r, int step, float gs, const char *what) {
    ref_step(r);
    REQ(capex_optim_step(r->opt, gs, 1.0f, 0) == CAPEX_OK, "%s: step %d: %s", what, step, capex_last_error());
    return rig_check(ct, r, step, what);
}

static int rig_set_hp(ct_state *ct, rig *r, int gi, const capex_optim_hparams *hp, const char *what) {
    REQ(capex_optim_set_hparams(r->opt, (size_t)gi, hp) == CAPEX_OK, "%s: set_hparams group %d: %s", what, gi,
        capex_last_error());
    r->G[gi].hp = *hp;
    return 0;
}

/* The run every kind goes through: groups g0..g2 from hps[0..2], steps 1-2,
   a skipped step, hps[3..5] set mid-training on g0..g2, g3 (hps[6]) added,
   more steps with the loss scale changing. */
static int run_case(ct_state *ct, const capex_optim_desc *d, const capex_optim_hparams hps[7], int sched,
                    const char *what) {
    rig r;
    int s, gi;
    memset(&r, 0, sizeof r);
    r.d = *d;
    r.d.exec.parallel_min_elements = 1;
    REQ(capex_optim_create(&r.d, &r.opt) == CAPEX_OK, "%s: create: %s", what, capex_last_error());
    if (sched) {
        capex_lr_schedule_init(&r.sched, CAPEX_LR_COSINE);
        r.sched.warmup_steps = 2;
        r.sched.total_steps = 12;
        r.sched.min_factor = 0.1;
        REQ(capex_optim_set_lr_schedule(r.opt, &r.sched) == CAPEX_OK, "%s: schedule: %s", what, capex_last_error());
        r.sched_on = 1;
    }
    for (gi = 0; gi < 3; gi++)
        if (rig_add_group(ct, &r, &hps[gi])) goto fail;
    for (s = 1; s <= 2; s++) {
        rig_grads(&r, 0.1, 1.0f / 512.0f);
        if (rig_step(ct, &r, s, 1.0f / 512.0f, what)) goto fail;
    }
    /* a skipped step: nothing moves, counts stay */
    rig_grads(&r, 0.1, 1.0f);
    if (capex_optim_step(r.opt, 1.0f, 1.0f, 1) != CAPEX_OK || rig_check(ct, &r, 2, what)) {
        if (!ct->failed) REQ(0, "%s: skipped step: %s", what, capex_last_error());
        goto fail;
    }
    for (gi = 0; gi < 3; gi++)
        if (rig_set_hp(ct, &r, gi, &hps[3 + gi], what)) goto fail;
    if (rig_add_group(ct, &r, &hps[6])) goto fail;
    for (s = 3; s <= 8; s++) {
        float gs = s & 1 ? 1.0f : 0.25f;
        rig_grads(&r, s == 5 ? 2.0 : 0.1, gs);
        if (rig_step(ct, &r, s, gs, what)) goto fail;
    }
    rig_free(&r);
    return 0;
fail:
    rig_free(&r);
    return 1;
}

static capex_optim_hparams base_hp(capex_optim_kind kind) {
    capex_optim_desc d;
    capex_optim_desc_init(&d, kind);
    return d.defaults;
}

CT_TEST(adam_groups_amsgrad_bias_correction_l2_w) {
    capex_optim_hparams h[7];
    int w, sr, k;
    for (k = 0; k < 7; k++) { h[k] = base_hp(CAPEX_OPTIM_ADAM); h[k].lr = 1e-2f; }
    h[0].amsgrad = 1; h[0].weight_decay = 0.05f;
    h[1].bias_correction = 0; h[1].beta1 = 0.8f; h[1].beta2 = 0.99f; h[1].eps = 1e-6f;
    h[2].amsgrad = 1; h[2].bias_correction = 0; h[2].weight_decay = 0.1f; h[2].eps = 1e-3f;
    h[3] = h[0]; h[3].lr = 5e-3f; h[3].weight_decay = 0.0f; h[3].bias_correction = 0; h[3].beta2 = 0.9f;
    h[4] = h[1]; h[4].bias_correction = 1; h[4].beta1 = 0.0f; h[4].weight_decay = 0.02f;
    h[5] = h[2]; h[5].eps = 1e-8f; h[5].bias_correction = 1;
    h[6].amsgrad = 1; h[6].bias_correction = 0; h[6].weight_decay = 0.01f;
    for (w = 0; w < 2; w++)
        for (sr = 0; sr < 2; sr++) {
            capex_optim_desc d;
            char what[64];
            capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
            d.adam_w_mode = w; d.stochastic_rounding = sr; d.seed = 5;
            snprintf(what, sizeof what, "adam w=%d sr=%d", w, sr);
            if (run_case(ct, &d, h, sr, what)) return;
        }
}

CT_TEST(lamb_groups_clip_nvlamb_averaging) {
    static const float mgn[3] = {0.0f, 1.0f, 0.05f};
    capex_optim_hparams h[7];
    int w, nv, c, k;
    for (k = 0; k < 7; k++) { h[k] = base_hp(CAPEX_OPTIM_LAMB); h[k].lr = 1e-2f; }
    h[1].weight_decay = 0.0f; h[1].bias_correction = 0; h[1].grad_averaging = 0;
    h[2].weight_decay = 0.1f; h[2].beta1 = 0.0f; h[2].eps = 1e-3f;
    h[3] = h[0]; h[3].grad_averaging = 0; h[3].lr = 2e-2f;
    h[4] = h[1]; h[4].weight_decay = 0.02f;
    h[5] = h[2]; h[5].weight_decay = 0.0f; h[5].bias_correction = 0;
    h[6].weight_decay = 0.0f; h[6].beta2 = 0.9f;
    for (w = 0; w < 2; w++)
        for (nv = 0; nv < 2; nv++)
            for (c = 0; c < 3; c++) {
                capex_optim_desc d;
                char what[80];
                capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
                d.adam_w_mode = w; d.use_nvlamb = nv; d.max_grad_norm = mgn[c];
                d.lamb_low_memory = c == 2;
                snprintf(what, sizeof what, "lamb w=%d nvlamb=%d max_grad_norm=%g", w, nv, (double)mgn[c]);
                if (run_case(ct, &d, h, c == 1, what)) return;
            }
}

CT_TEST(sgd_groups_momentum_nesterov_dampening_toggled) {
    capex_optim_hparams h[7];
    int after, k;
    for (k = 0; k < 7; k++) { h[k] = base_hp(CAPEX_OPTIM_SGD); h[k].lr = 0.05f; }
    h[0].momentum = 0.9f; h[0].dampening = 0.1f; h[0].weight_decay = 0.01f;
    h[1].momentum = 0.9f; h[1].nesterov = 1; h[1].weight_decay = 0.001f;
    h[2].momentum = 0.0f; h[2].weight_decay = 0.02f;
    h[3] = h[0]; h[3].momentum = 0.0f;                        /* off: plain SGD, buffer kept */
    h[4] = h[1]; h[4].nesterov = 0; h[4].dampening = 0.3f;
    h[5] = h[2]; h[5].lr = 0.01f; h[5].weight_decay = 0.0f;
    h[6].momentum = 0.5f; h[6].dampening = 0.5f; h[6].weight_decay = 0.03f;
    for (after = 0; after < 2; after++) {
        capex_optim_desc d;
        char what[64];
        capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
        d.wd_after_momentum = after;
        snprintf(what, sizeof what, "sgd wd_after=%d", after);
        if (run_case(ct, &d, h, after, what)) return;
    }
}

CT_TEST(novograd_groups_modes) {
    capex_optim_hparams h[7];
    int reg, iz, k;
    for (k = 0; k < 7; k++) { h[k] = base_hp(CAPEX_OPTIM_NOVOGRAD); h[k].lr = 1e-2f; }
    h[0].weight_decay = 0.01f;
    h[1].beta2 = 0.5f; h[1].bias_correction = 0; h[1].grad_averaging = 0;
    h[2].beta1 = 0.0f; h[2].eps = 1e-3f;
    h[3] = h[0]; h[3].beta2 = 0.9f; h[3].grad_averaging = 0;
    h[4] = h[1]; h[4].bias_correction = 1; h[4].weight_decay = 0.05f;
    h[5] = h[2]; h[5].lr = 3e-2f;
    h[6].weight_decay = 0.001f; h[6].beta2 = 0.95f;
    for (reg = 0; reg < 2; reg++)
        for (iz = 0; iz < 2; iz++) {
            capex_optim_desc d;
            char what[64];
            capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
            d.reg_inside_moment = reg; d.init_zero = iz;
            snprintf(what, sizeof what, "novograd reg=%d init_zero=%d", reg, iz);
            if (run_case(ct, &d, h, reg ^ iz, what)) return;
        }
}

CT_TEST(adagrad_groups_lr_decay_accumulator) {
    capex_optim_hparams h[7];
    int w, k;
    for (k = 0; k < 7; k++) { h[k] = base_hp(CAPEX_OPTIM_ADAGRAD); h[k].lr = 0.05f; }
    h[0].lr_decay = 0.1f; h[0].initial_accumulator_value = 0.1f; h[0].weight_decay = 0.01f;
    h[1].eps = 1e-3f;
    h[2].initial_accumulator_value = 1.0f; h[2].weight_decay = 0.1f;
    h[3] = h[0]; h[3].lr_decay = 0.5f;
    h[4] = h[1]; h[4].lr_decay = 0.01f; h[4].weight_decay = 0.02f;
    h[5] = h[2]; h[5].initial_accumulator_value = 5.0f; /* no effect after add_group (torch: init only) */
    h[6].initial_accumulator_value = 0.25f; h[6].lr_decay = 1.0f;
    for (w = 0; w < 2; w++) {
        capex_optim_desc d;
        char what[64];
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
        d.adam_w_mode = w;
        snprintf(what, sizeof what, "adagrad w=%d", w);
        if (run_case(ct, &d, h, !w, what)) return;
    }
}


/* inv_scale and clip_coef each valid, their product not finite (1e20 * 1e20
   overflows f32): refused before anything moves, for every kind, instead of
   stepping with g * inf (NaN weights). */
CT_TEST(step_refuses_scale_product_that_overflows) {
    static const capex_optim_kind kinds[5] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD,
                                              CAPEX_OPTIM_NOVOGRAD, CAPEX_OPTIM_ADAGRAD};
    int k;
    for (k = 0; k < 5; k++) {
        float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.25f, 0.0f, -1.0f}, p0[3];
        capex_optim_desc d;
        capex_optim *opt = NULL;
        capex_optim_param ps;
        int64_t st = -1;
        capex_result r;
        memcpy(p0, p, sizeof p);
        capex_optim_desc_init(&d, kinds[k]);
        d.defaults.momentum = 0.9f;
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%s", capex_last_error());
        capex_optim_param_init(&ps);
        ps.param = p; ps.grad = g; ps.numel = 3;
        CT_CHECK(capex_optim_add_group(opt, NULL, &ps, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
        r = capex_optim_step(opt, 1e20f, 1e20f, 0);
        capex_optim_get_step(opt, 0, &st);
        capex_optim_destroy(opt);
        CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "kind %d: step with inv_scale*clip_coef = inf returned %d, params %g %g %g",
                 (int)kinds[k], (int)r, (double)p[0], (double)p[1], (double)p[2]);
        CT_CHECK(!memcmp(p, p0, sizeof p) && st == 0, "kind %d: a refused step changed the params or the count",
                 (int)kinds[k]);
        CT_CHECK(strstr(capex_last_error(), "clip_coef") != NULL, "kind %d: message '%s'", (int)kinds[k],
                 capex_last_error());
    }
}

/* A state saved with non-default modes and per-group options, loaded into an
   optimizer built with the defaults (same groups and buffers): the file's
   modes, hyperparameters, step counts, stochastic-rounding seed and schedule
   take over, and both step on bit for bit. */
static int modes_opt(ct_state *ct, const capex_optim_desc *d, const capex_optim_hparams *h, float *p, float *g,
                     uint16_t *m, capex_optim **out) {
    capex_optim_param ps[2];
    int k;
    REQ(capex_optim_create(d, out) == CAPEX_OK, "create: %s", capex_last_error());
    for (k = 0; k < 2; k++) {
        capex_optim_param_init(&ps[k]);
        ps[k].param = p + 64 * k; ps[k].grad = g + 64 * k; ps[k].numel = 64;
        ps[k].model = m + 64 * k; ps[k].model_dtype = CAPEX_BF16;
        REQ(capex_optim_add_group(*out, &h[k], &ps[k], 1, NULL) == CAPEX_OK, "add_group: %s", capex_last_error());
    }
    return 0;
}
CT_TEST(load_takes_modes_and_options_from_the_file) {
    int kind;
    char path[300];
    snprintf(path, sizeof path, "/tmp/capex_optopt_modes_%d", (int)getpid());
    for (kind = 0; kind < 5; kind++) {
        capex_optim_desc ds, dl;
        capex_optim_hparams hs[2], hl[2];
        capex_optim *a = NULL, *b = NULL;
        capex_lr_schedule sc;
        float pa[128], pb[128], g[128];
        uint16_t ma[128], mb[128];
        int s, i;
        capex_optim_desc_init(&ds, (capex_optim_kind)kind);
        dl = ds; /* the loader: defaults */
        hs[0] = hs[1] = hl[0] = hl[1] = ds.defaults;
        ds.adam_w_mode = !ds.adam_w_mode; ds.use_nvlamb = 1; ds.max_grad_norm = 0.05f; ds.wd_after_momentum = 1;
        ds.reg_inside_moment = 1; ds.init_zero = 1; ds.stochastic_rounding = 1; ds.seed = 77;
        hs[0].lr = 0.02f; hs[0].weight_decay = 0.03f; hs[0].bias_correction = 0; hs[0].grad_averaging = 0;
        hs[0].beta1 = 0.7f; hs[0].beta2 = 0.95f; hs[0].eps = 1e-4f; hs[0].lr_decay = 0.2f;
        hs[0].momentum = 0.9f; hs[0].dampening = 0.2f;
        hs[1].lr = 0.01f; hs[1].momentum = 0.8f; hs[1].nesterov = 1; hs[1].initial_accumulator_value = 0.5f;
        hs[1].amsgrad = 1;
        hl[0].momentum = hl[1].momentum = 0.1f; /* buffers on the loader's side too */
        hl[1].amsgrad = 1;                      /* fixed at add_group: must match */
        for (i = 0; i < 128; i++) pa[i] = pb[i] = (float)nrand();
        if (modes_opt(ct, &ds, hs, pa, g, ma, &a) || modes_opt(ct, &dl, hl, pb, g, mb, &b)) return;
        capex_lr_schedule_init(&sc, CAPEX_LR_LINEAR);
        sc.total_steps = 10; sc.min_factor = 0.2;
        CT_CHECK(capex_optim_set_lr_schedule(a, &sc) == CAPEX_OK, "%s", capex_last_error());
        for (s = 0; s < 6; s++) {
            for (i = 0; i < 128; i++) g[i] = (float)(nrand() * 0.1);
            if (s == 3) {
                CT_CHECK(capex_optim_save_file(a, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save: %s", capex_last_error());
                CT_CHECK(capex_optim_load_file(b, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "kind %d load: %s", kind,
                         capex_last_error());
            }
            CT_CHECK(capex_optim_step(a, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
            if (s >= 3) CT_CHECK(capex_optim_step(b, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
        }
        CT_CHECK(!memcmp(pa, pb, sizeof pa) && !memcmp(ma, mb, sizeof ma), "kind %d: the loaded optimizer stepped "
                 "differently from the saved one", kind);
        capex_optim_destroy(a);
        capex_optim_destroy(b);
    }
    remove(path);
}

/* A file whose layout differs from the loading optimizer's is refused before anything changes:
   group sizes (same totals), an SGD group without momentum buffers where the file has momentum
   (the loader would write through NULL buffers), a model copy of another dtype. */
typedef struct lay_opt { capex_optim *o; float p[64], g[64]; uint16_t m[64]; } lay_opt;
static int lay_make(ct_state *ct, lay_opt *L, capex_optim_kind kind, const int64_t *sizes, int ng, float momentum,
                    capex_dtype model) {
    capex_optim_desc d;
    capex_optim_hparams h;
    int64_t at = 0;
    int k, i;
    capex_optim_desc_init(&d, kind);
    h = d.defaults;
    h.momentum = momentum;
    for (i = 0; i < 64; i++) { L->p[i] = (float)nrand(); L->g[i] = (float)(0.1 * nrand()); L->m[i] = 0; }
    REQ(capex_optim_create(&d, &L->o) == CAPEX_OK, "create: %s", capex_last_error());
    for (k = 0; k < ng; k++) {
        capex_optim_param ps;
        capex_optim_param_init(&ps);
        ps.param = L->p + at; ps.grad = L->g + at; ps.numel = sizes[k];
        if (model != CAPEX_F32) { ps.model = L->m + at; ps.model_dtype = model; }
        at += sizes[k];
        REQ(capex_optim_add_group(L->o, &h, &ps, 1, NULL) == CAPEX_OK, "add_group: %s", capex_last_error());
    }
    return 0;
}
CT_TEST(load_refuses_a_file_of_another_layout) {
    static const int64_t s2a[2] = {16, 48}, s2b[2] = {32, 32};
    static const struct { const char *what; int kind; const int64_t *sa, *sb; float mom_a, mom_b; capex_dtype ma, mb;
                          capex_result want; } cs[] = {
        {"group sizes", CAPEX_OPTIM_ADAM, s2a, s2b, 0.0f, 0.0f, CAPEX_F32, CAPEX_F32, CAPEX_ERR_SIZE_MISMATCH},
        {"sgd momentum in the file, none here", CAPEX_OPTIM_SGD, s2b, s2b, 0.9f, 0.0f, CAPEX_F32, CAPEX_F32,
         CAPEX_ERR_CONFIG},
        {"model copy dtype", CAPEX_OPTIM_ADAM, s2b, s2b, 0.0f, 0.0f, CAPEX_BF16, CAPEX_F16, CAPEX_ERR_SIZE_MISMATCH},
    };
    char path[300];
    size_t c;
    snprintf(path, sizeof path, "/tmp/capex_optopt_layout_%d", (int)getpid());
    for (c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        lay_opt a, b;
        float before[64];
        uint16_t mbefore[64];
        capex_result r;
        int64_t step = -1;
        if (lay_make(ct, &a, (capex_optim_kind)cs[c].kind, cs[c].sa, 2, cs[c].mom_a, cs[c].ma) ||
            lay_make(ct, &b, (capex_optim_kind)cs[c].kind, cs[c].sb, 2, cs[c].mom_b, cs[c].mb))
            return;
        CT_CHECK(capex_optim_step(a.o, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_save_file(a.o, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save: %s", capex_last_error());
        memcpy(before, b.p, sizeof before);
        memcpy(mbefore, b.m, sizeof mbefore);
        r = capex_optim_load_file(b.o, path, CAPEX_OPTIM_STATE_PARAMS);
        CT_CHECK(r == cs[c].want, "%s: load gave %s, want %s (%s)", cs[c].what, capex_result_string(r),
                 capex_result_string(cs[c].want), capex_last_error());
        CT_CHECK(!memcmp(before, b.p, sizeof before) && !memcmp(mbefore, b.m, sizeof mbefore), "%s: a refused load "
                 "changed the params", cs[c].what);
        CT_CHECK(capex_optim_get_step(b.o, 0, &step) == CAPEX_OK && step == 0, "%s: step %lld after a refused load",
                 cs[c].what, (long long)step);
        CT_CHECK(capex_optim_step(b.o, 1.0f, 1.0f, 0) == CAPEX_OK, "%s: steps after: %s", cs[c].what, capex_last_error());
        capex_optim_destroy(a.o);
        capex_optim_destroy(b.o);
    }
    remove(path);
}

static const ct_case cases[] = {
    CT_CASE(adam_groups_amsgrad_bias_correction_l2_w), CT_CASE(lamb_groups_clip_nvlamb_averaging),
    CT_CASE(sgd_groups_momentum_nesterov_dampening_toggled), CT_CASE(novograd_groups_modes),
    CT_CASE(adagrad_groups_lr_decay_accumulator), CT_CASE(step_refuses_scale_product_that_overflows),
    CT_CASE(load_takes_modes_and_options_from_the_file), CT_CASE(load_refuses_a_file_of_another_layout),
};
CT_MAIN(cases)
