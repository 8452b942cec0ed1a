#!/usr/bin/env bash
# The training example's GPU path on the CPU emulator driver (no GPU): the
# model kernels (through capex's JIT), capex_cuda_optim, the device scaler and
# checkpoints run for real. Checks: the GPU run tracks the CPU run (same
# config, O2 fp16 and O0; the train loss too), resume from a GPU checkpoint
# is bit-identical (and reports the same train loss), and a GPU checkpoint
# resumes on the CPU.
#   tests/example_emu.sh EXAMPLE_BINARY EMULATOR_LIBCUDA CACHE_DIR
set -u
exe=$1 emu=$2 cache=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/capex-exemu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
common=(--steps 40 --batch 16 --hidden 48 --eval-every 0 --eval-windows 256 --log-every 0 --quiet)
fail=0
gpu() { CAPEX_LIBCUDA_PATH=$emu CAPEX_CACHE_DIR=$cache "$exe" --device gpu "$@"; }
field() { # file, word after which the value stands on the "final:" line
    awk -v k="$2" '/^final:/ { for (i = 1; i < NF; i++) if ($i == k) { print $(i + ($i == "val" || $i == "train" ? 2 : 1)); exit } }' "$1"
}
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }

for lvl in "O2 --half fp16" "O0" "O3 --half bf16"; do
    # shellcheck disable=SC2086
    "$exe" --device cpu --opt $lvl "${common[@]}" >"$tmp/cpu.txt" 2>&1 || { cat "$tmp/cpu.txt"; fail=1; continue; }
    # shellcheck disable=SC2086
    gpu --opt $lvl "${common[@]}" >"$tmp/gpu.txt" 2>&1 || { echo "example-emu: GPU run failed:"; cat "$tmp/gpu.txt"; fail=1; continue; }
    grep -q "on GPU capex CPU emulator" "$tmp/gpu.txt" || { echo "example-emu: did not run on the emulated GPU"; cat "$tmp/gpu.txt"; fail=1; }
    c=$(field "$tmp/cpu.txt" val) g=$(field "$tmp/gpu.txt" val)
    same="weights differ in the last bits (norm summation order)"
    [ "$(field "$tmp/cpu.txt" crc32)" = "$(field "$tmp/gpu.txt" crc32)" ] && same="weights bit-identical"
    if close "$c" "$g" 0.002; then echo "example-emu: --opt $lvl: val loss GPU $g, CPU $c ($same): ok"
    else echo "example-emu: --opt $lvl: val loss GPU '$g' vs CPU '$c' (tolerance 0.002)"; fail=1; fi
    # the training loss average, also without log or evaluation points (it stayed 0 on the GPU)
    c=$(field "$tmp/cpu.txt" train) g=$(field "$tmp/gpu.txt" train)
    if close "$c" "$g" 0.002; then echo "example-emu: --opt $lvl: train loss GPU $g, CPU $c: ok"
    else echo "example-emu: --opt $lvl: train loss GPU '$g' vs CPU '$c' (tolerance 0.002)"; fail=1; fi
done

# resume on the GPU is bit-identical; the GPU checkpoint resumes on the CPU
gpu --opt O2 "${common[@]}" --save "$tmp/ck.capex" --save-at 20 >"$tmp/full.txt" 2>&1 || { cat "$tmp/full.txt"; fail=1; }
gpu --opt O2 "${common[@]}" --resume "$tmp/ck.capex" >"$tmp/res.txt" 2>&1 || { cat "$tmp/res.txt"; fail=1; }
a=$(field "$tmp/full.txt" crc32) b=$(field "$tmp/res.txt" crc32)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "example-emu: resumed GPU run bit-identical (weights crc32 $a)"
else echo "example-emu: resumed weights crc32 '$b', uninterrupted '$a'"; fail=1; fi
a=$(field "$tmp/full.txt" train) b=$(field "$tmp/res.txt" train)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "example-emu: resumed GPU run reports the same train loss ($a)"
else echo "example-emu: resumed train loss '$b', uninterrupted '$a'"; fail=1; fi
# lazy streams (CAPEX_EMU_STREAMS=lazy: stream work runs only when something waits for it): the same bits,
# the same checkpoint bytes, and a lazy resume from the eager checkpoint
CAPEX_EMU_STREAMS=lazy gpu --opt O2 "${common[@]}" --save "$tmp/ck_lazy.capex" --save-at 20 >"$tmp/lazy.txt" 2>&1 || { cat "$tmp/lazy.txt"; fail=1; }
CAPEX_EMU_STREAMS=lazy gpu --opt O2 "${common[@]}" --resume "$tmp/ck.capex" >"$tmp/lazy_res.txt" 2>&1 || { cat "$tmp/lazy_res.txt"; fail=1; }
a=$(field "$tmp/full.txt" crc32) b=$(field "$tmp/lazy.txt" crc32) c=$(field "$tmp/lazy_res.txt" crc32)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && cmp -s "$tmp/ck.capex" "$tmp/ck_lazy.capex"; then
    echo "example-emu: lazy streams: run and resume bit-identical to the eager run (weights crc32 $a), checkpoint byte-identical"
else echo "example-emu: lazy streams: weights crc32 '$b', resumed '$c', eager '$a'; checkpoints: $(cmp "$tmp/ck.capex" "$tmp/ck_lazy.capex" 2>&1 || true)"; fail=1; fi
"$exe" --device cpu --opt O2 "${common[@]}" --resume "$tmp/ck.capex" >"$tmp/cpu_res.txt" 2>&1 || { cat "$tmp/cpu_res.txt"; fail=1; }
c=$(field "$tmp/cpu_res.txt" val) g=$(field "$tmp/full.txt" val)
if close "$c" "$g" 0.002; then echo "example-emu: GPU checkpoint resumed on the CPU: val loss $c (GPU $g): ok"
else echo "example-emu: GPU checkpoint resumed on the CPU: val loss '$c' vs GPU '$g'"; fail=1; fi
# --zero is the CPU path: with a (emulated) GPU present, auto trains on the CPU and says so
CAPEX_LIBCUDA_PATH=$emu CAPEX_CACHE_DIR=$cache "$exe" --zero 1 --opt O2 "${common[@]}" >"$tmp/zero.txt" 2>&1 || { cat "$tmp/zero.txt"; fail=1; }
if grep -q "on the CPU$" "$tmp/zero.txt" && [ -n "$(field "$tmp/zero.txt" crc32)" ]; then echo "example-emu: --zero 1 with a GPU present: trained on the CPU, said so"
else echo "example-emu: --zero 1 with a GPU present:"; cat "$tmp/zero.txt"; fail=1; fi
exit $fail
