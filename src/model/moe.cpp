#include "model/moe.hpp"

#include <cmath>
#include <numeric>

namespace pt::moe {

void softmax_rows(float* x, float* lse, int N, int E) {
  for (int n = 0; n < N; ++n) {
    float* row = x + static_cast<std::size_t>(n) * E;
    double mx = row[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(row[e]));
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(row[e] - mx);
    for (int e = 0; e < E; ++e) row[e] = static_cast<float>(std::exp(row[e] - mx) / sum);
    lse[n] = static_cast<float>(mx + std::log(sum));
  }
}

namespace {

// token n's k largest probabilities, by falling value; ties to the lower expert
void top_k(int* chosen, const float* p, int E, int k) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    chosen[j] = best;
  }
}

} // namespace

void route(Routing& r, const float* probs, int N, int E, int k, int S, double capacity_factor) {
  r.N = N, r.E = E, r.k = k, r.S = S;
  const std::size_t NK = static_cast<std::size_t>(N) * k;
  r.expert.resize(NK);
  r.weight.resize(NK);
  r.assigned.assign(static_cast<std::size_t>(E), 0);
  for (int n = 0; n < N; ++n) {
    const float* p = probs + static_cast<std::size_t>(n) * E;
    int* chosen = r.expert.data() + static_cast<std::size_t>(n) * k;
    top_k(chosen, p, E, k);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += p[chosen[j]];
    for (int j = 0; j < k; ++j) {
      r.weight[static_cast<std::size_t>(n) * k + j] = static_cast<float>(p[chosen[j]] / sum);
      ++r.assigned[static_cast<std::size_t>(chosen[j])];
    }
  }
  const long cap = capacity_factor > 0.0 ? static_cast<long>(std::ceil(capacity_factor * N * k / E))
                                         : static_cast<long>(NK);
  // rows by expert, tokens in order within each; the shared experts take every token
  r.kept.resize(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    r.kept[static_cast<std::size_t>(e)] =
        static_cast<int>(std::min<long>(r.assigned[static_cast<std::size_t>(e)], cap));
  }
  r.dropped = static_cast<long>(NK) - std::accumulate(r.kept.begin(), r.kept.end(), 0L);
  r.start.assign(static_cast<std::size_t>(E + S + 1), 0);
  for (int x = 0; x < E + S; ++x) {
    r.start[static_cast<std::size_t>(x) + 1] =
        r.start[static_cast<std::size_t>(x)] + (x < E ? r.kept[static_cast<std::size_t>(x)] : N);
  }
  r.token.resize(static_cast<std::size_t>(r.rows()));
  r.row.assign(static_cast<std::size_t>(N) * r.slots(), -1);
  std::vector<int> next(r.start.begin(), r.start.end() - 1);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < r.slots(); ++j) {
      const int x = j < k ? r.expert[static_cast<std::size_t>(n) * k + j] : E + (j - k);
      int& at = next[static_cast<std::size_t>(x)];
      if (at == r.start[static_cast<std::size_t>(x) + 1]) continue; // full: dropped
      r.token[static_cast<std::size_t>(at)] = n;
      r.row[static_cast<std::size_t>(n) * r.slots() + j] = at++;
    }
  }
}

double balance_loss(const Routing& r, const float* probs) {
  double sum = 0.0;
  for (int e = 0; e < r.E; ++e) {
    double p = 0.0;
    for (int n = 0; n < r.N; ++n) p += probs[static_cast<std::size_t>(n) * r.E + e];
    sum += (static_cast<double>(r.assigned[static_cast<std::size_t>(e)]) / r.N) * (p / r.N);
  }
  return r.E * sum;
}

double z_loss(const float* lse, int N) {
  double sum = 0.0;
  for (int n = 0; n < N; ++n) sum += static_cast<double>(lse[n]) * lse[n];
  return sum / N;
}

void router_backward(float* dlogits, const Routing& r, const float* probs, const float* lse,
                     const float* dweight, double aux_coef, double z_coef, double scale) {
  const int E = r.E, k = r.k;
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (int n = 0; n < r.N; ++n) {
    const float* p = probs + static_cast<std::size_t>(n) * E;
    const std::size_t s = static_cast<std::size_t>(n) * k;
    // the balance loss: d/dp_e of E * sum_e f_e * mean_n p_ne
    for (int e = 0; e < E; ++e) {
      dp[static_cast<std::size_t>(e)] =
          scale * aux_coef * E * r.assigned[static_cast<std::size_t>(e)] / (1.0 * r.N * r.N);
    }
    // w_j = p_j / sum_i p_i over the chosen: dp_j += (dw_j - sum_i dw_i w_i) / sum
    double sum = 0.0, dot = 0.0;
    for (int j = 0; j < k; ++j) {
      sum += p[r.expert[s + j]];
      dot += static_cast<double>(dweight[s + j]) * r.weight[s + j];
    }
    for (int j = 0; j < k; ++j)
      dp[static_cast<std::size_t>(r.expert[s + j])] += (dweight[s + j] - dot) / sum;
    // the softmax: dlogit_e = p_e (dp_e - sum_i p_i dp_i); the z-loss: 2 lse p_e / N
    double pdp = 0.0;
    for (int e = 0; e < E; ++e) pdp += p[e] * dp[static_cast<std::size_t>(e)];
    const double z = scale * z_coef * 2.0 * lse[n] / r.N;
    float* d = dlogits + static_cast<std::size_t>(n) * E;
    for (int e = 0; e < E; ++e) {
      d[e] = static_cast<float>(p[e] * (dp[static_cast<std::size_t>(e)] - pdp) + z * p[e]);
    }
  }
}

} // namespace pt::moe
