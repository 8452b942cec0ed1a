/* test_zero.c - the sharded optimizer (capex_zero, ZeRO stage 1 and 2):
   equivalence with DDP + capex_optim on a single comm and on TCP worlds of
   2, 3 and 4 processes (tests/zero_check.h; MPI runs the same checks in
   tests/mpi/test_dist_mpi.c), the memory split, argument and call-order
   errors, and a rank that dies mid-step. */
#include "fail_alloc.h" /* g_fail_alloc_size: one chosen allocation fails */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include "fork_world.h"
#include "zero_check.h"
#include <sys/wait.h>
#include <poll.h>

CT_TEST(single_comm_matches_ddp_and_optim) {
    capex_comm c;
    char why[400] = "";
    int line;
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single: %s", capex_last_error());
    line = zero_check_all(&c, why, sizeof why);
    capex_comm_destroy(&c);
    CT_CHECK(line == 0, "zero_check.h:%d: %s", line, why);
}

static void one_param(capex_zero_param *p, float *data, size_t n) {
    p->data = data; p->numel = n; p->dtype = CAPEX_F32; p->group = 0;
}

CT_TEST(create_refuses_bad_arguments) {
    capex_comm c;
    capex_zero *z = (capex_zero *)1;
    capex_zero_param p[2];
    capex_zero_desc d, zeroed;
    capex_optim_desc od;
    float w[8] = {0};
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    one_param(&p[0], w, 8); one_param(&p[1], w, 0);
    capex_zero_desc_init(&d);
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(NULL, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "out NULL");
    CT_CHECK(capex_zero_create(&z, NULL, p, 2, &od, NULL, 1, &d) != CAPEX_OK && z == NULL, "comm NULL");
    CT_CHECK(capex_zero_create(&z, &c, NULL, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "params NULL");
    CT_CHECK(capex_zero_create(&z, &c, p, 2, NULL, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "od NULL");
    memset(&zeroed, 0, sizeof zeroed);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &zeroed) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_zero_desc_init"), "zeroed desc: %s", capex_last_error());
    d.stage = 3;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "stage"),
             "stage 3: %s", capex_last_error());
    d.stage = 1;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 0, &d) == CAPEX_ERR_INVALID_ARG, "no groups");
    p[0].group = 1;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "group"),
             "group out of range: %s", capex_last_error());
    p[0].group = 0;
    p[0].data = NULL;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "no data");
    p[0].data = w;
    p[0].dtype = (capex_dtype)9;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "bad dtype");
    p[0].dtype = CAPEX_F32;
    od.stochastic_rounding = 1;
    p[0].numel = (size_t)0xffffffffu + 1u;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_UNSUPPORTED && strstr(capex_last_error(), "2^32"),
             "stochastic rounding over a 2^32-element tensor: %s", capex_last_error());
    p[0].numel = 8;
    od.stochastic_rounding = 0;
    od.defaults.lr = -1.0f;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG && z == NULL, "bad lr: %s",
             capex_last_error());
    od.defaults.lr = 1e-3f;
    p[0].numel = SIZE_MAX / 2;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "overflow"),
             "wrapping size: %s", capex_last_error());
    p[0].numel = 8;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_OK && z, "valid: %s", capex_last_error());
    capex_zero_destroy(z);
    capex_zero_destroy(NULL);
    capex_comm_destroy(&c);
}

CT_TEST(call_order_errors) {
    capex_comm c;
    capex_zero *z = NULL;
    capex_zero_param p[2];
    capex_zero_desc d;
    capex_optim_desc od;
    float w[8] = {0}, v[4] = {0};
    int stage;
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    for (stage = 1; stage <= 2; stage++) {
        one_param(&p[0], w, 8); one_param(&p[1], v, 4);
        capex_zero_desc_init(&d);
        d.stage = stage;
        d.bucket_bytes = 16; /* one bucket per param */
        CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_OK, "create: %s", capex_last_error());
        CT_CHECK(capex_zero_grad(z, 2) == NULL && strstr(capex_last_error(), "unknown"), "grad out of range");
        CT_CHECK(capex_zero_grad_ready(z, 2) == CAPEX_ERR_INVALID_ARG, "ready out of range");
        CT_CHECK(capex_zero_grad(z, 1) != NULL, "grad 1: %s", capex_last_error());
        CT_CHECK(capex_zero_grad_ready(z, 1) == CAPEX_OK, "ready 1");
        CT_CHECK(capex_zero_grad_ready(z, 1) == CAPEX_ERR_ORDER, "ready twice");
        if (stage == 2) /* param 1's bucket was reduced: its buffer went back to the pool */
            CT_CHECK(capex_zero_grad(z, 1) == NULL && strstr(capex_last_error(), "already reduced"), "stage 2 late grad: %s",
                     capex_last_error());
        CT_CHECK(capex_zero_finalize(z) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "parameter 0"),
                 "missing param 0: %s", capex_last_error());
        /* mid-iteration: param 0's shard is not reduced, param 1's may be in flight */
        CT_CHECK(capex_zero_step(z, 1, 1, 0) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "finalize"),
                 "step before finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_grad_norm(z, NULL, NULL) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "finalize"),
                 "grad norm before finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_zero_grad(z) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "finalize"),
                 "zero_grad before finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_grad_ready(z, 0) == CAPEX_OK, "ready 0 (unused: zero gradient)");
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK, "finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_grad_norm(z, NULL, NULL) == CAPEX_OK && capex_zero_step(z, 1, 1, 0) == CAPEX_OK,
                 "norm and step after finalize: %s", capex_last_error());
        if (stage == 2)
            CT_CHECK(capex_zero_set_sync(z, 0) == CAPEX_ERR_CONFIG, "no_sync is stage 1's");
        else {
            CT_CHECK(capex_zero_grad_ready(z, 0) == CAPEX_OK, "ready 0");
            CT_CHECK(capex_zero_set_sync(z, 0) == CAPEX_ERR_ORDER, "set_sync mid-backward");
        }
        CT_CHECK(capex_zero_optim(z) != NULL && capex_zero_optim(NULL) == NULL, "optim");
        capex_zero_destroy(z);
        z = NULL;
    }
    CT_CHECK(capex_zero_grad_ready(NULL, 0) == CAPEX_ERR_INVALID_ARG && capex_zero_finalize(NULL) == CAPEX_ERR_INVALID_ARG &&
             capex_zero_step(NULL, 1, 1, 0) == CAPEX_ERR_INVALID_ARG && capex_zero_grad(NULL, 0) == NULL &&
             capex_zero_grad_norm(NULL, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "NULL zero");
    capex_comm_destroy(&c);
}

/* Stage 2 lends full-size buffers only while buckets are open: with grads
   written and made ready bucket by bucket, one buffer serves them all. */
CT_TEST(stage2_memory_is_shards_plus_one_open_bucket) {
    capex_comm c;
    capex_zero *z = NULL;
    capex_zero_param p[4];
    capex_zero_desc d;
    capex_optim_desc od;
    capex_zero_memory m0, m1;
    float w[4][256];
    int i;
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    memset(w, 0, sizeof w);
    for (i = 0; i < 4; i++) one_param(&p[i], w[i], 256);
    capex_zero_desc_init(&d);
    d.stage = 2;
    d.bucket_bytes = 1024; /* one bucket per param */
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(&z, &c, p, 4, &od, NULL, 1, &d) == CAPEX_OK, "create: %s", capex_last_error());
    m0 = capex_zero_memory_info(z);
    for (i = 3; i >= 0; i--) {
        float *g = (float *)capex_zero_grad(z, (size_t)i);
        CT_CHECK(g != NULL, "grad %d", i);
        g[0] = 1.0f;
        CT_CHECK(capex_zero_grad_ready(z, (size_t)i) == CAPEX_OK, "ready %d", i);
    }
    CT_CHECK(capex_zero_finalize(z) == CAPEX_OK, "finalize");
    m1 = capex_zero_memory_info(z);
    CT_CHECK(m0.grad_bytes == 4 * 256 * 4, "shards of a world of 1: %zu", m0.grad_bytes);
    CT_CHECK(m1.grad_bytes == m0.grad_bytes + 256 * 4, "one lent buffer: %zu -> %zu", m0.grad_bytes, m1.grad_bytes);
    CT_CHECK(m1.master_bytes == 0 && m1.moment_bytes == 4 * 256 * 8 && m1.padding_elements == 0, "state %zu %zu %zu",
             m1.master_bytes, m1.moment_bytes, m1.padding_elements);
    capex_zero_destroy(z);
    capex_comm_destroy(&c);
}

/* A bucket of empty params only (here the one f32 param, numel 0) has no
   shard: its lent buffer goes back to the pool like any other's, so one
   buffer still serves both buckets instead of the empty one keeping a
   full-size buffer for good. */
CT_TEST(stage2_empty_bucket_returns_its_buffer) {
    capex_comm c;
    capex_zero *z = NULL;
    capex_zero_param p[2];
    capex_zero_desc d;
    capex_optim_desc od;
    uint16_t h[256];
    float e[1];
    int it, i;
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    memset(h, 0, sizeof h);
    p[0].data = h; p[0].numel = 256; p[0].dtype = CAPEX_F16; p[0].group = 0;
    p[1].data = e; p[1].numel = 0; p[1].dtype = CAPEX_F32; p[1].group = 0;
    capex_zero_desc_init(&d);
    d.stage = 2;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_OK, "create: %s", capex_last_error());
    CT_CHECK(capex_zero_memory_info(z).buckets == 2, "buckets %zu", capex_zero_memory_info(z).buckets);
    for (it = 0; it < 3; it++) {
        for (i = 1; i >= 0; i--) {
            CT_CHECK(capex_zero_grad(z, (size_t)i) != NULL, "grad %d: %s", i, capex_last_error());
            CT_CHECK(capex_zero_grad_ready(z, (size_t)i) == CAPEX_OK, "ready %d: %s", i, capex_last_error());
        }
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK && capex_zero_step(z, 1, 1, 0) == CAPEX_OK &&
                 capex_zero_zero_grad(z) == CAPEX_OK, "step: %s", capex_last_error());
    }
    CT_CHECK(capex_zero_memory_info(z).lent_buffers == 1, "%zu full-size buffers lent, want 1",
             capex_zero_memory_info(z).lent_buffers);
    capex_zero_destroy(z);
    capex_comm_destroy(&c);
}

/* ---- nonblocking collectives (as MPI's): one request per bucket ---- */

/* Rank 0 of a world of 2 identical ranks whose ireduce_scatter and
   iallgather complete at once but stay active until waited, and which
   counts a request started over one still active (its handle lost). */
