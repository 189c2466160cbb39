#include "plan/machine.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "util/errors.hpp"

namespace pt {

namespace {

// The optional keys of the compute model: machine.gemm, attention_efficiency, memory_gb_s,
// device, attention (docs/planner.md).
void read_compute_model(const toml::table& t, const std::string& path, Machine& m) {
  const auto bad = [&](const std::string& what) {
    return input_error("machine file '" + path + "': " + what + " (docs/planner.md)");
  };
  const auto positive = [&](const char* key, double upper) {
    const toml::node_view<const toml::node> v = t["machine"][key];
    if (!v) return 0.0;
    const std::optional<double> x = v.value<double>();
    if (!x || *x <= 0.0 || *x > upper) {
      throw bad(std::string("machine.") + key + " must be a number in (0, " +
                std::to_string(static_cast<long long>(upper)) + "]");
    }
    return *x;
  };
  if (const double a = positive("attention_efficiency", 1.0); a > 0.0) m.attention_efficiency = a;
  m.memory_bw = positive("memory_gb_s", 1e6) * 1e9;
  const std::string device = t["machine"]["device"].value_or(std::string("host"));
  if (device != "host" && device != "cuda")
    throw bad("machine.device must be \"host\" or \"cuda\"");
  m.gpu = device == "cuda";
  const std::string attention = t["machine"]["attention"].value_or(m.gpu ? "fused" : "unfused");
  if (attention != "fused" && attention != "unfused") {
    throw bad("machine.attention must be \"fused\" or \"unfused\"");
  }
  m.fused_attention = attention == "fused";
  if (const toml::array* a = t["machine"]["gemm"].as_array()) {
    for (const toml::node& row : *a) {
      const toml::array* r = row.as_array();
      double x[4] = {0, 0, 0, 0};
      for (std::size_t i = 0; r != nullptr && r->size() == 4 && i < 4; ++i) {
        x[i] = r->get(i)->value<double>().value_or(0.0);
      }
      if (x[0] <= 0 || x[1] <= 0 || x[2] <= 0 || x[3] <= 0) {
        throw bad("machine.gemm must be [[m, n, k, tflops], ...] with positive numbers");
      }
      m.gemm.push_back({x[0], x[1], x[2], x[3] * 1e12});
    }
  }
}

} // namespace

Machine read_machine(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw input_error("machine file '" + path + "': " + std::string(e.description()));
  }
  auto num = [&](const char* sec, const char* key) {
    const std::optional<double> v = t[sec][key].value<double>();
    if (!v || *v <= 0.0) {
      throw input_error("machine file '" + path + "': " + sec + "." + key +
                        " is missing or not a positive number (docs/planner.md)");
    }
    return *v;
  };
  Machine m;
  m.name = t["machine"]["name"].value_or(path);
  m.peak_flops = num("machine", "peak_tflops") * 1e12;
  m.efficiency = num("machine", "efficiency");
  m.memory_bytes = num("machine", "memory_gib") * 1073741824.0;
  m.ranks_per_node = static_cast<int>(num("machine", "ranks_per_node"));
  m.intra_bw = num("network", "intra_node_gb_s") * 1e9;
  m.intra_latency = num("network", "intra_node_latency_us") * 1e-6;
  m.inter_bw = num("network", "inter_node_gb_s") * 1e9;
  m.inter_latency = num("network", "inter_node_latency_us") * 1e-6;
  read_compute_model(t, path, m);
  if (const toml::array* a = t["machine"]["thread_speedup"].as_array()) {
    m.thread_speedup.clear();
    for (const toml::node& row : *a) {
      const toml::array* pair = row.as_array();
      const std::optional<std::int64_t> threads =
          pair != nullptr && pair->size() == 2 ? pair->get(0)->value<std::int64_t>() : std::nullopt;
      const std::optional<double> x =
          pair != nullptr && pair->size() == 2 ? pair->get(1)->value<double>() : std::nullopt;
      const int prev = m.thread_speedup.empty() ? 0 : m.thread_speedup.back().first;
      if (!threads || !x || *threads <= prev || *threads > 1 << 20 || *x <= 0.0) {
        throw input_error("machine file '" + path +
                          "': machine.thread_speedup must be [[threads, speedup], ...] with "
                          "threads ascending from 1 and positive speedups (docs/planner.md)");
      }
      m.thread_speedup.emplace_back(static_cast<int>(*threads), *x);
    }
    if (m.thread_speedup.empty() || m.thread_speedup.front().first != 1) {
      throw input_error("machine file '" + path +
                        "': machine.thread_speedup must start at 1 thread (docs/planner.md)");
    }
  }
  return m;
}

double Machine::speedup(int t) const {
  const auto& s = thread_speedup;
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (t <= s[i].first) {
      const double f = static_cast<double>(t - s[i - 1].first) / (s[i].first - s[i - 1].first);
      return s[i - 1].second + f * (s[i].second - s[i - 1].second);
    }
  }
  return s.back().second * t / s.back().first;
}

double Machine::gemm_rate(double m, double n, double k) const {
  if (gemm.empty()) return peak_flops * efficiency;
  // the table's range in each dimension
  double lo[3] = {1e300, 1e300, 1e300}, hi[3] = {0, 0, 0};
  for (const GemmRate& g : gemm) {
    const double d[3] = {g.m, g.n, g.k};
    for (int i = 0; i < 3; ++i) lo[i] = std::min(lo[i], d[i]), hi[i] = std::max(hi[i], d[i]);
  }
  const double shape[3] = {m, n, k};
  double q[3];
  for (int i = 0; i < 3; ++i) q[i] = std::log2(std::clamp(shape[i], lo[i], hi[i]));
  // inverse-distance weights (1 / d^4) in log2 space: an exact row is its own rate
  double weight = 0.0, sum = 0.0, rate = 0.0;
  for (const GemmRate& g : gemm) {
    const double d[3] = {std::log2(g.m), std::log2(g.n), std::log2(g.k)};
    double d2 = 0.0;
    for (int i = 0; i < 3; ++i) d2 += (q[i] - d[i]) * (q[i] - d[i]);
    if (d2 < 1e-12) {
      rate = g.flops;
      break;
    }
    weight += 1.0 / (d2 * d2);
    sum += g.flops / (d2 * d2);
  }
  if (rate == 0.0) rate = sum / weight;
  if (memory_bw > 0.0) { // bf16 operands and result each moved once
    rate = std::min(rate, memory_bw * 2.0 * m * n * k / (2.0 * (m * k + k * n + m * n)));
  }
  return efficiency * rate;
}

Machine Machine::with_threads(int t, int cores) const {
  Machine m = *this;
  const double node_memory = memory_bytes * ranks_per_node;
  m.ranks_per_node = std::max(1, cores / t);
  m.memory_bytes = node_memory / m.ranks_per_node;
  m.peak_flops = peak_flops * t;
  m.efficiency = efficiency * speedup(t) / t;
  for (GemmRate& g : m.gemm) g.flops *= t; // t cores' table, at efficiency's share as the peak
  m.memory_bw = memory_bw * t;
  return m;
}

} // namespace pt
