// gemm-shapes: the matrix products of one GPT-2 training step, shape by shape, on one GPU.
// For each Linear layer (qkv, attention proj, fc, MLP proj, LM head) and each of its three
// products (forward, backward-input, backward-weight) it times
//   ops   the CUDA backend's matmul op at precision bf16 as the model calls it: fp32 operands
//         converted to bf16 copies, fp32 result (bias included where the layer has one);
//   bf16>f32  cuBLAS on operands already in bf16, fp32 result;
//   bf16>bf16 cuBLAS on operands already in bf16, bf16 result;
// and prints ms per call, TFLOP/s, and the step's totals (block layers times n_layer). The gap
// between "ops" and the two cuBLAS columns is what bf16 activation storage can win. Last, the
// bf16>bf16 rates as a planner machine file's `gemm` rows (docs/planner.md).
//
// Usage: pt_bench_gemm_shapes [N=16384] [C=768] [V=50304] [layers=12] [reps=20]
// (N = micro-batch x sequence rows). Exits 77 where no GPU is visible.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/ops_cuda.hpp"

namespace {

namespace co = pt::cuda_ops;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS error");
}

__global__ void fill_k(float* x, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = (static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 0.1f;
  }
}

__global__ void to_bf16_k(__nv_bfloat16* out, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(x[i]);
  }
}

struct Buf { // n random floats on the device and their bf16 copy
  float* f = nullptr;
  __nv_bfloat16* h = nullptr;
  explicit Buf(std::size_t n) {
    f = static_cast<float*>(co::alloc(n * sizeof(float)));
    h = static_cast<__nv_bfloat16*>(co::alloc(n * sizeof(__nv_bfloat16)));
    auto* s = static_cast<cudaStream_t>(co::stream());
    fill_k<<<1024, 256, 0, s>>>(f, n, static_cast<unsigned>(n));
    to_bf16_k<<<1024, 256, 0, s>>>(h, f, n);
    check(cudaGetLastError(), "fill");
  }
  ~Buf() {
    co::release(f);
    co::release(h);
  }
};

