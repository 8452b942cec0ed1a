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
	  apt-get update -qq && apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null; \
	else echo "dist: no apt-get; MPI tests will be skipped"; fi
