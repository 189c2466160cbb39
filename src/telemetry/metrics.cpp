#include "telemetry/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "util/errors.hpp"

namespace pt {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", s);
  }
  return buf;
}

MetricsLog::MetricsLog(const std::string& dir, bool active) {
  if (!active) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
  file_ = ec ? nullptr : std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    throw input_error("log.dir: cannot write '" + path_ +
                      "': " + (ec ? ec.message() : std::string(std::strerror(errno))) +
                      "\n---> HINT: set log.dir to a writable directory");
  }
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::step(const StepMetrics& m, bool print) {
  if (file_ == nullptr) return;
  std::fprintf(file_,
               "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6e, "
               "\"tokens_per_s\": %.1f, \"step_time_s\": %.6f, \"tflops\": %.6f, \"mfu\": %.6f",
               m.step, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_time_s, m.tflops, m.mfu);
  if (m.experts > 0) {
    std::fprintf(file_,
                 ", \"aux_loss\": %.6e, \"moe_dropped\": %.0f, \"moe_imbalance\": %.6f, "
                 "\"expert_tokens\": [",
                 m.aux_loss, m.dropped, m.imbalance);
    const std::size_t E = static_cast<std::size_t>(m.experts);
    for (std::size_t i = 0; i < m.expert_tokens.size(); ++i) {
      std::fprintf(file_, "%s%.0f%s", i % E == 0 ? (i ? ", [" : "[") : ", ", m.expert_tokens[i],
                   i % E == E - 1 ? "]" : "");
    }
    std::fprintf(file_, "]");
  }
  if (m.reduced && m.alltoall_s >= 0.0) {
    std::fprintf(file_, ", \"alltoall_s\": %.6f, \"alltoall_exposed_s\": %.6f", m.alltoall_s,
                 m.alltoall_exposed_s);
  }
  if (!m.reduced) {
    std::fprintf(file_, "}\n");
  } else {
    std::fprintf(file_,
                 ", \"bubble\": %.6f, \"bubble_predicted\": %.6f, \"mem_bytes\": %.0f, "
                 "\"mem_predicted_bytes\": %.0f, \"mem_rss_bytes\": %.0f, "
                 "\"comm_exposed_s\": %.6f, \"comm_s\": %.6f, \"norm_wait_s\": %.6f, "
                 "\"stage_compute_s\": [",
                 m.bubble, m.bubble_predicted, m.mem_bytes, m.mem_predicted_bytes, m.mem_rss_bytes,
                 m.comm_exposed_s, m.comm_s, m.norm_wait_s);
    for (std::size_t r = 0; r < m.stage_compute_s.size(); ++r) {
      std::fprintf(file_, "%s%.6f", r ? ", " : "", m.stage_compute_s[r]);
    }
    std::fprintf(file_, "], \"stage_mem_bytes\": [");
    for (std::size_t r = 0; r < m.stage_mem_bytes.size(); ++r) {
      std::fprintf(file_, "%s%.0f", r ? ", " : "", m.stage_mem_bytes[r]);
    }
    std::fprintf(file_, "]}\n");
  }
  std::fflush(file_);
  if (!print) return;
  char moe[96] = "";
  if (m.experts > 0) {
    std::snprintf(moe, sizeof moe, " | aux %.4f | experts max/mean %.2f", m.aux_loss, m.imbalance);
  }
  std::printf("step %6d/%d | loss %.4f%s | lr %.2e | grad-norm %.3f | %8.0f tok/s | MFU %5.1f%% | "
              "bubble %4.1f%% (pred %4.1f%%) | ETA %s\n",
              m.step, m.steps, m.loss, moe, m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu,
              100.0 * m.bubble, 100.0 * m.bubble_predicted, format_duration(m.eta_s).c_str());
  std::fflush(stdout);
}

namespace {

// [["name", "digest", sum of squares, projection], ...]
void write_summaries(std::FILE* f, const std::vector<ParamSummary>& tensors) {
  std::fprintf(f, "[");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::fprintf(f, "%s[\"%s\", \"%016llx\", %.17g, %.17g]", i ? ", " : "", t.name.c_str(),
                 t.digest, t.sum_squares, t.projection);
  }
  std::fprintf(f, "]");
}

} // namespace

void MetricsLog::params(int step, const std::vector<ParamSummary>& tensors) {
  if (file_ == nullptr) return;
  std::fprintf(file_, "{\"step\": %d, \"params\": ", step);
  write_summaries(file_, tensors);
  std::fprintf(file_, "}\n");
  std::fflush(file_);
}

void MetricsLog::final_params(const std::vector<ParamSummary>& tensors) {
  if (file_ == nullptr) return;
  std::fprintf(file_, "{\"final_params\": ");
  write_summaries(file_, tensors);
  std::fprintf(file_, "}\n");
  std::fflush(file_);
}

void MetricsLog::validation(int step, double loss) {
  if (file_ == nullptr) return;
  std::fprintf(file_, "{\"step\": %d, \"val_loss\": %.6f}\n", step, loss);
  std::fflush(file_);
  std::printf("step %6d | val loss %.4f\n", step, loss);
  std::fflush(stdout);
}

} // namespace pt
