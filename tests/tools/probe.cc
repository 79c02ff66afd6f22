// ty_probe: drives single components of the worker from the command line, so the
// Python reference tests (tests/reference/) can compare them with Hugging Face and
// PyTorch on identical inputs.
//   ty_probe tokenize VOCAB [--cased] [--max-len N]  stdin: one TSV-escaped text a line; stdout: ids
//   ty_probe logits MODEL_DIR INPUTS.json [--device D] [--precision P] [--mode eager|int8]
//                                            stdout: JSON logits of our model (fp32 values);
//                                            int8: its Linear layers dynamically quantized
//   ty_probe scaler PATTERN INIT INTERVAL [--device D]
//                                            stdout: JSON scale/skip sequence
//   ty_probe graph MODEL_DIR INPUTS.json     stdout: JSON logits, eager and CUDA-graph replay
//                                            (as a benchmark job's cuda_graph cells run it)
//   ty_probe resave SRC_DIR DST_DIR          load an HF folder into our model, save it again
//   ty_probe generate MODEL_DIR INPUTS.json [--device D]
//                                            stdout: JSON token ids generated from the prompts
//   ty_probe torchscript MODEL.pt INPUTS.json stdout: JSON logits of a TorchScript module
//   ty_probe aoti PACKAGE.pt2 INPUTS.json     stdout: JSON logits of an AOTInductor package
//   ty_probe lr-schedule linear|cosine|constant PEAK WARMUP_RATIO TOTAL_STEPS [...]
//                                            stdout: JSON lr of optimizer steps 0..TOTAL,
//                                            a list for each schedule named
//   ty_probe eval-metrics CLASSES           stdin: "TRUE PREDICTED" class ids, a pair a line;
//                                            stdout: JSON of the classification metrics
//                                            evaluations report (worker/report/eval_metrics.h)
//   ty_probe gemv [--threads N] [--rows 1,2,4,8,16]
//                                            stdout: JSON ms of one pass over GPT-2-small's
//                                            block weights (12 layers, 340 MB, more than any
//                                            cache), RowsTimesWeight against at::addmm
//   ty_probe gemm [--threads N] [--tokens 4096] [--hidden 256]
//                                            stdout: JSON ms of each product of one BERT
//                                            layer of that width (and its dL/dx product),
//                                            PackedLinear (oneDNN) against torch::linear
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/process_exit.h"
#include "data/text_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "worker/train/amp.h"
#ifdef TRAINYARD_WITH_CUDA
#include "worker/compiled/cuda_graph.h"
#endif
#include "worker/compiled/aoti_package.h"
#include "worker/generation/generation.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/packed_linear.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/models/lora.h"
#include "worker/models/quantize.h"
#include "worker/report/eval_metrics.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/optimizer.h"

