#!/usr/bin/env python3
"""Merge gcov JSON of every .gcno/.gcda under the build dirs into one line/branch report for a header.
Usage: cov_merge.py HEADER BUILD_DIR... [--uncovered OUT.txt]
Tests are built without CAPEX_STATIC so every TU has every function: same denominators."""
import gzip, json, os, subprocess, sys, collections

def main():
    args = [a for i, a in enumerate(sys.argv[1:], 1) if a != '--uncovered' and sys.argv[i - 1] != '--uncovered']
    header, builds = args[0], args[1:]
    out = sys.argv[sys.argv.index('--uncovered') + 1] if '--uncovered' in sys.argv else None
    lines = {}                      # line -> max count
    branches = collections.defaultdict(dict)  # line -> {idx: count}
    fn_of = {}
    for root, _, files in (w for b in builds for w in os.walk(b)):
        for f in files:
            if not f.endswith('.gcno'):
                continue
            r = subprocess.run(['gcov', '--json-format', '--stdout', '-b', os.path.abspath(os.path.join(root, f))],
                               capture_output=True, cwd=os.path.abspath(root))
            for doc in r.stdout.decode().splitlines():
                if not doc.strip():
                    continue
                d = json.loads(doc)
                for fi in d['files']:
                    if not fi['file'].endswith(header):
                        continue
                    for ln in fi['lines']:
                        n = ln['line_number']
                        lines[n] = max(lines.get(n, 0), ln['count'])
                        fn_of[n] = ln.get('function_name', '')
                        for i, b in enumerate(ln.get('branches', [])):
                            bd = branches[n]
                            bd[i] = max(bd.get(i, 0), b['count'])
    lt = len(lines); lc = sum(1 for c in lines.values() if c > 0)
    bt = sum(len(v) for v in branches.values()); bc = sum(1 for v in branches.values() for c in v.values() if c > 0)
    print(f'{header}: lines {lc}/{lt} = {100.0*lc/max(lt,1):.2f}%  branches {bc}/{bt} = {100.0*bc/max(bt,1):.2f}%')
    if out:
        src = open(header).read().split('\n')
        with open(out, 'w') as o:
            for n in sorted(lines):
                c = lines[n]
                b = branches.get(n, {})
                bmiss = sum(1 for x in b.values() if x == 0)
                if c == 0 or bmiss:
                    tag = '#####' if c == 0 else ''.join('1' if b[i] else '0' for i in sorted(b))
                    o.write(f'{n:6d} {tag:>10} {src[n-1]}\n')
main()
