/* Tensor lists, chunk planner and fused multi-tensor ops, against float64
   references on fresh random inputs (the seed is printed with every failure;
   CAPEX_TEST_SEED=<n> replays one). Outputs are poisoned first and checked
   outside the written range; norms are checked bit for bit against the
   documented fixed-order reduction recomputed here, for 1, 2, 3 and 7 threads. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>
#include <time.h>

static unsigned long long g_seed;
static unsigned long long g_rng;

static unsigned long long rng_u64(void) { /* splitmix64 */
    unsigned long long z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
/* Gaussian-ish values over a few decades, sign random: exercises rounding. */
static float rng_val(void) {
    double m = rng_unit() * 2.0 - 1.0;
    int e = (int)(rng_u64() % 9) - 4;
    return (float)ldexp(m, e);
}
static void seed_once(void) {
    static int done = 0;
    const char *s;
    if (done) return;
    done = 1;
    s = getenv("CAPEX_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (unsigned long long)time(NULL) ^ ((unsigned long long)clock() << 20);
    g_rng = g_seed;
}
#define SEEDFMT " [seed %llu]"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t dbits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

/* value of element i as double, and store of a float as dtype code */
static double getv(capex_dtype dt, const void *p, int64_t i) {
    if (dt == CAPEX_F32) return (double)((const float *)p)[i];
    if (dt == CAPEX_F16) return (double)capex_f16_to_f32(((const uint16_t *)p)[i]);
    return (double)capex_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void setv(capex_dtype dt, void *p, int64_t i, float v) {
    if (dt == CAPEX_F32) ((float *)p)[i] = v;
    else if (dt == CAPEX_F16) ((uint16_t *)p)[i] = capex_f32_to_f16(v);
    else ((uint16_t *)p)[i] = capex_f32_to_bf16(v);
}
/* raw code of element i (bits) */
static uint32_t getcode(capex_dtype dt, const void *p, int64_t i) {
    if (dt == CAPEX_F32) return fbits(((const float *)p)[i]);
    return ((const uint16_t *)p)[i];
}
static uint32_t code_of(capex_dtype dt, float v) {
    if (dt == CAPEX_F32) return fbits(v);
    if (dt == CAPEX_F16) return capex_f32_to_f16(v);
    return capex_f32_to_bf16(v);
}

/* A list with GUARD poisoned (0xFF) elements before and after each tensor;
   the data starts as 0xFF too (NaN codes), so unwritten outputs show. */
#define GUARD 17
typedef struct tlist {
    capex_dtype dt;
    size_t n;
    capex_tensor *t;
    unsigned char **base; /* allocation of each tensor, guards included */
    capex_tensor_list l;
} tlist;

static void tl_free(tlist *a) {
    size_t i;
    if (!a->t) return;
    for (i = 0; i < a->n; i++) free(a->base[i]);
    free(a->t);
    free(a->base);
    memset(a, 0, sizeof *a);
}
static int tl_alloc(tlist *a, capex_dtype dt, const int64_t *sizes, size_t n) {
    size_t i, es = capex_dtype_size(dt);
    a->dt = dt;
    a->n = n;
    a->t = (capex_tensor *)calloc(n ? n : 1, sizeof *a->t);
    a->base = (unsigned char **)calloc(n ? n : 1, sizeof *a->base);
    if (!a->t || !a->base) return 0;
    for (i = 0; i < n; i++) {
        size_t bytes = (size_t)(sizes[i] + 2 * GUARD) * es;
        a->base[i] = (unsigned char *)malloc(bytes);
        if (!a->base[i]) return 0;
        memset(a->base[i], 0xff, bytes);
        a->t[i].data = a->base[i] + GUARD * es;
        a->t[i].numel = sizes[i];
    }
    a->l = capex_tensor_list_make(dt, a->t, n);
    return 1;
}
static void tl_fill(tlist *a) {
    size_t i;
    int64_t j;
    for (i = 0; i < a->n; i++)
        for (j = 0; j < a->t[i].numel; j++) setv(a->dt, a->t[i].data, j, rng_val());
}
/* guards still 0xFF? returns index of first bad tensor + 1, or 0 */
static size_t tl_guards_bad(const tlist *a) {
    size_t i, k, es = capex_dtype_size(a->dt);
    for (i = 0; i < a->n; i++) {
        const unsigned char *b = a->base[i];
        size_t tail = GUARD * es + (size_t)a->t[i].numel * es;
        for (k = 0; k < GUARD * es; k++)
            if (b[k] != 0xff || b[tail + k] != 0xff) return i + 1;
    }
    return 0;
}

static const capex_dtype k_dtypes[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};

/* ======================================================================= */
/* chunk planner                                                           */
/* ======================================================================= */

/* Walks a plan and checks: every element of every tensor in exactly one
   chunk, in tensor then offset order, launch capacities respected, slots
   distinct and increasing, global chunk numbering contiguous. */
static int walk_plan(ct_state *ct, const capex_tensor *ts, size_t n, int64_t cs, int mt, int mb, int64_t *launches_out) {
    capex_chunk_plan p;
    capex_chunk_launch L;
    size_t cur_t = 0;
    int64_t cur_off = 0, chunks = 0, launches = 0;
    capex_result r = capex_chunk_plan_init(&p, ts, n, cs, mt, mb);
    if (r != CAPEX_OK) { snprintf(ct->why, sizeof ct->why, "init failed: %.300s", capex_last_error()); ct->failed = 1; return 0; }
    while (capex_chunk_plan_next(&p, &L)) {
        int b, s;
        launches++;
        if (L.nblocks < 1 || L.nblocks > p.max_blocks || L.ntensors < 1 || L.ntensors > p.max_tensors || L.first_chunk != chunks) {
            snprintf(ct->why, sizeof ct->why, "launch %lld: nblocks %d ntensors %d first %lld", (long long)launches, L.nblocks, L.ntensors, (long long)L.first_chunk);
            ct->failed = 1; return 0;
        }
        for (s = 1; s < L.ntensors; s++)
            if (L.tensor[s] <= L.tensor[s - 1]) { snprintf(ct->why, sizeof ct->why, "slots not increasing"); ct->failed = 1; return 0; }
        for (b = 0; b < L.nblocks; b++) {
            size_t t;
            int64_t off, cnt;
            if (L.block_tensor[b] >= L.ntensors) { snprintf(ct->why, sizeof ct->why, "block slot out of range"); ct->failed = 1; return 0; }
            capex_chunk_launch_block(&p, &L, b, &t, &off, &cnt);
            /* advance the expected cursor past finished or empty tensors */
            while (cur_t < n && cur_off == ts[cur_t].numel) { cur_t++; cur_off = 0; }
            if (t != cur_t || off != cur_off || cnt < 1 || cnt > p.chunk_size || off + cnt > ts[t].numel ||
                (cnt < p.chunk_size && off + cnt != ts[t].numel)) {
                snprintf(ct->why, sizeof ct->why, "chunk %lld: tensor %zu off %lld cnt %lld, expected tensor %zu off %lld",
                         (long long)chunks, t, (long long)off, (long long)cnt, cur_t, (long long)cur_off);
                ct->failed = 1; return 0;
            }
            cur_off += cnt;
            chunks++;
        }
        /* every slot got at least one block */
        for (s = 0; s < L.ntensors; s++) {
            int has = 0;
            for (b = 0; b < L.nblocks; b++) has |= L.block_tensor[b] == s;
            if (!has) { snprintf(ct->why, sizeof ct->why, "slot %d without blocks", s); ct->failed = 1; return 0; }
        }
    }
    while (cur_t < n && cur_off == ts[cur_t].numel) { cur_t++; cur_off = 0; }
    if (cur_t != n || chunks != p.total_chunks || launches != p.launches) {
        snprintf(ct->why, sizeof ct->why, "coverage ended at tensor %zu/%zu off %lld; chunks %lld vs %lld", cur_t, n,
                 (long long)cur_off, (long long)chunks, (long long)p.total_chunks);
        ct->failed = 1; return 0;
    }
    if (capex_chunk_plan_next(&p, &L) != 0) { snprintf(ct->why, sizeof ct->why, "next after end"); ct->failed = 1; return 0; }
    if (launches_out) *launches_out = launches;
    return 1;
}

CT_TEST(planner_metadata_fits_4k) {
    static const int apex_like[6] = {139, 93, 69, 55, 46, 39};
    CAPEX_MTA_META_STRUCT(m1, 1); CAPEX_MTA_META_STRUCT(m2, 2); CAPEX_MTA_META_STRUCT(m3, 3);
    CAPEX_MTA_META_STRUCT(m4, 4); CAPEX_MTA_META_STRUCT(m5, 5); CAPEX_MTA_META_STRUCT(m6, 6);
    size_t sz[6];
    int d;
    sz[0] = sizeof(m1); sz[1] = sizeof(m2); sz[2] = sizeof(m3); sz[3] = sizeof(m4); sz[4] = sizeof(m5); sz[5] = sizeof(m6);
    for (d = 1; d <= 6; d++) {
        CT_CHECK(sz[d - 1] == (size_t)CAPEX_MTA_META_SIZE(d), "depth %d: sizeof %zu vs formula %d", d, sz[d - 1], (int)CAPEX_MTA_META_SIZE(d));
        CT_CHECK(sz[d - 1] <= CAPEX_MTA_META_BYTES && sz[d - 1] + 256 <= 4096, "depth %d: %zu bytes", d, sz[d - 1]);
        CT_CHECK(capex_mta_max_tensors(d) == apex_like[d - 1], "depth %d: %d tensors", d, capex_mta_max_tensors(d));
        /* one more tensor would not fit: the capacity is the largest */
        CT_CHECK(8 * (d + 1) * (capex_mta_max_tensors(d) + 1) + 8 + 5 * CAPEX_MTA_MAX_BLOCKS > CAPEX_MTA_META_BYTES, "depth %d not tight", d);
    }
    CT_CHECK(capex_mta_max_tensors(0) == 0 && capex_mta_max_tensors(7) == 0, "out of range depth");
    CT_CHECK(CAPEX_MTA_LAUNCH_TENSORS <= 256, "slots must fit uint8");
}

CT_TEST(planner_exact_coverage_random) {
    int trial;
    seed_once();
    for (trial = 0; trial < 300; trial++) {
        capex_tensor ts[40];
        size_t n = (size_t)(rng_u64() % 40), i;
        int64_t cs = 1 + (int64_t)(rng_u64() % 9);
        int mt = 1 + (int)(rng_u64() % 6), mb = 1 + (int)(rng_u64() % 12);
        for (i = 0; i < n; i++) {
            int k = (int)(rng_u64() % 5);
            ts[i].data = NULL;
            ts[i].numel = k == 0 ? 0 : k == 1 ? cs : k == 2 ? cs + 1 : k == 3 ? cs - 1 : (int64_t)(rng_u64() % 60);
        }
        if (!walk_plan(ct, ts, n, cs, mt, mb, NULL)) {
            size_t l = strlen(ct->why);
            snprintf(ct->why + l, sizeof ct->why - l, " (trial %d cs %lld mt %d mb %d)" SEEDFMT, trial, (long long)cs, mt, mb, g_seed);
            return;
        }
    }
}

CT_TEST(planner_big_tensor_split_across_launches) {
    /* 3*2^31+5 elements: described, never allocated */
    capex_tensor ts[4];
    capex_chunk_plan p;
    capex_chunk_launch L;
    int64_t big = 3LL * 2147483648LL + 5, launches = 0, last_off = -1, last_cnt = -1;
    ts[0].data = NULL; ts[0].numel = 10;
    ts[1].data = NULL; ts[1].numel = 0;
    ts[2].data = NULL; ts[2].numel = big;
    ts[3].data = NULL; ts[3].numel = 65537;
    if (!walk_plan(ct, ts, 4, 0, 0, 0, &launches)) return;
    CT_CHECK(capex_chunk_plan_init(&p, ts, 4, 0, 0, 0) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(p.total_chunks == 1 + 98305 + 2, "total chunks %lld", (long long)p.total_chunks);
    CT_CHECK(p.total_elements == 10 + big + 65537, "total elements");
    CT_CHECK(launches == (p.total_chunks + 319) / 320, "launches %lld", (long long)launches);
    while (capex_chunk_plan_next(&p, &L)) {
        int b;
        for (b = 0; b < L.nblocks; b++) {
            size_t t;
            int64_t off, cnt;
            capex_chunk_launch_block(&p, &L, b, &t, &off, &cnt);
            if (t == 2) { last_off = off; last_cnt = cnt; }
        }
    }
    CT_CHECK(last_off == 3LL * 2147483648LL && last_cnt == 5, "last chunk of big tensor at %lld (+%lld)", (long long)last_off, (long long)last_cnt);
}

CT_TEST(planner_more_tensors_than_one_launch) {
    static capex_tensor ts[1000];
    capex_chunk_plan p;
    capex_chunk_launch L;
    int64_t launches = 0;
    int i, k = 0;
    for (i = 0; i < 1000; i++) { ts[i].data = NULL; ts[i].numel = (i % 3 == 0) ? 0 : 1 + i; }
    if (!walk_plan(ct, ts, 1000, 0, 0, 0, &launches)) return;
    /* 666 non-empty tensors, one chunk each, 139 slots per launch */
    CT_CHECK(launches == (666 + 138) / 139, "launches %lld", (long long)launches);
    for (i = 1; i <= 6; i++)
        if (!walk_plan(ct, ts, 1000, 0, capex_mta_max_tensors(i), 0, NULL)) return;
    /* a tensor cut by a full launch continues in slot 0 of the next (Apex) */
    ts[0].numel = 5; ts[1].numel = 2;
    CT_CHECK(capex_chunk_plan_init(&p, ts, 2, 1, 4, 3) == CAPEX_OK, "%.300s", capex_last_error());
    while (capex_chunk_plan_next(&p, &L)) {
        if (k == 0) CT_CHECK(L.ntensors == 1 && L.nblocks == 3 && L.block_chunk[2] == 2, "launch 0");
        if (k == 1) CT_CHECK(L.ntensors == 2 && L.tensor[0] == 0 && L.block_chunk[0] == 3 && L.block_tensor[2] == 1, "launch 1");
        if (k == 2) CT_CHECK(L.ntensors == 1 && L.tensor[0] == 1 && L.block_chunk[0] == 1 && L.nblocks == 1, "launch 2");
        k++;
    }
    CT_CHECK(k == 3, "%d launches", k);
}

CT_TEST(planner_empty_and_bad_input) {
    capex_tensor ts[3];
    capex_chunk_plan p;
    capex_chunk_launch L;
    ts[0].data = NULL; ts[0].numel = 0;
    ts[1].data = NULL; ts[1].numel = 0;
    ts[2].data = NULL; ts[2].numel = 0;
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 0, 0, 0) == CAPEX_OK, "all empty");
    CT_CHECK(capex_chunk_plan_next(&p, &L) == 0 && p.total_chunks == 0, "no launch for empty tensors");
    CT_CHECK(capex_chunk_plan_init(&p, NULL, 0, 0, 0, 0) == CAPEX_OK && capex_chunk_plan_next(&p, &L) == 0, "empty list");
    CT_CHECK(capex_chunk_plan_next(NULL, &L) == 0 && capex_chunk_plan_next(&p, NULL) == 0, "null next");
    CT_CHECK(capex_chunk_plan_init(NULL, ts, 3, 0, 0, 0) == CAPEX_ERR_INVALID_ARG, "null plan");
    CT_CHECK(capex_chunk_plan_init(&p, NULL, 3, 0, 0, 0) == CAPEX_ERR_INVALID_ARG, "null tensors");
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, -5, 0, 0) == CAPEX_ERR_INVALID_ARG, "negative chunk");
    CT_CHECK(strstr(capex_last_error(), "chunk_size") != NULL, "message: %.300s", capex_last_error());
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 0, 140, 0) == CAPEX_ERR_INVALID_ARG, "too many slots");
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 0, 0, 321) == CAPEX_ERR_INVALID_ARG, "too many blocks");
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 0, -1, 0) == CAPEX_ERR_INVALID_ARG, "negative slots");
    ts[1].numel = -1;
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 0, 0, 0) == CAPEX_ERR_INVALID_ARG, "negative numel");
    ts[1].numel = 4294967296LL + 1; /* 2^32+1 chunks of 1 */
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 1, 0, 0) == CAPEX_ERR_LIMIT, "chunk index overflow");
    ts[1].numel = 4294967296LL;
    CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 1, 0, 0) == CAPEX_OK, "2^32 chunks fit");
    /* a block outside the launch (or NULL) is an empty range, not a read past the launch's tables */
    {
        size_t t = 77;
        int64_t off = 77, cnt = 77;
        int b;
        ts[0].numel = 10; ts[1].numel = 0; ts[2].numel = 0;
        memset(&L, 0xA5, sizeof L);
        CT_CHECK(capex_chunk_plan_init(&p, ts, 3, 4, 0, 0) == CAPEX_OK && capex_chunk_plan_next(&p, &L) == 1 &&
                 L.nblocks == 3, "10 elements in chunks of 4");
        capex_chunk_launch_block(&p, &L, 2, &t, &off, &cnt);
        CT_CHECK(t == 0 && off == 8 && cnt == 2, "last block: %zu %lld %lld", t, (long long)off, (long long)cnt);
        for (b = -1; b <= 3; b += 4) {
            t = 77; off = 77; cnt = 77;
            capex_chunk_launch_block(&p, &L, b, &t, &off, &cnt);
            CT_CHECK(t == 0 && off == 0 && cnt == 0, "block %d of 3: %zu %lld %lld", b, t, (long long)off, (long long)cnt);
        }
        cnt = 77;
        capex_chunk_launch_block(NULL, &L, 0, NULL, NULL, &cnt);
        CT_CHECK(cnt == 0, "NULL plan");
        cnt = 77;
        capex_chunk_launch_block(&p, NULL, 0, NULL, NULL, &cnt);
        CT_CHECK(cnt == 0, "NULL launch");
    }
}

