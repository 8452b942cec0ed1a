/* Built and run by `make compile-check` with -DCAPEX_NO_DIST, -DCAPEX_NO_STATE,
   both and neither (C and C++, -Werror): what each switch keeps links and
   gives the right numbers, what it removes is gone. Every check is against a
   value worked out here in float64 or by hand; exit status 1 on any failure. */
#define CAPEX_CUDA_IMPLEMENTATION /* also capex.h's implementation */
#include "../capex_cuda.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The switches must remove their sections' declarations (the functions are
   checked by tests/compile_check_removed.c: calling one is a compile error). */
#if defined(CAPEX_NO_STATE) && defined(CAPEX_STATE_FORMAT_VERSION)
#error "CAPEX_NO_STATE kept the state files section"
#endif
#if defined(CAPEX_NO_DIST) && defined(CAPEX_F64)
#error "CAPEX_NO_DIST kept the comm declarations"
#endif
#if !defined(CAPEX_NO_STATE) && !defined(CAPEX_STATE_FORMAT_VERSION)
#error "state files missing without CAPEX_NO_STATE"
#endif
#if !defined(CAPEX_NO_DIST) && !defined(CAPEX_F64)
#error "data parallel missing without CAPEX_NO_DIST"
#endif

static int failures = 0;
static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAIL %s (%s)\n", what, capex_last_error());
        failures++;
    }
}

int main(void) {
    /* Loss scaler: 65536, an overflow skips the step and halves the scale. */
    capex_scaler_desc sd;
    capex_scaler sc;
    float scale = 0.0f, inv = 0.0f;
    int go = -1;
    /* AdamW, one step on fp32 weights with scaled gradients. */
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.1f, -0.3f, 2.0f}, gs[3];
    const double p0[3] = {1.0, -2.0, 0.5}, g0[3] = {0.1, -0.3, 2.0};
    capex_optim_desc od;
    capex_optim_param op;
    capex_optim *opt = NULL;
    /* Distributed sampler: 10 samples over 3 ranks. */
    capex_sampler_desc smd;
    capex_sampler sm;
    int seen[10] = {0}, rank, i;
    uint64_t idx[4];
    /* BatchNorm without a comm: [N=2, C=1, S=2] in training. */
    float x[4] = {1.0f, 2.0f, 3.0f, 4.0f}, y[4], mean = 0.0f, invstd = 0.0f;
    capex_batch_norm_desc bd;
    capex_batch_norm_args ba;
    double t0;

    capex_set_log_level(CAPEX_LOG_ERROR); /* the overflow below is on purpose */
    capex_scaler_desc_init(&sd);
    check(capex_scaler_init(&sc, &sd) == CAPEX_OK, "scaler_init");
    check(capex_scaler_scale(&sc, &scale) == CAPEX_OK && scale == 65536.0f, "scale 65536");
    check(capex_scaler_unscale(&sc, 0, 1, &inv) == CAPEX_OK, "unscale (overflow)");
    check(capex_scaler_step(&sc, 0, &go) == CAPEX_OK && go == 0, "overflow skips the step");
    check(capex_scaler_update(&sc) == CAPEX_OK && capex_scaler_get_scale(&sc) == 32768.0f, "backoff to 32768");
    check(capex_scaler_scale(&sc, &scale) == CAPEX_OK && scale == 32768.0f, "scale 32768");
    for (i = 0; i < 3; i++) gs[i] = g[i] * scale; /* exact: a power of two */
    check(capex_scaler_unscale(&sc, 0, 0, &inv) == CAPEX_OK && inv == 1.0f / 32768.0f, "inv_scale");
    check(capex_scaler_step(&sc, 0, &go) == CAPEX_OK && go == 1, "clean step");

    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM); /* adam_w_mode on: AdamW */
    od.defaults.lr = 0.01f;
    od.defaults.weight_decay = 0.1f;
    capex_optim_param_init(&op);
    op.param = p; op.grad = gs; op.grad_dtype = CAPEX_F32; op.numel = 3;
    check(capex_optim_create(&od, &opt) == CAPEX_OK, "optim_create");
    check(opt && capex_optim_add_group(opt, NULL, &op, 1, NULL) == CAPEX_OK, "add_group");
    check(opt && capex_optim_step(opt, inv, 1.0f, !go) == CAPEX_OK, "AdamW step");
    check(capex_scaler_update(&sc) == CAPEX_OK, "update");
    for (i = 0; i < 3; i++) {
        /* step 1: m^ = g, v^ = g^2, so p -= lr * (g / (|g| + eps) + wd * p) */
        double want = p0[i] - 0.01 * (g0[i] / (fabs(g0[i]) + 1e-8) + 0.1 * p0[i]);
        check(fabs((double)p[i] - want) <= 1e-6 * fabs(want), "AdamW value");
    }
    capex_optim_destroy(opt);

    capex_sampler_desc_init(&smd);
    smd.dataset_size = 10; smd.num_replicas = 3; smd.seed = 7;
    for (rank = 0; rank < 3; rank++) {
        smd.rank = rank;
        check(capex_sampler_init(&sm, &smd) == CAPEX_OK && sm.num_samples == 4, "sampler: ceil(10/3) per rank");
        capex_sampler_set_epoch(&sm, 2);
        check(capex_sampler_indices(&sm, idx, 4) == CAPEX_OK, "sampler_indices");
        for (i = 0; i < 4; i++) if (idx[i] < 10) seen[idx[i]]++;
    }
    for (i = 0; i < 10; i++) check(seen[i] >= 1 && seen[i] <= 2, "sampler covers every sample (2 padded)");

    capex_batch_norm_desc_init(&bd);
    capex_batch_norm_args_init(&ba);
    ba.n = 2; ba.c = 1; ba.s = 2; ba.x = x; ba.y = y; ba.save_mean = &mean; ba.save_invstd = &invstd;
    check(capex_batch_norm_forward(&bd, NULL, &ba) == CAPEX_OK, "batch_norm_forward, comm NULL");
    for (i = 0; i < 4; i++) { /* mean 2.5, biased var 1.25 */
        double want = ((double)x[i] - 2.5) / sqrt(1.25 + 1e-5);
        check(fabs((double)y[i] - want) <= 1e-6, "batch norm value");
    }
    check(capex_cuda_batch_norm_workspace_bytes(4, 1) == 8u + 4u * (14u + 14u + 8u), "GPU BN workspace (C=4)");

    t0 = capex_dist_now();
    check(t0 > 0.0 && capex_dist_now() >= t0, "capex_dist_now is a monotonic clock");

