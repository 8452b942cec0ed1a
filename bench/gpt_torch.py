#!/usr/bin/env python3
"""The GPT of examples/train_gpt.c rebuilt in PyTorch and trained on the same
batches from the same initial weights; prints the per-step loss difference and
writes an SVG overlay of both curves.

    make build/examples/train_gpt
    python3 bench/gpt_torch.py --opt O0 --steps 200             # fp32 vs fp32
    python3 bench/gpt_torch.py --opt O2 --half fp16 --steps 200   # capex O2 vs torch.amp
    python3 bench/gpt_torch.py --opt O0 --steps 60 --tiny --write-curve tests/data/gpt_torch_o0.txt

The C run writes its initial weights (--save-init, a safetensors file), every
step's tokens (--batches) and its per-step losses (--losses). Torch then trains
with torch.optim.AdamW (same lr schedule, advanced by the steps taken as capex
does, wd, clipping); for O1-O3 under
torch.autocast(dtype) with torch.amp.GradScaler (fp16) and fp32 parameters:
torch's native AMP is Apex O1, so it is the reference for capex's O1 and O2.
Needs torch (CPU is enough) and numpy; safetensors is read by hand.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

TINY = ["--seq", "32", "--layers", "2", "--heads", "2", "--channels", "32", "--batch", "8"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy())
    return out, meta


class GPT(torch.nn.Module):
    """examples/train_gpt.c's model: the same flat, layer-stacked tensors."""

    def __init__(self, w, T, L, NH, C, rms):
        super().__init__()
        self.T, self.L, self.NH, self.C, self.rms = T, L, NH, C, rms
        shapes = {"wte": (256, C), "wpe": (T, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
                  "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
                  "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
                  "lnfw": (C,), "lnfb": (C,)}
        self.names = list(shapes)  # the C order: one parameter group, as in the C run
        for k, s in shapes.items():
            self.register_parameter(k, torch.nn.Parameter(w[k].reshape(s).clone()))

    def norm(self, x, w, b):
        if self.rms:
            return F.rms_norm(x, (self.C,), w, 1e-5)
        return F.layer_norm(x, (self.C,), w, b, 1e-5)

    def forward(self, idx, targets):
        B, T = idx.shape
        C, NH = self.C, self.NH
        hs = C // NH
        x = self.wte[idx] + self.wpe[:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.L):
            h = self.norm(x, self.ln1w[l], self.ln1b[l])
            qkv = F.linear(h, self.qkvw[l], self.qkvb[l])
            q, k, v = qkv.split(C, dim=2)
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, self.attprojw[l], self.attprojb[l])
            h = self.norm(x, self.ln2w[l], self.ln2b[l])
            h = F.gelu(F.linear(h, self.fcw[l], self.fcb[l]), approximate="tanh")
            x = x + F.linear(h, self.fcprojw[l], self.fcprojb[l])
        x = self.norm(x, self.lnfw, self.lnfb)
        logits = F.linear(x, self.wte)  # tied head
        return F.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))


def lr_at(taken, lr, steps, warmup, min_frac=0.1):
    """examples/train_gpt.c's capex_lr_schedule (COSINE after a LinearLR warmup from
    1/warmup) at `taken` steps taken, in float64 from the C run's float values, as
    capex_lr_at; the optimizer then uses it as a float."""
    base, eta_frac = float(np.float32(lr)), float(np.float32(min_frac))
    total = steps if steps > warmup else warmup + 1
    if taken < warmup:
        start = 1.0 / warmup
        return base * (start + (1.0 - start) * taken / warmup)
    t, T = min(taken - warmup, total - warmup), total - warmup
    eta = base * eta_frac
    return eta + (base - eta) * (1.0 + math.cos(3.141592653589793 * t / T)) / 2.0


def train_torch(init, batches, a):
    w, meta = read_safetensors(init)
    T, L, NH, C, rms = (int(meta[k]) for k in ("seq", "layers", "heads", "channels", "rms"))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = GPT(w, T, L, NH, C, rms)
    params = [getattr(model, k) for k in model.names]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.wd)
    half = a.opt != "O0"
    dtype = torch.float16 if a.half == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=2000, enabled=half and a.half == "fp16")
    data = np.fromfile(batches, dtype=np.uint8)
    B = data.size // (a.steps * (T + 1))
    data = torch.from_numpy(data.reshape(a.steps, B, T + 1).astype(np.int64))
    losses = []
    taken = 0  # capex's schedule follows the steps taken: a skipped (overflow) step does not advance it
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = float(np.float32(lr_at(taken, a.lr, a.steps, a.warmup)))
        idx, tgt = data[step, :, :-1], data[step, :, 1:]
        with torch.autocast("cpu", dtype=dtype, enabled=half):
            loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, a.clip)
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.step(opt)
        scaler.update()
        if not scaler.is_enabled() or scaler.get_scale() >= before:
            taken += 1
        losses.append(loss.item())
    return losses


