/* Loss scaler through a state file: round trip, resume equals an
   uninterrupted run, and bad files leave the live scaler untouched. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <math.h>
#include <unistd.h>

/* One iteration with a scripted overflow pattern. */
static capex_result run_step(capex_scaler *sc, int found_inf) {
    float scale, inv;
    int do_step;
    capex_result r;
    if ((r = capex_scaler_scale(sc, &scale)) != CAPEX_OK) return r;
    if ((r = capex_scaler_unscale(sc, 0, found_inf, &inv)) != CAPEX_OK) return r;
    if ((r = capex_scaler_step(sc, 0, &do_step)) != CAPEX_OK) return r;
    return capex_scaler_update(sc);
}
static int pattern(int i) { return (i % 7 == 3) || (i % 11 == 0); }

static int same_state(const capex_scaler *a, const capex_scaler *b) {
    capex_scaler_state x, y;
    if (capex_scaler_get_state(a, &x) != CAPEX_OK || capex_scaler_get_state(b, &y) != CAPEX_OK) return 0;
    return x.dynamic == y.dynamic && memcmp(&x.scale, &y.scale, 4) == 0 && x.growth_tracker == y.growth_tracker &&
           x.hysteresis_tracker == y.hysteresis_tracker && x.growth_factor == y.growth_factor &&
           x.backoff_factor == y.backoff_factor && x.growth_interval == y.growth_interval && x.min_scale == y.min_scale &&
           memcmp(&x.max_scale, &y.max_scale, 4) == 0 && x.hysteresis == y.hysteresis && x.steps == y.steps &&
           x.skipped_steps == y.skipped_steps && x.init_scale == y.init_scale;
}

static void make_desc(capex_scaler_desc *d) {
    capex_scaler_desc_init(d);
    d->growth_interval = 5;
    d->hysteresis = 2;
    d->min_scale = 4.0f;
    d->max_scale = INFINITY; /* non-finite values must survive the file too */
    d->log_interval = 0;
}

static unsigned char *save_to_memory(const capex_scaler *sc, const char *prefix, size_t *len) {
    capex_state_writer *w = NULL;
    unsigned char *buf = NULL;
    if (capex_state_writer_create(NULL, &w) != CAPEX_OK) return NULL;
    if (capex_scaler_save(sc, w, prefix) == CAPEX_OK && capex_state_write_memory(w, NULL, 0, len) == CAPEX_OK) {
        buf = (unsigned char *)malloc(*len);
        if (buf && capex_state_write_memory(w, buf, *len, len) != CAPEX_OK) { free(buf); buf = NULL; }
    }
    capex_state_writer_destroy(w);
    return buf;
}

CT_TEST(resume_equals_uninterrupted) {
    capex_scaler_desc d;
    capex_scaler a, b;
    capex_state_reader *rd = NULL;
    unsigned char *buf;
    size_t len = 0;
    int i;
    make_desc(&d);
    CT_CHECK(capex_scaler_init(&a, &d) == CAPEX_OK, "%s", capex_last_error());
    for (i = 0; i < 400; i++) CT_CHECK(run_step(&a, pattern(i)) == CAPEX_OK, "step %d: %s", i, capex_last_error());
    /* b: 200 steps, saved, loaded into a fresh scaler made with other defaults, 200 more */
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK, "init");
    for (i = 0; i < 200; i++) CT_CHECK(run_step(&b, pattern(i)) == CAPEX_OK, "step %d", i);
    buf = save_to_memory(&b, "scaler.0.", &len);
    CT_CHECK(buf != NULL, "save: %s", capex_last_error());
    capex_scaler_desc_init(&d);
    CT_CHECK(capex_scaler_init(&b, &d) == CAPEX_OK, "re-init");
    CT_CHECK(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "open: %s", capex_last_error());
    CT_CHECK(capex_scaler_load(&b, rd, "scaler.0.") == CAPEX_OK, "load: %s", capex_last_error());
    capex_state_reader_close(rd);
    free(buf);
    for (i = 200; i < 400; i++) CT_CHECK(run_step(&b, pattern(i)) == CAPEX_OK, "step %d", i);
    CT_CHECK(same_state(&a, &b), "resumed scaler differs from the uninterrupted one");
}

