#!/usr/bin/env python3
"""memory_bf16.py PIPETRAIN DECK OUTDIR OVERRIDES...: a deck whose memory is mostly activations
(OVERRIDES: 512 tokens, micro-batch 8) at device.precision fp32 and bf16. The measured peak
(mem_bytes) at bf16 must be at most 0.65x fp32's, and the memory model (mem_predicted_bytes)
within 10% of the measured peak at both."""
import json
import subprocess
import sys

exe, deck, out = sys.argv[1:4]
overrides = sys.argv[4:]


def peak(precision):
    d = f"{out}/{precision}"
    subprocess.run(["rm", "-rf", d], check=True)
    p = subprocess.run([exe, deck, f"log.dir={d}", f'device.precision="{precision}"'] + overrides,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: the {precision} run exited {p.returncode}:\n{p.stdout}{p.stderr}")
    recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"mem_bytes"' in l]
    return recs[-1]["mem_bytes"], recs[-1]["mem_predicted_bytes"]


status = 0
(m32, p32), (m16, p16) = peak("fp32"), peak("bf16")
for name, m, p in (("fp32", m32, p32), ("bf16", m16, p16)):
    print(f"{name}: measured {m / 2**20:.1f} MiB, predicted {p / 2**20:.1f} MiB "
          f"({p / m - 1:+.1%})")
    if abs(p / m - 1) > 0.10:
        print(f"FAIL: the memory model is off by more than 10% at {name}")
        status = 1
print(f"bf16 / fp32 measured peak: {m16 / m32:.3f} (at most 0.65)")
if m16 > 0.65 * m32:
    print("FAIL: bf16 does not cut the activation-bound peak to 0.65x")
    status = 1
if status == 0:
    print("PASS")
sys.exit(status)
