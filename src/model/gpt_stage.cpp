#include "model/gpt_stage.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "util/errors.hpp"
#include "util/hash.hpp"

namespace pt {
namespace {

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL; // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::uint16_t* as_bf16(FloatBuffer& b) { // a kept buffer's packed values
  return reinterpret_cast<std::uint16_t*>(b.data());
}

} // namespace

GptStage::GptStage(const ModelConfig& model, const StageSpec& stage, int micro_batch, TpGroup tp,
                   const Backend& backend, Recompute recompute, ActFormat format, EpGroup ep)
    : model_(model), spec_(stage), tp_(tp), be_(backend), mem_{backend.alloc, backend.release},
      B_(micro_batch), T_(model.seq_len), C_(model.d_model), Ct_(model.d_model / tp.size),
      NH_(model.n_head / tp.size), F_(mlp_width(model) / tp.size), V_(model.vocab_size / tp.size),
      v0_(tp.rank * (model.vocab_size / tp.size)), N_(micro_batch * model.seq_len),
      R_(tp.sequence_parallel ? N_ / tp.size : N_), QKV_(qkv_rows(model) / tp.size),
      FI_(model.arch == Arch::llama ? 2 * F_ : F_), NKV_(kv_heads(model) / tp.size),
      HD_(head_dim(model)), sp_(tp.sequence_parallel && tp.size > 1),
      llama_(model.arch == Arch::llama), layout_(model, stage, tp.rank, tp.size, ep.rank, ep.size),
      params_(layout_.total(), mem_), grads_(layout_.total(), mem_), recompute_(recompute),
      format_(format), ep_(ep) {
  find_tensors();
  init_moe();
  const StageShapes s = shapes();
  stage_workspace_buffers(ws_, s, spec_, recompute_, backend.attention_scratch(B_, T_, NH_),
                          Allocate{mem_});
  att16_ = s.att16;
  qkv_in_att_ = s.qkv_in_att && recompute_ == Recompute::none;
  packed_products_ = format_ == ActFormat::bf16 && be_.bf16_products != nullptr &&
                     be_.bf16_products() && !sp_ && recompute_ != Recompute::full;
  gelu_packed_ = packed_products_ && !llama_;
  if (spec_.last && tied(model_)) {
    head_grad_ = FloatBuffer(static_cast<std::size_t>(V_) * C_, mem_);
  }
}

void GptStage::copy_floats(float* dst, const float* src, std::size_t n) const {
  be_.copy(dst, src, n * sizeof(float));
}

void GptStage::stored(float* x, std::size_t n) const {
  if (format_ == ActFormat::bf16) be_.round_bf16(x, n);
}

void GptStage::layer_done(int layer) const {
  if (!weight_grad_hook_) return;
  be_.synchronize(); // the hook may start MPI on these gradients
  weight_grad_hook_(layer);
}

void GptStage::tp_sum(float* x, std::size_t n, ActFormat wire) const {
  if (tp_.size > 1) tp_.reduce->sum(x, n, wire);
}

const float* GptStage::whole_rows(const float* x) const {
  return gather_into(ws_.gath, x);
}

// The activations' collectives move the activation format (bf16: half the bytes).
void GptStage::reduce_partial(float* dst) const {
  if (sp_) {
    tp_.reduce->reduce_scatter(dst, ws_.part.data(), static_cast<std::size_t>(R_) * C_, format_);
  } else {
    tp_sum(dst, static_cast<std::size_t>(N_) * C_, format_);
  }
}

const float* GptStage::gather_into(FloatBuffer& whole, const float* x) const {
  if (!sp_) return x;
  tp_.reduce->all_gather(whole.data(), x, static_cast<std::size_t>(R_) * C_, format_);
  return whole.data();
}

void GptStage::sum_sequence_parallel_grads() {
  if (!sp_) return;
  be_.synchronize();
  for (const auto& t : layout_.tensors()) { // the norms: ln1, ln2 of each block and lnf
    if (t.norm) tp_sum(grads_.data() + t.offset, t.size);
  }
}

