#!/usr/bin/env bash
# train_parity.sh PIPETRAIN DECK DATA OUT -- MPIRUN...: the CUDA backend's training against the
# host's (docs/cuda.md). Ten steps of DECK on one rank on the host and on the GPU (fp32) must give
# the same losses within 1e-4 relative; then two ranks sharing the GPU run pp = 2 (MPI p2p),
# dp = 2, tp = 2 (MPI reductions of host copies; NCCL where two GPUs are visible, one per
# rank) and dp = 2 with ZeRO-1 (host copies), and each must match the one-rank GPU run within 1e-4; with one GPU, asking for NCCL
# (reductions or pipeline messages) must be refused (exit 2). Where two GPUs are visible, pp = 2
# also runs with its messages through NCCL (comm.gpu_p2p), 1F1B and interleaved. Last, the flash attention kernels: ten steps at bf16 of a model with
# GPT-2's head size (64) and sequences of 160 tokens (three tiles, the last short) against the
# host's bf16 run, losses within 2 eps = 7.8e-3 relative (the bf16 loss tolerance of the fixture
# test); the same at full recompute within 1e-4 (the rounds the products make); pp = 2
# within 1e-4; cuDNN's attention (where built) within 7.8e-3 of the flash kernels. Exits 77
# (CTest: skipped) when this pipetrain cannot use a GPU, never 0.
set -uo pipefail
pipetrain=$1 deck=$2 data=$3 out=$4
shift 5 # the "--" too
mpirun=("$@")
compare="$(dirname "$0")/../mpi/compare_runs.py"
common=("$deck" "data.path=$data" train.steps=10 train.global_batch=8 train.micro_batch=4
        log.every=1)
rm -rf "$out"
mkdir -p "$out"

run() { # name, then extra arguments; prints the run's output on failure
  local name=$1
  shift
  if ! "$@" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"
    return 1
  fi
}

run host "$pipetrain" "${common[@]}" parallel.pp=1 "log.dir=$out/host" || exit 1
"$pipetrain" "${common[@]}" parallel.pp=1 device.kind=\"cuda\" "log.dir=$out/cuda" \
  >"$out/cuda.log" 2>&1
rc=$?
if [[ $rc -eq 2 ]] && grep -q "no usable GPU\|built without CUDA" "$out/cuda.log"; then
  echo "SKIP: $(grep -m1 'device.kind' "$out/cuda.log")"
  exit 77
fi
if [[ $rc -ne 0 ]]; then
  cat "$out/cuda.log"
  exit 1
fi
echo "== host vs CUDA fp32, one rank =="
python3 "$compare" 1e-4 "$out/host/metrics.jsonl" "$out/cuda/metrics.jsonl" || exit 1
echo "== CUDA one rank vs CUDA pp=2 on two ranks sharing the GPU =="
run pp2 "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=2 device.kind=\"cuda\" \
  "log.dir=$out/pp2" || exit 1
python3 "$compare" 1e-4 "$out/cuda/metrics.jsonl" "$out/pp2/metrics.jsonl" || exit 1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -ge 2 ]]; then
  shared="one GPU per rank"
  collectives=nccl
else
  shared="two ranks sharing the GPU"
  collectives=mpi
  echo "== comm.gpu_collectives = nccl is refused with two ranks on one GPU =="
  "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=1 parallel.dp=2 \
    device.kind=\"cuda\" comm.gpu_collectives=\"nccl\" "log.dir=$out/refused" \
    >"$out/refused.log" 2>&1
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -q "NCCL needs one GPU per rank" "$out/refused.log"; then
    echo "expected exit 2 naming the shared GPU, got $rc:"
    cat "$out/refused.log"
    exit 1
  fi
  echo "== comm.gpu_p2p = nccl is refused with two ranks on one GPU =="
  "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=2 device.kind=\"cuda\" \
    comm.gpu_p2p=\"nccl\" "log.dir=$out/refused_p2p" >"$out/refused_p2p.log" 2>&1
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -q 'comm.gpu_p2p = "nccl".*NCCL needs one GPU per rank' \
    "$out/refused_p2p.log"; then
    echo "expected exit 2 naming the shared GPU, got $rc:"
    cat "$out/refused_p2p.log"
    exit 1
  fi
