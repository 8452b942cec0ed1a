/* Differential stress of the CPU fast paths (F16C/AVX/FMA, chosen at run time
   or compile time) against the portable ones (capex__*_state = 1), and of
   thread counts 1/2/3 against each other: bulk fp16 codecs, sums of squares
   and L2 norms (offsets 0..15, every length 0..300, chunk 37), every optimizer
   kind (Adam L2/W, AMSGrad, pure half, SGD, LAMB, NovoGrad, Adagrad) with
   f32/f16/bf16 grads and each model copy, tensors at odd element offsets and
   a step with NaN/inf/subnormal/huge grads, LayerNorm/RMSNorm (dtype mixes,
   tails mod 8/16, the streamed f32 dx against two unstreamed halves) and
   BatchNorm (both layouts), scale and axpby (every dtype mix, in place too).
   Every output bit must match; only LayerNorm dx computed by the other
   backward loop (without dweight/dbias) may differ in NaN payloads (gcc -O3
   -march=native orders the NaN operands differently). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float urand(void) { return (float)(rnd32() >> 8) / 16777216.0f * 2.0f - 1.0f; }
static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* a value: mostly moderate, some special */
static float spicy(void) {
    unsigned r = rnd32() % 128;
    if (r == 0) return bits_f(rnd32());                    /* any bits: NaNs with payloads, inf */
    if (r == 1) return INFINITY * (rnd32() & 1 ? 1 : -1);
    if (r == 2) return bits_f(rnd32() & 0x807fffffu);      /* f32 subnormal */
    if (r == 3) return urand() * 3e-6f;                    /* fp16 subnormal */
    if (r == 4) return urand() * 65504.0f * 1.01f;         /* near fp16 overflow */
    if (r == 5) return urand() * 1e38f;
    if (r == 6) return 0.0f * (rnd32() & 1 ? 1 : -1);
    return urand() * 2.0f;
}
static int same(const void *a, const void *b, size_t bytes) {
    size_t i;
    if (memcmp(a, b, bytes) == 0) return 1;
    for (i = 0; i < bytes && ((const unsigned char *)a)[i] == ((const unsigned char *)b)[i]; i++) {}
    if (getenv("FP_DEBUG")) {
        size_t k = i & ~(size_t)3, cnt = 0;
        fprintf(stderr, "first byte difference at %zu of %zu: %08x vs %08x\n", i, bytes,
                (unsigned)(((const uint32_t *)a)[k / 4]), (unsigned)(((const uint32_t *)b)[k / 4]));
        for (; i < bytes; i++) cnt += ((const unsigned char *)a)[i] != ((const unsigned char *)b)[i];
        fprintf(stderr, "%zu bytes differ\n", cnt);
    }
    return 0;
}

#ifdef CAPEX__F16C
static void force(int portable, int fma) {
    __atomic_store_n(&capex__f16c_state, portable ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&capex__avx_state, portable ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&capex__fma_state, fma ? 0 : 1, __ATOMIC_RELAXED);
}
#else
static void force(int portable, int fma) { (void)portable; (void)fma; }
#endif

/* bulk conversions: any bits, any length and offset */
CT_TEST(conversions) {
    static uint16_t h[400], ho[2][400];
    static float f[400], fo[2][400];
    int n, off, k, i;
    rng = 1;
    for (n = 0; n <= 300; n++)
        for (off = 0; off < 16; off++) {
            for (i = 0; i < 400; i++) { h[i] = (uint16_t)rnd32(); f[i] = (rnd32() & 1) ? spicy() : bits_f(rnd32()); }
            for (k = 0; k < 2; k++) {
                force(k == 0, 1);
                memset(ho[k], 0xa5, sizeof ho[k]); memset(fo[k], 0xa5, sizeof fo[k]);
                capex_f16_to_f32_array(h + off, fo[k] + off, (size_t)n);
                capex_f32_to_f16_array(f + off, ho[k] + off, (size_t)n);
            }
            CT_CHECK(same(fo[0], fo[1], sizeof fo[0]), "f16->f32 n %d off %d", n, off);
            CT_CHECK(same(ho[0], ho[1], sizeof ho[0]), "f32->f16 n %d off %d", n, off);
        }
    force(0, 1);
}

