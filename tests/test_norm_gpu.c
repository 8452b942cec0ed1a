/* GPU norms (capex_cuda.h NORM) against capex.h's CPU norms, which
   tests/test_norm.c checks against float64 references: LayerNorm/RMSNorm
   forward and backward for warp-per-row and block-per-row widths, vectorised
   and scalar loads, f32/f16/bf16 inputs with f32 or half parameters;
   BatchNorm (both layouts, train and eval, running statistics) and
   SyncBatchNorm over a world of one, and over an NCCL comm of two forked
   ranks (the stand-in NCCL on the emulator: inputs written and outputs read
   on the comm's user stream, as the NCCL section promises). Outputs are
   poisoned first. The aliasing rule: overlaps refused before any launch,
   forward in place equal to out of place bit for bit. Every GPU test skips without a GPU; the argument checks
   run everywhere. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include "nccl_world.h"
#include "fork_world.h"
#include <dlfcn.h>
#include <math.h>

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0:detect_leaks=0"; }

static unsigned long long g_rng = 777;
static float rnd(void) {
    unsigned long long z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float getv(capex_dtype t, const void *p, int64_t i) {
    if (t == CAPEX_F32) return ((const float *)p)[i];
    if (t == CAPEX_F16) return capex_f16_to_f32(((const uint16_t *)p)[i]);
    return capex_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void setv(capex_dtype t, void *p, int64_t i, float v) {
    if (t == CAPEX_F32) ((float *)p)[i] = v;
    else if (t == CAPEX_F16) ((uint16_t *)p)[i] = capex_f32_to_f16(v);
    else ((uint16_t *)p)[i] = capex_f32_to_bf16(v);
}
static float tol_of(capex_dtype t) { return t == CAPEX_F32 ? 1e-4f : t == CAPEX_F16 ? 4e-3f : 3e-2f; }
/* max |a - b| <= tol * max(1, max |b|) */
static int same(capex_dtype t, const void *a, const void *b, int64_t n, float tol, float *err) {
    float mx = 1.0f, e = 0.0f;
    int64_t i;
    for (i = 0; i < n; i++) if (fabsf(getv(t, b, i)) > mx) mx = fabsf(getv(t, b, i));
    for (i = 0; i < n; i++) {
        float d = fabsf(getv(t, a, i) - getv(t, b, i));
        if (!(d <= e)) e = d != d ? 1e30f : d;
    }
    *err = e / mx;
    return e <= tol * mx;
}

static capex_cuda_context *open_ctx(ct_state *ct) {
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    int n = 0;
    capex_result r = capex_cuda_device_count(&n);
    if (r != CAPEX_OK || n == 0) {
        ct_skip(ct, "no GPU (%s): %.90s", capex_result_string(r), r == CAPEX_OK ? "0 devices" : capex_last_error());
        return NULL;
    }
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    if (capex_cuda_context_create(&cd, &ctx) != CAPEX_OK) {
        ct_fail(ct, __FILE__, __LINE__, "context", "%s", capex_last_error());
        return NULL;
    }
    return ctx;
}

static capex_cuda_ptr up(capex_cuda_context *ctx, const void *h, size_t bytes) {
    capex_cuda_ptr p = 0;
    if (capex_cuda_malloc(ctx, bytes ? bytes : 4, &p) != CAPEX_OK) return 0;
    if (h) capex_cuda_memcpy_htod(ctx, p, h, bytes, NULL);
    else capex_cuda_memset_u8(ctx, p, 0xff, bytes, NULL); /* poison: NaN */
    return p;
}

/* yt: y and dy (the variants fix x, param and y dtype and rms on their own) */
static void ln_case(ct_state *ct, capex_cuda_context *ctx, int rms, int64_t R, int64_t C, capex_dtype xt, capex_dtype pt,
                    capex_dtype yt) {
    const int64_t N = R * C;
    const size_t xs = capex_dtype_size(xt), ps = capex_dtype_size(pt), ys = capex_dtype_size(yt);
    void *x = malloc(N * xs), *dy = malloc(N * ys), *w = malloc(C * ps), *b = malloc(C * ps);
    void *y = malloc(N * ys), *dx = malloc(N * xs), *dw = malloc(C * ps), *db = malloc(C * ps);
    void *gy = malloc(N * ys), *gdx = malloc(N * xs), *gdw = malloc(C * ps), *gdb = malloc(C * ps);
    float *mean = (float *)malloc(R * 4), *rstd = (float *)malloc(R * 4), *gm = (float *)malloc(R * 4),
          *gr = (float *)malloc(R * 4), err;
    capex_norm_args a;
    capex_cuda_norm_args g;
    int64_t i;
    size_t wsb = capex_cuda_norm_workspace_bytes(R, C);
    for (i = 0; i < N; i++) { setv(xt, x, i, 1.0f + 2.0f * rnd()); setv(yt, dy, i, rnd()); }
    for (i = 0; i < C; i++) { setv(pt, w, i, 1.0f + 0.5f * rnd()); setv(pt, b, i, rnd()); }
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x_dtype = xt; a.y_dtype = yt; a.param_dtype = pt; a.x = x; a.y = y; a.weight = w;
    a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd; a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
    CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "cpu fwd");
    CT_CHECK((rms ? capex_rms_norm_backward(NULL, &a) : capex_layer_norm_backward(NULL, &a)) == CAPEX_OK, "cpu bwd");
    capex_cuda_norm_args_init(&g);
    g.rows = R; g.cols = C; g.x_dtype = xt; g.y_dtype = yt; g.param_dtype = pt;
    g.x = up(ctx, x, N * xs); g.dy = up(ctx, dy, N * ys); g.weight = up(ctx, w, C * ps);
    g.bias = rms ? 0 : up(ctx, b, C * ps); g.y = up(ctx, NULL, N * ys); g.dx = up(ctx, NULL, N * xs);
    g.mean = up(ctx, NULL, R * 4); g.rstd = up(ctx, NULL, R * 4); g.dweight = up(ctx, NULL, C * ps);
    g.dbias = rms ? 0 : up(ctx, NULL, C * ps); g.workspace = up(ctx, NULL, wsb);
    CT_CHECK((rms ? capex_cuda_rms_norm_forward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL)) ==
             CAPEX_OK, "%s", capex_last_error());
    CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL)) ==
             CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_memcpy_dtoh(ctx, gy, g.y, N * ys, NULL); capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, N * xs, NULL);
    capex_cuda_memcpy_dtoh(ctx, gm, g.mean, R * 4, NULL); capex_cuda_memcpy_dtoh(ctx, gr, g.rstd, R * 4, NULL);
    capex_cuda_memcpy_dtoh(ctx, gdw, g.dweight, C * ps, NULL);
    if (!rms) capex_cuda_memcpy_dtoh(ctx, gdb, g.dbias, C * ps, NULL);
    CT_CHECK(same(yt, gy, y, N, tol_of(yt), &err), "rms=%d R=%lld C=%lld xt=%d pt=%d yt=%d y err %g", rms, (long long)R, (long long)C,
             xt, pt, yt, err);
    CT_CHECK(same(CAPEX_F32, gr, rstd, R, 1e-4f, &err), "rstd err %g", err);
    CT_CHECK(rms || same(CAPEX_F32, gm, mean, R, 1e-5f, &err), "mean err %g", err);
    CT_CHECK(same(xt, gdx, dx, N, 5 * tol_of(xt), &err), "rms=%d C=%lld dx err %g", rms, (long long)C, err);
    CT_CHECK(same(pt, gdw, dw, C, 5 * tol_of(pt), &err), "dweight err %g", err);
    CT_CHECK(rms || same(pt, gdb, db, C, 5 * tol_of(pt), &err), "dbias err %g", err);
    capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias);
    capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dx); capex_cuda_free(ctx, g.mean); capex_cuda_free(ctx, g.rstd);
    capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias); capex_cuda_free(ctx, g.workspace);
    free(x); free(dy); free(w); free(b); free(y); free(dx); free(dw); free(db); free(gy); free(gdx); free(gdw); free(gdb);
    free(mean); free(rstd); free(gm); free(gr);
}

/* Backward asked for part of its outputs (frozen norm weights: dx only; dx
   not needed: dweight/dbias only; dbias or dweight alone), LayerNorm and
   RMSNorm, f32, both row paths (warp, block): each output requested is the
   bits the full call writes, and the float64 sum of dy over rows for dbias
   (the f32 values are exact: multiples of 1/64, small). Outputs not
   requested are not written, workspace missing or misaligned for
   dweight/dbias refused. Before 2026-11-28 only dx + dweight (+ dbias) ran
   on a device. */
CT_TEST(gpu_norm_backward_partial_outputs) {
    static const int64_t widths[2] = {20, 1100};
    capex_cuda_context *ctx = open_ctx(ct);
    int wi, rms, combo;
    if (!ctx) return;
    for (wi = 0; wi < 2 && !ct->failed; wi++)
        for (rms = 0; rms < 2 && !ct->failed; rms++) {
            const int64_t R = 9, C = widths[wi], N = R * C;
            float *x = (float *)malloc(N * 4), *dy = (float *)malloc(N * 4), *w = (float *)malloc(C * 4), *b = (float *)malloc(C * 4);
            float *full_dx = (float *)malloc(N * 4), *full_dw = (float *)malloc(C * 4), *full_db = (float *)malloc(C * 4);
            float *got = (float *)malloc(N * 4);
            capex_cuda_norm_args g;
            capex_cuda_ptr dx, dw, db, ws;
            int64_t i, r;
            size_t wsb = capex_cuda_norm_workspace_bytes(R, C);
            for (i = 0; i < N; i++) { x[i] = 1.0f + 2.0f * rnd(); dy[i] = (float)((int)(rnd() * 64.0f)) / 64.0f; }
            for (i = 0; i < C; i++) { w[i] = 1.0f + 0.5f * rnd(); b[i] = rnd(); }
            capex_cuda_norm_args_init(&g);
            g.rows = R; g.cols = C; g.x_dtype = g.y_dtype = g.param_dtype = CAPEX_F32;
            g.x = up(ctx, x, N * 4); g.dy = up(ctx, dy, N * 4); g.weight = up(ctx, w, C * 4); g.bias = rms ? 0 : up(ctx, b, C * 4);
            g.y = up(ctx, NULL, N * 4); g.mean = up(ctx, NULL, R * 4); g.rstd = up(ctx, NULL, R * 4);
            dx = up(ctx, NULL, N * 4); dw = up(ctx, NULL, C * 4); db = up(ctx, NULL, C * 4); ws = up(ctx, NULL, wsb + 4);
            CT_CHECK((rms ? capex_cuda_rms_norm_forward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL)) ==
                     CAPEX_OK, "%s", capex_last_error());
            for (combo = 0; combo < 5 && !ct->failed; combo++) { /* 0 all, 1 dx only, 2 params only, 3 dbias only, 4 dweight only */
                capex_result res;
                int want_dx = combo <= 1, want_dw = combo == 0 || combo == 2 || combo == 4, want_db = !rms && combo != 1 && combo != 4;
                if (rms && combo == 3) continue; /* RMSNorm has no bias */
                CT_CHECK(capex_cuda_memset_u8(ctx, dx, 0xff, N * 4, NULL) == CAPEX_OK && capex_cuda_memset_u8(ctx, dw, 0xff, C * 4, NULL) == CAPEX_OK &&
                         capex_cuda_memset_u8(ctx, db, 0xff, C * 4, NULL) == CAPEX_OK, "poison");
                g.dx = want_dx ? dx : 0; g.dweight = want_dw ? dw : 0; g.dbias = want_db ? db : 0; g.workspace = ws;
                if (want_dw || want_db) { /* refused first: no workspace, a misaligned one */
                    g.workspace = 0;
                    res = rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL);
                    CT_CHECK(res == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "workspace"), "combo %d no workspace: %s", combo,
                             capex_last_error());
                    g.workspace = ws + 2;
                    res = rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL);
                    CT_CHECK(res == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "aligned"), "combo %d misaligned: %s", combo,
                             capex_last_error());
                    g.workspace = ws;
                }
                res = rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL);
                CT_CHECK(res == CAPEX_OK && capex_cuda_context_synchronize(ctx) == CAPEX_OK, "combo %d: %s", combo, capex_last_error());
                if (combo == 0) {
                    capex_cuda_memcpy_dtoh(ctx, full_dx, dx, N * 4, NULL);
                    capex_cuda_memcpy_dtoh(ctx, full_dw, dw, C * 4, NULL);
                    if (!rms) capex_cuda_memcpy_dtoh(ctx, full_db, db, C * 4, NULL);
                    for (i = 0; !rms && i < C; i++) {
                        double sdy = 0;
                        for (r = 0; r < R; r++) sdy += dy[r * C + i];
                        CT_CHECK(full_db[i] == (float)sdy, "C=%lld dbias[%lld] %.9g, float64 %.17g", (long long)C, (long long)i,
                                 (double)full_db[i], sdy);
                    }
                    continue;
                }
                capex_cuda_memcpy_dtoh(ctx, got, dx, N * 4, NULL);
                for (i = 0; i < N; i++)
                    CT_CHECK(want_dx ? !memcmp(&got[i], &full_dx[i], 4) : ((uint32_t *)got)[i] == 0xffffffffu,
                             "rms=%d C=%lld combo %d: dx[%lld] %.9g (full call %.9g)", rms, (long long)C, combo, (long long)i,
                             (double)got[i], (double)full_dx[i]);
                capex_cuda_memcpy_dtoh(ctx, got, dw, C * 4, NULL);
                for (i = 0; i < C; i++)
                    CT_CHECK(want_dw ? !memcmp(&got[i], &full_dw[i], 4) : ((uint32_t *)got)[i] == 0xffffffffu,
                             "rms=%d C=%lld combo %d: dweight[%lld] %.9g (full call %.9g)", rms, (long long)C, combo, (long long)i,
                             (double)got[i], (double)full_dw[i]);
                capex_cuda_memcpy_dtoh(ctx, got, db, C * 4, NULL);
                for (i = 0; i < C; i++)
                    CT_CHECK(want_db ? !memcmp(&got[i], &full_db[i], 4) : ((uint32_t *)got)[i] == 0xffffffffu,
                             "rms=%d C=%lld combo %d: dbias[%lld] %.9g (full call %.9g)", rms, (long long)C, combo, (long long)i,
                             (double)got[i], (double)full_db[i]);
            }
            capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias);
            capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.mean); capex_cuda_free(ctx, g.rstd); capex_cuda_free(ctx, dx);
            capex_cuda_free(ctx, dw); capex_cuda_free(ctx, db); capex_cuda_free(ctx, ws);
            free(x); free(dy); free(w); free(b); free(full_dx); free(full_dw); free(full_db); free(got);
        }
    capex_cuda_context_destroy(ctx);
}

