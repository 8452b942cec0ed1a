/* First demo until the training example lands: prints the version and shows
   the half conversions. */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdio.h>

int main(void) {
    float x = 3.14159265f;
    printf("capex %s\n", CAPEX_VERSION_STRING);
    printf("%.7f as fp16 -> %.7f, as bf16 -> %.7f\n", x, capex_f16_to_f32(capex_f32_to_f16(x)),
           capex_bf16_to_f32(capex_f32_to_bf16(x)));
    return 0;
}