/* ======================================================================= */
/* norms                                                                   */
/* ======================================================================= */

/* The documented reduction, recomputed: lanes i%16 per chunk, folded to 8
   (l_j + l_(j+8)), fixed combine, chunk partials in order. This is what any
   build (OpenMP or not, AVX or not) must give. */
static double fixed_order_sumsq(const tlist *a, int64_t cs, double *per) {
    double total = 0.0;
    size_t i;
    for (i = 0; i < a->n; i++) {
        int64_t off;
        if (per) per[i] = 0.0;
        for (off = 0; off < a->t[i].numel; off += cs) {
            int64_t n = a->t[i].numel - off < cs ? a->t[i].numel - off : cs, k;
            double s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, part;
            int j;
            for (k = 0; k < n; k++) {
                double v = getv(a->dt, a->t[i].data, off + k);
                s[k & 15] += v * v;
            }
            for (j = 0; j < 8; j++) s[j] += s[j + 8];
            part = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            total += part;
            if (per) per[i] += part;
        }
    }
    return total;
}
/* Accurate reference: compensated (Neumaier) float64 sum of squares. */
static double ref_sumsq(capex_dtype dt, const void *p, int64_t n) {
    double s = 0.0, c = 0.0;
    int64_t k;
    for (k = 0; k < n; k++) {
        double v = getv(dt, p, k), x = v * v, t = s + x;
        c += fabs(s) >= fabs(x) ? (s - t) + x : (x - t) + s;
        s = t;
    }
    return s + c;
}
static int close_f(float got, double ref, double ulps) {
    double ulp = ldexp(1.0, (ref > 0 ? ilogb(ref) : -149) - 23);
    return fabs((double)got - ref) <= ulps * ulp;
}

