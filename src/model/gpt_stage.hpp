// The part of the GPT (docs/design.md section 5) that one pipeline stage holds, with its parameters
// and gradients in one flat buffer each, and forward / backward-input / backward-weight per block
// so that zero-bubble schedules can run the two halves of the backward at different times.
//
// B = micro-batch, T = seq_len, C = d_model, NH = heads, V = vocab, N = B*T. Under tensor
// parallelism the shapes of sharded buffers are this tp rank's: Ct = C/tp attention channels,
// NH/tp heads, F = 4C/tp MLP width, V/tp vocabulary rows (the probs buffer is (N, V/tp)).
// R = rows of the residual stream here: N, or N/tp with sequence parallelism, where this tp rank
// holds rows [rank*R, (rank+1)*R) of every (N,C) residual-stream buffer (marked (R,C) below).
#pragma once

#include <array>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "comm/group_reducer.hpp"
#include "config/run_config.hpp"
#include "model/activations.hpp"
#include "model/moe.hpp"
#include "model/param_layout.hpp"
#include "util/buffer.hpp"

namespace pt {

// Pointers to one transformer block's tensors inside a flat buffer (parameters or gradients).
struct BlockTensors {
  float* ln1_w;  // (C)
  float* ln1_b;  // (C)
  float* qkv_w;  // (3C, C)
  float* qkv_b;  // (3C)
  float* proj_w; // (C, C)
  float* proj_b; // (C)
  float* ln2_w;  // (C)
  float* ln2_b;  // (C)
  float* fc_w;   // (4C, C)
  float* fc_b;   // (4C)
  float* fcp_w;  // (C, 4C)
  float* fcp_b;  // (C)
  // MoE layers (docs/moe.md): fc_w.. fcp_b are the E routed experts' stacks; the router; the
  // shared experts' stacks (null: none)
  float* router_w;     // (E, C)
  float* shared_fc_w;  // (S, FIE, C)
  float* shared_fc_b;  // (S, FE)
  float* shared_fcp_w; // (S, C, FE)
  float* shared_fcp_b; // (S, C)
};

// One expert's tensors inside a block's stacks (biases null for llama).
struct ExpertTensors {
  float *fc_w, *fc_b, *fcp_w, *fcp_b;
};

// What the MoE layers of a stage routed since the last take_moe_stats(), for metrics.jsonl:
// per MoE layer of the stage (in layer order) the routed slots each expert was chosen for (before
// its capacity) and the dropped ones; the sum over micro-batches of the weighted auxiliary losses
// (balance and z).
struct MoeStats {
  std::vector<int> layers;     // the stage's MoE layers
  std::vector<double> tokens;  // (layers x E)
  std::vector<double> dropped; // (layers)
  double aux = 0.0;
};

// Non-block tensors (null when the stage does not hold them).
struct EdgeTensors {
  float* wte = nullptr;     // (V, C)
  float* wpe = nullptr;     // (T, C)
  float* lnf_w = nullptr;   // (C)
  float* lnf_b = nullptr;   // (C)
  float* lm_head = nullptr; // (V, C): wte when tied
};

// The tensor-parallel group a stage belongs to (size 1: no tensor parallelism).
struct TpGroup {
  int rank = 0;
  int size = 1;
  // the group's sums and maxima on the stage's backend memory (comm/reducers.hpp: MPI, host-staged
  // MPI or NCCL, under the hang watchdog); owned by the trainer, needed when size > 1
  GroupReducer* reduce = nullptr;
  // parallel.sequence_parallel: the residual stream, its norms and the pipeline messages on
  // N/size rows per rank; reduce-scatter and all-gather in place of the all-reduces
  bool sequence_parallel = false;
};

class Alltoaller;

// The expert-parallel group a stage belongs to (parallel.ep; size 1: every expert here): the
// stage holds experts [rank * E/size, (rank+1) * E/size) of each MoE layer and exchanges its
// tokens' rows with the group through `exchange` (comm/alltoall.hpp; owned by the trainer), in
// every forward and backward-input of an MoE layer, so every rank of the group runs the same
// MoE layers in the same order (dp replicas run one schedule).
struct EpGroup {
  int rank = 0;
  int size = 1;
  Alltoaller* exchange = nullptr;
};

class GptStage {
public:
  // With tp.size > 1 the stage holds its tp rank's shard (docs/tensor-parallel.md): heads
  // NH/tp, MLP width 4C/tp, vocabulary V/tp; all-reduces in tp.reduce run inside forward and
  // backward-input. Every buffer lives in `backend`'s memory and every op runs there; each public
  // call has finished its work when it returns, so the host (MPI, checkpoints) may then touch
  // the buffers.
  // recompute (train.recompute): selective keeps no attention probabilities per micro-batch and
  // recomputes them in the backward; full keeps each block's output (the next block's input)
  // only and recomputes the block's forward in the backward (in the backward-weight half too).
  // Every number stays bit-identical to none.
  // format: bf16 rounds every activation and activation gradient the stage stores to bfloat16
  // (docs/precision.md); the residual sums inside a block, the weights and their gradients stay
  // fp32.
  GptStage(const ModelConfig& model, const StageSpec& stage, int micro_batch, TpGroup tp = {},
           const Backend& backend = host_backend(), Recompute recompute = Recompute::none,
           ActFormat format = ActFormat::fp32, EpGroup ep = {});

