#include "comm/grad_sync.hpp"

#include <algorithm>
#include <climits>

#include "comm/watchdog.hpp"
#include "util/buffer.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {

std::vector<GradBucket> make_buckets(const ParamLayout& layout, std::size_t bucket_floats,
                                     const std::function<bool(const ParamTensor&)>& pick) {
  const std::size_t cap = bucket_floats > 0 ? bucket_floats : SIZE_MAX;
  std::vector<GradBucket> out;
  // [lo, hi) pieces of at most `cap` floats, ready with `layer`
  auto emit = [&](std::size_t lo, std::size_t hi, int layer) {
    for (std::size_t b = lo; b < hi; b += std::min(cap, hi - b)) {
      out.push_back(GradBucket{b, std::min(cap, hi - b), layer});
    }
  };
  struct Run {
    std::size_t lo, hi;
    int layer;
  };
  std::vector<Run> runs; // the picked blocks' tensors: a layer's neighbours joined, in order
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  for (const ParamTensor& t : layout.tensors()) {
    if (pick && !pick(t)) continue;
    // with the alignment padding, so that neighbouring tensors' ranges touch
    const std::size_t lo = t.offset,
                      hi = t.offset + aligned_bytes(t.size * sizeof(float)) / sizeof(float);
    if (t.layer < 0) {
      if (!edges.empty() && edges.back().second == lo && hi - edges.back().first <= cap) {
        edges.back().second = hi;
      } else {
        edges.emplace_back(lo, hi);
      }
    } else if (!runs.empty() && runs.back().layer == t.layer && runs.back().hi == lo) {
      runs.back().hi = hi;
    } else {
      runs.push_back({lo, hi, t.layer});
    }
  }
  // last layer first: grow a bucket downwards while it fits and the runs touch
  bool open = false;
  std::size_t lo = 0, hi = 0;
  int ready = -1;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    const std::size_t size = it->hi - it->lo;
    if (open && (hi - it->lo > cap || it->hi != lo)) {
      emit(lo, hi, ready);
      open = false;
    }
    if (!open) {
      hi = it->hi;
      open = true;
    }
    lo = it->lo;
    ready = it->layer;
    if (size >= cap) { // a run larger than a bucket gets buckets of its own
      emit(lo, hi, ready);
      open = false;
    }
  }
  if (open) emit(lo, hi, ready);
  for (const auto& [elo, ehi] : edges) emit(elo, ehi, -1);
  return out;
}

GradSync::GradSync(float* grads, std::vector<GradBucket> buckets, MPI_Comm dp, Overlap overlap,
                   AllreduceOptions opt, const Backend& be, std::unique_ptr<cuda::NcclComm> nccl,
                   ShardTarget zero)
    : grads_(grads), buckets_(std::move(buckets)), launched_(buckets_.size(), 0), overlap_(overlap),
      watchdog_(opt.watchdog), be_(be), nccl_(std::move(nccl)), zero_(std::move(zero)) {
  if (nccl_) return;    // no MPI communicator, reducer, thread or host copies
  if (!be_.on_host()) { // MPI reduces host copies of the buckets (docs/cuda.md)
    std::size_t extent = 0;
    for (const GradBucket& k : buckets_) extent = std::max(extent, k.offset + k.count);
    host_.assign(extent, 0.0f);
  }
  if (overlap_ == Overlap::none) {
    comm_ = dp;
  } else {
    PT_MPI(MPI_Comm_dup(dp, &comm_));
  }
  if (scatters()) {
    what_ = "the ZeRO-1 gradient reduce-scatter (dp group)";
    group_ = std::make_unique<ReduceComm>(comm_, *watchdog_, what_);
    const auto p = static_cast<std::size_t>(group_->size);
    std::size_t widest = 0;
    for (std::size_t each : zero_.each) widest = std::max(widest, each * p);
    if (overlap_ != Overlap::poll) padded_.resize(widest);
    if (overlap_ == Overlap::poll) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const std::size_t count = buckets_[b].count, each = zero_.each[b];
        const std::size_t r = static_cast<std::size_t>(group_->rank);
        received_.emplace_back(p * (std::min(count, each * (r + 1)) - std::min(count, each * r)));
      }
    }
  } else if (overlap_ != Overlap::poll) {
    reducer_ = std::make_unique<Allreducer>(comm_, opt);
  }
  if (overlap_ == Overlap::thread) thread_ = std::thread([this] { worker(); });
}

void GradSync::scatter(std::size_t b, const float* data) {
  const std::size_t count = buckets_[b].count, each = zero_.each[b];
  std::copy(data, data + count, padded_.begin());
  std::fill(padded_.begin() + static_cast<std::ptrdiff_t>(count),
            padded_.begin() + static_cast<std::ptrdiff_t>(each * group_->size), 0.0f);
  reduce_scatter_blocks(padded_.data(), zero_.shard + zero_.at[b], each, *group_, tmp_);
}

