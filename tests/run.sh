#!/usr/bin/env bash
# Runs every test program given on the command line (or build/tests/test_*),
# shows their output, and ends with one line: "N passed, N failed, N skipped".
# A program that crashes or prints no summary counts as one failure.
# Programs run CAPEX_TEST_JOBS at a time (default: the number of cores); each
# one's output is shown whole, in the order given, as soon as it and every
# program before it have finished.
set -u
progs=()
for p in "$@"; do [ -x "$p" ] && progs+=("$p"); done
if [ $# -eq 0 ]; then for p in build/tests/test_*; do [ -x "$p" ] && progs+=("$p"); done; fi
jobs=${CAPEX_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
# CAPEX_TEST_TIMEOUT=S: a program still running after S seconds is killed (a
# failure, exit 124/137), so one hang cannot hide the others' reports.
limit=
if [ -n "${CAPEX_TEST_TIMEOUT:-}" ]; then limit="timeout -k 5 $CAPEX_TEST_TIMEOUT"; fi
# Idle OpenMP threads sleep instead of spinning (the same threads and results):
# with programs side by side the cores are oversubscribed, and a spinning
# thread holds a core the other team's threads need, so each tiny parallel
# region can wait a time slice (test_gpt: 446 s wall spinning, ~10x less passive).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# CAPEX_TEST_LAUNCHER="cmd args": runs each program under it (tests/aarch64.mk: QEMU).
launch=${CAPEX_TEST_LAUNCHER:-}
# CAPEX_TEST_FIRST="name ...": programs (by basename) started first, longest
# first, so a long one does not start last and run alone; reports keep the
# order given.
order=()
for f in ${CAPEX_TEST_FIRST:-}; do
    for i in "${!progs[@]}"; do [ "$(basename "${progs[$i]}")" = "$f" ] && order+=("$i"); done
done
for i in "${!progs[@]}"; do case " ${order[*]} " in *" $i "*) ;; *) order+=("$i") ;; esac; done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/capex-tests.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
P=0; F=0; S=0; next=0

report() { # index
    local i=$1 p=${progs[$1]} out rc line p_ f_ s_
    out=$(cat "$tmp/$i.out"); rc=$(cat "$tmp/$i.rc")
    printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed' | sed "s|^|[$(basename "$p")] |"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $(basename "$p"): exited $rc without a summary line"; F=$((F + 1)); return
    fi
    read -r p_ _ f_ _ s_ _ <<<"$(echo "$line" | tr -d ',')"
    P=$((P + p_)); F=$((F + f_)); S=$((S + ${s_:-0}))
    if [ "$rc" -ne 0 ] && [ "$f_" -eq 0 ]; then echo "FAIL $(basename "$p"): exit code $rc"; F=$((F + 1)); fi
    echo "$(basename "$p"): $line"
}
flush() { # report every finished program whose predecessors are reported
    while [ "$next" -lt "${#progs[@]}" ] && [ -e "$tmp/$next.rc" ]; do report "$next"; next=$((next + 1)); done
}

for i in "${order[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || sleep 0.2; flush; done
    ( $limit $launch "${progs[$i]}" >"$tmp/$i.out" 2>&1; echo $? >"$tmp/$i.rc.tmp"; mv "$tmp/$i.rc.tmp" "$tmp/$i.rc" ) &
done
wait
flush
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
