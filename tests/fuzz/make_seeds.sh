#!/usr/bin/env bash
# make_seeds.sh [PIPETRAIN]: rewrites the seed corpora in tests/fuzz/corpus/ (docs/fuzzing.md).
# Valid inputs and a few known-bad ones per target, all small. The checkpoint seeds are real
# checkpoints of checkpoint_seed.toml's model, written by PIPETRAIN (default build/pipetrain) on
# one rank; the data comes from tools/prepare-data and tests/integration/make_bad_data.py.
# Run by hand when a format changes; tools/fuzz never writes into the corpus.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
pipetrain=$(realpath "${1:-build/pipetrain}")
corpus=$root/tests/fuzz/corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -x "$pipetrain" ]] || { echo "make_seeds.sh: no $pipetrain: build pipetrain first" >&2; exit 1; }
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl_base_warn_component_unused=0

# ---- decks: "#np=N" first line sets the rank count, overrides after a "%%" line ----
d=$corpus/fuzz_deck
rm -rf "$d" && mkdir -p "$d"
{ echo "#np=4"; cat inputs/tiny.toml; } >"$d/tiny_np4.toml"
{ echo "#np=1"; cat inputs/tiny-ci.toml; printf '%%%%\nparallel.pp=1\ntrain.steps=3\n'; } \
  >"$d/tiny_ci_overrides.toml"
{ echo "#np=2"; cat inputs/pipeline-ci.toml
  printf '%%%%\nparallel.schedule="interleaved"\nparallel.virtual_stages=2\n'; } \
  >"$d/pipeline_interleaved.toml"
{ echo "#np=8"; cat inputs/gpt2-350m-3d-ci.toml; } >"$d/gpt2_350m_3d_ci.toml"
{ echo "#np=2"; cat inputs/gpt2-124m-ci.toml; printf '%%%%\nparallel.partition=[6, 6]\n'; } \
  >"$d/gpt2_124m_ci_partition.toml"
{ echo "#np=2"; cat inputs/tiny-ci.toml
  printf '%%%%\ncomm.allreduce="ring"\ncomm.overlap="thread"\ncheckpoint.dir=ckpt\n'
  printf 'runtime.exit_after_steps=2\ndata.path=data/x.bin\n'; } >"$d/tiny_ci_comm.toml"
cp tests/integration/decks/not_toml.toml "$d/bad_not_toml.toml"
cp tests/integration/decks/unknown_section.toml "$d/bad_unknown_section.toml"
{ cat inputs/tiny-ci.toml; printf '%%%%\ntrain.steps\nmodel.n_head=3\n'; } >"$d/bad_overrides.toml"

# ---- schedule files: three bytes of shape (pp 1 + b % 4, micro-batches 1 + b % 8,
# virtual_stages 1 + b % 3), then the CSV ----
d=$corpus/fuzz_schedule_csv
rm -rf "$d" && mkdir -p "$d"
shape() { printf '%b' "$(printf '\\x%02x\\x%02x\\x%02x' $(($1 - 1)) $(($2 - 1)) $(($3 - 1)))"; }
for s in "1f1b 2 4 1" "zb-h1 4 8 1" "interleaved 2 4 2" "zb-v 2 4 2" "dualpipev 4 8 2"; do
  read -r name pp m v <<<"$s"
  { shape "$pp" "$m" "$v"
    "$pipetrain" schedule "$name" --pp "$pp" --micro-batches "$m" --virtual-stages "$v" --csv 2>/dev/null
  } >"$d/${name}_pp${pp}_m${m}"