// Every rank's part of this rank's block of bucket b (the bucket's floats, not padded: a short
// or empty last block sends what it has), received block after block in rank order.
void GradSync::start_scatter(std::size_t b, const float* data) {
  const std::size_t count = buckets_[b].count, each = zero_.each[b];
  const int p = group_->size;
  const auto at = [&](int k) { return std::min(count, each * static_cast<std::size_t>(k)); };
  const int mine = static_cast<int>(at(group_->rank + 1) - at(group_->rank));
  std::vector<int> sc(static_cast<std::size_t>(p)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  for (int k = 0; k < p; ++k) {
    const auto i = static_cast<std::size_t>(k);
    sc[i] = static_cast<int>(at(k + 1) - at(k));
    sd[i] = static_cast<int>(at(k));
    rc[i] = mine;
    rd[i] = k * mine;
  }
  MPI_Request req;
  PT_MPI(MPI_Ialltoallv(data, sc.data(), sd.data(), MPI_FLOAT, received_[b].data(), rc.data(),
                        rd.data(), MPI_FLOAT, comm_, &req));
  requests_.push_back(req);
  received_from_.push_back(b);
  watchdog_->count_collective();
}

// The received blocks summed in rank order, as reduce_scatter_blocks adds them; the padding
// beyond the bucket's end is zero there too.
void GradSync::collect(std::size_t b) {
  const std::size_t each = zero_.each[b];
  const std::size_t mine = received_[b].size() / static_cast<std::size_t>(group_->size);
  float* out = zero_.shard + zero_.at[b];
  const float* in = received_[b].data();
  std::copy(in, in + mine, out);
  for (int k = 1; k < group_->size; ++k) {
    const float* x = in + static_cast<std::size_t>(k) * mine;
    for (std::size_t i = 0; i < mine; ++i) out[i] += x[i];
  }
  std::fill(out + mine, out + each, 0.0f);
}

GradSync::~GradSync() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  reducer_.reset();
  if (!nccl_ && overlap_ != Overlap::none && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

float* GradSync::stage_out(std::size_t b) {
  const GradBucket& k = buckets_[b];
  if (host_.empty()) return grads_ + k.offset;
  be_.copy(host_.data() + k.offset, grads_ + k.offset, k.count * sizeof(float));
  be_.synchronize();
  return host_.data() + k.offset;
}

void GradSync::worker() {
  for (;;) {
    std::size_t b = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return; // stop_
      b = queue_.front();
      queue_.pop_front();
    }
    const double t0 = wall_time();
    try {
      if (!error_ && scatters()) scatter(b, reduced(b));
      if (!error_ && !scatters()) reducer_->sum(reduced(b), buckets_[b].count);
    } catch (...) {
      error_ = std::current_exception(); // rethrown by finish() on the trainer's thread
    }
    std::lock_guard<std::mutex> lock(mu_);
    busy_s_ += wall_time() - t0;
    ++done_;
    cv_.notify_all();
  }
}

void GradSync::launch(std::size_t b) {
  launched_[b] = 1;
  const GradBucket& k = buckets_[b];
  if (nccl_) {
    nccl_->sum(grads_ + k.offset, k.count); // queued after the backward's ops so far
    return;
  }
  float* data = stage_out(b);
  if (overlap_ == Overlap::thread) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(b);
      ++queued_;
    }
    cv_.notify_all();
  } else if (overlap_ == Overlap::poll && scatters()) {
    start_scatter(b, data);
  } else if (overlap_ == Overlap::poll) {
    MPI_Request req;
    PT_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(k.count), MPI_FLOAT, MPI_SUM, comm_,
                          &req));
    requests_.push_back(req);
    watchdog_->count_collective();
  }
  // none: finish() reduces it
}

void GradSync::layer_done(int layer) {
  if (!nccl_ && overlap_ == Overlap::none) return;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched_[b] && buckets_[b].ready_layer >= 0 && buckets_[b].ready_layer >= layer) {
      launch(b);
      ++early_;
    }
  }
  poll();
}

void GradSync::poll() {
  if (overlap_ != Overlap::poll || requests_.empty()) return;
  int flag = 0;
  PT_MPI(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                     MPI_STATUSES_IGNORE));
}

void GradSync::finish(GradSyncStats& stats) {
  const double t0 = wall_time();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (launched_[b]) continue;
    if (!nccl_ && overlap_ == Overlap::none && scatters()) {
      scatter(b, stage_out(b));
    } else if (!nccl_ && overlap_ == Overlap::none) {
      reducer_->sum(stage_out(b), buckets_[b].count);
    } else {
      launch(b);
    }
  }
  if (nccl_) {
    nccl_->wait();
  } else if (overlap_ == Overlap::thread) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ == queued_; });
    stats.busy_s += busy_s_;
    busy_s_ = 0.0;
  } else if (overlap_ == Overlap::poll) {
    for (MPI_Request& r : requests_) {
      watchdog_->wait(r, scatters()
                             ? "the ZeRO-1 gradient reduce-scatter (comm.overlap = \"poll\")"
                             : "the data-parallel gradient all-reduce (comm.overlap = \"poll\")");
    }
    requests_.clear();
    for (std::size_t b : received_from_) collect(b);
    received_from_.clear();
  }
  if (!host_.empty() && !error_ && !scatters()) { // ZeRO-1's sums are in the shard
    for (const GradBucket& k : buckets_) {
      be_.copy(grads_ + k.offset, host_.data() + k.offset, k.count * sizeof(float));
    }
    be_.synchronize();
  }
  const double waited = wall_time() - t0;
  stats.exposed_s += waited;
  if (nccl_ || overlap_ != Overlap::thread) stats.busy_s += waited;
  stats.buckets_early += early_;
  early_ = 0;
  std::fill(launched_.begin(), launched_.end(), 0);
  if (error_) std::rethrow_exception(error_);
}

} // namespace pt
