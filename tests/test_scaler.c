/* Loss scaler: the dynamic rule against an independent transcription of
   PyTorch's _amp_update_scale_ on thousands of scripted steps, against values
   PyTorch itself produced (tests/data/scaler_ref.txt, from
   tests/gen_scaler_ref.py) and against hand-checked tables; hysteresis, min/max
   clamps, static mode, several scalers and optimizers, every out-of-order call
   (error, scaler unchanged), rate-limited overflow logging, state export and
   import with rejection of bad states. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <float.h>
#include <math.h>
#include <stdint.h>

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Log sink for the tests: counts messages, keeps the last one. */
typedef struct log_rec { int n; char last[1024]; } log_rec;
static void log_cb(capex_log_level level, const char *msg, void *user) {
    log_rec *r = (log_rec *)user;
    (void)level;
    r->n++;
    snprintf(r->last, sizeof r->last, "%s", msg);
}
static log_rec g_quiet;
static void quiet(void) { capex_set_log_callback(log_cb, &g_quiet); }

/* PyTorch's rule, transcribed from aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp
   (_amp_update_scale_cpu_kernel; the CUDA kernel in AmpKernels.cu is the same):
     if (found_inf) { scale = scale * backoff_factor; growth_tracker = 0; }
     else { successful = growth_tracker + 1;
            if (successful == growth_interval) {
              new_scale = static_cast<float>(scale * growth_factor);
              if (isfinite(new_scale)) scale = new_scale;
              growth_tracker = 0;
            } else growth_tracker = successful; }
   scale is float32, the factors are double, the tracker is int32. */
static void ref_pytorch(float *scale, int32_t *tracker, float found_inf, double growth, double backoff,
                        int64_t interval) {
    if (found_inf != 0.0f) {
        *scale = (float)((double)*scale * backoff);
        *tracker = 0;
    } else {
        int32_t successful = *tracker + 1;
        if (successful == interval) {
            float ns = (float)((double)*scale * growth);
            if (isfinite(ns)) *scale = ns;
            *tracker = 0;
        } else {
            *tracker = successful;
        }
    }
}

/* Desc that must behave as PyTorch's GradScaler: no cap, no floor, hysteresis 1. */
static capex_scaler_desc torch_desc(float init, double growth, double backoff, int64_t interval) {
    capex_scaler_desc d;
    capex_scaler_desc_init(&d);
    d.init_scale = init;
    d.growth_factor = growth;
    d.backoff_factor = backoff;
    d.growth_interval = interval;
    d.min_scale = 0.0f;
    d.max_scale = INFINITY;
    d.hysteresis = 1;
    return d;
}

/* One full iteration on optimizer 0; returns the capex_result of the first failing call. */
static capex_result iter1(capex_scaler *sc, int found_inf, int *do_step) {
    float s = 0.0f, inv = 0.0f;
    int go = -1;
    capex_result r;
    if ((r = capex_scaler_scale(sc, &s)) != CAPEX_OK) return r;
    if ((r = capex_scaler_unscale(sc, 0, found_inf, &inv)) != CAPEX_OK) return r;
    if ((r = capex_scaler_step(sc, 0, &go)) != CAPEX_OK) return r;
    if (do_step) *do_step = go;
    return capex_scaler_update(sc);
}

static uint64_t lcg_state;
static double lcg_uniform(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) / 9007199254740992.0;
}

CT_TEST(defaults_are_apex_and_pytorch) {
    capex_scaler_desc d;
    capex_scaler sc;
    float s = 0.0f, inv = 0.0f;
    memset(&d, 0x5a, sizeof d);
    capex_scaler_desc_init(&d);
    capex_scaler_desc_init(NULL);
    CT_CHECK(d.dynamic == 1 && d.init_scale == 65536.0f && d.growth_factor == 2.0 && d.backoff_factor == 0.5,
             "dynamic %d init %g", d.dynamic, (double)d.init_scale);
    CT_CHECK(d.growth_interval == 2000 && d.min_scale == 0.0f && d.max_scale == 16777216.0f && d.hysteresis == 1,
             "interval %lld max %g", (long long)d.growth_interval, (double)d.max_scale);
    CT_CHECK(d.log_interval == 100 && d.id == 0, "log_interval %lld", (long long)d.log_interval);
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK && s == 65536.0f, "scale %g", (double)s);
    CT_CHECK((inv = capex_scaler_get_inv_scale(&sc)) == 1.0f / 65536.0f, "inv %g", (double)inv);
}

/* Short table checked by hand: init 2^16, growth 2, backoff 0.5, interval 3. */
CT_TEST(hand_checked_table) {
    static const int flags[] = {0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0};
    static const float scale[] = {65536, 65536, 131072, 65536, 65536, 32768, 16384, 16384, 16384, 32768, 32768};
    static const int tracker[] = {1, 2, 0, 0, 1, 0, 0, 1, 2, 0, 1};
    static const int go[] = {1, 1, 1, 0, 1, 0, 0, 1, 1, 1, 1};
    capex_scaler_desc d = torch_desc(65536.0f, 2.0, 0.5, 3);
    capex_scaler sc;
    capex_scaler_state st;
    size_t i;
    quiet();
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        int do_step = -1;
        CT_CHECK(iter1(&sc, flags[i], &do_step) == CAPEX_OK, "step %zu: %.300s", i, capex_last_error());
        CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(st.scale == scale[i] && st.growth_tracker == tracker[i] && do_step == go[i],
                 "step %zu: scale %g tracker %lld go %d, want %g %d %d", i, (double)st.scale,
                 (long long)st.growth_tracker, do_step, (double)scale[i], tracker[i], go[i]);
    }
    CT_CHECK(st.steps == 11 && st.skipped_steps == 3, "steps %lld skipped %lld", (long long)st.steps,
             (long long)st.skipped_steps);
}

