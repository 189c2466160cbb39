#!/usr/bin/python3
"""Checkpoint tests: real MPI runs of pipetrain writing and reading real parallel HDF5 files.

  ckpt_tests.py --exe PIPETRAIN --launch "MPIEXEC -n" --data TOKENS --work DIR SCENARIO [ARGS]

Scenarios (each exits 0 on success, prints what it compared):
  (a layout is PP,DP,TP or PP,DP,TP,ZERO: parallel.zero = 1 with a fourth field of 1; a suffix
  :SCHEDULE picks the schedule, e.g. 2,1,1:zb-v, with virtual_stages 2 for the V-shaped ones;
  a suffix /EP sets parallel.ep, e.g. 1,2,1/2@mixtral;
  a suffix +PRECISION sets device.precision, e.g. 2,1,1+bf16; a suffix @llama trains llama with
  grouped-query attention, 2 key/value heads; @moe a GPT-2 mixture of experts (4 experts, top 2,
  an MoE layer every second block, one shared expert, capacity factor 1); @mixtral llama with 4
  experts, top 2, in every block)
  bitexact PP,DP,TP     10 steps straight == 5 steps, stop (exit_after_steps), resume 5: identical
                        losses and parameter bytes
  async PP,DP,TP        checkpoint.async = true, every 5 steps: the losses are the synchronous run's,
                        the step 5 and step 10 files hold the synchronous run's datasets byte for
                        byte (and their checksums); 5 steps, stop, resume 5, all asynchronous:
                        identical losses and parameter bytes
  reshard FROM TO       a step-5 checkpoint written by layout FROM continues on layout TO; losses
                        and parameters within 1e-5 of the uninterrupted FROM run
  damage KIND           truncate | flip | delete | schema | shape | heap_loop: the damaged
                        checkpoint named by checkpoint.resume is refused with exit code 3 and the
                        matching message (heap_loop: every group's local-heap free list made a
                        cycle, on which HDF5 1.10 allocates without end)
  fallback              latest is damaged: resume = "auto" warns, resumes from the older one, and
                        the losses match the straight run
  kill [async]          kill -9 of a rank while step 10's checkpoint is written (async: by the
                        writer thread of checkpoint.async): the .partial file stays, latest still
                        names step 5, resume = "auto" continues bit-exactly
  stall [async]         a rank stalls before a checkpoint's collective open: the other rank's
                        watchdog (async: its writer's) names the MPI-IO open and the job exits 5
  write_fails [async]   a rank's write of step 10 fails as on a full disk: exit 1 naming the
                        file, its .partial removed, step 5 and latest untouched
  disk_full [async]     a real full disk (a 2.5 MB tmpfs in a mount namespace of its own; skipped
                        where none can be made): step 10's write fills it and it stays full
                        through the close: exit 1 naming the file, its .partial removed, step 5
                        and latest untouched
  sigterm [async]       SIGTERM to the ranks mid-run: exit 0 with a checkpoint; resuming it gives
                        the straight run's losses and parameters (async: checkpoint.async with a
                        save every step, so the signal comes during a write: that save and the
                        final one are both published)
  other_model           a checkpoint of n_head 4 resumed with n_head 8 (same shapes): exit 3
                        naming model.n_head and both values, by path and by resume = "auto";
                        resumed as llama: exit 3 naming model.arch; a llama checkpoint resumed
                        with another rope_theta or norm_eps: exit 3 naming the key; an MoE
                        checkpoint resumed with other experts or as a dense model: exit 3
                        naming moe.experts
  other_data            resumed with another data.path: a warning naming it, and the run goes on
  nothing_left          resumed from a checkpoint at train.steps: exit 0, "nothing left to do",
                        no loss or speed line
  fresh_start           a resume = "none" run of 3 steps, keep 1, into a directory holding step 10's
                        checkpoint: its own checkpoint stays and latest names it

Needs Debian's python3-h5py (damage). Uses tests/mpi/compare_runs.py.
"""
import argparse
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COMPARE = os.path.join(HERE, "..", "mpi", "compare_runs.py")
DECK = os.path.join(HERE, "..", "..", "inputs", "pipeline-ci.toml")
STEPS = 10
HANG_S = 60  # runtime.hang_timeout_s of every run