CT_TEST(gpu_layer_and_rms_norm_match_cpu) {
    static const int64_t widths[] = {1, 7, 64, 1000, 1024, 1025, 4096, 8192};
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    capex_cuda_context *ctx = open_ctx(ct);
    size_t wi, ti;
    int rms;
    if (!ctx) return;
    for (rms = 0; rms < 2; rms++)
        for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (ti = 0; ti < 3; ti++) {
                ln_case(ct, ctx, rms, 37, widths[wi], ts[ti], CAPEX_F32, ts[ti]);
                if (ct->failed) break;
                ln_case(ct, ctx, rms, 5, widths[wi], ts[ti], ts[ti], ts[ti]);
                if (ct->failed) break;
            }
    capex_cuda_context_destroy(ctx);
}

/* Every LayerNorm/RMSNorm variant (x, param and y dtype x rms: 54 forward and
   54 backward, CAPEX__CUDA_NVB), each warp-per-row with and without the
   4-element loads and block-per-row. On the CPU emulator each launch is also
   checked against its variant's tag (the switches NVRTC fixed with -D), and
   two variants run their text compiled with those switches (tests/emu_gen.c). */
typedef int (*emu_count_fn)(int runs);
static emu_count_fn emu_vtag_checks(void) {
    const char *path = getenv("CAPEX_LIBCUDA_PATH");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL, *p = lib ? dlsym(lib, "capex_emu_vtag_checks") : NULL;
    emu_count_fn f = NULL;
    if (lib) dlclose(lib); /* still loaded by capex */
    if (p) memcpy(&f, &p, sizeof p);
    return f;
}
CT_TEST(gpu_norm_every_dtype_variant) {
    static const int64_t widths[] = {64, 7, 1100};
    capex_cuda_context *ctx = open_ctx(ct);
    emu_count_fn checks = emu_vtag_checks();
    int i, before, before_runs;
    if (!ctx) return;
    before = checks ? checks(0) : 0;
    before_runs = checks ? checks(1) : 0;
    for (i = 0; i < 3 * 54 && !ct->failed; i++) {
        const int v = i / 3;
        ln_case(ct, ctx, v % 2, 6, widths[i % 3], (capex_dtype)(v / 18), (capex_dtype)(v / 6 % 3), (capex_dtype)(v / 2 % 3));
    }
    /* forward 1, backward 3 launches (dx, partial sums, final) per case */
    if (checks && !ct->failed) { /* else keep the first failure's message */
        CT_CHECK(checks(0) - before == 3 * 54 * 4, "%d of %d launches checked against their variant", checks(0) - before, 3 * 54 * 4);
        CT_CHECK(checks(1) - before_runs == 2 * 3 * 4, "%d of 24 launches ran a variant's own text", checks(1) - before_runs);
    }
    capex_cuda_context_destroy(ctx);
}

/* Memory-efficient backward (desc.memory_efficient: from y, not x) against
   the CPU's from the same y and rstd (the CPU forward's, uploaded; x and mean
   are 0 on the device): every variant (x, param and y dtype x rms) warp-per-row
   vectorised and scalar and block-per-row, with and without affine; dweight
   and dbias bits the same from the 4-column and the scalar partial sums. On
   the CPU emulator each launch is checked against its variant's tag. */
static void me_gpu_case(ct_state *ct, capex_cuda_context *ctx, int rms, int64_t R, int64_t C, capex_dtype xt, capex_dtype pt,
                        capex_dtype yt, int affine, int ws_off) {
    const int64_t N = R * C;
    const size_t xs = capex_dtype_size(xt), ps = capex_dtype_size(pt), ys = capex_dtype_size(yt);
    void *x = malloc(N * xs), *dy = malloc(N * ys), *w = malloc(C * ps), *b = malloc(C * ps);
    void *y = malloc(N * ys), *dx = malloc(N * xs), *dw = malloc(C * ps), *db = malloc(C * ps);
    void *gdx = malloc(N * xs), *gdw = malloc(C * ps), *gdb = malloc(C * ps);
    float *rstd = (float *)malloc(R * 4), err;
    const int hb = affine && !rms;
    capex_norm_desc nd;
    capex_norm_args a;
    capex_cuda_norm_args g;
    int64_t i;
    size_t wsb = capex_cuda_norm_workspace_bytes(R, C);
    for (i = 0; i < N; i++) { setv(xt, x, i, 1.0f + 2.0f * rnd()); setv(yt, dy, i, rnd()); }
    for (i = 0; i < C; i++) { setv(pt, w, i, 1.0f + 0.5f * rnd()); setv(pt, b, i, rnd()); }
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x_dtype = xt; a.y_dtype = yt; a.param_dtype = pt; a.x = x; a.y = y;
    a.weight = affine ? w : NULL; a.bias = hb ? b : NULL; a.rstd = rstd;
    CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "cpu fwd");
    nd.memory_efficient = 1;
    a.x = NULL; a.dy = dy; a.dx = dx; a.dweight = affine ? dw : NULL; a.dbias = hb ? db : NULL;
    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "cpu me bwd: %s",
             capex_last_error());
    capex_cuda_norm_args_init(&g);
    g.rows = R; g.cols = C; g.x_dtype = xt; g.y_dtype = yt; g.param_dtype = pt;
    g.y = up(ctx, y, N * ys); g.dy = up(ctx, dy, N * ys); g.rstd = up(ctx, rstd, R * 4);
    g.weight = affine ? up(ctx, w, C * ps) : 0; g.bias = hb ? up(ctx, b, C * ps) : 0;
    g.dx = up(ctx, NULL, N * xs); g.dweight = affine ? up(ctx, NULL, C * ps) : 0; g.dbias = hb ? up(ctx, NULL, C * ps) : 0;
    g.workspace = up(ctx, NULL, wsb + 16);
    if (g.workspace) g.workspace += (unsigned)ws_off;
    CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, &nd, &g, NULL) : capex_cuda_layer_norm_backward(ctx, &nd, &g, NULL)) ==
             CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, N * xs, NULL);
    if (affine) capex_cuda_memcpy_dtoh(ctx, gdw, g.dweight, C * ps, NULL);
    if (hb) capex_cuda_memcpy_dtoh(ctx, gdb, g.dbias, C * ps, NULL);
    CT_CHECK(same(xt, gdx, dx, N, 5 * tol_of(xt), &err), "me rms=%d C=%lld xt=%d pt=%d yt=%d affine %d: dx err %g", rms,
             (long long)C, xt, pt, yt, affine, err);
    CT_CHECK(!affine || same(pt, gdw, dw, C, 5 * tol_of(pt), &err), "me rms=%d C=%lld: dweight err %g", rms, (long long)C, err);
    CT_CHECK(!hb || same(pt, gdb, db, C, 5 * tol_of(pt), &err), "me C=%lld: dbias err %g", (long long)C, err);
    if (ws_off == 0 && affine && !ct->failed) { /* the same partial sums from the scalar column loop */
        void *sdw = malloc(C * ps), *sdb = malloc(C * ps);
        capex_cuda_free(ctx, g.dx);
        g.dx = 0;
        g.workspace += 4;
        CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, &nd, &g, NULL) : capex_cuda_layer_norm_backward(ctx, &nd, &g, NULL)) ==
                 CAPEX_OK, "%s", capex_last_error());
        capex_cuda_memcpy_dtoh(ctx, sdw, g.dweight, C * ps, NULL);
        if (hb) capex_cuda_memcpy_dtoh(ctx, sdb, g.dbias, C * ps, NULL);
        CT_CHECK(memcmp(sdw, gdw, C * ps) == 0 && (!hb || memcmp(sdb, gdb, C * ps) == 0),
                 "me C=%lld: dweight/dbias differ between the 4-column and the scalar partial sums", (long long)C);
        g.workspace -= 4;
        free(sdw); free(sdb);
    }
    capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.rstd); capex_cuda_free(ctx, g.weight);
    capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.dx); capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias);
    capex_cuda_free(ctx, g.workspace - (unsigned)ws_off);
    free(x); free(dy); free(w); free(b); free(y); free(dx); free(dw); free(db); free(gdx); free(gdw); free(gdb); free(rstd);
}
CT_TEST(gpu_norm_memory_efficient_matches_cpu_every_variant) {
    static const int64_t widths[] = {64, 7, 1100};
    capex_cuda_context *ctx = open_ctx(ct);
    emu_count_fn checks = emu_vtag_checks();
    int i, before, launches = 0;
    if (!ctx) return;
    before = checks ? checks(0) : 0;
    for (i = 0; i < 3 * 54 && !ct->failed; i++) {
        const int v = i / 3, rms = v % 2;
        me_gpu_case(ct, ctx, rms, 6, widths[i % 3], (capex_dtype)(v / 18), (capex_dtype)(v / 6 % 3), (capex_dtype)(v / 2 % 3), 1, 0);
        launches += 3 + 2; /* dx, partial sums, final; again without dx */
    }
    for (i = 0; i < 2 * 3 && !ct->failed; i++) { /* no affine: xhat = y */
        me_gpu_case(ct, ctx, i % 2, 9, widths[i / 2], CAPEX_F32, CAPEX_F32, i / 2 == 1 ? CAPEX_BF16 : CAPEX_F32, 0, 0);
        launches += 1;
    }
    if (checks && !ct->failed)
        CT_CHECK(checks(0) - before == launches, "%d of %d launches checked against their variant", checks(0) - before, launches);
    capex_cuda_context_destroy(ctx);
}

/* A zero weight (column 2, f32 +0 and bf16 -0): the GPU cannot refuse it
   without a host sync, so that column's dx (every row) and dweight come out
   non-finite, for the loss scaler to see; every other column, and dbias
   (sum dy, no xhat), stay finite. The CPU refuses the same call. */
CT_TEST(gpu_norm_memory_efficient_zero_weight_nonfinite) {
    static const capex_dtype pts[2] = {CAPEX_F32, CAPEX_BF16};
    capex_cuda_context *ctx = open_ctx(ct);
    const int64_t R = 5, C = 8, N = R * C;
    float x[40], y[40], dy[40], rstd[5], dx[40];
    unsigned char w[32], b[32], dw[32], db[32];
    capex_norm_desc nd;
    capex_norm_args a;
    int k, rms;
    int64_t i;
    if (!ctx) return;
    for (i = 0; i < N; i++) { x[i] = 1.0f + 2.0f * rnd(); dy[i] = rnd(); }
    for (k = 0; k < 2; k++)
        for (rms = 0; rms < 2; rms++) {
            const capex_dtype pt = pts[k];
            const size_t ps = capex_dtype_size(pt);
            capex_cuda_norm_args g;
            for (i = 0; i < C; i++) { setv(pt, w, i, 1.0f + 0.5f * rnd()); setv(pt, b, i, 0.5f * rnd()); }
            setv(pt, w, 2, k ? -0.0f : 0.0f);
            capex_norm_desc_init(&nd);
            capex_norm_args_init(&a);
            a.rows = R; a.cols = C; a.param_dtype = pt; a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.rstd = rstd;
            CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "cpu fwd");
            nd.memory_efficient = 1;
            a.x = NULL; a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
            CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_ERR_INVALID_ARG,
                     "the CPU accepted a zero weight");
            capex_cuda_norm_args_init(&g);
            g.rows = R; g.cols = C; g.param_dtype = pt;
            g.y = up(ctx, y, N * 4); g.dy = up(ctx, dy, N * 4); g.rstd = up(ctx, rstd, R * 4); g.weight = up(ctx, w, C * ps);
            g.bias = rms ? 0 : up(ctx, b, C * ps); g.dx = up(ctx, NULL, N * 4); g.dweight = up(ctx, NULL, C * ps);
            g.dbias = rms ? 0 : up(ctx, NULL, C * ps); g.workspace = up(ctx, NULL, capex_cuda_norm_workspace_bytes(R, C));
            CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, &nd, &g, NULL) : capex_cuda_layer_norm_backward(ctx, &nd, &g, NULL)) ==
                     CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
            capex_cuda_memcpy_dtoh(ctx, dx, g.dx, N * 4, NULL);
            capex_cuda_memcpy_dtoh(ctx, dw, g.dweight, C * ps, NULL);
            if (!rms) capex_cuda_memcpy_dtoh(ctx, db, g.dbias, C * ps, NULL);
            for (i = 0; i < N; i++)
                CT_CHECK(i % C == 2 ? !isfinite(dx[i]) : isfinite(dx[i]), "pt=%d rms=%d: dx[%lld] = %g", (int)pt, rms, (long long)i,
                         (double)dx[i]);
            for (i = 0; i < C; i++) {
                CT_CHECK(i == 2 ? !isfinite(getv(pt, dw, i)) : isfinite(getv(pt, dw, i)), "pt=%d rms=%d: dweight[%lld] = %g", (int)pt,
                         rms, (long long)i, (double)getv(pt, dw, i));
                CT_CHECK(rms || isfinite(getv(pt, db, i)), "dbias[%lld] = %g", (long long)i, (double)getv(pt, db, i));
            }
            capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.rstd); capex_cuda_free(ctx, g.weight);
            capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.dx); capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias);
            capex_cuda_free(ctx, g.workspace);
        }
    capex_cuda_context_destroy(ctx);
}

/* The emulator refuses a launch whose switches differ from its variant's
   (a bf16 LayerNorm forward variant launched with f32 x): the check above
   can fail. On a GPU the variant would compute with its fixed dtypes. */
