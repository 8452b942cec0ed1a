/* A stand-in for libnvrtc.so (no code generation) for the loader and locale
   tests in tests/test_cuda_jit.c:
   - FAKE_NVRTC_VERSION="12.9" sets what nvrtcVersion reports (default 13.0);
   - built with -DFAKE_NVRTC_NO_ARCHS it lacks nvrtcGetSupportedArchs, as
     NVRTC before 11.2 does (a library that opens but is unusable);
   - FAKE_NVRTC_SLEEP_MS makes each compile take that long (overlap in tests);
   - FAKE_NVRTC_WAIT=path: a source containing "FAKE_NVRTC_WAIT" creates
     path.in when its compile starts, then waits until path exists;
   - the "image" is PTX-shaped text that tests/fake_libcuda.c loads: a line
     with the LC_NUMERIC decimal point the compile saw ("// decimal point: .";
     NVRTC parses numbers with the C library, so "," would misread them),
     .version and .target lines, then the source (kernel names findable). */
#include <langinfo.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct fake_prog { char *image; } fake_prog;

const char *nvrtcGetErrorString(int r) { return r ? "NVRTC_ERROR_COMPILATION" : "NVRTC_SUCCESS"; }

int nvrtcVersion(int *major, int *minor) {
    const char *v = getenv("FAKE_NVRTC_VERSION");
    *major = 13;
    *minor = 0;
    if (v && sscanf(v, "%d.%d", major, minor) != 2) return 1;
    return 0;
}

int nvrtcGetNumSupportedArchs(int *n) {
    *n = 7;
    return 0;
}
#ifndef FAKE_NVRTC_NO_ARCHS
int nvrtcGetSupportedArchs(int *a) {
    static const int archs[] = {75, 80, 86, 89, 90, 100, 120};
    memcpy(a, archs, sizeof archs);
    return 0;
}
#endif

int nvrtcCreateProgram(void **p, const char *src, const char *name, int n, const char *const *h, const char *const *i) {
    fake_prog *q = (fake_prog *)calloc(1, sizeof *q);
    (void)name, (void)n, (void)h, (void)i;
    if (!q || !(q->image = (char *)malloc(strlen(src) + 80))) return 3; /* NVRTC_ERROR_OUT_OF_MEMORY */
    strcpy(q->image, src); /* replaced at compile time */
    *p = q;
    return 0;
}

int nvrtcDestroyProgram(void **p) {
    fake_prog *q = (fake_prog *)*p;
    if (q) free(q->image), free(q);
    *p = NULL;
    return 0;
}

int nvrtcCompileProgram(void *p, int n, const char *const *o) {
    fake_prog *q = (fake_prog *)p;
    const char *ms = getenv("FAKE_NVRTC_SLEEP_MS");
    char *src = strdup(q->image);
    (void)n, (void)o;
    if (!src) return 3;
    const char *wait = getenv("FAKE_NVRTC_WAIT");
    struct timespec ts;
    ts.tv_sec = 0;
    if (ms) {
        ts.tv_nsec = atol(ms) * 1000000L;
        nanosleep(&ts, NULL);
    }
    if (wait && strstr(src, "FAKE_NVRTC_WAIT")) {
        char in[1024];
        FILE *f;
        snprintf(in, sizeof in, "%s.in", wait);
        if ((f = fopen(in, "w")) != NULL) fclose(f);
        ts.tv_nsec = 1000000L;
        while (access(wait, F_OK) != 0) nanosleep(&ts, NULL);
    }
    /* nl_langinfo reads this thread's locale (localeconv fills one buffer for all threads) */
    sprintf(q->image, "// decimal point: %c\n.version 8.0\n.target sm_90\n%s", nl_langinfo(RADIXCHAR)[0], src);
    free(src);
    return 0;
}

int nvrtcGetPTXSize(void *p, size_t *s) {
    *s = strlen(((fake_prog *)p)->image) + 1;
    return 0;
}
int nvrtcGetPTX(void *p, char *out) {
    strcpy(out, ((fake_prog *)p)->image);
    return 0;
}
int nvrtcGetCUBINSize(void *p, size_t *s) { return nvrtcGetPTXSize(p, s); }
int nvrtcGetCUBIN(void *p, char *out) { return nvrtcGetPTX(p, out); }
int nvrtcGetProgramLogSize(void *p, size_t *s) {
    (void)p;
    *s = 1;
    return 0;
}
int nvrtcGetProgramLog(void *p, char *out) {
    (void)p;
    out[0] = '\0';
    return 0;
}
