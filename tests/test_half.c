/* Half conversions: every one of the 65536 codes each way, every rounding
   boundary (the exact midpoint between neighbours and one f32 ulp either side),
   and random f32 inputs, all against an independent float64 reference. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float64 value of a code, from its fields alone. */
static double ref_f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}
static double ref_bf16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp((double)(128 + m), e - 134);
    return s ? -v : v;
}

/* Round-to-nearest-even by search over the sorted positive codes [0, maxcode];
   anything at or past the midpoint between maxcode and "maxcode+1" is inf. */
static uint16_t ref_round(double v, double (*value)(uint16_t), uint16_t maxcode, uint16_t infcode) {
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double a = fabs(v), top = value(maxcode), next = top + (top - value((uint16_t)(maxcode - 1)));
    unsigned lo = 0, hi = maxcode;
    if (a >= (top + next) / 2) return (uint16_t)(sign | infcode);
    while (hi - lo > 1) { unsigned mid = (lo + hi) / 2; if (value((uint16_t)mid) <= a) lo = mid; else hi = mid; }
    if (value((uint16_t)hi) <= a) lo = hi;
    if (lo == maxcode || value((uint16_t)lo) == a) return (uint16_t)(sign | lo);
    {
        double dlo = a - value((uint16_t)lo), dhi = value((uint16_t)(lo + 1)) - a;
        unsigned r = dlo < dhi ? lo : dhi < dlo ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
        return (uint16_t)(sign | r);
    }
}
static uint16_t ref_f16(float f) { return ref_round((double)f, ref_f16_value, 0x7bff, 0x7c00); }
static uint16_t ref_bf16(float f) { return ref_round((double)f, ref_bf16_value, 0x7f7f, 0x7f80); }

CT_TEST(f16_to_f32_all_codes) {
    unsigned c;
    for (c = 0; c < 65536; c++) {
        float f = capex_f16_to_f32((uint16_t)c);
        double r = ref_f16_value((uint16_t)c);
        if (isnan(r)) {
            CT_CHECK(isnan(f), "code 0x%04x must give NaN", c);
            CT_CHECK(capex_f32_to_f16(f) == (uint16_t)(c | 0x200), "NaN 0x%04x round trip gave 0x%04x", c, capex_f32_to_f16(f));
        } else {
            CT_CHECK((double)f == r && !signbit(f) == !signbit(r), "code 0x%04x: got %.9g want %.9g", c, f, r);
            CT_CHECK(capex_f32_to_f16(f) == c, "code 0x%04x does not round-trip (0x%04x)", c, capex_f32_to_f16(f));
        }
    }
}

CT_TEST(bf16_to_f32_all_codes) {
    unsigned c;
    for (c = 0; c < 65536; c++) {
        float f = capex_bf16_to_f32((uint16_t)c);
        double r = ref_bf16_value((uint16_t)c);
        if (isnan(r)) {
            CT_CHECK(isnan(f), "code 0x%04x must give NaN", c);
            CT_CHECK(capex_f32_to_bf16(f) == (uint16_t)(c | 0x40), "NaN 0x%04x round trip", c);
        } else {
            CT_CHECK((double)f == r && !signbit(f) == !signbit(r), "code 0x%04x: got %.9g want %.9g", c, f, r);
            CT_CHECK(capex_f32_to_bf16(f) == c, "code 0x%04x does not round-trip", c);
        }
    }
}

/* The midpoint between every pair of neighbouring codes is exact in f32; it
   must round to the even one, and one f32 ulp either side to the nearer. */
static int check_boundaries(ct_state *ct, double (*value)(uint16_t), uint16_t (*conv)(float), uint16_t (*ref)(float),
                            unsigned maxcode) {
    unsigned c;
    for (c = 0; c <= maxcode; c++) {
        int s;
        for (s = 0; s < 2; s++) {
            double lo = value((uint16_t)c);
            double hi = c == maxcode ? 2 * value((uint16_t)c) - value((uint16_t)(c - 1)) : value((uint16_t)(c + 1));
            float mid = (float)((lo + hi) / 2), below, above;
            if ((double)mid != (lo + hi) / 2) { snprintf(ct->why, sizeof ct->why, "midpoint not exact at 0x%x", c); ct->failed = 1; return 0; }
            if (s) mid = -mid;
            below = from_bits(bits(mid) - 1);
            above = from_bits(bits(mid) + 1);
            if (conv(mid) != ref(mid) || conv(below) != ref(below) || conv(above) != ref(above)) {
                snprintf(ct->why, sizeof ct->why, "boundary after code 0x%04x (sign %d): mid %.9g -> 0x%04x want 0x%04x; "
                         "below 0x%04x/0x%04x above 0x%04x/0x%04x", c, s, mid, conv(mid), ref(mid),
                         conv(below), ref(below), conv(above), ref(above));
                ct->failed = 1;
                return 0;
            }
        }
    }
    return 1;
}