  const ParamLayout& layout() const { return layout_; }
  const StageSpec& spec() const { return spec_; }
  const ModelConfig& model() const { return model_; }
  const Backend& backend() const { return be_; }
  int micro_batch() const { return B_; }
  // Rows of the residual stream (and of pipeline messages) this rank holds: R.
  int rows() const { return R_; }
  float* params() { return params_.data(); }
  // The weights forward and backward compute with: params() unless use_weights named another
  // buffer of num_params() floats in the backend's memory (PipeDream-2BW's older version);
  // null returns to params().
  void use_weights(float* w) { weights_ = w; }
  float* grads() { return grads_.data(); }
  std::size_t num_params() const { return layout_.total(); }

  // Fills the parameters per docs/design.md section 5 from (seed, tensor name, index): the same
  // values whatever the layout.
  void init_parameters(std::uint64_t seed);
  void zero_grads();

  // With tied embeddings the head's gradient of wte is kept apart while micro-batches run, so
  // that every layout adds the embedding's and the head's share exactly once, in one order:
  // call after the last micro-batch. A stage holding both adds them; a last stage without the
  // embedding puts the head's share in its wte gradient (the engine then sums it with the first
  // stage's over the embedding group).
  void fold_tied_head_grad();
  // Whether this stage counts tensor t in the global gradient norm (each tensor exactly once
  // across stages: the head stage's copy of a tied wte is not counted).
  bool owns(const ParamTensor& t) const { return !(t.role == Role::wte && !spec_.first); }
  // Whether this rank adds t to the norm: owned, and sharded or (if replicated) tp rank 0.
  bool counts_in_norm(const ParamTensor& t) const {
    return owns(t) && (t.shard_dim >= 0 || tp_.rank == 0);
  }
  const TpGroup& tp() const { return tp_; }
  int ep_rank() const { return ep_.rank; }
  // Sequence parallelism: the norms' gradients are sums over this rank's rows only; sums them
  // over the tp group (after the step's last backward). Without it, nothing to do.
  void sum_sequence_parallel_grads();

  StageActivations make_activations() const;
  // Stash for the split backward: one BlockStash per block (or only one when `blocks` is 1).
  StageStash make_stash(std::size_t blocks) const;
  StageStash make_stash() const { return make_stash(spec_.layer_end - spec_.layer_begin); }
  // Makes backward()'s own stash now rather than at its first call (the pipeline engine makes
  // every buffer of a step before the step: docs/cuda.md, comm.gpu_p2p).
  void prepare_backward();

