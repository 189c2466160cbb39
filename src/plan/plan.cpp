// What every rank derives from the deck before training: the partition (profiled when
// partition = "time"), the schedule and its validation; and the plan printed at startup.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "comm/group.hpp"
#include "comm/watchdog.hpp"
#include "engine/run.hpp"
#include "model/partition.hpp"
#include "ops.hpp"
#include "schedule/validate.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {

double flops_per_token(const ModelConfig& m) {
  // an untied model's input embedding is a lookup, no product (tied, its matrix is the head's)
  const double lookup = tied(m) ? 0.0 : static_cast<double>(m.vocab_size) * m.d_model;
  return 6.0 * (active_model_params(m) - lookup) +
         6.0 * m.n_layer * m.d_model * static_cast<double>(m.seq_len);
}

namespace {

// Seconds of forward + backward of one micro-batch through a stage of this shape.
double time_stage(const RunConfig& cfg, const StageSpec& spec, const Backend& be) {
  GptStage stage(cfg.model, spec, cfg.train.micro_batch, TpGroup{}, be, Recompute::none,
                 activation_format(cfg.device.precision));
  stage.init_parameters(cfg.train.seed);
  StageActivations a = stage.make_activations();
  FloatBuffer dout(a.input.size(), Memory{be.alloc, be.release});
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) { // best of 3 after the first (cold) one
    const double t0 = wall_time();
    stage.forward(a);
    stage.backward(a, spec.last ? nullptr : dout.data(), 1e-3f, nullptr);
    if (rep > 0) best = std::min(best, wall_time() - t0);
  }
  return best;
}

// partition = "time": forward+backward of the embedding, one layer and the head, measured on
// every rank's hardware and averaged, so every rank derives the same partition.
BlockCosts profile_costs(const RunConfig& cfg, MPI_Comm world) {
  const int L = cfg.model.n_layer;
  const Backend& be = open_backend(cfg, world);
  double t[3] = {time_stage(cfg, StageSpec{true, false, 0, 0}, be),
                 time_stage(cfg, StageSpec{false, false, 0, 1}, be),
                 time_stage(cfg, StageSpec{false, true, L, L}, be)};
  const Watchdog watchdog(cfg.runtime.hang_timeout_s, rank_in(world));
  watchdog.allreduce(t, 3, MPI_DOUBLE, MPI_SUM, world, "the sum of the ranks' stage timings");
  const int n = size_of(world);
  return BlockCosts{t[0] / n, t[1] / n, t[2] / n};
}

// The memory model's estimate per pipeline rank (every dp and tp rank of it alike), in MiB.
void print_memory(const RunConfig& cfg, const Plan& plan) {
  const double mib = 1048576.0;
  std::printf("== memory (predicted per rank, MiB; recompute %s%s; docs/memory.md) ==\n"
              "  pp rank  params+grads  optimizer  activations (slots x each)  pipeline  "
              "workspace     total\n",
              name(cfg.train.recompute),
              cfg.parallel.sequence_parallel ? "; sequence parallel" : "");
  for (std::size_t r = 0; r < plan.memory.size(); ++r) {
    const MemoryEstimate& e = plan.memory[r];
    std::printf("  %7zu  %12.2f  %9.2f  %11.2f (%2d x %8.2f)  %8.2f  %9.2f  %8.2f\n", r,
                e.params / mib, e.optimizer / mib, e.activations / mib, e.slots, e.per_slot / mib,
                e.messages / mib, (e.workspace + e.comm) / mib, e.total() / mib);
  }
  if (!plan.memory.empty() && plan.memory.front().snapshot > 0.0) {
    std::printf("  checkpoint.async: the total holds the host copy of the state a save writes, "
                "%.2f MiB on pp rank 0\n",
                plan.memory.front().snapshot / mib);
  }
  std::printf("  limit per rank (rank 0's): %.0f MiB (%s)\n", plan.memory_limit / mib,
              plan.memory_source.c_str());
}

} // namespace

schedule::Schedule run_schedule(const RunConfig& cfg, const std::vector<double>& stage_cost,
                                int search_tries) {
  const ParallelConfig& p = cfg.parallel;
  const bool file = p.schedule == ScheduleKind::file;
  try {
    if (file) return schedule::from_csv(p.schedule_csv, p.pp, p.micro_batches, p.virtual_stages);
    if (p.schedule == ScheduleKind::search) {
      if (p.virtual_stages != 1) {
        throw std::invalid_argument("search places one chunk per rank: virtual_stages must be 1");
      }
      std::vector<schedule::Costs> costs;
      for (int r = 0; r < p.pp; ++r) {
        const auto i = static_cast<std::size_t>(r);
        costs.push_back(schedule::split_stage_cost(i < stage_cost.size() ? stage_cost[i] : 1.0));
      }
      return schedule::search_schedule(p.pp, p.micro_batches, costs,
                                       schedule::search_budget(p.search_memory, p.pp),
                                       search_tries);
    }
    return schedule::make_schedule(p.schedule, p.pp, p.micro_batches, p.virtual_stages);
  } catch (const std::invalid_argument& e) {
    if (file) {
      throw input_error(cfg.deck_path + ": parallel.schedule = \"file:" + p.schedule_file +
                        "\" (pp " + std::to_string(p.pp) + ", " + std::to_string(p.micro_batches) +
                        " micro-batches, virtual_stages " + std::to_string(p.virtual_stages) +
                        "): " + e.what());
    }
    throw input_error(cfg.deck_path + ": parallel.schedule = \"" + std::string(name(p.schedule)) +
                      "\" does not fit this run: " + e.what());
  }
}

