// Where each named parameter tensor lives in a rank's flat buffer. Names are the checkpoint
// paths of docs/design.md section 8 without the "/model/" prefix ("wte", "h/003/attn/qkv/weight").
// The same layout indexes parameters, gradients and both AdamW moments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/schema.hpp"

namespace pt {

struct ParamTensor {
  Role role = Role::wte;
  std::string name;              // the checkpoint's name (model/schema.hpp)
  std::vector<int> shape;        // this rank's shape (its tensor-parallel shard)
  std::vector<int> global_shape; // the whole tensor's shape (checkpoints store this)
  std::size_t offset = 0;        // in floats
  std::size_t size = 0;
  bool decay = false; // weight decay applies (matrices and embeddings, not biases or norms)
  int layer = -1;     // transformer layer, -1 for embeddings / final norm / head
  bool norm = false;  // a norm's weight or bias (ln1, ln2, lnf)
  Init init = Init::zeros;
  // Tensor parallelism: -1 replicated on every tp rank; 0 rows split; 1 columns split. A row
  // split of a tensor made of parts (part_rows: their global row counts, in order; empty: one)
  // gives each tp rank its share of every part (qkv: its heads' rows of q, of k and of v; llama's
  // fc: of the gate and of the up projection).
  int shard_dim = -1;
  std::vector<int> part_rows;
  // Expert parallelism (parallel.ep): a stack of routed experts (E, ...) of which this rank holds
  // experts [first_expert, first_expert + shape[0]); false: every expert, or not a stack
  bool expert = false;
  int first_expert = 0;
};

// Which part of the model a rank holds: the embedding (first stage), layers [begin, end), and
// the final norm + head + loss (last stage).
struct StageSpec {
  bool first = true;
  bool last = true;
  int layer_begin = 0;
  int layer_end = 0;
};

class ParamLayout {
public:
  // tp_rank of tp: this rank's shard of each tensor (Megatron-style: qkv and fc split by output
  // rows, the two proj weights by input columns, wte / lm_head by vocabulary rows); ep_rank of
  // ep: its E/ep routed experts of each MoE layer's stacks (experts [ep_rank*E/ep, ...)).
  ParamLayout(const ModelConfig& m, const StageSpec& stage, int tp_rank = 0, int tp = 1,
              int ep_rank = 0, int ep = 1);

  // Index in the whole (global) tensor of local element i of t.
  std::size_t global_index(const ParamTensor& t, std::size_t i) const;
  // How many local elements of t from i on lie at consecutive global indices (the rest of a
  // local row, or of a part's rows, where tp splits t; the rest of t otherwise).
  std::size_t run_from(const ParamTensor& t, std::size_t i) const;

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  std::size_t total() const { return total_; }
  // The tensor of a role (of a layer; -1 outside blocks), or null if this stage does not hold it.
  const ParamTensor* find(Role role, int layer = -1) const;
  // The index in tensors() of the tensor with t's role and layer (t from another stage's layout);
  // throws std::out_of_range if this layout does not hold it.
  std::size_t index_of(const ParamTensor& t) const;
  // A tensor by its checkpoint name, for readers of names (tests, tools); throws
  // std::out_of_range if this stage does not hold it.
  const ParamTensor& at(const std::string& name) const;

private:
  void add(const TensorSpec& spec, const ModelConfig& m, int layer);

  int tp_rank_ = 0, tp_ = 1, ep_rank_ = 0, ep_ = 1;
  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

// "h/007/" for layer 7.
std::string layer_prefix(int layer);

// Parameters of one transformer block: the matrices' one token passes through (for FLOPs: 2 per
// token each; an MoE layer's router, top_k of its routed experts and its shared experts), averaged
// over the layers; all of layer l's; all of a layer, averaged over the layers.
double layer_matrix_params(const ModelConfig& m);
std::size_t layer_params(const ModelConfig& m, int l);
std::size_t layer_params(const ModelConfig& m);
// Parameters of the whole model (tied embedding counted once), for reports; those one token
// passes through (an MoE layer's top_k routed experts of its experts), for FLOPs.
std::size_t count_model_params(const ModelConfig& m);
double active_model_params(const ModelConfig& m);

} // namespace pt
