// Schedules as data: every generated schedule validates for p 1..8, m 1..32 (v 2..4 where
// valid), the simulator's bubble meets the closed forms, and broken schedules are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

namespace pt::schedule {
namespace {

TEST(Schedule, EveryScheduleValidatesExhaustively) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      for (ScheduleKind kind :
           {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
        const Validation v = validate(make_schedule(kind, p, m, 1));
        ASSERT_TRUE(v.ok) << name(kind) << " p " << p << " m " << m << ": " << v.error;
        ++checked;
      }
      // 2bw: three steps unrolled (warm-up, steady, drained) with the optimizer step a barrier
      if (m >= p) {
        const Validation tb = validate(make_schedule(ScheduleKind::two_bw, p, m, 1));
        ASSERT_TRUE(tb.ok) << "2bw p " << p << " m " << m << ": " << tb.error;
        ++checked;
      } else {
        EXPECT_THROW(make_schedule(ScheduleKind::two_bw, p, m, 1), std::invalid_argument);
      }
      // V-shaped: zb-v for every m, dualpipev from m = 2p (below it the generator refuses)
      const Validation zv = validate(make_schedule(ScheduleKind::zb_v, p, m, 2));
      ASSERT_TRUE(zv.ok) << "zb-v p " << p << " m " << m << ": " << zv.error;
      ++checked;
      if (m >= 2 * p) {
        const Validation dv = validate(make_schedule(ScheduleKind::dualpipev, p, m, 2));
        ASSERT_TRUE(dv.ok) << "dualpipev p " << p << " m " << m << ": " << dv.error;
        ++checked;
      } else {
        EXPECT_THROW(make_schedule(ScheduleKind::dualpipev, p, m, 2), std::invalid_argument);
      }
      for (int vs = 2; vs <= 4 && p >= 2; ++vs) {
        if (m % p != 0) continue;
        const Validation v = validate(make_schedule(ScheduleKind::interleaved, p, m, vs));
        ASSERT_TRUE(v.ok) << "interleaved p " << p << " m " << m << " v " << vs << ": " << v.error;
        ++checked;
      }
    }
  }
  std::printf("  %d schedules validated\n", checked);
}

// Per rank of a loop-placed list: the most micro-batches between F and BI, and the most at once
// between F and BW (F..BI at M_B each, BI..BW at M_W <= M_B: the Zero Bubble paper's memory).
std::vector<std::pair<int, int>> zb_peaks(const Schedule& s) {
  std::vector<std::pair<int, int>> out;
  for (const auto& list : s.ranks) {
    int b = 0, w = 0, peak_b = 0, peak_all = 0;
    for (const Action& a : list) {
      b += a.op == Op::F ? 1 : a.op == Op::BI ? -1 : 0;
      w += a.op == Op::BI ? 1 : a.op == Op::BW ? -1 : 0;
      peak_b = std::max(peak_b, b);
      peak_all = std::max(peak_all, b + w);
    }
    out.emplace_back(peak_b, peak_all);
  }
  return out;
}