typedef struct nb_fake { int outstanding, clobbered; } nb_fake;
static capex_result nb_allreduce(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_reduce_op op, double dl) {
    size_t i;
    (void)dl;
    if (s != r) memmove(r, s, n * capex_comm_dtype_size(t));
    for (i = 0; t == CAPEX_F32 && i < n; i++) ((float *)r)[i] *= op == CAPEX_REDUCE_SUM ? (float)c->world_size : 1.0f;
    for (i = 0; t == CAPEX_I64 && i < n; i++) ((int64_t *)r)[i] *= c->world_size; /* agreements: the identical ranks' sum */
    return CAPEX_OK;
}
static capex_result nb_bcast(capex_comm *c, void *b, size_t n, capex_dtype t, int root, double dl) {
    (void)c; (void)b; (void)n; (void)t; (void)root; (void)dl;
    return CAPEX_OK;
}
static capex_result nb_allgather(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, double dl) {
    size_t bytes = n * capex_comm_dtype_size(t);
    int p;
    (void)dl;
    if ((const char *)s == (const char *)r) return CAPEX_OK; /* in place: rank 0's slot; the other rank's stays */
    for (p = 0; p < c->world_size; p++) memmove((char *)r + (size_t)p * bytes, s, bytes); /* ranks alike (create's check) */
    return CAPEX_OK;
}
static capex_result nb_barrier(capex_comm *c, double dl) { (void)c; (void)dl; return CAPEX_OK; }
static void nb_start(capex_comm *c, capex_comm_req *q) {
    nb_fake *f = (nb_fake *)c->impl;
    if (q->active) f->clobbered++;
    memset(q, 0, sizeof *q);
    q->active = 1;
    f->outstanding++;
}
static capex_result nb_ireduce_scatter(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_reduce_op op,
                                       capex_comm_req *q) {
    size_t i;
    nb_start(c, q);
    for (i = 0; i < n; i++) ((float *)r)[i] = ((const float *)s)[i] * (float)c->world_size; /* rank 0's slice */
    (void)t; (void)op;
    return CAPEX_OK;
}
static capex_result nb_iallgather(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_comm_req *q) {
    (void)s; (void)r; (void)n; (void)t; /* rank 0's shard is in place */
    nb_start(c, q);
    return CAPEX_OK;
}
static capex_result nb_wait(capex_comm *c, capex_comm_req *q, double dl) {
    nb_fake *f = (nb_fake *)c->impl;
    (void)dl;
    if (q->active) f->outstanding--;
    q->active = 0;
    return CAPEX_OK;
}
static const capex_comm_vtable nb_vt = {"nb-fake", nb_allreduce, nb_bcast, nb_allgather, nb_barrier, NULL, nb_wait,
                                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                        nb_ireduce_scatter, nb_iallgather, NULL, NULL, NULL};

/* grad_ready polls in-flight reduce-scatters oldest first (MPI progresses
   only inside its calls); one that test reported finished is not polled
   again before its wait. It was: B buckets finishing at once cost about
   B^2/2 polls per backward. */
static int nb_polls;
static capex_result nb_test(capex_comm *c, capex_comm_req *q, int *done) {
    (void)c; (void)q;
    nb_polls++;
    *done = 1;
    return CAPEX_OK;
}
static const capex_comm_vtable nb_vt_test = {"nb-fake-test", nb_allreduce, nb_bcast, nb_allgather, nb_barrier, NULL, nb_wait,
                                             NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, nb_test, NULL, NULL,
                                             nb_ireduce_scatter, nb_iallgather, NULL, NULL, NULL};
CT_TEST(progress_polls_each_finished_bucket_once) {
    enum { NP = 32 };
    capex_comm c;
    nb_fake f = {0, 0};
    capex_zero *z = NULL;
    capex_zero_param p[NP];
    capex_zero_desc d;
    capex_optim_desc od;
    static float w[NP][4];
    size_t i;
    int it;
    memset(&c, 0, sizeof c);
    c.vt = &nb_vt_test; c.impl = &f; c.rank = 0; c.world_size = 2; c.timeout_s = 10;
    for (i = 0; i < NP; i++) one_param(&p[i], w[i], 4);
    capex_zero_desc_init(&d);
    d.bucket_bytes = 16; /* one bucket per param */
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    CT_CHECK(capex_zero_create(&z, &c, p, NP, &od, NULL, 1, &d) == CAPEX_OK, "create: %s", capex_last_error());
    nb_polls = 0;
    for (it = 0; it < 2; it++) {
        for (i = NP; i-- > 0;) {
            float *g = (float *)capex_zero_grad(z, i);
            CT_CHECK(g != NULL, "grad %zu: %s", i, capex_last_error());
            CT_CHECK(capex_zero_grad_ready(z, i) == CAPEX_OK, "ready %zu: %s", i, capex_last_error());
        }
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK, "finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_step(z, 1, 1, 0) == CAPEX_OK, "step: %s", capex_last_error());
        CT_CHECK(capex_zero_zero_grad(z) == CAPEX_OK, "zero_grad");
    }
    CT_CHECK(nb_polls <= 2 * NP, "%d polls for 2 x %d buckets (each finished bucket once)", nb_polls, NP);
    CT_CHECK(f.clobbered == 0 && f.outstanding == 0, "%d clobbered, %d outstanding", f.clobbered, f.outstanding);
    capex_zero_destroy(z);
}

/* step_async leaves a bucket's all-gather in flight when the forward never
   waits for its params (an unused layer); the next backward's reduce-scatter
   of that bucket must finish it first, not start over its request. */
CT_TEST(reduce_scatter_after_unwaited_gather) {
    capex_comm c;
    nb_fake f = {0, 0};
    capex_zero *z = NULL;
    capex_zero_param p[2];
    capex_zero_desc d;
    capex_optim_desc od;
    float w[8] = {0}, v[4] = {0};
    int it;
    size_t i;
    memset(&c, 0, sizeof c);
    c.vt = &nb_vt; c.impl = &f; c.rank = 0; c.world_size = 2; c.timeout_s = 10;
    one_param(&p[0], w, 8); one_param(&p[1], v, 4);
    capex_zero_desc_init(&d);
    d.bucket_bytes = 16; /* bucket 0: param 1, bucket 1: param 0 */
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_OK, "create: %s", capex_last_error());
    for (it = 0; it < 2; it++) {
        for (i = 2; i-- > 0;) {
            float *g = (float *)capex_zero_grad(z, i);
            CT_CHECK(g != NULL, "grad %zu: %s", i, capex_last_error());
            g[0] = 1.0f;
            CT_CHECK(capex_zero_grad_ready(z, i) == CAPEX_OK, "ready %zu: %s", i, capex_last_error());
        }
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK, "finalize: %s", capex_last_error());
        CT_CHECK(capex_zero_step_async(z, 1, 1, 0) == CAPEX_OK, "step: %s", capex_last_error());
        CT_CHECK(capex_zero_wait_param(z, 1) == CAPEX_OK, "wait 1"); /* param 0 unused in the forward */
        CT_CHECK(capex_zero_zero_grad(z) == CAPEX_OK, "zero_grad");
    }
    CT_CHECK(capex_zero_wait_params(z) == CAPEX_OK, "wait all");
    CT_CHECK(f.clobbered == 0 && f.outstanding == 0, "%d requests started over active ones, %d never waited", f.clobbered,
             f.outstanding);
    capex_zero_destroy(z);
}

/* torch's ZeroRedundancyOptimizer has add_param_group; capex_zero's
   optimizer steps shard pieces, so a group added to it has no reduced
   gradients, and sharded LAMB/NovoGrad index their per-param sums by piece
   (a world of 2 read past them and crashed): refused, the zero unchanged. */
CT_TEST(optim_add_group_is_refused) {
    capex_comm c;
    nb_fake f = {0, 0};
    capex_zero *z = NULL;
    capex_zero_param p[1];
    capex_optim_param op;
    capex_optim_desc od;
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[4] = {1, 1, 1, 1}, gx[4] = {1, 1, 1, 1};
    int kind;
    memset(&c, 0, sizeof c);
    c.vt = &nb_vt; c.impl = &f; c.rank = 0; c.world_size = 2; c.timeout_s = 10;
    for (kind = 0; kind < 2; kind++) {
        one_param(&p[0], w, 8);
        capex_optim_desc_init(&od, kind ? CAPEX_OPTIM_NOVOGRAD : CAPEX_OPTIM_LAMB);
        CT_CHECK(capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) == CAPEX_OK, "create: %s", capex_last_error());
        capex_optim_param_init(&op);
        op.param = x; op.grad = gx; op.numel = 4;
        CT_CHECK(capex_optim_add_group(capex_zero_optim(z), NULL, &op, 1, NULL) == CAPEX_ERR_UNSUPPORTED &&
                 strstr(capex_last_error(), "capex_zero_create"), "add_group on the zero's optimizer: %s", capex_last_error());
        CT_CHECK(capex_optim_num_groups(capex_zero_optim(z)) == 1, "groups %zu", capex_optim_num_groups(capex_zero_optim(z)));
        CT_CHECK(capex_zero_grad_ready(z, 0) == CAPEX_OK && capex_zero_finalize(z) == CAPEX_OK &&
                 capex_zero_step(z, 1, 1, 0) == CAPEX_OK, "step: %s", capex_last_error());
        capex_zero_destroy(z);
        z = NULL;
    }
}

/* set_hparams turning momentum on for an SGD group created without it is
   refused: the group has no momentum buffers. Every rank must decide the
   same from the group's config; it was refused only on the rank holding a
   piece of the group, while the other accepted it (ranks out of step: their
   hparams, checkpoints and steps differ). Each rank of a world of 2 here. */
CT_TEST(momentum_on_refused_on_every_rank) {
    capex_comm c;
    nb_fake f = {0, 0};
    capex_zero_param p[2];
    capex_optim_desc od;
    capex_optim_hparams hp[2], h;
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[1] = {1};
    int rank, holders = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    hp[0] = hp[1] = od.defaults;
    hp[0].momentum = 0.9f; /* group 1: none, so no buffers */
    for (rank = 0; rank < 2; rank++) {
        capex_zero *z = NULL;
        capex_optim *o;
        memset(&c, 0, sizeof c);
        c.vt = &nb_vt; c.impl = &f; c.rank = rank; c.world_size = 2; c.timeout_s = 10;
        one_param(&p[0], w, 8); one_param(&p[1], v, 1);
        p[1].group = 1;
        CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, hp, 2, NULL) == CAPEX_OK, "rank %d: create: %s", rank,
                 capex_last_error());
        o = capex_zero_optim(z);
        holders += capex_optim_get_state(o, 1, 0, NULL, NULL) == CAPEX_OK; /* a piece of group 1 here */
        h = hp[1]; h.momentum = 0.5f;
        CT_CHECK(capex_optim_set_hparams(o, 1, &h) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "without momentum"),
                 "rank %d: momentum on for group 1: %s", rank, capex_last_error());
        CT_CHECK(capex_optim_get_hparams(o, 1, &h) == CAPEX_OK && h.momentum == 0.0f, "rank %d: group 1 changed", rank);
        h = hp[0]; h.momentum = 0.0f; /* group 0 has buffers: off and on again everywhere */
        CT_CHECK(capex_optim_set_hparams(o, 0, &h) == CAPEX_OK, "rank %d: momentum off: %s", rank, capex_last_error());
        h.momentum = 0.5f;
        CT_CHECK(capex_optim_set_hparams(o, 0, &h) == CAPEX_OK, "rank %d: momentum on: %s", rank, capex_last_error());
        capex_zero_destroy(z);
    }
    CT_CHECK(holders == 1, "group 1's param should be on one rank only, %d hold it", holders);
}

/* ---- TCP worlds (fork) ---- */

