/* Learning-rate schedules: torch golden values (tests/gen_lr_golden.py), an
   independent float64 reference on random settings (edge steps included),
   bad input, the optimizer driven by a schedule (same bits as setting the lr
   by hand each step; skipped steps do not advance it) and resume through a
   state file. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include "data/lr_golden.h"
#include <math.h>

static void from_golden(const capex_lr_golden *g, capex_lr_schedule *s) {
    int k;
    capex_lr_schedule_init(s, (capex_lr_kind)g->kind);
    s->warmup_steps = g->warmup;
    s->total_steps = g->total;
    s->step_size = g->step_size;
    s->warmup_start_factor = g->start_factor;
    s->min_factor = g->min_factor;
    s->power = g->power;
    s->gamma = g->gamma;
    s->num_milestones = g->nmil;
    for (k = 0; k < g->nmil; k++) s->milestones[k] = g->mil[k];
    s->pct_start = g->pct_start;
    s->div_factor = g->div_factor;
    s->final_div_factor = g->final_div;
    s->anneal_linear = g->anneal_linear;
    s->three_phase = g->three_phase;
}

static double rel(double a, double b) {
    double d = fabs(a - b), m = fabs(b) > fabs(a) ? fabs(b) : fabs(a);
    return m == 0.0 ? d : d / m;
}

/* Torch's closed forms to ~1 ulp (same operations, same libm); its chained
   step() values within 1e-9 relative (they drift by rounding per step). */
CT_TEST(torch_golden) {
    size_t c;
    double worst_closed = 0.0, worst_stepped = 0.0;
    int exact = 0, total = 0;
    for (c = 0; c < sizeof capex_lr_goldens / sizeof capex_lr_goldens[0]; c++) {
        const capex_lr_golden *g = &capex_lr_goldens[c];
        capex_lr_schedule s;
        int i;
        from_golden(g, &s);
        CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "%s: %s", g->name, capex_last_error());
        for (i = 0; i < g->n; i++) {
            double v = capex_lr_at(&s, g->base, i), e1 = rel(v, g->closed[i]), e2 = rel(v, g->stepped[i]);
            CT_CHECK(e1 <= 1e-12, "%s step %d: %.17g, torch closed form %.17g (rel %.3g)", g->name, i, v, g->closed[i],
                     e1);
            CT_CHECK(e2 <= 1e-9, "%s step %d: %.17g, torch step() %.17g (rel %.3g)", g->name, i, v, g->stepped[i], e2);
            exact += v == g->closed[i];
            total++;
            if (e1 > worst_closed) worst_closed = e1;
            if (e2 > worst_stepped) worst_stepped = e2;
        }
    }
#ifdef __GLIBC__
    /* glibc's cos and pow (Python's math here too) round correctly: every
       value is torch's bit for bit, so an operation-order slip shows */
    CT_CHECK(exact == total, "only %d of %d values bit-equal to torch's closed forms", exact, total);
#endif
    if (getenv("CT_VERBOSE"))
        printf("lr golden: %d of %d values bit-equal to torch's closed form; worst rel %.3g (closed), %.3g (step())\n",
               exact, total, worst_closed, worst_stepped);
}

/* ---- an independent float64 reference (written from the definitions, not
   in torch's operation order: cosine as cos^2, warmup as a lerp) ---- */
