// What one pipeline stage keeps for a micro-batch between its forward and backward, and what
// its backward-input half leaves for the weight half, with the buffers of each listed once: the
// stage allocates them from these lists (GptStage::make_activations, make_stash) and the memory
// model (plan/memory.cpp) counts the same lists without allocating, so the two cannot drift.
// Letters as in gpt_stage.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "config/run_config.hpp"
#include "model/param_layout.hpp"
#include "util/buffer.hpp"

namespace pt {

// Activations a block keeps from forward to backward for one micro-batch. In the bf16 format
// (StageShapes::packed) the tensors that hold bf16 values (ln1, qkv, atty, ln2, fch, fch_gelu,
// and out but in the stage's last block) are kept packed, two bf16 values a float, and widened
// into the stage's working copy while their block runs (GptStage::view).
struct BlockActivations {
  FloatBuffer ln1, ln1_mean, ln1_rstd; // (R,C), (R), (R); llama's RMSNorm: no mean
  FloatBuffer qkv;                     // (N,QKV)
  FloatBuffer att;                     // (B,NH,T,T) probabilities, local heads; GPU: less
  FloatBuffer atty;                    // (N,Ct) attention output before proj
  FloatBuffer res2;                    // (R,C) x + attention branch
  FloatBuffer ln2, ln2_mean, ln2_rstd; // (R,C), (R), (R)
  FloatBuffer fch, fch_gelu;           // (N,FI), (N,F): GELU's (llama: SwiGLU's) input, output
  FloatBuffer out;                     // (R,C) block output = res2 + MLP branch
  // MoE layers (docs/moe.md): fch and fch_gelu hold the rows this rank's experts computed,
  // (XR,FIE) and (XR,FE); the router's probabilities and log-sum-exps; the outputs of this rank's
  // tokens' experts before the weights
  FloatBuffer router, router_lse; // (N,E), (N)
  FloatBuffer moe_y;              // (MR,C)
  // expert parallelism: the input rows this rank's experts received, and how many rows of each
  // of its experts came from each rank of the group (ep x E/ep, source-major)
  FloatBuffer moe_xe; // (XR,C)
  std::vector<int> moe_counts;
};

// One block's activations as its forward and backward read and write them: fp32 buffers, each the
// micro-batch's own or the stage's working copy's. att is null where it is not kept (selective
// recompute).
struct BlockView {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
      *fch_gelu, *out, *router, *router_lse, *moe_y, *moe_xe;
  std::vector<int>* moe_counts;
  // The kept packed copies of the four product inputs (ln1, atty, ln2, fch_gelu) where the
  // products read them packed (GptStage::packed_products_), else null; fch16: fch's, which
  // gpt2's GELU then writes packed as it reads fch (else null).
  std::uint16_t *ln1_16, *atty16, *ln2_16, *fch_gelu16, *fch16;
};

// One micro-batch in flight through a stage.
struct StageActivations {
  Buffer<std::int32_t> tokens;  // (B,T) first stage
  Buffer<std::int32_t> targets; // (B,T) last stage
  FloatBuffer input;            // (R,C) stage input: embedding output, or received activation
  std::vector<BlockActivations> blocks;
  FloatBuffer lnf, lnf_mean, lnf_rstd; // last stage: (R,C), (R), (R)
  FloatBuffer probs;                   // (N,V) softmax, then d logits after backward-input
  FloatBuffer losses;                  // (N)
  float dlogits_scale = 0.0f;          // not 0: probs already hold d logits at this loss scale
};

// Gradients a block's backward-input leaves for its backward-weight.
struct BlockStash {
  const float* dout = nullptr; // (R,C) gradient of the block output (owned elsewhere)
  FloatBuffer d_fch;           // (N,FI) gradient before GELU (llama: SwiGLU)
  FloatBuffer d_ln2;           // (R,C)
  FloatBuffer d_res2;          // (R,C)
  FloatBuffer d_qkv;           // (N,QKV)
  FloatBuffer d_ln1;           // (R,C)
  FloatBuffer dx;              // (R,C) gradient of the block input
  FloatBuffer g_dout, g_res2;  // (N,C) sequence parallel: dout and d_res2 gathered over tp
  // MoE layers: the gradients of this rank's experts' outputs and first products, of the router
  // logits
  FloatBuffer moe_dy, moe_dfch; // (XR,C), (XR,FIE)
  FloatBuffer moe_dlogits;      // (N,E)
};

// What a whole stage's backward-input leaves for its backward-weight (split backward).
struct StageStash {
  std::vector<BlockStash> blocks;
  FloatBuffer d_lnf;    // (R,C) last stage: gradient of the final norm's output
  FloatBuffer d_output; // (R,C) last stage: gradient of the last block's output (from the head)
  FloatBuffer d_input;  // (R,C) gradient of the stage input
};

// A stage's shapes (this tp rank's), in elements; QKV: the qkv projection's width (3Ct; llama:
// the query heads' and the key and value heads' HD each); F: the MLP's hidden width and FI its
// first product's (gpt2: F; llama: 2F, gate and up); stats: the floats a norm keeps per row
// besides rstd (LayerNorm's mean; RMSNorm none); att: the floats one block keeps of attention
// (the backend's attention_floats: the probabilities on the host, less with flash attention).
// packed: the bf16 activation format, whose bf16 tensors are kept two to a float; att16: att
// holds the attention probabilities (B*NH*T*T, the host's attention; not a GPU's flash
// statistics), which it then keeps in bf16 too. qkv_in_att: att also keeps a copy of qkv (the
// backend's attention_keeps_qkv), so a block that keeps att does not keep qkv.
struct StageShapes {
  std::size_t B, T, C, Ct, NH, QKV, F, FI, V, N, R, stats, att;
  bool sp, packed, att16, qkv_in_att;
  // MoE layers: E routed experts, FE an expert's width and FIE its first product's, MR the most
  // gathered rows (N * (top_k + shared experts)); model: which layers they are (is_moe_layer).
  // ep: the expert-parallel degree; XR the most rows a rank's experts compute: MR, or with
  // ep > 1 every slot of the group's ep micro-batches routed here (dropless) and its own tokens'
  // shared-expert rows (with_ep)
  std::size_t E, FE, FIE, MR, ep = 1, XR;
  ModelConfig model;
  StageShapes(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel,
              std::size_t attention_floats, ActFormat format = ActFormat::fp32,
              bool attention_keeps_qkv = false)
      : B(static_cast<std::size_t>(micro_batch)), T(static_cast<std::size_t>(m.seq_len)),
        C(static_cast<std::size_t>(m.d_model)), Ct(C / static_cast<std::size_t>(tp)),
        NH(static_cast<std::size_t>(m.n_head / tp)),
        QKV(static_cast<std::size_t>(qkv_rows(m) / tp)),
        F(static_cast<std::size_t>(mlp_width(m) / tp)), FI(m.arch == Arch::llama ? 2 * F : F),
        V(static_cast<std::size_t>(m.vocab_size / tp)), N(B * T),
        R(sequence_parallel && tp > 1 ? N / static_cast<std::size_t>(tp) : N),
        stats(m.arch == Arch::llama ? 0 : R), att(attention_floats),
        sp(sequence_parallel && tp > 1), packed(format == ActFormat::bf16),
        att16(packed && att == B * NH * T * T), qkv_in_att(attention_keeps_qkv),
        E(static_cast<std::size_t>(m.moe_experts)),
        FE(static_cast<std::size_t>(m.moe_experts > 0 ? expert_width(m) : 0)),
        FIE(m.arch == Arch::llama ? 2 * FE : FE),
        MR(m.moe_experts > 0 ? N * static_cast<std::size_t>(m.moe_top_k + m.moe_shared_experts)
                             : 0),
        XR(MR), model(m) {}
  StageShapes& with_ep(int degree) {
    ep = static_cast<std::size_t>(degree);
    const std::size_t k = static_cast<std::size_t>(model.moe_top_k),
                      S = static_cast<std::size_t>(model.moe_shared_experts);
    XR = E > 0 ? N * (ep * k + S) : 0;
    return *this;
  }
  // whether layer l is an MoE layer; whether the stage's layers [begin, end) have one
  bool moe(int l) const { return is_moe_layer(model, l); }
  bool any_moe(int begin, int end) const {
    for (int l = begin; l < end; ++l) {
      if (moe(l)) return true;
    }
    return false;
  }
  // floats that hold n values kept in the format: n, or n bf16 values two to a float
  std::size_t kept(std::size_t n) const { return packed ? (n + 1) / 2 : n; }
};

// A stage's shapes with the attention buffer backend `be` fills (Backend::attention_floats) and
// whether it keeps qkv (at bf16): GptStage's, and the memory model's for the backend a run opens.
inline StageShapes backend_shapes(const ModelConfig& m, int micro_batch, int tp,
                                  bool sequence_parallel, ActFormat format, const Backend& be) {
  const int Ct = m.d_model / tp, NH = m.n_head / tp;
  const bool keeps_qkv = format == ActFormat::bf16 && be.attention_keeps_qkv != nullptr &&
                         be.attention_keeps_qkv(micro_batch, m.seq_len, Ct, NH);
  return StageShapes(m, micro_batch, tp, sequence_parallel,
                     be.attention_floats(micro_batch, m.seq_len, Ct, NH), format, keeps_qkv);
}

// What a block is: a dense MLP's, an MoE layer's, or either (the working copy of a stage with
// both: each buffer the larger).
enum class BlockKind { dense, moe, either };

// f(buffer, floats) for every buffer of one block's activations; last: the stage's last block,
// whose output (the stage's, which the pipeline sends) stays unpacked.
template <class Fn>
void block_activation_buffers(BlockActivations& k, const StageShapes& s, Recompute rc, bool last,
                              BlockKind kind, Fn&& f) {
  const std::size_t out = last ? s.R * s.C : s.kept(s.R * s.C);
  if (rc == Recompute::full) { // the block's output only: the next block's input
    f(k.out, out);
    return;
  }
  f(k.ln1, s.kept(s.R * s.C));
  f(k.ln1_mean, s.stats);
  f(k.ln1_rstd, s.R);
  if (rc == Recompute::selective || !s.qkv_in_att) f(k.qkv, s.kept(s.N * s.QKV));
  if (rc != Recompute::selective) { // selective: recomputed in the backward
    f(k.att, s.att16 ? s.kept(s.att) : s.att);
  }
  f(k.atty, s.kept(s.N * s.Ct));
  f(k.res2, s.R * s.C); // x + attention branch: an fp32 sum
  f(k.ln2, s.kept(s.R * s.C));
  f(k.ln2_mean, s.stats);
  f(k.ln2_rstd, s.R);
  const bool dense = kind != BlockKind::moe, moe = kind != BlockKind::dense;
  f(k.fch, std::max(dense ? s.kept(s.N * s.FI) : 0, moe ? s.XR * s.FIE : 0));
  f(k.fch_gelu, std::max(dense ? s.kept(s.N * s.F) : 0, moe ? s.XR * s.FE : 0));
  f(k.out, out);
  if (moe) {
    f(k.router, s.N * s.E);
    f(k.router_lse, s.N);
    f(k.moe_y, s.MR * s.C);
    if (s.ep > 1) f(k.moe_xe, s.XR * s.C);
  }
}

// f(buffer, elements) for every buffer of one micro-batch's activations of a stage.
template <class Fn>
void stage_activation_buffers(StageActivations& a, const StageShapes& s, const StageSpec& spec,
                              Recompute rc, Fn&& f) {
  f(a.tokens, s.N);
  f(a.targets, s.N);
  f(a.input, s.R * s.C);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    a.blocks.emplace_back();
    block_activation_buffers(a.blocks.back(), s, rc, l + 1 == spec.layer_end,
                             s.moe(l) ? BlockKind::moe : BlockKind::dense, f);
  }
  if (spec.last) {
    f(a.lnf, s.R * s.C);
    f(a.lnf_mean, s.stats);
    f(a.lnf_rstd, s.R);
    f(a.probs, s.N * s.V);
    f(a.losses, s.N);
  }
}

