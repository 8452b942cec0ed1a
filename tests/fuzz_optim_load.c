/* fuzz_optim_load.c - libFuzzer target for capex_optim_load past the checksum.

   Each input is a state file; capex_fuzz_fixup (fuzz_load.h) repairs its
   header length and checksum, then it is loaded, with and without
   CAPEX_OPTIM_STATE_PARAMS, into six live optimizers (Adam with f16/bf16
   model copies and an empty tensor over two groups, LAMB, SGD with one group
   with momentum and one without, NovoGrad with reg_inside_moment, an empty
   tensor and two groups, Adagrad in W mode over two groups, Adam with one
   amsgrad group and one without), each already stepped once. A refused load
   must leave the optimizer bit-identical (struct, groups, per-step constants,
   weights, model copies, moments, grads) and set a message. An accepted one
   must give valid hyperparameters and step counts in [0, CAPEX_STEP_MAX],
   survive save + reload into a fresh optimizer bit-identically, and step
   (CAPEX_OK, or CAPEX_ERR_LIMIT at the bound) with no sanitizer report.

   Build and run (tests/state.mk's ci-extra does this for a few seconds):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
           -Itests tests/fuzz_optim_load.c -o fuzz_optim_load -lm
       mkdir -p corpus && ./fuzz_optim_load corpus tests/corpus/fuzz_optim_load -max_total_time=3600
   Seeds: cc -DCAPEX_FUZZ_GEN -Itests tests/fuzz_optim_load.c -o gen -lm && ./gen tests/corpus/fuzz_optim_load */
#include "fuzz_load.h"

#define NRIG 6
#define MAXT 4

typedef struct frig {
    capex_optim *opt;
    size_t nt;
    int64_t n[MAXT];
    float p[MAXT][8], g[MAXT][8];
    uint16_t model[MAXT][8];
} frig;

/* Rig c: deterministic contents, one step taken. */
static void frig_make(frig *r, int c) {
    capex_optim_desc d;
    capex_optim_param ps[MAXT];
    capex_optim_hparams hp;
    size_t t, i;
    memset(r, 0, sizeof *r);
    capex_optim_desc_init(&d, c == 0 || c == 5 ? CAPEX_OPTIM_ADAM : c == 1 ? CAPEX_OPTIM_LAMB
                              : c == 2 ? CAPEX_OPTIM_SGD : c == 3 ? CAPEX_OPTIM_NOVOGRAD : CAPEX_OPTIM_ADAGRAD);
    d.seed = 42;
    if (c == 0) { d.adam_w_mode = 1; d.stochastic_rounding = 1; d.defaults.weight_decay = 0.01f; }
    if (c == 1) d.max_grad_norm = 1.0f;
    if (c == 2) d.defaults.momentum = 0.9f;
    if (c == 3) { d.reg_inside_moment = 1; d.defaults.weight_decay = 0.01f; }
    if (c == 4) { d.adam_w_mode = 1; d.defaults.lr_decay = 0.1f; d.defaults.initial_accumulator_value = 0.2f; }
    if (c == 5) d.defaults.amsgrad = 1;
    CAPEX_FUZZ_REQUIRE(capex_optim_create(&d, &r->opt) == CAPEX_OK);
    r->nt = c == 0 ? 4 : c == 1 ? 2 : 3;
    for (t = 0; t < r->nt; t++) {
        r->n[t] = ((c == 0 || c == 3) && t == 1) ? 0 : (int64_t)(3 + t);
        for (i = 0; i < 8; i++) {
            r->p[t][i] = 0.25f * (float)(i + 1) - 0.5f * (float)t;
            r->g[t][i] = 0.125f * (float)i - 0.3f + 0.01f * (float)t;
        }
        memset(r->model[t], 0x3c, sizeof r->model[t]);
        capex_optim_param_init(&ps[t]);
        ps[t].param = r->p[t];
        ps[t].grad = r->g[t];
        ps[t].grad_dtype = CAPEX_F32;
        ps[t].numel = r->n[t];
        if (c == 0) { ps[t].model = r->model[t]; ps[t].model_dtype = t == 3 ? CAPEX_BF16 : CAPEX_F16; }
        if (c == 3 && t == 2) { ps[t].model = r->model[t]; ps[t].model_dtype = CAPEX_F16; }
    }
    if (c == 0) { /* groups {0, 1, 2} and {3} */
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, NULL, ps, 3, NULL) == CAPEX_OK);
        hp = d.defaults; hp.lr = 0.01f; hp.bias_correction = 0;
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, &hp, ps + 3, 1, NULL) == CAPEX_OK);
    } else if (c == 1) {
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK);
    } else if (c == 3) { /* {0, 1} and {2} */
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK);
        hp = d.defaults; hp.lr = 0.01f; hp.grad_averaging = 0;
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, &hp, ps + 2, 1, NULL) == CAPEX_OK);
    } else if (c >= 4) { /* {0, 1} and {2}: other lr_decay / without amsgrad (no max buffer) */
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK);
        hp = d.defaults; hp.lr_decay = 0.0f; hp.amsgrad = 0;
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, &hp, ps + 2, 1, NULL) == CAPEX_OK);
    } else { /* {0, 1} with momentum, {2} without (no buffers) */
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, NULL, ps, 2, NULL) == CAPEX_OK);
        hp = d.defaults; hp.momentum = 0.0f; hp.nesterov = 0;
        CAPEX_FUZZ_REQUIRE(capex_optim_add_group(r->opt, &hp, ps + 2, 1, NULL) == CAPEX_OK);
    }
    CAPEX_FUZZ_REQUIRE(capex_optim_step(r->opt, 0.5f, 1.0f, 0) == CAPEX_OK);
}

