#!/usr/bin/env python3
"""Static SASS gate: what can be known about capex's GPU kernels without a GPU.

tests/sass_dump writes every built-in part's CUBIN per sm (NVRTC, no driver);
this script runs `cuobjdump -res-usage` and `cuobjdump -sass` on them, derives
per-kernel facts and compares them with the committed table
(tests/data/sass_table.txt). A regression fails, naming the kernel and arch.

Facts per kernel and arch:
  reg     registers per thread (cuobjdump -res-usage REG)
  stack   per-thread stack frame bytes (STACK), local = LOCAL bytes
  lmem    LDL/STL instructions (spills and local arrays) in the SASS
  vec     widest global load (bits) in the kernel's main loop
  ldg     global loads per iteration of the main loop
  infl    loads in flight: LDGs of the main loop issued before the first
          instruction that reads a register one of them wrote (body in
          address order); what one thread keeps outstanding per iteration
  infl_bits  their total width (facts JSON only; bench/gpu_model.py uses it)
The main loop is the backward branch's range [target, branch] with the most
LDG bits per iteration (ties: the first); in the multi-tensor kernels
(MTA_KERNEL) only innermost ranges count: their loop over a block's chunks
holds the element loops. Kernels without a loop have vec/ldg/infl 0.

Rules (the table is the baseline; regenerate with `make sass-table`, commit):
  every kernel: reg, stack, local, lmem <= table values,
                vec, ldg, infl >= table values (no regression)
  class mem and reduce: local == 0 and lmem == 0 (no local memory, no spills)
  class reduce: infl >= 4 (>= 4 independent loads in flight per thread)
(class other: the rest (element-wise helpers, one-thread bookkeeping, small
per-tensor sums). capex_go_prepare's 40 B stack and 5 LDL/STL are the double
cos() slow path of the cosine lr schedule: Payne-Hanek range reduction keeps
5 u64 in a local array; one thread, taken only for huge arguments.)
A kernel missing from the table, or in the table but not in the CUBINs, fails.

Usage: sass_gate.py CUBIN_DIR TABLE [--write] [--facts OUT.json]
       sass_gate.py --self-test   (the loop parser on hand-made SASS, no tools)
Exit 0 pass, 1 fail, 77 skip (cuobjdump/nvdisasm not found; says why).
"""
import json
import os
import re
import shutil
import subprocess
import sys

# Memory-bound kernels (streams over tensors) and reductions, by name prefix.
REDUCE = ("capex_go_sumsq_", "capex_go_reduce", "capex_go_novo1_")
MEM = ("capex_go_scale_", "capex_go_adam_", "capex_go_sgd_", "capex_go_lamb1_", "capex_go_lamb2",
       "capex_go_novo2_", "capex_go_adagrad_", "capex_norm_fwd", "capex_norm_bwd_dx", "capex_norm_me_dx", "capex_bn_fwd",
       "capex_bn_stats", "capex_bn_bwd_reduce", "capex_bn_bwd_dx")
MIN_INFLIGHT_REDUCE = 4

INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)\s*([^;]*);")
REG = re.compile(r"\bR(\d+)\b")
REG64 = re.compile(r"\bR(\d+)(\.64)?\b")


def klass(name):
    if name.startswith(REDUCE):
        return "reduce"
    if name.startswith(MEM):
        return "mem"
    return "other"


def ldg_bits(op):
    parts = op.split(".")
    for p in parts[1:]:
        if p in ("128", "64", "U16", "S16", "U8", "S8"):
            return {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}[p]
    return 32


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if p.returncode != 0:
        sys.exit("sass_gate: %s failed:\n%s" % (" ".join(cmd), p.stderr))
    return p.stdout


def parse_res(text):
    res, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        if cur and "REG:" in line:
            kv = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line))
            res[cur] = {"reg": int(kv["REG"]), "stack": int(kv["STACK"]), "local": int(kv["LOCAL"])}
            cur = None
    return res


def parse_sass(text):
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INS.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4).strip()))
    return funcs


