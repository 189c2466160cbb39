#include "plan/planner.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "backend.hpp"
#include "cuda/attention_kept.hpp"
#include "model/param_layout.hpp"
#include "plan/plan.hpp"
#include "util/errors.hpp"

namespace pt {

std::vector<std::string> Candidate::overrides() const {
  std::vector<std::string> o = {"parallel.pp=" + std::to_string(pp),
                                "parallel.dp=" + std::to_string(dp),
                                "parallel.tp=" + std::to_string(tp),
                                "parallel.ep=" + std::to_string(ep),
                                "parallel.virtual_stages=" + std::to_string(v),
                                "parallel.schedule=\"" + schedule + "\"",
                                "train.micro_batch=" + std::to_string(micro_batch),
                                "train.recompute=\"" + recompute + "\"",
                                "parallel.zero=" + std::to_string(zero),
                                std::string("parallel.sequence_parallel=") +
                                    (sp ? "true" : "false")};
  if (threads > 0) o.push_back("device.threads=" + std::to_string(threads));
  return o;
}

namespace {

// Seconds of a ring all-reduce of `bytes` over n ranks on a link.
double allreduce_s(double bytes, int n, double bw, double latency) {
  if (n < 2) return 0.0;
  return 2.0 * (n - 1) * (latency + bytes / n / bw);
}

// Seconds of an all-reduce of `bytes` over a group of n ranks, g of them on each node: a ring on
// the node's link where the group fits a node, else in two levels (a reduce-scatter and an
// all-gather inside each node around a ring of 1/g of the bytes among the nodes, each rank on its
// own inter-node link, as NCCL's rings over all of a node's network ports run).
double group_allreduce_s(double bytes, int n, int g, const Machine& mc) {
  if (n <= g) return allreduce_s(bytes, n, mc.intra_bw, mc.intra_latency);
  return allreduce_s(bytes, g, mc.intra_bw, mc.intra_latency) +
         allreduce_s(bytes / g, n / g, mc.inter_bw, mc.inter_latency);
}

// Seconds of work a rank does per micro-batch, by the schedule's kinds of action: forward,
// backward-input (with the attention core's and the element-wise passes' backward) and
// backward-weight; attn: the attention core's forward (what selective recompute repeats).
struct Work {
  double f = 0.0, bi = 0.0, bw = 0.0, attn = 0.0;
  Work& operator+=(const Work& o) {
    f += o.f, bi += o.bi, bw += o.bw, attn += o.attn;
    return *this;
  }
  Work operator+(const Work& o) const { return Work(*this) += o; }
  Work operator*(double x) const { return Work{f * x, bi * x, bw * x, attn * x}; }
};

// `count` products of `rows` rows of width k into n: the forward (rows, n, k), the input gradient
// (rows, k, n) and the weight gradient (k, n, rows), each at its shape's rate.
Work linear(const Machine& mc, double rows, double n, double k, double count = 1.0) {
  const double flops = 2.0 * rows * n * k * count;
  return Work{flops / mc.gemm_rate(rows, n, k), flops / mc.gemm_rate(rows, k, n),
              flops / mc.gemm_rate(k, n, rows), 0.0};
}

// Element-wise passes moving `bytes` forward: twice that in the backward-input.
Work elementwise(const Machine& mc, double bytes) {
  if (mc.memory_bw <= 0.0) return {};
  const double s = bytes / (mc.memory_bw * mc.efficiency);
  return Work{s, 2.0 * s, 0.0, 0.0};
}

// One block on a tp rank for a micro-batch of B sequences (an MoE block where `moe`): its
// products (an MoE layer's experts balanced: E / ep experts of ep B T top_k / E rows each), the
// attention core (4 B T^2 C / tp FLOPs forward, twice that backward, at the machine's attention
// share of the peak) and the element-wise passes: norms and residual sums, 10 values of the
// residual stream a row (N / tp rows under sequence parallelism), the MLP's activation 2 (GELU)
// or 3 (SwiGLU) values of its width, in the activation format.
Work block_work(const ModelConfig& m, bool moe, double B, int tp, bool sp, int ep,
                double value_bytes, const Machine& mc) {
  const double T = m.seq_len, C = m.d_model, N = B * T;
  const bool llama = m.arch == Arch::llama;
  Work w = linear(mc, N, static_cast<double>(qkv_rows(m)) / tp, C) + linear(mc, N, C, C / tp);
  double act = 0.0; // the MLP activation's values a token (all experts it goes to)
  const auto mlp = [&](double rows, double width, double count) {
    w += linear(mc, rows, (llama ? 2.0 : 1.0) * width / tp, C, count);
    w += linear(mc, rows, C, width / tp, count);
  };
  if (moe) {
    const double E = m.moe_experts, K = m.moe_top_k, S = m.moe_shared_experts;
    w += linear(mc, N, E, C); // the router
    mlp(N * ep * K / E, expert_width(m), E / ep);
    if (S > 0) mlp(N, expert_width(m), S);
    act = (K + S) * expert_width(m) / tp;
  } else {
    mlp(N, mlp_width(m), 1.0);
    act = static_cast<double>(mlp_width(m)) / tp;
  }
  const double attn =
      4.0 * B * T * T * C / tp / (mc.peak_flops * mc.attention_efficiency * mc.efficiency);
  w += Work{attn, 2.0 * attn, 0.0, attn};
  if (!mc.fused_attention) { // the scores written and read, the probabilities written and read
    const Work passes = elementwise(mc, value_bytes * 4.0 * B * (m.n_head / tp) * T * T);
    w += passes + Work{0.0, 0.0, 0.0, passes.f};
  }
  const double rows = sp && tp > 1 ? N / tp : N;
  w += elementwise(mc, value_bytes * (10.0 * rows * C + (llama ? 3.0 : 2.0) * N * act));
  return w;
}

// Candidate c's step: the pipeline's time and then the data-parallel all-reduce of the largest
// rank's fp32 gradients (`params` floats; with ep > 1 the experts' `experts` over dp / ep
// ranks), not overlapped; and the rates that follow.
void record_step(const RunConfig& cfg, const Machine& mc, double pipeline, double params,
                 double experts, Candidate& c) {
  const ModelConfig& m = cfg.model;
  const int dp_node = std::max(1, std::min(c.dp, mc.ranks_per_node / c.tp));
  const double dp_s =
      group_allreduce_s(4.0 * params, c.dp, dp_node, mc) +
      group_allreduce_s(4.0 * experts, c.dp / c.ep, std::min(c.dp / c.ep, dp_node), mc);
  c.step_time_s = pipeline + dp_s;
  const double tokens = static_cast<double>(cfg.train.global_batch) * m.seq_len;
  c.tokens_per_s = tokens / c.step_time_s;
  // hardware FLOP/s: the model's 6N + 6LCT per token, plus recompute's extra forward
  const double recompute_share = c.recompute == "full" ? 4.0 / 3.0 : 1.0;
  c.tflops_per_rank = flops_per_token(m) * recompute_share * c.tokens_per_s /
                      (static_cast<double>(c.pp) * c.dp * c.tp) / 1e12;
  c.mfu = flops_per_token(m) * c.tokens_per_s / (static_cast<double>(c.pp) * c.dp * c.tp) /
          mc.peak_flops;
}

// The step-time model of one layout (docs/planner.md): each block's and the head's products at
// the machine's rate for their shapes, the attention core and the element-wise passes (above);
// full recompute repeats the forward in the backward, selective the attention core; tensor-parallel
// all-reduces inside each action, one pipeline message per F and B; the schedule simulated with
// these per-rank costs; then the data-parallel reduction of the largest rank's gradients, not
// overlapped (expert parallelism: the experts' over dp / ep ranks, the rest over dp). An MoE
// layer's all-to-alls (two in the forward, two in the backward, two more under full recompute)
// move each rank's routed rows, balanced, pairwise over the ep group.
void predict_time(const RunConfig& cfg, const Plan& plan, const Machine& mc, Candidate& c) {
  const ModelConfig& m = cfg.model;
  const double B = cfg.train.micro_batch, T = m.seq_len, C = m.d_model, V = m.vocab_size;
  const double tp = c.tp;
  // activations and their messages in the activation format (docs/precision.md)
  const double value_bytes = activation_format(cfg.device.precision) == ActFormat::bf16 ? 2.0 : 4.0;
  const double act_bytes = value_bytes * B * T * C;
  const Work dense = block_work(m, false, B, c.tp, c.sp, c.ep, value_bytes, mc);
  const Work moe =
      m.moe_experts > 0 ? block_work(m, true, B, c.tp, c.sp, c.ep, value_bytes, mc) : Work{};
  // the head: its product and the fp32 logits written and read, forward and backward
  Work head = linear(mc, B * T, V / tp, C);
  head += elementwise(mc, 2.0 * 4.0 * B * T * V / tp);
  const bool tp_in_node = c.tp <= mc.ranks_per_node;
  const double tp_ar = allreduce_s(act_bytes, c.tp, tp_in_node ? mc.intra_bw : mc.inter_bw,
                                   tp_in_node ? mc.intra_latency : mc.inter_latency);
  const bool pp_in_node = c.pp * c.dp * c.tp <= mc.ranks_per_node;
  const double msg = (pp_in_node ? mc.intra_latency : mc.inter_latency) +
                     act_bytes / (c.sp ? tp : 1.0) / (pp_in_node ? mc.intra_bw : mc.inter_bw);
  const bool ep_in_node = c.ep * c.tp <= mc.ranks_per_node;
  const double a2a_block = 4.0 * B * T * m.moe_top_k * C / c.ep;
  const double a2a = (c.ep - 1) * ((ep_in_node ? mc.intra_latency : mc.inter_latency) +
                                   a2a_block / (ep_in_node ? mc.intra_bw : mc.inter_bw));
  const schedule::Schedule& s = plan.schedule;
  std::vector<schedule::Costs> costs(static_cast<std::size_t>(c.pp));
  double heaviest_params = 0.0, heaviest_experts = 0.0;
  for (int r = 0; r < c.pp; ++r) {
    Work w;
    double extra = 0.0, ar = 0.0, params = 0.0, experts = 0.0;
    for (int ch = 0; ch < s.v; ++ch) {
      const StageSpec spec = stage_spec(plan.layers, s.stage_of(r, ch));
      const int L = spec.layer_end - spec.layer_begin;
      int moe_layers = 0;
      for (int l = spec.layer_begin; l < spec.layer_end; ++l) moe_layers += is_moe_layer(m, l);
      const Work blocks = dense * (L - moe_layers) + moe * moe_layers;
      w += blocks;
      if (spec.last) w += head;
      extra += c.recompute == "full" ? blocks.f : (c.recompute == "selective" ? blocks.attn : 0);
      ar += (2.0 * L + (spec.first ? 1 : 0)) * tp_ar; // per direction, per micro-batch
      ar += 2.0 * moe_layers * a2a; // the exchanges: per direction, as the all-reduces
      extra += c.recompute == "full" ? 2.0 * moe_layers * a2a : 0.0;
      const ParamLayout layout(m, spec, 0, c.tp, 0, c.ep);
      for (const ParamTensor& t : layout.tensors()) {
        (t.expert ? experts : params) += static_cast<double>(t.size);
      }
    }
    heaviest_params = std::max(heaviest_params, params);
    heaviest_experts = std::max(heaviest_experts, experts);
    // the simulator's actions are per chunk: a chunk's share of the rank's work, and a message
    const double per_chunk = 1.0 / s.v;
    costs[static_cast<std::size_t>(r)] =
        schedule::Costs{(w.f + ar) * per_chunk + msg, (w.bi + w.bw + extra + ar) * per_chunk + msg,
                        (w.bi + extra + ar) * per_chunk + msg, w.bw * per_chunk, 0.0};
  }
  const schedule::Simulation sim = schedule::simulate(s, costs);
  double pipeline = sim.step_time;
  if (!sim.step_ends.empty()) { // 2bw: the steady middle step
    pipeline = sim.step_ends[1] - sim.step_ends[0];
  }
  c.bubble = schedule::step_bubble(sim);
  record_step(cfg, mc, pipeline, heaviest_params, heaviest_experts, c);
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k) {
    if (n % k == 0) d.push_back(k);
  }
  return d;
}

// The expert-parallel degrees of an MoE model on dp ranks: divisors of dp and of the experts
// (a dense model: 1).
std::vector<int> expert_degrees(const ModelConfig& m, int dp) {
  std::vector<int> out;
  for (int ep : divisors(dp)) {
    if (ep == 1 || (m.moe_experts > 0 && m.moe_experts % ep == 0)) out.push_back(ep);
  }
  return out;
}

// The host backend with the CUDA backend's attention (its cuDNN path: the statistics and bf16
// copies of the output and qkv, a (T,T) scratch tile), for the memory of a GPU rank.
const Backend& gpu_attention() {
  static const Backend be = [] {
    Backend b = host_backend();
    b.attention_floats = [](int B, int T, int C, int NH) {
      return (cuda_ops::CudnnKept(B, T, C, NH).end + 3) / 4;
    };
    b.attention_keeps_qkv = [](int, int, int, int) { return true; };
    b.attention_scratch = [](int, int T, int) { return static_cast<std::size_t>(T) * T; };
    return b;
  }();
  return be;
}

// The schedules tried on pp ranks, with their chunks a rank: 1F1B, interleaved with 2 and 4
// chunks, ZB-H1, ZB-V and DualPipeV (and "search" where asked); one stage: 1F1B stands for all
// (the same work). A schedule or virtual_stages fixed by the caller narrows the list.
std::vector<std::pair<std::string, int>>
schedule_choices(int pp, bool with_search, const std::map<std::string, std::string>& fixed) {
  std::vector<std::pair<std::string, int>> all = {{"1f1b", 1}};
  if (pp > 1) {
    all.insert(
        all.end(),
        {{"interleaved", 2}, {"interleaved", 4}, {"zb-h1", 1}, {"zb-v", 2}, {"dualpipev", 2}});
    if (with_search) all.emplace_back("search", 1);
  }
  const auto sched = fixed.find("parallel.schedule");
  if (sched != fixed.end()) {
    all.erase(std::remove_if(all.begin(), all.end(),
                             [&](const auto& c) { return c.first != sched->second; }),
              all.end());
    if (all.empty()) all.emplace_back(sched->second, schedule::default_chunks(sched->second));
  }
  if (fixed.count("parallel.virtual_stages")) { // the chunks are the caller's: one per schedule
    all.erase(std::unique(all.begin(), all.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              all.end());
  }
  return all;
}

// Those that fit first, then by predicted step time and memory.
void rank_candidates(std::vector<Candidate>& c) {
  std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(!a.fits, a.step_time_s, a.mem_bytes_per_rank) <
           std::make_tuple(!b.fits, b.step_time_s, b.mem_bytes_per_rank);
  });
}