static double ref_lr(const capex_lr_schedule *s, double base, int64_t step) {
    const double pi = 3.14159265358979323846;
    int64_t W = s->kind == CAPEX_LR_ONECYCLE ? 0 : s->warmup_steps, t, T;
    double x, eta = base * s->min_factor;
    if (s->kind == CAPEX_LR_ONECYCLE) {
        double lo = base / s->div_factor, mn = lo / s->final_div_factor, e1, e2, e3 = (double)(s->total_steps - 1);
        double a, b, f;
        int64_t st = step > s->total_steps - 1 ? s->total_steps - 1 : step;
        x = (double)st;
        e1 = s->pct_start * (double)s->total_steps - 1.0;
        e2 = 2.0 * s->pct_start * (double)s->total_steps - 2.0;
        if (x <= e1) { a = lo; b = base; f = x / e1; }
        else if (s->three_phase && x <= e2) { a = base; b = lo; f = (x - e1) / (e2 - e1); }
        else if (s->three_phase) { a = lo; b = mn; f = (x - e2) / (e3 - e2); }
        else { a = base; b = mn; f = (x - e1) / (e3 - e1); }
        if (s->anneal_linear) return a + (b - a) * f;
        return b + (a - b) * cos(pi * f / 2.0) * cos(pi * f / 2.0); /* (1+cos x)/2 = cos^2(x/2) */
    }
    if (step < W && s->warmup_llmc) return base * ((double)(step + 1) / (double)W);
    if (step < W) {
        double f = (double)step / (double)W;
        return base * ((1.0 - f) * s->warmup_start_factor + f);
    }
    t = step - W;
    T = s->total_steps - W;
    switch (s->kind) {
    case CAPEX_LR_COSINE:
        if (t > T) t = T;
        x = cos(pi * (double)t / (2.0 * (double)T));
        return eta + (base - eta) * x * x;
    case CAPEX_LR_LINEAR:
        if (t > T) t = T;
        return base * (1.0 + (s->min_factor - 1.0) * ((double)t / (double)T));
    case CAPEX_LR_POLYNOMIAL:
        if (t > T) t = T;
        return eta + (base - eta) * exp(s->power * log1p(-(double)t / (double)T));
    case CAPEX_LR_STEP: {
        double n = (double)(t / s->step_size);
        return base * exp(n * log(s->gamma));
    }
    case CAPEX_LR_MULTISTEP: {
        int k;
        x = base;
        for (k = 0; k < s->num_milestones; k++)
            if (s->milestones[k] <= t) x *= s->gamma;
        return x;
    }
    case CAPEX_LR_EXPONENTIAL:
        return base * exp((double)t * log(s->gamma));
    default:
        return base;
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnd01(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static void random_schedule(capex_lr_schedule *s) {
    capex_lr_kind kind = (capex_lr_kind)(rnd() % 8);
    int k;
    capex_lr_schedule_init(s, kind);
    if (kind != CAPEX_LR_ONECYCLE) {
        s->warmup_steps = rnd() % 3 == 0 ? 0 : (int64_t)(rnd() % 200);
        s->warmup_start_factor = rnd() % 4 == 0 ? 0.0 : rnd01();
    }
    s->total_steps = s->warmup_steps + 1 + (int64_t)(rnd() % 5000);
    s->min_factor = rnd() % 3 == 0 ? 0.0 : rnd01() * 0.5;
    s->power = rnd01() * 3.0;
    s->step_size = 1 + (int64_t)(rnd() % 300);
    s->warmup_llmc = kind != CAPEX_LR_ONECYCLE && s->step_size % 4 == 0; /* from a draw: the stream stays as it was */
    s->gamma = 0.5 + 0.5 * rnd01();
    if (kind == CAPEX_LR_EXPONENTIAL) s->gamma = 0.99 + 0.01 * rnd01();
    s->num_milestones = (int)(rnd() % (CAPEX_LR_MAX_MILESTONES + 1));
    for (k = 0; k < s->num_milestones; k++)
        s->milestones[k] = (k ? s->milestones[k - 1] : 0) + (int64_t)(rnd() % 400);
    if (kind == CAPEX_LR_ONECYCLE) {
        s->total_steps = 10 + (int64_t)(rnd() % 5000);
        s->pct_start = 0.05 + 0.4 * rnd01();
        s->div_factor = 1.0 + 50.0 * rnd01();
        s->final_div_factor = 1.0 + 1e4 * rnd01();
        s->anneal_linear = (int)(rnd() & 1);
        s->three_phase = (int)(rnd() & 1);
    }
}

CT_TEST(float64_reference_random) {
    int c, i;
    double worst = 0.0;
    for (c = 0; c < 3000; c++) {
        capex_lr_schedule s;
        double base = 1e-5 + rnd01();
        int64_t edges[12], W, N;
        random_schedule(&s);
        CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "case %d kind %d: %s", c, (int)s.kind, capex_last_error());
        W = s.kind == CAPEX_LR_ONECYCLE ? 0 : s.warmup_steps;
        N = s.total_steps;
        /* first step, warmup's last and the decay's first, the end, past it */
        edges[0] = 0; edges[1] = W > 0 ? W - 1 : 0; edges[2] = W; edges[3] = W + 1; edges[4] = N > 0 ? N - 1 : 0;
        edges[5] = N; edges[6] = N + 1; edges[7] = N + 1000; edges[8] = (int64_t)(rnd() % (uint64_t)(N + 1));
        edges[9] = (int64_t)(rnd() % (uint64_t)(N + 1)); edges[10] = (int64_t)(rnd() % (uint64_t)(N + 1));
        edges[11] = s.kind == CAPEX_LR_EXPONENTIAL ? N : CAPEX_STEP_MAX; /* gamma^huge underflows: fine, not here */
        for (i = 0; i < 12; i++) {
            double v = capex_lr_at(&s, base, edges[i]), r = ref_lr(&s, base, edges[i]);
            double tol = s.kind == CAPEX_LR_EXPONENTIAL || s.kind == CAPEX_LR_POLYNOMIAL || s.kind == CAPEX_LR_STEP ? 1e-10
                                                                                                        : 1e-12;
            /* cosine near its floor: absolute error relative to the base lr */
            double err = fabs(v - r) / base;
            CT_CHECK(v == v && v >= 0.0, "case %d kind %d step %lld: %g", c, (int)s.kind, (long long)edges[i], v);
            CT_CHECK(err <= tol, "case %d kind %d (W %lld N %lld) step %lld: %.17g, reference %.17g", c, (int)s.kind,
                     (long long)W, (long long)N, (long long)edges[i], v, r);
            if (err > worst) worst = err;
        }
    }
    if (getenv("CT_VERBOSE")) printf("lr float64 reference: worst |lr - ref| / base %.3g\n", worst);
}

/* Edge values written out: warmup from 0, warmup end, floors, one-cycle's
   phase boundaries (2-phase: step pct*N-1 is the peak, N-1 the minimum). */
CT_TEST(edges) {
    capex_lr_schedule s;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    s.warmup_steps = 10; s.warmup_start_factor = 0.0; s.total_steps = 110; s.min_factor = 0.1;
    CT_CHECK(capex_lr_at(&s, 2.0, 0) == 0.0, "warmup from 0: %g", capex_lr_at(&s, 2.0, 0));
    CT_CHECK(capex_lr_at(&s, 2.0, 5) == 1.0, "half-way: %g", capex_lr_at(&s, 2.0, 5));
    CT_CHECK(capex_lr_at(&s, 2.0, 10) == 2.0, "decay starts at base: %g", capex_lr_at(&s, 2.0, 10));
    CT_CHECK(fabs(capex_lr_at(&s, 2.0, 60) - 1.1) < 1e-15, "cosine mid: %.17g", capex_lr_at(&s, 2.0, 60));
    CT_CHECK(capex_lr_at(&s, 2.0, 110) == 0.2 && capex_lr_at(&s, 2.0, 1000000) == 0.2, "floor held: %.17g",
             capex_lr_at(&s, 2.0, 1000000));
    s.warmup_steps = 0;
    CT_CHECK(capex_lr_at(&s, 2.0, 0) == 2.0, "no warmup: %g", capex_lr_at(&s, 2.0, 0));
    capex_lr_schedule_init(&s, CAPEX_LR_CONSTANT);
    CT_CHECK(capex_lr_at(&s, 0.5, 0) == 0.5 && capex_lr_at(&s, 0.5, CAPEX_STEP_MAX) == 0.5, "constant");
    capex_lr_schedule_init(&s, CAPEX_LR_POLYNOMIAL);
    s.total_steps = 4; s.power = 0.0;
    CT_CHECK(capex_lr_at(&s, 1.0, 4) == 1.0, "power 0: x^0 = 1 even at x = 0 (torch: 0.0**0 == 1)");
    capex_lr_schedule_init(&s, CAPEX_LR_MULTISTEP);
    s.num_milestones = 3; s.milestones[0] = 0; s.milestones[1] = 5; s.milestones[2] = 5; s.gamma = 0.5;
    CT_CHECK(capex_lr_at(&s, 1.0, 0) == 0.5 && capex_lr_at(&s, 1.0, 4) == 0.5 && capex_lr_at(&s, 1.0, 5) == 0.125,
             "milestones at 0 and a repeated one (bisect_right)");
    s.num_milestones = 0;
    CT_CHECK(capex_lr_at(&s, 1.0, 100) == 1.0, "no milestones: constant");
    capex_lr_schedule_init(&s, CAPEX_LR_ONECYCLE);
    s.total_steps = 101; s.pct_start = 0.5; s.div_factor = 10.0; s.final_div_factor = 100.0; /* peak at step 49.5 */
    /* torch's anneal: 1 + (0.1 - 1)/2 * 2 = 0.09999999999999998, not 0.1 */
    CT_CHECK(fabs(capex_lr_at(&s, 1.0, 0) - 0.1) < 1e-16, "one-cycle starts at base/div: %.17g", capex_lr_at(&s, 1.0, 0));
    CT_CHECK(fabs(capex_lr_at(&s, 1.0, 100) - 1e-3) < 1e-18 && capex_lr_at(&s, 1.0, 100) == capex_lr_at(&s, 1.0, 5000),
             "one-cycle ends at base/div/final_div and holds: %.17g", capex_lr_at(&s, 1.0, 100));
    s.total_steps = 100; s.anneal_linear = 1;
    CT_CHECK(capex_lr_at(&s, 1.0, 49) == 1.0, "one-cycle peak at pct*N-1: %.17g", capex_lr_at(&s, 1.0, 49));
    s.three_phase = 1; /* phases end at 49, 98, 99 */
    CT_CHECK(fabs(capex_lr_at(&s, 1.0, 98) - 0.1) < 1e-16 && fabs(capex_lr_at(&s, 1.0, 99) - 1e-3) < 1e-18,
             "three-phase: back to base/div at 2*pct*N-2, then the minimum");
    CT_CHECK(capex_lr_scale_linear(0.1, 8192, 256) == 3.2 && capex_lr_scale_linear(0.1, 256, 256) == 0.1,
             "linear scaling rule");
}

CT_TEST(bad_input) {
    capex_lr_schedule s;
    double v;
    memset(&s, 0, sizeof s);
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "capex_lr_schedule_init"),
             "zeroed schedule: %s", capex_last_error());
    v = capex_lr_at(&s, 1.0, 0);
    CT_CHECK(v != v, "a zeroed schedule gives NaN");
    CT_CHECK(capex_lr_schedule_check(NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "total_steps"),
             "cosine without total_steps: %s", capex_last_error());
    s.total_steps = 10; s.warmup_steps = 10;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_CONFIG, "total == warmup");
    s.warmup_steps = 2; s.min_factor = 1.5;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "min_factor"), "min");
    s.min_factor = 0.0; s.warmup_start_factor = NAN;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG, "NaN warmup_start_factor");
    s.warmup_start_factor = 0.5; s.warmup_steps = -1;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG, "negative warmup");
    s.warmup_steps = 0;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "fixed: %s", capex_last_error());
    v = capex_lr_at(&s, 1.0, -1);
    CT_CHECK(v != v && strstr(capex_last_error(), "step"), "negative step: %s", capex_last_error());
    v = capex_lr_at(&s, -1.0, 0);
    CT_CHECK(v != v && strstr(capex_last_error(), "base_lr"), "negative base: %s", capex_last_error());
    v = capex_lr_at(&s, INFINITY, 0);
    CT_CHECK(v != v, "infinite base");
    s.kind = (capex_lr_kind)99;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "kind"), "kind");
    capex_lr_schedule_init(&s, CAPEX_LR_STEP);
    s.step_size = 0;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "step_size"), "step");
    capex_lr_schedule_init(&s, CAPEX_LR_EXPONENTIAL);
    s.gamma = INFINITY;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "gamma"), "gamma");
    capex_lr_schedule_init(&s, CAPEX_LR_MULTISTEP);
    s.num_milestones = 2; s.milestones[0] = 5; s.milestones[1] = 4;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "non-decreasing"),
             "decreasing milestones: %s", capex_last_error());
    s.num_milestones = CAPEX_LR_MAX_MILESTONES + 1;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG, "too many milestones");
    capex_lr_schedule_init(&s, CAPEX_LR_ONECYCLE);
    s.total_steps = 100; s.warmup_steps = 5;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "warmup"), "1cycle warmup");
    s.warmup_steps = 0; s.total_steps = 10; s.pct_start = 0.1; /* phase 1 ends at step 0: torch divides by 0 */
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "zero"), "zero phase: %s",
             capex_last_error());
    s.pct_start = 0.3; s.div_factor = 0.0;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG, "div_factor 0");
    s.div_factor = 25.0; s.pct_start = 1.5;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "pct_start"), "pct_start");
    s.pct_start = NAN;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "pct_start"), "NaN pct_start");
    s.pct_start = 0.3; s.total_steps = 0; /* torch: total_steps must be > 0 */
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "total_steps > 0"), "1cycle total 0");
    s.total_steps = 100; s.final_div_factor = -1.0;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG, "final_div_factor < 0");
    s.final_div_factor = 1e4;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "1cycle fixed: %s", capex_last_error());
    s.total_steps = -1;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "total_steps"), "total < 0");
    s.total_steps = (INT64_C(1) << 53) + 1;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "2^53"), "total > 2^53");
    capex_lr_schedule_init(&s, CAPEX_LR_POLYNOMIAL);
    s.total_steps = 10; s.power = -1.0;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "power"), "power < 0");
    s.power = INFINITY;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "power"), "power inf");
    s.power = 0.0; /* torch allows it (the lr stays at base) */
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "power 0: %s", capex_last_error());
    v = capex_lr_scale_linear(0.1, 0, 256);
    CT_CHECK(v != v && strstr(capex_last_error(), "batch"), "batch 0: %s", capex_last_error());
    /* the base lr is checked as capex_lr_at checks it (was passed through: -0.2, NaN with no error) */
    v = capex_lr_scale_linear(-0.1, 512, 256);
    CT_CHECK(v != v && strstr(capex_last_error(), "base_lr"), "negative base_lr: %g, %s", v, capex_last_error());
    v = capex_lr_scale_linear(NAN, 512, 256);
    CT_CHECK(v != v && strstr(capex_last_error(), "base_lr"), "NaN base_lr: %s", capex_last_error());
    v = capex_lr_scale_linear(1e300, INT64_MAX, 1);
    CT_CHECK(v != v && strstr(capex_last_error(), "overflow"), "scaled lr overflows: %g, %s", v, capex_last_error());
}

