/* Included before capex.h / capex_cuda.h: the next CAPEX_MALLOC of exactly
   g_fail_alloc_size bytes fails (0: none), so a test can put one rank out of
   memory at a chosen host allocation. The test clears it if the allocation
   never came (then the test is wrong, not the library). */
#ifndef CAPEX_TEST_FAIL_ALLOC_H
#define CAPEX_TEST_FAIL_ALLOC_H
#include <stdlib.h>
static size_t g_fail_alloc_size;
static void *capex_test_fail_malloc(size_t sz) {
    if (g_fail_alloc_size && sz == g_fail_alloc_size) { g_fail_alloc_size = 0; return NULL; }
    return malloc(sz);
}
#define CAPEX_MALLOC(sz) capex_test_fail_malloc(sz)
#define CAPEX_REALLOC(p, sz) realloc(p, sz)
#define CAPEX_FREE(p) free(p)
#endif
