/* amp_loop.h - a whole mixed-precision training loop over several ranks:
   dynamic loss scaler (hysteresis 2, short growth interval, max clamp),
   clipping by the global norm, AdamW with fp32 masters for f16/bf16 params,
   a warmup + cosine lr schedule, DDP + capex_optim or ZeRO stage 1/2, and
   checkpoints of the whole set (optimizer with params, scaler). Gradients
   are rank-dependent multiples of scale/16, with a NaN on one rank at one
   step, an inf on every rank at two steps and +inf/-inf on two ranks at
   another. Include after capex.h. */
#ifndef AMP_LOOP_H
#define AMP_LOOP_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AL_NP 3
#define AL_STEPS 14
static const size_t al_numel[AL_NP] = {37, 50, 21};
static const capex_dtype al_dtype[AL_NP] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};

typedef struct al_out {
    float w[AL_NP][64];           /* final weights (f32 values of the params) */
    float scale[AL_STEPS];        /* scale after each step's update */
    float clip[AL_STEPS];
    int do_step[AL_STEPS];
    capex_scaler_state st;
    int64_t opt_step;
    float next_lr;
} al_out;

static uint64_t al_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float al_get(const void *buf, capex_dtype t, size_t e) {
    if (t == CAPEX_F32) return ((const float *)buf)[e];
    return t == CAPEX_F16 ? capex_f16_to_f32(((const uint16_t *)buf)[e]) : capex_bf16_to_f32(((const uint16_t *)buf)[e]);
}
static void al_put(void *buf, capex_dtype t, size_t e, float v) {
    if (t == CAPEX_F32) ((float *)buf)[e] = v;
    else ((uint16_t *)buf)[e] = t == CAPEX_F16 ? capex_f32_to_f16(v) : capex_f32_to_bf16(v);
}
/* Rank q's scaled gradient at step s; the injected non-finite values. */
static float al_grad(int q, int W, int s, int p, size_t e, float scale) {
    float v = (float)((int)(al_mix(((uint64_t)q << 40) ^ ((uint64_t)s << 24) ^ ((uint64_t)p << 16) ^ e) % 31) - 15) / 16.0f * scale;
    if (s == 3 && q == 1 % W && p == 1 && e == 5) v = NAN;          /* one rank */
    if ((s == 6 || s == 7) && p == 0 && e == 0) v = INFINITY;      /* every rank */
    if (s == 10 && p == 2 && e == 3 && W > 1) v = q == 0 ? INFINITY : q == W - 1 ? -INFINITY : v;
    return v;
}

/* mode 0: DDP + capex_optim; 1, 2: ZeRO stage 1, 2. Trains steps [from, to),
   loading `load` first and saving `save` at the end when given. 0 or the
   failing line (why filled). */
