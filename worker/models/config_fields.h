// Reading Hugging Face config.json fields with located, bounded checks, shared by every
// model family. Each failure throws std::runtime_error "field '<key>': <problem>"; the
// caller adds the file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainyard {

// Bounds of config.json's sizes: every released checkpoint of our families fits with
// room to spare, and a model within them cannot overflow an int64 shape.
constexpr int64_t kMaxVocab = 1'000'000, kMaxHidden = 16'384, kMaxLayers = 256, kMaxIntermediate = 65'536;
constexpr int64_t kMaxPositions = 65'536, kMaxTypeVocab = 1'024, kMaxLabels = 100'000;
// A model over this many parameters would take the machine's memory before it trains.
constexpr double kMaxParameters = 1e10;

[[noreturn]] void ConfigFail(const std::string& key, const std::string& problem);

// An integer field (a JSON integer, not 2.5 nor "2") in [lo, hi]; absent keeps *out.
void IntField(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi, int64_t* out);
// A finite number in [lo, hi) (or [lo, hi] with `closed`); absent keeps *out.
void NumberField(const nlohmann::json& j, const std::string& key, double lo, double hi, bool closed, double* out);
// A boolean field; absent keeps *out.
void BoolField(const nlohmann::json& j, const std::string& key, bool* out);
// A string field that must be one of `allowed` when present.
void ChoiceField(const nlohmann::json& j, const std::string& key, const std::vector<std::string>& allowed,
                 std::string* out);
// Throws unless every key in `required` is present.
void RequireFields(const nlohmann::json& j, const std::vector<std::string>& required);

// The label names from id2label (keys "0".."n-1", each once, string values), else
// LABEL_0.. for num_labels (default 2).
std::vector<std::string> LabelsField(const nlohmann::json& j);
// id2label and label2id for a config.json we write.
void PutLabels(const std::vector<std::string>& labels, nlohmann::json* j);
// Throws unless `parameters` is under kMaxParameters (reported against `key`).
void CheckParameterCount(double parameters, const std::string& key);

}  // namespace trainyard
