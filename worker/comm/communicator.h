// Collective operations over the ranks of one job.
//
// Every collective is numbered (1, 2, ...) in the order a rank issues it, which is the
// same order on every rank, and carries a short description ("grad bucket 2/5",
// "found_inf"). Every collective has a deadline: if it does not complete within the
// job's timeout, the rank works out which ranks never reached that collective, logs
// that report and aborts the whole job (see MpiCommunicator for the protocol), since
// no rank can safely go on past a collective its peers never joined.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard {

enum class ReduceOp { kSum, kMax, kMin };

// A communicator's set-up (not a collective: those abort the job, as above) that did
// not finish within the job's timeout.
class CollectiveTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective in flight. For a CPU tensor, Wait() returns once the result is in it.
// For a GPU tensor, Wait() returns once work queued afterwards on the caller's current
// stream will see the result; the host need not wait for the device.
class Work {
 public:
  virtual ~Work() = default;
  virtual void Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // The hostname rank `rank` runs on ("?" for no such rank).
  virtual std::string Host(int rank) const = 0;
  // How logs and reports name rank `rank`: "<host>:<rank>".
  std::string RankName(int rank) const { return Host(rank) + ":" + std::to_string(rank); }
  // The lowest rank on the host rank `rank` runs on.
  int FirstRankOnHost(int rank) const {
    for (int r = 0; r < rank; ++r)
      if (Host(r) == Host(rank)) return r;
    return rank;
  }

  // Starts an in-place all-reduce of a contiguous tensor. `tensor` must stay alive and
  // untouched until Wait() returns. Collectives start in call order.
  virtual std::shared_ptr<Work> AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) = 0;
  virtual std::shared_ptr<Work> BroadcastAsync(torch::Tensor tensor, int root, std::string what) = 0;

  void AllReduce(torch::Tensor tensor, ReduceOp op, std::string what) {
    AllReduceAsync(std::move(tensor), op, std::move(what))->Wait();
  }
  void Broadcast(torch::Tensor tensor, int root, std::string what) {
    BroadcastAsync(std::move(tensor), root, std::move(what))->Wait();
  }
  // A broadcast of a CPU tensor without the deadline, for ranks that wait for as long as
  // their root takes to decide (an elastic replica's ranks on its rank 0, which waits on
  // the quorum: Note [Elastic replica of several ranks] in worker/jobs/trainer_elastic.cc).
  // Its wait is not a hang: a root that dies takes the job down through its launcher.
  virtual void AwaitBroadcast(torch::Tensor tensor, int root, std::string what) = 0;
  // Every rank's `values` (same length on all ranks), rank-major: result[r][i].
  std::vector<std::vector<double>> AllGather(const std::vector<double>& values, std::string what);
  // Every rank's `bytes` (same length on all ranks), rank-major, exact.
  std::vector<std::vector<uint8_t>> AllGatherBytes(const std::vector<uint8_t>& bytes, std::string what);
  // True on every rank if `flag` is true on any rank.
  bool AnyTrue(bool flag, std::string what);
};

}  // namespace trainyard
