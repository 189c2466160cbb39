"""Hugging Face's file formats for tools/ckpt export --format hf (docs/models.md).

safetensors, by its published layout: an 8-byte little-endian header length N, N bytes of JSON
({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, offsets from
the byte after the header, the header padded with spaces to a multiple of 8), then the raw
little-endian tensors. config.json for transformers' GPT2LMHeadModel or LlamaForCausalLM, and the
map from pipetrain's tensor names to theirs.

Only numpy is needed. The model's keys come from the checkpoint's resolved deck (/config), which
records the architecture whole (arch, tie_embeddings and, for llama, n_kv_head, ffn_hidden,
rope_theta, norm_eps); which Hugging Face tensor each of pipetrain's is comes from pipetrain's
own tensor table (`pipetrain schema`), not from this file.
"""
import json
import sys
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


def hf_model(model, params, schema, moe=None):
    """(config.json's dict, name -> array in Hugging Face's names) for the deck's [model] and
    [moe] tables, pipetrain's tensors (name -> array, names as in docs/design.md section 8) and
    the model's tensor table (`pipetrain schema`, the JSON of src/model/schema.hpp)."""
    moe = moe or {}
    if moe.get("experts", 0) > 0:
        config = mixtral_config(model, moe)
    elif model.get("arch", "gpt2") == "llama":
        config = llama_config(model)
    else:
        config = gpt2_config(model)
    return config, hf_tensors(params, schema)


def hf_tensors(params, schema):
    """Each tensor under its Hugging Face name(s): where it has several, split into its stacked
    parts by the schema's global rows; each transposed where Hugging Face stores it (columns,
    rows)."""
    specs = {t["name"]: t for t in schema["tensors"]}
    out = {}
    for name, x in params.items():
        layer, rest = "", name
        if name.startswith("h/"):  # h/NNN/<block tensor>
            layer, rest = str(int(name[2:5])), name[6:]
        spec = specs[rest]
        # a stack of experts (E, rows, cols): each expert's parts under its own names
        experts = list(enumerate(x)) if "{e}" in "".join(spec["hf"]) else [(None, x)]
        for e, xe in experts:
            begin, parts = 0, spec["parts"] if len(spec["hf"]) > 1 else [xe.shape[0]]
            for pattern, rows in zip(spec["hf"], parts):
                part = xe[begin:begin + rows]
                begin += rows
                hf = pattern.replace("{}", layer).replace("{e}", str(e))
                out[hf] = part.T if spec["hf_transposed"] else part
    return out


def gpt2_config(m):
    C = m["d_model"]
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": m["vocab_size"], "n_positions": m["seq_len"], "n_embd": C,
            "n_layer": m["n_layer"], "n_head": m["n_head"], "n_inner": 4 * C,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": 0, "eos_token_id": 0,
            "tie_word_embeddings": m.get("tie_embeddings", True), "torch_dtype": "float32"}


def mixtral_config(m, moe):
    """MixtralForCausalLM's: llama's blocks with every MLP routed (docs/moe.md); transformers'
    loss is then the cross-entropy alone (output_router_logits false), as pipetrain's `loss`."""
    if m.get("arch") != "llama" or moe.get("every", 1) != 1 or moe.get("shared_experts", 0):
        sys.exit("hf_format: Hugging Face's Mixtral format holds llama blocks, every one routed, "
                 "without shared experts; this mixture of experts is another (docs/moe.md)")
    config = dict(llama_config(m), architectures=["MixtralForCausalLM"], model_type="mixtral",
                  intermediate_size=moe.get("ffn_hidden") or m["ffn_hidden"],
                  num_local_experts=moe["experts"], num_experts_per_tok=moe.get("top_k", 2),
                  router_aux_loss_coef=moe.get("aux_loss", 0.01), output_router_logits=False,
                  router_jitter_noise=0.0, sliding_window=None)
    for key in ("attention_bias", "mlp_bias", "hidden_act"):
        config.pop(key, None)
    return config


def llama_config(m):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": m["vocab_size"], "hidden_size": m["d_model"],
            "intermediate_size": m["ffn_hidden"], "num_hidden_layers": m["n_layer"],
            "num_attention_heads": m["n_head"], "num_key_value_heads": m["n_kv_head"],
            "max_position_embeddings": m["seq_len"], "rms_norm_eps": m["norm_eps"],
            "rope_theta": m["rope_theta"], "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "bos_token_id": 0, "eos_token_id": 0,
            "tie_word_embeddings": m["tie_embeddings"], "torch_dtype": "float32"}
