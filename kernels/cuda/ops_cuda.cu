// CUDA implementation of kernels/cuda/ops_cuda.hpp (the ops of kernels/ops.hpp on a GPU).
// Per-row work (layer norm, softmax, cross-entropy) takes one warp or one block per row;
// column sums over rows take a block per group of columns and add their partial sums with
// atomics; every matrix product is one cuBLAS call (attention: one strided-batched call per
// sequence over its heads). cuBLAS is column-major: a row-major (R,C) matrix is a column-major
// (C,R) one, so out = inp @ w^T becomes out^T = w^T-as-stored times inp^T-as-stored.
//
// Precision "bf16": a matrix product converts its two fp32 operands to bf16 copies (device
// scratch) and runs cuBLAS on bf16 inputs with fp32 accumulation and an fp32 result. Attention
// converts q, k, v (and the incoming gradient) once per call, keeps its probabilities P in bf16
// inside the att buffer (B*NH*T*T bf16 values in the half as many floats attention_floats asks
// for: only this backend reads it), and has cuBLAS write dP in bf16, over which the softmax
// backward writes dS; where flash_attention.hpp takes the shape (GPT-2's head size 64), its kernels
// run instead and att holds each score row's log-sum-exp and bf16 copies of qkv and the output, no
// (T, T) matrix. A forward product with a bias adds it in cuBLASLt's epilogue (no broadcast pass,
// no fp32 read of the result) where cuBLASLt offers that, and falls back to the broadcast
// otherwise.
//
// The ops are split by family: ops_gemm.cu (matrix products), ops_attention.cu, ops_norm.cu,
// ops_elementwise.cu (embedding, GELU, sums, copies), ops_loss.cu (softmax, cross-entropy) and
// ops_optim.cu (AdamW), sharing cuda_common.cuh. This file holds the backend's state and its
// control: device, stream, precision, memory.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda/attention_cudnn.hpp"
#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops::detail {
Backend g;

void add_chunks(std::vector<Chunk>& out, std::size_t a, std::size_t b, std::size_t n, unsigned seg,
                int flag) {
  for (std::size_t i = 0; i < n; i += kChunk) {
    const auto len = static_cast<unsigned>(std::min<std::size_t>(kChunk, n - i));
    out.push_back({a + i, b + i, len, seg, flag});
  }
}

const Chunk* device_chunks(ChunkTable& t, const std::vector<Chunk>& chunks, const char* what) {
  Chunk* d = grown<Chunk>(t.dev, chunks.size(), what);
  if (chunks != t.host) {
    t.host = chunks;
    check(cudaMemcpyAsync(d, t.host.data(), t.host.size() * sizeof(Chunk), cudaMemcpyHostToDevice,
                          g.stream),
          what);
    check(cudaStreamSynchronize(g.stream), what); // t.host may change after the call
  }
  return d;
}
} // namespace pt::cuda_ops::detail

namespace pt::cuda_ops {
using namespace detail;

namespace {

void free_scratch(Scratch& s) {
  if (s.p != nullptr) cudaFreeAsync(s.p, g.stream);
  s = Scratch{};
}

} // namespace

// ---- backend control ------------------------------------------------------------------------

void init(int device) {
  if (g.stream != nullptr) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  g.device = device;
  check(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&g.blas), "cublasCreate");
  check(cublasSetStream(g.blas, g.stream), "cublasSetStream");
  check(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  check(cudaMalloc(&g.blas_workspace, kLtWorkspace), "cudaMalloc");
  check(cublasSetWorkspace(g.blas, g.blas_workspace, kLtWorkspace), "cublasSetWorkspace");
  check(cublasLtCreate(&g.lt), "cublasLtCreate");
  check(cudaMalloc(&g.lt_workspace, kLtWorkspace), "cudaMalloc");
}

void finalize() {
  if (g.stream == nullptr) return;
  cudaStreamSynchronize(g.stream);
  for (Scratch* x : {&g.dp, &g.op_a, &g.op_b, &g.qkv16, &g.dout16, &g.ds16, &g.lt_bias, &g.sums,
                     &g.rowdot, &g.dqkv16, &g.colsum, &g.adam_chunks.dev, &g.norm_chunks.dev}) {
    free_scratch(*x);
  }
  cudaStreamSynchronize(g.stream);
  for (auto& [key, plan] : g.lt_plans) destroy_plan(plan);
  cudnn_attention::finalize();
  for (cudaEvent_t e : g.marks) cudaEventDestroy(e);
  cudaFree(g.lt_workspace);
  cublasLtDestroy(g.lt);
  cublasDestroy(g.blas);
  cudaFree(g.blas_workspace);
  cudaStreamDestroy(g.stream);
  g = Backend{};
}

void synchronize() {
  ready();
  check(cudaStreamSynchronize(g.stream), "a queued kernel");
}

void restart_marks() {
  g.marks_used = 0;
}

int mark() {
  ready();
  if (g.marks_used == g.marks.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    g.marks.push_back(e);
  }
  check(cudaEventRecord(g.marks[g.marks_used], g.stream), "cudaEventRecord");
  return static_cast<int>(g.marks_used++);
}

double seconds(int from, int to) {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, g.marks.at(static_cast<std::size_t>(from)),
                             g.marks.at(static_cast<std::size_t>(to))),
        "cudaEventElapsedTime");
  return 1e-3 * ms;
}

void set_tf32(bool on) {
  set_precision(on ? "tf32" : "fp32");
}

void set_precision(const std::string& precision) {
  ready();
  if (precision == "fp32") {
    g.compute = CUBLAS_COMPUTE_32F;
  } else if (precision == "tf32") {
    g.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  } else if (precision != "bf16") {
    throw std::runtime_error("CUDA backend: unknown precision \"" + precision + "\"");
  }
  g.bf16 = precision == "bf16";
}

void set_attention(const std::string& kind) {
  ready();
  if (kind == "auto") {
    g.attention = AttentionPath::automatic;
  } else if (kind == "cudnn") {
    if (!cudnn_attention::compiled()) {
      throw std::runtime_error(
          "device.attention = \"cudnn\": this build has no cuDNN attention (cuDNN 9 and the "
          "cudnn-frontend headers were not both found when it was configured: "
          "tools/setup-cudnn-frontend, docs/cuda.md); use \"auto\"");
    }
    g.attention = AttentionPath::cudnn;
  } else if (kind == "flash") {
    g.attention = AttentionPath::flash;
  } else if (kind == "gemm") {
    g.attention = AttentionPath::gemm;
  } else {
    throw std::runtime_error("CUDA backend: unknown attention \"" + kind + "\"");
  }
}

bool bf16_products() {
  return g.bf16;
}

void* stream() {
  return g.stream;
}

long flash_attention_calls() {
  return g.flash_calls;
}

long bias_epilogue_products() {
  return g.lt_products;
}

const char* blas_name() {
  return "cublas";
}

void* alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}

void release(void* p) {
  cudaFree(p);
}

void* alloc_zeroed(std::size_t bytes) {
  ready();
  void* p = alloc(bytes);
  check(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, g.stream), "cudaMemset");
  synchronize();
  return p;
}

void copy(void* dst, const void* src, std::size_t bytes) {
  ready();
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream), "cudaMemcpyAsync");
}

void to_device(void* dst, const void* src, std::size_t bytes) {
  ready();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream), "copy to device");
  synchronize();
}

void to_host(void* dst, const void* src, std::size_t bytes) {
  ready();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream), "copy to host");
  synchronize();
}

} // namespace pt::cuda_ops
