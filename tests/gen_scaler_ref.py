#!/usr/bin/env python3
"""Writes tests/data/scaler_ref.txt: scripted overflow/clean sequences run
through PyTorch's own torch._amp_update_scale_ (the kernel GradScaler.update()
calls) on CPU tensors, recording the float32 scale bits and the growth tracker
after every step. tests/test_scaler.c replays the flags through capex_scaler
(hysteresis 1, min 0, max INFINITY) and requires identical values.

    python3 tests/gen_scaler_ref.py > tests/data/scaler_ref.txt
"""
import struct
import torch


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


class Lcg:
    """Tiny fixed PRNG so the sequences do not depend on Python's random."""

    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def uniform(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return (self.s >> 11) / float(1 << 53)


def mixed(n, p_inf, seed, bursts=()):
    r = Lcg(seed)
    flags = [1 if r.uniform() < p_inf else 0 for _ in range(n)]
    for start, length, val in bursts:
        for i in range(start, min(n, start + length)):
            flags[i] = val
    return flags


SEQS = [
    # name, init_scale, growth, backoff, interval, flags
    ("interval3_mixed", 2.0**16, 2.0, 0.5, 3,
     mixed(1500, 0.25, 1, bursts=[(100, 40, 0), (300, 6, 1), (500, 200, 0), (900, 12, 1)])),
    ("interval2000_long_runs", 2.0**16, 2.0, 0.5, 2000,
     [0] * 2005 + [1, 1, 0, 1] + [0] * 1999 + [1] + mixed(200, 0.1, 2)),
    ("grow_to_float_max", 2.0**120, 2.0, 0.5, 1, [0] * 20 + [1] + [0] * 5 + [1, 1] + [0] * 10),
    ("odd_factors", 1000.1, 1.7, 0.3, 2, mixed(400, 0.3, 3, bursts=[(50, 30, 0), (200, 20, 0)])),
    ("odd_factors_big_growth", 3.3, 3.0000001, 0.9, 1, mixed(300, 0.2, 4)),
    ("underflow_to_zero", 2.0**-140, 2.0, 0.5, 1, [1] * 15 + [0] * 5 + [1] * 3),
]


def main():
    print("# PyTorch %s torch._amp_update_scale_ (CPU) reference for tests/test_scaler.c" % torch.__version__)
    print("# seq <name> <init_scale f32 bits> <growth_factor> <backoff_factor> <growth_interval> <steps>")
    print("# then per step: <found_inf> <scale f32 bits after update> <growth_tracker after update>")
    for name, init, growth, backoff, interval, flags in SEQS:
        scale = torch.full((), init, dtype=torch.float32)
        tracker = torch.full((), 0, dtype=torch.int32)
        print("seq %s %08x %.17g %.17g %d %d" % (name, f32_bits(scale.item()), growth, backoff, interval, len(flags)))
        for f in flags:
            found = torch.full((), float(f), dtype=torch.float32)
            torch._amp_update_scale_(scale, tracker, found, growth, backoff, interval)
            print("%d %08x %d" % (f, f32_bits(scale.item()), tracker.item()))
    print("end")


if __name__ == "__main__":
    main()
