// Our AdamW (ATen's fused kernel, two weight-decay groups) and ClipGradNorm against
// libtorch's own torch::optim::AdamW and torch::nn::utils::clip_grad_norm_, the
// per-tensor reference implementations in the same library, over many steps of a
// problem whose gradients change every step.
#include "worker/train/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "worker/train/amp.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/step_profiler.h"

namespace trainyard {
namespace {

struct Problem {
  std::vector<torch::Tensor> params;  // a matrix, an embedding-like table, a bias, a scale
  torch::Tensor input, target;
};

Problem MakeProblem(uint64_t seed) {
  torch::manual_seed(seed);
  Problem p;
  p.params = {torch::randn({16, 8}), torch::randn({50, 16}), torch::randn({16}), torch::ones({16})};
  for (auto& t : p.params) t.requires_grad_(true);
  p.input = torch::randn({32, 8});
  p.target = torch::randn({32, 16});
  return p;
}

// A loss touching every parameter, with a gradient that depends on the step.
void Backward(Problem& p, int step) {
  torch::Tensor h = torch::matmul(p.input * double(1 + step % 3), p.params[0].t()) + p.params[2];
  h = h * p.params[3] + p.params[1].index({torch::indexing::Slice(0, 32)});
  ((h - p.target).pow(2).mean() * 10.0).backward();
}

std::vector<std::pair<std::string, torch::Tensor>> Named(const Problem& p) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < p.params.size(); ++i) named.emplace_back("p" + std::to_string(i), p.params[i]);
  return named;
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  return diff;
}

TEST(AdamW, EqualsLibtorchAdamWWithDecayOnMatricesOnly) {
  Problem ours = MakeProblem(5), theirs = MakeProblem(5);
  const AdamWOptions o{0.9, 0.98, 1e-6, 0.05};
  AdamW optimizer(Named(ours), o);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{theirs.params[0], theirs.params[1]},
      std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1e-2).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{theirs.params[2], theirs.params[3]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 30; ++step) {
    const double lr = LrSchedule(ScheduleKind::kLinear, 1e-2, 0.1, 30).At(step);
    for (auto& group : reference.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    Backward(ours, step);
    Backward(theirs, step);
    optimizer.Step(lr);
    reference.step();
    optimizer.ZeroGrad();
    reference.zero_grad();
  }
  EXPECT_EQ(optimizer.step_count(), 30);
  EXPECT_LT(MaxDiff(ours.params, theirs.params), 1e-6);
  EXPECT_GT(MaxDiff(ours.params, MakeProblem(5).params), 1e-2);  // it did move them
}

TEST(AdamW, RestoredStateContinuesTheSameRun) {
  Problem straight = MakeProblem(9), resumed = MakeProblem(9);
  AdamW a(Named(straight), AdamWOptions{});
  for (int step = 0; step < 10; ++step) {
    Backward(straight, step);
    a.Step(1e-3);
    a.ZeroGrad();
  }
  // The second run restores the first's state after step 5, as a checkpoint would.
  AdamW b(Named(resumed), AdamWOptions{});
  Problem warm = MakeProblem(9);
  AdamW w(Named(warm), AdamWOptions{});
  for (int step = 0; step < 5; ++step) {
    Backward(warm, step);
    w.Step(1e-3);
    w.ZeroGrad();
  }
  std::map<std::string, torch::Tensor> state;
  for (auto& [name, t] : w.StateTensors()) state[name] = t.clone();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < warm.params.size(); ++i) resumed.params[i].copy_(warm.params[i]);
  }
  b.RestoreState(state, w.step_count());
  for (int step = 5; step < 10; ++step) {
    Backward(resumed, step);
    b.Step(1e-3);
    b.ZeroGrad();
  }
  EXPECT_EQ(MaxDiff(straight.params, resumed.params), 0.0);
  state.erase("exp_avg.p1");
  EXPECT_THROW(b.RestoreState(state, 5), std::runtime_error);
}

// The step a CUDA graph can hold decides the skip on the device: a set found_inf leaves
// every weight, moment and the step count as they were; a clear one is the plain step,
// bit for bit; and a rate given as a tensor is the rate given as a number.
TEST(AdamW, FoundInfOnTheDeviceSkipsTheStepAndAClearOneIsThePlainStep) {
  Problem plain = MakeProblem(5), flagged = MakeProblem(5);
  AdamW a(Named(plain), AdamWOptions{}), b(Named(flagged), AdamWOptions{});
  const torch::Tensor clear = torch::zeros({1}), set = torch::ones({1});
  const torch::Tensor lr = torch::full({1}, 1e-3, torch::kDouble);
  for (int step = 0; step < 6; ++step) {
    Backward(plain, step);
    Backward(flagged, step);
    a.Step(1e-3);
    if (step == 3) {
      // The skipped step: nothing moves, then the same gradients again, taken.
      std::vector<torch::Tensor> before;
      for (const auto& t : flagged.params) before.push_back(t.detach().clone());
      const auto moments = b.StateTensors();
      std::vector<torch::Tensor> moments_before;
      moments_before.reserve(moments.size());
      for (const auto& [name, t] : moments) moments_before.push_back(t.clone());
      b.Step(lr, set);
      EXPECT_EQ(MaxDiff(before, flagged.params), 0.0);
      for (size_t i = 0; i < moments.size(); ++i) EXPECT_TRUE(moments[i].second.equal(moments_before[i]));
      EXPECT_EQ(b.step_count(), 3);
    }
    b.Step(lr, clear);
    a.ZeroGrad();
    b.ZeroGrad();
    EXPECT_EQ(MaxDiff(plain.params, flagged.params), 0.0) << "step " << step;
  }
  EXPECT_EQ(b.step_count(), 6);
}

