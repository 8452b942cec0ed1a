/* Parity checks of capex_cuda.h's fused kernels against capex.h's CPU backend,
   shared by tests/test_gpuopt_emu.c (the kernel source run on CPU threads)
   and tests/test_gpuopt_gpu.c (a real GPU). An `env` says where the kernels
   run (a capex__go_exec) and whether a real context exists. Fresh random
   inputs (seeded), poisoned outputs, odd sizes, misaligned tensors, more
   tensors than one launch holds. Include after capex_test.h and capex_cuda.h. */
#ifndef CAPEX_GPUOPT_PARITY_H
#define CAPEX_GPUOPT_PARITY_H
#include <math.h>

typedef struct env {
    capex__go_exec ex;
    capex_cuda_context *ctx; /* NULL: emulation */
    uint64_t seed;
} env;

static uint32_t par_rng(uint64_t *s) { /* splitmix64, top 32 bits */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static float par_uniform(uint64_t *s) { return (float)((par_rng(s) >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static uint32_t par_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Device buffer of `bytes`, poisoned with 0xA5 bytes. off_elems shifts the
   returned address by that many bytes (misaligned for vectors). */
static capex_cuda_ptr par_alloc(env *e, size_t bytes) {
    capex_cuda_ptr p = 0;
    unsigned char *poison;
    if (bytes == 0) bytes = 16;
    if (e->ex.alloc(e->ex.user, bytes, &p) != CAPEX_OK) return 0;
    poison = (unsigned char *)malloc(bytes);
    if (!poison) return p;
    memset(poison, 0xA5, bytes);
    e->ex.htod(e->ex.user, p, poison, bytes, NULL);
    free(poison);
    return p;
}
static void par_free(env *e, capex_cuda_ptr p) { if (p) e->ex.release(e->ex.user, p); }
static int par_up(env *e, capex_cuda_ptr d, const void *h, size_t bytes) {
    return bytes ? e->ex.htod(e->ex.user, d, h, bytes, NULL) == CAPEX_OK : 1;
}
static int par_down(env *e, void *h, capex_cuda_ptr d, size_t bytes) {
    return bytes ? e->ex.dtoh(e->ex.user, h, d, bytes, NULL) == CAPEX_OK : 1;
}

/* Random value codes of a dtype: |x| < amp, plus `special` (0: none, 1: one
   inf, 2: one NaN) at a random index. */
static void par_fill(uint64_t *s, capex_dtype dt, void *dst, int64_t n, float amp, int special) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float f = par_uniform(s) * amp;
        if (dt == CAPEX_F32) ((float *)dst)[i] = f;
        else if (dt == CAPEX_F16) ((uint16_t *)dst)[i] = capex_f32_to_f16(f);
        else ((uint16_t *)dst)[i] = capex_f32_to_bf16(f);
    }
    if (special && n > 0) {
        int64_t k = (int64_t)(par_rng(s) % (uint32_t)n);
        float f = special == 1 ? INFINITY : NAN;
        if (dt == CAPEX_F32) ((float *)dst)[k] = f;
        else if (dt == CAPEX_F16) ((uint16_t *)dst)[k] = capex_f32_to_f16(f);
        else ((uint16_t *)dst)[k] = capex_f32_to_bf16(f);
    }
}

/* A list of host tensors and their device twins (same data). */
typedef struct par_list {
    capex_dtype dt;
    size_t n;
    capex_tensor h[256], d[256];
    capex_cuda_ptr base[256];
} par_list;

/* sizes[i] elements each; misalign: every third tensor starts one element
   past a 16-byte boundary on the device. data: fill random (amp), else poison. */
static int par_list_make(env *e, par_list *l, capex_dtype dt, const int64_t *sizes, size_t n, int misalign,
                         float amp, int data) {
    size_t i, es = capex_dtype_size(dt);
    memset(l, 0, sizeof *l);
    l->dt = dt;
    l->n = n;
    for (i = 0; i < n; i++) {
        size_t off = misalign && i % 3 == 1 ? es : 0;
        size_t bytes = (size_t)sizes[i] * es;
        l->h[i].numel = sizes[i];
        l->h[i].data = malloc(bytes ? bytes : 16);
        if (!l->h[i].data) return 0;
        memset(l->h[i].data, 0xA5, bytes);
        if (data) par_fill(&e->seed, dt, l->h[i].data, sizes[i], amp, 0);
        l->base[i] = par_alloc(e, bytes + off + 16);
        if (!l->base[i]) return 0;
        l->d[i].numel = sizes[i];
        l->d[i].data = (void *)(uintptr_t)(l->base[i] + off);
        if (data && !par_up(e, l->base[i] + off, l->h[i].data, bytes)) return 0;
    }
    return 1;
}
static void par_list_free(env *e, par_list *l) {
    size_t i;
    for (i = 0; i < l->n; i++) {
        free(l->h[i].data);
        par_free(e, l->base[i]);
    }
    l->n = 0;
}
static capex_tensor_list par_hl(par_list *l) { return capex_tensor_list_make(l->dt, l->h, l->n); }
static capex_tensor_list par_dl(par_list *l) { return capex_tensor_list_make(l->dt, l->d, l->n); }
/* Device contents of tensor i into buf (numel * es bytes). */
static int par_get(env *e, par_list *l, size_t i, void *buf) {
    return par_down(e, buf, (capex_cuda_ptr)(uintptr_t)l->d[i].data, (size_t)l->d[i].numel * capex_dtype_size(l->dt));
}

static float par_val(capex_dtype dt, const void *p, int64_t i) {
    if (dt == CAPEX_F32) return ((const float *)p)[i];
    if (dt == CAPEX_F16) return capex_f16_to_f32(((const uint16_t *)p)[i]);
    return capex_bf16_to_f32(((const uint16_t *)p)[i]);
}
/* |a - b| <= tol * |b| + atol, NaN == NaN */
static int par_close(float a, float b, float tol, float atol) {
    if (a != a || b != b) return a != a && b != b;
    if (a == b) return 1;
    return fabsf(a - b) <= tol * fabsf(b) + atol;
}

/* Equal bits, except that any NaN equals any NaN: a GPU's arithmetic returns
   its one canonical NaN (f32 0x7fffffff), the CPU the input's NaN (seen on an
   H100, 2026-11-28); IEEE 754 leaves the payload open, and a step that meets
   a NaN is skipped. */
static int par_same_bits_nan_any(capex_dtype t, const void *a, const void *b, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float x, y;
        if (t == CAPEX_F32) { memcpy(&x, (const float *)a + i, 4); memcpy(&y, (const float *)b + i, 4); }
        else {
            uint16_t u = ((const uint16_t *)a)[i], v = ((const uint16_t *)b)[i];
            if (u == v) continue;
            x = t == CAPEX_F16 ? capex_f16_to_f32(u) : capex_bf16_to_f32(u);
            y = t == CAPEX_F16 ? capex_f16_to_f32(v) : capex_bf16_to_f32(v);
            if (!(x != x && y != y)) return 0;
            continue;
        }
        if (memcmp(&x, &y, 4) && !(x != x && y != y)) return 0;
    }
    return 1;
}

/* ---- unscale + inf/NaN check: every dtype pair, bit-exact ---------------- */
static void par_scale(ct_state *ct, env *e) {
    static const int64_t sizes[] = {0, 1, 3, 4, 5, 17, 1000, 4099, 2, 777, 6};
    const size_t n = sizeof sizes / sizeof sizes[0];
    static const int64_t chunks[] = {0, 1000, 999, 4};
    int di, doi, ci, special;
    capex_cuda_ptr dscale = par_alloc(e, 4), dfound = par_alloc(e, 4);
    CT_CHECK(dscale && dfound, "alloc");
    for (di = 0; di < 3; di++)
        for (doi = 0; doi < 3; doi++)
            for (special = 0; special < 3; special++) {
                capex_dtype it = (capex_dtype)di, ot = (capex_dtype)doi;
                par_list in, out, hout;
                capex_tensor_list hin_l, hout_l, din_l, dout_l;
                capex_tensor_op_desc desc;
                float s = special == 0 && doi == 1 ? 1.0f / 1024.0f : 0.75f;
                int cpu_found = 0;
                uint32_t zero = 0, dev_found = 0;
                size_t i;
                capex_tensor_op_desc_init(&desc);
                ci = (di * 3 + doi + special) % 4;
                desc.chunk_size = chunks[ci];
                CT_CHECK(par_list_make(e, &in, it, sizes, n, 1, di == 0 && doi == 1 && special == 0 ? 9e4f : 4.0f, 1), "in");
                if (special) { /* one inf or NaN in tensor 7 */
                    par_fill(&e->seed, it, in.h[7].data, in.h[7].numel, 4.0f, special);
                    CT_CHECK(par_up(e, (capex_cuda_ptr)(uintptr_t)in.d[7].data, in.h[7].data,
                                    (size_t)in.h[7].numel * capex_dtype_size(it)), "up");
                }
                CT_CHECK(par_list_make(e, &out, ot, sizes, n, 0, 0, 0), "out");
                CT_CHECK(par_list_make(e, &hout, ot, sizes, n, 0, 0, 0), "cpu out");
                hin_l = par_hl(&in); hout_l = par_hl(&hout); din_l = par_dl(&in); dout_l = par_dl(&out);
                CT_CHECK(capex_multi_tensor_scale(&desc, &hin_l, &hout_l, s, &cpu_found) == CAPEX_OK, "%s", capex_last_error());
                CT_CHECK(par_up(e, dscale, &s, 4) && par_up(e, dfound, &zero, 4), "up");
                CT_CHECK(capex__go_scale(&e->ex, "t", &desc, &din_l, &dout_l, dscale, dfound, 0, NULL) == CAPEX_OK, "%s",
                         capex_last_error());
                CT_CHECK(par_down(e, &dev_found, dfound, 4), "down");
                CT_CHECK((dev_found != 0) == (cpu_found != 0), "%s->%s special %d: found_inf %u, CPU %d",
                         capex_dtype_name(it), capex_dtype_name(ot), special, dev_found, cpu_found);
                if (special) CT_CHECK(dev_found == 1, "an injected inf/NaN is found");
                for (i = 0; i < n; i++) {
                    size_t bytes = (size_t)sizes[i] * capex_dtype_size(ot);
                    unsigned char *got = (unsigned char *)malloc(bytes + 1);
                    int same;
                    CT_CHECK(got && par_get(e, &out, i, got), "get");
                    same = par_same_bits_nan_any(ot, got, hout.h[i].data, sizes[i]);
                    free(got);
                    CT_CHECK(same, "%s->%s chunk %lld tensor %zu (%lld elements): output differs from the CPU's",
                             capex_dtype_name(it), capex_dtype_name(ot), (long long)desc.chunk_size, i, (long long)sizes[i]);
                }
                /* check only: reads, flags, writes nothing */
                if (doi == di) {
                    CT_CHECK(par_up(e, dfound, &zero, 4), "up");
                    s = 1.0f;
                    CT_CHECK(par_up(e, dscale, &s, 4), "up");
                    CT_CHECK(capex__go_scale(&e->ex, "t", &desc, &din_l, NULL, dscale, dfound, 0, NULL) == CAPEX_OK, "%s",
                             capex_last_error());
                    CT_CHECK(par_down(e, &dev_found, dfound, 4), "down");
                    CT_CHECK((dev_found != 0) == (special != 0), "check-only found_inf %u (special %d)", dev_found, special);
                }
                par_list_free(e, &in);
                par_list_free(e, &out);
                par_list_free(e, &hout);
            }
    par_free(e, dscale);
    par_free(e, dfound);
}

/* ---- check only (no output): one bad element at each place the kernel reads
   it from: each of the 4 strides a thread loads at once (first and second
   round), the vectors after them, the scalar tail, a misaligned tensor. Bad
   is an inf, a NaN, or a finite value whose product with the scale overflows
   the dtype; threads: the launch's block size. ------------------------------ */
static void par_scale_check_positions(ct_state *ct, env *e, int threads) {
    const int64_t b = threads, n = 4 * (8 * b) + 4 * 3 + 3; /* two rounds of 4 strides, 3 vectors, 3 tail elements */
    const int64_t at[] = {0, 3, 4 * b, 4 * b + 1, 8 * b + 2, 12 * b + 3, 16 * b, 24 * b + 5, 32 * b - 1, 32 * b, 32 * b + 11,
                          n - 3, n - 1};
    const size_t nat = sizeof at / sizeof at[0];
    capex_cuda_ptr dscale = par_alloc(e, 4), dfound = par_alloc(e, 4);
    int di, misalign;
    size_t p;
    CT_CHECK(dscale && dfound, "alloc");
    for (di = 0; di < 3; di++)
        for (misalign = 0; misalign < 2; misalign++)
            for (p = 0; p <= nat; p++) { /* p == nat: nothing bad */
                capex_dtype dt = (capex_dtype)di;
                const int64_t sizes[2] = {5, n}; /* misaligned: tensor 1 starts one element late */
                par_list in;
                capex_tensor_list dl;
                capex_tensor_op_desc desc;
                int kind = (int)(p % 3); /* 0 inf, 1 NaN, 2 finite x with x * 2 over the dtype's largest */
                float s = 2.0f;
                uint32_t zero = 0, found = 0;
                size_t es = capex_dtype_size(dt);
                capex_tensor_op_desc_init(&desc);
                CT_CHECK(par_list_make(e, &in, dt, sizes, 2, misalign, 4.0f, 1), "in");
                if (p < nat) {
                    float f = kind == 0 ? -INFINITY : kind == 1 ? NAN : dt == CAPEX_F16 ? 65504.0f : 3.0e38f;
                    uint16_t h = dt == CAPEX_F16 ? capex_f32_to_f16(f) : capex_f32_to_bf16(f);
                    void *src = dt == CAPEX_F32 ? (void *)&f : (void *)&h;
                    memcpy((char *)in.h[1].data + (size_t)at[p] * es, src, es);
                    CT_CHECK(par_up(e, (capex_cuda_ptr)(uintptr_t)in.d[1].data + (size_t)at[p] * es, src, es), "up");
                }
                dl = par_dl(&in);
                CT_CHECK(par_up(e, dscale, &s, 4) && par_up(e, dfound, &zero, 4), "up");
                CT_CHECK(capex__go_scale(&e->ex, "t", &desc, &dl, NULL, dscale, dfound, 0, NULL) == CAPEX_OK, "%s",
                         capex_last_error());
                CT_CHECK(par_down(e, &found, dfound, 4), "down");
                CT_CHECK((found != 0) == (p < nat), "%s check only, misalign %d, bad kind %d at %lld of %lld: found_inf %u",
                         capex_dtype_name(dt), misalign, kind, p < nat ? (long long)at[p] : -1LL, (long long)n, found);
                par_list_free(e, &in);
            }
    par_free(e, dscale);
    par_free(e, dfound);
}

/* ---- more tensors than one launch holds (depth 2: 93 per launch) --------- */
static void par_scale_many(ct_state *ct, env *e) {
    int64_t sizes[200];
    par_list in, out, hout;
    capex_tensor_list a, b, c, d;
    capex_cuda_ptr dscale = par_alloc(e, 4);
    float s = 0.5f;
    size_t i;
    int found = 0;
    for (i = 0; i < 200; i++) sizes[i] = (int64_t)(i % 7) * 3 + (i % 5 == 0 ? 300 : 1);
    CT_CHECK(dscale && par_up(e, dscale, &s, 4), "alloc");
    CT_CHECK(par_list_make(e, &in, CAPEX_BF16, sizes, 200, 1, 8.0f, 1), "in");
    CT_CHECK(par_list_make(e, &out, CAPEX_F32, sizes, 200, 1, 0, 0), "out");
    CT_CHECK(par_list_make(e, &hout, CAPEX_F32, sizes, 200, 0, 0, 0), "hout");
    a = par_hl(&in); b = par_hl(&hout); c = par_dl(&in); d = par_dl(&out);
    CT_CHECK(capex_multi_tensor_scale(NULL, &a, &b, s, &found) == CAPEX_OK, "cpu");
    {
        capex_tensor_op_desc desc;
        capex_tensor_op_desc_init(&desc);
        desc.chunk_size = 64; /* many chunks per tensor, launches cut mid-tensor */
        CT_CHECK(capex__go_scale(&e->ex, "t", &desc, &c, &d, dscale, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
    }
    for (i = 0; i < 200; i++) {
        float buf[400];
        CT_CHECK(par_get(e, &out, i, buf), "get");
        CT_CHECK(!memcmp(buf, hout.h[i].data, (size_t)sizes[i] * 4), "tensor %zu of 200 differs", i);
    }
    par_list_free(e, &in);
    par_list_free(e, &out);
    par_list_free(e, &hout);
    par_free(e, dscale);
}

/* ---- L2 norms (total, per tensor) and clipping ---------------------------- */
static void par_norms(ct_state *ct, env *e) {
    static const int64_t sizes[] = {5, 0, 4096, 1, 3001, 64, 7, 12345, 8};
    const size_t n = sizeof sizes / sizeof sizes[0];
    int di;
    for (di = 0; di < 4; di++) { /* 3: f32 again, 48-element chunks: partials of 2 launches */
        par_list x;
        capex_tensor_list hl, dl;
        capex_tensor_op_desc desc;
        size_t ws_bytes = 0, i;
        capex_cuda_ptr ws, dtot, dper;
        float cpu_tot, cpu_per[16], tot1, tot2, per[16], per2[16];
        capex_tensor_op_desc_init(&desc);
        desc.chunk_size = di == 1 ? 1000 : di == 3 ? 48 : 0;
        CT_CHECK(par_list_make(e, &x, (capex_dtype)(di % 3), sizes, n, 1, 3.0f, 1), "list");
        hl = par_hl(&x);
        dl = par_dl(&x);
        CT_CHECK(capex_multi_tensor_l2norm(&desc, &hl, &cpu_tot, cpu_per) == CAPEX_OK, "cpu");
        CT_CHECK(capex_cuda_multi_tensor_workspace_size(&desc, &dl, 1, &ws_bytes) == CAPEX_OK, "%s", capex_last_error());
        ws = par_alloc(e, ws_bytes);
        dtot = par_alloc(e, 4);
        dper = par_alloc(e, 4 * n);
        CT_CHECK(ws && dtot && dper, "alloc");
        CT_CHECK(capex__go_l2norm(&e->ex, &desc, &dl, ws, ws_bytes, dtot, dper, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(par_down(e, &tot1, dtot, 4) && par_down(e, per, dper, 4 * n), "down");
        CT_CHECK(par_close(tot1, cpu_tot, 3e-7f, 0), "%s total norm %.9g, CPU %.9g", capex_dtype_name((capex_dtype)(di % 3)),
                 (double)tot1, (double)cpu_tot);
        for (i = 0; i < n; i++)
            CT_CHECK(par_close(per[i], cpu_per[i], 3e-7f, 0), "tensor %zu norm %.9g, CPU %.9g", i, (double)per[i],
                     (double)cpu_per[i]);
        CT_CHECK(per[1] == 0.0f, "an empty tensor's norm is 0");
        /* deterministic: the same bits again */
        CT_CHECK(capex__go_l2norm(&e->ex, &desc, &dl, ws, ws_bytes, dtot, dper, NULL) == CAPEX_OK, "again");
        CT_CHECK(par_down(e, &tot2, dtot, 4) && par_down(e, per2, dper, 4 * n), "down");
        CT_CHECK(par_f2u(tot1) == par_f2u(tot2) && !memcmp(per, per2, 4 * n), "norms are bitwise reproducible");
        /* too small a workspace is refused before any launch */
        CT_CHECK(capex__go_l2norm(&e->ex, &desc, &dl, ws, ws_bytes - 8, dtot, dper, NULL) == CAPEX_ERR_SIZE_MISMATCH,
                 "small workspace");
        par_free(e, ws);
        par_free(e, dtot);
        par_free(e, dper);
        par_list_free(e, &x);
    }
}

/* The sum-of-squares kernels' documented order, in float64 on the host: thread
   t of `threads` sums its 4-element vectors k = t, t + threads, ... (when the
   chunk is 16-byte / 8-byte aligned), then its scalars 4*nv + t, ...; the block
   adds the threads' sums as a tree (capex_go_bsum). Unrolling the loads must
   not change a bit of it. */
static double par_sumsq_chunk(capex_dtype dt, const void *h, int64_t off, int64_t n, uintptr_t dev, int threads) {
    size_t es = capex_dtype_size(dt);
    int64_t nv = ((dev + (uintptr_t)off * es) & (4 * es - 1)) == 0 ? n / 4 : 0, k, i;
    double sh[512];
    int t, j, st;
    for (t = 0; t < threads; t++) {
        double acc = 0.0;
        for (k = t; k < nv; k += threads)
            for (j = 0; j < 4; j++) {
                double d = (double)par_val(dt, h, off + 4 * k + j), sq = d * d;
                acc += sq;
            }
        for (i = 4 * nv + t; i < n; i += threads) {
            double d = (double)par_val(dt, h, off + i), sq = d * d;
            acc += sq;
        }
        sh[t] = acc;
    }
    for (st = threads / 2; st > 0; st /= 2)
        for (t = 0; t < st; t++) sh[t] += sh[t + st];
    return sh[0];
}
/* capex_go_reduce's order over the partials: per thread, then the tree. */
static double par_reduce_order(const double *part, int64_t count, int threads) {
    double sh[512];
    int64_t i;
    int t, st;
    for (t = 0; t < threads; t++) {
        double acc = 0.0;
        for (i = t; i < count; i += threads) acc += part[i];
        sh[t] = acc;
    }
    for (st = threads / 2; st > 0; st /= 2)
        for (t = 0; t < st; t++) sh[t] += sh[t + st];
    return sh[0];
}

/* Block partials and their reduction, bit for bit against the order above, on
   aligned and misaligned tensors long enough for every loop of the kernel
   (unrolled x4, one vector at a time, scalar tail) at `threads` per block. */
static void par_sumsq_order(ct_state *ct, env *e, int threads) {
    static const int64_t sizes[] = {5, 0, 70001, 1, 3001, 64, 7, 20483, 8, 2050, 16 * 512 * 4 + 13};
    const size_t n = sizeof sizes / sizeof sizes[0];
    int di;
    for (di = 0; di < 6; di++) {
        par_list x;
        capex_tensor_list hl, dl;
        capex_tensor_op_desc desc;
        size_t ws_bytes = 0, i;
        int64_t chunk, c, nch = 0, zero = 0;
        double *part = NULL, got = 0.0, want;
        capex_cuda_ptr ws, dsum;
        capex_dtype dt = (capex_dtype)(di % 3);
        capex_tensor_op_desc_init(&desc);
        desc.chunk_size = di >= 3 ? 4096 : 0;
        chunk = capex__go_chunk_of(&desc);
        CT_CHECK(par_list_make(e, &x, dt, sizes, n, 1, 3.0f, 1), "list");
        hl = par_hl(&x);
        dl = par_dl(&x);
        (void)hl;
        CT_CHECK(capex_cuda_multi_tensor_workspace_size(&desc, &dl, 1, &ws_bytes) == CAPEX_OK, "%s", capex_last_error());
        ws = par_alloc(e, ws_bytes);
        dsum = par_alloc(e, 8);
        CT_CHECK(ws && dsum, "alloc");
        CT_CHECK(capex__go_l2norm(&e->ex, &desc, &dl, ws, ws_bytes, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (i = 0; i < n; i++) nch += capex__go_nchunks(sizes[i], chunk);
        part = (double *)malloc((size_t)nch * 8 + 8);
        CT_CHECK(part && par_down(e, part, ws, (size_t)nch * 8), "down");
        for (i = 0, c = 0; i < n; i++) {
            int64_t off;
            for (off = 0; off < sizes[i]; off += chunk, c++) {
                int64_t m = sizes[i] - off < chunk ? sizes[i] - off : chunk;
                want = par_sumsq_chunk(dt, x.h[i].data, off, m, (uintptr_t)x.d[i].data, threads);
                CT_CHECK(memcmp(&want, &part[c], 8) == 0, "%s tensor %zu (%lld elements%s) chunk at %lld: partial %.17g, "
                         "the kernel's order in float64 gives %.17g", capex_dtype_name(dt), i, (long long)sizes[i],
                         i % 3 == 1 ? ", misaligned" : "", (long long)off, part[c], want);
            }
        }
        CT_CHECK(capex__go_reduce(&e->ex, ws, &zero, &nch, 1, dsum, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(par_down(e, &got, dsum, 8), "down");
        want = par_reduce_order(part, nch, threads);
        CT_CHECK(memcmp(&want, &got, 8) == 0, "%s: %lld partials reduce to %.17g, the order gives %.17g", capex_dtype_name(dt),
                 (long long)nch, got, want);
        free(part);
        par_free(e, ws);
        par_free(e, dsum);
        par_list_free(e, &x);
    }
    { /* The reduce kernel on its own, 64 segments (one block each) long enough for
         its unrolled loop. In segment g only thread g*7 % threads gets nonzero
         partials, so the result is that thread's own sum, exactly: a change of
         its order shows in the last bits, where a block's total would hide it. */
        enum { NSEG = 64 };
        int64_t st[NSEG], cnt[NSEG], total = 0, g, i;
        double *part, got[NSEG], want;
        capex_cuda_ptr dpart, dsum;
        for (g = 0; g < NSEG; g++) {
            st[g] = total;
            cnt[g] = g == 0 ? 0 : g == 1 ? 3 : 4L * threads * (1 + g % 8) + g % 5;
            total += cnt[g];
        }
        part = (double *)calloc((size_t)total + 1, 8);
        dpart = par_alloc(e, (size_t)total * 8 + 8);
        dsum = par_alloc(e, 8 * NSEG);
        CT_CHECK(part && dpart && dsum, "alloc");
        for (g = 0; g < NSEG; g++)
            for (i = (g * 7) % threads; i < cnt[g]; i += threads) { /* [1, 16), all 53 bits random */
                double r = ldexp((double)par_rng(&e->seed), -32) + ldexp((double)par_rng(&e->seed), -64);
                part[st[g] + i] = ldexp(1.0 + r, (int)(par_rng(&e->seed) % 4));
            }
        CT_CHECK(par_up(e, dpart, part, (size_t)total * 8 + 8), "up");
        CT_CHECK(capex__go_reduce(&e->ex, dpart, st, cnt, NSEG, dsum, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(par_down(e, got, dsum, 8 * NSEG), "down");
        for (g = 0; g < NSEG; g++) {
            want = par_reduce_order(part + st[g], cnt[g], threads);
            CT_CHECK(memcmp(&want, &got[g], 8) == 0, "segment %lld: %lld partials reduce to %.17g, the order gives %.17g",
                     (long long)g, (long long)cnt[g], got[g], want);
        }
        free(part);
        par_free(e, dpart);
        par_free(e, dsum);
    }
}

static void par_clip(ct_state *ct, env *e) {
    static const int64_t s1[] = {100, 5, 0, 2049}, s2[] = {3, 777, 4};
    int pass;
    for (pass = 0; pass < 3; pass++) {
        par_list a, b;
        capex_tensor_list hl[2], dl[2];
        size_t ws_bytes = 0, i, l;
        capex_cuda_ptr ws, dtot, dcoef;
        float max_norm = pass == 0 ? 1.0f : pass == 1 ? 1e30f : 0.0f, cpu_tot, cpu_coef, tot, coef;
        CT_CHECK(par_list_make(e, &a, CAPEX_F32, s1, 4, 1, 2.0f, 1), "a");
        CT_CHECK(par_list_make(e, &b, pass == 2 ? CAPEX_BF16 : CAPEX_F16, s2, 3, 1, 2.0f, 1), "b");
        hl[0] = par_hl(&a); hl[1] = par_hl(&b); dl[0] = par_dl(&a); dl[1] = par_dl(&b);
        CT_CHECK(capex_clip_grad_norm_coef(NULL, hl, 2, max_norm, &cpu_tot, &cpu_coef) == CAPEX_OK, "cpu");
        CT_CHECK(capex_clip_grad_norm(NULL, hl, 2, max_norm, &cpu_tot) == CAPEX_OK, "cpu");
        CT_CHECK(capex_cuda_multi_tensor_workspace_size(NULL, dl, 2, &ws_bytes) == CAPEX_OK, "ws");
        ws = par_alloc(e, ws_bytes);
        dtot = par_alloc(e, 4);
        dcoef = par_alloc(e, 4);
        CT_CHECK(capex__go_clip(&e->ex, NULL, dl, 2, max_norm, ws, ws_bytes, dtot, pass == 2 ? 0 : dcoef, 1, NULL) ==
                 CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(par_down(e, &tot, dtot, 4), "down");
        CT_CHECK(par_close(tot, cpu_tot, 3e-7f, 0), "total %.9g CPU %.9g", (double)tot, (double)cpu_tot);
        if (pass != 2) {
            CT_CHECK(par_down(e, &coef, dcoef, 4), "down");
            CT_CHECK(par_close(coef, cpu_coef, 3e-7f, 0), "coef %.9g CPU %.9g", (double)coef, (double)cpu_coef);
        }
        for (l = 0; l < 2; l++) {
            par_list *pl = l ? &b : &a;
            for (i = 0; i < pl->n; i++) {
                static unsigned char buf[4 * 4096];
                int64_t k;
                float tol = pl->dt == CAPEX_F32 ? 4e-7f : pl->dt == CAPEX_F16 ? 1.0f / 1024 : 1.0f / 128;
                CT_CHECK(par_get(e, pl, i, buf), "get");
                if (pass == 1) /* no clipping: untouched, bit for bit */
                    CT_CHECK(!memcmp(buf, pl->h[i].data, (size_t)pl->h[i].numel * capex_dtype_size(pl->dt)), "unclipped");
                for (k = 0; k < pl->h[i].numel; k++)
                    CT_CHECK(par_close(par_val(pl->dt, buf, k), par_val(pl->dt, pl->h[i].data, k), tol, 1e-30f),
                             "pass %d list %zu tensor %zu [%lld]: %.9g CPU %.9g", pass, l, i, (long long)k,
                             (double)par_val(pl->dt, buf, k), (double)par_val(pl->dt, pl->h[i].data, k));
            }
        }
        par_free(e, ws);
        par_free(e, dtot);
        par_free(e, dcoef);
        par_list_free(e, &a);
        par_list_free(e, &b);
    }
}

/* ---- optimizers: the same groups on the CPU and the device ---------------- */
typedef struct par_param {
    int64_t numel;
    capex_dtype gd;
    int model; /* 0 none, 1 f16, 2 bf16 */
    float *p, *m, *v;
    void *g, *h;
    capex_cuda_ptr dp, dg, dh, dbase[3];
} par_param;

typedef struct par_opt {
    int n;
    par_param t[120];
    capex_optim *cpu;
    capex_cuda_optim *dev;
} par_opt;

static void par_opt_free(env *e, par_opt *o) {
    int i, j;
    for (i = 0; i < o->n; i++) {
        free(o->t[i].p); free(o->t[i].g); free(o->t[i].h);
        for (j = 0; j < 3; j++) par_free(e, o->t[i].dbase[j]);
    }
    capex_optim_destroy(o->cpu);
    capex_cuda_optim_destroy(o->dev);
    memset(o, 0, sizeof *o);
}

/* 1: every tensor with a model copy is pure_half (O3, no master weights) */
static int par_pure_half;

/* Tensors of every grad dtype and model kind, odd sizes, misaligned, in two
   groups (the second with other hyperparameters). */
static int par_opt_make(env *e, par_opt *o, const capex_optim_desc *d, int ntens, int64_t big) {
    static const int64_t sizes[] = {37, 1, 0, 1000, 5, 2051, 4, 4096, 3, 999, 64, 17};
    capex_optim_param cp[120], dp[120];
    capex_optim_hparams hp2;
    int i, half;
    memset(o, 0, sizeof *o);
    o->n = ntens;
    for (i = 0; i < ntens; i++) {
        par_param *t = &o->t[i];
        size_t ges, mis = (i % 4 == 1);
        t->numel = i == 3 && big ? big : sizes[i % 12] + (i / 12);
        t->gd = (capex_dtype)(i % 3);
        t->model = (i / 3) % 3;
        ges = capex_dtype_size(t->gd);
        t->p = (float *)malloc((size_t)t->numel * 4 + 4);
        t->g = malloc((size_t)t->numel * ges + 4);
        t->h = malloc((size_t)t->numel * 2 + 4);
        if (!t->p || !t->g || !t->h) return 0;
        par_fill(&e->seed, CAPEX_F32, t->p, t->numel, 1.0f, 0);
        par_fill(&e->seed, t->gd, t->g, t->numel, 3000.0f, 0);
        memset(t->h, 0xA5, (size_t)t->numel * 2);
        t->dbase[0] = par_alloc(e, (size_t)t->numel * 4 + 16);
        t->dbase[1] = par_alloc(e, (size_t)t->numel * ges + 16);
        t->dbase[2] = par_alloc(e, (size_t)t->numel * 2 + 16);
        if (!t->dbase[0] || !t->dbase[1] || !t->dbase[2]) return 0;
        t->dp = t->dbase[0] + (mis ? 4 : 0);
        t->dg = t->dbase[1] + (mis ? ges : 0);
        t->dh = t->dbase[2] + (mis ? 2 : 0);
        if (!par_up(e, t->dp, t->p, (size_t)t->numel * 4) || !par_up(e, t->dg, t->g, (size_t)t->numel * ges)) return 0;
        capex_optim_param_init(&cp[i]);
        cp[i].param = t->p; cp[i].grad = t->g; cp[i].grad_dtype = t->gd; cp[i].numel = t->numel;
        if (t->model) { cp[i].model = t->h; cp[i].model_dtype = t->model == 1 ? CAPEX_F16 : CAPEX_BF16; }
        if (t->model && par_pure_half) { /* the weights live in the model copy: the same on both sides */
            cp[i].pure_half = 1;
            if (t->model == 1) capex_f32_to_f16_array(t->p, (uint16_t *)t->h, (size_t)t->numel);
            else capex_f32_to_bf16_array(t->p, (uint16_t *)t->h, (size_t)t->numel);
            if (!par_up(e, t->dh, t->h, (size_t)t->numel * 2)) return 0;
        }
        dp[i] = cp[i];
        dp[i].param = (float *)(uintptr_t)t->dp;
        dp[i].grad = (const void *)(uintptr_t)t->dg;
        dp[i].model = t->model ? (void *)(uintptr_t)t->dh : NULL;
    }
    if (capex_optim_create(d, &o->cpu) != CAPEX_OK) return 0;
    if (e->ctx ? capex_cuda_optim_create(e->ctx, d, &o->dev) != CAPEX_OK
               : capex__go_optim_create(&e->ex, d, &o->dev) != CAPEX_OK)
        return 0;
    half = ntens / 2;
    hp2 = d->defaults;
    hp2.lr *= 0.5f;
    hp2.weight_decay = hp2.weight_decay == 0.0f ? 0.05f : 0.0f;
    hp2.beta1 = 0.8f;
    hp2.bias_correction = !hp2.bias_correction;
    hp2.grad_averaging = !hp2.grad_averaging;
    if (d->kind == CAPEX_OPTIM_SGD) { hp2.nesterov = 0; hp2.momentum = hp2.momentum ? 0.0f : 0.5f; hp2.dampening = 0.25f; }
    if (capex_optim_add_group(o->cpu, NULL, cp, (size_t)half, NULL) != CAPEX_OK ||
        capex_optim_add_group(o->cpu, &hp2, cp + half, (size_t)(ntens - half), NULL) != CAPEX_OK)
        return 0;
    if (capex_cuda_optim_add_group(o->dev, NULL, dp, (size_t)half, NULL) != CAPEX_OK ||
        capex_cuda_optim_add_group(o->dev, &hp2, dp + half, (size_t)(ntens - half), NULL) != CAPEX_OK)
        return 0;
    return 1;
}

/* Compares weights, moments and model copies; exact (tol 0) or within tol. */
static void par_opt_compare(ct_state *ct, env *e, par_opt *o, float tol, const char *what) {
    int i, gi = 0;
    size_t idx = 0;
    for (i = 0; i < o->n; i++) {
        par_param *t = &o->t[i];
        size_t nb = (size_t)t->numel * 4, grp = i < o->n / 2 ? 0 : 1;
        float *buf = (float *)malloc(nb + 4);
        uint16_t *hb = (uint16_t *)malloc((size_t)t->numel * 2 + 4);
        float *cm = NULL, *cv = NULL;
        capex_cuda_ptr dm = 0, dv = 0;
        int64_t k;
        CT_CHECK(buf && hb, "malloc");
        if (i == o->n / 2) idx = 0;
        gi = (int)idx++;
        CT_CHECK(capex_optim_get_state(o->cpu, grp, (size_t)gi, &cm, &cv) == CAPEX_OK, "cpu state");
        CT_CHECK(capex_cuda_optim_get_state(o->dev, grp, (size_t)gi, &dm, &dv) == CAPEX_OK, "dev state");
        CT_CHECK(par_down(e, buf, t->dp, nb), "down");
        for (k = 0; k < t->numel; k++)
            CT_CHECK(tol == 0 ? par_f2u(buf[k]) == par_f2u(t->p[k]) : par_close(buf[k], t->p[k], tol, 1e-30f),
                     "%s: tensor %d (%s grads, model %d, %lld elements) param[%lld] = %.9g, CPU %.9g", what, i,
                     capex_dtype_name(t->gd), t->model, (long long)t->numel, (long long)k, (double)buf[k], (double)t->p[k]);
        CT_CHECK(((cm == NULL) == (dm == 0) && (cv == NULL) == (dv == 0)) || t->numel == 0, "%s: tensor %d moments exist on both", what, i);
        {
            float *cx = NULL;
            capex_cuda_ptr dx = 0;
            CT_CHECK(capex_optim_get_max_exp_avg_sq(o->cpu, grp, (size_t)gi, &cx) == CAPEX_OK &&
                     capex_cuda_optim_get_max_exp_avg_sq(o->dev, grp, (size_t)gi, &dx) == CAPEX_OK, "max state");
            CT_CHECK((cx == NULL) == (dx == 0) || t->numel == 0, "%s: tensor %d amsgrad max exists on both", what, i);
            if (cx && dx && t->numel) {
                CT_CHECK(par_down(e, buf, dx, nb), "down");
                for (k = 0; k < t->numel; k++)
                    CT_CHECK(tol == 0 ? par_f2u(buf[k]) == par_f2u(cx[k]) : par_close(buf[k], cx[k], tol, 1e-30f),
                             "%s: tensor %d max_exp_avg_sq[%lld] = %.9g, CPU %.9g", what, i, (long long)k, (double)buf[k],
                             (double)cx[k]);
            }
        }
        if (cm && dm) {
            CT_CHECK(par_down(e, buf, dm, nb), "down");
            for (k = 0; k < t->numel; k++)
                CT_CHECK(tol == 0 ? par_f2u(buf[k]) == par_f2u(cm[k]) : par_close(buf[k], cm[k], tol, 1e-30f),
                         "%s: tensor %d exp_avg[%lld] = %.9g, CPU %.9g", what, i, (long long)k, (double)buf[k], (double)cm[k]);
        }
        if (cv && dv) {
            CT_CHECK(par_down(e, buf, dv, nb), "down");
            for (k = 0; k < t->numel; k++)
                CT_CHECK(tol == 0 ? par_f2u(buf[k]) == par_f2u(cv[k]) : par_close(buf[k], cv[k], tol, 1e-30f),
                         "%s: tensor %d exp_avg_sq[%lld] = %.9g, CPU %.9g", what, i, (long long)k, (double)buf[k], (double)cv[k]);
        }
        if (t->model) {
            const uint16_t *ch = (const uint16_t *)t->h;
            float htol = tol == 0 ? 0 : t->model == 1 ? 1.0f / 1024 : 1.0f / 128;
            CT_CHECK(par_down(e, hb, t->dh, (size_t)t->numel * 2), "down");
            for (k = 0; k < t->numel; k++) {
                capex_dtype md = t->model == 1 ? CAPEX_F16 : CAPEX_BF16;
                CT_CHECK(htol == 0 ? hb[k] == ch[k] : par_close(par_val(md, hb, k), par_val(md, ch, k), htol, 1e-30f),
                         "%s: tensor %d model[%lld] = 0x%04x, CPU 0x%04x", what, i, (long long)k, hb[k], ch[k]);
            }
        }
        free(buf);
        free(hb);
    }
}

/* Three steps: clean (inv_scale, clip), injected inf (skipped: nothing
   changes), clean again with new values, then an lr change. */
static void par_opt_run(ct_state *ct, env *e, const capex_optim_desc *d, int ntens, int64_t big, float tol,
                        const char *what) {
    par_opt o;
    capex_cuda_ptr dinv = par_alloc(e, 4), dclip = par_alloc(e, 4), dfound = par_alloc(e, 4);
    static const float inv[3] = {1.0f / 1024.0f, 1.0f / 512.0f, 1.0f / 2048.0f}, clip[3] = {0.5f, 1.0f, 0.25f};
    int s;
    int64_t st0 = -1, st1 = -1, cst = -1;
    CT_CHECK(dinv && dclip && dfound, "alloc");
    CT_CHECK(par_opt_make(e, &o, d, ntens, big), "%s: setup: %s", what, capex_last_error());
    for (s = 0; s < 3; s++) {
        uint32_t found = s == 1;
        CT_CHECK(par_up(e, dinv, &inv[s], 4) && par_up(e, dclip, &clip[s], 4) && par_up(e, dfound, &found, 4), "up");
        CT_CHECK(capex_optim_step(o.cpu, inv[s], clip[s], (int)found) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, dinv, dclip, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, tol, what);
        if (ct->failed) break;
    }
    if (!ct->failed) {
        CT_CHECK(capex_cuda_optim_get_step(o.dev, 0, &st0, NULL) == CAPEX_OK && capex_cuda_optim_get_step(o.dev, 1, &st1, NULL) == CAPEX_OK, "get_step");
        CT_CHECK(capex_optim_get_step(o.cpu, 1, &cst) == CAPEX_OK, "cpu get_step");
        CT_CHECK(st0 == 2 && st1 == 2 && cst == 2, "%s: steps %lld %lld (CPU %lld), want 2: the skipped one does not count",
                 what, (long long)st0, (long long)st1, (long long)cst);
        /* lr schedule: set on both, one more clean step with no scale/clip pointers */
        CT_CHECK(capex_optim_set_lr(o.cpu, 0, 2e-3f) == CAPEX_OK && capex_cuda_optim_set_lr(o.dev, 0, 2e-3f, NULL) == CAPEX_OK, "lr");
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu");
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, tol, what);
    }
    if (!ct->failed && d->kind == CAPEX_OPTIM_SGD && d->defaults.momentum != 0.0f) {
        /* momentum turned off later: plain SGD on both (Apex: if (momentum != 0)), buffers kept */
        capex_optim_hparams h;
        CT_CHECK(capex_optim_get_hparams(o.cpu, 0, &h) == CAPEX_OK, "hparams");
        h.momentum = 0.0f;
        h.nesterov = 0;
        CT_CHECK(capex_optim_set_hparams(o.cpu, 0, &h) == CAPEX_OK && capex_cuda_optim_set_hparams(o.dev, 0, &h, NULL) == CAPEX_OK,
                 "momentum 0: %s", capex_last_error());
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu");
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, tol, "SGD, momentum turned off");
        if (!ct->failed) {
            /* its checkpoint keeps the buffers momentum resumes from (the CPU's
               does: they exist), and goes back onto the device */
            capex_optim *hc = NULL;
            capex_result rr = capex_cuda_optim_to_host(o.dev, 0, NULL, &hc);
            int t;
            CT_CHECK(rr == CAPEX_OK, "SGD momentum off: to_host: %s", capex_last_error());
            for (t = 0; t < o.n / 2 && rr == CAPEX_OK; t++) {
                float *hm = NULL, *cm = NULL;
                int64_t k;
                capex_optim_get_state(hc, 0, (size_t)t, &hm, NULL);
                capex_optim_get_state(o.cpu, 0, (size_t)t, &cm, NULL);
                if (!o.t[t].numel) continue;
                if (!hm || !cm) rr = CAPEX_ERR_SIZE_MISMATCH;
                for (k = 0; rr == CAPEX_OK && k < o.t[t].numel; k++)
                    if (tol == 0 ? par_f2u(hm[k]) != par_f2u(cm[k]) : !par_close(hm[k], cm[k], tol, 1e-30f))
                        rr = CAPEX_ERR_SIZE_MISMATCH;
                if (rr != CAPEX_OK) {
                    capex_optim_destroy(hc);
                    CT_CHECK(0, "SGD momentum off: the checkpoint's momentum buffer of tensor %d is %s", t,
                             hm ? "not the CPU's" : "missing");
                }
            }
            rr = capex_cuda_optim_from_host(o.dev, hc, 0, NULL);
            capex_optim_destroy(hc);
            CT_CHECK(rr == CAPEX_OK, "SGD momentum off: from_host of its own checkpoint: %s", capex_last_error());
        }
    }
    if (!ct->failed) {
        /* a kernel-driven lr (written through lr_ptr) is what a checkpoint saves */
        const float lr = 3e-3f;
        capex_optim *h = NULL;
        capex_optim_hparams hp;
        CT_CHECK(par_up(e, capex_cuda_optim_lr_ptr(o.dev, 1), &lr, 4), "lr up");
        CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &h) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(h && capex_optim_get_hparams(h, 1, &hp) == CAPEX_OK && hp.lr == lr, "%s: checkpoint lr %g, device %g", what,
                 h ? (double)hp.lr : -1.0, (double)lr);
        capex_optim_destroy(h);
    }
    par_opt_free(e, &o);
    par_free(e, dinv);
    par_free(e, dclip);
    par_free(e, dfound);
}

static void par_adam(ct_state *ct, env *e) {
    capex_optim_desc d;
    int w, sr;
    for (w = 0; w < 2; w++)
        for (sr = 0; sr < 2; sr++) {
            capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
            d.adam_w_mode = w;
            d.defaults.weight_decay = 0.01f;
            d.stochastic_rounding = sr;
            d.seed = 0x1234567890abcdefull;
            d.exec.chunk_size = sr ? 1000 : 0;
            par_opt_run(ct, e, &d, 24, 0, 0, w ? "AdamW" : "Adam L2");
            if (ct->failed) return;
        }
    /* more tensors than a depth-6 launch holds (39) */
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.exec.chunk_size = 256;
    par_opt_run(ct, e, &d, 100, 0, 0, "AdamW, 100 tensors");
}

/* O3's pure_half: fp32 params mirror the model copy after add_group and
   every step, on the device as on the CPU (bit for bit); the CPU side is
   checked against hand mirroring in tests/test_optim.c. */
static void par_pure_half_steps(ct_state *ct, env *e) {
    capex_optim_desc d;
    int k;
    for (k = 0; k < 3 && !ct->failed; k++) {
        capex_optim_desc_init(&d, k == 0 ? CAPEX_OPTIM_ADAM : k == 1 ? CAPEX_OPTIM_SGD : CAPEX_OPTIM_ADAGRAD);
        d.defaults.momentum = k == 1 ? 0.9f : 0.0f;
        d.defaults.weight_decay = 0.01f;
        par_pure_half = 1;
        par_opt_run(ct, e, &d, 24, 0, 0, k == 0 ? "AdamW pure_half" : k == 1 ? "SGD pure_half" : "Adagrad pure_half");
        par_pure_half = 0;
    }
    for (k = 0; k < 2 && !ct->failed; k++) {
        /* the model copy written after add_group (restored weights) is what
           the next step updates, on both sides (test_optim checks the CPU's
           result against an optimizer built on those weights) */
        par_opt o;
        int i;
        capex_optim_desc_init(&d, k == 0 ? CAPEX_OPTIM_ADAM : CAPEX_OPTIM_SGD);
        d.defaults.momentum = k == 1 ? 0.9f : 0.0f;
        par_pure_half = 1;
        CT_CHECK(par_opt_make(e, &o, &d, 8, 0), "setup: %s", capex_last_error());
        par_pure_half = 0;
        for (i = 0; i < o.n && !ct->failed; i++) {
            par_param *t = &o.t[i];
            int64_t j;
            if (!t->model || !t->numel) continue;
            for (j = 0; j < t->numel; j++) {
                float v = (float)(j % 7) - 3.5f;
                ((uint16_t *)t->h)[j] = t->model == 1 ? capex_f32_to_f16(v) : capex_f32_to_bf16(v);
            }
            CT_CHECK(par_up(e, t->dh, t->h, (size_t)t->numel * 2), "up");
        }
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        if (!ct->failed) par_opt_compare(ct, e, &o, 0, k == 0 ? "AdamW pure_half, model written after add_group"
                                                              : "SGD pure_half, model written after add_group");
        par_opt_free(e, &o);
    }
}

static void par_sgd(ct_state *ct, env *e) {
    capex_optim_desc d;
    int v;
    for (v = 0; v < 5; v++) { /* v 4: no momentum, stochastic rounding */
        capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
        d.defaults.lr = 0.1f;
        d.defaults.momentum = v == 0 || v == 4 ? 0.0f : 0.9f;
        d.defaults.nesterov = v == 2;
        d.defaults.dampening = v == 3 ? 0.1f : 0.0f;
        d.defaults.weight_decay = 0.01f;
        d.wd_after_momentum = v == 3;
        d.stochastic_rounding = v == 1 || v == 4;
        d.seed = 42;
        d.exec.chunk_size = v == 2 ? 999 : 0;
        par_opt_run(ct, e, &d, 24, 0, 0, "SGD");
        if (ct->failed) return;
    }
}

/* LAMB's norms are summed in another order than the CPU's: close, not exact. */
static void par_lamb(ct_state *ct, env *e) {
    capex_optim_desc d;
    int v;
    for (v = 0; v < 4; v++) { /* v 3: L2 mode with stochastic rounding */
        capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
        d.adam_w_mode = v != 1 && v != 3;
        d.use_nvlamb = v == 2;
        d.max_grad_norm = v == 2 ? 0.0f : 1.0f;
        d.stochastic_rounding = v == 0 || v == 3;
        d.exec.chunk_size = v == 1 ? 1000 : 0;
        par_opt_run(ct, e, &d, 24, 0, 2e-6f, "LAMB");
        if (ct->failed) return;
    }
    /* partials of several launches: a 21000-element tensor in 64-element chunks (> 320) */
    capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
    d.exec.chunk_size = 64;
    par_opt_run(ct, e, &d, 12, 21000, 2e-6f, "LAMB, several launches");
}

/* NovoGrad: per-tensor norms summed in another order than the CPU's (v and
   everything after it close, not exact); every mode flag, grad dtype, model
   kind, found_inf skip, several launches; v itself through to_host. */
static void par_novograd(ct_state *ct, env *e) {
    capex_optim_desc d;
    int v;
    for (v = 0; v < 4; v++) {
        capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
        d.defaults.lr = 0.01f;
        d.defaults.weight_decay = v & 1 ? 0.01f : 0.0f;
        d.reg_inside_moment = v & 1;
        d.init_zero = (v >> 1) & 1;
        d.stochastic_rounding = v >= 2; /* with either moment mode */
        d.seed = 9;
        d.exec.chunk_size = v == 3 ? 1000 : 0;
        par_opt_run(ct, e, &d, 24, 0, 2e-6f, "NovoGrad");
        if (ct->failed) return;
    }
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    d.exec.chunk_size = 64;
    par_opt_run(ct, e, &d, 12, 21000, 2e-6f, "NovoGrad, several launches");
    if (ct->failed) return;
    { /* the per-tensor v, device (via to_host) against the CPU's */
        par_opt o;
        capex_optim *h = NULL;
        int s, i;
        d.init_zero = 1;
        CT_CHECK(par_opt_make(e, &o, &d, 12, 0), "NovoGrad setup: %s", capex_last_error());
        for (s = 0; s < 2 && !ct->failed; s++) {
            CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step: %s", capex_last_error());
            CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "dev step: %s", capex_last_error());
        }
        CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &h) == CAPEX_OK, "to_host: %s", capex_last_error());
        for (i = 0; i < o.n && !ct->failed; i++) {
            size_t grp = i < o.n / 2 ? 0 : 1, idx = (size_t)(i < o.n / 2 ? i : i - o.n / 2);
            float vc = -1.0f, vd = -2.0f;
            CT_CHECK(capex_optim_get_novograd_norm(o.cpu, grp, idx, &vc) == CAPEX_OK &&
                     capex_optim_get_novograd_norm(h, grp, idx, &vd) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(par_close(vd, vc, 2e-6f, 1e-30f), "NovoGrad tensor %d: device v %.9g, CPU %.9g", i, (double)vd, (double)vc);
        }
        capex_optim_destroy(h);
        par_opt_free(e, &o);
    }
}

/* ---- checkpoints: the device optimizer in capex_optim's format ------------
   After two steps on both, the device state saved through to_host is the
   CPU optimizer's file byte for byte (Adam, SGD: bit-exact math); the device
   then takes a step of its own, is restored from the file (from_host) and
   steps again in lockstep with the CPU: equal again (step counts, moments,
   weights, model copies all came back). Mismatches are refused unchanged. */
static int par_save_mem(const capex_optim *o, unsigned char **buf, size_t *len) {
    capex_state_writer *w = NULL;
    int ok = capex_state_writer_create(NULL, &w) == CAPEX_OK && capex_optim_save(o, w, "optim", CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK &&
             capex_state_write_memory(w, NULL, 0, len) == CAPEX_OK && (*buf = (unsigned char *)malloc(*len)) != NULL &&
             capex_state_write_memory(w, *buf, *len, len) == CAPEX_OK;
    capex_state_writer_destroy(w);
    return ok;
}
static void par_checkpoint_one(ct_state *ct, env *e, const capex_optim_desc *d, int exact, const char *what) {
    par_opt o;
    capex_optim *h = NULL, *h2 = NULL, *other = NULL;
    capex_state_reader *rd = NULL;
    unsigned char *fc = NULL, *fd = NULL;
    size_t lc = 0, ld = 0;
    int s;
    CT_CHECK(par_opt_make(e, &o, d, 12, 0), "%s: setup: %s", what, capex_last_error());
    for (s = 0; s < 2 && !ct->failed; s++) {
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "dev step: %s", capex_last_error());
    }
    CT_CHECK(capex_cuda_optim_to_host(o.dev, CAPEX_OPTIM_STATE_PARAMS, NULL, &h) == CAPEX_OK, "%s: to_host: %s", what, capex_last_error());
    if (ct->failed) goto out;
    CT_CHECK(par_save_mem(h, &fd, &ld) && par_save_mem(o.cpu, &fc, &lc), "%s: save: %s", what, capex_last_error());
    if (exact) CT_CHECK(ld == lc && memcmp(fd, fc, lc) == 0, "%s: device checkpoint (%zu bytes) differs from the CPU's (%zu)", what, ld, lc);
    /* the device moves on alone, then comes back from the file */
    CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "dev step");
    CT_CHECK(capex_cuda_optim_to_host(o.dev, CAPEX_OPTIM_STATE_PARAMS, NULL, &h2) == CAPEX_OK, "to_host 2");
    CT_CHECK(capex_state_reader_open_memory(fd, ld, 0, NULL, &rd) == CAPEX_OK, "open: %s", capex_last_error());
    CT_CHECK(capex_optim_load(h2, rd, "optim", CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%s: load: %s", what, capex_last_error());
    /* refused without a change: another kind, and a host optimizer of other sizes */
    {
        capex_optim_desc od;
        capex_optim_desc_init(&od, d->kind == CAPEX_OPTIM_SGD ? CAPEX_OPTIM_ADAM : CAPEX_OPTIM_SGD);
        CT_CHECK(capex_optim_create(&od, &other) == CAPEX_OK, "create");
        CT_CHECK(capex_cuda_optim_from_host(o.dev, other, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_ERR_CONFIG, "other kind refused");
        CT_CHECK(capex_cuda_optim_from_host(o.dev, NULL, 0, NULL) == CAPEX_ERR_INVALID_ARG, "NULL refused");
        capex_optim_destroy(other);
        CT_CHECK(capex_optim_create(d, &other) == CAPEX_OK, "create");
        CT_CHECK(capex_cuda_optim_from_host(o.dev, other, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_ERR_SIZE_MISMATCH, "no groups refused");
        capex_optim_destroy(other);
        other = NULL;
        /* a copy made without the weights cannot give them back (it holds zeros) */
        CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &other) == CAPEX_OK, "to_host without params");
        CT_CHECK(capex_cuda_optim_from_host(o.dev, other, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_ERR_ORDER &&
                 strstr(capex_last_error(), "no weights"), "weights from a copy without them refused: %s", capex_last_error());
    }
    CT_CHECK(capex_cuda_optim_from_host(o.dev, h2, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_OK, "%s: from_host: %s", what, capex_last_error());
    CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step");
    CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "dev step");
    if (!ct->failed) par_opt_compare(ct, e, &o, exact ? 0.0f : 2e-6f, what);
    {
        int64_t st = -1;
        if (!ct->failed) CT_CHECK(capex_cuda_optim_get_step(o.dev, 1, &st, NULL) == CAPEX_OK && st == 3, "%s: step after restore %lld, want 3", what, (long long)st);
    }
out:
    capex_state_reader_close(rd);
    capex_optim_destroy(h);
    capex_optim_destroy(h2);
    capex_optim_destroy(other);
    free(fc);
    free(fd);
    par_opt_free(e, &o);
}
static void par_checkpoint(ct_state *ct, env *e) {
    capex_optim_desc d;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.01f;
    par_checkpoint_one(ct, e, &d, 1, "AdamW");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.defaults.momentum = 0.9f;
    d.defaults.lr = 0.05f;
    if (!ct->failed) par_checkpoint_one(ct, e, &d, 1, "SGD momentum");
    capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
    if (!ct->failed) par_checkpoint_one(ct, e, &d, 0, "LAMB");
    capex_optim_desc_init(&d, CAPEX_OPTIM_NOVOGRAD);
    d.reg_inside_moment = 1;
    d.defaults.weight_decay = 0.01f;
    if (!ct->failed) par_checkpoint_one(ct, e, &d, 0, "NovoGrad");
}

/* ---- resuming a checkpoint saved with other modes -------------------------
   A CPU optimizer in modes A steps twice and saves (weights too). A pair
   created in modes B loads that file: the CPU one by capex_optim_load, the
   device one by to_host, capex_optim_load and from_host. Both take the
   file's modes as capex_optim_load does (torch's load_state_dict restores
   param_groups too): equal right after the load and after each of three
   steps in lockstep (bit for bit; LAMB and NovoGrad close), and the device's
   own checkpoint then holds modes A. Before that, a host copy that differs
   in modes and is refused later (a forged step count) leaves the device's
   state and modes as they were. from_host refused any other mode before
   2026-11-28, naming it. */
static int par_same_modes(const capex_optim_desc *a, const capex_optim_desc *b) {
    return (a->adam_w_mode != 0) == (b->adam_w_mode != 0) && (a->use_nvlamb != 0) == (b->use_nvlamb != 0) &&
           (a->wd_after_momentum != 0) == (b->wd_after_momentum != 0) &&
           (a->stochastic_rounding != 0) == (b->stochastic_rounding != 0) && a->max_grad_norm == b->max_grad_norm &&
           a->seed == b->seed &&
           (a->kind != CAPEX_OPTIM_NOVOGRAD ||
            ((a->reg_inside_moment != 0) == (b->reg_inside_moment != 0) && (a->init_zero != 0) == (b->init_zero != 0)));
}
static void par_resume_modes_one(ct_state *ct, env *e, const capex_optim_desc *da, const capex_optim_desc *db, float tol,
                                 const char *what) {
    par_opt src, o;
    capex_state_reader *rd = NULL;
    capex_optim *h = NULL;
    unsigned char *f = NULL;
    size_t lf = 0;
    int s;
    int64_t st = -1;
    memset(&o, 0, sizeof o);
    CT_CHECK(!par_same_modes(da, db), "%s: the modes differ", what);
    CT_CHECK(par_opt_make(e, &src, da, 12, 0), "%s: setup A: %s", what, capex_last_error());
    for (s = 0; s < 2 && !ct->failed; s++)
        CT_CHECK(capex_optim_step(src.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "%s: cpu step: %s", what, capex_last_error());
    CT_CHECK(par_save_mem(src.cpu, &f, &lf), "%s: save: %s", what, capex_last_error());
    par_opt_free(e, &src);
    if (ct->failed) goto out;
    CT_CHECK(par_opt_make(e, &o, db, 12, 0), "%s: setup B: %s", what, capex_last_error());
    CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &h) == CAPEX_OK, "%s: to_host: %s", what, capex_last_error());
    CT_CHECK(capex_state_reader_open_memory(f, lf, 0, NULL, &rd) == CAPEX_OK &&
             capex_optim_load(h, rd, "optim", CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%s: load into the host copy: %s",
             what, capex_last_error());
    capex_state_reader_close(rd);
    rd = NULL;
    if (ct->failed) goto out;
    CT_CHECK(par_same_modes(&h->desc, da), "%s: the host copy holds the file's modes", what);
    {   /* refused after the mode checks: nothing changes, modes included */
        capex_optim *h2 = NULL;
        int64_t keep = h->groups[1].step;
        h->groups[1].step = CAPEX_STEP_MAX + 1;
        CT_CHECK(capex_cuda_optim_from_host(o.dev, h, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_ERR_INVALID_ARG,
                 "%s: a forged step count refused: %s", what, capex_last_error());
        h->groups[1].step = keep;
        par_opt_compare(ct, e, &o, 0, "refused: the device state as it was");
        if (!ct->failed)
            CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &h2) == CAPEX_OK && par_same_modes(&h2->desc, db),
                     "%s: refused: the device keeps its modes", what);
        capex_optim_destroy(h2);
        if (ct->failed) goto out;
    }
    CT_CHECK(capex_cuda_optim_from_host(o.dev, h, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_OK, "%s: from_host: %s", what,
             capex_last_error());
    CT_CHECK(capex_state_reader_open_memory(f, lf, 0, NULL, &rd) == CAPEX_OK &&
             capex_optim_load(o.cpu, rd, "optim", CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%s: CPU load: %s", what,
             capex_last_error());
    if (!ct->failed) par_opt_compare(ct, e, &o, 0, what);
    for (s = 0; s < 3 && !ct->failed; s++) {
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "%s: cpu step: %s", what, capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s: dev step: %s", what, capex_last_error());
        if (!ct->failed) par_opt_compare(ct, e, &o, tol, what);
    }
    if (ct->failed) goto out;
    CT_CHECK(capex_cuda_optim_get_step(o.dev, 1, &st, NULL) == CAPEX_OK && st == 5, "%s: step %lld, want 5", what,
             (long long)st);
    capex_optim_destroy(h);
    h = NULL;
    CT_CHECK(capex_cuda_optim_to_host(o.dev, 0, NULL, &h) == CAPEX_OK && par_same_modes(&h->desc, da),
             "%s: the device's checkpoint holds the file's modes", what);
out:
    capex_state_reader_close(rd);
    capex_optim_destroy(h);
    free(f);
    par_opt_free(e, &o);
}
static void par_resume_modes(ct_state *ct, env *e) {
    capex_optim_desc a, b;
    /* Adam: L2 with stochastic rounding saved, resumed by AdamW without it (and another seed) */
    capex_optim_desc_init(&a, CAPEX_OPTIM_ADAM);
    a.defaults.weight_decay = 0.01f;
    b = a;
    a.adam_w_mode = 0;
    a.stochastic_rounding = 1;
    a.seed = 0x1234567890abcdefull;
    b.seed = 7;
    par_resume_modes_one(ct, e, &a, &b, 0, "Adam L2 + SR into AdamW");
    if (!ct->failed) par_resume_modes_one(ct, e, &b, &a, 0, "AdamW into Adam L2 + SR");
    /* SGD: weight decay after momentum saved, resumed without it, with stochastic rounding */
    capex_optim_desc_init(&a, CAPEX_OPTIM_SGD);
    a.defaults.lr = 0.1f;
    a.defaults.momentum = 0.9f;
    a.defaults.dampening = 0.1f;
    a.defaults.weight_decay = 0.01f;
    b = a;
    a.wd_after_momentum = 1;
    b.stochastic_rounding = 1;
    if (!ct->failed) par_resume_modes_one(ct, e, &a, &b, 0, "SGD wd after momentum");
    /* Adagrad: adagrad_w_mode (adam_w_mode) */
    capex_optim_desc_init(&a, CAPEX_OPTIM_ADAGRAD);
    a.defaults.lr = 0.05f;
    a.defaults.weight_decay = 0.01f;
    a.defaults.lr_decay = 0.1f;
    b = a;
    a.adam_w_mode = 1;
    if (!ct->failed) par_resume_modes_one(ct, e, &a, &b, 0, "Adagrad W into L2");
    /* LAMB: L2, nvlamb, another max_grad_norm */
    capex_optim_desc_init(&a, CAPEX_OPTIM_LAMB);
    b = a;
    a.adam_w_mode = 0;
    a.use_nvlamb = 1;
    a.max_grad_norm = 0.5f;
    if (!ct->failed) par_resume_modes_one(ct, e, &a, &b, 2e-6f, "LAMB L2 nvlamb into W");
    /* NovoGrad: both of its modes */
    capex_optim_desc_init(&a, CAPEX_OPTIM_NOVOGRAD);
    a.defaults.lr = 0.01f;
    a.defaults.weight_decay = 0.01f;
    b = a;
    a.reg_inside_moment = 1;
    a.init_zero = 1;
    if (!ct->failed) par_resume_modes_one(ct, e, &a, &b, 2e-6f, "NovoGrad reg_inside_moment, init_zero");
}

/* ---- lr schedules: the device computes each step's lr from its own step
   count (capex_go_lr_sched before capex_go_prepare, capex.h's formula text) --------------------------
   Two groups (base lrs differ), warmup + cosine, a skipped step (which must
   not advance the schedule), a base-lr change mid-run (set_lr re-uploads the
   base), then a checkpoint through to_host (the host copy carries the
   schedule and the base lrs); the device then detaches its schedule and
   steps alone, from_host restores its state and the schedule, and it
   continues in lockstep with the CPU. `tol` 0: bit-exact. */
static void par_schedule_one(ct_state *ct, env *e, const capex_optim_desc *d, float tol, int exact, const char *what) {
    par_opt o;
    capex_lr_schedule s, got;
    capex_optim *h = NULL;
    capex_optim_hparams hp;
    capex_cuda_ptr dfound = par_alloc(e, 4);
    int step, att = 0;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    s.warmup_steps = 2; s.warmup_start_factor = 0.2; s.total_steps = 9; s.min_factor = 0.1;
    CT_CHECK(dfound != 0, "alloc");
    CT_CHECK(par_opt_make(e, &o, d, 12, 0), "%s: setup: %s", what, capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &s) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) == CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 12 && !ct->failed; step++) {
        uint32_t found = step == 3;
        CT_CHECK(par_up(e, dfound, &found, 4), "up");
        if (step == 6) {
            CT_CHECK(capex_optim_set_lr(o.cpu, 1, 4e-3f) == CAPEX_OK && capex_cuda_optim_set_lr(o.dev, 1, 4e-3f, NULL) == CAPEX_OK,
                     "set_lr: %s", capex_last_error());
        }
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, (int)found) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, tol, what);
    }
    if (!ct->failed) {
        /* the device's lr field holds the last step's scheduled lr */
        float dlr = -1.0f, want = (float)capex_lr_at(&s, (double)4e-3f, 10);
        CT_CHECK(par_down(e, &dlr, capex_cuda_optim_lr_ptr(o.dev, 1), 4) && (exact ? dlr == want : par_close(dlr, want, 2e-7f, 0)),
                 "%s: device lr %.9g after 11 steps taken, want %.9g", what, (double)dlr, (double)want);
        CT_CHECK(capex_cuda_optim_to_host(o.dev, CAPEX_OPTIM_STATE_PARAMS, NULL, &h) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_get_lr_schedule(h, &got, &att) == CAPEX_OK && att == 1 && got.total_steps == 9,
                 "%s: the host copy carries the schedule", what);
        CT_CHECK(capex_optim_get_hparams(h, 1, &hp) == CAPEX_OK && hp.lr == 4e-3f, "%s: host copy base lr %.9g", what,
                 (double)hp.lr);
        /* the device drops its schedule and runs ahead alone; from_host brings
           back its state and the host copy's schedule */
        CT_CHECK(capex_cuda_optim_set_lr_schedule(o.dev, NULL, NULL) == CAPEX_OK, "detach");
        CT_CHECK(capex_cuda_optim_set_lr(o.dev, 1, 1e-2f, NULL) == CAPEX_OK, "lr");
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_optim_from_host(o.dev, h, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (step = 12; step < 16 && !ct->failed; step++) {
            CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step: %s", capex_last_error());
            CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
            par_opt_compare(ct, e, &o, tol, "resumed from the host copy");
        }
    }
    capex_optim_destroy(h);
    par_opt_free(e, &o);
    par_free(e, dfound);
}
/* A schedule attached before any group: add_group grows the device buffer
   of base lrs, and a group added later runs the schedule from its own step
   count. Plain SGD from 0 with gradient 1 accumulates -lr exactly. */
static void par_schedule_groups(ct_state *ct, env *e, int exact) {
    capex_optim_desc d;
    capex_cuda_optim *dev = NULL;
    capex_lr_schedule s;
    capex_optim_param p;
    capex_optim_hparams hp;
    capex_cuda_ptr dp[2], dg = par_alloc(e, 64);
    float one[16], zero[16], got[16], want[2] = {0.0f, 0.0f};
    const float base[2] = {0.5f, 0.25f};
    int k, step, i;
    int64_t n[2] = {0, 0};
    dp[0] = par_alloc(e, 64);
    dp[1] = par_alloc(e, 64);
    for (i = 0; i < 16; i++) { one[i] = 1.0f; zero[i] = 0.0f; }
    CT_CHECK(dg && dp[0] && dp[1] && par_up(e, dg, one, 64) && par_up(e, dp[0], zero, 64) && par_up(e, dp[1], zero, 64), "setup");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.defaults.lr = base[0];
    capex_lr_schedule_init(&s, CAPEX_LR_EXPONENTIAL);
    s.gamma = 0.9;
    s.warmup_steps = 2;
    CT_CHECK(e->ctx ? capex_cuda_optim_create(e->ctx, &d, &dev) == CAPEX_OK : capex__go_optim_create(&e->ex, &d, &dev) == CAPEX_OK,
             "create: %s", capex_last_error());
    CT_CHECK(capex_cuda_optim_set_lr_schedule(dev, &s, NULL) == CAPEX_OK, "attach with no groups: %s", capex_last_error());
    for (step = 0; step < 7 && !ct->failed; step++) {
        if (step == 0 || step == 3) {
            k = step == 3;
            capex_optim_param_init(&p);
            p.param = (float *)(uintptr_t)dp[k]; p.grad = (const void *)(uintptr_t)dg; p.numel = 16;
            hp = d.defaults;
            hp.lr = base[k];
            CT_CHECK(capex_cuda_optim_add_group(dev, &hp, &p, 1, NULL) == CAPEX_OK, "add group %d: %s", k, capex_last_error());
        }
        CT_CHECK(capex_cuda_optim_step(dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        for (k = 0; k < (step >= 3 ? 2 : 1); k++) {
            want[k] = want[k] - (float)capex_lr_at(&s, (double)base[k], n[k]++) * 1.0f;
            CT_CHECK(par_down(e, got, dp[k], 64), "down");
            CT_CHECK(exact ? got[15] == want[k] : par_close(got[15], want[k], 1e-6f, 0), "step %d group %d: %.9g, want %.9g",
                     step, k, (double)got[15], (double)want[k]);
        }
    }
    capex_cuda_optim_destroy(dev);
    par_free(e, dg);
    par_free(e, dp[0]);
    par_free(e, dp[1]);
}
/* Detaching a schedule: the next steps use each group's base lr (hp.lr), as
   capex_optim_set_lr_schedule(o, NULL) on the CPU, not the last scheduled lr
   the device's lr field still held. Plain SGD from 0 with gradient 1
   accumulates -lr exactly; the CPU optimizer runs alongside. Seen failing:
   after the detach the device kept stepping with the warmup's 0.25 * base. */
static void par_schedule_detach(ct_state *ct, env *e, int exact) {
    capex_optim_desc d;
    capex_cuda_optim *dev = NULL;
    capex_optim *cpu = NULL;
    capex_lr_schedule s;
    capex_optim_param p;
    capex_cuda_ptr dp = par_alloc(e, 64), dg = par_alloc(e, 64);
    float one[16], zero[16], got[16], cw[16], prev;
    int step, i;
    for (i = 0; i < 16; i++) { one[i] = 1.0f; zero[i] = 0.0f; cw[i] = 0.0f; }
    CT_CHECK(dp && dg && par_up(e, dg, one, 64) && par_up(e, dp, zero, 64), "setup");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.defaults.lr = 0.5f;
    capex_lr_schedule_init(&s, CAPEX_LR_CONSTANT);
    s.warmup_steps = 4;
    s.warmup_start_factor = 0.25;
    CT_CHECK(e->ctx ? capex_cuda_optim_create(e->ctx, &d, &dev) == CAPEX_OK : capex__go_optim_create(&e->ex, &d, &dev) == CAPEX_OK,
             "create: %s", capex_last_error());
    CT_CHECK(capex_optim_create(&d, &cpu) == CAPEX_OK, "%s", capex_last_error());
    capex_optim_param_init(&p);
    p.param = cw; p.grad = one; p.numel = 16;
    CT_CHECK(capex_optim_add_group(cpu, NULL, &p, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    p.param = (float *)(uintptr_t)dp; p.grad = (const void *)(uintptr_t)dg;
    CT_CHECK(capex_cuda_optim_add_group(dev, NULL, &p, 1, NULL) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(cpu, &s) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(dev, &s, NULL) == CAPEX_OK,
             "attach: %s", capex_last_error());
    for (step = 0; step < 4 && !ct->failed; step++) {
        if (step == 2)
            CT_CHECK(capex_optim_set_lr_schedule(cpu, NULL) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(dev, NULL, NULL) == CAPEX_OK,
                     "detach: %s", capex_last_error());
        prev = cw[15];
        CT_CHECK(capex_optim_step(cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(step < 2 || cw[15] == prev - 0.5f, "CPU step %d after the detach: %.9g -> %.9g, not the base lr", step,
                 (double)prev, (double)cw[15]);
        CT_CHECK(capex_cuda_optim_step(dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(par_down(e, got, dp, 64), "down");
        CT_CHECK(exact ? got[15] == cw[15] : par_close(got[15], cw[15], 1e-6f, 0), "step %d: device %.9g, CPU %.9g", step,
                 (double)got[15], (double)cw[15]);
    }
    capex_optim_destroy(cpu);
    capex_cuda_optim_destroy(dev);
    par_free(e, dg);
    par_free(e, dp);
}
/* exact: the emulator (host libm); a GPU's double cos/pow may move an lr by an ulp */
/* llm.c's warmup (warmup_llmc: lr*(step+1)/W) on the device: the same bits
   as capex_optim_step (exact) through warmup, a skipped step and the decay. */
static void par_schedule_llmc(ct_state *ct, env *e, int exact) {
    capex_optim_desc d;
    par_opt o;
    capex_lr_schedule s;
    capex_cuda_ptr dfound = par_alloc(e, 4);
    int step;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.1f;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    s.warmup_steps = 3; s.warmup_llmc = 1; s.total_steps = 8; s.min_factor = 0.1;
    CT_CHECK(dfound != 0, "alloc");
    CT_CHECK(par_opt_make(e, &o, &d, 7, 0), "llm.c warmup: setup: %s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &s) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) ==
             CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 10 && !ct->failed; step++) {
        uint32_t found = step == 1;
        float dlr = -1.0f, want = 0.0f;
        CT_CHECK(par_up(e, dfound, &found, 4), "up");
        CT_CHECK(capex_optim_get_lr(o.cpu, 0, &want) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, (int)found) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, exact ? 0.0f : 2e-6f, "AdamW + llm.c warmup");
        if (!found)
            CT_CHECK(par_down(e, &dlr, capex_cuda_optim_lr_ptr(o.dev, 0), 4) &&
                     (exact ? dlr == want : par_close(dlr, want, 2e-7f, 0)), "step %d: device lr %.9g, CPU %.9g", step,
                     (double)dlr, (double)want);
    }
    par_opt_free(e, &o);
    par_free(e, dfound);
}

/* count_skipped (torch's scheduler.step() every iteration): the device
   advances the schedule's iteration count in capex_go_lr_sched on every
   step, skipped (found_inf on the device) or not, and each taken step uses
   the lr of its iteration: the same bits as capex_optim_step (exact) for
   AdamW with overflows at iterations 3, 4 and 11 of 20; the count equals the
   CPU's; re-attaching while attached keeps it; to_host carries it to the
   host copy; the device then detaches (re-attaching counts from 0), runs
   alone, and from_host brings the count back so both continue in lockstep.
   Then SGD from 0 with gradient 1 (accumulating -lr exactly): a group added
   at iteration 3 grows the device buffer, and the count carries over. */
static void par_schedule_count_skipped(ct_state *ct, env *e, int exact) {
    capex_optim_desc d;
    par_opt o;
    capex_lr_schedule s, got;
    capex_optim *h = NULL;
    capex_cuda_ptr dfound = par_alloc(e, 4);
    int step, att = 0;
    int64_t nd = -1, nc = -2;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.1f;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    s.warmup_steps = 5; s.warmup_start_factor = 0.25; s.total_steps = 25; s.count_skipped = 1;
    CT_CHECK(dfound != 0, "alloc");
    CT_CHECK(par_opt_make(e, &o, &d, 7, 0), "count_skipped: setup: %s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &s) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) ==
             CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 20 && !ct->failed; step++) {
        uint32_t found = step == 3 || step == 4 || step == 11;
        float dlr = -1.0f, want = 0.0f;
        if (step == 6) /* a replacing schedule keeps the count */
            CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &s) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) ==
                     CAPEX_OK, "%s", capex_last_error());
        if (step == 9) {
            CT_CHECK(capex_cuda_optim_to_host(o.dev, CAPEX_OPTIM_STATE_PARAMS, NULL, &h) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_optim_get_lr_schedule(h, &got, &att) == CAPEX_OK && att == 1 && got.count_skipped == 1 &&
                     capex_optim_get_lr_iteration(h, &nc) == CAPEX_OK && nc == 9, "host copy: count_skipped %d, iteration %lld",
                     got.count_skipped, (long long)nc);
            CT_CHECK(capex_cuda_optim_set_lr_schedule(o.dev, NULL, NULL) == CAPEX_OK, "detach");
            CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) == CAPEX_OK &&
                     capex_cuda_optim_get_lr_iteration(o.dev, &nd, NULL) == CAPEX_OK && nd == 0, "re-attached: %lld",
                     (long long)nd);
            CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_optim_from_host(o.dev, h, CAPEX_OPTIM_STATE_PARAMS, NULL) == CAPEX_OK, "%s", capex_last_error());
            capex_optim_destroy(h);
            h = NULL;
        }
        CT_CHECK(par_up(e, dfound, &found, 4), "up");
        CT_CHECK(capex_optim_get_lr(o.cpu, 0, &want) == CAPEX_OK && want == (float)capex_lr_at(&s, (double)d.defaults.lr,
                 step), "CPU lr at iteration %d: %.9g", step, (double)want);
        CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, (int)found) == CAPEX_OK, "cpu step: %s", capex_last_error());
        CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
        par_opt_compare(ct, e, &o, exact ? 0.0f : 2e-6f, "AdamW + count_skipped");
        if (!found)
            CT_CHECK(par_down(e, &dlr, capex_cuda_optim_lr_ptr(o.dev, 0), 4) &&
                     (exact ? dlr == want : par_close(dlr, want, 2e-7f, 0)), "iteration %d: device lr %.9g, CPU %.9g",
                     step, (double)dlr, (double)want);
        CT_CHECK(capex_cuda_optim_get_lr_iteration(o.dev, &nd, NULL) == CAPEX_OK &&
                 capex_optim_get_lr_iteration(o.cpu, &nc) == CAPEX_OK && nd == step + 1 && nc == nd,
                 "iteration %d: device count %lld, CPU %lld", step, (long long)nd, (long long)nc);
    }
    capex_optim_destroy(h);
    par_opt_free(e, &o);
    if (!ct->failed) { /* a group added mid-run */
        capex_cuda_optim *dev = NULL;
        capex_optim_param p;
        capex_optim_hparams hp;
        capex_cuda_ptr dp[2], dg = par_alloc(e, 64);
        float one[16], zero[16], gotp[16], want[2] = {0.0f, 0.0f};
        const float base[2] = {0.5f, 0.25f};
        int k, i;
        dp[0] = par_alloc(e, 64);
        dp[1] = par_alloc(e, 64);
        for (i = 0; i < 16; i++) { one[i] = 1.0f; zero[i] = 0.0f; }
        CT_CHECK(dg && dp[0] && dp[1] && par_up(e, dg, one, 64) && par_up(e, dp[0], zero, 64) &&
                 par_up(e, dp[1], zero, 64), "setup");
        capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
        capex_lr_schedule_init(&s, CAPEX_LR_EXPONENTIAL);
        s.gamma = 0.9; s.warmup_steps = 2; s.count_skipped = 1;
        CT_CHECK(e->ctx ? capex_cuda_optim_create(e->ctx, &d, &dev) == CAPEX_OK
                        : capex__go_optim_create(&e->ex, &d, &dev) == CAPEX_OK, "create: %s", capex_last_error());
        for (step = 0; step < 8 && !ct->failed; step++) {
            uint32_t found = step == 1 || step == 4;
            if (step == 0 || step == 3) {
                k = step == 3;
                capex_optim_param_init(&p);
                p.param = (float *)(uintptr_t)dp[k]; p.grad = (const void *)(uintptr_t)dg; p.numel = 16;
                hp = d.defaults;
                hp.lr = base[k];
                CT_CHECK(capex_cuda_optim_add_group(dev, &hp, &p, 1, NULL) == CAPEX_OK, "add group %d: %s", k,
                         capex_last_error());
                if (step == 0) CT_CHECK(capex_cuda_optim_set_lr_schedule(dev, &s, NULL) == CAPEX_OK, "%s", capex_last_error());
            }
            CT_CHECK(par_up(e, dfound, &found, 4), "up");
            CT_CHECK(capex_cuda_optim_step(dev, 0, 0, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
            for (k = 0; k < (step >= 3 ? 2 : 1); k++) {
                if (!found) want[k] = want[k] - (float)capex_lr_at(&s, (double)base[k], step) * 1.0f;
                CT_CHECK(par_down(e, gotp, dp[k], 64), "down");
                CT_CHECK(exact ? gotp[15] == want[k] : par_close(gotp[15], want[k], 1e-6f, 0),
                         "count_skipped, added group: iteration %d group %d: %.9g, want %.9g", step, k, (double)gotp[15],
                         (double)want[k]);
            }
        }
        CT_CHECK(capex_cuda_optim_get_lr_iteration(dev, &nd, NULL) == CAPEX_OK && nd == 8, "count %lld", (long long)nd);
        capex_cuda_optim_destroy(dev);
        par_free(e, dg);
        par_free(e, dp[0]);
        par_free(e, dp[1]);
    }
    par_free(e, dfound);
}

/* A step the CPU refuses (capex_optim_step: inv_scale NaN, inf, 0 or < 0,
   clip_coef NaN or < 0, or their product not finite: CAPEX_ERR_INVALID_ARG,
   nothing changed, the schedule's count too) is skipped on the device, which
   cannot refuse: no weight, moment or step count changes, and the schedule's
   iteration count (count_skipped) stays too, where a found_inf skip (a valid
   inv_scale) counts. After each step the device's count equals the CPU's and
   the weights are the CPU's. Seen failing: the device counted every refused
   step (its count 9 where the CPU's was 3). */
static void par_schedule_bad_inputs(ct_state *ct, env *e, int exact) {
    static const float bad[][2] = {{NAN, 1.0f}, {-1.0f, 1.0f}, {0.0f, 1.0f}, {INFINITY, 1.0f}, {1.0f, NAN},
                                   {1.0f, -1.0f}, {1.0f, INFINITY}, {3e38f, 10.0f}};
    const int nbad = (int)(sizeof bad / sizeof bad[0]);
    capex_optim_desc d;
    par_opt o;
    capex_lr_schedule s;
    capex_cuda_ptr dinv = par_alloc(e, 4), dclip = par_alloc(e, 4), dfound = par_alloc(e, 4);
    int step, cs;
    for (cs = 0; cs < 2 && !ct->failed; cs++) {
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
        d.defaults.weight_decay = 0.1f;
        capex_lr_schedule_init(&s, CAPEX_LR_LINEAR);
        s.warmup_steps = 3; s.total_steps = 12; s.min_factor = 0.25; s.count_skipped = cs;
        CT_CHECK(dinv && dclip && dfound, "alloc");
        CT_CHECK(par_opt_make(e, &o, &d, 7, 0), "bad inputs: setup: %s", capex_last_error());
        CT_CHECK(capex_optim_set_lr_schedule(o.cpu, &s) == CAPEX_OK && capex_cuda_optim_set_lr_schedule(o.dev, &s, NULL) ==
                 CAPEX_OK, "%s", capex_last_error());
        for (step = 0; step < 2 * nbad + 2 && !ct->failed; step++) {
            /* odd steps refused (each bad pair once: the first half with found_inf 0, the
               rest with 1), even ones valid, one of them a found_inf skip */
            const int k = step / 2 % nbad, refuse = step % 2 == 1 && step < 2 * nbad + 1;
            const float inv = refuse ? bad[k][0] : 0.5f, clip = refuse ? bad[k][1] : 1.0f;
            const uint32_t found = refuse ? (uint32_t)(step / 2 >= nbad / 2) : (uint32_t)(step == 4);
            int64_t nd = -1, nc = -2, sd = -1, sc = -2;
            capex_result rc;
            CT_CHECK(par_up(e, dinv, &inv, 4) && par_up(e, dclip, &clip, 4) && par_up(e, dfound, &found, 4), "up");
            rc = capex_optim_step(o.cpu, inv, clip, (int)found);
            CT_CHECK(refuse ? rc == CAPEX_ERR_INVALID_ARG : rc == CAPEX_OK, "step %d: CPU step (inv %g clip %g): %s", step,
                     (double)inv, (double)clip, capex_result_string(rc));
            CT_CHECK(capex_cuda_optim_step(o.dev, dinv, dclip, dfound, NULL) == CAPEX_OK, "%s", capex_last_error());
            par_opt_compare(ct, e, &o, exact ? 0.0f : 2e-6f, "AdamW after a refused step");
            CT_CHECK(capex_cuda_optim_get_lr_iteration(o.dev, &nd, NULL) == CAPEX_OK &&
                     capex_optim_get_lr_iteration(o.cpu, &nc) == CAPEX_OK && nd == nc,
                     "count_skipped %d, step %d (inv %g clip %g found %u): device count %lld, CPU %lld", cs, step,
                     (double)inv, (double)clip, (unsigned)found, (long long)nd, (long long)nc);
            CT_CHECK(capex_cuda_optim_get_step(o.dev, 0, &sd, NULL) == CAPEX_OK &&
                     capex_optim_get_step(o.cpu, 0, &sc) == CAPEX_OK && sd == sc,
                     "step %d: device steps taken %lld, CPU %lld", step, (long long)sd, (long long)sc);
        }
        par_opt_free(e, &o);
    }
    par_free(e, dinv);
    par_free(e, dclip);
    par_free(e, dfound);
}
static void par_schedule(ct_state *ct, env *e, int exact) {
    capex_optim_desc d;
    const float t = exact ? 0.0f : 2e-6f;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.01f;
    par_schedule_one(ct, e, &d, t, exact, "AdamW + cosine schedule");
    capex_optim_desc_init(&d, CAPEX_OPTIM_SGD);
    d.defaults.momentum = 0.9f;
    d.defaults.lr = 0.05f;
    if (!ct->failed) par_schedule_one(ct, e, &d, t, exact, "SGD + cosine schedule");
    capex_optim_desc_init(&d, CAPEX_OPTIM_LAMB);
    if (!ct->failed) par_schedule_one(ct, e, &d, 2e-6f, exact, "LAMB + cosine schedule");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD); /* clr = scheduled lr / (1 + (step-1)*lr_decay) */
    d.defaults.lr = 0.05f;
    d.defaults.lr_decay = 0.1f;
    if (!ct->failed) par_schedule_one(ct, e, &d, t, exact, "Adagrad (lr_decay) + cosine schedule");
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.amsgrad = 1;
    if (!ct->failed) par_schedule_one(ct, e, &d, t, exact, "Adam amsgrad + cosine schedule");
    if (!ct->failed) par_schedule_groups(ct, e, exact);
    if (!ct->failed) par_schedule_detach(ct, e, exact);
    if (!ct->failed) par_schedule_llmc(ct, e, exact);
    if (!ct->failed) par_schedule_count_skipped(ct, e, exact);
    if (!ct->failed) par_schedule_bad_inputs(ct, e, exact);
}

/* Adagrad (lr_decay, initial_accumulator_value, both modes) and Adam amsgrad:
   the device bit for bit with capex_optim_step, then a checkpoint round trip. */
static void par_adagrad(ct_state *ct, env *e) {
    capex_optim_desc d;
    int w, sr;
    for (w = 0; w < 2; w++)
        for (sr = 0; sr < 2; sr++) {
            capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
            d.adam_w_mode = w;
            d.defaults.lr = 0.05f;
            d.defaults.weight_decay = 0.01f;
            d.defaults.lr_decay = 0.1f;
            d.defaults.initial_accumulator_value = sr ? 0.0f : 0.25f;
            d.stochastic_rounding = sr;
            d.seed = 0x1234567890abcdefull;
            d.exec.chunk_size = sr ? 1000 : 0;
            par_opt_run(ct, e, &d, 24, 0, 0, w ? "Adagrad W" : "Adagrad L2");
            if (ct->failed) return;
        }
    {
        /* lr_decay changed by set_hparams reaches the device */
        par_opt o;
        capex_optim_hparams h;
        capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
        d.defaults.initial_accumulator_value = 0.5f;
        CT_CHECK(par_opt_make(e, &o, &d, 9, 0), "setup: %s", capex_last_error());
        CT_CHECK(capex_optim_get_hparams(o.cpu, 1, &h) == CAPEX_OK, "hparams");
        h.lr_decay = 0.5f;
        CT_CHECK(capex_optim_set_hparams(o.cpu, 1, &h) == CAPEX_OK && capex_cuda_optim_set_hparams(o.dev, 1, &h, NULL) == CAPEX_OK,
                 "%s", capex_last_error());
        for (w = 0; w < 3 && !ct->failed; w++) {
            CT_CHECK(capex_optim_step(o.cpu, 1.0f, 1.0f, 0) == CAPEX_OK, "cpu");
            CT_CHECK(capex_cuda_optim_step(o.dev, 0, 0, 0, NULL) == CAPEX_OK, "%s", capex_last_error());
            par_opt_compare(ct, e, &o, 0, "Adagrad lr_decay set later");
        }
        par_opt_free(e, &o);
        if (ct->failed) return;
    }
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAGRAD);
    d.defaults.initial_accumulator_value = 0.1f;
    d.defaults.lr_decay = 0.01f;
    par_checkpoint_one(ct, e, &d, 1, "Adagrad");
}

static void par_adam_amsgrad(ct_state *ct, env *e) {
    capex_optim_desc d;
    int w, sr;
    for (w = 0; w < 2; w++)
        for (sr = 0; sr < 2; sr++) {
            capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
            d.adam_w_mode = w;
            d.defaults.weight_decay = 0.01f;
            d.defaults.beta2 = 0.9f;
            d.defaults.amsgrad = 1;
            d.stochastic_rounding = sr;
            d.seed = 0x1234567890abcdefull;
            d.exec.chunk_size = sr ? 1000 : 0;
            par_opt_run(ct, e, &d, 24, 0, 0, w ? "AdamW amsgrad" : "Adam L2 amsgrad");
            if (ct->failed) return;
        }
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.amsgrad = 1;
    d.exec.chunk_size = 256;
    par_opt_run(ct, e, &d, 100, 0, 0, "AdamW amsgrad, 100 tensors");
    if (ct->failed) return;
    {
        /* amsgrad is fixed per group on the device too */
        par_opt o;
        capex_optim_hparams h;
        CT_CHECK(par_opt_make(e, &o, &d, 6, 0), "setup: %s", capex_last_error());
        h = d.defaults;
        h.amsgrad = 0;
        CT_CHECK(capex_cuda_optim_set_hparams(o.dev, 0, &h, NULL) == CAPEX_ERR_CONFIG, "amsgrad switched off on the device");
        par_opt_free(e, &o);
    }
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.amsgrad = 1;
    d.defaults.weight_decay = 0.01f;
    if (!ct->failed) par_checkpoint_one(ct, e, &d, 1, "AdamW amsgrad");
}

/* ---- options changed mid-training, on both sides ----------------------------
   Per kind: three groups with different hyperparameters (amsgrad on and off,
   bias correction on and off, grad averaging, nesterov, dampening, lr_decay,
   initial accumulators, betas, eps), two steps, then set_hparams toggles
   those on every group and a fourth group is added after the steps (its own
   first step: SGD's buffer init, NovoGrad's norm init); four more steps. Every
   weight and buffer against the CPU after every step: bit for bit, LAMB and
   NovoGrad close (their sums' order). */
#define PAR_OT 3 /* tensors per group */
typedef struct par_ot { int64_t n; float *p, *g; uint16_t *h; capex_cuda_ptr dp, dg, dh; } par_ot;

static int par_opts_group(env *e, capex_optim *cpu, capex_cuda_optim *dev, par_ot *t, const capex_optim_hparams *hp) {
    static const int64_t sz[PAR_OT] = {37, 0, 1003};
    capex_optim_param cp[PAR_OT], dp[PAR_OT];
    int k;
    for (k = 0; k < PAR_OT; k++) {
        par_ot *x = &t[k];
        x->n = sz[k];
        x->p = (float *)malloc((size_t)x->n * 4 + 4);
        x->g = (float *)malloc((size_t)x->n * 4 + 4);
        x->h = (uint16_t *)malloc((size_t)x->n * 2 + 4);
        x->dp = par_alloc(e, (size_t)x->n * 4);
        x->dg = par_alloc(e, (size_t)x->n * 4);
        x->dh = par_alloc(e, (size_t)x->n * 2);
        if (!x->p || !x->g || !x->h || !x->dp || !x->dg || !x->dh) return 0;
        par_fill(&e->seed, CAPEX_F32, x->p, x->n, 1.0f, 0);
        if (!par_up(e, x->dp, x->p, (size_t)x->n * 4)) return 0;
        capex_optim_param_init(&cp[k]);
        cp[k].param = x->p; cp[k].grad = x->g; cp[k].numel = x->n;
        if (k == 2) { cp[k].model = x->h; cp[k].model_dtype = CAPEX_BF16; }
        dp[k] = cp[k];
        dp[k].param = (float *)(uintptr_t)x->dp;
        dp[k].grad = (const void *)(uintptr_t)x->dg;
        dp[k].model = k == 2 ? (void *)(uintptr_t)x->dh : NULL;
    }
    return capex_optim_add_group(cpu, hp, cp, PAR_OT, NULL) == CAPEX_OK &&
           capex_cuda_optim_add_group(dev, hp, dp, PAR_OT, NULL) == CAPEX_OK;
}

static int par_opts_cmp(const float *a, const float *b, int64_t n, float tol) {
    int64_t k;
    for (k = 0; k < n; k++)
        if (tol == 0 ? par_f2u(a[k]) != par_f2u(b[k]) : !par_close(a[k], b[k], tol, 1e-30f)) return (int)k + 1;
    return 0;
}

static void par_options_one(ct_state *ct, env *e, const capex_optim_desc *d, const capex_optim_hparams h[7], float tol,
                            const char *what) {
    par_ot t[4 * PAR_OT];
    capex_optim *cpu = NULL;
    capex_cuda_optim *dev = NULL;
    float *buf = (float *)malloc(1003 * 4 + 4);
    uint16_t *hb = (uint16_t *)malloc(1003 * 2 + 4);
    int nt = 0, g, s, k, bad = 0;
    memset(t, 0, sizeof t);
    if (!buf || !hb || capex_optim_create(d, &cpu) != CAPEX_OK ||
        (e->ctx ? capex_cuda_optim_create(e->ctx, d, &dev) : capex__go_optim_create(&e->ex, d, &dev)) != CAPEX_OK)
        bad = 1;
    for (g = 0; g < 3 && !bad; g++, nt += PAR_OT) bad = !par_opts_group(e, cpu, dev, t + nt, &h[g]);
    if (bad) ct_fail(ct, __FILE__, __LINE__, "setup", "%s: %s", what, capex_last_error());
    for (s = 1; s <= 6 && !ct->failed; s++) {
        if (s == 3) { /* toggles on every group, then a group added after the steps */
            for (g = 0; g < 3 && !bad; g++)
                bad = capex_optim_set_hparams(cpu, (size_t)g, &h[3 + g]) != CAPEX_OK ||
                      capex_cuda_optim_set_hparams(dev, (size_t)g, &h[3 + g], NULL) != CAPEX_OK;
            if (!bad) bad = !par_opts_group(e, cpu, dev, t + nt, &h[6]);
            nt += PAR_OT;
            if (bad) { ct_fail(ct, __FILE__, __LINE__, "set_hparams / add_group", "%s: %s", what, capex_last_error()); break; }
        }
        for (k = 0; k < nt && !bad; k++) {
            par_fill(&e->seed, CAPEX_F32, t[k].g, t[k].n, s == 4 ? 2.0f : 0.1f, 0);
            if (k % PAR_OT == 1) continue; /* the empty one */
            if (k == 0) memset(t[k].g, 0, (size_t)t[k].n * 4); /* zero grads: LAMB's |u| = 0 where wd is */
            bad = !par_up(e, t[k].dg, t[k].g, (size_t)t[k].n * 4);
        }
        if (!bad) bad = capex_optim_step(cpu, 1.0f, 1.0f, 0) != CAPEX_OK || capex_cuda_optim_step(dev, 0, 0, 0, NULL) != CAPEX_OK;
        if (bad) { ct_fail(ct, __FILE__, __LINE__, "step", "%s step %d: %s", what, s, capex_last_error()); break; }
        for (k = 0; k < nt && !ct->failed; k++) {
            size_t gi = (size_t)(k / PAR_OT), ix = (size_t)(k % PAR_OT);
            float *cb[3] = {NULL, NULL, NULL};
            capex_cuda_ptr db[3] = {0, 0, 0};
            int b, at;
            if (!t[k].n) continue;
            capex_optim_get_state(cpu, gi, ix, &cb[0], &cb[1]);
            capex_optim_get_max_exp_avg_sq(cpu, gi, ix, &cb[2]);
            capex_cuda_optim_get_state(dev, gi, ix, &db[0], &db[1]);
            capex_cuda_optim_get_max_exp_avg_sq(dev, gi, ix, &db[2]);
            if (!par_down(e, buf, t[k].dp, (size_t)t[k].n * 4)) { ct_fail(ct, __FILE__, __LINE__, "down", "%s", what); break; }
            if ((at = par_opts_cmp(buf, t[k].p, t[k].n, tol)) != 0)
                ct_fail(ct, __FILE__, __LINE__, "param", "%s step %d group %zu tensor %zu: param[%d] = %.9g, CPU %.9g", what, s,
                        gi, ix, at - 1, (double)buf[at - 1], (double)t[k].p[at - 1]);
            for (b = 0; b < 3 && !ct->failed; b++) {
                if ((cb[b] == NULL) != (db[b] == 0)) {
                    ct_fail(ct, __FILE__, __LINE__, "buffers", "%s step %d group %zu tensor %zu: buffer %d exists on one side",
                            what, s, gi, ix, b);
                    break;
                }
                if (!cb[b]) continue;
                if (!par_down(e, buf, db[b], (size_t)t[k].n * 4)) { ct_fail(ct, __FILE__, __LINE__, "down", "%s", what); break; }
                if ((at = par_opts_cmp(buf, cb[b], t[k].n, tol)) != 0)
                    ct_fail(ct, __FILE__, __LINE__, "buffer", "%s step %d group %zu tensor %zu: buffer %d [%d] = %.9g, CPU %.9g",
                            what, s, gi, ix, b, at - 1, (double)buf[at - 1], (double)cb[b][at - 1]);
            }
            if (!ct->failed && ix == 2 && tol == 0) {
                int64_t j;
                if (!par_down(e, hb, t[k].dh, (size_t)t[k].n * 2)) { ct_fail(ct, __FILE__, __LINE__, "down", "%s", what); break; }
                for (j = 0; j < t[k].n && !ct->failed; j++)
                    if (hb[j] != t[k].h[j])
                        ct_fail(ct, __FILE__, __LINE__, "model", "%s step %d group %zu: model[%lld] 0x%04x, CPU 0x%04x", what, s,
                                gi, (long long)j, hb[j], t[k].h[j]);
            }
        }
    }
    capex_optim_destroy(cpu);
    capex_cuda_optim_destroy(dev);
    for (k = 0; k < 4 * PAR_OT; k++) {
        free(t[k].p); free(t[k].g); free(t[k].h);
        par_free(e, t[k].dp); par_free(e, t[k].dg); par_free(e, t[k].dh);
    }
    free(buf);
    free(hb);
}

static void par_options(ct_state *ct, env *e) {
    int kind, mode;
    for (kind = 0; kind < 5 && !ct->failed; kind++)
        for (mode = 0; mode < 2 && !ct->failed; mode++) {
            capex_optim_desc d;
            capex_optim_hparams h[7];
            char what[80];
            int k;
            float tol = 0;
            capex_optim_desc_init(&d, (capex_optim_kind)kind);
            for (k = 0; k < 7; k++) h[k] = d.defaults;
            switch ((capex_optim_kind)kind) {
            case CAPEX_OPTIM_ADAM:
                d.adam_w_mode = mode;
                h[0].amsgrad = 1; h[0].weight_decay = 0.05f;
                h[1].bias_correction = 0; h[1].beta1 = 0.8f; h[1].beta2 = 0.99f;
                h[2].amsgrad = 1; h[2].bias_correction = 0; h[2].eps = 1e-3f;
                h[3] = h[0]; h[3].bias_correction = 0; h[3].lr = 5e-3f; h[3].beta2 = 0.9f;
                h[4] = h[1]; h[4].bias_correction = 1; h[4].beta1 = 0.0f; h[4].weight_decay = 0.02f;
                h[5] = h[2]; h[5].bias_correction = 1; h[5].eps = 1e-8f;
                h[6].amsgrad = 1; h[6].bias_correction = 0;
                break;
            case CAPEX_OPTIM_LAMB:
                d.use_nvlamb = mode; d.max_grad_norm = mode ? 0.05f : 0.0f;
                h[1].weight_decay = 0.0f; h[1].bias_correction = 0; h[1].grad_averaging = 0;
                h[2].weight_decay = 0.1f; h[2].beta1 = 0.0f;
                h[3] = h[0]; h[3].grad_averaging = 0; h[3].weight_decay = 0.0f;
                h[4] = h[1]; h[4].weight_decay = 0.02f; h[4].bias_correction = 1;
                h[5] = h[2]; h[5].bias_correction = 0; h[5].beta2 = 0.9f;
                h[6].weight_decay = 0.0f;
                tol = 2e-6f;
                break;
            case CAPEX_OPTIM_SGD:
                d.wd_after_momentum = mode;
                for (k = 0; k < 7; k++) h[k].lr = 0.05f;
                h[0].momentum = 0.9f; h[0].dampening = 0.1f; h[0].weight_decay = 0.01f;
                h[1].momentum = 0.9f; h[1].nesterov = 1; h[1].weight_decay = 0.001f;
                h[2].weight_decay = 0.02f;
                h[3] = h[0]; h[3].momentum = 0.5f; h[3].dampening = 0.0f; h[3].nesterov = 1;
                h[4] = h[1]; h[4].nesterov = 0; h[4].dampening = 0.3f;
                h[5] = h[2]; h[5].lr = 0.01f;
                h[6].momentum = 0.5f; h[6].dampening = 0.5f; h[6].weight_decay = 0.03f;
                break;
            case CAPEX_OPTIM_ADAGRAD:
                d.adam_w_mode = mode;
                h[0].lr_decay = 0.1f; h[0].initial_accumulator_value = 0.1f; h[0].weight_decay = 0.01f;
                h[1].eps = 1e-3f;
                h[2].initial_accumulator_value = 1.0f; h[2].weight_decay = 0.1f;
                h[3] = h[0]; h[3].lr_decay = 0.5f;
                h[4] = h[1]; h[4].lr_decay = 0.01f; h[4].weight_decay = 0.02f;
                h[5] = h[2]; h[5].initial_accumulator_value = 5.0f;
                h[6].initial_accumulator_value = 0.25f; h[6].lr_decay = 1.0f;
                break;
            default: /* NovoGrad */
                d.reg_inside_moment = mode; d.init_zero = !mode;
                h[0].weight_decay = 0.01f;
                h[1].beta2 = 0.5f; h[1].bias_correction = 0; h[1].grad_averaging = 0;
                h[2].beta1 = 0.0f; h[2].eps = 1e-3f;
                h[3] = h[0]; h[3].beta2 = 0.9f; h[3].grad_averaging = 0;
                h[4] = h[1]; h[4].bias_correction = 1; h[4].weight_decay = 0.05f;
                h[5] = h[2]; h[5].lr = 3e-2f;
                h[6].weight_decay = 0.001f; h[6].beta2 = 0.95f;
                tol = 2e-6f;
            }
            snprintf(what, sizeof what, "options: kind %d mode %d", kind, mode);
            par_options_one(ct, e, &d, h, tol, what);
        }
}

/* ---- the device loss scaler against capex_scaler, step by step ----------- */
static void par_scaler(ct_state *ct, env *e) {
    static const int pattern[] = {0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    int cfg;
    for (cfg = 0; cfg < 6; cfg++) {
        capex_scaler_desc sd;
        capex_scaler cpu;
        capex_cuda_scaler *dev = NULL;
        size_t i;
        capex_scaler_desc_init(&sd);
        sd.init_scale = 1024.0f;
        sd.growth_interval = 3;
        sd.log_interval = 0;
        if (cfg == 1) { sd.hysteresis = 2; sd.min_scale = 64.0f; sd.max_scale = 4096.0f; }
        if (cfg == 2) { sd.growth_factor = 3.0; sd.backoff_factor = 0.3; sd.max_scale = INFINITY; sd.hysteresis = 3; }
        /* the float range's ends: underflow through subnormals to 0 (inv_scale inf), growth
           stopping below inf (interval 1, no cap), and a static scale skipping overflows */
        if (cfg == 3) { sd.init_scale = 1e-44f; sd.max_scale = INFINITY; }
        if (cfg == 4) { sd.init_scale = 0x1p125f; sd.growth_interval = 1; sd.max_scale = INFINITY; }
        if (cfg == 5) sd.dynamic = 0;
        CT_CHECK(capex_scaler_init(&cpu, &sd) == CAPEX_OK, "cpu init");
        CT_CHECK((e->ctx ? capex_cuda_scaler_create(e->ctx, &sd, &dev) : capex__go_scaler_create(&e->ex, &sd, &dev)) ==
                 CAPEX_OK, "%s", capex_last_error());
        for (i = 0; i < sizeof pattern / sizeof pattern[0]; i++) {
            float s, inv, dinv = 0;
            int go;
            uint32_t f = (uint32_t)pattern[i];
            capex_scaler_state a, b;
            CT_CHECK(capex_scaler_scale(&cpu, &s) == CAPEX_OK && capex_scaler_unscale(&cpu, 0, pattern[i], &inv) == CAPEX_OK &&
                     capex_scaler_step(&cpu, 0, &go) == CAPEX_OK && capex_scaler_update(&cpu) == CAPEX_OK, "cpu");
            CT_CHECK(par_up(e, capex_cuda_scaler_found_inf_ptr(dev), &f, 4), "up");
            CT_CHECK(capex_cuda_scaler_update(dev, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_scaler_get_state(&cpu, &a) == CAPEX_OK && capex_cuda_scaler_get_state(dev, &b, NULL) == CAPEX_OK, "state");
            CT_CHECK(par_f2u(a.scale) == par_f2u(b.scale) && a.growth_tracker == b.growth_tracker &&
                     a.hysteresis_tracker == b.hysteresis_tracker && a.steps == b.steps && a.skipped_steps == b.skipped_steps,
                     "cfg %d step %zu: device scale %.9g trackers %lld/%d steps %lld/%lld, CPU %.9g %lld/%d %lld/%lld", cfg, i,
                     (double)b.scale, (long long)b.growth_tracker, b.hysteresis_tracker, (long long)b.steps,
                     (long long)b.skipped_steps, (double)a.scale, (long long)a.growth_tracker, a.hysteresis_tracker,
                     (long long)a.steps, (long long)a.skipped_steps);
            inv = capex_scaler_get_inv_scale(&cpu);
            CT_CHECK(par_down(e, &dinv, capex_cuda_scaler_inv_scale_ptr(dev), 4), "down");
            CT_CHECK(par_f2u(inv) == par_f2u(dinv), "inv_scale %.9g, CPU %.9g", (double)dinv, (double)inv);
            CT_CHECK(par_down(e, &f, capex_cuda_scaler_found_inf_ptr(dev), 4) && f == 0, "update clears found_inf");
        }
        {   /* set_state round trip and validation */
            capex_scaler_state st;
            CT_CHECK(capex_scaler_get_state(&cpu, &st) == CAPEX_OK, "get");
            st.growth_tracker = 99;
            CT_CHECK(capex_cuda_scaler_set_state(dev, &st, NULL) == CAPEX_ERR_INVALID_ARG, "bad tracker refused");
            st.growth_tracker = st.growth_interval > 1;
            st.scale = 256.0f;
            CT_CHECK(capex_cuda_scaler_set_state(dev, &st, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_cuda_scaler_get_scale(dev, &st.scale, NULL) == CAPEX_OK && st.scale == 256.0f, "restored scale");
        }
        capex_cuda_scaler_destroy(dev);
    }
}

/* ---- a mixed-precision loop: scaler + check + AdamW, inf injected at step 2 ---- */
static void par_amp_loop(ct_state *ct, env *e, int (*count_sync)(env *)) {
    capex_optim_desc d;
    par_opt o;
    capex_scaler_desc sd;
    capex_scaler cpu_sc;
    capex_cuda_scaler *sc = NULL;
    capex_tensor hg[24], dg[24];
    int s, i, nsync0 = 0;
    capex_optim_desc_init(&d, CAPEX_OPTIM_ADAM);
    d.defaults.weight_decay = 0.1f;
    capex_scaler_desc_init(&sd);
    sd.init_scale = 2048.0f;
    sd.growth_interval = 2;
    sd.log_interval = 0;
    CT_CHECK(par_opt_make(e, &o, &d, 24, 0), "setup: %s", capex_last_error());
    CT_CHECK(capex_scaler_init(&cpu_sc, &sd) == CAPEX_OK, "cpu scaler");
    CT_CHECK((e->ctx ? capex_cuda_scaler_create(e->ctx, &sd, &sc) : capex__go_scaler_create(&e->ex, &sd, &sc)) == CAPEX_OK,
             "%s", capex_last_error());
    for (s = 0; s < 5; s++) {
        int found = 0, go = 0;
        float scale, inv;
        if (s == 2) { /* a NaN in one gradient, an inf in another */
            par_param *t = &o.t[5], *u = &o.t[9];
            par_fill(&e->seed, t->gd, t->g, t->numel, 3000.0f, 2);
            par_fill(&e->seed, u->gd, u->g, u->numel, 3000.0f, 1);
            CT_CHECK(par_up(e, t->dg, t->g, (size_t)t->numel * capex_dtype_size(t->gd)) &&
                     par_up(e, u->dg, u->g, (size_t)u->numel * capex_dtype_size(u->gd)), "up");
        }
        if (s == 3) { /* clean again */
            for (i = 0; i < o.n; i++) {
                par_param *t = &o.t[i];
                par_fill(&e->seed, t->gd, t->g, t->numel, 3000.0f, 0);
                CT_CHECK(par_up(e, t->dg, t->g, (size_t)t->numel * capex_dtype_size(t->gd)), "up");
            }
        }
        /* CPU: check the grads of each dtype, step with inv_scale, update */
        CT_CHECK(capex_scaler_scale(&cpu_sc, &scale) == CAPEX_OK, "scale");
        for (i = 0; i < 3; i++) {
            int n = 0, k;
            for (k = 0; k < o.n; k++)
                if ((int)o.t[k].gd == i) {
                    hg[n].data = o.t[k].g; hg[n].numel = o.t[k].numel;
                    dg[n].data = (void *)(uintptr_t)o.t[k].dg; dg[n].numel = o.t[k].numel;
                    n++;
                }
            {
                capex_tensor_list hl = capex_tensor_list_make((capex_dtype)i, hg, (size_t)n);
                capex_tensor_list dl = capex_tensor_list_make((capex_dtype)i, dg, (size_t)n);
                float one = 1.0f;
                (void)one;
                CT_CHECK(capex_multi_tensor_scale(NULL, &hl, &hl, 1.0f, &found) == CAPEX_OK, "cpu check");
                if (count_sync) nsync0 = i == 0 ? count_sync(e) : nsync0;
                CT_CHECK(capex_cuda_scaler_unscale(sc, NULL, &dl, NULL, NULL) == CAPEX_OK, "%s", capex_last_error());
            }
        }
        CT_CHECK(capex_scaler_unscale(&cpu_sc, 0, found, &inv) == CAPEX_OK && capex_scaler_step(&cpu_sc, 0, &go) == CAPEX_OK, "cpu");
        CT_CHECK(go == (s != 2), "step %d: CPU go %d", s, go);
        CT_CHECK(capex_optim_step(o.cpu, inv, 1.0f, !go) == CAPEX_OK, "cpu step");
        CT_CHECK(capex_scaler_update(&cpu_sc) == CAPEX_OK, "cpu update");
        CT_CHECK(capex_cuda_optim_step(o.dev, capex_cuda_scaler_inv_scale_ptr(sc), 0, capex_cuda_scaler_found_inf_ptr(sc), NULL) ==
                 CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_cuda_scaler_update(sc, NULL) == CAPEX_OK, "%s", capex_last_error());
        if (count_sync)
            CT_CHECK(count_sync(e) == nsync0, "step %d: the step enqueued a copy, allocation or read-back", s);
        par_opt_compare(ct, e, &o, 0, "AMP loop");
        {
            float ds = 0;
            CT_CHECK(capex_cuda_scaler_get_scale(sc, &ds, NULL) == CAPEX_OK, "get_scale");
            CT_CHECK((scale = capex_scaler_get_scale(&cpu_sc)) == ds, "step %d: scale %g, CPU %g", s,
                     (double)ds, (double)scale);
        }
        if (ct->failed) break;
    }
    capex_cuda_scaler_destroy(sc);
    par_opt_free(e, &o);
}

#endif
