#include "comm/reducers.hpp"

#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "bf16.hpp"
#include "comm/layout.hpp"
#include "cuda/device_query.hpp"
#include "util/errors.hpp"
#include "util/memory_count.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

// The bf16 sum of MPI's reductions: each value widened, added in fp32, rounded back.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = bf16::from_float(bf16::to_float(a[i]) + bf16::to_float(b[i]));
}

// MPI under the watchdog: on the host memory itself, or on host copies of a GPU backend's memory
// (MPI sees host memory only, whatever its single-copy mechanism). In bf16 the values go through
// packed host copies and a non-commutative bf16 sum (combined in rank order whatever MPI's
// algorithm).
class MpiReducer final : public GroupReducer {
public:
  MpiReducer(MPI_Comm comm, std::string what, const Watchdog& watchdog, const Backend& be)
      : comm_(comm), what_(std::move(what)), watchdog_(watchdog), be_(be) {
    PT_MPI(MPI_Comm_rank(comm_, &rank_));
    PT_MPI(MPI_Comm_size(comm_, &size_));
    PT_MPI(MPI_Op_create(bf16_sum, 0, &bf16_sum_));
  }
  ~MpiReducer() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&bf16_sum_);
  }
  MpiReducer(const MpiReducer&) = delete;
  MpiReducer& operator=(const MpiReducer&) = delete;

  void sum(float* x, std::size_t n, ActFormat wire) override {
    if (wire == ActFormat::bf16) return sum_bf16(x, n);
    reduce(x, n, MPI_SUM);
  }
  void max(float* x, std::size_t n) override { reduce(x, n, MPI_MAX); }
  void reduce_scatter(float* out, const float* x, std::size_t n, ActFormat wire) override {
    const bool half = wire == ActFormat::bf16;
    const float* in = to_host(x, n * size_, host_in_);
    float* res = result(out, n);
    const void* send = in;
    if (half) send = pack(in, n * size_, packed_in_);
    void* recv = res;
    if (half) {
      packed_out_.resize(n);
      recv = packed_out_.data();
    }
    MPI_Request req;
    PT_MPI(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(n),
                                     half ? MPI_UINT16_T : MPI_FLOAT, half ? bf16_sum_ : MPI_SUM,
                                     comm_, &req));
    watchdog_.count_collective();
    watchdog_.wait(req, what_ + " (reduce-scatter)");
    if (half) bf16::unpack(res, packed_out_.data(), n);
    bytes_ += n * size_ * (half ? 2 : 4);
    from_host(out, res, n);
  }
  void all_gather(float* out, const float* in, std::size_t n, ActFormat wire) override {
    const bool half = wire == ActFormat::bf16;
    const float* src = to_host(in, n, host_in_);
    float* res = result(out, n * size_);
    const void* send = src;
    if (half) send = pack(src, n, packed_in_);
    void* recv = res;
    if (half) {
      packed_out_.resize(n * size_);
      recv = packed_out_.data();
    }
    const MPI_Datatype type = half ? MPI_UINT16_T : MPI_FLOAT;
    MPI_Request req;
    PT_MPI(MPI_Iallgather(send, static_cast<int>(n), type, recv, static_cast<int>(n), type, comm_,
                          &req));
    watchdog_.count_collective();
    watchdog_.wait(req, what_ + " (all-gather)");
    if (half) bf16::unpack(res, packed_out_.data(), n * size_);
    bytes_ += n * (half ? 2 : 4);
    from_host(out, res, n * size_);
  }
  std::uint64_t bytes() const override { return bytes_; }

