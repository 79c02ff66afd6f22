// The tokenizer interface the input pipeline uses.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace trainyard {

struct DataSpec;
struct TextDataset;

// Every method is const and thread-safe: the pipeline's loader threads call them concurrently.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of the model family's single-sentence template around the text's pieces, the
  // pieces cut so that the whole is at most max_len: "[CLS] text [SEP]" (WordPiece),
  // "<s> text </s>" (SentencePiece, RoBERTa), the pieces alone (GPT-2).
  virtual std::vector<int32_t> Encode(std::string_view text, int max_len) const = 0;
  // Ids of the text's pieces alone: no template, no truncation (special tokens written
  // in the text still map to their ids). The default suits templates that add one
  // token on each side, as WordPiece's and SentencePiece's do.
  virtual std::vector<int32_t> Pieces(std::string_view text) const {
    std::vector<int32_t> ids = Encode(text, kNoLimit);
    return ids.size() < 2 ? std::vector<int32_t>{} : std::vector<int32_t>(ids.begin() + 1, ids.end() - 1);
  }
  virtual int32_t pad_id() const = 0;
  // The ids that begin and end a sequence ([CLS]/[SEP], <s>/</s>; GPT-2's <|endoftext|>
  // for both), or -1 when the vocabulary has none. The defaults read them off the
  // template of an empty text, which for WordPiece and SentencePiece is just the two.
  virtual int32_t bos_id() const {
    std::vector<int32_t> ids = Encode("", kNoLimit);
    return ids.size() == 2 ? ids.front() : -1;
  }
  virtual int32_t eos_id() const {
    std::vector<int32_t> ids = Encode("", kNoLimit);
    return ids.size() == 2 ? ids.back() : -1;
  }
  virtual int vocab_size() const = 0;

 private:
  static constexpr int kNoLimit = 1 << 30;
};

// "[CLS] pieces [SEP]", the pieces cut so that the whole is at most max_len.
std::vector<int32_t> WrapWithClsSep(std::vector<int32_t> pieces, int32_t cls, int32_t sep, int max_len);

// Builds the tokenizer a job asks for; a SentencePiece model that does not exist yet
// is trained from `train` first. Throws std::runtime_error with the file at fault.
std::unique_ptr<Tokenizer> MakeTokenizer(const DataSpec& spec, const TextDataset& train);

}  // namespace trainyard
