/* ZeRO on the GPU (capex_cuda_zero, capex_cuda.h) over NCCL, world size 1:
   on a real GPU with NCCL (`make gpu-test`), and in `make emu-test` on the
   CPU emulator driver with the stand-in NCCL. SKIPs without either.
   - three paths from the same params and gradients, bit for bit: ZeRO-GPU;
     the unsharded device optimizer it replaces (capex_cuda_optim over whole
     device params: with one rank, DDP's reduce is the identity) stepped with
     the same inv_scale, clip factor and found_inf; and the host capex_zero on
     a single-process comm. Adam (AdamW), SGD (momentum, nesterov), Adagrad;
     stage 1 and 2; f32 and f16/bf16 params (fp32 master shards); two groups;
     small buckets (params straddle buckets; an empty param); an inf step
     (skipped on the device: weights, model copies, step counts unchanged);
     clipping by the global norm;
   - the norm kernel on its own against hand-computed values: the clip factor
     and norm from an exact f64 sum, zero gradients (norm 0, factor 1), a NaN
     (found_inf, factor 1), finite gradients whose norm overflows f32 (no
     found_inf, factor 1, as capex_clip_coef), no elements at all;
   - checkpoints: ZeRO-GPU's file is byte-identical to the host capex_zero's
     after the same steps; it loads into a fresh host zero and a fresh GPU
     zero and the next step agrees bit for bit;
   - forked worlds of 2 and 4 ranks (the stand-in NCCL on the emulator)
     against DDP + capex_cuda_optim, each rank with a user stream of its own
     (one case on the legacy stream): lazy emulator streams show a
     collective that does not wait for the user stream; CAPEX_EMU_STREAMS=
     ahead, a user-stream read of a collective's result queued before its
     host wait. Two cases step with capex_cuda_zero_step_async, the next
     backward finishing the all-gathers nobody waited for;
   - memory info equal to the host zero's (same plan);
   - refusals: host params API on an NCCL comm, a host comm for the GPU zero,
     LAMB, the base's grad_norm/step.
   Gradients are k/16 * 1024 (|k| <= 15): exact in every dtype and every sum
   of squares exact, so the host and device norms agree to the bit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fail_alloc.h" /* g_fail_alloc_size: one chosen allocation fails */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include "nccl_world.h"

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

#define OK(call) CT_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())

#define OPEN(ctx, comm, user) CT_OPEN_NCCL1(ctx, comm, user, "kernels need a GPU or the emulator", 1)

#define CLOSE(ctx, comm, user)                          \
    do {                                                \
        capex_comm_destroy(&(comm));                    \
        capex_cuda_stream_destroy((ctx), (user));       \
        capex_cuda_context_destroy(ctx);                \
    } while (0)

#define NP 8
static const size_t zp_numel[NP] = {37, 64, 0, 130, 1, 77, 16, 300};
#define SCALE 1024.0f

typedef struct cfg {
    int stage;
    capex_optim_kind kind;
    int halves;
    float max_norm;  /* inf: no clipping */
    int inf_step;    /* -1: none */
    int steps;
    int micro;       /* backward passes per step (stage 2: accumulated in the shard) */
} cfg;

static capex_dtype dt_of(const cfg *c, int i) {
    if (!c->halves) return CAPEX_F32;
    return i % 3 == 0 ? CAPEX_F32 : i % 3 == 1 ? CAPEX_BF16 : CAPEX_F16;
}
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* This process's rank and world (forked ranks set them); g_avg_of > 0: the
   gradient is the average of that many ranks' (a world of 1 stepping as the
   whole world did). */
static int g_rank = 0, g_world = 1, g_avg_of = 0;
/* 1: gpu_steps steps with capex_cuda_zero_step_async and leaves the gathers to
   the next backward (capex_zero_grad_ready's launch finishes them) */
static int g_async = 0;
/* rank q's scaled gradient: k/16 * SCALE, |k| <= 15 (sums of up to 4 ranks and
   their squares are exact in every dtype); the last rank has an inf at the
   inf step */
static float grad_q(const cfg *c, int q, int world, int step, int p, size_t e) {
    if (step == c->inf_step && q == world - 1 && p == 3 && e == 5) return INFINITY;
    return (float)((int)(mix(((uint64_t)q << 52) ^ ((uint64_t)step << 40) ^ ((uint64_t)p << 24) ^ e) % 31) - 15) / 16.0f * SCALE;
}
static float grad_at(const cfg *c, int step, int p, size_t e) {
    float v = 0.0f;
    int q;
    if (g_avg_of <= 0) return grad_q(c, g_rank, g_world, step, p, e);
    for (q = 0; q < g_avg_of; q++) v += grad_q(c, q, g_avg_of, step, p, e);
    return v / (float)g_avg_of;
}
/* the reduced (averaged) gradient the step sees, in f64 (exact) */
static double grad_avg(const cfg *c, int step, int p, size_t e) {
    double v = 0.0;
    int q, m, nm = c->micro > 1 ? c->micro : 1;
    for (m = 0; m < nm; m++)
        for (q = 0; q < g_world; q++) v += grad_q(c, q, g_world, m == 0 ? step : step + 100 * m, p, e);
    return v / g_world;
}
static float init_at(int p, size_t e) { return (float)((int)((p * 131 + (int)e * 7) % 97) - 48) / 97.0f; }
static void put(void *buf, capex_dtype t, size_t e, float v) {
    if (t == CAPEX_F32) ((float *)buf)[e] = v;
    else ((uint16_t *)buf)[e] = t == CAPEX_F16 ? capex_f32_to_f16(v) : capex_f32_to_bf16(v);
}
/* micro-batch m's gradient; a step's is their sum (exact) */
static float grad_micro(const cfg *c, int step, int m, int p, size_t e) {
    return m == 0 ? grad_at(c, step, p, e) : grad_at(c, step + 100 * m, p, e);
}
static float grad_sum(const cfg *c, int step, int p, size_t e) {
    float v = 0.0f;
    int m;
    for (m = 0; m < (c->micro > 1 ? c->micro : 1); m++) v += grad_micro(c, step, m, p, e);
    return v;
}
static size_t bytes_of(const cfg *c, int i) { return zp_numel[i] * capex_dtype_size(dt_of(c, i)); }

/* 1: each kind's other modes (checkpoint_other_modes: saved with them, resumed without) */
static int g_alt_modes;

static void od_of(const cfg *c, capex_optim_desc *od, capex_optim_hparams hp[2]) {
    capex_optim_desc_init(od, c->kind);
    if (g_alt_modes) {
        od->adam_w_mode = c->kind == CAPEX_OPTIM_ADAGRAD; /* Adam, LAMB: L2; Adagrad: W */
        od->use_nvlamb = 1;
        od->wd_after_momentum = 1;
        od->reg_inside_moment = 1;
        od->init_zero = 1;
    }
    if (c->kind == CAPEX_OPTIM_SGD) { od->defaults.momentum = 0.9f; od->defaults.nesterov = 1; }
    od->defaults.lr = 1e-2f;
    od->defaults.weight_decay = 0.1f;
    hp[0] = od->defaults;
    hp[1] = od->defaults;
    hp[1].lr = 3e-3f;
    hp[1].weight_decay = 0.0f;
}

/* Host copies of the params: the same initial values on every path. */
typedef struct hostp { unsigned char *d[NP]; } hostp;
static void hostp_init(const cfg *c, hostp *h) {
    int i;
    size_t e;
    for (i = 0; i < NP; i++) {
        h->d[i] = (unsigned char *)calloc(1, bytes_of(c, i) + 4);
        for (e = 0; e < zp_numel[i]; e++) put(h->d[i], dt_of(c, i), e, init_at(i, e));
    }
}
static void hostp_free(hostp *h) { int i; for (i = 0; i < NP; i++) free(h->d[i]); }

static void zparams(const cfg *c, capex_zero_param *zp, void *const *data) {
    int i;
    for (i = 0; i < NP; i++) {
        zp[i].data = data[i];
        zp[i].numel = zp_numel[i];
        zp[i].dtype = dt_of(c, i);
        zp[i].group = (size_t)(i % 2);
    }
}

/* ZeRO-GPU: steps on device params; per step, the clip factor and found_inf
   it computed (read back). Leaves the zero and its params for more. */
typedef struct gpu_run {
    capex_cuda_zero *zg;
    capex_cuda_ptr p[NP], inv, found, total;
    float coef[16], norm[16];
    unsigned fi[16];
} gpu_run;

/* 1: gpu_create and host_create attach a count_skipped lr schedule (torch's
   scheduler.step() every iteration, the overflow step's too) */
static int g_sched;
static void sched_of(capex_lr_schedule *s) {
    capex_lr_schedule_init(s, CAPEX_LR_COSINE);
    s->warmup_steps = 2; s->total_steps = 6; s->count_skipped = 1;
}

static int g_sum_grads; /* gradient_average 0 (nofail's "accumulate") */
static void gpu_create(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, const cfg *c, gpu_run *g, const hostp *h) {
    capex_zero_param zp[NP];
    capex_zero_desc zd;
    capex_optim_desc od;
    capex_optim_hparams hp[2];
    void *data[NP];
    float inv = 1.0f / SCALE;
    int i;
    memset(g, 0, sizeof *g);
    for (i = 0; i < NP; i++) {
        OK(capex_cuda_malloc(ctx, bytes_of(c, i) + 4, &g->p[i]));
        OK(capex_cuda_memcpy_htod(ctx, g->p[i], h->d[i], bytes_of(c, i), NULL));
        data[i] = (void *)(uintptr_t)g->p[i];
    }
    OK(capex_cuda_malloc(ctx, 4, &g->inv));
    OK(capex_cuda_malloc(ctx, 4, &g->found));
    OK(capex_cuda_malloc(ctx, 4, &g->total));
    OK(capex_cuda_memcpy_htod(ctx, g->inv, &inv, 4, NULL));
    zparams(c, zp, data);
    capex_zero_desc_init(&zd);
    zd.stage = c->stage;
    zd.gradient_average = !g_sum_grads;
    zd.bucket_bytes = 256; /* several buckets, params straddling none (one rank: one shard each) */
    od_of(c, &od, hp);
    OK(capex_cuda_zero_create(&g->zg, comm, zp, NP, &od, hp, 2, &zd));
    if (g_sched) {
        capex_lr_schedule s;
        sched_of(&s);
        OK(capex_cuda_optim_set_lr_schedule(capex_cuda_zero_optim(g->zg), &s, NULL));
    }
}

static void gpu_steps(ct_state *ct, capex_cuda_context *ctx, capex_cuda_stream user, const cfg *c, gpu_run *g, int from,
                      int to) {
    capex_zero *z = capex_cuda_zero_base(g->zg);
    unsigned zero = 0;
    int s, i;
    size_t e;
    static unsigned char buf[300 * 4];
    for (s = from; s < to; s++) {
        int m;
        OK(capex_cuda_memcpy_htod(ctx, g->found, &zero, 4, NULL));
        for (m = 0; m < (c->micro > 1 ? c->micro : 1); m++) {
            for (i = NP; i-- > 0;) { /* backward order */
                void *gp = capex_zero_grad(z, (size_t)i);
                CT_CHECK(gp != NULL, "grad %d: %s", i, capex_last_error());
                for (e = 0; e < zp_numel[i]; e++) put(buf, dt_of(c, i), e, grad_micro(c, s, m, i, e));
                if (zp_numel[i]) OK(capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)gp, buf, bytes_of(c, i), user));
                OK(capex_zero_grad_ready(z, (size_t)i));
            }
            OK(capex_zero_finalize(z));
        }
        OK(capex_cuda_zero_grad_norm(g->zg, g->inv, c->max_norm, g->found, g->total, capex_cuda_zero_clip_coef_ptr(g->zg)));
        if (g_async) OK(capex_cuda_zero_step_async(g->zg, g->inv, capex_cuda_zero_clip_coef_ptr(g->zg), g->found));
        else OK(capex_cuda_zero_step(g->zg, g->inv, capex_cuda_zero_clip_coef_ptr(g->zg), g->found));
        OK(capex_cuda_stream_synchronize(ctx, user));
        OK(capex_cuda_memcpy_dtoh(ctx, &g->coef[s], capex_cuda_zero_clip_coef_ptr(g->zg), 4, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, &g->norm[s], g->total, 4, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, &g->fi[s], g->found, 4, NULL));
        OK(capex_zero_zero_grad(z));
    }
    if (g_async) OK(capex_zero_wait_params(z)); /* the last step's gathers */
}

static void gpu_read(ct_state *ct, capex_cuda_context *ctx, const cfg *c, const gpu_run *g, hostp *out) {
    int i;
    for (i = 0; i < NP; i++) {
        out->d[i] = (unsigned char *)calloc(1, bytes_of(c, i) + 4);
        OK(capex_cuda_memcpy_dtoh(ctx, out->d[i], g->p[i], bytes_of(c, i), NULL));
    }
}

