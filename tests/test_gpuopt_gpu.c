/* The fused kernels on a real GPU (`make gpu-test`; every test skips without
   one): parity with capex.h's CPU backend for every kernel (tests/gpuopt_parity.h:
   fresh random inputs, poisoned outputs, odd sizes, misaligned tensors, more
   tensors than one launch holds, inf/NaN-injected steps that must skip), a
   mixed-precision step captured in a CUDA graph and replayed (no host
   synchronisation inside a step), and tensors over 2^31 elements when the GPU
   has the memory. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include <dlfcn.h>
#include <math.h>

/* The CUDA driver maps memory where ASan's shadow gap lies, and keeps
   allocations for the life of the process. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

#include "gpuopt_parity.h"

static capex_cuda_context *gpu_ctx;
static int gpu_state; /* 0 untried, 1 ok, -1 none */
static char gpu_why[300];

static capex_cuda_context *open_gpu(void) {
    if (gpu_state == 0) {
        int n = 0;
        capex_cuda_context_desc cd;
        capex_result r = capex_cuda_device_count(&n);
        gpu_state = -1;
        if (r != CAPEX_OK || n == 0) {
            snprintf(gpu_why, sizeof gpu_why, "no GPU (%s): %.200s", capex_result_string(r), r == CAPEX_OK ? "0 devices" : capex_last_error());
            return NULL;
        }
        capex_cuda_context_desc_init(&cd);
        cd.device = 0;
        if (capex_cuda_context_create(&cd, &gpu_ctx) != CAPEX_OK) {
            snprintf(gpu_why, sizeof gpu_why, "context: %.250s", capex_last_error());
            return NULL;
        }
        gpu_state = 1;
    }
    return gpu_state == 1 ? gpu_ctx : NULL;
}

#define GPU_ENV(e, seed_)                                                                  \
    env e;                                                                                \
    do {                                                                                  \
        capex_cuda_context *c_ = open_gpu();                                              \
        if (!c_) CT_SKIP("%s", gpu_why);                                                  \
        memset(&e, 0, sizeof e);                                                          \
        CT_CHECK(capex__go_dev_exec(c_, "test", &e.ex) == CAPEX_OK, "exec");              \
        e.ctx = c_;                                                                       \
        e.seed = (seed_);                                                                  \
    } while (0)

/* Multi-tensor grids are sized from the device: SMs x the kernel's resident
   blocks (cuOccupancyMaxActiveBlocksPerMultiprocessor), 0 (the fixed default)
   when the driver cannot say. On the emulator: CAPEX_EMU_SMS and
   CAPEX_EMU_OCCUPANCY (tests/emu.mk runs both shapes and the fallback). */
CT_TEST(gpu_grid_from_device) {
    const char *occ_env = getenv("CAPEX_EMU_OCCUPANCY");
    unsigned g512, g256;
    GPU_ENV(e, 30);
    CT_CHECK(e.ex.grid != NULL, "the device exec sizes grids");
    g512 = e.ex.grid(e.ex.user, CAPEX__GO_K_ADAM, 0, 512);
    g256 = e.ex.grid(e.ex.user, CAPEX__GO_K_LAMB1, 0, 256);
    CT_CHECK(g512 == e.ex.grid(e.ex.user, CAPEX__GO_K_ADAM, 0, 512), "asked once, the same again");
    if (occ_env && !strcmp(occ_env, "0")) {
        CT_CHECK(g512 == 0 && g256 == 0, "no occupancy: the default grid (got %u, %u)", g512, g256);
    } else {
        capex_cuda_device_info info;
        int sms;
        CT_CHECK(capex_cuda_device_get_info(0, &info) == CAPEX_OK, "info");
        sms = info.sm_count;
        CT_CHECK(g512 > 0 && g512 % (unsigned)sms == 0 && g512 / (unsigned)sms <= 4u, "Adam: %u blocks on %d SMs", g512, sms);
        CT_CHECK(g256 > 0 && g256 % (unsigned)sms == 0 && g256 / (unsigned)sms <= 8u, "LAMB1: %u blocks on %d SMs", g256, sms);
        if (strstr(info.name, "capex CPU emulator"))
            CT_CHECK(g512 == (unsigned)sms * (occ_env && occ_env[0] ? (unsigned)atoi(occ_env) : 4u), "emulator: %u", g512);
    }
}

CT_TEST(gpu_scale_every_dtype_pair) { GPU_ENV(e, 11); par_scale(ct, &e); }
CT_TEST(gpu_scale_check_positions) { GPU_ENV(e, 32); par_scale_check_positions(ct, &e, CAPEX__GO_THREADS); }
CT_TEST(gpu_scale_many_tensors) { GPU_ENV(e, 12); par_scale_many(ct, &e); }
CT_TEST(gpu_l2norm) { GPU_ENV(e, 13); par_norms(ct, &e); }
CT_TEST(gpu_sumsq_order) { GPU_ENV(e, 31); par_sumsq_order(ct, &e, CAPEX__GO_THREADS); }
CT_TEST(gpu_clip) { GPU_ENV(e, 14); par_clip(ct, &e); }
CT_TEST(gpu_adam) { GPU_ENV(e, 15); par_adam(ct, &e); }
CT_TEST(gpu_sgd) { GPU_ENV(e, 16); par_sgd(ct, &e); }
CT_TEST(gpu_lamb) { GPU_ENV(e, 17); par_lamb(ct, &e); }
CT_TEST(gpu_novograd) { GPU_ENV(e, 18); par_novograd(ct, &e); }
CT_TEST(gpu_scaler) { GPU_ENV(e, 18); par_scaler(ct, &e); }
CT_TEST(gpu_amp_loop_inf_skips) { GPU_ENV(e, 19); par_amp_loop(ct, &e, NULL); }
CT_TEST(gpu_checkpoint_roundtrip) { GPU_ENV(e, 20); par_checkpoint(ct, &e); }
CT_TEST(gpu_resume_other_modes) { GPU_ENV(e, 26); par_resume_modes(ct, &e); }
CT_TEST(gpu_lr_schedule) { GPU_ENV(e, 21); par_schedule(ct, &e, 0); }
CT_TEST(gpu_adagrad) { GPU_ENV(e, 22); par_adagrad(ct, &e); }
CT_TEST(gpu_adam_amsgrad) { GPU_ENV(e, 23); par_adam_amsgrad(ct, &e); }
CT_TEST(gpu_pure_half) { GPU_ENV(e, 24); par_pure_half_steps(ct, &e); }
CT_TEST(gpu_options_mid_training) { GPU_ENV(e, 25); par_options(ct, &e); }

