#include "worker/jobs/generate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/log.h"
#include "data/byte_level_bpe_tokenizer.h"
#include "data/text_dataset.h"
#include "worker/generation/generation.h"
#include "worker/report/run_log.h"
#include "worker/train/amp.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

GenerateRunner::GenerateRunner(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), device_(PrepareRuntime(spec_, ranks_)) {
  if (ranks_.world > 1) throw InputError(spec_.Where("kind") + ": kind: generate runs on one rank");
  tokenizer_ = LoadTokenizer(spec_, TextDataset{});
  model_ = BuildModel(spec_, *tokenizer_, {}, spec_.data.max_seq_len);
  lm_ = dynamic_cast<CausalLmImpl*>(model_.get());
  if (!lm_) throw InputError(spec_.Where("model") + ": kind: generate needs a causal LM");
  model_->to(device_);
  model_->eval();
  Freeze(*model_);
  if (spec_.generate.cuda_graph && !device_.is_cuda())
    throw InputError(spec_.Where("generate.cuda_graph") + ": needs a CUDA device; this job runs on " + device_.str());
  if (spec_.model.init.empty())
    LogWarn("generation with a freshly initialised '" + spec_.model.preset +
            "' model (no model.init): the text is noise, the timings are real");
  ReadPrompts();
  ChooseStopTokens();
}

std::string GenerateRunner::run_dir() const { return RunDir(spec_); }

void GenerateRunner::ReadPrompts() {
  std::ifstream in(spec_.generate.prompts);
  std::string line;
  const int64_t positions = model_->info().max_sequence;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string text = UnescapeTsvField(line);
    std::vector<int32_t> ids = tokenizer_->Pieces(text);
    const std::string where = spec_.Where("generate.prompts") + ": line " + std::to_string(number);
    if (ids.empty()) throw InputError(where + ": an empty prompt");
    if (int64_t(ids.size()) + spec_.generate.max_new_tokens > positions)
      throw InputError(where + ": a prompt of " + std::to_string(ids.size()) + " tokens plus max_new_tokens " +
                       std::to_string(spec_.generate.max_new_tokens) + " exceeds the model's " +
                       std::to_string(positions) + " positions");
    prompts_.push_back(text);
    prompt_ids_.emplace_back(ids.begin(), ids.end());
  }
  if (prompts_.empty()) throw InputError(spec_.Where("generate.prompts") + ": no prompts");
}

void GenerateRunner::ChooseStopTokens() {
  const auto& stop = spec_.generate.stop;
  for (size_t i = 0; i < stop.size(); ++i) {
    std::vector<int32_t> ids = tokenizer_->Pieces(stop[i]);
    if (ids.size() != 1)
      throw InputError(spec_.Where("generate.stop") + ": '" + stop[i] + "' is " + std::to_string(ids.size()) +
                       " tokens, a stop token must be one");
    stop_ids_.push_back(ids[0]);
  }
  if (stop.empty() && lm_->eos_id() >= 0) stop_ids_.push_back(lm_->eos_id());
}

// The text of a row's new tokens, up to its stop token (excluded) or its end.
std::string GenerateRunner::Completion(const std::vector<int64_t>& tokens, bool* stopped) const {
  std::vector<int32_t> kept;
  *stopped = false;
  for (int64_t t : tokens) {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), t) != stop_ids_.end() && !spec_.generate.ignore_stop) {
      *stopped = true;
      break;
    }
    kept.push_back(int32_t(t));
  }
  const auto* bpe = dynamic_cast<const ByteLevelBpeTokenizer*>(tokenizer_.get());
  return bpe ? bpe->Decode(kept) : std::string();
}

// One untimed generation of the first batch, two new tokens, so that one-time setup
// (the CPU library's kernels and buffers, a first CUDA context's work) is not counted
// as the first batch's time to first token. Its tokens are not kept; it draws from a
// generator of its own, so the job's text is the same with or without it.
void GenerateRunner::WarmUp(GenerationOptions options, torch::ScalarType cache_dtype) {
  const size_t rows = std::min(prompt_ids_.size(), size_t(spec_.generate.batch_size));
  const std::vector<std::vector<int64_t>> batch(prompt_ids_.begin(), prompt_ids_.begin() + long(rows));
  options.max_new_tokens = std::min<int64_t>(2, options.max_new_tokens);
  options.ignore_stop = true;
  const auto start = std::chrono::steady_clock::now();
  AutocastScope autocast(device_.type(), spec_.train.precision);
  Generate(*lm_, batch, options, cache_dtype);
  LogInfo(StrFormat("generate: warm-up on the first batch, %.1f ms (not counted)",
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()));
}

