// The typed form of a job YAML file. A job file is parsed and validated once, by
// LoadJobSpec(); everything downstream reads these structs and never the YAML.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard {

// A job file that cannot be used. what() is one line:
//   "<file>:<line>:<column>: <key.path>: <what was expected>"
class SpecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class JobKind { kFinetune, kBenchmark, kInference, kGenerate, kServe };
// What a finetune job trains: a sequence classifier (labels) or a causal LM (next token).
enum class TaskKind { kClassification, kCausalLm };
enum class Precision { kFp32, kBf16, kFp16 };
// train.lr_schedule after the warm-up (worker/train/lr_schedule.h).
enum class ScheduleKind { kLinear, kCosine, kConstant };
enum class DeviceChoice { kAuto, kCpu, kCuda };
enum class TokenizerKind { kWordPiece, kSentencePiece, kByteLevelBpe };
// Byte-level BPE's single-sentence template: kRoberta "<s> text </s>", kGpt2 the text's
// pieces alone; kAuto picks kRoberta when vocab.json has <s> and </s>.
enum class BpeTemplate { kAuto, kRoberta, kGpt2 };
enum class DataFormat { kTsv, kJsonl, kText };

struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::kWordPiece;
  std::string vocab;      // WordPiece vocab.txt or byte-level BPE vocab.json (absolute path)
  bool lowercase = true;  // WordPiece: BERT uncased rules (also strips accents)
  std::string model;      // SentencePiece .model; trained from data.train if absent
  int vocab_size = 8000;  // SentencePiece training only
  // Byte-level BPE: merges.txt (absolute path); a space before text that does not start
  // with one (HF's add_prefix_space); the template (YAML key `template`).
  std::string merges;
  bool add_prefix_space = false;
  BpeTemplate bpe_template = BpeTemplate::kAuto;
  // A model.init folder's tokenizer.json (absolute path) when it has no classic files:
  // then `vocab` and `merges` are empty and the tokenizer is built from this file
  // (common/tokenizer_json.h), whose settings `kind`, `lowercase` and
  // `add_prefix_space` hold.
  std::string tokenizer_json;
};

struct DataSpec {
  std::string train, dev;  // absolute paths; dev may be empty
  std::string labels;      // optional labels.txt (one label a line); else labels seen in train
  DataFormat format = DataFormat::kTsv;
  std::string text_field = "text", label_field = "label";  // JSONL keys
  TokenizerSpec tokenizer;
  int max_seq_len = 128;
  int bucket_batches = 50;  // batches per length-sorted window of the sampler
  // Each batch padded up to one of this many lengths, spaced evenly up to max_seq_len and
  // rounded up to multiples of 8 (PadBucketLengths); 0 pads to the batch's longest text.
  int pad_buckets = 0;
  int prefetch_batches = 8;  // 0 turns the background pipeline off
  int loader_threads = 2;
};

// model.lora: fine-tune low-rank adapters instead of every weight (PEFT's LoRA).
struct LoraSpec {
  bool enabled = false;  // the section is present
  int r = 8;
  double alpha = 8.0, dropout = 0.0;
  std::vector<std::string> target_modules;   // empty (and no target_regex): the family's PEFT default
  std::string target_regex;                  // target_modules written as one string: a regex (PEFT's form)
  std::vector<std::string> modules_to_save;  // trained in full, besides a classifier's head
  bool use_rslora = false;                   // scaling alpha / sqrt(r) instead of alpha / r
  bool merge = false;                        // also write runs/<name>/model/ with the adapters merged in
  std::string adapter;  // a PEFT adapter folder to start from (its config decides r, alpha, targets)
};

