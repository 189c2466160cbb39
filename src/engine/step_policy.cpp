#include "engine/step_policy.hpp"

namespace pt {
namespace {

using schedule::Action;

class Synchronous final : public StepPolicy {
public:
  explicit Synchronous(const std::vector<Action>& list) : list_(list) {}
  const std::vector<Action>& list(int /*step*/, bool /*drain*/) override { return list_; }
  std::vector<const std::vector<Action>*> lists() const override { return {&list_}; }
  std::pair<int, int> step_of(int step, int mb) const override { return {step, mb}; }
  float* weights_for(int /*chunk*/, int /*step*/) override { return nullptr; }
  bool stops_before_step() const override { return false; }
  void before_update(const std::vector<GptStage*>& /*stages*/) override {}
  std::vector<FloatBuffer>* older_weights() override { return nullptr; }
  void resumed_at(int /*step*/) override {}

private:
  const std::vector<Action>& list_;
};

// PipeDream-2BW (schedule::two_bw_steps): eight lists by the step's parity, whether the previous
// step drained (warm) and whether this one drains; micro-batch j of step s has id (s % 2) m + j.
// older_[c]: chunk c's weights one version older than its params() (W(u-1) where params() holds
// W(u), u = newest_, the updates done).
class TwoBw final : public StepPolicy {
public:
  TwoBw(int p, int m, int me, const std::vector<GptStage*>& stages, const Backend& be)
      : me_(me), m_(m), be_(be), lists_(schedule::two_bw_steps(p, m)) {
    for (const GptStage* s : stages) {
      older_.emplace_back(s->num_params(), Memory{be.alloc, be.release});
    }
  }
  const std::vector<Action>& list(int step, bool drain) override {
    const int k = step % 2 + (warm_ ? 2 : 0) + (drain ? 4 : 0);
    warm_ = drain; // the next list starts with the warm-up forwards after a drained one
    return lists_[static_cast<std::size_t>(k)].ranks[static_cast<std::size_t>(me_)];
  }
  std::vector<const std::vector<Action>*> lists() const override {
    std::vector<const std::vector<Action>*> out;
    for (const schedule::Schedule& l : lists_)
      out.push_back(&l.ranks[static_cast<std::size_t>(me_)]);
    return out;
  }
  std::pair<int, int> step_of(int step, int mb) const override {
    return {mb / m_ == step % 2 ? step : step + 1, mb % m_};
  }
  // W(max(step - 1, 0)): the older buffer, or null for params()
  float* weights_for(int chunk, int step) override {
    const int version = step > 0 ? step - 1 : 0;
    return version == newest_ ? nullptr : older_[static_cast<std::size_t>(chunk)].data();
  }
  bool stops_before_step() const override { return true; }
  // W(newest) becomes the older version; the update then makes W(newest + 1)
  void before_update(const std::vector<GptStage*>& stages) override {
    for (std::size_t c = 0; c < older_.size(); ++c) {
      be_.copy(older_[c].data(), stages[c]->params(), older_[c].bytes());
    }
    be_.synchronize();
    ++newest_;
  }
  std::vector<FloatBuffer>* older_weights() override { return &older_; }
  void resumed_at(int step) override { newest_ = step; }

private:
  int me_, m_;
  const Backend& be_;
  std::vector<schedule::Schedule> lists_;
  bool warm_ = true;
  std::vector<FloatBuffer> older_;
  int newest_ = 0;
};

} // namespace

std::unique_ptr<StepPolicy> make_step_policy(const RunConfig& cfg, const schedule::Schedule& plan,
                                             int me, const std::vector<GptStage*>& stages,
                                             const Backend& be) {
  if (cfg.parallel.schedule == ScheduleKind::two_bw) {
    return std::make_unique<TwoBw>(plan.p, cfg.parallel.micro_batches, me, stages, be);
  }
  return std::make_unique<Synchronous>(plan.ranks[static_cast<std::size_t>(me)]);
}

} // namespace pt
