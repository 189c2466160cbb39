// Where each named parameter tensor lives in a rank's flat buffer. Names are the checkpoint
// paths of docs/design.md section 8 without the "/model/" prefix ("wte", "h/003/attn/qkv/weight").
// The same layout indexes parameters, gradients and both AdamW moments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace pt {

struct ParamTensor {
  std::string name;
  std::vector<int> shape;        // this rank's shape (its tensor-parallel shard)
  std::vector<int> global_shape; // the whole tensor's shape (checkpoints store this)
  std::size_t offset = 0;        // in floats
  std::size_t size = 0;
  bool decay = false; // weight decay applies (matrices and embeddings, not biases or norms)
  int layer = -1;     // transformer layer, -1 for embeddings / final norm / head
  bool norm = false;  // a LayerNorm's weight or bias (ln1, ln2, lnf)
  // Tensor parallelism: -1 replicated on every tp rank; 0 rows split; 1 columns split. A row
  // split of a tensor made of parts (part_rows: their global row counts, in order; empty: one)
  // gives each tp rank its share of every part (qkv: its heads' rows of q, of k and of v; llama's
  // fc: of the gate and of the up projection).
  int shard_dim = -1;
  std::vector<int> part_rows;
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
  // rows, the two proj weights by input columns, wte / lm_head by vocabulary rows).
  ParamLayout(const ModelConfig& m, const StageSpec& stage, int tp_rank = 0, int tp = 1);

  // Index in the whole (global) tensor of local element i of t.
  std::size_t global_index(const ParamTensor& t, std::size_t i) const;

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  std::size_t total() const { return total_; }
  // Offset of a tensor by name; throws std::out_of_range if this stage does not hold it.
  const ParamTensor& at(const std::string& name) const;
  bool has(const std::string& name) const;

private:
  void add(std::string name, std::vector<int> global_shape, bool decay, int layer,
           int shard_dim = -1, std::vector<int> part_rows = {});
  void add_llama(const ModelConfig& m, const StageSpec& stage);

  int tp_rank_ = 0, tp_ = 1;
  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

// "h/007/" for layer 7.
std::string layer_prefix(int layer);

// Parameters of one transformer block: its matrices' (for FLOPs: 2 per token each), and all.
double layer_matrix_params(const ModelConfig& m);
std::size_t layer_params(const ModelConfig& m);
// Parameters of the whole model (tied embedding counted once), for FLOPs and reports.
std::size_t count_model_params(const ModelConfig& m);

} // namespace pt