def layout_args(lay):
    """PP,DP,TP[,ZERO][:SCHEDULE][/EP][+PRECISION][@llama|@moe|@mixtral] -> rank count and
    overrides."""
    lay, _, arch = lay.partition("@")
    lay, _, precision = lay.partition("+")
    lay, _, ep = lay.partition("/")
    lay, _, sched = lay.partition(":")
    pp, dp, tp, *zero = (int(x) for x in lay.split(","))
    args = [f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.tp={tp}",
            f"parallel.zero={zero[0] if zero else 0}", f"parallel.ep={ep or 1}"]
    if sched:
        v = 2 if sched in ("zb-v", "dualpipev") else 1
        args += [f'parallel.schedule="{sched}"', f"parallel.virtual_stages={v}"]
    if precision:
        args.append(f'device.precision="{precision}"')
    if arch in ("llama", "mixtral"):
        args += ['model.arch="llama"', "model.n_kv_head=2", "model.ffn_hidden=64"]
    if arch == "moe":
        args += ["moe.experts=4", "moe.top_k=2", "moe.every=2", "moe.shared_experts=1",
                 "moe.capacity_factor=1.0"]
    if arch == "mixtral":
        args += ["moe.experts=4", "moe.top_k=2", "moe.ffn_hidden=32"]
    return pp * dp * tp, args


class Runner:
    def __init__(self, a):
        self.exe, self.launch, self.data, self.work = a.exe, a.launch.split(), a.data, a.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)

    def cmd(self, lay, name, *extra, ckpt=None):
        np, largs = layout_args(lay)
        args = self.launch + [str(np), self.exe, DECK, f"data.path={self.data}", "model.n_head=4",
                              f"train.steps={STEPS}", f"log.dir={self.work}/{name}"] + largs
        if ckpt is not None:
            args.append(f"checkpoint.dir={self.work}/{ckpt}")
        return args + list(extra)

    def run(self, lay, name, *extra, ckpt=None, expect=0, env=None):
        args = self.cmd(lay, name, *extra, ckpt=ckpt)
        # a hang ends in the watchdog's exit 5, which names the wait, well inside ctest's limit
        args.append(f"runtime.hang_timeout_s={HANG_S}")
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=3 * HANG_S,
                               env=dict(os.environ, **(env or {})))
        except subprocess.TimeoutExpired as e:
            for part in (e.stdout, e.stderr):  # bytes, whatever text= asked
                if part:
                    print(part.decode(errors="replace") if isinstance(part, bytes) else part)
            sys.exit(f"FAIL: {name}: no exit after {3 * HANG_S} s: {' '.join(args)}")
        out = p.stdout + p.stderr
        if expect is not None and p.returncode != expect:
            print(out[-3000:])
            sys.exit(f"FAIL: {name}: exit code {p.returncode}, expected {expect}")
        return out

    def metrics(self, name):
        return f"{self.work}/{name}/metrics.jsonl"

    def compare(self, tol, a, b):
        p = subprocess.run([sys.executable, COMPARE, str(tol), a, b], capture_output=True, text=True)
        print(p.stdout.strip().split("\n")[-2:])
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            sys.exit(f"FAIL: runs differ ({a} vs {b}, tolerance {tol})")


def expect_in(out, text):
    if text not in out:
        print(out[-3000:])
        sys.exit(f"FAIL: output lacks: {text}")
    print(f"found: {text}")


