/* emu_gen.c - writes build/emu/kernels.inc for the CPU emulator driver
   (tests/emu_libcuda.cc, built by tests/emu.mk): each kernel set, that is
   capex_cuda_builtin_source() (the whole built-in program, exactly the text
   NVRTC compiles) and every file named on the command line (CUDA text, e.g.
   an example's model kernels), inside its own C++ namespace, followed by the
   table of its kernels (name -> thunk), found in the text itself:
   `__global__ void NAME(`, `CAPEX_KERNEL void NAME(`, `CAPEX_GK void NAME(`,
   `CAPEX_GK_OCC<n> void NAME(` (CAPEX_GK with launch bounds).

   Two rewrites make CUDA text host C++, both mechanical:
   - `extern "C"` is dropped (a kernel's C linkage would put every set's
     kernels in one global symbol space; inside the emulator the table gives
     each kernel its name);
   - `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer
     to the launch's dynamic shared-memory block. Function scope only.
   Everything else (__global__, __shared__, threadIdx, __shfl_down_sync, ...)
   is the shim's in tests/emu_libcuda.cc.

   The built-in set comes twice: as it is (4 KB of launch metadata) and with
   CAPEX_GO_META defined to the large size (what capex_cuda.h compiles with
   -DCAPEX_GO_META=... for a context with 32 KB kernel parameters); the
   driver tells them apart by the parameter bytes the image declares.

   Usage: emu_gen [FILE.cu ...] > kernels.inc   (the built-in sets are always first) */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <ctype.h>
#include <stdio.h>

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = (char *)malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
        if (buf) buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

static int is_id(int c) { return isalnum(c) || c == '_'; }
static int word_at(const char *s, const char *start, const char *w) {
    size_t n = strlen(w);
    return !strncmp(s, w, n) && (s == start || !is_id((unsigned char)s[-1])) && !is_id((unsigned char)s[n]);
}
static const char *skip_ws(const char *p) { while (*p && isspace((unsigned char)*p)) p++; return p; }

/* Prints the text with the two rewrites above. */
static void emit_text(const char *t) {
    const char *p = t;
    while (*p) {
        if (word_at(p, t, "extern")) {
            const char *q = skip_ws(p + 6);
            if (!strncmp(q, "\"C\"", 3)) { p = q + 3; continue; }
            if (word_at(q, t, "__shared__")) {
                /* extern __shared__ TYPE NAME[]; -> TYPE *NAME = (TYPE *)capex_emu_dyn_smem; */
                const char *d = skip_ws(q + 10), *semi = strchr(d, ';'), *e, *ne;
                char type[256];
                size_t tl = 0;
                if (!semi) { fputs(p, stdout); return; }
                e = semi;
                while (e > d && (isspace((unsigned char)e[-1]) || e[-1] == ']' || e[-1] == '[')) e--;
                ne = e;
                while (ne > d && is_id((unsigned char)ne[-1])) ne--;
                for (const char *c = d; c < ne && tl + 1 < sizeof type; c++) {
                    if (!strncmp(c, "__align__", 9)) { /* drop __align__(n) from the type */
                        while (c < ne && *c != ')') c++;
                        continue;
                    }
                    type[tl++] = *c;
                }
                type[tl] = '\0';
                printf("%s *%.*s = (%s *)capex_emu_dyn_smem;", type, (int)(e - ne), ne, type);
                p = semi + 1;
                continue;
            }
        }
        fputc(*p++, stdout);
    }
}

/* Kernel names: after __global__ / CAPEX_KERNEL / CAPEX_GK[_OCC<n>] (not in a #define
   or template line), `void NAME (`. */
static int find_kernels(const char *t, const char **names, size_t *lens, int cap) {
    static const char *const marks[] = {"__global__", "CAPEX_KERNEL", "CAPEX_GK", "CAPEX_GK_OCC3", "CAPEX_GK_OCC4"};
    int n = 0;
    for (const char *p = t; *p; p++) {
        for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
            const char *q, *line = p, *id;
            int skip = 0;
            if (!word_at(p, t, marks[m])) continue;
            while (line > t && line[-1] != '\n') line--;
            for (const char *c = line; c < p; c++)
                if (*c == '#' || word_at(c, t, "template") || (c[0] == '/' && (c[1] == '*' || c[1] == '/'))) skip = 1;
            if (skip) continue;
            q = skip_ws(p + strlen(marks[m]));
            if (!word_at(q, t, "void")) continue;
            id = q = skip_ws(q + 4);
            while (is_id((unsigned char)*q)) q++;
            if (q == id || *skip_ws(q) != '(') continue;
            if (n < cap) { names[n] = id; lens[n] = (size_t)(q - id); n++; }
        }
    }
    return n;
}

/* set 0: the built-in program, 1: the same with the large metadata, 2..argc: argv[1..],
   then the norm variant sets. */
