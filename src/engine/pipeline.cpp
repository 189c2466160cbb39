#include "engine/pipeline.hpp"

#include <algorithm>
#include <functional>

#include "util/test_hooks.hpp"

namespace pt {

using schedule::Action;
using schedule::Op;

PipelineEngine::PipelineEngine(const RunConfig& cfg, const Layout& layout,
                               const schedule::Schedule& sched,
                               std::vector<std::unique_ptr<GptStage>>& chunks,
                               const Watchdog& watchdog,
                               std::vector<std::unique_ptr<cuda::NcclLink>> links)
    : cfg_(cfg), layout_(layout), sched_(sched), chunks_(chunks), watchdog_(watchdog),
      actions_(sched.ranks[static_cast<std::size_t>(layout.coords().pp)]), p_(sched.p), v_(sched.v),
      me_(layout.coords().pp), N_(cfg.train.micro_batch * cfg.model.seq_len), C_(cfg.model.d_model),
      transport_(layout.pp_comm(), sched, me_, watchdog, std::move(links),
                 static_cast<std::size_t>(N_) * C_) {
  loss_scale_ = 1.0f / (static_cast<float>(N_) * sched.m * layout.dp());
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
  for (const Action& a : actions_) {
    if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD) {
      recv_buf_.emplace(MsgKey{a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk},
                        FloatBuffer(NC, msg_mem));
      if (copies && a.op == Op::RECV_GRAD)
        grad_dev_.emplace(Key{a.mb, a.chunk}, FloatBuffer(NC, mem));
    } else if (a.op == Op::SEND_GRAD) {
      grad_send_buf_.emplace(Key{a.mb, a.chunk}, FloatBuffer(NC, msg_mem));
    } else if (a.op == Op::SEND_ACT && copies) {
      act_send_buf_.emplace(Key{a.mb, a.chunk}, FloatBuffer(NC));
    }
  }
  // Every activation slot (and stash) the list needs at its peak is made now, not at its first
  // use: freeing (and maybe allocating) GPU memory waits for the device's other streams, where
  // NCCL receives are queued that only a peer's sends complete.
  const std::vector<schedule::ChunkUse> use = schedule::chunk_use(actions_, v_);
  split_.assign(static_cast<std::size_t>(v_), false);
  for (int c = 0; c < v_; ++c) {
    const schedule::ChunkUse& u = use[static_cast<std::size_t>(c)];
    split_[static_cast<std::size_t>(c)] = u.split;
    if (u.whole) chunks_[static_cast<std::size_t>(c)]->prepare_backward();
    for (int i = 0; i < u.peak_live; ++i) acquire(c, -1 - i);
    for (int i = 0; i < u.peak_live; ++i) release(c, -1 - i);
  }
  if (staged_) eval_buf_ = FloatBuffer(NC);
  last_weight_action_.assign(static_cast<std::size_t>(v_), actions_.size());
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    if (actions_[i].op == Op::B || actions_[i].op == Op::BW) {
      last_weight_action_[static_cast<std::size_t>(actions_[i].chunk)] = i;
    }
  }
  drop_first_send_ = test_hooks().drop_send && me_ == 0;
}