struct ModelSpec {
  // bert | roberta | distilbert | gpt2: the family of a preset. With `init`, the
  // folder's config.json decides, and a family given here must agree with it.
  std::string family;
  std::string preset = "tiny";  // tiny | mini | base
  std::string init;             // HF checkpoint dir (model.safetensors + config.json); empty = random init
  double dropout = 0.1;
  // auto | always | never: run an encoder's dense layers over the real tokens only
  // (TokenIndex in worker/models/layers.h). auto: on the CPU, when padding is over 10%
  // of a batch.
  std::string unpad = "auto";
  // auto | true | false: run each encoder block's dropout + residual add + LayerNorm as
  // one CUDA kernel forward and one backward (worker/kernels/fused_add_norm.h) where the
  // tensors are on a GPU; BERT and RoBERTa have such blocks. auto: in the steps that
  // train (kind: finetune, benchmark mode: train_step), where a lent GPU measured them
  // faster, for the families that have them; true also asks it of inference and fails
  // for a family without them.
  std::string fused_kernels = "auto";
  LoraSpec lora;
};

struct LossScaleSpec {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int growth_interval = 2000;
};

enum class GraphMode { kOff, kAuto, kOn };

struct TrainSpec {
  int epochs = 3;
  int batch_size = 32;  // per rank and micro-batch
  // Micro-batches per optimizer step: the global batch is batch_size x ranks x this, and
  // the gradients are all-reduced once per optimizer step.
  int gradient_accumulation_steps = 1;
  int64_t max_steps = 0;  // 0 = no limit
  double lr = 5e-4, weight_decay = 0.01, warmup_ratio = 0.1, max_grad_norm = 1.0;
  ScheduleKind lr_schedule = ScheduleKind::kLinear;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  Precision precision = Precision::kFp32;
  LossScaleSpec loss_scale;
  // Whole-step CUDA graphs (worker/jobs/graphed_steps.h): kAuto where the device and the
  // communicator allow them (CUDA, one rank or NCCL), kOn insists (an error where they
  // cannot run), kOff steps eagerly.
  GraphMode cuda_graph = GraphMode::kOff;
  // With precision bf16: every linear layer's weight is stored in bf16, so autocast
  // casts none of them on each forward, and AdamW trains fp32 master copies of them
  // (AdamW in worker/train/optimizer.h). Needs precision: bf16.
  bool bf16_weights = false;
  // train.early_stopping: the run ends once `patience` evaluations in a row have not
  // bettered checkpoint.best_metric's best by more than `threshold` (HF's
  // EarlyStoppingCallback).
  struct EarlyStopping {
    bool enabled = false;  // the section is present
    int64_t patience = 1;
    double threshold = 0;
  } early_stopping;
};

// eval: when a finetune job is evaluated, on what, and what it reports
// (docs/training.md, "Evaluation").
struct EvalSpec {
  int64_t every_steps = 0;  // also after every N-th optimizer step; 0: at epoch ends only
  // Reported besides the loss: classification accuracy, f1, precision, recall (macro
  // averages, scikit-learn's); causal_lm accuracy (next token) and perplexity. Empty:
  // all of the task's (EvalMetricNames).
  std::vector<std::string> metrics;
  std::string test;    // a split evaluated once, at the end (absolute path); may be empty
  int batch_size = 0;  // examples per rank in an evaluation batch; 0: twice train.batch_size
};

struct CheckpointSpec {
  int64_t every_steps = 0;  // 0 = at the end of each epoch only
  int keep = 2;
  std::string resume = "none";  // none | auto | <checkpoint file>
  // An evaluation metric ("eval_f1"): each evaluation that betters it is checkpointed,
  // that checkpoint is kept beside the newest `keep`, and its weights become model/.
  std::string best_metric;
  bool greater_is_better = true;  // given, or false for eval_loss and eval_perplexity
};

