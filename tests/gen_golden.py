#!/usr/bin/env python3
"""Golden vectors for tests/test_optim.c (run from the repo root:
   python3 tests/gen_golden.py; needs numpy and torch, CPU only).

Each case runs a few steps on small random fp32 tensors and writes
tests/data/optim_<case>.txt:

    kind adam_w_mode ntensors nsteps
    lr beta1 beta2 eps weight_decay momentum dampening nesterov bias_correction
    grad_averaging max_grad_norm use_nvlamb
    sizes...
    initial params (all tensors concatenated)
    grads of step 1 .. nsteps (each: all tensors concatenated)
    final params

Numbers are float32 values printed with 9 significant digits (exact round
trip). Adam/AdamW/SGD come from torch.optim (single-tensor path: foreach=False,
fused=False). torch has no LAMB: lamb_ref() below is a float64 transcription of
Apex FusedLAMB (apex/optimizers/fused_lamb.py + csrc/multi_tensor_lamb.cu):
global grad norm over all tensors, clip g /= G/max_grad_norm when G > max,
beta3 = 1-beta1 with grad_averaging, u = m^/(sqrt(v^)+eps) (+ wd*p in W mode,
L2 mode adds wd*p to the clipped grad), trust ratio lr*|p|/|u| per tensor
where (use_nvlamb or wd != 0) and both norms are nonzero.

torch's defaults differ from Apex's (AdamW weight_decay 0.01 vs FusedAdam 0;
SGD lr), so every argument is passed explicitly.
"""
import os
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def f32s(a):
    return " ".join("%.9g" % float(x) for x in np.asarray(a, dtype=np.float32).ravel())


def write(name, kind, w_mode, sizes, hp, p0, grads, pfinal):
    keys = ["lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "nesterov",
            "bias_correction", "grad_averaging", "max_grad_norm", "use_nvlamb"]
    with open(os.path.join(OUT, "optim_%s.txt" % name), "w") as f:
        f.write("%s %d %d %d\n" % (kind, w_mode, len(sizes), len(grads)))
        f.write(" ".join("%.9g" % float(hp.get(k, 0)) for k in keys) + "\n")
        f.write(" ".join(str(s) for s in sizes) + "\n")
        f.write(f32s(np.concatenate(p0)) + "\n")
        for g in grads:
            f.write(f32s(np.concatenate(g)) + "\n")
        f.write(f32s(np.concatenate(pfinal)) + "\n")


def inputs(rng, sizes, nsteps, gscale=1.0):
    p0 = [rng.standard_normal(s).astype(np.float32) for s in sizes]
    grads = [[(rng.standard_normal(s) * gscale).astype(np.float32) for s in sizes] for _ in range(nsteps)]
    return p0, grads


def run_torch(opt_cls, kwargs, p0, grads):
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in p0]
    opt = opt_cls(params, **kwargs)
    for g in grads:
        for p, gi in zip(params, g):
            p.grad = torch.from_numpy(gi.copy())
        opt.step()
    return [p.detach().numpy().copy() for p in params]


def lamb_ref(hp, w_mode, p0, grads):
    p = [x.astype(np.float64) for x in p0]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    b1, b2 = hp["beta1"], hp["beta2"]
    b3 = 1 - b1 if hp["grad_averaging"] else 1.0
    for step, g in enumerate(grads, 1):
        g = [x.astype(np.float64) for x in g]
        gn = np.sqrt(sum(float(np.sum(x * x)) for x in g))
        mx = hp["max_grad_norm"]
        clip = gn / mx if (mx > 0 and gn > mx) else 1.0
        bc1 = 1 - b1 ** step if hp["bias_correction"] else 1.0
        bc2 = 1 - b2 ** step if hp["bias_correction"] else 1.0
        wd = hp["weight_decay"]
        for i in range(len(p)):
            sg = g[i] / clip
            if not w_mode:
                sg = sg + wd * p[i]
            m[i] = m[i] * b1 + b3 * sg
            v[i] = v[i] * b2 + (1 - b2) * sg * sg
            u = (m[i] / bc1) / (np.sqrt(v[i] / bc2) + hp["eps"])
            if w_mode:
                u = u + wd * p[i]
            pn, un = np.linalg.norm(p[i]), np.linalg.norm(u)
            ratio = hp["lr"]
            if hp["use_nvlamb"] or wd != 0:
                ratio = hp["lr"] * pn / un if (pn != 0 and un != 0) else hp["lr"]
            p[i] = p[i] - ratio * u
    return p


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261123)
    sizes = [37, 1, 130]
    n = 5

    # AdamW (decoupled): torch.optim.AdamW, Apex FusedAdam adam_w_mode=True
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, bias_correction=1)
    p0, g = inputs(rng, sizes, n)
    pf = run_torch(torch.optim.AdamW, dict(lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                           weight_decay=hp["weight_decay"], amsgrad=False, foreach=False,
                                           fused=False), p0, g)
    write("adamw", "adam", 1, sizes, hp, p0, g, pf)

    # Adam with L2 decay: torch.optim.Adam(weight_decay), Apex adam_w_mode=False
    hp = dict(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05, bias_correction=1)
    p0, g = inputs(rng, sizes, n)
    pf = run_torch(torch.optim.Adam, dict(lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                          weight_decay=hp["weight_decay"], amsgrad=False, foreach=False,
                                          fused=False), p0, g)
    write("adam_l2", "adam", 0, sizes, hp, p0, g, pf)

    # SGD: momentum + dampening + weight decay; nesterov; plain
    for name, kw in [("sgd_momentum", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False)),
                     ("sgd_nesterov", dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.02, nesterov=True)),
                     ("sgd_plain", dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False))]:
        p0, g = inputs(rng, sizes, n)
        pf = run_torch(torch.optim.SGD, dict(kw, foreach=False), p0, g)
        hp = dict(kw)
        hp["nesterov"] = 1 if kw["nesterov"] else 0
        write(name, "sgd", 0, sizes, hp, p0, g, pf)

    # LAMB (Apex semantics, float64 reference). Grad scale 0.3 makes the global
    # norm exceed max_grad_norm, so clipping is exercised.
    for name, w_mode, extra in [("lamb", 1, dict()),
                                ("lamb_l2_nvlamb", 0, dict(use_nvlamb=1, weight_decay=0.0)),
                                ("lamb_noavg", 1, dict(grad_averaging=0, max_grad_norm=0.0))]:
        hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, bias_correction=1,
                  grad_averaging=1, max_grad_norm=1.0, use_nvlamb=0)
        hp.update(extra)
        p0, g = inputs(rng, sizes, n, gscale=0.3)
        pf = lamb_ref(hp, w_mode, p0, g)
        write(name, "lamb", w_mode, sizes, hp, p0, g, pf)
    print("wrote", OUT, "with torch", torch.__version__)


if __name__ == "__main__":
    main()
