// Per-step metrics (docs/design.md section 9): one line on rank 0's stdout and one JSON object per
// line in <log.dir>/metrics.jsonl.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace pt {

struct StepMetrics {
  int step = 0; // 1-based: optimizer updates done
  int steps = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double step_time_s = 0.0;
  double tflops = 0.0;
  double mfu = 0.0;              // fraction of the measured peak
  double bubble = 0.0;           // measured idle / pipeline time, mean over pipeline ranks
  double bubble_predicted = 0.0; // the simulator's, from this step's measured action costs
  // memory, the largest rank's: the peak of bytes live in pipetrain's allocations (measured),
  // the memory model's estimate, and the process's peak resident set
  double mem_bytes = 0.0;
  double mem_predicted_bytes = 0.0;
  double mem_rss_bytes = 0.0;
  double eta_s = 0.0;
  // data-parallel gradient reduction (max over ranks): time the step waited for it after the
  // schedule (exposed) and time it ran in all (overlapped with the backward or not)
  double comm_exposed_s = 0.0;
  double comm_s = 0.0;
  // the wait for the step's agreement (loss, gradient norm, stop) after the schedule, max over
  // ranks: the step boundary's synchronization (train.post_validation: after the update)
  double norm_wait_s = 0.0;
  // per pipeline rank of the first replica: compute time (F, B, BI, BW) and peak bytes
  std::vector<double> stage_compute_s, stage_mem_bytes;
  // whether the metrics over ranks above (bubble to stage_mem_bytes) were measured: on the steps
  // that log; the other steps' records carry the rest only
  bool reduced = true;
  // mixture of experts (experts > 0; docs/moe.md): the auxiliary losses added to the objective,
  // the routed slots dropped, the worst MoE layer's most loaded expert over the mean, and per
  // MoE layer the slots each expert was chosen for, before capacity (all over the global batch)
  int experts = 0;
  double aux_loss = 0.0;
  double dropped = 0.0;
  double imbalance = 0.0;
  std::vector<double> expert_tokens; // (MoE layers x experts)
  // parallel.ep > 1, on the steps that log (max over ranks): the time the expert all-to-alls took
  // and the part of it the ranks waited for (all of it: they are not overlapped yet); else -1
  double alltoall_s = -1.0, alltoall_exposed_s = -1.0;
};

struct ParamSummary {
  std::string name;
  unsigned long long digest; // FNV-1a of the float bytes
  double sum_squares;
  double projection;
};

class MetricsLog {
public:
  // Opens <dir>/metrics.jsonl (creating dir) on the rank that logs; throws pt::Error on failure.
  MetricsLog(const std::string& dir, bool active);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void step(const StepMetrics& m, bool print);
  void validation(int step, double loss);
  // One record with every tensor's summary after the last step.
  // log.param_digests: the parameters after step `step`, summarized as final_params does.
  void params(int step, const std::vector<ParamSummary>& tensors);
  void final_params(const std::vector<ParamSummary>& tensors);
  const std::string& path() const { return path_; }

private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// "1h02m", "3m05s", "12s"
std::string format_duration(double seconds);

} // namespace pt
