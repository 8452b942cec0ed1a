/* LayerNorm / RMSNorm / BatchNorm / SyncBatchNorm on the CPU, against float64
   references (forward, all gradients) and central finite differences of the
   float64 forward (so the references' own gradients are checked too). Odd
   widths, one-element rows, fp16 inputs at +-65504, constant rows (variance
   0), every dtype combination, NCS vs channels-last, eval mode, the running
   statistics update (unbiased variance), the opt-level dtypes, every error
   path (outputs poisoned and checked untouched), bits independent of the
   thread count, and SyncBatchNorm over 2 and 3 in-process ranks (threads, a
   test comm) with unequal and empty batches equal to BatchNorm on the
   concatenated batch; the aliasing rule (every overlapping output refused
   with nothing written; forward in place gives the out-of-place bits).
   NORM_HASH=1 prints a checksum of fixed outputs
   (tests/norm.mk compares builds with and without OpenMP). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>
#include <pthread.h>

static unsigned long long g_rng = 12345;
static unsigned long long rng_u64(void) { /* splitmix64 */
    unsigned long long z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double rng_sym(void) { return rng_unit() * 2.0 - 1.0; }

static double getv(capex_dtype dt, const void *p, int64_t i) {
    if (dt == CAPEX_F32) return (double)((const float *)p)[i];
    if (dt == CAPEX_F16) return (double)capex_f16_to_f32(((const uint16_t *)p)[i]);
    return (double)capex_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void setv(capex_dtype dt, void *p, int64_t i, double v) {
    if (dt == CAPEX_F32) ((float *)p)[i] = (float)v;
    else if (dt == CAPEX_F16) ((uint16_t *)p)[i] = capex_f32_to_f16((float)v);
    else ((uint16_t *)p)[i] = capex_f32_to_bf16((float)v);
}
static void *talloc(capex_dtype dt, int64_t n) { return calloc((size_t)(n > 0 ? n : 1), 4); (void)dt; }
/* Fills p (dtype) with offset + scale * U(-1, 1) and returns the stored values in d. */
static void fill(capex_dtype dt, void *p, double *d, int64_t n, double offset, double scale) {
    int64_t i;
    for (i = 0; i < n; i++) { setv(dt, p, i, offset + scale * rng_sym()); d[i] = getv(dt, p, i); }
}
static double *dalloc(int64_t n) { return (double *)calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* max |got - want| <= tol * max(scale, max |want|) over n values of dtype dt.
   Gradients pass the size of their terms as scale: the exact dx may be ~0
   where its terms cancel (two-element rows, one-element RMSNorm rows). */
static int close_to_s(capex_dtype dt, const void *got, const double *want, int64_t n, double tol, double scale,
                      double *err_out) {
    double mx = scale > 1e-30 ? scale : 1e-30, err = 0;
    int64_t i;
    for (i = 0; i < n; i++) if (fabs(want[i]) > mx) mx = fabs(want[i]);
    for (i = 0; i < n; i++) {
        double g = getv(dt, got, i), e = fabs(g - want[i]);
        if (!(e <= err)) err = e != e ? 1e300 : e;
    }
    if (err_out) *err_out = err / mx;
    return err <= tol * mx;
}
static int close_to(capex_dtype dt, const void *got, const double *want, int64_t n, double tol, double *err_out) {
    return close_to_s(dt, got, want, n, tol, 0.0, err_out);
}
static double maxabs(const double *v, int64_t n) {
    double m = 0;
    int64_t i;
    for (i = 0; i < n; i++) if (fabs(v[i]) > m) m = fabs(v[i]);
    return m;
}
static double dtype_tol(capex_dtype t) { return t == CAPEX_F32 ? 2e-5 : t == CAPEX_F16 ? 2e-3 : 1.6e-2; }

/* ---- float64 references ---- */
static void ref_norm(int rms, int64_t R, int64_t C, const double *x, const double *w, const double *b, double eps,
                     double *y, double *mean, double *rstd) {
    int64_t r, j;
    for (r = 0; r < R; r++) {
        const double *xr = x + r * C;
        double m = 0, v = 0, rs;
        for (j = 0; j < C; j++) m += xr[j];
        m /= (double)C;
        if (rms) { for (j = 0; j < C; j++) v += xr[j] * xr[j]; v /= (double)C; m = 0; }
        else { for (j = 0; j < C; j++) v += (xr[j] - m) * (xr[j] - m); v /= (double)C; }
        rs = 1.0 / sqrt(v + eps);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
        for (j = 0; j < C; j++) y[r * C + j] = (xr[j] - m) * rs * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    }
}
static void ref_norm_bwd(int rms, int64_t R, int64_t C, const double *x, const double *w, const double *dy,
                         double eps, double *dx, double *dw, double *db) {
    int64_t r, j;
    for (j = 0; j < C; j++) { dw[j] = 0; db[j] = 0; }
    for (r = 0; r < R; r++) {
        const double *xr = x + r * C, *dr = dy + r * C;
        double m = 0, v = 0, rs, mg = 0, mgx = 0;
        for (j = 0; j < C; j++) m += xr[j];
        m /= (double)C;
        if (rms) { m = 0; for (j = 0; j < C; j++) v += xr[j] * xr[j]; }
        else for (j = 0; j < C; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= (double)C;
        rs = 1.0 / sqrt(v + eps);
        for (j = 0; j < C; j++) {
            double g = dr[j] * (w ? w[j] : 1.0), xh = (xr[j] - m) * rs;
            mg += g; mgx += g * xh;
            dw[j] += dr[j] * xh; db[j] += dr[j];
        }
        mg /= (double)C; mgx /= (double)C;
        if (rms) mg = 0;
        for (j = 0; j < C; j++) {
            double g = dr[j] * (w ? w[j] : 1.0), xh = (xr[j] - m) * rs;
            dx[r * C + j] = rs * (g - mg - xh * mgx);
        }
    }
}
static double ref_loss(int rms, int64_t R, int64_t C, const double *x, const double *w, const double *b, double eps,
                       const double *dy) {
    double *y = dalloc(R * C), s = 0;
    int64_t i;
    ref_norm(rms, R, C, x, w, b, eps, y, NULL, NULL);
    for (i = 0; i < R * C; i++) s += y[i] * dy[i];
    free(y);
    return s;
}

/* One LayerNorm/RMSNorm forward+backward case against the references. */
typedef struct ncase { int rms; int64_t R, C; capex_dtype xt, yt, pt; int affine; double offset, scale; float eps; } ncase;

static void run_case(ct_state *ct, const ncase *k) {
    int64_t N = k->R * k->C, i;
    void *x = talloc(k->xt, N), *y = talloc(k->yt, N), *w = talloc(k->pt, k->C), *b = talloc(k->pt, k->C);
    void *dy = talloc(k->yt, N), *dx = talloc(k->xt, N), *dw = talloc(k->pt, k->C), *db = talloc(k->pt, k->C);
    double *xd = dalloc(N), *wd = dalloc(k->C), *bd = dalloc(k->C), *dyd = dalloc(N), *yr = dalloc(N);
    double *mr = dalloc(k->R), *rr = dalloc(k->R), *dxr = dalloc(N), *dwr = dalloc(k->C), *dbr = dalloc(k->C);
    float *mean = (float *)talloc(CAPEX_F32, k->R), *rstd = (float *)talloc(CAPEX_F32, k->R);
    capex_norm_desc nd;
    capex_norm_args a;
    double err = 0;
    const char *what = k->rms ? "rms" : "layer";
    capex_norm_desc_init(&nd);
    nd.eps = k->eps;
    fill(k->xt, x, xd, N, k->offset, k->scale);
    fill(k->pt, w, wd, k->C, 1.0, 0.5);
    fill(k->pt, b, bd, k->C, 0.0, 0.5);
    fill(k->yt, dy, dyd, N, 0.0, 1.0);
    capex_norm_args_init(&a);
    a.rows = k->R; a.cols = k->C; a.x_dtype = k->xt; a.y_dtype = k->yt; a.param_dtype = k->pt;
    a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
    if (k->affine) { a.weight = w; if (!k->rms) a.bias = b; }
    ref_norm(k->rms, k->R, k->C, xd, k->affine ? wd : NULL, k->affine && !k->rms ? bd : NULL, k->eps, yr, mr, rr);
    CT_CHECK((k->rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
             capex_last_error());
    for (i = 0; i < N; i++) CT_CHECK(isfinite(getv(k->yt, y, i)), "%s y[%lld] not finite", what, (long long)i);
    CT_CHECK(close_to(k->yt, y, yr, N, dtype_tol(k->yt) + (k->xt == CAPEX_F32 ? 0 : 1e-5), &err),
             "%s fwd R=%lld C=%lld xt=%d yt=%d: rel err %g", what, (long long)k->R, (long long)k->C, k->xt, k->yt, err);
    CT_CHECK(close_to(CAPEX_F32, rstd, rr, k->R, 2e-5, &err), "%s rstd rel err %g", what, err);
    if (!k->rms) {
        for (i = 0; i < k->R; i++)
            CT_CHECK(fabs(mean[i] - mr[i]) <= 2e-6 * (fabs(mr[i]) + k->scale), "mean[%lld] %g vs %g", (long long)i,
                     (double)mean[i], mr[i]);
    }
    a.dy = dy; a.dx = dx;
    if (k->affine) { a.dweight = dw; if (!k->rms) a.dbias = db; }
    CT_CHECK((k->rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
             capex_last_error());
    ref_norm_bwd(k->rms, k->R, k->C, xd, k->affine ? wd : NULL, dyd, k->eps, dxr, dwr, dbr);
    /* dx is ~1/sqrt(eps)-amplified for constant rows: compare relative to its own scale */
    CT_CHECK(close_to_s(k->xt, dx, dxr, N, dtype_tol(k->xt) * 5,
                        maxabs(dyd, N) * maxabs(rr, k->R) * (k->affine ? maxabs(wd, k->C) : 1.0), &err), "%s dx R=%lld C=%lld xt=%d: rel err %g", what,
             (long long)k->R, (long long)k->C, k->xt, err);
    if (k->affine) {
        CT_CHECK(close_to(k->pt, dw, dwr, k->C, dtype_tol(k->pt) * 5, &err), "%s dweight rel err %g", what, err);
        if (!k->rms) CT_CHECK(close_to(k->pt, db, dbr, k->C, dtype_tol(k->pt) * 5, &err), "%s dbias rel err %g", what, err);
    }
    free(x); free(y); free(w); free(b); free(dy); free(dx); free(dw); free(db); free(xd); free(wd); free(bd);
    free(dyd); free(yr); free(mr); free(rr); free(dxr); free(dwr); free(dbr); free(mean); free(rstd);
}

CT_TEST(layer_and_rms_norm_odd_widths_f32) {
    static const int64_t widths[] = {1, 2, 3, 7, 8, 9, 33, 100, 1023, 4097};
    size_t i;
    int rms;
    for (rms = 0; rms < 2; rms++)
        for (i = 0; i < sizeof widths / sizeof widths[0]; i++) {
            ncase k = {rms, 5, widths[i], CAPEX_F32, CAPEX_F32, CAPEX_F32, 1, 0.5, 2.0, 1e-5f};
            run_case(ct, &k);
            if (ct->failed) return;
            k.affine = 0;
            run_case(ct, &k);
            if (ct->failed) return;
        }
}

CT_TEST(mixed_dtypes_all_combinations) {
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    int rms, xi, yi, pi;
    for (rms = 0; rms < 2; rms++)
        for (xi = 0; xi < 3; xi++)
            for (yi = 0; yi < 3; yi++)
                for (pi = 0; pi < 3; pi++) {
                    ncase k = {rms, 4, 37, ts[xi], ts[yi], ts[pi], 1, 0.25, 1.5, 1e-5f};
                    run_case(ct, &k);
                    if (ct->failed) return;
                }
}

CT_TEST(huge_fp16_inputs_do_not_overflow) {
    int rms;
    for (rms = 0; rms < 2; rms++) {
        /* values near fp16's max (65504): x^2 and sums stay in f32 */
        ncase k = {rms, 3, 1000, CAPEX_F16, CAPEX_F16, CAPEX_F32, 1, 0.0, 65504.0, 1e-5f};
        run_case(ct, &k);
        if (ct->failed) return;
        k.offset = 60000.0; k.scale = 5000.0; /* large mean, small spread (cancellation) */
        run_case(ct, &k);
        if (ct->failed) return;
    }
}

CT_TEST(constant_rows_and_one_element_rows) {
    int rms;
    for (rms = 0; rms < 2; rms++) {
        ncase k = {rms, 3, 129, CAPEX_F32, CAPEX_F32, CAPEX_F32, 1, 3.0, 0.0, 1e-5f}; /* variance 0 */
        run_case(ct, &k);
        if (ct->failed) return;
        k.C = 1; k.scale = 2.0; /* one element per row */
        run_case(ct, &k);
        if (ct->failed) return;
        k.xt = CAPEX_BF16; k.C = 64; k.scale = 0.0;
        run_case(ct, &k);
        if (ct->failed) return;
    }
    {   /* LayerNorm of a constant row is exactly the bias; mean exact, var exactly 0 */
        float x[5] = {7, 7, 7, 7, 7}, y[5], w[5] = {2, 2, 2, 2, 2}, b[5] = {0.5f, -1, 0, 3, 4}, m, rs;
        capex_norm_args a;
        int j;
        capex_norm_args_init(&a);
        a.rows = 1; a.cols = 5; a.x = x; a.y = y; a.weight = w; a.bias = b; a.mean = &m; a.rstd = &rs;
        CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(m == 7.0f && rs == 1.0f / sqrtf(1e-5f), "mean %g rstd %g", (double)m, (double)rs);
        for (j = 0; j < 5; j++) CT_CHECK(y[j] == b[j], "y[%d] = %g", j, (double)y[j]);
    }
}

/* Central differences of the float64 forward vs capex's (f32) gradients. */
CT_TEST(finite_differences) {
    int rms;
    for (rms = 0; rms < 2; rms++) {
        const int64_t R = 3, C = 7, N = R * C;
        float x[21], w[7], b[7], dy[21], y[21], dx[21], dw[7], db[7], mean[3], rstd[3];
        double xd[21], wd[7], bd[7], dyd[21], h = 1e-6;
        capex_norm_args a;
        int64_t i;
        fill(CAPEX_F32, x, xd, N, 0.3, 1.0);
        fill(CAPEX_F32, w, wd, C, 1.0, 0.5);
        fill(CAPEX_F32, b, bd, C, 0.0, 0.5);
        fill(CAPEX_F32, dy, dyd, N, 0.0, 1.0);
        capex_norm_args_init(&a);
        a.rows = R; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd;
        a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
        CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "fwd");
        CT_CHECK((rms ? capex_rms_norm_backward(NULL, &a) : capex_layer_norm_backward(NULL, &a)) == CAPEX_OK, "bwd");
        for (i = 0; i < N; i++) {
            double s = xd[i], fd;
            xd[i] = s + h; fd = ref_loss(rms, R, C, xd, wd, rms ? NULL : bd, 1e-5, dyd);
            xd[i] = s - h; fd -= ref_loss(rms, R, C, xd, wd, rms ? NULL : bd, 1e-5, dyd);
            xd[i] = s; fd /= 2 * h;
            CT_CHECK(fabs(fd - dx[i]) <= 1e-4 * (1 + fabs(fd)), "rms=%d dx[%lld]: fd %g capex %g", rms, (long long)i, fd,
                     (double)dx[i]);
        }
        for (i = 0; i < C; i++) {
            double s = wd[i], fd;
            wd[i] = s + h; fd = ref_loss(rms, R, C, xd, wd, rms ? NULL : bd, 1e-5, dyd);
            wd[i] = s - h; fd -= ref_loss(rms, R, C, xd, wd, rms ? NULL : bd, 1e-5, dyd);
            wd[i] = s; fd /= 2 * h;
            CT_CHECK(fabs(fd - dw[i]) <= 1e-4 * (1 + fabs(fd)), "rms=%d dw[%lld]: fd %g capex %g", rms, (long long)i, fd,
                     (double)dw[i]);
            if (rms) continue;
            s = bd[i];
            bd[i] = s + h; fd = ref_loss(rms, R, C, xd, wd, bd, 1e-5, dyd);
            bd[i] = s - h; fd -= ref_loss(rms, R, C, xd, wd, bd, 1e-5, dyd);
            bd[i] = s; fd /= 2 * h;
            CT_CHECK(fabs(fd - db[i]) <= 1e-4 * (1 + fabs(fd)), "db[%lld]: fd %g capex %g", (long long)i, fd,
                     (double)db[i]);
        }
    }
}

/* torch.nn.functional.layer_norm / rms_norm semantics in closed form on
   x = [[1, 2, 3, 4], [-1, 0, 0, 5]], w = [1, 2, 3, 4], b = [0.5, 0, -0.5, 1],
   eps 1e-5: biased variance, eps inside the sqrt for both. */
CT_TEST(pytorch_semantics_small) {
    static const float x[8] = {1, 2, 3, 4, -1, 0, 0, 5}, w[4] = {1, 2, 3, 4}, b[4] = {0.5f, 0, -0.5f, 1};
    double ln[8], rms[8], xd[8], wd[4], bd[4];
    float y[8];
    capex_norm_args a;
    int i;
    for (i = 0; i < 8; i++) xd[i] = x[i];
    for (i = 0; i < 4; i++) { wd[i] = w[i]; bd[i] = b[i]; }
    /* closed forms: row 0 mean 2.5, var 1.25; row 1 mean 1, var 5.5; rms: mean(x^2) 7.5 and 6.5 */
    for (i = 0; i < 8; i++) {
        double m = i < 4 ? 2.5 : 1.0, v = i < 4 ? 1.25 : 5.5, ms = i < 4 ? 7.5 : 6.5;
        ln[i] = (xd[i] - m) / sqrt(v + 1e-5) * wd[i % 4] + bd[i % 4];
        rms[i] = xd[i] / sqrt(ms + 1e-5) * wd[i % 4];
    }
    CT_CHECK(fabs(ln[0] - (-1.341635420 + 0.5)) < 1e-8, "closed form LN %.9f", ln[0]);
    capex_norm_args_init(&a);
    a.rows = 2; a.cols = 4; a.x = x; a.y = y; a.weight = w; a.bias = b;
    CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 8; i++) CT_CHECK(fabs(y[i] - ln[i]) < 1e-5, "ln[%d] %g vs %g", i, (double)y[i], ln[i]);
    a.bias = NULL;
    CT_CHECK(capex_rms_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 8; i++) CT_CHECK(fabs(y[i] - rms[i]) < 1e-5, "rms[%d] %g vs %g", i, (double)y[i], rms[i]);
}

/* ---- PyTorch golden vectors (tests/data/norm_ref.txt, tests/gen_norm_ref.py) ---- */
static FILE *open_ref(void) {
    char path[1024];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    FILE *fp = NULL;
    if (slash) {
        snprintf(path, sizeof path, "%.*s/data/norm_ref.txt", (int)(slash - file), file);
        fp = fopen(path, "r");
    }
    if (!fp) fp = fopen("tests/data/norm_ref.txt", "r");
    return fp;
}
/* Reads the next line "<name> v v v ..." into v (at most cap values); returns the count, -1 on a name mismatch. */
static int read_vec(FILE *fp, const char *name, double *v, int cap) {
    char tag[32];
    int n = 0, c;
    if (fscanf(fp, "%31s", tag) != 1 || strcmp(tag, name)) return -1;
    while (n < cap) {
        do c = fgetc(fp); while (c == ' ');
        if (c == '\n' || c == EOF) return n;
        ungetc(c, fp);
        if (fscanf(fp, "%lf", &v[n]) != 1) return -1;
        n++;
    }
    return n;
}
static int near_all(const float *got, const double *want, int n, double tol, double scale) {
    int i;
    double mx = scale;
    for (i = 0; i < n; i++) if (fabs(want[i]) > mx) mx = fabs(want[i]);
    for (i = 0; i < n; i++) if (!(fabs(got[i] - want[i]) <= tol * mx)) return 0;
    return 1;
}

CT_TEST(matches_pytorch_golden_vectors) {
    FILE *fp = open_ref();
    char line[256], kind[16];
    int cases = 0;
    static double x[256], w[64], b[64], dy[256], y[256], dx[256], dw[64], db[64], rm[64], rv[64], rmo[64], rvo[64];
    static float xf[256], wf[64], bf[64], dyf[256], yf[256], dxf[256], dwf[64], dbf[64], rmf[64], rvf[64], mean[64],
        rstd[64];
    CT_CHECK(fp != NULL, "tests/data/norm_ref.txt not found (run from the repo root; python3 tests/gen_norm_ref.py)");
    CT_CHECK(fgets(line, sizeof line, fp) && !strncmp(line, "# torch", 7), "header");
    while (fscanf(fp, "%15s", line) == 1) {
        int i, n, N, C;
        CT_CHECK(!strcmp(line, "case") && fscanf(fp, "%15s", kind) == 1, "case line");
        if (strcmp(kind, "batch")) {
            int R, Cc, rms = !strcmp(kind, "rms");
            double eps;
            capex_norm_desc nd;
            capex_norm_args a;
            CT_CHECK(fscanf(fp, "%d %d %lf", &R, &Cc, &eps) == 3 && R * Cc <= 256 && Cc <= 64, "shape");
            N = R * Cc;
            CT_CHECK(read_vec(fp, "x", x, N) == N && read_vec(fp, "w", w, Cc) == Cc && read_vec(fp, "b", b, Cc) == Cc &&
                     read_vec(fp, "dy", dy, N) == N && read_vec(fp, "y", y, N) == N && read_vec(fp, "dx", dx, N) == N &&
                     read_vec(fp, "dw", dw, Cc) == Cc && read_vec(fp, "db", db, Cc) == Cc, "%s vectors", kind);
            for (i = 0; i < N; i++) { xf[i] = (float)x[i]; dyf[i] = (float)dy[i]; }
            for (i = 0; i < Cc; i++) { wf[i] = (float)w[i]; bf[i] = (float)b[i]; }
            capex_norm_desc_init(&nd);
            nd.eps = (float)eps;
            capex_norm_args_init(&a);
            a.rows = R; a.cols = Cc; a.x = xf; a.y = yf; a.weight = wf; a.bias = rms ? NULL : bf; a.mean = mean;
            a.rstd = rstd; a.dy = dyf; a.dx = dxf; a.dweight = dwf; a.dbias = rms ? NULL : dbf;
            CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "fwd");
            CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "bwd");
            CT_CHECK(near_all(yf, y, N, 1e-5, 1.0), "%s %dx%d: y differs from torch", kind, R, Cc);
            /* the size of dx's terms: rstd * |dy * w| (exact dx may cancel to ~0) */
            CT_CHECK(near_all(dxf, dx, N, 1e-4, rstd[0] * 2.0), "%s %dx%d: dx differs from torch", kind, R, Cc);
            CT_CHECK(near_all(dwf, dw, Cc, 1e-5, 1.0), "%s %dx%d: dweight differs from torch", kind, R, Cc);
            CT_CHECK(rms || near_all(dbf, db, Cc, 1e-5, 1.0), "%s %dx%d: dbias differs from torch", kind, R, Cc);
        } else {
            int Nn, S;
            double eps, mom;
            capex_batch_norm_desc d;
            capex_batch_norm_args a;
            CT_CHECK(fscanf(fp, "%d %d %d %lf %lf", &Nn, &C, &S, &eps, &mom) == 5 && Nn * C * S <= 256 && C <= 64, "bn");
            N = Nn * C * S;
            CT_CHECK(read_vec(fp, "x", x, N) == N && read_vec(fp, "w", w, C) == C && read_vec(fp, "b", b, C) == C &&
                     read_vec(fp, "rm", rm, C) == C && read_vec(fp, "rv", rv, C) == C && read_vec(fp, "dy", dy, N) == N &&
                     read_vec(fp, "y", y, N) == N && read_vec(fp, "rm_out", rmo, C) == C &&
                     read_vec(fp, "rv_out", rvo, C) == C && read_vec(fp, "dx", dx, N) == N &&
                     read_vec(fp, "dw", dw, C) == C && read_vec(fp, "db", db, C) == C, "batch vectors");
            for (i = 0; i < N; i++) { xf[i] = (float)x[i]; dyf[i] = (float)dy[i]; }
            for (i = 0; i < C; i++) { wf[i] = (float)w[i]; bf[i] = (float)b[i]; rmf[i] = (float)rm[i]; rvf[i] = (float)rv[i]; }
            capex_batch_norm_desc_init(&d);
            d.eps = (float)eps; d.momentum = (float)mom;
            capex_batch_norm_args_init(&a);
            a.n = Nn; a.c = C; a.s = S; a.x = xf; a.y = yf; a.weight = wf; a.bias = bf; a.running_mean = rmf;
            a.running_var = rvf; a.save_mean = mean; a.save_invstd = rstd; a.dy = dyf; a.dx = dxf; a.dweight = dwf;
            a.dbias = dbf;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(near_all(yf, y, N, 1e-5, 1.0), "batch %dx%dx%d: y differs from torch", Nn, C, S);
            CT_CHECK(near_all(rmf, rmo, C, 1e-6, 1.0), "batch: running_mean differs from torch");
            CT_CHECK(near_all(rvf, rvo, C, 1e-6, 1.0), "batch: running_var (unbiased) differs from torch");
            CT_CHECK(near_all(dxf, dx, N, 1e-4, rstd[0] * 2.0), "batch: dx differs from torch");
            CT_CHECK(near_all(dwf, dw, C, 1e-5, 1.0) && near_all(dbf, db, C, 1e-5, 1.0), "batch: dweight/dbias differ");
        }
        n = fgetc(fp);
        if (n != '\n' && n != EOF) ungetc(n, fp);
        cases++;
    }
    fclose(fp);
    CT_CHECK(cases == 9, "read %d golden cases, want 9", cases);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

/* Fixed problem: LN/RMS fwd+bwd and BN (both layouts) fwd+bwd with num_threads nt; hash of every output. */
static uint64_t fixed_problem_hash(int nt) {
    const int64_t R = 300, C = 517, N = R * C;
    float *x = (float *)malloc(N * 4), *y = (float *)malloc(N * 4), *dy = (float *)malloc(N * 4);
    float *dx = (float *)malloc(N * 4), w[517], b[517], dw[517], db[517], mean[300], rstd[300];
    float rm[517], rv[517], sm[517], si[517];
    uint64_t h = 0xcbf29ce484222325ULL;
    unsigned long long save = g_rng;
    int64_t i;
    capex_norm_desc nd;
    capex_norm_args a;
    capex_batch_norm_desc bd;
    capex_batch_norm_args ba;
    int rms, lay;
    g_rng = 99;
    for (i = 0; i < N; i++) { x[i] = (float)(rng_sym() * 3 + 1); dy[i] = (float)rng_sym(); }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); }
    capex_norm_desc_init(&nd);
    nd.num_threads = nt;
    for (rms = 0; rms < 2; rms++) {
        capex_norm_args_init(&a);
        a.rows = R; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd;
        a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
        if (rms) { capex_rms_norm_forward(&nd, &a); capex_rms_norm_backward(&nd, &a); }
        else { capex_layer_norm_forward(&nd, &a); capex_layer_norm_backward(&nd, &a); }
        h = hash_bytes(h, y, N * 4); h = hash_bytes(h, dx, N * 4); h = hash_bytes(h, dw, sizeof dw);
        h = hash_bytes(h, db, sizeof db); h = hash_bytes(h, rstd, sizeof rstd);
    }
    capex_batch_norm_desc_init(&bd);
    bd.num_threads = nt;
    for (lay = 0; lay < 2; lay++) {
        for (i = 0; i < C; i++) { rm[i] = 0; rv[i] = 1; }
        capex_batch_norm_args_init(&ba);
        ba.n = 30; ba.c = C; ba.s = 10; ba.layout = lay ? CAPEX_BN_NSC : CAPEX_BN_NCS;
        ba.x = x; ba.y = y; ba.weight = w; ba.bias = b; ba.running_mean = rm; ba.running_var = rv;
        ba.save_mean = sm; ba.save_invstd = si; ba.dy = dy; ba.dx = dx; ba.dweight = dw; ba.dbias = db;
        capex_batch_norm_forward(&bd, NULL, &ba);
        capex_batch_norm_backward(&bd, NULL, &ba);
        h = hash_bytes(h, y, N * 4); h = hash_bytes(h, dx, N * 4); h = hash_bytes(h, dw, sizeof dw);
        h = hash_bytes(h, db, sizeof db); h = hash_bytes(h, rm, sizeof rm); h = hash_bytes(h, rv, sizeof rv);
    }
    free(x); free(y); free(dy); free(dx);
    g_rng = save;
    return h;
}

