// What a step and the end of a run report: metrics.jsonl and rank 0's stdout.
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "engine/run.hpp"
#include "schedule/schedule.hpp"
#include "telemetry/summary.hpp"
#include "util/errors.hpp"
#include "util/memory_count.hpp"
#include "util/test_hooks.hpp"

namespace pt {

// The bubble this step: measured idle / pipeline time (mean over pp ranks), and the simulator's
// prediction from this step's measured per-rank action costs.
// log.trace: the first traced step's prediction goes into the trace.
std::pair<double, double> Trainer::bubble_of(const StepTimes& times, int step) {
  const int p = layout_.pp();
  const bool predict_trace = trace_.on(step) && step + 1 == trace_.first();
  if (p < 2 && !predict_trace) return {0.0, 0.0};
  MPI_Comm pp = layout_.pp_comm();
  double span = times.pipeline_s, compute = times.compute_s;
  const std::string what = "the step's bubble metrics (pipeline group)";
  watchdog_.allreduce(&span, 1, MPI_DOUBLE, MPI_MAX, pp, what);
  watchdog_.allreduce(&compute, 1, MPI_DOUBLE, MPI_SUM, pp, what);
  using schedule::Op;
  double mine[4] = {times.mean_s(Op::F), times.mean_s(Op::B), times.mean_s(Op::BI),
                    times.mean_s(Op::BW)}; // Costs' order
  std::vector<double> all(static_cast<std::size_t>(4 * p));
  watchdog_.allgather(mine, 4, MPI_DOUBLE, all.data(), pp, what);
  std::vector<schedule::Costs> costs;
  for (int r = 0; r < p; ++r) {
    const double* a = all.data() + 4 * r;
    costs.push_back(schedule::Costs{a[0], a[1], a[2], a[3], 0.0});
  }
  const schedule::Simulation sim = schedule::simulate(plan_.schedule, costs);
  if (predict_trace) trace_.set_prediction(sim.spans);
  if (p < 2) return {0.0, 0.0};
  return {1.0 - compute / p / span, schedule::step_bubble(sim)};
}

namespace {

// Each pipeline rank's compute time and peak bytes (its pipeline group; rank 0 writes its own).
void stage_metrics(const Layout& layout, const Watchdog& watchdog, const StepTimes& times,
                   StepMetrics& sm) {
  const int p = layout.pp();
  double mine[2] = {times.compute_s, static_cast<double>(memory_count::peak())};
  std::vector<double> all(static_cast<std::size_t>(2 * p));
  watchdog.allgather(mine, 2, MPI_DOUBLE, all.data(), layout.pp_comm(),
                     "the step's per-stage metrics (pipeline group)");
  for (int r = 0; r < p; ++r) {
    sm.stage_compute_s.push_back(all[static_cast<std::size_t>(2 * r)]);
    sm.stage_mem_bytes.push_back(all[static_cast<std::size_t>(2 * r + 1)]);
  }
}

// Memory so far, the largest rank's: measured (the peak of pipetrain's allocations), predicted
// (the memory model) and the process's peak resident set.
void memory_metrics(const Layout& layout, const Watchdog& watchdog, const Plan& plan,
                    StepMetrics& sm) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  double mem[3] = {static_cast<double>(memory_count::peak()),
                   plan.memory[static_cast<std::size_t>(layout.coords().pp)].total(),
                   static_cast<double>(ru.ru_maxrss) * 1024.0};
  watchdog.allreduce(mem, 3, MPI_DOUBLE, MPI_MAX, layout.world(), "the step's memory metrics");
  sm.mem_bytes = mem[0];
  sm.mem_predicted_bytes = mem[1];
  sm.mem_rss_bytes = mem[2];
}

// The dp reduction over the run and auto's measured choices (rank 0's group).
} // namespace

