/* fuzz_state.c - libFuzzer target for the state-file parser.

   Build and run (tests/state.mk's ci-extra does this for ~20 s):
       clang -fsanitize=fuzzer,address,undefined -Itests tests/fuzz_state.c -o fuzz_state -lm
       ./fuzz_state corpus_dir -max_total_time=20
   Each input is opened as a capex file and as plain safetensors
   (CAPEX_STATE_OPEN_FOREIGN, which skips the checksum so mutations reach the
   JSON parser), then every getter runs on it, and whatever opens must survive
   a write/reopen round trip with identical contents. tests/test_state.c also
   includes this file and runs capex_fuzz_state_check() over its truncation and
   bit-flip corpora, so plain gcc builds exercise the same checks. */
#ifndef CAPEX_IMPLEMENTATION
#define CAPEX_IMPLEMENTATION
#endif
#include "../capex.h"
#include <stdlib.h>
#include <string.h>

/* Returns 0 when every invariant held, else a line number > 0. */
static int capex_fuzz_state_check(const uint8_t *data, size_t size) {
    unsigned pass;
    for (pass = 0; pass < 2; pass++) {
        capex_state_reader *r = NULL, *r2 = NULL;
        capex_state_writer *w = NULL;
        unsigned char *copy = NULL, *out = NULL, *buf = NULL;
        size_t i, n, outlen = 0;
        int bad = 0;
        capex_result rc = capex_state_reader_open_memory(data, size, pass ? CAPEX_STATE_OPEN_FOREIGN : 0u, NULL, &r);
        if (rc != CAPEX_OK) {
            if (r != NULL || rc >= 0 || capex_last_error()[0] == '\0') return __LINE__;
            continue;
        }
        if (capex_state_writer_create(NULL, &w) != CAPEX_OK) { capex_state_reader_close(r); return __LINE__; }
        n = capex_state_tensor_count(r);
        /* all tensor bytes together: at most the input size */
        copy = (unsigned char *)malloc(size + 1);
        for (i = 0; i < n && !bad; i++) {
            capex_state_tensor_info a, b;
            double d; float f; int64_t v;
            if (capex_state_tensor_at(r, i, &a) != CAPEX_OK) { bad = __LINE__; break; }
            if (capex_state_find(r, a.name, &b) != CAPEX_OK || b.file_offset != a.file_offset || b.nbytes != a.nbytes) { bad = __LINE__; break; }
            if (a.file_offset + a.nbytes > size || a.nbytes != a.numel * capex_state_dtype_size(a.dtype)) { bad = __LINE__; break; }
            buf = copy + a.file_offset;
            if (capex_state_read_tensor(r, a.name, a.dtype, a.numel, buf) != CAPEX_OK) { bad = __LINE__; break; }
            if (capex_state_read_tensor(r, a.name, a.dtype, a.numel + 1, buf) != CAPEX_ERR_SIZE_MISMATCH) { bad = __LINE__; break; }
            if (a.numel == 1) {
                if ((capex_state_get_f64(r, a.name, &d) == CAPEX_OK) != (a.dtype == CAPEX_STATE_F64)) { bad = __LINE__; break; }
                if ((capex_state_get_f32(r, a.name, &f) == CAPEX_OK) != (a.dtype == CAPEX_STATE_F32)) { bad = __LINE__; break; }
                if ((capex_state_get_i64(r, a.name, &v) == CAPEX_OK) != (a.dtype == CAPEX_STATE_I64)) { bad = __LINE__; break; }
            }
            if (capex_state_add_tensor(w, a.name, a.dtype, a.ndim, a.shape, buf) != CAPEX_OK) { bad = __LINE__; break; }
        }
        for (i = 0; i < capex_state_meta_count(r) && !bad; i++) {
            const char *k, *val, *val2;
            if (capex_state_meta_at(r, i, &k, &val) != CAPEX_OK) { bad = __LINE__; break; }
            if (capex_state_get_meta(r, k, &val2) != CAPEX_OK || strcmp(val, val2) != 0) { bad = __LINE__; break; }
            if (strcmp(k, "format") && strcmp(k, "capex_format_version") && strcmp(k, "capex_version") && strcmp(k, "capex_crc32"))
                if (capex_state_add_meta(w, k, val) != CAPEX_OK) bad = __LINE__;
        }
        if (!bad && capex_state_find(r, "\x01no such tensor", NULL) != CAPEX_ERR_INVALID_ARG) bad = __LINE__;
        /* round trip: what we read must write and reopen identically */
        if (!bad && capex_state_write_memory(w, NULL, 0, &outlen) != CAPEX_OK) bad = __LINE__;
        if (!bad) {
            out = (unsigned char *)malloc(outlen ? outlen : 1);
            if (capex_state_write_memory(w, out, outlen, &outlen) != CAPEX_OK) bad = __LINE__;
            else if (capex_state_reader_open_memory(out, outlen, 0, NULL, &r2) != CAPEX_OK) bad = __LINE__;
            else if (capex_state_tensor_count(r2) != n) bad = __LINE__;
            else
                for (i = 0; i < n && !bad; i++) {
                    capex_state_tensor_info a, b;
                    capex_state_tensor_at(r, i, &a);
                    if (capex_state_find(r2, a.name, &b) != CAPEX_OK || b.dtype != a.dtype || b.ndim != a.ndim ||
                        b.numel != a.numel || memcmp(out + b.file_offset, data + a.file_offset, (size_t)a.nbytes) != 0)
                        bad = __LINE__;
                }
        }
        capex_state_reader_close(r2);
        capex_state_reader_close(r);
        capex_state_writer_destroy(w);
        free(out);
        free(copy);
        if (bad) return bad;
    }
    return 0;
}

#ifndef CAPEX_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (capex_fuzz_state_check(data, size) != 0) abort(); /* libFuzzer reports the input */
    return 0;
}
#endif
