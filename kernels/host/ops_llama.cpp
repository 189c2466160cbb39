// Host kernels of the llama block (kernels/ops_list.inc): RMSNorm, rotary position embedding,
// grouped-query attention's key/value heads and SwiGLU. N = rows (B*T), C = channels, F = MLP
// width, HD = head dimension.
#include <cmath>
#include <vector>

#include "bf16.hpp"
#include "host/fast_math.hpp"
#include "host/loops.hpp"
#include "ops.hpp"

namespace pt::ops {

using detail::par_col_blocks;
using detail::par_rows;

// ---- RMSNorm ---------------------------------------------------------------------------------

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, float eps, int N,
                     int C) {
  par_rows("rmsnorm_forward", N, C, [=](std::size_t n) {
    const float* x = inp + n * C;
    float ss = 0.0f;
    for (int c = 0; c < C; ++c) ss += x[c] * x[c];
    const float r = 1.0f / std::sqrt(ss / C + eps);
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  });
}

// y = x r w with r = (mean(x^2) + eps)^(-1/2): dx = r (g - x r^2 mean(g x)), g = dy w
void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                            const float* rstd, int N, int C) {
  par_rows("rmsnorm_backward_input", N, C, [=](std::size_t n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float r = rstd[n];
    float gx = 0.0f;
    for (int c = 0; c < C; ++c) gx += d[c] * w[c] * x[c];
    const float k = r * r * gx / C;
    float* dx = dinp + n * C;
    for (int c = 0; c < C; ++c) dx[c] += (d[c] * w[c] - x[c] * k) * r;
  });
}

void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd,
                             int N, int C) {
  par_col_blocks("rmsnorm_backward_weight", C, [=](int c0, int c1) {
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<std::size_t>(n) * C;
      const float* d = dout + static_cast<std::size_t>(n) * C;
      for (int c = c0; c < c1; ++c) dw[c] += d[c] * x[c] * rstd[n];
    }
  });
}

// ---- rotary position embedding -----------------------------------------------------------------

namespace {

// cos and sin of pos * theta^(-2i/HD) for pos < T, i < HD/2 (index pos * HD/2 + i), computed in
// double and rounded once
void rope_table(std::vector<float>& cs, std::vector<float>& sn, int T, int HD, float theta) {
  const int half = HD / 2;
  cs.resize(static_cast<std::size_t>(T) * half);
  sn.resize(cs.size());
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / HD);
    for (int t = 0; t < T; ++t) {
      const double a = t * inv_freq;
      cs[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      sn[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// sign +1: the rotation; -1: its transpose
void rope(float* x, int N, int T, int stride, int heads, int HD, float theta, float sign) {
  std::vector<float> cs, sn;
  rope_table(cs, sn, T, HD, theta);
  const float* c = cs.data();
  const float* s = sn.data();
  const int half = HD / 2;
  par_rows("rope", N, stride, [=](std::size_t n) {
    const std::size_t t = n % static_cast<std::size_t>(T);
    for (int h = 0; h < heads; ++h) {
      float* v = x + n * stride + static_cast<std::size_t>(h) * HD;
      for (int i = 0; i < half; ++i) {
        const float co = c[t * half + i], si = sign * s[t * half + i];
        const float a = v[i], b = v[i + half];
        v[i] = a * co - b * si;
        v[i + half] = b * co + a * si;
      }
    }
  });
}

} // namespace

void rope_forward(float* x, int N, int T, int stride, int heads, int HD, float theta) {
  rope(x, N, T, stride, heads, HD, theta, 1.0f);
}

void rope_backward(float* x, int N, int T, int stride, int heads, int HD, float theta) {
  rope(x, N, T, stride, heads, HD, theta, -1.0f);
}

// ---- grouped-query attention ------------------------------------------------------------------

void kv_expand(float* full, const float* packed, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV, in_row = (NH + 2 * NKV) * HD, out_row = 3 * NH * HD;
  par_rows("kv_expand", N, in_row + out_row, [=](std::size_t n) {
    const float* src = packed + n * in_row;
    float* dst = full + n * out_row;
    for (int i = 0; i < NH * HD; ++i) dst[i] = src[i];
    for (int part = 1; part <= 2; ++part) { // keys, then values
      for (int h = 0; h < NH; ++h) {
        const float* head = src + NH * HD + ((part - 1) * NKV + h / group) * HD;
        float* out = dst + (part * NH + h) * HD;
        for (int i = 0; i < HD; ++i) out[i] = head[i];
      }
    }
  });
}

void kv_reduce(float* packed, const float* full, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV, out_row = (NH + 2 * NKV) * HD, in_row = 3 * NH * HD;
  par_rows("kv_reduce", N, in_row + out_row, [=](std::size_t n) {
    const float* src = full + n * in_row;
    float* dst = packed + n * out_row;
    for (int i = 0; i < NH * HD; ++i) dst[i] = src[i];
    for (int part = 1; part <= 2; ++part) {
      for (int k = 0; k < NKV; ++k) {
        float* out = dst + NH * HD + ((part - 1) * NKV + k) * HD;
        for (int i = 0; i < HD; ++i) {
          float sum = 0.0f;
          for (int j = 0; j < group; ++j) sum += src[(part * NH + k * group + j) * HD + i];
          out[i] = sum;
        }
      }
    }
  });
}

// ---- SwiGLU ----------------------------------------------------------------------------------

// silu(g) = g sigmoid(g) with fast_exp (host/fast_math.hpp), so that GCC vectorizes the rows;
// BF16: the inputs rounded to bfloat16 as they are read (bf16_in)
namespace {

template <bool BF16> float read(const float* p, int j) {
  return BF16 ? bf16::round(p[j]) : p[j];
}

float sigmoid(float g) {
  return 1.0f / (1.0f + detail::fast_exp(-g));
}

template <bool BF16> void swiglu_row(float* o, const float* g, const float* u, int F) {
  for (int j = 0; j < F; ++j) {
    const float gate = read<BF16>(g, j);
    o[j] = gate * sigmoid(gate) * read<BF16>(u, j);
  }
}

// d gate = dout u s (1 + g (1 - s)), s = sigmoid(g); d up = dout silu(g)
template <bool BF16>
void swiglu_backward_row(float* dg, float* du, const float* g, const float* u, const float* d,
                         int F) {
  for (int j = 0; j < F; ++j) {
    const float gate = read<BF16>(g, j), up = read<BF16>(u, j), dj = read<BF16>(d, j);
    const float s = sigmoid(gate);
    dg[j] = dj * up * s * (1.0f + gate * (1.0f - s));
    du[j] = dj * gate * s;
  }
}

} // namespace

void swiglu_forward(float* out, const float* inp, int N, int F, bool bf16_in) {
  par_rows("swiglu_forward", N, 3 * F, [=](std::size_t n) {
    const float* g = inp + n * 2 * F;
    float* o = out + n * F;
    bf16_in ? swiglu_row<true>(o, g, g + F, F) : swiglu_row<false>(o, g, g + F, F);
  });
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, bool bf16_in) {
  par_rows("swiglu_backward", N, 5 * F, [=](std::size_t n) {
    const float* g = inp + n * 2 * F;
    const float* d = dout + n * F;
    float* dg = dinp + n * 2 * F;
    if (bf16_in) {
      swiglu_backward_row<true>(dg, dg + F, g, g + F, d, F);
    } else {
      swiglu_backward_row<false>(dg, dg + F, g, g + F, d, F);
    }
  });
}

} // namespace pt::ops