// f(buffer, elements) for every buffer of a stash of `blocks` blocks (the split backward's whole
// stage, or backward()'s one reused block).
template <class Fn>
void stage_stash_buffers(StageStash& st, const StageShapes& s, const StageSpec& spec,
                         std::size_t blocks, Fn&& f) {
  const bool any_moe = s.any_moe(spec.layer_begin, spec.layer_end);
  for (std::size_t l = 0; l < blocks; ++l) {
    st.blocks.emplace_back();
    BlockStash& b = st.blocks.back();
    // one stash per block: an MoE layer's; one reused by every block: a stage's with one
    const int layer = spec.layer_begin + static_cast<int>(l);
    if (blocks == 1 ? any_moe : s.moe(layer)) {
      f(b.moe_dy, s.XR * s.C);
      f(b.moe_dfch, s.XR * s.FIE);
      f(b.moe_dlogits, s.N * s.E);
    }
    f(b.d_fch, s.N * s.FI);
    f(b.d_ln2, s.R * s.C);
    f(b.d_res2, s.R * s.C);
    f(b.d_qkv, s.N * s.QKV);
    f(b.d_ln1, s.R * s.C);
    f(b.dx, s.R * s.C);
    if (s.sp) {
      f(b.g_dout, s.N * s.C);
      f(b.g_res2, s.N * s.C);
    }
  }
  if (spec.last) {
    f(st.d_lnf, s.R * s.C);
    f(st.d_output, s.R * s.C);
  }
  f(st.d_input, s.R * s.C);
}