/* Everything a load may touch, and what it must not, as one byte string. */
typedef struct snap { unsigned char *b; size_t n, cap; } snap;
static void snap_add(snap *s, const void *p, size_t n) {
    if (!n) return;
    if (s->n + n > s->cap) {
        s->cap = 2 * (s->n + n);
        s->b = (unsigned char *)realloc(s->b, s->cap);
        CAPEX_FUZZ_REQUIRE(s->b != NULL);
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
}
/* whole = 0: only the contents a load restores (for round-trip checks). */
static void snap_take(snap *s, const frig *r, int whole) {
    const capex_optim *o = r->opt;
    size_t t, g;
    s->n = 0;
    if (whole) {
        snap_add(s, o, sizeof *o);
        snap_add(s, o->groups, o->ngroups * sizeof *o->groups);
        snap_add(s, o->gc, o->ngroups * sizeof *o->gc);
        snap_add(s, o->tensors, o->ntensors * sizeof *o->tensors);
        snap_add(s, r->g, sizeof r->g);
        if (o->novo_v) snap_add(s, o->novo_v, o->ntensors * sizeof *o->novo_v);
    } else {
        for (g = 0; g < o->ngroups; g++) {
            snap_add(s, &o->groups[g].hp, sizeof o->groups[g].hp);
            snap_add(s, &o->groups[g].step, sizeof o->groups[g].step);
            snap_add(s, &o->groups[g].mom_init, sizeof o->groups[g].mom_init);
        }
        snap_add(s, &o->desc.max_grad_norm, sizeof o->desc.max_grad_norm);
        snap_add(s, &o->desc.seed, sizeof o->desc.seed);
        snap_add(s, &o->desc.reg_inside_moment, sizeof o->desc.reg_inside_moment);
        snap_add(s, &o->desc.init_zero, sizeof o->desc.init_zero);
        snap_add(s, &o->desc.norm_type, sizeof o->desc.norm_type);
        if (o->novo_v) snap_add(s, o->novo_v, o->ntensors * sizeof *o->novo_v);
    }
    for (t = 0; t < o->ntensors; t++) {
        const capex_optim_param *p = &o->tensors[t].p;
        size_t n = (size_t)p->numel;
        snap_add(s, p->param, n * 4);
        if (p->model) snap_add(s, p->model, n * 2);
        if (p->exp_avg) snap_add(s, p->exp_avg, n * 4);
        if (p->exp_avg_sq) snap_add(s, p->exp_avg_sq, n * 4);
        if (p->max_exp_avg_sq) snap_add(s, p->max_exp_avg_sq, n * 4);
    }
}

static void check_loaded(int c, unsigned flags, frig *r) {
    const capex_optim *o = r->opt;
    capex_state_writer *w = NULL;
    capex_state_reader *rd = NULL;
    unsigned char *buf = NULL;
    size_t len = 0, g;
    snap a = {NULL, 0, 0}, b = {NULL, 0, 0};
    frig r2;
    capex_result rc;
    CAPEX_FUZZ_REQUIRE(!o->broken);
    CAPEX_FUZZ_REQUIRE(capex__optim_check_desc(&o->desc) == CAPEX_OK);
    for (g = 0; g < o->ngroups; g++) {
        CAPEX_FUZZ_REQUIRE(o->groups[g].step >= 0 && o->groups[g].step <= CAPEX_STEP_MAX);
        CAPEX_FUZZ_REQUIRE(capex__optim_check_hp(&o->desc, &o->groups[g].hp) == CAPEX_OK);
    }
    /* save + reload into a fresh optimizer: identical contents */
    CAPEX_FUZZ_REQUIRE(capex_state_writer_create(NULL, &w) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_optim_save(o, w, NULL, flags) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK);
    buf = (unsigned char *)malloc(len);
    CAPEX_FUZZ_REQUIRE(buf && capex_state_write_memory(w, buf, len, &len) == CAPEX_OK);
    capex_state_writer_destroy(w);
    frig_make(&r2, c);
    CAPEX_FUZZ_REQUIRE(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_optim_load(r2.opt, rd, NULL, flags) == CAPEX_OK);
    capex_state_reader_close(rd);
    free(buf);
    if (!(flags & CAPEX_OPTIM_STATE_PARAMS)) { /* weights are not in the file: take them over */
        size_t t;
        for (t = 0; t < r->nt; t++) {
            memcpy(r2.p[t], r->p[t], sizeof r->p[t]);
            memcpy(r2.model[t], r->model[t], sizeof r->model[t]);
        }
    }
    snap_take(&a, r, 0);
    snap_take(&b, &r2, 0);
    CAPEX_FUZZ_REQUIRE(a.n == b.n && memcmp(a.b, b.b, a.n) == 0);
    /* and it steps (at the bound, or where the file's lr schedule gives a
       non-finite lr: refused, nothing changes) */
    {
        int lr_bad = 0;
        float lr;
        for (g = 0; g < o->ngroups; g++) lr_bad |= capex_optim_get_lr(o, g, &lr) != CAPEX_OK;
        rc = capex_optim_step(r->opt, 1.0f, 1.0f, 0);
        CAPEX_FUZZ_REQUIRE(rc == CAPEX_OK || rc == CAPEX_ERR_LIMIT || (lr_bad && rc == CAPEX_ERR_INVALID_ARG));
    }
    capex_optim_destroy(r2.opt);
    free(a.b);
    free(b.b);
}

static void capex_fuzz_optim_load(const uint8_t *data, size_t size) {
    unsigned char *buf = (unsigned char *)malloc(size ? size : 1);
    capex_state_reader *rd = NULL;
    snap before = {NULL, 0, 0}, after = {NULL, 0, 0};
    int c, f;
    if (size) memcpy(buf, data, size);
    capex_fuzz_fixup(buf, size);
    if (capex_state_reader_open_memory(buf, size, 0, NULL, &rd) != CAPEX_OK) {
        CAPEX_FUZZ_REQUIRE(rd == NULL);
        free(buf);
        return;
    }
    for (c = 0; c < NRIG; c++)
        for (f = 0; f < 2; f++) {
            unsigned flags = f ? CAPEX_OPTIM_STATE_PARAMS : 0u;
            frig r;
            capex_result rc;
            frig_make(&r, c);
            snap_take(&before, &r, 1);
            rc = capex_optim_load(r.opt, rd, NULL, flags);
            if (rc != CAPEX_OK) {
                CAPEX_FUZZ_REQUIRE(rc < 0 && capex_last_error()[0] != '\0');
                snap_take(&after, &r, 1);
                CAPEX_FUZZ_REQUIRE(before.n == after.n && memcmp(before.b, after.b, before.n) == 0);
            } else {
                check_loaded(c, flags, &r);
            }
            capex_optim_destroy(r.opt);
        }
    capex_state_reader_close(rd);
    free(before.b);
    free(after.b);
    free(buf);
}

#ifdef CAPEX_FUZZ_GEN
/* Seeds: each rig after a few steps, with and without the weights, in a
   file that also holds a loss scaler (a real checkpoint); one with a step
   count just below the bound; one with an lr schedule attached (a kind per
   rig: the schedule's loader is fuzzed too); one with it count_skipped and a
   skipped step (its iteration count ahead of the step counts). The committed
   *_sched seeds are from before count_skipped (no count_skipped / iteration
   entries): old files, kept. Each must load into its rig and
   pass the target's checks. */
int main(int argc, char **argv) {
    int c, f;
    const char *names[NRIG] = {"adam", "lamb", "sgd", "novograd", "adagrad", "amsgrad"};
    if (argc != 2) { fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
    for (c = 0; c < NRIG; c++)
        for (f = 0; f < 5; f++) {
            frig r;
            capex_state_writer *w = NULL;
            capex_state_reader *rd = NULL;
            capex_scaler sc;
            capex_scaler_desc sd;
            unsigned flags = f == 1 ? 0u : CAPEX_OPTIM_STATE_PARAMS;
            unsigned char *buf;
            size_t len = 0;
            char name[64];
            int s;
            frig_make(&r, c);
            if (f >= 3) {
                static const capex_lr_kind kinds[NRIG] = {CAPEX_LR_COSINE, CAPEX_LR_ONECYCLE, CAPEX_LR_MULTISTEP,
                                                          CAPEX_LR_POLYNOMIAL, CAPEX_LR_STEP, CAPEX_LR_EXPONENTIAL};
                capex_lr_schedule ls;
                capex_lr_schedule_init(&ls, kinds[c]);
                ls.total_steps = 40;
                if (kinds[c] != CAPEX_LR_ONECYCLE) { ls.warmup_steps = 2; ls.warmup_start_factor = 0.25; }
                if (kinds[c] == CAPEX_LR_MULTISTEP) { ls.num_milestones = 2; ls.milestones[0] = 3; ls.milestones[1] = 9; }
                if (kinds[c] == CAPEX_LR_STEP) ls.step_size = 2;
                if (kinds[c] == CAPEX_LR_ONECYCLE) ls.three_phase = 1;
                ls.count_skipped = f == 4;
                CAPEX_FUZZ_REQUIRE(capex_optim_set_lr_schedule(r.opt, &ls) == CAPEX_OK);
            }
            for (s = 0; s < 3; s++) capex_optim_step(r.opt, 0.5f, 1.0f, f == 4 && s == 1);
            if (f == 2) r.opt->groups[0].step = CAPEX_STEP_MAX - 1; /* near the bound */
            capex_scaler_desc_init(&sd);
            capex_scaler_init(&sc, &sd);
            capex_state_writer_create(NULL, &w);
            CAPEX_FUZZ_REQUIRE(capex_optim_save(r.opt, w, NULL, flags) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_scaler_save(&sc, w, "scaler.0.") == CAPEX_OK);
            snprintf(name, sizeof name, "%s_%s.safetensors", names[c], f == 1 ? "moments" : f == 2 ? "bigstep" : f == 3 ? "sched" : f == 4 ? "schedskip" : "params");
            buf = capex_fuzz_write_seed(w, argv[1], name, &len);
            capex_state_writer_destroy(w);
            capex_optim_destroy(r.opt);
            frig_make(&r, c);
            CAPEX_FUZZ_REQUIRE(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_optim_load(r.opt, rd, NULL, flags) == CAPEX_OK);
            capex_state_reader_close(rd);
            check_loaded(c, flags, &r);
            capex_optim_destroy(r.opt);
            capex_fuzz_optim_load(buf, len);
            free(buf);
        }
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    capex_fuzz_optim_load(data, size);
    return 0;
}
#endif
