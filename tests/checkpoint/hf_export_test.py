#!/usr/bin/python3
"""hf_export_test.py PIPETRAIN "LAUNCH" DATA WORK HF_PYTHON: tools/ckpt export --format hf, loaded
by Hugging Face's transformers.

For a tied GPT-2, an untied llama with grouped-query attention and a Mixtral-style mixture of
experts of those llama blocks (4 experts, top 2; pipeline-ci's shape, 4 heads), each trained 4
steps on pp 2 with a checkpoint at step 4 and a validation loss after it:
- the validation file holds exactly seq_len + 1 tokens, so every validation sequence is that one
  and pipetrain's validation loss is the loss of those tokens at the checkpoint's weights;
- the checkpoint, exported with --format hf, loads in transformers (GPT2LMHeadModel,
  LlamaForCausalLM, MixtralForCausalLM: HF_PYTHON, the pinned environment of tools/hf-venv) from
  the directory alone,
  with no tensor missing, unexpected or of another shape;
- its loss on the same tokens agrees with pipetrain's within 1e-5 relative (fp32);
- checkpoint.init_from=DIR starts a run on another layout from it: its first step's loss on
  those tokens is the same within 1e-5;
- a directory of the other architecture, of another width, of another expert count, missing, or
  with a truncated safetensors file is refused with exit 2 and a message naming the problem.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

exe, launch, data, work, hf_python = sys.argv[1:6]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
T = 32  # pipeline-ci's seq_len
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# llm.c's token format: 256 int32 of header (magic, version, count), then uint16 tokens
with open(data, "rb") as f:
    tokens = np.frombuffer(f.read(), dtype=np.uint16, offset=1024)[1000:1000 + T + 1]
val = os.path.join(work, "val.bin")
header = np.zeros(256, dtype=np.int32)
header[:3] = (20240520, 1, T + 1)
with open(val, "wb") as f:
    f.write(header.tobytes() + tokens.astype(np.uint16).tobytes())

LOSS = """
import sys, torch, transformers
model, info = transformers.AutoModelForCausalLM.from_pretrained(
    sys.argv[1], torch_dtype=torch.float32, output_loading_info=True)
if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
    sys.exit(f"the checkpoint does not fit the model: {info}")
model.eval()
tokens = torch.tensor([int(t) for t in sys.argv[2].split(",")])
with torch.no_grad():
    logits = model(tokens[None, :-1]).logits[0]
