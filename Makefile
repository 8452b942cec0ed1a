# capex: `make run` trains, `make test` tests. See README.md.
CC      ?= cc
CXX     ?= c++
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -pedantic
# OpenMP when the compiler has it; results are identical without it.
OPENMP  ?= $(shell printf 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
CFLAGS  ?= -std=c99 $(OPT) $(WARN) $(OPENMP)
LDLIBS  := -ldl -lpthread -lm
BUILD   ?= build
# Seconds each libFuzzer target runs in ci-extra (`make ci-extra FUZZ_TIME=14400` for hours).
FUZZ_TIME ?= 10
# 1 when clang links libFuzzer here; fuzz targets skip (saying so) otherwise,
# and where it is present a harness that fails to compile fails CI.
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
HAVE_LIBFUZZER = $(shell printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' | clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null && echo 1)

# Tests see every capex function as static (CAPEX_STATIC), so each test program
# compiles only what it calls: seconds per test instead of ~40 s under ASan.
TEST_DEFS := -DCAPEX_STATIC
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
HEADERS   := capex.h $(wildcard capex_cuda.h)

.PHONY: all run test tests sanitize compile-check gpu-test bench clean ci-deps ci-extra
all: tests $(BUILD)/examples/train_charlm $(BUILD)/examples/minimal

$(BUILD)/tests/%: tests/%.c tests/capex_test.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

tests: $(TEST_BINS)

# The README's test command. Ends with "N passed, N failed, N skipped".
# TEST_FIRST: the longest programs (measured on 2 cores), started first so
# that none starts last and runs alone (tests/run.sh; reports keep their order).
TEST_FIRST ?= test_cuda_jit test_gpt test_readme test_cuda_cache test_gpuopt_emu test_fastpath test_dist_mpirun \
              test_dist test_example test_nccl test_gpuopt
test: $(TEST_BINS)
	@CAPEX_TEST_FIRST="$(TEST_FIRST)" tests/run.sh $(TEST_BINS)

# The main job: a char-level LM trained at O0 (fp32) and O2 (fp16, bf16),
# validation losses compared, chart in build/loss_curve.svg. ~40 s on 2 cores.
# Built optimised: -fno-math-errno lets GCC vectorise the sqrtf of the Adam loop.
EXAMPLE_OPT ?= -O3 -g -fno-math-errno
$(BUILD)/examples/train_charlm: examples/train_charlm.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(OPENMP) $< -o $@ $(LDLIBS)

run: $(BUILD)/examples/train_charlm
	$(BUILD)/examples/train_charlm --compare --svg $(BUILD)/loss_curve.svg

# All tests again under AddressSanitizer + UndefinedBehaviorSanitizer (clang).
# -g1 (line tables): the reports name file and line, and the big test programs
# compile faster than with full debug info. The CPU emulator driver is not
# instrumented, so both builds share $(BUILD)/emu (build-san/emu links to it).
# CAPEX_TEST_SANITIZED=1: sweeps that repeat the same host code on other data
# run a subset here (ct_sanitized in tests/capex_test.h); make test runs them whole.
sanitize:
	@mkdir -p build-san $(BUILD)/emu && { [ -L build-san/emu ] || rm -rf build-san/emu; } && \
	  ln -sfn $(abspath $(BUILD))/emu build-san/emu
	CAPEX_TEST_SANITIZED=1 $(MAKE) --no-print-directory BUILD=build-san EMU_DIR=$(BUILD)/emu CC=clang OPENMP= \
	  CFLAGS="-std=c99 -O1 -g1 $(WARN) -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" test

# Headers compiled as C99, C11 and C++11 under gcc and clang, warnings as errors;
# then with CAPEX_NO_DIST / CAPEX_NO_STATE (tests/compile_check_min.c, _removed.c).
# Five independent groups, so `make -j2 compile-check` runs them side by side.
.PHONY: cc-c cc-cxx cc-switch-c cc-switch-cxx cc-switch-run
compile-check: cc-c cc-cxx cc-switch-c cc-switch-cxx cc-switch-run
	@echo "compile-check: ok"
cc-c:
	@mkdir -p $(BUILD)/cc
	@for c in gcc clang; do for s in c99 c11; do \
	  echo "$$c -std=$$s"; $$c -std=$$s $(WARN) -Werror -c tests/compile_check.c -o $(BUILD)/cc/$$c-$$s.o || exit 1; \
	  echo "$$c -std=$$s CAPEX_STATIC"; $$c -std=$$s $(WARN) -Werror -DCAPEX_STATIC -c tests/compile_check.c -o $(BUILD)/cc/$$c-$$s-static.o || exit 1; \
	done; \
	  echo "$$c -std=c99, a system header first (POSIX hidden)"; $$c -std=c99 $(WARN) -Werror -include stdio.h -c tests/compile_check.c -o $(BUILD)/cc/$$c-sysfirst.o || exit 1; \
	  echo "$$c -std=c99 -D_POSIX_C_SOURCE=199309L"; $$c -std=c99 $(WARN) -Werror -D_POSIX_C_SOURCE=199309L -c tests/compile_check.c -o $(BUILD)/cc/$$c-posix93.o || exit 1; \
	done
cc-cxx:
	@mkdir -p $(BUILD)/cc
	@for c in g++ clang++; do for s in c++11 c++17; do \
	  echo "$$c -std=$$s"; $$c -x c++ -std=$$s $(WARN) -Werror -c tests/compile_check.c -o $(BUILD)/cc/$$c-$$s.o || exit 1; \
	done; done
CC_SWITCHES := "-DCAPEX_NO_DIST" "-DCAPEX_NO_STATE" "-DCAPEX_NO_DIST -DCAPEX_NO_STATE" \
               "-DCAPEX_NO_DIST -DCAPEX_NO_STATE -DCAPEX_STATIC"
cc-switch-c:
	@mkdir -p $(BUILD)/cc
	@for d in $(CC_SWITCHES); do for c in gcc clang; do echo "$$c -std=c99 $$d"; \
	    $$c -std=c99 $(WARN) -Werror $$d -c tests/compile_check.c -o $(BUILD)/cc/sw-c.o || exit 1; done; done
cc-switch-cxx:
	@mkdir -p $(BUILD)/cc
	@for d in $(CC_SWITCHES); do for c in g++ clang++; do echo "$$c -std=c++11 $$d"; \
	    $$c -x c++ -std=c++11 $(WARN) -Werror $$d -c tests/compile_check.c -o $(BUILD)/cc/sw-cxx.o || exit 1; done; done
# What each switch keeps links and runs (C with gcc, C++ with clang++), and
# what it removes is undeclared: each function compiles without the switch, not with it.
cc-switch-run:
	@mkdir -p $(BUILD)/cc
	@for d in "" "-DCAPEX_NO_DIST" "-DCAPEX_NO_STATE" "-DCAPEX_NO_DIST -DCAPEX_NO_STATE"; do \
	  gcc -std=c99 $(WARN) -Werror $$d tests/compile_check_min.c -o $(BUILD)/cc/min $(LDLIBS) && \
	    $(BUILD)/cc/min || exit 1; \
	  clang++ -x c++ -std=c++11 $(WARN) -Werror $$d tests/compile_check_min.c -o $(BUILD)/cc/min $(LDLIBS) && \
	    $(BUILD)/cc/min || exit 1; \
	done
	@for t in NO_DIST:capex_comm_init_single NO_DIST:capex_comm_allreduce NO_DIST:capex_dist_env_read \
	          NO_DIST:capex_rendezvous_broadcast NO_DIST:capex_ddp_create NO_DIST:capex_zero_create \
	          NO_DIST:capex_comm_init_nccl NO_STATE:capex_state_writer_create NO_STATE:capex_crc32 \
	          NO_STATE:capex_scaler_save NO_STATE:capex_optim_load_file NO_STATE:capex_zero_save_file; do \
	  s=$${t%%:*}; f=$${t#*:}; \
	  gcc -std=c99 $(WARN) -Werror -fsyntax-only -DCAPEX_CHECK_FN=$$f tests/compile_check_removed.c || exit 1; \
	  if gcc -std=c99 $(WARN) -Werror -fsyntax-only -DCAPEX_$$s -DCAPEX_CHECK_FN=$$f tests/compile_check_removed.c \
	       2>$(BUILD)/cc/removed.log; then echo "CAPEX_$$s keeps $$f"; exit 1; fi; \
	  grep -q "$$f" $(BUILD)/cc/removed.log || { cat $(BUILD)/cc/removed.log; exit 1; }; \
	done; echo "CAPEX_NO_DIST / CAPEX_NO_STATE remove their functions"

clean:
	rm -rf build build-san build-tsan

# Each feature may add tests/<feature>.mk with extra rules, including
# `ci-deps::` (installs for CI) and `ci-extra::` (CI checks beyond make test).
ci-deps::
ci-extra::
include $(sort $(wildcard tests/*.mk))
