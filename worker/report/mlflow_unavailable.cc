// MLflow in a build without libcurl (the GPU machine's bundle carries none): a job that
// asks for log.mlflow is told so before it trains.
#include <stdexcept>

#include "worker/report/mlflow_logger.h"

namespace trainyard {

bool MlflowAvailable() { return false; }

std::unique_ptr<MetricSink> OpenMlflow(const MlflowOptions&) {
  throw std::runtime_error("this worker was built without libcurl, so it cannot log to MLflow");
}

}  // namespace trainyard
