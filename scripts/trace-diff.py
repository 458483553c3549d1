#!/usr/bin/env python3
"""Compare the traced intermediates of two runs (crates/core/src/trace.rs output with
QUARREL_TRACE=all,row=<width>, runs separated by `=== <name>` lines, as
crates/backend-cuda/examples/numerics_compare.rs prints them): per traced op (name-layer) the
largest relative difference of a row's sum of squares, token by token. A prefill run's rows are
its tokens; a decode run's k-th occurrence of an op is token k.

    scripts/trace-diff.py LOG "cpu prefill" "gpu prefill" [threshold]
"""
import sys, re
from collections import OrderedDict

def runs(path):
    out, cur = {}, None
    for line in open(path, errors="replace"):
        if line.startswith("=== "):
            cur = line[4:].strip(); out[cur] = []
        elif cur and line.startswith("row "):
            f = line.split()
            out[cur].append((f[1], int(f[2]), float(f[3]), float(f[4])))
    return out

def table(rows, decode):
    t, seen = OrderedDict(), {}
    for key, r, s, q in rows:
        if decode:
            if r == 0:
                seen[key] = seen.get(key, -1) + 1
            tok = seen[key]
        else:
            tok = r
        t.setdefault(key, {})[tok] = (s, q)
    return t

def main():
    log, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
    thr = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-6
    R = runs(log)
    ta, tb = table(R[a], "decode" in a), table(R[b], "decode" in b)
    first = None
    for key, rows in ta.items():
        if key not in tb:
            continue
        worst, wt = 0.0, None
        for tok, (s, q) in rows.items():
            if tok in tb[key]:
                q2 = tb[key][tok][1]
                d = abs(q - q2) / max(abs(q), 1e-30)
                if d > worst:
                    worst, wt = d, tok
        flag = " <==" if worst > thr and first is None else ""
        if worst > thr and first is None:
            first = key
        print(f"{key:>22}  worst rel diff of row sq {worst:.2e} at token {wt}{flag}")
    print(f"first op beyond {thr:g}: {first}")

main()