static int tcp_comm(capex_comm *c, int rank, int world, int port) {
    capex_dist_env env;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "zero-test");
    if (capex_comm_init_tcp(c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return 0;
    c->timeout_s = CT_HANG_GUARD_S; /* every mode expects success or a non-timeout error */
    return 1;
}

static char g_ckpt[3][256]; /* saved by worlds of 3, 1 and 2 */
static int g_null_path_rank; /* mode 6 */
static int g_hold[2] = {-1, -1}; /* mode 1 in a world of 2: rank 1 stalls, held until rank 0 has returned */
static int g_oom_rank;       /* modes 8, 9: the rank whose allocation of g_oom_size bytes fails */
static size_t g_oom_size;

/* Modes 8 and 9: rank g_oom_rank's r must be CAPEX_ERR_OUT_OF_MEMORY, every
   other rank's CAPEX_ERR_COMM naming it; 0 when so. */
static int oom_verdict_ok(int rank, capex_result r) {
    char want[32];
    snprintf(want, sizeof want, "rank %d failed", g_oom_rank);
    if (rank == g_oom_rank) return r == CAPEX_ERR_OUT_OF_MEMORY && strstr(capex_last_error(), "out of memory") != NULL;
    return r == CAPEX_ERR_COMM && strstr(capex_last_error(), want) != NULL;
}

/* mode 0: the equivalence checks; 1: rank 1 dies after create, the others
   must fail with CAPEX_ERR_COMM (its closed sockets; their deadline is the
   hang guard, so that is no timeout waited out) and then refuse every call;
   in a world of 2 rank 1 stalls instead (held on g_hold until rank 0 has
   returned) and rank 0 must get CAPEX_ERR_TIMEOUT from its 0.5 s deadline
   (a rank 0 that overstays it gets EOF and COMM when rank 1 is let go); 2: save a
   checkpoint (AdamW, stage 2, then SGD into a second file); 3: load the
   world of 3's into a world of 2 and save again; 4: save_file status;
   5: capex_zero_save with no writer on rank 0; 10: gradient_average 0 and 1 (zero_sum_check);
   11: one rank's load fails (load_fail_check); 12: save against load (save_vs_load_check). */

/* The save modes' model: one Adam param of 40 floats (0, 0.125, ...); path:
   this run's checkpoint name plus suffix. */
static void save_case_setup(float w[40], capex_zero_param *p, capex_optim_desc *od, char path[300], const char *suffix) {
    int i;
    for (i = 0; i < 40; i++) w[i] = 0.125f * (float)i;
    one_param(p, w, 40);
    capex_optim_desc_init(od, CAPEX_OPTIM_ADAM);
    snprintf(path, 300, "%.250s%s", g_ckpt[0], suffix);
}
/* Mode 10: gradient_average 0 (sum) and 1, stages 1 and 2, two micro-batches, plain SGD, against
   p -= lr * sum_q,m g (/ W) in float64: multiples of 1/64, so exact except an average over 3. */
static int zsum_grad_num(int q, int s, int m, int i, size_t e) { return (int)((q * 7 + s * 5 + m * 3 + i * 11 + (int)e) % 31) - 15; }
static int zero_sum_check(capex_comm *c, int rank, int world) {
    static const size_t n[3] = {37, 5, 130};
    int stage, avg;
    for (stage = 1; stage <= 2; stage++)
        for (avg = 0; avg <= 1; avg++) {
            float w[3][130];
            double ref[3][130];
            capex_zero_param p[3];
            capex_zero_desc d;
            capex_optim_desc od;
            capex_optim_hparams hp;
            capex_zero *z = NULL;
            int i, s, m, q;
            size_t e;
            for (i = 0; i < 3; i++) { /* rank-dependent: rank 0's values are broadcast at create */
                one_param(&p[i], w[i], n[i]);
                for (e = 0; e < n[i]; e++) {
                    ref[i][e] = (double)e / 64.0 - 1.0;
                    w[i][e] = (float)(ref[i][e] + (rank ? 9.0 : 0.0));
                }
            }
            capex_zero_desc_init(&d);
            d.stage = stage; d.gradient_average = avg; d.bucket_bytes = 200; /* buckets and shards straddle the params */
            capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
            hp = od.defaults; hp.lr = 0.25f; hp.momentum = 0.0f; hp.weight_decay = 0.0f;
            if (capex_zero_create(&z, c, p, 3, &od, &hp, 1, &d) != CAPEX_OK) {
                fprintf(stderr, "rank %d: create: %s\n", rank, capex_last_error());
                return __LINE__;
            }
            for (s = 0; s < 3; s++) {
                for (m = 0; m < 2; m++) {
                    if (stage == 1 && capex_zero_set_sync(z, m == 1) != CAPEX_OK) return __LINE__;
                    for (i = 3; i-- > 0;) {
                        float *g = (float *)capex_zero_grad(z, (size_t)i);
                        if (!g) return __LINE__;
                        for (e = 0; e < n[i]; e++) g[e] += (float)zsum_grad_num(rank, s, m, i, e) / 16.0f;
                        if (capex_zero_grad_ready(z, (size_t)i) != CAPEX_OK) return __LINE__;
                    }
                    if (capex_zero_finalize(z) != CAPEX_OK) return __LINE__;
                }
                if (capex_zero_step(z, 1.0f, 1.0f, 0) != CAPEX_OK || capex_zero_zero_grad(z) != CAPEX_OK) {
                    fprintf(stderr, "rank %d: step: %s\n", rank, capex_last_error());
                    return __LINE__;
                }
                for (i = 0; i < 3; i++)
                    for (e = 0; e < n[i]; e++) {
                        double sum = 0.0;
                        for (q = 0; q < world; q++)
                            for (m = 0; m < 2; m++) sum += zsum_grad_num(q, s, m, i, e) / 16.0;
                        ref[i][e] -= 0.25 * (avg ? sum / world : sum);
                    }
                for (i = 0; i < 3; i++)
                    for (e = 0; e < n[i]; e++) {
                        double got = w[i][e], want = ref[i][e];
                        if (!(avg && world == 3 ? fabs(got - want) <= 1e-6 * (1.0 + fabs(want)) : got == want)) {
                            fprintf(stderr, "rank %d: world %d stage %d gradient_average %d step %d: param %d[%zu] = %.9g, "
                                    "want %.9g\n", rank, world, stage, avg, s, i, e, got, want);
                            capex_zero_destroy(z);
                            return __LINE__;
                        }
                    }
            }
            capex_zero_destroy(z);
        }
    return 0;
}
/* Every piece's master and moments and each group's step, as bytes; returns the length. */
static size_t zero_moments(const capex_zero *z, unsigned char *out, size_t cap) {
    size_t n = 0, k, g;
#define ZM_PUT(ptr, bytes) do { if ((ptr) && n + (bytes) <= cap) memcpy(out + n, (ptr), (bytes)); n += (bytes); } while (0)
    for (k = 0; k < z->opt->ntensors; k++) {
        const capex_optim_param *p = &z->opt->tensors[k].p;
        size_t bytes = sizeof(float) * (size_t)p->numel;
        ZM_PUT(p->param, bytes);
        ZM_PUT(p->exp_avg, bytes);
        ZM_PUT(p->exp_avg_sq, bytes);
    }
    for (g = 0; g < z->opt->ngroups; g++) ZM_PUT(&z->opt->groups[g].step, sizeof z->opt->groups[g].step);
#undef ZM_PUT
    return n;
}

/* Modes 11 and 12: capex_zero_load is collective and agreed. The model: an
   f32 param of 40 and a bf16 one of 24 (fp32 master pieces), Adam. */
static int g_bad_load_rank; /* mode 11: the rank whose load fails */
static int lf_create(capex_comm *c, capex_zero **z, float *a, uint16_t *b) {
    capex_zero_param p[2];
    capex_optim_desc od;
    capex_zero_desc d;
    int e;
    for (e = 0; e < 40; e++) a[e] = 0.125f * (float)e - 2.0f;
    for (e = 0; e < 24; e++) b[e] = capex_f32_to_bf16(0.25f * (float)e - 3.0f);
    one_param(&p[0], a, 40);
    p[1].data = b; p[1].numel = 24; p[1].dtype = CAPEX_BF16; p[1].group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    capex_zero_desc_init(&d);
    d.bucket_bytes = 100; /* both params straddle shards */
    return capex_zero_create(z, c, p, 2, &od, NULL, 1, &d) == CAPEX_OK;
}
/* One step, gradients multiples of 1/16 (exact in any order). */
static int lf_step(capex_zero *z, int rank, int s) {
    int i, e;
    for (i = 1; i >= 0; i--) {
        void *g = capex_zero_grad(z, (size_t)i);
        if (!g) return 0;
        for (e = 0; e < (i ? 24 : 40); e++) {
            float v = (float)((rank * 5 + s * 3 + e * 7 + i) % 17 - 8) / 16.0f;
            if (i) ((uint16_t *)g)[e] = capex_f32_to_bf16(v);
            else ((float *)g)[e] = v;
        }
        if (capex_zero_grad_ready(z, (size_t)i) != CAPEX_OK) return 0;
    }
    return capex_zero_finalize(z) == CAPEX_OK && capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_OK &&
           capex_zero_zero_grad(z) == CAPEX_OK;
}
/* This rank's whole state as bytes: params' data, then zero_moments; returns its length. */
static size_t lf_state(const capex_zero *z, const float *a, const uint16_t *b, unsigned char *out, size_t cap) {
    size_t n = sizeof(float) * 40 + sizeof(uint16_t) * 24;
    if (cap < n) return n + 1;
    memcpy(out, a, sizeof(float) * 40);
    memcpy(out + sizeof(float) * 40, b, sizeof(uint16_t) * 24);
    return n + zero_moments(z, out + n, cap - n);
}
/* Mode 11: rank g_bad_load_rank's load fails (a truncated file, a missing
   one, unknown flags through capex_zero_load); every rank must fail (it
   with its own error, its peers CAPEX_ERR_COMM naming it) with nothing
   changed, stay in step, and a good load then steps as a twin that never
   failed, bit for bit. */
static int load_fail_check(capex_comm *c, int rank) {
    static unsigned char before[8192], after[8192];
    float a[40], a2[40];
    uint16_t b[24], b2[24];
    capex_zero *z = NULL, *twin = NULL;
    char path[300], bad[300], want[32];
    int s, kind, line = 0;
    size_t n0, n1;
    capex_result r;
    snprintf(path, sizeof path, "%.250s.lf", g_ckpt[0]);
    snprintf(bad, sizeof bad, "%.250s.lf.bad%d", g_ckpt[0], rank);
    snprintf(want, sizeof want, "rank %d failed", g_bad_load_rank);
    if (!lf_create(c, &z, a, b) || !lf_create(c, &twin, a2, b2)) return __LINE__;
    for (s = 0; s < 2; s++) if (!lf_step(z, rank, s) || !lf_step(twin, rank, s)) return __LINE__;
    if (capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK) return __LINE__;
    if (!lf_step(z, rank, 2) || !lf_step(twin, rank, 2)) return __LINE__; /* the state now differs from the file's */
    if (rank == g_bad_load_rank) { /* the first half of the good file */
        static char buf[65536];
        FILE *f = fopen(path, "rb"), *o;
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        if (n < 100 || n == sizeof buf || !(o = fopen(bad, "wb"))) return __LINE__;
        if (fwrite(buf, 1, n / 2, o) != n / 2) line = __LINE__;
        fclose(o);
        if (line) return line;
    }
    n0 = lf_state(z, a, b, before, sizeof before);
    if (n0 > sizeof before) return __LINE__;
    for (kind = 0; kind < 3 && !line; kind++) {
        int me = rank == g_bad_load_rank;
        if (kind == 0) r = capex_zero_load_file(z, me ? bad : path, CAPEX_OPTIM_STATE_PARAMS);
        else if (kind == 1) r = capex_zero_load_file(z, me ? "/nonexistent-capex-dir/zero.ckpt" : path, CAPEX_OPTIM_STATE_PARAMS);
        else {
            capex_state_reader *rd = NULL;
            if (capex_state_reader_open_file(path, 0, NULL, &rd) != CAPEX_OK) return __LINE__;
            r = capex_zero_load(z, rd, NULL, me ? 2u | CAPEX_OPTIM_STATE_PARAMS : CAPEX_OPTIM_STATE_PARAMS);
            capex_state_reader_close(rd);
        }
        if (me ? r == CAPEX_OK || r == CAPEX_ERR_COMM : r != CAPEX_ERR_COMM || !strstr(capex_last_error(), want)) {
            fprintf(stderr, "rank %d: load %d failing on rank %d: %s (%s)\n", rank, kind, g_bad_load_rank,
                    capex_result_string(r), capex_last_error());
            line = __LINE__;
        }
        n1 = lf_state(z, a, b, after, sizeof after);
        if (!line && (n1 != n0 || memcmp(before, after, n0) != 0)) {
            fprintf(stderr, "rank %d: load %d failing on rank %d changed this rank's state\n", rank, kind, g_bad_load_rank);
            line = __LINE__;
        }
        if (!line && capex_comm_barrier(c) != CAPEX_OK) line = __LINE__; /* in step */
    }
    /* a good load on every rank, then 2 steps: as the twin that never failed */
    if (!line && (r = capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS)) != CAPEX_OK) line = __LINE__;
    if (!line && (r = capex_zero_load_file(twin, path, CAPEX_OPTIM_STATE_PARAMS)) != CAPEX_OK) line = __LINE__;
    if (line && r != CAPEX_OK) fprintf(stderr, "rank %d: good load: %s\n", rank, capex_last_error());
    for (s = 3; !line && s < 5; s++) if (!lf_step(z, rank, s) || !lf_step(twin, rank, s)) line = __LINE__;
    if (!line) {
        n0 = lf_state(z, a, b, before, sizeof before);
        n1 = lf_state(twin, a2, b2, after, sizeof after);
        if (n1 != n0 || memcmp(before, after, n0) != 0) {
            fprintf(stderr, "rank %d: after a failed load and a good one, the run differs from its twin's\n", rank);
            line = __LINE__;
        }
    }
    if (capex_comm_barrier(c) != CAPEX_OK && !line) line = __LINE__; /* every rank read the file */
    if (rank == 0) remove(path);
    remove(bad);
    capex_zero_destroy(z);
    capex_zero_destroy(twin);
    return line;
}
/* Mode 12: rank 1 calls capex_zero_save_file while the others load: every
   rank must fail (no rank commits a load or writes a file), in step. */
