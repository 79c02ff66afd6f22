#include "worker/jobs/benchmark.h"

#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "worker/generation/generation.h"
#include "worker/jobs/forward_modes.h"
#include "worker/jobs/memory_cap.h"
#include "worker/report/run_log.h"
#include "worker/train/amp.h"
#include "worker/train/optimizer.h"

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "worker/compiled/cuda_graph.h"
#endif

#ifndef TRAINYARD_GIT_COMMIT
#define TRAINYARD_GIT_COMMIT "unknown"
#endif

namespace trainyard {
namespace {

namespace fs = std::filesystem;
constexpr int kMaxPositions = 512;  // BERT's, for presets in benchmark jobs

enum NoteCode { kNoNote = 0, kSeqTooLong = 1, kFp16NeedsCuda = 2, kOutOfMemory = 3, kPromptTooLong = 4 };
const char* const kPromptTooLongNote = "prompt plus new_tokens exceed the model's positions";

void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double Percentile(std::vector<double> sorted, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * sorted.size()));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void FillStats(std::vector<double> ms, BenchCell* cell) {
  std::sort(ms.begin(), ms.end());
  const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  double var = 0;
  for (double v : ms) var += (v - mean) * (v - mean);
  cell->mean_ms = mean;
  cell->p50_ms = Percentile(ms, 0.5);
  cell->p90_ms = Percentile(ms, 0.9);
  cell->p99_ms = Percentile(ms, 0.99);
  cell->cv = ms.size() > 1 ? std::sqrt(var / (ms.size() - 1)) / mean : 0.0;
  cell->seqs_per_s = cell->batch * 1000.0 / mean;
  cell->tokens_per_s = double(cell->batch) * cell->seq * 1000.0 / mean;
}

// Copies every parameter and buffer of `from` into the same-named one of `to`, a model
// built from the same spec.
void CopyWeights(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto params = to.named_parameters(), buffers = to.named_buffers();
  for (const auto& item : from.named_parameters()) params[item.key()].copy_(item.value());
  for (const auto& item : from.named_buffers()) buffers[item.key()].copy_(item.value());
}

uint64_t FileHash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Fnv1a(bytes.data(), bytes.size());
}

}  // namespace

BenchmarkRunner::BenchmarkRunner(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), device_(PrepareRuntime(spec_, ranks_)) {
  for (ForwardMode m : spec_.benchmark.modes)
    if (m == ForwardMode::kCudaGraph && !device_.is_cuda())
      throw InputError(spec_.Where("benchmark.modes") + ": cuda_graph needs a CUDA device; this job runs on " +
                       device_.str());
  LabelSet labels = LoadLabels(spec_);
  TextDataset texts = LoadTexts(spec_, "data.train", spec_.data.train, &labels);
  tokenizer_ = LoadTokenizer(spec_, texts);
  model_ = BuildModel(spec_, *tokenizer_, labels.names(), kMaxPositions);
  model_->to(device_);
  if (spec_.benchmark.run != BenchmarkRun::kTrainStep) Freeze(*model_);  // the others only infer
  if (spec_.benchmark.run == BenchmarkRun::kGenerate && !dynamic_cast<CausalLmImpl*>(model_.get()))
    throw InputError(spec_.Where("benchmark.mode") + ": generate needs a causal LM");
  if (std::count(spec_.benchmark.modes.begin(), spec_.benchmark.modes.end(), ForwardMode::kInt8)) {
    if (!device_.is_cpu())  // before building a second model
      throw InputError(spec_.Where("benchmark.modes") + ": int8 runs on the CPU; this job runs on " + device_.str());
    int8_model_ = BuildModel(spec_, *tokenizer_, labels.names(), kMaxPositions);
    CopyWeights(*model_, *int8_model_);
    QuantizeForInt8(spec_, "benchmark.modes", *int8_model_, device_);
  }
  if (std::count(spec_.benchmark.modes.begin(), spec_.benchmark.modes.end(), ForwardMode::kAoti))
    aoti_ = OpenAotiPackage(spec_, "benchmark.aoti", spec_.benchmark.aoti, device_);
  model_name_ = spec_.model.init.empty() ? spec_.model.preset : fs::path(spec_.model.init).filename().string();
  if (!spec_.benchmark.torchscript.empty()) {
    try {
      script_ = torch::jit::load(spec_.benchmark.torchscript, device_);
      script_->eval();
    } catch (const std::exception& e) {
      throw InputError(spec_.Where("benchmark.torchscript") +
                       ": cannot load the TorchScript file: " + std::string(e.what()).substr(0, 300));
    }
  }
  // Inputs are framed as the family frames a text; a vocabulary without such tokens
  // gets its pad id there (the cost of a cell does not depend on which ids it holds).
  cls_id_ = tokenizer_->bos_id() >= 0 ? tokenizer_->bos_id() : tokenizer_->pad_id();
  sep_id_ = tokenizer_->eos_id() >= 0 ? tokenizer_->eos_id() : tokenizer_->pad_id();
  for (size_t i = 0; i < texts.examples.size() && token_stream_.size() < 200000; ++i) {
    auto ids = tokenizer_->Pieces(texts.examples[i].text);
    token_stream_.insert(token_stream_.end(), ids.begin(), ids.end());
  }
  if (token_stream_.size() < 1024)
    throw InputError(spec_.Where("data.train") + ": too little text to build benchmark inputs");
}

