// AdamW (Loshchilov & Hutter, decoupled weight decay) over a stage's flat parameter buffer, in
// torch.optim.AdamW's operation order. Decay applies to tensors with ParamTensor::decay set.
#pragma once

#include <cstddef>
#include <vector>

#include "backend.hpp"
#include "config/run_config.hpp"
#include "model/param_layout.hpp"
#include "optim/optimizer.hpp"
#include "util/buffer.hpp"

namespace pt {

// A run of parameters AdamW updates together (kernels/ops.hpp).
using AdamSegment = ops::AdamWSegment;

class AdamW final : public Optimizer {
public:
  // The moments live in `backend`'s memory, next to the parameters they update. Every tensor of
  // the layout, its moments and gradients at its own offset.
  AdamW(const ParamLayout& layout, const TrainConfig& t, const Backend& backend = host_backend());
  // The given segments only, with moments of state_size floats (ZeRO-1: this rank's shard).
  AdamW(std::vector<AdamSegment> segments, std::size_t state_size, const TrainConfig& t,
        const Backend& backend = host_backend());

  // One update with learning rate `lr`; grads (indexed like the moments) are multiplied by
  // grad_scale first (clipping). Finished when it returns.
  void step(float* params, const float* grads, double lr, float grad_scale) override;

  int updates() const override { return t_; }
  void set_updates(int t) override { t_ = t; }
  // Made from a layout: tensor i's moments, whole (one run); otherwise none (ZeRO-1's shard is
  // the state a checkpoint sees, optim/zero_adamw.hpp).
  std::vector<Run> runs(std::size_t tensor) override;
  bool sharded() const override { return false; }
  // Made from a layout: each tensor whole at its offset; otherwise none.
  std::vector<Span> grad_spans() const override;
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  void save() override;
  void restore() override;

private:
  std::vector<AdamSegment> segments_;
  const Backend& be_;
  double beta1_, beta2_, eps_, weight_decay_;
  FloatBuffer m_, v_;
  FloatBuffer saved_m_, saved_v_; // save()'s copy
  int t_ = 0, saved_t_ = 0;
  bool per_tensor_ = false; // segments_[i] is tensor i of a layout
};

} // namespace pt
