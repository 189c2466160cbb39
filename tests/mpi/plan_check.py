#!/usr/bin/env python3
"""plan_check.py PIPETRAIN ROOT [RANKS]: `pipetrain plan` on one process (docs/design.md section
10).
- gpt2-350m on RANKS A100s (default 64, 8 per node; the sanitizer build plans 16): --json parses, every row has the documented keys, fitting
  rows come first and are sorted by predicted step time, the best fits 80 GiB per rank, and the
  table form prints the best row's overrides;
- fixing parallel.tp=2 parallel.pp=2 on the command line leaves only such rows;
- --search ranks schedule "search" beside the named ones, never slower than 1F1B or ZB-H1 on the
  same layout (its budget, 1F1B's memory, admits both);
- a machine file without a key is refused with exit 2 naming it;
- llama-1b plans on 16 ranks, tensor-parallel degrees dividing its 8 key/value heads among them;
- every shipped machine file (inputs/machines) plans gpt2-350m on 8 ranks;
- ranks x threads (--nodes 2 --cores-per-node 24, tianhe.toml): every threads count dividing 24
  appears, with 48 / threads ranks each, and the best overrides name device.threads; a fixed
  device.threads keeps only that count; dp 2 at 12 threads a rank is predicted faster than at one
  thread by the machine.thread_speedup set for 12 (all but the all-reduce); a bad thread_speedup
  is refused with exit 2;
- `pipetrain-bench gemm` prints 8 machine-file rows for --sizes 64,128; a machine file with them
  plans, and the same rates doubled predict a step under 0.75 of it;
- mixtral-tiny on 8 ranks: ep 1, 2, 4, 8 layouts, ep 8 lighter and slower than ep 1."""
import json
import os
import subprocess
import sys
import tempfile

exe, root = sys.argv[1], sys.argv[2]
ranks = sys.argv[3] if len(sys.argv) > 3 else "64"
deck = os.path.join(root, "inputs", "gpt2-350m.toml")
a100 = os.path.join(root, "inputs", "machines", "a100-dgx.toml")
KEYS = ("pp dp tp virtual_stages schedule micro_batch recompute zero sequence_parallel step_time_s "
        "tokens_per_s tflops_per_rank mfu bubble mem_bytes_per_rank fits").split()
bad = []


def plan(*args):
    return subprocess.run([exe, "plan", deck, *args], capture_output=True, text=True)


out = plan("--ranks", ranks, "--ranks-per-node", "8", "--machine", a100, "--json", "--top", "1000")
rows = json.loads(out.stdout)
print(f"{len(rows)} layouts of gpt2-350m on {ranks} ranks")
if not rows or any(set(KEYS) - set(r) for r in rows):
    bad.append("rows missing or keys missing")
order = [(not r["fits"], r["step_time_s"]) for r in rows]
if order != sorted(order):
    bad.append("rows are not ranked (fitting first, then by step time)")
if rows and (not rows[0]["fits"] or rows[0]["mem_bytes_per_rank"] > 0.9 * 80 * 2**30):
    bad.append("the best row does not fit 80 GiB")
if rows and any(r["pp"] * r["dp"] * r["tp"] != int(ranks) for r in rows):
    bad.append(f"a row does not use {ranks} ranks")
table = plan("--ranks", ranks, "--ranks-per-node", "8", "--machine", a100)
if table.returncode != 0 or "best: parallel.pp=" not in table.stdout:
    bad.append("the table form does not print the best overrides")
print(table.stdout.splitlines()[2] if table.returncode == 0 else table.stderr)
fixed = json.loads(plan("parallel.tp=2", "parallel.pp=2", "--ranks", ranks, "--machine", a100,
                        "--json").stdout)
if not fixed or any(r["tp"] != 2 or r["pp"] != 2 for r in fixed):
    bad.append("fixed tp 2 x pp 2 gave other layouts")
searched = json.loads(plan("parallel.pp=4", "train.micro_batch=4", "--ranks", "8", "--machine",
                           a100, "--json", "--top", "1000", "--search").stdout)
key = lambda r: tuple(r[k] for k in "dp tp recompute zero sequence_parallel".split())
found = {key(r): r["step_time_s"] for r in searched if r["schedule"] == "search"}
named = [r for r in searched if r["schedule"] in ("1f1b", "zb-h1")]
print(f"--search: {len(found)} search rows of {len(searched)}")
if not found or any(r["pp"] != 4 for r in searched):
    bad.append("--search gave no search rows")
