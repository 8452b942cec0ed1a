/* train_gpt.c - a small GPT (decoder-only transformer, GPT-2 layout) written
   in plain C and trained with capex: opt levels O0-O3 with fp16 or bf16,
   dynamic loss scaling, fp32 master weights, fused AdamW or LAMB, gradient
   clipping, a warmup + cosine learning-rate schedule, DDP over TCP or MPI,
   checkpoints that resume bit-identically, and text sampled at the end; on
   the CPU, or on GPUs (--device gpu; default auto: the GPU when usable), one
   per rank, data parallel over NCCL with several.

     make gpt                # O2 fp16, 1000 steps: val ~1.6 nats/byte (make run: 1.86)
     build/examples/train_gpt --opt O2 --half bf16 --optim lamb
     build/examples/train_gpt --save ckpt.safetensors --save-at 200
     build/examples/train_gpt --resume ckpt.safetensors
     build/examples/train_gpt --device gpu   # kernels JIT-compiled by capex (NVRTC)
     WORLD_SIZE=2 RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build/examples/train_gpt  # each rank
     torchrun --no-python --nproc-per-node 8 build/examples/train_gpt --device gpu  # 8 GPUs, NCCL

   Model (llm.c's GPT-2 in miniature): byte tokens (vocab 256), token +
   position embeddings, L pre-norm blocks x += attn(ln1(x)); x += mlp(ln2(x))
   with causal multi-head self-attention and a GELU (tanh) MLP, a final norm
   and an output head tied to the token embedding. The norms are capex's
   fused LayerNorm (or RMSNorm with --norm rms). Forward and backward are
   plain C loops behind a two-function backend (gpt_backend); the training
   loop only sees flat weight and gradient vectors. The GPU path ("GPU path"
   below) is the same two calls as CUDA kernels on device vectors
   (gpu_forward, gpu_backward) in train_gpu, whose optimizer, loss scaler and
   clipping run on the device too (capex_cuda.h), and whose gradients go
   through capex_ddp on NCCL with several ranks; without a usable GPU it
   says why and the CPU trains. Its checkpoints are the CPU's format. */
#define CAPEX_CUDA_IMPLEMENTATION /* the CUDA backend (run-time loaded) and capex.h's implementation */
#include "../capex_cuda.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- data: bytes of text, split into train / validation ----------------- */

typedef struct text_data {
    unsigned char *bytes; /* byte-level tokens: the token id is the byte */
    size_t n, n_train;    /* first n_train tokens train, the rest validate */
} text_data;

/* The licence texts every Debian/Ubuntu system ships (~250 KB of English). */
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
    int files = 0;
    memset(d, 0, sizeof *d);
    if (path) files = append_file(path, &raw, &n, &cap);
    else
        for (i = 0; i < sizeof default_corpus / sizeof default_corpus[0]; i++) files += append_file(default_corpus[i], &raw, &n, &cap);
    if (!files || n < 4096) {
        fprintf(stderr, "no training text: %s (give a text file of 4 KB or more with --data FILE)\n",
                path ? path : "/usr/share/common-licenses/* not found");
        free(raw);
        return 0;
    }
    d->bytes = raw;
    d->n = n;
    d->n_train = (size_t)((double)n * (1.0 - val_fraction));
    return 1;
}

/* ---- model ---------------------------------------------------------------
   All weights live in one flat vector of P_COUNT tensors (per-layer tensors
   stacked, as in llm.c), so the optimizer, DDP buckets and checkpoints see a
   handful of contiguous tensors. Mixed precision is emulated as torch.autocast
   runs it: matmul inputs, weights and outputs are rounded to the half type
   (fp32 accumulation, as on tensor cores), GELU runs in half, while the
   embeddings, residual stream, norms, softmax and loss stay fp32. Backward
   rounds at the same points. With act = CAPEX_F32 nothing is rounded. */

enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B,
    P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_COUNT
};
static const char *const param_names[P_COUNT] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
    "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
/* the tensors only matmuls read (O1 rounds these weights to half) */
static int is_matmul_param(int p) { return p == P_QKVW || p == P_QKVB || p == P_ATTPROJW || p == P_ATTPROJB || p == P_FCW || p == P_FCB || p == P_FCPROJW || p == P_FCPROJB; }

#define VOCAB 256

typedef struct gpt_config {
    int seq, layers, heads, channels; /* T, L, NH, C */
    int rms;                          /* 1: RMSNorm (no bias), 0: LayerNorm */
} gpt_config;

typedef struct gpt {
    gpt_config cfg;
    int batch;
    int64_t off[P_COUNT + 1]; /* tensor i is [off[i], off[i+1]) of the flat vector */
    int64_t n_params;
    capex_dtype act;         /* matmul dtype: CAPEX_F32 = plain fp32 */
    /* activations of the last forward (B*T rows) */
    float *encoded;                    /* [BT, C] residual stream input */
    float *ln1, *ln1_mean, *ln1_rstd;  /* [L, BT, C], [L, BT] */
    float *qkv, *att, *atty;           /* [L, BT, 3C], [L, B, NH, T, T], [L, BT, C] */
    float *residual2, *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;             /* [L, BT, 4C] */
    float *residual3;                  /* [L, BT, C] */
    float *lnf, *lnf_mean, *lnf_rstd;  /* [BT, C], [BT] */
    float *probs;                      /* [BT, V] */
    float *wte_head;                   /* [V, C] the tied head's weights as the matmul sees them */
    /* backward scratch */
    float *d_res, *d_a, *d_b, *d_big, *d_big2, *d_qkv, *d_att, *d_head; /* d_head: [V, C] */
} gpt;

static float round_to(float v, capex_dtype t) {
    return t == CAPEX_F16 ? capex_f16_to_f32(capex_f32_to_f16(v)) : t == CAPEX_BF16 ? capex_bf16_to_f32(capex_f32_to_bf16(v)) : v;
}
static void round_array(float *a, int64_t n, capex_dtype t) {
    int64_t i;
    if (t == CAPEX_F32) return;
    for (i = 0; i < n; i++) a[i] = round_to(a[i], t);
}

static void gpt_free(gpt *m) {
    float **bufs[] = {&m->encoded, &m->ln1, &m->ln1_mean, &m->ln1_rstd, &m->qkv, &m->att, &m->atty, &m->residual2,
                      &m->ln2, &m->ln2_mean, &m->ln2_rstd, &m->fch, &m->fch_gelu, &m->residual3, &m->lnf,
                      &m->lnf_mean, &m->lnf_rstd, &m->probs, &m->wte_head, &m->d_res, &m->d_a, &m->d_b,
                      &m->d_big, &m->d_big2, &m->d_qkv, &m->d_att, &m->d_head};
    size_t i;
    for (i = 0; i < sizeof bufs / sizeof bufs[0]; i++) { free(*bufs[i]); *bufs[i] = NULL; }
}

/* The configuration and the flat weight layout (off, n_params); no buffers. */
static int gpt_layout(gpt *m, const gpt_config *cfg, int batch, capex_dtype act) {
    const int64_t T = cfg->seq, L = cfg->layers, C = cfg->channels, NH = cfg->heads;
    int64_t sizes[P_COUNT];
    int i;
    memset(m, 0, sizeof *m);
    if (T < 1 || L < 1 || C < 1 || NH < 1 || C % NH != 0 || batch < 1) {
        fprintf(stderr, "model: seq, layers, heads, channels and batch must be positive, channels a multiple of heads\n");
        return 0;
    }
    /* the int64 sizes below (and gpt_init's) would overflow long before an
       allocation could succeed: refuse over 2^40 parameters or activations */
    if ((double)L * 12 * C * C + (double)C * (double)(VOCAB + T + 13 * L + 2) > 1099511627776.0 ||
        (double)L * batch * T * ((double)NH * T + 4.0 * C) > 1099511627776.0) {
        fprintf(stderr, "model: %d layers of %d channels, seq %d, batch %d: over 2^40 parameters or activations\n",
                cfg->layers, cfg->channels, cfg->seq, batch);
        return 0;
    }
    m->cfg = *cfg; m->batch = batch; m->act = act;
    sizes[P_WTE] = VOCAB * C; sizes[P_WPE] = T * C;
    sizes[P_LN1W] = L * C; sizes[P_LN1B] = L * C;
    sizes[P_QKVW] = L * 3 * C * C; sizes[P_QKVB] = L * 3 * C;
    sizes[P_ATTPROJW] = L * C * C; sizes[P_ATTPROJB] = L * C;
    sizes[P_LN2W] = L * C; sizes[P_LN2B] = L * C;
    sizes[P_FCW] = L * 4 * C * C; sizes[P_FCB] = L * 4 * C;
    sizes[P_FCPROJW] = L * C * 4 * C; sizes[P_FCPROJB] = L * C;
    sizes[P_LNFW] = C; sizes[P_LNFB] = C;
    m->off[0] = 0;
    for (i = 0; i < P_COUNT; i++) m->off[i + 1] = m->off[i] + sizes[i];
    m->n_params = m->off[P_COUNT];
    return 1;
}

static int gpt_init(gpt *m, const gpt_config *cfg, int batch, capex_dtype act) {
    const int64_t T = cfg->seq, L = cfg->layers, C = cfg->channels, NH = cfg->heads, BT = (int64_t)batch * T;
    int ok = 1;
    if (!gpt_layout(m, cfg, batch, act)) return 0;
#define ALLOC(p, n) ok &= ((p) = (float *)calloc((size_t)(n), sizeof(float))) != NULL
    ALLOC(m->encoded, BT * C);
    ALLOC(m->ln1, L * BT * C); ALLOC(m->ln1_mean, L * BT); ALLOC(m->ln1_rstd, L * BT);
    ALLOC(m->qkv, L * BT * 3 * C); ALLOC(m->att, L * batch * NH * T * T); ALLOC(m->atty, L * BT * C);
    ALLOC(m->residual2, L * BT * C); ALLOC(m->ln2, L * BT * C); ALLOC(m->ln2_mean, L * BT); ALLOC(m->ln2_rstd, L * BT);
    ALLOC(m->fch, L * BT * 4 * C); ALLOC(m->fch_gelu, L * BT * 4 * C); ALLOC(m->residual3, L * BT * C);
    ALLOC(m->lnf, BT * C); ALLOC(m->lnf_mean, BT); ALLOC(m->lnf_rstd, BT);
    ALLOC(m->probs, BT * VOCAB); ALLOC(m->wte_head, VOCAB * C);
    ALLOC(m->d_res, BT * C); ALLOC(m->d_a, BT * C); ALLOC(m->d_b, BT * C);
    ALLOC(m->d_big, BT * 4 * C); ALLOC(m->d_big2, BT * 4 * C); ALLOC(m->d_qkv, BT * 3 * C);
    ALLOC(m->d_att, (int64_t)batch * NH * T * T); ALLOC(m->d_head, VOCAB * C);
#undef ALLOC
    if (!ok) { gpt_free(m); fprintf(stderr, "out of memory\n"); }
    return ok;
}

/* Deterministic init from a seed (GPT-2): weights ~ N(0, 0.02), the two
   residual projections N(0, 0.02/sqrt(2L)), biases 0, norm gains 1. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); } /* (0,1) */
static float rng_normal(uint64_t *s) { /* Box-Muller */
    double u = rng_unit(s), v = rng_unit(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void gpt_init_weights(const gpt *m, float *w, uint64_t seed) {
    int p;
    int64_t i;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.layers);
    for (p = 0; p < P_COUNT; p++) {
        float *t = w + m->off[p];
        int64_t n = m->off[p + 1] - m->off[p];
        if (p == P_LN1W || p == P_LN2W || p == P_LNFW) for (i = 0; i < n; i++) t[i] = 1.0f;
        else if (p == P_LN1B || p == P_LN2B || p == P_LNFB || p == P_QKVB || p == P_ATTPROJB || p == P_FCB || p == P_FCPROJB)
            for (i = 0; i < n; i++) t[i] = 0.0f;
        else {
            float sd = (p == P_ATTPROJW || p == P_FCPROJW) ? proj_std : 0.02f;
            for (i = 0; i < n; i++) t[i] = rng_normal(&seed) * sd;
        }
    }
}

/* ---- the layers (forward and backward, llm.c's loops) ------------------- */

/* out[bt][o] = round(bias[o] + sum_i inp[bt][i] * w[o][i]); w is [OC][IC].
   Each output is summed in i order; the loop runs over a transposed copy of
   w so the innermost loop (over o) is contiguous and vectorises. */
static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int64_t BT, int IC, int OC,
                           capex_dtype act) {
    float *wt = (float *)malloc((size_t)IC * OC * sizeof(float));
    int64_t bt;
    int i, o;
    if (!wt) { for (bt = 0; bt < BT * OC; bt++) out[bt] = NAN; return; } /* shows as a NaN loss */
    for (o = 0; o < OC; o++)
        for (i = 0; i < IC; i++) wt[(size_t)i * OC + o] = w[(size_t)o * IC + i];
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (bt = 0; bt < BT; bt += 4) { /* 4 rows per pass over wt: a quarter of the weight reads */
        const int nr = BT - bt < 4 ? (int)(BT - bt) : 4;
        int ii, oo, r;
        for (r = 0; r < nr; r++)
            for (oo = 0; oo < OC; oo++) out[(bt + r) * OC + oo] = 0.0f;
        for (ii = 0; ii < IC; ii++) {
            const float *wr = wt + (size_t)ii * OC;
            for (r = 0; r < nr; r++) {
                float *y = out + (bt + r) * OC;
                const float xi = inp[(bt + r) * IC + ii];
                for (oo = 0; oo < OC; oo++) y[oo] += xi * wr[oo];
            }
        }
        for (r = 0; r < nr; r++) {
            float *y = out + (bt + r) * OC;
            for (oo = 0; oo < OC; oo++) y[oo] = round_to(y[oo] + (bias ? bias[oo] : 0.0f), act);
        }
    }
    free(wt);
}

/* dinp = round(dout W) (written); dweight = round(dout^T inp), dbias = sum dout
   (written: every weight slice feeds one matmul per step, except the tied
   head, which the caller adds). Every output has one thread and sums in a
   fixed order (over o, resp. bt): deterministic for any thread count. */
static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *w, int64_t BT, int IC, int OC, capex_dtype act) {
    int64_t bt;
    int o;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (bt = 0; bt < BT; bt += 4) { /* 4 rows per pass over w */
        const int nr = BT - bt < 4 ? (int)(BT - bt) : 4;
        int i, oo, r;
        for (r = 0; r < nr; r++)
            for (i = 0; i < IC; i++) dinp[(bt + r) * IC + i] = 0.0f;
        for (oo = 0; oo < OC; oo++) {
            const float *wr = w + (size_t)oo * IC;
            for (r = 0; r < nr; r++) {
                float *di = dinp + (bt + r) * IC;
                const float dv = dout[(bt + r) * OC + oo];
                for (i = 0; i < IC; i++) di[i] += dv * wr[i];
            }
        }
        for (r = 0; r < nr; r++)
            for (i = 0; i < IC; i++) dinp[(bt + r) * IC + i] = round_to(dinp[(bt + r) * IC + i], act);
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (o = 0; o < OC; o += 4) { /* 4 weight rows per pass over inp */
        const int no = OC - o < 4 ? OC - o : 4;
        float db[4] = {0, 0, 0, 0};
        int64_t b;
        int i, k;
        for (k = 0; k < no; k++)
            for (i = 0; i < IC; i++) dweight[(size_t)(o + k) * IC + i] = 0.0f;
        for (b = 0; b < BT; b++) {
            const float *x = inp + b * IC;
            for (k = 0; k < no; k++) {
                float *dw = dweight + (size_t)(o + k) * IC;
                const float dv = dout[b * OC + o + k];
                for (i = 0; i < IC; i++) dw[i] += dv * x[i];
                db[k] += dv;
            }
        }
        for (k = 0; k < no; k++) {
            float *dw = dweight + (size_t)(o + k) * IC;
            for (i = 0; i < IC; i++) dw[i] = round_to(dw[i], act);
            if (dbias) dbias[o + k] = round_to(db[k], act);
        }
    }
}

/* The block's norm through capex (LayerNorm or RMSNorm, fp32 statistics);
   the output feeds a matmul, so it is rounded to act. */
static capex_result norm_forward(const gpt *m, float *y, float *mean, float *rstd, const float *x, const float *w,
                                 const float *b, int64_t rows) {
    capex_norm_desc nd;
    capex_norm_args a;
    capex_result r;
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&a);
    a.rows = rows; a.cols = m->cfg.channels;
    a.x_dtype = a.y_dtype = a.param_dtype = CAPEX_F32;
    a.x = x; a.weight = w; a.bias = m->cfg.rms ? NULL : b; a.y = y; a.mean = mean; a.rstd = rstd;
    r = m->cfg.rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a);
    round_array(y, rows * m->cfg.channels, m->act);
    return r;
}

