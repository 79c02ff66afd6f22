#include "worker/models/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>

namespace trainyard {

std::function<torch::Tensor()> CaptureCudaGraph(const std::function<torch::Tensor()>& forward,
                                                const torch::Device& device, at::cuda::MempoolId_t pool) {
  auto graph = std::make_shared<at::cuda::CUDAGraph>();
  auto output = std::make_shared<torch::Tensor>();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  // The inputs may still be in flight on the current stream.
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
  inputs_ready.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) forward();
    side.synchronize();
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    // Thread-local: other threads may go on using CUDA meanwhile (a serving model
    // process captures a new version's graphs while the old version serves).
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    *output = forward();
    graph->capture_end();
    at::autocast::set_autocast_cache_enabled(cache);
  }
  side.synchronize();
  return [graph, output] {
    graph->replay();
    return *output;
  };
}

}  // namespace trainyard