static int save_vs_load_check(capex_comm *c, int rank) {
    static unsigned char before[8192], after[8192];
    float a[40];
    uint16_t b[24];
    capex_zero *z = NULL;
    char path[300], other[300];
    int line = 0;
    size_t n0, n1;
    capex_result r;
    snprintf(path, sizeof path, "%.250s.sl", g_ckpt[0]);
    snprintf(other, sizeof other, "%.250s.sl2", g_ckpt[0]);
    if (!lf_create(c, &z, a, b)) return __LINE__;
    if (capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) != CAPEX_OK || !lf_step(z, rank, 0)) return __LINE__;
    n0 = lf_state(z, a, b, before, sizeof before);
    r = rank == 1 ? capex_zero_save_file(z, other, CAPEX_OPTIM_STATE_PARAMS) : capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS);
    if (r == CAPEX_OK || !strstr(capex_last_error(), "same calls")) {
        fprintf(stderr, "rank %d: %s while another rank %s: %s (%s)\n", rank, rank == 1 ? "save" : "load",
                rank == 1 ? "loads" : "saves", capex_result_string(r), capex_last_error());
        line = __LINE__;
    }
    n1 = lf_state(z, a, b, after, sizeof after);
    if (!line && (n1 != n0 || memcmp(before, after, n0) != 0)) line = __LINE__;
    if (!line && capex_comm_barrier(c) != CAPEX_OK) line = __LINE__; /* in step */
    if (!line && (r = capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS)) != CAPEX_OK) line = __LINE__;
    if (capex_comm_barrier(c) != CAPEX_OK && !line) line = __LINE__;
    if (rank == 0) { remove(path); remove(other); }
    capex_zero_destroy(z);
    return line;
}
static int tcp_body(int rank, int world, int port, int mode) {
    capex_comm c;
    char why[400] = "";
    int line = 0;
    if (!tcp_comm(&c, rank, world, port)) { fprintf(stderr, "rank %d: %s\n", rank, capex_last_error()); return __LINE__; }
    if (mode == 0 || mode == 2 || mode == 3) {
        char sgd_in[300], sgd_out[300], novo_in[300], novo_out[300];
        snprintf(novo_in, sizeof novo_in, "%.250s.novo", g_ckpt[0]);
        snprintf(novo_out, sizeof novo_out, "%.250s.novo", g_ckpt[2]);
        snprintf(sgd_in, sizeof sgd_in, "%.250s.sgd", g_ckpt[0]);
        snprintf(sgd_out, sizeof sgd_out, "%.250s.sgd", g_ckpt[2]);
        if (mode == 0) line = zero_check_all(&c, why, sizeof why);
        if (mode == 2) {
            line = zero_check_ckpt(&c, 2, CAPEX_OPTIM_ADAM, NULL, g_ckpt[0], why, sizeof why);
            if (!line) line = zero_check_ckpt(&c, 1, CAPEX_OPTIM_SGD, NULL, sgd_in, why, sizeof why);
            if (!line) line = zero_check_ckpt(&c, 2, CAPEX_OPTIM_NOVOGRAD, NULL, novo_in, why, sizeof why);
        }
        if (mode == 3) {
            line = zero_check_ckpt(&c, 1, CAPEX_OPTIM_ADAM, g_ckpt[0], g_ckpt[2], why, sizeof why);
            if (!line) line = zero_check_ckpt(&c, 2, CAPEX_OPTIM_SGD, sgd_in, sgd_out, why, sizeof why);
            if (!line) line = zero_check_ckpt(&c, 1, CAPEX_OPTIM_NOVOGRAD, novo_in, novo_out, why, sizeof why);
        }
        if (line) fprintf(stderr, "rank %d of %d (mode %d): zero_check.h:%d: %s\n", rank, world, mode, line, why);
    } else if (mode == 5) { /* rank 0 calls capex_zero_save without a writer */
        float w[40];
        capex_zero_param p[1];
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r;
        char path[300];
        save_case_setup(w, p, &od, path, ".nw");
        if (capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) != CAPEX_OK) line = __LINE__;
        r = line ? CAPEX_OK : capex_zero_save(z, NULL, NULL, 0);
        if (!line && (rank == 0 ? r != CAPEX_ERR_INVALID_ARG || !strstr(capex_last_error(), "needs a writer") : r != CAPEX_OK)) {
            fprintf(stderr, "rank %d: save without a writer on rank 0: %s (%s)\n", rank, capex_result_string(r), capex_last_error());
            line = __LINE__;
        }
        /* the refusal left every rank in step: collectives and a real save still work */
        if (!line && (r = capex_comm_barrier(&c)) != CAPEX_OK) line = __LINE__;
        if (!line && (r = capex_zero_save_file(z, path, 0)) != CAPEX_OK) line = __LINE__;
        if (line && r != CAPEX_OK) fprintf(stderr, "rank %d: %s\n", rank, capex_last_error());
        if (rank == 0) remove(path);
        capex_zero_destroy(z);
    } else if (mode == 7) { /* save_file: rank 0 has no memory for its writer */
        float w[40];
        capex_zero_param p[1];
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r;
        char path[300];
        save_case_setup(w, p, &od, path, ".oom");
        /* the comm's hang guard is the check's limit: only a rank that left at
           once could leave the others waiting it out (CAPEX_ERR_TIMEOUT, a failure) */
        if (capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) != CAPEX_OK) line = __LINE__;
        if (rank == 0) g_fail_alloc_size = sizeof(capex_state_writer);
        r = line ? CAPEX_OK : capex_zero_save_file(z, path, 0);
        g_fail_alloc_size = 0;
        if (!line && (r != CAPEX_ERR_OUT_OF_MEMORY || !strstr(capex_last_error(), rank ? "rank 0 could not save" : "out of memory"))) {
            fprintf(stderr, "rank %d: save_file, rank 0's writer out of memory: %s (%s)\n", rank, capex_result_string(r),
                    capex_last_error());
            line = __LINE__;
        }
        /* in step: a barrier and a real save work on every rank */
        if (!line && (r = capex_comm_barrier(&c)) != CAPEX_OK) line = __LINE__;
        if (!line && (r = capex_zero_save_file(z, path, 0)) != CAPEX_OK) line = __LINE__;
        if (line && r != CAPEX_OK) fprintf(stderr, "rank %d: %s\n", rank, capex_last_error());
        if (rank == 0) remove(path);
        capex_zero_destroy(z);
    } else if (mode == 8 || mode == 9) { /* one rank out of memory: 8 in save before its all-gathers, 9 in create after its broadcast */
        float w[40];
        capex_zero_param p[1];
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r = CAPEX_OK;
        char path[300], suffix[8];
        snprintf(suffix, sizeof suffix, ".oom%d", mode);
        save_case_setup(w, p, &od, path, suffix);
        /* the comm's hang guard is the check's limit: only a rank that left at
           once could leave the others waiting it out (CAPEX_ERR_TIMEOUT, a failure) */
        if (mode == 8 && capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) != CAPEX_OK) line = __LINE__;
        if (rank == g_oom_rank) g_fail_alloc_size = g_oom_size;
        if (!line) r = mode == 8 ? capex_zero_save_file(z, path, 0) : capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL);
        if (!line && g_fail_alloc_size) { /* the chosen allocation never came: the test is wrong, not the library */
            fprintf(stderr, "rank %d: no allocation of %zu bytes (mode %d)\n", rank, g_oom_size, mode);
            line = __LINE__;
        }
        g_fail_alloc_size = 0;
        if (!line && !oom_verdict_ok(rank, r)) {
            fprintf(stderr, "rank %d: rank %d out of memory (%zu bytes) in %s: %s (%s)\n", rank, g_oom_rank, g_oom_size,
                    mode == 8 ? "save" : "create", capex_result_string(r), capex_last_error());
            line = __LINE__;
        }
        if (!line && mode == 9 && z) line = __LINE__; /* no rank keeps a zero its peers lack */
        /* in step: a barrier, then (9) a create and a real save work on every rank */
        if (!line && (r = capex_comm_barrier(&c)) != CAPEX_OK) line = __LINE__;
        if (!line && mode == 9 && (r = capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL)) != CAPEX_OK) line = __LINE__;
        if (!line && (r = capex_zero_save_file(z, path, 0)) != CAPEX_OK) line = __LINE__;
        if (line && r != CAPEX_OK) fprintf(stderr, "rank %d: %s\n", rank, capex_last_error());
        if (rank == 0) remove(path);
        capex_zero_destroy(z);
    } else if (mode == 10) {
        line = zero_sum_check(&c, rank, world);
    } else if (mode == 11) {
        line = load_fail_check(&c, rank);
    } else if (mode == 12) {
        line = save_vs_load_check(&c, rank);
    } else if (mode == 6) { /* save_file with a NULL path on one rank only (1 or 0) */
        float w[40];
        capex_zero_param p[1];
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r, want;
        char path[300];
        int bad = g_null_path_rank;
        save_case_setup(w, p, &od, path, ".np");
        /* the comm's hang guard is the check's limit: only a rank that left at
           once could leave the others waiting it out (CAPEX_ERR_TIMEOUT, a failure) */
        if (capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) != CAPEX_OK) line = __LINE__;
        r = line ? CAPEX_OK : capex_zero_save_file(z, rank == bad ? NULL : path, 0);
        /* only rank 0 writes: a path elsewhere is not needed; rank 0's missing one fails every rank alike */
        want = bad == 0 ? CAPEX_ERR_INVALID_ARG : CAPEX_OK;
        if (!line && r != want) {
            fprintf(stderr, "rank %d: save_file, NULL path on rank %d: %s (%s)\n", rank, bad, capex_result_string(r),
                    capex_last_error());
            line = __LINE__;
        }
        if (!line && (r = capex_comm_barrier(&c)) != CAPEX_OK) line = __LINE__; /* still in step */
        if (rank == 0) remove(path);
        capex_zero_destroy(z);
    } else if (mode == 4) { /* save_file: every rank gets rank 0's status once the file is there */
        float w[40];
        capex_zero_param p[1];
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_result r;
        char path[300];
        int i;
        save_case_setup(w, p, &od, path, ".sf");
        if (capex_zero_create(&z, &c, p, 1, &od, NULL, 1, NULL) != CAPEX_OK) line = __LINE__;
        if (!line && (r = capex_zero_save_file(z, "/nonexistent-capex-dir/zero.ckpt", 0)) == CAPEX_OK) {
            fprintf(stderr, "rank %d: save_file into a missing directory returned OK\n", rank);
            line = __LINE__;
        }
        for (i = 0; !line && i < 3; i++) { /* saved, then read by every rank at once */
            if ((r = capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS)) != CAPEX_OK ||
                (r = capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS)) != CAPEX_OK) {
                fprintf(stderr, "rank %d: save then load: %s\n", rank, capex_last_error());
                line = __LINE__;
            }
            if (!line && capex_comm_barrier(&c) != CAPEX_OK) line = __LINE__; /* every load done: the next save makes it anew */
            if (rank == 0) remove(path);
        }
        capex_zero_destroy(z);
    } else {
        float w[4][300];
        capex_zero_param p[4];
        capex_zero_desc d;
        capex_optim_desc od;
        capex_zero *z = NULL;
        int i;
        capex_result r, res, want = world == 2 ? CAPEX_ERR_TIMEOUT : CAPEX_ERR_COMM;
        memset(w, 0, sizeof w);
        for (i = 0; i < 4; i++) one_param(&p[i], w[i], 300);
        capex_zero_desc_init(&d);
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        if (capex_zero_create(&z, &c, p, 4, &od, NULL, 1, &d) != CAPEX_OK) {
            if (world == 2) close(g_hold[1]);
            capex_comm_destroy(&c);
            return __LINE__;
        }
        if (rank == 1 && world == 2) { /* stalls until rank 0 has returned (EOF), a hang guard at most */
            struct pollfd pf;
            char ch;
            close(g_hold[1]);
            pf.fd = g_hold[0]; pf.events = POLLIN; pf.revents = 0;
            while (poll(&pf, 1, (int)(CT_HANG_GUARD_S * 1000)) == 1 && read(g_hold[0], &ch, 1) > 0) {}
        }
        if (rank == 1) _exit(0); /* dies without a word */
        if (world == 2) c.timeout_s = 0.5;
        for (i = 3, r = CAPEX_OK; i >= 0; i--) /* the TCP comm reduces a bucket when it fills: the first error counts */
            if ((res = capex_zero_grad_ready(z, (size_t)i)) != CAPEX_OK && r == CAPEX_OK) {
                r = res;
                snprintf(why, sizeof why, "%.300s", capex_last_error());
            }
        if ((res = capex_zero_finalize(z)) == CAPEX_OK || r == CAPEX_OK) { /* OK after an error: wrong too */
            r = res;
            snprintf(why, sizeof why, "%.300s", capex_last_error());
        }
        if (r != want) {
            fprintf(stderr, "rank %d: backward with rank 1 %s: %s: %s\n", rank, world == 2 ? "stalled" : "dead",
                    capex_result_string(r), why);
            line = __LINE__;
        } else if (capex_zero_step(z, 1.0f, 1.0f, 0) != CAPEX_ERR_COMM) line = __LINE__; /* refused after the failure */
        capex_zero_destroy(z);
        if (world == 2) close(g_hold[1]); /* lets rank 1 go */
    }
    capex_comm_destroy(&c);
    return line;
}