CT_TEST(l2norm_all_dtypes_vs_float64) {
    int64_t sizes[9] = {0, 1, 7, 65535, 65536, 65537, 200000, 0, 131072 + 9};
    int d;
    seed_once();
    for (d = 0; d < 3; d++) {
        tlist a;
        float tot = -1.0f, per[9];
        double dtot = -1.0, dper[9], fper[9], ftot, rtot = 0.0;
        size_t i;
        memset(&a, 0, sizeof a);
        CT_CHECK(tl_alloc(&a, k_dtypes[d], sizes, 9), "alloc");
        tl_fill(&a);
        CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, per) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(capex_multi_tensor_sumsq(NULL, &a.l, &dtot, dper) == CAPEX_OK, "%.300s", capex_last_error());
        ftot = fixed_order_sumsq(&a, 65536, fper);
        CT_CHECK(dbits(dtot) == dbits(ftot), "%s: sumsq %.17g vs fixed-order %.17g" SEEDFMT, capex_dtype_name(a.dt), dtot, ftot, g_seed);
        CT_CHECK(fbits(tot) == fbits((float)sqrt(ftot)), "%s: norm bits" SEEDFMT, capex_dtype_name(a.dt), g_seed);
        for (i = 0; i < 9; i++) {
            double r = ref_sumsq(a.dt, a.t[i].data, a.t[i].numel);
            rtot += r;
            CT_CHECK(dbits(dper[i]) == dbits(fper[i]), "%s tensor %zu: per-tensor bits" SEEDFMT, capex_dtype_name(a.dt), i, g_seed);
            CT_CHECK(fabs(dper[i] - r) <= 1e-13 * r, "%s tensor %zu: sumsq %.17g ref %.17g" SEEDFMT, capex_dtype_name(a.dt), i, dper[i], r, g_seed);
            CT_CHECK(close_f(per[i], sqrt(r), 0.5001), "%s tensor %zu: norm %.9g ref %.17g" SEEDFMT, capex_dtype_name(a.dt), i, per[i], sqrt(r), g_seed);
        }
        CT_CHECK(per[0] == 0.0f && per[7] == 0.0f, "empty tensors have norm 0");
        CT_CHECK(close_f(tot, sqrt(rtot), 0.5001), "%s total %.9g ref %.17g" SEEDFMT, capex_dtype_name(a.dt), tot, sqrt(rtot), g_seed);
        /* outputs optional */
        CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, NULL, NULL) == CAPEX_OK, "null outputs");
        CT_CHECK(tl_guards_bad(&a) == 0, "input guards touched");
        tl_free(&a);
    }
}

CT_TEST(l2norm_accuracy_10M) {
    /* 10M f32 values over 12 decades: error vs a compensated float64 sum */
    int64_t n = 10000000, k;
    tlist a;
    double dtot, ref, rel;
    float tot;
    seed_once();
    memset(&a, 0, sizeof a);
    CT_CHECK(tl_alloc(&a, CAPEX_F32, &n, 1), "alloc");
    for (k = 0; k < n; k++) ((float *)a.t[0].data)[k] = (float)ldexp(rng_unit() * 2.0 - 1.0, (int)(rng_u64() % 24) - 12);
    CT_CHECK(capex_multi_tensor_sumsq(NULL, &a.l, &dtot, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, NULL) == CAPEX_OK, "%.300s", capex_last_error());
    ref = ref_sumsq(CAPEX_F32, a.t[0].data, n);
    rel = fabs(dtot - ref) / ref;
    if (getenv("CT_VERBOSE")) printf("l2norm 10M: sumsq rel err %.3g, norm %.9g ref %.17g\n", rel, tot, sqrt(ref));
    CT_CHECK(rel < 1e-12, "sumsq rel err %.3g" SEEDFMT, rel, g_seed);
    CT_CHECK(close_f(tot, sqrt(ref), 0.5001), "norm %.9g ref %.17g" SEEDFMT, tot, sqrt(ref), g_seed);
    tl_free(&a);
}

CT_TEST(l2norm_same_bits_any_thread_count) {
    int64_t sizes[5] = {300007, 65536 * 3, 17, 0, 100003};
    static const int threads[5] = {0, 1, 2, 3, 7};
    static const int64_t chunks[3] = {0, 4096, 1000};
    int d, c, t;
    seed_once();
    for (d = 0; d < 3; d++) {
        tlist a;
        memset(&a, 0, sizeof a);
        CT_CHECK(tl_alloc(&a, k_dtypes[d], sizes, 5), "alloc");
        tl_fill(&a);
        for (c = 0; c < 3; c++) {
            double per0[5], ref = fixed_order_sumsq(&a, chunks[c] ? chunks[c] : 65536, per0);
            for (t = 0; t < 5; t++) {
                capex_tensor_op_desc desc;
                double tot, per[5];
                float n1, pn[5];
                size_t i;
                capex_tensor_op_desc_init(&desc);
                desc.num_threads = threads[t];
                desc.chunk_size = chunks[c];
                desc.parallel_min_elements = 1; /* force threads even for small launches */
                CT_CHECK(capex_multi_tensor_sumsq(&desc, &a.l, &tot, per) == CAPEX_OK, "%.300s", capex_last_error());
                CT_CHECK(capex_multi_tensor_l2norm(&desc, &a.l, &n1, pn) == CAPEX_OK, "%.300s", capex_last_error());
                CT_CHECK(dbits(tot) == dbits(ref), "%s chunk %lld threads %d: %.17g vs %.17g" SEEDFMT, capex_dtype_name(a.dt),
                         (long long)chunks[c], threads[t], tot, ref, g_seed);
                CT_CHECK(fbits(n1) == fbits((float)sqrt(ref)), "%s threads %d norm bits", capex_dtype_name(a.dt), threads[t]);
                for (i = 0; i < 5; i++) {
                    CT_CHECK(dbits(per[i]) == dbits(per0[i]), "%s threads %d tensor %zu", capex_dtype_name(a.dt), threads[t], i);
                    CT_CHECK(fbits(pn[i]) == fbits((float)sqrt(per0[i])), "per-tensor norm bits");
                }
            }
        }
        tl_free(&a);
    }
#ifndef _OPENMP
    if (getenv("CT_VERBOSE")) printf("(built without OpenMP: thread counts only change nothing)\n");
#endif
}

/* Many tensors, several launches, tensors cut across launches (chunk 64):
   per-tensor results still bit-equal to the fixed-order reduction. */
