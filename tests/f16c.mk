# f16c: the half conversions built the two other ways. make test runs
# test_half with run-time F16C dispatch (it checks the F16C and portable
# paths against each other); CI also runs it built for the native ISA
# (F16C chosen at compile time) and with -DCAPEX_NO_SIMD (portable only).
$(BUILD)/f16c/test_half_native: tests/test_half.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(BENCH_MARCH) $(WARN) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
$(BUILD)/f16c/test_half_nosimd: tests/test_half.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 $(WARN) $(TEST_DEFS) -DCAPEX_NO_SIMD -Itests $< -o $@ $(LDLIBS)
ci-extra:: $(BUILD)/f16c/test_half_native $(BUILD)/f16c/test_half_nosimd
	$(BUILD)/f16c/test_half_native
	$(BUILD)/f16c/test_half_nosimd