static void gpu_free(capex_cuda_context *ctx, gpu_run *g) {
    int i;
    capex_cuda_zero_destroy(g->zg);
    for (i = 0; i < NP; i++) capex_cuda_free(ctx, g->p[i]);
    capex_cuda_free(ctx, g->inv);
    capex_cuda_free(ctx, g->found);
    capex_cuda_free(ctx, g->total);
}

/* The host capex_zero on a single-process comm, the same loop. */
typedef struct host_run {
    capex_comm comm;
    capex_zero *z;
    hostp p;
    float coef[16], norm[16];
    int fi[16];
} host_run;

static void host_create(ct_state *ct, const cfg *c, host_run *hr, const hostp *h) {
    capex_zero_param zp[NP];
    capex_zero_desc zd;
    capex_optim_desc od;
    capex_optim_hparams hp[2];
    int i;
    memset(hr, 0, sizeof *hr);
    for (i = 0; i < NP; i++) {
        hr->p.d[i] = (unsigned char *)calloc(1, bytes_of(c, i) + 4);
        memcpy(hr->p.d[i], h->d[i], bytes_of(c, i));
    }
    OK(capex_comm_init_single(&hr->comm));
    zparams(c, zp, (void *const *)hr->p.d);
    capex_zero_desc_init(&zd);
    zd.stage = c->stage;
    zd.bucket_bytes = 256;
    od_of(c, &od, hp);
    OK(capex_zero_create(&hr->z, &hr->comm, zp, NP, &od, hp, 2, &zd));
    if (g_sched) {
        capex_lr_schedule s;
        sched_of(&s);
        OK(capex_optim_set_lr_schedule(capex_zero_optim(hr->z), &s));
    }
}

static void host_steps(ct_state *ct, const cfg *c, host_run *hr, int from, int to) {
    int s, i, fi;
    size_t e;
    float norm, inv = 1.0f / SCALE, clip;
    for (s = from; s < to; s++) {
        int m;
        for (m = 0; m < (c->micro > 1 ? c->micro : 1); m++) {
            for (i = NP; i-- > 0;) {
                void *gp = capex_zero_grad(hr->z, (size_t)i);
                CT_CHECK(gp != NULL, "grad %d: %s", i, capex_last_error());
                for (e = 0; e < zp_numel[i]; e++) put(gp, dt_of(c, i), e, grad_micro(c, s, m, i, e));
                OK(capex_zero_grad_ready(hr->z, (size_t)i));
            }
            OK(capex_zero_finalize(hr->z));
        }
        OK(capex_zero_grad_norm(hr->z, &fi, &norm));
        clip = fi ? 1.0f : capex_clip_coef(norm * inv, c->max_norm);
        hr->coef[s] = clip;
        hr->norm[s] = norm;
        hr->fi[s] = fi;
        OK(capex_zero_step(hr->z, inv, clip, fi));
        OK(capex_zero_zero_grad(hr->z));
    }
}

static void host_free(host_run *hr) {
    capex_zero_destroy(hr->z);
    capex_comm_destroy(&hr->comm);
    hostp_free(&hr->p);
}

/* DDP + capex_cuda_optim over whole device params (the unsharded path),
   stepped with the given clip factors; found_inf from the known inf step. */
static void ref_run(ct_state *ct, capex_cuda_context *ctx, capex_cuda_stream user, capex_comm *comm, const cfg *c,
                    const hostp *h, const float *coef, hostp *out) {
    capex_cuda_optim *o;
    capex_ddp *ddp;
    capex_ddp_param dp[NP];
    capex_ddp_desc dd;
    capex_optim_desc od;
    capex_optim_hparams hp[2];
    capex_optim_param pp[2][NP];
    size_t n[2] = {0, 0};
    capex_cuda_ptr p[NP], m[NP], gr[NP], dinv, dcoef, dfound;
    float inv = 1.0f / SCALE;
    static unsigned char buf[300 * 4];
    static float f32[300];
    int i, s, g;
    size_t e;
    od_of(c, &od, hp);
    OK(capex_cuda_optim_create(ctx, &od, &o));
    for (i = 0; i < NP; i++) {
        capex_optim_param *q = &pp[i % 2][n[i % 2]++];
        capex_dtype t = dt_of(c, i);
        OK(capex_cuda_malloc(ctx, bytes_of(c, i) + 4, &p[i]));
        OK(capex_cuda_memcpy_htod(ctx, p[i], h->d[i], bytes_of(c, i), NULL));
        OK(capex_cuda_malloc(ctx, zp_numel[i] * 4 + 4, &m[i]));
        OK(capex_cuda_malloc(ctx, bytes_of(c, i) + 4, &gr[i]));
        dp[i].data = (void *)(uintptr_t)p[i];
        dp[i].numel = zp_numel[i];
        dp[i].dtype = t;
        dp[i].grad = (void *)(uintptr_t)gr[i]; /* own buffers: the optimizer's grad pointers stay valid */
        capex_optim_param_init(q);
        q->numel = (int64_t)zp_numel[i];
        q->grad = (void *)(uintptr_t)gr[i];
        q->grad_dtype = t;
        if (t == CAPEX_F32) q->param = (float *)(uintptr_t)p[i];
        else {
            for (e = 0; e < zp_numel[i]; e++)
                f32[e] = t == CAPEX_F16 ? capex_f16_to_f32(((uint16_t *)h->d[i])[e]) : capex_bf16_to_f32(((uint16_t *)h->d[i])[e]);
            OK(capex_cuda_memcpy_htod(ctx, m[i], f32, zp_numel[i] * 4, NULL));
            q->param = (float *)(uintptr_t)m[i];
            q->model = (void *)(uintptr_t)p[i];
            q->model_dtype = t;
        }
    }
    capex_ddp_desc_init(&dd);
    dd.first_bucket_bytes = 256;
    dd.bucket_bytes = 512;
    OK(capex_ddp_create(&ddp, comm, dp, NP, &dd));
    for (g = 0; g < 2; g++) OK(capex_cuda_optim_add_group(o, &hp[g], pp[g], n[g], NULL));
    OK(capex_cuda_malloc(ctx, 4, &dinv));
    OK(capex_cuda_malloc(ctx, 4, &dcoef));
    OK(capex_cuda_malloc(ctx, 4, &dfound));
    OK(capex_cuda_memcpy_htod(ctx, dinv, &inv, 4, NULL));
    for (s = 0; s < c->steps; s++) {
        unsigned fi = s == c->inf_step;
        for (i = NP; i-- > 0;) {
            for (e = 0; e < zp_numel[i]; e++) put(buf, dt_of(c, i), e, grad_sum(c, s, i, e));
            if (zp_numel[i]) OK(capex_cuda_memcpy_htod(ctx, gr[i], buf, bytes_of(c, i), NULL));
            OK(capex_ddp_grad_ready(ddp, (size_t)i));
        }
        OK(capex_ddp_finalize(ddp));
        OK(capex_cuda_memcpy_htod(ctx, dcoef, &coef[s], 4, NULL));
        OK(capex_cuda_memcpy_htod(ctx, dfound, &fi, 4, NULL));
        OK(capex_cuda_optim_step(o, dinv, dcoef, dfound, user));
        OK(capex_cuda_stream_synchronize(ctx, user));
        OK(capex_ddp_zero_grad(ddp));
    }
    for (i = 0; i < NP; i++) {
        out->d[i] = (unsigned char *)calloc(1, bytes_of(c, i) + 4);
        OK(capex_cuda_memcpy_dtoh(ctx, out->d[i], p[i], bytes_of(c, i), NULL));
    }
    capex_ddp_destroy(ddp);
    for (i = 0; i < NP; i++) {
        capex_cuda_free(ctx, p[i]);
        capex_cuda_free(ctx, m[i]);
        capex_cuda_free(ctx, gr[i]);
    }
    capex_cuda_free(ctx, dinv);
    capex_cuda_free(ctx, dcoef);
    capex_cuda_free(ctx, dfound);
    capex_cuda_optim_destroy(o);
}

static float as_f32(const void *buf, capex_dtype t, size_t e) {
    if (t == CAPEX_F32) return ((const float *)buf)[e];
    return t == CAPEX_F16 ? capex_f16_to_f32(((const uint16_t *)buf)[e]) : capex_bf16_to_f32(((const uint16_t *)buf)[e]);
}

static void same_params(ct_state *ct, const cfg *c, const hostp *a, const hostp *b, const char *what) {
    int i;
    for (i = 0; i < NP; i++) {
        size_t e, first = 0, ndiff = 0, es = capex_dtype_size(dt_of(c, i));
        for (e = 0; e < zp_numel[i]; e++)
            if (memcmp(a->d[i] + e * es, b->d[i] + e * es, es) && !ndiff++) first = e;
        CT_CHECK(ndiff == 0, "%s: param %d (%s, %zu elements) differs in %zu elements, first [%zu]: %.9g vs %.9g", what, i,
                 capex_dtype_name(dt_of(c, i)), zp_numel[i], ndiff, first, (double)as_f32(a->d[i], dt_of(c, i), first),
                 (double)as_f32(b->d[i], dt_of(c, i), first));
    }
}

/* LAMB: its global norm and per-tensor |p|, |u| are sums over pieces on
   every rank, in another order than the unsharded ones: within 1e-5
   relative (f32) or an ulp of the half type. */
static void close_params(ct_state *ct, const cfg *c, const hostp *a, const hostp *b, const char *what, double *worst) {
    int i;
    size_t e;
    for (i = 0; i < NP; i++) {
        capex_dtype t = dt_of(c, i);
        double tol = t == CAPEX_F32 ? 1e-5 : t == CAPEX_F16 ? 1.0 / 1024 : 1.0 / 128;
        for (e = 0; e < zp_numel[i]; e++) {
            double x = as_f32(a->d[i], t, e), y = as_f32(b->d[i], t, e), d = fabs(x - y) / (fabs(y) > 1e-3 ? fabs(y) : 1e-3);
            if (t == CAPEX_F32 && d > *worst) *worst = d;
            CT_CHECK(d <= tol, "%s: param %d (%s) [%zu]: %.9g vs %.9g (%.3g relative)", what, i, capex_dtype_name(t), e, x, y, d);
        }
    }
}

/* Per step: found_inf and the clip factor against f64 hand references
   (from the exact reduced gradients). */
static void check_factors(ct_state *ct, const cfg *c, const gpu_run *g) {
    int s, i;
    size_t e;
    for (s = 0; s < c->steps; s++) {
        double sq = 0.0;
        float total, want;
        for (i = 0; i < NP; i++)
            for (e = 0; e < zp_numel[i]; e++) { double v = grad_avg(c, s, i, e); sq += v * v; }
        total = (float)sqrt(sq);
        want = s == c->inf_step ? 1.0f : capex_clip_coef(total * (1.0f / SCALE), c->max_norm);
        CT_CHECK(g->fi[s] == (unsigned)(s == c->inf_step), "rank %d step %d: found_inf %u", g_rank, s, g->fi[s]);
        CT_CHECK(memcmp(&g->coef[s], &want, 4) == 0, "rank %d step %d: clip factor %.9g, want %.9g (f64 reference)",
                 g_rank, s, (double)g->coef[s], (double)want);
        CT_CHECK(s == c->inf_step || memcmp(&g->norm[s], &total, 4) == 0, "rank %d step %d: norm %.9g, want %.9g", g_rank,
                 s, (double)g->norm[s], (double)total);
        if (c->max_norm < 1e30f && s != c->inf_step) CT_CHECK(g->coef[s] < 1.0f, "step %d: clipping is active (%g)", s, (double)g->coef[s]);
    }
}

/* ZeRO-GPU on comm vs DDP + capex_cuda_optim (and, with one rank, vs the
   host capex_zero). */
