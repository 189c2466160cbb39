#!/usr/bin/env python3
"""two_bw_delay.py TWO_BW FIXED ONE_F_ONE_B (metrics.jsonl of single-rank runs of one deck: with
parallel.schedule = "2bw"; with 1f1b and a learning rate of 1e-30, whose updates stay below float
resolution (biases at 0 move to about 1e-30); with 1f1b): the trainer follows 2bw's rule, step t
computing with W(max(t-1, 0)). Steps 1 and 2 of 2bw compute with W(0): their losses equal those
of the run whose weights do not move (within 1e-6), while 1f1b's step 2, with W(1), differs by
far more (over 1e-4)."""
import json
import sys


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]


two_bw, fixed, plain = (losses(p) for p in sys.argv[1:4])
print("2bw   ", two_bw[:3])
print("fixed ", fixed[:3])
print("1f1b  ", plain[:3])
def rel(a, b):
    return abs(a - b) / abs(b)


ok = (two_bw[0] == plain[0] and rel(two_bw[0], fixed[0]) < 1e-6 and
      rel(two_bw[1], fixed[1]) < 1e-6 and rel(two_bw[1], plain[1]) > 1e-4)
sys.exit("FAIL: 2bw does not compute steps 1 and 2 with W(0)" if not ok else print("PASS"))
