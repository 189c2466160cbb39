"""Hugging Face's file formats for tools/ckpt export --format hf (docs/models.md).

safetensors, by its published layout: an 8-byte little-endian header length N, N bytes of JSON
({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, offsets from
the byte after the header, the header padded with spaces to a multiple of 8), then the raw
little-endian tensors. config.json for transformers' GPT2LMHeadModel or LlamaForCausalLM, and the
map from pipetrain's tensor names to theirs.

Only numpy is needed. The model's keys come from the checkpoint's resolved deck (/config), which
records the architecture whole (arch, tie_embeddings and, for llama, n_kv_head, ffn_hidden,
rope_theta, norm_eps).
"""
import json
import struct

import numpy as np


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> float32 array, written in name order."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(data.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
        blobs.append(data.tobytes())
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def hf_model(model, params):
    """(config.json's dict, name -> array in Hugging Face's names) for the deck's [model] table and
    pipetrain's tensors (name -> array, names as in docs/design.md section 8)."""
    if model.get("arch", "gpt2") == "llama":
        return llama(model, params)
    return gpt2(model, params)


def gpt2(m, p):
    C, L = m["d_model"], m["n_layer"]
    tied = m.get("tie_embeddings", True)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
              "vocab_size": m["vocab_size"], "n_positions": m["seq_len"], "n_embd": C,
              "n_layer": L, "n_head": m["n_head"], "n_inner": 4 * C,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
              "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": tied,
              "torch_dtype": "float32"}
    out = {"transformer.wte.weight": p["wte"], "transformer.wpe.weight": p["wpe"],
           "transformer.ln_f.weight": p["lnf/weight"], "transformer.ln_f.bias": p["lnf/bias"]}
    # GPT-2's attention and MLP matrices are Conv1D: stored (in, out), a Linear's transpose
    names = {"ln1": "ln_1", "ln2": "ln_2", "attn/qkv": "attn.c_attn", "attn/proj": "attn.c_proj",
             "mlp/fc": "mlp.c_fc", "mlp/proj": "mlp.c_proj"}
    for i in range(L):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                x = p[f"h/{i:03d}/{ours}/{kind}"]
                if kind == "weight" and "ln" not in ours:
                    x = x.T
                out[f"transformer.h.{i}.{theirs}.{kind}"] = x
    if not tied:
        out["lm_head.weight"] = p["lm_head/weight"]
    return config, out


def llama(m, p):
    C, L, NH, NKV = m["d_model"], m["n_layer"], m["n_head"], m["n_kv_head"]
    HD, F = C // NH, m["ffn_hidden"]
    tied = m["tie_embeddings"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": m["vocab_size"], "hidden_size": C, "intermediate_size": F,
              "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
              "max_position_embeddings": m["seq_len"], "rms_norm_eps": m["norm_eps"],
              "rope_theta": m["rope_theta"], "hidden_act": "silu", "attention_bias": False,
              "mlp_bias": False, "bos_token_id": 0, "eos_token_id": 0,
              "tie_word_embeddings": tied, "torch_dtype": "float32"}
    out = {"model.embed_tokens.weight": p["wte"], "model.norm.weight": p["lnf/weight"]}
    for i in range(L):
        ours, theirs = f"h/{i:03d}/", f"model.layers.{i}."
        qkv, fc = p[ours + "attn/qkv/weight"], p[ours + "mlp/fc/weight"]
        out.update({
            theirs + "input_layernorm.weight": p[ours + "ln1/weight"],
            theirs + "self_attn.q_proj.weight": qkv[:NH * HD],
            theirs + "self_attn.k_proj.weight": qkv[NH * HD:(NH + NKV) * HD],
            theirs + "self_attn.v_proj.weight": qkv[(NH + NKV) * HD:],
            theirs + "self_attn.o_proj.weight": p[ours + "attn/proj/weight"],
            theirs + "post_attention_layernorm.weight": p[ours + "ln2/weight"],
            theirs + "mlp.gate_proj.weight": fc[:F],
            theirs + "mlp.up_proj.weight": fc[F:],
            theirs + "mlp.down_proj.weight": p[ours + "mlp/proj/weight"]})
    if not tied:
        out["lm_head.weight"] = p["lm_head/weight"]
    return config, out
