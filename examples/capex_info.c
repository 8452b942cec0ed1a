/* capex_info: what capex's CUDA backend finds on this machine.

   Prints the capex version, the CUDA driver, NVRTC (and the archs it can emit)
   and NCCL versions or why each is missing, the GPUs, the arch capex would
   compile for, the kernel cache directory, and times a cold compile (NVRTC,
   no cache) and a warm one (from the disk cache) of the built-in kernels;
   on a GPU also the module load and the first AdamW step in a fresh cache
   (its parts compiled in the background from add_group, against compiling
   them one after another). `capex_info --parts` also compiles each
   built-in part alone (what its first use costs); `capex_info --parts --phases`
   adds NVRTC's split of each (front end, NVVM optimizer, ptxas). Exits 0 whenever it could report.

       cc -O2 examples/capex_info.c -o capex_info -ldl -lm -lpthread   (or: make info) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Removes the entries a timing run wrote into its private cache directory. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1200];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Reads the table NVRTC's --time=FILE wrote for one compile ("name, phase,
   value, ms" lines), sums it into front end, NVVM optimizer and PTX to SASS,
   then empties the file for the next compile. 0 when NVRTC wrote none (an
   NVRTC without --time fails the compile instead). */
static int read_phases(const char *path, double ph[3]) {
    FILE *f = fopen(path, "r");
    char line[512];
    int any = 0;
    ph[0] = ph[1] = ph[2] = 0.0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        const char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        double v;
        if (!c2 || sscanf(c2 + 1, "%lf", &v) != 1) continue; /* the header line has no number */
        if (strstr(c1, "Frontend")) ph[0] += v;
        else if (strstr(c1, "NVVM")) ph[1] += v;
        else if (strstr(c1, "PTX")) ph[2] += v;
        else continue;
        any = 1;
    }
    fclose(f);
    f = fopen(path, "w");
    if (f) fclose(f);
    return any;
}

/* The first AdamW step on bf16 gradients in a fresh cache: add_group starts
   compiling what its step launches on threads (the variants of amp and
   adam_bf16 for its kernels and switches), so the step waits for the slower
   one; before, first use compiled the two whole parts one after the other
   (timed here with capex_cuda_builtin_part_module). */
static void first_step(void) {
    enum { N = 1 << 20 };
    const char *kernels[] = {"capex_go_prepare", "capex_go_adam_bf16"};
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    capex_cuda_optim *opt = NULL;
    capex_optim_desc od;
    capex_optim_param pa;
    capex_cuda_module *m;
    capex_cuda_ptr w = 0, g = 0;
    char dir[] = "/tmp/capex_info_XXXXXX", dir2[] = "/tmp/capex_info_XXXXXX";
    double t0, t2, t3;
    capex_result r;
    if (!mkdtemp(dir) || !mkdtemp(dir2)) return;
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.cache_dir = dir;
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    od.adam_w_mode = 1;
    capex_optim_param_init(&pa);
    pa.grad_dtype = CAPEX_BF16;
    pa.numel = N;
    r = capex_cuda_context_create(&cd, &ctx);
    if (r == CAPEX_OK) r = capex_cuda_malloc(ctx, (size_t)N * 4, &w);
    if (r == CAPEX_OK) r = capex_cuda_malloc(ctx, (size_t)N * 2, &g);
    if (r == CAPEX_OK) r = capex_cuda_memset_u8(ctx, w, 0, (size_t)N * 4, NULL);
    if (r == CAPEX_OK) r = capex_cuda_memset_u8(ctx, g, 0, (size_t)N * 2, NULL);
    if (r == CAPEX_OK) r = capex_cuda_optim_create(ctx, &od, &opt);
    pa.param = (float *)(uintptr_t)w;
    pa.grad = (const void *)(uintptr_t)g;
    t0 = now_ms();
    if (r == CAPEX_OK) r = capex_cuda_optim_add_group(opt, NULL, &pa, 1, NULL);
    if (r == CAPEX_OK) r = capex_cuda_optim_step(opt, 0, 0, 0, NULL);
    if (r == CAPEX_OK) r = capex_cuda_context_synchronize(ctx);
    t2 = now_ms();
    capex_cuda_optim_destroy(opt);
    if (ctx) {
        capex_cuda_free(ctx, g);
        capex_cuda_free(ctx, w);
        capex_cuda_context_destroy(ctx);
        ctx = NULL;
    }
    if (r != CAPEX_OK) {
        printf("first AdamW step: %s\n", capex_last_error());
    } else {
        cd.cache_dir = dir2;
        r = capex_cuda_context_create(&cd, &ctx);
        t3 = now_ms();
        if (r == CAPEX_OK) r = capex_cuda_builtin_part_module(ctx, capex_cuda_builtin_kernel_part(kernels[0]), &m);
        if (r == CAPEX_OK) r = capex_cuda_builtin_part_module(ctx, capex_cuda_builtin_kernel_part(kernels[1]), &m);
        printf("first AdamW step (2^20 params, bf16 grads, cold cache): %.1f ms from add_group (its variants compile on "
               "threads from add_group); the 2 whole parts one after another: %.1f ms\n",
               t2 - t0, r == CAPEX_OK ? now_ms() - t3 : -1.0);
        capex_cuda_context_destroy(ctx);
    }
    remove_dir(dir);
    remove_dir(dir2);
}

