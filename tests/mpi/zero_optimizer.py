#!/usr/bin/env python3
"""zero_optimizer.py "MPIEXEC -n 4 ..." PIPETRAIN DECK OVERRIDES...: the memory model's optimizer
state per rank (the plan's "optimizer" column, pipetrain --validate) with parallel.zero = 1 is the
zero = 0 state divided by dp, at dp = 2 and 4 (4 ranks: dp 2 runs with pp 2)."""
import re
import subprocess
import sys

launch = sys.argv[1].replace(";", " ").split()  # CMake hands a list
exe, deck, rest = sys.argv[2], sys.argv[3], sys.argv[4:]


def optimizer_mib(pp, dp, zero):
    args = launch + [exe, deck, *rest, f"parallel.pp={pp}", f"parallel.dp={dp}",
                     f"parallel.zero={zero}", "--validate"]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    rows = re.findall(r"^ +0 +([0-9.]+) +([0-9.]+) ", out, re.M)
    if not rows:
        sys.exit(f"FAIL: no memory table in:\n{out}")
    return float(rows[-1][1])  # pp rank 0's optimizer column


bad = 0
for pp, dp in ((2, 2), (1, 4)):
    full, shard = optimizer_mib(pp, dp, 0), optimizer_mib(pp, dp, 1)
    ratio = full / shard
    print(f"pp {pp} dp {dp}: optimizer {full:.2f} MiB per rank, ZeRO-1 {shard:.2f} MiB "
          f"(1/{ratio:.2f})")
    bad += abs(ratio - dp) > 0.05 * dp
sys.exit("FAIL: ZeRO-1's optimizer state is not the whole divided by dp" if bad else print("PASS"))