/* ---- on the optimizer ---- */
#define NP 37
typedef struct run {
    capex_optim *opt;
    float p[2][NP], g[2][NP], m[2][NP], v[2][NP];
} run;

/* extra: SGD momentum; 2 also turns Adam's amsgrad on. Adagrad runs with lr_decay. */
static capex_result make_run(run *r, capex_optim_kind kind, int extra) {
    capex_optim_desc d;
    capex_optim_param ps[2];
    capex_optim_hparams hp;
    capex_result res;
    int i, k;
    memset(r, 0, sizeof *r);
    for (k = 0; k < 2; k++)
        for (i = 0; i < NP; i++) r->p[k][i] = (float)((i * 37 + k * 11) % 17) / 17.0f - 0.5f;
    capex_optim_desc_init(&d, kind);
    d.defaults.lr = 0.01f;
    if (kind == CAPEX_OPTIM_SGD && extra) d.defaults.momentum = 0.9f;
    if (kind == CAPEX_OPTIM_ADAM && extra == 2) d.defaults.amsgrad = 1;
    if (kind == CAPEX_OPTIM_ADAGRAD) d.defaults.lr_decay = 0.05f;
    if ((res = capex_optim_create(&d, &r->opt)) != CAPEX_OK) return res;
    for (k = 0; k < 2; k++) {
        capex_optim_param_init(&ps[k]);
        ps[k].param = r->p[k]; ps[k].grad = r->g[k]; ps[k].numel = NP;
        ps[k].exp_avg = r->m[k]; ps[k].exp_avg_sq = kind == CAPEX_OPTIM_NOVOGRAD ? NULL : r->v[k];
    }
    if ((res = capex_optim_add_group(r->opt, NULL, &ps[0], 1, NULL)) != CAPEX_OK) return res;
    hp = d.defaults;
    hp.lr = 0.003f; /* a second group with its own base lr */
    return capex_optim_add_group(r->opt, &hp, &ps[1], 1, NULL);
}

static void fill_grads(run *r, int step) {
    int i, k;
    for (k = 0; k < 2; k++)
        for (i = 0; i < NP; i++) r->g[k][i] = (float)sin(0.37 * i + 1.3 * step + k) * (k ? 0.5f : 2.0f);
}

static void sched_for_test(capex_lr_schedule *s) {
    capex_lr_schedule_init(s, CAPEX_LR_COSINE);
    s->warmup_steps = 4;
    s->warmup_start_factor = 0.1;
    s->total_steps = 20;
    s->min_factor = 0.05;
}

