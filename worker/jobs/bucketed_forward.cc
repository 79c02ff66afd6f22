#include "worker/jobs/bucketed_forward.h"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "worker/train/amp.h"

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "worker/compiled/cuda_graph.h"
#endif

namespace trainyard {

#ifdef TRAINYARD_WITH_CUDA
// A stream created for this object alone, not one of torch's pooled streams, which go
// round to whoever asks: a pooled one could be the stream another thread is serving on
// while this object captures. Every bucket is captured on it, so their shared pool's
// memory is reused from one capture to the next.
struct BucketedForward::StreamState {
  explicit StreamState(c10::DeviceIndex device) : stream(Create(device)), pool(at::cuda::graph_pool_handle()) {}
  ~StreamState() {
    stream.synchronize();
    cudaStreamDestroy(stream.stream());
  }
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  static c10::cuda::CUDAStream Create(c10::DeviceIndex device) {
    c10::cuda::CUDAGuard on_device(device);
    cudaStream_t raw = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    return c10::cuda::getStreamFromExternal(raw, device);
  }

  c10::cuda::CUDAStream stream;
  at::cuda::MempoolId_t pool;
};
#else
struct BucketedForward::StreamState {};
#endif

namespace {

// Makes the object's own stream current for the scope (nothing on the CPU).
class OwnStream {
 public:
  explicit OwnStream([[maybe_unused]] BucketedForward::StreamState* state) {
#ifdef TRAINYARD_WITH_CUDA
    if (state) guard_.emplace(state->stream);
#endif
  }

 private:
#ifdef TRAINYARD_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
#endif
};

}  // namespace

BucketedForward::BucketedForward(Model model, std::vector<std::pair<int64_t, int64_t>> shapes, Precision precision,
                                 bool cuda_graphs)
    : model_(std::move(model)),
      precision_(precision),
      cuda_graphs_(cuda_graphs),
      device_(model_->parameters().front().device()) {
  const int64_t pad_id = model_->info().pad_id;
  if (pad_id < 0) throw std::invalid_argument("bucketed passes need the model's pad id (config.json pad_token_id)");
  if (cuda_graphs_ && !device_.is_cuda())
    throw std::invalid_argument("CUDA graphs need the model on a CUDA device, not " + device_.str());
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda()) cuda_ = std::make_unique<StreamState>(device_.index());
#endif
  OwnStream on(cuda_.get());
  const auto options = torch::TensorOptions(torch::kLong).device(device_);
  for (const auto& [rows, seq] : shapes)
    buckets_.push_back({rows, seq, torch::full({rows, seq}, pad_id, options), torch::zeros({rows, seq}, options), {}});
}

BucketedForward::~BucketedForward() = default;

int BucketedForward::BucketFor(int64_t rows, int64_t seq) const {
  int best = -1;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    if (b.rows < rows || b.seq < seq) continue;
    if (best < 0 || b.rows * b.seq < buckets_[size_t(best)].rows * buckets_[size_t(best)].seq) best = int(i);
  }
  return best;
}

std::vector<double> BucketedForward::Warm() {
  torch::NoGradGuard no_grad;
  OwnStream on(cuda_.get());
  std::vector<double> ms;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& bucket = buckets_[i];
    bucket.mask.select(1, 0).fill_(1);  // a valid input for the passes before the first batch
    auto pass = [this, i] {
      AutocastScope autocast(device_.type(), precision_);
      return model_->forward(buckets_[i].ids, buckets_[i].mask).to(torch::kFloat);
    };
#ifdef TRAINYARD_WITH_CUDA
    if (cuda_graphs_) bucket.run = CaptureCudaGraph(pass, device_, cuda_->pool, cuda_->stream);
#endif
    if (!bucket.run) bucket.run = pass;
    bucket.run().to(torch::kCPU);  // the first pass of a shape allocates; time the second
    const auto start = std::chrono::steady_clock::now();
    bucket.run().to(torch::kCPU);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return ms;
}

torch::Tensor BucketedForward::Forward(const torch::Tensor& ids, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  OwnStream on(cuda_.get());
  const int index = BucketFor(ids.size(0), ids.size(1));
  if (index < 0 || !buckets_[size_t(index)].run) return Eager(ids, mask);
  return RunBucket(buckets_[size_t(index)], ids, mask);
}

torch::Tensor BucketedForward::Eager(const torch::Tensor& ids, const torch::Tensor& mask) {
  AutocastScope autocast(device_.type(), precision_);
  return model_->forward(ids.to(device_), mask.to(device_)).to(torch::kFloat).to(torch::kCPU).contiguous();
}

torch::Tensor BucketedForward::RunBucket(Bucket& bucket, const torch::Tensor& ids, const torch::Tensor& mask) {
  const int64_t rows = ids.size(0), seq = ids.size(1);
  bucket.ids.fill_(model_->info().pad_id);
  bucket.mask.zero_();
  bucket.ids.narrow(0, 0, rows).narrow(1, 0, seq).copy_(ids);
  bucket.mask.narrow(0, 0, rows).narrow(1, 0, seq).copy_(mask);
  if (rows < bucket.rows) bucket.mask.narrow(0, rows, bucket.rows - rows).select(1, 0).fill_(1);
  return bucket.run().narrow(0, 0, rows).to(torch::kCPU).contiguous();
}

}  // namespace trainyard