CT_TEST(gpu_norm_variant_mismatch_refused_on_emulator) {
    capex_cuda_context *ctx;
    capex_cuda_function fn;
    capex_cuda_ptr buf = 0, nul = 0;
    unsigned grid[3] = {1, 1, 1}, block[3] = {32, 4, 1};
    unsigned long long rows = 1, cols = 4;
    float eps = 1e-5f;
    int xt = 0, pt = 0, yt = 2, rms = 0, vec = 1;
    void *args[14];
    if (!(ctx = open_ctx(ct))) return; /* loads the driver */
    if (!emu_vtag_checks()) {
        capex_cuda_context_destroy(ctx);
        CT_SKIP("not the CPU emulator (CAPEX_LIBCUDA_PATH=build/emu/libcuda.so.1 runs it)");
    }
    CT_CHECK(capex__cuda_builtin_get_vb(ctx, CAPEX__CK_NORM_FWD, CAPEX__CUDA_NVB(2, 0, 2, 0), &fn, NULL) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_cuda_malloc(ctx, 64, &buf) == CAPEX_OK, "alloc");
    args[0] = &buf; args[1] = &xt; args[2] = &nul; args[3] = &nul; args[4] = &pt; args[5] = &buf; args[6] = &yt;
    args[7] = &nul; args[8] = &nul; args[9] = &rows; args[10] = &cols; args[11] = &eps; args[12] = &rms; args[13] = &vec;
    CT_CHECK(capex_cuda_launch(&fn, grid, block, 0, NULL, args) != CAPEX_OK, "x dtype 0 launched on the bf16 variant");
    capex_cuda_free(ctx, buf);
    capex_cuda_context_destroy(ctx);
}

/* dweight/dbias do not depend on the vector path: a workspace 4 bytes off a
   16-byte boundary takes the scalar column loop (one column per thread), an
   aligned one the 4-column loop; the bits must agree. dx one element off
   alignment (scalar loops) stays within the tolerance of the vector dx. */
CT_TEST(gpu_norm_backward_vector_and_scalar_paths_agree) {
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_BF16};
    capex_cuda_context *ctx = open_ctx(ct);
    const int64_t R = 29, C = 64, N = R * C;
    size_t ti;
    if (!ctx) return;
    for (ti = 0; ti < 2; ti++) {
        const capex_dtype t = ts[ti];
        const size_t xs = capex_dtype_size(t), wsb = capex_cuda_norm_workspace_bytes(R, C);
        void *x = malloc(N * xs), *dy = malloc(N * xs), *w = malloc(C * xs), *dx[2], *dw[2], *db[2];
        capex_cuda_norm_args g;
        capex_cuda_ptr ws, xd;
        int64_t i;
        int k;
        float err;
        for (i = 0; i < N; i++) setv(t, x, i, 1.0f + 2.0f * rnd());
        for (i = 0; i < N; i++) setv(t, dy, i, rnd());
        for (i = 0; i < C; i++) setv(t, w, i, 1.0f + 0.5f * rnd());
        capex_cuda_norm_args_init(&g);
        g.rows = R; g.cols = C; g.x_dtype = g.y_dtype = g.param_dtype = t;
        xd = up(ctx, x, N * xs); g.dy = up(ctx, dy, N * xs); g.weight = up(ctx, w, C * xs);
        g.bias = up(ctx, w, C * xs); g.y = up(ctx, NULL, N * xs); g.mean = up(ctx, NULL, R * 4); g.rstd = up(ctx, NULL, R * 4);
        ws = up(ctx, NULL, wsb + 16);
        for (k = 0; k < 2; k++) { /* 0: aligned dx and workspace (vector loops); 1: both off (scalar loops) */
            dx[k] = malloc(N * xs); dw[k] = malloc(C * xs); db[k] = malloc(C * xs);
            g.x = xd;
            g.workspace = ws + (k ? 4u : 0u);
            g.dx = up(ctx, NULL, N * xs + 8) + (k ? xs : 0); g.dweight = up(ctx, NULL, C * xs); g.dbias = up(ctx, NULL, C * xs);
            CT_CHECK(capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
            capex_cuda_memcpy_dtoh(ctx, dx[k], g.dx, N * xs, NULL);
            capex_cuda_memcpy_dtoh(ctx, dw[k], g.dweight, C * xs, NULL);
            capex_cuda_memcpy_dtoh(ctx, db[k], g.dbias, C * xs, NULL);
            capex_cuda_free(ctx, g.dx - (k ? xs : 0)); capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias);
        }
        CT_CHECK(memcmp(dw[0], dw[1], C * xs) == 0 && memcmp(db[0], db[1], C * xs) == 0,
                 "dtype %d: dweight/dbias differ between the 4-column and the scalar partial sums", (int)t);
        CT_CHECK(same(t, dx[1], dx[0], N, 5 * tol_of(t), &err), "dtype %d: dx vector vs scalar err %g", (int)t, err);
        for (k = 0; k < 2; k++) { free(dx[k]); free(dw[k]); free(db[k]); }
        capex_cuda_free(ctx, xd); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias);
        capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.mean); capex_cuda_free(ctx, g.rstd); capex_cuda_free(ctx, ws);
        free(x); free(dy); free(w);
    }
    capex_cuda_context_destroy(ctx);
}

static void bn_gpu_case(ct_state *ct, capex_cuda_context *ctx, int64_t N, int64_t C, int64_t S, capex_bn_layout lay,
                        capex_dtype xt, int training, int cumulative) {
    const int64_t T = N * C * S;
    const size_t xs = capex_dtype_size(xt);
    void *x = malloc(T * xs), *dy = malloc(T * xs), *y = malloc(T * xs), *dx = malloc(T * xs), *gy = malloc(T * xs),
         *gdx = malloc(T * xs);
    float w[16], b[16], rm[16], rv[16], grm[16], grv[16], sm[16], si[16], dw[16], db[16], gdw[16], gdb[16], err;
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    capex_cuda_batch_norm_args g;
    capex_comm single;
    int64_t i, tracked = 2, gtracked = 2;
    for (i = 0; i < T; i++) { setv(xt, x, i, 2.0f + 3.0f * rnd()); setv(xt, dy, i, rnd()); }
    for (i = 0; i < C; i++) { w[i] = 1.0f + 0.5f * rnd(); b[i] = rnd(); rm[i] = grm[i] = 0.1f * rnd(); rv[i] = grv[i] = 1.0f + 0.5f * rnd(); }
    capex_batch_norm_desc_init(&d);
    d.training = training;
    d.cumulative_average = cumulative; /* torch momentum=None: factor 1/3 here */
    capex_batch_norm_args_init(&a);
    a.n = N; a.c = C; a.s = S; a.layout = lay; a.x_dtype = a.y_dtype = xt; a.x = x; a.y = y; a.weight = w; a.bias = b;
    a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si; a.dy = dy; a.dx = dx;
    a.dweight = dw; a.dbias = db; a.num_batches_tracked = &tracked;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_batch_norm_args_init(&g);
    g.n = N; g.c = C; g.s = S; g.layout = lay; g.x_dtype = g.y_dtype = xt;
    g.x = up(ctx, x, T * xs); g.dy = up(ctx, dy, T * xs); g.y = up(ctx, NULL, T * xs); g.dx = up(ctx, NULL, T * xs);
    g.weight = up(ctx, w, C * 4); g.bias = up(ctx, b, C * 4); g.running_mean = up(ctx, grm, C * 4);
    g.running_var = up(ctx, grv, C * 4); g.save_mean = up(ctx, NULL, C * 4); g.save_invstd = up(ctx, NULL, C * 4);
    g.dweight = up(ctx, NULL, C * 4); g.dbias = up(ctx, NULL, C * 4);
    g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(C, 1));
    g.num_batches_tracked = &gtracked;
    CT_CHECK(capex_comm_init_single(&single) == CAPEX_OK, "single");
    g.workspace += 4; /* doubles inside: refused before anything runs, not a fault that kills the context */
    CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, &single, &g, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "aligned"), "misaligned workspace: %s", capex_last_error());
    g.workspace -= 4;
    CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, &single, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_batch_norm_backward(ctx, &d, &single, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
    capex_comm_destroy(&single);
    CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_memcpy_dtoh(ctx, gy, g.y, T * xs, NULL); capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, T * xs, NULL);
    capex_cuda_memcpy_dtoh(ctx, grm, g.running_mean, C * 4, NULL); capex_cuda_memcpy_dtoh(ctx, grv, g.running_var, C * 4, NULL);
    capex_cuda_memcpy_dtoh(ctx, gdw, g.dweight, C * 4, NULL); capex_cuda_memcpy_dtoh(ctx, gdb, g.dbias, C * 4, NULL);
    CT_CHECK(same(xt, gy, y, T, tol_of(xt), &err), "bn y lay=%d xt=%d train=%d err %g", lay, xt, training, err);
    CT_CHECK(same(xt, gdx, dx, T, 5 * tol_of(xt), &err), "bn dx err %g", err);
    CT_CHECK(same(CAPEX_F32, grm, rm, C, 1e-5f, &err) && same(CAPEX_F32, grv, rv, C, 1e-5f, &err), "running err %g", err);
    CT_CHECK(gtracked == tracked && tracked == 2 + training, "num_batches_tracked GPU %lld, CPU %lld", (long long)gtracked, (long long)tracked);
    CT_CHECK(same(CAPEX_F32, gdw, dw, C, 1e-3f, &err) && same(CAPEX_F32, gdb, db, C, 1e-3f, &err), "dweight/dbias err %g", err);
    capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dx);
    capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.running_mean);
    capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
    capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias); capex_cuda_free(ctx, g.workspace);
    free(x); free(dy); free(y); free(dx); free(gy); free(gdx);
}

CT_TEST(gpu_batch_norm_matches_cpu) {
    capex_cuda_context *ctx = open_ctx(ct);
    int lay, tr;
    if (!ctx) return;
    for (lay = 0; lay < 2; lay++)
        for (tr = 0; tr < 2; tr++) {
            bn_gpu_case(ct, ctx, 8, 16, 49, (capex_bn_layout)lay, CAPEX_F32, tr, lay);
            if (ct->failed) break;
            bn_gpu_case(ct, ctx, 3, 5, 1, (capex_bn_layout)lay, CAPEX_BF16, tr, 0);
            if (ct->failed) break;
        }
    capex_cuda_context_destroy(ctx);
}

/* Eval backward: dx = dy * invstd * w, the CPU's bits, with an inf in dy or
   in x staying local (test_norm's batch_norm_eval_backward_nonfinite_stays_local).
   Seen failing: the kernel's 0 * sum made the whole channel NaN. */
CT_TEST(gpu_batch_norm_eval_backward_nonfinite_stays_local) {
    enum { N = 3, C = 2, S = 4, E = N * C * S };
    float x[E], y[E], dy[E], dx[E], gdx[E], w[C] = {1.5f, -0.75f}, b[C] = {0.25f, 1}, rm[C] = {0.5f, -1}, rv[C] = {2, 0.5f};
    float sm[C], si[C];
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    capex_cuda_batch_norm_args g;
    capex_cuda_context *ctx = open_ctx(ct);
    int lay, bad, i;
    if (!ctx) return;
    capex_batch_norm_desc_init(&d);
    d.training = 0;
    for (lay = 0; lay < 2 && !ct->failed; lay++)
        for (bad = 0; bad < 2 && !ct->failed; bad++) { /* 0: inf in dy, 1: inf in x */
            for (i = 0; i < E; i++) { x[i] = (float)sin(0.9 * i) * 3.0f; dy[i] = (float)cos(1.7 * i); }
            if (bad == 0) dy[5] = INFINITY;
            else x[5] = INFINITY;
            capex_batch_norm_args_init(&a);
            a.n = N; a.c = C; a.s = S; a.layout = (capex_bn_layout)lay; a.x = x; a.y = y; a.weight = w; a.bias = b;
            a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si; a.dy = dy; a.dx = dx;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK && capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK,
                     "%s", capex_last_error());
            capex_cuda_batch_norm_args_init(&g);
            g.n = N; g.c = C; g.s = S; g.layout = (capex_bn_layout)lay;
            g.x = up(ctx, x, sizeof x); g.dy = up(ctx, dy, sizeof dy); g.y = up(ctx, NULL, sizeof y); g.dx = up(ctx, NULL, sizeof dx);
            g.weight = up(ctx, w, sizeof w); g.bias = up(ctx, b, sizeof b); g.running_mean = up(ctx, rm, sizeof rm);
            g.running_var = up(ctx, rv, sizeof rv); g.save_mean = up(ctx, NULL, C * 4); g.save_invstd = up(ctx, NULL, C * 4);
            g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(C, 1));
            CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_batch_norm_backward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, sizeof gdx, NULL) == CAPEX_OK, "%s", capex_last_error());
            for (i = 0; i < E; i++)
                CT_CHECK(memcmp(&gdx[i], &dx[i], 4) == 0, "layout %d case %d: dx[%d] GPU %g, CPU %g", lay, bad, i,
                         (double)gdx[i], (double)dx[i]);
            capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dx);
            capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.running_mean);
            capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
            capex_cuda_free(ctx, g.workspace);
        }
    capex_cuda_context_destroy(ctx);
}

/* Eval without running statistics uses the batch's (torch: bn_training), so one
   value per channel is refused as in training and as on the CPU (test_norm's
   batch_norm_constant_channel_and_no_running_stats), nothing written. Seen
   failing: the GPU checked the count in training only and normalised by a
   variance of 0. */
