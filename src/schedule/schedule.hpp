// Pipeline schedules as data (docs/design.md section 6): for each pipeline rank an ordered list of
// actions. No MPI and no kernels here: schedules can be generated, validated and simulated alone.
//
// p = pipeline ranks, m = micro-batches per step, v = chunks (virtual stages) per rank,
// S = p*v virtual stages. Virtual stage s lives on rank s % p as chunk s / p (Megatron's
// interleaved placement; with v = 1, stage s is rank s), or, for the V-shaped schedules (v = 2),
// on rank s if s < p, else on rank 2p-1-s (chunk 1): the first and last stage share rank 0, and
// the last rank runs stages p-1 and p back to back, with no message between them.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "config/enums.hpp"

namespace pt::schedule {

enum class Op {
  F,         // forward of (mb, chunk)
  B,         // full backward of (mb, chunk)
  BI,        // backward, input-gradient half
  BW,        // backward, weight-gradient half
  SEND_ACT,  // send the forward output of (mb, chunk) to the next virtual stage
  RECV_ACT,  // receive the forward input of (mb, chunk) from the previous virtual stage
  SEND_GRAD, // send the input gradient of (mb, chunk) to the previous virtual stage
  RECV_GRAD, // receive the output gradient of (mb, chunk) from the next virtual stage
  STEP,      // the optimizer step: a barrier of every rank (only in 2bw's unrolled lists)
};

struct Action {
  Op op;
  int mb;
  int chunk;
  int peer = -1; // the other pipeline rank, for SEND/RECV
  bool operator==(const Action&) const = default;
};

struct Schedule {
  std::string name;
  int p = 1, m = 1, v = 1;
  bool vshape = false;                    // V placement (zb-v, v-half, v-min, dualpipev)
  std::vector<std::vector<Action>> ranks; // ranks[r] = rank r's actions, in order

