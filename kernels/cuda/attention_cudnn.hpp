// Causal self-attention through cuDNN's fused scaled-dot-product attention (the "flash"
// engines of cuDNN 9, reached through the cudnn-frontend graph API): device.attention = "cudnn"
// at precision bf16 (docs/cuda.md). bf16 inputs and outputs, fp32 softmax statistics and
// accumulation; q, k and v are read as strided views of the packed qkv, and the gradients are
// written into a packed dqkv the same way. One forward and one backward graph per shape, built
// at the first call and kept. Built where the build found cuDNN and the cudnn-frontend headers
// (tools/setup-cudnn-frontend); compiled() says whether it was.
//
// B = batch, T = sequence, C = channels, NH = heads, HS = C / NH. Layouts (row-major):
// qkv16 (B, T, 3C) bf16: q, k, v side by side, heads contiguous inside each; o16 (B, T, C) bf16;
// stats (B, NH, T) fp32: each score row's log-sum-exp (natural log), which the backward reads.
#pragma once

#include <cstddef>

namespace pt::cuda_ops::cudnn_attention {

// Whether this build has cuDNN's attention (cuDNN and the cudnn-frontend headers were found).
bool compiled();

// Whether cuDNN has both graphs for this shape on this GPU: builds them (once per shape; the
// graphs are kept for the calls). False where it has none or the build has no cuDNN.
bool supports(int B, int T, int C, int NH, void* stream);

// o16 and stats from qkv16 (all device memory, on `stream`, a cudaStream_t).
void forward(void* o16, float* stats, const void* qkv16, int B, int T, int C, int NH, void* stream);

// dqkv16 (B, T, 3C) bf16 written: the gradients of q, k and v, from the forward's qkv16, o16 and
// stats and the output's gradient dout16 (B, T, C) bf16. Deterministic (cuDNN's deterministic
// backward: no atomics across key blocks).
void backward(void* dqkv16, const void* qkv16, const void* o16, const void* dout16,
              const float* stats, int B, int T, int C, int NH, void* stream);

// Releases the graphs, the workspace and the cuDNN handle (at the backend's end).
void finalize();

} // namespace pt::cuda_ops::cudnn_attention
