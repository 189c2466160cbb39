// The dp gradient reduction and ZeRO-1's shard on their own, over every rank of the job as one
// dp group, on a small model's layout with integer-valued gradients (sums exact in any order):
// - GradSync in each overlap mode (none, thread, poll; MPI_Allreduce and ring), its buckets
//   started layer by layer as the engine does, against one MPI_Allreduce of the whole buffer:
//   bit for bit, and buckets started early in thread and poll mode;
// - ZeroAdamW with its GradSync's reduce-scatter in each overlap mode: its runs cover every
//   element of every tensor exactly once over the dp ranks; the reduce-scatter leaves in each
//   run the summed gradients; step() gives every rank the parameters a whole AdamW gives from the
//   summed gradients, bit for bit, over three steps; the update count is its state's; and on
//   fractional gradients (whose sums depend on the order) poll's and thread's shards are overlap
//   none's, bit for bit.
// Prints "N passed, 0 failed" on rank 0; exit code 1 on any failure.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/grad_sync.hpp"
#include "comm/watchdog.hpp"
#include "optim/adamw.hpp"
#include "optim/zero_adamw.hpp"

namespace {

pt::ModelConfig small_model() {
  pt::ModelConfig m;
  m.n_layer = 3;
  m.n_head = 2;
  m.d_model = 16;
  m.seq_len = 8;
  m.vocab_size = 40;
  return m;
}

// Integer-valued floats that differ by rank, element and salt.
void fill(std::vector<float>& x, int rank, int salt) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>((rank * 17 + salt * 5 + static_cast<int>(i % 89)) % 61 - 30);
  }
}

struct Tally {
  int rank = 0, passed = 0, failed = 0;
  void check(bool ok, const char* what) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_CXX_BOOL, MPI_LAND, MPI_COMM_WORLD);
    ok ? ++passed : ++failed;
    if (!ok && rank == 0) std::printf("FAIL: %s\n", what);
  }
};

