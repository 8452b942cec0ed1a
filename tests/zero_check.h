/* zero_check.h - the sharded optimizer (capex_zero) checked against DDP +
   capex_optim, the unsharded path it replaces, on any comm: single and TCP
   worlds (tests/test_zero.c), MPI (tests/mpi/test_dist_mpi.c). Both run in
   the same process on the same comm, from the same parameters and the same
   per-rank gradients, and must end bit for bit equal: with "exact"
   gradients (multiples of 1/16 below 1 in magnitude, so every sum in any
   order and the sums of squares are exact) on any world, and with random f32
   gradients on worlds of 1 or 2 (a sum of two is the same either way); LAMB,
   whose |p| and |u| sums run in another order, within an ulp or so.
   Mixed f32/f16/bf16 params (fp32 master shards for the halves), two groups
   with their own lr/weight decay, small buckets so tensors straddle shards,
   clipping by the global norm, a step skipped for an inf, and gradient
   accumulation. Include after capex.h. */
#ifndef ZERO_CHECK_H
#define ZERO_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zero_case {
    int stage;              /* 1 or 2 */
    capex_optim_kind kind;  /* ADAM (AdamW), SGD (momentum, nesterov), ADAGRAD */
    int halves;             /* 1: f16 and bf16 params beside f32 ones */
    int exact;              /* 1: exact gradients; 0: random f32 (worlds <= 2) */
    int micro;              /* micro-batches per step (1, 2) */
    int clip;               /* 1: clip by the global norm */
    int inf_step;           /* a step where the last rank's gradient holds an inf; -1: none */
    int sr;                 /* 1: bf16 model copies with stochastic rounding */
    int steps;
    const char *load;       /* a checkpoint both paths load first (NULL: none) */
    const char *save;       /* where both save at the end (rank 0 writes; the DDP
                               path's file, save + ".ref", must be byte-identical) */
} zero_case;

#define ZC_NP 9
static const size_t zc_numel[ZC_NP] = {37, 64, 5, 130, 1, 0, 77, 16, 300};

static capex_dtype zc_dtype(const zero_case *zc, int i) {
    if (!zc->halves) return CAPEX_F32;
    return i % 3 == 0 ? CAPEX_F32 : i % 3 == 1 ? CAPEX_BF16 : CAPEX_F16;
}

