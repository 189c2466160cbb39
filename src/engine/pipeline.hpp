// Executes one pipeline rank's action list (docs/design.md section 6). The engine has no schedule
// logic: it posts each receive by its RECV at the latest, runs the actions in order (sends are
// non-blocking), keeps activations only between a micro-batch's F and its B (or BW), and times
// compute and waits for the measured bubble. Messages go through a PipeTransport (comm/p2p.hpp):
// host memory, staged through host copies for a GPU backend, or device memory over NCCL links.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/grad_sync.hpp"
#include "comm/layout.hpp"
#include "comm/p2p.hpp"
#include "comm/watchdog.hpp"
#include "config/run_config.hpp"
#include "data/sampler.hpp"
#include "engine/step_policy.hpp"
#include "model/gpt_stage.hpp"
#include "schedule/schedule.hpp"
#include "telemetry/trace.hpp"

namespace pt {

struct StepTimes {
  double pipeline_s = 0.0; // from the first to the last action, sends completed
  double compute_s = 0.0;  // F, B, BI, BW
  double wait_s = 0.0;     // receives and send completion
  // per compute op (schedule::Op's first four: F, B, BI, BW) its total time and count, for the
  // simulator's prediction
  static constexpr int kComputeOps = 4;
  double op_s[kComputeOps] = {};
  int op_n[kComputeOps] = {};
  void add(schedule::Op op, double seconds) {
    op_s[static_cast<int>(op)] += seconds;
    ++op_n[static_cast<int>(op)];
  }
  double mean_s(schedule::Op op) const {
    const int k = static_cast<int>(op);
    return op_n[k] > 0 ? op_s[k] / op_n[k] : 0.0;
  }
};

class PipelineEngine {
public:
  // chunks[c] is this rank's model chunk c (virtual stage c*p + pp rank). links: empty (MPI),
  // or one entry per channel of schedule::channels(sched), the NCCL link of each channel this
  // rank sends or receives on (null for the others).
  // policy: the lists each step runs and the weights its micro-batches use (step_policy.hpp).
  PipelineEngine(const RunConfig& cfg, const Layout& layout, const schedule::Schedule& sched,
                 std::vector<GptStage*> chunks, const Watchdog& watchdog, StepPolicy& policy,
                 std::vector<std::unique_ptr<cuda::NcclLink>> links = {});

  // Runs the step's action list. Returns the sum of the micro-batch mean losses this rank
  // computed (the last virtual stage's rank; 0 elsewhere). Gradients accumulate into the chunks.
  // drain: 2bw only, this step's list ends with the cool-down instead of the next step's first
  // forwards (other schedules always drain).
  double run(int step, const Sampler& sampler, StepTimes& times, bool drain = true);

  // Forward only over `batches` micro-batches drawn from `sampler` (validation), the batches split
  // over data-parallel replicas: each batch is one run of schedule::forward_only's list through
  // the same actions as a step (messages over MPI whatever the links). Returns the mean loss on
  // every rank.
  double evaluate(const Sampler& sampler, int batches);

  // Per chunk (null: none): told when the step's last backward of that chunk has finished a
  // layer's weight gradients, and polled between actions (comm.overlap).
  void set_grad_sync(std::vector<GradSync*> sync) { sync_ = std::move(sync); }

  // Bytes of pipeline messages this rank has sent (what the wire carried).
  std::uint64_t message_bytes() const { return transport_.bytes_sent(); }