/* dx (written), dw, db (written; db zeroed under RMSNorm, which has no bias). */
static capex_result norm_backward(const gpt *m, float *dx, float *dw, float *db, const float *dy, const float *x,
                                  const float *mean, const float *rstd, const float *w, int64_t rows) {
    capex_norm_desc nd;
    capex_norm_args a;
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&a);
    a.rows = rows; a.cols = m->cfg.channels;
    a.x_dtype = a.y_dtype = a.param_dtype = CAPEX_F32;
    a.x = x; a.weight = w; a.mean = (float *)mean; a.rstd = (float *)rstd; a.dy = dy; a.dx = dx; a.dweight = dw;
    if (m->cfg.rms) { memset(db, 0, (size_t)m->cfg.channels * sizeof(float)); return capex_rms_norm_backward(&nd, &a); }
    a.dbias = db;
    return capex_layer_norm_backward(&nd, &a);
}

/* Causal self-attention over qkv [BT, 3C] (q | k | v, head h at h*hs):
   att = softmax(q.k / sqrt(hs)) over keys 0..t (fp32), out = att v. */
static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, capex_dtype act) {
    const int hs = C / NH, C3 = 3 * C;
    const float sc = 1.0f / sqrtf((float)hs);
    int b, t, h;
#ifdef _OPENMP
#pragma omp parallel for collapse(3) schedule(static)
#endif
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *a = att + (((size_t)b * NH + h) * T + t) * T, mx = -INFINITY, sum = 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                int t2, i;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float v = 0.0f;
                    for (i = 0; i < hs; i++) v += q[i] * k[i];
                    v = round_to(round_to(v, act) * sc, act); /* the score matmul's half output */
                    a[t2] = v;
                    if (v > mx) mx = v;
                }
                for (t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - mx); sum += a[t2]; }
                for (t2 = 0; t2 <= t; t2++) a[t2] = round_to(a[t2] / sum, act); /* fp32 softmax, half into the matmul */
                for (t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
                for (i = 0; i < hs; i++) o[i] = 0.0f;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs, w = a[t2];
                    for (i = 0; i < hs; i++) o[i] += w * v[i];
                }
                for (i = 0; i < hs; i++) o[i] = round_to(o[i], act);
            }
}

/* dqkv (written) from dout; datt is scratch [B, NH, T, T]. Two passes so
   every output has one owner: dq and datt per query row, then dk and dv per
   key row (summing over the queries that see it, in query order). */
static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH, capex_dtype act) {
    const int hs = C / NH, C3 = 3 * C;
    const float sc = 1.0f / sqrtf((float)hs);
    int b, t, h;
#ifdef _OPENMP
#pragma omp parallel for collapse(3) schedule(static)
#endif
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < NH; h++) {
                const float *a = att + (((size_t)b * NH + h) * T + t) * T, *d = dout + ((size_t)b * T + t) * C + h * hs;
                float *da = datt + (((size_t)b * NH + h) * T + t) * T, dot = 0.0f;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                int t2, i;
                for (t2 = 0; t2 <= t; t2++) { /* datt = dout . v (a half matmul) */
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    float s = 0.0f;
                    for (i = 0; i < hs; i++) s += d[i] * v[i];
                    da[t2] = round_to(s, act);
                }
                for (t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];
                for (t2 = 0; t2 <= t; t2++) da[t2] = round_to(a[t2] * (da[t2] - dot) * sc, act); /* softmax', 1/sqrt(hs) */
                for (i = 0; i < hs; i++) dq[i] = 0.0f;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    for (i = 0; i < hs; i++) dq[i] += da[t2] * k[i];
                }
                for (i = 0; i < hs; i++) dq[i] = round_to(dq[i], act);
            }
#ifdef _OPENMP
#pragma omp parallel for collapse(3) schedule(static)
#endif
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < NH; h++) { /* t is the key / value row here */
                float *dk = dqkv + ((size_t)b * T + t) * C3 + C + h * hs, *dv = dk + C;
                int tq, i;
                for (i = 0; i < hs; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }
                for (tq = t; tq < T; tq++) {
                    const float *q = qkv + ((size_t)b * T + tq) * C3 + h * hs, *d = dout + ((size_t)b * T + tq) * C + h * hs;
                    const float da = datt[(((size_t)b * NH + h) * T + tq) * T + t], a = att[(((size_t)b * NH + h) * T + tq) * T + t];
                    for (i = 0; i < hs; i++) { dk[i] += da * q[i]; dv[i] += a * d[i]; }
                }
                for (i = 0; i < hs; i++) { dk[i] = round_to(dk[i], act); dv[i] = round_to(dv[i], act); }
            }
}

/* GELU, tanh approximation (GPT-2; torch GELU(approximate='tanh')), in act. */
#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
static void gelu_forward(float *out, const float *x, int64_t n, capex_dtype act) {
    int64_t i;
    for (i = 0; i < n; i++) {
        const float v = x[i];
        out[i] = round_to(0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v))), act);
    }
}
static void gelu_backward(float *dx, const float *x, const float *dout, int64_t n, capex_dtype act) {
    int64_t i;
    for (i = 0; i < n; i++) {
        const float v = x[i], u = GELU_S * (v + 0.044715f * v * v * v), th = tanhf(u);
        const float du = GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = round_to(dout[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du), act);
    }
}

/* ---- forward / backward of the whole model ------------------------------- */

/* tokens: B rows of T+1 bytes; row b's inputs are [0, T), its targets [1, T].
   Returns the mean cross-entropy over the B*T positions (NAN if a capex call
   failed) and keeps the activations (probs: the next-byte distributions). */
static float gpt_forward(gpt *m, const float *w, const unsigned char *tokens) {
    const int B = m->batch, T = m->cfg.seq, C = m->cfg.channels, L = m->cfg.layers, NH = m->cfg.heads;
    const int64_t BT = (int64_t)B * T;
    const float *res;
    double loss = 0.0;
    int64_t bt;
    int l, c;
    capex_result r = CAPEX_OK;
    for (bt = 0; bt < BT; bt++) {
        const float *te = w + m->off[P_WTE] + (size_t)tokens[(bt / T) * (T + 1) + bt % T] * C;
        const float *pe = w + m->off[P_WPE] + (size_t)(bt % T) * C;
        for (c = 0; c < C; c++) m->encoded[bt * C + c] = te[c] + pe[c];
    }
    res = m->encoded;
    for (l = 0; l < L; l++) {
        const int64_t a = (int64_t)l * BT * C;
        float *ln1 = m->ln1 + a, *qkv = m->qkv + 3 * a, *atty = m->atty + a, *res2 = m->residual2 + a;
        float *ln2 = m->ln2 + a, *fch = m->fch + 4 * a, *fchg = m->fch_gelu + 4 * a, *res3 = m->residual3 + a;
        float *att = m->att + (size_t)l * B * NH * T * T;
        int64_t i;
        if (r == CAPEX_OK) r = norm_forward(m, ln1, m->ln1_mean + l * BT, m->ln1_rstd + l * BT, res, w + m->off[P_LN1W] + l * C, w + m->off[P_LN1B] + l * C, BT);
        matmul_forward(qkv, ln1, w + m->off[P_QKVW] + (size_t)l * 3 * C * C, w + m->off[P_QKVB] + l * 3 * C, BT, C, 3 * C, m->act);
        attention_forward(atty, att, qkv, B, T, C, NH, m->act);
        matmul_forward(m->d_a, atty, w + m->off[P_ATTPROJW] + (size_t)l * C * C, w + m->off[P_ATTPROJB] + l * C, BT, C, C, m->act);
        for (i = 0; i < BT * C; i++) res2[i] = res[i] + m->d_a[i];
        if (r == CAPEX_OK) r = norm_forward(m, ln2, m->ln2_mean + l * BT, m->ln2_rstd + l * BT, res2, w + m->off[P_LN2W] + l * C, w + m->off[P_LN2B] + l * C, BT);
        matmul_forward(fch, ln2, w + m->off[P_FCW] + (size_t)l * 4 * C * C, w + m->off[P_FCB] + l * 4 * C, BT, C, 4 * C, m->act);
        gelu_forward(fchg, fch, BT * 4 * C, m->act);
        matmul_forward(m->d_a, fchg, w + m->off[P_FCPROJW] + (size_t)l * 4 * C * C, w + m->off[P_FCPROJB] + l * C, BT, 4 * C, C, m->act);
        for (i = 0; i < BT * C; i++) res3[i] = res2[i] + m->d_a[i];
        res = res3;
    }
    if (r == CAPEX_OK) r = norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, res, w + m->off[P_LNFW], w + m->off[P_LNFB], BT);
    memcpy(m->wte_head, w + m->off[P_WTE], (size_t)VOCAB * C * sizeof(float));
    round_array(m->wte_head, (int64_t)VOCAB * C, m->act); /* the head's matmul reads half weights */
    matmul_forward(m->probs, m->lnf, m->wte_head, NULL, BT, C, VOCAB, m->act); /* logits */
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (bt = 0; bt < BT; bt++) { /* softmax in fp32 */
        float *p = m->probs + bt * VOCAB, mx = -INFINITY, sum = 0.0f;
        int v;
        for (v = 0; v < VOCAB; v++) if (p[v] > mx) mx = p[v];
        for (v = 0; v < VOCAB; v++) { p[v] = expf(p[v] - mx); sum += p[v]; }
        for (v = 0; v < VOCAB; v++) p[v] /= sum;
    }
    for (bt = 0; bt < BT; bt++) loss -= log((double)m->probs[bt * VOCAB + tokens[(bt / T) * (T + 1) + bt % T + 1]] + 1e-30);
    if (r != CAPEX_OK) { fprintf(stderr, "norm: %s\n", capex_last_error()); return NAN; }
    return (float)(loss / (double)BT);
}

/* Gradient of (loss * scale) with respect to w, written to g (fp32; every
   element is written). Needs the activations of gpt_forward on the same
   tokens and weights. Returns 0 if a capex call failed. */
static int gpt_backward(gpt *m, const float *w, const unsigned char *tokens, float scale, float *g) {
    const int B = m->batch, T = m->cfg.seq, C = m->cfg.channels, L = m->cfg.layers, NH = m->cfg.heads;
    const int64_t BT = (int64_t)B * T;
    const float k = scale / (float)BT;
    float *dres = m->d_res, *dlogits = m->probs; /* dlogits overwrite probs */
    int64_t bt, i;
    int l, c;
    capex_result r = CAPEX_OK;
    for (bt = 0; bt < BT; bt++) {
        float *p = m->probs + bt * VOCAB;
        const int target = tokens[(bt / T) * (T + 1) + bt % T + 1];
        int v;
        for (v = 0; v < VOCAB; v++) p[v] = round_to((p[v] - (v == target ? 1.0f : 0.0f)) * k, m->act);
    }
    /* tied head: d lnf, and its weight gradient into the wte slot (the embedding's part is added at the end) */
    matmul_backward(m->d_a, g + m->off[P_WTE], NULL, dlogits, m->lnf, m->wte_head, BT, C, VOCAB, m->act);
    r = norm_backward(m, dres, g + m->off[P_LNFW], g + m->off[P_LNFB], m->d_a, L ? m->residual3 + (size_t)(L - 1) * BT * C : m->encoded,
                      m->lnf_mean, m->lnf_rstd, w + m->off[P_LNFW], BT);
    for (l = L - 1; l >= 0 && r == CAPEX_OK; l--) {
        const int64_t a = (int64_t)l * BT * C;
        const float *res = l == 0 ? m->encoded : m->residual3 + a - BT * C;
        const float *att = m->att + (size_t)l * B * NH * T * T;
        /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        matmul_backward(m->d_big, g + m->off[P_FCPROJW] + (size_t)l * 4 * C * C, g + m->off[P_FCPROJB] + l * C, dres,
                        m->fch_gelu + 4 * a, w + m->off[P_FCPROJW] + (size_t)l * 4 * C * C, BT, 4 * C, C, m->act);
        gelu_backward(m->d_big2, m->fch + 4 * a, m->d_big, BT * 4 * C, m->act);
        matmul_backward(m->d_a, g + m->off[P_FCW] + (size_t)l * 4 * C * C, g + m->off[P_FCB] + l * 4 * C, m->d_big2,
                        m->ln2 + a, w + m->off[P_FCW] + (size_t)l * 4 * C * C, BT, C, 4 * C, m->act);
        r = norm_backward(m, m->d_b, g + m->off[P_LN2W] + l * C, g + m->off[P_LN2B] + l * C, m->d_a, m->residual2 + a,
                          m->ln2_mean + l * BT, m->ln2_rstd + l * BT, w + m->off[P_LN2W] + l * C, BT);
        for (i = 0; i < BT * C; i++) dres[i] += m->d_b[i];
        /* attention: res2 = res + attproj(attn(qkv(ln1(res)))) */
        matmul_backward(m->d_a, g + m->off[P_ATTPROJW] + (size_t)l * C * C, g + m->off[P_ATTPROJB] + l * C, dres,
                        m->atty + a, w + m->off[P_ATTPROJW] + (size_t)l * C * C, BT, C, C, m->act);
        attention_backward(m->d_qkv, m->d_att, m->d_a, m->qkv + 3 * a, att, B, T, C, NH, m->act);
        matmul_backward(m->d_a, g + m->off[P_QKVW] + (size_t)l * 3 * C * C, g + m->off[P_QKVB] + l * 3 * C, m->d_qkv,
                        m->ln1 + a, w + m->off[P_QKVW] + (size_t)l * 3 * C * C, BT, C, 3 * C, m->act);
        if (r == CAPEX_OK)
            r = norm_backward(m, m->d_b, g + m->off[P_LN1W] + l * C, g + m->off[P_LN1B] + l * C, m->d_a, res,
                              m->ln1_mean + l * BT, m->ln1_rstd + l * BT, w + m->off[P_LN1W] + l * C, BT);
        for (i = 0; i < BT * C; i++) dres[i] += m->d_b[i];
    }
    if (r != CAPEX_OK) { fprintf(stderr, "norm backward: %s\n", capex_last_error()); return 0; }
    /* embeddings (fp32): token rows accumulate in position order, serially */
    memset(g + m->off[P_WPE], 0, (size_t)T * C * sizeof(float));
    for (bt = 0; bt < BT; bt++) {
        float *gt = g + m->off[P_WTE] + (size_t)tokens[(bt / T) * (T + 1) + bt % T] * C;
        float *gp = g + m->off[P_WPE] + (size_t)(bt % T) * C;
        for (c = 0; c < C; c++) { gt[c] += dres[bt * C + c]; gp[c] += dres[bt * C + c]; }
    }
    return 1;
}

/* The seam for other backends. The GPU path implements the same two calls on
   device pointers (gpu_forward, gpu_backward) with its own loop (train_gpu):
   there the weights, gradients, optimizer and scaler never leave the GPU. */
typedef struct gpt_backend {
    const char *name;
    float (*forward)(gpt *m, const float *w, const unsigned char *tokens);
    int (*backward)(gpt *m, const float *w, const unsigned char *tokens, float scale, float *g);
} gpt_backend;
static const gpt_backend gpt_cpu_backend = {"cpu", gpt_forward, gpt_backward};

/* ---- training ------------------------------------------------------------ */

typedef struct run_cfg {
    capex_opt_level level;
    capex_dtype half;
    capex_optim_kind optim;
    const char *label;
    gpt_config model;
    int steps, batch;
    float lr, wd, clip, min_lr_frac;
    int warmup;
    uint64_t seed;
    int eval_every, eval_windows, log_every;
    const char *save_path; /* checkpoint written at save_at (or the end) */
    int save_at;
    const char *resume_path;
    const char *init_path; /* the initial weights as safetensors (for bench/gpt_torch.py) */
    const char *losses_path; /* per-step training loss, one line each (rank 0) */
    const char *norms_path;  /* per-step global gradient norm (unscaled, before clipping; of the reduced grads) (rank 0) */
    const char *batches_path; /* every step's tokens, B*(T+1) bytes each (rank 0; the torch bench's input) */
    int sample_len;        /* bytes sampled after training (rank 0) */
    const char *prompt;
    int quiet;
    size_t bucket_bytes;
} run_cfg;