CT_TEST(f16_rounding_boundaries) {
    if (!check_boundaries(ct, ref_f16_value, capex_f32_to_f16, ref_f16, 0x7bff)) return;
    /* hand-picked facts */
    CT_CHECK(capex_f32_to_f16(65504.0f) == 0x7bff, "max half");
    CT_CHECK(capex_f32_to_f16(65519.996f) == 0x7bff, "just below 65520 stays finite");
    CT_CHECK(capex_f32_to_f16(65520.0f) == 0x7c00, "65520 ties to even = inf");
    CT_CHECK(capex_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000, "2^-25 ties to zero");
    CT_CHECK(capex_f32_to_f16(from_bits(bits(ldexpf(1.0f, -25)) + 1)) == 0x0001, "just above 2^-25 rounds up");
    CT_CHECK(capex_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002, "1.5 * 2^-24 ties to even (2)");
    CT_CHECK(capex_f32_to_f16(-0.0f) == 0x8000, "negative zero");
    CT_CHECK(capex_f32_to_f16(INFINITY) == 0x7c00 && capex_f32_to_f16(-INFINITY) == 0xfc00, "infinities");
    CT_CHECK(capex_f32_to_f16(from_bits(0x7f800001u)) == 0x7e00, "signalling NaN with low payload stays NaN");
    CT_CHECK(capex_f32_to_f16(from_bits(0x00000001u)) == 0x0000, "f32 subnormal flushes by rounding");
    CT_CHECK(capex_f32_to_f16(ldexpf(1.0f, -14)) == 0x0400, "smallest normal");
    CT_CHECK(capex_f32_to_f16(from_bits(bits(ldexpf(1.0f, -14)) - 1)) == 0x0400, "rounds up into the normal range");
}