namespace trainyard {
namespace {

int Tokenize(int argc, char** argv) {
  if (argc < 3) return 2;
  bool cased = false;
  int max_len = 1 << 20;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--cased") cased = true;
    if (std::string(argv[i]) == "--max-len" && i + 1 < argc) max_len = std::stoi(argv[++i]);
  }
  WordPieceTokenizer tokenizer(argv[2], !cased);
  std::string line;
  while (std::getline(std::cin, line)) {
    auto ids = tokenizer.Encode(UnescapeTsvField(line), max_len);
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

// The value after `flag` among argv[first..], or `fallback`.
std::string Option(int argc, char** argv, int first, const std::string& flag, const std::string& fallback) {
  for (int i = first; i + 1 < argc; ++i)
    if (argv[i] == flag) return argv[i + 1];
  return fallback;
}

Precision PrecisionNamed(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  throw std::invalid_argument("unknown precision '" + name + "'");
}

torch::Tensor ToTensor(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows)
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return torch::tensor(flat, torch::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

// A float CPU matrix as JSON rows.
nlohmann::json Rows(const torch::Tensor& logits) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < logits.size(0); ++i) {
    auto row = logits[i].contiguous();
    rows.push_back(std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel()));
  }
  return rows;
}

// A float CPU tensor of any rank as nested JSON lists.
nlohmann::json Nested(const torch::Tensor& t) {
  if (t.dim() <= 2) return Rows(t.dim() == 1 ? t.unsqueeze(0) : t);
  nlohmann::json out = nlohmann::json::array();
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(Nested(t[i]));
  return out;
}

// {"logits": [[...], ...]} on stdout, a row per input ([B, S, V] nested for a causal LM).
void PrintLogits(const torch::Tensor& logits) {
  std::cout << nlohmann::json{{"logits", Nested(logits)}}.dump() << "\n";
}

// The model a HF folder holds, of the task its config.json's architectures name.
Model LoadModel(const std::string& dir, const torch::Device& device) {
  const nlohmann::json config = ReadHfConfig(dir);
  Model model = CreateModel(config, TaskOf(config));
  LoadHfWeights(dir, *model);
  model->to(device);
  model->eval();
  return model;
}

nlohmann::json ReadInputs(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

int Logits(int argc, char** argv) {
  if (argc < 4) return 2;
  const torch::Device device(Option(argc, argv, 4, "--device", "cpu"));
  const Precision precision = PrecisionNamed(Option(argc, argv, 4, "--precision", "fp32"));
  Model model = LoadModel(argv[2], device);
  if (const std::string adapter = Option(argc, argv, 4, "--adapter", ""); !adapter.empty()) {
    ApplyLora(*model, ReadAdapterConfig(adapter));
    LoadAdapter(adapter, *model);
    model->to(device);
    model->eval();
  }
  Freeze(*model);  // as the inference job does
  if (Option(argc, argv, 4, "--mode", "eager") == "int8") QuantizeLinearsInt8(*model);
  nlohmann::json inputs = ReadInputs(argv[3]);
  torch::NoGradGuard no_grad;
  AutocastScope autocast(device.type(), precision);
  torch::Tensor logits =
      model->forward(ToTensor(inputs["input_ids"]).to(device), ToTensor(inputs["attention_mask"]).to(device));
  PrintLogits(logits.to(torch::kFloat).cpu());
  return 0;
}

int Graph(int argc, char** argv) {
  if (argc < 4) return 2;
#ifdef TRAINYARD_WITH_CUDA
  const torch::Device device(torch::kCUDA, 0);
  Model model = LoadModel(argv[2], device);
  nlohmann::json inputs = ReadInputs(argv[3]);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = ToTensor(inputs["input_ids"]).to(device);
  const torch::Tensor mask = ToTensor(inputs["attention_mask"]).to(device);
  auto eager = [&] { return model->forward(ids, mask); };
  torch::Tensor expected = eager().cpu();
  auto replay = CaptureCudaGraph(eager, device);
  replay();
  torch::Tensor replayed = replay().cpu();
  std::cout << nlohmann::json{{"eager", Rows(expected)}, {"graph", Rows(replayed)}}.dump() << "\n";
  return 0;
#else
  std::cerr << "ty_probe graph: this build has no CUDA\n";
  return 2;
#endif
}

// Replays a pattern of steps ('1' = plant an inf in the gradients) through
// GradScaler + AdamW on one parameter, printing what torch.amp.GradScaler reports, and
// the optimizer's count of the steps it did not skip.
int Scaler(int argc, char** argv) {
  if (argc < 5) return 2;
  const std::string pattern = argv[2];
  LossScaleSpec spec;
  spec.init_scale = std::stod(argv[3]);
  spec.growth_interval = std::stoi(argv[4]);
  const torch::Device device(Option(argc, argv, 5, "--device", "cpu"));
  GradScaler scaler(spec, true, device);
  torch::Tensor w = torch::ones({4}, torch::TensorOptions().device(device).requires_grad(true));
  AdamW optimizer({{"w", w}}, AdamWOptions{});
  nlohmann::json scales = nlohmann::json::array(), skipped = nlohmann::json::array();
  for (char c : pattern) {
    torch::Tensor loss = (w * w).sum();
    scaler.Scale(loss).backward();
    if (c == '1') {
      torch::NoGradGuard no_grad;
      w.mutable_grad()[1] = std::numeric_limits<float>::infinity();
    }
    // The trainer's step: the skip is decided on the device, inside the optimizer's kernel.
    const torch::Tensor found_inf = scaler.UnscaleAndCheck({w});
    optimizer.Step(1e-3, found_inf);
    scaler.Update(found_inf);
    optimizer.ZeroGrad();
    scales.push_back(scaler.scale());
    skipped.push_back(found_inf.item<float>() != 0.0f);
  }
  torch::Tensor final_w = w.detach().cpu();
  std::vector<float> weights(final_w.data_ptr<float>(), final_w.data_ptr<float>() + 4);
  std::cout << nlohmann::json{{"scales", scales},
                              {"skipped", skipped},
                              {"weights", weights},
                              {"optimizer_steps", optimizer.step_count()}}
                   .dump()
            << "\n";
  return 0;
}

int TorchScript(int argc, char** argv) {
  if (argc < 4) return 2;
  torch::jit::Module module = torch::jit::load(argv[2]);
  module.eval();
  std::ifstream in(argv[3]);
  nlohmann::json inputs = nlohmann::json::parse(in);
  torch::NoGradGuard no_grad;
  torch::IValue out = module.forward({ToTensor(inputs["input_ids"]), ToTensor(inputs["attention_mask"])});
  PrintLogits(out.isTuple() ? out.toTupleRef().elements()[0].toTensor() : out.toTensor());
  return 0;
}

int Aoti(int argc, char** argv) {
  if (argc < 4) return 2;
  AotiPackage package(argv[2], torch::kCPU);
  nlohmann::json inputs = ReadInputs(argv[3]);
  torch::NoGradGuard no_grad;
  PrintLogits(package.Forward(ToTensor(inputs["input_ids"]), ToTensor(inputs["attention_mask"])));
  return 0;
}

// Generates from prompts given as ids: {"prompts": [[ids]], "max_new_tokens", "pad_id",
// "stop_ids", "use_cache", "sample", "temperature", "top_k", "top_p", "seed",
// "decode": growing|fixed|graph}; prints {"tokens": [[ids]]}.
int GenerateTokens(int argc, char** argv) {
  if (argc < 4) return 2;
  Model model = LoadModel(argv[2], torch::Device(Option(argc, argv, 4, "--device", "cpu")));
  auto* lm = dynamic_cast<CausalLmImpl*>(model.get());
  if (!lm) throw std::runtime_error(std::string(argv[2]) + " is not a causal LM");
  Freeze(*model);  // as the generate job does
  const nlohmann::json in = ReadInputs(argv[3]);
  GenerationOptions options;
  options.max_new_tokens = in.value("max_new_tokens", int64_t(32));
  options.pad_id = in.value("pad_id", int64_t(0));
  options.stop_ids = in.value("stop_ids", std::vector<int64_t>{});
  options.use_cache = in.value("use_cache", true);
  options.sample = in.value("sample", false);
  options.temperature = in.value("temperature", 1.0);
  options.top_k = in.value("top_k", int64_t(0));
  options.top_p = in.value("top_p", 1.0);
  options.seed = in.value("seed", uint64_t(0));
  const std::string decode = in.value("decode", std::string("growing"));
  options.decode = decode == "fixed"   ? DecodeMode::kFixedShape
                   : decode == "graph" ? DecodeMode::kCudaGraph
                                       : DecodeMode::kGrowing;
  GenerationResult result = Generate(*lm, in.at("prompts").get<std::vector<std::vector<int64_t>>>(), options);
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < result.tokens.size(0); ++i) {
    torch::Tensor row = result.tokens[i].contiguous();
    rows.push_back(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  std::cout << nlohmann::json{{"tokens", rows}}.dump() << "\n";
  return 0;
}

// The model of MODEL with the adapter of ADAPTER attached and loaded.
Model AdaptedModel(const std::string& model_dir, const std::string& adapter, LoraSummary* summary) {
  Model model = LoadModel(model_dir, torch::kCPU);
  *summary = ApplyLora(*model, ReadAdapterConfig(adapter));
  LoadAdapter(adapter, *model);
  return model;
}

// lora-steps MODEL ADAPTER STEPS.json OUT: AdamW steps on the adapter over the given
// batches ({"lr", "weight_decay", "batches": [{"input_ids", "attention_mask", "labels"}]};
// a causal LM predicts its next tokens), then the adapter saved to OUT; prints
// {"trainable": count}.
int LoraSteps(int argc, char** argv) {
  if (argc < 6) return 2;
  LoraSummary summary;
  Model model = AdaptedModel(argv[2], argv[3], &summary);
  model->train();
  const nlohmann::json in = ReadInputs(argv[4]);
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  for (const auto& item : model->named_parameters())
    if (item.value().requires_grad()) trained.emplace_back(item.key(), item.value());
  AdamWOptions options;
  options.weight_decay = in.value("weight_decay", 0.0);
  AdamW optimizer(trained, options);
  namespace F = torch::nn::functional;
  for (const auto& batch : in.at("batches")) {
    torch::Tensor ids = ToTensor(batch["input_ids"]), mask = ToTensor(batch["attention_mask"]);
    torch::Tensor logits = model->forward(ids, mask), loss;
    if (model->info().task == ModelTask::kCausalLm) {
      torch::Tensor targets =
          ids.narrow(1, 1, ids.size(1) - 1).masked_fill(mask.narrow(1, 1, ids.size(1) - 1).eq(0), -100);
      torch::Tensor predictions = logits.narrow(1, 0, ids.size(1) - 1);
      loss = F::cross_entropy(predictions.reshape({-1, predictions.size(2)}), targets.reshape({-1}),
                              F::CrossEntropyFuncOptions().ignore_index(-100));
    } else {
      loss = F::cross_entropy(logits, torch::tensor(batch["labels"].get<std::vector<int64_t>>(), torch::kLong));
    }
    loss.backward();
    optimizer.Step(in.at("lr").get<double>());
    optimizer.ZeroGrad();
  }
  SaveAdapter(argv[5], *model, summary.options, argv[2]);
  std::cout << nlohmann::json{{"trainable", summary.trainable}, {"adapted", summary.adapted}}.dump() << "\n";
  return 0;
}

// merge MODEL ADAPTER OUT: the adapter merged into a plain HF folder.
int Merge(int argc, char** argv) {
  if (argc < 5) return 2;
  LoraSummary summary;
  Model model = AdaptedModel(argv[2], argv[3], &summary);
  SaveMergedModel(argv[4], *model);
  return 0;
}

// The median ms of `repeats` passes of f.
template <typename F>
double MedianMs(int repeats, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Gemv(int argc, char** argv) {
  at::set_num_threads(std::stoi(Option(argc, argv, 2, "--threads", "2")));
  std::vector<int64_t> row_counts;
  std::stringstream rows_list(Option(argc, argv, 2, "--rows", "1,2,4,8,16"));
  for (std::string item; std::getline(rows_list, item, ',');) row_counts.push_back(std::stoll(item));
  // GPT-2 small's Conv1D weights, [in, out]: c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  std::vector<torch::Tensor> weights, biases;
  for (int layer = 0; layer < 12; ++layer)
    for (const auto& [in, out] : shapes) {
      weights.push_back(torch::randn({in, out}) * 0.02);
      biases.push_back(torch::zeros({out}));
    }
  torch::InferenceMode inference;
  nlohmann::json report = nlohmann::json::array();
  for (const int64_t rows : row_counts) {
    torch::Tensor narrow = torch::randn({rows, 768}), wide = torch::randn({rows, 3072});
    auto pass = [&](bool ours) {
      for (size_t i = 0; i < weights.size(); ++i) {
        const torch::Tensor& x = weights[i].size(0) == 768 ? narrow : wide;
        ours ? RowsTimesWeight(x, weights[i], biases[i]) : torch::addmm(biases[i], x, weights[i]);
      }
    };
    // first touches
    pass(true);
    pass(false);
    const double ours = MedianMs(9, [&] { pass(true); }), addmm = MedianMs(9, [&] { pass(false); });
    report.push_back({{"rows", rows}, {"ours_ms", ours}, {"addmm_ms", addmm}});
  }
  std::cout << report.dump() << "\n";
  return 0;
}

// One BERT layer's products at width H over T tokens, forward (x W^T: the fused
// q/k/v, the attention output, the FFN's two) and backward (dL/dx = g W, which is
// x W^T with the shapes swapped), each timed through PackedLinear on oneDNN and
// through torch::linear (MKL) on the same inputs.
int Gemm(int argc, char** argv) {
  at::set_num_threads(std::stoi(Option(argc, argv, 2, "--threads", "2")));
  const int64_t tokens = std::stoll(Option(argc, argv, 2, "--tokens", "4096"));
  const int64_t h = std::stoll(Option(argc, argv, 2, "--hidden", "256"));
  struct Product {
    std::string name;
    int64_t in, out;
  };
  const std::vector<Product> products = {{"qkv", h, 3 * h},        {"attention_out", h, h}, {"ffn_up", h, 4 * h},
                                         {"ffn_down", 4 * h, h},   {"qkv_dx", 3 * h, h},    {"ffn_up_dx", 4 * h, h},
                                         {"ffn_down_dx", h, 4 * h}};
  SetCpuGemm(CpuGemm::kOneDnn);
  torch::InferenceMode inference;
  nlohmann::json report = nlohmann::json::array();
  for (const auto& p : products) {
    torch::Tensor x = torch::randn({tokens, p.in}), w = torch::randn({p.out, p.in}) * 0.02;
    PackedLinear packed;
    auto ours = [&] { packed.Forward(x, {w}, {torch::Tensor()}); };
    auto aten = [&] { torch::linear(x, w); };
    // the reorder, first touches
    ours();
    aten();
    const double ours_ms = MedianMs(9, ours), aten_ms = MedianMs(9, aten);
    report.push_back(
        {{"product", p.name}, {"m", tokens}, {"k", p.in}, {"n", p.out}, {"onednn_ms", ours_ms}, {"mkl_ms", aten_ms}});
  }
  std::cout << report.dump() << "\n";
  return 0;
}

// One list of rates per schedule named on the command line (four arguments each).
int Schedule(int argc, char** argv) {
  if (argc < 6 || (argc - 2) % 4 != 0) return 2;
  const std::map<std::string, ScheduleKind> kinds = {
      {"linear", ScheduleKind::kLinear}, {"cosine", ScheduleKind::kCosine}, {"constant", ScheduleKind::kConstant}};
  nlohmann::json schedules = nlohmann::json::array();
  for (int first = 2; first < argc; first += 4) {
    const int64_t total = std::stoll(argv[first + 3]);
    const LrSchedule schedule(kinds.at(argv[first]), std::stod(argv[first + 1]), std::stod(argv[first + 2]), total);
    nlohmann::json rates = nlohmann::json::array();
    for (int64_t step = 0; step <= total; ++step) rates.push_back(schedule.At(step));
    schedules.push_back(rates);
  }
  std::cout << schedules.dump() << "\n";
  return 0;
}

int EvalMetrics(int argc, char** argv) {
  if (argc < 3) return 2;
  const size_t classes = std::stoul(argv[2]);
  ClassCounts counts{std::vector<double>(classes), std::vector<double>(classes), std::vector<double>(classes)};
  size_t actual = 0, predicted = 0;
  while (std::cin >> actual >> predicted) {
    counts.actual.at(actual) += 1;
    counts.predicted.at(predicted) += 1;
    if (actual == predicted) counts.correct[actual] += 1;
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : ClassificationMetrics(counts)) out[name] = value;
  std::cout << out.dump() << "\n";
  return 0;
}

int Resave(int argc, char** argv) {
  if (argc < 4) return 2;
  Model model = LoadModel(argv[2], torch::kCPU);
  SaveHfModel(argv[3], *model);
  return 0;
}

}  // namespace
}  // namespace trainyard

namespace {

int RunCommand(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "tokenize") return trainyard::Tokenize(argc, argv);
    if (command == "logits") return trainyard::Logits(argc, argv);
    if (command == "scaler") return trainyard::Scaler(argc, argv);
    if (command == "graph") return trainyard::Graph(argc, argv);
    if (command == "resave") return trainyard::Resave(argc, argv);
    if (command == "generate") return trainyard::GenerateTokens(argc, argv);
    if (command == "lora-steps") return trainyard::LoraSteps(argc, argv);
    if (command == "merge") return trainyard::Merge(argc, argv);
    if (command == "torchscript") return trainyard::TorchScript(argc, argv);
    if (command == "aoti") return trainyard::Aoti(argc, argv);
    if (command == "gemv") return trainyard::Gemv(argc, argv);
    if (command == "gemm") return trainyard::Gemm(argc, argv);
    if (command == "lr-schedule") return trainyard::Schedule(argc, argv);
    if (command == "eval-metrics") return trainyard::EvalMetrics(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ty_probe " << command << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: ty_probe tokenize|logits|scaler|graph|resave|generate|lora-steps|merge|torchscript|aoti|"
               "gemv|gemm|lr-schedule|eval-metrics ...\n";
  return 2;
}

}  // namespace

// Every command has written its output by the time it returns: the probe exits without
// libtorch's static destructors, as the worker does (common/process_exit.h).
int main(int argc, char** argv) { trainyard::ExitSkippingStaticDestructors(RunCommand(argc, argv)); }
