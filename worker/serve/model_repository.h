// The model repository `kind: serve` reads: Triton's layout, <root>/<model>/<version>/,
// where the version is a positive integer and each version folder is a Hugging Face
// folder as a finetune job writes it (config.json, model.safetensors, and the
// tokenizer's files: vocab.txt, or vocab.json + merges.txt). Torch-free: the front end
// reads here what it needs to tokenize and to answer metadata; the model process loads
// the weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace trainyard {

// A version folder found by a scan.
struct RepositoryEntry {
  std::string model;
  int64_t version = 0;
  std::string path;
  bool operator==(const RepositoryEntry& o) const { return model == o.model && version == o.version; }
};

// What the front end knows of a model version. Immutable once read; shared by the
// transports' threads.
struct VersionMeta {
  std::string model;
  int64_t version = 0;
  std::string path;
  std::string family;               // config.json's model_type
  std::vector<std::string> labels;  // id2label, in id order: the `label` output
  int max_tokens = 0;               // the longest input the position table takes
  int64_t vocab_size = 0;           // config.json's: rows of the embedding table
  int32_t pad_id = 0;
  std::shared_ptr<const Tokenizer> tokenizer;  // at most vocab_size tokens (ReadVersion checks)
};

// Every <model>/<version>/ under `root`, sorted by model then version. Entries whose
// names do not follow the layout are skipped (a model name is [A-Za-z0-9._-]+, a version
// a positive integer); a missing root yields none.
std::vector<RepositoryEntry> ScanRepository(const std::string& root);

// Reads and checks a version folder without loading the weights: config.json must name
// a family we serve as a sequence classifier, with labels and positions; the tokenizer
// files must load; model.safetensors must be a valid file. Throws std::runtime_error
// whose message is the reason the repository index reports.
VersionMeta ReadVersion(const RepositoryEntry& entry);

// The model name rule of the layout (also what the HTTP paths accept).
bool IsModelName(const std::string& name);

}  // namespace trainyard
