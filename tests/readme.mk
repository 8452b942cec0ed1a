# tests/test_readme.c compiles README.md's quick start with the compiler and
# flags that build the tests (plus -Werror), so `make sanitize` checks it too.
$(BUILD)/tests/test_readme: TEST_DEFS += -DREADME_CC='"$(CC)"' -DREADME_CFLAGS='"$(CFLAGS)"'
