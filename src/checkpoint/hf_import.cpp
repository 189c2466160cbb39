// checkpoint.init_from: a Hugging Face directory (config.json, model.safetensors) as a run's
// starting weights (docs/models.md). Every rank reads the pieces of the tensors its stages hold,
// assembles each whole tensor in pipetrain's layout (GPT-2's Conv1D matrices transposed; llama's
// q, k, v and gate, up projections stacked) and copies in its tensor-parallel shard.
#include "checkpoint/hf_import.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "bf16.hpp"
#include "model/gpt_stage.hpp"
#include "util/errors.hpp"
#include "util/json.hpp"

namespace pt {
namespace {

// One tensor of a safetensors file: where its bytes are (after the header) and how to read them.
struct Entry {
  std::string dtype;
  std::vector<long long> shape;
  std::size_t begin = 0, end = 0;
};

struct Safetensors {
  std::string path;
  std::ifstream in;
  std::size_t data_start = 0;
  std::vector<std::pair<std::string, Entry>> entries;

  explicit Safetensors(const std::string& p) : path(p), in(p, std::ios::binary) {
    if (!in) throw input_error(path + ": cannot be read (checkpoint.init_from)");
    in.seekg(0, std::ios::end);
    const std::size_t size = static_cast<std::size_t>(in.tellg());
    unsigned char len[8] = {};
    in.seekg(0);
    in.read(reinterpret_cast<char*>(len), 8);
    std::uint64_t header_len = 0; // little-endian
    for (int k = 7; k >= 0; --k) header_len = header_len << 8 | len[k];
    if (!in || size < 8 || header_len > size - 8 || header_len > (1u << 30)) {
      bad("its header length does not fit the file");
    }
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    data_start = 8 + header_len;
    Json j;
    try {
      j = parse_json(header);
    } catch (const std::invalid_argument& e) {
      bad(std::string("its header is not JSON: ") + e.what());
    }
    for (const auto& [name, v] : j.members) {
      if (name == "__metadata__") continue;
      const Json *dt = v.find("dtype"), *sh = v.find("shape"), *off = v.find("data_offsets");
      if (!dt || !sh || !off || dt->kind != Json::Kind::string || sh->kind != Json::Kind::array ||
          off->items.size() != 2) {
        bad("tensor " + name + " is incomplete");
      }
      Entry e;
      e.dtype = dt->text;
      std::size_t count = 1;
      for (const Json& d : sh->items) { // beyond the file's size the count cannot fit it
        const std::size_t n = whole(d, name);
        e.shape.push_back(static_cast<long long>(n));
        count = n == 0 || count == 0 ? 0 : count > size / n ? size + 1 : count * n;
      }
      e.begin = whole(off->items[0], name);
      e.end = whole(off->items[1], name);
      const std::size_t width = e.dtype == "F32" ? 4 : 2;
      if ((e.dtype != "F32" && e.dtype != "BF16") || e.end < e.begin ||
          e.end - e.begin != count * width || data_start + e.end > size) {
        bad("tensor " + name + " (" + e.dtype + ") does not fit: pipetrain reads F32 and BF16");
      }
      entries.emplace_back(name, e);
    }
  }
  // a size or offset: a whole number in [0, 2^50]
  std::size_t whole(const Json& v, const std::string& tensor) const {
    if (v.kind != Json::Kind::number || !(v.number >= 0.0 && v.number <= 1125899906842624.0) ||
        v.number != static_cast<double>(static_cast<std::size_t>(v.number))) {
      bad("tensor " + tensor + " has a size or offset that is not a whole number");
    }
    return static_cast<std::size_t>(v.number);
  }
  [[noreturn]] void bad(const std::string& what) const {
    throw input_error(path + ": not a safetensors file pipetrain reads: " + what);
  }
  const Entry* find(const std::string& name) const {
    for (const auto& [n, e] : entries) {
      if (n == name) return &e;
    }
    return nullptr;
  }
  std::vector<float> read(const Entry& e) {
    const std::size_t n = (e.end - e.begin) / (e.dtype == "F32" ? 4 : 2);
    std::vector<float> out(n);
    in.seekg(static_cast<std::streamoff>(data_start + e.begin));
    if (e.dtype == "F32") {
      in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n * 4));
    } else {
      std::vector<std::uint16_t> half(n);
      in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(n * 2));
      bf16::unpack(out.data(), half.data(), n);
    }
    if (!in) bad("a tensor's bytes cannot be read");
    return out;
  }
};

// The Hugging Face pieces of one of pipetrain's tensors (model/schema.hpp), stacked by rows in
// order; transposed: each piece is stored (columns, rows) (GPT-2's Conv1D).
struct Recipe {
  std::vector<std::string> pieces;
  bool transposed = false;
};

// A stack of experts (a layer's tensor of three dimensions) takes each expert's pieces in turn.
Recipe recipe(const ModelConfig& m, Role role, int layer) {
  for (const TensorSpec& s : schema(m.arch)) {
    if (s.role != role || (layer >= 0 && !held_in_layer(s.scope, m, layer))) continue;
    Recipe r{{}, s.hf_transposed};
    const int experts = layer >= 0 && s.shape(m).size() == 3 ? s.shape(m)[0] : 0;
    for (int e = 0; e < std::max(experts, 1); ++e) {
      for (const char* p : s.hf) r.pieces.push_back(hf_name(p, layer, experts > 0 ? e : -1));
    }
    return r;
  }
  return {};
}

