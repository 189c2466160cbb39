// AdamW (Loshchilov & Hutter, decoupled weight decay) over a stage's flat parameter buffer, in
// torch.optim.AdamW's operation order. Decay applies to tensors with ParamTensor::decay set.
#pragma once

#include <cstddef>

#include "backend.hpp"
#include "config/run_config.hpp"
#include "model/param_layout.hpp"
#include "util/buffer.hpp"

namespace pt {

class AdamW {
public:
  // The moments live in `backend`'s memory, next to the parameters they update.
  AdamW(const ParamLayout& layout, const TrainConfig& t, const Backend& backend = host_backend());

  // One update with learning rate `lr`; grads are multiplied by grad_scale first (clipping).
  // Finished when it returns.
  void step(float* params, const float* grads, double lr, float grad_scale);

  int updates() const { return t_; }  // updates applied so far
  void set_updates(int t) { t_ = t; } // after loading a checkpoint
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  std::size_t bytes() const { return m_.bytes() + v_.bytes(); }

private:
  const ParamLayout& layout_;
  const Backend& be_;
  double beta1_, beta2_, eps_, weight_decay_;
  FloatBuffer m_, v_;
  int t_ = 0;
};

} // namespace pt
