// The kernels of flash_attention.hpp. A block of 4 warps takes one (sequence, head) and one
// tile of 64 rows; each warp owns 16 of them and walks the other side's tiles of 64, which the
// block stages in shared memory, two stages deep: the next tile arrives by cp.async while the
// block computes on this one. Operands that sum over a tile's rows are read with ldmatrix
// .trans, so no tile is stored transposed. Products are mma.sync.m16n8k16 (bf16 in, fp32
// accumulation): a thread holds, of a 16x8 fp32 tile, rows g and g+8 (g = lane / 4) at columns 2t
// and 2t+1 (t = lane % 4), and those four values of two neighbouring tiles are, packed to bf16,
// exactly the thread's part of a 16x16 A operand. So a tile of probabilities goes from one product
// into the next without leaving registers (the FlashAttention-2 arrangement).
//
// Forward, per query tile: S = q k^T, running row maximum m and sum l, O = O * exp(m_old - m) +
// P v; at the end O / l and the row's log-sum-exp. Backward, with D_i = sum_d dO_id O_id (equal
// to sum_j P_ij dP_ij): one kernel per key tile for dk, dv (P^T and dS^T = P^T (dP^T - D) against
// every query tile at or after it), one per query tile for dq (dS against every key tile at or
// before it). Each gradient is written once by one thread: no atomics, the same bits every run.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/flash_attention.hpp"
#include "cuda/flash_tiles.cuh"

namespace pt::cuda_ops::flash {
namespace {

// The forward's end: a thread's rows q0 and q0 + 8 of the output (o / l, fp32 and bf16) and
// their log-sum-exps (base 2) from the running maxima m and sums l.
template <int HS>
__device__ __forceinline__ void
write_rows(float* out, bf16* out16, float* lse, const float (&o)[HS / 8][4], const float (&m)[2],
           const float (&l)[2], int q0, int b, int h, int t, int T, int C) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = q0 + 8 * r;
    const float sum = quad_sum(l[r]);
    if (qi >= T) continue;
    const float inv = 1.0f / sum;
    const std::size_t at = (std::size_t(b) * T + qi) * C + h * HS + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      const float x0 = o[nd][2 * r] * inv, x1 = o[nd][2 * r + 1] * inv;
      *reinterpret_cast<float2*>(out + at + nd * 8) = make_float2(x0, x1);
      *reinterpret_cast<__nv_bfloat162*>(out16 + at + nd * 8) = __floats2bfloat162_rn(x0, x1);
    }
    if (t == 0) lse[std::size_t(blockIdx.y) * T + qi] = m[r] + log2f(sum);
  }
}