/* A scheduled optimizer takes the same steps, bit for bit, as one whose lr is
   set by hand to (float)capex_lr_at(base, step) before each step: Adam,
   LAMB (its trust ratio scales with lr), SGD with momentum, NovoGrad, Adagrad
   (lr_decay applies to the scheduled lr) and Adam amsgrad. A skipped step
   (found_inf) does not move the schedule; with count_skipped it does (the
   iteration count, every step call). */
CT_TEST(optimizer_follows_schedule) {
    static const capex_optim_kind kinds[6] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD, CAPEX_OPTIM_NOVOGRAD,
                                              CAPEX_OPTIM_ADAGRAD, CAPEX_OPTIM_ADAM};
    static run a, b;
    capex_lr_schedule s;
    int kk, step;
    sched_for_test(&s);
    for (kk = 0; kk < 12; kk++) {
        int64_t n = 0, it = -1;
        int extra = kk % 6 == 5 ? 2 : 1; /* the second Adam: amsgrad */
        s.count_skipped = kk >= 6;
        CT_CHECK(make_run(&a, kinds[kk % 6], extra) == CAPEX_OK && make_run(&b, kinds[kk % 6], extra) == CAPEX_OK, "%s",
                 capex_last_error());
        CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
        for (step = 0; step < 30; step++) {
            int skip = step == 6 || step == 7, k;
            for (k = 0; k < 2; k++) {
                float lr_a, want = (float)capex_lr_at(&s, k ? (double)0.003f : (double)0.01f, n);
                CT_CHECK(capex_optim_get_lr(a.opt, (size_t)k, &lr_a) == CAPEX_OK && lr_a == want,
                         "kind %d step %d group %d: get_lr %.9g, want %.9g", (int)kinds[kk % 6], step, k, lr_a, want);
                CT_CHECK(capex_optim_set_lr(b.opt, (size_t)k, want) == CAPEX_OK, "%s", capex_last_error());
            }
            fill_grads(&a, step);
            fill_grads(&b, step);
            CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, skip) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(capex_optim_step(b.opt, 1.0f, 1.0f, skip) == CAPEX_OK, "%s", capex_last_error());
            n += !skip || s.count_skipped;
            CT_CHECK(memcmp(a.p, b.p, sizeof a.p) == 0, "kind %d count_skipped %d step %d: weights differ from the "
                     "hand-set lr", (int)kinds[kk % 6], s.count_skipped, step);
        }
        CT_CHECK(capex_optim_get_lr_iteration(a.opt, &it) == CAPEX_OK && it == 30, "every step call counts: %lld",
                 (long long)it);
        {
            int64_t st = -1;
            capex_optim_hparams hp;
            CT_CHECK(capex_optim_get_step(a.opt, 0, &st) == CAPEX_OK && st == 28, "skipped steps do not count: %lld",
                     (long long)st);
            CT_CHECK(capex_optim_get_hparams(a.opt, 1, &hp) == CAPEX_OK && hp.lr == 0.003f, "hp.lr stays the base");
        }
        capex_optim_destroy(a.opt);
        capex_optim_destroy(b.opt);
    }
}

/* Plain SGD from p = 0 with g = 1 writes -lr: each step's lr exactly. */
CT_TEST(optimizer_lr_values) {
    static run a;
    capex_lr_schedule s, got;
    int step, i, k, att = -1;
    capex_lr_schedule_init(&s, CAPEX_LR_ONECYCLE);
    s.total_steps = 25;
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_schedule(a.opt, &got, &att) == CAPEX_OK && att == 0, "none attached yet");
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_schedule(a.opt, &got, &att) == CAPEX_OK && att == 1 && got.total_steps == 25, "get");
    for (step = 0; step < 30; step++) {
        for (k = 0; k < 2; k++)
            for (i = 0; i < NP; i++) { a.p[k][i] = 0.0f; a.g[k][i] = 1.0f; }
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
        for (k = 0; k < 2; k++) {
            float want = -(float)capex_lr_at(&s, k ? (double)0.003f : (double)0.01f, step);
            CT_CHECK(a.p[k][0] == want && a.p[k][NP - 1] == want, "step %d group %d: %.9g, want %.9g", step, k,
                     a.p[k][0], want);
        }
    }
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, NULL) == CAPEX_OK, "detach");
    for (i = 0; i < NP; i++) a.p[0][i] = 0.0f;
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK && a.p[0][0] == -0.01f, "detached: base lr again");
    memset(&s, 0, sizeof s);
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "capex_lr_schedule_init"), "zeroed schedule refused: %s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_schedule(a.opt, &got, &att) == CAPEX_OK && att == 0, "a refused one is not attached");
    capex_optim_destroy(a.opt);
}

/* A schedule whose lr overflows (ExponentialLR with gamma > 1 run long, or
   OneCycleLR with tiny div factors) gives NaN and an error from capex_lr_at,
   and the optimizer refuses the step that would use a non-finite float lr
   (was: inf/NaN weights, CAPEX_OK). */
CT_TEST(overflowing_lr_is_refused) {
    static run a;
    capex_lr_schedule s;
    int step, i, k;
    int64_t n = -1;
    double v;
    float lr = 0.0f;
    capex_lr_schedule_init(&s, CAPEX_LR_EXPONENTIAL);
    s.gamma = 1e10;
    CT_CHECK(capex_lr_at(&s, 0.01, 5) == 0.01 * pow(1e10, 5.0), "1e48 is a finite double");
    v = capex_lr_at(&s, 0.01, 40);
    CT_CHECK(v != v && strstr(capex_last_error(), "overflow"), "0.01 * 1e400: %g, %s", v, capex_last_error());
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 6; step++) {
        capex_result r;
        for (k = 0; k < 2; k++)
            for (i = 0; i < NP; i++) { a.p[k][i] = 0.0f; a.g[k][i] = 1.0f; }
        if (step < 5)
            CT_CHECK(capex_optim_get_lr(a.opt, 0, &lr) == CAPEX_OK && lr == (float)capex_lr_at(&s, (double)0.01f, step),
                     "get_lr at step %d: %g", step, lr);
        r = capex_optim_step(a.opt, 1.0f, 1.0f, 0);
        if (step < 5) { /* group 0's lr 1e38 at step 4 still fits a float */
            CT_CHECK(r == CAPEX_OK && a.p[0][0] == -(float)capex_lr_at(&s, (double)0.01f, step), "step %d: %s", step,
                     capex_last_error());
        } else {
            CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "lr"), "step 5, lr 1e48: %d %.9g %s",
                     (int)r, a.p[0][0], capex_last_error());
            CT_CHECK(a.p[0][0] == 0.0f && a.p[1][NP - 1] == 0.0f, "nothing changed: %g", a.p[0][0]);
            CT_CHECK(capex_optim_get_step(a.opt, 0, &n) == CAPEX_OK && n == 5, "step count kept: %lld", (long long)n);
            CT_CHECK(capex_optim_get_lr(a.opt, 0, &lr) == CAPEX_ERR_INVALID_ARG && isinf(lr) &&
                         strstr(capex_last_error(), "group 0"), "get_lr: %g %s", lr, capex_last_error());
        }
    }
    capex_optim_destroy(a.opt);
    capex_lr_schedule_init(&s, CAPEX_LR_ONECYCLE); /* initial lr base * 1e17, min lr / 1e-300: inf - inf */
    s.total_steps = 17; s.pct_start = 0.25; s.three_phase = 1; s.div_factor = 1e-17; s.final_div_factor = 1e-300;
    v = capex_lr_at(&s, 1.0, 9);
    CT_CHECK(v != v && strstr(capex_last_error(), "overflow"), "one-cycle: %g, %s", v, capex_last_error());
}