// Candidate c as a run of the deck: its memory per rank and predicted time, filled in. False
// when the deck refuses the layout, no schedule fits it, or tp spans nodes.
bool evaluate(const std::string& deck_text, const std::string& deck_path,
              const std::vector<std::string>& overrides,
              const std::map<std::string, std::string>& fixed, int ranks, const Machine& mc,
              const ModelConfig& m, Candidate& c) {
  std::vector<std::string> o = overrides;
  for (const std::string& x : c.overrides()) {
    if (!fixed.count(x.substr(0, x.find('=')))) o.push_back(x);
  }
  RunConfig cfg;
  try {
    cfg = parse_deck(deck_text, deck_path, o, ranks);
  } catch (const Error&) {
    return false; // not a valid layout of this model and batch
  }
  c.pp = cfg.parallel.pp, c.dp = cfg.parallel.dp, c.tp = cfg.parallel.tp, c.ep = cfg.parallel.ep;
  c.v = cfg.parallel.virtual_stages;
  if (mc.gpu) cfg.device.kind = DeviceKind::cuda; // memory as the CUDA backend allocates it
  if (c.tp > mc.ranks_per_node) return false;
  Plan plan;
  // partition = "time" profiles on the real machine; here its FLOPs stand in
  plan.costs = cfg.parallel.partition == PartitionKind::time
                   ? BlockCosts{0.0, 2.0 * layer_matrix_params(m) / m.d_model + 4.0 * m.seq_len,
                                2.0 * m.vocab_size}
                   : parameter_costs(m);
  plan.layers = partition_layers(cfg.parallel, m.n_layer,
                                 cfg.parallel.pp * cfg.parallel.virtual_stages, plan.costs);
  try { // a named schedule, or (fixed by the caller) "search" for these stage costs, with fewer
        // improvement tries than a run makes (one search per layout)
    plan.schedule = run_schedule(cfg, stage_costs(plan.layers, plan.costs), 100);
  } catch (const Error&) {
    return false;
  }
  const int dp_node = std::max(1, std::min(c.dp, mc.ranks_per_node / c.tp));
  for (int r = 0; r < c.pp; ++r) {
    c.mem_bytes_per_rank = std::max(
        c.mem_bytes_per_rank,
        predict_memory(cfg, plan, r, dp_node, mc.gpu ? &gpu_attention() : nullptr).total());
  }
  c.fits = c.mem_bytes_per_rank <= 0.9 * mc.memory_bytes;
  predict_time(cfg, plan, mc, c);
  return true;
}

} // namespace

