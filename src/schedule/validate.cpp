#include "schedule/validate.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace pt::schedule {
namespace {

// A message is named by its direction, micro-batch and the virtual stage that sends it.
using MsgKey = std::tuple<int, int, int>; // (0 act / 1 grad, mb, sender stage)

std::string where(int rank, std::size_t index, const Action& a) {
  return "rank " + std::to_string(rank) + " action " + std::to_string(index) + " " + describe(a);
}

// Replays the lists under the engine's rule, calling on_run(rank, index, action) for each action
// when it runs, and on_arrive(rank, k) when a rank reaches its k-th STEP (a barrier: it runs once
// every rank has reached it). Returns "" or the first problem.
class Replay {
public:
  // Every flag is dense, by (micro-batch, stage) and by message slot (message_slot): the planner
  // replays thousands of candidate schedules.
  explicit Replay(const Schedule& s)
      : s_(s), S_(static_cast<std::size_t>(s.stages())), M_(static_cast<std::size_t>(s.m)),
        sent_(2 * M_ * S_, {-1, 0}), got_(2 * M_ * S_, 0), f_(M_ * S_, 0), b_(M_ * S_, 0),
        bi_(M_ * S_, 0), bw_(M_ * S_, 0) {}

  template <class OnRun> std::string run(OnRun&& on_run) {
    return run(on_run, [](int, int) {});
  }
  template <class OnRun, class OnArrive> std::string run(OnRun&& on_run, OnArrive&& on_arrive) {
    const std::size_t P = static_cast<std::size_t>(s_.p);
    std::vector<std::size_t> pc(P, 0);
    arrived_.assign(P, 0);
    std::vector<bool> waiting(P, false); // at a STEP, arrived
    std::size_t remaining = 0;
    for (const auto& l : s_.ranks) remaining += l.size();
    while (remaining > 0) {
      bool progress = false;
      for (int r = 0; r < s_.p; ++r) {
        const auto& list = s_.ranks[static_cast<std::size_t>(r)];
        while (pc[static_cast<std::size_t>(r)] < list.size()) {
          const std::size_t i = pc[static_cast<std::size_t>(r)];
          const Action& a = list[i];
          const bool is_recv = a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD;
          if (is_recv) {
            const std::string err = check_peer(r, i, a);
            if (!err.empty()) return err;
            if (!sent(key_of_recv(r, a))) break; // blocked
          }
          if (a.op == Op::STEP) {
            const std::size_t R = static_cast<std::size_t>(r);
            if (!waiting[R]) {
              waiting[R] = true;
              on_arrive(r, arrived_[R]++);
              progress = true;
            }
            if (*std::min_element(arrived_.begin(), arrived_.end()) < arrived_[R]) break;
            waiting[R] = false;
          }
          const std::string err = apply(r, i, a);
          if (!err.empty()) return err;
          on_run(r, i, a);
          ++pc[static_cast<std::size_t>(r)];
          --remaining;
          progress = true;
        }
      }
      if (!progress) return deadlock(pc);
    }
    return finish();
  }

  MsgKey key_of_send(int r, const Action& a) const {
    return {a.op == Op::SEND_ACT ? 0 : 1, a.mb, s_.stage_of(r, a.chunk)};
  }
  MsgKey key_of_recv(int r, const Action& a) const {
    const int st = s_.stage_of(r, a.chunk);
    return a.op == Op::RECV_ACT ? MsgKey{0, a.mb, st - 1} : MsgKey{1, a.mb, st + 1};
  }

  const std::vector<int>& peak_live() const { return peak_; }

  // A message's slot among message_slots() (kind, micro-batch, sender stage), or npos when its
  // micro-batch or stage is out of range.
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::size_t message_slot(const MsgKey& k) const {
    const auto [kind, mb, st] = k;
    if (mb < 0 || mb >= s_.m || st < 0 || static_cast<std::size_t>(st) >= S_) return npos;
    return (static_cast<std::size_t>(kind) * M_ + static_cast<std::size_t>(mb)) * S_ +
           static_cast<std::size_t>(st);
  }
  std::size_t message_slots() const { return sent_.size(); }

private:
  std::size_t at(int mb, int st) const {
    return static_cast<std::size_t>(mb) * S_ + static_cast<std::size_t>(st);
  }
  bool sent(const MsgKey& k) const {
    const std::size_t i = message_slot(k);
    return i != npos && sent_[i].first >= 0;
  }
  bool got(const MsgKey& k) const { return got_[message_slot(k)] != 0; }

  std::string check_peer(int r, std::size_t i, const Action& a) const {
    const int st = s_.stage_of(r, a.chunk);
    const bool act = a.op == Op::RECV_ACT || a.op == Op::SEND_ACT;
    const bool recv = a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD;
    // activations flow to st+1, gradients to st-1
    const int other = (act != recv) ? st + 1 : st - 1;
    if (other < 0 || other >= s_.stages()) {
      return where(r, i, a) + ": stage " + std::to_string(st) + " has no " +
             (other < 0 ? "previous" : "next") + " stage to exchange with";
    }
    if (a.peer != s_.rank_of(other)) {
      return where(r, i, a) + ": wrong peer: stage " + std::to_string(other) + " is on rank " +
             std::to_string(s_.rank_of(other));
    }
    return "";
  }

