#!/usr/bin/python3
"""PyTorch reference of pipetrain's GPT (docs/design.md section 5) and llama (docs/models.md), and
the parity fixture writer.

Writes tests/data/gpt_parity.h5, which tests/unit/test_parity.cpp checks pipetrain against:
for a tied and an untied GPT-2, two llama models (untied with grouped-query attention, tied
without) and two mixtures of experts (docs/moe.md: a GPT-2 with an MoE layer every second block,
a shared expert and a capacity that drops tokens; a Mixtral-style llama), the float32 weights, one batch, its logits, mean loss and
every parameter gradient, and ten AdamW steps (batches, learning rates, grad norms, losses)
with warmup + cosine LR, global grad-norm clipping and decoupled weight decay; and the same ten
steps under PipeDream-2BW's delayed update (docs/design.md section 6): step t's gradient is taken at
W(max(t-1, 0)) and applied to W(t). For the bfloat16 activation format, the same batch's loss
and gradients under PyTorch's CPU autocast at bfloat16 (group autocast_bf16).

The reference computes in float64 from the float32 weights, so the fixture holds the exact
answer for those weights; pipetrain (float32) must come within the test's tolerances.

Needs Debian's python3-torch and python3-h5py (the system /usr/bin/python3):
    /usr/bin/python3 tools/reference/gpt_reference.py [--out tests/data/gpt_parity.h5]
"""
import argparse
import math

import h5py
import numpy as np
import torch
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=4, d_model=32, seq_len=16, vocab_size=64, batch=4)
# llama: 2 key/value heads for 4 query heads (grouped-query), or 4 (plain multi-head)
LLAMA = dict(CONFIG, llama=1, n_kv_head=2, ffn_hidden=48, rope_theta=500.0, norm_eps=1e-5)
# mixtures of experts: 4 routed experts of width 24, top 2; the objective adds aux_loss times
# each MoE layer's load-balancing loss and z_loss times its router z-loss
MOE = dict(experts=4, top_k=2, moe_ffn_hidden=24, every=1, shared_experts=0,
           capacity_factor=0.0, aux_loss=0.02, z_loss=0.0)
MOE_GPT2 = dict(CONFIG, moe=1, **dict(MOE, every=2, shared_experts=1, capacity_factor=0.75,
                                      z_loss=1e-3))
MIXTRAL = dict(LLAMA, moe=1, **MOE)
TRAIN = dict(steps=10, lr=3e-3, min_lr=3e-4, warmup_steps=3, weight_decay=0.1, grad_clip=0.5,
             beta1=0.9, beta2=0.95, eps=1e-8)


def is_moe(cfg, layer):
    return cfg.get("moe") and layer % cfg["every"] == 0


def mlp_names(cfg, layer):
    """A block's MLP tensors: the dense MLP's, or an MoE layer's router and stacked experts."""
    bias = not cfg.get("llama")
    if not is_moe(cfg, layer):
        return ["mlp/fc/weight"] + ["mlp/fc/bias"] * bias + ["mlp/proj/weight"] + \
            ["mlp/proj/bias"] * bias
    names = ["moe/router/weight"]
    for stack in ["experts"] + ["shared"] * (cfg["shared_experts"] > 0):
        names += [f"moe/{stack}/fc/weight"] + [f"moe/{stack}/fc/bias"] * bias + \
            [f"moe/{stack}/proj/weight"] + [f"moe/{stack}/proj/bias"] * bias
    return names


def param_names(cfg, tied):
    if cfg.get("llama"):
        names = ["wte"]
        for layer in range(cfg["n_layer"]):
            p = f"h/{layer:03d}/"
            names += [p + n for n in ("ln1/weight", "attn/qkv/weight", "attn/proj/weight",
                                      "ln2/weight")]
            names += [p + n for n in mlp_names(cfg, layer)]
        return names + ["lnf/weight"] + ([] if tied else ["lm_head/weight"])
    names = ["wte", "wpe"]
    for layer in range(cfg["n_layer"]):
        p = f"h/{layer:03d}/"
        names += [p + n for n in (
            "ln1/weight", "ln1/bias", "attn/qkv/weight", "attn/qkv/bias", "attn/proj/weight",
            "attn/proj/bias", "ln2/weight", "ln2/bias")]
        names += [p + n for n in mlp_names(cfg, layer)]
    names += ["lnf/weight", "lnf/bias"]
    if not tied:
        names.append("lm_head/weight")
    return names


