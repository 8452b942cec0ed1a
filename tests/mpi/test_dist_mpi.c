/* Multi-rank data-parallel tests over MPI (build: mpicc -DCAPEX_MPI; run:
   mpirun -np 2 / -np 4 --oversubscribe; tests/test_dist_mpirun.c does both).

   `test_dist_mpi`        every test below; rank 0 prints one line per test and
                          "mpi-summary: N passed, N failed"
   `test_dist_mpi kill`   rank 1 is SIGKILLed mid-step: the job must end
   `test_dist_mpi stall`  rank 1 stops mid-step: the others must return
                          CAPEX_ERR_TIMEOUT from finalize within the deadline
   `test_dist_mpi late`   rank 0's DDP allreduce and ZeRO all-gather time
                          out and rank 0 destroys both before rank 1 turns up:
                          what rank 0 freed must not be written (np 2)
   `test_dist_mpi after_finalize`  every comm call after MPI_Finalize must
                          return CAPEX_ERR_ORDER, not abort the process
   `test_dist_mpi stall_blocking`  rank 1 never enters the blocking
                          collectives: the others' allreduce, broadcast,
                          allgather, reduce-scatter and allgatherv must
                          time out (run with np 2)

   The model is linear regression y = x.w + b, the weight split into 5
   parameter tensors so several buckets form; every rank trains on its
   DistributedSampler shard and the result is compared with one process
   training on the concatenated batch (float64 reference). */
#define _POSIX_C_SOURCE 200809L
#ifndef CAPEX_MPI
#define CAPEX_MPI
#endif
#define CAPEX_IMPLEMENTATION
#include "../../capex.h"
#include "../dist_shards.h"
#include "../zero_check.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

static int g_rank, g_world, g_layout;
static char g_why[512];
#define CHECK(cond, ...) do { if (!(cond)) { snprintf(g_why, sizeof g_why, __VA_ARGS__); return 1; } } while (0)
/* Records the first failure and goes on, so every rank still makes each collective. */
#define NOTE(cond, ...) do { if (!(cond) && !g_why[0]) snprintf(g_why, sizeof g_why, __VA_ARGS__); } while (0)

/* ---- data ---- */
#define D 40
#define NS 96
#define B 6
#define NPARAM 6
static const size_t p_numel[NPARAM] = {7, 16, 5, 9, 3, 1}; /* 5 weight slices, then the bias */
static size_t p_off[NPARAM];
static float X[NS][D], Y[NS];