  int stages() const { return p * v; }
  int stage_of(int rank, int chunk) const {
    return vshape ? (chunk == 0 ? rank : 2 * p - 1 - rank) : chunk * p + rank;
  }
  int rank_of(int stage) const { return vshape && stage >= p ? 2 * p - 1 - stage : stage % p; }
  int chunk_of(int stage) const { return vshape ? (stage >= p ? 1 : 0) : stage / p; }
};

// "F(mb 3, chunk 0)", "RECV_GRAD(mb 1, chunk 1) from rank 2"
std::string describe(const Action& a);
const char* op_name(Op op);

// The chunks per rank the schedule of this deck name runs by default: 2 for interleaved and the
// V placement (zb-v, v-half, v-min, dualpipev), else 1.
int default_chunks(const std::string& name);

// Builds the schedule with its SEND/RECV actions. Throws std::invalid_argument with a
// message naming the constraint when (p, m, v) does not suit it (e.g. interleaved needs p >= 2,
// v >= 2 and m divisible by p; the others need v = 1).
Schedule make_schedule(ScheduleKind kind, int p, int m, int v);

// A one-way stream of messages between two pipeline ranks: the activations (or the gradients)
// that rank `from` sends to rank `to`, in the order `from` sends them. A transport without
// message tags (NCCL) matches sends and receives by this order: the receiver posts its receives
// in it, whatever order its own actions need them in.
struct Channel {
  bool grad = false; // false: activations (SEND_ACT/RECV_ACT)
  int from = 0, to = 0;
  struct Message {
    int mb;
    int chunk; // the receiver's chunk: the receive buffer the message fills
    bool operator==(const Message&) const = default;
  };
  std::vector<Message> messages;
};

// How one rank's action list uses each of its chunks: the most micro-batches live at once (from
// F until B or BW: the activation slots the engine makes), whether the backward is split (BI/BW,
// each slot then has a stash) and whether it runs whole (B). The engine and the memory model
// both size memory from it.
struct ChunkUse {
  int peak_live = 0;
  bool split = false, whole = false;
};
std::vector<ChunkUse> chunk_use(const std::vector<Action>& actions, int chunks);

// The message buffers PipelineEngine keeps for one of rank `rank`'s lists under placement s:
// f(kind, action) for each action that needs one. A buffer is kept per (kind, micro-batch id,
// chunk): actions of the same key share it. The engine allocates them and the memory model
// counts them from this one list; over MPI, receives share receive_buffers' pools instead. (A
// gradient that stays on the rank, or is copied into a GPU's memory, lives in the receiving
// micro-batch's activation slot instead: slot_keeps_gradient.)
enum class MessageBuffer {
  received_activation, // RECV_ACT's
  received_gradient,   // RECV_GRAD's
  gradient_send,       // SEND_GRAD's
  activation_send,     // SEND_ACT's (a copy, where the messages are staged)
};
template <class Fn>
void message_buffers(const Schedule& s, int rank, const std::vector<Action>& list, Fn&& f) {
  for (const Action& a : list) {
    if (a.op == Op::RECV_ACT) {
      f(MessageBuffer::received_activation, a);
    } else if (a.op == Op::RECV_GRAD) {
      f(MessageBuffer::received_gradient, a);
    } else if (a.op == Op::SEND_GRAD) {
      f(MessageBuffer::gradient_send, a);
    } else if (a.op == Op::SEND_ACT) {
      f(MessageBuffer::activation_send, a);
    }
  }
}

// The receive buffers one of a rank's lists needs per direction (0 activations, 1 gradients),
// PipelineEngine posting each receive, in list order, as soon as one of its direction's buffers
// is free: a buffer holds its message from its RECV until it is consumed (an activation by its
// F; a gradient when its micro-batch's backward ends, B or the BW of a split backward). The most
// messages live at once between their RECV and their consumer: with that many buffers every
// receive is posted by its own RECV action (the ones before it in the list hold the rest).
std::array<int, 2> receive_buffers(const std::vector<Action>& list);

// Whether each activation slot of chunk `chunk` of rank `rank` keeps a buffer for the gradient of
// its output (as long as the micro-batch's slot lives: until its backward-weight): where that
// gradient comes from this rank's own next chunk (V placement), or, `staged`, from another rank
// into a GPU's memory. Not on the last stage (the loss).
inline bool slot_keeps_gradient(const Schedule& s, int rank, int chunk, bool staged) {
  const int st = s.stage_of(rank, chunk);
  if (st + 1 >= s.stages()) return false;
  return staged || s.rank_of(st + 1) == rank;
}

// Every channel of the schedule, ordered by (grad, from, to): the same list on every rank, so
// ranks can set up their channels' connections one after another in this order.
std::vector<Channel> channels(const Schedule& s);

// The compute-only generators (exposed for tests); add_communication() inserts the SEND/RECV
// actions every compute action needs, next to it.
Schedule gpipe(int p, int m);
Schedule one_f_one_b(int p, int m);
Schedule interleaved_1f1b(int p, int m, int v);
Schedule zb_h1(int p, int m);
Schedule zb_h2(int p, int m);
Schedule v_half(int p, int m);
Schedule v_min(int p, int m);
Schedule zb_v(int p, int m);
Schedule dualpipev(int p, int m);
void add_communication(Schedule& s);

struct Costs; // schedule/validate.hpp
// A schedule for these per-rank costs (loop placement, one chunk per rank) in which no rank holds
// more than `budget` micro-batches of activations (F to B or BW) at once, with its messages: the
// fastest the simulator finds among GPipe, 1F1B, ZB-H1, ZB-H2 and the list scheduler under the
// budget (with the costs as durations), improved by swapping neighbouring actions of a rank while
// the step gets shorter (at most `evaluations` tries). Throws std::invalid_argument where nothing
// fits the budget.
Schedule search_schedule(int p, int m, const std::vector<Costs>& costs, int budget,
                         int evaluations = 2000);
// The budget of parallel.search_memory = memory: memory x p micro-batches, at least 1.
inline int search_budget(double memory, int p) {
  return std::max(1, static_cast<int>(memory * p));
}

// A schedule named `name` with p empty rank lists (for the generators). Throws
// std::invalid_argument unless p, m and v are >= 1.
Schedule empty(const std::string& name, int p, int m, int v, bool vshape = false);

// Schedules as text (docs/pipeline.md): PyTorch's compute-only CSV, one row per pipeline rank and
// one compute action a cell, {stage}{F|I|W|B}{micro-batch} (I = BI, W = BW), no messages.
// to_csv throws std::invalid_argument for 2bw's unrolled lists (they span optimizer steps).
std::string to_csv(const Schedule& s);
// The schedule a CSV text describes for p ranks, m micro-batches and v chunks per rank: empty
// cells are idle slots, "(a;b)OVERLAP_F_B" runs a then b; the placement (loop or V) is the one
// the cells use. Its messages are added and it is validated. Throws std::invalid_argument naming
// the row, the cell and the cause: a bad token, a stage on the wrong rank, a missing or
// duplicated action, a deadlock and its cycle of waits.
Schedule from_csv(const std::string& text, int p, int m, int v);

// Evaluation's list: one micro-batch (id 0) forward through every virtual stage in order, placed
// as `placement` places its stages, with its SEND_ACT/RECV_ACT; no backward.
Schedule forward_only(const Schedule& placement);

// PipeDream-2BW (docs/design.md section 6; arXiv 2006.09503 section 3): 1F1B with no flush between
// optimizer steps. two_bw_step is one rank list per rank for one step, which the engine runs:
// micro-batch j of this step has id parity*m + j, of the next step (1-parity)*m + j (so m is 2x
// the step's micro-batches). Its forwards reach p-r-1 micro-batches into the next step, whose
// messages the next step's list receives. warm: the previous step ended drained (or none ran):
// this list starts with the warm-up forwards; drain: it ends with 1F1B's cool-down instead of
// forwards of the next step (before checkpoints, validation and the last step).
// two_bw unrolls three steps (warm, steady, drained) with ids step*m + j and a STEP between the
// steps: what the validator proves, the simulator times and the memory model sizes.
// Both need m >= p.
Schedule two_bw_step(int p, int m, int parity, bool warm, bool drain);
// The eight step lists the engine may run, index parity + 2 warm + 4 drain.
std::vector<Schedule> two_bw_steps(int p, int m);
Schedule two_bw(int p, int m);

} // namespace pt::schedule