static uint64_t zc_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* Rank q's gradient element: k/16, |k| <= 15 (exact) or uniform in [-1, 1). */
static float zc_grad(const zero_case *zc, int q, int step, int micro, int p, size_t e) {
    uint64_t u = zc_mix(((uint64_t)q << 48) ^ ((uint64_t)step << 36) ^ ((uint64_t)micro << 32) ^ ((uint64_t)p << 24) ^ e);
    if (zc->exact) return (float)((int)(u % 31) - 15) / 16.0f;
    return (float)((double)(u >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static void zc_put(void *buf, capex_dtype t, size_t e, float v, int add) {
    if (t == CAPEX_F32) { float *f = (float *)buf; f[e] = add ? f[e] + v : v; return; }
    {
        uint16_t *h = (uint16_t *)buf;
        float o = add ? (t == CAPEX_F16 ? capex_f16_to_f32(h[e]) : capex_bf16_to_f32(h[e])) : 0.0f;
        h[e] = t == CAPEX_F16 ? capex_f32_to_f16(o + v) : capex_f32_to_bf16(o + v);
    }
}

/* Builds both paths, trains, compares; 0 or the failing line (why filled). */
static int zero_equiv(capex_comm *c, const zero_case *zc, char *why, size_t why_n) {
    void *pz[ZC_NP], *pd[ZC_NP];
    float *master[ZC_NP];
    capex_zero_param zp[ZC_NP];
    capex_ddp_param dp[ZC_NP];
    capex_optim_param op[ZC_NP];
    capex_optim_hparams hp[2];
    capex_optim_desc od;
    capex_zero_desc zd;
    capex_ddp_desc dd;
    capex_zero *z = NULL;
    capex_ddp *ddp = NULL;
    capex_optim *ref = NULL;
    capex_zero_memory mem;
    int i, s, m, fail = 0, W = c->world_size, me = c->rank, g;
    size_t e;
#define ZC_FAIL(...) do { snprintf(why, why_n, __VA_ARGS__); fail = __LINE__; goto out; } while (0)
    memset(pz, 0, sizeof pz); memset(pd, 0, sizeof pd); memset(master, 0, sizeof master);
    capex_optim_desc_init(&od, zc->kind);
    od.stochastic_rounding = zc->sr;
    od.seed = 0x5eed0123456789abull;
    hp[0] = hp[1] = od.defaults;
    if (zc->kind == CAPEX_OPTIM_ADAM) { hp[0].lr = 1e-2f; hp[0].weight_decay = 0.1f; hp[1].lr = 3e-3f; }
    if (zc->kind == CAPEX_OPTIM_SGD) { hp[0].lr = 0.05f; hp[0].momentum = 0.9f; hp[0].nesterov = 1; hp[1].lr = 0.02f; hp[1].momentum = 0.5f; hp[1].weight_decay = 0.01f; }
    if (zc->kind == CAPEX_OPTIM_ADAGRAD) { hp[0].lr = 0.05f; hp[1].lr = 0.01f; hp[1].weight_decay = 0.05f; }
    if (zc->kind == CAPEX_OPTIM_LAMB) { hp[0].lr = 1e-2f; hp[1].lr = 5e-3f; hp[1].weight_decay = 0.0f; od.max_grad_norm = 2.0f; }
    if (zc->kind == CAPEX_OPTIM_NOVOGRAD) { hp[0].lr = 1e-2f; hp[0].weight_decay = 0.01f; hp[1].lr = 5e-3f; }
    for (i = 0; i < ZC_NP; i++) {
        capex_dtype t = zc_dtype(zc, i);
        size_t es = capex_dtype_size(t), n = zc_numel[i];
        pz[i] = malloc(n * es + 16); pd[i] = malloc(n * es + 16);
        master[i] = (float *)malloc(n * 4 + 16);
        if (!pz[i] || !pd[i] || !master[i]) ZC_FAIL("out of memory");
        for (e = 0; e < n; e++) { /* rank-dependent: the broadcast must fix it */
            float v = (float)((double)(zc_mix(((uint64_t)i << 32) ^ e ^ ((uint64_t)me << 56)) >> 11) * (1.0 / 9007199254740992.0) - 0.5);
            zc_put(pz[i], t, e, v, 0);
            zc_put(pd[i], t, e, v, 0);
        }
        zp[i].data = pz[i]; zp[i].numel = n; zp[i].dtype = t; zp[i].group = (size_t)(i % 2);
        dp[i].data = pd[i]; dp[i].numel = n; dp[i].dtype = t; dp[i].grad = NULL;
    }
    capex_zero_desc_init(&zd);
    zd.stage = zc->stage;
    zd.bucket_bytes = 400; /* several buckets per dtype; tensors straddle shards */
    if (capex_zero_create(&z, c, zp, ZC_NP, &od, hp, 2, &zd) != CAPEX_OK) ZC_FAIL("zero_create: %.300s", capex_last_error());
    capex_ddp_desc_init(&dd);
    if (capex_ddp_create(&ddp, c, dp, ZC_NP, &dd) != CAPEX_OK) ZC_FAIL("ddp_create: %.300s", capex_last_error());
    for (i = 0; i < ZC_NP; i++)
        if (memcmp(pz[i], pd[i], zc_numel[i] * capex_dtype_size(zc_dtype(zc, i))) != 0) ZC_FAIL("param %d differs after create", i);
    if (capex_optim_create(&od, &ref) != CAPEX_OK) ZC_FAIL("optim_create: %.300s", capex_last_error());
    for (g = 0; g < 2; g++) {
        int n = 0;
        for (i = 0; i < ZC_NP; i++) {
            capex_dtype t = zc_dtype(zc, i);
            if (i % 2 != g) continue;
            capex_optim_param_init(&op[n]);
            op[n].numel = (int64_t)zc_numel[i];
            op[n].grad = capex_ddp_grad(ddp, (size_t)i);
            op[n].grad_dtype = t;
            if (t == CAPEX_F32) op[n].param = (float *)pd[i];
            else {
                for (e = 0; e < zc_numel[i]; e++)
                    master[i][e] = t == CAPEX_F16 ? capex_f16_to_f32(((uint16_t *)pd[i])[e]) : capex_bf16_to_f32(((uint16_t *)pd[i])[e]);
                op[n].param = master[i]; op[n].model = pd[i]; op[n].model_dtype = t;
            }
            n++;
        }
        if (capex_optim_add_group(ref, &hp[g], op, (size_t)n, NULL) != CAPEX_OK) ZC_FAIL("add_group: %.300s", capex_last_error());
    }
    if (zc->load) {
        if (capex_zero_load_file(z, zc->load, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK) ZC_FAIL("zero load: %.300s", capex_last_error());
        if (capex_optim_load_file(ref, zc->load, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK) ZC_FAIL("ref load: %.300s", capex_last_error());
        for (i = 0; i < ZC_NP; i++)
            if (memcmp(pz[i], pd[i], zc_numel[i] * capex_dtype_size(zc_dtype(zc, i))) != 0) ZC_FAIL("param %d differs after load", i);
    }
    for (s = 0; s < zc->steps; s++) {
        int zinf = 0, dinf, do_step;
        float znorm = 0.0f, dnorm, inv = 0.5f, clip_z = 1.0f, clip_d = 1.0f, max_norm;
        double sum = 0.0;
        for (m = 0; m < zc->micro; m++) {
            int last = m == zc->micro - 1;
            if (capex_ddp_set_sync(ddp, last) != CAPEX_OK) ZC_FAIL("ddp set_sync: %.300s", capex_last_error());
            if (zc->stage == 1 && capex_zero_set_sync(z, last) != CAPEX_OK) ZC_FAIL("zero set_sync: %.300s", capex_last_error());
            for (i = ZC_NP; i-- > 0;) {
                capex_dtype t = zc_dtype(zc, i);
                void *gz = capex_zero_grad(z, (size_t)i), *gd = capex_ddp_grad(ddp, (size_t)i);
                if (!gz || !gd) ZC_FAIL("grad view of %d: %.300s", i, capex_last_error());
                for (e = 0; e < zc_numel[i]; e++) {
                    float v = 2.0f * zc_grad(zc, me, s, m, i, e); /* "scaled" by 2: inv_scale 0.5 */
                    if (s == zc->inf_step && me == W - 1 && i == 3 && e == 7) v = INFINITY;
                    zc_put(gz, t, e, v, 1);
                    zc_put(gd, t, e, v, 1);
                }
                if (capex_zero_grad_ready(z, (size_t)i) != CAPEX_OK) ZC_FAIL("zero grad_ready %d: %.300s", i, capex_last_error());
                if (capex_ddp_grad_ready(ddp, (size_t)i) != CAPEX_OK) ZC_FAIL("ddp grad_ready %d: %.300s", i, capex_last_error());
            }
            if (capex_zero_finalize(z) != CAPEX_OK) ZC_FAIL("zero finalize: %.300s", capex_last_error());
            if (capex_ddp_finalize(ddp) != CAPEX_OK) ZC_FAIL("ddp finalize: %.300s", capex_last_error());
        }
        if (capex_zero_grad_norm(z, &zinf, &znorm) != CAPEX_OK) ZC_FAIL("grad_norm: %.300s", capex_last_error());
        for (i = 0; i < ZC_NP; i++) {
            capex_tensor t;
            capex_tensor_list l;
            double q = 0.0;
            t.data = capex_ddp_grad(ddp, (size_t)i); t.numel = (int64_t)zc_numel[i];
            l = capex_tensor_list_make(zc_dtype(zc, i), &t, 1);
            if (capex_multi_tensor_sumsq(NULL, &l, &q, NULL) != CAPEX_OK) ZC_FAIL("sumsq: %.300s", capex_last_error());
            sum += q;
        }
        dinf = !(sum - sum == 0.0);
        dnorm = (float)sqrt(sum);
        if (zinf != dinf || zinf != (s == zc->inf_step)) ZC_FAIL("step %d: found_inf %d (DDP path %d)", s, zinf, dinf);
        if (!zinf && (zc->exact || W == 1) && znorm != dnorm) ZC_FAIL("step %d: norm %.9g, DDP path %.9g", s, (double)znorm, (double)dnorm);
        if (!zinf && !(fabs((double)znorm - dnorm) <= 1e-6 * dnorm)) ZC_FAIL("step %d: norm %.9g, DDP path %.9g", s, (double)znorm, (double)dnorm);
        max_norm = zc->clip && zc->kind != CAPEX_OPTIM_LAMB ? 0.5f * dnorm * inv : INFINITY; /* LAMB clips itself */
        if (!zinf) { clip_z = capex_clip_coef(znorm * inv, max_norm); clip_d = capex_clip_coef(dnorm * inv, max_norm); }
        do_step = !zinf;
        if (zc->stage == 1) {
            if (capex_zero_step(z, inv, clip_z, !do_step) != CAPEX_OK) ZC_FAIL("zero step: %.300s", capex_last_error());
        } else { /* the two halves, waiting param by param in forward order as an engine would */
            float before = ((float *)pz[0])[0];
            if (capex_zero_step_async(z, inv, clip_z, !do_step) != CAPEX_OK) ZC_FAIL("step_async: %.300s", capex_last_error());
            if (memcmp(&before, pz[0], 4) != 0) ZC_FAIL("step %d: param 0 changed before its wait", s);
            for (i = 0; i < ZC_NP; i++)
                if (capex_zero_wait_param(z, (size_t)i) != CAPEX_OK) ZC_FAIL("wait_param %d: %.300s", i, capex_last_error());
        }
        if (capex_optim_step(ref, inv, clip_d, !do_step) != CAPEX_OK) ZC_FAIL("ref step: %.300s", capex_last_error());
        if (capex_zero_zero_grad(z) != CAPEX_OK || capex_ddp_zero_grad(ddp) != CAPEX_OK) ZC_FAIL("zero_grad: %.300s", capex_last_error());
        for (i = 0; i < ZC_NP; i++) {
            size_t es = capex_dtype_size(zc_dtype(zc, i));
            for (e = 0; e < zc_numel[i]; e++)
                if (zc->kind == CAPEX_OPTIM_LAMB || zc->kind == CAPEX_OPTIM_NOVOGRAD) { /* per-tensor sums in another order */
                    capex_dtype t = zc_dtype(zc, i);
                    double a = t == CAPEX_F32 ? ((float *)pz[i])[e] : t == CAPEX_F16 ? capex_f16_to_f32(((uint16_t *)pz[i])[e]) : capex_bf16_to_f32(((uint16_t *)pz[i])[e]);
                    double b = t == CAPEX_F32 ? ((float *)pd[i])[e] : t == CAPEX_F16 ? capex_f16_to_f32(((uint16_t *)pd[i])[e]) : capex_bf16_to_f32(((uint16_t *)pd[i])[e]);
                    double tol = (t == CAPEX_F32 ? 1e-5 : t == CAPEX_F16 ? 1.0 / 1024 : 1.0 / 128) * fabs(b) + 1e-6;
                    if (!(fabs(a - b) <= tol))
                        ZC_FAIL("LAMB step %d rank %d: param %d element %zu: %.9g vs DDP %.9g (tol %.3g)", s, me, i, e, a, b, tol);
                } else if (memcmp((char *)pz[i] + e * es, (char *)pd[i] + e * es, es) != 0) {
                    double a = zc_dtype(zc, i) == CAPEX_F32 ? ((float *)pz[i])[e] : 0, b = zc_dtype(zc, i) == CAPEX_F32 ? ((float *)pd[i])[e] : 0;
                    ZC_FAIL("step %d rank %d: param %d element %zu differs (f32: %.9g vs DDP %.9g; stage %d kind %d)", s, me, i, e,
                            a, b, zc->stage, (int)zc->kind);
                }
        }
    }
    if (zc->save) { /* the consolidated file is the unsharded optimizer's, byte for byte */
        char refpath[600];
        snprintf(refpath, sizeof refpath, "%.500s.ref", zc->save);
        if (capex_zero_save_file(z, zc->save, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK) ZC_FAIL("zero save: %.300s", capex_last_error());
        if (me == 0) {
            FILE *fa, *fb;
            int ca = 0, cb = 0;
            long at = 0;
            if (capex_optim_save_file(ref, refpath, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK) ZC_FAIL("ref save: %.300s", capex_last_error());
            fa = fopen(zc->save, "rb"); fb = fopen(refpath, "rb");
            if (!fa || !fb) { if (fa) fclose(fa); if (fb) fclose(fb); ZC_FAIL("cannot reopen %.150s / %.150s", zc->save, refpath); }
            while (ca != EOF && ca == cb) { ca = fgetc(fa); cb = fgetc(fb); at++; }
            fclose(fa); fclose(fb);
            remove(refpath);
            if (ca != cb) ZC_FAIL("the zero checkpoint differs from the unsharded optimizer's at byte %ld", at - 1);
        }
    }
    {   /* steps counted alike; memory: the shards partition the state */
        int64_t zs = -1, ds = -2;
        double tot[3];
        size_t floats = zc->kind == CAPEX_OPTIM_ADAM ? 2 : zc->kind == CAPEX_OPTIM_LAMB ? 3 : 1, real = 0, half = 0;
        if (zc->kind == CAPEX_OPTIM_NOVOGRAD) floats = 1; /* m; v is one float per tensor */
        capex_optim_get_step(capex_zero_optim(z), 0, &zs);
        capex_optim_get_step(ref, 0, &ds);
        if (zs != ds) ZC_FAIL("step counts %lld vs %lld", (long long)zs, (long long)ds);
        mem = capex_zero_memory_info(z);
        for (i = 0; i < ZC_NP; i++) { real += zc_numel[i]; if (zc_dtype(zc, i) != CAPEX_F32) half += zc_numel[i]; }
        if (mem.unsharded_state_bytes != (floats * real + half) * 4)
            ZC_FAIL("unsharded_state_bytes %zu, want %zu", mem.unsharded_state_bytes, (floats * real + half) * 4);
        if (mem.optimizer_state_bytes != mem.master_bytes + mem.moment_bytes) ZC_FAIL("optimizer_state_bytes is not the sum");
        tot[0] = (double)mem.moment_bytes; tot[1] = (double)(mem.shard_elements - mem.padding_elements);
        tot[2] = (double)mem.optimizer_state_bytes;
        if (capex_comm_allreduce(c, tot, tot, 3, CAPEX_F64, CAPEX_REDUCE_SUM) != CAPEX_OK) ZC_FAIL("allreduce: %.300s", capex_last_error());
        if (tot[0] != (double)(floats * real * 4) || tot[1] != (double)real)
            ZC_FAIL("moments over ranks %.0f bytes for %.0f elements, want %zu for %zu", tot[0], tot[1], floats * real * 4, real);
        /* this rank: the world's share plus padding: a shard of a bucket of N
           elements is ceil(N/W) rounded up to 16 bytes (<= N/W + 8), and the
           buckets hold the params with at most 7 alignment elements each */
        if ((double)mem.shard_elements > (double)(real + 7 * ZC_NP) / W + 8.0 * (double)mem.buckets)
            ZC_FAIL("rank %d owns %zu elements in %zu buckets: more than (%zu + 7*%d)/%d + 8 per bucket", me,
                    mem.shard_elements, mem.buckets, real, ZC_NP, W);
        if (mem.moment_bytes > floats * 4 * (mem.shard_elements - mem.padding_elements) ||
            mem.master_bytes > 4 * mem.shard_elements)
            ZC_FAIL("rank %d: moments %zu, masters %zu bytes for %zu elements", me, mem.moment_bytes, mem.master_bytes,
                    mem.shard_elements);
    }
out:
    capex_zero_destroy(z);
    capex_ddp_destroy(ddp);
    capex_optim_destroy(ref);
    for (i = 0; i < ZC_NP; i++) { free(pz[i]); free(pd[i]); free(master[i]); }
    return fail;
#undef ZC_FAIL
}

/* A checkpoint round: load `load` (if given) into both paths, train 3 steps,
   save to `save` (if given); any kind, mixed dtypes, exact gradients. */
static int zero_check_ckpt(capex_comm *c, int stage, capex_optim_kind kind, const char *load, const char *save, char *why,
                           size_t why_n) {
    zero_case zc;
    memset(&zc, 0, sizeof zc);
    zc.stage = stage; zc.kind = kind; zc.halves = 1; zc.exact = 1; zc.clip = 1; zc.inf_step = -1; zc.steps = 3; zc.micro = 1;
    zc.load = load; zc.save = save;
    return zero_equiv(c, &zc, why, why_n);
}

/* The set of cases every comm runs; 0 or the failing line, why filled. */
static int zero_check_all(capex_comm *c, char *why, size_t why_n) {
    static const capex_optim_kind kinds[5] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_SGD, CAPEX_OPTIM_ADAGRAD, CAPEX_OPTIM_LAMB,
                                              CAPEX_OPTIM_NOVOGRAD};
    int stage, k, line;
    for (stage = 1; stage <= 2; stage++)
        for (k = 0; k < 5; k++) {
            zero_case zc;
            memset(&zc, 0, sizeof zc);
            zc.stage = stage; zc.kind = kinds[k]; zc.halves = 1; zc.exact = 1; zc.clip = 1; zc.inf_step = 2; zc.steps = 5;
            /* stage 2 averages each micro-batch before adding: exact only when 1/W is a power of two */
            zc.micro = (stage == 1 || (c->world_size & (c->world_size - 1)) == 0) ? 2 : 1;
            if ((line = zero_equiv(c, &zc, why, why_n)) != 0) return line;
            if (k == 0) { /* AdamW with stochastic rounding: keyed by the unsharded tensor and element */
                zc.sr = 1;
                if ((line = zero_equiv(c, &zc, why, why_n)) != 0) return line;
                zc.sr = 0;
            }
            if (c->world_size <= 2) { /* random f32 gradients: a sum of two is order-free */
                zc.halves = 0; zc.exact = 0; zc.clip = 0; zc.micro = 1;
                if ((line = zero_equiv(c, &zc, why, why_n)) != 0) return line;
            }
        }
    return 0;
}
#endif
