// The all-reduce cost model (comm/topology.hpp) against the textbook formulas and orderings,
// calibration files, auto's watch verdicts and gradient buckets.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/topology.hpp"
#include "engine/grad_sync.hpp"
#include "model/param_layout.hpp"
#include "util/errors.hpp"

namespace {

using pt::AllreduceAlgo;

pt::Topology one_level(double alpha, double bw, double gamma) {
  pt::Topology t = pt::topology_preset("flat");
  t.intra = t.inter = pt::LinkCost{alpha, 1.0 / bw, gamma, 1.0 / bw, {}, {}, {}, {}};
  return t;
}

// Thakur, Rabenseifner & Gropp (2005) / Patarasuk & Yuan (2009) for one rank per node.
TEST(Topology, FlatModelsAreTheTextbookFormulas) {
  const double a = 2e-6, bw = 10e9, g = 1e-10, n = 1 << 20;
  const pt::Topology t = one_level(a, bw, g);
  const double b = 1.0 / bw;
  for (int p : {2, 4, 8, 64}) {
    int lg = 0;
    while ((1 << lg) < p) ++lg;
    EXPECT_NEAR(pt::modelled_time(AllreduceAlgo::ring, n, p, 1, t),
                2.0 * (p - 1) * a + 2.0 * (p - 1) / p * n * b + (p - 1.0) / p * n * g, 1e-12);
    EXPECT_NEAR(pt::modelled_time(AllreduceAlgo::recursive_doubling, n, p, 1, t),
                lg * (a + n * b + n * g), 1e-12);
    EXPECT_NEAR(pt::modelled_time(AllreduceAlgo::rabenseifner, n, p, 1, t),
                2.0 * lg * a + 2.0 * (p - 1) / p * n * b + (p - 1.0) / p * n * g, 1e-12);
  }
  // non-powers of two pay the fold (n in, sum) and the unfold (n out)
  EXPECT_NEAR(pt::modelled_time(AllreduceAlgo::recursive_doubling, n, 6, 1, t),
              2 * (a + n * b + n * g) + 2 * (a + n * b) + n * g, 1e-12);
}

// The orderings the collectives issue asks for, on 4,096 nodes of a fat-tree and a Tianhe-2A
// machine, one and eight ranks per node.
TEST(Topology, SimulatorReproducesTextbookOrderings) {
  for (const char* name : {"fat-tree", "tianhe"}) {
    const pt::Topology t = pt::topology_preset(name);
    for (int g : {1, 8}) {
      const int p = 4096 * g;
      auto time = [&](AllreduceAlgo al, double bytes) {
        return pt::modelled_time(al, bytes, p, g, t);
      };
      SCOPED_TRACE(std::string(name) + ", ranks per node " + std::to_string(g));
      // small messages: recursive doubling beats ring and Rabenseifner
      EXPECT_LT(time(AllreduceAlgo::recursive_doubling, 8), time(AllreduceAlgo::rabenseifner, 8));
      EXPECT_LT(time(AllreduceAlgo::recursive_doubling, 8), time(AllreduceAlgo::ring, 8));
      // large messages: ring or Rabenseifner beat recursive doubling
      const double big = 256.0 * 1048576;
      EXPECT_LT(std::min(time(AllreduceAlgo::ring, big), time(AllreduceAlgo::rabenseifner, big)),
                time(AllreduceAlgo::recursive_doubling, big));
      // 1-32 MiB: hierarchical and 2D beat a flat ring
      for (double mib = 1; mib <= 32; mib *= 2) {
        EXPECT_LT(time(AllreduceAlgo::hierarchical, mib * 1048576),
                  time(AllreduceAlgo::ring, mib * 1048576));
        EXPECT_LT(time(AllreduceAlgo::torus2d, mib * 1048576),
                  time(AllreduceAlgo::ring, mib * 1048576));
      }
      // nothing beats the bandwidth bound
      for (AllreduceAlgo al : pt::modelled_algorithms()) {
        EXPECT_GE(time(al, big), pt::bandwidth_bound(big, p, g, t));
      }
    }
  }
}

TEST(Topology, AutoTakesTheLeastModelledTime) {
  const pt::Topology t = pt::topology_preset("fat-tree");
  for (int p : {2, 3, 16, 256}) {
    for (double bytes = 8; bytes < 3e8; bytes *= 8) {
      const AllreduceAlgo pick = pt::choose_algorithm(bytes, p, 4, t);
      for (AllreduceAlgo al : pt::modelled_algorithms()) {
        EXPECT_LE(pt::modelled_time(pick, bytes, p, 4, t), pt::modelled_time(al, bytes, p, 4, t))
            << pt::algorithm_name(pick) << " vs " << pt::algorithm_name(al) << " at " << bytes;
      }
    }
  }
}

TEST(Topology, MeasuredTableIsInterpolated) {
  pt::LinkCost l{1e-6, 1e-9, 0, 0, {8, 4096, 8192}, {1e-6, 2e-6, 10e-6}, {}, {}};
  EXPECT_DOUBLE_EQ(l.message(4), 1e-6);
  EXPECT_DOUBLE_EQ(l.message(4096), 2e-6);
  EXPECT_DOUBLE_EQ(l.message(6144), 6e-6);         // halfway: the protocol switch
  EXPECT_DOUBLE_EQ(l.message(8192 + 1000), 11e-6); // beyond: slope beta
}

TEST(Topology, CalibrationFileRoundTrips) {
  pt::Topology t = pt::topology_preset("tianhe");
  t.intra.table_bytes = {8, 1024};
  t.intra.table_s = {0.5e-6, 0.9e-6};
  t.intra.window_bytes = {8, 4096};
  t.intra.window_s = {0.7e-6, 2e-6};
  t.inter_measured = false;
  const std::string path = testing::TempDir() + "pt_calibration.toml";
  std::ofstream(path) << pt::calibration_toml(t, "test file\nsecond line");
  const pt::Topology r = pt::load_calibration(path);
  EXPECT_EQ(r.name, path);
  EXPECT_NEAR(r.inter.alpha, t.inter.alpha, 1e-12);
  EXPECT_NEAR(r.inter.beta / t.inter.beta, 1.0, 1e-5);
  EXPECT_NEAR(r.intra.gamma / t.intra.gamma, 1.0, 1e-5);
  ASSERT_EQ(r.intra.table_bytes.size(), 2u);
  EXPECT_NEAR(r.intra.table_s[1], 0.9e-6, 1e-12);
  ASSERT_EQ(r.intra.window_s.size(), 2u);
  EXPECT_FALSE(r.inter_measured);
  std::remove(path.c_str());
}

TEST(Topology, DamagedCalibrationFileIsAnInputError) {
  const std::string path = testing::TempDir() + "pt_bad_calibration.toml";
  auto expect_error = [&](const std::string& text, const std::string& fragment) {
    std::ofstream(path) << text;
    try {
      pt::load_calibration(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const pt::Error& e) {
      EXPECT_EQ(e.code(), pt::ExitCode::bad_input);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error("[intra\nalpha_us = 1", "cannot read");
  expect_error("[inter]\nalpha_us = 1\nbandwidth_GBps = 1\ngamma_ns_per_byte = 1\n",
               "no [intra] table");
  expect_error("[intra]\nalpha_us = -1\nbandwidth_GBps = 1\ngamma_ns_per_byte = 1\n",
               "must be a positive number");
  expect_error("[intra]\nalpha_us = 1\nbandwidth_GBps = 1\ngamma_ns_per_byte = 1\n"
               "exchange_bytes = [8, 4]\nexchange_us = [1, 2]\n[inter]\nalpha_us = 1\n"
               "bandwidth_GBps = 1\ngamma_ns_per_byte = 1\n",
               "must ascend");
  std::remove(path.c_str());
}

// Buckets cover every gradient float exactly once, blocks from the last layer down, no bucket
// larger than the cap unless one tensor range is, and the edge tensors last.
// Where the two-level algorithms have two levels; the model and the runtime share the rule.
TEST(Topology, TwoLevelRows) {
  using pt::two_level_row;
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 8, 4), 4);
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 8, 8), 8);
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 4, 8), 4); // one node of all 4 ranks
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 8, 3), 0); // unequal nodes
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 8, 1), 0);
  EXPECT_EQ(two_level_row(AllreduceAlgo::hierarchical, 8, 0), 0);
  EXPECT_EQ(two_level_row(AllreduceAlgo::torus2d, 16, 0), 4);
  EXPECT_EQ(two_level_row(AllreduceAlgo::torus2d, 5, 0), 0); // a prime: one row
  EXPECT_EQ(two_level_row(AllreduceAlgo::ring, 16, 4), 0);
  const pt::Topology t = pt::topology_preset("fat-tree");
  EXPECT_EQ(pt::modelled_time(AllreduceAlgo::hierarchical, 1e6, 8, 3, t),
            pt::modelled_time(AllreduceAlgo::rabenseifner, 1e6, 8, 3, t));
  EXPECT_EQ(pt::modelled_time(AllreduceAlgo::hierarchical, 1e6, 4, 8, t),
            pt::modelled_time(AllreduceAlgo::hierarchical, 1e6, 4, 4, t));
}

