// Pipeline schedules as data (DESIGN.md section 6): for each pipeline rank an ordered list of
// actions. No MPI and no kernels here: schedules can be generated, validated and simulated alone.
//
// p = pipeline ranks, m = micro-batches per step, v = chunks (virtual stages) per rank,
// S = p*v virtual stages. Virtual stage s lives on rank s % p as chunk s / p (Megatron's
// interleaved placement; with v = 1, stage s is rank s).
#pragma once

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
  std::vector<std::vector<Action>> ranks; // ranks[r] = rank r's actions, in order

  int stages() const { return p * v; }
  int stage_of(int rank, int chunk) const { return chunk * p + rank; }
  int rank_of(int stage) const { return stage % p; }
  int chunk_of(int stage) const { return stage / p; }
};

// "F(mb 3, chunk 0)", "RECV_GRAD(mb 1, chunk 1) from rank 2"
std::string describe(const Action& a);
const char* op_name(Op op);

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

// Every channel of the schedule, ordered by (grad, from, to): the same list on every rank, so
// ranks can set up their channels' connections one after another in this order.
std::vector<Channel> channels(const Schedule& s);

// The compute-only generators (exposed for tests); add_communication() inserts the SEND/RECV
// actions every compute action needs, next to it.
Schedule gpipe(int p, int m);
Schedule one_f_one_b(int p, int m);
Schedule interleaved_1f1b(int p, int m, int v);
Schedule zb_h1(int p, int m);
void add_communication(Schedule& s);

} // namespace pt::schedule
