/* train_charlm.c - capex's end-to-end example: a character-level language
   model written in plain C, trained with capex's mixed precision (opt levels
   O0-O3, fp16 or bf16), loss scaler, fused AdamW / LAMB / SGD with fp32
   master weights, gradient clipping, distributed sampler, DDP buckets (one
   or more ranks) and checkpoint / resume.

     make run                               # O0 vs O2 fp16 on the CPU, chart
     build/examples/train_charlm --opt O2 --half bf16 --optim lamb
     build/examples/train_charlm --sched onecycle --warmup 300   # lr schedule
     mpirun -np 2 build/examples/train_charlm_mpi --steps 500

   The model is small on purpose (a 2-core machine trains it in about a
   minute); every capex call it makes is the one a bigger engine makes. */
#define CAPEX_CUDA_IMPLEMENTATION /* the CUDA backend (run-time loaded) and capex.h's implementation */
#include "../capex_cuda.h"
#include <errno.h>
#include <limits.h>
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

/* The CPU loops index a window's inputs in int (D = ctx * emb). */
static int model_size_ok(int ctx, int emb) {
    if ((int64_t)ctx * emb <= INT_MAX) return 1;
    fprintf(stderr, "model: ctx %d x emb %d inputs is over 2^31 - 1\n", ctx, emb);
    return 0;
}