std::string BenchmarkRunner::run_dir() const { return RunDir(spec_); }

std::vector<std::vector<int64_t>> BenchmarkRunner::PromptRows(int batch, int seq) const {
  std::vector<std::vector<int64_t>> rows;
  const int64_t span = std::max<int64_t>(1, int64_t(token_stream_.size()) - seq);
  for (int r = 0; r < batch; ++r) {
    const auto begin = token_stream_.begin() + (int64_t(r) * 7919 * seq) % span;
    rows.emplace_back(begin, begin + seq);
  }
  return rows;
}

torch::Tensor BenchmarkRunner::Inputs(int batch, int seq) const {
  torch::Tensor ids = torch::empty({batch, seq}, torch::kLong);
  auto rows = ids.accessor<int64_t, 2>();
  const int64_t body = std::max(0, seq - 2), span = static_cast<int64_t>(token_stream_.size()) - body;
  for (int r = 0; r < batch; ++r) {
    const int64_t offset = (int64_t(r) * 7919 * std::max<int64_t>(body, 1)) % std::max<int64_t>(span, 1);
    rows[r][0] = cls_id_;
    for (int64_t c = 0; c < body; ++c) rows[r][c + 1] = token_stream_[offset + c];
    if (seq > 1) rows[r][seq - 1] = sep_id_;
  }
  return ids.to(device_);
}

std::vector<BenchmarkRunner::CellPlan> BenchmarkRunner::PlanCells() const {
  std::vector<CellPlan> cells;
  for (Precision p : spec_.benchmark.precisions)
    for (ForwardMode m : spec_.benchmark.modes)
      for (int b : spec_.benchmark.batch_sizes)
        for (int s : spec_.benchmark.seq_lens) cells.push_back({b, s, p, m});
  return cells;
}

std::vector<double> BenchmarkRunner::TimeIterations(const std::function<void()>& step, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda()) {
    std::vector<at::cuda::CUDAEvent> starts, ends;
    for (int i = 0; i < iters; ++i) {
      starts.emplace_back(cudaEventDefault);
      ends.emplace_back(cudaEventDefault);
    }
    c10::cuda::device_synchronize();
    for (int i = 0; i < iters; ++i) {
      starts[i].record();
      step();
      ends[i].record();
    }
    c10::cuda::device_synchronize();
    for (int i = 0; i < iters; ++i) ms.push_back(starts[i].elapsed_time(ends[i]));
    return ms;
  }
#endif
  for (int i = 0; i < iters; ++i) {
    auto start = Clock::now();
    step();
    ms.push_back(MsSince(start));
  }
  return ms;
}

