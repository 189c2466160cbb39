// NCCL pipeline links between two ranks (kernels/cuda/nccl.hpp, comm.gpu_p2p), each rank on a
// GPU of its own: a link 0 -> 1 and a link 1 -> 0 in flight at once. Each rank queues every
// receive of a round before it sends, the sends follow the backend's ops on the data (a scaling
// queued just before), and rank 1 asks about its receives last one first. Every message must
// arrive whole, exact and in its link's order, in two rounds (restart() reuses the events).
// Exits 77 (CTest: skipped) on both ranks unless two GPUs and NCCL are there.
#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_query.hpp"
#include "cuda/nccl.hpp"
#include "cuda/ops_cuda.hpp"

namespace co = pt::cuda_ops;

namespace {

// The value of element j of message i in round r, times the scaling the sender applies.
float value(int r, std::size_t i, std::size_t j) {
  return static_cast<float>(static_cast<int>(i) * 1000 + static_cast<int>(j % 997) + r);
}

struct Message {
  std::size_t n;
  float* data; // device memory
};

std::vector<Message> make(const std::vector<std::size_t>& sizes) {
  std::vector<Message> out;
  for (std::size_t n : sizes) {
    out.push_back({n, static_cast<float*>(co::alloc(n * sizeof(float)))});
  }
  return out;
}

// Sends each message on `link` after scaling it by `factor` on the backend's stream.
void send_all(pt::cuda::NcclLink& link, std::vector<Message>& msgs, int round, float factor) {
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    std::vector<float> host(msgs[i].n);
    for (std::size_t j = 0; j < host.size(); ++j) host[j] = value(round, i, j);
    co::to_device(msgs[i].data, host.data(), host.size() * sizeof(float));
    co::scale(msgs[i].data, factor, msgs[i].n);
    if (link.send(msgs[i].data, msgs[i].n) != static_cast<int>(i)) {
      throw std::runtime_error("a send's number is not its place in the round");
    }
  }
}

// Waits for message k of `link` (at most 60 s) and checks it; returns the failures.
int check(pt::cuda::NcclLink& link, int k, const Message& m, int round, float factor,
          const char* what) {
  const double t0 = MPI_Wtime();
  while (!link.done(k)) {
    if (MPI_Wtime() - t0 > 60.0) {
      std::printf("FAIL: %s message %d of round %d did not arrive in 60 s\n", what, k, round);
      return 1;
    }
  }
  std::vector<float> got(m.n);
  co::to_host(got.data(), m.data, m.n * sizeof(float));
  for (std::size_t j = 0; j < m.n; ++j) {
    const float want = value(round, static_cast<std::size_t>(k), j) * factor;
    if (got[j] != want) {
      std::printf("FAIL: %s message %d of round %d, element %zu: %g, expected %g\n", what, k, round,
                  j, got[j], want);
      return 1;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string why;
  const int gpus = pt::cuda::compiled() ? pt::cuda::device_count(why) : 0;
  if (size != 2 || gpus < 2 || !pt::cuda::nccl_compiled()) {
    if (rank == 0) {
      std::printf("SKIP: needs 2 ranks, 2 GPUs and NCCL (ranks %d, GPUs %d%s%s)\n", size, gpus,
                  why.empty() ? "" : ": ", why.c_str());
    }
    MPI_Finalize();
    return 77;
  }
  int failures = 0;
  try {
    pt::cuda::start(rank, "fp32");
    { // the links go before the backend does
      // link A: 0 -> 1, id made by rank 0; link B: 1 -> 0, id made by rank 1; made in that order
      pt::cuda::NcclId a{}, b{};
      if (rank == 0) a = pt::cuda::nccl_unique_id();
      MPI_Bcast(a.data(), static_cast<int>(a.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
      pt::cuda::NcclLink to_one(a, rank == 0);
      if (rank == 1) b = pt::cuda::nccl_unique_id();
      MPI_Bcast(b.data(), static_cast<int>(b.size()), MPI_CHAR, 1, MPI_COMM_WORLD);
      pt::cuda::NcclLink to_zero(b, rank == 1);
      std::vector<Message> a_msgs = make({1000, (std::size_t{1} << 20) + 3, 3, 777});
      std::vector<Message> b_msgs = make({5000, 17});
      for (int round = 0; round < 2; ++round) {
        to_one.restart();
        to_zero.restart();
        if (rank == 0) {
          for (Message& m : b_msgs) to_zero.recv(m.data, m.n);
          send_all(to_one, a_msgs, round, 2.0f);
          for (int k = 0; k < static_cast<int>(b_msgs.size()); ++k) {
            failures += check(to_zero, k, b_msgs[static_cast<std::size_t>(k)], round, 3.0f, "1->0");
          }
          for (int k = 0; k < static_cast<int>(a_msgs.size()); ++k) { // the sends have left
            failures += check(to_one, k, a_msgs[static_cast<std::size_t>(k)], round, 2.0f, "0->1");
          }
        } else {
          for (Message& m : a_msgs) to_one.recv(m.data, m.n);
          send_all(to_zero, b_msgs, round, 3.0f);
          for (int k = static_cast<int>(a_msgs.size()) - 1; k >= 0; --k) {
            failures += check(to_one, k, a_msgs[static_cast<std::size_t>(k)], round, 2.0f, "0->1");
          }
          for (int k = 0; k < static_cast<int>(b_msgs.size()); ++k) {
            failures += check(to_zero, k, b_msgs[static_cast<std::size_t>(k)], round, 3.0f, "1->0");
          }
        }
        MPI_Barrier(MPI_COMM_WORLD); // the next round overwrites the buffers
      }
      for (Message& m : a_msgs) co::release(m.data);
      for (Message& m : b_msgs) co::release(m.data);
    }
    co::finalize();
  } catch (const std::exception& e) {
    std::printf("FAIL: rank %d: %s\n", rank, e.what());
    ++failures;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("%s: two NCCL links in flight at once, 2 rounds of 4 + 2 messages\n",
                failures == 0 ? "PASS" : "FAIL");
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