/* The fixed problem above plus memory-efficient backwards (with and without
   dweight / dbias, so each pass-1 loop runs), hashed. */
static uint64_t fixed_problem_hash_all(void) {
    const int64_t R = 37, C = 203, N = R * C;
    float *x = (float *)malloc(N * 4), *y = (float *)malloc(N * 4), *dy = (float *)malloc(N * 4);
    float *dx = (float *)malloc(N * 4), w[203], b[203], dw[203], db[203], rstd[37];
    uint64_t h = fixed_problem_hash(1);
    unsigned long long save = g_rng;
    int64_t i;
    int k;
    capex_norm_desc nd;
    capex_norm_args a;
    g_rng = 7;
    for (i = 0; i < N; i++) { x[i] = (float)(rng_sym() * 2 + 0.5); dy[i] = (float)rng_sym(); }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); }
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = b; a.rstd = rstd;
    capex_layer_norm_forward(&nd, &a);
    nd.memory_efficient = 1;
    a.x = NULL; a.dy = dy; a.dx = dx;
    for (k = 0; k < 4; k++) {
        a.dweight = k & 1 ? dw : NULL; a.dbias = k & 2 ? db : NULL;
        capex_layer_norm_backward(&nd, &a);
        h = hash_bytes(h, dx, N * 4);
        if (k & 1) h = hash_bytes(h, dw, sizeof dw);
        if (k & 2) h = hash_bytes(h, db, sizeof db);
    }
    free(x); free(y); free(dy); free(dx);
    g_rng = save;
    return h;
}

/* The CPU norms round as the GPU kernels (NVRTC --fmad=false): no product is
   fused into a sum in any build. The hash is that of the unfused operations
   (x86-64, -std=c99); an FMA-contracting build (GCC's -std=gnu* default on
   aarch64, -ffp-contract=fast) that fused one would give other bits. */
CT_TEST(bits_match_unfused_reference) {
    const uint64_t want = 0x6b65117ce059b095ULL, h = fixed_problem_hash_all();
    CT_CHECK(h == want, "hash %016llx, want %016llx: some product was fused into a sum (FMA)", (unsigned long long)h,
             (unsigned long long)want);
}

CT_TEST(bits_independent_of_thread_count) {
    uint64_t h1 = fixed_problem_hash(1), h2 = fixed_problem_hash(2), h3 = fixed_problem_hash(3), h0 = fixed_problem_hash(0);
    CT_CHECK(h1 == h2 && h1 == h3 && h1 == h0, "hashes differ: %llx %llx %llx %llx", (unsigned long long)h1,
             (unsigned long long)h2, (unsigned long long)h3, (unsigned long long)h0);
}

/* An f32 dx of 8 MiB or more is written with non-temporal stores (x86-64);
   the same rows in calls under that size use plain stores. Odd width: rows
   start off 16-byte alignment, so the head loop runs too. Threads 1 and 2.
   dx must be the same bits either way. */
CT_TEST(layer_norm_backward_large_dx_same_bits_as_small_calls) {
    const int64_t R = 2100, C = 1003, N = R * C, part = 525; /* N * 4 >= 8 MiB; part * C * 4 < 8 MiB */
    float *x = (float *)malloc((size_t)N * 4), *y = (float *)malloc((size_t)N * 4), *dy = (float *)malloc((size_t)N * 4);
    float *dx = (float *)malloc((size_t)N * 4), *dx2 = (float *)malloc((size_t)N * 4);
    float w[1003], b[1003], dw[1003], db[1003], *mean = (float *)malloc(R * 4), *rstd = (float *)malloc(R * 4);
    capex_norm_desc nd;
    capex_norm_args a;
    int64_t i, r0;
    int nt;
    CT_CHECK(x && y && dy && dx && dx2 && mean && rstd, "out of memory");
    for (i = 0; i < N; i++) { x[i] = (float)(rng_sym() * 2 + 0.5); dy[i] = (float)rng_sym(); }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); }
    for (nt = 1; nt <= 2; nt++) {
        capex_norm_desc_init(&nd);
        nd.num_threads = nt;
        capex_norm_args_init(&a);
        a.rows = R; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = b; a.mean = mean; a.rstd = rstd;
        a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
        CT_CHECK(capex_layer_norm_forward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
        memset(dx, 0xff, (size_t)N * 4);
        CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
        for (r0 = 0; r0 < R; r0 += part) {
            a.rows = part; a.x = x + r0 * C; a.y = y + r0 * C; a.mean = mean + r0; a.rstd = rstd + r0;
            a.dy = dy + r0 * C; a.dx = dx2 + r0 * C;
            CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
        }
        for (i = 0; i < N && memcmp(dx + i, dx2 + i, 4) == 0; i++) {}
        CT_CHECK(i == N, "threads %d: dx[%lld] %.9g (one call) != %.9g (calls under 8 MiB)", nt, (long long)i,
                 (double)dx[i < N ? i : 0], (double)dx2[i < N ? i : 0]);
    }
    free(x); free(y); free(dy); free(dx); free(dx2); free(mean); free(rstd);
}

/* Zero rows: dweight and dbias are still written ("written, not accumulated"),
   as zeros (torch's layer_norm/rms_norm backward of an empty batch), in every
   param dtype; stale values from an earlier call must not survive. */
CT_TEST(norm_backward_zero_rows_writes_zero_param_grads) {
    static const capex_dtype pts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    float w[5] = {1, 2, 3, 4, 5}, dw[5], db[5];
    capex_norm_desc nd;
    capex_norm_args a;
    int rms, k, i;
    capex_norm_desc_init(&nd);
    for (rms = 0; rms < 2; rms++)
        for (k = 0; k < 3; k++) {
            capex_norm_args_init(&a);
            a.rows = 0; a.cols = 5; a.x_dtype = CAPEX_F32; a.y_dtype = CAPEX_F32; a.param_dtype = pts[k];
            a.weight = w; a.dweight = dw; a.dbias = rms ? NULL : db;
            memset(dw, 0x7f, sizeof dw); memset(db, 0x7f, sizeof db);
            CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK,
                     "%s", capex_last_error());
            for (i = 0; i < 5; i++) {
                CT_CHECK(getv(pts[k], dw, i) == 0.0, "%s %s: dweight[%d] = %g, want 0", rms ? "rms" : "layer",
                         capex_dtype_name(pts[k]), i, getv(pts[k], dw, i));
                if (!rms)
                    CT_CHECK(getv(pts[k], db, i) == 0.0, "layer %s: dbias[%d] = %g, want 0",
                             capex_dtype_name(pts[k]), i, getv(pts[k], db, i));
            }
        }
}

CT_TEST(layer_norm_errors_are_clear_and_write_nothing) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], w[4] = {1, 1, 1, 1}, rstd[2], mean[2];
    char mis[20];
    capex_norm_desc nd;
    capex_norm_args a, g;
    int i;
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&g);
    g.rows = 2; g.cols = 4; g.x = x; g.y = y; g.weight = w; g.mean = mean; g.rstd = rstd;
    for (i = 0; i < 8; i++) y[i] = -99.0f;
#define EXPECT_ERR(call, code, text)                                                                 \
    do {                                                                                             \
        capex_result r_ = (call);                                                                    \
        CT_CHECK(r_ == (code), "%s: got %s (%s)", #call, capex_result_string(r_), capex_last_error()); \
        CT_CHECK(strstr(capex_last_error(), text), "message '%s' lacks '%s'", capex_last_error(), text); \
    } while (0)
    EXPECT_ERR(capex_layer_norm_forward(&nd, NULL), CAPEX_ERR_INVALID_ARG, "args is NULL");
    a = g; a.cols = 0;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "at least one column");
    a = g; a.rows = -1;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "negative");
    a = g; a.x = NULL;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "x is NULL");
    a = g; a.y = NULL;
    EXPECT_ERR(capex_rms_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "y is NULL");
    a = g; a.x_dtype = (capex_dtype)7;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "dtype");
    a = g; a.bias = w;
    EXPECT_ERR(capex_rms_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "no bias");
    a = g; a.x = mis + 1;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_INVALID_ARG, "not aligned");
    a = g; a.rows = INT64_MAX / 2;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &a), CAPEX_ERR_LIMIT, "overflows");
    nd.eps = NAN;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &g), CAPEX_ERR_INVALID_ARG, "eps");
    nd.eps = -1.0f;
    EXPECT_ERR(capex_layer_norm_forward(&nd, &g), CAPEX_ERR_INVALID_ARG, "eps");
    capex_norm_desc_init(&nd);
    for (i = 0; i < 8; i++) CT_CHECK(y[i] == -99.0f, "y[%d] written by a failed call", i);
    a = g; a.dy = x; a.dx = y; a.rstd = NULL;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "rstd (saved by forward) is NULL");
    a = g; a.dy = x; a.dx = y; a.mean = NULL;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "mean (saved by forward) is NULL");
    a = g; a.dx = y;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "dy is NULL");
    a = g; a.dy = x; a.weight = NULL; a.dweight = mean;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "without weight");
    for (i = 0; i < 8; i++) CT_CHECK(y[i] == -99.0f, "y[%d] written by a failed call", i);
    /* RMSNorm backward needs no mean; zero rows is a no-op */
    a = g; a.dy = x; a.dx = y; a.mean = NULL; a.rows = 0;
    CT_CHECK(capex_rms_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
}

/* ---- memory-efficient backward (desc.memory_efficient: from y, not x) ---- */

/* float64 of the recomputation: xhat = (y - b) / w from the stored y and the
   saved f32 rstd, sum(g * xhat) as sum(dy * (y - b)), then the usual formulas. */
static void ref_norm_bwd_me(int rms, int64_t R, int64_t C, const double *y, const double *w, const double *b,
                            const float *rstd, const double *dy, double *dx, double *dw, double *db) {
    int64_t r, j;
    for (j = 0; j < C; j++) { dw[j] = 0; db[j] = 0; }
    for (r = 0; r < R; r++) {
        const double *yr = y + r * C, *dr = dy + r * C, rs = (double)rstd[r];
        double mg = 0, mgx = 0;
        for (j = 0; j < C; j++) {
            double wj = w ? w[j] : 1.0, bj = b ? b[j] : 0.0, xh = (yr[j] - bj) / wj;
            mg += dr[j] * wj; mgx += dr[j] * (yr[j] - bj);
            dw[j] += dr[j] * xh; db[j] += dr[j];
        }
        mg = rms ? 0 : mg / (double)C; mgx /= (double)C;
        for (j = 0; j < C; j++) {
            double wj = w ? w[j] : 1.0, bj = b ? b[j] : 0.0, xh = (yr[j] - bj) / wj;
            dx[r * C + j] = rs * (dr[j] * wj - mg - xh * mgx);
        }
    }
}
/* Half an ulp of y's dtype, relative: what y's rounding leaves in y - b. */
static double dtype_u(capex_dtype t) { return t == CAPEX_F32 ? 0x1p-24 : t == CAPEX_F16 ? 0x1p-11 : 0x1p-8; }

/* One case: forward, then the memory-efficient backward (x and mean NULL,
   the outputs poisoned) against (1) the float64 recomputation from the same y
   and rstd, with the normal backward's tolerances; (2) the float64 backward
   from x, the bound adding y's rounding carried into xhat, |dxhat| <= u_y
   (|xhat| + |b| / |w|); (3) the CPU's normal backward, the same bound. */