void GptStage::find_tensors() {
  block_offsets_.assign(static_cast<std::size_t>(spec_.layer_end - spec_.layer_begin), Offsets{});
  for (Offsets& o : block_offsets_) o.fill(kNone);
  edge_offsets_.fill(kNone);
  for (const ParamTensor& t : layout_.tensors()) {
    Offsets& o = t.layer < 0
                     ? edge_offsets_
                     : block_offsets_[static_cast<std::size_t>(t.layer - spec_.layer_begin)];
    o[static_cast<std::size_t>(t.role)] = t.offset;
  }
}

BlockTensors GptStage::block(float* base, int layer) const {
  const Offsets& o = block_offsets_[static_cast<std::size_t>(layer - spec_.layer_begin)];
  auto at = [&](Role r) {
    const std::size_t off = o[static_cast<std::size_t>(r)];
    return off == kNone ? nullptr : base + off; // llama has no biases
  };
  return {at(Role::ln1_w),        at(Role::ln1_b),       at(Role::qkv_w),
          at(Role::qkv_b),        at(Role::proj_w),      at(Role::proj_b),
          at(Role::ln2_w),        at(Role::ln2_b),       at(Role::fc_w),
          at(Role::fc_b),         at(Role::fcp_w),       at(Role::fcp_b),
          at(Role::router_w),     at(Role::shared_fc_w), at(Role::shared_fc_b),
          at(Role::shared_fcp_w), at(Role::shared_fcp_b)};
}

EdgeTensors GptStage::edges(float* base) const {
  auto at = [&](Role r) {
    const std::size_t off = edge_offsets_[static_cast<std::size_t>(r)];
    return off == kNone ? nullptr : base + off;
  };
  EdgeTensors e;
  e.wte = at(Role::wte);
  e.wpe = at(Role::wpe);
  e.lnf_w = at(Role::lnf_w);
  e.lnf_b = at(Role::lnf_b);
  e.lm_head = tied(model_) ? e.wte : at(Role::lm_head);
  return e;
}

void GptStage::init_parameters(std::uint64_t seed) {
  const double resid_std = 0.02 / std::sqrt(2.0 * model_.n_layer);
  std::vector<float> host(be_.on_host() ? 0 : params_.size()); // a device's values, made here
  float* base = be_.on_host() ? params_.data() : host.data();
  for (const auto& t : layout_.tensors()) {
    float* p = base + t.offset;
    if (t.init == Init::zeros || t.init == Init::ones) {
      std::fill(p, p + t.size, t.init == Init::ones ? 1.0f : 0.0f);
      continue;
    }
    const double std = t.init == Init::residual ? resid_std : 0.02;
    const std::uint64_t h = name_hash(t.name);
    for (std::size_t i = 0; i < t.size; ++i) {
      // Box-Muller on two counter-based uniforms of the element's index in the whole tensor
      const std::size_t g = layout_.global_index(t, i);
      const double u1 = unit_open0(hash3(seed, h, 2 * g));
      const double u2 = unit_open0(hash3(seed, h, 2 * g + 1));
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      p[i] = static_cast<float>(std * z);
    }
  }
  if (!be_.on_host()) from_host(be_, params_.data(), host.data(), host.size());
}

void GptStage::zero_grads() {
  be_.zero(grads_.data(), grads_.size());
  if (head_grad_.size() > 0) be_.zero(head_grad_.data(), head_grad_.size());
  be_.synchronize();
}

void GptStage::fold_tied_head_grad() {
  if (head_grad_.size() == 0) return;
  float* dwte = edges(grads_.data()).wte;
  if (spec_.first) {
    be_.accumulate(dwte, head_grad_.data(), head_grad_.size());
  } else {
    copy_floats(dwte, head_grad_.data(), head_grad_.size());
  }
  be_.synchronize();
}

StageShapes GptStage::shapes() const {
  return backend_shapes(model_, B_, tp_.size, tp_.sequence_parallel, format_, be_)
      .with_ep(ep_.size);
}

