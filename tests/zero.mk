# The sharded optimizer (capex_zero): tests/test_zero.c shares its checks with
# the MPI test program (tests/mpi/test_dist_mpi.c) through tests/zero_check.h.
$(BUILD)/tests/test_zero: tests/zero_check.h tests/fork_world.h tests/free_port.h

# ZeRO on the GPU (capex_cuda_zero) over NCCL: tests/test_zero_gpu.c SKIPs
# without a GPU; `make emu-test` runs it on the CPU emulator driver with the
# stand-in NCCL (world size 1), and `make gpu-test` on a real GPU.
$(BUILD)/tests/test_zero_gpu: tests/cuda_test_util.h tests/nccl_world.h
EMU_GPU_TESTS += test_zero_gpu:0 test_zero_gpu:0:lazy
emu-test: $(BUILD)/tests/test_zero_gpu
