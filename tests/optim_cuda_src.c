/* Prints the optimizer math exactly as capex_cuda.h hands it to NVRTC, plus a
   probe kernel that calls every function, so `make ci-extra` can check that
   the shared source is valid CUDA (tests/optim.mk compiles it with nvcc). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    size_t n = capex__optim_math_source(NULL, 0);
    char *s = (char *)malloc(n + 1);
    if (!s) return 1;
    capex__optim_math_source(s, n + 1);
    fputs(s, stdout);
    puts("extern \"C\" __global__ void capex__optim_probe(float *p, float *m, float *v, unsigned short *h) {\n"
         "    int i = threadIdx.x;\n"
         "    float u = capex__adam_l2_elem(p[i], 1.0f, &m[i], &v[i], 0.9f, 0.999f, 0.1f, 0.001f, 1e-8f, 1e-3f, 0.0f);\n"
         "    u += capex__adam_w_elem(p[i], 1.0f, &m[i], &v[i], 0.9f, 0.999f, 0.1f, 0.001f, 1e-8f, 1e-3f, 0.01f);\n"
         "    capex__lamb_moments_elem(capex__lamb_grad_l2(1.0f, p[i], 2.0f, 0.01f) + capex__lamb_grad_w(1.0f, 2.0f),\n"
         "                             &m[i], &v[i], 0.9f, 0.999f, 0.1f);\n"
         "    u += capex__lamb_apply(p[i], capex__lamb_update_l2(p[i], m[i], v[i], 0.1f, 0.001f, 1e-6f) +\n"
         "                           capex__lamb_update_w(p[i], m[i], v[i], 0.1f, 0.001f, 1e-6f, 0.01f), 0.5f);\n"
         "    u += capex__sgd_elem(p[i], 1.0f, 0.01f, 0.1f, ~0u) + capex__sgd_mom_elem(p[i], 1.0f, &m[i], 0.01f, 0.9f, 0.0f, 0.1f, ~0u, 0u, ~0u, 0u);\n"
         "    p[i] = u;\n"
         "    h[i] = (unsigned short)capex__bf16_round_sr(u, capex__sr_bits(capex__sr_key(1u, 2u, 3u, 0u, 4u, 0u), (unsigned int)i));\n"
         "}");
    free(s);
    return 0;
}
