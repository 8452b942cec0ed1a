# aarch64 (Grace/GH200, Graviton): the CPU tests cross-built and run under
# user-mode QEMU. Built -std=gnu99, GCC's default mode: there GCC fuses a*b+c
# into FMAs wherever the target has them (always on aarch64), which -std=c99
# (make test's build) hides; capex must keep its unfused bits anyway (the
# golden and GPU --fmad=false values). `make aarch64-deps` installs the cross
# compiler and QEMU (Debian); `make test-aarch64` skips, saying so, without them.
# QEMU emulates aarch64's memory order on a stronger host: races that x86
# hides stay hidden here too.
A64_CC      ?= aarch64-linux-gnu-gcc
A64_QEMU    ?= qemu-aarch64
A64_SYSROOT ?= /usr/aarch64-linux-gnu
A64_BUILD   ?= $(BUILD)/aarch64
# OpenMP off: threads under QEMU cost 5x (test_norm 100 s vs 18 s); bits do not
# depend on it (norm.mk and the thread-count tests check that natively).
A64_CFLAGS  ?= -std=gnu99 -O2 $(WARN)
A64_TESTS   ?= test_amp_loop test_desc test_f16c test_fastpath test_half test_lr test_norm test_novograd \
               test_optim test_optim_adagrad test_optim_options test_optlevel test_scaler test_scaler_state \
               test_state test_tensor test_zero
A64_FIRST   ?= test_norm test_optim test_tensor test_fastpath test_half test_optim_adagrad
A64_HAVE    = $(shell command -v $(A64_CC) >/dev/null 2>&1 && command -v $(A64_QEMU) >/dev/null 2>&1 && echo 1)

$(A64_BUILD)/%: tests/%.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(A64_CC) $(A64_CFLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)

.PHONY: test-aarch64 aarch64-deps
ifeq ($(A64_HAVE),1)
test-aarch64: $(A64_TESTS:%=$(A64_BUILD)/%)
	@CAPEX_TEST_LAUNCHER="$(A64_QEMU) -L $(A64_SYSROOT)" CAPEX_TEST_FIRST="$(A64_FIRST)" \
	  tests/run.sh $(A64_TESTS:%=$(A64_BUILD)/%)
else
test-aarch64:
	@echo "test-aarch64: skipped: $(A64_CC) or $(A64_QEMU) not found (make aarch64-deps)"
endif
aarch64-deps:
	@if command -v $(A64_CC) >/dev/null 2>&1 && command -v $(A64_QEMU) >/dev/null 2>&1; then echo "aarch64: cross compiler and QEMU present"; \
	elif command -v apt-get >/dev/null 2>&1; then echo "aarch64: installing gcc-aarch64-linux-gnu qemu-user"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null; \
	else echo "aarch64: no apt-get; test-aarch64 will skip"; fi

# CI: the CPU tests on aarch64 too (~2-3 min here): GCC's GNU-mode FMA fusion
# and other target differences change bits that x86's -std=c99 build cannot show.
ci-deps:: aarch64-deps
ci-extra:: test-aarch64