static void me_case(ct_state *ct, int rms, int64_t R, int64_t C, capex_dtype xt, capex_dtype yt, capex_dtype pt,
                    int affine, double *worst) {
    int64_t N = R * C, i;
    void *x = talloc(xt, N), *y = talloc(yt, N), *w = talloc(pt, C), *b = talloc(pt, C), *dy = talloc(yt, N);
    void *dx = talloc(xt, N), *dw = talloc(pt, C), *db = talloc(pt, C);
    void *dx0 = talloc(xt, N), *dw0 = talloc(pt, C), *db0 = talloc(pt, C);
    double *xd = dalloc(N), *wd = dalloc(C), *bd = dalloc(C), *dyd = dalloc(N), *yd = dalloc(N);
    double *dxr = dalloc(N), *dwr = dalloc(C), *dbr = dalloc(C), *dxe = dalloc(N), *dwe = dalloc(C), *dbe = dalloc(C);
    double *dx0d = dalloc(N), *dw0d = dalloc(C);
    float *mean = (float *)talloc(CAPEX_F32, R), *rstd = (float *)talloc(CAPEX_F32, R);
    capex_norm_desc nd;
    capex_norm_args a;
    double err = 0, maxxh = 0, bw = 0, sdx, sdw, tx, tw;
    const char *what = rms ? "rms" : "layer";
    const int hb = affine && !rms;
    capex_norm_desc_init(&nd);
    fill(xt, x, xd, N, 0.25, 1.5);
    fill(pt, w, wd, C, 1.0, 0.5);
    fill(pt, b, bd, C, 0.0, 0.5);
    fill(yt, dy, dyd, N, 0.0, 1.0);
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x_dtype = xt; a.y_dtype = yt; a.param_dtype = pt;
    a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
    if (affine) { a.weight = w; if (!rms) a.bias = b; }
    CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
             capex_last_error());
    for (i = 0; i < N; i++) yd[i] = getv(yt, y, i);
    a.dy = dy; a.dx = dx0;
    if (affine) { a.dweight = dw0; if (!rms) a.dbias = db0; }
    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
             capex_last_error());
    nd.memory_efficient = 1;
    a.x = NULL; a.mean = NULL; a.dx = dx; a.dweight = affine ? dw : NULL; a.dbias = hb ? db : NULL;
    memset(dx, 0xff, (size_t)N * 4); memset(dw, 0xff, (size_t)C * 4); memset(db, 0xff, (size_t)C * 4);
    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
             capex_last_error());
    /* (1) the recomputation in float64 */
    ref_norm_bwd_me(rms, R, C, yd, affine ? wd : NULL, hb ? bd : NULL, rstd, dyd, dxr, dwr, dbr);
    {
        double rmax = 0;
        for (i = 0; i < R; i++) if (rstd[i] > rmax) rmax = rstd[i];
        sdx = maxabs(dyd, N) * rmax * (affine ? maxabs(wd, C) : 1.0);
    }
    CT_CHECK(close_to_s(xt, dx, dxr, N, dtype_tol(xt) * 5, sdx, &err), "%s me dx vs float64 me R=%lld C=%lld xt=%d "
             "yt=%d pt=%d affine %d: rel err %g", what, (long long)R, (long long)C, xt, yt, pt, affine, err);
    if (affine) {
        CT_CHECK(close_to(pt, dw, dwr, C, dtype_tol(pt) * 5, &err), "%s me dweight vs float64 me: rel err %g", what, err);
        if (hb) CT_CHECK(close_to(pt, db, dbr, C, dtype_tol(pt) * 5, &err), "%s me dbias: rel err %g", what, err);
    }
    /* (2) the float64 backward from x; (3) the normal CPU backward */
    ref_norm_bwd(rms, R, C, xd, affine ? wd : NULL, dyd, 1e-5, dxe, dwe, dbe);
    for (i = 0; i < N; i++) if (fabs(dxr[i]) >= 0) { /* max |xhat| over the rows */
        double xh = fabs((yd[i] - (hb ? bd[i % C] : 0.0)) / (affine ? wd[i % C] : 1.0));
        if (xh > maxxh) maxxh = xh;
    }
    if (hb) for (i = 0; i < C; i++) if (fabs(bd[i] / wd[i]) > bw) bw = fabs(bd[i] / wd[i]);
    /* dx = rstd (g - mg - xhat mgx): a relative xhat error e moves dx by about e |xhat mgx| rstd, under
       e (maxxh + bw) times the scale; dweight sums R rows of dy * xhat: R max|dy| u_y (maxxh + bw) */
    tx = dtype_tol(xt) * 5 + 2 * dtype_u(yt) * (maxxh + bw);
    tw = dtype_tol(pt) * 5;
    sdw = (double)R * maxabs(dyd, N) * dtype_u(yt) * (maxxh + bw);
    CT_CHECK(close_to_s(xt, dx, dxe, N, tx, sdx, &err), "%s me dx vs float64 from x, xt=%d yt=%d pt=%d affine %d: rel "
             "err %g > %g", what, xt, yt, pt, affine, err, tx);
    if (err > *worst) *worst = err;
    if (affine) {
        double e2 = 0, m = maxabs(dwe, C);
        for (i = 0; i < C; i++) if (fabs(getv(pt, dw, i) - dwe[i]) > e2) e2 = fabs(getv(pt, dw, i) - dwe[i]);
        CT_CHECK(e2 <= tw * m + 2 * sdw, "%s me dweight vs float64 from x: |err| %g > %g", what, e2, tw * m + 2 * sdw);
    }
    for (i = 0; i < N; i++) dx0d[i] = getv(xt, dx0, i);
    for (i = 0; i < C; i++) dw0d[i] = getv(pt, dw0, i);
    CT_CHECK(close_to_s(xt, dx, dx0d, N, tx + dtype_tol(xt) * 5, sdx, &err), "%s me dx vs normal backward: rel err %g",
             what, err);
    if (affine) {
        double e2 = 0, m = maxabs(dw0d, C);
        for (i = 0; i < C; i++) if (fabs(getv(pt, dw, i) - dw0d[i]) > e2) e2 = fabs(getv(pt, dw, i) - dw0d[i]);
        CT_CHECK(e2 <= 2 * tw * m + 2 * sdw, "%s me dweight vs normal backward: |err| %g", what, e2);
        if (hb) CT_CHECK(memcmp(db, db0, (size_t)C * capex_dtype_size(pt)) == 0, "%s me dbias differs from normal", what);
    }
    /* no affine, f32 y: xhat = y is the normal backward's xhat, bit for bit, and so is everything after it */
    if (!affine && yt == CAPEX_F32)
        CT_CHECK(memcmp(dx, dx0, (size_t)N * capex_dtype_size(xt)) == 0, "%s me without affine: dx bits differ", what);
    free(x); free(y); free(w); free(b); free(dy); free(dx); free(dw); free(db); free(dx0); free(dw0); free(db0);
    free(xd); free(wd); free(bd); free(dyd); free(yd); free(dxr); free(dwr); free(dbr); free(dxe); free(dwe); free(dbe);
    free(dx0d); free(dw0d); free(mean); free(rstd);
}

CT_TEST(memory_efficient_backward_vs_float64_every_dtype) {
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t widths[] = {1, 2, 37, 64, 1029};
    double worst = 0;
    int rms, xi, yi, pi, af;
    size_t wi;
    for (rms = 0; rms < 2; rms++)
        for (af = 0; af < 2; af++) {
            for (xi = 0; xi < 3; xi++)
                for (yi = 0; yi < 3; yi++)
                    for (pi = 0; pi < 3; pi++) {
                        me_case(ct, rms, 5, 37, ts[xi], ts[yi], ts[pi], af, &worst);
                        if (ct->failed) return;
                    }
            for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
                me_case(ct, rms, 70, widths[wi], CAPEX_F32, CAPEX_F32, CAPEX_F32, af, &worst);
                if (ct->failed) return;
            }
        }
    if (getenv("CT_VERBOSE")) printf("memory-efficient dx vs float64 from x: worst rel err %g\n", worst);
}

/* A zero weight (+0 or -0, every param dtype) leaves y == b: xhat is lost.
   Refused, naming the column, nothing written; dbias alone needs no xhat. */
CT_TEST(memory_efficient_zero_weight_refused) {
    static const capex_dtype pts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    float x[12], y[12], dy[12], dx[12], mean[3], rstd[3];
    uint32_t wbuf[4], bbuf[4], dwb[4], dbb[4];
    capex_norm_desc nd;
    capex_norm_args a;
    int k, rms, neg, i;
    for (i = 0; i < 12; i++) { x[i] = (float)(i % 5) - 1.5f; dy[i] = 0.25f * (float)(i % 3) - 0.3f; }
    for (k = 0; k < 3; k++)
        for (rms = 0; rms < 2; rms++)
            for (neg = 0; neg < 2; neg++) {
                capex_norm_desc_init(&nd);
                capex_norm_args_init(&a);
                a.rows = 3; a.cols = 4; a.param_dtype = pts[k];
                for (i = 0; i < 4; i++) { setv(pts[k], wbuf, i, 1.0 + 0.5 * i); setv(pts[k], bbuf, i, 0.1 * i); }
                setv(pts[k], wbuf, 2, neg ? -0.0 : 0.0);
                a.x = x; a.y = y; a.weight = wbuf; a.bias = rms ? NULL : bbuf; a.mean = mean; a.rstd = rstd;
                CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
                nd.memory_efficient = 1;
                a.x = NULL; a.dy = dy; a.dx = dx; a.dweight = dwb; a.dbias = rms ? NULL : dbb;
                memset(dx, 0x5a, sizeof dx); memset(dwb, 0x5a, sizeof dwb); memset(dbb, 0x5a, sizeof dbb);
                CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) ==
                         CAPEX_ERR_INVALID_ARG, "%s %s: zero weight accepted", rms ? "rms" : "layer", capex_dtype_name(pts[k]));
                CT_CHECK(strstr(capex_last_error(), "weight[2] is 0"), "message: %s", capex_last_error());
                for (i = 0; i < 12; i++) CT_CHECK(((const unsigned char *)dx)[i * 4] == 0x5a, "dx written");
                for (i = 0; i < 4; i++) CT_CHECK(dwb[i] == 0x5a5a5a5au && dbb[i] == 0x5a5a5a5au, "param grads written");
                if (rms) continue;
                a.dx = NULL; a.dweight = NULL; a.dbias = dbb; /* dbias = sum(dy): no xhat needed */
                CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "dbias alone: %s", capex_last_error());
            }
}

/* Empty batch, no x or mean at all, bad flag, y missing. */
CT_TEST(memory_efficient_edges_and_errors) {
    float w[4] = {1, 2, 3, 4}, dw[4], db[4], y[8] = {0}, dy[8] = {0}, dx[8], rstd[2] = {1, 1};
    capex_norm_desc nd;
    capex_norm_args a;
    int i, rms;
    capex_norm_desc_init(&nd);
    nd.memory_efficient = 1;
    for (rms = 0; rms < 2; rms++) {
        capex_norm_args_init(&a);
        a.rows = 0; a.cols = 4; a.weight = w; a.dweight = dw; a.dbias = rms ? NULL : db;
        memset(dw, 0x7f, sizeof dw); memset(db, 0x7f, sizeof db);
        CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                 capex_last_error());
        for (i = 0; i < 4; i++) CT_CHECK(dw[i] == 0.0f && (rms || db[i] == 0.0f), "empty batch: grads not 0");
    }
    capex_norm_args_init(&a);
    a.rows = 2; a.cols = 4; a.weight = w; a.dy = dy; a.dx = dx; a.rstd = rstd; /* no x, no mean */
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "y (memory_efficient: the forward's output) is NULL");
    a.y = y;
    CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_rms_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
    a.x = dx; a.mean = (float *)dx; /* ignored here: they may be anything, even the outputs */
    CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "ignored x, mean: %s", capex_last_error());
    a.x = NULL; a.mean = NULL;
    nd.memory_efficient = 2;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "memory_efficient = 2 must be 0 or 1");
    nd.memory_efficient = 0;
    EXPECT_ERR(capex_layer_norm_backward(&nd, &a), CAPEX_ERR_INVALID_ARG, "x is NULL");
}

/* Threads 1, 2, 3: the same bits (fixed blocks, as the normal backward). */
CT_TEST(memory_efficient_bits_independent_of_thread_count) {
    const int64_t R = 300, C = 131, N = R * C;
    float *x = (float *)malloc((size_t)N * 4), *y = (float *)malloc((size_t)N * 4), *dy = (float *)malloc((size_t)N * 4);
    float *dx = (float *)malloc((size_t)N * 4), *dx1 = (float *)malloc((size_t)N * 4), w[131], b[131], dw[131], db[131];
    float dw1[131], db1[131], rstd[300];
    capex_norm_desc nd;
    capex_norm_args a;
    int64_t i;
    int nt;
    for (i = 0; i < N; i++) { x[i] = (float)(rng_sym() * 2 + 0.5); dy[i] = (float)rng_sym(); }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); }
    capex_norm_desc_init(&nd);
    capex_norm_args_init(&a);
    a.rows = R; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = b; a.rstd = rstd;
    CT_CHECK(capex_layer_norm_forward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
    nd.memory_efficient = 1;
    a.x = NULL; a.dy = dy; a.dweight = dw; a.dbias = db;
    for (nt = 1; nt <= 3; nt++) {
        nd.num_threads = nt;
        a.dx = nt == 1 ? dx1 : dx; a.dweight = nt == 1 ? dw1 : dw; a.dbias = nt == 1 ? db1 : db;
        CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
        if (nt > 1)
            CT_CHECK(!memcmp(dx, dx1, (size_t)N * 4) && !memcmp(dw, dw1, sizeof dw) && !memcmp(db, db1, sizeof db),
                     "threads %d: bits differ from 1 thread", nt);
    }
    free(x); free(y); free(dy); free(dx); free(dx1);
}

/* The use Apex's flag is for: the forward writes y over x (in place, same
   dtype), x is gone, the backward runs from y alone. Same bits as from an
   out-of-place y, f32 and bf16, LayerNorm and RMSNorm. */
CT_TEST(memory_efficient_after_forward_in_place) {
    static const capex_dtype ts[2] = {CAPEX_F32, CAPEX_BF16};
    const int64_t R = 6, C = 45, N = R * C;
    float w[45], b[45], rstd[6], rstd2[6], dw[2][45], db[2][45];
    capex_norm_desc nd;
    capex_norm_args a;
    int k, rms, pass;
    int64_t i;
    for (k = 0; k < 2; k++)
        for (rms = 0; rms < 2; rms++) {
            void *x = talloc(ts[k], N), *y = talloc(ts[k], N), *dy = talloc(ts[k], N), *dx[2];
            double tmp;
            for (i = 0; i < N; i++) { setv(ts[k], x, i, 0.3 + 2.0 * rng_sym()); setv(ts[k], dy, i, rng_sym()); }
            for (i = 0; i < C; i++) { w[i] = (float)(1.0 + 0.5 * rng_sym()); b[i] = (float)(0.5 * rng_sym()); }
            for (pass = 0; pass < 2; pass++) { /* 0: y apart from x; 1: y over x */
                capex_norm_desc_init(&nd);
                capex_norm_args_init(&a);
                a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = ts[k]; a.x = x; a.y = pass ? x : y; a.weight = w;
                a.bias = rms ? NULL : b; a.rstd = pass ? rstd2 : rstd;
                CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
                nd.memory_efficient = 1;
                dx[pass] = talloc(ts[k], N);
                a.x = NULL; a.dy = dy; a.dx = dx[pass]; a.dweight = dw[pass]; a.dbias = rms ? NULL : db[pass];
                CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
            }
            CT_CHECK(!memcmp(dx[0], dx[1], (size_t)N * capex_dtype_size(ts[k])) && !memcmp(dw[0], dw[1], sizeof dw[0]) &&
                     (rms || !memcmp(db[0], db[1], sizeof db[0])) && !memcmp(rstd, rstd2, sizeof rstd),
                     "%s %s: in place differs", rms ? "rms" : "layer", capex_dtype_name(ts[k]));
            tmp = getv(ts[k], dx[0], 0);
            CT_CHECK(isfinite(tmp), "dx not finite");
            free(x); free(y); free(dy); free(dx[0]); free(dx[1]);
        }
}

/* The backward's loops differ by which of dx, dweight, dbias are asked for
   (and dx reuses pass 1's xhat only with dweight): every subset gives the
   full call's bits for what it asks, f32 and bf16, widths with a tail. Then
   an f32 dx large enough for non-temporal stores: each row the same bits as
   that row alone (1 row: plain stores). */
CT_TEST(memory_efficient_output_subsets_and_streamed_dx_same_bits) {
    static const capex_dtype ts[2] = {CAPEX_F32, CAPEX_BF16};
    static const int64_t widths[2] = {37, 1029};
    const int64_t R = 20;
    capex_norm_desc nd;
    capex_norm_args a;
    int k, rms, wi, outs;
    int64_t i;
    capex_norm_desc_init(&nd);
    for (k = 0; k < 2; k++)
        for (rms = 0; rms < 2; rms++)
            for (wi = 0; wi < 2; wi++) {
                const int64_t C = widths[wi], N = R * C;
                const size_t es = capex_dtype_size(ts[k]);
                void *x = talloc(ts[k], N), *y = talloc(ts[k], N), *dy = talloc(ts[k], N), *dx0 = talloc(ts[k], N);
                void *dx = talloc(ts[k], N), *w = talloc(ts[k], C), *b = talloc(ts[k], C);
                void *dw0 = talloc(ts[k], C), *db0 = talloc(ts[k], C), *dw = talloc(ts[k], C), *db = talloc(ts[k], C);
                float *rstd = (float *)talloc(CAPEX_F32, R);
                for (i = 0; i < N; i++) { setv(ts[k], x, i, 0.5 + 2.0 * rng_sym()); setv(ts[k], dy, i, rng_sym()); }
                for (i = 0; i < C; i++) { setv(ts[k], w, i, 1.0 + 0.5 * rng_sym()); setv(ts[k], b, i, rng_sym()); }
                capex_norm_args_init(&a);
                a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = a.param_dtype = ts[k];
                a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.rstd = rstd;
                nd.memory_efficient = 0;
                CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
                nd.memory_efficient = 1;
                a.x = NULL; a.dy = dy;
                for (outs = 7; outs >= 1; outs--) { /* bits: dx, dweight, dbias; 7 (all) first */
                    if (rms && outs == 4) continue; /* RMSNorm: no dbias */
                    a.dx = (outs & 1) ? (outs == 7 ? dx0 : dx) : NULL;
                    a.dweight = (outs & 2) ? (outs == 7 ? dw0 : dw) : NULL;
                    a.dbias = (outs & 4) && !rms ? (outs == 7 ? db0 : db) : NULL;
                    memset(dx, 0x5a, (size_t)N * es); memset(dw, 0x5a, (size_t)C * es); memset(db, 0x5a, (size_t)C * es);
                    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK,
                             "%s", capex_last_error());
                    if (outs == 7) continue;
                    CT_CHECK(!a.dx || !memcmp(dx, dx0, (size_t)N * es), "%s %s C=%lld outputs %d: dx bits differ",
                             rms ? "rms" : "layer", capex_dtype_name(ts[k]), (long long)C, outs);
                    CT_CHECK(!a.dweight || !memcmp(dw, dw0, (size_t)C * es), "%s %s C=%lld outputs %d: dweight bits "
                             "differ", rms ? "rms" : "layer", capex_dtype_name(ts[k]), (long long)C, outs);
                    CT_CHECK(!a.dbias || !memcmp(db, db0, (size_t)C * es), "%s %s C=%lld outputs %d: dbias bits differ",
                             rms ? "rms" : "layer", capex_dtype_name(ts[k]), (long long)C, outs);
                }
                free(x); free(y); free(dy); free(dx0); free(dx); free(w); free(b); free(dw0); free(db0); free(dw);
                free(db); free(rstd);
                if (ct->failed) return;
            }
    for (rms = 0; rms < 2; rms++) {
        const int64_t R2 = 260, C = 8195, N = R2 * C; /* N >= 2^21 f32: dx streamed */
        float *x = (float *)malloc((size_t)N * 4), *y = (float *)malloc((size_t)N * 4);
        float *dy = (float *)malloc((size_t)N * 4), *dx = (float *)malloc((size_t)N * 4), *dx1 = (float *)malloc((size_t)C * 4);
        float *w = (float *)malloc((size_t)C * 4), *b = (float *)malloc((size_t)C * 4);
        float *dw = (float *)malloc((size_t)C * 4), *db = (float *)malloc((size_t)C * 4), rstd[260];
        int64_t r, bad = -1;
        for (i = 0; i < N; i++) { x[i] = (float)(0.5 + 2.0 * rng_sym()); dy[i] = (float)rng_sym(); }
        for (i = 0; i < C; i++) { w[i] = (float)(1.0 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); }
        capex_norm_args_init(&a);
        a.rows = R2; a.cols = C; a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.rstd = rstd;
        nd.memory_efficient = 0;
        CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                 capex_last_error());
        nd.memory_efficient = 1;
        a.x = NULL; a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
        CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                 capex_last_error());
        for (r = 0; r < R2 && bad < 0; r += 37) { /* rows at several dx alignments */
            a.rows = 1; a.y = y + r * C; a.dy = dy + r * C; a.rstd = rstd + r; a.dx = dx1;
            CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                     capex_last_error());
            if (memcmp(dx1, dx + r * C, (size_t)C * 4)) bad = r;
        }
        CT_CHECK(bad < 0, "%s: streamed dx row %lld differs from the row alone", rms ? "rms" : "layer", (long long)bad);
        free(x); free(y); free(dy); free(dx); free(dx1); free(w); free(b); free(dw); free(db);
    }
}

/* No weight, no bias: the memory-efficient backward's xhat is y, the normal
   backward's xhat, so its dx (and a dbias asked without a bias, with dx and
   alone) has the normal backward's bits, f32, LayerNorm and RMSNorm: widths with and without
   a tail (n % 8), under and over one block of CAPEX__NM_BLK rounds (512
   columns), a partial last block; 1-3 threads (100 rows: 7 row blocks). */
CT_TEST(memory_efficient_no_affine_same_bits_as_normal) {
    static const int64_t widths[] = {1, 7, 9, 511, 512, 513, 520, 1029, 1543, 4103};
    const int64_t R = 100;
    capex_norm_desc nd;
    capex_norm_args a;
    size_t wi;
    int rms, nt, withdb;
    int64_t i;
    for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (rms = 0; rms < 2; rms++) {
            const int64_t C = widths[wi], N = R * C;
            float *x = (float *)malloc((size_t)N * 4), *y = (float *)malloc((size_t)N * 4);
            float *dy = (float *)malloc((size_t)N * 4), *dx0 = (float *)malloc((size_t)N * 4);
            float *dx = (float *)malloc((size_t)N * 4), *db0 = (float *)malloc((size_t)C * 4);
            float *db = (float *)malloc((size_t)C * 4), mean[100], rstd[100];
            for (i = 0; i < N; i++) { x[i] = (float)(0.5 + 2.0 * rng_sym()); dy[i] = (float)rng_sym(); }
            capex_norm_desc_init(&nd);
            capex_norm_args_init(&a);
            a.rows = R; a.cols = C; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
            CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                     capex_last_error());
            a.dy = dy; a.dx = dx0; a.dbias = rms ? NULL : db0;
            CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                     capex_last_error());
            nd.memory_efficient = 1;
            a.x = NULL; a.mean = NULL;
            for (nt = 1; nt <= 3; nt++)
                for (withdb = 0; withdb < (rms ? 1 : 3); withdb++) { /* dx; dx and dbias; dbias alone (no row sums) */
                    nd.num_threads = nt;
                    a.dx = withdb < 2 ? dx : NULL;
                    a.dbias = withdb ? db : NULL;
                    memset(dx, 0x5a, (size_t)N * 4); memset(db, 0x5a, (size_t)C * 4);
                    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK,
                             "%s", capex_last_error());
                    CT_CHECK(!a.dx || !memcmp(dx, dx0, (size_t)N * 4), "%s C=%lld threads %d dbias %d: me dx bits differ "
                             "from the normal backward's", rms ? "rms" : "layer", (long long)C, nt, withdb);
                    CT_CHECK(!withdb || !memcmp(db, db0, (size_t)C * 4), "layer C=%lld threads %d: me dbias bits differ",
                             (long long)C, nt);
                }
            free(x); free(y); free(dy); free(dx0); free(dx); free(db0); free(db);
            if (ct->failed) return;
        }
}

