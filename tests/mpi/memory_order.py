#!/usr/bin/env python3
"""memory_order.py NONE SELECTIVE FULL (metrics.jsonl of the same run with train.recompute =
none, selective, full): passes when the measured memory of the last step is strictly ordered
none > selective > full, and prints the three numbers."""
import json
import sys


def mem(path):
    last = None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "mem_bytes" in rec:
                last = rec["mem_bytes"]
    if last is None:
        sys.exit(f"FAIL: {path} has no mem_bytes")
    return last


none, sel, full = (mem(p) for p in sys.argv[1:4])
print(f"mem_bytes: none {none:.0f}, selective {sel:.0f}, full {full:.0f}")
if not none > sel > full:
    sys.exit("FAIL: memory is not ordered none > selective > full")
print("PASS")
