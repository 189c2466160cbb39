// pipetrain vs the PyTorch reference (tools/reference/gpt_reference.py, float64): logits, loss,
// every parameter gradient, and ten AdamW steps, for a tied and an untied GPT-2 and two llama
// models (grouped-query and untied; multi-head and tied), and on the host in fp32 for two
// mixtures of experts. The same tests run on the host backend here (pt_unit_tests) and on the
// CUDA backend in fp32 and bf16 (tests/cuda/parity_main.cpp supplies parity_target()).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "h5_read.hpp"
#include "model/gpt_stage.hpp"
#include "ops.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "parity_target.hpp"

#ifndef PT_TEST_DATA_DIR
#error "PT_TEST_DATA_DIR must name tests/data"
#endif

namespace pt {

#ifndef PT_PARITY_EXTERNAL_TARGET
ParityTarget parity_target() {
  return {&host_backend(), 1e-4, 1e-5, true}; // fp32 on the host, deterministic sums
}
#endif

namespace {

double rel_l2(const float* got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Case {
  ModelConfig model;
  TrainConfig train;
  int B = 0;
};

class Parity : public ::testing::TestWithParam<const char*> {
protected:
  void SetUp() override {
    group_ = std::string("/") + GetParam();
    const auto a = [&](const char* n) { return file_.attr(group_, n); };
    c_.model.n_layer = static_cast<int>(a("n_layer"));
    c_.model.n_head = static_cast<int>(a("n_head"));
    c_.model.d_model = static_cast<int>(a("d_model"));
    c_.model.seq_len = static_cast<int>(a("seq_len"));
    c_.model.vocab_size = static_cast<int>(a("vocab_size"));
    c_.model.tie_embeddings = a("tie_embeddings") != 0.0;
    if (file_.has_attr(group_, "llama")) { // the llama groups
      c_.model.arch = Arch::llama;
      c_.model.n_kv_head = static_cast<int>(a("n_kv_head"));
      c_.model.ffn_hidden = static_cast<int>(a("ffn_hidden"));
      c_.model.rope_theta = a("rope_theta");
      c_.model.norm_eps = a("norm_eps");
    }
    if (file_.has_attr(group_, "moe")) { // the mixture-of-experts groups
      c_.model.moe_experts = static_cast<int>(a("experts"));
      c_.model.moe_top_k = static_cast<int>(a("top_k"));
      c_.model.moe_ffn_hidden = static_cast<int>(a("moe_ffn_hidden"));
      c_.model.moe_every = static_cast<int>(a("every"));
      c_.model.moe_shared_experts = static_cast<int>(a("shared_experts"));
      c_.model.moe_capacity_factor = a("capacity_factor");
      c_.model.moe_aux_loss = a("aux_loss");
      c_.model.moe_z_loss = a("z_loss");
    }
    c_.B = static_cast<int>(a("batch"));
    c_.train.steps = static_cast<int>(a("steps"));
    c_.train.lr = a("lr");
    c_.train.min_lr = a("min_lr");
    c_.train.warmup_steps = static_cast<int>(a("warmup_steps"));
    c_.train.weight_decay = a("weight_decay");
    c_.train.grad_clip = a("grad_clip");
    c_.train.beta1 = a("beta1");
    c_.train.beta2 = a("beta2");
    c_.train.eps = a("eps");
  }

  std::unique_ptr<GptStage> load_stage() {
    StageSpec spec;
    spec.layer_end = c_.model.n_layer;
    auto stage = std::make_unique<GptStage>(c_.model, spec, c_.B, TpGroup{}, *t_.backend,
                                            Recompute::none, t_.format);
    for (const auto& t : stage->layout().tensors()) {
      std::vector<hsize_t> shape;
      const auto w = file_.read<float>(group_ + "/model/" + t.name, &shape);
      EXPECT_EQ(shape.size(), t.shape.size()) << t.name;
      EXPECT_EQ(w.size(), t.size) << t.name;
      from_host(*t_.backend, stage->params() + t.offset, w.data(), t.size);
    }
    return stage;
  }

  void load_batch(StageActivations& a, const std::string& in, const std::string& tg,
                  std::size_t index) {
    const auto x = file_.read<std::int32_t>(group_ + in);
    const auto y = file_.read<std::int32_t>(group_ + tg);
    const std::size_t n = static_cast<std::size_t>(c_.B) * c_.model.seq_len;
    from_host(*t_.backend, a.tokens.data(), x.data() + index * n, n);
    from_host(*t_.backend, a.targets.data(), y.data() + index * n, n);
  }

  // n values of the backend's memory, on the host
  std::vector<float> host(const float* p, std::size_t n) const {
    std::vector<float> out(n);
    to_host(*t_.backend, out.data(), p, n);
    return out;
  }

  // One training step's forward and backward on the fixture's batch `step`: the loss, the
  // gradient norm (returned in norm) and the clipping factor AdamW takes.
  float step_gradients(GptStage& stage, StageActivations& a, int step, double& norm, float& clip) {
    load_batch(a, "/train/inputs", "/train/targets", static_cast<std::size_t>(step));
    stage.zero_grads();
    const float loss = stage.forward(a);
    stage.backward(a, nullptr, 1.0f / (c_.B * c_.model.seq_len), nullptr);
    stage.fold_tied_head_grad();
    norm = std::sqrt(t_.backend->sum_squares(stage.grads(), stage.num_params()));
    const double coef = c_.train.grad_clip / (norm + 1e-6);
    clip = coef < 1.0 ? static_cast<float>(coef) : 1.0f;
    return loss;
  }

  // The bf16 format against PyTorch's CPU autocast at bf16 on the same batch (the fixture's
  // autocast_bf16 group): the loss within 2 eps and each gradient within 16 eps (relative L2,
  // eps = 2^-8) of autocast's, and the worst gradient no farther from the float64 answer than
  // autocast's worst (worst_exact: this backend's, from the caller).
  void against_autocast(const GptStage& stage, float loss, const std::vector<float>& grads,
                        double worst_exact) {
    constexpr double eps = 1.0 / 256.0;
    const double want_loss = file_.attr(group_, "autocast_bf16_loss");
    EXPECT_LE(std::abs(loss - want_loss) / want_loss, 2 * eps) << loss << " vs " << want_loss;
    double worst = 0.0, autocast_exact = 0.0;
    for (const auto& t : stage.layout().tensors()) {
      const std::vector<float> ac = file_.read<float>(group_ + "/autocast_bf16/grads/" + t.name);
      const double err = rel_l2(grads.data() + t.offset, ac);
      EXPECT_LE(err, 16 * eps) << "gradient of " << t.name << " against autocast";
      worst = std::max(worst, err);
      autocast_exact = std::max(autocast_exact,
                                rel_l2(ac.data(), file_.read<float>(group_ + "/grads/" + t.name)));
    }
    std::printf("  autocast bf16: loss %.6f vs %.6f, worst gradient rel err %.3e against it; "
                "worst against float64: %.3e here, %.3e autocast's\n",
                static_cast<double>(loss), want_loss, worst, worst_exact, autocast_exact);
    EXPECT_LE(worst_exact, autocast_exact);
  }

  test::H5File file_{PT_TEST_DATA_DIR "/gpt_parity.h5"};
  std::string group_;
  Case c_;
  ParityTarget t_ = parity_target();
};

TEST_P(Parity, LogitsLossAndEveryGradient) {
  auto stage = load_stage();
  StageActivations a = stage->make_activations();
  load_batch(a, "/batch/inputs", "/batch/targets", 0);
  const int N = c_.B * c_.model.seq_len;
  const float loss = stage->forward(a);

  // logits = lnf @ head^T, recomputed from the model's final-norm output
  const auto& head = stage->layout().at(tied(c_.model) ? "wte" : "lm_head/weight");
  std::vector<float> logits(static_cast<std::size_t>(N) * c_.model.vocab_size);
  ops::matmul_forward(logits.data(), host(a.lnf.data(), a.lnf.size()).data(),
                      host(stage->params() + head.offset, head.size).data(), nullptr, N,
                      c_.model.d_model, c_.model.vocab_size);
  const double logit_err = rel_l2(logits.data(), file_.read<float>(group_ + "/logits"));
  std::printf("  %-28s rel err %.3e\n", "logits", logit_err);
  EXPECT_LE(logit_err, t_.tensor_tol);
  const double want_loss = file_.attr(group_, "loss");
  EXPECT_LE(std::abs(loss - want_loss) / want_loss, t_.tensor_tol) << loss << " vs " << want_loss;

  stage->zero_grads();
  stage->backward(a, nullptr, 1.0f / N, nullptr);
  stage->fold_tied_head_grad();
  double worst = 0.0;
  const std::vector<float> grads = host(stage->grads(), stage->num_params());
  for (const auto& t : stage->layout().tensors()) {
    const double err =
        rel_l2(grads.data() + t.offset, file_.read<float>(group_ + "/grads/" + t.name));
    std::printf("  grad %-23s rel err %.3e\n", t.name.c_str(), err);
    EXPECT_LE(err, t_.tensor_tol) << "gradient of " << t.name;
    worst = std::max(worst, err);
  }
  std::printf("  worst gradient rel err %.3e (tolerance %.1e, %s backend)\n", worst, t_.tensor_tol,
              t_.backend->name);
  if (t_.format == ActFormat::bf16) against_autocast(*stage, loss, grads, worst);
}

TEST_P(Parity, SplitBackwardEqualsFusedBackward) {
  auto stage = load_stage();
  StageActivations a = stage->make_activations();
  load_batch(a, "/batch/inputs", "/batch/targets", 0);
  const int N = c_.B * c_.model.seq_len;
  stage->forward(a);
  stage->zero_grads();
  stage->backward(a, nullptr, 1.0f / N, nullptr);
  const std::vector<float> fused = host(stage->grads(), stage->num_params());

  stage->forward(a); // probs were turned into d logits; recompute
  stage->zero_grads();
  StageStash s = stage->make_stash();
  stage->backward_input(a, nullptr, 1.0f / N, s);
  // backward-input alone must not touch weight gradients
  EXPECT_EQ(t_.backend->sum_squares(stage->grads(), stage->num_params()), 0.0);
  stage->backward_weight(a, s);
  const std::vector<float> split = host(stage->grads(), stage->num_params());
  if (t_.exact_split) {
    for (std::size_t i = 0; i < fused.size(); ++i) {
      ASSERT_EQ(fused[i], split[i]) << "index " << i;
    }
  } else { // sums with atomics: the same within the tolerance, not bit for bit
    for (const auto& t : stage->layout().tensors()) {
      const std::vector<float> want(fused.begin() + static_cast<std::ptrdiff_t>(t.offset),
                                    fused.begin() + static_cast<std::ptrdiff_t>(t.offset + t.size));
      EXPECT_LE(rel_l2(split.data() + t.offset, want), t_.tensor_tol) << t.name;
    }
  }
}

TEST_P(Parity, TenAdamWSteps) {
  auto stage = load_stage();
  StageActivations a = stage->make_activations();
  AdamW opt(stage->layout(), c_.train, *t_.backend);
  const auto losses = file_.read<double>(group_ + "/train/losses");
  const auto norms = file_.read<double>(group_ + "/train/grad_norms");
  const auto lrs = file_.read<double>(group_ + "/train/lrs");
  for (int step = 0; step < c_.train.steps; ++step) {
    double norm = 0.0;
    float clip = 1.0f;
    const float loss = step_gradients(*stage, a, step, norm, clip);
    const double lr = learning_rate(c_.train, step);
    const double loss_err = std::abs(loss - losses[static_cast<std::size_t>(step)]) /
                            losses[static_cast<std::size_t>(step)];
    std::printf("  step %2d loss %.6f (torch %.6f, rel err %.2e) grad norm %.5f (torch %.5f)\n",
                step + 1, loss, losses[static_cast<std::size_t>(step)], loss_err, norm,
                norms[static_cast<std::size_t>(step)]);
    EXPECT_LE(loss_err, t_.loss_tol) << "step " << step + 1;
    EXPECT_NEAR(norm, norms[static_cast<std::size_t>(step)],
                t_.tensor_tol * norms[static_cast<std::size_t>(step)]);
    EXPECT_NEAR(lr, lrs[static_cast<std::size_t>(step)], 1e-15);
    opt.step(stage->params(), stage->grads(), lr, clip);
  }
  EXPECT_EQ(opt.updates(), c_.train.steps);
}

// PipeDream-2BW's rule (docs/design.md section 6) against PyTorch's delayed update: step t computes
// its loss and gradient with W(max(t-1, 0)) (GptStage::use_weights, as the 2bw engine does) and
// AdamW turns W(t) into W(t+1), the pre-update weights kept as the next step's older version.
TEST_P(Parity, TenTwoBwSteps) {
  auto stage = load_stage();
  StageActivations a = stage->make_activations();
  AdamW opt(stage->layout(), c_.train, *t_.backend);
  const auto losses = file_.read<double>(group_ + "/two_bw/losses");
  const auto norms = file_.read<double>(group_ + "/two_bw/grad_norms");
  FloatBuffer older(stage->num_params(), Memory{t_.backend->alloc, t_.backend->release});
  for (int step = 0; step < c_.train.steps; ++step) {
    double norm = 0.0;
    float clip = 1.0f;
    stage->use_weights(step == 0 ? nullptr : older.data());
    const float loss = step_gradients(*stage, a, step, norm, clip);
    stage->use_weights(nullptr);
    const double want = losses[static_cast<std::size_t>(step)];
    std::printf("  2bw step %2d loss %.6f (torch %.6f) grad norm %.5f (torch %.5f)\n", step + 1,
                loss, want, norm, norms[static_cast<std::size_t>(step)]);
    EXPECT_LE(std::abs(loss - want) / want, t_.loss_tol) << "step " << step + 1;
    EXPECT_NEAR(norm, norms[static_cast<std::size_t>(step)],
                t_.tensor_tol * norms[static_cast<std::size_t>(step)]);
    t_.backend->copy(older.data(), stage->params(), older.bytes());
    t_.backend->synchronize();
    opt.step(stage->params(), stage->grads(), learning_rate(c_.train, step), clip);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Parity,
                         ::testing::Values("tied", "untied", "llama_gqa", "llama_tied"));
#ifndef PT_PARITY_EXTERNAL_TARGET
// Mixtures of experts (docs/moe.md) run on the host in fp32 only: a GPT-2 with an MoE layer every
// second block, a shared expert and a capacity that drops tokens; a Mixtral-style llama. The
// objective the gradients are of adds each layer's auxiliary losses to the cross-entropy.
INSTANTIATE_TEST_SUITE_P(Moe, Parity, ::testing::Values("moe_gpt2", "mixtral"));
#endif

} // namespace
} // namespace pt