struct RuntimeSpec {
  DeviceChoice device = DeviceChoice::kAuto;
  int threads = 0;    // intra-op threads per rank; 0 = libtorch's default
  bool tf32 = false;  // CUDA fp32 matrix products on TF32 tensor cores
  // auto | mkl | onednn: the library of fp32 CPU products on frozen weights
  // (worker/kernels/packed_linear.h).
  std::string cpu_gemm = "auto";
  // once | each_pass: under bf16/fp16 autocast, frozen linear weights cast to the compute
  // dtype once and kept (worker/kernels/compute_dtype_weights.h), or by autocast on every
  // pass (the fp32 weights alone in memory).
  std::string weight_casts = "once";
  // Free CPU blocks of 256 KiB or more kept for reuse, at most this many MiB
  // (worker/kernels/cpu_block_cache.h); 0 leaves large buffers to glibc.
  int64_t cpu_block_cache_mb = 512;
};

// What a job asks of the coordinator's pool (ignored by a standalone worker).
struct ResourcesSpec {
  int ranks = 1;                // all from one MPI world
  std::string device = "any";   // cpu | cuda | any
  int priority = 0;             // higher runs first
  int max_restarts = 2;         // requeues after a failed attempt, resuming from checkpoints
  double estimate_minutes = 0;  // expected run time; lets the job backfill (0 = unknown)
  bool preemptible = true;      // coordinator --preemption on may stop it for a higher priority
};

enum class CommBackend { kAuto, kMpi, kNccl };

// distributed.elastic: the job's replicas (one rank each) train through a quorum per
// step and go on when one is lost (Note [Elastic finetune] in worker/jobs/
// trainer_elastic.cc; docs/many-hosts.md). Off while max_replicas is 0.
struct ElasticSpec {
  int min_replicas = 1;
  int max_replicas = 0;       // the replicas at full strength; the global batch is for them
  double join_window_s = 10;  // how long a forming quorum waits for max_replicas
  bool enabled() const { return max_replicas > 0; }
};

struct DistributedSpec {
  CommBackend backend = CommBackend::kAuto;  // auto: NCCL for CUDA jobs when built, else MPI
  double bucket_mb = 25.0;                   // gradient bucket size
  bool overlap = true;                       // all-reduce buckets during backward (false: after it)
  bool fp16_compression = false;
  double timeout_s = 300.0;        // deadline of every collective
  bool check_consistency = false;  // compare a parameter hash across ranks every step
  ElasticSpec elastic;
};

// How a model's forward runs: libtorch eagerly, a TorchScript file, a captured CUDA
// graph, int8 Linear layers, or an AOTInductor package (benchmark.modes; inference.mode
// takes eager, int8 and aoti).
enum class ForwardMode { kEager, kTorchScript, kCudaGraph, kInt8, kAoti };

// sweep: forward passes over batch x seq_len cells; train_step: training steps;
// generate: a causal LM generating new_tokens after prompts of seq_len tokens.
enum class BenchmarkRun { kSweep, kTrainStep, kGenerate };

struct BenchmarkSpec {
  BenchmarkRun run = BenchmarkRun::kSweep;  // the key `mode`
  std::vector<int> batch_sizes = {1, 2, 4, 8};
  std::vector<int> seq_lens = {8, 64, 128};
  std::vector<Precision> precisions = {Precision::kFp32};
  std::vector<ForwardMode> modes = {ForwardMode::kEager};
  std::string torchscript;  // .pt file for the torchscript mode
  std::string aoti;         // .pt2 package for the aoti mode (scripts/export_aoti.py)
  int warmup = 3, iters = 10;
  double max_cv = 0.10;      // a cell noisier than this is measured again
  int max_remeasure = 2;     // ... at most this often, then flagged
  double memory_cap_mb = 0;  // 0 = none; a cell needing more is "OOM"
  int train_steps = 20;      // train_step: steps timed (first excluded)
  int new_tokens = 32;       // generate: tokens generated after each prompt
};

