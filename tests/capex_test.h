/* capex_test.h - the tiny test harness every tests/test_*.c uses.

   Each test file is its own program: list its tests with CT_TEST, run them
   from main() with ct_main(). A test fails at its first failed CT_CHECK and
   may skip itself with CT_SKIP("why"). The program prints one line per
   failure or skip and ends with "N passed, N failed, N skipped";
   tests/run.sh adds those lines up over all programs. */
#ifndef CAPEX_TEST_H
#define CAPEX_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>

/* The tests' references (Apex / torch operation order, float64 models) round
   every product and sum on its own, as the GPU (--fmad=false) and capex do:
   no FMA contraction in test code either, whatever the build's default (GCC's
   -std=gnu* on aarch64 fuses). capex.h's own section says so for itself;
   included after it, this does not cover it. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

typedef struct ct_state { int failed, skipped; char why[512]; } ct_state;
typedef void (*ct_fn)(ct_state *ct);
typedef struct ct_case { const char *name; ct_fn fn; } ct_case;

#define CT_TEST(name) static void name(ct_state *ct)
#define CT_CASE(name) { #name, name }

/* A comm or rendezvous deadline that only guards against a hang (the test
   expects success or a non-timeout error): far above what a loaded CI
   machine (sanitizers, parallel jobs, 2 cores) needs, so only a real hang
   reaches it. Deadlines a test expects to fire stay short, with the peer
   held so that slowness cannot end the wait some other way. */
#define CT_HANG_GUARD_S 120.0

/* Records a failure message (truncated to fit; vsnprintf keeps the compiler's
   format-truncation analysis out of every call site). */
static void ct_fail(ct_state *ct, const char *file, int line, const char *cond, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static void ct_fail(ct_state *ct, const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    int n = snprintf(ct->why, sizeof ct->why, "%s:%d: %s: ", file, line, cond);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof ct->why) vsnprintf(ct->why + n, sizeof ct->why - (size_t)n, fmt, ap);
    va_end(ap);
    ct->failed = 1;
}

/* Fails the current test and returns from it. */
#define CT_CHECK(cond, ...)                                            \
    do {                                                               \
        if (!(cond)) {                                                 \
            ct_fail(ct, __FILE__, __LINE__, #cond, __VA_ARGS__);       \
            return;                                                    \
        }                                                              \
    } while (0)

static void ct_skip(ct_state *ct, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void ct_skip(ct_state *ct, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ct->why, sizeof ct->why, fmt, ap);
    va_end(ap);
    ct->skipped = 1;
}
#define CT_SKIP(...)               \
    do {                           \
        ct_skip(ct, __VA_ARGS__);  \
        return;                    \
    } while (0)

/* 1 in the sanitized passes (`make sanitize` and `make tsan` set
   CAPEX_TEST_SANITIZED=1): a sweep whose further rounds only run the same host
   code on other data (another NVRTC arch or kernel variant) may run a subset
   there, one that still reaches every branch; `make test` runs it whole. */
static int ct_sanitized(void) {
    const char *s = getenv("CAPEX_TEST_SANITIZED");
    return s && s[0] && strcmp(s, "0") != 0;
}

static int ct_main(const char *file, const ct_case *cases, size_t n, int argc, char **argv) {
    size_t i;
    int passed = 0, failed = 0, skipped = 0;
    /* argv[1]: run the cases whose name contains it; "-text": all but those */
    const char *only = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL, *skip = argc > 1 && argv[1][0] == '-' ? argv[1] + 1 : NULL;
    (void)ct_skip; /* used only by programs that skip */
    (void)ct_sanitized; /* and by those with reduced sweeps */
    for (i = 0; i < n; i++) {
        ct_state st;
        if ((only && !strstr(cases[i].name, only)) || (skip && skip[0] && strstr(cases[i].name, skip))) continue;
        memset(&st, 0, sizeof st);
        cases[i].fn(&st);
        if (st.failed) { failed++; printf("FAIL %s/%s: %s\n", file, cases[i].name, st.why); }
        else if (st.skipped) { skipped++; printf("SKIP %s/%s: %s\n", file, cases[i].name, st.why); }
        else { passed++; if (getenv("CT_VERBOSE")) printf("ok   %s/%s\n", file, cases[i].name); }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
#define CT_MAIN(cases) \
    int main(int argc, char **argv) { return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv); }
#endif