GenerationOptions GenerateRunner::Options() const {
  const GenerateSpec& g = spec_.generate;
  GenerationOptions options;
  options.max_new_tokens = g.max_new_tokens;
  options.sample = g.sample;
  options.temperature = g.temperature;
  options.top_k = g.top_k;
  options.top_p = g.top_p;
  options.seed = spec_.seed;
  options.stop_ids = stop_ids_;
  options.ignore_stop = g.ignore_stop;
  options.pad_id = tokenizer_->pad_id();
  options.decode = g.cuda_graph ? DecodeMode::kCudaGraph : DecodeMode::kGrowing;
  return options;
}

std::string GenerateRunner::GenerateBatch(size_t begin, size_t end, const GenerationOptions& options,
                                          torch::ScalarType cache_dtype, GenerateStats* stats) {
  std::vector<std::vector<int64_t>> batch(prompt_ids_.begin() + long(begin), prompt_ids_.begin() + long(end));
  GenerationResult result;
  {
    AutocastScope autocast(device_.type(), spec_.train.precision);
    result = Generate(*lm_, batch, options, cache_dtype);
  }
  stats->first_token_ms.push_back(result.first_token_ms);
  stats->decode_ms += result.decode_ms;
  stats->capture_ms += result.capture_ms;
  stats->decode_tokens += double(result.tokens.size(0) * std::max<int64_t>(0, result.tokens.size(1) - 1));
  std::string lines;
  for (int64_t row = 0; row < result.tokens.size(0); ++row) {
    torch::Tensor t = result.tokens[row].contiguous();
    std::vector<int64_t> tokens(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    bool stopped = false;
    const std::string text = Completion(tokens, &stopped);
    stats->new_tokens += int64_t(tokens.size());
    lines += nlohmann::json{{"index", begin + size_t(row)},
                            {"prompt", prompts_[begin + size_t(row)]},
                            {"completion", text},
                            {"tokens", tokens},
                            {"stopped", stopped}}
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stats->start).count();
  LogInfo(StrFormat("generate: prompts %zu-%zu of %zu [%s]: first token %.1f ms, %ld new tokens", begin + 1, end,
                    prompt_ids_.size(),
                    ProgressLine::Clock(elapsed_s, int64_t(end), int64_t(prompt_ids_.size())).c_str(),
                    result.first_token_ms, long(result.tokens.size(1))));
  return lines;
}

nlohmann::json GenerateRunner::Run() {
  const GenerateSpec& g = spec_.generate;
  const GenerationOptions options = Options();
  const torch::ScalarType cache_dtype = ComputeDtype(spec_.train.precision);
  WarmUp(options, cache_dtype);
  std::string lines;
  GenerateStats stats;
  for (size_t begin = 0; begin < prompt_ids_.size() && !StopAsked(ranks_); begin += size_t(g.batch_size))
    lines +=
        GenerateBatch(begin, std::min(prompt_ids_.size(), begin + size_t(g.batch_size)), options, cache_dtype, &stats);
  AgreeOnStop(ranks_, [] { return std::string("during generation"); });
  const std::string path = g.output.empty() ? run_dir() + "/generations.jsonl" : g.output;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  WriteFileAtomically(path, lines);
  const double tokens_per_s = stats.decode_tokens / std::max(1e-9, stats.decode_ms / 1000.0);
  LogInfo(
      StrFormat("generate: %zu prompts, batch %d: time to first token %.1f ms (median of batches), "
                "decoding %.1f tokens/s; wrote %s",
                prompts_.size(), g.batch_size, Median(stats.first_token_ms), tokens_per_s, path.c_str()));
  nlohmann::json summary = {{"job", spec_.name},
                            {"kind", "generate"},
                            {"prompts", prompts_.size()},
                            {"batch_size", g.batch_size},
                            {"max_new_tokens", g.max_new_tokens},
                            {"new_tokens", stats.new_tokens},
                            {"first_token_ms_median", Median(stats.first_token_ms)},
                            {"decode_tokens_per_s", tokens_per_s},
                            {"cuda_graph_capture_ms", stats.capture_ms},
                            {"output", path}};
  WriteJobSummary(spec_, summary);
  return summary;
}

}  // namespace trainyard
