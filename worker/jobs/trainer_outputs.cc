// What the Trainer leaves behind: the epoch rows (with the step breakdown across
// ranks), the run's opening lines, the trace, MLflow's run, the model or adapter, and
// summary.json.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "common/atomic_file.h"
#include "common/log.h"
#include "worker/jobs/trainer_parts.h"
#include "worker/models/hf_checkpoint.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string LocalHostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

void Trainer::StartTrace() {
  if (!spec_.log.trace) return;
  // A step's spans: wait and the five timed parts, and one all-reduce per bucket.
  const size_t spans_per_step = 1 + kNumTimedParts + (reducer_ ? reducer_->num_buckets() : 0) + 2;
  trace_ = std::make_unique<TraceRecorder>(spec_.log.trace_steps, spans_per_step);
  if (reducer_) reducer_->set_trace(trace_.get());
  trace_->SetOrigin(TraceRecorder::NowUs());
}

// A trace that cannot be written costs a warning, never the run: the model is saved
// after this. Every rank reaches the barrier whatever happened to its own file.
void Trainer::WriteTrace() {
  if (!trace_) return;
  auto rank_file = [&](int rank) { return StrFormat("%s/trace.rank%d.json", run_dir().c_str(), rank); };
  try {
    WriteFileAtomically(rank_file(ranks_.rank), trace_->EventsJson(ranks_.rank));
  } catch (const std::exception& e) {
    LogWarn(std::string("log.trace: this rank's spans were not written: ") + e.what());
  }
  if (ranks_.comm) ranks_.comm->AnyTrue(false, "the trace files are written");  // a barrier
  if (!is_rank0()) return;
  try {
    std::vector<std::string> events;
    for (int r = 0; r < ranks_.world; ++r) {
      std::ifstream in(rank_file(r));
      if (!in) throw std::runtime_error("rank " + std::to_string(r) + " wrote no " + rank_file(r));
      events.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    WriteFileAtomically(run_dir() + "/trace.json", ChromeTraceJson(events));
    for (int r = 0; r < ranks_.world; ++r) fs::remove(rank_file(r));
  } catch (const std::exception& e) {
    LogWarn(std::string("log.trace: no trace.json (the run goes on): ") + e.what());
    return;
  }
  LogInfo(StrFormat("trace of the last %ld steps of %d rank(s): %s/trace.json (open it in https://ui.perfetto.dev)",
                    long(trace_->kept_steps()), ranks_.world, run_dir().c_str()));
}

// The job file's settings as the user wrote them, and what they resolved to here.
MlflowOptions Trainer::MlflowOptionsFor() const {
  MlflowOptions o;
  o.uri = spec_.log.mlflow_uri;
  o.experiment = spec_.log.mlflow_experiment;
  o.run_name = spec_.log.mlflow_run_name.empty() ? spec_.name : spec_.log.mlflow_run_name;
  o.run_dir = run_dir();
  for (const auto& [key, value] : spec_.values)
    if (key.rfind("log.mlflow.", 0) != 0) o.params[key] = value;
  o.params["job"] = spec_.name;
  o.params["ranks"] = std::to_string(ranks_.world);
  o.params["global_batch"] = std::to_string(GlobalBatch());
  o.params["device"] = device_.str();
  o.params["precision"] = ToString(spec_.train.precision);
  o.params["threads_per_rank"] = std::to_string(torch::get_num_threads());
  return o;
}

EpochRow Trainer::MakeEpochRow(int64_t epoch, const Evaluation& eval, int64_t total_steps) {
  const EpochTotals& t = *totals_;
  const double elapsed_ms = MsSince(t.start);
  const double steps = std::max<int64_t>(1, t.steps);
  // In kStepParts order: the host's data wait, then the timed parts.
  std::vector<double> mine = {t.wait / steps};
  for (double part : t.parts) mine.push_back(part / steps);
  mine.push_back(double(t.samples));
  std::vector<std::vector<double>> all = {mine};
  if (ranks_.comm) all = ranks_.comm->AllGather(mine, StrFormat("step breakdown of epoch %ld", long(epoch + 1)));
  EpochRow row;
  row.epoch = epoch + 1;
  row.ranks = ranks_.world;
  row.global_batch = GlobalBatch();
  row.time_s = elapsed_ms / 1000.0;
  row.steps = progress_.epoch_steps;
  row.skipped_steps = progress_.epoch_skipped;
  row.wait_ms = mine[0];
  row.h2d_ms = mine[1];
  row.forward_ms = mine[2];
  row.backward_ms = mine[3];
  row.comm_ms = mine[4];
  row.optimizer_ms = mine[5];
  row.ms_per_step = mine[0] + mine[1] + mine[2] + mine[3] + mine[4] + mine[5];
  double samples = 0;
  for (int part = 0; part < kNumStepParts; ++part) {
    std::vector<double> values;
    values.reserve(all.size());
    for (const auto& r : all) values.push_back(r[part]);
    std::sort(values.begin(), values.end());
    row.parts[part] = {values.front(), values[values.size() / 2], values.back()};
  }
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    std::array<double, kNumStepParts> parts{};
    std::copy(all[r].begin(), all[r].begin() + kNumStepParts, parts.begin());
    row.rank_parts.push_back(parts);
    const double total = std::accumulate(all[r].begin(), all[r].begin() + kNumStepParts, 0.0);
    samples += all[r][kNumStepParts];
    if (total > row.slowest_ms_per_step) {
      row.slowest_ms_per_step = total;
      row.slowest_rank = r;
    }
  }
  if (ranks_.comm) row.slowest_host = ranks_.comm->Host(row.slowest_rank);
  row.samples_per_s = samples / std::max(1e-9, elapsed_ms / 1000.0);
  row.data_wait_pct = 100.0 * mine[0] / std::max(1e-9, row.ms_per_step);
  row.train_loss = progress_.epoch_loss_sum / double(std::max<int64_t>(1, progress_.epoch_examples));
  row.eval_loss = eval.Get("eval_loss");
  row.eval_acc = eval.accuracy;
  row.lr = LrAt(std::max<int64_t>(0, progress_.global_step - 1), total_steps);
  if (scaler_->enabled()) row.loss_scale = scaler_->scale();
  row.replicas_min = static_cast<int>(progress_.replicas.min);
  row.replicas_max = static_cast<int>(progress_.replicas.max);
  row.replica_changes = static_cast<int>(progress_.replicas.changes);
  return row;
}