static float hash01(uint64_t i) { /* deterministic in [-1, 1) */
    i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    i ^= i >> 31;
    i *= 0x94d049bb133111ebull;
    i ^= i >> 29;
    return (float)((double)(i >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static void make_data(void) {
    int i, j;
    size_t off = 0;
    for (i = 0; i < NPARAM; i++) { p_off[i] = off; off += p_numel[i]; }
    for (i = 0; i < NS; i++) {
        double y = 0.3;
        for (j = 0; j < D; j++) { X[i][j] = hash01((uint64_t)(i * D + j)); y += X[i][j] * (0.05 * (j % 7) - 0.1); }
        Y[i] = (float)(y + 0.01 * hash01(100000u + (uint64_t)i));
    }
}

/* ---- model state: params[0..4] are slices of w (p_off), params[5] = b ---- */
typedef struct model { float w[D + 1]; } model; /* w[D] is the bias */

static void init_model(model *m, int rank) { /* different per rank: broadcast must fix it */
    int j;
    for (j = 0; j <= D; j++) m->w[j] = 0.1f * hash01(7777u + (uint64_t)(rank * 1000 + j));
}
static float *param_ptr(model *m, int p) { return p == NPARAM - 1 ? &m->w[D] : &m->w[p_off[p]]; }

/* the batch indices of `rank` at (epoch, step) */
static void batch_of(int rank, int world, int epoch, int step, uint64_t *idx) {
    capex_sampler_desc sd;
    capex_sampler s;
    int k;
    capex_sampler_desc_init(&sd);
    sd.dataset_size = NS; sd.num_replicas = world; sd.rank = rank; sd.seed = 7;
    capex_sampler_init(&s, &sd);
    capex_sampler_set_epoch(&s, (uint64_t)epoch);
    for (k = 0; k < B; k++) capex_sampler_index(&s, (uint64_t)(step * B + k), &idx[k]);
}

/* float64 reference: one process, concatenated batch of all ranks */
static void reference(double *w, int world, int steps, float lr, int rank0_init) {
    model m0;
    int j, st;
    uint64_t *idx = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)(B * world));
    init_model(&m0, rank0_init);
    for (j = 0; j <= D; j++) w[j] = m0.w[j];
    for (st = 0; st < steps; st++) {
        int per_epoch = NS / world / B, r, i;
        double gw[D + 1];
        memset(gw, 0, sizeof gw);
        for (r = 0; r < world; r++) batch_of(r, world, st / per_epoch, st % per_epoch, idx + r * B);
        for (i = 0; i < B * world; i++) {
            double e = w[D] - Y[idx[i]];
            for (j = 0; j < D; j++) e += w[j] * X[idx[i]][j];
            for (j = 0; j < D; j++) gw[j] += e * X[idx[i]][j];
            gw[D] += e;
        }
        for (j = 0; j <= D; j++) w[j] = (double)(float)(w[j] - (double)lr * (gw[j] / (B * world)));
    }
    free(idx);
}

/* ---- launch recorder: wraps the MPI vtable's iallreduce ---- */
static capex_comm_vtable rec_vt;
static const capex_comm_vtable *orig_vt;
static const void *rec_bufs[256];
static int rec_n;
static capex_result rec_iallreduce(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_reduce_op op,
                                   capex_comm_req *q) {
    if (rec_n < 256) rec_bufs[rec_n++] = r;
    return orig_vt->iallreduce(c, s, r, n, t, op, q);
}
static void comm_make(capex_comm *c, double timeout) {
    if (capex_comm_init_mpi(c, MPI_COMM_WORLD) != CAPEX_OK) { fprintf(stderr, "init: %s\n", capex_last_error()); exit(2); }
    orig_vt = c->vt;
    rec_vt = *c->vt;
    rec_vt.iallreduce = rec_iallreduce;
    c->vt = &rec_vt;
    c->timeout_s = timeout;
    rec_n = 0;
}

/* A stalled rank: silent until mpirun ends the job, which it does when a
   survivor exits with its error; 120 s at most, a hang guard. (A fixed 30 s
   could run out first on a loaded machine: the rank's exit ended the job
   before the survivors' 2 s deadlines had fired.) */
#define STALL_HOLD() do { sleep(120); _exit(0); } while (0)

typedef struct opts {
    int delay, accumulate, unused, bf16, rebuild, kill_at, stall_at;
    float predivide;
    double timeout;
} opts;

static int identical(const void *buf, int bytes);

/* Trains `steps` steps; returns 0 and the final weights, or 1 with g_why. */
static int train(const opts *o, int steps, float lr, model *out, capex_ddp_stats *stats, int *bucket_order_ok) {
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param ps[NPARAM + 1];
    capex_ddp_desc d;
    model m;
    int np = o->unused ? NPARAM + 1 : NPARAM, p, st, i, j, micro, nmicro = o->accumulate ? 2 : 1;
    float unused_w[4] = {1, 2, 3, 4};
    capex_result r;
    uint64_t idx[B];
    comm_make(&c, o->timeout > 0 ? o->timeout : 30.0);
    init_model(&m, g_rank);
    if (o->bf16) { /* f32 master weights, bf16 grads: broadcast the masters ourselves */
        r = capex_comm_broadcast(&c, m.w, D + 1, CAPEX_F32, 0);
        CHECK(r == CAPEX_OK, "broadcast: %.300s", capex_last_error());
    }
    for (p = 0; p < NPARAM; p++) {
        ps[p].data = param_ptr(&m, p); ps[p].numel = p_numel[p];
        ps[p].dtype = o->bf16 ? CAPEX_BF16 : CAPEX_F32; ps[p].grad = NULL;
    }
    if (o->unused) { ps[NPARAM].data = unused_w; ps[NPARAM].numel = 4; ps[NPARAM].dtype = CAPEX_F32; ps[NPARAM].grad = NULL; }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = 32; d.bucket_bytes = 64; /* -> buckets {5,4,3} {2,1} {0} for f32 */
    d.delay_allreduce = o->delay;
    d.gradient_predivide_factor = o->predivide > 0 ? o->predivide : 1.0f;
    d.allreduce_always_fp32 = o->bf16;
    d.broadcast_parameters = !o->bf16;
    d.find_unused_parameters = o->unused == 2;
    d.rebuild_buckets = o->rebuild;
    r = capex_ddp_create(&g, &c, ps, (size_t)np, &d);
    CHECK(r == CAPEX_OK, "create: %.300s", capex_last_error());
    if (o->unused) CHECK(unused_w[0] == 1 && unused_w[3] == 4, "unused param broadcast");
    if (!o->bf16) { /* a "checkpoint" loaded on rank 0 only, then re-broadcast */
        float keep = m.w[3];
        if (g_rank == 0) m.w[3] = 0.25f;
        r = capex_ddp_broadcast_parameters(g);
        CHECK(r == CAPEX_OK && m.w[3] == 0.25f, "re-broadcast: %.300s", capex_last_error());
        m.w[3] = keep;
        CHECK(identical(m.w, (int)sizeof m.w), "params after create differ across ranks");
    }
    *bucket_order_ok = 1;
    for (st = 0; st < steps; st++) {
        int per_epoch = NS / g_world / B;
        float err[B];
        model before = m;
        batch_of(g_rank, g_world, st / per_epoch, st % per_epoch, idx);
        for (i = 0; i < B; i++) {
            double e = m.w[D] - Y[idx[i]];
            for (j = 0; j < D; j++) e += (double)m.w[j] * X[idx[i]][j];
            err[i] = (float)e;
        }
        rec_n = 0;
        for (micro = 0; micro < nmicro; micro++) {
            int lo = micro * B / nmicro, hi = (micro + 1) * B / nmicro;
            if (o->accumulate) {
                r = capex_ddp_set_sync(g, micro == nmicro - 1);
                CHECK(r == CAPEX_OK, "set_sync: %.300s", capex_last_error());
            }
            /* backward: bias first, then the weight slices in reverse (the
               rebuild variant reports them in forward order instead) */
            for (p = NPARAM; p-- > 0;) {
                int q = o->rebuild ? (p == NPARAM - 1 ? NPARAM - 1 : NPARAM - 2 - p) : p;
                void *gv = capex_ddp_grad(g, (size_t)q);
                size_t k;
                if (st == o->kill_at && g_rank == 1 && p == NPARAM - 3) { fflush(stdout); raise(SIGKILL); }
                if (st == o->stall_at && g_rank == 1 && p == NPARAM - 1) STALL_HOLD();
                for (k = 0; k < p_numel[q]; k++) {
                    float acc = 0;
                    for (i = lo; i < hi; i++) acc += err[i] * (q == NPARAM - 1 ? 1.0f : X[idx[i]][p_off[q] + k]);
                    acc /= (float)B;
                    if (o->bf16) ((uint16_t *)gv)[k] = capex_f32_to_bf16(capex_bf16_to_f32(((uint16_t *)gv)[k]) + acc);
                    else ((float *)gv)[k] += acc;
                }
                r = capex_ddp_grad_ready(g, (size_t)q);
                CHECK(r == CAPEX_OK, "grad_ready: %.300s", capex_last_error());
            }
            if (o->unused == 1) {
                r = capex_ddp_mark_unused(g, NPARAM);
                CHECK(r == CAPEX_OK, "mark_unused: %.300s", capex_last_error());
            }
            r = capex_ddp_finalize(g);
            if (r != CAPEX_OK) {
                /* the failure path: report, and prove no step was applied */
                printf("rank %d: step %d finalize -> %s: %.200s; weights %s\n", g_rank, st, capex_result_string(r),
                       capex_last_error(), memcmp(&before, &m, sizeof m) == 0 ? "untouched (no step applied)" : "CHANGED");
                fflush(stdout);
                exit(3);
            }
        }
        /* launches during this step, in bucket order (first param of bucket k at offset 0) */
        if (!o->delay) {
            size_t k, nb = capex_ddp_num_buckets(g);
            if ((size_t)rec_n != nb) *bucket_order_ok = 0;
            for (k = 0; k < nb && k < (size_t)rec_n; k++) {
                capex_ddp_bucket_info bi;
                capex_ddp_bucket(g, k, &bi);
                if (!o->bf16 && rec_bufs[k] != capex_ddp_grad(g, bi.params[0])) *bucket_order_ok = 0;
            }
        }
        for (p = 0; p < NPARAM; p++) {
            void *gv = capex_ddp_grad(g, (size_t)p);
            float *w = param_ptr(&m, p);
            size_t k;
            for (k = 0; k < p_numel[p]; k++)
                w[k] -= lr * (o->bf16 ? capex_bf16_to_f32(((uint16_t *)gv)[k]) : ((float *)gv)[k]);
        }
        if (o->unused) {
            float *gu = (float *)capex_ddp_grad(g, NPARAM);
            CHECK(gu[0] == 0 && gu[3] == 0, "unused grad must be zero, got %g", (double)gu[0]);
        }
        r = capex_ddp_zero_grad(g);
        CHECK(r == CAPEX_OK, "zero_grad");
    }
    capex_ddp_get_stats(g, stats);
    g_layout = capex_ddp_layout_version(g);
    capex_ddp_destroy(g);
    capex_comm_destroy(&c);
    *out = m;
    return 0;
}

/* all ranks hold the same bytes? */
static int identical(const void *buf, int bytes) {
    char *all = (char *)malloc((size_t)bytes * (size_t)g_world);
    int r, same = 1;
    MPI_Allgather(buf, bytes, MPI_BYTE, all, bytes, MPI_BYTE, MPI_COMM_WORLD);
    for (r = 1; r < g_world; r++) if (memcmp(all, all + (size_t)r * (size_t)bytes, (size_t)bytes) != 0) same = 0;
    free(all);
    return same;
}

static int check_training(const opts *o, double tol, int expect_in_backward) {
    model m;
    capex_ddp_stats s;
    double ref[D + 1], maxerr = 0;
    int j, steps = 12, order_ok = 0;
    float lr = 0.2f;
    if (train(o, steps, lr, &m, &s, &order_ok)) return 1;
    reference(ref, g_world, steps, lr, 0);
    for (j = 0; j <= D; j++) {
        double e = fabs((double)m.w[j] - ref[j]) / (1.0 + fabs(ref[j]));
        if (e > maxerr) maxerr = e;
    }
    CHECK(identical(m.w, (int)sizeof m.w), "replicas differ bitwise");
    CHECK(maxerr <= tol, "max relative error vs the one-process reference %.3g > %.3g", maxerr, tol);
    CHECK(s.iterations == (uint64_t)steps, "iterations %llu", (unsigned long long)s.iterations);
    if (expect_in_backward == -2) { /* rebuild: the layout changed once, launches still overlap */
        CHECK(g_layout == 1, "layout version %d after the rebuild", g_layout);
        CHECK(s.launched_in_backward > 0, "no overlap after the rebuild");
    } else if (expect_in_backward >= 0) {
        CHECK(order_ok, "bucket launches out of order or missing");
        CHECK(!expect_in_backward || s.progress_polls > 0, "in-flight buckets were never polled during backward");
        CHECK(expect_in_backward ? s.launched_in_backward == s.launches : s.launched_in_backward == 0,
              "launched in backward %llu of %llu", (unsigned long long)s.launched_in_backward, (unsigned long long)s.launches);
    } else {
        CHECK(s.launched_in_backward == 0, "delay_allreduce launched %llu in backward", (unsigned long long)s.launched_in_backward);
    }
    if (g_rank == 0) printf("    max rel. error vs 1-process f64 reference: %.3g\n", maxerr);
    return 0;
}

/* ---- tests ---- */
static int t_collectives(void) {
    capex_comm c;
    float f[5], gbuf[64];
    uint16_t h[3], bh[3];
    int i, root = g_world - 1;
    double S = g_world * (g_world + 1) / 2.0;
    comm_make(&c, 20);
    for (i = 0; i < 5; i++) f[i] = (float)((g_rank + 1) * (i + 1));
    CHECK(capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 5; i++) CHECK(f[i] == (float)(S * (i + 1)), "f32 sum");
    for (i = 0; i < 3; i++) { h[i] = capex_f32_to_f16((float)(g_rank + 1) * 0.5f); bh[i] = capex_f32_to_bf16((float)(g_rank + 1)); }
    CHECK(capex_comm_allreduce(&c, h, h, 3, CAPEX_F16, CAPEX_REDUCE_AVG) == CAPEX_OK, "%.300s", capex_last_error());
    CHECK(capex_f16_to_f32(h[2]) == (float)(S * 0.5 / g_world), "f16 avg %g", (double)capex_f16_to_f32(h[2]));
    CHECK(capex_comm_allreduce(&c, bh, bh, 3, CAPEX_BF16, CAPEX_REDUCE_SUM) == CAPEX_OK, "%.300s", capex_last_error());
    CHECK(capex_bf16_to_f32(bh[0]) == (float)S, "bf16 sum");
    for (i = 0; i < 5; i++) f[i] = g_rank == root ? 42.0f + (float)i : -1.0f;
    CHECK(capex_comm_broadcast(&c, f, 5, CAPEX_F32, root) == CAPEX_OK, "%.300s", capex_last_error());
    CHECK(f[0] == 42.0f && f[4] == 46.0f, "broadcast from the last rank");
    for (i = 0; i < 3; i++) f[i] = (float)(g_rank * 10 + i);
    CHECK(capex_comm_allgather(&c, f, gbuf, 3, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 3 * g_world; i++) CHECK(gbuf[i] == (float)((i / 3) * 10 + i % 3), "allgather slot %d", i);
    CHECK(capex_comm_barrier(&c) == CAPEX_OK, "%.300s", capex_last_error());
    CHECK(capex_comm_broadcast(&c, f, 5, CAPEX_F32, g_world) == CAPEX_ERR_INVALID_ARG, "root out of range");
    { /* mpirun's environment read back, and the auto backend picks MPI */
        capex_dist_env env;
        capex_comm a;
        CHECK(capex_dist_env_read(NULL, &env) == CAPEX_OK, "%.300s", capex_last_error());
        CHECK(env.launcher == CAPEX_LAUNCHER_OPENMPI && env.rank == g_rank && env.world_size == g_world,
              "env: %s rank %d of %d", capex_launcher_name(env.launcher), env.rank, env.world_size);
        CHECK(env.local_world_size == g_world && env.local_rank == g_rank, "local ranks");
        CHECK(capex_comm_init_auto(&a, &env) == CAPEX_OK && strcmp(a.vt->name, "mpi") == 0, "auto -> mpi");
        capex_comm_destroy(&a);
    }
    { /* the NCCL-id bootstrap path over MPI: 128 bytes (and an odd size) */
        unsigned char id[131];
        for (i = 0; i < 131; i++) id[i] = (unsigned char)(g_rank == 0 ? i * 3 + 1 : 0);
        CHECK(capex_dist_broadcast_blob(NULL, &c, id, 131, 5.0) == CAPEX_OK, "%.300s", capex_last_error());
        for (i = 0; i < 131; i++) CHECK(id[i] == (unsigned char)(i * 3 + 1), "blob byte %d", i);
    }
    capex_comm_destroy(&c);
    return 0;
}

static int t_train_overlap(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; return check_training(&o, 2e-5, 1); }
static int t_train_delay(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.delay = 1; return check_training(&o, 2e-5, -1); }
static int t_train_predivide(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.predivide = 4.0f; return check_training(&o, 2e-5, 1); }
static int t_train_no_sync(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.accumulate = 1; return check_training(&o, 2e-5, 1); }
static int t_train_unused_marked(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.unused = 1; return check_training(&o, 2e-5, 1); }
static int t_train_unused_found(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.unused = 2; return check_training(&o, 2e-5, 0); }
static int t_train_bf16_fp32_reduce(void) { opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.bf16 = 1; return check_training(&o, 2e-2, 1); }
static int t_train_rebuild(void) {
    opts o; memset(&o, 0, sizeof o); o.kill_at = o.stall_at = -1; o.rebuild = 1;
    return check_training(&o, 2e-5, -2 /* order changes after the rebuild: checked below */);
}

static int t_sampler_shards(void) {
    capex_sampler_desc sd;
    capex_sampler s;
    unsigned char mine[1003], all[1003];
    uint64_t k, v;
    int i;
    capex_sampler_desc_init(&sd);
    sd.dataset_size = 1003; sd.num_replicas = g_world; sd.rank = g_rank; sd.seed = 5; sd.drop_last = 1;
    CHECK(capex_sampler_init(&s, &sd) == CAPEX_OK, "%.300s", capex_last_error());
    capex_sampler_set_epoch(&s, 2);
    memset(mine, 0, sizeof mine);
    for (k = 0; k < s.num_samples; k++) { capex_sampler_index(&s, k, &v); mine[v]++; }
    MPI_Allreduce(mine, all, 1003, MPI_UNSIGNED_CHAR, MPI_SUM, MPI_COMM_WORLD);
    for (i = 0, k = 0; i < 1003; i++) { CHECK(all[i] <= 1, "index %d on two ranks", i); k += all[i]; }
    CHECK(k == (1003 / (uint64_t)g_world) * (uint64_t)g_world, "drop_last total %llu", (unsigned long long)k);
    sd.drop_last = 0;
    capex_sampler_init(&s, &sd);
    capex_sampler_set_epoch(&s, 2);
    memset(mine, 0, sizeof mine);
    for (k = 0; k < s.num_samples; k++) { capex_sampler_index(&s, k, &v); mine[v] = 1; }
    MPI_Allreduce(mine, all, 1003, MPI_UNSIGNED_CHAR, MPI_SUM, MPI_COMM_WORLD);
    for (i = 0; i < 1003; i++) CHECK(all[i] >= 1, "index %d on no rank", i);
    return 0;
}

/* Uneven reduce-scatter and allgatherv over MPI against float64
   (tests/dist_shards.h), then MPI's int-count limit refused alike. */
static int t_shards(void) {
    capex_comm c;
    char why[400] = "";
    int line;
    size_t big[64], p;
    float x[4];
    comm_make(&c, 30.0);
    c.vt = orig_vt;
    line = shards_check_all(&c, 4242, why, sizeof why);
    CHECK(line == 0, "dist_shards.h:%d: %s", line, why);
    line = shards_allreduce_check(&c, 4343, 100003, why, sizeof why); /* float64 reference, same bits on every rank */
    CHECK(line == 0, "dist_shards.h:%d: %s", line, why);
    for (p = 0; p < (size_t)g_world; p++) big[p] = p == 0 ? (size_t)INT_MAX : 1; /* the sum passes INT_MAX */
    CHECK(capex_comm_reduce_scatter(&c, x, x, big, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_LIMIT, "RS over INT_MAX: %.300s",
          capex_last_error());
    CHECK(capex_comm_allgatherv(&c, x, x, big, CAPEX_F32) == CAPEX_ERR_LIMIT, "AGV over INT_MAX: %.300s", capex_last_error());
    capex_comm_destroy(&c);
    return 0;
}

/* The front-ends allow send == recv: for the gathers that is not MPI's
   in-place slot (recv + rank's displacement) on ranks > 0, and handing MPI
   the aliased buffers silently gathered garbage (np 2). Also send at another
   rank's slot, for allgather, allgatherv and the nonblocking allgather. */
static int t_gather_aliased(void) {
    static const size_t ns[3] = {4, 1000, 100000};
    capex_comm c;
    size_t counts[64], total, displ, i, k;
    int p, shift;
    float *g;
    comm_make(&c, 30.0);
    c.vt = orig_vt;
    for (k = 0; k < 3; k++)
        for (shift = 0; shift < 2; shift++) {
            size_t n = ns[k], me = shift ? (size_t)((g_rank + 1) % g_world) * n : 0; /* where send sits in recv */
            capex_comm_req q;
            capex_result r;
            int mode;
            g = (float *)malloc(n * (size_t)g_world * sizeof(float));
            if (!g) { fprintf(stderr, "oom\n"); exit(2); }
            for (mode = 0; mode < 2; mode++) {
                for (i = 0; i < n * (size_t)g_world; i++) g[i] = -1.0f;
                for (i = 0; i < n; i++) g[me + i] = (float)(g_rank * 1000003 + (int)i);
                if (mode == 0) r = capex_comm_allgather(&c, g + me, g, n, CAPEX_F32);
                else if ((r = c.vt->iallgather(&c, g + me, g, n, CAPEX_F32, &q)) == CAPEX_OK)
                    r = c.vt->wait(&c, &q, capex_dist_now() + 30.0);
                NOTE(r == CAPEX_OK, "%s n %zu: %.300s", mode ? "iallgather" : "allgather", n, capex_last_error());
                for (i = 0; i < n * (size_t)g_world; i++)
                    NOTE(g[i] == (float)((int)(i / n) * 1000003 + (int)(i % n)), "%s n %zu send at %zu: element %zu is %g",
                          mode ? "iallgather" : "allgather", n, me, i, (double)g[i]);
            }
            /* uneven: odd ranks give one element fewer (send at recv's start or at the next rank's slot) */
            for (p = 0, total = 0, displ = 0; p < g_world; p++) {
                counts[p] = n - (size_t)p % 2;
                if (p == (shift ? (g_rank + 1) % g_world : 0)) displ = total;
                total += counts[p];
            }
            for (i = 0; i < total; i++) g[i] = -1.0f;
            for (i = 0; i < counts[g_rank]; i++) g[displ + i] = (float)(g_rank * 1000003 + (int)i);
            NOTE(capex_comm_allgatherv(&c, g + displ, g, counts, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
            for (p = 0, total = 0; p < g_world; total += counts[p], p++)
                for (i = 0; i < counts[p]; i++)
                    NOTE(g[total + i] == (float)(p * 1000003 + (int)i), "allgatherv n %zu send at %zu: rank %d's element %zu is %g",
                          n, displ, p, i, (double)g[total + i]);
            free(g);
        }
    capex_comm_destroy(&c);
    return g_why[0] != '\0';
}

/* capex_comm_init_mpi on a communicator it cannot use returns an error,
   the comm left zeroed: MPI_COMM_NULL (what MPI_Comm_split gives a rank
   with MPI_UNDEFINED) made MPI's default handler abort the job, and an
   intercommunicator was taken (rank and size of the local group, but its
   allreduce is the remote group's sum; Open MPI then aborted on MPI_IN_PLACE). */
static int t_init_bad_comm(void) {
    capex_comm c;
    memset(&c, 0xA5, sizeof c);
    CHECK(capex_comm_init_mpi(&c, MPI_COMM_NULL) == CAPEX_ERR_INVALID_ARG, "MPI_COMM_NULL: %.300s", capex_last_error());
    CHECK(strstr(capex_last_error(), "MPI_COMM_NULL") != NULL, "message: %.300s", capex_last_error());
    CHECK(c.vt == NULL && c.impl == NULL, "comm not zeroed");
    capex_comm_destroy(&c); /* harmless on the zeroed comm */
    if (g_world >= 2) { /* an intercommunicator: its collectives reduce the other group's data */
        MPI_Comm half, inter;
        capex_result r;
        MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, g_rank % 2 ? 0 : 1, 77, &inter);
        r = capex_comm_init_mpi(&c, inter);
        if (r == CAPEX_OK) capex_comm_destroy(&c);
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
        CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "intercommunicator"), "intercommunicator: %s: %.300s",
              capex_result_string(r), r ? capex_last_error() : "");
    }
    return 0;
}

/* Ranks that disagree on a blocking collective all get CAPEX_ERR_COMM
   (as over TCP) instead of some returning CAPEX_OK and the rest waiting in
   MPI's blocking call with no deadline: rank 0 passing 0 elements (the
   front-ends make that a barrier, which paired with the others' arrival
   barrier), other counts, another dtype, another broadcast root, other
   reduce-scatter counts; rank 0 refusing its call (a NULL buffer only it
   passes: its refusal stands in a barrier, so the others fail at once
   instead of at their deadline; rank 0 makes no other call until they have
   returned), or failing to start it (no memory for its f16 staging).
   One fresh comm per case: a failed one stays failed. */
static void *mm_no_alloc(size_t size, void *user) { (void)size; (void)user; return NULL; }
static void mm_no_free(void *p, void *user) { (void)p; (void)user; }
static int t_mismatch(void) {
    static const char *what[8] = {"allreduce count 0", "allreduce 5 vs 4", "allreduce f16 vs f32", "broadcast root",
                                  "reduce-scatter counts", "allgatherv counts", "NULL buffer on rank 0 only",
                                  "no memory for f16 staging on rank 0 only"};
    static const capex_allocator no_mem = {mm_no_alloc, mm_no_free, NULL};
    float x[64] = {0}, y[64];
    size_t counts[64];
    int k, p;
    for (k = 0; k < 8; k++) {
        capex_comm c;
        capex_result r;
        comm_make(&c, 20.0);
        c.vt = orig_vt;
        for (p = 0; p < g_world; p++) counts[p] = p == 0 && g_rank == 0 ? 2 : 1;
        if (k == 7 && g_rank == 0) c.allocator = &no_mem;
        r = k == 0 ? capex_comm_allreduce(&c, x, x, g_rank == 0 ? 0 : 4, CAPEX_F32, CAPEX_REDUCE_SUM)
          : k == 1 ? capex_comm_allreduce(&c, x, x, g_rank == 0 ? 5 : 4, CAPEX_F32, CAPEX_REDUCE_SUM)
          : k == 2 ? capex_comm_allreduce(&c, x, x, 4, g_rank == 0 ? CAPEX_F16 : CAPEX_F32, CAPEX_REDUCE_SUM)
          : k == 3 ? capex_comm_broadcast(&c, x, 4, CAPEX_F32, g_rank == 0 ? 0 : 1)
          : k == 4 ? capex_comm_reduce_scatter(&c, x, y, counts, CAPEX_F32, CAPEX_REDUCE_SUM)
          : k == 5 ? capex_comm_allgatherv(&c, x, y, counts, CAPEX_F32)
          : k == 6 ? capex_comm_allreduce(&c, x, g_rank == 0 ? NULL : y, 4, CAPEX_F32, CAPEX_REDUCE_SUM)
                   : capex_comm_allreduce(&c, x, x, 4, CAPEX_F16, CAPEX_REDUCE_SUM);
        if (k >= 6) {
            MPI_Barrier(MPI_COMM_WORLD); /* not the comm's: rank 0's first call after the refusal */
            if (g_rank == 0)
                NOTE(r == (k == 6 ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_OUT_OF_MEMORY), "%s: rank 0 got %s", what[k],
                     capex_result_string(r));
            c.allocator = NULL;
        }
        if (k < 6 || g_rank != 0)
            NOTE(r == CAPEX_ERR_COMM && strstr(capex_last_error(), "different"), "%s: %s: %.300s", what[k],
                 capex_result_string(r), r ? capex_last_error() : "");
        NOTE(capex_comm_barrier(&c) == CAPEX_ERR_COMM, "%s: the comm must stay failed", what[k]);
        capex_comm_destroy(&c);
    }
    return g_why[0] != '\0';
}

/* Ranks passing different models or descriptors to capex_ddp_create /
   capex_zero_create (the last rank is the odd one): every rank fails at create
   with the same status (before the model check: MPI hung or failed in the
   parameter broadcast, or ranks went on with different buckets), and the comm
   stays usable. */
static int t_model_mismatch(void) {
    static const char *what[4] = {"param count", "bucket_bytes", "ZeRO dtype", "a refusing rank"};
    float w[2][8], s;
    int k, i, odd = g_rank == g_world - 1;
    for (k = 0; k < 4; k++) {
        capex_comm c;
        capex_ddp_param ps[2];
        capex_ddp_desc d;
        capex_ddp *g = NULL;
        capex_zero_param zp[2];
        capex_zero_desc zd;
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r, want = k == 1 ? CAPEX_ERR_CONFIG : k == 3 ? (odd ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_COMM)
                                                                  : CAPEX_ERR_SIZE_MISMATCH;
        comm_make(&c, 30.0);
        c.vt = orig_vt;
        for (i = 0; i < 2; i++) {
            ps[i].data = zp[i].data = w[i]; ps[i].numel = zp[i].numel = 8; ps[i].dtype = zp[i].dtype = CAPEX_F32;
            ps[i].grad = NULL; zp[i].group = 0;
        }
        capex_ddp_desc_init(&d);
        capex_zero_desc_init(&zd);
        capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
        if (odd && k == 1) d.bucket_bytes = 64;
        if (odd && k == 2) zp[1].dtype = CAPEX_F16;
        if (odd && k == 3) ps[0].dtype = (capex_dtype)7;
        r = k == 2 ? capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, &zd) : capex_ddp_create(&g, &c, ps, odd && k == 0 ? 1 : 2, &d);
        NOTE(r == want && !g && !z, "%s: %s: %.300s", what[k], capex_result_string(r), capex_last_error());
        NOTE(k == 3 || strstr(capex_last_error(), k == 1 ? "bucket_bytes" : "ranks hold different models"), "%s: %.300s",
             what[k], capex_last_error());
        s = 1.0f;
        NOTE(capex_comm_allreduce(&c, &s, &s, 1, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK && s == (float)g_world,
             "%s: the comm must stay usable: %.300s", what[k], capex_last_error());
        capex_ddp_destroy(g);
        capex_zero_destroy(z);
        capex_comm_destroy(&c);
    }
    return g_why[0] != '\0';
}

/* The sharded optimizer (ZeRO stage 1 and 2) bit for bit against DDP +
   capex_optim over MPI (tests/zero_check.h). */
static int t_zero(void) {
    capex_comm c;
    char why[400] = "";
    int line;
    comm_make(&c, 30.0);
    c.vt = orig_vt;
    char path[128];
    int pid = (int)getpid();
    line = zero_check_all(&c, why, sizeof why);
    /* a checkpoint saved by this world, loaded by it (the file is rank 0's) */
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "/tmp/capex_test_zero_mpi_%d.safetensors", pid);
    if (!line) line = zero_check_ckpt(&c, 2, CAPEX_OPTIM_ADAM, NULL, path, why, sizeof why);
    MPI_Barrier(MPI_COMM_WORLD);
    if (!line) line = zero_check_ckpt(&c, 1, CAPEX_OPTIM_ADAM, path, NULL, why, sizeof why);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) remove(path);
    capex_comm_destroy(&c);
    CHECK(line == 0, "zero_check.h:%d: %s", line, why);
    return 0;
}

