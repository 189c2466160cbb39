#include "telemetry/summary.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "comm/group.hpp"
#include "profile.hpp"
#include "util/errors.hpp"
#include "util/hash.hpp"

namespace pt {

void print_op_profile(const Watchdog& watchdog, MPI_Comm world, int steps, bool after_first,
                      double steps_s) {
  std::vector<OpTime> ops = op_times();
  std::vector<double> sec(ops.size() + 1), calls(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    sec[i] = ops[i].seconds;
    calls[i] = static_cast<double>(ops[i].calls);
  }
  sec.back() = steps_s;
  const std::string what = "the op profile's sums";
  watchdog.allreduce(sec.data(), static_cast<int>(sec.size()), MPI_DOUBLE, MPI_SUM, world, what);
  watchdog.allreduce(calls.data(), static_cast<int>(calls.size()), MPI_DOUBLE, MPI_SUM, world,
                     what);
  const int size = size_of(world);
  if (rank_in(world) != 0) return;
  double all = 0.0;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    all += sec[i];
    if (calls[i] > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return sec[a] > sec[b]; });
  std::printf("op profile (log.op_profile; %d step(s)%s, %d rank(s); each op's device time, or "
              "host time on the host):\n  %-26s %10s %12s %8s %10s\n",
              steps, after_first ? " after the first" : "", size, "op", "calls", "total ms",
              "% ops", "mean us");
  for (std::size_t i : order) {
    std::printf("  %-26s %10.0f %12.3f %7.1f%% %10.2f\n", ops[i].name, calls[i], 1e3 * sec[i],
                all > 0.0 ? 100.0 * sec[i] / all : 0.0, 1e6 * sec[i] / calls[i]);
  }
  std::printf("  all ops: %.3f ms of %.3f ms of steps, summed over ranks (%.1f%%); the rest is "
              "communication, waiting and host work\n",
              1e3 * all, 1e3 * sec.back(), sec.back() > 0.0 ? 100.0 * all / sec.back() : 0.0);
  std::fflush(stdout);
}

std::vector<ParamSummary> summarize_params(const std::vector<GptStage*>& chunks,
                                           const ParamLayout& whole, const Watchdog& watchdog,
                                           MPI_Comm tp, MPI_Comm pp, MPI_Comm ep) {
  const std::size_t G = whole.tensors().size();
  std::vector<double> sums(2 * G, 0.0);
  std::vector<unsigned long long> digests(G, 0);
  std::vector<float> host; // a device backend's tensor
  for (const auto& c : chunks) {
    for (const auto& tensor : c->layout().tensors()) {
      // ep: the other ranks of the group add their experts only
      if (!c->counts_in_norm(tensor) || (c->ep_rank() != 0 && !tensor.expert)) continue;
      const std::size_t g = whole.index_of(tensor);
      const float* w = readable(c->backend(), c->params() + tensor.offset, tensor.size, host);
      unsigned long long h = 1469598103934665603ULL;
      const auto* bytes = reinterpret_cast<const unsigned char*>(w);
      for (std::size_t i = 0; i < tensor.size * sizeof(float); ++i)
        h = (h ^ bytes[i]) * 1099511628211ULL;
      digests[g] = tensor.shard_dim < 0 && !tensor.expert ? h : 0; // a shard's are not the whole's
      double s2 = 0.0, proj = 0.0;
      for (std::size_t i = 0; i < tensor.size; ++i) {
        s2 += static_cast<double>(w[i]) * w[i];
        proj += w[i] * (2.0 * unit_open0(hash3(7, g, c->layout().global_index(tensor, i))) - 1.0);
      }
      sums[2 * g] = s2;
      sums[2 * g + 1] = proj;
    }
  }
  const std::string what = "the final parameters' summaries";
  for (MPI_Comm comm : {tp, pp, ep}) {
    if (comm == MPI_COMM_NULL) continue;
    watchdog.allreduce(sums.data(), static_cast<int>(2 * G), MPI_DOUBLE, MPI_SUM, comm, what);
    watchdog.allreduce(digests.data(), static_cast<int>(G), MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm,
                       what);
  }
  std::vector<ParamSummary> out;
  for (std::size_t g = 0; g < G; ++g) {
    out.push_back({whole.tensors()[g].name, digests[g], sums[2 * g], sums[2 * g + 1]});
  }
  return out;
}

} // namespace pt
