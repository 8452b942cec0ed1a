# The training example's MPI build (mpicc -DCAPEX_MPI) that tests/test_example.c
# runs under mpirun -np 2 (it SKIPs, saying why, when mpicc is missing); the
# `make run` build (EXAMPLE_OPT) is in the Makefile.

ifneq ($(DIST_HAVE_MPICC),)
$(BUILD)/tests/test_example: $(BUILD)/examples/train_charlm_mpi
$(BUILD)/examples/train_charlm_mpi: examples/train_charlm.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 $(EXAMPLE_OPT) $(WARN) -DCAPEX_MPI $< -o $@ $(LDLIBS)
endif

# Every example builds warning-free as C99 under gcc and clang, and as C++.
EXAMPLE_SRCS := $(wildcard examples/*.c)
examples-check:
	@mkdir -p $(BUILD)/excheck
	@for c in gcc clang; do for f in $(EXAMPLE_SRCS); do \
	  $$c -std=c99 -O2 $(WARN) -Werror $$f -o $(BUILD)/excheck/$$(basename $$f .c)-$$c $(LDLIBS) || exit 1; done; done
	@for f in $(EXAMPLE_SRCS); do \
	  g++ -x c++ -std=c++11 -O2 $(WARN) -Werror $$f -o $(BUILD)/excheck/$$(basename $$f .c)-cxx $(LDLIBS) || exit 1; done
	@for e in minimal port_before port_after; do \
	  $(BUILD)/excheck/$$e-gcc > /dev/null 2>&1 || { echo "examples-check: $$e.c did not converge"; exit 1; }; done
	@echo "examples-check: ok (every example builds; minimal, port_before and port_after converge)"

ci-extra:: examples-check

# The example's GPU path on the CPU emulator driver (tests/emu.mk): tracks the
# CPU run at O2 fp16 and O0, resumes bit-identically, and its checkpoint
# resumes on the CPU (tests/example_emu.sh).
.PHONY: example-emu
ci-extra:: example-emu
example-emu: $(BUILD)/examples/train_charlm $(EMU_LIB)
	@tests/example_emu.sh $(BUILD)/examples/train_charlm $(abspath $(EMU_LIB)) $(abspath $(EMU_DIR)/cache)

# test_example and test_gpt run their two-rank DDP check through tests/two_ranks.h.
$(BUILD)/tests/test_example $(BUILD)/tests/test_gpt: tests/two_ranks.h tests/free_port.h