// Milliseconds per call of f, averaged over reps after two warm-up calls.
template <class F> double time_ms(int reps, F f) {
  auto* s = static_cast<cudaStream_t>(co::stream());
  f();
  f();
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  check(cudaEventRecord(a, s), "event");
  for (int r = 0; r < reps; ++r) f();
  check(cudaEventRecord(b, s), "event");
  check(cudaEventSynchronize(b), "event");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, a, b), "event");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

} // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device visible\n");
    return 77;
  }
  const auto arg = [&](int i, long def) { return argc > i ? std::atol(argv[i]) : def; };
  const int N = static_cast<int>(arg(1, 16384)), C = static_cast<int>(arg(2, 768)),
            V = static_cast<int>(arg(3, 50304)), L = static_cast<int>(arg(4, 12)),
            reps = static_cast<int>(arg(5, 20));
  co::init(0);
  co::set_precision("bf16");
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  check(cublasSetStream(h, static_cast<cudaStream_t>(co::stream())), "cublasSetStream");
  struct Layer {
    const char* name;
    int in, out, count;
    bool bias;
  };
  const std::vector<Layer> layers{{"qkv", C, 3 * C, L, true},
                                  {"attn proj", C, C, L, true},
                                  {"fc", C, 4 * C, L, true},
                                  {"mlp proj", 4 * C, C, L, true},
                                  {"lm head", C, V, 1, false}};
  std::printf("GPT-2 products at N=%d rows, C=%d, V=%d, %d layers; ms per call (TFLOP/s)\n", N, C,
              V, L);
  std::printf("  %-10s %-8s %6s %6s %6s  %16s %16s %16s\n", "layer", "product", "M", "N", "K",
              "ops (fp32 io)", "bf16>f32", "bf16>bf16");
  double total[3] = {0, 0, 0};
  std::string table; // the bf16>bf16 rates as a machine file's gemm rows (docs/planner.md)
  for (const Layer& l : layers) {
    const std::size_t nin = static_cast<std::size_t>(N) * l.in,
                      nout = static_cast<std::size_t>(N) * l.out,
                      nw = static_cast<std::size_t>(l.in) * l.out;
    Buf x(nin), y(nout), w(nw), b(l.out), dx(nin), dw(nw), db(l.out);
    const double flops = 2.0 * N * l.in * l.out;
    const float one = 1.0f, zero = 0.0f;
    // cuBLAS is column-major: row-major (R, K) is column-major (K, R)
    const auto raw = [&](cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb,
                         void* out, cudaDataType_t ot, int ldc, float beta) {
      check(cublasGemmEx(h, ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                         beta == 0.0f ? &zero : &one, out, ot, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    };
    struct Row {
      const char* what;
      int m, n, k;
      double ops, f32, b16;
    };
    std::vector<Row> rows;
    // forward: y (N, out) = x (N, in) w^T
    rows.push_back({"forward", N, l.out, l.in,
                    time_ms(reps,
                            [&] {
                              co::matmul_forward(y.f, x.f, w.f, l.bias ? b.f : nullptr, N, l.in,
                                                 l.out);
                            }),
                    time_ms(reps,
                            [&] {
                              raw(CUBLAS_OP_T, CUBLAS_OP_N, l.out, N, l.in, w.h, l.in, x.h, l.in,
                                  y.f, CUDA_R_32F, l.out, 0.0f);
                            }),
                    time_ms(reps, [&] {
                      raw(CUBLAS_OP_T, CUBLAS_OP_N, l.out, N, l.in, w.h, l.in, x.h, l.in, y.h,
                          CUDA_R_16BF, l.out, 0.0f);
                    })});
    // backward-input: dx (N, in) = dy (N, out) w
    rows.push_back(
        {"bwd input", N, l.in, l.out,
         time_ms(reps, [&] { co::matmul_backward_input(dx.f, y.f, w.f, N, l.in, l.out); }),
         time_ms(reps,
                 [&] {
                   raw(CUBLAS_OP_N, CUBLAS_OP_N, l.in, N, l.out, w.h, l.in, y.h, l.out, dx.f,
                       CUDA_R_32F, l.in, 0.0f);
                 }),
         time_ms(reps, [&] {
           raw(CUBLAS_OP_N, CUBLAS_OP_N, l.in, N, l.out, w.h, l.in, y.h, l.out, dx.h, CUDA_R_16BF,
               l.in, 0.0f);
         })});
    // backward-weight: dw (out, in) += dy^T x (fp32 accumulation into the fp32 gradient)
    rows.push_back({"bwd weight", l.out, l.in, N,
                    time_ms(reps,
                            [&] {
                              co::matmul_backward_weight(dw.f, l.bias ? db.f : nullptr, y.f, x.f, N,
                                                         l.in, l.out);
                            }),
                    time_ms(reps,
                            [&] {
                              raw(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, N, x.h, l.in, y.h, l.out,
                                  dw.f, CUDA_R_32F, l.in, 1.0f);
                            }),
                    time_ms(reps, [&] {
                      raw(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, N, x.h, l.in, y.h, l.out, dw.h,
                          CUDA_R_16BF, l.in, 1.0f);
                    })});
    for (const Row& r : rows) {
      std::printf("  %-10s %-8s %6d %6d %6d  %7.3f (%6.1f) %7.3f (%6.1f) %7.3f (%6.1f)\n", l.name,
                  r.what, r.m, r.n, r.k, r.ops, flops / r.ops / 1e9, r.f32, flops / r.f32 / 1e9,
                  r.b16, flops / r.b16 / 1e9);
      char entry[96];
      std::snprintf(entry, sizeof entry, "%s[%d, %d, %d, %.1f]", table.empty() ? "" : ", ", r.m,
                    r.n, r.k, flops / r.b16 / 1e9);
      table += entry;
      total[0] += l.count * r.ops;
      total[1] += l.count * r.f32;
      total[2] += l.count * r.b16;
    }
  }
  std::printf("  per step (block layers x %d): ops %.2f ms, bf16>f32 %.2f ms, bf16>bf16 %.2f ms\n",
              L, total[0], total[1], total[2]);
  std::printf("machine file rows (bf16>bf16, TFLOP/s):\ngemm = [%s]\n", table.c_str());
  cublasDestroy(h);
  co::finalize();
  return 0;
}
