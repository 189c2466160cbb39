// The host backend with a GPU's bf16 products (backend.hpp, host_bf16_products_backend): each
// matrix product and attention call rounds its inputs to bfloat16 before the host's fp32
// arithmetic, as the CUDA backend at precision bf16 converts them, and bf16_products() is true,
// so the model takes on the host the paths it takes on a GPU (the rounds left to the products,
// the kept product inputs read packed), where every result is reproducible bit for bit.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "bf16.hpp"

namespace pt {
namespace {

// n values of x, rounded to bfloat16, in a buffer of the call's own
std::vector<float> rounded(const float* x, std::size_t n) {
  std::vector<float> r(x, x + n);
  ops::round_bf16(r.data(), n);
  return r;
}

std::vector<float> widened(const std::uint16_t* x, std::size_t n) {
  std::vector<float> r(n);
  bf16::unpack(r.data(), x, n);
  return r;
}

std::size_t times(int a, int b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                    int OC) {
  ops::matmul_forward(out, rounded(inp, times(N, C)).data(), rounded(w, times(OC, C)).data(), bias,
                      N, C, OC);
}

void matmul_backward_input(float* dinp, const float* dout, const float* w, int N, int C, int OC) {
  ops::matmul_backward_input(dinp, rounded(dout, times(N, OC)).data(),
                             rounded(w, times(OC, C)).data(), N, C, OC);
}

// The bias gradient from the fp32 gradient, as a GPU's column sums read it.
void matmul_backward_weight(float* dw, float* dbias, const float* dout, const float* inp, int N,
                            int C, int OC) {
  ops::matmul_backward_weight(dw, nullptr, rounded(dout, times(N, OC)).data(),
                              rounded(inp, times(N, C)).data(), N, C, OC);
  if (dbias == nullptr) return;
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) dbias[o] += dout[times(n, OC) + static_cast<std::size_t>(o)];
  }
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  matmul_backward_input(dinp, dout, w, N, C, OC);
  matmul_backward_weight(dw, dbias, dout, inp, N, C, OC);
}

void matmul_forward_packed(float* out, const std::uint16_t* inp, const float* w, const float* bias,
                           int N, int C, int OC) {
  matmul_forward(out, widened(inp, times(N, C)).data(), w, bias, N, C, OC);
}

void matmul_backward_packed(float* dinp, float* dw, float* dbias, const float* dout,
                            const std::uint16_t* inp, const float* w, int N, int C, int OC) {
  if (dinp != nullptr) matmul_backward_input(dinp, dout, w, N, C, OC);
  matmul_backward_weight(dw, dbias, dout, widened(inp, times(N, C)).data(), N, C, OC);
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  ops::attention_forward(out, att, rounded(qkv, times(B * T, 3 * C)).data(), B, T, C, NH);
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  ops::attention_backward(dqkv, scratch, rounded(dout, times(B * T, C)).data(),
                          rounded(qkv, times(B * T, 3 * C)).data(), att, B, T, C, NH);
}

bool yes() {
  return true;
}

} // namespace

const Backend& host_bf16_products_backend() {
  static const Backend table = [] {
    Backend b = host_backend();
    b.name = "host-bf16-products";
    b.bf16_products = yes;
    b.matmul_forward = matmul_forward;
    b.matmul_backward_input = matmul_backward_input;
    b.matmul_backward_weight = matmul_backward_weight;
    b.matmul_backward = matmul_backward;
    b.matmul_forward_packed = matmul_forward_packed;
    b.matmul_backward_packed = matmul_backward_packed;
    b.attention_forward = attention_forward;
    b.attention_backward = attention_backward;
    return b;
  }();
  return table;
}

} // namespace pt