std::function<torch::Tensor()> BenchmarkRunner::MakeForward(const CellPlan& plan, const torch::Tensor& ids,
                                                            const torch::Tensor& mask) {
  const Precision precision = plan.precision;
  if (plan.mode == ForwardMode::kTorchScript) {
    return [this, ids, mask, precision] {
      AutocastScope autocast(device_.type(), precision);
      torch::IValue out = script_->forward({ids, mask});
      if (out.isTuple()) return out.toTupleRef().elements()[0].toTensor();
      if (out.isGenericDict()) return out.toGenericDict().at("logits").toTensor();
      return out.toTensor();
    };
  }
  if (plan.mode == ForwardMode::kInt8) return [this, ids, mask] { return int8_model_->forward(ids, mask); };
  if (plan.mode == ForwardMode::kAoti) return [this, ids, mask] { return aoti_->Forward(ids, mask); };
  auto eager = [this, ids, mask, precision] {
    AutocastScope autocast(device_.type(), precision);
    return model_->forward(ids, mask);
  };
#ifdef TRAINYARD_WITH_CUDA
  if (plan.mode == ForwardMode::kCudaGraph) return CaptureCudaGraph(eager, device_);
#endif
  return eager;
}

BenchCell BenchmarkRunner::NewCell(const CellPlan& plan) const {
  BenchCell cell;
  cell.model = model_name_;
  cell.batch = plan.batch;
  cell.seq = plan.seq;
  cell.precision = ToString(plan.precision);
  cell.mode = CellMode(plan.mode);
  cell.rank = ranks_.rank;
  return cell;
}

std::string BenchmarkRunner::CellMode(ForwardMode mode) const {
  if (spec_.benchmark.run != BenchmarkRun::kGenerate) return ToString(mode);
  return mode == ForwardMode::kCudaGraph ? "generate_cuda_graph" : "generate";
}

BenchCell BenchmarkRunner::Measure(const CellPlan& plan) {
  BenchCell cell = NewCell(plan);
  const int64_t max_positions = model_->info().max_sequence;
  if (plan.seq > max_positions) {
    cell.status = "N/A";
    cell.note = "seq_len exceeds max_position_embeddings " + std::to_string(max_positions);
    return cell;
  }
  if (plan.mode == ForwardMode::kInt8 && plan.precision != Precision::kFp32) {
    cell.status = "N/A";
    cell.note = "int8 takes fp32 activations";
    return cell;
  }
  if (plan.mode == ForwardMode::kAoti && plan.precision != Precision::kFp32) {
    cell.status = "N/A";
    cell.note = "an aoti package runs in the precision it was exported in (fp32)";
    return cell;
  }
  if (plan.mode == ForwardMode::kAoti && (plan.batch > aoti_->max_batch() || plan.seq > aoti_->max_seq())) {
    cell.status = "N/A";
    cell.note = "beyond the package's " + aoti_->Describe();
    return cell;
  }
  if (plan.precision == Precision::kFp16 && !device_.is_cuda()) {
    cell.status = "N/A";
    cell.note = "fp16 needs CUDA";
    return cell;
  }
  return MeasureWithin(cell, [&](BenchCell* measured) {
    torch::Tensor ids = Inputs(plan.batch, plan.seq);
    torch::Tensor mask = torch::ones_like(ids);
    auto forward = MakeForward(plan, ids, mask);
    *measured = SteadiestPass(*measured, [&](BenchCell* attempt) {
      FillStats(TimeIterations([&] { forward(); }, spec_.benchmark.warmup, spec_.benchmark.iters), attempt);
    });
  });
}

