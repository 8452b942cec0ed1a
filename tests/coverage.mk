# make coverage: capex.h line and branch coverage from the CPU tests (gcov), with the
# lines not fully covered in $(COV_DIR)/uncovered.txt. Not part of CI (about 7 min on 2 cores).
COV_DIR ?= build-cov
.PHONY: coverage
coverage:
	@tests/coverage.sh $(COV_DIR)