/* Replays flags through capex and the transcribed PyTorch rule side by side. */
static void run_vs_ref(ct_state *ct, const char *name, float init, double growth, double backoff, int64_t interval,
                      const unsigned char *flags, size_t n) {
    capex_scaler_desc d = torch_desc(init, growth, backoff, interval);
    capex_scaler sc;
    float rs = init;
    int32_t rt = 0;
    size_t i;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%s: %.300s", name, capex_last_error());
    for (i = 0; i < n; i++) {
        int go = -1;
        capex_scaler_state st;
        CT_CHECK(iter1(&sc, flags[i], &go) == CAPEX_OK, "%s step %zu: %.300s", name, i, capex_last_error());
        ref_pytorch(&rs, &rt, flags[i] ? 1.0f : 0.0f, growth, backoff, interval);
        CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(fbits(st.scale) == fbits(rs) && st.growth_tracker == rt && go == !flags[i],
                 "%s step %zu: capex %a/%lld, PyTorch rule %a/%d", name, i, (double)st.scale,
                 (long long)st.growth_tracker, (double)rs, rt);
    }
}

CT_TEST(matches_pytorch_rule_on_scripted_sequences) {
    static unsigned char f[6000];
    size_t n, i;
    quiet();
    /* 1: interval 3, 30% overflows plus bursts of overflows and long clean runs. */
    lcg_state = 11;
    for (i = 0; i < 3000; i++) f[i] = lcg_uniform() < 0.3;
    for (i = 400; i < 460; i++) f[i] = 0;
    for (i = 700; i < 712; i++) f[i] = 1;
    for (i = 1000; i < 1300; i++) f[i] = 0;
    run_vs_ref(ct, "interval3", 65536.0f, 2.0, 0.5, 3, f, 3000); if (ct->failed) return;
    /* 2: interval 2000: grow at 2000, overflow at 1999 clean steps, grow again. */
    n = 0;
    for (i = 0; i < 2001; i++) f[n++] = 0;
    f[n++] = 1; f[n++] = 1; f[n++] = 0; f[n++] = 1;
    for (i = 0; i < 1999; i++) f[n++] = 0;
    f[n++] = 1;
    for (i = 0; i < 1990; i++) f[n++] = lcg_uniform() < 0.0004;
    run_vs_ref(ct, "interval2000", 65536.0f, 2.0, 0.5, 2000, f, n); if (ct->failed) return;
    /* 3: growth up to the largest power of two below FLT_MAX, then it stays finite. */
    memset(f, 0, 40);
    f[25] = 1;
    run_vs_ref(ct, "float_max", 1.0f, 1024.0, 0.5, 1, f, 40); if (ct->failed) return;
    /* 4: inexact factors: f64 products rounded to f32 each step. */
    for (i = 0; i < 2000; i++) f[i] = lcg_uniform() < 0.35;
    run_vs_ref(ct, "odd", 1000.1f, 1.7, 0.3, 2, f, 2000); if (ct->failed) return;
    run_vs_ref(ct, "odd2", 3.3f, 3.0000001, 0.9, 1, f, 2000); if (ct->failed) return;
    /* 5: consecutive overflows into subnormals and 0 (PyTorch has no floor). */
    memset(f, 1, 200);
    run_vs_ref(ct, "underflow", 65536.0f, 2.0, 0.5, 4, f, 200); if (ct->failed) return;
}

/* The golden file PyTorch wrote; found next to this source file or from the repo root. */
static FILE *open_ref(void) {
    char path[1024];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    FILE *fp = NULL;
    if (slash) {
        snprintf(path, sizeof path, "%.*s/data/scaler_ref.txt", (int)(slash - file), file);
        fp = fopen(path, "r");
    }
    if (!fp) fp = fopen("tests/data/scaler_ref.txt", "r");
    return fp;
}

CT_TEST(matches_torch_golden_file) {
    FILE *fp = open_ref();
    char line[256];
    int seqs = 0;
    long total = 0;
    quiet();
    CT_CHECK(fp != NULL, "tests/data/scaler_ref.txt not found (run from the repo root; regenerate with "
                         "python3 tests/gen_scaler_ref.py > tests/data/scaler_ref.txt)");
    while (fgets(line, sizeof line, fp)) {
        char name[128];
        unsigned init_bits;
        double growth, backoff;
        long long interval, steps, i;
        capex_scaler_desc d;
        capex_scaler sc;
        if (line[0] == '#') continue;
        if (!strncmp(line, "end", 3)) break;
        if (sscanf(line, "seq %127s %x %lf %lf %lld %lld", name, &init_bits, &growth, &backoff, &interval, &steps) != 6) {
            fclose(fp);
            CT_CHECK(0, "bad line in scaler_ref.txt: %s", line);
        }
        d = torch_desc(from_bits(init_bits), growth, backoff, interval);
        if (capex_scaler_init(&sc, &d) != CAPEX_OK) { fclose(fp); CT_CHECK(0, "%s: %.300s", name, capex_last_error()); }
        for (i = 0; i < steps; i++) {
            int found, go = -1;
            unsigned want_bits;
            long long want_tracker;
            capex_scaler_state st;
            if (!fgets(line, sizeof line, fp) || sscanf(line, "%d %x %lld", &found, &want_bits, &want_tracker) != 3) {
                fclose(fp);
                CT_CHECK(0, "%s: truncated at step %lld", name, i);
            }
            if (iter1(&sc, found, &go) != CAPEX_OK || capex_scaler_get_state(&sc, &st) != CAPEX_OK) {
                fclose(fp);
                CT_CHECK(0, "%s step %lld: %.300s", name, i, capex_last_error());
            }
            if (fbits(st.scale) != want_bits || st.growth_tracker != want_tracker || go != !found) {
                fclose(fp);
                CT_CHECK(0, "%s step %lld: capex %08x/%lld, torch %08x/%lld", name, i, fbits(st.scale),
                         (long long)st.growth_tracker, want_bits, want_tracker);
            }
            total++;
        }
        seqs++;
    }
    fclose(fp);
    CT_CHECK(seqs == 6 && total > 6000, "read %d sequences, %ld steps", seqs, total);
}

