// An MoE layer's branch in place of the MLP (docs/moe.md): the router on ln2's rows, each token's
// rows gathered by expert, every expert's two products on its rows, the activation on all of
// them at once, and the weighted sum back into token order; the backward in reverse. The router
// and the gathering run on the host (device.kind = "cuda" is refused with MoE); the products are
// the backend's. A token's result depends only on its own row, so every layout that gives a
// stage the same micro-batches computes the same bits.
// Expert parallelism (parallel.ep): the gathered rows of experts held by other ranks of the group
// go there by all-to-all and their outputs come back; each expert computes one segment of rows
// per source rank, the same products as that rank would compute without ep, so the forward and
// the input gradients keep their bits; an expert's weight gradient adds the group's segments in
// one buffer, where ep 1 adds each rank's and then sums over dp (rounding differs).
#include <algorithm>
#include <cstring>

#include "comm/alltoall.hpp"
#include "model/gpt_stage.hpp"
#include "util/errors.hpp"

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

void GptStage::init_moe() {
  for (int l = spec_.layer_begin; l < spec_.layer_end; ++l) {
    if (is_moe_layer(model_, l)) moe_stats_.layers.push_back(l);
  }
  moe_stats_.tokens.assign(moe_stats_.layers.size() * static_cast<std::size_t>(model_.moe_experts),
                           0.0);
  moe_stats_.dropped.assign(moe_stats_.layers.size(), 0.0);
  local_experts_ = model_.moe_experts / ep_.size;
}

ExpertTensors GptStage::expert(const BlockTensors& w, int x) const {
  const std::size_t C = static_cast<std::size_t>(C_),
                    FE = static_cast<std::size_t>(expert_width(model_)), FIE = llama_ ? 2 * FE : FE;
  const bool shared = x >= local_experts_;
  const std::size_t e = static_cast<std::size_t>(shared ? x - local_experts_ : x);
  float* fc_w = shared ? w.shared_fc_w : w.fc_w;
  float* fc_b = shared ? w.shared_fc_b : w.fc_b;
  float* fcp_w = shared ? w.shared_fcp_w : w.fcp_w;
  float* fcp_b = shared ? w.shared_fcp_b : w.fcp_b;
  return {fc_w + e * FIE * C, fc_b != nullptr ? fc_b + e * FE : nullptr, fcp_w + e * C * FE,
          fcp_b != nullptr ? fcp_b + e * C : nullptr};
}

void GptStage::moe_route(const BlockView& a, bool exchange) {
  const int E = model_.moe_experts, El = local_experts_, p = ep_.size;
  moe::route(routing_, a.router, N_, E, model_.moe_top_k, model_.moe_shared_experts,
             model_.moe_capacity_factor);
  const moe::Routing& r = routing_;
  const std::size_t C = static_cast<std::size_t>(C_);
  for (int i = 0; i < r.rows(); ++i) { // this rank's tokens' rows, gathered by expert
    std::memcpy(ws_.moe_x.data() + static_cast<std::size_t>(i) * C,
                a.ln2 + static_cast<std::size_t>(r.token[static_cast<std::size_t>(i)]) * C,
                C * sizeof(float));
  }
  const auto rows_of = [&r](int x) {
    return r.start[static_cast<std::size_t>(x) + 1] - r.start[static_cast<std::size_t>(x)];
  };
  segments_.clear();
  std::size_t r0 = 0;
  if (p == 1) { // the experts compute the gathered rows where they are
    for (int x = 0; x < E + r.S; ++x) {
      segments_.push_back({x, r0, rows_of(x)});
      r0 += static_cast<std::size_t>(rows_of(x));
    }
    return;
  }
  // rank q of the group holds experts [q El, (q+1) El): its rows are one block of the gathered
  sends_.assign(static_cast<std::size_t>(p), 0);
  parts_.resize(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    parts_[static_cast<std::size_t>(e)] = rows_of(e);
    sends_[static_cast<std::size_t>(e / El)] += rows_of(e);
  }
  std::vector<int>& counts = *a.moe_counts; // (p, El): rows of expert e from rank q
  if (exchange) {
    counts.resize(static_cast<std::size_t>(p * El));
    ep_.exchange->exchange_counts(parts_.data(), counts.data(), El);
    long in = 0; // the buffers hold every routed slot of the group's micro-batches at most
    for (const int n : counts) in += n;
    if (in > static_cast<long>(p) * N_ * model_.moe_top_k) {
      fatal("the expert-parallel group announced " + std::to_string(in) + " rows for this rank's " +
            "experts, more than its " + std::to_string(p) +
            " micro-batches route: the ranks "
            "disagree on the model or the batch");
    }
  }
  recvs_.assign(static_cast<std::size_t>(p), 0);
  for (int q = 0; q < p; ++q) { // received source-major: rank q's rows of each expert here
    for (int e = 0; e < El; ++e) {
      const int n = counts[static_cast<std::size_t>(q * El + e)];
      segments_.push_back({e, r0, n});
      r0 += static_cast<std::size_t>(n);
      recvs_[static_cast<std::size_t>(q)] += n;
    }
  }
  routed_in_ = r0;
  for (int s = 0; s < r.S; ++s) { // this rank's tokens' shared experts, after the routed rows
    segments_.push_back({El + s, r0, rows_of(E + s)});
    r0 += static_cast<std::size_t>(rows_of(E + s));
  }
}