# The multi-tensor kernels: a loop over the block's chunks (CAPEX_GO_CHUNKS)
# around the element loops; their main loop is an innermost one.
MTA_KERNEL = re.compile(r"^capex_go_(scale_|sumsq_|adam_|sgd_|lamb1_|lamb2$|novo1_|novo2_|adagrad_)")


def loop_facts(ins, innermost=False):
    """vec, ldg, infl of the main loop (see the module doc)."""
    best = (0, 0, 0, 0, 0)  # bits per iteration, vec, ldg, infl, bits of those infl loads
    loops = []
    for addr, op, args in ins:
        if not op.startswith("BRA"):
            continue
        m = re.search(r"(0x[0-9a-f]+)", args)  # BRA.U may name a uniform predicate first: "UP1, 0x560"
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    for lo, addr in loops:
        # innermost loops only: the multi-tensor kernels' loop over a block's
        # chunks (CAPEX_GO_CHUNKS) holds the element loops, it is not one
        if innermost and any(lo <= lo2 and hi2 <= addr and (lo2, hi2) != (lo, addr) for lo2, hi2 in loops):
            continue
        body = [i for i in ins if lo <= i[0] <= addr]
        ldgs = [i for i in body if i[1].startswith("LDG")]
        bits = sum(ldg_bits(i[1]) for i in ldgs)
        if bits <= best[0]:
            continue
        loaded, infl, infl_bits = set(), 0, 0
        for _, op2, args2 in body:
            srcs = args2
            if not op2.startswith(("ST", "RED", "BRA", "BAR", "EXIT")):
                srcs = args2.split(",", 1)[1] if "," in args2 else ""  # first operand is the destination
            # Rn.64 and the operands of double ops (D*, *.F64*) also read Rn+1
            wide = op2.startswith("D") or ".F64" in op2 or ".64" in op2
            used = set()
            for r, suf in REG64.findall(srcs):
                used.update((int(r), int(r) + 1) if wide or suf else (int(r),))
            if loaded & used:
                break
            if op2.startswith("LDG"):
                d = REG.match(args2)
                if d:
                    base = int(d.group(1))
                    loaded.update(range(base, base + max(1, ldg_bits(op2) // 32)))
                infl += 1
                infl_bits += ldg_bits(op2)
        best = (bits, max(ldg_bits(i[1]) for i in ldgs), len(ldgs), infl, infl_bits)
    return {"vec": best[1], "ldg": best[2], "infl": best[3], "infl_bits": best[4]}


def facts_for(cubin_dir, cuobjdump):
    facts = {}
    for arch in sorted(os.listdir(cubin_dir)):
        d = os.path.join(cubin_dir, arch)
        if not arch.startswith("sm_") or not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if not f.endswith(".cubin"):
                continue
            path = os.path.join(d, f)
            res = parse_res(run([cuobjdump, "-res-usage", path]))
            sass = parse_sass(run([cuobjdump, "-sass", path]))
            for k, ins in sass.items():
                row = dict(res.get(k, {"reg": -1, "stack": -1, "local": -1}))
                row["lmem"] = sum(1 for i in ins if i[1].startswith(("LDL", "STL")))
                row.update(loop_facts(ins, innermost=bool(MTA_KERNEL.match(k))))
                row["class"] = klass(k)
                row["part"] = f[:-6]
                facts[(arch, k)] = row
    return facts


COLS = ("reg", "stack", "local", "lmem", "vec", "ldg", "infl")


def write_table(path, facts, tool):
    with open(path, "w") as out:
        out.write("# capex static SASS table: tests/sass_gate.py checks every CUBIN against it.\n")
        out.write("# Made by `make sass-table` with %s. Columns: see tests/sass_gate.py.\n" % tool)
        out.write("# arch kernel part class " + " ".join(COLS) + "\n")
        for (arch, k), r in sorted(facts.items(), key=lambda x: (int(x[0][0][3:]), x[0][1])):
            out.write("%s %s %s %s %s\n" % (arch, k, r["part"], r["class"], " ".join("%s=%d" % (c, r[c]) for c in COLS)))


def read_table(path):
    tab = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            w = line.split()
            row = {"part": w[2], "class": w[3]}
            row.update({k: int(v) for k, v in (x.split("=") for x in w[4:])})
            tab[(w[0], w[1])] = row
    return tab


def check(facts, tab):
    errs = []
    archs = {a for a, _ in facts}
    for key in sorted(set(tab) - set(facts)):
        if key[0] in archs:
            errs.append("%s (%s): in the table but no longer in any CUBIN" % (key[1], key[0]))
    for a in sorted({a for a, _ in tab} - archs):
        errs.append("%s: in the table but no CUBINs were made for it" % a)
    for (arch, k), r in sorted(facts.items()):
        where = "%s (%s, part %s)" % (k, arch, r["part"])
        t = tab.get((arch, k))
        if t is None:
            errs.append("%s: not in the table; run `make sass-table` and commit it" % where)
            continue
        hot = t["class"] in ("mem", "reduce")
        if (hot and (r["local"] or r["lmem"])) or r["local"] > t["local"] or r["lmem"] > t["lmem"]:
            errs.append("%s: local memory %d B, %d LDL/STL (spills or a local array), table %d B, %d" %
                        (where, r["local"], r["lmem"], t["local"], t["lmem"]))
        if r["reg"] > t["reg"]:
            errs.append("%s: %d registers per thread, table %d" % (where, r["reg"], t["reg"]))
        if r["stack"] > t["stack"]:
            errs.append("%s: stack frame %d B, table %d" % (where, r["stack"], t["stack"]))
        if r["vec"] < t["vec"]:
            errs.append("%s: widest main-loop global load %d bits, table %d" % (where, r["vec"], t["vec"]))
        if r["ldg"] < t["ldg"]:
            errs.append("%s: %d global loads per main-loop iteration, table %d" % (where, r["ldg"], t["ldg"]))
        if r["infl"] < t["infl"]:
            errs.append("%s: %d loads in flight per thread, table %d" % (where, r["infl"], t["infl"]))
        if t["class"] == "reduce" and r["infl"] < MIN_INFLIGHT_REDUCE:
            errs.append("%s: reduction keeps %d loads in flight per thread, want >= %d" % (where, r["infl"], MIN_INFLIGHT_REDUCE))
    return errs


def find_tool():
    cand = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/opt/cuda"):
        if root:
            cand.append(os.path.join(root, "bin", "cuobjdump"))
    here = os.path.dirname(os.path.abspath(__file__))
    cand.append(os.path.join(here, "..", "build", "deps", "cuobjdump", "nvidia", "cu13", "bin", "cuobjdump"))
    for c in cand:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            nvd = os.path.join(os.path.dirname(c), "nvdisasm")
            if shutil.which("nvdisasm") or os.path.isfile(nvd) or os.environ.get("NVDISASM_PATH"):
                return os.path.abspath(c)
    return None


SELF_TEST = [  # (SASS, vec, ldg, infl): the main-loop rules on small hand-made loops
    ("""        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;
        /*0020*/                   F2F.F64.F32 R12, R4 ;
        /*0030*/                   LDG.E.128 R16, desc[UR4][R2.64+0x20] ;
        /*0040*/              @!P0 BRA 0x0 ;""", 128, 3, 2),
    ("""        /*0000*/                   LDG.E.64 R4, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.64 R6, desc[UR4][R8.64] ;
        /*0020*/                   LDG.E.64 R10, desc[UR4][R12.64] ;
        /*0030*/                   LDG.E.64 R14, desc[UR4][R20.64] ;
        /*0040*/                   DADD R22, R22, R4 ;
        /*0050*/              @!P0 BRA 0x0 ;""", 64, 4, 4),
    # an address register next to a loaded pair is no use; a double op on R5 is
    ("""        /*0000*/                   LDG.E R5, desc[UR4][R2.64] ;
        /*0010*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0020*/                   LDG.E R7, desc[UR4][R8.64] ;
        /*0030*/                   DADD R10, R4, R10 ;
        /*0040*/                   LDG.E R9, desc[UR4][R2.64] ;
        /*0050*/              @!P0 BRA 0x0 ;""", 32, 3, 2),
    ("""        /*0000*/                   LDG.E R5, desc[UR4][R2.64] ;
        /*0010*/                   BRA 0x20 ;
        /*0020*/                   EXIT ;""", 0, 0, 0),
    # sm_100 closes loops with a uniform branch that names its predicate first
    ("""        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.128 R8, desc[UR4][R12.64] ;
        /*0020*/                   FADD R16, R4, R8 ;
        /*0030*/                   BRA.U UP1, 0x0 ;""", 128, 2, 2),
    # a loop around a loop (a block's chunks): the inner one is the main loop
    ("""        /*0000*/                   LDC.64 R2, c[0x0][0x380] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.128 R8, desc[UR4][R12.64] ;
        /*0030*/                   FADD R16, R4, R8 ;
        /*0040*/              @!P0 BRA 0x10 ;
        /*0050*/                   LDG.E R20, desc[UR4][R14.64] ;
        /*0060*/              @!P1 BRA 0x0 ;""", 128, 2, 2),
]


def self_test():
    bad = 0
    for text, vec, ldg, infl in SELF_TEST:
        got = loop_facts(parse_sass("Function : k\n" + text)["k"], innermost=True)
        if (got["vec"], got["ldg"], got["infl"]) != (vec, ldg, infl):
            print("sass gate self-test: FAIL: %s, want vec=%d ldg=%d infl=%d\n%s" % (got, vec, ldg, infl, text))
            bad += 1
    print("sass gate self-test: %d/%d loops parsed as expected" % (len(SELF_TEST) - bad, len(SELF_TEST)))
    return 1 if bad else 0


def main():
    if "--self-test" in sys.argv:
        return self_test()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    facts_out = None
    if "--facts" in sys.argv:
        facts_out = sys.argv[sys.argv.index("--facts") + 1]
        args.remove(facts_out)
    if len(args) != 2:
        sys.exit(__doc__)
    cubin_dir, table = args
    tool = find_tool()
    if not tool:
        print("sass gate: SKIP: cuobjdump with nvdisasm not found (PATH, CUOBJDUMP, CUDA_HOME, build/deps/cuobjdump; "
              "`make ci-deps` installs them from PyPI)")
        return 77
    env_path = os.path.dirname(tool)
    os.environ["PATH"] = env_path + os.pathsep + os.environ.get("PATH", "")
    facts = facts_for(cubin_dir, tool)
    if not facts:
        sys.exit("sass_gate: no CUBINs under %s" % cubin_dir)
    if facts_out:
        with open(facts_out, "w") as f:
            json.dump({"%s %s" % k: v for k, v in sorted(facts.items())}, f, indent=1, sort_keys=True)
    ver = run([tool, "--version"]).strip().splitlines()[-1]
    try:
        with open(os.path.join(cubin_dir, "nvrtc_version")) as f:
            nvrtc = "NVRTC " + f.read().strip()
    except OSError:
        nvrtc = "NVRTC ?"
    if "--write" in sys.argv:
        write_table(table, facts, "%s, cuobjdump %s" % (nvrtc, ver))
        print("sass gate: wrote %d rows to %s" % (len(facts), table))
        return 0
    with open(table) as f:
        made = f.read(4096)
    if nvrtc not in made:
        print("sass gate: note: the table was made with another NVRTC than this %s; registers may move" % nvrtc)
    errs = check(facts, read_table(table))
    for e in errs:
        print("sass gate: FAIL: " + e)
    archs = sorted({a for a, _ in facts}, key=lambda a: int(a[3:]))
    red = ["%s %s infl=%d" % (a, k, r["infl"]) for (a, k), r in sorted(facts.items()) if r["class"] == "reduce" and a == archs[-1]]
    print("sass gate: %d kernels x %s checked, %d failures; reductions at %s: %s" %
          (len({k for _, k in facts}), "/".join(archs), len(errs), archs[-1], ", ".join(red)))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