// GradSync with `overlap` and `algo` against MPI_Allreduce, buckets of about 600 floats.
void grad_sync_case(Tally& t, const pt::ParamLayout& lay, pt::Overlap overlap,
                    pt::AllreduceAlgo algo, const pt::Watchdog& watchdog, const char* what) {
  std::vector<float> grads(lay.total()), want;
  pt::AllreduceOptions opt;
  opt.algo = algo;
  opt.watchdog = &watchdog;
  pt::GradSync sync(grads.data(), pt::make_buckets(lay, 600), MPI_COMM_WORLD, overlap, opt);
  bool early = overlap == pt::Overlap::none;
  for (int step = 0; step < 2; ++step) { // the second step reuses the buckets
    fill(grads, t.rank, step);
    want = grads;
    MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(want.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (int layer = small_model().n_layer - 1; layer >= 0; --layer) sync.layer_done(layer);
    pt::GradSyncStats stats;
    sync.finish(stats);
    early = early || stats.buckets_early > 0;
    t.check(std::memcmp(grads.data(), want.data(), grads.size() * sizeof(float)) == 0, what);
  }
  t.check(early, "buckets started during the backward");
}

// A ZeroAdamW and the GradSync that reduce-scatters into its shard, over every rank.
struct Zero {
  Zero(const pt::ParamLayout& lay, pt::Overlap overlap, const pt::Watchdog& watchdog)
      : grads(lay.total()), shard(lay, 600, MPI_COMM_WORLD, watchdog, pt::TrainConfig{}) {
    pt::AllreduceOptions opt;
    opt.watchdog = &watchdog;
    sync = std::make_unique<pt::GradSync>(grads.data(), pt::make_buckets(lay, 600), MPI_COMM_WORLD,
                                          overlap, opt, pt::host_backend(), nullptr,
                                          shard.shard_target());
  }
  // the engine's calls: layers from the last down, then finish, then the optimizer's reduce
  int reduce() {
    for (int layer = small_model().n_layer - 1; layer >= 0; --layer) sync->layer_done(layer);
    pt::GradSyncStats stats;
    sync->finish(stats);
    shard.reduce(grads.data());
    return stats.buckets_early;
  }
  std::vector<float> grads;
  pt::ZeroAdamW shard;
  std::unique_ptr<pt::GradSync> sync;
};

// ZeroAdamW against a whole AdamW on the summed gradients.
void zero_case(Tally& t, const pt::ParamLayout& lay, const pt::Watchdog& watchdog,
               pt::Overlap overlap) {
  const std::string mode = std::string(" (overlap ") + pt::name(overlap) + ")";
  pt::TrainConfig tc;
  Zero z(lay, overlap, watchdog);
  pt::ZeroAdamW& shard = z.shard;
  pt::AdamW whole(lay, tc);
  const std::vector<pt::ParamTensor>& tensors = lay.tensors();

  // every element of every tensor in exactly one rank's runs
  std::vector<int> cover(lay.total(), 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    for (const pt::Optimizer::Run& r : shard.runs(i)) {
      for (std::size_t e = 0; e < r.size; ++e) ++cover[tensors[i].offset + r.begin + e];
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, cover.data(), static_cast<int>(cover.size()), MPI_INT, MPI_SUM,
                MPI_COMM_WORLD);
  bool once = true;
  for (const pt::ParamTensor& x : tensors) {
    for (std::size_t e = 0; e < x.size; ++e) once = once && cover[x.offset + e] == 1;
  }
  t.check(once, ("ZeRO-1's runs cover every element once" + mode).c_str());

  std::vector<float> params(lay.total()), reference(lay.total());
  fill(params, 0, 9); // the same on every rank
  for (float& p : params) p *= 0.01f;
  reference = params;
  bool reduced = true, same = true;
  int early = 0;
  for (int step = 0; step < 3; ++step) {
    fill(z.grads, t.rank, step);
    std::vector<float> sum = z.grads;
    MPI_Allreduce(MPI_IN_PLACE, sum.data(), static_cast<int>(sum.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    early += z.reduce();
    for (const pt::ZeroAdamW::Piece& p : shard.pieces()) {
      const float* mine = shard.shard_grads() + p.shard_offset;
      const float* full = sum.data() + tensors[p.tensor].offset + p.begin;
      reduced = reduced && std::memcmp(mine, full, p.size * sizeof(float)) == 0;
    }
    shard.step(params.data(), nullptr, 1e-2, 0.5f);
    whole.step(reference.data(), sum.data(), 1e-2, 0.5f);
    for (const pt::ParamTensor& x : tensors) {
      same = same && std::memcmp(params.data() + x.offset, reference.data() + x.offset,
                                 x.size * sizeof(float)) == 0;
    }
  }
  t.check(reduced,
          ("ZeRO-1's reduce-scatter leaves the summed gradients in each run" + mode).c_str());
  t.check(same, ("ZeRO-1's steps equal a whole AdamW's on the summed gradients" + mode).c_str());
  t.check(shard.updates() == 3 && shard.sharded() && !whole.sharded(),
          ("ZeRO-1's update count and sharding" + mode).c_str());
  t.check((early > 0) == (overlap != pt::Overlap::none),
          ("buckets reduce-scattered during the backward only with overlap" + mode).c_str());

  // fractional gradients: their sums depend on the order, which overlap none fixes (rank order)
  Zero ref(lay, pt::Overlap::none, watchdog);
  for (std::size_t i = 0; i < z.grads.size(); ++i) {
    z.grads[i] = ref.grads[i] =
        0.1f * static_cast<float>(t.rank + 1) + 1e-3f * static_cast<float>(i % 97);
  }
  z.reduce();
  ref.reduce();
  bool bits = true;
  for (const pt::ZeroAdamW::Piece& p : shard.pieces()) {
    bits =
        bits && std::memcmp(shard.shard_grads() + p.shard_offset,
                            ref.shard.shard_grads() + p.shard_offset, p.size * sizeof(float)) == 0;
  }
  t.check(bits, ("ZeRO-1's shard is overlap none's, bit for bit" + mode).c_str());
}

} // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  Tally t;
  MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
  {
    const pt::Watchdog watchdog(60.0, t.rank);
    const pt::ParamLayout lay(small_model(), pt::StageSpec{true, true, 0, 3});
    grad_sync_case(t, lay, pt::Overlap::none, pt::AllreduceAlgo::mpi, watchdog, "overlap none");
    grad_sync_case(t, lay, pt::Overlap::poll, pt::AllreduceAlgo::mpi, watchdog, "overlap poll");
    if (provided == MPI_THREAD_MULTIPLE) {
      grad_sync_case(t, lay, pt::Overlap::thread, pt::AllreduceAlgo::ring, watchdog,
                     "overlap thread, ring");
    }
    zero_case(t, lay, watchdog, pt::Overlap::none);
    zero_case(t, lay, watchdog, pt::Overlap::poll);
    if (provided == MPI_THREAD_MULTIPLE) zero_case(t, lay, watchdog, pt::Overlap::thread);
  }
  if (t.rank == 0) std::printf("%d passed, %d failed\n", t.passed, t.failed);
  MPI_Finalize();
  return t.failed == 0 ? 0 : 1;
}