/* sums of squares / norms: paths x threads x chunking */
CT_TEST(norms) {
    enum { NX = 4 };
    static float x[70000];
    static uint16_t b[70000], hh[70000];
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    int n, off, di, path, th, i, t, round;
    rng = 2;
    for (i = 0; i < 70000; i++) {
        x[i] = (rnd32() % 8) ? urand() * (float)(1u << (rnd32() % 20)) : spicy();
        b[i] = capex_f32_to_bf16(x[i]);
        hh[i] = (rnd32() % 64) ? capex_f32_to_f16(x[i]) : (uint16_t)rnd32();
    }
    for (round = 0; round < 2; round++) {
        if (round) /* dense NaNs of both signs and payloads (several in one lane) */
            for (i = 0; i < 70000; i++) {
                uint32_t u = rnd32();
                if (u % 8) continue;
                x[i] = bits_f(0x7fc00000u | (u & 0x803fffffu));
                b[i] = (uint16_t)(0x7fc0u | (u & 0x803fu));
                hh[i] = (uint16_t)(0x7c01u | (u & 0x83ffu));
            }
        for (n = 0; n <= 300; n++)
            for (off = 0; off < 16; off++)
                for (di = 0; di < 3; di++) {
                    void *base = dts[di] == CAPEX_F32 ? (void *)x : dts[di] == CAPEX_F16 ? (void *)hh : (void *)b;
                    size_t es = capex_dtype_size(dts[di]);
                    double ref = 0, s;
                    for (path = 0; path < 3; path++) {
                        force(path == 0, path == 2);
                        s = dts[di] == CAPEX_F32 ? capex__sumsq_F32((char *)base + off * es, n)
                            : dts[di] == CAPEX_F16 ? capex__sumsq_F16((char *)base + off * es, n)
                                                   : capex__sumsq_BF16((char *)base + off * es, n);
                        if (path == 0) ref = s;
                        CT_CHECK(same(&ref, &s, 8), "sumsq %s n %d off %d path %d round %d: %a vs %a",
                                 capex_dtype_name(dts[di]), n, off, path, round, ref, s);
                    }
                }
    }
    /* lists of tensors at odd offsets, small chunks, threads */
    for (di = 0; di < 3; di++)
        for (i = 0; i < 40; i++) {
            capex_tensor ts[NX];
            capex_tensor_list l;
            capex_tensor_op_desc d;
            double tot[2][4], per[2][4][NX];
            float ltot[2][4], lper[2][4][NX];
            void *base = dts[di] == CAPEX_F32 ? (void *)x : dts[di] == CAPEX_F16 ? (void *)hh : (void *)b;
            size_t es = capex_dtype_size(dts[di]);
            int64_t at = rnd32() % 16;
            for (t = 0; t < NX; t++) {
                int64_t len = i < 20 ? (int64_t)(rnd32() % 301) : (int64_t)(rnd32() % 15000);
                ts[t].data = (char *)base + (size_t)at * es;
                ts[t].numel = len;
                at += len + rnd32() % 16;
            }
            l = capex_tensor_list_make(dts[di], ts, NX);
            for (path = 0; path < 2; path++)
                for (th = 1; th <= 3; th++) {
                    force(path == 0, 1);
                    capex_tensor_op_desc_init(&d);
                    d.num_threads = th;
                    d.parallel_min_elements = 1;
                    d.chunk_size = i % 2 ? 37 : 1024;
                    CT_CHECK(capex_multi_tensor_sumsq(&d, &l, &tot[path][th], per[path][th]) == CAPEX_OK, "%s",
                             capex_last_error());
                    CT_CHECK(capex_multi_tensor_l2norm(&d, &l, &ltot[path][th], lper[path][th]) == CAPEX_OK, "%s",
                             capex_last_error());
                    CT_CHECK(same(&tot[path][th], &tot[0][1], 8) && same(per[path][th], per[0][1], sizeof per[0][1]) &&
                                 same(&ltot[path][th], &ltot[0][1], 4) && same(lper[path][th], lper[0][1], sizeof lper[0][1]),
                             "list %s case %d path %d threads %d: %a vs %a", capex_dtype_name(dts[di]), i, path, th,
                             tot[path][th], tot[0][1]);
                }
        }
    force(0, 1);
}

