/* The CUDA backend without a GPU: NVRTC (loaded through capex's own loader)
   compiles the embedded kernel program (whole, and as its separately compiled
   parts, serially and on threads) for every supported GPU generation,
   errors carry NVRTC's log, arch selection follows its table, and every
   missing library gives its documented status and message. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "capex_test.h"
#include "cuda_test_util.h"
#include <locale.h>
#include <dlfcn.h>
#include <langinfo.h>
#include <pthread.h>
#include <fcntl.h>
#include <sys/stat.h>

/* NVRTC keeps internal allocations for the life of the process. */
#if defined(__clang__) || defined(__GNUC__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnvrtc\nleak:libnvrtc-builtins\n"; }
#endif

static const int ci_archs[] = {75, 80, 86, 89, 90, 100, 120};

/* ---- arch selection (pure) ---------------------------------------------- */

CT_TEST(select_target_table) {
    static const int nvrtc13[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
    static const int unsorted[] = {90, 75, 86, 80};
    static const struct { const int *list; int n; int cc; int code; int kind; int arch; } rows[] = {
        {nvrtc13, 12, 90, CAPEX_OK, CAPEX_CUDA_IMAGE_CUBIN, 90},   /* H100: exact CUBIN */
        {nvrtc13, 12, 75, CAPEX_OK, CAPEX_CUDA_IMAGE_CUBIN, 75},   /* lowest supported */
        {nvrtc13, 12, 121, CAPEX_OK, CAPEX_CUDA_IMAGE_CUBIN, 121}, /* highest supported */
        {nvrtc13, 12, 130, CAPEX_OK, CAPEX_CUDA_IMAGE_PTX, 121},   /* newer GPU: PTX of the highest */
        {nvrtc13, 12, 101, CAPEX_OK, CAPEX_CUDA_IMAGE_PTX, 100},   /* gap: highest below */
        {nvrtc13, 12, 91, CAPEX_OK, CAPEX_CUDA_IMAGE_PTX, 90},
        {nvrtc13, 12, 70, CAPEX_ERR_ARCH, 0, 0},                   /* V100 below NVRTC 13's floor */
        {nvrtc13, 12, 61, CAPEX_ERR_ARCH, 0, 0},
        {unsorted, 4, 89, CAPEX_OK, CAPEX_CUDA_IMAGE_PTX, 86},     /* order does not matter */
        {unsorted, 4, 90, CAPEX_OK, CAPEX_CUDA_IMAGE_CUBIN, 90},
        {unsorted, 4, 74, CAPEX_ERR_ARCH, 0, 0},
        {nvrtc13, 0, 90, CAPEX_ERR_ARCH, 0, 0},                    /* empty list */
        {nvrtc13, 12, 0, CAPEX_ERR_INVALID_ARG, 0, 0},
        {nvrtc13, -1, 90, CAPEX_ERR_INVALID_ARG, 0, 0},
    };
    size_t i;
    for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        capex_cuda_target t;
        capex_result r = capex_cuda_select_target(rows[i].list, rows[i].n, rows[i].cc, &t);
        CT_CHECK(r == rows[i].code, "row %zu (cc %d): got %s want %s", i, rows[i].cc, capex_result_string(r),
                 capex_result_string((capex_result)rows[i].code));
        if (r == CAPEX_OK) {
            CT_CHECK((int)t.kind == rows[i].kind && t.arch == rows[i].arch, "row %zu (cc %d): got kind %d arch %d", i,
                     rows[i].cc, (int)t.kind, t.arch);
        }
    }
    CT_CHECK(capex_cuda_select_target(nvrtc13, 12, 70, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    {
        capex_cuda_target t;
        CT_CHECK(capex_cuda_select_target(nvrtc13, 12, 70, &t) == CAPEX_ERR_ARCH, "refusal");
        CT_CHECK(strstr(capex_last_error(), "sm_70") && strstr(capex_last_error(), "sm_75"),
                 "refusal names the GPU and the lowest arch: %s", capex_last_error());
    }
}

/* ---- the embedded program ----------------------------------------------- */

CT_TEST(builtin_source_is_self_contained) {
    const char *src = capex_cuda_builtin_source();
    size_t i;
    int n = 0;
    const char *const *opts = capex_cuda_builtin_options(&n);
    CT_CHECK(src && strlen(src) > 500, "program assembled");
    CT_CHECK(!strstr(src, "#include"), "NVRTC has no CUDA headers: the program must include nothing");
    for (i = 0; i < CAPEX__CUDA_N_BUILTIN; i++) {
        char decl[96];
        snprintf(decl, sizeof decl, "void %s(", capex__cuda_builtin_kernels[i]);
        CT_CHECK(strstr(src, decl), "kernel %s defined", capex__cuda_builtin_kernels[i]);
    }
    CT_CHECK(strstr(src, "extern \"C\" __global__"), "kernels are extern \"C\"");
    CT_CHECK(capex_cuda_builtin_source() == src, "assembled once");
    CT_CHECK(n >= 1 && opts && !strcmp(opts[0], "-default-device"), "options");
    /* every fragment stays under C99's minimum string-literal length */
    for (i = 0; i < sizeof capex__cuda_fragments / sizeof capex__cuda_fragments[0]; i++)
        CT_CHECK(strlen(capex__cuda_fragments[i]()) < 4095, "fragment %zu is %zu chars", i, strlen(capex__cuda_fragments[i]()));
}

static void check_image_has_kernels(ct_state *ct, const capex_cuda_image *img, int arch) {
    size_t k;
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++)
        CT_CHECK(contains_bytes(img->data, img->size, capex__cuda_builtin_kernels[k]), "sm_%d image lacks %s", arch,
                 capex__cuda_builtin_kernels[k]);
}

/* A word-bounded name in an image (ELF symbol/section strings, PTX): "capex_go_adam_f16"
   must not match inside a longer name. */
static int image_has_name(const capex_cuda_image *img, const char *name) {
    const unsigned char *p = (const unsigned char *)img->data;
    size_t k = strlen(name), i;
#define ID_CHAR(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z') || ((c) >= '0' && (c) <= '9') || (c) == '_')
    for (i = 0; i + k <= img->size; i++)
        if (!memcmp(p + i, name, k) && (i == 0 || !ID_CHAR(p[i - 1])) && (i + k == img->size || !ID_CHAR(p[i + k])))
            return 1;
#undef ID_CHAR
    return 0;
}

CT_TEST(builtin_parts_split_the_program) {
    const int np = capex_cuda_builtin_part_count();
    const char *prelude = capex__cuda_frag_prelude_fn();
    size_t f, k, at = 0;
    int p, q, used[CAPEX__CUDA_N_FRAGMENTS];
    const char *full = capex_cuda_builtin_source();
    CT_CHECK(np == CAPEX__CUDA_N_PARTS && np >= 8, "%d parts", np);
    CT_CHECK(capex_cuda_builtin_part_name(-1) == NULL && capex_cuda_builtin_part_name(np) == NULL, "name out of range");
    CT_CHECK(capex_cuda_builtin_part_source(-1) == NULL && capex_cuda_builtin_part_source(np) == NULL, "source out of range");
    CT_CHECK(capex_cuda_builtin_kernel_part(NULL) == -1 && capex_cuda_builtin_kernel_part("no_such_kernel") == -1, "unknown kernel");
    /* the whole program is every fragment once, in order */
    for (f = 0; f < CAPEX__CUDA_N_FRAGMENTS; f++) {
        const char *t = capex__cuda_fragments[f]();
        CT_CHECK(!strncmp(full + at, t, strlen(t)) && full[at + strlen(t)] == '\n', "fragment %zu in place", f);
        at += strlen(t) + 1;
        used[f] = f == 0;
    }
    CT_CHECK(full[at] == '\0', "nothing else in the program");
    for (p = 0; p < np; p++) {
        const char *src = capex_cuda_builtin_part_source(p);
        size_t last = 0, n;
        CT_CHECK(src && !strncmp(src, prelude, strlen(prelude)), "part %d starts with the prelude", p);
        CT_CHECK(capex_cuda_builtin_part_source(p) == src, "assembled once");
        CT_CHECK(!strstr(src, "#include"), "part %d includes nothing", p);
        for (q = 0; q < p; q++)
            CT_CHECK(strcmp(capex_cuda_builtin_part_name(p), capex_cuda_builtin_part_name(q)) != 0, "part names unique");
        /* each fragment of the part is one of the program's, in program order */
        for (n = 0; capex__cuda_parts[p].frags[n]; n++) {
            size_t idx = 0;
            while (idx < CAPEX__CUDA_N_FRAGMENTS && capex__cuda_fragments[idx] != capex__cuda_parts[p].frags[n]) idx++;
            CT_CHECK(idx < CAPEX__CUDA_N_FRAGMENTS && idx > last, "part %s fragment %zu is in the program, in order",
                     capex_cuda_builtin_part_name(p), n);
            if (idx < CAPEX__CUDA_N_FRAGMENTS) used[idx] = 1;
            last = idx;
        }
    }
    for (f = 0; f < CAPEX__CUDA_N_FRAGMENTS; f++) CT_CHECK(used[f], "fragment %zu belongs to no part", f);
    /* every kernel is defined in exactly the part that claims it */
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) {
        char decl[96];
        int owner = capex_cuda_builtin_kernel_part(capex__cuda_builtin_kernels[k]), defs = 0;
        snprintf(decl, sizeof decl, "void %s(", capex__cuda_builtin_kernels[k]);
        CT_CHECK(owner >= 0 && owner < np, "%s has a part", capex__cuda_builtin_kernels[k]);
        for (p = 0; p < np; p++) {
            int here = strstr(capex_cuda_builtin_part_source(p), decl) != NULL;
            defs += here;
            CT_CHECK(here == (p == owner), "%s defined in part %s: %d (owner %d)", capex__cuda_builtin_kernels[k],
                     capex_cuda_builtin_part_name(p), here, owner);
        }
        CT_CHECK(defs == 1, "%s defined %d times", capex__cuda_builtin_kernels[k], defs);
    }
    { /* the compile order (heaviest first) names every part once */
        int seen[CAPEX__CUDA_N_PARTS] = {0};
        for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) seen[capex__cuda_part_order[p]]++;
        for (p = 0; p < CAPEX__CUDA_N_PARTS; p++)
            CT_CHECK(seen[p] == 1, "part %s is %d times in capex__cuda_part_order", capex_cuda_builtin_part_name(p), seen[p]);
    }
    /* every part has a kernel */
    for (p = 0; p < np; p++) {
        int n = 0;
        for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) n += capex__cuda_builtin_kernel_part[k] == p;
        CT_CHECK(n > 0, "part %s has no kernel", capex_cuda_builtin_part_name(p));
    }
}