done
for f in tests/data/schedules/*.csv; do
  base=$(basename "$f" .csv)
  v=1
  [[ $base == interleaved* || $base == vshape* ]] && v=2
  { shape 2 4 "$v"; cat "$f"; } >"$d/${base/broken_/bad_}"
done

# ---- token files ----
d=$corpus/fuzz_token_file
rm -rf "$d" && mkdir -p "$d"
python3 tools/prepare-data --out "$d/good.bin" inputs/tiny-ci.toml >/dev/null
python3 tests/integration/make_bad_data.py "$work/bad" >/dev/null
for f in bad_magic truncated too_short big_token not_tokens; do cp "$work/bad/$f.bin" "$d/$f.bin"; done

# ---- calibration files (the layout `pipetrain-bench calibrate` writes) ----
d=$corpus/fuzz_calibration
rm -rf "$d" && mkdir -p "$d"
level() { # name alpha_us bandwidth_GBps gamma_ns copy_ns measured
  printf '\n[%s]\nalpha_us = %s\nbandwidth_GBps = %s\ngamma_ns_per_byte = %s\n' "$1" "$2" "$3" "$4"
  printf 'copy_ns_per_byte = %s\nmeasured = %s\n' "$5" "$6"
}
{ echo "# pipetrain-bench calibrate: 2 nodes"; level intra 0.4 10 0.25 0.05 true
  level inter 1.5 23 0.25 0.1 true; } >"$d/two_nodes.toml"
{ echo "# one node"; level intra 0.35 12.5 0.3 0.06 true; level inter 1.5 23 0.25 0.1 false; } \
  >"$d/one_node.toml"
{ printf '[intra]\nalpha_us = 1\nbandwidth_GBps = 5\ngamma_ns_per_byte = 1\n'
  printf '[inter]\nalpha_us = 2\nbandwidth_GBps = 1\ngamma_ns_per_byte = 1\n'; } >"$d/no_copy.toml"
{ level intra 1e6 1e-6 1e6 1e6 true; level inter 1e-300 1e6 1e-300 1e-300 true; } \
  >"$d/bounds.toml"
{ level intra 1e300 1e-300 1e300 1e300 true; level inter 1e-300 1e300 1e-300 1e-300 true; } \
  >"$d/bad_out_of_range.toml"
{ level intra 0.4 0 0.25 0.05 true; } >"$d/bad_zero_no_inter.toml"
printf '[intra\nalpha_us = 1\n' >"$d/bad_not_toml.toml"

# ---- checkpoints: two steps of checkpoint_seed.toml's model on one rank ----
d=$corpus/fuzz_checkpoint
rm -rf "$d" && mkdir -p "$d"
mkdir -p "$work/run/data"
python3 tools/prepare-data --out "$work/run/data/ascii.bin" inputs/*.toml >/dev/null
(cd "$work/run" && "$pipetrain" "$root/tests/fuzz/checkpoint_seed.toml" >/dev/null)
cp "$work/run/ckpt/step_00000002.h5" "$d/step2.h5"
size=$(stat -c %s "$d/step2.h5")
head -c $((size / 2)) "$d/step2.h5" >"$d/bad_truncated.h5"
# one byte of /model/wte changed (its 100th byte, where h5dump says its data starts): fails the
# dataset's checksum
wte=$(h5dump -p -H -d /model/wte "$d/step2.h5" | awk '/OFFSET/ {print $2}')
cp "$d/step2.h5" "$d/bad_checksum.h5"
printf '\x7f' | dd of="$d/bad_checksum.h5" bs=1 seek=$((wte + 100)) conv=notrunc status=none
# the same tensor shapes with another head count: another model (/config tells)
(cd "$work/run" && "$pipetrain" "$root/tests/fuzz/checkpoint_seed.toml" model.n_head=4 \
  checkpoint.dir=ckpt4 train.steps=1 >/dev/null)
cp "$work/run/ckpt4/step_00000001.h5" "$d/bad_other_model.h5"
printf 'not an HDF5 file\n' >"$d/bad_not_hdf5.h5"

# ---- safetensors: the 1-layer GPT-2 of fuzz_safetensors.cpp, in transformers' names ----
d=$corpus/fuzz_safetensors
rm -rf "$d" && mkdir -p "$d"
/usr/bin/python3 - "$d" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, "tools")
import hf_format
d, C, V, T = sys.argv[1], 8, 16, 4
rng = np.random.default_rng(1)
shapes = {"wte": (V, C), "wpe": (T, C), "lnf/weight": (C,), "lnf/bias": (C,)}
for part, shape in {"ln1": (C,), "ln2": (C,), "attn/qkv": (3 * C, C), "attn/proj": (C, C),
                    "mlp/fc": (4 * C, C), "mlp/proj": (C, 4 * C)}.items():
    shapes[f"h/000/{part}/weight"] = shape
    shapes[f"h/000/{part}/bias"] = (shape[0],)
params = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
model = dict(d_model=C, n_layer=1, n_head=2, seq_len=T, vocab_size=V, tie_embeddings=True)
_, state = hf_format.hf_model(model, params)
hf_format.write_safetensors(os.path.join(d, "gpt2_1layer.safetensors"), state)
state.pop("transformer.wpe.weight")
hf_format.write_safetensors(os.path.join(d, "bad_missing_wpe.safetensors"), state)
PY
head -c 300 "$d/gpt2_1layer.safetensors" >"$d/bad_truncated.safetensors"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":[1,2,3]}  ' >"$d/bad_not_tensors.safetensors"
ls -l "$corpus"/*
