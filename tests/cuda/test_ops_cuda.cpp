// Every op of kernels/ops.hpp on the CUDA backend against the host backend, on the same random
// inputs: relative L2 error per output tensor at most 1e-4 (the parity tolerance of fp32,
// tests/unit/test_parity.cpp). Gradient outputs start from nonzero values, so the "accumulates"
// rule is checked too, and aliasing (probs over logits) is exercised as the engine uses it.
// Without a visible CUDA device the test prints why and exits 77, which CTest reports as
// skipped (never as passed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "cuda/attention_cudnn.hpp"
#include "cuda/device_query.hpp"
#include "cuda/ops_cuda.hpp"
#include "ops.hpp"

namespace {

namespace co = pt::cuda_ops;
namespace ho = pt::ops;

int failures = 0, checks = 0;

std::vector<float> random(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// A device copy of a host vector, freed at scope exit.
template <class T> struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    p = static_cast<T*>(co::alloc(n * sizeof(T)));
    co::to_device(p, h.data(), n * sizeof(T));
  }
  ~Dev() { co::release(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    co::to_host(h.data(), p, n * sizeof(T));
    return h;
  }
};

void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want, double tol = 1e-4) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  const double rel = std::sqrt(num / (den > 0.0 ? den : 1.0));
  ++checks;
  const bool ok = rel <= tol && std::isfinite(rel);
  if (!ok) ++failures;
  std::printf("%-4s %-40s relative L2 error %.3g\n", ok ? "ok" : "FAIL", what.c_str(), rel);
}

constexpr int B = 2, T = 64, C = 96, NH = 4, V = 501, OC = 3 * C;
constexpr int N = B * T;
constexpr std::size_t NC = static_cast<std::size_t>(N) * C;

// The matrix products, at the backend's current precision: relative L2 error at most tol.
void check_linear(const std::string& tag, double tol) {
  const auto inp = random(NC, -1, 1, 20), w = random(static_cast<std::size_t>(OC) * C, -1, 1, 21);
  const auto bias = random(OC, -1, 1, 22);
  const auto dout = random(static_cast<std::size_t>(N) * OC, -1, 1, 23);
  Dev<float> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout);
  for (int with_bias = 1; with_bias >= 0; --with_bias) {
    std::vector<float> out(static_cast<std::size_t>(N) * OC);
    Dev<float> d_out(out);
    ho::matmul_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C,
                       OC);
    co::matmul_forward(d_out.p, d_inp.p, d_w.p, with_bias ? d_bias.p : nullptr, N, C, OC);
    expect_close((with_bias ? "matmul_forward" : "matmul_forward (no bias)") + tag, d_out.host(),
                 out, tol);
  }
  auto dinp = random(NC, -1, 1, 24), dw = random(static_cast<std::size_t>(OC) * C, -1, 1, 25);
  auto dbias = random(OC, -1, 1, 26);
  Dev<float> d_dinp(dinp), d_dw(dw), d_dbias(dbias);
  ho::matmul_backward_input(dinp.data(), dout.data(), w.data(), N, C, OC);
  co::matmul_backward_input(d_dinp.p, d_dout.p, d_w.p, N, C, OC);
  expect_close("matmul_backward_input" + tag, d_dinp.host(), dinp, tol);
  ho::matmul_backward_weight(dw.data(), dbias.data(), dout.data(), inp.data(), N, C, OC);
  co::matmul_backward_weight(d_dw.p, d_dbias.p, d_dout.p, d_inp.p, N, C, OC);
  expect_close("matmul_backward_weight dw" + tag, d_dw.host(), dw, tol);
  expect_close("matmul_backward_weight dbias" + tag, d_dbias.host(), dbias, tol);
  // both at once (one conversion of dout at bf16), accumulating onto the results above
  ho::matmul_backward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), N, C,
                      OC);
  co::matmul_backward(d_dinp.p, d_dw.p, d_dbias.p, d_dout.p, d_inp.p, d_w.p, N, C, OC);
  expect_close("matmul_backward dinp" + tag, d_dinp.host(), dinp, tol);
  expect_close("matmul_backward dw" + tag, d_dw.host(), dw, tol);
  expect_close("matmul_backward dbias" + tag, d_dbias.host(), dbias, tol);
}

// Bit for bit: the same bits at every index, a NaN any NaN (CUDA's conversion gives the
// canonical NaN, the host keeps the payload's top bits; both are NaN).
template <class T>
void expect_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    } else { // bf16 bits
      const auto nan = [](T h) { return (h & 0x7fffu) > 0x7f80u; };
      if (nan(got[i]) && nan(want[i])) continue;
    }
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) ++bad;
  }
  ++checks;
  if (bad != 0) ++failures;
  std::printf("%-4s %-40s %zu of %zu values differ in a bit\n", bad == 0 ? "ok" : "FAIL",
              what.c_str(), bad, want.size());
}