static void equivalence_on(ct_state *ct, capex_cuda_context *ctx, capex_cuda_stream user, capex_comm *comm, const cfg *c) {
    gpu_run g;
    hostp h, gout, rout;
    hostp_init(c, &h);
    gpu_create(ct, ctx, comm, c, &g, &h);
    if (ct->failed) return;
    gpu_steps(ct, ctx, user, c, &g, 0, c->steps);
    if (ct->failed) return;
    gpu_read(ct, ctx, c, &g, &gout);
    check_factors(ct, c, &g);
    if (ct->failed) return;
    ref_run(ct, ctx, user, comm, c, &h, g.coef, &rout);
    if (ct->failed) return;
    if (c->kind == CAPEX_OPTIM_LAMB || c->kind == CAPEX_OPTIM_NOVOGRAD) {
        double worst = 0.0;
        close_params(ct, c, &gout, &rout, "LAMB/NovoGrad: ZeRO-GPU vs DDP + capex_cuda_optim", &worst);
        if (ct->failed) return;
        if (g_rank == 0 && getenv("ZGPU_VERBOSE")) fprintf(stderr, "kind %d world %d: worst f32 relative difference %.3g\n", (int)c->kind, g_world, worst);
    } else
        same_params(ct, c, &gout, &rout, "ZeRO-GPU vs DDP + capex_cuda_optim");
    if (ct->failed) return;
    {   /* the optimizer's step count: the inf step did not count */
        int64_t st = -1;
        OK(capex_cuda_optim_get_step(capex_cuda_zero_optim(g.zg), 0, &st, user));
        CT_CHECK(st == c->steps - (c->inf_step >= 0 && c->inf_step < c->steps), "step count %lld", (long long)st);
    }
    if (comm->world_size == 1) {
        host_run hr;
        int s;
        host_create(ct, c, &hr, &h);
        if (ct->failed) return;
        host_steps(ct, c, &hr, 0, c->steps);
        if (ct->failed) return;
        for (s = 0; s < c->steps; s++)
            CT_CHECK(memcmp(&g.coef[s], &hr.coef[s], 4) == 0 && g.fi[s] == (unsigned)hr.fi[s], "step %d: clip factor "
                     "%.9g on the GPU, %.9g on the host", s, (double)g.coef[s], (double)hr.coef[s]);
        if (c->kind == CAPEX_OPTIM_LAMB || c->kind == CAPEX_OPTIM_NOVOGRAD) {
            double worst = 0.0;
            close_params(ct, c, &gout, &hr.p, "LAMB/NovoGrad: ZeRO-GPU vs the host capex_zero", &worst);
        } else
            same_params(ct, c, &gout, &hr.p, "ZeRO-GPU vs the host capex_zero");
        if (ct->failed) return;
        {   /* the same plan: the same memory report as the host zero's */
            capex_zero_memory a = capex_zero_memory_info(capex_cuda_zero_base(g.zg)), b = capex_zero_memory_info(hr.z);
            if (c->kind == CAPEX_OPTIM_LAMB) { /* the host LAMB keeps its update u (3 floats), the device's m, v */
                CT_CHECK(a.moment_bytes * 3 == b.moment_bytes * 2, "LAMB moments %zu vs %zu", a.moment_bytes, b.moment_bytes);
                b.moment_bytes = a.moment_bytes;
                b.optimizer_state_bytes = b.master_bytes + b.moment_bytes;
                CT_CHECK(a.unsharded_state_bytes < b.unsharded_state_bytes, "LAMB unsharded state");
                b.unsharded_state_bytes = a.unsharded_state_bytes;
            }
            CT_CHECK(memcmp(&a, &b, sizeof a) == 0, "memory info differs (optimizer state %zu vs %zu)",
                     a.optimizer_state_bytes, b.optimizer_state_bytes);
        }
        host_free(&hr);
    }
    {   /* optimizer state per rank: this rank's share of the elements (padding aside) */
        capex_zero_memory a = capex_zero_memory_info(capex_cuda_zero_base(g.zg));
        size_t total = 0, i;
        for (i = 0; i < NP; i++) total += zp_numel[i];
        CT_CHECK(a.optimizer_state_bytes == a.master_bytes + a.moment_bytes && a.moment_bytes > 0, "memory info");
        CT_CHECK(a.shard_elements - a.padding_elements <= total / (size_t)comm->world_size + 64 &&
                 a.shard_elements - a.padding_elements + 64 >= total / (size_t)comm->world_size,
                 "rank %d holds %zu of %zu elements in a world of %d", g_rank, a.shard_elements - a.padding_elements,
                 total, comm->world_size);
    }
    hostp_free(&gout);
    hostp_free(&rout);
    hostp_free(&h);
    gpu_free(ctx, &g);
}

static void equivalence(ct_state *ct, const cfg *c) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    OPEN(ctx, comm, user);
    equivalence_on(ct, ctx, user, &comm, c);
    CLOSE(ctx, comm, user);
}

CT_TEST(adamw_stage1_f32) { cfg c = {1, CAPEX_OPTIM_ADAM, 0, INFINITY, 2, 4, 1}; equivalence(ct, &c); }
CT_TEST(adamw_stage2_halves) { cfg c = {2, CAPEX_OPTIM_ADAM, 1, INFINITY, 1, 4, 1}; equivalence(ct, &c); }
CT_TEST(adamw_stage1_halves_clip) { cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, 2, 4, 1}; equivalence(ct, &c); }
CT_TEST(sgd_stage1_halves) { cfg c = {1, CAPEX_OPTIM_SGD, 1, INFINITY, 2, 4, 1}; equivalence(ct, &c); }
CT_TEST(sgd_stage2_clip) { cfg c = {2, CAPEX_OPTIM_SGD, 0, 5.0f, -1, 3, 1}; equivalence(ct, &c); }
CT_TEST(adagrad_stage2) { cfg c = {2, CAPEX_OPTIM_ADAGRAD, 1, INFINITY, -1, 3, 1}; equivalence(ct, &c); }
CT_TEST(novograd_stage2_halves) { cfg c = {2, CAPEX_OPTIM_NOVOGRAD, 1, 5.0f, 2, 4, 1}; equivalence(ct, &c); }
CT_TEST(adamw_stage2_halves_two_micro_batches) { cfg c = {2, CAPEX_OPTIM_ADAM, 1, 5.0f, 1, 3, 2}; equivalence(ct, &c); }
CT_TEST(lamb_stage1_halves_clip) { cfg c = {1, CAPEX_OPTIM_LAMB, 1, 5.0f, 2, 4, 1}; equivalence(ct, &c); }
CT_TEST(adamw_stage2_two_micro_batches) { cfg c = {2, CAPEX_OPTIM_ADAM, 0, 5.0f, 1, 3, 2}; equivalence(ct, &c); }

/* The norm kernel's values against hand-computed ones, one case each. */
static void norm_case(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, const float *g, size_t n, float inv,
                      float max_norm, unsigned want_fi, float want_total, float want_coef, const char *what) {
    capex_zero_param zp[2];
    capex_cuda_zero *zg;
    capex_zero *z;
    capex_optim_desc od;
    capex_cuda_ptr p, dinv, found, total, coef;
    unsigned fi = 0;
    float t = -1.0f, cf = -1.0f;
    OK(capex_cuda_malloc(ctx, n * 4 + 4, &p));
    OK(capex_cuda_memset_u8(ctx, p, 0, n * 4 + 4, NULL));
    OK(capex_cuda_malloc(ctx, 4, &dinv));
    OK(capex_cuda_malloc(ctx, 4, &found));
    OK(capex_cuda_malloc(ctx, 4, &total));
    OK(capex_cuda_malloc(ctx, 4, &coef));
    OK(capex_cuda_memcpy_htod(ctx, dinv, &inv, 4, NULL));
    OK(capex_cuda_memcpy_htod(ctx, found, &fi, 4, NULL));
    zp[0].data = (void *)(uintptr_t)p; zp[0].numel = n; zp[0].dtype = CAPEX_F32; zp[0].group = 0;
    zp[1] = zp[0]; zp[1].numel = 0; /* an empty tensor beside it */
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    OK(capex_cuda_zero_create(&zg, comm, zp, 2, &od, NULL, 1, NULL));
    z = capex_cuda_zero_base(zg);
    if (n) OK(capex_cuda_memcpy_htod(ctx, (capex_cuda_ptr)(uintptr_t)capex_zero_grad(z, 0), g, n * 4, NULL));
    OK(capex_zero_grad_ready(z, 0));
    OK(capex_zero_grad_ready(z, 1));
    OK(capex_zero_finalize(z));
    OK(capex_cuda_zero_grad_norm(zg, dinv, max_norm, found, total, coef));
    OK(capex_cuda_memcpy_dtoh(ctx, &fi, found, 4, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, &t, total, 4, NULL));
    OK(capex_cuda_memcpy_dtoh(ctx, &cf, coef, 4, NULL));
    CT_CHECK(fi == want_fi, "%s: found_inf %u, want %u", what, fi, want_fi);
    CT_CHECK(memcmp(&t, &want_total, 4) == 0 || (t != t && want_total != want_total), "%s: norm %.9g, want %.9g", what,
             (double)t, (double)want_total);
    CT_CHECK(memcmp(&cf, &want_coef, 4) == 0, "%s: clip factor %.9g, want %.9g", what, (double)cf, (double)want_coef);
    capex_cuda_zero_destroy(zg);
    capex_cuda_free(ctx, p);
    capex_cuda_free(ctx, dinv);
    capex_cuda_free(ctx, found);
    capex_cuda_free(ctx, total);
    capex_cuda_free(ctx, coef);
}

/* Stage 2's half accumulation (capex__czero_add's capex_add_half): y += x
   with f32 math rounded once to the half dtype, bit for bit the path it
   replaces (both converted to f32, capex_add_f32, converted back: run here
   too) and the host's f32 add of the two converted values rounded once
   (a NaN sum: any NaN, the GPU's adds give a canonical one). Every pair of
   codes that round: ties to even at 1 and at the largest finite (to inf),
   sums that are f32 ties, subnormals, signed zeros, inf - inf, NaNs. */
static uint16_t half_of(int bf, float f) { return bf ? capex_f32_to_bf16(f) : capex_f32_to_f16(f); }
static float half_val(int bf, uint16_t h) { return bf ? capex_bf16_to_f32(h) : capex_f16_to_f32(h); }
CT_TEST(half_accumulation_kernel_bits) {
    static const uint16_t f16c[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x3c00, 0xbc00,
                                    0x3c01, 0x3c02, 0x1000, 0x9000, 0x1001, 0x0c00, 0x7bff, 0xfbff, 0x4c00, 0xcc00,
                                    0x4bff, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55, 0x6400, 0x6401, 0x3555};
    static const uint16_t bf16c[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x007f, 0x807f, 0x0080, 0x3f80, 0xbf80,
                                     0x3f81, 0x3f82, 0x3b80, 0xbb80, 0x3b81, 0x3380, 0x7f7f, 0xff7f, 0x7b00, 0xfb00,
                                     0x7aff, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa5, 0x4b80, 0x4b81, 0x3eab};
    enum { NC = 30, NR = 34, NV = NC + NR, N = NV * NV };
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    static uint16_t hy[N], hx[N], got[N], old[N];
    capex_cuda_ptr y = 0, x = 0, y2 = 0, ty = 0, tx = 0;
    int bf;
    OPEN(ctx, comm, user);
    OK(capex_cuda_malloc(ctx, 2 * N, &y));
    OK(capex_cuda_malloc(ctx, 2 * N, &x));
    OK(capex_cuda_malloc(ctx, 2 * N, &y2));
    OK(capex_cuda_malloc(ctx, 4 * N, &ty));
    OK(capex_cuda_malloc(ctx, 4 * N, &tx));
    for (bf = 0; bf < 2 && !ct->failed; bf++) {
        const uint16_t *sp = bf ? bf16c : f16c;
        uint16_t v[NV];
        unsigned long long nn = N;
        int bfa = bf, i, j, bad = 0;
        void *args[4];
        capex_dtype t = bf ? CAPEX_BF16 : CAPEX_F16;
        for (i = 0; i < NV; i++) v[i] = i < NC ? sp[i] : (uint16_t)mix((uint64_t)(i + 100 * bf));
        for (i = 0; i < NV; i++)
            for (j = 0; j < NV; j++) { hy[i * NV + j] = v[i]; hx[i * NV + j] = v[j]; }
        OK(capex_cuda_memcpy_htod(ctx, y, hy, 2 * N, NULL));
        OK(capex_cuda_memcpy_htod(ctx, y2, hy, 2 * N, NULL));
        OK(capex_cuda_memcpy_htod(ctx, x, hx, 2 * N, NULL));
        args[0] = &y; args[1] = &x; args[2] = &bfa; args[3] = &nn;
        OK(capex__cuda_builtin_launch(ctx, CAPEX__CK_ADD_HALF, N, NULL, args));
        /* the path it replaces */
        OK(capex_cuda_convert(ctx, ty, CAPEX_F32, y2, t, N, NULL));
        OK(capex_cuda_convert(ctx, tx, CAPEX_F32, x, t, N, NULL));
        OK(capex_cuda_add_f32(ctx, ty, ty, tx, N, NULL));
        OK(capex_cuda_convert(ctx, y2, t, ty, CAPEX_F32, N, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, got, y, 2 * N, NULL));
        OK(capex_cuda_memcpy_dtoh(ctx, old, y2, 2 * N, NULL));
        for (i = 0; i < N && bad < 5; i++) {
            volatile float a = half_val(bf, hy[i]), b = half_val(bf, hx[i]);
            volatile float sum = a + b;
            uint16_t want = half_of(bf, sum);
            int ok = got[i] == old[i] && (sum != sum ? half_val(bf, got[i]) != half_val(bf, got[i]) : got[i] == want);
            if (!ok) bad++;
            CT_CHECK(ok, "%s: 0x%04x + 0x%04x: 0x%04x, the old path 0x%04x, want 0x%04x", bf ? "bf16" : "f16", hy[i], hx[i],
                     got[i], old[i], want);
        }
    }
    capex_cuda_free(ctx, y);
    capex_cuda_free(ctx, x);
    capex_cuda_free(ctx, y2);
    capex_cuda_free(ctx, ty);
    capex_cuda_free(ctx, tx);
    CLOSE(ctx, comm, user);
}

