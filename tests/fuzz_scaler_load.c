/* fuzz_scaler_load.c - libFuzzer target for capex_scaler_load (and through
   it capex_scaler_set_state) past the checksum.

   Each input is a state file; capex_fuzz_fixup (fuzz_load.h) repairs its
   header length and checksum, then it is loaded under three prefixes into
   three live scalers (dynamic with hysteresis after some iterations, static,
   and one in the middle of an iteration, which must refuse). A refused load
   must leave the scaler bit-identical and set a message. An accepted one must
   give a state set_state accepts: finite scale > 0 (0 only for a dynamic
   scaler without a floor), inside [min_scale, max_scale] when dynamic,
   trackers in range, 0 <= skipped_steps <= steps <= CAPEX_STEP_MAX; it must
   survive save + reload identically, and iterations with and without
   overflows must keep those invariants (CAPEX_ERR_LIMIT at the bound).

   Build and run (tests/state.mk's ci-extra does this for a few seconds):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
           -Itests tests/fuzz_scaler_load.c -o fuzz_scaler_load -lm
       mkdir -p corpus && ./fuzz_scaler_load corpus tests/corpus/fuzz_scaler_load -max_total_time=3600
   Seeds: cc -DCAPEX_FUZZ_GEN -Itests tests/fuzz_scaler_load.c -o gen -lm && ./gen tests/corpus/fuzz_scaler_load */
#include "fuzz_load.h"
#include <math.h>

static const char *const prefixes[3] = {"scaler.0.", "scaler.1.", "s."};

static capex_result iterate(capex_scaler *sc, int found_inf) {
    float s, inv;
    int go;
    capex_result r;
    if ((r = capex_scaler_scale(sc, &s)) != CAPEX_OK) return r;
    if ((r = capex_scaler_unscale(sc, 0, found_inf, &inv)) != CAPEX_OK) return r;
    if ((r = capex_scaler_step(sc, 0, &go)) != CAPEX_OK) return r;
    return capex_scaler_update(sc);
}

/* Live scaler l: 0 dynamic, hysteresis 2, after 7 iterations; 1 static;
   2 dynamic, inside an iteration. */
static void live_make(capex_scaler *sc, int l) {
    capex_scaler_desc d;
    int i;
    capex_scaler_desc_init(&d);
    d.log_interval = 0;
    if (l == 0) { d.hysteresis = 2; d.growth_interval = 3; d.min_scale = 1.0f; }
    if (l == 1) { d.dynamic = 0; d.init_scale = 128.0f; }
    CAPEX_FUZZ_REQUIRE(capex_scaler_init(sc, &d) == CAPEX_OK);
    for (i = 0; i < 7; i++) CAPEX_FUZZ_REQUIRE(iterate(sc, i % 3 == 1) == CAPEX_OK);
    if (l == 2) {
        float s;
        CAPEX_FUZZ_REQUIRE(capex_scaler_scale(sc, &s) == CAPEX_OK);
        CAPEX_FUZZ_REQUIRE(capex_scaler_unscale(sc, 0, 0, &s) == CAPEX_OK);
    }
}

