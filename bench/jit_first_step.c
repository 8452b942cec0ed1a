/* jit_first_step: the CPU time NVRTC takes to compile what the first AdamW
   step on bf16 gradients with a dynamic loss scaler launches (issue 18 item 6).
   Built twice by bench/jit_first_step.sh: against this tree's capex_cuda.h,
   and with -DJIT_OLD against an older commit's headers (a576c64 by default),
   whose first step compiled the whole parts amp, unscale_bf16 and adam_bf16
   (4 KB of launch metadata, the only size then).
   This tree compiles the variants capex__cuda_kernel_unit picks for the same
   launches (the path capex__go_dev_launch takes), without a cache, for sm_90,
   with 32 KB of launch metadata as a context on a CUDA 12.1+ driver and NVRTC
   compiles them (JIT_META=4096: the 4 KB build).
   JIT_OPT=ams, adagrad, sgd or lamb: the first step of Adam with amsgrad,
   Adagrad, SGD with momentum, LAMB or NovoGrad (novo) instead; JIT_OPT=norm (RMS=1: RMSNorm):
   a LayerNorm's first forward and backward, bf16 x and dy, f32 parameters
   (this tree's build only: compare with BASE_TREE=1 in the script).
   CPU time of the compiling thread (getrusage RUSAGE_THREAD: NVRTC runs on the
   caller's thread), best of --reps per program; the machine may be loaded.

       jit_first_step [--reps N] [--cc 90]
   prints one line per program ("unit NAME ms bytes") and "total MS". */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#define CAPEX_STATIC
#include "capex_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_ms(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return (double)u.ru_utime.tv_sec * 1e3 + (double)u.ru_utime.tv_usec / 1e3 + (double)u.ru_stime.tv_sec * 1e3 +
           (double)u.ru_stime.tv_usec / 1e3;
}

/* Compiles (source, name, options) reps times; the least CPU time. d (this
   tree): through capex__cuda_compile_ex as a built-in unit, no cache (what a
   first launch runs: -minimal where NVRTC has it). */
static double best_of(const char *src, const char *name, const char *const *opts, int n_opts, capex_cuda_target t, int reps,
                      size_t *bytes, const void *d) {
    double best = -1.0;
    int i;
    for (i = 0; i < reps; i++) {
        capex_cuda_image img;
        double t0 = cpu_ms(), t1;
        capex_result r;
#ifndef JIT_OLD
        if (d) r = capex__cuda_compile_ex((const capex_cuda_compile_desc *)d, 1, 1, &img);
        else
#endif
            r = capex_cuda_nvrtc_compile(src, name, opts, n_opts, t, &img);
        (void)d;
        if (r != CAPEX_OK) {
            fprintf(stderr, "%s: %s\n", name, capex_last_error());
            exit(1);
        }
        t1 = cpu_ms();
        if (best < 0.0 || t1 - t0 < best) best = t1 - t0;
        *bytes = img.size;
        capex_cuda_image_free(&img);
    }
    return best;
}

int main(int argc, char **argv) {
    int reps = 3, cc = 90, i, archs[64], n_archs = 0;
    double total = 0.0;
    capex_cuda_target t;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cc") && i + 1 < argc) cc = atoi(argv[++i]);
    }
    if (reps < 1) reps = 1;
    if (capex_cuda_nvrtc_supported_archs(archs, 64, &n_archs) != CAPEX_OK ||
        capex_cuda_select_target(archs, n_archs, cc, &t) != CAPEX_OK) {
        printf("no NVRTC: %s\n", capex_last_error());
        return 0;
    }
    {   /* NVRTC's one-time start-up is not the step's (both builds pay it once) */
        static const char warm[] = "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n";
        size_t b;
        best_of(warm, "warm", NULL, 0, t, 1, &b, NULL);
    }
#ifdef JIT_OLD
    if (getenv("JIT_OPT") && strcmp(getenv("JIT_OPT"), "adam")) {
        fprintf(stderr, "jit_first_step: JIT_OPT=%s needs a baseline built as a tree (BASE_TREE=1)\n", getenv("JIT_OPT"));
        return 1;
    }
    {
        static const char *const parts[] = {"amp", "unscale_bf16", "adam_bf16"};
        int n_opts = 0, p, k;
        const char *const *opts = capex_cuda_builtin_options(&n_opts);
        for (k = 0; k < 3; k++) {
            size_t bytes = 0;
            double ms;
            for (p = 0; p < capex_cuda_builtin_part_count(); p++)
                if (!strcmp(capex_cuda_builtin_part_name(p), parts[k])) break;
            ms = best_of(capex_cuda_builtin_part_source(p), parts[k], opts, n_opts, t, reps, &bytes, NULL);
            printf("unit %-24s %8.1f ms %8zu bytes\n", parts[k], ms, bytes);
            total += ms;
        }
    }
