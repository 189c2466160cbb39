#include "engine/pipeline.hpp"

#include <algorithm>
#include <deque>
#include <functional>

#include "util/clock.hpp"
#include "util/errors.hpp"
#include "util/test_hooks.hpp"

namespace pt {

using schedule::Action;
using schedule::Op;

PipelineEngine::PipelineEngine(const RunConfig& cfg, const Layout& layout,
                               const schedule::Schedule& sched, std::vector<GptStage*> chunks,
                               const Watchdog& watchdog, StepPolicy& policy,
                               std::vector<std::unique_ptr<cuda::NcclLink>> links)
    : cfg_(cfg), layout_(layout), sched_(sched), chunks_(std::move(chunks)), watchdog_(watchdog),
      actions_(&sched.ranks[static_cast<std::size_t>(layout.coords().pp)]), policy_(policy),
      p_(sched.p), v_(sched.v), me_(layout.coords().pp), N_(chunks_.front()->rows()),
      C_(cfg.model.d_model),
      transport_(layout.pp_comm(), sched, me_, watchdog, std::move(links),
                 static_cast<std::size_t>(N_) * C_,
                 activation_format(cfg.device.precision) == ActFormat::bf16) {
  const int tokens = cfg.train.micro_batch * cfg.model.seq_len; // per micro-batch
  loss_scale_ = 1.0f / (static_cast<float>(tokens) * cfg.parallel.micro_batches * layout.dp());
  slots_.resize(static_cast<std::size_t>(v_));
  free_.resize(static_cast<std::size_t>(v_));
  const std::size_t NC = static_cast<std::size_t>(N_) * C_;
  // MPI moves messages between host buffers. With a GPU backend every message is staged: a
  // received gradient is copied into backend memory (it stays referenced until the
  // micro-batch's backward-weight), an activation is copied out before it is sent. NCCL links
  // move backend memory itself.
  const Backend& be = chunks_.front()->backend();
  staged_ = !be.on_host();
  const Memory mem{be.alloc, be.release};
  const Memory msg_mem = transport_.device() ? mem : Memory{};
  const bool copies = staged_ && !transport_.device();
  using schedule::MessageBuffer;
  // each direction's receive buffers: over MPI a pool that receives take as they free
  // (schedule::receive_buffers); NCCL links post a step's every receive at once
  std::array<std::size_t, 2> pool{0, 0};
  for (const std::vector<Action>* list : policy_.lists()) { // every list a step may run
    std::array<std::size_t, 2> receives{0, 0};
    const std::array<int, 2> needed = schedule::receive_buffers(*list);
    schedule::message_buffers(sched, me_, *list, [&](MessageBuffer kind, const Action& a) {
      const Key key{a.mb, a.chunk};
      switch (kind) {
      case MessageBuffer::received_activation:
      case MessageBuffer::received_gradient: // the receive pools, below
        ++receives[kind == MessageBuffer::received_gradient ? 1 : 0];
        break;
      case MessageBuffer::gradient_send:
        grad_send_buf_.try_emplace(key, NC, msg_mem);
        break;
      case MessageBuffer::activation_send:
        if (copies) act_send_buf_.try_emplace(key, NC);
        break;
      }
    });
    for (std::size_t dir = 0; dir < 2; ++dir) {
      pool[dir] = std::max(pool[dir], transport_.device() ? receives[dir]
                                                          : static_cast<std::size_t>(needed[dir]));
    }
  }
  for (std::size_t dir = 0; dir < 2; ++dir) {
    for (std::size_t i = 0; i < pool[dir]; ++i) recv_pool_[dir].emplace_back(NC, msg_mem);
  }
  // Every activation slot (and stash) the list needs at its peak is made now, not at its first
  // use: freeing (and maybe allocating) GPU memory waits for the device's other streams, where
  // NCCL receives are queued that only a peer's sends complete.
  const std::vector<schedule::ChunkUse> use = schedule::chunk_use(*actions_, v_);
  split_.assign(static_cast<std::size_t>(v_), false);
  keeps_dout_.assign(static_cast<std::size_t>(v_), false);
  for (int c = 0; c < v_; ++c) {
    const schedule::ChunkUse& u = use[static_cast<std::size_t>(c)];
    split_[static_cast<std::size_t>(c)] = u.split;
    keeps_dout_[static_cast<std::size_t>(c)] = schedule::slot_keeps_gradient(sched, me_, c, copies);
    if (u.whole) chunks_[static_cast<std::size_t>(c)]->prepare_backward();
    for (int i = 0; i < u.peak_live; ++i) acquire(c, -1 - i);
    for (int i = 0; i < u.peak_live; ++i) release(c, -1 - i);
  }
  eval_ = schedule::forward_only(sched);
  for (const Action& a : eval_.ranks[static_cast<std::size_t>(me_)]) {
    if (a.op == Op::RECV_ACT) eval_recv_.try_emplace(MsgKey{0, a.mb, a.chunk}, NC);
    if (a.op == Op::SEND_ACT && staged_) eval_send_.try_emplace(Key{a.mb, a.chunk}, NC);
  }
  drop_first_send_ = test_hooks().drop_send && me_ == 0;
}

int PipelineEngine::local_neighbour(int chunk, int dir) const {
  const int st = sched_.stage_of(me_, chunk) + dir;
  if (st < 0 || st >= sched_.stages() || sched_.rank_of(st) != me_) return -1;
  return sched_.chunk_of(st);
}

PipelineEngine::Slot& PipelineEngine::acquire(int chunk, int mb) {
  auto& fl = free_[static_cast<std::size_t>(chunk)];
  Slot* s = nullptr;
  if (!fl.empty()) {
    s = fl.back();
    fl.pop_back();
  } else {
    auto fresh = std::make_unique<Slot>();
    fresh->acts = chunks_[static_cast<std::size_t>(chunk)]->make_activations();
    if (split_[static_cast<std::size_t>(chunk)]) {
      fresh->stash = chunks_[static_cast<std::size_t>(chunk)]->make_stash();
    }
    if (keeps_dout_[static_cast<std::size_t>(chunk)]) {
      const Backend& be = chunks_[static_cast<std::size_t>(chunk)]->backend();
      fresh->dout = FloatBuffer(static_cast<std::size_t>(N_) * C_, Memory{be.alloc, be.release});
    }
    s = fresh.get();
    slots_[static_cast<std::size_t>(chunk)].push_back(std::move(fresh));
  }
  live_[{mb, chunk}] = s;
  return *s;
}

void PipelineEngine::release(int chunk, int mb) {
  auto it = live_.find({mb, chunk});
  free_[static_cast<std::size_t>(chunk)].push_back(it->second);
  live_.erase(it);
}

// What one run of an action list (a step's, or evaluation's) keeps between its actions.
struct PipelineEngine::Step {
  int step;
  std::int64_t first_sample; // this dp replica's first sample of the step
  const Sampler& sampler;
  StepTimes& t;
  std::map<MsgKey, PipeTransport::Handle> recv{};
  // the step's receives not yet posted (list order), the pool buffer each posted one holds, and
  // each direction's free buffers
  std::array<std::deque<const Action*>, 2> pending{};
  std::map<MsgKey, std::size_t> held{};
  std::array<std::vector<std::size_t>, 2> free{};
  std::vector<PipeTransport::Handle> grad_sends{};
  double loss_sum = 0.0;
  bool dropped = false;    // test hook drop_send: the first SEND_ACT was skipped
  bool evaluating = false; // evaluation's list: no backward, messages over MPI, not traced
  std::string what() const {
    return evaluating ? "validation" : "step " + std::to_string(step + 1);
  }
};

float* PipelineEngine::recv_buffer(const Step& st, int dir, int mb, int chunk) {
  const MsgKey key{dir, mb, chunk};
  if (st.evaluating) return eval_recv_.at(key).data();
  return recv_pool_[static_cast<std::size_t>(dir)][st.held.at(key)].data();
}

void PipelineEngine::start_receives(Step& st, const std::vector<Action>& actions) {
  for (std::size_t dir = 0; dir < 2; ++dir) {
    st.free[dir].resize(recv_pool_[dir].size());
    for (std::size_t i = 0; i < st.free[dir].size(); ++i)
      st.free[dir][i] = st.free[dir].size() - 1 - i;
  }
  if (transport_.device()) { // NCCL: every receive now, in each link's order, a buffer each
    st.recv = transport_.receive_step(actions, [&](const MsgKey& k) {
      const auto dir = static_cast<std::size_t>(std::get<0>(k));
      const std::size_t b = st.free[dir].back();
      st.free[dir].pop_back();
      st.held[k] = b;
      return recv_pool_[dir][b].data();
    });
    return;
  }
  for (const Action& a : actions) {
    if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD)
      st.pending[a.op == Op::RECV_ACT ? 0 : 1].push_back(&a);
  }
  post_receives(st);
}

