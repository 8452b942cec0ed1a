/* Host side of the fused GPU kernels, no GPU: every public entry point's
   argument checks (clear status, nothing launched), the kernel-name table
   the launches index, the by-value launch metadata (layout, < 4 KB, 64-bit
   sizes, every chunk exactly once), the launch sequence of each op, and the
   status without a driver. The kernels themselves: tests/test_gpuopt_emu.c
   (CPU), tests/test_cuda_jit.c (NVRTC, every arch), tests/test_gpuopt_gpu.c. */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"

/* NVRTC must load in CI (tests/cuda_test_util.h's rule); CAPEX_TEST_NO_NVRTC=1 skips. */
#define NEED_NVRTC()                                                                                \
    do {                                                                                            \
        int M_, m_;                                                                                 \
        if (capex_cuda_nvrtc_version(&M_, &m_) != CAPEX_OK) {                                       \
            const char *e_ = getenv("CAPEX_TEST_NO_NVRTC");                                         \
            if (e_ && e_[0] == '1') CT_SKIP("CAPEX_TEST_NO_NVRTC=1: %s", capex_last_error());       \
            CT_CHECK(0, "NVRTC must be loadable (make ci-deps): %s", capex_last_error());           \
        }                                                                                           \
    } while (0)

/* NVRTC keeps internal allocations for the life of the process. */
#if defined(__clang__) || defined(__GNUC__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libnvrtc-builtins\n"; }
#endif

/* An exec that records launches and refuses nothing; "device" memory is host memory. */
static struct { int launches, kernels[64], grids[64]; } rec;
static capex_result r_launch(void *u, int k, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    (void)u; (void)args; (void)s; (void)block; (void)vb;
    if (rec.launches < 64) { rec.kernels[rec.launches] = k; rec.grids[rec.launches] = (int)grid; }
    rec.launches++;
    return CAPEX_OK;
}
static capex_result r_alloc(void *u, size_t bytes, capex_cuda_ptr *out) {
    void *p = calloc(1, bytes ? bytes : 1);
    (void)u;
    *out = (capex_cuda_ptr)(uintptr_t)p;
    return p ? CAPEX_OK : CAPEX_ERR_OUT_OF_MEMORY;
}
static void r_release(void *u, capex_cuda_ptr p) { (void)u; free((void *)(uintptr_t)p); }
static capex_result r_htod(void *u, capex_cuda_ptr d, const void *s, size_t n, capex_cuda_stream st) {
    (void)u; (void)st; memcpy((void *)(uintptr_t)d, s, n); return CAPEX_OK;
}
static capex_result r_dtoh(void *u, void *d, capex_cuda_ptr s, size_t n, capex_cuda_stream st) {
    (void)u; (void)st; memcpy(d, (const void *)(uintptr_t)s, n); return CAPEX_OK;
}
static capex_result r_zero(void *u, capex_cuda_ptr d, size_t n, capex_cuda_stream st) {
    (void)u; (void)st; memset((void *)(uintptr_t)d, 0, n); return CAPEX_OK;
}
static capex__go_exec rec_exec(void) {
    capex__go_exec e;
    memset(&e, 0, sizeof e);
    e.launch = r_launch; e.alloc = r_alloc; e.release = r_release; e.htod = r_htod; e.dtoh = r_dtoh; e.zero = r_zero;
    e.user = NULL;
    memset(&rec, 0, sizeof rec);
    return e;
}

