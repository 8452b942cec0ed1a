#!/usr/bin/env bash
# Runs every test program given on the command line (or build/tests/test_*),
# shows their output, and ends with one line: "N passed, N failed, N skipped".
# A program that crashes or prints no summary counts as one failure.
set -u
progs=("$@")
[ ${#progs[@]} -gt 0 ] || progs=(build/tests/test_*)
P=0; F=0; S=0
for p in "${progs[@]}"; do
    [ -x "$p" ] || continue
    out=$("$p" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed' | sed "s|^|[$(basename "$p")] |"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $(basename "$p"): exited $rc without a summary line"; F=$((F + 1)); continue
    fi
    read -r p_ _ f_ _ s_ _ <<<"$(echo "$line" | tr -d ',')"
    P=$((P + p_)); F=$((F + f_)); S=$((S + ${s_:-0}))
    if [ "$rc" -ne 0 ] && [ "$f_" -eq 0 ]; then echo "FAIL $(basename "$p"): exit code $rc"; F=$((F + 1)); fi
    echo "$(basename "$p"): $line"
done
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
