// Host implementation of kernels/ops.hpp: Kokkos (any host execution space) for elementwise and
// per-row kernels, CBLAS sgemm for every matrix product. See kernels/ops.hpp for shapes.
#include "ops.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "bf16.hpp"
#include "host/fast_math.hpp"
#include "host/gemm.hpp"
#include "host/loops.hpp"

namespace pt::ops {
namespace {

using detail::fast_exp;
using detail::fast_tanh;
using detail::gemm;
using detail::par_chunks;
using detail::par_col_blocks;
using detail::par_for;
using detail::par_rows;

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f; // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

} // namespace

const char* blas_name() {
#if defined(PT_BLAS_ONEDNN)
  return "onednn";
#elif defined(PT_BLAS_OPENBLAS)
  return "openblas";
#elif defined(PT_BLAS_BLIS)
  return "blis";
#else
  return "generic-cblas";
#endif
}

// ---- embedding ------------------------------------------------------------------------------

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, int v_begin, int v_end) {
  par_rows("encoder_forward", static_cast<std::size_t>(B) * T, C, [=](std::size_t bt) {
    const int t = static_cast<int>(bt % T);
    const int tok = tokens[bt];
    float* o = out + bt * C;
    const bool mine = tok >= v_begin && tok < v_end;
    const float* e = mine ? wte + static_cast<std::size_t>(tok - v_begin) * C : nullptr;
    const float* p = wpe != nullptr ? wpe + static_cast<std::size_t>(t) * C : nullptr;
    if (e != nullptr && p != nullptr) {
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (e != nullptr) {
      for (int c = 0; c < C; ++c) o[c] = e[c];
    } else if (p != nullptr) {
      for (int c = 0; c < C; ++c) o[c] = p[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
    }
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, int v_begin, int v_end) {
  // Scatter into dwte: different rows may share a token, so split by columns, not rows.
  par_col_blocks("encoder_backward", C, [=](int c0, int c1) {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const std::size_t bt = static_cast<std::size_t>(b) * T + t;
        const float* d = dout + bt * C;
        const int tok = tokens[bt];
        if (tok >= v_begin && tok < v_end) {
          float* we = dwte + static_cast<std::size_t>(tok - v_begin) * C;
          for (int c = c0; c < c1; ++c) we[c] += d[c];
        }
        if (dwpe != nullptr) {
          float* wp = dwpe + static_cast<std::size_t>(t) * C;
          for (int c = c0; c < c1; ++c) wp[c] += d[c];
        }
      }
    }
  });
}

// ---- layer norm -----------------------------------------------------------------------------

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  par_rows("layernorm_forward", N, C, [=](std::size_t n) {
    const float* x = inp + n * C;
    float s = 0.0f;
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / C;
    float v = 0.0f;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / std::sqrt(v / C + kLayerNormEps);
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  });
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                              const float* mean, const float* rstd, int N, int C) {
  par_rows("layernorm_backward_input", N, C, [=](std::size_t n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float m = mean[n];
    const float r = rstd[n];
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float dnorm = d[c] * w[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * r;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    float* dx = dinp + n * C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      dx[c] += (d[c] * w[c] - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
  });
}

void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  par_col_blocks("layernorm_backward_weight", C, [=](int c0, int c1) {
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<std::size_t>(n) * C;
      const float* d = dout + static_cast<std::size_t>(n) * C;
      const float m = mean[n];
      const float r = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c] += d[c] * (x[c] - m) * r;
        db[c] += d[c];
      }
    }
  });
}