def svg(path, curves, title):
    W, H, L, R, T, Bm = 720, 420, 60, 190, 30, 45
    ys = [v for _, c, _ in curves for v in c]
    lo, hi = min(ys), max(ys)
    n = max(len(c) for _, c, _ in curves)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>', f'<text x="{L}" y="18" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H-Bm}" x2="{W-R}" y2="{H-Bm}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{H-Bm}" stroke="black"/>']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        y = H - Bm - (H - Bm - T) * k / 4
        out.append(f'<text x="{L-5}" y="{y+4:.0f}" text-anchor="end">{v:.2f}</text><line x1="{L}" y1="{y:.0f}" x2="{W-R}" y2="{y:.0f}" stroke="#ddd"/>')
        out.append(f'<text x="{L+(W-R-L)*k/4:.0f}" y="{H-Bm+16}" text-anchor="middle">{(n-1)*k//4}</text>')
    for i, (name, c, color) in enumerate(curves):
        pts = " ".join(f"{L+(W-R-L)*s/max(n-1,1):.1f},{(H-Bm)-(H-Bm-T)*(v-lo)/(hi-lo or 1):.1f}" for s, v in enumerate(c))
        dash = ' stroke-dasharray="5,4"' if i else ""
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{pts}"/>')
        out.append(f'<text x="{W-R+10}" y="{T+20+18*i}" fill="{color}">{name}: last {c[-1]:.4f}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exe", default="build/examples/train_gpt")
    p.add_argument("--opt", default="O0", choices=["O0", "O1", "O2", "O3"])
    p.add_argument("--half", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tiny", action="store_true", help="the test's tiny model (T 32, L 2, NH 2, C 32, B 8)")
    p.add_argument("--svg", default="gpt_torch_overlay.svg")
    p.add_argument("--write-curve", help="save torch's per-step losses (with the C command) for tests/test_gpt.c")
    a, extra = p.parse_known_args()  # anything else goes to the C run (--data, --norm rms, ...)
    d = tempfile.mkdtemp(prefix="capex_gpt_")
    init, batches, closs = (os.path.join(d, n) for n in ("init.safetensors", "batches.bin", "c_losses.txt"))
    args = ["--opt", a.opt, "--half", a.half, "--steps", str(a.steps), "--lr", repr(a.lr), "--wd", repr(a.wd),
            "--clip", repr(a.clip), "--warmup", str(a.warmup), "--seed", str(a.seed)] + (TINY if a.tiny else []) + extra
    cmd = [a.exe] + args + ["--save-init", init, "--batches", batches, "--losses", closs, "--sample", "0",
                            "--eval-every", "0", "--eval-windows", "16", "--quiet"]
    print("C run:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    c = [float(l.split()[1]) for l in open(closs)]
    t = train_torch(init, batches, a)
    print(f"{'step':>5} {'capex':>9} {'torch':>9} {'diff':>9}")
    for s in range(a.steps):
        if s < 10 or s % max(1, a.steps // 20) == 0 or s == a.steps - 1:
            print(f"{s:5d} {c[s]:9.5f} {t[s]:9.5f} {c[s]-t[s]:+9.5f}")
    diffs = np.abs(np.array(c) - np.array(t))
    for lo, hi in ((0, 10), (10, 50), (50, a.steps)):
        if hi > lo and lo < a.steps:
            print(f"steps {lo}-{min(hi, a.steps)-1}: max |diff| {diffs[lo:hi].max():.5f}  mean {diffs[lo:hi].mean():.5f}")
    label = f"torch {'fp32' if a.opt == 'O0' else 'amp ' + a.half}"
    svg(a.svg, [(f"capex {a.opt}", c, "#1f77b4"), (label, t, "#d62728")],
        f"GPT training loss, capex {a.opt} vs {label}, same batches and init")
    print("chart:", a.svg)
    if a.write_curve:
        with open(a.write_curve, "w") as f:
            f.write("# torch %s: per-step training loss of bench/gpt_torch.py; C args: %s\n" % (torch.__version__, " ".join(args)))
            for s, v in enumerate(t):
                f.write(f"{s} {v:.7f}\n")
        print("curve:", a.write_curve)


if __name__ == "__main__":
    sys.exit(main())
