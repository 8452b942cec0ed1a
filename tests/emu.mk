# The CPU emulator driver: build/emu/libcuda.so.1 runs the real kernels
# (tests/emu_libcuda.cc). `make ci-extra` runs the GPU tests against it.
#
# Kernel sets: capex_cuda_builtin_source() always; then every file of CUDA text
# in EMU_KERNEL_SOURCES, each compiled into its own namespace with the table of
# its `extern "C" __global__ void NAME(...)` kernels. To run a program's own
# kernels on the emulator (e.g. an example's model kernels), add one line:
#     EMU_KERNEL_SOURCES += examples/model_kernels.cu
# (a file of CUDA text; when the kernels live in a C string, a make target that
# prints them, like $(EMU_DIR)/test_kernels.cu below), then run the program with
# CAPEX_LIBCUDA_PATH=$(abspath build/emu/libcuda.so.1). Macros the program
# passes to NVRTC as -D options are not seen: define them in the file (the
# built-in program alone comes twice, for capex's -DCAPEX_GO_META=<large>).
# A kernel found in an NVRTC image but in no set fails its launch with
# CUDA_ERROR_NOT_SUPPORTED and names the kernel on stderr.
# ?=: sanitize passes the main build's (the emulator is not instrumented).
EMU_DIR ?= $(BUILD)/emu
EMU_LIB := $(EMU_DIR)/libcuda.so.1
EMU_KERNEL_SOURCES += $(EMU_DIR)/test_kernels.cu
# The training example's model kernels (its GPU path; tests/example.mk runs it here).
EMU_KERNEL_SOURCES += $(EMU_DIR)/charlm_kernels.cu
# The GPT example's model kernels (its GPU path; tests/gpt.mk runs it here).
EMU_KERNEL_SOURCES += $(EMU_DIR)/gpt_kernels.cu

$(EMU_DIR)/emu_gen: tests/emu_gen.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 $(WARN) $< -o $@ $(LDLIBS)

$(EMU_DIR)/emu_test_kernels: tests/emu_test_kernels.c tests/gpu_test_kernels.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 $(WARN) -Itests $< -o $@

$(EMU_DIR)/test_kernels.cu: $(EMU_DIR)/emu_test_kernels
	$< > $@.tmp && mv $@.tmp $@

$(EMU_DIR)/kernels.inc: $(EMU_DIR)/emu_gen $(EMU_KERNEL_SOURCES)
	$< $(EMU_KERNEL_SOURCES) > $@.tmp && mv $@.tmp $@

# No FMA contraction: the kernels are compiled with --fmad=false.
$(EMU_LIB): tests/emu_libcuda.cc tests/cuda_image.h $(EMU_DIR)/kernels.inc
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -ffp-contract=off -fno-strict-aliasing -fPIC -shared -fvisibility=hidden \
	  -I$(EMU_DIR) $< -o $@ -lpthread

# tests/test_emu.c (the emulator's own faithfulness test) loads it.
$(BUILD)/tests/test_emu: $(EMU_LIB) tests/gpu_test_kernels.h tests/cuda_test_util.h $(BUILD)/fake/libnccl.so.2

# The GPU tests on the emulator: they must pass, not skip, except
#  - test_gpuopt_gpu's tensor over 2^31 elements (34 GB of "device" memory; the
#    emulator offers at most 16 GiB, CAPEX_EMU_MEMORY_GB, so the test skips for
#    memory: at the emulator's speed it would run for many minutes anyway);
#  - test_nccl_gpu's stuck-stream timeout and its DDP overlap check (every
#    launch runs to completion before it returns: no stream can stay busy
#    while a collective waits, no two streams run at once).
# Then the optimizer and norm tests once more with threads and blocks in
# reverse order (CAPEX_EMU_ORDER=reverse): a race would change their results.
# Then every GPU test with lazy streams (CAPEX_EMU_STREAMS=lazy: stream work
# runs when something waits for it, the legacy stream at once): a missing
# wait between streams reads stale data. With the header before 2026-11-28
# (copies with stream NULL on the legacy stream) test_zero_gpu failed 11
# cases this way, the bug an H100 showed first; test_cuda_gpu's
# null_stream_copies_wait_for_every_stream (skipped eager) runs lazily and
# failed its first check with that header.
# Then the NCCL tests with streams that run ahead (CAPEX_EMU_STREAMS=ahead:
# lazy, but a host wait on an event first runs every other stream's queued
# work, and a first query finds the event busy): work queued on the user
# stream before the host wait for a collective, that reads its result, reads
# it stale. A finalize that scales a bucket before waiting for its allreduce
# passes lazy and fails here (ddp_world2_half_buckets_scaled_on_user_stream).
# Entries are test:skips[:order, lazy or ahead]. About a minute on 2 cores (test_cuda_gpu
# compiles the built-in program cold on purpose, ~8 s).
EMU_RUN = CAPEX_LIBCUDA_PATH=$(abspath $(EMU_LIB)) CAPEX_CACHE_DIR=$(abspath $(EMU_DIR)/cache) \
          CAPEX_NCCL_PATH=$(abspath $(BUILD)/fake/libnccl.so.2)
