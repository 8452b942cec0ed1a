/* Opt levels O0-O3: every level's defaults for fp16 and bf16; every override
   at every level, alone and in every combination (3^6 per level and half
   type), against an independent model of Apex's rules written here from
   apex/amp/frontend.py; the rule named in each rejection; the report text;
   the O1 cast policy for every op class at every level and by every name in
   Apex's lists; the parsers with good and bad strings; NULL and
   out-of-range arguments everywhere. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include <locale.h>
#include <math.h>

static const capex_opt_level LEVELS[4] = {CAPEX_O0, CAPEX_O1, CAPEX_O2, CAPEX_O3};
static const capex_dtype HALVES[2] = {CAPEX_F16, CAPEX_BF16};

/* Fills a config with a byte pattern, to show a failing call left it alone. */
static void poison(capex_amp_config *c) { memset(c, 0xA5, sizeof *c); }
static int is_poisoned(const capex_amp_config *c) {
    const unsigned char *p = (const unsigned char *)c;
    size_t i;
    for (i = 0; i < sizeof *c; i++) if (p[i] != 0xA5) return 0;
    return 1;
}

/* ---- independent model of Apex -------------------------------------------- */

typedef struct model_props {
    int enabled, cast, patch, bn, master, ls_mode;
    double ls;
} model_props;

/* Apex O0..O3.__call__ (frontend.py), written out as a table; bf16 turns a
   dynamic default into 1.0 (capex). */
static model_props model_defaults(int level, capex_dtype half) {
    model_props p;
    static const int t[4][5] = {
        /* cast                       patch bn              master           dynamic */
        {CAPEX_CAST_MODEL_FLOAT32, 0, CAPEX_TRI_NONE, CAPEX_TRI_FALSE, 0},
        {CAPEX_CAST_MODEL_NONE, 1, CAPEX_TRI_NONE, CAPEX_TRI_NONE, 1},
        {CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_TRUE, CAPEX_TRI_TRUE, 1},
        {CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_FALSE, CAPEX_TRI_FALSE, 0}};
    p.enabled = 1;
    p.cast = t[level][0];
    p.patch = t[level][1];
    p.bn = t[level][2];
    p.master = t[level][3];
    p.ls_mode = t[level][4] && half == CAPEX_F16 ? CAPEX_LOSS_SCALE_DYNAMIC : CAPEX_LOSS_SCALE_STATIC;
    p.ls = p.ls_mode == CAPEX_LOSS_SCALE_DYNAMIC ? 0.0 : 1.0;
    return p;
}

/* Which rule an override set breaks (Apex's __setattr__ order), or NULL. */
static const char *model_rule(int level, const capex_amp_overrides *ov) {
    if (ov->enabled == CAPEX_TRI_FALSE) return NULL; /* Apex returns before any check */
    if (level == 1 && ov->cast_model_type == CAPEX_CAST_MODEL_HALF) return "rule: cast_model_type must be None or float32 under O1";
    if (level != 1 && ov->patch_torch_functions == CAPEX_TRI_TRUE) return "rule: patch_torch_functions=True only with O1";
    if (level == 1 && ov->keep_batchnorm_fp32 != CAPEX_TRI_NONE) return "rule: keep_batchnorm_fp32 must be None under O1";
    if (level == 1 && ov->master_weights != CAPEX_TRI_NONE) return "rule: master_weights must be None under O1";
    return NULL;
}

static model_props model_apply(int level, capex_dtype half, const capex_amp_overrides *ov) {
    model_props p = model_defaults(level, half);
    if (ov->enabled == CAPEX_TRI_FALSE) {
        /* Apex's Properties() as constructed */
        p.enabled = 0; p.cast = CAPEX_CAST_MODEL_NONE; p.patch = 0; p.bn = CAPEX_TRI_NONE;
        p.master = CAPEX_TRI_NONE; p.ls_mode = CAPEX_LOSS_SCALE_STATIC; p.ls = 1.0;
        return p;
    }
    if (ov->cast_model_type) p.cast = ov->cast_model_type;
    if (ov->patch_torch_functions) p.patch = ov->patch_torch_functions == CAPEX_TRI_TRUE;
    if (ov->keep_batchnorm_fp32) p.bn = ov->keep_batchnorm_fp32;
    if (ov->master_weights) p.master = ov->master_weights;
    if (ov->loss_scale_mode) {
        p.ls_mode = ov->loss_scale_mode;
        p.ls = ov->loss_scale_mode == CAPEX_LOSS_SCALE_STATIC ? ov->loss_scale : 0.0;
    }
    return p;
}

/* 0 if cfg matches the model, else a line number-ish code for the message. */
static int config_differs(const capex_amp_config *c, int level, capex_dtype half, const model_props *p) {
    int halfmodel = p->enabled && p->cast == CAPEX_CAST_MODEL_HALF;
    capex_dtype model = halfmodel ? half : CAPEX_F32;
    capex_dtype bn = halfmodel && p->bn == CAPEX_TRI_TRUE ? CAPEX_F32 : model;
    if (c->enabled != p->enabled) return 1;
    if ((int)c->opt_level != level) return 2;
    if (c->half_type != half) return 3;
    if ((int)c->cast_model_type != p->cast) return 4;
    if (c->patch_torch_functions != p->patch) return 5;
    if ((int)c->keep_batchnorm_fp32 != p->bn) return 6;
    if ((int)c->master_weights != p->master) return 7;
    if ((int)c->loss_scale_mode != p->ls_mode) return 8;
    if (c->loss_scale != p->ls) return 9;
    if (c->model_dtype != model) return 10;
    if (c->batchnorm_dtype != bn) return 11;
    if (c->use_master_weights != (p->enabled && p->master == CAPEX_TRI_TRUE)) return 12;
    return 0;
}

/* ---- defaults ------------------------------------------------------------- */

