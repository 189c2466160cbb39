// Token files and the deterministic sampler.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "data/sampler.hpp"
#include "data/token_file.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

class TokenData : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("pt_test_data_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "tokens.bin").string();
    for (int i = 0; i < 5000; ++i) tokens_.push_back(static_cast<std::uint16_t>((i * 7) % 250));
    write_token_file(path_, tokens_.data(), tokens_.size());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string path_;
  std::vector<std::uint16_t> tokens_;
};

TEST_F(TokenData, RoundTrip) {
  const TokenFile f(path_, 256, 17);
  ASSERT_EQ(f.size(), tokens_.size());
  for (std::size_t i = 0; i < tokens_.size(); ++i) ASSERT_EQ(f.at(i), tokens_[i]);
}

TEST_F(TokenData, VocabularyTooSmallIsRejected) {
  try {
    const TokenFile f(path_, 200, 17);
    FAIL() << "a token >= vocab_size was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("contains token 249"), std::string::npos) << e.what();
  }
}

TEST_F(TokenData, SamplerIsDeterministicAndSplitsAcrossRanks) {
  const TokenFile f(path_, 256, 17);
  const int T = 16;
  const Sampler s(f, T, 99);
  std::vector<std::int32_t> in8(8 * T), tg8(8 * T), in_a(4 * T), tg_a(4 * T), in_b(4 * T),
      tg_b(4 * T);
  s.fill(3, 0, 8, in8.data(), tg8.data());
  // the same global batch split over two data-parallel ranks
  s.fill(3, 0, 4, in_a.data(), tg_a.data());
  s.fill(3, 4, 4, in_b.data(), tg_b.data());
  for (int i = 0; i < 4 * T; ++i) {
    ASSERT_EQ(in8[static_cast<std::size_t>(i)], in_a[static_cast<std::size_t>(i)]);
    ASSERT_EQ(in8[static_cast<std::size_t>(4 * T + i)], in_b[static_cast<std::size_t>(i)]);
  }
  // targets are the inputs shifted by one token, from the file
  for (int r = 0; r < 8; ++r) {
    for (int t = 0; t + 1 < T; ++t) {
      ASSERT_EQ(tg8[static_cast<std::size_t>(r * T + t)],
                in8[static_cast<std::size_t>(r * T + t + 1)]);
    }
  }
  // another step, or another seed, draws other sequences
  std::vector<std::int32_t> other(8 * T), tgo(8 * T);
  s.fill(4, 0, 8, other.data(), tgo.data());
  EXPECT_NE(other, in8);
  const Sampler s2(f, T, 100);
  s2.fill(3, 0, 8, other.data(), tgo.data());
  EXPECT_NE(other, in8);
}

} // namespace
} // namespace pt
