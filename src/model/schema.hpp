// The parameter tensors of each architecture as one table: for every tensor its role, its
// checkpoint name, which stages hold it, its shape rule, whether it decays or is a norm, how
// tensor parallelism splits it, how it is initialised and its Hugging Face name. ParamLayout, the
// stage's tensor views, the initialiser, the checkpoint, the Hugging Face import and (through
// `pipetrain schema`) the Hugging Face export all read it. A new architecture is one table here
// and its few differing ops (docs/architecture.md, "Adding an architecture").
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace pt {

// What a tensor is to the kernels, whatever its name. Block roles come between wpe and lnf_w.
enum class Role {
  wte,    // (V, C) token embedding; the head's weight when tied
  wpe,    // (T, C) learned positions
  ln1_w,  // (C) the attention's norm
  ln1_b,  // (C)
  qkv_w,  // (q + 2 kv rows, C) packed query, key and value projections
  qkv_b,  // (q + 2 kv rows)
  proj_w, // (C, C) the attention's output projection
  proj_b, // (C)
  ln2_w,  // (C) the MLP's norm
  ln2_b,  // (C)
  fc_w,   // (F or 2F, C) the MLP's input projection (llama: gate rows, then up rows)
  fc_b,   // (F)
  fcp_w,  // (C, F) the MLP's output projection
  fcp_b,  // (C)
  // MoE layers (docs/moe.md): fc_w, fc_b, fcp_w, fcp_b then hold the routed experts, stacked:
  // (E, F or 2F, C), (E, F), (E, C, F), (E, C); F the expert width
  router_w,     // (E, C) the router's logits
  shared_fc_w,  // (S, F or 2F, C) the shared experts, stacked as the routed ones
  shared_fc_b,  // (S, F)
  shared_fcp_w, // (S, C, F)
  shared_fcp_b, // (S, C)
  lnf_w,        // (C) the final norm
  lnf_b,        // (C)
  lm_head,      // (V, C) the head's weight when untied
};
inline constexpr int kRoles = static_cast<int>(Role::lm_head) + 1;
const char* role_name(Role r);

// Which stages hold a tensor: the first (embedding: and the last when the head is tied to it),
// every block, the last (head: only when untied). Among the blocks, dense: the MLP of a block
// that is not an MoE layer; moe: an MoE layer's router and experts; shared: its shared experts.
enum class Scope { embedding, first, block, dense, moe, shared, last, head };
// Tensor parallelism: replicated, or split by rows (each part's rows, when made of parts) or
// by columns.
enum class TpSplit { replicated, rows, columns };
// zeros; ones; normal: N(0, 0.02); residual: N(0, 0.02 / sqrt(2 n_layer)), the products that
// write into the residual stream (GPT-2's scaled init).
enum class Init { zeros, ones, normal, residual };

using Dims = std::vector<int>;

struct TensorSpec {
  Role role;
  const char* name; // the checkpoint path's end; block tensors lie under "h/NNN/"
  Scope scope;
  bool decay; // AdamW's weight decay applies
  bool norm;  // a norm's weight or bias (sequence parallelism sums them)
  TpSplit split;
  Init init;
  Dims (*shape)(const ModelConfig&); // the whole tensor's shape
  Dims (*parts)(const ModelConfig&); // the global rows of its stacked parts; null: one part
  // Hugging Face's name, or with several, those of its parts (as `parts` gives their rows),
  // stacked by rows in this order; "{}" is the layer. A stack of experts (E, ...) names each
  // expert's ("{e}"), whose rows `parts` then gives; empty: no Hugging Face counterpart
  std::vector<const char*> hf;
  bool hf_transposed; // each part stored (columns, rows) there (GPT-2's Conv1D)
};

// The architecture's tensors, in the order a stage's flat buffer holds them (embedding and first
// scope, then each block's, then last and head).
const std::vector<TensorSpec>& schema(Arch arch);

// Whether a tensor of this scope lies in blocks, and whether layer l of model m holds it.
bool in_blocks(Scope s);
bool held_in_layer(Scope s, const ModelConfig& m, int l);

// Hugging Face's name of one part of a tensor of layer `layer` (-1 outside blocks) and, for the
// stacked experts ("{e}" in the pattern), of expert `expert`.
std::string hf_name(const char* pattern, int layer, int expert = -1);

// The table as JSON, for tools/hf_format.py: the architecture's tensors with the shapes and parts
// of model m resolved.
std::string schema_json(const ModelConfig& m);

} // namespace pt
