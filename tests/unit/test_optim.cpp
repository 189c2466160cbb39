// LR schedule, AdamW's decay rules, and parameter initialization.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_stage.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"

namespace pt {
namespace {

TEST(LearningRate, WarmupThenCosineToMinimum) {
  TrainConfig t;
  t.steps = 100;
  t.warmup_steps = 10;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(learning_rate(t, 0), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 9), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1e-3);
  EXPECT_NEAR(learning_rate(t, 55), 0.5 * (1e-3 + 1e-4), 1e-15); // half way down the cosine
  EXPECT_NEAR(learning_rate(t, 100), 1e-4, 1e-15);
  for (int s = 11; s < 100; ++s) EXPECT_LT(learning_rate(t, s), learning_rate(t, s - 1));
}

ModelConfig small_model() {
  ModelConfig m;
  m.n_layer = 4;
  m.n_head = 2;
  m.d_model = 64;
  m.seq_len = 32;
  m.vocab_size = 256;
  return m;
}

TEST(AdamW, DecaysMatricesButNotBiasesOrNorms) {
  const ModelConfig m = small_model();
  StageSpec spec;
  spec.layer_end = m.n_layer;
  GptStage stage(m, spec, 1);
  stage.init_parameters(1);
  std::vector<float> before(stage.params(), stage.params() + stage.num_params());
  TrainConfig t;
  t.weight_decay = 0.5;
  AdamW opt(stage.layout(), t);
  stage.zero_grads(); // zero gradient: only weight decay moves parameters
  opt.step(stage.params(), stage.grads(), 0.1, 1.0f);
  for (const auto& tensor : stage.layout().tensors()) {
    const float factor = tensor.decay ? 1.0f - 0.1f * 0.5f : 1.0f;
    for (std::size_t i = 0; i < tensor.size; ++i) {
      ASSERT_FLOAT_EQ(stage.params()[tensor.offset + i], before[tensor.offset + i] * factor)
          << tensor.name;
    }
    const bool is_matrix = tensor.shape.size() == 2;
    EXPECT_EQ(tensor.decay, is_matrix) << tensor.name;
  }
}

double stddev(const float* p, std::size_t n) {
  double s = 0.0, s2 = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    s += p[i];
    s2 += static_cast<double>(p[i]) * p[i];
  }
  return std::sqrt(s2 / n - (s / n) * (s / n));
}

TEST(Init, FollowsDesignAndDoesNotDependOnTheStage) {
  const ModelConfig m = small_model();
  StageSpec whole;
  whole.layer_end = m.n_layer;
  GptStage full(m, whole, 1);
  full.init_parameters(42);
  const auto& L = full.layout();
  auto at = [&](const char* n) { return full.params() + L.at(n).offset; };
  EXPECT_NEAR(stddev(at("wte"), L.at("wte").size), 0.02, 0.001);
  EXPECT_NEAR(stddev(at("h/000/mlp/fc/weight"), L.at("h/000/mlp/fc/weight").size), 0.02, 0.001);
  EXPECT_NEAR(stddev(at("h/002/attn/proj/weight"), L.at("h/002/attn/proj/weight").size),
              0.02 / std::sqrt(2.0 * m.n_layer), 0.0005);
  EXPECT_EQ(at("h/001/ln1/weight")[5], 1.0f);
  EXPECT_EQ(at("h/001/attn/qkv/bias")[5], 0.0f);

  // a middle stage (layers 1-2, no embedding, no head) initializes its layers identically
  StageSpec middle{false, false, 1, 3};
  GptStage part(m, middle, 1);
  part.init_parameters(42);
  EXPECT_EQ(part.layout().find(Role::wte), nullptr);
  const auto& t = part.layout().at("h/002/mlp/proj/weight");
  for (std::size_t i = 0; i < t.size; ++i) {
    ASSERT_EQ(part.params()[t.offset + i], at("h/002/mlp/proj/weight")[i]);
  }
}

} // namespace
} // namespace pt
