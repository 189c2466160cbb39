#!/usr/bin/python3
"""tokenizer_test.py PIPETRAIN "LAUNCH" HF_PYTHON WORK: tools/prepare-data --tokenizer.

- trains a byte-level BPE tokenizer of 400 tokens on Debian's fortunes with the `tokenizers`
  package (HF_PYTHON: tools/hf-venv's environment) and saves tokenizer.json;
- tools/prepare-data --tokenizer writes the corpus as a version 1 token file (uint16) and, with
  --uint32, as a version 2 file (uint32), each recording the vocabulary of 400;
- pipetrain trains on both (pipeline-ci, vocab_size 400, pp 2) with identical losses and
  parameters (compare_runs.py at tolerance 0);
- a run with model.vocab_size = 300 exits 2 naming the file's vocabulary.
"""
import os
import shutil
import subprocess
import sys

exe, launch, hf_python, work = sys.argv[1:5]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
corpus = "/usr/share/games/fortunes"
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tok = os.path.join(work, "tokenizer.json")

TRAIN = """
import os, sys, tokenizers
from tokenizers import models, pre_tokenizers, decoders, trainers
t = tokenizers.Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
texts = []
for name in sorted(os.listdir(sys.argv[1]))[:6]:
    path = os.path.join(sys.argv[1], name)
    if os.path.isfile(path) and not name.endswith((".dat", ".u8")) and not os.path.islink(path):
        texts.append(open(path, encoding="utf-8", errors="ignore").read())
trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
t.train_from_iterator(texts, trainer)
t.save(sys.argv[2])
print("tokenizer of", t.get_vocab_size(), "tokens")
"""


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, **kw)
    return r.returncode, r.stdout + r.stderr


code, out = run([hf_python, "-c", TRAIN, corpus, tok])
print(out.strip())
if code != 0 or "of 400 tokens" not in out:
    sys.exit(f"FAIL: training the tokenizer: {out[-2000:]}")
files = {}
for name, extra in (("v1", []), ("v2", ["--uint32"])):
    files[name] = os.path.join(work, f"{name}.bin")
    code, out = run([hf_python, os.path.join(root, "tools", "prepare-data"), "--tokenizer", tok,
                     "--out", files[name], *extra, corpus])
    print(out.strip())
    version = "version 2 (uint32" if name == "v2" else "version 1 (uint16"
    if code != 0 or "vocabulary 400" not in out or version not in out:
        sys.exit(f"FAIL: prepare-data --tokenizer {' '.join(extra)}: {out[-2000:]}")
for name, path in files.items():
    code, out = run([*launch.split(), "2", exe, os.path.join(root, "inputs", "pipeline-ci.toml"),
                     f"data.path={path}", "model.vocab_size=400", "parallel.pp=2",
                     "train.steps=3", "log.param_digests=true", f"log.dir={work}/run_{name}"])
    if code != 0 or "done: 3 steps" not in out:
        sys.exit(f"FAIL: training on the {name} file: {out[-2000:]}")
code, out = run([sys.executable, os.path.join(root, "tests", "mpi", "compare_runs.py"), "0",
                 f"{work}/run_v1/metrics.jsonl", f"{work}/run_v2/metrics.jsonl"])
print(out.strip().split("\n")[-1])
if code != 0:
    sys.exit("FAIL: the uint16 and uint32 files of the same tokens trained differently")
code, out = run([*launch.split(), "1", exe, os.path.join(root, "inputs", "pipeline-ci.toml"),
                 f"data.path={files['v1']}", "model.vocab_size=300", f"log.dir={work}/small"])
want = "its tokens come from a vocabulary of 400 but model.vocab_size = 300"
if code != 2 or want not in out:
    sys.exit(f"FAIL: vocab_size 300: exit {code}, expected 2 and '{want}': {out[-1500:]}")
print(f"refused: {want}")
print("PASS")
