/* libFuzzer target for the kernel-cache entry reader: the input is an entry
   file's bytes. It is parsed (capex__cuda_cache_parse) as it is, then with
   its checksum fixed, then with its key and checksum fixed (so mutations
   reach the checks behind the checksum); each time it is also written to a
   file and read through capex__cuda_cache_read, which must agree. Accepted
   must mean exactly what the writer makes: the header the writer would write
   for the returned image is the input's header and the payload is the rest
   of the input. Refused means no image and FORMAT, VERSION or CHECKSUM. The
   writer's encoding of a valid image must be accepted.
   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_cache_entry.c -ldl -lpthread -lm
   Seeds: tests/corpus/cache_entry, written by this file built with
   -DFUZZ_CACHE_ENTRY_SEEDS (real NVRTC output through the cache writer). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CAPEX_STATIC
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdlib.h>

/* The request every seed entry was compiled for: the entries carry its key. */
static const char *seed_src = "extern \"C\" __global__ void put(int *x) { x[threadIdx.x] = 7; }\n";
static const char *const seed_opts[] = {"-DFUZZ=1"};

static void seed_key(unsigned char key[32]) { capex__cuda_cache_key(seed_src, "fuzz", seed_opts, 1, 90, key); }

#ifndef FUZZ_CACHE_ENTRY_SEEDS

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_cache_entry: %s (%s)\n", what, capex_last_error());
        abort();
    }
}

static char file_path[1200], file_dir[64];

static void remove_file_dir(void) {
    unlink(file_path);
    rmdir(file_dir);
}