/* ---- a step captured in a CUDA graph and replayed ---- */
typedef int (*cu_begin_t)(void *, int);
typedef int (*cu_end_t)(void *, void **);
typedef int (*cu_inst_t)(void **, void *, unsigned long long);
typedef int (*cu_launch_t)(void *, void *);
typedef int (*cu_destroy_t)(void *);
/* dlsym into a function pointer without an object-to-function cast (ISO C) */
static void sym(void *lib, const char *name, void *fnptr, size_t size) {
    void *p = dlsym(lib, name);
    memset(fnptr, 0, size);
    if (p && size == sizeof p) memcpy(fnptr, &p, size);
}

CT_TEST(gpu_graph_replay) {
    const char *path = getenv("CAPEX_LIBCUDA_PATH");
    void *lib;
    cu_begin_t begin;
    cu_end_t end;
    cu_inst_t inst;
    cu_launch_t glaunch;
    cu_destroy_t gdestroy, edestroy;
    capex_cuda_stream st = NULL;
    capex_cuda_module *mod;
    capex_optim_desc d;
    capex_scaler_desc sd;
    capex_scaler cpu_sc;
    capex_cuda_scaler *sc = NULL;
    par_opt o;
    void *graph = NULL, *exec = NULL;
    capex_tensor dg[3][24];
    int nd[3] = {0, 0, 0}, rep, i, k;
    GPU_ENV(e, 20);
    lib = dlopen(path && path[0] ? path : "libcuda.so.1", RTLD_NOW);
    CT_CHECK(lib, "dlopen libcuda: %s", dlerror());
    sym(lib, "cuStreamBeginCapture_v2", &begin, sizeof begin);
    sym(lib, "cuStreamEndCapture", &end, sizeof end);
    sym(lib, "cuGraphInstantiateWithFlags", &inst, sizeof inst);
    sym(lib, "cuGraphLaunch", &glaunch, sizeof glaunch);
    sym(lib, "cuGraphDestroy", &gdestroy, sizeof gdestroy);
    sym(lib, "cuGraphExecDestroy", &edestroy, sizeof edestroy);
    if (!begin || !end || !inst || !glaunch || !gdestroy || !edestroy) CT_SKIP("this driver lacks the CUDA graph API");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.1f;
    capex_scaler_desc_init(&sd);
    sd.init_scale = 4096.0f;
    sd.growth_interval = 2;
    sd.log_interval = 0;
    CT_CHECK(par_opt_make(&e, &o, &d, 24, 0), "setup: %s", capex_last_error());
    { /* count_skipped: each replay advances the device's iteration count, the overflow's too (LINEAR: no cos or
         pow, whose CUDA results may differ from libm by an ulp) */
        capex_lr_schedule ls;
        capex_lr_schedule_init(&ls, CAPEX_LR_LINEAR);
        ls.warmup_steps = 2; ls.total_steps = 6; ls.min_factor = 0.25; ls.count_skipped = 1;
        CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &ls) == CAPEX_OK &&
                 capex_cuda_optim_set_lr_schedule(o.dev, &ls, NULL) == CAPEX_OK, "%s", capex_last_error());
    }
    CT_CHECK(capex_scaler_init(&cpu_sc, &sd) == CAPEX_OK, "cpu scaler");
    CT_CHECK(capex_cuda_scaler_create(e.ctx, &sd, &sc) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_stream_create(e.ctx, &st) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_builtin_module(e.ctx, &mod) == CAPEX_OK, "%s", capex_last_error()); /* compile before capture */
    for (k = 0; k < o.n; k++) {
        int g = (int)o.t[k].gd;
        dg[g][nd[g]].data = (void *)(uintptr_t)o.t[k].dg;
        dg[g][nd[g]].numel = o.t[k].numel;
        nd[g]++;
    }
    CT_CHECK(capex_cuda_context_synchronize(e.ctx) == CAPEX_OK, "sync");
    CT_CHECK(begin(st, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */) == 0, "cuStreamBeginCapture_v2");
    for (i = 0; i < 3; i++) {
        capex_tensor_list dl = capex_tensor_list_make((capex_dtype)i, dg[i], (size_t)nd[i]);
        CT_CHECK(capex_cuda_scaler_unscale(sc, NULL, &dl, NULL, st) == CAPEX_OK, "%s", capex_last_error());
    }
    CT_CHECK(capex_cuda_optim_step(o.dev, capex_cuda_scaler_inv_scale_ptr(sc), 0, capex_cuda_scaler_found_inf_ptr(sc), st) ==
             CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_scaler_update(sc, st) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(end(st, &graph) == 0 && graph, "cuStreamEndCapture: a call in the step synchronised with the host");
    CT_CHECK(inst(&exec, graph, 0) == 0, "cuGraphInstantiateWithFlags");
    for (rep = 0; rep < 4; rep++) {
        int found = 0, go = 0;
        float s, inv, ds = 0;
        for (k = 0; k < o.n; k++) { /* new grads each replay; an inf in replay 1 */
            par_param *t = &o.t[k];
            par_fill(&e.seed, t->gd, t->g, t->numel, 3000.0f, rep == 1 && k == 7 ? 1 : 0);
            CT_CHECK(par_up(&e, t->dg, t->g, (size_t)t->numel * capex_dtype_size(t->gd)), "up");
        }
        CT_CHECK(capex_scaler_scale(&cpu_sc, &s) == CAPEX_OK, "scale");
        for (i = 0; i < 3; i++) {
            capex_tensor hg[24];
            int n = 0;
            for (k = 0; k < o.n; k++)
                if ((int)o.t[k].gd == i) { hg[n].data = o.t[k].g; hg[n].numel = o.t[k].numel; n++; }
            {
                capex_tensor_list hl = capex_tensor_list_make((capex_dtype)i, hg, (size_t)n);
                CT_CHECK(capex_multi_tensor_scale(NULL, &hl, &hl, 1.0f, &found) == CAPEX_OK, "cpu check");
            }
        }
        CT_CHECK(capex_scaler_unscale(&cpu_sc, 0, found, &inv) == CAPEX_OK && capex_scaler_step(&cpu_sc, 0, &go) == CAPEX_OK, "cpu");
        CT_CHECK(capex_optim_step(o.cpu, inv, 1.0f, !go) == CAPEX_OK && capex_scaler_update(&cpu_sc) == CAPEX_OK, "cpu step");
        CT_CHECK(glaunch(exec, st) == 0, "cuGraphLaunch");
        CT_CHECK(capex_cuda_stream_synchronize(e.ctx, st) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, &e, &o, 0, "graph replay");
        if (ct->failed) break;
        CT_CHECK(capex_cuda_scaler_get_scale(sc, &ds, NULL) == CAPEX_OK && (s = capex_scaler_get_scale(&cpu_sc)) == ds, "replay %d: scale %g, CPU %g", rep, (double)ds, (double)s);
    }
    if (!ct->failed) {
        int64_t nd_ = -1, nc = -2;
        CT_CHECK(capex_cuda_optim_get_lr_iteration(o.dev, &nd_, NULL) == CAPEX_OK &&
                 capex_optim_get_lr_iteration(o.cpu, &nc) == CAPEX_OK && nd_ == 4 && nc == 4,
                 "lr schedule iteration after 4 replays: device %lld, CPU %lld", (long long)nd_, (long long)nc);
    }
    edestroy(exec);
    gdestroy(graph);
    capex_cuda_stream_destroy(e.ctx, st);
    capex_cuda_scaler_destroy(sc);
    par_opt_free(&e, &o);
}

