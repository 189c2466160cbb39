// Schedule generators. Sources for each schedule's shape (docs/pipeline.md cites them): GPipe,
// arXiv 1811.06965; 1F1B / PipeDream-Flush, arXiv 2006.09503; interleaved 1F1B, arXiv 2104.04473
// and Megatron-LM's schedules.py; ZB-H1 and ZB-V, arXiv 2401.10241 and PyTorch's
// ScheduleZBVZeroBubble; DualPipeV, deepseek-ai/DualPipe.
#include <algorithm>
#include <deque>
#include <stdexcept>

#include "schedule/schedule.hpp"

namespace pt::schedule {

const char* op_name(Op op) {
  switch (op) {
  case Op::F:
    return "F";
  case Op::B:
    return "B";
  case Op::BI:
    return "BI";
  case Op::BW:
    return "BW";
  case Op::SEND_ACT:
    return "SEND_ACT";
  case Op::RECV_ACT:
    return "RECV_ACT";
  case Op::SEND_GRAD:
    return "SEND_GRAD";
  case Op::RECV_GRAD:
    return "RECV_GRAD";
  case Op::STEP:
    return "STEP";
  }
  return "?";
}

std::string describe(const Action& a) {
  std::string s = std::string(op_name(a.op)) + "(mb " + std::to_string(a.mb) + ", chunk " +
                  std::to_string(a.chunk) + ")";
  if (a.op == Op::SEND_ACT || a.op == Op::SEND_GRAD) s += " to rank " + std::to_string(a.peer);
  if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD) s += " from rank " + std::to_string(a.peer);
  return s;
}

Schedule empty(const std::string& name, int p, int m, int v, bool vshape) {
  if (p < 1 || m < 1 || v < 1) {
    throw std::invalid_argument(name + ": p, m and v must be >= 1");
  }
  Schedule s;
  s.name = name;
  s.p = p;
  s.m = m;
  s.v = v;
  s.vshape = vshape;
  s.ranks.resize(static_cast<std::size_t>(p));
  return s;
}

// All forwards, then all backwards (fill and drain).
Schedule gpipe(int p, int m) {
  Schedule s = empty("gpipe", p, m, 1);
  for (int r = 0; r < p; ++r) {
    auto& a = s.ranks[static_cast<std::size_t>(r)];
    for (int i = 0; i < m; ++i) a.push_back({Op::F, i, 0});
    for (int i = 0; i < m; ++i) a.push_back({Op::B, i, 0});
  }
  return s;
}

