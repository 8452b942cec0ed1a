/* train_charlm.c - capex's end-to-end example: a character-level language
   model written in plain C, trained with capex's mixed precision (opt levels
   O0-O3, fp16 or bf16), loss scaler, fused AdamW / LAMB / SGD with fp32
   master weights, gradient clipping, distributed sampler, DDP buckets (one
   or more ranks) and checkpoint / resume.

     make run                               # O0 vs O2 fp16 on the CPU, chart
     build/examples/train_charlm --opt O2 --half bf16 --optim lamb
     mpirun -np 2 build/examples/train_charlm_mpi --steps 500

   The model is small on purpose (a 2-core machine trains it in about a
   minute); every capex call it makes is the one a bigger engine makes. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- data: text from the system, split into train / validation ---------- */

typedef struct text_data {
    unsigned char *bytes; /* token ids, 0..vocab-1 */
    size_t n, n_train;    /* first n_train tokens train, the rest validate */
    int vocab;
    unsigned char chars[256]; /* id -> byte */
} text_data;

/* The default corpus is the licence texts every Debian/Ubuntu system ships
   (base-files): ~250 KB of English prose, no download needed. */
static const char *default_corpus[] = {
    "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2", "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/LGPL-3", "/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/Artistic",
    "/usr/share/common-licenses/MPL-1.1", "/usr/share/common-licenses/MPL-2.0", "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/GPL-1", "/usr/share/common-licenses/LGPL-2", "/usr/share/common-licenses/CC0-1.0",
};

static int append_file(const char *path, unsigned char **buf, size_t *n, size_t *cap) {
    FILE *f = fopen(path, "rb");
    size_t got;
    if (!f) return 0;
    for (;;) {
        if (*cap - *n < 65536) {
            size_t nc = *cap * 2 + 65536;
            unsigned char *nb = (unsigned char *)realloc(*buf, nc);
            if (!nb) { fclose(f); return 0; }
            *buf = nb; *cap = nc;
        }
        got = fread(*buf + *n, 1, *cap - *n, f);
        *n += got;
        if (got == 0) break;
    }
    fclose(f);
    return 1;
}

static int load_text(const char *path, double val_fraction, text_data *d) {
    unsigned char *raw = NULL;
    size_t n = 0, cap = 0, i;
    int map[256], files = 0;
    memset(d, 0, sizeof *d);
    if (path) files = append_file(path, &raw, &n, &cap);
    else
        for (i = 0; i < sizeof default_corpus / sizeof default_corpus[0]; i++) files += append_file(default_corpus[i], &raw, &n, &cap);
    if (!files || n < 4096) {
        fprintf(stderr, "no training text: %s (give a text file with --data FILE)\n", path ? path : "/usr/share/common-licenses/* not found");
        free(raw);
        return 0;
    }
    for (i = 0; i < 256; i++) map[i] = -1;
    for (i = 0; i < n; i++) map[raw[i]] = 0;
    for (i = 0; i < 256; i++)
        if (map[i] == 0) { d->chars[d->vocab] = (unsigned char)i; map[i] = d->vocab++; }
    for (i = 0; i < n; i++) raw[i] = (unsigned char)map[raw[i]];
    d->bytes = raw;
    d->n = n;
    d->n_train = (size_t)((double)n * (1.0 - val_fraction));
    return 1;
}

/* ---- model: character MLP language model (Bengio et al. 2003) ------------
   x = concat(emb[c_1..c_T]); h = tanh(W1 x + b1); logits = W2 h + b2.
   All weights live in one flat vector so the optimizer, DDP buckets and
   checkpoints see a handful of contiguous tensors. Mixed precision is
   emulated faithfully: the forward reads the weights as the compute sees them
   (rounded to half under O1-O3), matmul outputs and activations are rounded to
   the half type (fp32 accumulation, as on tensor cores), softmax and the loss
   run in fp32 (the O1 cast policy), and gradients leave in the grad dtype. */

enum { P_EMB, P_W1, P_B1, P_W2, P_B2, P_COUNT };

typedef struct model {
    int vocab, ctx, emb, hidden, batch;
    int64_t off[P_COUNT + 1]; /* tensor i is [off[i], off[i+1]) of the flat vector */
    int64_t n_params;
    capex_dtype act; /* activation / matmul dtype: CAPEX_F32 = plain fp32 */
    float *x, *h, *probs, *dlogits, *dh, *dx; /* per-batch buffers */
} model;

static float round_to(float v, capex_dtype t) {
    return t == CAPEX_F16 ? capex_f16_to_f32(capex_f32_to_f16(v)) : t == CAPEX_BF16 ? capex_bf16_to_f32(capex_f32_to_bf16(v)) : v;
}
static void round_array(float *a, int64_t n, capex_dtype t) {
    int64_t i;
    if (t == CAPEX_F32) return;
    for (i = 0; i < n; i++) a[i] = round_to(a[i], t);
}