CT_TEST(file_round_trip_two_scalers) {
    capex_scaler_desc d;
    capex_scaler s0, s1, t0, t1;
    capex_state_writer *w = NULL;
    capex_state_reader *rd = NULL;
    char path[256], dup[256];
    int i;
    snprintf(path, sizeof path, "/tmp/capex_test_scaler_state_%d.safetensors", (int)getpid());
    snprintf(dup, sizeof dup, "/tmp/capex_test_scaler_state_dup_%d.safetensors", (int)getpid());
    make_desc(&d);
    CT_CHECK(capex_scaler_init(&s0, &d) == CAPEX_OK && capex_scaler_init(&s1, &d) == CAPEX_OK, "init");
    for (i = 0; i < 37; i++) { CT_CHECK(run_step(&s0, pattern(i)) == CAPEX_OK, "s0"); CT_CHECK(run_step(&s1, i % 3 == 0) == CAPEX_OK, "s1"); }
    CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "writer");
    CT_CHECK(capex_scaler_save(&s0, w, "scaler.0.") == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_scaler_save(&s1, w, "scaler.1.") == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_state_write_file(w, path) == CAPEX_OK, "write: %s", capex_last_error());
    /* the same prefix twice is refused (when adding or when writing) */
    CT_CHECK(capex_scaler_save(&s1, w, "scaler.1.") != CAPEX_OK ||
             capex_state_write_file(w, dup) != CAPEX_OK,
             "saving one prefix twice must be refused");
    capex_state_writer_destroy(w);
    capex_scaler_desc_init(&d);
    CT_CHECK(capex_scaler_init(&t0, &d) == CAPEX_OK && capex_scaler_init(&t1, &d) == CAPEX_OK, "init");
    CT_CHECK(capex_state_reader_open_file(path, 0, NULL, &rd) == CAPEX_OK, "open: %s", capex_last_error());
    CT_CHECK(capex_scaler_load(&t1, rd, "scaler.1.") == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_scaler_load(&t0, rd, "scaler.0.") == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(capex_scaler_load(&t0, rd, "scaler.9.") == CAPEX_ERR_NOT_FOUND, "absent prefix");
    capex_state_reader_close(rd);
    remove(path);
    remove(dup);
    CT_CHECK(same_state(&s0, &t0) && same_state(&s1, &t1), "round trip changed a scaler");
}

/* A file whose scaler entries are incomplete, mistyped or invalid must fail
   with a clear status and leave the live scaler exactly as it was. */
CT_TEST(bad_entries_leave_scaler_untouched) {
    capex_scaler_desc d;
    capex_scaler live, before;
    int variant;
    make_desc(&d);
    CT_CHECK(capex_scaler_init(&live, &d) == CAPEX_OK, "init");
    CT_CHECK(run_step(&live, 1) == CAPEX_OK && run_step(&live, 0) == CAPEX_OK, "steps");
    memcpy(&before, &live, sizeof live);
    for (variant = 0; variant < 6; variant++) {
        capex_state_writer *w = NULL;
        capex_state_reader *rd = NULL;
        unsigned char *buf;
        size_t len = 0;
        capex_result r;
        CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "writer");
        capex_state_add_meta(w, "s.format", variant == 0 ? "capex-scaler/9" : CAPEX_SCALER_STATE_FORMAT);
        capex_state_add_i64(w, "s.dynamic", 1);
        if (variant == 1) capex_state_add_i64(w, "s.scale", 65536); /* wrong dtype */
        else capex_state_add_f32(w, "s.scale", variant == 2 ? NAN : 1024.0f);
        capex_state_add_i64(w, "s.growth_tracker", variant == 3 ? 99 : 1); /* >= interval: invalid */
        capex_state_add_i64(w, "s.hysteresis_tracker", variant == 4 ? ((int64_t)1 << 40) : 2);
        capex_state_add_f32(w, "s.init_scale", 65536.0f);
        capex_state_add_f64(w, "s.growth_factor", 2.0);
        capex_state_add_f64(w, "s.backoff_factor", 0.5);
        capex_state_add_i64(w, "s.growth_interval", 5);
        capex_state_add_f32(w, "s.min_scale", 4.0f);
        capex_state_add_f32(w, "s.max_scale", INFINITY);
        capex_state_add_i64(w, "s.hysteresis", 2);
        capex_state_add_i64(w, "s.steps", 10);
        if (variant != 5) capex_state_add_i64(w, "s.skipped_steps", 3); /* missing entry */
        CT_CHECK(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK, "size");
        buf = (unsigned char *)malloc(len);
        CT_CHECK(buf && capex_state_write_memory(w, buf, len, &len) == CAPEX_OK, "write");
        capex_state_writer_destroy(w);
        CT_CHECK(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK, "open");
        r = capex_scaler_load(&live, rd, "s.");
        capex_state_reader_close(rd);
        free(buf);
        CT_CHECK(r != CAPEX_OK, "variant %d must be refused", variant);
        CT_CHECK(capex_last_error()[0] != '\0', "variant %d has no message", variant);
        CT_CHECK(memcmp(&live, &before, sizeof live) == 0, "variant %d changed the live scaler", variant);
    }
}

