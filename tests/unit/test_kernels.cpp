// Host kernels against direct formulas, on shapes the parity test does not use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "host/fast_math.hpp"
#include "host/gemm.hpp"
#include "ops.hpp"

namespace pt {
namespace {

TEST(Kernels, FastExpIsAccurate) {
  double worst = 0.0;
  for (double x = -80.0; x <= 80.0; x += 0.001) {
    const double want = std::exp(static_cast<double>(static_cast<float>(x)));
    const double got = ops::detail::fast_exp(static_cast<float>(x));
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 4e-7) << "worst relative error " << worst;
}

TEST(Kernels, GeluMatchesTanhFormula) {
  std::vector<float> x, y(2001), dy(2001), ones(2001, 1.0f);
  for (int i = -1000; i <= 1000; ++i) x.push_back(static_cast<float>(i) * 0.01f);
  ops::gelu_forward(y.data(), x.data(), x.size(), false);
  ops::gelu_backward(dy.data(), x.data(), ones.data(), x.size(), false);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double u = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    const double want = 0.5 * v * (1.0 + std::tanh(u));
    const double h = 1e-4;
    auto g = [](double z) {
      return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    };
    const double dwant = (g(v + h) - g(v - h)) / (2 * h);
    ASSERT_NEAR(y[i], want, 2e-6) << "x = " << v;
    ASSERT_NEAR(dy[i], dwant, 2e-6) << "x = " << v;
  }
}

// bf16_in rounds the inputs as they are read: the bits of rounding them first, then the fp32 op
// (the activation format's round folded into the op that reads the tensor).
TEST(Kernels, RoundOnReadEqualsRoundFirst) {
  const std::size_t n = 4099; // odd: the loops' tails too
  std::vector<float> x(n), d(n), r(n), xr(n), dr(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
    d[i] = std::cos(0.11f * static_cast<float>(i)) * 0.7f;
    r[i] = std::sin(0.05f * static_cast<float>(i));
  }
  xr = x;
  dr = d;
  ops::round_bf16(xr.data(), n);
  ops::round_bf16(dr.data(), n);
  const auto same = [&](const std::vector<float>& a, const std::vector<float>& b,
                        const char* what) {
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << " at " << i;
  };
  std::vector<float> got(n), want(n);
  ops::gelu_forward(got.data(), x.data(), n, true);
  ops::gelu_forward(want.data(), xr.data(), n, false);
  same(got, want, "gelu_forward");
  ops::gelu_backward(got.data(), x.data(), d.data(), n, true);
  ops::gelu_backward(want.data(), xr.data(), dr.data(), n, false);
  same(got, want, "gelu_backward");
  got = x;
  want = xr;
  ops::residual_add(got.data(), r.data(), n, true);
  ops::residual_add(want.data(), r.data(), n, false);
  same(got, want, "residual_add");
  const int N = 3, F = (static_cast<int>(n) - 1) / 6; // swiglu: (N, 2F) in, (N, F) out
  std::vector<float> h(static_cast<std::size_t>(N) * F), hw(h.size());
  std::vector<float> dg(static_cast<std::size_t>(N) * 2 * F), dgw(dg.size());
  ops::swiglu_forward(h.data(), x.data(), N, F, true);
  ops::swiglu_forward(hw.data(), xr.data(), N, F, false);
  same(h, hw, "swiglu_forward");
  ops::swiglu_backward(dg.data(), x.data(), d.data(), N, F, true);
  ops::swiglu_backward(dgw.data(), xr.data(), dr.data(), N, F, false);
  same(dg, dgw, "swiglu_backward");
  const int V = 1366; // cross-entropy over 3 rows of x, in place as the stage runs it
  std::vector<std::int32_t> targets{5, 700, 1365};
  std::vector<float> ce(x.begin(), x.begin() + 3 * V), cew(xr.begin(), xr.begin() + 3 * V);
  std::vector<float> loss(3), lossw(3);
  ops::crossentropy_forward_backward(loss.data(), ce.data(), ce.data(), targets.data(), 0.5f, 3, V,
                                     true);
  ops::crossentropy_forward_backward(lossw.data(), cew.data(), cew.data(), targets.data(), 0.5f, 3,
                                     V, false);
  same(loss, lossw, "crossentropy_forward_backward losses");
  same(ce, cew, "crossentropy_forward_backward d logits");
}

TEST(Kernels, MatmulWithBiasMatchesLoops) {
  const int N = 7, C = 5, OC = 3;
  std::vector<float> inp(N * C), w(OC * C), b(OC), out(N * OC);
  for (std::size_t i = 0; i < inp.size(); ++i) inp[i] = std::sin(0.3f * static_cast<float>(i));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.7f * static_cast<float>(i));
  for (int k = 0; k < OC; ++k) b[static_cast<std::size_t>(k)] = 0.1f * static_cast<float>(k + 1);
  ops::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < OC; ++k) {
      double want = b[static_cast<std::size_t>(k)];
      for (int c = 0; c < C; ++c)
        want += inp[static_cast<std::size_t>(n * C + c)] * w[static_cast<std::size_t>(k * C + c)];
      EXPECT_NEAR(out[static_cast<std::size_t>(n * OC + k)], want, 1e-5);
    }
  }
}