/* Each part's image holds its own kernels and no other part's. */
static void check_part_images(ct_state *ct, const capex_cuda_image *imgs, int arch, int kind) {
    int p;
    size_t k;
    for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) {
        const capex_cuda_image *img = &imgs[p];
        CT_CHECK(img->data && (int)img->kind == kind && img->arch == arch && !img->from_cache, "arch %d part %d fields", arch, p);
        if (!img->data) return;
        if (kind == CAPEX_CUDA_IMAGE_CUBIN) CT_CHECK(img->size > 1000 && !memcmp(img->data, "\177ELF", 4), "arch %d part %d ELF", arch, p);
        for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) {
            int want = capex__cuda_builtin_kernel_part[k] == p;
            CT_CHECK(image_has_name(img, capex__cuda_builtin_kernels[k]) == want, "arch %d part %s: %s %s", arch,
                     capex_cuda_builtin_part_name(p), capex__cuda_builtin_kernels[k], want ? "missing" : "present");
        }
    }
}

/* Every part for every CI arch, on 2 threads; sm_90 also serially: threads change
   nothing (the images are equal byte for byte). Sanitized (ct_sanitized) only
   the lowest arch, sm_90 and the highest: the host code is the same per arch. */
static int ci_arch_in_sanitized_pass(int arch) { return arch == ci_archs[0] || arch == 90 || arch == 120; }
CT_TEST(builtin_parts_compile_cubin_for_every_ci_arch) {
    size_t i;
    int p;
    capex_cuda_image serial[CAPEX__CUDA_N_PARTS];
    CT_NEED_NVRTC();
    for (i = 0; i < sizeof ci_archs / sizeof ci_archs[0]; i++) {
        if (ct_sanitized() && !ci_arch_in_sanitized_pass(ci_archs[i])) continue;
        capex_cuda_image imgs[CAPEX__CUDA_N_PARTS];
        capex_result r = capex_cuda_builtin_compile_parts(ci_archs[i], NULL, 2, imgs);
        CT_CHECK(r == CAPEX_OK, "sm_%d: %s", ci_archs[i], capex_last_error());
        if (r != CAPEX_OK) return;
        CT_CHECK(imgs[0].nvrtc_version >= 11020, "nvrtc version recorded: %d", imgs[0].nvrtc_version);
        check_part_images(ct, imgs, ci_archs[i], CAPEX_CUDA_IMAGE_CUBIN);
        for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) /* only norm variants carry a switch tag (the emulator's check) */
            CT_CHECK(!contains_bytes(imgs[p].data, imgs[p].size, "capex_vnorm_"), "sm_%d part %s: a norm tag", ci_archs[i],
                     capex_cuda_builtin_part_name(p));
        if (ci_archs[i] == 90) {
            CT_CHECK(capex_cuda_builtin_compile_parts(90, NULL, 1, serial) == CAPEX_OK, "%s", capex_last_error());
            for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) {
                CT_CHECK(imgs[p].size == serial[p].size && !memcmp(imgs[p].data, serial[p].data, imgs[p].size),
                         "part %s: %zu bytes on threads, %zu serially", capex_cuda_builtin_part_name(p), imgs[p].size,
                         serial[p].size);
                capex_cuda_image_free(&serial[p]);
            }
        }
        for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) capex_cuda_image_free(&imgs[p]);
        CT_CHECK(imgs[0].data == NULL && imgs[0].size == 0, "image_free clears");
        if (ct->failed) return;
    }
    CT_CHECK(capex_cuda_builtin_compile_parts(90, NULL, 2, NULL) == CAPEX_ERR_INVALID_ARG, "NULL images");
    CT_CHECK(capex_cuda_builtin_compile_parts(0, NULL, 2, serial) == CAPEX_ERR_INVALID_ARG, "cc 0");
    {
        int archs[64], n_archs = 0, lo = 1000, k;
        capex_cuda_nvrtc_supported_archs(archs, 64, &n_archs);
        for (k = 0; k < n_archs; k++) lo = archs[k] < lo ? archs[k] : lo;
        CT_CHECK(capex_cuda_builtin_compile_parts(lo - 5, NULL, 2, serial) == CAPEX_ERR_ARCH, "sm_%d refused: %s", lo - 5,
                 capex_last_error());
        CT_CHECK(strstr(capex_last_error(), "built-in part"), "names the part: %s", capex_last_error());
        CT_CHECK(serial[0].data == NULL, "no images on failure");
    }
}

/* whether part p has the launch metadata type (its options depend on the size) */
static int part_has_meta(int p) {
    const capex__cuda_fragment_fn *f;
    for (f = capex__cuda_parts[p].frags; *f; f++)
        if (*f == capex__cuda_frag_go0b_fn) return 1;
    return 0;
}

/* Variants (capex__cuda_kernel_unit): every launch's switches map to a
   variant of the kernel's part that defines it; every variant is reached; each
   compiles (all for sm_90, one per family for the lowest and highest CI arch;
   the generic parts above cover every arch) and its image holds exactly its
   kernels. NVRTC's -minimal (used from 12.4 on, outside the cache key) gives
   the same image. Sanitized (ct_sanitized), sm_90 compiles the one-per-family
   list too: 14 variants instead of 337, every branch of the checks still
   taken (norm variants with a tag, others without); the host code is the
   same per variant. */
