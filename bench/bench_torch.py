#!/usr/bin/env python3
"""PyTorch peers of bench/bench_gpu.c, on the same sizes, and the report.

Measure (GPU machine, torch installed):
    bench_torch.py --sizes 1000000,10000000 --csv torch.csv
Rows (same byte counts as bench_gpu.c, so GB/s compare directly):
    torch_copy           y.copy_(x), f32: 8 bytes/param
    torch_unscale_f32    torch._amp_foreach_non_finite_check_and_unscale_ (what
                         torch.amp.GradScaler.unscale_ runs), f32 grads: 8
    torch_foreach_norm   torch._foreach_norm([g]) on f32 grads: 4
    torch_adamw_fused    torch.optim.AdamW(fused=True), f32 params and grads: 28
Norms (bench_gpu --norms's shapes: 2^24 bf16 elements as rows x width):
    bench_torch.py --norms --csv torch_norms.csv
    torch.nn.functional.layer_norm / rms_norm forward, and their backward
    (torch.autograd.grad for dx, dweight, dbias), bf16 activations and weights.
Report (no GPU needed):
    bench_torch.py --report capex.csv torch.csv --markdown table.md --svg chart.svg
writes a roofline-style table (GB/s and the ratio to the same run's copy
bandwidth, capex vs PyTorch time for AdamW) and an SVG chart of GB/s by size.
"""
import argparse
import csv
import sys

BYTES = {"copy": 8, "unscale_f32": 8, "foreach_norm": 4, "adamw_fused": 28}


def timed_ms(torch, fn, iters):
    """Mean ms per call of fn over iters calls, CUDA events, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def write_rows(torch, rows, out_csv, count_name):
    """rows of (kernel, count, bytes, ms, gbps, ratio) to out_csv, bench_gpu.c's columns."""
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", count_name, "bytes", "ms", "gbps", "ratio_to_copy"])
        for r in rows:
            w.writerow([r[0], r[1], f"{r[2]:.0f}", f"{r[3]:.6f}", f"{r[4]:.3f}", f"{r[5]:.4f}"])
    print(f"bench_torch: {len(rows)} rows -> {out_csv} (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    return 0


def measure(sizes, out_csv, iters_override=0):
    import torch  # only the measuring mode needs torch

    if not torch.cuda.is_available():
        print("bench_torch: no CUDA device, nothing measured")
        return 0
    dev = torch.device("cuda")
    rows = []

    for n in sizes:
        iters = iters_override or (5 if n >= 500_000_000 else 20 if n >= 50_000_000 else 100)
        free, _ = torch.cuda.mem_get_info()
        if free < n * 26 + 1e9:
            print(f"skipping {n} params: {free / 1e9:.1f} GB free")
            continue
        x = torch.full((n,), 0.5, device=dev, dtype=torch.float32)
        y = torch.empty_like(x)
        g = torch.full((n,), 1e-3, device=dev, dtype=torch.float32)
        found = torch.zeros((), device=dev, dtype=torch.float32)
        inv = torch.ones((), device=dev, dtype=torch.float32)
        copy_ms = timed_ms(torch, lambda: y.copy_(x), iters)
        res = {"copy": copy_ms}
        res["unscale_f32"] = timed_ms(torch, lambda: torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv), iters)
        res["foreach_norm"] = timed_ms(torch, lambda: torch._foreach_norm([g]), iters)
        del y
        p = torch.nn.Parameter(x)
        p.grad = g
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
        res["adamw_fused"] = timed_ms(torch, opt.step, iters)
        copy_gbps = BYTES["copy"] * n / (copy_ms * 1e-3) / 1e9
        for k, ms in res.items():
            gbps = BYTES[k] * n / (ms * 1e-3) / 1e9
            rows.append(("torch_" + k, n, BYTES[k] * n, ms, gbps, gbps / copy_gbps))
        del opt, p, g, x
        torch.cuda.empty_cache()
    return write_rows(torch, rows, out_csv, "params")