void Trainer::OpenRunLog(RunLog& log) {
  if (!spec_.log.mlflow_uri.empty()) log.AttachSink(OpenMlflow(MlflowOptionsFor()));
  LogRunStart();
  log.PrintHeader();
  for (const auto& row : log.rows()) log.PrintRow(row);  // epochs done before the resume
  HandEpochsToPool(log);
}

void Trainer::HandEpochsToPool(const RunLog& log) const {
  if (!ranks_.hooks) return;  // not a pool job
  for (size_t i = 0; i < log.rows().size(); ++i)
    ranks_.hooks->EpochDone(log.rows()[i], EpochCsvHeader(), log.csv_lines()[i]);
}

nlohmann::json Trainer::ShowFinishedRun() const {
  if (!is_rank0()) return nlohmann::json::object();
  LogInfo(
      StrFormat("job '%s' had already finished (step %ld, from %s); nothing was changed. "
                "Use --resume none to train it again",
                spec_.name.c_str(), long(progress_.global_step), resume_from_->c_str()));
  const RunLog log = RunLog::ReadFinished(run_dir());
  log.PrintHeader();
  for (const auto& row : log.rows()) log.PrintRow(row);
  HandEpochsToPool(log);
  std::ifstream file(run_dir() + "/summary.json");
  nlohmann::json summary = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  return summary.is_object() ? summary : nlohmann::json::object();
}

