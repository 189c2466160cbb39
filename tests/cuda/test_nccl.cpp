// The NCCL glue of the CUDA backend (kernels/cuda/nccl.hpp) on one GPU: one-rank communicators
// made from fresh ids, on a side stream and on the backend's stream, must leave device memory
// as the backend's ops left it, under sum and max, as GradSync and the tp sums use them (the
// backend's stream does not touch a bucket between its launch and the wait). A one-rank
// all-reduce is at most a copy, so this checks the calls, the streams and the waits, not NCCL's
// arithmetic over several GPUs (tests/cuda/train_parity.sh runs dp = 2 with NCCL where two GPUs
// are visible). Exits 77 (CTest: skipped) without a GPU or without NCCL.
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/device_query.hpp"
#include "cuda/nccl.hpp"
#include "cuda/ops_cuda.hpp"

namespace co = pt::cuda_ops;

int main() {
  std::string why;
  if (!pt::cuda::compiled() || pt::cuda::device_count(why) == 0) {
    std::printf("SKIP: no CUDA device visible (%s)\n",
                pt::cuda::compiled() ? why.c_str() : "built without nvcc");
    return 77;
  }
  if (!pt::cuda::nccl_compiled()) {
    std::printf("SKIP: this build has no NCCL\n");
    return 77;
  }
  int failures = 0;
  try {
    pt::cuda::start(0, "fp32");
    const std::size_t n = (1u << 20) + 3;
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) - 500.0f;
    auto* x = static_cast<float*>(co::alloc(n * sizeof(float)));
    co::to_device(x, host.data(), n * sizeof(float));
    std::vector<float> got(n);
    auto expect_scaled = [&](float factor, const char* what) { // x == host * factor, exactly
      co::to_host(got.data(), x, n * sizeof(float));
      for (std::size_t i = 0; i < n; ++i) {
        if (got[i] != host[i] * factor) {
          std::printf("FAIL: %s, element %zu: %g, expected %g\n", what, i, got[i],
                      host[i] * factor);
          ++failures;
          return;
        }
      }
    };
    {
      pt::cuda::NcclComm side(pt::cuda::nccl_unique_id(), 1, 0, true);
      for (int rep = 0; rep < 20; ++rep) { // 2^20 x after 20 doublings: exact in fp32
        co::scale(x, 2.0f, n);
        side.sum(x, n);
        side.wait();
      }
      expect_scaled(1048576.0f, "side-stream sum");
      pt::cuda::NcclComm inline_comm(pt::cuda::nccl_unique_id(), 1, 0, false);
      inline_comm.max(x, n);
      co::scale(x, 0.5f, n);
      inline_comm.sum(x, n);
      inline_comm.wait();
      expect_scaled(524288.0f, "stream-ordered max/sum");
    }
    co::release(x);
    co::finalize();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: one-rank NCCL sum and max, side stream after the backend's ops\n",
              failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