int GptStage::expert_rows() const {
  return segments_.empty() ? 0 : static_cast<int>(segments_.back().r0) + segments_.back().n;
}

void GptStage::moe_dispatch(const float* from, float* to, bool back) {
  if (ep_.size == 1) return;
  std::vector<int> sc(sends_), rc(recvs_);
  if (back) std::swap(sc, rc);
  for (int& n : sc) n *= C_;
  for (int& n : rc) n *= C_;
  // auto's size class: a balanced block (the same on every rank of the group)
  const std::size_t balanced = static_cast<std::size_t>(N_) *
                               static_cast<std::size_t>(model_.moe_top_k * C_) * sizeof(float) /
                               static_cast<std::size_t>(ep_.size);
  ep_.exchange->exchange(from, sc.data(), to, rc.data(), balanced);
  // the shared experts' rows stay here: after the routed rows gathered, after those received
  const std::size_t C = static_cast<std::size_t>(C_),
                    mine = static_cast<std::size_t>(
                        routing_.start[static_cast<std::size_t>(model_.moe_experts)]),
                    n = static_cast<std::size_t>(routing_.rows()) - mine;
  const std::size_t src = back ? routed_in_ : mine, dst = back ? mine : routed_in_;
  std::memcpy(to + dst * C, from + src * C, n * C * sizeof(float));
}