typedef struct tcase { const char *name; int (*fn)(void); } tcase;

/* The blocking collectives call MPI's blocking ones once every rank has
   arrived: a rank that never arrives must still give CAPEX_ERR_TIMEOUT. */
static int run_stall_blocking(void) {
    capex_comm c[5];
    float x[64] = {0}, all[64 * 4];
    size_t counts[4] = {16, 16, 16, 16};
    const char *what[5] = {"allreduce", "broadcast", "allgather", "reduce-scatter", "allgatherv"};
    int k;
    for (k = 0; k < 5; k++) {
        if (capex_comm_init_mpi(&c[k], MPI_COMM_WORLD) != CAPEX_OK) { printf("init: %s\n", capex_last_error()); exit(2); }
        c[k].timeout_s = 2.0;
    }
    if (g_rank == 1) STALL_HOLD();
    for (k = 0; k < 5; k++) {
        double t0 = capex_dist_now();
        capex_result r = k == 0 ? capex_comm_allreduce(&c[k], x, x, 64, CAPEX_F32, CAPEX_REDUCE_SUM)
                       : k == 1 ? capex_comm_broadcast(&c[k], x, 64, CAPEX_F32, 0)
                       : k == 2 ? capex_comm_allgather(&c[k], x, all, 64, CAPEX_F32)
                       : k == 3 ? capex_comm_reduce_scatter(&c[k], x, all, counts, CAPEX_F32, CAPEX_REDUCE_SUM)
                                : capex_comm_allgatherv(&c[k], x, all, counts, CAPEX_F32);
        printf("rank %d: blocking %s -> %s after %.1f s\n", g_rank, what[k], capex_result_string(r), capex_dist_now() - t0);
        fflush(stdout);
    }
    exit(4);
}