CT_TEST(l2norm_many_tensors_across_launches) {
    int64_t sizes[400];
    tlist a;
    double per_ref[400], per[400], tot, ref;
    float pn[400];
    capex_tensor_op_desc desc;
    int i;
    seed_once();
    for (i = 0; i < 400; i++) sizes[i] = (i % 7 == 0) ? 0 : (int64_t)(rng_u64() % 3000);
    sizes[200] = 50000; /* spans launches: 782 chunks of 64, 320 per launch */
    memset(&a, 0, sizeof a);
    CT_CHECK(tl_alloc(&a, CAPEX_BF16, sizes, 400), "alloc");
    tl_fill(&a);
    capex_tensor_op_desc_init(&desc);
    desc.chunk_size = 64;
    desc.parallel_min_elements = 1;
    ref = fixed_order_sumsq(&a, 64, per_ref);
    CT_CHECK(capex_multi_tensor_sumsq(&desc, &a.l, &tot, per) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_multi_tensor_l2norm(&desc, &a.l, NULL, pn) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(dbits(tot) == dbits(ref), "total bits" SEEDFMT, g_seed);
    for (i = 0; i < 400; i++) {
        CT_CHECK(dbits(per[i]) == dbits(per_ref[i]), "tensor %d sumsq bits" SEEDFMT, i, g_seed);
        CT_CHECK(fbits(pn[i]) == fbits((float)sqrt(per_ref[i])), "tensor %d norm bits" SEEDFMT, i, g_seed);
    }
    tl_free(&a);
}

CT_TEST(l2norm_nonfinite_and_large) {
    int64_t sizes[2] = {100, 70000};
    tlist a;
    float tot, per[2];
    memset(&a, 0, sizeof a);
    CT_CHECK(tl_alloc(&a, CAPEX_F32, sizes, 2), "alloc");
    tl_fill(&a);
    /* squares beyond FLT_MAX do not overflow the float64 sum */
    ((float *)a.t[0].data)[3] = 3e38f;
    ((float *)a.t[0].data)[4] = -3e38f;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, per) == CAPEX_OK, "ok");
    CT_CHECK(isinf(tot) && isinf(per[0]) && !isinf(per[1]), "sqrt(2)*3e38 exceeds FLT_MAX: inf as float");
    ((float *)a.t[0].data)[4] = 1.0f;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, per) == CAPEX_OK && close_f(tot, 3e38, 1.0), "large finite norm %g", tot);
    ((float *)a.t[1].data)[65536] = NAN;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, per) == CAPEX_OK && isnan(tot) && isnan(per[1]) && !isnan(per[0]), "NaN propagates");
    ((float *)a.t[1].data)[65536] = -INFINITY;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &a.l, &tot, per) == CAPEX_OK && isinf(tot) && isinf(per[1]), "inf propagates");
    tl_free(&a);
}

/* ======================================================================= */
/* scale (unscale), axpby, clip                                            */
/* ======================================================================= */

static const int64_t k_sizes[7] = {65536 + 1, 0, 1, 13, 65535, 131072, 100003};
/* axpby runs 36 combinations: smaller, still across chunk boundaries */
static const int64_t k_sizes_ax[7] = {65536 + 1, 0, 1, 13, 65535, 3, 8191};

/* out = in * s for every (in, out) dtype pair, out of place and in place;
   exact bits vs the float64 product rounded to f32 then to out's dtype. */
CT_TEST(scale_all_dtype_pairs) {
    int di, dout, t;
    seed_once();
    for (di = 0; di < 3; di++)
        for (dout = 0; dout < 3; dout++)
            for (t = 0; t < 3; t++) { /* out of place with 1 and 3 threads, then in place */
                tlist in, out;
                capex_tensor_op_desc desc;
                float s = (float)(rng_unit() * 4.0);
                int found = 0;
                size_t i;
                int64_t k;
                int inplace = t == 2;
                if (inplace && di != dout) continue;
                if (t == 0) s = 1.0f / 65536.0f; /* a typical inverse loss scale */
                capex_tensor_op_desc_init(&desc);
                desc.num_threads = t == 1 ? 3 : 1;
                desc.parallel_min_elements = 1;
                memset(&in, 0, sizeof in); memset(&out, 0, sizeof out);
                CT_CHECK(tl_alloc(&in, k_dtypes[di], k_sizes, 7) && tl_alloc(&out, k_dtypes[dout], k_sizes, 7), "alloc");
                tl_fill(&in);
                if (inplace)
                    for (i = 0; i < 7; i++) memcpy(out.t[i].data, in.t[i].data, (size_t)k_sizes[i] * capex_dtype_size(in.dt));
                CT_CHECK(capex_multi_tensor_scale(&desc, inplace ? &out.l : &in.l, &out.l, s, &found) == CAPEX_OK, "%.300s", capex_last_error());
                CT_CHECK(found == 0, "%s->%s: no inf/NaN here" SEEDFMT, capex_dtype_name(in.dt), capex_dtype_name(out.dt), g_seed);
                for (i = 0; i < 7; i++)
                    for (k = 0; k < k_sizes[i]; k++) {
                        uint32_t want = code_of(out.dt, (float)(getv(in.dt, in.t[i].data, k) * (double)s));
                        uint32_t got = getcode(out.dt, out.t[i].data, k);
                        CT_CHECK(got == want, "%s->%s%s tensor %zu elem %lld: got 0x%x want 0x%x (s=%g)" SEEDFMT,
                                 capex_dtype_name(in.dt), capex_dtype_name(out.dt), inplace ? " in place" : "", i,
                                 (long long)k, got, want, (double)s, g_seed);
                    }
                CT_CHECK(tl_guards_bad(&out) == 0 && tl_guards_bad(&in) == 0, "%s->%s wrote outside its tensors", capex_dtype_name(in.dt), capex_dtype_name(out.dt));
                found = 1;
                CT_CHECK(capex_multi_tensor_scale(&desc, &in.l, &out.l, s, &found) == CAPEX_OK && found == 1, "found_inf is never cleared");
                CT_CHECK(capex_multi_tensor_scale(&desc, &in.l, &out.l, s, NULL) == CAPEX_OK, "found_inf may be NULL");
                tl_free(&in); tl_free(&out);
            }
}

/* inf/NaN at the first/middle/last element of the first and last tensor and
   on chunk boundaries, for each input dtype, found with any thread count. */
CT_TEST(scale_finds_inf_nan_everywhere) {
    int64_t sizes[3] = {2 * 65536 + 3, 5, 65537};
    int64_t pos[10][2] = {{0, 0}, {0, 65536 + 1}, {0, 2 * 65536 + 2}, {0, 65535}, {0, 65536}, {0, 2 * 65536},
                          {2, 0}, {2, 32768}, {2, 65535}, {2, 65536}};
    static const float bad[3] = {INFINITY, -INFINITY, NAN};
    int di, dout, p, b;
    seed_once();
    for (di = 0; di < 3; di++)
        for (dout = 0; dout < 3; dout++) {
            tlist in, out;
            memset(&in, 0, sizeof in); memset(&out, 0, sizeof out);
            CT_CHECK(tl_alloc(&in, k_dtypes[di], sizes, 3) && tl_alloc(&out, k_dtypes[dout], sizes, 3), "alloc");
            tl_fill(&in);
            for (p = 0; p < 10; p++)
                for (b = 0; b < 3; b++) {
                    capex_tensor_op_desc desc;
                    int found = 0;
                    size_t ti = (size_t)pos[p][0];
                    int64_t k = pos[p][1];
                    uint32_t saved = getcode(in.dt, in.t[ti].data, k);
                    capex_tensor_op_desc_init(&desc);
                    desc.num_threads = 1 + (p + b) % 3;
                    desc.parallel_min_elements = 1;
                    setv(in.dt, in.t[ti].data, k, bad[b]);
                    CT_CHECK(capex_multi_tensor_scale(&desc, &in.l, &out.l, 0.5f, &found) == CAPEX_OK, "%.300s", capex_last_error());
                    CT_CHECK(found == 1, "%s->%s: %g at tensor %zu elem %lld not found", capex_dtype_name(in.dt), capex_dtype_name(out.dt), (double)bad[b], ti, (long long)k);
                    CT_CHECK(isnan(getv(out.dt, out.t[ti].data, k)) == isnan(bad[b]) && !isfinite(getv(out.dt, out.t[ti].data, k)), "non-finite passes through");
                    /* restore */
                    if (in.dt == CAPEX_F32) memcpy((float *)in.t[ti].data + k, &saved, 4);
                    else ((uint16_t *)in.t[ti].data)[k] = (uint16_t)saved;
                }
            tl_free(&in); tl_free(&out);
        }
}

