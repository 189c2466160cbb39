#include "optim/adamw.hpp"

#include <cmath>
#include <utility>

namespace pt {

namespace {

std::vector<AdamSegment> tensor_segments(const ParamLayout& layout) {
  std::vector<AdamSegment> out;
  for (const auto& t : layout.tensors()) out.push_back({t.offset, t.offset, t.size, t.decay});
  return out;
}

} // namespace

AdamW::AdamW(const ParamLayout& layout, const TrainConfig& t, const Backend& backend)
    : AdamW(tensor_segments(layout), layout.total(), t, backend) {
  per_tensor_ = true;
}

std::vector<Optimizer::Run> AdamW::runs(std::size_t tensor) {
  if (!per_tensor_) return {};
  const AdamSegment& s = segments_.at(tensor);
  return {Run{0, s.size, m_.data() + s.state_offset, v_.data() + s.state_offset}};
}

std::vector<Optimizer::Span> AdamW::grad_spans() const {
  std::vector<Span> out;
  if (!per_tensor_) return out;
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    out.push_back({i, segments_[i].param_offset, segments_[i].size});
  }
  return out;
}

AdamW::AdamW(std::vector<AdamSegment> segments, std::size_t state_size, const TrainConfig& t,
             const Backend& backend)
    : segments_(std::move(segments)), be_(backend), beta1_(t.beta1), beta2_(t.beta2), eps_(t.eps),
      weight_decay_(t.weight_decay), m_(state_size, Memory{backend.alloc, backend.release}),
      v_(state_size, Memory{backend.alloc, backend.release}) {}

void AdamW::save() {
  if (saved_m_.size() != m_.size()) {
    const Memory mem{be_.alloc, be_.release};
    saved_m_ = FloatBuffer(m_.size(), mem);
    saved_v_ = FloatBuffer(v_.size(), mem);
  }
  be_.copy(saved_m_.data(), m_.data(), m_.bytes());
  be_.copy(saved_v_.data(), v_.data(), v_.bytes());
  saved_t_ = t_;
}

void AdamW::restore() {
  be_.copy(m_.data(), saved_m_.data(), m_.bytes());
  be_.copy(v_.data(), saved_v_.data(), v_.bytes());
  t_ = saved_t_;
}

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
  s.weight_decay = static_cast<float>(weight_decay_);
  be_.adamw_update(params, m_.data(), v_.data(), grads, segments_.data(),
                   static_cast<int>(segments_.size()), s);
  be_.synchronize();
}

} // namespace pt