// auto's watch: a challenger more than 3% faster takes over; the pick's own time more than
// 1.5x away from its reference (either way) in as many windows in a row as needed (two, then
// doubling after each re-measurement) sends the size back to measurement.
// auto's measurement judges every candidate within 10x on two calls: one slow call (2x, or
// 3.3x as a 2 MiB window step on the 16-core host) does not drop the fastest algorithm, a
// hopeless one drops out after one, and after two rounds 1.5x is the limit.
TEST(AutoMeasurement, CloseCandidatesGetASecondCall) {
  std::vector<char> alive(5, 1);
  pt::measurement_drops(1, {56.8, 86.9, 600.0, 57.0, 187.4}, alive); // noisy calls: 2x, 3.3x
  EXPECT_EQ(alive, (std::vector<char>{1, 1, 0, 1, 1}));
  pt::measurement_drops(2, {56.8, 39.3, 1e30, 57.0, 40.1}, alive); // second calls show them
  EXPECT_EQ(alive, (std::vector<char>{1, 1, 0, 1, 1}));
  pt::measurement_drops(2, {56.8, 36.0, 1e30, 57.0, 40.1}, alive);
  EXPECT_EQ(alive, (std::vector<char>{0, 1, 0, 0, 1}));
}

// auto's pick after its measurement: the fastest that stayed in, unless the model's choice is
// within 3% of it or within twice their difference's standard error (16 B on the 2-core VM:
// MPI_Allreduce measured at 0.24 us and recursive doubling at 0.26 us, then timed the other way
// round by the benchmark's columns).
TEST(AutoMeasurement, ReMeasurementKeepsThePickOnTies) {
  using A = pt::AllreduceAlgo;
  const std::vector<A> cand = {A::mpi, A::ring, A::recursive_doubling, A::hierarchical};
  EXPECT_EQ(pt::measurement_default(cand, A::ring, std::nullopt), 1u);    // first: the model
  EXPECT_EQ(pt::measurement_default(cand, A::ring, A::hierarchical), 3u); // again: the pick
  EXPECT_EQ(pt::measurement_default(cand, A::ring, A::torus2d), 1u);      // not a candidate
  EXPECT_EQ(pt::measurement_default(cand, A::torus2d, std::nullopt), 4u); // none: out of range
  // stop 23's a3 at 128 KiB: the window step, the pick, ahead of ring by less than the noise
  const std::vector<double> t = {28.60e-6, 29.09e-6, 38.0e-6, 27.41e-6};
  const std::vector<double> err = {0.5e-6, 0.6e-6, 0.5e-6, 0.7e-6}; // the log has no errors
  const std::vector<char> all(4, 1);
  EXPECT_EQ(
      pt::measurement_pick(t, err, all, pt::measurement_default(cand, A::ring, std::nullopt), 7),
      1u); // the model's ring on a first measurement
  EXPECT_EQ(
      pt::measurement_pick(t, err, all, pt::measurement_default(cand, A::ring, A::hierarchical), 7),
      3u); // the window step kept
}