def bitexact(r, lay):
    r.run(lay, "straight", ckpt="a")
    out = r.run(lay, "part1", "runtime.exit_after_steps=5", ckpt="b")
    expect_in(out, "stopping after step 5 (runtime.exit_after_steps)")
    out = r.run(lay, "part2", ckpt="b")
    expect_in(out, "resumed from")
    r.compare(0, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def same_datasets(a, b):
    """Every dataset of checkpoint files a and b: the same shape, bytes and checksum."""
    import h5py
    import numpy as np
    names = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
        for n in names:
            if n == "config":  # the resolved deck: checkpoint.async differs
                continue
            if n not in fb:
                sys.exit(f"FAIL: {b} lacks {n}")
            x, y = np.asarray(fa[n]), np.asarray(fb[n])
            if x.shape != y.shape or x.tobytes() != y.tobytes() or \
                    fa[n].attrs.get("checksum") != fb[n].attrs.get("checksum"):
                sys.exit(f"FAIL: dataset {n} differs between {a} and {b}")
    print(f"{os.path.basename(a)}: {len(names)} datasets byte-identical")


def async_save(r, lay):
    r.run(lay, "straight", "checkpoint.every=5", ckpt="a")
    out = r.run(lay, "async", "checkpoint.every=5", "checkpoint.async=true", ckpt="b")
    expect_in(out, "(asynchronously: training stalled")
    r.compare(0, r.metrics("straight"), r.metrics("async"))
    for step in ("00000005", "00000010"):
        same_datasets(f"{r.work}/a/step_{step}.h5", f"{r.work}/b/step_{step}.h5")
    r.run(lay, "part1", "runtime.exit_after_steps=5", "checkpoint.async=true", ckpt="c")
    out = r.run(lay, "part2", "checkpoint.async=true", ckpt="c")
    expect_in(out, "resumed from")
    r.compare(0, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def reshard(r, src, dst):
    r.run(src, "straight")
    r.run(src, "part1", "runtime.exit_after_steps=5", ckpt="b")
    out = r.run(dst, "part2", f"checkpoint.resume={r.work}/b/step_00000005.h5", ckpt="c")
    expect_in(out, "resumed from")
    r.compare(1e-5, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def damage(r, kind):
    import h5py
    r.run("1,1,1", "make", "runtime.exit_after_steps=5", ckpt="b")
    path = f"{r.work}/b/step_00000005.h5"
    extra = []
    if kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        want = "cannot be opened as HDF5: truncated or damaged"
    elif kind == "flip":
        with h5py.File(path, "r") as f:
            offset = f["model/h/001/mlp/fc/weight"].id.get_offset()
        with open(path, "r+b") as f:
            f.seek(offset + 100)
            b = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([b[0] ^ 0x10]))
        want = "dataset /model/h/001/mlp/fc/weight fails its checksum: the data is damaged"
    elif kind == "delete":
        with h5py.File(path, "r+") as f:
            del f["optim/v/h/000/attn/qkv/bias"]
        want = "dataset /optim/v/h/000/attn/qkv/bias is missing"
    elif kind == "schema":
        with h5py.File(path, "r+") as f:
            f.attrs["schema_version"] = 2
        want = "schema_version 2, this pipetrain reads 1"
    elif kind == "heap_loop":
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            loops = 0
            for at in (i for i in range(len(data)) if data.startswith(b"HEAP\0", i)):
                size, head, addr = struct.unpack_from("<QQQ", data, at + 8)
                if head != 1 and head + 16 <= size:  # 1: an empty free list
                    struct.pack_into("<Q", data, addr + head, head)  # the block's next is itself
                    loops += 1
            if loops == 0:
                sys.exit("FAIL: no local heap with a free block to damage")
            f.seek(0)
            f.write(data)
        want = "reading its metadata took more than 1 GiB of memory: the file is damaged"
    elif kind == "shape":  # a dataset rewritten with another shape (the deck's keys agree)
        with h5py.File(path, "r+") as f:
            del f["model/wte"]
            f.create_dataset("model/wte", shape=(256, 16), dtype="<f4")
        want = "dataset /model/wte has shape (256, 16) but the deck's model needs (256, 32)"
    else:
        sys.exit(f"unknown damage {kind}")
    out = r.run("1,1,1", "load", f"checkpoint.resume={path}", *extra, ckpt="c", expect=3)
    expect_in(out, f"checkpoint '{path}': {want}")


def fallback(r):
    import h5py
    r.run("2,1,1", "straight")
    r.run("2,1,1", "part1", "checkpoint.every=5", "runtime.exit_after_steps=7", ckpt="b")
    # step 7's checkpoint is latest: damage it
    with h5py.File(f"{r.work}/b/step_00000007.h5", "r+") as f:
        del f["model/wte"]
    out = r.run("2,1,1", "part2", ckpt="b")
    expect_in(out, "step_00000007.h5': dataset /model/wte is missing; trying an older checkpoint")
    expect_in(out, "resumed from " + f"{r.work}/b/step_00000005.h5")
    r.compare(0, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def kill(r, mode=None):
    extra = ["checkpoint.async=true"] if mode == "async" else []
    r.run("2,1,1", "straight")
    r.run("2,1,1", "part1", "checkpoint.every=5", *extra, ckpt="b", expect=None,
          env={"PIPETRAIN_TEST_KILL_IN_CHECKPOINT": "10"})
    names = sorted(os.listdir(f"{r.work}/b"))
    print("after the kill:", names)
    if "step_00000010.h5.partial" not in names or "step_00000010.h5" in names:
        sys.exit("FAIL: the killed write should leave only a .partial file for step 10")
    with open(f"{r.work}/b/latest") as f:
        if f.read().strip() != "step_00000005.h5":
            sys.exit("FAIL: latest must still name step 5")
    out = r.run("2,1,1", "part2", *extra, ckpt="b")
    expect_in(out, "resumed from " + f"{r.work}/b/step_00000005.h5")
    # part1 logged steps 1..10 before dying; its steps 6..10 are replaced by part2's
    r.compare(0, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def stall(r, mode=None):
    # the last rank stalls before step 5's checkpoint file is opened: the other waits inside
    # HDF5's collective MPI-IO open, where no request can be polled; the watchdog names it
    # (async: the writer thread's own watchdog, while the training threads go on)
    extra = ["checkpoint.async=true"] if mode == "async" else []
    args = r.cmd("2,1,1", "stall", "checkpoint.every=5", "runtime.hang_timeout_s=3", *extra,
                 ckpt="s")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PIPETRAIN_TEST_STALL_IN_CHECKPOINT="5"))
    out = p.stdout + p.stderr
    if p.returncode != 5:
        print(out[-3000:])
        sys.exit(f"FAIL: stall: exit code {p.returncode}, expected 5 (the hang watchdog)")
    expect_in(out, "(runtime.hang_timeout_s = 3) for the collective MPI-IO open of "
                   f"'{r.work}/s/step_00000005.h5.partial'")


def write_fails(r, mode=None):
    # the last rank's write of step 10 fails (as on a full disk): exit 1 naming the file, no
    # .partial left, step 5 and latest untouched
    extra = ["checkpoint.async=true"] if mode == "async" else []
    out = r.run("2,1,1", "fails", "checkpoint.every=5", *extra, ckpt="b", expect=1,
                env={"PIPETRAIN_TEST_FAIL_IN_CHECKPOINT": "10"})
    expect_in(out, f"writing checkpoint '{r.work}/b/step_00000010.h5.partial' failed; it is "
                   "removed, and the checkpoints before it stand")
    names = sorted(os.listdir(f"{r.work}/b"))
    print("after the failed write:", names)
    if names != ["latest", "step_00000005.h5"]:
        sys.exit("FAIL: a failed write must leave step 5 and latest only")
    with open(f"{r.work}/b/latest") as f:
        if f.read().strip() != "step_00000005.h5":
            sys.exit("FAIL: latest must still name step 5")


def disk_full(r, mode=None):
    # a real full disk: the checkpoints go to a tmpfs of 2.5 MB in a mount namespace of this run's
    # own, where step 5's file (1.6 MB) fits and step 10's fills the disk midway and stays full
    # through the file's close: exit 1 naming the file, no .partial left, step 5 and latest
    # untouched, no wait for the hang watchdog
    disk = f"{r.work}/disk"
    os.makedirs(disk)
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.insert(1, "--map-root-user")
    mount = subprocess.run(unshare + ["mount", "-t", "tmpfs", "-o", "size=2560k", "tmpfs", disk],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        print(f"SKIP: no mount namespace for a small tmpfs here: {mount.stderr.strip()}")
        sys.exit(0)
    extra = ["checkpoint.async=true"] if mode == "async" else []
    args = r.cmd("2,1,1", "full", "checkpoint.every=5", f"runtime.hang_timeout_s={HANG_S}",
                 *extra) + [f"checkpoint.dir={disk}"]
    script = (f'mount -t tmpfs -o size=2560k tmpfs {disk} || exit 99; "$@"; rc=$?; '
              f'ls -l {disk}; echo "latest names: $(cat {disk}/latest)"; exit $rc')
    p = subprocess.run(unshare + ["sh", "-c", script, "sh"] + args, capture_output=True,
                       text=True, timeout=3 * HANG_S)
    out = p.stdout + p.stderr
    print(out[-2500:])
    if p.returncode != 1:
        sys.exit(f"FAIL: exit code {p.returncode}, expected 1")
    expect_in(out, f"writing checkpoint '{disk}/step_00000010.h5.partial' failed; it is removed, "
                   "and the checkpoints before it stand")
    listing = p.stdout[p.stdout.rfind("total "):]
    if ".partial" in listing or "step_00000005.h5" not in listing:
        sys.exit("FAIL: the full disk must hold step 5 and latest only")
    if "latest names: step_00000005.h5" not in listing:
        sys.exit("FAIL: latest must still name step 5")


def sigterm(r, mode=None):
    global STEPS
    STEPS = 3000  # long enough to be interrupted; the LR schedule follows it in every run
    # async: a save every step, so that the signal comes while one is being written
    extra = ["checkpoint.async=true", "checkpoint.every=1"] if mode == "async" else []
    args = r.cmd("2,1,1", "part1", "log.every=1000", *extra, ckpt="b")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = r.metrics("part1")
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3:
            break
        time.sleep(0.05)
    # what Slurm's --signal does: the signal goes to the ranks themselves (not to the launcher)
    for pid in subprocess.run(["pgrep", "-f", f"log.dir={r.work}/part1"], capture_output=True,
                              text=True).stdout.split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "pipetrain":
                    os.kill(int(pid), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    out, _ = p.communicate(timeout=120)
    if p.returncode != 0:
        print(out[-3000:])
        sys.exit(f"FAIL: SIGTERM run exited {p.returncode}, expected 0")
    expect_in(out, "(SIGTERM); restart with checkpoint.resume")
    stopped = max(int(l.split('"step": ')[1].split(",")[0]) for l in open(metrics) if '"loss"' in l)
    print(f"stopped after step {stopped}")
    if mode == "async" and not os.path.exists(f"{r.work}/b/step_{stopped - 1:08d}.h5"):
        sys.exit(f"FAIL: the save in flight when the signal came (step {stopped - 1}) is missing")
    out = r.run("2,1,1", "part2", "runtime.exit_after_steps=5", *extra, ckpt="b")
    expect_in(out, f"resumed from {r.work}/b/step_{stopped:08d}.h5")
    r.run("2,1,1", "straight", f"runtime.exit_after_steps={stopped + 5}", ckpt="a")
    r.compare(0, r.metrics("straight"), r.metrics("part1") + "," + r.metrics("part2"))


def other_model(r):
    r.run("1,1,1", "make", "runtime.exit_after_steps=5", ckpt="b")
    path = f"{r.work}/b/step_00000005.h5"
    want = f"checkpoint '{path}': is of another model: model.n_head = 4 in the checkpoint, 8 in the deck"
    out = r.run("1,1,1", "load", f"checkpoint.resume={path}", "model.n_head=8", ckpt="c", expect=3)
    expect_in(out, want)
    out = r.run("2,1,1", "auto", "model.n_head=8", ckpt="b", expect=3)
    expect_in(out, want)
    if "trying an older checkpoint" in out:
        sys.exit("FAIL: resume = auto fell back past a checkpoint of another model")
    # another architecture: a gpt2 checkpoint resumed as llama
    out = r.run("1,1,1@llama", "load_llama", f"checkpoint.resume={path}", ckpt="d", expect=3)
    expect_in(out, f"checkpoint '{path}': is of another model: model.arch = gpt2 in the "
                   "checkpoint, llama in the deck")
    # llama's own keys: a rotary base or an RMSNorm epsilon of another run (same shapes)
    r.run("1,1,1@llama", "make_llama", "runtime.exit_after_steps=5", ckpt="e")
    llama = f"{r.work}/e/step_00000005.h5"
    for key, saved, given in (("rope_theta", "10000", "500000.0"), ("norm_eps", "1e-05", "1e-06")):
        out = r.run("1,1,1@llama", "load_llama", f"checkpoint.resume={llama}", f"model.{key}={given}",
                    ckpt="f", expect=3)
        shown = given.removesuffix(".0")  # numbers as their shortest exact text
        expect_in(out, f"checkpoint '{llama}': is of another model: model.{key} = {saved} in the "
                       f"checkpoint, {shown} in the deck")
    # a mixture of experts: with other experts, or as the dense model of the same blocks
    r.run("1,1,1@moe", "make_moe", "runtime.exit_after_steps=5", ckpt="g")
    moe = f"{r.work}/g/step_00000005.h5"
    for given, shown in (("moe.experts=8", "8"), ("moe.experts=0", "0")):
        out = r.run("1,1,1@moe", "load_moe", f"checkpoint.resume={moe}", given, ckpt="h", expect=3)
        expect_in(out, f"checkpoint '{moe}': is of another model: moe.experts = 4 in the "
                       f"checkpoint, {shown} in the deck")


def other_data(r):
    r.run("1,1,1", "make", "runtime.exit_after_steps=5", ckpt="b")
    copy = f"{r.work}/other.bin"
    shutil.copy(r.data, copy)
    out = r.run("1,1,1", "load", f"data.path={copy}", ckpt="b")
    expect_in(out, f"warning: resuming '{r.work}/b/step_00000005.h5', written with data.path = "
                   f"{r.data}; this run has {copy}")
    expect_in(out, "done: 10 steps")


def nothing_left(r):
    r.run("1,1,1", "make", ckpt="b")
    out = r.run("1,1,1", "again", ckpt="b")
    expect_in(out, "nothing left to do: the checkpoint is at step 10 of 10 (train.steps)")
    if "final loss" in out or "tokens/s" in out:
        print(out[-3000:])
        sys.exit("FAIL: a run with nothing to do printed a loss or speed line")


def fresh_start(r):
    r.run("1,1,1", "long", ckpt="b")  # step 10's checkpoint (and step 5's)
    r.run("1,1,1", "short", "train.steps=3", 'checkpoint.resume="none"', "checkpoint.keep=1",
          ckpt="b")
    latest = open(f"{r.work}/b/latest").read().strip()
    if latest != "step_00000003.h5" or not os.path.exists(f"{r.work}/b/{latest}"):
        sys.exit(f"FAIL: latest names {latest!r}, present: {sorted(os.listdir(f'{r.work}/b'))}")
    print(f"latest = {latest}, present; the directory holds {sorted(os.listdir(f'{r.work}/b'))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True)
    ap.add_argument("--launch", required=True, help='e.g. "mpiexec --oversubscribe -n"')
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("scenario")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    r = Runner(a)
    {"bitexact": lambda: bitexact(r, a.args[0]), "reshard": lambda: reshard(r, a.args[0], a.args[1]),
     "damage": lambda: damage(r, a.args[0]), "fallback": lambda: fallback(r),
     "kill": lambda: kill(r, *a.args), "stall": lambda: stall(r, *a.args),
     "write_fails": lambda: write_fails(r, *a.args), "disk_full": lambda: disk_full(r, *a.args),
     "async": lambda: async_save(r, a.args[0]),
     "sigterm": lambda: sigterm(r, *a.args),
     "other_model": lambda: other_model(r), "other_data": lambda: other_data(r),
     "nothing_left": lambda: nothing_left(r), "fresh_start": lambda: fresh_start(r)}[a.scenario]()
    print("PASS")


if __name__ == "__main__":
    main()
