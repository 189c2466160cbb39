#!/usr/bin/env python3
"""release_digest.py check|record GOLDEN "LAUNCH" PIPETRAIN RUN_DIR [OVERRIDES...]

Host fp32 against a recorded release. Trains the demo deck (inputs/tiny.toml: pp 2 x dp 2 on 4
ranks) with every step's parameter digests, then
- check: compares every step's loss and parameter bytes with GOLDEN (compare_runs.py at
  tolerance 0), where this machine computes as the one that recorded it; elsewhere it prints
  SKIP and why, and exits 77 (ctest's SKIP_RETURN_CODE);
- record: writes GOLDEN: one line naming the machine (below) and the commit, then the run's
  metrics.jsonl.

Which machine: the BLAS pipetrain links and the kernels it picked for this CPU (OpenBLAS's
openblas_get_corename, oneDNN's dnnl_get_effective_cpu_isa), and whether the CPU has FMA and AVX-512F (the build uses -march=native,
so the compiler may contract a*b+c into one rounding where FMA exists). Those decide the bits of
an fp32 run; the CPU's name does not."""
import ctypes
import json
import os
import shlex
import subprocess
import sys

SKIP = 77
mode, golden, launch, exe, run_dir = sys.argv[1:6]
overrides = sys.argv[6:]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def machine():
    libs = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout.split("\n")
    blas = [ln.split("=>")[1].split()[0] for ln in libs if "=>" in ln and any(
        ln.strip().startswith(k) for k in ("libopenblas", "libblas", "libblis", "libdnnl"))]
    lib = os.path.basename(blas[0]) if blas else "none"
    core = "-"
    if lib.startswith("libopenblas"):
        f = ctypes.CDLL(blas[0]).openblas_get_corename
        f.restype = ctypes.c_char_p
        core = f().decode()
    elif lib.startswith("libdnnl"):  # the instruction set its JIT kernels use
        core = f"isa {ctypes.CDLL(blas[0]).dnnl_get_effective_cpu_isa()}"
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":")[1].split())
                break
    return {"blas": lib.split(".so")[0], "blas_core": core,
            "fma": "fma" in flags, "avx512f": "avx512f" in flags}


here_machine = machine()
if mode == "check":
    with open(golden) as f:
        recorded = json.loads(f.readline())
    if recorded["machine"] != here_machine:
        print(f"SKIP: {os.path.basename(golden)} was recorded on {recorded['machine']}; this "
              f"machine is {here_machine}, whose fp32 arithmetic may round differently")
        sys.exit(SKIP)
os.makedirs(run_dir, exist_ok=True)
metrics = os.path.join(run_dir, "metrics.jsonl")
if os.path.exists(metrics):
    os.remove(metrics)
cmd = [*shlex.split(launch), exe, os.path.join(root, "inputs", "tiny.toml"), f"log.dir={run_dir}",
       "train.steps=6", "log.every=1", "log.param_digests=true", "data.val_every=0",
       *overrides]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
if r.returncode != 0:
    sys.exit(f"FAIL: the run exited {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
if mode == "record":
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(exe)), "rev-parse",
                             "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    with open(golden, "w") as out, open(metrics) as f:
        out.write(json.dumps({"machine": here_machine, "commit": commit}) + "\n")
        out.write(f.read())
    print(f"recorded {golden} on {here_machine} at {commit}")
    sys.exit(0)
print(f"machine {here_machine}, as recorded at {recorded['commit']}")
sys.exit(subprocess.run([sys.executable, os.path.join(here, "compare_runs.py"), "0", golden,
                         metrics]).returncode)