CT_TEST(bf16_rounding_boundaries) {
    if (!check_boundaries(ct, ref_bf16_value, capex_f32_to_bf16, ref_bf16, 0x7f7f)) return;
    CT_CHECK(capex_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CT_CHECK(capex_f32_to_bf16(from_bits(0x7fc00001u)) == 0x7fc0, "NaN");
    CT_CHECK(capex_f32_to_bf16(from_bits(0xff800001u)) == 0xffc0, "negative signalling NaN with low payload");
    CT_CHECK(capex_f32_to_bf16(from_bits(0x00008000u)) == 0x0000, "subnormal tie to even 0");
    CT_CHECK(capex_f32_to_bf16(from_bits(0x00018000u)) == 0x0002, "subnormal tie to even 2");
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* The bulk fp16 paths: the public (dispatching) functions, the portable loops,
   and the F16C ones where this build and CPU have them. Every bulk check
   below runs on each, against the scalar integer conversions. */
typedef struct half_path {
    const char *name;
    void (*store)(const float *, uint16_t *, size_t);
    void (*load)(const uint16_t *, float *, size_t);
} half_path;
static half_path paths[3];
static int npaths(void) {
    int k = 0;
    paths[k].name = "public"; paths[k].store = capex_f32_to_f16_array; paths[k++].load = capex_f16_to_f32_array;
    paths[k].name = "portable"; paths[k].store = capex__f16_store_port; paths[k++].load = capex__f16_load_port;
#ifdef CAPEX__F16C
    if (capex__f16c_ok()) { paths[k].name = "f16c"; paths[k].store = capex__f16_store_f16c; paths[k++].load = capex__f16_load_f16c; }
#endif
    return k;
}

static void random_bulk(ct_state *ct, const half_path *P) {
    enum { N = 200000 };
    static float src[N];
    static uint16_t h[N], b[N];
    static float back[N];
    int i;
    for (i = 0; i < N; i++) {
        uint32_t u = rnd32();
        /* half the inputs near the f16 range so both paths see dense coverage */
        if (i & 1) u = (u & 0x80ffffffu) | ((uint32_t)(96 + (rnd32() % 48)) << 23);
        src[i] = from_bits(u);
    }
    P->store(src, h, N);
    capex_f32_to_bf16_array(src, b, N);
    for (i = 0; i < N; i++) {
        if (isnan(src[i])) {
            CT_CHECK(isnan(capex_f16_to_f32(h[i])) && isnan(capex_bf16_to_f32(b[i])), "NaN input %d", i);
            continue;
        }
        CT_CHECK(h[i] == ref_f16(src[i]), "%s: f16 of %.9g (0x%08x): 0x%04x want 0x%04x", P->name, src[i], bits(src[i]), h[i], ref_f16(src[i]));
        CT_CHECK(b[i] == ref_bf16(src[i]), "bf16 of %.9g: 0x%04x want 0x%04x", src[i], b[i], ref_bf16(src[i]));
    }
    P->load(h, back, N);
    for (i = 0; i < N; i++) CT_CHECK(bits(back[i]) == bits(capex_f16_to_f32(h[i])), "%s: bulk f16->f32 differs at %d", P->name, i);
    capex_bf16_to_f32_array(b, back, N);
    for (i = 0; i < N; i++) CT_CHECK(bits(back[i]) == bits(capex_bf16_to_f32(b[i])), "bulk bf16->f32 differs at %d", i);
}

/* The bulk functions are separate, vectorised code: they must equal the
   scalar ones everywhere. Every 61st f32 bit pattern (70M inputs, all
   exponents, both signs, NaN payloads) plus every f16 code and its
   neighbourhood midpoints (exact ties, one ulp either side). */
static void bulk_everywhere(ct_state *ct, const half_path *P) {
    enum { B = 65536 };
    static float src[B], back[B];
    static uint16_t h[B];
    uint64_t u = 0;
    int i, n;
    while (u <= 0xffffffffull) {
        for (n = 0; n < B && u <= 0xffffffffull; n++, u += 61) src[n] = from_bits((uint32_t)u);
        P->store(src, h, (size_t)n);
        for (i = 0; i < n; i++)
            CT_CHECK(h[i] == capex_f32_to_f16(src[i]), "%s: bulk f16 of 0x%08x: 0x%04x, scalar 0x%04x", P->name, bits(src[i]), h[i], capex_f32_to_f16(src[i]));
    }
    for (i = 0; i < B; i++) h[i] = (uint16_t)i;
    P->load(h, back, B);
    for (i = 0; i < B; i++) CT_CHECK(bits(back[i]) == bits(capex_f16_to_f32((uint16_t)i)), "%s: bulk f16->f32 of 0x%04x", P->name, i);
    for (i = 0; i < B; i++) { /* every code at every position of a group of 8, and in the tail */
        int k;
        uint16_t g[11];
        float o[11];
        for (k = 0; k < 11; k++) g[k] = (uint16_t)(i + 7919 * k);
        P->load(g, o, 11);
        for (k = 0; k < 11; k++) CT_CHECK(bits(o[k]) == bits(capex_f16_to_f32(g[k])), "%s: f16->f32 of 0x%04x at %d", P->name, g[k], k);
    }
    for (i = 0; i < B - 1; i++) { /* midpoint of codes i and i+1 (same sign, finite) */
        float a = capex_f16_to_f32((uint16_t)i), b = capex_f16_to_f32((uint16_t)(i + 1));
        src[i] = (i & 0x7fff) >= 0x7bff ? a : (float)(((double)a + (double)b) / 2);
    }
    src[B - 1] = 0;
    for (n = -1; n <= 1; n++) {
        static float tmp[B];
        for (i = 0; i < B; i++) tmp[i] = from_bits(bits(src[i]) + (uint32_t)n);
        P->store(tmp, h, B);
        for (i = 0; i < B; i++) CT_CHECK(h[i] == capex_f32_to_f16(tmp[i]), "%s: bulk f16 near midpoint 0x%08x", P->name, bits(tmp[i]));
    }
}

CT_TEST(random_f32_inputs_and_bulk) {
    int k, n = npaths();
    for (k = 0; k < n && !ct->failed; k++) random_bulk(ct, &paths[k]);
}
CT_TEST(bulk_equals_scalar_everywhere) {
    int k, n = npaths();
    for (k = 0; k < n && !ct->failed; k++) bulk_everywhere(ct, &paths[k]);
}
/* Says which paths ran: skipped where the build or CPU has no F16C. */
CT_TEST(f16c_path_tested) {
#ifdef CAPEX__F16C
    if (!capex__f16c_ok()) CT_SKIP("this CPU has no F16C: only the portable path was tested");
    CT_CHECK(npaths() == 3, "f16c path not in the list");
#else
    CT_SKIP("built without F16C (CAPEX_NO_SIMD or not x86-64 gcc/clang): only the portable path was tested");
#endif
}

CT_TEST(dtype_names_and_sizes) {
    CT_CHECK(strcmp(capex_dtype_name(CAPEX_BF16), "bfloat16") == 0, "name");
    CT_CHECK(capex_dtype_size(CAPEX_F32) == 4 && capex_dtype_size(CAPEX_F16) == 2 && capex_dtype_size(CAPEX_BF16) == 2, "sizes");
    CT_CHECK(capex_dtype_size((capex_dtype)7) == 0, "invalid dtype has size 0");
}

static const ct_case cases[] = {
    CT_CASE(f16_to_f32_all_codes), CT_CASE(bf16_to_f32_all_codes), CT_CASE(f16_rounding_boundaries),
    CT_CASE(bf16_rounding_boundaries), CT_CASE(random_f32_inputs_and_bulk), CT_CASE(bulk_equals_scalar_everywhere), CT_CASE(f16c_path_tested),
    CT_CASE(dtype_names_and_sizes),
};
CT_MAIN(cases)
