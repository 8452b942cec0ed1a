# ThreadSanitizer (clang -fsanitize=thread) over the multithreaded parts, in
# its own build dir: the TCP backend and DDP (test_dist: forked ranks, the
# TCP abort path), background kernel compiles and the compile pool
# (test_cuda_jit; test_cuda_gpu on the CPU stand-in driver: precompile_async,
# precompile = 2, concurrent compiles, destroy while compiling), and the
# OpenMP paths (test_tensor, test_optim, test_norm; test_norm also runs
# SyncBatchNorm ranks as threads). About a minute on 2 cores.
#
# OpenMP: libomp is not built with TSan, so TSan cannot see its barriers.
# Archer (LLVM's OpenMP tool, libarcher.so beside clang's libomp) tells TSan
# about them; ignore_noninstrumented_modules=1 (libomp's own advice) drops the
# reports about libomp's internal state (its mutexes and thread pool, not our
# code). Without Archer the OpenMP tests still run, with that option only.
TSAN_BUILD  ?= build-tsan
TSAN_TESTS  := test_dist test_norm test_optim test_tensor test_cuda_jit test_cuda_gpu
TSAN_CFLAGS := -std=c99 -O1 -g $(WARN) -fopenmp -fsanitize=thread -fno-omit-frame-pointer
TSAN_ARCHER  = $(wildcard $(dir $(realpath $(shell command -v clang 2>/dev/null)))../lib/libarcher.so)
TSAN_ENV     = CAPEX_TEST_SANITIZED=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1" \
               $(if $(TSAN_ARCHER),OMP_TOOL_LIBRARIES=$(TSAN_ARCHER))

.PHONY: tsan
tsan:
	@if ! printf 'int main(void){return 0;}' | clang -fsanitize=thread -fopenmp -x c - -o $(TSAN_BUILD).probe 2>/dev/null; then \
	  rm -f $(TSAN_BUILD).probe; echo "SKIP tsan: clang cannot build -fsanitize=thread -fopenmp here"; exit 0; fi; \
	rm -f $(TSAN_BUILD).probe; \
	$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) CC=clang OPENMP=-fopenmp CFLAGS="$(TSAN_CFLAGS)" \
	  $(TSAN_TESTS:%=$(TSAN_BUILD)/tests/%) $(TSAN_BUILD)/fake/libcuda.so.1 || exit 1; \
	echo "tsan: $(if $(TSAN_ARCHER),OpenMP through Archer ($(TSAN_ARCHER)),no Archer: OpenMP barriers unseen)"; \
	$(TSAN_ENV) tests/run.sh $(filter-out %/test_cuda_gpu,$(TSAN_TESTS:%=$(TSAN_BUILD)/tests/%)) || exit 1; \
	echo "tsan: test_cuda_gpu on the stand-in driver (background compiles)"; \
	$(TSAN_ENV) CAPEX_LIBCUDA_PATH=$(abspath $(TSAN_BUILD)/fake/libcuda.so.1) tests/run.sh $(TSAN_BUILD)/tests/test_cuda_gpu

ci-extra:: tsan
