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

// What every rank needs after the schedule, in one sum over the world: each tensor's sum of
// squared gradients (the global norm, each element counted once: dp rank 0's, or under ZeRO-1
// every dp rank's shard), the loss (the last stage's sums over its micro-batches, tp rank 0's,
// of every dp replica) and the stop signals any rank has seen. A non-finite loss or gradient on
// any rank makes the sums non-finite on every rank, so all ranks reach the same verdict.
struct Agreement {
  double loss = 0.0;      // mean over the global batch
  double grad_norm = 0.0; // global L2 norm
  int stop = 0;           // SIGTERM or SIGUSR1 if any rank has seen one, else 0
  MoeStepStats moe;       // an MoE model's routing, summed over the global batch
};

} // namespace

// Every replicated tensor's gradient must be the same bytes on every tp rank (by construction:
// replicated parameters see replicated inputs). Compares min and max over the tp group.
void Trainer::check_replicated_grads(int step) {
  if (layout_.tp() < 2) return;
  int count = 0;
  for (Chunk& chunk : chunks_) {
    GptStage& c = chunk.stage();
    for (const auto& t : c.layout().tensors()) {
      if (t.shard_dim >= 0) continue;
      std::vector<float> lo(t.size);
      to_host(c.backend(), lo.data(), c.grads() + t.offset, t.size);
      std::vector<float> hi = lo;
      const std::string what = "the tp replica check of " + t.name;
      watchdog_.allreduce(lo.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MIN,
                          layout_.tp_comm(), what);
      watchdog_.allreduce(hi.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MAX,
                          layout_.tp_comm(), what);
      if (std::memcmp(lo.data(), hi.data(), t.size * sizeof(float)) != 0) {
        fatal("step " + std::to_string(step + 1) + ": the gradient of replicated tensor " + t.name +
              " differs between tp ranks");
      }
      ++count;
    }
  }
  replicas_checked_ = count;
}

// The tied embedding's gradient summed over its two stages (on this rank's full gradients):
// over the embedding group, or, when V placement puts both stages on rank 0 (chunks 0 and 1),
// here, in the order a single rank adds them (embedding's share + head's share).
void Trainer::sum_tied_embedding() {
  const schedule::Schedule& sched = plan_.schedule;
  if (sched.vshape && tied(cfg_.model) && layout_.coords().pp == 0 && sched.stages() > 1) {
    GptStage& first = chunks_[0].stage();
    GptStage& last = chunks_[1].stage();
    const ParamTensor& wte = *first.layout().find(Role::wte);
    float* g0 = first.grads() + wte.offset;
    float* g1 = last.grads() + last.layout().find(Role::wte)->offset;
    be_.accumulate(g0, g1, wte.size);
    be_.copy(g1, g0, wte.size * sizeof(float));
    be_.synchronize();
    return;
  }
  if (!embedding_reduce_) return;
  const int v = cfg_.parallel.virtual_stages;
  GptStage& edge = chunks_[layout_.coords().pp == 0 ? 0 : static_cast<std::size_t>(v - 1)].stage();
  const ParamTensor& wte = *edge.layout().find(Role::wte);
  embedding_reduce_->sum(edge.grads() + wte.offset, wte.size);
}

// Gradients after the schedule: the tied head's share folded into the embedding, the
// data-parallel all-reduce (buckets not yet started), with sequence parallelism the norms' sums
// over tp (after the dp sum: buckets may be in flight until then), the tied embedding summed over
// its two stages; under ZeRO-1 the reducer's reduce-scatter over dp comes last (both stages'
// shards of the tied embedding then hold the same sums), and the optimizer takes its shard.
void Trainer::finish_gradients(GradSyncStats& comm) {
  for (Chunk& c : chunks_) c.finish_sum(comm);
  sum_tied_embedding();
  for (Chunk& c : chunks_) c.finish_shard(comm);
}

