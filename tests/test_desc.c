/* Descriptors: one rule for all of them. Every struct that has an _init
   function (capex.h and capex_cuda.h) is refused by its consumer when it was
   not made by that _init: zeroed (= {0}, memset) or garbage bytes give
   CAPEX_ERR_INVALID_ARG and a message naming the _init to call; the same
   struct made by its _init is accepted (or at least passes that check). */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"

/* fill: 0 zeroes the struct, 1 fills it with a garbage pattern. */
static void spoil(void *p, size_t n, int fill) { memset(p, fill ? 0xA5 : 0, n); }

/* The call must fail with INVALID_ARG naming `init`. */
#define EXPECT_REFUSED(call, init)                                                                       \
    do {                                                                                                 \
        capex_result r_ = (call);                                                                        \
        CT_CHECK(r_ == CAPEX_ERR_INVALID_ARG, "%s (fill %d): got %s, want CAPEX_ERR_INVALID_ARG", #call, \
                 fill, capex_result_string(r_));                                                        \
        CT_CHECK(strstr(capex_last_error(), init) != NULL, "message '%s' does not name %s",              \
                 capex_last_error(), init);                                                              \
    } while (0)

CT_TEST(scaler_desc) {
    int fill;
    for (fill = 0; fill < 2; fill++) {
        capex_scaler_desc d;
        capex_scaler sc;
        spoil(&d, sizeof d, fill);
        EXPECT_REFUSED(capex_scaler_init(&sc, &d), "capex_scaler_desc_init");
        EXPECT_REFUSED(capex_scaler_desc_check(&d), "capex_scaler_desc_init");
    }
    {
        capex_scaler_desc d;
        capex_scaler sc;
        capex_scaler_desc_init(&d);
        CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%s", capex_last_error());
    }
}

CT_TEST(amp_overrides) {
    int fill;
    capex_amp_config c;
    for (fill = 0; fill < 2; fill++) {
        capex_amp_overrides ov;
        spoil(&ov, sizeof ov, fill);
        EXPECT_REFUSED(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c), "capex_amp_overrides_init");
    }
    {
        capex_amp_overrides ov;
        capex_amp_overrides_init(&ov);
        CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, NULL, &c) == CAPEX_OK, "NULL: no overrides");
    }
}

