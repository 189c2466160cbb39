// One optimizer step: the schedule, the gradients' reductions, the norm, clipping and AdamW.
#include <mpi.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/run.hpp"
#include "optim/lr_schedule.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

// Every replicated tensor's gradient must be the same bytes on every tp rank (by construction:
// replicated parameters see replicated inputs). Compares min and max over the tp group.
void check_replicated_grads(std::vector<Chunk>& chunks, const Layout& layout,
                            const Watchdog& watchdog, int step, int& checked) {
  if (layout.tp() < 2) return;
  int count = 0;
  for (Chunk& chunk : chunks) {
    GptStage* c = chunk.stage.get();
    for (const auto& t : c->layout().tensors()) {
      if (t.shard_dim >= 0) continue;
      std::vector<float> lo(t.size);
      to_host(c->backend(), lo.data(), c->grads() + t.offset, t.size);
      std::vector<float> hi = lo;
      const std::string what = "the tp replica check of " + t.name;
      watchdog.allreduce(lo.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MIN, layout.tp_comm(),
                         what);
      watchdog.allreduce(hi.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MAX, layout.tp_comm(),
                         what);
      if (std::memcmp(lo.data(), hi.data(), t.size * sizeof(float)) != 0) {
        fatal("step " + std::to_string(step + 1) + ": the gradient of replicated tensor " + t.name +
              " differs between tp ranks");
      }
      ++count;
    }
  }
  checked = count;
}

// The tied embedding's gradient summed over its two stages (on this rank's full gradients):
// over the embedding group, or, when V placement puts both stages on rank 0 (chunks 0 and 1),
// here, in the order a single rank adds them (embedding's share + head's share).
void sum_tied_embedding(Run& run) {
  const schedule::Schedule& sched = run.plan.schedule;
  if (sched.vshape && tied(run.cfg.model) && run.layout.coords().pp == 0 && sched.stages() > 1) {
    GptStage& first = *run.chunks[0].stage;
    GptStage& last = *run.chunks[1].stage;
    const ParamTensor& wte = *first.layout().find(Role::wte);
    float* g0 = first.grads() + wte.offset;
    float* g1 = last.grads() + last.layout().find(Role::wte)->offset;
    run.be.accumulate(g0, g1, wte.size);
    run.be.copy(g1, g0, wte.size * sizeof(float));
    run.be.synchronize();
    return;
  }
  if (!run.embedding_reduce) return;
  const int v = run.cfg.parallel.virtual_stages;
  GptStage& edge =
      *run.chunks[run.layout.coords().pp == 0 ? 0 : static_cast<std::size_t>(v - 1)].stage;
  const ParamTensor& wte = *edge.layout().find(Role::wte);
  run.embedding_reduce->sum(edge.grads() + wte.offset, wte.size);
}

// Gradients after the schedule: the tied head's share folded into the embedding, the
// data-parallel all-reduce (buckets not yet started), with sequence parallelism the norms' sums
// over tp (after the dp sum: buckets may be in flight until then), the tied embedding summed over
// its two stages; under ZeRO-1 the reducer's reduce-scatter over dp comes last (both stages'
// shards of the tied embedding then hold the same sums), and the optimizer takes its shard.
void finish_gradients(Run& run, GradSyncStats& comm) {
  for (Chunk& c : run.chunks) {
    c.stage->fold_tied_head_grad();
    if (c.sync && !c.sync->scatters()) c.sync->finish(comm);
    c.stage->sum_sequence_parallel_grads();
  }
  sum_tied_embedding(run);
  for (Chunk& c : run.chunks) {
    if (c.sync && c.sync->scatters()) c.sync->finish(comm);
    c.opt->reduce(c.stage->grads());
  }
}

// What every rank needs after the schedule, in one sum over the world: each tensor's sum of
// squared gradients (the global norm, each element counted once: dp rank 0's, or under ZeRO-1
// every dp rank's shard), the loss (the last stage's sums over its micro-batches, tp rank 0's,
// of every dp replica) and the stop signals any rank has seen. A non-finite loss or gradient on
// any rank makes the sums non-finite on every rank, so all ranks reach the same verdict.
struct Agreement {
  double loss = 0.0;      // mean over the global batch
  double grad_norm = 0.0; // global L2 norm
  int stop = 0;           // SIGTERM or SIGUSR1 if any rank has seen one, else 0
};

// This rank's sums of squares per tensor (in model order) added into sq; one backend call per
// chunk, over the gradients its optimizer reads: whole, or under ZeRO-1 its shard of the sums.
void local_norm_squares(Run& run, double* sq) {
  for (Chunk& c : run.chunks) {
    // whole optimizers: the dp replicas' gradients are equal, dp rank 0 counts them
    if (!c.opt->sharded() && run.layout.coords().dp != 0) continue;
    NormTensors& nt = c.norm;
    const float* g = c.opt->summed_grads(c.stage->grads());
    run.be.sum_squares_each(nt.sums.data(), g, nt.offset.data(), nt.size.data(),
                            static_cast<int>(nt.index.size()));
    for (std::size_t i = 0; i < nt.index.size(); ++i) sq[nt.index[i]] += nt.sums[i];
  }
}

