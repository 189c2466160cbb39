// libFuzzer target: checkpoint.init_from's reading of a Hugging Face directory
// (checkpoint/hf_import.cpp, docs/models.md): the safetensors header (JSON), every tensor's
// dtype, shape and offsets, and the assembly of pipetrain's tensors from them.
//
// Input: the bytes of model.safetensors, beside a config.json of model_type "gpt2", loaded into
// one stage of a 1-layer GPT-2 (d_model 8, 2 heads, seq_len 4, vocabulary 16; host memory, no
// kernels). A rejected file must raise pt::Error(bad_input); an accepted one must have filled
// every tensor of the stage, with no byte read outside the file's tensors (ASan).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <sys/stat.h>

#include "checkpoint/hf_import.hpp"
#include "fuzz_common.hpp"
#include "host_memory.hpp"
#include "model/gpt_stage.hpp"
#include "util/errors.hpp"

namespace {

struct Target {
  pt::ModelConfig model;
  std::unique_ptr<pt::GptStage> stage;
  std::string dir;
  Target() {
    model.n_layer = 1;
    model.n_head = 2;
    model.d_model = 8;
    model.seq_len = 4;
    model.vocab_size = 16;
    stage = std::make_unique<pt::GptStage>(model, pt::StageSpec{true, true, 0, 1}, 1, pt::TpGroup{},
                                           fuzz::kHostMemory);
    dir = fuzz::temp_path("hf", "");
    ::mkdir(dir.c_str(), 0700);
    const char config[] = "{\"model_type\": \"gpt2\"}";
    fuzz::write_input(dir + "/config.json", reinterpret_cast<const std::uint8_t*>(config),
                      sizeof config - 1);
  }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Target t;
  fuzz::write_input(t.dir + "/model.safetensors", data, size);
  try {
    const std::size_t n = pt::init_from_hf(t.dir, t.model, {t.stage.get()});
    if (fuzz::verbose()) std::fprintf(stderr, "accepted: %zu tensors\n", n);
    if (n != t.stage->layout().tensors().size()) {
      fuzz::finding("accepted with tensors left unread", std::to_string(n));
    }
  } catch (const pt::Error& e) {
    fuzz::rejected(e);
  }
  return 0;
}