// ---- linear ---------------------------------------------------------------------------------

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                    int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    par_rows("matmul_bias", N, OC, [=](std::size_t n) {
      float* o = out + n * OC;
      for (int k = 0; k < OC; ++k) o[k] = bias[k];
    });
    beta = 1.0f;
  }
  gemm(false, true, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void matmul_backward_input(float* dinp, const float* dout, const float* w, int N, int C, int OC) {
  gemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
}

void matmul_backward_weight(float* dw, float* dbias, const float* dout, const float* inp, int N,
                            int C, int OC) {
  gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
  if (dbias != nullptr) {
    par_col_blocks("matmul_dbias", OC, [=](int k0, int k1) {
      for (int n = 0; n < N; ++n) {
        const float* d = dout + static_cast<std::size_t>(n) * OC;
        for (int k = k0; k < k1; ++k) dbias[k] += d[k];
      }
    });
  }
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  matmul_backward_input(dinp, dout, w, N, C, OC);
  matmul_backward_weight(dw, dbias, dout, inp, N, C, OC);
}

// The host's products are fp32: the packed operand widened into a buffer of the call's own.
void matmul_forward_packed(float* out, const std::uint16_t* inp, const float* w, const float* bias,
                           int N, int C, int OC) {
  std::vector<float> x(static_cast<std::size_t>(N) * C);
  unpack_bf16(x.data(), inp, x.size());
  matmul_forward(out, x.data(), w, bias, N, C, OC);
}

void matmul_backward_packed(float* dinp, float* dw, float* dbias, const float* dout,
                            const std::uint16_t* inp, const float* w, int N, int C, int OC) {
  std::vector<float> x(static_cast<std::size_t>(N) * C);
  unpack_bf16(x.data(), inp, x.size());
  if (dinp != nullptr) matmul_backward_input(dinp, dout, w, N, C, OC);
  matmul_backward_weight(dw, dbias, dout, x.data(), N, C, OC);
}

// ---- attention ------------------------------------------------------------------------------

namespace {

// Causal softmax of row i of a (T,T) score tile, in place; the upper triangle zeroed.
void causal_softmax_row(float* row, std::size_t i, std::size_t T) {
  float mx = row[0];
  for (std::size_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
  float s = 0.0f;
  for (std::size_t j = 0; j <= i; ++j) {
    row[j] = fast_exp(row[j] - mx);
    s += row[j];
  }
  const float inv = 1.0f / s;
  for (std::size_t j = 0; j <= i; ++j) row[j] *= inv;
  for (std::size_t j = i + 1; j < T; ++j) row[j] = 0.0f;
}

} // namespace

std::size_t attention_scratch_floats(int B, int T, int NH) {
  const auto pairs = static_cast<std::size_t>(B) * NH;
  return std::min(pairs, static_cast<std::size_t>(host_threads())) * T * T;
}

// The (b,h) pairs run in parallel, each on one thread with single-threaded products inside
// (the gemm blocks of a nested loop run on the calling thread).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  par_for("attention_forward", static_cast<std::size_t>(B) * NH, [=](std::size_t bh) {
    const auto b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * C3 + h * HS;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = att + bh * T * T;
    // scores (T,T) = q (T,HS) @ k^T * scale
    gemm(false, true, T, T, HS, scale, q, C3, k, C3, 0.0f, p, T);
    for (std::size_t i = 0; i < static_cast<std::size_t>(T); ++i)
      causal_softmax_row(p + i * T, i, T);
    gemm(false, false, T, HS, T, 1.0f, p, T, v, C3, 0.0f, out + b * T * C + h * HS, C);
  });
}

// scratch: attention_scratch_floats(B, T, NH) floats, one (T,T) tile per lane; lane l takes the
// pairs l, l + lanes, ...: which lane computes a pair never changes its result.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const auto pairs = static_cast<std::size_t>(B) * NH;
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  const std::size_t lanes = attention_scratch_floats(B, T, NH) / TT;
  par_for("attention_backward", lanes, [=](std::size_t lane) {
    float* ds = scratch + lane * TT; // (T,T): d probabilities, then d scores
    for (std::size_t bh = lane; bh < pairs; bh += lanes) {
      const auto b = bh / NH, h = bh % NH;
      const std::size_t qoff = b * T * C3 + h * HS;
      const float* q = qkv + qoff;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qoff;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* p = att + bh * TT;
      const float* dout_h = dout + b * T * C + h * HS;
      // dP (T,T) = dout_h (T,HS) @ v^T ;  dv = P^T @ dout_h
      gemm(false, true, T, T, HS, 1.0f, dout_h, C, v, C3, 0.0f, ds, T);
      gemm(true, false, T, HS, T, 1.0f, p, T, dout_h, C, 0.0f, dv, C3);
      // softmax backward, row by row: dS = P * (dP - sum_j P dP)
      for (std::size_t i = 0; i < static_cast<std::size_t>(T); ++i) {
        const float* prow = p + i * T;
        float* drow = ds + i * T;
        float dot = 0.0f;
        for (std::size_t j = 0; j <= i; ++j) dot += prow[j] * drow[j];
        for (std::size_t j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - dot);
        for (std::size_t j = i + 1; j < static_cast<std::size_t>(T); ++j) drow[j] = 0.0f;
      }
      // scores = scale * q k^T  =>  dq = scale dS @ k ; dk = scale dS^T @ q
      gemm(false, false, T, HS, T, scale, ds, T, k, C3, 0.0f, dq, C3);
      gemm(true, false, T, HS, T, scale, ds, T, q, C3, 0.0f, dk, C3);
    }
  });
}