#define MAX_POINTS 512
typedef struct run_result {
    float val_loss, train_loss;
    int64_t skipped;
    int start_step; /* 0, or the checkpoint's step on resume */
    double tokens_per_s, seconds;
    uint32_t weights_crc; /* fingerprint of the final fp32 weights */
    uint64_t ddp_launches, ddp_in_backward; /* GPU data parallel: bucket all-reduces, those started during backward */
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

/* The training loss average a checkpoint keeps, so a resumed run reports the
   uninterrupted run's; *ema_from: the step whose loss starts the average (the
   resumed step for a file written before train.ema existed), -1 when loaded. */
static capex_result load_ema(capex_state_reader *rd, int64_t step, double *ema, int *ema_from) {
    capex_result r = capex_state_get_f64(rd, "train.ema", ema);
    if (r == CAPEX_OK) *ema_from = -1;
    else if (r == CAPEX_ERR_NOT_FOUND) { *ema = 0; *ema_from = (int)step; r = CAPEX_OK; }
    return r;
}

/* Whole batches only: the window count rounded up to a multiple of the batch,
   so every window evaluated lies inside the validation text and counts. */
static int eval_window_count(int windows, int batch) {
    int64_t up = ((int64_t)windows + batch - 1) / batch * batch;
    return up <= INT_MAX - batch ? (int)up : (INT_MAX - batch) / batch * batch; /* the loop's count stays an int */
}

/* Validation loss on a fixed, evenly spaced set of windows (same on every rank). */
static float evaluate(const gpt_backend *be, gpt *m, const float *w, const text_data *d, int windows) {
    const int B = m->batch, T = m->cfg.seq;
    size_t first = d->n_train, span = d->n - d->n_train - (size_t)T - 1;
    unsigned char *tok = (unsigned char *)malloc((size_t)B * (T + 1));
    double sum = 0;
    int i, done = 0;
    if (!tok) return NAN;
    windows = eval_window_count(windows, B);
    while (done < windows) {
        for (i = 0; i < B; i++) {
            size_t start = first + (size_t)(((uint64_t)(done + i) * span) / (uint64_t)windows);
            memcpy(tok + (size_t)i * (T + 1), d->bytes + start, (size_t)T + 1);
        }
        sum += (double)be->forward(m, w, tok) * B;
        done += B;
    }
    free(tok);
    return (float)(sum / done);
}

/* Linear warmup, then cosine decay to min_lr_frac * lr, as capex_lr_schedule
   (torch's LinearLR from 1/warmup, then CosineAnnealingLR): attached to the
   optimizer, it follows the steps taken (an overflow-skipped step does not
   consume schedule) and is saved with its state. */
static capex_result lr_schedule_for(const run_cfg *c, capex_lr_schedule *s) {
    capex_lr_schedule_init(s, CAPEX_LR_COSINE);
    s->warmup_steps = c->warmup > 0 ? c->warmup : 0;
    s->warmup_start_factor = c->warmup > 0 ? 1.0 / c->warmup : 1.0;
    s->total_steps = c->steps > s->warmup_steps ? c->steps : s->warmup_steps + 1;
    s->min_factor = c->min_lr_frac;
    return capex_lr_schedule_check(s);
}

/* The opt level's configuration (printed on rank 0) and the matmul dtype. */
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

/* This rank's shard of the training windows (window i: tokens [i, i+T]). */
static capex_result sampler_for(const run_cfg *c, const text_data *d, int rank, int world, capex_sampler *smp) {
    capex_sampler_desc smd;
    capex_sampler_desc_init(&smd);
    smd.dataset_size = d->n_train - (size_t)c->model.seq - 1;
    smd.num_replicas = world;
    smd.rank = rank;
    smd.seed = c->seed;
    smd.drop_last = 1;
    return capex_sampler_init(smp, &smd);
}

/* The next batch of this rank's shard into tok; a new epoch reshuffles. */
static capex_result next_batch(const run_cfg *c, const text_data *d, capex_sampler *smp, uint64_t *epoch, uint64_t *pos,
                               unsigned char *tok) {
    const int T = c->model.seq;
    int b;
    if (*pos + (uint64_t)c->batch > smp->num_samples) { ++*epoch; *pos = 0; capex_sampler_set_epoch(smp, *epoch); }
    for (b = 0; b < c->batch; b++) {
        uint64_t idx = 0;
        capex_result r = capex_sampler_index(smp, *pos + (uint64_t)b, &idx);
        if (r != CAPEX_OK) return r;
        memcpy(tok + (size_t)b * (T + 1), d->bytes + idx, (size_t)T + 1);
    }
    *pos += (uint64_t)c->batch;
    return CAPEX_OK;
}

/* The weights as the compute sees them: the half model copy (O2, O3), fp32
   with the matmul weights rounded to half (O1: autocast), or fp32 (O0). */
static void compute_weights(const gpt *m, const capex_amp_config *amp, capex_dtype act, const float *w32,
                            const uint16_t *wh, float *weff) {
    int p;
    if (amp->model_dtype == CAPEX_F16) capex_f16_to_f32_array(wh, weff, (size_t)m->n_params);
    else if (amp->model_dtype == CAPEX_BF16) capex_bf16_to_f32_array(wh, weff, (size_t)m->n_params);
    else {
        memcpy(weff, w32, (size_t)m->n_params * sizeof(float));
        for (p = 0; p < P_COUNT; p++)
            if (is_matmul_param(p)) round_array(weff + m->off[p], m->off[p + 1] - m->off[p], act);
    }
}

/* Samples n bytes after a prompt (temperature 1, top-k 0) with a B=1 model;
   the context is the last T bytes. Returns 0 on error. */
static int sample_text(const gpt_backend *be, const gpt_config *cfg, const float *w, const char *prompt, int n,
                       uint64_t seed, FILE *out) {
    gpt m1;
    const int T = cfg->seq;
    unsigned char *ctx = (unsigned char *)malloc((size_t)T + 1);
    size_t len = strlen(prompt);
    int i, have;
    if (!ctx || !gpt_init(&m1, cfg, 1, CAPEX_F32)) { free(ctx); return 0; }
    have = len > (size_t)T ? T : (int)len;
    memset(ctx, ' ', (size_t)T + 1);
    memcpy(ctx, prompt + len - (size_t)have, (size_t)have);
    if (have == 0) { ctx[0] = '\n'; have = 1; }
    fputs(prompt, out);
    for (i = 0; i < n; i++) {
        const float *p;
        double u = rng_unit(&seed), cum = 0.0;
        int v = 0;
        if (isnan(be->forward(&m1, w, ctx))) { gpt_free(&m1); free(ctx); return 0; }
        p = m1.probs + (size_t)(have - 1) * VOCAB; /* causal: the padding after `have` is not seen */
        for (v = 0; v < VOCAB - 1; v++) { cum += p[v]; if (u < cum) break; }
        fputc(v, out);
        if (have < T) ctx[have++] = (unsigned char)v;
        else { memmove(ctx, ctx + 1, (size_t)T - 1); ctx[T - 1] = (unsigned char)v; }
    }
    fputc('\n', out);
    gpt_free(&m1);
    free(ctx);
    return 1;
}

/* The initial weights as plain named safetensors tensors (the torch bench's input). */
static capex_result save_init(const gpt *m, const float *w, const char *path) {
    capex_state_writer *wr = NULL;
    capex_result r = capex_state_writer_create(NULL, &wr);
    char v[32];
    int p;
    for (p = 0; p < P_COUNT && r == CAPEX_OK; p++) {
        int64_t n = m->off[p + 1] - m->off[p];
        r = capex_state_add_tensor(wr, param_names[p], CAPEX_STATE_F32, 1, &n, w + m->off[p]);
    }
#define META(k, x) if (r == CAPEX_OK) { snprintf(v, sizeof v, "%d", x); r = capex_state_add_meta(wr, k, v); }
    META("seq", m->cfg.seq) META("layers", m->cfg.layers) META("heads", m->cfg.heads)
    META("channels", m->cfg.channels) META("rms", m->cfg.rms)
#undef META
    if (r == CAPEX_OK) r = capex_state_write_file(wr, path);
    capex_state_writer_destroy(wr);
    return r;
}

static int train(const run_cfg *c, const gpt_backend *be, const text_data *d, capex_comm *comm, int rank, int world,
                 run_result *res) {
    capex_lr_schedule lrs;
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
    capex_tensor_list grads;
    capex_sampler smp;
    gpt m;
    float *w32 = NULL, *weff = NULL, *g32 = NULL;
    uint16_t *wh = NULL;
    unsigned char *tok = NULL;
    FILE *lf = NULL, *bf = NULL, *nf = NULL;
    int step = 0, i, ok = 0, model_ok = 0, ema_from = 0;
    uint64_t epoch = 0, pos = 0;
    double t0, ema = 0, tokens = 0;

    memset(res, 0, sizeof *res);
    CHECK(amp_setup(c, rank, &amp, &act));
    grad_dtype = amp.model_dtype; /* grads have the dtype of the weights they belong to */
    if (d->n_train < (size_t)c->model.seq + 2 + (size_t)c->batch * world || d->n - d->n_train < (size_t)c->model.seq + 2) {
        fprintf(stderr, "text too short for seq %d and batch %d x %d ranks\n", c->model.seq, c->batch, world);
        return 0;
    }
    if (!gpt_init(&m, &c->model, c->batch, act)) return 0;
    model_ok = 1;
    w32 = (float *)malloc((size_t)m.n_params * sizeof(float));
    weff = (float *)malloc((size_t)m.n_params * sizeof(float));
    g32 = (float *)malloc((size_t)m.n_params * sizeof(float));
    wh = (uint16_t *)malloc((size_t)m.n_params * sizeof(uint16_t));
    tok = (unsigned char *)malloc((size_t)c->batch * (c->model.seq + 1));
    if (!w32 || !weff || !g32 || !wh || !tok) goto oom;
    gpt_init_weights(&m, w32, c->seed);
    /* Every rank starts from rank 0's weights (DDP's initial broadcast). */
    CHECK(capex_comm_broadcast(comm, w32, (size_t)m.n_params, CAPEX_F32, 0));
    if (c->init_path && rank == 0 && !c->resume_path) CHECK(save_init(&m, w32, c->init_path));
    if (amp.model_dtype == CAPEX_F16) capex_f32_to_f16_array(w32, wh, (size_t)m.n_params);
    if (amp.model_dtype == CAPEX_BF16) capex_f32_to_bf16_array(w32, wh, (size_t)m.n_params);
    if (amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) /* O3: the fp32 copy holds half values only */
        round_array(w32, m.n_params, amp.model_dtype);

    /* DDP: gradients live in its bucket buffers, reduced in backward order. */
    for (i = 0; i < P_COUNT; i++) {
        dp[i].data = amp.model_dtype == CAPEX_F32 ? (void *)(w32 + m.off[i]) : (void *)(wh + m.off[i]);
        dp[i].numel = (size_t)(m.off[i + 1] - m.off[i]);
        dp[i].dtype = grad_dtype;
        dp[i].grad = NULL;
    }
    capex_ddp_desc_init(&dd);
    dd.broadcast_parameters = 0; /* done above, on the fp32 master weights */
    if (c->bucket_bytes) dd.bucket_bytes = dd.first_bucket_bytes = c->bucket_bytes;
    CHECK(capex_ddp_create(&ddp, comm, dp, P_COUNT, &dd));

    capex_optim_desc_init(&od, c->optim);
    od.defaults.lr = c->lr;
    od.defaults.weight_decay = c->wd;
    if (c->optim == CAPEX_OPTIM_LAMB) od.max_grad_norm = c->clip; /* LAMB clips by the global norm itself */
    CHECK(capex_optim_create(&od, &opt));
    for (i = 0; i < P_COUNT; i++) {
        /* the opt level's wiring: fp32 weights, fp32 masters writing the half copy (O2),
           or the half weights alone (O3: pure_half keeps w32 equal to them) */
        capex_optim_param_init(&op[i]);
        CHECK(capex_optim_param_from_amp(&amp, w32 + m.off[i], wh + m.off[i], capex_ddp_grad(ddp, (size_t)i),
                                         m.off[i + 1] - m.off[i], &op[i]));
        gt[i].data = capex_ddp_grad(ddp, (size_t)i);
        gt[i].numel = op[i].numel;
        g32t[i].data = g32 + m.off[i];
        g32t[i].numel = op[i].numel;
    }
    grads = capex_tensor_list_make(grad_dtype, gt, P_COUNT);
    CHECK(capex_optim_add_group(opt, NULL, op, P_COUNT, NULL));
    CHECK(lr_schedule_for(c, &lrs));
    CHECK(capex_optim_set_lr_schedule(opt, &lrs)); /* a checkpoint's schedule replaces it on resume */

    CHECK(capex_scaler_desc_from_amp(&amp, &sd)); /* O1/O2 fp16: dynamic from 2^16; else static */
    sd.log_interval = c->quiet ? 0 : 200;
    CHECK(capex_scaler_init(&sc, &sd));
    CHECK(sampler_for(c, d, rank, world, &smp));

    if (c->resume_path) {
        capex_state_reader *rd = NULL;
        int64_t v[3] = {0, 0, 0};
        capex_result r = capex_state_reader_open_file(c->resume_path, 0, NULL, &rd);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.step", &v[0]);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.epoch", &v[1]);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.pos", &v[2]);
        if (r == CAPEX_OK) r = load_ema(rd, v[0], &ema, &ema_from);
        if (r == CAPEX_OK) r = capex_optim_load(opt, rd, "optim", CAPEX_OPTIM_STATE_PARAMS);
        if (r == CAPEX_OK) r = capex_scaler_load(&sc, rd, "scaler.0.");
        capex_state_reader_close(rd);
        if (r != CAPEX_OK) { fprintf(stderr, "resume from %s failed: %s\n", c->resume_path, capex_last_error()); goto fail; }
        if (v[0] < 0 || v[0] > c->steps) { /* else nothing would train, and the report would say 0 */
            fprintf(stderr, "resume from %s: step %lld is past --steps %d\n", c->resume_path, (long long)v[0], c->steps);
            goto fail;
        }
        step = (int)v[0]; epoch = (uint64_t)v[1]; pos = (uint64_t)v[2];
        if (rank == 0 && !c->quiet) printf("resumed from %s at step %d\n", c->resume_path, step);
    }
    capex_sampler_set_epoch(&smp, epoch);
    res->start_step = step;
    if (c->losses_path && rank == 0 && !(lf = fopen(c->losses_path, "w"))) {
        fprintf(stderr, "cannot write %s\n", c->losses_path);
        goto fail;
    }
    if (c->norms_path && rank == 0 && !(nf = fopen(c->norms_path, "w"))) {
        fprintf(stderr, "cannot write %s\n", c->norms_path);
        goto fail;
    }
    if (c->batches_path && rank == 0 && !(bf = fopen(c->batches_path, "wb"))) {
        fprintf(stderr, "cannot write %s\n", c->batches_path);
        goto fail;
    }

    t0 = capex_dist_now();
    for (; step < c->steps; step++) {
        float scale = 1.0f, inv_scale = 1.0f, norm = 0.0f, loss, clip_coef = 1.0f;
        int found_inf, do_step = 0;
        CHECK(next_batch(c, d, &smp, &epoch, &pos, tok));
        if (bf && fwrite(tok, 1, (size_t)c->batch * (c->model.seq + 1), bf) != (size_t)c->batch * (c->model.seq + 1)) {
            fprintf(stderr, "cannot write %s\n", c->batches_path);
            goto fail;
        }
        compute_weights(&m, &amp, act, w32, wh, weff);

        CHECK(capex_scaler_scale(&sc, &scale));
        loss = be->forward(&m, weff, tok);
        if (!be->backward(&m, weff, tok, scale, g32)) goto fail;
        /* each gradient to DDP in backward order; a full bucket reduces at once */
        for (i = P_COUNT - 1; i >= 0; i--) {
            capex_tensor_list one_in = capex_tensor_list_make(CAPEX_F32, &g32t[i], 1);
            capex_tensor_list one_out = capex_tensor_list_make(grad_dtype, &gt[i], 1);
            int inf_unused = 0;
            CHECK(capex_multi_tensor_scale(NULL, &one_in, &one_out, 1.0f, &inf_unused));
            CHECK(capex_ddp_grad_ready(ddp, (size_t)i));
        }
        CHECK(capex_ddp_finalize(ddp));
        /* one pass over the (still scaled) grads: the global norm, where inf/NaN shows */
        CHECK(capex_multi_tensor_l2norm(NULL, &grads, &norm, NULL));
        found_inf = !isfinite(norm);
        CHECK(capex_scaler_unscale(&sc, 0, found_inf, &inv_scale));
        if (!found_inf && c->clip > 0 && c->optim != CAPEX_OPTIM_LAMB) clip_coef = capex_clip_coef(norm * inv_scale, c->clip);
        CHECK(capex_scaler_step(&sc, 0, &do_step));
        CHECK(capex_optim_step(opt, inv_scale, clip_coef, !do_step));
        CHECK(capex_scaler_update(&sc));
        if (lf) fprintf(lf, "%d %.9g\n", step, loss);
        if (nf) fprintf(nf, "%d %.9g\n", step, norm * inv_scale); /* the norm the clip factor saw */
        tokens += (double)c->batch * c->model.seq * world;
        ema = step == ema_from ? loss : 0.95 * ema + 0.05 * loss;
        if (c->log_every && rank == 0 && !c->quiet && (step % c->log_every == 0 || step == c->steps - 1)) {
            double el = capex_dist_now() - t0;
            float cur_scale = capex_scaler_get_scale(&sc);
            capex_scaler_state st;
            memset(&st, 0, sizeof st);
            float next_lr = 0.0f;
            capex_scaler_get_state(&sc, &st);
            capex_optim_get_lr(opt, 0, &next_lr);
            printf("[%s] step %5d  loss %.4f  scale %-9g skipped %lld  lr %.2e  %.0f tok/s\n", c->label, step, loss,
                   cur_scale, (long long)st.skipped_steps, next_lr, el > 0 ? tokens / el : 0.0);
        }
        if (c->eval_every && ((step + 1) % c->eval_every == 0 || step == c->steps - 1) && res->n_points < MAX_POINTS) {
            float vl;
            compute_weights(&m, &amp, act, w32, wh, weff); /* after this step's update */
            vl = evaluate(be, &m, weff, d, c->eval_windows);
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
            if (r == CAPEX_OK) r = capex_state_add_f64(w, "train.ema", ema);
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
        memset(&st, 0, sizeof st);
        capex_scaler_get_state(&sc, &st);
        res->skipped = st.skipped_steps;
    }
    res->train_loss = (float)ema;
    compute_weights(&m, &amp, act, w32, wh, weff);
    res->val_loss = evaluate(be, &m, weff, d, c->eval_windows);
    res->weights_crc = capex_crc32(0, w32, (size_t)m.n_params * sizeof(float));
    if (c->sample_len > 0 && rank == 0) { /* the inference half: fp32 weights, as an engine would load them */
        memcpy(weff, w32, (size_t)m.n_params * sizeof(float));
        printf("---- sample (%d bytes) ----\n", c->sample_len);
        if (!sample_text(be, &c->model, weff, c->prompt ? c->prompt : "", c->sample_len, c->seed + 1, stdout)) goto fail;
        printf("----\n");
    }
    ok = 1;
    goto done;
oom:
    fprintf(stderr, "out of memory\n");
fail:
done:
    if (lf) fclose(lf);
    if (nf) fclose(nf);
    if (bf) fclose(bf);
    capex_optim_destroy(opt);
    capex_ddp_destroy(ddp);
    if (model_ok) gpt_free(&m);
    free(w32); free(weff); free(g32); free(wh); free(tok);
    return ok;
}

/* ---- GPU path: the same model as CUDA kernels, compiled at run time -------
   The kernels below are plain CUDA C++ text that capex's public JIT
   (capex_cuda_module_compile) compiles for this GPU on first use, then loads
   from the disk cache: no nvcc, no cuBLAS. The norms are capex's fused
   LayerNorm/RMSNorm kernels (capex_cuda_layer_norm_*), the residual adds
   capex_cuda_add_f32, the half copies capex_cuda_convert; the optimizer,
   loss scaler, gradient norm and clipping stay on the device
   (capex_cuda_optim, capex_cuda_scaler, capex_cuda_multi_tensor_l2norm).
   The kernels mirror the CPU loops above: every output has one thread and
   sums in the CPU's order (the tiled matmul too: each thread adds its
   products in k order), with the same half rounding points (`act`), and
   NVRTC runs with --fmad=false. So in fp32 a GPU step differs from the CPU
   step only where the GPU's own expf/tanhf/log and capex's GPU norms (their
   row reductions run in another order) differ from the CPU's, by a few ulps.
   Simple on purpose: correct and deterministic, not cuBLAS-fast. */
static const char *const gpt_kernels_parts[] = { /* each under C99's 4095-character literal limit */
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
    "/* act: 0 fp32 (nothing rounded), 1 fp16, 2 bf16 (the CPU's round_to) */\n"
    "__device__ float rnd(float v, int t) { return t == 1 ? h2f(f2h(v)) : t == 2 ? b2f(f2b(v)) : v; }\n"
    "#define GPT_R(v) rnd((v), act)\n"
    "#define GPT_FOR_EACH(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)\n"
    "#define GPT_TILE 16\n"
    "extern \"C\" __global__ void gpt_round(float *x, long long n, int act) { GPT_FOR_EACH(i, n) x[i] = GPT_R(x[i]); }\n"
    "/* x[bt][c] = wte[token][c] + wpe[t][c] */\n"
    "extern \"C\" __global__ void gpt_encode(const unsigned char *tok, const float *wte, const float *wpe, float *x, int B, int T, int C) {\n"
    "    GPT_FOR_EACH(i, (long long)B * T * C) {\n"
    "        long long bt = i / C, c = i % C, b = bt / T, t = bt % T;\n"
    "        x[i] = wte[(long long)tok[b * (T + 1) + t] * C + c] + wpe[t * C + c];\n"
    "    }\n"
    "}\n"
    "/* out[m][n] = GPT_R(sum_k A(m,k) B(k,n) (+ bias[n], or + 0 when bias is NULL, if add)),\n"
    "   A(m,k) = A[m*am + k*ak], B(k,n) = Bw[k*bk + n*bn]: the strides give the three\n"
    "   matmuls of a linear layer (forward, dinp, dweight). 16x16 tiles in shared\n"
    "   memory; each thread adds its products in k order (the CPU's). */\n"
    "extern \"C\" __global__ void gpt_matmul(float *out, const float *A, long long am, long long ak, const float *Bw,\n"
    "                                       long long bk, long long bn, const float *bias, int M, int N, int K, int add, int act) {\n"
    "    __shared__ float As[GPT_TILE][GPT_TILE], Bs[GPT_TILE][GPT_TILE + 1];\n"
    "    const int tx = threadIdx.x, ty = threadIdx.y;\n"
    "    const long long m = (long long)blockIdx.y * GPT_TILE + ty, n = (long long)blockIdx.x * GPT_TILE + tx;\n"
    "    float acc = 0.0f;\n"
    "    for (int k0 = 0; k0 < K; k0 += GPT_TILE) {\n"
    "        const long long ka = k0 + tx, kb = k0 + ty;\n"
    "        const int kn = K - k0 < GPT_TILE ? K - k0 : GPT_TILE;\n"
    "        As[ty][tx] = m < M && ka < K ? A[m * am + ka * ak] : 0.0f;\n"
    "        Bs[ty][tx] = kb < K && n < N ? Bw[kb * bk + n * bn] : 0.0f;\n"
    "        __syncthreads();\n"
    "        for (int kk = 0; kk < kn; kk++) acc += As[ty][kk] * Bs[kk][tx];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (m < M && n < N) out[m * N + n] = GPT_R(add ? acc + (bias ? bias[n] : 0.0f) : acc);\n"
    "}\n"
    "/* db[o] = GPT_R(sum_bt dout[bt][o]), in bt order */\n"
    "extern \"C\" __global__ void gpt_bias_grad(const float *dout, float *db, long long BT, int OC, int act) {\n"
    "    GPT_FOR_EACH(o, OC) {\n"
    "        float s = 0.0f;\n"
    "        for (long long b = 0; b < BT; b++) s += dout[b * OC + o];\n"
    "        db[o] = GPT_R(s);\n"
    "    }\n"
    "}\n",
    "/* Causal self-attention, one thread per (b, t, head): att = softmax(q.k / sqrt(hs)) over\n"
    "   keys 0..t (fp32), out = att v; qkv is [BT, 3C] (q | k | v), att [B, NH, T, T]. */\n"
    "extern \"C\" __global__ void gpt_attn_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int act) {\n"
    "    const int hs = C / NH, C3 = 3 * C;\n"
    "    const float sc = 1.0f / sqrtf((float)hs);\n"
    "    GPT_FOR_EACH(j, (long long)B * T * NH) {\n"
    "        const long long h = j % NH, t = (j / NH) % T, b = j / ((long long)NH * T);\n"
    "        const float *q = qkv + (b * T + t) * C3 + h * hs;\n"
    "        float *a = att + ((b * NH + h) * T + t) * T, mx = -__uint_as_float(0x7f800000u), sum = 0.0f;\n"
    "        float *o = out + (b * T + t) * C + h * hs;\n"
    "        for (long long t2 = 0; t2 <= t; t2++) {\n"
    "            const float *k = qkv + (b * T + t2) * C3 + C + h * hs;\n"
    "            float v = 0.0f;\n"
    "            for (int i = 0; i < hs; i++) v += q[i] * k[i];\n"
    "            v = GPT_R(GPT_R(v) * sc);\n"
    "            a[t2] = v;\n"
    "            if (v > mx) mx = v;\n"
    "        }\n"
    "        for (long long t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - mx); sum += a[t2]; }\n"
    "        for (long long t2 = 0; t2 <= t; t2++) a[t2] = GPT_R(a[t2] / sum);\n"
    "        for (long long t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;\n"
    "        for (int i = 0; i < hs; i++) o[i] = 0.0f;\n"
    "        for (long long t2 = 0; t2 <= t; t2++) {\n"
    "            const float *v = qkv + (b * T + t2) * C3 + 2 * C + h * hs, w = a[t2];\n"
    "            for (int i = 0; i < hs; i++) o[i] += w * v[i];\n"
    "        }\n"
    "        for (int i = 0; i < hs; i++) o[i] = GPT_R(o[i]);\n"
    "    }\n"
    "}\n"
    "/* Backward, pass 1 (per query row t): datt (scratch [B, NH, T, T]) and dq. */\n"
    "extern \"C\" __global__ void gpt_attn_bwd_q(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,\n"
    "                                           int B, int T, int C, int NH, int act) {\n"
    "    const int hs = C / NH, C3 = 3 * C;\n"
    "    const float sc = 1.0f / sqrtf((float)hs);\n"
    "    GPT_FOR_EACH(j, (long long)B * T * NH) {\n"
    "        const long long h = j % NH, t = (j / NH) % T, b = j / ((long long)NH * T);\n"
    "        const float *a = att + ((b * NH + h) * T + t) * T, *d = dout + (b * T + t) * C + h * hs;\n"
    "        float *da = datt + ((b * NH + h) * T + t) * T, dot = 0.0f;\n"
    "        float *dq = dqkv + (b * T + t) * C3 + h * hs;\n"
    "        for (long long t2 = 0; t2 <= t; t2++) {\n"
    "            const float *v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;\n"
    "            float s = 0.0f;\n"
    "            for (int i = 0; i < hs; i++) s += d[i] * v[i];\n"
    "            da[t2] = GPT_R(s);\n"
    "        }\n"
    "        for (long long t2 = 0; t2 <= t; t2++) dot += a[t2] * da[t2];\n"
    "        for (long long t2 = 0; t2 <= t; t2++) da[t2] = GPT_R(a[t2] * (da[t2] - dot) * sc);\n"
    "        for (int i = 0; i < hs; i++) dq[i] = 0.0f;\n"
    "        for (long long t2 = 0; t2 <= t; t2++) {\n"
    "            const float *k = qkv + (b * T + t2) * C3 + C + h * hs;\n"
    "            for (int i = 0; i < hs; i++) dq[i] += da[t2] * k[i];\n"
    "        }\n"
    "        for (int i = 0; i < hs; i++) dq[i] = GPT_R(dq[i]);\n"
    "    }\n"
    "}\n",
    "/* Backward, pass 2 (per key row t): dk and dv, summed over the queries that see it, in order. */\n"
    "extern \"C\" __global__ void gpt_attn_bwd_kv(float *dqkv, const float *datt, const float *dout, const float *qkv, const float *att,\n"
    "                                            int B, int T, int C, int NH, int act) {\n"
    "    const int hs = C / NH, C3 = 3 * C;\n"
    "    GPT_FOR_EACH(j, (long long)B * T * NH) {\n"
    "        const long long h = j % NH, t = (j / NH) % T, b = j / ((long long)NH * T);\n"
    "        float *dk = dqkv + (b * T + t) * C3 + C + h * hs, *dv = dk + C;\n"
    "        for (int i = 0; i < hs; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }\n"
    "        for (long long tq = t; tq < T; tq++) {\n"
    "            const float *q = qkv + (b * T + tq) * C3 + h * hs, *d = dout + (b * T + tq) * C + h * hs;\n"
    "            const float da = datt[((b * NH + h) * T + tq) * T + t], a = att[((b * NH + h) * T + tq) * T + t];\n"
    "            for (int i = 0; i < hs; i++) { dk[i] += da * q[i]; dv[i] += a * d[i]; }\n"
    "        }\n"
    "        for (int i = 0; i < hs; i++) { dk[i] = GPT_R(dk[i]); dv[i] = GPT_R(dv[i]); }\n"
    "    }\n"
    "}\n"
    "/* GELU, tanh approximation (GPT-2), and its derivative */\n"
    "#define GPT_GELU_S 0.7978845608028654f\n"
    "extern \"C\" __global__ void gpt_gelu_fwd(float *out, const float *x, long long n, int act) {\n"
    "    GPT_FOR_EACH(i, n) {\n"
    "        const float v = x[i];\n"
    "        out[i] = GPT_R(0.5f * v * (1.0f + tanhf(GPT_GELU_S * (v + 0.044715f * v * v * v))));\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void gpt_gelu_bwd(float *dx, const float *x, const float *dout, long long n, int act) {\n"
    "    GPT_FOR_EACH(i, n) {\n"
    "        const float v = x[i], u = GPT_GELU_S * (v + 0.044715f * v * v * v), th = tanhf(u);\n"
    "        const float du = GPT_GELU_S * (1.0f + 3.0f * 0.044715f * v * v);\n"
    "        dx[i] = GPT_R(dout[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du));\n"
    "    }\n"
    "}\n"
    "/* One thread per row: logits -> probabilities (fp32, in place), row loss -log p[target] */\n"
    "extern \"C\" __global__ void gpt_softmax_loss(float *probs, const unsigned char *tok, double *row_loss, long long BT, int T, int V) {\n"
    "    GPT_FOR_EACH(bt, BT) {\n"
    "        float *p = probs + bt * V, mx = -__uint_as_float(0x7f800000u), sum = 0.0f;\n"
    "        for (int v = 0; v < V; v++) if (p[v] > mx) mx = p[v];\n"
    "        for (int v = 0; v < V; v++) { p[v] = expf(p[v] - mx); sum += p[v]; }\n"
    "        for (int v = 0; v < V; v++) p[v] /= sum;\n"
    "        row_loss[bt] = -log((double)p[tok[(bt / T) * (T + 1) + bt % T + 1]] + 1e-30);\n"
    "    }\n"
    "}\n"
    "/* mean loss over the rows (in row order) -> out[0]; acc != 0: also acc[0] += loss * B (evaluation) */\n"
    "extern \"C\" __global__ void gpt_loss(const double *row_loss, long long BT, int B, float *out, double *acc) {\n"
    "    if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
    "    double s = 0.0;\n"
    "    for (long long i = 0; i < BT; i++) s += row_loss[i];\n"
    "    float l = (float)(s / (double)BT);\n"
    "    if (out) out[0] = l;\n"
    "    if (acc) acc[0] += (double)l * B;\n"
    "}\n",
    "/* dlogits = GPT_R((p - onehot) * (loss scale / BT)), in place; the scale is read on the device */\n"
    "extern \"C\" __global__ void gpt_dlogits(float *probs, const unsigned char *tok, const float *scale, long long BT, int T, int V, int act) {\n"
    "    const float k = *scale / (float)BT;\n"
    "    GPT_FOR_EACH(i, BT * V) {\n"
    "        const long long bt = i / V, v = i % V;\n"
    "        probs[i] = GPT_R((probs[i] - (v == tok[(bt / T) * (T + 1) + bt % T + 1] ? 1.0f : 0.0f)) * k);\n"
    "    }\n"
    "}\n"
    "/* Embeddings (fp32): gwte[v] (holding the tied head's gradient) += dx of every position\n"
    "   holding token v, gwpe[t] = sum over the batch of dx at position t; in position order. */\n"
    "extern \"C\" __global__ void gpt_embed_bwd(const unsigned char *tok, const float *dx, float *gwte, float *gwpe, int B, int T, int C, int V) {\n"
    "    GPT_FOR_EACH(i, (long long)(V + T) * C) {\n"
    "        const long long r = i / C, c = i % C;\n"
    "        if (r < V) {\n"
    "            float acc = gwte[i];\n"
    "            for (long long bt = 0; bt < (long long)B * T; bt++)\n"
    "                if (tok[(bt / T) * (T + 1) + bt % T] == r) acc += dx[bt * C + c];\n"
    "            gwte[i] = acc;\n"
    "        } else {\n"
    "            float acc = 0.0f;\n"
    "            for (long long b = 0; b < B; b++) acc += dx[(b * T + (r - V)) * C + c];\n"
    "            gwpe[(r - V) * C + c] = acc;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* inf/NaN in the (scaled) grads shows in their norm: flag it for the scaler;\n"
    "   clip factor from the unscaled norm (capex_clip_coef) */\n"
    "extern \"C\" __global__ void gpt_clip(const float *norm, const float *inv_scale, unsigned *found_inf, float *coef, float max_norm) {\n"
    "    float n = *norm, c = 1.0f;\n"
    "    if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
    "    if (!(n - n == 0.0f)) *found_inf = 1u;\n"
    "    else if (max_norm > 0.0f) {\n"
    "        float t = n * *inv_scale;\n"
    "        if (t - t == 0.0f) { c = max_norm / (t + 1e-6f); if (!(c < 1.0f)) c = 1.0f; }\n"
    "    }\n"
    "    *coef = c;\n"
    "}\n"};

enum {
    K_ROUND, K_ENCODE, K_MATMUL, K_BIAS_GRAD, K_ATTN_FWD, K_ATTN_BWD_Q, K_ATTN_BWD_KV, K_GELU_FWD, K_GELU_BWD,
    K_SOFTMAX_LOSS, K_LOSS, K_DLOGITS, K_EMBED_BWD, K_CLIP, N_KERNELS
};
static const char *const gpt_kernel_names[N_KERNELS] = {
    "gpt_round",    "gpt_encode",   "gpt_matmul",       "gpt_bias_grad", "gpt_attn_fwd",  "gpt_attn_bwd_q",  "gpt_attn_bwd_kv",
    "gpt_gelu_fwd", "gpt_gelu_bwd", "gpt_softmax_loss", "gpt_loss",      "gpt_dlogits",   "gpt_embed_bwd",   "gpt_clip"};

/* The model on the GPU: the CPU struct's activations as device buffers. */
enum {
    G_TOK, G_ENC, G_LN1, G_LN1M, G_LN1R, G_QKV, G_ATT, G_ATTY, G_RES2, G_LN2, G_LN2M, G_LN2R, G_FCH, G_FCHG, G_RES3,
    G_LNF, G_LNFM, G_LNFR, G_PROBS, G_WTEH, G_ROWLOSS, G_DRES, G_DA, G_DB, G_DBIG, G_DBIG2, G_DQKV, G_DATT, G_NORMWS,
    G_COUNT
};
typedef struct gpu_model {
    capex_cuda_context *ctx;
    capex_cuda_stream stream;
    capex_cuda_function fn[N_KERNELS];
    gpt m;   /* layout only (gpt_layout): no host buffers */
    int act; /* the kernels' rounding code: 0 fp32, 1 fp16, 2 bf16 */
    capex_cuda_ptr buf[G_COUNT];
} gpu_model;

static int act_code(capex_dtype t) { return t == CAPEX_F16 ? 1 : t == CAPEX_BF16 ? 2 : 0; }

static capex_result gpu_launch(gpu_model *g, int k, int64_t threads, void **args) {
    unsigned grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    int64_t blocks = (threads + 255) / 256;
    grid[0] = (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
    return capex_cuda_launch(&g->fn[k], grid, block, 0, g->stream, args);
}

/* The whole kernel text, as capex_cuda_module_compile gets it (malloc'd; NULL: out of memory). */
static char *gpt_kernels_source(void) {
    const size_t n_parts = sizeof gpt_kernels_parts / sizeof gpt_kernels_parts[0];
    size_t i, len = 1;
    char *src;
    for (i = 0; i < n_parts; i++) len += strlen(gpt_kernels_parts[i]);
    if (!(src = (char *)malloc(len))) return NULL;
    src[0] = '\0';
    for (i = 0; i < n_parts; i++) strcat(src, gpt_kernels_parts[i]);
    return src;
}
static const char *const gpt_kernels_options[1] = {"--fmad=false"}; /* multiply and add rounded apart, as in the CPU code */

/* Compiles the kernels through capex's JIT (disk-cached) and allocates the activations. */
static capex_result gpu_model_init(gpu_model *g, capex_cuda_context *ctx, capex_cuda_stream stream, const gpt_config *cfg,
                                   int batch, capex_dtype act) {
    int64_t T, L, C, NH, BT;
    size_t sizes[G_COUNT];
    capex_cuda_module *mod = NULL;
    capex_result r;
    char *src;
    int i;
    memset(g, 0, sizeof *g);
    if (!gpt_layout(&g->m, cfg, batch, act)) return capex__fail(CAPEX_ERR_INVALID_ARG, "GPT: bad model configuration");
    g->ctx = ctx; g->stream = stream; g->act = act_code(act);
    T = cfg->seq; L = cfg->layers; C = cfg->channels; NH = cfg->heads; BT = (int64_t)batch * T;
    if (!(src = gpt_kernels_source())) return CAPEX_ERR_OUT_OF_MEMORY;
    r = capex_cuda_module_compile(ctx, src, "gpt_kernels", gpt_kernels_options, 1, &mod); /* compiled once, then cached */
    free(src);
    for (i = 0; r == CAPEX_OK && i < N_KERNELS; i++) r = capex_cuda_module_get_function(mod, gpt_kernel_names[i], &g->fn[i]);
    sizes[G_TOK] = (size_t)batch * (size_t)(T + 1);
    sizes[G_ENC] = sizes[G_LNF] = sizes[G_DRES] = sizes[G_DA] = sizes[G_DB] = (size_t)(BT * C) * 4;
    sizes[G_LN1] = sizes[G_ATTY] = sizes[G_RES2] = sizes[G_LN2] = sizes[G_RES3] = (size_t)(L * BT * C) * 4;
    sizes[G_LN1M] = sizes[G_LN1R] = sizes[G_LN2M] = sizes[G_LN2R] = (size_t)(L * BT) * 4;
    sizes[G_QKV] = (size_t)(L * BT * 3 * C) * 4;
    sizes[G_ATT] = (size_t)(L * batch * NH * T * T) * 4;
    sizes[G_FCH] = sizes[G_FCHG] = (size_t)(L * BT * 4 * C) * 4;
    sizes[G_LNFM] = sizes[G_LNFR] = (size_t)BT * 4;
    sizes[G_PROBS] = (size_t)(BT * VOCAB) * 4;
    sizes[G_WTEH] = (size_t)(VOCAB * C) * 4;
    sizes[G_ROWLOSS] = (size_t)BT * 8;
    sizes[G_DBIG] = sizes[G_DBIG2] = (size_t)(BT * 4 * C) * 4;
    sizes[G_DQKV] = (size_t)(BT * 3 * C) * 4;
    sizes[G_DATT] = (size_t)(batch * NH * T * T) * 4;
    sizes[G_NORMWS] = capex_cuda_norm_workspace_bytes(BT, C);
    for (i = 0; r == CAPEX_OK && i < G_COUNT; i++) r = capex_cuda_malloc(ctx, sizes[i] ? sizes[i] : 4, &g->buf[i]);
    return r;
}

static void gpu_model_free(gpu_model *g) {
    int i;
    if (g->ctx)
        for (i = 0; i < G_COUNT; i++) capex_cuda_free(g->ctx, g->buf[i]);
}

/* out = R(inp W^T + bias): the CPU's matmul_forward (bias 0: none). */
static capex_result gpu_matmul(gpu_model *g, capex_cuda_ptr out, capex_cuda_ptr A, long long am, long long ak, capex_cuda_ptr Bw,
                               long long bk, long long bn, capex_cuda_ptr bias, int M, int N, int K, int add) {
    unsigned grid[3] = {1, 1, 1}, block[3] = {16, 16, 1};
    void *a[] = {&out, &A, &am, &ak, &Bw, &bk, &bn, &bias, &M, &N, &K, &add, &g->act};
    grid[0] = (unsigned)((N + 15) / 16);
    grid[1] = (unsigned)((M + 15) / 16);
    if (grid[1] > 65535) return capex__fail(CAPEX_ERR_INVALID_ARG, "GPT GPU matmul: %d rows (batch * seq) is over 16 * 65535", M);
    return capex_cuda_launch(&g->fn[K_MATMUL], grid, block, 0, g->stream, a);
}
static capex_result gpu_linear_forward(gpu_model *g, capex_cuda_ptr out, capex_cuda_ptr inp, capex_cuda_ptr w, capex_cuda_ptr bias,
                                       int64_t BT, int IC, int OC) {
    return gpu_matmul(g, out, inp, IC, 1, w, 1, IC, bias, (int)BT, OC, IC, 1);
}
/* dinp = R(dout W), dweight = R(dout^T inp), dbias = R(column sums of dout) (dbias 0: none) */
static capex_result gpu_linear_backward(gpu_model *g, capex_cuda_ptr dinp, capex_cuda_ptr dweight, capex_cuda_ptr dbias,
                                        capex_cuda_ptr dout, capex_cuda_ptr inp, capex_cuda_ptr w, int64_t BT, int IC, int OC) {
    capex_result r = gpu_matmul(g, dinp, dout, OC, 1, w, IC, 1, 0, (int)BT, IC, OC, 0);
    if (r == CAPEX_OK) r = gpu_matmul(g, dweight, dout, 1, OC, inp, IC, 1, 0, OC, IC, (int)BT, 0);
    if (r == CAPEX_OK && dbias) {
        long long bt = BT;
        void *a[] = {&dout, &dbias, &bt, &OC, &g->act};
        r = gpu_launch(g, K_BIAS_GRAD, OC, a);
    }
    return r;
}
static capex_result gpu_round(gpu_model *g, capex_cuda_ptr x, int64_t n) {
    long long nn = n;
    void *a[] = {&x, &nn, &g->act};
    return g->act ? gpu_launch(g, K_ROUND, n, a) : CAPEX_OK;
}

/* capex's fused norm on the device, output rounded to act (it feeds a matmul). */
static capex_result gpu_norm_forward(gpu_model *g, capex_cuda_ptr y, capex_cuda_ptr mean, capex_cuda_ptr rstd, capex_cuda_ptr x,
                                     capex_cuda_ptr w, capex_cuda_ptr b, int64_t rows) {
    capex_cuda_norm_args a;
    capex_result r;
    capex_cuda_norm_args_init(&a);
    a.rows = rows; a.cols = g->m.cfg.channels;
    a.x_dtype = a.y_dtype = a.param_dtype = CAPEX_F32;
    a.x = x; a.weight = w; a.bias = g->m.cfg.rms ? 0 : b; a.y = y; a.mean = mean; a.rstd = rstd;
    r = g->m.cfg.rms ? capex_cuda_rms_norm_forward(g->ctx, NULL, &a, g->stream) : capex_cuda_layer_norm_forward(g->ctx, NULL, &a, g->stream);
    return r == CAPEX_OK ? gpu_round(g, y, rows * g->m.cfg.channels) : r;
}
static capex_result gpu_norm_backward(gpu_model *g, capex_cuda_ptr dx, capex_cuda_ptr dw, capex_cuda_ptr db, capex_cuda_ptr dy,
                                      capex_cuda_ptr x, capex_cuda_ptr mean, capex_cuda_ptr rstd, capex_cuda_ptr w, int64_t rows) {
    capex_cuda_norm_args a;
    capex_cuda_norm_args_init(&a);
    a.rows = rows; a.cols = g->m.cfg.channels;
    a.x_dtype = a.y_dtype = a.param_dtype = CAPEX_F32;
    a.x = x; a.weight = w; a.mean = mean; a.rstd = rstd; a.dy = dy; a.dx = dx; a.dweight = dw;
    a.workspace = g->buf[G_NORMWS];
    if (g->m.cfg.rms) {
        capex_result r = capex_cuda_memset_u8(g->ctx, db, 0, (size_t)g->m.cfg.channels * 4, g->stream);
        return r == CAPEX_OK ? capex_cuda_rms_norm_backward(g->ctx, NULL, &a, g->stream) : r;
    }
    a.dbias = db;
    return capex_cuda_layer_norm_backward(g->ctx, NULL, &a, g->stream);
}

/* gpt_forward on the device: tokens in buf[G_TOK], fp32 weights w (device).
   The mean loss goes to *loss_out (device float; 0: none) and loss * batch
   is added to *loss_acc (device double; 0: none). Nothing is read back. */
static capex_result gpu_forward(gpu_model *g, capex_cuda_ptr w, capex_cuda_ptr loss_out, capex_cuda_ptr loss_acc) {
    const gpt *m = &g->m;
    int B = m->batch, T = m->cfg.seq, C = m->cfg.channels, L = m->cfg.layers, NH = m->cfg.heads, V = VOCAB;
    const int64_t BT = (int64_t)B * T;
    capex_cuda_ptr *bf = g->buf, res = bf[G_ENC];
#define WP(p) (w + (capex_cuda_ptr)m->off[p] * 4)
    long long bt = BT;
    capex_result r;
    int l;
    {
        capex_cuda_ptr wte = WP(P_WTE), wpe = WP(P_WPE);
        void *a[] = {&bf[G_TOK], &wte, &wpe, &bf[G_ENC], &B, &T, &C};
        if ((r = gpu_launch(g, K_ENCODE, BT * C, a)) != CAPEX_OK) return r;
    }
    for (l = 0; l < L; l++) {
        const capex_cuda_ptr a4 = (capex_cuda_ptr)l * BT * C * 4, s4 = (capex_cuda_ptr)l * BT * 4;
        capex_cuda_ptr ln1 = bf[G_LN1] + a4, qkv = bf[G_QKV] + 3 * a4, atty = bf[G_ATTY] + a4, res2 = bf[G_RES2] + a4;
        capex_cuda_ptr ln2 = bf[G_LN2] + a4, fch = bf[G_FCH] + 4 * a4, fchg = bf[G_FCHG] + 4 * a4, res3 = bf[G_RES3] + a4;
        capex_cuda_ptr att = bf[G_ATT] + (capex_cuda_ptr)l * B * NH * T * T * 4;
        long long n4 = BT * 4 * C;
        if ((r = gpu_norm_forward(g, ln1, bf[G_LN1M] + s4, bf[G_LN1R] + s4, res, WP(P_LN1W) + (capex_cuda_ptr)l * C * 4,
                                  WP(P_LN1B) + (capex_cuda_ptr)l * C * 4, BT)) != CAPEX_OK) return r;
        if ((r = gpu_linear_forward(g, qkv, ln1, WP(P_QKVW) + (capex_cuda_ptr)l * 3 * C * C * 4, WP(P_QKVB) + (capex_cuda_ptr)l * 3 * C * 4,
                                    BT, C, 3 * C)) != CAPEX_OK) return r;
        {
            void *a[] = {&atty, &att, &qkv, &B, &T, &C, &NH, &g->act};
            if ((r = gpu_launch(g, K_ATTN_FWD, BT * NH, a)) != CAPEX_OK) return r;
        }
        if ((r = gpu_linear_forward(g, bf[G_DA], atty, WP(P_ATTPROJW) + (capex_cuda_ptr)l * C * C * 4, WP(P_ATTPROJB) + (capex_cuda_ptr)l * C * 4,
                                    BT, C, C)) != CAPEX_OK) return r;
        if ((r = capex_cuda_add_f32(g->ctx, res2, res, bf[G_DA], (size_t)(BT * C), g->stream)) != CAPEX_OK) return r;
        if ((r = gpu_norm_forward(g, ln2, bf[G_LN2M] + s4, bf[G_LN2R] + s4, res2, WP(P_LN2W) + (capex_cuda_ptr)l * C * 4,
                                  WP(P_LN2B) + (capex_cuda_ptr)l * C * 4, BT)) != CAPEX_OK) return r;
        if ((r = gpu_linear_forward(g, fch, ln2, WP(P_FCW) + (capex_cuda_ptr)l * 4 * C * C * 4, WP(P_FCB) + (capex_cuda_ptr)l * 4 * C * 4,
                                    BT, C, 4 * C)) != CAPEX_OK) return r;
        {
            void *a[] = {&fchg, &fch, &n4, &g->act};
            if ((r = gpu_launch(g, K_GELU_FWD, n4, a)) != CAPEX_OK) return r;
        }
        if ((r = gpu_linear_forward(g, bf[G_DA], fchg, WP(P_FCPROJW) + (capex_cuda_ptr)l * 4 * C * C * 4, WP(P_FCPROJB) + (capex_cuda_ptr)l * C * 4,
                                    BT, 4 * C, C)) != CAPEX_OK) return r;
        if ((r = capex_cuda_add_f32(g->ctx, res3, res2, bf[G_DA], (size_t)(BT * C), g->stream)) != CAPEX_OK) return r;
        res = res3;
    }
    if ((r = gpu_norm_forward(g, bf[G_LNF], bf[G_LNFM], bf[G_LNFR], res, WP(P_LNFW), WP(P_LNFB), BT)) != CAPEX_OK) return r;
    /* the tied head reads the embedding rounded to act */
    if ((r = capex_cuda_memcpy_dtod(g->ctx, bf[G_WTEH], WP(P_WTE), (size_t)VOCAB * C * 4, g->stream)) != CAPEX_OK) return r;
    if ((r = gpu_round(g, bf[G_WTEH], (int64_t)VOCAB * C)) != CAPEX_OK) return r;
    if ((r = gpu_linear_forward(g, bf[G_PROBS], bf[G_LNF], bf[G_WTEH], 0, BT, C, VOCAB)) != CAPEX_OK) return r; /* logits */
    {
        void *a[] = {&bf[G_PROBS], &bf[G_TOK], &bf[G_ROWLOSS], &bt, &T, &V};
        if ((r = gpu_launch(g, K_SOFTMAX_LOSS, BT, a)) != CAPEX_OK) return r;
    }
    {
        void *a[] = {&bf[G_ROWLOSS], &bt, &B, &loss_out, &loss_acc};
        return gpu_launch(g, K_LOSS, 1, a);
    }
}

/* Data parallel (train_gpu with an NCCL comm): gpu_backward hands each
   tensor's gradient to DDP as soon as it is final, in backward order (P_LNFB
   first, P_WTE last: DDP's bucket order), converted to the bucket's dtype, so
   a full bucket's all-reduce runs on the comm stream while backward goes on.
   The per-layer tensors are stacked (llm.c's layout), so they become final
   in layer 0's backward: what overlaps is layer 0 and the embeddings. */
typedef struct gpu_grad_sink {
    capex_ddp *ddp;    /* tensor p's gradient goes to capex_ddp_grad(ddp, p) */
    capex_dtype dtype; /* of DDP's gradients (the weights' dtype) */
} gpu_grad_sink;

/* Tensors hi, hi-1, ..., lo are final in gw: to DDP (nothing without a sink). */
static capex_result gpu_grads_final(gpu_model *g, capex_cuda_ptr gw, const gpu_grad_sink *sink, int hi, int lo) {
    capex_result r = CAPEX_OK;
    int p;
    for (p = hi; sink && p >= lo && r == CAPEX_OK; p--) {
        const capex_cuda_ptr src = gw + (capex_cuda_ptr)g->m.off[p] * 4, dst = (capex_cuda_ptr)(uintptr_t)capex_ddp_grad(sink->ddp, (size_t)p);
        const size_t n = (size_t)(g->m.off[p + 1] - g->m.off[p]);
        r = sink->dtype == CAPEX_F32 ? capex_cuda_memcpy_dtod(g->ctx, dst, src, n * 4, g->stream)
                                     : capex_cuda_convert(g->ctx, dst, sink->dtype, src, CAPEX_F32, n, g->stream);
        if (r == CAPEX_OK) r = capex_ddp_grad_ready(sink->ddp, (size_t)p);
    }
    return r;
}

/* gpt_backward on the device: the fp32 gradient of (loss * *scale) into gw
   (device, n_params floats, every element written). Needs gpu_forward's
   activations of the same tokens and weights. With a sink, each tensor goes
   to DDP as it becomes final (gpu_grads_final). */
static capex_result gpu_backward(gpu_model *g, capex_cuda_ptr w, capex_cuda_ptr scale, capex_cuda_ptr gw,
                                 const gpu_grad_sink *sink) {
    const gpt *m = &g->m;
    int B = m->batch, T = m->cfg.seq, C = m->cfg.channels, L = m->cfg.layers, NH = m->cfg.heads, V = VOCAB;
    const int64_t BT = (int64_t)B * T;
    capex_cuda_ptr *bf = g->buf, dres = bf[G_DRES];
#define GP(p) (gw + (capex_cuda_ptr)m->off[p] * 4)
    long long bt = BT;
    capex_result r;
    int l;
    {
        void *a[] = {&bf[G_PROBS], &bf[G_TOK], &scale, &bt, &T, &V, &g->act};
        if ((r = gpu_launch(g, K_DLOGITS, BT * V, a)) != CAPEX_OK) return r; /* dlogits overwrite probs */
    }
    /* tied head: d lnf, and its weight gradient into the wte slot (the embedding's part is added at the end) */
    if ((r = gpu_linear_backward(g, bf[G_DA], GP(P_WTE), 0, bf[G_PROBS], bf[G_LNF], bf[G_WTEH], BT, C, VOCAB)) != CAPEX_OK) return r;
    if ((r = gpu_norm_backward(g, dres, GP(P_LNFW), GP(P_LNFB), bf[G_DA], bf[G_RES3] + (capex_cuda_ptr)(L - 1) * BT * C * 4,
                               bf[G_LNFM], bf[G_LNFR], WP(P_LNFW), BT)) != CAPEX_OK) return r;
    if ((r = gpu_grads_final(g, gw, sink, P_LNFB, P_LNFW)) != CAPEX_OK) return r;
    for (l = L - 1; l >= 0; l--) {
        const capex_cuda_ptr a4 = (capex_cuda_ptr)l * BT * C * 4, s4 = (capex_cuda_ptr)l * BT * 4;
        const capex_cuda_ptr res = l == 0 ? bf[G_ENC] : bf[G_RES3] + a4 - (capex_cuda_ptr)BT * C * 4;
        capex_cuda_ptr att = bf[G_ATT] + (capex_cuda_ptr)l * B * NH * T * T * 4, qkv = bf[G_QKV] + 3 * a4;
        long long n4 = BT * 4 * C;
        /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        if ((r = gpu_linear_backward(g, bf[G_DBIG], GP(P_FCPROJW) + (capex_cuda_ptr)l * 4 * C * C * 4, GP(P_FCPROJB) + (capex_cuda_ptr)l * C * 4,
                                     dres, bf[G_FCHG] + 4 * a4, WP(P_FCPROJW) + (capex_cuda_ptr)l * 4 * C * C * 4, BT, 4 * C, C)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_FCPROJB, P_FCPROJW)) != CAPEX_OK) return r;
        {
            capex_cuda_ptr fch = bf[G_FCH] + 4 * a4;
            void *a[] = {&bf[G_DBIG2], &fch, &bf[G_DBIG], &n4, &g->act};
            if ((r = gpu_launch(g, K_GELU_BWD, n4, a)) != CAPEX_OK) return r;
        }
        if ((r = gpu_linear_backward(g, bf[G_DA], GP(P_FCW) + (capex_cuda_ptr)l * 4 * C * C * 4, GP(P_FCB) + (capex_cuda_ptr)l * 4 * C * 4,
                                     bf[G_DBIG2], bf[G_LN2] + a4, WP(P_FCW) + (capex_cuda_ptr)l * 4 * C * C * 4, BT, C, 4 * C)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_FCB, P_FCW)) != CAPEX_OK) return r;
        if ((r = gpu_norm_backward(g, bf[G_DB], GP(P_LN2W) + (capex_cuda_ptr)l * C * 4, GP(P_LN2B) + (capex_cuda_ptr)l * C * 4, bf[G_DA],
                                   bf[G_RES2] + a4, bf[G_LN2M] + s4, bf[G_LN2R] + s4, WP(P_LN2W) + (capex_cuda_ptr)l * C * 4, BT)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_LN2B, P_LN2W)) != CAPEX_OK) return r;
        if ((r = capex_cuda_add_f32(g->ctx, dres, dres, bf[G_DB], (size_t)(BT * C), g->stream)) != CAPEX_OK) return r;
        /* attention: res2 = res + attproj(attn(qkv(ln1(res)))) */
        if ((r = gpu_linear_backward(g, bf[G_DA], GP(P_ATTPROJW) + (capex_cuda_ptr)l * C * C * 4, GP(P_ATTPROJB) + (capex_cuda_ptr)l * C * 4,
                                     dres, bf[G_ATTY] + a4, WP(P_ATTPROJW) + (capex_cuda_ptr)l * C * C * 4, BT, C, C)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_ATTPROJB, P_ATTPROJW)) != CAPEX_OK) return r;
        {
            void *a[] = {&bf[G_DQKV], &bf[G_DATT], &bf[G_DA], &qkv, &att, &B, &T, &C, &NH, &g->act};
            if ((r = gpu_launch(g, K_ATTN_BWD_Q, BT * NH, a)) != CAPEX_OK) return r;
            if ((r = gpu_launch(g, K_ATTN_BWD_KV, BT * NH, a)) != CAPEX_OK) return r;
        }
        if ((r = gpu_linear_backward(g, bf[G_DA], GP(P_QKVW) + (capex_cuda_ptr)l * 3 * C * C * 4, GP(P_QKVB) + (capex_cuda_ptr)l * 3 * C * 4,
                                     bf[G_DQKV], bf[G_LN1] + a4, WP(P_QKVW) + (capex_cuda_ptr)l * 3 * C * C * 4, BT, C, 3 * C)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_QKVB, P_QKVW)) != CAPEX_OK) return r;
        if ((r = gpu_norm_backward(g, bf[G_DB], GP(P_LN1W) + (capex_cuda_ptr)l * C * 4, GP(P_LN1B) + (capex_cuda_ptr)l * C * 4, bf[G_DA],
                                   res, bf[G_LN1M] + s4, bf[G_LN1R] + s4, WP(P_LN1W) + (capex_cuda_ptr)l * C * 4, BT)) != CAPEX_OK) return r;
        if (l == 0 && (r = gpu_grads_final(g, gw, sink, P_LN1B, P_LN1W)) != CAPEX_OK) return r;
        if ((r = capex_cuda_add_f32(g->ctx, dres, dres, bf[G_DB], (size_t)(BT * C), g->stream)) != CAPEX_OK) return r;
    }
    {
        capex_cuda_ptr gwte = GP(P_WTE), gwpe = GP(P_WPE);
        void *a[] = {&bf[G_TOK], &dres, &gwte, &gwpe, &B, &T, &C, &V};
        if ((r = gpu_launch(g, K_EMBED_BWD, (int64_t)(V + T) * C, a)) != CAPEX_OK) return r;
        return gpu_grads_final(g, gw, sink, P_WPE, P_WTE);
    }
