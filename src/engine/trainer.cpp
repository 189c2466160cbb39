#include "engine/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "cuda/device_query.hpp"
#include "data/sampler.hpp"
#include "data/token_file.hpp"
#include "model/gpt_stage.hpp"
#include "ops.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "telemetry/metrics.hpp"
#include "telemetry/peak.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr std::uint64_t kValidationStream = 0x76616c69646174ULL; // "validat": sampler stream

// Opens a token file on every rank; the first rank that fails reports for all.
std::unique_ptr<TokenFile> open_collectively(MPI_Comm comm, const std::string& path, int vocab,
                                             int seq_len) {
  std::unique_ptr<TokenFile> f;
  std::optional<Error> err;
  try {
    f = std::make_unique<TokenFile>(path, vocab, seq_len + 1);
  } catch (const Error& e) {
    err = e;
  }
  agree(comm, err);
  return f;
}

void check_device(const DeviceConfig& d) {
  if (d.kind != "cuda") return;
  std::string why;
  const int n = cuda::device_count(why);
  if (!cuda::compiled()) {
    throw input_error("device.kind = \"cuda\": " + why + "; use device.kind=\"host\"");
  }
  throw input_error("device.kind = \"cuda\": CUDA backend not built yet (this build only detects "
                    "devices: " +
                    std::to_string(n) + " visible, " + why + "); use device.kind=\"host\"");
}

int blas_threads_for(const DeviceConfig& d, const Layout& layout) {
  if (d.blas_threads > 0) return d.blas_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, layout.ranks_on_node()));
}

// Sums gradients over the data-parallel group in buckets of bucket_mb (0: one call).
void allreduce_grads(float* g, std::size_t n, double bucket_mb, MPI_Comm dp) {
  const std::size_t bucket =
      bucket_mb > 0 ? std::max<std::size_t>(1, static_cast<std::size_t>(bucket_mb * 262144.0)) : n;
  for (std::size_t off = 0; off < n; off += bucket) {
    const int count = static_cast<int>(std::min(bucket, n - off));
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, g + off, count, MPI_FLOAT, MPI_SUM, dp));
  }
}

double flops_per_token(const ModelConfig& m) {
  return 6.0 * static_cast<double>(count_model_params(m)) +
         6.0 * m.n_layer * m.d_model * static_cast<double>(m.seq_len);
}

} // namespace

void print_plan(const RunConfig& cfg, const Layout& layout) {
  const std::string table = layout.table();
  if (layout.rank() != 0) return;
  const auto& m = cfg.model;
  std::printf("== resolved deck (%s) ==\n%s\n\n", cfg.deck_path.c_str(), cfg.resolved_text.c_str());
  std::printf("== layout ==\n%s", table.c_str());
  std::printf("== partition ==\n  stage 0: embedding + layers 0-%d + final norm/head/loss "
              "(%.2fM parameters)\n",
              m.n_layer - 1, count_model_params(m) / 1e6);
  const long long tokens = static_cast<long long>(cfg.train.global_batch) * m.seq_len;
  std::printf("== plan ==\n  model: %d layers, d_model %d, %d heads, seq_len %d, vocab %d, %s "
              "embeddings, %.2fM parameters, %.1f MFLOP/token\n",
              m.n_layer, m.d_model, m.n_head, m.seq_len, m.vocab_size,
              m.tie_embeddings ? "tied" : "untied", count_model_params(m) / 1e6,
              flops_per_token(m) / 1e6);
  std::printf("  batch: global %d sequences (%lld tokens) per step = dp %d x micro-batch %d x %d "
              "accumulation; %d steps\n",
              cfg.train.global_batch, tokens, cfg.parallel.dp, cfg.train.micro_batch,
              cfg.accumulation(), cfg.train.steps);
  std::printf("  backend: %s, BLAS %s\n", cfg.device.kind.c_str(), ops::blas_name());
  std::fflush(stdout);
}