CT_TEST(tensor_op_desc) {
    float x[4] = {1, 2, 3, 4};
    capex_tensor t;
    capex_tensor_list l;
    float norm = 0.0f;
    int fill;
    t.data = x; t.numel = 4;
    l = capex_tensor_list_make(CAPEX_F32, &t, 1);
    for (fill = 0; fill < 2; fill++) {
        capex_tensor_op_desc d;
        spoil(&d, sizeof d, fill);
        EXPECT_REFUSED(capex_multi_tensor_l2norm(&d, &l, &norm, NULL), "capex_tensor_op_desc_init");
    }
    {
        capex_tensor_op_desc d;
        capex_tensor_op_desc_init(&d);
        CT_CHECK(capex_multi_tensor_l2norm(&d, &l, &norm, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(norm > 5.477 && norm < 5.478, "norm %g", norm);
        CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_OK, "NULL desc: defaults");
    }
}

CT_TEST(optim_desc_and_param) {
    float w[3] = {1, 2, 3}, g[3] = {0.5f, 0.5f, 0.5f};
    capex_optim *o = NULL;
    int fill;
    for (fill = 0; fill < 2; fill++) {
        capex_optim_desc d;
        spoil(&d, sizeof d, fill);
        EXPECT_REFUSED(capex_optim_create(&d, &o), "capex_optim_desc_init");
    }
    {
        capex_optim_desc d;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        spoil(&d.exec, sizeof d.exec, 0); /* a nested descriptor too */
        EXPECT_REFUSED(capex_optim_create(&d, &o), "capex_tensor_op_desc_init");
    }
    {
        capex_optim_desc d;
        capex_optim_param p;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        CT_CHECK(capex_optim_create(&d, &o) == CAPEX_OK, "%s", capex_last_error());
        for (fill = 0; fill < 2; fill++) {
            capex_result r;
            spoil(&p, sizeof p, fill);
            p.param = w; p.grad = g; p.grad_dtype = CAPEX_F32; p.model = NULL; p.numel = 3;
            p.exp_avg = p.exp_avg_sq = NULL;
            r = capex_optim_add_group(o, NULL, &p, 1, NULL);
            if (r != CAPEX_ERR_INVALID_ARG || !strstr(capex_last_error(), "capex_optim_param_init")) {
                capex_optim_destroy(o);
                CT_CHECK(0, "param (fill %d): %s '%s'", fill, capex_result_string(r), capex_last_error());
            }
        }
        capex_optim_param_init(&p);
        p.param = w; p.grad = g; p.numel = 3;
        if (capex_optim_add_group(o, NULL, &p, 1, NULL) != CAPEX_OK) {
            capex_optim_destroy(o);
            CT_CHECK(0, "%s", capex_last_error());
        }
        capex_optim_destroy(o);
    }
}

static const char *no_env(const char *name, void *user) { (void)name; (void)user; return NULL; }

CT_TEST(dist_descs) {
    int fill;
    capex_dist_env env;
    capex_comm comm;
    for (fill = 0; fill < 2; fill++) {
        capex_dist_env_desc ed;
        capex_rendezvous_desc rd;
        capex_sampler_desc sd;
        capex_sampler s;
        char blob[4] = {0};
        spoil(&ed, sizeof ed, fill);
        ed.getenv_fn = no_env;
        EXPECT_REFUSED(capex_dist_env_read(&ed, &env), "capex_dist_env_desc_init");
        spoil(&rd, sizeof rd, fill);
        EXPECT_REFUSED(capex_rendezvous_broadcast(&rd, blob, sizeof blob), "capex_rendezvous_desc_init");
        spoil(&sd, sizeof sd, fill);
        EXPECT_REFUSED(capex_sampler_init(&s, &sd), "capex_sampler_desc_init");
    }
    {
        capex_dist_env_desc ed;
        capex_sampler_desc sd;
        capex_sampler s;
        capex_dist_env_desc_init(&ed);
        ed.getenv_fn = no_env;
        CT_CHECK(capex_dist_env_read(&ed, &env) == CAPEX_OK, "%s", capex_last_error());
        capex_sampler_desc_init(&sd);
        sd.dataset_size = 10;
        CT_CHECK(capex_sampler_init(&s, &sd) == CAPEX_OK, "%s", capex_last_error());
    }
    CT_CHECK(capex_comm_init_single(&comm) == CAPEX_OK, "%s", capex_last_error());
    for (fill = 0; fill < 2; fill++) {
        capex_ddp_desc dd;
        capex_ddp *ddp = NULL;
        capex_ddp_param p;
        float w[2] = {1, 2}, gr[2] = {0, 0};
        capex_result r;
        memset(&p, 0, sizeof p);
        p.data = w; p.grad = gr; p.numel = 2; p.dtype = CAPEX_F32;
        spoil(&dd, sizeof dd, fill);
        r = capex_ddp_create(&ddp, &comm, &p, 1, &dd);
        if (r == CAPEX_OK) capex_ddp_destroy(ddp);
        if (r != CAPEX_ERR_INVALID_ARG || !strstr(capex_last_error(), "capex_ddp_desc_init")) {
            capex_comm_destroy(&comm);
            CT_CHECK(0, "ddp desc (fill %d): %s '%s'", fill, capex_result_string(r), capex_last_error());
        }
    }
    for (fill = 0; fill < 2; fill++) { /* capex_zero_desc, and the optimizer desc it takes */
        capex_zero_desc zd, good;
        capex_optim_desc od;
        capex_zero *z = NULL;
        capex_zero_param p;
        float w[2] = {1, 2};
        capex_result r;
        int which;
        p.data = w; p.numel = 2; p.dtype = CAPEX_F32; p.group = 0;
        capex_zero_desc_init(&good);
        for (which = 0; which < 2; which++) {
            const char *want = which ? "capex_optim_desc_init" : "capex_zero_desc_init";
            capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
            zd = good;
            if (which) spoil(&od, sizeof od, fill); else spoil(&zd, sizeof zd, fill);
            r = capex_zero_create(&z, &comm, &p, 1, &od, NULL, 1, &zd);
            if (r == CAPEX_OK) capex_zero_destroy(z);
            if (r != CAPEX_ERR_INVALID_ARG || !strstr(capex_last_error(), want)) {
                capex_comm_destroy(&comm);
                CT_CHECK(0, "zero (%s, fill %d): %s '%s'", want, fill, capex_result_string(r), capex_last_error());
            }
        }
    }
    capex_comm_destroy(&comm);
}

CT_TEST(norm_descs) {
    float x[4] = {1, 2, 3, 4}, y[4], mean[1], rstd[1];
    int fill, which;
    for (which = 0; which < 2; which++)
        for (fill = 0; fill < 2; fill++) {
            capex_norm_desc d;
            capex_norm_args a;
            capex_norm_desc_init(&d);
            capex_norm_args_init(&a);
            a.rows = 1; a.cols = 4; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
            if (which == 0) {
                spoil(&d, sizeof d, fill);
                EXPECT_REFUSED(capex_layer_norm_forward(&d, &a), "capex_norm_desc_init");
            } else {
                spoil(&a, sizeof a, fill);
                a.rows = 1; a.cols = 4; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
                EXPECT_REFUSED(capex_rms_norm_forward(&d, &a), "capex_norm_args_init");
            }
        }
    {
        capex_norm_desc d;
        capex_norm_args a;
        capex_norm_desc_init(&d);
        capex_norm_args_init(&a);
        a.rows = 1; a.cols = 4; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
        CT_CHECK(capex_layer_norm_forward(&d, &a) == CAPEX_OK, "%s", capex_last_error());
    }
    for (which = 0; which < 2; which++)
        for (fill = 0; fill < 2; fill++) {
            capex_batch_norm_desc d;
            capex_batch_norm_args a;
            capex_batch_norm_desc_init(&d);
            capex_batch_norm_args_init(&a);
            a.n = 1; a.c = 1; a.s = 4; a.x = x; a.y = y;
            if (which == 0) {
                spoil(&d, sizeof d, fill);
                EXPECT_REFUSED(capex_batch_norm_forward(&d, NULL, &a), "capex_batch_norm_desc_init");
            } else {
                spoil(&a, sizeof a, fill);
                a.n = 1; a.c = 1; a.s = 4; a.x = x; a.y = y;
                EXPECT_REFUSED(capex_batch_norm_forward(&d, NULL, &a), "capex_batch_norm_args_init");
            }
        }
}

/* The CUDA descriptors are checked before any driver, device or NVRTC use,
   so these run on a machine without a GPU. The context below is never
   dereferenced: the argument check refuses first. */
CT_TEST(cuda_descs) {
    int fill;
    static capex_cuda_context fake_ctx_storage; /* zeroed; the implementation's own type */
    capex_cuda_context *fake_ctx = &fake_ctx_storage;
    for (fill = 0; fill < 2; fill++) {
        capex_cuda_compile_desc cd;
        capex_cuda_image img;
        capex_cuda_context_desc xd;
        capex_cuda_context *ctx = NULL;
        capex_nccl_desc nd;
        capex_comm comm;
        capex_dist_env env;
        capex_nccl_unique_id id;
        capex_cuda_norm_args na;
        capex_cuda_batch_norm_args ba;
        spoil(&cd, sizeof cd, fill);
        cd.source = "extern \"C\" __global__ void k(void) {}";
        cd.n_options = 0; cd.options = NULL; cd.device_cc = 90;
        EXPECT_REFUSED(capex_cuda_compile(&cd, &img), "capex_cuda_compile_desc_init");
        { /* the cache a compile desc points at has its _init too: a garbage one read its
             unterminated dir out of bounds (ASan), a zeroed one ran uncached in silence */
            capex_cuda_cache cc;
            capex_cuda_image parts[CAPEX__CUDA_N_PARTS];
            capex_cuda_compile_desc_init(&cd);
            cd.source = "extern \"C\" __global__ void k(void) {}";
            cd.device_cc = 90;
            spoil(&cc, sizeof cc, fill);
            cd.cache = &cc;
            EXPECT_REFUSED(capex_cuda_compile(&cd, &img), "capex_cuda_cache_init");
            CT_CHECK(img.data == NULL, "no image from a refused compile");
            EXPECT_REFUSED(capex_cuda_builtin_compile_parts(90, &cc, 1, parts), "capex_cuda_cache_init");
        }
        spoil(&xd, sizeof xd, fill);
        EXPECT_REFUSED(capex_cuda_context_create(&xd, &ctx), "capex_cuda_context_desc_init");
        spoil(&nd, sizeof nd, fill);
        nd.ctx = fake_ctx;
        memset(&env, 0, sizeof env);
        env.rank = 0; env.world_size = 1;
        EXPECT_REFUSED(capex_comm_init_nccl(&comm, &env, &nd), "capex_nccl_desc_init");
        memset(&id, 0, sizeof id);
        EXPECT_REFUSED(capex_comm_init_nccl_id(&comm, &id, 0, 1, &nd), "capex_nccl_desc_init");
        spoil(&na, sizeof na, fill);
        EXPECT_REFUSED(capex_cuda_layer_norm_forward(fake_ctx, NULL, &na, NULL), "capex_cuda_norm_args_init");
        spoil(&ba, sizeof ba, fill);
        EXPECT_REFUSED(capex_cuda_batch_norm_forward(fake_ctx, NULL, NULL, &ba, NULL), "capex_cuda_batch_norm_args_init");
    }
}

static const ct_case cases[] = {CT_CASE(scaler_desc),          CT_CASE(amp_overrides), CT_CASE(tensor_op_desc),
                                CT_CASE(optim_desc_and_param), CT_CASE(dist_descs),    CT_CASE(norm_descs),
                                CT_CASE(cuda_descs)};
CT_MAIN(cases)
