/* `make compile-check` compiles this with -DCAPEX_CHECK_FN=<a public function>:
   it must compile without the switch that removes the function and fail with
   the switch (CAPEX_NO_DIST / CAPEX_NO_STATE), naming the function. Headers
   only, so each try takes a fraction of a second. */
#include "../capex_cuda.h"

typedef void (*capex_check_fn)(void);
capex_check_fn capex_check_removed(void);
capex_check_fn capex_check_removed(void) { return (capex_check_fn)CAPEX_CHECK_FN; }
