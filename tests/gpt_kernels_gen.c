/* Prints the GPT example's GPU kernels (the text its GPU path hands to
   capex's JIT), so the CPU emulator driver (tests/emu.mk) can run them too. */
#define main train_gpt_main
#include "../examples/train_gpt.c"
#undef main

int main(void) {
    size_t i;
    for (i = 0; i < sizeof gpt_kernels_parts / sizeof gpt_kernels_parts[0]; i++) fputs(gpt_kernels_parts[i], stdout);
    return 0;
}