struct InferenceSpec {
  std::string input;   // dataset file to predict over
  std::string output;  // predictions TSV; default runs/<name>/predictions.tsv
  int batch_size = 64;
  std::string sort_by_length = "true";     // true | false | both (both: runs each, compares)
  ForwardMode mode = ForwardMode::kEager;  // eager | int8 (dynamic int8 Linear layers, CPU) | aoti
  std::string aoti;                        // the aoti mode's .pt2 package (scripts/export_aoti.py)
};

// kind: generate. Prompts are a text file, one prompt a line (\t \n \\ escapes).
struct GenerateSpec {
  std::string prompts;  // absolute path
  std::string output;   // JSONL, a line per prompt; default runs/<name>/generations.jsonl
  int batch_size = 8;   // prompts per batch, left-padded to the longest
  int max_new_tokens = 32;
  bool sample = false;  // strategy: greedy (false) | sample
  double temperature = 1.0, top_p = 1.0;
  int top_k = 0;
  std::vector<std::string> stop;  // stop tokens as written in the vocabulary; default: the model's eos
  bool ignore_stop = false;       // benchmarks: every row generates max_new_tokens
  bool cuda_graph = false;        // decode steps replay one captured CUDA graph (CUDA only)
};

// kind: serve: a model repository served over the Open Inference Protocol (KServe V2).
// What the keys do is explained where they act: worker/serve/server_core.h (versions,
// admission) and worker/serve/batcher.h (batching).
struct ServeSpec {
  std::string repository;          // absolute: <repository>/<model>/<version>/ holds an HF folder
  std::string host = "127.0.0.1";  // every listener's address; off loopback access_token is required
  int http_port = 8000, grpc_port = 8001, metrics_port = 8002;  // 0: any free port (logged)
  std::string access_token;                // read from access_token_file; required on both transports when set
  int max_batch_size = 32;                 // requests per batch
  int max_batch_tokens = 4096;             // batch rows x longest row, the padded tokens a batch may hold
  std::vector<int> preferred_batch_sizes;  // a batch of one of these sizes goes at once
  double max_queue_delay_ms = 5;           // how long the oldest request waits for companions
  int max_queue = 1024;                    // queued requests, all models; beyond it: 429
  double default_timeout_ms = 10000;       // a request's deadline when it names none
  int max_body_mb = 16;                    // HTTP body and gRPC message cap
  double keep_alive_s = 60;                // an HTTP connection idle this long is closed
  double request_timeout_s = 30;           // an HTTP request must arrive whole, and its response be taken, within this
  int max_connections = 4096;              // HTTP connections held; beyond: the longest idle is closed
  int grpc_max_connections = 1024;         // gRPC connections held; beyond: the quietest is closed (grpc_gate.h)
  double poll_s = 2;                       // repository poll period for new versions (0: load requests only)
  bool truncate = true;                    // text past the model's positions: cut (true) or rejected (false)
  bool length_aware = true;                // group requests of similar length (off: arrival order)
  bool cuda_graphs = true;                 // on a GPU: a batch runs in the CUDA graph of its warm-up bucket
};

// Fault injection for tests of the failure paths; off unless set.
struct DebugSpec {
  bool force_loss_scaling = false;  // run the fp16 loss-scaler path without fp16 autocast
  int64_t plant_inf_step = -1;      // 1-based step whose gradients get an inf ...
  int plant_inf_rank = 0;           // ... on this rank only
  // A pause after every training step, on every rank: a test's job that must stay
  // running for a while (to be preempted, signalled, cut off) without the work. Numerics
  // are unchanged; the epochs' time includes the pauses, the steps' does not.
  int64_t step_pause_ms = 0;
};

