// The operations of a block where the architectures differ (docs/models.md): gpt2's LayerNorm and
// GELU; llama's RMSNorm, rotary positions on the queries and keys, grouped-query attention and
// SwiGLU. Letters as in gpt_stage.hpp.
#include "model/gpt_stage.hpp"

namespace pt {

void GptStage::norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b) const {
  if (llama_) {
    be_.rmsnorm_forward(out, rstd, x, w, static_cast<float>(model_.norm_eps), R_, C_);
  } else {
    be_.layernorm_forward(out, mean, rstd, x, w, b, R_, C_);
  }
}

void GptStage::norm_backward_input(float* dx, const float* d, const float* x, const float* w,
                                   const float* mean, const float* rstd) const {
  if (llama_) {
    be_.rmsnorm_backward_input(dx, d, x, w, rstd, R_, C_);
  } else {
    be_.layernorm_backward_input(dx, d, x, w, mean, rstd, R_, C_);
  }
}

void GptStage::norm_backward_weight(float* dw, float* db, const float* d, const float* x,
                                    const float* mean, const float* rstd) const {
  if (llama_) {
    be_.rmsnorm_backward_weight(dw, d, x, rstd, R_, C_);
  } else {
    be_.layernorm_backward_weight(dw, db, d, x, mean, rstd, R_, C_);
  }
}

void GptStage::position_qkv(float* qkv) const {
  if (llama_) { // the query heads, then the key heads, at the start of each row
    be_.rope_forward(qkv, N_, T_, QKV_, NH_ + NKV_, HD_, static_cast<float>(model_.rope_theta));
  }
}

const float* GptStage::attention_qkv(const float* qkv) {
  if (NKV_ == NH_) return qkv;
  be_.kv_expand(ws_.qkv_full.data(), qkv, N_, NH_, NKV_, HD_);
  return ws_.qkv_full.data();
}

float* GptStage::attention_dqkv(float* d_qkv) {
  return NKV_ == NH_ ? d_qkv : ws_.d_qkv_full.data();
}

void GptStage::finish_dqkv(float* d_qkv) {
  if (NKV_ != NH_) be_.kv_reduce(d_qkv, ws_.d_qkv_full.data(), N_, NH_, NKV_, HD_);
  if (llama_) {
    be_.rope_backward(d_qkv, N_, T_, QKV_, NH_ + NKV_, HD_, static_cast<float>(model_.rope_theta));
  }
}

void GptStage::mlp_activation(const BlockView& a) const {
  const std::size_t n = static_cast<std::size_t>(N_) * F_;
  const bool bf16 = format_ == ActFormat::bf16;
  if (a.fch16 != nullptr) return be_.gelu_forward_packed(a.fch_gelu16, a.fch16, a.fch, n);
  if (llama_) {
    be_.swiglu_forward(a.fch_gelu, a.fch, N_, F_, bf16);
  } else {
    be_.gelu_forward(a.fch_gelu, a.fch, n, bf16);
  }
  product_input(a.fch_gelu, n);
}

void GptStage::mlp_activation_backward(float* d_fch, const BlockView& a, const float* dh) const {
  const std::size_t n = static_cast<std::size_t>(N_) * F_;
  const bool bf16 = format_ == ActFormat::bf16;
  if (a.fch16 != nullptr) return be_.gelu_backward_packed(d_fch, a.fch16, dh, n);
  if (llama_) {
    be_.swiglu_backward(d_fch, a.fch, dh, N_, F_, bf16);
  } else {
    be_.gelu_backward(d_fch, a.fch, dh, n, bf16);
  }
}

} // namespace pt
