#!/usr/bin/env python3
"""memory_predicted.py TOL RUN/metrics.jsonl...: passes when, in every run, the memory model's
estimate (mem_predicted_bytes) is within relative TOL of the measured peak (mem_bytes) at the
last step; prints each run's two numbers."""
import json
import os
import sys

tol = float(sys.argv[1])
bad = 0
for path in sys.argv[2:]:
    last = None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "mem_bytes" in rec:
                last = rec
    if last is None:
        sys.exit(f"FAIL: {path} has no memory metrics")
    meas, pred = last["mem_bytes"], last["mem_predicted_bytes"]
    err = pred / meas - 1.0
    name = os.path.basename(os.path.dirname(path))
    print(f"{name}: measured {meas:.0f}, predicted {pred:.0f} ({100 * err:+.1f}%)")
    bad += abs(err) > tol
if bad:
    sys.exit(f"FAIL: {bad} run(s) predicted outside {100 * tol:.0f}%")
print("PASS")
