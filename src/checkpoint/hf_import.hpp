// checkpoint.init_from (docs/models.md): a run's starting weights from a Hugging Face directory.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace pt {

class GptStage;

// Reads DIR/config.json (its model_type must be the deck's model.arch) and DIR/model.safetensors
// (F32 or BF16 tensors in transformers' GPT2LMHeadModel or LlamaForCausalLM names) into the
// parameters of this rank's stages, each tensor's shape checked against the deck. Returns the
// tensors loaded. Throws pt::Error(bad_input) naming the file and what does not fit. Not
// collective: the caller agrees on the outcome.
std::size_t init_from_hf(const std::string& dir, const ModelConfig& model,
                         const std::vector<GptStage*>& stages);

} // namespace pt