Plan make_plan(const RunConfig& cfg, const Layout& layout, bool profile) {
  Plan plan;
  const int S = cfg.parallel.pp * cfg.parallel.virtual_stages;
  plan.costs = parameter_costs(cfg.model);
  plan.cost_unit = "parameters";
  if (cfg.parallel.partition == PartitionKind::time) {
    if (profile) {
      plan.costs = profile_costs(cfg, layout.world());
      plan.cost_unit = "seconds (measured fwd+bwd)";
    } else {
      plan.cost_unit = "parameters (time is profiled when training starts)";
    }
  }
  plan.layers = partition_layers(cfg.parallel, cfg.model.n_layer, S, plan.costs);
  plan.schedule = run_schedule(cfg, stage_costs(plan.layers, plan.costs));
  const schedule::Validation v = schedule::validate(plan.schedule);
  if (!v.ok) fatal("internal error: generated schedule is invalid: " + v.error);
  plan.peak_live = v.peak_live;
  plan.predicted = schedule::simulate(plan.schedule, schedule::Costs{1, 2, 1, 1, 0});
  // a GPU run's attention keeps what its kernels keep: asked of the backend the run opens
  const Backend* be =
      profile && cfg.device.kind == DeviceKind::cuda ? &open_backend(cfg, layout.world()) : nullptr;
  for (int r = 0; r < cfg.parallel.pp; ++r)
    plan.memory.push_back(predict_memory(cfg, plan, r, layout.dp_node_size(), be));
  plan.memory_limit = memory_limit(cfg, layout.world(), plan.memory_source);
  return plan;
}

void print_plan(const RunConfig& cfg, const Layout& layout, const Placement& placement,
                const Plan& plan) {
  const std::string table = layout.table(&placement);
  if (layout.rank() != 0) return;
  const auto& m = cfg.model;
  std::printf("== resolved deck (%s) ==\n%s\n\n", cfg.deck_path.c_str(), cfg.resolved_text.c_str());
  std::printf("%s== layout ==\n%s%s%s", cfg.warnings.c_str(), table.c_str(),
              layout.warnings().c_str(), placement.warning.c_str());
  const std::vector<double> cost = stage_costs(plan.layers, plan.costs);
  std::printf("== partition (%s, cost in %s) ==\n", name(cfg.parallel.partition),
              plan.cost_unit.c_str());
  for (std::size_t s = 0; s < plan.layers.size(); ++s) {
    const StageSpec sp = stage_spec(plan.layers, static_cast<int>(s));
    std::printf("  stage %2zu (pp rank %d, chunk %d): %s layers %d-%d%s  cost %.4g\n", s,
                plan.schedule.rank_of(static_cast<int>(s)),
                plan.schedule.chunk_of(static_cast<int>(s)), sp.first ? "embedding +" : "",
                sp.layer_begin, sp.layer_end - 1, sp.last ? " + final norm/head/loss" : "",
                cost[s]);
  }
  const long long tokens = static_cast<long long>(cfg.train.global_batch) * m.seq_len;
  std::printf("== plan ==\n  model: %d layers, d_model %d, %d heads, seq_len %d, vocab %d, %s "
              "embeddings, %.2fM parameters, %.1f MFLOP/token\n",
              m.n_layer, m.d_model, m.n_head, m.seq_len, m.vocab_size, tied(m) ? "tied" : "untied",
              count_model_params(m) / 1e6, flops_per_token(m) / 1e6);
  std::printf("  batch: global %d sequences (%lld tokens) per step = dp %d x micro-batch %d x %d "
              "micro-batches; %d steps\n",
              cfg.train.global_batch, tokens, cfg.parallel.dp, cfg.train.micro_batch,
              cfg.accumulation(), cfg.train.steps);
  std::printf("  schedule: %s, pp %d, v %d, m %d; predicted bubble %.1f%% (T_F = 1, T_B = 2); "
              "peak live micro-batches per pp rank:",
              cfg.parallel.schedule == ScheduleKind::file
                  ? ("file:" + cfg.parallel.schedule_file).c_str()
                  : name(cfg.parallel.schedule),
              cfg.parallel.pp, cfg.parallel.virtual_stages, cfg.parallel.micro_batches,
              100.0 * schedule::step_bubble(plan.predicted));
  for (int n : plan.peak_live) std::printf(" %d", n);
  std::printf("\n  backend: %s, precision %s, BLAS %s, host threads: Kokkos %s x %d\n",
              name(cfg.device.kind), name(cfg.device.precision),
              cfg.device.kind == DeviceKind::cuda ? "cublas (device memory)" : ops::blas_name(),
              ops::host_space_name(), ops::host_threads());
  print_memory(cfg, plan);
  std::fflush(stdout);
}

} // namespace pt