// Values that test a rounding to bfloat16: random ones over many binades, exact ties (the 17th
// bit set, the rest clear) of even and odd bf16 values, NaN, infinities, zeros, subnormals and
// the largest floats (which round to infinity).
std::vector<float> bf16_cases(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = gen();
    switch (i % 8) {
    case 0:
      u = (u & 0xffff0000u) | 0x8000u; // a tie: bf16 even or odd by bit 16
      break;
    case 1:
      u = (u & 0x807fffffu) | (static_cast<std::uint32_t>(1 + gen() % 6) << 23); // subnormal-ish
      break;
    default:
      break;
    }
    std::memcpy(&v[i], &u, sizeof u);
  }
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            1.00390625f,  // 1 + 2^-8: a tie that rounds to even (down)
                            1.01171875f}; // 1 + 3 * 2^-8: a tie that rounds to even (up)
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i)
    v[i * (n / std::size(specials))] = specials[i];
  return v;
}

// round_bf16, pack_bf16 and unpack_bf16 bit for bit against kernels/bf16.hpp (the host's, which
// the bf16 fixture parity ties to PyTorch), at odd sizes and at a multiple of 4.
void check_bf16_format() {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{100003}}) {
    const std::string tag = " (n=" + std::to_string(n) + ")";
    const auto x = bf16_cases(n, 70 + static_cast<unsigned>(n % 97));
    std::vector<float> rounded(n), widened(n);
    std::vector<std::uint16_t> packed(n);
    for (std::size_t i = 0; i < n; ++i) rounded[i] = pt::bf16::round(x[i]);
    pt::bf16::pack(packed.data(), x.data(), n);
    pt::bf16::unpack(widened.data(), packed.data(), n);
    Dev<float> d_x(x), d_widened{std::vector<float>(n)};
    Dev<std::uint16_t> d_packed{std::vector<std::uint16_t>(n)};
    co::pack_bf16(d_packed.p, d_x.p, n);
    co::unpack_bf16(d_widened.p, d_packed.p, n);
    co::round_bf16(d_x.p, n);
    expect_bits("round_bf16" + tag, d_x.host(), rounded);
    expect_bits("pack_bf16" + tag, d_packed.host(), packed);
    expect_bits("unpack_bf16" + tag, d_widened.host(), widened);
  }
}

// gelu_forward_packed and gelu_backward_packed equal gelu_forward(bf16_in) then pack_bf16 and
// gelu_backward(bf16_in) on the device bit for bit (the same GELU), and the host's within
// bf16's tolerance; the packed input is the host's pack, bit for bit.
void check_gelu_packed() {
  for (const std::size_t n : {std::size_t{7}, std::size_t{4096}, std::size_t{100003}}) {
    const std::string tag = " (n=" + std::to_string(n) + ")";
    const auto x = random(n, -4, 4, 90), d = random(n, -1, 1, 91);
    std::vector<std::uint16_t> x16(n), h16(n);
    std::vector<float> h(n), dx(n);
    ho::gelu_forward_packed(h16.data(), x16.data(), x.data(), n);
    ho::gelu_backward_packed(dx.data(), x16.data(), d.data(), n);
    pt::bf16::unpack(h.data(), h16.data(), n);
    Dev<float> d_x(x), d_d(d), d_h{std::vector<float>(n)}, d_dx{std::vector<float>(n)},
        d_dx_ref{std::vector<float>(n)}, d_x_wide{std::vector<float>(n)};
    Dev<std::uint16_t> d_x16{std::vector<std::uint16_t>(n)}, d_h16{std::vector<std::uint16_t>(n)},
        d_h16_ref{std::vector<std::uint16_t>(n)};
    co::gelu_forward_packed(d_h16.p, d_x16.p, d_x.p, n);
    co::gelu_forward(d_h.p, d_x.p, n, true);
    co::pack_bf16(d_h16_ref.p, d_h.p, n);
    co::gelu_backward_packed(d_dx.p, d_x16.p, d_d.p, n);
    co::gelu_backward(d_dx_ref.p, d_x.p, d_d.p, n, true);
    expect_bits("gelu_forward_packed inp16" + tag, d_x16.host(), x16);
    expect_bits("gelu_forward_packed out16" + tag, d_h16.host(), d_h16_ref.host());
    expect_bits("gelu_backward_packed" + tag, d_dx.host(), d_dx_ref.host());
    co::unpack_bf16(d_x_wide.p, d_h16.p, n);
    expect_close("gelu_forward_packed host" + tag, d_x_wide.host(), h, 8.0 / 256.0);
    expect_close("gelu_backward_packed host" + tag, d_dx.host(), dx);
  }
}

