#!/usr/bin/env python3
"""Golden learning rates for tests/test_lr.c (run from the repo root:
   python3 tests/gen_lr_golden.py; needs torch, CPU only).

Writes tests/data/lr_golden.h: for each case, the settings as a
capex_lr_schedule would hold them, and per step s = 0..n-1 (s = the
optimizer steps already taken) two torch values:
  closed[s]   torch's closed form: _get_closed_form_lr() of the scheduler
              active at s (warmup cases: SequentialLR's LinearLR before the
              milestone, the decay scheduler at last_epoch = s - warmup);
              OneCycleLR's get_lr() (it has only that form).
  stepped[s]  what a torch loop uses: get_last_lr() before the s-th
              scheduler.step() (the chainable recurrences; they drift).
Doubles are printed with repr (exact round trip). The header's first line
names the torch it came from. The first committed one was made where no torch
wheel could be installed: torch/optim/lr_scheduler.py of pytorch commit
008f727ece15 (the classes used here, transcribed) under a minimal stand-in for
the rest of torch; regenerating with a real torch should change nothing
(test_lr.c requires every closed form bit for bit on glibc)."""
import math
import warnings

import torch
from torch.optim.lr_scheduler import (CosineAnnealingLR, ExponentialLR, LinearLR, MultiStepLR, OneCycleLR,
                                      PolynomialLR, SequentialLR, StepLR)

warnings.simplefilter("ignore")

KIND = {"constant": 0, "cosine": 1, "linear": 2, "polynomial": 3, "step": 4, "multistep": 5, "exponential": 6,
        "onecycle": 7}


def opt(base):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base, momentum=0.9)


def decay_sched(c, o):
    k, T = c["kind"], c["total"] - c["warmup"]
    if k == "constant":
        return None
    if k == "cosine":
        return CosineAnnealingLR(o, T_max=T, eta_min=c["base"] * c["min_factor"])
    if k == "linear":
        return LinearLR(o, start_factor=1.0, end_factor=c["min_factor"], total_iters=T)
    if k == "polynomial":
        return PolynomialLR(o, total_iters=T, power=c["power"])
    if k == "step":
        return StepLR(o, step_size=c["step_size"], gamma=c["gamma"])
    if k == "multistep":
        return MultiStepLR(o, milestones=c["milestones"], gamma=c["gamma"])
    if k == "exponential":
        return ExponentialLR(o, gamma=c["gamma"])
    raise ValueError(k)


def build(c):
    """The torch scheduler for case c on a fresh optimizer: (scheduler, warmup, decay)."""
    o = opt(c["base"])
    if c["kind"] == "onecycle":
        s = OneCycleLR(o, max_lr=c["base"], total_steps=c["total"], pct_start=c["pct_start"],
                       anneal_strategy="linear" if c["anneal_linear"] else "cos", div_factor=c["div_factor"],
                       final_div_factor=c["final_div"], three_phase=bool(c["three_phase"]))
        return s, None, s
    W = c["warmup"]
    if W == 0:
        d = decay_sched(c, o)
        return d, None, d
    w = LinearLR(o, start_factor=c["start_factor"], end_factor=1.0, total_iters=W)
    d = decay_sched(c, o)
    if d is None:  # constant after warmup: LinearLR alone holds the base lr
        return w, w, None
    return SequentialLR(o, [w, d], milestones=[W]), w, d


def closed(c, s):
    _, w, d = build(c)
    if c["kind"] == "onecycle":
        d.last_epoch = s
        return d.get_lr()[0]
    W = c["warmup"]
    if W and (s < W or d is None):
        w.last_epoch = s
        return w._get_closed_form_lr()[0]
    d.last_epoch = s - W
    return d._get_closed_form_lr()[0]


def stepped(c):
    sched, _, _ = build(c)
    out = []
    for _ in range(c["n"]):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


def case(name, kind, base, n, **kw):
    c = dict(name=name, kind=kind, base=base, n=n, warmup=0, start_factor=1.0 / 3, total=0, min_factor=0.0,
             power=1.0, step_size=1, gamma=0.1, milestones=[], pct_start=0.3, div_factor=25.0, final_div=1e4,
             anneal_linear=0, three_phase=0)
    c.update(kw)
    return c


CASES = [
    case("constant_warmup", "constant", 0.1, 40, warmup=10, start_factor=0.25),
    case("cosine_warmup", "cosine", 3e-4, 401, warmup=50, total=400, min_factor=0.1, start_factor=0.01),
    case("cosine", "cosine", 0.05, 301, total=300),
    case("linear_warmup", "linear", 1e-3, 260, warmup=7, total=250, min_factor=0.05, start_factor=0.5),
    case("polynomial_warmup", "polynomial", 2e-3, 140, warmup=20, total=130, power=2.0),
    case("polynomial_sqrt", "polynomial", 0.1, 60, total=50, power=0.5),
    case("step_warmup", "step", 0.1, 80, warmup=5, step_size=7, gamma=0.5),
    case("multistep_warmup", "multistep", 0.3, 70, warmup=4, milestones=[10, 25, 25, 40], gamma=0.3),
    case("exponential", "exponential", 0.01, 200, gamma=0.97),
    case("onecycle_cos", "onecycle", 0.01, 100, total=100, pct_start=0.25),
    case("onecycle_linear_3phase", "onecycle", 4e-3, 97, total=97, pct_start=0.3, anneal_linear=1, three_phase=1,
         div_factor=10.0, final_div=100.0),
]


def main():
    lines = ["/* Generated by tests/gen_lr_golden.py from torch %s; do not edit. */" % torch.__version__,
             "typedef struct capex_lr_golden {",
             "    const char *name;",
             "    int kind;",
             "    long long warmup, total, step_size;",
             "    double start_factor, min_factor, power, gamma;",
             "    int nmil;",
             "    long long mil[4];",
             "    double pct_start, div_factor, final_div;",
             "    int anneal_linear, three_phase;",
             "    double base;",
             "    int n;",
             "    const double *closed, *stepped;",
             "} capex_lr_golden;", ""]
    for c in CASES:
        cl = [closed(c, s) for s in range(c["n"])]
        st = stepped(c)
        for nm, v in (("closed", cl), ("stepped", st)):
            lines.append("static const double capex_lr_golden_%s_%s[%d] = {" % (c["name"], nm, len(v)))
            for i in range(0, len(v), 4):
                lines.append("    " + ", ".join(repr(float(x)) for x in v[i:i + 4]) + ",")
            lines.append("};")
    lines.append("static const capex_lr_golden capex_lr_goldens[] = {")
    for c in CASES:
        mil = (c["milestones"] + [0, 0, 0, 0])[:4]
        lines.append('    {"%s", %d, %d, %d, %d, %r, %r, %r, %r, %d, {%s}, %r, %r, %r, %d, %d, %r, %d, '
                     "capex_lr_golden_%s_closed, capex_lr_golden_%s_stepped}," % (
                         c["name"], KIND[c["kind"]], c["warmup"], c["total"], c["step_size"], c["start_factor"],
                         c["min_factor"], c["power"], c["gamma"], len(c["milestones"]),
                         ", ".join(str(m) for m in mil), c["pct_start"], c["div_factor"], c["final_div"],
                         c["anneal_linear"], c["three_phase"], c["base"], c["n"], c["name"], c["name"]))
    lines.append("};")
    with open("tests/data/lr_golden.h", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote tests/data/lr_golden.h: %d cases" % len(CASES))


if __name__ == "__main__":
    main()