/* The memory-efficient loops without a bias row (weight alone) and without
   weight and bias rows give the bits of the loops that read an all-zeros bias
   and all-ones weight (y - (+0) is y, d * 1 is d): LayerNorm, f32 and bf16,
   every output set (dx-less ones: the partials alone), widths with and without
   a tail and over one block of CAPEX__NM_BLK rounds, 2 threads. */
CT_TEST(memory_efficient_absent_params_same_bits_as_ones_zeros) {
    static const capex_dtype ts[2] = {CAPEX_F32, CAPEX_BF16};
    static const int64_t widths[] = {7, 9, 513, 1029, 4103};
    const int64_t R = 40;
    capex_norm_desc nd;
    capex_norm_args a;
    size_t wi;
    int k, hw, outs, pass;
    int64_t i;
    for (k = 0; k < 2; k++)
        for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (hw = 0; hw < 2; hw++) {
                const int64_t C = widths[wi], N = R * C;
                const size_t es = capex_dtype_size(ts[k]);
                void *x = talloc(ts[k], N), *y = talloc(ts[k], N), *dy = talloc(ts[k], N), *w = talloc(ts[k], C);
                void *ones = talloc(ts[k], C), *zeros = talloc(ts[k], C), *dx[2], *dw[2], *db[2];
                float *rstd = (float *)talloc(CAPEX_F32, R);
                for (pass = 0; pass < 2; pass++) {
                    dx[pass] = talloc(ts[k], N); dw[pass] = talloc(ts[k], C); db[pass] = talloc(ts[k], C);
                }
                for (i = 0; i < N; i++) { setv(ts[k], x, i, 0.5 + 2.0 * rng_sym()); setv(ts[k], dy, i, rng_sym()); }
                for (i = 0; i < C; i++) {
                    setv(ts[k], w, i, 1.0 + 0.5 * rng_sym()); setv(ts[k], ones, i, 1.0); setv(ts[k], zeros, i, 0.0);
                }
                capex_norm_desc_init(&nd);
                nd.num_threads = 2;
                capex_norm_args_init(&a);
                a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = a.param_dtype = ts[k];
                a.x = x; a.y = y; a.weight = hw ? w : NULL; a.rstd = rstd;
                CT_CHECK(capex_layer_norm_forward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
                nd.memory_efficient = 1;
                a.x = NULL; a.dy = dy;
                for (outs = 1; outs <= 7; outs++) { /* bits: dx, dweight, dbias */
                    if ((outs & 2) && !hw) continue; /* dweight needs a weight */
                    for (pass = 0; pass < 2; pass++) { /* 0: the rows given (ones / zeros), 1: absent */
                        a.weight = hw ? w : pass ? NULL : ones;
                        a.bias = pass ? NULL : zeros;
                        a.dx = (outs & 1) ? dx[pass] : NULL;
                        a.dweight = (outs & 2) ? dw[pass] : NULL;
                        a.dbias = (outs & 4) ? db[pass] : NULL;
                        memset(dx[pass], 0x5a, (size_t)N * es); memset(dw[pass], 0x5a, (size_t)C * es);
                        memset(db[pass], 0x5a, (size_t)C * es);
                        CT_CHECK(capex_layer_norm_backward(&nd, &a) == CAPEX_OK, "%s", capex_last_error());
                    }
                    CT_CHECK(!memcmp(dx[0], dx[1], (size_t)N * es) && !memcmp(dw[0], dw[1], (size_t)C * es) &&
                             !memcmp(db[0], db[1], (size_t)C * es), "%s C=%lld weight %d outputs %d: bits differ "
                             "without the ones / zeros rows", capex_dtype_name(ts[k]), (long long)C, hw, outs);
                }
                free(x); free(y); free(dy); free(w); free(ones); free(zeros); free(rstd);
                for (pass = 0; pass < 2; pass++) { free(dx[pass]); free(dw[pass]); free(db[pass]); }
                if (ct->failed) return;
            }
}

/* ---- BatchNorm ---- */

/* Reference over the concatenated batch in NCS: x[(n*C + c)*S + s]. */
static void ref_bn(int64_t N, int64_t C, int64_t S, const double *x, const double *w, const double *b, double eps,
                   const double *dy, double *y, double *mean, double *var, double *dx, double *dw, double *db) {
    int64_t n, c, s;
    double cnt = (double)(N * S);
    for (c = 0; c < C; c++) {
        double m = 0, v = 0, is, sdy = 0, sdyx = 0;
        for (n = 0; n < N; n++) for (s = 0; s < S; s++) m += x[(n * C + c) * S + s];
        m /= cnt;
        for (n = 0; n < N; n++) for (s = 0; s < S; s++) v += pow(x[(n * C + c) * S + s] - m, 2);
        v /= cnt;
        is = 1.0 / sqrt(v + eps);
        mean[c] = m; var[c] = v;
        for (n = 0; n < N; n++)
            for (s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                y[i] = (x[i] - m) * is * w[c] + b[c];
                if (dy) { sdy += dy[i]; sdyx += dy[i] * (x[i] - m); }
            }
        if (!dy) continue;
        dw[c] = sdyx * is; db[c] = sdy;
        for (n = 0; n < N; n++)
            for (s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                dx[i] = (dy[i] - sdy / cnt - (x[i] - m) * is * is * sdyx / cnt) * is * w[c];
            }
    }
}
static double ref_bn_loss(int64_t N, int64_t C, int64_t S, const double *x, const double *w, const double *b,
                          const double *dy) {
    double *y = dalloc(N * C * S), m[16], v[16], s = 0;
    int64_t i;
    ref_bn(N, C, S, x, w, b, 1e-5, NULL, y, m, v, NULL, NULL, NULL);
    for (i = 0; i < N * C * S; i++) s += y[i] * dy[i];
    free(y);
    return s;
}
/* NCS index -> NSC index */
static int64_t nsc(int64_t i, int64_t C, int64_t S) {
    int64_t s = i % S, c = (i / S) % C, n = i / (S * C);
    return (n * S + s) * C + c;
}

static void bn_case(ct_state *ct, int64_t N, int64_t C, int64_t S, capex_bn_layout lay, capex_dtype xt, capex_dtype pt) {
    int64_t T = N * C * S, i, c;
    void *x = talloc(xt, T), *y = talloc(xt, T), *dy = talloc(xt, T), *dx = talloc(xt, T);
    void *w = talloc(pt, C), *b = talloc(pt, C), *rm = talloc(pt, C), *rv = talloc(pt, C), *dw = talloc(pt, C),
         *db = talloc(pt, C);
    double *xd = dalloc(T), *dyd = dalloc(T), *yr = dalloc(T), *dxr = dalloc(T), *wd = dalloc(C), *bd = dalloc(C);
    double *mr = dalloc(C), *vr = dalloc(C), *dwr = dalloc(C), *dbr = dalloc(C), *tmp = dalloc(T), *rmd = dalloc(C),
           *rvd = dalloc(C);
    float *sm = (float *)talloc(CAPEX_F32, C), *si = (float *)talloc(CAPEX_F32, C);
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    double err;
    fill(xt, x, tmp, T, 0.5, 2.0);
    fill(xt, dy, dxr, T, 0.0, 1.0);
    for (i = 0; i < T; i++) { /* the reference works in NCS */
        int64_t j = lay == CAPEX_BN_NSC ? nsc(i, C, S) : i;
        xd[i] = getv(xt, x, j); dyd[i] = getv(xt, dy, j);
    }
    fill(pt, w, wd, C, 1.0, 0.5);
    fill(pt, b, bd, C, 0.0, 0.5);
    fill(pt, rm, rmd, C, 0.0, 1.0);
    fill(pt, rv, rvd, C, 1.5, 0.5);
    ref_bn(N, C, S, xd, wd, bd, 1e-5, dyd, yr, mr, vr, dxr, dwr, dbr);
    capex_batch_norm_desc_init(&d);
    capex_batch_norm_args_init(&a);
    a.n = N; a.c = C; a.s = S; a.layout = lay; a.x_dtype = a.y_dtype = xt; a.param_dtype = pt;
    a.x = x; a.y = y; a.weight = w; a.bias = b; a.running_mean = rm; a.running_var = rv;
    a.save_mean = sm; a.save_invstd = si; a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(a.total_count == N * S, "total_count %lld", (long long)a.total_count);
    for (i = 0; i < T; i++) tmp[lay == CAPEX_BN_NSC ? nsc(i, C, S) : i] = yr[i];
    CT_CHECK(close_to(xt, y, tmp, T, dtype_tol(xt), &err), "bn y N=%lld C=%lld S=%lld lay=%d xt=%d: %g", (long long)N,
             (long long)C, (long long)S, lay, xt, err);
    for (c = 0; c < C; c++) {
        double rme = 0.9 * rmd[c] + 0.1 * mr[c], rve = 0.9 * rvd[c] + 0.1 * vr[c] * (double)(N * S) / (double)(N * S - 1);
        CT_CHECK(fabs(getv(pt, rm, c) - rme) <= dtype_tol(pt) * (1 + fabs(rme)), "running_mean[%lld] %g vs %g",
                 (long long)c, getv(pt, rm, c), rme);
        CT_CHECK(fabs(getv(pt, rv, c) - rve) <= dtype_tol(pt) * (1 + fabs(rve)), "running_var[%lld] %g vs %g (unbiased)",
                 (long long)c, getv(pt, rv, c), rve);
        CT_CHECK(fabs(sm[c] - mr[c]) <= 1e-5 * (1 + fabs(mr[c])), "save_mean");
        CT_CHECK(fabs(si[c] - 1 / sqrt(vr[c] + 1e-5)) <= 1e-4 / sqrt(vr[c] + 1e-5), "save_invstd");
    }
    CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < T; i++) tmp[lay == CAPEX_BN_NSC ? nsc(i, C, S) : i] = dxr[i];
    {
        double mi = 0;
        for (c = 0; c < C; c++) if (1 / sqrt(vr[c] + 1e-5) > mi) mi = 1 / sqrt(vr[c] + 1e-5);
        CT_CHECK(close_to_s(xt, dx, tmp, T, dtype_tol(xt) * 5, maxabs(dyd, T) * maxabs(wd, C) * mi, &err), "bn dx: %g",
                 err);
    }
    CT_CHECK(close_to(pt, dw, dwr, C, dtype_tol(pt) * 5, &err), "bn dweight: %g", err);
    CT_CHECK(close_to(pt, db, dbr, C, dtype_tol(pt) * 5, &err), "bn dbias: %g", err);
    /* eval: running statistics, no update */
    d.training = 0;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < T; i++) {
        int64_t j = lay == CAPEX_BN_NSC ? nsc(i, C, S) : i;
        int64_t ch = (i / S) % C;
        double rmv = getv(pt, rm, ch), rvv = getv(pt, rv, ch);
        tmp[j] = (xd[i] - rmv) / sqrt(rvv + 1e-5) * wd[ch] + bd[ch];
    }
    CT_CHECK(close_to(xt, y, tmp, T, dtype_tol(xt), &err), "bn eval y: %g", err);
    CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < T; i++) {
        int64_t j = lay == CAPEX_BN_NSC ? nsc(i, C, S) : i;
        int64_t ch = (i / S) % C;
        tmp[j] = dyd[i] / sqrt(getv(pt, rv, ch) + 1e-5) * wd[ch];
    }
    CT_CHECK(close_to(xt, dx, tmp, T, dtype_tol(xt) * 5, &err), "bn eval dx: %g", err);
    free(x); free(y); free(dy); free(dx); free(w); free(b); free(rm); free(rv); free(dw); free(db);
    free(xd); free(dyd); free(yr); free(dxr); free(wd); free(bd); free(mr); free(vr); free(dwr); free(dbr); free(tmp);
    free(rmd); free(rvd); free(sm); free(si);
}

CT_TEST(batch_norm_layouts_dtypes_eval) {
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    int lay, xi;
    for (lay = 0; lay < 2; lay++)
        for (xi = 0; xi < 3; xi++) {
            bn_case(ct, 4, 3, 7, (capex_bn_layout)lay, ts[xi], CAPEX_F32); /* keep_batchnorm_fp32 */
            if (ct->failed) return;
            bn_case(ct, 3, 5, 1, (capex_bn_layout)lay, ts[xi], ts[xi]);   /* [N, C], params in x's dtype */
            if (ct->failed) return;
        }
    bn_case(ct, 2, 2, 1, CAPEX_BN_NCS, CAPEX_F32, CAPEX_F32); /* 2 values per channel: unbiased n/(n-1) = 2 */
    if (ct->failed) return;
    bn_case(ct, 40, 17, 90, CAPEX_BN_NSC, CAPEX_F32, CAPEX_F32); /* several NSC row blocks */
    if (ct->failed) return;
    bn_case(ct, 8, 6, 200, CAPEX_BN_NCS, CAPEX_F16, CAPEX_F32);
}