BlockView GptStage::view(BlockActivations& kept, bool last) {
  const bool full = recompute_ == Recompute::full, bf16 = format_ == ActFormat::bf16;
  const auto at = [](FloatBuffer& own, FloatBuffer& work, bool in_work) {
    return in_work ? work.data() : own.data();
  };
  const bool stored16 = full || bf16; // not kept, or kept packed
  BlockView v{};
  v.ln1 = at(kept.ln1, ws_.work.ln1, stored16);
  v.qkv = at(kept.qkv, ws_.work.qkv, stored16 || kept.qkv.size() == 0); // or in att's copy
  v.atty = at(kept.atty, ws_.work.atty, stored16);
  v.ln2 = at(kept.ln2, ws_.work.ln2, stored16);
  v.fch = at(kept.fch, ws_.work.fch, stored16);
  v.fch_gelu = at(kept.fch_gelu, ws_.work.fch_gelu, stored16);
  v.ln1_mean = at(kept.ln1_mean, ws_.work.ln1_mean, full);
  v.ln1_rstd = at(kept.ln1_rstd, ws_.work.ln1_rstd, full);
  v.res2 = at(kept.res2, ws_.work.res2, full);
  v.ln2_mean = at(kept.ln2_mean, ws_.work.ln2_mean, full);
  v.ln2_rstd = at(kept.ln2_rstd, ws_.work.ln2_rstd, full);
  v.att = full || (att16_ && kept.att.size() > 0) ? ws_.work.att.data()
          : kept.att.size() > 0                   ? kept.att.data()
                                                  : nullptr;
  v.out = at(kept.out, ws_.work.out, bf16 && !last);
  v.router = at(kept.router, ws_.work.router, full);
  v.router_lse = at(kept.router_lse, ws_.work.router_lse, full);
  v.moe_y = at(kept.moe_y, ws_.work.moe_y, full);
  v.moe_xe = at(kept.moe_xe, ws_.work.moe_xe, full);
  v.moe_counts = full ? &ws_.work.moe_counts : &kept.moe_counts;
  if (packed_products_) {
    v.ln1_16 = as_bf16(kept.ln1);
    v.atty16 = as_bf16(kept.atty);
    v.ln2_16 = as_bf16(kept.ln2);
    v.fch_gelu16 = as_bf16(kept.fch_gelu);
    if (gelu_packed_) v.fch16 = as_bf16(kept.fch);
  }
  return v;
}

namespace {

// f(kept buffer, working copy's buffer) for each tensor the bf16 format keeps packed and the
// forward has not packed already (early: the products' inputs, with packed products, and gpt2's
// fch; out: the block's output; att16: the attention probabilities, where they are kept)
template <class Fn>
void packed_tensors(BlockActivations& kept, BlockActivations& work, Recompute rc, bool early,
                    bool fch_early, bool out, bool att16, Fn&& f) {
  if (rc != Recompute::full) {
    if (kept.qkv.size() > 0) f(kept.qkv, work.qkv); // else att keeps it
    if (!fch_early) f(kept.fch, work.fch);
    if (!early) {
      for (auto m : {&BlockActivations::ln1, &BlockActivations::atty, &BlockActivations::ln2,
                     &BlockActivations::fch_gelu}) {
        f(kept.*m, work.*m);
      }
    }
  }
  if (att16 && kept.att.size() > 0) f(kept.att, work.att);
  if (out) f(kept.out, work.out);
}

} // namespace

void GptStage::pack(BlockActivations& kept, bool last) {
  if (format_ != ActFormat::bf16) return;
  packed_tensors(
      kept, ws_.work, recompute_, packed_products_, gelu_packed_, !last, att16_,
      [&](FloatBuffer& k, FloatBuffer& w) { be_.pack_bf16(as_bf16(k), w.data(), w.size()); });
}

