// ZeRO-1 (parallel.zero = 1; Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020, stage 1) for one model chunk over its dp group. The
// gradient buckets (comm.bucket_mb, make_buckets) are reduce-scattered by the chunk's GradSync
// (comm/grad_sync.hpp, with or without overlap) into this optimizer's shard (shard_target()):
// each is padded to a multiple of dp floats and split into dp equal blocks, and rank r keeps
// block r of every bucket, summed over the group in rank order. AdamW's moments and update cover
// those blocks only; the updated blocks are then all-gathered, so every rank holds all
// parameters for the next forward.
// The shard's gradients and moments live in the backend's memory, where AdamW and the norm read
// them; on a GPU the exchanges go through host copies (MPI sees host memory only).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/grad_sync.hpp"
#include "model/param_layout.hpp"
#include "optim/adamw.hpp"
#include "util/buffer.hpp"

namespace pt {

class ZeroAdamW final : public Optimizer {
public:
  // Collective over dp (every rank of it makes one per chunk, in the same order).
  ZeroAdamW(const ParamLayout& layout, std::size_t bucket_floats, MPI_Comm dp,
            const Watchdog& watchdog, const TrainConfig& t,
            const Backend& backend = host_backend());

  // Where the chunk's GradSync writes this rank's blocks of the dp sums (host memory).
  ShardTarget shard_target();
  // After the GradSync's finish(): shard_grads() holds this rank's blocks summed over the dp
  // group (a GPU backend: copied to device memory here).
  void reduce(const float* grads) override;
  const float* summed_grads(const float* /*grads*/) const override { return grads_.data(); }
  std::vector<Span> grad_spans() const override;
  // AdamW on this rank's blocks of the summed gradients (reduce(); times grad_scale; `grads`
  // is not read), then every rank's updated blocks into params.
  void step(float* params, const float* grads, double lr, float grad_scale) override;

  // A run of this rank's blocks inside one tensor: the tensor's index in the layout and the
  // run's place in shard_grads() (for the gradient norm).
  struct Piece {
    std::size_t tensor = 0, shard_offset = 0, size = 0;
    std::size_t begin = 0; // the run's first element in the tensor
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  const float* shard_grads() const { return grads_.data(); }

  // What a checkpoint writes and reads of this rank: its pieces' moments, in place.
  int updates() const override { return opt_->updates(); }
  void set_updates(int t) override { opt_->set_updates(t); }
  std::vector<Run> runs(std::size_t tensor) override;
  bool sharded() const override { return true; }
  // the moments, and the summed gradients of the blocks (on the host, step() reuses their buffer
  // for the all-gather, so a redone update needs them back)
  void save() override;
  void restore() override;

private:
  struct Bucket {
    std::size_t offset = 0, count = 0; // floats of the chunk's flat buffers
    std::size_t each = 0;              // floats per block: ceil(count / dp)
    std::size_t shard_offset = 0;      // this rank's block in the shard buffers
  };
  // This rank's block of bucket b: [begin, end) of the flat buffers (may be empty or short).
  std::size_t block_begin(const Bucket& b) const;
  std::size_t block_end(const Bucket& b) const;
  // Every rank's block of each bucket from the host shard staging() into flat (backend memory).
  void gather(float* flat);
  // This rank's blocks where MPI may read and write them: grads_ itself on the host, else host_.
  float* staging() { return be_.on_host() ? grads_.data() : host_.data(); }

  std::string what_ = "the ZeRO-1 parameter all-gather (dp group)";
  ReduceComm comm_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;
  const Backend& be_;
  FloatBuffer grads_;           // this rank's blocks of the summed gradients (backend)
  FloatBuffer saved_grads_;     // save()'s copy of them
  CountedVector<float> host_;   // their host copy for MPI (a GPU backend only)
  std::unique_ptr<AdamW> opt_;  // moments of this rank's blocks
  CountedVector<float> padded_; // a whole padded bucket: the all-gather's destination
};

} // namespace pt
