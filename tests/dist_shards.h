/* dist_shards.h - capex_comm_reduce_scatter / capex_comm_allgatherv checked
   against a float64 reference on any comm (single, TCP worlds in
   tests/test_dist.c, MPI in tests/mpi/test_dist_mpi.c). Every rank makes
   every rank's input from (seed, rank, index), so each can compute the
   reference alone. Uneven counts with zero shards (this rank's among them),
   every comm dtype, SUM and AVG, in place and not, Inf and NaN lanes.
   Include after capex.h. */
#ifndef DIST_SHARDS_H
#define DIST_SHARDS_H
/* 1: half sums round to the dtype after every addition (NCCL, and the
   stand-in NCCL), not once after an f32 sum (MPI, TCP): the tolerance then
   grows by one rounding of the partial sums per extra rank. */
#ifndef SHARDS_ROUND_EACH_ADD
#define SHARDS_ROUND_EACH_ADD 0
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t shards_mix(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank q's element i as the dtype's bits in *bits (8 bytes room) and its
   value in double. Values in [-4, 4) with varied magnitudes, exactly
   representable in the dtype; int64 covers the whole range (sums wrap). The
   last two elements of rank 0 are +Inf and NaN when `special`. */
static double shards_value(uint64_t seed, int q, size_t i, size_t total, capex_dtype t, int special, void *bits) {
    uint64_t u = shards_mix(seed ^ shards_mix(((uint64_t)q << 40) ^ (uint64_t)i));
    int ty = (int)t;
    float f = (float)((double)(u >> 11) * (1.0 / 9007199254740992.0) * 8.0 - 4.0);
    if ((u & 7) == 0) f *= 1e-3f;
    if (special && q == 0 && total >= 2 && i == total - 2) f = INFINITY;
    if (special && q == 0 && total >= 2 && i == total - 1) f = NAN;
    if (ty == 4) { memcpy(bits, &u, 8); return 0.0; }
    if (ty == 3) {
        double d = (double)f + (double)(u & 0xffff) * 1e-12; /* bits below f32's */
        if (!isfinite(f)) d = f;
        memcpy(bits, &d, 8);
        return d;
    }
    if (ty == 0) { memcpy(bits, &f, 4); return f; }
    {
        uint16_t h = ty == 1 ? capex_f32_to_f16(f) : capex_f32_to_bf16(f);
        memcpy(bits, &h, 2);
        return ty == 1 ? capex_f16_to_f32(h) : capex_bf16_to_f32(h);
    }
}

static double shards_get(const void *buf, size_t i, capex_dtype t) {
    int ty = (int)t;
    if (ty == 3) { double d; memcpy(&d, (const char *)buf + i * 8, 8); return d; }
    if (ty == 0) { float f; memcpy(&f, (const char *)buf + i * 4, 4); return f; }
    {
        uint16_t h;
        memcpy(&h, (const char *)buf + i * 2, 2);
        return ty == 1 ? capex_f16_to_f32(h) : capex_bf16_to_f32(h);
    }
}

/* One reduce-scatter and one allgatherv; 0 or a line number, why filled. */
static int shards_case(capex_comm *c, uint64_t seed, const size_t *counts, capex_dtype t, capex_reduce_op op, int in_place,
                       char *why, size_t why_n) {
    int W = c->world_size, me = c->rank, q, fail = 0;
    size_t es = capex_comm_dtype_size(t), total = 0, displ = 0, i;
    unsigned char *send, *recv, *all, bits[8];
    capex_result r;
    for (q = 0; q < W; q++) { if (q == me) displ = total; total += counts[q]; }
    send = (unsigned char *)malloc(total * es + 8);
    recv = (unsigned char *)malloc(counts[me] * es + 8);
    all = (unsigned char *)malloc(total * es + 8);
    for (i = 0; i < total; i++) { shards_value(seed, me, i, total, t, 1, bits); memcpy(send + i * es, bits, es); }
    /* reduce-scatter */
    r = capex_comm_reduce_scatter(c, send, in_place ? send + displ * es : recv, counts, t, op);
    if (r != CAPEX_OK) { snprintf(why, why_n, "reduce_scatter: %.300s", capex_last_error()); fail = __LINE__; goto out; }
    {
        const unsigned char *res = in_place ? send + displ * es : recv;
        for (i = 0; i < counts[me] && !fail; i++) {
            size_t j = displ + i;
            if ((int)t == 4) {
                uint64_t want = 0, got;
                for (q = 0; q < W; q++) { uint64_t v; shards_value(seed, q, j, total, t, 1, &v); want += v; }
                memcpy(&got, res + i * 8, 8);
                if (got != want) { snprintf(why, why_n, "int64 element %zu: %llx != %llx", j, (unsigned long long)got,
                                            (unsigned long long)want); fail = __LINE__; }
            } else {
                double ref = 0.0, mag = 0.0, got = shards_get(res, i, t), tol;
                for (q = 0; q < W; q++) { double v = shards_value(seed, q, j, total, t, 1, bits); ref += v; mag += fabs(v); }
                if (op == CAPEX_REDUCE_AVG) { ref /= W; mag /= W; }
                /* f32 sums in any order (W roundings), then one rounding to the dtype */
                tol = (int)t == 3 ? 4e-16 * mag * W : 1.2e-7 * mag * (W + 1);
                if ((int)t == 1) tol += fabs(ref) * (1.0 / 2048.0) + 6e-8;
                if ((int)t == 2) tol += fabs(ref) * (1.0 / 256.0) + 1e-38;
                if (SHARDS_ROUND_EACH_ADD && ((int)t == 1 || (int)t == 2)) tol += (W - 1) * mag / ((int)t == 1 ? 2048.0 : 256.0);
                if (isnan(ref) ? !isnan(got) : isinf(ref) ? got != ref : !(fabs(got - ref) <= tol)) {
                    snprintf(why, why_n, "dtype %d op %d element %zu (slice %zu of rank %d): %.9g, float64 reference %.9g",
                             (int)t, (int)op, j, i, me, got, ref);
                    fail = __LINE__;
                }
            }
        }
    }
    if (fail) goto out;
    /* allgatherv: bits, every rank's shard at its displacement */
    for (i = 0; i < counts[me]; i++) {
        shards_value(seed + 1, me, displ + i, total, t, 1, bits);
        memcpy((in_place ? all + displ * es : send) + i * es, bits, es);
    }
    if (in_place) { /* garbage around this rank's shard */
        memset(all, 0xab, displ * es);
        memset(all + (displ + counts[me]) * es, 0xab, (total - displ - counts[me]) * es);
    } else {
        memset(all, 0xab, total * es);
    }
    r = capex_comm_allgatherv(c, in_place ? all + displ * es : send, all, counts, t);
    if (r != CAPEX_OK) { snprintf(why, why_n, "allgatherv: %.300s", capex_last_error()); fail = __LINE__; goto out; }
    for (i = 0; i < total && !fail; i++) {
        size_t acc = 0;
        for (q = 0; q < W && acc + counts[q] <= i; q++) acc += counts[q];
        shards_value(seed + 1, q, i, total, t, 1, bits);
        if (memcmp(all + i * es, bits, es) != 0) {
            snprintf(why, why_n, "allgatherv dtype %d element %zu (rank %d's): bits differ", (int)t, i, q);
            fail = __LINE__;
        }
    }
out:
    free(send);
    free(recv);
    free(all);
    return fail;
}

/* Count patterns x dtypes x ops x in-place; every rank must call it alike. */
static int shards_check_all(capex_comm *c, uint64_t seed, char *why, size_t why_n) {
    static const capex_dtype types[5] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16, CAPEX_F64, CAPEX_I64};
    int W = c->world_size, pat, k, op, ip, q, line;
    size_t counts[64];
    if (W > 64) { snprintf(why, why_n, "world %d > 64", W); return __LINE__; }
    for (pat = 0; pat < 6; pat++) {
        for (q = 0; q < W; q++) {
            uint64_t u = shards_mix(seed + (uint64_t)(pat * 131 + q));
            switch (pat) {
            case 0: counts[q] = (size_t)(u % 40); break;                  /* uneven, small             */
            case 1: counts[q] = q % 2 ? 0 : (size_t)(1 + u % 9); break;   /* odd ranks hold nothing     */
            case 2: counts[q] = q == W - 1 ? 3 : 0; break;               /* one shard only             */
            case 3: counts[q] = (size_t)(1000 + u % 3000); break;         /* larger, still uneven       */
            case 4: counts[q] = q == 0 ? 0 : (size_t)(5 + u % 17); break; /* rank 0 holds nothing      */
            default: counts[q] = q == 1 ? 0 : (size_t)(150000 + u % 50000); break; /* past the TCP ring's 256 KiB */
            }
        }
        for (k = 0; k < 5; k++)
            for (op = 0; op < 2; op++) {
                if (op == 1 && (int)types[k] == 4) continue;
                for (ip = 0; ip < 2; ip++)
                    if ((line = shards_case(c, seed + (uint64_t)(pat * 1000 + k * 10 + op * 2 + ip), counts, types[k],
                                            (capex_reduce_op)op, ip, why, why_n)) != 0)
                        return line;
            }
    }
    return 0;
}