// A generate cell: `iters` generations of new_tokens after batch prompts of seq tokens,
// every row generating them all. Its latency figures are per decode step (one new
// token for every row): the mean over all steps, and p50/p90/p99 and CV over the
// generations' mean steps; first_token_ms is the median time to the first token (the
// prefill); tokens_per_s counts the decoded tokens of all rows; seqs_per_s, whole
// generations. A CUDA graph's capture, once per generation, counts in neither.
BenchCell BenchmarkRunner::MeasureGeneration(const CellPlan& plan) {
  BenchCell cell = NewCell(plan);
  const int64_t new_tokens = spec_.benchmark.new_tokens;
  if (plan.seq + new_tokens > model_->info().max_sequence) {
    cell.status = "N/A";
    cell.note = kPromptTooLongNote;
    return cell;
  }
  if (plan.precision == Precision::kFp16 && !device_.is_cuda()) {
    cell.status = "N/A";
    cell.note = "fp16 needs CUDA";
    return cell;
  }
  GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.ignore_stop = true;
  options.pad_id = tokenizer_->pad_id();
  options.decode = plan.mode == ForwardMode::kCudaGraph ? DecodeMode::kCudaGraph : DecodeMode::kGrowing;
  auto& lm = dynamic_cast<CausalLmImpl&>(*model_);
  const std::vector<std::vector<int64_t>> prompts = PromptRows(plan.batch, plan.seq);
  auto generate = [&] {
    AutocastScope autocast(device_.type(), plan.precision);
    return Generate(lm, prompts, options, ComputeDtype(plan.precision));
  };
  return MeasureWithin(cell, [&](BenchCell* measured) {
    for (int i = 0; i < spec_.benchmark.warmup; ++i) generate();
    *measured = SteadiestPass(*measured, [&](BenchCell* attempt) {
      std::vector<double> step_ms, first_ms;
      for (int i = 0; i < spec_.benchmark.iters; ++i) {
        const GenerationResult result = generate();
        first_ms.push_back(result.first_token_ms);
        step_ms.push_back(result.decode_ms / double(std::max<int64_t>(1, result.tokens.size(1) - 1)));
      }
      FillStats(step_ms, attempt);
      std::sort(first_ms.begin(), first_ms.end());
      attempt->first_token_ms = Percentile(first_ms, 0.5);  // the median, as p50_ms takes it
      attempt->tokens_per_s = attempt->batch * 1000.0 / attempt->mean_ms;
      attempt->seqs_per_s =
          attempt->batch * 1000.0 / (attempt->first_token_ms + double(new_tokens - 1) * attempt->mean_ms);
    });
  });
}

BenchCell BenchmarkRunner::SteadiestPass(const BenchCell& cell, const std::function<void(BenchCell*)>& pass) const {
  BenchCell best;
  for (int count = 0; count <= spec_.benchmark.max_remeasure; ++count) {
    BenchCell attempt = cell;
    pass(&attempt);
    if (count == 0 || attempt.cv < best.cv) best = attempt;
    best.measurements = count + 1;
    if (best.cv <= spec_.benchmark.max_cv) break;
  }
  best.unstable = best.cv > spec_.benchmark.max_cv;
  return best;
}

BenchCell BenchmarkRunner::MeasureWithin(BenchCell cell, const std::function<void(BenchCell*)>& measure) {
  const bool cpu = !device_.is_cuda();
  auto cell_work = [&] {
    torch::NoGradGuard no_grad;
    model_->eval();
#ifdef TRAINYARD_WITH_CUDA
    if (!cpu) {  // what earlier cells left cached (graph pools among it) goes back
      c10::cuda::CUDACachingAllocator::emptyCache();
      c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    }
#endif
    ResetPeakRss();
    const double rss_before = ProcStatusMb("VmRSS:");
    measure(&cell);
    cell.peak_mb = ProcStatusMb("VmHWM:") - rss_before;
#ifdef TRAINYARD_WITH_CUDA
    if (!cpu)
      cell.peak_mb =
          c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].peak / 1048576.0;
#endif
  };
  bool capped = false;
  try {
    // A CPU cell's memory and failures are its own (memory_cap.h); a CUDA cell keeps
    // this thread's streams.
    if (cpu)
      RunCapped(spec_.benchmark.memory_cap_mb, cell_work, &capped);
    else
      cell_work();
    return cell;
  } catch (const std::exception& e) {
    if (!IsOutOfMemory(e, capped)) throw;
#ifdef TRAINYARD_WITH_CUDA
    if (!cpu) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    cell.status = "OOM";
    cell.note = spec_.benchmark.memory_cap_mb > 0 && cpu
                    ? StrFormat("needs more than memory_cap_mb %.0f", spec_.benchmark.memory_cap_mb)
                    : "out of memory";
    return cell;
  }
}

