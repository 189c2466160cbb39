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