static int al_run(capex_comm *c, int mode, int from, int to, const char *load, const char *save, al_out *out, char *why,
                  size_t why_n) {
    void *pd[AL_NP];
    float *master[AL_NP];
    capex_ddp_param dp[AL_NP];
    capex_zero_param zp[AL_NP];
    capex_optim_param op[AL_NP];
    capex_optim_desc od;
    capex_lr_schedule ls;
    capex_scaler_desc sd;
    capex_scaler sc;
    capex_ddp_desc dd;
    capex_zero_desc zd;
    capex_ddp *ddp = NULL;
    capex_zero *z = NULL;
    capex_optim *opt = NULL, *lo;
    int i, s, fail = 0, W = c->world_size, me = c->rank;
    size_t e;
#define AL_FAIL(...) do { snprintf(why, why_n, __VA_ARGS__); fail = __LINE__; goto done; } while (0)
    memset(pd, 0, sizeof pd); memset(master, 0, sizeof master);
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.defaults.lr = 1e-2f; od.defaults.weight_decay = 0.1f;
    capex_lr_schedule_init(&ls, CAPEX_LR_COSINE);
    ls.warmup_steps = 2; ls.total_steps = AL_STEPS; ls.min_factor = 0.1;
    capex_scaler_desc_init(&sd);
    sd.init_scale = 64.0f; sd.growth_interval = 3; sd.hysteresis = 2; sd.max_scale = 256.0f; sd.log_interval = 0;
    if (capex_scaler_init(&sc, &sd) != CAPEX_OK) AL_FAIL("scaler_init: %.300s", capex_last_error());
    for (i = 0; i < AL_NP; i++) {
        size_t n = al_numel[i];
        pd[i] = malloc(n * 4 + 16); master[i] = (float *)malloc(n * 4 + 16);
        if (!pd[i] || !master[i]) AL_FAIL("oom");
        for (e = 0; e < n; e++) al_put(pd[i], al_dtype[i], e, (float)((int)(al_mix(((uint64_t)i << 32) ^ e ^ ((uint64_t)me << 50)) % 200) - 100) / 128.0f);
        dp[i].data = pd[i]; dp[i].numel = n; dp[i].dtype = al_dtype[i]; dp[i].grad = NULL;
        zp[i].data = pd[i]; zp[i].numel = n; zp[i].dtype = al_dtype[i]; zp[i].group = 0;
    }
    if (mode == 0) {
        capex_ddp_desc_init(&dd);
        if (capex_ddp_create(&ddp, c, dp, AL_NP, &dd) != CAPEX_OK) AL_FAIL("ddp_create: %.300s", capex_last_error());
        if (capex_optim_create(&od, &opt) != CAPEX_OK) AL_FAIL("optim_create: %.300s", capex_last_error());
        for (i = 0; i < AL_NP; i++) {
            capex_optim_param_init(&op[i]);
            op[i].numel = (int64_t)al_numel[i];
            op[i].grad = capex_ddp_grad(ddp, (size_t)i); op[i].grad_dtype = al_dtype[i];
            if (al_dtype[i] == CAPEX_F32) op[i].param = (float *)pd[i];
            else {
                for (e = 0; e < al_numel[i]; e++) master[i][e] = al_get(pd[i], al_dtype[i], e);
                op[i].param = master[i]; op[i].model = pd[i]; op[i].model_dtype = al_dtype[i];
            }
        }
        if (capex_optim_add_group(opt, NULL, op, AL_NP, NULL) != CAPEX_OK) AL_FAIL("add_group: %.300s", capex_last_error());
        lo = opt;
    } else {
        capex_zero_desc_init(&zd);
        zd.stage = mode; zd.bucket_bytes = 64;
        if (capex_zero_create(&z, c, zp, AL_NP, &od, NULL, 1, &zd) != CAPEX_OK) AL_FAIL("zero_create: %.300s", capex_last_error());
        lo = capex_zero_optim(z);
    }
    if (capex_optim_set_lr_schedule(lo, &ls) != CAPEX_OK) AL_FAIL("set_lr_schedule: %.300s", capex_last_error());
    if (load) {
        capex_state_reader *rd = NULL;
        capex_result r = capex_state_reader_open_file(load, 0, NULL, &rd);
        if (r == CAPEX_OK) r = z ? capex_zero_load(z, rd, "optim", CAPEX_OPTIM_STATE_PARAMS) : capex_optim_load(opt, rd, "optim", CAPEX_OPTIM_STATE_PARAMS);
        if (r == CAPEX_OK) r = capex_scaler_load(&sc, rd, "scaler.");
        capex_state_reader_close(rd);
        if (r != CAPEX_OK) AL_FAIL("load: %.300s", capex_last_error());
    }
    for (s = from; s < to; s++) {
        float scale = 0, inv = 0, norm = 0, clip = 1.0f, rec[3], all[3 * 8];
        int found_inf = 0, do_step = 0, q;
        if (capex_scaler_scale(&sc, &scale) != CAPEX_OK) AL_FAIL("scale: %.300s", capex_last_error());
        for (i = AL_NP; i-- > 0;) {
            void *g = z ? capex_zero_grad(z, (size_t)i) : capex_ddp_grad(ddp, (size_t)i);
            if (!g) AL_FAIL("grad %d: %.300s", i, capex_last_error());
            for (e = 0; e < al_numel[i]; e++) al_put(g, al_dtype[i], e, al_grad(me, W, s, i, e, scale));
            if ((z ? capex_zero_grad_ready(z, (size_t)i) : capex_ddp_grad_ready(ddp, (size_t)i)) != CAPEX_OK)
                AL_FAIL("grad_ready: %.300s", capex_last_error());
        }
        if (z) {
            if (capex_zero_finalize(z) != CAPEX_OK || capex_zero_grad_norm(z, &found_inf, &norm) != CAPEX_OK)
                AL_FAIL("zero finalize/norm: %.300s", capex_last_error());
        } else {
            double sum = 0.0;
            if (capex_ddp_finalize(ddp) != CAPEX_OK) AL_FAIL("ddp finalize: %.300s", capex_last_error());
            for (i = 0; i < AL_NP; i++) {
                capex_tensor t;
                capex_tensor_list l;
                double qq = 0.0;
                t.data = capex_ddp_grad(ddp, (size_t)i); t.numel = (int64_t)al_numel[i];
                l = capex_tensor_list_make(al_dtype[i], &t, 1);
                if (capex_multi_tensor_sumsq(NULL, &l, &qq, NULL) != CAPEX_OK) AL_FAIL("sumsq: %.300s", capex_last_error());
                sum += qq;
            }
            found_inf = !(sum - sum == 0.0);
            norm = (float)sqrt(sum);
        }
        if (capex_scaler_unscale(&sc, 0, found_inf, &inv) != CAPEX_OK) AL_FAIL("unscale: %.300s", capex_last_error());
        if (!found_inf) clip = capex_clip_coef(norm * inv, 0.3f);
        if (capex_scaler_step(&sc, 0, &do_step) != CAPEX_OK) AL_FAIL("scaler step: %.300s", capex_last_error());
        if (z) {
            if (capex_zero_step(z, inv, clip, !do_step) != CAPEX_OK || capex_zero_zero_grad(z) != CAPEX_OK)
                AL_FAIL("zero step: %.300s", capex_last_error());
        } else {
            if (capex_optim_step(opt, inv, clip, !do_step) != CAPEX_OK || capex_ddp_zero_grad(ddp) != CAPEX_OK)
                AL_FAIL("optim step: %.300s", capex_last_error());
        }
        if (capex_scaler_update(&sc) != CAPEX_OK) AL_FAIL("update: %.300s", capex_last_error());
        out->scale[s] = capex_scaler_get_scale(&sc); out->clip[s] = clip; out->do_step[s] = do_step;
        /* every rank decided the same */
        rec[0] = out->scale[s]; rec[1] = clip; rec[2] = (float)do_step;
        if (capex_comm_allgather(c, rec, all, 3, CAPEX_F32) != CAPEX_OK) AL_FAIL("allgather: %.300s", capex_last_error());
        for (q = 0; q < W; q++)
            if (memcmp(rec, all + 3 * q, sizeof rec) != 0)
                AL_FAIL("step %d: rank %d has scale/clip/do_step %g %g %g, rank %d %g %g %g", s, me, (double)rec[0], (double)rec[1],
                        (double)rec[2], q, (double)all[3 * q], (double)all[3 * q + 1], (double)all[3 * q + 2]);
    }
    for (i = 0; i < AL_NP; i++)
        for (e = 0; e < al_numel[i]; e++) out->w[i][e] = al_get(pd[i], al_dtype[i], e);
    {   /* weights equal on every rank */
        uint32_t crc = 0, crcs[8];
        int q;
        for (i = 0; i < AL_NP; i++) crc = capex_crc32(crc, out->w[i], al_numel[i] * 4);
        if (capex_comm_allgather(c, &crc, crcs, 1, CAPEX_F32) != CAPEX_OK) AL_FAIL("allgather crc: %.300s", capex_last_error());
        for (q = 0; q < W; q++) if (crcs[q] != crc) AL_FAIL("rank %d's weights differ from rank %d's", q, me);
    }
    if (capex_scaler_get_state(&sc, &out->st) != CAPEX_OK) AL_FAIL("get_state");
    if (capex_optim_get_step(lo, 0, &out->opt_step) != CAPEX_OK || capex_optim_get_lr(lo, 0, &out->next_lr) != CAPEX_OK)
        AL_FAIL("get_step/lr: %.300s", capex_last_error());
    if (save) {
        capex_state_writer *w = NULL;
        capex_result r = CAPEX_OK;
        if (me == 0) r = capex_state_writer_create(NULL, &w);
        if (r == CAPEX_OK) r = z ? capex_zero_save(z, w, "optim", CAPEX_OPTIM_STATE_PARAMS) : me == 0 ? capex_optim_save(opt, w, "optim", CAPEX_OPTIM_STATE_PARAMS) : CAPEX_OK;
        if (r == CAPEX_OK && me == 0) r = capex_scaler_save(&sc, w, "scaler.");
        if (r == CAPEX_OK && me == 0) r = capex_state_write_file(w, save);
        capex_state_writer_destroy(w);
        if (r != CAPEX_OK) AL_FAIL("save: %.300s", capex_last_error());
        if (capex_comm_barrier(c) != CAPEX_OK) AL_FAIL("barrier");
    }
done:
    capex_ddp_destroy(ddp);
    capex_zero_destroy(z);
    capex_optim_destroy(opt);
    for (i = 0; i < AL_NP; i++) { free(pd[i]); free(master[i]); }
    return fail;
#undef AL_FAIL
}