def measure_norms(out_csv, iters_override=0):
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("bench_torch: no CUDA device, nothing measured")
        return 0
    dev = torch.device("cuda")
    total, iters = 1 << 24, iters_override or 50
    rows = []

    def timed(fn):
        return timed_ms(torch, fn, iters)

    g = torch.Generator(device=dev).manual_seed(7)
    for width in (768, 1024, 4096, 8192):
        n = total // width
        x = (torch.rand((n, width), device=dev, generator=g) * 4 - 2).to(torch.bfloat16).requires_grad_()
        dy = (torch.rand((n, width), device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        w = (torch.rand((width,), device=dev, generator=g) + 0.5).to(torch.bfloat16).requires_grad_()
        b = (torch.rand((width,), device=dev, generator=g) - 0.5).to(torch.bfloat16).requires_grad_()
        y2 = torch.empty_like(dy)
        res = {"copy_bf16": (timed(lambda: y2.copy_(dy)), 4)}
        with torch.no_grad():
            res["layernorm_fwd"] = (timed(lambda: F.layer_norm(x, (width,), w, b, 1e-5)), 4)
            res["rmsnorm_fwd"] = (timed(lambda: F.rms_norm(x, (width,), w, 1e-5)), 4)
        y = F.layer_norm(x, (width,), w, b, 1e-5)
        res["layernorm_bwd"] = (timed(lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)), 6)
        y = F.rms_norm(x, (width,), w, 1e-5)
        res["rmsnorm_bwd"] = (timed(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True)), 6)
        copy_gbps = 4 * n * width / (res["copy_bf16"][0] * 1e-3) / 1e9
        for k in ("copy_bf16", "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd"):
            ms, bpe = res[k]
            gbps = bpe * n * width / (ms * 1e-3) / 1e9
            rows.append((f"torch_{k}_w{width}", n * width, bpe * n * width, ms, gbps, gbps / copy_gbps))
        del x, dy, w, b, y, y2
        torch.cuda.empty_cache()
    print("| kernel | elements | us | GB/s | / copy |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[3] * 1e3:.1f} | {r[4]:.1f} | {r[5]:.2f} |")
    return write_rows(torch, rows, out_csv, "elements")


def read_rows(paths):
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            for r in csv.DictReader(f):
                rows.append({"kernel": r["kernel"], "params": int(r["params"]), "ms": float(r["ms"]),
                             "gbps": float(r["gbps"]), "ratio": float(r["ratio_to_copy"])})
    return rows


def svg_chart(rows, path):
    """GB/s by parameter count (log x), one polyline per kernel."""
    import math

    kernels = sorted({r["kernel"] for r in rows})
    sizes = sorted({r["params"] for r in rows})
    if not sizes:
        return
    W, H, L, B, T, R = 900, 520, 70, 50, 30, 260
    xmin, xmax = math.log10(sizes[0]), math.log10(sizes[-1]) if len(sizes) > 1 else math.log10(sizes[0]) + 1
    ymax = max(r["gbps"] for r in rows) * 1.1 or 1.0

    def X(n):
        return L + (math.log10(n) - xmin) / max(xmax - xmin, 1e-9) * (W - L - R)

    def Y(v):
        return H - B - v / ymax * (H - B - T)

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(W - R + L) / 2}" y="{H - 10}" text-anchor="middle">parameters</text>',
           f'<text x="15" y="{(H - B + T) / 2}" transform="rotate(-90 15 {(H - B + T) / 2})" text-anchor="middle">'
           'effective GB/s</text>']
    for n in sizes:
        out.append(f'<text x="{X(n):.1f}" y="{H - B + 16}" text-anchor="middle">{n:.0e}</text>')
    for i in range(6):
        v = ymax * i / 5
        out.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        out.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    for i, k in enumerate(kernels):
        pts = sorted((r["params"], r["gbps"]) for r in rows if r["kernel"] == k)
        c = colors[i % len(colors)]
        dash = ' stroke-dasharray="5,3"' if k.startswith("torch_") else ""
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="'
                   + " ".join(f"{X(n):.1f},{Y(v):.1f}" for n, v in pts) + '"/>')
        out.append(f'<text x="{W - R + 10}" y="{T + 16 * i + 10}" fill="{c}">{k}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def report(paths, md_path, svg_path):
    rows = read_rows(paths)
    lines = ["| kernel | params | ms | GB/s | / copy (same run) |", "|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["params"], r["kernel"])):
        lines.append(f'| {r["kernel"]} | {r["params"]} | {r["ms"]:.4f} | {r["gbps"]:.1f} | {r["ratio"]:.2f} |')
    lines += ["", "| params | capex adamw_f32 ms | capex adamw_mixed ms | torch AdamW(fused) ms | speed-up (f32) |",
              "|---:|---:|---:|---:|---:|"]
    by = {(r["kernel"], r["params"]): r for r in rows}
    for n in sorted({r["params"] for r in rows}):
        a, m, t = by.get(("capex_adamw_f32", n)), by.get(("capex_adamw_mixed", n)), by.get(("torch_adamw_fused", n))
        if a and t:
            lines.append(f'| {n} | {a["ms"]:.4f} | {m["ms"] if m else float("nan"):.4f} | {t["ms"]:.4f} | '
                         f'{t["ms"] / a["ms"]:.2f}x |')
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    svg_chart(rows, svg_path)
    print(f"bench_torch: table -> {md_path}, chart -> {svg_path}")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000,100000000,1000000000")
    ap.add_argument("--csv", default="gpu_torch.csv")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--report", nargs="+", metavar="CSV")
    ap.add_argument("--markdown", default="gpu_table.md")
    ap.add_argument("--svg", default="gpu_chart.svg")
    ap.add_argument("--norms", action="store_true")
    a = ap.parse_args(argv)
    if a.norms:
        return measure_norms(a.csv, a.iters)
    if a.report:
        return report(a.report, a.markdown, a.svg)
    return measure([int(s) for s in a.sizes.split(",") if s], a.csv, a.iters)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
