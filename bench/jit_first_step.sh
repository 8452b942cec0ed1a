#!/bin/sh
# Side by side: the NVRTC CPU time of the first AdamW step on bf16 gradients
# with a dynamic loss scaler (what it compiles before it can launch), at a
# baseline commit (default a576c64: the whole parts amp, unscale_bf16,
# adam_bf16) and in this tree (the variants that step picks), alternated run by
# run (the order flips each run), best of REPS compiles per program inside a
# run. Not bench/compile_time.sh (that one times the host C compiler).
#
#   bench/jit_first_step.sh [RUNS]     env: BASE=commit REPS=3 JIT_MODEL=2 CC_ARCH=90
#   JIT_MODEL: the step's model copy, 2 bf16 (O2, the default), 0 none.
#   JIT_OPT=ams|adagrad|sgd|lamb|novo: Adam with amsgrad, Adagrad, SGD (momentum
#   on), LAMB or NovoGrad instead of AdamW; JIT_OPT=norm: a LayerNorm forward + backward
#   (bf16 x/dy, f32 parameters; RMS=1: RMSNorm); these need
#   BASE_TREE=1 and a BASE that has their parts (e.g. BASE=7e1e0dd): the
#   baseline is then built as a tree (what that commit's first step compiles).
set -e
cd "$(dirname "$0")/.."
BASE=${BASE:-a576c64}
RUNS=${1:-5}
REPS=${REPS:-3}
CC_ARCH=${CC_ARCH:-90}
out=build/bench/jit_first_step
mkdir -p "$out/base"
git show "$BASE:capex.h" > "$out/base/capex.h"
git show "$BASE:capex_cuda.h" > "$out/base/capex_cuda.h"
${CC:-cc} -std=c99 -O1 $([ "${BASE_TREE:-0}" = 1 ] || echo -DJIT_OLD) -I"$out/base" bench/jit_first_step.c -o "$out/base_step" -ldl -lpthread -lm
${CC:-cc} -std=c99 -O1 -I. bench/jit_first_step.c -o "$out/tree_step" -ldl -lpthread -lm
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "baseline $BASE vs this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- capex.h capex_cuda.h || echo '+changes')), sm_$CC_ARCH, ${JIT_OPT:-adam}, model copy $([ "${JIT_MODEL:-2}" = 0 ] && echo none || echo bf16), best of $REPS per program"
"$out/tree_step" --reps 1 --cc "$CC_ARCH" | sed -n 's/^unit /  this tree: /p'
"$out/base_step" --reps 1 --cc "$CC_ARCH" | sed -n 's/^unit /  baseline:  /p'
printf '%-4s %10s %10s %7s\n' run base_ms tree_ms ratio
r=1
while [ "$r" -le "$RUNS" ]; do
    if [ $((r % 2)) -eq 1 ]; then
        b=$("$out/base_step" --reps "$REPS" --cc "$CC_ARCH" | sed -n 's/^total //p')
        t=$("$out/tree_step" --reps "$REPS" --cc "$CC_ARCH" | sed -n 's/^total //p')
    else
        t=$("$out/tree_step" --reps "$REPS" --cc "$CC_ARCH" | sed -n 's/^total //p')
        b=$("$out/base_step" --reps "$REPS" --cc "$CC_ARCH" | sed -n 's/^total //p')
    fi
    printf '%-4s %10s %10s %7s\n' "$r" "$b" "$t" "$(awk -v b="$b" -v t="$t" 'BEGIN { printf "%.3f", t / b }')"
    echo "$b $t" >> "$out/runs.$$"
    r=$((r + 1))
done
awk '{ b[NR] = $1; t[NR] = $2; q[NR] = $2 / $1 } END {
    n = NR; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) { if (q[j] < q[i]) { x = q[i]; q[i] = q[j]; q[j] = x } }
    printf "ratio this tree / baseline: min %.3f, median %.3f, max %.3f over %d runs\n", q[1], q[int((n + 1) / 2)], q[n], n }' "$out/runs.$$"
rm -f "$out/runs.$$"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
