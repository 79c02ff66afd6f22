// ty_tokenize: encodes text with a byte-level BPE tokenizer, or with the tokenizer a
// tokenizer.json describes (as a job's model.init folder gives it: common/tokenizer_json.h
// and MakeTokenizer), from the command line, so tests/reference/bpe_parity.py and
// tokenizer_json_parity.py can compare its ids with Hugging Face's. Torch-free.
//   ty_tokenize VOCAB.json MERGES.txt [--template auto|roberta|gpt2] [--add-prefix-space]
//               [--max-len N | --pieces]
//   ty_tokenize --tokenizer-json FILE [--max-len N | --pieces]
// stdin: one TSV-escaped text a line (\t \n \\, as ty_probe tokenize reads them);
// stdout: the ids of each line, space-separated. Encode(text, N) by default (N = 2^20),
// Pieces(text) with --pieces. stderr: "encoded L lines (B bytes) in S s" for the loop.
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "common/tokenizer_json.h"
#include "data/byte_level_bpe_tokenizer.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"

namespace trainyard {
namespace {

struct Args {
  std::string vocab, merges, tokenizer_json;
  ByteLevelBpeTokenizer::Options options;
  int max_len = 1 << 20;
  bool pieces = false;
};

// Returns false on a usage error.
bool ParseArgs(int argc, char** argv, Args* args) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--add-prefix-space") {
      args->options.add_prefix_space = true;
    } else if (arg == "--pieces") {
      args->pieces = true;
    } else if (arg == "--tokenizer-json" && has_value) {
      args->tokenizer_json = argv[++i];
    } else if (arg == "--max-len" && has_value) {
      args->max_len = std::stoi(argv[++i]);
    } else if (arg == "--template" && has_value) {
      const std::string name = argv[++i];
      using T = ByteLevelBpeTokenizer::Template;
      if (name != "auto" && name != "roberta" && name != "gpt2") return false;
      args->options.sequence_template = name == "roberta" ? T::kRoberta : name == "gpt2" ? T::kGpt2 : T::kAuto;
    } else if (arg.rfind("--", 0) == 0) {
      return false;
    } else {
      positional.push_back(arg);
    }
  }
  if (!args->tokenizer_json.empty()) return positional.empty();
  if (positional.size() != 2) return false;
  args->vocab = positional[0];
  args->merges = positional[1];
  return true;
}

// The tokenizer a job whose model.init folder holds only `path` would use.
std::unique_ptr<Tokenizer> FromTokenizerJson(const std::string& path) {
  const HfTokenizerFiles files = ReadTokenizerJson(path);
  DataSpec data;
  TokenizerSpec& t = data.tokenizer;
  t.tokenizer_json = path;
  t.kind =
      files.model == HfTokenizerFiles::Model::kWordPiece ? TokenizerKind::kWordPiece : TokenizerKind::kByteLevelBpe;
  t.lowercase = files.lowercase;
  t.add_prefix_space = files.add_prefix_space;
  return MakeTokenizer(data, TextDataset{});
}

int Run(const Args& args) {
  const std::unique_ptr<Tokenizer> made =
      args.tokenizer_json.empty() ? std::make_unique<ByteLevelBpeTokenizer>(args.vocab, args.merges, args.options)
                                  : FromTokenizerJson(args.tokenizer_json);
  const Tokenizer& tokenizer = *made;
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string line; std::getline(std::cin, line);) {
    lines.push_back(UnescapeTsvField(line));
    bytes += lines.back().size();
  }
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(lines.size());
  const auto start = std::chrono::steady_clock::now();
  for (const auto& text : lines)
    ids.push_back(args.pieces ? tokenizer.Pieces(text) : tokenizer.Encode(text, args.max_len));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::string out;
  for (const auto& row : ids) {
    for (size_t i = 0; i < row.size(); ++i) out += (i ? " " : "") + std::to_string(row[i]);
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fprintf(stderr, "encoded %zu lines (%zu bytes) in %.4f s\n", lines.size(), bytes, took.count());
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  trainyard::Args args;
  try {
    if (!trainyard::ParseArgs(argc, argv, &args)) {
      std::cerr << "usage: ty_tokenize VOCAB.json MERGES.txt [--template auto|roberta|gpt2] [--add-prefix-space]"
                   " [--max-len N | --pieces]\n       ty_tokenize --tokenizer-json FILE [--max-len N | --pieces]\n";
      return 2;
    }
    return trainyard::Run(args);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
