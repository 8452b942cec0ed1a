# Fused GPU optimizer kernels (capex_cuda.h GPUOPT section).
#  - tests/test_gpuopt.c: host side (validation, planning, packing) without a GPU.
#  - tests/test_gpuopt_emu.c: the kernels' own source compiled as host C++ with a
#    small CUDA shim and run on CPU threads (one pthread per CUDA thread of a
#    block, __syncthreads a barrier), compared with capex.h's CPU backend.
#  - tests/test_gpuopt_gpu.c: the same parity on a real GPU (skips without one),
#    CUDA-graph replay, a > 2^31-element tensor; part of `make gpu-test`.
#  - bench/bench_gpu.c + bench/bench_torch.py: `make bench-gpu` (needs a GPU).

# test_gpuopt_emu.c is found by the Makefile's tests/test_*.c wildcard (so it is
# part of `make test` and `make sanitize`); this explicit rule builds it as C++.
GPUOPT_EMU := $(BUILD)/tests/test_gpuopt_emu

$(BUILD)/gpuopt/gpuopt_gen: tests/gpuopt_gen.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/gpuopt/go_kernels.inc: $(BUILD)/gpuopt/gpuopt_gen
	$< > $@.tmp && mv $@.tmp $@

# C++17 (the kernels are CUDA C++); CFLAGS minus its -std and OpenMP; no FMA
# contraction (the kernels are compiled with --fmad=false).
$(GPUOPT_EMU): tests/test_gpuopt_emu.c tests/gpuopt_parity.h $(BUILD)/gpuopt/go_kernels.inc tests/capex_test.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 $(filter-out -std=% -fopenmp,$(CFLAGS)) -ffp-contract=off -fno-strict-aliasing $(TEST_DEFS) \
	  -Itests -I$(BUILD)/gpuopt $< -o $@ $(LDLIBS)

# The emulation again with 512 threads per block (the GPU's block size) on the
# reductions, clipping and the AMP loop (the full suite would take minutes).
$(BUILD)/gpuopt/test_gpuopt_emu512: tests/test_gpuopt_emu.c tests/gpuopt_parity.h $(BUILD)/gpuopt/go_kernels.inc tests/capex_test.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 -O2 -ffp-contract=off -fno-strict-aliasing $(TEST_DEFS) -DEMU_THREADS=512 \
	  -Itests -I$(BUILD)/gpuopt $< -o $@ $(LDLIBS)

ci-extra:: $(BUILD)/gpuopt/test_gpuopt_emu512
	@echo "gpuopt: kernel emulation with 512-thread blocks"
	@for t in emu_l2norm emu_clip emu_scale_many emu_amp_loop; do \
	  $< $$t | tail -n 1 | grep -q '^1 passed, 0 failed' || { echo "gpuopt: $$t failed with 512 threads"; exit 1; }; done

$(BUILD)/tests/test_gpuopt_gpu: tests/gpuopt_parity.h


# Host side of the GPU tests on the stand-in driver: must skip or pass, never crash.
ci-extra:: $(BUILD)/tests/test_gpuopt_gpu
	@echo "gpuopt: GPU parity tests without a GPU skip with a reason"
	@CAPEX_LIBCUDA_PATH=/nonexistent/libcuda.so.1 $(BUILD)/tests/test_gpuopt_gpu | tail -n 1 | grep -qE '^0 passed, 0 failed, [1-9][0-9]* skipped'

# Benchmarks (GPU machine): capex kernels vs copy bandwidth, then PyTorch on
# the same sizes; a markdown table and an SVG chart in $(BUILD)/bench/.
BENCH_GPU_SIZES ?= 1000000,10000000,100000000,1000000000
$(BUILD)/bench/bench_gpu: bench/bench_gpu.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(WARN) -Werror $< -o $@ $(LDLIBS)

.PHONY: bench-gpu
bench-gpu: $(BUILD)/bench/bench_gpu
	@mkdir -p $(BUILD)/bench
	$(BUILD)/bench/bench_gpu --sizes $(BENCH_GPU_SIZES) --csv $(BUILD)/bench/gpu_capex.csv
	python3 bench/bench_torch.py --sizes $(BENCH_GPU_SIZES) --csv $(BUILD)/bench/gpu_torch.csv
	python3 bench/bench_torch.py --report $(BUILD)/bench/gpu_capex.csv $(BUILD)/bench/gpu_torch.csv \
	  --markdown $(BUILD)/bench/gpu_table.md --svg $(BUILD)/bench/gpu_chart.svg
	@cat $(BUILD)/bench/gpu_table.md

# LayerNorm / RMSNorm forward and backward, bf16, against PyTorch's (GPU machine).
.PHONY: bench-gpu-norms
bench-gpu-norms: $(BUILD)/bench/bench_gpu
	@mkdir -p $(BUILD)/bench
	$(BUILD)/bench/bench_gpu --norms --csv $(BUILD)/bench/gpu_norms_capex.csv
	python3 bench/bench_torch.py --norms --csv $(BUILD)/bench/gpu_norms_torch.csv

# CI: the benchmark builds warning-free; the Python side is valid syntax.
ci-extra:: $(BUILD)/bench/bench_gpu
	@python3 -c "import py_compile; py_compile.compile('bench/bench_torch.py', cfile='$(BUILD)/bench/bench_torch.pyc', doraise=True)" && \
	  echo "gpuopt: bench_gpu builds, bench_torch.py compiles"
