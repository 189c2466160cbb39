#!/usr/bin/env python3
"""message_bytes.py "LAUNCH" PIPETRAIN DECK OUTDIR OVERRIDES...: the same layout (pp 2 x tp 2)
at device.precision fp32 and bf16; the comm layer's counters, printed at the end of each run,
must show every rank's pipeline message bytes halved exactly and its tensor-parallel bytes
halved but for the loss's fp32 statistics (the vocabulary-parallel cross-entropy's maxima and
sums, on the last stage's ranks): between 0.50 and 0.51 of fp32's."""
import re
import shlex
import subprocess
import sys

launch, exe, deck, out = sys.argv[1:5]
overrides = sys.argv[5:]


def run(precision):
    cmd = shlex.split(launch) + [exe, deck, f"log.dir={out}/{precision}",
                                 f'device.precision="{precision}"'] + overrides
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {precision} run exited {p.returncode}:\n{p.stdout}{p.stderr}")
    got = {}
    for key, label in (("pp", "pipeline message bytes sent"),
                       ("tp", "tensor-parallel collective bytes sent")):
        m = re.search(label + r", by rank: ([0-9 ]+)\n", p.stdout)
        if not m:
            sys.exit(f"FAIL: the {precision} run did not print '{label}':\n{p.stdout}")
        got[key] = [int(x) for x in m.group(1).split()]
    return got


fp32, bf16 = run("fp32"), run("bf16")
print(f"fp32: {fp32}\nbf16: {bf16}")
status = 0
if any(b * 2 != f for f, b in zip(fp32["pp"], bf16["pp"])) or min(fp32["pp"]) == 0:
    print("FAIL: pipeline message bytes are not exactly half of fp32's on every rank")
    status = 1
ratios = [b / f for f, b in zip(fp32["tp"], bf16["tp"])]
print("tensor-parallel bytes, bf16 / fp32 by rank: " + " ".join(f"{r:.4f}" for r in ratios))
if not all(0.5 <= r <= 0.51 for r in ratios):
    print("FAIL: tensor-parallel bytes at bf16 are not half of fp32's")
    status = 1
if status == 0:
    print("PASS: bf16 halves the pipeline messages and the tensor-parallel collectives")
sys.exit(status)