  // log.trace: every compute action and wait goes into it (null: none).
  void set_trace(Trace* trace) { trace_ = trace; }

private:
  struct Slot {
    StageActivations acts;
    StageStash stash; // made with the slot where the chunk splits its backward (BI/BW)
    // the gradient of the output, in backend memory, where schedule::slot_keeps_gradient: written
    // by this rank's next chunk, or copied in from the receive buffer
    FloatBuffer dout;
  };
  using Key = std::pair<int, int>;   // (mb, chunk)
  using MsgKey = PipeTransport::Msg; // (dir 0 activation / 1 gradient, mb, chunk)
  struct Step;                       // one run()'s messages in flight, loss and times
  void execute(const schedule::Action& a, GptStage& stage, Step& st);
  std::pair<int, int> step_of(const Step& st, int mb) const; // (optimizer step, j) of an id
  // compute (op 0-3: F, B, BI, BW), into st's times and the trace
  void timed(Step& st, const schedule::Action& a, const std::function<void()>& fn);
  void waited(Step& st, double seconds, int mb, int chunk); // a wait, likewise
  void finish_slot(Step& st, int chunk, int mb);            // after B/BW: send done, slot free
  Slot& acquire(int chunk, int mb);
  // The chunk of this rank that runs the virtual stage after (dir +1) or before (-1) chunk's, or
  // -1 when another rank does (V placement hands micro-batches between chunks of one rank).
  int local_neighbour(int chunk, int dir) const;
  void release(int chunk, int mb);
  float* recv_buffer(const Step& st, int dir, int mb, int chunk);
  // A step's receives: posted into the pools' buffers, in list order, as buffers free
  // (schedule::receive_buffers; with NCCL links all at once); consumed() frees (dir, mb, chunk)'s.
  void start_receives(Step& st, const std::vector<schedule::Action>& actions);
  void post_receives(Step& st);
  void consumed(Step& st, int dir, int mb, int chunk);
  void wait_receive(Step& st, const schedule::Action& a); // a RECV: its message has arrived
  // The output gradient of (mb, chunk) where the stage can read it (null on the last stage): the
  // receive buffer, or the slot's (written by this rank's next chunk, or copied in when staged).
  const float* received_grad(const Step& st, GptStage& stage, int mb, int chunk);
  // Where the input gradient of (mb, chunk) goes: the send buffer, or the previous chunk's slot.
  float* input_grad(int mb, int chunk);
  // x itself, or (staged) x copied into the host buffer `host`, ready for MPI.
  const float* sendable(GptStage& stage, const float* x, FloatBuffer& host);
  // The sampler's rows [first, first + B) of `step` into the slot's tokens and targets (through
  // host buffers when the stage's memory is a device's).
  void load_batch(GptStage& stage, StageActivations& acts, const Sampler& sampler,
                  std::int64_t step, std::int64_t first);
  const float* stage_output(const StageActivations& a) const;

  const RunConfig& cfg_;
  const Layout& layout_;
  const schedule::Schedule& sched_;
  std::vector<GptStage*> chunks_; // not owned
  const Watchdog& watchdog_;
  const std::vector<schedule::Action>* actions_; // the schedule's list (2bw: unrolled steps)
  StepPolicy& policy_;
  Trace* trace_ = nullptr;
  std::map<Key, PipeTransport::Handle> act_sends_; // outstanding activation sends
  int p_, v_, me_, N_, C_; // N_: rows of a message (the stages' residual rows)
  float loss_scale_;
  PipeTransport transport_; // every message (evaluation's over MPI, whatever the links)
  schedule::Schedule eval_; // evaluation's list (schedule::forward_only)

  // activation slots per chunk, reused across micro-batches and steps
  std::vector<std::vector<std::unique_ptr<Slot>>> slots_;
  std::vector<std::vector<Slot*>> free_;
  std::vector<bool> split_;      // per chunk: its backward runs as BI then BW
  std::vector<bool> keeps_dout_; // per chunk: its slots keep a gradient (Slot::dout)
  std::map<Key, Slot*> live_;
  // the receive pools per direction (0 activations, 1 gradients) and one buffer per gradient
  // send of the list (N*C floats each); host memory for MPI, backend memory for NCCL
  std::array<std::vector<FloatBuffer>, 2> recv_pool_;
  std::map<Key, FloatBuffer> grad_send_buf_;
  // staged (GPU backend): MPI sees host memory only, whatever the MPI's single-copy mechanism
  bool staged_ = false;
  std::map<Key, FloatBuffer> act_send_buf_; // activations copied out for SEND_ACT
  // evaluation's messages in host memory: its receives, and (staged) its sends' copies
  std::map<MsgKey, FloatBuffer> eval_recv_;
  std::map<Key, FloatBuffer> eval_send_;
  std::vector<std::int32_t> tokens_host_, targets_host_; // load_batch's rows
  std::vector<GradSync*> sync_;
  bool drop_first_send_ = false; // test-only (util/test_hooks.hpp): the watchdog test
};

} // namespace pt