CT_TEST(defaults_each_level_fp16_bf16) {
    /* Literal expectations (not the model): Apex's table, bf16 rule. */
    static const struct {
        int level; capex_dtype half; capex_cast_model cast; int patch; capex_tri bn, master;
        capex_loss_scale_mode mode; double ls; capex_dtype model, bnd; int mw;
    } want[8] = {
        {0, CAPEX_F16, CAPEX_CAST_MODEL_FLOAT32, 0, CAPEX_TRI_NONE, CAPEX_TRI_FALSE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_F32, CAPEX_F32, 0},
        {1, CAPEX_F16, CAPEX_CAST_MODEL_NONE, 1, CAPEX_TRI_NONE, CAPEX_TRI_NONE, CAPEX_LOSS_SCALE_DYNAMIC, 0.0, CAPEX_F32, CAPEX_F32, 0},
        {2, CAPEX_F16, CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_TRUE, CAPEX_TRI_TRUE, CAPEX_LOSS_SCALE_DYNAMIC, 0.0, CAPEX_F16, CAPEX_F32, 1},
        {3, CAPEX_F16, CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_FALSE, CAPEX_TRI_FALSE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_F16, CAPEX_F16, 0},
        {0, CAPEX_BF16, CAPEX_CAST_MODEL_FLOAT32, 0, CAPEX_TRI_NONE, CAPEX_TRI_FALSE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_F32, CAPEX_F32, 0},
        {1, CAPEX_BF16, CAPEX_CAST_MODEL_NONE, 1, CAPEX_TRI_NONE, CAPEX_TRI_NONE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_F32, CAPEX_F32, 0},
        {2, CAPEX_BF16, CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_TRUE, CAPEX_TRI_TRUE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_BF16, CAPEX_F32, 1},
        {3, CAPEX_BF16, CAPEX_CAST_MODEL_HALF, 0, CAPEX_TRI_FALSE, CAPEX_TRI_FALSE, CAPEX_LOSS_SCALE_STATIC, 1.0, CAPEX_BF16, CAPEX_BF16, 0},
    };
    int i;
    for (i = 0; i < 8; i++) {
        capex_amp_config c, c2;
        capex_amp_overrides ov;
        poison(&c);
        CT_CHECK(capex_amp_resolve((capex_opt_level)want[i].level, want[i].half, NULL, &c) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(c.enabled == 1 && (int)c.opt_level == want[i].level && c.half_type == want[i].half, "case %d", i);
        CT_CHECK(c.cast_model_type == want[i].cast && c.patch_torch_functions == want[i].patch, "case %d", i);
        CT_CHECK(c.keep_batchnorm_fp32 == want[i].bn && c.master_weights == want[i].master, "case %d", i);
        CT_CHECK(c.loss_scale_mode == want[i].mode && c.loss_scale == want[i].ls, "case %d", i);
        CT_CHECK(c.model_dtype == want[i].model && c.batchnorm_dtype == want[i].bnd && c.use_master_weights == want[i].mw, "case %d", i);
        /* no overrides == all-None overrides; zeroed overrides are refused (one rule for descriptors) */
        capex_amp_overrides_init(&ov);
        CT_CHECK(capex_amp_resolve((capex_opt_level)want[i].level, want[i].half, &ov, &c2) == CAPEX_OK, "%s", capex_last_error());
        {
            model_props m = model_defaults(want[i].level, want[i].half);
            CT_CHECK(config_differs(&c, want[i].level, want[i].half, &m) == 0, "case %d: model disagrees", i);
            CT_CHECK(config_differs(&c2, want[i].level, want[i].half, &m) == 0, "case %d: all-None overrides differ", i);
            memset(&ov, 0, sizeof ov);
            CT_CHECK(capex_amp_resolve((capex_opt_level)want[i].level, want[i].half, &ov, &c2) == CAPEX_ERR_INVALID_ARG,
                     "zeroed overrides accepted");
            CT_CHECK(strstr(capex_last_error(), "capex_amp_overrides_init") != NULL, "%s", capex_last_error());
        }
    }
}

/* ---- overrides ------------------------------------------------------------ */

enum { P_ENABLED, P_CAST, P_PATCH, P_BN, P_MASTER, P_LOSS };
static void set_override(capex_amp_overrides *ov, int prop, int value, double ls) {
    switch (prop) {
    case P_ENABLED: ov->enabled = (capex_tri)value; break;
    case P_CAST: ov->cast_model_type = (capex_cast_model)value; break;
    case P_PATCH: ov->patch_torch_functions = (capex_tri)value; break;
    case P_BN: ov->keep_batchnorm_fp32 = (capex_tri)value; break;
    case P_MASTER: ov->master_weights = (capex_tri)value; break;
    default: ov->loss_scale_mode = (capex_loss_scale_mode)value; ov->loss_scale = ls; break;
    }
}

/* Every single override that Apex accepts a value for, at every level, with
   the outcome written out by hand: '1' allowed, '0' rejected (O0 O1 O2 O3). */
CT_TEST(every_single_override_allowed_or_forbidden) {
    static const struct { const char *what; int prop, value; double ls; const char *ok; const char *rule; } t[] = {
        {"enabled=True", P_ENABLED, CAPEX_TRI_TRUE, 0, "1111", NULL},
        {"enabled=False", P_ENABLED, CAPEX_TRI_FALSE, 0, "1111", NULL},
        {"cast_model_type=float32", P_CAST, CAPEX_CAST_MODEL_FLOAT32, 0, "1111", NULL},
        {"cast_model_type=half", P_CAST, CAPEX_CAST_MODEL_HALF, 0, "1011", "rule: cast_model_type must be None or float32 under O1"},
        {"patch_torch_functions=False", P_PATCH, CAPEX_TRI_FALSE, 0, "1111", NULL},
        {"patch_torch_functions=True", P_PATCH, CAPEX_TRI_TRUE, 0, "0100", "rule: patch_torch_functions=True only with O1"},
        {"keep_batchnorm_fp32=False", P_BN, CAPEX_TRI_FALSE, 0, "1011", "rule: keep_batchnorm_fp32 must be None under O1"},
        {"keep_batchnorm_fp32=True", P_BN, CAPEX_TRI_TRUE, 0, "1011", "rule: keep_batchnorm_fp32 must be None under O1"},
        {"master_weights=False", P_MASTER, CAPEX_TRI_FALSE, 0, "1011", "rule: master_weights must be None under O1"},
        {"master_weights=True", P_MASTER, CAPEX_TRI_TRUE, 0, "1011", "rule: master_weights must be None under O1"},
        {"loss_scale=dynamic", P_LOSS, CAPEX_LOSS_SCALE_DYNAMIC, 0, "1111", NULL},
        {"loss_scale=128.0", P_LOSS, CAPEX_LOSS_SCALE_STATIC, 128.0, "1111", NULL},
        {"loss_scale=1.0", P_LOSS, CAPEX_LOSS_SCALE_STATIC, 1.0, "1111", NULL},
        {"loss_scale=0.5", P_LOSS, CAPEX_LOSS_SCALE_STATIC, 0.5, "1111", NULL},
    };
    size_t i;
    int l, h, allowed = 0, forbidden = 0;
    for (i = 0; i < sizeof t / sizeof t[0]; i++)
        for (l = 0; l < 4; l++)
            for (h = 0; h < 2; h++) {
                capex_amp_overrides ov;
                capex_amp_config c;
                capex_result r;
                capex_amp_overrides_init(&ov);
                set_override(&ov, t[i].prop, t[i].value, t[i].ls);
                poison(&c);
                capex_clear_error();
                r = capex_amp_resolve(LEVELS[l], HALVES[h], &ov, &c);
                if (t[i].ok[l] == '1') {
                    model_props m = model_apply(l, HALVES[h], &ov);
                    int d = config_differs(&c, l, HALVES[h], &m);
                    CT_CHECK(r == CAPEX_OK, "O%d %s %s must be allowed: %s", l, capex_dtype_name(HALVES[h]), t[i].what, capex_last_error());
                    CT_CHECK(d == 0, "O%d %s %s: field %d wrong", l, capex_dtype_name(HALVES[h]), t[i].what, d);
                    allowed++;
                } else {
                    CT_CHECK(r == CAPEX_ERR_CONFIG, "O%d %s must be rejected, got %s", l, t[i].what, capex_result_string(r));
                    CT_CHECK(strstr(capex_last_error(), t[i].rule) != NULL, "O%d %s: message '%s' lacks '%s'", l, t[i].what,
                             capex_last_error(), t[i].rule);
                    CT_CHECK(is_poisoned(&c), "O%d %s: out written on failure", l, t[i].what);
                    forbidden++;
                }
            }
    CT_CHECK(allowed == 2 * 48 && forbidden == 2 * 8, "counted %d allowed, %d forbidden", allowed, forbidden);
}

/* Every combination of every override value (3^6 per level and half type,
   loss_scale as None/dynamic/128) against the model: allowed exactly when no
   rule is broken, the first broken rule (Apex's order) named, fields right. */
CT_TEST(every_override_combination_matches_model) {
    int l, h, code, n_ok = 0, n_bad = 0;
    for (l = 0; l < 4; l++)
        for (h = 0; h < 2; h++)
            for (code = 0; code < 729; code++) {
                capex_amp_overrides ov;
                capex_amp_config c;
                capex_result r;
                const char *rule;
                int k = code;
                capex_amp_overrides_init(&ov);
                ov.enabled = (capex_tri)(k % 3); k /= 3;
                ov.cast_model_type = (capex_cast_model)(k % 3); k /= 3;
                ov.patch_torch_functions = (capex_tri)(k % 3); k /= 3;
                ov.keep_batchnorm_fp32 = (capex_tri)(k % 3); k /= 3;
                ov.master_weights = (capex_tri)(k % 3); k /= 3;
                ov.loss_scale_mode = (capex_loss_scale_mode)(k % 3);
                ov.loss_scale = 128.0;
                rule = model_rule(l, &ov);
                poison(&c);
                r = capex_amp_resolve(LEVELS[l], HALVES[h], &ov, &c);
                if (!rule) {
                    model_props m = model_apply(l, HALVES[h], &ov);
                    int d = config_differs(&c, l, HALVES[h], &m);
                    CT_CHECK(r == CAPEX_OK, "O%d combination %d: %s", l, code, capex_last_error());
                    CT_CHECK(d == 0, "O%d combination %d: field %d wrong", l, code, d);
                    n_ok++;
                } else {
                    CT_CHECK(r == CAPEX_ERR_CONFIG && strstr(capex_last_error(), rule), "O%d combination %d: want '%s', got %s '%s'", l,
                             code, rule, capex_result_string(r), capex_last_error());
                    CT_CHECK(is_poisoned(&c), "O%d combination %d: out written on failure", l, code);
                    n_bad++;
                }
            }
    CT_CHECK(n_ok > 0 && n_bad > 0 && n_ok + n_bad == 4 * 2 * 729, "%d %d", n_ok, n_bad);
}

CT_TEST(bf16_loss_scale_override_wins) {
    capex_amp_overrides ov;
    capex_amp_config c;
    capex_amp_overrides_init(&ov);
    ov.loss_scale_mode = CAPEX_LOSS_SCALE_DYNAMIC;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_BF16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(c.loss_scale_mode == CAPEX_LOSS_SCALE_DYNAMIC && c.loss_scale == 0.0, "explicit dynamic must stay dynamic with bf16");
    ov.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
    ov.loss_scale = 1024.0;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_BF16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(c.loss_scale_mode == CAPEX_LOSS_SCALE_STATIC && c.loss_scale == 1024.0, "static override");
}

CT_TEST(disabled_is_inert_and_skips_rules) {
    capex_amp_overrides ov;
    capex_amp_config c;
    capex_cast_policy p;
    int op;
    capex_amp_overrides_init(&ov);
    ov.enabled = CAPEX_TRI_FALSE;
    ov.keep_batchnorm_fp32 = CAPEX_TRI_TRUE; /* would break an O1 rule if enabled */
    ov.patch_torch_functions = CAPEX_TRI_TRUE;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(!c.enabled && !c.patch_torch_functions && c.model_dtype == CAPEX_F32 && !c.use_master_weights, "inert");
    CT_CHECK(c.loss_scale_mode == CAPEX_LOSS_SCALE_STATIC && c.loss_scale == 1.0, "Apex Properties() loss_scale 1.0");
    for (op = 0; op < CAPEX_OP_COUNT; op++) {
        CT_CHECK(capex_amp_cast_op(&c, (capex_op_class)op, &p) == CAPEX_OK && p == CAPEX_CAST_NONE, "op %d", op);
    }
    /* bad values are still bad when disabled */
    ov.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
    ov.loss_scale = NAN;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, &ov, &c) == CAPEX_ERR_INVALID_ARG, "NaN accepted");
}