#undef GP
#undef WP
}

/* evaluate() on the device: the same windows; one read-back at the end. */
static float gpu_evaluate(gpu_model *g, capex_cuda_ptr w, const text_data *d, int windows, capex_cuda_ptr acc) {
    const int B = g->m.batch, T = g->m.cfg.seq;
    size_t first = d->n_train, span = d->n - d->n_train - (size_t)T - 1;
    unsigned char *tok = (unsigned char *)malloc((size_t)B * (T + 1));
    double sum = 0;
    int i, done = 0;
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
    if (r != CAPEX_OK) fprintf(stderr, "GPU evaluation failed: %s\n", capex_last_error());
    free(tok);
    return r == CAPEX_OK ? (float)(sum / done) : NAN;
}

/* sample_text on the device (a B = 1 model, fp32 weights w32): the same
   context handling and draws; each byte reads back one row of probabilities. */
static int gpu_sample_text(capex_cuda_context *ctx, capex_cuda_stream stream, const gpt_config *cfg, capex_cuda_ptr w32,
                           const char *prompt, int n, uint64_t seed, FILE *out) {
    gpu_model g1;
    const int T = cfg->seq;
    unsigned char *ctxb = (unsigned char *)malloc((size_t)T + 1);
    float p[VOCAB];
    size_t len = strlen(prompt);
    int i, have, ok = 0;
    capex_result r;
    memset(&g1, 0, sizeof g1);
    r = ctxb ? gpu_model_init(&g1, ctx, stream, cfg, 1, CAPEX_F32) : CAPEX_ERR_OUT_OF_MEMORY;
    if (r != CAPEX_OK) goto done;
    have = len > (size_t)T ? T : (int)len;
    memset(ctxb, ' ', (size_t)T + 1);
    memcpy(ctxb, prompt + len - (size_t)have, (size_t)have);
    if (have == 0) { ctxb[0] = '\n'; have = 1; }
    fputs(prompt, out);
    for (i = 0; i < n; i++) {
        double u = rng_unit(&seed), cum = 0.0;
        int v = 0;
        r = capex_cuda_memcpy_htod(ctx, g1.buf[G_TOK], ctxb, (size_t)T + 1, stream);
        if (r == CAPEX_OK) r = gpu_forward(&g1, w32, 0, 0);
        if (r == CAPEX_OK) r = capex_cuda_memcpy_dtoh(ctx, p, g1.buf[G_PROBS] + (capex_cuda_ptr)(have - 1) * VOCAB * 4, sizeof p, stream);
        if (r == CAPEX_OK) r = capex_cuda_stream_synchronize(ctx, stream);
        if (r != CAPEX_OK) goto done;
        for (v = 0; v < VOCAB - 1; v++) { cum += p[v]; if (u < cum) break; }
        fputc(v, out);
        if (have < T) ctxb[have++] = (unsigned char)v;
        else { memmove(ctxb, ctxb + 1, (size_t)T - 1); ctxb[T - 1] = (unsigned char)v; }
    }
    fputc('\n', out);
    ok = 1;
done:
    if (!ok) fprintf(stderr, "GPU sampling failed: %s\n", capex_last_error());
    gpu_model_free(&g1);
    free(ctxb);
    return ok;
}

