// libFuzzer target: bytes -> a KServe V2 infer request as the HTTP transport receives it
// (DecodeJsonInfer: the JSON, Triton's binary tensor data after it, the element counts and
// sizes it claims). The first line of the input is the Inference-Header-Content-Length
// header's value (empty: no header), the rest the body. Every input must end in an
// InferCall or an InferInputError; a decoded call must also survive the output rules and
// re-encoding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/serve/kserve_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string header = newline == std::string::npos ? "" : input.substr(0, newline);
  const std::string body = newline == std::string::npos ? input : input.substr(newline + 1);
  try {
    trainyard::InferCall call = trainyard::DecodeJsonInfer(body, header);
    trainyard::VersionMeta meta;
    meta.model = "m";
    meta.version = 1;
    meta.labels = {"a", "b"};
    std::vector<float> logits;
    for (const auto& input_tensor : call.inputs) logits.resize(2 * input_tensor.ints.size() % 64, 0.5f);
    trainyard::EncodeJsonAnswer(call, meta, trainyard::MakeOutputs(call, meta, logits));
  } catch (const trainyard::InferInputError&) {
  }
  return 0;
}
