#include "model/schema.hpp"

#include <sstream>

namespace pt {
namespace {

// Shape rules. C = d_model, V = vocab_size, T = seq_len, F = mlp_width, q / kv = the query's and
// the key/value heads' rows (docs/models.md).
Dims vocab_by_width(const ModelConfig& m) {
  return {m.vocab_size, m.d_model};
}
Dims positions(const ModelConfig& m) {
  return {m.seq_len, m.d_model};
}
Dims width(const ModelConfig& m) {
  return {m.d_model};
}
Dims square(const ModelConfig& m) {
  return {m.d_model, m.d_model};
}
Dims qkv(const ModelConfig& m) {
  return {qkv_rows(m), m.d_model};
}
Dims qkv_parts(const ModelConfig& m) {
  const int kv = kv_heads(m) * head_dim(m);
  return {m.n_head * head_dim(m), kv, kv};
}
Dims qkv3(const ModelConfig& m) {
  return {3 * m.d_model, m.d_model};
}
Dims qkv3_vector(const ModelConfig& m) {
  return {3 * m.d_model};
}
Dims thirds(const ModelConfig& m) {
  return {m.d_model, m.d_model, m.d_model};
}
Dims mlp_in(const ModelConfig& m) {
  return {mlp_width(m), m.d_model};
}
Dims mlp_in_vector(const ModelConfig& m) {
  return {mlp_width(m)};
}
Dims mlp_out(const ModelConfig& m) {
  return {m.d_model, mlp_width(m)};
}
Dims gate_up(const ModelConfig& m) {
  return {2 * mlp_width(m), m.d_model};
}
Dims gate_up_parts(const ModelConfig& m) {
  return {mlp_width(m), mlp_width(m)};
}
// Stacked experts: E routed or S shared, each of width F = expert_width (gpt2's MLP, llama's
// SwiGLU with gate and up rows)
int expert_in(const ModelConfig& m) {
  return m.arch == Arch::llama ? 2 * expert_width(m) : expert_width(m);
}
Dims expert_gate_up_parts(const ModelConfig& m) { // each expert's: gate rows, then up rows
  return {expert_width(m), expert_width(m)};
}
Dims router(const ModelConfig& m) {
  return {m.moe_experts, m.d_model};
}
Dims experts_in(const ModelConfig& m) {
  return {m.moe_experts, expert_in(m), m.d_model};
}
Dims experts_in_vector(const ModelConfig& m) {
  return {m.moe_experts, expert_width(m)};
}
Dims experts_out(const ModelConfig& m) {
  return {m.moe_experts, m.d_model, expert_width(m)};
}
Dims experts_out_vector(const ModelConfig& m) {
  return {m.moe_experts, m.d_model};
}
Dims shared_in(const ModelConfig& m) {
  return {m.moe_shared_experts, expert_in(m), m.d_model};
}
Dims shared_in_vector(const ModelConfig& m) {
  return {m.moe_shared_experts, expert_width(m)};
}
Dims shared_out(const ModelConfig& m) {
  return {m.moe_shared_experts, m.d_model, expert_width(m)};
}
Dims shared_out_vector(const ModelConfig& m) {
  return {m.moe_shared_experts, m.d_model};
}

constexpr TpSplit kRep = TpSplit::replicated, kRows = TpSplit::rows, kCols = TpSplit::columns;
constexpr Scope kEmbedding = Scope::embedding, kFirst = Scope::first, kBlock = Scope::block,
                kDense = Scope::dense, kMoe = Scope::moe, kShared = Scope::shared,
                kLast = Scope::last, kHead = Scope::head;
constexpr Init kZeros = Init::zeros, kOnes = Init::ones, kNormal = Init::normal,
               kResidual = Init::residual;
constexpr bool kDecay = true, kNoDecay = false, kNorm = true, kNotNorm = false;

// One row a tensor: role, name, scope, decay, norm, tp split, init; then its shape and parts,
// its Hugging Face name(s) and whether Hugging Face stores it transposed.
// clang-format off

// GPT-2 (GPT2LMHeadModel): LayerNorm weights and biases, learned positions, biases everywhere.
const std::vector<TensorSpec> kGpt2 = {
    {Role::wte,     "wte",              kEmbedding, kDecay,   kNotNorm, kRows, kNormal,
     vocab_by_width, nullptr, {"transformer.wte.weight"}, false},
    {Role::wpe,     "wpe",              kFirst,     kDecay,   kNotNorm, kRep,  kNormal,
     positions, nullptr, {"transformer.wpe.weight"}, false},
    {Role::ln1_w,   "ln1/weight",       kBlock,     kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"transformer.h.{}.ln_1.weight"}, false},
    {Role::ln1_b,   "ln1/bias",         kBlock,     kNoDecay, kNorm,    kRep,  kZeros,
     width, nullptr, {"transformer.h.{}.ln_1.bias"}, false},
    {Role::qkv_w,   "attn/qkv/weight",  kBlock,     kDecay,   kNotNorm, kRows, kNormal,
     qkv3, thirds, {"transformer.h.{}.attn.c_attn.weight"}, true},
    {Role::qkv_b,   "attn/qkv/bias",    kBlock,     kNoDecay, kNotNorm, kRows, kZeros,
     qkv3_vector, thirds, {"transformer.h.{}.attn.c_attn.bias"}, false},
    {Role::proj_w,  "attn/proj/weight", kBlock,     kDecay,   kNotNorm, kCols, kResidual,
     square, nullptr, {"transformer.h.{}.attn.c_proj.weight"}, true},
    {Role::proj_b,  "attn/proj/bias",   kBlock,     kNoDecay, kNotNorm, kRep,  kZeros,
     width, nullptr, {"transformer.h.{}.attn.c_proj.bias"}, false},
    {Role::ln2_w,   "ln2/weight",       kBlock,     kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"transformer.h.{}.ln_2.weight"}, false},
    {Role::ln2_b,   "ln2/bias",         kBlock,     kNoDecay, kNorm,    kRep,  kZeros,
     width, nullptr, {"transformer.h.{}.ln_2.bias"}, false},
    {Role::fc_w,    "mlp/fc/weight",    kDense,     kDecay,   kNotNorm, kRows, kNormal,
     mlp_in, nullptr, {"transformer.h.{}.mlp.c_fc.weight"}, true},
    {Role::fc_b,    "mlp/fc/bias",      kDense,     kNoDecay, kNotNorm, kRows, kZeros,
     mlp_in_vector, nullptr, {"transformer.h.{}.mlp.c_fc.bias"}, false},
    {Role::fcp_w,   "mlp/proj/weight",  kDense,     kDecay,   kNotNorm, kCols, kResidual,
     mlp_out, nullptr, {"transformer.h.{}.mlp.c_proj.weight"}, true},
    {Role::fcp_b,   "mlp/proj/bias",    kDense,     kNoDecay, kNotNorm, kRep,  kZeros,
     width, nullptr, {"transformer.h.{}.mlp.c_proj.bias"}, false},
    {Role::router_w, "moe/router/weight", kMoe,     kDecay,   kNotNorm, kRep,  kNormal,
     router, nullptr, {}, false},
    {Role::fc_w,    "moe/experts/fc/weight", kMoe,  kDecay,   kNotNorm, kRep,  kNormal,
     experts_in, nullptr, {}, false},
    {Role::fc_b,    "moe/experts/fc/bias", kMoe,    kNoDecay, kNotNorm, kRep,  kZeros,
     experts_in_vector, nullptr, {}, false},
    {Role::fcp_w,   "moe/experts/proj/weight", kMoe, kDecay,  kNotNorm, kRep,  kResidual,
     experts_out, nullptr, {}, false},
    {Role::fcp_b,   "moe/experts/proj/bias", kMoe,  kNoDecay, kNotNorm, kRep,  kZeros,
     experts_out_vector, nullptr, {}, false},
    {Role::shared_fc_w, "moe/shared/fc/weight", kShared, kDecay, kNotNorm, kRep, kNormal,
     shared_in, nullptr, {}, false},
    {Role::shared_fc_b, "moe/shared/fc/bias", kShared, kNoDecay, kNotNorm, kRep, kZeros,
     shared_in_vector, nullptr, {}, false},
    {Role::shared_fcp_w, "moe/shared/proj/weight", kShared, kDecay, kNotNorm, kRep, kResidual,
     shared_out, nullptr, {}, false},
    {Role::shared_fcp_b, "moe/shared/proj/bias", kShared, kNoDecay, kNotNorm, kRep, kZeros,
     shared_out_vector, nullptr, {}, false},
    {Role::lnf_w,   "lnf/weight",       kLast,      kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"transformer.ln_f.weight"}, false},
    {Role::lnf_b,   "lnf/bias",         kLast,      kNoDecay, kNorm,    kRep,  kZeros,
     width, nullptr, {"transformer.ln_f.bias"}, false},
    {Role::lm_head, "lm_head/weight",   kHead,      kDecay,   kNotNorm, kRows, kNormal,
     vocab_by_width, nullptr, {"lm_head.weight"}, false},
};