// ---- elementwise ----------------------------------------------------------------------------

namespace {

float gelu(float x) {
  const float t = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

float gelu_grad(float x, float d) { // d gelu(x) / dx times d
  const float t = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return d * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

} // namespace

// The precision is chosen outside the loops: a choice inside keeps GCC from vectorizing them
// (scalar, GELU took 8 to 9 times as long on the benchmark model).
void gelu_forward(float* out, const float* inp, std::size_t n, bool bf16_in) {
  par_chunks("gelu_forward", n, [=](std::size_t i0, std::size_t i1) {
    if (bf16_in) {
      for (std::size_t i = i0; i < i1; ++i) out[i] = gelu(bf16::round(inp[i]));
    } else {
      for (std::size_t i = i0; i < i1; ++i) out[i] = gelu(inp[i]);
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, bool bf16_in) {
  par_chunks("gelu_backward", n, [=](std::size_t i0, std::size_t i1) {
    if (bf16_in) {
      for (std::size_t i = i0; i < i1; ++i) {
        dinp[i] = gelu_grad(bf16::round(inp[i]), bf16::round(dout[i]));
      }
    } else {
      for (std::size_t i = i0; i < i1; ++i) dinp[i] = gelu_grad(inp[i], dout[i]);
    }
  });
}

void gelu_forward_packed(std::uint16_t* out16, std::uint16_t* inp16, const float* inp,
                         std::size_t n) {
  par_chunks("gelu_forward_packed", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      inp16[i] = bf16::from_float(inp[i]);
      out16[i] = bf16::from_float(gelu(bf16::to_float(inp16[i])));
    }
  });
}

void gelu_backward_packed(float* dinp, const std::uint16_t* inp16, const float* dout,
                          std::size_t n) {
  par_chunks("gelu_backward_packed", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      dinp[i] = gelu_grad(bf16::to_float(inp16[i]), bf16::round(dout[i]));
    }
  });
}

void add(float* out, const float* a, const float* b, std::size_t n) {
  par_chunks("add", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void accumulate(float* acc, const float* x, std::size_t n) {
  par_chunks("accumulate", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) acc[i] += x[i];
  });
}

void residual_add(float* branch, const float* x, std::size_t n, bool bf16_branch) {
  par_chunks("residual_add", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      branch[i] = (bf16_branch ? bf16::round(branch[i]) : branch[i]) + x[i];
    }
  });
}

void zero(float* x, std::size_t n) {
  par_chunks("zero", n, [=](std::size_t i0, std::size_t i1) { std::fill(x + i0, x + i1, 0.0f); });
}

void scale(float* x, float s, std::size_t n) {
  par_chunks("scale", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

void round_bf16(float* x, std::size_t n) {
  par_chunks("round_bf16", n, [=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) x[i] = bf16::round(x[i]);
  });
}

void pack_bf16(std::uint16_t* out, const float* x, std::size_t n) {
  par_chunks("pack_bf16", n,
             [=](std::size_t i0, std::size_t i1) { bf16::pack(out + i0, x + i0, i1 - i0); });
}

void unpack_bf16(float* out, const std::uint16_t* x, std::size_t n) {
  par_chunks("unpack_bf16", n,
             [=](std::size_t i0, std::size_t i1) { bf16::unpack(out + i0, x + i0, i1 - i0); });
}

// Chunks summed in float, the chunks' sums added in double in chunk order: the same bits at any
// thread count.
double sum_squares(const float* x, std::size_t n) {
  double total = 0.0;
  sum_squares_each(&total, x, std::array<std::size_t, 1>{0}.data(), &n, 1);
  return total;
}

void sum_squares_each(double* out, const float* x, const std::size_t* offsets,
                      const std::size_t* sizes, int count) {
  const auto size_of = [=](int i) { return sizes[i]; };
  const std::vector<std::size_t> first = detail::chunk_starts(count, size_of);
  std::vector<float> part(first.back());
  float* sums = part.data();
  detail::par_chunks_each("sum_squares", first, size_of,
                          [=](std::size_t c, int i, std::size_t begin, std::size_t end) {
                            const float* xi = x + offsets[i];
                            float sum = 0.0f;
                            for (std::size_t j = begin; j < end; ++j) sum += xi[j] * xi[j];
                            sums[c] = sum;
                          });
  for (int i = 0; i < count; ++i) {
    double total = 0.0;
    for (std::size_t c = first[i]; c < first[i + 1]; ++c) total += part[c];
    out[i] = total;
  }
}

// ---- loss -----------------------------------------------------------------------------------

void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V, bool bf16_in) {
  par_rows("crossentropy_forward", N, V, [=](std::size_t n) {
    const float* z = logits + n * V;
    float* p = probs + n * V;
    const auto at = [&](int i) { return bf16_in ? bf16::round(z[i]) : z[i]; };
    const float z_target = at(targets[n]); // read before p may overwrite z (in-place use)
    float mx = at(0);
    for (int i = 1; i < V; ++i) mx = std::max(mx, at(i));
    float s = 0.0f;
    for (int i = 0; i < V; ++i) {
      p[i] = fast_exp(at(i) - mx);
      s += p[i];
    }
    const float inv = 1.0f / s;
    for (int i = 0; i < V; ++i) p[i] *= inv;
    // log-sum-exp form keeps precision when p[target] is tiny
    losses[n] = std::log(s) + mx - z_target;
  });
}

