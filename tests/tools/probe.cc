// ty_probe: drives single components of the worker from the command line, so the
// Python reference tests (tests/reference/) can compare them with Hugging Face and
// PyTorch on identical inputs.
//   ty_probe tokenize VOCAB [--cased]        stdin: one TSV-escaped text a line; stdout: ids
//   ty_probe logits MODEL_DIR INPUTS.json [--device D] [--precision P]
//                                            stdout: JSON logits of our BERT (fp32 values)
//   ty_probe scaler PATTERN INIT INTERVAL [--device D]
//                                            stdout: JSON scale/skip sequence
//   ty_probe graph MODEL_DIR INPUTS.json     stdout: JSON logits, eager and CUDA-graph replay
//                                            (as a benchmark job's cuda_graph cells run it)
//   ty_probe resave SRC_DIR DST_DIR          load an HF folder into our model, save it again
//   ty_probe torchscript MODEL.pt INPUTS.json stdout: JSON logits of a TorchScript module
#include <torch/script.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/text_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "worker/train/amp.h"
#ifdef TRAINYARD_WITH_CUDA
#include "worker/jobs/cuda_graph.h"
#endif
#include "worker/models/hf_checkpoint.h"
#include "worker/train/optimizer.h"

namespace trainyard {
namespace {

int Tokenize(int argc, char** argv) {
  if (argc < 3) return 2;
  const bool cased = argc > 3 && std::string(argv[3]) == "--cased";
  WordPieceTokenizer tokenizer(argv[2], !cased);
  std::string line;
  while (std::getline(std::cin, line)) {
    auto ids = tokenizer.Encode(UnescapeTsvField(line), 1 << 20);
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

// {"logits": [[...], ...]} on stdout, a row per input.
void PrintLogits(const torch::Tensor& logits) { std::cout << nlohmann::json{{"logits", Rows(logits)}}.dump() << "\n"; }

BertForSequenceClassification LoadModel(const std::string& dir, const torch::Device& device) {
  BertForSequenceClassification model(ReadHfConfig(dir));
  LoadHfWeights(dir, model);
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
  BertForSequenceClassification model = LoadModel(argv[2], device);
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
  BertForSequenceClassification model = LoadModel(argv[2], device);
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
// GradScaler + AdamW on one parameter, printing what torch.amp.GradScaler reports.
int Scaler(int argc, char** argv) {
  if (argc < 5) return 2;
  const std::string pattern = argv[2];
  LossScaleSpec spec;
  spec.init_scale = std::stod(argv[3]);
  spec.growth_interval = std::stoi(argv[4]);
  const torch::Device device(Option(argc, argv, 5, "--device", "cpu"));
  GradScaler scaler(spec, true);
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
    bool found_inf = scaler.UnscaleAndCheck({w});
    if (!found_inf) optimizer.Step(1e-3);
    scaler.Update(found_inf);
    optimizer.ZeroGrad();
    scales.push_back(scaler.scale());
    skipped.push_back(found_inf);
  }
  torch::Tensor final_w = w.detach().cpu();
  std::vector<float> weights(final_w.data_ptr<float>(), final_w.data_ptr<float>() + 4);
  std::cout << nlohmann::json{{"scales", scales}, {"skipped", skipped}, {"weights", weights}}.dump() << "\n";
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

int Resave(int argc, char** argv) {
  if (argc < 4) return 2;
  BertForSequenceClassification model = LoadModel(argv[2], torch::kCPU);
  SaveHfModel(argv[3], model);
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "tokenize") return trainyard::Tokenize(argc, argv);
    if (command == "logits") return trainyard::Logits(argc, argv);
    if (command == "scaler") return trainyard::Scaler(argc, argv);
    if (command == "graph") return trainyard::Graph(argc, argv);
    if (command == "resave") return trainyard::Resave(argc, argv);
    if (command == "torchscript") return trainyard::TorchScript(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ty_probe " << command << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: ty_probe tokenize|logits|scaler|graph|resave|torchscript ...\n";
  return 2;
}