// ZB-H1, ZB-H2, V-Half and V-Min validate for p 1..8, m 1..32 and keep the papers' activation
// bounds on every rank: ZB-H2 (2p - 2r - 1) M_B + 2r M_W (arXiv 2401.10241 section 3), V-Half (p +
// 2) / 2 and V-Min (p + 4) / 3 micro-batches of activations (arXiv 2405.15362; a micro-batch is two
// chunk activations, the validator's unit in the V placement).
TEST(Schedule, MemoryBoundedSchedulesKeepThePapersBounds) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      // ZB-H1: 1F1B's memory, (p - r) M_B + r M_W (its bubble: BubbleMatchesClosedForms)
      const Schedule h1 = make_schedule(ScheduleKind::zb_h1, p, m, 1);
      const Validation vh1 = validate(h1);
      ASSERT_TRUE(vh1.ok) << "zb-h1 p " << p << " m " << m << ": " << vh1.error;
      const auto h1_peaks = zb_peaks(h1);
      for (int r = 0; r < p; ++r) {
        const auto [b, all] = h1_peaks[static_cast<std::size_t>(r)];
        EXPECT_LE(b, p - r) << "zb-h1 p " << p << " m " << m << " rank " << r;
        EXPECT_LE(all, p) << "zb-h1 p " << p << " m " << m << " rank " << r;
      }
      const Schedule h2 = make_schedule(ScheduleKind::zb_h2, p, m, 1);
      const Validation vh2 = validate(h2);
      ASSERT_TRUE(vh2.ok) << "zb-h2 p " << p << " m " << m << ": " << vh2.error;
      const auto peaks = zb_peaks(h2);
      for (int r = 0; r < p; ++r) {
        const auto [b, all] = peaks[static_cast<std::size_t>(r)];
        EXPECT_LE(b, 2 * (p - r) - 1) << "zb-h2 p " << p << " m " << m << " rank " << r;
        EXPECT_LE(all, 2 * (p - r) - 1 + 2 * r) << "zb-h2 p " << p << " m " << m << " rank " << r;
      }
      for (auto [kind, bound] : {std::pair{ScheduleKind::v_half, (p + 2) / 2},
                                 std::pair{ScheduleKind::v_min, (p + 4) / 3}}) {
        const Validation v = validate(make_schedule(kind, p, m, 2));
        ASSERT_TRUE(v.ok) << name(kind) << " p " << p << " m " << m << ": " << v.error;
        for (int r = 0; r < p; ++r) {
          EXPECT_LE(v.peak_live[static_cast<std::size_t>(r)], 2 * std::max(1, bound))
              << name(kind) << " p " << p << " m " << m << " rank " << r;
        }
      }
    }
  }
}

// Schedule search (parallel.schedule = "search"): with equal F, I, W costs and 1F1B's memory its
// step is at most ZB-H1's, with twice that memory at most ZB-H2's, and with unequal stage costs
// at most the best named loop schedule's; every found schedule is valid and within its budget.
TEST(Schedule, SearchIsAtLeastAsFastAsTheNamedSchedules) {
  const auto step = [](const Schedule& s, const std::vector<Costs>& c) {
    return simulate(s, c).step_time;
  };
  for (auto [p, m] : {std::pair{2, 2}, {2, 4}, {2, 8}, {3, 6}, {4, 4}, {4, 8}, {4, 16}, {8, 16}}) {
    const std::vector<Costs> equal(static_cast<std::size_t>(p), Costs{1, 2, 1, 1, 0});
    std::vector<Costs> uneven; // the middle stages three times the edges
    for (int r = 0; r < p; ++r) {
      const double c = r == 0 || r == p - 1 ? 1.0 : 3.0;
      uneven.push_back({c, 2 * c, c, c, 0});
    }
    for (auto [costs, budget, bound] :
         {std::tuple{&equal, p, step(make_schedule(ScheduleKind::zb_h1, p, m, 1), equal)},
          {&equal, 2 * p, step(make_schedule(ScheduleKind::zb_h2, p, m, 1), equal)},
          {&uneven, 2 * p, 1e300}}) {
      double best = bound;
      if (costs == &uneven) {
        for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1,
                               ScheduleKind::zb_h2}) {
          best = std::min(best, step(make_schedule(k, p, m, 1), uneven));
        }
      }
      const Schedule found = search_schedule(p, m, *costs, budget);
      const Validation v = validate(found);
      ASSERT_TRUE(v.ok) << "p " << p << " m " << m << ": " << v.error;
      EXPECT_LE(*std::max_element(v.peak_live.begin(), v.peak_live.end()), budget);
      EXPECT_LE(step(found, *costs), best + 1e-9)
          << "p " << p << " m " << m << " budget " << budget;
    }
  }
}

