#!/usr/bin/python3
"""export_roundtrip.py PIPETRAIN LAUNCH DATA WORK
Trains 6 steps of inputs/pipeline-ci.toml on pp=2 with a checkpoint after step 5, exports it
with tools/ckpt, loads the state dict into tools/reference's PyTorch model, rebuilds step 6's
global batch with pipetrain's sampler (SplitMix64 of (seed, step, sample)), and demands the loss
pipetrain logged for step 6 (computed from the same weights) within 1e-5 relative."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import gpt_reference  # noqa: E402

exe, launch, data, work = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
shutil.rmtree(work, ignore_errors=True)
M64 = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hash3(a, b, c):
    return mix64(a ^ mix64(b ^ mix64(c)))


cfg = dict(n_layer=8, n_head=2, d_model=32, seq_len=32, vocab_size=256)  # inputs/pipeline-ci.toml
seed, global_batch, T = 11, 8, cfg["seq_len"]
subprocess.run(launch + ["2", exe, os.path.join(ROOT, "inputs", "pipeline-ci.toml"),
                         f"data.path={data}", "parallel.pp=2", "train.steps=6",
                         "checkpoint.every=5", f"checkpoint.dir={work}/ckpt", f"log.dir={work}/log"],
               check=True, stdout=subprocess.DEVNULL)
subprocess.run([os.path.join(ROOT, "tools", "ckpt"), "export", f"{work}/ckpt/step_00000005.h5",
                f"{work}/model.pt"], check=True)
logged = {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/log/metrics.jsonl"))
          if "loss" in r}

state = torch.load(f"{work}/model.pt")
names = gpt_reference.param_names(cfg, True)
if sorted(state) != sorted(names):
    sys.exit(f"FAIL: exported names differ from the reference model's: {sorted(set(state) ^ set(names))}")
tokens = np.fromfile(data, dtype=np.uint16, offset=1024).astype(np.int64)
step = 5  # the 6th step's batch, drawn with the weights after 5 updates
rows = []
for g in range(global_batch):
    off = hash3(seed, step, g) % (len(tokens) - T)
    rows.append(tokens[off:off + T + 1])
batch = torch.from_numpy(np.stack(rows))
p = {n: t.double() for n, t in state.items()}
with torch.no_grad():
    loss, _, _ = gpt_reference.forward(p, cfg, True, batch[:, :T], batch[:, 1:])
rel = abs(loss.item() - logged[6]) / logged[6]
print(f"PyTorch loss on step 6's batch from the exported weights: {loss.item():.7f}; "
      f"pipetrain logged {logged[6]:.7f}; relative difference {rel:.2e}")
if rel > 1e-5:
    sys.exit("FAIL: the exported weights do not reproduce pipetrain's loss")
# tools/ckpt inspect --verify: clean on the real file, and it catches one flipped bit in a copy
ckpt = os.path.join(ROOT, "tools", "ckpt")
good = f"{work}/ckpt/step_00000005.h5"
if subprocess.run([ckpt, "inspect", good, "--verify"], capture_output=True).returncode != 0:
    sys.exit("FAIL: tools/ckpt --verify rejects a good checkpoint")
import h5py  # noqa: E402
bad = f"{work}/bad.h5"
shutil.copy(good, bad)
with h5py.File(bad, "r") as f:
    offset = f["optim/v/h/003/mlp/fc/bias"].id.get_offset()
with open(bad, "r+b") as f:
    f.seek(offset + 5)
    byte = f.read(1)
    f.seek(offset + 5)
    f.write(bytes([byte[0] ^ 0x01]))
out = subprocess.run([ckpt, "inspect", bad, "--verify"], capture_output=True, text=True)
if out.returncode != 1 or "/optim/v/h/003/mlp/fc/bias" not in out.stdout:
    sys.exit("FAIL: tools/ckpt --verify missed a flipped bit:\n" + out.stdout)
print("tools/ckpt --verify: good file verified, flipped bit found in /optim/v/h/003/mlp/fc/bias")
print("PASS")
