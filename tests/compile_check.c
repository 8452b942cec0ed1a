/* Compiled by `make compile-check` as C99/C11/C++11/C++17 under gcc and clang
   with -Wall -Wextra -pedantic -Werror: the headers must stay warning-free. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "../capex.h" /* a second include must be harmless */

int capex_compile_check(void);
int capex_compile_check(void) {
    return capex_f32_to_f16(1.0f) == 0x3c00 ? 0 : 1;
}