TrainResult train(const RunConfig& cfg, const Layout& layout) {
  check_device(cfg.device);
  const bool root = layout.rank() == 0;
  const auto& m = cfg.model;
  const auto& t = cfg.train;
  const int threads = blas_threads_for(cfg.device, layout);
  ops::set_blas_threads(threads);

  auto data = open_collectively(layout.world(), cfg.data.path, m.vocab_size, m.seq_len);
  std::unique_ptr<TokenFile> val_data;
  if (!cfg.data.val_path.empty()) {
    val_data = open_collectively(layout.world(), cfg.data.val_path, m.vocab_size, m.seq_len);
  }
  std::optional<Error> log_err;
  std::unique_ptr<MetricsLog> log;
  try {
    log = std::make_unique<MetricsLog>(cfg.log.dir, root);
  } catch (const Error& e) {
    log_err = e;
  }
  agree(layout.world(), log_err);

  StageSpec spec;
  spec.layer_begin = 0;
  spec.layer_end = m.n_layer;
  GptStage stage(m, spec, t.micro_batch);
  stage.init_parameters(t.seed);
  AdamW opt(stage.layout(), t);
  StageActivations acts = stage.make_activations();
  const Sampler sampler(*data, m.seq_len, t.seed);

  // MFU denominator: every rank's measured sgemm rate, summed.
  double peak = measure_sgemm_flops(0.25);
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_SUM, layout.world()));
  if (root) {
    std::printf("== run ==\n  %d BLAS thread(s) per rank; measured sgemm peak %.1f GFLOP/s "
                "(all ranks); metrics -> %s\n",
                threads, peak / 1e9, log->path().c_str());
    std::fflush(stdout);
  }

  const int accum = cfg.accumulation();
  const int dp_rank = layout.coords().dp;
  const int N = t.micro_batch * m.seq_len;
  const float loss_scale = 1.0f / (static_cast<float>(N) * accum * layout.dp());
  const double tokens_per_step = static_cast<double>(t.global_batch) * m.seq_len;
  const double fpt = flops_per_token(m);
  const double mem_bytes = static_cast<double>(stage.bytes() + opt.bytes() + acts.bytes());

  auto validate = [&](int step) {
    const int batches = cfg.data.val_batches;
    const Sampler vs(*val_data, m.seq_len, t.seed ^ kValidationStream);
    double sum = 0.0;
    for (int j = dp_rank; j < batches; j += layout.dp()) {
      vs.fill(0, static_cast<std::int64_t>(j) * t.micro_batch, t.micro_batch, acts.tokens.data(),
              acts.targets.data());
      sum += stage.forward(acts);
    }
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, layout.dp_comm()));
    if (root) log->validation(step, sum / batches);
  };

  TrainResult result;
  double time_sum = 0.0;
  double ema = 0.0;
  for (int step = 0; step < t.steps; ++step) {
    PT_MPI(MPI_Barrier(layout.world()));
    const double t0 = MPI_Wtime();
    stage.zero_grads();
    double loss = 0.0;
    for (int j = 0; j < accum; ++j) {
      const std::int64_t first = (static_cast<std::int64_t>(dp_rank) * accum + j) * t.micro_batch;
      sampler.fill(step, first, t.micro_batch, acts.tokens.data(), acts.targets.data());
      loss += stage.forward(acts);
      stage.backward(acts, nullptr, loss_scale, nullptr);
    }
    allreduce_grads(stage.grads(), stage.num_params(), cfg.comm.bucket_mb, layout.dp_comm());
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, layout.dp_comm()));
    loss /= accum * layout.dp();

    const double norm = std::sqrt(ops::sum_squares(stage.grads(), stage.num_params()));
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      throw Error(ExitCode::non_finite,
                  "step " + std::to_string(step + 1) + ": loss = " + std::to_string(loss) +
                      ", grad norm = " + std::to_string(norm) +
                      " are not finite; nothing was updated.\n---> HINT: lower train.lr, raise "
                      "train.warmup_steps, or keep train.grad_clip > 0");
    }
    // torch.nn.utils.clip_grad_norm_ semantics
    float grad_scale = 1.0f;
    if (t.grad_clip > 0.0) {
      const double coef = t.grad_clip / (norm + 1e-6);
      if (coef < 1.0) grad_scale = static_cast<float>(coef);
    }
    const double lr = learning_rate(t, step);
    opt.step(stage.params(), stage.grads(), lr, grad_scale);
    const double dt = MPI_Wtime() - t0;

    if (step > 0) time_sum += dt;
    ema = step == 0 ? dt : 0.9 * ema + 0.1 * dt;
    StepMetrics sm;
    sm.step = step + 1;
    sm.steps = t.steps;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = norm;
    sm.step_time_s = dt;
    sm.tokens_per_s = tokens_per_step / dt;
    sm.tflops = fpt * tokens_per_step / dt / 1e12;
    sm.mfu = sm.tflops * 1e12 / peak;
    sm.bubble = 0.0; // one stage: no pipeline idle time
    sm.mem_bytes = mem_bytes;
    sm.eta_s = ema * (t.steps - step - 1);
    if (root) {
      const bool print = (step + 1) % cfg.log.every == 0 || step == 0 || step + 1 == t.steps;
      log->step(sm, print);
    }
    result.steps_done = step + 1;
    result.final_loss = loss;
    const bool val_now =
        (cfg.data.val_every > 0 && (step + 1) % cfg.data.val_every == 0) || step + 1 == t.steps;
    if (val_data && val_now) {
      validate(step + 1);
    }
  }
  result.mean_tokens_per_s = t.steps > 1 ? tokens_per_step * (t.steps - 1) / time_sum : 0.0;
  return result;
}

} // namespace pt
