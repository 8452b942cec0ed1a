#!/usr/bin/env python3
"""Cross-checks capex state files against independent implementations.

  state_py.py verify FILE   checks the capex_crc32 rule with zlib (stdlib), then
                            loads FILE with safetensors.numpy and checks the
                            values test_state.c wrote (exit 77 = skipped: no
                            safetensors/numpy module)
  state_py.py make FILE     writes a capex state file with the stdlib only
                            (struct, json, zlib), for test_state.c to read
  state_py.py seeds DIR     writes a small fuzz seed corpus into DIR
"""
import json, os, struct, sys, zlib


def capex_crc_ok(blob):
    # The verification recipe of capex.h's state-file manual: CRC-32 of the file with the 8 digits read as '0'.
    n = struct.unpack("<Q", blob[:8])[0]
    meta = json.loads(blob[8:8 + n])["__metadata__"]
    digits = meta["capex_crc32"].encode()
    i = blob.index(b'"capex_crc32":"' + digits + b'"') + len(b'"capex_crc32":"')
    zeroed = blob[:i] + b"00000000" + blob[i + 8:]
    return "%08x" % zlib.crc32(zeroed) == meta["capex_crc32"]


def build(tensors, meta):
    """tensors: list of (name, dtype, shape, raw little-endian bytes)."""
    header, off, data = {}, 0, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    m = {"format": "capex-state", "capex_format_version": "1", "capex_version": "py", "capex_crc32": "00000000"}
    m.update(meta)
    header = dict([("__metadata__", m)] + list(header.items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % 8)
    blob = struct.pack("<Q", len(text)) + text + data
    crc = "%08x" % zlib.crc32(blob)
    return blob.replace(b'"capex_crc32":"00000000"', b'"capex_crc32":"' + crc.encode() + b'"')


def main():
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "make":
        blob = build([("py.scale", "F64", [], struct.pack("<d", 32768.0)),
                      ("py.steps", "I64", [], struct.pack("<q", -7)),
                      ("py.v", "BF16", [3], struct.pack("<3H", 0x3f80, 0xc000, 0x7f80)),
                      ("py.empty", "F32", [0, 4], b"")], {"from": "python \u00e9"})
        open(path, "wb").write(blob)
        return 0
    if cmd == "seeds":
        os.makedirs(path, exist_ok=True)
        seeds = [build([("s", "F32", [], struct.pack("<f", 1.0))], {}),
                 build([("a", "I32", [2, 2], struct.pack("<4i", 1, -2, 3, -4)), ("b", "U8", [0], b"")], {"k": "v\n"}),
                 build([], {})]
        for i, s in enumerate(seeds):
            open(os.path.join(path, "seed%d" % i), "wb").write(s)
        h = json.dumps({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
        open(os.path.join(path, "foreign"), "wb").write(struct.pack("<Q", len(h)) + h + b"\x00\x3c\x00\xc0")
        return 0
    blob = open(path, "rb").read()
    if not capex_crc_ok(blob):
        print("capex_crc32 does not match zlib.crc32 of the file with the digits zeroed")
        return 1
    try:
        import numpy as np
        from safetensors.numpy import load_file
        from safetensors import safe_open
    except ImportError as e:
        print("SKIP: python safetensors/numpy not installed (%s); pip install safetensors numpy" % e)
        return 77
    t = load_file(path)
    with safe_open(path, framework="np") as f:
        md = f.metadata()
    checks = [
        md["format"] == "capex-state" and md["capex_format_version"] == "1" and md["note"] == "caf\u00e9 \"q\"\n",
        t["scale"].dtype == np.float64 and t["scale"].shape == () and float(t["scale"]) == 65536.0,
        t["step"].dtype == np.int64 and int(t["step"]) == -123456789012,
        t["m"].dtype == np.float32 and t["m"].shape == (2, 3) and t["m"].tolist() == np.array([[0.5, -1, 2], [3, 1e-3, 0]], np.float32).tolist() and bool(np.signbit(t["m"][1, 2])),
        t["h"].dtype == np.float16 and t["h"].tolist() == [1.0, -2.0],
        t["b"].dtype == np.bool_ and t["b"].tolist() == [True, False, True],
        t["u8"].dtype == np.uint8 and t["u8"].shape == (0,),
        t["i32"].dtype == np.int32 and t["i32"].tolist() == [[-1], [2147483647]],
    ]
    if not all(checks):
        print("python safetensors read different values: checks", checks)
        return 1
    print("python safetensors %s read the capex file correctly" % __import__("safetensors").__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