// At bf16 the packed products equal the fp32-operand ones on the operand's widened values, bit
// for bit (the same cuBLAS calls), and the host's within the bf16 tolerance.
void check_packed_linear() {
  const auto raw = random(NC, -1, 1, 80), w = random(static_cast<std::size_t>(OC) * C, -1, 1, 81);
  const auto bias = random(OC, -1, 1, 82),
             dout = random(static_cast<std::size_t>(N) * OC, -1, 1, 83);
  std::vector<std::uint16_t> inp16(NC);
  std::vector<float> inp(NC);
  pt::bf16::pack(inp16.data(), raw.data(), NC);
  pt::bf16::unpack(inp.data(), inp16.data(), NC);
  Dev<float> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout);
  Dev<std::uint16_t> d_inp16(inp16);
  const std::vector<float> zeros_out(static_cast<std::size_t>(N) * OC);
  Dev<float> d_out(zeros_out), d_out16(zeros_out);
  co::matmul_forward(d_out.p, d_inp.p, d_w.p, d_bias.p, N, C, OC);
  co::matmul_forward_packed(d_out16.p, d_inp16.p, d_w.p, d_bias.p, N, C, OC);
  expect_bits("matmul_forward_packed (bf16)", d_out16.host(), d_out.host());
  std::vector<float> out(zeros_out);
  ho::matmul_forward_packed(out.data(), inp16.data(), w.data(), bias.data(), N, C, OC);
  expect_close("matmul_forward_packed host (bf16)", d_out16.host(), out, 8.0 / 256.0);
  const auto dw0 = random(static_cast<std::size_t>(OC) * C, -1, 1, 84), db0 = random(OC, -1, 1, 85);
  Dev<float> d_dinp{std::vector<float>(NC)}, d_dw(dw0), d_db(db0);
  Dev<float> d_dinp16{std::vector<float>(NC)}, d_dw16(dw0), d_db16(db0), d_dw_only(dw0),
      d_db_only(db0);
  co::matmul_backward(d_dinp.p, d_dw.p, d_db.p, d_dout.p, d_inp.p, d_w.p, N, C, OC);
  co::matmul_backward_packed(d_dinp16.p, d_dw16.p, d_db16.p, d_dout.p, d_inp16.p, d_w.p, N, C, OC);
  co::matmul_backward_packed(nullptr, d_dw_only.p, d_db_only.p, d_dout.p, d_inp16.p, nullptr, N, C,
                             OC);
  expect_bits("matmul_backward_packed dinp (bf16)", d_dinp16.host(), d_dinp.host());
  expect_bits("matmul_backward_packed dw (bf16)", d_dw16.host(), d_dw.host());
  expect_bits("matmul_backward_packed dbias (bf16)", d_db16.host(), d_db.host());
  expect_bits("matmul_backward_packed dw, no dinp (bf16)", d_dw_only.host(), d_dw.host());
  auto dw = dw0, db = db0;
  std::vector<float> dinp(NC);
  ho::matmul_backward_packed(dinp.data(), dw.data(), db.data(), dout.data(), inp16.data(), w.data(),
                             N, C, OC);
  expect_close("matmul_backward_packed host dinp (bf16)", d_dinp16.host(), dinp, 8.0 / 256.0);
  expect_close("matmul_backward_packed host dw (bf16)", d_dw16.host(), dw, 8.0 / 256.0);
}

// The sums over rows (bias and norm weight gradients) have the same bits on every call: slices
// added in order, no atomics (GPT-2's width, a micro-batch of 16 x 1024 rows would take longer).
void check_deterministic_sums() {
  const int n = 8192, c = 768;
  const std::size_t nc = static_cast<std::size_t>(n) * c;
  const auto x = random(nc, -1, 1, 90), inp = random(nc, -2, 2, 91), mean = random(n, -1, 1, 92);
  const auto rstd = random(n, 0.5f, 1.5f, 93), start = random(c, -1, 1, 94);
  Dev<float> d_x(x), d_inp(inp), d_mean(mean), d_rstd(rstd);
  std::vector<float> dw[2], db[2], rw[2];
  for (int rep = 0; rep < 2; ++rep) {
    Dev<float> d_dw(start), d_db(start), d_rw(start);
    co::layernorm_backward_weight(d_dw.p, d_db.p, d_x.p, d_inp.p, d_mean.p, d_rstd.p, n, c);
    co::rmsnorm_backward_weight(d_rw.p, d_x.p, d_inp.p, d_rstd.p, n, c);
    dw[rep] = d_dw.host();
    db[rep] = d_db.host();
    rw[rep] = d_rw.host();
  }
  expect_bits("layernorm_backward_weight dw, twice", dw[1], dw[0]);
  expect_bits("layernorm_backward_weight db, twice", db[1], db[0]);
  expect_bits("rmsnorm_backward_weight, twice", rw[1], rw[0]);
}

