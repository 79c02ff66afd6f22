#include "worker/serve/model_config.h"

#include <cmath>

namespace trainyard {
namespace {

std::string Flag(bool on) { return on ? "true" : "false"; }

std::string Number(double value) {
  std::string text = std::to_string(value);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

ModelConfigView DescribeModel(const VersionMeta& meta, const ServeSpec& spec) {
  ModelConfigView c;
  c.name = meta.model;
  c.platform = "trainyard_" + meta.family;
  c.backend = "trainyard";
  c.max_batch_size = spec.max_batch_size;
  c.inputs = {{"TEXT", "TYPE_STRING", {1}, /*scalar_per_row=*/true, /*optional=*/true},
              {"input_ids", "TYPE_INT64", {-1}, false, /*optional=*/true},
              {"attention_mask", "TYPE_INT64", {-1}, false, /*optional=*/true}};
  c.outputs = {{"logits", "TYPE_FP32", {int64_t(meta.labels.size())}, false, false},
               {"label", "TYPE_STRING", {1}, /*scalar_per_row=*/true, false}};
  c.preferred_batch_sizes = spec.preferred_batch_sizes;
  c.max_queue_delay_us = uint64_t(std::llround(spec.max_queue_delay_ms * 1000));
  c.parameters = {{"max_batch_tokens", std::to_string(spec.max_batch_tokens)},
                  {"max_queue", std::to_string(spec.max_queue)},
                  {"default_timeout_ms", Number(spec.default_timeout_ms)},
                  {"length_aware", Flag(spec.length_aware)},
                  {"truncate", Flag(spec.truncate)},
                  {"max_tokens_per_row", std::to_string(meta.max_tokens)}};
  return c;
}

}  // namespace trainyard
