// A scratch folder for a fuzz target, with the small files that job specs name
// (relative to it), removed when the process exits.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace trainyard::fuzz {

// Creates the folder once (under /dev/shm when it exists: the targets write there on
// every input) and returns its absolute path. Its files, as the seeds name them:
//   data/train.tsv data/dev.tsv data/train.jsonl data/labels.txt data/vocab.txt
//   data/spm.model model/model.safetensors model/config.json model.pt
inline const std::string& ScratchFolder() {
  // Never destroyed: the exit handler below reads it after static destructors may have run.
  static const std::string* const folder = [] {
    namespace fs = std::filesystem;
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (base / "trainyard-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) std::abort();
    const fs::path dir(pattern);
    fs::create_directories(dir / "data");
    fs::create_directories(dir / "model");
    std::ofstream(dir / "data/train.tsv") << "a\thello\nb\tworld\n";
    std::ofstream(dir / "data/dev.tsv") << "a\thello\n";
    std::ofstream(dir / "data/train.jsonl") << "{\"text\": \"hello\", \"label\": \"a\"}\n";
    std::ofstream(dir / "data/labels.txt") << "a\nb\n";
    std::ofstream(dir / "data/vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\n";
    std::ofstream(dir / "data/spm.model") << "not a real model";
    std::ofstream(dir / "model/model.safetensors") << "x";
    std::ofstream(dir / "model/config.json") << "{}";
    std::ofstream(dir / "model.pt") << "x";
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchFolder(), ignored);
    });
    return new std::string(dir.string());
  }();
  return *folder;
}

}  // namespace trainyard::fuzz