/* compute_weights on the device: weff = the half model copy in fp32 (O2,
   O3), or w32 with the matmul weights rounded to act (O1); O0 reads w32. */
static capex_result gpu_compute_weights(gpu_model *g, const capex_amp_config *amp, capex_cuda_ptr w32, capex_cuda_ptr wh,
                                        capex_cuda_ptr weff) {
    capex_result r = CAPEX_OK;
    int p;
    if (amp->model_dtype != CAPEX_F32) return capex_cuda_convert(g->ctx, weff, CAPEX_F32, wh, amp->model_dtype, (size_t)g->m.n_params, g->stream);
    if (weff == w32) return CAPEX_OK;
    r = capex_cuda_memcpy_dtod(g->ctx, weff, w32, (size_t)g->m.n_params * 4, g->stream);
    for (p = 0; p < P_COUNT && r == CAPEX_OK; p++)
        if (is_matmul_param(p)) r = gpu_round(g, weff + (capex_cuda_ptr)g->m.off[p] * 4, g->m.off[p + 1] - g->m.off[p]);
    return r;
}

/* The GPU training run: train()'s loop with the model kernels above, and
   capex's device-side optimizer, loss scaler, gradient norm and clip factor,
   so a step needs no host synchronisation; losses stay on the GPU and are
   read back at log and evaluation points. Checkpoints have the CPU run's
   format (either resumes the other's).
   Data parallel when nccl is an NCCL comm (rank of world; NULL: one GPU on
   its own): rank 0's weights are broadcast at the start, each rank trains on
   its shard (the CPU path's sampler), the gradients go through capex_ddp on
   device buckets while backward runs (gpu_grad_sink), averaged over the
   ranks, and the global norm, the clip factor and the scaler's overflow flag
   come from the reduced gradients, equal on every rank: so every rank takes
   the same step and the replicas stay bit-identical with no other collective.
   The logged losses are the mean over the ranks (one all-reduce of the loss
   history per read-back, as llm.c does). Rank 0 writes the losses, batches,
   checkpoints and the sample; every rank evaluates (same windows, same
   weights) and resumes from the same checkpoint. */