/* optimizers: every kind, grad dtype, model copy; tensors at odd offsets */
typedef struct ocfg {
    const char *name;
    capex_optim_kind kind;
    int w, lowmem, nesterov, ams, pure;
    float momentum;
} ocfg;
enum { OT = 6, OCAP = 1 << 17 };
typedef struct obuf {
    float p[OCAP], m[OCAP], v[OCAP], vm[OCAP];
    uint16_t model[OCAP];
    float gf[OCAP];
    uint16_t gh[OCAP];
} obuf;
static obuf ob[2];

static int run_optim(const ocfg *oc, capex_dtype gt, int model, int threads, uint64_t seed, const int64_t *len,
                     const int64_t *at, int64_t used, obuf *r) {
    capex_optim_desc d;
    capex_optim *o = NULL;
    capex_optim_param ps[OT];
    int t, s, ok = 1;
    int64_t i;
    rng = seed;
    memset(r->m, 0, sizeof r->m); memset(r->v, 0, sizeof r->v); memset(r->vm, 0, sizeof r->vm);
    capex_optim_desc_init(&d, oc->kind);
    d.adam_w_mode = oc->w;
    d.lamb_low_memory = oc->lowmem;
    d.reg_inside_moment = oc->kind == CAPEX_OPTIM_NOVOGRAD && oc->w;
    d.defaults.weight_decay = 0.01f;
    d.defaults.momentum = oc->momentum;
    d.defaults.nesterov = oc->nesterov;
    d.defaults.amsgrad = oc->ams;
    d.stochastic_rounding = model == 3;
    d.seed = 12345;
    d.exec.num_threads = threads;
    d.exec.parallel_min_elements = 1;
    d.exec.chunk_size = 1500; /* many items, tails of every kind */
    for (i = 0; i < used; i++) { r->p[i] = urand(); r->model[i] = oc->pure ? capex_f32_to_f16(r->p[i]) : 0; }
    if (oc->pure && model == 2) for (i = 0; i < used; i++) r->model[i] = capex_f32_to_bf16(r->p[i]);
    for (t = 0; t < OT; t++) {
        capex_optim_param_init(&ps[t]);
        ps[t].param = r->p + at[t]; ps[t].numel = len[t];
        ps[t].grad = gt == CAPEX_F32 ? (void *)(r->gf + at[t]) : (void *)(r->gh + at[t]);
        ps[t].grad_dtype = gt;
        ps[t].exp_avg = r->m + at[t];
        ps[t].exp_avg_sq = oc->kind == CAPEX_OPTIM_SGD || oc->kind == CAPEX_OPTIM_NOVOGRAD ? NULL : r->v + at[t];
        if (oc->ams) ps[t].max_exp_avg_sq = r->vm + at[t];
        if (model) { ps[t].model = r->model + at[t]; ps[t].model_dtype = model == 1 ? CAPEX_F16 : CAPEX_BF16; }
        ps[t].pure_half = oc->pure && model;
    }
    if (capex_optim_create(&d, &o) != CAPEX_OK || capex_optim_add_group(o, NULL, ps, OT, NULL) != CAPEX_OK) {
        capex_optim_destroy(o);
        return 0;
    }
    for (s = 0; s < 3 && ok; s++) {
        for (i = 0; i < used; i++) {
            float x = s == 2 ? spicy() : urand() * 2.0f; /* the last step with NaN/inf grads */
            if (gt == CAPEX_F32) r->gf[i] = x;
            else r->gh[i] = gt == CAPEX_F16 ? capex_f32_to_f16(x) : capex_f32_to_bf16(x);
        }
        ok = capex_optim_step(o, 0.5f, 1.0f, 0) == CAPEX_OK;
    }
    capex_optim_destroy(o);
    return ok;
}

