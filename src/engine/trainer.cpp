// train(): the run's setup, then per step the optimizer step, its report and run control
// (validation, checkpoints, stop signals), then the end-of-run summary.
#include "engine/trainer.hpp"

#include <mpi.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf_import.hpp"
#include "engine/run.hpp"
#include "profile.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr std::uint64_t kValidationStream = 0x76616c69646174ULL; // "validat": sampler stream

} // namespace

// The run's checkpoints: where it resumes, and each save. Each rank reads and writes its own
// optimizer state in place: AdamW's moments, or under ZeRO-1 its shard of them.
struct Trainer::Checkpoints {
  Trainer& t;
  Shards shards;
  TrainState state;

  // Steps done before this run (checkpoint.resume), printed when resumed.
  int resume() {
    const double t0 = wall_time();
    std::string from;
    const bool resumed = pt::resume(t.cfg_, t.layout_, t.watchdog_, shards, state, from);
    if (resumed && t.layout_.rank() == 0) {
      std::printf("resumed from %s (read in %.3f s): %d of %d steps done\n", from.c_str(),
                  wall_time() - t0, state.step, t.cfg_.train.steps);
      std::fflush(stdout);
    }
    if (!resumed && !t.cfg_.checkpoint.init_from.empty()) init_from();
    t.policy_->resumed_at(state.step); // 2bw: params() hold W(step), the older weights W(step - 1)
    return state.step;
  }

  // checkpoint.init_from: every rank reads its stages' tensors; one verdict for all
  void init_from() {
    const double t0 = wall_time();
    std::optional<Error> err;
    std::size_t n = 0;
    try {
      n = init_from_hf(t.cfg_.checkpoint.init_from, t.cfg_.model, shards.stages);
    } catch (const Error& e) {
      err = e;
    }
    t.watchdog_.agree(t.layout_.world(), err, "checkpoint.init_from's agreement");
    if (t.layout_.rank() == 0) {
      std::printf("initialized from %s (%zu tensors on rank 0, read in %.2f s)\n",
                  t.cfg_.checkpoint.init_from.c_str(), n, wall_time() - t0);
      std::fflush(stdout);
    }
  }

  void save(int steps_done, double lr) {
    state.step = steps_done;
    state.tokens_seen =
        static_cast<long long>(steps_done) * t.cfg_.train.global_batch * t.cfg_.model.seq_len;
    state.lr = lr;
    if (t.async_writer_) { // written in the background: wait() reports it
      t.async_writer_->start(t.cfg_, shards, t.plan_.layers, state);
      return;
    }
    const double t0 = wall_time();
    const std::string path = write_checkpoint(t.cfg_, t.layout_, t.watchdog_, shards,
                                              t.plan_.layers, state, t.layout_.world());
    if (t.layout_.rank() == 0) {
      std::printf("checkpoint %s written in %.2f s\n", path.c_str(), wall_time() - t0);
      std::fflush(stdout);
    }
  }
};

bool Trainer::validation_due(int step) const {
  const RunConfig& cfg = cfg_;
  return val_data_ && ((cfg.data.val_every > 0 && (step + 1) % cfg.data.val_every == 0) ||
                       step + 1 == cfg.train.steps);
}

// The validation loss every data.val_every steps and after the last one.
void Trainer::validate_if_due(int step) {
  const RunConfig& cfg = cfg_;
  if (!validation_due(step)) return;
  const Sampler vs(*val_data_, cfg.model.seq_len, cfg.train.seed ^ kValidationStream);
  const double val = engine_->evaluate(vs, cfg.data.val_batches);
  if (layout_.rank() == 0) log_->validation(step + 1, val);
}

// Whether the run stops after this step: `agreed`, the stop signal any rank has seen, or -1 for
// runtime.exit_after_steps, or 0 to go on.
int Trainer::stop_after(int step, int first_step, int agreed) const {
  const int exit_after = cfg_.runtime.exit_after_steps;
  if (agreed == 0 && exit_after > 0 && step + 1 - first_step == exit_after) return -1;
  return agreed;
}

// A policy that stops before the step (2bw), which then drains: an agreement of its own.
int Trainer::agree_stop_before_step(int& stop_seen) const {
  if (stop_seen == 0) stop_seen = poll_stop_signal();
  int stop = stop_seen;
  watchdog_.allreduce(&stop, 1, MPI_INT, MPI_MAX, layout_.world(),
                      "the stop-signal agreement before a 2bw step");
  return stop;
}