CT_TEST(bad_arguments_rejected) {
    static const double bad_ls[] = {0.0, -1.0, -0.0, 1e39, 1e-39};
    capex_amp_overrides ov;
    capex_amp_config c;
    size_t i;
    capex_amp_overrides_init(NULL); /* ignored, no crash */
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    poison(&c);
    CT_CHECK(capex_amp_resolve((capex_opt_level)4, CAPEX_F16, NULL, &c) == CAPEX_ERR_INVALID_ARG, "level 4");
    CT_CHECK(capex_amp_resolve((capex_opt_level)-1, CAPEX_F16, NULL, &c) == CAPEX_ERR_INVALID_ARG, "level -1");
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F32, NULL, &c) == CAPEX_ERR_INVALID_ARG, "half F32");
    CT_CHECK(strstr(capex_last_error(), "CAPEX_F16 or CAPEX_BF16") != NULL, "%s", capex_last_error());
    CT_CHECK(capex_amp_resolve(CAPEX_O1, (capex_dtype)7, NULL, &c) == CAPEX_ERR_INVALID_ARG, "half 7");
    for (i = 0; i < 6; i++) {
        capex_amp_overrides_init(&ov);
        if (i == 0) ov.enabled = (capex_tri)3;
        if (i == 1) ov.cast_model_type = (capex_cast_model)3;
        if (i == 2) ov.patch_torch_functions = (capex_tri)-1;
        if (i == 3) ov.keep_batchnorm_fp32 = (capex_tri)9;
        if (i == 4) ov.master_weights = (capex_tri)3;
        if (i == 5) ov.loss_scale_mode = (capex_loss_scale_mode)3;
        CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_ERR_INVALID_ARG, "field %d", (int)i);
    }
    capex_amp_overrides_init(&ov);
    ov.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
    ov.loss_scale = NAN;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "NaN"), "NaN");
    ov.loss_scale = INFINITY;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_ERR_INVALID_ARG, "inf");
    for (i = 0; i < sizeof bad_ls / sizeof bad_ls[0]; i++) {
        ov.loss_scale = bad_ls[i];
        CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_ERR_INVALID_ARG, "loss_scale %g accepted", bad_ls[i]);
    }
    CT_CHECK(is_poisoned(&c), "out written on failure");
    /* the edges of float32's normal range are fine; a NaN is ignored when not STATIC */
    ov.loss_scale = 3.4028234663852886e38;
    CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_OK, "FLT_MAX");
    ov.loss_scale = 1.1754943508222875e-38;
    CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_OK, "FLT_MIN");
    ov.loss_scale_mode = CAPEX_LOSS_SCALE_DYNAMIC;
    ov.loss_scale = NAN;
    CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_OK && c.loss_scale == 0.0, "dynamic ignores value");
}

/* ---- report --------------------------------------------------------------- */

/* Expected text made with Python's "{:22} : {}".format, i.e. Apex's own
   formatting, plus capex's half_type row. */
static const char *REPORT_O2 =
    "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n"
    "Defaults for this optimization level are:\n"
    "enabled                : True\n"
    "opt_level              : O2\n"
    "cast_model_type        : torch.float16\n"
    "patch_torch_functions  : False\n"
    "keep_batchnorm_fp32    : True\n"
    "master_weights         : True\n"
    "loss_scale             : dynamic\n"
    "half_type              : torch.float16\n"
    "Processing user overrides (additional kwargs that are not None)...\n"
    "After processing overrides, optimization options are:\n"
    "enabled                : True\n"
    "opt_level              : O2\n"
    "cast_model_type        : torch.float16\n"
    "patch_torch_functions  : False\n"
    "keep_batchnorm_fp32    : False\n"
    "master_weights         : True\n"
    "loss_scale             : 128.0\n"
    "half_type              : torch.float16\n";