// The products' grid of blocks: it covers the output, keeps the size limits, and cuts the
// benchmark model's weight gradients into at least 4 blocks.
TEST(Kernels, GemmGridCoversTheOutput) {
  const int shapes[][2] = {{384, 384}, {1152, 384}, {384, 1536}, {2048, 1152}, {100, 7},
                           {390, 400}, {520, 1040}, {3000, 50},  {1, 1}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1];
    const ops::detail::Grid g = ops::detail::gemm_grid(M, N);
    EXPECT_GE(g.rows * g.block_rows, M) << M << " x " << N;
    EXPECT_GE(g.cols * g.block_cols, N) << M << " x " << N;
    EXPECT_LT((g.rows - 1) * g.block_rows, M) << M << " x " << N;
    EXPECT_LT((g.cols - 1) * g.block_cols, N) << M << " x " << N;
    EXPECT_LE(g.block_rows, ops::detail::kBlockRows);
    EXPECT_LE(g.block_cols, ops::detail::kBlockCols);
  }
  const ops::detail::Grid square = ops::detail::gemm_grid(384, 384);
  EXPECT_EQ(square.rows, 2);
  EXPECT_EQ(square.cols, 2);
  EXPECT_EQ(square.block_rows, 192);
  EXPECT_EQ(ops::detail::gemm_grid(1152, 384).rows, 4);
  EXPECT_EQ(ops::detail::gemm_grid(384, 1536).cols, 4);
  EXPECT_EQ(ops::detail::gemm_grid(100, 7).rows * ops::detail::gemm_grid(100, 7).cols, 1);
}

// A weight gradient cut into 4 uneven blocks (a transposed operand) against direct sums.
TEST(Kernels, BlockedWeightGradientMatchesLoops) {
  const int N = 9, C = 400, OC = 390;
  std::vector<float> dout(N * OC), inp(N * C), dw(OC * C, 0.5f);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < inp.size(); ++i) inp[i] = std::cos(0.11f * static_cast<float>(i));
  ops::matmul_backward_weight(dw.data(), nullptr, dout.data(), inp.data(), N, C, OC);
  for (int k = 0; k < OC; ++k) {
    for (int c = 0; c < C; ++c) {
      double want = 0.5;
      for (int n = 0; n < N; ++n) {
        want += static_cast<double>(dout[static_cast<std::size_t>(n * OC + k)]) *
                inp[static_cast<std::size_t>(n * C + c)];
      }
      ASSERT_NEAR(dw[static_cast<std::size_t>(k * C + c)], want, 1e-5) << k << ", " << c;
    }
  }
}

TEST(Kernels, AttentionIsCausalAndNormalized) {
  const int B = 2, T = 9, C = 8, NH = 2;
  std::vector<float> qkv(B * T * 3 * C), out(B * T * C), att(B * NH * T * T);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * static_cast<float>(i));
  ops::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int bh = 0; bh < B * NH; ++bh) {
    for (int i = 0; i < T; ++i) {
      double sum = 0.0;
      for (int j = 0; j < T; ++j) {
        const float p = att[static_cast<std::size_t>((bh * T + i) * T + j)];
        if (j > i) {
          ASSERT_EQ(p, 0.0f) << "future position " << j << " seen from " << i;
        }
        sum += p;
      }
      ASSERT_NEAR(sum, 1.0, 1e-6);
    }
  }
  // the first position attends only to itself: its output is its own value vector
  for (int h = 0; h < NH; ++h) {
    for (int d = 0; d < C / NH; ++d) {
      EXPECT_NEAR(out[static_cast<std::size_t>(h * (C / NH) + d)],
                  qkv[static_cast<std::size_t>(2 * C + h * (C / NH) + d)], 1e-6);
    }
  }
}

TEST(Kernels, LayerNormNormalizesRows) {
  const int N = 3, C = 64;
  std::vector<float> x(N * C), w(C, 1.0f), b(C, 0.0f), y(N * C), mean(N), rstd(N);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3.0f + 2.0f * std::sin(static_cast<float>(i));
  ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += y[static_cast<std::size_t>(n * C + c)];
    m /= C;
    for (int c = 0; c < C; ++c) v += std::pow(y[static_cast<std::size_t>(n * C + c)] - m, 2);
    v /= C;
    EXPECT_NEAR(m, 0.0, 1e-6);
    EXPECT_NEAR(v, 1.0, 1e-4);
  }
}

} // namespace
} // namespace pt
