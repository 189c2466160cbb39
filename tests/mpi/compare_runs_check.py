#!/usr/bin/env python3
"""compare_runs_check.py RUN/metrics.jsonl: compare_runs.py must fail, naming the step and the
tensor, when one tensor's digest after step 3 differs from an otherwise identical run's, and
naming the step when a validation loss differs."""
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
records = [json.loads(line) for line in open(sys.argv[1])]
step3 = next(r for r in records if r.get("step") == 3 and "params" in r)
tensor = step3["params"][7][0]
last_val = max(r["step"] for r in records if "val_loss" in r)


def damaged(edit):
    out = []
    for r in records:
        r = json.loads(json.dumps(r))
        edit(r)
        out.append(json.dumps(r))
    f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    f.write("\n".join(out) + "\n")
    f.close()
    return f.name


def digest(r):
    if r.get("step") == 3 and "params" in r:
        r["params"][7][1] = "0123456789abcdef"


def val(r):
    if "val_loss" in r:
        r["val_loss"] += 0.5


status = 0
for edit, expect in ((digest, f"step 3: parameters: bytes differ in 1 of "),
                     (digest, f"first {tensor} (digest"),
                     (val, f"step {last_val}: validation loss")):
    path = damaged(edit)
    p = subprocess.run([sys.executable, os.path.join(here, "compare_runs.py"), "0", sys.argv[1],
                        path], capture_output=True, text=True)
    os.unlink(path)
    if p.returncode == 0 or expect not in p.stdout:
        print(f"FAIL: expected a failure naming '{expect}', got rc {p.returncode}:\n{p.stdout}")
        status = 1
if status == 0:
    print("PASS: a differing digest or validation loss fails, naming the first step and tensor")
sys.exit(status)