static int model_init(model *m, int vocab, int ctx, int emb, int hidden, int batch, capex_dtype act) {
    int64_t sizes[P_COUNT];
    int i;
    memset(m, 0, sizeof *m);
    if (!model_size_ok(ctx, emb)) return 0;
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

/* A linear layer's weight and bias gradients, added to gW [n_out][n_in] and
   gb [n_out]: gW[i][j] += sum_b dy[b][i] x[b][j], gb[i] += sum_b dy[b][i].
   One thread per output row (the GPU's charlm_grad_w: the same order). */
static void linear_grad_w(const float *dy, const float *x, float *gW, float *gb, int B, int n_in, int n_out) {
    int i;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (i = 0; i < n_out; i++) {
        float *gr = gW + (size_t)i * n_in, acc = 0;
        int b, j;
        for (b = 0; b < B; b++) {
            float d = dy[(size_t)b * n_out + i];
            const float *xb = x + (size_t)b * n_in;
            for (j = 0; j < n_in; j++) gr[j] += d * xb[j];
            acc += d;
        }
        gb[i] += acc;
    }
}

/* dx[b] = W^T dy[b] (W [n_out][n_in]) rounded to act; with h, through tanh:
   dx = act(act(W^T dy) * (1 - h^2)). The GPU's charlm_back. */
static void linear_back(const float *dy, const float *W, const float *h, float *dx, int B, int n_in, int n_out,
                        capex_dtype act) {
    int b;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (b = 0; b < B; b++) {
        float *o = dx + (size_t)b * n_in;
        const float *d = dy + (size_t)b * n_out;
        int j, k;
        for (k = 0; k < n_in; k++) o[k] = 0;
        for (j = 0; j < n_out; j++) {
            const float *wr = W + (size_t)j * n_in;
            for (k = 0; k < n_in; k++) o[k] += d[j] * wr[k];
        }
        for (k = 0; k < n_in; k++) {
            const float hk = h ? h[(size_t)b * n_in + k] : 0.0f;
            o[k] = h ? round_to(round_to(o[k], act) * (1.0f - hk * hk), act) : round_to(o[k], act);
        }
    }
}

/* Gradient of (loss * scale) with respect to w, accumulated into g (fp32).
   The caller rounds g to the grad dtype. Deterministic: each output row is
   owned by one thread and the embedding scatter is serial. */
static void model_backward(model *m, const float *w, const unsigned char *tokens, float scale, float *g) {
    const int B = m->batch, T = m->ctx, E = m->emb, H = m->hidden, V = m->vocab, D = T * E;
    const float *W1 = w + m->off[P_W1], *W2 = w + m->off[P_W2];
    float *gemb = g + m->off[P_EMB], *gW1 = g + m->off[P_W1], *gb1 = g + m->off[P_B1];
    float *gW2 = g + m->off[P_W2], *gb2 = g + m->off[P_B2];
    int b;
    for (b = 0; b < B; b++) {
        int v;
        for (v = 0; v < V; v++) {
            float d = m->probs[(size_t)b * V + v] - (v == tokens[b * (T + 1) + T] ? 1.0f : 0.0f);
            m->dlogits[(size_t)b * V + v] = round_to(d * (scale / (float)B), m->act);
        }
    }
    linear_grad_w(m->dlogits, m->h, gW2, gb2, B, H, V);
    linear_back(m->dlogits, W2, m->h, m->dh, B, H, V, m->act); /* dh, through tanh */
    linear_grad_w(m->dh, m->x, gW1, gb1, B, D, H);
    linear_back(m->dh, W1, NULL, m->dx, B, D, H, m->act);
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
    capex_lr_kind sched; /* --sched: the lr schedule after the warmup */
    uint64_t seed;
    int eval_every, eval_windows, log_every;
    const char *save_path; /* checkpoint written at save_at (or the end) */
    int save_at;
    const char *resume_path;
    int quiet;
    size_t bucket_bytes;
    int delay_allreduce;
    int zero;              /* 1, 2: ZeRO stage (sharded optimizer state) instead of DDP; 0: DDP */
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

/* Whole batches only: the window count rounded up to a multiple of the batch,
   so every window evaluated lies inside the validation text and counts. */
static int eval_window_count(int windows, int batch) {
    int64_t up = ((int64_t)windows + batch - 1) / batch * batch;
    return up <= INT_MAX - batch ? (int)up : (INT_MAX - batch) / batch * batch; /* the loop's count stays an int */
}

/* Validation loss on a fixed, evenly spaced set of windows (same on every rank). */
static float evaluate(model *m, const float *w, const text_data *d, int windows) {
    int B = m->batch, T = m->ctx, i, done = 0;
    size_t first = d->n_train, span = d->n - d->n_train - (size_t)T - 1;
    unsigned char *tok = (unsigned char *)malloc((size_t)B * (T + 1));
    double sum = 0;
    if (!tok) return NAN;
    windows = eval_window_count(windows, B);
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

/* The lr schedule (--sched, --warmup): a linear warmup from lr/warmup, then
   the decay to lr * min_lr_frac over the remaining steps. The optimizer runs
   it from its own step count (on the GPU: on the device), and its state file
   keeps it, so a resumed run continues the curve (the file's schedule wins). */
static capex_result lr_schedule_for(const run_cfg *c, capex_lr_schedule *s) {
    int64_t decay = c->steps > c->warmup ? c->steps - c->warmup : 1;
    capex_lr_schedule_init(s, c->sched);
    s->warmup_steps = c->sched == CAPEX_LR_ONECYCLE ? 0 : c->warmup;
    s->warmup_start_factor = c->warmup > 0 ? 1.0 / c->warmup : 1.0;
    s->total_steps = c->steps > c->warmup ? c->steps : c->warmup + 1;
    s->min_factor = c->min_lr_frac;
    switch (c->sched) {
    case CAPEX_LR_POLYNOMIAL: s->power = 2.0; break;
    case CAPEX_LR_STEP: s->step_size = decay / 3 > 0 ? decay / 3 : 1; s->gamma = 0.3; break;
    case CAPEX_LR_MULTISTEP:
        s->num_milestones = 2; s->milestones[0] = decay / 2; s->milestones[1] = decay * 3 / 4; break;
    case CAPEX_LR_EXPONENTIAL: s->gamma = pow(c->min_lr_frac > 0 ? c->min_lr_frac : 1e-3, 1.0 / (double)decay); break;
    case CAPEX_LR_ONECYCLE:
        s->total_steps = c->steps;
        s->pct_start = c->warmup > 0 && c->warmup < c->steps ? (double)c->warmup / c->steps : 0.3;
        break;
    default: break;
    }
    return capex_lr_schedule_check(s);
}

/* ---- pieces shared by the CPU and GPU training loops --------------------- */

/* The opt level's configuration (printed on rank 0) and the dtype the
   matmuls run in under its cast policy (half under O1-O3); the loss always
   runs in fp32. */
static capex_result amp_setup(const run_cfg *c, int rank, capex_amp_config *amp, capex_dtype *act) {
    capex_amp_overrides ov;
    capex_result r;
    capex_amp_overrides_init(&ov);
    if ((r = capex_amp_resolve(c->level, c->half, &ov, amp)) != CAPEX_OK) return r;
    if (rank == 0 && !c->quiet) {
        char rep[2048];
        size_t need;
        if (capex_amp_report(amp, rep, sizeof rep, &need) == CAPEX_OK) printf("%s", rep);
    }
    return capex_amp_op_dtype(amp, CAPEX_OP_LINEAR, amp->model_dtype, act);
}

static void scaler_desc_for(const capex_amp_config *amp, int log_interval, capex_scaler_desc *sd) {
    (void)capex_scaler_desc_from_amp(amp, sd); /* dynamic where the level asks, else static at its loss_scale */
    sd->log_interval = log_interval;
}

/* The text must hold a batch of training windows per rank and a validation
   window: else the sampler and evaluate() would index past it. */
static int text_fits(const run_cfg *c, const text_data *d, int world) {
    if (d->n_train >= (size_t)c->ctx + 2 + (size_t)c->batch * (size_t)world && d->n - d->n_train >= (size_t)c->ctx + 2) return 1;
    fprintf(stderr, "text too short for ctx %d and batch %d x %d ranks (%zu train / %zu validation bytes)\n", c->ctx, c->batch,
            world, d->n_train, d->n - d->n_train);
    return 0;
}

/* This rank's shard of the training windows (window i: tokens [i, i+ctx]). */
static capex_result sampler_for(const run_cfg *c, const text_data *d, int rank, int world, capex_sampler *smp) {
    capex_sampler_desc smd;
    capex_sampler_desc_init(&smd);
    smd.dataset_size = d->n_train - (size_t)c->ctx - 1;
    smd.num_replicas = world;
    smd.rank = rank;
    smd.seed = c->seed;
    smd.drop_last = 1;
    return capex_sampler_init(smp, &smd);
}

/* The next batch of this rank's shard into tok; a new epoch reshuffles. */
static capex_result next_batch(const run_cfg *c, const text_data *d, capex_sampler *smp, uint64_t *epoch, uint64_t *pos,
                               unsigned char *tok) {
    int b;
    if (*pos + (uint64_t)c->batch > smp->num_samples) { ++*epoch; *pos = 0; capex_sampler_set_epoch(smp, *epoch); }
    for (b = 0; b < c->batch; b++) {
        uint64_t idx = 0;
        capex_result r = capex_sampler_index(smp, *pos + (uint64_t)b, &idx);
        if (r != CAPEX_OK) return r;
        memcpy(tok + (size_t)b * (c->ctx + 1), d->bytes + idx, (size_t)c->ctx + 1);
    }
    *pos += (uint64_t)c->batch;
    return CAPEX_OK;
}

/* The loop's position in a checkpoint: step, epoch, sampler position, and the
   training loss average, so a resumed run reports the uninterrupted run's. */
static capex_result save_position(capex_state_writer *w, int step, uint64_t epoch, uint64_t pos, double ema) {
    capex_result r = capex_state_add_i64(w, "train.step", step);
    if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.epoch", (int64_t)epoch);
    if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.pos", (int64_t)pos);
    if (r == CAPEX_OK) r = capex_state_add_f64(w, "train.ema", ema);
    return r;
}
/* *ema_from: the step whose loss starts the average (the resumed step for a
   checkpoint written before train.ema existed), -1 when the file had it. */
static capex_result load_position(capex_state_reader *rd, int *step, uint64_t *epoch, uint64_t *pos, double *ema, int *ema_from) {
    int64_t v[3];
    capex_result r = capex_state_get_i64(rd, "train.step", &v[0]);
    if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.epoch", &v[1]);
    if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.pos", &v[2]);
    if (r == CAPEX_OK) { *step = (int)v[0]; *epoch = (uint64_t)v[1]; *pos = (uint64_t)v[2]; }
    if (r == CAPEX_OK) {
        r = capex_state_get_f64(rd, "train.ema", ema);
        if (r == CAPEX_OK) *ema_from = -1;
        else if (r == CAPEX_ERR_NOT_FOUND) { *ema = 0; *ema_from = *step; r = CAPEX_OK; }
    }
    return r;
}

/* A point of the loss chart (and its line on rank 0). */
static void record_point(const run_cfg *c, run_result *res, int rank, int step, float train_ema, float val) {
    res->pt_step[res->n_points] = step;
    res->pt_train[res->n_points] = train_ema;
    res->pt_val[res->n_points] = val;
    res->n_points++;
    if (rank == 0 && !c->quiet) printf("[%s] step %5d  val loss %.4f\n", c->label, step, val);
}

static int resumed(const run_cfg *c, capex_result r, int rank, int step) {
    if (r != CAPEX_OK) fprintf(stderr, "resume from %s failed: %s\n", c->resume_path, capex_last_error());
    else if (step < 0 || step > c->steps) { /* else nothing would train, and the report would say 0 */
        fprintf(stderr, "resume from %s: its step %d is past --steps %d\n", c->resume_path, step, c->steps);
        return 0;
    } else if (rank == 0 && !c->quiet) printf("resumed from %s at step %d\n", c->resume_path, step);
    return r == CAPEX_OK;
}

static int train(const run_cfg *c, const text_data *d, capex_comm *comm, int rank, int world, run_result *res) {
    capex_amp_config amp;
    capex_dtype act = CAPEX_F32, grad_dtype = CAPEX_F32;
    capex_scaler_desc sd;
    capex_scaler sc;
    capex_optim_desc od;
    capex_lr_schedule lrs;
    capex_optim *opt = NULL;
    capex_optim_param op[P_COUNT];
    capex_ddp_desc dd;
    capex_ddp *ddp = NULL;
    capex_ddp_param dp[P_COUNT];
    capex_zero *zr = NULL; /* --zero: DDP + the optimizer, sharded */
    capex_optim *lr_opt;   /* the optimizer whose lr the schedule drives */
    capex_tensor gt[P_COUNT], g32t[P_COUNT];
    capex_tensor_list grads, grads32;
    capex_sampler smp;
    model m;
    float *w32 = NULL, *weff = NULL, *g32 = NULL;
    uint16_t *wh = NULL;
    unsigned char *tok = NULL;
    int step = 0, i, ok = 0, model_ok = 0, ema_from = 0;
    uint64_t epoch = 0, pos = 0;
    double t0, ema = 0, tokens = 0;

    memset(res, 0, sizeof *res);
    if (!text_fits(c, d, world)) return 0;
    CHECK(amp_setup(c, rank, &amp, &act));
    grad_dtype = amp.model_dtype; /* grads have the dtype of the weights they belong to */
    if (c->zero && amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) {
        fprintf(stderr, "--zero keeps fp32 master shards: use O0-O2 (O3 has no master weights)\n");
        return 0;
    }

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
    if (!c->zero) CHECK(capex_ddp_create(&ddp, comm, dp, P_COUNT, &dd));

    capex_optim_desc_init(&od, c->optim);
    od.defaults.lr = c->lr;
    od.defaults.weight_decay = c->wd;
    if (c->optim == CAPEX_OPTIM_SGD) od.defaults.momentum = 0.9f;
    if (c->optim == CAPEX_OPTIM_LAMB) od.max_grad_norm = c->clip; /* LAMB clips by the global norm itself */
    if (c->zero) { /* ZeRO: the same buckets, each rank owning a shard of masters and moments */
        capex_zero_param zp[P_COUNT];
        capex_zero_desc zd;
        for (i = 0; i < P_COUNT; i++) { zp[i].data = dp[i].data; zp[i].numel = dp[i].numel; zp[i].dtype = grad_dtype; zp[i].group = 0; }
        capex_zero_desc_init(&zd);
        zd.stage = c->zero;
        zd.broadcast_parameters = 0; /* done above */
        if (c->bucket_bytes) zd.bucket_bytes = c->bucket_bytes;
        CHECK(capex_zero_create(&zr, comm, zp, P_COUNT, &od, NULL, 1, &zd));
    } else
        CHECK(capex_optim_create(&od, &opt));
    lr_opt = zr ? capex_zero_optim(zr) : opt;
    for (i = 0; i < P_COUNT && !zr; i++) {
        /* the opt level's wiring: fp32 weights (O0/O1), fp32 masters writing the half
           copy (O2), or the half weights alone (O3: pure_half keeps w32 = f32(wh)) */
        capex_optim_param_init(&op[i]);
        CHECK(capex_optim_param_from_amp(&amp, w32 + m.off[i], wh + m.off[i], capex_ddp_grad(ddp, (size_t)i),
                                         m.off[i + 1] - m.off[i], &op[i]));
    }
    for (i = 0; i < P_COUNT; i++) {
        gt[i].data = zr ? NULL : capex_ddp_grad(ddp, (size_t)i); /* ZeRO: asked for every step */
        gt[i].numel = m.off[i + 1] - m.off[i];
        g32t[i].data = g32 + m.off[i];
        g32t[i].numel = gt[i].numel;
    }
    grads = capex_tensor_list_make(grad_dtype, gt, P_COUNT);
    grads32 = capex_tensor_list_make(CAPEX_F32, g32t, P_COUNT);
    if (!zr) CHECK(capex_optim_add_group(opt, NULL, op, P_COUNT, NULL));
    CHECK(lr_schedule_for(c, &lrs));
    CHECK(capex_optim_set_lr_schedule(lr_opt, &lrs));

    scaler_desc_for(&amp, c->quiet ? 0 : 200, &sd);
    CHECK(capex_scaler_init(&sc, &sd));
    CHECK(sampler_for(c, d, rank, world, &smp));

    if (c->resume_path) {
        capex_state_reader *rd = NULL;
        capex_result r = capex_state_reader_open_file(c->resume_path, 0, NULL, &rd);
        if (r == CAPEX_OK) r = load_position(rd, &step, &epoch, &pos, &ema, &ema_from);
        /* a ZeRO checkpoint is the unsharded optimizer's: either loads either */
        if (r == CAPEX_OK) r = zr ? capex_zero_load(zr, rd, "optim", CAPEX_OPTIM_STATE_PARAMS)
                                  : capex_optim_load(opt, rd, "optim", CAPEX_OPTIM_STATE_PARAMS);
        if (r == CAPEX_OK) r = capex_scaler_load(&sc, rd, "scaler.0.");
        capex_state_reader_close(rd);
        if (!resumed(c, r, rank, step)) goto fail;
    }
    capex_sampler_set_epoch(&smp, epoch);

    t0 = capex_dist_now();
    for (; step < c->steps; step++) {
        float scale = 1.0f, inv_scale = 1.0f, norm = 0.0f, loss, clip_coef = 1.0f;
        int found_inf, do_step = 0;
        CHECK(next_batch(c, d, &smp, &epoch, &pos, tok));

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
            if (zr && !(gt[i].data = capex_zero_grad(zr, (size_t)i))) CHECK(CAPEX_ERR_ORDER);
            CHECK(capex_multi_tensor_scale(NULL, &one_in, &one_out, 1.0f, &inf_unused));
            CHECK(zr ? capex_zero_grad_ready(zr, (size_t)i) : capex_ddp_grad_ready(ddp, (size_t)i));
        }
        (void)grads32;
        if (zr) { /* this rank's shard is reduced; one allreduce gives the global norm and found_inf */
            CHECK(capex_zero_finalize(zr));
            CHECK(capex_zero_grad_norm(zr, &found_inf, &norm));
        } else {
            CHECK(capex_ddp_finalize(ddp));
            /* one pass over the (still scaled) grads: global norm, and inf/NaN show up in it */
            CHECK(capex_multi_tensor_l2norm(NULL, &grads, &norm, NULL));
            found_inf = !isfinite(norm);
        }
        CHECK(capex_scaler_unscale(&sc, 0, found_inf, &inv_scale));
        if (!found_inf && c->clip > 0 && c->optim != CAPEX_OPTIM_LAMB) clip_coef = capex_clip_coef(norm * inv_scale, c->clip);
        CHECK(capex_scaler_step(&sc, 0, &do_step));
        if (zr) { /* the shard steps, then every rank gets the updated weights */
            CHECK(capex_zero_step(zr, inv_scale, clip_coef, !do_step));
            CHECK(capex_zero_zero_grad(zr));
        } else
            CHECK(capex_optim_step(opt, inv_scale, clip_coef, !do_step));
        CHECK(capex_scaler_update(&sc));
        tokens += (double)c->batch * world;
        ema = step == ema_from ? loss : 0.98 * ema + 0.02 * loss;
        if (c->log_every && rank == 0 && !c->quiet && (step % c->log_every == 0 || step == c->steps - 1)) {
            double el = capex_dist_now() - t0;
            float cur_scale = capex_scaler_get_scale(&sc), next_lr = 0.0f;
            capex_scaler_state st;
            memset(&st, 0, sizeof st);
            capex_scaler_get_state(&sc, &st);
            capex_optim_get_lr(lr_opt, 0, &next_lr);
            printf("[%s] step %5d  loss %.4f  scale %-9g skipped %lld  lr %.2e  %.0f tok/s\n", c->label, step, loss, cur_scale,
                   (long long)st.skipped_steps, next_lr, el > 0 ? tokens / el : 0.0);
        }
        if (c->eval_every && ((step + 1) % c->eval_every == 0 || step == c->steps - 1) && res->n_points < MAX_POINTS) {
            float vl;
            /* the weights after this step's update, as the compute sees them */
            if (amp.model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, weff, (size_t)m.n_params);
            else if (amp.model_dtype == CAPEX_BF16) capex_bf16_to_f32_array(wh, weff, (size_t)m.n_params);
            else { memcpy(weff, w32, (size_t)m.n_params * 4); round_array(weff, m.n_params, act); }
            vl = evaluate(&m, weff, d, c->eval_windows);
            record_point(c, res, rank, step + 1, (float)ema, vl);
        }
        if (c->save_path && step + 1 == (c->save_at > 0 ? c->save_at : c->steps) && (rank == 0 || zr)) {
            capex_state_writer *w = NULL;
            capex_result r = CAPEX_OK;
            if (rank == 0) CHECK(capex_state_writer_create(NULL, &w));
            if (rank == 0) r = save_position(w, step + 1, epoch, pos, ema);
            /* ZeRO: every rank takes part (shards are gathered); rank 0 writes */
            if (r == CAPEX_OK) r = zr ? capex_zero_save(zr, w, "optim", CAPEX_OPTIM_STATE_PARAMS)
                                      : capex_optim_save(opt, w, "optim", CAPEX_OPTIM_STATE_PARAMS);
            if (r == CAPEX_OK && rank == 0) r = capex_scaler_save(&sc, w, "scaler.0.");
            if (r == CAPEX_OK && rank == 0) r = capex_state_write_file(w, c->save_path);
            capex_state_writer_destroy(w);
            CHECK(r);
            if (!c->quiet && rank == 0) printf("[%s] checkpoint written to %s after step %d\n", c->label, c->save_path, step + 1);
        }
    }
    res->seconds = capex_dist_now() - t0;
    res->tokens_per_s = res->seconds > 0 ? tokens / res->seconds : 0;
    {
        capex_scaler_state st;
        memset(&st, 0, sizeof st);
        capex_scaler_get_state(&sc, &st);
        res->skipped = st.skipped_steps;
    }
    res->train_loss = (float)ema;
    if (amp.model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, weff, (size_t)m.n_params);
    else if (amp.model_dtype == CAPEX_BF16) capex_bf16_to_f32_array(wh, weff, (size_t)m.n_params);
    else memcpy(weff, w32, (size_t)m.n_params * 4);
    if (act != CAPEX_F32 && amp.model_dtype == CAPEX_F32) round_array(weff, m.n_params, act);
    res->val_loss = evaluate(&m, weff, d, c->eval_windows);
    /* ZeRO with a half model: the fp32 masters are sharded across ranks; the
       fingerprint is then of the gathered half weights */
    if (zr && amp.model_dtype != CAPEX_F32) memcpy(w32, weff, (size_t)m.n_params * 4);
    res->weights_crc = capex_crc32(0, w32, (size_t)m.n_params * sizeof(float));
    ok = 1;
    goto done;
oom:
    fprintf(stderr, "out of memory\n");
fail:
done:
    capex_optim_destroy(opt);
    capex_ddp_destroy(ddp);
    capex_zero_destroy(zr);
    if (model_ok) model_free(&m);
    free(w32); free(weff); free(g32); free(wh); free(tok);
    return ok;
}

/* ---- GPU path: the same model as CUDA kernels, compiled at run time -------
   The kernels below are plain CUDA C++ text that capex's public JIT compiles
   for this GPU on first use (then loads from the disk cache): no nvcc, no
   cuBLAS. They mirror the CPU code above operation for operation: one thread
   per output element, sums in the same order, the same half rounding points,
   so a run is deterministic and close to the CPU run (tanhf/expf/log are the
   GPU's own, a few ulps away). One compiled module serves every opt level:
   the dtypes come in the `dt` argument (uniform branches, nothing per element
   to speak of). Naive on purpose: this model is tiny, and the point is the
   training loop around it. */
static const char *const charlm_kernels_parts[] = { /* each under C99's 4095-character literal limit */
    "typedef unsigned short u16;\n"
    "__device__ float h2f(u16 h) {\n"
    "    unsigned s = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;\n"
    "    if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }\n"
    "    return __uint_as_float(s | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13)));\n"
    "}\n"
    "__device__ u16 f2h(float f) { /* round to nearest even */\n"
    "    unsigned x = __float_as_uint(f), s = (x >> 16) & 0x8000u;\n"
    "    x &= 0x7fffffffu;\n"
    "    if (x >= 0x7f800000u) return (u16)(s | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));\n"
    "    if (x >= 0x477ff000u) return (u16)(s | 0x7c00u);\n"
    "    if (x < 0x38800000u) return (u16)(s | (__float_as_uint(__uint_as_float(x) + 0.5f) - 0x3f000000u));\n"
    "    x += 0xc8000fffu + ((x >> 13) & 1u);\n"
    "    return (u16)(s | (x >> 13));\n"
    "}\n"
    "__device__ float b2f(u16 b) { return __uint_as_float((unsigned)b << 16); }\n"
    "__device__ u16 f2b(float f) {\n"
    "    unsigned x = __float_as_uint(f);\n"
    "    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);\n"
    "    return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);\n"
    "}\n"
    "__device__ float rnd(float v, int t) { return t == 1 ? h2f(f2h(v)) : t == 2 ? b2f(f2b(v)) : v; }\n"
    "/* dt packs the run's dtypes (0 f32, 1 f16, 2 bf16): weights | act << 2 | grads << 4 | round fp32 grads << 6 */\n"
    "#define WT (dt & 3)\n"
    "#define ACT ((dt >> 2) & 3)\n"
    "#define GT ((dt >> 4) & 3)\n"
    "#define R(v) rnd((v), ACT)\n"
    "/* a weight as the compute sees it (O1: fp32 weights rounded to half) */\n"
    "__device__ float W(const void *p, long long i, int dt) {\n"
    "    return WT == 0 ? rnd(((const float *)p)[i], ACT) : WT == 1 ? h2f(((const u16 *)p)[i]) : b2f(((const u16 *)p)[i]);\n"
    "}\n"
    "__device__ void G(void *p, long long i, float v, int dt) { /* a gradient, stored in its dtype */\n"
    "    if (GT == 0) ((float *)p)[i] = (dt >> 6) & 1 ? rnd(v, ACT) : v;\n"
    "    else ((u16 *)p)[i] = GT == 1 ? f2h(v) : f2b(v);\n"
    "}\n"
    "#define FOR_EACH(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)\n"
    "/* x[b][t*E+e] = emb[token][e] */\n"
    "extern \"C\" __global__ void charlm_embed(const unsigned char *tok, const void *emb, float *x, int B, int T, int E, int dt) {\n"
    "    FOR_EACH(i, (long long)B * T * E) {\n"
    "        long long b = i / ((long long)T * E), t = (i / E) % T, e = i % E;\n"
    "        x[i] = W(emb, (long long)tok[b * (T + 1) + t] * E + e, dt);\n"
    "    }\n"
    "}\n"
    "/* h = tanh(W1 x + b1) */\n"
    "extern \"C\" __global__ void charlm_hidden(const float *x, const void *W1, const void *b1, float *h, int B, int D, int H, int dt) {\n"
    "    FOR_EACH(i, (long long)B * H) {\n"
    "        long long b = i / H, j = i % H;\n"
    "        const float *xb = x + b * D;\n"
    "        float acc = 0.0f;\n"
    "        for (int k = 0; k < D; k++) acc += W(W1, j * D + k, dt) * xb[k];\n"
    "        h[i] = R(tanhf(R(acc + W(b1, j, dt))));\n"
    "    }\n"
    "}\n"
    "/* One block per row: logits, softmax (fp32, in the CPU's order), row loss. */\n"
    "extern \"C\" __global__ void charlm_logits(const float *h, const void *W2, const void *b2, const unsigned char *tok,\n"
    "                                          float *probs, double *row_loss, int H, int V, int T, int dt) {\n"
    "    long long b = blockIdx.x;\n"
    "    const float *hb = h + b * H;\n"
    "    float *p = probs + b * V;\n"
    "    for (int v = threadIdx.x; v < V; v += blockDim.x) {\n"
    "        float acc = 0.0f;\n",
    "        for (int j = 0; j < H; j++) acc += W(W2, (long long)v * H + j, dt) * hb[j];\n"
    "        p[v] = R(acc + W(b2, v, dt));\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        float mx = -__uint_as_float(0x7f800000u), sum = 0.0f;\n"
    "        for (int v = 0; v < V; v++) if (p[v] > mx) mx = p[v];\n"
    "        for (int v = 0; v < V; v++) { p[v] = expf(p[v] - mx); sum += p[v]; }\n"
    "        for (int v = 0; v < V; v++) p[v] /= sum;\n"
    "        row_loss[b] = -log((double)p[tok[b * (T + 1) + T]] + 1e-30);\n"
    "    }\n"
    "}\n"
    "/* mean loss of the batch -> out[0]; acc != 0: also acc[0] += loss * B (evaluation) */\n"
    "extern \"C\" __global__ void charlm_loss(const double *row_loss, int B, float *out, double *acc) {\n"
    "    if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
    "    double s = 0.0;\n"
    "    for (int b = 0; b < B; b++) s += row_loss[b];\n"
    "    float l = (float)(s / B);\n"
    "    if (out) out[0] = l;\n"
    "    if (acc) acc[0] += (double)l * B;\n"
    "}\n"
    "/* dlogits = (p - onehot) * (loss scale / B); the scale is read on the device */\n"
    "extern \"C\" __global__ void charlm_dlogits(const float *probs, const unsigned char *tok, const float *scale,\n"
    "                                           float *dl, int B, int V, int T, int dt) {\n"
    "    float k = *scale / (float)B;\n"
    "    FOR_EACH(i, (long long)B * V) {\n"
    "        long long b = i / V, v = i % V;\n"
    "        dl[i] = R((probs[i] - (v == tok[b * (T + 1) + T] ? 1.0f : 0.0f)) * k);\n"
    "    }\n"
    "}\n"
    "/* gW[i][j] = sum_b dy[b][i] x[b][j] (j < n_in), gb[i] = sum_b dy[b][i] (j == n_in) */\n"
    "extern \"C\" __global__ void charlm_grad_w(const float *dy, const float *x, void *gW, void *gb, int B, int n_in, int n_out, int dt) {\n"
    "    FOR_EACH(t, (long long)n_out * (n_in + 1)) {\n"
    "        long long i = t / (n_in + 1), j = t % (n_in + 1);\n"
    "        float acc = 0.0f;\n"
    "        if (j < n_in) { for (int b = 0; b < B; b++) acc += dy[(long long)b * n_out + i] * x[(long long)b * n_in + j]; G(gW, i * n_in + j, acc, dt); }\n"
    "        else { for (int b = 0; b < B; b++) acc += dy[(long long)b * n_out + i]; G(gb, i, acc, dt); }\n"
    "    }\n"
    "}\n"
    "/* dx[b][k] = sum_j dy[b][j] W[j][k]; tanh' (1 - h^2) when h != 0 */\n"
    "extern \"C\" __global__ void charlm_back(const float *dy, const void *Wt, const float *h, float *dx, int B, int n_in, int n_out, int dt) {\n"
    "    FOR_EACH(i, (long long)B * n_in) {\n"
    "        long long b = i / n_in, k = i % n_in;\n"
    "        float acc = 0.0f;\n"
    "        for (int j = 0; j < n_out; j++) acc += dy[b * n_out + j] * W(Wt, (long long)j * n_in + k, dt);\n"
    "        dx[i] = h ? R(R(acc) * (1.0f - h[i] * h[i])) : R(acc);\n"
    "    }\n"
    "}\n"
    "/* gemb[c][e] = sum over positions holding token c of dx (the CPU's order) */\n"
    "extern \"C\" __global__ void charlm_grad_emb(const unsigned char *tok, const float *dx, void *gemb, int B, int T, int E, int V, int dt) {\n"
    "    FOR_EACH(i, (long long)V * E) {\n"
    "        long long c = i / E, e = i % E;\n"
    "        float acc = 0.0f;\n"
    "        for (int b = 0; b < B; b++)\n"
    "            for (int t = 0; t < T; t++)\n"
    "                if (tok[b * (T + 1) + t] == c) acc += dx[((long long)b * T + t) * E + e];\n"
    "        G(gemb, i, acc, dt);\n"
    "    }\n"
    "}\n"
    "/* inf/NaN in the (scaled) grads shows in their norm: flag it for the scaler;\n",
    "   clip factor from the unscaled norm (capex_clip_coef) */\n"
    "extern \"C\" __global__ void charlm_clip(const float *norm, const float *inv_scale, unsigned *found_inf, float *coef, float max_norm) {\n"
    "    float n = *norm, c = 1.0f;\n"
    "    if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
    "    if (!(n - n == 0.0f)) *found_inf = 1u;\n"
    "    else if (max_norm > 0.0f) {\n"
    "        float t = n * *inv_scale;\n"
    "        if (t - t == 0.0f) { c = max_norm / (t + 1e-6f); if (!(c < 1.0f)) c = 1.0f; }\n"
    "    }\n"
    "    *coef = c;\n"
    "}\n"};

enum { K_EMBED, K_HIDDEN, K_LOGITS, K_LOSS, K_DLOGITS, K_GRAD_W, K_BACK, K_GRAD_EMB, K_CLIP, N_KERNELS };
static const char *const charlm_kernel_names[N_KERNELS] = {"charlm_embed",  "charlm_hidden", "charlm_logits",
                                                          "charlm_loss",   "charlm_dlogits", "charlm_grad_w",
                                                          "charlm_back",   "charlm_grad_emb", "charlm_clip"};

typedef struct gpu_model {
    capex_cuda_context *ctx;
    capex_cuda_stream stream;
    capex_cuda_function fn[N_KERNELS];
    const model *m;
    size_t wsize, gsize; /* bytes per weight / gradient element */
    int dt;              /* the kernels' dtype code: weights | act << 2 | grads << 4 | round grads << 6 */
    capex_cuda_ptr buf[8];
} gpu_model;
enum { G_TOK, G_X, G_H, G_PROBS, G_ROW_LOSS, G_DLOGITS, G_DH, G_DX };

static int dtype_code(capex_dtype t) { return t == CAPEX_F16 ? 1 : t == CAPEX_BF16 ? 2 : 0; }

static capex_result gpu_launch(gpu_model *g, int k, int64_t threads, void **args) {
    unsigned grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    int64_t blocks = (threads + 255) / 256;
    grid[0] = (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
    return capex_cuda_launch(&g->fn[k], grid, block, 0, g->stream, args);
}

/* Compiles this run's kernel variant through capex's JIT (disk-cached), allocates activations. */
static capex_result gpu_model_init(gpu_model *g, capex_cuda_context *ctx, capex_cuda_stream stream, const model *m,
                                   capex_dtype weight_t, capex_dtype grad_t, int ground) {
    const char *opts[1];
    const size_t n_parts = sizeof charlm_kernels_parts / sizeof charlm_kernels_parts[0];
    const size_t B = (size_t)m->batch, D = (size_t)m->ctx * m->emb;
    size_t sizes[8], i, len = 1;
    char *src;
    capex_cuda_module *mod = NULL;
    capex_result r;
    memset(g, 0, sizeof *g);
    g->ctx = ctx; g->stream = stream; g->m = m;
    g->wsize = capex_dtype_size(weight_t);
    g->gsize = capex_dtype_size(grad_t);
    g->dt = dtype_code(weight_t) | dtype_code(m->act) << 2 | dtype_code(grad_t) << 4 | (ground ? 1 : 0) << 6;
    opts[0] = "--fmad=false"; /* multiply and add rounded apart, as in the CPU code */
    for (i = 0; i < n_parts; i++) len += strlen(charlm_kernels_parts[i]);
    if (!(src = (char *)malloc(len))) return CAPEX_ERR_OUT_OF_MEMORY;
    src[0] = '\0';
    for (i = 0; i < n_parts; i++) strcat(src, charlm_kernels_parts[i]);
    r = capex_cuda_module_compile(ctx, src, "charlm_kernels", opts, 1, &mod); /* compiled once, then cached */
    free(src);
    for (i = 0; r == CAPEX_OK && i < N_KERNELS; i++) r = capex_cuda_module_get_function(mod, charlm_kernel_names[i], &g->fn[i]);
    sizes[G_TOK] = B * (size_t)(m->ctx + 1);
    sizes[G_X] = sizes[G_DX] = B * D * 4;
    sizes[G_H] = sizes[G_DH] = B * (size_t)m->hidden * 4;
    sizes[G_PROBS] = sizes[G_DLOGITS] = B * (size_t)m->vocab * 4;
    sizes[G_ROW_LOSS] = B * 8;
    for (i = 0; r == CAPEX_OK && i < 8; i++) r = capex_cuda_malloc(ctx, sizes[i], &g->buf[i]);
    return r;
}

static void gpu_model_free(gpu_model *g) {
    int i;
    if (g->ctx)
        for (i = 0; i < 8; i++) capex_cuda_free(g->ctx, g->buf[i]);
}

/* Forward over the tokens in buf[G_TOK] with weights w: mean loss into
   *loss_out (device float; 0: none) and loss * batch added to *loss_acc
   (device double; 0: none). Nothing is read back. */
static capex_result gpu_forward(gpu_model *g, capex_cuda_ptr w, capex_cuda_ptr loss_out, capex_cuda_ptr loss_acc) {
    const model *m = g->m;
    int B = m->batch, T = m->ctx, E = m->emb, H = m->hidden, V = m->vocab, D = T * E;
    capex_cuda_ptr emb = w + (capex_cuda_ptr)m->off[P_EMB] * g->wsize, W1 = w + (capex_cuda_ptr)m->off[P_W1] * g->wsize;
    capex_cuda_ptr b1 = w + (capex_cuda_ptr)m->off[P_B1] * g->wsize, W2 = w + (capex_cuda_ptr)m->off[P_W2] * g->wsize;
    capex_cuda_ptr b2 = w + (capex_cuda_ptr)m->off[P_B2] * g->wsize;
    capex_cuda_ptr *bf = g->buf;
    capex_result r;
    unsigned grid[3] = {1, 1, 1}, block[3] = {128, 1, 1};
    {
        void *a[] = {&bf[G_TOK], &emb, &bf[G_X], &B, &T, &E, &g->dt};
        if ((r = gpu_launch(g, K_EMBED, (int64_t)B * D, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_X], &W1, &b1, &bf[G_H], &B, &D, &H, &g->dt};
        if ((r = gpu_launch(g, K_HIDDEN, (int64_t)B * H, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_H], &W2, &b2, &bf[G_TOK], &bf[G_PROBS], &bf[G_ROW_LOSS], &H, &V, &T, &g->dt};
        grid[0] = (unsigned)B; /* one block per row */
        if ((r = capex_cuda_launch(&g->fn[K_LOGITS], grid, block, 0, g->stream, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_ROW_LOSS], &B, &loss_out, &loss_acc};
        return gpu_launch(g, K_LOSS, 1, a);
    }
}

/* Backward of (loss * *scale) into the gradient tensors grad[P_*] (device,
   grad dtype), each written whole; ready(i) is called as soon as tensor i
   is final, so its DDP bucket can start reducing while the rest runs. */
static capex_result gpu_backward(gpu_model *g, capex_cuda_ptr w, capex_cuda_ptr scale, const capex_cuda_ptr *grad,
                                 capex_ddp *ddp) {
    const model *m = g->m;
    int B = m->batch, T = m->ctx, E = m->emb, H = m->hidden, V = m->vocab, D = T * E;
    capex_cuda_ptr W1 = w + (capex_cuda_ptr)m->off[P_W1] * g->wsize, W2 = w + (capex_cuda_ptr)m->off[P_W2] * g->wsize;
    capex_cuda_ptr none = 0, *bf = g->buf;
    capex_result r;
    {
        void *a[] = {&bf[G_PROBS], &bf[G_TOK], &scale, &bf[G_DLOGITS], &B, &V, &T, &g->dt};
        if ((r = gpu_launch(g, K_DLOGITS, (int64_t)B * V, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_DLOGITS], &bf[G_H], (void *)&grad[P_W2], (void *)&grad[P_B2], &B, &H, &V, &g->dt};
        if ((r = gpu_launch(g, K_GRAD_W, (int64_t)V * (H + 1), a)) != CAPEX_OK) return r;
        if (ddp && ((r = capex_ddp_grad_ready(ddp, P_B2)) != CAPEX_OK || (r = capex_ddp_grad_ready(ddp, P_W2)) != CAPEX_OK)) return r;
    }
    {
        void *a[] = {&bf[G_DLOGITS], &W2, &bf[G_H], &bf[G_DH], &B, &H, &V, &g->dt};
        if ((r = gpu_launch(g, K_BACK, (int64_t)B * H, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_DH], &bf[G_X], (void *)&grad[P_W1], (void *)&grad[P_B1], &B, &D, &H, &g->dt};
        if ((r = gpu_launch(g, K_GRAD_W, (int64_t)H * (D + 1), a)) != CAPEX_OK) return r;
        if (ddp && ((r = capex_ddp_grad_ready(ddp, P_B1)) != CAPEX_OK || (r = capex_ddp_grad_ready(ddp, P_W1)) != CAPEX_OK)) return r;
    }
    {
        void *a[] = {&bf[G_DH], &W1, &none, &bf[G_DX], &B, &D, &H, &g->dt};
        if ((r = gpu_launch(g, K_BACK, (int64_t)B * D, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_TOK], &bf[G_DX], (void *)&grad[P_EMB], &B, &T, &E, &V, &g->dt};
        if ((r = gpu_launch(g, K_GRAD_EMB, (int64_t)V * E, a)) != CAPEX_OK) return r;
        if (ddp && (r = capex_ddp_grad_ready(ddp, P_EMB)) != CAPEX_OK) return r;
    }
    return CAPEX_OK;
}

/* Validation loss on the CPU path's windows; one read-back at the end. */
static float gpu_evaluate(gpu_model *g, capex_cuda_ptr w, const text_data *d, int windows, capex_cuda_ptr acc) {
    int B = g->m->batch, T = g->m->ctx, i, done = 0;
    size_t first = d->n_train, span = d->n - d->n_train - (size_t)T - 1;
    unsigned char *tok = (unsigned char *)malloc((size_t)B * (T + 1));
    double sum = 0;
    capex_result r = tok ? capex_cuda_memset_u8(g->ctx, acc, 0, 8, g->stream) : CAPEX_ERR_OUT_OF_MEMORY;
    windows = eval_window_count(windows, B);
    while (r == CAPEX_OK && done < windows) {
        for (i = 0; i < B; i++) {
            size_t start = first + (size_t)(((uint64_t)(done + i) * span) / (uint64_t)windows);
            memcpy(tok + (size_t)i * (T + 1), d->bytes + start, (size_t)T + 1);
        }
        /* from pageable memory the copy has consumed tok when it returns */
        r = capex_cuda_memcpy_htod(g->ctx, g->buf[G_TOK], tok, (size_t)B * (T + 1), g->stream);
        if (r == CAPEX_OK) r = gpu_forward(g, w, 0, acc);
        done += B;
    }
    if (r == CAPEX_OK) r = capex_cuda_memcpy_dtoh(g->ctx, &sum, acc, 8, g->stream);
    if (r == CAPEX_OK) r = capex_cuda_stream_synchronize(g->ctx, g->stream);
    free(tok);
    return r == CAPEX_OK ? (float)(sum / done) : NAN;
}

/* The GPU training run: train()'s loop with the model, the loss scaler, the
   optimizer (fp32 master weights + model copy), clipping and the gradient
   all-reduce on the device. Per step the host only picks the batch and
   enqueues work: the loss scale, the overflow flag, the clip factor and the
   losses stay on the GPU and are read back at log and evaluation points. */
static int train_gpu(const run_cfg *c, const text_data *d, capex_cuda_context *ctx, capex_comm *comm, int rank, int world,
                     run_result *res) {
    capex_amp_config amp;
    capex_dtype act = CAPEX_F32, grad_dtype;
    capex_scaler_desc sd;
    capex_scaler host_sc;
    capex_cuda_scaler *sc = NULL;
    capex_optim_desc od;
    capex_lr_schedule lrs;
    capex_cuda_optim *opt = NULL;
    capex_optim_param op[P_COUNT];
    capex_ddp *ddp = NULL;
    capex_ddp_param dp[P_COUNT];
    capex_ddp_desc dd;
    capex_tensor gt[P_COUNT];
    capex_tensor_list grads;
    capex_sampler smp;
    capex_cuda_stream stream = NULL;
    gpu_model g;
    model m;
    float *w32h = NULL, *losses = NULL;
    unsigned char *tok = NULL;
    capex_cuda_ptr w32 = 0, wh = 0, gbuf = 0, grad[P_COUNT], norm_ws = 0, scratch = 0;
    size_t ws_bytes = 0;
    int step = 0, i, ok = 0, model_ok = 0, logged = 0, ema_from = 0;
    uint64_t epoch = 0, pos = 0;
    double t0, ema = 0, tokens = 0;
    const int loss_cap = c->steps + 1;

    memset(res, 0, sizeof *res);
    memset(&g, 0, sizeof g);
    if (!text_fits(c, d, world)) return 0;
    CHECK(amp_setup(c, rank, &amp, &act));
    grad_dtype = amp.model_dtype;
    if (!model_init(&m, d->vocab, c->ctx, c->emb, c->hidden, c->batch, act)) goto oom;
    model_ok = 1;
    w32h = (float *)malloc((size_t)m.n_params * sizeof(float));
    losses = (float *)malloc((size_t)loss_cap * sizeof(float));
    tok = (unsigned char *)malloc((size_t)c->batch * (c->ctx + 1));
    if (!w32h || !losses || !tok) goto oom;
    model_init_weights(&m, w32h, c->seed);
    if (amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) /* O3: the fp32 copy holds half values only */
        for (i = 0; i < m.n_params; i++) w32h[i] = round_to(w32h[i], amp.model_dtype);

    CHECK(capex_cuda_stream_create(ctx, &stream));
    if (capex_comm_is_nccl(comm)) CHECK(capex_nccl_set_user_stream(comm, stream));
    CHECK(gpu_model_init(&g, ctx, stream, &m, amp.model_dtype == CAPEX_F32 ? CAPEX_F32 : amp.model_dtype, grad_dtype,
                         act != CAPEX_F32 && grad_dtype == CAPEX_F32));
    /* device buffers: fp32 weights (master under O2), the half model copy, the
       loss history, one scratch area (clip norm, clip factor, eval sum) */
    CHECK(capex_cuda_malloc(ctx, (size_t)m.n_params * 4, &w32));
    CHECK(capex_cuda_memcpy_htod(ctx, w32, w32h, (size_t)m.n_params * 4, NULL));
    if (world > 1) CHECK(capex_comm_broadcast(comm, (void *)(uintptr_t)w32, (size_t)m.n_params, CAPEX_F32, 0)); /* DDP's start */
    if (amp.model_dtype != CAPEX_F32) {
        CHECK(capex_cuda_malloc(ctx, (size_t)m.n_params * 2, &wh));
        CHECK(capex_cuda_convert(ctx, wh, amp.model_dtype, w32, CAPEX_F32, (size_t)m.n_params, stream));
    }
    CHECK(capex_cuda_malloc(ctx, 16 + (size_t)loss_cap * 4, &scratch)); /* norm f32, coef f32, eval f64, losses */

    /* gradients: in DDP's bucket buffers (reduced while backward runs) with
       several ranks; in one buffer of our own with one */
    if (world > 1) {
        for (i = 0; i < P_COUNT; i++) {
            dp[i].data = (void *)(uintptr_t)((wh ? wh : w32) + (capex_cuda_ptr)m.off[i] * (wh ? 2 : 4));
            dp[i].numel = (size_t)(m.off[i + 1] - m.off[i]);
            dp[i].dtype = grad_dtype;
            dp[i].grad = NULL;
        }
        capex_ddp_desc_init(&dd);
        dd.broadcast_parameters = 0; /* done above on the fp32 weights */
        if (c->bucket_bytes) dd.bucket_bytes = dd.first_bucket_bytes = c->bucket_bytes;
        dd.delay_allreduce = c->delay_allreduce;
        CHECK(capex_ddp_create(&ddp, comm, dp, P_COUNT, &dd));
        for (i = 0; i < P_COUNT; i++) grad[i] = (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(ddp, (size_t)i);
    } else {
        CHECK(capex_cuda_malloc(ctx, (size_t)m.n_params * capex_dtype_size(grad_dtype), &gbuf));
        for (i = 0; i < P_COUNT; i++) grad[i] = gbuf + (capex_cuda_ptr)m.off[i] * capex_dtype_size(grad_dtype);
    }
    for (i = 0; i < P_COUNT; i++) {
        gt[i].data = (void *)(uintptr_t)grad[i];
        gt[i].numel = m.off[i + 1] - m.off[i];
    }
    grads = capex_tensor_list_make(grad_dtype, gt, P_COUNT);
    CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &grads, 1, &ws_bytes));
    CHECK(capex_cuda_malloc(ctx, ws_bytes, &norm_ws));

    capex_optim_desc_init(&od, c->optim);
    od.defaults.lr = c->lr;
    od.defaults.weight_decay = c->wd;
    if (c->optim == CAPEX_OPTIM_SGD) od.defaults.momentum = 0.9f;
    if (c->optim == CAPEX_OPTIM_LAMB) od.max_grad_norm = c->clip;
    CHECK(capex_cuda_optim_create(ctx, &od, &opt));
    for (i = 0; i < P_COUNT; i++) { /* the same wiring as the CPU path, device pointers */
        capex_optim_param_init(&op[i]);
        CHECK(capex_optim_param_from_amp(&amp, (float *)(uintptr_t)(w32 + (capex_cuda_ptr)m.off[i] * 4),
                                         wh ? (void *)(uintptr_t)(wh + (capex_cuda_ptr)m.off[i] * 2) : NULL,
                                         (const void *)(uintptr_t)grad[i], m.off[i + 1] - m.off[i], &op[i]));
    }
    CHECK(capex_cuda_optim_add_group(opt, NULL, op, P_COUNT, NULL));
    CHECK(lr_schedule_for(c, &lrs));
    CHECK(capex_cuda_optim_set_lr_schedule(opt, &lrs, stream));

    scaler_desc_for(&amp, 0, &sd);
    CHECK(capex_cuda_scaler_create(ctx, &sd, &sc));
    CHECK(capex_scaler_init(&host_sc, &sd)); /* for checkpoints: the same format as the CPU run */
    CHECK(sampler_for(c, d, rank, world, &smp));

    if (c->resume_path) {
        capex_state_reader *rd = NULL;
        capex_optim *h = NULL;
        capex_scaler_state st;
        capex_result r = capex_state_reader_open_file(c->resume_path, 0, NULL, &rd);
        if (r == CAPEX_OK) r = load_position(rd, &step, &epoch, &pos, &ema, &ema_from);
        if (r == CAPEX_OK) r = capex_cuda_optim_to_host(opt, CAPEX_OPTIM_STATE_PARAMS, stream, &h);
        if (r == CAPEX_OK) r = capex_optim_load(h, rd, "optim", CAPEX_OPTIM_STATE_PARAMS);
        if (r == CAPEX_OK) r = capex_cuda_optim_from_host(opt, h, CAPEX_OPTIM_STATE_PARAMS, stream);
        if (r == CAPEX_OK) { int att = 0; r = capex_optim_get_lr_schedule(h, &lrs, &att); } /* the file's, for the log */
        if (r == CAPEX_OK) r = capex_scaler_load(&host_sc, rd, "scaler.0.");
        if (r == CAPEX_OK) r = capex_scaler_get_state(&host_sc, &st);
        if (r == CAPEX_OK) r = capex_cuda_scaler_set_state(sc, &st, stream);
        capex_optim_destroy(h);
        capex_state_reader_close(rd);
        if (!resumed(c, r, rank, step)) goto fail;
    }
    capex_sampler_set_epoch(&smp, epoch);

    t0 = capex_dist_now();
    logged = step;
    for (; step < c->steps; step++) {
        const capex_cuda_ptr dnorm = scratch, dcoef = scratch + 4, dloss = scratch + 16 + (capex_cuda_ptr)step * 4;
        const capex_cuda_ptr wcompute = wh ? wh : w32;
        const int saving = c->save_path && step + 1 == (c->save_at > 0 ? c->save_at : c->steps) && rank == 0;
        CHECK(next_batch(c, d, &smp, &epoch, &pos, tok));
        CHECK(capex_cuda_memcpy_htod(ctx, g.buf[G_TOK], tok, (size_t)c->batch * (c->ctx + 1), stream));

        CHECK(gpu_forward(&g, wcompute, dloss, 0));
        CHECK(gpu_backward(&g, wcompute, capex_cuda_scaler_scale_ptr(sc), grad, ddp));
        if (ddp) CHECK(capex_ddp_finalize(ddp));
        /* one pass over the (still scaled) grads: global norm; inf/NaN show up in it */
        CHECK(capex_cuda_multi_tensor_l2norm(ctx, NULL, &grads, norm_ws, ws_bytes, dnorm, 0, stream));
        {
            capex_cuda_ptr inv = capex_cuda_scaler_inv_scale_ptr(sc), found = capex_cuda_scaler_found_inf_ptr(sc);
            float max_norm = c->optim == CAPEX_OPTIM_LAMB ? 0.0f : c->clip; /* LAMB clips by itself */
            void *a[] = {(void *)&dnorm, &inv, &found, (void *)&dcoef, &max_norm};
            CHECK(gpu_launch(&g, K_CLIP, 1, a));
            CHECK(capex_cuda_optim_step(opt, inv, dcoef, found, stream)); /* skipped on the device after an overflow */
        }
        CHECK(capex_cuda_scaler_update(sc, stream));
        tokens += (double)c->batch * world;

        if ((c->log_every && rank == 0 && !c->quiet && step % c->log_every == 0) ||
            (c->eval_every && (step + 1) % c->eval_every == 0) || step == c->steps - 1 || saving) {
            /* read the losses since the last read (the only host sync besides checkpoints);
               the last step and a checkpoint need the training loss average too */
            CHECK(capex_cuda_memcpy_dtoh(ctx, losses + logged, scratch + 16 + (capex_cuda_ptr)logged * 4,
                                         (size_t)(step + 1 - logged) * 4, stream));
            CHECK(capex_cuda_stream_synchronize(ctx, stream));
            for (; logged <= step; logged++) ema = logged == ema_from ? losses[logged] : 0.98 * ema + 0.02 * losses[logged];
        }
        if (c->log_every && rank == 0 && !c->quiet && (step % c->log_every == 0 || step == c->steps - 1)) {
            double el = capex_dist_now() - t0;
            capex_scaler_state st;
            int64_t taken = 0;
            CHECK(capex_cuda_scaler_get_state(sc, &st, stream));
            CHECK(capex_cuda_optim_get_step(opt, 0, &taken, stream));
            printf("[%s] step %5d  loss %.4f  scale %-9g skipped %lld  lr %.2e  %.0f tok/s\n", c->label, step, losses[step],
                   st.scale, (long long)st.skipped_steps, capex_lr_at(&lrs, c->lr, taken), el > 0 ? tokens / el : 0.0);
        }
        if (c->eval_every && ((step + 1) % c->eval_every == 0 || step == c->steps - 1) && res->n_points < MAX_POINTS) {
            float vl = gpu_evaluate(&g, wcompute, d, c->eval_windows, scratch + 8);
            record_point(c, res, rank, step + 1, (float)ema, vl);
        }
        if (saving) {
            capex_state_writer *w = NULL;
            capex_optim *h = NULL;
            capex_scaler_state st;
            capex_result r = capex_state_writer_create(NULL, &w);
            if (r == CAPEX_OK) r = save_position(w, step + 1, epoch, pos, ema);
            if (r == CAPEX_OK) r = capex_cuda_optim_to_host(opt, CAPEX_OPTIM_STATE_PARAMS, stream, &h);
            if (r == CAPEX_OK) r = capex_optim_save(h, w, "optim", CAPEX_OPTIM_STATE_PARAMS);
            if (r == CAPEX_OK) r = capex_cuda_scaler_get_state(sc, &st, stream);
            if (r == CAPEX_OK) r = capex_scaler_set_state(&host_sc, &st);
            if (r == CAPEX_OK) r = capex_scaler_save(&host_sc, w, "scaler.0.");
            if (r == CAPEX_OK) r = capex_state_write_file(w, c->save_path);
            capex_state_writer_destroy(w);
            capex_optim_destroy(h);
            CHECK(r);
            if (!c->quiet) printf("[%s] checkpoint written to %s after step %d\n", c->label, c->save_path, step + 1);
        }
    }
    CHECK(capex_cuda_stream_synchronize(ctx, stream));
    res->seconds = capex_dist_now() - t0;
    res->tokens_per_s = res->seconds > 0 ? tokens / res->seconds : 0;
    {
        capex_scaler_state st;
        CHECK(capex_cuda_scaler_get_state(sc, &st, stream));
        res->skipped = st.skipped_steps;
    }
    res->train_loss = (float)ema;
    res->val_loss = gpu_evaluate(&g, wh ? wh : w32, d, c->eval_windows, scratch + 8);
    CHECK(capex_cuda_memcpy_dtoh(ctx, w32h, w32, (size_t)m.n_params * 4, NULL));
    res->weights_crc = capex_crc32(0, w32h, (size_t)m.n_params * sizeof(float));
    ok = 1;
    goto done;
oom:
    fprintf(stderr, "out of memory\n");
fail:
done:
    capex_cuda_optim_destroy(opt);
    capex_cuda_scaler_destroy(sc);
    capex_ddp_destroy(ddp);
    gpu_model_free(&g);
    if (ctx) {
        capex_cuda_free(ctx, w32); capex_cuda_free(ctx, wh); capex_cuda_free(ctx, gbuf);
        capex_cuda_free(ctx, norm_ws); capex_cuda_free(ctx, scratch);
        if (stream && capex_comm_is_nccl(comm)) capex_nccl_set_user_stream(comm, NULL); /* before the stream goes */
        if (stream) capex_cuda_stream_destroy(ctx, stream);
    }
    if (model_ok) model_free(&m);
    free(w32h); free(losses); free(tok);
    return ok;
}

/* ---- chart --------------------------------------------------------------- */

/* 1 when the whole chart reached the file */
static int write_svg(const char *path, const run_cfg *cfgs, const run_result *res, int n) {
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
    FILE *f = fopen(path, "w");
    float lo = INFINITY, hi = -INFINITY;
    int maxstep = 1, i, k;
    const int W = 720, H = 420, L = 60, R = 170, T = 30, Bm = 45;
    if (!f) { fprintf(stderr, "cannot write %s\n", path); return 0; }
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
    if (ferror(f) | fclose(f)) { fprintf(stderr, "writing %s failed\n", path); return 0; }
    return 1;
}

/* ---- command line -------------------------------------------------------- */

static int run_one(const run_cfg *c, const text_data *d, capex_cuda_context *ctx, capex_comm *comm, int rank, int world,
                   run_result *res) {
    return ctx && !c->zero ? train_gpu(c, d, ctx, comm, rank, world, res) : train(c, d, comm, rank, world, res);
}

/* One float per rank; NCCL moves device buffers only. */
static capex_result allgather_f32(capex_comm *comm, capex_cuda_context *ctx, const float *mine, float *all, int world) {
    capex_cuda_ptr dbuf = 0;
    capex_result r;
    if (!capex_comm_is_nccl(comm)) return capex_comm_allgather(comm, mine, all, 1, CAPEX_F32);
    r = capex_cuda_malloc(ctx, (size_t)(world + 1) * 4, &dbuf);
    if (r == CAPEX_OK) r = capex_cuda_memcpy_htod(ctx, dbuf, mine, 4, NULL);
    if (r == CAPEX_OK) r = capex_comm_allgather(comm, (const void *)(uintptr_t)dbuf, (void *)(uintptr_t)(dbuf + 4), 1, CAPEX_F32);
    if (r == CAPEX_OK) r = capex_cuda_context_synchronize(ctx);
    if (r == CAPEX_OK) r = capex_cuda_memcpy_dtoh(ctx, all, dbuf + 4, (size_t)world * 4, NULL);
    capex_cuda_free(ctx, dbuf);
    return r;
}

static void run_cfg_default(run_cfg *c) {
    memset(c, 0, sizeof *c);
    c->level = CAPEX_O2; c->half = CAPEX_F16; c->optim = CAPEX_OPTIM_ADAM;
    c->steps = 1500; c->batch = 64; c->ctx = 12; c->emb = 16; c->hidden = 256;
    c->lr = 3e-3f; c->wd = 0.01f; c->clip = 1.0f; c->min_lr_frac = 0.1f; c->warmup = 50; c->seed = 1337;
    c->sched = CAPEX_LR_COSINE;
    c->eval_every = 100; c->eval_windows = 4096; c->log_every = 100;
}

static void usage(void) {
    printf("usage: train_charlm [options]\n"
           "  --opt O0|O1|O2|O3     opt level (default O2)\n"
           "  --half fp16|bf16      half type for O1-O3 (default fp16)\n"
           "  --optim adamw|lamb|sgd (default adamw)\n"
           "  --steps N --batch B --lr X --wd X --clip X --seed N\n"
           "  --sched NAME          lr after the warmup: cosine (default), linear, poly, step,\n"
           "                        multistep, exp, constant, onecycle (decays to lr/10)\n"
           "  --warmup N            linear warmup steps (default 50, at most steps/10 + 1;\n"
           "                        onecycle: its rise)\n"
           "  --ctx N --emb N --hidden N   model size\n"
           "  --data FILE           training text (default: /usr/share/common-licenses/*)\n"
           "  --save FILE [--save-at STEP]  checkpoint\n"
           "  --resume FILE         continue from a checkpoint\n"
           "  --compare             run O0 (fp32), then the chosen level with fp16 and bf16\n"
           "                        (only --half if given); compare validation losses, chart\n"
           "  --svg FILE            chart path for --compare (default loss_curve.svg)\n"
           "  --tol X               allowed |val(level) - val(O0)| for --compare (default 0.05)\n"
           "  --bucket-kb N --delay-allreduce   DDP settings\n"
           "  --zero 1|2            ZeRO stage 1/2 instead of DDP: optimizer state (2: and\n"
           "                        gradients) sharded across ranks; CPU path, O0-O2\n"
           "  --device auto|cpu|gpu  where to train (default auto: the GPU when one is usable)\n"
           "  --log-every N --eval-every N --eval-windows N --quiet\n"
           "Launch several ranks with mpirun (build with CAPEX_MPI) or torchrun --no-python.\n");
}

/* Option values: the whole text a number in range, or exit status 2 saying
   so (atoi read "10x" as 10 and "abc" as 0). */
static int opt_int(const char *opt, const char *v, int *out) {
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < INT_MIN || x > INT_MAX) {
        fprintf(stderr, "%s: '%s' is not an integer\n", opt, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}
static int opt_float(const char *opt, const char *v, float *out) {
    char *end;
    double x;
    errno = 0;
    x = strtod(v, &end);
    if (end == v || *end || errno || !(x == x) || x > 3.4e38 || x < -3.4e38) {
        fprintf(stderr, "%s: '%s' is not a finite number\n", opt, v);
        return 0;
    }
    *out = (float)x;
    return 1;
}
static int opt_u64(const char *opt, const char *v, uint64_t *out) {
    char *end;
    unsigned long long x;
    errno = 0;
    x = strtoull(v, &end, 10);
    if (end == v || *end || errno || v[0] == '-') {
        fprintf(stderr, "%s: '%s' is not a non-negative integer\n", opt, v);
        return 0;
    }
    *out = (uint64_t)x;
    return 1;
}
/* Counts where 0 means off or the default: a negative one is refused (-1
   meant "every step" to --log-every's modulo). */
static int opt_count(const char *opt, const char *v, int *out) {
    if (!opt_int(opt, v, out)) return 0;
    if (*out >= 0) return 1;
    fprintf(stderr, "%s: '%s' is not a non-negative integer\n", opt, v);
    return 0;
}
/* --save's directory must take a file now, not after the whole run: the
   writer creates a temporary file next to the path, then renames it. */
static int save_path_writable(const char *path) {
    size_t n = strlen(path) + sizeof ".probe";
    char *probe = (char *)malloc(n);
    FILE *f;
    int ok;
    if (!probe) { fprintf(stderr, "--save: out of memory\n"); return 0; }
    snprintf(probe, n, "%s.probe", path);
    if ((ok = path[0] && (f = fopen(probe, "wb")) != NULL)) { fclose(f); remove(probe); }
    else fprintf(stderr, "--save '%s': cannot create a file there (%s)\n", path, path[0] ? strerror(errno) : "empty path");
    free(probe);
    /* a directory opens but does not read: the final rename onto it would fail */
    if (ok && (f = fopen(path, "rb")) != NULL) {
        if (fgetc(f) == EOF && ferror(f)) { fprintf(stderr, "--save '%s': not a file\n", path); ok = 0; }
        fclose(f);
    }
    return ok;
}
#define OPT_INT(dst) do { if (!opt_int(a, v, &(dst))) return 2; } while (0)
#define OPT_COUNT(dst) do { if (!opt_count(a, v, &(dst))) return 2; } while (0)
#define OPT_FLOAT(dst) do { if (!opt_float(a, v, &(dst))) return 2; } while (0)

int main(int argc, char **argv) {
    run_cfg cfg;
    text_data data;
    capex_dist_env env;
    capex_comm host_comm, nccl_comm, *comm = &host_comm;
    capex_cuda_context *ctx = NULL;
    const char *data_path = NULL, *svg = "loss_curve.svg", *device = "auto";
    int compare = 0, half_given = 0, warmup_given = 0, i, rc = 1, have_host = 0, have_nccl = 0;
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
        else if (!strcmp(a, "--steps")) OPT_INT(cfg.steps);
        else if (!strcmp(a, "--batch")) OPT_INT(cfg.batch);
        else if (!strcmp(a, "--lr")) OPT_FLOAT(cfg.lr);
        else if (!strcmp(a, "--warmup")) { OPT_INT(cfg.warmup); warmup_given = 1; }
        else if (!strcmp(a, "--sched")) {
            static const char *const names[8] = {"constant", "cosine", "linear", "poly", "step", "multistep", "exp", "onecycle"};
            int k, found = -1;
            for (k = 0; k < 8; k++) if (!strcmp(v, names[k])) found = k;
            if (found < 0) { fprintf(stderr, "--sched: constant, cosine, linear, poly, step, multistep, exp or onecycle\n"); return 2; }
            cfg.sched = (capex_lr_kind)found; /* names[] is in capex_lr_kind's order */
        }
        else if (!strcmp(a, "--wd")) OPT_FLOAT(cfg.wd);
        else if (!strcmp(a, "--clip")) {
            OPT_FLOAT(cfg.clip); /* a negative one silently skipped clipping (AdamW, SGD) or failed LAMB's setup */
            if (cfg.clip < 0) { fprintf(stderr, "--clip: '%s' is not >= 0 (0: no clipping)\n", v); return 2; }
        }
        else if (!strcmp(a, "--seed")) { if (!opt_u64(a, v, &cfg.seed)) return 2; }
        else if (!strcmp(a, "--ctx")) OPT_INT(cfg.ctx);
        else if (!strcmp(a, "--emb")) OPT_INT(cfg.emb);
        else if (!strcmp(a, "--hidden")) OPT_INT(cfg.hidden);
        else if (!strcmp(a, "--data")) data_path = v;
        else if (!strcmp(a, "--save")) cfg.save_path = v;
        else if (!strcmp(a, "--save-at")) OPT_COUNT(cfg.save_at);
        else if (!strcmp(a, "--resume")) cfg.resume_path = v;
        else if (!strcmp(a, "--svg")) svg = v;
        else if (!strcmp(a, "--tol")) OPT_FLOAT(tol);
        else if (!strcmp(a, "--bucket-kb")) {
            uint64_t kb;
            if (!opt_u64(a, v, &kb)) return 2;
            if (kb > ((uint64_t)1 << 40)) { fprintf(stderr, "--bucket-kb: at most 2^40\n"); return 2; }
            cfg.bucket_bytes = (size_t)kb * 1024;
        }
        else if (!strcmp(a, "--zero")) {
            OPT_INT(cfg.zero);
            if (cfg.zero < 1 || cfg.zero > 2) { fprintf(stderr, "--zero takes 1 or 2\n"); return 2; }
        }
        else if (!strcmp(a, "--log-every")) OPT_COUNT(cfg.log_every);
        else if (!strcmp(a, "--eval-every")) OPT_COUNT(cfg.eval_every);
        else if (!strcmp(a, "--eval-windows")) OPT_INT(cfg.eval_windows);
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "gpu")) { fprintf(stderr, "--device: auto, cpu or gpu\n"); return 2; }
            device = v;
        }
        else { fprintf(stderr, "unknown option %s (--help)\n", a); return 2; }
        i += used;
    }
    if (cfg.steps < 1 || cfg.batch < 1 || cfg.ctx < 1 || cfg.emb < 1 || cfg.hidden < 1 || !(cfg.lr > 0) || cfg.eval_windows < 1 ||
        cfg.warmup < 0) {
        fprintf(stderr, "steps, batch, ctx, emb, hidden, eval-windows and lr must be positive (warmup >= 0)\n");
        return 2;
    }
    if (!model_size_ok(cfg.ctx, cfg.emb)) return 2;
    if (cfg.save_at > cfg.steps || (cfg.save_at > 0 && !cfg.save_path)) {
        fprintf(stderr, "--save-at %d: needs --save FILE and a step within --steps %d\n", cfg.save_at, cfg.steps);
        return 2;
    }
    /* ZeRO is the CPU path: a GPU context would hand train() NCCL (device
       buffers only) for its host arrays with several ranks */
    if (cfg.zero && !strcmp(device, "gpu")) { fprintf(stderr, "--zero trains on the CPU: use --device cpu or auto\n"); return 2; }
    if (cfg.zero) device = "cpu";
    /* --compare runs three trainings from scratch: one checkpoint fits none of them */
    if (compare && (cfg.save_path || cfg.resume_path)) { fprintf(stderr, "--compare does not take --save or --resume\n"); return 2; }
    /* the default warmup shrinks with a short run; a --warmup given is kept */
    if (!warmup_given && cfg.warmup > cfg.steps / 10) cfg.warmup = cfg.steps / 10 + 1;
    if (cfg.save_path && !save_path_writable(cfg.save_path)) return 2;
#ifdef CAPEX_MPI
    MPI_Init(&argc, &argv);
#endif
    if (capex_dist_env_read(NULL, &env) != CAPEX_OK) {
        fprintf(stderr, "launcher environment: %s\n", capex_last_error());
        goto out_mpi;
    }
    capex_dist_log_init(&env);
    /* The GPU of this rank ($LOCAL_RANK) when there is one; else the CPU, saying why. */
    if (strcmp(device, "cpu") != 0) {
        int major = 0, minor = 0; /* the kernels need NVRTC (on a fresh machine: nothing cached yet) */
        if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK || capex_cuda_nvrtc_version(&major, &minor) != CAPEX_OK) {
            capex_cuda_context_destroy(ctx);
            ctx = NULL;
        }
    }
    if (strcmp(device, "cpu") != 0 && !ctx) {
        if (!strcmp(device, "gpu")) {
            fprintf(stderr, "--device gpu: %s\n", capex_last_error());
            goto out_mpi;
        }
        if (env.rank == 0) printf("no usable GPU, training on the CPU (%s)\n", capex_last_error());
    }
    /* Host comm (MPI, TCP or single) for the CPU path and to bootstrap NCCL
       under MPI; NCCL for several GPUs (its id over TCP without MPI). */
#ifdef CAPEX_MPI
    have_host = 1;
#else
    have_host = !ctx || env.world_size == 1;
#endif
    if (have_host && capex_comm_init_auto(&host_comm, &env) != CAPEX_OK) {
        have_host = 0;
        fprintf(stderr, "distributed setup failed: %s\n", capex_last_error());
        goto out;
    }
    if (ctx && env.world_size > 1) {
        capex_nccl_desc nd;
        capex_nccl_desc_init(&nd);
        nd.ctx = ctx;
        nd.bootstrap = have_host ? &host_comm : NULL;
        if (capex_comm_init_nccl(&nccl_comm, &env, &nd) != CAPEX_OK) {
            fprintf(stderr, "NCCL setup failed: %s\n", capex_last_error());
            goto out;
        }
        have_nccl = 1;
        comm = &nccl_comm;
    }
    if (!load_text(data_path, 0.1, &data)) goto out;
    if (env.rank == 0) {
        const capex_cuda_device_info *di = ctx ? capex_cuda_context_device(ctx) : NULL;
        char where[300];
        if (di) snprintf(where, sizeof where, "GPU %s (sm_%d%d)", di->name, di->cc_major, di->cc_minor);
        else snprintf(where, sizeof where, "the CPU");
        printf("capex %s  char-LM on %zu bytes of text (vocab %d, %zu train / %zu validation), %d rank(s) via %s, on %s\n",
               CAPEX_VERSION_STRING, data.n, data.vocab, data.n_train, data.n - data.n_train, env.world_size,
               capex_launcher_name(env.launcher), where);
    }
    if (!compare) {
        run_result res;
        float mine, *all = NULL;
        int same = 1;
        cfg.label = capex_opt_level_name(cfg.level);
        if (!run_one(&cfg, &data, ctx, comm, env.rank, env.world_size, &res)) goto out_data;
        /* DDP keeps replicas bit-identical: every rank's weight checksum must match.
           Allgather moves bits, so the crc travels as the bits of a float. */
        memcpy(&mine, &res.weights_crc, sizeof mine);
        all = (float *)malloc((size_t)env.world_size * sizeof(float));
        if (!all || allgather_f32(comm, ctx, &mine, all, env.world_size) != CAPEX_OK) {
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
            if (!run_one(&runs[i], &data, ctx, comm, env.rank, env.world_size, &res[i])) goto out_data;
        }
        if (env.rank == 0) {
            printf("\n%-10s %10s %10s %8s %10s\n", "run", "val loss", "train", "skipped", "tok/s");
            for (i = 0; i < n_runs; i++)
                printf("%-10s %10.4f %10.4f %8lld %10.0f\n", runs[i].label, res[i].val_loss, res[i].train_loss, (long long)res[i].skipped, res[i].tokens_per_s);
            if (write_svg(svg, runs, res, n_runs)) printf("chart: %s\n", svg);
            else worst = 1; /* no chart: a failed run, not a silent one */
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
    if (have_nccl) capex_comm_destroy(&nccl_comm);
    if (have_host) capex_comm_destroy(&host_comm);
    capex_cuda_context_destroy(ctx);
out_mpi:
#ifdef CAPEX_MPI
    MPI_Finalize();
#endif
    return rc;
}
