/* bench_zero.c - the sharded optimizer (capex_zero) against DDP + capex_optim
   over MPI: step time and optimizer memory per rank.

       mpicc -std=c99 -O2 -DCAPEX_MPI bench/bench_zero.c -o build/bench_zero -lm
       mpirun -np 2 build/bench_zero            (or: make bench-zero)

   The synthetic model: L layers of P parameters, AdamW. fp32: f32 params
   and grads; O2: bf16 params and grads with fp32 masters. A step is a
   backward (each layer's gradient costs K multiply-adds per element, handed
   over last layer first), the reduction (DDP allreduce / ZeRO
   reduce-scatter), the global norm (found_inf and clipping), the optimizer
   step and, for ZeRO, the parameter all-gather. Time: the slowest rank's
   (MPI MAX), median of the measured steps. Memory: optimizer state (fp32
   masters + moments) and gradient buffers held per rank, from
   capex_zero_memory_info and, for DDP, the same count of its buffers.
   Options: -L layers, -P params per layer, -K work per element, -s steps,
   -b bucket MiB (4; both DDP's and ZeRO's, so that stage 2 lends a few). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int L = 16, K = 4, STEPS = 7;
static size_t BUCKET = (size_t)4 << 20; /* bytes, DDP's and ZeRO's buckets alike */
static size_t P = 256 * 1024; /* 16 x 256k = 4M params */

static double max_all(double x) { double y = x; MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return y; }
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_d); return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

/* Layer l's gradient into g (dtype t): K dependent multiply-adds per element. */
static void layer_backward(void *g, capex_dtype t, size_t n, int layer, int rank) {
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        float x = (float)((i * 2654435761u + (unsigned)layer * 97u + (unsigned)rank * 13u) & 1023) * (1.0f / 1024.0f) - 0.5f, y = x;
        for (k = 0; k < K; k++) y = y * 0.999f + x * 1e-3f;
        if (t == CAPEX_F32) ((float *)g)[i] = y;
        else ((uint16_t *)g)[i] = capex_f32_to_bf16(y);
    }
}

#define CHECK(x) do { capex_result r_ = (x); if (r_ != CAPEX_OK) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, capex_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

typedef struct result { double ms; size_t state, grads; } result;

