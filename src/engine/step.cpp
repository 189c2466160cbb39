// One optimizer step: the schedule, the gradients' reductions, the norm, clipping and AdamW.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/run.hpp"
#include "optim/lr_schedule.hpp"
#include "util/errors.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

// Every replicated tensor's gradient must be the same bytes on every tp rank (by construction:
// replicated parameters see replicated inputs). Compares min and max over the tp group.
void check_replicated_grads(std::vector<std::unique_ptr<GptStage>>& chunks, const Layout& layout,
                            int step, int& checked) {
  if (layout.tp() < 2) return;
  int count = 0;
  for (auto& c : chunks) {
    for (const auto& t : c->layout().tensors()) {
      if (t.shard_dim >= 0) continue;
      std::vector<float> lo(t.size);
      to_host(c->backend(), lo.data(), c->grads() + t.offset, t.size);
      std::vector<float> hi = lo;
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MIN,
                           layout.tp_comm()));
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MAX,
                           layout.tp_comm()));
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
  if (sched.vshape && run.cfg.model.tie_embeddings && run.layout.coords().pp == 0 &&
      sched.stages() > 1) {
    GptStage& first = *run.chunks[0];
    GptStage& last = *run.chunks[1];
    const ParamTensor& wte = first.layout().at("wte");
    float* g0 = first.grads() + wte.offset;
    float* g1 = last.grads() + last.layout().at("wte").offset;
    run.be.accumulate(g0, g1, wte.size);
    run.be.copy(g1, g0, wte.size * sizeof(float));
    run.be.synchronize();
    return;
  }
  if (!run.embedding_reduce) return;
  const int v = run.cfg.parallel.virtual_stages;
  GptStage& edge = *run.chunks[run.layout.coords().pp == 0 ? 0 : static_cast<std::size_t>(v - 1)];
  const ParamTensor& wte = edge.layout().at("wte");
  run.embedding_reduce->sum(edge.grads() + wte.offset, wte.size);
}

// ZeRO-1: the tied embedding is summed over its stages first, so that both stages' shards of it
// then hold the same sums; then every chunk's buckets are reduce-scattered over dp.
void finish_gradients_zero(Run& run, GradSyncStats& comm) {
  const double t0 = MPI_Wtime();
  for (auto& c : run.chunks) {
    c->fold_tied_head_grad();
    c->sum_sequence_parallel_grads();
  }
  sum_tied_embedding(run);
  for (std::size_t c = 0; c < run.chunks.size(); ++c) run.zero[c]->reduce(run.chunks[c]->grads());
  comm.exposed_s += MPI_Wtime() - t0;
  comm.busy_s += MPI_Wtime() - t0;
}

// Gradients after the schedule: the tied head's share folded into the embedding, the
// data-parallel sum (buckets not yet started), with sequence parallelism the norms' sums over tp
// (after the dp sum: buckets may be in flight until then), the tied embedding summed over its
// two stages.
void finish_gradients(Run& run, GradSyncStats& comm) {
  if (!run.zero.empty()) return finish_gradients_zero(run, comm);
  for (std::size_t c = 0; c < run.chunks.size(); ++c) {
    run.chunks[c]->fold_tied_head_grad();
    if (!run.syncs.empty()) run.syncs[c]->finish(comm);
    run.chunks[c]->sum_sequence_parallel_grads();
  }
  sum_tied_embedding(run);
}

// The mean loss over the global batch on every rank: the last pipeline rank's sum over its
// micro-batches, summed over dp replicas, broadcast along the pipeline.
double reduce_loss(Run& run, double loss) {
  const Layout& layout = run.layout;
  if (layout.dp() > 1) {
    run.watchdog.allreduce(&loss, 1, MPI_DOUBLE, MPI_SUM, layout.dp_comm(), "the loss all-reduce");
  }
  const schedule::Schedule& sched = run.plan.schedule;
  run.watchdog.bcast(&loss, 1, MPI_DOUBLE, sched.rank_of(sched.stages() - 1), layout.pp_comm(),
                     "the loss broadcast");
  return loss / (static_cast<double>(run.cfg.accumulation()) * layout.dp());
}

