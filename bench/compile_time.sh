#!/bin/sh
# Side-by-side -O2 compile time of the implementation: a baseline commit's
# headers (default a576c64, where issue 19 measured 4.4 s / 6.0 s) against the
# working tree's, alternated in one run so machine load hits both alike; prints
# the min of N runs each. Usage: bench/compile_time.sh [N] [base-commit]
# Extra -D flags for the current headers (e.g. -DCAPEX_NO_SOCKETS) via CUR_DEFS.
set -e
N=${1:-3}; BASE=${2:-a576c64}; CC=${CC:-cc}
cd "$(dirname "$0")/.."
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/base" "$T/cur"
git show "$BASE:capex.h" > "$T/base/capex.h"
git show "$BASE:capex_cuda.h" > "$T/base/capex_cuda.h"
cp capex.h capex_cuda.h "$T/cur/"
printf '#define CAPEX_IMPLEMENTATION\n#include "capex.h"\n' > "$T/c.c"
printf '#define CAPEX_CUDA_IMPLEMENTATION\n#include "capex_cuda.h"\n' > "$T/cu.c"
one() { # dir src defs -> seconds
    s=$(date +%s.%N)
    $CC -std=c99 -O2 -fopenmp -c -I"$T/$1" $3 "$T/$2" -o "$T/o.o"
    e=$(date +%s.%N); echo "$s $e" | awk '{printf "%.3f\n", $2-$1}'
}
for src in c.c cu.c; do
    bmin=999; cmin=999; i=0
    while [ $i -lt "$N" ]; do
        b=$(one base $src ""); c=$(one cur $src "$CUR_DEFS")
        bmin=$(echo "$b $bmin" | awk '{print ($1<$2)?$1:$2}')
        cmin=$(echo "$c $cmin" | awk '{print ($1<$2)?$1:$2}')
        i=$((i+1))
    done
    name=capex.h; [ $src = cu.c ] && name=capex_cuda.h
    echo "$name -O2: $BASE ${bmin}s  current${CUR_DEFS:+ ($CUR_DEFS)} ${cmin}s  ratio $(echo "$cmin $bmin" | awk '{printf "%.2f", $1/$2}')"
done