static int al_same(const al_out *a, const al_out *b, int from, const char *what, char *why, size_t why_n) {
    int i, s;
    size_t e;
    for (i = 0; i < AL_NP; i++)
        for (e = 0; e < al_numel[i]; e++)
            if (memcmp(&a->w[i][e], &b->w[i][e], 4) != 0) {
                snprintf(why, why_n, "%s: param %d element %zu: %.9g vs %.9g", what, i, e, (double)a->w[i][e], (double)b->w[i][e]);
                return 1;
            }
    for (s = from; s < AL_STEPS; s++)
        if (a->scale[s] != b->scale[s] || a->clip[s] != b->clip[s] || a->do_step[s] != b->do_step[s]) {
            snprintf(why, why_n, "%s: step %d: scale %g/%g clip %.9g/%.9g do_step %d/%d", what, s, (double)a->scale[s],
                     (double)b->scale[s], (double)a->clip[s], (double)b->clip[s], a->do_step[s], b->do_step[s]);
            return 1;
        }
    if (memcmp(&a->st, &b->st, sizeof a->st) != 0 || a->opt_step != b->opt_step || a->next_lr != b->next_lr) {
        snprintf(why, why_n, "%s: scaler/optimizer state differs (steps %lld/%lld, skipped %lld/%lld, growth %lld/%lld, hyst %d/%d, opt step %lld/%lld, lr %g/%g)",
                 what, (long long)a->st.steps, (long long)b->st.steps, (long long)a->st.skipped_steps, (long long)b->st.skipped_steps,
                 (long long)a->st.growth_tracker, (long long)b->st.growth_tracker, a->st.hysteresis_tracker, b->st.hysteresis_tracker,
                 (long long)a->opt_step, (long long)b->opt_step, (double)a->next_lr, (double)b->next_lr);
        return 1;
    }
    return 0;
}