// grid (T tiles, B*NH); scale2 = log2(e) / sqrt(HS): scores in base-2 units.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    forward_k(float* out, float* lse, bf16* out16, const bf16* qkv, int T, int NH, float scale2) {
  extern __shared__ uint4 smem[];
  // two stages of a key tile and a value tile, [64][HS + kPad] each: the next pair arrives
  // while the block works on this one (the queries pass through stage 0 first)
  constexpr int kRows = kTile * (HS + kPad);
  bf16* const stage = reinterpret_cast<bf16*>(smem);
  const auto [lane, warp, g, t, b, h, C, C3, q, k, v] = BlockHead<HS>(qkv, T, NH);
  const int qt = gridDim.x - 1 - blockIdx.x; // the longest rows first
  const int row0 = qt * kTile + warp * 16;   // query of the warp's row 0

  load_rows<HS>(stage, q, C3, qt * kTile, T);
  __syncthreads();
  uint32_t qa[HS / 16][4];
  rows_as_a<HS>(qa, stage + warp * 16 * (HS + kPad));
  __syncthreads(); // stage 0 is refilled next
  fetch_rows<HS>(stage, k, C3, 0, T);
  fetch_rows<HS>(stage + kRows, v, C3, 0, T);
  fetch_commit();

  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // rows g and g + 8
  for (int kt = 0; kt <= qt; ++kt) {
    const bf16* ks = stage + (kt % 2) * 2 * kRows;
    const bf16* vs = ks + kRows;
    if (kt < qt) { // the next pair, into the stage the last iteration used
      bf16* next = stage + ((kt + 1) % 2) * 2 * kRows;
      fetch_rows<HS>(next, k, C3, (kt + 1) * kTile, T);
      fetch_rows<HS>(next + kRows, v, C3, (kt + 1) * kTile, T);
    }
    fetch_commit(); // (an empty group after the last tile)
    fetch_wait<1>();
    __syncthreads();
    float s[8][4] = {};
    times_rows<HS>(s, qa, ks);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = row0 + g + 8 * (e / 2), kj = kt * kTile + n * 8 + 2 * t + e % 2;
        const float x = (kj <= qi && kj < T) ? s[n][e] * scale2 : -INFINITY;
        s[n][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // every row sees key kt*64 <= its query, so the maximum is finite from the first tile on
      mx[r] = quad_max(mx[r]);
      alpha[r] = exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - m[e / 2]);
        s[n][e] = p;
        l[e / 2] += p;
      }
    }
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nd][e] *= alpha[e / 2];
    }
    times_tile<HS>(o, s, vs);
    __syncthreads(); // every warp is done with this stage before it is refilled
  }
  write_rows<HS>(out, out16, lse, o, m, l, row0 + g, b, h, t, T, C);
}

// rowdot[(b*NH + h)*T + i] = sum_d dout[b, i, h*HS + d] out[b, i, h*HS + d]: a warp per row.
__global__ void rowdot_k(float* rowdot, const float* dout, const bf16* out16, int B, int T, int NH,
                         int HS) {
  const std::size_t w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= std::size_t(B) * T * NH) return;
  const std::size_t row = w / NH; // b*T + i
  const int h = static_cast<int>(w % NH);
  const std::size_t at = row * NH * HS + std::size_t(h) * HS;
  float s = 0.0f;
  for (int d = lane; d < HS; d += 32) s += dout[at + d] * __bfloat162float(out16[at + d]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const std::size_t b = row / T, i = row % T;
  if (lane == 0) rowdot[(b * NH + h) * T + i] = s;
}

// The key/value backward's end: a thread's key rows k0 and k0 + 8 of dK (times scale) and dV
// into the packed gradient dqkv [B, T, 3C].
template <int HS>
__device__ __forceinline__ void write_dkv(float* dqkv, const float (&dk)[HS / 8][4],
                                          const float (&dv)[HS / 8][4], int k0, int b, int h, int t,
                                          int T, int C, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = k0 + 8 * r;
    if (kj >= T) continue;
    float* dkr = dqkv + (std::size_t(b) * T + kj) * 3 * C + C + h * HS + 2 * t;
    float* dvr = dkr + C;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      *reinterpret_cast<float2*>(dkr + nd * 8) =
          make_float2(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
      *reinterpret_cast<float2*>(dvr + nd * 8) = make_float2(dv[nd][2 * r], dv[nd][2 * r + 1]);
    }
  }
}

