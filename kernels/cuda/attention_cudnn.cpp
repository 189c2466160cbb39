// cuDNN's fused attention through the cudnn-frontend graph API (attention_cudnn.hpp). Its own
// translation unit: the frontend's headers are large and slow to compile. The graph wiring
// follows cudnn-frontend's documented SDPA samples (Graph::sdpa, Graph::sdpa_backward).
#include "cuda/attention_cudnn.hpp"

#include <stdexcept>
#include <string>

#if PT_HAVE_CUDNN
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#endif

namespace pt::cuda_ops::cudnn_attention {

#if PT_HAVE_CUDNN

namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

enum Uid : std::int64_t {
  q_uid = 1,
  k_uid,
  v_uid,
  o_uid,
  stats_uid,
  dout_uid,
  dq_uid,
  dk_uid,
  dv_uid
};

struct Shape {
  std::int64_t B, T, C, NH;
  std::int64_t HS() const { return C / NH; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(HS())); }
  auto key() const { return std::make_tuple(B, T, C, NH); }
};

struct State {
  cudnnHandle_t handle = nullptr;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>,
           std::shared_ptr<Graph>>
      forward, backward;
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
};

State& state() {
  static State s;
  return s;
}

void check(fe::error_t e, const char* what) {
  if (e.is_bad()) {
    throw std::runtime_error(std::string("cuDNN attention: ") + what + ": " + e.get_message());
  }
}

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuDNN attention: ") + what + ": " +
                             cudnnGetErrorString(s));
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("cuDNN attention: ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

cudnnHandle_t handle(cudaStream_t stream) {
  State& s = state();
  if (s.handle == nullptr) check(cudnnCreate(&s.handle), "cudnnCreate");
  check(cudnnSetStream(s.handle, stream), "cudnnSetStream");
  return s.handle;
}

// The (B, NH, T, HS) view of the heads in rows of `row` elements (the packed qkv: 3C; the
// output and its gradient: C), each head's HS elements contiguous.
void as_heads(fe::graph::Tensor_attributes& t, const Shape& s, std::int64_t row) {
  t.set_dim({s.B, s.NH, s.T, s.HS()}).set_stride({s.T * row, s.HS(), row, 1});
}

Tensor heads(Graph& g, const char* name, Uid uid, const Shape& s, std::int64_t row) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  as_heads(t, s, row);
  return g.tensor(t);
}

// Each score row's log-sum-exp, (B, NH, T, 1) fp32.
void as_stats(fe::graph::Tensor_attributes& t, const Shape& s) {
  t.set_data_type(fe::DataType_t::FLOAT)
      .set_dim({s.B, s.NH, s.T, 1})
      .set_stride({s.NH * s.T, s.T, 1, 1});
}

std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

Graph& forward_graph(const Shape& s, cudnnHandle_t h) {
  std::shared_ptr<Graph>& slot = state().forward[s.key()];
  if (slot) return *slot;
  auto g = new_graph();
  const std::int64_t C3 = 3 * s.C;
  const Tensor q = heads(*g, "q", q_uid, s, C3), k = heads(*g, "k", k_uid, s, C3),
               v = heads(*g, "v", v_uid, s, C3);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale());
  auto [o, stats] = g->sdpa(q, k, v, options);
  o->set_output(true).set_uid(o_uid);
  as_heads(*o, s, s.C);
  stats->set_output(true).set_uid(stats_uid);
  as_stats(*stats, s);
  check(g->build(h, {fe::HeurMode_t::A}), "building the forward graph");
  slot = g;
  return *g;
}

Graph& backward_graph(const Shape& s, cudnnHandle_t h) {
  std::shared_ptr<Graph>& slot = state().backward[s.key()];
  if (slot) return *slot;
  auto g = new_graph();
  const std::int64_t C3 = 3 * s.C;
  const Tensor q = heads(*g, "q", q_uid, s, C3), k = heads(*g, "k", k_uid, s, C3),
               v = heads(*g, "v", v_uid, s, C3), o = heads(*g, "o", o_uid, s, s.C),
               dout = heads(*g, "dout", dout_uid, s, s.C);
  fe::graph::Tensor_attributes st;
  st.set_name("stats").set_uid(stats_uid);
  as_stats(st, s);
  const Tensor stats = g->tensor(st);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention backward")
                     .set_causal_mask(true)
                     .set_attn_scale(s.scale())
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  dq->set_output(true).set_uid(dq_uid);
  dk->set_output(true).set_uid(dk_uid);
  dv->set_output(true).set_uid(dv_uid);
  for (const Tensor& d : {dq, dk, dv}) as_heads(*d, s, C3);
  check(g->build(h, {fe::HeurMode_t::A}), "building the backward graph");
  slot = g;
  return *g;
}

