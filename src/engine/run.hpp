// One training run on this rank: what is set up once before the first step (engine/setup.cpp),
// one optimizer step (engine/step.cpp), and what each step and the end of the run report
// (engine/report.cpp). train() (engine/trainer.cpp) strings them together with run control.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
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

struct Run {
  // Collective over layout.world(): opens the backend, data and metrics log, makes the chunks,
  // optimizers, reducers, pipeline engine and gradient reductions, measures the peak rate.
  Run(const RunConfig& cfg, const Layout& layout, const Plan& plan);

  const RunConfig& cfg;
  const Layout& layout;
  const Plan& plan;
  const Backend& be;
  Watchdog watchdog;
  std::unique_ptr<TokenFile> data, val_data;
  std::unique_ptr<MetricsLog> log;
  bool nccl = false, nccl_p2p = false;     // GPU dp/tp reductions, pipeline messages through NCCL
  std::string staged_why, p2p_why;         // why not, when not
  std::unique_ptr<GroupReducer> tp_reduce; // tp > 1; shared by the chunks (one at a time)
  std::unique_ptr<GroupReducer> embedding_reduce; // tied embedding across the first/last stage
  std::vector<Chunk> chunks;                      // chunk c: plan.schedule.stage_of(pp rank, c)
  ParamLayout whole;                              // every tensor of the model, in model order
  std::unique_ptr<StepPolicy> policy;             // synchronous or 2bw, from the schedule kind
  std::unique_ptr<PipelineEngine> engine;
  Trace trace;              // log.trace
  double peak_flops = 0.0;  // every rank's measured GEMM rate, summed
  int replicas_checked = 0; // test hook check_tp_replicas
  int updates_redone = 0;   // train.post_validation: updates undone and redone (clipping)
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
};

// One optimizer step (collective): zero the gradients, run the schedule, finish the gradients
// (tied head, dp reduction, tied embedding), reduce the loss, the global norm and clipping,
// AdamW. Throws Error(non_finite) before any update when the loss or norm is not finite.
// drain: the step ends with the cool-down (the policy decides whether that is a choice: 2bw).
// stop_seen: the stop signal this rank has seen (0 if none; polled here if none yet), agreed
// in the step's one world sum into StepResult::stop; nullptr: not agreed here (2bw).
StepResult train_step(Run& run, int step, const Sampler& sampler, bool drain = true,
                      int* stop_seen = nullptr);

// The stop signal (SIGTERM or SIGUSR1) pending on this rank, collected without waiting, or 0.
int poll_stop_signal();

// The run's setup on rank 0's stdout: kernels, threads, peak, where GPU traffic goes.
void print_run_header(const Run& run);

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

// A step's metrics (bubble against the simulator's prediction, dp reduction, memory, MFU): one
// line on rank 0 and one metrics.jsonl record. Collective.
void report_step(Run& run, int step, const StepResult& s, RunTotals& totals);

// After the last step: the dp reduction and auto's choices, the op profile, and the final
// parameters' digests (layouts that must be bit-identical compare these). Collective.
void report_end(Run& run, const RunTotals& totals);

} // namespace pt