/* A checkpoint written by another world size (a resharding for ZeRO):
   DDP, ZeRO 1 and ZeRO 2 resume it and must stay equal to each other. */
static int al_check_resume_from(capex_comm *c, const char *path, char *why, size_t why_n) {
    static al_out r[3];
    int mode, line;
    for (mode = 0; mode < 3; mode++) {
        memset(&r[mode], 0, sizeof r[mode]);
        if ((line = al_run(c, mode, 9, AL_STEPS, path, NULL, &r[mode], why, why_n)) != 0) return line;
        if (mode && al_same(&r[mode], &r[0], 9, mode == 1 ? "resharded: ZeRO 1 vs DDP" : "resharded: ZeRO 2 vs DDP", why, why_n))
            return __LINE__;
    }
    return 0;
}

/* The scenario set on one comm; ckpt is a path prefix (rank 0 writes); keep
   (or NULL) receives ZeRO 2's checkpoint after step 9. */
static int al_check_all(capex_comm *c, const char *ckpt, const char *keep, char *why, size_t why_n) {
    static al_out full[3], part, cross;
    char path[3][300];
    int mode, line, k, ki;
    for (mode = 0; mode < 3; mode++) {
        memset(&full[mode], 0, sizeof full[mode]);
        if ((line = al_run(c, mode, 0, AL_STEPS, NULL, NULL, &full[mode], why, why_n)) != 0) return line;
        if (mode && al_same(&full[mode], &full[0], 0, mode == 1 ? "ZeRO 1 vs DDP" : "ZeRO 2 vs DDP", why, why_n)) return __LINE__;
    }
    /* steps 3, 6, 7 and (W > 1) 10 skipped, every rank alike */
    if (full[0].st.skipped_steps != (c->world_size > 1 ? 4 : 3) || full[0].opt_step != AL_STEPS - full[0].st.skipped_steps) {
        snprintf(why, why_n, "skipped %lld, optimizer steps %lld", (long long)full[0].st.skipped_steps, (long long)full[0].opt_step);
        return __LINE__;
    }
    /* resume after step 7 (an overflow absorbed by hysteresis) and after step
       9 (mid growth interval) */
    for (ki = 0, k = 7; ki < 2; ki++, k = 9)
    for (mode = 0; mode < 3; mode++) {
        al_out first;
        snprintf(path[mode], sizeof path[mode], "%.280s.%d", ckpt, mode);
        memset(&first, 0, sizeof first); memset(&part, 0, sizeof part);
        if ((line = al_run(c, mode, 0, k, NULL, path[mode], &first, why, why_n)) != 0) return line;
        if (first.st.growth_tracker == 0 && first.st.hysteresis_tracker == 2) {
            snprintf(why, why_n, "the save after step %d holds no tracker state", k);
            return __LINE__;
        }
        if ((line = al_run(c, mode, k, AL_STEPS, path[mode], NULL, &part, why, why_n)) != 0) return line;
        if (al_same(&part, &full[mode], k, mode == 0 ? "DDP resumed" : mode == 1 ? "ZeRO 1 resumed" : "ZeRO 2 resumed", why, why_n))
            return __LINE__;
    }
    /* a ZeRO checkpoint resumed by DDP, a DDP one by ZeRO 2 */
    memset(&cross, 0, sizeof cross);
    if ((line = al_run(c, 0, k, AL_STEPS, path[2], NULL, &cross, why, why_n)) != 0) return line;
    if (al_same(&cross, &full[0], k, "ZeRO 2 checkpoint resumed by DDP", why, why_n)) return __LINE__;
    memset(&cross, 0, sizeof cross);
    if ((line = al_run(c, 2, k, AL_STEPS, path[0], NULL, &cross, why, why_n)) != 0) return line;
    if (al_same(&cross, &full[0], k, "DDP checkpoint resumed by ZeRO 2", why, why_n)) return __LINE__;
    if (c->rank == 0 && keep && rename(path[2], keep) != 0) { snprintf(why, why_n, "rename to %.200s", keep); return __LINE__; }
    if (c->rank == 0) for (mode = 0; mode < 3; mode++) remove(path[mode]);
    return 0;
}
#endif
