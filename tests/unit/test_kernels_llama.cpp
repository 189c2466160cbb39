// The llama block's host kernels (RMSNorm, RoPE, SwiGLU) against formulas written another way:
// gradients against central differences of a float64 forward, RoPE against complex rotation and
// its defining property (scores depend on positions only through their difference).
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <functional>
#include <vector>

#include "ops.hpp"

namespace pt {
namespace {

std::vector<float> wave(std::size_t n, double a, double b) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::sin(a * i + b) * 1.3);
  return x;
}

// d/dx_i of sum_j r_j f(x)_j by central differences in double, for every i
std::vector<double> numeric_grad(const std::function<std::vector<double>(std::vector<double>)>& f,
                                 const std::vector<float>& x, const std::vector<float>& r) {
  std::vector<double> xd(x.begin(), x.end()), g(x.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = xd, down = xd;
    up[i] += h;
    down[i] -= h;
    const std::vector<double> fu = f(up), fd = f(down);
    double s = 0.0;
    for (std::size_t j = 0; j < fu.size(); ++j) s += r[j] * (fu[j] - fd[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

TEST(KernelsLlama, RmsNormForwardAndGradients) {
  const int N = 5, C = 12;
  const float eps = 1e-5f;
  const std::vector<float> x = wave(N * C, 0.37, 0.1), w = wave(C, 0.9, 1.0),
                           r = wave(N * C, 0.53, 2.0);
  // y (N*C) from x (N*C, then C of w appended), in double
  const auto f = [&](std::vector<double> xw) {
    std::vector<double> y(N * C);
    for (int n = 0; n < N; ++n) {
      double ss = 0.0;
      for (int c = 0; c < C; ++c) ss += xw[n * C + c] * xw[n * C + c];
      const double rs = 1.0 / std::sqrt(ss / C + eps);
      for (int c = 0; c < C; ++c) y[n * C + c] = xw[n * C + c] * rs * xw[N * C + c];
    }
    return y;
  };
  std::vector<float> xw = x;
  xw.insert(xw.end(), w.begin(), w.end());
  const std::vector<double> want = f(std::vector<double>(xw.begin(), xw.end()));
  std::vector<float> y(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), eps, N, C);
  for (int i = 0; i < N * C; ++i) ASSERT_NEAR(y[i], want[i], 1e-5) << i;
  ops::rmsnorm_backward_input(dx.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  ops::rmsnorm_backward_weight(dw.data(), r.data(), x.data(), rstd.data(), N, C);
  const std::vector<double> g = numeric_grad(f, xw, r);
  for (int i = 0; i < N * C; ++i) EXPECT_NEAR(dx[i], g[i], 2e-4) << "dx " << i;
  for (int c = 0; c < C; ++c) EXPECT_NEAR(dw[c], g[N * C + c], 2e-4) << "dw " << c;
}

TEST(KernelsLlama, RopeRotatesHalvesByPositionAngles) {
  // two sequences of T = 7 rows; each row: 3 rotated heads of HD = 8, then 4 floats untouched
  const int B = 2, T = 7, HD = 8, heads = 3, stride = heads * HD + 4, N = B * T;
  const float theta = 500.0f;
  const std::vector<float> x = wave(static_cast<std::size_t>(N) * stride, 0.71, 0.3);
  std::vector<float> y = x;
  ops::rope_forward(y.data(), N, T, stride, heads, HD, theta);
  for (int n = 0; n < N; ++n) {
    const int t = n % T;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < HD / 2; ++i) {
        const std::size_t a = static_cast<std::size_t>(n) * stride + h * HD + i, b = a + HD / 2;
        // the pair as one complex number, turned by e^(i t theta^(-2i/HD))
        const std::complex<double> z(x[a], x[b]),
            turned = z * std::polar(1.0, t * std::pow(double{theta}, -2.0 * i / HD));
        ASSERT_NEAR(y[a], turned.real(), 1e-5) << "row " << n << " head " << h << " i " << i;
        ASSERT_NEAR(y[b], turned.imag(), 1e-5) << "row " << n << " head " << h << " i " << i;
      }
    }
    for (int k = heads * HD; k < stride; ++k) {
      ASSERT_EQ(y[n * stride + k], x[n * stride + k]) << "a float past the rotated heads moved";
    }
  }
  // the backward is the transpose: <rope(x), r> = <x, rope_backward(r)>
  std::vector<float> r = wave(x.size(), 0.29, 1.7), rb = r;
  ops::rope_backward(rb.data(), N, T, stride, heads, HD, theta);
  double lhs = 0.0, rhs = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    lhs += static_cast<double>(y[i]) * r[i];
    rhs += static_cast<double>(x[i]) * rb[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::abs(lhs) + 1e-5);
}

TEST(KernelsLlama, RopeScoresDependOnRelativePosition) {
  // one head, the same q and k placed at every position: q(t1) . k(t2) depends on t2 - t1 only
  const int T = 12, HD = 16;
  const std::vector<float> q = wave(HD, 0.4, 0.2), k = wave(HD, 0.8, 1.1);
  std::vector<float> qs(T * HD), ks(T * HD);
  for (int t = 0; t < T; ++t) {
    std::copy(q.begin(), q.end(), qs.begin() + t * HD);
    std::copy(k.begin(), k.end(), ks.begin() + t * HD);
  }
  ops::rope_forward(qs.data(), T, T, HD, 1, HD, 10000.0f);
  ops::rope_forward(ks.data(), T, T, HD, 1, HD, 10000.0f);
  const auto score = [&](int t1, int t2) {
    double s = 0.0;
    for (int i = 0; i < HD; ++i) s += static_cast<double>(qs[t1 * HD + i]) * ks[t2 * HD + i];
    return s;
  };
  for (int d = 0; d < 5; ++d) {
    for (int t1 = 0; t1 + d < T; ++t1) {
      EXPECT_NEAR(score(t1, t1 + d), score(0, d), 1e-5) << "positions " << t1 << ", " << t1 + d;
    }
  }
  EXPECT_GT(std::abs(score(0, 1) - score(0, 0)), 1e-3) << "the rotation changed nothing";
}

TEST(KernelsLlama, KeyValueHeadsRepeatAndTheirGradientsSum) {
  // 6 query heads, 2 key/value heads: query heads 0-2 read kv head 0, heads 3-5 kv head 1
  const int N = 3, NH = 6, NKV = 2, HD = 4, packed_row = (NH + 2 * NKV) * HD,
            full_row = 3 * NH * HD;
  const std::vector<float> x = wave(N * packed_row, 0.47, 0.8), y = wave(N * full_row, 0.21, 0.5);
  std::vector<float> full(N * full_row), back(N * packed_row);
  ops::kv_expand(full.data(), x.data(), N, NH, NKV, HD);
  for (int n = 0; n < N; ++n) {
    for (int part = 0; part < 3; ++part) {
      for (int h = 0; h < NH; ++h) {
        const int from = part == 0 ? h : NH + (part - 1) * NKV + h / (NH / NKV);
        for (int i = 0; i < HD; ++i) {
          ASSERT_EQ(full[n * full_row + (part * NH + h) * HD + i],
                    x[n * packed_row + from * HD + i])
              << "row " << n << " part " << part << " head " << h;
        }
      }
    }
  }
  // the reduction is the expansion's transpose: <expand(x), y> = <x, reduce(y)>
  ops::kv_reduce(back.data(), y.data(), N, NH, NKV, HD);
  double lhs = 0.0, rhs = 0.0;
  for (std::size_t i = 0; i < full.size(); ++i) lhs += static_cast<double>(full[i]) * y[i];
  for (std::size_t i = 0; i < x.size(); ++i) rhs += static_cast<double>(x[i]) * back[i];
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs));
}

TEST(KernelsLlama, SwigluForwardAndGradients) {
  const int N = 4, F = 6;
  const std::vector<float> x = wave(N * 2 * F, 0.61, 0.4), r = wave(N * F, 0.33, 0.9);
  const auto f = [&](std::vector<double> in) {
    std::vector<double> y(N * F);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < F; ++j) {
        const double g = in[n * 2 * F + j], u = in[n * 2 * F + F + j];
        y[n * F + j] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    return y;
  };
  const std::vector<double> want = f(std::vector<double>(x.begin(), x.end()));
  std::vector<float> y(N * F), dx(N * 2 * F);
  ops::swiglu_forward(y.data(), x.data(), N, F, false);
  for (int i = 0; i < N * F; ++i) ASSERT_NEAR(y[i], want[i], 1e-6) << i;
  ops::swiglu_backward(dx.data(), x.data(), r.data(), N, F, false);
  const std::vector<double> g = numeric_grad(f, x, r);
  for (int i = 0; i < N * 2 * F; ++i) EXPECT_NEAR(dx[i], g[i], 1e-5) << i;
}

} // namespace
} // namespace pt
