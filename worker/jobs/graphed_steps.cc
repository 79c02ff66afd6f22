#include "worker/jobs/graphed_steps.h"

#include <array>
#include <map>
#include <stdexcept>
#include <utility>

#include "common/log.h"

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "worker/compiled/cuda_graph.h"
#endif

namespace trainyard {

#ifdef TRAINYARD_WITH_CUDA

namespace {

// What is queued on `from` so far comes before what is queued on `to` next.
void Order(c10::cuda::CUDAStream from, c10::cuda::CUDAStream to) {
  at::cuda::CUDAEvent event;
  event.record(from);
  event.block(to);
}

StepResult Copied(const StepResult& result) {
  return {result.loss.clone(), result.found_inf.defined() ? result.found_inf.clone() : torch::Tensor()};
}

}  // namespace

struct GraphedSteps::Impl {
  struct Shape {
    int runs = 0;
    Batch inputs;  // static: the graph reads these tensors
    std::shared_ptr<at::cuda::CUDAGraph> graph;
    StepResult outputs;  // in the pool: valid until the next replay of any shape
  };

  explicit Impl(torch::Device d)
      : device(d), stream(c10::cuda::getStreamFromPool(false, d.index())), pool(at::cuda::graph_pool_handle()) {
    const auto options = torch::TensorOptions(torch::kFloat).device(d);
    controls.device = {torch::zeros({1}, options), torch::ones({1}, options), torch::zeros({1}, options),
                       torch::zeros({1}, options)};
  }

  // The host's values into the static tensors, on the caller's stream: each fill_ takes
  // its value as a kernel argument, so nothing host-side must outlive the launch.
  void SetControls(const StepControls& host) {
    controls.lr = host.lr;
    controls.loss_weight = host.loss_weight;
    controls.stop_vote = host.stop_vote;
    controls.plant_inf = host.plant_inf;
    controls.device.lr.fill_(host.lr);
    controls.device.loss_weight.fill_(host.loss_weight);
    controls.device.stop_vote.fill_(host.stop_vote ? 1.0 : 0.0);
    controls.device.plant_inf.fill_(host.plant_inf ? 1.0 : 0.0);
  }

  Shape& ShapeOf(const Batch& batch) {
    Shape& shape = shapes[KeyOf(batch)];
    FillInputs(shape.inputs, batch);
    return shape;
  }

  // Rows, padded length, and the packed token count of a batch the host packed (-1 for
  // a padded one): each needs its own graph.
  using Key = std::array<int64_t, 3>;
  static Key KeyOf(const Batch& batch) {
    return {batch.input_ids.size(0), batch.input_ids.size(1),
            batch.packing.defined() ? batch.packing.index.size(0) : -1};
  }

  // The batch into a shape's static inputs (made on first use), on the caller's stream.
  static void FillInputs(Batch& inputs, const Batch& batch) {
    if (!inputs.input_ids.defined())
      inputs = {torch::empty_like(batch.input_ids),
                torch::empty_like(batch.attention_mask),
                torch::empty_like(batch.labels),
                0,
                {}};
    if (batch.packing.defined() && !inputs.packing.defined())
      inputs.packing = {torch::empty_like(batch.packing.index), torch::empty_like(batch.packing.starts),
                        batch.packing.batch, batch.packing.seq};
    inputs.input_ids.copy_(batch.input_ids);
    inputs.attention_mask.copy_(batch.attention_mask);
    inputs.labels.copy_(batch.labels);
    if (batch.packing.defined()) {
      inputs.packing.index.copy_(batch.packing.index);
      inputs.packing.starts.copy_(batch.packing.starts);
    }
    inputs.real_tokens = batch.real_tokens;
  }

  // The shape's first step: eager, on the capture stream, so that what the step sets up
  // on first use is in place (and its memory out of the pool) before the capture.
  StepResult RunEagerly(Shape& shape, const Step& step) {
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    Order(caller, stream);
    StepResult result;
    {
      c10::cuda::CUDAStreamGuard guard(stream);
      result = step(shape.inputs, controls);
    }
    Order(stream, caller);
    return Copied(result);
  }