CT_TEST(gpu_batch_norm_eval_without_running_stats_needs_two_values) {
    float x[2] = {3, -1}, x4[4] = {3, -1, 5, 2}, poison[2] = {-99, -99}, y[2];
    capex_batch_norm_desc d;
    capex_cuda_batch_norm_args g;
    capex_cuda_context *ctx = open_ctx(ct);
    capex_result r;
    if (!ctx) return;
    capex_batch_norm_desc_init(&d);
    d.training = 0;
    capex_cuda_batch_norm_args_init(&g);
    g.n = 1; g.c = 2; g.s = 1;
    g.x = up(ctx, x, sizeof x); g.y = up(ctx, poison, sizeof poison); g.save_mean = up(ctx, poison, sizeof poison);
    g.save_invstd = up(ctx, poison, sizeof poison); g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(2, 1));
    r = capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "more than 1"), "%s: %s", capex_result_string(r),
             capex_last_error());
    CT_CHECK(capex_cuda_memcpy_dtoh(ctx, y, g.y, sizeof y, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(y[0] == -99.0f && y[1] == -99.0f, "y written by a refused call: %g %g", (double)y[0], (double)y[1]);
    g.n = 2; /* two values: fine */
    capex_cuda_free(ctx, g.x); g.x = up(ctx, x4, sizeof x4);
    capex_cuda_free(ctx, g.y); g.y = up(ctx, NULL, 16);
    CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
    capex_cuda_free(ctx, g.workspace);
    capex_cuda_context_destroy(ctx);
}

/* An empty batch (n = 0) with no collective, as torch and the CPU
   (test_norm's batch_norm_empty_batch_as_torch): accepted in training and in
   eval without running stats, both layouts, comm NULL; running statistics
   untouched, num_batches_tracked +1 in training only, save_mean 0 and
   save_invstd 1/sqrt(eps) as the CPU, dweight/dbias 0 from the backward (eps 0
   too). Seen failing: refused as "1 value per channel" for zero values. */
CT_TEST(gpu_batch_norm_empty_batch_as_torch) {
    float w[3] = {1.5f, 2, 3}, rs[3] = {0.5f, 0.5f, 0.5f}, rv[3] = {2, 2, 2}, poison[3] = {-99, -99, -99}, h[3], hv[3];
    capex_batch_norm_desc d;
    capex_cuda_batch_norm_args g;
    capex_cuda_context *ctx = open_ctx(ct);
    int64_t tracked;
    int lay, training, e, i;
    if (!ctx) return;
    for (lay = 0; lay < 2; lay++)
        for (training = 0; training < 2; training++)
            for (e = 0; e < 2; e++) {
                capex_batch_norm_desc_init(&d);
                d.training = training; d.eps = e ? 0.0f : 1e-5f;
                capex_cuda_batch_norm_args_init(&g);
                g.n = 0; g.c = 3; g.s = 4; g.layout = (capex_bn_layout)lay;
                g.weight = up(ctx, w, sizeof w); g.bias = up(ctx, w, sizeof w);
                if (training) { g.running_mean = up(ctx, rs, sizeof rs); g.running_var = up(ctx, rv, sizeof rv); }
                tracked = 7; g.num_batches_tracked = &tracked;
                g.save_mean = up(ctx, poison, sizeof poison); g.save_invstd = up(ctx, poison, sizeof poison);
                g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(3, 1));
                CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "lay %d training %d: %s", lay,
                         training, capex_last_error());
                CT_CHECK(tracked == (training ? 8 : 7), "num_batches_tracked %lld", (long long)tracked);
                if (training) {
                    CT_CHECK(capex_cuda_memcpy_dtoh(ctx, h, g.running_mean, sizeof h, NULL) == CAPEX_OK &&
                             capex_cuda_memcpy_dtoh(ctx, hv, g.running_var, sizeof hv, NULL) == CAPEX_OK, "%s", capex_last_error());
                    for (i = 0; i < 3; i++)
                        CT_CHECK(h[i] == 0.5f && hv[i] == 2.0f, "running stats moved: %g %g", (double)h[i], (double)hv[i]);
                }
                CT_CHECK(capex_cuda_memcpy_dtoh(ctx, h, g.save_mean, sizeof h, NULL) == CAPEX_OK &&
                         capex_cuda_memcpy_dtoh(ctx, hv, g.save_invstd, sizeof hv, NULL) == CAPEX_OK, "%s", capex_last_error());
                for (i = 0; i < 3; i++)
                    CT_CHECK(h[i] == 0.0f && hv[i] == 1.0f / sqrtf(d.eps), "save %g %g (the CPU's 0 and 1/sqrt(eps))",
                             (double)h[i], (double)hv[i]);
                g.dweight = up(ctx, poison, sizeof poison); g.dbias = up(ctx, poison, sizeof poison);
                CT_CHECK(capex_cuda_batch_norm_backward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "backward: %s", capex_last_error());
                CT_CHECK(capex_cuda_memcpy_dtoh(ctx, h, g.dweight, sizeof h, NULL) == CAPEX_OK &&
                         capex_cuda_memcpy_dtoh(ctx, hv, g.dbias, sizeof hv, NULL) == CAPEX_OK, "%s", capex_last_error());
                for (i = 0; i < 3; i++)
                    CT_CHECK(h[i] == 0.0f && hv[i] == 0.0f, "eps %g: dweight %g dbias %g", (double)d.eps, (double)h[i],
                             (double)hv[i]);
                capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.running_mean);
                capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
                capex_cuda_free(ctx, g.workspace); capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias);
                if (ct->failed) { capex_cuda_context_destroy(ctx); return; }
            }
    capex_cuda_context_destroy(ctx);
}

/* Finite values past 1.8e19 with a small spread: LayerNorm rows of 1..40
   columns (empty lanes of a warp and of a block) and a BatchNorm channel of 8
   values (empty threads of the stats block) stay finite and match the CPU
   (test_norm's huge_f32_values_short_rows_stay_finite checks it against
   float64). Seen failing: Chan's merge with an empty side, d * d * 0 = NaN. */
CT_TEST(gpu_norm_huge_f32_values_stay_finite) {
    float x[2 * 1100], y[2 * 1100], gy[2 * 1100], mean[2], rstd[2], err;
    static const int64_t widths[] = {1, 3, 17, 40, 1100};
    capex_norm_args a;
    capex_cuda_norm_args g;
    capex_cuda_context *ctx = open_ctx(ct);
    size_t k;
    int64_t i;
    if (!ctx) return;
    for (k = 0; k < sizeof widths / sizeof widths[0] && !ct->failed; k++) {
        const int64_t C = widths[k];
        for (i = 0; i < 2 * C; i++) x[i] = 1e20f * (1.0f + 1e-4f * (float)sin(1.3 * (double)i));
        capex_norm_args_init(&a);
        a.rows = 2; a.cols = C; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
        CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_norm_args_init(&g);
        g.rows = 2; g.cols = C; g.x = up(ctx, x, 8 * C); g.y = up(ctx, NULL, 8 * C);
        CT_CHECK(capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_memcpy_dtoh(ctx, gy, g.y, 8 * C, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(same(CAPEX_F32, gy, y, 2 * C, 1e-2f, &err), "LayerNorm cols %lld: GPU y[0] %g, CPU %g (err %g)", (long long)C,
                 (double)gy[0], (double)y[0], err);
        capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.y);
    }
    if (!ct->failed) {
        float sm[1], si[1], gsm[1], gsi[1];
        capex_batch_norm_desc d;
        capex_batch_norm_args b;
        capex_cuda_batch_norm_args gb;
        capex_batch_norm_desc_init(&d);
        for (i = 0; i < 8; i++) x[i] = 1e20f * (1.0f + 1e-4f * (float)sin(0.7 * (double)i));
        capex_batch_norm_args_init(&b);
        b.n = 8; b.c = 1; b.s = 1; b.x = x; b.y = y; b.save_mean = sm; b.save_invstd = si;
        CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_batch_norm_args_init(&gb);
        gb.n = 8; gb.c = 1; gb.s = 1; gb.x = up(ctx, x, 32); gb.y = up(ctx, NULL, 32); gb.save_mean = up(ctx, NULL, 4);
        gb.save_invstd = up(ctx, NULL, 4); gb.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(1, 1));
        CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &gb, NULL) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_memcpy_dtoh(ctx, gy, gb.y, 32, NULL); capex_cuda_memcpy_dtoh(ctx, gsm, gb.save_mean, 4, NULL);
        CT_CHECK(capex_cuda_memcpy_dtoh(ctx, gsi, gb.save_invstd, 4, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(gsi[0] == gsi[0] && same(CAPEX_F32, gy, y, 8, 1e-2f, &err), "BatchNorm: GPU invstd %g y[0] %g, CPU %g %g",
                 (double)gsi[0], (double)gy[0], (double)si[0], (double)y[0]);
        capex_cuda_free(ctx, gb.x); capex_cuda_free(ctx, gb.y); capex_cuda_free(ctx, gb.save_mean);
        capex_cuda_free(ctx, gb.save_invstd); capex_cuda_free(ctx, gb.workspace);
    }
    capex_cuda_context_destroy(ctx);
}

/* A large mean over a small spread (1e4 + 1e-2 * U(-1, 1) in f32) against float64 over the same
   inputs (test_norm's large_mean_small_noise_variance_vs_float64): LayerNorm rows (warp and block
   per row, vector and scalar loads) and BatchNorm channels (both layouts) give the mean within one
   f32 ulp and rstd / invstd and the unbiased running_var within 1e-4. Before 2026-11-28 the
   kernels' Welford ran on x itself: its mean stalls (d / n below half an ulp) and the lanes'
   merges round it, rstd up to ~4% off. */
static double d_mean(const float *x, int64_t n, int64_t stride) {
    double m = 0;
    int64_t i;
    for (i = 0; i < n; i++) m += x[i * stride];
    return m / (double)n;
}
static double d_var(const float *x, int64_t n, int64_t stride, double m) {
    double v = 0;
    int64_t i;
    for (i = 0; i < n; i++) v += ((double)x[i * stride] - m) * ((double)x[i * stride] - m);
    return v / (double)n;
}
CT_TEST(gpu_norm_large_mean_small_noise_vs_float64) {
    static const int64_t widths[] = {100, 1024, 4096, 4097, 65536};
    static const int64_t shapes[][2] = {{4096, 1}, {8, 4096}}; /* BatchNorm N, S */
    capex_cuda_context *ctx = open_ctx(ct);
    size_t k;
    int64_t i, r;
    if (!ctx) return;
    for (k = 0; k < sizeof widths / sizeof widths[0] && !ct->failed; k++) {
        const int64_t C = widths[k];
        float *x = (float *)malloc(8 * C), mean[2], rstd[2];
        capex_cuda_norm_args g;
        for (i = 0; i < 2 * C; i++) x[i] = (float)(1e4 + 1e-2 * rnd());
        capex_cuda_norm_args_init(&g);
        g.rows = 2; g.cols = C; g.x = up(ctx, x, 8 * C); g.y = up(ctx, NULL, 8 * C); g.mean = up(ctx, NULL, 8);
        g.rstd = up(ctx, NULL, 8);
        CT_CHECK(capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_memcpy_dtoh(ctx, mean, g.mean, 8, NULL);
        CT_CHECK(capex_cuda_memcpy_dtoh(ctx, rstd, g.rstd, 8, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (r = 0; r < 2; r++) {
            const double m = d_mean(x + r * C, C, 1), rs = 1.0 / sqrt(d_var(x + r * C, C, 1, m) + 1e-5);
            CT_CHECK(fabs(mean[r] - m) <= fabs(m) * 1.2e-7, "cols %lld: GPU mean %.9g, float64 %.9g", (long long)C,
                     (double)mean[r], m);
            CT_CHECK(fabs(rstd[r] - rs) <= 1e-4 * rs, "cols %lld: GPU rstd %.7g, float64 %.7g (rel %.3g)", (long long)C,
                     (double)rstd[r], rs, fabs(rstd[r] - rs) / rs);
        }
        capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.mean); capex_cuda_free(ctx, g.rstd);
        free(x);
    }
    for (k = 0; k < sizeof shapes / sizeof shapes[0] && !ct->failed; k++) {
        int lay;
        for (lay = 0; lay < 2 && !ct->failed; lay++) {
            const int64_t N = shapes[k][0], S = shapes[k][1], C = 2, T = N * C * S;
            float *x = (float *)malloc(4 * T), *xc = (float *)malloc(4 * N * S), sm[2], si[2], rm[2] = {0, 0}, rv[2] = {0, 0};
            capex_batch_norm_desc d;
            capex_cuda_batch_norm_args g;
            int64_t c, n, s;
            for (i = 0; i < T; i++) x[i] = (float)(1e4 + 1e-2 * rnd());
            capex_batch_norm_desc_init(&d);
            d.momentum = 1.0f; /* running_var = the unbiased batch variance */
            capex_cuda_batch_norm_args_init(&g);
            g.n = N; g.c = C; g.s = S; g.layout = (capex_bn_layout)lay; g.x = up(ctx, x, 4 * T); g.y = up(ctx, NULL, 4 * T);
            g.running_mean = up(ctx, rm, 8); g.running_var = up(ctx, rv, 8); g.save_mean = up(ctx, NULL, 8);
            g.save_invstd = up(ctx, NULL, 8); g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(C, 1));
            CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
            capex_cuda_memcpy_dtoh(ctx, sm, g.save_mean, 8, NULL); capex_cuda_memcpy_dtoh(ctx, si, g.save_invstd, 8, NULL);
            CT_CHECK(capex_cuda_memcpy_dtoh(ctx, rv, g.running_var, 8, NULL) == CAPEX_OK, "%s", capex_last_error());
            for (c = 0; c < C; c++) {
                double m, v, unb;
                for (n = 0; n < N; n++)
                    for (s = 0; s < S; s++) xc[n * S + s] = x[lay == CAPEX_BN_NSC ? (n * S + s) * C + c : (n * C + c) * S + s];
                m = d_mean(xc, N * S, 1); v = d_var(xc, N * S, 1, m); unb = v * (double)(N * S) / (double)(N * S - 1);
                CT_CHECK(fabs(sm[c] - m) <= fabs(m) * 1.2e-7, "BatchNorm N %lld S %lld layout %d: GPU mean %.9g, float64 %.9g",
                         (long long)N, (long long)S, lay, (double)sm[c], m);
                CT_CHECK(fabs(si[c] - 1.0 / sqrt(v + 1e-5)) <= 1e-4 / sqrt(v + 1e-5),
                         "BatchNorm N %lld S %lld layout %d: GPU invstd %.7g, float64 %.7g", (long long)N, (long long)S, lay,
                         (double)si[c], 1.0 / sqrt(v + 1e-5));
                CT_CHECK(fabs(rv[c] - unb) <= 1e-4 * unb, "BatchNorm N %lld S %lld layout %d: GPU running_var %.7g, float64 %.7g",
                         (long long)N, (long long)S, lay, (double)rv[c], unb);
            }
            capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.running_mean);
            capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
            capex_cuda_free(ctx, g.workspace);
            free(x); free(xc);
        }
    }
    capex_cuda_context_destroy(ctx);
}

/* Rows of 2^20 (vector loads) and 3*2^18+5 (scalar) nearly equal values (x
   f32, f16, bf16: 0.7 + noise; dy 0.9 + noise; weight 1 + 1e-3 noise), as
   test_norm's long_rows_sums_vs_float64: RMSNorm rstd and y, LayerNorm mean
   and rstd against float64, dx against float64 from the GPU's own saved mean
   and rstd (plus one rounding of a half dx). The bound is 8 ulp x log2(cols),
   4x the CPU's: each of a row's 256 threads sums cols/256 values in one f32
   chain before the warp tree, and with bf16 x (few distinct squares) that
   chain's rounding is systematic: RMSNorm rstd and y 9.4e-6 off at 2^20
   (f16 1e-6, f32 4e-8; the CPU 5e-8 with bf16). */
CT_TEST(gpu_norm_long_rows_vs_float64) {
    static const int64_t widths[] = {1 << 20, 3 * (1 << 18) + 5};
    capex_cuda_context *ctx = open_ctx(ct);
    static const capex_dtype dts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    size_t k, di;
    int rms;
    if (!ctx) return;
    for (k = 0; k < sizeof widths / sizeof widths[0] && !ct->failed; k++)
        for (di = 0; di < 3 * 2 && !ct->failed; di++) {
            const int64_t C = widths[k], R = 2, N = R * C;
            const capex_dtype xt = dts[di / 2];
            const size_t xs = capex_dtype_size(xt);
            const double spread = xt == CAPEX_F32 ? 1e-3 : 1e-2;
            const double half = xt == CAPEX_F32 ? 0.0 : xt == CAPEX_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
            const double tol = 8.0 * ldexp(1.0, -23) * log2((double)C);
            float *x = (float *)malloc(4 * N), *dy = (float *)malloc(4 * N), *w = (float *)malloc(4 * C);
            float *y = (float *)malloc(4 * N), *dx = (float *)malloc(4 * N), mean[2], rstd[2];
            void *xh_ = malloc(xs * N), *dxh = malloc(xs * N);
            double ey = 0, my = 0, edx = 0, mt = 0, mdx = 0;
            rms = (int)(di % 2);
            capex_cuda_norm_args g;
            int64_t i, r;
            for (i = 0; i < N; i++) {
                setv(xt, xh_, i, (float)(0.7 + spread * rnd()));
                x[i] = getv(xt, xh_, i); /* the values the GPU sees */
                dy[i] = (float)(0.9 + spread * rnd());
            }
            for (i = 0; i < C; i++) w[i] = (float)(1.0 + 1e-3 * rnd());
            capex_cuda_norm_args_init(&g);
            g.rows = R; g.cols = C; g.x_dtype = xt; /* y, dy f32: y unrounded */
            g.x = up(ctx, xh_, xs * N); g.dy = up(ctx, dy, 4 * N); g.weight = up(ctx, w, 4 * C);
            g.y = up(ctx, NULL, 4 * N); g.dx = up(ctx, NULL, xs * N); g.mean = up(ctx, NULL, 8); g.rstd = up(ctx, NULL, 8);
            CT_CHECK((rms ? capex_cuda_rms_norm_forward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL)) ==
                     CAPEX_OK, "%s", capex_last_error());
            CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL)) ==
                     CAPEX_OK, "%s", capex_last_error());
            capex_cuda_memcpy_dtoh(ctx, y, g.y, 4 * N, NULL); capex_cuda_memcpy_dtoh(ctx, dxh, g.dx, xs * N, NULL);
            for (i = 0; i < N; i++) dx[i] = getv(xt, dxh, i);
            capex_cuda_memcpy_dtoh(ctx, mean, g.mean, 8, NULL);
            CT_CHECK(capex_cuda_memcpy_dtoh(ctx, rstd, g.rstd, 8, NULL) == CAPEX_OK, "%s", capex_last_error());
            for (r = 0; r < R && !ct->failed; r++) {
                const float *xr = x + r * C, *dr = dy + r * C;
                const double m = rms ? 0.0 : d_mean(xr, C, 1), v = rms ? d_var(xr, C, 1, 0.0) : d_var(xr, C, 1, m);
                const double rs = 1.0 / sqrt(v + 1e-5), gm = rms ? 0.0 : (double)mean[r], grs = (double)rstd[r];
                double mg = 0, mgx = 0;
                CT_CHECK(fabs(rstd[r] - rs) <= tol * rs, "rms=%d x dtype %d cols %lld: GPU rstd %.9g, float64 %.9g (rel %.3g, tol %.3g)", rms,
                         xt, (long long)C, (double)rstd[r], rs, fabs(rstd[r] - rs) / rs, tol);
                CT_CHECK(rms || fabs(mean[r] - m) <= tol * fabs(m), "cols %lld: GPU mean %.9g, float64 %.9g", (long long)C,
                         (double)mean[r], m);
                for (i = 0; i < C; i++) {
                    const double gi = (double)dr[i] * w[i], xh = ((double)xr[i] - gm) * grs;
                    const double yr = ((double)xr[i] - m) * rs * w[i];
                    if (fabs(yr) > my) my = fabs(yr);
                    if (rms && fabs(y[r * C + i] - yr) > ey) ey = fabs(y[r * C + i] - yr);
                    mg += gi; mgx += gi * xh;
                }
                mg = rms ? 0.0 : mg / (double)C; mgx /= (double)C;
                for (i = 0; i < C; i++) {
                    const double gi = (double)dr[i] * w[i], xh = ((double)xr[i] - gm) * grs;
                    const double want = grs * (gi - mg - xh * mgx), e = fabs(dx[r * C + i] - want);
                    if (e > edx) edx = e;
                    if (fabs(want) > mdx) mdx = fabs(want);
                    if (grs * fabs(gi) > mt) mt = grs * fabs(gi);
                }
            }
            CT_CHECK(ey <= tol * my, "rms cols %lld: GPU y off by %.3g of its size (tol %.3g)", (long long)C, ey / my, tol);
            CT_CHECK(edx <= 2.0 * tol * mt + half * mdx, "rms=%d cols %lld x dtype %d: GPU dx off by %.3g of its terms (tol %.3g)",
                     rms, (long long)C, xt, edx / mt, 2.0 * tol + half * mdx / mt);
            capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.y);
            capex_cuda_free(ctx, g.dx); capex_cuda_free(ctx, g.mean); capex_cuda_free(ctx, g.rstd);
            free(x); free(dy); free(w); free(y); free(dx); free(xh_); free(dxh);
        }
    capex_cuda_context_destroy(ctx);
}

