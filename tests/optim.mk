# Optimizers (OPTIM section). ci-extra: the per-element math that the CPU runs
# is also the CUDA source NVRTC compiles; check it is valid CUDA with nvcc when
# the CUDA toolkit is installed (the CUDA backend's own tests cover NVRTC).
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))

$(BUILD)/optim/optim_cuda_src: tests/optim_cuda_src.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 $(OPT) $(WARN) $< -o $@ $(LDLIBS)

ci-extra:: $(BUILD)/optim/optim_cuda_src
	@if [ -z "$(NVCC)" ]; then echo "optim: nvcc not found, skipping the CUDA compile of the optimizer math"; \
	else $(BUILD)/optim/optim_cuda_src > $(BUILD)/optim/optim_math.cu && \
	  $(NVCC) -x cu -c -arch=sm_75 $(BUILD)/optim/optim_math.cu -o $(BUILD)/optim/optim_math.o && \
	  echo "optim: optimizer math compiles as CUDA (nvcc, sm_75)"; fi

# bench-optim: the old name of bench-cpu (bench_cpu is built with -fno-math-errno now).
.PHONY: bench-optim
bench-optim: bench-cpu

# The CPU optimizer tests share tests/optim_test_util.h.
$(BUILD)/tests/test_optim $(BUILD)/tests/test_optim_adagrad $(BUILD)/tests/test_novograd: tests/optim_test_util.h
