#!/usr/bin/env bash
# The GPT example's GPU path (examples/train_gpt.c --device gpu) on the CPU
# emulator driver (no GPU): the model kernels (through capex's JIT), capex's
# GPU norms, capex_cuda_optim, the device scaler and checkpoints run for real.
# Checks, on a tiny config (2 layers, 2 heads, 32 channels, seq 16, batch 4):
#  - fp32 (O0 and O0 with RMSNorm): every one of 20 steps' training losses and
#    the validation loss within 1e-4 of the CPU run's. Both are fp32 and the
#    kernels mirror the CPU loops (same summation order, --fmad=false), so
#    what differs is only the norms' row reductions (capex's GPU norms reduce
#    in another order) and the gradient norm's (the clip factor): fp32
#    rounding, ~1e-7 relative per op. 1e-4 is ~200 fp32 ulps of a loss near 5,
#    room for 20 optimizer steps to carry such differences forward, and far
#    below what a wrong kernel gives (a wrong index or a missing term moves the
#    loss by 1e-2 or more within a step or two). On the emulator (host libm)
#    they match to the last bit here.
#  - O2 fp16: within 2e-3: a norm output one fp32 ulp away from the CPU's can
#    round to the neighbouring fp16 value (2^-11 relative in that element).
#  - each step's gradient norm (--norms: before clipping) within the same
#    tolerance of the CPU's (measured 2.4e-7 at O0, 4.9e-5 at O2 fp16);
#  - the sampled text equals the CPU run's (fp32 inference, same draws);
#  - a resumed GPU run is bit-identical to the uninterrupted one (and reports
#    its train loss), and the GPU checkpoint resumes on the CPU;
#  - without a driver, --device auto trains on the CPU and says so, and
#    --device gpu exits 1 naming what it tried;
#  - data parallel over NCCL (the stand-in tests/fake_libnccl.c: ranks are
#    processes meeting in a shared file; one emulated GPU each):
#    - one rank through DDP (--nccl, 16 KB buckets: several, reduced while
#      backward runs) is bit-identical to the plain GPU run (O2 fp16: the
#      grads go to fp16 buckets, the norm and clip read them there);
#    - 2 ranks of batch 2 against 1 rank of batch 4 (O0): each step's batch
#      is the same 4 windows (the sampler deals rank r windows r, r+2 of the
#      4), the loss is the mean over the ranks and the gradient their average
#      (x 1/2, exact): equal in exact arithmetic. What differs is fp32
#      summation order (each rank sums its 2*16 rows, then the two halves are
#      added): ~1e-7 relative per reduction, carried through 20 AdamW steps.
#      Tolerance 1e-5 on each step's loss (the mean over the ranks), its
#      gradient norm (--norms) and the val loss (measured: 4.8e-7, 2.4e-7, and
#      val losses equal as printed).
#      The norm is what shows a missing average: the clip at 1.0 (every
#      step here) and AdamW are blind to the grads' scale, so the summed
#      grads leave the losses within 5e-7 but the norms 2.75 away;
#    - the replicas end bit-identical (main's crc32 allgather), and a 2-rank
#      run resumed from rank 0's checkpoint ends bit-identical to the
#      uninterrupted one.
#   tests/gpt_emu.sh TRAIN_GPT_BINARY EMULATOR_LIBCUDA CACHE_DIR STANDIN_LIBNCCL
set -u
exe=$1 emu=$2 cache=$3 nccl=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/capex-gptemu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
common=(--steps 20 --batch 4 --seq 16 --layers 2 --heads 2 --channels 32 --eval-every 0 --eval-windows 64
        --log-every 0 --sample 0 --quiet)
fail=0
gpu() { CAPEX_LIBCUDA_PATH=$emu CAPEX_CACHE_DIR=$cache CAPEX_NCCL_PATH=$nccl "$exe" --device gpu "$@"; }
field() { # file, word after which the value stands on the "final:" line
    awk -v k="$2" '/^final:/ { for (i = 1; i < NF; i++) if ($i == k) { print $(i + ($i == "val" || $i == "train" ? 2 : 1)); exit } }' "$1"
}
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }
# per-step losses: "step loss" lines; prints the largest difference, fails beyond the tolerance or on a missing step
steps_close() {
    awk -v t="$3" 'NR == FNR { c[$1] = $2; n++; next } { if (!($1 in c)) exit 1; d = c[$1] - $2; if (d < 0) d = -d; if (d > m) m = d; k++ }
                   END { printf "%.3g", m + 0; exit !(k == n && n > 0 && m <= t) }' "$1" "$2"
}