/* Writes bytes as the entry of key in a private directory; 0 on failure. */
static int put_file(const unsigned char *bytes, size_t len, const unsigned char key[32]) {
    static capex_cuda_cache c;
    int fd, ok;
    if (!c.dir[0]) {
        snprintf(file_dir, sizeof file_dir, "/tmp/capex_fuzz_cache_XXXXXX");
        if (!mkdtemp(file_dir)) return 0;
        capex_cuda_cache_init(&c, file_dir);
        atexit(remove_file_dir);
    }
    capex__cuda_cache_path(&c, key, file_path, sizeof file_path);
    /* 0600 whatever the umask: the reader trusts only entries no one else can write */
    if ((fd = open(file_path, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0) return 0;
    ok = fchmod(fd, 0600) == 0 && capex__cuda_write_all(fd, bytes, len) == 0;
    return close(fd) == 0 && ok;
}

/* One parse of bytes against key, with every property checked. */
static void one(const unsigned char *bytes, size_t len, const unsigned char key[32]) {
    capex_cuda_image img, back;
    unsigned char h[CAPEX__CACHE_HEADER];
    capex_result r = capex__cuda_cache_parse(bytes, len, key, "fuzz", &img), rf;
    int valid = 0;
    /* the writer's encoding of the image the input describes */
    if (len > CAPEX__CACHE_HEADER && len - CAPEX__CACHE_HEADER <= CAPEX__CACHE_MAX_PAYLOAD) {
        capex_cuda_image want;
        uint32_t kind = capex__get_u32(bytes + 12);
        memset(&want, 0, sizeof want);
        want.kind = (capex_cuda_image_kind)kind;
        want.arch = (int)capex__get_u32(bytes + 16);
        want.nvrtc_version = (int)capex__get_u32(bytes + 20);
        want.data = (void *)(bytes + CAPEX__CACHE_HEADER);
        want.size = len - CAPEX__CACHE_HEADER;
        capex__cuda_cache_header(h, key, &want);
        valid = (kind == CAPEX_CUDA_IMAGE_CUBIN || (kind == CAPEX_CUDA_IMAGE_PTX && bytes[len - 1] == '\0')) &&
                memcmp(h, bytes, sizeof h) == 0;
    }
    if (r == CAPEX_OK) {
        check(valid, "accepted an entry the writer would not make");
        check(img.data && img.size == len - CAPEX__CACHE_HEADER && img.from_cache == 1, "accepted image fields");
        check(memcmp(img.data, bytes + CAPEX__CACHE_HEADER, img.size) == 0, "accepted payload differs from the input");
        capex__cuda_cache_header(h, key, &img);
        check(memcmp(h, bytes, sizeof h) == 0, "accepted image does not re-encode to the input's header");
    } else {
        check(!valid, "refused a well-formed entry");
        check(r == CAPEX_ERR_FORMAT || r == CAPEX_ERR_VERSION || r == CAPEX_ERR_CHECKSUM, "unexpected status");
        check(img.data == NULL && img.size == 0, "a refused entry returned an image");
    }
    /* the file reader decides the same */
    if (put_file(bytes, len, key)) {
        rf = capex__cuda_cache_read(file_path, key, &back);
        check(rf == r, "the file reader and the parser disagree");
        check((rf == CAPEX_OK) == (back.data != NULL), "reader image");
        if (rf == CAPEX_OK) check(back.size == img.size && !memcmp(back.data, img.data, img.size), "reader payload");
        capex_cuda_image_free(&back);
    }
    capex_cuda_image_free(&img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char key[32];
    int pass;
    seed_key(key);
    one(data, size, key);
    /* the checksum fixed (reaches the key check), then the key too (reaches the
       kind, length and PTX checks behind the checksum) */
    for (pass = 0; pass < 2 && size >= CAPEX__CACHE_HEADER; pass++) {
        unsigned char *b = (unsigned char *)malloc(size);
        capex__sha256 s;
        if (!b) return 0;
        memcpy(b, data, size);
        if (pass == 1) memcpy(b + 32, key, 32);
        capex__sha256_init(&s);
        capex__sha256_update(&s, b, 64);
        capex__sha256_update(&s, b + CAPEX__CACHE_HEADER, size - CAPEX__CACHE_HEADER);
        capex__sha256_final(&s, b + 64);
        one(b, size, key);
        free(b);
    }
    return 0;
}

#else /* FUZZ_CACHE_ENTRY_SEEDS: write the seed corpus into argv[1] */

static int save(const char *dir, const char *name, const capex_cuda_image *img) {
    char tmp[64] = "/tmp/capex_fuzz_seed_XXXXXX", from[1200], to[1200];
    unsigned char key[32];
    capex_cuda_cache c;
    FILE *a, *b;
    int ch;
    if (!mkdtemp(tmp)) return 1;
    capex_cuda_cache_init(&c, tmp);
    seed_key(key);
    if (capex__cuda_cache_write(&c, key, img) != CAPEX_OK) {
        fprintf(stderr, "%s\n", capex_last_error());
        return 1;
    }
    capex__cuda_cache_path(&c, key, from, sizeof from);
    snprintf(to, sizeof to, "%s/%s", dir, name);
    a = fopen(from, "rb");
    b = fopen(to, "wb");
    while (a && b && (ch = fgetc(a)) != EOF) fputc(ch, b);
    if (a) fclose(a);
    if (b) fclose(b);
    unlink(from);
    rmdir(tmp);
    printf("%s: %zu-byte %s payload\n", to, img->size, img->kind == CAPEX_CUDA_IMAGE_PTX ? "PTX" : "CUBIN");
    return !a || !b;
}

int main(int argc, char **argv) {
    capex_cuda_target t;
    capex_cuda_image img;
    static const char tiny_ptx[] = "//\n.version 8.0\n.target sm_90\n";
    static const unsigned char tiny_bin[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0};
    int bad = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (writes the seed entries there)\n", argv[0]);
        return 2;
    }
    t.kind = CAPEX_CUDA_IMAGE_CUBIN;
    t.arch = 90;
    if (capex_cuda_nvrtc_compile(seed_src, "fuzz", seed_opts, 1, t, &img) != CAPEX_OK) {
        fprintf(stderr, "%s\n", capex_last_error());
        return 1;
    }
    bad |= save(argv[1], "nvrtc_cubin_sm90", &img);
    capex_cuda_image_free(&img);
    t.kind = CAPEX_CUDA_IMAGE_PTX;
    if (capex_cuda_nvrtc_compile(seed_src, "fuzz", seed_opts, 1, t, &img) != CAPEX_OK) {
        fprintf(stderr, "%s\n", capex_last_error());
        return 1;
    }
    bad |= save(argv[1], "nvrtc_ptx_compute90", &img);
    capex_cuda_image_free(&img);
    /* small ones, quick to mutate */
    memset(&img, 0, sizeof img);
    img.kind = CAPEX_CUDA_IMAGE_PTX;
    img.arch = 90;
    img.nvrtc_version = 13000;
    img.data = (void *)tiny_ptx;
    img.size = sizeof tiny_ptx;
    bad |= save(argv[1], "tiny_ptx", &img);
    img.kind = CAPEX_CUDA_IMAGE_CUBIN;
    img.data = (void *)tiny_bin;
    img.size = sizeof tiny_bin;
    bad |= save(argv[1], "tiny_cubin", &img);
    return bad;
}

#endif
