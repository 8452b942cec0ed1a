/* test_zero.c - the sharded optimizer (capex_zero, ZeRO stage 1 and 2):
   equivalence with DDP + capex_optim on a single comm and on TCP worlds of
   2, 3 and 4 processes (tests/zero_check.h; MPI runs the same checks in
   tests/mpi/test_dist_mpi.c), the memory split, argument and call-order
   errors, and a rank that dies mid-step. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include "free_port.h"
#include "zero_check.h"
#include <sys/wait.h>

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
    capex_optim_desc od, lamb;
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
    capex_optim_desc_init(&lamb, CAPEX_OPTIM_LAMB);
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &lamb, NULL, 1, &d) == CAPEX_ERR_UNSUPPORTED && strstr(capex_last_error(), "LAMB"),
             "LAMB: %s", capex_last_error());
    od.stochastic_rounding = 1;
    CT_CHECK(capex_zero_create(&z, &c, p, 2, &od, NULL, 1, &d) == CAPEX_ERR_UNSUPPORTED, "stochastic rounding");
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
        CT_CHECK(capex_zero_grad_ready(z, 0) == CAPEX_OK, "ready 0 (unused: zero gradient)");
        CT_CHECK(capex_zero_finalize(z) == CAPEX_OK, "finalize: %s", capex_last_error());
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

/* ---- TCP worlds (fork) ---- */

static int tcp_comm(capex_comm *c, int rank, int world, int port) {
    capex_dist_env env;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "zero-test");
    if (capex_comm_init_tcp(c, &env, 10.0) != CAPEX_OK) return 0;
    c->timeout_s = 20.0;
    return 1;
}

/* mode 0: the equivalence checks; 1: rank 1 dies after create, the others
   must fail within the deadline and then refuse every call. */
static int tcp_body(int rank, int world, int port, int mode) {
    capex_comm c;
    char why[400] = "";
    int line = 0;
    if (!tcp_comm(&c, rank, world, port)) { fprintf(stderr, "rank %d: %s\n", rank, capex_last_error()); return __LINE__; }
    if (mode == 0) {
        line = zero_check_all(&c, why, sizeof why);
        if (line) fprintf(stderr, "rank %d of %d: zero_check.h:%d: %s\n", rank, world, line, why);
    } else {
        float w[4][300];
        capex_zero_param p[4];
        capex_zero_desc d;
        capex_optim_desc od;
        capex_zero *z = NULL;
        int i;
        capex_result r;
        double t0;
        memset(w, 0, sizeof w);
        for (i = 0; i < 4; i++) one_param(&p[i], w[i], 300);
        capex_zero_desc_init(&d);
        capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
        c.timeout_s = 3.0;
        if (capex_zero_create(&z, &c, p, 4, &od, NULL, 1, &d) != CAPEX_OK) { capex_comm_destroy(&c); return __LINE__; }
        if (rank == 1) _exit(0); /* dies without a word */
        t0 = capex_dist_now();
        for (i = 3; i >= 0; i--) capex_zero_grad_ready(z, (size_t)i);
        r = capex_zero_finalize(z);
        if (r != CAPEX_ERR_COMM && r != CAPEX_ERR_TIMEOUT) line = __LINE__;
        else if (capex_dist_now() - t0 > 3.5) line = __LINE__;
        else if (capex_zero_step(z, 1.0f, 1.0f, 0) != CAPEX_ERR_COMM) line = __LINE__; /* refused after the failure */
        capex_zero_destroy(z);
    }
    capex_comm_destroy(&c);
    return line;
}

static int tcp_world(int world, int mode, int *codes) {
    pid_t pids[8];
    int port = free_port(), r, i;
    fflush(stdout);
    fflush(stderr);
    for (i = 1; i < world; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(tcp_body(i, world, port, mode) ? 1 : 0);
    }
    r = tcp_body(0, world, port, mode);
    for (i = 1; i < world; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    return r;
}

CT_TEST(tcp_worlds_match_ddp_and_optim) {
    int world, codes[8], r, i;
    for (world = 2; world <= 4; world++) {
        memset(codes, 0, sizeof codes);
        r = tcp_world(world, 0, codes);
        CT_CHECK(r == 0, "world %d: rank 0 failed at line %d (its stderr says why)", world, r);
        for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d: rank %d exit %d", world, i, codes[i]);
    }
}

CT_TEST(tcp_dead_rank_fails_the_others_within_the_deadline) {
    int codes[8], r, i;
    memset(codes, 0, sizeof codes);
    r = tcp_world(3, 1, codes);
    CT_CHECK(r == 0, "rank 0: line %d: %.300s", r, capex_last_error());
    for (i = 2; i < 3; i++) CT_CHECK(codes[i] == 0, "rank %d exit %d", i, codes[i]);
}

static const ct_case cases[] = {
    CT_CASE(single_comm_matches_ddp_and_optim),
    CT_CASE(create_refuses_bad_arguments),
    CT_CASE(call_order_errors),
    CT_CASE(stage2_memory_is_shards_plus_one_open_bucket),
    CT_CASE(tcp_worlds_match_ddp_and_optim),
    CT_CASE(tcp_dead_rank_fails_the_others_within_the_deadline),
};
CT_MAIN(cases)
