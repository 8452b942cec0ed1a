/* Prints the GPU optimizer kernels exactly as NVRTC compiles them (the
   prelude, then capex_cuda.h's GPUOPT fragments: optimizer math and fused
   kernels), for tests/test_gpuopt_emu.c to compile as host C++. */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include <stdio.h>

int main(void) {
    size_t i, n = 0;
    const capex__cuda_fragment_fn *f = capex__cuda_go_fragments(&n);
    fputs(capex__cuda_frag_prelude_fn(), stdout);
    fputc('\n', stdout);
    for (i = 0; i < n; i++) {
        fputs(f[i](), stdout);
        fputc('\n', stdout);
    }
    return 0;
}
