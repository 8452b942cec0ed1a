# The GPT example (examples/train_gpt.c): `make gpt` trains it on the licence
# texts (O2 fp16, AdamW, 1000 steps; estimated ~2 min on an idle 2-core box from
# a 9.3k tok/s single-thread burst, 7-8.5 min measured while the box was shared)
# and samples text;
# tests/test_gpt.c compiles the example in (TRAIN_GPT_NO_MAIN).
.PHONY: gpt
$(BUILD)/tests/test_gpt: examples/train_gpt.c

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
