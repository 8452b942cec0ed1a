# Data parallel (DIST): the MPI test binary and the Open MPI install for CI.
# tests/test_dist_mpirun.c runs it under mpirun from `make test` (and SKIPs
# when mpirun or the binary is missing).
MPICC ?= mpicc
DIST_HAVE_MPICC := $(shell command -v $(MPICC) 2>/dev/null)

ifneq ($(DIST_HAVE_MPICC),)
$(BUILD)/tests/test_dist_mpirun: $(BUILD)/tests/mpi/test_dist_mpi
$(BUILD)/tests/mpi/test_dist_mpi: tests/mpi/test_dist_mpi.c capex.h
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 -O2 -g $(WARN) -DCAPEX_MPI -Itests $< -o $@ -lm
endif

ci-deps::
	@if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then \
	  echo "dist: Open MPI present"; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  echo "dist: installing Open MPI (libopenmpi-dev openmpi-bin)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get update -qq && apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null; } || \
	    echo "dist: Open MPI install failed; the MPI tests will be skipped (make test says why)"; \
	else echo "dist: no apt-get; the MPI tests will be skipped"; fi

# Fuzz the launcher-environment parsers for a bounded number of runs (clang's
# libFuzzer); skipped where clang cannot link -fsanitize=fuzzer.
ci-extra:: $(BUILD)/fuzz_dist_env
	@if [ -x $(BUILD)/fuzz_dist_env ]; then \
	  echo "dist: fuzzing the launcher-environment parsers (50000 runs)"; \
	  $(BUILD)/fuzz_dist_env -runs=50000 -max_len=256 -seed=1 > $(BUILD)/fuzz_dist_env.log 2>&1 || \
	    { tail -n 40 $(BUILD)/fuzz_dist_env.log; exit 1; }; tail -n 1 $(BUILD)/fuzz_dist_env.log; \
	else echo "dist: libFuzzer unavailable, fuzz target skipped"; fi

$(BUILD)/fuzz_dist_env: tests/fuzz_dist_env.c capex.h
	@mkdir -p $(dir $@)
	@clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $< -o $@ 2>/dev/null || \
	  echo "dist: could not build the fuzz target (no libFuzzer)"