static int model_init(model *m, int vocab, int ctx, int emb, int hidden, int batch, capex_dtype act) {
    int64_t sizes[P_COUNT];
    int i;
    memset(m, 0, sizeof *m);
    m->vocab = vocab; m->ctx = ctx; m->emb = emb; m->hidden = hidden; m->batch = batch; m->act = act;
    sizes[P_EMB] = (int64_t)vocab * emb;
    sizes[P_W1] = (int64_t)hidden * ctx * emb;
    sizes[P_B1] = hidden;
    sizes[P_W2] = (int64_t)vocab * hidden;
    sizes[P_B2] = vocab;
    m->off[0] = 0;
    for (i = 0; i < P_COUNT; i++) m->off[i + 1] = m->off[i] + sizes[i];
    m->n_params = m->off[P_COUNT];
    m->x = (float *)calloc((size_t)batch * ctx * emb, sizeof(float));
    m->h = (float *)calloc((size_t)batch * hidden, sizeof(float));
    m->probs = (float *)calloc((size_t)batch * vocab, sizeof(float));
    m->dlogits = (float *)calloc((size_t)batch * vocab, sizeof(float));
    m->dh = (float *)calloc((size_t)batch * hidden, sizeof(float));
    m->dx = (float *)calloc((size_t)batch * ctx * emb, sizeof(float));
    return m->x && m->h && m->probs && m->dlogits && m->dh && m->dx;
}

static void model_free(model *m) {
    free(m->x); free(m->h); free(m->probs); free(m->dlogits); free(m->dh); free(m->dx);
}

/* Deterministic init from a seed: emb ~ N(0,1)-ish, W ~ U(-1/sqrt(fan_in), +). */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static void model_init_weights(const model *m, float *w, uint64_t seed) {
    int64_t i;
    float s1 = 1.0f / sqrtf((float)(m->ctx * m->emb)), s2 = 1.0f / sqrtf((float)m->hidden);
    for (i = m->off[P_EMB]; i < m->off[P_EMB + 1]; i++) w[i] = rng_uniform(&seed) * 1.7f;
    for (i = m->off[P_W1]; i < m->off[P_W1 + 1]; i++) w[i] = rng_uniform(&seed) * s1;
    for (i = m->off[P_B1]; i < m->off[P_B1 + 1]; i++) w[i] = 0.0f;
    for (i = m->off[P_W2]; i < m->off[P_W2 + 1]; i++) w[i] = rng_uniform(&seed) * s2;
    for (i = m->off[P_B2]; i < m->off[P_B2 + 1]; i++) w[i] = 0.0f;
}

/* Mean cross-entropy of the batch; keeps activations for model_backward.
   tokens[b*(ctx+1) .. +ctx] are the context, the last one the target. */