void Trainer::report_dp_reduction(const RunTotals& totals) const {
  const int run_steps = totals.steps_done - totals.first_step;
  const GradSync* sync = chunks_.front().reducer();
  if (sync == nullptr || run_steps <= 0) return;
  // the largest rank's times, the fewest buckets started early
  double most[3] = {totals.comm.exposed_s, totals.comm.busy_s,
                    -static_cast<double>(totals.comm.buckets_early)};
  watchdog_.allreduce(most, 3, MPI_DOUBLE, MPI_MAX, layout_.world(),
                      "the end-of-run dp reduction summary");
  if (layout_.rank() != 0) return;
  std::printf("dp gradient reduction (overlap %s): %.2f ms exposed of %.2f ms per step; "
              "%.0f bucket(s) started during the backward\n",
              sync->mode(), 1e3 * most[0] / run_steps, 1e3 * most[1] / run_steps, -most[2]);
  if (const Allreducer* red = sync->reducer()) {
    for (const auto& [n, ch] : red->measured()) {
      std::printf("dp all-reduce auto, %.1f KiB: %s (model: %s; measured", n * 4.0 / 1024.0,
                  algorithm_name(ch.pick), algorithm_name(ch.model));
      for (const auto& [algo, sec] : ch.seconds) {
        std::printf(" %s %.1f us", algorithm_name(algo), sec * 1e6);
      }
      std::printf(")\n");
    }
  }
  std::fflush(stdout);
}

// How many collectives a step that neither logs, validates nor checkpoints made, and the bytes
// of pipeline messages and tensor-parallel collectives sent in the run, on every rank.
void Trainer::report_collectives(const RunTotals& totals) const {
  const auto n = static_cast<std::size_t>(layout_.size());
  const long mine[3] = {totals.quiet_collectives, static_cast<long>(engine_->message_bytes()),
                        tp_reduce_ ? static_cast<long>(tp_reduce_->bytes()) : 0L};
  std::vector<long> all(3 * n);
  watchdog_.allgather(mine, 3, MPI_LONG, all.data(), layout_.world(),
                      "the end-of-run count of collectives and bytes");
  if (layout_.rank() != 0) return;
  const auto print = [&](const char* what, int k) {
    std::printf("%s, by rank:", what);
    for (std::size_t r = 0; r < n; ++r)
      std::printf(" %ld", all[3 * r + static_cast<std::size_t>(k)]);
    std::printf("\n");
  };
  if (all[0] >= 0) print("collectives a step that does not log", 0);
  if (layout_.pp() > 1) print("pipeline message bytes sent", 1);
  if (layout_.tp() > 1) print("tensor-parallel collective bytes sent", 2);
  std::fflush(stdout);
}

// The final parameters' summaries into metrics.jsonl; the tp replica check's verdict.
void Trainer::report_final_params() {
  const std::vector<ParamSummary> summary =
      summarize_params(stages_of(chunks_), whole_, watchdog_, layout_.tp_comm(), layout_.pp_comm(),
                       layout_.ep_comm());
  if (layout_.rank() != 0) return;
  if (test_hooks().check_tp_replicas) {
    std::printf("tp replica check: %d replicated gradient tensors were bitwise equal on all %d tp "
                "ranks at every step\n",
                replicas_checked_, layout_.tp());
  }
  log_->final_params(summary);
}

namespace {

// The step's routing (StepResult::moe) as metrics: its sums, and the worst layer's most loaded
// expert over the layer's mean.
void moe_metrics(const ModelConfig& m, const MoeStepStats& moe, StepMetrics& sm) {
  sm.experts = m.moe_experts;
  if (sm.experts == 0) return;
  sm.aux_loss = moe.aux_loss;
  sm.expert_tokens = moe.tokens;
  for (double d : moe.dropped) sm.dropped += d;
  const std::size_t E = static_cast<std::size_t>(m.moe_experts);
  for (std::size_t l = 0; l * E < moe.tokens.size(); ++l) {
    const auto first = moe.tokens.begin() + static_cast<std::ptrdiff_t>(l * E);
    const double sum = std::accumulate(first, first + static_cast<std::ptrdiff_t>(E), 0.0);
    const double most = *std::max_element(first, first + static_cast<std::ptrdiff_t>(E));
    if (sum > 0.0) sm.imbalance = std::max(sm.imbalance, most * static_cast<double>(E) / sum);
  }
}

} // namespace