// A stage's scratch, shared by all its micro-batches (GptStage's; single-threaded use).
struct StageWorkspace {
  FloatBuffer d_fch_gelu;                // (N,F) the gradient of the MLP activation's output
  FloatBuffer d_atty;                    // (N,Ct) the gradient of the attention output
  FloatBuffer att_scratch;               // attention_backward's (Backend::attention_scratch)
  FloatBuffer qkv_full, d_qkv_full;      // (N,3Ct) grouped-query attention's whole heads
  FloatBuffer att_work;                  // selective: the attention buffer of the block at hand
  BlockActivations work;                 // full, bf16: every activation of the block at hand, fp32
  FloatBuffer x_work;                    // (R,C) bf16: a block's input, widened
  FloatBuffer gath, part;                // (N,C) sequence parallel: gathered rows, partial sums
  FloatBuffer ce_max, ce_sum, ce_target; // (N) last stage, tp > 1: the vocabulary-parallel loss
  // MoE layers: this rank's tokens' rows gathered by expert; the gradient of the rows this
  // rank's experts computed, and of their activation's output; of the routed weights.
  // Expert parallelism: the experts' outputs before they go back, the gradients of this rank's
  // tokens' rows of outputs (sent) and of inputs (received)
  FloatBuffer moe_x;            // (MR,C)
  FloatBuffer moe_dx;           // (XR,C)
  FloatBuffer moe_dh;           // (XR,FE)
  FloatBuffer moe_dweight;      // (N,top_k)
  FloatBuffer moe_ye;           // (XR,C)
  FloatBuffer moe_dys, moe_dxs; // (MR,C)
};