#define EMU_LARGE_DEFINE "#undef CAPEX_GO_META\n#define CAPEX_GO_META " CAPEX__OPT_XSTR(CAPEX__GO_META_LARGE) "\n"
/* Norm variants compiled here with their -D switches (x, param, y dtype, rms),
   each of the two parts: the emulator runs them for a module whose image has
   the same tag, so a switch the kernel text applies to the wrong argument
   shows: between the two, every argument given another switch's value gets
   a different one (rms as a truth value), and RMSNorm's text runs too. */
static const int emu_norm_variants[][4] = {{2, 1, 0, 0}, {1, 2, 0, 1}};
#define EMU_N_NV (int)(sizeof emu_norm_variants / sizeof emu_norm_variants[0])
static char nv_label[2 * EMU_N_NV][32];
static const char *set_label(int set, int argc, char **argv) {
    return set == 0 ? "builtin" : set == 1 ? "builtin_large" : set <= argc ? argv[set - 1] : nv_label[set - argc - 1];
}

int main(int argc, char **argv) {
    enum { CAP = 4096 };
    static const char *names[CAP];
    static size_t lens[CAP];
    int set, total = 0, n_sets = argc + 1 + 2 * EMU_N_NV;
    printf("/* generated by tests/emu_gen.c: do not edit */\n");
    for (set = 0; set < n_sets; set++) {
        char *owned = NULL;
        const int nv = set > argc ? (set - argc - 1) / 2 : -1; /* a norm variant set: norm_fwd, then norm_bwd */
        const char *text = set < 2 ? capex_cuda_builtin_source()
                           : nv >= 0 ? capex_cuda_builtin_part_source((set - argc - 1) % 2 ? CAPEX__CP_NORM_BWD : CAPEX__CP_NORM_FWD)
                                     : (owned = read_all(argv[set - 1]));
        int n, k;
        if (!text) {
            fprintf(stderr, "emu_gen: cannot read %s\n", set < 2 || nv >= 0 ? "the built-in program" : argv[set - 1]);
            return 1;
        }
        if (nv >= 0)
            snprintf(nv_label[set - argc - 1], sizeof nv_label[0], "vnorm_%d_%d_%d_%d", emu_norm_variants[nv][0],
                     emu_norm_variants[nv][1], emu_norm_variants[nv][2], emu_norm_variants[nv][3]);
        n = find_kernels(text, names, lens, CAP);
        if (n > CAP) n = CAP;
        if (n == 0) {
            fprintf(stderr, "emu_gen: no kernel (extern \"C\" __global__ void NAME(...)) in %s\n", set_label(set, argc, argv));
            return 1;
        }
        /* an unnamed inner namespace: internal linkage for everything, so that
           all __shared__ variables can share one section (no COMDAT groups) */
        printf("/* ---- set %d: %s ---- */\nnamespace capex_emu_set%d {\nnamespace {\nusing namespace capex_emu_shim;\n", set,
               set < 2 ? "capex_cuda_builtin_source()" : set_label(set, argc, argv), set);
        if (set == 1) fputs(EMU_LARGE_DEFINE, stdout);
        if (nv >= 0)
            printf("#undef CAPEX_V_XT\n#undef CAPEX_V_PT\n#undef CAPEX_V_YT\n#undef CAPEX_V_RMS\n#define CAPEX_V_XT %d\n"
                   "#define CAPEX_V_PT %d\n#define CAPEX_V_YT %d\n#define CAPEX_V_RMS %d\n", emu_norm_variants[nv][0],
                   emu_norm_variants[nv][1], emu_norm_variants[nv][2], emu_norm_variants[nv][3]);
        emit_text(text);
        if (set == 1) fputs("\n#undef CAPEX_GO_META\n", stdout); /* the later sets get their own default */
        if (nv >= 0) /* the tag is used in the image only */
            fputs("\n[[maybe_unused]] static const int *capex_emu_tag = &CAPEX__NM_TAG(CAPEX_V_XT, CAPEX_V_PT, CAPEX_V_YT, CAPEX_V_RMS);\n"
                  "#undef CAPEX_V_XT\n#undef CAPEX_V_PT\n#undef CAPEX_V_YT\n#undef CAPEX_V_RMS\n", stdout);
        printf("\n} /* namespace */\n} /* namespace capex_emu_set%d */\n", set);
        printf("static const capex_emu::kernel_entry capex_emu_table%d[] = {\n", set);
        for (k = 0; k < n; k++) printf("    CAPEX_EMU_ENTRY(capex_emu_set%d, %.*s),\n", set, (int)lens[k], names[k]);
        printf("};\n");
        total += n;
        free(owned);
    }
    printf("static const capex_emu::kernel_set capex_emu_sets[] = {\n");
    for (set = 0; set < n_sets; set++)
        printf("    {\"%s\", capex_emu_table%d, sizeof capex_emu_table%d / sizeof capex_emu_table%d[0]},\n",
               set_label(set, argc, argv), set, set, set);
    printf("};\n/* %d kernels */\n", total);
    return 0;
}