if any(found[key(r)] > r["step_time_s"] * (1 + 1e-9) for r in named if key(r) in found):
    bad.append("a search row is slower than 1f1b or zb-h1 on the same layout")
# llama: the 1B deck plans (its FLOPs and memory per docs/models.md), tp within n_kv_head's divisors
llama = json.loads(subprocess.run([exe, "plan", os.path.join(root, "inputs", "llama-1b.toml"),
                                   "--ranks", "16", "--machine", a100, "--json", "--top", "1000"],
                                  capture_output=True, text=True).stdout or "[]")
print(f"llama-1b on 16 ranks: {len(llama)} layouts")
if not llama or any(8 % r["tp"] for r in llama) or not any(r["tp"] > 1 for r in llama):
    bad.append("llama-1b: no layouts, or a tp that does not divide its 8 key/value heads")
with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
    f.write(open(a100).read().replace("memory_gib", "memory_gb"))
broken = plan("--ranks", "8", "--machine", f.name)
if broken.returncode != 2 or "machine.memory_gib is missing" not in broken.stderr:
    bad.append(f"a broken machine file gave exit {broken.returncode}: {broken.stderr.strip()}")
os.unlink(f.name)
machines = os.path.join(root, "inputs", "machines")
for name in sorted(os.listdir(machines)):
    r = plan("--ranks", "8", "--machine", os.path.join(machines, name), "--json")
    if r.returncode != 0 or not json.loads(r.stdout):
        bad.append(f"machine file {name}: exit {r.returncode} {r.stderr.strip()}")
    else:
        print(f"{name}: {len(json.loads(r.stdout))} layouts")
tianhe = os.path.join(machines, "tianhe.toml")
hybrid = plan("--nodes", "2", "--cores-per-node", "24", "--machine", tianhe, "--json", "--top",
              "100000")
hrows = json.loads(hybrid.stdout or "[]")
threads = sorted({r["threads"] for r in hrows})
print(f"ranks x threads on 2 x 24 cores: {len(hrows)} layouts, threads {threads}")
if threads != [1, 2, 3, 4, 6, 8, 12, 24]:
    bad.append(f"--cores-per-node 24 planned threads {threads}")
if any(r["pp"] * r["dp"] * r["tp"] * r["threads"] != 48 for r in hrows):
    bad.append("a ranks x threads row does not use 48 cores")
best = plan("--nodes", "2", "--cores-per-node", "24", "--machine", tianhe)
if best.returncode != 0 or "device.threads=" not in best.stdout:
    bad.append("the ranks x threads table does not name device.threads in the best overrides")
fixed_t = json.loads(plan("device.threads=6", "--nodes", "2", "--cores-per-node", "24",
                          "--machine", tianhe, "--json", "--top", "1000").stdout or "[]")
if not fixed_t or any(r["threads"] != 6 for r in fixed_t):
    bad.append("device.threads=6 on the command line gave other thread counts")
# the same dp 2 layout as 2 ranks x 12 threads and as 2 ranks x 1 thread (a node of 2 cores
# made of the same machine): 12 threads are faster by the file's speedup at 12
with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
    f.write(open(tianhe).read().replace("ranks_per_node = 24",
                                        "ranks_per_node = 24\nthread_speedup = [[1, 1.0], [12, 9.0]]"))
key = ["parallel.pp=1", "parallel.tp=1", "train.micro_batch=1", "train.recompute=\"none\"",
       "parallel.zero=0"]
t12 = json.loads(plan(*key, "device.threads=12", "--nodes", "1", "--cores-per-node", "24",
                      "--machine", f.name, "--json").stdout or "[]")
t1 = json.loads(plan(*key, "--ranks", "2", "--machine", f.name, "--json").stdout or "[]")
if not t12 or not t1 or t12[0]["dp"] != 2:
    bad.append("the 2 x 12 threads and 2 x 1 thread plans are missing")
else:
    ratio = t1[0]["step_time_s"] / t12[0]["step_time_s"]
    print(f"dp 2 at 12 threads a rank: {ratio:.2f}x the step rate of 1 thread (speedup 9 set)")
    if not 7.0 < ratio <= 9.0 + 1e-9:
        bad.append(f"12 threads at speedup 9 gave {ratio:.2f}x")
