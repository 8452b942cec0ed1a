/* NovoGrad (Apex FusedNovoGrad) on the CPU optimizer: golden vectors from a
   float64 transcription of Apex (tests/gen_novograd_golden.py ->
   tests/novograd_golden.h); a float64 reference on fresh random inputs for
   every mode flag, grad dtype and model copy, with inv_scale and clip folded
   in and several chunks per tensor; Apex's f32 operation order bit for bit;
   first step (init_zero on/off), zero norms, empty tensors, found_inf skips,
   state save/load, thread counts, bad input. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include "novograd_golden.h"
#include <math.h>

#define OPTIM_TEST_SEED 0x2545f4914f6cdd1dull
#include "optim_test_util.h"

/* ---- golden vectors (Apex FusedNovoGrad transcribed in float64) ---- */

static int run_golden(ct_state *ct, const ng_case *gc) {
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[8];
    int64_t total = 0, off, i;
    int t, s;
    float *p, *m;
    double maxerr = 0;
    for (t = 0; t < gc->ntensors; t++) total += gc->sizes[t];
    p = (float *)malloc((size_t)(total ? total : 1) * 4);
    memcpy(p, gc->p0, (size_t)total * 4);
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    d.defaults.lr = gc->lr_b1_b2_eps_wd[0]; d.defaults.beta1 = gc->lr_b1_b2_eps_wd[1];
    d.defaults.beta2 = gc->lr_b1_b2_eps_wd[2]; d.defaults.eps = gc->lr_b1_b2_eps_wd[3];
    d.defaults.weight_decay = gc->lr_b1_b2_eps_wd[4];
    d.defaults.bias_correction = gc->bias_correction; d.defaults.grad_averaging = gc->grad_averaging;
    d.reg_inside_moment = gc->reg_inside_moment; d.init_zero = gc->init_zero;
    d.exec.chunk_size = 16; /* several items per tensor: the per-tensor norm adds partials */
    REQ(capex_optim_create(&d, &opt) == CAPEX_OK, "%s: %.300s", gc->name, capex_last_error());
    for (t = 0, off = 0; t < gc->ntensors; off += gc->sizes[t++]) {
        capex_optim_param_init(&ps[t]);
        ps[t].param = p + off; ps[t].grad = gc->g + off; ps[t].numel = gc->sizes[t];
    }
    REQ(capex_optim_add_group(opt, NULL, ps, (size_t)gc->ntensors, NULL) == CAPEX_OK, "%s: %.300s", gc->name,
        capex_last_error());
    for (s = 0; s < gc->nsteps; s++) {
        for (t = 0, off = 0; t < gc->ntensors; off += gc->sizes[t++])
            REQ(capex_optim_set_grad(opt, 0, (size_t)t, gc->g + (size_t)s * (size_t)total + off, CAPEX_F32) == CAPEX_OK,
                "%s", capex_last_error());
        REQ(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s: %.300s", gc->name, capex_last_error());
    }
    for (t = 0, off = 0; t < gc->ntensors; off += gc->sizes[t++]) {
        float v;
        double e;
        REQ(capex_optim_get_state(opt, 0, (size_t)t, &m, NULL) == CAPEX_OK, "%s", capex_last_error());
        REQ(capex_optim_get_novograd_norm(opt, 0, (size_t)t, &v) == CAPEX_OK, "%s", capex_last_error());
        e = fabs((double)v - gc->v[t]) / (1e-30 + fabs(gc->v[t]));
        REQ(gc->v[t] == 0.0f ? v == 0.0f : e <= 2e-6, "%s tensor %d: v %.9g, Apex %.9g", gc->name, t, (double)v,
            (double)gc->v[t]);
        for (i = 0; i < gc->sizes[t]; i++) {
            double em = fabs((double)m[i] - gc->m[off + i]) / (1e-3 + fabs(gc->m[off + i]));
            double ep = fabs((double)p[off + i] - gc->p[off + i]) / (1.0 + fabs(gc->p[off + i]));
            REQ(em <= 2e-5, "%s tensor %d [%lld]: m %.9g, Apex %.9g", gc->name, t, (long long)i, (double)m[i],
                (double)gc->m[off + i]);
            REQ(ep <= 1e-6, "%s tensor %d [%lld]: p %.9g, Apex %.9g", gc->name, t, (long long)i, (double)p[off + i],
                (double)gc->p[off + i]);
            if (ep > maxerr) maxerr = ep;
        }
    }
    if (getenv("CT_VERBOSE")) printf("golden %s: max relative error of p %.3g\n", gc->name, maxerr);
    capex_optim_destroy(opt);
    free(p);
    return 0;
}

CT_TEST(golden_apex_novograd) {
    size_t k;
    for (k = 0; k < sizeof ng_cases / sizeof ng_cases[0]; k++)
        if (run_golden(ct, &ng_cases[k])) return;
}

/* ---- float64 reference on fresh random inputs ---- */

typedef struct ref_state { double *p, *m, v; int64_t n; } ref_state;

/* One Apex step of one group in double; g[t][i] as the optimizer sees them. */
static void ref_step(const capex_optim_desc *d, const capex_optim_hparams *hp, int64_t step, ref_state *rs, int nt,
                     double *const *g) {
    double b1 = hp->beta1, b2 = hp->beta2, bc1 = 1, bc2 = 1, b3 = hp->grad_averaging ? 1.0 - b1 : 1.0;
    int t;
    int64_t i;
    if (hp->bias_correction) { bc1 = 1.0 - pow(b1, (double)step); bc2 = sqrt(1.0 - pow(b2, (double)step)); }
    for (t = 0; t < nt; t++) {
        double n2 = 0, denom;
        for (i = 0; i < rs[t].n; i++) n2 += g[t][i] * g[t][i];
        if (step == 1) rs[t].v = d->init_zero ? 0.0 : sqrt(n2);
        rs[t].v = sqrt(b2 * rs[t].v * rs[t].v + (1.0 - b2) * n2);
        denom = rs[t].v / bc2 + hp->eps;
        for (i = 0; i < rs[t].n; i++) {
            double gi = g[t][i], pi = rs[t].p[i];
            if (d->reg_inside_moment) {
                gi = gi / denom + hp->weight_decay * pi;
                rs[t].m[i] = b1 * rs[t].m[i] + b3 * gi;
                rs[t].p[i] = pi - hp->lr * (rs[t].m[i] / bc1);
            } else {
                rs[t].m[i] = b1 * rs[t].m[i] + b3 * gi;
                rs[t].p[i] = pi - hp->lr * ((rs[t].m[i] / bc1) / denom + hp->weight_decay * pi);
            }
        }
    }
}

/* nt tensors of random sizes (one empty), grads of dtype gd, model copies of
   md (CAPEX_F32: none), 2 groups with different hyperparameters. */
static int vs_float64(ct_state *ct, int reg, int init_zero, int avg, int bc, capex_dtype gd, capex_dtype md, int sr) {
    enum { NT = 4, NS = 4 };
    int64_t sz[NT] = {300, 0, 1, 77};
    capex_optim_desc d;
    capex_optim *opt;
    capex_optim_param ps[NT];
    capex_optim_hparams hp[2];
    float *p[NT];
    void *g[NT], *h[NT];
    double *gd64[NT];
    ref_state rs[NT];
    int t, s;
    int64_t i;
    const float inv_scale = 1.0f / 1024.0f, clip = 0.75f, gs = inv_scale * clip;
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    d.reg_inside_moment = reg; d.init_zero = init_zero;
    d.stochastic_rounding = sr; d.seed = 7;
    d.exec.chunk_size = 64;
    hp[0] = d.defaults; hp[1] = d.defaults;
    hp[0].lr = 0.01f; hp[0].weight_decay = 0.02f; hp[0].grad_averaging = avg; hp[0].bias_correction = bc;
    hp[1].lr = 0.003f; hp[1].beta1 = 0.5f; hp[1].beta2 = 0.9f; hp[1].eps = 1e-4f; hp[1].grad_averaging = avg;
    hp[1].bias_correction = bc;
    REQ(capex_optim_create(&d, &opt) == CAPEX_OK, "%.300s", capex_last_error());
    for (t = 0; t < NT; t++) {
        size_t n = (size_t)(sz[t] ? sz[t] : 1);
        p[t] = (float *)malloc(n * 4); g[t] = malloc(n * 4); h[t] = malloc(n * 2); gd64[t] = (double *)malloc(n * 8);
        rs[t].p = (double *)malloc(n * 8); rs[t].m = (double *)calloc(n, 8); rs[t].v = 0; rs[t].n = sz[t];
        for (i = 0; i < sz[t]; i++) rs[t].p[i] = p[t][i] = (float)nrand();
        capex_optim_param_init(&ps[t]);
        ps[t].param = p[t]; ps[t].grad = g[t]; ps[t].grad_dtype = gd; ps[t].numel = sz[t];
        if (md != CAPEX_F32) { ps[t].model = h[t]; ps[t].model_dtype = md; }
    }
    REQ(capex_optim_add_group(opt, &hp[0], ps, 2, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    REQ(capex_optim_add_group(opt, &hp[1], ps + 2, 2, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    for (s = 1; s <= NS; s++) {
        double scale = pow(10.0, 1.5 * urand() - 1.0) * 1024.0; /* loss-scaled grads, inside f16's range */
        for (t = 0; t < NT; t++)
            for (i = 0; i < sz[t]; i++) gd64[t][i] = (double)(put(g[t], gd, (size_t)i, (float)(nrand() * scale)) * gs);
        REQ(capex_optim_step(opt, inv_scale, clip, 0) == CAPEX_OK, "%.300s", capex_last_error());
        ref_step(&d, &hp[0], s, rs, 2, gd64);
        ref_step(&d, &hp[1], s, rs + 2, 2, gd64 + 2);
    }
    for (t = 0; t < NT; t++) {
        float v, *m;
        REQ(capex_optim_get_novograd_norm(opt, (size_t)t / 2, (size_t)t % 2, &v) == CAPEX_OK, "%s", capex_last_error());
        REQ(capex_optim_get_state(opt, (size_t)t / 2, (size_t)t % 2, &m, NULL) == CAPEX_OK, "%s", capex_last_error());
        REQ(fabs(v - rs[t].v) <= 1e-5 * rs[t].v + 1e-30, "tensor %d: v %.9g, float64 %.9g", t, (double)v, rs[t].v);
        for (i = 0; i < sz[t]; i++) {
            double ep = fabs(p[t][i] - rs[t].p[i]) / (1.0 + fabs(rs[t].p[i]));
            double em = fabs(m[i] - rs[t].m[i]) / (1e-3 + fabs(rs[t].m[i]));
            REQ(ep <= 2e-6 && em <= 1e-4, "reg %d init_zero %d avg %d bc %d gd %d tensor %d [%lld]: p %.9g vs %.9g, "
                "m %.9g vs %.9g", reg, init_zero, avg, bc, (int)gd, t, (long long)i, (double)p[t][i], rs[t].p[i],
                (double)m[i], rs[t].m[i]);
            if (md == CAPEX_F16)
                REQ(((uint16_t *)h[t])[i] == capex_f32_to_f16(p[t][i]), "f16 model copy of tensor %d [%lld]", t,
                    (long long)i);
            else if (md == CAPEX_BF16 && !sr)
                REQ(((uint16_t *)h[t])[i] == capex_f32_to_bf16(p[t][i]), "bf16 model copy of tensor %d [%lld]", t,
                    (long long)i);
            else if (md == CAPEX_BF16) { /* stochastic: one of the two neighbours */
                uint16_t lo = (uint16_t)(f_bits(p[t][i]) >> 16), hv = ((uint16_t *)h[t])[i];
                REQ(hv == lo || hv == (uint16_t)(lo + 1), "sr bf16 copy of tensor %d [%lld]", t, (long long)i);
            }
        }
    }
    capex_optim_destroy(opt);
    for (t = 0; t < NT; t++) { free(p[t]); free(g[t]); free(h[t]); free(gd64[t]); free(rs[t].p); free(rs[t].m); }
    return 0;
}

CT_TEST(novograd_vs_float64_every_mode) {
    int reg, iz, avg, bc;
    for (reg = 0; reg < 2; reg++)
        for (iz = 0; iz < 2; iz++)
            for (avg = 0; avg < 2; avg++)
                for (bc = 0; bc < 2; bc++)
                    if (vs_float64(ct, reg, iz, avg, bc, CAPEX_F32, CAPEX_F32, 0)) return;
}

CT_TEST(novograd_vs_float64_dtypes_and_model_copies) {
    capex_dtype gds[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    int k, reg;
    for (reg = 0; reg < 2; reg++)
        for (k = 0; k < 3; k++)
            if (vs_float64(ct, reg, 0, 1, 1, gds[k], CAPEX_F32, 0) || vs_float64(ct, reg, 0, 1, 1, gds[k], CAPEX_F16, 0) ||
                vs_float64(ct, reg, 1, 1, 1, gds[k], CAPEX_BF16, 0) || vs_float64(ct, reg, 0, 1, 1, gds[k], CAPEX_BF16, 1))
                return;
}

/* ---- Apex's f32 operation order, bit for bit ---- */

/* NovoGradFunctor's lines in f32 (MATH_T = float), written out here apart from
   the library's macro; v taken from the optimizer (its norm is a double sum). */
CT_TEST(apex_f32_order_bitexact) {
    enum { N = 1000 };
    int reg;
    for (reg = 0; reg < 2; reg++) {
        static float p[N], g[N], q[N], qm[N];
        capex_optim_desc d;
        capex_optim *opt;
        capex_optim_param ps;
        float v, *m;
        int s, i;
        capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
        d.reg_inside_moment = reg;
        /* lr near 1 and tiny weights: p's bits are the update's bits (with lr 0.01 an
           update one ulp off vanishes in p's rounding) */
        d.defaults.lr = 0.75f; d.defaults.weight_decay = 0.01f; d.defaults.beta1 = 0.85f; d.defaults.beta2 = 0.98f;
        d.exec.chunk_size = 100;
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%s", capex_last_error());
        for (i = 0; i < N; i++) { q[i] = p[i] = (float)(nrand() * 1e-4); qm[i] = 0.0f; }
        capex_optim_param_init(&ps);
        ps.param = p; ps.grad = g; ps.numel = N;
        CT_CHECK(capex_optim_add_group(opt, NULL, &ps, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (s = 1; s <= 5; s++) {
            const float beta1 = 0.85f, beta3 = 1.0f - beta1, lr = 0.75f, decay = 0.01f, epsilon = 1e-8f;
            float bc1 = (float)(1.0 - pow((double)0.85f, (double)s)), bc2 = (float)sqrt(1.0 - pow((double)0.98f, (double)s));
            for (i = 0; i < N; i++) g[i] = (float)(nrand() * 3.0);
            CT_CHECK(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 0, &v) == CAPEX_OK, "%s", capex_last_error());
            for (i = 0; i < N; i++) {
                float r_g = g[i], r_p = q[i], r_m = qm[i];
                if (reg) { /* MOMENT_MODE_0 */
                    float next_v_unbiased = v / bc2, denom = next_v_unbiased + epsilon, next_m_unbiased;
                    r_g = (r_g / denom) + (decay * r_p);
                    r_m = beta1 * r_m + beta3 * r_g;
                    next_m_unbiased = r_m / bc1;
                    r_p = r_p - (lr * next_m_unbiased);
                } else { /* MOMENT_MODE_1 */
                    float next_m_unbiased, next_v_unbiased, denom, update;
                    r_m = beta1 * r_m + beta3 * r_g;
                    next_m_unbiased = r_m / bc1;
                    next_v_unbiased = v / bc2;
                    denom = next_v_unbiased + epsilon;
                    update = (next_m_unbiased / denom) + (decay * r_p);
                    r_p = r_p - (lr * update);
                }
                q[i] = r_p; qm[i] = r_m;
            }
            CT_CHECK(capex_optim_get_state(opt, 0, 0, &m, NULL) == CAPEX_OK, "%s", capex_last_error());
            for (i = 0; i < N; i++)
                CT_CHECK(f_bits(p[i]) == f_bits(q[i]) && f_bits(m[i]) == f_bits(qm[i]),
                         "reg_inside_moment %d step %d [%d]: p %.9g vs Apex order %.9g, m %.9g vs %.9g", reg, s, i, (double)p[i],
                         (double)q[i], (double)m[i], (double)qm[i]);
        }
        capex_optim_destroy(opt);
    }
}

/* ---- first step, zero norms, empty tensors ---- */

CT_TEST(first_step_init_zero_and_zero_norm) {
    int iz;
    for (iz = 0; iz < 2; iz++) {
        float p[3] = {1, 2, 3}, g[3] = {3, 0, 4}, pz[2] = {5, -5}, gz[2] = {0, 0}, v;
        capex_optim_desc d;
        capex_optim *opt;
        capex_optim_param ps[3];
        capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
        d.init_zero = iz;
        d.defaults.weight_decay = 0.1f;
        CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%s", capex_last_error());
        capex_optim_param_init(&ps[0]); ps[0].param = p; ps[0].grad = g; ps[0].numel = 3;
        capex_optim_param_init(&ps[1]); ps[1].param = pz; ps[1].grad = gz; ps[1].numel = 2;
        capex_optim_param_init(&ps[2]); /* empty */
        CT_CHECK(capex_optim_add_group(opt, NULL, ps, 3, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 0, &v) == CAPEX_OK && v == 0.0f, "v before the first step");
        CT_CHECK(capex_optim_step(opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 0, &v) == CAPEX_OK, "%s", capex_last_error());
        /* |g| = 5: v = 5 (the first blend leaves the first norm) or sqrt(1-b2)*5 from 0 */
        if (iz) CT_CHECK(fabs(v - sqrt((double)(1.0f - 0.999f)) * 5.0) < 1e-6, "init_zero: v %.9g", (double)v);
        else CT_CHECK(fabs(v - 5.0) < 1e-6, "first-step norm: v %.9g", (double)v);
        /* zero norm: v 0, denom eps; m = 0, so only the decay moves p (finite) */
        CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 1, &v) == CAPEX_OK && v == 0.0f, "zero grad norm: v %g", (double)v);
        CT_CHECK(fabs(pz[0] - (5.0 - 1e-3 * 0.1 * 5.0)) < 1e-6 && fabs(pz[1] + (5.0 - 1e-3 * 0.1 * 5.0)) < 1e-6,
                 "zero grad: p %.9g %.9g", (double)pz[0], (double)pz[1]);
        CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 2, &v) == CAPEX_OK && v == 0.0f, "empty tensor: v %g", (double)v);
        capex_optim_destroy(opt);
    }
}

/* ---- found_inf, threads, save/load ---- */

typedef struct rig { float p[2][500], g[2][500]; uint16_t h[2][500]; capex_optim *opt; } rig;

static int rig_make(ct_state *ct, rig *r, int threads, int reg) {
    capex_optim_desc d;
    capex_optim_param ps[2];
    int t, i;
    uint64_t save = rng_state;
    rng_state = 99;
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    d.reg_inside_moment = reg; d.defaults.weight_decay = 0.01f; d.defaults.lr = 0.01f;
    d.exec.chunk_size = 64; d.exec.num_threads = threads; d.exec.parallel_min_elements = 1;
    REQ(capex_optim_create(&d, &r->opt) == CAPEX_OK, "%s", capex_last_error());
    for (t = 0; t < 2; t++) {
        for (i = 0; i < 500; i++) r->p[t][i] = (float)nrand();
        capex_optim_param_init(&ps[t]);
        ps[t].param = r->p[t]; ps[t].grad = r->g[t]; ps[t].numel = t ? 500 : 333;
        ps[t].model = r->h[t]; ps[t].model_dtype = CAPEX_BF16;
    }
    rng_state = save;
    REQ(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK, "%s", capex_last_error());
    return 0;
}
static void rig_grads(rig *r, uint64_t seed) {
    uint64_t save = rng_state;
    int t, i;
    rng_state = seed;
    for (t = 0; t < 2; t++) for (i = 0; i < 500; i++) r->g[t][i] = (float)(nrand() * 100.0);
    rng_state = save;
}
static int rig_same(const rig *a, const rig *b) {
    int t;
    float va, vb;
    for (t = 0; t < 2; t++) {
        float *ma = NULL, *mb = NULL;
        capex_optim_get_state(a->opt, 0, (size_t)t, &ma, NULL);
        capex_optim_get_state(b->opt, 0, (size_t)t, &mb, NULL);
        capex_optim_get_novograd_norm(a->opt, 0, (size_t)t, &va);
        capex_optim_get_novograd_norm(b->opt, 0, (size_t)t, &vb);
        if (memcmp(a->p[t], b->p[t], sizeof a->p[t]) || memcmp(a->h[t], b->h[t], sizeof a->h[t]) ||
            memcmp(ma, mb, (size_t)(t ? 500 : 333) * 4) || f_bits(va) != f_bits(vb))
            return 0;
    }
    return 1;
}

CT_TEST(found_inf_skips_and_keeps_first_step) {
    static rig a, b;
    int64_t st = -1;
    float g_inf;
    if (rig_make(ct, &a, 1, 0) || rig_make(ct, &b, 1, 0)) return;
    rig_grads(&a, 1);
    g_inf = (float)INFINITY;
    a.g[1][7] = g_inf; a.g[0][3] = (float)NAN;
    /* the scaler found inf/NaN: nothing changes, the step does not count */
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 1) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(rig_same(&a, &b), "a skipped step changed the state");
    CT_CHECK(capex_optim_get_step(a.opt, 0, &st) == CAPEX_OK && st == 0, "step %lld", (long long)st);
    /* the next clean step is still the first (v starts from its norm) */
    rig_grads(&a, 2); rig_grads(&b, 2);
    CT_CHECK(capex_optim_step(a.opt, 0.5f, 1.0f, 0) == CAPEX_OK && capex_optim_step(b.opt, 0.5f, 1.0f, 0) == CAPEX_OK,
             "%s", capex_last_error());
    CT_CHECK(rig_same(&a, &b), "after the skipped step a run differs from one without it");
    capex_optim_destroy(a.opt); capex_optim_destroy(b.opt);
}

CT_TEST(same_bits_any_thread_count) {
    static rig a, b;
    int s, reg;
    for (reg = 0; reg < 2; reg++) {
        if (rig_make(ct, &a, 1, reg) || rig_make(ct, &b, 2, reg)) return;
        for (s = 0; s < 3; s++) {
            rig_grads(&a, 10 + (uint64_t)s); rig_grads(&b, 10 + (uint64_t)s);
            CT_CHECK(capex_optim_step(a.opt, 0.25f, 0.5f, 0) == CAPEX_OK && capex_optim_step(b.opt, 0.25f, 0.5f, 0) == CAPEX_OK,
                     "%s", capex_last_error());
        }
        CT_CHECK(rig_same(&a, &b), "1 and 2 threads differ (reg %d)", reg);
        capex_optim_destroy(a.opt); capex_optim_destroy(b.opt);
    }
}

static size_t save_mem(const capex_optim *o, void **buf) {
    capex_state_writer *w;
    size_t len = 0;
    if (capex_state_writer_create(NULL, &w) != CAPEX_OK) return 0;
    if (capex_optim_save(o, w, NULL, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK ||
        capex_state_write_memory(w, NULL, 0, &len) != CAPEX_OK || !(*buf = malloc(len)) ||
        capex_state_write_memory(w, *buf, len, &len) != CAPEX_OK)
        len = 0;
    capex_state_writer_destroy(w);
    return len;
}

CT_TEST(save_load_resumes_bit_identically) {
    static rig a, b;
    void *buf = NULL;
    size_t len;
    int s;
    capex_state_reader *rd;
    if (rig_make(ct, &a, 1, 1) || rig_make(ct, &b, 1, 0)) return; /* b: other mode, other weights */
    for (s = 0; s < 2; s++) {
        rig_grads(&a, 20 + (uint64_t)s);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
    }
    len = save_mem(a.opt, &buf);
    CT_CHECK(len > 0, "save: %s", capex_last_error());
    CT_CHECK(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_load(b.opt, rd, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s", capex_last_error());
    capex_state_reader_close(rd);
    CT_CHECK(rig_same(&a, &b), "loaded state differs");
    for (s = 0; s < 2; s++) {
        rig_grads(&a, 30 + (uint64_t)s); rig_grads(&b, 30 + (uint64_t)s);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK && capex_optim_step(b.opt, 1.0f, 1.0f, 0) == CAPEX_OK,
                 "%s", capex_last_error());
    }
    CT_CHECK(rig_same(&a, &b), "resumed run differs (mode, v or step not restored)");
    { /* a NovoGrad file into an Adam optimizer, and an Adam file into NovoGrad: refused */
        capex_optim_desc d;
        capex_optim *adam;
        capex_optim_param ps[2];
        void *abuf = NULL;
        size_t alen;
        int t;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        CT_CHECK(capex_optim_create(&d, &adam) == CAPEX_OK, "%s", capex_last_error());
        for (t = 0; t < 2; t++) {
            capex_optim_param_init(&ps[t]);
            ps[t].param = b.p[t]; ps[t].grad = b.g[t]; ps[t].numel = t ? 500 : 333;
        }
        capex_optim_destroy(b.opt);
        CT_CHECK(capex_optim_add_group(adam, NULL, ps, 2, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_load(adam, rd, NULL, 0) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "NovoGrad"),
                 "NovoGrad file into Adam: %s", capex_last_error());
        capex_state_reader_close(rd);
        alen = save_mem(adam, &abuf);
        CT_CHECK(alen > 0, "%s", capex_last_error());
        CT_CHECK(capex_state_reader_open_memory(abuf, alen, 0, NULL, &rd) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_load(a.opt, rd, NULL, 0) == CAPEX_ERR_CONFIG, "Adam file into NovoGrad: %s",
                 capex_last_error());
        capex_state_reader_close(rd);
        capex_optim_destroy(adam);
        free(abuf);
    }
    capex_optim_destroy(a.opt);
    free(buf);
}

CT_TEST(bad_input) {
    capex_optim_desc d;
    capex_optim *opt = NULL;
    float v;
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    CT_CHECK(d.norm_type == 2 && d.defaults.eps == 1e-8f && d.defaults.weight_decay == 0.0f && d.defaults.lr == 1e-3f &&
             d.defaults.grad_averaging && d.defaults.bias_correction && !d.reg_inside_moment && !d.init_zero,
             "Apex FusedNovoGrad defaults");
    d.norm_type = 0;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_CONFIG && !opt && strstr(capex_last_error(), "norm_type 0"),
             "inf norm: %s", capex_last_error());
    d.norm_type = 2; d.defaults.beta2 = 1.0f;
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_ERR_INVALID_ARG && !opt, "beta2 1: %s", capex_last_error());
    d.kind = (capex_optim_kind)3 /* h-b's Adagrad slot, unknown here */;
    d.defaults.beta2 = 0.999f;
    if (capex_optim_create(&d, &opt) == CAPEX_OK) capex_optim_destroy(opt); /* known once Adagrad lands */
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_optim_create(&d, &opt) == CAPEX_OK, "%s", capex_last_error());
    {
        float p = 1, g = 1;
        capex_optim_param ps;
        capex_optim_param_init(&ps); ps.param = &p; ps.grad = &g; ps.numel = 1;
        CT_CHECK(capex_optim_add_group(opt, NULL, &ps, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    }
    CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 0, &v) == CAPEX_ERR_CONFIG, "Adam has no NovoGrad norm");
    CT_CHECK(capex_optim_get_novograd_norm(opt, 0, 1, &v) == CAPEX_ERR_INVALID_ARG, "index out of range");
    CT_CHECK(capex_optim_get_novograd_norm(NULL, 0, 0, &v) == CAPEX_ERR_INVALID_ARG, "NULL optimizer");
    capex_optim_destroy(opt);
}

CT_TEST(math_source_has_novograd) {
    size_t n = capex__optim_math_source(NULL, 0);
    char *buf = (char *)malloc(n + 1);
    capex__optim_math_source(buf, n + 1);
    CT_CHECK(strstr(buf, "CAPEX__QUAL float capex__novo_mom_elem(") && strstr(buf, "capex__novo_reg_elem") &&
             strstr(buf, "capex__novo_blend") && strstr(buf, "capex__novo_denom"), "NovoGrad math in the CUDA text");
    free(buf);
}

static const ct_case cases[] = {
    CT_CASE(golden_apex_novograd), CT_CASE(novograd_vs_float64_every_mode),
    CT_CASE(novograd_vs_float64_dtypes_and_model_copies), CT_CASE(apex_f32_order_bitexact),
    CT_CASE(first_step_init_zero_and_zero_norm), CT_CASE(found_inf_skips_and_keeps_first_step),
    CT_CASE(same_bits_any_thread_count), CT_CASE(save_load_resumes_bit_identically), CT_CASE(bad_input),
    CT_CASE(math_source_has_novograd),
};
CT_MAIN(cases)