TEST(Schedule, BubbleMatchesClosedForms) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const double fill = (p - 1.0) / (m + p - 1.0); // GPipe / 1F1B with T_F = T_B
      for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        const Simulation sim = simulate(make_schedule(kind, p, m, 1), Costs{1, 1, 0.5, 0.5, 0});
        ASSERT_NEAR(sim.mean_bubble, fill, 1e-12) << name(kind) << " p " << p << " m " << m;
      }
      // ZB-H1 with T_F = T_B = T_W: idle (p-1)(T_F + T_B - T_W) per rank, 1/3 of 1F1B's
      const Simulation zb =
          simulate(make_schedule(ScheduleKind::zb_h1, p, m, 1), Costs{1, 2, 1, 1, 0});
      const double zb_bound = (p - 1.0) / (3.0 * m + p - 1.0);
      // the bound needs m >= p (enough W passes to fill the drain); below that, never worse
      // than 1F1B with the same costs
      if (m >= p) {
        ASSERT_NEAR(zb.mean_bubble, zb_bound, 1e-12) << "zb-h1 p " << p << " m " << m;
      } else {
        ASSERT_LE(zb.mean_bubble, fill + 1e-12) << "zb-h1 p " << p << " m " << m;
      }
      for (int v = 2; v <= 4 && p >= 2 && m % p == 0; ++v) {
        // each chunk costs 1/v of a stage: the fill shrinks to 1/v (def A), i.e. (p-1)/(vm+p-1)
        const Simulation il = simulate(make_schedule(ScheduleKind::interleaved, p, m, v),
                                       Costs{1.0 / v, 1.0 / v, 0, 0, 0});
        ASSERT_NEAR(il.mean_bubble, (p - 1.0) / (v * m + p - 1.0), 1e-12)
            << "interleaved p " << p << " m " << m << " v " << v;
      }
    }
  }
}

TEST(Schedule, PeakActivationsFollowTheSchedules) {
  const int p = 4, m = 8;
  const Validation g = validate(make_schedule(ScheduleKind::gpipe, p, m, 1));
  const Validation o = validate(make_schedule(ScheduleKind::one_f_one_b, p, m, 1));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(g.peak_live[static_cast<std::size_t>(r)], m);     // GPipe holds all m
    EXPECT_EQ(o.peak_live[static_cast<std::size_t>(r)], p - r); // 1F1B: stage r holds p - r
  }
  const Validation i = validate(make_schedule(ScheduleKind::interleaved, p, m, 2));
  EXPECT_GT(i.peak_live[0], o.peak_live[0]); // interleaving costs memory on rank 0
}

TEST(Schedule, VShapedPlacementAndOrder) {
  // stage s on rank s (s < p), else on rank 2p-1-s: embedding and head share rank 0
  const Schedule s = make_schedule(ScheduleKind::zb_v, 4, 8, 2);
  for (int st = 0; st < 8; ++st) {
    EXPECT_EQ(s.rank_of(st), st < 4 ? st : 7 - st);
    EXPECT_EQ(s.stage_of(s.rank_of(st), s.chunk_of(st)), st);
  }
  EXPECT_THROW(make_schedule(ScheduleKind::zb_v, 4, 8, 1), std::invalid_argument);
  // the last rank hands micro-batches from chunk 0 to chunk 1 itself: no message between them
  for (const Action& a : s.ranks[3]) {
    if (a.op == Op::SEND_ACT) {
      EXPECT_NE(a.chunk, 0) << describe(a);
    }
    if (a.op == Op::RECV_ACT) {
      EXPECT_NE(a.chunk, 1) << describe(a);
    }
  }
  // the notes' worked example (p 4, m 8), rank 0's compute order: F of stage 0 for mb 0-6, then
  // F, BI, BW of stage 7 for mb 0-3, then F(0,7), BI(0,0), BW(0,0), F(7,4)
  std::vector<std::string> got;
  for (const Action& a : s.ranks[0]) {
    if (a.op == Op::F || a.op == Op::BI || a.op == Op::BW) {
      got.push_back(std::string(op_name(a.op)) + std::to_string(a.chunk == 0 ? 0 : 7) + "." +
                    std::to_string(a.mb));
    }
  }
  const std::vector<std::string> want = {
      "F0.0",  "F0.1", "F0.2",  "F0.3",  "F0.4", "F0.5",  "F0.6",  "F7.0",  "BI7.0",
      "BW7.0", "F7.1", "BI7.1", "BW7.1", "F7.2", "BI7.2", "BW7.2", "F7.3",  "BI7.3",
      "BW7.3", "F0.7", "BI0.0", "BW0.0", "F7.4", "BI7.4", "BW7.4", "BI0.1", "BW0.1"};
  ASSERT_GE(got.size(), want.size());
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + want.size()), want);
  // ZB-V keeps 1F1B's activation memory: at most 2p chunk-micro-batches (p of a whole stage)
  const Validation v = validate(s);
  for (int r = 0; r < 4; ++r) EXPECT_LE(v.peak_live[static_cast<std::size_t>(r)], 8);
}