void Trainer::LogRunStart() const {
  LogInfo(
      StrFormat("job '%s': %zu train / %zu dev examples, %zu labels, vocab %d, %ld steps/epoch, "
                "batch %d per rank x %d ranks%s = %ld global, %s on %s, %d threads per rank",
                spec_.name.c_str(), train_.examples.size(), dev_.examples.size(), labels_.size(),
                tokenizer_->vocab_size(), long(steps_per_epoch_), spec_.train.batch_size, ranks_.world,
                spec_.train.gradient_accumulation_steps > 1
                    ? StrFormat(" x %d accumulated", spec_.train.gradient_accumulation_steps).c_str()
                    : "",
                long(GlobalBatch()), ToString(spec_.train.precision), device_.str().c_str(), torch::get_num_threads()));
  if (reducer_)
    LogInfo(StrFormat("gradient all-reduce over %s: %zu buckets (%s), overlap %s, compression %s",
                      ranks_.comm->backend().c_str(), reducer_->num_buckets(), reducer_->Describe().c_str(),
                      spec_.distributed.overlap ? "on" : "off", spec_.distributed.fp16_compression ? "fp16" : "none"));
  if (writers_)
    LogInfo(writers_->writers.size() > 1
                ? "checkpoints: on each host's own disk, written by " + writers_->Describe(*ranks_.comm)
                : std::string("checkpoints: written once, by rank 0 (every host sees its run folder)"));
  if (resume_from_)
    LogInfo(StrFormat("resuming from %s (epoch %ld, step %ld)", resume_from_->c_str(), long(progress_.epoch + 1),
                      long(progress_.global_step)));
  const int64_t total = TotalSteps(), all = steps_per_epoch_ * spec_.train.epochs;
  if (total < all)
    LogWarn(StrFormat("train.max_steps (%ld) ends the run in epoch %ld of %d: %ld of its %ld steps", long(total),
                      long(EpochsToRun(total)), spec_.train.epochs, long(total), long(all)));
}

nlohmann::json Trainer::Summary(Clock::time_point run_start) const {
  nlohmann::json summary = {{"job", spec_.name},
                            {"job_file", spec_.source_file},
                            {"status", "succeeded"},
                            {"global_step", progress_.global_step},
                            {"ranks", ranks_.world},
                            {"global_batch", GlobalBatch()},
                            {"precision", ToString(spec_.train.precision)},
                            {"device", device_.str()},
                            {"threads", torch::get_num_threads()},
                            {"consistency_checks", consistency_checks_},
                            {"wall_time_s", MsSince(run_start) / 1000.0}};
  // The run folder (and the model in it) is on rank 0's host, which may be another
  // machine than the one that started the job.
  summary["host"] = ranks_.comm ? ranks_.comm->Host(0) : LocalHostName();
  // train.cuda_graph: the batch shapes whose step was captured (0 when steps ran eagerly).
  summary["cuda_graphs"] = graphs_ ? graphs_->graphs() : 0;
  return summary;
}

// The trained weights as a Hugging Face folder: the whole model, or LoRA's adapter in
// PEFT's layout (and with model.lora.merge, the merged model too). Returns the folder
// the job names as its model.
std::string Trainer::SaveModel(nlohmann::json* summary) {
  const std::string model_dir = run_dir() + "/model";
  // The trained fp32 weights, not their bf16 copies: training is over.
  if (spec_.train.bf16_weights) optimizer_->ReleaseMasters();
  if (!spec_.model.lora.enabled) {
    SaveHfModel(model_dir, *model_);
    SaveTokenizerFiles(model_dir, spec_.data.tokenizer);
    return model_dir;
  }
  const std::string adapter_dir = run_dir() + "/adapter";
  SaveAdapter(adapter_dir, *model_, lora_.options, spec_.model.init);
  (*summary)["adapter_dir"] = adapter_dir;
  if (!spec_.model.lora.merge) return adapter_dir;
  SaveMergedModel(model_dir, *model_);
  SaveTokenizerFiles(model_dir, spec_.data.tokenizer);
  return model_dir;
}

void Trainer::SaveResults(RunLog& log, nlohmann::json* summary) {
  const std::string model_dir = SaveModel(summary);
  (*summary)["model_dir"] = model_dir;
  log.AddArtifacts(model_dir, "model");
  (*summary)["epochs"] = log.rows().size();
  if (!log.rows().empty()) {
    const EpochRow& last = log.rows().back();
    (*summary)["final"] = {{"train_loss", last.train_loss}, {"eval_loss", last.eval_loss}, {"eval_acc", last.eval_acc}};
    if (causal_lm()) (*summary)["final"]["eval_perplexity"] = std::exp(last.eval_loss);
  }
  log.WriteSummary(*summary);
}

}  // namespace trainyard