TEST(AutoMeasurement, ModelsChoiceKeepsTiesWithinTheNoise) {
  const std::vector<char> all(3, 1);
  const std::vector<double> t = {0.24e-6, 0.26e-6, 0.40e-6}; // mpi, recursive doubling, ring
  EXPECT_EQ(pt::measurement_pick(t, {0.01e-6, 0.01e-6, 0.0}, all, 1, 7), 1u);   // 2 SE = 0.028 us
  EXPECT_EQ(pt::measurement_pick(t, {0.004e-6, 0.004e-6, 0.0}, all, 1, 7), 0u); // 0.011 us
  EXPECT_EQ(pt::measurement_pick(t, {0.0, 0.0, 0.0}, all, 1, 7), 0u);           // 8% apart
  EXPECT_EQ(pt::measurement_pick({100.0, 102.0, 140.0}, {0.0, 0.0, 0.0}, all, 1, 7), 1u); // 3%
  EXPECT_EQ(pt::measurement_pick(t, {0.01e-6, 0.01e-6, 0.0}, all, 3, 7), 0u); // no model choice
  EXPECT_EQ(pt::measurement_pick(t, {0.01e-6, 0.01e-6, 0.0}, {1, 0, 1}, 1, 7), 0u); // it dropped
  EXPECT_EQ(pt::measurement_pick(t, {0.01e-6, 0.01e-6, 0.0}, {0, 1, 1}, 2, 7), 1u); // fastest in
  EXPECT_EQ(pt::measurement_pick(t, {0.1e-6, 0.1e-6, 0.1e-6}, all, 2, 7), 2u); // noisy: the model
  // 256 MiB with three calls a candidate (two kept): the window step 1.24x ahead of the model's
  // ring wins however large the errors of two calls look
  const std::vector<double> big = {116.3e-3, 47.5e-3, 38.4e-3}; // mpi, ring, hierarchical
  EXPECT_EQ(pt::measurement_pick(big, {1e-3, 0.1e-3, 8e-3}, all, 1, 2), 2u);
  EXPECT_EQ(pt::measurement_pick(big, {1e-3, 0.1e-3, 8e-3}, all, 1, 7), 1u); // kept: believed
}

