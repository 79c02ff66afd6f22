// CUDA-graph capture of a forward pass, as benchmark cells and decode steps replay it:
// the tensors the function closes over are the graph's static inputs, so a replay
// recomputes the function on whatever they hold then. Compiled with CUDA only
// (TRAINYARD_WITH_CUDA).
#pragma once

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>

namespace trainyard {

// Runs `forward` a few times on a side stream (so lazy initialisation stays out of the
// graph), captures one call, and returns a function that replays the capture and
// returns its output tensor (the same storage every time). Autocast must be on for the
// calls, set inside `forward` or around this call on the same thread (its state is
// thread-local); its weight-cast cache is off during capture, so the graph holds the
// casts. REQUIRES: `forward` works on tensors of `device`, a CUDA device.
// `pool`: a memory pool from at::cuda::graph_pool_handle() that several graphs share
// (their intermediates then reuse the same memory), or {0, 0} for a private one. Graphs
// sharing a pool must never replay concurrently, and a replay may overwrite the output
// of another graph of the pool: consume each output before the next replay. The
// allocator reuses a freed block only on the stream that allocated it, so graphs share
// a pool's memory only when captured on one stream: pass it as `capture_stream`.
// Without one, the warm-up and capture run on a stream from torch's pool, which other
// threads may be handed too: only a single-threaded caller should rely on that.
// If `forward` throws during the capture, the capture is ended and the error goes on.
std::function<torch::Tensor()> CaptureCudaGraph(const std::function<torch::Tensor()>& forward,
                                                const torch::Device& device, at::cuda::MempoolId_t pool = {0, 0},
                                                std::optional<c10::cuda::CUDAStream> capture_stream = std::nullopt);

// Captures one call of `step` into a graph on `stream`, from `pool`, without running
// it: nothing it captures has happened until the graph is replayed. For a training
// step, whose every run changes the weights, so that it cannot be warmed up as a
// forward pass is: the caller runs `step` eagerly on `stream` at least once before
// (lazy initialisation and the allocator's first blocks stay out of the graph), and
// replays the graph for the step itself. Host-side effects of `step` (bookkeeping,
// .grad pointers) do happen during the capture. Ends the capture if `step` throws.
std::shared_ptr<at::cuda::CUDAGraph> CaptureWithoutRunning(const std::function<void()>& step,
                                                           at::cuda::MempoolId_t pool, c10::cuda::CUDAStream stream);

}  // namespace trainyard