// The scaler's state lives on the device; its sequence follows torch.amp.GradScaler's
// rules (the reference comparison is tests/reference/scaler_parity.py).
// Master weights: bf16 parameters (a matrix and a bias; an fp32 scale beside them)
// trained through fp32 masters. The masters follow libtorch's own AdamW run in fp32 on
// the same gradients; each bf16 parameter is its master rounded, after every step.
struct LowProblem {
  std::vector<torch::Tensor> params;  // bf16 [16, 8], bf16 [16], fp32 [16]
  torch::Tensor input, target;
};

LowProblem MakeLowProblem(uint64_t seed) {
  torch::manual_seed(seed);
  LowProblem p;
  p.params = {torch::randn({16, 8}).to(torch::kBFloat16), torch::randn({16}).to(torch::kBFloat16), torch::ones({16})};
  for (auto& t : p.params) t.requires_grad_(true);
  p.input = torch::randn({32, 8});
  p.target = torch::randn({32, 16});
  return p;
}

// The loss in fp32 over the parameters' values: bf16 gradients for the bf16 ones.
void LowBackward(LowProblem& p, int step) {
  torch::Tensor h =
      torch::matmul(p.input * double(1 + step % 3), p.params[0].to(torch::kFloat).t()) + p.params[1].to(torch::kFloat);
  ((h * p.params[2] - p.target).pow(2).mean() * 10.0).backward();
}

std::vector<std::pair<std::string, torch::Tensor>> Named(const LowProblem& p) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < p.params.size(); ++i) named.emplace_back("p" + std::to_string(i), p.params[i]);
  return named;
}

std::vector<torch::Tensor> Masters(const AdamW& optimizer) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : optimizer.StateTensors())
    if (name.rfind("master.", 0) == 0) out.push_back(t);
  return out;
}

TEST(AdamW, Bf16ParametersTrainThroughFp32MastersAsLibtorchAdamWDoesInFp32) {
  LowProblem ours = MakeLowProblem(3);
  std::vector<torch::Tensor> theirs;
  for (const auto& t : ours.params) theirs.push_back(t.detach().to(torch::kFloat).clone().requires_grad_(true));
  const AdamWOptions o{0.9, 0.98, 1e-6, 0.05};
  AdamW optimizer(Named(ours), o);
  ASSERT_EQ(Masters(optimizer).size(), 2u);
  EXPECT_EQ(optimizer.updated()[2].data_ptr(), ours.params[2].data_ptr());  // fp32: no master
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{theirs[0]},
      std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1e-2).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{theirs[1], theirs[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 30; ++step) {
    LowBackward(ours, step);
    for (size_t i = 0; i < theirs.size(); ++i)
      theirs[i].mutable_grad() = ours.params[i].grad().to(torch::kFloat).clone();
    optimizer.TakeGradients();
    ClipGradNorm(optimizer.updated(), 1.0);
    torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    optimizer.Step(1e-2);
    reference.step();
    optimizer.ZeroGrad();
    reference.zero_grad();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(ours.params[i].scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(ours.params[i].equal(Masters(optimizer)[size_t(i)].to(torch::kBFloat16))) << "step " << step;
    }
  }
  std::vector<torch::Tensor> updated = Masters(optimizer);
  updated.push_back(ours.params[2]);
  EXPECT_LT(MaxDiff(updated, theirs), 1e-6);
  // The masters hold what bf16 cannot: steps of lr 1e-2 on values of order 1 round away.
  EXPECT_GT(MaxDiff(Masters(optimizer), {ours.params[0].to(torch::kFloat), ours.params[1].to(torch::kFloat)}), 1e-4);
  optimizer.ReleaseMasters();
  EXPECT_EQ(ours.params[0].scalar_type(), torch::kFloat);
  EXPECT_LT(MaxDiff(ours.params, theirs), 1e-6);
  EXPECT_TRUE(Masters(optimizer).empty());
}

