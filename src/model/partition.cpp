#include "model/partition.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/param_layout.hpp"

namespace pt {

BlockCosts parameter_costs(const ModelConfig& m) {
  const double C = m.d_model, V = m.vocab_size, T = m.seq_len;
  BlockCosts c;
  const bool gpt2 = m.arch == Arch::gpt2;
  c.embedding = V * C + (gpt2 ? T * C : 0.0);
  c.layer = static_cast<double>(layer_params(m));
  c.head = (gpt2 ? 2.0 : 1.0) * C + (tied(m) ? 0.0 : V * C);
  return c;
}

std::vector<double> stage_costs(const std::vector<int>& counts, const BlockCosts& costs) {
  std::vector<double> out;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    double c = counts[s] * costs.layer;
    if (s == 0) c += costs.embedding;
    if (s + 1 == counts.size()) c += costs.head;
    out.push_back(c);
  }
  return out;
}

namespace {

std::vector<int> uniform(int n_layer, int stages) {
  std::vector<int> counts(static_cast<std::size_t>(stages), n_layer / stages);
  std::vector<int> order(static_cast<std::size_t>(stages));
  std::iota(order.begin(), order.end(), 0);
  const double mid = (stages - 1) / 2.0;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return std::abs(a - mid) < std::abs(b - mid); });
  for (int i = 0; i < n_layer % stages; ++i)
    ++counts[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
  return counts;
}

// Greedy fill under a cap on stage cost; empty when the cap cannot be met.
std::vector<int> fill(int n_layer, int stages, const BlockCosts& c, double cap) {
  std::vector<int> counts;
  int left = n_layer;
  for (int s = 0; s < stages; ++s) {
    const int must_leave = stages - s - 1; // one layer for each later stage
    const double fixed = (s == 0 ? c.embedding : 0.0) + (s == stages - 1 ? c.head : 0.0);
    int take = 1;
    while (take < left - must_leave && fixed + (take + 1) * c.layer <= cap) ++take;
    if (s == stages - 1) take = left;
    if (fixed + take * c.layer > cap * (1 + 1e-12) || take < 1) return {};
    counts.push_back(take);
    left -= take;
  }
  return left == 0 ? counts : std::vector<int>{};
}

std::vector<int> balanced(int n_layer, int stages, const BlockCosts& c) {
  const double total = c.embedding + c.head + n_layer * c.layer;
  double lo = 0.0, hi = total;
  std::vector<int> best = fill(n_layer, stages, c, hi);
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    std::vector<int> f = fill(n_layer, stages, c, mid);
    if (f.empty()) {
      lo = mid;
    } else {
      hi = mid;
      best = f;
    }
  }
  return best;
}

} // namespace

std::vector<int> partition_layers(const ParallelConfig& p, int n_layer, int stages,
                                  const BlockCosts& costs) {
  switch (p.partition) {
  case PartitionKind::explicit_layers:
    return p.partition_layers;
  case PartitionKind::uniform:
    return uniform(n_layer, stages);
  case PartitionKind::params:
  case PartitionKind::time:
    break;
  }
  return balanced(n_layer, stages, costs);
}

StageSpec stage_spec(const std::vector<int>& counts, int stage) {
  StageSpec s;
  s.first = stage == 0;
  s.last = stage + 1 == static_cast<int>(counts.size());
  s.layer_begin = std::accumulate(counts.begin(), counts.begin() + stage, 0);
  s.layer_end = s.layer_begin + counts[static_cast<std::size_t>(stage)];
  return s;
}

} // namespace pt
