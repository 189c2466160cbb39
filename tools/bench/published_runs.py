"""Four published training runs, as tools/bench/planner-published and planner-megatron predict
them (docs/planner.md, "Against published runs"): each row's model, batch, GPUs, the layout the
paper gives, the machine file of its cluster, and the throughput it reports, with the FLOP count
the paper used to turn its step time into TFLOP/s per GPU."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
A100 = os.path.join(ROOT, "inputs", "machines", "a100-dgx.toml")
H100 = os.path.join(ROOT, "inputs", "machines", "h100-dgx.toml")


def gpt(layers, heads, hidden, vocab=51200, seq=2048):
    return dict(n_layer=layers, n_head=heads, d_model=hidden, seq_len=seq, vocab_size=vocab)


def megatron_flops(model, batch):
    """Narayanan et al. 2021, eq. 3: FLOPs of an iteration with full recompute (four passes),
    96 B s L h^2 (1 + s / 6h + V / 16 L h); MT-NLG and BLOOM report with the same count."""
    s, L, h, V = model["seq_len"], model["n_layer"], model["d_model"], model["vocab_size"]
    return 96 * batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


LLAMA_405B = dict(arch='"llama"', n_layer=126, n_head=128, n_kv_head=8, d_model=16384,
                  ffn_hidden=53248, seq_len=8192, vocab_size=128256, rope_theta=500000.0)


def palm_flops(model, batch):
    """Llama 3's BF16 MFU follows Chowdhery et al. 2022 (PaLM, appendix B): 6 N + 12 L d T FLOPs a
    token, N all parameters (405.8B here)."""
    L, d, T, V = model["n_layer"], model["d_model"], model["seq_len"], model["vocab_size"]
    kv = d // model["n_head"] * model["n_kv_head"]
    n = L * (2 * d * d + 2 * d * kv + 3 * d * model["ffn_hidden"]) + 2 * V * d
    return batch * T * (6 * n + 12 * L * d * T)


def row(run, model, batch, gpus, tp, pp, published, flops, machine, fixed=(), step_s=None):
    return dict(run=run, model=model, batch=batch, gpus=gpus, tp=tp, pp=pp, dp=gpus // (tp * pp),
                published=published, flops=flops, machine=machine, fixed=list(fixed),
                step_s=step_s)


# Narayanan et al. 2021 (arXiv 2104.04473) Table 1: full recompute. Its pipeline messages went
# as tp slices over the tp ranks' own network ports (the paper's scatter/gather, section 4.1),
# the N/tp rows pipetrain's sequence parallelism sends, so the planner may choose sp.
MEGATRON = [row(f"Megatron-LM {p}B", gpt(L, a, h), b, g, t, pp, pub, megatron_flops, A100,
                ['train.recompute="full"'])
            for p, a, h, L, t, pp, g, b, pub in
            [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
             (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
             (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
             (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
             (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
             (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
             (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]]

# Smith et al. 2022 (arXiv 2201.11990) section 2.4: 530B, tp 8 x pp 35 on 280/350/420 DGX A100
# nodes, global batch 1920, DeepSpeed's pipeline (1F1B), micro-batch 1, full recompute
MT_NLG = [row(f"MT-NLG 530B, {g // 8} nodes", gpt(105, 128, 20480), 1920, g, 8, 35, pub,
              megatron_flops, A100,
              ['train.recompute="full"', "parallel.sequence_parallel=false",
               'parallel.schedule="1f1b"', "train.micro_batch=1"], step)
          for g, pub, step in [(2240, 126, 60.1), (2800, 121, 50.2), (3360, 113, 44.4)]]

# BigScience 2022 (arXiv 2211.05100; tr11-176B-ml): 70 layers, hidden 14336, 112 heads, vocabulary
# 250,880 (padded), tp 4 x pp 12 x dp 8 on 48 DGX A100 nodes, global batch 2048, micro-batch 2,
# DeepSpeed's 1F1B, full recompute, its ZeRO-1; about 150 TFLOP/s a GPU at about 105 s a step
BLOOM = [row("BLOOM 176B", gpt(70, 112, 14336, vocab=250880), 2048, 384, 4, 12, 150,
             megatron_flops, A100,
             ['train.recompute="full"', "parallel.sequence_parallel=false",
              'parallel.schedule="1f1b"', "train.micro_batch=2", "parallel.zero=1"], 105)]

# Llama 3 (arXiv 2407.21783) Table 4, the rows without context parallelism: tp 8 x pp 16 on H100s,
# sequence 8192, 16M tokens a step; interleaved pipeline schedule, no activation recompute
LLAMA3 = [row(f"Llama 3 405B, {g} GPUs", LLAMA_405B, 2048, g, 8, 16, pub, palm_flops, H100,
              ['train.recompute="none"', 'parallel.schedule="interleaved"',
               "train.micro_batch=1"])
          for g, pub in [(8192, 430), (16384, 400)]]

RUNS = MEGATRON + MT_NLG + BLOOM + LLAMA3


def layout(r, published=True):
    """The overrides fixing run r's tp and pp, and with `published` the other keys its paper gives."""
    return [f"parallel.tp={r['tp']}", f"parallel.pp={r['pp']}", *(r["fixed"] if published else [])]


def plan(pipetrain, r, fixed, machine=None):
    """pipetrain plan's rows (best first) for run r on its GPUs, the `fixed` overrides fixed."""
    args = [pipetrain, "plan", os.path.join(ROOT, "inputs", "tiny.toml"),
            *[f"model.{k}={v}" for k, v in r["model"].items()], f"train.global_batch={r['batch']}",
            "data.val_every=0", 'device.precision="bf16"', *fixed, "--ranks", str(r["gpus"]),
            "--machine", machine or r["machine"], "--json", "--top", "100000"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{r['run']}: pipetrain plan failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def tflops(r, step_time_s):
    """TFLOP/s a GPU at this step time, in the paper's own count."""
    return r["flops"](r["model"], r["batch"]) / step_time_s / r["gpus"] / 1e12