/* SyncBatchNorm over a world of 2-3 ranks on the stand-in NCCL (each rank a
   process with its own emulator context, device buffers, comm->stream): each
   rank's y, dx and running statistics equal the CPU's BatchNorm of the whole
   (concatenated) batch, its dweight/dbias are its own share (float64 from the
   global statistics), in both layouts, with unequal and empty ranks. A global
   batch of one value is not refused on the GPU (capex_cuda.h): running_var
   becomes NaN (torch's 0/0), running_mean moves as usual. */
typedef struct syncbn_job { int lay, world, nb[4]; int64_t S; } syncbn_job;
#define SBN_C 3
static float sbn_x(int64_t n, int64_t c, int64_t s) { return (float)sin(0.37 * (double)(n * 31 + c * 7 + s)) * 2.0f + (float)c; }
static int syncbn_body(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    const syncbn_job *j = (const syncbn_job *)user;
    const int64_t C = SBN_C, S = j->S;
    int64_t N = 0, off = 0, L, i, n, c, s, tr = 0, gtr = 0;
    float *xa, *ya, *dya, *dxa, *gy, *gdx, w[SBN_C], b[SBN_C], rm[SBN_C], rv[SBN_C], grm[SBN_C], grv[SBN_C], sm[SBN_C], si[SBN_C];
    float gdw[SBN_C], gdb[SBN_C];
    double sdy[SBN_C] = {0}, sdyx[SBN_C] = {0};
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    capex_cuda_batch_norm_args g;
    capex_result rc, rg;
    int bad = 0;
    for (i = 0; i < world; i++) { if (i < rank) off += j->nb[i]; N += j->nb[i]; }
    L = j->nb[rank] * C * S;
    xa = malloc(4 * (size_t)(N * C * S + 1)); ya = malloc(4 * (size_t)(N * C * S + 1));
    dya = malloc(4 * (size_t)(N * C * S + 1)); dxa = malloc(4 * (size_t)(N * C * S + 1));
    gy = malloc(4 * (size_t)(L + 1)); gdx = malloc(4 * (size_t)(L + 1));
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++)
            for (s = 0; s < S; s++) {
                int64_t k = j->lay ? (n * S + s) * C + c : (n * C + c) * S + s;
                xa[k] = sbn_x(n, c, s); dya[k] = (float)cos(0.11 * (double)k);
            }
    for (c = 0; c < C; c++) { w[c] = 1 + 0.1f * (float)c; b[c] = 0.5f * (float)c; rm[c] = grm[c] = 0.2f; rv[c] = grv[c] = 1.5f; }
    capex_batch_norm_desc_init(&d);
    capex_batch_norm_args_init(&a);
    a.n = N; a.c = C; a.s = S; a.layout = (capex_bn_layout)j->lay; a.x = xa; a.y = ya; a.weight = w; a.bias = b;
    a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si; a.num_batches_tracked = &tr;
    a.dy = dya; a.dx = dxa;
    rc = capex_batch_norm_forward(&d, NULL, &a);
    if (rc == CAPEX_OK) rc = capex_batch_norm_backward(&d, NULL, &a);
    capex_cuda_batch_norm_args_init(&g);
    g.n = j->nb[rank]; g.c = C; g.s = S; g.layout = (capex_bn_layout)j->lay;
    g.x = up(ctx, xa + off * C * S, 4 * (size_t)L); g.dy = up(ctx, dya + off * C * S, 4 * (size_t)L);
    g.y = up(ctx, NULL, 4 * (size_t)L); g.dx = up(ctx, NULL, 4 * (size_t)L); g.weight = up(ctx, w, sizeof w);
    g.bias = up(ctx, b, sizeof b); g.running_mean = up(ctx, grm, sizeof grm); g.running_var = up(ctx, grv, sizeof grv);
    g.save_mean = up(ctx, NULL, 4 * C); g.save_invstd = up(ctx, NULL, 4 * C); g.dweight = up(ctx, NULL, 4 * C);
    g.dbias = up(ctx, NULL, 4 * C); g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(C, world));
    g.num_batches_tracked = &gtr;
    rg = capex_cuda_batch_norm_forward(ctx, &d, comm, &g, comm->stream);
    if (rg == CAPEX_OK) rg = capex_cuda_batch_norm_backward(ctx, &d, comm, &g, comm->stream);
    if (rg == CAPEX_OK) rg = capex_cuda_context_synchronize(ctx);
    if (rg != CAPEX_OK) { fprintf(stderr, "rank %d: GPU: %s\n", rank, capex_last_error()); return 1; }
    capex_cuda_memcpy_dtoh(ctx, gy, g.y, 4 * (size_t)L, NULL); capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, 4 * (size_t)L, NULL);
    capex_cuda_memcpy_dtoh(ctx, grm, g.running_mean, sizeof grm, NULL); capex_cuda_memcpy_dtoh(ctx, grv, g.running_var, sizeof grv, NULL);
    capex_cuda_memcpy_dtoh(ctx, gdw, g.dweight, sizeof gdw, NULL); capex_cuda_memcpy_dtoh(ctx, gdb, g.dbias, sizeof gdb, NULL);
    if (gtr != 1) { fprintf(stderr, "rank %d: num_batches_tracked %lld\n", rank, (long long)gtr); bad = 1; }
    if (N * S < 2) { /* the CPU refuses; the GPU's documented result */
        if (rc == CAPEX_OK) { fprintf(stderr, "rank %d: the CPU took %lld values\n", rank, (long long)(N * S)); bad = 1; }
        for (c = 0; c < C; c++)
            if (grv[c] == grv[c] || fabsf(grm[c] - (0.9f * 0.2f + 0.1f * sbn_x(0, c, 0))) > 1e-6f) {
                fprintf(stderr, "rank %d: running stats %g %g for one value\n", rank, (double)grm[c], (double)grv[c]);
                bad = 1;
            }
        return bad;
    }
    if (rc != CAPEX_OK) { fprintf(stderr, "rank %d: CPU: %s\n", rank, capex_last_error()); return 1; }
    for (i = 0; i < L; i++) {
        const int64_t k = off * C * S + i, ch = j->lay ? i % C : (i / S) % C;
        if (!(fabsf(gy[i] - ya[k]) <= 1e-5f * (1 + fabsf(ya[k]))) || !(fabsf(gdx[i] - dxa[k]) <= 1e-5f * (1 + fabsf(dxa[k])))) {
            fprintf(stderr, "rank %d: y[%lld] %g vs %g, dx %g vs %g\n", rank, (long long)i, (double)gy[i], (double)ya[k],
                    (double)gdx[i], (double)dxa[k]);
            return 1;
        }
        sdy[ch] += dya[k];
        sdyx[ch] += (double)dya[k] * ((double)xa[k] - sm[ch]) * si[ch];
    }
    for (c = 0; c < C; c++)
        if (!(fabsf(grm[c] - rm[c]) <= 1e-6f && fabsf(grv[c] - rv[c]) <= 1e-5f * rv[c]) || !(fabs(gdw[c] - sdyx[c]) <= 1e-4 * (1 + fabs(sdyx[c]))) ||
            !(fabs(gdb[c] - sdy[c]) <= 1e-4 * (1 + fabs(sdy[c])))) {
            fprintf(stderr, "rank %d ch %lld: running %g %g vs %g %g, dweight %g vs %g, dbias %g vs %g\n", rank, (long long)c,
                    (double)grm[c], (double)grv[c], (double)rm[c], (double)rv[c], (double)gdw[c], sdyx[c], (double)gdb[c], sdy[c]);
            bad = 1;
        }
    return bad;
}
/* arg: "layout S nb0 nb1 [nb2]" */
static void child_syncbn(const char *arg, child_result *res) {
    syncbn_job j;
    int codes[16] = {0}, q, got;
    long long S = 1;
    memset(&j, 0, sizeof j);
    setenv("FAKE_NCCL_TIMEOUT", "120", 1); /* a stuck rank fails instead of hanging */
    got = arg ? sscanf(arg, "%d %lld %d %d %d", &j.lay, &S, &j.nb[0], &j.nb[1], &j.nb[2]) : 0;
    if (got < 4) { res->code = 2; return; }
    j.S = S; j.world = got - 2;
    res->code = nccl_world_run(j.world, syncbn_body, &j, codes) ? 1 : 0;
    for (q = 1; q < j.world; q++) if (codes[q]) res->code = 1;
    snprintf(res->message, sizeof res->message, "world of %d (%s): a rank failed; its stderr says why", j.world, arg);
}
CT_TEST(gpu_sync_batch_norm_world_matches_cpu_whole_batch) {
    static const char *runs[] = {"0 5 3 2", "1 5 3 2", "0 4 2 0 3", "1 1 1 0 2", "0 1 1 0"};
    const char *np = getenv("CAPEX_NCCL_PATH"), *lp = getenv("CAPEX_LIBCUDA_PATH");
    size_t k;
    if (!np || !strstr(np, "fake")) CT_SKIP("several ranks need a GPU each; the stand-in NCCL runs them on the emulator");
    if (!lp || strstr(lp, "fake")) CT_SKIP("kernels need the emulator driver (CAPEX_LIBCUDA_PATH)");
    for (k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        child_result r = run_child("syncbn", runs[k]);
        CT_CHECK(r.exited_ok && r.code == 0, "%s: %s (code %d)", runs[k], r.message, r.code);
    }
}

