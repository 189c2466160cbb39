// Partition of layers into virtual stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "model/partition.hpp"

namespace pt {
namespace {

ParallelConfig with(PartitionKind mode) {
  ParallelConfig p;
  p.partition = mode;
  return p;
}

TEST(Partition, UniformGivesTheRemainderToMiddleStages) {
  const BlockCosts unit;
  EXPECT_EQ(partition_layers(with(PartitionKind::uniform), 8, 4, unit),
            (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(partition_layers(with(PartitionKind::uniform), 10, 4, unit),
            (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(partition_layers(with(PartitionKind::uniform), 7, 3, unit),
            (std::vector<int>{2, 3, 2}));
}

TEST(Partition, BalancedCountsEmbeddingAndHead) {
  // an embedding as heavy as 3 layers pushes layers off the first stage
  const BlockCosts c{3.0, 1.0, 1.0};
  const std::vector<int> n = partition_layers(with(PartitionKind::params), 12, 4, c);
  EXPECT_EQ(std::accumulate(n.begin(), n.end(), 0), 12);
  const std::vector<double> cost = stage_costs(n, c);
  EXPECT_EQ(n, (std::vector<int>{1, 4, 4, 3})) << n[0] << n[1] << n[2] << n[3];
  EXPECT_DOUBLE_EQ(*std::max_element(cost.begin(), cost.end()), 4.0);
  // every stage keeps at least one layer even when the edges dominate
  const std::vector<int> m =
      partition_layers(with(PartitionKind::time), 4, 4, BlockCosts{100.0, 1.0, 100.0});
  EXPECT_EQ(m, (std::vector<int>{1, 1, 1, 1}));
}

TEST(Partition, ParameterCostsAndStageSpecs) {
  ModelConfig mc;
  mc.n_layer = 4;
  mc.d_model = 64;
  mc.seq_len = 32;
  mc.vocab_size = 256;
  const BlockCosts c = parameter_costs(mc);
  EXPECT_DOUBLE_EQ(c.layer, 12.0 * 64 * 64 + 13 * 64);
  EXPECT_DOUBLE_EQ(c.embedding, 256.0 * 64 + 32 * 64);
  const std::vector<int> counts{1, 2, 1};
  const StageSpec mid = stage_spec(counts, 1);
  EXPECT_FALSE(mid.first);
  EXPECT_FALSE(mid.last);
  EXPECT_EQ(mid.layer_begin, 1);
  EXPECT_EQ(mid.layer_end, 3);
  EXPECT_TRUE(stage_spec(counts, 2).last);
  ParallelConfig ex = with(PartitionKind::explicit_layers);
  ex.partition_layers = {3, 1};
  EXPECT_EQ(partition_layers(ex, 4, 2, c), (std::vector<int>{3, 1}));
}

} // namespace
} // namespace pt