// Attention forward and backward at the current precision, on sequences of shape (b, t, c) with
// nh heads. At bf16 the att buffer holds the backend's own format (bf16 probabilities, or the
// flash kernels' row statistics), so only fp32 compares it.
void check_attention(const std::string& tag, double tol, bool compare_att, int b = B, int t = T,
                     int c = C, int nh = NH) {
  const std::size_t n_qkv = static_cast<std::size_t>(b) * t * 3 * c;
  const std::size_t n_out = static_cast<std::size_t>(b) * t * c;
  const std::size_t n_att = static_cast<std::size_t>(b) * nh * t * t;
  const auto qkv = random(n_qkv, -1, 1, 30), dout = random(n_out, -1, 1, 31);
  std::vector<float> out(n_out), att(n_att), scratch(ho::attention_scratch_floats(b, t, nh));
  // the device's att buffer as the model sizes it: cuDNN's can keep more than the host's
  const std::vector<float> att_dev(std::max(n_att, co::attention_floats(b, t, c, nh)));
  Dev<float> d_qkv(qkv), d_dout(dout), d_out(out), d_att(att_dev), d_scratch(scratch);
  ho::attention_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  co::attention_forward(d_out.p, d_att.p, d_qkv.p, b, t, c, nh);
  expect_close("attention_forward out" + tag, d_out.host(), out, tol);
  if (compare_att) {
    auto d_att_host = d_att.host();
    d_att_host.resize(n_att);
    expect_close("attention_forward att" + tag, d_att_host, att, tol);
  }
  auto dqkv = random(n_qkv, -1, 1, 32);
  Dev<float> d_dqkv(dqkv);
  ho::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), b, t, c,
                         nh);
  co::attention_backward(d_dqkv.p, d_scratch.p, d_dout.p, d_qkv.p, d_att.p, b, t, c, nh);
  expect_close("attention_backward" + tag, d_dqkv.host(), dqkv, tol);
}

// The flash kernels (precision bf16, head size 32 or 64) on a sequence of t tokens: t need not
// be a multiple of their tile of 64. Fails unless they ran, forward and backward.
void check_flash_attention(int b, int t, int c, int nh) {
  const long before = co::flash_attention_calls();
  const std::string tag =
      " (bf16 flash, T=" + std::to_string(t) + " HS=" + std::to_string(c / nh) + ")";
  co::set_attention("flash"); // auto picks cuDNN's where the build has it
  check_attention(tag, 8.0 / 256.0, false, b, t, c, nh);
  co::set_attention("auto");
  const long ran = co::flash_attention_calls() - before;
  ++checks;
  if (ran != 2) ++failures;
  std::printf("%-4s %-40s %ld of 2 calls\n", ran == 2 ? "ok" : "FAIL",
              ("flash kernels ran" + tag).c_str(), ran);
}

// cuDNN's fused attention (device.attention = "cudnn", precision bf16) against the host, where
// the build has it; an info line where it does not.
void check_cudnn_attention(int b, int t, int c, int nh) {
  const std::string tag =
      " (bf16 cudnn, T=" + std::to_string(t) + " HS=" + std::to_string(c / nh) + ")";
  if (!co::cudnn_attention::compiled()) {
    std::printf("info %-40s not built (no cuDNN or cudnn-frontend headers)\n",
                ("attention" + tag).c_str());
    return;
  }
  co::set_attention("cudnn");
  check_attention(tag, 8.0 / 256.0, false, b, t, c, nh);
  co::set_attention("auto");
}

