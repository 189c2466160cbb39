#include "comm/p2p.hpp"

#include <cstring>

#include "bf16.hpp"
#include "util/errors.hpp"

namespace pt {

using schedule::Op;

PipeTransport::PipeTransport(MPI_Comm pp, const schedule::Schedule& sched, int me,
                             const Watchdog& watchdog,
                             std::vector<std::unique_ptr<cuda::NcclLink>> links, std::size_t n,
                             bool bf16)
    : pp_(pp), sched_(sched), me_(me), watchdog_(watchdog), links_(std::move(links)), n_(n),
      bf16_(bf16) {
  // tags must fit the MPI implementation's upper bound
  int* tag_ub = nullptr;
  int flag = 0;
  PT_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag));
  const long long max_tag = 2LL * sched.m * sched.stages();
  if (flag && max_tag > *tag_ub) {
    throw input_error("parallel.micro_batches * pp * virtual_stages is too large for this MPI's "
                      "message tags (" +
                      std::to_string(max_tag) + " > MPI_TAG_UB " + std::to_string(*tag_ub) +
                      "): use fewer, larger micro-batches");
  }
  for (const auto& l : links_) nccl_ = nccl_ || l != nullptr;
  if (!nccl_) return;
  // which link carries each message, and the order each link delivers in
  const std::vector<schedule::Channel> channels = schedule::channels(sched);
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const schedule::Channel& c = channels[i];
    if (c.from == me_) nccl_send_link_[{c.grad ? 1 : 0, c.to}] = i;
    if (c.to != me_) continue;
    for (const schedule::Channel::Message& msg : c.messages) {
      nccl_receives_.emplace_back(i, Msg{c.grad ? 1 : 0, msg.mb, msg.chunk});
    }
  }
}

int PipeTransport::tag(int dir, int mb, int sender_stage) const {
  return (mb * sched_.stages() + sender_stage) * 2 + dir;
}

PipeTransport::Handle PipeTransport::isend(const float* x, int dir, int mb, int chunk, int peer,
                                           bool consume) {
  Handle h;
  const int t = tag(dir, mb, sched_.stage_of(me_, chunk)), n = static_cast<int>(n_);
  if (bf16_) {
    void* w = nullptr;
    if (consume) { // in place: value i's 2 bytes land on floats already read (i/2 <= i)
      w = const_cast<float*>(x);
      auto* b = static_cast<unsigned char*>(w); // bytes, so the two views may alias
      for (std::size_t i = 0; i < n_; ++i) {
        float v = 0.0f;
        std::memcpy(&v, b + 4 * i, 4);
        const std::uint16_t packed = bf16::from_float(v);
        std::memcpy(b + 2 * i, &packed, 2);
      }
    } else {
      if (free_.empty()) {
        free_.push_back(static_cast<int>(pool_.size()));
        pool_.emplace_back(n_);
      }
      h.wire = free_.back();
      free_.pop_back();
      std::uint16_t* p = pool_[static_cast<std::size_t>(h.wire)].data();
      bf16::pack(p, x, n_);
      w = p;
    }
    PT_MPI(MPI_Isend(w, n, MPI_UINT16_T, peer, t, pp_, &h.req));
  } else {
    PT_MPI(MPI_Isend(x, n, MPI_FLOAT, peer, t, pp_, &h.req));
  }
  bytes_sent_ += n_ * (bf16_ ? 2 : 4);
  return h;
}

PipeTransport::Handle PipeTransport::irecv(float* x, int dir, int mb, int chunk, int peer) {
  const int st = sched_.stage_of(me_, chunk);
  const int t = tag(dir, mb, dir == 0 ? st - 1 : st + 1), n = static_cast<int>(n_);
  Handle h;
  if (bf16_) { // packed into the first half of x, widened in place by wait()
    PT_MPI(MPI_Irecv(x, n, MPI_UINT16_T, peer, t, pp_, &h.req));
    h.unpack_to = x;
  } else {
    PT_MPI(MPI_Irecv(x, n, MPI_FLOAT, peer, t, pp_, &h.req));
  }
  return h;
}

PipeTransport::Handle PipeTransport::receive(const schedule::Action& a, float* x) {
  return irecv(x, a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk, a.peer);
}

std::map<PipeTransport::Msg, PipeTransport::Handle>
PipeTransport::receive_step(const std::vector<schedule::Action>& actions,
                            const std::function<float*(const Msg&)>& buffer, bool over_mpi) {
  std::map<Msg, Handle> posted;
  if (nccl_ && !over_mpi) {
    for (auto& l : links_) {
      if (l != nullptr) l->restart();
    }
    for (const auto& [link, msg] : nccl_receives_) {
      Handle& h = posted[msg];
      h.link = link;
      h.k = links_[link]->recv(buffer(msg), n_);
    }
    return posted;
  }
  for (const schedule::Action& a : actions) {
    if (a.op != Op::RECV_ACT && a.op != Op::RECV_GRAD) continue;
    const Msg msg{a.op == Op::RECV_ACT ? 0 : 1, a.mb, a.chunk};
    posted[msg] = irecv(buffer(msg), std::get<0>(msg), a.mb, a.chunk, a.peer);
  }
  return posted;
}

PipeTransport::Handle PipeTransport::start_send(const float* x, int dir, int mb, int chunk,
                                                int peer, bool over_mpi, bool consume) {
  if (!nccl_ || over_mpi) return isend(x, dir, mb, chunk, peer, consume);
  Handle h;
  h.link = nccl_send_link_.at({dir, peer});
  h.k = links_[h.link]->send(x, n_);
  bytes_sent_ += n_ * sizeof(float);
  return h;
}

double PipeTransport::wait(Handle& h, const std::string& what) const {
  if (h.k < 0) {
    const double waited = watchdog_.wait(h.req, what);
    if (h.unpack_to != nullptr) { // from the end: value i's float covers packed values >= i
      auto* b = reinterpret_cast<unsigned char*>(h.unpack_to); // bytes: the views alias
      for (std::size_t i = n_; i-- > 0;) {
        std::uint16_t packed = 0;
        std::memcpy(&packed, b + 2 * i, 2);
        const float v = bf16::to_float(packed);
        std::memcpy(b + 4 * i, &v, 4);
      }
      h.unpack_to = nullptr;
    }
    if (h.wire >= 0) {
      free_.push_back(h.wire);
      h.wire = -1;
    }
    return waited;
  }
  cuda::NcclLink& link = *links_[h.link];
  const int k = h.k;
  return watchdog_.wait_until([&link, k] { return link.done(k); }, what);
}

} // namespace pt