std::vector<Candidate> plan_layouts(const std::string& deck_text, const std::string& deck_path,
                                    const std::vector<std::string>& overrides, int ranks,
                                    const Machine& mc, bool with_search) {
  std::map<std::string, std::string> fixed; // what the command line fixes: key -> value
  std::vector<std::string> model_overrides; // and those that are not layout keys
  for (const std::string& o : overrides) {
    std::string value = o.substr(o.find('=') + 1);
    value.erase(std::remove(value.begin(), value.end(), '"'), value.end());
    fixed[o.substr(0, o.find('='))] = value;
    if (o.rfind("parallel.", 0) != 0) model_overrides.push_back(o);
  }
  // the model, on one rank (the deck's own layout may not fit it)
  std::vector<std::string> one = {"parallel.pp=1",
                                  "parallel.dp=1",
                                  "parallel.tp=1",
                                  "parallel.ep=1",
                                  "parallel.virtual_stages=1",
                                  "parallel.schedule=\"1f1b\"",
                                  "parallel.zero=0",
                                  "parallel.sequence_parallel=false",
                                  "parallel.partition=\"uniform\""};
  one.insert(one.end(), model_overrides.begin(), model_overrides.end());
  const ModelConfig m = parse_deck(deck_text, deck_path, one, 1).model;
  std::vector<Candidate> out;
  auto pick = [&](const char* key, std::vector<std::string> values) {
    const auto it = fixed.find(key);
    return it != fixed.end() ? std::vector<std::string>{it->second} : values;
  };
  auto pick_int = [&](const char* key, std::vector<int> values) {
    const auto it = fixed.find(key);
    return it != fixed.end() ? std::vector<int>{std::atoi(it->second.c_str())} : values;
  };
  for (int tp : pick_int("parallel.tp", divisors(ranks))) {
    for (int pp : pick_int("parallel.pp", divisors(std::max(1, ranks / tp)))) {
      const int dp = std::max(1, ranks / (tp * pp));
      for (const auto& [sched, chunks] : schedule_choices(pp, with_search, fixed)) {
        for (const std::string& mb : pick("train.micro_batch", {"1", "2", "4", "8"})) {
          for (const std::string& rc : pick("train.recompute", {"none", "selective", "full"})) {
            for (int zero :
                 pick_int("parallel.zero", dp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0})) {
              for (int sp : fixed.count("parallel.sequence_parallel")
                                ? std::vector<int>{fixed["parallel.sequence_parallel"] == "true"}
                                : (tp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0})) {
                for (int ep : pick_int("parallel.ep", expert_degrees(m, dp))) {
                  Candidate c;
                  c.pp = pp, c.dp = dp, c.tp = tp, c.ep = ep, c.schedule = sched;
                  c.recompute = rc, c.micro_batch = std::stoi(mb), c.zero = zero, c.sp = sp == 1;
                  c.v = chunks;
                  if (evaluate(deck_text, deck_path, overrides, fixed, ranks, mc, m, c)) {
                    out.push_back(c);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  rank_candidates(out);
  return out;
}

std::vector<Candidate> plan_hybrid(const std::string& deck_text, const std::string& deck_path,
                                   const std::vector<std::string>& overrides, int nodes, int cores,
                                   const Machine& machine, bool with_search) {
  int fixed = 0;
  for (const std::string& o : overrides) {
    if (o.rfind("device.threads=", 0) == 0) fixed = std::atoi(o.c_str() + 15);
  }
  std::vector<Candidate> out;
  for (int t : fixed > 0 ? std::vector<int>{fixed} : divisors(cores)) {
    if (cores % t != 0) continue;
    std::vector<std::string> o = overrides;
    if (fixed == 0) o.push_back("device.threads=" + std::to_string(t));
    for (Candidate& c : plan_layouts(deck_text, deck_path, o, nodes * (cores / t),
                                     machine.with_threads(t, cores), with_search)) {
      c.threads = t;
      out.push_back(c);
    }
  }
  rank_candidates(out);
  return out;
}

namespace {

// cores > 0: a ranks x threads plan of `ranks` nodes of that many cores (plan_hybrid)
void print_table(const std::vector<Candidate>& c, std::size_t top, const Machine& mc, int ranks,
                 int cores) {
  if (cores > 0) {
    std::printf("pipetrain plan: %d node(s) of %d cores, ranks x threads, machine '%s' (%.3g "
                "TFLOP/s peak per core, %.0f%% sustained on one thread, %.0f GiB per node)\n",
                ranks, cores, mc.name.c_str(), mc.peak_flops / 1e12, 100 * mc.efficiency,
                mc.memory_bytes * mc.ranks_per_node / 1073741824.0);
  } else {
    std::printf("pipetrain plan: %d ranks, %d per node, machine '%s' (%.0f TFLOP/s peak per rank "
                "at %.0f%% sustained, %.0f GiB)\n",
                ranks, mc.ranks_per_node, mc.name.c_str(), mc.peak_flops / 1e12,
                100 * mc.efficiency, mc.memory_bytes / 1073741824.0);
  }
  std::printf("%4s %4s %4s %4s %3s %3s %2s %-10s %3s %-9s %4s %3s %9s %11s %8s %6s %7s %9s %4s\n",
              "rank", "pp", "dp", "tp", "ep", "thr", "v", "schedule", "mb", "recompute", "zero",
              "sp", "step s", "tokens/s", "TFLOP/s", "MFU", "bubble", "GiB/rank", "fits");
  for (std::size_t i = 0; i < c.size() && i < top; ++i) {
    const Candidate& k = c[i];
    std::printf("%4zu %4d %4d %4d %3d %3d %2d %-10s %3d %-9s %4d %3s %9.3f %11.0f %8.1f %5.1f%% "
                "%6.1f%% %9.2f %4s\n",
                i + 1, k.pp, k.dp, k.tp, k.ep, std::max(1, k.threads), k.v, k.schedule.c_str(),
                k.micro_batch, k.recompute.c_str(), k.zero, k.sp ? "on" : "off", k.step_time_s,
                k.tokens_per_s, k.tflops_per_rank, 100 * k.mfu, 100 * k.bubble,
                k.mem_bytes_per_rank / 1073741824.0, k.fits ? "yes" : "no");
  }
  if (!c.empty() && c.front().fits) {
    std::printf("best: ");
    for (const std::string& o : c.front().overrides()) std::printf("%s ", o.c_str());
    std::printf("\n");
  } else {
    std::printf("no layout fits %.0f GiB per rank: more ranks, or a smaller model or batch\n",
                mc.memory_bytes / 1073741824.0);
  }
}

void print_json(const std::vector<Candidate>& c, std::size_t top) {
  std::printf("[\n");
  for (std::size_t i = 0; i < c.size() && i < top; ++i) {
    const Candidate& k = c[i];
    std::printf("  {\"pp\": %d, \"dp\": %d, \"tp\": %d, \"ep\": %d, \"threads\": %d, "
                "\"virtual_stages\": %d, "
                "\"schedule\": "
                "\"%s\", \"micro_batch\": %d, \"recompute\": \"%s\", \"zero\": %d, "
                "\"sequence_parallel\": %s, \"step_time_s\": %.6g, \"tokens_per_s\": %.6g, "
                "\"tflops_per_rank\": %.6g, \"mfu\": %.6g, \"bubble\": %.6g, "
                "\"mem_bytes_per_rank\": %.0f, \"fits\": %s}%s\n",
                k.pp, k.dp, k.tp, k.ep, std::max(1, k.threads), k.v, k.schedule.c_str(),
                k.micro_batch, k.recompute.c_str(), k.zero, k.sp ? "true" : "false", k.step_time_s,
                k.tokens_per_s, k.tflops_per_rank, k.mfu, k.bubble, k.mem_bytes_per_rank,
                k.fits ? "true" : "false", i + 1 < std::min(top, c.size()) ? "," : "");
  }
  std::printf("]\n");
}

} // namespace

int plan_main(int argc, char** argv) {
  CLI::App app{"pipetrain plan: the layouts of a deck's model on N ranks, ranked by predicted "
               "step time (one process, no mpirun; docs/planner.md).\n"
               "Usage: pipetrain plan DECK.toml [section.key=value ...] --ranks N --machine FILE\n"
               "       pipetrain plan DECK.toml ... --nodes N --cores-per-node C --machine FILE"};
  std::string deck, machine_file;
  std::vector<std::string> overrides;
  int ranks = 0, per_node = 0, nodes = 0, cores = 0;
  std::size_t top = 10;
  bool json = false, with_search = false;
  app.add_option("deck", deck, "input deck (TOML)")->required();
  app.add_option("overrides", overrides, "section.key=value: fix these keys");
  CLI::Option* by_ranks =
      app.add_option("--ranks", ranks, "ranks of the job")->check(CLI::PositiveNumber);
  CLI::Option* by_per_node =
      app.add_option("--ranks-per-node", per_node, "ranks per node (default: the machine file's)");
  CLI::Option* by_nodes =
      app.add_option("--nodes", nodes, "nodes of the job (with --cores-per-node)")
          ->check(CLI::PositiveNumber);
  app.add_option("--cores-per-node", cores,
                 "plan ranks x threads splits of nodes this many cores (the machine file's ranks "
                 "being one per core): every threads-per-rank count dividing it")
      ->check(CLI::PositiveNumber)
      ->needs(by_nodes)
      ->excludes(by_ranks)
      ->excludes(by_per_node);
  by_nodes->needs("--cores-per-node");
  app.add_option("--machine", machine_file, "machine file, e.g. inputs/machines/a100-dgx.toml")
      ->required();
  app.add_option("--top", top, "rows to print (default 10)");
  app.add_flag("--json", json, "print the rows as a JSON list");
  app.add_flag("--search", with_search,
               "rank parallel.schedule=\"search\" beside the named schedules (one search per "
               "layout: slower)");
  try {
    app.parse(argc, argv);
    if (ranks == 0 && nodes == 0)
      throw CLI::RequiredError("--ranks (or --nodes and --cores-per-node)");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    Machine mc = read_machine(machine_file);
    if (per_node > 0) mc.ranks_per_node = per_node;
    std::ifstream in(deck);
    if (!in) throw input_error("deck '" + deck + "': cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<Candidate> c =
        cores > 0 ? plan_hybrid(text.str(), deck, overrides, nodes, cores, mc, with_search)
                  : plan_layouts(text.str(), deck, overrides, ranks, mc, with_search);
    if (c.empty()) {
      throw input_error(
          "no valid layout of this deck on " +
          (cores > 0 ? std::to_string(nodes) + " node(s) of " + std::to_string(cores) + " cores"
                     : std::to_string(ranks) + " ranks") +
          " (check the overrides, n_head, vocab_size and global_batch)");
    }
    json ? print_json(c, top) : print_table(c, top, mc, cores > 0 ? nodes : ranks, cores);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}

} // namespace pt
