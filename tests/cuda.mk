# CUDA backend (capex_cuda.h): capex_info, `make info`, `make gpu-test`, NVRTC for CI.
# Included by the Makefile; double-colon ci-deps/ci-extra rules add to the others.

NVRTC_DEPS_DIR := build/deps/nvrtc
NVRTC_WHEEL    := nvidia-cuda-nvrtc>=13,<14
# Where ci-deps unpacks the PyPI wheel (CUDA 13 wheels keep the library here).
NVRTC_DEPS_LIB := $(firstword $(wildcard $(NVRTC_DEPS_DIR)/nvidia/cu13/lib/libnvrtc.so.13 $(NVRTC_DEPS_DIR)/nvidia/cuda_nvrtc/lib/libnvrtc.so.12))

# A machine without a toolkit gets the unpacked wheel: point capex's loader at it.
ifeq ($(origin CAPEX_NVRTC_PATH),undefined)
  ifneq ($(NVRTC_DEPS_LIB),)
    export CAPEX_NVRTC_PATH := $(abspath $(NVRTC_DEPS_LIB))
  endif
endif

# True when capex's loader would find NVRTC (same search: override, sonames, toolkit dirs).
NVRTC_FOUND = { { [ -n "$$CAPEX_NVRTC_PATH" ] && [ -f "$$CAPEX_NVRTC_PATH" ]; } || \
  /sbin/ldconfig -p 2>/dev/null | grep -qE 'libnvrtc\.so\.(13|12|11)' || \
  ls $${CUDA_HOME:-/nonexistent}/lib64/libnvrtc.so.* /usr/local/cuda/lib64/libnvrtc.so.* \
     /usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.* /opt/cuda/lib64/libnvrtc.so.* >/dev/null 2>&1; }

# Kernel sources are always compiled by NVRTC in CI: install it when missing
# (PyPI wheel, unpacked; no GPU or driver needed). Quick when already present.
ci-deps::
	@if [ -z "$(CAPEX_CUDA_FORCE_PIP)" ] && $(NVRTC_FOUND); then echo "cuda: NVRTC present"; else \
	  echo "cuda: NVRTC missing; fetching '$(NVRTC_WHEEL)' from PyPI into $(NVRTC_DEPS_DIR)"; \
	  if ! python3 -m pip --version >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null; fi; \
	  rm -rf $(NVRTC_DEPS_DIR) && mkdir -p $(NVRTC_DEPS_DIR) && \
	  python3 -m pip download --quiet --no-deps --only-binary=:all: -d $(NVRTC_DEPS_DIR) '$(NVRTC_WHEEL)' && \
	  python3 -m zipfile -e $(NVRTC_DEPS_DIR)/nvidia_cuda_nvrtc-*.whl $(NVRTC_DEPS_DIR) && \
	  rm -f $(NVRTC_DEPS_DIR)/*.whl && ls $(NVRTC_DEPS_DIR)/nvidia/*/lib/libnvrtc.so.*; fi

.PHONY: info
all: $(BUILD)/examples/capex_info

# Versions, devices, arch and cache; times a cold and a warm compile.
info: $(BUILD)/examples/capex_info
	$(BUILD)/examples/capex_info

# Every GPU test program, side by side, one summary line (each SKIPs without a
# GPU; all are also part of `make test`). GPU_TEST_BINS=... runs fewer.
GPU_TEST_BINS ?= $(addprefix $(BUILD)/tests/,test_cuda_gpu test_gpuopt_gpu test_norm_gpu test_nccl_gpu \
                   test_zero_gpu test_gpt_gpu)
gpu-test: $(GPU_TEST_BINS)
	@tests/run.sh $(GPU_TEST_BINS)

# A CPU stand-in for libcuda.so.1 (tests/fake_libcuda.c): checks the host side
# of the GPU tests (bounds of every copy, launch shapes, arguments, real NVRTC
# images) in CI. Not a GPU: `make gpu-test` on a GPU machine is the real test.
$(BUILD)/fake/libcuda.so.1: tests/fake_libcuda.c tests/cuda_image.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu99 -O1 -g -Wall -Wextra -shared -fPIC $< -o $@

# Stand-in NVRTCs (tests/fake_libnvrtc.c) for the loader and locale tests of
# test_cuda_jit: a usable one, and one without an arch list (pre-11.2).
$(BUILD)/fake/nvrtc_ok/lib64/libnvrtc.so.12: tests/fake_libnvrtc.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu99 -O1 -g -Wall -Wextra -shared -fPIC $< -o $@
$(BUILD)/fake/nvrtc_old/lib64/libnvrtc.so.12: tests/fake_libnvrtc.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu99 -O1 -g -Wall -Wextra -shared -fPIC -DFAKE_NVRTC_NO_ARCHS $< -o $@
$(BUILD)/tests/test_cuda_jit: $(BUILD)/fake/libcuda.so.1 $(BUILD)/fake/nvrtc_ok/lib64/libnvrtc.so.12 \
  $(BUILD)/fake/nvrtc_old/lib64/libnvrtc.so.12

