/* Data-parallel linear regression with capex: the same binary runs alone,
   under torchrun --no-python (TCP backend) and, built with
   `mpicc -DCAPEX_MPI`, under mpirun / srun (MPI backend).

       cc -O2 examples/ddp_linreg.c -o ddp -lm && ./ddp
       torchrun --no-python --nproc-per-node 2 ./ddp
       mpicc -DCAPEX_MPI -O2 examples/ddp_linreg.c -o ddp_mpi -lm && mpirun -np 2 ./ddp_mpi */
#define _POSIX_C_SOURCE 200809L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>

#define N 512 /* samples */
#define D 16  /* features */
#define B 16  /* per-rank batch */

static float feature(int i, int j) { return (float)((i * 37 + j * 11) % 19) / 9.5f - 1.0f; }
static float target(int i) { float y = 0.5f; int j; for (j = 0; j < D; j++) y += 0.1f * (float)(j - 8) * feature(i, j); return y; }

int main(int argc, char **argv) {
    capex_dist_env env;
    capex_comm comm;
    capex_ddp *ddp;
    capex_ddp_param ps[2];
    capex_ddp_desc dd;
    capex_sampler_desc sd;
    capex_sampler smp;
    float w[D] = {0}, b = 0.0f, lr = 0.1f;
    int epoch, k, i, j;
    capex_result r;
#ifdef CAPEX_MPI
    MPI_Init(&argc, &argv);
#endif
    (void)argc; (void)argv;
    if ((r = capex_dist_env_read(NULL, &env)) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
    capex_dist_log_init(&env); /* capex warnings from rank 0 only */
    if ((r = capex_comm_init_auto(&comm, &env)) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
    ps[0].data = w; ps[0].numel = D; ps[0].dtype = CAPEX_F32; ps[0].grad = NULL;
    ps[1].data = &b; ps[1].numel = 1; ps[1].dtype = CAPEX_F32; ps[1].grad = NULL;
    capex_ddp_desc_init(&dd);
    if ((r = capex_ddp_create(&ddp, &comm, ps, 2, &dd)) != CAPEX_OK) { fprintf(stderr, "%s\n", capex_last_error()); return 1; }
    capex_sampler_desc_init(&sd);
    sd.dataset_size = N; sd.num_replicas = env.world_size; sd.rank = env.rank; sd.seed = 1;
    capex_sampler_init(&smp, &sd);
    for (epoch = 0; epoch < 20; epoch++) {
        double loss = 0;
        capex_sampler_set_epoch(&smp, (uint64_t)epoch);
        for (k = 0; k + B <= (int)smp.num_samples; k += B) {
            float err[B], *gw, *gb;
            for (i = 0; i < B; i++) { /* forward */
                uint64_t s;
                float y = b;
                capex_sampler_index(&smp, (uint64_t)(k + i), &s);
                for (j = 0; j < D; j++) y += w[j] * feature((int)s, j);
                err[i] = y - target((int)s);
                loss += 0.5 * err[i] * err[i];
                err[i] /= B;
            }
            gb = (float *)capex_ddp_grad(ddp, 1); /* backward, last parameter first */
            for (i = 0; i < B; i++) *gb += err[i];
            capex_ddp_grad_ready(ddp, 1);
            gw = (float *)capex_ddp_grad(ddp, 0);
            for (i = 0; i < B; i++) {
                uint64_t s;
                capex_sampler_index(&smp, (uint64_t)(k + i), &s);
                for (j = 0; j < D; j++) gw[j] += err[i] * feature((int)s, j);
            }
            capex_ddp_grad_ready(ddp, 0);
            if ((r = capex_ddp_finalize(ddp)) != CAPEX_OK) { /* never step on a failed reduce */
                fprintf(stderr, "rank %d: %s: %s\n", env.rank, capex_result_string(r), capex_last_error());
                return 2;
            }
            for (j = 0; j < D; j++) w[j] -= lr * gw[j];
            b -= lr * *gb;
            capex_ddp_zero_grad(ddp);
        }
        if (env.rank == 0 && epoch % 5 == 4)
            printf("epoch %2d  loss(rank 0 shard) %.6f  b %.4f  (%s, %d ranks)\n", epoch, loss / (double)smp.num_samples,
                   (double)b, comm.vt->name, comm.world_size);
    }
    capex_ddp_destroy(ddp);
    capex_comm_destroy(&comm);
#ifdef CAPEX_MPI
    MPI_Finalize();
#endif
    return 0;
}
