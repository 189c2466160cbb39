"""tools/study on a small sweep: 1 and 2 stages run here, 4 stages predicted; the CSV has every
point with its source, the measured points their per-stage compute and memory, and the three
charts are written. Usage: study_check.py ROOT BUILD DATA OUT"""
import csv
import os
import subprocess
import sys

root, build, data, out = sys.argv[1:5]
cmd = [os.path.join(root, "tools", "study"), "--deck", os.path.join(root, "inputs", "tiny-ci.toml"),
       "--stages", "1,2,4", "--partitions", "uniform,params", "--schedules", "1f1b,gpipe",
       "--micro-batches", "4", "--micro-batch", "2", "--steps", "3", "--skip", "1",
       "--ranks", "2", "--build", build, "--out", out, f"data.path={data}", "model.n_layer=4"]
r = subprocess.run(cmd, capture_output=True, text=True)
print(r.stdout, r.stderr)
if r.returncode != 0:
    sys.exit(f"FAIL: tools/study exited {r.returncode}")
rows = list(csv.DictReader(open(os.path.join(out, "study.csv"))))
if len(rows) != 3 * 2 * 2:
    sys.exit(f"FAIL: {len(rows)} points, expected 12")
for row in rows:
    s = int(row["stages"])
    want = "measured" if s <= 2 else "predicted"
    if row["source"] != want:
        sys.exit(f"FAIL: {row}: source {row['source']}, expected {want}")
    if not float(row["tokens_per_s"]) > 0 or not 0 <= float(row["bubble"]) < 1:
        sys.exit(f"FAIL: {row}: tokens/s or bubble out of range")
    if want == "measured":
        comp = row["stage_compute_s"].split(";")
        mem = row["stage_mem_mib"].split(";")
        if len(comp) != s or len(mem) != s or min(float(x) for x in comp) <= 0:
            sys.exit(f"FAIL: {row}: per-stage compute or memory missing")
for png in ("tokens.png", "bubble.png", "stages.png"):
    path = os.path.join(out, png)
    if not os.path.exists(path) or os.path.getsize(path) < 1000:
        sys.exit(f"FAIL: {png} not written")
print("PASS: 12 points (8 measured, 4 predicted) and 3 charts")