// stop 23's e4 at 256 KiB: the measurement had the window step at 43 us, ring at 48; the
// window step's kept windows then ran at 25 us, and ring's challenges get a longer period
TEST(AutoWatch, PeriodFromThePicksTimeNow) {
  using A = pt::AllreduceAlgo;
  pt::TuneResult w;
  w.pick = A::hierarchical;
  w.seconds = {{A::ring, 48.26e-6}, {A::hierarchical, 43.27e-6}};
  const A ring = A::ring;
  EXPECT_EQ(pt::challenge_period(w, &ring), 16u); // from the measurement alone
  w.pick_ref = 25e-6;
  EXPECT_EQ(pt::challenge_period(w, &ring), pt::watch_period(25e-6, 48.26e-6));
  EXPECT_EQ(pt::challenge_period(w, &ring), 64u); // 5 x 23 us over 4 x 64 calls of 25 us: 1.8%
  EXPECT_EQ(pt::challenge_period(w, nullptr), pt::watch_period(25e-6, 0.0));
}

TEST(AutoWatch, VerdictFollowsTheTimes) {
  using V = pt::WatchVerdict;
  EXPECT_EQ(pt::watch_verdict(0.0, 100e-6, 1e30, 0, 2, 0.0),
            V::keep); // first window, no challenger
  EXPECT_EQ(pt::watch_verdict(0.0, 100e-6, 98e-6, 0, 2, 0.0), V::keep);
  EXPECT_EQ(pt::watch_verdict(0.0, 100e-6, 96e-6, 0, 2, 0.0), V::challenger);
  EXPECT_EQ(pt::watch_verdict(100e-6, 140e-6, 1e30, 0, 2, 0.0), V::keep);
  EXPECT_EQ(pt::watch_verdict(100e-6, 140e-6, 1e30, 1, 2, 0.0), V::keep);
  EXPECT_EQ(pt::watch_verdict(100e-6, 160e-6, 1e30, 0, 2, 0.0), V::drifted); // slower, once
  EXPECT_EQ(pt::watch_verdict(100e-6, 160e-6, 1e30, 1, 2, 0.0), V::remeasure);
  EXPECT_EQ(pt::watch_verdict(100e-6, 60e-6, 1e30, 0, 2, 0.0), V::drifted); // faster
  EXPECT_EQ(pt::watch_verdict(100e-6, 60e-6, 1e30, 1, 2, 0.0), V::remeasure);
  EXPECT_EQ(pt::watch_verdict(100e-6, 160e-6, 10e-6, 1, 2, 0.0), V::remeasure); // before a switch
  EXPECT_EQ(pt::watch_verdict(100e-6, 160e-6, 1e30, 1, 4, 0.0), V::drifted); // after re-measuring
  EXPECT_EQ(pt::watch_verdict(100e-6, 160e-6, 1e30, 3, 4, 0.0), V::remeasure);
  // a challenger 10% faster, by less than twice the difference's standard error: noise
  EXPECT_EQ(pt::watch_verdict(0.0, 100e-6, 90e-6, 0, 2, 6e-6), V::keep);
  EXPECT_EQ(pt::watch_verdict(0.0, 100e-6, 90e-6, 0, 2, 4e-6), V::challenger);
  // the pick slow in this window only (within 1.5x of the reference): a challenger must beat
  // the reference too; slow in the last kept window as well, the challenger wins
  EXPECT_EQ(pt::watch_verdict(25e-6, 36e-6, 33e-6, 0, 2, 0.0), V::keep);
  EXPECT_EQ(pt::watch_verdict(25e-6, 36e-6, 24e-6, 0, 2, 0.0), V::challenger);
  EXPECT_EQ(pt::watch_verdict(36e-6, 36e-6, 33e-6, 0, 2, 0.0), V::challenger);
  EXPECT_DOUBLE_EQ(pt::error_of_fastest({4.0, 1.0, 2.0, 3.0, 100.0}, 5),
                   std::sqrt(5.0 / 3.0 / 4.0)); // 1..4 kept: sd sqrt(5/3), over sqrt(4)
  EXPECT_EQ(pt::error_of_fastest({2.0}, 5), 0.0);
  EXPECT_EQ(pt::mean_of_fastest({}, 5), 1e30);
  EXPECT_DOUBLE_EQ(pt::mean_of_fastest({4.0, 1.0, 2.0, 3.0, 100.0}, 5), 2.5);
}