# The device's shape (the multi-tensor grids are sized from it): the optimizer
# tests again on an H100-sized device (132 SMs x 4 blocks: grids of 528), and
# the grid check without cuOccupancyMaxActiveBlocksPerMultiprocessor (the fixed
# default of 320 blocks). The emulated driver is 13.0 (32 KB kernel parameters:
# the multi-tensor launches carry the large metadata); the optimizer tests
# again on a 12.0 driver (4 KB, the fallback). Entries are
# VAR=VALUE[,VAR=VALUE]:test:skips[:case].
EMU_GPU_SHAPES := CAPEX_EMU_SMS=132:test_gpuopt_gpu:1 CAPEX_EMU_OCCUPANCY=0:test_gpuopt_gpu:0:gpu_grid_from_device \
                  CAPEX_EMU_DRIVER_VERSION=12000:test_gpuopt_gpu:1
EMU_GPU_TESTS := test_cuda_gpu:2 test_gpuopt_gpu:1 test_norm_gpu:0 test_nccl_gpu:2 test_gpt_gpu:0 \
                 test_gpuopt_gpu:1:reverse test_norm_gpu:0:reverse test_gpt_gpu:0:reverse \
                 test_cuda_gpu:1:lazy test_gpuopt_gpu:1:lazy test_norm_gpu:0:lazy test_nccl_gpu:2:lazy test_gpt_gpu:0:lazy \
                 test_nccl_gpu:2:ahead
.PHONY: emu-test
ci-extra:: emu-test
emu-test: $(EMU_LIB) $(BUILD)/tests/test_cuda_gpu $(BUILD)/tests/test_gpuopt_gpu $(BUILD)/tests/test_norm_gpu \
           $(BUILD)/tests/test_nccl_gpu $(BUILD)/tests/test_gpt_gpu $(BUILD)/fake/libnccl.so.2 $(BUILD)/tests/test_emu
	@echo "emu: the GPU tests on the CPU emulator driver ($(EMU_LIB)): real kernels, no GPU"
	@out=$$($(BUILD)/tests/test_emu 2>&1); echo "emu: test_emu: $$(echo "$$out" | tail -n 1)"; \
	  echo "$$out" | tail -n 1 | grep -qE '^[1-9][0-9]* passed, 0 failed, 0 skipped$$' || { echo "$$out"; exit 1; }
	@for e in $(EMU_GPU_TESTS); do t=$${e%%:*}; r=$${e#*:}; sk=$${r%%:*}; order=$${r#$$sk}; order=$${order#:}; \
	  how=CAPEX_EMU_ORDER=$$order; case $$order in lazy|ahead) how=CAPEX_EMU_STREAMS=$$order;; esac; \
	  out=$$(env $$how $(EMU_RUN) $(BUILD)/tests/$$t 2>&1); rc=$$?; \
	  last=$$(echo "$$out" | tail -n 1); echo "emu: $$t$${order:+ ($$how)}: $$last"; \
	  if [ $$rc -ne 0 ] || ! echo "$$last" | grep -qE "^[1-9][0-9]* passed, 0 failed, $$sk skipped$$"; then \
	    echo "$$out"; echo "emu: $$t failed on the emulator"; exit 1; fi; \
	  echo "$$out" | grep '^SKIP' | sed 's/^/emu:   /' || true; done
	@for shape in $(EMU_GPU_SHAPES); do envs=$${shape%%:*}; r=$${shape#*:}; t=$${r%%:*}; r=$${r#*:}; sk=$${r%%:*}; only=$${r#$$sk}; only=$${only#:}; \
	  out=$$(env $$(echo $$envs | tr ',' ' ') $(EMU_RUN) $(BUILD)/tests/$$t $$only 2>&1); rc=$$?; \
	  last=$$(echo "$$out" | tail -n 1); echo "emu: $$t ($$envs$${only:+, $$only}): $$last"; \
	  if [ $$rc -ne 0 ] || ! echo "$$last" | grep -qE "^[1-9][0-9]* passed, 0 failed, $$sk skipped$$"; then \
	    echo "$$out"; echo "emu: $$t failed on the emulator ($$envs)"; exit 1; fi; done

$(EMU_DIR)/example_kernels_gen: tests/example_kernels_gen.c examples/train_charlm.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 $(WARN) $< -o $@ $(LDLIBS)

$(EMU_DIR)/charlm_kernels.cu: $(EMU_DIR)/example_kernels_gen
	$< > $@.tmp && mv $@.tmp $@

$(EMU_DIR)/gpt_kernels_gen: tests/gpt_kernels_gen.c examples/train_gpt.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 $(WARN) $< -o $@ $(LDLIBS)

$(EMU_DIR)/gpt_kernels.cu: $(EMU_DIR)/gpt_kernels_gen
	$< > $@.tmp && mv $@.tmp $@