loss = torch.nn.functional.cross_entropy(logits.double(), tokens[1:])
print(type(model).__name__, repr(loss.item()))
"""

LLAMA = ['model.arch="llama"', "model.n_kv_head=2", "model.ffn_hidden=64"]
MIXTRAL = LLAMA + ["moe.experts=4", "moe.top_k=2", "moe.ffn_hidden=32"]
bad = []
for name, overrides in (("gpt2", []), ("llama", LLAMA), ("mixtral", MIXTRAL)):
    d = os.path.join(work, name)
    run = subprocess.run(
        [*launch.split(), "2", exe, os.path.join(root, "inputs", "pipeline-ci.toml"),
         f"data.path={data}", f"data.val_path={val}", "data.val_every=4", "data.val_batches=2",
         "model.n_head=4", "parallel.pp=2", "train.steps=4", f"log.dir={d}",
         f"checkpoint.dir={d}/ckpt", "checkpoint.every=4", *overrides],
        capture_output=True, text=True, timeout=180)
    if run.returncode != 0:
        print(run.stdout[-2000:], run.stderr[-2000:])
        sys.exit(f"FAIL: {name}: pipetrain exited {run.returncode}")
    ours = [json.loads(ln)["val_loss"] for ln in open(f"{d}/metrics.jsonl") if "val_loss" in ln][-1]
    out = f"{d}/hf"
    exp = subprocess.run(["/usr/bin/python3", os.path.join(root, "tools", "ckpt"), "export",
                          f"{d}/ckpt/step_00000004.h5", out, "--format", "hf", "--pipetrain", exe],
                         capture_output=True, text=True)
    if exp.returncode != 0:
        sys.exit(f"FAIL: {name}: export exited {exp.returncode}: {exp.stderr[-2000:]}")
    print(exp.stdout.strip())
    hf = subprocess.run([hf_python, "-c", LOSS, out, ",".join(str(t) for t in tokens)],
                        capture_output=True, text=True)
    if hf.returncode != 0:
        sys.exit(f"FAIL: {name}: transformers could not load it: {hf.stderr[-3000:]}")
    cls, theirs = hf.stdout.split()[-2], float(hf.stdout.split()[-1])
    rel = abs(theirs - ours) / ours
    print(f"{name}: pipetrain validation loss {ours:.7f}, transformers {cls} {theirs:.7f}, "
          f"relative difference {rel:.2e}")
    if rel > 1e-5:
        bad.append(f"{name}: {rel:.2e} > 1e-5")
    # the exported directory starts a run on another layout (one rank; llama: tp 2) that trains
    # on those tokens alone: its first step's loss, before any update, is the same loss
    layout = {"llama": ["parallel.tp=2"], "mixtral": ["parallel.pp=2"]}.get(name, [])
    init = subprocess.run(
        [*launch.split(), "2" if layout else "1", exe,
         os.path.join(root, "inputs", "pipeline-ci.toml"), f"data.path={val}", "model.n_head=4",
         "train.steps=1", f"log.dir={d}/init", f"checkpoint.dir={d}/init_ckpt",
         'checkpoint.resume="none"', f"checkpoint.init_from={out}", *layout, *overrides],
        capture_output=True, text=True, timeout=180)
    if init.returncode != 0 or "initialized from" not in init.stdout:
        print(init.stdout[-2000:], init.stderr[-2000:])
        sys.exit(f"FAIL: {name}: the run from {out} exited {init.returncode}")
    first = [json.loads(ln)["loss"] for ln in open(f"{d}/init/metrics.jsonl") if '"loss"' in ln][0]
    rel = abs(first - ours) / ours
    print(f"{name}: started from the export: step 1 loss {first:.6f}, relative difference {rel:.2e}")
    if rel > 1e-5:
        bad.append(f"{name} from the export: {rel:.2e} > 1e-5")

def refused(why, directory, want, *extra):
    """A run from `directory` exits 2 with `want` in its message."""
    r = subprocess.run(
        [*launch.split(), "1", exe, os.path.join(root, "inputs", "pipeline-ci.toml"),
         f"data.path={val}", "model.n_head=4", "train.steps=1", f"log.dir={work}/refused",
         f"checkpoint.dir={work}/refused_ckpt", 'checkpoint.resume="none"',
         f"checkpoint.init_from={directory}", *extra], capture_output=True, text=True, timeout=120)
    if r.returncode != 2 or want not in r.stdout + r.stderr:
        print(r.stdout[-1500:], r.stderr[-1500:])
        bad.append(f"{why}: exit {r.returncode}, expected 2 and '{want}'")
    else:
        print(f"refused, {why}: {want}")


refused("another architecture", f"{work}/llama/hf", 'model_type "llama", the deck\'s model is gpt2')
refused("another width", f"{work}/gpt2/hf", "which does not fit the deck's", "model.d_model=64")
refused("another expert count", f"{work}/mixtral/hf",
        "num_local_experts = 4, the deck's moe.experts = 8", *MIXTRAL, "moe.experts=8")
refused("a dense deck", f"{work}/mixtral/hf", 'model_type "mixtral", the deck\'s model is llama',
        *LLAMA)
refused("no directory", f"{work}/none", "config.json: cannot be read")
cut = f"{work}/cut"
shutil.copytree(f"{work}/gpt2/hf", cut)
with open(f"{cut}/model.safetensors", "r+b") as f:
    f.truncate(4000)
refused("a truncated file", cut, "not a safetensors file pipetrain reads")
sys.exit("FAIL: " + "; ".join(bad) if bad else print("PASS"))
