# tensor: CPU bandwidth benchmark (built, never run, by make test / CI).
#   make bench-cpu && build/bench/bench_cpu [max_elements]
# -fno-tree-loop-distribute-patterns keeps the "plain C copy loop" a loop (GCC would
# turn it into a memcpy call, whose non-temporal stores the fused ops do not use);
# -fno-math-errno as README says (without it the Adam/LAMB loops stay scalar: LAMB
# at 0.21-0.25 of copy bandwidth instead of 0.76-0.85 on Zen 4).
BENCH_MARCH ?= $(shell printf 'int main(void){return 0;}' | $(CC) -march=native -x c - -o /dev/null 2>/dev/null && echo -march=native)

.PHONY: bench-cpu
bench-cpu: $(BUILD)/bench/bench_cpu

$(BUILD)/bench/bench_cpu: bench/bench_cpu.c capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) -fno-math-errno -fno-tree-loop-distribute-patterns $(WARN) $(OPENMP) $< -o $@ $(LDLIBS)

# CI: the benchmark must keep compiling (it is not run: timings are not tests).
ci-extra:: $(BUILD)/bench/bench_cpu

# CI: the tensor tests again, vectorised (-O3, native ISA, FMA contraction on),
# with and without OpenMP: the norms must keep the documented bits in every build.
TENSOR_VEC_FLAGS := -std=gnu99 -O3 $(BENCH_MARCH) -ffp-contract=fast $(WARN)
$(BUILD)/tensor-vec/test_tensor_omp: tests/test_tensor.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) $(TENSOR_VEC_FLAGS) $(TEST_DEFS) $(OPENMP) -Itests $< -o $@ $(LDLIBS)
$(BUILD)/tensor-vec/test_tensor_noomp: tests/test_tensor.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) $(TENSOR_VEC_FLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
ci-extra:: $(BUILD)/tensor-vec/test_tensor_omp $(BUILD)/tensor-vec/test_tensor_noomp
	$(BUILD)/tensor-vec/test_tensor_omp
	$(BUILD)/tensor-vec/test_tensor_noomp
