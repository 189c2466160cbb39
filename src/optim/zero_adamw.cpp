#include "optim/zero_adamw.hpp"

#include <algorithm>
#include <utility>

namespace pt {

ZeroAdamW::ZeroAdamW(const ParamLayout& layout, std::size_t bucket_floats, MPI_Comm dp,
                     const Watchdog& watchdog, const TrainConfig& t, const Backend& backend)
    : comm_(dp, watchdog, what_), be_(backend) {
  const auto p = static_cast<std::size_t>(comm_.size);
  std::size_t shard = 0, widest = 0;
  for (const GradBucket& k : make_buckets(layout, bucket_floats)) {
    Bucket b{k.offset, k.count, (k.count + p - 1) / p, shard};
    shard += b.each;
    widest = std::max(widest, b.each * p);
    buckets_.push_back(b);
  }
  // AdamW's segments: this rank's blocks cut at tensor boundaries (alignment gaps skipped)
  std::vector<AdamSegment> segments;
  const std::vector<ParamTensor>& tensors = layout.tensors();
  for (const Bucket& b : buckets_) {
    const std::size_t lo = block_begin(b), hi = block_end(b);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::size_t a = std::max(lo, tensors[i].offset);
      const std::size_t e = std::min(hi, tensors[i].offset + tensors[i].size);
      if (a >= e) continue;
      const std::size_t at = b.shard_offset + (a - (b.offset + b.each * comm_.rank));
      segments.push_back({a, at, e - a, tensors[i].decay});
      pieces_.push_back({i, at, e - a, a - tensors[i].offset});
    }
  }
  grads_ = FloatBuffer(shard, Memory{backend.alloc, backend.release});
  if (!backend.on_host()) host_.resize(shard);
  opt_ = std::make_unique<AdamW>(std::move(segments), shard, t, backend);
  padded_.resize(widest);
}

std::size_t ZeroAdamW::block_begin(const Bucket& b) const {
  return b.offset + std::min(b.count, b.each * static_cast<std::size_t>(comm_.rank));
}

std::size_t ZeroAdamW::block_end(const Bucket& b) const {
  return b.offset + std::min(b.count, b.each * static_cast<std::size_t>(comm_.rank + 1));
}

ShardTarget ZeroAdamW::shard_target() {
  ShardTarget t{staging(), {}, {}};
  for (const Bucket& b : buckets_) {
    t.each.push_back(b.each);
    t.at.push_back(b.shard_offset);
  }
  return t;
}

void ZeroAdamW::reduce(const float* /*grads*/) {
  if (!be_.on_host()) from_host(be_, grads_.data(), staging(), grads_.size());
}

void ZeroAdamW::gather(float* flat) {
  const float* shard = staging();
  for (const Bucket& b : buckets_) {
    all_gather_blocks(shard + b.shard_offset, padded_.data(), b.each, comm_);
    from_host(be_, flat + b.offset, padded_.data(), b.count);
  }
}

void ZeroAdamW::step(float* params, const float* /*grads*/, double lr, float grad_scale) {
  opt_->step(params, grads_.data(), lr, grad_scale);
  // this rank's updated blocks, laid out as the shard, in the host staging (on the host: the
  // gradient buffer, whose sums the update has consumed)
  float* shard = staging();
  for (const Bucket& b : buckets_) {
    const std::size_t lo = block_begin(b), hi = block_end(b);
    float* mine = shard + b.shard_offset;
    to_host(be_, mine, params + lo, hi - lo);
    std::fill(mine + (hi - lo), mine + b.each, 0.0f);
  }
  gather(params);
}

void ZeroAdamW::save() {
  opt_->save();
  if (saved_grads_.size() != grads_.size()) {
    saved_grads_ = FloatBuffer(grads_.size(), Memory{be_.alloc, be_.release});
  }
  be_.copy(saved_grads_.data(), grads_.data(), grads_.bytes());
}

void ZeroAdamW::restore() {
  opt_->restore();
  be_.copy(grads_.data(), saved_grads_.data(), grads_.bytes());
}

std::vector<Optimizer::Span> ZeroAdamW::grad_spans() const {
  std::vector<Span> out;
  for (const Piece& p : pieces_) out.push_back({p.tensor, p.shard_offset, p.size});
  return out;
}

std::vector<Optimizer::Run> ZeroAdamW::runs(std::size_t tensor) {
  std::vector<Run> out;
  for (const Piece& p : pieces_) {
    if (p.tensor == tensor) {
      out.push_back({p.begin, p.size, opt_->m() + p.shard_offset, opt_->v() + p.shard_offset});
    }
  }
  return out;
}

} // namespace pt