// The global gradient norm: each tensor once, summed in model order; one backend call (one
// wait on a GPU) per chunk.
double grad_norm(Run& run) {
  const Layout& layout = run.layout;
  std::vector<double> sq(run.whole.tensors().size(), 0.0);
  for (std::size_t k = 0; k < run.chunks.size(); ++k) {
    NormTensors& nt = run.norm_tensors[k];
    if (!run.zero.empty()) { // ZeRO-1: this rank's blocks of each tensor, summed over dp below
      const GptStage& chunk = *run.chunks[k];
      for (const ZeroShard::Piece& piece : run.zero[k]->pieces()) {
        const ParamTensor& t = chunk.layout().tensors()[piece.tensor];
        if (!chunk.counts_in_norm(t)) continue;
        const float* g = run.zero[k]->shard_grads() + piece.shard_offset;
        double s = 0.0;
        for (std::size_t i = 0; i < piece.size; ++i) s += static_cast<double>(g[i]) * g[i];
        sq[run.tensor_index.at(t.name)] += s;
      }
      continue;
    }
    run.be.sum_squares_each(nt.sums.data(), run.chunks[k]->grads(), nt.offset.data(),
                            nt.size.data(), static_cast<int>(nt.index.size()));
    for (std::size_t i = 0; i < nt.index.size(); ++i) sq[nt.index[i]] = nt.sums[i];
  }
  const int count = static_cast<int>(sq.size());
  if (!run.zero.empty() && layout.dp() > 1) {
    run.watchdog.allreduce(sq.data(), count, MPI_DOUBLE, MPI_SUM, layout.dp_comm(),
                           "the gradient-norm all-reduce (ZeRO-1, dp)");
  }
  if (layout.tp() > 1) {
    run.watchdog.allreduce(sq.data(), count, MPI_DOUBLE, MPI_SUM, layout.tp_comm(),
                           "the gradient-norm all-reduce (tp)");
  }
  if (layout.pp() > 1) {
    run.watchdog.allreduce(sq.data(), count, MPI_DOUBLE, MPI_SUM, layout.pp_comm(),
                           "the gradient-norm all-reduce");
  }
  double norm2 = 0.0;
  for (double x : sq) norm2 += x;
  return std::sqrt(norm2);
}

} // namespace

StepResult train_step(Run& run, int step, const Sampler& sampler, bool drain) {
  const TrainConfig& t = run.cfg.train;
  StepResult r;
  const double t0 = MPI_Wtime();
  for (auto& c : run.chunks) c->zero_grads();
  const double loss = run.engine->run(step, sampler, r.times, drain);
  const double t_reduce = MPI_Wtime();
  finish_gradients(run, r.comm);
  run.trace.add("gradient reductions", t_reduce, MPI_Wtime(), step);
  const double t_update = MPI_Wtime();
  r.loss = reduce_loss(run, loss);
  r.grad_norm = grad_norm(run);
  if (test_hooks().check_tp_replicas) {
    check_replicated_grads(run.chunks, run.layout, step, run.replicas_checked);
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
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
  r.lr = learning_rate(t, step);
  if (!run.older.empty()) { // 2bw: W(t) stays for step t+1
    for (std::size_t c = 0; c < run.older.size(); ++c) {
      run.be.copy(run.older[c].data(), run.chunks[c]->params(), run.older[c].bytes());
    }
    run.be.synchronize();
    ++run.newest;
  }
  for (std::size_t c = 0; c < run.chunks.size(); ++c) {
    if (!run.zero.empty()) {
      run.zero[c]->step(run.chunks[c]->params(), r.lr, grad_scale);
    } else {
      run.opts[c]->step(run.chunks[c]->params(), run.chunks[c]->grads(), r.lr, grad_scale);
    }
  }
  run.trace.add("optimizer", t_update, MPI_Wtime(), step); // loss, norm, clipping, AdamW
  r.seconds = MPI_Wtime() - t0;
  return r;
}

} // namespace pt
