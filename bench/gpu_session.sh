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
#     sanitize  compute-sanitizer memcheck and racecheck over the GPU tests
#     bench     make bench-gpu: kernels vs copy bandwidth vs PyTorch
#   default: build test info example bench
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

[ $# -eq 0 ] && set -- build test info example bench
for s in "$@"; do
    case $s in
    build) stage build "make -j$JOBS all tests build/bench/bench_gpu" ;;
    test) stage test "make gpu-test" ;;
    info)
        rm -rf "$CAPEX_CACHE_DIR"
        stage info "build/examples/capex_info --parts" ;;  # + each part alone: the largest bounds a parallel cold compile
    example)
        stage example "make run && cp build/loss_curve.svg '$OUT/loss_curve.svg'" ;;
    sanitize)
        if command -v compute-sanitizer >/dev/null 2>&1; then
            for tool in memcheck racecheck; do
                for t in test_cuda_gpu test_gpuopt_gpu test_norm_gpu; do
                    stage "sanitize-$tool-$t" "compute-sanitizer --tool $tool --error-exitcode 9 build/tests/$t"
                done
            done
        else
            note "compute-sanitizer not found (it ships with the CUDA toolkit, not the driver)"
        fi ;;
    bench)
        stage bench "make bench-gpu && cp build/bench/gpu_table.md build/bench/gpu_chart.svg build/bench/gpu_capex.csv build/bench/gpu_torch.csv '$OUT/'" ;;
    *) note "unknown stage $s"; failed=$((failed + 1)) ;;
    esac
done
note "stages failed: $failed"
exit "$failed"
