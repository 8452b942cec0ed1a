#!/usr/bin/env python3
"""Golden vectors for tests/test_optim_adagrad.c (run from the repo root:
   python3 tests/gen_adagrad_golden.py; needs numpy and torch, CPU only).
Writes tests/data/optim_adagrad_golden.h.

Each case runs a few steps on small random fp32 tensors (grad scales vary
per step, so amsgrad's max and Adagrad's sum see growing and shrinking
grads) and records the initial params, every step's grads, the final params
and the final second-moment state (Adagrad: torch's state "sum"; amsgrad:
"max_exp_avg_sq").

  torch.optim.Adagrad (foreach=False): lr_decay, initial_accumulator_value,
      weight_decay (L2: torch's only mode), several steps.
  Apex FusedAdagrad adagrad_w_mode=True (torch has no such mode): a float64
      transcription of csrc/multi_tensor_adagrad.cu (ADAGRAD_MODE_1):
      h += g*g; p -= clr * (g/(sqrt(h)+eps) + wd*p), with torch's
      clr = lr / (1 + (step-1)*lr_decay) (Apex's lr_decay is 0).
  torch.optim.Adam / AdamW with amsgrad=True (foreach=False, fused=False).

Hyperparameters are float32 values (what the C side holds), passed as the
Python floats of those float32s.
"""
import os
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "optim_adagrad_golden.h")
KIND_ADAM, KIND_ADAGRAD = 0, 3


def f32(x):
    return float(np.float32(x))


def carr(name, a):
    a = np.asarray(a, dtype=np.float32).ravel()
    body = ",\n    ".join(", ".join("%.9ef" % float(x) for x in a[i:i + 6]) for i in range(0, len(a), 6))
    return "static const float %s[%d] = {\n    %s};\n" % (name, max(len(a), 1), body if len(a) else "0")


def inputs(rng, sizes, scales):
    p0 = [rng.standard_normal(s).astype(np.float32) for s in sizes]
    grads = [[(rng.standard_normal(s) * sc).astype(np.float32) for s in sizes] for sc in scales]
    return p0, grads


def run_torch(make, p0, grads, state_key):
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in p0]
    opt = make(params)
    for g in grads:
        for prm, gi in zip(params, g):
            prm.grad = torch.from_numpy(gi.copy())
        opt.step()
    pf = [prm.detach().numpy().copy() for prm in params]
    st = [opt.state[prm][state_key].detach().numpy().copy() for prm in params]
    return pf, st


def apex_adagrad_w(hp, p0, grads):
    """float64 Apex FusedAdagrad, adagrad_w_mode=True, plus torch's lr_decay."""
    p = [x.astype(np.float64) for x in p0]
    h = [np.full(x.shape, hp["init"], dtype=np.float64) for x in p0]
    for step, g in enumerate(grads, start=1):
        clr = hp["lr"] / (1.0 + (step - 1) * hp["lr_decay"])
        for t in range(len(p)):
            gt = g[t].astype(np.float64)
            h[t] = h[t] + gt * gt
            p[t] = p[t] - clr * (gt / (np.sqrt(h[t]) + hp["eps"]) + hp["wd"] * p[t])
    return p, h


def main():
    rng = np.random.default_rng(20261124)
    sizes = [7, 33, 1]
    scales = [1.0, 0.05, 3.0, 0.2, 1.5]
    cases = []

    hp = dict(lr=f32(0.05), lr_decay=f32(0.1), init=f32(0.3), wd=f32(0.02), eps=f32(1e-10))
    p0, grads = inputs(rng, sizes, scales)
    pf, st = run_torch(lambda ps: torch.optim.Adagrad(ps, lr=hp["lr"], lr_decay=hp["lr_decay"],
                                                      weight_decay=hp["wd"],
                                                      initial_accumulator_value=hp["init"], eps=hp["eps"],
                                                      foreach=False), p0, grads, "sum")
    cases.append(("torch_adagrad", KIND_ADAGRAD, 0, hp, 0, p0, grads, pf, st))

    hp = dict(lr=f32(0.01), lr_decay=0.0, init=0.0, wd=0.0, eps=f32(1e-10))  # torch/Apex defaults
    p0, grads = inputs(rng, sizes, scales[:3])
    pf, st = run_torch(lambda ps: torch.optim.Adagrad(ps, foreach=False), p0, grads, "sum")
    cases.append(("torch_adagrad_defaults", KIND_ADAGRAD, 0, hp, 0, p0, grads, pf, st))

    hp = dict(lr=f32(0.03), lr_decay=f32(0.05), init=f32(0.1), wd=f32(0.05), eps=f32(1e-8))
    p0, grads = inputs(rng, sizes, scales)
    pf, st = apex_adagrad_w(hp, p0, grads)
    cases.append(("apex_adagrad_w", KIND_ADAGRAD, 1, hp, 0, p0, grads, pf, st))

    hp = dict(lr=f32(0.01), beta1=f32(0.9), beta2=f32(0.99), eps=f32(1e-8), wd=f32(0.01))
    p0, grads = inputs(rng, sizes, scales)
    pf, st = run_torch(lambda ps: torch.optim.Adam(ps, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                                   weight_decay=hp["wd"], amsgrad=True, foreach=False,
                                                   fused=False), p0, grads, "max_exp_avg_sq")
    cases.append(("torch_adam_amsgrad", KIND_ADAM, 0, hp, 1, p0, grads, pf, st))

    hp = dict(lr=f32(0.02), beta1=f32(0.8), beta2=f32(0.95), eps=f32(1e-6), wd=f32(0.1))
    p0, grads = inputs(rng, sizes, scales)
    pf, st = run_torch(lambda ps: torch.optim.AdamW(ps, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                                    eps=hp["eps"], weight_decay=hp["wd"], amsgrad=True,
                                                    foreach=False, fused=False), p0, grads, "max_exp_avg_sq")
    cases.append(("torch_adamw_amsgrad", KIND_ADAM, 1, hp, 1, p0, grads, pf, st))

    with open(OUT, "w") as f:
        f.write("/* Generated by tests/gen_adagrad_golden.py (torch %s); do not edit. */\n" % torch.__version__)
        f.write("static const int golden_sizes[%d] = {%s};\n" % (len(sizes), ", ".join(map(str, sizes))))
        for (name, kind, w, hp, ams, p0, grads, pf, st) in cases:
            f.write(carr("%s_p0" % name, np.concatenate(p0)))
            f.write(carr("%s_grads" % name, np.concatenate([np.concatenate(g) for g in grads])))
            f.write(carr("%s_pfinal" % name, np.concatenate(pf)))
            f.write(carr("%s_state" % name, np.concatenate(st)))
        f.write("static const golden_case golden_cases[] = {\n")
        for (name, kind, w, hp, ams, p0, grads, pf, st) in cases:
            f.write("    {\"%s\", %d, %d, %d, %.9ef, %.9ef, %.9ef, %.9ef, %.9ef, %.9ef, %.9ef, %d,\n"
                    "     %s_p0, %s_grads, %s_pfinal, %s_state},\n" %
                    (name, kind, w, len(grads), hp["lr"], hp.get("beta1", 0.0), hp.get("beta2", 0.0), hp["eps"],
                     hp["wd"], hp.get("lr_decay", 0.0), hp.get("init", 0.0), ams, name, name, name, name))
        f.write("};\n")


if __name__ == "__main__":
    main()