// Llama (LlamaForCausalLM): RMSNorm weights, rotary positions (no table), no biases, grouped
// query heads in the packed qkv, SwiGLU's gate and up projections packed in fc.
const std::vector<TensorSpec> kLlama = {
    {Role::wte,     "wte",              kEmbedding, kDecay,   kNotNorm, kRows, kNormal,
     vocab_by_width, nullptr, {"model.embed_tokens.weight"}, false},
    {Role::ln1_w,   "ln1/weight",       kBlock,     kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"model.layers.{}.input_layernorm.weight"}, false},
    {Role::qkv_w,   "attn/qkv/weight",  kBlock,     kDecay,   kNotNorm, kRows, kNormal,
     qkv, qkv_parts, {"model.layers.{}.self_attn.q_proj.weight",
                      "model.layers.{}.self_attn.k_proj.weight",
                      "model.layers.{}.self_attn.v_proj.weight"}, false},
    {Role::proj_w,  "attn/proj/weight", kBlock,     kDecay,   kNotNorm, kCols, kResidual,
     square, nullptr, {"model.layers.{}.self_attn.o_proj.weight"}, false},
    {Role::ln2_w,   "ln2/weight",       kBlock,     kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"model.layers.{}.post_attention_layernorm.weight"}, false},
    {Role::fc_w,    "mlp/fc/weight",    kDense,     kDecay,   kNotNorm, kRows, kNormal,
     gate_up, gate_up_parts, {"model.layers.{}.mlp.gate_proj.weight",
                              "model.layers.{}.mlp.up_proj.weight"}, false},
    {Role::fcp_w,   "mlp/proj/weight",  kDense,     kDecay,   kNotNorm, kCols, kResidual,
     mlp_out, nullptr, {"model.layers.{}.mlp.down_proj.weight"}, false},
    // an MoE layer: Mixtral's (MixtralForCausalLM) names, "{e}" the expert; no shared experts
    {Role::router_w, "moe/router/weight", kMoe,     kDecay,   kNotNorm, kRep,  kNormal,
     router, nullptr, {"model.layers.{}.block_sparse_moe.gate.weight"}, false},
    {Role::fc_w,    "moe/experts/fc/weight", kMoe,  kDecay,   kNotNorm, kRep,  kNormal,
     experts_in, expert_gate_up_parts, {"model.layers.{}.block_sparse_moe.experts.{e}.w1.weight",
                                        "model.layers.{}.block_sparse_moe.experts.{e}.w3.weight"},
     false},
    {Role::fcp_w,   "moe/experts/proj/weight", kMoe, kDecay,  kNotNorm, kRep,  kResidual,
     experts_out, nullptr, {"model.layers.{}.block_sparse_moe.experts.{e}.w2.weight"}, false},
    {Role::shared_fc_w, "moe/shared/fc/weight", kShared, kDecay, kNotNorm, kRep, kNormal,
     shared_in, nullptr, {}, false},
    {Role::shared_fcp_w, "moe/shared/proj/weight", kShared, kDecay, kNotNorm, kRep, kResidual,
     shared_out, nullptr, {}, false},
    {Role::lnf_w,   "lnf/weight",       kLast,      kNoDecay, kNorm,    kRep,  kOnes,
     width, nullptr, {"model.norm.weight"}, false},
    {Role::lm_head, "lm_head/weight",   kHead,      kDecay,   kNotNorm, kRows, kNormal,
     vocab_by_width, nullptr, {"lm_head.weight"}, false},
};

