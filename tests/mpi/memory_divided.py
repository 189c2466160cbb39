#!/usr/bin/env python3
"""memory_divided.py MODE "MPIEXEC -n 4 ..." PIPETRAIN DECK OVERRIDES...: a column of the memory
model's table (pipetrain --validate, pp rank 0) divided as the layout promises, on 4 ranks.
  zero: the optimizer state with parallel.zero = 1 is the zero = 0 state divided by dp, at
        dp = 2 (with pp = 2) and dp = 4;
  sp:   the activations with parallel.sequence_parallel = true at tp = 2 and 4 are those of
        tp = 1 divided by tp (the deck needs n_head divisible by 4).
memory.predicted checks the same model against measured memory."""
import re
import subprocess
import sys

mode = sys.argv[1]
launch = sys.argv[2].replace(";", " ").split()  # CMake hands a list
exe, deck, rest = sys.argv[3], sys.argv[4], sys.argv[5:]
COLUMNS = {"params": 0, "optimizer": 1, "activations": 2}


def column(name, overrides):
    args = launch + [exe, deck, *rest, *overrides, "--validate"]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    rows = re.findall(r"^ +0 +([0-9.]+) +([0-9.]+) +([0-9.]+) ", out, re.M)
    if not rows:
        sys.exit(f"FAIL: no memory table in:\n{out}")
    return float(rows[-1][COLUMNS[name]])


if mode == "zero":
    cases = [(f"pp {pp} dp {dp}", "optimizer", dp,
              [f"parallel.pp={pp}", f"parallel.dp={dp}", "parallel.zero=0"],
              [f"parallel.pp={pp}", f"parallel.dp={dp}", "parallel.zero=1"])
             for pp, dp in ((2, 2), (1, 4))]
elif mode == "sp":
    cases = [(f"tp {tp}", "activations", tp, ["parallel.tp=1", "parallel.dp=4"],
              [f"parallel.tp={tp}", f"parallel.dp={4 // tp}", "parallel.sequence_parallel=true"])
             for tp in (2, 4)]
else:
    sys.exit(f"FAIL: unknown mode {mode}")

bad = 0
for label, name, divisor, whole_args, split_args in cases:
    whole, split = column(name, whole_args), column(name, split_args)
    ratio = whole / split
    print(f"{label}: {name} {whole:.3f} MiB per rank, {mode} {split:.3f} MiB (1/{ratio:.2f})")
    bad += abs(ratio - divisor) > 0.1 * divisor
sys.exit(f"FAIL: the {mode} column is not divided as promised" if bad else print("PASS"))
