// An MoE layer's branch in place of the MLP (docs/moe.md): the router on ln2's rows, each token's
// rows gathered by expert, every expert's two products on its rows, the activation on all of
// them at once, and the weighted sum back into token order; the backward in reverse. The router
// and the gathering run on the host (device.kind = "cuda" is refused with MoE); the products are
// the backend's. A token's result depends only on its own row, so every layout that gives a
// stage the same micro-batches computes the same bits.
#include <algorithm>
#include <cstring>

#include "model/gpt_stage.hpp"

namespace pt {
namespace {

// out (N,C) writes each token's experts' outputs y (rows, C), weighted, added in slot order
void combine(const moe::Routing& r, const float* y, float* out, std::size_t C) {
  for (int tok = 0; tok < r.N; ++tok) {
    float* o = out + static_cast<std::size_t>(tok) * C;
    std::fill(o, o + C, 0.0f);
    for (int j = 0; j < r.slots(); ++j) {
      const int row = r.row[static_cast<std::size_t>(tok) * r.slots() + j];
      if (row < 0) continue;
      const float wt = j < r.k ? r.weight[static_cast<std::size_t>(tok) * r.k + j] : 1.0f;
      const float* yr = y + static_cast<std::size_t>(row) * C;
      for (std::size_t c = 0; c < C; ++c) o[c] += wt * yr[c];
    }
  }
}

// combine's backward from dout (N,C): dy (rows, C) writes each row's gradient, dweight (N*k)
// each routed weight's (0 where dropped)
void combine_backward(const moe::Routing& r, const float* dout, const float* y, float* dy,
                      float* dweight, std::size_t C) {
  for (int tok = 0; tok < r.N; ++tok) {
    const float* d = dout + static_cast<std::size_t>(tok) * C;
    for (int j = 0; j < r.slots(); ++j) {
      const int row = r.row[static_cast<std::size_t>(tok) * r.slots() + j];
      const std::size_t slot = static_cast<std::size_t>(tok) * r.k + static_cast<std::size_t>(j);
      if (row < 0) {
        if (j < r.k) dweight[slot] = 0.0f;
        continue;
      }
      const float wt = j < r.k ? r.weight[slot] : 1.0f;
      const float* yr = y + static_cast<std::size_t>(row) * C;
      float* dyr = dy + static_cast<std::size_t>(row) * C;
      double dot = 0.0;
      for (std::size_t c = 0; c < C; ++c) {
        dot += static_cast<double>(d[c]) * yr[c];
        dyr[c] = wt * d[c];
      }
      if (j < r.k) dweight[slot] = static_cast<float>(dot);
    }
  }
}

// d (N,C) += each token's rows of dx (rows, C), in slot order
void scatter_add(const moe::Routing& r, const float* dx, float* d, std::size_t C) {
  for (int tok = 0; tok < r.N; ++tok) {
    float* dt = d + static_cast<std::size_t>(tok) * C;
    for (int j = 0; j < r.slots(); ++j) {
      const int row = r.row[static_cast<std::size_t>(tok) * r.slots() + j];
      if (row < 0) continue;
      const float* dxr = dx + static_cast<std::size_t>(row) * C;
      for (std::size_t c = 0; c < C; ++c) dt[c] += dxr[c];
    }
  }
}

} // namespace

ExpertTensors GptStage::expert(const BlockTensors& w, int x) const {
  const std::size_t C = static_cast<std::size_t>(C_),
                    FE = static_cast<std::size_t>(expert_width(model_)), FIE = llama_ ? 2 * FE : FE;
  const bool shared = x >= model_.moe_experts;
  const std::size_t e = static_cast<std::size_t>(shared ? x - model_.moe_experts : x);
  float* fc_w = shared ? w.shared_fc_w : w.fc_w;
  float* fc_b = shared ? w.shared_fc_b : w.fc_b;
  float* fcp_w = shared ? w.shared_fcp_w : w.fcp_w;
  float* fcp_b = shared ? w.shared_fcp_b : w.fcp_b;
  return {fc_w + e * FIE * C, fc_b != nullptr ? fc_b + e * FE : nullptr, fcp_w + e * C * FE,
          fcp_b != nullptr ? fcp_b + e * C : nullptr};
}

void GptStage::moe_route(const BlockView& a) {
  moe::route(routing_, a.router, N_, model_.moe_experts, model_.moe_top_k,
             model_.moe_shared_experts, model_.moe_capacity_factor);
  const std::size_t C = static_cast<std::size_t>(C_);
  for (int r = 0; r < routing_.rows(); ++r) { // the experts' input rows, gathered
    std::memcpy(ws_.moe_x.data() + static_cast<std::size_t>(r) * C,
                a.ln2 + static_cast<std::size_t>(routing_.token[static_cast<std::size_t>(r)]) * C,
                C * sizeof(float));
  }
}

void GptStage::moe_forward(int layer, const BlockView& a) {
  const BlockTensors w = block(weights(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  be_.matmul_forward(a.router, a.ln2, w.router_w, nullptr, N_, C_, E);
  moe::softmax_rows(a.router, a.router_lse, N_, E);
  moe_route(a);
  const moe::Routing& r = routing_;
  const std::size_t C = static_cast<std::size_t>(C_);
  for (int x = 0; x < E + r.S; ++x) {
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors t = expert(w, x);
    be_.matmul_forward(a.fch + r0 * FIE, ws_.moe_x.data() + r0 * C, t.fc_w, t.fc_b, n, C_, FIE);
  }
  const int rows = r.rows();
  if (llama_) {
    be_.swiglu_forward(a.fch_gelu, a.fch, rows, FE, false);
  } else {
    be_.gelu_forward(a.fch_gelu, a.fch, static_cast<std::size_t>(rows) * FE, false);
  }
  for (int x = 0; x < E + r.S; ++x) {
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors t = expert(w, x);
    be_.matmul_forward(a.moe_y + r0 * C, a.fch_gelu + r0 * FE, t.fcp_w, t.fcp_b, n, FE, C_);
  }
  combine(r, a.moe_y, a.out, C);
  if (!counting_) return;
  const std::size_t at = static_cast<std::size_t>(
      std::find(moe_stats_.layers.begin(), moe_stats_.layers.end(), layer) -
      moe_stats_.layers.begin());
  for (int e = 0; e < E; ++e) {
    moe_stats_.tokens[at * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)] +=
        r.assigned[static_cast<std::size_t>(e)];
  }
  moe_stats_.dropped[at] += static_cast<double>(r.dropped);
  moe_stats_.aux += model_.moe_aux_loss * moe::balance_loss(r, a.router) +
                    model_.moe_z_loss * moe::z_loss(a.router_lse, N_);
}

// Expert x's rows of the routing at hand: the first, and how many (0: none)
std::pair<std::size_t, int> GptStage::expert_rows(int x) const {
  const std::size_t r0 = static_cast<std::size_t>(routing_.start[static_cast<std::size_t>(x)]);
  return {r0, routing_.start[static_cast<std::size_t>(x) + 1] - static_cast<int>(r0)};
}

void GptStage::moe_backward(int layer, const BlockView& a, const float* dout, float* d_ln2,
                            BlockStash& s, bool with_weights) {
  const BlockTensors w = block(weights(), layer);
  const BlockTensors g = block(grads_.data(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  moe_route(a); // the forward's routing again, from the kept probabilities
  const moe::Routing& r = routing_;
  const std::size_t C = static_cast<std::size_t>(C_);
  float* dy = s.moe_dy.data();
  float* dweight = ws_.moe_dweight.data();
  combine_backward(r, dout, a.moe_y, dy, dweight, C);
  // each expert's products: the input gradients, and with_weights the weight gradients too
  for (int x = 0; x < E + r.S; ++x) {
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors t = expert(w, x), gt = expert(g, x);
    float* dh = ws_.moe_dh.data() + r0 * FE;
    if (with_weights) {
      be_.matmul_backward(dh, gt.fcp_w, gt.fcp_b, dy + r0 * C, a.fch_gelu + r0 * FE, t.fcp_w, n, FE,
                          C_);
    } else {
      be_.matmul_backward_input(dh, dy + r0 * C, t.fcp_w, n, FE, C_);
    }
  }
  const int rows = r.rows();
  if (llama_) {
    be_.swiglu_backward(s.moe_dfch.data(), a.fch, ws_.moe_dh.data(), rows, FE, false);
  } else {
    be_.gelu_backward(s.moe_dfch.data(), a.fch, ws_.moe_dh.data(),
                      static_cast<std::size_t>(rows) * FE, false);
  }
  for (int x = 0; x < E + r.S; ++x) {
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors t = expert(w, x), gt = expert(g, x);
    float* dx = ws_.moe_dx.data() + r0 * C;
    const float* dfch = s.moe_dfch.data() + r0 * FIE;
    if (with_weights) {
      be_.matmul_backward(dx, gt.fc_w, gt.fc_b, dfch, ws_.moe_x.data() + r0 * C, t.fc_w, n, C_,
                          FIE);
    } else {
      be_.matmul_backward_input(dx, dfch, t.fc_w, n, C_, FIE);
    }
  }
  // the router: its logits' gradient, then its input's (into d_ln2) and its weight's
  moe::router_backward(s.moe_dlogits.data(), r, a.router, a.router_lse, dweight,
                       model_.moe_aux_loss, model_.moe_z_loss, aux_scale_);
  if (with_weights) {
    be_.matmul_backward(d_ln2, g.router_w, nullptr, s.moe_dlogits.data(), a.ln2, w.router_w, N_, C_,
                        E);
  } else {
    be_.matmul_backward_input(d_ln2, s.moe_dlogits.data(), w.router_w, N_, C_, E);
  }
  scatter_add(r, ws_.moe_dx.data(), d_ln2, C); // the gathered rows' gradients to their tokens
}

void GptStage::moe_backward_weight(int layer, const BlockView& a, const BlockStash& s) {
  const BlockTensors g = block(grads_.data(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  moe_route(a);
  const std::size_t C = static_cast<std::size_t>(C_);
  for (int x = 0; x < E + routing_.S; ++x) { // in the order the fused backward adds them
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors gt = expert(g, x);
    be_.matmul_backward_weight(gt.fcp_w, gt.fcp_b, s.moe_dy.data() + r0 * C, a.fch_gelu + r0 * FE,
                               n, FE, C_);
  }
  for (int x = 0; x < E + routing_.S; ++x) {
    const auto [r0, n] = expert_rows(x);
    if (n == 0) continue;
    const ExpertTensors gt = expert(g, x);
    be_.matmul_backward_weight(gt.fc_w, gt.fc_b, s.moe_dfch.data() + r0 * FIE,
                               ws_.moe_x.data() + r0 * C, n, C_, FIE);
  }
  be_.matmul_backward_weight(g.router_w, nullptr, s.moe_dlogits.data(), a.ln2, N_, C_, E);
}

MoeStats GptStage::take_moe_stats() {
  MoeStats out = moe_stats_;
  std::fill(moe_stats_.tokens.begin(), moe_stats_.tokens.end(), 0.0);
  std::fill(moe_stats_.dropped.begin(), moe_stats_.dropped.end(), 0.0);
  moe_stats_.aux = 0.0;
  return out;
}

} // namespace pt
