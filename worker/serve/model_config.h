// What a model version looks like to Triton's model-configuration extension
// (GET /v2/models/<model>[/versions/<v>]/config, gRPC ModelConfig): a subset of Triton's
// ModelConfig, filled from the version's files and the serve job, the same for both
// transports. It describes; nothing reads it back.
//
// Shapes follow Triton's convention for a model that batches (max_batch_size > 0): dims
// leave out the batch dimension. TEXT and label are one value per row, which Triton can
// only write as dims [1] with an empty reshape: TEXT may come as [N] or [N, 1]; label
// comes back as [N], as the model metadata says.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "worker/serve/model_repository.h"

namespace trainyard {

struct TensorConfig {
  std::string name;
  std::string data_type;  // Triton's DataType name: TYPE_STRING, TYPE_INT64, TYPE_FP32
  std::vector<int64_t> dims;
  bool scalar_per_row = false;  // reshape: { shape: [] }
  bool optional = false;
};

struct ModelConfigView {
  std::string name, platform, backend;
  int max_batch_size = 0;
  std::vector<TensorConfig> inputs, outputs;
  std::vector<int> preferred_batch_sizes;
  uint64_t max_queue_delay_us = 0;
  std::map<std::string, std::string> parameters;  // our batching knobs Triton has no field for
};

ModelConfigView DescribeModel(const VersionMeta& meta, const ServeSpec& spec);

}  // namespace trainyard
