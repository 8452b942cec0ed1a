/* test_readme.c - README.md's quick start, exactly as pasted, compiles
   warning-free and trains.

   The first ```c block under "## Quick start" is copied to a temp directory,
   compiled against this checkout's capex.h with -Werror by the compiler and
   flags that built this test (so `make sanitize` builds it under ASan/UBSan)
   and by gcc -O2 (which reports -Wmaybe-uninitialized), then run: its loss
   must fall by more than 100x and w, b must reach 3 and -1. Runs from the
   repository root, as `make test` does. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "capex_test.h"

#ifndef README_CC
#define README_CC "cc"
#endif
#ifndef README_CFLAGS
#define README_CFLAGS "-std=c99 -O2"
#endif

/* The quick start's code into out (NUL-terminated); 0 when not found. */
static int extract_quick_start(const char *readme, char *out, size_t cap, char *why, size_t why_cap) {
    FILE *f = fopen(readme, "r");
    char line[4096];
    int state = 0; /* 0: before the heading, 1: before the block, 2: in it */
    size_t n = 0;
    if (!f) {
        snprintf(why, why_cap, "cannot open %s (run from the repository root)", readme);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        if (state == 0 && strcmp(line, "## Quick start\n") == 0) state = 1;
        else if (state == 1 && strncmp(line, "## ", 3) == 0) break; /* next section: no block */
        else if (state == 1 && strcmp(line, "```c\n") == 0) state = 2;
        else if (state == 2 && strcmp(line, "```\n") == 0) { state = 3; break; }
        else if (state == 2) {
            size_t k = strlen(line);
            if (n + k + 1 > cap) { snprintf(why, why_cap, "quick start longer than %zu bytes", cap); fclose(f); return 0; }
            memcpy(out + n, line, k);
            n += k;
        }
    }
    fclose(f);
    out[n] = '\0';
    if (state != 3) {
        snprintf(why, why_cap, "%s: no closed ```c block under \"## Quick start\"", readme);
        return 0;
    }
    return 1;
}

static int run_cmd(const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static int run_cmd(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    int st;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int have_gcc(void) { return run_cmd("gcc --version > /dev/null 2>&1") == 0; }

/* Compiles dir/quickstart.c to dir/<exe>; on failure, why holds the log's start. */
static int compile(const char *dir, const char *root, const char *cc, const char *flags, const char *exe, char *why,
                   size_t why_cap) {
    char log[512];
    FILE *f;
    size_t k;
    snprintf(log, sizeof log, "%s/%s.log", dir, exe);
    if (run_cmd("%s %s -Wall -Wextra -pedantic -Werror -I'%s' '%s/quickstart.c' -o '%s/%s' -lm > '%s' 2>&1", cc, flags,
                root, dir, dir, exe, log) == 0)
        return 1;
    k = (size_t)snprintf(why, why_cap, "%s %s -Werror: ", cc, flags);
    f = fopen(log, "r");
    if (f && k < why_cap) {
        size_t got = fread(why + k, 1, why_cap - k - 1, f);
        why[k + got] = '\0';
    }
    if (f) fclose(f);
    return 0;
}

/* Runs the program; 1 when it trained. */
static int trains(const char *dir, const char *exe, char *why, size_t why_cap) {
    char cmd[1024], line[512];
    FILE *p;
    double first = -1, last = -1, w = 0, b = 0;
    int st, have_last = 0;
    snprintf(cmd, sizeof cmd, "'%s/%s' 2> /dev/null", dir, exe);
    p = popen(cmd, "r");
    if (!p) { snprintf(why, why_cap, "popen %s failed", cmd); return 0; }
    while (fgets(line, sizeof line, p)) {
        int step;
        double l;
        if (sscanf(line, "step %d loss %lf", &step, &l) == 2 && step == 0) first = l;
        if (sscanf(line, "final loss %lf w %lf b %lf", &last, &w, &b) == 3) have_last = 1;
    }
    st = pclose(p);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(why, why_cap, "%s exited with status %d", exe, st);
        return 0;
    }
    if (first <= 0 || !have_last) {
        snprintf(why, why_cap, "%s printed no \"step 0  loss\" or \"final loss .. w .. b ..\" line", exe);
        return 0;
    }
    if (!(last < first / 100) || fabs(w - 3) > 0.05 || fabs(b + 1) > 0.05) {
        snprintf(why, why_cap, "%s did not train: loss %g -> %g, w %g (3), b %g (-1)", exe, first, last, w, b);
        return 0;
    }
    return 1;
}

CT_TEST(quick_start_compiles_and_trains) {
    static char code[16384];
    char why[1536], dir[] = "/tmp/capex-readme.XXXXXX", root[1024], path[1100];
    FILE *f;
    int ok;
    CT_CHECK(getcwd(root, sizeof root) != NULL, "getcwd failed");
    CT_CHECK(extract_quick_start("README.md", code, sizeof code, why, sizeof why), "%s", why);
    CT_CHECK(strstr(code, "int main(") != NULL, "the quick start has no main(): not a whole program");
    CT_CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
    snprintf(path, sizeof path, "%s/quickstart.c", dir);
    f = fopen(path, "w");
    CT_CHECK(f != NULL, "cannot write %s", path);
    ok = fputs(code, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    CT_CHECK(ok, "cannot write %s", path);
    ok = compile(dir, root, README_CC, README_CFLAGS, "qs_cc", why, sizeof why) && trains(dir, "qs_cc", why, sizeof why);
    if (ok && have_gcc())
        ok = compile(dir, root, "gcc", "-std=c99 -O2", "qs_gcc", why, sizeof why) && trains(dir, "qs_gcc", why, sizeof why);
    run_cmd("rm -rf '%s'", dir);
    CT_CHECK(ok, "README quick start: %s", why);
}

static const ct_case cases[] = {CT_CASE(quick_start_compiles_and_trains)};
CT_MAIN(cases)
