// The kernel API of pipetrain: every backend (kernels/host, kernels/cuda) implements these.
// Pointers live in the backend's memory space. Nothing here knows about MPI.
//
// Letters: B = batch (micro-batch), T = sequence, C = channels (d_model), V = vocab,
// NH = heads, HS = C / NH, N = rows = B*T, OC = output channels of a Linear.
// Linear weights are (OC, C) as in PyTorch's nn.Linear: out = inp @ w^T + bias.
// Every "backward" function ACCUMULATES into its gradient outputs (+=) unless it says "writes",
// so gradients of several micro-batches sum without extra passes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pt::ops {

// ---- backend control ------------------------------------------------------------------------
// Name of the BLAS this build calls ("openblas", "blis", ...).
const char* blas_name();
// Threads the BLAS may use (one rank per core: 1).
void set_blas_threads(int n);

// ---- embedding ------------------------------------------------------------------------------
// out (B,T,C) writes = wte[tokens] + wpe[t]; tokens (B,T); wte (V,C); wpe (T_max>=T, C).
// Vocabulary-parallel form: wte holds rows [v_begin, v_end) of the table; tokens outside add
// nothing; wpe may be null (one tensor-parallel rank adds the positions).
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, int v_begin = 0, int v_end = 1 << 30);
// dwte (rows [v_begin, v_end)) += scatter of dout; dwpe (T,C) += sum over B of dout (if not null)
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, int v_begin = 0, int v_end = 1 << 30);

// ---- layer norm (eps 1e-5) ------------------------------------------------------------------
// out (N,C) writes; mean, rstd (N) write
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C);
// dinp (N,C) += input gradient
void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                              const float* mean, const float* rstd, int N, int C);
// dw, db (C) += weight gradients
void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C);

// ---- linear ---------------------------------------------------------------------------------
// out (N,OC) writes = inp (N,C) @ w (OC,C)^T + bias (OC); bias may be null
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                    int OC);
// dinp (N,C) += dout (N,OC) @ w (OC,C)
void matmul_backward_input(float* dinp, const float* dout, const float* w, int N, int C, int OC);
// dw (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout; dbias may be null
void matmul_backward_weight(float* dw, float* dbias, const float* dout, const float* inp, int N,
                            int C, int OC);

// ---- causal self-attention ------------------------------------------------------------------
// qkv (B,T,3C): rows q,k,v, heads contiguous inside each. out (B,T,C) writes;
// att (B,NH,T,T) writes the softmax probabilities (upper triangle zero).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) += ; scratch holds T*T floats; att from the forward.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

// ---- elementwise ----------------------------------------------------------------------------
// GELU, tanh approximation. out (n) writes.
void gelu_forward(float* out, const float* inp, std::size_t n);
// dinp (n) writes = dout * gelu'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);
// out (n) writes = a + b
void add(float* out, const float* a, const float* b, std::size_t n);
// acc (n) += x
void accumulate(float* acc, const float* x, std::size_t n);
// x (n) writes 0
void zero(float* x, std::size_t n);
// x (n) *= s
void scale(float* x, float s, std::size_t n);
// sum of x[i]^2 in double
double sum_squares(const float* x, std::size_t n);

// ---- loss -----------------------------------------------------------------------------------
// logits (N,V) -> probs (N,V) writes (softmax); losses (N) writes -log p[target].
// probs may alias logits.
void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V);
// dlogits (N,V) writes = (probs - onehot(target)) * dloss   (dloss = d total / d loss_i);
// dlogits may alias probs. Vocabulary-parallel: the V columns are vocabulary rows
// [v_begin, v_begin + V); a target outside that range has no column here.
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V, int v_begin = 0);

// Pieces of a vocabulary-parallel cross-entropy: each rank holds V columns of the logits and the
// caller all-reduces between the steps (the max by MAX; target logit and exp-sum by SUM).
// mx (N) writes = row max of x (N,V)
void row_max(float* mx, const float* x, int N, int V);
// z (N) writes = x[n, target - v_begin] when the target is in this rank's range, else 0
void gather_target(float* z, const float* x, const int32_t* targets, int N, int V, int v_begin);
// p (N,V) writes = exp(x - mx) (p may alias x); sum (N) writes = row sums of p
void softmax_exp(float* p, float* sum, const float* x, const float* mx, int N, int V);
// p (N,V) /= sum; losses (N) writes = log(sum) + mx - z_target
void crossentropy_finish(float* losses, float* p, const float* sum, const float* mx,
                         const float* z_target, int N, int V);

// ---- optimizer ------------------------------------------------------------------------------
// One AdamW step on n parameters (decoupled decay: p -= lr*wd*p before the Adam update).
// grad_scale multiplies g first (grad-norm clipping); beta1_t = beta1^t, beta2_t = beta2^t.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  double beta1_t, beta2_t;
};
void adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                  const AdamWStep& s);

} // namespace pt::ops