void PipelineEngine::post_receives(Step& st) {
  for (std::size_t dir = 0; dir < 2; ++dir) {
    while (!st.pending[dir].empty() && !st.free[dir].empty()) {
      const Action& a = *st.pending[dir].front();
      st.pending[dir].pop_front();
      const MsgKey key{static_cast<int>(dir), a.mb, a.chunk};
      const std::size_t b = st.free[dir].back();
      st.free[dir].pop_back();
      st.held[key] = b;
      st.recv[key] = transport_.receive(a, recv_pool_[dir][b].data());
    }
  }
}

void PipelineEngine::consumed(Step& st, int dir, int mb, int chunk) {
  const auto it = st.held.find(MsgKey{dir, mb, chunk});
  if (st.evaluating || transport_.device() || it == st.held.end()) return;
  st.free[static_cast<std::size_t>(dir)].push_back(it->second);
  st.held.erase(it);
  post_receives(st);
}

const float* PipelineEngine::received_grad(const Step& st, GptStage& stage, int mb, int chunk) {
  if (stage.spec().last) return nullptr;
  FloatBuffer& dout = live_.at({mb, chunk})->dout;
  if (local_neighbour(chunk, +1) >= 0) return dout.data(); // written by this rank's next chunk
  const float* host = recv_buffer(st, 1, mb, chunk);
  if (!keeps_dout_[static_cast<std::size_t>(chunk)])
    return host; // host memory that the stage reads, or backend memory
  stage.backend().copy(dout.data(), host, dout.bytes());
  return dout.data();
}

