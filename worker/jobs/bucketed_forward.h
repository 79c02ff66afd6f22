// A classifier's forward pass at a fixed set of bucket shapes: how the serving model
// process runs a model on a GPU.
//
// On a GPU a forward pass of a small batch is a few hundred short kernels, and
// launching them costs more than running them. A CUDA graph launches them all at
// once, but a graph is captured for one shape. So a model is given buckets (R, S), the
// shapes its warm-up runs, and a batch [rows, seq] runs in the smallest bucket with
// R >= rows and S >= seq (smallest by R x S). Its ids and mask are copied into the
// bucket's buffers, whose other positions hold the pad id with mask 0, and the
// bucket's logits are cut back to `rows`. A padded row keeps its first position
// unmasked, so no row attends over nothing. Masked positions take no part in another
// position's result, so the logits equal those of the batch's own shape up to the order
// of floating-point sums. A batch no bucket holds runs eagerly at its own shape.
//
// With cuda_graphs, Warm() captures each bucket's pass once and Forward() replays it.
// The buckets share one memory pool, since their replays never overlap: a replay may
// overwrite another bucket's output, so Forward() copies each output out at once.
// Every pass runs on a CUDA stream the object creates for itself (a stream per model
// instance), so a version being loaded and warmed up does not queue behind the one
// serving, nor the serving one behind it; the buckets are captured on it too. Without
// CUDA graphs (and on the CPU) the same buckets run eagerly, which is how the padding
// rule is tested where no GPU is; serving uses the class only with graphs.
//
// Not thread-safe: one thread warms the object up, then one thread at a time runs it.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"
#include "worker/models/model.h"

namespace trainyard {

class BucketedForward {
 public:
  // REQUIRES: `model` is an eval-mode classifier on its device, with a pad id >= 0 (a
  // GPT-2 classifier finds each row's last token from it). cuda_graphs needs the model
  // on a CUDA device (std::invalid_argument otherwise).
  BucketedForward(Model model, std::vector<std::pair<int64_t, int64_t>> shapes, Precision precision, bool cuda_graphs);
  ~BucketedForward();
  BucketedForward(const BucketedForward&) = delete;
  BucketedForward& operator=(const BucketedForward&) = delete;

  // Runs each bucket twice (capturing its graph, with cuda_graphs) and returns the
  // second pass's milliseconds per bucket, in the order of the shapes given.
  std::vector<double> Warm();
  // ids, mask: int64 [rows, seq] on the CPU. Returns float logits [rows, labels] on the CPU.
  torch::Tensor Forward(const torch::Tensor& ids, const torch::Tensor& mask);
  // The bucket a batch runs in, or -1 when none holds it (for tests and logs).
  int BucketFor(int64_t rows, int64_t seq) const;

  struct StreamState;  // the CUDA stream and graph pool; defined where there is CUDA

 private:
  struct Bucket {
    int64_t rows, seq;
    torch::Tensor ids, mask;             // on the model's device; the graph's inputs
    std::function<torch::Tensor()> run;  // the pass on ids and mask (a replay, with graphs)
  };
  torch::Tensor Eager(const torch::Tensor& ids, const torch::Tensor& mask);
  torch::Tensor RunBucket(Bucket& bucket, const torch::Tensor& ids, const torch::Tensor& mask);

  Model model_;
  Precision precision_;
  bool cuda_graphs_;
  torch::Device device_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<StreamState> cuda_;  // null on the CPU
};

}  // namespace trainyard