typedef struct hstep { int found; float scale; int tracker; int hyst; } hstep;
static void run_table(ct_state *ct, const capex_scaler_desc *d, const hstep *t, size_t n) {
    capex_scaler sc;
    size_t i;
    CT_CHECK(capex_scaler_init(&sc, d) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < n; i++) {
        capex_scaler_state st;
        int go = -1;
        CT_CHECK(iter1(&sc, t[i].found, &go) == CAPEX_OK, "step %zu: %.300s", i, capex_last_error());
        CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(st.scale == t[i].scale && st.growth_tracker == t[i].tracker && st.hysteresis_tracker == t[i].hyst &&
                     go == !t[i].found,
                 "step %zu: scale %g growth %lld hyst %d, want %g %d %d", i, (double)st.scale,
                 (long long)st.growth_tracker, st.hysteresis_tracker, (double)t[i].scale, t[i].tracker, t[i].hyst);
    }
}

/* Apex update_scale_hysteresis, worked by hand. */
CT_TEST(hysteresis_2_and_3) {
    static const hstep h2[] = {
        {1, 1024, 0, 1}, {1, 512, 0, 0}, {1, 256, 0, 0}, {0, 256, 1, 2}, {1, 256, 0, 1},
        {0, 256, 1, 2},  {0, 256, 2, 2}, {0, 512, 0, 2}, {1, 512, 0, 1}, {1, 256, 0, 0},
    };
    static const hstep h3[] = {
        {1, 1024, 0, 2}, {1, 1024, 0, 1}, {1, 512, 0, 0}, {0, 512, 1, 3}, {1, 512, 0, 2},
        {0, 512, 1, 3},  {0, 1024, 0, 3}, {1, 1024, 0, 2}, {1, 1024, 0, 1}, {0, 1024, 1, 3},
        {1, 1024, 0, 2}, {1, 1024, 0, 1}, {1, 512, 0, 0},  {1, 256, 0, 0},
    };
    capex_scaler_desc d = torch_desc(1024.0f, 2.0, 0.5, 3);
    quiet();
    d.hysteresis = 2;
    run_table(ct, &d, h2, sizeof h2 / sizeof h2[0]); if (ct->failed) return;
    d.hysteresis = 3;
    d.growth_interval = 2;
    run_table(ct, &d, h3, sizeof h3 / sizeof h3[0]); if (ct->failed) return;
}