static int tcp_world(int world, int mode, int *codes) { return fork_world(world, mode, codes, tcp_body); }

/* tcp_body's mode in worlds of lo..hi ranks: every rank must pass. */
static void tcp_worlds_pass(ct_state *ct, int lo, int hi, int mode) {
    int world, codes[8], r, i;
    for (world = lo; world <= hi; world++) {
        memset(codes, 0, sizeof codes);
        r = tcp_world(world, mode, codes);
        CT_CHECK(r == 0, "world %d: rank 0 failed at line %d (its stderr says why)", world, r);
        for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d: rank %d exit %d", world, i, codes[i]);
    }
}

CT_TEST(tcp_worlds_match_ddp_and_optim) { tcp_worlds_pass(ct, 2, 4, 0); }

CT_TEST(tcp_gradient_sum_and_average_match_float64) { tcp_worlds_pass(ct, 2, 3, 10); }

/* No clock: a dead rank is told by EOF (the others' deadline is the hang
   guard), a stalled one by a deadline that fires while it is held. */
CT_TEST(tcp_dead_or_stalled_rank_fails_the_others) {
    int codes[8], r, i;
    memset(codes, 0, sizeof codes);
    r = tcp_world(3, 1, codes);
    CT_CHECK(r == 0, "rank 1 dead: rank 0: line %d: %.300s", r, capex_last_error());
    for (i = 2; i < 3; i++) CT_CHECK(codes[i] == 0, "rank 1 dead: rank %d exit %d", i, codes[i]);
    CT_CHECK(pipe(g_hold) == 0, "pipe");
    r = tcp_world(2, 1, codes);
    close(g_hold[0]);
    g_hold[0] = g_hold[1] = -1;
    CT_CHECK(r == 0, "rank 1 stalled: rank 0: line %d: %.300s", r, capex_last_error());
    CT_CHECK(codes[1] == 0, "rank 1 stalled: exit %d", codes[1]);
}

/* rank 0 writes capex_zero_save_file's file: a failed write must fail
   every rank (not only rank 0, the others going on as if saved), and no
   rank may return before the file is there (a load may follow at once). */
CT_TEST(tcp_save_file_status_on_every_rank) {
    int codes[8], r;
    memset(codes, 0, sizeof codes);
    snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_sf", (int)getpid());
    r = tcp_world(3, 4, codes);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "rank 0 line %d, ranks 1, 2 exit %d %d (stderr says why)", r,
             codes[1], codes[2]);
}

/* capex_zero_save_file with a NULL path on one rank only: a rank other than
   0 needs none (it writes nothing) and saves with the others; rank 0 without
   one fails every rank alike after the collectives. Either way no rank is
   left waiting in the save's all-gathers (a NULL path on any rank was
   refused at once, its peers timing out there). */
CT_TEST(tcp_save_file_null_path_on_one_rank) {
    int codes[8], r;
    for (g_null_path_rank = 1; g_null_path_rank >= 0; g_null_path_rank--) {
        memset(codes, 0, sizeof codes);
        snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_np", (int)getpid());
        r = tcp_world(3, 6, codes);
        CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "NULL on rank %d: rank 0 line %d, ranks 1, 2 exit %d %d "
                 "(stderr says why)", g_null_path_rank, r, codes[1], codes[2]);
    }
}

/* capex_zero_save_file with no memory for rank 0's writer: every rank gets
   rank 0's CAPEX_ERR_OUT_OF_MEMORY and the ranks stay in step (rank 0
   returned at once and left its peers in the save's all-gathers). */
CT_TEST(tcp_save_file_writer_oom) {
    int codes[8], r;
    memset(codes, 0, sizeof codes);
    snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_oom", (int)getpid());
    r = tcp_world(3, 7, codes);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "rank 0 line %d, ranks 1, 2 exit %d %d (stderr says why)", r,
             codes[1], codes[2]);
}

/* One rank out of memory in capex_zero_save before its all-gathers (its
   pack or gather buffer, or rank 0's unsharded copy): it returned at once,
   leaving its peers waiting there until their deadline or pairing them with
   its next call. Now a small agreement first: that rank gets
   CAPEX_ERR_OUT_OF_MEMORY, its peers CAPEX_ERR_COMM naming it, all in step.
   Sizes for one 40-float param on 3 ranks: shards of 16 floats. */
typedef struct { int rank; size_t size; const char *what; } oom_case;
/* Runs TCP world mode `mode` (3 ranks) once per case, that case's rank out
   of memory at its allocation; every rank must pass (see the mode's body). */
static void tcp_oom_cases(ct_state *ct, const oom_case *cases, size_t n, int mode, const char *tag) {
    int codes[8], r;
    size_t k;
    for (k = 0; k < n; k++) {
        memset(codes, 0, sizeof codes);
        g_oom_rank = cases[k].rank;
        g_oom_size = cases[k].size;
        snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_%s", (int)getpid(), tag);
        r = tcp_world(3, mode, codes);
        CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "%s on rank %d: rank 0 line %d, ranks 1, 2 exit %d %d "
                 "(stderr says why)", cases[k].what, cases[k].rank, r, codes[1], codes[2]);
    }
}

CT_TEST(tcp_save_one_rank_out_of_memory_fails_every_rank) {
    static const oom_case cases[] = {
        {1, sizeof(float) * 17, "pack buffer"},
        {2, sizeof(float) * (16 * 3 + 1), "gather buffer"},
        {0, sizeof(capex_optim_param) * 2, "rank 0's unsharded copy"},
    };
    tcp_oom_cases(ct, cases, sizeof cases / sizeof cases[0], 8, "so");
}

/* One rank out of memory in capex_zero_create after the parameter
   broadcast (its bucket buffer, its optimizer): it returned the error while
   its peers returned OK with a zero whose next collective paired with
   something else. Now every rank fails (the last agreement) and stays in step. */