CT_TEST(builtin_variants_compile) {
    int reached[CAPEX__CUDA_N_VARIANTS], v, u, i, n = 0;
    size_t k;
    unsigned vb;
    capex__cuda_pjob *jobs;
    static const int few[] = {CAPEX__CV_ADAM + 23, CAPEX__CV_SCALE + 35, CAPEX__CV_SUMSQ + 2, CAPEX__CV_AMP, CAPEX__CV_AMP + 1,
                              CAPEX__CV_AMS + 22, CAPEX__CV_ADAGRAD + 1, CAPEX__CV_SGD + 23, CAPEX__CV_LAMB1 + 5,
                              CAPEX__CV_LAMB2 + 7, CAPEX__CV_NORM_FWD + 53, CAPEX__CV_NORM_BWD + 22,
                              CAPEX__CV_NOVO + 23, CAPEX__CV_NORM_ME + 41};
    memset(reached, 0, sizeof reached);
    for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) {
        CT_CHECK(capex__cuda_kernel_unit(k, 0) == capex__cuda_builtin_kernel_part[k], "%s: vb 0 is its part",
                 capex__cuda_builtin_kernels[k]);
        for (vb = 1; vb < 256; vb += 2) { /* every switch bit (CAPEX__CUDA_VB, CAPEX__CUDA_NVB) */
            u = capex__cuda_kernel_unit(k, vb);
            CT_CHECK(u >= 0 && u < CAPEX__CUDA_N_UNITS && capex__cuda_unit_has(u, k), "%s vb %u: unit %d lacks it",
                     capex__cuda_builtin_kernels[k], vb, u);
            CT_CHECK(capex__cuda_unit_part(u) == capex__cuda_builtin_kernel_part[k], "%s: a variant of its own part",
                     capex__cuda_builtin_kernels[k]);
            if (u >= CAPEX__CUDA_N_PARTS) reached[u - CAPEX__CUDA_N_PARTS] = 1;
        }
    }
    for (v = 0; v < CAPEX__CUDA_N_VARIANTS; v++) {
        capex__cuda_vdef d = capex__cuda_variant_def(v);
        int nk = 0;
        for (k = 0; k < CAPEX__CUDA_N_BUILTIN; k++) nk += capex__cuda_unit_has(CAPEX__CUDA_N_PARTS + v, k);
        CT_CHECK(nk >= 1 && nk <= CAPEX__CUDA_VAR_MAX_KERNELS, "variant %d holds %d kernels (the context keeps %d)", v, nk,
                 CAPEX__CUDA_VAR_MAX_KERNELS);
        CT_CHECK(reached[v], "variant %d is never picked", v);
        CT_CHECK(d.part >= 0 && d.part < CAPEX__CUDA_N_PARTS && d.sel > 0, "variant %d: part %d sel %d", v, d.part, d.sel);
    }
    CT_CHECK(capex__cuda_kernel_unit(CAPEX__CUDA_N_BUILTIN, 1) == -1, "no such kernel");
    for (i = 0; i < 6 * 54; i++) { /* a norm launch's variant fixes its own switches (the kernels' arguments) */
        const int xt = i / 6 / 18, pt = i / 6 / 6 % 3, yt = i / 6 / 2 % 3, rms = i / 6 % 2;
        capex__cuda_vdef d;
        k = i % 6 < 4 ? CAPEX__CK_NORM_FWD + (size_t)(i % 6) : CAPEX__CK_NORM_ME_DX + (size_t)(i % 6 - 4);
        u = capex__cuda_kernel_unit(k, CAPEX__CUDA_NVB(xt, pt, yt, rms));
        d = capex__cuda_variant_def(u - CAPEX__CUDA_N_PARTS);
        CT_CHECK(u >= CAPEX__CUDA_N_PARTS && d.xt == xt && d.pt == pt && d.yt == yt && d.rms == rms && d.w < 0 && d.mk < 0,
                 "%s x %d p %d y %d rms %d: variant %d fixes %d %d %d %d", capex__cuda_builtin_kernels[k], xt, pt, yt, rms, u,
                 d.xt, d.pt, d.yt, d.rms);
    }
    CT_CHECK(capex__cuda_kernel_unit(CAPEX__CK_NORM_FWD, CAPEX__CUDA_NVB(3, 0, 0, 0)) == CAPEX__CP_NORM_FWD, "no dtype 3: the part");
    { /* every unit (part or variant) has its own cache key, for either metadata size */
        static unsigned char keys[2 * CAPEX__CUDA_N_UNITS][32];
        int a, b;
        pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
        for (a = 0; a < 2 * CAPEX__CUDA_N_UNITS; a++) {
            capex_cuda_compile_desc d;
            capex__cuda_unit_opts o;
            capex__cuda_unit_desc(a % CAPEX__CUDA_N_UNITS, 90, a < CAPEX__CUDA_N_UNITS ? CAPEX__GO_META_SMALL : CAPEX__GO_META_LARGE,
                                  NULL, &o, &d);
            capex__cuda_cache_key(d.source, d.name, d.options, d.n_options, 90, keys[a]);
        }
        for (a = 0; a < 2 * CAPEX__CUDA_N_UNITS; a++)
            for (b = 0; b < a; b++) {
                int same_unit_no_meta = a % CAPEX__CUDA_N_UNITS == b % CAPEX__CUDA_N_UNITS &&
                                        !part_has_meta(capex__cuda_unit_part(a % CAPEX__CUDA_N_UNITS));
                CT_CHECK(same_unit_no_meta == !memcmp(keys[a], keys[b], 32), "units %d and %d: keys %s", a, b,
                         same_unit_no_meta ? "differ" : "equal");
            }
    }
    CT_NEED_NVRTC();
    jobs = (capex__cuda_pjob *)malloc(sizeof *jobs * CAPEX__CUDA_N_VARIANTS);
    CT_CHECK(jobs != NULL, "alloc");
    pthread_once(&capex__cuda_builtin_once, capex__cuda_builtin_build);
    for (i = 0; i < 3 && !ct->failed; i++) {
        const int arch = i == 0 ? 90 : i == 1 ? ci_archs[0] : ci_archs[sizeof ci_archs / sizeof ci_archs[0] - 1];
        const int all = i == 0 && !ct_sanitized();
        n = all ? CAPEX__CUDA_N_VARIANTS : (int)(sizeof few / sizeof few[0]);
        for (v = 0; v < n; v++) capex__cuda_pjob_init(&jobs[v], CAPEX__CUDA_N_PARTS + (all ? v : few[v]), NULL);
        capex__cuda_pool_run(jobs, n, arch, i == 0 ? CAPEX__GO_META_LARGE : CAPEX__GO_META_SMALL, 2);
        for (v = 0; v < n; v++) {
            const capex_cuda_image *img = &jobs[v].img;
            u = jobs[v].part;
            CT_CHECK(jobs[v].r == CAPEX_OK && img->data && img->arch == arch, "sm_%d %s: %s", arch, capex__cuda_unit_name(u),
                     jobs[v].err);
            for (k = 0; k < CAPEX__CUDA_N_BUILTIN && img->data; k++) {
                int want = capex__cuda_unit_has(u, k);
                CT_CHECK(image_has_name(img, capex__cuda_builtin_kernels[k]) == want, "sm_%d %s: %s %s", arch,
                         capex__cuda_unit_name(u), capex__cuda_builtin_kernels[k], want ? "missing" : "present");
            }
            if (img->data) { /* a norm variant names its switches (the emulator checks launches against them), no other unit a tag */
                capex__cuda_vdef d = capex__cuda_variant_def(u - CAPEX__CUDA_N_PARTS);
                char tag[32];
                snprintf(tag, sizeof tag, "capex_vnorm_%d_%d_%d_%d", d.xt, d.pt, d.yt, d.rms);
                if (d.xt >= 0) CT_CHECK(image_has_name(img, tag), "sm_%d %s: tag %s missing", arch, capex__cuda_unit_name(u), tag);
                else CT_CHECK(!contains_bytes(img->data, img->size, "capex_vnorm_"), "sm_%d %s: a norm tag", arch, capex__cuda_unit_name(u));
            }
        }
        for (v = 0; v < n; v++) capex_cuda_image_free(&jobs[v].img);
    }
    free(jobs);
    {
        int major = 0, minor = 0, no = 0, p = CAPEX__CP_ADAM_BF16;
        const char *const *bo = capex_cuda_builtin_options(&no);
        const char *o[16];
        capex_cuda_target t;
        capex_cuda_image a, b;
        CT_CHECK(capex_cuda_nvrtc_version(&major, &minor) == CAPEX_OK && no < 15, "version");
        if (major < 12 || (major == 12 && minor < 4)) return; /* no -minimal */
        for (i = 0; i < no; i++) o[i] = bo[i];
        o[no] = "-minimal";
        t.kind = CAPEX_CUDA_IMAGE_CUBIN;
        t.arch = 90;
        CT_CHECK(capex_cuda_nvrtc_compile(capex_cuda_builtin_part_source(p), "m", o, no, t, &a) == CAPEX_OK &&
                     capex_cuda_nvrtc_compile(capex_cuda_builtin_part_source(p), "m", o, no + 1, t, &b) == CAPEX_OK,
                 "%s", capex_last_error());
        CT_CHECK(a.size == b.size && !memcmp(a.data, b.data, a.size), "-minimal changed the image: %zu vs %zu bytes", a.size, b.size);
        capex_cuda_image_free(&a);
        capex_cuda_image_free(&b);
    }
}