// The agreement's world sum, started when the schedule's gradients are final; finish() waits for
// it (the same non-blocking all-reduce whether the update runs before or after it, so the sums
// are the same bits) and reads it.
class PendingAgreement {
public:
  PendingAgreement(Run& run, double loss, int signal) : run_(run) {
    const Layout& layout = run.layout;
    const std::size_t n_tensors = run.whole.tensors().size();
    // [sums of squares per tensor..., loss, SIGTERM seen, SIGUSR1 seen]
    v_.assign(n_tensors + 3, 0.0);
    local_norm_squares(run, v_.data());
    const schedule::Schedule& sched = run.plan.schedule;
    const bool has_loss =
        layout.coords().pp == sched.rank_of(sched.stages() - 1) && layout.coords().tp == 0;
    if (has_loss) v_[n_tensors] = loss;
    v_[n_tensors + 1] = signal == SIGTERM ? 1.0 : 0.0;
    v_[n_tensors + 2] = signal == SIGUSR1 ? 1.0 : 0.0;
    if (layout.size() > 1) {
      req_ = run.watchdog.start_allreduce(v_.data(), static_cast<int>(v_.size()), MPI_DOUBLE,
                                          MPI_SUM, layout.world());
      started_ = true;
    }
  }

  // Waits for the sum (`waited_s`: how long) and reads the agreement from it.
  Agreement finish(double& waited_s) {
    waited_s = started_ ? run_.watchdog.wait(req_, "the step's loss, gradient norm and stop "
                                                   "agreement")
                        : 0.0;
    const std::size_t n_tensors = v_.size() - 3;
    Agreement a;
    double norm2 = 0.0;
    for (std::size_t i = 0; i < n_tensors; ++i) norm2 += v_[i]; // model order on every layout
    a.grad_norm = std::sqrt(norm2);
    a.loss = v_[n_tensors] / (static_cast<double>(run_.cfg.accumulation()) * run_.layout.dp());
    a.stop = v_[n_tensors + 1] > 0.0 ? SIGTERM : v_[n_tensors + 2] > 0.0 ? SIGUSR1 : 0;
    return a;
  }

private:
  Run& run_;
  std::vector<double> v_;
  MPI_Request req_{};
  bool started_ = false;
};

// Every chunk's update. post_validation: save() first keeps what an undo() restores.
void update(Run& run, double lr, float grad_scale) {
  for (Chunk& c : run.chunks) c.opt->step(c.stage->params(), c.stage->grads(), lr, grad_scale);
}

void save(Run& run) {
  for (Chunk& c : run.chunks) {
    const std::size_t n = c.stage->num_params();
    if (c.saved_params.size() != n) {
      c.saved_params = FloatBuffer(n, Memory{run.be.alloc, run.be.release});
    }
    run.be.copy(c.saved_params.data(), c.stage->params(), n * sizeof(float));
    c.opt->save();
  }
}

void undo(Run& run) {
  for (Chunk& c : run.chunks) {
    run.be.copy(c.stage->params(), c.saved_params.data(), c.saved_params.bytes());
    c.opt->restore();
  }
}

} // namespace

// SIGTERM / SIGUSR1 (what Slurm sends ahead of the time limit with --signal) ask the run to
// finish the step, checkpoint and exit 0. main() blocks both in every thread before MPI starts;
// they stay pending until this poll collects them after a step's schedule, so no handler ever runs
// inside MPI, PMIx or BLAS code. Returns the signal, or 0.
int poll_stop_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  const timespec zero{0, 0};
  const int sig = sigtimedwait(&set, nullptr, &zero);
  return sig > 0 ? sig : 0;
}

StepResult train_step(Run& run, int step, const Sampler& sampler, bool drain, int* stop_seen) {
  const TrainConfig& t = run.cfg.train;
  StepResult r;
  const double t0 = wall_time();
  for (Chunk& c : run.chunks) c.stage->zero_grads();
  const double loss = run.engine->run(step, sampler, r.times, drain);
  const double t_reduce = wall_time();
  finish_gradients(run, r.comm);
  run.trace.add("gradient reductions", t_reduce, wall_time(), step);
  const double t_update = wall_time();
  if (stop_seen != nullptr && *stop_seen == 0) *stop_seen = poll_stop_signal();
  PendingAgreement pending(run, loss, stop_seen != nullptr ? *stop_seen : 0);
  r.lr = learning_rate(t, step);
  run.policy->before_update(stages_of(run.chunks)); // 2bw: W(t) stays for step t+1
  // post-validation (arXiv 2401.10241 section 4): update unclipped while the norm is summed
  const bool early = t.post_validation;
  if (early) {
    save(run);
    update(run, r.lr, 1.0f);
  }
  const Agreement agreed = pending.finish(r.norm_wait_s);
  r.loss = agreed.loss;
  r.grad_norm = agreed.grad_norm;
  r.stop = agreed.stop;
  if (test_hooks().check_tp_replicas) {
    check_replicated_grads(run.chunks, run.layout, run.watchdog, step, run.replicas_checked);
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    if (early) undo(run);
    throw Error(ExitCode::non_finite,
                "step " + std::to_string(step + 1) + ": loss = " + std::to_string(r.loss) +
                    ", grad norm = " + std::to_string(r.grad_norm) +
                    " are not finite; nothing was updated.\n---> HINT: lower train.lr, raise "
                    "train.warmup_steps, or keep train.grad_clip > 0");
  }
  // torch.nn.utils.clip_grad_norm_ semantics
  float grad_scale = 1.0f;
  if (t.grad_clip > 0.0) {
    const double coef = t.grad_clip / (r.grad_norm + 1e-6);
    if (coef < 1.0) grad_scale = static_cast<float>(coef);
  }
  if (!early) {
    update(run, r.lr, grad_scale);
  } else if (grad_scale != 1.0f) { // clipping applies: the unclipped update is undone and redone
    undo(run);
    update(run, r.lr, grad_scale);
    ++run.updates_redone;
  }
  run.trace.add("optimizer", t_update, wall_time(), step); // loss, norm, clipping, AdamW
  r.seconds = wall_time() - t0;
  return r;
}

} // namespace pt