// The watch's period: 16 calls; longer for a challenger far behind (its try costs at most 2%)
// and for sub-microsecond picks (a window lasts at least 100 us, so the watch's own clock reads
// and its all-reduce per window stay near 1%); 256 at most.
TEST(AutoWatch, PeriodBoundsTheWatchsCost) {
  EXPECT_EQ(pt::watch_period(10e-6, 11e-6), 16u);
  EXPECT_EQ(pt::watch_period(10e-6, 0.0), 16u);       // no challenger
  EXPECT_EQ(pt::watch_period(10e-6, 30e-6), 128u);    // 20 us extra per try: 2% of 128 calls
  EXPECT_EQ(pt::watch_period(0.56e-6, 0.64e-6), 64u); // 8 bytes on the H100 host
  EXPECT_EQ(pt::watch_period(1.6e-6, 1.9e-6), 16u);
  EXPECT_EQ(pt::watch_period(0.1e-6, 0.1e-6), 256u);
  EXPECT_EQ(pt::watch_period(1e-3, 100.0), 256u);
}

// The watch's window of 4 x period calls: untimed calls of the pick, three timed ones before the
// end of each period (twelve in all), then the challenger's burst of five, the first untimed.
TEST(AutoWatch, ChallengerRunsInABurstAfterTheTimedPick) {
  using R = pt::WatchRole;
  for (std::size_t period : {16u, 64u, 256u}) {
    std::vector<R> roles;
    for (std::size_t call = 0; call < 4 * period; ++call) {
      roles.push_back(pt::watch_role(call, period));
    }
    const std::size_t w = roles.size();
    EXPECT_EQ(std::count(roles.begin(), roles.end(), R::timed_pick), 12);
    EXPECT_EQ(std::count(roles.begin(), roles.end(), R::timed_challenger), 4);
    EXPECT_EQ(std::count(roles.begin(), roles.end(), R::warm_challenger), 1);
    for (std::size_t i = w - 8; i < w - 5; ++i) EXPECT_EQ(roles[i], R::timed_pick) << i;
    EXPECT_EQ(roles[w - 5], R::warm_challenger);
    for (std::size_t i = w - 4; i < w; ++i) EXPECT_EQ(roles[i], R::timed_challenger) << i;
    EXPECT_EQ(roles[period - 4], R::timed_pick);
    EXPECT_EQ(roles[period - 1], R::pick);
  }
}

// sum()'s short way runs exactly the calls that watch_role makes untimed picks, never one more:
// each count ends at a call the watch times or at the window's end.
TEST(AutoWatch, QuietCallsAreTheUntimedPicksInARow) {
  using R = pt::WatchRole;
  for (std::size_t period : {16u, 32u, 64u, 256u}) {
    for (std::size_t call = 0; call < 4 * period; ++call) {
      std::size_t run = 0;
      while (call + run < 4 * period && pt::watch_role(call + run, period) == R::pick) ++run;
      EXPECT_EQ(pt::watch_quiet(call, period), run) << "period " << period << " call " << call;
    }
  }
}

// After a switch the old pick challenges at once: a dropped candidate that won one window on
// noise is out again one window later, and a switch confirmed by the recheck stays.
TEST(AutoWatch, SwitchIsRecheckedNextWindow) {
  using A = pt::AllreduceAlgo;
  using V = pt::WatchVerdict;
  pt::TuneResult w;
  w.pick = A::hierarchical;
  w.dropped = {A::mpi, A::ring};
  w.turn = 3; // a dropped candidate's window
  pt::AllreduceAlgo* slot = pt::watch_challenger(w);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(*slot, A::mpi);
  pt::settle_window(w, V::challenger, slot, 100e-6, 90e-6);
  EXPECT_EQ(w.pick, A::mpi);
  EXPECT_EQ(w.dropped, std::vector<A>{A::ring});
  EXPECT_EQ(w.others, std::vector<A>{A::hierarchical});
  slot = pt::watch_challenger(w); // turn 4 would be others[0] anyway: check the flag too
  EXPECT_EQ(w.recheck, 0);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(*slot, A::hierarchical);
  pt::settle_window(w, V::challenger, slot, 300e-6, 100e-6); // the recheck wins: back
  EXPECT_EQ(w.pick, A::hierarchical);
  EXPECT_EQ(w.recheck, -1);
  EXPECT_EQ(w.switches, 2);
  // a recheck whose verdict is keep leaves the new pick, and the rotation goes on
  pt::TuneResult u;
  u.pick = A::ring;
  u.others = {A::rabenseifner, A::mpi};
  u.turn = 1;
  slot = pt::watch_challenger(u);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(*slot, A::mpi);
  pt::settle_window(u, V::challenger, slot, 100e-6, 90e-6);
  EXPECT_EQ(u.pick, A::mpi);
  EXPECT_EQ(u.recheck, 1);
  u.turn = 4; // others[0] would be next in turn; the recheck comes first
  slot = pt::watch_challenger(u);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(*slot, A::ring);
  pt::settle_window(u, V::keep, slot, 90e-6, 95e-6);
  EXPECT_EQ(u.pick, A::mpi);
  EXPECT_EQ(u.recheck, -1);
  EXPECT_EQ(u.others, (std::vector<A>{A::rabenseifner, A::ring}));
  EXPECT_EQ(*pt::watch_challenger(u), A::ring); // the rotation goes on: others[5 % 2]
}