// grid (T tiles, B*NH): key tile blockIdx.x against the query tiles from it to the end.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    backward_kv_k(float* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                  const float* rowdot, int T, int NH, float scale2, float scale) {
  extern __shared__ uint4 smem[];
  // two stages of a query tile and its dout tile, [64][HS + kPad] each (the keys and values
  // pass through stage 0 first), then the tile's log-sum-exps and D, [64] each
  constexpr int kRows = kTile * (HS + kPad);
  bf16* const stage = reinterpret_cast<bf16*>(smem);
  float* lse_s = reinterpret_cast<float*>(stage + 4 * kRows);
  float* rd_s = lse_s + kTile;
  const BlockHead<HS> head(qkv, T, NH);
  const auto [lane, warp, g, t, b, h, C, C3, q, k, v] = head;
  const int kt = blockIdx.x; // the longest first: key tile 0 meets every query tile
  const bf16* dy = head.of(dout, T);
  const float* lse_bh = lse + std::size_t(blockIdx.y) * T;
  const float* rd_bh = rowdot + std::size_t(blockIdx.y) * T;
  const int key0 = kt * kTile + warp * 16; // key of the warp's row 0

  load_rows<HS>(stage, k, C3, kt * kTile, T);
  load_rows<HS>(stage + kRows, v, C3, kt * kTile, T);
  __syncthreads();
  uint32_t ka[HS / 16][4], va[HS / 16][4];
  rows_as_a<HS>(ka, stage + warp * 16 * (HS + kPad));
  rows_as_a<HS>(va, stage + kRows + warp * 16 * (HS + kPad));
  __syncthreads(); // stage 0 is refilled next
  fetch_rows<HS>(stage, q, C3, kt * kTile, T);
  fetch_rows<HS>(stage + kRows, dy, C, kt * kTile, T);
  fetch_commit();
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const int tiles = static_cast<int>(gridDim.x);
  for (int qt = kt; qt < tiles; ++qt) {
    const bf16* qs = stage + ((qt - kt) % 2) * 2 * kRows;
    const bf16* dos = qs + kRows;
    if (qt + 1 < tiles) { // the next pair, into the stage the last iteration used
      bf16* next = stage + ((qt + 1 - kt) % 2) * 2 * kRows;
      fetch_rows<HS>(next, q, C3, (qt + 1) * kTile, T);
      fetch_rows<HS>(next + kRows, dy, C, (qt + 1) * kTile, T);
    }
    fetch_commit();

    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const int qi = qt * kTile + i;
      lse_s[i] = qi < T ? lse_bh[qi] : 0.0f;
      rd_s[i] = qi < T ? rd_bh[qi] : 0.0f;
    }
    fetch_wait<1>();
    __syncthreads();
    float pt[8][4] = {}, dst[8][4] = {}; // P^T, then dP^T and dS^T: keys x queries
    times_rows<HS>(pt, ka, qs);
    times_rows<HS>(dst, va, dos);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kj = key0 + g + 8 * (e / 2), c = n * 8 + 2 * t + e % 2, qi = qt * kTile + c;
        const float p = (kj <= qi && qi < T) ? exp2f(pt[n][e] * scale2 - lse_s[c]) : 0.0f;
        pt[n][e] = p;
        dst[n][e] = p * (dst[n][e] - rd_s[c]);
      }
    }
    times_tile<HS>(dv, pt, dos); // over the tile's 64 queries
    times_tile<HS>(dk, dst, qs);
    __syncthreads(); // every warp is done with this stage (and lse_s, rd_s) before the refill
  }
  write_dkv<HS>(dqkv, dk, dv, key0 + g, b, h, t, T, C, scale);
}

