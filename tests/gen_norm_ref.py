#!/usr/bin/env python3
"""Golden vectors for tests/test_norm.c from PyTorch (float64, CPU):
torch.nn.functional.layer_norm / rms_norm / batch_norm forward, autograd
backward (dx, dweight, dbias) and batch_norm's running-statistics update.
Inputs are float32 values (so capex's f32 inputs are exact), computed in
float64. Usage: python3 tests/gen_norm_ref.py > tests/data/norm_ref.txt
(the first line names the torch version; tests/norm.mk's ci-extra regenerates
the file when torch is importable and requires the rest to match)."""
import struct
import torch
import torch.nn.functional as F


def f32(v):
    return struct.unpack('f', struct.pack('f', v))[0]


def vals(seed, n, scale=1.0, offset=0.0):
    out, s = [], seed
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(f32(offset + scale * (((s >> 11) / float(1 << 53)) * 2.0 - 1.0)))
    return out


def emit(name, t):
    print(name, ' '.join('%.17g' % v for v in t.detach().reshape(-1).tolist()))


def row_norm(kind, rows, cols, eps, seed, const=False):
    x = vals(seed, rows * cols, 2.0, 0.5)
    if const:
        x = [f32(3.25)] * (rows * cols)
    w, b, dy = vals(seed + 1, cols, 0.5, 1.0), vals(seed + 2, cols, 0.5), vals(seed + 3, rows * cols)
    X = torch.tensor(x, dtype=torch.float64).reshape(rows, cols).requires_grad_()
    W = torch.tensor(w, dtype=torch.float64).requires_grad_()
    B = torch.tensor(b, dtype=torch.float64).requires_grad_()
    DY = torch.tensor(dy, dtype=torch.float64).reshape(rows, cols)
    if kind == 'layer':
        Y = F.layer_norm(X, (cols,), W, B, eps)
    else:
        Y = F.rms_norm(X, (cols,), W, eps)
    Y.backward(DY)
    print('case %s %d %d %.17g' % (kind, rows, cols, eps))
    emit('x', X); emit('w', W); emit('b', B); emit('dy', DY); emit('y', Y)
    emit('dx', X.grad); emit('dw', W.grad); emit('db', B.grad if kind == 'layer' else torch.zeros(cols))


def batch_norm(n, c, s, eps, momentum, seed):
    x = vals(seed, n * c * s, 3.0, 1.0)
    w, b, dy = vals(seed + 1, c, 0.5, 1.0), vals(seed + 2, c, 0.5), vals(seed + 3, n * c * s)
    rm, rv = vals(seed + 4, c, 0.5), vals(seed + 5, c, 0.25, 1.0)
    X = torch.tensor(x, dtype=torch.float64).reshape(n, c, s).requires_grad_()
    W = torch.tensor(w, dtype=torch.float64).requires_grad_()
    B = torch.tensor(b, dtype=torch.float64).requires_grad_()
    RM = torch.tensor(rm, dtype=torch.float64)
    RV = torch.tensor(rv, dtype=torch.float64)
    print('case batch %d %d %d %.17g %.17g' % (n, c, s, eps, momentum))
    emit('x', X); emit('w', W); emit('b', B); emit('rm', RM); emit('rv', RV)
    DY = torch.tensor(dy, dtype=torch.float64).reshape(n, c, s)
    Y = F.batch_norm(X, RM, RV, W, B, training=True, momentum=momentum, eps=eps)
    Y.backward(DY)
    emit('dy', DY); emit('y', Y); emit('rm_out', RM); emit('rv_out', RV)
    emit('dx', X.grad); emit('dw', W.grad); emit('db', B.grad)


print('# torch %s' % torch.__version__)
row_norm('layer', 3, 5, 1e-5, 11)
row_norm('layer', 2, 1, 1e-5, 21)
row_norm('layer', 2, 33, 1e-5, 31)
row_norm('layer', 2, 4, 1e-5, 41, const=True)
row_norm('rms', 3, 7, 1e-6, 51)
row_norm('rms', 2, 1, 1e-5, 61)
row_norm('rms', 2, 33, 1e-5, 71)
batch_norm(4, 3, 5, 1e-5, 0.1, 81)
batch_norm(2, 2, 1, 1e-3, 0.3, 91)
