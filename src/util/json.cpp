#include "util/json.hpp"

#include <cstdlib>
#include <stdexcept>

namespace pt {

const Json* Json::find(const std::string& key) const {
  for (const Member& m : members) {
    if (m.name == key) return &m.value;
  }
  return nullptr;
}

namespace {

constexpr int kMaxDepth = 64;

struct Parser {
  const std::string& s;
  std::size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("JSON: at byte " + std::to_string(i) + ": " + what);
  }
  void space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    space();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const std::string t(w);
    if (s.compare(i, t.size(), t) != 0) return false;
    i += t.size();
    return true;
  }

  // \uXXXX as UTF-8 (a surrogate pair's halves each as they come: names here are ASCII)
  void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      const char c = s[i++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      const char e = s[i++];
      const std::string simple = "\"\\/bfnrt", meaning = "\"\\/\b\f\n\r\t";
      if (const auto k = simple.find(e); k != std::string::npos) {
        out += meaning[k];
      } else if (e == 'u' && i + 4 <= s.size()) {
        char* end = nullptr;
        const std::string hex = s.substr(i, 4);
        const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
        if (end != hex.c_str() + 4) fail("a bad \\u escape");
        utf8(out, static_cast<unsigned>(cp));
        i += 4;
      } else {
        fail("a bad escape");
      }
    }
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    space();
    if (i >= s.size()) fail("expected a value");
    Json v;
    const char c = s[i];
    if (c == '{') {
      v.kind = Json::Kind::object;
      ++i;
      if (eat('}')) return v;
      do {
        space();
        std::string key = string();
        expect(':');
        v.members.push_back({std::move(key), value(depth + 1)});
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Kind::array;
      ++i;
      if (eat(']')) return v;
      do {
        v.items.push_back(value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.text = string();
    } else if (word("true")) {
      v.kind = Json::Kind::boolean;
      v.boolean = true;
    } else if (word("false")) {
      v.kind = Json::Kind::boolean;
    } else if (word("null")) {
      v.kind = Json::Kind::null;
    } else {
      const char* begin = s.c_str() + i;
      char* end = nullptr;
      v.number = std::strtod(begin, &end);
      if (end == begin) fail("expected a value");
      v.kind = Json::Kind::number;
      i += static_cast<std::size_t>(end - begin);
    }
    return v;
  }
};

} // namespace

Json parse_json(const std::string& text) {
  Parser p{text};
  Json v = p.value(0);
  p.space();
  if (p.i != text.size()) p.fail("text after the value");
  return v;
}

} // namespace pt
