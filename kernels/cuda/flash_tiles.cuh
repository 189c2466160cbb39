// The tile primitives of flash_attention.cu (its header comment describes the arrangement):
// the mma.sync and ldmatrix wrappers, cp.async staging of row tiles, quad reductions, the
// products of a warp's 16 rows against a staged tile, and a block's (sequence, head) addressing.
// Included by flash_attention.cu only.
#pragma once

#include <cstdint>

#include "cuda/flash_attention.hpp"

namespace pt::cuda_ops::flash {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kTile = 64;     // rows of a block, and of the tiles it walks
constexpr int kThreads = 128; // 4 warps x 16 rows
constexpr int kPad = 8;       // bf16 padding per shared row: the fragment loads hit 32 banks
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t word(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a b on one 16x8 tile with k = 16: a row-major 16x16, b column-major 16x8.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap(); // takes() refuses such devices
#endif
}

// The A operand (16x16) whose row 0, column 0 is at x, in a row-major array of ld elements a row.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* x, int ld) {
  const int lane = threadIdx.x % 32;
  const bf16* p = x + (lane / 4) * ld + 2 * (lane % 4);
  a[0] = word(p);
  a[1] = word(p + 8 * ld);
  a[2] = word(p + 8);
  a[3] = word(p + 8 * ld + 8);
}

// The B operand (16x8) whose element (k, n) is y[n * ld + k]: B's columns are y's rows.
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* y, int ld) {
  const int lane = threadIdx.x % 32;
  const bf16* p = y + (lane / 4) * ld + 2 * (lane % 4);
  b0 = word(p);
  b1 = word(p + 8);
}

// load_rows without waiting: cp.async copies of 16 bytes, which land while the block computes on
// the other stage; rows from T on are filled with zeros (a source size of 0). fetch_commit()
// closes the group of copies a thread started, fetch_wait<N>() waits until at most N of its
// groups are still under way (then a __syncthreads() shows every thread's copies to all).
template <int HS> __device__ void fetch_rows(bf16* dst, const bf16* src, int ld, int row0, int T) {
  constexpr int kPieces = HS / 8;
  for (int i = threadIdx.x; i < kTile * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    const bool in = row0 + r < T;
    const bf16* from = src + std::size_t(in ? row0 + r : 0) * ld + c; // a valid address always
    const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * (HS + kPad) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void fetch_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void fetch_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The B operand (16x8) whose element (k, n) is x[k * ld + n] (B stored row by row, as the tiles
// of v, q, k and dout are for the products that sum over their rows): ldmatrix with .trans
// hands each thread the transposed pairs. Threads 0-7 name rows 0-7, threads 8-15 rows 8-15;
// rows start 16-byte aligned (n a multiple of 8, and rows of HS + kPad elements).
__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const bf16* x, int ld) {
  const int lane = threadIdx.x % 32;
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(x + (lane % 16) * ld));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(at));
}

// A from four accumulator tiles' worth of values: x[j] and x[j + 1] are the 16x8 tiles of
// columns 16c..16c+7 and 16c+8..16c+15 (j = 2c).
__device__ __forceinline__ void as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// Rows row0..row0+63 (columns 0..HS-1) of a bf16 matrix with ld elements a row and T rows, into
// dst[64][HS + kPad]; rows from T on are zero.
template <int HS> __device__ void load_rows(bf16* dst, const bf16* src, int ld, int row0, int T) {
  constexpr int kPieces = HS / 8; // 16 bytes each
  for (int i = threadIdx.x; i < kTile * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) v = *reinterpret_cast<const uint4*>(src + std::size_t(row0 + r) * ld + c);
    *reinterpret_cast<uint4*>(dst + r * (HS + kPad) + c) = v;
  }
}

// The sum over the 4 threads of a quad (the threads holding one row of a tile).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// The warp's 16 rows of a staged tile (rows HS + kPad apart from `rows`) as A operands, one per
// 16 columns.
template <int HS>
__device__ __forceinline__ void rows_as_a(uint32_t (&a)[HS / 16][4], const bf16* rows) {
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) load_a(a[kc], rows + kc * 16, HS + kPad);
}

// acc[n] += a times the staged tile's rows 8n..8n+7, transposed (a sum over HS): the warp's 16
// rows against the tile's 64 (q k^T, dout v^T, and the backward's k q^T, v dout^T).
template <int HS>
__device__ __forceinline__ void times_rows(float (&acc)[8][4], const uint32_t (&a)[HS / 16][4],
                                           const bf16* tile) {
#pragma unroll
  for (int kc = 0; kc < HS / 16; ++kc) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      uint32_t b0, b1;
      load_b(b0, b1, tile + n * 8 * (HS + kPad) + kc * 16, HS + kPad);
      mma(acc[n], a[kc], b0, b1);
    }
  }
}

// acc += x times the staged tile (a sum over its 64 rows): x a 16 x 64 accumulator tile, packed
// to bf16 in registers (P v, P^T dout, dS^T q, dS k).
template <int HS>
__device__ __forceinline__ void times_tile(float (&acc)[HS / 8][4], const float (&x)[8][4],
                                           const bf16* tile) {
#pragma unroll
  for (int kc = 0; kc < kTile / 16; ++kc) {
    uint32_t xa[4];
    as_a(xa, x[2 * kc], x[2 * kc + 1]);
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      uint32_t b0, b1;
      load_b_trans(b0, b1, tile + kc * 16 * (HS + kPad) + nd * 8, HS + kPad);
      mma(acc[nd], xa, b0, b1);
    }
  }
}

// A block's head and its thread's place: blockIdx.y = b * NH + h picks the sequence b and head
// h, whose queries, keys and values start at q, k and v in the packed [B, T, 3C] qkv (rows C3
// apart); lane and warp place the thread, g (lane / 4) and t (lane % 4) in its MMA fragments.
template <int HS> struct BlockHead {
  int lane, warp, g, t, b, h, C, C3;
  const bf16 *q, *k, *v;
  __device__ BlockHead(const bf16* qkv, int T, int NH)
      : lane(threadIdx.x % 32), warp(threadIdx.x / 32), g(lane / 4), t(lane % 4),
        b(blockIdx.y / NH), h(blockIdx.y % NH), C(NH * HS), C3(3 * C),
        q(qkv + std::size_t(b) * T * C3 + h * HS), k(q + C), v(q + 2 * C) {}
  // The head's columns of a [B, T, C] tensor (rows C apart): the output's gradient.
  __device__ const bf16* of(const bf16* x, int T) const {
    return x + std::size_t(b) * T * C + h * HS;
  }
};

} // namespace
} // namespace pt::cuda_ops::flash