// The llama block's ops (RMSNorm, RoPE, SwiGLU) on both backends, on b sequences of t tokens
// with heads of hd values (Llama's own: 64, at 1024 tokens).
void check_llama(int b, int t, int hd) {
  const std::string tag = " (T=" + std::to_string(t) + " HD=" + std::to_string(hd) + ")";
  const int n = b * t, c = C, f = 2 * C, heads = 3, stride = (heads + 1) * hd;
  const std::size_t nc = static_cast<std::size_t>(n) * c;
  const auto inp = random(nc, -2, 2, 40), w = random(c, 0.5, 1.5, 41), dout = random(nc, -1, 1, 42);
  std::vector<float> out(nc), rstd(n);
  Dev<float> d_inp(inp), d_w(w), d_dout(dout), d_out(out), d_rstd(rstd);
  ho::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), 1e-5f, n, c);
  co::rmsnorm_forward(d_out.p, d_rstd.p, d_inp.p, d_w.p, 1e-5f, n, c);
  expect_close("rmsnorm_forward out" + tag, d_out.host(), out);
  expect_close("rmsnorm_forward rstd" + tag, d_rstd.host(), rstd);
  auto dinp = random(nc, -1, 1, 43), dw = random(c, -1, 1, 44);
  Dev<float> d_dinp(dinp), d_dw(dw);
  ho::rmsnorm_backward_input(dinp.data(), dout.data(), inp.data(), w.data(), rstd.data(), n, c);
  co::rmsnorm_backward_input(d_dinp.p, d_dout.p, d_inp.p, d_w.p, d_rstd.p, n, c);
  expect_close("rmsnorm_backward_input" + tag, d_dinp.host(), dinp);
  ho::rmsnorm_backward_weight(dw.data(), dout.data(), inp.data(), rstd.data(), n, c);
  co::rmsnorm_backward_weight(d_dw.p, d_dout.p, d_inp.p, d_rstd.p, n, c);
  expect_close("rmsnorm_backward_weight" + tag, d_dw.host(), dw);
  auto x = random(static_cast<std::size_t>(n) * stride, -1, 1, 45);
  Dev<float> d_x(x);
  ho::rope_forward(x.data(), n, t, stride, heads, hd, 10000.0f);
  co::rope_forward(d_x.p, n, t, stride, heads, hd, 10000.0f);
  expect_close("rope_forward" + tag, d_x.host(), x);
  ho::rope_backward(x.data(), n, t, stride, heads, hd, 10000.0f);
  co::rope_backward(d_x.p, n, t, stride, heads, hd, 10000.0f);
  expect_close("rope_backward" + tag, d_x.host(), x);
  const int nh = 6, nkv = 2; // grouped-query attention: 3 query heads per key/value head
  const auto kv = random(static_cast<std::size_t>(n) * (nh + 2 * nkv) * hd, -1, 1, 48),
             dfull = random(static_cast<std::size_t>(n) * 3 * nh * hd, -1, 1, 49);
  std::vector<float> full(dfull.size()), dkv(kv.size());
  Dev<float> d_kv(kv), d_dfull(dfull), d_full(full), d_dkv(dkv);
  ho::kv_expand(full.data(), kv.data(), n, nh, nkv, hd);
  co::kv_expand(d_full.p, d_kv.p, n, nh, nkv, hd);
  expect_close("kv_expand" + tag, d_full.host(), full);
  ho::kv_reduce(dkv.data(), dfull.data(), n, nh, nkv, hd);
  co::kv_reduce(d_dkv.p, d_dfull.p, n, nh, nkv, hd);
  expect_close("kv_reduce" + tag, d_dkv.host(), dkv);
  const auto gu = random(static_cast<std::size_t>(n) * 2 * f, -3, 3, 46),
             dh = random(static_cast<std::size_t>(n) * f, -1, 1, 47);
  std::vector<float> h(static_cast<std::size_t>(n) * f), dgu(gu.size());
  Dev<float> d_gu(gu), d_dh(dh), d_h(h), d_dgu(dgu);
  ho::swiglu_forward(h.data(), gu.data(), n, f, false);
  co::swiglu_forward(d_h.p, d_gu.p, n, f, false);
  expect_close("swiglu_forward" + tag, d_h.host(), h);
  ho::swiglu_backward(dgu.data(), gu.data(), dh.data(), n, f, false);
  co::swiglu_backward(d_dgu.p, d_gu.p, d_dh.p, n, f, false);
  expect_close("swiglu_backward" + tag, d_dgu.host(), dgu);
  ho::swiglu_forward(h.data(), gu.data(), n, f, true); // rounding the inputs as read
  co::swiglu_forward(d_h.p, d_gu.p, n, f, true);
  expect_close("swiglu_forward (bf16 in)" + tag, d_h.host(), h);
  ho::swiglu_backward(dgu.data(), gu.data(), dh.data(), n, f, true);
  co::swiglu_backward(d_dgu.p, d_gu.p, d_dh.p, n, f, true);
  expect_close("swiglu_backward (bf16 in)" + tag, d_dgu.host(), dgu);
}