CT_TEST(norm_kernel_edge_cases) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    static float g[1000];
    double sq = 0.0;
    float total, coef;
    size_t i;
    OPEN(ctx, comm, user);
    /* exact squares: 3, 4 (scaled by 8) -> norm 40, unscaled 5; max 2: 2 / (5 + 1e-6) */
    g[0] = 24.0f; g[1] = 32.0f;
    norm_case(ct, ctx, &comm, g, 2, 0.125f, 2.0f, 0, 40.0f, 2.0f / (5.0f + 1e-6f), "3-4-5 clipped");
    norm_case(ct, ctx, &comm, g, 2, 0.125f, 100.0f, 0, 40.0f, 1.0f, "3-4-5 not clipped (factor > 1 -> 1)");
    norm_case(ct, ctx, &comm, g, 2, 0.125f, INFINITY, 0, 40.0f, 1.0f, "max_norm inf");
    norm_case(ct, ctx, &comm, g, 2, 0.125f, 0.0f, 0, 40.0f, 0.0f, "max_norm 0");
    /* many chunks' partials (1000 elements), against an f64 sum */
    for (i = 0; i < 1000; i++) { g[i] = (float)((int)(mix(i) % 2001) - 1000) / 64.0f; sq += (double)g[i] * g[i]; }
    total = (float)sqrt(sq);
    coef = 3.0f / (total * 0.5f + 1e-6f);
    norm_case(ct, ctx, &comm, g, 1000, 0.5f, 3.0f, 0, total, coef, "1000 elements vs f64");
    memset(g, 0, sizeof g);
    norm_case(ct, ctx, &comm, g, 1000, 1.0f, 1.0f, 0, 0.0f, 1.0f, "zero gradients");
    g[7] = NAN;
    norm_case(ct, ctx, &comm, g, 1000, 1.0f, 1.0f, 1, NAN, 1.0f, "a NaN");
    g[7] = -INFINITY;
    norm_case(ct, ctx, &comm, g, 1000, 1.0f, 1.0f, 1, INFINITY, 1.0f, "an -inf");
    for (i = 0; i < 20; i++) g[i] = 3e38f; /* finite, but the norm is beyond f32 */
    norm_case(ct, ctx, &comm, g, 20, 1.0f, 1.0f, 0, INFINITY, 1.0f, "norm overflows f32");
    norm_case(ct, ctx, &comm, g, 0, 1.0f, 1.0f, 0, 0.0f, 1.0f, "no elements");
    CLOSE(ctx, comm, user);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca, cb, same = fa && fb;
    while (same) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* 1: SGD's momentum is turned off on group 0 (all four zeros) before the last
   step before the save, and on again after the step that follows the load:
   the buffers go through the checkpoint (they did not before 2026-11-28) */
static int g_mom_off;
static void set_momentum(ct_state *ct, gpu_run *g, host_run *hr, float mom) {
    capex_optim_hparams hp;
    OK(capex_optim_get_hparams(capex_zero_optim(hr->z), 0, &hp));
    hp.momentum = mom;
    hp.nesterov = mom != 0.0f;
    OK(capex_optim_set_hparams(capex_zero_optim(hr->z), 0, &hp));
    OK(capex_cuda_optim_set_hparams(capex_cuda_zero_optim(g->zg), 0, &hp, NULL));
}

/* Whether the unit a launch of optimizer kernel k (CAPEX__GO_K_*, no switches) would use is loaded. */
static int go_unit_loaded(capex_cuda_context *ctx, int k) {
    int u, loaded;
    pthread_mutex_lock(&ctx->lock);
    u = capex__cuda_pick_unit_locked(ctx, CAPEX__GO_KBASE + (size_t)k, CAPEX__CUDA_VB(0, 0, 0, 0));
    loaded = ctx->part[u] != NULL;
    pthread_mutex_unlock(&ctx->lock);
    return loaded;
}
/* A world of 1 has no peers to leave waiting: create loads the step's
   kernels but not grad_norm's (the norm kernel, the shards' sums per dtype),
   which load at the first grad_norm, before it launches anything. Before
   2026-11-29 create compiled them too (a cold compile a run without clipping
   never needed, and without NVRTC or a cache entry a failed create). */
CT_TEST(world1_create_leaves_grad_norm_kernels_unloaded) {
    cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, -1, 1, 1};
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    gpu_run g;
    hostp h;
    int t;
    OPEN(ctx, comm, user);
    hostp_init(&c, &h);
    gpu_create(ct, ctx, &comm, &c, &g, &h);
    CT_CHECK(!go_unit_loaded(ctx, CAPEX__GO_K_ZERO_NORM), "create loaded the norm kernel");
    for (t = 0; t < 3; t++) CT_CHECK(!go_unit_loaded(ctx, CAPEX__GO_K_SUMSQ + t), "create loaded the %s sums", capex_dtype_name((capex_dtype)t));
    gpu_steps(ct, ctx, user, &c, &g, 0, 1);
    CT_CHECK(go_unit_loaded(ctx, CAPEX__GO_K_ZERO_NORM), "grad_norm did not load its kernel");
    for (t = 0; t < 3; t++) CT_CHECK(go_unit_loaded(ctx, CAPEX__GO_K_SUMSQ + t), "grad_norm did not load the %s sums", capex_dtype_name((capex_dtype)t));
    gpu_free(ctx, &g);
    hostp_free(&h);
    CLOSE(ctx, comm, user);
}

/* set_lr changes no kernel: the optimizer stays ready (no load-only pass of
   the step at the call with several ranks, none at the next step with one),
   while a momentum switch makes the next step load its variant. */
CT_TEST(set_lr_keeps_the_step_kernels_ready) {
    cfg c = {1, CAPEX_OPTIM_SGD, 1, 5.0f, -1, 1, 1};
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    capex_cuda_optim *o;
    capex_optim_hparams hp;
    gpu_run g;
    hostp h;
    OPEN(ctx, comm, user);
    hostp_init(&c, &h);
    gpu_create(ct, ctx, &comm, &c, &g, &h);
    gpu_steps(ct, ctx, user, &c, &g, 0, 1);
    o = capex_cuda_zero_optim(g.zg);
    CT_CHECK(o->ready, "not ready after a step");
    OK(capex_cuda_optim_set_lr(o, 0, 0.5f, user));
    CT_CHECK(o->ready, "set_lr made the next step load its kernels again");
    hp = o->hp[0];
    hp.momentum = 0.0f;
    hp.nesterov = 0;
    OK(capex_cuda_optim_set_hparams(o, 0, &hp, user));
    CT_CHECK(!o->ready, "a momentum switch left the optimizer ready (its variant is another)");
    gpu_free(ctx, &g);
    hostp_free(&h);
    CLOSE(ctx, comm, user);
}

/* Save after steps: the same file as the host zero's; it loads into a fresh
   host zero and a fresh GPU zero (other initial values) and the next step
   agrees with the original ones. */
static void checkpoint_case(ct_state *ct, cfg c) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    gpu_run g, g2;
    host_run hr, hr2;
    hostp h, zeros, a, b;
    char fg[64], fh[64];
    int i;
    OPEN(ctx, comm, user);
    snprintf(fg, sizeof fg, "/tmp/capex_zgpu_%d.ckpt", (int)getpid());
    snprintf(fh, sizeof fh, "/tmp/capex_zgpu_%d.host", (int)getpid());
    hostp_init(&c, &h);
    hostp_init(&c, &zeros);
    for (i = 0; i < NP; i++) memset(zeros.d[i], 0, bytes_of(&c, i));
    gpu_create(ct, ctx, &comm, &c, &g, &h);
    host_create(ct, &c, &hr, &h);
    gpu_steps(ct, ctx, user, &c, &g, 0, 2);
    host_steps(ct, &c, &hr, 0, 2);
    if (g_mom_off) set_momentum(ct, &g, &hr, 0.0f);
    gpu_steps(ct, ctx, user, &c, &g, 2, 3);
    host_steps(ct, &c, &hr, 2, 3);
    OK(capex_zero_save_file(capex_cuda_zero_base(g.zg), fg, CAPEX_OPTIM_STATE_PARAMS));
    OK(capex_zero_save_file(hr.z, fh, CAPEX_OPTIM_STATE_PARAMS));
    CT_CHECK(same_file(fg, fh), "the GPU zero's checkpoint differs from the host zero's");
    /* fresh zeros from other values, loaded */
    gpu_create(ct, ctx, &comm, &c, &g2, &zeros);
    host_create(ct, &c, &hr2, &zeros);
    OK(capex_zero_load_file(capex_cuda_zero_base(g2.zg), fg, CAPEX_OPTIM_STATE_PARAMS));
    OK(capex_zero_load_file(hr2.z, fg, CAPEX_OPTIM_STATE_PARAMS));
    if (g_sched) { /* the file's iteration count (3 steps, one skipped) on the device */
        int64_t n = -1;
        OK(capex_cuda_optim_get_lr_iteration(capex_cuda_zero_optim(g2.zg), &n, NULL));
        CT_CHECK(n == 3, "loaded GPU zero: lr schedule iteration %lld, want 3", (long long)n);
    }
    gpu_read(ct, ctx, &c, &g2, &a);
    same_params(ct, &c, &a, &hr.p, "loaded GPU params");
    same_params(ct, &c, &hr2.p, &hr.p, "loaded host params");
    hostp_free(&a);
    /* one more step on all four */
    gpu_steps(ct, ctx, user, &c, &g, 3, 4);
    gpu_steps(ct, ctx, user, &c, &g2, 3, 4);
    host_steps(ct, &c, &hr, 3, 4);
    host_steps(ct, &c, &hr2, 3, 4);
    gpu_read(ct, ctx, &c, &g, &a);
    gpu_read(ct, ctx, &c, &g2, &b);
    same_params(ct, &c, &a, &hr.p, "GPU vs host after the next step");
    same_params(ct, &c, &b, &a, "resumed GPU vs GPU");
    same_params(ct, &c, &hr2.p, &a, "resumed host (GPU checkpoint) vs GPU");
    if (g_mom_off) { /* momentum on again: from the buffers the checkpoint carried */
        set_momentum(ct, &g, &hr, 0.9f);
        set_momentum(ct, &g2, &hr2, 0.9f);
        gpu_steps(ct, ctx, user, &c, &g, 4, 5);
        gpu_steps(ct, ctx, user, &c, &g2, 4, 5);
        host_steps(ct, &c, &hr, 4, 5);
        host_steps(ct, &c, &hr2, 4, 5);
        hostp_free(&a);
        hostp_free(&b);
        gpu_read(ct, ctx, &c, &g, &a);
        gpu_read(ct, ctx, &c, &g2, &b);
        same_params(ct, &c, &a, &hr.p, "momentum on again: GPU vs host");
        same_params(ct, &c, &b, &a, "momentum on again: resumed GPU vs GPU");
        same_params(ct, &c, &hr2.p, &a, "momentum on again: resumed host vs GPU");
    }
    {   /* and the resumed GPU zero saves the same file again */
        OK(capex_zero_save_file(capex_cuda_zero_base(g2.zg), fg, CAPEX_OPTIM_STATE_PARAMS));
        OK(capex_zero_save_file(hr.z, fh, CAPEX_OPTIM_STATE_PARAMS));
        CT_CHECK(same_file(fg, fh), "resumed GPU zero's checkpoint differs from the host zero's");
    }
    remove(fg);
    remove(fh);
    hostp_free(&a);
    hostp_free(&b);
    host_free(&hr);
    host_free(&hr2);
    hostp_free(&h);
    hostp_free(&zeros);
    gpu_free(ctx, &g);
    gpu_free(ctx, &g2);
    CLOSE(ctx, comm, user);
}

/* A host zero in the other modes steps and saves; a fresh GPU zero and a
   fresh host zero in the default modes load the file. Both take the file's
   modes (as capex_optim_load; the GPU zero's from_host refused them before
   2026-11-28): two more steps each, bit for bit equal to the saving zero's,
   and the resumed GPU zero saves the saving zero's file. A host copy with
   stochastic rounding (the device zero has none: create refuses it) is
   refused by from_host on the zero's optimizer, naming it, and changes
   nothing (another mode in it not taken either). */