/* `late` (np 2): rank 0's DDP bucket allreduce and ZeRO parameter
   all-gather (step_async) time out (rank 1 is late) and rank 0 destroys the
   DDP and the ZeRO; MPI cannot cancel a collective, so when rank 1 turns up
   both still land in rank 0's buffers. The comms' allocator here poisons
   what it is handed back instead of freeing it, and what rank 0 handed back
   must not change afterwards (else a write into freed heap memory). Rank 0
   prints "freed buffers intact" or "FREED BUFFER WRITTEN". */
#define LATE_N 4096
static unsigned char *late_freed[64];
static size_t late_size[64];
static int late_nfreed;
static void *late_alloc(size_t n, void *u) {
    size_t *p = (size_t *)malloc(n + sizeof(size_t));
    (void)u;
    if (!p) return NULL;
    *p = n;
    return p + 1;
}
static void late_free(void *q, void *u) {
    size_t *p = (size_t *)q - 1;
    (void)u;
    memset(q, 0x5A, *p); /* kept, poisoned */
    if (late_nfreed < 64) { late_freed[late_nfreed] = (unsigned char *)q; late_size[late_nfreed++] = *p; }
}
static int run_late(void) {
    static float w[LATE_N], zw[LATE_N];
    static capex_allocator al = {late_alloc, late_free, NULL};
    capex_comm c, zc;
    capex_ddp *g = NULL;
    capex_ddp_param ps[1];
    capex_ddp_desc d;
    capex_zero *z = NULL;
    capex_zero_param zp[1];
    capex_zero_desc zd;
    capex_optim_desc od;
    capex_result r;
    float *gr;
    int i, bad = 0, tag = (int)getpid();
    size_t k;
    char mark[64];
    FILE *f;
    /* rank 1 is late until rank 0 has timed out twice (a file rank 0 makes),
       not for a fixed time a loaded machine could use up first */
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(mark, sizeof mark, "/tmp/capex_mpi_late_%d", tag);
    comm_make(&c, 30.0);
    c.allocator = &al;
    comm_make(&zc, 30.0);
    zc.vt = orig_vt;
    zc.allocator = &al;
    ps[0].data = w; ps[0].numel = LATE_N; ps[0].dtype = CAPEX_F32; ps[0].grad = NULL;
    capex_ddp_desc_init(&d);
    zp[0].data = zw; zp[0].numel = LATE_N; zp[0].dtype = CAPEX_F32; zp[0].group = 0;
    capex_zero_desc_init(&zd);
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    if (capex_ddp_create(&g, &c, ps, 1, &d) != CAPEX_OK || capex_zero_create(&z, &zc, zp, 1, &od, NULL, 1, &zd) != CAPEX_OK) {
        printf("create: %s\n", capex_last_error());
        return 2;
    }
    gr = (float *)capex_zero_grad(z, 0); /* a ZeRO step needs reduced grads: both ranks here */
    for (i = 0; i < LATE_N; i++) gr[i] = 1.0f;
    r = capex_zero_grad_ready(z, 0);
    if (r == CAPEX_OK) r = capex_zero_finalize(z);
    if (r != CAPEX_OK) { printf("rank %d: zero finalize: %s\n", g_rank, capex_last_error()); return 2; }
    if (g_rank == 1) for (i = 0; i < 12000 && access(mark, F_OK) != 0; i++) capex__sleep_s(0.01); /* 120 s: a hang guard */
    else c.timeout_s = zc.timeout_s = 0.5;
    gr = (float *)capex_ddp_grad(g, 0);
    for (i = 0; i < LATE_N; i++) gr[i] = 1.0f;
    r = capex_ddp_grad_ready(g, 0);
    if (r == CAPEX_OK) r = capex_ddp_finalize(g);
    printf("rank %d: finalize -> %s (%.200s)\n", g_rank, capex_result_string(r), r ? capex_last_error() : "");
    r = capex_zero_step_async(z, 1.0f, 1.0f, 0);
    if (r == CAPEX_OK) r = capex_zero_wait_params(z);
    printf("rank %d: wait_params -> %s (%.200s)\n", g_rank, capex_result_string(r), r ? capex_last_error() : "");
    if (g_rank == 0 && (f = fopen(mark, "w")) != NULL) fclose(f);
    capex_ddp_destroy(g);
    capex_zero_destroy(z);
    MPI_Barrier(MPI_COMM_WORLD); /* progresses rank 0's abandoned collectives once rank 1 joins them */
    if (g_rank == 0) remove(mark);
    for (k = 0; g_rank == 0 && k < (size_t)late_nfreed; k++)
        for (i = 0; i < (int)late_size[k]; i++) bad |= late_freed[k][i] != 0x5A;
    if (g_rank == 0) printf("rank 0: %s (%d buffers handed back)\n", bad ? "FREED BUFFER WRITTEN" : "freed buffers intact", late_nfreed);
    fflush(stdout);
    capex_comm_destroy(&c);
    capex_comm_destroy(&zc);
    MPI_Finalize();
    return 0;
}

