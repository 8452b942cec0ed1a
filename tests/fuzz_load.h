/* fuzz_load.h - shared by the loader fuzz targets (tests/fuzz_optim_load.c,
   tests/fuzz_scaler_load.c).

   A mutated state file almost never keeps a valid CRC-32, so without help
   every input would stop at the checksum. capex_fuzz_fixup() repairs what the
   checksum and the container framing need, as a user editing a file with the
   documented rule would: the 8-byte header length is set to the end of the
   top-level JSON object (so bytes inserted or removed in the header keep it
   consistent), then "capex_crc32" is re-stamped over the whole file. The
   loaders' semantic checks then see the mutation itself.

   Each target's CAPEX_FUZZ_GEN build is a seed generator: it saves real
   checkpoints made by the library into a directory (the committed corpora
   under tests/corpus/). */
#ifndef CAPEX_FUZZ_LOAD_H
#define CAPEX_FUZZ_LOAD_H
#ifndef CAPEX_IMPLEMENTATION
#define CAPEX_IMPLEMENTATION
#endif
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* libFuzzer reports the input on abort; the line says which invariant broke. */
#define CAPEX_FUZZ_REQUIRE(c)                                                                             \
    do {                                                                                                  \
        if (!(c)) {                                                                                       \
            fprintf(stderr, "%s:%d: invariant failed: %s (last error: %s)\n", __FILE__, __LINE__, #c,      \
                    capex_last_error());                                                                  \
            abort();                                                                                      \
        }                                                                                                 \
    } while (0)

/* Fixes the header length and re-stamps capex_crc32 in place (see above). */
static void capex_fuzz_fixup(unsigned char *b, size_t n) {
    static const char key[] = "\"capex_crc32\":\"";
    const size_t kl = sizeof key - 1;
    size_t i, end = 0, hlen;
    uint64_t h = 0;
    int depth = 0, in_str = 0, esc = 0;
    if (n < 10) return;
    for (i = 8; i < n && !end; i++) {
        unsigned char c = b[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{') {
            depth++;
        } else if (c == '}' && depth > 0 && --depth == 0) {
            end = i + 1;
        }
    }
    if (!end) return;
    for (i = 0; i < 8; i++) h |= (uint64_t)b[i] << (8 * i);
    /* Keep a length that covers the object plus space padding and ends where
       the padding does; else take the object and every space after it (the
       writer pads with spaces; a first data byte 0x20 is the rare loss). */
    if (h < n - 8 && 8 + h >= end && b[8 + h] != ' ') {
        for (i = end; i < 8 + h; i++)
            if (b[i] != ' ') break;
        if (i != 8 + h) h = 0;
    } else {
        h = 0;
    }
    if (!h) {
        for (i = end; i < n && b[i] == ' '; i++) {}
        h = i - 8;
    }
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(h >> (8 * i));
    hlen = (size_t)h;
    for (i = 8; i + kl + 8 <= 8 + hlen; i++)
        if (memcmp(b + i, key, kl) == 0) {
            unsigned char *at = b + i + kl;
            char hex[9];
            memset(at, '0', 8);
            snprintf(hex, sizeof hex, "%08lx", (unsigned long)capex_crc32(0, b, n));
            memcpy(at, hex, 8);
            return;
        }
}

#ifdef CAPEX_FUZZ_GEN
/* Writes w's file to dir/name and returns it in memory too (the seed
   generators check that each seed loads). */
static unsigned char *capex_fuzz_write_seed(capex_state_writer *w, const char *dir, const char *name, size_t *len) {
    char path[1024];
    unsigned char *buf = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (capex_state_write_file(w, path) != CAPEX_OK || capex_state_write_memory(w, NULL, 0, len) != CAPEX_OK ||
        !(buf = (unsigned char *)malloc(*len)) || capex_state_write_memory(w, buf, *len, len) != CAPEX_OK) {
        fprintf(stderr, "%s: %s\n", path, capex_last_error());
        exit(1);
    }
    printf("wrote %s (%lu bytes)\n", path, (unsigned long)*len);
    return buf;
}
#endif

#ifdef CAPEX_FUZZ_REPLAY
/* Without libFuzzer (plain cc): runs the target once on each file named,
   e.g. the committed seeds or a crash input. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int main(int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        unsigned char *buf = NULL;
        long n;
        if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
            !(buf = (unsigned char *)malloc((size_t)n + 1)) || fread(buf, 1, (size_t)n, f) != (size_t)n) {
            fprintf(stderr, "cannot read %s\n", argv[i]);
            return 1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf, (size_t)n);
        free(buf);
    }
    printf("replayed %d input%s\n", argc - 1, argc == 2 ? "" : "s");
    return 0;
}
#endif
#endif