float* PipelineEngine::input_grad(int mb, int chunk) {
  const int prev = local_neighbour(chunk, -1);
  return prev >= 0 ? live_.at({mb, prev})->dout.data() : grad_send_buf_.at({mb, chunk}).data();
}

const float* PipelineEngine::sendable(GptStage& stage, const float* x, FloatBuffer& host) {
  if (!staged_) return x;
  stage.backend().copy(host.data(), x, host.bytes());
  stage.backend().synchronize();
  return host.data();
}

void PipelineEngine::load_batch(GptStage& stage, StageActivations& acts, const Sampler& sampler,
                                std::int64_t step, std::int64_t first) {
  const int B = cfg_.train.micro_batch;
  if (!staged_) {
    sampler.fill(step, first, B, acts.tokens.data(), acts.targets.data());
    return;
  }
  tokens_host_.resize(acts.tokens.size());
  targets_host_.resize(acts.targets.size());
  sampler.fill(step, first, B, tokens_host_.data(), targets_host_.data());
  const Backend& be = stage.backend();
  be.copy(acts.tokens.data(), tokens_host_.data(), acts.tokens.bytes());
  be.copy(acts.targets.data(), targets_host_.data(), acts.targets.bytes());
  be.synchronize(); // both copies done: the host rows are refilled by the next call
}

const float* PipelineEngine::stage_output(const StageActivations& a) const {
  return a.blocks.empty() ? a.input.data() : a.blocks.back().out.data();
}