TEST(Schedule, VShapedBubbles) {
  // with T_F = T_BI = T_BW, ZB-V is (nearly) bubble-free and below ZB-H1 on the same stage
  // work (a V chunk is half a ZB-H1 stage); DualPipeV below 1F1B
  for (int p = 2; p <= 8; ++p) {
    for (int m = 2 * p; m <= 32; m += p) {
      const double zbv =
          simulate(make_schedule(ScheduleKind::zb_v, p, m, 2), Costs{0.5, 1.0, 0.5, 0.5, 0})
              .mean_bubble;
      const double zbh1 =
          simulate(make_schedule(ScheduleKind::zb_h1, p, m, 1), Costs{1, 2, 1, 1, 0}).mean_bubble;
      const double dual =
          simulate(make_schedule(ScheduleKind::dualpipev, p, m, 2), Costs{0.5, 1.0, 0.5, 0.5, 0})
              .mean_bubble;
      const double ofob =
          simulate(make_schedule(ScheduleKind::one_f_one_b, p, m, 1), Costs{1, 2, 1, 1, 0})
              .mean_bubble;
      EXPECT_LT(zbv, zbh1) << "p " << p << " m " << m;
      EXPECT_LT(dual, ofob) << "p " << p << " m " << m;
    }
  }
}

Action* find(Schedule& s, int rank, Op op, int mb) {
  for (auto& a : s.ranks[static_cast<std::size_t>(rank)]) {
    if (a.op == op && a.mb == mb) return &a;
  }
  return nullptr;
}

TEST(Schedule, RejectsAMissingSend) {
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 4, 1);
  auto& r0 = s.ranks[0];
  r0.erase(std::find(r0.begin(), r0.end(), Action{Op::SEND_ACT, 2, 0, 1}));
  const Validation v = validate(s);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.error.find("deadlock"), std::string::npos) << v.error;
  EXPECT_NE(v.error.find("rank 1 action"), std::string::npos) << v.error;
  EXPECT_NE(v.error.find("RECV_ACT(mb 2, chunk 0) from rank 0"), std::string::npos) << v.error;
}

TEST(Schedule, RejectsAMissingReceive) {
  Schedule s = make_schedule(ScheduleKind::gpipe, 2, 2, 1);
  auto& r1 = s.ranks[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{Op::RECV_ACT, 1, 0, 0}));
  const Validation v = validate(s);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.error.find("rank 1 action 2 F(mb 1, chunk 0): its input activation has not arrived"),
            std::string::npos)
      << v.error;
}

TEST(Schedule, RejectsSwappedOrderThatCyclesWaits) {
  // rank 0 waits for mb 0's gradient before sending mb 0's activation: each rank waits on the other
  Schedule s = make_schedule(ScheduleKind::gpipe, 2, 1, 1);
  auto& r0 = s.ranks[0]; // F, SEND_ACT, RECV_GRAD, B
  std::swap(r0[1], r0[2]);
  const Validation v = validate(s);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.error.find("deadlock"), std::string::npos) << v.error;
  EXPECT_NE(v.error.find("rank 0 action 1 RECV_GRAD(mb 0, chunk 0) from rank 1 waits for rank 1"),
            std::string::npos)
      << v.error;
  EXPECT_NE(v.error.find("a cycle back to rank 0"), std::string::npos) << v.error;
}

