#!/usr/bin/env python3
"""Compare the loops of capex's kernels between two sets of CUBINs.

A change meant to cut compile time in cold code (set-up, tails, edge branches)
must leave the hot loops' machine code as it was. This script reads every
kernel's SASS (cuobjdump -sass) in two CUBIN trees written by tests/sass_dump
(<dir>/sm_<arch>/<part>.cubin) and compares the loops kernel by kernel.

Loops: every backward branch's range [target, branch] (as tests/sass_gate.py),
less the end-of-kernel BRA to itself. Each loop is normalised before comparing:
  - no address column; branch targets (BRA, BSSY, CALL) inside the loop
    become offsets from the loop's start, targets outside it (the IEEE
    division's slow-path subroutine, the exit) "OUT"; a CALL's return address
    (a MOV of an address inside the loop) is relative too: a loop that only
    moved within the kernel compares equal;
  - registers are renamed in order of first appearance within the loop, per
    file (R, UR, P, UP, B; RZ/URZ/PT/UPT kept; Rn.64 keeps its pair): a loop
    whose registers were only renumbered compares equal;
  - the scheduling bits of each instruction (stall cycles, yield, read and
    write scoreboards, wait mask, operand reuse flags: bits 105-125 of the
    128-bit encoding, read from cuobjdump's hex column) are kept, scoreboard
    numbers renamed in order of first appearance: the same instructions with
    other stalls or waits do not compare equal.
Everything else (opcodes, modifiers, immediates, constant-bank offsets, i.e.
kernel parameter offsets) must match exactly. A hot loop that differs is
compared a second time by data flow (every definition a new name, each use the
definition it reads): equal there means the same instructions, schedule and
data flow with another register assignment (the allocator reused a register
differently); reported as such, and a failure unless --allow-regalloc.

Hot loops: the main loop the SASS gate picks (most LDG bits per iteration,
innermost only in the multi-tensor kernels), plus every loop whose own body
(less nested loops) holds two or more global loads or stores of 64 or 128 bits
(the vector bodies) or a warp shuffle (the reductions' combine loops); never
the multi-tensor kernels' loop over a block's chunks. The rest (scalar tails,
set-up loops, one-thread bookkeeping, the per-chunk set-up) is cold. Scalar
tails are the whole work of a tensor that is not 16-byte aligned, and the
norm kernels' scalar loops that of rows whose width is not a multiple of 4:
cold for the common case only. Loops are matched between the trees by their
normalised text: every hot loop of BEFORE must appear in AFTER (as many times
as it appeared); changed or removed cold loops are counted.

Usage:
  sass_loops.py BEFORE_DIR AFTER_DIR     compare; exit 1 if a hot loop changed
  sass_loops.py --table DIR              per part and kernel: SASS instructions
                                         in all, in hot loops, in cold loops
                                         (the rest is outside any loop)
  sass_loops.py --self-test               the comparison on hand-made loops
Options: --arch sm_90 (repeatable; default: every sm_* in the trees),
         --verbose (a changed loop's diff), --allow-regalloc.
Typical use: `make sass-loops SASS_BASE=main` (tests/sass.mk).
Needs cuobjdump and nvdisasm on PATH or under build/deps/cuobjdump (`make ci-deps`).
"""
import difflib
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import sass_gate  # noqa: E402  (the gate's parser: main-loop choice, MTA_KERNEL, find_tool)

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[T0-9]+\s+)?[A-Z0-9_.]+[^;]*);\s*/\*\s*0x([0-9a-f]{16})\s*\*/")
HEX2 = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
TOKEN = re.compile(r"\b(UR|R|UP|P|B)(\d+|Z|T)\b")
TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def sass_of(path, cuobjdump):
    """{kernel: [(addr, text, ctrl)]}: text is 'PRED OP ARGS', ctrl the 21 scheduling bits."""
    out = subprocess.run([cuobjdump, "-sass", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if out.returncode != 0:
        sys.exit("sass_loops: cuobjdump -sass %s failed:\n%s" % (path, out.stderr))
    return parse_text(out.stdout)


def parse_text(text):
    """cuobjdump -sass output -> {kernel: [(addr, text, ctrl)]}"""
    funcs, cur, pend = {}, None, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = LINE.search(line)
        if m and cur is not None:
            pend = (int(m.group(1), 16), " ".join(m.group(2).split()))
            continue
        m = HEX2.match(line)
        if m and pend is not None:
            hi = int(m.group(1), 16)
            cur.append((pend[0], pend[1], (hi >> 41) & ((1 << 21) - 1)))
            pend = None
    return funcs


def split(text):
    """'@P0 OP.X a, b' -> (pred, op, args)"""
    pred = ""
    if text.startswith("@"):
        pred, text = text.split(None, 1)
    op, _, args = text.partition(" ")
    return pred, op, args


def loops_of(ins):
    """[(lo, hi)] of the backward branches, less the end-of-kernel BRA to itself"""
    out = []
    for addr, text, _ in ins:
        pred, op, args = split(text)
        if not op.startswith("BRA"):
            continue
        m = re.search(r"(0x[0-9a-f]+)", args)
        if m and int(m.group(1), 16) <= addr:
            if int(m.group(1), 16) == addr and not pred and "P" not in args:
                continue
            out.append((int(m.group(1), 16), addr))
    return out


DEST_PRED = re.compile(r"^!?U?P(\d+|T)$")
STORE_LIKE = ("ST", "RED", "ATOM", "BRA", "BAR", "EXIT", "CALL", "RET", "BSSY", "BSYNC", "WARPSYNC", "NOP",
              "DEPBAR", "MEMBAR", "ERRBAR", "CCTL", "YIELD", "BPT", "REDUX")


def width(op, reg):
    """registers a def of reg by op writes"""
    if reg.startswith(("P", "UP")):
        return 1
    if ".128" in op:
        return 4
    if ".64" in op or op.startswith(("D", "F2F.F64", "I2F.F64", "F2I.F64")) or ".F64" in op or op.startswith("IMAD.WIDE"):
        return 2
    return 1


def normalise(body, flow=False):
    """The loop's instructions as text with renamed registers, relative
    targets, control bits. flow=False: registers renamed by first appearance
    (one name per physical register). flow=True: every definition gets a new
    name and a use names the definition it reads (live-ins by first use): the
    same instructions with the same data flow compare equal even where the
    allocator put a value in another register or reused one differently."""
    lo = body[0][0]
    names = {}
    sb = {}
    cur = {}     # flow: (kind, physical number) -> value name
    count = [0]

    def ren(m):
        kind, num = m.group(1), m.group(2)
        if num in ("Z", "T"):
            return m.group(0)
        key = (kind, int(num))
        if flow:
            if key not in cur:
                cur[key] = "%s_in%d" % (kind.lower(), sum(1 for k in names if k[0] == kind))
                names[key] = 1
            return cur[key]
        if key not in names:
            names[key] = "%s%s" % (kind.lower(), sum(1 for k in names if k[0] == kind))
        return names[key]

    def sbname(n):
        if n not in sb:
            sb[n] = len(sb)
        return sb[n]

    hi = body[-1][0]
    # CALL.REL.NOINC returns to an address a MOV put in a register: the
    # instruction after each CALL in the loop, written relative like targets
    rets = {a + 16 for a, t, _ in body if split(t)[1].startswith("CALL")}

    def target(m):
        t = int(m.group(1), 16)
        # outside the loop (a subroutine: the IEEE division's slow path, the
        # loop's exit): the offset moves with the code around it, not with it
        return "L%+d" % (t - lo) if lo <= t <= hi + 16 else "OUT"

    out = []
    for addr, text, ctrl in body:
        pred, op, args = split(text)
        if op.startswith(("BRA", "BSSY", "BSYNC", "CALL", "SSY", "PBK", "BRX", "JMP")) or op.startswith("WARPSYNC"):
            args = TARGET.sub(target, args)
        elif op.startswith(("MOV", "IMAD.MOV")) and rets:
            args = TARGET.sub(lambda m: "RET%+d" % (int(m.group(1), 16) - lo) if int(m.group(1), 16) in rets
                              else m.group(0), args)
        if not flow:
            # Rn.64 / URn.64 pairs: renaming the first register names the pair
            s = TOKEN.sub(ren, (pred + " " if pred else "") + op + " " + args)
        else:
            ops = [o.strip() for o in args.split(",")] if args.strip() else []
            ndest = 0
            if ops and not op.startswith(STORE_LIKE):
                ndest = 1
                if len(ops) > 2 and DEST_PRED.match(ops[1]) and not ops[1].startswith("!"):
                    ndest = 2
            srcs = [TOKEN.sub(ren, o) for o in ops[ndest:]]
            p = TOKEN.sub(ren, pred) if pred else ""
            dests = []
            for o in ops[:ndest]:
                m = TOKEN.match(o)
                if not m or m.group(2) in ("Z", "T"):
                    dests.append(o)
                    continue
                key = (m.group(1), int(m.group(2)))
                count[0] += 1
                name = "%s_%d" % (m.group(1).lower(), count[0])
                # a predicated def may leave the old value: keep it visible
                if pred and key in cur:
                    name += "|" + cur[key]
                for j in range(width(op, m.group(1))):
                    cur[(key[0], key[1] + j)] = name if j == 0 else "%s.%d" % (name.split("|")[0], j)
                dests.append(name + o[m.end():])
            s = ((p + " ") if p else "") + op + " " + ", ".join(dests + srcs)
        stall, yld = ctrl & 0xF, (ctrl >> 4) & 1
        wb, rb, wait, reuse = (ctrl >> 5) & 7, (ctrl >> 8) & 7, (ctrl >> 11) & 0x3F, (ctrl >> 17) & 0xF
        wbs = "-" if wb == 7 else "w%d" % sbname(wb)
        rbs = "-" if rb == 7 else "r%d" % sbname(rb)
        waits = "".join(str(sbname(i)) for i in range(6) if wait >> i & 1)
        out.append("%s  ; S%d Y%d %s %s W[%s] U%x" % (s, stall, yld, wbs, rbs, waits, reuse))
    return tuple(out)


def is_hot(body, main):
    """main loop, or own instructions (body less nested loops) with two or more
    64/128-bit global accesses (a vector body; one is often a group's two
    floats, reloaded in a scalar tail) or a shuffle"""
    if main:
        return True
    vec = 0
    for _, text, _ in body:
        _, op, _ = split(text)
        if op.startswith(("LDG", "STG")) and (".64" in op or ".128" in op):
            vec += 1
        if op.startswith("SHFL"):
            return True
    return vec >= 2


def kernel_loops(name, ins):
    """[(lo, hi, hot, normalised, normalised by data flow)] for every loop of the kernel."""
    gate_ins = []
    for addr, text, _ in ins:
        _, op, args = split(text)
        gate_ins.append((addr, op, args))
    innermost = bool(sass_gate.MTA_KERNEL.match(name))
    facts = sass_gate.loop_facts(gate_ins, innermost=innermost)
    loops = loops_of(ins)
    # the gate's main loop: first with the most LDG bits (innermost for MTA kernels)
    main, best = None, 0
    for lo, hi in loops:
        if innermost and any(lo <= lo2 and hi2 <= hi and (lo2, hi2) != (lo, hi) for lo2, hi2 in loops):
            continue
        bits = sum(sass_gate.ldg_bits(op) for a, op, _ in gate_ins if lo <= a <= hi and op.startswith("LDG"))
        if bits > best:
            main, best = (lo, hi), bits
    assert facts["vec"] == 0 or main is not None
    out = []
    for lo, hi in loops:
        body = [i for i in ins if lo <= i[0] <= hi]
        inner = [(l2, h2) for l2, h2 in loops if lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi)]
        own = [i for i in body if not any(l2 <= i[0] <= h2 for l2, h2 in inner)]
        # multi-tensor kernels: the loop over a block's chunks holds the element loops; it is set-up
        hot = is_hot(own, (lo, hi) == main) and not (innermost and inner)
        out.append((lo, hi, hot, normalise(body), normalise(body, flow=True)))
    return out


def size(ins):
    """instructions up to the trailing BRA-to-self and NOP padding"""
    n = len(ins)
    while n and split(ins[n - 1][1])[1] in ("NOP",):
        n -= 1
    if n and split(ins[n - 1][1])[1] == "BRA":
        n -= 1
    return n


def collect(root, archs, cuobjdump):
    """{(arch, part, kernel): (n_ins, loops)}"""
    res = {}
    for arch in sorted(os.listdir(root)):
        d = os.path.join(root, arch)
        if not arch.startswith("sm_") or not os.path.isdir(d) or (archs and arch not in archs):
            continue
        for f in sorted(os.listdir(d)):
            if not f.endswith(".cubin"):
                continue
            for k, ins in sass_of(os.path.join(d, f), cuobjdump).items():
                res[(arch, f[:-6], k)] = (size(ins), kernel_loops(k, ins))
    return res


def covered(loops, hot):
    """instructions whose innermost enclosing loop is hot (hot=True) or cold"""
    n = 0
    addrs = set()
    for lo, hi, _, _, _ in loops:
        addrs.update(range(lo, hi + 16, 16))
    for a in addrs:
        inner = min((l for l in loops if l[0] <= a <= l[1]), key=lambda l: l[1] - l[0])
        n += inner[2] == hot
    return n


def table(root, archs, cuobjdump):
    res = collect(root, archs, cuobjdump)
    print("%-6s %-13s %-34s %6s %5s %5s %5s %6s" % ("arch", "part", "kernel", "ins", "hot", "cold", "loops", "hot%"))
    tot = {}
    for (arch, part, k), (n, loops) in sorted(res.items()):
        h, c = covered(loops, True), covered(loops, False)
        print("%-6s %-13s %-34s %6d %5d %5d %5d %5.1f%%" % (arch, part, k, n, h, c, len(loops), 100.0 * h / max(n, 1)))
        t = tot.setdefault((arch, part), [0, 0, 0, 0])
        t[0] += n
        t[1] += h
        t[2] += c
        t[3] += 1
    print()
    print("%-6s %-13s %7s %6s %6s %6s %6s" % ("arch", "part", "kernels", "ins", "hot", "cold", "hot%"))
    for arch in sorted({a for a, _ in tot}):
        s = [0, 0, 0, 0]
        for (a, part), t in sorted(tot.items()):
            if a != arch:
                continue
            print("%-6s %-13s %7d %6d %6d %6d %5.1f%%" % (a, part, t[3], t[0], t[1], t[2], 100.0 * t[1] / max(t[0], 1)))
            s = [x + y for x, y in zip(s, t)]
        print("%-6s %-13s %7d %6d %6d %6d %5.1f%%" % (arch, "ALL", s[3], s[0], s[1], s[2], 100.0 * s[1] / max(s[0], 1)))


def compare(before, after, archs, cuobjdump, verbose, allow_flow):
    b = collect(before, archs, cuobjdump)
    a = collect(after, archs, cuobjdump)
    bad = n_same = n_flow = n_cold_changed = 0
    ins_b = ins_a = 0
    for key in sorted(set(b) | set(a)):
        arch, part, k = key
        if key not in a or key not in b:
            print("%s %s %s: kernel %s" % (arch, part, k, "missing after" if key in b else "new"))
            bad += key in b
            continue
        (nb, lb), (na, la) = b[key], a[key]
        ins_b += nb
        ins_a += na
        left = [l[3] for l in la]
        left_flow = [l[4] for l in la]
        changed, flow_only = [], []
        for lo, hi, hot, norm, flow in lb:
            if norm in left:
                i = left.index(norm)
                del left[i], left_flow[i]
                n_same += hot
            elif hot and flow in left_flow:
                i = left_flow.index(flow)
                del left[i], left_flow[i]
                flow_only.append((lo, hi))
            elif hot:
                changed.append((lo, hi, norm))
            else:
                n_cold_changed += 1
        note = "" if nb == na else " (%d -> %d instructions)" % (nb, na)
        n_flow += len(flow_only)
        bad += len(changed) + (0 if allow_flow else len(flow_only))
        for lo, hi in flow_only:
            print("%s %s %s: hot loop [%#x, %#x] has the same instructions, schedule and data flow, "
                  "other register assignment%s" % (arch, part, k, lo, hi, note))
        for lo, hi, norm in changed:
            print("%s %s %s: hot loop [%#x, %#x] (%d instructions) changed%s" % (arch, part, k, lo, hi, len(norm), note))
            if verbose:
                best = max(la, key=lambda l: difflib.SequenceMatcher(None, norm, l[3]).ratio())
                print("    " + "\n    ".join(difflib.unified_diff(norm, best[3], "before", "after", lineterm="", n=1)))
        if not changed and not flow_only and (nb != na or len(lb) != len(la)):
            print("%s %s %s: hot loops identical; %d -> %d loops%s" % (arch, part, k, len(lb), len(la), note))
    print("sass_loops: %d hot loops identical, %d identical but for register assignment, %d changed; "
          "%d cold loops changed or gone; instructions %d -> %d (%+.1f%%)"
          % (n_same, n_flow, bad - (0 if allow_flow else n_flow), n_cold_changed, ins_b, ins_a,
             100.0 * (ins_a - ins_b) / max(ins_b, 1)))
    return 1 if bad else 0


def _sass(lines):
    """hand-made cuobjdump text: (addr, instruction, control bits) per line"""
    out = ["\t\tFunction : k"]
    for addr, ins, ctrl in lines:
        out.append("        /*%04x*/                   %s ;  /* 0x0000000000000000 */" % (addr, ins))
        out.append("                                                 /* 0x%016x */" % (ctrl << 41))
    return "\n".join(out)


def self_test():
    """the comparison on hand-made loops, no tools needed: exit 1 on a mismatch"""
    s4 = 0x4 | (7 << 5) | (7 << 8)  # stall 4, no scoreboards
    base = [(0x0, "LDG.E.128 R4, desc[UR4][R2.64]", s4), (0x10, "LDG.E.128 R8, desc[UR4][R12.64]", s4),
            (0x20, "FADD R16, R4, R8", s4), (0x30, "STG.E.128 desc[UR4][R14.64], R16", s4),
            (0x40, "@!P0 BRA 0x0", s4)]
    moved = [(a + 0x100, t.replace("0x0", "0x100") if "BRA" in t else t.replace("R16", "R20"), c) for a, t, c in base]
    stall = [(a, t, (c & ~0xF) | 5 if "FADD" in t else c) for a, t, c in base]
    other = [(a, t.replace("FADD", "FMUL"), c) for a, t, c in base]
    # R4 reused for the sum: same data flow, another assignment
    regalloc = [(a, t.replace("FADD R16, R4, R8", "FADD R4, R4, R8").replace("], R16", "], R4"), c) for a, t, c in base]
    cases = [(moved, "same"), (stall, "changed"), (other, "changed"), (regalloc, "regalloc")]
    bad = 0
    b = kernel_loops("k", parse_text(_sass(base))["k"])
    for lines, want in cases:
        a = kernel_loops("k", parse_text(_sass(lines))["k"])
        got = "same" if a[0][3] == b[0][3] else "regalloc" if a[0][4] == b[0][4] else "changed"
        if got != want or not b[0][2]:
            print("sass_loops self-test: FAIL: %s, want %s (hot %s)\n%s" % (got, want, b[0][2], _sass(lines)))
            bad += 1
    print("sass_loops self-test: %d/%d loop pairs compared as expected" % (len(cases) - bad, len(cases)))
    return 1 if bad else 0


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    archs, verbose, tab, allow_flow = [], False, False, False
    rest = []
    i = 0
    while i < len(args):
        if args[i] == "--arch" and i + 1 < len(args):
            archs.append(args[i + 1])
            i += 2
            continue
        if args[i] == "--verbose":
            verbose = True
        elif args[i] == "--allow-regalloc":
            allow_flow = True
        elif args[i] == "--table":
            tab = True
        else:
            rest.append(args[i])
        i += 1
    cuobjdump = sass_gate.find_tool()
    if not cuobjdump:
        sys.exit("sass_loops: cuobjdump/nvdisasm not found (make ci-deps)")
    if tab and len(rest) == 1:
        table(rest[0], archs, cuobjdump)
        return 0
    if not tab and len(rest) == 2:
        return compare(rest[0], rest[1], archs, cuobjdump, verbose, allow_flow)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