// clang-format on

const char* scope_name(Scope s) {
  switch (s) {
  case Scope::embedding:
    return "embedding";
  case Scope::first:
    return "first";
  case Scope::block:
    return "block";
  case Scope::dense:
    return "dense";
  case Scope::moe:
    return "moe";
  case Scope::shared:
    return "shared";
  case Scope::last:
    return "last";
  case Scope::head:
    return "head";
  }
  return "?";
}

const char* split_name(TpSplit s) {
  switch (s) {
  case TpSplit::replicated:
    return "replicated";
  case TpSplit::rows:
    return "rows";
  case TpSplit::columns:
    return "columns";
  }
  return "?";
}

const char* init_name(Init i) {
  switch (i) {
  case Init::zeros:
    return "zeros";
  case Init::ones:
    return "ones";
  case Init::normal:
    return "normal";
  case Init::residual:
    return "residual";
  }
  return "?";
}

std::string json_ints(const Dims& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

} // namespace

const char* role_name(Role r) {
  static const char* const kNames[kRoles] = {
      "wte",          "wpe",    "ln1_w",    "ln1_b",       "qkv_w",       "qkv_b",
      "proj_w",       "proj_b", "ln2_w",    "ln2_b",       "fc_w",        "fc_b",
      "fcp_w",        "fcp_b",  "router_w", "shared_fc_w", "shared_fc_b", "shared_fcp_w",
      "shared_fcp_b", "lnf_w",  "lnf_b",    "lm_head"};
  return kNames[static_cast<int>(r)];
}