CT_TEST(builtin_compiles_ptx_for_highest_arch) {
    int archs[64], n_archs = 0, hi = 0, n = 0, i;
    const char *const *opts = capex_cuda_builtin_options(&n);
    capex_cuda_target t;
    capex_cuda_image img;
    char target_line[32];
    CT_NEED_NVRTC();
    CT_CHECK(capex_cuda_nvrtc_supported_archs(archs, 64, &n_archs) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(n_archs > 0, "NVRTC lists archs");
    for (i = 0; i < n_archs; i++) if (archs[i] > hi) hi = archs[i];
    for (i = 0; i < (int)(sizeof ci_archs / sizeof ci_archs[0]); i++) {
        int j, found = 0;
        for (j = 0; j < n_archs; j++) found |= archs[j] == ci_archs[i];
        CT_CHECK(found, "NVRTC does not list sm_%d", ci_archs[i]);
    }
    t.kind = CAPEX_CUDA_IMAGE_PTX;
    t.arch = hi;
    CT_CHECK(capex_cuda_nvrtc_compile(capex_cuda_builtin_source(), "capex_builtin", opts, n, t, &img) == CAPEX_OK, "%s",
             capex_last_error());
    snprintf(target_line, sizeof target_line, ".target sm_%d", hi);
    CT_CHECK(contains_bytes(img.data, img.size, target_line), "PTX says %s", target_line);
    CT_CHECK(contains_bytes(img.data, img.size, ".entry capex_fill_f32"), "PTX has the entry points");
    /* device code takes the prelude's __CUDA_ARCH__ branches (host C++ builds the bit arithmetic) */
    CT_CHECK(contains_bytes(img.data, img.size, "cvt.rn.f16.f32"), "f32 -> f16 stores use cvt on the GPU");
    CT_CHECK(((const char *)img.data)[img.size - 1] == '\0', "PTX is NUL-terminated for cuModuleLoadData");
    check_image_has_kernels(ct, &img, hi);
    capex_cuda_image_free(&img);
    /* the capacity contract */
    CT_CHECK(capex_cuda_nvrtc_supported_archs(archs, 1, &n_archs) == CAPEX_ERR_LIMIT && n_archs > 1, "capacity too small");
}

CT_TEST(compile_selects_target_from_device_cc) {
    capex_cuda_compile_desc d;
    capex_cuda_image img;
    int n = 0, archs[64], n_archs = 0, hi = 0, lo = 1000, i;
    CT_NEED_NVRTC();
    capex_cuda_nvrtc_supported_archs(archs, 64, &n_archs);
    for (i = 0; i < n_archs; i++) {
        if (archs[i] > hi) hi = archs[i];
        if (archs[i] < lo) lo = archs[i];
    }
    capex_cuda_compile_desc_init(&d);
    d.source = capex_cuda_builtin_source();
    d.options = capex_cuda_builtin_options(&n);
    d.n_options = n;
    d.device_cc = 90;
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(img.kind == CAPEX_CUDA_IMAGE_CUBIN && img.arch == 90 && !img.from_cache, "H100 gets sm_90 CUBIN");
    capex_cuda_image_free(&img);
    d.device_cc = hi + 10; /* a GPU newer than this NVRTC */
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(img.kind == CAPEX_CUDA_IMAGE_PTX && img.arch == hi, "newer GPU gets compute_%d PTX, got %d/%d", hi, (int)img.kind, img.arch);
    capex_cuda_image_free(&img);
    d.device_cc = lo - 5; /* sm_70 for NVRTC 13, sm_45 for NVRTC 12 */
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_ERR_ARCH, "sm_%d refused: %s", lo - 5, capex_last_error());
    CT_CHECK(img.data == NULL, "no image on failure");
    d.device_cc = 0;
    CT_CHECK(capex_cuda_compile(&d, &img) == CAPEX_ERR_INVALID_ARG, "cc 0");
    CT_CHECK(capex_cuda_compile(NULL, &img) == CAPEX_ERR_INVALID_ARG, "NULL desc");
}

CT_TEST(broken_source_returns_nvrtc_log) {
    static const char *broken = "extern \"C\" __global__ void k(float *x) {\n  x[0] = undeclared_thing + 1;\n}\n";
    static const char *opts[] = {"-DFOO=1"};
    capex_cuda_target t;
    capex_cuda_image img;
    capex_result r;
    const char *e;
    CT_NEED_NVRTC();
    t.kind = CAPEX_CUDA_IMAGE_CUBIN;
    t.arch = 90;
    r = capex_cuda_nvrtc_compile(broken, "broken.cu", opts, 1, t, &img);
    e = capex_last_error();
    CT_CHECK(r == CAPEX_ERR_NVRTC, "got %s", capex_result_string(r));
    CT_CHECK(img.data == NULL && img.size == 0, "no image");
    CT_CHECK(strstr(e, "broken.cu"), "names the program: %s", e);
    CT_CHECK(strstr(e, "undeclared_thing") && strstr(e, "error"), "carries NVRTC's log: %s", e);
    CT_CHECK(strstr(e, "line 2") || strstr(e, "(2)"), "log has the line: %s", e);
    CT_CHECK(strstr(e, "-DFOO=1") && strstr(e, "-arch=sm_90"), "lists the options: %s", e);
    /* an invalid option is reported too */
    {
        static const char *bad[] = {"--no-such-option"};
        r = capex_cuda_nvrtc_compile("extern \"C\" __global__ void k() {}", "opt", bad, 1, t, &img);
        CT_CHECK(r == CAPEX_ERR_NVRTC && strstr(capex_last_error(), "--no-such-option"), "%s", capex_last_error());
    }
}

CT_TEST(user_source_gets_its_options) {
    static const char *src =
        "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = VALUE * SCALE; }\n";
    static const char *opts[] = {"-DVALUE=4321", "-DSCALE=3"};
    capex_cuda_target t;
    capex_cuda_image img;
    CT_NEED_NVRTC();
    t.kind = CAPEX_CUDA_IMAGE_PTX;
    t.arch = 80;
    CT_CHECK(capex_cuda_nvrtc_compile(src, "user", opts, 2, t, &img) == CAPEX_OK, "%s", capex_last_error());
    CT_CHECK(contains_bytes(img.data, img.size, "12963"), "VALUE*SCALE folded into the PTX");
    CT_CHECK(contains_bytes(img.data, img.size, ".entry put"), "extern \"C\" keeps the name");
    capex_cuda_image_free(&img);
    CT_CHECK(capex_cuda_nvrtc_compile(src, "user", opts, 1, t, &img) == CAPEX_ERR_NVRTC, "SCALE missing fails");
    CT_CHECK(capex_cuda_nvrtc_compile(NULL, "user", opts, 1, t, &img) == CAPEX_ERR_INVALID_ARG, "NULL source");
    CT_CHECK(capex_cuda_nvrtc_compile(src, "user", NULL, 1, t, &img) == CAPEX_ERR_INVALID_ARG, "NULL options");
    t.arch = 0;
    CT_CHECK(capex_cuda_nvrtc_compile(src, "user", opts, 2, t, &img) == CAPEX_ERR_INVALID_ARG, "arch 0");
}

CT_TEST(locale_restored_around_compile) {
    static const char *src = "extern \"C\" __global__ void k(float *x) { x[0] = 1.5f; }\n";
    capex_cuda_target t;
    capex_cuda_image img;
    char before[128], now[128];
    CT_NEED_NVRTC();
    if (!setlocale(LC_NUMERIC, "C.UTF-8") && !setlocale(LC_NUMERIC, "de_DE.UTF-8"))
        CT_SKIP("no non-\"C\" locale installed");
    snprintf(before, sizeof before, "%s", setlocale(LC_NUMERIC, NULL));
    t.kind = CAPEX_CUDA_IMAGE_CUBIN;
    t.arch = 90;
    CT_CHECK(capex_cuda_nvrtc_compile(src, "loc", NULL, 0, t, &img) == CAPEX_OK, "%s", capex_last_error());
    capex_cuda_image_free(&img);
    snprintf(now, sizeof now, "%s", setlocale(LC_NUMERIC, NULL));
    setlocale(LC_NUMERIC, "C");
    CT_CHECK(!strcmp(now, before), "LC_NUMERIC restored to %s (now %s)", before, now);
}

/* ---- missing libraries: each in a fresh child (libraries load once) ------ */

static void child_driver(const char *arg, child_result *res) {
    capex_cuda_context *ctx = NULL;
    int n = -1, v = -1;
    const char *path = arg;
    if (path) setenv("CAPEX_LIBCUDA_PATH", path, 1);
    else unsetenv("CAPEX_LIBCUDA_PATH");
    res->code = capex_cuda_driver_version(&v);
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    /* every entry point gives the same status, no crash, and the CPU side works */
    res->value = capex_cuda_device_count(&n) == res->code && n == 0 &&
                 capex_cuda_context_create(NULL, &ctx) == res->code && ctx == NULL &&
                 capex_cuda_driver_version(&v) == res->code && capex_f32_to_f16(2.0f) == 0x4000;
}