/* SyncBatchNorm of a large mean and a small spread over 2 ranks of the
   stand-in NCCL (test_norm's sync_batch_norm_large_mean_vs_float64 on the
   GPU): channel means 1e3 to 1e5, std 1, rank 1 shifted by 2.5, 3 and 4
   rows, both layouts; save_invstd and running_var within 1e-6 relative of
   float64 over the whole batch, save_mean within its f32 rounding plus 1e-6
   std, and invstd within 1e-6 of the CPU's BatchNorm of the whole batch.
   With each rank's mean sent as one f32 invstd was 1.2e-5 off at 1e3 and
   1.1e-3 at 1e5. */
enum { LM_C = 4, LM_S = 5, LM_N0 = 3, LM_N = 7 };
static int syncbn_large_mean_rank(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    static const double mu[LM_C] = {1e3, -1e3, 3.0e4, 1e5};
    static float x[LM_N * LM_C * LM_S], y[LM_N * LM_C * LM_S];
    const int64_t n0 = rank ? LM_N0 : 0, nr = rank ? LM_N - LM_N0 : LM_N0, per = LM_C * LM_S;
    float sm[LM_C], si[LM_C], rm[LM_C], rv[LM_C], csm[LM_C], csi[LM_C], crm[LM_C], crv[LM_C];
    int64_t n, c, s;
    int lay, bad = 0;
    (void)user;
    if (world != 2) return 40;
    for (lay = 0; lay < 2; lay++) {
        capex_batch_norm_desc d;
        capex_batch_norm_args a;
        capex_cuda_batch_norm_args g;
        double rmean[LM_C], rvar[LM_C];
        for (n = 0; n < LM_N; n++)
            for (c = 0; c < LM_C; c++)
                for (s = 0; s < LM_S; s++)
                    x[lay ? (n * LM_S + s) * LM_C + c : (n * LM_C + c) * LM_S + s] =
                        (float)(mu[c] + (n >= LM_N0 ? 2.5 : 0.0) + 1.7 * (double)rnd());
        for (c = 0; c < LM_C; c++) {
            double m = 0.0, v = 0.0;
            for (n = 0; n < LM_N; n++) for (s = 0; s < LM_S; s++) m += x[lay ? (n * LM_S + s) * LM_C + c : (n * LM_C + c) * LM_S + s];
            m /= (double)(LM_N * LM_S);
            for (n = 0; n < LM_N; n++)
                for (s = 0; s < LM_S; s++) {
                    double dd = x[lay ? (n * LM_S + s) * LM_C + c : (n * LM_C + c) * LM_S + s] - m;
                    v += dd * dd;
                }
            rmean[c] = m; rvar[c] = v / (double)(LM_N * LM_S);
            rm[c] = crm[c] = 0.0f; rv[c] = crv[c] = 1.0f;
        }
        capex_batch_norm_desc_init(&d);
        capex_batch_norm_args_init(&a); /* the CPU, the whole batch in one process */
        a.n = LM_N; a.c = LM_C; a.s = LM_S; a.layout = (capex_bn_layout)lay; a.x = x; a.y = y;
        a.running_mean = crm; a.running_var = crv; a.save_mean = csm; a.save_invstd = csi;
        if (capex_batch_norm_forward(&d, NULL, &a) != CAPEX_OK) return 41;
        capex_cuda_batch_norm_args_init(&g);
        g.n = nr; g.c = LM_C; g.s = LM_S; g.layout = (capex_bn_layout)lay;
        g.x = up(ctx, x + n0 * per, (size_t)(nr * per) * 4); g.y = up(ctx, NULL, (size_t)(nr * per) * 4);
        g.running_mean = up(ctx, rm, sizeof rm); g.running_var = up(ctx, rv, sizeof rv);
        g.save_mean = up(ctx, NULL, sizeof sm); g.save_invstd = up(ctx, NULL, sizeof si);
        g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(LM_C, world));
        if (capex_cuda_batch_norm_forward(ctx, &d, comm, &g, comm->stream) != CAPEX_OK ||
            capex_cuda_context_synchronize(ctx) != CAPEX_OK)
            return 42;
        capex_cuda_memcpy_dtoh(ctx, sm, g.save_mean, sizeof sm, NULL); capex_cuda_memcpy_dtoh(ctx, si, g.save_invstd, sizeof si, NULL);
        capex_cuda_memcpy_dtoh(ctx, rm, g.running_mean, sizeof rm, NULL); capex_cuda_memcpy_dtoh(ctx, rv, g.running_var, sizeof rv, NULL);
        for (c = 0; c < LM_C; c++) {
            const double is = 1.0 / sqrt(rvar[c] + 1e-5), sd = sqrt(rvar[c]);
            const double uv = rvar[c] * (double)(LM_N * LM_S) / (double)(LM_N * LM_S - 1), rvw = 0.9 + 0.1 * uv;
            if (!(fabs(si[c] - is) <= 1e-6 * is) || !(fabs(si[c] - csi[c]) <= 1e-6 * is) ||
                !(fabs(sm[c] - rmean[c]) <= fabs(rmean[c]) * 0x1p-24 + 1e-6 * sd) || !(fabs(rv[c] - rvw) <= 1e-6 * rvw) ||
                !(fabs(rm[c] - 0.1 * rmean[c]) <= fabs(rmean[c]) * 0x1p-23 + 1e-6 * sd)) {
                fprintf(stderr, "rank %d layout %d ch %d (mean %g): invstd %.9g, float64 %.9g (%.2e relative), CPU %.9g; "
                        "mean %.9g vs %.9g; running %.9g %.9g vs %.9g %.9g\n", rank, lay, (int)c, mu[c], (double)si[c], is,
                        fabs(si[c] / is - 1.0), (double)csi[c], (double)sm[c], rmean[c], (double)rm[c], (double)rv[c],
                        0.1 * rmean[c], rvw);
                bad = 43;
            }
        }
        capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.running_mean);
        capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
        capex_cuda_free(ctx, g.workspace);
    }
    return bad;
}
static void child_syncbn_large_mean(const char *arg, child_result *res) { (void)arg; nccl_world2_child(syncbn_large_mean_rank, res); }
CT_TEST(gpu_sync_batch_norm_large_mean_vs_float64) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("syncbn_large_mean", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* The same SyncBatchNorm over a host comm (TCP, forked ranks, each with its
   own emulator context): the statistics go through host staging (a stream
   synchronisation per collective), the documented path for MPI/TCP comms,
   never run before 2026-11-28. Same checks as above. */
static syncbn_job g_tcp_job;
static int syncbn_tcp_rank(int rank, int world, int port, int mode) {
    capex_cuda_context *ctx = NULL;
    capex_dist_env env;
    capex_comm c;
    int r;
    (void)mode;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "syncbn-tcp");
    if (capex_cuda_context_create(NULL, &ctx) != CAPEX_OK) { fprintf(stderr, "rank %d: %s\n", rank, capex_last_error()); return 1; }
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) {
        fprintf(stderr, "rank %d: TCP comm: %s\n", rank, capex_last_error());
        capex_cuda_context_destroy(ctx);
        return 1;
    }
    r = c.device_buffers ? 2 : syncbn_body(ctx, &c, rank, world, &g_tcp_job);
    capex_comm_destroy(&c);
    capex_cuda_context_destroy(ctx);
    return r;
}
static void child_syncbn_tcp(const char *arg, child_result *res) {
    int codes[8] = {0}, q, got;
    long long S = 1;
    memset(&g_tcp_job, 0, sizeof g_tcp_job);
    got = arg ? sscanf(arg, "%d %lld %d %d %d", &g_tcp_job.lay, &S, &g_tcp_job.nb[0], &g_tcp_job.nb[1], &g_tcp_job.nb[2]) : 0;
    if (got < 4) { res->code = 2; return; }
    g_tcp_job.S = S; g_tcp_job.world = got - 2;
    res->code = fork_world(g_tcp_job.world, 0, codes, syncbn_tcp_rank) ? 1 : 0;
    for (q = 1; q < g_tcp_job.world; q++) if (codes[q]) res->code = 1;
    snprintf(res->message, sizeof res->message, "TCP world of %d (%s): a rank failed; its stderr says why", g_tcp_job.world, arg);
}
CT_TEST(gpu_sync_batch_norm_host_comm_matches_cpu_whole_batch) {
    static const char *runs[] = {"0 5 3 2", "1 5 3 2", "0 4 2 0 3"};
    const char *lp = getenv("CAPEX_LIBCUDA_PATH");
    capex_cuda_context *ctx;
    size_t k;
    if (lp && strstr(lp, "fake")) CT_SKIP("kernels need the emulator driver or a GPU");
    if (!(ctx = open_ctx(ct))) return; /* skips without a GPU */
    capex_cuda_context_destroy(ctx);
    for (k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        child_result r = run_child("syncbn_tcp", runs[k]);
        CT_CHECK(r.exited_ok && r.code == 0, "%s: %s (code %d)", runs[k], r.message, r.code);
    }
}

/* Checked before any driver call: no GPU needed. */
/* Zero rows: backward still writes dweight and dbias, as zeros (the CPU's
   rule, test_norm's norm_backward_zero_rows_writes_zero_param_grads). */
CT_TEST(gpu_norm_backward_zero_rows_writes_zero_param_grads) {
    static const capex_dtype pts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    capex_cuda_context *ctx = open_ctx(ct);
    unsigned char hw[4 * 5], hb[4 * 5];
    int rms, k, i;
    if (!ctx) return;
    for (rms = 0; rms < 2; rms++)
        for (k = 0; k < 3; k++) {
            capex_cuda_norm_args g;
            size_t ps = capex_dtype_size(pts[k]);
            capex_cuda_norm_args_init(&g);
            g.rows = 0; g.cols = 5; g.x_dtype = CAPEX_F32; g.y_dtype = CAPEX_F32; g.param_dtype = pts[k];
            g.weight = up(ctx, NULL, 5 * ps); g.dweight = up(ctx, NULL, 5 * ps); /* poisoned */
            g.dbias = rms ? 0 : up(ctx, NULL, 5 * ps);
            CT_CHECK((rms ? capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_backward(ctx, NULL, &g, NULL)) ==
                     CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
            capex_cuda_memcpy_dtoh(ctx, hw, g.dweight, 5 * ps, NULL);
            if (!rms) capex_cuda_memcpy_dtoh(ctx, hb, g.dbias, 5 * ps, NULL);
            for (i = 0; i < 5; i++) {
                CT_CHECK(getv(pts[k], hw, i) == 0.0f, "rms=%d pt=%d: dweight[%d] = %g, want 0", rms, (int)pts[k], i,
                         (double)getv(pts[k], hw, i));
                CT_CHECK(rms || getv(pts[k], hb, i) == 0.0f, "pt=%d: dbias[%d] = %g, want 0", (int)pts[k], i,
                         (double)getv(pts[k], hb, i));
            }
            capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.dweight); capex_cuda_free(ctx, g.dbias);
        }
    capex_cuda_context_destroy(ctx);
}

CT_TEST(gpu_norm_argument_errors) {
    capex_cuda_norm_args g;
    capex_cuda_batch_norm_args b;
    capex_cuda_norm_args_init(&g);
    g.rows = 2; g.cols = 0;
    CT_CHECK(capex_cuda_layer_norm_forward(NULL, NULL, &g, NULL) == CAPEX_ERR_INVALID_ARG, "NULL ctx");
    CT_CHECK(strstr(capex_last_error(), "ctx is NULL"), "%s", capex_last_error());
    CT_CHECK(capex_cuda_norm_workspace_bytes(100, 8) == 2u * 2u * 8u * 4u, "workspace %zu", capex_cuda_norm_workspace_bytes(100, 8));
    CT_CHECK(capex_cuda_norm_workspace_bytes(1, 0) == 0, "bad shape: 0 bytes");
    CT_CHECK(capex_cuda_batch_norm_workspace_bytes(4, 2) == 8u + 4u * (14u + 28u + 8u), "bn workspace");
    /* sizes past size_t are 0 (a bad shape), not the few bytes the product wraps to */
    CT_CHECK(capex_cuda_norm_workspace_bytes(65, ((int64_t)1 << 60) + 1) == 0, "norm workspace wraps to %zu",
             capex_cuda_norm_workspace_bytes(65, ((int64_t)1 << 60) + 1));
    CT_CHECK(capex_cuda_batch_norm_workspace_bytes((int64_t)1 << 61, 1) == 0, "bn workspace wraps to %zu",
             capex_cuda_batch_norm_workspace_bytes((int64_t)1 << 61, 1));
    CT_CHECK(capex_cuda_batch_norm_workspace_bytes(((int64_t)1 << 31) - 1, 0x7fffffff) == 0,
             "bn workspace (world) wraps to %zu", capex_cuda_batch_norm_workspace_bytes(((int64_t)1 << 31) - 1, 0x7fffffff));
    capex_cuda_batch_norm_args_init(&b);
    CT_CHECK(capex_cuda_batch_norm_forward(NULL, NULL, NULL, &b, NULL) == CAPEX_ERR_INVALID_ARG, "NULL ctx");
}

/* LayerNorm forward counts a thread's values in a float, exact up to 2^24 of
   them: a row of over 2^32 columns is refused before anything is launched
   (the pointers are never dereferenced). */
CT_TEST(gpu_layer_norm_refuses_rows_over_2p32_columns) {
    capex_cuda_context *ctx = open_ctx(ct);
    capex_cuda_norm_args g;
    if (!ctx) return;
    capex_cuda_norm_args_init(&g);
    g.rows = 1;
    g.cols = ((int64_t)1 << 32) + 4;
    g.x = (capex_cuda_ptr)0x100000000000ull;
    g.y = (capex_cuda_ptr)0x200000000000ull;
    CT_CHECK(capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL) == CAPEX_ERR_LIMIT, "%s", capex_last_error());
    CT_CHECK(strstr(capex_last_error(), "at most 2^32"), "%s", capex_last_error());
    capex_cuda_context_destroy(ctx);
}

/* Backward with dweight: a row too long for the partial-sums grid is refused
   before dx is launched, not after (the pointers are never dereferenced; a
   launch with them faults the context, which the sync then reports). */