static int train_gpu(const run_cfg *c, const text_data *d, capex_cuda_context *ctx, capex_comm *nccl, int rank, int world,
                     run_result *res) {
    capex_lr_schedule lrs;
    capex_amp_config amp;
    capex_dtype act = CAPEX_F32, grad_dtype = CAPEX_F32;
    capex_scaler_desc sd;
    capex_cuda_scaler *sc = NULL;
    capex_scaler host_sc;
    capex_optim_desc od;
    capex_cuda_optim *opt = NULL;
    capex_optim_param op[P_COUNT];
    capex_tensor gt[P_COUNT];
    capex_tensor_list grads;
    capex_sampler smp;
    capex_cuda_stream stream = NULL;
    capex_ddp *ddp = NULL;
    capex_ddp_param dp[P_COUNT];
    capex_ddp_desc dd;
    gpu_grad_sink sink;
    gpu_model g;
    float *w32h = NULL, *losses = NULL, *norms = NULL;
    unsigned char *tok = NULL;
    FILE *lf = NULL, *bf = NULL, *nf = NULL;
    capex_cuda_ptr w32 = 0, wh = 0, weff = 0, weff_own = 0, g32 = 0, gh = 0, norm_ws = 0, scratch = 0, norm_hist = 0;
    size_t ws_bytes = 0, n = 0;
    int step = 0, i, ok = 0, logged = 0, ema_from = 0;
    uint64_t epoch = 0, pos = 0;
    double t0, ema = 0, tokens = 0;

    memset(res, 0, sizeof *res);
    memset(&g, 0, sizeof g);
    CHECK(amp_setup(c, rank, &amp, &act));
    grad_dtype = amp.model_dtype; /* grads have the dtype of the weights they belong to */
    if (d->n_train < (size_t)c->model.seq + 2 + (size_t)c->batch * world || d->n - d->n_train < (size_t)c->model.seq + 2) {
        fprintf(stderr, "text too short for seq %d and batch %d x %d ranks\n", c->model.seq, c->batch, world);
        return 0;
    }
    if (!nccl && world != 1) { fprintf(stderr, "train_gpu: %d ranks need an NCCL comm\n", world); return 0; }
    CHECK(capex_cuda_stream_create(ctx, &stream));
    if (nccl) CHECK(capex_nccl_set_user_stream(nccl, stream)); /* collectives wait for what this stream wrote */
    CHECK(gpu_model_init(&g, ctx, stream, &c->model, c->batch, act));
    n = (size_t)g.m.n_params;
    w32h = (float *)malloc(n * sizeof(float));
    losses = (float *)malloc((size_t)c->steps * sizeof(float));
    tok = (unsigned char *)malloc((size_t)c->batch * (c->model.seq + 1));
    if (!w32h || !losses || !tok) goto oom;
    gpt_init_weights(&g.m, w32h, c->seed); /* the CPU run's initial weights */
    if (c->init_path && rank == 0 && !c->resume_path) CHECK(save_init(&g.m, w32h, c->init_path));
    if (amp.model_dtype != CAPEX_F32 && !amp.use_master_weights) /* O3: the fp32 copy holds half values only */
        round_array(w32h, (int64_t)n, amp.model_dtype);

    /* device buffers: fp32 weights (master under O2), the half model copy, the
       weights as the kernels read them, fp32 grads (and their half copy), one
       scratch area (clip norm, clip factor, eval sum, the loss history) */
    CHECK(capex_cuda_malloc(ctx, n * 4, &w32));
    CHECK(capex_cuda_memcpy_htod(ctx, w32, w32h, n * 4, NULL));
    if (nccl) CHECK(capex_comm_broadcast(nccl, (void *)(uintptr_t)w32, n, CAPEX_F32, 0)); /* DDP's start: rank 0's weights */
    if (amp.model_dtype != CAPEX_F32) {
        CHECK(capex_cuda_malloc(ctx, n * 2, &wh));
        CHECK(capex_cuda_convert(ctx, wh, amp.model_dtype, w32, CAPEX_F32, n, stream));
    }
    if (amp.model_dtype == CAPEX_F32 && act == CAPEX_F32) weff = w32; /* O0 */
    else { CHECK(capex_cuda_malloc(ctx, n * 4, &weff_own)); weff = weff_own; }
    CHECK(capex_cuda_malloc(ctx, n * 4, &g32));
    CHECK(capex_cuda_malloc(ctx, 16 + (size_t)c->steps * 4, &scratch));
    if (c->norms_path) { /* each step's (norm of the scaled grads, 1/scale) */
        CHECK(capex_cuda_malloc(ctx, (size_t)c->steps * 8, &norm_hist));
        if (!(norms = (float *)malloc((size_t)c->steps * 8))) goto oom;
    }
    if (nccl) { /* the grads the optimizer reads: DDP's bucket views (reduced), in the weights' dtype */
        for (i = 0; i < P_COUNT; i++) {
            dp[i].data = (void *)(uintptr_t)(wh ? wh + (capex_cuda_ptr)g.m.off[i] * 2 : w32 + (capex_cuda_ptr)g.m.off[i] * 4);
            dp[i].numel = (size_t)(g.m.off[i + 1] - g.m.off[i]);
            dp[i].dtype = grad_dtype;
            dp[i].grad = NULL;
        }
        capex_ddp_desc_init(&dd);
        dd.broadcast_parameters = 0; /* done above, on the fp32 weights */
        if (c->bucket_bytes) dd.bucket_bytes = dd.first_bucket_bytes = c->bucket_bytes;
        CHECK(capex_ddp_create(&ddp, nccl, dp, P_COUNT, &dd));
        sink.ddp = ddp;
        sink.dtype = grad_dtype;
    } else if (grad_dtype != CAPEX_F32) CHECK(capex_cuda_malloc(ctx, n * 2, &gh)); /* one GPU: the grads' half copy */
    for (i = 0; i < P_COUNT; i++) {
        gt[i].data = ddp ? capex_ddp_grad(ddp, (size_t)i)
                         : (void *)(uintptr_t)(gh ? gh + (capex_cuda_ptr)g.m.off[i] * 2 : g32 + (capex_cuda_ptr)g.m.off[i] * 4);
        gt[i].numel = g.m.off[i + 1] - g.m.off[i];
    }
    grads = capex_tensor_list_make(grad_dtype, gt, P_COUNT);
    CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &grads, 1, &ws_bytes));
    CHECK(capex_cuda_malloc(ctx, ws_bytes, &norm_ws));

    capex_optim_desc_init(&od, c->optim);
    od.defaults.lr = c->lr;
    od.defaults.weight_decay = c->wd;
    if (c->optim == CAPEX_OPTIM_LAMB) od.max_grad_norm = c->clip; /* LAMB clips by the global norm itself */
    CHECK(capex_cuda_optim_create(ctx, &od, &opt));
    for (i = 0; i < P_COUNT; i++) { /* the CPU path's wiring, device pointers */
        capex_optim_param_init(&op[i]);
        CHECK(capex_optim_param_from_amp(&amp, (float *)(uintptr_t)(w32 + (capex_cuda_ptr)g.m.off[i] * 4),
                                         wh ? (void *)(uintptr_t)(wh + (capex_cuda_ptr)g.m.off[i] * 2) : NULL, gt[i].data,
                                         g.m.off[i + 1] - g.m.off[i], &op[i]));
    }
    CHECK(capex_cuda_optim_add_group(opt, NULL, op, P_COUNT, NULL));
    CHECK(lr_schedule_for(c, &lrs));
    CHECK(capex_cuda_optim_set_lr_schedule(opt, &lrs, stream)); /* the device computes each step's lr */

    CHECK(capex_scaler_desc_from_amp(&amp, &sd)); /* O1/O2 fp16: dynamic from 2^16; else static */
    sd.log_interval = c->quiet ? 0 : 200;
    CHECK(capex_cuda_scaler_create(ctx, &sd, &sc));
    CHECK(capex_scaler_init(&host_sc, &sd)); /* for checkpoints: the CPU run's format */
    CHECK(sampler_for(c, d, rank, world, &smp));

    if (c->resume_path) {
        capex_state_reader *rd = NULL;
        capex_optim *h = NULL;
        capex_scaler_state st;
        int64_t v[3] = {0, 0, 0};
        capex_result r = capex_state_reader_open_file(c->resume_path, 0, NULL, &rd);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.step", &v[0]);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.epoch", &v[1]);
        if (r == CAPEX_OK) r = capex_state_get_i64(rd, "train.pos", &v[2]);
        if (r == CAPEX_OK) r = load_ema(rd, v[0], &ema, &ema_from);
        if (r == CAPEX_OK) r = capex_cuda_optim_to_host(opt, CAPEX_OPTIM_STATE_PARAMS, stream, &h);
        if (r == CAPEX_OK) r = capex_optim_load(h, rd, "optim", CAPEX_OPTIM_STATE_PARAMS);
        if (r == CAPEX_OK) r = capex_cuda_optim_from_host(opt, h, CAPEX_OPTIM_STATE_PARAMS, stream);
        if (r == CAPEX_OK) r = capex_scaler_load(&host_sc, rd, "scaler.0.");
        if (r == CAPEX_OK) r = capex_scaler_get_state(&host_sc, &st);
        if (r == CAPEX_OK) r = capex_cuda_scaler_set_state(sc, &st, stream);
        capex_optim_destroy(h);
        capex_state_reader_close(rd);
        if (r != CAPEX_OK) { fprintf(stderr, "resume from %s failed: %s\n", c->resume_path, capex_last_error()); goto fail; }
        if (v[0] < 0 || v[0] > c->steps) { fprintf(stderr, "resume from %s: step %lld is past --steps %d\n", c->resume_path, (long long)v[0], c->steps); goto fail; }
        step = (int)v[0]; epoch = (uint64_t)v[1]; pos = (uint64_t)v[2];
        if (rank == 0 && !c->quiet) printf("resumed from %s at step %d\n", c->resume_path, step);
    }
    capex_sampler_set_epoch(&smp, epoch);
    res->start_step = step;
    if (c->losses_path && rank == 0 && !(lf = fopen(c->losses_path, "w"))) {
        fprintf(stderr, "cannot write %s\n", c->losses_path);
        goto fail;
    }
    if (c->norms_path && rank == 0 && !(nf = fopen(c->norms_path, "w"))) {
        fprintf(stderr, "cannot write %s\n", c->norms_path);
        goto fail;
    }
    if (c->batches_path && rank == 0 && !(bf = fopen(c->batches_path, "wb"))) {
        fprintf(stderr, "cannot write %s\n", c->batches_path);
        goto fail;
    }

    t0 = capex_dist_now();
    logged = step;
    for (; step < c->steps; step++) {
        const capex_cuda_ptr dnorm = scratch, dcoef = scratch + 4, dloss = scratch + 16 + (capex_cuda_ptr)step * 4;
        /* the same on every rank: a read-back all-reduces the losses */
        const int log_now = c->log_every && !c->quiet && (step % c->log_every == 0 || step == c->steps - 1);
        const int eval_now = c->eval_every && ((step + 1) % c->eval_every == 0 || step == c->steps - 1) && res->n_points < MAX_POINTS;
        const int save_now = c->save_path && step + 1 == (c->save_at > 0 ? c->save_at : c->steps); /* every rank: the read below reduces */
        CHECK(next_batch(c, d, &smp, &epoch, &pos, tok));
        if (bf && fwrite(tok, 1, (size_t)c->batch * (c->model.seq + 1), bf) != (size_t)c->batch * (c->model.seq + 1)) {
            fprintf(stderr, "cannot write %s\n", c->batches_path);
            goto fail;
        }
        /* from pageable memory the copy has consumed tok when it returns */
        CHECK(capex_cuda_memcpy_htod(ctx, g.buf[G_TOK], tok, (size_t)c->batch * (c->model.seq + 1), stream));
        CHECK(gpu_compute_weights(&g, &amp, w32, wh, weff));
        CHECK(gpu_forward(&g, weff, dloss, 0));
        CHECK(gpu_backward(&g, weff, capex_cuda_scaler_scale_ptr(sc), g32, ddp ? &sink : NULL));
        if (ddp) CHECK(capex_ddp_finalize(ddp)); /* the last buckets; the stream waits for every reduce */
        if (gh) CHECK(capex_cuda_convert(ctx, gh, grad_dtype, g32, CAPEX_F32, n, stream)); /* grads in the weights' dtype */
        /* one pass over the (still scaled) grads: global norm; inf/NaN show up in it */
        CHECK(capex_cuda_multi_tensor_l2norm(ctx, NULL, &grads, norm_ws, ws_bytes, dnorm, 0, stream));
        {
            capex_cuda_ptr inv = capex_cuda_scaler_inv_scale_ptr(sc), found = capex_cuda_scaler_found_inf_ptr(sc);
            float max_norm = c->optim == CAPEX_OPTIM_LAMB ? 0.0f : c->clip; /* LAMB clips by itself */
            void *a[] = {(void *)&dnorm, &inv, &found, (void *)&dcoef, &max_norm};
            CHECK(gpu_launch(&g, K_CLIP, 1, a));
            CHECK(capex_cuda_optim_step(opt, inv, dcoef, found, stream)); /* skipped on the device after an overflow */
            if (norm_hist) { /* before the update changes the scale */
                CHECK(capex_cuda_memcpy_dtod(ctx, norm_hist + (capex_cuda_ptr)step * 8, dnorm, 4, stream));
                CHECK(capex_cuda_memcpy_dtod(ctx, norm_hist + (capex_cuda_ptr)step * 8 + 4, inv, 4, stream));
            }
        }
        CHECK(capex_cuda_scaler_update(sc, stream));
        tokens += (double)c->batch * c->model.seq * world;

        if (log_now || eval_now || save_now || step == c->steps - 1) {
            /* read the losses since the last read (the only host sync besides checkpoints);
               with several ranks their mean; a checkpoint keeps their average */
            if (nccl) {
                const capex_cuda_ptr since = scratch + 16 + (capex_cuda_ptr)logged * 4;
                CHECK(capex_comm_allreduce(nccl, (const void *)(uintptr_t)since, (void *)(uintptr_t)since, (size_t)(step + 1 - logged),
                                           CAPEX_F32, CAPEX_REDUCE_AVG));
            }
            CHECK(capex_cuda_memcpy_dtoh(ctx, losses + logged, scratch + 16 + (capex_cuda_ptr)logged * 4,
                                         (size_t)(step + 1 - logged) * 4, stream));
            if (norm_hist)
                CHECK(capex_cuda_memcpy_dtoh(ctx, norms + 2 * logged, norm_hist + (capex_cuda_ptr)logged * 8,
                                             (size_t)(step + 1 - logged) * 8, stream));
            CHECK(capex_cuda_stream_synchronize(ctx, stream));
            for (; logged <= step; logged++) {
                ema = logged == ema_from ? losses[logged] : 0.95 * ema + 0.05 * losses[logged];
                if (lf) fprintf(lf, "%d %.9g\n", logged, losses[logged]);
                if (nf) fprintf(nf, "%d %.9g\n", logged, norms[2 * logged] * norms[2 * logged + 1]); /* as gpt_clip computes it */
            }
        }
        if (log_now && rank == 0) {
            double el = capex_dist_now() - t0;
            capex_scaler_state st;
            int64_t taken = 0;
            CHECK(capex_cuda_scaler_get_state(sc, &st, stream));
            CHECK(capex_cuda_optim_get_step(opt, 0, &taken, stream));
            printf("[%s] step %5d  loss %.4f  scale %-9g skipped %lld  lr %.2e  %.0f tok/s\n", c->label, step, losses[step],
                   st.scale, (long long)st.skipped_steps, (float)capex_lr_at(&lrs, c->lr, taken), el > 0 ? tokens / el : 0.0);
        }
        if (eval_now) {
            float vl;
            CHECK(gpu_compute_weights(&g, &amp, w32, wh, weff)); /* after this step's update */
            vl = gpu_evaluate(&g, weff, d, c->eval_windows, scratch + 8);
            res->pt_step[res->n_points] = step + 1;
            res->pt_train[res->n_points] = (float)ema;
            res->pt_val[res->n_points] = vl;
            res->n_points++;
            if (rank == 0 && !c->quiet) printf("[%s] step %5d  val loss %.4f\n", c->label, step + 1, vl);
        }
        if (save_now && rank == 0) { /* replicas: one writes */
            capex_state_writer *w = NULL;
            capex_optim *h = NULL;
            capex_scaler_state st;
            capex_result r = capex_state_writer_create(NULL, &w);
            if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.step", step + 1);
            if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.epoch", (int64_t)epoch);
            if (r == CAPEX_OK) r = capex_state_add_i64(w, "train.pos", (int64_t)pos);
            if (r == CAPEX_OK) r = capex_state_add_f64(w, "train.ema", ema);
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
    CHECK(gpu_compute_weights(&g, &amp, w32, wh, weff));
    res->val_loss = gpu_evaluate(&g, weff, d, c->eval_windows, scratch + 8);
    CHECK(capex_cuda_memcpy_dtoh(ctx, w32h, w32, n * 4, NULL));
    res->weights_crc = capex_crc32(0, w32h, n * sizeof(float));
    if (ddp) {
        capex_ddp_stats ds;
        capex_ddp_get_stats(ddp, &ds);
        res->ddp_launches = ds.launches;
        res->ddp_in_backward = ds.launched_in_backward;
    }
    if (c->sample_len > 0 && rank == 0) { /* the inference half: fp32 weights, as an engine would load them */
        printf("---- sample (%d bytes) ----\n", c->sample_len);
        if (!gpu_sample_text(ctx, stream, &c->model, w32, c->prompt ? c->prompt : "", c->sample_len, c->seed + 1, stdout)) goto fail;
        printf("----\n");
    }
    ok = 1;
    goto done;
oom:
    fprintf(stderr, "out of memory\n");
fail:
done:
    if (lf) fclose(lf);
    if (nf) fclose(nf);
    if (bf) fclose(bf);
    capex_cuda_optim_destroy(opt);
    capex_cuda_scaler_destroy(sc);
    capex_ddp_destroy(ddp);
    gpu_model_free(&g);
    capex_cuda_free(ctx, w32); capex_cuda_free(ctx, wh); capex_cuda_free(ctx, weff_own);
    capex_cuda_free(ctx, g32); capex_cuda_free(ctx, gh); capex_cuda_free(ctx, norm_ws); capex_cuda_free(ctx, scratch);
    capex_cuda_free(ctx, norm_hist);
    if (stream && nccl) capex_nccl_set_user_stream(nccl, NULL); /* before the stream goes */
    if (stream) capex_cuda_stream_destroy(ctx, stream);
    free(w32h); free(losses); free(norms); free(tok);
    return ok;
}

/* ---- command line -------------------------------------------------------- */

static void run_cfg_default(run_cfg *c) {
    memset(c, 0, sizeof *c);
    c->level = CAPEX_O2; c->half = CAPEX_F16; c->optim = CAPEX_OPTIM_ADAM;
    c->model.seq = 64; c->model.layers = 2; c->model.heads = 4; c->model.channels = 64; c->model.rms = 0;
    c->steps = 1000; c->batch = 16;
    c->lr = 3e-3f; c->wd = 0.01f; c->clip = 1.0f; c->min_lr_frac = 0.1f; c->warmup = 50; c->seed = 1337;
    c->eval_every = 100; c->eval_windows = 512; c->log_every = 50;
    c->sample_len = 300; c->prompt = "This License";
}

/* The device for --device auto|cpu|gpu: this rank's GPU ($LOCAL_RANK), or
   NULL for the CPU. Without a usable GPU (driver, device or NVRTC missing),
   auto says why and trains on the CPU; gpu fails (*fail = 1) with the
   loader's message. Several ranks on GPUs train data parallel over NCCL
   (main), one GPU each. */
static capex_cuda_context *open_device(const char *device, int rank, int *fail) {
    capex_cuda_context *ctx = NULL;
    int major = 0, minor = 0; /* the kernels need NVRTC (on a fresh machine: nothing cached yet) */
    *fail = 0;
    if (!strcmp(device, "cpu")) return NULL;
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK || capex_cuda_nvrtc_version(&major, &minor) != CAPEX_OK) {
        capex_cuda_context_destroy(ctx);
        ctx = NULL;
        if (!strcmp(device, "gpu")) { fprintf(stderr, "--device gpu: %s\n", capex_last_error()); *fail = 1; }
        else if (rank == 0) printf("no usable GPU, training on the CPU (%s)\n", capex_last_error());
    }
    return ctx;
}