  void Capture(Shape& shape, const Step& step) {
    try {
      shape.graph = CaptureWithoutRunning([&] { shape.outputs = step(shape.inputs, controls); }, pool, stream);
    } catch (const std::exception& e) {
      throw std::runtime_error(
          StrFormat("capturing the training step of batch shape %ldx%ld%s as a CUDA graph failed "
                    "(train.cuda_graph: false steps eagerly): %s",
                    long(shape.inputs.input_ids.size(0)), long(shape.inputs.input_ids.size(1)),
                    shape.inputs.packing.defined()
                        ? StrFormat(" (%ld tokens packed)", long(shape.inputs.packing.index.size(0))).c_str()
                        : "",
                    e.what()));
    }
  }

  torch::Device device;
  c10::cuda::CUDAStream stream;  // every capture (and first run) is on it, so the graphs share the pool
  at::cuda::MempoolId_t pool;
  StepControls controls;  // with the static device tensors
  std::map<Key, Shape> shapes;
  // Evaluation: per shape, its static inputs and the replay of its pass.
  struct Pass {
    Batch inputs;
    std::function<torch::Tensor()> replay;
  };
  std::map<Key, Pass> passes;
};

GraphedSteps::GraphedSteps(torch::Device device) {
  if (!device.is_cuda()) throw std::runtime_error("GraphedSteps: CUDA graphs need a CUDA device, not " + device.str());
  impl_ = std::make_unique<Impl>(device);
}

StepResult GraphedSteps::Run(Batch& batch, const StepControls& controls, const Step& step) {
  Impl& m = *impl_;
  m.SetControls(controls);
  Impl::Shape& shape = m.ShapeOf(batch);
  if (++shape.runs == 1) return m.RunEagerly(shape, step);
  if (!shape.graph) m.Capture(shape, step);
  shape.graph->replay();
  return Copied(shape.outputs);
}

torch::Tensor GraphedSteps::Evaluate(Batch& batch, const Pass& pass) {
  Impl& m = *impl_;
  auto& [inputs_in_place, replay] = m.passes[Impl::KeyOf(batch)];
  Impl::FillInputs(inputs_in_place, batch);
  if (!replay) {
    Batch* inputs = &inputs_in_place;  // std::map keeps it in place
    replay = CaptureCudaGraph([inputs, pass] { return pass(*inputs); }, m.device, m.pool, m.stream);
  }
  return replay().clone();
}

void GraphedSteps::OnStepStream(const std::function<void()>& fn) {
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  Order(caller, impl_->stream);
  {
    c10::cuda::CUDAStreamGuard guard(impl_->stream);
    fn();
  }
  Order(impl_->stream, caller);
}

size_t GraphedSteps::graphs() const {
  size_t n = 0;
  for (const auto& [key, shape] : impl_->shapes) n += shape.graph ? 1 : 0;
  return n;
}

#else  // without CUDA

struct GraphedSteps::Impl {};

GraphedSteps::GraphedSteps(torch::Device device) {
  throw std::runtime_error("GraphedSteps: this build has no CUDA code paths (device " + device.str() + ")");
}

StepResult GraphedSteps::Run(Batch&, const StepControls&, const Step&) {
  throw std::logic_error("GraphedSteps::Run without CUDA");
}

torch::Tensor GraphedSteps::Evaluate(Batch&, const Pass&) {
  throw std::logic_error("GraphedSteps::Evaluate without CUDA");
}

void GraphedSteps::OnStepStream(const std::function<void()>&) {
  throw std::logic_error("GraphedSteps::OnStepStream without CUDA");
}

size_t GraphedSteps::graphs() const { return 0; }

#endif

GraphedSteps::~GraphedSteps() = default;

}  // namespace trainyard