/* `after_finalize`: a comm used after MPI_Finalize returns CAPEX_ERR_ORDER
   (MPI aborts the process on any call but a few after finalize). Prints
   "rank R: after finalize: ..." for each call. */
static int run_after_finalize(void) {
    capex_comm c;
    capex_comm_req q;
    float x[4] = {1, 2, 3, 4}, all[64];
    size_t counts[64];
    int p, done = 0;
    capex_result r[5];
    for (p = 0; p < g_world; p++) counts[p] = 1;
    comm_make(&c, 30.0);
    c.vt = orig_vt;
    MPI_Finalize();
    r[0] = capex_comm_allreduce(&c, x, x, 4, CAPEX_F32, CAPEX_REDUCE_SUM);
    r[1] = capex_comm_barrier(&c);
    r[2] = capex_comm_allgatherv(&c, x, all, counts, CAPEX_F32);
    r[3] = c.vt->iallreduce(&c, x, x, 4, CAPEX_F32, CAPEX_REDUCE_SUM, &q);
    memset(&q, 0, sizeof q);
    q.active = 1; /* as a bucket launched before MPI_Finalize */
    r[4] = c.vt->test(&c, &q, &done);
    if (r[4] == CAPEX_ERR_ORDER) r[4] = c.vt->wait(&c, &q, capex_dist_now() + 1.0);
    printf("rank %d: after finalize: %s %s %s %s %s: %s\n", g_rank, capex_result_string(r[0]), capex_result_string(r[1]),
           capex_result_string(r[2]), capex_result_string(r[3]), capex_result_string(r[4]), capex_last_error());
    fflush(stdout);
    capex_comm_destroy(&c);
    return 0;
}