CT_TEST(min_and_max_clamps) {
    static const hstep a[] = {
        {1, 2, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}, {0, 2, 0, 1}, {0, 4, 0, 1},
        {0, 8, 0, 1}, {0, 16, 0, 1}, {0, 16, 0, 1}, {1, 8, 0, 0}, {0, 16, 0, 1},
    };
    static const hstep b[] = {{0, 8, 0, 1}, {0, 10, 0, 1}, {0, 10, 0, 1}, {1, 1, 0, 0}, {1, 1, 0, 0}};
    capex_scaler_desc d = torch_desc(4.0f, 2.0, 0.5, 1);
    capex_scaler sc;
    float s = 0.0f;
    quiet();
    d.min_scale = 1.0f;
    d.max_scale = 16.0f;
    run_table(ct, &d, a, sizeof a / sizeof a[0]); if (ct->failed) return;
    /* non-power-of-two cap and floor; backoff 0.3 from 10 would give 3 then 0.9 -> floor 1 */
    d.max_scale = 10.0f;
    d.backoff_factor = 0.1;
    run_table(ct, &d, b, sizeof b / sizeof b[0]); if (ct->failed) return;
    /* growth past FLT_MAX under the finite cap FLT_MAX lands on the cap (Apex min(max, 2s)) */
    d = torch_desc(from_bits(0x7f000000u), 2.0, 0.5, 1);
    d.max_scale = FLT_MAX;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(iter1(&sc, 0, NULL) == CAPEX_OK && (s = capex_scaler_get_scale(&sc)) == FLT_MAX,
             "scale %a", (double)s);
    /* the default cap 2^24 */
    capex_scaler_desc_init(&d);
    d.growth_interval = 1;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    {
        int i;
        for (i = 0; i < 20; i++) CT_CHECK(iter1(&sc, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    }
    CT_CHECK((s = capex_scaler_get_scale(&sc)) == 16777216.0f, "scale %g", (double)s);
}

CT_TEST(static_scaler) {
    capex_scaler_desc d;
    capex_scaler sc;
    capex_scaler_state st;
    int i, go;
    quiet();
    capex_scaler_desc_init(&d);
    d.dynamic = 0;
    d.init_scale = 128.0f;
    d.growth_interval = 1;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 50; i++) {
        int found = i % 3 == 0;
        CT_CHECK(iter1(&sc, found, &go) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(go == !found, "step %d: do_step %d (an overflow must still skip)", i, go);
        CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.scale == 128.0f && st.growth_tracker == 0,
                 "step %d: scale %g", i, (double)st.scale);
    }
    CT_CHECK(st.steps == 50 && st.skipped_steps == 17 && st.dynamic == 0, "steps %lld skipped %lld",
             (long long)st.steps, (long long)st.skipped_steps);
    /* a static scale may exceed the dynamic cap (Apex loss_scale=2**30) */
    d.init_scale = 1073741824.0f;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
}

CT_TEST(several_scalers_are_independent) {
    capex_scaler_desc d = torch_desc(65536.0f, 2.0, 0.5, 2);
    capex_scaler a, b;
    float sa = 0.0f, sb = 0.0f;
    int i;
    quiet();
    CT_CHECK(capex_scaler_init(&a, &d) == CAPEX_OK && capex_scaler_init(&b, &d) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 10; i++) {
        /* interleaved: a overflows every step, b never */
        CT_CHECK(capex_scaler_scale(&a, &sa) == CAPEX_OK && capex_scaler_scale(&b, &sb) == CAPEX_OK, "%.300s",
                 capex_last_error());
        CT_CHECK(capex_scaler_unscale(&a, 0, 1, NULL) == CAPEX_OK && capex_scaler_unscale(&b, 0, 0, NULL) == CAPEX_OK,
                 "%.300s", capex_last_error());
        CT_CHECK(capex_scaler_update(&b) == CAPEX_OK && capex_scaler_update(&a) == CAPEX_OK, "%.300s", capex_last_error());
    }
    CT_CHECK((sa = capex_scaler_get_scale(&a)) == 64.0f, "a %g", (double)sa);
    CT_CHECK((sb = capex_scaler_get_scale(&b)) == 65536.0f * 32.0f, "b %g", (double)sb);
}

CT_TEST(several_optimizers) {
    capex_scaler_desc d = torch_desc(1024.0f, 2.0, 0.5, 100);
    capex_scaler sc;
    capex_scaler_state st;
    float s, inv0, inv1;
    int go0 = -1, go1 = -1;
    quiet();
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    /* two backward passes (accumulation), then optimizer 0 overflowed, 1 did not */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK && capex_scaler_scale(&sc, &s) == CAPEX_OK, "%.300s",
             capex_last_error());
    CT_CHECK(capex_scaler_unscale(&sc, 1, 0, &inv1) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_unscale(&sc, 0, 1, &inv0) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(inv0 == 1.0f / 1024.0f && inv1 == inv0, "inv %g %g", (double)inv0, (double)inv1);
    CT_CHECK(capex_scaler_step(&sc, 0, &go0) == CAPEX_OK && capex_scaler_step(&sc, 1, &go1) == CAPEX_OK, "%.300s",
             capex_last_error());
    /* PyTorch: each optimizer steps on its own found_inf; update() ORs them */
    CT_CHECK(go0 == 0 && go1 == 1, "do_step %d %d", go0, go1);
    CT_CHECK(capex_scaler_update(&sc) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.scale == 512.0f && st.skipped_steps == 1, "scale %g",
             (double)st.scale);
    /* an unscaled but not stepped optimizer still counts in update (PyTorch) */
    CT_CHECK(capex_scaler_unscale(&sc, 7, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_unscale(&sc, 3, 0, NULL) == CAPEX_OK && capex_scaler_step(&sc, 3, &go1) == CAPEX_OK && go1,
             "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_update(&sc) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK((s = capex_scaler_get_scale(&sc)) == 256.0f, "scale %g", (double)s);
    /* all clean: growth tracker counts once per iteration, not per optimizer */
    CT_CHECK(capex_scaler_unscale(&sc, 0, 0, NULL) == CAPEX_OK && capex_scaler_unscale(&sc, 1, 0, NULL) == CAPEX_OK,
             "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_update(&sc) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.growth_tracker == 1 && st.steps == 3, "tracker %lld",
             (long long)st.growth_tracker);
}

/* The call must fail with `want`, leave the scaler byte-identical, and say why. */
#define EXPECT_FAIL(want, call, sc)                                                                        \
    do {                                                                                                   \
        capex_scaler before_;                                                                              \
        capex_result r_;                                                                                   \
        memcpy(&before_, &(sc), sizeof before_);                                                           \
        capex_clear_error();                                                                               \
        r_ = (call);                                                                                       \
        CT_CHECK(r_ == (want), "%s returned %s", #call, capex_result_string(r_));                          \
        CT_CHECK(memcmp(&before_, &(sc), sizeof before_) == 0, "%s changed the scaler", #call);            \
        CT_CHECK(capex_last_error()[0] != '\0', "%s left no message", #call);                              \
    } while (0)

CT_TEST(out_of_order_calls_fail_and_change_nothing) {
    capex_scaler_desc d;
    capex_scaler sc;
    capex_scaler_state st;
    float s = 0.0f, inv = 0.0f;
    int go = 0;
    quiet();
    capex_scaler_desc_init(&d);
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK, "%.300s", capex_last_error());
    /* fresh: nothing to update, nothing to step */
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_update(&sc), sc);
    CT_CHECK(strstr(capex_last_error(), "no inf checks were recorded") != NULL, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_step(&sc, 0, &go), sc);
    CT_CHECK(strstr(capex_last_error(), "capex_scaler_unscale") != NULL, "message should name the fix: %.300s",
             capex_last_error());
    /* after scale(): update still needs an inf check; set_scale/set_state refuse */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_update(&sc), sc);
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_set_scale(&sc, 2.0f), sc);
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_set_state(&sc, &st), sc);
    /* after unscale(0): no more scale() (even for another optimizer), no second unscale(0) */
    CT_CHECK(capex_scaler_unscale(&sc, 0, 0, &inv) == CAPEX_OK, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_scale(&sc, &s), sc);
    CT_CHECK(strstr(capex_last_error(), "mix") != NULL, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_unscale(&sc, 0, 0, &inv), sc);
    CT_CHECK(strstr(capex_last_error(), "already been called") != NULL, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_step(&sc, 1, &go), sc);
    /* after step(0): no second step, no unscale, no scale */
    CT_CHECK(capex_scaler_step(&sc, 0, &go) == CAPEX_OK && go == 1, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_step(&sc, 0, &go), sc);
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_unscale(&sc, 0, 1, &inv), sc);
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_scale(&sc, &s), sc);
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_set_scale(&sc, 2.0f), sc);
    /* bad arguments are INVALID_ARG and change nothing either */
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_unscale(&sc, -1, 0, &inv), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_unscale(&sc, CAPEX_SCALER_MAX_OPTIMIZERS, 0, &inv), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_step(&sc, CAPEX_SCALER_MAX_OPTIMIZERS, &go), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_step(&sc, 1, NULL), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_scale(&sc, NULL), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_update_to(&sc, NAN), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_update_to(&sc, 0.0f), sc);
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_update_to(&sc, 1e30f), sc); /* above max 2^24 */
    /* the iteration completes normally after all those refusals */
    CT_CHECK(capex_scaler_update(&sc) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.steps == 1 && st.growth_tracker == 1, "%.300s",
             capex_last_error());
    /* discard_iteration forgets the calls, keeps the state */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK && capex_scaler_unscale(&sc, 2, 1, NULL) == CAPEX_OK, "%.300s",
             capex_last_error());
    CT_CHECK(capex_scaler_discard_iteration(&sc) == CAPEX_OK, "%.300s", capex_last_error());
    EXPECT_FAIL(CAPEX_ERR_ORDER, capex_scaler_update(&sc), sc);
    CT_CHECK(capex_scaler_set_scale(&sc, 4096.0f) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.steps == 1 && st.skipped_steps == 0 &&
                 st.scale == 4096.0f && st.growth_tracker == 1,
             "steps %lld", (long long)st.steps);
}

