// One training run on this rank, a Trainer: what is set up once before the first step
// (engine/setup.cpp), one optimizer step (engine/step.cpp), what each step and the end of the
// run report (engine/report.cpp), and the run control that strings them together
// (engine/trainer.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "checkpoint/async_writer.hpp"
#include "comm/alltoall.hpp"
#include "comm/group_reducer.hpp"
#include "comm/watchdog.hpp"
#include "data/sampler.hpp"
#include "data/token_file.hpp"
#include "engine/chunk.hpp"
#include "engine/pipeline.hpp"
#include "engine/step_policy.hpp"
#include "engine/trainer.hpp"
#include "model/param_layout.hpp"
#include "telemetry/metrics.hpp"
#include "telemetry/trace.hpp"

namespace pt {

// The kernel backend of device.kind (collective: every rank reaches the same verdict), wrapped
// in the op timer when log.op_profile is on.
const Backend& open_backend(const RunConfig& cfg, MPI_Comm world);

// What an MoE model's router did in a step, over the global batch (docs/moe.md): the auxiliary
// losses the objective added (weighted, summed over MoE layers, mean over micro-batches); per MoE
// layer the routed slots dropped and (layer x experts) the slots each expert was chosen for.
struct MoeStepStats {
  double aux_loss = 0.0;
  double alltoall_s = 0.0; // this rank's time in the expert all-to-all (parallel.ep > 1)
  std::vector<double> dropped;
  std::vector<double> tokens;
};

struct StepResult {
  double loss = 0.0; // mean over the global batch
  double grad_norm = 0.0;
  double lr = 0.0;
  double seconds = 0.0;
  int stop = 0; // the stop signal any rank had seen when the step's sums were agreed, or 0
  // time this rank waited for the step's agreement (loss, gradient norm, stop) after the schedule
  // (train.post_validation: after its unclipped update)
  double norm_wait_s = 0.0;
  StepTimes times;
  GradSyncStats comm;
  MoeStepStats moe;
};

// The stop signal (SIGTERM or SIGUSR1) pending on this rank, collected without waiting, or 0.
int poll_stop_signal();

// What the steps of this run add up to, for the end-of-run summary.
struct RunTotals {
  int first_step = 0;    // steps done before this run (resume)
  int steps_done = 0;    // after the last step run
  double time_sum = 0.0; // the steps after this run's first
  double first_dt = 0.0; // this run's first step
  double ema = 0.0;      // smoothed step time, for the ETA
  double final_loss = 0.0;
  GradSyncStats comm; // this rank's, summed over the steps (reduced over ranks at the end)
  // the most collectives (Watchdog::collectives) one step made among the steps that neither log,
  // validate nor checkpoint; -1 when there was none
  long quiet_collectives = -1;
};

// Whether this step logs (every log.every steps, the run's first and the last): only the steps
// that log reduce the metrics beyond the loss and the gradient norm.
bool step_logs(const RunConfig& cfg, int step, int first_step);

class Trainer {
public:
  // Collective over layout.world(): opens the backend, data and metrics log, makes the chunks,
  // optimizers, reducers, pipeline engine and gradient reductions, measures the peak rate.
  Trainer(const RunConfig& cfg, const Layout& layout, const Plan& plan);
  // Collective: the steps from where the checkpoint left off, with validation, checkpoints and
  // stop signals (engine/trainer.cpp), then the end-of-run summary.
  TrainResult train();

private:
  class PendingAgreement; // engine/step.cpp: the step's one world sum
  struct Checkpoints;     // engine/trainer.cpp: resume and saves

  // engine/setup.cpp
  void make_chunks();
  void print_header() const; // kernels, threads, peak, where GPU traffic goes (rank 0)

  // engine/step.cpp: one optimizer step (collective): zero the gradients, run the schedule,
  // finish the gradients (tied head, dp reduction, tied embedding), reduce the loss, the global
  // norm and clipping, AdamW. Throws Error(non_finite) before any update when the loss or norm
  // is not finite. drain: the step ends with the cool-down (the policy decides whether that is a
  // choice: 2bw). stop_seen: the stop signal this rank has seen (0 if none; polled here if none
  // yet), agreed in the step's one world sum into StepResult::stop; nullptr: not agreed here.
  StepResult step(int step, const Sampler& sampler, bool drain, int* stop_seen);
  void finish_gradients(GradSyncStats& comm);
  void sum_tied_embedding();
  void check_replicated_grads(int step);
  void update(double lr, float grad_scale);

  // engine/report.cpp: a step's metrics (bubble against the simulator's prediction, dp
  // reduction, memory, MFU): one line on rank 0 and one metrics.jsonl record; after the last
  // step the dp reduction and auto's choices, the op profile and the final parameters' digests
  // (layouts that must be bit-identical compare these). Collective.
  void report_step(int step, const StepResult& s, RunTotals& totals);
  void report_end(const RunTotals& totals);
  std::pair<double, double> bubble_of(const StepTimes& times, int step);
  void report_dp_reduction(const RunTotals& totals) const;
  void report_collectives(const RunTotals& totals) const;
  void report_final_params();

  // engine/trainer.cpp: run control
  bool validation_due(int step) const;
  void validate_if_due(int step);
  int stop_after(int step, int first_step, int agreed) const;
  int agree_stop_before_step(int& stop_seen) const;
  void print_stopping(int step, int stop) const;

  const RunConfig& cfg_;
  const Layout& layout_;
  const Plan& plan_;
  const Backend& be_;
  Watchdog watchdog_;
  std::unique_ptr<TokenFile> data_, val_data_;
  std::unique_ptr<MetricsLog> log_;
  bool nccl_ = false, nccl_p2p_ = false;    // GPU dp/tp reductions, pipeline messages through NCCL
  std::string staged_why_, p2p_why_;        // why not, when not
  std::unique_ptr<GroupReducer> tp_reduce_; // tp > 1; shared by the chunks (one at a time)
  std::unique_ptr<GroupReducer> embedding_reduce_; // tied embedding across the first/last stage
  std::unique_ptr<Alltoaller> ep_exchange_;        // ep > 1: the expert token exchange, the chunks'
  std::vector<Chunk> chunks_;                      // chunk c: plan.schedule.stage_of(pp rank, c)
  // checkpoint.async: the writer (after chunks_, so that it finishes before they go)
  std::unique_ptr<AsyncWriter> async_writer_;
  ParamLayout whole_;                  // every tensor of the model, in model order
  std::unique_ptr<StepPolicy> policy_; // synchronous or 2bw, from the schedule kind
  std::unique_ptr<PipelineEngine> engine_;
  Trace trace_;              // log.trace
  double peak_flops_ = 0.0;  // every rank's measured GEMM rate, summed
  int replicas_checked_ = 0; // test hook check_tp_replicas
  int updates_redone_ = 0;   // train.post_validation: updates undone and redone (clipping)
};

} // namespace pt
