/* CPU of N processes (the ranks of a node) that start together on one cold
   kernel cache and compile the same built-in parts through it, as a first
   step does: the sum over the processes (getrusage RUSAGE_CHILDREN), per
   round with a fresh cache directory, and how many of the N x parts compiles
   ran NVRTC (the rest read the cache). Built against two headers, it shows
   what the per-entry compile lock saves.
     cache_lock_cpu [--procs 4] [--rounds 3] [--cc 90] [--pool T] [--all | part ...]  (default: amp adam_bf16)
   --pool T: each process compiles its parts as capex_cuda_precompile does (its
   job pool, on T threads) instead of one by one in order.
   Build it with -I pointing at either header pair (a baseline's from git show). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#define CAPEX_STATIC
#include "capex_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>

static double children_cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_CHILDREN, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
           (double)u.ru_stime.tv_usec / 1e6;
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1200];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(int argc, char **argv) {
    int procs = 4, rounds = 3, cc = 90, pool = 0, units[64], n_units = 0, i, r;
    double best = -1.0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cc") && i + 1 < argc) cc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pool") && i + 1 < argc) pool = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--all"))
            for (n_units = 0; n_units < capex_cuda_builtin_part_count() && n_units < 64; n_units++) units[n_units] = n_units;
        else if (n_units < 64) {
            int p;
            for (p = 0; p < capex_cuda_builtin_part_count(); p++)
                if (!strcmp(capex_cuda_builtin_part_name(p), argv[i])) break;
            if (p == capex_cuda_builtin_part_count()) {
                fprintf(stderr, "no part '%s'\n", argv[i]);
                return 2;
            }
            units[n_units++] = p;
        }
    }
    if (!n_units) {
        const char *def[2] = {"amp", "adam_bf16"};
        int k, p;
        for (k = 0; k < 2; k++)
            for (p = 0; p < capex_cuda_builtin_part_count(); p++)
                if (!strcmp(capex_cuda_builtin_part_name(p), def[k])) units[n_units++] = p;
    }
    if (procs < 1 || procs > 64 || rounds < 1) return 2;
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    for (r = 0; r < rounds; r++) {
        char dir[64];
        int go[2], done[2], compiled = 0, failed = 0;
        double t0 = children_cpu_s(), w0 = capex_dist_now(), t;
        snprintf(dir, sizeof dir, "/tmp/capex_lock_bench_XXXXXX");
        if (!mkdtemp(dir) || pipe(go) != 0 || pipe(done) != 0) return 1;
        for (i = 0; i < procs; i++) {
            if (fork() == 0) { /* a rank: waits for the start, compiles the units in order */
                char c;
                int k, n = 0;
                capex_cuda_cache cache;
                close(go[1]);
                close(done[0]);
                if (read(go[0], &c, 1) < 0) _exit(1);
                capex_cuda_cache_init(&cache, dir);
                if (pool > 0) { /* the precompile pool: capex_cuda_precompile's order and threads */
                    static capex__cuda_pjob jobs[CAPEX__CUDA_N_PARTS];
                    int want[CAPEX__CUDA_N_PARTS] = {0}, nj;
                    for (k = 0; k < n_units; k++) want[units[k]] = 1;
                    nj = capex__cuda_pool_jobs(jobs, want, &cache);
                    capex__cuda_pool_run(jobs, nj, cc, CAPEX__GO_META_SMALL, pool);
                    for (k = 0; k < nj; k++) {
                        if (jobs[k].r != CAPEX_OK) {
                            fprintf(stderr, "%s\n", jobs[k].err);
                            _exit(1);
                        }
                        n += !jobs[k].img.from_cache;
                        capex_cuda_image_free(&jobs[k].img);
                    }
                }
                for (k = 0; k < n_units && pool <= 0; k++) {
                    capex_cuda_compile_desc d;
                    capex__cuda_unit_opts o;
                    capex_cuda_image img;
                    capex__cuda_unit_desc(units[k], cc, CAPEX__GO_META_SMALL, &cache, &o, &d);
                    if (capex__cuda_compile_ex(&d, 0, 1, &img) != CAPEX_OK) {
                        fprintf(stderr, "%s\n", capex_last_error());
                        _exit(1);
                    }
                    n += !img.from_cache;
                    capex_cuda_image_free(&img);
                }
                c = (char)n;
                if (write(done[1], &c, 1) != 1) _exit(1);
                _exit(0);
            }
        }
        close(go[0]);
        close(done[1]);
        close(go[1]); /* all start */
        for (i = 0; i < procs; i++) {
            char c;
            if (read(done[0], &c, 1) == 1) compiled += c;
            else failed++;
        }
        close(done[0]);
        while (wait(NULL) > 0) {}
        t = children_cpu_s() - t0;
        rm_dir(dir);
        if (failed) {
            printf("round %d: %d processes failed\n", r + 1, failed);
            return 1;
        }
        printf("round %d: %d processes x %d parts: CPU %.2f s summed, wall %.2f s, NVRTC ran %d of %d compiles\n", r + 1, procs,
               n_units, t, capex_dist_now() - w0, compiled, procs * n_units);
        if (best < 0.0 || t < best) best = t;
    }
    printf("best %.2f\n", best);
    return 0;
}
