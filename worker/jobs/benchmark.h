// Runs a `benchmark` job.
//
// sweep: every batch x seq_len x precision x mode cell is warmed up, then timed for
// `iters` iterations (CUDA events on a GPU, the steady clock on CPU). A cell whose
// coefficient of variation exceeds max_cv is measured again, up to max_remeasure
// times; the steadiest pass is kept and the cell is flagged if even that one is noisy.
// Out of memory makes the cell "OOM" (the cache is freed and the sweep goes on); a
// seq_len beyond the model's positions, or fp16 on a CPU, makes it "N/A". Inputs are
// real text from data.train, tokenized and cut to the cell's length.
// train_step: mean and p50 ms per training step over train_steps steps, the first
// excluded, per precision, at train.batch_size x data.max_seq_len.
// generate (a causal LM): every batch x seq_len x precision x mode cell generates
// new_tokens after prompts of seq_len tokens of real text: time to first token, ms per
// decode step and decoded tokens/s, eager or through a CUDA graph.
// With several ranks the cells are dealt round-robin and rank 0 gathers and reports.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/tokenizer.h"
#include "worker/compiled/aoti_package.h"
#include "worker/jobs/job_setup.h"
#include "worker/report/bench_report.h"

namespace trainyard {

class BenchmarkRunner {
 public:
  // Throws InputError for bad inputs (cuda_graph without CUDA, unreadable files).
  BenchmarkRunner(JobSpec spec, RankContext ranks);
  nlohmann::json Run();
  std::string run_dir() const;

 private:
  struct CellPlan {
    int batch, seq;
    Precision precision;
    ForwardMode mode;
  };

  std::vector<CellPlan> PlanCells() const;
  BenchCell NewCell(const CellPlan& plan) const;
  std::string CellMode(ForwardMode mode) const;
  BenchCell Measure(const CellPlan& plan);
  BenchCell MeasureGeneration(const CellPlan& plan);
  BenchCell MeasureTrainStep(Precision precision);
  // Runs `pass` (which fills a copy of `cell` with timings) until its coefficient of
  // variation is within max_cv or max_remeasure more passes have run; keeps the steadiest.
  BenchCell SteadiestPass(const BenchCell& cell, const std::function<void(BenchCell*)>& pass) const;
  // Runs `measure` on the cell with its memory counted (peak_mb) and capped
  // (memory_cap_mb); out of memory makes the cell OOM.
  BenchCell MeasureWithin(BenchCell cell, const std::function<void(BenchCell*)>& measure);
  std::function<torch::Tensor()> MakeForward(const CellPlan& plan, const torch::Tensor& ids, const torch::Tensor& mask);
  std::vector<double> TimeIterations(const std::function<void()>& step, int warmup, int iters);
  torch::Tensor Inputs(int batch, int seq) const;
  std::vector<std::vector<int64_t>> PromptRows(int batch, int seq) const;  // generate's prompts
  // Cell i's description (model, shape, precision, mode) without its measurements.
  BenchCell CellAt(size_t i, const std::vector<CellPlan>& plans) const;
  std::vector<BenchCell> Gather(std::vector<BenchCell> mine, size_t total) const;
  nlohmann::json Environment() const;

  JobSpec spec_;
  RankContext ranks_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<Tokenizer> tokenizer_;
  Model model_;
  Model int8_model_;                   // the int8 mode's copy of model_, Linear layers quantized
  std::unique_ptr<AotiPackage> aoti_;  // the aoti mode's package
  std::optional<torch::jit::Module> script_;
  std::vector<int64_t> token_stream_;
  int64_t cls_id_ = 0, sep_id_ = 0;
  std::string model_name_;
};

}  // namespace trainyard