/* mode 0: DDP + capex_optim; 1, 2: ZeRO stage 1, 2. */
static result run(capex_comm *c, int mode, capex_dtype t) {
    size_t es = capex_dtype_size(t);
    void **data = (void **)calloc((size_t)L, sizeof(void *));
    float **master = (float **)calloc((size_t)L, sizeof(float *));
    double *times = (double *)calloc((size_t)STEPS, sizeof(double));
    capex_optim_desc od;
    capex_optim *opt = NULL;
    capex_ddp *ddp = NULL;
    capex_zero *z = NULL;
    result res;
    int l, s;
    memset(&res, 0, sizeof res);
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.defaults.weight_decay = 0.01f;
    for (l = 0; l < L; l++) {
        data[l] = calloc(P, es);
        if (t != CAPEX_F32 && mode == 0) master[l] = (float *)calloc(P, sizeof(float));
    }
    if (mode == 0) {
        capex_ddp_param *dp = (capex_ddp_param *)calloc((size_t)L, sizeof *dp);
        capex_optim_param *op = (capex_optim_param *)calloc((size_t)L, sizeof *op);
        capex_ddp_desc dd;
        for (l = 0; l < L; l++) { dp[l].data = data[l]; dp[l].numel = P; dp[l].dtype = t; dp[l].grad = NULL; }
        capex_ddp_desc_init(&dd);
        dd.bucket_bytes = BUCKET;
        CHECK(capex_ddp_create(&ddp, c, dp, (size_t)L, &dd));
        CHECK(capex_optim_create(&od, &opt));
        for (l = 0; l < L; l++) {
            capex_optim_param_init(&op[l]);
            op[l].numel = (int64_t)P;
            op[l].grad = capex_ddp_grad(ddp, (size_t)l);
            op[l].grad_dtype = t;
            if (t == CAPEX_F32) op[l].param = (float *)data[l];
            else { op[l].param = master[l]; op[l].model = data[l]; op[l].model_dtype = t; }
        }
        CHECK(capex_optim_add_group(opt, NULL, op, (size_t)L, NULL));
        /* what DDP + capex_optim hold: masters (halves), m and v, full-size grad buckets */
        res.state = (size_t)L * P * (sizeof(float) * 2 + (t != CAPEX_F32 ? sizeof(float) : 0));
        res.grads = (size_t)L * P * es;
        free(dp); free(op);
    } else {
        capex_zero_param *zp = (capex_zero_param *)calloc((size_t)L, sizeof *zp);
        capex_zero_desc zd;
        for (l = 0; l < L; l++) { zp[l].data = data[l]; zp[l].numel = P; zp[l].dtype = t; zp[l].group = 0; }
        capex_zero_desc_init(&zd);
        zd.stage = mode;
        zd.bucket_bytes = BUCKET;
        CHECK(capex_zero_create(&z, c, zp, (size_t)L, &od, NULL, 1, &zd));
        free(zp);
    }
    for (s = 0; s < STEPS + 1; s++) {
        double t0;
        float norm = 0.0f;
        int inf = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = capex_dist_now();
        for (l = L - 1; l >= 0; l--) {
            void *g = mode ? capex_zero_grad(z, (size_t)l) : capex_ddp_grad(ddp, (size_t)l);
            layer_backward(g, t, P, l, c->rank);
            CHECK(mode ? capex_zero_grad_ready(z, (size_t)l) : capex_ddp_grad_ready(ddp, (size_t)l));
        }
        if (mode) {
            CHECK(capex_zero_finalize(z));
            CHECK(capex_zero_grad_norm(z, &inf, &norm));
            CHECK(capex_zero_step(z, 1.0f, capex_clip_coef(norm, 1.0f), inf));
            CHECK(capex_zero_zero_grad(z));
        } else {
            capex_tensor *tl = (capex_tensor *)calloc((size_t)L, sizeof *tl);
            capex_tensor_list gl;
            CHECK(capex_ddp_finalize(ddp));
            for (l = 0; l < L; l++) { tl[l].data = capex_ddp_grad(ddp, (size_t)l); tl[l].numel = (int64_t)P; }
            gl = capex_tensor_list_make(t, tl, (size_t)L);
            CHECK(capex_multi_tensor_l2norm(NULL, &gl, &norm, NULL));
            inf = !(norm - norm == 0.0f);
            CHECK(capex_optim_step(opt, 1.0f, capex_clip_coef(norm, 1.0f), inf));
            CHECK(capex_ddp_zero_grad(ddp));
            free(tl);
        }
        if (s > 0) times[s - 1] = max_all(capex_dist_now() - t0);
    }
    res.ms = 1e3 * median(times, STEPS);
    if (mode) {
        capex_zero_memory m = capex_zero_memory_info(z);
        res.state = m.optimizer_state_bytes;
        res.grads = m.grad_bytes;
    }
    capex_zero_destroy(z);
    capex_ddp_destroy(ddp);
    capex_optim_destroy(opt);
    for (l = 0; l < L; l++) { free(data[l]); free(master[l]); }
    free(data); free(master); free(times);
    return res;
}

int main(int argc, char **argv) {
    capex_comm c;
    int i, ti;
    MPI_Init(&argc, &argv);
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-L")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-P")) P = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-K")) K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) STEPS = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) BUCKET = (size_t)atol(argv[i + 1]) << 20;
    }
    CHECK(capex_comm_init_mpi_world(&c));
    if (c.rank == 0) {
        printf("bench_zero: np %d, %d layers x %zu params (%.1fM), AdamW, K %d, %zu MiB buckets, median of %d steps "
               "(slowest rank)\n\n", c.world_size, L, P, (double)L * (double)P / 1e6, K, BUCKET >> 20, STEPS);
        printf("| params | method | step ms | vs DDP | optimizer state MiB/rank | vs DDP | grad buffers MiB/rank |\n");
        printf("|---|---|---:|---:|---:|---:|---:|\n");
    }
    for (ti = 0; ti < 2; ti++) {
        capex_dtype t = ti ? CAPEX_BF16 : CAPEX_F32;
        result base = run(&c, 0, t);
        int mode;
        for (mode = 0; mode <= 2; mode++) {
            result r = mode ? run(&c, mode, t) : base;
            if (c.rank == 0)
                printf("| %s | %s | %.1f | %.2f | %.1f | %.2f | %.1f |\n", ti ? "bf16 + fp32 masters" : "fp32",
                       mode == 0 ? "DDP + capex_optim" : mode == 1 ? "ZeRO stage 1" : "ZeRO stage 2", r.ms, r.ms / base.ms,
                       (double)r.state / 1048576.0, (double)r.state / (double)base.state, (double)r.grads / 1048576.0);
        }
    }
    capex_comm_destroy(&c);
    MPI_Finalize();
    return 0;
}