def shape_of(name, cfg):
    C, V, T = cfg["d_model"], cfg["vocab_size"], cfg["seq_len"]
    if "/moe/" in name:  # stacked experts: (E or S, ...)
        Fe = cfg["moe_ffn_hidden"]
        n = cfg["experts"] if "/experts/" in name else cfg["shared_experts"]
        fc_rows = 2 * Fe if cfg.get("llama") else Fe
        table = {"router/weight": (cfg["experts"], C), "fc/weight": (n, fc_rows, C),
                 "fc/bias": (n, Fe), "proj/weight": (n, C, Fe), "proj/bias": (n, C)}
        return next(v for k, v in table.items() if name.endswith(k))
    if cfg.get("llama"):
        HD, Fh = C // cfg["n_head"], cfg["ffn_hidden"]
        rows = {"attn/qkv/weight": (cfg["n_head"] + 2 * cfg["n_kv_head"]) * HD,
                "mlp/fc/weight": 2 * Fh, "mlp/proj/weight": C}
        cols = {"mlp/proj/weight": Fh}
        for key in rows:
            if name.endswith(key):
                return (rows[key], cols.get(key, C))
    table = {"wte": (V, C), "wpe": (T, C), "lm_head/weight": (V, C),
             "attn/qkv/weight": (3 * C, C), "attn/qkv/bias": (3 * C,),
             "attn/proj/weight": (C, C), "attn/proj/bias": (C,),
             "mlp/fc/weight": (4 * C, C), "mlp/fc/bias": (4 * C,),
             "mlp/proj/weight": (C, 4 * C), "mlp/proj/bias": (C,)}
    for key, shape in table.items():
        if name == key or name.endswith("/" + key):
            return shape
    return (C,)  # layer norms


def init_params(cfg, tied, gen):
    """The init of docs/design.md section 5, with biases and norm parameters perturbed so that every parameter
    changes the output (an ignored bias would then show in the logits)."""
    params = {}
    resid_std = 0.02 / math.sqrt(2 * cfg["n_layer"])
    for name in param_names(cfg, tied):
        shape = shape_of(name, cfg)
        if name.endswith("bias"):
            t = torch.randn(shape, generator=gen) * 0.02
        elif "ln" in name and "lm_head" not in name:
            t = 1.0 + torch.randn(shape, generator=gen) * 0.1
        else:
            std = resid_std if name.endswith("proj/weight") else 0.02
            t = torch.randn(shape, generator=gen) * std
        params[name] = t.float()  # the fixture's weights are float32
    return params


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, theta):
    """Hugging Face's rotary embedding of x (B, heads, T, HD): the halves of each head turned by
    position * theta^(-2i/HD)."""
    T, HD = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
    rotate_half = torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], dim=-1)
    return x * cos + rotate_half * sin


def expert(p, stack, e, cfg, x):
    """Expert e of a stack on rows x: gpt2's GELU MLP with biases, or llama's SwiGLU (gate rows,
    then up rows: Mixtral's w1 and w3) without."""
    fc_w, proj_w = p[stack + "fc/weight"][e], p[stack + "proj/weight"][e]
    if cfg.get("llama"):
        gate, up = F.linear(x, fc_w).split(cfg["moe_ffn_hidden"], dim=-1)
        return F.linear(F.silu(gate) * up, proj_w)
    h = F.gelu(F.linear(x, fc_w, p[stack + "fc/bias"][e]), approximate="tanh")
    return F.linear(h, proj_w, p[stack + "proj/bias"][e])


