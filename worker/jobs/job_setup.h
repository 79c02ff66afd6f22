// The start of every job kind: choose the device, read labels and texts, build the
// tokenizer and the model. Problems with the user's inputs become InputError (exit
// code 2) naming the job file, line and key.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common/spec/job_spec.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "worker/comm/communicator.h"
#include "worker/models/lora.h"
#include "worker/models/model.h"
#include "worker/report/job_hooks.h"
#include "worker/train/batch_pipeline.h"

namespace trainyard {

// Where this process sits in the job. `comm` is null for a single rank; `hooks` is
// null outside a worker pool.
struct ElasticRun;  // worker/jobs/trainer.h

struct RankContext {
  int rank = 0, world = 1, local_rank = 0;
  Communicator* comm = nullptr;
  JobHooks* hooks = nullptr;
  // Set by the runtime, which owns the process's signal handling, for jobs that end on a
  // signal: kind: serve (SIGINT, SIGTERM), and a standalone finetune job (SIGTERM, a
  // scheduler's preemption; SIGUSR1, a time limit ahead). True once one arrived.
  const std::atomic<bool>* stop_signal = nullptr;
  // An elastic replica's job (Trainer::RunElastic): the replicas at full strength, which
  // the global batch is for, and how it reaches its peers; 0 and null otherwise.
  int elastic_replicas = 0;
  const ElasticRun* elastic = nullptr;
};

// Note [Stop agreement]
// In a pool, a job is stopped (cancelled, or its pool shut down) by a StopJob message
// that reaches each of its ranks at a different moment. A rank that simply returned
// would leave the others waiting in their next collective until its deadline. So a
// rank only ever acts on a stop that all ranks have agreed on at the same point of the
// job: StopAsked() is the local, cheap request flag; AgreeOnStop() ORs it over the
// ranks in a collective of its own and throws JobStopped on every rank alike. The
// finetune loop avoids that extra collective per step: each rank's vote rides in the
// first gradient bucket (see Reducer), and every rank reads the summed votes at the
// same steps (each step on CPU, each logging interval on CUDA) and stops there.
// Benchmark jobs agree after their cells, inference after its batches.
// A standalone finetune job takes a stop signal (RankContext::stop_signal) as a request
// in the same way, and writes a checkpoint where its ranks stopped (JobPreempted); so
// does a pool job whose stop is a preemption (JobHooks::PreemptRequested, which rank 0
// then broadcasts, since only it hears the agent).
// No-ops for a standalone job without one; `where` (for the message) is only called when
// stopping.
inline bool StopAsked(const RankContext& ranks) {
  return (ranks.hooks && ranks.hooks->StopRequested()) || (ranks.stop_signal && ranks.stop_signal->load());
}
void AgreeOnStop(const RankContext& ranks, const std::function<std::string()>& where);

// A problem with what the user gave us (exit code 2). what() is one line naming the
// job file, line and key, and the file at fault.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// CUDA devices this process can use (0 without CUDA).
int VisibleGpus();

// Rank `rank`'s contiguous share [begin, end) of `n` items split as evenly as possible
// over `world` ranks: the first n % world ranks get one more.
std::pair<size_t, size_t> RankShard(size_t n, int rank, int world);

// <log.runs_dir or ./runs>/<job name>: where rank 0 writes the job's outputs.
std::string RunDir(const JobSpec& spec);

// Rank 0's last word on a job: `summary` as RunDir(spec)/summary.json, written
// atomically, with the job that ran (WriteEffectiveJob).
void WriteJobSummary(const JobSpec& spec, const nlohmann::json& summary);

// Rank 0: the job as it runs (its file after --set and ${VAR} expansion) as
// RunDir(spec)/job.yaml, written atomically.
void WriteEffectiveJob(const JobSpec& spec);

// The input pipeline's options for this job (pinned memory on CUDA).
PipelineOptions PipelineOptionsFor(const JobSpec& spec, const torch::Device& device);

// Throws InputError if RunDir(spec), or its checkpoints/ or tb/, is a symbolic link or
// a file, or if a file stands where a folder above it should be (log.runs_dir under a
// file). Creates nothing: a job refused later leaves no run folder behind.
void CheckRunFolder(const JobSpec& spec);

// What every job kind does first: the run folder's check (CheckRunFolder), intra-op threads,
// the seed, TF32 for CUDA matrix products, and the device: CUDA when available and not
// refused (the node-local rank picks the GPU), else CPU. Throws InputError for what this machine cannot do (CUDA
// asked for and absent; fp16 training or inference without CUDA).
torch::Device PrepareRuntime(const JobSpec& spec, const RankContext& ranks);

// data.labels if given, else empty (to be collected from the first dataset read).
LabelSet LoadLabels(const JobSpec& spec);

// Reads `path` (named by `key` in the job file). Unknown labels are an error unless
// `any_label` is set, in which case they get id -1.
TextDataset LoadTexts(const JobSpec& spec, const std::string& key, const std::string& path, LabelSet* labels,
                      bool any_label = false);

std::unique_ptr<Tokenizer> LoadTokenizer(const JobSpec& spec, const TextDataset& train);

// Copies the tokenizer's files into a model folder as Hugging Face names them (vocab.txt;
// vocab.json + merges.txt) with a tokenizer_config.json, so the folder is whole: served
// as a model version, or read by transformers' AutoTokenizer. SentencePiece: nothing.
void SaveTokenizerFiles(const std::string& folder, const TokenizerSpec& tokenizer);

// model.init (a Hugging Face folder, whose config.json names the family) or a fresh
// model.preset of model.family; the classifier gets `labels` unless `keep_init_labels`
// and the checkpoint names its own. A preset's positions cover max_sequence tokens, and
// a finetune job's at least its family's released count (512; GPT-2 1024).
// With model.lora, the adapters are attached (and model.lora.adapter loaded) and only
// they and modules_to_save keep requires_grad; *lora, if given, receives what was done.
// Throws InputError located at the job-file key at fault.
Model BuildModel(const JobSpec& spec, const Tokenizer& tokenizer, const std::vector<std::string>& labels,
                 int64_t max_sequence, bool keep_init_labels = false, LoraSummary* lora = nullptr);

}  // namespace trainyard