void Trainer::print_stopping(int step, int stop) const {
  if (layout_.rank() != 0) return;
  std::printf("stopping after step %d (%s); %s\n", step + 1,
              stop > 0 ? (stop == SIGTERM ? "SIGTERM" : "SIGUSR1") : "runtime.exit_after_steps",
              cfg_.checkpoint.enabled ? "restart with checkpoint.resume = \"auto\" to continue"
                                      : "no [checkpoint] section: nothing was saved");
  std::fflush(stdout);
}

TrainResult train(const RunConfig& cfg, const Layout& layout, const Plan& plan) {
  return Trainer(cfg, layout, plan).train();
}

TrainResult Trainer::train() {
  const RunConfig& cfg = cfg_;
  const Layout& layout = layout_;
  print_header();
  Checkpoints checkpoints{
      *this, Shards{stages_of(chunks_), optimizers_of(chunks_), policy_->older_weights()}, {}};
  RunTotals totals;
  totals.first_step = totals.steps_done = checkpoints.resume();
  TrainResult result;
  if (totals.first_step >= cfg.train.steps) {
    if (layout.rank() == 0) {
      std::printf("nothing left to do: the checkpoint is at step %d of %d (train.steps); raise "
                  "train.steps to train further\n",
                  totals.first_step, cfg.train.steps);
      std::fflush(stdout);
    }
    report_end(totals); // the checkpoint's parameter digests into metrics.jsonl
    result.steps_done = totals.first_step;
    result.nothing_to_do = true;
    return result;
  }
  if (async_writer_) async_writer_->prepare(cfg, checkpoints.shards);
  const Sampler sampler(*data_, cfg.model.seq_len, cfg.train.seed);
  reset_op_times(); // from here on: the partition's timing ran ops too
  int stop_seen = 0;
  // A step may run the next step's first forwards unless it drains (2bw): before a checkpoint,
  // a validation, a stop and at the end. Such a policy agrees on stopping before the step.
  const bool stop_first = policy_->stops_before_step();
  for (int step = totals.first_step; step < cfg.train.steps; ++step) {
    const long collectives_before = watchdog_.collectives();
    // the steps that log or trace start together, so that their times compare across ranks
    if (step_logs(cfg, step, totals.first_step) || trace_.on(step)) {
      watchdog_.barrier(layout.world(), "the barrier that starts step " + std::to_string(step + 1));
    }
    trace_.start_step(step);
    // log.op_profile counts the steps after the first (which also allocates scratch and has
    // cuBLAS choose its kernels), or the first alone in a one-step run
    if (step == totals.first_step + 1) reset_op_times();
    const bool last = step + 1 == cfg.train.steps;
    const bool periodic = cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0;
    int stop =
        stop_first ? stop_after(step, totals.first_step, agree_stop_before_step(stop_seen)) : 0;
    const bool drain =
        last || stop != 0 || validation_due(step) || (cfg.checkpoint.enabled && periodic);
    const StepResult s = this->step(step, sampler, drain, stop_first ? nullptr : &stop_seen);
    report_step(step, s, totals);
    validate_if_due(step);
    // checkpoints: every N steps, at the end, and when this run must stop early
    if (!stop_first) stop = stop_after(step, totals.first_step, s.stop);
    const bool save = cfg.checkpoint.enabled && (periodic || stop != 0 || last);
    if (save) checkpoints.save(step + 1, s.lr);
    if (!save && !validation_due(step) && !step_logs(cfg, step, totals.first_step)) {
      totals.quiet_collectives =
          std::max(totals.quiet_collectives, watchdog_.collectives() - collectives_before);
    }
    if (stop != 0 && !last) {
      print_stopping(step, stop);
      result.stopped_early = true;
      break;
    }
  }
  if (async_writer_) async_writer_->wait(); // the last save
  report_end(totals);
  if (cfg.log.trace)
    trace_.write(cfg.log.dir + "/trace.json", watchdog_, layout.world(), layout.coords().pp);
  result.steps_done = totals.steps_done;
  result.final_loss = totals.final_loss;
  const int timed = totals.steps_done - totals.first_step - 1;
  const double tokens_per_step = static_cast<double>(cfg.train.global_batch) * cfg.model.seq_len;
  result.mean_tokens_per_s = timed > 0 ? tokens_per_step * timed / totals.time_sum : 0.0;
  return result;
}

} // namespace pt
