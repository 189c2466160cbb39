// The pipeline transport on its own, over every rank of the job as one pipeline: for the
// schedules 1f1b, interleaved (v = 2) and zb-v, each rank posts every receive of its step list
// up front (as the engine does), then sends its messages in the reverse of the list's order, so
// that every message arrives long before or after the receive the engine would wait on. Each
// payload names (direction, micro-batch, sending stage, element); every received buffer must
// hold exactly the message its (direction, micro-batch, chunk) names: the tags keep apart the
// directions, the micro-batches and the chunks of one pair of ranks. Two steps reuse the same
// buffers. Prints "N passed, 0 failed" on rank 0; exit code 1 on any failure.
// (A message that never comes, named by the watchdog: pipe.hang_watchdog.)
#include <mpi.h>

#include <cstdio>
#include <map>
#include <vector>

#include "comm/p2p.hpp"
#include "comm/watchdog.hpp"

namespace {

using pt::schedule::Action;
using pt::schedule::Op;

constexpr std::size_t kFloats = 37; // floats per message

float payload(int dir, int mb, int stage, std::size_t i, int step) {
  return static_cast<float>(((dir * 1000 + mb) * 100 + stage) * 64 + static_cast<int>(i % 64)) +
         0.5f * static_cast<float>(step);
}

// One step of sched on this rank: true when every receive got its own message.
bool one_step(pt::PipeTransport& t, const pt::schedule::Schedule& sched, int me, int step,
              std::map<pt::PipeTransport::Msg, std::vector<float>>& bufs) {
  const std::vector<Action>& actions = sched.ranks[static_cast<std::size_t>(me)];
  for (const Action& a : actions) {
    if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD) {
      bufs[{a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk}].assign(kFloats, -1.0f);
    }
  }
  auto posted =
      t.receive_step(actions, [&](const pt::PipeTransport::Msg& m) { return bufs.at(m).data(); });
  std::vector<std::vector<float>> out;
  std::vector<pt::PipeTransport::Handle> sends;
  out.reserve(actions.size());
  for (auto it = actions.rbegin(); it != actions.rend(); ++it) { // the list's sends, reversed
    if (it->op != Op::SEND_ACT && it->op != Op::SEND_GRAD) continue;
    const int dir = it->op == Op::SEND_ACT ? 0 : 1;
    const int stage = sched.stage_of(me, it->chunk);
    out.emplace_back(kFloats);
    for (std::size_t i = 0; i < kFloats; ++i) out.back()[i] = payload(dir, it->mb, stage, i, step);
    sends.push_back(t.start_send(out.back().data(), dir, it->mb, it->chunk, it->peer));
  }
  bool ok = true;
  for (auto& [msg, h] : posted) {
    t.wait(h, "a receive of the p2p test");
    const auto [dir, mb, chunk] = msg;
    const int sender = sched.stage_of(me, chunk) + (dir == 0 ? -1 : 1);
    const std::vector<float>& got = bufs.at(msg);
    for (std::size_t i = 0; i < kFloats; ++i)
      ok = ok && got[i] == payload(dir, mb, sender, i, step);
  }
  for (auto& h : sends) t.wait(h, "a send of the p2p test");
  return ok;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, passed = 0, failed = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    const pt::Watchdog watchdog(60.0, rank);
    struct Case {
      pt::ScheduleKind kind;
      int v;
      const char* name;
    };
    const Case cases[] = {{pt::ScheduleKind::one_f_one_b, 1, "1f1b"},
                          {pt::ScheduleKind::interleaved, 2, "interleaved"},
                          {pt::ScheduleKind::zb_v, 2, "zb-v"}};
    for (const Case& c : cases) {
      const pt::schedule::Schedule sched = pt::schedule::make_schedule(c.kind, size, 2 * size, c.v);
      pt::PipeTransport t(MPI_COMM_WORLD, sched, rank, watchdog, {}, kFloats);
      std::map<pt::PipeTransport::Msg, std::vector<float>> bufs;
      for (int step = 0; step < 2; ++step) {
        bool ok = one_step(t, sched, rank, step, bufs);
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_CXX_BOOL, MPI_LAND, MPI_COMM_WORLD);
        ok ? ++passed : ++failed;
        if (!ok && rank == 0) std::printf("FAIL: %s, step %d on %d ranks\n", c.name, step, size);
      }
    }
  }
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