bool step_logs(const RunConfig& cfg, int step, int first_step) {
  return (step + 1) % cfg.log.every == 0 || step == first_step || step + 1 == cfg.train.steps;
}

void Trainer::report_step(int step, const StepResult& s, RunTotals& totals) {
  const RunConfig& cfg = cfg_;
  const double dt = s.seconds;
  if (step > totals.first_step) {
    totals.time_sum += dt;
  } else {
    totals.first_dt = dt;
  }
  totals.ema = step == totals.first_step ? dt : 0.9 * totals.ema + 0.1 * dt;
  const double tokens_per_step = static_cast<double>(cfg.train.global_batch) * cfg.model.seq_len;
  StepMetrics sm;
  sm.step = step + 1;
  sm.steps = cfg.train.steps;
  sm.loss = s.loss;
  sm.lr = s.lr;
  sm.grad_norm = s.grad_norm;
  sm.step_time_s = dt;
  sm.tokens_per_s = tokens_per_step / dt;
  sm.tflops = flops_per_token(cfg.model) * tokens_per_step / dt / 1e12;
  sm.mfu = sm.tflops * 1e12 / peak_flops_;
  moe_metrics(cfg.model, s.moe, sm);
  totals.comm.exposed_s += s.comm.exposed_s; // this rank's; the largest is reported at the end
  totals.comm.busy_s += s.comm.busy_s;
  totals.comm.buckets_early += s.comm.buckets_early;
  sm.reduced = step_logs(cfg, step, totals.first_step);
  if (sm.reduced) { // metrics over ranks only on the steps that log
    std::tie(sm.bubble, sm.bubble_predicted) = bubble_of(s.times, step);
    double comm_t[4] = {s.comm.exposed_s, s.comm.busy_s, s.norm_wait_s, s.moe.alltoall_s};
    watchdog_.allreduce(comm_t, 4, MPI_DOUBLE, MPI_MAX, layout_.world(),
                        "the step's communication metrics");
    sm.comm_exposed_s = comm_t[0];
    sm.comm_s = comm_t[1];
    sm.norm_wait_s = comm_t[2];
    if (layout_.ep() > 1) sm.alltoall_s = sm.alltoall_exposed_s = comm_t[3];
    memory_metrics(layout_, watchdog_, plan_, sm);
    stage_metrics(layout_, watchdog_, s.times, sm);
  } else if (trace_.on(step) && step + 1 == trace_.first()) {
    bubble_of(s.times, step); // the trace's prediction
  }
  sm.eta_s = totals.ema * (cfg.train.steps - step - 1);
  if (layout_.rank() == 0) {
    log_->step(sm, sm.reduced);
  }
  if (sm.reduced && cfg.log.param_digests) {
    const std::vector<ParamSummary> summary =
        summarize_params(stages_of(chunks_), whole_, watchdog_, layout_.tp_comm(),
                         layout_.pp_comm(), layout_.ep_comm());
    if (layout_.rank() == 0) log_->params(step + 1, summary);
  }
  totals.steps_done = step + 1;
  totals.final_loss = s.loss;
}

void Trainer::report_end(const RunTotals& totals) {
  if (cfg_.train.post_validation && layout_.rank() == 0) {
    std::printf("post-validation: %d of %d updates redone (clipping applied)\n", updates_redone_,
                totals.steps_done - totals.first_step);
  }
  report_dp_reduction(totals);
  report_collectives(totals);
  const int timed = totals.steps_done - totals.first_step - 1;
  if (cfg_.log.op_profile && timed >= 0) {
    print_op_profile(watchdog_, layout_.world(), timed > 0 ? timed : 1, timed > 0,
                     timed > 0 ? totals.time_sum : totals.first_dt);
  }
  report_final_params();
}

} // namespace pt
