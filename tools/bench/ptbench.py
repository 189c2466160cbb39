"""What the Python benchmarks share: the checkout's root, building, and training runs of
pipetrain under tools/mpi-launch whose metrics.jsonl step records they read."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "fortunes.bin")


def need_data(bench):
    if not os.path.exists(DATA):
        sys.exit(f"{bench}: data/fortunes.bin is missing: run tools/quickstart first")


def build(build_dir, *targets):
    subprocess.run(["cmake", "--build", build_dir, "--target", *targets], check=True,
                   stdout=subprocess.DEVNULL)


def train(build_dir, ranks, deck, name, overrides, threads=1):
    """Runs pipetrain on `ranks` ranks of `threads` threads (tools/mpi-launch --threads: each
    rank on that many cores of its own) with the deck (under inputs/) and overrides, logging to
    runs/bench/<name>; returns its step records, first step first."""
    log_dir = os.path.join(ROOT, "runs", "bench", name)
    metrics = os.path.join(log_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([os.path.join(ROOT, "tools", "mpi-launch"), "--threads", str(threads), str(ranks),
                    os.path.join(build_dir, "pipetrain"), os.path.join(ROOT, "inputs", deck),
                    f"log.dir={log_dir}", "log.every=1000", *overrides],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in open(metrics) if '"loss"' in line]


def tokens_per_s(records, warmup, tokens_per_step):
    """Tokens/s over the steps after the first `warmup`."""
    timed = [r for r in records if r["step"] > warmup]
    return tokens_per_step * len(timed) / sum(r["step_time_s"] for r in timed)


def sgemm(build_dir, lib, threads, copies=1):
    """GFLOP/s per shape ("M x N x K") of pt_bench_sgemm_<lib> with `threads` threads, `copies`
    processes at once (their rates summed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               BLIS_NUM_THREADS=str(threads))
    exe = os.path.join(build_dir, "tools", "bench", f"pt_bench_sgemm_{lib}")
    procs = [subprocess.Popen([exe, str(threads)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(copies)]
    total = {}
    for p in procs:
        for line in p.communicate()[0].splitlines():
            if line.strip():
                f = line.split()
                shape = " x ".join(f[2:5])
                total[shape] = total.get(shape, 0.0) + float(f[5])
    return total