void run() {
  std::vector<int32_t> tokens(static_cast<std::size_t>(N)), targets(static_cast<std::size_t>(N));
  std::mt19937 gen(7);
  for (int i = 0; i < N; ++i) {
    tokens[static_cast<std::size_t>(i)] = static_cast<int32_t>(gen() % V);
    targets[static_cast<std::size_t>(i)] = static_cast<int32_t>(gen() % V);
  }
  Dev<int32_t> d_tokens(tokens), d_targets(targets);

  { // embedding, full table and a vocabulary-parallel slice without positions
    const auto wte = random(static_cast<std::size_t>(V) * C, -1, 1, 1);
    const auto wpe = random(static_cast<std::size_t>(T) * C, -1, 1, 2);
    const auto dout = random(NC, -1, 1, 3);
    Dev<float> d_wte(wte), d_wpe(wpe), d_dout(dout);
    for (int part = 0; part < 2; ++part) {
      const int vb = part == 0 ? 0 : 100, ve = part == 0 ? V : 300;
      const float* wpe_h = part == 0 ? wpe.data() : nullptr;
      const float* wpe_d = part == 0 ? d_wpe.p : nullptr;
      const std::string tag = part == 0 ? "" : " (vocab slice)";
      std::vector<float> out(NC);
      Dev<float> d_out(out);
      ho::encoder_forward(out.data(), tokens.data(), wte.data() + static_cast<std::size_t>(vb) * C,
                          wpe_h, B, T, C, vb, ve);
      co::encoder_forward(d_out.p, d_tokens.p, d_wte.p + static_cast<std::size_t>(vb) * C, wpe_d, B,
                          T, C, vb, ve);
      expect_close("encoder_forward" + tag, d_out.host(), out);
      auto dwte = random(static_cast<std::size_t>(V) * C, -1, 1, 4);
      auto dwpe = random(static_cast<std::size_t>(T) * C, -1, 1, 5);
      Dev<float> d_dwte(dwte), d_dwpe(dwpe);
      ho::encoder_backward(dwte.data(), part == 0 ? dwpe.data() : nullptr, dout.data(),
                           tokens.data(), B, T, C, vb, ve);
      co::encoder_backward(d_dwte.p, part == 0 ? d_dwpe.p : nullptr, d_dout.p, d_tokens.p, B, T, C,
                           vb, ve);
      expect_close("encoder_backward dwte" + tag, d_dwte.host(), dwte);
      if (part == 0) expect_close("encoder_backward dwpe", d_dwpe.host(), dwpe);
    }
  }
  // layer norm: C a multiple of 4 (4 floats per load) and not
  for (const int c : {C, C - 1}) {
    const std::string tag = c == C ? "" : " (C=" + std::to_string(c) + ")";
    const std::size_t nc = static_cast<std::size_t>(N) * c;
    const auto inp = random(nc, -2, 2, 10), w = random(c, 0.5, 1.5, 11), b = random(c, -1, 1, 12);
    const auto dout = random(nc, -1, 1, 13);
    std::vector<float> out(nc), mean(N), rstd(N);
    Dev<float> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_out(out), d_mean(mean), d_rstd(rstd);
    ho::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                          c);
    co::layernorm_forward(d_out.p, d_mean.p, d_rstd.p, d_inp.p, d_w.p, d_b.p, N, c);
    expect_close("layernorm_forward out" + tag, d_out.host(), out);
    expect_close("layernorm_forward mean" + tag, d_mean.host(), mean);
    expect_close("layernorm_forward rstd" + tag, d_rstd.host(), rstd);
    auto dinp = random(nc, -1, 1, 14), dw = random(c, -1, 1, 15), db = random(c, -1, 1, 16);
    Dev<float> d_dinp(dinp), d_dw(dw), d_db(db);
    ho::layernorm_backward_input(dinp.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                 rstd.data(), N, c);
    co::layernorm_backward_input(d_dinp.p, d_dout.p, d_inp.p, d_w.p, d_mean.p, d_rstd.p, N, c);
    expect_close("layernorm_backward_input" + tag, d_dinp.host(), dinp);
    ho::layernorm_backward_weight(dw.data(), db.data(), dout.data(), inp.data(), mean.data(),
                                  rstd.data(), N, c);
    co::layernorm_backward_weight(d_dw.p, d_db.p, d_dout.p, d_inp.p, d_mean.p, d_rstd.p, N, c);
    expect_close("layernorm_backward_weight dw" + tag, d_dw.host(), dw);
    expect_close("layernorm_backward_weight db" + tag, d_db.host(), db);
  }
  check_linear("", 1e-4);
  check_attention("", 1e-4, true);
  check_llama(B, T, 16);
  check_llama(1, 1024, 64);
  check_bf16_format();
  check_gelu_packed();
  check_deterministic_sums();
  // bf16: bf16 copies of the operands, bf16 probabilities; the tolerance of the bf16 fixture
  // test, 8 eps with eps = 2^-8 (tests/cuda/parity_main.cpp)
  co::set_precision("bf16");
  const long epilogue_before = co::bias_epilogue_products();
  check_linear(" (bf16)", 8.0 / 256.0);
  std::printf("info matmul_forward (bf16) added its bias %s\n",
              co::bias_epilogue_products() > epilogue_before
                  ? "in cuBLASLt's epilogue"
                  : "by a broadcast (no cuBLASLt kernel)");
  check_attention(" (bf16)", 8.0 / 256.0, false); // head size 24: the cuBLAS path
  check_flash_attention(2, 200, 256, 4);          // GPT-2's head size, 4 tiles (the last short)
  check_flash_attention(1, 64, 128, 4);           // head size 32, one full tile
  check_flash_attention(3, 37, 128, 2);           // one short tile
  check_flash_attention(1, 1024, 512, 8);         // Llama's head size and GPT-2's length
  check_cudnn_attention(2, 200, 256, 4);
  check_cudnn_attention(1, 1024, 512, 8);
  check_packed_linear();
  co::set_precision("fp32");
  for (const std::size_t n : {100003, 100000}) { // elementwise: 4 floats per load, and not
    const std::string tag = n % 4 == 0 ? " (n % 4 = 0)" : "";
    const auto a = random(n, -4, 4, 40), b = random(n, -1, 1, 41);
    std::vector<float> out(n);
    Dev<float> d_a(a), d_b(b), d_out(out);
    ho::gelu_forward(out.data(), a.data(), n, false);
    co::gelu_forward(d_out.p, d_a.p, n, false);
    expect_close("gelu_forward" + tag, d_out.host(), out);
    ho::gelu_backward(out.data(), a.data(), b.data(), n, false);
    co::gelu_backward(d_out.p, d_a.p, d_b.p, n, false);
    expect_close("gelu_backward" + tag, d_out.host(), out);
    for (const bool r : {true, false}) { // rounding as read, then not: the same as the host's
      const std::string rt = r ? " (bf16 in)" : "";
      ho::gelu_forward(out.data(), a.data(), n, r);
      co::gelu_forward(d_out.p, d_a.p, n, r);
      expect_close("gelu_forward" + rt + tag, d_out.host(), out);
      ho::gelu_backward(out.data(), a.data(), b.data(), n, r);
      co::gelu_backward(d_out.p, d_a.p, d_b.p, n, r);
      expect_close("gelu_backward" + rt + tag, d_out.host(), out);
      std::vector<float> sum = a;
      Dev<float> d_sum(a);
      ho::residual_add(sum.data(), b.data(), n, r);
      co::residual_add(d_sum.p, d_b.p, n, r);
      expect_close("residual_add" + rt + tag, d_sum.host(), sum);
    }
    ho::add(out.data(), a.data(), b.data(), n);
    co::add(d_out.p, d_a.p, d_b.p, n);
    expect_close("add" + tag, d_out.host(), out);
    ho::accumulate(out.data(), b.data(), n);
    co::accumulate(d_out.p, d_b.p, n);
    expect_close("accumulate" + tag, d_out.host(), out);
    ho::scale(out.data(), -0.37f, n);
    co::scale(d_out.p, -0.37f, n);
    expect_close("scale" + tag, d_out.host(), out);
    const double ss_h = ho::sum_squares(out.data(), n), ss_d = co::sum_squares(d_out.p, n);
    expect_close("sum_squares" + tag, {static_cast<float>(ss_d)}, {static_cast<float>(ss_h)});
    const std::size_t offsets[] = {0, 17, 50000, n}, sizes[] = {17, 49983, n - 50000, 0};
    double each_h[4], each_d[4];
    ho::sum_squares_each(each_h, out.data(), offsets, sizes, 4);
    co::sum_squares_each(each_d, d_out.p, offsets, sizes, 4);
    std::vector<float> got, want;
    for (int i = 0; i < 4; ++i) {
      got.push_back(static_cast<float>(each_d[i]));
      want.push_back(static_cast<float>(each_h[i]));
    }
    expect_close("sum_squares_each" + tag, got, want);
    ho::zero(out.data(), n);
    co::zero(d_out.p, n);
    expect_close("zero" + tag, d_out.host(), out);
  }
  // cross-entropy, whole (probs over the logits, as the engine does): V a multiple of 4 (4
  // logits per load) and not
  for (const int v : {V, V + 3}) {
    const std::string tag = v % 4 == 0 ? " (V % 4 = 0)" : "";
    const std::size_t nv = static_cast<std::size_t>(N) * v;
    const auto logits = random(nv, -5, 5, 50);
    std::vector<float> probs = logits, losses(N);
    Dev<float> d_probs(probs), d_losses(losses);
    ho::crossentropy_forward(losses.data(), probs.data(), probs.data(), targets.data(), N, v,
                             false);
    co::crossentropy_forward(d_losses.p, d_probs.p, d_probs.p, d_targets.p, N, v, false);
    expect_close("crossentropy_forward losses" + tag, d_losses.host(), losses);
    expect_close("crossentropy_forward probs" + tag, d_probs.host(), probs);
    ho::crossentropy_backward(probs.data(), probs.data(), targets.data(), 0.01f, N, v);
    co::crossentropy_backward(d_probs.p, d_probs.p, d_targets.p, 0.01f, N, v);
    expect_close("crossentropy_backward" + tag, d_probs.host(), probs);
    // both in one call, in place over the logits: the same losses and gradient as the two
    std::vector<float> fused = logits, fused_losses(N);
    Dev<float> d_fused(fused), d_fused_losses(fused_losses);
    co::crossentropy_forward_backward(d_fused_losses.p, d_fused.p, d_fused.p, d_targets.p, 0.01f, N,
                                      v, false);
    expect_close("crossentropy_forward_backward losses" + tag, d_fused_losses.host(), losses);
    expect_close("crossentropy_forward_backward dlogits" + tag, d_fused.host(), probs);
    // the logits rounded to bf16 as they are read, against the host's
    std::vector<float> r16 = logits, r16_losses(N);
    ho::crossentropy_forward(r16_losses.data(), r16.data(), r16.data(), targets.data(), N, v, true);
    ho::crossentropy_backward(r16.data(), r16.data(), targets.data(), 0.01f, N, v);
    Dev<float> d_r16(logits), d_r16_losses(r16_losses);
    co::crossentropy_forward_backward(d_r16_losses.p, d_r16.p, d_r16.p, d_targets.p, 0.01f, N, v,
                                      true);
    expect_close("crossentropy_forward_backward losses (bf16 in)" + tag, d_r16_losses.host(),
                 r16_losses);
    expect_close("crossentropy_forward_backward dlogits (bf16 in)" + tag, d_r16.host(), r16);
  }
  { // cross-entropy in pieces over a vocabulary slice
    const std::size_t nv = static_cast<std::size_t>(N) * V;
    const auto logits = random(nv, -5, 5, 50);
    const int vb = 200, Vs = 152; // a vocabulary slice: columns [200, 352), 4 per load
    std::vector<float> x(static_cast<std::size_t>(N) * Vs), mx(N), z(N), sum(N), ls(N);
    for (int r = 0; r < N; ++r) {
      for (int c = 0; c < Vs; ++c) {
        x[static_cast<std::size_t>(r) * Vs + c] = logits[static_cast<std::size_t>(r) * V + vb + c];
      }
    }
    Dev<float> d_x(x), d_mx(mx), d_z(z), d_sum(sum), d_ls(ls);
    ho::row_max(mx.data(), x.data(), N, Vs);
    co::row_max(d_mx.p, d_x.p, N, Vs);
    expect_close("row_max", d_mx.host(), mx);
    ho::gather_target(z.data(), x.data(), targets.data(), N, Vs, vb);
    co::gather_target(d_z.p, d_x.p, d_targets.p, N, Vs, vb);
    expect_close("gather_target", d_z.host(), z);
    ho::softmax_exp(x.data(), sum.data(), x.data(), mx.data(), N, Vs);
    co::softmax_exp(d_x.p, d_sum.p, d_x.p, d_mx.p, N, Vs);
    expect_close("softmax_exp p", d_x.host(), x);
    expect_close("softmax_exp sum", d_sum.host(), sum);
    ho::crossentropy_finish(ls.data(), x.data(), sum.data(), mx.data(), z.data(), N, Vs);
    co::crossentropy_finish(d_ls.p, d_x.p, d_sum.p, d_mx.p, d_z.p, N, Vs);
    expect_close("crossentropy_finish losses", d_ls.host(), ls);
    expect_close("crossentropy_finish p", d_x.host(), x);
    ho::crossentropy_backward(x.data(), x.data(), targets.data(), 0.5f, N, Vs, vb);
    co::crossentropy_backward(d_x.p, d_x.p, d_targets.p, 0.5f, N, Vs, vb);
    expect_close("crossentropy_backward (vocab slice)", d_x.host(), x);
  }
  { // AdamW, three steps, one call over segments with and without decay, of several chunks and
    // of less than one, the moments at other offsets than the parameters (as ZeRO-1's shards)
    const std::vector<ho::AdamWSegment> segs{{0, 5, 20000, true},
                                             {20000, 20005, 3, false},
                                             {20010, 20008, 50001, true},
                                             {70011, 0, 4, false}};
    const std::size_t np = 70015, ns = 70009;
    auto p = random(np, -1, 1, 60), m = random(ns, -0.1f, 0.1f, 61), v = random(ns, 0, 0.01f, 62);
    const auto grad = random(ns, -1, 1, 63);
    Dev<float> d_p(p), d_m(m), d_v(v), d_g(grad);
    for (int t = 1; t <= 3; ++t) {
      const ho::AdamWStep s{
          3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, std::pow(0.9, t), std::pow(0.95, t)};
      const int count = static_cast<int>(segs.size());
      ho::adamw_update(p.data(), m.data(), v.data(), grad.data(), segs.data(), count, s);
      co::adamw_update(d_p.p, d_m.p, d_v.p, d_g.p, segs.data(), count, s);
    }
    expect_close("adamw_update param", d_p.host(), p);
    expect_close("adamw_update m", d_m.host(), m);
    expect_close("adamw_update v", d_v.host(), v);
  }
  co::synchronize();
}

} // namespace

int main(int argc, char** argv) {
  std::string why;
  const int devices = pt::cuda::device_count(why);
  if (!pt::cuda::compiled() || devices == 0) {
    std::printf("SKIP: no CUDA device visible (%s)\n",
                pt::cuda::compiled() ? why.c_str() : "built without nvcc");
    return 77;
  }
  const pt::ops::HostThreads threads(1);
  try {
    co::init(0);
    run();
    co::finalize();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%d of %d checks passed\n", checks - failures, checks);
  return failures == 0 ? 0 : 1;
}