private:
  void reduce(float* x, std::size_t n, MPI_Op op) {
    withhold_if_asked();
    float* data = const_cast<float*>(to_host(x, n, host_in_));
    watchdog_.allreduce(data, static_cast<int>(n), MPI_FLOAT, op, comm_, what_);
    bytes_ += n * sizeof(float);
    from_host(x, data, n);
  }
  void sum_bf16(float* x, std::size_t n) {
    withhold_if_asked();
    const float* host = to_host(x, n, host_in_);
    std::uint16_t* packed = pack(host, n, packed_in_);
    watchdog_.allreduce(packed, static_cast<int>(n), MPI_UINT16_T, bf16_sum_, comm_, what_);
    bytes_ += n * 2;
    float* res = result(x, n);
    bf16::unpack(res, packed, n);
    from_host(x, res, n);
  }
  void withhold_if_asked() {
    if (test_hooks().withhold_tp && rank_ == 1 && !withheld_ &&
        what_.find("tensor-parallel") != std::string::npos) {
      withheld_ = true; // test-only: this rank never joins; the others' watchdog must name it
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  static std::uint16_t* pack(const float* x, std::size_t n, CountedVector<std::uint16_t>& out) {
    out.resize(n);
    bf16::pack(out.data(), x, n);
    return out.data();
  }
  // x itself on the host backend, else a host copy of its n floats in `host`
  const float* to_host(const float* x, std::size_t n, CountedVector<float>& host) const {
    if (be_.on_host()) return x;
    host.resize(n);
    be_.copy(host.data(), x, n * sizeof(float));
    be_.synchronize();
    return host.data();
  }
  // where MPI writes n floats meant for out: out itself, or host_out_
  float* result(float* out, std::size_t n) {
    if (be_.on_host()) return out;
    host_out_.resize(n);
    return host_out_.data();
  }
  void from_host(float* x, const float* host, std::size_t n) const {
    if (be_.on_host()) return;
    be_.copy(x, host, n * sizeof(float));
    be_.synchronize();
  }

  MPI_Comm comm_;
  std::string what_;
  const Watchdog& watchdog_;
  const Backend& be_;
  int rank_ = 0, size_ = 1;
  bool withheld_ = false;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  std::uint64_t bytes_ = 0;
  CountedVector<float> host_in_, host_out_;             // GPU backend: the host copies MPI works on
  CountedVector<std::uint16_t> packed_in_, packed_out_; // bf16: the values MPI moves
};

// NCCL on device memory, queued on the backend's stream in order with the ops.
class NcclReducer final : public GroupReducer {
public:
  // size: the ranks of the group
  NcclReducer(std::unique_ptr<cuda::NcclComm> nccl, int size)
      : nccl_(std::move(nccl)), size_(static_cast<std::size_t>(size)) {}
  // fp32 whatever the wire format (NCCL's bf16 path is not written)
  void sum(float* x, std::size_t n, ActFormat /*wire*/) override {
    nccl_->sum(x, n);
    bytes_ += n * sizeof(float);
  }
  void max(float* x, std::size_t n) override {
    nccl_->max(x, n);
    bytes_ += n * sizeof(float);
  }
  void reduce_scatter(float* out, const float* x, std::size_t n, ActFormat /*wire*/) override {
    nccl_->reduce_scatter(out, x, n);
    bytes_ += n * size_ * sizeof(float); // the whole input: size blocks
  }
  void all_gather(float* out, const float* in, std::size_t n, ActFormat /*wire*/) override {
    nccl_->all_gather(out, in, n);
    bytes_ += n * sizeof(float);
  }
  std::uint64_t bytes() const override { return bytes_; }

private:
  std::unique_ptr<cuda::NcclComm> nccl_;
  std::size_t size_;
  std::uint64_t bytes_ = 0;
};

} // namespace

std::unique_ptr<GroupReducer> make_reducer(MPI_Comm comm, const std::string& what,
                                           const Watchdog& watchdog, const Backend& be,
                                           std::unique_ptr<cuda::NcclComm> nccl) {
  if (nccl) {
    int size = 1;
    PT_MPI(MPI_Comm_size(comm, &size));
    return std::make_unique<NcclReducer>(std::move(nccl), size);
  }
  return std::make_unique<MpiReducer>(comm, what, watchdog, be);
}

std::pair<int, int> physical_node(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  PT_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0, size = 1;
  PT_MPI(MPI_Comm_rank(node, &rank));
  PT_MPI(MPI_Comm_size(node, &size));
  PT_MPI(MPI_Comm_free(&node));
  return {rank, size};
}

