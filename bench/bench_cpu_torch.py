#!/usr/bin/env python3
"""capex vs PyTorch on the CPU, one table in one run (issue 17's table).

    make bench-table-torch
    python3 bench/bench_cpu_torch.py --capex build/bench/bench_table [--elements 48000000] [--reps 5] [--threads 1]
                                     [--huge-pages]

--huge-pages puts both sides' buffers on 2 MB pages where the kernel's THP mode
is madvise (capex: CAPEX_BENCH_HUGE_PAGES=1; torch: THP_MEM_ALLOC_ENABLE=1):
memory-bound rows otherwise compare page sizes as much as loops.

Runs build/bench/bench_table (the capex side: 48M parameters in 12 tensors,
LayerNorm 4096x1024) and the torch peers below on the same sizes and thread
count, and prints a markdown table of best wall and best process-CPU time
per op (CPU time is what a shared machine disturbs least) and torch/capex.

torch peers (what a torch CPU user runs for the same work):
  adamw_*   master fp32 params; the half grads widened into the fp32 .grad
            (foreach copy), torch.optim.AdamW(foreach=True).step(), the model
            copy written back (torch._foreach_copy_ into half tensors)
  sgd_*     the same with SGD(momentum=0.9, foreach=True)
  lamb_*    no LAMB in torch: not compared
  l2norm_*  torch._foreach_norm over the 12 tensors, then the total norm
  unscale_f16  half grads widened into fp32 grads, then
            torch._amp_foreach_non_finite_check_and_unscale_
  ln_fwd_f32 / ln_bwd_f32  torch.ops.aten.native_layer_norm(_backward)
"""
import argparse
import os
import subprocess
import sys
import time


def best_of(fn, reps):
    fn()  # warm-up
    bw = bc = float("inf")
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        bw = min(bw, time.perf_counter() - w0)
        bc = min(bc, time.process_time() - c0)
    return bw * 1e3, bc * 1e3


def torch_rows(n, reps, threads):
    import torch

    torch.set_num_threads(threads)
    nt = 12
    m = n // nt
    out = {}
    gen = torch.Generator().manual_seed(0)

    def halves(dt):
        return [(torch.rand(m, generator=gen) * 2 - 1).to(dt) for _ in range(nt)]

    for name, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        g16 = halves(dt)
        for kind in ("adamw", "sgd"):
            ps = [torch.nn.Parameter(torch.full((m,), 1e-3)) for _ in range(nt)]
            for p in ps:
                p.grad = torch.empty(m)
            model = [torch.empty(m, dtype=dt) for _ in range(nt)]
            if kind == "adamw":
                opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True)
            else:
                opt = torch.optim.SGD(ps, lr=1e-3, momentum=0.9, weight_decay=0.01, foreach=True)
            grads = [p.grad for p in ps]
            data = [p.detach() for p in ps]

            def step():
                torch._foreach_copy_(grads, g16)
                opt.step()
                torch._foreach_copy_(model, data)

            with torch.no_grad():
                out[f"{kind}_{name}"] = best_of(step, reps)
            del opt, ps, model, grads, data
        out[f"l2norm_{name}"] = best_of(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g16))), reps)
        if name == "f16":
            g32 = [torch.empty(m) for _ in range(nt)]
            found = torch.zeros(())
            inv = torch.full((), 1.0 / 1024)

            def unscale():
                torch._foreach_copy_(g32, g16)
                torch._amp_foreach_non_finite_check_and_unscale_(g32, found, inv)

            out["unscale_f16"] = best_of(unscale, reps)
            del g32
        del g16
    g = [torch.rand(m, generator=gen) * 2 - 1 for _ in range(nt)]
    out["l2norm_f32"] = best_of(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g))), reps)
    del g
    x = torch.rand(4096, 1024, generator=gen) * 2 - 1
    dy = torch.rand(4096, 1024, generator=gen) * 2 - 1
    w = torch.ones(1024) + 0.01
    b = torch.zeros(1024) + 0.01
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [1024], w, b, 1e-5)
    out["ln_fwd_f32"] = best_of(lambda: torch.ops.aten.native_layer_norm(x, [1024], w, b, 1e-5), 3 * reps)
    out["ln_bwd_f32"] = best_of(
        lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [1024], mean, rstd, w, b, [True, True, True]), 3 * reps)
    return out, torch.__version__


def capex_rows(exe, n, reps, threads):
    res = subprocess.run([exe, str(n), str(reps), str(threads)], check=True, capture_output=True, text=True)
    out, head = {}, ""
    for line in res.stdout.splitlines():
        if line.startswith("#"):
            head = line[1:].strip()
            continue
        op, w, c = line.split(",")
        out[op] = (float(w), float(c))
    return out, head


LABELS = [
    ("adamw_bf16", "AdamW fp32 master + bf16 grad + bf16 model copy"),
    ("adamw_f16", "AdamW fp32 master + fp16 grad + fp16 model copy"),
    ("sgd_bf16", "SGD momentum, fp32 master + bf16 grad + bf16 copy"),
    ("sgd_f16", "SGD momentum, fp32 master + fp16 grad + fp16 copy"),
    ("lamb_bf16", "LAMB fp32 master + bf16 grad + bf16 copy"),
    ("lamb_f16", "LAMB fp32 master + fp16 grad + fp16 copy"),
    ("unscale_f16", "unscale fp16 grads into fp32 (+ inf check)"),
    ("l2norm_f32", "L2 norm f32 (per tensor + total)"),
    ("l2norm_bf16", "L2 norm bf16"),
    ("l2norm_f16", "L2 norm fp16"),
    ("ln_fwd_f32", "LayerNorm forward f32, 4096x1024"),
    ("ln_bwd_f32", "LayerNorm backward f32, 4096x1024"),
]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capex", default="build/bench/bench_table")
    ap.add_argument("--elements", type=int, default=48_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--huge-pages", action="store_true", help="2 MB pages on both sides (see above)")
    a = ap.parse_args(argv)
    if a.huge_pages:  # before torch is imported: its allocator reads this once
        os.environ["CAPEX_BENCH_HUGE_PAGES"] = "1"
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    cx, head = capex_rows(a.capex, a.elements, a.reps, a.threads)
    try:
        tx, tv = torch_rows(a.elements, a.reps, a.threads)
    except ImportError:
        tx, tv = {}, "not installed"
    print(f"{head}; torch {tv}, {a.threads} thread(s){', 2 MB pages' if a.huge_pages else ''}")
    print("| op | capex ms (wall / cpu) | torch ms (wall / cpu) | torch/capex (cpu) |")
    print("|---|---:|---:|---:|")
    for key, label in LABELS:
        c, t = cx.get(key), tx.get(key)
        cs = f"{c[0]:.1f} / {c[1]:.1f}" if c else "-"
        ts = f"{t[0]:.1f} / {t[1]:.1f}" if t else "-"
        ratio = f"{t[1] / c[1]:.2f}x" if c and t and c[1] > 0 else "-"
        print(f"| {label} | {cs} | {ts} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