  std::string apply(int r, std::size_t i, const Action& a) {
    if (a.op == Op::STEP) return "";
    if (a.mb < 0 || a.mb >= s_.m || a.chunk < 0 || a.chunk >= s_.v) {
      return where(r, i, a) + ": micro-batch or chunk out of range (m " + std::to_string(s_.m) +
             ", v " + std::to_string(s_.v) + ")";
    }
    const int st = s_.stage_of(r, a.chunk);
    const std::size_t id = at(a.mb, st);
    const std::size_t R = static_cast<std::size_t>(r);
    if (peak_.size() < static_cast<std::size_t>(s_.p)) {
      peak_.assign(static_cast<std::size_t>(s_.p), 0);
      live_.assign(static_cast<std::size_t>(s_.p), 0);
    }
    switch (a.op) {
    case Op::F: {
      if (f_[id]) return where(r, i, a) + ": runs a second time";
      const bool input =
          st == 0 || (s_.rank_of(st - 1) == r ? f_[at(a.mb, st - 1)] : got({0, a.mb, st - 1}));
      if (!input) {
        return where(r, i, a) + ": its input activation has not arrived (no RECV_ACT, or the "
                                "previous stage's F, before it)";
      }
      f_[id] = 1;
      peak_[R] = std::max(peak_[R], ++live_[R]);
      break;
    }
    case Op::B:
    case Op::BI: {
      if (b_[id] || bi_[id]) return where(r, i, a) + ": runs a second time";
      if (!f_[id]) return where(r, i, a) + ": comes before its forward";
      const bool grad =
          st == s_.stages() - 1 ||
          (s_.rank_of(st + 1) == r ? done_backward(at(a.mb, st + 1)) : got({1, a.mb, st + 1}));
      if (!grad) {
        return where(r, i, a) + ": its output gradient has not arrived (no RECV_GRAD, or the next "
                                "stage's backward, before it)";
      }
      if (a.op == Op::B) {
        b_[id] = 1;
        --live_[R];
      } else {
        bi_[id] = 1;
      }
      break;
    }
    case Op::BW:
      if (!bi_[id]) return where(r, i, a) + ": comes before its BI";
      if (bw_[id]) return where(r, i, a) + ": runs a second time";
      bw_[id] = 1;
      --live_[R];
      break;
    case Op::SEND_ACT:
    case Op::SEND_GRAD: {
      const std::string err = check_peer(r, i, a);
      if (!err.empty()) return err;
      const bool have = a.op == Op::SEND_ACT ? f_[id] != 0 : done_backward(id);
      if (!have) return where(r, i, a) + ": sends what has not been computed yet";
      const MsgKey k = key_of_send(r, a);
      if (sent(k)) return where(r, i, a) + ": sends the same message twice";
      sent_[message_slot(k)] = {r, i};
      break;
    }
    case Op::RECV_ACT:
    case Op::RECV_GRAD: {
      const MsgKey k = key_of_recv(r, a);
      if (got(k)) return where(r, i, a) + ": receives the same message twice";
      got_[message_slot(k)] = 1;
      break;
    }
    case Op::STEP: // returned above
      break;
    }
    return "";
  }

  bool done_backward(std::size_t id) const { return b_[id] || bi_[id]; }

  std::string deadlock(const std::vector<std::size_t>& pc) const {
    // Every unfinished rank waits at a RECV on its peer: follow the waits to a cycle.
    std::string msg = "deadlock: no rank can proceed;";
    std::vector<int> seen(static_cast<std::size_t>(s_.p), -1);
    int r = -1;
    for (int q = 0; q < s_.p; ++q) {
      if (pc[static_cast<std::size_t>(q)] < s_.ranks[static_cast<std::size_t>(q)].size()) {
        r = q;
        break;
      }
    }
    for (int step = 0; r >= 0 && seen[static_cast<std::size_t>(r)] < 0; ++step) {
      seen[static_cast<std::size_t>(r)] = step;
      const std::size_t i = pc[static_cast<std::size_t>(r)];
      if (i >= s_.ranks[static_cast<std::size_t>(r)].size()) {
        msg += " rank " + std::to_string(r) + " has finished its list without sending it";
        return msg;
      }
      const Action& a = s_.ranks[static_cast<std::size_t>(r)][i];
      if (a.op == Op::STEP) {
        msg += " " + where(r, i, a) + " waits for every rank at the optimizer step";
        return msg;
      }
      msg += " " + where(r, i, a) + " waits for rank " + std::to_string(a.peer) + ";";
      r = a.peer;
    }
    if (r >= 0) msg += " (a cycle back to rank " + std::to_string(r) + ")";
    return msg;
  }

