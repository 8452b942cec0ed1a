/* Writes the CUBIN of every built-in kernel part for each sm given on the
   command line: <dir>/sm_<arch>/<part>.cubin. No GPU or driver is needed
   (NVRTC only). Input of the static SASS gate (tests/sass_gate.py).
   Exit 0 when all were written, 2 when NVRTC cannot be loaded (the gate then
   skips, saying why), 1 on any other failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
    int a, p, n_opts = 0;
    const char *const *opts = capex_cuda_builtin_options(&n_opts);
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUTDIR ARCH... (e.g. build/sass 80 90 100)\n", argv[0]);
        return 1;
    }
    mkdir(argv[1], 0777);
    for (a = 2; a < argc; a++) {
        char dir[1200];
        int arch = atoi(argv[a]);
        if (arch <= 0) {
            fprintf(stderr, "sass_dump: bad arch '%s'\n", argv[a]);
            return 1;
        }
        snprintf(dir, sizeof dir, "%s/sm_%d", argv[1], arch);
        mkdir(dir, 0777);
        for (p = 0; p < capex_cuda_builtin_part_count(); p++) {
            capex_cuda_target t;
            capex_cuda_image img;
            capex_result r;
            char path[1400];
            FILE *f;
            memset(&img, 0, sizeof img);
            t.kind = CAPEX_CUDA_IMAGE_CUBIN; /* machine code: what ptxas made for this sm */
            t.arch = arch;
            r = capex_cuda_nvrtc_compile(capex_cuda_builtin_part_source(p), capex_cuda_builtin_part_name(p), opts, n_opts, t, &img);
            if (r != CAPEX_OK) {
                fprintf(stderr, "sass_dump: sm_%d part %s: %s\n", arch, capex_cuda_builtin_part_name(p), capex_last_error());
                return r == CAPEX_ERR_NO_NVRTC ? 2 : 1;
            }
            snprintf(path, sizeof path, "%s/%s.cubin", dir, capex_cuda_builtin_part_name(p));
            f = fopen(path, "wb");
            if (!f || fwrite(img.data, 1, img.size, f) != img.size || fclose(f) != 0) {
                fprintf(stderr, "sass_dump: cannot write %s\n", path);
                return 1;
            }
            if (a == 2 && p == 0) { /* the compiler version, for the table's header */
                snprintf(path, sizeof path, "%s/nvrtc_version", argv[1]);
                f = fopen(path, "w");
                if (f) {
                    fprintf(f, "%d.%d\n", img.nvrtc_version / 1000, img.nvrtc_version % 1000 / 10);
                    fclose(f);
                }
            }
            capex_cuda_image_free(&img);
        }
    }
    return 0;
}