CT_TEST(report_text_matches_apex) {
    capex_amp_overrides ov;
    capex_amp_config c;
    char buf[4096], small[40];
    size_t need = 0, n2 = 0;
    capex_amp_overrides_init(&ov);
    ov.keep_batchnorm_fp32 = CAPEX_TRI_FALSE;
    CT_CHECK(capex_loss_scale_parse("128.0", &ov.loss_scale_mode, &ov.loss_scale) == CAPEX_OK, "parse");
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
    memset(buf, 'x', sizeof buf);
    CT_CHECK(capex_amp_report(&c, buf, sizeof buf, &need) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(strcmp(buf, REPORT_O2) == 0, "report differs:\n%s", buf);
    CT_CHECK(need == strlen(REPORT_O2), "needed %lu", (unsigned long)need);
    /* size query, exact fit, one byte short */
    CT_CHECK(capex_amp_report(&c, NULL, 0, &n2) == CAPEX_ERR_LIMIT && n2 == need, "size query");
    CT_CHECK(capex_amp_report(&c, buf, need + 1, NULL) == CAPEX_OK && strcmp(buf, REPORT_O2) == 0, "exact fit");
    memset(small, 'x', sizeof small);
    CT_CHECK(capex_amp_report(&c, small, sizeof small, &n2) == CAPEX_ERR_LIMIT && n2 == need, "truncation");
    CT_CHECK(small[sizeof small - 1] == '\0' && strncmp(small, REPORT_O2, sizeof small - 1) == 0, "prefix");
    CT_CHECK(capex_amp_report(&c, NULL, 5, NULL) == CAPEX_ERR_INVALID_ARG, "NULL buf with cap");
    CT_CHECK(capex_amp_report(NULL, buf, sizeof buf, NULL) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
}

CT_TEST(report_titles_bf16_and_disabled) {
    static const char *titles[4][2] = {
        {"Selected optimization level O0:  Pure FP32 training.\n", "Selected optimization level O0:  Pure FP32 training.\n"},
        {"Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n",
         "Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"},
        {"Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n",
         "Selected optimization level O2:  BF16 training with FP32 batchnorm and FP32 master weights.\n"},
        {"Selected optimization level O3:  Pure FP16 training.\n", "Selected optimization level O3:  Pure BF16 training.\n"}};
    capex_amp_overrides ov;
    capex_amp_config c;
    char buf[4096];
    int l, h;
    for (l = 0; l < 4; l++)
        for (h = 0; h < 2; h++) {
            const char *note = "(bf16: loss_scale defaults to 1.0 instead of dynamic";
            CT_CHECK(capex_amp_resolve(LEVELS[l], HALVES[h], NULL, &c) == CAPEX_OK, "resolve");
            CT_CHECK(capex_amp_report(&c, buf, sizeof buf, NULL) == CAPEX_OK, "%s", capex_last_error());
            CT_CHECK(strncmp(buf, titles[l][h], strlen(titles[l][h])) == 0, "O%d h%d title: %s", l, h, buf);
            CT_CHECK(!strstr(buf, note) == !(h == 1 && (l == 1 || l == 2)), "O%d h%d bf16 note", l, h);
            CT_CHECK(strstr(buf, h ? "half_type              : torch.bfloat16\n" : "half_type              : torch.float16\n"), "half row");
        }
    CT_CHECK(strstr(buf, "cast_model_type        : torch.bfloat16\n") != NULL, "O3 bf16 cast row");
    capex_amp_overrides_init(&ov);
    ov.enabled = CAPEX_TRI_FALSE;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_OK, "resolve");
    CT_CHECK(capex_amp_report(&c, buf, sizeof buf, NULL) == CAPEX_OK, "report");
    CT_CHECK(strncmp(buf, "Amp disabled (enabled=False)", 28) == 0 && !strstr(buf, "Defaults for"), "%s", buf);
    CT_CHECK(strstr(buf, "enabled                : False\n") && strstr(buf, "loss_scale             : 1.0\n"), "%s", buf);
}

/* loss_scale prints as Python's repr(float) (values from python3). */
CT_TEST(report_loss_scale_like_python_repr) {
    static const struct { double v; const char *s; } t[] = {
        {1.0, "1.0"}, {128.0, "128.0"}, {0.5, "0.5"}, {1e-5, "1e-05"}, {16777216.0, "16777216.0"},
        {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {0.1, "0.1"}, {3.4028234663852886e+38, "3.4028234663852886e+38"},
        {1.1754943508222875e-38, "1.1754943508222875e-38"}, {65536.0, "65536.0"}, {0.0001, "0.0001"},
        {123456.789, "123456.789"}, {9.5367431640625e-07, "9.5367431640625e-07"}, {1.5e-5, "1.5e-05"}, {2.5e20, "2.5e+20"}};
    size_t i;
    for (i = 0; i < sizeof t / sizeof t[0]; i++) {
        capex_amp_overrides ov;
        capex_amp_config c;
        char buf[4096], want[96];
        const char *last;
        capex_amp_overrides_init(&ov);
        ov.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
        ov.loss_scale = t[i].v;
        CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_OK, "%s", capex_last_error());
        CT_CHECK(capex_amp_report(&c, buf, sizeof buf, NULL) == CAPEX_OK, "report");
        snprintf(want, sizeof want, "loss_scale             : %s\n", t[i].s);
        last = strstr(buf, "After processing");
        CT_CHECK(last && strstr(last, want), "want '%s' in:\n%s", t[i].s, last ? last : buf);
    }
}

static char log_lines[64][160];
static int log_n, log_levels_ok;
static void capture(capex_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level != CAPEX_LOG_INFO) log_levels_ok = 0;
    if (log_n < 64) snprintf(log_lines[log_n], sizeof log_lines[0], "%s", msg);
    log_n++;
}