// grid (T tiles, B*NH): query tile against the key tiles up to it.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    backward_q_k(float* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                 const float* rowdot, int T, int NH, float scale2, float scale) {
  extern __shared__ uint4 smem[];
  // two stages of a key tile and a value tile, [64][HS + kPad] each (the queries and their
  // dout pass through stage 0 first)
  constexpr int kRows = kTile * (HS + kPad);
  bf16* const stage = reinterpret_cast<bf16*>(smem);

  const BlockHead<HS> head(qkv, T, NH);
  const auto [lane, warp, g, t, b, h, C, C3, q, k, v] = head;
  const int qt = gridDim.x - 1 - blockIdx.x;
  const bf16* dy = head.of(dout, T);
  const int row0 = qt * kTile + warp * 16;
  float rl[2], rd[2]; // the rows' log-sum-exp and D
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = row0 + g + 8 * r;
    rl[r] = qi < T ? lse[std::size_t(blockIdx.y) * T + qi] : 0.0f;
    rd[r] = qi < T ? rowdot[std::size_t(blockIdx.y) * T + qi] : 0.0f;
  }

  load_rows<HS>(stage, q, C3, qt * kTile, T);
  load_rows<HS>(stage + kRows, dy, C, qt * kTile, T);
  __syncthreads();
  uint32_t qa[HS / 16][4], da_in[HS / 16][4];
  rows_as_a<HS>(qa, stage + warp * 16 * (HS + kPad));
  rows_as_a<HS>(da_in, stage + kRows + warp * 16 * (HS + kPad));
  __syncthreads(); // stage 0 is refilled next
  fetch_rows<HS>(stage, k, C3, 0, T);
  fetch_rows<HS>(stage + kRows, v, C3, 0, T);
  fetch_commit();
  float dq[HS / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const bf16* ks = stage + (kt % 2) * 2 * kRows;
    const bf16* vs = ks + kRows;
    if (kt < qt) { // the next pair, into the stage the last iteration used
      bf16* next = stage + ((kt + 1) % 2) * 2 * kRows;
      fetch_rows<HS>(next, k, C3, (kt + 1) * kTile, T);
      fetch_rows<HS>(next + kRows, v, C3, (kt + 1) * kTile, T);
    }
    fetch_commit();
    fetch_wait<1>();
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    times_rows<HS>(s, qa, ks);
    times_rows<HS>(dp, da_in, vs);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = row0 + g + 8 * (e / 2), kj = kt * kTile + n * 8 + 2 * t + e % 2;
        const float p = (kj <= qi && kj < T) ? exp2f(s[n][e] * scale2 - rl[e / 2]) : 0.0f;
        dp[n][e] = p * (dp[n][e] - rd[e / 2]);
      }
    }
    times_tile<HS>(dq, dp, ks); // over the tile's 64 keys
    __syncthreads();            // every warp is done with this stage before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = row0 + g + 8 * r;
    if (qi >= T) continue;
    float* dqr = dqkv + (std::size_t(b) * T + qi) * C3 + h * HS + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      *reinterpret_cast<float2*>(dqr + nd * 8) =
          make_float2(dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale);
    }
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
  }
}

// Launches kernel with `shared` bytes of dynamic shared memory (above 48 KiB it must ask).
template <class K, class... Args>
void launch(K kernel, dim3 grid, std::size_t shared, cudaStream_t stream, const char* what,
            Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared)),
        what);
  kernel<<<grid, kThreads, shared, stream>>>(args...);
  check(cudaGetLastError(), what);
}

constexpr std::size_t rows_bytes(int HS) {
  return std::size_t(kTile) * (HS + kPad) * sizeof(bf16);
}