def load_balancing_loss(logits, E, k):
    """Switch Transformer's loss as transformers' load_balancing_loss_func computes it, for one
    layer's router logits (N, E): E * sum over experts of the fraction of (token, slot) choices
    it gets times its mean probability."""
    probs = logits.softmax(dim=-1)
    _, chosen = torch.topk(probs, k, dim=-1)
    tokens_per_expert = F.one_hot(chosen, E).to(probs.dtype).mean(dim=0)  # (k, E)
    return E * (tokens_per_expert * probs.mean(dim=0)).sum()


def moe_mlp(p, q, cfg, h):
    """An MoE layer on h (B, T, C) the way transformers' Mixtral block computes it: router
    logits, softmax, top k, the k weights divided by their sum, each expert on its tokens and
    its weighted outputs added into theirs; plus (pipetrain's) capacity, shared experts and the
    layer's auxiliary losses. Returns the output and aux_loss * balance + z_loss * z."""
    B, T, C = h.shape
    E, k = cfg["experts"], cfg["top_k"]
    x = h.reshape(B * T, C)
    logits = F.linear(x, p[q + "moe/router/weight"])
    weights, chosen = torch.topk(logits.softmax(dim=-1), k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    cap = B * T * k
    if cfg["capacity_factor"] > 0:
        cap = math.ceil(cfg["capacity_factor"] * B * T * k / E)
    out = torch.zeros_like(x)
    for e in range(E):
        token, slot = torch.where(chosen == e)  # in token order: the first cap are kept
        token, slot = token[:cap], slot[:cap]
        y = expert(p, q + "moe/experts/", e, cfg, x[token]) * weights[token, slot, None]
        out = out.index_add(0, token, y.to(out.dtype))
    for s in range(cfg["shared_experts"]):
        out = out + expert(p, q + "moe/shared/", s, cfg, x)
    aux = cfg["aux_loss"] * load_balancing_loss(logits, E, k) + \
        cfg["z_loss"] * torch.logsumexp(logits, dim=-1).pow(2).mean()
    return out.view(B, T, C), aux


def mlp(p, q, cfg, h):
    """A block's MLP branch on its normed input h, and its auxiliary loss (0 for a dense MLP)."""
    if is_moe(cfg, int(q[2:5])):
        return moe_mlp(p, q, cfg, h)
    if cfg.get("llama"):
        gate, up = F.linear(h, p[q + "mlp/fc/weight"]).split(cfg["ffn_hidden"], dim=2)
        return F.linear(F.silu(gate) * up, p[q + "mlp/proj/weight"]), 0.0
    h = F.gelu(F.linear(h, p[q + "mlp/fc/weight"], p[q + "mlp/fc/bias"]), approximate="tanh")
    return F.linear(h, p[q + "mlp/proj/weight"], p[q + "mlp/proj/bias"]), 0.0


def llama_blocks(p, cfg, x):
    B, T, C = x.shape
    NH, NKV, eps = cfg["n_head"], cfg["n_kv_head"], cfg["norm_eps"]
    HD = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    aux = 0.0
    for layer in range(cfg["n_layer"]):
        q = f"h/{layer:03d}/"
        h = rms_norm(x, p[q + "ln1/weight"], eps)
        qq, kk, vv = F.linear(h, p[q + "attn/qkv/weight"]).split([NH * HD, NKV * HD, NKV * HD], 2)
        qq = rotary(qq.view(B, T, NH, HD).transpose(1, 2), cfg["rope_theta"])
        kk = rotary(kk.view(B, T, NKV, HD).transpose(1, 2), cfg["rope_theta"])
        vv = vv.view(B, T, NKV, HD).transpose(1, 2)
        kk, vv = kk.repeat_interleave(NH // NKV, dim=1), vv.repeat_interleave(NH // NKV, dim=1)
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(HD)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[q + "attn/proj/weight"])
        out, layer_aux = mlp(p, q, cfg, rms_norm(x, p[q + "ln2/weight"], eps))
        x, aux = x + out, aux + layer_aux
    return rms_norm(x, p["lnf/weight"], eps), aux


def forward(p, cfg, tied, idx, targets):
    """Mean cross-entropy, logits and the auxiliary losses (the objective is their sum). p: name
    -> float64 tensor with requires_grad."""
    B, T = idx.shape
    if cfg.get("llama"):
        x, aux = llama_blocks(p, cfg, p["wte"][idx])
        logits = F.linear(x, p["wte"] if tied else p["lm_head/weight"])
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        loss = F.cross_entropy(wide.reshape(-1, wide.size(-1)), targets.reshape(-1))
        return loss, logits, aux
    C, NH, L = cfg["d_model"], cfg["n_head"], cfg["n_layer"]
    HS = C // NH
    x = p["wte"][idx] + p["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    aux = 0.0
    for layer in range(L):
        q = f"h/{layer:03d}/"
        h = F.layer_norm(x, (C,), p[q + "ln1/weight"], p[q + "ln1/bias"], eps=1e-5)
        qkv = F.linear(h, p[q + "attn/qkv/weight"], p[q + "attn/qkv/bias"])
        qq, kk, vv = qkv.split(C, dim=2)
        qq = qq.view(B, T, NH, HS).transpose(1, 2)
        kk = kk.view(B, T, NH, HS).transpose(1, 2)
        vv = vv.view(B, T, NH, HS).transpose(1, 2)
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[q + "attn/proj/weight"], p[q + "attn/proj/bias"])
        out, layer_aux = mlp(p, q, cfg, F.layer_norm(x, (C,), p[q + "ln2/weight"],
                                                      p[q + "ln2/bias"], eps=1e-5))
        x, aux = x + out, aux + layer_aux
    x = F.layer_norm(x, (C,), p["lnf/weight"], p["lnf/bias"], eps=1e-5)
    logits = F.linear(x, p["wte"] if tied else p["lm_head/weight"])
    # the loss in at least float32 (under autocast the logits are bfloat16)
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss = F.cross_entropy(wide.reshape(-1, wide.size(-1)), targets.reshape(-1))
    return loss, logits, aux


def autocast_gradients(weights, cfg, tied, idx, targets):
    """Loss and gradients of float32 weights under PyTorch's CPU autocast at bfloat16: the
    mixed-precision step a PyTorch user runs (products in bfloat16, layer norm and the loss in
    float32), which pipetrain's device.precision = "bf16" is compared with."""
    p = {n: w.detach().clone().requires_grad_(True) for n, w in weights.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, aux = forward(p, cfg, tied, idx, targets)
    (loss + aux).backward()
    return loss.item(), {n: t.grad.float() for n, t in p.items()}


def learning_rate(step):
    t = TRAIN
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    decay = max(1, t["steps"] - t["warmup_steps"])
    progress = min(1.0, (step - t["warmup_steps"]) / decay)
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1.0 + math.cos(math.pi * progress))


def adamw_steps(weights, cfg, tied, tokens, delayed):
    """Ten AdamW steps (no decay on biases and norms) on tokens[1:]; delayed: each step's gradient
    at the weights one step older (2bw). Returns the losses and the gradient norms."""
    T = cfg["seq_len"]
    p = {n: w.double().requires_grad_(True) for n, w in weights.items()}
    # matrices decay; biases (the experts' stacked ones too) and norms do not
    decays = {n: len(t.shape) >= 2 and not n.endswith("bias") for n, t in p.items()}
    decay = [t for n, t in p.items() if decays[n]]
    no_decay = [t for n, t in p.items() if not decays[n]]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": TRAIN["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"])
    older = {n: t.detach().clone() for n, t in p.items()}  # W(max(t-1, 0))
    losses, norms = [], []
    for step in range(TRAIN["steps"]):
        opt.zero_grad()
        x, y = tokens[step + 1, :, :T], tokens[step + 1, :, 1:]
        at = {n: older[n].clone().requires_grad_(True) for n in p} if delayed else p
        loss, _, aux = forward(at, cfg, tied, x, y)
        (loss + aux).backward()
        if delayed:
            for n, t in p.items():
                t.grad = at[n].grad
            older = {n: t.detach().clone() for n, t in p.items()}  # W(t), for step t+1
        norm = torch.nn.utils.clip_grad_norm_(list(p.values()), TRAIN["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(step)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms


def write_case(group, cfg, tied, seed):
    gen = torch.Generator().manual_seed(seed)
    weights = init_params(cfg, tied, gen)
    B, T, V = cfg["batch"], cfg["seq_len"], cfg["vocab_size"]
    steps = TRAIN["steps"]
    tokens = torch.randint(0, V, (2, B, T + 1), generator=gen)
    batch_in, batch_tg = tokens[0, :, :T], tokens[0, :, 1:]
    # The ten steps fit one batch again and again, so the loss must fall at every step: an
    # optimizer that did nothing, or the wrong thing, cannot stay within the tolerance.
    tokens = torch.cat([tokens[:1], tokens[1:2].expand(steps, B, T + 1)])

    for k, v in {**cfg, **TRAIN, "tie_embeddings": int(tied)}.items():
        group.attrs[k] = v
    for name, w in weights.items():
        group.create_dataset("model/" + name, data=w.numpy())
    group.create_dataset("batch/inputs", data=batch_in.numpy().astype(np.int32))
    group.create_dataset("batch/targets", data=batch_tg.numpy().astype(np.int32))

    # one forward/backward in float64
    p = {n: w.double().requires_grad_(True) for n, w in weights.items()}
    loss, logits, aux = forward(p, cfg, tied, batch_in, batch_tg)
    (loss + aux).backward()
    group.create_dataset("logits", data=logits.detach().float().numpy())
    group.attrs["loss"] = loss.item()
    for name, t in p.items():
        group.create_dataset("grads/" + name, data=t.grad.float().numpy())

    ac_loss, ac_grads = autocast_gradients(weights, cfg, tied, batch_in, batch_tg)
    group.attrs["autocast_bf16_loss"] = ac_loss
    for name, g in ac_grads.items():
        group.create_dataset("autocast_bf16/grads/" + name, data=g.numpy())

    losses, norms = adamw_steps(weights, cfg, tied, tokens, delayed=False)
    lrs = [learning_rate(step) for step in range(steps)]
    group.create_dataset("train/inputs", data=tokens[1:, :, :T].numpy().astype(np.int32))
    group.create_dataset("train/targets", data=tokens[1:, :, 1:].numpy().astype(np.int32))
    group.create_dataset("train/losses", data=np.array(losses))
    group.create_dataset("train/grad_norms", data=np.array(norms))
    group.create_dataset("train/lrs", data=np.array(lrs))
    two_bw_losses, two_bw_norms = adamw_steps(weights, cfg, tied, tokens, delayed=True)
    group.create_dataset("two_bw/losses", data=np.array(two_bw_losses))
    group.create_dataset("two_bw/grad_norms", data=np.array(two_bw_norms))
    return losses, norms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/gpt_parity.h5")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    with h5py.File(args.out, "w") as f:
        f.attrs["generator"] = "tools/reference/gpt_reference.py (torch %s)" % torch.__version__
        for name, cfg, tied, seed in (("tied", CONFIG, True, 1234), ("untied", CONFIG, False, 4321),
                                      ("llama_gqa", LLAMA, False, 5678),
                                      ("llama_tied", dict(LLAMA, n_kv_head=4), True, 8765),
                                      ("moe_gpt2", MOE_GPT2, True, 2468),
                                      ("mixtral", MIXTRAL, False, 1357)):
            losses, norms = write_case(f.create_group(name), cfg, tied, seed)
            print(f"{name}: losses {losses[0]:.6f} -> {losses[-1]:.6f}, "
                  f"grad norms {min(norms):.3f}..{max(norms):.3f} (clip {TRAIN['grad_clip']})")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