CT_TEST(tcp_create_one_rank_out_of_memory_after_broadcast) {
    static const oom_case cases[] = {
        {1, sizeof(float) * 16 * 3, "bucket buffer"},
        {2, sizeof(capex_optim), "optimizer"},
        {0, sizeof(capex_optim_param) * 2, "optimizer param list"},
    };
    tcp_oom_cases(ct, cases, sizeof cases / sizeof cases[0], 9, "co");
}

/* capex_zero_save refuses rank 0 without a writer after the collectives it
   takes part in: refused at once, rank 0 left its peers waiting in the
   save's all-gathers, to fail at the deadline or pair with its next call. */
CT_TEST(tcp_save_without_writer_keeps_ranks_in_step) {
    int codes[8], r;
    memset(codes, 0, sizeof codes);
    snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_nw", (int)getpid());
    r = tcp_world(3, 5, codes);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "rank 0 line %d, ranks 1, 2 exit %d %d (stderr says why)", r,
             codes[1], codes[2]);
}

/* capex_zero_load is collective: one rank's failed load (a truncated file,
   a missing one, unknown flags) fails every rank with nothing changed, the
   ranks in step (before 2026-11-28 its peers returned OK, loaded, and their
   next collective waited on a rank that was not there); a good load then
   steps bit for bit as a run that never failed. Each rank of a world of 3
   in turn. */
CT_TEST(tcp_load_one_rank_fails_every_rank) {
    int codes[8], r;
    for (g_bad_load_rank = 0; g_bad_load_rank < 3; g_bad_load_rank++) {
        memset(codes, 0, sizeof codes);
        snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_lf", (int)getpid());
        r = tcp_world(3, 11, codes);
        CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "rank %d's load fails: rank 0 line %d, ranks 1, 2 exit %d %d "
                 "(stderr says why)", g_bad_load_rank, r, codes[1], codes[2]);
    }
}

/* One rank in capex_zero_save while the others load: the agreement's call
   tag differs, so every rank fails at once with nothing changed and stays
   in step (before, the loaders returned OK without a word and rank 1's
   save paired with their next collective). */
CT_TEST(tcp_save_while_others_load_fails_every_rank) {
    int codes[8], r;
    memset(codes, 0, sizeof codes);
    snprintf(g_ckpt[0], sizeof g_ckpt[0], "/tmp/capex_test_zero_%d_sl", (int)getpid());
    r = tcp_world(3, 12, codes);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "rank 0 line %d, ranks 1, 2 exit %d %d (stderr says why)", r,
             codes[1], codes[2]);
}

/* Saved by 3 ranks, loaded by 1 and by 2 (resharding), each time checked
   against the unsharded optimizer loading the same file; the file equals
   the unsharded optimizer's byte for byte. Then damaged and mismatched
   files are refused with nothing changed. */
CT_TEST(checkpoints_reshard_across_world_sizes) {
    int codes[8], r, i, k;
    capex_comm c;
    char why[400] = "", sgd[2][300];
    int line;
    for (k = 0; k < 3; k++) snprintf(g_ckpt[k], sizeof g_ckpt[k], "/tmp/capex_test_zero_%d_%d.safetensors", (int)getpid(), k);
    memset(codes, 0, sizeof codes);
    r = tcp_world(3, 2, codes);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "world 3 save: rank 0 line %d, exits %d %d (stderr says why)", r,
             codes[1], codes[2]);
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    snprintf(sgd[0], sizeof sgd[0], "%.250s.sgd", g_ckpt[0]);
    snprintf(sgd[1], sizeof sgd[1], "%.250s.sgd", g_ckpt[1]);
    line = zero_check_ckpt(&c, 2, CAPEX_OPTIM_ADAM, g_ckpt[0], g_ckpt[1], why, sizeof why);
    if (!line) line = zero_check_ckpt(&c, 1, CAPEX_OPTIM_SGD, sgd[0], sgd[1], why, sizeof why);
    CT_CHECK(line == 0, "world 1 load: zero_check.h:%d: %s", line, why);
    memset(codes, 0, sizeof codes);
    r = tcp_world(2, 3, codes);
    CT_CHECK(r == 0 && codes[1] == 0, "world 2 load: rank 0 line %d, rank 1 exit %d (stderr says why)", r, codes[1]);
    {   /* a damaged file and another model's file: refused, nothing changed */
        capex_zero_param p[ZC_NP];
        capex_zero_desc zd;
        capex_optim_desc od;
        capex_zero *z = NULL;
        float w[ZC_NP][300], before[ZC_NP][300];
        FILE *f = fopen(g_ckpt[1], "rb"), *o;
        char trunc[300], buf[4096];
        size_t n, total = 0;
        capex_result lr;
        snprintf(trunc, sizeof trunc, "%.250s.trunc", g_ckpt[1]);
        o = fopen(trunc, "wb");
        CT_CHECK(f && o, "files");
        while ((n = fread(buf, 1, sizeof buf, f)) > 0 && total < 5000) { fwrite(buf, 1, n, o); total += n; }
        fclose(f); fclose(o);
        for (i = 0; i < ZC_NP; i++) {
            size_t e;
            for (e = 0; e < 300; e++) w[i][e] = (float)(i * 1000 + (int)e);
            p[i].data = w[i]; p[i].numel = zc_numel[i]; p[i].dtype = CAPEX_F32; p[i].group = (size_t)(i % 2);
        }
        memcpy(before, w, sizeof w);
        capex_zero_desc_init(&zd);
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        CT_CHECK(capex_zero_create(&z, &c, p, ZC_NP, &od, NULL, 2, &zd) == CAPEX_OK, "create: %s", capex_last_error());
        lr = capex_zero_load_file(z, trunc, CAPEX_OPTIM_STATE_PARAMS);
        CT_CHECK(lr != CAPEX_OK && memcmp(w, before, sizeof w) == 0, "truncated: %s '%s'", capex_result_string(lr),
                 capex_last_error());
        p[0].numel = 36;
        capex_zero_destroy(z);
        z = NULL;
        CT_CHECK(capex_zero_create(&z, &c, p, ZC_NP, &od, NULL, 2, &zd) == CAPEX_OK, "create: %s", capex_last_error());
        lr = capex_zero_load_file(z, g_ckpt[1], 0);
        CT_CHECK(lr == CAPEX_ERR_SIZE_MISMATCH && memcmp(w, before, sizeof w) == 0, "numel 36 vs 37: %s '%s'",
                 capex_result_string(lr), capex_last_error());
        capex_zero_destroy(z);
        remove(trunc);
    }
    capex_comm_destroy(&c);
    for (k = 0; k < 3; k++) {
        char sp[300];
        snprintf(sp, sizeof sp, "%.250s.sgd", g_ckpt[k]);
        remove(g_ckpt[k]);
        remove(sp);
        snprintf(sp, sizeof sp, "%.250s.novo", g_ckpt[k]);
        remove(sp);
    }
}

/* A checkpoint's optimizer-wide settings (LAMB's max_grad_norm and
   use_nvlamb, NovoGrad's moment modes) come from the file, as
   capex_optim_load takes them: a zero built with other settings must then
   step as the unsharded optimizer that loaded the same file. */
CT_TEST(load_takes_the_files_optimizer_settings) {
    static const float g0[5] = {3.0f, -4.0f, 0.5f, 2.0f, -1.0f}, g1[3] = {1.5f, -2.5f, 0.25f};
    capex_comm c;
    int kind;
    char path[300];
    snprintf(path, sizeof path, "/tmp/capex_zero_modes_%d", (int)getpid());
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    for (kind = 0; kind < 2; kind++) {
        capex_optim_desc sd, od;
        capex_optim *saver = NULL, *ref = NULL;
        capex_optim_param op[2];
        capex_zero_param zp[2];
        capex_zero_desc zd;
        capex_zero *z = NULL;
        float ws[8], wr[8], wz[8], gr[8];
        void *gz;
        int i, s;
        capex_optim_desc_init(&sd, kind ? CAPEX_OPTIM_NOVOGRAD : CAPEX_OPTIM_LAMB);
        od = sd; /* the run that resumes: built with the defaults */
        if (kind == 0) { sd.max_grad_norm = 0.5f; sd.use_nvlamb = 1; sd.defaults.weight_decay = 0.0f; }
        else { sd.reg_inside_moment = 1; sd.init_zero = 1; }
        od.defaults.weight_decay = sd.defaults.weight_decay;
        for (i = 0; i < 8; i++) ws[i] = wr[i] = wz[i] = 0.25f * (float)(i + 1) - 1.0f;
        memcpy(gr, g0, sizeof g0); memcpy(gr + 5, g1, sizeof g1);
        capex_optim_param_init(&op[0]); capex_optim_param_init(&op[1]);
        op[0].param = ws; op[0].grad = gr; op[0].numel = 5;
        op[1].param = ws + 5; op[1].grad = gr + 5; op[1].numel = 3;
        CT_CHECK(capex_optim_create(&sd, &saver) == CAPEX_OK && capex_optim_add_group(saver, NULL, op, 2, NULL) == CAPEX_OK,
                 "saver: %s", capex_last_error());
        CT_CHECK(capex_optim_step(saver, 1.0f, 1.0f, 0) == CAPEX_OK, "saver step: %s", capex_last_error());
        CT_CHECK(capex_optim_save_file(saver, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save: %s", capex_last_error());
        capex_optim_destroy(saver);
        op[0].param = wr; op[1].param = wr + 5;
        CT_CHECK(capex_optim_create(&od, &ref) == CAPEX_OK && capex_optim_add_group(ref, NULL, op, 2, NULL) == CAPEX_OK,
                 "ref: %s", capex_last_error());
        one_param(&zp[0], wz, 5); one_param(&zp[1], wz + 5, 3);
        capex_zero_desc_init(&zd);
        CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, &zd) == CAPEX_OK, "zero: %s", capex_last_error());
        CT_CHECK(capex_optim_load_file(ref, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "ref load: %s", capex_last_error());
        CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "zero load: %s", capex_last_error());
        for (s = 0; s < 2; s++) {
            for (i = 1; i >= 0; i--) {
                CT_CHECK((gz = capex_zero_grad(z, (size_t)i)) != NULL, "grad: %s", capex_last_error());
                memcpy(gz, i ? g1 : g0, i ? sizeof g1 : sizeof g0);
                CT_CHECK(capex_zero_grad_ready(z, (size_t)i) == CAPEX_OK, "ready: %s", capex_last_error());
            }
            CT_CHECK(capex_zero_finalize(z) == CAPEX_OK && capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_OK &&
                     capex_zero_zero_grad(z) == CAPEX_OK, "zero step: %s", capex_last_error());
            CT_CHECK(capex_optim_step(ref, 1.0f, 1.0f, 0) == CAPEX_OK, "ref step: %s", capex_last_error());
            for (i = 0; i < 8; i++)
                CT_CHECK(memcmp(&wz[i], &wr[i], 4) == 0, "%s step %d: element %d: zero %.9g, unsharded %.9g",
                         kind ? "NovoGrad" : "LAMB", s, i, (double)wz[i], (double)wr[i]);
        }
        capex_zero_destroy(z);
        capex_optim_destroy(ref);
    }
    remove(path);
    capex_comm_destroy(&c);
}

/* An lr schedule with count_skipped on capex_zero_optim: the shards step
   as the unsharded optimizer does (its iteration count advanced by skipped
   steps too), the save holds the count and the mode, and a zero (and a
   plain optimizer) loading it continues exactly. */