void GptStage::unpack(BlockActivations& kept) {
  if (format_ != ActFormat::bf16) return;
  packed_tensors(
      kept, ws_.work, recompute_, packed_products_, gelu_packed_, false, att16_,
      [&](FloatBuffer& k, FloatBuffer& w) { be_.unpack_bf16(w.data(), as_bf16(k), w.size()); });
}

StageActivations GptStage::make_activations() const {
  StageActivations a;
  stage_activation_buffers(a, shapes(), spec_, recompute_, Allocate{mem_});
  return a;
}

StageStash GptStage::make_stash(std::size_t blocks) const {
  StageStash s;
  stage_stash_buffers(s, shapes(), spec_, blocks, Allocate{mem_});
  return s;
}

const float* GptStage::block_input(const StageActivations& a, int i) const {
  if (i == 0) return a.input.data();
  const FloatBuffer& out = a.blocks[static_cast<std::size_t>(i) - 1].out;
  if (format_ != ActFormat::bf16 || i == static_cast<int>(a.blocks.size())) return out.data();
  be_.unpack_bf16(ws_.x_work.data(), reinterpret_cast<const std::uint16_t*>(out.data()),
                  ws_.x_work.size()); // kept packed
  return ws_.x_work.data();
}

// ---- forward --------------------------------------------------------------------------------

void GptStage::block_forward(int i, const float* x, const BlockView& a) {
  const BlockTensors w = block(weights(), spec_.layer_begin + i);
  const int N = N_, R = R_, C = C_, Ct = Ct_, F = F_;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  // row-parallel layers: one tp rank adds the (replicated) bias, the all-reduce (or the
  // reduce-scatter) adds the rest; norms and residual on this rank's R rows
  const bool bias_here = tp_.rank == 0;
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  product_input(a.ln1, RC);
  linear_forward(a.qkv, whole_rows(a.ln1), a.ln1_16, w.qkv_w, w.qkv_b, C, QKV_);
  position_qkv(a.qkv);
  product_input(a.qkv, static_cast<std::size_t>(N) * QKV_);
  float* att = a.att != nullptr ? a.att : ws_.att_work.data(); // selective: not kept
  be_.attention_forward(a.atty, att, attention_qkv(a.qkv), B_, T_, Ct, NH_);
  product_input(a.atty, static_cast<std::size_t>(N) * Ct);
  if (att16_) stored(att, ws_.work.att.size()); // the probabilities the backward reads
  linear_forward(partial_for(a.res2), a.atty, a.atty16, w.proj_w, bias_here ? w.proj_b : nullptr,
                 Ct, C);
  reduce_partial(a.res2);
  // the attention branch's output, stored (rounded at bf16), plus x: the residual sum stays fp32
  be_.residual_add(a.res2, x, RC, format_ == ActFormat::bf16);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2_w, w.ln2_b);
  product_input(a.ln2, RC);
  if (moe_layer(i)) {
    moe_forward(spec_.layer_begin + i, a);
  } else {
    linear_forward(a.fch, whole_rows(a.ln2), a.ln2_16, w.fc_w, w.fc_b, C, FI_);
    mlp_activation(a);
    linear_forward(partial_for(a.out), a.fch16 != nullptr ? nullptr : a.fch_gelu, a.fch_gelu16,
                   w.fcp_w, bias_here ? w.fcp_b : nullptr, F, C);
    reduce_partial(a.out);
  }
  be_.residual_add(a.out, a.res2, RC, format_ == ActFormat::bf16); // the MLP branch's, the same
  // the block's output, stored between blocks; packing rounds it where it is kept packed
  if (a.out == ws_.work.out.data() && format_ == ActFormat::bf16) return;
  stored(a.out, RC);
}