for run in "O0:--opt O0:1e-4" "O0 RMSNorm:--opt O0 --norm rms:1e-4" "O2 fp16:--opt O2 --half fp16:2e-3" "O3 bf16:--opt O3 --half bf16:2e-2"; do
    name=${run%%:*} rest=${run#*:} args=${rest%%:*} tol=${rest##*:}
    # shellcheck disable=SC2086
    "$exe" --device cpu $args "${common[@]}" --losses "$tmp/cpu.loss" --norms "$tmp/cpu.norm" >"$tmp/cpu.txt" 2>&1 || { cat "$tmp/cpu.txt"; fail=1; continue; }
    # shellcheck disable=SC2086
    gpu $args "${common[@]}" --losses "$tmp/gpu.loss" --norms "$tmp/gpu.norm" >"$tmp/gpu.txt" 2>&1 || { echo "gpt-emu: GPU run failed:"; cat "$tmp/gpu.txt"; fail=1; continue; }
    grep -q "on GPU capex CPU emulator" "$tmp/gpu.txt" || { echo "gpt-emu: did not run on the emulated GPU"; cat "$tmp/gpu.txt"; fail=1; }
    for f in loss norm txt; do cp "$tmp/gpu.$f" "$tmp/gpu_${args//[^A-Za-z0-9]/_}.$f"; done
    if m=$(steps_close "$tmp/cpu.loss" "$tmp/gpu.loss" "$tol"); then echo "gpt-emu: $name: 20 step losses within $tol of the CPU's (largest difference $m)"
    else echo "gpt-emu: $name: step losses differ from the CPU's by up to $m (tolerance $tol)"; paste "$tmp/cpu.loss" "$tmp/gpu.loss"; fail=1; fi
    if m=$(steps_close "$tmp/cpu.norm" "$tmp/gpu.norm" "$tol"); then echo "gpt-emu: $name: 20 gradient norms within $tol of the CPU's (largest difference $m)"
    else echo "gpt-emu: $name: gradient norms differ from the CPU's by up to $m (tolerance $tol)"; paste "$tmp/cpu.norm" "$tmp/gpu.norm"; fail=1; fi
    c=$(field "$tmp/cpu.txt" val) g=$(field "$tmp/gpu.txt" val)
    if close "$c" "$g" "$tol"; then echo "gpt-emu: $name: val loss GPU $g, CPU $c: ok"
    else echo "gpt-emu: $name: val loss GPU '$g' vs CPU '$c' (tolerance $tol)"; fail=1; fi
done

# sampling on the GPU draws the CPU's bytes
sample=(--opt O0 --steps 20 --batch 4 --seq 16 --layers 2 --heads 2 --channels 32 --eval-every 0 --eval-windows 64
        --log-every 0 --sample 64 --prompt "This License" --quiet)
"$exe" --device cpu "${sample[@]}" 2>&1 | sed -n '/^---- sample/,/^----$/p' >"$tmp/cpu.smp"
gpu "${sample[@]}" 2>&1 | sed -n '/^---- sample/,/^----$/p' >"$tmp/gpu.smp"
if [ -s "$tmp/cpu.smp" ] && cmp -s "$tmp/cpu.smp" "$tmp/gpu.smp"; then echo "gpt-emu: GPU sample equals the CPU's ($(wc -c <"$tmp/gpu.smp") bytes)"
else echo "gpt-emu: GPU sample differs from the CPU's:"; cat "$tmp/cpu.smp" "$tmp/gpu.smp"; fail=1; fi

# resume on the GPU is bit-identical; the GPU checkpoint resumes on the CPU
gpu --opt O2 "${common[@]}" --save "$tmp/ck.capex" --save-at 10 >"$tmp/full.txt" 2>&1 || { cat "$tmp/full.txt"; fail=1; }
gpu --opt O2 "${common[@]}" --resume "$tmp/ck.capex" >"$tmp/res.txt" 2>&1 || { cat "$tmp/res.txt"; fail=1; }
a=$(field "$tmp/full.txt" crc32) b=$(field "$tmp/res.txt" crc32)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "gpt-emu: resumed GPU run bit-identical (weights crc32 $a)"
else echo "gpt-emu: resumed weights crc32 '$b', uninterrupted '$a'"; fail=1; fi
# the checkpoint keeps the training loss average (it restarted from 0)
a=$(field "$tmp/full.txt" train) b=$(field "$tmp/res.txt" train)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "gpt-emu: resumed GPU run reports the same train loss ($a)"
else echo "gpt-emu: resumed train loss '$b', uninterrupted '$a'"; fail=1; fi
"$exe" --device cpu --opt O2 "${common[@]}" --resume "$tmp/ck.capex" >"$tmp/cpu_res.txt" 2>&1 || { cat "$tmp/cpu_res.txt"; fail=1; }
c=$(field "$tmp/cpu_res.txt" val) g=$(field "$tmp/full.txt" val)
if close "$c" "$g" 2e-3; then echo "gpt-emu: GPU checkpoint resumed on the CPU: val loss $c (GPU $g): ok"
else echo "gpt-emu: GPU checkpoint resumed on the CPU: val loss '$c' vs GPU '$g'"; fail=1; fi

# --save-at past --steps: refused (exit status 2), not a checkpoint silently never written
"$exe" --device cpu "${common[@]}" --save "$tmp/never.capex" --save-at 30 >"$tmp/never.txt" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ ! -e "$tmp/never.capex" ]; then echo "gpt-emu: --save-at past --steps refused"
else echo "gpt-emu: --save-at 30 of 20 steps: exit status $rc"; cat "$tmp/never.txt"; fail=1; fi