static unsigned char *save_mem(const capex_optim *o, size_t *len) {
    capex_state_writer *w = NULL;
    unsigned char *buf = NULL;
    if (capex_state_writer_create(NULL, &w) != CAPEX_OK) return NULL;
    if (capex_optim_save(o, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK &&
        capex_state_write_memory(w, NULL, 0, len) == CAPEX_OK) {
        buf = (unsigned char *)malloc(*len);
        if (buf && capex_state_write_memory(w, buf, *len, len) != CAPEX_OK) { free(buf); buf = NULL; }
    }
    capex_state_writer_destroy(w);
    return buf;
}

static capex_result load_mem(capex_optim *o, const unsigned char *buf, size_t len) {
    capex_state_reader *rd = NULL;
    capex_result r = capex_state_reader_open_memory(buf, len, 0, NULL, &rd);
    if (r != CAPEX_OK) return r;
    r = capex_optim_load(o, rd, NULL, CAPEX_OPTIM_STATE_PARAMS);
    capex_state_reader_close(rd);
    return r;
}

/* Save at step 9 (mid-warmup boundary region), resume in an optimizer with no
   schedule attached: the file brings it, and the run ends bit-equal. */
CT_TEST(state_resume) {
    static run a, b;
    capex_lr_schedule s, got;
    unsigned char *buf;
    size_t len = 0;
    int step, att = 0;
    sched_for_test(&s);
    s.kind = CAPEX_LR_MULTISTEP; /* every field travels: milestones too */
    s.num_milestones = 3; s.milestones[0] = 2; s.milestones[1] = 5; s.milestones[2] = 9; s.gamma = 0.5;
    CT_CHECK(make_run(&a, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 9; step++) {
        fill_grads(&a, step);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, step == 3) == CAPEX_OK, "%s", capex_last_error());
    }
    buf = save_mem(a.opt, &len);
    CT_CHECK(buf != NULL, "save: %s", capex_last_error());
    CT_CHECK(load_mem(b.opt, buf, len) == CAPEX_OK, "load: %s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 &&
             memcmp(&got, &s, sizeof s) == 0, "the schedule came back whole");
    for (; step < 25; step++) {
        fill_grads(&a, step);
        fill_grads(&b, step);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, step == 12) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_step(b.opt, 1.0f, 1.0f, step == 12) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(memcmp(a.p, b.p, sizeof a.p) == 0 && memcmp(a.m, b.m, sizeof a.m) == 0, "step %d: resumed run differs",
                 step);
    }
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
}

/* A file without a schedule (as before schedules existed) loads and keeps the
   attached one; a file with a bad schedule is refused, optimizer untouched. */
CT_TEST(state_old_and_bad_files) {
    static run a, b;
    capex_lr_schedule s, got;
    capex_state_writer *w = NULL;
    unsigned char *buf;
    size_t len = 0;
    int att = 0, i;
    float before[2][NP];
    sched_for_test(&s);
    CT_CHECK(make_run(&a, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK, "%s",
             capex_last_error());
    fill_grads(&a, 0);
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
    buf = save_mem(a.opt, &len); /* no schedule attached: no lr_schedule entries */
    CT_CHECK(buf != NULL, "save: %s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(b.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(load_mem(b.opt, buf, len) == CAPEX_OK, "old file: %s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 && got.total_steps == 20,
             "the attached schedule stays");
    {
        float lr;
        CT_CHECK(capex_optim_get_lr(b.opt, 0, &lr) == CAPEX_OK && lr == (float)capex_lr_at(&s, (double)0.01f, 1),
                 "it continues at the file's step count: %.9g", lr);
    }
    /* bad: a schedule whose total_steps <= warmup_steps */
    CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "writer");
    CT_CHECK(capex_optim_save(a.opt, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%s", capex_last_error());
    {
        static const char *const in[7] = {"kind", "warmup_steps", "total_steps", "step_size", "num_milestones",
                                          "anneal_linear", "three_phase"};
        static const char *const fn[7] = {"warmup_start_factor", "min_factor", "power", "gamma", "pct_start",
                                          "div_factor", "final_div_factor"};
        static const int64_t iv[7] = {1, 10, 5, 1, 0, 0, 0};
        static const int64_t mil[CAPEX_LR_MAX_MILESTONES] = {0};
        int64_t shape = CAPEX_LR_MAX_MILESTONES;
        char nm[96];
        for (i = 0; i < 7; i++) {
            snprintf(nm, sizeof nm, "optim.lr_schedule.%s", in[i]);
            CT_CHECK(capex_state_add_i64(w, nm, iv[i]) == CAPEX_OK, "%s", capex_last_error());
            snprintf(nm, sizeof nm, "optim.lr_schedule.%s", fn[i]);
            CT_CHECK(capex_state_add_f64(w, nm, 0.5) == CAPEX_OK, "%s", capex_last_error());
        }
        CT_CHECK(capex_state_add_tensor(w, "optim.lr_schedule.milestones", CAPEX_STATE_I64, 1, &shape, mil) == CAPEX_OK,
                 "%s", capex_last_error());
    }
    CT_CHECK(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK, "size");
    buf = (unsigned char *)malloc(len);
    CT_CHECK(buf && capex_state_write_memory(w, buf, len, &len) == CAPEX_OK, "write");
    capex_state_writer_destroy(w);
    memcpy(before, b.p, sizeof before);
    CT_CHECK(load_mem(b.opt, buf, len) == CAPEX_ERR_FORMAT && strstr(capex_last_error(), "lr schedule"),
             "bad schedule in the file: %s", capex_last_error());
    free(buf);
    CT_CHECK(memcmp(before, b.p, sizeof before) == 0, "a refused file changes nothing");
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 && got.total_steps == 20,
             "the attached schedule stays after a refused load");
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
}

/* llm.c's schedule (train_gpt2.cu get_learning_rate_cosine): warmup
   lr*(step+1)/W, reaching the base lr at step W-1, then cosine from the base
   to lr*final_frac over (step-W)/(N-W). Values below: that formula in Python
   float64 for lr 6e-4, W 4, N 12, final_frac 0.1 (not torch LinearLR's
   start_factor + (1-start_factor)*step/W, which no start_factor makes equal). */
CT_TEST(llmc_warmup_cosine) {
    static const double want[14] = {0.00015, 0.0003, 0.00045, 0.0006, 0.0005999999999999998,
                                     0.0005794474737780473, 0.0005209188309203677, 0.00043332452673857416,
                                     0.00032999999999999994, 0.00022667547326142573, 0.00013908116907963218,
                                     8.055252622195258e-05, 5.9999999999999995e-05, 5.9999999999999995e-05};
    static const int64_t at[14] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17}; /* 12, 17: past the end, held */
    capex_lr_schedule s, got;
    static run a, b;
    unsigned char *buf;
    size_t len = 0;
    int i, att = 0;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    CT_CHECK(s.warmup_llmc == 0, "torch's LinearLR warmup stays the default");
    s.warmup_steps = 4; s.total_steps = 12; s.min_factor = 0.1; s.warmup_llmc = 1;
    s.warmup_start_factor = 0.0; /* unused with warmup_llmc */
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 14; i++) {
        double v = capex_lr_at(&s, 6e-4, at[i]);
        CT_CHECK(rel(v, want[i]) <= 4e-16, "step %lld: %.17g, llm.c %.17g", (long long)at[i], v, want[i]);
    }
    s.warmup_llmc = 2;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "warmup_llmc"),
             "warmup_llmc 2: %s", capex_last_error());
    s.warmup_llmc = 1;
    /* on the optimizer, through a state file: the flag travels */
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 2; i++) {
        int k, j;
        for (k = 0; k < 2; k++)
            for (j = 0; j < NP; j++) { a.p[k][j] = 0.0f; a.g[k][j] = 1.0f; }
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(a.p[0][0] == -(float)(0.01f * (double)(i + 1) / 4.0), "step %d: %.9g", i, a.p[0][0]);
    }
    buf = save_mem(a.opt, &len);
    CT_CHECK(buf != NULL && load_mem(b.opt, buf, len) == CAPEX_OK, "round trip: %s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 && got.warmup_llmc == 1 &&
             memcmp(&got, &s, sizeof s) == 0, "the flag came back");
    /* a file from before the flag (no warmup_llmc entry) loads as 0; a bad value is refused */
    for (i = 0; i < 2; i++) {
        static const char *const in[7] = {"kind", "warmup_steps", "total_steps", "step_size", "num_milestones",
                                          "anneal_linear", "three_phase"};
        static const char *const fn[7] = {"warmup_start_factor", "min_factor", "power", "gamma", "pct_start",
                                          "div_factor", "final_div_factor"};
        static const int64_t iv[7] = {1, 4, 12, 1, 0, 0, 0};
        static const int64_t mil[CAPEX_LR_MAX_MILESTONES] = {0};
        int64_t shape = CAPEX_LR_MAX_MILESTONES;
        capex_state_writer *w = NULL;
        capex_result r;
        char nm[96];
        int j;
        CT_CHECK(capex_optim_set_lr_schedule(a.opt, NULL) == CAPEX_OK && capex_state_writer_create(NULL, &w) == CAPEX_OK &&
                 capex_optim_save(a.opt, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK, "%s", capex_last_error());
        for (j = 0; j < 7; j++) {
            snprintf(nm, sizeof nm, "optim.lr_schedule.%s", in[j]);
            CT_CHECK(capex_state_add_i64(w, nm, iv[j]) == CAPEX_OK, "%s", capex_last_error());
            snprintf(nm, sizeof nm, "optim.lr_schedule.%s", fn[j]);
            CT_CHECK(capex_state_add_f64(w, nm, 0.5) == CAPEX_OK, "%s", capex_last_error());
        }
        if (i == 1) CT_CHECK(capex_state_add_i64(w, "optim.lr_schedule.warmup_llmc", 5) == CAPEX_OK, "add");
        CT_CHECK(capex_state_add_tensor(w, "optim.lr_schedule.milestones", CAPEX_STATE_I64, 1, &shape, mil) == CAPEX_OK,
                 "%s", capex_last_error());
        CT_CHECK(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK && (buf = (unsigned char *)malloc(len)) != NULL &&
                 capex_state_write_memory(w, buf, len, &len) == CAPEX_OK, "write");
        capex_state_writer_destroy(w);
        r = load_mem(b.opt, buf, len);
        free(buf);
        if (i == 0)
            CT_CHECK(r == CAPEX_OK && capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 &&
                     got.warmup_llmc == 0 && got.warmup_steps == 4, "old file: %s", capex_last_error());
        else
            CT_CHECK(r == CAPEX_ERR_FORMAT && strstr(capex_last_error(), "warmup_llmc"), "warmup_llmc 5: %s",
                     capex_last_error());
    }
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
}