struct LogSpec {
  std::string runs_dir;  // absolute; empty = "runs" under the working directory
  int steps_every = 20;  // steps.jsonl cadence
  bool progress = true;
  int64_t profile_steps = 0;       // steps profiled with the Kineto profiler; 0 = off
  int64_t profile_from_step = 11;  // the first of them (1-based global step)
  bool trace = false;              // per-rank Chrome trace (common/trace_recorder.h)
  int64_t trace_steps = 100;       // the last steps it keeps
  // MLflow tracking (log.mlflow); off while mlflow_uri is empty.
  std::string mlflow_uri;                     // http(s)://host[:port][/prefix] of a tracking server
  std::string mlflow_experiment = "Default";  // created if it does not exist
  std::string mlflow_run_name;                // empty: the job's name
};

struct JobSpec {
  std::string source_file;  // the YAML the spec came from
  std::string base_dir;     // the folder its relative paths were resolved against
  std::string name;
  JobKind kind = JobKind::kFinetune;
  TaskKind task = TaskKind::kClassification;  // kind: generate implies causal_lm
  uint64_t seed = 1234;
  DataSpec data;
  ModelSpec model;
  TrainSpec train;
  EvalSpec eval;
  CheckpointSpec checkpoint;
  RuntimeSpec runtime;
  ResourcesSpec resources;
  DistributedSpec distributed;
  DebugSpec debug;
  BenchmarkSpec benchmark;
  InferenceSpec inference;
  GenerateSpec generate;
  ServeSpec serve;
  LogSpec log;
  // "file:line:column" of every key read from the file, by key path ("train.epochs").
  std::map<std::string, std::string> locations;
  // Every scalar the file set, as written, by key path (a list as "[a, b]"): what the
  // user asked for, logged as MLflow params.
  std::map<std::string, std::string> values;
  // The document as parsed, after SpecOverrides, emitted again as YAML (the file's
  // comments are not kept): written to runs/<name>/job.yaml.
  std::string effective_yaml;

  // "<file>:<line>:<column>: <key>" for messages about a value read from the job file.
  std::string Where(const std::string& key_path) const;
};

// What makes a job differ from its file (spec_overrides.h): keys set on the command
// line, applied in order after the file is read, and ${VAR} / ${VAR:-default} in the
// file's values expanded from the environment.
struct SpecOverrides {
  struct Set {
    std::string key_path;  // "train.lr"
    std::string value;     // YAML ("3e-5", "[1, 2]"), or the string itself where `literal`
    bool literal = false;
    std::string origin;  // how it was given, for messages: "--set train.lr=3e-5", "--max-steps 30"
  };
  std::vector<Set> sets;
  bool expand_environment = false;

  // Adds an assignment as `worker --set` takes it: "KEY.PATH=VALUE". Throws SpecError
  // ("--set ...: expected KEY.PATH=VALUE ...") without an '=' or a key.
  void AddAssignment(const std::string& assignment);
  // Adds a value given by another flag, as `origin` ("--max-steps 30"): YAML text, or a
  // string taken as it is where `literal` (a path).
  void Add(const std::string& key_path, const std::string& value, const std::string& origin, bool literal = false);
};

// Parses and validates a job file. Relative paths resolve against the file's folder
// (a path given through `overrides` too: make it absolute to mean another folder).
// Throws SpecError (file:line:column: key: message, or "--set k=v: key: message" for an
// overridden key) on any problem, including missing input files.
JobSpec LoadJobSpec(const std::string& path, const SpecOverrides& overrides = {});

// A job file's text: a regular file of at most 16 MiB, read without blocking on a FIFO
// or device. Throws SpecError ("<path>:0:0: <file>: ...") otherwise.
std::string ReadJobFile(const std::string& path);

// Same, from YAML text; `source_name` is used in messages and `base_dir` for paths.
JobSpec ParseJobSpec(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir,
                     const SpecOverrides& overrides = {});

// The metrics eval.metrics may name for `task`, in report order (each reported as
// "eval_<name>", with eval_loss always).
const std::vector<std::string>& EvalMetricNames(TaskKind task);

const char* ToString(Precision p);
const char* ToString(JobKind k);
const char* ToString(ForwardMode m);

}  // namespace trainyard
