# Norms (NORM section): the SyncBatchNorm MPI program (tests/mpi/test_norm_mpi.c,
# run by tests/test_norm_mpirun.c under mpirun -np 2 and -np 3 from `make test`;
# Open MPI comes from dist.mk's ci-deps), the OpenMP/no-OpenMP bit check, and
# the CPU benchmark (bench/bench_norm.c: built by CI, never run by it).
NORM_MPICC ?= mpicc
NORM_HAVE_MPICC := $(shell command -v $(NORM_MPICC) 2>/dev/null)

ifneq ($(NORM_HAVE_MPICC),)
$(BUILD)/tests/test_norm_mpirun: $(BUILD)/tests/mpi/test_norm_mpi
$(BUILD)/tests/mpi/test_norm_mpi: tests/mpi/test_norm_mpi.c capex.h
	@mkdir -p $(dir $@)
	$(NORM_MPICC) -std=c99 -O2 -g $(WARN) -DCAPEX_MPI -Itests $< -o $@ -lm
endif

# Same bits with and without OpenMP, vectorised (-O3, native ISA, FMA contraction).
# (= not :=: BENCH_MARCH comes from tensor.mk, included after this file)
NORM_VEC_FLAGS = -std=gnu99 -O3 $(BENCH_MARCH) -ffp-contract=fast $(WARN)
$(BUILD)/norm-vec/test_norm_omp: tests/test_norm.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) $(NORM_VEC_FLAGS) $(TEST_DEFS) $(OPENMP) -Itests $< -o $@ $(LDLIBS)
$(BUILD)/norm-vec/test_norm_noomp: tests/test_norm.c tests/capex_test.h capex.h
	@mkdir -p $(dir $@)
	$(CC) $(NORM_VEC_FLAGS) $(TEST_DEFS) -Itests $< -o $@ $(LDLIBS)
ci-extra:: $(BUILD)/norm-vec/test_norm_omp $(BUILD)/norm-vec/test_norm_noomp
	$(BUILD)/norm-vec/test_norm_omp
	$(BUILD)/norm-vec/test_norm_noomp
	@a=$$(NORM_HASH=1 $(BUILD)/norm-vec/test_norm_omp); b=$$(NORM_HASH=1 $(BUILD)/norm-vec/test_norm_noomp); \
	  echo "norm: with OpenMP $$a, without $$b"; [ "$$a" = "$$b" ] || { echo "norm: OpenMP changed the bits"; exit 1; }

.PHONY: bench-norm
bench-norm: $(BUILD)/bench/bench_norm
$(BUILD)/bench/bench_norm: bench/bench_norm.c capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O3 $(BENCH_MARCH) -fno-math-errno $(WARN) $(OPENMP) $< -o $@ $(LDLIBS)
ci-extra:: $(BUILD)/bench/bench_norm

# When PyTorch is importable, regenerate the golden vectors (layer_norm,
# rms_norm, batch_norm + autograd) and require the committed file to match
# (the first line names the torch version and is not compared).
ci-extra::
	@if python3 -c "import torch; torch.nn.functional.rms_norm" >/dev/null 2>&1; then \
	  mkdir -p $(BUILD) && python3 tests/gen_norm_ref.py | tail -n +2 > $(BUILD)/norm_ref.regen && \
	  tail -n +2 tests/data/norm_ref.txt | cmp -s - $(BUILD)/norm_ref.regen && \
	  echo "norm: tests/data/norm_ref.txt matches torch $$(python3 -c 'import torch; print(torch.__version__)')" || \
	  { echo "norm: tests/data/norm_ref.txt differs from torch's output"; exit 1; }; \
	else echo "norm: torch (with rms_norm) not importable, golden-file regeneration skipped"; fi

# The GPU SyncBatchNorm over a forked world of 2 on the stand-in NCCL (emulator only).
$(BUILD)/tests/test_norm_gpu: tests/cuda_test_util.h tests/nccl_world.h