// The window's stores: segments whose times depend on the kind of stores (and on a machine
// state that changes) end up on the faster kind, and the slower kind runs about 2% of the
// segments or fewer.
// One rank alone: it agrees with its own times after every segment.
void learn_alone(pt::StoreChooser& ch, int kind, double seconds_per_float) {
  const bool ended = ch.learn(kind, seconds_per_float);
  ch.agree(ch.own(0), ch.own(1), ended, ch.segments_timed());
}

TEST(WindowStores, ChooserFollowsTheFasterKind) {
  pt::StoreChooser c;
  auto run = [&](int segments, double cached, double streaming) {
    int tries = 0;
    for (int i = 0; i < segments; ++i) {
      const int k = c.next();
      tries += k != c.kind() ? 1 : 0;
      learn_alone(c, k, k == 0 ? cached : streaming);
    }
    return tries;
  };
  run(64, 1.0, 1.6); // cores close together: cached stores faster
  EXPECT_EQ(c.kind(), 0);
  EXPECT_LE(run(2048, 1.0, 1.6), 2048 * 3 / 64); // tries every 64th segment or less often
  EXPECT_EQ(c.kind(), 0);
  run(512, 5.0, 1.0); // far apart: streaming stores faster; found at the first try
  EXPECT_EQ(c.kind(), 1);
  EXPECT_LE(run(4096, 5.0, 1.0), 4096 * 3 / 512);
  run(1024, 1.0, 1.6); // back: cached found at the next try, within 512 segments
  EXPECT_EQ(c.kind(), 0);
  // the first try comes right after the first segment; one stalled segment of it (median of
  // three) does not switch
  pt::StoreChooser d;
  for (int i = 0; i < 4; ++i) {
    const int k = d.next();
    EXPECT_EQ(k, i == 0 ? 0 : 1);
    learn_alone(d, k, k == 0 ? 1.0 : (i == 2 ? 0.1 : 2.0));
  }
  EXPECT_EQ(d.kind(), 0);
  // a new size class starts with the kind of the class timed last, but not with its times (the
  // kinds' ratio changes with the segment size): it tries the other kind right after its first
  // segment, and has timed both after four; a seed after timing changes nothing
  // the first four segments of a chooser with no times: one of the kind in use, then the try of
  // the other; afterwards both are timed
  auto time_both = [](pt::StoreChooser& ch, double cached, double streaming) {
    EXPECT_FALSE(ch.timed_both());
    const int kept = ch.kind();
    for (int i = 0; i < 4; ++i) {
      const int k = ch.next();
      EXPECT_EQ(k, i == 0 ? kept : 1 - kept) << "segment " << i;
      learn_alone(ch, k, k == 0 ? cached : streaming);
    }
    EXPECT_TRUE(ch.timed_both());
  };
  pt::StoreChooser g;
  g.seed(c); // c: cached in use, streaming timed too
  EXPECT_EQ(g.kind(), 0);
  time_both(g, 1.0, 0.5); // streaming faster at this size
  EXPECT_EQ(g.kind(), 1);
  pt::StoreChooser cached_only;
  learn_alone(cached_only, 0, 1.0);
  g.seed(cached_only);
  EXPECT_EQ(g.kind(), 1);
  // auto's re-measurement of a size forgets both times but keeps the kind: the next four
  // segments time both kinds again, and the state that changed decides
  g.forget();
  EXPECT_EQ(g.kind(), 1);
  time_both(g, 0.5, 1.0); // now cached stores are faster
  EXPECT_EQ(g.kind(), 0);
}