CT_TEST(batch_norm_finite_differences) {
    const int64_t N = 3, C = 2, S = 3, T = 18;
    float x[18], dy[18], y[18], dx[18], w[2], b[2], dw[2], db[2], sm[2], si[2];
    double xd[18], dyd[18], wd[2], bd[2], h = 1e-6;
    capex_batch_norm_args a;
    int64_t i;
    fill(CAPEX_F32, x, xd, T, 0.0, 1.0);
    fill(CAPEX_F32, dy, dyd, T, 0.0, 1.0);
    fill(CAPEX_F32, w, wd, C, 1.0, 0.5);
    fill(CAPEX_F32, b, bd, C, 0.0, 0.5);
    capex_batch_norm_args_init(&a);
    a.n = N; a.c = C; a.s = S; a.x = x; a.y = y; a.weight = w; a.bias = b; a.save_mean = sm; a.save_invstd = si;
    a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
    CT_CHECK(capex_batch_norm_forward(NULL, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_batch_norm_backward(NULL, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < T; i++) {
        double s = xd[i], fd;
        xd[i] = s + h; fd = ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        xd[i] = s - h; fd -= ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        xd[i] = s; fd /= 2 * h;
        CT_CHECK(fabs(fd - dx[i]) <= 1e-4 * (1 + fabs(fd)), "dx[%lld] fd %g capex %g", (long long)i, fd, (double)dx[i]);
    }
    for (i = 0; i < C; i++) {
        double s = wd[i], fd;
        wd[i] = s + h; fd = ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        wd[i] = s - h; fd -= ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        wd[i] = s; fd /= 2 * h;
        CT_CHECK(fabs(fd - dw[i]) <= 1e-4 * (1 + fabs(fd)), "dw fd %g capex %g", fd, (double)dw[i]);
        s = bd[i];
        bd[i] = s + h; fd = ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        bd[i] = s - h; fd -= ref_bn_loss(N, C, S, xd, wd, bd, dyd);
        bd[i] = s; fd /= 2 * h;
        CT_CHECK(fabs(fd - db[i]) <= 1e-4 * (1 + fabs(fd)), "db fd %g capex %g", fd, (double)db[i]);
    }
}

/* A large mean over a small spread (1e4 + 1e-2 * U(-1, 1) in f32: mean/std ~ 1.7e6), rows and
   channels of up to 2^16 values, against float64 over the same f32 inputs: the mean within one
   f32 ulp, rstd / invstd and the unbiased running_var within 1e-4. A plain f32 Welford chain
   stalls here (d / n falls below half an ulp of the mean, which then stops moving): rstd was
   1-4% off before 2026-11-28 (LayerNorm rows, BatchNorm NSC blocks and NCS rows). */
static int within_ulp(float got, double want) { return fabs((double)got - want) <= fabs(want) * 1.2e-7; }
CT_TEST(large_mean_small_noise_variance_vs_float64) {
    static const int64_t widths[] = {17, 100, 4097, 65536};
    static const int64_t shapes[][2] = {{4096, 1}, {1024, 16}, {8, 4096}, {2, 65536}}; /* BatchNorm N, S */
    size_t k;
    for (k = 0; k < sizeof widths / sizeof widths[0]; k++) {
        const int64_t C = widths[k], R = 2;
        float *x = (float *)talloc(CAPEX_F32, R * C), *y = (float *)talloc(CAPEX_F32, R * C), mean[2], rstd[2];
        double *xd = dalloc(R * C), *yr = dalloc(R * C), mr[2], rr[2];
        capex_norm_args a;
        int64_t r, j;
        fill(CAPEX_F32, x, xd, R * C, 1e4, 1e-2);
        ref_norm(0, R, C, xd, NULL, NULL, 1e-5, yr, mr, rr);
        capex_norm_args_init(&a);
        a.rows = R; a.cols = C; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
        CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
        for (r = 0; r < R; r++) {
            double ym = 0;
            CT_CHECK(within_ulp(mean[r], mr[r]), "cols %lld: mean %.9g, float64 %.9g", (long long)C, (double)mean[r], mr[r]);
            CT_CHECK(fabs(rstd[r] - rr[r]) <= 1e-4 * rr[r], "cols %lld: rstd %.7g, float64 %.7g (rel %.3g)", (long long)C,
                     (double)rstd[r], rr[r], fabs(rstd[r] - rr[r]) / rr[r]);
            /* y against float64 from capex's own (checked) f32 mean: that mean's rounding alone moves y by ~0.1 */
            for (j = 0; j < C; j++) {
                double e = fabs(y[r * C + j] - (xd[r * C + j] - (double)mean[r]) * rr[r]);
                if (e > ym) ym = e;
            }
            CT_CHECK(ym <= 1e-3, "cols %lld: y off by %g", (long long)C, ym);
        }
        free(x); free(y); free(xd); free(yr);
        if (ct->failed) return;
    }
    for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int lay;
        for (lay = 0; lay < 2; lay++) {
            const int64_t N = shapes[k][0], S = shapes[k][1], C = 2, T = N * C * S;
            float *x = (float *)talloc(CAPEX_F32, T), *y = (float *)talloc(CAPEX_F32, T), sm[2], si[2], rm[2] = {0, 0},
                  rv[2] = {0, 0};
            double *tmp = dalloc(T), *xd = dalloc(T), *yr = dalloc(T), wd[2] = {1, 1}, bd[2] = {0, 0}, mr[2], vr[2];
            capex_batch_norm_desc d;
            capex_batch_norm_args b;
            int64_t i, c;
            fill(CAPEX_F32, x, tmp, T, 1e4, 1e-2);
            for (i = 0; i < T; i++) xd[i] = x[lay == CAPEX_BN_NSC ? nsc(i, C, S) : i];
            ref_bn(N, C, S, xd, wd, bd, 1e-5, NULL, yr, mr, vr, NULL, NULL, NULL);
            capex_batch_norm_desc_init(&d);
            d.momentum = 1.0f; /* running_var = the unbiased batch variance, exactly */
            capex_batch_norm_args_init(&b);
            b.n = N; b.c = C; b.s = S; b.layout = (capex_bn_layout)lay; b.x = x; b.y = y; b.save_mean = sm;
            b.save_invstd = si; b.running_mean = rm; b.running_var = rv;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
            for (c = 0; c < C; c++) {
                const double is = 1.0 / sqrt(vr[c] + 1e-5), unb = vr[c] * (double)(N * S) / (double)(N * S - 1);
                CT_CHECK(within_ulp(sm[c], mr[c]), "BatchNorm N %lld S %lld layout %d: mean %.9g, float64 %.9g",
                         (long long)N, (long long)S, lay, (double)sm[c], mr[c]);
                CT_CHECK(fabs(si[c] - is) <= 1e-4 * is, "BatchNorm N %lld S %lld layout %d: invstd %.7g, float64 %.7g (rel %.3g)",
                         (long long)N, (long long)S, lay, (double)si[c], is, fabs(si[c] - is) / is);
                CT_CHECK(fabs(rv[c] - unb) <= 1e-4 * unb, "BatchNorm N %lld S %lld layout %d: running_var %.7g, float64 %.7g",
                         (long long)N, (long long)S, lay, (double)rv[c], unb);
            }
            free(x); free(y); free(tmp); free(xd); free(yr);
            if (ct->failed) return;
        }
    }
}

/* Rows of 2^20 and 3*2^18+5 nearly equal values (0.7 + small noise, dy 0.9 +
   noise, weight 1 + 1e-3 noise): RMSNorm forward rstd and y, LayerNorm
   forward mean and rstd, and both backwards' dx, dweight, dbias against
   float64, x in f32, f16 and bf16. The backward references take capex's own
   saved mean and rstd, so dx checks the row dots alone. Tolerances are what
   f32 pairwise summation gives: 2 ulp per level, log2(n) levels (4.8e-6 at
   2^20), twice that for dx, plus one rounding of a half dx. Seen failing: one
   f32 chain per lane over the whole row gave rstd 6.8e-5 and dx 8e-4 off
   (RMSNorm sum of squares, LayerNorm backward row dots; fixed 2026-11-28). */
CT_TEST(long_rows_sums_vs_float64) {
    static const int64_t widths[] = {1 << 20, 3 * (1 << 18) + 5};
    static const capex_dtype dts[] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    size_t wi, di;
    int rms;
    for (wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (di = 0; di < sizeof dts / sizeof dts[0]; di++)
            for (rms = 0; rms < 2; rms++) {
                const int64_t C = widths[wi], R = 2, N = R * C;
                const capex_dtype xt = dts[di];
                const double spread = xt == CAPEX_F32 ? 1e-3 : 1e-2, tol = 2.0 * ldexp(1.0, -23) * log2((double)C);
                const double half = xt == CAPEX_F32 ? 0.0 : xt == CAPEX_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
                const char *what = rms ? "rms" : "layer";
                void *x = talloc(xt, N), *dx = talloc(xt, N);
                float *y = (float *)talloc(CAPEX_F32, N), *dy = (float *)talloc(CAPEX_F32, N), *w = (float *)talloc(CAPEX_F32, C), *b = (float *)talloc(CAPEX_F32, C);
                float *dw = (float *)talloc(CAPEX_F32, C), *db = (float *)talloc(CAPEX_F32, C), mean[2], rstd[2];
                double *xd = dalloc(N), *dyd = dalloc(N), *wd = dalloc(C), *bd = dalloc(C), *yr = dalloc(N), mr[2], rr[2];
                double *dxr = dalloc(N), *dwr = dalloc(C), *dbr = dalloc(C), err, ym = 0, dxm = 0;
                capex_norm_args a;
                int64_t r, j;
                fill(xt, x, xd, N, 0.7, spread);
                fill(CAPEX_F32, dy, dyd, N, 0.9, spread);
                fill(CAPEX_F32, w, wd, C, 1.0, 1e-3);
                fill(CAPEX_F32, b, bd, C, 0.0, 0.1);
                capex_norm_args_init(&a);
                a.rows = R; a.cols = C; a.x_dtype = xt; /* y, dy f32: y unrounded */
                a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd;
                CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
                ref_norm(rms, R, C, xd, wd, rms ? NULL : bd, 1e-5, yr, mr, rr);
                for (r = 0; r < R; r++) {
                    CT_CHECK(fabs(rstd[r] - rr[r]) <= tol * rr[r], "%s C=%lld x dtype %d: rstd %.9g, float64 %.9g (rel %.3g, tol %.3g)",
                             what, (long long)C, xt, (double)rstd[r], rr[r], fabs(rstd[r] - rr[r]) / rr[r], tol);
                    if (!rms)
                        CT_CHECK(fabs(mean[r] - mr[r]) <= tol * fabs(mr[r]), "layer C=%lld x dtype %d: mean %.9g, float64 %.9g",
                                 (long long)C, xt, (double)mean[r], mr[r]);
                }
                if (rms) CT_CHECK(close_to(CAPEX_F32, y, yr, N, tol, &err), "rms C=%lld x dtype %d: y rel err %.3g (tol %.3g)",
                                  (long long)C, xt, err, tol);
                /* backward references from capex's saved mean and rstd */
                for (j = 0; j < C; j++) { dwr[j] = 0; dbr[j] = 0; }
                for (r = 0; r < R; r++) {
                    const double m = rms ? 0.0 : (double)mean[r], rs = (double)rstd[r];
                    double mg = 0, mgx = 0;
                    for (j = 0; j < C; j++) {
                        const double g = dyd[r * C + j] * wd[j], xh = (xd[r * C + j] - m) * rs;
                        mg += g; mgx += g * xh;
                        dwr[j] += dyd[r * C + j] * xh; dbr[j] += dyd[r * C + j];
                    }
                    mg = rms ? 0.0 : mg / (double)C; mgx /= (double)C;
                    for (j = 0; j < C; j++) {
                        const double g = dyd[r * C + j] * wd[j], xh = (xd[r * C + j] - m) * rs;
                        dxr[r * C + j] = rs * (g - mg - xh * mgx);
                    }
                }
                a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = rms ? NULL : db;
                CT_CHECK((rms ? capex_rms_norm_backward(NULL, &a) : capex_layer_norm_backward(NULL, &a)) == CAPEX_OK, "%s",
                         capex_last_error());
                ym = maxabs(dyd, N) * maxabs(rr, R) * maxabs(wd, C); /* dx's terms */
                dxm = maxabs(dxr, N);
                CT_CHECK(close_to_s(xt, dx, dxr, N, 2.0 * tol + half * dxm / ym, ym, &err),
                         "%s C=%lld x dtype %d: dx off by %.3g of its terms (tol %.3g)", what, (long long)C, xt, err,
                         2.0 * tol + half * dxm / ym);
                CT_CHECK(close_to(CAPEX_F32, dw, dwr, C, tol, &err), "%s C=%lld x dtype %d: dweight rel err %.3g", what,
                         (long long)C, xt, err);
                if (!rms) CT_CHECK(close_to(CAPEX_F32, db, dbr, C, tol, &err), "layer C=%lld x dtype %d: dbias rel err %.3g",
                                   (long long)C, xt, err);
                free(x); free(dy); free(dx); free(y); free(w); free(b); free(dw); free(db);
                free(xd); free(dyd); free(wd); free(bd); free(yr); free(dxr); free(dwr); free(dbr);
                if (ct->failed) return;
            }
}

/* Finite f32 values past 1.8e19 (their square overflows) with a small spread:
   LayerNorm rows of 1..20 columns and BatchNorm channels of 4 and 12 values in
   both layouts give the float64 results, not NaN. Seen failing: the Welford
   lane merge computed d * d * n * 0 = inf * 0 for an empty lane (rows under 16
   columns, NCS segments under 16 values), NaN; NSC gave finite values for the
   same batch. */
CT_TEST(huge_f32_values_short_rows_stay_finite) {
    float x[40], y[40], mean[2], rstd[2], sm[2], si[2], rm[2], rv[2];
    double xd[40], yr[40], mr[2], vr[2], wd[2] = {1, 1}, bd[2] = {0, 0}, err;
    capex_norm_args a;
    capex_batch_norm_desc d;
    capex_batch_norm_args b;
    int64_t cols, i, S, lay;
    for (cols = 1; cols <= 20; cols++) {
        for (i = 0; i < 2 * cols; i++) { x[i] = 1e20f * (1.0f + 1e-4f * (float)sin(1.3 * (double)i)); xd[i] = x[i]; }
        capex_norm_args_init(&a);
        a.rows = 2; a.cols = cols; a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
        CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
        ref_norm(0, 2, cols, xd, NULL, NULL, 1e-5, yr, NULL, NULL);
        CT_CHECK(close_to_s(CAPEX_F32, y, yr, 2 * cols, 1e-2, 1.0, &err), "LayerNorm cols %lld: y err %g (y[0] = %g)",
                 (long long)cols, err, (double)y[0]);
        CT_CHECK(mean[0] == mean[0] && rstd[0] == rstd[0] && rstd[1] == rstd[1], "cols %lld: mean %g rstd %g", (long long)cols,
                 (double)mean[0], (double)rstd[0]);
    }
    capex_batch_norm_desc_init(&d);
    for (S = 1; S <= 3; S += 2)
        for (lay = 0; lay < 2; lay++) {
            const int64_t T = 4 * 2 * S;
            for (i = 0; i < T; i++) { x[i] = 1e20f * (1.0f + 1e-4f * (float)sin(0.7 * (double)i)); xd[i] = x[i]; }
            ref_bn(4, 2, S, xd, wd, bd, 1e-5, NULL, yr, mr, vr, NULL, NULL, NULL);
            if (lay == CAPEX_BN_NSC) { /* the same values, channels last */
                float t[40];
                for (i = 0; i < T; i++) t[nsc(i, 2, S)] = x[i];
                memcpy(x, t, sizeof t);
            }
            rm[0] = rm[1] = 0.0f; rv[0] = rv[1] = 1.0f;
            capex_batch_norm_args_init(&b);
            b.n = 4; b.c = 2; b.s = S; b.layout = (capex_bn_layout)lay; b.x = x; b.y = y; b.save_mean = sm; b.save_invstd = si;
            b.running_mean = rm; b.running_var = rv;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
            for (i = 0; i < T; i++) {
                const double got = y[lay == CAPEX_BN_NSC ? nsc(i, 2, S) : i];
                CT_CHECK(fabs(got - yr[i]) <= 1e-2, "BatchNorm S %lld layout %lld: y[%lld] = %g, float64 %g", (long long)S,
                         (long long)lay, (long long)i, got, yr[i]);
            }
            CT_CHECK(fabs(rv[0] - (0.9 + 0.1 * vr[0] * 4 * S / (4 * S - 1))) <= 1e-2 * rv[0], "running_var %g", (double)rv[0]);
        }
}

CT_TEST(batch_norm_constant_channel_and_no_running_stats) {
    float x[12], y[12], sm[2], si[2];
    capex_batch_norm_args a;
    capex_batch_norm_desc d;
    int i;
    for (i = 0; i < 12; i++) x[i] = (i / 3) % 2 ? 5.0f : -2.5f; /* N=2, C=2, S=3: each channel constant */
    capex_batch_norm_desc_init(&d);
    d.training = 0; /* no running stats: batch statistics anyway (torch) */
    capex_batch_norm_args_init(&a);
    a.n = 2; a.c = 2; a.s = 3; a.x = x; a.y = y; a.save_mean = sm; a.save_invstd = si;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(sm[0] == -2.5f && sm[1] == 5.0f, "means %g %g", (double)sm[0], (double)sm[1]);
    CT_CHECK(si[0] == 1.0f / sqrtf(1e-5f) && si[1] == si[0], "variance exactly 0: invstd %g", (double)si[0]);
    for (i = 0; i < 12; i++) CT_CHECK(y[i] == 0.0f, "y[%d] = %g", i, (double)y[i]);
    /* one value per channel: torch's batch-statistics path refuses it in eval too */
    a.n = 1; a.s = 1;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "more than 1"),
             "eval without running stats, 1 value per channel: %s", capex_last_error());
}

/* An empty batch (n = 0) without a collective, as torch 2.15's nn.BatchNorm1d/2d
   (checked with tests/gen_norm_ref.py's torch): an empty output, running
   statistics untouched, num_batches_tracked +1 in training with running stats
   only, dweight/dbias 0 from the backward; in training and eval, with and
   without running stats, both layouts, comm NULL and a world-of-one comm, eps 0
   too (dweight 0, not 0 * inf). Seen failing: refused with "more than 1 value
   per channel" (torch's message for one value, not zero). */
CT_TEST(batch_norm_empty_batch_as_torch) {
    float w[3] = {1.5f, 2, 3}, b[3] = {0.1f, 0.2f, 0.3f}, rm[3], rv[3], sm[3], si[3], dw[3], db[3], dxs[1];
    capex_batch_norm_args a;
    capex_batch_norm_desc d;
    capex_comm single;
    int64_t tracked;
    int lay, training, track, use_comm, e, i;
    CT_CHECK(capex_comm_init_single(&single) == CAPEX_OK, "single: %s", capex_last_error());
    for (lay = 0; lay < 2; lay++)
        for (training = 0; training < 2; training++)
            for (track = 0; track < 2; track++)
                for (use_comm = 0; use_comm < 2; use_comm++)
                    for (e = 0; e < 2; e++) {
                        capex_batch_norm_desc_init(&d);
                        d.training = training; d.eps = e ? 0.0f : 1e-5f;
                        capex_batch_norm_args_init(&a);
                        a.n = 0; a.c = 3; a.s = 4; a.layout = (capex_bn_layout)lay; a.weight = w; a.bias = b;
                        for (i = 0; i < 3; i++) { rm[i] = 0.5f; rv[i] = 2.0f; sm[i] = si[i] = dw[i] = db[i] = -99.0f; }
                        if (track) { a.running_mean = rm; a.running_var = rv; }
                        tracked = 7; a.num_batches_tracked = &tracked;
                        a.save_mean = sm; a.save_invstd = si; a.total_count = -5;
                        if (track && !training) continue; /* eval with running stats below */
                        CT_CHECK(capex_batch_norm_forward(&d, use_comm ? &single : NULL, &a) == CAPEX_OK,
                                 "lay %d training %d track %d comm %d: %s", lay, training, track, use_comm, capex_last_error());
                        if (ct->failed) return;
                        CT_CHECK(tracked == (training && track ? 8 : 7), "num_batches_tracked %lld", (long long)tracked);
                        CT_CHECK(a.total_count == 0, "total_count %lld", (long long)a.total_count);
                        for (i = 0; i < 3; i++) {
                            CT_CHECK(rm[i] == 0.5f && rv[i] == 2.0f, "running stats moved: %g %g", (double)rm[i], (double)rv[i]);
                            CT_CHECK(sm[i] == 0.0f && si[i] == 1.0f / sqrtf(d.eps), "save %g %g", (double)sm[i], (double)si[i]);
                        }
                        a.dweight = dw; a.dbias = db;
                        a.dx = e ? dxs : NULL; /* an empty dx too: nothing written */
                        dxs[0] = -99.0f;
                        CT_CHECK(capex_batch_norm_backward(&d, use_comm ? &single : NULL, &a) == CAPEX_OK, "backward: %s",
                                 capex_last_error());
                        CT_CHECK(dxs[0] == -99.0f, "an empty batch's backward wrote dx");
                        for (i = 0; i < 3; i++)
                            CT_CHECK(dw[i] == 0.0f && db[i] == 0.0f, "eps %g: dweight %g dbias %g", (double)d.eps, (double)dw[i],
                                     (double)db[i]);
                        if (ct->failed) return;
                    }
    /* eval with running statistics: already the running ones */
    capex_batch_norm_desc_init(&d);
    d.training = 0;
    capex_batch_norm_args_init(&a);
    a.n = 0; a.c = 3; a.s = 4; a.weight = w; a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si;
    tracked = 7; a.num_batches_tracked = &tracked;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK && tracked == 7 && sm[0] == 0.5f, "eval: %s",
             capex_last_error());
    a.dweight = dw; dw[0] = -99.0f;
    CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK && dw[0] == 0.0f, "eval backward: %s", capex_last_error());
    /* one value stays torch's error; a forward that never ran (total_count 0 with values) stays refused */
    capex_batch_norm_desc_init(&d);
    a.running_mean = a.running_var = NULL; a.n = 1; a.s = 1; a.x = w; a.y = dw;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "more than 1 value per channel");
    a.total_count = 0; a.dy = w;
    EXPECT_ERR(capex_batch_norm_backward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "total_count");
    capex_comm_destroy(&single);
}

/* torch.nn.functional.layer_norm(x, shape, weight=None, bias=b): the bias has a
   gradient, sum over rows of dy; dx as without affine. */
/* inf / NaN inputs stay where torch keeps them: a LayerNorm/RMSNorm row with one (first, middle
   or last element) leaves every other row's y and dx bit-identical to a call without it (rows are
   independent); in its own row LayerNorm's y is all NaN (mean or variance non-finite), RMSNorm's
   y is x * rsqrt(inf) = 0 except the bad element (NaN) for an inf, all NaN for a NaN. BatchNorm
   in training (both layouts): the other channel's y, save statistics and running statistics
   are bit-identical to a clean call. */
CT_TEST(nonfinite_inputs_stay_in_their_row_or_channel) {
    static const float bad[3] = {INFINITY, -INFINITY, NAN};
    enum { R = 3, C = 21 };
    float x[R * C], xc[R * C], dy[R * C], y[R * C], yc[R * C], dx[R * C], dxc[R * C], m[R], rs[R];
    int rms, bi, pos, i, j;
    for (i = 0; i < R * C; i++) { xc[i] = (float)(1.0 + 0.5 * sin(0.9 * i)); dy[i] = (float)cos(1.7 * i); }
    for (rms = 0; rms < 2; rms++) {
        capex_norm_args a;
        capex_norm_args_init(&a);
        a.rows = R; a.cols = C; a.x = xc; a.y = yc; a.mean = m; a.rstd = rs; a.dy = dy; a.dx = dxc;
        CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK((rms ? capex_rms_norm_backward(NULL, &a) : capex_layer_norm_backward(NULL, &a)) == CAPEX_OK, "%s", capex_last_error());
        for (bi = 0; bi < 3; bi++)
            for (pos = 0; pos < C; pos += 10) { /* element 0, 10, 20 of row 1 */
                memcpy(x, xc, sizeof x);
                x[C + pos] = bad[bi];
                a.x = x; a.y = y; a.dx = dx;
                CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "fwd");
                CT_CHECK((rms ? capex_rms_norm_backward(NULL, &a) : capex_layer_norm_backward(NULL, &a)) == CAPEX_OK, "bwd");
                for (j = 0; j < C; j++) {
                    const float v = y[C + j];
                    CT_CHECK(!memcmp(&y[j], &yc[j], 4) && !memcmp(&y[2 * C + j], &yc[2 * C + j], 4) &&
                             !memcmp(&dx[j], &dxc[j], 4) && !memcmp(&dx[2 * C + j], &dxc[2 * C + j], 4),
                             "rms=%d bad %g at %d: clean rows changed at column %d", rms, (double)bad[bi], pos, j);
                    if (!rms || bi == 2 || j == pos) CT_CHECK(v != v, "rms=%d bad %g at %d: y[%d] = %g, want NaN", rms, (double)bad[bi], pos, j, (double)v);
                    else CT_CHECK(v == 0.0f, "rms=%d bad %g at %d: y[%d] = %g, want 0 (x * rsqrt(inf))", rms, (double)bad[bi], pos, j, (double)v);
                }
                if (ct->failed) return;
            }
    }
    {
        int lay;
        for (lay = 0; lay < 2; lay++)
            for (bi = 0; bi < 3; bi++) {
                /* N = 4, C = 2, S = 3; the bad value in channel 0 of sample 1 */
                float bx[24], bxc[24], by[24], byc[24], sm[2], si[2], smc[2], sic[2], rm[2] = {0, 0}, rv[2] = {1, 1},
                      rmc[2] = {0, 0}, rvc[2] = {1, 1};
                capex_batch_norm_args b;
                for (i = 0; i < 24; i++) bxc[i] = (float)(2.0 + sin(1.1 * i));
                memcpy(bx, bxc, sizeof bx);
                bx[lay == CAPEX_BN_NSC ? (1 * 3 + 1) * 2 + 0 : (1 * 2 + 0) * 3 + 1] = bad[bi];
                capex_batch_norm_args_init(&b);
                b.n = 4; b.c = 2; b.s = 3; b.layout = (capex_bn_layout)lay; b.x = bxc; b.y = byc; b.save_mean = smc;
                b.save_invstd = sic; b.running_mean = rmc; b.running_var = rvc;
                CT_CHECK(capex_batch_norm_forward(NULL, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
                b.x = bx; b.y = by; b.save_mean = sm; b.save_invstd = si; b.running_mean = rm; b.running_var = rv;
                CT_CHECK(capex_batch_norm_forward(NULL, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
                CT_CHECK(sm[1] == smc[1] && si[1] == sic[1] && rm[1] == rmc[1] && rv[1] == rvc[1] && sm[0] != sm[0] && rv[0] != rv[0],
                         "layout %d bad %g: channel 1 mean %g/%g invstd %g/%g running %g/%g; channel 0 mean %g running_var %g",
                         lay, (double)bad[bi], (double)sm[1], (double)smc[1], (double)si[1], (double)sic[1], (double)rv[1],
                         (double)rvc[1], (double)sm[0], (double)rv[0]);
                for (i = 0; i < 24; i++) {
                    const int ch = lay == CAPEX_BN_NSC ? i % 2 : (i / 3) % 2;
                    if (ch == 1) CT_CHECK(!memcmp(&by[i], &byc[i], 4), "layout %d: channel 1 y[%d] changed", lay, i);
                    else CT_CHECK(by[i] != by[i], "layout %d bad %g: channel 0 y[%d] = %g, want NaN", lay, (double)bad[bi], i, (double)by[i]);
                }
                if (ct->failed) return;
            }
    }
}

CT_TEST(layer_norm_bias_without_weight) {
    float x[6] = {1, 2, 4, -1, 0, 3}, b[3] = {0.5f, -1, 2}, y[6], mean[2], rstd[2], dy[6] = {1, 2, 3, 4, 5, 6}, dx[6], db[3];
    capex_norm_args a;
    capex_norm_args_init(&a);
    a.rows = 2; a.cols = 3; a.x = x; a.y = y; a.bias = b; a.mean = mean; a.rstd = rstd;
    CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    a.dy = dy; a.dx = dx; a.dbias = db;
    CT_CHECK(capex_layer_norm_backward(NULL, &a) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(db[0] == 5.0f && db[1] == 7.0f && db[2] == 9.0f, "dbias = column sums of dy: %g %g %g", (double)db[0],
             (double)db[1], (double)db[2]);
}

/* Eval backward is dx = dy * invstd * w (torch: the batch terms do not exist
   in eval). An inf or NaN in dy or x stays where it is: the other values of
   its channel are dy * invstd * w, exactly, in both layouts. Seen failing:
   the batch terms computed as 0 * sum, NaN when a sum is not finite, spread
   NaN over the whole channel. */
CT_TEST(batch_norm_eval_backward_nonfinite_stays_local) {
    enum { N = 3, C = 2, S = 4, E = N * C * S };
    float x[E], y[E], dy[E], dx[E], w[C] = {1.5f, -0.75f}, b[C] = {0.25f, 1}, rm[C] = {0.5f, -1}, rv[C] = {2, 0.5f};
    float sm[C], si[C], dw[C], db[C];
    capex_batch_norm_desc d;
    capex_batch_norm_args a;
    int lay, bad, i;
    capex_batch_norm_desc_init(&d);
    d.training = 0;
    for (lay = 0; lay < 2; lay++)
        for (bad = 0; bad < 3; bad++) { /* 0: inf in dy, 1: NaN in dy, 2: inf in x */
            const int at = 5; /* channel of element 5: NCS (5 / S) % C = 1, NSC 5 % C = 1 */
            for (i = 0; i < E; i++) { x[i] = (float)sin(0.9 * i) * 3.0f; dy[i] = (float)cos(1.7 * i); dx[i] = -99.0f; }
            if (bad == 0) dy[at] = INFINITY;
            else if (bad == 1) dy[at] = NAN;
            else x[at] = INFINITY;
            capex_batch_norm_args_init(&a);
            a.n = N; a.c = C; a.s = S; a.layout = (capex_bn_layout)lay; a.x = x; a.y = y; a.weight = w; a.bias = b;
            a.running_mean = rm; a.running_var = rv; a.save_mean = sm; a.save_invstd = si;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            a.dy = dy; a.dx = dx; a.dweight = dw; a.dbias = db;
            CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            for (i = 0; i < E; i++) {
                const int ch = lay == CAPEX_BN_NSC ? i % C : (i / S) % C;
                const float want = dy[i] * (si[ch] * w[ch]);
                if (i == at && bad < 2) CT_CHECK(want != want || isinf(dx[i]), "layout %d case %d: dx[%d] = %g", lay, bad, i, (double)dx[i]);
                else CT_CHECK(dx[i] == want, "layout %d case %d: dx[%d] = %g, dy * invstd * w = %g", lay, bad, i,
                              (double)dx[i], (double)want);
            }
            CT_CHECK(dx[at] != dx[at] || bad != 1, "NaN dy gave dx %g", (double)dx[at]);
        }
}

/* torch momentum=None: after k training batches the running statistics are
   the plain mean of the k batch means and unbiased variances; the counter
   (num_batches_tracked) counts every training forward, in either mode. */
CT_TEST(batch_norm_cumulative_average_momentum_none) {
    enum { N = 4, C = 3, S = 5, K = 4 };
    float x[N * C * S], y[N * C * S], rm[C], rv[C], sm[C], si[C];
    double want_m[C] = {0}, want_v[C] = {0};
    capex_batch_norm_args a;
    capex_batch_norm_desc d;
    int64_t tracked = 0;
    int k, i, ch;
    capex_batch_norm_desc_init(&d);
    d.cumulative_average = 1;
    d.momentum = 0.9f; /* ignored in this mode */
    for (ch = 0; ch < C; ch++) { rm[ch] = 123.0f; rv[ch] = -7.0f; } /* overwritten by the first batch (m = 1) */
    for (k = 0; k < K; k++) {
        for (i = 0; i < N * C * S; i++) x[i] = (float)sin(0.7 * i + 1.3 * k) * (1.0f + (float)k) + (float)k;
        for (ch = 0; ch < C; ch++) { /* float64 reference of this batch */
            double s1 = 0, s2 = 0, mu;
            int n, sp;
            for (n = 0; n < N; n++) for (sp = 0; sp < S; sp++) s1 += x[(n * C + ch) * S + sp];
            mu = s1 / (N * S);
            for (n = 0; n < N; n++) for (sp = 0; sp < S; sp++) s2 += (x[(n * C + ch) * S + sp] - mu) * (x[(n * C + ch) * S + sp] - mu);
            want_m[ch] += mu / K;
            want_v[ch] += s2 / (N * S - 1) / K;
        }
        capex_batch_norm_args_init(&a);
        a.n = N; a.c = C; a.s = S; a.x = x; a.y = y; a.save_mean = sm; a.save_invstd = si;
        a.running_mean = rm; a.running_var = rv; a.num_batches_tracked = &tracked;
        CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "batch %d: %s", k, capex_last_error());
        CT_CHECK(tracked == k + 1, "num_batches_tracked %lld after %d batches", (long long)tracked, k + 1);
    }
    for (ch = 0; ch < C; ch++) {
        CT_CHECK(fabs(rm[ch] - want_m[ch]) <= 1e-5 * (1 + fabs(want_m[ch])), "running_mean[%d] %.8g, average of batch means %.8g", ch, (double)rm[ch], want_m[ch]);
        CT_CHECK(fabs(rv[ch] - want_v[ch]) <= 1e-5 * (1 + fabs(want_v[ch])), "running_var[%d] %.8g, average of unbiased variances %.8g", ch, (double)rv[ch], want_v[ch]);
    }
    /* eval does not count; momentum mode counts too; the factor helper */
    d.training = 0;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK && tracked == K, "eval counted: %lld", (long long)tracked);
    d.training = 1; d.cumulative_average = 0; d.momentum = 0.1f;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK && tracked == K + 1, "momentum mode counts too: %lld", (long long)tracked);
    d.cumulative_average = 1;
    tracked = 3;
    CT_CHECK(capex_batch_norm_momentum(&d, &tracked) == 0.25f && tracked == 4, "1/(n+1)");
    /* the counter is required in this mode, and a bad one is refused without writing */
    for (ch = 0; ch < C; ch++) rm[ch] = 5.0f;
    a.num_batches_tracked = NULL;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_ERR_INVALID_ARG, "missing counter accepted");
    tracked = -1; a.num_batches_tracked = &tracked;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_ERR_INVALID_ARG, "negative counter accepted");
    CT_CHECK(rm[0] == 5.0f && tracked == -1, "a refused call changed the running stats or the counter");
}