// Runs a built graph with its workspace, grown in stream order (no device-wide wait).
void run(Graph& g, cudnnHandle_t h, std::unordered_map<std::int64_t, void*>& pack,
         cudaStream_t stream, const char* what) {
  State& st = state();
  std::int64_t bytes = 0;
  check(g.get_workspace_size(bytes), what);
  if (bytes > st.workspace_bytes) {
    if (st.workspace != nullptr) check(cudaFreeAsync(st.workspace, stream), "cudaFreeAsync");
    st.workspace = nullptr;
    check(cudaMallocAsync(&st.workspace, static_cast<std::size_t>(bytes), stream),
          "cudaMallocAsync (workspace)");
    st.workspace_bytes = bytes;
  }
  check(g.execute(h, pack, st.workspace), what);
}

// q, k and v of the packed rows at qkv16: the same rows, C bf16 values apart.
void* part(const void* qkv16, std::int64_t C, int i) {
  return static_cast<char*>(const_cast<void*>(qkv16)) + 2 * C * i;
}

} // namespace

bool compiled() {
  return true;
}

bool supports(int B, int T, int C, int NH, void* queue) {
  const Shape s{B, T, C, NH};
  static std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>, bool> known;
  const auto it = known.find(s.key());
  if (it != known.end()) return it->second;
  bool ok = true;
  try {
    const cudnnHandle_t h = handle(static_cast<cudaStream_t>(queue));
    forward_graph(s, h);
    backward_graph(s, h);
  } catch (const std::exception&) {
    ok = false;
  }
  known[s.key()] = ok;
  return ok;
}

void forward(void* o16, float* stats, const void* qkv16, int B, int T, int C, int NH, void* queue) {
  const auto stream = static_cast<cudaStream_t>(queue);
  const Shape s{B, T, C, NH};
  const cudnnHandle_t h = handle(stream);
  Graph& g = forward_graph(s, h);
  std::unordered_map<std::int64_t, void*> pack{{q_uid, part(qkv16, C, 0)},
                                               {k_uid, part(qkv16, C, 1)},
                                               {v_uid, part(qkv16, C, 2)},
                                               {o_uid, o16},
                                               {stats_uid, stats}};
  run(g, h, pack, stream, "forward");
}

void backward(void* dqkv16, const void* qkv16, const void* o16, const void* dout16,
              const float* stats, int B, int T, int C, int NH, void* queue) {
  const auto stream = static_cast<cudaStream_t>(queue);
  const Shape s{B, T, C, NH};
  const cudnnHandle_t h = handle(stream);
  Graph& g = backward_graph(s, h);
  std::unordered_map<std::int64_t, void*> pack{{q_uid, part(qkv16, C, 0)},
                                               {k_uid, part(qkv16, C, 1)},
                                               {v_uid, part(qkv16, C, 2)},
                                               {o_uid, const_cast<void*>(o16)},
                                               {dout_uid, const_cast<void*>(dout16)},
                                               {stats_uid, const_cast<float*>(stats)},
                                               {dq_uid, part(dqkv16, C, 0)},
                                               {dk_uid, part(dqkv16, C, 1)},
                                               {dv_uid, part(dqkv16, C, 2)}};
  run(g, h, pack, stream, "backward");
}

void finalize() {
  State& s = state();
  s.forward.clear();
  s.backward.clear();
  if (s.workspace != nullptr) cudaFree(s.workspace);
  if (s.handle != nullptr) cudnnDestroy(s.handle);
  s = State{};
}

#else // built without cuDNN or the cudnn-frontend headers

namespace {
// set_attention refuses "cudnn" in such a build and supports() is false, so no call comes here
[[noreturn]] void absent() {
  throw std::logic_error("cuDNN attention called in a build without it");
}
} // namespace

bool compiled() {
  return false;
}
bool supports(int, int, int, int, void*) {
  return false;
}
void forward(void*, float*, const void*, int, int, int, int, void*) {
  absent();
}
void backward(void*, const void*, const void*, const void*, const float*, int, int, int, int,
              void*) {
  absent();
}
void finalize() {}

#endif

} // namespace pt::cuda_ops::cudnn_attention