/* The recipe in capex.h for torch's curve under skipped steps (torch calls
   scheduler.step() every iteration, GradScaler skipping optimizer.step()):
   no schedule attached, set_lr from the iteration count. Each step taken uses
   torch's closed-form lr of its iteration; the attached schedule instead
   resumes where the last taken step left off, and with count_skipped it
   equals torch's too. */
CT_TEST(torch_curve_with_skipped_steps) {
    const capex_lr_golden *g = NULL;
    static run a, b, c2;
    capex_lr_schedule s, s2;
    size_t c;
    int i, k, j, taken = 0;
    for (c = 0; c < sizeof capex_lr_goldens / sizeof capex_lr_goldens[0]; c++)
        if (!strcmp(capex_lr_goldens[c].name, "cosine_warmup")) g = &capex_lr_goldens[c];
    CT_CHECK(g != NULL, "golden case");
    from_golden(g, &s);
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(b.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    s2 = s;
    s2.count_skipped = 1;
    CT_CHECK(make_run(&c2, CAPEX_OPTIM_SGD, 0) == CAPEX_OK && capex_optim_set_lr(c2.opt, 0, (float)g->base) == CAPEX_OK &&
             capex_optim_set_lr_schedule(c2.opt, &s2) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 60; i++) {
        int skip = i < 3 || i == 51; /* early overflows (scale 65536 too high) and one in the decay */
        float want = (float)capex_lr_at(&s, g->base, i), want_b = (float)capex_lr_at(&s, (double)(float)g->base, taken);
        CT_CHECK(want == (float)g->closed[i], "iteration %d: %.9g, torch %.9g", i, (double)want, g->closed[i]);
        CT_CHECK(capex_optim_set_lr(a.opt, 0, want) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_set_lr(b.opt, 0, (float)g->base) == CAPEX_OK, "%s", capex_last_error());
        for (k = 0; k < 2; k++)
            for (j = 0; j < NP; j++) {
                a.p[k][j] = b.p[k][j] = c2.p[k][j] = 0.0f;
                a.g[k][j] = b.g[k][j] = c2.g[k][j] = 1.0f;
            }
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, skip) == CAPEX_OK && capex_optim_step(b.opt, 1.0f, 1.0f, skip) ==
                 CAPEX_OK && capex_optim_step(c2.opt, 1.0f, 1.0f, skip) == CAPEX_OK, "%s", capex_last_error());
        { /* hp.lr is a float: the base is (float)0.0003 here, torch's the double */
            float want_c = (float)capex_lr_at(&s2, (double)(float)g->base, i);
            CT_CHECK(c2.p[0][0] == (skip ? 0.0f : -want_c) && rel(want_c, g->closed[i]) < 1.2e-7,
                     "count_skipped, iteration %d: %.9g, want %.9g, torch %.9g", i, c2.p[0][0], (double)-want_c,
                     -g->closed[i]);
        }
        CT_CHECK(a.p[0][0] == (skip ? 0.0f : -want), "iteration %d: %.9g, want %.9g", i, a.p[0][0], (double)-want);
        CT_CHECK(b.p[0][0] == (skip ? 0.0f : -want_b), "attached, iteration %d: %.9g, want %.9g", i, b.p[0][0],
                 (double)-want_b);
        taken += !skip;
    }
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
    capex_optim_destroy(c2.opt);
}