CT_TEST(log_report_one_info_message_per_line) {
    capex_amp_config c;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, NULL, &c) == CAPEX_OK, "resolve");
    log_n = 0;
    log_levels_ok = 1;
    capex_set_log_callback(capture, NULL);
    capex_set_log_level(CAPEX_LOG_INFO);
    CT_CHECK(capex_amp_log_report(&c) == CAPEX_OK, "log");
    capex_set_log_level(CAPEX_LOG_WARN);
    capex_set_log_callback(NULL, NULL);
    CT_CHECK(log_n == 20 && log_levels_ok, "%d lines", log_n);
    CT_CHECK(strcmp(log_lines[0], "Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.") == 0,
             "%s", log_lines[0]);
    CT_CHECK(strcmp(log_lines[19], "half_type              : torch.float16") == 0, "%s", log_lines[19]);
    CT_CHECK(capex_amp_log_report(NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
}

/* ---- cast policy ---------------------------------------------------------- */

#define H CAPEX_CAST_HALF
#define F CAPEX_CAST_FP32
#define P CAPEX_CAST_PROMOTE
#define N CAPEX_CAST_NONE
/* O1's policy per class, in enum order, written out by hand. */
static const capex_cast_policy O1_POLICY[CAPEX_OP_COUNT] = {
    H, H, H, H, H, H, H, H,                            /* matmul .. prelu */
    F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, F, /* softmax .. interpolate */
    P, P, P, P, P, P, P, P, P, P, P,                   /* add .. pairwise */
    N};                                                /* other */

CT_TEST(cast_policy_every_op_every_level) {
    int l, h, op;
    CT_CHECK(O1_POLICY[CAPEX_OP_PRELU] == H && O1_POLICY[CAPEX_OP_INTERPOLATE] == F && O1_POLICY[CAPEX_OP_PAIRWISE] == P, "table layout");
    for (l = 0; l < 4; l++)
        for (h = 0; h < 2; h++) {
            capex_amp_config c;
            CT_CHECK(capex_amp_resolve(LEVELS[l], HALVES[h], NULL, &c) == CAPEX_OK, "resolve");
            for (op = 0; op < CAPEX_OP_COUNT; op++) {
                capex_cast_policy p = (capex_cast_policy)99, want;
                capex_dtype d = (capex_dtype)99, dw;
                int in;
                want = l == 1 ? O1_POLICY[op] : N; /* O2's batch norm too: see keep_batchnorm_fp32_keeps_activations_half */
                CT_CHECK(capex_amp_cast_op(&c, (capex_op_class)op, &p) == CAPEX_OK, "%s", capex_last_error());
                CT_CHECK(p == want, "O%d %s %s: got %s want %s", l, capex_dtype_name(HALVES[h]), capex_op_class_name((capex_op_class)op),
                         capex_cast_policy_name(p), capex_cast_policy_name(want));
                for (in = 0; in < 3; in++) {
                    dw = want == H ? HALVES[h] : want == F ? CAPEX_F32 : (capex_dtype)in;
                    CT_CHECK(capex_amp_op_dtype(&c, (capex_op_class)op, (capex_dtype)in, &d) == CAPEX_OK && d == dw,
                             "O%d op %d input %d: dtype %d want %d", l, op, in, (int)d, (int)dw);
                }
            }
        }
}

CT_TEST(cast_policy_follows_overrides) {
    capex_amp_overrides ov;
    capex_amp_config c;
    capex_cast_policy p;
    int op;
    /* O1 without patching: nothing is cast (Apex skips amp_init) */
    capex_amp_overrides_init(&ov);
    ov.patch_torch_functions = CAPEX_TRI_FALSE;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, &ov, &c) == CAPEX_OK, "resolve");
    for (op = 0; op < CAPEX_OP_COUNT; op++)
        CT_CHECK(capex_amp_cast_op(&c, (capex_op_class)op, &p) == CAPEX_OK && p == N, "O1 unpatched op %d", op);
    /* O2 with keep_batchnorm_fp32=False: batchnorm is half like the rest */
    capex_amp_overrides_init(&ov);
    ov.keep_batchnorm_fp32 = CAPEX_TRI_FALSE;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_BF16, &ov, &c) == CAPEX_OK, "resolve");
    CT_CHECK(c.batchnorm_dtype == CAPEX_BF16, "bn dtype");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) == CAPEX_OK && p == N, "O2 bn=False");
    /* O3 with keep_batchnorm_fp32=True (an Apex example) and O0 cast to half with it */
    ov.keep_batchnorm_fp32 = CAPEX_TRI_TRUE;
    CT_CHECK(capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c) == CAPEX_OK, "resolve");
    CT_CHECK(c.batchnorm_dtype == CAPEX_F32, "O3 bn=True: bn params fp32");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) == CAPEX_OK && p == N, "O3 bn=True: activations as they are");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_LAYER_NORM, &p) == CAPEX_OK && p == N, "O3 layer norm");
    ov.cast_model_type = CAPEX_CAST_MODEL_HALF;
    CT_CHECK(capex_amp_resolve(CAPEX_O0, CAPEX_F16, &ov, &c) == CAPEX_OK, "resolve");
    CT_CHECK(c.model_dtype == CAPEX_F16 && c.batchnorm_dtype == CAPEX_F32, "O0 cast to half, bn fp32");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) == CAPEX_OK && p == N, "O0 half bn=True");
    /* O2 with master weights off, cast float32: fp32 model */
    capex_amp_overrides_init(&ov);
    ov.master_weights = CAPEX_TRI_FALSE;
    ov.cast_model_type = CAPEX_CAST_MODEL_FLOAT32;
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, &ov, &c) == CAPEX_OK, "resolve");
    CT_CHECK(c.model_dtype == CAPEX_F32 && c.batchnorm_dtype == CAPEX_F32 && !c.use_master_weights, "O2 fp32");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) == CAPEX_OK && p == N, "fp32 model bn");
}

/* keep_batchnorm_fp32 keeps the batchnorm layers' parameters fp32, not their
   activations: Apex's O2 patches no function, and cuDNN's batch norm takes a
   half x with fp32 weight/bias/running stats and returns a half y. So in an
   O2 or O3 net conv -> batch norm -> conv every op stays in the half type
   (were y fp32, the next conv would run in fp32 against half weights). */
CT_TEST(keep_batchnorm_fp32_keeps_activations_half) {
    static const struct { capex_opt_level lv; capex_dtype half; capex_tri bn; } k[] = {
        {CAPEX_O2, CAPEX_F16, CAPEX_TRI_NONE}, {CAPEX_O2, CAPEX_BF16, CAPEX_TRI_NONE},
        {CAPEX_O3, CAPEX_F16, CAPEX_TRI_TRUE}, {CAPEX_O3, CAPEX_BF16, CAPEX_TRI_FALSE}};
    size_t i;
    for (i = 0; i < sizeof k / sizeof *k; i++) {
        capex_amp_overrides ov;
        capex_amp_config c;
        capex_cast_policy p = (capex_cast_policy)99;
        capex_dtype x = k[i].half, y = (capex_dtype)99, z = (capex_dtype)99;
        capex_amp_overrides_init(&ov);
        ov.keep_batchnorm_fp32 = k[i].bn;
        CT_CHECK(capex_amp_resolve(k[i].lv, k[i].half, &ov, &c) == CAPEX_OK, "resolve: %s", capex_last_error());
        CT_CHECK(c.model_dtype == k[i].half, "case %zu: half model", i);
        CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) == CAPEX_OK && p == N,
                 "case %zu: batch norm policy %s, want none (no function is patched)", i, capex_cast_policy_name(p));
        CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_BATCH_NORM, x, &y) == CAPEX_OK && y == x,
                 "case %zu: batch norm y %s, want the input's %s", i, capex_dtype_name(y), capex_dtype_name(x));
        CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_CONV, y, &z) == CAPEX_OK && z == k[i].half,
                 "case %zu: the conv after it runs in %s", i, capex_dtype_name(z));
    }
}

/* Every name in Apex's lists/{functional,torch,tensor}_overrides.py, by list. */
CT_TEST(cast_policy_by_apex_names) {
    static const char *fp16[] = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                                 "conv_tbc", "linear", "prelu", "addmm", "addmv", "addr", "matmul", "mm", "mv", "addbmm",
                                 "baddbmm", "bmm", "__matmul__"};
    static const char *fp32[] = {"interpolate", "softplus", "softmin", "log_softmax", "softmax", "layer_norm", "group_norm",
                                 "local_response_norm", "normalize", "cosine_similarity", "poisson_nll_loss",
                                 "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss", "kl_div", "l1_loss",
                                 "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
                                 "multi_margin_loss", "nll_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss",
                                 "soft_margin_loss", "triplet_margin_loss", "acos", "asin", "cosh", "erfinv", "exp", "expm1",
                                 "log", "log10", "log2", "reciprocal", "rsqrt", "sinh", "tan", "pow", "cumprod", "cumsum",
                                 "dist", "norm", "prod", "std", "sum", "var", "renorm", "__ipow__", "__pow__", "__rpow__",
                                 /* capex additions */
                                 "mean", "batch_norm", "instance_norm", "rms_norm", "log1p", "binary_cross_entropy"};
    static const char *promote[] = {"addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot", "add", "div", "mul", "eq",
                                    "equal", "ge", "gt", "le", "lt", "ne", "cat", "stack", "__add__", "__div__", "__eq__",
                                    "__ge__", "__gt__", "__iadd__", "__idiv__", "__imul__", "__isub__", "__itruediv__",
                                    "__le__", "__lt__", "__mul__", "__ne__", "__radd__", "__rdiv__", "__rmul__", "__rsub__",
                                    "__sub__", "__truediv__", "__rtruediv__", "sub", "index_copy"};
    static const char *other[] = {"relu", "gelu", "silu", "tanh", "sigmoid", "dropout", "embedding"};
    const char **lists[4] = {fp16, fp32, promote, other};
    size_t lens[4] = {sizeof fp16 / sizeof *fp16, sizeof fp32 / sizeof *fp32, sizeof promote / sizeof *promote, sizeof other / sizeof *other};
    capex_cast_policy want[4] = {H, F, P, N};
    capex_amp_config c1, c2;
    capex_cast_policy p;
    int k, op;
    size_t i;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_BF16, NULL, &c1) == CAPEX_OK, "resolve");
    CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_BF16, NULL, &c2) == CAPEX_OK, "resolve");
    for (k = 0; k < 4; k++)
        for (i = 0; i < lens[k]; i++) {
            capex_op_class oc;
            CT_CHECK(capex_op_class_from_name(lists[k][i], &oc) == CAPEX_OK, "%s: %s", lists[k][i], capex_last_error());
            CT_CHECK(capex_amp_cast_op_name(&c1, lists[k][i], &p) == CAPEX_OK && p == want[k], "O1 %s: %s", lists[k][i],
                     capex_cast_policy_name(p));
            CT_CHECK(capex_amp_cast_op_name(&c2, lists[k][i], &p) == CAPEX_OK && p == N, "O2 %s", lists[k][i]);
        }
    /* every class name maps back to its class */
    for (op = 0; op < CAPEX_OP_COUNT; op++) {
        capex_op_class oc;
        const char *nm = capex_op_class_name((capex_op_class)op);
        CT_CHECK(nm && capex_op_class_from_name(nm, &oc) == CAPEX_OK && (int)oc == op, "class %d name %s", op, nm ? nm : "(null)");
    }
    p = (capex_cast_policy)99;
    CT_CHECK(capex_amp_cast_op_name(&c1, "sofmax", &p) == CAPEX_ERR_NOT_FOUND && p == N, "unknown name");
    CT_CHECK(strstr(capex_last_error(), "sofmax") != NULL, "%s", capex_last_error());
    CT_CHECK(capex_amp_cast_op_name(&c1, "Softmax", &p) == CAPEX_ERR_NOT_FOUND, "names are case-sensitive");
}