#ifndef TRAIN_GPT_NO_MAIN
static void usage(void) {
    printf("usage: train_gpt [options]\n"
           "  --opt O0|O1|O2|O3     opt level (default O2)\n"
           "  --half fp16|bf16      half type for O1-O3 (default fp16)\n"
           "  --device auto|cpu|gpu where to train (default auto: the GPU when one is usable)\n"
           "  --optim adamw|lamb    (default adamw, lr 3e-3; lamb: lr 3e-2)\n"
           "  --steps N --batch B --lr X --wd X --clip X --warmup N --seed N\n"
           "  --seq T --layers L --heads H --channels C --norm layer|rms   model size\n"
           "  --data FILE           training text (default: /usr/share/common-licenses/*)\n"
           "  --save FILE [--save-at STEP]  checkpoint;  --resume FILE  continue from one\n"
           "  --save-init FILE      initial weights as safetensors (bench/gpt_torch.py reads them)\n"
           "  --losses FILE         per-step training loss, \"step loss\" per line\n"
           "  --norms FILE          per-step gradient norm (before clipping), \"step norm\" per line\n"
           "  --batches FILE        every step's tokens (B rows of T+1 bytes), for bench/gpt_torch.py\n"
           "  --sample N --prompt TEXT   bytes sampled after training (default 300; 0: none)\n"
           "  --bucket-kb N         DDP bucket size\n"
           "  --nccl                GPU: gradients through DDP over NCCL even with one rank (tests;\n"
           "                        several GPU ranks always are)\n"
           "  --log-every N --eval-every N --eval-windows N --quiet\n"
           "Several ranks: the launcher environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT;\n"
           "torchrun --no-python) over TCP, or mpirun with the CAPEX_MPI build; on GPUs (one per\n"
           "rank, $LOCAL_RANK) over NCCL.\n");
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
    const char *data_path = NULL, *device = "auto";
    int i, rc = 1, have_host = 0, have_nccl = 0, force_nccl = 0, lr_given = 0, dev_fail = 0;
    run_cfg_default(&cfg);
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else if (!strcmp(a, "--quiet")) { cfg.quiet = 1; used = 0; }
        else if (!strcmp(a, "--nccl")) { force_nccl = 1; used = 0; }
        else if (!v) { fprintf(stderr, "%s needs a value (--help)\n", a); return 2; }
        else if (!strcmp(a, "--opt")) { if (capex_opt_level_parse(v, &cfg.level) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 2; } }
        else if (!strcmp(a, "--half")) { if (capex_half_type_parse(v, &cfg.half) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 2; } }
        else if (!strcmp(a, "--optim")) {
            if (!strcmp(v, "adamw") || !strcmp(v, "adam")) cfg.optim = CAPEX_OPTIM_ADAM;
            else if (!strcmp(v, "lamb")) cfg.optim = CAPEX_OPTIM_LAMB;
            else { fprintf(stderr, "--optim: adamw or lamb\n"); return 2; }
        }
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "gpu")) { fprintf(stderr, "--device: auto, cpu or gpu\n"); return 2; }
            device = v;
        }
        else if (!strcmp(a, "--norm")) {
            if (!strcmp(v, "layer")) cfg.model.rms = 0;
            else if (!strcmp(v, "rms")) cfg.model.rms = 1;
            else { fprintf(stderr, "--norm: layer or rms\n"); return 2; }
        }
        else if (!strcmp(a, "--steps")) OPT_INT(cfg.steps);
        else if (!strcmp(a, "--batch")) OPT_INT(cfg.batch);
        else if (!strcmp(a, "--lr")) { OPT_FLOAT(cfg.lr); lr_given = 1; }
        else if (!strcmp(a, "--wd")) OPT_FLOAT(cfg.wd);
        else if (!strcmp(a, "--clip")) {
            OPT_FLOAT(cfg.clip); /* a negative one silently skipped clipping (AdamW, SGD) or failed LAMB's setup */
            if (cfg.clip < 0) { fprintf(stderr, "--clip: '%s' is not >= 0 (0: no clipping)\n", v); return 2; }
        }
        else if (!strcmp(a, "--warmup")) OPT_INT(cfg.warmup);
        else if (!strcmp(a, "--seed")) { if (!opt_u64(a, v, &cfg.seed)) return 2; }
        else if (!strcmp(a, "--seq")) OPT_INT(cfg.model.seq);
        else if (!strcmp(a, "--layers")) OPT_INT(cfg.model.layers);
        else if (!strcmp(a, "--heads")) OPT_INT(cfg.model.heads);
        else if (!strcmp(a, "--channels")) OPT_INT(cfg.model.channels);
        else if (!strcmp(a, "--data")) data_path = v;
        else if (!strcmp(a, "--save")) cfg.save_path = v;
        else if (!strcmp(a, "--save-at")) OPT_COUNT(cfg.save_at);
        else if (!strcmp(a, "--resume")) cfg.resume_path = v;
        else if (!strcmp(a, "--save-init")) cfg.init_path = v;
        else if (!strcmp(a, "--losses")) cfg.losses_path = v;
        else if (!strcmp(a, "--norms")) cfg.norms_path = v;
        else if (!strcmp(a, "--batches")) cfg.batches_path = v;
        else if (!strcmp(a, "--sample")) OPT_INT(cfg.sample_len);
        else if (!strcmp(a, "--prompt")) cfg.prompt = v;
        else if (!strcmp(a, "--bucket-kb")) {
            uint64_t kb;
            if (!opt_u64(a, v, &kb)) return 2;
            if (kb > ((uint64_t)1 << 40)) { fprintf(stderr, "--bucket-kb: at most 2^40\n"); return 2; }
            cfg.bucket_bytes = (size_t)kb * 1024;
        }
        else if (!strcmp(a, "--log-every")) OPT_COUNT(cfg.log_every);
        else if (!strcmp(a, "--eval-every")) OPT_COUNT(cfg.eval_every);
        else if (!strcmp(a, "--eval-windows")) OPT_INT(cfg.eval_windows);
        else { fprintf(stderr, "unknown option %s (--help)\n", a); return 2; }
        i += used;
    }
    /* LAMB moves each tensor by about lr times its norm per step: it wants a larger lr */
    if (cfg.optim == CAPEX_OPTIM_LAMB && !lr_given) cfg.lr = 3e-2f;
    if (cfg.steps < 1 || cfg.batch < 1 || cfg.model.seq < 1 || cfg.model.layers < 1 || cfg.model.heads < 1 ||
        cfg.model.channels < 1 || cfg.model.channels % cfg.model.heads != 0 || !(cfg.lr > 0) || cfg.eval_windows < 1 ||
        cfg.warmup < 0 || cfg.sample_len < 0) {
        fprintf(stderr, "steps, batch, seq, layers, heads, channels, eval-windows, lr must be positive, "
                        "channels a multiple of heads, warmup and sample >= 0\n");
        return 2;
    }
    if (cfg.save_at > cfg.steps || (cfg.save_at > 0 && !cfg.save_path)) { /* else no checkpoint, silently */
        fprintf(stderr, "--save-at %d: needs --save FILE and a step within --steps %d\n", cfg.save_at, cfg.steps);
        return 2;
    }
    {
        gpt probe; /* a model too large to exist (its message) */
        if (!gpt_layout(&probe, &cfg.model, cfg.batch, CAPEX_F32)) return 2;
    }
    if (cfg.save_path && !save_path_writable(cfg.save_path)) return 2;