float GptStage::forward(StageActivations& a, float loss_scale) {
  const EdgeTensors e = edges(weights());
  if (spec_.first) {
    // vocabulary-parallel embedding: each tp rank looks up its rows; one adds the positions
    be_.encoder_forward(partial_for(a.input.data()), a.tokens.data(), e.wte,
                        tp_.rank == 0 ? e.wpe : nullptr, B_, T_, C_, v0_, v0_ + V_);
    reduce_partial(a.input.data());
    stored(a.input);
  }
  counting_ = loss_scale != 0.0f; // a training forward: its routing counts
  for (std::size_t i = 0; i < a.blocks.size(); ++i) {
    const int b = static_cast<int>(i);
    const bool last = i + 1 == a.blocks.size();
    block_forward(b, block_input(a, b), view(a.blocks[i], last));
    pack(a.blocks[i], last);
  }
  counting_ = false;
  if (!spec_.last) {
    be_.synchronize();
    return 0.0f;
  }
  const float* x = block_input(a, static_cast<int>(a.blocks.size()));
  norm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, e.lnf_w, e.lnf_b);
  product_input(a.lnf.data(), a.lnf.size());
  be_.matmul_forward(a.probs.data(), whole_rows(a.lnf.data()), e.lm_head, nullptr, N_, C_, V_);
  const bool bf16 = format_ == ActFormat::bf16; // the logits, stored: the loss rounds as it reads
  if (tp_.size > 1) stored(a.probs);            // (the vocabulary-parallel pieces do not)
  a.dlogits_scale = tp_.size == 1 ? loss_scale : 0.0f;
  if (a.dlogits_scale != 0.0f) { // the cross-entropy's backward too, in the same pass
    be_.crossentropy_forward_backward(a.losses.data(), a.probs.data(), a.probs.data(),
                                      a.targets.data(), loss_scale, N_, V_, bf16);
    product_input(a.probs.data(), a.probs.size()); // d logits: read by the head's products
  } else if (tp_.size == 1) {
    be_.crossentropy_forward(a.losses.data(), a.probs.data(), a.probs.data(), a.targets.data(), N_,
                             V_, bf16);
  } else {
    // vocabulary-parallel cross-entropy: no rank holds all logits; max, then the target's logit
    // and the exp-sum are all-reduced over the tp group
    be_.row_max(ws_.ce_max.data(), a.probs.data(), N_, V_);
    tp_.reduce->max(ws_.ce_max.data(), ws_.ce_max.size());
    be_.gather_target(ws_.ce_target.data(), a.probs.data(), a.targets.data(), N_, V_, v0_);
    be_.softmax_exp(a.probs.data(), ws_.ce_sum.data(), a.probs.data(), ws_.ce_max.data(), N_, V_);
    tp_sum(ws_.ce_target.data(), ws_.ce_target.size());
    tp_sum(ws_.ce_sum.data(), ws_.ce_sum.size());
    be_.crossentropy_finish(a.losses.data(), a.probs.data(), ws_.ce_sum.data(), ws_.ce_max.data(),
                            ws_.ce_target.data(), N_, V_);
  }
  be_.synchronize();
  const float* losses = readable(be_, a.losses.data(), a.losses.size(), losses_host_);
  double sum = 0.0;
  for (int n = 0; n < N_; ++n) sum += losses[n];
  return static_cast<float>(sum / N_);
}

// ---- backward -------------------------------------------------------------------------------

BlockView GptStage::for_backward(int i, const float* x, BlockActivations& kept, bool last) {
  BlockView v = view(kept, last);
  if (recompute_ == Recompute::full) {
    v.out = ws_.work.out.data(); // the kept output may still be in a pipeline send
    block_forward(i, x, v);      // the same ops on the same input: the same bits
  } else {
    unpack(kept);
  }
  return v;
}

void GptStage::linear_forward(float* out, const float* x, std::uint16_t* x16, const float* w,
                              const float* b, int n_in, int n_out) const {
  if (x16 == nullptr) return be_.matmul_forward(out, x, w, b, N_, n_in, n_out);
  if (x != nullptr) be_.pack_bf16(x16, x, static_cast<std::size_t>(N_) * n_in);
  be_.matmul_forward_packed(out, x16, w, b, N_, n_in, n_out);
}

