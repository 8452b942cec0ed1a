# Data parallel (DIST): the MPI test binary and the Open MPI install for CI.
# tests/test_dist_mpirun.c runs it under mpirun from `make test` (and SKIPs
# when mpirun or the binary is missing).
MPICC ?= mpicc
DIST_HAVE_MPICC := $(shell command -v $(MPICC) 2>/dev/null)

$(BUILD)/tests/test_dist: tests/fork_world.h tests/free_port.h tests/fail_alloc.h

ifneq ($(DIST_HAVE_MPICC),)
$(BUILD)/tests/test_dist_mpirun: $(BUILD)/tests/mpi/test_dist_mpi
$(BUILD)/tests/mpi/test_dist_mpi: tests/mpi/test_dist_mpi.c tests/dist_shards.h tests/zero_check.h capex.h
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
	$(if $(HAVE_LIBFUZZER),clang $(FUZZ_FLAGS) $< -o $@,@echo "dist: could not build the fuzz target (no libFuzzer)")

# Fuzz the rendezvous messages (tests/fuzz_rdv.c) and the TCP comm's streams
# (tests/fuzz_tcp.c), both directions, for $(NET_FUZZ_S) s each, from the
# seeds in tests/corpus/fuzz_{rdv,tcp} (new inputs go under $(BUILD)/fuzz/,
# never into the repository); skipped where clang has no libFuzzer. The seeds
# are the library's own messages: `make fuzz-net-seeds` rewrites them, and CI
# fails when they differ from what the library now sends.
NET_FUZZ_S  ?= $(FUZZ_TIME)
NET_FUZZ_CC ?= clang
NET_FUZZ    := $(BUILD)/fuzz/fuzz_rdv $(BUILD)/fuzz/fuzz_tcp

$(NET_FUZZ): $(BUILD)/fuzz/%: tests/%.c tests/fuzz_tcp.h capex.h
	@mkdir -p $(dir $@)
	$(NET_FUZZ_CC) -std=c99 -g -O1 $(WARN) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Itests $< -o $@ -lm

$(BUILD)/fuzz/fuzz_net_seeds: tests/fuzz_net_seeds.c tests/fuzz_tcp.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 -g $(WARN) -Itests $< -o $@ -lpthread -lm

fuzz-net-seeds: $(BUILD)/fuzz/fuzz_net_seeds
	rm -rf tests/corpus/fuzz_rdv tests/corpus/fuzz_tcp
	mkdir -p tests/corpus/fuzz_rdv tests/corpus/fuzz_tcp
	$(BUILD)/fuzz/fuzz_net_seeds tests/corpus
.PHONY: fuzz-net-seeds

ci-extra:: $(BUILD)/fuzz/fuzz_net_seeds
	@rm -rf $(BUILD)/fuzz/net_seeds; mkdir -p $(BUILD)/fuzz/net_seeds/fuzz_rdv $(BUILD)/fuzz/net_seeds/fuzz_tcp; \
	$(BUILD)/fuzz/fuzz_net_seeds $(BUILD)/fuzz/net_seeds && \
	  diff -r $(BUILD)/fuzz/net_seeds/fuzz_rdv tests/corpus/fuzz_rdv >/dev/null && \
	  diff -r $(BUILD)/fuzz/net_seeds/fuzz_tcp tests/corpus/fuzz_tcp >/dev/null || \
	  { echo "dist: tests/corpus/fuzz_{rdv,tcp} differ from the library's messages: run make fuzz-net-seeds"; exit 1; }
	@if [ -z "$(HAVE_LIBFUZZER)" ]; then \
	  echo "dist: libFuzzer unavailable, fuzz_rdv and fuzz_tcp skipped"; \
	else \
	  $(MAKE) --no-print-directory $(NET_FUZZ) || exit 1; \
	  for f in fuzz_rdv fuzz_tcp; do \
	    echo "dist: fuzzing $$f ($(NET_FUZZ_S) s)"; \
	    rm -rf $(BUILD)/fuzz/$$f.corpus; mkdir -p $(BUILD)/fuzz/$$f.corpus; \
	    $(BUILD)/fuzz/$$f $(BUILD)/fuzz/$$f.corpus tests/corpus/$$f -max_total_time=$(NET_FUZZ_S) -max_len=4096 \
	      -timeout=10 -seed=1 -artifact_prefix=$(BUILD)/fuzz/$$f- > $(BUILD)/fuzz/$$f.log 2>&1 || \
	      { tail -n 40 $(BUILD)/fuzz/$$f.log; echo "$$f FAILED: crash input saved as $(BUILD)/fuzz/$$f-*"; exit 1; }; \
	    tail -n 1 $(BUILD)/fuzz/$$f.log; \
	  done; \
	fi

# tests/dist_shards.h (reduce-scatter / allgatherv checks) is shared by test_dist, test_nccl and test_dist_mpi.
$(BUILD)/tests/test_dist $(BUILD)/tests/test_nccl: tests/dist_shards.h