double PipelineEngine::run(int step, const Sampler& sampler, StepTimes& t, bool drain) {
  const double t_start = wall_time();
  const std::vector<Action>& actions = policy_.list(step, drain);
  // the chunk's last weight-gradient action: its layers' gradients become final one by one
  std::vector<std::size_t> last_weight(static_cast<std::size_t>(v_), actions.size());
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].op == Op::B || actions[i].op == Op::BW) {
      last_weight[static_cast<std::size_t>(actions[i].chunk)] = i;
    }
  }
  Step st{step,
          static_cast<std::int64_t>(layout_.coords().dp) * cfg_.parallel.micro_batches *
              cfg_.train.micro_batch,
          sampler, t};
  start_receives(st, actions); // as many as the pools hold; the rest as their buffers free
  for (std::size_t ai = 0; ai < actions.size(); ++ai) {
    const Action& a = actions[ai];
    GptStage& stage = *chunks_[static_cast<std::size_t>(a.chunk)];
    GradSync* sync = a.chunk < static_cast<int>(sync_.size())
                         ? sync_[static_cast<std::size_t>(a.chunk)]
                         : nullptr;
    const bool hook = sync != nullptr && ai == last_weight[static_cast<std::size_t>(a.chunk)];
    if (hook) stage.set_weight_grad_hook([sync](int layer) { sync->layer_done(layer); });
    execute(a, stage, st);
    if (hook) stage.set_weight_grad_hook({});
    for (GradSync* g : sync_) {
      if (g != nullptr) g->poll();
    }
  }
  // activation sends of micro-batches still live (2bw: the next step's) complete later
  for (auto it = act_sends_.begin(); it != act_sends_.end();) {
    if (live_.count(it->first)) {
      ++it;
      continue;
    }
    waited(st,
           transport_.wait(it->second,
                           "completion of SEND_ACT(mb " + std::to_string(it->first.first) + ")"),
           it->first.first, it->first.second);
    it = act_sends_.erase(it);
  }
  for (auto& req : st.grad_sends)
    waited(st, transport_.wait(req, "completion of SEND_GRAD"), -1, -1);
  for (auto& c : chunks_) c->use_weights(nullptr);
  t.pipeline_s = wall_time() - t_start;
  return st.loss_sum;
}

std::pair<int, int> PipelineEngine::step_of(const Step& st, int mb) const {
  return policy_.step_of(st.step, mb);
}

void PipelineEngine::timed(Step& st, const Action& a, const std::function<void()>& fn) {
  const double t0 = wall_time();
  fn();
  const double t1 = wall_time();
  st.t.compute_s += t1 - t0;
  st.t.add(a.op, t1 - t0);
  if (trace_ != nullptr && !st.evaluating) {
    trace_->add(schedule::op_name(a.op), t0, t1, st.step, a.mb, a.chunk);
  }
}

void PipelineEngine::waited(Step& st, double seconds, int mb, int chunk) {
  st.t.wait_s += seconds;
  if (trace_ == nullptr || st.evaluating) return;
  const double now = wall_time();
  trace_->add("wait", now - seconds, now, st.step, mb, chunk);
}

// A micro-batch's activation send must be complete before its slot is reused; its received
// gradient is no longer read.
void PipelineEngine::finish_slot(Step& st, int chunk, int mb) {
  consumed(st, 1, mb, chunk);
  if (auto it = act_sends_.find({mb, chunk}); it != act_sends_.end()) {
    waited(st,
           transport_.wait(it->second, "completion of SEND_ACT(mb " + std::to_string(mb) +
                                           ", chunk " + std::to_string(chunk) + ")"),
           mb, chunk);
    act_sends_.erase(it);
  }
  release(chunk, mb);
}

void PipelineEngine::wait_receive(Step& st, const Action& a) {
  const auto it = st.recv.find({a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk});
  if (it == st.recv.end()) {
    fatal("internal error: " + schedule::describe(a) + " reached before its receive was posted");
  }
  waited(st,
         transport_.wait(it->second, schedule::describe(a) + " (pipeline rank " +
                                         std::to_string(me_) + ", " + st.what() + ")"),
         a.mb, a.chunk);
}