CT_TEST(batch_norm_errors) {
    float x[8] = {0}, y[8], w[2] = {1, 1}, rm[2] = {0, 0}, sm[2], si[2];
    capex_batch_norm_args a, g;
    capex_batch_norm_desc d;
    capex_comm single;
    int i;
    capex_batch_norm_desc_init(&d);
    capex_batch_norm_args_init(&g);
    g.n = 2; g.c = 2; g.s = 2; g.x = x; g.y = y; g.weight = w; g.save_mean = sm; g.save_invstd = si;
    for (i = 0; i < 8; i++) y[i] = -99.0f;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, NULL), CAPEX_ERR_INVALID_ARG, "args is NULL");
    a = g; a.c = 0;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "c >= 1");
    a = g; a.x = NULL;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "x is NULL");
    a = g; a.running_mean = rm;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "both running_mean and running_var");
    a = g; a.layout = (capex_bn_layout)5;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "layout");
    a = g; a.n = 1; a.s = 1;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "more than 1 value per channel");
    d.momentum = 1.5f;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &g), CAPEX_ERR_INVALID_ARG, "momentum");
    d.momentum = NAN;
    EXPECT_ERR(capex_batch_norm_forward(&d, NULL, &g), CAPEX_ERR_INVALID_ARG, "momentum");
    capex_batch_norm_desc_init(&d);
    for (i = 0; i < 8; i++) CT_CHECK(y[i] == -99.0f, "y written by a failed call");
    a = g; a.dy = x; a.dx = y; a.total_count = 0;
    EXPECT_ERR(capex_batch_norm_backward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "total_count");
    a = g; a.dy = x; a.save_invstd = NULL; a.total_count = 4;
    EXPECT_ERR(capex_batch_norm_backward(&d, NULL, &a), CAPEX_ERR_INVALID_ARG, "save_invstd (from forward) is NULL");
    CT_CHECK(capex_comm_init_single(&single) == CAPEX_OK, "single");
    a = g;
    CT_CHECK(capex_batch_norm_forward(&d, &single, &a) == CAPEX_OK, "world of one: %s", capex_last_error());
    CT_CHECK(a.total_count == 4, "count");
    capex_comm_destroy(&single);
    {
        float bad[5] = {0, 0, 1, 0, 1e30f}, mean[1], var[1]; /* [hi, lo, var, count_hi, count_lo] */
        EXPECT_ERR(capex_syncbn_merge(bad, 1, 1, mean, var, NULL), CAPEX_ERR_FORMAT, "corrupt count");
        EXPECT_ERR(capex_syncbn_merge(NULL, 1, 1, mean, var, NULL), CAPEX_ERR_INVALID_ARG, "NULL");
    }
}

CT_TEST(amp_dtypes_keep_batchnorm_fp32) {
    capex_amp_config cfg;
    capex_amp_overrides ov;
    capex_dtype p, y;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, NULL, &cfg) == CAPEX_OK, "O2");
    CT_CHECK(capex_batch_norm_amp_dtypes(&cfg, CAPEX_F16, &p, &y) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(p == CAPEX_F32 && y == CAPEX_F16, "O2: fp32 params, half y like cuDNN's mixed batch norm (p %d y %d)", p, y);
    capex_amp_overrides_init(&ov);
    ov.keep_batchnorm_fp32 = CAPEX_TRI_FALSE;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_BF16, &ov, &cfg) == CAPEX_OK, "O2 override");
    CT_CHECK(capex_batch_norm_amp_dtypes(&cfg, CAPEX_BF16, &p, &y) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(p == CAPEX_BF16 && y == CAPEX_BF16, "keep_batchnorm_fp32=False: params %d y %d", p, y);
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, NULL, &cfg) == CAPEX_OK, "O1");
    CT_CHECK(capex_batch_norm_amp_dtypes(&cfg, CAPEX_F16, &p, &y) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(p == CAPEX_F32 && y == CAPEX_F32, "O1: batch norm runs in fp32 (p %d y %d)", p, y);
    CT_CHECK(capex_batch_norm_amp_dtypes(NULL, CAPEX_F16, &p, &y) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
}

/* ---- aliasing: one rule for every norm call (capex.h Norms, "Aliasing") ----
   Every output placed over an input or another output it may not share (at
   the same start, one element in, one element before) is refused with both
   names in the message, and nothing in the arena changes. Slots live in
   regions of REG floats of one arena, with a free region before the first and
   after the last, so a wrongly accepted call stays inside it. */
#define AL_REG 128
enum { LN_X, LN_W, LN_B, LN_Y, LN_MEAN, LN_RSTD, LN_DY, LN_DX, LN_DW, LN_DB, LN_NSLOT };
static const char *const ln_names[LN_NSLOT] = {"x", "weight", "bias", "y", "mean", "rstd", "dy", "dx", "dweight", "dbias"};
static void ln_set(capex_norm_args *a, int s, char *p) {
    switch (s) {
    case LN_X: a->x = p; break;          case LN_W: a->weight = p; break;     case LN_B: a->bias = p; break;
    case LN_Y: a->y = p; break;          case LN_MEAN: a->mean = (float *)(void *)p; break;
    case LN_RSTD: a->rstd = (float *)(void *)p; break;                        case LN_DY: a->dy = p; break;
    case LN_DX: a->dx = p; break;        case LN_DW: a->dweight = p; break;    default: a->dbias = p; break;
    }
}
enum { BN_X, BN_W, BN_B, BN_RM, BN_RV, BN_Y, BN_SM, BN_SI, BN_DY, BN_DX, BN_DW, BN_DB, BN_NSLOT };
static const char *const bn_names[BN_NSLOT] = {"x", "weight", "bias", "running_mean", "running_var", "y", "save_mean",
                                               "save_invstd", "dy", "dx", "dweight", "dbias"};
static void bn_set(capex_batch_norm_args *a, int s, char *p) {
    switch (s) {
    case BN_X: a->x = p; break;            case BN_W: a->weight = p; break;     case BN_B: a->bias = p; break;
    case BN_RM: a->running_mean = p; break; case BN_RV: a->running_var = p; break; case BN_Y: a->y = p; break;
    case BN_SM: a->save_mean = (float *)(void *)p; break;  case BN_SI: a->save_invstd = (float *)(void *)p; break;
    case BN_DY: a->dy = p; break;          case BN_DX: a->dx = p; break;        case BN_DW: a->dweight = p; break;
    default: a->dbias = p; break;
    }
}
static int names_both(const char *msg, const char *p, const char *q) {
    char s1[64], s2[64];
    snprintf(s1, sizeof s1, " %s [", p); snprintf(s2, sizeof s2, " %s [", q);
    return strstr(msg, s1) && strstr(msg, s2);
}
/* kind: 0..3 LayerNorm fwd, bwd, RMSNorm fwd, bwd; 4..6 BatchNorm fwd train, fwd eval, bwd;
   7, 8 LayerNorm, RMSNorm memory-efficient bwd */
static capex_result al_call(int kind, capex_norm_args *na, capex_batch_norm_args *ba) {
    capex_batch_norm_desc d;
    capex_norm_desc me;
    capex_batch_norm_desc_init(&d);
    capex_norm_desc_init(&me);
    me.memory_efficient = 1;
    switch (kind) {
    case 7: return capex_layer_norm_backward(&me, na);
    case 8: return capex_rms_norm_backward(&me, na);
    case 0: return capex_layer_norm_forward(NULL, na);
    case 1: return capex_layer_norm_backward(NULL, na);
    case 2: return capex_rms_norm_forward(NULL, na);
    case 3: return capex_rms_norm_backward(NULL, na);
    case 4: return capex_batch_norm_forward(&d, NULL, ba);
    case 5: d.training = 0; return capex_batch_norm_forward(&d, NULL, ba);
    default: return capex_batch_norm_backward(&d, NULL, ba);
    }
}
CT_TEST(norm_overlapping_outputs_refused_before_writing) {
    /* outputs, then the inputs each call reads (and nothing it ignores) */
    static const int outs[9][6] = {{LN_Y, LN_MEAN, LN_RSTD, -1}, {LN_DX, LN_DW, LN_DB, -1}, {LN_Y, LN_MEAN, LN_RSTD, -1},
                                   {LN_DX, LN_DW, -1}, {BN_Y, BN_SM, BN_SI, BN_RM, BN_RV, -1}, {BN_Y, BN_SM, BN_SI, -1},
                                   {BN_DX, BN_DW, BN_DB, -1}, {LN_DX, LN_DW, LN_DB, -1}, {LN_DX, LN_DW, -1}};
    static const int ins[9][6] = {{LN_X, LN_W, LN_B, -1}, {LN_X, LN_DY, LN_W, LN_MEAN, LN_RSTD, -1}, {LN_X, LN_W, -1},
                                  {LN_X, LN_DY, LN_W, LN_RSTD, -1}, {BN_X, BN_W, BN_B, -1},
                                  {BN_X, BN_W, BN_B, BN_RM, BN_RV, -1}, {BN_X, BN_DY, BN_W, BN_SM, BN_SI, -1},
                                  {LN_Y, LN_DY, LN_W, LN_B, LN_RSTD, -1}, {LN_Y, LN_DY, LN_W, LN_RSTD, -1}};
    const size_t bytes = (size_t)(BN_NSLOT + 2) * AL_REG * 4;
    char *arena = (char *)malloc(bytes), *snap = (char *)malloc(bytes);
    int kind, oi, ti, k, tried = 0, accepted = 0, unnamed = 0, written = 0;
    char first[1200] = "";
    for (k = 0; k < (int)(bytes / 4); k++) ((float *)(void *)arena)[k] = 1.0f + 0.25f * (float)(k % 7);
    memcpy(snap, arena, bytes);
    for (kind = 0; kind < 9; kind++) {
        const int bn = kind >= 4 && kind <= 6, nslot = bn ? BN_NSLOT : LN_NSLOT;
        const char *const *names = bn ? bn_names : ln_names;
        capex_norm_args na;
        capex_batch_norm_args ba;
        capex_norm_args_init(&na); capex_batch_norm_args_init(&ba);
        na.rows = 5; na.cols = 12;
        ba.n = 2; ba.c = 3; ba.s = 5; ba.total_count = 10;
        for (k = 0; k < nslot; k++) {
            if (bn) bn_set(&ba, k, arena + (size_t)(k + 1) * AL_REG * 4);
            else if (!((kind == 2 || kind == 3 || kind == 8) && (k == LN_B || k == LN_DB)))
                ln_set(&na, k, arena + (size_t)(k + 1) * AL_REG * 4);
        }
        CT_CHECK(al_call(kind, &na, &ba) == CAPEX_OK, "kind %d, no overlap: %s", kind, capex_last_error());
        memcpy(arena, snap, bytes);
        for (oi = 0; outs[kind][oi] >= 0; oi++) {
            const int o = outs[kind][oi];
            for (ti = 0; ti < 12; ti++) {
                const int t = ti < 6 ? ins[kind][ti] : outs[kind][ti - 6];
                int off;
                if (ti < 6 ? ins[kind][ti] < 0 : outs[kind][ti - 6] < 0) { if (ti < 6) ti = 5; else break; continue; }
                if (t == o) continue;
                for (off = -1; off <= 1; off++) {
                    capex_result r;
                    char *p = arena + (size_t)(t + 1) * AL_REG * 4 + off * 4;
                    if (kind == 0 || kind == 2 || kind == 4 || kind == 5) /* forward y == x exactly: in place */
                        if (o == (bn ? BN_Y : LN_Y) && t == (bn ? BN_X : LN_X) && off == 0) continue;
                    if (bn) bn_set(&ba, o, p); else ln_set(&na, o, p);
                    r = al_call(kind, &na, &ba);
                    tried++;
                    if (r != CAPEX_ERR_INVALID_ARG) {
                        if (!accepted++) snprintf(first, sizeof first, "kind %d: %s = %s %+d element: %s", kind, names[o],
                                                  names[t], off, r == CAPEX_OK ? "CAPEX_OK" : capex_last_error());
                    } else if (!names_both(capex_last_error(), names[o], names[t])) {
                        if (!unnamed++) snprintf(first, sizeof first, "%s", capex_last_error());
                    }
                    if (memcmp(arena, snap, bytes)) { written++; memcpy(arena, snap, bytes); }
                    if (bn) bn_set(&ba, o, arena + (size_t)(o + 1) * AL_REG * 4);
                    else ln_set(&na, o, arena + (size_t)(o + 1) * AL_REG * 4);
                }
            }
        }
    }
    CT_CHECK(tried > 200, "only %d overlaps tried", tried);
    CT_CHECK(!accepted, "%d of %d overlapping calls not refused, first: %s", accepted, tried, first);
    CT_CHECK(!unnamed, "%d refusals do not name both buffers: %s", unnamed, first);
    CT_CHECK(!written, "%d refused calls wrote memory", written);
    free(arena); free(snap);
}

/* A y at x's address is in place only with x's dtype: else its elements sit
   at other offsets than the x elements they come from. */
CT_TEST(norm_in_place_needs_same_dtype) {
    static float buf[64], st[8];
    capex_norm_args a;
    capex_batch_norm_args b;
    capex_batch_norm_desc d;
    int k;
    for (k = 0; k < 64; k++) buf[k] = (float)k;
    capex_norm_args_init(&a);
    a.rows = 2; a.cols = 8; a.x = buf; a.y = buf; a.y_dtype = CAPEX_BF16;
    CT_CHECK(capex_layer_norm_forward(NULL, &a) == CAPEX_ERR_INVALID_ARG, "LayerNorm f32 x, bf16 y in place accepted");
    CT_CHECK(names_both(capex_last_error(), "y", "x"), "%s", capex_last_error());
    CT_CHECK(capex_rms_norm_forward(NULL, &a) == CAPEX_ERR_INVALID_ARG, "RMSNorm f32 x, bf16 y in place accepted");
    capex_batch_norm_args_init(&b); capex_batch_norm_desc_init(&d);
    b.n = 2; b.c = 2; b.s = 4; b.x = buf; b.y = buf; b.x_dtype = CAPEX_F16; b.save_mean = st; b.save_invstd = st + 4;
    CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_ERR_INVALID_ARG, "BatchNorm f16 x, f32 y in place accepted");
    for (k = 0; k < 64; k++) CT_CHECK(buf[k] == (float)k, "buf[%d] written", k);
}

/* Forward in place (y == x, same dtype) gives the out-of-place bits: y, mean,
   rstd / save statistics and running statistics, for 1 and 3 threads, rows
   split across threads, every dtype, both BatchNorm layouts, train and eval. */