CT_TEST(scale_output_overflow_is_found) {
    /* finite inputs whose scaled value overflows the output dtype */
    float x32[4] = {1.0f, 3e38f, 2.0f, 1e5f};
    uint16_t x16[4];
    capex_tensor ti, to;
    capex_tensor_list in, out;
    uint16_t h[4];
    float f[4];
    int found = 0;
    ti.data = x32; ti.numel = 4;
    to.data = f; to.numel = 4;
    in = capex_tensor_list_make(CAPEX_F32, &ti, 1);
    out = capex_tensor_list_make(CAPEX_F32, &to, 1);
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &found) == CAPEX_OK && found == 1 && isinf(f[1]), "f32 overflow");
    x32[1] = 1.0f; found = 0;
    to.data = h; out.dtype = CAPEX_F16;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 1.0f, &found) == CAPEX_OK && found == 1 && h[3] == 0x7c00, "1e5 overflows f16");
    x32[3] = 65504.0f; found = 0;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 1.0f, &found) == CAPEX_OK && found == 0 && h[3] == 0x7bff, "65504 fits f16");
    x32[3] = 1e5f; found = 0;
    out.dtype = CAPEX_BF16;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 1.0f, &found) == CAPEX_OK && found == 0, "1e5 fits bf16");
    /* f16 grads unscaled into f32 master grads: 1/65536 of the largest half */
    x16[0] = 0x7bff; x16[1] = 0x0001; x16[2] = 0x3c00; x16[3] = 0xfbff;
    ti.data = x16; in.dtype = CAPEX_F16; to.data = f; out.dtype = CAPEX_F32; found = 0;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 1.0f / 65536.0f, &found) == CAPEX_OK && found == 0, "unscale");
    CT_CHECK(f[0] == 65504.0f / 65536.0f && f[1] == ldexpf(1.0f, -40) && f[2] == ldexpf(1.0f, -16) && f[3] == -65504.0f / 65536.0f, "exact unscale");
}

/* The ops' vectorisable half codecs against the core conversions (which
   test_half checks exhaustively): every f16 code in, and every 251st f32
   pattern plus all f16 rounding boundaries out, through scale(s = 1). */
CT_TEST(scale_half_codecs_match_core) {
    int64_t n = 65536, k, m = (int64_t)(4294967296LL / 251) + 1;
    uint16_t *h = (uint16_t *)malloc((size_t)n * 2), *h2 = (uint16_t *)malloc((size_t)m * 2);
    float *f = (float *)malloc((size_t)m * 4);
    capex_tensor ti, to;
    capex_tensor_list li, lo;
    int found = 0, d;
    CT_CHECK(h && h2 && f, "alloc");
    for (k = 0; k < n; k++) h[k] = (uint16_t)k;
    for (d = 1; d < 3; d++) {
        ti.data = h; ti.numel = n; to.data = f; to.numel = n;
        li = capex_tensor_list_make(k_dtypes[d], &ti, 1);
        lo = capex_tensor_list_make(CAPEX_F32, &to, 1);
        CT_CHECK(capex_multi_tensor_scale(NULL, &li, &lo, 1.0f, &found) == CAPEX_OK && found == 1, "decode");
        for (k = 0; k < n; k++) {
            float want = d == 1 ? capex_f16_to_f32((uint16_t)k) : capex_bf16_to_f32((uint16_t)k);
            CT_CHECK(isnan(want) ? isnan(f[k]) : fbits(f[k]) == fbits(want), "%s code 0x%04x: 0x%08x vs 0x%08x", capex_dtype_name(li.dtype), (unsigned)k, fbits(f[k]), fbits(want));
        }
    }
    for (k = 0; k < m; k++) {
        uint32_t u = (uint32_t)(k * 251);
        memcpy(&f[k], &u, 4);
    }
    /* the midpoints between neighbouring f16 values, and one f32 ulp either side */
    for (k = 0; k < 0x7c00 && 3 * k + 2 < m; k++) {
        double lo_ = (double)capex_f16_to_f32((uint16_t)k), hi_ = (double)capex_f16_to_f32((uint16_t)(k + 1));
        float mid = (float)((lo_ + hi_) / 2);
        f[3 * k] = mid; f[3 * k + 1] = nextafterf(mid, 0.0f); f[3 * k + 2] = -nextafterf(mid, INFINITY);
    }
    for (d = 1; d < 3; d++) {
        ti.data = f; ti.numel = m; to.data = h2; to.numel = m;
        li = capex_tensor_list_make(CAPEX_F32, &ti, 1);
        lo = capex_tensor_list_make(k_dtypes[d], &to, 1);
        CT_CHECK(capex_multi_tensor_scale(NULL, &li, &lo, 1.0f, &found) == CAPEX_OK, "encode");
        for (k = 0; k < m; k++) {
            uint16_t want = d == 1 ? capex_f32_to_f16(f[k]) : capex_f32_to_bf16(f[k]);
            CT_CHECK(h2[k] == want, "%s of 0x%08x: 0x%04x vs core 0x%04x", capex_dtype_name(lo.dtype), fbits(f[k]), h2[k], want);
        }
    }
    free(h); free(h2); free(f);
}

CT_TEST(axpby_all_dtype_triples) {
    int dx, dy, dout, t;
    seed_once();
    for (dx = 0; dx < 3; dx++)
        for (dy = 0; dy < 3; dy++)
            for (dout = 0; dout < 3; dout++)
                for (t = 0; t < 2; t++) { /* out separate, then out == y (same dtype only) */
                    tlist x, y, out;
                    capex_tensor_op_desc desc;
                    float a = (float)(rng_unit() * 4.0 - 2.0), b = (float)(rng_unit() * 4.0 - 2.0);
                    int found = 0, iny = t == 1;
                    size_t i;
                    int64_t k;
                    if (iny && dy != dout) continue;
                    capex_tensor_op_desc_init(&desc);
                    desc.num_threads = 1 + (dx + dy + dout) % 3;
                    desc.parallel_min_elements = 1;
                    memset(&x, 0, sizeof x); memset(&y, 0, sizeof y); memset(&out, 0, sizeof out);
                    CT_CHECK(tl_alloc(&x, k_dtypes[dx], k_sizes_ax, 7) && tl_alloc(&y, k_dtypes[dy], k_sizes_ax, 7) &&
                             tl_alloc(&out, k_dtypes[dout], k_sizes_ax, 7), "alloc");
                    tl_fill(&x); tl_fill(&y);
                    if (iny) /* keep y's values to check against: out starts as y */
                        for (i = 0; i < 7; i++) memcpy(out.t[i].data, y.t[i].data, (size_t)k_sizes_ax[i] * capex_dtype_size(y.dt));
                    CT_CHECK(capex_multi_tensor_axpby(&desc, a, &x.l, b, iny ? &out.l : &y.l, &out.l, -1, &found) == CAPEX_OK, "%.300s", capex_last_error());
                    CT_CHECK(found == 0, "no inf here");
                    for (i = 0; i < 7; i++)
                        for (k = 0; k < k_sizes_ax[i]; k++) {
                            double r = (double)a * getv(x.dt, x.t[i].data, k) + (double)b * getv(y.dt, y.t[i].data, k);
                            uint32_t want = code_of(out.dt, (float)r), got = getcode(out.dt, out.t[i].data, k);
                            CT_CHECK(got == want, "%s,%s->%s%s tensor %zu elem %lld: got 0x%x want 0x%x" SEEDFMT, capex_dtype_name(x.dt),
                                     capex_dtype_name(y.dt), capex_dtype_name(out.dt), iny ? " (out=y)" : "", i, (long long)k, got, want, g_seed);
                        }
                    CT_CHECK(tl_guards_bad(&out) == 0 && tl_guards_bad(&x) == 0 && tl_guards_bad(&y) == 0, "wrote outside tensors");
                    tl_free(&x); tl_free(&y); tl_free(&out);
                }
}

CT_TEST(axpby_arg_to_check) {
    int64_t sizes[2] = {70000, 3};
    int d;
    for (d = 0; d < 3; d++) {
        tlist x, y, out;
        int which, chk;
        memset(&x, 0, sizeof x); memset(&y, 0, sizeof y); memset(&out, 0, sizeof out);
        CT_CHECK(tl_alloc(&x, k_dtypes[d], sizes, 2) && tl_alloc(&y, CAPEX_F32, sizes, 2) && tl_alloc(&out, k_dtypes[d], sizes, 2), "alloc");
        tl_fill(&x); tl_fill(&y);
        for (which = 0; which < 2; which++) { /* inf in x, then in y */
            tlist *v = which ? &y : &x;
            setv(v->dt, v->t[which].data, which ? 2 : 65536, NAN);
            for (chk = -1; chk <= 1; chk++) {
                int found = 0, want = chk == -1 || chk == which;
                CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &x.l, 1.0f, &y.l, &out.l, chk, &found) == CAPEX_OK, "%.300s", capex_last_error());
                CT_CHECK(found == want, "%s: NaN in %s, arg_to_check %d: found %d", capex_dtype_name(x.dt), which ? "y" : "x", chk, found);
            }
            setv(v->dt, v->t[which].data, which ? 2 : 65536, 1.0f);
        }
        tl_free(&x); tl_free(&y); tl_free(&out);
    }
}

