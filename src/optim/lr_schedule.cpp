#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace pt {

double learning_rate(const TrainConfig& t, int step) {
  if (step < t.warmup_steps) return t.lr * (step + 1) / t.warmup_steps;
  const int decay_steps = std::max(1, t.steps - t.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / decay_steps);
  const double min_lr = t.min_lr.value_or(t.lr / 10.0);
  return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
}

} // namespace pt
