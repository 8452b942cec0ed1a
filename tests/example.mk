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
# gcc builds and links every example at -O2 (three of them then run); clang and
# g++ compile train_gpt (both headers' implementations) at -O2, for the
# warnings only the optimizer sees, and check the others' own code with
# -fsyntax-only: the headers compile the same in every example. Three
# targets, so `make -j2` runs them side by side.
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLE_FULL := examples/train_gpt.c
.PHONY: excheck-gcc excheck-clang excheck-cxx
examples-check: excheck-gcc excheck-clang excheck-cxx
	@echo "examples-check: ok (every example builds; minimal, port_before and port_after converge; train_gpt refuses malformed numbers, negative counts and an unwritable --save; capex_info refuses unknown options)"
excheck-gcc:
	@mkdir -p $(BUILD)/excheck
	@for f in $(EXAMPLE_SRCS); do \
	  gcc -std=c99 -O2 $(WARN) -Werror $$f -o $(BUILD)/excheck/$$(basename $$f .c)-gcc $(LDLIBS) || exit 1; done
	@for e in minimal port_before port_after; do \
	  $(BUILD)/excheck/$$e-gcc > /dev/null 2>&1 || { echo "examples-check: $$e.c did not converge"; exit 1; }; done
	@for o in "--steps 10x" "--lr 1e-3x" "--clip abc" "--seed -1" "--bucket-kb 12q" "--sample 2.5" "--wd 1e999"; do \
	  $(BUILD)/excheck/train_gpt-gcc $$o > $(BUILD)/excheck/opt.log 2>&1; rc=$$?; \
	  if [ $$rc -ne 2 ] || ! grep -q "is not" $(BUILD)/excheck/opt.log; then \
	    echo "examples-check: train_gpt $$o: exit $$rc, want 2 naming the value"; cat $(BUILD)/excheck/opt.log; exit 1; fi; done
	@small="--device cpu --steps 2 --batch 1 --seq 8 --eval-windows 1 --sample 0 --quiet"; \
	for o in "--log-every -1" "--eval-every -1" "--save-at -3" "--clip -1" "--save /nonexistent/dir/ckpt.capex" "--save /tmp/" "--channels 2000000000 --heads 1"; do \
	  $(BUILD)/excheck/train_gpt-gcc $$small $$o > $(BUILD)/excheck/opt.log 2>&1; rc=$$?; \
	  if [ $$rc -ne 2 ] || grep -q "val loss" $(BUILD)/excheck/opt.log; then \
	    echo "examples-check: train_gpt $$o: exit $$rc, want 2 before any training"; cat $(BUILD)/excheck/opt.log; exit 1; fi; done
	@for o in "--bogus" "--phases" "--parts --part"; do $(BUILD)/excheck/capex_info-gcc $$o > $(BUILD)/excheck/opt.log 2>&1; rc=$$?; \
	  if [ $$rc -ne 2 ] || grep -q "CUDA driver" $(BUILD)/excheck/opt.log; then \
	    echo "examples-check: capex_info $$o: exit $$rc, want 2 before any report"; cat $(BUILD)/excheck/opt.log; exit 1; fi; done
	@$(BUILD)/excheck/capex_info-gcc --help > $(BUILD)/excheck/opt.log 2>&1 && grep -q "^usage: capex_info" $(BUILD)/excheck/opt.log && \
	  ! grep -q "CUDA driver" $(BUILD)/excheck/opt.log || { echo "examples-check: capex_info --help: want the usage only"; exit 1; }
excheck-clang:
	@mkdir -p $(BUILD)/excheck
	@for f in $(EXAMPLE_SRCS); do case " $(EXAMPLE_FULL) " in *" $$f "*) \
	  clang -std=c99 -O2 $(WARN) -Werror $$f -o $(BUILD)/excheck/$$(basename $$f .c)-clang $(LDLIBS) || exit 1;; \
	  *) clang -std=c99 $(WARN) -Werror -fsyntax-only $$f || exit 1;; esac; done
excheck-cxx:
	@mkdir -p $(BUILD)/excheck
	@for f in $(EXAMPLE_SRCS); do case " $(EXAMPLE_FULL) " in *" $$f "*) \
	  g++ -x c++ -std=c++11 -O2 $(WARN) -Werror $$f -o $(BUILD)/excheck/$$(basename $$f .c)-cxx $(LDLIBS) || exit 1;; \
	  *) g++ -x c++ -std=c++11 $(WARN) -Werror -fsyntax-only $$f || exit 1;; esac; done

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

# test_example.c compiles the example in: an edit to it rebuilds the test
# (without mpicc nothing else made it a prerequisite, and make test ran a stale one).
$(BUILD)/tests/test_example: examples/train_charlm.c
