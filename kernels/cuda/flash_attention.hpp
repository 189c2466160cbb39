// Causal self-attention at precision bf16 without the (T, T) matrices in memory: the tiled
// scheme of FlashAttention-2 (Dao, 2023). Scores, softmax and both products of a tile of 64
// queries x 64 keys stay in registers (mma.sync on bf16, fp32 accumulation), the softmax runs
// online over the key tiles, and the backward recomputes each tile's probabilities from the
// row's log-sum-exp instead of reading them. Used by attention_forward/backward of
// ops_cuda.cu at precision bf16 when takes() says the shape fits (docs/cuda.md).
//
// B = batch, T = sequence, C = channels, NH = heads, HS = C / NH = head size.
// qkv (B, T, 3C) holds q, k, v of every head side by side, as the host backend's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pt::cuda_ops::flash {

// Whether these kernels take the shape on the current device: HS 32 or 64, a device of compute
// capability 8.0 or later (bf16 mma), and an att buffer of B*NH*T*T floats (the ops' contract)
// large enough for what the forward keeps for the backward: 16-byte aligned one after the
// other, the base-2 log-sum-exp of every score row (B*NH*T floats), the output in bf16 (B*T*C)
// and, where it fits too (T > 2 HS), qkv in bf16 (B*T*3C).
bool takes(int B, int T, int C, int NH);

// Bytes of att that the forward fills (a prefix of the B*NH*T*T floats of the contract).
std::size_t kept_bytes(int B, int T, int C, int NH);

// Whether att keeps a bf16 copy of qkv (B, T, 3C) at this shape, and where (qkv_copy; nullptr
// where it does not fit). The
// caller writes it before the forward, and the backward reads q, k and v from it instead of
// converting qkv again (the ops' contract has the backward run on the qkv its forward saw).
bool keeps_qkv(int B, int T, int C, int NH);
__nv_bfloat16* qkv_copy(float* att, int B, int T, int C, int NH);
const __nv_bfloat16* qkv_copy(const float* att, int B, int T, int C, int NH);

// out (B, T, C) fp32 = causal softmax(q k^T / sqrt(HS)) v per head, from qkv in bf16 (at
// qkv_copy(att), or elsewhere); fills what att keeps.
void forward(float* out, float* att, const __nv_bfloat16* qkv, int B, int T, int C, int NH,
             cudaStream_t stream);

// Writes dqkv (B, T, 3C) fp32, the gradient of every q, k, v, from dout (B, T, C) in fp32 and in
// bf16, qkv in bf16 and what the forward kept in att. rowdot: scratch of B*NH*T floats.
void backward(float* dqkv, float* rowdot, const float* dout, const __nv_bfloat16* dout16,
              const __nv_bfloat16* qkv, const float* att, int B, int T, int C, int NH,
              cudaStream_t stream);

} // namespace pt::cuda_ops::flash