BenchCell BenchmarkRunner::MeasureTrainStep(Precision precision) {
  BenchCell cell;
  cell.model = model_name_;
  cell.batch = spec_.train.batch_size;
  cell.seq = spec_.data.max_seq_len;
  cell.precision = ToString(precision);
  cell.mode = "train_step";
  cell.rank = ranks_.rank;
  if (precision == Precision::kFp16 && !device_.is_cuda()) {
    cell.status = "N/A";
    cell.note = "fp16 needs CUDA";
    return cell;
  }
  model_->train();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> params;
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().requires_grad()) continue;  // trained: all of them, or LoRA's adapters and saved modules
    named.emplace_back(item.key(), item.value());
    params.push_back(item.value());
  }
  AdamW optimizer(named, AdamWOptions{});
  GradScaler scaler(spec_.train.loss_scale, precision == Precision::kFp16, device_);
  torch::Tensor ids = Inputs(cell.batch, cell.seq), mask = torch::ones_like(ids);
  torch::Tensor labels =
      torch::arange(cell.batch, torch::kLong).remainder(int64_t(model_->info().labels.size())).to(device_);
  auto step = [&] {
    torch::Tensor loss;
    {
      AutocastScope autocast(device_.type(), precision);
      loss = torch::nn::functional::cross_entropy(model_->forward(ids, mask).to(torch::kFloat), labels);
    }
    scaler.Scale(loss).backward();
    const torch::Tensor found_inf = scaler.UnscaleAndCheck(params);
    optimizer.Step(1e-5, found_inf);
    scaler.Update(found_inf);
    optimizer.ZeroGrad();
  };
  std::vector<double> ms = TimeIterations(step, 0, spec_.benchmark.train_steps);
  ms.erase(ms.begin());  // the first step pays for allocation and warm-up
  FillStats(ms, &cell);
  cell.measurements = 1;
  return cell;
}

namespace {

// A cell's numbers as one row of Gather's table; text travels as codes.
constexpr int kCellFields = 14;
std::vector<double> CellRow(const BenchCell& c) {
  const double status = c.status == "ok" ? 0 : c.status == "OOM" ? 1 : 2;
  const double note = c.status == "OOM"              ? kOutOfMemory
                      : c.note == "fp16 needs CUDA"  ? kFp16NeedsCuda
                      : c.note == kPromptTooLongNote ? kPromptTooLong
                      : c.status == "N/A"            ? kSeqTooLong
                                                     : kNoNote;
  return {status,
          note,
          c.mean_ms,
          c.p50_ms,
          c.p90_ms,
          c.p99_ms,
          c.cv,
          c.seqs_per_s,
          c.tokens_per_s,
          c.peak_mb,
          double(c.measurements),
          double(c.unstable),
          double(c.rank),
          c.first_token_ms};
}

// The inverse of CellRow for the measured parts of a cell.
void ReadCellRow(const torch::Tensor& row, BenchCell* c) {
  auto v = [&](int k) { return row[k].item<double>(); };
  c->status = v(0) == 0 ? "ok" : v(0) == 1 ? "OOM" : "N/A";
  const int note = static_cast<int>(v(1));
  c->note = note == kOutOfMemory     ? "out of memory"
            : note == kFp16NeedsCuda ? "fp16 needs CUDA"
            : note == kSeqTooLong    ? "seq_len exceeds max_position_embeddings"
            : note == kPromptTooLong ? kPromptTooLongNote
                                     : "";
  c->mean_ms = v(2);
  c->p50_ms = v(3);
  c->p90_ms = v(4);
  c->p99_ms = v(5);
  c->cv = v(6);
  c->seqs_per_s = v(7);
  c->tokens_per_s = v(8);
  c->peak_mb = v(9);
  c->measurements = int(v(10));
  c->unstable = v(11) != 0;
  c->rank = int(v(12));
  c->first_token_ms = v(13);
}

}  // namespace

BenchCell BenchmarkRunner::CellAt(size_t i, const std::vector<CellPlan>& plans) const {
  BenchCell c;
  c.model = model_name_;
  if (spec_.benchmark.run == BenchmarkRun::kTrainStep) {
    c.batch = spec_.train.batch_size;
    c.seq = spec_.data.max_seq_len;
    c.precision = ToString(spec_.benchmark.precisions[i]);
    c.mode = "train_step";
  } else {
    c.batch = plans[i].batch;
    c.seq = plans[i].seq;
    c.precision = ToString(plans[i].precision);
    c.mode = CellMode(plans[i].mode);
  }
  return c;
}

