#!/bin/sh
# make coverage: line and branch coverage of capex.h from the CPU tests (not part of CI).
# Every test is built without CAPEX_STATIC, so each program holds every function and the
# denominators agree; forked ranks flush their counters at _exit (tests/cov_exit.c). Also
# built: portable-only (-DCAPEX_NO_SIMD) and serial (no OpenMP) variants, and the MPI
# programs when mpicc/mpirun are there. Report: tests/cov_merge.py; the lines with
# something not taken go to $DIR/uncovered.txt (##### never run; else the branch bits).
set -u
DIR=${1:-build-cov}
CC=${CC:-gcc}
JOBS=${JOBS:-2}
F="-std=c99 -O0 -g --coverage -fno-math-errno"
L="-ldl -lpthread -lm --coverage $DIR/cov_exit.o -Wl,--wrap=_exit"
ALL="test_amp_loop test_desc test_dist test_f16c test_fastpath test_half test_lr test_norm test_novograd test_optim
     test_optim_adagrad test_optim_options test_optlevel test_scaler test_scaler_state test_state test_tensor test_zero"
NOSIMD="test_half test_f16c test_tensor test_optim test_fastpath"
NOOMP="test_tensor test_norm test_optim test_fastpath test_f16c"
rm -rf "$DIR" && mkdir -p "$DIR/all" "$DIR/nosimd" "$DIR/noomp" "$DIR/mpi" || exit 1
$CC -O1 -c tests/cov_exit.c -o "$DIR/cov_exit.o" || exit 1
{
    for t in $ALL; do echo "$DIR/all/$t -fopenmp"; done
    for t in $NOSIMD; do echo "$DIR/nosimd/$t -fopenmp -DCAPEX_NO_SIMD"; done
    for t in $NOOMP; do echo "$DIR/noomp/$t -fno-openmp"; done
} | xargs -P "$JOBS" -L 1 sh -c 'o=$0; '"$CC $F"' "$@" -Itests tests/$(basename $o).c -o $o '"$L"' || echo "coverage: build of $o failed"'
fail=0
export OMP_WAIT_POLICY=passive
for b in "$DIR"/all/test_* "$DIR"/nosimd/test_* "$DIR"/noomp/test_*; do
    case $b in *.gcno|*.gcda|*.log) continue;; esac
    "$b" > "$b.log" 2>&1 || { fail=1; echo "coverage: $b failed (see $b.log)"; }
    echo "$b: $(tail -n 1 "$b.log")"
done
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    M="mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none"
    for t in test_dist_mpi test_norm_mpi; do
        mpicc $F -DCAPEX_MPI -Itests tests/mpi/$t.c -o "$DIR/mpi/$t" -lm || fail=1
    done
    for np in 2 4; do timeout 600 $M -np $np "$DIR/mpi/test_dist_mpi" > "$DIR/mpi/dist$np.log" 2>&1 || fail=1; done
    for np in 2 3; do timeout 600 $M -np $np "$DIR/mpi/test_norm_mpi" > "$DIR/mpi/norm$np.log" 2>&1 || fail=1; done
    echo "mpi: $(tail -n 1 "$DIR/mpi/dist4.log"); $(tail -n 1 "$DIR/mpi/norm3.log")"
else
    echo "coverage: no mpicc/mpirun, the MPI backend is left out"
fi
python3 tests/cov_merge.py capex.h "$DIR" --uncovered "$DIR/uncovered.txt"
[ $fail = 0 ] || echo "coverage: some test failed; the numbers count what ran"
