#include "worker/serve/kserve_json.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "common/bounded_json.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

// Flattens nested JSON arrays in row-major order, with an explicit stack: the body is
// a client's, so its depth (already bounded by the parse) must not become ours.
void Flatten(const json& data, std::vector<const json*>* out) {
  std::vector<std::pair<const json*, size_t>> open;  // an array, and its next item
  if (!data.is_array()) {
    out->push_back(&data);
    return;
  }
  open.emplace_back(&data, 0);
  while (!open.empty()) {
    auto& [array, next] = open.back();
    if (next == array->size()) {
      open.pop_back();
      continue;
    }
    const json& item = (*array)[next++];
    if (item.is_array())
      open.emplace_back(&item, 0);
    else
      out->push_back(&item);
  }
}

TensorIn DecodeInput(const json& input, const std::string& binary_chunk, bool has_binary) {
  if (!input.is_object()) throw InferInputError("inputs: expected objects");
  TensorIn t;
  if (!input.contains("name") || !input["name"].is_string()) throw InferInputError("inputs: each needs a 'name'");
  t.name = input["name"];
  if (!input.contains("datatype") || !input["datatype"].is_string())
    throw InferInputError("input '" + t.name + "': 'datatype' missing");
  t.datatype = input["datatype"];
  if (!input.contains("shape") || !input["shape"].is_array())
    throw InferInputError("input '" + t.name + "': 'shape' missing");
  for (const json& d : input["shape"]) {
    if (!d.is_number_integer()) throw InferInputError("input '" + t.name + "': 'shape' must hold integers");
    t.shape.push_back(d.get<int64_t>());
  }
  const int64_t count = ElementCount(t.shape, t.name);
  const bool bytes = t.datatype == "BYTES";
  const bool ints = t.datatype == "INT64" || t.datatype == "INT32";
  if (!bytes && !ints)
    throw InferInputError("input '" + t.name + "': datatype " + t.datatype + " not accepted (BYTES, INT64)");
  if (has_binary) {
    RawElements(binary_chunk, &t);
    return t;
  }
  if (!input.contains("data")) throw InferInputError("input '" + t.name + "': 'data' missing");
  std::vector<const json*> flat;
  Flatten(input["data"], &flat);
  if (int64_t(flat.size()) != count)
    throw InferInputError("input '" + t.name + "': " + std::to_string(flat.size()) + " elements for a shape of " +
                          std::to_string(count));
  for (const json* v : flat) {
    if (bytes && !v->is_string()) throw InferInputError("input '" + t.name + "': BYTES data must be strings");
    if (ints && !v->is_number_integer()) throw InferInputError("input '" + t.name + "': INT64 data must be integers");
    if (bytes)
      t.bytes.push_back(v->get<std::string>());
    else
      t.ints.push_back(v->get<int64_t>());
  }
  return t;
}

// The input's name for an error message, when it has one that is a string.
std::string NameOrPlaceholder(const json& input) {
  return input.contains("name") && input["name"].is_string() ? input["name"].get<std::string>() : "?";
}

bool BoolParameter(const json& object, const char* key) {
  return object.is_object() && object.contains("parameters") && object["parameters"].is_object() &&
         object["parameters"].contains(key) && object["parameters"][key].is_boolean() &&
         object["parameters"][key].get<bool>();
}

// Splits body into the JSON header and the binary rest, as the header says.
std::pair<std::string, std::string> SplitBody(const std::string& body, const std::string& header) {
  if (header.empty()) return {body, ""};
  size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(header, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != header.size() || n > body.size())
    throw InferInputError("header Inference-Header-Content-Length: " + header + " is not a length within the " +
                          std::to_string(body.size()) + "-byte body");
  return {body.substr(0, n), body.substr(n)};
}

}  // namespace

InferCall DecodeJsonInfer(const std::string& http_body, const std::string& header_length) {
  auto [head, binary] = SplitBody(http_body, header_length);
  json body;
  try {
    body = ParseBoundedJson(head);
  } catch (const JsonTooDeep& e) {
    throw InferInputError(std::string("request body: ") + e.what());
  } catch (const json::exception& e) {
    throw InferInputError(std::string("request body: malformed JSON: ") + e.what());
  }
  if (!body.is_object()) throw InferInputError("request body: expected a JSON object");
  if (!body.contains("inputs") || !body["inputs"].is_array()) throw InferInputError("request body: 'inputs' missing");
  InferCall call;
  if (body.contains("id") && body["id"].is_string()) call.id = body["id"];
  size_t at = 0;
  for (const json& input : body["inputs"]) {
    const bool has_binary = input.is_object() && input.contains("parameters") && input["parameters"].is_object() &&
                            input["parameters"].contains("binary_data_size");
    std::string chunk;
    if (has_binary) {
      const json& size = input["parameters"]["binary_data_size"];
      if (!size.is_number_unsigned() || size.get<uint64_t>() > binary.size() - at)
        throw InferInputError("input '" + NameOrPlaceholder(input) +
                              "': parameters.binary_data_size runs past the binary data sent");
      chunk = binary.substr(at, size.get<size_t>());
      at += chunk.size();
    }
    call.inputs.push_back(DecodeInput(input, chunk, has_binary));
  }
  if (at != binary.size())
    throw InferInputError("binary data: " + std::to_string(binary.size() - at) +
                          " bytes after the inputs' binary_data_size sum");
  if (body.contains("parameters") && body["parameters"].is_object()) {
    const json& p = body["parameters"];
    call.binary_output = BoolParameter(body, "binary_data_output");
    if (p.contains("priority") && p["priority"].is_number_integer()) call.priority = p["priority"].get<int>();
    if (p.contains("timeout") && p["timeout"].is_number()) call.timeout_ms = p["timeout"].get<double>() / 1000.0;
  }
  if (body.contains("outputs") && body["outputs"].is_array())
    for (const json& o : body["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
        throw InferInputError("outputs: each needs a 'name'");
      call.outputs.push_back({o["name"].get<std::string>(), BoolParameter(o, "binary_data") || call.binary_output});
    }
  return call;
}

JsonAnswer EncodeJsonAnswer(const InferCall& call, const VersionMeta& meta, const std::vector<TensorOut>& outputs) {
  json body = {{"model_name", meta.model}, {"model_version", std::to_string(meta.version)}, {"outputs", json::array()}};
  if (!call.id.empty()) body["id"] = call.id;
  std::string binary;
  for (const TensorOut& out : outputs) {
    json o = {{"name", out.name}, {"datatype", out.datatype}, {"shape", out.shape}};
    if (out.binary) {
      const size_t before = binary.size();
      binary += RawBytes(out);
      o["parameters"] = {{"binary_data_size", binary.size() - before}};
    } else if (out.datatype == "FP32") {
      o["data"] = out.fp32;
    } else {
      o["data"] = out.bytes;
    }
    body["outputs"].push_back(std::move(o));
  }
  JsonAnswer answer;
  answer.body = DumpJsonForPeer(body);
  answer.json_length = answer.body.size();
  answer.binary = !binary.empty();
  answer.body += binary;
  return answer;
}

}  // namespace trainyard