bool use_nccl(const std::string& key, GpuTransport want, const RunConfig& cfg, MPI_Comm world,
              std::string& why) {
  if (cfg.device.kind != DeviceKind::cuda || want == GpuTransport::mpi) {
    why = want == GpuTransport::mpi
              ? key + " = \"mpi\""
              : "device.kind = \"" + std::string(name(cfg.device.kind)) + "\"";
    return false;
  }
  const int on_node = physical_node(world).second;
  std::string ignored;
  int ok = 1, most = on_node, gpus = cuda::device_count(ignored);
  if (!cuda::nccl_compiled()) {
    ok = 0;
    why = "this pipetrain was built without NCCL";
  } else if (on_node > gpus) {
    ok = 0;
  }
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world));
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, world));
  if (ok == 1) return true;
  if (why.empty()) {
    why = std::to_string(most) + " ranks share a node's GPUs, and NCCL needs one GPU per rank";
  }
  std::optional<Error> err;
  if (want == GpuTransport::nccl) {
    err = input_error(key + " = \"nccl\": " + why + "; use " + key +
                      "=\"mpi\" (host-staged MPI) or one rank per GPU");
  }
  agree(world, err);
  return false;
}

std::unique_ptr<cuda::NcclComm> make_nccl(MPI_Comm group, bool side_stream, MPI_Comm world) {
  int rank = 0, size = 1;
  PT_MPI(MPI_Comm_rank(group, &rank));
  PT_MPI(MPI_Comm_size(group, &size));
  std::optional<Error> err;
  cuda::NcclId id{};
  int made = 1;
  if (rank == 0) {
    try {
      id = cuda::nccl_unique_id();
    } catch (const std::exception& e) {
      made = 0;
      err = input_error(std::string("NCCL: ") + e.what() + "; use comm.gpu_collectives=\"mpi\"");
    }
  }
  PT_MPI(MPI_Bcast(&made, 1, MPI_INT, 0, group));
  PT_MPI(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_CHAR, 0, group));
  std::unique_ptr<cuda::NcclComm> comm;
  if (made == 1) {
    try {
      comm = std::make_unique<cuda::NcclComm>(id, size, rank, side_stream);
    } catch (const std::exception& e) {
      err = input_error(std::string("NCCL could not make a communicator: ") + e.what() +
                        "; use comm.gpu_collectives=\"mpi\"");
    }
  }
  agree(world, err);
  return comm;
}

std::vector<std::unique_ptr<cuda::NcclLink>> make_nccl_links(const schedule::Schedule& sched,
                                                             const Layout& layout) {
  const int me = layout.coords().pp;
  const std::vector<schedule::Channel> channels = schedule::channels(sched);
  std::vector<std::unique_ptr<cuda::NcclLink>> links(channels.size());
  std::optional<Error> err;
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const schedule::Channel& c = channels[i];
    if (c.from != me && c.to != me) continue;
    const bool sender = c.from == me;
    const int peer = sender ? c.to : c.from;
    cuda::NcclId id{};
    if (sender && !err) {
      try {
        id = cuda::nccl_unique_id();
      } catch (const std::exception& e) {
        err = input_error(std::string("NCCL: ") + e.what() + "; use comm.gpu_p2p=\"mpi\"");
      }
    }
    int mine = err ? 0 : 1, theirs = 0;
    PT_MPI(MPI_Sendrecv(&mine, 1, MPI_INT, peer, 0, &theirs, 1, MPI_INT, peer, 0, layout.pp_comm(),
                        MPI_STATUS_IGNORE));
    if (mine == 0 || theirs == 0) continue;
    if (sender) {
      PT_MPI(MPI_Send(id.data(), static_cast<int>(id.size()), MPI_CHAR, peer, 0, layout.pp_comm()));
    } else {
      PT_MPI(MPI_Recv(id.data(), static_cast<int>(id.size()), MPI_CHAR, peer, 0, layout.pp_comm(),
                      MPI_STATUS_IGNORE));
    }
    try {
      links[i] = std::make_unique<cuda::NcclLink>(id, sender);
    } catch (const std::exception& e) {
      err = input_error(std::string("NCCL could not link pipeline ranks ") +
                        std::to_string(c.from) + " -> " + std::to_string(c.to) + ": " + e.what() +
                        "; use comm.gpu_p2p=\"mpi\"");
    }
  }
  agree(layout.world(), err);
  return links;
}

} // namespace pt
