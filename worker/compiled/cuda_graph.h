// CUDA-graph capture of a forward pass, as benchmark cells and decode steps replay it:
// the tensors the function closes over are the graph's static inputs, so a replay
// recomputes the function on whatever they hold then. Compiled with CUDA only
// (TRAINYARD_WITH_CUDA).
#pragma once

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <functional>
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

}  // namespace trainyard
