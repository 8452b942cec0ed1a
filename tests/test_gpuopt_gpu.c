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
CT_TEST(gpu_lr_schedule) { GPU_ENV(e, 21); par_schedule(ct, &e, 0); }
CT_TEST(gpu_adagrad) { GPU_ENV(e, 22); par_adagrad(ct, &e); }
CT_TEST(gpu_adam_amsgrad) { GPU_ENV(e, 23); par_adam_amsgrad(ct, &e); }
CT_TEST(gpu_pure_half) { GPU_ENV(e, 24); par_pure_half_steps(ct, &e); }

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
    edestroy(exec);
    gdestroy(graph);
    capex_cuda_stream_destroy(e.ctx, st);
    capex_cuda_scaler_destroy(sc);
    par_opt_free(&e, &o);
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

static const ct_case cases[] = {
    CT_CASE(gpu_grid_from_device), CT_CASE(gpu_scale_every_dtype_pair), CT_CASE(gpu_scale_many_tensors), CT_CASE(gpu_l2norm), CT_CASE(gpu_sumsq_order), CT_CASE(gpu_clip),
    CT_CASE(gpu_adam), CT_CASE(gpu_sgd), CT_CASE(gpu_lamb), CT_CASE(gpu_novograd), CT_CASE(gpu_scaler), CT_CASE(gpu_amp_loop_inf_skips), CT_CASE(gpu_checkpoint_roundtrip),
    CT_CASE(gpu_lr_schedule),
    CT_CASE(gpu_graph_replay), CT_CASE(gpu_tensor_over_2g_elements),
    CT_CASE(gpu_adagrad), CT_CASE(gpu_adam_amsgrad), CT_CASE(gpu_pure_half),
};

int main(int argc, char **argv) {
    int r = ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
    capex_cuda_context_destroy(gpu_ctx);
    return r;
}
