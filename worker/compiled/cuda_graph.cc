#include "worker/compiled/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>

namespace trainyard {
namespace {

// Autocast's weight-cast cache off for the capture (the graph must hold the casts), and
// back as it was afterwards, whatever happens.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_;
};

// Runs one call of `forward` under capture into `graph`. If it throws, the capture is
// ended (and dropped) before the exception goes on: a stream left capturing would turn
// every later use of it into an error, and the allocator would go on routing memory to
// the capture's pool.
void CaptureOneCall(at::cuda::CUDAGraph& graph, const std::function<void()>& call, at::cuda::MempoolId_t pool) {
  AutocastCacheOff cache_off;
  // Thread-local: other threads may go on using CUDA meanwhile (a serving model
  // process captures a new version's graphs while the old version serves).
  graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  try {
    call();
  } catch (...) {
    try {
      graph.capture_end();
    } catch (...) {  // an invalidated capture fails to end; the stream is out of capture either way
    }
    throw;
  }
  graph.capture_end();
}

}  // namespace

std::function<torch::Tensor()> CaptureCudaGraph(const std::function<torch::Tensor()>& forward,
                                                const torch::Device& device, at::cuda::MempoolId_t pool,
                                                std::optional<c10::cuda::CUDAStream> capture_stream) {
  auto graph = std::make_shared<at::cuda::CUDAGraph>();
  c10::cuda::CUDAStream side = capture_stream ? *capture_stream : c10::cuda::getStreamFromPool(false, device.index());
  // The inputs may still be in flight on the current stream.
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
  inputs_ready.block(side);
  torch::Tensor output;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) forward();
    side.synchronize();
    CaptureOneCall(
        *graph, [&] { output = forward(); }, pool);
  }
  side.synchronize();
  return [graph, output] {
    graph->replay();
    return output;
  };
}

std::shared_ptr<at::cuda::CUDAGraph> CaptureWithoutRunning(const std::function<void()>& step,
                                                           at::cuda::MempoolId_t pool, c10::cuda::CUDAStream stream) {
  auto graph = std::make_shared<at::cuda::CUDAGraph>();
  c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(stream.device_index());
  // Work queued before on the caller's stream (the inputs' copies) comes first.
  at::cuda::CUDAEvent before;
  before.record(caller);
  before.block(stream);
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    CaptureOneCall(*graph, step, pool);
  }
  return graph;
}

}  // namespace trainyard
