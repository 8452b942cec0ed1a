/* NVRTC CPU time (getrusage of the compiling thread) of every built-in part,
   compiled as a precompile job compiles it (capex__cuda_unit_desc: built-in
   options, -minimal where NVRTC has it, no cache), best of REPS per part.
   bench/parts_cpu.sh runs it against a baseline commit, alternated.
     parts_cpu [--reps N] [--cc 90] [--meta 4096|32768]
   Prints "part NAME MS" per part, then "total MS". */
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

int main(int argc, char **argv) {
    int reps = 3, cc = 90, meta = CAPEX__GO_META_SMALL, i, p;
    double total = 0.0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cc") && i + 1 < argc) cc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--meta") && i + 1 < argc) meta = atoi(argv[++i]);
    }
    if (reps < 1) reps = 1;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    {   /* NVRTC's one-time start-up is not a part's */
        static const char warm[] = "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n";
        int archs[64], n = 0;
        capex_cuda_target t;
        capex_cuda_image img;
        if (capex_cuda_nvrtc_supported_archs(archs, 64, &n) != CAPEX_OK || capex_cuda_select_target(archs, n, cc, &t) != CAPEX_OK ||
            capex_cuda_nvrtc_compile(warm, "warm", NULL, 0, t, &img) != CAPEX_OK) {
            printf("no NVRTC: %s\n", capex_last_error());
            return 0;
        }
        capex_cuda_image_free(&img);
    }
    for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) {
        double best = -1.0;
        for (i = 0; i < reps; i++) {
            capex_cuda_compile_desc d;
            capex__cuda_unit_opts o;
            capex_cuda_image img;
            double t0, t1;
            capex__cuda_unit_desc(p, cc, meta, NULL, &o, &d);
            t0 = cpu_ms();
            if (capex__cuda_compile_ex(&d, 1, 1, &img) != CAPEX_OK) {
                fprintf(stderr, "%s: %s\n", capex_cuda_builtin_part_name(p), capex_last_error());
                return 1;
            }
            t1 = cpu_ms();
            if (best < 0.0 || t1 - t0 < best) best = t1 - t0;
            capex_cuda_image_free(&img);
        }
        printf("part %-13s %7.1f\n", capex_cuda_builtin_part_name(p), best);
        total += best;
    }
    printf("total %.1f\n", total);
    return 0;
}