CT_TEST(null_and_long_prefix) {
    capex_scaler_desc d;
    capex_scaler sc;
    capex_state_writer *w = NULL;
    char prefix[400];
    capex_scaler_desc_init(&d);
    CT_CHECK(capex_scaler_init(&sc, &d) == CAPEX_OK, "init");
    CT_CHECK(capex_state_writer_create(NULL, &w) == CAPEX_OK, "writer");
    CT_CHECK(capex_scaler_save(NULL, w, "x") == CAPEX_ERR_INVALID_ARG, "null sc");
    CT_CHECK(capex_scaler_save(&sc, NULL, "x") == CAPEX_ERR_INVALID_ARG, "null writer");
    CT_CHECK(capex_scaler_save(&sc, w, NULL) == CAPEX_ERR_INVALID_ARG, "null prefix");
    CT_CHECK(capex_scaler_save(&sc, w, "") == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "empty"),
             "empty prefix refused by name: %s", capex_last_error());
    {
        capex_state_writer *empty = NULL;
        size_t len = 0, len_empty = 1;
        capex_state_writer_create(NULL, &empty);
        capex_state_write_memory(empty, NULL, 0, &len_empty);
        capex_state_writer_destroy(empty);
        CT_CHECK(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK && len == len_empty,
                 "nothing was added before the refusal (%lu vs %lu bytes)", (unsigned long)len, (unsigned long)len_empty);
    }
    CT_CHECK(capex_scaler_load(&sc, NULL, "x") == CAPEX_ERR_INVALID_ARG, "null reader");
    memset(prefix, 'p', sizeof prefix - 1);
    prefix[sizeof prefix - 1] = '\0';
    CT_CHECK(capex_scaler_save(&sc, w, prefix) == CAPEX_ERR_INVALID_ARG, "over-long prefix must be refused");
    capex_state_writer_destroy(w);
}

/* A state file with a valid checksum whose counters sit at the edge of their
   type (issue 16 item 2): steps INT64_MAX made the next update signed
   overflow. Counters above CAPEX_STEP_MAX are refused with the live scaler
   untouched; a count that reaches the bound by training stops with
   CAPEX_ERR_LIMIT, changing nothing. */
static capex_result load_counters(capex_scaler *sc, int64_t steps, int64_t skipped, int64_t tracker, int64_t interval) {
    capex_state_writer *w = NULL;
    capex_state_reader *rd = NULL;
    unsigned char *buf = NULL;
    size_t len = 0;
    capex_result r;
    capex_state_writer_create(NULL, &w);
    capex_state_add_meta(w, "s.format", CAPEX_SCALER_STATE_FORMAT);
    capex_state_add_i64(w, "s.dynamic", 1);
    capex_state_add_f32(w, "s.scale", 1024.0f);
    capex_state_add_i64(w, "s.growth_tracker", tracker);
    capex_state_add_i64(w, "s.hysteresis_tracker", 2147483647);
    capex_state_add_f32(w, "s.init_scale", 65536.0f);
    capex_state_add_f64(w, "s.growth_factor", 2.0);
    capex_state_add_f64(w, "s.backoff_factor", 0.5);
    capex_state_add_i64(w, "s.growth_interval", interval);
    capex_state_add_f32(w, "s.min_scale", 1.0f);
    capex_state_add_f32(w, "s.max_scale", INFINITY);
    capex_state_add_i64(w, "s.hysteresis", 2147483647);
    capex_state_add_i64(w, "s.steps", steps);
    capex_state_add_i64(w, "s.skipped_steps", skipped);
    if ((r = capex_state_write_memory(w, NULL, 0, &len)) == CAPEX_OK) {
        buf = (unsigned char *)malloc(len);
        r = capex_state_write_memory(w, buf, len, &len);
    }
    capex_state_writer_destroy(w);
    if (r == CAPEX_OK && (r = capex_state_reader_open_memory(buf, len, 0, NULL, &rd)) == CAPEX_OK) {
        r = capex_scaler_load(sc, rd, "s.");
        capex_state_reader_close(rd);
    }
    free(buf);
    return r;
}

