// The planner's machine description: GEMM rates by shape (Machine::gemm_rate) and the machine
// file's compute-model keys.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "plan/planner.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

Machine with_table(std::vector<Machine::GemmRate> rows, double efficiency = 0.5) {
  Machine m;
  m.peak_flops = 1000e12;
  m.efficiency = efficiency;
  m.gemm = std::move(rows);
  return m;
}

TEST(Planner, WithoutATableEveryProductRunsAtEfficiencyTimesPeak) {
  Machine m;
  m.peak_flops = 100e12;
  m.efficiency = 0.4;
  EXPECT_DOUBLE_EQ(m.gemm_rate(64, 64, 64), 40e12);
  EXPECT_DOUBLE_EQ(m.gemm_rate(1 << 16, 8192, 8192), 40e12);
}

TEST(Planner, ATableRowIsItsOwnRateAndOutsideShapesTakeTheNearestEdge) {
  const Machine m = with_table({{1024, 1024, 1024, 200e12}, {8192, 8192, 8192, 800e12}});
  EXPECT_DOUBLE_EQ(m.gemm_rate(1024, 1024, 1024), 100e12); // efficiency 0.5 of the row
  EXPECT_DOUBLE_EQ(m.gemm_rate(8192, 8192, 8192), 400e12);
  // beyond the table in every dimension: clamped onto its largest row; below, onto its smallest
  EXPECT_DOUBLE_EQ(m.gemm_rate(65536, 32768, 16384), 400e12);
  EXPECT_DOUBLE_EQ(m.gemm_rate(16, 16, 16), 100e12);
  // between the rows: between their rates, nearer the nearer row (log2 distances)
  const double mid = m.gemm_rate(4096, 4096, 4096);
  EXPECT_GT(mid, 100e12);
  EXPECT_LT(mid, 400e12);
  EXPECT_GT(m.gemm_rate(6144, 6144, 6144), mid);
}

TEST(Planner, TheMemoryRooflineCapsThinProducts) {
  Machine m = with_table({{1024, 1024, 1024, 900e12}}, 1.0);
  m.memory_bw = 2e12;
  // k = 8: 2 m n k FLOPs over 2 (m k + k n + m n) bf16 bytes, about 8 FLOP a byte
  const double m_ = 8192, n = 8192, k = 8;
  const double roof = 2e12 * 2 * m_ * n * k / (2 * (m_ * k + k * n + m_ * n));
  EXPECT_DOUBLE_EQ(m.gemm_rate(m_, n, k), roof);
  EXPECT_DOUBLE_EQ(m.gemm_rate(1024, 1024, 1024), std::min(900e12, 2e12 * 1024 / 3));
}

std::string machine_file(const std::string& extra) {
  const std::string path = ::testing::TempDir() + "pt_planner_machine.toml";
  std::ofstream(path) << "[machine]\npeak_tflops = 312\nefficiency = 0.7\nmemory_gib = 80\n"
                         "ranks_per_node = 8\n"
                      << extra
                      << "\n[network]\nintra_node_gb_s = 240\nintra_node_latency_us = 5\n"
                         "inter_node_gb_s = 25\ninter_node_latency_us = 5\n";
  return path;
}

TEST(Planner, MachineFileReadsTheComputeModel) {
  const Machine m = read_machine(machine_file(
      "device = \"cuda\"\nattention = \"fused\"\nattention_efficiency = 0.4\n"
      "memory_gb_s = 2000\ngemm = [[1024, 2048, 4096, 200], [4096, 4096, 4096, 280]]"));
  EXPECT_TRUE(m.gpu);
  EXPECT_TRUE(m.fused_attention);
  EXPECT_DOUBLE_EQ(m.attention_efficiency, 0.4);
  EXPECT_DOUBLE_EQ(m.memory_bw, 2000e9);
  ASSERT_EQ(m.gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(m.gemm[0].n, 2048);
  EXPECT_DOUBLE_EQ(m.gemm[1].flops, 280e12);
  const Machine host = read_machine(machine_file(""));
  EXPECT_FALSE(host.gpu);
  EXPECT_FALSE(host.fused_attention); // the host keeps the probabilities
  EXPECT_DOUBLE_EQ(host.attention_efficiency, 1.0);
  EXPECT_TRUE(host.gemm.empty());
}

TEST(Planner, BadComputeModelKeysNameTheKey) {
  for (const char* bad : {"gemm = [[1024, 1024, 1024]]", "gemm = [[1024, 1024, -1, 100]]",
                          "gemm = [1024]", "attention_efficiency = 1.5", "memory_gb_s = 0",
                          "device = \"tpu\"", "attention = \"sometimes\""}) {
    try {
      read_machine(machine_file(bad));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what(),
                        key = std::string(bad).substr(0, std::string(bad).find(' '));
      EXPECT_EQ(e.code(), ExitCode::bad_input) << bad;
      EXPECT_NE(what.find("machine." + key), std::string::npos) << what;
    }
  }
}

} // namespace
} // namespace pt