static void check_state(const capex_scaler *sc) {
    capex_scaler_state st;
    CAPEX_FUZZ_REQUIRE(capex_scaler_get_state(sc, &st) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(isfinite(st.scale) && st.scale >= 0.0f);
    CAPEX_FUZZ_REQUIRE(st.scale > 0.0f || (st.dynamic && st.min_scale == 0.0f));
    CAPEX_FUZZ_REQUIRE(!st.dynamic || (st.scale >= st.min_scale && st.scale <= st.max_scale));
    CAPEX_FUZZ_REQUIRE(st.growth_interval >= 1 && st.growth_tracker >= 0 && st.growth_tracker < st.growth_interval);
    CAPEX_FUZZ_REQUIRE(st.hysteresis >= 1 && st.hysteresis_tracker >= 0 && st.hysteresis_tracker <= st.hysteresis);
    CAPEX_FUZZ_REQUIRE(st.skipped_steps >= 0 && st.skipped_steps <= st.steps && st.steps <= CAPEX_STEP_MAX);
    CAPEX_FUZZ_REQUIRE(st.growth_factor > 1.0 && isfinite(st.growth_factor));
    CAPEX_FUZZ_REQUIRE(st.backoff_factor > 0.0 && st.backoff_factor < 1.0);
}

static void check_loaded(capex_scaler *sc) {
    capex_state_writer *w = NULL;
    capex_state_reader *rd = NULL;
    capex_scaler other;
    capex_scaler_state a, b;
    unsigned char *buf;
    size_t len = 0;
    int i;
    check_state(sc);
    /* save + reload into a fresh scaler: the same state */
    CAPEX_FUZZ_REQUIRE(capex_state_writer_create(NULL, &w) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_scaler_save(sc, w, "x.") == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_state_write_memory(w, NULL, 0, &len) == CAPEX_OK);
    buf = (unsigned char *)malloc(len);
    CAPEX_FUZZ_REQUIRE(buf && capex_state_write_memory(w, buf, len, &len) == CAPEX_OK);
    capex_state_writer_destroy(w);
    live_make(&other, 1);
    CAPEX_FUZZ_REQUIRE(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK);
    CAPEX_FUZZ_REQUIRE(capex_scaler_load(&other, rd, "x.") == CAPEX_OK);
    capex_state_reader_close(rd);
    free(buf);
    capex_scaler_get_state(sc, &a); /* get_state zeroes the padding */
    capex_scaler_get_state(&other, &b);
    CAPEX_FUZZ_REQUIRE(memcmp(&a, &b, sizeof a) == 0);
    /* training goes on within the rules; at the bound it stops cleanly */
    for (i = 0; i < 4; i++) {
        capex_result r = iterate(sc, i == 1 || i == 2);
        CAPEX_FUZZ_REQUIRE(r == CAPEX_OK || r == CAPEX_ERR_LIMIT);
        if (r != CAPEX_OK) CAPEX_FUZZ_REQUIRE(capex_scaler_discard_iteration(sc) == CAPEX_OK);
        check_state(sc);
    }
}

static void capex_fuzz_scaler_load(const uint8_t *data, size_t size) {
    unsigned char *buf = (unsigned char *)malloc(size ? size : 1);
    capex_state_reader *rd = NULL;
    int p, l;
    if (size) memcpy(buf, data, size);
    capex_fuzz_fixup(buf, size);
    if (capex_state_reader_open_memory(buf, size, 0, NULL, &rd) != CAPEX_OK) {
        CAPEX_FUZZ_REQUIRE(rd == NULL);
        free(buf);
        return;
    }
    for (p = 0; p < 3; p++)
        for (l = 0; l < 3; l++) {
            capex_scaler sc, before;
            capex_result rc;
            live_make(&sc, l);
            memcpy(&before, &sc, sizeof sc);
            rc = capex_scaler_load(&sc, rd, prefixes[p]);
            if (rc != CAPEX_OK) {
                CAPEX_FUZZ_REQUIRE(rc < 0 && capex_last_error()[0] != '\0');
                CAPEX_FUZZ_REQUIRE(memcmp(&sc, &before, sizeof sc) == 0);
            } else {
                CAPEX_FUZZ_REQUIRE(l != 2); /* not inside an iteration */
                check_loaded(&sc);
            }
        }
    capex_state_reader_close(rd);
    free(buf);
}

#ifdef CAPEX_FUZZ_GEN
/* Seeds: scalers with different rules and histories, one or two per file,
   one next to an optimizer, one with its counts just below the bound. Each
   must load and pass the target's checks. */
int main(int argc, char **argv) {
    int v;
    if (argc != 2) { fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
    for (v = 0; v < 5; v++) {
        static const char *const names[5] = {"dynamic", "static", "two_scalers", "with_optim", "bigsteps"};
        capex_state_writer *w = NULL;
        capex_state_reader *rd = NULL;
        capex_scaler sc, sc2;
        capex_scaler_desc d;
        capex_optim_desc od;
        capex_optim *o = NULL;
        capex_optim_param pp;
        float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f};
        unsigned char *buf;
        size_t len = 0;
        char name[64];
        int i;
        capex_scaler_desc_init(&d);
        d.log_interval = 0;
        if (v == 0) { d.hysteresis = 2; d.growth_interval = 4; d.min_scale = 0.0f; d.max_scale = INFINITY; }
        if (v == 1) { d.dynamic = 0; d.init_scale = 1024.0f; }
        CAPEX_FUZZ_REQUIRE(capex_scaler_init(&sc, &d) == CAPEX_OK);
        for (i = 0; i < 11; i++) CAPEX_FUZZ_REQUIRE(iterate(&sc, i % 4 == 2) == CAPEX_OK);
        if (v == 4) {
            capex_scaler_state st;
            capex_scaler_get_state(&sc, &st);
            st.steps = CAPEX_STEP_MAX - 2;
            st.skipped_steps = CAPEX_STEP_MAX - 3;
            CAPEX_FUZZ_REQUIRE(capex_scaler_set_state(&sc, &st) == CAPEX_OK);
        }
        capex_state_writer_create(NULL, &w);
        CAPEX_FUZZ_REQUIRE(capex_scaler_save(&sc, w, v == 1 ? "s." : "scaler.0.") == CAPEX_OK);
        if (v == 2) {
            d.hysteresis = 3;
            d.growth_interval = 2;
            CAPEX_FUZZ_REQUIRE(capex_scaler_init(&sc2, &d) == CAPEX_OK);
            for (i = 0; i < 5; i++) CAPEX_FUZZ_REQUIRE(iterate(&sc2, i == 3) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_scaler_save(&sc2, w, "scaler.1.") == CAPEX_OK);
        }
        if (v == 3) { /* the writer keeps pointers into o, p, g until written */
            capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
            capex_optim_param_init(&pp);
            pp.param = p; pp.grad = g; pp.grad_dtype = CAPEX_F32; pp.numel = 2;
            CAPEX_FUZZ_REQUIRE(capex_optim_create(&od, &o) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_optim_add_group(o, NULL, &pp, 1, NULL) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_optim_step(o, 1.0f, 1.0f, 0) == CAPEX_OK);
            CAPEX_FUZZ_REQUIRE(capex_optim_save(o, w, NULL, CAPEX_OPTIM_STATE_PARAMS) == CAPEX_OK);
        }
        snprintf(name, sizeof name, "%s.safetensors", names[v]);
        buf = capex_fuzz_write_seed(w, argv[1], name, &len);
        capex_state_writer_destroy(w);
        capex_optim_destroy(o);
        live_make(&sc2, 0);
        CAPEX_FUZZ_REQUIRE(capex_state_reader_open_memory(buf, len, 0, NULL, &rd) == CAPEX_OK);
        CAPEX_FUZZ_REQUIRE(capex_scaler_load(&sc2, rd, v == 1 ? "s." : "scaler.0.") == CAPEX_OK);
        capex_state_reader_close(rd);
        check_loaded(&sc2);
        capex_fuzz_scaler_load(buf, len);
        free(buf);
    }
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    capex_fuzz_scaler_load(data, size);
    return 0;
}
#endif
