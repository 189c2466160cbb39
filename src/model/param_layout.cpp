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

void ParamLayout::add(const TensorSpec& spec, const ModelConfig& m, int layer) {
  ParamTensor t;
  t.role = spec.role;
  t.name = layer >= 0 ? layer_prefix(layer) + spec.name : spec.name;
  t.global_shape = spec.shape(m);
  t.shard_dim = tp_ == 1 || spec.split == TpSplit::replicated ? -1
                : spec.split == TpSplit::rows                 ? 0
                                                              : 1;
  t.part_rows = spec.parts ? spec.parts(m) : std::vector<int>{t.global_shape[0]};
  std::vector<int> shape = t.global_shape;
  if (t.shard_dim >= 0) shape[static_cast<std::size_t>(t.shard_dim)] /= tp_;
  if (ep_ > 1 && spec.scope == Scope::moe && spec.role != Role::router_w) {
    t.expert = true;
    shape[0] /= ep_;
    t.first_expert = ep_rank_ * shape[0];
  }
  t.size = 1;
  for (int s : shape) t.size *= static_cast<std::size_t>(s);
  t.shape = std::move(shape);
  t.offset = total_;
  t.decay = spec.decay;
  t.norm = spec.norm;
  t.init = spec.init;
  t.layer = layer;
  // every tensor starts on the buffers' alignment inside the flat buffer
  total_ += aligned_bytes(t.size * sizeof(float)) / sizeof(float);
  tensors_.push_back(std::move(t));
}

ParamLayout::ParamLayout(const ModelConfig& m, const StageSpec& stage, int tp_rank, int tp,
                         int ep_rank, int ep)
    : tp_rank_(tp_rank), tp_(tp), ep_rank_(ep_rank), ep_(ep) {
  // The tied head uses wte, so the last stage holds wte too (its gradient is reduced with the
  // first stage's when they are different ranks).
  const auto held = [&](Scope s) {
    switch (s) {
    case Scope::embedding:
      return stage.first || (stage.last && tied(m));
    case Scope::first:
      return stage.first;
    case Scope::last:
      return stage.last;
    case Scope::head:
      return stage.last && !tied(m);
    case Scope::block:
    case Scope::dense:
    case Scope::moe:
    case Scope::shared:
      return false; // per layer, below
    }
    return false;
  };
  const auto& table = schema(m.arch);
  for (const TensorSpec& s : table) {
    if ((s.scope == Scope::embedding || s.scope == Scope::first) && held(s.scope)) add(s, m, -1);
  }
  for (int l = stage.layer_begin; l < stage.layer_end; ++l) {
    for (const TensorSpec& s : table) {
      if (held_in_layer(s.scope, m, l)) add(s, m, l);
    }
  }
  for (const TensorSpec& s : table) {
    if ((s.scope == Scope::last || s.scope == Scope::head) && held(s.scope)) add(s, m, -1);
  }
}

std::size_t ParamLayout::global_index(const ParamTensor& t, std::size_t i) const {
  if (t.expert)
    return static_cast<std::size_t>(t.first_expert) *
               (t.size / static_cast<std::size_t>(t.shape[0])) +
           i;
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

std::size_t ParamLayout::run_from(const ParamTensor& t, std::size_t i) const {
  if (t.expert || t.shard_dim < 0 || tp_ == 1) return t.size - i;
  const std::size_t cols =
      t.global_shape.size() > 1 ? static_cast<std::size_t>(t.global_shape[1]) : 1;
  if (t.shard_dim == 1) {
    const std::size_t local_cols = cols / static_cast<std::size_t>(tp_);
    return local_cols - i % local_cols;
  }
  std::size_t lr = i / cols; // as in global_index: the part whose share holds local row lr
  for (const int rows : t.part_rows) {
    const auto mine = static_cast<std::size_t>(rows / tp_);
    if (lr < mine) return (mine - lr) * cols - i % cols;
    lr -= mine;
  }
  return t.size - i;
}

const ParamTensor& ParamLayout::at(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("parameter '" + name + "' is not held by this stage");
}

const ParamTensor* ParamLayout::find(Role role, int layer) const {
  for (const auto& t : tensors_) {
    if (t.role == role && t.layer == layer) return &t;
  }
  return nullptr;
}

std::size_t ParamLayout::index_of(const ParamTensor& t) const {
  const ParamTensor* mine = find(t.role, t.layer);
  if (mine == nullptr) throw std::out_of_range("parameter '" + t.name + "' is not in this layout");
  return static_cast<std::size_t>(mine - tensors_.data());
}

namespace {

// Elements of the architecture's tensors that `pick` selects, each times share(spec).
template <class Pick, class Share>
double schema_elements(const ModelConfig& m, Pick pick, Share share) {
  double n = 0.0;
  for (const TensorSpec& s : schema(m.arch)) {
    if (!pick(s)) continue;
    double size = share(s);
    for (int d : s.shape(m)) size *= d;
    n += size;
  }
  return n;
}

// The embedding's, the final norm's and the head's (a tied head counted once).
double edge_params(const ModelConfig& m) {
  return schema_elements(
      m,
      [&m](const TensorSpec& s) {
        return !in_blocks(s.scope) && (s.scope != Scope::head || !tied(m));
      },
      [](const TensorSpec&) { return 1.0; });
}

// Elements of layer l's tensors, each tensor weighted by share(spec): 0 leaves it out.
template <class Share> double layer_elements(const ModelConfig& m, int l, Share share) {
  return schema_elements(
      m, [&](const TensorSpec& s) { return held_in_layer(s.scope, m, l); }, share);
}

// The share of a tensor one token passes through: a routed expert stack's top_k of its experts.
double token_share(const ModelConfig& m, const TensorSpec& s) {
  const bool routed = s.scope == Scope::moe && s.role != Role::router_w;
  return routed ? static_cast<double>(m.moe_top_k) / m.moe_experts : 1.0;
}

} // namespace

double layer_matrix_params(const ModelConfig& m) {
  double n = 0.0;
  for (int l = 0; l < m.n_layer; ++l) {
    n += layer_elements(m, l, [&m](const TensorSpec& s) { // a block's matrices are what decays
      return s.decay ? token_share(m, s) : 0.0;
    });
  }
  return n / m.n_layer;
}

std::size_t layer_params(const ModelConfig& m, int l) {
  return static_cast<std::size_t>(layer_elements(m, l, [](const TensorSpec&) { return 1.0; }));
}

std::size_t count_model_params(const ModelConfig& m) {
  std::size_t n = static_cast<std::size_t>(edge_params(m));
  for (int l = 0; l < m.n_layer; ++l) n += layer_params(m, l);
  return n;
}

std::size_t layer_params(const ModelConfig& m) {
  return (count_model_params(m) - static_cast<std::size_t>(edge_params(m))) /
         static_cast<std::size_t>(m.n_layer);
}

double active_model_params(const ModelConfig& m) {
  double n = edge_params(m);
  for (int l = 0; l < m.n_layer; ++l) {
    n += layer_elements(m, l, [&m](const TensorSpec& s) { return token_share(m, s); });
  }
  return n;
}

} // namespace pt