#ifndef CAPEX_NO_STATE
    { /* scaler state through a memory file */
        capex_state_writer *w = NULL;
        capex_state_reader *rd = NULL;
        capex_scaler s2;
        unsigned char buf[4096];
        size_t len = 0;
        check(capex_state_writer_create(NULL, &w) == CAPEX_OK && capex_scaler_save(&sc, w, "s.") == CAPEX_OK &&
                  capex_state_write_memory(w, buf, sizeof buf, &len) == CAPEX_OK,
              "state write");
        capex_state_writer_destroy(w);
        check(capex_scaler_init(&s2, &sd) == CAPEX_OK &&
                  capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK &&
                  capex_scaler_load(&s2, rd, "s.") == CAPEX_OK && capex_scaler_get_scale(&s2) == 32768.0f,
              "state round trip");
        capex_state_reader_close(rd);
    }
#endif
#ifndef CAPEX_NO_DIST
    { /* a world of one sums to itself */
        capex_comm c;
        double v = 3.25;
        check(capex_comm_init_single(&c) == CAPEX_OK &&
                  capex_comm_allreduce(&c, &v, &v, 1, CAPEX_F64, CAPEX_REDUCE_SUM) == CAPEX_OK && v == 3.25,
              "single comm");
        capex_comm_destroy(&c);
    }
#endif
    printf("compile_check_min%s%s: %s\n",
#ifdef CAPEX_NO_DIST
           " NO_DIST",
#else
           "",
#endif
#ifdef CAPEX_NO_STATE
           " NO_STATE",
#else
           "",
#endif
           failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