CT_TEST(counters_near_overflow) {
    const int64_t big = INT64_MAX;
    capex_scaler_desc d;
    capex_scaler live, before;
    capex_scaler_state st;
    capex_result r;
    make_desc(&d);
    CT_CHECK(capex_scaler_init(&live, &d) == CAPEX_OK, "init");
    CT_CHECK(run_step(&live, 1) == CAPEX_OK && run_step(&live, 0) == CAPEX_OK, "steps");
    memcpy(&before, &live, sizeof live);
    r = load_counters(&live, big, 0, 0, 5);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "CAPEX_STEP_MAX"), "steps INT64_MAX: %s %s",
             capex_result_string(r), capex_last_error());
    CT_CHECK(memcmp(&live, &before, sizeof live) == 0, "refused steps changed the live scaler");
    r = load_counters(&live, big, big, 0, 5);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "steps = skipped = INT64_MAX: %s", capex_result_string(r));
    r = load_counters(&live, CAPEX_STEP_MAX + 1, 0, 0, 5);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "steps 2^53 + 1: %s", capex_result_string(r));
    r = load_counters(&live, -1, -1, 0, 5);
    CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "negative steps: %s", capex_result_string(r));
    CT_CHECK(memcmp(&live, &before, sizeof live) == 0, "refused counters changed the live scaler");
    /* trackers at their type's edge are fine: tracker + 1 == interval grows and resets */
    r = load_counters(&live, CAPEX_STEP_MAX - 1, 7, big - 1, big);
    CT_CHECK(r == CAPEX_OK, "edge trackers, steps 2^53 - 1: %s", capex_last_error());
    CT_CHECK(run_step(&live, 0) == CAPEX_OK, "last countable update: %s", capex_last_error());
    CT_CHECK(capex_scaler_get_state(&live, &st) == CAPEX_OK && st.steps == CAPEX_STEP_MAX && st.growth_tracker == 0 &&
             st.scale == 2048.0f && st.hysteresis_tracker == 2147483647, "steps %lld tracker %lld scale %g",
             (long long)st.steps, (long long)st.growth_tracker, (double)st.scale);
    {
        float s, inv;
        int go;
        CT_CHECK(capex_scaler_scale(&live, &s) == CAPEX_OK && capex_scaler_unscale(&live, 0, 1, &inv) == CAPEX_OK &&
                 capex_scaler_step(&live, 0, &go) == CAPEX_OK, "iteration");
        memcpy(&before, &live, sizeof live);
        r = capex_scaler_update(&live);
        CT_CHECK(r == CAPEX_ERR_LIMIT && strstr(capex_last_error(), "CAPEX_STEP_MAX"), "update past the bound: %s",
                 capex_result_string(r));
        CT_CHECK(capex_scaler_update_to(&live, 8.0f) == CAPEX_ERR_LIMIT, "update_to past the bound");
        CT_CHECK(memcmp(&live, &before, sizeof live) == 0, "a refused update changed the scaler");
        CT_CHECK(capex_scaler_discard_iteration(&live) == CAPEX_OK, "discard");
    }
}

static const ct_case cases[] = {
    CT_CASE(resume_equals_uninterrupted), CT_CASE(file_round_trip_two_scalers),
    CT_CASE(bad_entries_leave_scaler_untouched), CT_CASE(null_and_long_prefix),
    CT_CASE(counters_near_overflow),
};
CT_MAIN(cases)