static void zsched_grads(ct_state *ct, capex_zero *z, int s) {
    int i, e;
    for (i = 1; i >= 0; i--) {
        float *gz = (float *)capex_zero_grad(z, (size_t)i);
        CT_CHECK(gz != NULL, "grad: %s", capex_last_error());
        for (e = 0; e < (i ? 3 : 5); e++) gz[e] = (float)sin(0.7 * e + 1.1 * s + i);
        CT_CHECK(capex_zero_grad_ready(z, (size_t)i) == CAPEX_OK, "ready: %s", capex_last_error());
    }
}
CT_TEST(lr_schedule_count_skipped_saves_and_resumes) {
    capex_comm c;
    capex_optim_desc od;
    capex_optim *ref = NULL, *ref2 = NULL;
    capex_optim_param op[2];
    capex_zero_param zp[2];
    capex_zero *z = NULL, *z2 = NULL;
    capex_lr_schedule sch, got;
    float wr[8], wz[8], wz2[8], gr[8];
    char path[300];
    int i, s, att = 0;
    int64_t n = -1;
    snprintf(path, sizeof path, "/tmp/capex_zero_sched_%d", (int)getpid());
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.defaults.lr = 0.05f;
    capex_lr_schedule_init(&sch, CAPEX_LR_COSINE);
    sch.warmup_steps = 3; sch.total_steps = 12; sch.count_skipped = 1;
    for (i = 0; i < 8; i++) wr[i] = wz[i] = wz2[i] = 0.25f * (float)(i + 1) - 1.0f;
    capex_optim_param_init(&op[0]); capex_optim_param_init(&op[1]);
    op[0].param = wr; op[0].grad = gr; op[0].numel = 5;
    op[1].param = wr + 5; op[1].grad = gr + 5; op[1].numel = 3;
    CT_CHECK(capex_optim_create(&od, &ref) == CAPEX_OK && capex_optim_add_group(ref, NULL, op, 2, NULL) == CAPEX_OK &&
             capex_optim_set_lr_schedule(ref, &sch) == CAPEX_OK, "ref: %s", capex_last_error());
    one_param(&zp[0], wz, 5); one_param(&zp[1], wz + 5, 3);
    CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, NULL) == CAPEX_OK, "zero: %s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(capex_zero_optim(z), &sch) == CAPEX_OK, "%s", capex_last_error());
    one_param(&zp[0], wz2, 5); one_param(&zp[1], wz2 + 5, 3);
    CT_CHECK(capex_zero_create(&z2, &c, zp, 2, &od, NULL, 1, NULL) == CAPEX_OK, "zero 2: %s", capex_last_error());
    for (s = 0; s < 12; s++) {
        int skip = s == 2 || s == 3 || s == 8;
        if (s == 6) {
            CT_CHECK(capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save: %s", capex_last_error());
            CT_CHECK(capex_zero_load_file(z2, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s", capex_last_error());
            CT_CHECK(capex_optim_get_lr_schedule(capex_zero_optim(z2), &got, &att) == CAPEX_OK && att == 1 &&
                     memcmp(&got, &sch, sizeof sch) == 0 && capex_optim_get_lr_iteration(capex_zero_optim(z2), &n) ==
                     CAPEX_OK && n == 6, "loaded zero: schedule %d, iteration %lld", att, (long long)n);
            CT_CHECK(capex_optim_create(&od, &ref2) == CAPEX_OK && capex_optim_add_group(ref2, NULL, op, 2, NULL) ==
                     CAPEX_OK && capex_optim_load_file(ref2, path, 0) == CAPEX_OK &&
                     capex_optim_get_lr_iteration(ref2, &n) == CAPEX_OK && n == 6, "a plain optimizer loads it: %s",
                     capex_last_error());
            capex_optim_destroy(ref2);
            ref2 = NULL;
        }
        for (i = 0; i < 8; i++) gr[i] = (float)sin(0.7 * (i < 5 ? i : i - 5) + 1.1 * s + (i >= 5));
        zsched_grads(ct, z, s);
        if (ct->failed) break;
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK && capex_zero_step(z, 1.0f, 1.0f, skip) == CAPEX_OK &&
                 capex_zero_zero_grad(z) == CAPEX_OK, "zero step: %s", capex_last_error());
        if (s >= 6) {
            zsched_grads(ct, z2, s);
            if (ct->failed) break;
            CT_CHECK(capex_zero_finalize(z2) == CAPEX_OK && capex_zero_step(z2, 1.0f, 1.0f, skip) == CAPEX_OK &&
                     capex_zero_zero_grad(z2) == CAPEX_OK, "zero 2 step: %s", capex_last_error());
        }
        CT_CHECK(capex_optim_step(ref, 1.0f, 1.0f, skip) == CAPEX_OK, "ref step: %s", capex_last_error());
        CT_CHECK(memcmp(wz, wr, sizeof wr) == 0, "step %d: zero differs from the unsharded optimizer", s);
        CT_CHECK(s < 6 || memcmp(wz2, wr, sizeof wr) == 0, "step %d: the resumed zero differs", s);
    }
    CT_CHECK(capex_optim_get_lr_iteration(capex_zero_optim(z2), &n) == CAPEX_OK && n == 12, "iteration %lld",
             (long long)n);
    capex_zero_destroy(z);
    capex_zero_destroy(z2);
    capex_optim_destroy(ref);
    capex_comm_destroy(&c);
    remove(path);
}

/* capex_zero_save keeps rank 0's unsharded copy (the writer points into
   it) until the next save; capex_zero_save_file has written the file when it
   returns, so it must not leave the whole model's masters and moments on
   rank 0 for the rest of the run (what ZeRO saves, given back). */
CT_TEST(save_file_frees_the_unsharded_copy) {
    capex_comm c;
    capex_zero *z = NULL;
    capex_zero_param p[2];
    capex_optim_desc od;
    capex_state_writer *w = NULL;
    float a[40];
    uint16_t b[24];
    char path[300];
    int i;
    snprintf(path, sizeof path, "/tmp/capex_zero_savefree_%d", (int)getpid());
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    for (i = 0; i < 40; i++) a[i] = 0.5f * (float)i;
    for (i = 0; i < 24; i++) b[i] = capex_f32_to_bf16(0.25f * (float)i);
    one_param(&p[0], a, 40);
    p[1].data = b; p[1].numel = 24; p[1].dtype = CAPEX_BF16; p[1].group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, NULL) == CAPEX_OK, "create: %s", capex_last_error());
    CT_CHECK(capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save_file: %s", capex_last_error());
    CT_CHECK(z->save_tmp == NULL && z->save_masters == NULL, "the unsharded copy outlived save_file");
    CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s", capex_last_error());
    /* capex_zero_save with the caller's writer: kept until the caller has written */
    CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "writer");
    CT_CHECK(capex_zero_save(z, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK && z->save_tmp != NULL, "save: %s",
             capex_last_error());
    CT_CHECK(capex_state_write_file(w, path) == CAPEX_OK, "write: %s", capex_last_error());
    capex_state_writer_destroy(w);
    CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s", capex_last_error());
    capex_zero_destroy(z);
    capex_comm_destroy(&c);
    remove(path);
}

/* A load cut by an I/O error (the file shrunk under the open reader) after it
   read the first params' data (CAPEX_OPTIM_STATE_PARAMS) changes nothing: the
   whole state is read into temporary storage before every rank agrees to
   take it (before 2026-11-28 it stepped on, half the weights from the file;
   then it was refused step and save, half-loaded, until a good load). */
CT_TEST(load_io_error_midway_changes_nothing) {
    capex_comm c;
    capex_zero *z = NULL;
    capex_zero_param p[2];
    capex_optim_desc od;
    capex_state_reader *rd = NULL;
    float a[40];
    static uint16_t b[4000], b0[4000]; /* the model copy read last, beyond the reader's stdio buffer */
    static unsigned char mom[2][65536];
    size_t nm[2];
    static char buf[65536];
    char path[300], cut[300];
    int i;
    size_t n;
    FILE *f, *o;
    snprintf(path, sizeof path, "/tmp/capex_zero_ioload_%d", (int)getpid());
    snprintf(cut, sizeof cut, "%.250s.cut", path);
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    for (i = 0; i < 40; i++) a[i] = 0.5f * (float)i;
    for (i = 0; i < 4000; i++) b[i] = capex_f32_to_bf16(0.25f * (float)(i % 64));
    one_param(&p[0], a, 40);
    p[1].data = b; p[1].numel = 4000; p[1].dtype = CAPEX_BF16; p[1].group = 0;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, NULL) == CAPEX_OK, "create: %s", capex_last_error());
    CT_CHECK(capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save_file: %s", capex_last_error());
    CT_CHECK(capex_state_reader_open_file(path, 0, NULL, &rd) == CAPEX_OK, "open: %s", capex_last_error());
    if (ct->failed) goto out;
    /* cut under the open reader: the f32 param is read, the last tensor (param1.model, bf16) is not */
    f = fopen(path, "rb");
    n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CT_CHECK(n > 10 && n < sizeof buf, "file of %zu bytes", n);
    o = fopen(path, "wb");
    CT_CHECK(o && fwrite(buf, 1, n - 10, o) == n - 10, "rewriting %s", path);
    if (o) fclose(o);
    for (i = 0; i < 40; i++) a[i] = -1.0f;
    memcpy(b0, b, sizeof b);
    nm[0] = zero_moments(z, mom[0], sizeof mom[0]);
    CT_CHECK(capex_zero_load(z, rd, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_IO, "load: %.300s", capex_last_error());
    capex_state_reader_close(rd);
    rd = NULL;
    nm[1] = zero_moments(z, mom[1], sizeof mom[1]);
    for (i = 0; i < 40; i++) CT_CHECK(a[i] == -1.0f, "a[%d] = %g: written by a failed load", i, (double)a[i]);
    CT_CHECK(memcmp(b, b0, sizeof b) == 0, "the bf16 param was changed by a failed load");
    CT_CHECK(nm[0] == nm[1] && nm[0] <= sizeof mom[0] && memcmp(mom[0], mom[1], nm[0]) == 0,
             "masters, moments or steps changed by a failed load");
    CT_CHECK(capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_OK, "step after a failed load: %.300s", capex_last_error());
    /* a good load makes it whole again */
    o = fopen(path, "wb");
    CT_CHECK(o && fwrite(buf, 1, n, o) == n, "rewriting %s", path);
    if (o) fclose(o);
    CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s", capex_last_error());
    CT_CHECK(capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_OK, "step after a good load: %.300s", capex_last_error());
    CT_CHECK(capex_zero_save_file(z, cut, 0) == CAPEX_OK, "save after a good load: %.300s", capex_last_error());
    /* flags it does not know: refused (every rank, before the save's collectives), not ignored */
    CT_CHECK(capex_zero_save_file(z, cut, 2u) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "flags"),
             "unknown save flags: %.300s", capex_last_error());
    CT_CHECK(capex_zero_load_file(z, path, 2u | CAPEX_OPTIM_STATE_PARAMS) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "flags"), "unknown load flags: %.300s", capex_last_error());
out:
    capex_state_reader_close(rd);
    capex_zero_destroy(z);
    capex_comm_destroy(&c);
    remove(path);
    remove(cut);
}