static void checkpoint_modes_case(ct_state *ct, cfg c) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm;
    gpu_run g2;
    host_run hr, hr2;
    hostp h, zeros, a;
    char fg[64], fh[64];
    int i;
    OPEN(ctx, comm, user);
    snprintf(fg, sizeof fg, "/tmp/capex_zgpu_m%d.ckpt", (int)getpid());
    snprintf(fh, sizeof fh, "/tmp/capex_zgpu_m%d.host", (int)getpid());
    hostp_init(&c, &h);
    hostp_init(&c, &zeros);
    for (i = 0; i < NP; i++) memset(zeros.d[i], 0, bytes_of(&c, i));
    g_alt_modes = 1;
    host_create(ct, &c, &hr, &h);
    g_alt_modes = 0;
    host_steps(ct, &c, &hr, 0, 3);
    OK(capex_zero_save_file(hr.z, fh, CAPEX_OPTIM_STATE_PARAMS));
    gpu_create(ct, ctx, &comm, &c, &g2, &zeros);
    host_create(ct, &c, &hr2, &zeros);
    OK(capex_zero_load_file(capex_cuda_zero_base(g2.zg), fh, CAPEX_OPTIM_STATE_PARAMS));
    OK(capex_zero_load_file(hr2.z, fh, CAPEX_OPTIM_STATE_PARAMS));
    {
        capex_cuda_optim *o = capex_cuda_zero_optim(g2.zg);
        capex_optim *ho = NULL;
        OK(capex_cuda_optim_to_host(o, 0, NULL, &ho));
        if (ho) {
            CT_CHECK(ho->desc.adam_w_mode == (c.kind == CAPEX_OPTIM_ADAGRAD) && ho->desc.use_nvlamb &&
                     ho->desc.wd_after_momentum, "the GPU zero's optimizer holds the file's modes");
            ho->desc.stochastic_rounding = 1;
            ho->desc.adam_w_mode = !ho->desc.adam_w_mode;
            CT_CHECK(capex_cuda_optim_from_host(o, ho, 0, NULL) == CAPEX_ERR_UNSUPPORTED &&
                     strstr(capex_last_error(), "stochastic_rounding"), "stochastic rounding into the zero's optimizer: %s",
                     capex_last_error());
        }
        capex_optim_destroy(ho);
    }
    gpu_read(ct, ctx, &c, &g2, &a);
    same_params(ct, &c, &a, &hr.p, "loaded GPU params");
    hostp_free(&a);
    gpu_steps(ct, ctx, user, &c, &g2, 3, 5);
    host_steps(ct, &c, &hr, 3, 5);
    host_steps(ct, &c, &hr2, 3, 5);
    gpu_read(ct, ctx, &c, &g2, &a);
    same_params(ct, &c, &a, &hr.p, "resumed GPU zero vs the saving zero");
    same_params(ct, &c, &hr2.p, &hr.p, "resumed host zero vs the saving zero");
    OK(capex_zero_save_file(capex_cuda_zero_base(g2.zg), fg, CAPEX_OPTIM_STATE_PARAMS));
    OK(capex_zero_save_file(hr.z, fh, CAPEX_OPTIM_STATE_PARAMS));
    CT_CHECK(same_file(fg, fh), "the resumed GPU zero's checkpoint differs from the saving zero's");
    remove(fg);
    remove(fh);
    hostp_free(&a);
    host_free(&hr);
    host_free(&hr2);
    hostp_free(&h);
    hostp_free(&zeros);
    gpu_free(ctx, &g2);
    CLOSE(ctx, comm, user);
}
CT_TEST(checkpoint_other_modes_adam) { cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, 1, 5, 1}; checkpoint_modes_case(ct, c); }
CT_TEST(checkpoint_other_modes_sgd_stage2) { cfg c = {2, CAPEX_OPTIM_SGD, 1, 5.0f, -1, 5, 1}; checkpoint_modes_case(ct, c); }
CT_TEST(checkpoint_other_modes_adagrad) { cfg c = {1, CAPEX_OPTIM_ADAGRAD, 0, INFINITY, -1, 5, 1}; checkpoint_modes_case(ct, c); }
CT_TEST(checkpoint_other_modes_lamb_stage2) { cfg c = {2, CAPEX_OPTIM_LAMB, 1, 5.0f, -1, 5, 1}; checkpoint_modes_case(ct, c); }
CT_TEST(checkpoint_other_modes_novograd) { cfg c = {1, CAPEX_OPTIM_NOVOGRAD, 1, 5.0f, 1, 5, 1}; checkpoint_modes_case(ct, c); }

CT_TEST(checkpoint_matches_host_and_loads) { cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, 1, 3, 1}; checkpoint_case(ct, c); }
CT_TEST(checkpoint_lamb_stage2) { cfg c = {2, CAPEX_OPTIM_LAMB, 1, 5.0f, -1, 3, 1}; checkpoint_case(ct, c); }
CT_TEST(checkpoint_novograd_stage1) { cfg c = {1, CAPEX_OPTIM_NOVOGRAD, 1, 5.0f, -1, 3, 1}; checkpoint_case(ct, c); }
/* count_skipped through the device zero: the overflow at step 1 advances the
   schedule on the device as on the host, the checkpoints (with the iteration
   count) are the same file, and both resume from it alike. */
CT_TEST(checkpoint_lr_schedule_count_skipped) {
    cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, 1, 3, 1};
    g_sched = 1;
    checkpoint_case(ct, c);
    g_sched = 0;
}
CT_TEST(checkpoint_sgd_momentum_turned_off) {
    cfg c = {1, CAPEX_OPTIM_SGD, 1, 5.0f, -1, 3, 1};
    g_mom_off = 1;
    checkpoint_case(ct, c);
    g_mom_off = 0;
}

CT_TEST(refusals) {
    capex_cuda_context *ctx = NULL;
    capex_cuda_stream user = NULL;
    capex_comm comm, single;
    capex_zero_param zp[1];
    capex_optim_desc od;
    capex_zero *z = NULL;
    capex_cuda_zero *zg = NULL;
    capex_cuda_ptr p;
    int fi;
    float norm;
    OPEN(ctx, comm, user);
    OK(capex_cuda_malloc(ctx, 64, &p));
    OK(capex_cuda_memset_u8(ctx, p, 0, 64, NULL));
    zp[0].data = (void *)(uintptr_t)p; zp[0].numel = 16; zp[0].dtype = CAPEX_F32; zp[0].group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(&z, &comm, zp, 1, &od, NULL, 1, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_cuda_zero_create"), "host API on an NCCL comm: %s", capex_last_error());
    OK(capex_comm_init_single(&single));
    CT_CHECK(capex_cuda_zero_create(&zg, &single, zp, 1, &od, NULL, 1, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "NCCL"), "GPU zero on a host comm: %s", capex_last_error());
    CT_CHECK(capex__zero_create(&z, &single, zp, 1, &od, NULL, 1, NULL, (const capex__zero_dev *)&od, NULL, "x") ==
             CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "host buffers"), "device mode on a host comm: %s",
             capex_last_error());
    capex_comm_destroy(&single);
    od.stochastic_rounding = 1;
    CT_CHECK(capex_cuda_zero_create(&zg, &comm, zp, 1, &od, NULL, 1, NULL) == CAPEX_ERR_UNSUPPORTED &&
             strstr(capex_last_error(), "stochastic rounding"), "stochastic rounding: %s", capex_last_error());
    CT_CHECK(zg == NULL, "no zero on error");
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    OK(capex_cuda_zero_create(&zg, &comm, zp, 1, &od, NULL, 1, NULL));
    z = capex_cuda_zero_base(zg);
    {   /* a checkpoint with stochastic rounding: refused before anything changes */
        capex_optim *h = NULL;
        capex_optim_param hp;
        capex_optim_desc sd = od;
        float hw[16], hg[16], back[16];
        char path[200];
        int i;
        for (i = 0; i < 16; i++) { hw[i] = 0.5f + (float)i; hg[i] = 0.25f; }
        snprintf(path, sizeof path, "/tmp/capex_zgpu_sr_%d.ckpt", (int)getpid());
        sd.stochastic_rounding = 1;
        capex_optim_param_init(&hp);
        hp.param = hw; hp.grad = hg; hp.numel = 16;
        OK(capex_optim_create(&sd, &h));
        OK(capex_optim_add_group(h, NULL, &hp, 1, NULL));
        OK(capex_optim_step(h, 1.0f, 1.0f, 0));
        OK(capex_optim_save_file(h, path, CAPEX_OPTIM_STATE_PARAMS));
        capex_optim_destroy(h);
        CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_UNSUPPORTED &&
                 strstr(capex_last_error(), "device zero"), "stochastic rounding checkpoint: %s", capex_last_error());
        remove(path);
        OK(capex_cuda_memcpy_dtoh(ctx, back, p, sizeof back, NULL));
        for (i = 0; i < 16; i++) CT_CHECK(back[i] == 0.0f, "param element %d changed by the refused load: %g", i, (double)back[i]);
    }
    OK(capex_zero_grad_ready(z, 0));
    CT_CHECK(capex_cuda_zero_grad_norm(zg, 0, 1.0f, 0, 0, 0) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "finalize"),
             "grad norm between grad_ready and finalize: %s", capex_last_error());
    OK(capex_zero_finalize(z));
    CT_CHECK(capex_zero_grad_norm(z, &fi, &norm) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_cuda_zero_grad_norm"), "base grad_norm: %s", capex_last_error());
    CT_CHECK(capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_cuda_zero_step"), "base step: %s", capex_last_error());
    CT_CHECK(capex_zero_optim(z) == NULL, "no host optimizer");
    {   /* its optimizer steps shard pieces: a group added to it would have no reduced grads */
        capex_optim_param xp;
        capex_optim_param_init(&xp);
        xp.param = (float *)(uintptr_t)p; xp.grad = (void *)(uintptr_t)(p + 32); xp.numel = 4;
        CT_CHECK(capex_cuda_optim_add_group(capex_cuda_zero_optim(zg), NULL, &xp, 1, NULL) == CAPEX_ERR_UNSUPPORTED &&
                 strstr(capex_last_error(), "capex_cuda_zero_create"), "add_group on the zero's optimizer: %s",
                 capex_last_error());
        CT_CHECK(capex_cuda_optim_num_groups(capex_cuda_zero_optim(zg)) == 1, "groups");
    }
    CT_CHECK(capex_cuda_zero_grad_norm(zg, 0, -1.0f, 0, 0, 0) == CAPEX_ERR_INVALID_ARG, "negative max_norm");
    CT_CHECK(capex_cuda_zero_grad_norm(zg, 2, 1.0f, 0, 0, 0) == CAPEX_ERR_INVALID_ARG, "misaligned inv_scale");
    capex_cuda_zero_destroy(zg);
    capex_cuda_free(ctx, p);
    CLOSE(ctx, comm, user);
}

/* ---- worlds of several ranks (forked, on the stand-in NCCL) ---------------- */

typedef struct world_job {
    cfg c;
    char save[200]; /* "": equivalence; else the checkpoint path */
    int load;       /* 1: load save (written by a world of load_world ranks), step once, compare */
    int load_world;
    int dead_peer;  /* 1: destroy_in_flight_on instead */
    int mode;       /* equivalence: bit 0: the legacy stream as the user stream (else one of its own); bit 1: step_async */
} world_job;

static void write_params(ct_state *ct, const cfg *c, const hostp *hp, const char *path) {
    FILE *f = fopen(path, "wb");
    int i;
    CT_CHECK(f != NULL, "cannot write %s", path);
    for (i = 0; i < NP; i++) fwrite(hp->d[i], 1, bytes_of(c, i), f);
    fclose(f);
}
static void same_as_file(ct_state *ct, const cfg *c, const hostp *hp, const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    static unsigned char buf[300 * 4];
    int i;
    CT_CHECK(f != NULL, "cannot read %s", path);
    for (i = 0; i < NP; i++) {
        size_t n = fread(buf, 1, bytes_of(c, i), f);
        if (n != bytes_of(c, i) || memcmp(buf, hp->d[i], n) != 0) {
            fclose(f);
            CT_CHECK(0, "%s: param %d (%s) differs from %s", what, i, capex_dtype_name(dt_of(c, i)), path);
        }
    }
    fclose(f);
}

/* Saves after c->steps, steps once more and (rank 0) writes the params to
   save.params; or (load) loads save into zeros, checks a resave is the same
   file, steps once with the other world's average gradient and compares. */
static void ckpt_on(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, const world_job *j) {
    const cfg *c = &j->c;
    gpu_run g;
    hostp h, out;
    char pp[220], again[220];
    int i;
    snprintf(pp, sizeof pp, "%s.params", j->save);
    snprintf(again, sizeof again, "%s.w%d", j->save, comm->world_size);
    hostp_init(c, &h);
    if (j->load) for (i = 0; i < NP; i++) memset(h.d[i], 0, bytes_of(c, i));
    gpu_create(ct, ctx, comm, c, &g, &h);
    if (ct->failed) return;
    if (!j->load) {
        gpu_steps(ct, ctx, NULL, c, &g, 0, c->steps);
        if (ct->failed) return;
        OK(capex_zero_save_file(capex_cuda_zero_base(g.zg), j->save, CAPEX_OPTIM_STATE_PARAMS));
    } else {
        OK(capex_zero_load_file(capex_cuda_zero_base(g.zg), j->save, CAPEX_OPTIM_STATE_PARAMS));
        OK(capex_zero_save_file(capex_cuda_zero_base(g.zg), again, CAPEX_OPTIM_STATE_PARAMS));
        if (comm->rank == 0) CT_CHECK(same_file(j->save, again), "a world of %d resaves a world of %d's checkpoint differently",
                                      comm->world_size, j->load_world);
        g_avg_of = j->load_world; /* every rank: the saving world's average gradient */
    }
    gpu_steps(ct, ctx, NULL, c, &g, c->steps, c->steps + 1);
    if (ct->failed) return;
    gpu_read(ct, ctx, c, &g, &out);
    if (comm->rank == 0 && !j->load) write_params(ct, c, &out, pp);
    if (j->load) same_as_file(ct, c, &out, pp, "the step after the load");
    if (j->load && comm->rank == 0) remove(again);
    hostp_free(&out);
    hostp_free(&h);
    gpu_free(ctx, &g);
}

/* The last rank leaves after create; rank 0's reduce-scatters (launched by
   grad_ready, in flight) meet the stand-in's async error for a dead peer.
   Destroying the zero then waits for them, fails, and must abort the NCCL
   comm as capex_ddp_destroy does: a live comm's destroy (ncclCommDestroy,
   cuMemFree) waits for kernels that a dead peer never lets finish. */
static void destroy_in_flight_on(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, const cfg *c) {
    gpu_run g;
    hostp h;
    int i;
    hostp_init(c, &h);
    gpu_create(ct, ctx, comm, c, &g, &h);
    if (!ct->failed && comm->rank == 0) {
        capex_zero *z = capex_cuda_zero_base(g.zg);
        for (i = NP; i-- > 0;) OK(capex_zero_grad_ready(z, (size_t)i)); /* nonblocking: in flight */
        CT_CHECK(!comm->failed, "the comm failed before the destroy (the case needs collectives in flight)");
    }
    gpu_free(ctx, &g);
    if (comm->rank == 0) CT_CHECK(comm->failed, "capex_cuda_zero_destroy: a failed in-flight collective left the NCCL comm unaborted");
    hostp_free(&h);
}

static int world_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    const world_job *j = (const world_job *)user;
    capex_cuda_stream us = NULL;
    ct_state st;
    memset(&st, 0, sizeof st);
    g_rank = rank;
    g_world = world;
    g_async = (j->mode & 2) != 0;
    if (j->dead_peer) destroy_in_flight_on(&st, ctx, comm, &j->c);
    else if (j->save[0]) ckpt_on(&st, ctx, comm, j);
    else if (j->mode & 1) equivalence_on(&st, ctx, NULL, comm, &j->c);
    else { /* a stream of its own (non-blocking): lazy emulator streams show a missing wait against the comm's */
        if (capex_cuda_stream_create(ctx, &us) != CAPEX_OK || capex_nccl_set_user_stream(comm, us) != CAPEX_OK) return 2;
        equivalence_on(&st, ctx, us, comm, &j->c);
        capex_nccl_set_user_stream(comm, NULL);
        capex_cuda_stream_destroy(ctx, us);
    }
    if (st.failed) { fprintf(stderr, "rank %d of %d: %s\n", rank, world, st.why); return 1; }
    return 0;
}

