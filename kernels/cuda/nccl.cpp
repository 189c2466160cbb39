#include "cuda/nccl.hpp"

#include <stdexcept>
#include <string>

#ifdef PT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "cuda/ops_cuda.hpp"
#endif

namespace pt::cuda {

#ifdef PT_HAVE_NCCL
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
  }
}

void check(cudaError_t r, const char* what) {
  if (r != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(r));
}

} // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t side = nullptr; // null: the backend's stream
  cudaEvent_t ready = nullptr; // the backend's stream reached the point a side reduction needs
  cudaStream_t stream() const {
    return side != nullptr ? side : static_cast<cudaStream_t>(cuda_ops::stream());
  }
  void reduce(float* x, std::size_t n, ncclRedOp_t op) {
    if (n == 0) return;
    if (side != nullptr) { // start after the ops queued so far (the gradients are final)
      check(cudaEventRecord(ready, static_cast<cudaStream_t>(cuda_ops::stream())),
            "cudaEventRecord");
      check(cudaStreamWaitEvent(side, ready, 0), "cudaStreamWaitEvent");
    }
    check(ncclAllReduce(x, x, n, ncclFloat32, op, comm, stream()), "ncclAllReduce");
  }
};

bool nccl_compiled() {
  return true;
}

NcclId nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId));
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

NcclComm::NcclComm(const NcclId& id, int nranks, int rank, bool side_stream)
    : impl_(std::make_unique<Impl>()) {
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  check(ncclCommInitRank(&impl_->comm, nranks, nid, rank), "ncclCommInitRank");
  if (side_stream) {
    check(cudaStreamCreateWithFlags(&impl_->side, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming), "cudaEventCreate");
  }
}

NcclComm::~NcclComm() {
  if (impl_->side != nullptr) {
    cudaStreamSynchronize(impl_->side);
    cudaEventDestroy(impl_->ready);
    cudaStreamDestroy(impl_->side);
  }
  if (impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

void NcclComm::sum(float* x, std::size_t n) {
  impl_->reduce(x, n, ncclSum);
}

void NcclComm::max(float* x, std::size_t n) {
  impl_->reduce(x, n, ncclMax);
}

void NcclComm::wait() {
  check(cudaStreamSynchronize(impl_->stream()), "a queued NCCL reduction");
}

#else

namespace {
constexpr const char* kNoNccl = "this pipetrain was built without NCCL (CUDA and nccl.h/libnccl "
                                "are needed at configure time; docs/cuda.md)";
}

struct NcclComm::Impl {};

bool nccl_compiled() {
  return false;
}

NcclId nccl_unique_id() {
  throw std::runtime_error(kNoNccl);
}

NcclComm::NcclComm(const NcclId&, int, int, bool) {
  throw std::runtime_error(kNoNccl);
}

NcclComm::~NcclComm() = default;

void NcclComm::sum(float*, std::size_t) {}
void NcclComm::max(float*, std::size_t) {}
void NcclComm::wait() {}

#endif

} // namespace pt::cuda
