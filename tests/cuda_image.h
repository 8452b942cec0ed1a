/* The size of a CUDA module image as the driver sees it, for the stand-in
   drivers (tests/fake_libcuda.c, tests/emu_libcuda.cc): CUBIN is an ELF64
   little-endian file of machine EM_CUDA (190) whose section headers end it;
   PTX is NUL-terminated text with .version and .target. Returns 0 and sets
   *bad_ptx (1: PTX, 0: ELF) for an image the driver would refuse. C and C++. */
#ifndef CAPEX_CUDA_IMAGE_H
#define CAPEX_CUDA_IMAGE_H
#include <stdint.h>
#include <string.h>

static size_t cuda_image_size(const unsigned char *p, int *bad_ptx) {
    if (!memcmp(p, "\177ELF", 4)) {
        uint64_t shoff;
        uint16_t shentsize, shnum, machine;
        *bad_ptx = 0;
        memcpy(&machine, p + 18, 2);
        if (p[4] != 2 || machine != 190) return 0;
        memcpy(&shoff, p + 40, 8);
        memcpy(&shentsize, p + 58, 2);
        memcpy(&shnum, p + 60, 2);
        return (size_t)(shoff + (uint64_t)shentsize * shnum);
    }
    *bad_ptx = 1;
    if (!strstr((const char *)p, ".version") || !strstr((const char *)p, ".target")) return 0;
    return strlen((const char *)p) + 1;
}
#endif