const std::vector<TensorSpec>& schema(Arch arch) {
  return arch == Arch::llama ? kLlama : kGpt2;
}

bool in_blocks(Scope s) {
  return s == Scope::block || s == Scope::dense || s == Scope::moe || s == Scope::shared;
}

bool held_in_layer(Scope s, const ModelConfig& m, int l) {
  switch (s) {
  case Scope::block:
    return true;
  case Scope::dense:
    return !is_moe_layer(m, l);
  case Scope::moe:
    return is_moe_layer(m, l);
  case Scope::shared:
    return is_moe_layer(m, l) && m.moe_shared_experts > 0;
  default:
    return false;
  }
}

std::string hf_name(const char* pattern, int layer, int expert) {
  std::string s = pattern;
  const std::size_t at = s.find("{}");
  if (at != std::string::npos) s.replace(at, 2, std::to_string(layer));
  const std::size_t e = s.find("{e}");
  if (e != std::string::npos) s.replace(e, 3, std::to_string(expert));
  return s;
}

std::string schema_json(const ModelConfig& m) {
  std::ostringstream os;
  os << "{\"arch\": \"" << name(m.arch) << "\", \"tied\": " << (tied(m) ? "true" : "false")
     << ", \"tensors\": [";
  bool any = false;
  for (const TensorSpec& t : schema(m.arch)) {
    bool held = !in_blocks(t.scope);
    for (int l = 0; l < m.n_layer && !held; ++l) held = held_in_layer(t.scope, m, l);
    if (!held) continue; // a dense model's MoE rows
    const Dims shape = t.shape(m);
    os << (any ? ",\n  " : "\n  ") << "{\"role\": \"" << role_name(t.role) << "\", \"name\": \""
       << t.name << "\", \"scope\": \"" << scope_name(t.scope)
       << "\", \"shape\": " << json_ints(shape)
       << ", \"parts\": " << json_ints(t.parts ? t.parts(m) : Dims{shape[0]})
       << ", \"decay\": " << (t.decay ? "true" : "false")
       << ", \"norm\": " << (t.norm ? "true" : "false") << ", \"tp_split\": \""
       << split_name(t.split) << "\", \"init\": \"" << init_name(t.init) << "\", \"hf\": [";
    for (std::size_t k = 0; k < t.hf.size(); ++k) os << (k ? ", " : "") << '"' << t.hf[k] << '"';
    os << "], \"hf_transposed\": " << (t.hf_transposed ? "true" : "false") << "}";
    any = true;
  }
  os << "\n]}\n";
  return os.str();
}

} // namespace pt