  // Forward one micro-batch. First stage reads a.tokens, others a.input. Last stage reads
  // a.targets and returns the mean loss over the micro-batch's tokens; others return 0. With a
  // training step's loss_scale (not 0) the last stage also starts the backward: the
  // cross-entropy writes d logits at once (without tp), and the backward takes them as they are.
  float forward(StageActivations& a, float loss_scale = 0.0f);

  // Backward of one micro-batch, both halves at once (least memory). `dout` (N,C) is the
  // gradient of the stage output (ignored on the last stage, where the loss starts it; there
  // `loss_scale` = d(total loss)/d(token loss)). Writes the stage input's gradient to d_input
  // (N,C) when not null. Gradients accumulate into grads().
  void backward(StageActivations& a, const float* dout, float loss_scale, float* d_input);

  // The same backward in two halves. backward_input fills s (and s.d_input); dout must stay
  // alive until backward_weight has run.
  void backward_input(StageActivations& a, const float* dout, float loss_scale, StageStash& s);
  void backward_weight(StageActivations& a, StageStash& s);

  // What the MoE layers routed in the training forwards (loss_scale != 0) since the last call.
  MoeStats take_moe_stats();

  // Called with the layer's index after each block's weight gradients are computed (backward
  // and backward_weight), for starting their reduction early; empty: none.
  void set_weight_grad_hook(std::function<void(int)> hook) { weight_grad_hook_ = std::move(hook); }

private:
  void find_tensors(); // fills block_offsets_ and edge_offsets_
  BlockTensors block(float* base, int layer) const;
  EdgeTensors edges(float* base) const;
  const float* block_input(const StageActivations& a, int i) const;