/* ---- the public multi-tensor entries (capex_cuda_multi_tensor_scale,
   _l2norm, capex_cuda_clip_grad_norm) against float64 ----
   1500 tensors of 1..37 elements (more than one launch holds with 4 KB and
   with 32 KB of parameters) and one of 70001 (two chunks): the norm and
   every per-tensor norm within 1 float ulp of sqrt of the float64 sum of
   squares; an f16 -> f32 unscale by 0.5 exact, an inf in tensor 1400 found
   (check only) and a clean list leaves found_inf 0; clipping to a quarter of
   the norm: the factor max_norm / (total + 1e-6) within 1 ulp of float64
   and every grad exactly f32(g * factor). Before 2026-11-28 only the
   2^31-element test (skipped on the emulator) called them on a device. */
enum { PUB_NT = 1501 };
static int ulp_close(float got, double want) {
    float w = (float)want;
    return fabsf(got - w) <= fmaxf(fabsf(nextafterf(w, INFINITY) - w), fabsf(w - nextafterf(w, -INFINITY)));
}
CT_TEST(gpu_public_multi_tensor_entries) {
    static capex_tensor dx[PUB_NT], dh[PUB_NT], dout[PUB_NT];
    static int64_t numel[PUB_NT], off[PUB_NT + 1];
    static double sq[PUB_NT];
    capex_cuda_ptr X = 0, H = 0, O = 0, ws = 0, dtot = 0, dper = 0, dscale = 0, dfound = 0, dcoef = 0;
    float *hxv, *back, tot, coef, *per, half = 0.5f;
    uint16_t *hh;
    uint32_t found = 7;
    size_t ws_bytes = 0, i;
    int64_t e, total = 0;
    double all = 0, want_coef, max_norm;
    capex_tensor_list lx, lh, lo;
    uint64_t sd;
    GPU_ENV(env_, 33);
    sd = env_.seed;
    for (i = 0; i < PUB_NT; i++) {
        numel[i] = i == 700 ? 70001 : 1 + (int64_t)(i % 37);
        off[i] = total;
        total += (numel[i] + 3) & ~(int64_t)3;
    }
    off[PUB_NT] = total;
    hxv = (float *)malloc((size_t)total * 4);
    back = (float *)malloc((size_t)total * 4);
    hh = (uint16_t *)malloc((size_t)total * 2);
    per = (float *)malloc(PUB_NT * 4);
    CT_CHECK(hxv && back && hh && per, "host memory");
    for (i = 0; i < PUB_NT; i++) {
        sq[i] = 0;
        for (e = 0; e < numel[i]; e++) {
            float v = par_uniform(&sd) * (i % 5 == 0 ? 1e3f : 1.0f);
            hxv[off[i] + e] = v;
            hh[off[i] + e] = capex_f32_to_f16(v * 1e-3f);
            sq[i] += (double)v * v;
        }
        all += sq[i];
    }
    CT_CHECK(capex_cuda_malloc(env_.ctx, (size_t)total * 4, &X) == CAPEX_OK && capex_cuda_malloc(env_.ctx, (size_t)total * 2, &H) == CAPEX_OK &&
             capex_cuda_malloc(env_.ctx, (size_t)total * 4, &O) == CAPEX_OK && capex_cuda_malloc(env_.ctx, 4, &dtot) == CAPEX_OK &&
             capex_cuda_malloc(env_.ctx, PUB_NT * 4, &dper) == CAPEX_OK && capex_cuda_malloc(env_.ctx, 4, &dscale) == CAPEX_OK &&
             capex_cuda_malloc(env_.ctx, 4, &dfound) == CAPEX_OK && capex_cuda_malloc(env_.ctx, 4, &dcoef) == CAPEX_OK,
             "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_htod(env_.ctx, X, hxv, (size_t)total * 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_htod(env_.ctx, H, hh, (size_t)total * 2, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_htod(env_.ctx, dscale, &half, 4, NULL) == CAPEX_OK &&
             capex_cuda_memset_u32(env_.ctx, dfound, 0, 1, NULL) == CAPEX_OK, "up");
    for (i = 0; i < PUB_NT; i++) {
        dx[i].data = (void *)(uintptr_t)(X + 4u * (uint64_t)off[i]);
        dx[i].numel = numel[i];
        dh[i].data = (void *)(uintptr_t)(H + 2u * (uint64_t)off[i]);
        dh[i].numel = numel[i];
        dout[i].data = (void *)(uintptr_t)(O + 4u * (uint64_t)off[i]);
        dout[i].numel = numel[i];
    }
    lx = capex_tensor_list_make(CAPEX_F32, dx, PUB_NT);
    lh = capex_tensor_list_make(CAPEX_F16, dh, PUB_NT);
    lo = capex_tensor_list_make(CAPEX_F32, dout, PUB_NT);
    /* norms */
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &lx, 1, &ws_bytes) == CAPEX_OK &&
             capex_cuda_malloc(env_.ctx, ws_bytes, &ws) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_multi_tensor_l2norm(env_.ctx, NULL, &lx, ws, ws_bytes, dtot, dper, NULL) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(env_.ctx, &tot, dtot, 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(env_.ctx, per, dper, PUB_NT * 4, NULL) == CAPEX_OK, "down");
    CT_CHECK(ulp_close(tot, sqrt(all)), "total norm %.9g, float64 %.17g", (double)tot, sqrt(all));
    for (i = 0; i < PUB_NT; i++)
        CT_CHECK(ulp_close(per[i], sqrt(sq[i])), "tensor %zu norm %.9g, float64 %.17g", i, (double)per[i], sqrt(sq[i]));
    /* unscale f16 -> f32 by 0.5: exact */
    CT_CHECK(capex_cuda_multi_tensor_scale(env_.ctx, NULL, &lh, &lo, dscale, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(env_.ctx, back, O, (size_t)total * 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(env_.ctx, &found, dfound, 4, NULL) == CAPEX_OK, "down");
    CT_CHECK(found == 0, "found_inf %u on finite grads", found);
    for (i = 0; i < PUB_NT; i++)
        for (e = 0; e < numel[i]; e++)
            CT_CHECK(back[off[i] + e] == (float)((double)capex_f16_to_f32(hh[off[i] + e]) * 0.5), "tensor %zu [%lld]: %.9g",
                     i, (long long)e, (double)back[off[i] + e]);
    {   /* check only, an inf in tensor 1400 */
        uint16_t inf16 = 0x7c00;
        CT_CHECK(capex_cuda_memcpy_htod(env_.ctx, H + 2u * (uint64_t)(off[1400] + numel[1400] - 1), &inf16, 2, NULL) == CAPEX_OK,
                 "poke");
        CT_CHECK(capex_cuda_multi_tensor_scale(env_.ctx, NULL, &lh, NULL, dscale, dfound, NULL) == CAPEX_OK, "%s",
                 capex_last_error());
        CT_CHECK(capex_cuda_memcpy_dtoh(env_.ctx, &found, dfound, 4, NULL) == CAPEX_OK && found == 1, "found_inf %u", found);
    }
    /* clipping to a quarter of the norm, applied */
    max_norm = (double)(float)(sqrt(all) / 4);
    CT_CHECK(capex_cuda_clip_grad_norm(env_.ctx, NULL, &lx, 1, (float)max_norm, ws, ws_bytes, dtot, dcoef, 1, NULL) == CAPEX_OK,
             "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(env_.ctx, &tot, dtot, 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(env_.ctx, &coef, dcoef, 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(env_.ctx, back, X, (size_t)total * 4, NULL) == CAPEX_OK, "down");
    want_coef = max_norm / ((double)tot + 1e-6);
    CT_CHECK(ulp_close(tot, sqrt(all)), "clip total %.9g, float64 %.17g", (double)tot, sqrt(all));
    CT_CHECK(ulp_close(coef, want_coef) && coef < 1.0f, "clip factor %.9g, float64 %.17g", (double)coef, want_coef);
    for (i = 0; i < PUB_NT; i++)
        for (e = 0; e < numel[i]; e++)
            CT_CHECK(back[off[i] + e] == (float)((double)hxv[off[i] + e] * coef), "clipped tensor %zu [%lld]: %.9g, want %.9g",
                     i, (long long)e, (double)back[off[i] + e], (double)hxv[off[i] + e] * coef);
    capex_cuda_free(env_.ctx, X); capex_cuda_free(env_.ctx, H); capex_cuda_free(env_.ctx, O); capex_cuda_free(env_.ctx, ws);
    capex_cuda_free(env_.ctx, dtot); capex_cuda_free(env_.ctx, dper); capex_cuda_free(env_.ctx, dscale);
    capex_cuda_free(env_.ctx, dfound); capex_cuda_free(env_.ctx, dcoef);
    free(hxv); free(back); free(hh); free(per);
}

/* ---- more than 2^31 elements in one tensor ---- */
CT_TEST(gpu_tensor_over_2g_elements) {
    const int64_t n = ((int64_t)1 << 31) + 1001;
    size_t fr = 0, tot = 0, ws_bytes = 0;
    capex_cuda_ptr x = 0, m = 0, v = 0, gr = 0, dn = 0, df = 0, ws = 0;
    capex_tensor t;
    capex_tensor_list l;
    float norm = 0, inf = INFINITY, one = 1.0f, tail[4], ref;
    uint32_t found = 0;
    capex_cuda_optim *opt = NULL;
    capex_optim_desc d;
    capex_optim_param p;
    GPU_ENV(e, 21);
    CT_CHECK(capex_cuda_mem_info(e.ctx, &fr, &tot) == CAPEX_OK, "mem_info");
    if (fr < (size_t)n * 16u + ((size_t)1 << 30))
        CT_SKIP("needs %.1f GB of free GPU memory, %.1f GB free", (double)n * 16 / 1e9 + 1, (double)fr / 1e9);
    CT_CHECK(capex_cuda_malloc(e.ctx, (size_t)n * 4, &x) == CAPEX_OK && capex_cuda_malloc(e.ctx, (size_t)n * 4, &gr) == CAPEX_OK,
             "%s", capex_last_error());
    CT_CHECK(capex_cuda_fill_f32(e.ctx, x, 1.0f, (size_t)n, NULL) == CAPEX_OK, "fill");
    t.data = (void *)(uintptr_t)x;
    t.numel = n;
    l = capex_tensor_list_make(CAPEX_F32, &t, 1);
    CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, &l, 1, &ws_bytes) == CAPEX_OK, "ws");
    CT_CHECK(capex_cuda_malloc(e.ctx, ws_bytes, &ws) == CAPEX_OK && capex_cuda_malloc(e.ctx, 4, &dn) == CAPEX_OK &&
             capex_cuda_malloc(e.ctx, 4, &df) == CAPEX_OK, "alloc");
    CT_CHECK(capex_cuda_multi_tensor_l2norm(e.ctx, NULL, &l, ws, ws_bytes, dn, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(e.ctx, &norm, dn, 4, NULL) == CAPEX_OK, "down");
    CT_CHECK(norm == (float)sqrt((double)n), "norm of %lld ones: %.9g, want %.9g (64-bit indexing)", (long long)n,
             (double)norm, sqrt((double)n));
    /* an inf past INT_MAX is found */
    CT_CHECK(capex_cuda_memcpy_htod(e.ctx, x + ((uint64_t)n - 3) * 4, &inf, 4, NULL) == CAPEX_OK, "poke");
    CT_CHECK(capex_cuda_memset_u32(e.ctx, df, 0, 1, NULL) == CAPEX_OK && capex_cuda_memcpy_htod(e.ctx, dn, &one, 4, NULL) == CAPEX_OK, "zero");
    CT_CHECK(capex_cuda_multi_tensor_scale(e.ctx, NULL, &l, NULL, dn, df, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(e.ctx, &found, df, 4, NULL) == CAPEX_OK && found == 1, "inf at element 2^31+998 found");
    /* one AdamW step on it: the last elements equal the first */
    CT_CHECK(capex_cuda_fill_f32(e.ctx, x, 0.5f, (size_t)n, NULL) == CAPEX_OK &&
             capex_cuda_fill_f32(e.ctx, gr, 0.25f, (size_t)n, NULL) == CAPEX_OK, "fill");
    capex_cuda_free(e.ctx, ws);
    ws = 0;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.1f;
    capex_optim_param_init(&p);
    p.param = (float *)(uintptr_t)x;
    p.grad = (const void *)(uintptr_t)gr;
    p.numel = n;
    CT_CHECK(capex_cuda_optim_create(e.ctx, &d, &opt) == CAPEX_OK && capex_cuda_optim_add_group(opt, NULL, &p, 1, NULL) == CAPEX_OK,
             "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_step(opt, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(e.ctx, tail, x + ((uint64_t)n - 4) * 4, 16, NULL) == CAPEX_OK, "down");
    {
        float hp = 0.5f, hg = 0.25f;
        capex_optim *cpu;
        capex_optim_param cp;
        capex_optim_param_init(&cp);
        cp.param = &hp; cp.grad = &hg; cp.numel = 1;
        CT_CHECK(capex_optim_create(&d, &cpu) == CAPEX_OK && capex_optim_add_group(cpu, NULL, &cp, 1, NULL) == CAPEX_OK &&
                 capex_optim_step(cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu");
        capex_optim_destroy(cpu);
        ref = hp;
    }
    CT_CHECK(par_f2u(tail[0]) == par_f2u(ref) && par_f2u(tail[3]) == par_f2u(ref), "last elements %.9g %.9g, CPU %.9g",
             (double)tail[0], (double)tail[3], (double)ref);
    capex_cuda_optim_destroy(opt);
    (void)m; (void)v;
    capex_cuda_free(e.ctx, x);
    capex_cuda_free(e.ctx, gr);
    capex_cuda_free(e.ctx, dn);
    capex_cuda_free(e.ctx, df);
}

/* ---- 32 KB kernel parameters where the driver takes them ----
   A context decides once (CAPEX_CUDA_PARAMS; driver 12.1+, sm_70+, NVRTC
   12.1+: capex__cuda_params_choose) and builds its multi-tensor parts for that
   metadata size: -DCAPEX_GO_META=<large> is in the cache key, so a context of
   the other size never finds (in memory or on disk) such a module. Four
   contexts in one process on one fresh cache directory: the default, one
   forced to 4 KB (CAPEX_CUDA_PARAMS=4096), then both again from the cache.
   Each runs two Adam steps over 300 small tensors, launches counted, weights
   and moments bit-identical to the CPU's. On the emulator the driver is
   12.1+ (large) unless CAPEX_EMU_DRIVER_VERSION says otherwise
   (tests/emu.mk runs 12.0 too). */
enum { BIG_N = 300, BIG_MANY = 2500 };
static int big_launches, big_adam_launches, big_scale_launches;
static capex_result big_count_launch(void *user, int k, unsigned vb, unsigned grid, unsigned block, void **args,
                                     capex_cuda_stream s) {
    big_launches++;
    big_adam_launches += k >= CAPEX__GO_K_ADAM && k < CAPEX__GO_K_ADAM + 3;
    big_scale_launches += k >= CAPEX__GO_K_SCALE && k < CAPEX__GO_K_SCALE + 9;
    return capex__go_dev_launch(user, k, vb, grid, block, args, s);
}

typedef struct big_case {
    int64_t off[BIG_N + 1]; /* tensor i: elements [off[i], off[i] + numel[i]) of the flat arrays */
    int64_t numel[BIG_N];
    float *p0, *g, *p, *m, *v; /* initial weights, grads; the CPU's results */
} big_case;

/* A context on cache dir `dir` with CAPEX_CUDA_PARAMS = params (NULL: the
   environment's own), the variable restored after. */
static capex_cuda_context *big_ctx(const char *params, const char *dir) {
    capex_cuda_context_desc cd;
    capex_cuda_context *c = NULL;
    const char *old = getenv("CAPEX_CUDA_PARAMS");
    char keep[64];
    int had = old != NULL;
    snprintf(keep, sizeof keep, "%s", old ? old : "");
    if (params) setenv("CAPEX_CUDA_PARAMS", params, 1);
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.cache_dir = dir;
    if (capex_cuda_context_create(&cd, &c) != CAPEX_OK) c = NULL;
    if (params) {
        if (had) setenv("CAPEX_CUDA_PARAMS", keep, 1);
        else unsetenv("CAPEX_CUDA_PARAMS");
    }
    return c;
}

/* CT_CHECK that does not return (for the helpers that clean up and return a value) */
#define BIG_CHECK(cond, ...)                                                  \
    do {                                                                      \
        if (!(cond) && !ct->failed) ct_fail(ct, __FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)

/* Two Adam steps on c; *launches: the first step's (all kernels, Adam's). 1: ran and matched the CPU bit for bit. */
static int big_run(ct_state *ct, capex_cuda_context *c, const big_case *b, int *launches, int *adam) {
    capex__go_exec ex;
    capex_optim_desc d;
    capex_optim_param dp[BIG_N];
    capex_cuda_optim *opt = NULL;
    capex_cuda_ptr dpar = 0, dgrad = 0;
    size_t bytes = (size_t)b->off[BIG_N] * 4;
    float *back = (float *)malloc(bytes + 4);
    int i, ok = 0, s;
    int64_t k;
    if (!back || capex__go_dev_exec(c, "test", &ex) != CAPEX_OK || capex_cuda_malloc(c, bytes, &dpar) != CAPEX_OK ||
        capex_cuda_malloc(c, bytes, &dgrad) != CAPEX_OK || capex_cuda_memcpy_htod(c, dpar, b->p0, bytes, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(c, dgrad, b->g, bytes, NULL) != CAPEX_OK)
        goto out;
    ex.launch = big_count_launch;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.lr = 1e-2f;
    d.defaults.weight_decay = 0.01f;
    for (i = 0; i < BIG_N; i++) {
        capex_optim_param_init(&dp[i]);
        dp[i].param = (float *)(uintptr_t)(dpar + (uint64_t)b->off[i] * 4);
        dp[i].grad = (const void *)(uintptr_t)(dgrad + (uint64_t)b->off[i] * 4);
        dp[i].numel = b->numel[i];
    }
    if (capex__go_optim_create(&ex, &d, &opt) != CAPEX_OK || capex_cuda_optim_add_group(opt, NULL, dp, BIG_N, NULL) != CAPEX_OK)
        goto out;
    for (s = 0; s < 2; s++) {
        big_launches = big_adam_launches = 0;
        if (capex_cuda_optim_step(opt, 0, 0, 0, NULL) != CAPEX_OK) goto out;
        if (s == 0) { *launches = big_launches; *adam = big_adam_launches; }
    }
    if (capex_cuda_memcpy_dtoh(c, back, dpar, bytes, NULL) != CAPEX_OK) goto out;
    ok = 1;
    for (k = 0; k < b->off[BIG_N]; k++) ok &= par_f2u(back[k]) == par_f2u(b->p[k]);
    BIG_CHECK(ok, "weights differ from the CPU's");
    for (i = 0; ok && i < BIG_N; i++) {
        capex_cuda_ptr dm = 0, dv = 0;
        float mv[2][700];
        ok = capex_cuda_optim_get_state(opt, 0, (size_t)i, &dm, &dv) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(c, mv[0], dm, (size_t)b->numel[i] * 4, NULL) == CAPEX_OK &&
             capex_cuda_memcpy_dtoh(c, mv[1], dv, (size_t)b->numel[i] * 4, NULL) == CAPEX_OK;
        for (k = 0; ok && k < b->numel[i]; k++)
            ok = par_f2u(mv[0][k]) == par_f2u(b->m[b->off[i] + k]) && par_f2u(mv[1][k]) == par_f2u(b->v[b->off[i] + k]);
        BIG_CHECK(ok, "tensor %d: moments differ from the CPU's", i);
    }
out:
    BIG_CHECK(ok, "%s", capex_last_error());
    capex_cuda_optim_destroy(opt);
    capex_cuda_free(c, dpar);
    capex_cuda_free(c, dgrad);
    free(back);
    return ok;
}

/* capex__go_scale over BIG_MANY tiny tensors (more than one launch holds even
   with the large metadata) on c, bit-identical to the CPU; its launches. */
static int big_scale_many(ct_state *ct, capex_cuda_context *c) {
    static capex_tensor hin[BIG_MANY], hout[BIG_MANY], din[BIG_MANY], dout[BIG_MANY];
    static float src[BIG_MANY * 3], ref[BIG_MANY * 3], back[BIG_MANY * 3];
    capex_tensor_list li, lo, di, dl;
    capex__go_exec ex;
    capex_cuda_ptr dbuf = 0, dscale = 0;
    uint64_t seed = 7;
    float sc = 0.75f;
    int64_t at = 0, total;
    int i, found = 0, n = -1;
    for (i = 0; i < BIG_MANY; i++) {
        int64_t ne = i % 5 == 4 ? 0 : 1 + i % 3; /* some empty */
        hin[i].numel = hout[i].numel = din[i].numel = dout[i].numel = ne;
        hin[i].data = src + at;
        hout[i].data = ref + at;
        at += ne;
    }
    total = at;
    par_fill(&seed, CAPEX_F32, src, at, 4.0f, 0);
    li = capex_tensor_list_make(CAPEX_F32, hin, BIG_MANY);
    lo = capex_tensor_list_make(CAPEX_F32, hout, BIG_MANY);
    BIG_CHECK(capex_multi_tensor_scale(NULL, &li, &lo, sc, &found) == CAPEX_OK, "cpu");
    if (capex__go_dev_exec(c, "test", &ex) != CAPEX_OK || capex_cuda_malloc(c, (size_t)at * 8, &dbuf) != CAPEX_OK ||
        capex_cuda_malloc(c, 4, &dscale) != CAPEX_OK || capex_cuda_memcpy_htod(c, dscale, &sc, 4, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_htod(c, dbuf, src, (size_t)at * 4, NULL) != CAPEX_OK)
        goto out;
    for (at = 0, i = 0; i < BIG_MANY; i++) {
        din[i].data = (void *)(uintptr_t)(dbuf + (uint64_t)at * 4);
        dout[i].data = (void *)(uintptr_t)(dbuf + (uint64_t)(total + at) * 4);
        at += din[i].numel;
    }
    ex.launch = big_count_launch;
    big_scale_launches = 0;
    di = capex_tensor_list_make(CAPEX_F32, din, BIG_MANY);
    dl = capex_tensor_list_make(CAPEX_F32, dout, BIG_MANY);
    if (capex__go_scale(&ex, "t", NULL, &di, &dl, dscale, 0, 0, NULL) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(c, back, dbuf + (uint64_t)total * 4, (size_t)total * 4, NULL) != CAPEX_OK)
        goto out;
    n = big_scale_launches;
    BIG_CHECK(!memcmp(back, ref, (size_t)at * 4), "scale of %d tensors differs from the CPU's", BIG_MANY);
out:
    BIG_CHECK(n >= 0, "scale: %s", capex_last_error());
    capex_cuda_free(c, dbuf);
    capex_cuda_free(c, dscale);
    return n;
}

static int big_entries(const char *dir) {
    char cmd[300];
    FILE *f;
    int n = -1;
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '\\.capexjit$'", dir);
    f = popen(cmd, "r");
    if (f && fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

CT_TEST(gpu_large_params) {
    big_case b;
    capex_cuda_context *cx[4] = {NULL, NULL, NULL, NULL};
    capex_cuda_module *ma = NULL, *mb = NULL;
    capex_optim *cpu = NULL;
    capex_optim_desc d;
    capex_optim_param cp[BIG_N];
    char dir[64] = "/tmp/capex_bigparam_XXXXXX", cmd[128];
    int launches[4] = {0, 0, 0, 0}, adam[4] = {0, 0, 0, 0}, entries[4] = {0, 0, 0, 0}, want, drv = 0, M = 0, mi = 0, i;
    int from_cache = 0, expect_large, t_big, t_small, sl, ss;
    uint64_t seed = 41;
    if (!open_gpu()) CT_SKIP("%s", gpu_why);
    /* what the default context should pick, from the same inputs */
    CT_CHECK(capex_cuda_driver_version(&drv) == CAPEX_OK && capex_cuda_nvrtc_version(&M, &mi) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex__cuda_params_choose(getenv("CAPEX_CUDA_PARAMS"), drv, gpu_ctx->device_cc, M * 1000 + mi * 10, &want) == CAPEX_OK,
             "%s", capex_last_error());
    expect_large = want == CAPEX__GO_META_LARGE;
    CT_CHECK(gpu_ctx->meta_bytes == want, "the test's context: %d bytes of metadata, want %d", gpu_ctx->meta_bytes, want);
    memset(&b, 0, sizeof b);
    for (i = 0; i < BIG_N; i++) {
        b.numel[i] = 1 + (i * 37) % 700;
        b.off[i + 1] = b.off[i] + b.numel[i] + (i % 3 == 1); /* every third next one misaligned */
    }
    b.p0 = (float *)calloc((size_t)b.off[BIG_N] + 1, 4);
    b.g = (float *)calloc((size_t)b.off[BIG_N] + 1, 4);
    b.p = (float *)calloc((size_t)b.off[BIG_N] + 1, 4);
    CT_CHECK(b.p0 && b.g && b.p, "malloc");
    par_fill(&seed, CAPEX_F32, b.p0, b.off[BIG_N], 1.0f, 0);
    par_fill(&seed, CAPEX_F32, b.g, b.off[BIG_N], 3.0f, 0);
    memcpy(b.p, b.p0, (size_t)b.off[BIG_N] * 4);
    /* the CPU's two steps, its moments kept in place (valid while cpu lives) */
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.lr = 1e-2f;
    d.defaults.weight_decay = 0.01f;
    for (i = 0; i < BIG_N; i++) {
        capex_optim_param_init(&cp[i]);
        cp[i].param = b.p + b.off[i];
        cp[i].grad = b.g + b.off[i];
        cp[i].numel = b.numel[i];
    }
    CT_CHECK(capex_optim_create(&d, &cpu) == CAPEX_OK && capex_optim_add_group(cpu, NULL, cp, BIG_N, NULL) == CAPEX_OK &&
             capex_optim_step(cpu, 1.0f, 1.0f, 0) == CAPEX_OK && capex_optim_step(cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu");
    b.m = (float *)calloc((size_t)b.off[BIG_N] + 1, 4);
    b.v = (float *)calloc((size_t)b.off[BIG_N] + 1, 4);
    CT_CHECK(b.m && b.v, "malloc");
    for (i = 0; i < BIG_N; i++) {
        float *m = NULL, *v = NULL;
        CT_CHECK(capex_optim_get_state(cpu, 0, (size_t)i, &m, &v) == CAPEX_OK && m && v, "cpu state");
        memcpy(b.m + b.off[i], m, (size_t)b.numel[i] * 4);
        memcpy(b.v + b.off[i], v, (size_t)b.numel[i] * 4);
    }
    CT_CHECK(mkdtemp(dir) != NULL, "temp dir");
    /* 0: the environment's choice, 1: forced 4 KB, then both again: from the cache */
    for (i = 0; i < 4 && !ct->failed; i++) {
        cx[i] = big_ctx(i % 2 ? "4096" : NULL, dir);
        CT_CHECK(cx[i] != NULL, "context %d: %s", i, capex_last_error());
        CT_CHECK(cx[i]->meta_bytes == (i % 2 ? CAPEX__GO_META_SMALL : want), "context %d: %d bytes of metadata", i,
                 cx[i]->meta_bytes);
        if (!big_run(ct, cx[i], &b, &launches[i], &adam[i])) break;
        entries[i] = big_entries(dir);
    }
    t_big = CAPEX__GO_TDEF(CAPEX__GO_META_LARGE, CAPEX__GO_ADAM_DEPTH);
    t_small = CAPEX__GO_TDEF(CAPEX__GO_META_SMALL, CAPEX__GO_ADAM_DEPTH);
    if (!ct->failed) {
        if (getenv("CT_VERBOSE"))
            printf("note: Adam step of %d tensors: %d launches (%d Adam) with %d bytes of metadata, %d (%d) with %d\n", BIG_N,
                   launches[0], adam[0], want, launches[1], adam[1], CAPEX__GO_META_SMALL);
        CT_CHECK(adam[0] == (BIG_N + (expect_large ? t_big : t_small) - 1) / (expect_large ? t_big : t_small) &&
                 adam[1] == (BIG_N + t_small - 1) / t_small, "Adam launches %d and %d (slots %d / %d)", adam[0], adam[1], t_big, t_small);
        CT_CHECK(expect_large ? launches[0] < launches[1] : launches[0] == launches[1], "launches per step %d (default), %d (4 KB)",
                 launches[0], launches[1]);
        CT_CHECK(launches[2] == launches[0] && launches[3] == launches[1], "again: %d, %d", launches[2], launches[3]);
        /* the forced context built its own multi-tensor parts (new entries) unless both are 4 KB; the
           second pair compiled nothing */
        CT_CHECK(entries[0] > 0 && (expect_large ? entries[1] > entries[0] : entries[1] == entries[0]) &&
                 entries[2] == entries[1] && entries[3] == entries[1], "cache entries %d %d %d %d", entries[0], entries[1],
                 entries[2], entries[3]);
        for (i = 0; i < 4; i++) {
            CT_CHECK(capex_cuda_builtin_part_module(cx[i], CAPEX__CP_ADAM_F32, &ma) == CAPEX_OK &&
                     capex_cuda_module_info(ma, NULL, &from_cache) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(from_cache == (i >= 2 || (i == 1 && !expect_large)), "context %d: Adam part from_cache %d", i, from_cache);
        }
        CT_CHECK(capex_cuda_builtin_part_module(cx[0], CAPEX__CP_ADAM_F32, &ma) == CAPEX_OK &&
                 capex_cuda_builtin_part_module(cx[1], CAPEX__CP_ADAM_F32, &mb) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK((memcmp(ma->key, mb->key, 32) != 0) == expect_large, "the two sizes' Adam modules have %s keys",
                 expect_large ? "the same" : "different");
        /* more tensors than one launch holds, both sizes */
        sl = big_scale_many(ct, cx[0]);
        ss = big_scale_many(ct, cx[1]);
        want = (BIG_MANY - BIG_MANY / 5 + CAPEX__GO_TDEF(cx[0]->meta_bytes, CAPEX__GO_SCALE_DEPTH) - 1) /
               CAPEX__GO_TDEF(cx[0]->meta_bytes, CAPEX__GO_SCALE_DEPTH);
        if (getenv("CT_VERBOSE")) printf("note: scale of %d tensors: %d launches (%d bytes), %d (4 KB)\n", BIG_MANY, sl, cx[0]->meta_bytes, ss);
        CT_CHECK(sl == want && sl >= 2, "scale: %d launches, want %d", sl, want);
        CT_CHECK(expect_large ? ss > sl : ss == sl, "scale: %d launches with 4 KB", ss);
    }
    for (i = 0; i < 4; i++) capex_cuda_context_destroy(cx[i]);
    capex_optim_destroy(cpu);
    free(b.p0); free(b.g); free(b.p); free(b.m); free(b.v);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_CHECK(system(cmd) == 0, "clean up");
}

static const ct_case cases[] = {
    CT_CASE(gpu_grid_from_device), CT_CASE(gpu_scale_every_dtype_pair), CT_CASE(gpu_scale_check_positions), CT_CASE(gpu_scale_many_tensors), CT_CASE(gpu_l2norm), CT_CASE(gpu_sumsq_order), CT_CASE(gpu_clip),
    CT_CASE(gpu_adam), CT_CASE(gpu_sgd), CT_CASE(gpu_lamb), CT_CASE(gpu_novograd), CT_CASE(gpu_scaler), CT_CASE(gpu_amp_loop_inf_skips), CT_CASE(gpu_checkpoint_roundtrip), CT_CASE(gpu_resume_other_modes),
    CT_CASE(gpu_lr_schedule),
    CT_CASE(gpu_graph_replay), CT_CASE(gpu_tensor_over_2g_elements),
    CT_CASE(gpu_adagrad), CT_CASE(gpu_adam_amsgrad), CT_CASE(gpu_pure_half), CT_CASE(gpu_options_mid_training),
    CT_CASE(gpu_large_params), CT_CASE(gpu_public_multi_tensor_entries),
};

int main(int argc, char **argv) {
    int r = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    capex_cuda_context_destroy(gpu_ctx);
    return r;
}