CT_TEST(update_to_and_set_scale) {
    capex_scaler_desc d = torch_desc(1024.0f, 2.0, 0.5, 3);
    capex_scaler sc;
    capex_scaler_state st;
    float s = 0.0f, inv = 0.0f;
    quiet();
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(iter1(&sc, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    /* PyTorch update(new_scale): no inf check needed, growth tracker kept */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK && capex_scaler_update_to(&sc, 3.0f) == CAPEX_OK, "%.300s",
             capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.scale == 3.0f && st.growth_tracker == 1 &&
                 st.steps == 2 && st.skipped_steps == 0,
             "scale %g tracker %lld", (double)st.scale, (long long)st.growth_tracker);
    /* the scaler is idle again: a new iteration may start */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_OK && s == 3.0f, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_unscale(&sc, 0, 1, &inv) == CAPEX_OK, "%.300s", capex_last_error());
    /* inv_scale is f32(1/f64(scale)), PyTorch's float64 reciprocal */
    CT_CHECK(inv == (float)(1.0 / 3.0), "inv %a", (double)inv);
    CT_CHECK(capex_scaler_update_to(&sc, 5.0f) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.skipped_steps == 1, "%.300s", capex_last_error());
    {
        static const float probes[] = {3.3f, 1000.1f, 7.0f, 1e-30f, 0.7f, 16777215.0f};
        size_t i;
        for (i = 0; i < sizeof probes / sizeof probes[0]; i++) {
            CT_CHECK(capex_scaler_set_scale(&sc, probes[i]) == CAPEX_OK, "%.300s", capex_last_error());
            CT_CHECK((inv = capex_scaler_get_inv_scale(&sc)) == (float)(1.0 / (double)probes[i]),
                     "inv of %a: %a", (double)probes[i], (double)inv);
        }
    }
    CT_CHECK(capex_scaler_set_scale(&sc, INFINITY) == CAPEX_ERR_INVALID_ARG, "inf accepted");
    CT_CHECK(capex_scaler_set_scale(&sc, -1.0f) == CAPEX_ERR_INVALID_ARG, "negative accepted");
    /* a dynamic scaler's floor and ceiling hold for set_scale too; a static one takes any finite scale > 0 */
    d.min_scale = 4.0f; d.max_scale = 65536.0f;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_set_scale(&sc, 2.0f) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "min_scale"),
             "below min_scale: %.300s", capex_last_error());
    CT_CHECK(capex_scaler_set_scale(&sc, 131072.0f) == CAPEX_ERR_INVALID_ARG, "above max_scale");
    CT_CHECK(capex_scaler_get_state(&sc, &st) == CAPEX_OK && st.scale == 1024.0f, "a refused scale changed it: %g",
             (double)st.scale);
    d.dynamic = 0;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "static: %.300s", capex_last_error());
    CT_CHECK(capex_scaler_set_scale(&sc, 2.0f) == CAPEX_OK && capex_scaler_set_scale(&sc, 131072.0f) == CAPEX_OK &&
                 capex_scaler_get_inv_scale(&sc) == 1.0f / 131072.0f,
             "static: %.300s", capex_last_error());
}

