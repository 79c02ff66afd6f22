// What keeps the Trainer's ranks in step: the same starting weights, the same decision
// to skip a step, and (distributed.check_consistency) a check that their weights agree.
#include "common/hash.h"
#include "common/log.h"
#include "worker/jobs/trainer.h"

namespace trainyard {

void Trainer::BroadcastParameters() {
  torch::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) ranks_.comm->Broadcast(item.value(), 0, "broadcast " + item.key());
  for (auto& item : model_->named_buffers()) ranks_.comm->Broadcast(item.value(), 0, "broadcast " + item.key());
  // The fp32 masters of bf16 weights (train.bf16_weights), restored from a checkpoint
  // or copied from the weights, hold more than the weights do.
  for (auto& [name, t] : optimizer_->StateTensors())
    if (name.rfind("master.", 0) == 0) ranks_.comm->Broadcast(t, 0, "broadcast " + name);
}

bool Trainer::StopIsPreemption() {
  if (ranks_.stop_signal) return true;  // a scheduler's signal reaches every rank
  // A coordinator's preemption reaches rank 0 only (Note [Stop agreement]): it tells the others.
  const bool mine = ranks_.hooks && ranks_.hooks->PreemptRequested();
  if (!ranks_.comm) return mine;
  torch::Tensor flag = torch::full({1}, mine ? 1.0f : 0.0f, torch::TensorOptions().device(device_));
  ranks_.comm->Broadcast(flag, 0, "whether the stop is a preemption");
  return flag.item<float>() > 0;
}

torch::Tensor Trainer::AgreeOnFoundInf(torch::Tensor local_found_inf) {
  if (!local_found_inf.defined() || !ranks_.comm) return local_found_inf;
  // Every rank must step or skip together, or their weights and scales drift apart. On
  // the device, so that no rank waits for its own flag (and a graph can hold it).
  ranks_.comm->AllReduce(local_found_inf, ReduceOp::kMax,
                         StrFormat("found_inf of step %ld", long(progress_.global_step + 1)));
  return local_found_inf;
}

void Trainer::CheckConsistency() {
  uint64_t hash = kFnv1aOffset;
  for (const auto& p : optimizer_->updated()) {  // the fp32 masters, where there are any
    torch::Tensor cpu = p.detach().to(torch::kCPU).contiguous();
    hash = Fnv1a(cpu.data_ptr(), cpu.numel() * cpu.element_size(), hash);
  }
  auto all = ranks_.comm->AllGather({double(hash >> 32), double(hash & 0xFFFFFFFFULL)},
                                    StrFormat("consistency check of step %ld", long(progress_.global_step + 1)));
  for (int r = 1; r < ranks_.world; ++r)
    if (all[r] != all[0])
      throw std::runtime_error(StrFormat("parameters diverged after step %ld: rank %d differs from rank 0",
                                         long(progress_.global_step + 1), r));
  ++consistency_checks_;
}

}  // namespace trainyard