CT_TEST(gpu_norm_backward_refuses_long_rows_before_dx) {
    capex_cuda_context *ctx = open_ctx(ct);
    capex_cuda_norm_args g;
    capex_result r;
    if (!ctx) return;
    capex_cuda_norm_args_init(&g);
    g.rows = 1;
    g.cols = ((int64_t)1 << 42) + 1; /* 2^34 blocks of 256 for the dweight partials */
    /* 2^45 apart: disjoint (x, dy, dx, weight, dweight are 2^44 + 4 bytes, the workspace 2^45 + 8) */
    g.x = (capex_cuda_ptr)0x100000000000ull; g.dy = (capex_cuda_ptr)0x300000000000ull;
    g.mean = (capex_cuda_ptr)0x500000000000ull; g.rstd = (capex_cuda_ptr)0x500000001000ull;
    g.weight = (capex_cuda_ptr)0x700000000000ull; g.dweight = (capex_cuda_ptr)0x900000000000ull;
    g.dx = (capex_cuda_ptr)0xb00000000000ull; g.workspace = (capex_cuda_ptr)0xd00000000000ull;
    r = capex_cuda_rms_norm_backward(ctx, NULL, &g, NULL);
    CT_CHECK(r == CAPEX_ERR_LIMIT && strstr(capex_last_error(), "too many columns"), "%s: %s", capex_result_string(r),
             capex_last_error());
    r = capex_cuda_context_synchronize(ctx);
    CT_CHECK(r == CAPEX_OK, "dx was launched before the refusal: %s", capex_last_error());
    capex_cuda_context_destroy(ctx);
}

/* SyncBatchNorm over an NCCL comm of 2 ranks with 3 and 4 rows: x, dy and
   the parameters are written on the comm's user stream (uploads queued
   there), the calls run on comm->stream as documented, y, dx and the
   running statistics are read back on the user stream. Each rank's slice
   of y and dx, and the statistics, against BatchNorm on the whole batch on
   the CPU. Under CAPEX_EMU_STREAMS=lazy a missing order between the two
   streams reads the poisoned buffers. Then training on the user stream is
   refused (its collective runs on comm->stream), and eval with running
   statistics (no collective) runs on the user stream and matches the CPU's
   eval. Seen failing: eval was refused off comm->stream too. */
enum { SB_C = 3, SB_S = 5, SB_N = 7 };
static int syncbn_rank(capex_cuda_context *ctx, capex_comm *comm, int rank, int world, void *user) {
    static const int64_t rows[2] = {3, 4};
    const int64_t n0 = rank ? rows[0] : 0, nr = rows[rank], per = SB_C * SB_S;
    static float x[SB_N * SB_C * SB_S], dy[SB_N * SB_C * SB_S], y[SB_N * SB_C * SB_S], dx[SB_N * SB_C * SB_S];
    static float gy[SB_N * SB_C * SB_S], gdx[SB_N * SB_C * SB_S];
    float w[SB_C], b[SB_C], rm[SB_C], rv[SB_C], grm[SB_C], grv[SB_C], sm[SB_C], si[SB_C], err;
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    capex_cuda_batch_norm_args g;
    capex_cuda_stream st = NULL;
    int64_t i;
    (void)user;
    if (world != 2) return 40;
    for (i = 0; i < SB_N * per; i++) { x[i] = 2.0f + 3.0f * rnd(); dy[i] = rnd(); }
    for (i = 0; i < SB_C; i++) { w[i] = 1.0f + 0.5f * rnd(); b[i] = rnd(); rm[i] = grm[i] = 0.1f * rnd(); rv[i] = grv[i] = 1.0f + 0.5f * rnd(); }
    capex_batch_norm_desc_init(&d);
    d.training = 1;
    capex_batch_norm_args_init(&a);
    a.n = SB_N; a.c = SB_C; a.s = SB_S; a.layout = CAPEX_BN_NCS; a.x_dtype = a.y_dtype = CAPEX_F32;
    a.x = x; a.y = y; a.weight = w; a.bias = b; a.running_mean = rm; a.running_var = rv; a.save_mean = sm;
    a.save_invstd = si; a.dy = dy; a.dx = dx;
    if (capex_batch_norm_forward(&d, NULL, &a) != CAPEX_OK || capex_batch_norm_backward(&d, NULL, &a) != CAPEX_OK) return 41;
    if (capex_cuda_stream_create(ctx, &st) != CAPEX_OK || capex_nccl_set_user_stream(comm, st) != CAPEX_OK) return 42;
    capex_cuda_batch_norm_args_init(&g);
    g.n = nr; g.c = SB_C; g.s = SB_S; g.layout = CAPEX_BN_NCS; g.x_dtype = g.y_dtype = CAPEX_F32;
    g.x = up(ctx, NULL, (size_t)(nr * per) * 4); g.dy = up(ctx, NULL, (size_t)(nr * per) * 4);
    g.y = up(ctx, NULL, (size_t)(nr * per) * 4); g.dx = up(ctx, NULL, (size_t)(nr * per) * 4);
    g.weight = up(ctx, NULL, SB_C * 4); g.bias = up(ctx, NULL, SB_C * 4); g.running_mean = up(ctx, NULL, SB_C * 4);
    g.running_var = up(ctx, NULL, SB_C * 4); g.save_mean = up(ctx, NULL, SB_C * 4); g.save_invstd = up(ctx, NULL, SB_C * 4);
    g.workspace = up(ctx, NULL, capex_cuda_batch_norm_workspace_bytes(SB_C, world));
    /* the model's work: on the user stream, not waited for here */
    if (capex_cuda_memcpy_htod(ctx, g.x, x + n0 * per, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, g.dy, dy + n0 * per, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, g.weight, w, sizeof w, st) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, g.bias, b, sizeof b, st) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, g.running_mean, grm, sizeof grm, st) != CAPEX_OK ||
        capex_cuda_memcpy_htod(ctx, g.running_var, grv, sizeof grv, st) != CAPEX_OK) return 43;
    if (capex_cuda_batch_norm_forward(ctx, &d, comm, &g, comm->stream) != CAPEX_OK) return 44;
    if (capex_cuda_batch_norm_backward(ctx, &d, comm, &g, comm->stream) != CAPEX_OK) return 45;
    if (capex_cuda_memcpy_dtoh(ctx, gy, g.y, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(ctx, grm, g.running_mean, sizeof grm, st) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(ctx, grv, g.running_var, sizeof grv, st) != CAPEX_OK ||
        capex_cuda_stream_synchronize(ctx, st) != CAPEX_OK) return 46;
    if (!same(CAPEX_F32, gy, y + n0 * per, nr * per, 1e-4f, &err)) { fprintf(stderr, "rank %d: y err %g\n", rank, err); return 47; }
    if (!same(CAPEX_F32, gdx, dx + n0 * per, nr * per, 5e-4f, &err)) { fprintf(stderr, "rank %d: dx err %g\n", rank, err); return 48; }
    if (!same(CAPEX_F32, grm, rm, SB_C, 1e-5f, &err) || !same(CAPEX_F32, grv, rv, SB_C, 1e-5f, &err)) {
        fprintf(stderr, "rank %d: running statistics err %g\n", rank, err);
        return 49;
    }
    /* training on another stream is refused (the collective orders work on comm->stream);
       eval with running statistics has no collective: the user's stream is fine */
    if (capex_cuda_batch_norm_forward(ctx, &d, comm, &g, st) != CAPEX_ERR_INVALID_ARG || !strstr(capex_last_error(), "comm->stream"))
        return 51;
    d.training = 0;
    if (capex_batch_norm_forward(&d, NULL, &a) != CAPEX_OK || capex_batch_norm_backward(&d, NULL, &a) != CAPEX_OK) return 52;
    if (capex_cuda_batch_norm_forward(ctx, &d, comm, &g, st) != CAPEX_OK ||
        capex_cuda_batch_norm_backward(ctx, &d, comm, &g, st) != CAPEX_OK) {
        fprintf(stderr, "rank %d: eval with running statistics on the user stream: %s\n", rank, capex_last_error());
        return 53;
    }
    if (capex_cuda_memcpy_dtoh(ctx, gy, g.y, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_memcpy_dtoh(ctx, gdx, g.dx, (size_t)(nr * per) * 4, st) != CAPEX_OK ||
        capex_cuda_stream_synchronize(ctx, st) != CAPEX_OK) return 54;
    if (!same(CAPEX_F32, gy, y + n0 * per, nr * per, 1e-4f, &err) || !same(CAPEX_F32, gdx, dx + n0 * per, nr * per, 1e-4f, &err)) {
        fprintf(stderr, "rank %d: eval y/dx err %g\n", rank, err);
        return 55;
    }
    if (capex_cuda_context_synchronize(ctx) != CAPEX_OK) return 50;
    capex_cuda_free(ctx, g.x); capex_cuda_free(ctx, g.dy); capex_cuda_free(ctx, g.y); capex_cuda_free(ctx, g.dx);
    capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias); capex_cuda_free(ctx, g.running_mean);
    capex_cuda_free(ctx, g.running_var); capex_cuda_free(ctx, g.save_mean); capex_cuda_free(ctx, g.save_invstd);
    capex_cuda_free(ctx, g.workspace);
    capex_nccl_set_user_stream(comm, NULL);
    capex_cuda_stream_destroy(ctx, st);
    return 0;
}
static void child_syncbn_stream(const char *arg, child_result *res) { (void)arg; nccl_world2_child(syncbn_rank, res); }
CT_TEST(gpu_sync_batch_norm_nccl_world2_orders_user_stream) {
    child_result r;
    const char *why = nccl_world_skip_reason();
    if (why) CT_SKIP("%s", why);
    r = run_child("syncbn_stream", NULL);
    CT_CHECK(r.exited_ok && r.code == 0, "%s", r.message);
}

/* ---- aliasing (capex.h Norms: the aliasing rule), on device pointers ----
   As test_norm's norm_overlapping_outputs_refused_before_writing, plus the
   workspace (an output here): every forbidden overlap is refused with both
   names before anything is launched (the arena's bytes are unchanged after a
   synchronisation). */
#define GAL_REG 128
enum { GL_X, GL_W, GL_B, GL_Y, GL_MEAN, GL_RSTD, GL_DY, GL_DX, GL_DW, GL_DB, GL_WS, GL_NSLOT };
static const char *const gl_names[GL_NSLOT] = {"x", "weight", "bias", "y", "mean", "rstd", "dy", "dx", "dweight", "dbias",
                                               "workspace"};
static void gl_set(capex_cuda_norm_args *a, int s, capex_cuda_ptr p) {
    switch (s) {
    case GL_X: a->x = p; break;        case GL_W: a->weight = p; break;   case GL_B: a->bias = p; break;
    case GL_Y: a->y = p; break;        case GL_MEAN: a->mean = p; break;  case GL_RSTD: a->rstd = p; break;
    case GL_DY: a->dy = p; break;      case GL_DX: a->dx = p; break;      case GL_DW: a->dweight = p; break;
    case GL_DB: a->dbias = p; break;   default: a->workspace = p; break;
    }
}
enum { GB_X, GB_W, GB_B, GB_RM, GB_RV, GB_Y, GB_SM, GB_SI, GB_DY, GB_DX, GB_DW, GB_DB, GB_WS, GB_NSLOT };
static const char *const gb_names[GB_NSLOT] = {"x", "weight", "bias", "running_mean", "running_var", "y", "save_mean",
                                               "save_invstd", "dy", "dx", "dweight", "dbias", "workspace"};