/* bf16 stochastic rounding (supported by create) through a checkpoint: 4
   steps == 2 + save + load into a fresh zero (built without it, another
   seed: the file's count) + 2, bit for bit, as the unsharded optimizer
   resumes. */
CT_TEST(stochastic_rounding_resumes) {
    capex_comm c;
    capex_optim_desc od, od2;
    capex_zero_desc zd;
    capex_zero_param zp[2];
    uint16_t full[2][40], part[2][40];
    char path[300];
    int run, s, i, e, n[2] = {40, 13};
    snprintf(path, sizeof path, "/tmp/capex_zero_sr_%d", (int)getpid());
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.stochastic_rounding = 1; od.seed = 0x1234567887654321ull; od.defaults.lr = 3e-2f;
    capex_zero_desc_init(&zd);
    zd.bucket_bytes = 32;
    for (run = 0; run < 2; run++) { /* 0: 4 steps in one go; 1: 2, save, a fresh zero loads, 2 */
        uint16_t (*w)[40] = run ? part : full;
        capex_zero *z = NULL;
        for (i = 0; i < 2; i++) {
            for (e = 0; e < n[i]; e++) w[i][e] = capex_f32_to_bf16(0.01f * (float)(e * 7 % 23) - 0.1f);
            zp[i].data = w[i]; zp[i].numel = (size_t)n[i]; zp[i].dtype = CAPEX_BF16; zp[i].group = 0;
        }
        CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, &zd) == CAPEX_OK, "create: %s", capex_last_error());
        for (s = 0; s < 4; s++) {
            if (run && s == 2) {
                CT_CHECK(capex_zero_save_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "save: %s", capex_last_error());
                capex_zero_destroy(z);
                z = NULL;
                memset(part, 0, sizeof part); /* the file restores them, and the seed and mode: */
                od2 = od; od2.stochastic_rounding = 0; od2.seed = 99;
                CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od2, NULL, 1, &zd) == CAPEX_OK, "create: %s", capex_last_error());
                CT_CHECK(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "load: %s %s",
                         capex_result_string(capex_zero_load_file(z, path, CAPEX_OPTIM_STATE_PARAMS)), capex_last_error());
            }
            for (i = 1; i >= 0; i--) {
                uint16_t *g = (uint16_t *)capex_zero_grad(z, (size_t)i);
                CT_CHECK(g != NULL, "grad: %s", capex_last_error());
                for (e = 0; e < n[i]; e++) g[e] = capex_f32_to_bf16(0.03f * (float)((e * 5 + s * 3 + i) % 11) - 0.15f);
                CT_CHECK(capex_zero_grad_ready(z, (size_t)i) == CAPEX_OK, "ready: %s", capex_last_error());
            }
            CT_CHECK(capex_zero_finalize(z) == CAPEX_OK && capex_zero_step(z, 1.0f, 1.0f, 0) == CAPEX_OK &&
                     capex_zero_zero_grad(z) == CAPEX_OK, "step: %s", capex_last_error());
        }
        capex_zero_destroy(z);
    }
    for (i = 0; i < 2; i++)
        for (e = 0; e < n[i]; e++)
            CT_CHECK(full[i][e] == part[i][e], "param %d element %d: 0x%04x uninterrupted, 0x%04x resumed", i, e, full[i][e],
                     part[i][e]);
    remove(path);
    capex_comm_destroy(&c);
}

/* SGD whose momentum is turned off after create (set_hparams on
   capex_zero_optim) keeps its momentum buffers, as capex_optim does: the
   checkpoint holds them (a plain optimizer built with momentum loads it, the
   same buffers), and capex_zero_load restores them from a plain optimizer's
   file, so momentum turned on again resumes from them on both. */
static int zsgd_step(capex_zero *z, capex_optim *ref, float *gr, int s) {
    int i, e;
    for (e = 0; e < 8; e++) gr[e] = 0.125f * (float)((e * 5 + s * 3) % 7) - 0.375f;
    for (i = 1; i >= 0; i--) {
        float *g = (float *)capex_zero_grad(z, (size_t)i);
        if (!g) return 1;
        memcpy(g, gr + (i ? 5 : 0), (i ? 3 : 5) * sizeof(float));
        if (capex_zero_grad_ready(z, (size_t)i) != CAPEX_OK) return 1;
    }
    return capex_zero_finalize(z) != CAPEX_OK || capex_zero_step(z, 1.0f, 1.0f, 0) != CAPEX_OK ||
           capex_zero_zero_grad(z) != CAPEX_OK || capex_optim_step(ref, 1.0f, 1.0f, 0) != CAPEX_OK;
}
static int zsgd_momentum(capex_optim *o, float mom) {
    capex_optim_hparams h;
    if (capex_optim_get_hparams(o, 0, &h) != CAPEX_OK) return 1;
    h.momentum = mom;
    return capex_optim_set_hparams(o, 0, &h) != CAPEX_OK;
}
CT_TEST(sgd_momentum_turned_off_keeps_buffers_in_checkpoints) {
    capex_comm c;
    capex_optim_desc od;
    capex_zero_desc zd;
    capex_zero_param zp[2];
    capex_zero *z = NULL;
    capex_optim *ref = NULL, *plain = NULL;
    capex_optim_param op[2];
    float wz[8], wr[8], wp[8], gr[8];
    char pz[300], pr[300];
    int i, s;
    snprintf(pz, sizeof pz, "/tmp/capex_zero_mom_z_%d", (int)getpid());
    snprintf(pr, sizeof pr, "/tmp/capex_zero_mom_r_%d", (int)getpid());
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    capex_optim_desc_init(&od, CAPEX_OPTIM_SGD);
    od.defaults.lr = 0.1f; od.defaults.momentum = 0.9f;
    for (i = 0; i < 8; i++) wz[i] = wr[i] = wp[i] = 0.25f * (float)(i + 1) - 1.0f;
    capex_optim_param_init(&op[0]); capex_optim_param_init(&op[1]);
    op[0].param = wr; op[0].grad = gr; op[0].numel = 5;
    op[1].param = wr + 5; op[1].grad = gr + 5; op[1].numel = 3;
    CT_CHECK(capex_optim_create(&od, &ref) == CAPEX_OK && capex_optim_add_group(ref, NULL, op, 2, NULL) == CAPEX_OK,
             "ref: %s", capex_last_error());
    one_param(&zp[0], wz, 5); one_param(&zp[1], wz + 5, 3);
    capex_zero_desc_init(&zd);
    CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, &zd) == CAPEX_OK, "zero: %s", capex_last_error());
    for (s = 0; s < 3; s++) {
        if (s == 2) CT_CHECK(!zsgd_momentum(capex_zero_optim(z), 0.0f) && !zsgd_momentum(ref, 0.0f), "momentum off: %s",
                             capex_last_error());
        CT_CHECK(!zsgd_step(z, ref, gr, s), "step %d: %s", s, capex_last_error());
    }
    CT_CHECK(capex_zero_save_file(z, pz, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "zero save: %s", capex_last_error());
    CT_CHECK(capex_optim_save_file(ref, pr, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "ref save: %s", capex_last_error());
    /* the zero's file into a plain optimizer built with momentum: its buffers are the unsharded one's */
    op[0].param = wp; op[1].param = wp + 5;
    CT_CHECK(capex_optim_create(&od, &plain) == CAPEX_OK && capex_optim_add_group(plain, NULL, op, 2, NULL) == CAPEX_OK,
             "plain: %s", capex_last_error());
    CT_CHECK(capex_optim_load_file(plain, pz, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "plain load of the zero's file: %s",
             capex_last_error());
    for (i = 0; i < 2; i++) {
        float *mp = NULL, *mr = NULL;
        capex_optim_get_state(plain, 0, (size_t)i, &mp, NULL);
        capex_optim_get_state(ref, 0, (size_t)i, &mr, NULL);
        CT_CHECK(mp && mr && !memcmp(mp, mr, (i ? 3 : 5) * sizeof(float)), "param %d: momentum buffer from the zero's file "
                 "differs from the unsharded optimizer's", i);
    }
    capex_optim_destroy(plain);
    /* a fresh zero, its momentum off too, loads the plain optimizer's file; momentum on again on both */
    capex_zero_destroy(z);
    z = NULL;
    for (i = 0; i < 8; i++) wz[i] = 0.0f;
    CT_CHECK(capex_zero_create(&z, &c, zp, 2, &od, NULL, 1, &zd) == CAPEX_OK, "zero: %s", capex_last_error());
    CT_CHECK(!zsgd_momentum(capex_zero_optim(z), 0.0f), "momentum off: %s", capex_last_error());
    CT_CHECK(capex_zero_load_file(z, pr, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "zero load: %s", capex_last_error());
    CT_CHECK(!zsgd_momentum(capex_zero_optim(z), 0.9f) && !zsgd_momentum(ref, 0.9f), "momentum on: %s",
             capex_last_error());
    for (s = 3; s < 5; s++) {
        CT_CHECK(!zsgd_step(z, ref, gr, s), "step %d: %s", s, capex_last_error());
        for (i = 0; i < 8; i++)
            CT_CHECK(!memcmp(&wz[i], &wr[i], 4), "step %d element %d: zero %.9g, unsharded %.9g", s, i, (double)wz[i],
                     (double)wr[i]);
    }
    capex_zero_destroy(z);
    capex_optim_destroy(ref);
    remove(pz);
    remove(pr);
    capex_comm_destroy(&c);
}

static const ct_case cases[] = {
    CT_CASE(single_comm_matches_ddp_and_optim),
    CT_CASE(create_refuses_bad_arguments),
    CT_CASE(call_order_errors),
    CT_CASE(stage2_memory_is_shards_plus_one_open_bucket),
    CT_CASE(stage2_empty_bucket_returns_its_buffer),
    CT_CASE(reduce_scatter_after_unwaited_gather), CT_CASE(progress_polls_each_finished_bucket_once),
    CT_CASE(optim_add_group_is_refused),
    CT_CASE(momentum_on_refused_on_every_rank),
    CT_CASE(tcp_worlds_match_ddp_and_optim), CT_CASE(tcp_gradient_sum_and_average_match_float64),
    CT_CASE(tcp_dead_or_stalled_rank_fails_the_others),
    CT_CASE(tcp_save_file_status_on_every_rank),
    CT_CASE(tcp_save_file_null_path_on_one_rank),
    CT_CASE(tcp_save_file_writer_oom),
    CT_CASE(tcp_save_without_writer_keeps_ranks_in_step),
    CT_CASE(tcp_save_one_rank_out_of_memory_fails_every_rank),
    CT_CASE(tcp_create_one_rank_out_of_memory_after_broadcast),
    CT_CASE(tcp_load_one_rank_fails_every_rank), CT_CASE(tcp_save_while_others_load_fails_every_rank),
    CT_CASE(checkpoints_reshard_across_world_sizes),
    CT_CASE(load_takes_the_files_optimizer_settings),
    CT_CASE(save_file_frees_the_unsharded_copy), CT_CASE(lr_schedule_count_skipped_saves_and_resumes),
    CT_CASE(load_io_error_midway_changes_nothing),
    CT_CASE(stochastic_rounding_resumes),
    CT_CASE(sgd_momentum_turned_off_keeps_buffers_in_checkpoints),
};
CT_MAIN(cases)
