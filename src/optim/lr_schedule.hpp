// Linear warmup then cosine decay to min_lr over train.steps.
// step is 0-based: the rate used by the (step+1)-th optimizer update.
#pragma once

#include "config/run_config.hpp"

namespace pt {

double learning_rate(const TrainConfig& t, int step);

} // namespace pt