/* Every rank reports the grads in its own order (rank r starts r * 3 + step
   params further on), leaves a different param out of each synced
   micro-step (find_unused), accumulates one no_sync micro-step first, over
   mixed dtypes (f32, bf16, f16, an empty param); with and without rebuild
   (rank 0's order) and allreduce_always_fp32: buckets still launch in the
   same order on every rank (MPI pairs collectives by order) and every grad
   is the average of what the ranks gave (small integers: exact). */
#define ONP 7
static int t_rank_orders(void) {
    static const size_t numel[ONP] = {5, 0, 9, 3, 40, 1, 7};
    static const capex_dtype dt[ONP] = {CAPEX_F32, CAPEX_F32, CAPEX_BF16, CAPEX_F16, CAPEX_F32, CAPEX_BF16, CAPEX_F16};
    int mode;
    for (mode = 0; mode < 4; mode++) {
        capex_comm c;
        capex_ddp *g = NULL;
        capex_ddp_param ps[ONP];
        capex_ddp_desc d;
        float data[ONP][64];
        int step, q, micro;
        size_t p, i;
        capex_result r;
        comm_make(&c, 30.0);
        for (p = 0; p < ONP; p++) {
            ps[p].data = data[p]; ps[p].numel = numel[p]; ps[p].dtype = dt[p]; ps[p].grad = NULL;
            memset(data[p], 0, sizeof data[p]);
        }
        capex_ddp_desc_init(&d);
        d.first_bucket_bytes = 16; d.bucket_bytes = 40;
        d.find_unused_parameters = 1;
        d.rebuild_buckets = mode & 1;
        d.allreduce_always_fp32 = (mode >> 1) & 1;
        d.gradient_predivide_factor = 2.0f;
        r = capex_ddp_create(&g, &c, ps, ONP, &d);
        CHECK(r == CAPEX_OK, "create: %.300s", capex_last_error());
        for (step = 0; step < 4; step++) {
            for (micro = 0; micro < 2; micro++) {
                r = capex_ddp_set_sync(g, micro == 1);
                CHECK(r == CAPEX_OK, "set_sync: %.300s", capex_last_error());
                for (q = 0; q < ONP; q++) {
                    void *gv;
                    p = (size_t)((q + g_rank * 3 + step) % ONP);
                    if ((int)p == (g_rank + step) % ONP && micro == 1) continue;
                    gv = capex_ddp_grad(g, p);
                    for (i = 0; i < numel[p]; i++)
                        capex__store(gv, dt[p], i, capex__load(gv, dt[p], i) + (float)((g_rank + 1) * (int)(p + 1) + (int)i + micro));
                    r = capex_ddp_grad_ready(g, p);
                    CHECK(r == CAPEX_OK, "grad_ready: %.300s", capex_last_error());
                }
                r = capex_ddp_finalize(g);
                CHECK(r == CAPEX_OK, "mode %d step %d finalize: %.300s", mode, step, capex_last_error());
            }
            for (p = 0; p < ONP; p++) {
                void *gv = capex_ddp_grad(g, p);
                for (i = 0; i < numel[p]; i++) {
                    double want = 0;
                    int k;
                    for (k = 0; k < g_world; k++) {
                        want += (double)((k + 1) * (int)(p + 1) + (int)i);
                        if ((int)p != (k + step) % ONP) want += (double)((k + 1) * (int)(p + 1) + (int)i + 1);
                    }
                    want /= g_world;
                    CHECK(fabs(capex__load(gv, dt[p], i) - want) <= 0.02 * want, "mode %d step %d param %d [%d]: %g, want %g",
                          mode, step, (int)p, (int)i, (double)capex__load(gv, dt[p], i), want);
                }
            }
            r = capex_ddp_zero_grad(g);
            CHECK(r == CAPEX_OK, "zero_grad: %.300s", capex_last_error());
        }
        CHECK(capex_ddp_layout_version(g) == (mode & 1), "layout version %d", capex_ddp_layout_version(g));
        capex_ddp_destroy(g);
        capex_comm_destroy(&c);
    }
    return 0;
}