CT_TEST(norm_forward_in_place_same_bits) {
    static const capex_dtype dts[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    static const int64_t shapes[4][2] = {{1, 1}, {7, 33}, {64, 40}, {3, 1000}};
    int di, si, rms, nt, lay, train;
    for (di = 0; di < 3; di++)
        for (si = 0; si < 4; si++)
            for (rms = 0; rms < 2; rms++)
                for (nt = 1; nt <= 3; nt += 2) {
                    const capex_dtype t = dts[di];
                    const int64_t R = shapes[si][0], C = shapes[si][1], N = R * C;
                    const size_t es = capex_dtype_size(t);
                    void *x = malloc((size_t)N * es), *y = malloc((size_t)N * es), *xi = malloc((size_t)N * es);
                    float *w = (float *)malloc((size_t)C * 4), *bb = (float *)malloc((size_t)C * 4);
                    float *m0 = (float *)malloc((size_t)R * 4), *r0 = (float *)malloc((size_t)R * 4);
                    float *m1 = (float *)malloc((size_t)R * 4), *r1 = (float *)malloc((size_t)R * 4);
                    capex_norm_desc nd;
                    capex_norm_args a;
                    int64_t i;
                    for (i = 0; i < N; i++) setv(t, x, i, 3.0 + rng_sym());
                    for (i = 0; i < C; i++) { w[i] = (float)(1.0 + 0.5 * rng_sym()); bb[i] = (float)rng_sym(); }
                    memcpy(xi, x, (size_t)N * es);
                    capex_norm_desc_init(&nd); nd.num_threads = nt;
                    capex_norm_args_init(&a);
                    a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = t; a.x = x; a.y = y; a.weight = w;
                    a.bias = rms ? NULL : bb; a.mean = m0; a.rstd = r0;
                    CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                             capex_last_error());
                    a.x = xi; a.y = xi; a.mean = m1; a.rstd = r1;
                    CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK,
                             "in place: %s", capex_last_error());
                    CT_CHECK(!memcmp(xi, y, (size_t)N * es) && !memcmp(m0, m1, (size_t)R * 4) && !memcmp(r0, r1, (size_t)R * 4),
                             "rms %d dtype %d %lldx%lld threads %d: in place differs", rms, (int)t, (long long)R,
                             (long long)C, nt);
                    free(x); free(y); free(xi); free(w); free(bb); free(m0); free(r0); free(m1); free(r1);
                }
    for (di = 0; di < 3; di++)
        for (lay = 0; lay < 2; lay++)
            for (train = 0; train < 2; train++)
                for (nt = 1; nt <= 3; nt += 2) {
                    const capex_dtype t = dts[di];
                    const int64_t Nn = 5, C = 6, S = 9, N = Nn * C * S;
                    const size_t es = capex_dtype_size(t);
                    void *x = malloc((size_t)N * es), *y = malloc((size_t)N * es), *xi = malloc((size_t)N * es);
                    float w[6], bb[6], rm0[6], rv0[6], rm1[6], rv1[6], sm0[6], si0[6], sm1[6], si1[6];
                    capex_batch_norm_desc d;
                    capex_batch_norm_args b;
                    int64_t i;
                    for (i = 0; i < N; i++) setv(t, x, i, (double)(i % C) + rng_sym());
                    for (i = 0; i < C; i++) {
                        w[i] = (float)(1.0 + 0.5 * rng_sym()); bb[i] = (float)rng_sym();
                        rm0[i] = rm1[i] = (float)rng_sym(); rv0[i] = rv1[i] = (float)(1.0 + 0.5 * rng_sym());
                    }
                    memcpy(xi, x, (size_t)N * es);
                    capex_batch_norm_desc_init(&d); d.num_threads = nt; d.training = train;
                    capex_batch_norm_args_init(&b);
                    b.n = Nn; b.c = C; b.s = S; b.layout = lay ? CAPEX_BN_NSC : CAPEX_BN_NCS; b.x_dtype = b.y_dtype = t;
                    b.x = x; b.y = y; b.weight = w; b.bias = bb; b.running_mean = rm0; b.running_var = rv0;
                    b.save_mean = sm0; b.save_invstd = si0;
                    CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_OK, "%s", capex_last_error());
                    b.x = xi; b.y = xi; b.running_mean = rm1; b.running_var = rv1; b.save_mean = sm1; b.save_invstd = si1;
                    CT_CHECK(capex_batch_norm_forward(&d, NULL, &b) == CAPEX_OK, "in place: %s", capex_last_error());
                    CT_CHECK(!memcmp(xi, y, (size_t)N * es) && !memcmp(sm0, sm1, sizeof sm0) &&
                             !memcmp(si0, si1, sizeof si0) && !memcmp(rm0, rm1, sizeof rm0) && !memcmp(rv0, rv1, sizeof rv0),
                             "batch norm dtype %d layout %d training %d threads %d: in place differs", (int)t, lay, train, nt);
                    free(x); free(y); free(xi);
                }
}

/* ---- SyncBatchNorm over in-process ranks (threads and a test comm) ---- */
#define MAXW 4
typedef struct tcomm_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, gen, world;
    const void *slot[MAXW];
} tcomm_shared;
static void tbarrier(tcomm_shared *s) {
    int g;
    pthread_mutex_lock(&s->mu);
    g = s->gen;
    if (++s->arrived == s->world) { s->arrived = 0; s->gen++; pthread_cond_broadcast(&s->cv); }
    else while (g == s->gen) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
static capex_result t_allgather(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t, double dl) {
    tcomm_shared *s = (tcomm_shared *)c->impl;
    size_t es = capex_dtype_size(t);
    int r;
    (void)dl;
    s->slot[c->rank] = send;
    tbarrier(s);
    for (r = 0; r < s->world; r++) memcpy((char *)recv + (size_t)r * n * es, s->slot[r], n * es);
    tbarrier(s);
    return CAPEX_OK;
}
static capex_result t_allreduce(capex_comm *c, const void *send, void *recv, size_t n, capex_dtype t,
                                capex_reduce_op op, double dl) {
    tcomm_shared *s = (tcomm_shared *)c->impl;
    float *tmp = (float *)calloc(n ? n : 1, sizeof(float));
    size_t i;
    int r;
    (void)dl; (void)op; (void)t;
    s->slot[c->rank] = send;
    tbarrier(s);
    for (r = 0; r < s->world; r++)
        for (i = 0; i < n; i++) tmp[i] += ((const float *)s->slot[r])[i];
    tbarrier(s);
    memcpy(recv, tmp, n * sizeof(float));
    free(tmp);
    return CAPEX_OK;
}
static capex_result t_bcast(capex_comm *c, void *b, size_t n, capex_dtype t, int root, double dl) {
    (void)c; (void)b; (void)n; (void)t; (void)root; (void)dl;
    return CAPEX_OK;
}
static capex_result t_barrier(capex_comm *c, double dl) { (void)dl; tbarrier((tcomm_shared *)c->impl); return CAPEX_OK; }

typedef struct rank_job {
    capex_comm comm;
    capex_batch_norm_args a;
    capex_result rf, rb;
    const capex_batch_norm_desc *d; /* NULL: the defaults */
    char err[200];                  /* the thread's capex_last_error() after a failure */
} rank_job;
static void *rank_main(void *p) {
    rank_job *j = (rank_job *)p;
    capex_batch_norm_desc d;
    if (j->d) d = *j->d;
    else capex_batch_norm_desc_init(&d);
    j->rf = capex_batch_norm_forward(&d, &j->comm, &j->a);
    j->rb = j->rf == CAPEX_OK ? capex_batch_norm_backward(&d, &j->comm, &j->a) : j->rf;
    if (j->rb != CAPEX_OK) snprintf(j->err, sizeof j->err, "%.150s", capex_last_error());
    return NULL;
}

/* Ranks hold batches[r] samples of the same [*, C, S] problem; their results
   must equal BatchNorm on the concatenated batch (dweight/dbias: the sum of
   the ranks' shares). */
static void sync_case(ct_state *ct, int world, const int64_t *batches, capex_bn_layout lay) {
    static capex_comm_vtable vt;
    tcomm_shared sh;
    rank_job jobs[MAXW];
    pthread_t th[MAXW];
    const int64_t C = 5, S = 6;
    int64_t N = 0, r, i, off = 0;
    float *x, *dy, *y, *dx, w[5], b[5], rm[MAXW][5], rv[MAXW][5], sm[MAXW][5], si[MAXW][5], dw[MAXW][5], db[MAXW][5];
    float yc_rm[5], yc_rv[5], smc[5], sic[5], dwc[5], dbc[5];
    float *yc, *dxc;
    capex_batch_norm_args ca;
    memset(&vt, 0, sizeof vt);
    vt.name = "threads"; vt.allreduce = t_allreduce; vt.allgather = t_allgather; vt.broadcast = t_bcast;
    vt.barrier = t_barrier;
    for (r = 0; r < world; r++) N += batches[r];
    x = (float *)malloc((size_t)(N * C * S) * 4); dy = (float *)malloc((size_t)(N * C * S) * 4);
    y = (float *)malloc((size_t)(N * C * S) * 4); dx = (float *)malloc((size_t)(N * C * S) * 4);
    yc = (float *)malloc((size_t)(N * C * S) * 4); dxc = (float *)malloc((size_t)(N * C * S) * 4);
    for (i = 0; i < N * C * S; i++) { x[i] = (float)(3 + 2 * rng_sym()); dy[i] = (float)rng_sym(); }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + rng_sym() * 0.5); b[i] = (float)rng_sym(); yc_rm[i] = 0; yc_rv[i] = 1; }
    /* the concatenated batch on one process */
    capex_batch_norm_args_init(&ca);
    ca.n = N; ca.c = C; ca.s = S; ca.layout = lay; ca.x = x; ca.y = yc; ca.weight = w; ca.bias = b;
    ca.running_mean = yc_rm; ca.running_var = yc_rv; ca.save_mean = smc; ca.save_invstd = sic;
    ca.dy = dy; ca.dx = dxc; ca.dweight = dwc; ca.dbias = dbc;
    CT_CHECK(capex_batch_norm_forward(NULL, NULL, &ca) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_batch_norm_backward(NULL, NULL, &ca) == CAPEX_OK, "%s", capex_last_error());
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    sh.world = world;
    for (r = 0; r < world; r++) {
        rank_job *j = &jobs[r];
        int64_t e0 = off * C * S;
        memset(j, 0, sizeof *j);
        j->comm.vt = &vt; j->comm.impl = &sh; j->comm.rank = (int)r; j->comm.world_size = world;
        j->comm.timeout_s = 60;
        for (i = 0; i < C; i++) { rm[r][i] = 0; rv[r][i] = 1; }
        capex_batch_norm_args_init(&j->a);
        j->a.n = batches[r]; j->a.c = C; j->a.s = S; j->a.layout = lay;
        j->a.x = batches[r] ? x + e0 : NULL; j->a.y = batches[r] ? y + e0 : NULL;
        j->a.dy = batches[r] ? dy + e0 : NULL; j->a.dx = batches[r] ? dx + e0 : NULL;
        j->a.weight = w; j->a.bias = b; j->a.running_mean = rm[r]; j->a.running_var = rv[r];
        j->a.save_mean = sm[r]; j->a.save_invstd = si[r]; j->a.dweight = dw[r]; j->a.dbias = db[r];
        off += batches[r];
    }
    for (r = 0; r < world; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    for (r = 0; r < world; r++) pthread_join(th[r], NULL);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    for (r = 0; r < world; r++) {
        CT_CHECK(jobs[r].rf == CAPEX_OK && jobs[r].rb == CAPEX_OK, "rank %lld: %s %s", (long long)r,
                 capex_result_string(jobs[r].rf), capex_result_string(jobs[r].rb));
        CT_CHECK(jobs[r].a.total_count == N * S, "rank %lld total_count %lld", (long long)r,
                 (long long)jobs[r].a.total_count);
        for (i = 0; i < C; i++) {
            CT_CHECK(fabsf(sm[r][i] - smc[i]) <= 1e-5f * (1 + fabsf(smc[i])), "mean");
            CT_CHECK(fabsf(si[r][i] - sic[i]) <= 1e-5f * sic[i], "invstd");
            CT_CHECK(fabsf(rm[r][i] - yc_rm[i]) <= 1e-5f && fabsf(rv[r][i] - yc_rv[i]) <= 1e-5f, "running stats");
        }
    }
    for (i = 0; i < N * C * S; i++) {
        CT_CHECK(fabsf(y[i] - yc[i]) <= 2e-5f * (1 + fabsf(yc[i])), "y[%lld] %g vs %g", (long long)i, (double)y[i],
                 (double)yc[i]);
        CT_CHECK(fabsf(dx[i] - dxc[i]) <= 1e-4f * (1 + fabsf(dxc[i])), "dx[%lld] %g vs %g", (long long)i, (double)dx[i],
                 (double)dxc[i]);
    }
    for (i = 0; i < C; i++) {
        float sw = 0, sb = 0;
        for (r = 0; r < world; r++) { sw += dw[r][i]; sb += db[r][i]; }
        CT_CHECK(fabsf(sw - dwc[i]) <= 1e-4f * (1 + fabsf(dwc[i])) && fabsf(sb - dbc[i]) <= 1e-4f * (1 + fabsf(dbc[i])),
                 "sum of rank dweight/dbias = full batch's");
    }
    free(x); free(dy); free(y); free(dx); free(yc); free(dxc);
}

CT_TEST(sync_batch_norm_threads_unequal_batches) {
    static const int64_t b2[2] = {3, 5}, b3[3] = {1, 4, 2}, b3e[3] = {2, 0, 3}, b4[4] = {1, 1, 1, 6};
    int lay;
    for (lay = 0; lay < 2; lay++) {
        sync_case(ct, 2, b2, (capex_bn_layout)lay);
        if (ct->failed) return;
        sync_case(ct, 3, b3, (capex_bn_layout)lay);
        if (ct->failed) return;
        sync_case(ct, 3, b3e, (capex_bn_layout)lay); /* an empty rank */
        if (ct->failed) return;
        sync_case(ct, 4, b4, (capex_bn_layout)lay);
        if (ct->failed) return;
    }
}

/* SyncBatchNorm of data with a large mean and a small spread (mean 1e3 to
   1e5, std 1, rank 1 shifted by 2.5 so the ranks' means differ), 2 ranks of
   3 and 4 rows, both layouts: save_mean, save_invstd and the running
   statistics against float64 over the whole batch (the same f32 inputs):
   invstd and running_var within 1e-6 relative, the mean within its f32
   rounding plus 1e-6 std. Each rank's mean used to travel as one f32: its
   rounding (up to 2^-24 |mean|) went into the between-rank term of the merged
   variance: invstd up to 9.5e-6 relative off at mean 1e3, 4.5e-4 at 3e4 and
   1e5 (the variance twice that); now <= 7e-8. */