static int run_world(int world, const world_job *j, child_result *res) {
    int codes[16] = {0}, r, q;
    r = nccl_world_run(world, world_body, (void *)j, codes);
    for (q = 0; q < world; q++)
        if (codes[q]) {
            res->code = 1;
            snprintf(res->message, sizeof res->message, "world of %d: rank %d failed (%d; its stderr says why)", world, q,
                     codes[q]);
            return 1;
        }
    if (r) { res->code = 1; snprintf(res->message, sizeof res->message, "world of %d: rank 0 failed", world); }
    return r;
}

/* arg: "world stage kind halves max_norm inf_step [micro [mode]]" (mode: world_job's) */
static void child_world(const char *arg, child_result *res) {
    world_job j;
    int world = 2, kind = 0;
    memset(&j, 0, sizeof j);
    j.c.steps = 4;
    j.c.micro = 1;
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a stuck test fails instead of hanging */
    if (!arg || sscanf(arg, "%d %d %d %d %f %d %d %d", &world, &j.c.stage, &kind, &j.c.halves, &j.c.max_norm, &j.c.inf_step,
                       &j.c.micro, &j.mode) < 6) {
        res->code = 2;
        return;
    }
    j.c.kind = (capex_optim_kind)kind;
    if (run_world(world, &j, res) == 0) res->code = 0;
}

/* A world of 2 saves; worlds of 1 and 4 load, resave the same file, and step
   as the world of 2 did. */
static void child_ckpt(const char *arg, child_result *res) {
    world_job j;
    cfg c = {2, CAPEX_OPTIM_ADAM, 1, 5.0f, 1, 3, 1};
    if (arg) c.kind = (capex_optim_kind)atoi(arg); /* the file must carry its state (NovoGrad: v per tensor) */
    setenv("FAKE_NCCL_TIMEOUT", "120", 1);
    memset(&j, 0, sizeof j);
    j.c = c;
    snprintf(j.save, sizeof j.save, "/tmp/capex_zgpu_world_%d.ckpt", (int)getpid());
    if (run_world(2, &j, res)) return;
    j.load = 1;
    j.load_world = 2;
    if (run_world(1, &j, res)) return;
    if (run_world(4, &j, res)) return;
    {
        char pp[220];
        snprintf(pp, sizeof pp, "%s.params", j.save);
        remove(pp);
        remove(j.save);
    }
    res->code = 0;
}

static void child_dead_peer(const char *arg, child_result *res) {
    world_job j;
    cfg c = {1, CAPEX_OPTIM_ADAM, 1, INFINITY, -1, 1, 1};
    (void)arg;
    setenv("FAKE_NCCL_TIMEOUT", "120", 1);
    memset(&j, 0, sizeof j);
    j.c = c;
    j.dead_peer = 1;
    if (run_world(2, &j, res) == 0) res->code = 0;
}

/* SGD momentum turned on for a group created without it: refused on every
   rank, the one holding the group's only piece (its one element lands in
   one rank's shard, as in test_zero.c's momentum_on_refused_on_every_rank)
   and the one holding none, which accepted it before 2026-11-28. */
static int momentum_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    capex_zero_param zp[2];
    capex_optim_desc od;
    capex_optim_hparams hp[2], h;
    capex_cuda_zero *zg = NULL;
    capex_cuda_optim *o;
    capex_cuda_ptr p;
    int bad = 0;
    (void)world; (void)user;
    if (capex_cuda_malloc(ctx, 64, &p) != CAPEX_OK || capex_cuda_memset_u8(ctx, p, 0, 64, NULL) != CAPEX_OK) return 2;
    zp[0].data = (void *)(uintptr_t)p; zp[0].numel = 8; zp[0].dtype = CAPEX_F32; zp[0].group = 0;
    zp[1] = zp[0]; zp[1].data = (void *)(uintptr_t)(p + 32); zp[1].numel = 1; zp[1].group = 1;
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    hp[0] = hp[1] = od.defaults;
    hp[0].momentum = 0.9f;
    if (capex_cuda_zero_create(&zg, comm, zp, 2, &od, hp, 2, NULL) != CAPEX_OK) return 3;
    o = capex_cuda_zero_optim(zg);
    h = hp[1]; h.momentum = 0.5f;
    if (capex_cuda_optim_set_hparams(o, 1, &h, NULL) != CAPEX_ERR_CONFIG || !strstr(capex_last_error(), "without momentum")) {
        fprintf(stderr, "rank %d: momentum on for group 1 not refused: %s\n", rank, capex_last_error());
        bad = 4;
    }
    h = hp[0]; h.momentum = 0.0f; /* group 0 has buffers: off and on again */
    if (!bad && capex_cuda_optim_set_hparams(o, 0, &h, NULL) != CAPEX_OK) bad = 5;
    h.momentum = 0.5f;
    if (!bad && capex_cuda_optim_set_hparams(o, 0, &h, NULL) != CAPEX_OK) bad = 6;
    capex_cuda_zero_destroy(zg);
    capex_cuda_free(ctx, p);
    return bad;
}
static void child_momentum(const char *arg, child_result *res) {
    (void)arg;
    nccl_world2_child(momentum_body, res);
}

/* One rank (1) out of memory at a host allocation of its own: in
   capex_cuda_zero_create after the broadcast (the shard list, which the
   device zero makes after the base's buffers), or in capex_zero_save before
   the all-gathers (the pack buffer: one 40-float param, shards of 20). Every
   rank must fail (rank 1 CAPEX_ERR_OUT_OF_MEMORY, rank 0 CAPEX_ERR_COMM
   naming it) and stay in step: rank 0 returned OK with a zero alone, or
   waited in the all-gather. */
static int oom_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    int save = *(const int *)user, i;
    float h[40];
    capex_cuda_ptr d = 0;
    capex_zero_param p;
    capex_optim_desc od;
    capex_cuda_zero *zg = NULL;
    capex_result r;
    char path[200];
    (void)world;
    for (i = 0; i < 40; i++) h[i] = 0.125f * (float)i;
    if (capex_cuda_malloc(ctx, sizeof h, &d) != CAPEX_OK || capex_cuda_memcpy_htod(ctx, d, h, sizeof h, NULL) != CAPEX_OK)
        return 2;
    memset(&p, 0, sizeof p);
    p.data = (void *)(uintptr_t)d; p.numel = 40; p.dtype = CAPEX_F32; p.group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    snprintf(path, sizeof path, "/tmp/capex_zgpu_oom_%d", rank ? (int)getppid() : (int)getpid()); /* rank 0 writes it */
    if (save && capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL) != CAPEX_OK) return 3;
    if (rank == 1) g_fail_alloc_size = save ? sizeof(float) * 21 : sizeof(capex_tensor) * 2;
    r = save ? capex_zero_save_file(capex_cuda_zero_base(zg), path, 0) : capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL);
    if (g_fail_alloc_size) { fprintf(stderr, "rank %d: the chosen allocation never came\n", rank); return 4; }
    if (rank == 1 ? r != CAPEX_ERR_OUT_OF_MEMORY : r != CAPEX_ERR_COMM || !strstr(capex_last_error(), "rank 1 failed")) {
        fprintf(stderr, "rank %d: rank 1 out of memory in %s: %s (%s)\n", rank, save ? "save" : "create",
                capex_result_string(r), capex_last_error());
        return 5;
    }
    if (!save && zg) return 6; /* no rank keeps a zero its peer lacks */
    if (capex_comm_barrier(comm) != CAPEX_OK) return 7; /* in step */
    if (!save && capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL) != CAPEX_OK) return 8;
    if (capex_zero_save_file(capex_cuda_zero_base(zg), path, 0) != CAPEX_OK) return 9;
    if (rank == 0) remove(path);
    capex_cuda_zero_destroy(zg);
    capex_cuda_free(ctx, d);
    return 0;
}
static void child_oom(const char *arg, child_result *res) {
    int codes[16] = {0}, r, save = arg && atoi(arg);
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a hang guard: a rank left waiting fails instead of hanging */
    r = nccl_world_run(2, oom_body, &save, codes);
    res->code = r || codes[1] ? 1 : 0;
    snprintf(res->message, sizeof res->message, "rank 0: %d, rank 1: %d (their stderr says why)", codes[0], codes[1]);
}

/* The same on a device comm whose vtable has no host_buffer (a custom one;
   here NCCL's without it), from rank 1's device allocations failing
   (CAPEX_EMU_FAIL_ALLOC, rank 1 alone): at create from its second one on
   (the first is the create's exchange buffer), at save from the first (the
   pack buffers). The create's model check and agreement and the save's
   agreement go through that buffer, so rank 1 fails with
   CAPEX_ERR_OUT_OF_MEMORY, rank 0 with CAPEX_ERR_COMM, and both stay in
   step. Before 2026-11-29 each of those exchanges allocated its device
   buffer: rank 1 failed that alone and left rank 0 in the collective. */
