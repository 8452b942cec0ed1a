#!/bin/sh
# Side-by-side -O2 compile time of the implementation (capex.h alone, and
# capex_cuda.h, which includes capex.h's): baseline commits' headers against
# the working tree's, in one run, alternated (each repetition runs every
# variant once, in a rotated order) so machine load hits all alike. Prints per
# variant the min and median CPU time (user + sys, getrusage through
# /usr/bin/time; the load disturbs it less than wall time), the min wall time,
# and the CPU ratio to the first baseline.
#   Usage: bench/compile_time.sh [N] [base-commit ...]     (default: 3 a576c64,
#          where issue 19 measured 4.4 s / 6.0 s)
#   CONFIGS: ';'-separated -D sets for the working tree's headers, e.g.
#     CONFIGS=';-DCAPEX_NO_DIST;-DCAPEX_NO_STATE;-DCAPEX_NO_DIST -DCAPEX_NO_STATE'
#   (default: one set, CUR_DEFS, empty unless given).
set -e
N=${1:-3}; [ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- a576c64
CC=${CC:-cc}
CONFIGS=${CONFIGS-${CUR_DEFS:-}}
cd "$(dirname "$0")/.."
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
printf '#define CAPEX_IMPLEMENTATION\n#include "capex.h"\n' > "$T/c.c"
printf '#define CAPEX_CUDA_IMPLEMENTATION\n#include "capex_cuda.h"\n' > "$T/cu.c"
# Variants, one per line: directory|defines|label
: > "$T/variants"
for b in "$@"; do
    mkdir -p "$T/$b"
    git show "$b:capex.h" > "$T/$b/capex.h"
    git show "$b:capex_cuda.h" > "$T/$b/capex_cuda.h"
    echo "$b||$b" >> "$T/variants"
done
mkdir -p "$T/cur"; cp capex.h capex_cuda.h "$T/cur/"
echo "$CONFIGS" | tr ';' '\n' | while IFS= read -r d; do
    echo "cur|$d|current${d:+ $d}" >> "$T/variants"
done
NV=$(wc -l < "$T/variants")
TIME=; [ -x /usr/bin/time ] && TIME=/usr/bin/time
one() { # dir defs src -> "wall cpu"
    if [ -n "$TIME" ]; then
        $TIME -f '%e %U %S' -o "$T/t" $CC -std=c99 -O2 -fopenmp -c -I"$T/$1" $2 "$T/$3" -o "$T/o.o"
        awk '{printf "%.2f %.2f\n", $1, $2 + $3}' "$T/t"
    else
        s=$(date +%s.%N); $CC -std=c99 -O2 -fopenmp -c -I"$T/$1" $2 "$T/$3" -o "$T/o.o"; e=$(date +%s.%N)
        echo "$s $e" | awk '{printf "%.2f -\n", $2 - $1}'
    fi
}
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)," \
     "$($CC --version | head -1), -std=c99 -O2 -fopenmp -c, $N runs each"
for src in c.c cu.c; do
    : > "$T/res"
    i=0
    while [ $i -lt "$N" ]; do
        k=0
        while [ $k -lt "$NV" ]; do
            v=$(( (k + i) % NV + 1 ))
            line=$(sed -n "${v}p" "$T/variants")
            dir=${line%%|*}; rest=${line#*|}; defs=${rest%%|*}
            echo "$v $(one "$dir" "$defs" $src)" >> "$T/res"
            k=$((k + 1))
        done
        i=$((i + 1))
    done
    name=capex.h; [ $src = cu.c ] && name=capex_cuda.h
    echo "$name -O2 implementation: CPU s min / median, wall s min, CPU min / first baseline's"
    v=1
    while [ $v -le "$NV" ]; do
        label=$(sed -n "${v}p" "$T/variants" | cut -d'|' -f3)
        awk -v v=$v '$1 == v {print $3}' "$T/res" | sort -n > "$T/cpu"
        cmin=$(head -1 "$T/cpu"); cmed=$(awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' "$T/cpu")
        wmin=$(awk -v v=$v '$1 == v {print $2}' "$T/res" | sort -n | head -1)
        [ $v -eq 1 ] && base=$cmin
        ratio=$(echo "$cmin $base" | awk '{ if ($1 == "-" || $2 == "-") print "-"; else printf "%.2f", $1 / $2 }')
        printf '  %-48s %6s / %6s  %6s  %s\n' "$label" "$cmin" "$cmed" "$wmin" "$ratio"
        v=$((v + 1))
    done
done
