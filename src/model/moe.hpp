// Routing one micro-batch's tokens to their experts (docs/moe.md): Mixtral's router (softmax over
// the expert logits, the top k, their weights renormalised over the chosen), an optional capacity
// per expert, the shared experts every token goes to, and the router's auxiliary losses with
// their gradients. Host code on plain arrays; the same inputs give the same bits on every layout.
#pragma once

#include <vector>

namespace pt::moe {

// Where a micro-batch's N tokens go. A token has k routed slots (its experts by falling
// probability) and S shared slots (shared expert s is expert E + s). The experts' input rows are
// gathered by expert: expert x (routed 0..E-1, then shared) reads rows [start[x], start[x+1]),
// its tokens in token order.
struct Routing {
  int N = 0, E = 0, k = 0, S = 0;
  std::vector<int> expert;   // (N*k) the routed experts of each token
  std::vector<float> weight; // (N*k) their weights: probabilities over the k chosen ones' sum
  std::vector<int> row;      // (N*(k+S)) each slot's gathered row; -1: dropped (capacity)
  std::vector<int> token;    // (rows) the token of each gathered row
  std::vector<int> start;    // (E+S+1)
  std::vector<int> assigned; // (E) routed slots of each expert before the capacity
  std::vector<int> kept;     // (E) after it
  long dropped = 0;          // routed slots over an expert's capacity
  int slots() const { return k + S; }
  int rows() const { return start.back(); }
};

// x (N,E) logits become softmax probabilities (in double, rounded once); lse (N) writes each
// row's log-sum-exp.
void softmax_rows(float* x, float* lse, int N, int E);

// The routing of N tokens from their probabilities (N,E). capacity_factor 0: dropless; else each
// expert keeps at most ceil(capacity_factor * N * k / E) slots, the earliest tokens first.
void route(Routing& r, const float* probs, int N, int E, int k, int S, double capacity_factor);

// The load-balancing loss of one MoE layer and micro-batch (Switch Transformer, Mixtral's
// load_balancing_loss_func): E * sum_e f_e P_e, f_e = assigned[e] / N, P_e the mean probability
// of e; and the router z-loss: the mean over tokens of lse^2.
double balance_loss(const Routing& r, const float* probs);
double z_loss(const float* lse, int N);

// dlogits (N,E) writes the router logits' gradient: from dweight (N*k, the routed weights'
// gradients; 0 for dropped slots) through the renormalisation and the softmax, plus
// scale * aux_coef * balance_loss's and scale * z_coef * z_loss's (scale: d objective / d a
// micro-batch's auxiliary loss).
void router_backward(float* dlogits, const Routing& r, const float* probs, const float* lse,
                     const float* dweight, double aux_coef, double z_coef, double scale);

} // namespace pt::moe