# no driver: auto falls back to the CPU and says so; gpu fails cleanly
CAPEX_LIBCUDA_PATH=/nonexistent/libcuda.so.1 "$exe" --device auto --opt O0 "${common[@]}" --steps 2 >"$tmp/auto.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "no usable GPU, training on the CPU" "$tmp/auto.txt" && grep -q "on the CPU$" "$tmp/auto.txt"; then
    echo "gpt-emu: no driver, --device auto: trained on the CPU, said why"
else echo "gpt-emu: no driver, --device auto: exit $rc"; cat "$tmp/auto.txt"; fail=1; fi
CAPEX_LIBCUDA_PATH=/nonexistent/libcuda.so.1 "$exe" --device gpu --opt O0 "${common[@]}" --steps 2 >"$tmp/gpu_nodrv.txt" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "/nonexistent/libcuda.so.1" "$tmp/gpu_nodrv.txt"; then echo "gpt-emu: no driver, --device gpu: exit 1 naming the driver tried"
else echo "gpt-emu: no driver, --device gpu: exit $rc"; cat "$tmp/gpu_nodrv.txt"; fail=1; fi
# one rank through DDP over NCCL equals the plain GPU run
gpu --nccl --opt O2 --half fp16 "${common[@]}" --bucket-kb 16 --losses "$tmp/n1.loss" >"$tmp/n1.txt" 2>&1 || { cat "$tmp/n1.txt"; fail=1; }
a=$(field "$tmp/gpu___opt_O2___half_fp16.txt" crc32) b=$(field "$tmp/n1.txt" crc32)
l=$(awk '/^ddp:/ { print $2, $7 }' "$tmp/n1.txt")
if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$tmp/gpu___opt_O2___half_fp16.loss" "$tmp/n1.loss" && [ "${l% *}" -gt 1 ] && [ "${l% *}" = "${l#* }" ]; then
    echo "gpt-emu: 1 rank over NCCL (O2 fp16, ${l% *} bucket all-reduces, all started in backward) bit-identical to the plain GPU run (crc32 $a)"
else echo "gpt-emu: 1 rank over NCCL: crc32 '$b' vs plain '$a', bucket all-reduces '$l'"; cat "$tmp/n1.txt"; fail=1; fi

# lazy streams (CAPEX_EMU_STREAMS=lazy: stream work runs only when something
# waits for it): the same bits as the plain and the DDP run, so no kernel read
# another stream's data before it was written
CAPEX_EMU_STREAMS=lazy gpu --opt O2 --half fp16 "${common[@]}" --losses "$tmp/lz.loss" >"$tmp/lz.txt" 2>&1 || { cat "$tmp/lz.txt"; fail=1; }
CAPEX_EMU_STREAMS=lazy gpu --nccl --opt O2 --half fp16 "${common[@]}" --bucket-kb 16 --losses "$tmp/lzn.loss" >"$tmp/lzn.txt" 2>&1 || { cat "$tmp/lzn.txt"; fail=1; }
b=$(field "$tmp/lz.txt" crc32) c=$(field "$tmp/lzn.txt" crc32)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && cmp -s "$tmp/gpu___opt_O2___half_fp16.loss" "$tmp/lz.loss" &&
   cmp -s "$tmp/lz.loss" "$tmp/lzn.loss"; then
    echo "gpt-emu: lazy streams: plain and 1-rank DDP runs bit-identical to the eager ones (crc32 $a)"
else echo "gpt-emu: lazy streams: crc32 plain '$b', DDP '$c', eager '$a'"; paste "$tmp/gpu___opt_O2___half_fp16.loss" "$tmp/lz.loss" "$tmp/lzn.loss"; fail=1; fi

# 2 ranks (processes; the id over the TCP rendezvous at a free port pair)
port=0
for try in 1 2 3 4 5 6 7 8; do
    p=$((20000 + (RANDOM * 7 + $$ + try * 101) % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then port=$p; break; fi
done
two() { # output prefix, args...: both ranks; rank 0's output in $1.0, rank 1's in $1.1
    local out=$1 r pids=() rc=0
    shift
    for r in 0 1; do
        CAPEX_LIBCUDA_PATH=$emu CAPEX_CACHE_DIR=$cache CAPEX_NCCL_PATH=$nccl FAKE_NCCL_TIMEOUT=30 WORLD_SIZE=2 RANK=$r \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$exe" --device gpu "$@" >"$out.$r" 2>&1 &
        pids+=($!)
    done
    for r in 0 1; do wait "${pids[$r]}" || rc=1; done
    port=$((port + 2))
    return $rc
}
two "$tmp/d2" --opt O0 "${common[@]}" --batch 2 --bucket-kb 16 --losses "$tmp/d2.loss" --norms "$tmp/d2.norm" --save "$tmp/d2.ck" --save-at 10 ||
    { echo "gpt-emu: 2 GPU ranks failed:"; cat "$tmp/d2.0" "$tmp/d2.1"; fail=1; }
if grep -q "replicas: 2 ranks, weights bit-identical" "$tmp/d2.0"; then echo "gpt-emu: 2 GPU ranks over NCCL: replicas bit-identical (crc32 $(field "$tmp/d2.0" crc32))"
else echo "gpt-emu: 2 GPU ranks: replicas not identical"; cat "$tmp/d2.0" "$tmp/d2.1"; fail=1; fi
if m=$(steps_close "$tmp/gpu___opt_O0.loss" "$tmp/d2.loss" 1e-5); then echo "gpt-emu: 2 ranks x batch 2 vs 1 rank x batch 4 (O0): 20 step losses within 1e-5 (largest difference $m)"
else echo "gpt-emu: 2 ranks x batch 2 vs 1 rank x batch 4: step losses differ by up to $m (tolerance 1e-5)"; paste "$tmp/gpu___opt_O0.loss" "$tmp/d2.loss"; fail=1; fi
if m=$(steps_close "$tmp/gpu___opt_O0.norm" "$tmp/d2.norm" 1e-5); then echo "gpt-emu: 2 ranks x batch 2 vs 1 rank x batch 4 (O0): 20 gradient norms (of the averaged grads) within 1e-5 (largest difference $m)"
else echo "gpt-emu: 2 ranks x batch 2 vs 1 rank x batch 4: gradient norms differ by up to $m (tolerance 1e-5)"; paste "$tmp/gpu___opt_O0.norm" "$tmp/d2.norm"; fail=1; fi
c=$(field "$tmp/gpu___opt_O0.txt" val) g=$(field "$tmp/d2.0" val)
if close "$c" "$g" 1e-5; then echo "gpt-emu: 2 ranks: val loss $g, 1 rank $c: ok"
else echo "gpt-emu: 2 ranks: val loss '$g' vs 1 rank '$c' (tolerance 1e-5)"; fail=1; fi
two "$tmp/r2" --opt O0 "${common[@]}" --batch 2 --bucket-kb 16 --resume "$tmp/d2.ck" ||
    { echo "gpt-emu: 2 GPU ranks resuming failed:"; cat "$tmp/r2.0" "$tmp/r2.1"; fail=1; }
a=$(field "$tmp/d2.0" crc32) b=$(field "$tmp/r2.0" crc32)
if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "weights bit-identical" "$tmp/r2.0"; then echo "gpt-emu: 2 ranks resumed from rank 0's checkpoint: bit-identical (crc32 $a)"
else echo "gpt-emu: 2 ranks resumed: crc32 '$b', uninterrupted '$a'"; cat "$tmp/r2.0"; fail=1; fi
exit $fail