CT_TEST(no_driver_status) {
    child_result r = run_child("driver", "/nonexistent/libcuda.so.1");
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_NO_DRIVER, "got %d: %s", r.code, r.message);
    CT_CHECK(strstr(r.message, "/nonexistent/libcuda.so.1") && strstr(r.message, "CAPEX_LIBCUDA_PATH"),
             "names what was tried: %s", r.message);
    CT_CHECK(r.value, "every entry point reports NO_DRIVER and the CPU backend still works");
    { /* a library that is no driver at all (the stand-in NVRTC) is called that, not "too old" */
        char lib[600];
        CT_CHECK(sibling_path("fake", "nvrtc_ok/lib64/libnvrtc.so.12", lib, sizeof lib), "stand-in NVRTC path");
        r = run_child("driver", lib);
        CT_CHECK(r.exited_ok && r.code == CAPEX_ERR_NO_DRIVER && r.value, "not a driver: %d %s", r.code, r.message);
        CT_CHECK(strstr(r.message, "not a CUDA driver") && strstr(r.message, lib) && !strstr(r.message, "too old"),
                 "says what the library is not: %s", r.message);
    }
    /* without the override: this machine's real situation */
    {
        child_result d = run_child("driver", NULL);
        CT_CHECK(d.exited_ok, "child crashed");
        if (d.code == CAPEX_ERR_NO_DRIVER) {
            CT_CHECK(strstr(d.message, "libcuda.so.1") && strstr(d.message, "driver"), "%s", d.message);
        } else {
            CT_CHECK(d.code == CAPEX_OK || d.code == CAPEX_ERR_NO_DEVICE, "driver present: %d %s", d.code, d.message);
        }
    }
}

static void child_nvrtc(const char *arg, child_result *res) {
    int M = 0, m = 0;
    capex_cuda_target t;
    capex_cuda_image img;
    setenv("CAPEX_NVRTC_PATH", arg ? arg : "", 1);
    res->code = capex_cuda_nvrtc_version(&M, &m);
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    t.kind = CAPEX_CUDA_IMAGE_CUBIN;
    t.arch = 90;
    res->value = capex_cuda_nvrtc_compile("extern \"C\" __global__ void k() {}", "k", NULL, 0, t, &img) == res->code &&
                 capex_cuda_nvrtc_is_loaded() == (res->code == CAPEX_OK) && !capex_cuda_nvrtc_path()[0] == (res->code != CAPEX_OK);
    if (res->code == CAPEX_OK) capex_cuda_image_free(&img);
}

CT_TEST(no_nvrtc_status) {
    child_result r = run_child("nvrtc", "/nonexistent/libnvrtc.so.13");
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_NO_NVRTC, "got %d: %s", r.code, r.message);
    CT_CHECK(strstr(r.message, "/nonexistent/libnvrtc.so.13") && strstr(r.message, "CAPEX_NVRTC_PATH"), "%s", r.message);
    CT_CHECK(r.value, "compile reports NO_NVRTC too, nothing marked loaded");
    /* a file that is not NVRTC */
    r = run_child("nvrtc", "/bin/sh");
    CT_CHECK(r.code == CAPEX_ERR_NO_NVRTC, "non-library: %d %s", r.code, r.message);
}

CT_TEST(nvrtc_search_finds_toolkit) {
    char path[600];
    CT_NEED_NVRTC();
    snprintf(path, sizeof path, "%s", capex_cuda_nvrtc_path());
    CT_CHECK(capex_cuda_nvrtc_is_loaded() && strstr(path, "nvrtc"), "loaded from %s", path);
    /* the same library through the override gives the same version */
    {
        int M, m;
        child_result r;
        capex_cuda_nvrtc_version(&M, &m);
        r = run_child("nvrtc", path);
        CT_CHECK(r.code == CAPEX_OK && r.value, "override %s: %s", path, r.message);
        (void)M; (void)m;
    }
}

/* ---- the NVRTC search and the locale, on stand-in libraries ---------------
   build/fake/nvrtc_ok/lib64/libnvrtc.so.12 is tests/fake_libnvrtc.c (version
   from FAKE_NVRTC_VERSION), build/fake/nvrtc_old/lib64/libnvrtc.so.12 the same
   without nvrtcGetSupportedArchs (NVRTC before 11.2: opens, unusable). */
#define CHILD_SKIPPED 1000 /* res->code of a child whose precondition is missing */

static void child_nvrtc_search(const char *arg, child_result *res) {
    char drv[1024], ok[1024], old[1024];
    int v = 0, M = 0, m = 0;
    void *h;
    res->code = -1;
    if (!sibling_path("fake", "libcuda.so.1", drv, sizeof drv) || !sibling_path("fake", "nvrtc_ok", ok, sizeof ok) ||
        !sibling_path("fake", "nvrtc_old", old, sizeof old)) {
        snprintf(res->message, sizeof res->message, "no /proc/self/exe");
        return;
    }
    /* a real libnvrtc.so.12 on the loader path would be found first: not this test's case */
    if ((h = dlopen("libnvrtc.so.12", RTLD_LAZY | RTLD_LOCAL)) != NULL) {
        dlclose(h);
        res->code = CHILD_SKIPPED;
        snprintf(res->message, sizeof res->message, "a real libnvrtc.so.12 is on the loader path");
        return;
    }
    setenv("CAPEX_LIBCUDA_PATH", drv, 1);
    setenv("FAKE_CUDA_DRIVER_VERSION", "12090", 1); /* a CUDA 12.9 driver */
    setenv("FAKE_NVRTC_VERSION", "12.9", 1);
    unsetenv("CAPEX_NVRTC_PATH");
    unsetenv("CUDA_PATH");
    if (!strcmp(arg, "prefer")) { /* the toolkit dir's 12.x beats the loader path's 13.x */
        setenv("CUDA_HOME", ok, 1);
    } else if (!strcmp(arg, "skip_unusable")) { /* an unusable 12.x does not end the search */
        setenv("CUDA_HOME", old, 1);
        setenv("CUDA_PATH", ok, 1);
    } else if (!strcmp(arg, "override_unusable")) {
        char lib[1100];
        snprintf(lib, sizeof lib, "%s/lib64/libnvrtc.so.12", old);
        setenv("CAPEX_NVRTC_PATH", lib, 1);
    }
    if (capex_cuda_driver_version(&v) != CAPEX_OK || v != 12090) {
        snprintf(res->message, sizeof res->message, "stand-in driver: %d %s", v, capex_last_error());
        return;
    }
    res->code = capex_cuda_nvrtc_version(&M, &m);
    res->value = M * 1000 + m * 10;
    if (res->code == CAPEX_OK) snprintf(res->message, sizeof res->message, "%s", capex_cuda_nvrtc_path());
    else snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

CT_TEST(nvrtc_search_prefers_driver_major_and_skips_unusable) {
    child_result r = run_child("nvrtc_search", "prefer");
    CT_CHECK(r.exited_ok, "child crashed");
    if (r.code == CHILD_SKIPPED) CT_SKIP("%s", r.message);
    CT_CHECK(r.code == CAPEX_OK && r.value == 12090 && strstr(r.message, "nvrtc_ok/lib64/libnvrtc.so.12"),
             "driver 12.9: NVRTC 12.x from $CUDA_HOME, not a newer soname: %d %d %s", r.code, r.value, r.message);
    r = run_child("nvrtc_search", "skip_unusable");
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_OK && r.value == 12090 && strstr(r.message, "nvrtc_ok/lib64/libnvrtc.so.12"),
             "an NVRTC without an arch list is skipped for the next one: %d %d %s", r.code, r.value, r.message);
    r = run_child("nvrtc_search", "override_unusable");
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_NO_NVRTC && strstr(r.message, "nvrtc_old/lib64/libnvrtc.so.12") &&
             strstr(r.message, "lacks nvrtcGetSupportedArchs"), "the reason is named: %d %s", r.code, r.message);
}

typedef struct locale_job { int kind, bad, failed; } locale_job;

/* One image per compile; its first line is the decimal point NVRTC saw. */
static int image_saw_c_locale(const capex_cuda_image *img) {
    return img->data && img->size > 20 && !strncmp((const char *)img->data, "// decimal point: .", 19);
}

/* On the stand-in driver and NVRTC: while one thread is inside NVRTC, the same
   context serves a module it already has and compiles another source. (Before,
   the context lock was held through every compile: this child then hangs
   until its alarm.) */
