# x86 with FMA (AVX2+FMA: x86-64-v3): the bit-exact CPU tests built in the
# compilers' own defaults, which fuse a*b+c into FMAs there: gcc -std=gnu99
# (GNU modes: -ffp-contract=fast) and clang with no -std (-ffp-contract=on:
# within an expression). make test's -std=c99 does not fuse, so it cannot
# show a fused capex.h; the goldens (Apex, torch) and the GPU (--fmad=false)
# are unfused. Native, so seconds where test-aarch64 (the same question under
# QEMU) takes minutes. With capex.h before 2026-11-29's FP_CONTRACT off
# (b22f5fc^1) 10 of these 16 programs fail, 5 per compiler (12 cases): the
# torch LR goldens, the Apex-order Adam, NovoGrad and Adagrad checks and the
# norms' unfused-bits hash, as under test-aarch64. `make test-fma` skips,
# saying so, on a CPU without AVX2+FMA (FMA_CPUINFO: the flags it reads) and
# per compiler without -march=x86-64-v3 (GCC < 11, clang < 12).
# No OpenMP: the bits do not depend on it (norm.mk checks), and it is faster.
FMA_BUILD       ?= $(BUILD)/fma
FMA_CPUINFO     ?= /proc/cpuinfo
FMA_TESTS       ?= test_optim test_lr test_novograd test_optim_adagrad test_norm test_half test_amp_loop test_fastpath
FMA_GCC_FLAGS   ?= -std=gnu99 -O2 -march=x86-64-v3 $(WARN)
FMA_CLANG_FLAGS ?= -O2 -march=x86-64-v3 $(WARN)
FMA_FIRST       ?= test_norm-clang test_norm-gcc test_fastpath-gcc test_fastpath-clang

$(FMA_BUILD)/%-gcc: tests/%.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	gcc $(FMA_GCC_FLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
$(FMA_BUILD)/%-clang: tests/%.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	clang $(FMA_CLANG_FLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)

# The checks run in the recipe (not at parse time): no compiler probe in
# every other make invocation.
.PHONY: test-fma
test-fma:
	@if ! { grep -qw avx2 $(FMA_CPUINFO) && grep -qw fma $(FMA_CPUINFO); } 2>/dev/null; then \
	  echo "test-fma: skipped: this CPU has no AVX2+FMA (x86-64-v3)"; exit 0; fi; \
	bins=; for c in gcc clang; do \
	  if printf 'int main(void){return 0;}\n' | $$c -march=x86-64-v3 -x c - -o /dev/null 2>/dev/null; then \
	    bins="$$bins $(FMA_TESTS:%=$(FMA_BUILD)/%-$$c)"; \
	  else echo "test-fma: $$c: skipped: no $$c or no -march=x86-64-v3"; fi; done; \
	[ -n "$$bins" ] || exit 0; \
	$(MAKE) -s --no-print-directory $$bins && CAPEX_TEST_FIRST="$(FMA_FIRST)" tests/run.sh $$bins

# CI: 63 CPU-seconds, most of it the build: 60-105 s wall on the shared
# 2-core box at load 6-7 (~35 s on 2 idle cores).
ci-extra:: test-fma
