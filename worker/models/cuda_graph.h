// CUDA-graph capture of a forward pass, as benchmark cells and decode steps replay it:
// the tensors the function closes over are the graph's static inputs, so a replay
// recomputes the function on whatever they hold then. Compiled with CUDA only
// (TRAINYARD_WITH_CUDA).
#pragma once

#include <torch/torch.h>

#include <functional>

namespace trainyard {

// Runs `forward` a few times on a side stream (so lazy initialisation stays out of the
// graph), captures one call, and returns a function that replays the capture and
// returns its output tensor (the same storage every time). Autocast state must be set
// inside `forward`; its weight-cast cache is off during capture, so the graph holds
// the casts. REQUIRES: `forward` works on tensors of `device`, a CUDA device.
std::function<torch::Tensor()> CaptureCudaGraph(const std::function<torch::Tensor()>& forward,
                                                const torch::Device& device);

}  // namespace trainyard
