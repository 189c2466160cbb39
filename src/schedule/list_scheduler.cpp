// The memory-bounded zero-bubble schedules, built by one unit-cost list scheduler (F, BI and BW
// each take one time unit, messages none): ZB-H1 and ZB-H2 (arXiv 2401.10241 sections 2 and 3)
// in loop placement, V-Half and V-Min (arXiv 2405.15362) in V placement. docs/pipeline.md gives
// each one's limits and the papers' bounds they meet.
#include <algorithm>
#include <climits>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>

#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

namespace pt::schedule {
namespace {

// Per rank r: the most micro-batches between their F and their BI (`between_f_bi`), the most
// whose BI ran and BW not yet (`pending_w`), and the most chunk activations alive from F to BW
// (`live`; in the V placement a chunk-0 forward also leaves room for one chunk-1 forward).
struct Limits {
  std::function<int(int r)> between_f_bi = [](int) { return INT_MAX; };
  std::function<int(int r)> pending_w = [](int) { return INT_MAX; };
  std::function<int(int r)> live = [](int) { return INT_MAX; };
  // where both a BI and an F are ready: false, the BI; true, the one 1F1B's alternation asks
  // for (an F after a BI, a BI after an F)
  bool alternate = false;
  // time steps an action takes on rank r (F, BI or BW), and a message between ranks (search)
  std::function<int(int r, Op op)> ticks = [](int, Op) { return 1; };
  int message_ticks = 0;
};

constexpr int kNever = INT_MAX;

// What the scheduler knows of one rank as it writes the rank's list.
struct RankState {
  int next_f[2] = {0, 0}, next_bi[2] = {0, 0};
  std::deque<Action> pending; // BW halves owed, oldest first
  int live = 0;               // chunk activations from F to BW (or to B)
  int busy_until = 0;         // the time step the running action ends
  bool last_was_f = false;
  bool done(int m, int v) const {
    return pending.empty() && next_bi[0] == m && (v == 1 || next_bi[1] == m);
  }
};

// The most time steps in which nothing may start while something still runs or travels.
int longest_wait(int p, const Limits& lim) {
  int longest = lim.message_ticks + 1;
  for (int r = 0; r < p; ++r) {
    for (Op op : {Op::F, Op::BI, Op::BW}) longest = std::max(longest, lim.ticks(r, op) + 1);
  }
  return longest;
}

// Every rank's list: at each time step an idle rank runs, in order of preference, a BW when it
// owes more than its limit; a ready BI (the later stage first); a ready F within the limits (the
// later stage first); the oldest owed BW; else it waits. Throws where the limits leave no rank
// able to move (they are too small for p).
Schedule list_schedule(Schedule s, const Limits& lim) {
  const int p = s.p, m = s.m, v = s.v, S = s.stages();
  std::vector<std::vector<int>> f_done(static_cast<std::size_t>(S),
                                       std::vector<int>(static_cast<std::size_t>(m), kNever));
  std::vector<std::vector<int>> bi_done = f_done;
  std::vector<RankState> st(static_cast<std::size_t>(p));
  const auto at = [](std::vector<std::vector<int>>& t, int stage, int mb) -> int& {
    return t[static_cast<std::size_t>(stage)][static_cast<std::size_t>(mb)];
  };
  // when the output of (stage, mb) is usable on rank r: its end, plus a message to another rank
  const auto arrived = [&](std::vector<std::vector<int>>& done, int stage, int mb, int r, int t) {
    const int end = at(done, stage, mb);
    return end != kNever && end + (s.rank_of(stage) != r ? lim.message_ticks : 0) <= t;
  };
  const int longest = longest_wait(p, lim);
  int finished = 0, idle_steps = 0;
  for (int t = 0; finished < p; ++t) {
    bool moved = false;
    for (int r = 0; r < p; ++r) {
      RankState& k = st[static_cast<std::size_t>(r)];
      if (k.done(m, v) || k.busy_until > t) continue;
      auto& out = s.ranks[static_cast<std::size_t>(r)];
      const auto ready_bi = [&](int c) {
        const int mb = k.next_bi[c], stage = s.stage_of(r, c);
        return mb < m && mb < k.next_f[c] && arrived(f_done, stage, mb, r, t) &&
               (stage == S - 1 || arrived(bi_done, stage + 1, mb, r, t));
      };
      const auto ready_f = [&](int c) {
        const int mb = k.next_f[c], stage = s.stage_of(r, c);
        if (mb >= m || (stage > 0 && !arrived(f_done, stage - 1, mb, r, t))) return false;
        if (mb - k.next_bi[c] >= lim.between_f_bi(r)) return false;
        // V: a chunk-0 forward leaves one slot free, so a chunk-1 forward can always run
        return k.live + (c == 0 && v == 2 ? 2 : 1) <= lim.live(r);
      };
      const auto run_w = [&] {
        out.push_back(k.pending.front());
        k.pending.pop_front();
        --k.live;
        k.busy_until = t + lim.ticks(r, Op::BW);
      };
      const int cf = v == 2 && ready_f(1) ? 1 : ready_f(0) ? 0 : -1;
      const bool f_first = lim.alternate && !k.last_was_f && cf >= 0;
      const int cb = f_first ? -1 : v == 2 && ready_bi(1) ? 1 : ready_bi(0) ? 0 : -1;
      if (static_cast<int>(k.pending.size()) > lim.pending_w(r)) {
        run_w();
      } else if (cb >= 0) {
        const int c = cb, mb = k.next_bi[c]++;
        out.push_back({Op::BI, mb, c});
        k.busy_until = t + lim.ticks(r, Op::BI);
        at(bi_done, s.stage_of(r, c), mb) = k.busy_until;
        k.pending.push_back({Op::BW, mb, c});
        k.last_was_f = false;
      } else if (cf >= 0) {
        const int c = cf, mb = k.next_f[c]++;
        out.push_back({Op::F, mb, c});
        k.busy_until = t + lim.ticks(r, Op::F);
        at(f_done, s.stage_of(r, c), mb) = k.busy_until;
        ++k.live;
        k.last_was_f = true;
      } else if (!k.pending.empty()) {
        run_w();
      } else {
        continue; // waits for a peer
      }
      moved = true;
      if (k.done(m, v)) ++finished;
    }
    idle_steps = moved ? 0 : idle_steps + 1;
    if (idle_steps > longest) { // nothing ran, nothing is running or on its way
      throw std::invalid_argument(s.name + ": its memory limits leave no rank able to move (pp " +
                                  std::to_string(p) + ", " + std::to_string(m) + " micro-batches)");
    }
  }
  return s;
}

} // namespace

// ZB-H1: 1F1B's memory, the paper's (p - r) M_B + r M_W: p - r micro-batches between F and BI
// and at most r weight halves owed; weight halves fill what would be 1F1B's bubbles, leaving
// (p-1)(T_F + T_B - T_W) idle per rank.
Schedule zb_h1(int p, int m) {
  Limits lim;
  lim.between_f_bi = [p](int r) { return p - r; };
  lim.pending_w = [](int r) { return r; };
  lim.alternate = true;
  return list_schedule(empty("zb-h1", p, m, 1, false), lim);
}

// ZB-H2: twice the room, 2(p - r) - 1 micro-batches between F and BI and at most 2r weight
// halves owed (the paper's (2p - 2i + 1) M_B + (2i - 2) M_W for worker i = r + 1): more forwards
// in the warm-up fill the bubble before the first backward.
Schedule zb_h2(int p, int m) {
  Limits lim;
  lim.between_f_bi = [p](int r) { return 2 * (p - r) - 1; };
  lim.pending_w = [](int r) { return 2 * r; };
  lim.alternate = true;
  return list_schedule(empty("zb-h2", p, m, 1, false), lim);
}

// V-Half and V-Min: V placement with every rank's live activations at most (p + 2) / 2 and
// (p + 4) / 3 micro-batches (two chunk activations each), the bounds of arXiv 2405.15362's
// V-Half and V-Min (sail-sg/zero-bubble-pipeline-parallelism's table). The smallest room that
// still moves is one micro-batch (two chunks).
Schedule v_half(int p, int m) {
  Limits lim;
  lim.live = [p](int) { return 2 * std::max(1, (p + 2) / 2); };
  lim.alternate = true;
  return list_schedule(empty("v-half", p, m, 2, true), lim);
}

Schedule v_min(int p, int m) {
  Limits lim;
  lim.live = [p](int) { return 2 * std::max(1, (p + 4) / 3); };
  lim.alternate = true;
  return list_schedule(empty("v-min", p, m, 2, true), lim);
}

namespace {

// The step time of compute-only lists with their messages added, or infinity where they are not a
// valid schedule or a rank holds more than `budget` micro-batches (F to B or BW) at once.
double score(Schedule s, const std::vector<Costs>& costs, int budget) {
  add_communication(s);
  const Validation v = validate(s);
  if (!v.ok) return std::numeric_limits<double>::infinity();
  for (int peak : v.peak_live) {
    if (peak > budget) return std::numeric_limits<double>::infinity();
  }
  return simulate(s, costs).step_time;
}

} // namespace

Schedule search_schedule(int p, int m, const std::vector<Costs>& costs, int budget,
                         int evaluations) {
  if (budget < 1) throw std::invalid_argument("search: the memory budget is below 1 micro-batch");
  // the list scheduler's time steps: the cheapest action 16 of them
  double cheapest = std::numeric_limits<double>::infinity();
  for (const Costs& c : costs) {
    for (double x : {c.f, c.bi, c.bw}) {
      if (x > 0.0) cheapest = std::min(cheapest, x);
    }
  }
  const double scale = std::isfinite(cheapest) ? 16.0 / cheapest : 1.0;
  const auto ticks = [&](double x) {
    return std::max(1, static_cast<int>(std::lround(x * scale)));
  };
  std::vector<Schedule> seeds = {gpipe(p, m), one_f_one_b(p, m), zb_h1(p, m), zb_h2(p, m)};
  for (bool alternate : {false, true}) {
    for (bool one_f_one_b_limit : {false, true}) {
      Limits lim;
      lim.live = [budget](int) { return budget; };
      if (one_f_one_b_limit) lim.between_f_bi = [p](int r) { return p - r; };
      lim.alternate = alternate;
      lim.ticks = [&](int r, Op op) {
        const Costs& c = costs[static_cast<std::size_t>(r)];
        return ticks(op == Op::F ? c.f : op == Op::BI ? c.bi : c.bw);
      };
      lim.message_ticks = static_cast<int>(std::lround(costs[0].comm * scale));
      try {
        seeds.push_back(list_schedule(empty("search", p, m, 1, false), lim));
      } catch (const std::invalid_argument&) { // these limits leave a rank unable to move
      }
    }
  }
  Schedule best;
  double best_time = std::numeric_limits<double>::infinity();
  for (Schedule& s : seeds) {
    const double t = score(s, costs, budget);
    if (t < best_time) {
      best_time = t;
      best = std::move(s);
    }
  }
  if (!std::isfinite(best_time)) {
    throw std::invalid_argument("search: no schedule keeps every rank within " +
                                std::to_string(budget) + " micro-batches of activations");
  }
  // local improvement: swap neighbouring actions of one rank while the step gets shorter
  int used = 0;
  for (bool improved = true; improved && used < evaluations;) {
    improved = false;
    for (auto& list : best.ranks) {
      for (std::size_t i = 0; i + 1 < list.size() && used < evaluations; ++i) {
        std::swap(list[i], list[i + 1]);
        ++used;
        const double t = score(best, costs, budget);
        if (t < best_time - 1e-12 * best_time) {
          best_time = t;
          improved = true;
        } else {
          std::swap(list[i], list[i + 1]);
        }
      }
    }
  }
  best.name = "search";
  add_communication(best);
  return best;
}

} // namespace pt::schedule
