#include "model/param_layout.hpp"

#include <cstdio>
#include <stdexcept>

#include "util/buffer.hpp"

namespace pt {

std::string layer_prefix(int layer) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "h/%03d/", layer);
  return buf;
}

void ParamLayout::add(std::string name, std::vector<int> global_shape, bool decay, int layer,
                      int shard_dim, std::vector<int> part_rows) {
  ParamTensor t;
  t.name = std::move(name);
  t.global_shape = global_shape;
  t.shard_dim = tp_ > 1 ? shard_dim : -1;
  t.part_rows = part_rows.empty() ? std::vector<int>{global_shape[0]} : std::move(part_rows);
  std::vector<int> shape = global_shape;
  if (t.shard_dim >= 0) shape[static_cast<std::size_t>(t.shard_dim)] /= tp_;
  t.size = 1;
  for (int s : shape) t.size *= static_cast<std::size_t>(s);
  t.shape = std::move(shape);
  t.offset = total_;
  t.decay = decay;
  t.layer = layer;
  // every tensor starts on the buffers' alignment inside the flat buffer
  total_ += aligned_bytes(t.size * sizeof(float)) / sizeof(float);
  t.norm = t.name.find("ln1/") != std::string::npos || t.name.find("ln2/") != std::string::npos ||
           t.name.rfind("lnf/", 0) == 0;
  tensors_.push_back(std::move(t));
}

ParamLayout::ParamLayout(const ModelConfig& m, const StageSpec& stage, int tp_rank, int tp)
    : tp_rank_(tp_rank), tp_(tp) {
  const int C = m.d_model;
  const int V = m.vocab_size;
  // The tied LM head uses wte, so the last stage holds wte too (its gradient is reduced with
  // the first stage's when they are different ranks).
  if (stage.first || (stage.last && tied(m))) add("wte", {V, C}, true, -1, 0);
  if (m.arch == Arch::llama) {
    add_llama(m, stage);
    return;
  }
  if (stage.first) add("wpe", {m.seq_len, C}, true, -1);
  for (int l = stage.layer_begin; l < stage.layer_end; ++l) {
    const std::string p = layer_prefix(l);
    add(p + "ln1/weight", {C}, false, l);
    add(p + "ln1/bias", {C}, false, l);
    add(p + "attn/qkv/weight", {3 * C, C}, true, l, 0, {C, C, C});
    add(p + "attn/qkv/bias", {3 * C}, false, l, 0, {C, C, C});
    add(p + "attn/proj/weight", {C, C}, true, l, 1);
    add(p + "attn/proj/bias", {C}, false, l);
    add(p + "ln2/weight", {C}, false, l);
    add(p + "ln2/bias", {C}, false, l);
    add(p + "mlp/fc/weight", {4 * C, C}, true, l, 0);
    add(p + "mlp/fc/bias", {4 * C}, false, l, 0);
    add(p + "mlp/proj/weight", {C, 4 * C}, true, l, 1);
    add(p + "mlp/proj/bias", {C}, false, l);
  }
  if (stage.last) {
    add("lnf/weight", {C}, false, -1);
    add("lnf/bias", {C}, false, -1);
    if (!tied(m)) add("lm_head/weight", {V, C}, true, -1, 0);
  }
}

// llama (docs/models.md): no positions, no biases; RMSNorm weights; qkv holds the n_head query
// heads' rows, then the key heads', then the value heads'; fc holds the gate's rows, then the up
// projection's (SwiGLU).
void ParamLayout::add_llama(const ModelConfig& m, const StageSpec& stage) {
  const int C = m.d_model, F = mlp_width(m), q = m.n_head * head_dim(m),
            kv = kv_heads(m) * head_dim(m);
  for (int l = stage.layer_begin; l < stage.layer_end; ++l) {
    const std::string p = layer_prefix(l);
    add(p + "ln1/weight", {C}, false, l);
    add(p + "attn/qkv/weight", {qkv_rows(m), C}, true, l, 0, {q, kv, kv});
    add(p + "attn/proj/weight", {C, C}, true, l, 1);
    add(p + "ln2/weight", {C}, false, l);
    add(p + "mlp/fc/weight", {2 * F, C}, true, l, 0, {F, F});
    add(p + "mlp/proj/weight", {C, F}, true, l, 1);
  }
  if (stage.last) {
    add("lnf/weight", {C}, false, -1);
    if (!tied(m)) add("lm_head/weight", {m.vocab_size, C}, true, -1, 0);
  }
}

std::size_t ParamLayout::global_index(const ParamTensor& t, std::size_t i) const {
  if (t.shard_dim < 0) return i;
  const std::size_t cols =
      t.global_shape.size() > 1 ? static_cast<std::size_t>(t.global_shape[1]) : 1;
  if (t.shard_dim == 1) {
    const std::size_t local_cols = cols / static_cast<std::size_t>(tp_);
    const std::size_t r = i / local_cols, c = i % local_cols;
    return r * cols + static_cast<std::size_t>(tp_rank_) * local_cols + c;
  }
  // local row lr lies in the part whose share (its rows / tp) covers it
  std::size_t lr = i / cols, first = 0, mine = 0; // first: the part's first global row
  for (const int rows : t.part_rows) {
    mine = static_cast<std::size_t>(rows / tp_);
    if (lr < mine) break;
    lr -= mine;
    first += static_cast<std::size_t>(rows);
  }
  const std::size_t gr = first + static_cast<std::size_t>(tp_rank_) * mine + lr;
  return gr * cols + i % cols;
}

const ParamTensor& ParamLayout::at(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("parameter '" + name + "' is not held by this stage");
}

bool ParamLayout::has(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return true;
  }
  return false;
}

double layer_matrix_params(const ModelConfig& m) {
  const double C = m.d_model;
  if (m.arch == Arch::gpt2) return 12.0 * C * C;
  return qkv_rows(m) * C + C * C + 3.0 * mlp_width(m) * C;
}

std::size_t layer_params(const ModelConfig& m) {
  const std::size_t C = static_cast<std::size_t>(m.d_model);
  // the norms' weights (gpt2: and their biases and the products' biases)
  const std::size_t vectors = m.arch == Arch::gpt2 ? 13 * C : 2 * C;
  return static_cast<std::size_t>(layer_matrix_params(m)) + vectors;
}

std::size_t count_model_params(const ModelConfig& m) {
  const std::size_t C = static_cast<std::size_t>(m.d_model);
  const std::size_t V = static_cast<std::size_t>(m.vocab_size);
  const bool gpt2 = m.arch == Arch::gpt2;
  std::size_t n = V * C + (gpt2 ? static_cast<std::size_t>(m.seq_len) * C : 0) +
                  layer_params(m) * static_cast<std::size_t>(m.n_layer) + (gpt2 ? 2 : 1) * C;
  if (!tied(m)) n += V * C;
  return n;
}

} // namespace pt