/* Allreduce of n elements (every dtype, SUM and AVG) against float64, and
   the same bits on every rank (an FNV hash of the result, allgathered). */
static int shards_allreduce_check(capex_comm *c, uint64_t seed, size_t n, char *why, size_t why_n) {
    static const capex_dtype types[5] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16, CAPEX_F64, CAPEX_I64};
    int W = c->world_size, me = c->rank, k, op, q, fail = 0;
    unsigned char *x = (unsigned char *)malloc(n * 8 + 8), bits[8];
    uint64_t *hashes = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)W);
    for (k = 0; k < 5 && !fail; k++)
        for (op = 0; op < 2 && !fail; op++) {
            capex_dtype t = types[k];
            size_t es = capex_comm_dtype_size(t), i;
            uint64_t h = 1469598103934665603ull;
            if (op == 1 && (int)t == 4) continue;
            for (i = 0; i < n; i++) { shards_value(seed + (uint64_t)k, me, i, n, t, 1, bits); memcpy(x + i * es, bits, es); }
            if (capex_comm_allreduce(c, x, x, n, t, (capex_reduce_op)op) != CAPEX_OK) {
                snprintf(why, why_n, "allreduce: %.300s", capex_last_error());
                fail = __LINE__;
                break;
            }
            for (i = 0; i < n * es; i++) h = (h ^ x[i]) * 1099511628211ull;
            if (capex_comm_allgather(c, &h, hashes, 1, CAPEX_I64) != CAPEX_OK) { fail = __LINE__; break; }
            for (q = 0; q < W; q++)
                if (hashes[q] != h) { snprintf(why, why_n, "allreduce dtype %d op %d: rank %d's bits differ from rank %d's",
                                               (int)t, op, q, me); fail = __LINE__; }
            for (i = 0; i < n && !fail; i++) {
                if ((int)t == 4) {
                    uint64_t want = 0, got, v;
                    for (q = 0; q < W; q++) { shards_value(seed + (uint64_t)k, q, i, n, t, 1, &v); want += v; }
                    memcpy(&got, x + i * 8, 8);
                    if (got != want) { snprintf(why, why_n, "allreduce int64 element %zu", i); fail = __LINE__; }
                } else {
                    double ref = 0.0, mag = 0.0, got = shards_get(x, i, t), tol;
                    for (q = 0; q < W; q++) { double v = shards_value(seed + (uint64_t)k, q, i, n, t, 1, bits); ref += v; mag += fabs(v); }
                    if (op == 1) { ref /= W; mag /= W; }
                    tol = (int)t == 3 ? 4e-16 * mag * W : 1.2e-7 * mag * (W + 1);
                    if ((int)t == 1) tol += fabs(ref) * (1.0 / 2048.0) + 6e-8;
                    if ((int)t == 2) tol += fabs(ref) * (1.0 / 256.0) + 1e-38;
                    if (SHARDS_ROUND_EACH_ADD && ((int)t == 1 || (int)t == 2)) tol += (W - 1) * mag / ((int)t == 1 ? 2048.0 : 256.0);
                    if (isnan(ref) ? !isnan(got) : isinf(ref) ? got != ref : !(fabs(got - ref) <= tol)) {
                        snprintf(why, why_n, "allreduce dtype %d op %d element %zu: %.9g, float64 reference %.9g", (int)t, op,
                                 i, got, ref);
                        fail = __LINE__;
                    }
                }
            }
        }
    free(x);
    free(hashes);
    return fail;
}
#endif
