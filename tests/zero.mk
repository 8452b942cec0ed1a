# The sharded optimizer (capex_zero): tests/test_zero.c shares its checks with
# the MPI test program (tests/mpi/test_dist_mpi.c) through tests/zero_check.h.
$(BUILD)/tests/test_zero: tests/zero_check.h tests/fork_world.h tests/free_port.h tests/fail_alloc.h

# ZeRO on the GPU (capex_cuda_zero) over NCCL: tests/test_zero_gpu.c SKIPs
# without a GPU; `make emu-test` runs it on the CPU emulator driver with the
# stand-in NCCL (world size 1; forked worlds of 2 and 4, each rank with a
# user stream of its own but one on the legacy stream), and `make gpu-test`
# on a real GPU. lazy streams show a collective that does not wait for the
# user stream; ahead, a user-stream read of a collective's result queued
# before the host wait for it (both only on a user stream of its own).
$(BUILD)/tests/test_zero_gpu: tests/cuda_test_util.h tests/nccl_world.h tests/fail_alloc.h
EMU_GPU_TESTS += test_zero_gpu:0 test_zero_gpu:0:lazy test_zero_gpu:0:ahead
emu-test: $(BUILD)/tests/test_zero_gpu