CT_TEST(optimizers) {
    static const ocfg cfgs[] = {
        {"adam l2", CAPEX_OPTIM_ADAM, 0, 0, 0, 0, 0, 0.0f}, {"adamw", CAPEX_OPTIM_ADAM, 1, 0, 0, 0, 0, 0.0f},
        {"adamw amsgrad", CAPEX_OPTIM_ADAM, 1, 0, 0, 1, 0, 0.0f}, {"adam amsgrad", CAPEX_OPTIM_ADAM, 0, 0, 0, 1, 0, 0.0f},
        {"adamw pure half", CAPEX_OPTIM_ADAM, 1, 0, 0, 0, 1, 0.0f},
        {"sgd", CAPEX_OPTIM_SGD, 0, 0, 0, 0, 0, 0.0f}, {"sgd momentum", CAPEX_OPTIM_SGD, 0, 0, 0, 0, 0, 0.9f},
        {"sgd nesterov", CAPEX_OPTIM_SGD, 0, 0, 1, 0, 0, 0.9f}, {"lamb", CAPEX_OPTIM_LAMB, 1, 0, 0, 0, 0, 0.0f},
        {"lamb l2 low-memory", CAPEX_OPTIM_LAMB, 0, 1, 0, 0, 0, 0.0f},
        {"novograd", CAPEX_OPTIM_NOVOGRAD, 0, 0, 0, 0, 0, 0.0f},
        {"novograd reg", CAPEX_OPTIM_NOVOGRAD, 1, 0, 0, 0, 0, 0.0f},
        {"adagrad", CAPEX_OPTIM_ADAGRAD, 0, 0, 0, 0, 0, 0.0f}, {"adagrad w", CAPEX_OPTIM_ADAGRAD, 1, 0, 0, 0, 0, 0.0f},
    };
    static const capex_dtype gts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t big[OT] = {0, 1, 17, 1023, 3001, 40001};
    int64_t at[OT], lens[OT], a;
    size_t c;
    int gi, model, th, t, pass;
    for (pass = 0; pass < 2; pass++) {
        rng = 77 + (uint64_t)pass;
        for (a = 0, t = 0; t < OT; t++) {
            lens[t] = pass == 0 ? big[t] : t < OT - 1 ? (int64_t)(rnd32() % 301) : 2049; /* pass 1: short tails */
            at[t] = a + (int64_t)(rnd32() % 16);
            a = at[t] + lens[t];
        }
        for (c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
            for (gi = 0; gi < 3; gi++)
                for (model = cfgs[c].pure ? 1 : 0; model < (cfgs[c].pure ? 3 : 4); model++) {
                    uint64_t seed = 0x1234567ull + c * 131 + (uint64_t)gi * 17 + (uint64_t)model + (uint64_t)pass;
                    int run;
                    force(1, 1);
                    CT_CHECK(run_optim(&cfgs[c], gts[gi], model, 1, seed, lens, at, a, &ob[0]), "%s: %s", cfgs[c].name,
                             capex_last_error());
                    for (run = 0; run < 4; run++) {
                        th = run < 3 ? run + 1 : 3;
                        force(run == 3, 1);
                        CT_CHECK(run_optim(&cfgs[c], gts[gi], model, th, seed, lens, at, a, &ob[1]), "%s: %s",
                                 cfgs[c].name, capex_last_error());
                        CT_CHECK(same(ob[0].p, ob[1].p, (size_t)a * 4) && same(ob[0].m, ob[1].m, (size_t)a * 4) &&
                                     same(ob[0].v, ob[1].v, (size_t)a * 4) && same(ob[0].vm, ob[1].vm, (size_t)a * 4) &&
                                     same(ob[0].model, ob[1].model, (size_t)a * 2),
                                 "%s grad %s model %d threads %d %s: differs from portable 1 thread (pass %d)",
                                 cfgs[c].name, capex_dtype_name(gts[gi]), model, th, run == 3 ? "portable" : "fast",
                                 pass);
                    }
                }
    }
    force(0, 1);
}

/* LayerNorm / RMSNorm / BatchNorm: dtypes, shapes (tails mod 8/16, streamed
   dx), odd element offsets, threads; dx must not depend on which of dweight /
   dbias are asked for. */
enum { NCAP = 2200000 }; /* the big shape, 2100 x 1001 (+16), streams its f32 dx */
static float nx[NCAP], ndy[NCAP], nw[4096], nb[4096];
typedef struct nout {
    unsigned char y[NCAP * 4], dx[NCAP * 4];
    float mean[1 << 15], rstd[1 << 15];
    unsigned char dw[4096 * 4], db[4096 * 4];
    float rm[4096], rv[4096];
} nout;
static nout no[2];
static unsigned char nxs[NCAP * 4], ndys[NCAP * 4], nws[4096 * 4], nbs[4096 * 4];
/* equal bits, or both NaN (any payload) */
static int same_or_nan(const unsigned char *a, const unsigned char *b, int64_t n, capex_dtype t) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float x, y;
        if (t == CAPEX_F32) { memcpy(&x, a + 4 * i, 4); memcpy(&y, b + 4 * i, 4); }
        else {
            uint16_t hx, hy;
            memcpy(&hx, a + 2 * i, 2); memcpy(&hy, b + 2 * i, 2);
            x = t == CAPEX_F16 ? capex_f16_to_f32(hx) : capex_bf16_to_f32(hx);
            y = t == CAPEX_F16 ? capex_f16_to_f32(hy) : capex_bf16_to_f32(hy);
        }
        if (!same(&x, &y, 4) && !(x != x && y != y)) return 0;
    }
    return 1;
}
static void *as_dtype(const float *src, unsigned char *dst, capex_dtype t, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        if (t == CAPEX_F32) memcpy(dst + 4 * i, &src[i], 4);
        else {
            uint16_t h = t == CAPEX_F16 ? capex_f32_to_f16(src[i]) : capex_f32_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
    }
    return dst;
}
static int norm_run(int rms, capex_dtype xt, capex_dtype yt, capex_dtype pt, int64_t rows, int64_t cols, int off,
                    int th, int outs, nout *r) {
    capex_norm_desc d;
    capex_norm_args a;
    size_t xe = capex_dtype_size(xt), ye = capex_dtype_size(yt);
    memset(r->dx, 0, (size_t)(rows * cols + 16) * 4);
    memset(r->dw, 0, sizeof r->dw); memset(r->db, 0, sizeof r->db);
    capex_norm_desc_init(&d);
    d.num_threads = th;
    capex_norm_args_init(&a);
    a.rows = rows; a.cols = cols; a.x_dtype = xt; a.y_dtype = yt; a.param_dtype = pt;
    a.x = nxs + off * xe; a.dy = ndys + off * ye;
    a.weight = nws; a.bias = rms ? NULL : nbs;
    a.y = r->y + off * ye; a.dx = r->dx + off * xe;
    a.mean = r->mean; a.rstd = r->rstd;
    a.dweight = outs & 1 ? r->dw : NULL;
    a.dbias = !rms && (outs & 2) ? r->db : NULL;
    if ((rms ? capex_rms_norm_forward(&d, &a) : capex_layer_norm_forward(&d, &a)) != CAPEX_OK) return 0;
    return (rms ? capex_rms_norm_backward(&d, &a) : capex_layer_norm_backward(&d, &a)) == CAPEX_OK;
}
CT_TEST(layer_rms_norm) {
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 8}, {2, 9}, {4, 15}, {3, 16}, {2, 17}, {7, 33}, {9, 127},
                                        {40, 1029}, {3, 300}, {61, 1000}, {2100, 1001}};
    int64_t i;
    int si, xi, yi, pi, rms, off, th, run, outs;
    rng = 3;
    for (i = 0; i < NCAP; i++) { nx[i] = (rnd32() % 16) ? urand() * 4.0f + 1.0f : spicy(); ndy[i] = (rnd32() % 16) ? urand() : spicy(); }
    for (i = 0; i < 4096; i++) { nw[i] = 1.0f + 0.1f * urand(); nb[i] = 0.1f * urand(); }
    for (si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++)
        for (xi = 0; xi < 3; xi++)
            for (yi = 0; yi < 3; yi++)
                for (pi = 0; pi < 3; pi += 2)
                    for (rms = 0; rms < 2; rms++) {
                        int64_t R = shapes[si][0], C = shapes[si][1];
                        if (R * C > 300000 && (xi || yi || pi || rms)) continue; /* the big shape: f32 dx streamed */
                        off = (int)(rnd32() % 16);
                        as_dtype(nx, nxs, dts[xi], R * C + 16);
                        as_dtype(ndy, ndys, dts[yi], R * C + 16);
                        as_dtype(nw, nws, dts[pi], C);
                        as_dtype(nb, nbs, dts[pi], C);
                        force(1, 1);
                        CT_CHECK(norm_run(rms, dts[xi], dts[yi], dts[pi], R, C, off, 1, 3, &no[0]), "%s", capex_last_error());
                        for (run = 0; run < 6; run++) {
                            size_t xe = capex_dtype_size(dts[xi]), ye = capex_dtype_size(dts[yi]), pe = capex_dtype_size(dts[pi]);
                            th = run < 3 ? run + 1 : 2;
                            outs = run < 4 ? 3 : run - 4; /* run 4: no dweight/dbias, 5: dweight only */
                            force(run == 3, 1);
                            CT_CHECK(norm_run(rms, dts[xi], dts[yi], dts[pi], R, C, off, th, outs, &no[1]), "%s", capex_last_error());
                            CT_CHECK(same(no[0].y + off * ye, no[1].y + off * ye, (size_t)(R * C) * ye) &&
                                         same(no[0].mean, no[1].mean, (size_t)R * 4) && same(no[0].rstd, no[1].rstd, (size_t)R * 4),
                                     "%s fwd %lldx%lld x %s y %s off %d run %d", rms ? "rms" : "layer", (long long)R,
                                     (long long)C, capex_dtype_name(dts[xi]), capex_dtype_name(dts[yi]), off, run);
                            /* runs 4, 5 take the other backward loop: NaN payloads may differ */
                            CT_CHECK(run < 4 ? same(no[0].dx, no[1].dx, (size_t)(R * C + 16) * xe)
                                             : same_or_nan(no[0].dx, no[1].dx, R * C + 16, dts[xi]),
                                     "%s dx %lldx%lld x %s y %s p %s off %d run %d", rms ? "rms" : "layer", (long long)R,
                                     (long long)C, capex_dtype_name(dts[xi]), capex_dtype_name(dts[yi]),
                                     capex_dtype_name(dts[pi]), off, run);
                            CT_CHECK(!(outs & 1) || same(no[0].dw, no[1].dw, (size_t)C * pe), "%s dweight run %d",
                                     rms ? "rms" : "layer", run);
                            CT_CHECK(!(outs & 2) || rms || same(no[0].db, no[1].db, (size_t)C * pe), "dbias run %d", run);
                        }
                        if (R * C >= ((int64_t)8 << 20) / 4) { /* streamed dx against plain stores: two halves */
                            capex_norm_desc d;
                            capex_norm_args a;
                            int h;
                            capex_norm_desc_init(&d);
                            memset(no[1].dx, 0, (size_t)(R * C + 16) * 4);
                            for (h = 0; h < 2; h++) {
                                int64_t r0 = h * (R / 2), nr = h ? R - R / 2 : R / 2;
                                capex_norm_args_init(&a);
                                a.rows = nr; a.cols = C; a.x_dtype = a.y_dtype = a.param_dtype = CAPEX_F32;
                                a.x = (const float *)(void *)nxs + off + r0 * C;
                                a.dy = (const float *)(void *)ndys + off + r0 * C;
                                a.weight = nws; a.mean = no[0].mean + r0; a.rstd = no[0].rstd + r0;
                                a.dx = (float *)(void *)no[1].dx + off + r0 * C;
                                CT_CHECK(capex_layer_norm_backward(&d, &a) == CAPEX_OK, "%s", capex_last_error());
                            }
                            CT_CHECK(same_or_nan(no[0].dx, no[1].dx, R * C + 16, CAPEX_F32), "streamed dx");
                        }
                    }
    force(0, 1);
}

