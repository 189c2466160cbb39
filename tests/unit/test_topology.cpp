// The all-reduce cost model (comm/topology.hpp) against the textbook formulas and orderings,
// calibration files, auto's pick rule and gradient buckets.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/grad_sync.hpp"
#include "comm/layout.hpp"
#include "comm/topology.hpp"
#include "model/param_layout.hpp"
#include "util/errors.hpp"

namespace {

using pt::AllreduceAlgo;

pt::Topology one_level(double alpha, double bw, double gamma) {
  pt::Topology t = pt::topology_preset("flat");
  t.intra = t.inter = pt::LinkCost{alpha, 1.0 / bw, gamma, 1.0 / bw};
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

TEST(Topology, CalibrationFileRoundTrips) {
  pt::Topology t = pt::topology_preset("tianhe");
  t.inter_measured = false;
  const std::string path = testing::TempDir() + "pt_calibration.toml";
  std::ofstream(path) << pt::calibration_toml(t, "test file\nsecond line");
  const pt::Topology r = pt::load_calibration(path);
  EXPECT_EQ(r.name, path);
  EXPECT_NEAR(r.inter.alpha, t.inter.alpha, 1e-12);
  EXPECT_NEAR(r.inter.beta / t.inter.beta, 1.0, 1e-5);
  EXPECT_NEAR(r.intra.gamma / t.intra.gamma, 1.0, 1e-5);
  EXPECT_NEAR(r.intra.copy / t.intra.copy, 1.0, 1e-5);
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
  expect_error("[intra]\nalpha_us = 1\nbandwidth_GBps = 1\n[inter]\nalpha_us = 1\n"
               "bandwidth_GBps = 1\ngamma_ns_per_byte = 1\n",
               "\"gamma_ns_per_byte\" is missing");
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

// auto's pick from its one measurement: the fastest, unless the model's choice is within 5%.
TEST(AutoPick, FastestUnlessTheModelIsWithinFivePercent) {
  using A = AllreduceAlgo;
  const std::vector<std::pair<A, double>> t = {
      {A::mpi, 10.0}, {A::ring, 12.0}, {A::recursive_doubling, 10.4}, {A::hierarchical, 30.0}};
  EXPECT_EQ(pt::auto_pick(t, A::ring), A::mpi);                              // 20% behind
  EXPECT_EQ(pt::auto_pick(t, A::recursive_doubling), A::recursive_doubling); // 4% behind
  EXPECT_EQ(pt::auto_pick(t, A::torus2d), A::mpi);                           // not a candidate
  EXPECT_EQ(pt::auto_pick({}, A::torus2d), A::torus2d);                      // nothing measured
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

// A dp group's placement comes from its ranks' nodes, whatever the other dimensions do.
TEST(Topology, GroupNodesFromWhereTheRanksAre) {
  using V = std::vector<int>;
  EXPECT_EQ(pt::group_nodes(V{0, 0}), std::make_pair(1, 2));       // pp 2 x dp 2, pp across hosts
  EXPECT_EQ(pt::group_nodes(V{0, 1}), std::make_pair(2, 1));       // dp across hosts
  EXPECT_EQ(pt::group_nodes(V{3, 3, 5, 5}), std::make_pair(2, 2)); // blocks of two
  EXPECT_EQ(pt::group_nodes(V{0, 0, 1}), std::make_pair(2, 1));    // unequal blocks
  EXPECT_EQ(pt::group_nodes(V{0, 1, 0, 1}), std::make_pair(2, 1)); // interleaved
  EXPECT_EQ(pt::group_nodes(V{7}), std::make_pair(1, 1));
}