CT_TEST(clip_grad_norm_matches_pytorch_formula) {
    int64_t s1[3] = {65536 * 2 + 1, 0, 999}, s2[2] = {4097, 65537};
    tlist g1, g2, c1, c2;
    capex_tensor_list lists[2];
    double ref, fixed;
    float total, total2, coef, coef_ref, max_norm;
    size_t i;
    int64_t k;
    seed_once();
    memset(&g1, 0, sizeof g1); memset(&g2, 0, sizeof g2); memset(&c1, 0, sizeof c1); memset(&c2, 0, sizeof c2);
    CT_CHECK(tl_alloc(&g1, CAPEX_F32, s1, 3) && tl_alloc(&g2, CAPEX_BF16, s2, 2) && tl_alloc(&c1, CAPEX_F32, s1, 3) &&
             tl_alloc(&c2, CAPEX_BF16, s2, 2), "alloc");
    tl_fill(&g1); tl_fill(&g2);
    for (i = 0; i < 3; i++) memcpy(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4);
    for (i = 0; i < 2; i++) memcpy(c2.t[i].data, g2.t[i].data, (size_t)s2[i] * 2);
    ref = 0.0;
    for (i = 0; i < 3; i++) ref += ref_sumsq(g1.dt, g1.t[i].data, s1[i]);
    for (i = 0; i < 2; i++) ref += ref_sumsq(g2.dt, g2.t[i].data, s2[i]);
    fixed = fixed_order_sumsq(&g1, 65536, NULL) + fixed_order_sumsq(&g2, 65536, NULL);
    lists[0] = g1.l; lists[1] = g2.l;
    /* compute only: nothing written */
    max_norm = (float)(sqrt(ref) / 3.0);
    CT_CHECK(capex_clip_grad_norm_coef(NULL, lists, 2, max_norm, &total, &coef) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(fbits(total) == fbits((float)sqrt(fixed)) && close_f(total, sqrt(ref), 0.5001), "total %.9g ref %.17g" SEEDFMT, total, sqrt(ref), g_seed);
    coef_ref = max_norm / (total + 1e-6f);
    CT_CHECK(fbits(coef) == fbits(coef_ref) && coef < 1.0f && fabs(coef - 1.0 / 3.0) < 1e-5, "coef %.9g ref %.9g", coef, coef_ref);
    for (i = 0; i < 3; i++) CT_CHECK(memcmp(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4) == 0, "coef-only wrote grads");
    /* clip: every grad multiplied by coef in f32, rounded to its dtype */
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, max_norm, &total2) == CAPEX_OK && fbits(total2) == fbits(total), "clip");
    for (i = 0; i < 3; i++)
        for (k = 0; k < s1[i]; k++)
            CT_CHECK(getcode(g1.dt, g1.t[i].data, k) == code_of(g1.dt, (float)(getv(c1.dt, c1.t[i].data, k) * (double)coef)), "f32 grad %zu/%lld", i, (long long)k);
    for (i = 0; i < 2; i++)
        for (k = 0; k < s2[i]; k++)
            CT_CHECK(getcode(g2.dt, g2.t[i].data, k) == code_of(g2.dt, (float)(getv(c2.dt, c2.t[i].data, k) * (double)coef)), "bf16 grad %zu/%lld", i, (long long)k);
    CT_CHECK(tl_guards_bad(&g1) == 0 && tl_guards_bad(&g2) == 0, "wrote outside grads");
    /* norm under max_norm: untouched, coef 1 */
    for (i = 0; i < 3; i++) memcpy(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4);
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, 1e30f, &total) == CAPEX_OK, "no clip");
    for (i = 0; i < 3; i++) CT_CHECK(memcmp(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4) == 0, "unclipped grads changed");
    CT_CHECK(capex_clip_grad_norm_coef(NULL, lists, 2, INFINITY, &total, &coef) == CAPEX_OK && coef == 1.0f, "inf max_norm");
    CT_CHECK(capex_clip_grad_norm_coef(NULL, lists, 2, 0.0f, &total, &coef) == CAPEX_OK && coef == 0.0f, "max_norm 0 zeroes");
    /* non-finite total: grads untouched, coef 1 */
    ((float *)g1.t[2].data)[5] = INFINITY;
    for (i = 0; i < 3; i++) memcpy(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4);
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, 1.0f, &total) == CAPEX_OK && isinf(total), "inf total");
    for (i = 0; i < 3; i++) CT_CHECK(memcmp(c1.t[i].data, g1.t[i].data, (size_t)s1[i] * 4) == 0, "grads changed on inf norm");
    CT_CHECK(capex_clip_grad_norm_coef(NULL, lists, 2, 1.0f, &total, &coef) == CAPEX_OK && coef == 1.0f, "coef 1 on inf");
    CT_CHECK(capex_clip_coef(NAN, 1.0f) == 1.0f && capex_clip_coef(2.0f, 1.0f) == 1.0f / (2.0f + 1e-6f) && capex_clip_coef(0.5f, 1.0f) == 1.0f, "capex_clip_coef");
    /* bad arguments */
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, NAN, &total) == CAPEX_ERR_INVALID_ARG, "NaN max_norm");
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, -1.0f, &total) == CAPEX_ERR_INVALID_ARG, "negative max_norm");
    CT_CHECK(capex_clip_grad_norm(NULL, NULL, 2, 1.0f, &total) == CAPEX_ERR_INVALID_ARG, "null grads");
    CT_CHECK(capex_clip_grad_norm(NULL, NULL, 0, 1.0f, &total) == CAPEX_OK && total == 0.0f, "no lists: norm 0");
    {   /* a bad desc is refused with no lists too (the GPU's clip refuses it first) */
        capex_tensor_op_desc bd;
        memset(&bd, 0xA5, sizeof bd);
        total = -1.0f;
        CT_CHECK(capex_clip_grad_norm(&bd, NULL, 0, 1.0f, &total) == CAPEX_ERR_INVALID_ARG && total == -1.0f,
                 "bad desc, no lists: %.300s", capex_last_error());
        CT_CHECK(capex_clip_grad_norm_coef(&bd, NULL, 0, 1.0f, &total, NULL) == CAPEX_ERR_INVALID_ARG, "coef, bad desc");
    }
    lists[1].tensors = NULL;
    CT_CHECK(capex_clip_grad_norm(NULL, lists, 2, 1.0f, &total) == CAPEX_ERR_INVALID_ARG, "bad second list");
    CT_CHECK(strstr(capex_last_error(), "grads[1]") != NULL, "message names the list: %.300s", capex_last_error());
    tl_free(&g1); tl_free(&g2); tl_free(&c1); tl_free(&c2);
}

/* Review fixes: finite grads whose norm overflows f32 are clipped to 0 (PyTorch:
   max_norm / inf); an output that is another index's input or another output
   is refused; a bad desc writes no per-tensor output; numel of a bad dtype. */
CT_TEST(clip_overflow_aliases_and_early_checks) {
    float a[2] = {3e38f, 3e38f}, b[2] = {1, 2}, per[2] = {-1, -1}, total = 0, coef = -1;
    capex_tensor ta[2], tb[2];
    capex_tensor_list l, in, out;
    capex_tensor_op_desc d;
    ta[0].data = a; ta[0].numel = 2;
    l = capex_tensor_list_make(CAPEX_F32, ta, 1);
    CT_CHECK(capex_clip_grad_norm_coef(NULL, &l, 1, 1.0f, &total, &coef) == CAPEX_OK && isinf(total) && coef == 0.0f,
             "finite grads, norm beyond f32: coef %g (PyTorch 0)", (double)coef);
    /* max_norm inf means no clipping, also here (PyTorch: inf / inf = NaN grads) */
    CT_CHECK(capex_clip_grad_norm(NULL, &l, 1, INFINITY, &total) == CAPEX_OK && isinf(total) && a[0] == 3e38f &&
             a[1] == 3e38f, "max_norm inf, norm beyond f32: grads %g %g", (double)a[0], (double)a[1]);
    CT_CHECK(capex_clip_grad_norm(NULL, &l, 1, 1.0f, &total) == CAPEX_OK && a[0] == 0.0f && a[1] == 0.0f, "clipped to 0");
    /* in = {a, b}, out = {b, a}: out[0] would overwrite in[1] before it is read */
    a[0] = 1; a[1] = 2;
    ta[1].data = b; ta[1].numel = 2;
    tb[0].data = b; tb[0].numel = 2; tb[1].data = a; tb[1].numel = 2;
    in = capex_tensor_list_make(CAPEX_F32, ta, 2);
    out = capex_tensor_list_make(CAPEX_F32, tb, 2);
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "its own input"), "swapped in/out refused: %.300s", capex_last_error());
    CT_CHECK(a[0] == 1 && b[0] == 1, "nothing written");
    tb[0].data = a; tb[1].data = a;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, NULL) == CAPEX_ERR_INVALID_ARG, "one output twice refused");
    /* in = {a, a}, out = {b, a}: out[1] is in[1] in place, but in[0] reads a too (chunks of both
       tensors run in parallel): refused whichever input sorts next to the output */
    ta[1].data = a; tb[0].data = b; tb[1].data = a;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, NULL) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "out[1] is the memory of in[0]"), "repeated input written by another "
             "tensor's output refused: %.300s", capex_last_error());
    CT_CHECK(a[0] == 1 && b[0] == 1, "nothing written");
    ta[1].data = b; tb[0].data = a;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &in, 2.0f, NULL) == CAPEX_OK && a[1] == 4.0f && b[1] == 4.0f,
             "in place, tensor for tensor: %.300s", capex_last_error());
    /* a bad desc is refused before the per-tensor norms are written */
    capex_tensor_op_desc_init(&d);
    d.chunk_size = -5;
    CT_CHECK(capex_multi_tensor_l2norm(&d, &in, &total, per) == CAPEX_ERR_INVALID_ARG && per[0] == -1.0f && per[1] == -1.0f,
             "nothing written on a bad desc (%g %g)", (double)per[0], (double)per[1]);
    l.dtype = (capex_dtype)7;
    CT_CHECK(capex_tensor_list_numel(&l) == -1, "numel of a list with a bad dtype");
}