TEST(Schedule, RejectsAWrongPeer) {
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, 4, 4, 1);
  find(s, 1, Op::SEND_ACT, 0)->peer = 3;
  const Validation v = validate(s);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(
      v.error.find("rank 1 action 2 SEND_ACT(mb 0, chunk 0) to rank 3: wrong peer: stage 2 is "
                   "on rank 2"),
      std::string::npos)
      << v.error;
}

TEST(Schedule, RejectsBackwardBeforeForwardAndMissingWeightGradient) {
  Schedule s = make_schedule(ScheduleKind::zb_h1, 2, 2, 1);
  auto& r1 = s.ranks[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{Op::BW, 1, 0, -1}));
  Validation v = validate(s);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.error.find("micro-batch 1 of stage 1 has BI but no BW"), std::string::npos)
      << v.error;
}

// Every schedule the generators make, for the channel tests.
std::vector<Schedule> all_schedules(int max_p, int max_m) {
  std::vector<Schedule> out;
  for (int p = 2; p <= max_p; ++p) {
    for (int m = 1; m <= max_m; ++m) {
      for (ScheduleKind kind :
           {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1})
        out.push_back(make_schedule(kind, p, m, 1));
      for (int vs = 2; vs <= 3 && m % p == 0; ++vs) {
        out.push_back(make_schedule(ScheduleKind::interleaved, p, m, vs));
      }
      out.push_back(make_schedule(ScheduleKind::zb_v, p, m, 2));
      if (m >= 2 * p) out.push_back(make_schedule(ScheduleKind::dualpipev, p, m, 2));
    }
  }
  return out;
}

// The receives of each rank are exactly the messages of the channels that end there, each once.
TEST(Schedule, ChannelsCarryEveryMessageOnce) {
  for (const Schedule& s : all_schedules(6, 12)) {
    const std::vector<Channel> ch = channels(s);
    for (std::size_t i = 1; i < ch.size(); ++i) {
      ASSERT_LT(std::make_tuple(ch[i - 1].grad, ch[i - 1].from, ch[i - 1].to),
                std::make_tuple(ch[i].grad, ch[i].from, ch[i].to))
          << s.name;
    }
    for (int r = 0; r < s.p; ++r) {
      std::multiset<std::tuple<bool, int, int, int>> recvs, msgs; // (grad, from, mb, chunk)
      for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
        if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD) {
          recvs.insert({a.op == Op::RECV_GRAD, a.peer, a.mb, a.chunk});
        }
      }
      for (const Channel& c : ch) {
        if (c.to != r) continue;
        for (const auto& msg : c.messages) msgs.insert({c.grad, c.from, msg.mb, msg.chunk});
      }
      ASSERT_EQ(recvs, msgs) << s.name << " p " << s.p << " m " << s.m << " v " << s.v << " rank "
                             << r;
      ASSERT_EQ(std::set(msgs.begin(), msgs.end()).size(), msgs.size()) << s.name;
    }
  }
}