CT_TEST(kernel_table_matches_ids) {
    static const char *const want[CAPEX__GO_NK] = {
        "capex_go_scale_f32_f32", "capex_go_scale_f32_f16", "capex_go_scale_f32_bf16", "capex_go_scale_f16_f32",
        "capex_go_scale_f16_f16", "capex_go_scale_f16_bf16", "capex_go_scale_bf16_f32", "capex_go_scale_bf16_f16",
        "capex_go_scale_bf16_bf16", "capex_go_sumsq_f32", "capex_go_sumsq_f16", "capex_go_sumsq_bf16", "capex_go_reduce",
        "capex_go_clip_coef", "capex_go_prepare", "capex_go_adam_f32", "capex_go_adam_f16", "capex_go_adam_bf16",
        "capex_go_sgd_f32", "capex_go_sgd_f16", "capex_go_sgd_bf16", "capex_go_lamb1_f32", "capex_go_lamb1_f16",
        "capex_go_lamb1_bf16", "capex_go_lamb_clip", "capex_go_lamb_ratio", "capex_go_lamb2", "capex_go_scaler_update",
        "capex_go_novo1_f32", "capex_go_novo1_f16", "capex_go_novo1_bf16", "capex_go_novo2_f32", "capex_go_novo2_f16",
        "capex_go_novo2_bf16", "capex_go_novo_norm"};
    int k;
    int n = 0;
    const char *const *opts = capex_cuda_builtin_options(&n);
    CT_CHECK(CAPEX__CUDA_N_BUILTIN >= CAPEX__GO_KBASE + CAPEX__GO_NK, "table size");
    for (k = 0; k < CAPEX__GO_NK; k++)
        CT_CHECK(!strcmp(capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k], want[k]), "kernel id %d is %s, want %s", k,
                 capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k], want[k]);
    {   /* kernels appended after the norm kernels: Adam amsgrad, Adagrad (+ grad dtype), ZeRO's norm, the lr schedule */
        static const char *const more[CAPEX__GO_NK_ALL - CAPEX__GO_K_ADAM_AMS] = {
            "capex_go_adam_ams_f32", "capex_go_adam_ams_f16", "capex_go_adam_ams_bf16",
            "capex_go_adagrad_f32", "capex_go_adagrad_f16", "capex_go_adagrad_bf16", "capex_go_zero_norm",
            "capex_go_lr_sched"};
        static const char *const tail[3] = {"capex_norm_me_dx", "capex_norm_me_gamma_part", "capex_add_half"};
        CT_CHECK(CAPEX__CUDA_N_BUILTIN == CAPEX__GO_KBASE + CAPEX__GO_NK_ALL + 3, "table size %d: after the optimizer "
                 "kernels only the two memory-efficient norm kernels and capex_add_half", (int)CAPEX__CUDA_N_BUILTIN);
        for (k = 0; k < 3 && CAPEX__GO_KBASE + CAPEX__GO_NK_ALL + k < (int)CAPEX__CUDA_N_BUILTIN; k++)
            CT_CHECK(!strcmp(capex__cuda_builtin_kernels[CAPEX__GO_KBASE + CAPEX__GO_NK_ALL + k], tail[k]), "kernel %d is %s, want %s",
                     CAPEX__GO_KBASE + CAPEX__GO_NK_ALL + k, capex__cuda_builtin_kernels[CAPEX__GO_KBASE + CAPEX__GO_NK_ALL + k], tail[k]);
        for (k = CAPEX__GO_K_ADAM_AMS; k < CAPEX__GO_NK_ALL; k++)
            CT_CHECK(!strcmp(capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k], more[k - CAPEX__GO_K_ADAM_AMS]),
                     "kernel id %d is %s, want %s", k, capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k],
                     more[k - CAPEX__GO_K_ADAM_AMS]);
    }
    /* bit parity with the C math needs no FMA contraction */
    for (k = 0; k < n; k++)
        if (!strcmp(opts[k], "--fmad=false")) break;
    CT_CHECK(k < n, "the built-in program is compiled with --fmad=false");
    CT_CHECK(strstr(capex_cuda_builtin_source(), "capex__adam_w_elem"), "the optimizer math is in the program");
}

/* Packing: capex__go_mta's launches decoded by the capex_go_meta layout
   (CAPEX__GO_TDEF), at both metadata sizes and several device grids: slots
   in tensor order, empty tensors skipped, cend the running chunk count, the
   grid min(chunks, the device's resident blocks or 320). */
static struct { int n; uint64_t meta[8][CAPEX__GO_META_LARGE / 8]; unsigned grid[8]; } cap_rec;
static unsigned cap_grid_value;
static size_t cap_bytes;
static capex_result cap_launch(void *u, int k, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    (void)u; (void)k; (void)block; (void)s; (void)vb;
    if (cap_rec.n < 8) {
        memcpy(cap_rec.meta[cap_rec.n], args[0], cap_bytes);
        cap_rec.grid[cap_rec.n] = grid;
    }
    cap_rec.n++;
    return CAPEX_OK;
}
static unsigned cap_grid(void *u, int k, unsigned vb, unsigned block) {
    (void)u; (void)k; (void)vb; (void)block;
    return cap_grid_value;
}
CT_TEST(launch_metadata_packing) {
    static capex_tensor shape[300];
    static capex__go_ten ten[300];
    const int64_t chunk = 4096;
    int mode;
    size_t i;
    for (i = 0; i < 300; i++) {
        int d;
        shape[i].data = NULL;
        shape[i].numel = i == 7 ? ((int64_t)1 << 33) + 5 : (int64_t)(i % 13) * 1000 + (i % 3 == 0 ? 0 : 1);
        for (d = 0; d < 6; d++) ten[i].addr[d] = 0x100000000000ull * (uint64_t)(d + 1) + 4096u * i;
    }
    CT_CHECK(CAPEX__GO_META_SMALL + sizeof(capex__go_args) <= 4096, "params under 4 KB");
    CT_CHECK(CAPEX__GO_META_LARGE + sizeof(capex__go_args) <= 32764, "params under 32764 bytes");
    for (mode = 0; mode < 4; mode++) {
        capex__go_exec e;
        capex__go_args a;
        size_t bytes = mode & 1 ? CAPEX__GO_META_LARGE : CAPEX__GO_META_SMALL, T = CAPEX__GO_TDEF(bytes, 5), next = 0;
        int64_t total = 0, chunks = -1;
        int l, want_launches;
        const int64_t cap = mode == 3 ? 528 : 320;
        memset(&e, 0, sizeof e);
        memset(&a, 0, sizeof a);
        e.launch = cap_launch;
        e.meta_bytes = (int)bytes;
        if (mode & 2) e.grid = cap_grid;
        cap_grid_value = mode == 2 ? 0u : 528u; /* 0: "unknown", the default 320 */
        cap_rec.n = 0;
        cap_bytes = bytes;
        CT_CHECK(capex__go_mta(&e, CAPEX__GO_K_SGD, 5, shape, ten, 300, chunk, &a, NULL, NULL, NULL, &chunks) == CAPEX_OK,
                 "mta");
        want_launches = 0;
        for (i = 0, l = 0; i < 300; i++) l += shape[i].numel > 0;
        want_launches = (int)((size_t)l + T - 1) / (int)T;
        CT_CHECK(cap_rec.n == want_launches && cap_rec.n <= 8, "mode %d: %d launches, want %d (%zu slots)", mode, cap_rec.n,
                 want_launches, T);
        CT_CHECK(a.chunk == (uint64_t)chunk, "chunk");
        for (l = 0; l < cap_rec.n && l < 8; l++) {
            const uint64_t *m = cap_rec.meta[l];
            int32_t nt;
            int64_t c = 0;
            size_t s;
            memcpy(&nt, m + 7 * T, 4);
            CT_CHECK(nt >= 1 && (size_t)nt <= T, "ntensors %d", nt);
            for (s = 0; s < (size_t)nt; s++, next++) {
                int64_t numel, cend;
                int d;
                while (shape[next].numel == 0) next++;
                memcpy(&numel, m + 5 * T + s, 8);
                memcpy(&cend, m + 6 * T + s, 8);
                c += numel / chunk + (numel % chunk != 0);
                CT_CHECK(numel == shape[next].numel && cend == c, "launch %d slot %zu: numel %lld cend %lld", l, s,
                         (long long)numel, (long long)cend);
                for (d = 0; d < 5; d++) CT_CHECK(m[(size_t)d * T + s] == ten[next].addr[d], "address list %d slot %zu", d, s);
                total += numel;
            }
            CT_CHECK(cap_rec.grid[l] == (unsigned)(c < cap ? c : cap),
                     "mode %d launch %d: grid %u for %lld chunks", mode, l, cap_rec.grid[l], (long long)c);
        }
        for (i = 0; i < 300; i++) total -= shape[i].numel;
        CT_CHECK(total == 0 && next <= 300, "every tensor in exactly one slot");
        CT_CHECK(chunks > ((int64_t)1 << 21), "chunk count %lld", (long long)chunks);
    }
}