// 1F1B: p - r - 1 warm-up forwards, then one forward / one backward, then the remaining backwards.
Schedule one_f_one_b(int p, int m) {
  Schedule s = empty("1f1b", p, m, 1);
  for (int r = 0; r < p; ++r) {
    auto& a = s.ranks[static_cast<std::size_t>(r)];
    const int warmup = std::min(p - r - 1, m);
    for (int i = 0; i < warmup; ++i) a.push_back({Op::F, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      a.push_back({Op::F, warmup + i, 0});
      a.push_back({Op::B, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) a.push_back({Op::B, i, 0});
  }
  return s;
}

// Megatron's interleaved 1F1B: virtual micro-batch k runs chunk (k mod p*v) / p on micro-batch
// (k / (p*v)) * p + k mod p; backwards visit the chunks in reverse. Warm-up is
// 2*(p - r - 1) + (v - 1)*p virtual micro-batches (all of them when m == p).
Schedule interleaved_1f1b(int p, int m, int v) {
  if (p < 2 || v < 2 || m % p != 0) {
    throw std::invalid_argument("interleaved needs pp >= 2, virtual_stages >= 2 and micro-batches "
                                "divisible by pp (got pp " +
                                std::to_string(p) + ", v " + std::to_string(v) + ", m " +
                                std::to_string(m) + ")");
  }
  Schedule s = empty("interleaved", p, m, v);
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    auto& a = s.ranks[static_cast<std::size_t>(r)];
    int warmup = m == p ? total : std::min(total, 2 * (p - r - 1) + (v - 1) * p);
    for (int k = 0; k < warmup; ++k) a.push_back({Op::F, mb_of(k), chunk_of(k, true)});
    for (int k = 0; k < total - warmup; ++k) {
      a.push_back({Op::F, mb_of(warmup + k), chunk_of(warmup + k, true)});
      a.push_back({Op::B, mb_of(k), chunk_of(k, false)});
    }
    for (int k = total - warmup; k < total; ++k) a.push_back({Op::B, mb_of(k), chunk_of(k, false)});
  }
  return s;
}

namespace {

// One rank's list of a V-shaped schedule being written: the next forward and backward
// micro-batch of each chunk, and the backward-weight halves deferred so far (oldest first).
struct VList {
  explicit VList(std::vector<Action>& list) : out(list) {}
  std::vector<Action>& out;
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<Action> deferred;
  void f(int c) { out.push_back({Op::F, next_f[c]++, c}); }
  void b(int c) { out.push_back({Op::B, next_b[c]++, c}); } // whole backward
  void bi(int c) {                                          // input half now, weight half later
    out.push_back({Op::BI, next_b[c]++, c});
    deferred.push_back({Op::BW, out.back().mb, c});
  }
  void w() { w_of(-1); } // the oldest deferred weight half
  bool w_of(int c) {     // the oldest deferred weight half of chunk c (-1: of any); false: none
    auto it = std::find_if(deferred.begin(), deferred.end(),
                           [c](const Action& a) { return c < 0 || a.chunk == c; });
    if (it == deferred.end()) return false;
    out.push_back(*it);
    deferred.erase(it);
    return true;
  }
};

Schedule v_empty(const std::string& name, int p, int m) {
  return empty(name, p, m, 2, true);
}

} // namespace

// ZB-V (arXiv 2401.10241, after PyTorch's ScheduleZBVZeroBubble): chunk 0 = stage r,
// chunk 1 = stage 2p-1-r. Written for max(2p-1, m) micro-batches, then the actions of micro-batches
// >= m are dropped (whole micro-batches, so the order stays valid for any m >= 1).
Schedule zb_v(int p, int m) {
  Schedule s = v_empty("zb-v", p, m);
  const int n = std::max(2 * p - 1, m);
  for (int r = 0; r < p; ++r) {
    std::vector<Action> all;
    VList k(all);
    for (int i = 0; i < 2 * (p - r) - 1; ++i) k.f(0);
    for (int i = 0; i < r; ++i) {
      k.f(1);
      k.f(0);
    }
    for (int i = 0; i < p - r; ++i) {
      k.f(1);
      k.bi(1);
      k.w();
    }
    while (k.next_f[1] < n) { // steady: F, BI, BW of chunk 0, then of chunk 1
      if (k.next_f[0] < n) k.f(0);
      k.bi(0);
      k.w();
      k.f(1);
      k.bi(1);
      k.w();
    }
    for (int i = 0; i < r; ++i) { // cool-down: weight halves deferred
      k.bi(0);
      k.bi(1);
    }
    for (int i = 0; i < p - r; ++i) {
      k.bi(0);
      k.w_of(0);
    }
    while (k.w_of(1)) { // the rest: chunk 1's, then chunk 0's
    }
    while (k.w_of(0)) {
    }
    for (const Action& a : all) {
      if (a.mb < m) s.ranks[static_cast<std::size_t>(r)].push_back(a);
    }
  }
  return s;
}

// DualPipeV (after deepseek-ai/DualPipe's dualpipev.py): eight phases
// per rank; "F & B" pairs (a forward of one chunk with a whole backward of the other) run one
// after the other; deferred weight halves leave in FIFO order.
Schedule dualpipev(int p, int m) {
  if (m < 2 * p) {
    throw std::invalid_argument("dualpipev needs micro-batches >= 2 * pp (got " +
                                std::to_string(m) + " micro-batches, pp " + std::to_string(p) +
                                "): raise train.global_batch or lower train.micro_batch");
  }
  Schedule s = v_empty("dualpipev", p, m);
  for (int r = 0; r < p; ++r) {
    VList k(s.ranks[static_cast<std::size_t>(r)]);
    for (int i = 0; i < 2 * (p - r - 1); ++i) k.f(0);
    for (int i = 0; i < r + 1; ++i) {
      k.f(0);
      k.f(1);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      k.bi(1);
      k.w();
      k.f(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      k.f(0);
      k.b(1);
      k.f(1);
      k.b(0);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      k.b(1);
      k.f(1);
      k.b(0);
    }
    bool split = false; // deferring weight halves starts half-way through this phase
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      split ? k.bi(1) : k.b(1);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      split ? k.bi(0) : k.b(0);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      k.w();
      k.bi(0);
    }
    while (!k.deferred.empty()) k.w();
  }
  return s;
}

namespace {

// Rank r's compute actions of 2bw's step t; id(step, j) names micro-batch j of a step.
template <class Id>
void two_bw_actions(std::vector<Action>& out, int p, int r, int m, int t, bool warm, bool drain,
                    Id id) {
  const int w = p - r - 1; // warm-up forwards, as in 1F1B
  auto f = [&](int j) { out.push_back({Op::F, j < m ? id(t, j) : id(t + 1, j - m), 0}); };
  if (warm) {
    for (int j = 0; j < w; ++j) f(j);
  }
  for (int i = 0; i < m; ++i) {
    if (w + i < m || !drain) f(w + i);
    out.push_back({Op::B, id(t, i), 0});
  }
}

void need_two_bw(int p, int m) {
  if (m < p) {
    throw std::invalid_argument("2bw needs micro-batches >= pp (got " + std::to_string(m) +
                                " micro-batches, pp " + std::to_string(p) +
                                "): raise train.global_batch or lower train.micro_batch");
  }
}

} // namespace

Schedule two_bw_step(int p, int m, int parity, bool warm, bool drain) {
  need_two_bw(p, m);
  Schedule s = empty("2bw", p, 2 * m, 1);
  for (int r = 0; r < p; ++r) {
    two_bw_actions(s.ranks[static_cast<std::size_t>(r)], p, r, m, parity, warm, drain,
                   [m](int step, int j) { return (step % 2) * m + j; });
  }
  add_communication(s);
  return s;
}

std::vector<Schedule> two_bw_steps(int p, int m) {
  std::vector<Schedule> steps;
  for (int k = 0; k < 8; ++k)
    steps.push_back(two_bw_step(p, m, k % 2, (k / 2) % 2 == 1, k / 4 == 1));
  return steps;
}

Schedule two_bw(int p, int m) {
  need_two_bw(p, m);
  constexpr int kSteps = 3;
  Schedule s = empty("2bw", p, kSteps * m, 1);
  for (int r = 0; r < p; ++r) {
    auto& a = s.ranks[static_cast<std::size_t>(r)];
    for (int t = 0; t < kSteps; ++t) {
      two_bw_actions(a, p, r, m, t, t == 0, t == kSteps - 1,
                     [m](int step, int j) { return step * m + j; });
      a.push_back({Op::STEP, 0, 0});
    }
  }
  return s;
}

void add_communication(Schedule& s) {
  const int S = s.stages();
  for (int r = 0; r < s.p; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      const int st = s.stage_of(r, a.chunk);
      const bool has_prev = st > 0 && s.rank_of(st - 1) != r;
      const bool has_next = st < S - 1 && s.rank_of(st + 1) != r;
      switch (a.op) {
      case Op::F:
        if (has_prev) out.push_back({Op::RECV_ACT, a.mb, a.chunk, s.rank_of(st - 1)});
        out.push_back(a);
        if (has_next) out.push_back({Op::SEND_ACT, a.mb, a.chunk, s.rank_of(st + 1)});
        break;
      case Op::B:
      case Op::BI:
        if (has_next) out.push_back({Op::RECV_GRAD, a.mb, a.chunk, s.rank_of(st + 1)});
        out.push_back(a);
        if (has_prev) out.push_back({Op::SEND_GRAD, a.mb, a.chunk, s.rank_of(st - 1)});
        break;
      default:
        out.push_back(a);
      }
    }
    s.ranks[static_cast<std::size_t>(r)] = std::move(out);
  }
}

Schedule forward_only(const Schedule& placement) {
  Schedule s;
  s.name = placement.name + " forward only";
  s.p = placement.p;
  s.v = placement.v;
  s.vshape = placement.vshape;
  s.ranks.resize(static_cast<std::size_t>(s.p));
  for (int st = 0; st < s.stages(); ++st) {
    s.ranks[static_cast<std::size_t>(s.rank_of(st))].push_back({Op::F, 0, s.chunk_of(st)});
  }
  add_communication(s);
  return s;
}

int default_chunks(const std::string& name) {
  for (const char* n : {"interleaved", "zb-v", "v-half", "v-min", "dualpipev"}) {
    if (name == n) return 2;
  }
  return 1;
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  const bool vshape = kind == ScheduleKind::zb_v || kind == ScheduleKind::dualpipev ||
                      kind == ScheduleKind::v_half || kind == ScheduleKind::v_min;
  if (vshape && v != 2) {
    throw std::invalid_argument("schedule \"" + std::string(name(kind)) +
                                "\" places two chunks per rank in a V: virtual_stages must be 2");
  }
  if (!vshape && kind != ScheduleKind::interleaved && v != 1) {
    throw std::invalid_argument("schedule \"" + std::string(name(kind)) +
                                "\" runs one chunk per rank: "
                                "virtual_stages must be 1 (use \"interleaved\" for v > 1)");
  }
  Schedule s;
  switch (kind) {
  case ScheduleKind::gpipe:
    s = gpipe(p, m);
    break;
  case ScheduleKind::one_f_one_b:
    s = one_f_one_b(p, m);
    break;
  case ScheduleKind::interleaved:
    s = interleaved_1f1b(p, m, v);
    break;
  case ScheduleKind::zb_h1:
    s = zb_h1(p, m);
    break;
  case ScheduleKind::zb_h2:
    s = zb_h2(p, m);
    break;
  case ScheduleKind::zb_v:
    s = zb_v(p, m);
    break;
  case ScheduleKind::v_half:
    s = v_half(p, m);
    break;
  case ScheduleKind::v_min:
    s = v_min(p, m);
    break;
  case ScheduleKind::dualpipev:
    s = dualpipev(p, m);
    break;
  case ScheduleKind::two_bw:
    s = two_bw(p, m);
    break;
  case ScheduleKind::file:
    throw std::invalid_argument("a schedule file is read by from_csv, not made");
  case ScheduleKind::search:
    throw std::invalid_argument("a searched schedule needs the stage costs: search_schedule");
  }
  add_communication(s);
  return s;
}

} // namespace pt::schedule