void GptStage::moe_forward(int layer, const BlockView& a) {
  const BlockTensors w = block(weights(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  be_.matmul_forward(a.router, a.ln2, w.router_w, nullptr, N_, C_, E);
  moe::softmax_rows(a.router, a.router_lse, N_, E);
  moe_route(a, true);
  const moe::Routing& r = routing_;
  const std::size_t C = static_cast<std::size_t>(C_);
  float* xe = expert_inputs(a);
  float* ye = ep_.size > 1 ? ws_.moe_ye.data() : a.moe_y; // the experts' outputs, before they go
  moe_dispatch(ws_.moe_x.data(), xe, false);
  for (const Segment& g : segments_) {
    if (g.n == 0) continue;
    const ExpertTensors t = expert(w, g.x);
    be_.matmul_forward(a.fch + g.r0 * FIE, xe + g.r0 * C, t.fc_w, t.fc_b, g.n, C_, FIE);
  }
  const int rows = expert_rows();
  if (llama_) {
    be_.swiglu_forward(a.fch_gelu, a.fch, rows, FE, false);
  } else {
    be_.gelu_forward(a.fch_gelu, a.fch, static_cast<std::size_t>(rows) * FE, false);
  }
  for (const Segment& g : segments_) {
    if (g.n == 0) continue;
    const ExpertTensors t = expert(w, g.x);
    be_.matmul_forward(ye + g.r0 * C, a.fch_gelu + g.r0 * FE, t.fcp_w, t.fcp_b, g.n, FE, C_);
  }
  moe_dispatch(ye, a.moe_y, true); // the outputs back to their tokens' ranks
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

void GptStage::moe_backward(int layer, const BlockView& a, const float* dout, float* d_ln2,
                            BlockStash& s, bool with_weights) {
  const BlockTensors w = block(weights(), layer);
  const BlockTensors g = block(grads_.data(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  moe_route(a); // the forward's routing again, from the kept probabilities
  const moe::Routing& r = routing_;
  const std::size_t C = static_cast<std::size_t>(C_);
  const bool ep = ep_.size > 1;
  const float* xe = expert_inputs(a);
  float* dy = s.moe_dy.data();               // this rank's experts' rows
  float* dys = ep ? ws_.moe_dys.data() : dy; // this rank's tokens' rows
  float* dxs = ep ? ws_.moe_dxs.data() : ws_.moe_dx.data();
  float* dweight = ws_.moe_dweight.data();
  combine_backward(r, dout, a.moe_y, dys, dweight, C);
  moe_dispatch(dys, dy, false);
  // each expert's products: the input gradients, and with_weights the weight gradients too
  for (const Segment& sg : segments_) {
    if (sg.n == 0) continue;
    const ExpertTensors t = expert(w, sg.x), gt = expert(g, sg.x);
    float* dh = ws_.moe_dh.data() + sg.r0 * FE;
    if (with_weights) {
      be_.matmul_backward(dh, gt.fcp_w, gt.fcp_b, dy + sg.r0 * C, a.fch_gelu + sg.r0 * FE, t.fcp_w,
                          sg.n, FE, C_);
    } else {
      be_.matmul_backward_input(dh, dy + sg.r0 * C, t.fcp_w, sg.n, FE, C_);
    }
  }
  const int rows = expert_rows();
  if (llama_) {
    be_.swiglu_backward(s.moe_dfch.data(), a.fch, ws_.moe_dh.data(), rows, FE, false);
  } else {
    be_.gelu_backward(s.moe_dfch.data(), a.fch, ws_.moe_dh.data(),
                      static_cast<std::size_t>(rows) * FE, false);
  }
  for (const Segment& sg : segments_) {
    if (sg.n == 0) continue;
    const ExpertTensors t = expert(w, sg.x), gt = expert(g, sg.x);
    float* dx = ws_.moe_dx.data() + sg.r0 * C;
    const float* dfch = s.moe_dfch.data() + sg.r0 * FIE;
    if (with_weights) {
      be_.matmul_backward(dx, gt.fc_w, gt.fc_b, dfch, xe + sg.r0 * C, t.fc_w, sg.n, C_, FIE);
    } else {
      be_.matmul_backward_input(dx, dfch, t.fc_w, sg.n, C_, FIE);
    }
  }
  moe_dispatch(ws_.moe_dx.data(), dxs, true); // the input rows' gradients back to their tokens
  // the router: its logits' gradient, then its input's (into d_ln2) and its weight's
  moe::router_backward(s.moe_dlogits.data(), r, a.router, a.router_lse, dweight,
                       model_.moe_aux_loss, model_.moe_z_loss, aux_scale_);
  if (with_weights) {
    be_.matmul_backward(d_ln2, g.router_w, nullptr, s.moe_dlogits.data(), a.ln2, w.router_w, N_, C_,
                        E);
  } else {
    be_.matmul_backward_input(d_ln2, s.moe_dlogits.data(), w.router_w, N_, C_, E);
  }
  scatter_add(r, dxs, d_ln2, C); // the gathered rows' gradients to their tokens
}

void GptStage::moe_backward_weight(int layer, const BlockView& a, const BlockStash& s) {
  const BlockTensors g = block(grads_.data(), layer);
  const int E = model_.moe_experts, FE = expert_width(model_), FIE = llama_ ? 2 * FE : FE;
  moe_route(a);
  const std::size_t C = static_cast<std::size_t>(C_);
  const float* xe = expert_inputs(a);
  for (const Segment& sg : segments_) { // in the order the fused backward adds them
    if (sg.n == 0) continue;
    const ExpertTensors gt = expert(g, sg.x);
    be_.matmul_backward_weight(gt.fcp_w, gt.fcp_b, s.moe_dy.data() + sg.r0 * C,
                               a.fch_gelu + sg.r0 * FE, sg.n, FE, C_);
  }
  for (const Segment& sg : segments_) {
    if (sg.n == 0) continue;
    const ExpertTensors gt = expert(g, sg.x);
    be_.matmul_backward_weight(gt.fc_w, gt.fc_b, s.moe_dfch.data() + sg.r0 * FIE, xe + sg.r0 * C,
                               sg.n, C_, FIE);
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
