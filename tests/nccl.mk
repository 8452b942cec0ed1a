# NCCL backend (capex_cuda.h's NCCL section): the stand-in NCCL for CI, the
# ABI check against the real nccl.h, GPU tests, and the CPU data-parallel
# benchmark (make bench-dp).

# A CPU stand-in for libnccl.so.2 (one rank, or forked worlds) used with the stand-in driver
# by tests/test_nccl.c; `make test` builds both.
$(BUILD)/fake/libnccl.so.2: tests/fake_libnccl.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu99 -O1 -g -Wall -Wextra -shared -fPIC $< -o $@ -lm -ldl -lpthread

$(BUILD)/tests/test_nccl: $(BUILD)/fake/libcuda.so.1 $(BUILD)/fake/libnccl.so.2 tests/nccl_world.h tests/fail_alloc.h
# Its DDP world of 2 runs on the emulator with the stand-in NCCL (make emu-test).
$(BUILD)/tests/test_nccl_gpu: tests/nccl_world.h tests/cuda_test_util.h

# tests/test_nccl_abi.c against the real nccl.h when one is found (it needs
# cuda_runtime.h next to it or in the toolkit). Without it the test SKIPs.
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/cuda/include/nccl.h /usr/include/nccl.h \
            /usr/local/include/nccl.h /usr/local/cuda-*/include/nccl.h))
NCCL_CUDART_H := $(firstword $(wildcard $(dir $(NCCL_H))cuda_runtime.h $(CUDA_HOME)/include/cuda_runtime.h \
            /usr/local/cuda/include/cuda_runtime.h /usr/local/cuda-*/include/cuda_runtime.h))
ifneq ($(NCCL_H),)
ifneq ($(NCCL_CUDART_H),)
$(BUILD)/tests/test_nccl_abi: tests/test_nccl_abi.c tests/capex_test.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_DEFS) -DCAPEX_TEST_NCCL_H -isystem $(dir $(NCCL_H)) -isystem $(dir $(NCCL_CUDART_H)) -Itests $< -o $@ $(LDLIBS)
endif
endif


# CPU data-parallel benchmark over MPI (bench/bench_dp.c): np 2, then np 4
# oversubscribed (quick sweep). About a minute; results go to bench/RESULTS.md.
.PHONY: bench-dp
$(BUILD)/bench_dp: bench/bench_dp.c capex.h
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 -O2 $(WARN) -DCAPEX_MPI $< -o $@ -lm

BENCH_DP_MPIRUN = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 150 mpirun --oversubscribe \
                  --mca btl_vader_single_copy_mechanism none
bench-dp: $(BUILD)/bench_dp
	@lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\))' || true
	$(BENCH_DP_MPIRUN) -np 2 $(BUILD)/bench_dp
	$(BENCH_DP_MPIRUN) -np 4 $(BUILD)/bench_dp -q

# The sharded optimizer against DDP over MPI (bench/bench_zero.c): np 2 and 4.
.PHONY: bench-zero
$(BUILD)/bench_zero: bench/bench_zero.c capex.h
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 -O2 $(WARN) -DCAPEX_MPI $< -o $@ -lm
bench-zero: $(BUILD)/bench_zero
	@lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\))' || true
	$(BENCH_DP_MPIRUN) -np 2 $(BUILD)/bench_zero
	$(BENCH_DP_MPIRUN) -np 4 $(BUILD)/bench_zero

# tests/test_nccl_mpi.c is also the MPI program it runs (f64/i64 collectives,
# the unique id over an MPI bootstrap comm): built with mpicc when present.
ifneq ($(DIST_HAVE_MPICC),)
$(BUILD)/tests/test_nccl_mpi: $(BUILD)/tests/mpi/test_nccl_mpi
$(BUILD)/tests/mpi/test_nccl_mpi: tests/test_nccl_mpi.c capex.h capex_cuda.h
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 -O2 -g $(WARN) -DCAPEX_MPI -Itests $< -o $@ -ldl -lpthread -lm
endif