  StageShapes shapes() const;
  void block_forward(int i, const float* x, const BlockView& a);
  // The activations block i's backward reads: its own, or (full) ws_.work with them recomputed.
  // Where block i's activations are while it runs (full recompute, bf16: the working copy's
  // buffers for what is not kept or kept packed); last: the stage's last block.
  BlockView view(BlockActivations& kept, bool last);
  // bf16: the working copy's stored tensors into the kept ones, packed; and back, widened (all
  // but the block's output, which no backward reads: the next block reads it as its input).
  void pack(BlockActivations& kept, bool last);
  void unpack(BlockActivations& kept);
  BlockView for_backward(int i, const float* x, BlockActivations& kept, bool last);
  // A Linear's input gradient (w: its weight, n_in -> n_out features); with dw set, its weight
  // and bias gradients from the same dout and its input inp too, in one call.
  // inp16: inp's packed copy, which the product then reads instead (BlockView); dinp null: the
  // weight gradients alone.
  void linear_backward(float* dinp, const float* dout, const float* w, int n_in, int n_out,
                       float* dw, float* dbias, const float* inp,
                       const std::uint16_t* inp16 = nullptr) const;
  // out (N, n_out) = x @ w^T + b for a product input x (N, n_in): with x16 set, x packed into
  // it first (x null: x16 holds it already) and the product reading that (packed_products_),
  // else x as stored.
  void linear_forward(float* out, const float* x, std::uint16_t* x16, const float* w,
                      const float* b, int n_in, int n_out) const;
  // The input gradients of block i (with_weights: its Linears' weight gradients too, from the
  // same products: the fused backward, which then calls block_backward_weight for the norms)
  void block_backward_input(int i, const float* x, const BlockView& a, const float* dout,
                            BlockStash& s, bool with_weights = false);
  // The weight gradients of block i: its Linears' (unless !linears) and its norms'
  void block_backward_weight(int i, const float* x, const BlockView& a, const BlockStash& s,
                             bool linears = true);
  void head_backward_input(StageActivations& a, float loss_scale, float* d_lnf, float* dx,
                           bool with_weights = false);
  void head_backward_weight(StageActivations& a, const float* d_lnf, bool linear = true);
  // Where the head's weight gradient goes: lm_head's, or (tied) head_grad_
  float* head_weight_grad();
  float* weights() { return weights_ != nullptr ? weights_ : params_.data(); }
  void tp_sum(float* x, std::size_t n, ActFormat wire = ActFormat::fp32) const;
  // A residual-stream buffer's whole (N,C) rows: itself, or (sp) gathered over tp into ws_.gath.
  const float* whole_rows(const float* x) const;
  // Where a product writes (N,C) partial sums that reduce_partial then sums over tp into dst:
  // dst itself (all-reduce in place), or (sp) ws_.part, reduce-scattered into dst's R rows.
  float* partial_for(float* dst) const { return sp_ ? ws_.part.data() : dst; }
  void reduce_partial(float* dst) const;
  // The whole rows of the residual-stream gradient x: x itself, or (sp) gathered into `whole`.
  const float* gather_into(FloatBuffer& whole, const float* x) const;
  void copy_floats(float* dst, const float* src, std::size_t n) const;
  // Where gpt2 and llama differ (gpt_stage_arch.cpp). The norms on R rows of C: LayerNorm with
  // its mean and bias, or llama's RMSNorm (mean and b unused, db not written).
  void norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                    const float* b) const;
  void norm_backward_input(float* dx, const float* d, const float* x, const float* w,
                           const float* mean, const float* rstd) const;
  void norm_backward_weight(float* dw, float* db, const float* d, const float* x, const float* mean,
                            const float* rstd) const;
  // qkv (N,QKV) after its product: llama turns the query and key heads by position (RoPE)
  void position_qkv(float* qkv) const;
  // The (N,3Ct) rows the attention reads: qkv, or (grouped-query) ws_.qkv_full, the key and value
  // heads repeated; attention_dqkv: where the attention's backward writes the gradient of those
  // rows, which finish_dqkv turns into d_qkv's (N,QKV): summed over the repeats, turned back.
  const float* attention_qkv(const float* qkv);
  float* attention_dqkv(float* d_qkv);
  void finish_dqkv(float* d_qkv);
  // The MLP's activation, a.fch (N,FI) into a.fch_gelu (N,F): GELU, or llama's SwiGLU, stored
  // (rounding fch as it reads it); and its backward. With a.fch16 set (gpt2, packed products),
  // one pass writes the packed fch and GELU output the products and the backward read instead.
  void mlp_activation(const BlockView& a) const;
  void mlp_activation_backward(float* d_fch, const BlockView& a, const float* dh) const;
  void layer_done(int layer) const; // runs the weight-gradient hook
  // An MoE layer's branch (gpt_stage_moe.cpp): a.ln2 routed to the experts, their weighted sum
  // into a.out; its backward from dout, the branch's gradient: d_ln2 writes, and the router's and
  // experts' weight gradients accumulate.
  ExpertTensors expert(const BlockTensors& w, int x) const;
  // The routing of the micro-batch at hand from a's probabilities, its tokens' rows gathered into
  // ws_.moe_x, and the segments of the rows this rank's experts compute; with ep > 1 the counts
  // of what each rank sends here: exchanged (the forward: exchange) or as the forward kept them.
  void moe_route(const BlockView& a, bool exchange = false);
  // ep > 1: this rank's tokens' rows (from, MR rows by expert) to its experts' order (to, XR
  // rows: the routed ones received source-major, then its tokens' shared-expert rows), the
  // routed ones through the ranks of their experts; back: the reverse. ep 1: nothing to do
  void moe_dispatch(const float* from, float* to, bool back);
  // The input rows this rank's experts read: received (ep > 1, kept for the backward) or
  // gathered here (ws_.moe_x)
  float* expert_inputs(const BlockView& a) const {
    return ep_.size > 1 ? a.moe_xe : ws_.moe_x.data();
  }
  int expert_rows() const; // the rows this rank's experts compute (the segments' end)
  void moe_forward(int layer, const BlockView& a);
  // with_weights false: the experts' and router's weight gradients are left to
  // moe_backward_weight, from what s keeps
  void moe_backward(int layer, const BlockView& a, const float* dout, float* d_ln2, BlockStash& s,
                    bool with_weights);
  void moe_backward_weight(int layer, const BlockView& a, const BlockStash& s);
  void init_moe();
  bool moe_layer(int i) const { return is_moe_layer(model_, spec_.layer_begin + i); }
  // x (n) as the activation format stores it: rounded to bfloat16 at bf16, untouched at fp32
  void stored(float* x, std::size_t n) const;
  void stored(FloatBuffer& x) const { stored(x.data(), x.size()); }
  // stored() for a tensor whose only readers are products and attention (and the packing, which
  // rounds): skipped where the backend's products round their inputs themselves (bf16_products)
  void product_input(float* x, std::size_t n) const {
    if (be_.bf16_products == nullptr || !be_.bf16_products()) stored(x, n);
  }

