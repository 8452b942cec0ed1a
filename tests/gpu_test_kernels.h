/* CUDA source of the user kernels that the GPU tests compile with NVRTC
   (tests/test_cuda_gpu.c, tests/test_nccl_gpu.c). One copy, so the CPU
   emulator (tests/emu.mk prints it with tests/emu_test_kernels.c and compiles
   it into build/emu/libcuda.so.1) runs exactly what NVRTC compiles. */
#ifndef CAPEX_GPU_TEST_KERNELS_H
#define CAPEX_GPU_TEST_KERNELS_H

/* ALPHA is a compile option (-DALPHA=3.0f): the module cache keys on options. */
static const char gpu_test_user_src[] =
    "extern \"C\" __global__ void user_axpb(float *y, const float *x, float b, unsigned long long n) {\n"
    "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = ALPHA * x[i] + b;\n"
    "}\n"
    "extern \"C\" __global__ void user_reverse(float *y, const float *x) {\n"
    "    extern __shared__ float s[];\n"
    "    unsigned base = blockIdx.x * blockDim.x;\n"
    "    s[threadIdx.x] = x[base + threadIdx.x];\n"
    "    __syncthreads();\n"
    "    y[base + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];\n"
    "}\n";

/* Spins ~cycles GPU clocks, then writes x[i] = v * (i + 1). */
static const char gpu_test_spin_src[] =
    "extern \"C\" __global__ void spin_fill(float *x, unsigned long long n, float v, long long cycles) {\n"
    "  long long t0 = clock64(); while (clock64() - t0 < cycles) { }\n"
    "  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += gridDim.x * 256ull) x[i] = v * (float)(i + 1);\n"
    "}\n";

/* Spin ~cycles clocks, then write (tests/test_cuda_gpu.c: copies with stream NULL wait for them). */
static const char gpu_test_order_src[] =
    "extern \"C\" __global__ void spin_then_write(unsigned *p, unsigned v, long long cycles) {\n"
    "    long long t0 = clock64();\n"
    "    while (clock64() - t0 < cycles) {}\n"
    "    *p = v;\n"
    "}\n"
    "extern \"C\" __global__ void spin_then_copy_last(unsigned *dst, const unsigned *src, unsigned long long n, long long cycles) {\n"
    "    long long t0 = clock64();\n"
    "    while (clock64() - t0 < cycles) {}\n"
    "    *dst = src[n - 1];\n"
    "}\n";

/* A stand-in for a long allreduce on the comm's stream that ends early once
   the engine's stream has run set_flag: *seen says whether it did (1) or the
   wait ran out of cycles (0) because the engine's stream was held behind it
   (tests/test_nccl_gpu.c, real GPUs only). */
static const char gpu_test_flag_src[] =
    "extern \"C\" __global__ void wait_flag(volatile unsigned *flag, unsigned *seen, long long cycles) {\n"
    "    long long t0 = clock64();\n"
    "    while (*flag == 0u && clock64() - t0 < cycles) {}\n"
    "    *seen = *flag;\n"
    "}\n"
    "extern \"C\" __global__ void set_flag(volatile unsigned *flag) { *flag = 1u; __threadfence(); }\n";

/* The CPU emulator's own checks (tests/test_emu.c): results that depend on
   barriers, shuffles and the thread/block numbering being CUDA's. */
static const char gpu_test_emu_src[] =
    "/* block sum: warp shuffles, then shared memory across warps */\n"
    "extern \"C\" __global__ void emu_block_sum(const int *x, long long *out, int n) {\n"
    "    __shared__ long long part[32];\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
    "    int nw = (blockDim.x + 31) >> 5;\n"
    "    long long v = i < n ? x[i] : 0;\n"
    "    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);\n"
    "    if (lane == 0) part[warp] = v;\n"
    "    __syncthreads();\n"
    "    if (warp == 0) {\n"
    "        v = lane < nw ? part[lane] : 0;\n"
    "        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);\n"
    "        if (lane == 0) out[blockIdx.x] = v;\n"
    "    }\n"
    "}\n"
    "/* inclusive scan of each block's slice in dynamic shared memory (Hillis-Steele) */\n"
    "extern \"C\" __global__ void emu_scan(const int *x, int *y) {\n"
    "    extern __shared__ int s[];\n"
    "    int t = threadIdx.x, n = blockDim.x;\n"
    "    s[t] = x[blockIdx.x * n + t];\n"
    "    __syncthreads();\n"
    "    for (int off = 1; off < n; off <<= 1) {\n"
    "        int add = t >= off ? s[t - off] : 0;\n"
    "        __syncthreads();\n"
    "        s[t] += add;\n"
    "        __syncthreads();\n"
    "    }\n"
    "    y[blockIdx.x * n + t] = s[t];\n"
    "}\n"
    "/* every shuffle mode, with widths; out[4 * linear thread id + k] */\n"
    "extern \"C\" __global__ void emu_shuffles(int *out) {\n"
    "    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);\n"
    "    int v = 1000 * (int)t + 7;\n"
    "    out[4 * t + 0] = __shfl_sync(0xffffffffu, v, 3, 8);\n"
    "    out[4 * t + 1] = __shfl_up_sync(0xffffffffu, v, 2);\n"
    "    out[4 * t + 2] = __shfl_down_sync(0xffffffffu, v, 5, 16);\n"
    "    out[4 * t + 3] = __shfl_xor_sync(0xffffffffu, v, 5);\n"
    "}\n"
    "/* 3-D numbering: each thread writes its global linear id at its place */\n"
    "extern \"C\" __global__ void emu_ids(unsigned *out) {\n"
    "    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n"
    "    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);\n"
    "    unsigned nt = blockDim.x * blockDim.y * blockDim.z;\n"
    "    out[b * nt + t] = (blockIdx.z << 24) | (blockIdx.y << 16) | (blockIdx.x << 8) | (threadIdx.z << 6) | (threadIdx.y << 3) | threadIdx.x;\n"
    "}\n"
    "extern \"C\" __global__ void emu_fill(int *x, long long n, int v) {\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) x[i] = v;\n"
    "}\n"
    "/* a full-mask shuffle after half of the warp has returned: undefined on a GPU */\n"
    "extern \"C\" __global__ void emu_bad_mask(int *x) {\n"
    "    if (threadIdx.x >= 16) return;\n"
    "    x[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);\n"
    "}\n"
    "/* half of a warp waits in a shuffle, the other half at __syncthreads: never completes */\n"
    "extern \"C\" __global__ void emu_bad_barrier(int *x) {\n"
    "    if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);\n"
    "    else __syncthreads();\n"
    "}\n";

#endif
