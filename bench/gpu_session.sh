#!/usr/bin/env bash
# One call on a lent GPU machine: build, test, run the example and benchmark,
# with every log under $OUT (the device tool brings back at most 8 files, so
# the logs go into one session.log plus the charts and tables).
#
#   bench/gpu_session.sh [STAGE...]     stages, in the order given:
#     build     make -j all tests (also bench_gpu)
#     test      make gpu-test (every GPU test; a failure is logged, not fatal)
#     info      capex_info --parts: versions, arch, cold/warm JIT, first AdamW step, per-part times
#     example   make run on the GPU (O0 vs O2 fp16/bf16), loss chart
#     sanitize  compute-sanitizer memcheck, racecheck, synccheck, initcheck over the GPU tests
#     norms     make bench-gpu-norms: LayerNorm/RMSNorm vs PyTorch
#     gpt       the GPT example (examples/train_gpt.c) trained on the GPU
#     bench     make bench-gpu: kernels vs copy bandwidth vs PyTorch
#     profile   the small-step floor (~33 us for AdamW): nsys over bench_gpu at 100K
#               parameters, per-kernel GPU time and per-call driver time (needs nsys)
#   default: build test info example bench norms
#
# Each stage has its own time limit (STAGE_TIMEOUT, seconds; default 240) so a
# hang cannot eat the whole call. Exit status: the number of failed stages.
set -u
OUT=${OUT:-build/gpu_session}
mkdir -p "$OUT" build
LOG="$OUT/session.log"
STAGE_TIMEOUT=${STAGE_TIMEOUT:-240}
JOBS=$(nproc 2>/dev/null || echo 4)
failed=0

note() { printf '%s\n' "$*" | tee -a "$LOG"; }
stage() { # name, command...
    local name=$1 t0 rc
    shift
    note "===== $name: $* ($(date -u +%H:%M:%S))"
    t0=$(date +%s)
    timeout "$STAGE_TIMEOUT" bash -c "$*" >>"$LOG" 2>&1
    rc=$?
    note "===== $name: exit $rc after $(($(date +%s) - t0)) s"
    if [ "$rc" -ne 0 ]; then failed=$((failed + 1)); fi
}

note "capex GPU session $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv >>"$LOG" 2>&1 || note "nvidia-smi: not available"
export CAPEX_CACHE_DIR=${CAPEX_CACHE_DIR:-$PWD/build/kernel-cache}
# NCCL often comes as PyTorch's pip package, off the loader path.
if [ -z "${CAPEX_NCCL_PATH:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
    p=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    if [ -n "$p" ] && [ -f "$p" ]; then export CAPEX_NCCL_PATH=$p; note "NCCL: $p"; fi
fi
GPU_BINS="build/examples/train_gpt build/tests/test_cuda_gpu build/tests/test_gpuopt_gpu build/tests/test_norm_gpu build/tests/test_nccl_gpu build/tests/test_zero_gpu build/tests/test_gpt_gpu"

[ $# -eq 0 ] && set -- build test info example bench norms
for s in "$@"; do
    case $s in
    build) stage build "make -j$JOBS $GPU_BINS build/examples/capex_info build/examples/train_charlm build/bench/bench_gpu" ;;
    test) stage test "CT_VERBOSE=1 CAPEX_TEST_TIMEOUT=$((STAGE_TIMEOUT - 20)) make gpu-test" ;;
    info)
        rm -rf "$CAPEX_CACHE_DIR"
        stage info "build/examples/capex_info --parts --phases" ;;  # + each part alone: the largest bounds a parallel cold compile
    example)
        stage example "make run && cp build/loss_curve.svg '$OUT/loss_curve.svg'" ;;
    sanitize)
        # side by side, each under the stage's limit; the > 2^31-element test is left out (hours under memcheck);
        # API errors are not reported: the error-path tests provoke them, and NCCL probes for its kernels
        export PATH=$PATH:/usr/local/cuda/bin
        if command -v compute-sanitizer >/dev/null 2>&1; then
            san=build/sanitize && rm -rf $san && mkdir -p $san
            for spec in memcheck:test_cuda_gpu memcheck:test_gpuopt_gpu:-over_2g memcheck:test_norm_gpu memcheck:test_gpt_gpu \
                        memcheck:test_zero_gpu racecheck:test_gpuopt_gpu:-over_2g racecheck:test_norm_gpu racecheck:test_gpt_gpu \
                        synccheck:test_norm_gpu initcheck:test_norm_gpu initcheck:test_gpt_gpu initcheck:test_gpuopt_gpu:-over_2g; do
                IFS=: read -r tool t filt <<<"$spec"
                ( timeout "$STAGE_TIMEOUT" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 build/tests/$t $filt \
                    >"$san/$tool-$t.log" 2>&1; echo $? >"$san/$tool-$t.rc" ) &
            done
            wait
            for f in $san/*.log; do
                b=${f%.log}; rc=$(cat "$b.rc")
                note "===== sanitize $(basename "$b"): exit $rc"
                grep -E 'ERROR SUMMARY|passed, [0-9]+ failed|FAIL|=========' "$f" | head -n 40 >>"$LOG"
                if [ "$rc" -ne 0 ]; then failed=$((failed + 1)); fi
            done
        else
            note "compute-sanitizer not found (it ships with the CUDA toolkit, not the driver)"
        fi ;;
    norms)
        stage norms "make bench-gpu-norms" ;;
    gpt)
        stage gpt "build/examples/train_gpt --device gpu" ;;
    bench)
        stage bench "make bench-gpu && cp build/bench/gpu_table.md build/bench/gpu_chart.svg build/bench/gpu_capex.csv build/bench/gpu_torch.csv '$OUT/'" ;;
    profile)
        # where a small step's time goes: kernel durations (prepare vs update) and launch costs
        stage profile "NSYS=\$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1); \
            [ -n \"\$NSYS\" ] || { echo 'profile: no nsys on this machine'; exit 1; }; \
            \$NSYS profile -t cuda --stats=true -f true -o build/profile_small build/bench/bench_gpu --sizes 100000 --iters 200 | \
            grep -E 'capex_|cuLaunchKernel|cuEvent|cuStream|cuMemcpy|Time \\(%\\)'" ;;
    *) note "unknown stage $s"; failed=$((failed + 1)) ;;
    esac
done
note "stages failed: $failed"
# The reply shows the end of stdout: each program's summary and every failure.
grep -E '^=====|passed, [0-9]+ failed|FAIL|not ok|error|\| ' "$LOG" | tail -n 150
exit "$failed"