/* Clipping in place over a list that holds one tensor twice would scale it
   twice (by coef^2): refused before anything is written, as the GPU's
   capex_cuda_clip_grad_norm does; computing only (no writes) is fine. */
CT_TEST(clip_in_place_refuses_repeated_tensor) {
    float a[4] = {3, 3, 3, 3}, b[4] = {1, 1, 1, 1}, total = -1, coef = -1;
    capex_tensor ok[1], dup[2];
    capex_tensor_list l[2];
    ok[0].data = b; ok[0].numel = 4;
    dup[0].data = a; dup[0].numel = 4; dup[1].data = a; dup[1].numel = 4;
    l[0] = capex_tensor_list_make(CAPEX_F32, ok, 1);
    l[1] = capex_tensor_list_make(CAPEX_F32, dup, 2);
    CT_CHECK(capex_clip_grad_norm(NULL, l, 2, 1.0f, &total) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_clip_grad_norm: grads[1][") != NULL, "repeat refused: %.300s",
             capex_last_error());
    CT_CHECK(a[0] == 3.0f && b[0] == 1.0f && total == -1.0f, "nothing written (a %g, b %g, total %g)", (double)a[0],
             (double)b[0], (double)total);
    CT_CHECK(capex_clip_grad_norm_coef(NULL, l, 2, 1.0f, &total, &coef) == CAPEX_OK && total == (float)sqrt(76.0) && a[0] == 3.0f,
             "computing only reads the repeat twice: %.300s", capex_last_error());
    /* the same tensor in two lists (or an f16 view of an f32 one) is scaled twice just the same */
    {
        capex_tensor one[1], two[2], half[1];
        one[0].data = a; one[0].numel = 4;
        two[0].data = b; two[0].numel = 4; two[1].data = a; two[1].numel = 4;
        half[0].data = (uint16_t *)(void *)b + 6; half[0].numel = 2;
        l[0] = capex_tensor_list_make(CAPEX_F32, one, 1);
        l[1] = capex_tensor_list_make(CAPEX_F32, two, 2);
        total = -1;
        CT_CHECK(capex_clip_grad_norm(NULL, l, 2, 1.0f, &total) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "grads[0][0] and grads[1][1] overlap") != NULL, "repeat across lists: %.300s",
                 capex_last_error());
        CT_CHECK(a[0] == 3.0f && b[0] == 1.0f && total == -1.0f, "nothing written");
        two[1].data = b + 2; two[1].numel = 1; two[0].numel = 2; /* b[0..2), b[2]: disjoint */
        l[1] = capex_tensor_list_make(CAPEX_F32, two, 2);
        l[0] = capex_tensor_list_make(CAPEX_F16, half, 1); /* b[3] as two f16 codes */
        CT_CHECK(capex_clip_grad_norm(NULL, l, 2, 1e30f, &total) == CAPEX_OK, "adjacent across lists: %.300s",
                 capex_last_error());
        half[0].data = (uint16_t *)(void *)b + 5;
        CT_CHECK(capex_clip_grad_norm(NULL, l, 2, 1.0f, &total) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "grads[0][0] and grads[1][1] overlap") != NULL, "f16 view across lists: %.300s",
                 capex_last_error());
        CT_CHECK(capex_clip_grad_norm_coef(NULL, l, 2, 1.0f, &total, &coef) == CAPEX_OK, "computing only: %.300s",
                 capex_last_error());
    }
}

/* An output overlapping an input or another output in part (not exactly in
   place) read elements another chunk had already written: out = in + 1
   element gave 0 0 0 ... instead of 2*in. Refused now, nothing written, for
   scale, axpby and in-place clipping; exact in place, inputs overlapping
   inputs and adjacent tensors stay fine. */
CT_TEST(partial_overlaps_refused) {
    float a[24], a0[24], total = 0;
    capex_tensor ti[2], to[2], ty[2];
    capex_tensor_list in, out, y;
    int i, fi = 0;
    for (i = 0; i < 24; i++) a0[i] = (float)i;
#define PO_RESET() memcpy(a, a0, sizeof a)
#define PO_REFUSED(call, what)                                                                               \
    do {                                                                                                     \
        PO_RESET();                                                                                          \
        CT_CHECK((call) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "overlap") != NULL,           \
                 "%s refused: %.300s", what, capex_last_error());                                            \
        CT_CHECK(memcmp(a, a0, sizeof a) == 0 && fi == 0, "%s: nothing written", what);                      \
    } while (0)
    ti[0].data = a; ti[0].numel = 8; to[0].data = a + 1; to[0].numel = 8;
    in = capex_tensor_list_make(CAPEX_F32, ti, 1);
    out = capex_tensor_list_make(CAPEX_F32, to, 1);
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi), "out = in + 1");
    to[0].data = a + 7; /* output starts inside the input's last element */
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi), "out = in + 7");
    ti[0].data = a + 4; to[0].data = a; /* output ends inside the input */
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi), "in = out + 4");
    /* in place, but the list's tensors overlap each other */
    ti[0].data = a; ti[0].numel = 8; ti[1].data = a + 4; ti[1].numel = 8;
    in = capex_tensor_list_make(CAPEX_F32, ti, 2);
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &in, 2.0f, &fi), "in place, overlapping tensors");
    PO_REFUSED(capex_clip_grad_norm(NULL, &in, 1, 1.0f, &total), "clip in place, overlapping tensors");
    /* two outputs overlapping in part, distinct inputs */
    ty[0].data = a + 16; ty[0].numel = 4; ty[1].data = a + 20; ty[1].numel = 4;
    to[0].data = a; to[0].numel = 4; to[1].data = a + 2; to[1].numel = 4;
    in = capex_tensor_list_make(CAPEX_F32, ty, 2);
    out = capex_tensor_list_make(CAPEX_F32, to, 2);
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi), "outputs overlapping");
    /* f16 output inside an f32 input (different starts, different sizes) */
    ti[0].data = a; ti[0].numel = 4;
    to[0].data = (uint16_t *)(void *)a + 3; to[0].numel = 4;
    in = capex_tensor_list_make(CAPEX_F32, ti, 1);
    out = capex_tensor_list_make(CAPEX_F16, to, 1);
    PO_REFUSED(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi), "f16 output inside an f32 input");
    /* axpby: out overlapping y in part */
    ti[0].data = a; ti[0].numel = 4; ty[0].data = a + 8; ty[0].numel = 4; to[0].data = a + 9; to[0].numel = 4;
    in = capex_tensor_list_make(CAPEX_F32, ti, 1);
    y = capex_tensor_list_make(CAPEX_F32, ty, 1);
    out = capex_tensor_list_make(CAPEX_F32, to, 1);
    PO_REFUSED(capex_multi_tensor_axpby(NULL, 1.0f, &in, 1.0f, &y, &out, -1, &fi), "axpby out = y + 1");
    /* still fine: inputs overlapping inputs, adjacent tensors, exact in place */
    PO_RESET();
    ti[0].data = a; ti[0].numel = 8; ti[1].data = a + 4; ti[1].numel = 8;
    to[0].data = a + 12; to[0].numel = 8; to[1].data = a + 20; to[1].numel = 4; /* adjacent outputs */
    ti[1].numel = 4;
    in = capex_tensor_list_make(CAPEX_F32, ti, 2);
    out = capex_tensor_list_make(CAPEX_F32, to, 2);
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &out, 2.0f, &fi) == CAPEX_OK, "overlapping inputs: %.300s",
             capex_last_error());
    CT_CHECK(a[12] == 0.0f && a[19] == 14.0f && a[20] == 8.0f && a[23] == 14.0f, "values");
    PO_RESET();
    ti[0].data = a; ti[0].numel = 8; ti[1].data = a + 8; ti[1].numel = 8;
    CT_CHECK(capex_multi_tensor_scale(NULL, &in, &in, 2.0f, &fi) == CAPEX_OK && a[7] == 14.0f && a[8] == 16.0f &&
             a[15] == 30.0f && a[16] == 16.0f, "adjacent, in place: %.300s", capex_last_error());
    PO_RESET();
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &in, 1.0f, &in, &in, -1, &fi) == CAPEX_OK && a[3] == 6.0f,
             "axpby in place on x and y: %.300s", capex_last_error());
