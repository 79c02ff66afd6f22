#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/spec/job_spec.h"
#include "common/tokenizer_json.h"
#include "data/byte_level_bpe_tokenizer.h"
#include "data/text_dataset.h"
#include "data/wordpiece_tokenizer.h"

namespace trainyard {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  auto status = processor_->Load(model_path);
  if (!status.ok())
    throw std::runtime_error(model_path + ": cannot load the SentencePiece model: " + status.ToString());
  pad_id_ = std::max(0, processor_->pad_id());
  cls_id_ = processor_->bos_id() >= 0 ? processor_->bos_id() : processor_->unk_id();
  sep_id_ = processor_->eos_id() >= 0 ? processor_->eos_id() : processor_->unk_id();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

int SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }

void SentencePieceTokenizer::Train(const std::vector<std::string>& texts, const std::string& model_path,
                                   int vocab_size) {
  namespace fs = std::filesystem;
  fs::path model(model_path);
  if (model.has_parent_path()) fs::create_directories(model.parent_path());
  // Every rank of a job may train at once: each trains under a name of its own and
  // renames the result into place, so no rank ever loads a half-written model; a fixed
  // seed and one training thread give every rank the same pieces and scores. The name
  // holds the pid and a per-process count, so trainings on threads of one process (as
  // the tests run "ranks") do not share it either.
  static std::atomic<uint64_t> trainings{0};
  const std::string own =
      model_path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(trainings.fetch_add(1));
  const std::string corpus = own + ".corpus.txt";
  {
    std::ofstream out(corpus);
    for (std::string text : texts) {
      std::replace(text.begin(), text.end(), '\n', ' ');
      out << text << '\n';
    }
  }
  sentencepiece::SetRandomGeneratorSeed(1);
  auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + own + " --vocab_size=" + std::to_string(vocab_size) +
      " --model_type=unigram --character_coverage=0.9995 --pad_id=0 --unk_id=1 --bos_id=2"
      " --eos_id=3 --input_sentence_size=200000 --shuffle_input_sentence=true"
      " --minloglevel=2 --num_threads=1");
  fs::remove(corpus);
  if (!status.ok()) throw std::runtime_error("SentencePiece training failed: " + status.ToString());
  const std::string stem = model_path.substr(0, model_path.size() - model.extension().string().size());
  fs::rename(own + ".vocab", stem + ".vocab");
  fs::rename(own + ".model", model_path);
}

std::vector<int32_t> SentencePieceTokenizer::Encode(std::string_view text, int max_len) const {
  std::vector<int> pieces;
  processor_->Encode(std::string(text), &pieces);
  return WrapWithClsSep(std::vector<int32_t>(pieces.begin(), pieces.end()), cls_id_, sep_id_, max_len);
}

namespace {

ByteLevelBpeTokenizer::Options BpeOptions(const TokenizerSpec& t) {
  ByteLevelBpeTokenizer::Options options;
  options.add_prefix_space = t.add_prefix_space;
  options.sequence_template = t.bpe_template == BpeTemplate::kRoberta ? ByteLevelBpeTokenizer::Template::kRoberta
                              : t.bpe_template == BpeTemplate::kGpt2  ? ByteLevelBpeTokenizer::Template::kGpt2
                                                                      : ByteLevelBpeTokenizer::Template::kAuto;
  return options;
}

// A tokenizer.json's tokenizer: its converted files read from memory (the spec holds the
// settings read from it).
std::unique_ptr<Tokenizer> FromTokenizerJson(const TokenizerSpec& t) {
  const HfTokenizerFiles files = ReadTokenizerJson(t.tokenizer_json);
  if (files.model == HfTokenizerFiles::Model::kWordPiece)
    return std::make_unique<WordPieceTokenizer>(t.tokenizer_json, std::istringstream(files.vocab), t.lowercase);
  return std::make_unique<ByteLevelBpeTokenizer>(t.tokenizer_json, std::istringstream(files.vocab),
                                                 t.tokenizer_json + " (its merges)", std::istringstream(files.merges),
                                                 BpeOptions(t));
}

}  // namespace

std::unique_ptr<Tokenizer> MakeTokenizer(const DataSpec& spec, const TextDataset& train) {
  const TokenizerSpec& t = spec.tokenizer;
  if (!t.tokenizer_json.empty()) return FromTokenizerJson(t);
  if (t.kind == TokenizerKind::kWordPiece) return std::make_unique<WordPieceTokenizer>(t.vocab, t.lowercase);
  if (t.kind == TokenizerKind::kByteLevelBpe)
    return std::make_unique<ByteLevelBpeTokenizer>(t.vocab, t.merges, BpeOptions(t));
  if (!std::filesystem::exists(t.model)) {
    std::vector<std::string> texts;
    texts.reserve(train.examples.size());
    for (const auto& e : train.examples) texts.push_back(e.text);
    SentencePieceTokenizer::Train(texts, t.model, t.vocab_size);
  }
  return std::make_unique<SentencePieceTokenizer>(t.model);
}

}  // namespace trainyard