CT_TEST(promote_and_names) {
    static const capex_dtype d[3] = {CAPEX_F32, CAPEX_F16, CAPEX_BF16};
    /* PyTorch promotion: f16+bf16 -> f32 */
    static const capex_dtype want[3][3] = {{CAPEX_F32, CAPEX_F32, CAPEX_F32},
                                           {CAPEX_F32, CAPEX_F16, CAPEX_F32},
                                           {CAPEX_F32, CAPEX_F32, CAPEX_BF16}};
    int a, b;
    capex_dtype o = CAPEX_F32;
    for (a = 0; a < 3; a++)
        for (b = 0; b < 3; b++)
            CT_CHECK(capex_amp_promote(d[a], d[b], &o) == CAPEX_OK && o == want[a][b], "%d %d", a, b);
    CT_CHECK(capex_amp_promote(CAPEX_F16, (capex_dtype)5, &o) == CAPEX_ERR_INVALID_ARG, "bad dtype");
    CT_CHECK(capex_amp_promote(CAPEX_F16, CAPEX_F16, NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(strcmp(capex_opt_level_name(CAPEX_O0), "O0") == 0 && strcmp(capex_opt_level_name(CAPEX_O3), "O3") == 0, "level names");
    CT_CHECK(capex_opt_level_name((capex_opt_level)4) == NULL, "bad level name");
    CT_CHECK(strcmp(capex_cast_policy_name(H), "half") == 0 && strcmp(capex_cast_policy_name(F), "fp32") == 0 &&
             strcmp(capex_cast_policy_name(P), "promote") == 0 && strcmp(capex_cast_policy_name(N), "none") == 0, "policy names");
    CT_CHECK(capex_cast_policy_name((capex_cast_policy)4) == NULL, "bad policy name");
    CT_CHECK(capex_op_class_name(CAPEX_OP_COUNT) == NULL && capex_op_class_name((capex_op_class)-1) == NULL, "bad class name");
}

CT_TEST(cast_queries_reject_bad_arguments) {
    capex_amp_config c, bad;
    capex_cast_policy p;
    capex_dtype d;
    capex_op_class oc;
    CT_CHECK(capex_amp_resolve(CAPEX_O1, CAPEX_F16, NULL, &c) == CAPEX_OK, "resolve");
    CT_CHECK(capex_amp_cast_op(NULL, CAPEX_OP_SOFTMAX, &p) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_SOFTMAX, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_COUNT, &p) == CAPEX_ERR_INVALID_ARG, "op COUNT");
    CT_CHECK(capex_amp_cast_op(&c, (capex_op_class)-1, &p) == CAPEX_ERR_INVALID_ARG, "op -1");
    CT_CHECK(capex_amp_cast_op_name(NULL, "softmax", &p) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
    CT_CHECK(capex_amp_cast_op_name(&c, NULL, &p) == CAPEX_ERR_INVALID_ARG, "NULL name");
    CT_CHECK(capex_amp_cast_op_name(&c, "softmax", NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    CT_CHECK(capex_op_class_from_name(NULL, &oc) == CAPEX_ERR_INVALID_ARG, "NULL name");
    CT_CHECK(capex_op_class_from_name("softmax", NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    CT_CHECK(capex_op_class_from_name("", &oc) == CAPEX_ERR_NOT_FOUND, "empty name");
    CT_CHECK(capex_amp_op_dtype(NULL, CAPEX_OP_SOFTMAX, CAPEX_F16, &d) == CAPEX_ERR_INVALID_ARG, "NULL cfg");
    CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_SOFTMAX, CAPEX_F16, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_SOFTMAX, (capex_dtype)3, &d) == CAPEX_ERR_INVALID_ARG, "bad input dtype");
    CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_COUNT, CAPEX_F16, &d) == CAPEX_ERR_INVALID_ARG, "bad op");
    /* a garbage config (not from resolve) is refused, not trusted */
    poison(&bad);
    CT_CHECK(capex_amp_cast_op(&bad, CAPEX_OP_SOFTMAX, &p) == CAPEX_ERR_INVALID_ARG, "garbage cfg");
    CT_CHECK(capex_amp_report(&bad, NULL, 0, NULL) == CAPEX_ERR_INVALID_ARG, "garbage cfg report");
    bad = c;
    bad.half_type = CAPEX_F32;
    CT_CHECK(capex_amp_cast_op(&bad, CAPEX_OP_SOFTMAX, &p) == CAPEX_ERR_INVALID_ARG, "F32 half type");
}
#undef H
#undef F
#undef P
#undef N

/* A config is resolve's output: one edited afterwards into a state resolve
   cannot produce (derived fields stale, an Apex rule broken, disabled but not
   inert) is refused by every consumer instead of trusted. Apex checks its
   rules on every later assignment to amp's properties too. */
CT_TEST(edited_config_is_refused) {
    enum { NEDIT = 12 };
    static const char *what[NEDIT] = {
        "O2 master_weights=False (use_master_weights stale)", "O2 cast_model_type=float32 (model_dtype stale)",
        "O2 keep_batchnorm_fp32=False (batchnorm_dtype stale)", "O2 half_type bf16 (model_dtype stale)",
        "O2 model_dtype fp32", "O2 batchnorm_dtype 77", "O1 cast_model_type=half (rule)",
        "O1 master_weights=True (rule, derived refreshed)", "O2 patch_torch_functions (rule)",
        "disabled with O2's properties", "enabled 2", "patch_torch_functions 5"};
    int e;
    for (e = 0; e < NEDIT; e++) {
        capex_amp_config c, keep;
        capex_cast_policy p = CAPEX_CAST_NONE;
        capex_dtype d = CAPEX_F32;
        capex_scaler_desc sd, sd0;
        char buf[2048];
        CT_CHECK(capex_amp_resolve(e == 6 || e == 7 ? CAPEX_O1 : CAPEX_O2, CAPEX_F16, NULL, &c) == CAPEX_OK, "resolve");
        switch (e) {
        case 0: c.master_weights = CAPEX_TRI_FALSE; break;
        case 1: c.cast_model_type = CAPEX_CAST_MODEL_FLOAT32; break;
        case 2: c.keep_batchnorm_fp32 = CAPEX_TRI_FALSE; break;
        case 3: c.half_type = CAPEX_BF16; break;
        case 4: c.model_dtype = CAPEX_F32; break;
        case 5: c.batchnorm_dtype = (capex_dtype)77; break;
        case 6: c.cast_model_type = CAPEX_CAST_MODEL_HALF; c.model_dtype = CAPEX_F16; c.batchnorm_dtype = CAPEX_F16; break;
        case 7: c.master_weights = CAPEX_TRI_TRUE; c.use_master_weights = 1; break;
        case 8: c.patch_torch_functions = 1; break;
        case 9: c.enabled = 0; break;
        case 10: c.enabled = 2; break;
        default: c.patch_torch_functions = 5; break;
        }
        keep = c;
        CT_CHECK(capex_amp_report(&c, buf, sizeof buf, NULL) != CAPEX_OK, "%s: report accepted it", what[e]);
        CT_CHECK(capex_amp_cast_op(&c, CAPEX_OP_BATCH_NORM, &p) != CAPEX_OK, "%s: cast_op accepted it", what[e]);
        CT_CHECK(capex_amp_op_dtype(&c, CAPEX_OP_LINEAR, CAPEX_F16, &d) != CAPEX_OK, "%s: op_dtype accepted it", what[e]);
        capex_scaler_desc_init(&sd);
        sd0 = sd;
        CT_CHECK(capex_scaler_desc_from_amp(&c, &sd) != CAPEX_OK && memcmp(&sd, &sd0, sizeof sd) == 0,
                 "%s: scaler_desc_from_amp accepted it", what[e]);
        CT_CHECK(strstr(capex_last_error(), "capex_amp_resolve") != NULL, "%s: message %s", what[e], capex_last_error());
        CT_CHECK(memcmp(&c, &keep, sizeof c) == 0, "%s: cfg changed", what[e]);
    }
    {
        /* edits resolve could have made stay accepted: a static loss scale */
        capex_amp_config c;
        capex_scaler_desc sd;
        CT_CHECK(capex_amp_resolve(CAPEX_O2, CAPEX_F16, NULL, &c) == CAPEX_OK, "resolve");
        c.loss_scale_mode = CAPEX_LOSS_SCALE_STATIC;
        c.loss_scale = 128.0;
        CT_CHECK(capex_scaler_desc_from_amp(&c, &sd) == CAPEX_OK && !sd.dynamic && sd.init_scale == 128.0f, "%s",
                 capex_last_error());
        c.loss_scale = -1.0; /* but not a bad one */
        CT_CHECK(capex_scaler_desc_from_amp(&c, &sd) == CAPEX_ERR_INVALID_ARG, "negative static loss scale");
    }
}

/* ---- parsers -------------------------------------------------------------- */

CT_TEST(parse_opt_level) {
    static const char *good[] = {"O0", "O1", "O2", "O3", " O2\n"};
    static const int want[] = {0, 1, 2, 3, 2};
    static const char *bad[] = {"", "O4", "02", "o2", "O", "O22", "O2x", "2", "O-1", "O 2"};
    capex_opt_level l;
    size_t i;
    for (i = 0; i < sizeof good / sizeof *good; i++)
        CT_CHECK(capex_opt_level_parse(good[i], &l) == CAPEX_OK && (int)l == want[i], "'%s'", good[i]);
    for (i = 0; i < sizeof bad / sizeof *bad; i++) {
        l = (capex_opt_level)7;
        CT_CHECK(capex_opt_level_parse(bad[i], &l) == CAPEX_ERR_INVALID_ARG && (int)l == 7, "'%s' accepted", bad[i]);
    }
    CT_CHECK(strstr(capex_last_error(), "'O0', 'O1', 'O2', 'O3'") != NULL, "%s", capex_last_error());
    CT_CHECK(capex_opt_level_parse(NULL, &l) == CAPEX_ERR_INVALID_ARG && capex_opt_level_parse("O1", NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
}

CT_TEST(parse_loss_scale) {
    static const struct { const char *s; double v; } good[] = {
        {"128.0", 128.0}, {"128", 128.0}, {"+64", 64.0}, {"1e3", 1000.0}, {"1E+3", 1000.0}, {"0.5", 0.5}, {".25", 0.25},
        {"2.", 2.0}, {"65536.0", 65536.0}, {"  1.0\t", 1.0}, {"0.1", 0.1}, {"1e-3", 0.001}, {"16777216", 16777216.0},
        {"000128.000", 128.0}, {"3.4028234663852886e38", 3.4028234663852886e38}, {"1.1754943508222875e-38", 1.1754943508222875e-38},
        {"123456.789", 123456.789}, {"0.30000000000000004", 0.30000000000000004},
        /* more than 19 significant digits: the extra ones are dropped */
        {"1.00000000000000000000001", 1.0}, {"12345678901234567890123", 1.2345678901234567e22}};
    static const char *bad[] = {"", " ", "dyn", "Dynamic", "dynamic!", "nan", "NaN", "inf", "-inf", "-1", "0", "0.0", "-0",
                                "1e39", "1e-39", "1e99999", "12abc", "1.2.3", "e5", "1e", "1e+", "+", "-", ".", "0x10", "1,5",
                                "1_000", "12 3"};
    capex_loss_scale_mode m;
    double v;
    size_t i;
    CT_CHECK(capex_loss_scale_parse("dynamic", &m, &v) == CAPEX_OK && m == CAPEX_LOSS_SCALE_DYNAMIC && v == 0.0, "dynamic");
    CT_CHECK(capex_loss_scale_parse(" dynamic ", &m, &v) == CAPEX_OK && m == CAPEX_LOSS_SCALE_DYNAMIC, "blanks");
    for (i = 0; i < sizeof good / sizeof *good; i++) {
        v = -1;
        CT_CHECK(capex_loss_scale_parse(good[i].s, &m, &v) == CAPEX_OK, "'%s': %s", good[i].s, capex_last_error());
        CT_CHECK(m == CAPEX_LOSS_SCALE_STATIC && v == good[i].v, "'%s' gave %.17g want %.17g", good[i].s, v, good[i].v);
    }
    for (i = 0; i < sizeof bad / sizeof *bad; i++) {
        m = (capex_loss_scale_mode)7;
        v = -7;
        CT_CHECK(capex_loss_scale_parse(bad[i], &m, &v) == CAPEX_ERR_INVALID_ARG, "'%s' accepted (%g)", bad[i], v);
        CT_CHECK((int)m == 7 && v == -7, "'%s' wrote outputs", bad[i]);
    }
    CT_CHECK(capex_loss_scale_parse(NULL, &m, &v) == CAPEX_ERR_INVALID_ARG, "NULL s");
    CT_CHECK(capex_loss_scale_parse("1", NULL, &v) == CAPEX_ERR_INVALID_ARG, "NULL mode");
    CT_CHECK(capex_loss_scale_parse("1", &m, NULL) == CAPEX_ERR_INVALID_ARG, "NULL value");
}

/* Every integer 1..2^20 and every power of two in float32's range must parse
   exactly (decimal text from the C library under the "C" locale). */
CT_TEST(parse_loss_scale_exact_on_integers_and_powers_of_two) {
    char s[64];
    capex_loss_scale_mode m;
    double v;
    int i;
    for (i = 1; i <= (1 << 20); i++) {
        snprintf(s, sizeof s, "%d", i);
        CT_CHECK(capex_loss_scale_parse(s, &m, &v) == CAPEX_OK && v == (double)i, "%s", s);
    }
    for (i = -126; i <= 127; i++) {
        double w = ldexp(1.0, i);
        snprintf(s, sizeof s, "%.17g", w);
        CT_CHECK(capex_loss_scale_parse(s, &m, &v) == CAPEX_OK && v == w, "2^%d: '%s' gave %.17g", i, s, v);
    }
}

CT_TEST(parse_tri_cast_model_half_type) {
    static const struct { const char *s; capex_tri t; } tri[] = {
        {"True", CAPEX_TRI_TRUE}, {"true", CAPEX_TRI_TRUE}, {"1", CAPEX_TRI_TRUE}, {"False", CAPEX_TRI_FALSE},
        {"false", CAPEX_TRI_FALSE}, {"0", CAPEX_TRI_FALSE}, {"None", CAPEX_TRI_NONE}, {"none", CAPEX_TRI_NONE}, {" True ", CAPEX_TRI_TRUE}};
    static const char *tri_bad[] = {"", "TRUE", "yes", "2", "Truee", "null"};
    static const struct { const char *s; capex_cast_model c; } cm[] = {
        {"None", CAPEX_CAST_MODEL_NONE}, {"none", CAPEX_CAST_MODEL_NONE}, {"float32", CAPEX_CAST_MODEL_FLOAT32},
        {"fp32", CAPEX_CAST_MODEL_FLOAT32}, {"torch.float32", CAPEX_CAST_MODEL_FLOAT32}, {"half", CAPEX_CAST_MODEL_HALF}};
    static const char *cm_bad[] = {"", "float16", "torch.float16", "bf16", "float64", "Half"};
    static const struct { const char *s; capex_dtype d; } ht[] = {
        {"fp16", CAPEX_F16}, {"float16", CAPEX_F16}, {"torch.float16", CAPEX_F16}, {"half", CAPEX_F16},
        {"bf16", CAPEX_BF16}, {"bfloat16", CAPEX_BF16}, {"torch.bfloat16", CAPEX_BF16}};
    static const char *ht_bad[] = {"", "fp32", "float32", "FP16", "bf 16", "fp8"};
    size_t i;
    capex_tri t;
    capex_cast_model c;
    capex_dtype d;
    for (i = 0; i < sizeof tri / sizeof *tri; i++)
        CT_CHECK(capex_tri_parse(tri[i].s, &t) == CAPEX_OK && t == tri[i].t, "'%s'", tri[i].s);
    for (i = 0; i < sizeof tri_bad / sizeof *tri_bad; i++) {
        t = (capex_tri)7;
        CT_CHECK(capex_tri_parse(tri_bad[i], &t) == CAPEX_ERR_INVALID_ARG && (int)t == 7, "'%s'", tri_bad[i]);
    }
    for (i = 0; i < sizeof cm / sizeof *cm; i++)
        CT_CHECK(capex_cast_model_parse(cm[i].s, &c) == CAPEX_OK && c == cm[i].c, "'%s'", cm[i].s);
    for (i = 0; i < sizeof cm_bad / sizeof *cm_bad; i++) {
        c = (capex_cast_model)7;
        CT_CHECK(capex_cast_model_parse(cm_bad[i], &c) == CAPEX_ERR_INVALID_ARG && (int)c == 7, "'%s'", cm_bad[i]);
    }
    CT_CHECK(strstr(capex_last_error(), "half type") != NULL, "%s", capex_last_error());
    for (i = 0; i < sizeof ht / sizeof *ht; i++)
        CT_CHECK(capex_half_type_parse(ht[i].s, &d) == CAPEX_OK && d == ht[i].d, "'%s'", ht[i].s);
    for (i = 0; i < sizeof ht_bad / sizeof *ht_bad; i++) {
        d = (capex_dtype)7;
        CT_CHECK(capex_half_type_parse(ht_bad[i], &d) == CAPEX_ERR_INVALID_ARG && (int)d == 7, "'%s'", ht_bad[i]);
    }
    CT_CHECK(capex_tri_parse(NULL, &t) == CAPEX_ERR_INVALID_ARG && capex_tri_parse("1", NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_cast_model_parse(NULL, &c) == CAPEX_ERR_INVALID_ARG && capex_cast_model_parse("half", NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_half_type_parse(NULL, &d) == CAPEX_ERR_INVALID_ARG && capex_half_type_parse("bf16", NULL) == CAPEX_ERR_INVALID_ARG, "NULL");
}

/* Under a locale whose decimal point is ',' parsing and printing stay the same. */
CT_TEST(parse_and_report_ignore_locale) {
    static const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8", "nl_NL.UTF-8"};
    capex_amp_overrides ov;
    capex_amp_config c;
    char buf[4096];
    size_t i;
    int found = 0;
    capex_result r1, r2, r3;
    for (i = 0; i < sizeof names / sizeof *names && !found; i++) {
        char chk[16];
        if (!setlocale(LC_NUMERIC, names[i])) continue;
        snprintf(chk, sizeof chk, "%.1f", 1.5);
        found = strchr(chk, ',') != NULL;
    }
    if (!found) {
        setlocale(LC_NUMERIC, "C");
        CT_SKIP("no locale with a decimal comma is installed (tried de_DE, fr_FR, ru_RU, nl_NL)");
    }
    capex_amp_overrides_init(&ov);
    r1 = capex_loss_scale_parse("1.5", &ov.loss_scale_mode, &ov.loss_scale);
    r2 = capex_amp_resolve(CAPEX_O3, CAPEX_F16, &ov, &c);
    r3 = capex_amp_report(&c, buf, sizeof buf, NULL);
    setlocale(LC_NUMERIC, "C");
    CT_CHECK(r1 == CAPEX_OK && ov.loss_scale == 1.5, "parse under decimal-comma locale");
    CT_CHECK(r2 == CAPEX_OK && r3 == CAPEX_OK, "resolve/report");
    CT_CHECK(strstr(buf, "loss_scale             : 1.5\n") != NULL, "report under decimal-comma locale:\n%s", buf);
}

static const ct_case cases[] = {
    CT_CASE(defaults_each_level_fp16_bf16),
    CT_CASE(every_single_override_allowed_or_forbidden),
    CT_CASE(every_override_combination_matches_model),
    CT_CASE(bf16_loss_scale_override_wins),
    CT_CASE(disabled_is_inert_and_skips_rules),
    CT_CASE(bad_arguments_rejected),
    CT_CASE(report_text_matches_apex),
    CT_CASE(report_titles_bf16_and_disabled),
    CT_CASE(report_loss_scale_like_python_repr),
    CT_CASE(log_report_one_info_message_per_line),
    CT_CASE(cast_policy_every_op_every_level),
    CT_CASE(cast_policy_follows_overrides),
    CT_CASE(keep_batchnorm_fp32_keeps_activations_half),
    CT_CASE(cast_policy_by_apex_names),
    CT_CASE(promote_and_names),
    CT_CASE(cast_queries_reject_bad_arguments),
    CT_CASE(edited_config_is_refused),
    CT_CASE(parse_opt_level),
    CT_CASE(parse_loss_scale),
    CT_CASE(parse_loss_scale_exact_on_integers_and_powers_of_two),
    CT_CASE(parse_tri_cast_model_half_type),
    CT_CASE(parse_and_report_ignore_locale),
};
CT_MAIN(cases)
