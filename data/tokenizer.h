// The tokenizer interface the input pipeline uses.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace trainyard {

struct DataSpec;
struct TextDataset;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of "[CLS] text [SEP]", the text's pieces cut so the whole is at most max_len.
  // Thread-safe: the pipeline's loader threads call it concurrently.
  virtual std::vector<int32_t> Encode(std::string_view text, int max_len) const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int vocab_size() const = 0;
};

// "[CLS] pieces [SEP]", the pieces cut so that the whole is at most max_len.
std::vector<int32_t> WrapWithClsSep(std::vector<int32_t> pieces, int32_t cls, int32_t sep, int max_len);

// Builds the tokenizer a job asks for; a SentencePiece model that does not exist yet
// is trained from `train` first. Throws std::runtime_error with the file at fault.
std::unique_ptr<Tokenizer> MakeTokenizer(const DataSpec& spec, const TextDataset& train);

}  // namespace trainyard