  std::string finish() const {
    for (std::size_t k = 0; k < sent_.size(); ++k) { // in (kind, micro-batch, stage) order
      const auto [r, i] = sent_[k];
      if (r >= 0 && !got_[k]) {
        return where(r, i, s_.ranks[static_cast<std::size_t>(r)][i]) + ": is never received";
      }
    }
    for (int st = 0; st < s_.stages(); ++st) {
      for (int mb = 0; mb < s_.m; ++mb) {
        const std::size_t id = at(mb, st);
        const auto what = [&] {
          return "rank " + std::to_string(s_.rank_of(st)) + ": micro-batch " + std::to_string(mb) +
                 " of stage " + std::to_string(st);
        };
        if (!f_[id]) return what() + " has no forward";
        if (!b_[id] && !(bi_[id] && bw_[id])) {
          return what() + (bi_[id] ? " has BI but no BW" : " has no backward");
        }
      }
    }
    return "";
  }

  const Schedule& s_;
  std::size_t S_, M_;                             // stages, micro-batches
  std::vector<std::pair<int, std::size_t>> sent_; // per message slot: (rank, action) or rank -1
  std::vector<char> got_;                         // per message slot
  std::vector<char> f_, b_, bi_, bw_;             // per (micro-batch, stage): ran
  std::vector<int> peak_, live_;
  std::vector<int> arrived_; // per rank: STEPs reached
};

} // namespace

Validation validate(const Schedule& s) {
  Validation v;
  if (static_cast<int>(s.ranks.size()) != s.p) {
    v.error = "the schedule has " + std::to_string(s.ranks.size()) +
              " rank lists for p = " + std::to_string(s.p);
    return v;
  }
  Replay replay(s);
  v.error = replay.run([](int, std::size_t, const Action&) {});
  v.ok = v.error.empty();
  v.peak_live = replay.peak_live();
  return v;
}

double step_bubble(const Simulation& sim) {
  if (sim.step_ends.size() < 3) return sim.mean_bubble;
  const double span = sim.step_ends[1] - sim.step_ends[0];
  const double steps = static_cast<double>(sim.step_ends.size());
  double bubble = 0.0;
  for (double busy : sim.busy) bubble += 1.0 - busy / steps / span;
  return span > 0 ? bubble / static_cast<double>(sim.busy.size()) : 0.0;
}

Simulation simulate(const Schedule& s, const Costs& c) {
  return simulate(s, std::vector<Costs>(static_cast<std::size_t>(s.p), c));
}

Simulation simulate(const Schedule& s, const std::vector<Costs>& per_rank) {
  const std::size_t P = static_cast<std::size_t>(s.p);
  if (per_rank.size() != P) throw std::invalid_argument("simulate: one Costs per rank needed");
  Simulation out;
  out.busy.assign(P, 0.0);
  std::vector<double> now(P, 0.0);
  std::vector<double> arrival;   // per message slot
  std::vector<double> barrier;   // per STEP: when the last rank reached it
  std::vector<int> passed(P, 0); // per rank: STEPs passed
  auto arrive = [&](int r, int k) {
    if (barrier.size() <= static_cast<std::size_t>(k)) barrier.resize(k + 1, 0.0);
    barrier[static_cast<std::size_t>(k)] =
        std::max(barrier[static_cast<std::size_t>(k)], now[static_cast<std::size_t>(r)]);
  };
  Replay replay(s);
  arrival.assign(replay.message_slots(), 0.0);
  const std::string err = replay.run(
      [&](int r, std::size_t, const Action& a) {
        const std::size_t R = static_cast<std::size_t>(r);
        const Costs& c = per_rank[R];
        double cost = 0.0;
        switch (a.op) {
        case Op::F:
          cost = c.f;
          break;
        case Op::B:
          cost = c.b;
          break;
        case Op::BI:
          cost = c.bi;
          break;
        case Op::BW:
          cost = c.bw;
          break;
        case Op::SEND_ACT:
        case Op::SEND_GRAD:
          arrival[replay.message_slot(replay.key_of_send(r, a))] = now[R] + c.comm;
          break;
        case Op::RECV_ACT:
        case Op::RECV_GRAD:
          now[R] = std::max(now[R], arrival[replay.message_slot(replay.key_of_recv(r, a))]);
          break;
        case Op::STEP:
          now[R] = barrier[static_cast<std::size_t>(passed[R]++)];
          break;
        }
        if (cost > 0.0) out.spans.push_back({r, a.op, a.mb, a.chunk, now[R], now[R] + cost});
        now[R] += cost;
        out.busy[R] += cost;
      },
      arrive);
  if (!err.empty()) throw std::invalid_argument("cannot simulate an invalid schedule: " + err);
  out.step_time = *std::max_element(now.begin(), now.end());
  out.step_ends = barrier;
  out.bubble.resize(P);
  for (std::size_t r = 0; r < P; ++r) {
    out.bubble[r] = out.step_time > 0 ? 1.0 - out.busy[r] / out.step_time : 0.0;
    out.mean_bubble += out.bubble[r] / static_cast<double>(P);
  }
  return out;
}

} // namespace pt::schedule