CT_TEST(sync_batch_norm_large_mean_vs_float64) {
    static capex_comm_vtable vt;
    enum { C = 4, S = 5, N0 = 3, N1 = 4, N = N0 + N1, E = N * C * S };
    static const double mu[C] = {1e3, -1e3, 3.0e4, 1e5};
    const int64_t nb[2] = {N0, N1};
    float x[E], y[E], sm[2][C], si[2][C], rm[2][C], rv[2][C];
    int64_t r, n, c, s;
    int lay;
    memset(&vt, 0, sizeof vt);
    vt.name = "threads"; vt.allreduce = t_allreduce; vt.allgather = t_allgather; vt.broadcast = t_bcast;
    vt.barrier = t_barrier;
    for (lay = 0; lay < 2 && !ct->failed; lay++) {
        tcomm_shared sh;
        rank_job jobs[2];
        pthread_t th[2];
        double rmean[C], rvar[C];
        for (n = 0; n < N; n++)
            for (c = 0; c < C; c++)
                for (s = 0; s < S; s++) {
                    int64_t k = lay ? (n * S + s) * C + c : (n * C + c) * S + s;
                    x[k] = (float)(mu[c] + (n >= N0 ? 2.5 : 0.0) + 1.7 * rng_sym());
                }
        for (c = 0; c < C; c++) { /* float64 over the whole batch */
            double m = 0.0, v = 0.0;
            for (n = 0; n < N; n++) for (s = 0; s < S; s++) m += x[lay ? (n * S + s) * C + c : (n * C + c) * S + s];
            m /= (double)(N * S);
            for (n = 0; n < N; n++)
                for (s = 0; s < S; s++) {
                    double dd = x[lay ? (n * S + s) * C + c : (n * C + c) * S + s] - m;
                    v += dd * dd;
                }
            rmean[c] = m; rvar[c] = v / (double)(N * S);
        }
        memset(&sh, 0, sizeof sh);
        pthread_mutex_init(&sh.mu, NULL);
        pthread_cond_init(&sh.cv, NULL);
        sh.world = 2;
        for (r = 0; r < 2; r++) {
            rank_job *j = &jobs[r];
            int64_t e0 = r ? N0 * C * S : 0;
            memset(j, 0, sizeof *j);
            j->comm.vt = &vt; j->comm.impl = &sh; j->comm.rank = (int)r; j->comm.world_size = 2; j->comm.timeout_s = 60;
            for (c = 0; c < C; c++) { rm[r][c] = 0.0f; rv[r][c] = 1.0f; }
            capex_batch_norm_args_init(&j->a);
            j->a.n = nb[r]; j->a.c = C; j->a.s = S; j->a.layout = (capex_bn_layout)lay; j->a.x = x + e0; j->a.y = y + e0;
            j->a.running_mean = rm[r]; j->a.running_var = rv[r]; j->a.save_mean = sm[r]; j->a.save_invstd = si[r];
            j->a.dy = x + e0; j->a.dx = NULL; /* backward runs too (rank_main): its sums, no dx */
        }
        for (r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
        for (r = 0; r < 2; r++) pthread_join(th[r], NULL);
        pthread_mutex_destroy(&sh.mu);
        pthread_cond_destroy(&sh.cv);
        for (r = 0; r < 2; r++) {
            CT_CHECK(jobs[r].rf == CAPEX_OK && jobs[r].rb == CAPEX_OK, "rank %d: %s", (int)r, jobs[r].err);
            for (c = 0; c < C; c++) {
                const double is = 1.0 / sqrt(rvar[c] + 1e-5), sd = sqrt(rvar[c]);
                const double uv = rvar[c] * (double)(N * S) / (double)(N * S - 1);
                CT_CHECK(fabs(si[r][c] - is) <= 1e-6 * is, "layout %d rank %d ch %d (mean %g): invstd %.9g, float64 %.9g "
                         "(%.2e relative)", lay, (int)r, (int)c, mu[c], (double)si[r][c], is, fabs(si[r][c] / is - 1.0));
                CT_CHECK(fabs(sm[r][c] - rmean[c]) <= fabs(rmean[c]) * 0x1p-24 + 1e-6 * sd, "layout %d rank %d ch %d: "
                         "mean %.9g, float64 %.9g", lay, (int)r, (int)c, (double)sm[r][c], rmean[c]);
                CT_CHECK(fabs(rv[r][c] - (0.9 + 0.1 * uv)) <= 1e-6 * (0.9 + 0.1 * uv), "layout %d rank %d ch %d: "
                         "running_var %.9g, float64 %.9g", lay, (int)r, (int)c, (double)rv[r][c], 0.9 + 0.1 * uv);
                CT_CHECK(fabs(rm[r][c] - 0.1 * rmean[c]) <= fabs(rmean[c]) * 0x1p-23 + 1e-6 * sd, "layout %d rank %d "
                         "ch %d: running_mean %.9g, float64 %.9g", lay, (int)r, (int)c, (double)rm[r][c], 0.1 * rmean[c]);
            }
        }
    }
}

/* SyncBatchNorm with every rank empty has no global statistics: refused on
   every rank with that reason, running statistics untouched (one empty rank
   among others is sync_case's b3e). */
CT_TEST(sync_batch_norm_every_rank_empty_is_refused) {
    static capex_comm_vtable vt;
    tcomm_shared sh;
    rank_job jobs[2];
    pthread_t th[2];
    float rm[2][2] = {{1, 1}, {1, 1}}, rv[2][2] = {{3, 3}, {3, 3}}, sm[2][2], si[2][2];
    int r;
    memset(&vt, 0, sizeof vt);
    vt.name = "threads"; vt.allreduce = t_allreduce; vt.allgather = t_allgather; vt.broadcast = t_bcast;
    vt.barrier = t_barrier;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    sh.world = 2;
    for (r = 0; r < 2; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].comm.vt = &vt; jobs[r].comm.impl = &sh; jobs[r].comm.rank = r; jobs[r].comm.world_size = 2;
        jobs[r].comm.timeout_s = 60;
        capex_batch_norm_args_init(&jobs[r].a);
        jobs[r].a.n = 0; jobs[r].a.c = 2; jobs[r].a.s = 3; jobs[r].a.running_mean = rm[r]; jobs[r].a.running_var = rv[r];
        jobs[r].a.save_mean = sm[r]; jobs[r].a.save_invstd = si[r];
    }
    for (r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    for (r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    for (r = 0; r < 2; r++) {
        CT_CHECK(jobs[r].rf == CAPEX_ERR_INVALID_ARG && strstr(jobs[r].err, "empty on every rank"), "rank %d: %s: %s", r,
                 capex_result_string(jobs[r].rf), jobs[r].err);
        CT_CHECK(rm[r][0] == 1.0f && rv[r][1] == 3.0f, "rank %d: running stats moved", r);
    }
}

/* Eval without running statistics: torch's SyncBatchNorm does not sync there
   (F.batch_norm on the local batch), so each rank's y and dx are BatchNorm of
   its own batch (float64 reference); sync_eval_batch_stats = 1 gives the
   global batch's instead. Rank 1's batch is shifted so the two differ. */
CT_TEST(sync_batch_norm_eval_without_running_stats_is_local) {
    static capex_comm_vtable vt;
    enum { C = 3, S = 4, N0 = 3, N1 = 5, N = N0 + N1, E = N * C * S };
    const int64_t nb[2] = {N0, N1};
    double xd[E], dyd[E], wd[C], bd[C], yr[E], dxr[E], mr[C], vr[C], dwr[C], dbr[C];
    float x[E], dy[E], y[E], dx[E], w[C], b[C], sm[2][C], si[2][C];
    int64_t i, r;
    int sync;
    memset(&vt, 0, sizeof vt);
    vt.name = "threads"; vt.allreduce = t_allreduce; vt.allgather = t_allgather; vt.broadcast = t_bcast;
    vt.barrier = t_barrier;
    for (i = 0; i < E; i++) {
        x[i] = (float)(1 + rng_sym() + (i >= N0 * C * S ? 5.0 : 0.0)); dy[i] = (float)rng_sym();
        xd[i] = x[i]; dyd[i] = dy[i];
    }
    for (i = 0; i < C; i++) { w[i] = (float)(1 + 0.5 * rng_sym()); b[i] = (float)rng_sym(); wd[i] = w[i]; bd[i] = b[i]; }
    for (sync = 0; sync < 2; sync++) {
        capex_batch_norm_desc d;
        tcomm_shared sh;
        rank_job jobs[2];
        pthread_t th[2];
        capex_batch_norm_desc_init(&d);
        d.training = 0;
        d.sync_eval_batch_stats = sync;
        memset(&sh, 0, sizeof sh);
        pthread_mutex_init(&sh.mu, NULL);
        pthread_cond_init(&sh.cv, NULL);
        sh.world = 2;
        for (r = 0; r < 2; r++) {
            rank_job *j = &jobs[r];
            int64_t e0 = r ? N0 * C * S : 0;
            memset(j, 0, sizeof *j);
            j->d = &d;
            j->comm.vt = &vt; j->comm.impl = &sh; j->comm.rank = (int)r; j->comm.world_size = 2; j->comm.timeout_s = 60;
            capex_batch_norm_args_init(&j->a);
            j->a.n = nb[r]; j->a.c = C; j->a.s = S; j->a.x = x + e0; j->a.y = y + e0; j->a.dy = dy + e0; j->a.dx = dx + e0;
            j->a.weight = w; j->a.bias = b; j->a.save_mean = sm[r]; j->a.save_invstd = si[r]; /* no running stats */
        }
        for (r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
        for (r = 0; r < 2; r++) pthread_join(th[r], NULL);
        pthread_mutex_destroy(&sh.mu);
        pthread_cond_destroy(&sh.cv);
        for (r = 0; r < 2; r++)
            CT_CHECK(jobs[r].rf == CAPEX_OK && jobs[r].rb == CAPEX_OK, "sync %d rank %d: %s %s", sync, (int)r,
                     capex_result_string(jobs[r].rf), capex_result_string(jobs[r].rb));
        if (sync) ref_bn(N, C, S, xd, wd, bd, 1e-5, dyd, yr, mr, vr, dxr, dwr, dbr);
        else {
            ref_bn(N0, C, S, xd, wd, bd, 1e-5, dyd, yr, mr, vr, dxr, dwr, dbr);
            ref_bn(N1, C, S, xd + N0 * C * S, wd, bd, 1e-5, dyd + N0 * C * S, yr + N0 * C * S, mr, vr, dxr + N0 * C * S,
                   dwr, dbr);
        }
        for (r = 0; r < 2; r++)
            CT_CHECK(jobs[r].a.total_count == (sync ? N : nb[r]) * S, "sync %d rank %d total_count %lld", sync, (int)r,
                     (long long)jobs[r].a.total_count);
        for (i = 0; i < E; i++) {
            CT_CHECK(fabs(y[i] - yr[i]) <= 2e-5 * (1 + fabs(yr[i])), "sync %d: y[%lld] %g vs %s batch's %g", sync,
                     (long long)i, (double)y[i], sync ? "the global" : "the local", yr[i]);
            CT_CHECK(fabs(dx[i] - dxr[i]) <= 1e-4 * (1 + fabs(dxr[i])), "sync %d: dx[%lld] %g vs %g", sync, (long long)i,
                     (double)dx[i], dxr[i]);
        }
    }
}

/* ---- column sums over many rows, and the backward with part of its outputs ---- */

/* LayerNorm/RMSNorm dweight and dbias over 2^20 rows of 5 columns (dy
   0.9 +- 1e-3: a long f32 chain of nearly equal terms rounds one way) against
   float64 sums of the same terms (from capex's saved mean and rstd), within
   1e-6 relative (measured <= 4e-8): before 2026-11-28 each block's f32
   partial ran over 16384 rows (dbias 3.5e-6 .. 4e-6 off), now it is flushed
   into a double every 64 rows. The same bits with 1 and 3 threads (the flushes are per block).
   x f32 and bf16; all outputs, and without dx. */
CT_TEST(column_sums_many_rows_vs_float64) {
    const int64_t R = (int64_t)1 << 20, C = 5, N = R * C;
    static const capex_dtype dts[] = {CAPEX_F32, CAPEX_BF16};
    size_t di;
    int rms, nt, outs;
    for (di = 0; di < 2; di++)
        for (rms = 0; rms < 2; rms++) {
            const capex_dtype xt = dts[di];
            const char *what = rms ? "rms" : "layer";
            void *x = talloc(xt, N), *dx = talloc(xt, N);
            float *y = (float *)talloc(CAPEX_F32, N), *dy = (float *)talloc(CAPEX_F32, N);
            float *mean = (float *)talloc(CAPEX_F32, R), *rstd = (float *)talloc(CAPEX_F32, R);
            float w[5], b[5], dw[5], db[5], dw1[5], db1[5];
            double dwr[5], dbr[5], err;
            capex_norm_desc nd;
            capex_norm_args a;
            int64_t r, j;
            CT_CHECK(x && dx && y && dy && mean && rstd, "out of memory");
            for (r = 0; r < R; r++)
                for (j = 0; j < C; j++) {
                    setv(xt, x, r * C + j, 0.7 + 0.1 * (double)j + 0.01 * rng_sym());
                    dy[r * C + j] = (float)(0.9 + 1e-3 * rng_sym());
                }
            for (j = 0; j < C; j++) { w[j] = (float)(1.0 + 0.1 * rng_sym()); b[j] = (float)(0.1 * rng_sym()); }
            capex_norm_args_init(&a);
            a.rows = R; a.cols = C; a.x_dtype = xt;
            a.x = x; a.y = y; a.weight = w; a.bias = rms ? NULL : b; a.mean = mean; a.rstd = rstd;
            CT_CHECK((rms ? capex_rms_norm_forward(NULL, &a) : capex_layer_norm_forward(NULL, &a)) == CAPEX_OK, "%s",
                     capex_last_error());
            for (j = 0; j < C; j++) { dwr[j] = 0; dbr[j] = 0; }
            for (r = 0; r < R; r++) {
                const double m = rms ? 0.0 : (double)mean[r], rs = (double)rstd[r];
                for (j = 0; j < C; j++) {
                    dwr[j] += (double)dy[r * C + j] * ((getv(xt, x, r * C + j) - m) * rs);
                    dbr[j] += (double)dy[r * C + j];
                }
            }
            for (outs = 0; outs < 2; outs++)
                for (nt = 1; nt <= 3; nt += 2) {
                    capex_norm_desc_init(&nd);
                    nd.num_threads = nt;
                    a.dy = dy; a.dx = outs ? NULL : dx; a.dweight = dw; a.dbias = rms ? NULL : db;
                    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK,
                             "%s", capex_last_error());
                    CT_CHECK(close_to(CAPEX_F32, dw, dwr, C, 1e-6, &err), "%s x dtype %d, %s, %d thread(s): dweight rel "
                             "err %.3g (tol 1e-6)", what, xt, outs ? "without dx" : "all outputs", nt, err);
                    if (!rms)
                        CT_CHECK(close_to(CAPEX_F32, db, dbr, C, 1e-6, &err), "layer x dtype %d, %s, %d thread(s): dbias "
                                 "rel err %.3g (tol 1e-6)", xt, outs ? "without dx" : "all outputs", nt, err);
                    if (nt == 1 && outs == 0) { memcpy(dw1, dw, sizeof dw); memcpy(db1, db, sizeof db); }
                    CT_CHECK(!memcmp(dw, dw1, sizeof dw) && (rms || !memcmp(db, db1, sizeof db)),
                             "%s x dtype %d: dweight/dbias bits differ (%s, %d threads)", what, xt,
                             outs ? "without dx" : "all outputs", nt);
                }
            free(x); free(dx); free(y); free(dy); free(mean); free(rstd);
            if (ct->failed) return;
        }
}

/* BatchNorm over 2^20 values per channel (3 channels; n 2^10 x s 2^10), both
   layouts: save_mean and save_invstd within 5e-7 of float64, and dweight,
   dbias within 1e-6 of float64 sums from the saved statistics (dy 0.9 +
   0.5 (x - mean) +- 1e-4: sum(dy (x - mean)) cancels to 1/30 of its terms'
   size, and the f32 chains of nearly equal dy round one way; measured <=
   1.1e-7). Channels-last (NSC) ran each block's f32 chains over 16384 rows
   before 2026-11-28 (dbias 2.2e-6 .. 2.6e-6 off, invstd 3.7e-7). The
   same bits with 1 and 3 threads. */
CT_TEST(batch_norm_channel_sums_many_rows_vs_float64) {
    const int64_t Nn = 1024, S = 1024, C = 3, T = Nn * S * C;
    int lay, nt;
    float *x = (float *)malloc((size_t)T * 4), *y = (float *)malloc((size_t)T * 4), *dy = (float *)malloc((size_t)T * 4);
    float w[3] = {1.5f, 0.75f, -1.25f}, b[3] = {0.1f, -0.2f, 0.3f}, sm[3], si[3], dw[3], db[3], dw1[3], db1[3];
    CT_CHECK(x && y && dy, "out of memory");
    for (lay = 0; lay < 2; lay++) {
        double mr[3], vr[3], dwr[3], dbr[3], err;
        int64_t n, s, c;
#define BN_AT(n_, c_, s_) (lay ? ((n_) * S + (s_)) * C + (c_) : ((n_) * C + (c_)) * S + (s_))
        for (n = 0; n < Nn; n++)
            for (c = 0; c < C; c++)
                for (s = 0; s < S; s++) {
                    const double v = 0.01 * rng_sym();
                    x[BN_AT(n, c, s)] = (float)(0.5 + (double)c + v);
                    dy[BN_AT(n, c, s)] = (float)(0.9 + 0.5 * v + 1e-4 * rng_sym());
                }
        for (c = 0; c < C; c++) {
            double m = 0, q = 0;
            for (n = 0; n < Nn; n++) for (s = 0; s < S; s++) m += x[BN_AT(n, c, s)];
            m /= (double)(Nn * S);
            for (n = 0; n < Nn; n++) for (s = 0; s < S; s++) q += pow(x[BN_AT(n, c, s)] - m, 2);
            mr[c] = m; vr[c] = q / (double)(Nn * S);
        }
        for (nt = 1; nt <= 3; nt += 2) {
            capex_batch_norm_desc d;
            capex_batch_norm_args a;
            capex_batch_norm_desc_init(&d);
            d.num_threads = nt;
            capex_batch_norm_args_init(&a);
            a.n = Nn; a.c = C; a.s = S; a.layout = lay ? CAPEX_BN_NSC : CAPEX_BN_NCS;
            a.x = x; a.y = y; a.weight = w; a.bias = b; a.save_mean = sm; a.save_invstd = si;
            a.dy = dy; a.dweight = dw; a.dbias = db;
            CT_CHECK(capex_batch_norm_forward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            for (c = 0; c < C; c++) {
                const double is = 1.0 / sqrt(vr[c] + 1e-5);
                CT_CHECK(fabs(sm[c] - mr[c]) <= 5e-7 * fabs(mr[c]), "layout %d: save_mean[%lld] %.9g, float64 %.9g (rel %.3g)",
                         lay, (long long)c, (double)sm[c], mr[c], fabs(sm[c] - mr[c]) / fabs(mr[c]));
                CT_CHECK(fabs(si[c] - is) <= 5e-7 * is, "layout %d: save_invstd[%lld] %.9g, float64 %.9g (rel %.3g)", lay,
                         (long long)c, (double)si[c], is, fabs(si[c] - is) / is);
            }
            CT_CHECK(capex_batch_norm_backward(&d, NULL, &a) == CAPEX_OK, "%s", capex_last_error());
            for (c = 0; c < C; c++) {
                double s0 = 0, s1 = 0;
                for (n = 0; n < Nn; n++)
                    for (s = 0; s < S; s++) {
                        s0 += dy[BN_AT(n, c, s)];
                        s1 += (double)dy[BN_AT(n, c, s)] * ((double)x[BN_AT(n, c, s)] - (double)sm[c]);
                    }
                dbr[c] = s0; dwr[c] = s1 * (double)si[c];
            }
            CT_CHECK(close_to(CAPEX_F32, db, dbr, C, 1e-6, &err), "layout %d, %d thread(s): dbias rel err %.3g (tol 1e-6)",
                     lay, nt, err);
            for (c = 0; c < C; c++)
                CT_CHECK(fabs(dw[c] - dwr[c]) <= 1e-6 * fabs(dwr[c]), "layout %d, %d thread(s): dweight[%lld] %.9g, float64 "
                         "%.9g (rel %.3g, tol 1e-6)", lay, nt, (long long)c, (double)dw[c], dwr[c],
                         fabs(dw[c] - dwr[c]) / fabs(dwr[c]));
            if (nt == 1) { memcpy(dw1, dw, sizeof dw); memcpy(db1, db, sizeof db); }
            CT_CHECK(!memcmp(dw, dw1, sizeof dw) && !memcmp(db, db1, sizeof db), "layout %d: bits differ with %d threads",
                     lay, nt);
        }
#undef BN_AT
        if (ct->failed) break;
    }
    free(x); free(y); free(dy);
}

/* The normal (from x) backward with every subset of its outputs (dx, dweight,
   dbias), LayerNorm and RMSNorm, with and without affine, f32 and bf16, on
   odd widths, 1 column, 1 row, 0 rows and random shapes: the all-outputs call
   against float64 (as run_case), and every subset the same bits as it. */
CT_TEST(norm_backward_output_subsets_vs_float64) {
    static const int64_t fixed[][2] = {{0, 5}, {1, 1}, {1, 37}, {5, 1}, {7, 8}, {20, 37}, {33, 1029}, {3, 4097}, {70, 9}};
    static const capex_dtype ts[] = {CAPEX_F32, CAPEX_BF16};
    int si, k, rms, affine, outs;
    for (si = 0; si < 15; si++) {
        const int64_t R = si < 9 ? fixed[si][0] : 1 + (int64_t)(rng_u64() % 90), C = si < 9 ? fixed[si][1] : 1 + (int64_t)(rng_u64() % 300);
        const int64_t N = R * C;
        for (k = 0; k < 2; k++)
            for (rms = 0; rms < 2; rms++)
                for (affine = 0; affine < 2; affine++) {
                    const capex_dtype t = ts[k];
                    const size_t es = capex_dtype_size(t);
                    const char *what = rms ? "rms" : "layer";
                    void *x = talloc(t, N), *y = talloc(t, N), *dy = talloc(t, N), *dx0 = talloc(t, N), *dx = talloc(t, N);
                    void *w = talloc(t, C), *b = talloc(t, C), *dw0 = talloc(t, C), *db0 = talloc(t, C);
                    void *dw = talloc(t, C), *db = talloc(t, C);
                    double *xd = dalloc(N), *wd = dalloc(C), *bd = dalloc(C), *dyd = dalloc(N);
                    double *dxr = dalloc(N), *dwr = dalloc(C), *dbr = dalloc(C), err;
                    float *mean = (float *)talloc(CAPEX_F32, R), *rstd = (float *)talloc(CAPEX_F32, R);
                    capex_norm_desc nd;
                    capex_norm_args a;
                    const int hb = affine && !rms;
                    capex_norm_desc_init(&nd);
                    fill(t, x, xd, N, 0.25, 1.5);
                    fill(t, w, wd, C, 1.0, 0.5);
                    fill(t, b, bd, C, 0.0, 0.5);
                    fill(t, dy, dyd, N, 0.0, 1.0);
                    capex_norm_args_init(&a);
                    a.rows = R; a.cols = C; a.x_dtype = a.y_dtype = a.param_dtype = t;
                    a.x = x; a.y = y; a.mean = mean; a.rstd = rstd;
                    if (affine) { a.weight = w; a.bias = hb ? b : NULL; }
                    CT_CHECK((rms ? capex_rms_norm_forward(&nd, &a) : capex_layer_norm_forward(&nd, &a)) == CAPEX_OK, "%s",
                             capex_last_error());
                    a.dy = dy; a.dx = dx0; a.dweight = affine ? dw0 : NULL; a.dbias = hb ? db0 : NULL;
                    CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK, "%s",
                             capex_last_error());
                    ref_norm_bwd(rms, R, C, xd, affine ? wd : NULL, dyd, 1e-5, dxr, dwr, dbr);
                    if (R > 0) {
                        double rmax = 0;
                        int64_t i;
                        for (i = 0; i < R; i++) if (rstd[i] > rmax) rmax = rstd[i];
                        CT_CHECK(close_to_s(t, dx0, dxr, N, dtype_tol(t) * 5, maxabs(dyd, N) * rmax * (affine ? maxabs(wd, C) : 1.0),
                                            &err), "%s R=%lld C=%lld %s affine %d: dx rel err %g", what, (long long)R,
                                 (long long)C, capex_dtype_name(t), affine, err);
                    }
                    if (affine) CT_CHECK(close_to(t, dw0, dwr, C, dtype_tol(t) * 5, &err), "%s R=%lld C=%lld %s: dweight rel "
                                         "err %g", what, (long long)R, (long long)C, capex_dtype_name(t), err);
                    if (hb) CT_CHECK(close_to(t, db0, dbr, C, dtype_tol(t) * 5, &err), "layer R=%lld C=%lld %s: dbias rel err %g",
                                     (long long)R, (long long)C, capex_dtype_name(t), err);
                    for (outs = 1; outs < 7; outs++) { /* bits: dx, dweight, dbias */
                        if (((outs & 2) && !affine) || ((outs & 4) && !hb)) continue;
                        a.dx = outs & 1 ? dx : NULL;
                        a.dweight = outs & 2 ? dw : NULL;
                        a.dbias = outs & 4 ? db : NULL;
                        memset(dx, 0x5a, (size_t)(N > 0 ? N : 1) * es); memset(dw, 0x5a, (size_t)C * es); memset(db, 0x5a, (size_t)C * es);
                        CT_CHECK((rms ? capex_rms_norm_backward(&nd, &a) : capex_layer_norm_backward(&nd, &a)) == CAPEX_OK,
                                 "%s", capex_last_error());
                        CT_CHECK(!a.dx || !memcmp(dx, dx0, (size_t)N * es), "%s R=%lld C=%lld %s affine %d outputs %d: dx "
                                 "bits differ from the all-outputs call", what, (long long)R, (long long)C,
                                 capex_dtype_name(t), affine, outs);
                        CT_CHECK(!a.dweight || !memcmp(dw, dw0, (size_t)C * es), "%s R=%lld C=%lld %s outputs %d: dweight "
                                 "bits differ", what, (long long)R, (long long)C, capex_dtype_name(t), outs);
                        CT_CHECK(!a.dbias || !memcmp(db, db0, (size_t)C * es), "layer R=%lld C=%lld %s outputs %d: dbias "
                                 "bits differ", (long long)R, (long long)C, capex_dtype_name(t), outs);
                    }
                    free(x); free(y); free(dy); free(dx0); free(dx); free(w); free(b); free(dw0); free(db0); free(dw);
                    free(db); free(xd); free(wd); free(bd); free(dyd); free(dxr); free(dwr); free(dbr); free(mean); free(rstd);
                    if (ct->failed) return;
                }
    }
}

static const ct_case cases[] = {
    CT_CASE(layer_and_rms_norm_odd_widths_f32),
    CT_CASE(mixed_dtypes_all_combinations),
    CT_CASE(huge_fp16_inputs_do_not_overflow),
    CT_CASE(huge_f32_values_short_rows_stay_finite),
    CT_CASE(large_mean_small_noise_variance_vs_float64),
    CT_CASE(long_rows_sums_vs_float64),
    CT_CASE(constant_rows_and_one_element_rows),
    CT_CASE(finite_differences),
    CT_CASE(pytorch_semantics_small),
    CT_CASE(matches_pytorch_golden_vectors),
    CT_CASE(bits_independent_of_thread_count), CT_CASE(layer_norm_backward_large_dx_same_bits_as_small_calls),
    CT_CASE(layer_norm_errors_are_clear_and_write_nothing), CT_CASE(norm_backward_zero_rows_writes_zero_param_grads),
    CT_CASE(batch_norm_layouts_dtypes_eval),
    CT_CASE(batch_norm_finite_differences),
    CT_CASE(batch_norm_constant_channel_and_no_running_stats), CT_CASE(batch_norm_empty_batch_as_torch),
    CT_CASE(batch_norm_eval_backward_nonfinite_stays_local),
    CT_CASE(layer_norm_bias_without_weight), CT_CASE(nonfinite_inputs_stay_in_their_row_or_channel),
    CT_CASE(batch_norm_cumulative_average_momentum_none), CT_CASE(batch_norm_errors),
    CT_CASE(amp_dtypes_keep_batchnorm_fp32),
    CT_CASE(sync_batch_norm_threads_unequal_batches), CT_CASE(sync_batch_norm_large_mean_vs_float64),
    CT_CASE(sync_batch_norm_every_rank_empty_is_refused),
    CT_CASE(sync_batch_norm_eval_without_running_stats_is_local),
    CT_CASE(norm_overlapping_outputs_refused_before_writing), CT_CASE(norm_in_place_needs_same_dtype),
    CT_CASE(norm_forward_in_place_same_bits),
    CT_CASE(memory_efficient_backward_vs_float64_every_dtype), CT_CASE(memory_efficient_zero_weight_refused),
    CT_CASE(memory_efficient_edges_and_errors), CT_CASE(memory_efficient_bits_independent_of_thread_count),
    CT_CASE(memory_efficient_after_forward_in_place), CT_CASE(memory_efficient_output_subsets_and_streamed_dx_same_bits),
    CT_CASE(memory_efficient_no_affine_same_bits_as_normal),
    CT_CASE(memory_efficient_absent_params_same_bits_as_ones_zeros),
    CT_CASE(column_sums_many_rows_vs_float64), CT_CASE(batch_norm_channel_sums_many_rows_vs_float64),
    CT_CASE(norm_backward_output_subsets_vs_float64), CT_CASE(bits_match_unfused_reference),
};

int main(int argc, char **argv) {
    if (getenv("NORM_HASH")) {
        printf("norm-hash %016llx\n", (unsigned long long)fixed_problem_hash(0));
        return 0;
    }
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