CT_TEST(overflow_logging_is_rate_limited) {
    capex_scaler_desc d;
    capex_scaler a, b;
    log_rec rec;
    int i;
    memset(&rec, 0, sizeof rec);
    capex_set_log_callback(log_cb, &rec);
    capex_scaler_desc_init(&d);
    d.log_interval = 10;
    d.id = 3;
    CT_CHECK(capex_scaler_init(&a, &d) == CAPEX_OK, "%.300s", capex_last_error());
    /* iteration 1 overflows: logged at once, in Apex's words */
    CT_CHECK(iter1(&a, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 1 && !strcmp(rec.last, "Gradient overflow.  Skipping step, loss scaler 3 reducing loss scale to 32768"),
             "%d: %.300s", rec.n, rec.last);
    /* iterations 2-5 overflow, 6-10 clean: all quiet (fewer than 10 since the message) */
    for (i = 2; i <= 10; i++) CT_CHECK(iter1(&a, i <= 5, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 1, "%d messages: %.300s", rec.n, rec.last);
    /* iteration 11 is clean, 10 after the message: one summary of the 4 not shown */
    CT_CHECK(iter1(&a, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 2 && strstr(rec.last, "4 gradient overflows") && strstr(rec.last, "loss scale is now 2048"),
             "%d: %.300s", rec.n, rec.last);
    /* 12 overflows (quiet), 13-20 clean (quiet), 21 overflows: one message counting 12 */
    for (i = 12; i <= 20; i++) CT_CHECK(iter1(&a, i == 12, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 2, "%d: %.300s", rec.n, rec.last);
    CT_CHECK(iter1(&a, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 3 && strstr(rec.last, "reducing loss scale to 512") && strstr(rec.last, "(1 earlier overflow in"),
             "%d: %.300s", rec.n, rec.last);
    /* 1000 consecutive overflows with log_interval 10: 100 messages, not 1000 */
    capex_scaler_desc_init(&d);
    d.log_interval = 10;
    d.min_scale = 1.0f;
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK, "%.300s", capex_last_error());
    rec.n = 0;
    for (i = 0; i < 1000; i++) CT_CHECK(iter1(&b, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 100, "%d messages", rec.n);
    /* hysteresis and static wording; log_interval 0 is silent */
    d.hysteresis = 2;
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK && iter1(&b, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(strstr(rec.last, "keeping loss scale 65536 (hysteresis: 1 more overflow before backing off)") != NULL, "%.300s",
             rec.last);
    d.dynamic = 0;
    d.init_scale = 8.0f;
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK && iter1(&b, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(strstr(rec.last, "keeping static loss scale 8") != NULL, "%.300s", rec.last);
    d.log_interval = 0;
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK, "%.300s", capex_last_error());
    rec.n = 0;
    for (i = 0; i < 50; i++) CT_CHECK(iter1(&b, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(rec.n == 0, "%d messages with log_interval 0", rec.n);
    capex_set_log_callback(NULL, NULL);
}

CT_TEST(state_round_trip) {
    capex_scaler_desc d;
    capex_scaler a, b;
    capex_scaler_state st, st2;
    int i;
    quiet();
    capex_scaler_desc_init(&d);
    d.growth_interval = 5;
    d.hysteresis = 3;
    d.min_scale = 2.0f;
    d.backoff_factor = 0.25;
    CT_CHECK(capex_scaler_init(&a, &d) == CAPEX_OK, "%.300s", capex_last_error());
    lcg_state = 99;
    for (i = 0; i < 300; i++) CT_CHECK(iter1(&a, lcg_uniform() < 0.4, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(iter1(&a, 0, NULL) == CAPEX_OK && iter1(&a, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&a, &st) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(st.hysteresis_tracker == 2 && st.steps == 302 && st.growth_interval == 5 && st.min_scale == 2.0f,
             "hyst %d steps %lld", st.hysteresis_tracker, (long long)st.steps);
    /* restore into a scaler made with other settings: it adopts the saved rule */
    capex_scaler_desc_init(&d);
    d.log_interval = 7;
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK && capex_scaler_set_state(&b, &st) == CAPEX_OK, "%.300s",
             capex_last_error());
    CT_CHECK(capex_scaler_get_state(&b, &st2) == CAPEX_OK && memcmp(&st, &st2, sizeof st) == 0, "round trip differs");
    CT_CHECK(b.desc.log_interval == 7, "set_state must keep the live log_interval");
    for (i = 0; i < 500; i++) {
        int f = lcg_uniform() < 0.3;
        float sa = 0.0f, sb = 0.0f;
        CT_CHECK(iter1(&a, f, NULL) == CAPEX_OK && iter1(&b, f, NULL) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK((sa = capex_scaler_get_scale(&a)) == (sb = capex_scaler_get_scale(&b)),
                 "step %d: %g vs %g", i, (double)sa, (double)sb);
    }
    /* a PyTorch-style scale that underflowed to 0 (no floor) is a valid state */
    d = torch_desc(65536.0f, 2.0, 0.5, 10);
    CT_CHECK(capex_scaler_init(&a, &d) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 200; i++) CT_CHECK(iter1(&a, 1, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&a, &st) == CAPEX_OK && st.scale == 0.0f, "scale %g", (double)st.scale);
    CT_CHECK(capex_scaler_set_state(&b, &st) == CAPEX_OK, "%.300s", capex_last_error());
}

CT_TEST(bad_states_are_rejected) {
    capex_scaler_desc d;
    capex_scaler sc;
    capex_scaler_state good, st;
    int k;
    quiet();
    capex_scaler_desc_init(&d);
    d.min_scale = 1.0f;
    d.hysteresis = 2;
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(iter1(&sc, 0, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, &good) == CAPEX_OK, "%.300s", capex_last_error());
    for (k = 0; k < 26; k++) {
        st = good;
        switch (k) {
        case 0: st.dynamic = 2; break;
        case 1: st.scale = NAN; break;
        case 2: st.scale = INFINITY; break;
        case 3: st.scale = -4.0f; break;
        case 4: st.scale = 0.0f; break;              /* min_scale 1 */
        case 5: st.scale = 0.5f; break;              /* below min */
        case 6: st.scale = 33554432.0f; break;       /* above max 2^24 */
        case 7: st.growth_tracker = -1; break;
        case 8: st.growth_tracker = st.growth_interval; break;
        case 9: st.hysteresis_tracker = -1; break;
        case 10: st.hysteresis_tracker = 3; break;
        case 11: st.steps = -1; st.skipped_steps = 0; break;
        case 12: st.skipped_steps = st.steps + 1; break;
        case 13: st.growth_factor = 1.0; break;
        case 14: st.growth_factor = NAN; break;
        case 15: st.backoff_factor = 1.0; break;
        case 16: st.backoff_factor = 0.0; break;
        case 17: st.growth_interval = 0; break;
        case 18: st.min_scale = 1e30f; break;        /* min > max */
        case 19: st.hysteresis = 0; break;
        case 20: st.init_scale = NAN; break;
        case 21: st.max_scale = NAN; break;
        case 22: st.min_scale = -1.0f; break;
        case 23: st.dynamic = 0; st.scale = 0.0f; st.min_scale = 0.0f; break;
        case 24: st.backoff_factor = INFINITY; break;
        case 25: st.growth_factor = INFINITY; break;
        }
        EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_set_state(&sc, &st), sc);
    }
    EXPECT_FAIL(CAPEX_ERR_INVALID_ARG, capex_scaler_set_state(&sc, NULL), sc);
    CT_CHECK(capex_scaler_set_state(&sc, &good) == CAPEX_OK, "the good state: %.300s", capex_last_error());
    /* a static state may carry a scale above the dynamic cap */
    st = good;
    st.dynamic = 0;
    st.scale = 1e30f;
    CT_CHECK(capex_scaler_set_state(&sc, &st) == CAPEX_OK, "%.300s", capex_last_error());
}

CT_TEST(bad_descs_and_null_pointers) {
    capex_scaler_desc d;
    capex_scaler sc;
    float s = 0.0f;
    int k, go;
    quiet();
    for (k = 0; k < 16; k++) {
        capex_scaler_desc_init(&d);
        switch (k) {
        case 0: d.init_scale = NAN; break;
        case 1: d.init_scale = INFINITY; break;
        case 2: d.init_scale = 0.0f; break;
        case 3: d.init_scale = -1.0f; break;
        case 4: d.growth_factor = 1.0; break;
        case 5: d.growth_factor = 0.5; break;
        case 6: d.backoff_factor = 1.0; break;
        case 7: d.backoff_factor = 0.0; break;
        case 8: d.backoff_factor = NAN; break;
        case 9: d.growth_interval = 0; break;
        case 10: d.hysteresis = 0; break;
        case 11: d.min_scale = 100.0f; d.max_scale = 10.0f; d.init_scale = 50.0f; break;
        case 12: d.max_scale = 1000.0f; break;   /* init 65536 above the cap */
        case 13: d.min_scale = 1e6f; break;      /* init below the floor */
        case 14: d.log_interval = -1; break;
        case 15: d.dynamic = 7; break;
        }
        capex_clear_error();
        CT_CHECK(capex_scaler_desc_check(&d) == CAPEX_ERR_INVALID_ARG, "case %d accepted", k);
        CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_ERR_INVALID_ARG, "case %d accepted by init", k);
        CT_CHECK(strstr(capex_last_error(), "capex_scaler_desc.") != NULL, "case %d: %.300s", k, capex_last_error());
        /* a scaler whose init failed refuses every call */
        CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_ERR_INVALID_ARG, "case %d: failed init left it usable", k);
    }
    capex_scaler_desc_init(&d);
    CT_CHECK(capex_scaler_init(NULL, &d) == CAPEX_ERR_INVALID_ARG, "NULL scaler");
    CT_CHECK(capex_scaler_init(&sc, NULL) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    CT_CHECK(capex_scaler_desc_check(NULL) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    memset(&sc, 0xab, sizeof sc); /* never initialised */
    CT_CHECK(capex_scaler_scale(&sc, &s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "capex_scaler_init"),
             "%.300s", capex_last_error());
    capex_clear_error();
    CT_CHECK(isnan(capex_scaler_get_scale(&sc)) && isnan(capex_scaler_get_inv_scale(&sc)) &&
                 strstr(capex_last_error(), "capex_scaler_init"),
             "uninitialised: %.300s", capex_last_error());
    /* a failed scale/unscale/step still writes its output: no uninitialised
       read, and a skipped (not a taken) step when the status is ignored */
    s = 1.0f;
    CT_CHECK(capex_scaler_scale(NULL, &s) == CAPEX_ERR_INVALID_ARG && isnan(s), "NULL: scale %g", (double)s);
    {
        float inv = 1.0f;
        CT_CHECK(capex_scaler_unscale(NULL, 0, 0, &inv) == CAPEX_ERR_INVALID_ARG && isnan(inv), "NULL: inv %g",
                 (double)inv);
    }
    go = 1;
    CT_CHECK(capex_scaler_step(NULL, 0, &go) == CAPEX_ERR_INVALID_ARG && go == 0, "NULL: go %d", go);
    CT_CHECK(capex_scaler_update(NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_scaler_update_to(NULL, 1.0f) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_scaler_discard_iteration(NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    capex_clear_error();
    CT_CHECK(isnan(capex_scaler_get_scale(NULL)) && strstr(capex_last_error(), "capex_scaler_get_scale: scaler is NULL"),
             "NULL: %.300s", capex_last_error());
    capex_clear_error();
    CT_CHECK(isnan(capex_scaler_get_inv_scale(NULL)) && strstr(capex_last_error(), "capex_scaler_get_inv_scale"),
             "NULL: %.300s", capex_last_error());
    CT_CHECK(capex_scaler_set_scale(NULL, 1.0f) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_scaler_get_state(NULL, NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_scaler_set_state(NULL, NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&sc, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
}


/* The opt level's loss scale reaches the scaler (Apex amp.initialize: O1/O2
   dynamic, O0/O3 static 1.0; capex: bf16 static 1.0; overrides win). */
CT_TEST(scaler_desc_from_amp) {
    static const struct { capex_opt_level lv; capex_dtype half; int ovmode; double ovscale; int enabled; int dyn; float scale; } k[] = {
        {CAPEX_O0, CAPEX_F16, 0, 0, 1, 0, 1.0f},      {CAPEX_O1, CAPEX_F16, 0, 0, 1, 1, 65536.0f},
        {CAPEX_O2, CAPEX_F16, 0, 0, 1, 1, 65536.0f},  {CAPEX_O3, CAPEX_F16, 0, 0, 1, 0, 1.0f},
        {CAPEX_O2, CAPEX_BF16, 0, 0, 1, 0, 1.0f},     {CAPEX_O1, CAPEX_BF16, 0, 0, 1, 0, 1.0f},
        {CAPEX_O2, CAPEX_F16, CAPEX_LOSS_SCALE_STATIC, 128.0, 1, 0, 128.0f},
        {CAPEX_O3, CAPEX_F16, CAPEX_LOSS_SCALE_DYNAMIC, 0, 1, 1, 65536.0f},
        {CAPEX_O2, CAPEX_F16, 0, 0, 0, 0, 1.0f}, /* enabled = False */
    };
    size_t i;
    for (i = 0; i < sizeof k / sizeof k[0]; i++) {
        capex_amp_overrides ov;
        capex_amp_config cfg;
        capex_scaler_desc d;
        capex_scaler sc;
        float scale = 0.0f;
        capex_amp_overrides_init(&ov);
        if (k[i].ovmode) { ov.loss_scale_mode = (capex_loss_scale_mode)k[i].ovmode; ov.loss_scale = k[i].ovscale ? k[i].ovscale : 1.0; }
        if (!k[i].enabled) ov.enabled = CAPEX_TRI_FALSE;
        CT_CHECK(capex_amp_resolve(k[i].lv, k[i].half, &ov, &cfg) == CAPEX_OK, "case %zu: resolve: %s", i, capex_last_error());
        memset(&d, 0xa5, sizeof d);
        CT_CHECK(capex_scaler_desc_from_amp(&cfg, &d) == CAPEX_OK, "case %zu: %s", i, capex_last_error());
        CT_CHECK(d.dynamic == k[i].dyn && d.init_scale == k[i].scale && d.growth_interval == 2000 && d.max_scale == 16777216.0f,
                 "case %zu: dynamic %d scale %g", i, d.dynamic, (double)d.init_scale);
        CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK && capex_scaler_scale(&sc, &scale) == CAPEX_OK && scale == k[i].scale,
                 "case %zu: scaler scale %g", i, (double)scale);
    }
    {
        capex_amp_config cfg;
        capex_scaler_desc d, before;
        CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, NULL, &cfg) == CAPEX_OK, "resolve");
        cfg.loss_scale_mode = CAPEX_LOSS_SCALE_NONE;
        memset(&d, 0x5a, sizeof d);
        before = d;
        CT_CHECK(capex_scaler_desc_from_amp(&cfg, &d) == CAPEX_ERR_INVALID_ARG && memcmp(&d, &before, sizeof d) == 0,
                 "mode NONE must be refused, desc unchanged");
        CT_CHECK(capex_scaler_desc_from_amp(NULL, &d) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
        CT_CHECK(capex_scaler_desc_from_amp(&cfg, NULL) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    }
}

static const ct_case cases[] = {
    CT_CASE(defaults_are_apex_and_pytorch),
    CT_CASE(hand_checked_table),
    CT_CASE(matches_pytorch_rule_on_scripted_sequences),
    CT_CASE(matches_torch_golden_file),
    CT_CASE(hysteresis_2_and_3),
    CT_CASE(min_and_max_clamps),
    CT_CASE(static_scaler),
    CT_CASE(several_scalers_are_independent),
    CT_CASE(several_optimizers),
    CT_CASE(out_of_order_calls_fail_and_change_nothing),
    CT_CASE(update_to_and_set_scale),
    CT_CASE(overflow_logging_is_rate_limited),
    CT_CASE(state_round_trip),
    CT_CASE(bad_states_are_rejected),
    CT_CASE(bad_descs_and_null_pointers),
    CT_CASE(scaler_desc_from_amp),
};
CT_MAIN(cases)