/* A rank's bucket launch must not fail locally before the collective: its
   peers would wait in that allreduce until their deadline (MPI pairs
   collectives by order, no barrier can stand in). MPI reduces half buckets
   through an f32 staging buffer; DDP owns it from create, so from then on
   every comm allocation on rank 1 fails and the step must still succeed on
   every rank, bit for bit what MPI's own half allreduce gives (sum in f32,
   rounded once; predivide and average in the half type). The deadline is
   long: a rank left waiting fails by mpirun's hang guard. */
static int g_comm_alloc_fail, g_comm_allocs;
static void *fail_alloc(size_t n, void *u) { (void)u; if (g_comm_alloc_fail) return NULL; g_comm_allocs++; return malloc(n); }
static void fail_free(void *q, void *u) { (void)u; free(q); }
#define HNP 4
static int t_half_launch_allocates_nothing(void) {
    static const size_t numel[HNP] = {9, 5, 12, 3};
    static const capex_dtype dt[HNP] = {CAPEX_F16, CAPEX_BF16, CAPEX_F16, CAPEX_BF16};
    capex_allocator al = {fail_alloc, fail_free, NULL};
    int mode;
    for (mode = 0; mode < 2; mode++) { /* 0: overlapped launches; 1: delay_allreduce */
        capex_comm c;
        capex_ddp *g = NULL;
        capex_ddp_param ps[HNP];
        capex_ddp_desc d;
        float data[HNP][16];
        uint16_t want[HNP][16];
        size_t p, i;
        capex_result r;
        int step;
        comm_make(&c, 3600.0);
        c.allocator = &al;
        for (p = 0; p < HNP; p++) {
            ps[p].data = data[p]; ps[p].numel = numel[p]; ps[p].dtype = dt[p]; ps[p].grad = NULL;
            memset(data[p], 0, sizeof data[p]);
        }
        capex_ddp_desc_init(&d);
        d.first_bucket_bytes = 16; d.bucket_bytes = 24;
        d.gradient_predivide_factor = 2.0f;
        d.delay_allreduce = mode;
        g_comm_alloc_fail = 0;
        r = capex_ddp_create(&g, &c, ps, HNP, &d);
        CHECK(r == CAPEX_OK, "create: %.300s", capex_last_error());
        for (step = 0; step < 2; step++) {
            for (p = 0; p < HNP; p++) { /* the reference: MPI's blocking half allreduce, before the fail hook */
                uint16_t *gv = (uint16_t *)capex_ddp_grad(g, p);
                for (i = 0; i < numel[p]; i++)
                    capex__store(gv, dt[p], i, hash01((uint64_t)(step * 7919 + g_rank * 131 + (int)p * 17) + i) * 3.0f);
                memcpy(want[p], gv, numel[p] * 2);
                capex__host_scale(want[p], numel[p], dt[p], 1.0f / 2.0f);
                r = capex_comm_allreduce(&c, want[p], want[p], numel[p], dt[p], CAPEX_REDUCE_SUM);
                CHECK(r == CAPEX_OK, "reference allreduce: %.300s", capex_last_error());
                capex__host_scale(want[p], numel[p], dt[p], 2.0f / (float)g_world);
            }
            g_comm_allocs = 0;
            g_comm_alloc_fail = g_rank == 1;
            for (p = HNP; p-- > 0;) {
                r = capex_ddp_grad_ready(g, p);
                if (r != CAPEX_OK) break;
            }
            if (r == CAPEX_OK) r = capex_ddp_finalize(g);
            g_comm_alloc_fail = 0;
            CHECK(r == CAPEX_OK, "mode %d step %d: %.300s", mode, step, capex_last_error());
            CHECK(g_comm_allocs == 0, "mode %d step %d: %d comm allocations in the step", mode, step, g_comm_allocs);
            for (p = 0; p < HNP; p++)
                CHECK(memcmp(capex_ddp_grad(g, p), want[p], numel[p] * 2) == 0, "mode %d step %d param %d: not the bits of "
                      "MPI's half allreduce", mode, step, (int)p);
            r = capex_ddp_zero_grad(g);
            CHECK(r == CAPEX_OK, "zero_grad: %.300s", capex_last_error());
        }
        capex_ddp_destroy(g);
        capex_comm_destroy(&c);
    }
    return 0;
}

/* ZeRO's reduce-scatter over MPI staged through f32 buffers MPI allocated at
   every launch (the output, half types also a copy of the input): the same
   hang as DDP's. ZeRO owns them from create. z runs on a comm whose
   allocator fails on rank 1 from the step on; zr, the reference, on a copy
   of MPI's vtable under another name, so it takes MPI's own staging. Both
   get the same gradients; shards, norm and parameters must match bit for
   bit. Stage 2 lends its buckets' buffers lazily (the first backward
   allocates them): there the hook is on from the second step. */