// auto's timed calls hold the tries: no segment of the other kind while held, a try that the
// held segments cut goes on after them with its three segments, and one that would have begun
// under the hold comes after it.
TEST(WindowStores, TimedCallsHoldTheTries) {
  pt::StoreChooser c;
  for (int i = 0; i < 64; ++i) learn_alone(c, c.next(), 1.0); // both timed, cached in use
  ASSERT_TRUE(c.timed_both());
  int held_other = 0, before = 0;
  for (; before < 1024 && c.next() == c.kind(); ++before) learn_alone(c, c.kind(), 1.0);
  ASSERT_NE(c.next(), c.kind()) << "no try within 1024 segments";
  learn_alone(c, c.next(), 1.6); // the try's first segment
  for (int i = 0; i < 5; ++i) {  // five held segments (a timed call of auto's)
    const int k = c.next(true);
    held_other += k != c.kind() ? 1 : 0;
    learn_alone(c, k, 1.0);
  }
  EXPECT_EQ(held_other, 0);
  EXPECT_NE(c.next(), c.kind()); // the cut try goes on: its second segment
  learn_alone(c, c.next(), 1.6);
  EXPECT_NE(c.next(), c.kind()); // and its third
  learn_alone(c, c.next(), 1.6);
  EXPECT_EQ(c.next(), c.kind()); // done, cached kept
  EXPECT_EQ(c.kind(), 0);
  // a try due under a hold is not run there
  pt::StoreChooser d;
  for (int i = 0; i < 64; ++i) learn_alone(d, d.next(), 1.0);
  while (d.next() == d.kind()) learn_alone(d, d.kind(), 1.0);
  EXPECT_EQ(d.next(true), d.kind());
}

// The segment length: long and short calls alternate, long first, until each has kCalls; held
// calls run the long length and are not counted; the pick is the faster median, short only by
// more than the margin, and stays.
TEST(WindowSegments, AlternateThenKeepTheFaster) {
  using pt::SegmentChooser;
  auto choose = [](double long_spf, double short_spf) {
    SegmentChooser c;
    int calls = 0;
    bool due = false;
    std::vector<std::size_t> seen;
    while (!due && calls < 100) {
      EXPECT_EQ(c.next(true), SegmentChooser::kLong); // a held call, not learned
      const std::size_t len = c.next();
      seen.push_back(len);
      // one slow outlier per length: the median ignores it
      const double slow = c.calls_timed() < 2 ? 5.0 : 1.0;
      due = c.learn(len, (len == SegmentChooser::kLong ? long_spf : short_spf) * slow);
      ++calls;
    }
    EXPECT_EQ(calls, 2 * SegmentChooser::kCalls);
    EXPECT_EQ(seen[0], SegmentChooser::kLong);
    EXPECT_EQ(seen[1], SegmentChooser::kShort);
    EXPECT_EQ(c.pick(), 0U); // not before the ranks agree
    const auto [l, s] = c.medians();
    EXPECT_DOUBLE_EQ(l, long_spf);
    EXPECT_DOUBLE_EQ(s, short_spf);
    c.agree(l, s);
    EXPECT_EQ(c.next(), c.pick());
    EXPECT_EQ(c.next(true), c.pick());
    EXPECT_FALSE(c.learn(c.pick(), 100.0)); // picked for good
    return c.pick();
  };
  EXPECT_EQ(choose(1.0, 0.8), SegmentChooser::kShort);
  EXPECT_EQ(choose(0.8, 1.0), SegmentChooser::kLong);
  EXPECT_EQ(choose(1.0, 0.98), SegmentChooser::kLong); // a near-tie keeps the long length
  // agreed over ranks: the slowest rank's medians decide
  SegmentChooser c;
  c.agree(1.0, 1.2);
  EXPECT_EQ(c.pick(), SegmentChooser::kLong);
}