fi
if [[ $gpus -ge 2 ]]; then
  echo "== CUDA one rank vs CUDA pp=2, messages through NCCL (1F1B, then interleaved v=2) =="
  run pp2_nccl "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=2 \
    device.kind=\"cuda\" comm.gpu_p2p=\"nccl\" "log.dir=$out/pp2_nccl" || exit 1
  grep -q "GPU pipeline messages: NCCL" "$out/pp2_nccl.log" || {
    echo "the run did not say its messages went through NCCL:"
    cat "$out/pp2_nccl.log"
    exit 1
  }
  python3 "$compare" 1e-4 "$out/cuda/metrics.jsonl" "$out/pp2_nccl/metrics.jsonl" || exit 1
  run pp2_nccl_v2 "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=2 \
    parallel.virtual_stages=2 parallel.schedule=\"interleaved\" model.n_layer=4 \
    device.kind=\"cuda\" comm.gpu_p2p=\"nccl\" "log.dir=$out/pp2_nccl_v2" || exit 1
  run one_v2 "$pipetrain" "${common[@]}" parallel.pp=1 model.n_layer=4 device.kind=\"cuda\" \
    "log.dir=$out/one_v2" || exit 1
  python3 "$compare" 1e-4 "$out/one_v2/metrics.jsonl" "$out/pp2_nccl_v2/metrics.jsonl" || exit 1
fi
for layout in dp tp; do
  echo "== CUDA one rank vs CUDA ${layout}=2, ${shared} (${collectives} reductions) =="
  run "${layout}2" "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=1 \
    "parallel.${layout}=2" device.kind=\"cuda\" "comm.gpu_collectives=\"$collectives\"" \
    "log.dir=$out/${layout}2" || exit 1
  python3 "$compare" 1e-4 "$out/cuda/metrics.jsonl" "$out/${layout}2/metrics.jsonl" || exit 1
done
echo "== CUDA one rank vs CUDA dp=2 with ZeRO-1 (its reduce-scatter and all-gather through host copies) =="
run zero2 "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=1 parallel.dp=2 \
  parallel.zero=1 device.kind=\"cuda\" "log.dir=$out/zero2" || exit 1
python3 "$compare" 1e-4 "$out/cuda/metrics.jsonl" "$out/zero2/metrics.jsonl" || exit 1
echo "== CUDA one rank vs CUDA tp=2 with sequence parallelism (${collectives} reductions) =="
run sp2 "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" parallel.pp=1 parallel.tp=2 \
  parallel.sequence_parallel=true device.kind=\"cuda\" "comm.gpu_collectives=\"$collectives\"" \
  "log.dir=$out/sp2" || exit 1
python3 "$compare" 1e-4 "$out/cuda/metrics.jsonl" "$out/sp2/metrics.jsonl" || exit 1
echo "== host bf16 vs CUDA bf16 through the flash attention kernels (head size 64, T = 160) =="
flash=(model.d_model=128 model.n_head=2 model.seq_len=160 parallel.pp=1
       device.precision=\"bf16\" device.attention=\"flash\")
run flash_host "$pipetrain" "${common[@]}" "${flash[@]}" device.attention=\"auto\" \
  "log.dir=$out/flash_host" || exit 1
run flash_bf16 "$pipetrain" "${common[@]}" "${flash[@]}" device.kind=\"cuda\" \
  "log.dir=$out/flash_bf16" || exit 1
python3 "$compare" --losses-only 7.8e-3 "$out/flash_host/metrics.jsonl" \
  "$out/flash_bf16/metrics.jsonl" || exit 1
echo "== CUDA bf16: full recompute (fp32 activations, rounded by the products) vs kept packed" \
  "(the packed products) =="
run flash_bf16_full "$pipetrain" "${common[@]}" "${flash[@]}" device.kind=\"cuda\" \
  train.recompute=\"full\" "log.dir=$out/flash_bf16_full" || exit 1
# within 1e-4, not bit for bit: the embedding's gradient is still summed with atomics
python3 "$compare" --losses-only 1e-4 "$out/flash_bf16/metrics.jsonl" \
  "$out/flash_bf16_full/metrics.jsonl" || exit 1
echo "== CUDA bf16 one rank vs pp = 2 on two ranks (bf16 messages) =="
run flash_bf16_pp2 "${mpirun[@]}" -np 2 "$pipetrain" "${common[@]}" "${flash[@]}" \
  parallel.pp=2 device.kind=\"cuda\" "log.dir=$out/flash_bf16_pp2" || exit 1
python3 "$compare" 1e-4 "$out/flash_bf16/metrics.jsonl" "$out/flash_bf16_pp2/metrics.jsonl" ||
  exit 1
echo "== CUDA bf16: cuDNN's fused attention vs the flash kernels =="
"$pipetrain" "${common[@]}" "${flash[@]}" device.kind=\"cuda\" device.attention=\"cudnn\" \
  "log.dir=$out/cudnn_bf16" >"$out/cudnn_bf16.log" 2>&1
rc=$?
if [[ $rc -eq 2 ]] && grep -q "this build has no cuDNN attention" "$out/cudnn_bf16.log"; then
  echo "SKIP (this part): $(grep -m1 -o 'this build has no cuDNN attention[^;]*' "$out/cudnn_bf16.log")"
elif [[ $rc -ne 0 ]]; then
  cat "$out/cudnn_bf16.log"
  exit 1
else
  python3 "$compare" --losses-only 7.8e-3 "$out/flash_bf16/metrics.jsonl" \
    "$out/cudnn_bf16/metrics.jsonl" || exit 1
fi
