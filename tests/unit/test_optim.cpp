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
  EXPECT_FALSE(part.layout().has("wte"));
  const auto& t = part.layout().at("h/002/mlp/proj/weight");
  for (std::size_t i = 0; i < t.size; ++i) {
    ASSERT_EQ(part.params()[t.offset + i], at("h/002/mlp/proj/weight")[i]);
  }
}

} // namespace
} // namespace pt

namespace pt {
namespace {

TEST(TensorParallel, EmbeddingAndHeadMemoryFallsByTp) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 32;
  m.vocab_size = 256;
  StageSpec whole;
  whole.layer_end = m.n_layer;
  std::size_t wte1 = 0, probs1 = 0, qkv1 = 0;
  for (int tp : {1, 2, 4}) {
    GptStage stage(m, whole, 2, TpGroup{MPI_COMM_NULL, tp - 1, tp});
    const std::size_t wte = stage.layout().at("wte").size;
    const std::size_t probs = stage.make_activations().probs.size();
    const std::size_t qkv = stage.layout().at("h/000/attn/qkv/weight").size;
    if (tp == 1) {
      wte1 = wte;
      probs1 = probs;
      qkv1 = qkv;
    }
    EXPECT_EQ(wte * static_cast<std::size_t>(tp), wte1) << "tp " << tp;     // embedding/head rows
    EXPECT_EQ(probs * static_cast<std::size_t>(tp), probs1) << "tp " << tp; // logits never whole
    EXPECT_EQ(qkv * static_cast<std::size_t>(tp), qkv1) << "tp " << tp;
    EXPECT_EQ(stage.layout().at("lnf/weight").size, 64u); // replicated
  }
}

TEST(TensorParallel, ShardsMapToTheWholeTensor) {
  // qkv rows of tp rank 1 of 2: its halves of q, k and v (C = 4: rows 2-3, 6-7, 10-11)
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 2;
  m.d_model = 4;
  m.seq_len = 2;
  m.vocab_size = 8;
  const ParamLayout l(m, StageSpec{true, true, 0, 1}, 1, 2);
  const ParamTensor& qkv = l.at("h/000/attn/qkv/weight"); // local (6, 4) of (12, 4)
  EXPECT_EQ(l.global_index(qkv, 0), 2u * 4);
  EXPECT_EQ(l.global_index(qkv, 2 * 4), 6u * 4);
  EXPECT_EQ(l.global_index(qkv, 5 * 4 + 3), 11u * 4 + 3);
  const ParamTensor& proj = l.at("h/000/attn/proj/weight"); // local (4, 2) of (4, 4): columns 2-3
  EXPECT_EQ(l.global_index(proj, 0), 2u);
  EXPECT_EQ(l.global_index(proj, 3), 1u * 4 + 3);
  const ParamTensor& wte = l.at("wte"); // vocabulary rows 4-7
  EXPECT_EQ(l.global_index(wte, 0), 4u * 4);
}

} // namespace
} // namespace pt