static void *compile_waiting(void *arg) {
    capex_cuda_context *ctx = (capex_cuda_context *)arg;
    capex_cuda_module *m = NULL;
    static capex_result r;
    r = capex_cuda_module_compile(ctx, "extern \"C\" __global__ void slow() {} // FAKE_NVRTC_WAIT", "slow", NULL, 0, &m);
    return &r;
}

static void child_compile_unlocked(const char *arg, child_result *res) {
    char drv[1024], nv[1024], wait[64], in[80];
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *a = NULL, *a2 = NULL, *b = NULL;
    capex_cuda_function f;
    pthread_t th;
    void *ret = NULL;
    int i, fd;
    (void)arg;
    res->code = -1;
    if (!sibling_path("fake", "libcuda.so.1", drv, sizeof drv) ||
        !sibling_path("fake", "nvrtc_ok/lib64/libnvrtc.so.12", nv, sizeof nv))
        return;
    snprintf(wait, sizeof wait, "/tmp/capex_wait_XXXXXX");
    if ((fd = mkstemp(wait)) < 0) return;
    close(fd);
    unlink(wait);
    snprintf(in, sizeof in, "%s.in", wait);
    setenv("CAPEX_LIBCUDA_PATH", drv, 1);
    setenv("CAPEX_NVRTC_PATH", nv, 1);
    setenv("FAKE_NVRTC_WAIT", wait, 1);
    alarm(120); /* a compile that holds the context lock deadlocks this child */
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.disk_cache = 0;
    if ((res->code = capex_cuda_context_create(&cd, &ctx)) != CAPEX_OK ||
        (res->code = capex_cuda_module_compile(ctx, "extern \"C\" __global__ void fast() {}", "fast", NULL, 0, &a)) != CAPEX_OK) {
        snprintf(res->message, sizeof res->message, "%s", capex_last_error());
        capex_cuda_context_destroy(ctx);
        return;
    }
    res->code = -2;
    if (pthread_create(&th, NULL, compile_waiting, ctx) != 0) return;
    for (i = 0; i < 60000 && access(in, F_OK) != 0; i++) usleep(1000); /* the thread is inside NVRTC (60 s at least: a hang guard) */
    res->value = access(in, F_OK) == 0;
    /* the lock is free: a module already loaded, a new compile and a lookup go through */
    res->value += capex_cuda_module_compile(ctx, "extern \"C\" __global__ void fast() {}", "fast", NULL, 0, &a2) == CAPEX_OK && a2 == a;
    res->value += capex_cuda_module_compile(ctx, "extern \"C\" __global__ void other() {}", "other", NULL, 0, &b) == CAPEX_OK &&
                  capex_cuda_module_get_function(b, "other", &f) == CAPEX_OK;
    fd = open(wait, O_CREAT | O_WRONLY, 0600); /* release the waiting compile */
    if (fd >= 0) close(fd);
    pthread_join(th, &ret);
    res->value += ret && *(capex_result *)ret == CAPEX_OK;
    res->code = CAPEX_OK;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_context_destroy(ctx);
    unlink(wait);
    unlink(in);
}

CT_TEST(compile_does_not_hold_the_context) {
    child_result r = run_child("compile_unlocked", NULL);
    CT_CHECK(r.exited_ok, "child died (alarm: a compile held the context lock)");
    CT_CHECK(r.code == CAPEX_OK && r.value == 4, "in NVRTC %d, hit + compile + finish = %d of 4: %s", r.code, r.value, r.message);
}

/* On the stand-in driver with the real NVRTC: an entry filled offline by
   capex_cuda_compile (no program name) is a hit for capex_cuda_module_compile;
   a load that fails for a reason other than the image (out of memory) is
   returned as it is: no recompile, no rewrite of the entry, no version hint. */
static void child_module_cache(const char *dir, child_result *res) {
    static const char *src = "extern \"C\" __global__ void put(int *x) { x[0] = 5; }";
    char drv[1024], path[1200];
    unsigned char key[32];
    capex_cuda_compile_desc d;
    capex_cuda_cache c;
    capex_cuda_image img;
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    capex_cuda_module *m = NULL;
    capex_cuda_target t;
    struct stat before, after;
    int from_cache = 0;
    res->code = -1;
    if (!sibling_path("fake", "libcuda.so.1", drv, sizeof drv)) return;
    setenv("CAPEX_LIBCUDA_PATH", drv, 1);
    capex_cuda_cache_init(&c, dir);
    capex_cuda_compile_desc_init(&d);
    d.source = src;
    d.name = NULL;
    d.device_cc = 90;
    d.cache = &c;
    if ((res->code = capex_cuda_compile(&d, &img)) != CAPEX_OK) goto out;
    capex_cuda_image_free(&img);
    capex__cuda_cache_key(src, NULL, NULL, 0, 90, key);
    capex__cuda_cache_path(&c, key, path, sizeof path);
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.cache_dir = dir;
    if ((res->code = capex_cuda_context_create(&cd, &ctx)) != CAPEX_OK) goto out;
    if ((res->code = capex_cuda_module_compile(ctx, src, NULL, NULL, 0, &m)) != CAPEX_OK) goto out;
    capex_cuda_module_info(m, &t, &from_cache);
    res->value = from_cache;
    capex_cuda_context_destroy(ctx);
    ctx = NULL;
    stat(path, &before);
    setenv("FAKE_CUDA_MODULE_LOAD_OOM", "1", 1);
    if ((res->code = capex_cuda_context_create(&cd, &ctx)) != CAPEX_OK) goto out;
    res->code = capex_cuda_module_compile(ctx, src, NULL, NULL, 0, &m);
    unsetenv("FAKE_CUDA_MODULE_LOAD_OOM");
    res->value += 10 * (stat(path, &after) == 0 && after.st_ino == before.st_ino); /* not rewritten */
    res->value += 100 * (strstr(capex_last_error(), "older than the NVRTC") == NULL);
out:
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    capex_cuda_context_destroy(ctx);
}

CT_TEST(module_cache_offline_fill_and_load_errors) {
    char dir[64] = "/tmp/capex_jit_test_XXXXXX";
    child_result r;
    CT_NEED_NVRTC();
    CT_CHECK(mkdtemp(dir) != NULL, "temp dir");
    r = run_child("module_cache", dir);
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_OUT_OF_MEMORY, "out of memory passed through: %d %s", r.code, r.message);
    CT_CHECK(r.value % 10 == 1, "offline entry (no name) is a hit for module_compile");
    CT_CHECK((r.value / 10) % 10 == 1, "the entry is not recompiled over on a non-image error");
    CT_CHECK(r.value / 100 == 1, "no driver-version hint for out of memory: %s", r.message);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CT_CHECK(system(cmd) == 0, "clean up");
    }
}

static void *locale_worker(void *arg) {
    locale_job *j = (locale_job *)arg;
    locale_t own = (locale_t)0, prev = (locale_t)0;
    int i;
    if (j->kind == 2) { /* a thread with its own decimal-comma locale */
        own = newlocale(LC_NUMERIC_MASK, "de_DE.UTF-8", (locale_t)0);
        if (!own) { j->failed++; return NULL; }
        prev = uselocale(own);
    }
    if (j->kind == 1) { /* the parallel compile of every built-in part */
        capex_cuda_image imgs[64];
        int p, np = capex_cuda_builtin_part_count();
        if (capex_cuda_builtin_compile_parts(90, NULL, 4, imgs) != CAPEX_OK) { j->failed++; return NULL; }
        for (p = 0; p < np; p++) {
            j->bad += !image_saw_c_locale(&imgs[p]);
            capex_cuda_image_free(&imgs[p]);
        }
        return NULL;
    }
    for (i = 0; i < 6; i++) {
        capex_cuda_compile_desc d;
        capex_cuda_image img;
        capex_cuda_compile_desc_init(&d);
        d.source = "extern \"C\" __global__ void k(float *x) { x[0] = 1.5f; }";
        d.device_cc = 90;
        if (capex_cuda_compile(&d, &img) != CAPEX_OK) { j->failed++; continue; }
        j->bad += !image_saw_c_locale(&img);
        capex_cuda_image_free(&img);
    }
    if (own) {
        j->bad += nl_langinfo(RADIXCHAR)[0] != ','; /* the thread's own locale is back */
        uselocale(prev);
        freelocale(own);
    }
    return NULL;
}

