/* port_after.c - examples/port_before.c after the port to capex: Apex O2
   mixed precision (fp16 model copy, fp32 master weights, dynamic loss
   scaling), fused AdamW, data parallel (DDP buckets + distributed sampler).
   The engine (forward_backward) is unchanged. Runs alone, under
   `torchrun --no-python --nproc-per-node 2`, and built with
   `mpicc -DCAPEX_MPI` under `mpirun -np 2` or srun. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_FEAT 512
#define N_DATA 8192
#define BATCH 64
#define STEPS 400

static float X[N_DATA][N_FEAT], Y[N_DATA];

static void make_data(void) { /* y = x . w_true + noise, fixed seed */
    unsigned s = 12345;
    float w_true[N_FEAT];
    int i, j;
    for (j = 0; j < N_FEAT; j++) { s = s * 1664525u + 1013904223u; w_true[j] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    for (i = 0; i < N_DATA; i++) {
        double y = 0;
        for (j = 0; j < N_FEAT; j++) { s = s * 1664525u + 1013904223u; X[i][j] = (float)(s >> 8) / 8388608.0f - 1.0f; y += X[i][j] * w_true[j]; }
        s = s * 1664525u + 1013904223u;
        Y[i] = (float)y + 0.01f * ((float)(s >> 8) / 8388608.0f - 1.0f);
    }
}

/* The engine: mean squared error and its gradient (added into g). */
static float forward_backward(const float *w, const int *idx, int n, float *g) {
    float loss = 0;
    int b, j;
    for (b = 0; b < n; b++) {
        const float *x = X[idx[b]];
        float err = -Y[idx[b]];
        for (j = 0; j < N_FEAT; j++) err += x[j] * w[j];
        loss += err * err / (float)n;
        for (j = 0; j < N_FEAT; j++) g[j] += 2.0f * err * x[j] / (float)n;
    }
    return loss;
}

int main(int argc, char **argv) {
    static float w[N_FEAT], g32[N_FEAT], w_eff[N_FEAT]; /* w: now the fp32 master weights */
    static uint16_t wh[N_FEAT];                          /* the fp16 model copy */
    int idx[BATCH], step, b;
    float loss = 0;
    /* capex: opt level (amp.initialize), data parallel (DDP wrap), scaler, optimizer */
    capex_amp_overrides ov; capex_amp_config amp;
    capex_dist_env env; capex_comm comm;
    capex_ddp_param dp; capex_ddp_desc dd; capex_ddp *ddp = NULL;
    capex_sampler_desc sd; capex_sampler smp;
    capex_scaler_desc scd; capex_scaler sc;
    capex_optim_desc od; capex_optim_param op; capex_optim *opt = NULL;
    capex_tensor gt, g32t; capex_tensor_list gl, g32l;
    (void)argc; (void)argv;
#ifdef CAPEX_MPI
    MPI_Init(&argc, &argv);
#endif
    make_data();
    capex_amp_overrides_init(&ov);
    if (capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &amp) || capex_dist_env_read(NULL, &env) ||
        capex_comm_init_auto(&comm, &env)) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
    capex_dist_log_init(&env);
    capex_comm_broadcast(&comm, w, N_FEAT, CAPEX_F32, 0);     /* every rank starts from rank 0's weights */
    capex_f32_to_f16_array(w, wh, N_FEAT);
    dp.data = wh; dp.numel = N_FEAT; dp.dtype = CAPEX_F16; dp.grad = NULL; /* grads: fp16 bucket views */
    capex_ddp_desc_init(&dd); dd.broadcast_parameters = 0;    /* done above, on the master weights */
    capex_sampler_desc_init(&sd);
    sd.dataset_size = N_DATA; sd.num_replicas = env.world_size; sd.rank = env.rank;
    capex_scaler_desc_from_amp(&amp, &scd);                   /* O2 fp16: dynamic, 2^16, x2 / 2000 */
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM); od.defaults.lr = 0.01f; /* AdamW, Apex defaults */
    if (capex_ddp_create(&ddp, &comm, &dp, 1, &dd) || capex_sampler_init(&smp, &sd) || capex_scaler_init(&sc, &scd) ||
        capex_optim_create(&od, &opt)) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
    capex_optim_param_init(&op);                              /* O2: the fp32 master w, fed by the */
    if (capex_optim_param_from_amp(&amp, w, wh, capex_ddp_grad(ddp, 0), N_FEAT, &op) || /* fp16 grads, */
        capex_optim_add_group(opt, NULL, &op, 1, NULL)) {     /* writes the fp16 copy wh, same pass */
        fprintf(stderr, "%s\n", capex_last_error());
        return 1;
    }
    gt.data = (void *)op.grad; gt.numel = N_FEAT; gl = capex_tensor_list_make(CAPEX_F16, &gt, 1);
    g32t.data = g32; g32t.numel = N_FEAT; g32l = capex_tensor_list_make(CAPEX_F32, &g32t, 1);

    for (step = 0; step < STEPS; step++) {
        float scale, inv_scale, norm;
        int do_step, inf = 0;
        for (b = 0; b < BATCH; b++) {                         /* this rank's shard */
            uint64_t i, t = (uint64_t)(step * BATCH + b);     /* epoch t / n, index t % n */
            capex_sampler_set_epoch(&smp, t / smp.num_samples); capex_sampler_index(&smp, t % smp.num_samples, &i);
            idx[b] = (int)i;
        }
        capex_scaler_scale(&sc, &scale);
        capex_f16_to_f32_array(wh, w_eff, N_FEAT);            /* an engine with fp16 kernels reads wh itself */
        memset(g32, 0, sizeof g32);
        loss = forward_backward(w_eff, idx, BATCH, g32);
        capex_multi_tensor_scale(NULL, &g32l, &gl, scale, &inf);  /* scaled loss's grads, as fp16 */
        capex_ddp_grad_ready(ddp, 0);                         /* call as each grad is done */
        if (capex_ddp_finalize(ddp)) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
        capex_multi_tensor_l2norm(NULL, &gl, &norm, NULL);    /* inf/NaN anywhere shows here */
        capex_scaler_unscale(&sc, 0, !isfinite(norm), &inv_scale);
        capex_scaler_step(&sc, 0, &do_step);                  /* skip the step on overflow */
        capex_optim_step(opt, inv_scale, capex_clip_coef(norm * inv_scale, 1.0f), !do_step);
        capex_scaler_update(&sc);
        capex_ddp_zero_grad(ddp);
        if (step % 100 == 0 && env.rank == 0) printf("step %4d  loss %.5f  scale %g\n", step, loss, scale);
    }
    if (env.rank == 0) printf("final loss %.5f\n", loss);
    capex_optim_destroy(opt);
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&comm);
#ifdef CAPEX_MPI
    MPI_Finalize();
#endif
    return loss < 0.01f ? 0 : 1;
}
