// Data-parallel gradient reduction of one model chunk in buckets (comm.bucket_mb), in reverse
// layer order, optionally overlapped with the backward (comm.overlap, docs/collectives.md):
//   none    every bucket is reduced after the step's schedule, with comm.allreduce's algorithm
//   thread  a progress thread reduces each bucket (comm.allreduce's algorithm, on its own copy
//           of the dp communicator) as soon as the last micro-batch's backward has finished its
//           layers; needs MPI_THREAD_MULTIPLE
//   poll    each finished bucket starts an MPI_Iallreduce that the engine advances with
//           MPI_Testall between layers and actions
// With a GPU backend (on_host() false) each bucket is copied to a host buffer when it starts,
// MPI reduces the copy, and finish() copies the sums back; or, given an NCCL communicator
// (mode() "nccl", comm.gpu_collectives), each bucket is reduced in device memory on the
// communicator's side stream as it starts, and finish() waits for that stream.
// Blocks' buckets may start during the backward; the embedding, final norm and head are
// reduced at finish(), after the tied head's share has been folded in.
// Under ZeRO-1 (given a ShardTarget) each bucket is reduce-scattered instead: padded to dp
// blocks, rank r's block summed over the group in rank order into the optimizer's shard
// (optim/zero_adamw.hpp), with the same overlap modes (poll: MPI_Ialltoallv of the blocks, summed
// in rank order when finish() has them), bit-identical to one another.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "comm/allreduce.hpp"
#include "config/enums.hpp"
#include "cuda/nccl.hpp"
#include "model/param_layout.hpp"
#include "util/memory_count.hpp"

namespace pt {

struct GradBucket {
  std::size_t offset = 0, count = 0; // floats in the chunk's gradient buffer
  int ready_layer = -1;              // launchable once this layer's weight gradients are final;
                                     // -1: at finish()
};

// Buckets of at most bucket_floats (0: one per layer group without limit) over the layout's
// tensors that `pick` selects (empty: all): blocks from the last layer down, then the edge
// tensors.
std::vector<GradBucket> make_buckets(const ParamLayout& layout, std::size_t bucket_floats,
                                     const std::function<bool(const ParamTensor&)>& pick = {});

struct GradSyncStats {
  double exposed_s = 0.0; // the trainer waited in finish() (and polling calls)
  double busy_s = 0.0;    // reductions ran (the progress thread's time, or finish()'s)
  int buckets_early = 0;  // buckets launched before finish()
};

// ZeRO-1's destination: bucket b's rank-r block of the dp sums goes to shard + at[b] (each[b]
// floats: the bucket padded to dp blocks of each[b]); host memory.
struct ShardTarget {
  float* shard = nullptr;
  std::vector<std::size_t> each, at;
};

class GradSync {
public:
  // grads: the chunk's gradient buffer in be's memory (must outlive this). Collective over dp
  // (dups it). With nccl, overlap is ignored: buckets go to NCCL as they become final.
  // zero.shard set: ZeRO-1's reduce-scatter into it (no NCCL, no all-reduce algorithm).
  GradSync(float* grads, std::vector<GradBucket> buckets, MPI_Comm dp, Overlap overlap,
           AllreduceOptions opt, const Backend& be = host_backend(),
           std::unique_ptr<cuda::NcclComm> nccl = nullptr, ShardTarget zero = {});
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // A layer's weight gradients are final for this step (engine hook, last micro-batch).
  void layer_done(int layer);
  // Progress for poll mode (cheap no-op otherwise).
  void poll();
  // Launches what is left, waits for all buckets, resets for the next step.
  void finish(GradSyncStats& stats);
  // comm.overlap's name, or "nccl"
  const char* mode() const { return nccl_ ? "nccl" : name(overlap_); }
  // ZeRO-1: finish() reduce-scatters into the shard, after the gradients' sums over tp and the
  // tied embedding's (engine/step.cpp); an all-reduce finishes before them.
  bool scatters() const { return zero_.shard != nullptr; }
  // The bucket reducer (none in poll mode, which uses MPI_Iallreduce, and with NCCL).
  const Allreducer* reducer() const { return reducer_.get(); }

private:
  void launch(std::size_t b);
  void worker();
  // ZeRO-1: bucket b (data: its floats where MPI reads them) reduce-scattered into the shard,
  // blocking; or started (poll) and summed by collect() once received.
  void scatter(std::size_t b, const float* data);
  void start_scatter(std::size_t b, const float* data);
  void collect(std::size_t b);
  // The floats that MPI reduces for bucket b: in place, or (GPU backend) copied out first.
  float* stage_out(std::size_t b);
  float* reduced(std::size_t b) {
    return (host_.empty() ? grads_ : host_.data()) + buckets_[b].offset;
  }

  float* grads_;
  std::vector<GradBucket> buckets_;
  std::vector<char> launched_;
  Overlap overlap_;
  const Watchdog* watchdog_ = nullptr;
  const Backend& be_;
  CountedVector<float> host_; // GPU backend with MPI: host copies of the buckets
  std::unique_ptr<cuda::NcclComm> nccl_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<Allreducer> reducer_;
  std::vector<MPI_Request> requests_; // poll
  int early_ = 0;
  ShardTarget zero_;
  std::string what_;                  // the reduce-scatter's name in a hang report
  std::unique_ptr<ReduceComm> group_; // ZeRO-1's exchanges over comm_
  CountedVector<float> padded_, tmp_; // ZeRO-1: a padded bucket and the exchange's scratch
  // ZeRO-1 with poll: per bucket the blocks received from every rank (dp * this rank's block)
  std::vector<CountedVector<float>> received_;
  std::vector<std::size_t> received_from_; // buckets started, in order (their requests_)

  // thread mode: a queue of bucket indices and a worker that reduces them in order
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  std::size_t done_ = 0, queued_ = 0;
  bool stop_ = false;
  double busy_s_ = 0.0;
  std::exception_ptr error_;
};

} // namespace pt