static float model_forward(model *m, const float *w, const unsigned char *tokens) {
    const int B = m->batch, T = m->ctx, E = m->emb, H = m->hidden, V = m->vocab, D = T * E;
    const float *emb = w + m->off[P_EMB], *W1 = w + m->off[P_W1], *b1 = w + m->off[P_B1];
    const float *W2 = w + m->off[P_W2], *b2 = w + m->off[P_B2];
    double loss = 0;
    int b;
    for (b = 0; b < B; b++) {
        int t;
        for (t = 0; t < T; t++) memcpy(m->x + (size_t)b * D + t * E, emb + (size_t)tokens[b * (T + 1) + t] * E, E * sizeof(float));
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (b = 0; b < B; b++) {
        const float *x = m->x + (size_t)b * D;
        float *h = m->h + (size_t)b * H, *p = m->probs + (size_t)b * V, mx = -INFINITY, sum = 0;
        int j, k, v;
        for (j = 0; j < H; j++) {
            const float *wr = W1 + (size_t)j * D;
            float acc = 0;
            for (k = 0; k < D; k++) acc += wr[k] * x[k];
            h[j] = round_to(tanhf(round_to(acc + b1[j], m->act)), m->act);
        }
        for (v = 0; v < V; v++) {
            const float *wr = W2 + (size_t)v * H;
            float acc = 0;
            for (j = 0; j < H; j++) acc += wr[j] * h[j];
            p[v] = round_to(acc + b2[v], m->act); /* logits, half under mixed precision */
            if (p[v] > mx) mx = p[v];
        }
        for (v = 0; v < V; v++) { p[v] = expf(p[v] - mx); sum += p[v]; } /* softmax in fp32 */
        for (v = 0; v < V; v++) p[v] /= sum;
    }
    for (b = 0; b < B; b++) loss -= log((double)m->probs[(size_t)b * V + tokens[b * (T + 1) + T]] + 1e-30);
    return (float)(loss / B);
}

/* Gradient of (loss * scale) with respect to w, accumulated into g (fp32).
   The caller rounds g to the grad dtype. Deterministic: each output row is
   owned by one thread and the embedding scatter is serial. */
static void model_backward(model *m, const float *w, const unsigned char *tokens, float scale, float *g) {
    const int B = m->batch, T = m->ctx, E = m->emb, H = m->hidden, V = m->vocab, D = T * E;
    const float *W1 = w + m->off[P_W1], *W2 = w + m->off[P_W2];
    float *gemb = g + m->off[P_EMB], *gW1 = g + m->off[P_W1], *gb1 = g + m->off[P_B1];
    float *gW2 = g + m->off[P_W2], *gb2 = g + m->off[P_B2];
    int b, i;
    for (b = 0; b < B; b++) {
        int v;
        for (v = 0; v < V; v++) {
            float d = m->probs[(size_t)b * V + v] - (v == tokens[b * (T + 1) + T] ? 1.0f : 0.0f);
            m->dlogits[(size_t)b * V + v] = round_to(d * (scale / (float)B), m->act);
        }
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (i = 0; i < V; i++) { /* gW2[v] = sum_b dlogits[b][v] h[b] */
        float *gr = gW2 + (size_t)i * H, gb = 0;
        int bb, j;
        for (bb = 0; bb < B; bb++) {
            float d = m->dlogits[(size_t)bb * V + i];
            const float *h = m->h + (size_t)bb * H;
            for (j = 0; j < H; j++) gr[j] += d * h[j];
            gb += d;
        }
        gb2[i] += gb;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (b = 0; b < B; b++) { /* dh = W2^T dlogits, through tanh */
        float *dh = m->dh + (size_t)b * H;
        const float *h = m->h + (size_t)b * H, *dl = m->dlogits + (size_t)b * V;
        int j, v;
        for (j = 0; j < H; j++) dh[j] = 0;
        for (v = 0; v < V; v++) {
            const float *wr = W2 + (size_t)v * H;
            for (j = 0; j < H; j++) dh[j] += dl[v] * wr[j];
        }
        for (j = 0; j < H; j++) dh[j] = round_to(round_to(dh[j], m->act) * (1.0f - h[j] * h[j]), m->act);
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (i = 0; i < H; i++) { /* gW1[j] = sum_b dh[b][j] x[b] */
        float *gr = gW1 + (size_t)i * D, gb = 0;
        int bb, k;
        for (bb = 0; bb < B; bb++) {
            float d = m->dh[(size_t)bb * H + i];
            const float *x = m->x + (size_t)bb * D;
            for (k = 0; k < D; k++) gr[k] += d * x[k];
            gb += d;
        }
        gb1[i] += gb;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (b = 0; b < B; b++) { /* dx = W1^T dh */
        float *dx = m->dx + (size_t)b * D;
        const float *dh = m->dh + (size_t)b * H;
        int j, k;
        for (k = 0; k < D; k++) dx[k] = 0;
        for (j = 0; j < H; j++) {
            const float *wr = W1 + (size_t)j * D;
            for (k = 0; k < D; k++) dx[k] += dh[j] * wr[k];
        }
        for (k = 0; k < D; k++) dx[k] = round_to(dx[k], m->act);
    }
    for (b = 0; b < B; b++) {
        int t, e;
        for (t = 0; t < T; t++) {
            float *ge = gemb + (size_t)tokens[b * (T + 1) + t] * E;
            const float *dx = m->dx + (size_t)b * D + t * E;
            for (e = 0; e < E; e++) ge[e] += dx[e];
        }
    }
}

/* ---- training ------------------------------------------------------------ */

typedef struct run_cfg {
    capex_opt_level level;
    capex_dtype half;
    capex_optim_kind optim;
    const char *label;
    int steps, batch, ctx, emb, hidden;
    float lr, wd, clip, min_lr_frac;
    int warmup;
    uint64_t seed;
    int eval_every, eval_windows, log_every;
    const char *save_path; /* checkpoint written at save_at (or the end) */
    int save_at;
    const char *resume_path;
    int quiet;
    size_t bucket_bytes;
    int delay_allreduce;
} run_cfg;

#define MAX_POINTS 512
typedef struct run_result {
    float val_loss, train_loss;
    int64_t skipped;
    double tokens_per_s, seconds;
    uint32_t weights_crc; /* fingerprint of the final fp32 weights */
    int n_points;
    int pt_step[MAX_POINTS];
    float pt_train[MAX_POINTS], pt_val[MAX_POINTS];
} run_result;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        capex_result r_ = (call);                                                                  \
        if (r_ != CAPEX_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,               \
                    capex_result_string(r_), capex_last_error());                                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Validation loss on a fixed, evenly spaced set of windows (same on every rank). */
static float evaluate(model *m, const float *w, const text_data *d, int windows) {
    int B = m->batch, T = m->ctx, i, done = 0;
    size_t first = d->n_train, span = d->n - d->n_train - (size_t)T - 1;
    unsigned char *tok = (unsigned char *)malloc((size_t)B * (T + 1));
    double sum = 0;
    if (!tok) return NAN;
    while (done < windows) {
        for (i = 0; i < B; i++) {
            size_t start = first + (size_t)(((uint64_t)(done + i) * span) / (uint64_t)windows);
            memcpy(tok + (size_t)i * (T + 1), d->bytes + start, (size_t)T + 1);
        }
        sum += (double)model_forward(m, w, tok) * B;
        done += B;
    }
    free(tok);
    return (float)(sum / done);
}

/* Cosine decay after a linear warmup (llm.c / GPT-style schedule). */
static float lr_at(const run_cfg *c, int step) {
    float min_lr = c->lr * c->min_lr_frac, t;
    if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
    t = (float)(step - c->warmup) / (float)(c->steps > c->warmup ? c->steps - c->warmup : 1);
    return min_lr + 0.5f * (c->lr - min_lr) * (1.0f + cosf(3.14159265f * (t > 1 ? 1 : t)));
}

static int train(const run_cfg *c, const text_data *d, capex_comm *comm, int rank, int world, run_result *res) {
    capex_amp_overrides ov;
    capex_amp_config amp;
    capex_dtype act = CAPEX_F32, grad_dtype = CAPEX_F32;
    capex_scaler_desc sd;
    capex_scaler sc;
    capex_optim_desc od;
    capex_optim *opt = NULL;
    capex_optim_param op[P_COUNT];
    capex_ddp_desc dd;
    capex_ddp *ddp = NULL;
    capex_ddp_param dp[P_COUNT];
    capex_tensor gt[P_COUNT], g32t[P_COUNT];
    capex_tensor_list grads, grads32;
    capex_sampler_desc smd;
    capex_sampler smp;
    model m;
    float *w32 = NULL, *weff = NULL, *g32 = NULL;
    uint16_t *wh = NULL;
    unsigned char *tok = NULL;
    int step = 0, i, ok = 0, model_ok = 0;
    uint64_t epoch = 0, pos = 0;
    double t0, ema = 0, tokens = 0;

    memset(res, 0, sizeof *res);
    capex_amp_overrides_init(&ov);
    CHECK(capex_amp_resolve(c->level, c->half, &ov, &amp));
    if (rank == 0 && !c->quiet) {
        char rep[2048];
        size_t need;
        if (capex_amp_report(&amp, rep, sizeof rep, &need) == CAPEX_OK) printf("%s", rep);
    }
    /* What the compute sees, from the opt level's cast policy: matmuls in the
       policy's dtype (half under O1-O3); the loss always in fp32. */
    CHECK(capex_amp_op_dtype(&amp, CAPEX_OP_LINEAR, amp.model_dtype, &act));
    grad_dtype = amp.model_dtype; /* grads have the dtype of the weights they belong to */

    if (!model_init(&m, d->vocab, c->ctx, c->emb, c->hidden, c->batch, act)) goto oom;
    model_ok = 1;
    w32 = (float *)malloc((size_t)m.n_params * sizeof(float));
    weff = (float *)malloc((size_t)m.n_params * sizeof(float));
    g32 = (float *)malloc((size_t)m.n_params * sizeof(float));
    wh = (uint16_t *)malloc((size_t)m.n_params * sizeof(uint16_t));
    tok = (unsigned char *)malloc((size_t)c->batch * (c->ctx + 1));
    if (!w32 || !weff || !g32 || !wh || !tok) goto oom;
    model_init_weights(&m, w32, c->seed);
    /* Every rank starts from rank 0's weights (DDP's initial broadcast). */
    CHECK(capex_comm_broadcast(comm, w32, (size_t)m.n_params, CAPEX_F32, 0));
    if (amp.model_dtype == CAPEX_F16) capex_f32_to_f16_array(w32, wh, (size_t)m.n_params);
    if (amp.model_dtype == CAPEX_BF16) capex_f32_to_bf16_array(w32, wh, (size_t)m.n_params);
    if (amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) /* O3: the fp32 copy holds half values only */
        for (i = 0; i < m.n_params; i++) w32[i] = round_to(w32[i], amp.model_dtype);

    /* DDP: gradients live in the bucket buffers (no copy), reduced in backward order. */
    for (i = 0; i < P_COUNT; i++) {
        dp[i].data = amp.model_dtype == CAPEX_F32 ? (void *)(w32 + m.off[i]) : (void *)(wh + m.off[i]);
        dp[i].numel = (size_t)(m.off[i + 1] - m.off[i]);
        dp[i].dtype = grad_dtype;
        dp[i].grad = NULL;
    }
    capex_ddp_desc_init(&dd);
    dd.broadcast_parameters = 0; /* done above, on the fp32 master weights */
    if (c->bucket_bytes) dd.bucket_bytes = dd.first_bucket_bytes = c->bucket_bytes;
    dd.delay_allreduce = c->delay_allreduce;
    CHECK(capex_ddp_create(&ddp, comm, dp, P_COUNT, &dd));

    capex_optim_desc_init(&od, c->optim);
    od.defaults.lr = c->lr;
    od.defaults.weight_decay = c->wd;
    if (c->optim == CAPEX_OPTIM_SGD) od.defaults.momentum = 0.9f;
    if (c->optim == CAPEX_OPTIM_LAMB) od.max_grad_norm = c->clip; /* LAMB clips by the global norm itself */
    CHECK(capex_optim_create(&od, &opt));
    for (i = 0; i < P_COUNT; i++) {
        capex_optim_param_init(&op[i]);
        op[i].param = w32 + m.off[i];
        op[i].numel = m.off[i + 1] - m.off[i];
        op[i].grad = capex_ddp_grad(ddp, (size_t)i);
        op[i].grad_dtype = grad_dtype;
        if (amp.model_dtype != CAPEX_F32) { op[i].model = wh + m.off[i]; op[i].model_dtype = amp.model_dtype; }
        gt[i].data = capex_ddp_grad(ddp, (size_t)i);
        gt[i].numel = op[i].numel;
        g32t[i].data = g32 + m.off[i];
        g32t[i].numel = op[i].numel;
    }
    grads = capex_tensor_list_make(grad_dtype, gt, P_COUNT);
    grads32 = capex_tensor_list_make(CAPEX_F32, g32t, P_COUNT);
    CHECK(capex_optim_add_group(opt, NULL, op, P_COUNT, NULL));

    capex_scaler_desc_init(&sd);
    sd.log_interval = c->quiet ? 0 : 200;
    if (amp.loss_scale_mode == CAPEX_LOSS_SCALE_STATIC) { sd.dynamic = 0; sd.init_scale = (float)amp.loss_scale; }
    CHECK(capex_scaler_init(&sc, &sd));

    capex_sampler_desc_init(&smd);
    smd.dataset_size = d->n_train - (size_t)c->ctx - 1; /* window i: tokens [i, i+ctx] */
    smd.num_replicas = world;
    smd.rank = rank;
    smd.seed = c->seed;
    smd.drop_last = 1;
    CHECK(capex_sampler_init(&smp, &smd));

    if (c->resume_path) {
        capex_state_reader *rd = NULL;
        int64_t v[3];
        CHECK(capex_state_reader_open_file(c->resume_path, 0, NULL, &rd));
        if (capex_state_get_i64(rd, "train.step", &v[0]) != CAPEX_OK || capex_state_get_i64(rd, "train.epoch", &v[1]) != CAPEX_OK ||
            capex_state_get_i64(rd, "train.pos", &v[2]) != CAPEX_OK || capex_optim_load(opt, rd, "optim", CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK ||
            capex_scaler_load(&sc, rd, "scaler.0.") != CAPEX_OK) {
            fprintf(stderr, "resume from %s failed: %s\n", c->resume_path, capex_last_error());
            capex_state_reader_close(rd);
            goto fail;
        }
        capex_state_reader_close(rd);
        step = (int)v[0]; epoch = (uint64_t)v[1]; pos = (uint64_t)v[2];
        if (rank == 0 && !c->quiet) printf("resumed from %s at step %d\n", c->resume_path, step);
    }
    capex_sampler_set_epoch(&smp, epoch);

    t0 = capex_dist_now();
    for (; step < c->steps; step++) {
        float scale = 1.0f, inv_scale = 1.0f, norm = 0.0f, loss, clip_coef = 1.0f;
        int found_inf, do_step = 0, b;
        /* the batch: the next windows of this rank's shard */
        if (pos + (uint64_t)c->batch > smp.num_samples) { epoch++; pos = 0; capex_sampler_set_epoch(&smp, epoch); }
        for (b = 0; b < c->batch; b++) {
            uint64_t idx = 0;
            CHECK(capex_sampler_index(&smp, pos + (uint64_t)b, &idx));
            memcpy(tok + (size_t)b * (c->ctx + 1), d->bytes + idx, (size_t)c->ctx + 1);
        }
        pos += (uint64_t)c->batch;
        CHECK(capex_optim_set_lr(opt, 0, lr_at(c, step)));

        /* the weights as the compute sees them */
        if (amp.model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, weff, (size_t)m.n_params);
        else if (amp.model_dtype == CAPEX_BF16) capex_bf16_to_f32_array(wh, weff, (size_t)m.n_params);
        else if (act != CAPEX_F32) { memcpy(weff, w32, (size_t)m.n_params * 4); round_array(weff, m.n_params, act); } /* O1 */
        else memcpy(weff, w32, (size_t)m.n_params * 4);

        CHECK(capex_scaler_scale(&sc, &scale));
        loss = model_forward(&m, weff, tok);
        memset(g32, 0, (size_t)m.n_params * sizeof(float));
        model_backward(&m, weff, tok, scale, g32);
        /* hand each gradient to DDP in backward order; its bucket reduces as soon as it is full */
        for (i = P_COUNT - 1; i >= 0; i--) {
            capex_tensor_list one_in = capex_tensor_list_make(CAPEX_F32, &g32t[i], 1);
            capex_tensor_list one_out = capex_tensor_list_make(grad_dtype, &gt[i], 1);
            int inf_unused = 0;
            if (act != CAPEX_F32 && grad_dtype == CAPEX_F32) round_array(g32 + m.off[i], m.off[i + 1] - m.off[i], act); /* O1: half matmul grads */
            CHECK(capex_multi_tensor_scale(NULL, &one_in, &one_out, 1.0f, &inf_unused));
            CHECK(capex_ddp_grad_ready(ddp, (size_t)i));
        }
        CHECK(capex_ddp_finalize(ddp));
        (void)grads32;
        /* one pass over the (still scaled) grads: global norm, and inf/NaN show up in it */
        CHECK(capex_multi_tensor_l2norm(NULL, &grads, &norm, NULL));
        found_inf = !isfinite(norm);
        CHECK(capex_scaler_unscale(&sc, 0, found_inf, &inv_scale));
        if (!found_inf && c->clip > 0 && c->optim != CAPEX_OPTIM_LAMB) clip_coef = capex_clip_coef(norm * inv_scale, c->clip);
        CHECK(capex_scaler_step(&sc, 0, &do_step));
        CHECK(capex_optim_step(opt, inv_scale, clip_coef, !do_step));
        CHECK(capex_scaler_update(&sc));
        if (do_step && amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) { /* O3: pure half weights */
            if (amp.model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, w32, (size_t)m.n_params);
            else capex_bf16_to_f32_array(wh, w32, (size_t)m.n_params);
        }
        tokens += (double)c->batch * world;
        ema = step == 0 ? loss : 0.98 * ema + 0.02 * loss;
        if (c->log_every && rank == 0 && !c->quiet && (step % c->log_every == 0 || step == c->steps - 1)) {
            double el = capex_dist_now() - t0;
            float cur_scale = 0.0f;
            capex_scaler_state st;
            capex_scaler_get_scale(&sc, &cur_scale);
            capex_scaler_get_state(&sc, &st);
            printf("[%s] step %5d  loss %.4f  scale %-9g skipped %lld  lr %.2e  %.0f tok/s\n", c->label, step, loss, cur_scale,
                   (long long)st.skipped_steps, lr_at(c, step), el > 0 ? tokens / el : 0.0);
        }
        if (c->eval_every && ((step + 1) % c->eval_every == 0 || step == c->steps - 1) && res->n_points < MAX_POINTS) {
            float vl = evaluate(&m, weff, d, c->eval_windows);
            res->pt_step[res->n_points] = step + 1;
            res->pt_train[res->n_points] = (float)ema;
            res->pt_val[res->n_points] = vl;
            res->n_points++;
            if (rank == 0 && !c->quiet) printf("[%s] step %5d  val loss %.4f\n", c->label, step + 1, vl);
        }
        if (c->save_path && step + 1 == (c->save_at > 0 ? c->save_at : c->steps) && rank == 0) {
            capex_state_writer *w = NULL;
            capex_result r;
            CHECK(capex_state_writer_create(NULL, &w));
            r = capex_state_add_i64(w, "train.step", step + 1);
            if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.epoch", (int64_t)epoch);
            if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.pos", (int64_t)pos);
            if (r == CAPEX_OK) r = capex_optim_save(opt, w, "optim", CAPEX_OPTIM_STATE_PARAMS);
            if (r == CAPEX_OK) r = capex_scaler_save(&sc, w, "scaler.0.");
            if (r == CAPEX_OK) r = capex_state_write_file(w, c->save_path);
            capex_state_writer_destroy(w);
            CHECK(r);
            if (!c->quiet) printf("[%s] checkpoint written to %s after step %d\n", c->label, c->save_path, step + 1);
        }
    }
    res->seconds = capex_dist_now() - t0;
    res->tokens_per_s = res->seconds > 0 ? tokens / res->seconds : 0;
    {
        capex_scaler_state st;
        capex_scaler_get_state(&sc, &st);
        res->skipped = st.skipped_steps;
    }
    res->train_loss = (float)ema;
    if (amp.model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, weff, (size_t)m.n_params);
    else if (amp.model_dtype == CAPEX_BF16) capex_bf16_to_f32_array(wh, weff, (size_t)m.n_params);
    else memcpy(weff, w32, (size_t)m.n_params * 4);
    if (act != CAPEX_F32 && amp.model_dtype == CAPEX_F32) round_array(weff, m.n_params, act);
    res->val_loss = evaluate(&m, weff, d, c->eval_windows);
    res->weights_crc = capex_crc32(0, w32, (size_t)m.n_params * sizeof(float));
    ok = 1;
    goto done;
oom:
    fprintf(stderr, "out of memory\n");
fail:
done:
    capex_optim_destroy(opt);
    capex_ddp_destroy(ddp);
    if (model_ok) model_free(&m);
    free(w32); free(weff); free(g32); free(wh); free(tok);
    return ok;
}

/* ---- chart --------------------------------------------------------------- */

static void write_svg(const char *path, const run_cfg *cfgs, const run_result *res, int n) {
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
    FILE *f = fopen(path, "w");
    float lo = INFINITY, hi = -INFINITY;
    int maxstep = 1, i, k;
    const int W = 720, H = 420, L = 60, R = 170, T = 30, Bm = 45;
    if (!f) { fprintf(stderr, "cannot write %s\n", path); return; }
    for (i = 0; i < n; i++)
        for (k = 0; k < res[i].n_points; k++) {
            float v[2];
            int j;
            v[0] = res[i].pt_train[k]; v[1] = res[i].pt_val[k];
            for (j = 0; j < 2; j++) { if (v[j] < lo) lo = v[j]; if (v[j] > hi) hi = v[j]; }
            if (res[i].pt_step[k] > maxstep) maxstep = res[i].pt_step[k];
        }
    if (!(hi > lo)) { lo = 0; hi = 1; }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"18\" font-size=\"14\">capex char-LM: loss vs step (solid: validation, dashed: training EMA)</text>\n", L);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
            L, H - Bm, W - R, H - Bm, L, T, L, H - Bm);
    for (k = 0; k <= 4; k++) {
        float v = lo + (hi - lo) * (float)k / 4;
        int y = H - Bm - (int)((float)(H - Bm - T) * (float)k / 4);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.2f</text><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", L - 5, y + 4, v, L, y, W - R, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", L + (W - R - L) * k / 4, H - Bm + 16, maxstep * k / 4);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 8);
    for (i = 0; i < n; i++) {
        int s;
        for (s = 0; s < 2; s++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", colors[i % 4], s ? " stroke-dasharray=\"5,4\"" : "");
            for (k = 0; k < res[i].n_points; k++) {
                float v = s ? res[i].pt_train[k] : res[i].pt_val[k];
                fprintf(f, "%.1f,%.1f ", L + (float)(W - R - L) * (float)res[i].pt_step[k] / (float)maxstep,
                        (float)(H - Bm) - (float)(H - Bm - T) * (v - lo) / (hi - lo));
            }
            fprintf(f, "\"/>\n");
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s: val %.4f</text>\n", W - R + 10, T + 20 + 18 * i, colors[i % 4], cfgs[i].label, res[i].val_loss);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
}

/* ---- command line -------------------------------------------------------- */

static void run_cfg_default(run_cfg *c) {
    memset(c, 0, sizeof *c);
    c->level = CAPEX_O2; c->half = CAPEX_F16; c->optim = CAPEX_OPTIM_ADAM;
    c->steps = 1500; c->batch = 64; c->ctx = 12; c->emb = 16; c->hidden = 256;
    c->lr = 3e-3f; c->wd = 0.01f; c->clip = 1.0f; c->min_lr_frac = 0.1f; c->warmup = 50; c->seed = 1337;
    c->eval_every = 100; c->eval_windows = 4096; c->log_every = 100;
}

static void usage(void) {
    printf("usage: train_charlm [options]\n"
           "  --opt O0|O1|O2|O3     opt level (default O2)\n"
           "  --half fp16|bf16      half type for O1-O3 (default fp16)\n"
           "  --optim adamw|lamb|sgd (default adamw)\n"
           "  --steps N --batch B --lr X --wd X --clip X --seed N\n"
           "  --ctx N --emb N --hidden N   model size\n"
           "  --data FILE           training text (default: /usr/share/common-licenses/*)\n"
           "  --save FILE [--save-at STEP]  checkpoint\n"
           "  --resume FILE         continue from a checkpoint\n"
           "  --compare             run O0 (fp32), then the chosen level with fp16 and bf16\n"
           "                        (only --half if given); compare validation losses, chart\n"
           "  --svg FILE            chart path for --compare (default loss_curve.svg)\n"
           "  --tol X               allowed |val(level) - val(O0)| for --compare (default 0.05)\n"
           "  --bucket-kb N --delay-allreduce   DDP settings\n"
           "  --log-every N --eval-every N --quiet\n"
           "Launch several ranks with mpirun (build with CAPEX_MPI) or torchrun --no-python.\n");
}

int main(int argc, char **argv) {
    run_cfg cfg;
    text_data data;
    capex_dist_env env;
    capex_comm comm;
    const char *data_path = NULL, *svg = "loss_curve.svg";
    int compare = 0, half_given = 0, i, rc = 1;
    float tol = 0.05f;
    run_cfg_default(&cfg);
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else if (!strcmp(a, "--compare")) { compare = 1; used = 0; }
        else if (!strcmp(a, "--quiet")) { cfg.quiet = 1; used = 0; }
        else if (!strcmp(a, "--delay-allreduce")) { cfg.delay_allreduce = 1; used = 0; }
        else if (!v) { fprintf(stderr, "%s needs a value (--help)\n", a); return 2; }
        else if (!strcmp(a, "--opt")) { if (capex_opt_level_parse(v, &cfg.level) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 2; } }
        else if (!strcmp(a, "--half")) { if (capex_half_type_parse(v, &cfg.half) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 2; } half_given = 1; }
        else if (!strcmp(a, "--optim")) {
            if (!strcmp(v, "adamw") || !strcmp(v, "adam")) cfg.optim = CAPEX_OPTIM_ADAM;
            else if (!strcmp(v, "lamb")) cfg.optim = CAPEX_OPTIM_LAMB;
            else if (!strcmp(v, "sgd")) cfg.optim = CAPEX_OPTIM_SGD;
            else { fprintf(stderr, "--optim: adamw, lamb or sgd\n"); return 2; }
        }
        else if (!strcmp(a, "--steps")) cfg.steps = atoi(v);
        else if (!strcmp(a, "--batch")) cfg.batch = atoi(v);
        else if (!strcmp(a, "--lr")) cfg.lr = (float)atof(v);
        else if (!strcmp(a, "--wd")) cfg.wd = (float)atof(v);
        else if (!strcmp(a, "--clip")) cfg.clip = (float)atof(v);
        else if (!strcmp(a, "--seed")) cfg.seed = (uint64_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--ctx")) cfg.ctx = atoi(v);
        else if (!strcmp(a, "--emb")) cfg.emb = atoi(v);
        else if (!strcmp(a, "--hidden")) cfg.hidden = atoi(v);
        else if (!strcmp(a, "--data")) data_path = v;
        else if (!strcmp(a, "--save")) cfg.save_path = v;
        else if (!strcmp(a, "--save-at")) cfg.save_at = atoi(v);
        else if (!strcmp(a, "--resume")) cfg.resume_path = v;
        else if (!strcmp(a, "--svg")) svg = v;
        else if (!strcmp(a, "--tol")) tol = (float)atof(v);
        else if (!strcmp(a, "--bucket-kb")) cfg.bucket_bytes = (size_t)atol(v) * 1024;
        else if (!strcmp(a, "--log-every")) cfg.log_every = atoi(v);
        else if (!strcmp(a, "--eval-every")) cfg.eval_every = atoi(v);
        else { fprintf(stderr, "unknown option %s (--help)\n", a); return 2; }
        i += used;
    }
    if (cfg.steps < 1 || cfg.batch < 1 || cfg.ctx < 1 || cfg.emb < 1 || cfg.hidden < 1 || !(cfg.lr > 0)) {
        fprintf(stderr, "steps, batch, ctx, emb, hidden and lr must be positive\n");
        return 2;
    }
    if (cfg.warmup > cfg.steps / 10) cfg.warmup = cfg.steps / 10 + 1;
#ifdef CAPEX_MPI
    MPI_Init(&argc, &argv);
#endif
    if (capex_dist_env_read(NULL, &env) != CAPEX_OK || capex_comm_init_auto(&comm, &env) != CAPEX_OK) {
        fprintf(stderr, "distributed setup failed: %s\n", capex_last_error());
        goto out_mpi;
    }
    capex_dist_log_init(&env);
    if (!load_text(data_path, 0.1, &data)) goto out;
    if (env.rank == 0)
        printf("capex %s  char-LM on %zu bytes of text (vocab %d, %zu train / %zu validation), %d rank(s) via %s\n",
               CAPEX_VERSION_STRING, data.n, data.vocab, data.n_train, data.n - data.n_train, env.world_size,
               capex_launcher_name(env.launcher));
    if (!compare) {
        run_result res;
        float mine, *all = NULL;
        int same = 1;
        cfg.label = capex_opt_level_name(cfg.level);
        if (!train(&cfg, &data, &comm, env.rank, env.world_size, &res)) goto out_data;
        /* DDP keeps replicas bit-identical: every rank's weight checksum must match.
           Allgather moves bits, so the crc travels as the bits of a float. */
        memcpy(&mine, &res.weights_crc, sizeof mine);
        all = (float *)malloc((size_t)env.world_size * sizeof(float));
        if (!all || capex_comm_allgather(&comm, &mine, all, 1, CAPEX_F32) != CAPEX_OK) {
            fprintf(stderr, "replica check failed: %s\n", all ? capex_last_error() : "out of memory");
            free(all);
            goto out_data;
        }
        for (i = 1; i < env.world_size; i++) same &= memcmp(&all[i], &all[0], sizeof mine) == 0;
        free(all);
        if (env.rank == 0) {
            printf("final: val loss %.4f  train loss %.4f  skipped %lld  %.0f tok/s  %.1f s  weights crc32 %08x\n", res.val_loss,
                   res.train_loss, (long long)res.skipped, res.tokens_per_s, res.seconds, (unsigned)res.weights_crc);
            if (env.world_size > 1) printf("replicas: %d ranks, weights %s\n", env.world_size, same ? "bit-identical" : "DIFFER");
        }
        rc = same ? 0 : 1;
    } else {
        /* O0 (fp32) first, then the chosen level with each half type (or the one asked for). */
        run_cfg runs[3];
        run_result res[3];
        char labels[3][32];
        int n_runs = 1, worst = 0;
        runs[0] = cfg; runs[0].level = CAPEX_O0; runs[0].label = "O0 fp32";
        if (cfg.level != CAPEX_O0) {
            capex_dtype halves[2];
            int n_halves = 0, h;
            if (half_given) halves[n_halves++] = cfg.half;
            else { halves[n_halves++] = CAPEX_F16; halves[n_halves++] = CAPEX_BF16; }
            for (h = 0; h < n_halves; h++, n_runs++) {
                runs[n_runs] = cfg;
                runs[n_runs].half = halves[h];
                snprintf(labels[n_runs], sizeof labels[n_runs], "%s %s", capex_opt_level_name(cfg.level), halves[h] == CAPEX_F16 ? "fp16" : "bf16");
                runs[n_runs].label = labels[n_runs];
            }
        }
        for (i = 0; i < n_runs; i++) {
            runs[i].save_path = NULL;
            if (!train(&runs[i], &data, &comm, env.rank, env.world_size, &res[i])) goto out_data;
        }
        if (env.rank == 0) {
            printf("\n%-10s %10s %10s %8s %10s\n", "run", "val loss", "train", "skipped", "tok/s");
            for (i = 0; i < n_runs; i++)
                printf("%-10s %10.4f %10.4f %8lld %10.0f\n", runs[i].label, res[i].val_loss, res[i].train_loss, (long long)res[i].skipped, res[i].tokens_per_s);
            write_svg(svg, runs, res, n_runs);
            printf("chart: %s\n", svg);
            for (i = 1; i < n_runs; i++) {
                float diff = fabsf(res[i].val_loss - res[0].val_loss);
                int pass = diff <= tol; /* NaN fails */
                printf("%s reaches the fp32 validation loss within %.3f nats: |%.5f - %.5f| = %.5f  %s\n", runs[i].label, tol,
                       res[i].val_loss, res[0].val_loss, diff, pass ? "PASS" : "FAIL");
                if (!pass) worst = 1;
            }
            rc = worst;
        } else rc = 0;
    }
out_data:
    free(data.bytes);
out:
    capex_comm_destroy(&comm);
out_mpi:
#ifdef CAPEX_MPI
    MPI_Finalize();
#endif
    return rc;
}