// f(buffer, elements) for every buffer of a stage's workspace. att_scratch: the floats of
// attention_backward's scratch (the backend's at run time; the memory model's for the planned
// threads).
template <class Fn>
void stage_workspace_buffers(StageWorkspace& w, const StageShapes& s, const StageSpec& spec,
                             Recompute rc, std::size_t att_scratch, Fn&& f) {
  f(w.d_fch_gelu, s.N * s.F);
  f(w.d_atty, s.N * s.Ct);
  f(w.att_scratch, att_scratch);
  if (s.QKV != 3 * s.Ct) { // grouped-query heads: k and v expanded to every query head
    f(w.qkv_full, s.N * 3 * s.Ct);
    f(w.d_qkv_full, s.N * 3 * s.Ct);
  }
  if (rc == Recompute::selective) f(w.att_work, s.att);
  if (rc == Recompute::full || s.packed) {
    StageShapes unpacked = s; // the working copy holds every buffer, unpacked, qkv too
    unpacked.packed = unpacked.qkv_in_att = false;
    block_activation_buffers(
        w.work, unpacked, Recompute::none, true,
        s.any_moe(spec.layer_begin, spec.layer_end) ? BlockKind::either : BlockKind::dense, f);
  }
  if (s.packed) f(w.x_work, s.R * s.C);
  if (s.sp) {
    f(w.gath, s.N * s.C);
    f(w.part, s.N * s.C);
  }
  if (spec.last && s.Ct != s.C) { // tp > 1
    f(w.ce_max, s.N);
    f(w.ce_sum, s.N);
    f(w.ce_target, s.N);
  }
  if (s.any_moe(spec.layer_begin, spec.layer_end)) {
    f(w.moe_x, s.MR * s.C);
    f(w.moe_dx, s.XR * s.C);
    f(w.moe_dh, s.XR * s.FE);
    f(w.moe_dweight, s.MR); // N * top_k of them
    if (s.ep > 1) {
      f(w.moe_ye, s.XR * s.C);
      f(w.moe_dys, s.MR * s.C);
      f(w.moe_dxs, s.MR * s.C);
    }
  }
}

// Allocates each buffer of the lists above in `mem`.
struct Allocate {
  Memory mem;
  template <class B> void operator()(B& b, std::size_t n) const { b = B(n, mem); }
};

// Bytes the lists above allocate (every buffer's elements are 4 bytes: float or int32).
struct CountBytes {
  double& bytes;
  template <class B> void operator()(B&, std::size_t n) const {
    bytes += static_cast<double>(aligned_bytes(n * 4));
  }
};

} // namespace pt