std::size_t PipelineEngine::activation_bytes() const {
  std::size_t b = 0;
  for (const auto& chunk : slots_) {
    for (const auto& s : chunk) b += s->acts.bytes();
  }
  for (const auto& [k, buf] : recv_buf_) b += buf.bytes();
  for (const auto& [k, buf] : grad_send_buf_) b += buf.bytes();
  for (const auto& [k, buf] : grad_dev_) b += buf.bytes();
  for (const auto& [k, buf] : act_send_buf_) b += buf.bytes();
  return b;
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

float* PipelineEngine::recv_buffer(int dir, int mb, int chunk) {
  return recv_buf_.at(MsgKey{dir, mb, chunk}).data();
}

const float* PipelineEngine::received_grad(GptStage& stage, int mb, int chunk) {
  if (stage.spec().last) return nullptr;
  const float* host = recv_buffer(1, mb, chunk);
  if (!staged_ || transport_.device())
    return host; // host memory that the stage reads, or backend memory
  float* dev = grad_dev_.at(Key{mb, chunk}).data();
  stage.backend().copy(dev, host, static_cast<std::size_t>(N_) * C_ * sizeof(float));
  return dev;
}

const float* PipelineEngine::sendable(GptStage& stage, const float* x, FloatBuffer& host) {
  if (!staged_) return x;
  stage.backend().copy(host.data(), x, host.bytes());
  stage.backend().synchronize();
  return host.data();
}

const float* PipelineEngine::stage_output(const StageActivations& a) const {
  return a.blocks.empty() ? a.input.data() : a.blocks.back().out.data();
}

// What one run() keeps between its actions.
struct PipelineEngine::Step {
  int step;
  std::int64_t first_sample; // this dp replica's first sample of the step
  const Sampler& sampler;
  StepTimes& t;
  std::map<MsgKey, PipeTransport::Handle> recv;
  std::map<Key, PipeTransport::Handle> act_sends;
  std::vector<PipeTransport::Handle> grad_sends;
  double loss_sum = 0.0;
  bool dropped = false; // test hook drop_send: the first SEND_ACT was skipped
};

double PipelineEngine::run(int step, const Sampler& sampler, StepTimes& t) {
  const double t_start = MPI_Wtime();
  // every receive of the step is posted before any action runs
  Step st{step,
          static_cast<std::int64_t>(layout_.coords().dp) * sched_.m * cfg_.train.micro_batch,
          sampler,
          t,
          transport_.receive_step([this](const MsgKey& k) { return recv_buf_.at(k).data(); }),
          {},
          {}};
  for (std::size_t ai = 0; ai < actions_.size(); ++ai) {
    const Action& a = actions_[ai];
    GptStage& stage = *chunks_[static_cast<std::size_t>(a.chunk)];
    GradSync* sync = a.chunk < static_cast<int>(sync_.size())
                         ? sync_[static_cast<std::size_t>(a.chunk)]
                         : nullptr;
    // the chunk's last weight-gradient action: its layers' gradients become final one by one
    const bool hook =
        sync != nullptr && ai == last_weight_action_[static_cast<std::size_t>(a.chunk)];
    if (hook) stage.set_weight_grad_hook([sync](int layer) { sync->layer_done(layer); });
    execute(a, stage, st);
    if (hook) stage.set_weight_grad_hook({});
    for (GradSync* g : sync_) {
      if (g != nullptr) g->poll();
    }
  }
  for (auto& [k, req] : st.act_sends) {
    t.wait_s += transport_.wait(req, "completion of SEND_ACT(mb " + std::to_string(k.first) + ")");
  }
  for (auto& req : st.grad_sends) t.wait_s += transport_.wait(req, "completion of SEND_GRAD");
  t.pipeline_s = MPI_Wtime() - t_start;
  return st.loss_sum;
}

void PipelineEngine::timed(Step& st, int op, const std::function<void()>& fn) {
  const double t0 = MPI_Wtime();
  fn();
  const double dt = MPI_Wtime() - t0;
  st.t.compute_s += dt;
  st.t.op_s[op] += dt;
  ++st.t.op_n[op];
}

// A micro-batch's activation send must be complete before its slot is reused.
void PipelineEngine::finish_slot(Step& st, int chunk, int mb) {
  if (auto it = st.act_sends.find({mb, chunk}); it != st.act_sends.end()) {
    st.t.wait_s += transport_.wait(it->second, "completion of SEND_ACT(mb " + std::to_string(mb) +
                                                   ", chunk " + std::to_string(chunk) + ")");
    st.act_sends.erase(it);
  }
  release(chunk, mb);
}

void PipelineEngine::execute(const Action& a, GptStage& stage, Step& st) {
  const std::size_t NC = static_cast<std::size_t>(N_) * C_;
  const int B = cfg_.train.micro_batch;
  switch (a.op) {
  case Op::RECV_ACT:
  case Op::RECV_GRAD:
    st.t.wait_s +=
        transport_.wait(st.recv.at({a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk}),
                        schedule::describe(a) + " (pipeline rank " + std::to_string(me_) +
                            ", step " + std::to_string(st.step + 1) + ")");
    return;
  case Op::F: {
    Slot& s = acquire(a.chunk, a.mb);
    return timed(st, 0, [&] {
      if (stage.spec().first || stage.spec().last) {
        st.sampler.fill(st.step, st.first_sample + static_cast<std::int64_t>(a.mb) * B, B,
                        s.acts.tokens.data(), s.acts.targets.data());
      }
      if (!stage.spec().first) {
        stage.backend().copy(s.acts.input.data(), recv_buffer(0, a.mb, a.chunk),
                             NC * sizeof(float));
      }
      st.loss_sum += stage.forward(s.acts);
    });
  }
  case Op::SEND_ACT: {
    if (drop_first_send_ && !st.dropped) { // test-only: provoke the hang watchdog
      st.dropped = true;
      return;
    }
    const float* out = stage_output(live_.at({a.mb, a.chunk})->acts);
    if (staged_ && !transport_.device()) {
      out = sendable(stage, out, act_send_buf_.at({a.mb, a.chunk}));
    }
    st.act_sends[{a.mb, a.chunk}] = transport_.start_send(out, 0, a.mb, a.chunk, a.peer);
    return;
  }
  case Op::B: {
    Slot& s = *live_.at({a.mb, a.chunk});
    timed(st, 1, [&] {
      const float* dout = received_grad(stage, a.mb, a.chunk);
      float* d_input = stage.spec().first ? nullptr : grad_send_buf_.at({a.mb, a.chunk}).data();
      stage.backward(s.acts, dout, loss_scale_, d_input);
    });
    return finish_slot(st, a.chunk, a.mb);
  }
  case Op::BI: {
    Slot& s = *live_.at({a.mb, a.chunk});
    return timed(st, 2, [&] {
      const float* dout = received_grad(stage, a.mb, a.chunk);
      stage.backward_input(s.acts, dout, loss_scale_, s.stash);
      if (!stage.spec().first) {
        stage.backend().copy(grad_send_buf_.at({a.mb, a.chunk}).data(), s.stash.d_input.data(),
                             NC * sizeof(float));
        stage.backend().synchronize(); // SEND_GRAD reads it (from the host side, with MPI)
      }
    });
  }
  case Op::BW: {
    Slot& s = *live_.at({a.mb, a.chunk});
    timed(st, 3, [&] { stage.backward_weight(s.acts, s.stash); });
    return finish_slot(st, a.chunk, a.mb);
  }
  case Op::SEND_GRAD:
    st.grad_sends.push_back(
        transport_.start_send(grad_send_buf_.at({a.mb, a.chunk}).data(), 1, a.mb, a.chunk, a.peer));
    return;
  }
}

double PipelineEngine::evaluate(const Sampler& sampler, int batches) {
  const int B = cfg_.train.micro_batch;
  const int S = sched_.stages();
  double sum = 0.0;
  // a plain forward chain per batch; virtual stages in order, so the chain never waits on itself
  for (int j = layout_.coords().dp; j < batches; j += layout_.dp()) {
    for (int st = 0; st < S; ++st) {
      if (sched_.rank_of(st) != me_) continue;
      const int c = sched_.chunk_of(st);
      GptStage& stage = *chunks_[static_cast<std::size_t>(c)];
      Slot& s = acquire(c, -1 - j);
      if (stage.spec().first || stage.spec().last) {
        sampler.fill(0, static_cast<std::int64_t>(j) * B, B, s.acts.tokens.data(),
                     s.acts.targets.data());
      }
      const std::string at =
          "(validation batch " + std::to_string(j) + ", chunk " + std::to_string(c) + ") ";
      if (st > 0) {
        float* in = staged_ ? eval_buf_.data() : s.acts.input.data();
        const int from = sched_.rank_of(st - 1);
        transport_.recv(in, 0, 0, c, from, "RECV_ACT" + at + "from rank " + std::to_string(from));
        if (staged_) stage.backend().copy(s.acts.input.data(), in, eval_buf_.bytes());
      }
      sum += stage.forward(s.acts);
      if (st < S - 1) {
        const int to = sched_.rank_of(st + 1);
        transport_.send(sendable(stage, stage_output(s.acts), eval_buf_), 0, 0, c, to,
                        "completion of SEND_ACT" + at + "to rank " + std::to_string(to));
      }
      release(c, -1 - j);
    }
  }
  watchdog_.allreduce(&sum, 1, MPI_DOUBLE, MPI_SUM, layout_.dp_comm(),
                      "the validation loss's sum over data-parallel ranks");
  watchdog_.bcast(&sum, 1, MPI_DOUBLE, p_ - 1, layout_.pp_comm(),
                  "the validation loss from the last pipeline rank");
  return sum / batches;
}

} // namespace pt