static void child_locale_threads(const char *arg, child_result *res) {
    char ok[1024];
    pthread_t th[6];
    locale_job jobs[6];
    int i, started = 0;
    (void)arg;
    res->code = -1;
    if (!setlocale(LC_NUMERIC, "de_DE.UTF-8")) {
        res->code = CHILD_SKIPPED;
        snprintf(res->message, sizeof res->message, "no de_DE.UTF-8 locale installed");
        return;
    }
    if (!sibling_path("fake", "nvrtc_ok/lib64/libnvrtc.so.12", ok, sizeof ok)) return;
    setenv("CAPEX_NVRTC_PATH", ok, 1);
    setenv("FAKE_NVRTC_SLEEP_MS", "3", 1); /* compiles overlap */
    memset(jobs, 0, sizeof jobs);
    for (i = 0; i < 6; i++) {
        jobs[i].kind = i == 0 ? 1 : i == 1 ? 2 : 0;
        started += pthread_create(&th[i], NULL, locale_worker, &jobs[i]) == 0;
    }
    res->value = 0;
    for (i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (i = 0; i < 6; i++) {
        res->value += jobs[i].bad;
        if (jobs[i].failed) snprintf(res->message, sizeof res->message, "job %d failed: %s", i, capex_last_error());
    }
    res->code = started == 6 && !jobs[0].failed && !jobs[1].failed && !jobs[2].failed ? CAPEX_OK : CAPEX_ERR_INTERNAL;
    /* the process's locale is what it was */
    if (nl_langinfo(RADIXCHAR)[0] != ',' || strncmp(setlocale(LC_NUMERIC, NULL), "de_DE", 5) != 0) res->value += 100;
}

CT_TEST(concurrent_compiles_see_c_numeric_locale) {
    child_result r = run_child("locale_threads", NULL);
    CT_CHECK(r.exited_ok, "child crashed");
    if (r.code == CHILD_SKIPPED) CT_SKIP("%s", r.message);
    CT_CHECK(r.code == CAPEX_OK, "compiles on 6 threads: %s", r.message);
    CT_CHECK(r.value == 0, "%d compiles saw a decimal comma, or a locale was not restored (+100: the process's)", r.value);
}

static void child_nccl(const char *arg, child_result *res) {
    int v = 0;
    if (arg) setenv("CAPEX_NCCL_PATH", arg, 1);
    res->code = capex_cuda_nccl_version(&v);
    res->value = v;
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
}

CT_TEST(nccl_status) {
    child_result r = run_child("nccl", "/nonexistent/libnccl.so.2");
    CT_CHECK(r.exited_ok, "child crashed");
    CT_CHECK(r.code == CAPEX_ERR_NO_NCCL && strstr(r.message, "/nonexistent/libnccl.so.2"), "%d %s", r.code, r.message);
    r = run_child("nccl", NULL);
    CT_CHECK(r.exited_ok, "child crashed");
    if (r.code == CAPEX_ERR_NO_NCCL) {
        CT_CHECK(strstr(r.message, "libnccl.so.2"), "%s", r.message);
        CT_SKIP("libnccl.so.2 not installed: %s", r.message);
    }
    CT_CHECK(r.code == CAPEX_OK && r.value >= 20000, "NCCL version %d: %s", r.value, r.message);
}

CT_TEST(invalid_arguments) {
    capex_cuda_function f;
    unsigned g[3] = {1, 1, 1};
    int n;
    CT_CHECK(capex_cuda_driver_version(NULL) == CAPEX_ERR_INVALID_ARG, "driver_version(NULL)");
    CT_CHECK(capex_cuda_nvrtc_version(NULL, NULL) == CAPEX_ERR_INVALID_ARG, "nvrtc_version(NULL)");
    CT_CHECK(capex_cuda_nccl_version(NULL) == CAPEX_ERR_INVALID_ARG, "nccl_version(NULL)");
    CT_CHECK(capex_cuda_device_count(NULL) == CAPEX_ERR_INVALID_ARG, "device_count(NULL)");
    CT_CHECK(capex_cuda_nvrtc_supported_archs(NULL, 4, &n) == CAPEX_ERR_INVALID_ARG, "archs NULL");
    CT_CHECK(capex_cuda_context_create(NULL, NULL) == CAPEX_ERR_INVALID_ARG, "context out NULL");
    { /* precompile outside 0..2 is refused before any driver use, not taken as 0 */
        static const int bad[] = {3, -1, 100};
        int b;
        for (b = 0; b < 3; b++) {
            capex_cuda_context_desc cd;
            capex_cuda_context *ctx = NULL;
            capex_cuda_context_desc_init(&cd);
            cd.precompile = bad[b];
            CT_CHECK(capex_cuda_context_create(&cd, &ctx) == CAPEX_ERR_INVALID_ARG && ctx == NULL &&
                     strstr(capex_last_error(), "precompile"), "precompile %d: %s", bad[b], capex_last_error());
            capex_cuda_context_destroy(ctx);
        }
        for (b = 0; b < 3; b++) { /* disk_cache is 0 or 1: a 2 or -1 is a typo, not "on" */
            capex_cuda_context_desc cd;
            capex_cuda_context *ctx = NULL;
            capex_cuda_context_desc_init(&cd);
            cd.disk_cache = bad[b] == 3 ? 2 : bad[b];
            CT_CHECK(capex_cuda_context_create(&cd, &ctx) == CAPEX_ERR_INVALID_ARG && ctx == NULL &&
                     strstr(capex_last_error(), "disk_cache"), "disk_cache %d: %s", cd.disk_cache, capex_last_error());
            capex_cuda_context_destroy(ctx);
        }
    }
    { /* a negative ordinal is a bad argument, not a missing GPU */
        capex_cuda_device_info info;
        capex_result r = capex_cuda_device_get_info(-1, &info);
        CT_CHECK(r == CAPEX_ERR_INVALID_ARG, "device_get_info(-1): %s: %s",
                 capex_result_string(r), capex_last_error());
    }
    memset(&f, 0, sizeof f);
    CT_CHECK(capex_cuda_launch(&f, g, g, 0, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "launch of an unset function");
    CT_CHECK(capex_cuda_launch(NULL, g, g, 0, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "launch NULL");
    CT_CHECK(capex_cuda_module_get_function(NULL, "k", &f) == CAPEX_ERR_INVALID_ARG, "get_function NULL module");
    CT_CHECK(capex_cuda_module_compile(NULL, "x", "x", NULL, 0, NULL) == CAPEX_ERR_INVALID_ARG, "compile out NULL");
    CT_CHECK(capex_cuda_module_info(NULL, NULL, NULL) == CAPEX_ERR_INVALID_ARG, "info NULL");
    capex_cuda_context_destroy(NULL);
    CT_CHECK(capex_cuda_context_device(NULL) == NULL, "device of NULL");
}

/* ---- 32 KB kernel parameters: the choice and the options it gives parts ---- */
CT_TEST(params_choice_and_part_options) {
    static const struct { const char *env; int drv, cc, nvrtc, code, large; } rows[] = {
        {NULL, 13000, 90, 13000, CAPEX_OK, 1},  {"", 12010, 70, 12010, CAPEX_OK, 1},  /* the minimums */
        {"auto", 12080, 80, 12080, CAPEX_OK, 1}, {NULL, 12000, 90, 13000, CAPEX_OK, 0}, /* driver 12.0 */
        {NULL, 13000, 61, 13000, CAPEX_OK, 0},  {NULL, 12090, 90, 12000, CAPEX_OK, 0}, /* Pascal; NVRTC 12.0 */
        {NULL, 13000, 90, 0, CAPEX_OK, 1},      /* no NVRTC: the disk cache alone serves */
        {"4096", 13000, 90, 13000, CAPEX_OK, 0}, {"32764", 13000, 90, 13000, CAPEX_ERR_CONFIG, 0},
        {"4096 ", 13000, 90, 13000, CAPEX_ERR_CONFIG, 0}};
    unsigned char ks[32], kl[32];
    int i, p, n_small, n_large, meta = -1, go_parts = 0;
    for (i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
        capex_result r = capex__cuda_params_choose(rows[i].env, rows[i].drv, rows[i].cc, rows[i].nvrtc, &meta);
        CT_CHECK(r == rows[i].code && meta == (rows[i].large ? CAPEX__GO_META_LARGE : CAPEX__GO_META_SMALL),
                 "row %d: %d, %d bytes", i, (int)r, meta);
        if (r != CAPEX_OK) CT_CHECK(strstr(capex_last_error(), "CAPEX_CUDA_PARAMS") && strstr(capex_last_error(), "4096"), "%s",
                                    capex_last_error());
    }
    /* the large build adds its -D to the parts with the launch metadata only, and changes their keys */
    for (p = 0; p < CAPEX__CUDA_N_PARTS; p++) {
        const char *const *os = capex__cuda_part_options(p, CAPEX__GO_META_SMALL, &n_small);
        const char *const *ol = capex__cuda_part_options(p, CAPEX__GO_META_LARGE, &n_large);
        const char *src = capex_cuda_builtin_part_source(p);
        int has_meta = strstr(src, "struct capex_go_meta") != NULL;
        int n0 = 0;
        CT_CHECK(os == capex_cuda_builtin_options(&n0) && n_small == n0, "part %d: 4 KB options are the built-in ones", p);
        CT_CHECK(n_large == n_small + has_meta, "part %s: %d options", capex_cuda_builtin_part_name(p), n_large);
        if (has_meta) CT_CHECK(!strcmp(ol[n_large - 1], "-DCAPEX_GO_META=32512"), "%s", ol[n_large - 1]);
        capex__cuda_cache_key(src, capex__cuda_part_prog[p], os, n_small, 90, ks);
        capex__cuda_cache_key(src, capex__cuda_part_prog[p], ol, n_large, 90, kl);
        CT_CHECK((memcmp(ks, kl, 32) != 0) == has_meta, "part %d keys", p);
        go_parts += has_meta;
    }
    CT_CHECK(go_parts >= 20 && strstr(capex_cuda_builtin_part_source(CAPEX__CP_ADAM_F32), "struct capex_go_meta") &&
             !strstr(capex_cuda_builtin_part_source(CAPEX__CP_NORM_FWD), "struct capex_go_meta"), "%d parts with metadata", go_parts);
    /* NVRTC builds the large variant (PTX ISA 8.1+) for the lowest and the H100 arch */
    CT_NEED_NVRTC();
    {
        static const int archs[2] = {75, 90};
        int a;
        for (a = 0; a < 2; a++) {
            capex_cuda_compile_desc d;
            capex__cuda_unit_opts o;
            capex_cuda_image img;
            const char *ptx;
            capex__cuda_unit_desc(CAPEX__CP_ADAM_F32, archs[a], CAPEX__GO_META_LARGE, NULL, &o, &d);
            CT_CHECK(d.n_options == n_small + 1, "desc options");
            {
                capex_cuda_target t;
                t.kind = CAPEX_CUDA_IMAGE_PTX;
                t.arch = archs[a];
                CT_CHECK(capex_cuda_nvrtc_compile(d.source, d.name, d.options, d.n_options, t, &img) == CAPEX_OK, "sm_%d: %s",
                         archs[a], capex_last_error());
            }
            ptx = (const char *)img.data;
            /* capex_go_adam_f32's metadata: 8 * (6 + 2) * 507 + 8 bytes */
            CT_CHECK(strstr(ptx, "capex_go_adam_f32_param_0[32456]") != NULL, "sm_%d: the large metadata parameter", archs[a]);
            capex_cuda_image_free(&img);
        }
    }
}

/* The choice on the stand-in driver (tests/fake_libcuda.c: a context, no
   GPU), one process per driver version (it is read once): arg "DRIVER NVRTC
   PARAMS" (NVRTC "none": no library; PARAMS "-": unset). value: the
   context's metadata bytes. */
static void child_params(const char *arg, child_result *res) {
    char drv[1024], nv[1024], dv[16], nvv[16], pv[16];
    capex_cuda_context_desc cd;
    capex_cuda_context *ctx = NULL;
    capex__go_exec ex;
    res->code = -1;
    if (sscanf(arg, "%15s %15s %15s", dv, nvv, pv) != 3 || !sibling_path("fake", "libcuda.so.1", drv, sizeof drv) ||
        !sibling_path("fake", "nvrtc_ok/lib64/libnvrtc.so.12", nv, sizeof nv))
        return;
    setenv("CAPEX_LIBCUDA_PATH", drv, 1);
    setenv("FAKE_CUDA_DRIVER_VERSION", dv, 1);
    if (!strcmp(nvv, "none")) setenv("CAPEX_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    else {
        setenv("CAPEX_NVRTC_PATH", nv, 1);
        setenv("FAKE_NVRTC_VERSION", nvv, 1);
    }
    if (strcmp(pv, "-") != 0) setenv("CAPEX_CUDA_PARAMS", pv, 1);
    else unsetenv("CAPEX_CUDA_PARAMS");
    capex_cuda_context_desc_init(&cd);
    cd.device = 0;
    cd.disk_cache = 0;
    res->code = capex_cuda_context_create(&cd, &ctx);
    snprintf(res->message, sizeof res->message, "%s", capex_last_error());
    if (res->code != CAPEX_OK) return;
    res->value = capex__go_dev_exec(ctx, "test", &ex) == CAPEX_OK && ex.meta_bytes == ctx->meta_bytes ? ctx->meta_bytes : -1;
    if (!strcmp(nvv, "none") && ctx->meta_bytes == CAPEX__GO_META_LARGE) { /* no compiler, no cache: the error names the way out */
        capex_cuda_function fn;
        capex_result g = capex__cuda_builtin_get(ctx, CAPEX__GO_KBASE, &fn);
        if (g != CAPEX_ERR_NO_NVRTC || !strstr(capex_last_error(), "CAPEX_CUDA_PARAMS=4096") ||
            !strstr(capex_last_error(), "NVRTC")) { /* NVRTC's own message kept */
            res->value = -2;
            snprintf(res->message, sizeof res->message, "built-in kernel without NVRTC: %d: %s", (int)g, capex_last_error());
        }
    }
    capex_cuda_context_destroy(ctx);
}

CT_TEST(params_on_the_stand_in_driver) {
    static const struct { const char *arg; int code, meta; } rows[] = {
        {"13000 13.0 -", CAPEX_OK, CAPEX__GO_META_LARGE},    {"12010 12.1 -", CAPEX_OK, CAPEX__GO_META_LARGE},
        {"12000 13.0 -", CAPEX_OK, CAPEX__GO_META_SMALL},    {"13000 12.0 -", CAPEX_OK, CAPEX__GO_META_SMALL},
        {"13000 none -", CAPEX_OK, CAPEX__GO_META_LARGE},    {"13000 13.0 4096", CAPEX_OK, CAPEX__GO_META_SMALL},
        {"13000 13.0 auto", CAPEX_OK, CAPEX__GO_META_LARGE}, {"13000 13.0 4k", CAPEX_ERR_CONFIG, 0}};
    int i;
    for (i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
        child_result r = run_child("params", rows[i].arg);
        CT_CHECK(r.exited_ok && r.code != -1, "%s: child failed: %s", rows[i].arg, r.message);
        CT_CHECK(r.code == rows[i].code && (r.code != CAPEX_OK || r.value == rows[i].meta), "%s: %d, %d bytes: %s", rows[i].arg,
                 r.code, r.value, r.message);
        if (r.code == CAPEX_ERR_CONFIG) CT_CHECK(strstr(r.message, "CAPEX_CUDA_PARAMS='4k'"), "%s", r.message);
    }
}

static const ct_case cases[] = {
    CT_CASE(select_target_table),
    CT_CASE(builtin_source_is_self_contained),
    CT_CASE(builtin_parts_split_the_program),
    CT_CASE(builtin_parts_compile_cubin_for_every_ci_arch), CT_CASE(builtin_variants_compile),
    CT_CASE(builtin_compiles_ptx_for_highest_arch),
    CT_CASE(compile_selects_target_from_device_cc),
    CT_CASE(broken_source_returns_nvrtc_log),
    CT_CASE(user_source_gets_its_options),
    CT_CASE(locale_restored_around_compile),
    CT_CASE(no_driver_status),
    CT_CASE(no_nvrtc_status),
    CT_CASE(nvrtc_search_finds_toolkit),
    CT_CASE(nvrtc_search_prefers_driver_major_and_skips_unusable),
    CT_CASE(concurrent_compiles_see_c_numeric_locale),
    CT_CASE(compile_does_not_hold_the_context),
    CT_CASE(module_cache_offline_fill_and_load_errors),
    CT_CASE(nccl_status),
    CT_CASE(invalid_arguments),
    CT_CASE(params_choice_and_part_options),
    CT_CASE(params_on_the_stand_in_driver),
};
static const child_entry children[] = {{"driver", child_driver},
                                       {"nvrtc", child_nvrtc},
                                       {"nvrtc_search", child_nvrtc_search},
                                       {"locale_threads", child_locale_threads},
                                       {"compile_unlocked", child_compile_unlocked},
                                       {"module_cache", child_module_cache},
                                       {"nccl", child_nccl},
                                       {"params", child_params}};

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) return child_main(children, sizeof children / sizeof children[0], argc, argv);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
