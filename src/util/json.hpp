// A small JSON reader (RFC 8259) for the Hugging Face files pipetrain reads: a safetensors
// header and config.json (checkpoint/hf_import.cpp). Numbers are doubles (exact for integers up
// to 2^53: shapes and byte offsets).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pt {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string text;                                  // string
  std::vector<Json> items;                           // array
  std::vector<std::pair<std::string, Json>> members; // object, in the text's order
  // The member named key of an object, or null.
  const Json* find(const std::string& key) const;
};

// Parses one JSON value (surrounding whitespace allowed). Throws std::invalid_argument naming
// the byte offset and what was expected; nesting deeper than 64 levels is refused too.
Json parse_json(const std::string& text);

} // namespace pt
