#!/usr/bin/env python3
"""Bandwidth model of capex's multi-tensor GPU kernels from static SASS facts.

Input: the facts JSON that `make sass-gate` writes (build/sass/facts.json):
registers per thread and the bytes one thread keeps in flight in the kernel's
main loop (loads issued before the first use of one; tests/sass_gate.py).
Output: a markdown table of the predicted fraction of copy bandwidth per kernel
and GPU, the column bench/RESULTS.md shows until a GPU run measures it.

Little's law: a GPU moves at most (bytes in flight) / (memory latency). In flight
for a kernel = resident threads x bytes in flight per thread (loads only; stores
do not wait). Resident threads = min(grid, SMs x blocks per SM by registers and
threads) x block. Load bandwidth is then scaled by (read + written) / read bytes
per element and capped by the copy bandwidth. Not modelled: instruction issue
(fp64 throughput, sm_80/90/100 datacenter parts have half-rate fp64), the tail of
a launch, cache hits, the loaded-latency rise near saturation (the model is an
upper bound), launch overhead for small tensors.
"""
import json
import sys

# (name, SMs, spec bandwidth TB/s, source). Latency and copy efficiency: ASSUMED.
GPUS = [
    ("H100 SXM", 90, 132, 3.35, "NVIDIA H100 datasheet (SXM5, HBM3)"),
    ("H200", 90, 132, 4.8, "NVIDIA H200 datasheet (HBM3e)"),
    ("A100 SXM 80GB", 80, 108, 2.039, "NVIDIA A100 datasheet (80GB SXM, HBM2e)"),
]
LATENCY_NS = (700.0, 1000.0)  # ASSUMED: DRAM latency, idle-ish (600-800 ns) and loaded
COPY_EFF = 0.90      # ASSUMED: device-to-device copy reaches 90% of the spec bandwidth
GRID = 0             # blocks per launch: 0 = sized from the device (SMs x blocks per SM,
                     # capex__go_grid); --grid 320 models the fixed grids of old
REGS_PER_SM, THREADS_PER_SM, BLOCKS_PER_SM = 65536, 2048, 32

# kernel -> (block threads, bytes read, bytes written per element), from the lists
# each kernel's comment in capex_cuda.h names; no model copy, momentum on.
ES = {"f32": 4, "f16": 2, "bf16": 2}


def kernels():
    for d, e in ES.items():
        yield "capex_go_sumsq_" + d, 512, e, 0, "sum of squares (L2 norm, clip, LAMB)"
    for i in ES:
        for o in ES:
            yield "capex_go_scale_%s_%s" % (i, o), 512, ES[i], ES[o], "unscale %s -> %s" % (i, o)
    for d, e in ES.items():
        yield "capex_go_adam_" + d, 512, e + 12, 12, "Adam: g %s; p, m, v f32" % d
        yield "capex_go_sgd_" + d, 512, e + 8, 8, "SGD momentum: g %s; p, buf f32" % d
        yield "capex_go_lamb1_" + d, 256, e + 12, 8, "LAMB stage 1: g %s; p, m, v read, m, v written" % d
    yield "capex_go_lamb2", 512, 12, 4, "LAMB stage 2: p, m, v read, p written"


def blocks_per_sm(reg, block):
    per_warp = -(-reg * 32 // 256) * 256  # registers are allocated per warp in 256s
    by_regs = REGS_PER_SM // (per_warp * (block // 32))
    return max(0, min(by_regs, THREADS_PER_SM // block, BLOCKS_PER_SM))


def predict(f, gpu, block, rd, wr, lat_ns):
    _, _, sms, tbs, _ = gpu
    res = sms * blocks_per_sm(f["reg"], block)
    if GRID:
        res = min(GRID, res)
    inflight = res * block * f.get("infl_bits", f["infl"] * f["vec"]) / 8.0  # bytes
    copy = tbs * 1e12 * COPY_EFF
    moved = inflight / (lat_ns * 1e-9) * (rd + wr) / rd  # load bandwidth x bytes moved per byte loaded
    return res, inflight, min(1.0, moved / copy)


def main():
    global GRID
    if len(sys.argv) == 4 and sys.argv[2] == "--grid":
        GRID = int(sys.argv[3])
        del sys.argv[2:]
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_model.py build/sass/facts.json [--grid N]  (facts from `make sass-gate`)")
    facts = json.load(open(sys.argv[1]))
    out = ["| kernel | bytes/elem r+w | regs sm_90 | in flight/thread sm_90 | " +
           " | ".join("%s predicted" % g[0] for g in GPUS) + " | measured (H100) |",
           "|---|---|---|---|" + "---|" * len(GPUS) + "---|"]
    for k, block, rd, wr, what in kernels():
        cells = []
        for g in GPUS:
            f = facts.get("sm_%d %s" % (g[1], k))
            if not f:
                cells.append("n/a")
                continue
            fr = [predict(f, g, block, rd, wr, lat)[2] for lat in LATENCY_NS]
            cells.append(" / ".join("%d%%" % round(100 * x) for x in fr))
        f90 = dict(facts.get("sm_90 " + k, {"reg": 0, "infl": 0, "vec": 0}))
        f90.setdefault("infl_bits", f90["infl"] * f90["vec"])
        out.append("| `%s` %s | %d+%d | %d | %d B (%d loads) | %s | not yet measured |" % (
            k, what, rd, wr, f90["reg"], f90["infl_bits"] // 8, f90["infl"], " | ".join(cells)))
    print("\n".join(out))
    print("\nPredicted: fraction of copy bandwidth at %s ns latency. Assumed: copy = %.0f%% of spec; %s." % (
        " / ".join("%.0f" % x for x in LATENCY_NS), 100 * COPY_EFF,
        "; ".join("%s sm_%d, %d SMs, %.2f TB/s (%s)" % (g[0], g[1], g[2], g[3], g[4]) for g in GPUS)))


if __name__ == "__main__":
    main()
