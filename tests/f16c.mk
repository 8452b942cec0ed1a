# f16c: the half conversions and norms built the other ways. make test runs
# test_half with run-time F16C dispatch (it checks the F16C and portable
# paths against each other); CI also runs it built for the native ISA
# (F16C chosen at compile time) and with -DCAPEX_NO_SIMD (portable only),
# and test_f16c and test_fastpath built -O3 for the native ISA.
$(BUILD)/f16c/test_half_native: tests/test_half.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(BENCH_MARCH) $(WARN) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
$(BUILD)/f16c/test_half_nosimd: tests/test_half.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(WARN) $(TEST_DEFS) -DCAPEX_NO_SIMD -Itests $< -o $@ $(LDLIBS)
# test_f16c and test_tensor portable-only too: fp16 grads equal f32 grads, and
# the norms' documented order, without the x86 paths.
$(BUILD)/f16c/test_f16c_nosimd: tests/test_f16c.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(WARN) $(OPENMP) $(TEST_DEFS) -DCAPEX_NO_SIMD -Itests $< -o $@ $(LDLIBS)
$(BUILD)/f16c/test_tensor_nosimd: tests/test_tensor.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(WARN) $(OPENMP) $(TEST_DEFS) -DCAPEX_NO_SIMD -Itests $< -o $@ $(LDLIBS)
# The fast paths against the portable ones built -O3 for the native ISA too:
# there the compiler fuses and orders operations its own way (that build of
# test_f16c showed NaN sums of squares whose sign followed the path).
$(BUILD)/f16c/test_f16c_native: tests/test_f16c.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) $(WARN) $(OPENMP) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
$(BUILD)/f16c/test_fastpath_native: tests/test_fastpath.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) $(WARN) $(OPENMP) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
ci-extra:: $(BUILD)/f16c/test_half_native $(BUILD)/f16c/test_half_nosimd $(BUILD)/f16c/test_f16c_nosimd \
           $(BUILD)/f16c/test_tensor_nosimd $(BUILD)/f16c/test_f16c_native $(BUILD)/f16c/test_fastpath_native
	$(BUILD)/f16c/test_half_native
	$(BUILD)/f16c/test_f16c_native
	OMP_WAIT_POLICY=passive $(BUILD)/f16c/test_fastpath_native
	$(BUILD)/f16c/test_half_nosimd
	$(BUILD)/f16c/test_f16c_nosimd
	$(BUILD)/f16c/test_tensor_nosimd

# The capex side of the capex-vs-torch CPU table (bench/bench_cpu_torch.py
# runs it; `make bench-table-torch` prints the table). Built like bench-cpu.
.PHONY: bench-table bench-table-torch
bench-table: $(BUILD)/bench/bench_table
$(BUILD)/bench/bench_table: bench/bench_table.c capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) -fno-math-errno $(WARN) $(OPENMP) $< -o $@ $(LDLIBS)
bench-table-torch: $(BUILD)/bench/bench_table
	python3 bench/bench_cpu_torch.py --capex $(BUILD)/bench/bench_table
ci-extra:: $(BUILD)/bench/bench_table

# AdamW on fp16 grads three ways (blocked F16C, portable fused, a fused F16C
# prototype), for the CPU where fp16 is slow (bench/f16_adam_probe.c says why).
# CI builds it and runs it small: the three must give the same bits.
.PHONY: f16-adam-probe
$(BUILD)/bench/f16_adam_probe: bench/f16_adam_probe.c capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) -fno-math-errno $(WARN) $< -o $@ $(LDLIBS)
f16-adam-probe: $(BUILD)/bench/f16_adam_probe
	$(BUILD)/bench/f16_adam_probe 1000000 15
ci-extra:: $(BUILD)/bench/f16_adam_probe
	@rc=0; $(BUILD)/bench/f16_adam_probe 100003 2 > $(BUILD)/bench/f16_adam_probe.txt || rc=$$?; \
	  cat $(BUILD)/bench/f16_adam_probe.txt; [ $$rc -eq 0 ] && ! grep -q 'DIFFERENT BITS' $(BUILD)/bench/f16_adam_probe.txt