int main(int argc, char **argv) {
    int drv = 0, nv_major = 0, nv_minor = 0, nccl = 0, n_dev = 0, archs[64], n_archs = 0, i;
    int have_nvrtc, have_gpu = 0, target_cc = 0, parts = 0, phases = 0;
    capex_cuda_cache cache;
    capex_result r;

    /* a typo is an error, not a full report (with cold compiles) that ignored it */
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--parts")) parts = 1;
        else if (!strcmp(argv[i], "--phases")) phases = 1;
        else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "capex_info: unknown option %s\n", argv[i]);
            fprintf(help ? stdout : stderr, "usage: capex_info [--parts [--phases]]\n"
                    "  --parts    also compile each built-in kernel part alone (its first-use cost)\n"
                    "  --phases   with --parts: NVRTC's front end / NVVM / ptxas split of each\n");
            return help ? 0 : 2;
        }
    }
    if (phases && !parts) { fprintf(stderr, "capex_info: --phases goes with --parts\n"); return 2; }

    printf("capex %s\n", CAPEX_VERSION_STRING);

    r = capex_cuda_driver_version(&drv);
    if (r == CAPEX_OK) printf("CUDA driver: %d.%d\n", drv / 1000, (drv % 1000) / 10);
    else if (drv > 0) printf("CUDA driver: %d.%d, but no usable GPU (%s): %s\n", drv / 1000, (drv % 1000) / 10,
                             capex_result_string(r), capex_last_error());
    else printf("CUDA driver: unavailable (%s): %s\n", capex_result_string(r), capex_last_error());

    have_nvrtc = capex_cuda_nvrtc_version(&nv_major, &nv_minor) == CAPEX_OK;
    if (have_nvrtc) {
        capex_cuda_nvrtc_supported_archs(archs, 64, &n_archs);
        printf("NVRTC: %d.%d from %s\n  CUBIN archs:", nv_major, nv_minor, capex_cuda_nvrtc_path());
        for (i = 0; i < n_archs; i++) printf(" sm_%d", archs[i]);
        printf("\n");
    } else {
        printf("NVRTC: unavailable (%s): %s\n", capex_result_string(CAPEX_ERR_NO_NVRTC), capex_last_error());
    }

    if ((r = capex_cuda_nccl_version(&nccl)) == CAPEX_OK)
        printf("NCCL: %d.%d.%d\n", nccl / 10000, (nccl / 100) % 100, nccl % 100);
    else
        printf("NCCL: unavailable (%s): %s\n", capex_result_string(r), capex_last_error());

    if (capex_cuda_device_count(&n_dev) == CAPEX_OK) {
        printf("GPUs: %d\n", n_dev);
        for (i = 0; i < n_dev; i++) {
            capex_cuda_device_info info;
            if (capex_cuda_device_get_info(i, &info) != CAPEX_OK) {
                printf("  %d: %s\n", i, capex_last_error());
                continue;
            }
            printf("  %d: %s, sm_%d%d, %d SMs, %.1f GiB", i, info.name, info.cc_major, info.cc_minor, info.sm_count,
                   info.total_bytes / 1073741824.0);
            if (info.peak_bandwidth_gbs > 0) printf(", %.0f GB/s peak", info.peak_bandwidth_gbs);
            printf("\n");
        }
        /* the GPU a default context takes ($LOCAL_RANK, CUDA_VISIBLE_DEVICES) */
        if (n_dev > 0) {
            capex_cuda_context *ctx = NULL;
            if (capex_cuda_context_create(NULL, &ctx) == CAPEX_OK) {
                const capex_cuda_device_info *info = capex_cuda_context_device(ctx);
                target_cc = info->cc_major * 10 + info->cc_minor;
                have_gpu = 1;
                printf("default context: GPU %d\n", info->ordinal);
                capex_cuda_context_destroy(ctx);
            } else {
                printf("default context: %s\n", capex_last_error());
            }
        }
    } else {
        printf("GPUs: none (%s)\n", capex_last_error());
    }

    if (have_nvrtc) {
        capex_cuda_target t;
        int cc = target_cc ? target_cc : 90;
        if (capex_cuda_select_target(archs, n_archs, cc, &t) == CAPEX_OK)
            printf("compile target%s: %s_%d (%s)\n", target_cc ? "" : " for an sm_90 GPU (none here)",
                   t.kind == CAPEX_CUDA_IMAGE_CUBIN ? "sm" : "compute", t.arch,
                   t.kind == CAPEX_CUDA_IMAGE_CUBIN ? "CUBIN for the exact GPU" : "PTX, finished by the driver");
        else
            printf("compile target for sm_%d: refused: %s\n", cc, capex_last_error());
    } else {
        printf("compile target: unknown (no NVRTC)\n");
    }

    capex_cuda_cache_init(&cache, NULL);
    if (cache.enabled) {
        printf("kernel cache: %s\n", cache.dir);
    } else {
        const char *env = getenv("CAPEX_CACHE_DIR"), *home = getenv("HOME");
        printf("kernel cache: disabled (%s)\n", cache.warned ? "directory path over 1023 bytes"
                                                 : env && !env[0] ? "CAPEX_CACHE_DIR is set but empty"
                                                 : !home || !home[0] ? "no CAPEX_CACHE_DIR, XDG_CACHE_HOME or HOME"
                                                                     : "unknown reason");
    }
    if (!have_nvrtc) printf("compile timing: skipped (no NVRTC to compile with)\n");

    /* Cold vs warm compile of the built-in program, in a private cache directory
       so the user's cache is neither used nor disturbed. */
    if (have_nvrtc) {
        char dir[] = "/tmp/capex_info_XXXXXX";
        capex_cuda_image cold[64], warm[64];
        int np = capex_cuda_builtin_part_count(), p, hits = 0;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        size_t bytes = 0;
        int cubin = 0;
        double t0, t1, t2;
        if (!mkdtemp(dir)) {
            printf("timing: no temporary directory\n");
            return 0;
        }
        capex_cuda_cache_init(&cache, dir);
        /* all parts at once on one thread per CPU, as capex_cuda_precompile does */
        t0 = now_ms();
        r = np <= 64 ? capex_cuda_builtin_compile_parts(target_cc ? target_cc : 90, &cache, 0, cold) : CAPEX_ERR_LIMIT;
        t1 = now_ms();
        if (r != CAPEX_OK) {
            printf("cold compile failed: %s\n", capex_last_error());
        } else {
            r = capex_cuda_builtin_compile_parts(target_cc ? target_cc : 90, &cache, 0, warm);
            t2 = now_ms();
            cubin = cold[0].kind == CAPEX_CUDA_IMAGE_CUBIN;
            for (p = 0; p < np; p++) {
                bytes += cold[p].size;
                hits += r == CAPEX_OK && warm[p].from_cache;
                capex_cuda_image_free(&cold[p]);
                if (r == CAPEX_OK) capex_cuda_image_free(&warm[p]);
            }
            printf("built-in kernels (%zu chars of source, %d parts): cold compile of all %.1f ms (NVRTC on %ld threads, "
                   "%zu bytes of %s), warm %.2f ms (disk cache, %d/%d hits)\n",
                   strlen(capex_cuda_builtin_source()), np, t1 - t0, ncpu > np ? (long)np : ncpu, bytes,
                   cubin ? "CUBIN" : "PTX", t2 - t1, hits, np);
        }
        if (have_gpu) {
            capex_cuda_context_desc cd;
            capex_cuda_context *ctx;
            capex_cuda_context_desc_init(&cd);
            cd.device = 0;
            cd.cache_dir = dir;
            if (capex_cuda_context_create(&cd, &ctx) == CAPEX_OK) {
                t0 = now_ms();
                r = capex_cuda_precompile(ctx, 0);
                t1 = now_ms();
                if (r == CAPEX_OK) printf("module load of all parts from the warm cache on GPU 0: %.2f ms\n", t1 - t0);
                else printf("module load failed: %s\n", capex_last_error());
                capex_cuda_context_destroy(ctx);
            } else {
                printf("context: %s\n", capex_last_error());
            }
        }
        remove_dir(dir);
        if (have_gpu) first_step();
        /* --parts: each part alone, serially, without a cache (what a lazy first use costs);
           --parts --phases adds NVRTC's own split of each compile (its --time option):
           front end, NVVM optimizer, PTX to SASS (ptxas) */
        if (parts) {
            int n_opts = 0, p, k, np = capex_cuda_builtin_part_count();
            const char *const *builtin_opts = capex_cuda_builtin_options(&n_opts);
            const char *opts[32];
            char time_dir[] = "/tmp/capex_info_XXXXXX", time_opt[96] = "", time_path[64] = "";
            capex_cuda_target t;
            double sum = 0.0, phase_sum[3] = {0.0, 0.0, 0.0};
            size_t total = 0;
            if (capex_cuda_select_target(archs, n_archs, target_cc ? target_cc : 90, &t) != CAPEX_OK) return 0;
            if (n_opts > 31) n_opts = 31;
            for (k = 0; k < n_opts; k++) opts[k] = builtin_opts[k];
            if (phases && mkdtemp(time_dir)) {
                snprintf(time_path, sizeof time_path, "%s/t.csv", time_dir);
                snprintf(time_opt, sizeof time_opt, "--time=%s", time_path);
                opts[n_opts++] = time_opt;
            } else if (phases) {
                printf("  --phases: no temporary directory\n");
                phases = 0;
            }
            for (p = 0; p < np; p++) {
                capex_cuda_image img;
                double t0 = now_ms(), t1, ph[3];
                r = capex_cuda_nvrtc_compile(capex_cuda_builtin_part_source(p), capex_cuda_builtin_part_name(p), opts, n_opts, t, &img);
                t1 = now_ms();
                if (r != CAPEX_OK) {
                    printf("part %s: %s\n", capex_cuda_builtin_part_name(p), capex_last_error());
                    continue;
                }
                printf("  part %-13s %6zu chars  cold %7.1f ms  %7zu bytes", capex_cuda_builtin_part_name(p),
                       strlen(capex_cuda_builtin_part_source(p)), t1 - t0, img.size);
                if (phases && read_phases(time_path, ph)) {
                    printf("  front end %5.0f  NVVM %5.0f  ptxas %5.0f ms", ph[0], ph[1], ph[2]);
                    for (k = 0; k < 3; k++) phase_sum[k] += ph[k];
                }
                printf("\n");
                sum += t1 - t0;
                total += img.size;
                capex_cuda_image_free(&img);
            }
            printf("  parts one after another: %.1f ms, %zu bytes\n", sum, total);
            if (phases) {
                printf("  NVRTC phases summed: front end %.0f ms, NVVM optimizer %.0f ms, PTX to SASS %.0f ms\n",
                       phase_sum[0], phase_sum[1], phase_sum[2]);
                unlink(time_path);
                rmdir(time_dir);
            }
        }
    }
    return 0;
}