/* torch's LinearLR warmup then CosineAnnealingLR (SequentialLR, milestones
   [W]) as lr_scheduler.py's closed forms, in float64, written here on their
   own: the lr of iteration i (scheduler.step() called i times). */
static double torch_warmup_cosine(double base, double sf, int64_t W, int64_t T, int64_t i) {
    if (i < W) return base * (sf + (1.0 - sf) * (double)i / (double)W);
    return 0.0 + (base - 0.0) * (1.0 + cos(3.141592653589793 * (double)(i - W) / (double)T)) / 2.0;
}

/* count_skipped = 1 is torch's loop under GradScaler: scheduler.step() every
   iteration, optimizer.step() skipped at overflows (iterations 3, 4, 11 of
   20 here). Plain SGD from p = 0 with g = 1 writes -lr: every step taken
   uses (float) of torch's lr of its iteration, for both groups; skipped ones
   change nothing and still advance the schedule. */
CT_TEST(count_skipped_torch_golden) {
    static run a;
    capex_lr_schedule s;
    const double base[2] = {(double)0.01f, (double)0.003f};
    int i, k, j, taken = 0;
    int64_t n = -1;
    capex_lr_schedule_init(&s, CAPEX_LR_COSINE);
    s.warmup_steps = 5; s.warmup_start_factor = 0.25; s.total_steps = 25; s.count_skipped = 1;
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 20; i++) {
        int skip = i == 3 || i == 4 || i == 11;
        for (k = 0; k < 2; k++) {
            double want = torch_warmup_cosine(base[k], 0.25, 5, 20, i), at = capex_lr_at(&s, base[k], i);
            float lr = -1.0f;
            CT_CHECK(rel(at, want) <= 2.3e-16, "iteration %d group %d: capex_lr_at %.17g, torch %.17g", i, k, at, want);
            CT_CHECK(capex_optim_get_lr(a.opt, (size_t)k, &lr) == CAPEX_OK && lr == (float)at,
                     "iteration %d group %d: get_lr %.9g, want %.9g", i, k, lr, (double)(float)at);
            for (j = 0; j < NP; j++) { a.p[k][j] = 0.0f; a.g[k][j] = 1.0f; }
        }
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, skip) == CAPEX_OK, "%s", capex_last_error());
        for (k = 0; k < 2; k++) {
            float want = skip ? 0.0f : -(float)capex_lr_at(&s, base[k], i);
            CT_CHECK(a.p[k][0] == want && a.p[k][NP - 1] == want, "iteration %d group %d: %.9g, want %.9g", i, k,
                     a.p[k][0], (double)want);
        }
        taken += !skip;
        CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == i + 1, "iteration count %lld after %d",
                 (long long)n, i);
        CT_CHECK(capex_optim_get_step(a.opt, 1, &n) == CAPEX_OK && n == taken, "group steps count only taken ones");
    }
    capex_optim_destroy(a.opt);
}

/* The count: 0 on attaching to an optimizer without a schedule (a new torch
   scheduler), kept when a schedule replaces another (its mode too), 0 with
   none attached; a refused step does not count; at 2^53 (from a file) every
   step is refused, skipped or not, nothing changed. */
CT_TEST(count_skipped_attach_and_limits) {
    static run a;
    capex_lr_schedule s;
    int64_t n = -1;
    int i;
    sched_for_test(&s);
    s.count_skipped = 1;
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == 0, "none attached: %lld", (long long)n);
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 3; i++) CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, i == 1) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_step(a.opt, -1.0f, 1.0f, 0) == CAPEX_ERR_INVALID_ARG, "a bad inv_scale is refused");
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 1) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == 4, "4 step calls, 1 refused: %lld",
             (long long)n);
    s.total_steps = 40;
    s.count_skipped = 0;
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 1) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == 5, "replaced: kept, counts on (%lld)",
             (long long)n);
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, NULL) == CAPEX_OK, "detach");
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == 0, "detached: 0");
    CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &n) == CAPEX_OK && n == 0, "re-attached: 0 (%lld)", (long long)n);
    s.count_skipped = 2;
    CT_CHECK(capex_lr_schedule_check(&s) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "count_skipped"),
             "count_skipped 2: %s", capex_last_error());
    CT_CHECK(capex_optim_get_lr_iteration(NULL, &n) == CAPEX_ERR_INVALID_ARG &&
             capex_optim_get_lr_iteration(a.opt, NULL) == CAPEX_ERR_INVALID_ARG, "NULL refused");
    capex_optim_destroy(a.opt);
}

/* A state file with a hand-written lr schedule: the 7 + 7 fields of
   sched_for_test's (kind COSINE, warmup 4, total 20), milestones, and the
   named i64 entries (NULL name: none). */
static unsigned char *sched_file(const capex_optim *o, const char *n1, int64_t v1, const char *n2, int64_t v2,
                                 size_t *len) {
    static const char *const in[7] = {"kind", "warmup_steps", "total_steps", "step_size", "num_milestones",
                                      "anneal_linear", "three_phase"};
    static const char *const fn[7] = {"warmup_start_factor", "min_factor", "power", "gamma", "pct_start",
                                      "div_factor", "final_div_factor"};
    static const int64_t iv[7] = {1, 4, 20, 1, 0, 0, 0};
    static const double fv[7] = {0.1, 0.05, 1.0, 0.1, 0.3, 25.0, 1e4};
    static const int64_t mil[CAPEX_LR_MAX_MILESTONES] = {0};
    int64_t shape = CAPEX_LR_MAX_MILESTONES;
    capex_state_writer *w = NULL;
    unsigned char *buf = NULL;
    char nm[96];
    int j, ok;
    if (capex_state_writer_create(NULL, &w) != CAPEX_OK) return NULL;
    ok = capex_optim_save(o, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK; /* o: no schedule attached */
    for (j = 0; j < 7 && ok; j++) {
        snprintf(nm, sizeof nm, "optim.lr_schedule.%s", in[j]);
        ok = capex_state_add_i64(w, nm, iv[j]) == CAPEX_OK;
        snprintf(nm, sizeof nm, "optim.lr_schedule.%s", fn[j]);
        ok = ok && capex_state_add_f64(w, nm, fv[j]) == CAPEX_OK;
    }
    if (ok && n1) ok = capex_state_add_i64(w, n1, v1) == CAPEX_OK;
    if (ok && n2) ok = capex_state_add_i64(w, n2, v2) == CAPEX_OK;
    ok = ok && capex_state_add_tensor(w, "optim.lr_schedule.milestones", CAPEX_STATE_I64, 1, &shape, mil) == CAPEX_OK;
    ok = ok && capex_state_write_memory(w, NULL, 0, len) == CAPEX_OK && (buf = (unsigned char *)malloc(*len)) != NULL &&
         capex_state_write_memory(w, buf, *len, len) == CAPEX_OK;
    capex_state_writer_destroy(w);
    if (!ok) { free(buf); buf = NULL; }
    return buf;
}

/* Save mid-run with count_skipped (after skips, so the iteration and step
   counts differ), resume in an optimizer with no schedule: the mode and the
   count come back and the run continues bit for bit. Every truncation of the
   file is refused with nothing changed. */
CT_TEST(count_skipped_state_resume) {
    static run a, b;
    capex_lr_schedule s, got;
    unsigned char *buf;
    size_t len = 0, cut;
    int step, att = 0;
    int64_t na = -1, nb = -2;
    float before[2][NP];
    sched_for_test(&s);
    s.count_skipped = 1;
    CT_CHECK(make_run(&a, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_ADAM, 0) == CAPEX_OK, "%s",
             capex_last_error());
    CT_CHECK(capex_optim_set_lr_schedule(a.opt, &s) == CAPEX_OK, "%s", capex_last_error());
    for (step = 0; step < 9; step++) {
        fill_grads(&a, step);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, step == 3 || step == 4) == CAPEX_OK, "%s", capex_last_error());
    }
    buf = save_mem(a.opt, &len);
    CT_CHECK(buf != NULL, "save: %s", capex_last_error());
    memcpy(before, b.p, sizeof before);
    for (cut = 0; cut < len; cut++) {
        capex_result r = load_mem(b.opt, buf, cut);
        if (r == CAPEX_OK) { free(buf); CT_CHECK(0, "a file cut at %zu of %zu bytes loaded", cut, len); }
    }
    CT_CHECK(memcmp(before, b.p, sizeof before) == 0 && capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK &&
             att == 0, "refused files changed nothing");
    CT_CHECK(load_mem(b.opt, buf, len) == CAPEX_OK, "load: %s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 &&
             memcmp(&got, &s, sizeof s) == 0, "the schedule came back whole");
    CT_CHECK(capex_optim_get_lr_iteration(b.opt, &nb) == CAPEX_OK && nb == 9, "iteration %lld", (long long)nb);
    for (; step < 25; step++) {
        fill_grads(&a, step);
        fill_grads(&b, step);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, step == 11) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_optim_step(b.opt, 1.0f, 1.0f, step == 11) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(memcmp(a.p, b.p, sizeof a.p) == 0 && memcmp(a.m, b.m, sizeof a.m) == 0, "step %d: resumed run differs",
                 step);
    }
    CT_CHECK(capex_optim_get_lr_iteration(a.opt, &na) == CAPEX_OK && capex_optim_get_lr_iteration(b.opt, &nb) ==
             CAPEX_OK && na == 25 && nb == 25, "%lld %lld", (long long)na, (long long)nb);
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
}

