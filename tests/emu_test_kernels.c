/* Prints the GPU tests' user kernels (tests/gpu_test_kernels.h) as one CUDA
   file for the CPU emulator's kernel table (tests/emu.mk). ALPHA is an NVRTC
   -D option that the emulator cannot see: it is a NaN here, so user_axpb's
   values are never mistaken for checked ones (the test skips that check on
   the emulator and checks the launch and the bounds only). */
#include <stdio.h>
#include "gpu_test_kernels.h"

int main(void) {
    fputs("#define ALPHA __int_as_float(0x7fc00000) /* -DALPHA=... is unknown here */\n", stdout);
    fputs(gpu_test_user_src, stdout);
    fputs("#undef ALPHA\n", stdout);
    fputs(gpu_test_spin_src, stdout);
    fputs(gpu_test_order_src, stdout);
    fputs(gpu_test_flag_src, stdout);
    fputs(gpu_test_emu_src, stdout);
    return 0;
}