void PipelineEngine::execute(const Action& a, GptStage& stage, Step& st) {
  const std::size_t NC = static_cast<std::size_t>(N_) * C_;
  const int B = cfg_.train.micro_batch;
  switch (a.op) {
  case Op::RECV_ACT:
  case Op::RECV_GRAD:
    return wait_receive(st, a);
  case Op::F: {
    Slot& s = acquire(a.chunk, a.mb);
    const auto [step, j] = step_of(st, a.mb);
    if (!st.evaluating) stage.use_weights(policy_.weights_for(a.chunk, step));
    timed(st, a, [&] {
      if (stage.spec().first || stage.spec().last) {
        load_batch(stage, s.acts, st.sampler, step,
                   st.first_sample + static_cast<std::int64_t>(j) * B);
      }
      if (!stage.spec().first) {
        const int prev = local_neighbour(a.chunk, -1);
        const float* in = prev >= 0 ? stage_output(live_.at({a.mb, prev})->acts)
                                    : recv_buffer(st, 0, a.mb, a.chunk);
        stage.backend().copy(s.acts.input.data(), in, NC * sizeof(float));
      }
      st.loss_sum += stage.forward(s.acts, st.evaluating ? 0.0f : loss_scale_);
    });
    if (staged_) stage.backend().synchronize(); // the copy into the slot has read the buffer
    return consumed(st, 0, a.mb, a.chunk);
  }
  case Op::SEND_ACT: {
    if (drop_first_send_ && !st.dropped && !st.evaluating) { // test-only: the hang watchdog
      st.dropped = true;
      return;
    }
    const float* out = stage_output(live_.at({a.mb, a.chunk})->acts);
    if (staged_ && (st.evaluating || !transport_.device())) {
      out = sendable(stage, out, (st.evaluating ? eval_send_ : act_send_buf_).at({a.mb, a.chunk}));
    }
    act_sends_[{a.mb, a.chunk}] =
        transport_.start_send(out, 0, a.mb, a.chunk, a.peer, st.evaluating);
    return;
  }
  case Op::B: {
    Slot& s = *live_.at({a.mb, a.chunk});
    stage.use_weights(policy_.weights_for(a.chunk, step_of(st, a.mb).first));
    timed(st, a, [&] {
      const float* dout = received_grad(st, stage, a.mb, a.chunk);
      float* d_input = stage.spec().first ? nullptr : input_grad(a.mb, a.chunk);
      stage.backward(s.acts, dout, loss_scale_, d_input);
    });
    return finish_slot(st, a.chunk, a.mb);
  }
  case Op::BI: {
    Slot& s = *live_.at({a.mb, a.chunk});
    return timed(st, a, [&] {
      const float* dout = received_grad(st, stage, a.mb, a.chunk);
      stage.backward_input(s.acts, dout, loss_scale_, s.stash);
      if (!stage.spec().first) {
        stage.backend().copy(input_grad(a.mb, a.chunk), s.stash.d_input.data(), NC * sizeof(float));
        stage.backend().synchronize(); // SEND_GRAD reads it (from the host side, with MPI)
      }
    });
  }
  case Op::BW: {
    Slot& s = *live_.at({a.mb, a.chunk});
    timed(st, a, [&] { stage.backward_weight(s.acts, s.stash); });
    return finish_slot(st, a.chunk, a.mb);
  }
  case Op::SEND_GRAD:
    st.grad_sends.push_back(
        transport_.start_send(grad_send_buf_.at({a.mb, a.chunk}).data(), 1, a.mb, a.chunk, a.peer,
                              false, true)); // the buffer is not read again: packed in place
    return;
  case Op::STEP: // only in the unrolled lists the validator proves
    return;
  }
}

double PipelineEngine::evaluate(const Sampler& sampler, int batches) {
  const std::vector<Action>& actions = eval_.ranks[static_cast<std::size_t>(me_)];
  StepTimes times; // not reported
  double sum = 0.0;
  for (int j = layout_.coords().dp; j < batches; j += layout_.dp()) {
    Step st{0, static_cast<std::int64_t>(j) * cfg_.train.micro_batch, sampler, times};
    st.recv = transport_.receive_step(
        actions, [this](const MsgKey& k) { return eval_recv_.at(k).data(); }, true);
    st.evaluating = true;
    for (const Action& a : actions) execute(a, *chunks_[static_cast<std::size_t>(a.chunk)], st);
    for (const Action& a : actions) { // the slots stay live until every local chunk has read
      if (a.op == Op::F) finish_slot(st, a.chunk, a.mb);
    }
    sum += st.loss_sum;
  }
  watchdog_.allreduce(&sum, 1, MPI_DOUBLE, MPI_SUM, layout_.dp_comm(),
                      "the validation loss's sum over data-parallel ranks");
  const int S = sched_.stages();
  watchdog_.bcast(&sum, 1, MPI_DOUBLE, sched_.rank_of(S - 1), layout_.pp_comm(),
                  "the validation loss from the last pipeline rank");
  return sum / batches;
}

} // namespace pt
