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

std::vector<std::vector<uint8_t>> Communicator::AllGatherBytes(const std::vector<uint8_t>& bytes, std::string what) {
  // The same zero-padded sum, over bytes: a byte plus zeros is that byte.
  const int64_t n = static_cast<int64_t>(bytes.size());
  torch::Tensor table = torch::zeros({size(), n}, torch::kByte);
  if (n > 0) table[rank()].copy_(torch::from_blob(const_cast<uint8_t*>(bytes.data()), {n}, torch::kByte));
  AllReduce(table, ReduceOp::kSum, std::move(what));
  std::vector<std::vector<uint8_t>> out(size());
  for (int r = 0; r < size(); ++r) {
    const uint8_t* row = table[r].data_ptr<uint8_t>();
    out[r].assign(row, row + n);
  }
  return out;
}

bool Communicator::AnyTrue(bool flag, std::string what) {
  torch::Tensor t = torch::full({1}, flag ? 1 : 0, torch::kInt);
  AllReduce(t, ReduceOp::kMax, std::move(what));
  return t.item<int>() != 0;
}

}  // namespace trainyard
