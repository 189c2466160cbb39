// What the fuzz targets share: the verdict switch, how a finding ends the run, the verdict on
// a refused input, and the temporary file an input is written to (docs/fuzzing.md).
#pragma once

#include <errno.h> // program_invocation_short_name
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "util/errors.hpp"

namespace fuzz {

// PT_FUZZ_VERBOSE=1: each input's verdict on stderr (to see what a reproducer does)
inline bool verbose() {
  static const bool on = std::getenv("PT_FUZZ_VERBOSE") != nullptr;
  return on;
}

// A problem of pipetrain's: said on stderr, then libFuzzer keeps the input as a reproducer.
[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n%s\n", program_invocation_short_name, what, detail.c_str());
  std::abort();
}

// An input pipetrain refused: the refusal must be a bad-input error (exit 2).
inline void rejected(const pt::Error& e) {
  if (verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
  if (e.code() != pt::ExitCode::bad_input) finding("pt::Error with a code other than 2", e.what());
}

// $TMPDIR (or /tmp)/pt-fuzz-<stem>-<pid><ext>: one file per process, rewritten for each input.
inline std::string temp_path(const char* stem, const char* ext) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pt-fuzz-" + stem + "-" +
         std::to_string(::getpid()) + ext;
}

// The input as the file at `path`.
inline void write_input(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    finding("cannot write the temporary file", path);
  }
}

} // namespace fuzz
