#!/usr/bin/python3
"""tools/sample against the model: for a tied and an untied checkpoint written by pipetrain,
sample's numpy forward pass gives the logits of tools/reference/gpt_reference.py (PyTorch,
float64) within 1e-4, and the command prints the asked number of tokens.

  sample_test.py PIPETRAIN DECK DATA WORKDIR
"""
import os
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import gpt_reference  # noqa: E402

sample = SourceFileLoader("sample", os.path.join(ROOT, "tools", "sample")).load_module()


def main():
    exe, deck, data, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    for tied in ("true", "false"):
        ckpt = os.path.join(work, f"tied_{tied}")
        subprocess.run([exe, deck, f"data.path={data}", "train.steps=3", f"model.tie_embeddings={tied}",
                        f"checkpoint.dir={ckpt}", f"log.dir={ckpt}/log"], check=True,
                       stdout=subprocess.DEVNULL)
        path, f = sample.open_checkpoint(ckpt)
        with f:
            w, cfg = sample.load_model(f)
        T = cfg["seq_len"]
        idx = np.random.default_rng(1).integers(0, cfg["vocab_size"], T)
        ours = sample.forward(w, cfg, idx)
        p = {k: torch.from_numpy(v).double() for k, v in w.items()}
        _, ref, _ = gpt_reference.forward(p, cfg, cfg["tied"], torch.from_numpy(idx)[None],
                                       torch.from_numpy(idx)[None])
        diff = float(np.abs(ours - ref[0].numpy()).max())
        print(f"tie_embeddings {tied}: {path}: logits within {diff:.2e} of the reference")
        if cfg["tied"] != (tied == "true") or not diff < 1e-4:
            sys.exit("FAIL: tools/sample's forward pass is not the model's")
        out = subprocess.run([os.path.join(ROOT, "tools", "sample"), ckpt, "--prompt", "Hi",
                              "--tokens", "20", "--temperature", "0"], check=True,
                             capture_output=True)
        text = out.stdout.decode("utf-8", errors="replace").rstrip("\n")
        if not text.startswith("Hi") or len(out.stdout.rstrip(b"\n")) != 22:
            sys.exit(f"FAIL: tools/sample printed {out.stdout!r}, not 'Hi' and 20 bytes")
    print("PASS")


if __name__ == "__main__":
    main()
