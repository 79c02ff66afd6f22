// The HTTP/JSON form of the Open Inference Protocol's infer request and response,
// with Triton's binary tensor data extension (kserve_http.h describes the framing).
// Transport-free and torch-free, so the fuzz target (tests/fuzz/fuzz_kserve_json.cc)
// feeds it any bytes.
#pragma once

#include <string>
#include <vector>

#include "worker/serve/infer_codec.h"

namespace trainyard {

// Decodes an infer request: `http_body` as received, `header_length` the value of its
// Inference-Header-Content-Length header ("" when absent). Any input ends in an
// InferCall or an InferInputError naming what is wrong.
InferCall DecodeJsonInfer(const std::string& http_body, const std::string& header_length);

struct JsonAnswer {
  std::string body;        // the JSON, then the binary outputs
  size_t json_length = 0;  // for Inference-Header-Content-Length
  bool binary = false;     // some output went as binary data
};
JsonAnswer EncodeJsonAnswer(const InferCall& call, const VersionMeta& meta, const std::vector<TensorOut>& outputs);

}  // namespace trainyard
