#!/bin/sh
# All built-in parts' NVRTC CPU time (issue 18 item 6: "all parts under 2 s"):
# what capex_cuda_precompile compiles, summed over the parts as if one thread did it;
# a baseline commit's headers against this tree's, alternated run by run (the
# order flips each run), best of REPS compiles per part inside a run; the table
# takes each part's least over the runs (a part only one side has: blank).
#   bench/parts_cpu.sh [RUNS]     env: BASE=main REPS=3 CC_ARCH=90
set -e
cd "$(dirname "$0")/.."
BASE=${BASE:-main}
RUNS=${1:-3}
REPS=${REPS:-3}
CC_ARCH=${CC_ARCH:-90}
out=build/bench/parts_cpu
mkdir -p "$out/base"
rm -f "$out"/base.[0-9]* "$out"/tree.[0-9]*
git show "$BASE:capex.h" > "$out/base/capex.h"
git show "$BASE:capex_cuda.h" > "$out/base/capex_cuda.h"
${CC:-cc} -std=c99 -O1 -I"$out/base" bench/parts_cpu.c -o "$out/base_parts" -ldl -lpthread -lm
${CC:-cc} -std=c99 -O1 -I. bench/parts_cpu.c -o "$out/tree_parts" -ldl -lpthread -lm
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); sm_$CC_ARCH, best of $REPS per part"
echo "baseline $BASE vs this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- capex.h capex_cuda.h || echo '+changes'))"
r=1
while [ "$r" -le "$RUNS" ]; do
    for w in $([ $((r % 2)) -eq 1 ] && echo "base tree" || echo "tree base"); do
        l0=$(cut -d' ' -f1 /proc/loadavg)
        "$out/${w}_parts" --reps "$REPS" --cc "$CC_ARCH" > "$out/$w.$r"
        echo "run $r $w: $(sed -n 's/^total //p' "$out/$w.$r") ms (load $l0 -> $(cut -d' ' -f1 /proc/loadavg))"
    done
    r=$((r + 1))
done
# per part: the least over runs
for w in base tree; do cat "$out/$w".* | awk -v w=$w '/^part/ { if (!($2 in b) || $3 < b[$2]) b[$2] = $3; if (!($2 in o)) o[$2] = n++ }
  END { for (k in b) { s += b[k]; printf "%d %s %s %.1f\n", o[k], w, k, b[k] } printf "999 %s TOTAL %.1f\n", w, s }'; done |
  sort -n | awk '{ v[$3, $2] = $4; if (!($3 in seen)) { seen[$3] = 1; ord[n++] = $3 } }
  END { printf "%-13s %9s %9s\n", "part", "base_ms", "tree_ms"; for (i = 0; i < n; i++) printf "%-13s %9s %9s\n", ord[i], v[ord[i], "base"], v[ord[i], "tree"] }'
