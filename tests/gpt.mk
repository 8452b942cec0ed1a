# The GPT example (examples/train_gpt.c): `make gpt` trains it on the licence
# texts (O2 fp16, AdamW, 1000 steps; estimated ~2 min on an idle 2-core box from
# a 9.3k tok/s single-thread burst, 7-8.5 min measured while the box was shared)
# and samples text;
# tests/test_gpt.c compiles the example in (TRAIN_GPT_NO_MAIN); so does
# tests/test_gpt_gpu.c (its GPU model against its CPU model, one step at every
# activation dtype: skips without a GPU, runs on the emulator in `make emu-test`).
.PHONY: gpt gpt-emu
$(BUILD)/tests/test_gpt: examples/train_gpt.c tests/cuda_test_util.h
$(BUILD)/tests/test_gpt_gpu: examples/train_gpt.c

$(BUILD)/examples/train_gpt: examples/train_gpt.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(OPENMP) $< -o $@ $(LDLIBS)

gpt: $(BUILD)/examples/train_gpt
	$(BUILD)/examples/train_gpt $(GPT_ARGS)

# The MPI build (mpirun -np 2 build/examples/train_gpt_mpi).
ifneq ($(DIST_HAVE_MPICC),)
$(BUILD)/examples/train_gpt_mpi: examples/train_gpt.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(MPICC) -std=c99 $(EXAMPLE_OPT) $(WARN) -DCAPEX_MPI $< -o $@ $(LDLIBS)
endif

# The GPU path (--device gpu) on the CPU emulator driver (tests/emu.mk): step
# losses track the CPU run's (fp32 within 1e-4, O2 fp16 within 2e-3), the
# sample equals the CPU's, resume is bit-identical, a GPU checkpoint resumes on
# the CPU, and without a driver auto falls back; data parallel over the
# stand-in NCCL: one rank through DDP equals the plain run, 2 ranks of half
# the batch track 1 rank of the whole, stay bit-identical and resume
# bit-identically (tests/gpt_emu.sh). ~55 CPU-seconds, ~9 of them the data
# parallel checks. Then tests/test_gpt.c's gpu_training_tracks_cpu, which
# otherwise runs only with a GPU (the test's config, seq 32 and batch 8; the
# GPU's val loss against the CPU's evaluation of the same weights): 12 s
# measured on the shared 2-core box at load 5.6.
ci-extra:: gpt-emu
gpt-emu: $(BUILD)/examples/train_gpt $(EMU_LIB) $(BUILD)/fake/libnccl.so.2 $(BUILD)/tests/test_gpt
	@tests/gpt_emu.sh $(BUILD)/examples/train_gpt $(abspath $(EMU_LIB)) $(abspath $(EMU_DIR)/cache) $(abspath $(BUILD)/fake/libnccl.so.2)
	@out=$$($(EMU_RUN) $(BUILD)/tests/test_gpt gpu_training_tracks_cpu 2>&1); rc=$$?; last=$$(echo "$$out" | tail -n 1); \
	  echo "gpt-emu: test_gpt gpu_training_tracks_cpu: $$last"; \
	  if [ $$rc -ne 0 ] || [ "$$last" != "1 passed, 0 failed, 0 skipped" ]; then echo "$$out"; exit 1; fi; \
	  echo "$$out" | grep '^    GPU vs CPU' | sed 's/^ */gpt-emu:   /'