#ifdef CAPEX_MPI
    MPI_Init(&argc, &argv);
#endif
    if (capex_dist_env_read(NULL, &env) != CAPEX_OK) {
        fprintf(stderr, "launcher environment: %s\n", capex_last_error());
        goto out;
    }
    capex_dist_log_init(&env);
    ctx = open_device(device, env.rank, &dev_fail);
    if (dev_fail) goto out;
    /* The host comm (MPI, TCP or single) for the CPU path and to bootstrap
       NCCL under MPI; NCCL for several GPUs (its id over TCP without MPI). */
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
    if (ctx && (env.world_size > 1 || force_nccl)) {
        capex_nccl_desc nd;
        capex_nccl_desc_init(&nd);
        nd.ctx = ctx;
        nd.bootstrap = have_host ? &host_comm : NULL;
        if (capex_comm_init_nccl(&nccl_comm, &env, &nd) != CAPEX_OK) {
            fprintf(stderr, "NCCL setup failed: %s (--device cpu trains on the CPU)\n", capex_last_error());
            goto out;
        }
        have_nccl = 1;
        comm = &nccl_comm;
    }
    if (!load_text(data_path, 0.1, &data)) goto out;
    if (env.rank == 0) {
        gpt probe;
        int64_t n_params = 0;
        const capex_cuda_device_info *di = ctx ? capex_cuda_context_device(ctx) : NULL;
        char where[300];
        if (di) snprintf(where, sizeof where, "GPU %s (sm_%d%d)", di->name, di->cc_major, di->cc_minor);
        else snprintf(where, sizeof where, "the CPU");
        if (gpt_layout(&probe, &cfg.model, 1, CAPEX_F32)) n_params = probe.n_params;
        printf("capex %s  GPT: %d layers, %d heads, %d channels, seq %d, %s, %lld parameters; %zu bytes of text "
               "(%zu train / %zu validation), %d rank(s) via %s, on %s\n",
               CAPEX_VERSION_STRING, cfg.model.layers, cfg.model.heads, cfg.model.channels, cfg.model.seq,
               cfg.model.rms ? "RMSNorm" : "LayerNorm", (long long)n_params, data.n, data.n_train, data.n - data.n_train,
               env.world_size, capex_launcher_name(env.launcher), where);
    }
    {
        run_result res;
        float mine, *all = (float *)malloc((size_t)env.world_size * sizeof(float));
        int same = 1;
        cfg.label = capex_opt_level_name(cfg.level);
        if (!all || !(ctx ? train_gpu(&cfg, &data, ctx, have_nccl ? comm : NULL, env.rank, env.world_size, &res)
                          : train(&cfg, &gpt_cpu_backend, &data, comm, env.rank, env.world_size, &res))) { free(all); goto out_data; }
        /* DDP keeps replicas bit-identical: compare every rank's weight checksum
           (allgather moves bits, so the crc travels as the bits of a float). */
        memcpy(&mine, &res.weights_crc, sizeof mine);
        if (allgather_f32(comm, ctx, &mine, all, env.world_size) != CAPEX_OK) {
            fprintf(stderr, "replica check failed: %s\n", capex_last_error());
            free(all);
            goto out_data;
        }
        for (i = 1; i < env.world_size; i++) same &= memcmp(&all[i], &all[0], sizeof mine) == 0;
        free(all);
        if (env.rank == 0) {
            printf("final: val loss %.4f  train loss %.4f  skipped %lld  %.0f tok/s  %.1f s  weights crc32 %08x\n",
                   res.val_loss, res.train_loss, (long long)res.skipped, res.tokens_per_s, res.seconds, (unsigned)res.weights_crc);
            if (env.world_size > 1) printf("replicas: %d ranks, weights %s\n", env.world_size, same ? "bit-identical" : "DIFFER");
            if (res.ddp_launches) /* GPU path over NCCL */
                printf("ddp: %llu bucket all-reduces over NCCL, %llu of them started during backward\n",
                       (unsigned long long)res.ddp_launches, (unsigned long long)res.ddp_in_backward);
        }
        rc = same ? 0 : 1;
    }
out_data:
    free(data.bytes);
out:
    if (have_nccl) capex_comm_destroy(&nccl_comm);
    if (have_host) capex_comm_destroy(&host_comm);
    capex_cuda_context_destroy(ctx);
#ifdef CAPEX_MPI
    MPI_Finalize();
#endif
    return rc;
}
#endif /* TRAIN_GPT_NO_MAIN */