void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V, int v_begin) {
  par_rows("crossentropy_backward", N, V, [=](std::size_t n) {
    const float* p = probs + n * V;
    float* d = dlogits + n * V;
    for (int i = 0; i < V; ++i) d[i] = p[i] * dloss;
    const int t = targets[n] - v_begin;
    if (t >= 0 && t < V) d[t] -= dloss;
  });
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V,
                                   bool bf16_in) {
  crossentropy_forward(losses, dlogits, logits, targets, N, V, bf16_in);
  crossentropy_backward(dlogits, dlogits, targets, dloss, N, V, 0);
}

void row_max(float* mx, const float* x, int N, int V) {
  par_rows("row_max", N, V, [=](std::size_t n) {
    const float* z = x + n * V;
    float m = z[0];
    for (int i = 1; i < V; ++i) m = std::max(m, z[i]);
    mx[n] = m;
  });
}

void gather_target(float* z, const float* x, const int32_t* targets, int N, int V, int v_begin) {
  par_rows("gather_target", N, 1, [=](std::size_t n) {
    const int t = targets[n] - v_begin;
    z[n] = (t >= 0 && t < V) ? x[n * V + static_cast<std::size_t>(t)] : 0.0f;
  });
}

void softmax_exp(float* p, float* sum, const float* x, const float* mx, int N, int V) {
  par_rows("softmax_exp", N, V, [=](std::size_t n) {
    const float* z = x + n * V;
    float* q = p + n * V;
    float s = 0.0f;
    for (int i = 0; i < V; ++i) {
      q[i] = fast_exp(z[i] - mx[n]);
      s += q[i];
    }
    sum[n] = s;
  });
}

void crossentropy_finish(float* losses, float* p, const float* sum, const float* mx,
                         const float* z_target, int N, int V) {
  par_rows("crossentropy_finish", N, V, [=](std::size_t n) {
    float* q = p + n * V;
    const float inv = 1.0f / sum[n];
    for (int i = 0; i < V; ++i) q[i] *= inv;
    losses[n] = std::log(sum[n]) + mx[n] - z_target[n];
  });
}

// ---- optimizer ------------------------------------------------------------------------------

// Every segment's chunks in one parallel loop. Same operation order as torch.optim.AdamW (decay,
// moments, bias-corrected step).
void adamw_update(float* param, float* m, float* v, const float* grad, const AdamWSegment* segments,
                  int count, const AdamWStep& s) {
  const auto size_of = [=](int k) { return segments[k].size; };
  const float step_size = static_cast<float>(s.lr / (1.0 - s.beta1_t));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - s.beta2_t));
  detail::par_chunks_each("adamw_update", detail::chunk_starts(count, size_of), size_of,
                          [=](std::size_t, int k, std::size_t begin, std::size_t end) {
                            const AdamWSegment& g = segments[k];
                            const float decay = g.decay ? 1.0f - s.lr * s.weight_decay : 1.0f;
                            float* p = param + g.param_offset;
                            float* mk = m + g.state_offset;
                            float* vk = v + g.state_offset;
                            const float* gk = grad + g.state_offset;
                            for (std::size_t i = begin; i < end; ++i) {
                              const float gi = gk[i] * s.grad_scale;
                              float pi = p[i] * decay;
                              const float mi = mk[i] + (1.0f - s.beta1) * (gi - mk[i]);
                              const float vi = s.beta2 * vk[i] + (1.0f - s.beta2) * gi * gi;
                              pi -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + s.eps);
                              p[i] = pi;
                              mk[i] = mi;
                              vk[i] = vi;
                            }
                          });
}

} // namespace pt::ops
