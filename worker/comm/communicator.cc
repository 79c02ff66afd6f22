#include "worker/comm/communicator.h"

namespace trainyard {

std::vector<std::vector<double>> Communicator::AllGather(const std::vector<double>& values, std::string what) {
  // A sum over zero-padded rows gathers without a dedicated collective.
  const int64_t n = static_cast<int64_t>(values.size());
  torch::Tensor table = torch::zeros({size(), n}, torch::kDouble);
  table[rank()].copy_(torch::tensor(values, torch::kDouble));
  AllReduce(table, ReduceOp::kSum, std::move(what));
  std::vector<std::vector<double>> out(size());
  for (int r = 0; r < size(); ++r)
    out[r] = std::vector<double>(table[r].data_ptr<double>(), table[r].data_ptr<double>() + n);
  return out;
}

bool Communicator::AnyTrue(bool flag, std::string what) {
  torch::Tensor t = torch::full({1}, flag ? 1 : 0, torch::kInt);
  AllReduce(t, ReduceOp::kMax, std::move(what));
  return t.item<int>() != 0;
}

}  // namespace trainyard
