# Static SASS gate (no GPU): every built-in kernel part compiled by NVRTC to
# CUBIN for SASS_ARCHS, read with cuobjdump, checked against the committed
# tests/data/sass_table.txt (registers, stack, no local memory or spills,
# widest main-loop load, loads in flight per thread; rules in tests/sass_gate.py).
# `make sass-gate` checks, `make sass-table` rewrites the table (commit it with
# the kernel change that moved it). Skips, saying why, without NVRTC or cuobjdump.
SASS_ARCHS     := 80 90 100
SASS_DIR       := $(BUILD)/sass
SASS_TABLE     := tests/data/sass_table.txt
CUOBJDUMP_DIR  := build/deps/cuobjdump
CUOBJDUMP_WHEELS := nvidia-cuda-cuobjdump>=13,<14 nvidia-cuda-nvdisasm>=13,<14

# cuobjdump -sass needs nvdisasm next to it or on PATH.
CUOBJDUMP_FOUND = { command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; } || \
  [ -x $${CUDA_HOME:-/nonexistent}/bin/nvdisasm ] || [ -x /usr/local/cuda/bin/nvdisasm ] || \
  [ -x $(CUOBJDUMP_DIR)/nvidia/cu13/bin/nvdisasm ]

ci-deps::
	@if $(CUOBJDUMP_FOUND); then echo "sass: cuobjdump and nvdisasm present"; else \
	  echo "sass: fetching cuobjdump and nvdisasm from PyPI into $(CUOBJDUMP_DIR)"; \
	  if ! python3 -m pip --version >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null; fi; \
	  rm -rf $(CUOBJDUMP_DIR) && mkdir -p $(CUOBJDUMP_DIR) && \
	  for w in $(foreach w,$(CUOBJDUMP_WHEELS),'$(w)'); do \
	    python3 -m pip download --quiet --no-deps --only-binary=:all: -d $(CUOBJDUMP_DIR) "$$w" || exit 1; done && \
	  for f in $(CUOBJDUMP_DIR)/*.whl; do python3 -m zipfile -e $$f $(CUOBJDUMP_DIR) || exit 1; done && \
	  rm -f $(CUOBJDUMP_DIR)/*.whl && chmod +x $(CUOBJDUMP_DIR)/nvidia/cu13/bin/* && \
	  ls $(CUOBJDUMP_DIR)/nvidia/cu13/bin/; fi

$(SASS_DIR)/sass_dump: tests/sass_dump.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O1 $(WARN) $< -o $@ $(LDLIBS)

.PHONY: sass-gate sass-table
ci-extra:: sass-gate
# The parser's self-test runs everywhere; the CUBINs are remade each time (a
# stale one would hide a change), ~20 s of NVRTC on 2 cores, then ~40 s of cuobjdump.
sass-gate: $(SASS_DIR)/sass_dump
	@python3 tests/sass_gate.py --self-test && python3 bench/sass_loops.py --self-test
	@rm -rf $(SASS_DIR)/cubin; rc=0; $(SASS_DIR)/sass_dump $(SASS_DIR)/cubin $(SASS_ARCHS) || rc=$$?; \
	  if [ $$rc -eq 2 ]; then echo "sass gate: SKIP: NVRTC could not be loaded (see above)"; exit 0; fi; \
	  [ $$rc -eq 0 ] || exit 1; \
	  rc=0; python3 tests/sass_gate.py $(SASS_DIR)/cubin $(SASS_TABLE) --facts $(SASS_DIR)/facts.json || rc=$$?; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 77 ]

sass-table: $(SASS_DIR)/sass_dump
	@rm -rf $(SASS_DIR)/cubin && $(SASS_DIR)/sass_dump $(SASS_DIR)/cubin $(SASS_ARCHS)
	@mkdir -p $(dir $(SASS_TABLE)) && python3 tests/sass_gate.py $(SASS_DIR)/cubin $(SASS_TABLE) --write --facts $(SASS_DIR)/facts.json

# The bandwidth model (bench/gpu_model.py) on the facts the gate just read:
# predicted fraction of copy bandwidth per kernel on H100/H200/A100 (markdown).
.PHONY: gpu-model
gpu-model: sass-gate
	@mkdir -p $(BUILD)/bench
	@if [ -f $(SASS_DIR)/facts.json ]; then python3 bench/gpu_model.py $(SASS_DIR)/facts.json | tee $(BUILD)/bench/gpu_model.md; \
	else echo "gpu-model: no SASS facts (the gate skipped)"; fi

# Hot loops unchanged against a base commit (bench/sass_loops.py): both trees'
# parts compiled to CUBIN for SASS_LOOP_ARCHS, each kernel's hot loops compared
# (registers renamed, scheduling bits kept). For changes to cold code only.
#   make sass-loops [SASS_BASE=main] [SASS_LOOP_ARCHS="80 90"]
SASS_BASE       ?= main
SASS_LOOP_ARCHS ?= 80 90 100
.PHONY: sass-loops
sass-loops: $(SASS_DIR)/sass_dump
	@d=$(SASS_DIR)/loops; rm -rf $$d && mkdir -p $$d/base/tests && \
	  git show $(SASS_BASE):capex.h > $$d/base/capex.h && git show $(SASS_BASE):capex_cuda.h > $$d/base/capex_cuda.h && \
	  git show $(SASS_BASE):tests/sass_dump.c > $$d/base/tests/sass_dump.c && \
	  $(CC) -std=c99 -O1 $$d/base/tests/sass_dump.c -o $$d/base/sass_dump $(LDLIBS) && \
	  $$d/base/sass_dump $$d/before $(SASS_LOOP_ARCHS) && $(SASS_DIR)/sass_dump $$d/after $(SASS_LOOP_ARCHS) && \
	  python3 bench/sass_loops.py $$d/before $$d/after