CT_TEST(no_context_is_a_clear_error) {
    capex_cuda_optim *o = (capex_cuda_optim *)1;
    capex_cuda_scaler *s = (capex_cuda_scaler *)1;
    capex_optim_desc d;
    capex_tensor t = {NULL, 0};
    capex_tensor_list l = capex_tensor_list_make(CAPEX_F32, &t, 1);
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    CT_CHECK(capex_cuda_optim_create(NULL, &d, &o) == CAPEX_ERR_INVALID_ARG && o == NULL, "optim");
    CT_CHECK(strstr(capex_last_error(), "context is NULL"), "%s", capex_last_error());
    CT_CHECK(capex_cuda_scaler_create(NULL, NULL, &s) == CAPEX_ERR_INVALID_ARG && s == NULL, "scaler");
    CT_CHECK(capex_cuda_multi_tensor_scale(NULL, NULL, &l, &l, 16, 0, NULL) == CAPEX_ERR_INVALID_ARG, "scale");
    CT_CHECK(capex_cuda_multi_tensor_l2norm(NULL, NULL, &l, 16, 16, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "norm");
    CT_CHECK(capex_cuda_clip_grad_norm(NULL, NULL, &l, 1, 1.0f, 16, 16, 0, 0, 1, NULL) == CAPEX_ERR_INVALID_ARG, "clip");
    CT_CHECK(capex_cuda_optim_step(NULL, 0, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "step");
    CT_CHECK(capex_cuda_scaler_update(NULL, NULL) == CAPEX_ERR_INVALID_ARG, "update");
    CT_CHECK(capex_cuda_scaler_unscale(NULL, NULL, &l, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "unscale");
    CT_CHECK(capex_cuda_scaler_scale_ptr(NULL) == 0 && capex_cuda_optim_lr_ptr(NULL, 0) == 0, "NULL pointers give 0");
    capex_cuda_optim_destroy(NULL);
    capex_cuda_scaler_destroy(NULL);
    CT_CHECK(capex_cuda_optim_num_groups(NULL) == 0, "groups");
}

CT_TEST(no_driver_status) {
    capex_cuda_context *ctx = NULL;
    capex_result r;
    setenv("CAPEX_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1);
    r = capex_cuda_context_create(NULL, &ctx);
    CT_CHECK(r == CAPEX_ERR_NO_DRIVER && ctx == NULL, "got %s: %s", capex_result_string(r), capex_last_error());
    CT_CHECK(capex_cuda_scaler_create(ctx, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "then every call says why");
}

/* Every refusal happens before anything is launched. */
CT_TEST(op_argument_errors) {
    capex__go_exec ex = rec_exec();
    float a[12], b[8];
    uint16_t h[8];
    capex_tensor ta[2] = {{a, 8}, {a + 8, 3}}, tb[2] = {{b, 8}, {b, 4}}, th[1] = {{h, 8}}, tmis[1] = {{(char *)a + 2, 4}};
    capex_tensor_list la = capex_tensor_list_make(CAPEX_F32, ta, 2), lb = capex_tensor_list_make(CAPEX_F32, tb, 2);
    capex_tensor_list lh = capex_tensor_list_make(CAPEX_F16, th, 1), lbad = capex_tensor_list_make((capex_dtype)7, ta, 2);
    capex_tensor_list lmis = capex_tensor_list_make(CAPEX_F32, tmis, 1), lh_as_f32 = capex_tensor_list_make(CAPEX_F32, th, 1);
    capex_tensor_op_desc bad;
    capex_cuda_ptr sp = (capex_cuda_ptr)(uintptr_t)a, ws = (capex_cuda_ptr)(uintptr_t)b;
    size_t need = 0;
    capex_tensor_op_desc_init(&bad);
    bad.chunk_size = -1;
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &la, &lb, sp, 0, 0, NULL) == CAPEX_ERR_SIZE_MISMATCH, "numel mismatch");
    CT_CHECK(strstr(capex_last_error(), "in[1] has 3 elements"), "%s", capex_last_error());
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &lbad, NULL, sp, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "bad dtype");
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &la, &lh, sp, 0, 0, NULL) == CAPEX_ERR_SIZE_MISMATCH, "count mismatch");
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &lmis, NULL, sp, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned");
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &lh_as_f32, &lh_as_f32, sp, 0, 0, NULL) == CAPEX_OK, "same dtype in place ok");
    {
        capex_tensor th2[1] = {{h, 4}};
        capex_tensor_list in16 = capex_tensor_list_make(CAPEX_F16, th2, 1);
        capex_tensor tf[1] = {{h, 4}};
        capex_tensor_list out32 = capex_tensor_list_make(CAPEX_F32, tf, 1);
        CT_CHECK(capex__go_scale(&ex, "t", NULL, &in16, &out32, sp, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG,
                 "in place across dtypes refused");
    }
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &la, NULL, 0, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "scale pointer 0");
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &la, NULL, sp + 1, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "scale misaligned");
    CT_CHECK(capex__go_scale(&ex, "t", NULL, &la, NULL, sp, sp + 2, 0, NULL) == CAPEX_ERR_INVALID_ARG, "found_inf misaligned");
    CT_CHECK(capex__go_scale(&ex, "t", &bad, &la, NULL, sp, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "bad desc");
    CT_CHECK(rec.launches == 1, "only the valid in-place call launched (%d)", rec.launches);
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &la, 1, &need) == CAPEX_OK && need == 8 * 3, "workspace %zu", need);
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &lbad, 1, &need) == CAPEX_ERR_INVALID_ARG, "ws bad dtype");
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, NULL, 1, &need) == CAPEX_ERR_INVALID_ARG, "ws NULL lists");
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &la, 1, NULL) == CAPEX_ERR_INVALID_ARG, "ws NULL out");
    rec.launches = 0;
    CT_CHECK(capex__go_l2norm(&ex, NULL, &la, ws, 16, 0, 0, NULL) == CAPEX_ERR_SIZE_MISMATCH, "small workspace");
    CT_CHECK(capex__go_l2norm(&ex, NULL, &la, 0, 64, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "no workspace");
    CT_CHECK(capex__go_l2norm(&ex, NULL, &la, ws + 4, 64, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned workspace");
    CT_CHECK(capex__go_l2norm(&ex, NULL, NULL, ws, 64, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "NULL list");
    CT_CHECK(capex__go_clip(&ex, NULL, &la, 1, NAN, ws, 64, 0, 0, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NaN max_norm");
    CT_CHECK(capex__go_clip(&ex, NULL, &la, 1, -1.0f, ws, 64, 0, 0, 1, NULL) == CAPEX_ERR_INVALID_ARG, "negative max_norm");
    CT_CHECK(capex__go_clip(&ex, NULL, NULL, 2, 1.0f, ws, 64, 0, 0, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL grads");
    CT_CHECK(rec.launches == 0, "nothing launched on error (%d)", rec.launches);
    /* the launch sequence of a clip: sumsq per list, total, coefficient, scale per list */
    CT_CHECK(capex__go_clip(&ex, NULL, &la, 1, 1.0f, ws, 64, 0, 0, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(rec.launches == 4 && rec.kernels[0] == CAPEX__GO_K_SUMSQ && rec.kernels[1] == CAPEX__GO_K_REDUCE &&
             rec.grids[1] == 1 && rec.kernels[2] == CAPEX__GO_K_CLIP && rec.kernels[3] == CAPEX__GO_K_SCALE,
             "clip launches %d: %d %d %d %d", rec.launches, rec.kernels[0], rec.kernels[1], rec.kernels[2], rec.kernels[3]);
}

/* A chunk count whose workspace bytes (8 * (chunks + 1)) wrap size_t is refused,
   not reported as a few bytes that l2norm and clip then accept. */
CT_TEST(workspace_size_does_not_wrap) {
    capex__go_exec ex = rec_exec();
    uint16_t h[4];
    double ws[8];
    capex_tensor big[3] = {{h, (int64_t)1 << 61}, {h, ((int64_t)1 << 62) - 1}, {h, ((int64_t)1 << 62) - 1}};
    capex_tensor_list l1 = capex_tensor_list_make(CAPEX_F16, big, 1), l3 = capex_tensor_list_make(CAPEX_F16, big + 1, 2);
    capex_tensor_op_desc d;
    size_t need = 1;
    capex_result r;
    capex_tensor_op_desc_init(&d);
    d.chunk_size = 1;
    r = capex_cuda_multi_tensor_workspace_size(&d, &l1, 1, &need);
    CT_CHECK(r == CAPEX_ERR_LIMIT, "2^61 chunks: got %s, %zu bytes", capex_result_string(r), need);
    r = capex_cuda_multi_tensor_workspace_size(&d, &l3, 1, &need); /* int64 chunk sum past 2^63 */
    CT_CHECK(r == CAPEX_ERR_LIMIT, "2^63 chunks: got %s, %zu bytes", capex_result_string(r), need);
    r = capex__go_l2norm(&ex, &d, &l1, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0, 0, NULL);
    CT_CHECK(r == CAPEX_ERR_LIMIT, "l2norm: got %s", capex_result_string(r));
    r = capex__go_clip(&ex, &d, &l1, 1, 1.0f, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0, 0, 1, NULL);
    CT_CHECK(r == CAPEX_ERR_LIMIT, "clip: got %s", capex_result_string(r));
    CT_CHECK(rec.launches == 0, "nothing launched (%d)", rec.launches);
}

/* clip_grad_norm with apply scales each list in place: a list that cannot be
   (one tensor twice) is refused before the norm is launched, not after the
   total, the factor and the earlier lists were written. */
CT_TEST(clip_in_place_refused_before_launch) {
    capex__go_exec ex = rec_exec();
    float a[8], b[8];
    double ws[8];
    capex_tensor ok[1] = {{b, 8}}, dup[2] = {{a, 8}, {a, 8}};
    capex_tensor_list l[2];
    capex_result r;
    l[0] = capex_tensor_list_make(CAPEX_F32, ok, 1);
    l[1] = capex_tensor_list_make(CAPEX_F32, dup, 2);
    r = capex__go_clip(&ex, NULL, l, 2, 1.0f, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0, 0, 1, NULL);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "got %s", capex_result_string(r));
    CT_CHECK(strstr(capex_last_error(), "capex_cuda_clip_grad_norm: grads[1][") != NULL, "%s", capex_last_error());
    CT_CHECK(rec.launches == 0, "%d launches before the error (norm, factor, list 0 scaled)", rec.launches);
    /* apply 0 writes no grads: the repeat is only read twice, as the CPU's norm */
    CT_CHECK(capex__go_clip(&ex, NULL, l, 2, 1.0f, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0,
                            (capex_cuda_ptr)(uintptr_t)ws, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
}

/* Outputs overlapping inputs (or each other) in part are refused as on the
   CPU (capex__check_alias), before anything is launched: scale out = in + 1
   element, and in-place clipping of a list whose tensors overlap. */
CT_TEST(partial_overlap_refused_before_launch) {
    capex__go_exec ex = rec_exec();
    float a[16], f = 2.0f;
    double ws[8];
    capex_tensor ti[1] = {{a, 8}}, to[1] = {{a + 1, 8}}, ov[2] = {{a, 8}, {a + 4, 8}};
    capex_tensor_list in = capex_tensor_list_make(CAPEX_F32, ti, 1), out = capex_tensor_list_make(CAPEX_F32, to, 1);
    capex_tensor_list l = capex_tensor_list_make(CAPEX_F32, ov, 2);
    capex_cuda_ptr sp = (capex_cuda_ptr)(uintptr_t)&f;
    capex_result r = capex__go_scale(&ex, "t", NULL, &in, &out, sp, 0, 0, NULL);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "overlap in part"), "out = in + 1: %s (%s)",
             capex_result_string(r), capex_last_error());
    r = capex__go_clip(&ex, NULL, &l, 1, 1.0f, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0, 0, 1, NULL);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "capex_cuda_clip_grad_norm: grads[0]["),
             "clip over overlapping tensors: %s (%s)", capex_result_string(r), capex_last_error());
    /* one tensor in two lists would be scaled twice */
    {
        capex_tensor t0[1] = {{a, 4}}, t1[2] = {{a + 8, 4}, {a + 2, 4}};
        capex_tensor_list two[2];
        two[0] = capex_tensor_list_make(CAPEX_F32, t0, 1);
        two[1] = capex_tensor_list_make(CAPEX_F32, t1, 2);
        r = capex__go_clip(&ex, NULL, two, 2, 1.0f, (capex_cuda_ptr)(uintptr_t)ws, sizeof ws, 0, 0, 1, NULL);
        CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "grads[0][0] and grads[1][1] overlap"),
                 "across lists: %s (%s)", capex_result_string(r), capex_last_error());
    }
    CT_CHECK(rec.launches == 0, "%d launches before the errors", rec.launches);
}

CT_TEST(optimizer_argument_errors) {
    capex__go_exec ex = rec_exec();
    capex_cuda_optim *o = NULL;
    capex_optim_desc d;
    capex_optim_param p;
    capex_optim_hparams hp;
    float w[4];
    int64_t step = -1;
    capex_cuda_ptr m = 0, v = 0;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.lr = NAN;
    CT_CHECK(capex__go_optim_create(&ex, &d, &o) == CAPEX_ERR_INVALID_ARG && !o, "NaN lr");
    CT_CHECK(capex__go_optim_create(&ex, NULL, &o) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    d.defaults.lr = 1e-3f;
    d.kind = (capex_optim_kind)9;
    CT_CHECK(capex__go_optim_create(&ex, &d, &o) == CAPEX_ERR_INVALID_ARG, "bad kind");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    CT_CHECK(capex__go_optim_create(&ex, &d, &o) == CAPEX_OK, "%s", capex_last_error());
    capex_optim_param_init(&p);
    p.param = w; p.grad = w; p.numel = 4;
    p.grad_dtype = (capex_dtype)5;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG, "bad grad dtype");
    p.grad_dtype = CAPEX_F32;
    p.model = w; p.model_dtype = CAPEX_F32;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG, "f32 model copy refused");
    p.model = NULL;
    p.grad = NULL;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL grad");
    p.grad = (char *)w + 1;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned grad");
    p.grad = w;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, NULL, 1, NULL) == CAPEX_ERR_INVALID_ARG, "NULL params");
    hp = d.defaults;
    hp.nesterov = 1;
    CT_CHECK(capex_cuda_optim_add_group(o, &hp, &p, 1, NULL) == CAPEX_ERR_CONFIG, "nesterov without momentum");
    CT_CHECK(capex_cuda_optim_num_groups(o) == 0, "unchanged after errors");
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "more than once"),
             "the same param in a second group: %s", capex_last_error());
    CT_CHECK(capex_cuda_optim_num_groups(o) == 1, "refused without change");
    CT_CHECK(capex_cuda_optim_get_state(o, 0, 0, &m, &v) == CAPEX_OK && m == 0 && v == 0, "SGD without momentum: no buffers");
    CT_CHECK(capex_cuda_optim_get_state(o, 0, 1, &m, &v) == CAPEX_ERR_INVALID_ARG, "bad index");
    hp = d.defaults;
    hp.momentum = 0.9f;
    CT_CHECK(capex_cuda_optim_set_hparams(o, 0, &hp, NULL) == CAPEX_ERR_CONFIG, "momentum needs buffers made at add_group");
    CT_CHECK(capex_cuda_optim_set_hparams(o, 1, &d.defaults, NULL) == CAPEX_ERR_INVALID_ARG, "bad group");
    CT_CHECK(capex_cuda_optim_set_lr(o, 0, -1.0f, NULL) == CAPEX_ERR_INVALID_ARG, "negative lr");
    CT_CHECK(capex_cuda_optim_lr_ptr(o, 1) == 0 && capex_cuda_optim_lr_ptr(o, 0) != 0, "lr_ptr");
    CT_CHECK(capex_cuda_optim_step(o, 2, 0, 0, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned inv_scale");
    CT_CHECK(rec.launches == 0, "nothing launched");
    CT_CHECK(capex_cuda_optim_step(o, 0, 0, 0, NULL) == CAPEX_OK, "step");
    CT_CHECK(rec.launches == 2 && rec.kernels[0] == CAPEX__GO_K_PREPARE && rec.kernels[1] == CAPEX__GO_K_SGD, "prepare + SGD f32");
    CT_CHECK(capex_cuda_optim_get_step(o, 0, &step, NULL) == CAPEX_OK && step == 0, "nothing ran: step %lld", (long long)step);
    CT_CHECK(capex_cuda_optim_get_step(o, 3, &step, NULL) == CAPEX_ERR_INVALID_ARG, "bad group");
    /* the group's config decides, not its tensors: an empty group (a device ZeRO
       rank holding no piece of it) and one of empty params refuse it too */
    p.numel = 0;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 0, NULL) == CAPEX_OK && capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) ==
             CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_set_hparams(o, 1, &hp, NULL) == CAPEX_ERR_CONFIG, "momentum on, empty group");
    CT_CHECK(capex_cuda_optim_set_hparams(o, 2, &hp, NULL) == CAPEX_ERR_CONFIG, "momentum on, a group of empty params");
    {   /* nor from_host: a host optimizer whose empty groups have momentum (no buffers to
           compare) was taken before 2026-11-28, leaving momentum on where set_hparams refuses it */
        capex_optim *h = NULL;
        capex_optim_hparams h0 = d.defaults;
        int g;
        p.numel = 4;
        CT_CHECK(capex_optim_create(&d, &h) == CAPEX_OK && capex_optim_add_group(h, &h0, &p, 1, NULL) == CAPEX_OK, "%s",
                 capex_last_error());
        p.numel = 0;
        for (g = 1; g < 3 && !ct->failed; g++)
            CT_CHECK(capex_optim_add_group(h, &hp, &p, g == 1 ? 0 : 1, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_optim_from_host(o, h, 0, NULL) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "momentum"),
                 "momentum on from the host, empty groups: %s", capex_last_error());
        CT_CHECK(capex_optim_set_hparams(h, 2, &h0) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_optim_from_host(o, h, 0, NULL) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "momentum"),
                 "momentum on from the host, an empty group: %s", capex_last_error());
        CT_CHECK(capex_optim_set_hparams(h, 1, &h0) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_optim_from_host(o, h, 0, NULL) == CAPEX_OK, "the same without momentum: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_from_host(o, h, 4u, NULL) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "flags"),
                 "from_host, unknown flags: %s", capex_last_error());
        /* another mode is taken, as capex_optim_load takes the file's (refused, naming it,
           before 2026-11-28); another kind is refused, named, and nothing taken */
        h->desc.wd_after_momentum = 1;
        CT_CHECK(capex_cuda_optim_from_host(o, h, 0, NULL) == CAPEX_OK && o->desc.wd_after_momentum,
                 "from_host, another mode: %s", capex_last_error());
        h->desc.wd_after_momentum = 0;
        h->desc.kind = CAPEX_OPTIM_ADAM;
        CT_CHECK(capex_cuda_optim_from_host(o, h, 0, NULL) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "kind 0") &&
                 o->desc.wd_after_momentum, "from_host, another kind: %s", capex_last_error());
        h->desc.kind = CAPEX_OPTIM_SGD;
        capex_optim_destroy(h);
        h = (capex_optim *)1;
        CT_CHECK(capex_cuda_optim_to_host(o, 4u, NULL, &h) == CAPEX_ERR_INVALID_ARG && !h && strstr(capex_last_error(), "flags"),
                 "to_host, unknown flags: %s", capex_last_error());
        capex_optim_destroy(h);
    }
    capex_cuda_optim_destroy(o);
    {
        capex_scaler_desc sd;
        capex_cuda_scaler *sc = NULL;
        capex_scaler_desc_init(&sd);
        sd.growth_factor = 0.5;
        CT_CHECK(capex__go_scaler_create(&ex, &sd, &sc) == CAPEX_ERR_INVALID_ARG && !sc, "bad scaler desc");
        CT_CHECK(capex__go_scaler_create(&ex, NULL, &sc) == CAPEX_OK, "defaults");
        CT_CHECK(capex_cuda_scaler_get_state(sc, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "NULL state");
        {
            float s = 0;
            CT_CHECK(capex_cuda_scaler_get_scale(sc, &s, NULL) == CAPEX_OK && s == 65536.0f, "initial scale %g", (double)s);
            CT_CHECK(capex_cuda_scaler_found_inf_ptr(sc) - capex_cuda_scaler_scale_ptr(sc) == 28, "layout");
        }
        capex_cuda_scaler_destroy(sc);
    }
}