#define ZNP 5
static capex_comm_vtable plain_vt;
static int t_zero_launch_allocates_nothing(void) {
    static const size_t numel[ZNP] = {9, 5, 12, 3, 7};
    static const capex_dtype dt[ZNP] = {CAPEX_F16, CAPEX_BF16, CAPEX_F16, CAPEX_BF16, CAPEX_F32};
    capex_allocator al = {fail_alloc, fail_free, NULL};
    int stage;
    for (stage = 1; stage <= 2; stage++) {
        capex_comm c, cr;
        capex_zero *z = NULL, *zr = NULL;
        capex_zero_param ps[ZNP], pr[ZNP];
        capex_zero_desc d;
        capex_optim_desc od;
        float data[ZNP][16], dref[ZNP][16];
        unsigned char want[1024];
        size_t p, i, k, off;
        capex_result r;
        int step, finf = 0, finf_r = 0;
        float norm = 0.0f, norm_r = 0.0f;
        comm_make(&c, 3600.0);
        c.vt = orig_vt;
        c.allocator = &al;
        comm_make(&cr, 3600.0);
        plain_vt = *orig_vt;
        plain_vt.name = "mpi (plain)"; /* not matched: MPI stages as it did */
        cr.vt = &plain_vt;
        for (p = 0; p < ZNP; p++) {
            for (i = 0; i < numel[p]; i++) capex__store(data[p], dt[p], i, hash01((uint64_t)(p * 97 + i)));
            memcpy(dref[p], data[p], sizeof data[p]);
            ps[p].data = data[p]; ps[p].numel = numel[p]; ps[p].dtype = dt[p]; ps[p].group = 0;
            pr[p] = ps[p];
            pr[p].data = dref[p];
        }
        capex_zero_desc_init(&d);
        d.stage = stage;
        d.bucket_bytes = 16;
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        od.defaults.lr = 0.01f;
        g_comm_alloc_fail = 0;
        r = capex_zero_create(&z, &c, ps, ZNP, &od, NULL, 1, &d);
        CHECK(r == CAPEX_OK, "create: %.300s", capex_last_error());
        r = capex_zero_create(&zr, &cr, pr, ZNP, &od, NULL, 1, &d);
        CHECK(r == CAPEX_OK, "create (reference): %.300s", capex_last_error());
        CHECK(z->nb == zr->nb && z->nb >= 3, "%zu buckets", z->nb);
        for (step = 0; step < 3; step++) {
            int pass;
            for (pass = 0; pass < 2; pass++) { /* 0: the reference; 1: z, rank 1's comm allocations failing */
                capex_zero *y = pass ? z : zr;
                g_comm_allocs = 0;
                g_comm_alloc_fail = pass && g_rank == 1 && (stage == 1 || step > 0);
                for (p = ZNP, r = CAPEX_OK; r == CAPEX_OK && p-- > 0;) {
                    void *gv = capex_zero_grad(y, p);
                    if (!gv) { r = CAPEX_ERR_OUT_OF_MEMORY; break; }
                    for (i = 0; i < numel[p]; i++)
                        capex__store(gv, dt[p], i, hash01((uint64_t)(step * 7919 + g_rank * 131 + (int)p * 17) + i) * 3.0f);
                    r = capex_zero_grad_ready(y, p);
                }
                if (r == CAPEX_OK) r = capex_zero_finalize(y);
                for (k = 0, off = 0; r == CAPEX_OK && k < y->nb; k++) { /* this rank's reduced shards */
                    const capex__zbucket *bk = &y->b[k];
                    size_t es = capex_dtype_size(bk->dtype), n = bk->shard * es;
                    const void *sh = stage == 1 ? (const char *)bk->grad + (size_t)g_rank * n : bk->gshard;
                    if (off + n > sizeof want) break;
                    if (!pass) memcpy(want + off, sh, n);
                    else CHECK(memcmp(want + off, sh, n) == 0, "stage %d step %d bucket %zu: not the bits of MPI's "
                               "reduce-scatter", stage, step, k);
                    off += n;
                }
                if (r == CAPEX_OK) r = capex_zero_grad_norm(y, pass ? &finf : &finf_r, pass ? &norm : &norm_r);
                if (r == CAPEX_OK) r = capex_zero_step(y, 1.0f, 1.0f, 0);
                g_comm_alloc_fail = 0;
                CHECK(r == CAPEX_OK, "stage %d step %d pass %d: %.300s", stage, step, pass, capex_last_error());
                if (pass) CHECK(g_comm_allocs == 0 || (stage == 2 && step == 0), "stage %d step %d: %d comm allocations "
                                "in the step", stage, step, g_comm_allocs);
                r = capex_zero_zero_grad(y);
                CHECK(r == CAPEX_OK, "zero_grad: %.300s", capex_last_error());
            }
            CHECK(memcmp(&norm, &norm_r, sizeof norm) == 0 && finf == finf_r, "stage %d step %d: norm %.9g, want %.9g",
                  stage, step, (double)norm, (double)norm_r);
            for (p = 0; p < ZNP; p++)
                CHECK(memcmp(data[p], dref[p], numel[p] * capex_dtype_size(dt[p])) == 0, "stage %d step %d param %zu: "
                      "stepped to other bits", stage, step, p);
        }
        capex_zero_destroy(z);
        capex_zero_destroy(zr);
        capex_comm_destroy(&c);
        capex_comm_destroy(&cr);
    }
    return 0;
}

static int run_failure_mode(const char *mode) {
    opts o;
    model m;
    capex_ddp_stats s;
    int ok;
    memset(&o, 0, sizeof o);
    o.kill_at = o.stall_at = -1;
    o.timeout = 2.0; /* the deadline the survivors must honour */
    if (strcmp(mode, "kill") == 0) o.kill_at = 2;
    else o.stall_at = 2;
    if (train(&o, 6, 0.1f, &m, &s, &ok)) { printf("rank %d: %s\n", g_rank, g_why); fflush(stdout); exit(4); }
    printf("rank %d: finished all steps (the failure was not noticed)\n", g_rank);
    fflush(stdout);
    return 5;
}

int main(int argc, char **argv) {
    static const tcase cases[] = {
        {"collectives", t_collectives},
        {"reduce_scatter_allgatherv_allreduce_vs_float64", t_shards},
        {"sampler_shards_disjoint_complete", t_sampler_shards},
        {"train_overlap_bitwise_and_vs_reference", t_train_overlap},
        {"train_delay_allreduce", t_train_delay},
        {"train_predivide_4", t_train_predivide},
        {"train_no_sync_accumulation", t_train_no_sync},
        {"train_unused_param_marked", t_train_unused_marked},
        {"train_unused_param_found", t_train_unused_found},
        {"train_bf16_grads_allreduce_always_fp32", t_train_bf16_fp32_reduce},
        {"train_rebuild_buckets", t_train_rebuild},
        {"ddp_rank_orders_unused_mixed_dtypes", t_rank_orders},
        {"ddp_half_launch_allocates_nothing", t_half_launch_allocates_nothing},
        {"zero_launch_allocates_nothing", t_zero_launch_allocates_nothing},
        {"zero_stage1_and_2_match_ddp_and_optim", t_zero},
        {"gathers_with_send_aliasing_recv", t_gather_aliased},
        {"init_mpi_refuses_unusable_communicators", t_init_bad_comm},
        {"mismatched_calls_fail_on_every_rank", t_mismatch},
        {"different_models_fail_create_on_every_rank", t_model_mismatch},
    };
    int i, passed = 0, failed = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    capex_log_set_rank(g_rank);
    make_data();
    if (argc > 1 && strcmp(argv[1], "stall_blocking") == 0) return run_stall_blocking();
    if (argc > 1 && strcmp(argv[1], "late") == 0) return run_late();
    if (argc > 1 && strcmp(argv[1], "after_finalize") == 0) return run_after_finalize();
    if (argc > 1) return run_failure_mode(argv[1]);
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        int f, anyf = 0, who = -1, r;
        g_why[0] = '\0';
        f = cases[i].fn();
        MPI_Allreduce(&f, &anyf, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        r = f ? g_rank : g_world;
        MPI_Allreduce(&r, &who, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (anyf && g_rank == who) printf("FAIL %s (rank %d of %d): %s\n", cases[i].name, g_rank, g_world, g_why);
        if (g_rank == 0 && !anyf) printf("ok   %s (np %d)\n", cases[i].name, g_world);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
        if (anyf) failed++; else passed++;
    }
    if (g_rank == 0) printf("mpi-summary: %d passed, %d failed\n", passed, failed);
    fflush(stdout);
    MPI_Finalize();
    return failed ? 1 : 0;
}