TEST(AdamW, RestoredMastersContinueTheSameRun) {
  LowProblem straight = MakeLowProblem(7), warm = MakeLowProblem(7), resumed = MakeLowProblem(7);
  AdamW a(Named(straight), AdamWOptions{}), w(Named(warm), AdamWOptions{});
  for (int step = 0; step < 10; ++step) {
    LowBackward(straight, step);
    a.Step(1e-2);  // takes the gradients itself
    a.ZeroGrad();
    if (step >= 5) continue;
    LowBackward(warm, step);
    w.Step(1e-2);
    w.ZeroGrad();
  }
  // A checkpoint after step 5: the bf16 weights, and the state with its masters.
  std::map<std::string, torch::Tensor> state;
  for (auto& [name, t] : w.StateTensors()) state[name] = t.clone();
  ASSERT_EQ(state.count("master.p0") + state.count("master.p1") + state.count("master.p2"), 2u);
  AdamW b(Named(resumed), AdamWOptions{});
  {
    torch::NoGradGuard no_grad;  // the checkpoint's weights first, as LoadCheckpoint does
    for (size_t i = 0; i < warm.params.size(); ++i) resumed.params[i].copy_(warm.params[i]);
    resumed.params[0].add_(1.0);  // the bf16 ones come from the masters, whatever they held
  }
  b.RestoreState(state, w.step_count());
  for (size_t i = 0; i < warm.params.size(); ++i) EXPECT_TRUE(resumed.params[i].equal(warm.params[i]));
  for (int step = 5; step < 10; ++step) {
    LowBackward(resumed, step);
    b.Step(1e-2);
    b.ZeroGrad();
  }
  EXPECT_EQ(MaxDiff(straight.params, resumed.params), 0.0);
  EXPECT_EQ(MaxDiff(Masters(a), Masters(b)), 0.0);
  state.erase("master.p1");
  EXPECT_THROW(b.RestoreState(state, 5), std::runtime_error);
}

TEST(GradScaler, DeviceStateBacksOffOnInfAndGrowsAfterTheInterval) {
  LossScaleSpec spec;
  spec.init_scale = 1024;
  spec.growth_interval = 2;
  GradScaler scaler(spec, true);
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  auto step = [&](bool inf) {
    scaler.Scale((w * w).sum()).backward();
    if (inf) {
      torch::NoGradGuard no_grad;
      w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
    }
    torch::Tensor found_inf = scaler.UnscaleAndCheck({w});
    scaler.Update(found_inf);
    const bool skipped = found_inf.item<float>() != 0.0f;
    if (!inf) {
      EXPECT_TRUE(w.grad().equal(torch::full({3}, 2.0f)));  // unscaled: d(w.w)/dw = 2w
    }
    w.mutable_grad() = torch::Tensor();
    return skipped;
  };
  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.scale(), 2048.0f);  // two clean steps: grown
  EXPECT_TRUE(step(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);  // backed off
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  // A count from a job with a longer interval grows at the next clean step.
  scaler.Restore(512.0f, 7);
  EXPECT_FALSE(step(false));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  GradScaler off(spec, false);
  EXPECT_FALSE(off.UnscaleAndCheck({w}).defined());
}

TEST(ClipGradNorm, EqualsLibtorchClipGradNorm) {
  for (double max_norm : {0.01, 1.0, 1e6}) {
    Problem ours = MakeProblem(3), theirs = MakeProblem(3);
    Backward(ours, 0);
    Backward(theirs, 0);
    ClipGradNorm(ours.params, max_norm);
    torch::nn::utils::clip_grad_norm_(theirs.params, max_norm);
    for (size_t i = 0; i < ours.params.size(); ++i)
      EXPECT_TRUE(ours.params[i].grad().equal(theirs.params[i].grad())) << "max_norm " << max_norm << " param " << i;
  }
}

TEST(StepProfiler, SelfTimeExcludesNestedCallsOnTheSameThread) {
  // Thread 1: a [0, 100) holding b [10, 40) holding c [20, 30), and d [50, 60);
  // thread 2: a [0, 50) alone; a device kernel k [5, 15).
  std::vector<ProfiledEvent> events = {{"a", 1, 0, 100}, {"b", 1, 10, 40}, {"c", 1, 20, 30},
                                       {"d", 1, 50, 60}, {"a", 2, 0, 50},  {"k", 7, 5, 15, true}};
  std::vector<OperatorTime> rows = SelfTimes(events);
  auto find = [&](const std::string& name) {
    for (const auto& r : rows)
      if (r.name == name) return r;
    ADD_FAILURE() << "no row " << name;
    return OperatorTime{};
  };
  EXPECT_EQ(find("a").calls, 2);
  EXPECT_DOUBLE_EQ(find("a").self_ms, (60.0 + 50.0) / 1e6);  // 100 - 30 - 10, and 50
  EXPECT_DOUBLE_EQ(find("a").total_ms, 150.0 / 1e6);
  EXPECT_DOUBLE_EQ(find("b").self_ms, 20.0 / 1e6);
  EXPECT_DOUBLE_EQ(find("c").self_ms, 10.0 / 1e6);
  EXPECT_TRUE(find("k").device);
  EXPECT_EQ(rows.front().name, "a");  // host rows first, by self time
  EXPECT_EQ(rows.back().name, "k");
  const std::string table = FormatOperatorTable(rows, 2);
  EXPECT_NE(table.find("host (CPU) time over 2 steps"), std::string::npos);
  EXPECT_NE(table.find("device (CUDA) time"), std::string::npos);
}

}  // namespace
}  // namespace trainyard
