/* Helpers shared by the CPU optimizer tests (test_optim.c, test_optim_adagrad.c,
   test_novograd.c). Define OPTIM_TEST_SEED (the file's random stream) before
   including; include after capex.h and capex_test.h. */
#ifndef CAPEX_OPTIM_TEST_UTIL_H
#define CAPEX_OPTIM_TEST_UTIL_H
#include <math.h>
#include <string.h>

/* failure messages are cut to the harness buffer on purpose */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* CT_CHECK for helpers that return int: 0 ok, 1 failed (message in ct). */
#define REQ(cond, ...)                                                                         \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            int n_ = snprintf(ct->why, sizeof ct->why, "%s:%d: ", __FILE__, __LINE__);        \
            if (n_ > 0 && (size_t)n_ < sizeof ct->why)                                         \
                snprintf(ct->why + n_, sizeof ct->why - (size_t)n_, __VA_ARGS__);              \
            ct->failed = 1;                                                                    \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

static uint64_t rng_state = OPTIM_TEST_SEED;
static double urand(void) { /* xorshift64*, [0,1) */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void) { /* Box-Muller */
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Stores x as dtype t into buf[i] and returns the stored value as a float. */
static float put(void *buf, capex_dtype t, size_t i, float x) {
    if (t == CAPEX_F32) { ((float *)buf)[i] = x; return x; }
    if (t == CAPEX_F16) { uint16_t h = capex_f32_to_f16(x); ((uint16_t *)buf)[i] = h; return capex_f16_to_f32(h); }
    { uint16_t h = capex_f32_to_bf16(x); ((uint16_t *)buf)[i] = h; return capex_bf16_to_f32(h); }
}
#endif