#else
    {
        /* the launches: unscale in place (capex_cuda_scaler_unscale(grads, grads)),
           prepare, AdamW on bf16 grads with an fp32 master and a bf16 model copy
           (O2; JIT_MODEL=0: no model copy, as capex_info's step), scaler update */
        const char *mk_env = getenv("JIT_MODEL"), *meta_env = getenv("JIT_META"), *opt = getenv("JIT_OPT");
        /* the metadata size a context picks: 32 KB with driver and NVRTC 12.1+ on sm_70+
           (JIT_META=4096: the 4 KB build, a576c64's only one) */
        const int meta = meta_env && atoi(meta_env) == 4096 ? CAPEX__GO_META_SMALL : CAPEX__GO_META_LARGE;
        int mk = mk_env ? atoi(mk_env) & 3 : 2, seen[CAPEX__CUDA_N_UNITS], k, nk = 4;
        const int lamb = opt && !strcmp(opt, "lamb");
        /* the optimizer's launches (LAMB: stage 1, clip, ratio, stage 2), then the scaler's update */
        size_t ks[9] = {CAPEX__CK_GO_SCALE_BF16_BF16, CAPEX__CK_GO_PREPARE,
                        opt && !strcmp(opt, "ams")       ? (size_t)CAPEX__CK_GO_ADAM_AMS_BF16
                        : opt && !strcmp(opt, "adagrad") ? (size_t)CAPEX__CK_GO_ADAGRAD_BF16
                        : opt && !strcmp(opt, "sgd")     ? (size_t)CAPEX__CK_GO_SGD_BF16
                        : lamb                           ? (size_t)CAPEX__CK_GO_LAMB1_BF16
                                                         : (size_t)CAPEX__CK_GO_ADAM_BF16,
                        CAPEX__CK_GO_SCALER_UPDATE};
        unsigned vbs[9] = {CAPEX__CUDA_VB(0, 0, 1, 0), CAPEX__CUDA_VB(0, 0, 0, 0), CAPEX__CUDA_VB(1, mk, 0, 0),
                           CAPEX__CUDA_VB(0, 0, 0, 0)};
        if (opt && !strcmp(opt, "norm")) { /* CAPEX__CUDA_NVB(bf16, f32, bf16, rms), spelled out: a BASE_TREE baseline lacks the macro */
            const unsigned nvb = 1u | 2u << 1 | 0u << 3 | 2u << 5 | (getenv("RMS") && atoi(getenv("RMS")) ? 1u : 0u) << 7;
            ks[0] = CAPEX__CK_NORM_FWD; ks[1] = CAPEX__CK_NORM_BWD_DX; ks[2] = CAPEX__CK_NORM_BWD_GAMMA_PART;
            ks[3] = CAPEX__CK_NORM_BWD_GAMMA_FINAL;
            vbs[0] = vbs[1] = vbs[2] = vbs[3] = nvb;
        }
        if (opt && !strcmp(opt, "novo")) { /* pass 1, its per-tensor sums (reduce), v and denom, pass 2 */
            ks[2] = CAPEX__CK_GO_NOVO1_BF16; vbs[2] = CAPEX__CUDA_VB(0, mk, 0, 0);
            ks[3] = CAPEX__CK_GO_REDUCE; vbs[3] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[4] = CAPEX__CK_GO_NOVO_NORM; vbs[4] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[5] = CAPEX__CK_GO_NOVO2_BF16; vbs[5] = CAPEX__CUDA_VB(0, mk, 0, 0);
            ks[6] = CAPEX__CK_GO_SCALER_UPDATE; vbs[6] = CAPEX__CUDA_VB(0, 0, 0, 0);
            nk = 7;
        }
        if (lamb) { /* + the global grad norm (sum of squares, reduce) before LAMB's clip */
            ks[3] = CAPEX__CK_GO_SUMSQ_BF16; vbs[3] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[4] = CAPEX__CK_GO_REDUCE; vbs[4] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[5] = CAPEX__CK_GO_LAMB_CLIP; vbs[5] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[6] = CAPEX__CK_GO_LAMB_RATIO; vbs[6] = CAPEX__CUDA_VB(0, 0, 0, 0);
            ks[7] = CAPEX__CK_GO_LAMB2; vbs[7] = CAPEX__CUDA_VB(1, mk, 0, 0);
            ks[8] = CAPEX__CK_GO_SCALER_UPDATE; vbs[8] = CAPEX__CUDA_VB(0, 0, 0, 0);
            nk = 9;
        }
        memset(seen, 0, sizeof seen);
        pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
        for (k = 0; k < nk; k++) {
            int u = capex__cuda_kernel_unit(ks[k], vbs[k]);
            capex_cuda_compile_desc d;
            capex__cuda_unit_opts o;
            size_t bytes = 0;
            double ms;
            if (seen[u]++) continue;
            capex__cuda_unit_desc(u, cc, meta, NULL, &o, &d);
            ms = best_of(d.source, d.name, d.options, d.n_options, t, reps, &bytes, &d);
            printf("unit %-24s %8.1f ms %8zu bytes\n", capex__cuda_unit_name(u), ms, bytes);
            total += ms;
        }
    }
#endif
    printf("total %.1f\n", total);
    return 0;
}
