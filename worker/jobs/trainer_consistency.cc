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
}

bool Trainer::AgreeOnFoundInf(bool local_found_inf) {
  if (!scaler_->enabled() || !ranks_.comm) return local_found_inf;
  // Every rank must step or skip together, or their weights and scales drift apart.
  return ranks_.comm->AnyTrue(local_found_inf, StrFormat("found_inf of step %ld", long(progress_.global_step + 1)));
}

void Trainer::CheckConsistency() {
  uint64_t hash = kFnv1aOffset;
  for (const auto& p : params_) {
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