/* Stochastic rounding to a bf16 model copy: a block holds the keys of its
   chunk's first 2^32-element window and the next (capex_go_sr), so every
   chunk the update kernels see must span at most two windows, whatever
   desc.exec.chunk_size says (the CPU keys each element by its own window).
   A 2^33 + 2^31-element SGD tensor (no buffers allocated), chunk_size 2^34:
   each recorded SGD launch's chunks decoded as capex_go_block does. */
static struct { int n; uint64_t chunk[4]; uint64_t meta[4][CAPEX__GO_META_SMALL / 8]; } sr_rec;
static capex_result sr_launch(void *u, int k, unsigned vb, unsigned grid, unsigned block, void **args, capex_cuda_stream s) {
    (void)u; (void)vb; (void)grid; (void)block; (void)s;
    if (k != CAPEX__GO_K_SGD + (int)CAPEX_BF16) return CAPEX_OK; /* prepare */
    if (sr_rec.n < 4) {
        memcpy(sr_rec.meta[sr_rec.n], args[0], CAPEX__GO_META_SMALL);
        sr_rec.chunk[sr_rec.n] = ((const capex__go_args *)args[1])->chunk;
    }
    sr_rec.n++;
    return CAPEX_OK;
}
CT_TEST(sr_chunks_span_two_windows) {
    capex__go_exec ex = rec_exec();
    capex_cuda_optim *o = NULL;
    capex_optim_desc d;
    capex_optim_param p;
    const int64_t numel = ((int64_t)1 << 33) + ((int64_t)1 << 31);
    const size_t T = CAPEX__GO_TDEF(CAPEX__GO_META_SMALL, CAPEX__GO_SGD_DEPTH);
    int64_t c, covered = 0, nchunks = 0;
    int32_t nt = 0;
    ex.launch = sr_launch;
    memset(&sr_rec, 0, sizeof sr_rec);
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.stochastic_rounding = 1;
    d.exec.chunk_size = (int64_t)1 << 34;
    CT_CHECK(capex__go_optim_create(&ex, &d, &o) == CAPEX_OK, "%s", capex_last_error());
    capex_optim_param_init(&p);
    p.param = (float *)(uintptr_t)0x100000000000ull; /* never dereferenced: the exec runs nothing */
    p.grad = (const void *)(uintptr_t)0x200000000000ull;
    p.grad_dtype = CAPEX_BF16;
    p.model = (void *)(uintptr_t)0x300000000000ull;
    p.model_dtype = CAPEX_BF16;
    p.numel = numel;
    CT_CHECK(capex_cuda_optim_add_group(o, NULL, &p, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_step(o, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(sr_rec.n == 1, "%d SGD launches", sr_rec.n);
    memcpy(&nt, sr_rec.meta[0] + (CAPEX__GO_SGD_DEPTH + 2) * T, 4);
    memcpy(&nchunks, sr_rec.meta[0] + (CAPEX__GO_SGD_DEPTH + 1) * T, 8);
    CT_CHECK(nt == 1 && sr_rec.chunk[0] > 0, "ntensors %d chunk %llu", nt, (unsigned long long)sr_rec.chunk[0]);
    for (c = 0; c < nchunks; c++) {
        uint64_t off = (uint64_t)c * sr_rec.chunk[0], left = (uint64_t)numel - off;
        uint64_t n = left < sr_rec.chunk[0] ? left : sr_rec.chunk[0];
        CT_CHECK(((off + n - 1) >> 32) - (off >> 32) <= 1, "chunk %lld [%llu, +%llu) spans more than two 2^32 windows",
                 (long long)c, (unsigned long long)off, (unsigned long long)n);
        covered += (int64_t)n;
    }
    CT_CHECK(covered == numel, "chunks cover %lld of %lld elements", (long long)covered, (long long)numel);
    capex_cuda_optim_destroy(o);
}

/* The ABI between host and kernels as NVRTC lays it out: each kernel's
   parameters in the PTX have exactly the sizes the host passes. */
static int ptx_params(const char *ptx, const char *name, long *sizes, int cap) {
    char head[96];
    const char *p, *end;
    int n = 0;
    snprintf(head, sizeof head, ".entry %s(", name);
    p = strstr(ptx, head);
    if (!p) return -1;
    end = strchr(p, ')');
    while (n < cap && (p = strstr(p, ".param")) != NULL && p < end) {
        const char *br = strchr(p, '[');
        const char *nl = strchr(p, '\n');
        sizes[n++] = br && nl && br < nl ? strtol(br + 1, NULL, 10) : 8;
        p += 6;
    }
    return n;
}

CT_TEST(kernel_parameters_match_the_host) {
    capex_cuda_target t;
    capex_cuda_image img;
    int n = 0, k;
    const char *const *opts = capex_cuda_builtin_options(&n);
    NEED_NVRTC();
    t.kind = CAPEX_CUDA_IMAGE_PTX;
    t.arch = 90;
    CT_CHECK(capex_cuda_nvrtc_compile(capex_cuda_builtin_source(), "capex_builtin", opts, n, t, &img) == CAPEX_OK, "%s",
             capex_last_error());
    for (k = 0; k < CAPEX__GO_NK; k++) {
        const char *name = capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k];
        long sz[4] = {0, 0, 0, 0}, want0;
        int np = ptx_params((const char *)img.data, name, sz, 4), depth;
        /* the host launches each with its CAPEX__GO_LISTS depth */
        if (k < CAPEX__GO_K_SUMSQ) depth = CAPEX__GO_SCALE_DEPTH;
        else if (k < CAPEX__GO_K_REDUCE) depth = CAPEX__GO_SUMSQ_DEPTH;
        else if (k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_SGD) depth = CAPEX__GO_ADAM_DEPTH;
        else if (k >= CAPEX__GO_K_SGD && k < CAPEX__GO_K_LAMB1) depth = CAPEX__GO_SGD_DEPTH;
        else if (k >= CAPEX__GO_K_LAMB1 && k < CAPEX__GO_K_LAMB_CLIP) depth = CAPEX__GO_LAMB1_DEPTH;
        else if (k == CAPEX__GO_K_LAMB2) depth = CAPEX__GO_LAMB2_DEPTH;
        else if (k >= CAPEX__GO_K_NOVO1 && k < CAPEX__GO_K_NOVO2) depth = CAPEX__GO_NOVO1_DEPTH;
        else if (k >= CAPEX__GO_K_NOVO2 && k < CAPEX__GO_K_NOVO_NORM) depth = CAPEX__GO_NOVO2_DEPTH;
        else depth = 0;
        want0 = depth ? (long)CAPEX__GO_META_SIZE(CAPEX__GO_META_SMALL, depth) : k == CAPEX__GO_K_REDUCE ? (long)sizeof(capex__go_segs) : 0;
        if (want0)
            CT_CHECK(np == 2 && sz[0] == want0 && sz[1] == (long)sizeof(capex__go_args),
                     "%s: %d params of %ld, %ld bytes; the host passes %ld, %zu", name, np, sz[0], sz[1], want0,
                     sizeof(capex__go_args));
        else
            CT_CHECK(np == 1 && sz[0] == (long)sizeof(capex__go_args), "%s: %d params of %ld bytes; the host passes %zu",
                     name, np, sz[0], sizeof(capex__go_args));
    }
    for (k = CAPEX__GO_K_ADAM_AMS; k < CAPEX__GO_NK_ALL; k++) { /* amsgrad: Adam's lists */
        const char *name = capex__cuda_builtin_kernels[CAPEX__GO_KBASE + k];
        long sz[4] = {0, 0, 0, 0};
        long want0 = (long)CAPEX__GO_META_SIZE(CAPEX__GO_META_SMALL, k < CAPEX__GO_K_ADAGRAD ? (int)CAPEX__GO_ADAM_DEPTH : (int)CAPEX__GO_ADAGRAD_DEPTH);
        int np = ptx_params((const char *)img.data, name, sz, 4);
        if (k == CAPEX__GO_K_ZERO_NORM || k == CAPEX__GO_K_LR_SCHED) { /* one thread, the args only */
            CT_CHECK(np == 1 && sz[0] == (long)sizeof(capex__go_args), "%s: %d params of %ld bytes; the host passes %zu",
                     name, np, sz[0], sizeof(capex__go_args));
            continue;
        }
        CT_CHECK(np == 2 && sz[0] == want0 && sz[1] == (long)sizeof(capex__go_args),
                 "%s: %d params of %ld, %ld bytes; the host passes %ld, %zu", name, np, sz[0], sz[1], want0,
                 sizeof(capex__go_args));
    }
    capex_cuda_image_free(&img);
}

static const ct_case cases[] = {
    CT_CASE(kernel_parameters_match_the_host),
    CT_CASE(kernel_table_matches_ids), CT_CASE(launch_metadata_packing), CT_CASE(no_context_is_a_clear_error),
    CT_CASE(op_argument_errors), CT_CASE(workspace_size_does_not_wrap), CT_CASE(clip_in_place_refused_before_launch), CT_CASE(partial_overlap_refused_before_launch),
    CT_CASE(optimizer_argument_errors), CT_CASE(no_driver_status), CT_CASE(sr_chunks_span_two_windows),
};
CT_MAIN(cases)