// The execution model of a transport without tags: each channel delivers in its order, so the
// receive of a channel's k-th message completes once its sender has issued k + 1 sends there.
// Every schedule must run to its end under it, which holds only if the channel order is the
// senders' order.
TEST(Schedule, EveryScheduleRunsOverFifoChannels) {
  int runs = 0;
  for (const Schedule& s : all_schedules(6, 12)) {
    const std::vector<Channel> ch = channels(s);
    // (grad, from, to, mb, chunk) -> (channel, position)
    std::map<std::tuple<bool, int, int, int, int>, std::pair<std::size_t, std::size_t>> where;
    for (std::size_t c = 0; c < ch.size(); ++c) {
      for (std::size_t k = 0; k < ch[c].messages.size(); ++k) {
        where[{ch[c].grad, ch[c].from, ch[c].to, ch[c].messages[k].mb, ch[c].messages[k].chunk}] = {
            c, k};
      }
    }
    std::vector<std::size_t> sent(ch.size(), 0), next(static_cast<std::size_t>(s.p), 0);
    bool moved = true;
    while (moved) {
      moved = false;
      for (int r = 0; r < s.p; ++r) {
        const auto& list = s.ranks[static_cast<std::size_t>(r)];
        std::size_t& i = next[static_cast<std::size_t>(r)];
        while (i < list.size()) {
          const Action& a = list[i];
          if (a.op == Op::SEND_ACT || a.op == Op::SEND_GRAD) {
            const bool grad = a.op == Op::SEND_GRAD;
            const int dest = s.stage_of(r, a.chunk) + (grad ? -1 : 1);
            const auto [c, k] = where.at({grad, r, a.peer, a.mb, s.chunk_of(dest)});
            ASSERT_EQ(sent[c], k) << s.name << ": rank " << r << " sends out of channel order";
            ++sent[c];
          } else if (a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD) {
            const auto [c, k] = where.at({a.op == Op::RECV_GRAD, a.peer, r, a.mb, a.chunk});
            if (sent[c] <= k) break; // waits
          }
          ++i;
          moved = true;
        }
      }
    }
    for (int r = 0; r < s.p; ++r) {
      ASSERT_EQ(next[static_cast<std::size_t>(r)], s.ranks[static_cast<std::size_t>(r)].size())
          << s.name << " p " << s.p << " m " << s.m << " v " << s.v << ": rank " << r << " stuck";
    }
    ++runs;
  }
  std::printf("  %d schedules ran over FIFO channels\n", runs);
}

TEST(Schedule, InterleavedChannelsWrapAroundToTheFirstRank) {
  const std::vector<Channel> ch = channels(make_schedule(ScheduleKind::interleaved, 2, 2, 2));
  ASSERT_EQ(ch.size(), 4u); // activations 0->1 and 1->0, gradients 0->1 and 1->0
  const Channel& wrap = ch[1];
  EXPECT_FALSE(wrap.grad);
  EXPECT_EQ(wrap.from, 1);
  EXPECT_EQ(wrap.to, 0);
  // stage 1 (rank 1, chunk 0) feeds stage 2 (rank 0, chunk 1), for both micro-batches
  ASSERT_EQ(wrap.messages.size(), 2u);
  for (const auto& msg : wrap.messages) EXPECT_EQ(msg.chunk, 1);
  EXPECT_EQ(ch[0].messages.size(), 4u); // 0->1: stage 0 -> 1 and stage 2 -> 3, per micro-batch
}

