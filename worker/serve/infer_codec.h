// The Open Inference Protocol's inference request and response, independent of the
// transport: the HTTP/JSON form (with Triton's binary tensor data extension) and the gRPC
// form both decode into InferCall and encode from InferAnswer here, so the rules about
// inputs, outputs and parameters live in one place.
//
// Inputs: TEXT (BYTES, shape [N] or [N, 1]: N texts, tokenized here with the version's
// own tokenizer), or input_ids + attention_mask (INT64, [N, T]: the tokens whose mask is
// 1, in order). Outputs: logits (FP32 [N, labels]) and label (BYTES [N], the arg max's
// name); all of them unless some are asked for. Parameters: `priority` (1 runs first; 0
// or absent is the default level 10) and `timeout` (microseconds, as Triton's clients
// send it; the request's deadline).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/serve/model_repository.h"

namespace trainyard {

// A request the client got wrong: 400 / INVALID_ARGUMENT with this message.
class InferInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorIn {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::vector<std::string> bytes;  // BYTES elements
  std::vector<int64_t> ints;       // INT64 (or any integer type) elements
};

struct OutputWanted {
  std::string name;
  bool binary = false;
};

struct InferCall {
  std::string model, version, id;
  std::vector<TensorIn> inputs;
  std::vector<OutputWanted> outputs;  // empty: all, as binary_data_output says
  bool binary_output = false;
  int priority = 0;
  double timeout_ms = -1;  // none given
};

struct TensorOut {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::vector<float> fp32;
  std::vector<std::string> bytes;
  bool binary = false;
};

constexpr int kDefaultPriority = 10;

// Element count of a shape; throws InferInputError for a negative or huge dimension.
int64_t ElementCount(const std::vector<int64_t>& shape, const std::string& input);

// The token rows the inputs stand for, checked against the version: every row holds
// 1..meta.max_tokens tokens (a longer TEXT is cut when `truncate`, else refused), ids
// are within the vocabulary, shapes and datatypes are as documented above, and at most
// max_rows rows. Throws InferInputError naming the input at fault.
std::vector<std::vector<int32_t>> TokenRows(const std::vector<TensorIn>& inputs, const VersionMeta& meta, bool truncate,
                                            int max_rows);

// The outputs asked for, from `logits` ([rows x labels]). Throws InferInputError for an
// output the model does not have.
std::vector<TensorOut> MakeOutputs(const InferCall& call, const VersionMeta& meta, const std::vector<float>& logits);

// The raw tensor layout both transports use (Triton's binary data over HTTP, gRPC's
// raw_input_contents / raw_output_contents): row major, little-endian; BYTES elements
// each a 4-byte length and the bytes. RawElements fills t->bytes or t->ints from `raw`
// for t's datatype and shape, and throws InferInputError naming t->name when the bytes
// do not fit them. REQUIRES: t->datatype is BYTES, INT64 or INT32.
void RawElements(const std::string& raw, TensorIn* t);
std::string RawBytes(const TensorOut& out);

// Effective priority: lower runs first.
int PriorityLevel(int requested);

}  // namespace trainyard