static int bn_run(capex_bn_layout lay, capex_dtype xt, int64_t N, int64_t C, int64_t S, int off, int th, nout *r) {
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    size_t xe = capex_dtype_size(xt);
    int64_t nbt = 0, i;
    for (i = 0; i < C; i++) { r->rm[i] = 0.0f; r->rv[i] = 1.0f; }
    memset(r->dx, 0, (size_t)(N * C * S + 16) * 4);
    capex_batch_norm_desc_init(&d);
    d.num_threads = th;
    d.training = 1;
    capex_batch_norm_args_init(&a);
    a.n = N; a.c = C; a.s = S; a.layout = lay; a.x_dtype = a.y_dtype = xt; a.param_dtype = CAPEX_F32;
    a.x = nxs + off * xe; a.dy = ndys + off * xe; a.y = r->y + off * xe; a.dx = r->dx + off * xe;
    a.weight = nw; a.bias = nb; a.running_mean = r->rm; a.running_var = r->rv; a.num_batches_tracked = &nbt;
    a.save_mean = r->mean; a.save_invstd = r->rstd; a.dweight = r->dw; a.dbias = r->db;
    if (capex_batch_norm_forward(&d, NULL, &a) != CAPEX_OK) return 0;
    return capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK;
}
CT_TEST(batch_norm) {
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t shapes[][3] = {{2, 1, 1}, {2, 3, 7}, {3, 5, 17}, {2, 17, 3}, {4, 33, 9}, {8, 64, 65}, {3, 7, 1025},
                                        {64, 300, 3}};
    int si, xi, lay, run;
    rng = 4;
    for (si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++)
        for (xi = 0; xi < 3; xi++)
            for (lay = 0; lay < 2; lay++) {
                int64_t N = shapes[si][0], C = shapes[si][1], S = shapes[si][2], tot = N * C * S;
                size_t xe = capex_dtype_size(dts[xi]);
                int off = (int)(rnd32() % 16);
                as_dtype(nx, nxs, dts[xi], tot + 16);
                as_dtype(ndy, ndys, dts[xi], tot + 16);
                force(1, 1);
                CT_CHECK(bn_run(lay ? CAPEX_BN_NSC : CAPEX_BN_NCS, dts[xi], N, C, S, off, 1, &no[0]), "%s", capex_last_error());
                for (run = 0; run < 4; run++) {
                    force(run == 3, 1);
                    CT_CHECK(bn_run(lay ? CAPEX_BN_NSC : CAPEX_BN_NCS, dts[xi], N, C, S, off, run < 3 ? run + 1 : 2, &no[1]),
                             "%s", capex_last_error());
                    CT_CHECK(same(no[0].y + off * xe, no[1].y + off * xe, (size_t)tot * xe) &&
                                 same(no[0].dx, no[1].dx, (size_t)(tot + 16) * xe) && same(no[0].mean, no[1].mean, (size_t)C * 4) &&
                                 same(no[0].rstd, no[1].rstd, (size_t)C * 4) && same(no[0].dw, no[1].dw, (size_t)C * 4) &&
                                 same(no[0].db, no[1].db, (size_t)C * 4) && same(no[0].rm, no[1].rm, (size_t)C * 4) &&
                                 same(no[0].rv, no[1].rv, (size_t)C * 4),
                             "bn %lldx%lldx%lld %s %s off %d run %d", (long long)N, (long long)C, (long long)S,
                             lay ? "NSC" : "NCS", capex_dtype_name(dts[xi]), off, run);
                }
            }
    force(0, 1);
}