TEST(Schedule, RejectsBrokenNewSchedules) {
  // zb-v with a weight half moved before its input half
  Schedule v = make_schedule(ScheduleKind::zb_v, 2, 4, 2);
  auto& r1 = v.ranks[1];
  const auto bw = std::find(r1.begin(), r1.end(), Action{Op::BW, 0, 1, -1});
  ASSERT_NE(bw, r1.end());
  const Action moved = *bw;
  r1.erase(bw);
  r1.insert(r1.begin(), moved);
  Validation bad = validate(v);
  ASSERT_FALSE(bad.ok);
  EXPECT_NE(bad.error.find("BW(mb 0, chunk 1): comes before its BI"), std::string::npos)
      << bad.error;
  // 2bw with the last rank's first optimizer step moved to the front of its list: it waits
  // there for rank 0, which waits for its gradients
  Schedule t = make_schedule(ScheduleKind::two_bw, 2, 4, 1);
  auto& last = t.ranks[1];
  last.erase(std::find(last.begin(), last.end(), Action{Op::STEP, 0, 0, -1}));
  last.insert(last.begin(), Action{Op::STEP, 0, 0, -1});
  bad = validate(t);
  ASSERT_FALSE(bad.ok);
  EXPECT_NE(bad.error.find("deadlock"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("waits for every rank at the optimizer step"), std::string::npos)
      << bad.error;
}

TEST(Schedule, GeneratorsRefuseUnsuitableShapes) {
  EXPECT_THROW(make_schedule(ScheduleKind::interleaved, 2, 3, 2), std::invalid_argument); // m % p
  EXPECT_THROW(make_schedule(ScheduleKind::interleaved, 1, 4, 2), std::invalid_argument); // p = 1
  EXPECT_THROW(make_schedule(ScheduleKind::one_f_one_b, 2, 4, 2), std::invalid_argument); // v > 1
  EXPECT_THROW(make_schedule(ScheduleKind::zb_v, 2, 4, 3), std::invalid_argument);        // v != 2
  try {
    make_schedule(ScheduleKind::dualpipev, 4, 7, 2);
    ADD_FAILURE() << "dualpipev accepted 7 micro-batches on 4 ranks";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dualpipev needs micro-batches >= 2 * pp (got 7"),
              std::string::npos)
        << e.what();
  }
}

// Every built-in schedule written as CSV and read back is the same schedule: the same actions,
// messages included, in the same order on every rank, and the same placement (p up to 8).
TEST(Schedule, CsvReadsBackEveryBuiltIn) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (auto [kind, v] : {std::pair{ScheduleKind::gpipe, 1},
                             {ScheduleKind::one_f_one_b, 1},
                             {ScheduleKind::zb_h1, 1},
                             {ScheduleKind::zb_h2, 1},
                             {ScheduleKind::v_half, 2},
                             {ScheduleKind::v_min, 2},
                             {ScheduleKind::interleaved, 2},
                             {ScheduleKind::interleaved, 3},
                             {ScheduleKind::zb_v, 2},
                             {ScheduleKind::dualpipev, 2}}) {
        if (kind == ScheduleKind::dualpipev && m < 2 * p) continue;
        const Schedule s = make_schedule(kind, p, m, v);
        const Schedule back = from_csv(to_csv(s), p, m, v);
        EXPECT_EQ(back.ranks, s.ranks) << name(kind) << " p " << p << " m " << m << " v " << v;
        EXPECT_EQ(back.vshape, s.vshape) << name(kind);
      }
    }
  }
  EXPECT_THROW(to_csv(make_schedule(ScheduleKind::two_bw, 2, 4, 1)), std::invalid_argument);
}

} // namespace
} // namespace pt::schedule

namespace pt::schedule {
namespace {

// The engine's receive pools: a buffer per message live between its RECV and its consumer (an
// activation's F; a gradient's B, or the BW of a split backward).
TEST(Schedule, ReceiveBuffersCountTheMessagesLiveAtOnce) {
  const std::vector<Action> two_ahead = {{Op::RECV_ACT, 0, 0, 0}, {Op::RECV_ACT, 1, 0, 0},
                                         {Op::F, 0, 0, -1},       {Op::RECV_ACT, 2, 0, 0},
                                         {Op::F, 1, 0, -1},       {Op::F, 2, 0, -1}};
  EXPECT_EQ(receive_buffers(two_ahead), (std::array<int, 2>{2, 0}));
  const std::vector<Action> split = {{Op::RECV_GRAD, 0, 0, 2}, {Op::BI, 0, 0, -1},
                                     {Op::RECV_GRAD, 1, 0, 2}, {Op::BI, 1, 0, -1},
                                     {Op::BW, 0, 0, -1},       {Op::BW, 1, 0, -1}};
  EXPECT_EQ(receive_buffers(split), (std::array<int, 2>{0, 2}));
  // 1F1B and GPipe receive each message right before its use: one buffer a direction on a
  // middle rank, however many micro-batches
  for (const ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    const Schedule s = make_schedule(kind, 4, 16, 1);
    EXPECT_EQ(receive_buffers(s.ranks[1]), (std::array<int, 2>{1, 1})) << s.name;
  }
}

} // namespace
} // namespace pt::schedule