#undef PO_REFUSED
#undef PO_RESET
}

CT_TEST(bad_input_ops) {
    float a[8], b[8];
    uint16_t h[8];
    capex_tensor ta[2], tb[2], th[2], tc[1];
    capex_tensor_list la, lb, lh, lc;
    int found = 0;
    memset(a, 0, sizeof a); memset(b, 0, sizeof b); memset(h, 0, sizeof h);
    ta[0].data = a; ta[0].numel = 4; ta[1].data = a + 4; ta[1].numel = 4;
    tb[0].data = b; tb[0].numel = 4; tb[1].data = b + 4; tb[1].numel = 4;
    th[0].data = h; th[0].numel = 4; th[1].data = h + 4; th[1].numel = 4;
    tc[0].data = b; tc[0].numel = 8;
    la = capex_tensor_list_make(CAPEX_F32, ta, 2);
    lb = capex_tensor_list_make(CAPEX_F32, tb, 2);
    lh = capex_tensor_list_make(CAPEX_F16, th, 2);
    lc = capex_tensor_list_make(CAPEX_F32, tc, 1);
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lb, 2.0f, &found) == CAPEX_OK, "valid");
    CT_CHECK(capex_multi_tensor_scale(NULL, NULL, &lb, 2.0f, &found) == CAPEX_ERR_INVALID_ARG, "null in");
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, NULL, 2.0f, &found) == CAPEX_ERR_INVALID_ARG, "null out");
    CT_CHECK(strstr(capex_last_error(), "out is NULL") != NULL, "message: %.300s", capex_last_error());
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lc, 2.0f, &found) == CAPEX_ERR_SIZE_MISMATCH, "count mismatch");
    tb[1].numel = 3;
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lb, 2.0f, &found) == CAPEX_ERR_SIZE_MISMATCH, "numel mismatch");
    CT_CHECK(strstr(capex_last_error(), "[1]") != NULL, "message names the index: %.300s", capex_last_error());
    tb[1].numel = 4;
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lb, NAN, &found) == CAPEX_ERR_INVALID_ARG, "NaN scale");
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lb, INFINITY, &found) == CAPEX_ERR_INVALID_ARG, "inf scale");
    /* in place across dtypes would read halves as floats */
    th[0].data = a; th[1].data = a + 4;
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lh, 1.0f, &found) == CAPEX_ERR_INVALID_ARG, "cross-dtype alias");
    th[0].data = h; th[1].data = h + 4;
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lh, 1.0f, &found) == CAPEX_OK, "f32 -> f16 copy");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lb, &lb, -1, &found) == CAPEX_OK, "axpby valid");
    CT_CHECK(capex_multi_tensor_axpby(NULL, NAN, &la, 1.0f, &lb, &lb, -1, &found) == CAPEX_ERR_INVALID_ARG, "NaN a");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, -INFINITY, &lb, &lb, -1, &found) == CAPEX_ERR_INVALID_ARG, "inf b");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lb, &lb, 2, &found) == CAPEX_ERR_INVALID_ARG, "arg_to_check 2");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lc, &lb, -1, &found) == CAPEX_ERR_SIZE_MISMATCH, "y mismatch");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lb, &lc, -1, &found) == CAPEX_ERR_SIZE_MISMATCH, "out mismatch");
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lb, NULL, -1, &found) == CAPEX_ERR_INVALID_ARG, "null out");
    ta[1].data = (char *)a + 2;
    CT_CHECK(capex_multi_tensor_axpby(NULL, 1.0f, &la, 1.0f, &lb, &lb, -1, &found) == CAPEX_ERR_INVALID_ARG, "misaligned x");
    CT_CHECK(capex_multi_tensor_scale(NULL, &la, &lb, 1.0f, &found) == CAPEX_ERR_INVALID_ARG, "misaligned in");
    CT_CHECK(found == 0, "found_inf untouched by refused calls");
}

/* ======================================================================= */
/* bad input                                                               */
/* ======================================================================= */

CT_TEST(bad_input_lists) {
    float buf[8];
    unsigned char raw[64];
    capex_tensor t[2], t2[2];
    capex_tensor_list l, l2;
    float norm;
    int fi = 0;
    capex_tensor_op_desc desc;
    memset(buf, 0, sizeof buf);
    t[0].data = buf; t[0].numel = 4;
    t[1].data = buf + 4; t[1].numel = 4;
    l = capex_tensor_list_make(CAPEX_F32, t, 2);
    CT_CHECK(capex_tensor_list_check(&l) == CAPEX_OK && capex_tensor_list_numel(&l) == 8, "valid list");
    CT_CHECK(capex_tensor_list_check(NULL) == CAPEX_ERR_INVALID_ARG && capex_tensor_list_numel(NULL) == -1, "null list");
    CT_CHECK(capex_multi_tensor_l2norm(NULL, NULL, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "null list");
    CT_CHECK(strstr(capex_last_error(), "x is NULL") != NULL, "message: %.300s", capex_last_error());
    l.tensors = NULL;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "null tensors");
    l.count = 0;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_OK && norm == 0.0f, "empty list is fine");
    l = capex_tensor_list_make((capex_dtype)7, t, 2);
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "bad dtype");
    CT_CHECK(strstr(capex_last_error(), "dtype") != NULL, "message: %.300s", capex_last_error());
    l = capex_tensor_list_make(CAPEX_F32, t, 2);
    t[1].data = NULL;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "null data");
    t[1].numel = 0; /* NULL data with zero size: fine, skipped */
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_OK, "zero-size NULL ok: %.300s", capex_last_error());
    t[1].data = buf + 4; t[1].numel = -3;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "negative numel");
    /* misaligned: a float* 1 byte off, a half* 1 byte off */
    t[1].data = raw + 1; t[1].numel = 4;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned f32");
    CT_CHECK(strstr(capex_last_error(), "misaligned") != NULL, "message: %.300s", capex_last_error());
    l.dtype = CAPEX_F16;
    t[0].data = raw; t[1].data = raw + 3;
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "misaligned f16");
    t[1].data = raw + 2; /* 2-byte aligned is enough for f16 */
    CT_CHECK(capex_multi_tensor_l2norm(NULL, &l, &norm, NULL) == CAPEX_OK, "aligned f16: %.300s", capex_last_error());
    /* desc with negative values */
    capex_tensor_op_desc_init(&desc);
    desc.chunk_size = -1;
    CT_CHECK(capex_multi_tensor_l2norm(&desc, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "negative chunk size");
    capex_tensor_op_desc_init(&desc);
    desc.num_threads = -2;
    CT_CHECK(capex_multi_tensor_l2norm(&desc, &l, &norm, NULL) == CAPEX_ERR_INVALID_ARG, "negative threads");
    (void)t2; (void)l2; (void)fi;
}

static const ct_case cases[] = {
    CT_CASE(planner_metadata_fits_4k),
    CT_CASE(planner_exact_coverage_random),
    CT_CASE(planner_big_tensor_split_across_launches),
    CT_CASE(planner_more_tensors_than_one_launch),
    CT_CASE(planner_empty_and_bad_input),
    CT_CASE(l2norm_all_dtypes_vs_float64),
    CT_CASE(l2norm_accuracy_10M),
    CT_CASE(l2norm_same_bits_any_thread_count),
    CT_CASE(l2norm_many_tensors_across_launches),
    CT_CASE(l2norm_nonfinite_and_large),
    CT_CASE(scale_all_dtype_pairs),
    CT_CASE(scale_finds_inf_nan_everywhere),
    CT_CASE(scale_output_overflow_is_found),
    CT_CASE(scale_half_codecs_match_core),
    CT_CASE(axpby_all_dtype_triples),
    CT_CASE(axpby_arg_to_check),
    CT_CASE(clip_grad_norm_matches_pytorch_formula),
    CT_CASE(bad_input_lists),
    CT_CASE(clip_overflow_aliases_and_early_checks),
    CT_CASE(bad_input_ops),
    CT_CASE(clip_in_place_refuses_repeated_tensor),
    CT_CASE(partial_overlaps_refused),
};
CT_MAIN(cases)
