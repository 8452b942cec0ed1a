/* Coverage builds only (make coverage, linked with -Wl,--wrap=_exit): forked test ranks
   leave by _exit, which skips libgcov's exit-time dump; flush their counters first. */
void __gcov_dump(void);
void __real__exit(int status);
void __wrap__exit(int status);
void __wrap__exit(int status) {
    __gcov_dump();
    __real__exit(status);
}