/* scale (unscale) and axpby, every dtype combination, in place too: the same
   bits and found_inf with the portable path forced and for threads 1/2/3. */
CT_TEST(scale_axpby) {
    enum { SN = 5, SCAP = 40000 };
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static unsigned char src[2][SCAP * 4], dst[2][SCAP * 4];
    static float vals[SCAP];
    int xi, oi, k, run, i;
    rng = 5;
    for (i = 0; i < SCAP; i++) vals[i] = (rnd32() % 32) ? urand() * 300.0f : spicy();
    for (xi = 0; xi < 3; xi++)
        for (oi = 0; oi < 3; oi++)
            for (k = 0; k < 6; k++) { /* k: 0-1 scale, 2-3 axpby, 4 scale in place, 5 axpby in place */
                size_t xe = capex_dtype_size(dts[xi]), oe = capex_dtype_size(dts[oi]);
                capex_tensor xt[SN], ot[SN];
                int64_t at = 0, lens[SN];
                int inf[2] = {0, 0};
                if (k >= 4 && xi != oi) continue;
                for (i = 0; i < SN; i++) {
                    lens[i] = k % 2 ? (int64_t)(rnd32() % 301) : (int64_t)(rnd32() % 7000);
                    at += rnd32() % 16;
                    xt[i].numel = ot[i].numel = lens[i];
                    xt[i].data = (void *)(size_t)at; /* offsets for now */
                    at += lens[i];
                }
                for (run = 0; run < 5; run++) {
                    int r = run == 0 ? 0 : 1, th = run == 0 ? 1 : run < 4 ? run : 2, f = 0;
                    capex_tensor xr[SN], orr[SN];
                    capex_tensor_list xl, ol;
                    capex_tensor_op_desc d;
                    as_dtype(vals, src[r], dts[xi], at);
                    memset(dst[r], 0x5a, sizeof dst[r]);
                    if (k >= 4) as_dtype(vals, dst[r], dts[oi], at);
                    for (i = 0; i < SN; i++) {
                        size_t o = (size_t)xt[i].data;
                        xr[i].numel = orr[i].numel = lens[i];
                        xr[i].data = src[r] + o * xe;
                        orr[i].data = dst[r] + o * oe;
                        if (k >= 4) xr[i].data = orr[i].data;
                    }
                    xl = capex_tensor_list_make(dts[xi], xr, SN);
                    ol = capex_tensor_list_make(dts[oi], orr, SN);
                    capex_tensor_op_desc_init(&d);
                    d.num_threads = th; d.parallel_min_elements = 1; d.chunk_size = k % 2 ? 37 : 1000;
                    force(run == 4, 1);
                    if (k == 0 || k == 1 || k == 4)
                        CT_CHECK(capex_multi_tensor_scale(&d, &xl, &ol, 1.0f / 1024, &f) == CAPEX_OK, "%s", capex_last_error());
                    else
                        CT_CHECK(capex_multi_tensor_axpby(&d, 0.5f, &xl, -3.0f, k == 5 ? &ol : &xl, &ol, -1, &f) == CAPEX_OK,
                                 "%s", capex_last_error());
                    inf[r] = f;
                    if (run)
                        CT_CHECK(same(dst[0], dst[1], (size_t)at * oe) && inf[0] == inf[1],
                                 "op %d %s -> %s run %d threads %d: found_inf %d vs %d", k, capex_dtype_name(dts[xi]),
                                 capex_dtype_name(dts[oi]), run, th, inf[0], inf[1]);
                }
            }
    force(0, 1);
}

static const ct_case cases[] = {CT_CASE(conversions), CT_CASE(norms), CT_CASE(optimizers), CT_CASE(layer_rms_norm),
                                CT_CASE(batch_norm), CT_CASE(scale_axpby)};
CT_MAIN(cases)