static capex_comm_vtable g_novt_vt;
static int novt_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    int save = *(const int *)user, i, bad = 0;
    const capex_comm_vtable *vt0 = comm->vt;
    float h[40];
    capex_cuda_ptr d = 0;
    capex_zero_param p;
    capex_optim_desc od;
    capex_cuda_zero *zg = NULL;
    capex_result r;
    char path[200];
    (void)world;
    g_novt_vt = *comm->vt;
    g_novt_vt.host_buffer = NULL;
    comm->vt = &g_novt_vt;
    for (i = 0; i < 40; i++) h[i] = 0.125f * (float)i;
    if (capex_cuda_malloc(ctx, sizeof h, &d) != CAPEX_OK || capex_cuda_memcpy_htod(ctx, d, h, sizeof h, NULL) != CAPEX_OK)
        return 2;
    memset(&p, 0, sizeof p);
    p.data = (void *)(uintptr_t)d; p.numel = 40; p.dtype = CAPEX_F32; p.group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    snprintf(path, sizeof path, "/tmp/capex_zgpu_novt_%d", rank ? (int)getppid() : (int)getpid()); /* rank 0 writes it */
    if (save && capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL) != CAPEX_OK) return 3;
    if (rank == 1) setenv("CAPEX_EMU_FAIL_ALLOC", save ? "0" : "1", 1);
    r = save ? capex_zero_save_file(capex_cuda_zero_base(zg), path, 0) : capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL);
    if (rank == 1) unsetenv("CAPEX_EMU_FAIL_ALLOC");
    if (rank == 1 ? r != CAPEX_ERR_OUT_OF_MEMORY : r != CAPEX_ERR_COMM) {
        fprintf(stderr, "rank %d: rank 1 out of device memory in %s: %s (%s)\n", rank, save ? "save" : "create",
                capex_result_string(r), capex_last_error());
        bad = 5;
    }
    if (!bad && !save && zg) bad = 6; /* no rank keeps a zero its peer lacks */
    if (!bad && capex_comm_barrier(comm) != CAPEX_OK) bad = 7; /* in step */
    if (!bad && !save && capex_cuda_zero_create(&zg, comm, &p, 1, &od, NULL, 1, NULL) != CAPEX_OK) bad = 8;
    if (!bad && capex_zero_save_file(capex_cuda_zero_base(zg), path, 0) != CAPEX_OK) bad = 9;
    if (rank == 0) remove(path);
    capex_cuda_zero_destroy(zg);
    capex_cuda_free(ctx, d);
    comm->vt = vt0;
    return bad;
}
static void child_novt(const char *arg, child_result *res) {
    int codes[16] = {0}, r, save = arg && atoi(arg);
    setenv("FAKE_NCCL_TIMEOUT", "30", 1); /* a hang guard: a rank left waiting fails instead of hanging */
    r = nccl_world_run(2, novt_body, &save, codes);
    res->code = r || codes[1] ? 1 : 0;
    snprintf(res->message, sizeof res->message, "rank 0: %d, rank 1: %d (their stderr says why)", codes[0], codes[1]);
}

/* CT_CHECK without the return: every rank runs the whole sequence of collectives. */
#define LF_CHECK(cond, ...) do { if (!(cond)) ct_fail(ct, __FILE__, __LINE__, #cond, __VA_ARGS__); } while (0)
#define LF_OK(call) LF_CHECK((call) == CAPEX_OK, "%s: %s", #call, capex_last_error())
/* The device zero's state on this rank: its params' data, then every
   piece's master and moments and each group's step (through to_host); returns the length. */
static size_t dev_state(ct_state *ct, capex_cuda_context *ctx, const cfg *c, const gpu_run *g, unsigned char *out, size_t cap) {
    capex_optim *h = NULL;
    size_t n = 0, k;
    int i;
#define DS_PUT(ptr, bytes) do { if ((ptr) && n + (bytes) <= cap) memcpy(out + n, (ptr), (bytes)); n += (bytes); } while (0)
    for (i = 0; i < NP; i++) {
        if (n + bytes_of(c, i) <= cap && bytes_of(c, i)) LF_OK(capex_cuda_memcpy_dtoh(ctx, out + n, g->p[i], bytes_of(c, i), NULL));
        n += bytes_of(c, i);
    }
    LF_OK(capex_cuda_optim_to_host(capex_cuda_zero_optim(g->zg), CAPEX_OPTIM_STATE_PARAMS, NULL, &h));
    for (k = 0; h && k < h->ntensors; k++) {
        const capex_optim_param *p = &h->tensors[k].p;
        size_t bytes = sizeof(float) * (size_t)p->numel;
        DS_PUT(p->param, bytes);
        DS_PUT(p->exp_avg, bytes);
        DS_PUT(p->exp_avg_sq, bytes);
    }
    for (k = 0; h && k < h->ngroups; k++) DS_PUT(&h->groups[k].step, sizeof h->groups[k].step);
#undef DS_PUT
    capex_optim_destroy(h);
    return n;
}

/* capex_zero_load on the device zero is collective: rank 1's load of a
   truncated file fails both ranks (rank 1 its own error, rank 0
   CAPEX_ERR_COMM naming it) with nothing changed on either, in step; a good
   load then steps as a twin that never failed, bit for bit (before
   2026-11-28 rank 0 returned OK and took the file alone). Every rank runs
   the whole sequence whatever a check said, so none waits on another. */
static void load_fail_on(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, int rank) {
    static unsigned char before[65536], after[65536];
    cfg c = {1, CAPEX_OPTIM_ADAM, 1, 5.0f, -1, 3, 1};
    gpu_run g, twin;
    hostp h;
    char path[200], bad[220];
    size_t n0, n1;
    capex_result r;
    snprintf(path, sizeof path, "/tmp/capex_zgpu_lf_%d", rank ? (int)getppid() : (int)getpid()); /* rank 0 writes it */
    snprintf(bad, sizeof bad, "%s.bad", path);
    hostp_init(&c, &h);
    gpu_create(ct, ctx, comm, &c, &g, &h);
    if (!ct->failed) gpu_create(ct, ctx, comm, &c, &twin, &h);
    if (ct->failed) return;
    gpu_steps(ct, ctx, NULL, &c, &g, 0, 2);
    gpu_steps(ct, ctx, NULL, &c, &twin, 0, 2);
    LF_OK(capex_zero_save_file(capex_cuda_zero_base(g.zg), path, CAPEX_OPTIM_STATE_PARAMS));
    gpu_steps(ct, ctx, NULL, &c, &g, 2, 3); /* the state now differs from the file's */
    gpu_steps(ct, ctx, NULL, &c, &twin, 2, 3);
    if (rank == 1) { /* the first half of the good file */
        static char buf[1 << 16];
        FILE *f = fopen(path, "rb"), *o = fopen(bad, "wb");
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        LF_CHECK(f && o && n > 100 && n < sizeof buf && fwrite(buf, 1, n / 2, o) == n / 2, "truncated copy of %s", path);
        if (f) fclose(f);
        if (o) fclose(o);
    }
    n0 = dev_state(ct, ctx, &c, &g, before, sizeof before);
    r = capex_zero_load_file(capex_cuda_zero_base(g.zg), rank == 1 ? bad : path, CAPEX_OPTIM_STATE_PARAMS);
    LF_CHECK(rank == 1 ? r != CAPEX_OK && r != CAPEX_ERR_COMM : r == CAPEX_ERR_COMM && strstr(capex_last_error(), "rank 1 failed"),
             "rank 1's load fails: %s (%s)", capex_result_string(r), capex_last_error());
    n1 = dev_state(ct, ctx, &c, &g, after, sizeof after);
    LF_CHECK(n0 <= sizeof before && n1 == n0 && memcmp(before, after, n0) == 0, "a failed load changed this rank's state");
    LF_OK(capex_comm_barrier(comm)); /* in step */
    LF_OK(capex_zero_load_file(capex_cuda_zero_base(g.zg), path, CAPEX_OPTIM_STATE_PARAMS));
    LF_OK(capex_zero_load_file(capex_cuda_zero_base(twin.zg), path, CAPEX_OPTIM_STATE_PARAMS));
    gpu_steps(ct, ctx, NULL, &c, &g, 3, 5);
    gpu_steps(ct, ctx, NULL, &c, &twin, 3, 5);
    n0 = dev_state(ct, ctx, &c, &g, before, sizeof before);
    n1 = dev_state(ct, ctx, &c, &twin, after, sizeof after);
    LF_CHECK(n1 == n0 && memcmp(before, after, n0) == 0, "after a failed load and a good one, the run differs from its twin's");
    LF_OK(capex_comm_barrier(comm)); /* every rank read the file */
    if (rank == 0) remove(path);
    else remove(bad);
    gpu_free(ctx, &g);
    gpu_free(ctx, &twin);
    hostp_free(&h);
}
#undef LF_OK
#undef LF_CHECK
static int load_fail_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    ct_state st;
    (void)user;
    memset(&st, 0, sizeof st);
    g_rank = rank;
    g_world = world;
    g_async = 0;
    load_fail_on(&st, ctx, comm, rank);
    if (st.failed) { fprintf(stderr, "rank %d: %s\n", rank, st.why); return 1; }
    return 0;
}
static void child_load_fail(const char *arg, child_result *res) {
    (void)arg;
    nccl_world2_child(load_fail_body, res);
}

/* Rank 1's device allocations (stage 1) or event creations (stage 2) fail
   after create (the emulator's CAPEX_EMU_FAIL_ALLOC / _EVENT, rank 1
   alone): the reduce-scatters, their half shards' average (in the comm's
   f32 scratch), the all-gathers and the device step need none, so two
   Adam steps succeed on both ranks; one rank failing there would leave the
   other waiting in a collective. Before 2026-11-28 each nonblocking call
   created its event and the first half average grew the scratch. Stage 2's
   pool of lent grad buffers holds one from create (a backward in bucket
   order lends no other); before 2026-11-28 the first lend allocated it, in
   the first step. CAPEX_EMU_FAIL_MODULE: what a step and grad_norm launch (the
   optimizer's kernels, the norm's sums, LAMB's ratio pass) is loaded by
   create, inside its agreement; before 2026-11-28 it loaded at the first
   grad_norm or step, where rank 1 failed alone while rank 0 waited in the
   norm's allreduce or the all-gather; stage 2's accumulation (two
   finalizes a step; f32 grads summed, not averaged, so that nothing else
   loads its add) loads its kernel at create too (before, rank 1 loaded it
   alone at the second finalize). CAPEX_EMU_FAIL_ALLOC with half buckets
   and two finalizes a step ("acc_halves"): the half shards' sum
   needs no scratch (before 2026-11-28 the second finalize allocated an f32
   one on rank 1 alone). arg: "variable stage [lamb|accumulate|acc_halves]". */
static const char *g_zinject;
static int nofail_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    const cfg *c = (const cfg *)user;
    gpu_run g;
    hostp h;
    ct_state st;
    memset(&st, 0, sizeof st);
    g_rank = rank;
    g_world = world;
    hostp_init(c, &h);
    gpu_create(&st, ctx, comm, c, &g, &h);
    if (!st.failed) {
        if (rank == 1) setenv(g_zinject, "0", 1);
        gpu_steps(&st, ctx, NULL, c, &g, 0, c->steps);
        if (rank == 1) unsetenv(g_zinject);
        gpu_free(ctx, &g);
    }
    hostp_free(&h);
    if (st.failed) { fprintf(stderr, "rank %d (%s=0 on rank 1): %s\n", rank, g_zinject, st.why); return 1; }
    return 0;
}
static void child_nofail(const char *arg, child_result *res) {
    static char kind[64], opt[16];
    static cfg c;
    int codes[16] = {0}, r;
    memset(&c, 0, sizeof c);
    c.kind = CAPEX_OPTIM_ADAM; c.halves = 1; c.max_norm = INFINITY; c.inf_step = -1; c.steps = 2; c.micro = 1;
    opt[0] = '\0';
    if (!arg || sscanf(arg, "%63s %d %15s", kind, &c.stage, opt) < 2) { res->code = 2; return; }
    if (!strcmp(opt, "lamb")) { c.kind = CAPEX_OPTIM_LAMB; c.max_norm = 5.0f; }
    if (!strcmp(opt, "accumulate")) { c.micro = 2; c.halves = 0; g_sum_grads = 1; } /* f32 summed: nothing else loads the add */
    if (!strcmp(opt, "acc_halves")) c.micro = 2; /* f32, bf16 and f16 buckets, two finalizes a step */
    g_zinject = kind;
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a hang guard */
    r = nccl_world_run(2, nofail_body, &c, codes);
    res->code = r || codes[1] ? 1 : 0;
    snprintf(res->message, sizeof res->message, "rank 0: %d, rank 1: %d (their stderr says why)", codes[0], codes[1]);
}

/* A change after create that selects other kernels for the step, with
   rank 1's module loads failing (CAPEX_EMU_FAIL_MODULE=0, rank 1 alone):
   SGD momentum turned off in group 0 (set_hparams: the no-momentum
   variant), an lr schedule attached (set_lr_schedule: its kernel's part),
   a file saved in other modes loaded (capex_zero_load: Adam's L2 variant;
   the file from a host zero). The change loads them: set_hparams and
   set_lr_schedule fail on rank 1 with nothing changed, which repeats the
   change once loads work again; the load fails both ranks in its
   agreement (rank 0 CAPEX_ERR_COMM naming rank 1), then both load again.
   Both ranks step after each try (rank 1 the first time with its loads
   still failing: its step loads nothing). Before 2026-11-29 every change
   returned OK and rank 1 failed alone at the next step's load while rank
   0 waited in the all-gather (FAKE_NCCL_TIMEOUT: the hang guard). Every
   rank runs the whole sequence whatever a check said. */
