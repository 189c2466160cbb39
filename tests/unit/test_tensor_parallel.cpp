// Tensor-parallel sharding: memory per rank and the shard -> whole-tensor index map.
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/datasets.hpp"
#include "model/gpt_stage.hpp"
namespace pt {
namespace {

TEST(TensorParallel, EmbeddingAndHeadMemoryFallsByTp) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 64;
  m.seq_len = 32;
  m.vocab_size = 256;
  StageSpec whole;
  whole.layer_end = m.n_layer;
  std::size_t wte1 = 0, probs1 = 0, qkv1 = 0;
  for (int tp : {1, 2, 4}) {
    GptStage stage(m, whole, 2, TpGroup{tp - 1, tp, nullptr});
    const std::size_t wte = stage.layout().at("wte").size;
    const std::size_t probs = stage.make_activations().probs.size();
    const std::size_t qkv = stage.layout().at("h/000/attn/qkv/weight").size;
    if (tp == 1) {
      wte1 = wte;
      probs1 = probs;
      qkv1 = qkv;
    }
    EXPECT_EQ(wte * static_cast<std::size_t>(tp), wte1) << "tp " << tp;     // embedding/head rows
    EXPECT_EQ(probs * static_cast<std::size_t>(tp), probs1) << "tp " << tp; // logits never whole
    EXPECT_EQ(qkv * static_cast<std::size_t>(tp), qkv1) << "tp " << tp;
    EXPECT_EQ(stage.layout().at("lnf/weight").size, 64u); // replicated
  }
}

TEST(TensorParallel, ShardsMapToTheWholeTensor) {
  // qkv rows of tp rank 1 of 2: its halves of q, k and v (C = 4: rows 2-3, 6-7, 10-11)
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 2;
  m.d_model = 4;
  m.seq_len = 2;
  m.vocab_size = 8;
  const ParamLayout l(m, StageSpec{true, true, 0, 1}, 1, 2);
  const ParamTensor& qkv = l.at("h/000/attn/qkv/weight"); // local (6, 4) of (12, 4)
  EXPECT_EQ(l.global_index(qkv, 0), 2u * 4);
  EXPECT_EQ(l.global_index(qkv, 2 * 4), 6u * 4);
  EXPECT_EQ(l.global_index(qkv, 5 * 4 + 3), 11u * 4 + 3);
  const ParamTensor& proj = l.at("h/000/attn/proj/weight"); // local (4, 2) of (4, 4): columns 2-3
  EXPECT_EQ(l.global_index(proj, 0), 2u);
  EXPECT_EQ(l.global_index(proj, 3), 1u * 4 + 3);
  const ParamTensor& wte = l.at("wte"); // vocabulary rows 4-7
  EXPECT_EQ(l.global_index(wte, 0), 4u * 4);
}

// The checkpoint's checksum walks runs of consecutive global indices (run_from): each run must be
// consecutive, and the sums of a tensor's slices on tp ranks 0 and 1 must add up to its checksum
// at tp 1 (the element-by-element definition, docs/checkpoints.md).
TEST(TensorParallel, ChecksumRunsAreConsecutiveAndSumToTheWhole) {
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 2;
  m.d_model = 8;
  m.seq_len = 2;
  m.vocab_size = 12;
  const StageSpec whole{true, true, 0, 1};
  const ParamLayout one(m, whole);
  const ParamLayout shard[2] = {ParamLayout(m, whole, 0, 2), ParamLayout(m, whole, 1, 2)};
  for (const ParamTensor& t : one.tensors()) {
    std::vector<float> x(t.size);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i * 7 % 23) - 2;
    std::uint64_t want = 0;
    for (std::size_t g = 0; g < t.size; ++g) { // the definition, one element at a time
      std::uint32_t bits;
      std::memcpy(&bits, &x[g], sizeof bits);
      const std::uint64_t term = (bits + g * 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
      want += term ^ (term >> 29);
    }
    EXPECT_EQ(ckpt::slice_checksum(one, t, x.data(), 0, t.size), want) << t.name;
    std::uint64_t got = 0;
    for (const ParamLayout& l : shard) {
      const ParamTensor& s = l.at(t.name);
      if (s.shard_dim < 0 && &l != &shard[0]) continue; // replicated: tp rank 0's counts
      std::vector<float> local(s.size);
      for (std::size_t i = 0; i < s.size;) {
        const std::size_t run = l.run_from(s, i);
        ASSERT_GT(run, 0u);
        for (std::size_t j = 0; j < run; ++j) {
          ASSERT_EQ(l.global_index(s, i + j), l.global_index(s, i) + j) << t.name << " " << i;
          local[i + j] = x[l.global_index(s, i + j)];
        }
        i += run;
      }
      // a slice that starts and ends inside runs, plus the rest
      const std::size_t cut = s.size / 3 + 1;
      got += ckpt::slice_checksum(l, s, local.data(), 0, cut) +
             ckpt::slice_checksum(l, s, local.data() + cut, cut, s.size - cut);
    }
    EXPECT_EQ(got, want) << t.name;
  }
}

} // namespace
} // namespace pt
