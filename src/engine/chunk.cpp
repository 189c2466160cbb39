// A chunk's part of the step: its gradients' reductions, its norm sums and its update.
#include "engine/chunk.hpp"

#include <utility>

namespace pt {

Chunk::Chunk(std::unique_ptr<GptStage> stage, std::unique_ptr<Optimizer> opt)
    : stage_(std::move(stage)), opt_(std::move(opt)) {}

void Chunk::count_in_norm(const ParamLayout& whole) {
  const std::vector<ParamTensor>& tensors = stage_->layout().tensors();
  for (const Optimizer::Span& span : opt_->grad_spans()) {
    if (!stage_->counts_in_norm(tensors[span.tensor])) continue;
    norm_index_.push_back(whole.index_of(tensors[span.tensor]));
    norm_offset_.push_back(span.offset);
    norm_size_.push_back(span.size);
    norm_expert_.push_back(tensors[span.tensor].expert ? 1 : 0);
  }
  norm_sums_.resize(norm_index_.size());
}

void Chunk::finish_sum(GradSyncStats& comm) {
  stage_->fold_tied_head_grad();
  if (sync_ && !sync_->scatters()) sync_->finish(comm);
  if (expert_sync_) expert_sync_->finish(comm);
  stage_->sum_sequence_parallel_grads();
}

void Chunk::finish_shard(GradSyncStats& comm) {
  if (sync_ && sync_->scatters()) sync_->finish(comm);
  opt_->reduce(stage_->grads());
}

void Chunk::add_norm_squares(double* sq, int dp_rank, int ep) {
  // whole optimizers: the dp replicas' gradients are equal, dp rank 0 counts them, and the
  // experts' shards the first expert-parallel group
  if (!opt_->sharded() && dp_rank >= ep) return;
  const float* g = opt_->summed_grads(stage_->grads());
  stage_->backend().sum_squares_each(norm_sums_.data(), g, norm_offset_.data(), norm_size_.data(),
                                     static_cast<int>(norm_index_.size()));
  for (std::size_t i = 0; i < norm_index_.size(); ++i) {
    if (opt_->sharded() || dp_rank == 0 || norm_expert_[i]) sq[norm_index_[i]] += norm_sums_[i];
  }
}

void Chunk::update(double lr, float grad_scale) {
  opt_->step(stage_->params(), stage_->grads(), lr, grad_scale);
}

void Chunk::save() {
  const Backend& be = stage_->backend();
  const std::size_t n = stage_->num_params();
  if (saved_params_.size() != n) saved_params_ = FloatBuffer(n, Memory{be.alloc, be.release});
  be.copy(saved_params_.data(), stage_->params(), n * sizeof(float));
  opt_->save();
}

void Chunk::undo() {
  stage_->backend().copy(stage_->params(), saved_params_.data(), saved_params_.bytes());
  opt_->restore();
}

} // namespace pt