  ModelConfig model_;
  StageSpec spec_;
  std::function<void(int)> weight_grad_hook_;
  TpGroup tp_;
  const Backend& be_;
  Memory mem_; // be_'s allocator, for the buffers below and the activations
  // C = d_model, Ct = C/tp attention channels here, NH = heads here, F = MLP width here (4C/tp;
  // llama: ffn_hidden/tp), V = vocabulary rows here (V_total/tp), v0 = first of them; QKV and FI
  // the widths of the qkv and first MLP products, NKV the key/value heads, HD the head size
  int B_, T_, C_, Ct_, NH_, F_, V_, v0_, N_, R_, QKV_, FI_, NKV_, HD_;
  bool sp_, llama_;
  ParamLayout layout_;
  FloatBuffer params_;
  FloatBuffer grads_;
  float* weights_ = nullptr; // see use_weights
  Recompute recompute_;
  // bf16 on a backend whose products convert their inputs (bf16_products), no sequence
  // parallelism, activations kept: the four product inputs are packed as they are made and the
  // products read them packed, in the forward and in the backward (none is widened again)
  bool packed_products_ = false;
  // gpt2 with packed products: GELU writes fch and its output packed (BlockView::fch16)
  bool gelu_packed_ = false;
  ActFormat format_;
  bool qkv_in_att_ = false;   // att keeps a copy of qkv for the backward: qkv is not kept
  bool att16_ = false;        // bf16 and att holds the probabilities: they are stored in bf16 too
  mutable StageWorkspace ws_; // scratch shared by all micro-batches (activations.hpp)
  StageStash fused_;          // one block's stash, reused by backward() block after block
  FloatBuffer head_grad_;     // (V,C) the tied head's share of d wte (see fold_tied_head_grad)
  std::vector<float> losses_host_; // (N) a device backend's losses, read back by forward()
  // MoE layers: the routing of the micro-batch at hand (made again from the kept probabilities in
  // the backward); the statistics forward() adds to when counting (a training forward); the
  // backward's d objective / d a micro-batch's auxiliary loss (tokens * loss_scale)
  moe::Routing routing_;
  // The products of this rank's experts for the micro-batch at hand: expert x (local routed
  // 0..E/ep-1, then shared), its first row of the experts' rows and how many
  struct Segment {
    int x;
    std::size_t r0;
    int n;
  };
  std::vector<Segment> segments_;
  EpGroup ep_;
  int local_experts_ = 0; // E / ep
  // ep > 1: rows this rank's tokens send to each rank of the group, and by expert; rows this
  // rank's experts receive from each; the routed rows its experts compute
  std::vector<int> sends_, parts_, recvs_;
  std::size_t routed_in_ = 0;
  MoeStats moe_stats_;
  bool counting_ = false;
  double aux_scale_ = 0.0;
  // Found once, at construction: per block of the stage each role's offset in the flat buffers,
  // and the edge tensors' (kNone where the stage or the architecture has none). The step path
  // takes its pointers from here.
  using Offsets = std::array<std::size_t, kRoles>;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<Offsets> block_offsets_;
  Offsets edge_offsets_{};
};

} // namespace pt
