// The epoch table a person reads, drawn from epochs.csv's header and lines: the worker
// prints it as epochs end, `jobctl logs` prints the same from the coordinator's rows.
//   epoch  time_s  steps  ms/step  samples/s  data_wait%  train_loss  eval_loss  eval_acc
//   lr  loss_scale  comm%  slowest (host:rank and its ms per step)  replicas (an elastic
//   run's quorum sizes over the epoch: "3", or "2-3, 2 changes")
#pragma once

#include <string>
#include <vector>

namespace trainyard {

std::string EpochTableHeader();
// One row from the cells of an epochs.csv line under `header` (its column names); a
// column the line lacks shows "-".
std::string EpochTableRow(const std::vector<std::string>& header, const std::vector<std::string>& cells);

}  // namespace trainyard