// Two ranks of one window. A rank's step reads the other's part, so its time depends on both
// ranks' kinds: here (cores far apart) any cached stores make both ranks' steps 5x slower.
// Choosing alone, a pair that starts one on each kind tries the other kind on the same segments,
// so each try only swaps the mixture and looks as slow: it stays mixed. Agreeing the times at
// the end of each try (the slower rank's), the pair runs one kind on every segment and leaves
// the slow one at its first try, and the agreed choice follows a change back.
TEST(WindowStores, RanksChooseTogether) {
  auto cost = [](int rank, int k0, int k1, bool far) {
    const double scale = rank == 0 ? 1.0 : 1.3; // the ranks' own times differ
    if (!far) return scale * (k0 == 0 && k1 == 0 ? 1.0 : 1.6);
    return scale * (k0 == 1 && k1 == 1 ? 1.0 : 5.0);
  };
  // alone, from a mixture: both ranks' tries land on the same segments
  pt::StoreChooser a, b, streaming;
  for (int i = 0; i < 4; ++i) { // a class where streaming stores won
    const int k = streaming.next();
    learn_alone(streaming, k, k == 0 ? 2.0 : 1.0);
  }
  ASSERT_EQ(streaming.kind(), 1);
  b.seed(streaming); // b starts on streaming stores, a on cached ones
  int mixed = 0;
  for (int i = 0; i < 2048; ++i) {
    const int k0 = a.next(), k1 = b.next();
    mixed += k0 != k1 ? 1 : 0;
    learn_alone(a, k0, cost(0, k0, k1, true));
    learn_alone(b, k1, cost(1, k0, k1, true));
  }
  EXPECT_NE(a.kind(), b.kind()); // the trap that the agreement removes
  EXPECT_GT(mixed, 2000);
  // together: the same kind on every segment, streaming found at the first try
  pt::StoreChooser c, d;
  auto run = [&](int segments, bool far) {
    int tries = 0;
    for (int i = 0; i < segments; ++i) {
      const int k = c.next();
      EXPECT_EQ(d.next(), k) << "segment " << i;
      tries += k != c.kind() ? 1 : 0;
      const bool ended = c.learn(k, cost(0, k, k, far));
      EXPECT_EQ(d.learn(k, cost(1, k, k, far)), ended);
      const double cached = std::max(c.own(0), d.own(0));
      const double streamed = std::max(c.own(1), d.own(1));
      c.agree(cached, streamed, ended, c.segments_timed());
      d.agree(cached, streamed, ended, d.segments_timed());
    }
    return tries;
  };
  ASSERT_EQ(a.kind(), 0);
  c.seed(a); // both start on cached stores
  d.seed(a);
  run(8, true);
  EXPECT_EQ(c.kind(), 1);
  EXPECT_EQ(d.kind(), 1);
  EXPECT_LE(run(4096, true), 4096 * 3 / 512 + 3);
  EXPECT_DOUBLE_EQ(c.per_float(1), d.per_float(1)); // agreed: the slower rank's time
  EXPECT_DOUBLE_EQ(c.per_float(1), 1.3);
  run(1024, false); // the cores close again: cached stores found within 512 segments
  EXPECT_EQ(c.kind(), 0);
  EXPECT_EQ(d.kind(), 0);
  // apart again: the agreed time of the kind in use follows every segment, so its slowdown
  // shortens the period at once and the next try (within 16 segments) finds streaming
  run(24, true);
  EXPECT_EQ(c.kind(), 1);
  EXPECT_EQ(d.kind(), 1);
  // the times reach the ranks a segment late: times posted before a forget (auto measuring a
  // size again) must not count as timed afresh, or the measurement would time the try
  const std::uint64_t before = c.segments_timed();
  const double stale[2] = {c.own(0), c.own(1)};
  c.forget();
  c.agree(stale[0], stale[1], false, before);
  EXPECT_FALSE(c.timed_both());
  EXPECT_EQ(c.next(), c.kind()); // one segment of the kind in use, then the try
}

TEST(GradBuckets, ReverseLayerOrderCoveringEverything) {
  pt::ModelConfig m;
  m.n_layer = 6;
  m.n_head = 2;
  m.d_model = 32;
  m.seq_len = 16;
  m.vocab_size = 64;
  for (bool first : {true, false}) {
    const pt::ParamLayout layout(m, pt::StageSpec{first, true, 1, 5});
    for (std::size_t cap : {std::size_t{0}, std::size_t{5000}, std::size_t{30000}}) {
      const auto buckets = pt::make_buckets(layout, cap);
      std::vector<int> seen(layout.total(), 0);
      int last_layer = 1 << 30;
      bool edges = false;
      for (const pt::GradBucket& b : buckets) {
        if (cap > 0) {
          EXPECT_LE(b.count, cap);
        }
        for (std::size_t i = b.offset; i < b.offset + b.count; ++i) ++seen[i];
        if (b.ready_layer < 0) {
          edges = true;
        } else {
          EXPECT_FALSE(edges) << "a block bucket after the edge buckets";
          EXPECT_LE(b.ready_layer, last_layer);
          last_layer = b.ready_layer;
        }
      }
      for (const pt::ParamTensor& t : layout.tensors()) {
        for (std::size_t i = t.offset; i < t.offset + t.size; ++i) {
          ASSERT_EQ(seen[i], 1) << t.name << " element " << i - t.offset << " cap " << cap;
        }
      }
      EXPECT_EQ(last_layer, 1);
    }
  }
}

} // namespace