std::vector<BenchCell> BenchmarkRunner::Gather(std::vector<BenchCell> mine, size_t total) const {
  if (!ranks_.comm) return mine;
  // Numbers travel in one table (a row per cell); text is rebuilt from codes.
  torch::Tensor table = torch::zeros({int64_t(total), kCellFields}, torch::kDouble);
  for (size_t i = 0; i < total; ++i)
    if (static_cast<int>(i % ranks_.world) == ranks_.rank)
      table[int64_t(i)].copy_(torch::tensor(CellRow(mine[i / ranks_.world]), torch::kDouble));
  ranks_.comm->AllReduce(table, ReduceOp::kSum, "benchmark results");
  std::vector<BenchCell> all;
  const std::vector<CellPlan> plans = PlanCells();
  for (size_t i = 0; i < total; ++i) {
    BenchCell c = CellAt(i, plans);
    ReadCellRow(table[int64_t(i)], &c);
    all.push_back(c);
  }
  return all;
}

nlohmann::json BenchmarkRunner::Environment() const {
  nlohmann::json env = {{"torch_version", TORCH_VERSION},
                        {"device", device_.str()},
                        {"threads_per_rank", torch::get_num_threads()},
                        {"ranks", ranks_.world},
                        {"git_commit", TRAINYARD_GIT_COMMIT},
                        {"job_file", spec_.source_file},
                        {"job_hash", StrFormat("%016llx", (unsigned long long)FileHash(spec_.source_file))}};
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      env["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  env["cpu_cores"] = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda()) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, device_.index());
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    env["gpu"] = prop.name;
    env["cuda_driver"] = driver;
    env["cuda_runtime"] = runtime;
  }
#endif
  return env;
}

nlohmann::json BenchmarkRunner::Run() {
  const auto start = Clock::now();
  std::vector<BenchCell> mine;
  size_t total = 0;
  if (spec_.benchmark.run == BenchmarkRun::kTrainStep) {
    total = spec_.benchmark.precisions.size();
    for (size_t i = ranks_.rank; i < total && !StopAsked(ranks_); i += ranks_.world)
      mine.push_back(MeasureTrainStep(spec_.benchmark.precisions[i]));
  } else {
    std::vector<CellPlan> plans = PlanCells();
    total = plans.size();
    // This rank measures cells rank, rank + world, ...; its clock counts those.
    const size_t my_total = (total + size_t(ranks_.world) - 1 - size_t(ranks_.rank)) / size_t(ranks_.world);
    for (size_t i = ranks_.rank; i < total && !StopAsked(ranks_); i += ranks_.world) {
      mine.push_back(spec_.benchmark.run == BenchmarkRun::kGenerate ? MeasureGeneration(plans[i]) : Measure(plans[i]));
      if (ranks_.world == 1 || spec_.log.progress)
        LogInfo(StrFormat("[%zu/%zu %s] ", i + 1, total,
                          ProgressLine::Clock(SecondsSince(start), int64_t(mine.size()), int64_t(my_total)).c_str()) +
                DescribeCell(mine.back()));
    }
  }
  AgreeOnStop(ranks_, [&] { return StrFormat("after %zu of this rank's benchmark cells", mine.size()); });
  std::vector<BenchCell> cells = Gather(std::move(mine), total);
  nlohmann::json summary = {
      {"job", spec_.name}, {"kind", "benchmark"}, {"cells", cells.size()}, {"wall_time_s", SecondsSince(start)}};
  if (ranks_.rank != 0) return summary;
  if (spec_.benchmark.run == BenchmarkRun::kTrainStep)
    for (const auto& c : cells) LogInfo(DescribeCell(c));
  fs::create_directories(run_dir());
  WriteBenchmarkReport(run_dir(), cells);
  nlohmann::json env = Environment();
  WriteFileAtomically(run_dir() + "/env.json", env.dump(2) + "\n");
  int ok = 0, oom = 0, na = 0, noisy = 0;
  for (const auto& c : cells) {
    ok += c.status == "ok";
    oom += c.status == "OOM";
    na += c.status == "N/A";
    noisy += c.unstable;
  }
  summary["ok"] = ok;
  summary["oom"] = oom;
  summary["not_applicable"] = na;
  summary["noisy"] = noisy;
  summary["status"] = "succeeded";
  WriteJobSummary(spec_, summary);
  LogInfo(StrFormat("%zu cells: %d measured (%d noisy), %d OOM, %d N/A -> %s/benchmark.{csv,md}", cells.size(), ok,
                    noisy, oom, na, run_dir().c_str()));
  return summary;
}

}  // namespace trainyard