#define CH_CHECK(cond, ...) do { if (!(cond)) ct_fail(ct, __FILE__, __LINE__, #cond, __VA_ARGS__); } while (0)
static void change_fail_on(ct_state *ct, capex_cuda_context *ctx, capex_comm *comm, int rank, const char *mode) {
    int modes = !strcmp(mode, "modes"), sched = !strcmp(mode, "sched");
    cfg c = {1, modes || sched ? CAPEX_OPTIM_ADAM : CAPEX_OPTIM_SGD, 1, 5.0f, -1, 3, 1};
    capex_cuda_optim *o;
    capex_optim_desc od;
    capex_optim_hparams hp[2];
    capex_lr_schedule s;
    gpu_run g;
    hostp h;
    char path[200];
    capex_result r;
    int again;
    snprintf(path, sizeof path, "/tmp/capex_zgpu_chg_%d_%d", (int)getpid(), rank);
    hostp_init(&c, &h);
    if (modes) { /* the file: a host zero (no device) in Adam's L2 mode, one step */
        host_run hr;
        g_alt_modes = 1;
        host_create(ct, &c, &hr, &h);
        g_alt_modes = 0;
        host_steps(ct, &c, &hr, 0, 1);
        CH_CHECK(capex_zero_save_file(hr.z, path, 0) == CAPEX_OK, "save: %s", capex_last_error());
        host_free(&hr);
    }
    gpu_create(ct, ctx, comm, &c, &g, &h);
    if (ct->failed) return;
    o = capex_cuda_zero_optim(g.zg);
    od_of(&c, &od, hp);
    hp[0].momentum = 0.0f;
    hp[0].nesterov = 0;
    sched_of(&s);
    for (again = 0; again < 2; again++) {
        if (rank == 1 && !again) setenv("CAPEX_EMU_FAIL_MODULE", "0", 1);
        if (rank == 1 || !again || modes) { /* a load is collective */
            r = modes ? capex_zero_load_file(capex_cuda_zero_base(g.zg), path, 0)
                : sched ? capex_cuda_optim_set_lr_schedule(o, &s, NULL) : capex_cuda_optim_set_hparams(o, 0, &hp[0], NULL);
            if (!again) CH_CHECK(rank == 1 ? r != CAPEX_OK && r != CAPEX_ERR_COMM
                                           : r == (modes ? CAPEX_ERR_COMM : CAPEX_OK) &&
                                                 (!modes || strstr(capex_last_error(), "rank 1 failed")),
                                 "%s with rank 1's module loads failing, on rank %d: %s (%s)", mode, rank,
                                 capex_result_string(r), capex_last_error());
            else CH_CHECK(r == CAPEX_OK, "%s again: %s", mode, capex_last_error());
        }
        /* rank 1 steps as before the change, its loads still failing */
        gpu_steps(ct, ctx, NULL, &c, &g, again, again + 1);
        if (rank == 1 && !again) unsetenv("CAPEX_EMU_FAIL_MODULE");
    }
    CH_CHECK(capex_comm_barrier(comm) == CAPEX_OK, "barrier: %s", capex_last_error()); /* in step */
    if (modes) remove(path);
    gpu_free(ctx, &g);
    hostp_free(&h);
}
#undef CH_CHECK
static int change_fail_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    ct_state st;
    memset(&st, 0, sizeof st);
    g_rank = rank;
    g_world = world;
    g_async = 0;
    change_fail_on(&st, ctx, comm, rank, (const char *)user);
    if (st.failed) { fprintf(stderr, "rank %d (%s): %s\n", rank, (const char *)user, st.why); return 1; }
    return 0;
}
static void child_change_fail(const char *arg, child_result *res) {
    static char mode[16];
    int codes[16] = {0}, r;
    if (!arg || sscanf(arg, "%15s", mode) != 1) { res->code = 2; return; }
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a hang guard */
    r = nccl_world_run(2, change_fail_body, mode, codes);
    res->code = r || codes[1] ? 1 : 0;
    snprintf(res->message, sizeof res->message, "rank 0: %d, rank 1: %d (their stderr says why)", codes[0], codes[1]);
}

static const child_entry children[] = {{"world", child_world}, {"ckpt", child_ckpt}, {"dead_peer", child_dead_peer},
                                       {"momentum", child_momentum}, {"oom", child_oom}, {"novt", child_novt},
                                       {"load_fail", child_load_fail}, {"nofail", child_nofail},
                                       {"change_fail", child_change_fail}};

#define NEED_FAKE_WORLD()                                                                                   \
    do {                                                                                                    \
        const char *np_ = getenv("CAPEX_NCCL_PATH"), *lp_ = getenv("CAPEX_LIBCUDA_PATH");                   \
        if (!np_ || !strstr(np_, "fake")) CT_SKIP("several ranks need a GPU each; the stand-in NCCL runs them on the emulator"); \
        if (!lp_ || strstr(lp_, "fake")) CT_SKIP("kernels need the emulator driver (CAPEX_LIBCUDA_PATH)");  \
    } while (0)

static void world_case(ct_state *ct, const char *arg) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("world", arg);
    CT_CHECK(r.exited_ok && r.code == 0, "world %s: %s (code %d)", arg, r.message, r.code);
}
CT_TEST(world2_adamw_stage1_halves_clip_inf) { world_case(ct, "2 1 0 1 5 2"); }
CT_TEST(world2_adamw_stage2_halves_inf_step_async) { world_case(ct, "2 2 0 1 inf 1 1 2"); }
CT_TEST(world2_sgd_stage2_clip_legacy_stream) { world_case(ct, "2 2 2 0 5 -1 1 1"); }
CT_TEST(world4_adamw_stage2_halves_clip_inf_step_async) { world_case(ct, "4 2 0 1 5 2 1 2"); }
CT_TEST(world4_sgd_stage1_halves_inf) { world_case(ct, "4 1 2 1 inf 1"); }
CT_TEST(world2_lamb_stage2_halves_clip_inf) { world_case(ct, "2 2 1 1 5 2"); }
CT_TEST(world4_lamb_stage1_f32) { world_case(ct, "4 1 1 0 inf -1"); }
CT_TEST(world2_novograd_stage1_halves_clip_inf) { world_case(ct, "2 1 4 1 5 2"); }
CT_TEST(world4_novograd_stage2_f32) { world_case(ct, "4 2 4 0 inf -1"); }
CT_TEST(world2_adamw_stage2_halves_two_micro_batches) { world_case(ct, "2 2 0 1 5 1 2"); }
static void ckpt_worlds(ct_state *ct, const char *kind) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("ckpt", kind);
    CT_CHECK(r.exited_ok && r.code == 0, "%s (code %d)", r.message, r.code);
}
/* A world child whose every rank must end with code 0. */
static void rank_case(ct_state *ct, const char *child, const char *arg) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child(child, arg);
    CT_CHECK(r.exited_ok && r.code == 0, "%s %s: %s (code %d)", child, arg, r.message, r.code);
}
static void nofail_case(ct_state *ct, const char *arg) { rank_case(ct, "nofail", arg); }
CT_TEST(world2_stage1_step_allocates_no_device_memory) { nofail_case(ct, "CAPEX_EMU_FAIL_ALLOC 1"); }
CT_TEST(world2_stage2_step_creates_no_event) { nofail_case(ct, "CAPEX_EMU_FAIL_EVENT 2"); }
CT_TEST(world2_stage2_step_allocates_no_device_memory) { nofail_case(ct, "CAPEX_EMU_FAIL_ALLOC 2"); }
CT_TEST(world2_stage1_step_loads_no_kernel) { nofail_case(ct, "CAPEX_EMU_FAIL_MODULE 1"); }
CT_TEST(world2_stage2_lamb_step_loads_no_kernel) { nofail_case(ct, "CAPEX_EMU_FAIL_MODULE 2 lamb"); }
CT_TEST(world2_stage2_accumulation_loads_no_kernel) { nofail_case(ct, "CAPEX_EMU_FAIL_MODULE 2 accumulate"); }
CT_TEST(world2_stage2_half_accumulation_allocates_no_device_memory) {
    nofail_case(ct, "CAPEX_EMU_FAIL_ALLOC 2 acc_halves");
}
static void change_fail_case(ct_state *ct, const char *mode) { rank_case(ct, "change_fail", mode); }
CT_TEST(world2_momentum_off_loads_at_the_change) { change_fail_case(ct, "momentum"); }
CT_TEST(world2_lr_schedule_loads_at_the_change) { change_fail_case(ct, "sched"); }
CT_TEST(world2_load_other_modes_loads_in_its_agreement) { change_fail_case(ct, "modes"); }
CT_TEST(checkpoint_across_world_sizes) { ckpt_worlds(ct, "0"); }
CT_TEST(checkpoint_across_world_sizes_novograd) { ckpt_worlds(ct, "4"); }
CT_TEST(world2_momentum_on_refused_on_every_rank) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("momentum", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s (code %d)", r.message, r.code);
}
CT_TEST(world2_destroy_in_flight_dead_peer_aborts) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("dead_peer", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s (code %d)", r.message, r.code);
}
CT_TEST(world2_one_rank_out_of_memory_fails_both) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("oom", "0");
    CT_CHECK(r.exited_ok && r.code == 0, "create: %s (code %d)", r.message, r.code);
    r = run_child("oom", "1");
    CT_CHECK(r.exited_ok && r.code == 0, "save: %s (code %d)", r.message, r.code);
}
CT_TEST(world2_no_host_buffer_device_oom_fails_both) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("novt", "0");
    CT_CHECK(r.exited_ok && r.code == 0, "create: %s (code %d)", r.message, r.code);
    r = run_child("novt", "1");
    CT_CHECK(r.exited_ok && r.code == 0, "save: %s (code %d)", r.message, r.code);
}
CT_TEST(world2_one_rank_load_fails_both) {
    child_result r;
    NEED_FAKE_WORLD();
    r = run_child("load_fail", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s (code %d)", r.message, r.code);
}

static const ct_case cases[] = {CT_CASE(adamw_stage1_f32), CT_CASE(adamw_stage2_halves), CT_CASE(adamw_stage1_halves_clip),
                                CT_CASE(sgd_stage1_halves), CT_CASE(sgd_stage2_clip), CT_CASE(adagrad_stage2),
                                CT_CASE(adamw_stage2_two_micro_batches), CT_CASE(lamb_stage1_halves_clip),
                                CT_CASE(adamw_stage2_halves_two_micro_batches), CT_CASE(novograd_stage2_halves),
                                CT_CASE(norm_kernel_edge_cases), CT_CASE(half_accumulation_kernel_bits), CT_CASE(checkpoint_matches_host_and_loads), CT_CASE(checkpoint_lamb_stage2), CT_CASE(checkpoint_novograd_stage1), CT_CASE(checkpoint_sgd_momentum_turned_off), CT_CASE(checkpoint_lr_schedule_count_skipped),
                                CT_CASE(checkpoint_other_modes_adam), CT_CASE(checkpoint_other_modes_sgd_stage2),
                                CT_CASE(checkpoint_other_modes_adagrad), CT_CASE(checkpoint_other_modes_lamb_stage2),
                                CT_CASE(checkpoint_other_modes_novograd),
                                CT_CASE(refusals), CT_CASE(world2_adamw_stage1_halves_clip_inf),
                                CT_CASE(world2_adamw_stage2_halves_inf_step_async), CT_CASE(world2_sgd_stage2_clip_legacy_stream),
                                CT_CASE(world4_adamw_stage2_halves_clip_inf_step_async), CT_CASE(world4_sgd_stage1_halves_inf),
                                CT_CASE(world2_lamb_stage2_halves_clip_inf), CT_CASE(world4_lamb_stage1_f32),
                                CT_CASE(world2_adamw_stage2_halves_two_micro_batches),
                                CT_CASE(world2_novograd_stage1_halves_clip_inf), CT_CASE(world4_novograd_stage2_f32),
                                CT_CASE(checkpoint_across_world_sizes), CT_CASE(checkpoint_across_world_sizes_novograd),
                                CT_CASE(world2_stage1_step_allocates_no_device_memory),
                                CT_CASE(world2_stage2_step_creates_no_event),
                                CT_CASE(world2_stage2_step_allocates_no_device_memory), CT_CASE(world2_stage1_step_loads_no_kernel), CT_CASE(world2_stage2_lamb_step_loads_no_kernel),
                                CT_CASE(world2_stage2_accumulation_loads_no_kernel),
                                CT_CASE(world2_stage2_half_accumulation_allocates_no_device_memory),
                                CT_CASE(world2_destroy_in_flight_dead_peer_aborts), CT_CASE(world2_momentum_on_refused_on_every_rank),
                                CT_CASE(world2_one_rank_out_of_memory_fails_both), CT_CASE(world2_one_rank_load_fails_both),
                                CT_CASE(world1_create_leaves_grad_norm_kernels_unloaded), CT_CASE(set_lr_keeps_the_step_kernels_ready),
                                CT_CASE(world2_momentum_off_loads_at_the_change), CT_CASE(world2_lr_schedule_loads_at_the_change),
                                CT_CASE(world2_load_other_modes_loads_in_its_agreement),
                                CT_CASE(world2_no_host_buffer_device_oom_fails_both)};
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
