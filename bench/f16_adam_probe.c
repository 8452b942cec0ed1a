/* f16_adam_probe: three ways to run AdamW on fp16 gradients with an fp32
   master and an fp16 model copy, on one thread, same bits required:
     blocked   what capex runs where the CPU has F16C (capex__optim_f16c_blocks:
               grads converted per 1024-element block, the f32 kernel, then the
               copy converted)
     portable  the fused fp16 kernel with the select-only conversions (what
               capex runs without F16C)
     fused16   a prototype: 16 grads converted by vcvtph2ps in the loop (a
               group of 8 holding a NaN by capex's portable load, which keeps
               its bits, as capex__f16_load_f16c does), the same per-element
               formula (capex__adam_w_elem), 16 copies stored by vcvtps2ph
   Issue 17 left one row open: AdamW fp16 was 1.28-1.33x bf16 on a Zen 3 VM
   (2026-11-25), where the blocked passes stalled; on Zen 4 the fused
   prototype was within 5% of blocked (bench/RESULTS.md). Run this where that
   CPU is: if fused16 or portable wins there, that is the change to make.

       cc -std=c99 -O3 -march=native -fno-math-errno bench/f16_adam_probe.c -lm
       ./a.out [elements (default 1000000)] [reps (default 15)]
   prints the best time of each (ms) and whether each equals blocked bit for bit. */
#define _POSIX_C_SOURCE 199309L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(CAPEX__F16C)
CAPEX__F16C_FN static void fused16(const capex__optim_job *j) {
    const uint16_t *g = (const uint16_t *)j->g;
    uint16_t *h = (uint16_t *)j->h;
    const capex__optim_gc c = *j->c;
    int64_t i, k;
    for (i = 0; i + 16 <= j->n; i += 16) {
        float gb[16], pb[16];
        for (k = 0; k < 16; k += 8) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(g + i + k));
            if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00))))
                capex__f16_load_port(g + i + k, gb + k, 8);
            else
                _mm256_storeu_ps(gb + k, _mm256_cvtph_ps(x));
        }
        for (k = 0; k < 16; k++) {
            pb[k] = capex__adam_w_elem(j->p[i + k], gb[k] * j->gs, &j->m[i + k], &j->v[i + k], c.beta1, c.beta2, c.bc1, c.bc2,
                                       c.eps, c.lr, c.wd);
            j->p[i + k] = pb[k];
        }
        _mm_storeu_si128((__m128i *)(void *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(pb), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(void *)(h + i + 8),
                         _mm256_cvtps_ph(_mm256_loadu_ps(pb + 8), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if (i < j->n) { /* the tail through capex's own kernel */
        capex__optim_job t = *j;
        t.g = g + i; t.p = j->p + i; t.m = j->m + i; t.v = j->v + i; t.h = h + i; t.n = j->n - i;
        capex__k_adam_w_f16_f16(&t);
    }
}
#endif

static void blocked(const capex__optim_job *j) { capex__optim_f16c_blocks(capex__k_adam_w_tab[CAPEX_F32][0], j, 2, 1, 1); }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atol(argv[1]) : 1000000;
    const int reps = argc > 2 ? atoi(argv[2]) : 15;
    static const char *const names[3] = {"blocked", "portable", "fused16"};
    capex__optim_kfn fns[3];
    capex__optim_gc c;
    uint16_t *g = (uint16_t *)malloc((size_t)n * 2), *h[3];
    float *p[3], *m[3], *v[3];
    double best[3] = {1e30, 1e30, 1e30};
    int k, r, nf = 2;
    uint64_t s = 12345;
    fns[0] = blocked;
    fns[1] = capex__k_adam_w_f16_f16;
#if defined(CAPEX__F16C)
    fns[2] = fused16;
    nf = CAPEX__F16C_ON() ? 3 : 1;
#endif
    if (!CAPEX__F16C_ON()) nf = 0;
    if (!g || nf == 0) {
        printf("f16_adam_probe: %s\n", g ? "this CPU or build has no F16C: capex runs the portable kernel only" : "out of memory");
        return 0;
    }
    memset(&c, 0, sizeof c);
    c.lr = 1e-3f; c.beta1 = 0.9f; c.beta2 = 0.999f; c.bc1 = 0.1f; c.bc2 = 0.001f; c.eps = 1e-8f; c.wd = 0.01f;
    for (k = 0; k < 3; k++) {
        p[k] = (float *)malloc((size_t)n * 4); m[k] = (float *)malloc((size_t)n * 4); v[k] = (float *)malloc((size_t)n * 4);
        h[k] = (uint16_t *)malloc((size_t)n * 2);
        if (!p[k] || !m[k] || !v[k] || !h[k]) return 1;
    }
    for (r = 0; r < n; r++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        g[r] = (uint16_t)(0x2000u + (unsigned)(s >> 40) % 0x3000u) | (uint16_t)((s >> 33) & 0x8000u);
        if (r % 9973 == 17) g[r] = r % 3 ? (uint16_t)0x7c00u : (uint16_t)(0x7d01u + r % 0x100); /* inf, signalling NaNs */
        p[0][r] = (float)((s >> 20) % 2000) / 1000.0f - 1.0f; m[0][r] = 0.01f; v[0][r] = 0.001f;
    }
    for (k = 1; k < 3; k++) { memcpy(p[k], p[0], (size_t)n * 4); memcpy(m[k], m[0], (size_t)n * 4); memcpy(v[k], v[0], (size_t)n * 4); }
    for (r = 0; r < reps; r++)
        for (k = 0; k < nf; k++) { /* every rep steps each copy once: the states stay equal */
            capex__optim_job j;
            double t0, t1;
            memset(&j, 0, sizeof j);
            j.g = g; j.p = p[k]; j.m = m[k]; j.v = v[k]; j.h = h[k]; j.n = n; j.gs = 0.5f; j.c = &c;
            t0 = now_ms();
            fns[k](&j);
            t1 = now_ms();
            if (t1 - t0 < best[k]) best[k] = t1 - t0;
        }
    printf("AdamW fp16 grads + fp32 master + fp16 copy, %lld elements, 1 thread, best of %d\n", (long long)n, reps);
    for (k = 0; k < nf; k++)
        printf("  %-9s %8.3f ms  %.2fx blocked  %s\n", names[k], best[k], best[k] / best[0],
               !memcmp(p[k], p[0], (size_t)n * 4) && !memcmp(m[k], m[0], (size_t)n * 4) && !memcmp(v[k], v[0], (size_t)n * 4) &&
                       !memcmp(h[k], h[0], (size_t)n * 2)
                   ? "same bits"
                   : "DIFFERENT BITS");
    return 0;
}
