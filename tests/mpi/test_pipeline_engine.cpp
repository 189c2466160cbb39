// The pipeline engine on its own, over every rank of the job as one pipeline (pp = ranks) of a
// tiny model (8 layers, d = 16, untied head): for gpipe, 1f1b, interleaved (v = 2), zb-h1, zb-v
// and dualpipev, one step's action list through PipelineEngine::run must give every chunk the
// gradients, bit for bit, that the whole model on one stage gets from the same micro-batches
// run one after another (forward, then backward), and the last stage the same loss sum; a second
// step (gradients zeroed) must do it again with the next step's data; evaluate() must return the
// whole model's mean loss over the validation micro-batches. Prints "N passed, 0 failed" on
// rank 0; exit code 1 on any failure.
// argv[1]: a token file with vocabulary 256 (the test data).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/layout.hpp"
#include "comm/watchdog.hpp"
#include "config/run_config.hpp"
#include "data/sampler.hpp"
#include "engine/pipeline.hpp"
#include "engine/step_policy.hpp"
#include "model/gpt_stage.hpp"
#include "model/partition.hpp"
#include "schedule/schedule.hpp"

namespace {

constexpr int kMicroBatches = 8; // dualpipev needs 2 pp at pp = 4

struct Tally {
  int rank = 0, passed = 0, failed = 0;
  void check(bool ok, const std::string& what) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_CXX_BOOL, MPI_LAND, MPI_COMM_WORLD);
    ok ? ++passed : ++failed;
    if (!ok && rank == 0) std::printf("FAIL: %s\n", what.c_str());
  }
};

pt::RunConfig tiny_run(const pt::TokenFile& data, int ranks, pt::ScheduleKind kind, int v) {
  pt::RunConfig c;
  c.data.path = data.path();
  c.model.n_layer = 8;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.model.seq_len = 8;
  c.model.vocab_size = 256;
  c.model.tie_embeddings = false; // the tied sum is the step's (engine/step.cpp), not the engine's
  c.train.micro_batch = 1;
  c.train.global_batch = kMicroBatches;
  c.parallel.pp = ranks;
  c.parallel.dp = 1;
  c.parallel.schedule = kind;
  c.parallel.virtual_stages = v;
  pt::validate(c, ranks);
  return c;
}

// The whole model's gradients and loss sum over step `step`'s micro-batches, one after another.
struct Whole {
  pt::GptStage stage;
  double loss = 0.0;
  Whole(const pt::RunConfig& c, const pt::Sampler& sampler, int step)
      : stage(c.model, pt::StageSpec{true, true, 0, c.model.n_layer}, 1) {
    stage.init_parameters(c.train.seed);
    const float scale = 1.0f / static_cast<float>(c.model.seq_len * kMicroBatches);
    pt::StageActivations a = stage.make_activations();
    for (int j = 0; j < kMicroBatches; ++j) {
      sampler.fill(step, j, 1, a.tokens.data(), a.targets.data());
      loss += stage.forward(a, scale);
      stage.backward(a, nullptr, scale, nullptr);
    }
  }
};

bool same_grads(pt::GptStage& chunk, pt::GptStage& whole) {
  for (const pt::ParamTensor& t : chunk.layout().tensors()) {
    const pt::ParamTensor& w = whole.layout().at(t.name);
    if (std::memcmp(chunk.grads() + t.offset, whole.grads() + w.offset, t.size * sizeof(float))) {
      std::printf("  %s differs\n", t.name.c_str());
      return false;
    }
  }
  return true;
}

void schedule_case(Tally& t, const pt::TokenFile& data, pt::ScheduleKind kind, int v) {
  int ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const pt::RunConfig cfg = tiny_run(data, ranks, kind, v);
  const pt::Layout layout(MPI_COMM_WORLD, cfg.parallel, cfg.comm);
  const pt::Watchdog watchdog(60.0, t.rank);
  const pt::schedule::Schedule sched = pt::schedule::make_schedule(kind, ranks, kMicroBatches, v);
  const std::vector<int> layers = pt::partition_layers(
      cfg.parallel, cfg.model.n_layer, sched.stages(), pt::parameter_costs(cfg.model));
  std::vector<std::unique_ptr<pt::GptStage>> owned;
  std::vector<pt::GptStage*> chunks;
  for (int c = 0; c < v; ++c) {
    owned.push_back(std::make_unique<pt::GptStage>(
        cfg.model, pt::stage_spec(layers, sched.stage_of(layout.coords().pp, c)), 1));
    owned.back()->init_parameters(cfg.train.seed);
    chunks.push_back(owned.back().get());
  }
  const std::unique_ptr<pt::StepPolicy> policy =
      pt::make_step_policy(cfg, sched, layout.coords().pp, chunks, pt::host_backend());
  pt::PipelineEngine engine(cfg, layout, sched, chunks, watchdog, *policy);
  const pt::Sampler sampler(data, cfg.model.seq_len, cfg.train.seed);
  const bool last = layout.coords().pp == sched.rank_of(sched.stages() - 1);
  const std::string name = pt::name(kind);
  for (int step = 0; step < 2; ++step) {
    for (pt::GptStage* c : chunks) c->zero_grads();
    pt::StepTimes times;
    const double loss = engine.run(step, sampler, times);
    Whole whole(cfg, sampler, step);
    bool same = true;
    for (pt::GptStage* c : chunks) same = same_grads(*c, whole.stage) && same;
    t.check(same, name + " step " + std::to_string(step + 1) +
                      ": every chunk's gradients equal the whole model's, bit for bit");
    t.check(!last || loss == whole.loss, name + ": the last stage's loss sum");
    t.check(times.op_n[0] == kMicroBatches * v, name + ": one timed F per micro-batch and chunk");
  }
  // validation: the mean over 3 micro-batches of the whole model's losses (no backward)
  const pt::Sampler val(data, cfg.model.seq_len, cfg.train.seed + 1);
  Whole ref(cfg, val, 0);
  pt::StageActivations a = ref.stage.make_activations();
  double want = 0.0;
  for (int j = 0; j < 3; ++j) {
    val.fill(0, j, 1, a.tokens.data(), a.targets.data());
    want += ref.stage.forward(a);
  }
  t.check(engine.evaluate(val, 3) == want / 3, name + ": evaluate() equals the whole model's");
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Tally t;
  MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
  if (argc < 2) {
    if (t.rank == 0) std::printf("usage: %s TOKEN_FILE\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  {
    const pt::TokenFile data(argv[1], 256, 9);
    using K = pt::ScheduleKind;
    schedule_case(t, data, K::gpipe, 1);
    schedule_case(t, data, K::one_f_one_b, 1);
    schedule_case(t, data, K::zb_h1, 1);
    schedule_case(t, data, K::interleaved, 2);
    schedule_case(t, data, K::zb_v, 2);
    schedule_case(t, data, K::dualpipev, 2);
  }
  if (t.rank == 0) std::printf("%d passed, %d failed\n", t.passed, t.failed);
  MPI_Finalize();
  return t.failed == 0 ? 0 : 1;
}