with open(f.name, "w") as g:
    g.write(open(tianhe).read().replace("ranks_per_node = 24",
                                        "ranks_per_node = 24\nthread_speedup = [[2, 1.9]]"))
refused = plan("--nodes", "1", "--cores-per-node", "24", "--machine", f.name)
if refused.returncode != 2 or "thread_speedup" not in refused.stderr:
    bad.append(f"a thread_speedup not starting at 1 gave exit {refused.returncode}")
os.unlink(f.name)
# GEMM rates by shape: `pipetrain-bench gemm` writes the rows (every m, n, k of --sizes) that a
# machine file takes; the planner reads them, and the same table at twice the rates predicts a
# faster step (the products dominate this layout's step; attention and all-reduces do not scale)
bench = os.path.join(os.path.dirname(exe), "pipetrain-bench")
out = subprocess.run([bench, "gemm", "--sizes", "64,128", "--seconds", "0.01"],
                     capture_output=True, text=True)
table = out.stdout[out.stdout.find("gemm = ["):]
rates = [float(r.split("]")[0].split(",")[3]) for r in table.split("[")[2:]]
print(f"pipetrain-bench gemm: {len(rates)} rows")
if out.returncode != 0 or len(rates) != 8 or min(rates, default=0) <= 0:
    bad.append(f"pipetrain-bench gemm --sizes 64,128 gave {len(rates)} rows, exit {out.returncode}")
else:
    host = open(os.path.join(root, "inputs", "machines", "dev-host.toml")).read()
    steps = []
    for scale in (1, 2):
        doubled = "gemm = [" + ", ".join(
            "[" + ", ".join(r.split("]")[0].split(",")[:3]) + f", {x * scale}]"
            for r, x in zip(table.split("[")[2:], rates)) + "]"
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(host.replace("[machine]\n", "[machine]\n" + doubled + "\n"))
        rows = json.loads(plan("parallel.pp=1", "parallel.tp=1", "train.micro_batch=1",
                               'train.recompute="none"', "parallel.zero=0", "--ranks", "8",
                               "--machine", f.name, "--json").stdout or "[]")
        os.unlink(f.name)
        steps.append(rows[0]["step_time_s"] if rows else 0.0)
    print(f"the table's rates doubled: step {steps[1]:.3g} s against {steps[0]:.3g} s")
    if not (0.0 < steps[1] < 0.75 * steps[0]):
        bad.append(f"doubling the gemm table's rates gave steps {steps}")
# expert parallelism: mixtral-tiny (8 experts) on 8 ranks ranks ep 1, 2, 4 and 8 layouts, each
# ep dividing dp and the experts; on one layout ep shards the experts (less memory a rank) and
# adds the all-to-alls (more time than ep 1 on this tiny model)
moe = json.loads(subprocess.run([exe, "plan", os.path.join(root, "inputs", "mixtral-tiny.toml"),
                                 "parallel.pp=1", "--ranks", "8", "--machine", a100, "--json",
                                 "--top", "1000"], capture_output=True, text=True).stdout or "[]")
eps = sorted({r["ep"] for r in moe})
print(f"mixtral-tiny on 8 ranks: {len(moe)} layouts, ep {eps}")
if eps != [1, 2, 4, 8] or any(r["dp"] % r["ep"] or 8 % r["ep"] for r in moe):
    bad.append(f"mixtral-tiny: ep degrees {eps}, or an ep not dividing dp and the experts")
same = {}
for r in moe:
    if r["schedule"] == "1f1b" and r["micro_batch"] == 1 and r["recompute"] == "none":
        same[r["ep"]] = r
if 1 not in same or 8 not in same:
    bad.append("mixtral-tiny: no ep 1 / ep 8 row of the same layout")
elif not (same[8]["mem_bytes_per_rank"] < same[1]["mem_bytes_per_rank"]
          and same[8]["step_time_s"] > same[1]["step_time_s"]):
    bad.append("mixtral-tiny: ep 8 is not lighter and slower than ep 1 on the same layout")
sys.exit("FAIL: " + "; ".join(bad) if bad else print("PASS"))