// The agreement's world sum, started when the schedule's gradients are final; finish() waits for
// it (the same non-blocking all-reduce whether the update runs before or after it, so the sums
// are the same bits) and reads it.
class Trainer::PendingAgreement {
public:
  PendingAgreement(Trainer& t, double loss, int signal) : t_(t) {
    const Layout& layout = t.layout_;
    const std::size_t n_tensors = t.whole_.tensors().size();
    // [sums of squares per tensor..., loss, SIGTERM seen, SIGUSR1 seen, MoE: the weighted
    // auxiliary losses' sum, then per MoE layer its dropped slots and the slots each expert was
    // chosen for]
    const ModelConfig& m = t.cfg_.model;
    const std::size_t E = static_cast<std::size_t>(m.moe_experts);
    const std::size_t moe_layers = static_cast<std::size_t>(moe_layer_count(m));
    v_.assign(n_tensors + 3 + (E > 0 ? 1 + moe_layers * (1 + E) : 0), 0.0);
    if (E > 0 && layout.coords().tp == 0) {
      double* moe = v_.data() + n_tensors + 3;
      for (Chunk& c : t.chunks_) {
        const MoeStats st = c.stage().take_moe_stats();
        moe[0] += st.aux;
        for (std::size_t i = 0; i < st.layers.size(); ++i) {
          const std::size_t at = static_cast<std::size_t>(st.layers[i] / m.moe_every);
          moe[1 + at] = st.dropped[i];
          std::copy_n(st.tokens.begin() + static_cast<std::ptrdiff_t>(i * E), E,
                      moe + 1 + moe_layers + at * E);
        }
      }
    }
    for (Chunk& c : t.chunks_) c.add_norm_squares(v_.data(), layout.coords().dp, layout.ep());
    const schedule::Schedule& sched = t.plan_.schedule;
    const bool has_loss =
        layout.coords().pp == sched.rank_of(sched.stages() - 1) && layout.coords().tp == 0;
    if (has_loss) v_[n_tensors] = loss;
    v_[n_tensors + 1] = signal == SIGTERM ? 1.0 : 0.0;
    v_[n_tensors + 2] = signal == SIGUSR1 ? 1.0 : 0.0;
    if (layout.size() > 1) {
      req_ = t.watchdog_.start_allreduce(v_.data(), static_cast<int>(v_.size()), MPI_DOUBLE,
                                         MPI_SUM, layout.world());
      started_ = true;
    }
  }

  // Waits for the sum (`waited_s`: how long) and reads the agreement from it.
  Agreement finish(double& waited_s) {
    waited_s = started_ ? t_.watchdog_.wait(req_, "the step's loss, gradient norm and stop "
                                                  "agreement")
                        : 0.0;
    const std::size_t n_tensors = t_.whole_.tensors().size();
    Agreement a;
    double norm2 = 0.0;
    for (std::size_t i = 0; i < n_tensors; ++i) norm2 += v_[i]; // model order on every layout
    a.grad_norm = std::sqrt(norm2);
    a.loss = v_[n_tensors] / (static_cast<double>(t_.cfg_.accumulation()) * t_.layout_.dp());
    a.stop = v_[n_tensors + 1] > 0.0 ? SIGTERM : v_[n_tensors + 2] > 0.0 ? SIGUSR1 : 0;
    const ModelConfig& m = t_.cfg_.model;
    if (m.moe_experts > 0) {
      const double* moe = v_.data() + n_tensors + 3;
      const std::size_t layers = static_cast<std::size_t>(moe_layer_count(m));
      a.moe.aux_loss = moe[0] / (static_cast<double>(t_.cfg_.accumulation()) * t_.layout_.dp());
      a.moe.dropped.assign(moe + 1, moe + 1 + layers);
      a.moe.tokens.assign(moe + 1 + layers, moe + 1 + layers + layers * m.moe_experts);
    }
    return a;
  }

private:
  Trainer& t_;
  std::vector<double> v_;
  MPI_Request req_{};
  bool started_ = false;
};

void Trainer::update(double lr, float grad_scale) {
  for (Chunk& c : chunks_) c.update(lr, grad_scale);
}

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

StepResult Trainer::step(int step, const Sampler& sampler, bool drain, int* stop_seen) {
  const TrainConfig& t = cfg_.train;
  StepResult r;
  const double t0 = wall_time();
  for (Chunk& c : chunks_) c.stage().zero_grads();
  const double loss = engine_->run(step, sampler, r.times, drain);
  const double t_reduce = wall_time();
  finish_gradients(r.comm);
  trace_.add("gradient reductions", t_reduce, wall_time(), step);
  const double t_update = wall_time();
  if (stop_seen != nullptr && *stop_seen == 0) *stop_seen = poll_stop_signal();
  PendingAgreement pending(*this, loss, stop_seen != nullptr ? *stop_seen : 0);
  r.lr = learning_rate(t, step);
  policy_->before_update(stages_of(chunks_)); // 2bw: W(t) stays for step t+1
  // post-validation (arXiv 2401.10241 section 4): update unclipped while the norm is summed
  const bool early = t.post_validation;
  if (early) {
    for (Chunk& c : chunks_) c.save();
    update(r.lr, 1.0f);
  }
  const Agreement agreed = pending.finish(r.norm_wait_s);
  r.loss = agreed.loss;
  r.grad_norm = agreed.grad_norm;
  r.stop = agreed.stop;
  r.moe = agreed.moe;
  if (ep_exchange_) r.moe.alltoall_s = ep_exchange_->take_seconds();
  if (test_hooks().check_tp_replicas) check_replicated_grads(step);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    if (early) {
      for (Chunk& c : chunks_) c.undo();
    }
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
    update(r.lr, grad_scale);
  } else if (grad_scale != 1.0f) { // clipping applies: the unclipped update is undone and redone
    for (Chunk& c : chunks_) c.undo();
    update(r.lr, grad_scale);
    ++updates_redone_;
  }
  trace_.add("optimizer", t_update, wall_time(), step); // loss, norm, clipping, AdamW
  r.seconds = wall_time() - t0;
  return r;
}

} // namespace pt