/* Files from before count_skipped: the schedule loads with count_skipped 0
   and the iteration count the most steps a group took (exact without
   skips). Bad values (count_skipped 5, iteration < 0 or > 2^53) are refused
   with the optimizer unchanged; an iteration of 2^53 refuses the next step. */
CT_TEST(count_skipped_old_and_bad_files) {
    static run a, b;
    capex_lr_schedule s, got;
    unsigned char *buf;
    size_t len = 0;
    int i, att = 0;
    int64_t n = -1;
    float before[2][NP];
    CT_CHECK(make_run(&a, CAPEX_OPTIM_SGD, 0) == CAPEX_OK && make_run(&b, CAPEX_OPTIM_SGD, 0) == CAPEX_OK, "%s",
             capex_last_error());
    for (i = 0; i < 3; i++) {
        fill_grads(&a, i);
        CT_CHECK(capex_optim_step(a.opt, 1.0f, 1.0f, 0) == CAPEX_OK, "%s", capex_last_error());
    }
    buf = sched_file(a.opt, NULL, 0, NULL, 0, &len);
    CT_CHECK(buf != NULL && load_mem(b.opt, buf, len) == CAPEX_OK, "old file: %s", capex_last_error());
    free(buf);
    CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 && got.count_skipped == 0 &&
             got.total_steps == 20, "old file's schedule");
    CT_CHECK(capex_optim_get_lr_iteration(b.opt, &n) == CAPEX_OK && n == 3, "old file: iteration %lld", (long long)n);
    sched_for_test(&s);
    s.count_skipped = 1;
    CT_CHECK(capex_optim_set_lr_schedule(b.opt, &s) == CAPEX_OK, "%s", capex_last_error()); /* replaces: keeps 3 */
    {
        float lr = 0.0f;
        CT_CHECK(capex_optim_get_lr(b.opt, 0, &lr) == CAPEX_OK && lr == (float)capex_lr_at(&s, (double)0.01f, 3),
                 "continues at 3: %.9g", lr);
    }
    memcpy(before, b.p, sizeof before);
    {
        static const char *const names[4] = {"optim.lr_schedule.count_skipped", "optim.lr_schedule.iteration",
                                             "optim.lr_schedule.iteration", "optim.lr_schedule.iteration"};
        const int64_t vals[4] = {5, -1, (INT64_C(1) << 53) + 1, INT64_MAX};
        for (i = 0; i < 4; i++) {
            capex_result r;
            buf = sched_file(a.opt, names[i], vals[i], NULL, 0, &len);
            CT_CHECK(buf != NULL, "file");
            r = load_mem(b.opt, buf, len);
            free(buf);
            CT_CHECK(r == CAPEX_ERR_FORMAT && strstr(capex_last_error(), i ? "iteration" : "count_skipped"),
                     "%s = %lld: %d %s", names[i], (long long)vals[i], (int)r, capex_last_error());
            CT_CHECK(capex_optim_get_lr_schedule(b.opt, &got, &att) == CAPEX_OK && att == 1 && got.count_skipped == 1 &&
                     capex_optim_get_lr_iteration(b.opt, &n) == CAPEX_OK && n == 3 &&
                     memcmp(before, b.p, sizeof before) == 0, "a refused file changes nothing");
        }
    }
    buf = sched_file(a.opt, "optim.lr_schedule.count_skipped", 1, "optim.lr_schedule.iteration", INT64_C(1) << 53, &len);
    CT_CHECK(buf != NULL && load_mem(b.opt, buf, len) == CAPEX_OK, "iteration 2^53: %s", capex_last_error());
    free(buf);
    memcpy(before, b.p, sizeof before);
    for (i = 0; i < 2; i++)
        CT_CHECK(capex_optim_step(b.opt, 1.0f, 1.0f, i) == CAPEX_ERR_LIMIT && strstr(capex_last_error(), "2^53") &&
                 memcmp(before, b.p, sizeof before) == 0, "step at iteration 2^53 (skip %d): %s", i, capex_last_error());
    CT_CHECK(capex_optim_get_step(b.opt, 0, &n) == CAPEX_OK && n == 3, "nothing changed");
    capex_optim_destroy(a.opt);
    capex_optim_destroy(b.opt);
}

static const ct_case cases[] = {
    CT_CASE(torch_golden),          CT_CASE(float64_reference_random), CT_CASE(edges),
    CT_CASE(bad_input),             CT_CASE(optimizer_follows_schedule), CT_CASE(optimizer_lr_values),
    CT_CASE(state_resume),          CT_CASE(state_old_and_bad_files), CT_CASE(overflowing_lr_is_refused),
    CT_CASE(llmc_warmup_cosine),       CT_CASE(torch_curve_with_skipped_steps), CT_CASE(count_skipped_torch_golden),
    CT_CASE(count_skipped_attach_and_limits), CT_CASE(count_skipped_state_resume),
    CT_CASE(count_skipped_old_and_bad_files),
};
CT_MAIN(cases)
