# State files: tests/test_state.c (run by make test), tests/fuzz_state.c
# (libFuzzer target), tests/state_py.py (python cross-checks and seed corpus).
STATE_FUZZ     := $(BUILD)/fuzz/fuzz_state
STATE_FUZZ_S   ?= $(FUZZ_TIME)
STATE_FUZZ_CC  ?= clang
STATE_FUZZ_FLAGS := -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all

# python's safetensors + numpy for the interop check in test_state (skips without them).
ci-deps::
	@python3 -c 'import safetensors, numpy' 2>/dev/null || \
	  python3 -m pip install -q safetensors numpy 2>/dev/null || \
	  python3 -m pip install -q --break-system-packages safetensors numpy 2>/dev/null || \
	  echo "state: could not pip install safetensors numpy; test_state's python check will SKIP"

$(STATE_FUZZ): tests/fuzz_state.c capex.h
	@mkdir -p $(dir $@)
	$(STATE_FUZZ_CC) $(STATE_FUZZ_FLAGS) -Itests $< -o $@ -lm

# Fuzzes the parser for $(STATE_FUZZ_S) s from a seed corpus made at run time.
ci-extra::
	@echo "== state: fuzz_state (libFuzzer, $(STATE_FUZZ_S) s)"
	@if [ -z "$(HAVE_LIBFUZZER)" ]; then \
	  echo "SKIP fuzz_state: $(STATE_FUZZ_CC) cannot build -fsanitize=fuzzer (libFuzzer missing); test_state still runs the fuzz checks on its corpora"; \
	else \
	  $(MAKE) --no-print-directory $(STATE_FUZZ) || exit 1; \
	  rm -rf $(BUILD)/fuzz/state_corpus; mkdir -p $(BUILD)/fuzz/state_corpus; \
	  python3 tests/state_py.py seeds $(BUILD)/fuzz/state_corpus 2>/dev/null || echo "state: no python3, fuzzing from an empty corpus"; \
	  printf '"{"\n"}"\n"["\n"]"\n":"\n","\n"\\\\u00e9"\n"\\\\ud83d\\\\ude00"\n"\\"dtype\\""\n"\\"shape\\""\n"\\"data_offsets\\""\n"\\"__metadata__\\""\n"\\"F32\\""\n"\\"BF16\\""\n"\\"U8\\""\n"\\"format\\""\n"\\"capex-state\\""\n"18446744073709551615"\n' > $(BUILD)/fuzz/state.dict; \
	  if $(STATE_FUZZ) -max_total_time=$(STATE_FUZZ_S) -max_len=4096 -timeout=10 -print_final_stats=1 \
	       -artifact_prefix=$(BUILD)/fuzz/ -dict=$(BUILD)/fuzz/state.dict $(BUILD)/fuzz/state_corpus \
	       > $(BUILD)/fuzz/state.log 2>&1; then \
	    grep -E '^stat::number_of_executed_runs|^Done ' $(BUILD)/fuzz/state.log; echo "fuzz_state: ok"; \
	  else tail -n 40 $(BUILD)/fuzz/state.log; echo "fuzz_state FAILED: crash input saved under $(BUILD)/fuzz/"; exit 1; fi; \
	fi

# Loader fuzzers (issue 16): capex_optim_load and capex_scaler_load past the
# checksum (tests/fuzz_load.h re-fixes it), from the seeds the library itself
# wrote under tests/corpus/<target>/ (regenerate: make fuzz-load-seeds).
# The seeds are always replayed through a plain build (-DCAPEX_FUZZ_REPLAY);
# with libFuzzer each target then runs $(LOAD_FUZZ_S) s. For hours, see the
# comment at the top of each target.
LOAD_FUZZ   := fuzz_optim_load fuzz_scaler_load
LOAD_FUZZ_S ?= $(FUZZ_TIME)

$(BUILD)/fuzz/fuzz_%_load: tests/fuzz_%_load.c tests/fuzz_load.h capex.h
	@mkdir -p $(dir $@)
	$(STATE_FUZZ_CC) $(STATE_FUZZ_FLAGS) -Itests $< -o $@ -lm

$(BUILD)/fuzz/replay_%_load: tests/fuzz_%_load.c tests/fuzz_load.h capex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 $(OPT) $(WARN) -DCAPEX_FUZZ_REPLAY -Itests $< -o $@ -lm

ci-extra:: $(addprefix $(BUILD)/fuzz/replay_,optim_load scaler_load)
	@for t in $(LOAD_FUZZ); do $(BUILD)/fuzz/replay_$${t#fuzz_} tests/corpus/$$t/* || exit 1; done
	@if [ -z "$(HAVE_LIBFUZZER)" ]; then \
	  echo "SKIP $(LOAD_FUZZ): $(STATE_FUZZ_CC) cannot build -fsanitize=fuzzer (libFuzzer missing); their seeds were replayed"; \
	else \
	  for t in $(LOAD_FUZZ); do \
	    echo "== state: $$t (libFuzzer, $(LOAD_FUZZ_S) s)"; \
	    $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) $(BUILD)/fuzz/$$t || exit 1; \
	    rm -rf $(BUILD)/fuzz/$$t.corpus; mkdir -p $(BUILD)/fuzz/$$t.corpus; \
	    if $(BUILD)/fuzz/$$t -max_total_time=$(LOAD_FUZZ_S) -max_len=8192 -timeout=10 -print_final_stats=1 \
	         -artifact_prefix=$(BUILD)/fuzz/$$t- $(BUILD)/fuzz/$$t.corpus tests/corpus/$$t > $(BUILD)/fuzz/$$t.log 2>&1; then \
	      grep -E '^stat::number_of_executed_runs|^Done ' $(BUILD)/fuzz/$$t.log; echo "$$t: ok"; \
	    else tail -n 40 $(BUILD)/fuzz/$$t.log; echo "$$t FAILED: crash input saved as $(BUILD)/fuzz/$$t-*"; exit 1; fi; \
	  done; \
	fi

# Rewrites the committed seed corpora from the library's own checkpoints.
.PHONY: fuzz-load-seeds
fuzz-load-seeds:
	@mkdir -p $(BUILD)/fuzz
	@for t in $(LOAD_FUZZ); do \
	  $(CC) -std=c99 $(OPT) $(WARN) -DCAPEX_FUZZ_GEN -Itests tests/$$t.c -o $(BUILD)/fuzz/gen_$$t -lm && \
	  rm -rf tests/corpus/$$t && mkdir -p tests/corpus/$$t && $(BUILD)/fuzz/gen_$$t tests/corpus/$$t || exit 1; \
	done
