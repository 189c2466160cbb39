// A small JSON reader (RFC 8259) for the Hugging Face files pipetrain reads: a safetensors
// header and config.json (checkpoint/hf_import.cpp). Numbers are doubles (exact for integers up
// to 2^53: shapes and byte offsets).
#pragma once

#include <string>
#include <vector>

namespace pt {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string text; // string
  struct Member;
  std::vector<Json> items;     // array
  std::vector<Member> members; // object, in the text's order
  // The member named key of an object, or null.
  const Json* find(const std::string& key) const;
};

struct Json::Member {
  std::string name;
  Json value;
};

// Parses one JSON value (surrounding whitespace allowed). Throws std::invalid_argument naming
// the byte offset and what was expected; nesting deeper than 64 levels is refused too.
Json parse_json(const std::string& text);

} // namespace pt
