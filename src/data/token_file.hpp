// Token files in llm.c's layout (docs/design.md section 7): a header of 256 int32
// ([0] = 20240520 magic, [1] = version, [2] = token count, [3] = the vocabulary size the tokens
// come from, 0 where unknown), then the tokens: uint16 in version 1 (llm.c's), uint32 in
// version 2 (vocabularies above 65536).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pt {

inline constexpr std::int32_t kTokenMagic = 20240520;
inline constexpr std::int32_t kTokenVersion = 1;     // uint16 tokens
inline constexpr std::int32_t kTokenVersionWide = 2; // uint32 tokens
inline constexpr std::size_t kTokenHeaderInts = 256;

// A read-only memory map of a validated token file. Throws pt::Error(bad_input) naming the file
// and the problem (missing, short, wrong magic/version/size, a recorded vocabulary larger than
// vocab_size, token >= vocab_size, too few tokens).
class TokenFile {
public:
  TokenFile(const std::string& path, int vocab_size, int min_tokens);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::size_t size() const { return count_; }
  // token i (i < size())
  std::uint32_t at(std::size_t i) const {
    return wide_ ? static_cast<const std::uint32_t*>(tokens_)[i]
                 : static_cast<const std::uint16_t*>(tokens_)[i];
  }
  const std::string& path() const { return path_; }

private:
  void release();

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  bool wide_ = false; // version 2: uint32
  std::size_t count_ = 0;
};

// Writes a token file (used by tests and tools); throws pt::Error on I/O failure.
void write_token_file(const std::string& path, const std::uint16_t* tokens, std::size_t count);

} // namespace pt
