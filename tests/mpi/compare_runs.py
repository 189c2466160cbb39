#!/usr/bin/env python3
"""compare_runs.py TOL A/metrics.jsonl B/metrics.jsonl
Passes when both runs logged the same steps and every step's loss agrees to relative TOL."""
import json
import sys

tol = float(sys.argv[1])


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                out[rec["step"]] = rec["loss"]
    return out


a, b = losses(sys.argv[2]), losses(sys.argv[3])
if not a or sorted(a) != sorted(b):
    sys.exit(f"FAIL: steps differ: {sorted(a)[:5]}... vs {sorted(b)[:5]}...")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
for s in sorted(a):
    print(f"step {s:3d}  {a[s]:.6f}  {b[s]:.6f}")
print(f"worst relative difference {worst:.2e} (tolerance {tol:.0e}) over {len(a)} steps")
if a[max(a)] >= a[min(a)]:
    sys.exit("FAIL: the loss did not fall, so agreement proves little")
sys.exit(0 if worst <= tol else 1)