ci-extra:: $(BUILD)/tests/test_cuda_gpu $(BUILD)/fake/libcuda.so.1
	@echo "cuda: GPU tests against the CPU stand-in driver (host-side checks only; the stream-order test needs a GPU)"
	@out=$$(CAPEX_LIBCUDA_PATH=$(abspath $(BUILD)/fake/libcuda.so.1) $(BUILD)/tests/test_cuda_gpu 2>&1); rc=$$?; \
	  echo "$$out"; [ $$rc -eq 0 ] && echo "$$out" | tail -n 1 | grep -q ' 0 failed, 1 skipped'
	@echo "cuda: a driver whose cuInit finds no GPU: every GPU test skips with the reason"
	@out=$$(FAKE_CUDA_INIT_FAIL=100 CAPEX_LIBCUDA_PATH=$(abspath $(BUILD)/fake/libcuda.so.1) $(BUILD)/tests/test_cuda_gpu 2>&1); \
	  echo "$$out" | tail -n 1; echo "$$out" | grep -q 'CAPEX_ERR_NO_DEVICE): cuInit failed: CUDA_ERROR_NO_DEVICE' && \
	  echo "$$out" | tail -n 1 | grep -qE '^0 passed, 0 failed, [1-9][0-9]* skipped'

# capex_info must report and exit 0 without a GPU, and run its GPU path on the stand-in.
ci-extra:: $(BUILD)/examples/capex_info $(BUILD)/fake/libcuda.so.1
	@echo "cuda: capex_info without a driver, then on the stand-in driver"
	@$(BUILD)/examples/capex_info >/dev/null
	@CAPEX_LIBCUDA_PATH=$(abspath $(BUILD)/fake/libcuda.so.1) $(BUILD)/examples/capex_info | grep -E 'GPUs|compile|module load'
	@echo "cuda: capex_info --parts --phases (NVRTC's split of each part's compile; skipped without NVRTC)"
	@out=$$($(BUILD)/examples/capex_info --parts --phases 2>&1); \
	  if echo "$$out" | grep -q 'no NVRTC'; then echo "skipped: no NVRTC"; else \
	  echo "$$out" | grep -E 'parts one after another|NVRTC phases summed'; \
	  echo "$$out" | grep -qE 'NVRTC phases summed: front end [1-9][0-9]* ms, NVVM optimizer [1-9][0-9]* ms, PTX to SASS [1-9]'; fi

# Fuzz the kernel-cache entry reader (the parser and the file reader) from the
# seeds in tests/corpus/cache_entry with clang's libFuzzer, for FUZZ_TIME
# seconds (10 in CI; `make fuzz-cache-entry FUZZ_TIME=14400` for hours). New
# inputs collect in $(BUILD)/fuzz_cache_entry_corpus, a failing input in
# $(BUILD)/fuzz_cache_entry-crash-*. Skipped where clang cannot link -fsanitize=fuzzer.
.PHONY: fuzz-cache-entry fuzz-corpus-cache-entry
ci-extra:: fuzz-cache-entry
fuzz-cache-entry: $(BUILD)/fuzz_cache_entry
	@if [ -x $(BUILD)/fuzz_cache_entry ]; then \
	  echo "cuda: fuzzing the kernel-cache entry reader ($(FUZZ_TIME) s)"; mkdir -p $(BUILD)/fuzz_cache_entry_corpus; \
	  $(BUILD)/fuzz_cache_entry -max_total_time=$(FUZZ_TIME) -seed=1 -artifact_prefix=$(BUILD)/fuzz_cache_entry- \
	    $(BUILD)/fuzz_cache_entry_corpus tests/corpus/cache_entry > $(BUILD)/fuzz_cache_entry.log 2>&1 || \
	    { tail -n 40 $(BUILD)/fuzz_cache_entry.log; exit 1; }; tail -n 1 $(BUILD)/fuzz_cache_entry.log; \
	else echo "cuda: libFuzzer unavailable, fuzz target skipped"; fi

$(BUILD)/fuzz_cache_entry: tests/fuzz_cache_entry.c capex.h capex_cuda.h
	@mkdir -p $(dir $@)
	$(if $(HAVE_LIBFUZZER),clang $(FUZZ_FLAGS) $< -o $@ $(LDLIBS),@echo "cuda: could not build the fuzz target (no libFuzzer)")

# Rewrites the seed entries from real NVRTC output (needs NVRTC; commit them).
fuzz-corpus-cache-entry: tests/fuzz_cache_entry.c capex.h capex_cuda.h
	@mkdir -p $(BUILD) tests/corpus/cache_entry
	$(CC) -std=c99 -O1 -g $(WARN) -DFUZZ_CACHE_ENTRY_SEEDS $< -o $(BUILD)/fuzz_cache_entry_seeds $(LDLIBS)
	$(BUILD)/fuzz_cache_entry_seeds tests/corpus/cache_entry
