#include "worker/models/config_fields.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace trainyard {

void ConfigFail(const std::string& key, const std::string& problem) {
  throw std::runtime_error("field '" + key + "': " + problem);
}

void IntField(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  if (!v.is_number_integer() || too_big) ConfigFail(key, "expected an integer, got " + v.dump().substr(0, 40));
  const auto value = v.get<int64_t>();
  if (value < lo || value > hi)
    ConfigFail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(value));
  *out = value;
}

void NumberField(const nlohmann::json& j, const std::string& key, double lo, double hi, bool closed, double* out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    ConfigFail(key, "expected a finite number, got " + v.dump().substr(0, 40));
  const double value = v.get<double>();
  if (value < lo || value > hi || (!closed && value == hi))
    ConfigFail(key, "expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + (closed ? "]" : ")") +
                        ", got " + v.dump());
  *out = value;
}

void BoolField(const nlohmann::json& j, const std::string& key, bool* out) {
  if (!j.contains(key)) return;
  if (!j.at(key).is_boolean()) ConfigFail(key, "expected true or false, got " + j.at(key).dump().substr(0, 40));
  *out = j.at(key).get<bool>();
}

void ChoiceField(const nlohmann::json& j, const std::string& key, const std::vector<std::string>& allowed,
                 std::string* out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  std::string list;
  for (const auto& a : allowed) {
    if (v.is_string() && v.get<std::string>() == a) {
      *out = a;
      return;
    }
    list += (list.empty() ? "'" : ", '") + a + "'";
  }
  ConfigFail(key, "expected " + list + ", got " + v.dump().substr(0, 40));
}

void RequireFields(const nlohmann::json& j, const std::vector<std::string>& required) {
  for (const auto& key : required)
    if (!j.contains(key)) ConfigFail(key, "missing");
}

std::vector<std::string> LabelsField(const nlohmann::json& j) {
  if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty()) {
    const nlohmann::json& map = j["id2label"];
    if (map.size() > size_t(kMaxLabels)) ConfigFail("id2label", "more than " + std::to_string(kMaxLabels) + " labels");
    std::vector<std::string> labels(map.size());
    std::vector<bool> seen(map.size(), false);
    for (const auto& [id, name] : map.items()) {
      size_t index = 0;
      auto [end, error] = std::from_chars(id.data(), id.data() + id.size(), index);
      if (id.empty() || error != std::errc() || end != id.data() + id.size() || index >= labels.size() || seen[index])
        ConfigFail("id2label", "ids must be 0.." + std::to_string(labels.size() - 1) + ", each once; got '" +
                                   id.substr(0, 40) + "'");
      if (!name.is_string()) ConfigFail("id2label", "label " + id + " is not a string");
      labels[index] = name.get<std::string>();
      seen[index] = true;
    }
    return labels;
  }
  int64_t n = 2;
  IntField(j, "num_labels", 1, kMaxLabels, &n);
  std::vector<std::string> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back("LABEL_" + std::to_string(i));
  return labels;
}

void PutLabels(const std::vector<std::string>& labels, nlohmann::json* j) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < labels.size(); ++i) {
    id2label[std::to_string(i)] = labels[i];
    label2id[labels[i]] = i;
  }
  (*j)["id2label"] = id2label;
  (*j)["label2id"] = label2id;
}

void CheckParameterCount(double parameters, const std::string& key) {
  if (parameters > kMaxParameters)
    ConfigFail(key, "the sizes make " + std::to_string(int64_t(parameters / 1e6)) +
                        " million parameters, more than the cap of " + std::to_string(int64_t(kMaxParameters / 1e6)) +
                        " million");
}

}  // namespace trainyard