dim3 grid_of(int B, int T, int NH) {
  return dim3(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
}

float scale_of(int HS) {
  return 1.0f / std::sqrt(static_cast<float>(HS));
}

// Byte offsets in att of what the forward keeps: log-sum-exps at 0, then out and qkv in bf16
// (qkv while it fits).
struct Kept {
  std::size_t out16 = 0, qkv16 = 0, end = 0;
  Kept(int B, int T, int C, int NH) {
    auto up16 = [](std::size_t x) { return (x + 15) / 16 * 16; };
    const std::size_t rows = std::size_t(B) * T;
    out16 = up16(rows * NH * sizeof(float));
    qkv16 = up16(out16 + rows * C * sizeof(bf16));
    end = qkv16 + rows * 3 * C * sizeof(bf16);
  }
};

template <class P> P* at_byte(const float* att, std::size_t offset) {
  return reinterpret_cast<P*>(reinterpret_cast<std::uintptr_t>(att) + offset);
}

std::size_t att_bytes(int B, int T, int NH) {
  return std::size_t(B) * NH * T * T * sizeof(float);
}

template <int HS>
void forward_hs(float* out, float* att, const bf16* qkv, int B, int T, int NH,
                cudaStream_t stream) {
  const Kept kept(B, T, NH * HS, NH);
  launch(forward_k<HS>, grid_of(B, T, NH), 4 * rows_bytes(HS), stream, "flash attention forward",
         out, att, at_byte<bf16>(att, kept.out16), qkv, T, NH, scale_of(HS) * kLog2e);
}

template <int HS>
void backward_hs(float* dqkv, const bf16* dout16, const bf16* qkv, const float* att,
                 const float* rowdot, int B, int T, int NH, cudaStream_t stream) {
  const float scale = scale_of(HS), scale2 = scale * kLog2e;
  launch(backward_kv_k<HS>, grid_of(B, T, NH), 4 * rows_bytes(HS) + 2 * kTile * sizeof(float),
         stream, "flash attention backward dk dv", dqkv, qkv, dout16, att, rowdot, T, NH, scale2,
         scale);
  launch(backward_q_k<HS>, grid_of(B, T, NH), 4 * rows_bytes(HS), stream,
         "flash attention backward dq", dqkv, qkv, dout16, att, rowdot, T, NH, scale2, scale);
}

} // namespace

bool takes(int B, int T, int C, int NH) {
  if (B <= 0 || NH <= 0 || T <= 0 || C % NH != 0) return false;
  const int HS = C / NH;
  // 128 would need 256 registers a thread for the dk, dv kernel's tiles (it would spill)
  if (HS != 32 && HS != 64) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8) {
    return false;
  }
  return Kept(B, T, C, NH).qkv16 <= att_bytes(B, T, NH); // log-sum-exps and out fit
}

std::size_t kept_bytes(int B, int T, int C, int NH) {
  const Kept kept(B, T, C, NH);
  return kept.end <= att_bytes(B, T, NH) ? kept.end : kept.qkv16;
}

bool keeps_qkv(int B, int T, int C, int NH) {
  return Kept(B, T, C, NH).end <= att_bytes(B, T, NH);
}

const bf16* qkv_copy(const float* att, int B, int T, int C, int NH) {
  if (!keeps_qkv(B, T, C, NH)) return nullptr;
  return at_byte<const bf16>(att, Kept(B, T, C, NH).qkv16);
}

bf16* qkv_copy(float* att, int B, int T, int C, int NH) {
  return const_cast<bf16*>(qkv_copy(static_cast<const float*>(att), B, T, C, NH));
}

void forward(float* out, float* att, const bf16* qkv, int B, int T, int C, int NH,
             cudaStream_t stream) {
  switch (C / NH) {
  case 32:
    forward_hs<32>(out, att, qkv, B, T, NH, stream);
    break;
  case 64:
    forward_hs<64>(out, att, qkv, B, T, NH, stream);
    break;
  default:
    throw std::runtime_error("flash attention: head size " + std::to_string(C / NH));
  }
}

void backward(float* dqkv, float* rowdot, const float* dout, const bf16* dout16, const bf16* qkv,
              const float* att, int B, int T, int C, int NH, cudaStream_t stream) {
  const int HS = C / NH;
  const bf16* out16 = at_byte<const bf16>(att, Kept(B, T, C, NH).out16);
  const std::size_t rows = std::size_t(B) * T * NH;
  rowdot_k<<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, stream>>>(rowdot, dout, out16,
                                                                               B, T, NH, HS);
  check(cudaGetLastError(), "flash attention backward row sums");
  switch (HS) {
  case 32:
    backward_hs<32>(dqkv, dout16, qkv, att, rowdot, B, T, NH, stream);
    break;
  case 64:
    backward_hs<64>(dqkv, dout16, qkv, att, rowdot, B, T, NH, stream);
    break;
  default:
    throw std::runtime_error("flash attention: head size " + std::to_string(HS));
  }
}

} // namespace pt::cuda_ops::flash
