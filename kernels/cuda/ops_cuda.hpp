// The CUDA backend of kernels/ops.hpp: the same functions, with the same shapes and the same
// "accumulates unless it says writes" rule, on device pointers. Every call is queued on one
// stream of the device chosen by init() and returns without waiting, except sum_squares and
// sum_squares_each (they return numbers) and synchronize(). Matrix products go through cuBLAS in
// fp32, TF32 or bf16 (set_precision). Errors throw std::runtime_error naming the call.
//
// Differences from the host backend, all within the parity tolerances (docs/cuda.md):
// - sums of many terms (column sums, gradient scatters) run in parallel with atomics, so their
//   order, and the last bits, change from run to run;
// - attention_backward ignores its scratch argument and uses device scratch of its own (it
//   works on all heads of a sequence at once: NH*T*T values, fp32 or bf16);
// - the att buffer holds the backend's own format: fp32 probabilities at fp32 and tf32, bf16
//   ones at bf16, and, in the flash kernels (bf16, head size 32 or 64), row statistics and
//   bf16 copies of the output and of qkv (kernels/cuda/flash_attention.hpp);
// - exp, log and tanh are CUDA's single-precision functions, not the host's fast_math ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops.hpp"

namespace pt::cuda_ops {

// ---- backend control ------------------------------------------------------------------------
// Selects the device, creates the stream and the cuBLAS handle (once per process).
void init(int device);
// Releases the stream, the handle and the scratch (before the process ends, if at all).
void finalize();
// Waits for everything queued; throws if a kernel failed.
void synchronize();
// Matrix products, on fp32 tensors throughout: "fp32" exact fp32; "tf32" tensor cores with
// TF32-rounded inputs (about 1e-3 relative); "bf16" tensor cores on bf16 copies of the inputs
// (about 4e-3 relative, 2^-8), fp32 accumulation and results; attention then keeps its
// probabilities in bf16 in the att buffer, or, in the flash kernels, only row statistics and a
// bf16 copy of its output (see ops_cuda.cu). Throws on other names.
void set_precision(const std::string& precision);
void set_tf32(bool on); // set_precision("tf32") or ("fp32")
// device.attention at precision bf16: "auto" (cuDNN's fused attention where the build has it
// and cuDNN takes the shape, else the flash kernels where they take it, else cuBLAS), "cudnn"
// (throws where the build has none; attention calls throw where cuDNN does not take the shape),
// "flash" (attention calls throw where the kernels do not take the shape), "gemm" (cuBLAS).
void set_attention(const std::string& kind);
// Rate of a 4096^3 matrix product at the current precision (FLOP/s), timed for `seconds`; at
// bf16 on bf16 inputs (the product the ops run once their operands are converted).
double measure_gemm_flops(double seconds);
// The cudaStream_t every call uses (as void*, so that callers need no CUDA headers).
void* stream();
const char* blas_name(); // "cublas"
// How many forward products so far added their bias in cuBLASLt's epilogue (precision bf16; the
// others broadcast it first). For tests and diagnostics.
long bias_epilogue_products();
// How many attention calls (forward or backward) took the flash kernels (precision bf16, shapes
// of flash_attention.hpp); the others ran the cuBLAS path. For tests and diagnostics.
long flash_attention_calls();

// Stream markers (CUDA events, made as needed and kept): mark() records the next one and returns
// its number; seconds() reads two of them after synchronize(); restart_marks() numbers the next
// one 0 again (a recorded marker keeps its time until its number is recorded again).
int mark();
double seconds(int from, int to);
void restart_marks();

// Floats the att buffer of attention_forward needs at the current precision: B*NH*T*T, or,
// where the flash kernels take the shape, what they keep (row statistics and bf16 copies).
std::size_t attention_floats(int B, int T, int C, int NH);
// Whether the att buffer keeps its own bf16 copy of qkv for the backward (cuDNN's attention, and
// the flash kernels where it fits): attention_backward then does not read its qkv argument.
bool attention_keeps_qkv(int B, int T, int C, int NH);
// precision bf16: every product and attention call converts its fp32 inputs to bf16 (Backend)
bool bf16_products();

// ---- the ops of kernels/ops.hpp on device memory ---------------------------------------------
using pt::ops::AdamWSegment;
using pt::ops::AdamWStep;
#include "ops_list.inc"

// ---- device memory (for tests and the engine) -----------------------------------------------
void* alloc(std::size_t bytes);        // cudaMalloc; throws when out of memory
void* alloc_zeroed(std::size_t bytes); // cudaMalloc, zeroed (the backend's buffers)
void release(void* p);                 // for alloc and alloc_zeroed
// dst = src, bytes, queued on the stream (device or host memory; a host buffer is safe to reuse,
// or to read, after synchronize()).
void copy(void* dst, const void* src, std::size_t bytes);
void to_device(void* dst, const void* src, std::size_t bytes); // on the stream, then waits
void to_host(void* dst, const void* src, std::size_t bytes);   // on the stream, then waits

} // namespace pt::cuda_ops
