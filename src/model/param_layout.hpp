// Where each named parameter tensor lives in a rank's flat buffer. Names are the checkpoint
// paths of DESIGN.md section 8 without the "/model/" prefix ("wte", "h/003/attn/qkv/weight").
// The same layout indexes parameters, gradients and both AdamW moments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace pt {

struct ParamTensor {
  std::string name;
  std::vector<int> shape;
  std::size_t offset = 0; // in floats
  std::size_t size = 0;
  bool decay = false; // weight decay applies (matrices and embeddings, not biases or norms)
  int layer = -1;     // transformer layer, -1 for embeddings / final norm / head
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
  ParamLayout(const ModelConfig& m, const StageSpec& stage);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  std::size_t total() const { return total_; }
  // Offset of a tensor by name; throws std::out_of_range if this stage does not hold it.
  const ParamTensor& at(const std::string& name) const;
  bool has(const std::string& name) const;

private:
  void add(std::string name, std::vector<int> shape, bool decay, int layer);

  std::vector<ParamTensor> tensors_;
  std::size_t total_ = 0;
};

// "h/007/" for layer 7.
std::string layer_prefix(int layer);

// Parameters of the whole model (tied embedding counted once), for FLOPs and reports.
std::size_t count_model_params(const ModelConfig& m);

} // namespace pt
