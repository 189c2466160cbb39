#include "optim/adamw.hpp"

#include <cmath>

namespace pt {

AdamW::AdamW(const ParamLayout& layout, const TrainConfig& t, const Backend& backend)
    : layout_(layout), be_(backend), beta1_(t.beta1), beta2_(t.beta2), eps_(t.eps),
      weight_decay_(t.weight_decay), m_(layout.total(), Memory{backend.alloc, backend.release}),
      v_(layout.total(), Memory{backend.alloc, backend.release}) {}

void AdamW::step(float* params, const float* grads, double lr, float grad_scale) {
  ++t_;
  ops::AdamWStep s{};
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1_);
  s.beta2 = static_cast<float>(beta2_);
  s.eps = static_cast<float>(eps_);
  s.grad_scale = grad_scale;
  s.beta1_t = std::pow(beta1_, t_);
  s.beta2_t = std::pow(beta2_, t_);
  for (const auto& tensor : layout_.tensors()) {
    s.weight_decay = tensor.decay ? static_cast<float>(weight_decay_) : 0.0f;
    be_.adamw_update(params + tensor.offset, m_.data() + tensor.offset, v_.data() + tensor.offset,
                     grads + tensor.offset, tensor.size, s);
  }
  be_.synchronize();
}

} // namespace pt