// The whole tensor t (global shape) from its recipe's pieces, or why it cannot be made.
std::vector<float> assemble(Safetensors& st, const ModelConfig& m, const ParamTensor& t,
                            const std::string& dir) {
  Recipe r = recipe(m, t.role, t.layer);
  if (t.role == Role::lm_head && st.find(r.pieces.at(0)) == nullptr) {
    r = recipe(m, Role::wte, -1); // a tied file: the head is the embedding
  }
  const long long cols = t.global_shape.size() > 1 ? t.global_shape.back() : 1;
  std::vector<float> whole;
  for (const std::string& piece : r.pieces) {
    const Entry* e = st.find(piece);
    if (e == nullptr) {
      throw input_error(dir + "/model.safetensors has no tensor " + piece + " (pipetrain's " +
                        t.name + "): is it a " + name(m.arch) + " model?");
    }
    std::vector<float> x = st.read(*e);
    const long long rows = static_cast<long long>(x.size()) / cols;
    const std::vector<long long> want = t.global_shape.size() == 1 ? std::vector<long long>{rows}
                                        : r.transposed ? std::vector<long long>{cols, rows}
                                                       : std::vector<long long>{rows, cols};
    // the rows are counted from the data, so this checks the columns and the dimensions; the
    // row counts are checked by the total below
    if (e->shape != want) {
      std::ostringstream os;
      os << dir << "/model.safetensors: " << piece << " has " << e->shape.size()
         << " dimensions of sizes";
      for (long long d : e->shape) os << " " << d;
      os << ", which does not fit the deck's " << t.name
         << ": check model.d_model, n_head, n_kv_head, ffn_hidden, vocab_size and seq_len";
      throw input_error(os.str());
    }
    // GPT-2's position table may be longer than the deck's seq_len: its first rows are taken
    if (t.role == Role::wpe && rows > t.global_shape[0]) {
      x.resize(static_cast<std::size_t>(t.global_shape[0] * cols));
    }
    if (r.transposed) { // (cols, rows) stored: pipetrain's (rows, cols)
      std::vector<float> y(x.size());
      for (long long i = 0; i < rows; ++i) {
        for (long long j = 0; j < cols; ++j) y[i * cols + j] = x[j * rows + i];
      }
      x.swap(y);
    }
    whole.insert(whole.end(), x.begin(), x.end());
  }
  std::size_t size = 1;
  for (int d : t.global_shape) size *= static_cast<std::size_t>(d);
  if (whole.size() != size) {
    throw input_error(dir + "/model.safetensors: the pieces of " + t.name +
                      " do not add up to its shape: check the deck's model keys");
  }
  return whole;
}

void check_config(const std::string& dir, const ModelConfig& m) {
  std::ifstream in(dir + "/config.json");
  if (!in) throw input_error(dir + "/config.json: cannot be read (checkpoint.init_from)");
  std::stringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = parse_json(text.str());
  } catch (const std::invalid_argument& e) {
    throw input_error(dir + "/config.json: " + e.what());
  }
  const Json* type = j.find("model_type");
  const std::string want = m.moe_experts > 0 ? "mixtral" : name(m.arch);
  if (type == nullptr || type->text != want) {
    throw input_error(
        dir + "/config.json: model_type \"" + (type ? type->text : "") +
        "\", the deck's model is " + want +
        (m.moe_experts > 0 ? " (model.arch = \"llama\" with moe.experts > 0)" : " (model.arch)") +
        ": set the deck's model to match");
  }
  if (m.moe_experts == 0) return;
  // Mixtral's router and experts: the deck must route as the file's model does
  const std::pair<const char*, std::pair<const char*, int>> keys[] = {
      {"num_local_experts", {"moe.experts", m.moe_experts}},
      {"num_experts_per_tok", {"moe.top_k", m.moe_top_k}}};
  for (const auto& [hf, deck] : keys) {
    const Json* v = j.find(hf);
    if (v == nullptr || v->kind != Json::Kind::number || v->number != deck.second) {
      throw input_error(dir + "/config.json: " + hf + " = " +
                        (v != nullptr && v->kind == Json::Kind::number
                             ? std::to_string(static_cast<long long>(v->number))
                             : std::string("(none)")) +
                        ", the deck's " + deck.first + " = " + std::to_string(deck.second) +
                        ": set " + deck.first + " to the file's");
    }
  }
}

// The MoE models a Hugging Face directory can hold: Mixtral's (llama blocks, every block routed,
// no shared experts).
void check_moe(const ModelConfig& m) {
  if (m.moe_experts == 0) return;
  if (m.arch != Arch::llama || m.moe_every != 1 || m.moe_shared_experts != 0) {
    throw input_error("checkpoint.init_from reads Mixtral's format (MixtralForCausalLM): "
                      "model.arch = \"llama\", moe.every = 1, moe.shared_experts = 0; the deck's "
                      "mixture of experts is another (docs/moe.md)");
  }
}

} // namespace

std::size_t init_from_hf(const std::string& dir, const ModelConfig& m,
                         const std::vector<GptStage*>& stages) {
  check_moe(m);
  check_config(dir, m);
  Safetensors st(dir + "/model.safetensors");
  std::size_t tensors = 0;
  for (GptStage* stage : stages) {
    const ParamLayout& lay = stage->layout();
    std::vector<float> shard;
    for (const ParamTensor& t : lay.tensors()) {
      const std::vector<float> whole = assemble(st, m, t, dir);
      shard.resize(t.size);
      for (std::size_t i = 0; i < t.size; ++i) shard[i] = whole[lay.global_index(t, i)];
      from_host(stage->backend(), stage->params() + t.offset, shard.data(), t.size);
      ++tensors;
    }
  }
  return tensors;
}

} // namespace pt