void GptStage::linear_backward(float* dinp, const float* dout, const float* w, int n_in, int n_out,
                               float* dw, float* dbias, const float* inp,
                               const std::uint16_t* inp16) const {
  if (dw != nullptr && inp16 != nullptr) {
    be_.matmul_backward_packed(dinp, dw, dbias, dout, inp16, w, N_, n_in, n_out);
  } else if (dinp == nullptr) {
    be_.matmul_backward_weight(dw, dbias, dout, inp, N_, n_in, n_out);
  } else if (dw != nullptr) {
    be_.matmul_backward(dinp, dw, dbias, dout, inp, w, N_, n_in, n_out);
  } else {
    be_.matmul_backward_input(dinp, dout, w, N_, n_in, n_out);
  }
}

void GptStage::block_backward_input(int i, const float* x, const BlockView& a, const float* dout,
                                    BlockStash& s, bool with_weights) {
  const BlockTensors w = block(weights(), spec_.layer_begin + i);
  const BlockTensors g = block(grads_.data(), spec_.layer_begin + i);
  const bool wg = with_weights; // the weight gradients too, from the same products
  const int R = R_, C = C_, Ct = Ct_, F = F_;
  const std::size_t RC = static_cast<std::size_t>(R) * C;
  s.dout = dout;
  // MLP branch (row-parallel proj: its input gradient needs no communication, but with sp the
  // whole rows of the output gradient, gathered)
  if (moe_layer(i)) {
    moe_backward(spec_.layer_begin + i, a, dout, s.d_ln2.data(), s, wg);
  } else {
    const float* g_dout = gather_into(s.g_dout, dout);
    linear_backward(ws_.d_fch_gelu.data(), g_dout, w.fcp_w, F, C, wg ? g.fcp_w : nullptr, g.fcp_b,
                    a.fch_gelu,
                    a.fch_gelu16); // stored by the activation's backward, as it reads it
    mlp_activation_backward(s.d_fch.data(), a, ws_.d_fch_gelu.data());
    product_input(s.d_fch.data(), s.d_fch.size());
    // column-parallel fc: sum the input gradient's shares
    linear_backward(partial_for(s.d_ln2.data()), s.d_fch.data(), w.fc_w, C, FI_,
                    wg ? g.fc_w : nullptr, g.fc_b, wg ? whole_rows(a.ln2) : nullptr, a.ln2_16);
    reduce_partial(s.d_ln2.data());
  }
  stored(s.d_ln2);
  copy_floats(s.d_res2.data(), dout, RC); // residual path
  norm_backward_input(s.d_res2.data(), s.d_ln2.data(), a.res2, w.ln2_w, a.ln2_mean, a.ln2_rstd);
  // attention branch; selective: the probabilities again (ws_.d_atty holds the unused output)
  float* att = a.att != nullptr ? a.att : ws_.att_work.data();
  const float* qkv = a.att != nullptr && qkv_in_att_ ? nullptr : attention_qkv(a.qkv); // in att
  if (a.att == nullptr) {
    be_.attention_forward(ws_.d_atty.data(), att, qkv, B_, T_, Ct, NH_);
    if (att16_) stored(att, ws_.work.att.size()); // as the forward stored them
  }
  linear_backward(ws_.d_atty.data(), gather_into(s.g_res2, s.d_res2.data()), w.proj_w, Ct, C,
                  wg ? g.proj_w : nullptr, g.proj_b, a.atty, a.atty16);
  stored(ws_.d_atty);
  be_.attention_backward(attention_dqkv(s.d_qkv.data()), ws_.att_scratch.data(), ws_.d_atty.data(),
                         qkv, att, B_, T_, Ct, NH_);
  finish_dqkv(s.d_qkv.data());
  product_input(s.d_qkv.data(), s.d_qkv.size());
  // column-parallel qkv
  linear_backward(partial_for(s.d_ln1.data()), s.d_qkv.data(), w.qkv_w, C, QKV_,
                  wg ? g.qkv_w : nullptr, g.qkv_b, wg ? whole_rows(a.ln1) : nullptr, a.ln1_16);
  reduce_partial(s.d_ln1.data());
  stored(s.d_ln1);
  copy_floats(s.dx.data(), s.d_res2.data(), RC); // residual path
  norm_backward_input(s.dx.data(), s.d_ln1.data(), x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
  stored(s.dx); // the gradient of the block's input: stored between blocks
}

void GptStage::block_backward_weight(int i, const float* x, const BlockView& a, const BlockStash& s,
                                     bool linears) {
  const BlockTensors g = block(grads_.data(), spec_.layer_begin + i);
  const int C = C_, Ct = Ct_, F = F_;
  // with sp: the gathered output gradients; the norms' inputs gathered again (not kept); the
  // norms' gradients from this rank's rows (sum_sequence_parallel_grads adds the rest)
  if (linears && moe_layer(i)) {
    moe_backward_weight(spec_.layer_begin + i, a, s);
  } else if (linears) { // the weight gradients alone: no weights, no input gradient
    linear_backward(nullptr, sp_ ? s.g_dout.data() : s.dout, nullptr, F, C, g.fcp_w, g.fcp_b,
                    a.fch_gelu, a.fch_gelu16);
    linear_backward(nullptr, s.d_fch.data(), nullptr, C, FI_, g.fc_w, g.fc_b, whole_rows(a.ln2),
                    a.ln2_16);
  }
  if (linears) {
    linear_backward(nullptr, sp_ ? s.g_res2.data() : s.d_res2.data(), nullptr, Ct, C, g.proj_w,
                    g.proj_b, a.atty, a.atty16);
    linear_backward(nullptr, s.d_qkv.data(), nullptr, C, QKV_, g.qkv_w, g.qkv_b, whole_rows(a.ln1),
                    a.ln1_16);
  }
  norm_backward_weight(g.ln2_w, g.ln2_b, s.d_ln2.data(), a.res2, a.ln2_mean, a.ln2_rstd);
  norm_backward_weight(g.ln1_w, g.ln1_b, s.d_ln1.data(), x, a.ln1_mean, a.ln1_rstd);
}

void GptStage::head_backward_input(StageActivations& a, float loss_scale, float* d_lnf, float* dx,
                                   bool with_weights) {
  const EdgeTensors e = edges(weights());
  // probs become d logits in place (unless the forward wrote them already)
  if (a.dlogits_scale == 0.0f) {
    be_.crossentropy_backward(a.probs.data(), a.probs.data(), a.targets.data(), loss_scale, N_, V_,
                              v0_);
    product_input(a.probs.data(), a.probs.size()); // d logits: read by the head's products
  } else if (a.dlogits_scale != loss_scale) {
    throw std::logic_error("GptStage: the forward's d logits are for another loss scale");
  }
  a.dlogits_scale = 0.0f;
  // vocabulary-parallel head: sum the shares
  linear_backward(partial_for(d_lnf), a.probs.data(), e.lm_head, C_, V_,
                  with_weights ? head_weight_grad() : nullptr, nullptr,
                  with_weights ? whole_rows(a.lnf.data()) : nullptr);
  reduce_partial(d_lnf);
  stored(d_lnf, static_cast<std::size_t>(R_) * C_);
  const float* x = block_input(a, static_cast<int>(a.blocks.size()));
  be_.zero(dx, static_cast<std::size_t>(R_) * C_);
  norm_backward_input(dx, d_lnf, x, e.lnf_w, a.lnf_mean.data(), a.lnf_rstd.data());
  stored(dx, static_cast<std::size_t>(R_) * C_);
}

float* GptStage::head_weight_grad() {
  return head_grad_.size() > 0 ? head_grad_.data() : edges(grads_.data()).lm_head;
}

void GptStage::head_backward_weight(StageActivations& a, const float* d_lnf, bool linear) {
  const EdgeTensors g = edges(grads_.data());
  if (linear) {
    be_.matmul_backward_weight(head_weight_grad(), nullptr, a.probs.data(),
                               whole_rows(a.lnf.data()), N_, C_, V_);
  }
  const float* x = block_input(a, static_cast<int>(a.blocks.size()));
  norm_backward_weight(g.lnf_w, g.lnf_b, d_lnf, x, a.lnf_mean.data(), a.lnf_rstd.data());
}

void GptStage::prepare_backward() {
  if (fused_.blocks.empty()) fused_ = make_stash(1);
}

void GptStage::backward(StageActivations& a, const float* dout, float loss_scale, float* d_input) {
  // One block stash reused block after block; the gradient flowing down the stage lives in
  // fused_.d_input, which also ends up holding the stage input's gradient.
  prepare_backward();
  aux_scale_ = static_cast<double>(loss_scale) * N_;
  const std::size_t RC = static_cast<std::size_t>(R_) * C_;
  float* flow = fused_.d_input.data();
  const float* grad = dout;
  if (spec_.last) {
    head_backward_input(a, loss_scale, fused_.d_lnf.data(), flow, true);
    head_backward_weight(a, fused_.d_lnf.data(), false);
    grad = flow;
  }
  BlockStash& b = fused_.blocks[0];
  for (int i = static_cast<int>(a.blocks.size()) - 1; i >= 0; --i) {
    const float* x = block_input(a, i);
    const BlockView act = for_backward(i, x, a.blocks[static_cast<std::size_t>(i)],
                                       i + 1 == static_cast<int>(a.blocks.size()));
    block_backward_input(i, x, act, grad, b, true);
    block_backward_weight(i, x, act, b, false);
    layer_done(spec_.layer_begin + i);
    copy_floats(flow, b.dx.data(), RC);
    grad = flow;
  }
  if (grad != flow) copy_floats(flow, grad, RC); // a stage with no blocks passes dout through
  if (spec_.first) {
    const EdgeTensors g = edges(grads_.data());
    be_.encoder_backward(g.wte, g.wpe, whole_rows(flow), a.tokens.data(), B_, T_, C_, v0_,
                         v0_ + V_);
  }
  if (d_input != nullptr) copy_floats(d_input, flow, RC);
  be_.synchronize();
}

void GptStage::backward_input(StageActivations& a, const float* dout, float loss_scale,
                              StageStash& s) {
  aux_scale_ = static_cast<double>(loss_scale) * N_;
  const float* grad = dout;
  if (spec_.last) {
    head_backward_input(a, loss_scale, s.d_lnf.data(), s.d_output.data());
    grad = s.d_output.data();
  }
  for (int i = static_cast<int>(a.blocks.size()) - 1; i >= 0; --i) {
    const float* x = block_input(a, i);
    const bool last = i + 1 == static_cast<int>(a.blocks.size());
    block_backward_input(i, x, for_backward(i, x, a.blocks[static_cast<std::size_t>(i)], last),
                         grad, s.blocks[static_cast<std::size_t>(i)]);
    grad = s.blocks[static_cast<std::size_t>(i)].dx.data();
  }
  // gradient of the stage input (what a pipeline sends to the previous stage)
  if (grad != s.d_input.data()) copy_floats(s.d_input.data(), grad, s.d_input.size());
  be_.synchronize();
}

void GptStage::backward_weight(StageActivations& a, StageStash& s) {
  if (spec_.last) head_backward_weight(a, s.d_lnf.data());
  for (int i = static_cast<int>(a.blocks.size()) - 1; i >= 0; --i) {
    const float* x = block_input(a, i);
    const bool last = i + 1 == static_cast<int>(a.blocks.size());
    block_backward_weight(i, x, for_backward(i, x, a.blocks[static_cast<std::size_t>(i)], last),
                          s.blocks[static_cast<std::size_t>(i)]);
    layer_done(spec_.layer_begin + i);
  }
  if (spec_.first) {
    const EdgeTensors g = edges(grads_.data());
    be_.encoder_backward(g.wte, g.wpe, whole_rows(s.d_input.data()), a.tokens.data(), B_, T_, C_,
                         v0_, v0_ + V_);
  }
  be_.synchronize();
}

} // namespace pt
