// What one action list implies beyond its order: the message channels of a schedule (one per
// direction, sender and receiver) and how a rank uses each chunk (schedule.hpp).
#include <algorithm>
#include <map>
#include <tuple>

#include "schedule/schedule.hpp"

namespace pt::schedule {

std::vector<ChunkUse> chunk_use(const std::vector<Action>& actions, int chunks) {
  std::vector<ChunkUse> use(static_cast<std::size_t>(chunks));
  std::vector<int> live(use.size(), 0);
  for (const Action& a : actions) {
    const auto c = static_cast<std::size_t>(a.chunk);
    if (a.op == Op::F) use[c].peak_live = std::max(use[c].peak_live, ++live[c]);
    if (a.op == Op::B || a.op == Op::BW) --live[c];
    use[c].split = use[c].split || a.op == Op::BI;
    use[c].whole = use[c].whole || a.op == Op::B;
  }
  return use;
}

std::array<int, 2> receive_buffers(const std::vector<Action>& list) {
  std::array<int, 2> most{0, 0};
  std::array<std::vector<int>, 2> change; // per direction: +1 at a RECV, -1 after its consumer
  for (auto& c : change) c.assign(list.size() + 1, 0);
  for (std::size_t r = 0; r < list.size(); ++r) {
    const Action& a = list[r];
    if (a.op != Op::RECV_ACT && a.op != Op::RECV_GRAD) continue;
    const int dir = a.op == Op::RECV_ACT ? 0 : 1;
    std::size_t c = r + 1;
    for (; c < list.size(); ++c) {
      const Action& x = list[c];
      const bool consumes = dir == 0 ? x.op == Op::F : (x.op == Op::B || x.op == Op::BW);
      if (consumes && x.mb == a.mb && x.chunk == a.chunk) break;
    }
    ++change[static_cast<std::size_t>(dir)][r];
    --change[static_cast<std::size_t>(dir)][std::min(c + 1, list.size())];
  }
  for (std::size_t dir = 0; dir < 2; ++dir) {
    int live = 0;
    for (const int d : change[dir]) most[dir] = std::max(most[dir], live += d);
  }
  return most;
}

std::vector<Channel> channels(const Schedule& s) {
  std::map<std::tuple<bool, int, int>, Channel> by_key; // ordered by (grad, from, to)
  for (int r = 0; r < s.p; ++r) {
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (a.op != Op::SEND_ACT && a.op != Op::SEND_GRAD) continue;
      const bool grad = a.op == Op::SEND_GRAD;
      Channel& c = by_key[{grad, r, a.peer}];
      c.grad = grad;
      c.from = r;
      c.to = a.peer;
      const int dest = s.stage_of(r, a.chunk) + (grad ? -1 : 1);
      c.messages.push_back({a.mb, s.chunk_of(dest)});
    }
  }
  std::vector<Channel> out;
  out.reserve(by_key.size());
  for (auto& [key, c] : by_key) out.push_back(std::move(c));
  return out;
}

} // namespace pt::schedule
