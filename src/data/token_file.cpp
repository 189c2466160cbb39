#include "data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/errors.hpp"

namespace pt {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw input_error("data file '" + path + "': " + what);
}

} // namespace

TokenFile::TokenFile(const std::string& path, int vocab_size, int min_tokens) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    bad(path, std::string(std::strerror(errno)) +
                  "\n---> HINT: create it with tools/prepare-data (tools/quickstart does this "
                  "for the demo corpus), or set data.path");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    bad(path, std::string("fstat: ") + std::strerror(errno));
  }
  const std::size_t bytes = static_cast<std::size_t>(st.st_size);
  const std::size_t header_bytes = kTokenHeaderInts * sizeof(std::int32_t);
  if (bytes < header_bytes) {
    ::close(fd);
    bad(path, "is " + std::to_string(bytes) +
                  " bytes, shorter than the 1024-byte header: not a "
                  "token file, or truncated");
  }
  map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad(path, std::string("mmap: ") + std::strerror(errno));
  }
  map_bytes_ = bytes;
  // copy the header out: the messages below outlive the mapping
  const auto* header = static_cast<const std::int32_t*>(map_);
  const std::int32_t magic = header[0], version = header[1], count = header[2], vocab = header[3];
  if (magic != kTokenMagic) {
    release();
    bad(path, "bad magic number " + std::to_string(magic) + " (expected " +
                  std::to_string(kTokenMagic) + "): not a pipetrain/llm.c token file");
  }
  if (version != kTokenVersion && version != kTokenVersionWide) {
    release();
    bad(path, "unsupported version " + std::to_string(version) +
                  " (expected 1: uint16 tokens, or 2: uint32)");
  }
  wide_ = version == kTokenVersionWide;
  if (vocab > vocab_size) {
    release();
    bad(path, "its tokens come from a vocabulary of " + std::to_string(vocab) +
                  " but model.vocab_size = " + std::to_string(vocab_size) +
                  ": set model.vocab_size to at least " + std::to_string(vocab));
  }
  if (count < 0) {
    release();
    bad(path, "negative token count in the header: the file is damaged");
  }
  count_ = static_cast<std::size_t>(count);
  const std::size_t want = header_bytes + count_ * (wide_ ? 4 : 2);
  if (bytes != want) {
    release();
    bad(path, "header says " + std::to_string(count_) + " tokens (" + std::to_string(want) +
                  " bytes) but the file has " + std::to_string(bytes) +
                  " bytes: truncated or damaged; regenerate it");
  }
  if (count_ < static_cast<std::size_t>(min_tokens)) {
    release();
    bad(path, "holds " + std::to_string(count_) + " tokens, fewer than the " +
                  std::to_string(min_tokens) + " one sequence needs (model.seq_len + 1)");
  }
  tokens_ = static_cast<const char*>(map_) + header_bytes;
  std::uint32_t max_token = 0;
  for (std::size_t i = 0; i < count_; ++i) max_token = std::max(max_token, at(i));
  if (max_token >= static_cast<std::uint32_t>(vocab_size)) {
    release();
    bad(path, "contains token " + std::to_string(max_token) + " but model.vocab_size = " +
                  std::to_string(vocab_size) + ": raise vocab_size or use matching data");
  }
}

TokenFile::~TokenFile() {
  release();
}

void TokenFile::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
}

void write_token_file(const std::string& path, const std::uint16_t* tokens, std::size_t count) {
  std::vector<std::int32_t> header(kTokenHeaderInts, 0);
  header[0] = kTokenMagic;
  header[1] = kTokenVersion;
  header[2] = static_cast<std::int32_t>(count);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    throw Error(ExitCode::other, "cannot write '" + path + "': " + std::strerror(errno));
  }
  const bool ok =
      std::fwrite(header.data(), sizeof(std::int32_t), header.size(), f) == header.size() &&
      std::fwrite(tokens, sizeof(std::uint16_t), count, f) == count;
  if (std::fclose(f) != 0 || !ok) {
    throw Error(ExitCode::other, "short write to '" + path + "'");
  }
}

} // namespace pt