static void gb_set(capex_cuda_batch_norm_args *a, int s, capex_cuda_ptr p) {
    switch (s) {
    case GB_X: a->x = p; break;             case GB_W: a->weight = p; break;       case GB_B: a->bias = p; break;
    case GB_RM: a->running_mean = p; break; case GB_RV: a->running_var = p; break;  case GB_Y: a->y = p; break;
    case GB_SM: a->save_mean = p; break;    case GB_SI: a->save_invstd = p; break;  case GB_DY: a->dy = p; break;
    case GB_DX: a->dx = p; break;           case GB_DW: a->dweight = p; break;      case GB_DB: a->dbias = p; break;
    default: a->workspace = p; break;
    }
}
static int gnames_both(const char *msg, const char *p, const char *q) {
    char s1[64], s2[64];
    snprintf(s1, sizeof s1, " %s [", p); snprintf(s2, sizeof s2, " %s [", q);
    return strstr(msg, s1) && strstr(msg, s2);
}
static capex_result gal_call(capex_cuda_context *ctx, int kind, capex_cuda_norm_args *na, capex_cuda_batch_norm_args *ba) {
    capex_batch_norm_desc d;
    capex_batch_norm_desc_init(&d);
    switch (kind) {
    case 0: return capex_cuda_layer_norm_forward(ctx, NULL, na, NULL);
    case 1: return capex_cuda_layer_norm_backward(ctx, NULL, na, NULL);
    case 2: return capex_cuda_rms_norm_forward(ctx, NULL, na, NULL);
    case 3: return capex_cuda_rms_norm_backward(ctx, NULL, na, NULL);
    case 4: return capex_cuda_batch_norm_forward(ctx, &d, NULL, ba, NULL);
    case 5: d.training = 0; return capex_cuda_batch_norm_forward(ctx, &d, NULL, ba, NULL);
    case 6: return capex_cuda_batch_norm_backward(ctx, &d, NULL, ba, NULL);
    default: {
        capex_norm_desc me;
        capex_norm_desc_init(&me);
        me.memory_efficient = 1;
        return kind == 7 ? capex_cuda_layer_norm_backward(ctx, &me, na, NULL) : capex_cuda_rms_norm_backward(ctx, &me, na, NULL);
    }
    }
}
CT_TEST(gpu_norm_overlapping_outputs_refused_before_launch) {
    static const int outs[9][7] = {{GL_Y, GL_MEAN, GL_RSTD, -1}, {GL_DX, GL_DW, GL_DB, GL_WS, -1},
                                   {GL_Y, GL_MEAN, GL_RSTD, -1}, {GL_DX, GL_DW, GL_WS, -1},
                                   {GB_Y, GB_SM, GB_SI, GB_RM, GB_RV, GB_WS, -1}, {GB_Y, GB_SM, GB_SI, GB_WS, -1},
                                   {GB_DX, GB_DW, GB_DB, GB_WS, -1}, {GL_DX, GL_DW, GL_DB, GL_WS, -1}, {GL_DX, GL_DW, GL_WS, -1}};
    static const int ins[9][6] = {{GL_X, GL_W, GL_B, -1}, {GL_X, GL_DY, GL_W, GL_MEAN, GL_RSTD, -1}, {GL_X, GL_W, -1},
                                  {GL_X, GL_DY, GL_W, GL_RSTD, -1}, {GB_X, GB_W, GB_B, -1},
                                  {GB_X, GB_W, GB_B, GB_RM, GB_RV, -1}, {GB_X, GB_DY, GB_W, GB_SM, GB_SI, -1},
                                  {GL_Y, GL_DY, GL_W, GL_B, GL_RSTD, -1}, {GL_Y, GL_DY, GL_W, GL_RSTD, -1}};
    capex_cuda_context *ctx = open_ctx(ct);
    const size_t bytes = (size_t)(GB_NSLOT + 2) * GAL_REG * 4;
    float *h = (float *)malloc(bytes), *back = (float *)malloc(bytes);
    capex_cuda_ptr arena;
    int kind, oi, ti, k, tried = 0, accepted = 0, unnamed = 0, written = 0;
    char first[1200] = "";
    if (!ctx) { free(h); free(back); return; }
    for (k = 0; k < (int)(bytes / 4); k++) h[k] = 1.0f + 0.25f * (float)(k % 7);
    arena = up(ctx, h, bytes);
    CT_CHECK(arena != 0, "arena");
    for (kind = 0; kind < 9; kind++) { /* 7, 8: LayerNorm, RMSNorm memory-efficient backward */
        const int bn = kind >= 4 && kind <= 6, nslot = bn ? GB_NSLOT : GL_NSLOT;
        const char *const *names = bn ? gb_names : gl_names;
        capex_cuda_norm_args na;
        capex_cuda_batch_norm_args ba;
        capex_cuda_norm_args_init(&na); capex_cuda_batch_norm_args_init(&ba);
        na.rows = 5; na.cols = 12;
        ba.n = 2; ba.c = 3; ba.s = 5;
        for (k = 0; k < nslot; k++) {
            if (bn) gb_set(&ba, k, arena + (size_t)(k + 1) * GAL_REG * 4);
            else if (!((kind == 2 || kind == 3 || kind == 8) && (k == GL_B || k == GL_DB)))
                gl_set(&na, k, arena + (size_t)(k + 1) * GAL_REG * 4);
        }
        for (oi = 0; outs[kind][oi] >= 0; oi++) {
            const int o = outs[kind][oi];
            for (ti = 0; ti < 13; ti++) {
                int t, off;
                if (ti < 6) { if (ins[kind][ti] < 0) { ti = 5; continue; } t = ins[kind][ti]; }
                else { if (outs[kind][ti - 6] < 0) break; t = outs[kind][ti - 6]; }
                if (t == o) continue;
                for (off = -1; off <= 1; off++) {
                    capex_result r;
                    capex_cuda_ptr p = arena + (size_t)(t + 1) * GAL_REG * 4 + (int64_t)off * 8; /* 8: the workspace's doubles */
                    if ((kind == 0 || kind == 2 || kind == 4 || kind == 5) && off == 0 &&
                        o == (bn ? GB_Y : GL_Y) && t == (bn ? GB_X : GL_X))
                        continue; /* forward y == x exactly: in place */
                    if (bn) gb_set(&ba, o, p); else gl_set(&na, o, p);
                    r = gal_call(ctx, kind, &na, &ba);
                    tried++;
                    if (r != CAPEX_ERR_INVALID_ARG) {
                        if (!accepted++) snprintf(first, sizeof first, "kind %d: %s = %s %+d: %s", kind, names[o], names[t],
                                                  off, r == CAPEX_OK ? "CAPEX_OK" : capex_last_error());
                    } else if (!gnames_both(capex_last_error(), names[o], names[t])) {
                        if (!unnamed++) snprintf(first, sizeof first, "%s", capex_last_error());
                    }
                    if (bn) gb_set(&ba, o, arena + (size_t)(o + 1) * GAL_REG * 4);
                    else gl_set(&na, o, arena + (size_t)(o + 1) * GAL_REG * 4);
                }
            }
        }
        CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_memcpy_dtoh(ctx, back, arena, bytes, NULL);
        if (memcmp(back, h, bytes)) { written++; capex_cuda_memcpy_htod(ctx, arena, h, bytes, NULL); }
        /* and the same call without overlap runs */
        CT_CHECK(gal_call(ctx, kind, &na, &ba) == CAPEX_OK, "kind %d, no overlap: %s", kind, capex_last_error());
        CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
        capex_cuda_memcpy_htod(ctx, arena, h, bytes, NULL);
    }
    CT_CHECK(tried > 260, "only %d overlaps tried", tried);
    CT_CHECK(!accepted, "%d of %d overlapping calls not refused, first: %s", accepted, tried, first);
    CT_CHECK(!unnamed, "%d refusals do not name both buffers: %s", unnamed, first);
    CT_CHECK(!written, "%d kinds of refused calls wrote the arena", written);
    capex_cuda_free(ctx, arena);
    free(h); free(back);
    capex_cuda_context_destroy(ctx);
}

/* Forward in place (y == x, same dtype) on the GPU gives the out-of-place GPU
   bits: warp-per-row (4 rows a block; 7 rows: a partial block) and
   block-per-row widths, vectorised (cols % 4 == 0) and scalar, every dtype;
   BatchNorm in both layouts, train and eval. */
CT_TEST(gpu_norm_forward_in_place_same_bits) {
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t shapes[4][2] = {{7, 64}, {7, 33}, {3, 2048}, {3, 1027}};
    capex_cuda_context *ctx = open_ctx(ct);
    int di, si, rms, lay, train;
    if (!ctx) return;
    for (di = 0; di < 3; di++)
        for (si = 0; si < 4; si++)
            for (rms = 0; rms < 2; rms++) {
                const capex_dtype t = dts[di];
                const int64_t R = shapes[si][0], C = shapes[si][1], N = R * C;
                const size_t es = capex_dtype_size(t);
                void *x = malloc((size_t)N * es), *y0 = malloc((size_t)N * es), *y1 = malloc((size_t)N * es);
                float *w = (float *)malloc((size_t)C * 4), *bb = (float *)malloc((size_t)C * 4), st0[16], st1[16];
                capex_cuda_norm_args g;
                capex_cuda_ptr gx, gi, gs0, gs1;
                int64_t i;
                for (i = 0; i < N; i++) setv(t, x, i, 3.0f + rnd());
                for (i = 0; i < C; i++) { w[i] = 1.0f + 0.5f * rnd(); bb[i] = rnd(); }
                capex_cuda_norm_args_init(&g);
                g.rows = R; g.cols = C; g.x_dtype = g.y_dtype = t;
                g.weight = up(ctx, w, (size_t)C * 4); g.bias = rms ? 0 : up(ctx, bb, (size_t)C * 4);
                gx = up(ctx, x, (size_t)N * es); gi = up(ctx, x, (size_t)N * es);
                gs0 = up(ctx, NULL, 2 * 8 * 4); gs1 = up(ctx, NULL, 2 * 8 * 4);
                g.x = gx; g.y = up(ctx, NULL, (size_t)N * es); g.mean = gs0; g.rstd = gs0 + 32;
                CT_CHECK((rms ? capex_cuda_rms_norm_forward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL)) ==
                         CAPEX_OK, "%s", capex_last_error());
                capex_cuda_free(ctx, gx); /* keep y */
                gx = g.y;
                g.x = gi; g.y = gi; g.mean = gs1; g.rstd = gs1 + 32;
                CT_CHECK((rms ? capex_cuda_rms_norm_forward(ctx, NULL, &g, NULL) : capex_cuda_layer_norm_forward(ctx, NULL, &g, NULL)) ==
                         CAPEX_OK, "in place: %s", capex_last_error());
                CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
                capex_cuda_memcpy_dtoh(ctx, y0, gx, (size_t)N * es, NULL); capex_cuda_memcpy_dtoh(ctx, y1, gi, (size_t)N * es, NULL);
                capex_cuda_memcpy_dtoh(ctx, st0, gs0, 64, NULL); capex_cuda_memcpy_dtoh(ctx, st1, gs1, 64, NULL);
                CT_CHECK(!memcmp(y0, y1, (size_t)N * es) && !memcmp(st0, st1, 64), "rms %d dtype %d %lldx%lld: in place differs",
                         rms, (int)t, (long long)R, (long long)C);
                capex_cuda_free(ctx, gx); capex_cuda_free(ctx, gi); capex_cuda_free(ctx, gs0); capex_cuda_free(ctx, gs1);
                capex_cuda_free(ctx, g.weight); if (g.bias) capex_cuda_free(ctx, g.bias);
                free(x); free(y0); free(y1); free(w); free(bb);
                if (ct->failed) goto done;
            }
    for (di = 0; di < 3; di++)
        for (lay = 0; lay < 2; lay++)
            for (train = 0; train < 2; train++) {
                const capex_dtype t = dts[di];
                const int64_t Nn = 5, C = 6, S = 9, N = Nn * C * S;
                const size_t es = capex_dtype_size(t), wsb = capex_cuda_batch_norm_workspace_bytes(C, 1);
                void *x = malloc((size_t)N * es), *y0 = malloc((size_t)N * es), *y1 = malloc((size_t)N * es);
                float w[6], bb[6], rs[24] = {0}, st0[24], st1[24]; /* running mean, var; save mean, invstd */
                capex_batch_norm_desc d;
                capex_cuda_batch_norm_args g;
                capex_cuda_ptr gx, gy, gi, s0, s1, ws0, ws1;
                int64_t i;
                for (i = 0; i < N; i++) setv(t, x, i, (float)(i % C) + rnd());
                for (i = 0; i < C; i++) { w[i] = 1.0f + 0.5f * rnd(); bb[i] = rnd(); rs[i] = rnd(); rs[6 + i] = 1.0f + 0.5f * rnd(); }
                capex_batch_norm_desc_init(&d); d.training = train;
                capex_cuda_batch_norm_args_init(&g);
                g.n = Nn; g.c = C; g.s = S; g.layout = lay ? CAPEX_BN_NSC : CAPEX_BN_NCS; g.x_dtype = g.y_dtype = t;
                g.weight = up(ctx, w, 24); g.bias = up(ctx, bb, 24);
                gx = up(ctx, x, (size_t)N * es); gy = up(ctx, NULL, (size_t)N * es); gi = up(ctx, x, (size_t)N * es);
                s0 = up(ctx, rs, 96); s1 = up(ctx, rs, 96); /* running mean, var; save mean, invstd */
                ws0 = up(ctx, NULL, wsb); ws1 = up(ctx, NULL, wsb);
                g.x = gx; g.y = gy; g.running_mean = s0; g.running_var = s0 + 24; g.save_mean = s0 + 48; g.save_invstd = s0 + 72;
                g.workspace = ws0;
                CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "%s", capex_last_error());
                g.x = gi; g.y = gi; g.running_mean = s1; g.running_var = s1 + 24; g.save_mean = s1 + 48; g.save_invstd = s1 + 72;
                g.workspace = ws1;
                CT_CHECK(capex_cuda_batch_norm_forward(ctx, &d, NULL, &g, NULL) == CAPEX_OK, "in place: %s", capex_last_error());
                CT_CHECK(capex_cuda_context_synchronize(ctx) == CAPEX_OK, "%s", capex_last_error());
                capex_cuda_memcpy_dtoh(ctx, y0, gy, (size_t)N * es, NULL); capex_cuda_memcpy_dtoh(ctx, y1, gi, (size_t)N * es, NULL);
                capex_cuda_memcpy_dtoh(ctx, st0, s0, 96, NULL); capex_cuda_memcpy_dtoh(ctx, st1, s1, 96, NULL);
                CT_CHECK(!memcmp(y0, y1, (size_t)N * es) && !memcmp(st0, st1, 96),
                         "batch norm dtype %d layout %d training %d: in place differs", (int)t, lay, train);
                capex_cuda_free(ctx, gx); capex_cuda_free(ctx, gy); capex_cuda_free(ctx, gi); capex_cuda_free(ctx, s0);
                capex_cuda_free(ctx, s1); capex_cuda_free(ctx, ws0); capex_cuda_free(ctx, ws1);
                capex_cuda_free(ctx, g.weight); capex_cuda_free(ctx, g.bias);
                free(x); free(y0); free(y1);
                if (ct->failed) goto done;
            }
done:
    capex_cuda_context_destroy(ctx);
}

static const ct_case cases[] = {
    CT_CASE(gpu_norm_argument_errors),
    CT_CASE(gpu_layer_norm_refuses_rows_over_2p32_columns), CT_CASE(gpu_norm_backward_refuses_long_rows_before_dx),
    CT_CASE(gpu_layer_and_rms_norm_match_cpu), CT_CASE(gpu_norm_backward_partial_outputs),
    CT_CASE(gpu_norm_every_dtype_variant),
    CT_CASE(gpu_norm_variant_mismatch_refused_on_emulator),
    CT_CASE(gpu_norm_backward_vector_and_scalar_paths_agree),
    CT_CASE(gpu_batch_norm_matches_cpu),
    CT_CASE(gpu_batch_norm_eval_backward_nonfinite_stays_local),
    CT_CASE(gpu_batch_norm_eval_without_running_stats_needs_two_values),
    CT_CASE(gpu_batch_norm_empty_batch_as_torch),
    CT_CASE(gpu_norm_huge_f32_values_stay_finite), CT_CASE(gpu_norm_large_mean_small_noise_vs_float64),
    CT_CASE(gpu_norm_long_rows_vs_float64),
    CT_CASE(gpu_sync_batch_norm_world_matches_cpu_whole_batch), CT_CASE(gpu_sync_batch_norm_host_comm_matches_cpu_whole_batch),
    CT_CASE(gpu_sync_batch_norm_large_mean_vs_float64),
    CT_CASE(gpu_norm_backward_zero_rows_writes_zero_param_grads),
    CT_CASE(gpu_sync_batch_norm_nccl_world2_orders_user_stream),
    CT_CASE(gpu_norm_overlapping_outputs_refused_before_launch), CT_CASE(gpu_norm_forward_in_place_same_bits),
    CT_CASE(gpu_norm_memory_efficient_matches_cpu_every_variant), CT_CASE(gpu_norm_memory_efficient_zero_weight_nonfinite),
};
static const child_entry children[] = {{"syncbn", child_syncbn}, {"syncbn_stream", child_syncbn_stream},
                                       {"syncbn_tcp", child_syncbn_tcp}, {"syncbn_large_mean", child_syncbn_large_mean}};
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
