/* Compiled by `make compile-check` as C99/C11/C++11/C++17 under gcc and clang
   with -Wall -Wextra -pedantic -Werror: the headers must stay warning-free. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "../capex.h" /* a second include must be harmless */
#define CAPEX_CUDA_IMPLEMENTATION
#include "../capex_cuda.h"
#include "../capex_cuda.h" /* likewise */

int capex_compile_check(void);
int capex_compile_check(void) {
    capex_cuda_target t;
    int archs[2] = {80, 90};
    if (capex_cuda_select_target(archs, 2, 90, &t) != CAPEX_OK) return 1;
    return capex_f32_to_f16(1.0f) == 0x3c00 ? 0 : 1;
}
