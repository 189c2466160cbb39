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

void NcclComm::reduce_scatter(float* out, const float* x, std::size_t n) {
  check(ncclReduceScatter(x, out, n, ncclFloat32, ncclSum, impl_->comm, impl_->stream()),
        "ncclReduceScatter");
}

void NcclComm::all_gather(float* out, const float* in, std::size_t n) {
  check(ncclAllGather(in, out, n, ncclFloat32, impl_->comm, impl_->stream()), "ncclAllGather");
}

void NcclComm::wait() {
  check(cudaStreamSynchronize(impl_->stream()), "a queued NCCL reduction");
}

struct NcclLink::Impl {
  ncclComm_t comm = nullptr;
  bool sender = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;       // the backend's stream reached a send's data
  std::vector<cudaEvent_t> finished; // per message of this round: its transfer is over
  int queued = 0;
  int peer() const { return sender ? 1 : 0; }
  int next_event() {
    if (queued == static_cast<int>(finished.size())) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      finished.push_back(e);
    }
    return queued++;
  }
};

NcclLink::NcclLink(const NcclId& id, bool sender) : impl_(std::make_unique<Impl>()) {
  impl_->sender = sender;
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  check(ncclCommInitRank(&impl_->comm, 2, nid, sender ? 0 : 1), "ncclCommInitRank");
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming), "cudaEventCreate");
  // NCCL connects a pair lazily, at its first transfer; do it now, while both ends are here
  float* one = nullptr;
  check(cudaMalloc(&one, sizeof(float)), "cudaMalloc");
  check(cudaMemsetAsync(one, 0, sizeof(float), impl_->stream), "cudaMemset");
  if (sender) {
    check(ncclSend(one, 1, ncclFloat32, impl_->peer(), impl_->comm, impl_->stream), "ncclSend");
  } else {
    check(ncclRecv(one, 1, ncclFloat32, impl_->peer(), impl_->comm, impl_->stream), "ncclRecv");
  }
  check(cudaStreamSynchronize(impl_->stream), "the first NCCL transfer of a pipeline link");
  check(cudaFree(one), "cudaFree");
}

NcclLink::~NcclLink() {
  if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
  for (cudaEvent_t e : impl_->finished) cudaEventDestroy(e);
  if (impl_->ready != nullptr) cudaEventDestroy(impl_->ready);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
  if (impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

int NcclLink::send(const float* x, std::size_t n) {
  Impl& l = *impl_;
  check(cudaEventRecord(l.ready, static_cast<cudaStream_t>(cuda_ops::stream())), "cudaEventRecord");
  check(cudaStreamWaitEvent(l.stream, l.ready, 0), "cudaStreamWaitEvent");
  check(ncclSend(x, n, ncclFloat32, l.peer(), l.comm, l.stream), "ncclSend");
  const int k = l.next_event();
  check(cudaEventRecord(l.finished[static_cast<std::size_t>(k)], l.stream), "cudaEventRecord");
  return k;
}

int NcclLink::recv(float* x, std::size_t n) {
  Impl& l = *impl_;
  check(ncclRecv(x, n, ncclFloat32, l.peer(), l.comm, l.stream), "ncclRecv");
  const int k = l.next_event();
  check(cudaEventRecord(l.finished[static_cast<std::size_t>(k)], l.stream), "cudaEventRecord");
  return k;
}

bool NcclLink::done(int k) {
  const cudaError_t r = cudaEventQuery(impl_->finished.at(static_cast<std::size_t>(k)));
  if (r == cudaSuccess) return true;
  if (r != cudaErrorNotReady) check(r, "a pipeline message's NCCL transfer");
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(impl_->comm, &async), "ncclCommGetAsyncError");
  check(async, "a pipeline link's NCCL communicator");
  return false;
}

void NcclLink::restart() {
  impl_->queued = 0;
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
void NcclComm::reduce_scatter(float*, const float*, std::size_t) {}
void NcclComm::all_gather(float*, const float*, std::size_t) {}
void NcclComm::wait() {}

struct NcclLink::Impl {};

NcclLink::NcclLink(const NcclId&, bool) {
  throw std::runtime_error(kNoNccl);
}

NcclLink::~NcclLink() = default;

int NcclLink::send(const float*, std::size_t) {
  return 0;
}
int NcclLink::recv(float*, std::size_t) {
  return 0;
}
bool NcclLink::done(int) {
  return true;
}
void NcclLink::restart() {}

#endif

} // namespace pt::cuda
