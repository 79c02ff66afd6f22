// A SentencePiece model used as the job's tokenizer. Models trained here reserve
// ids 0..3 for <pad>, <unk>, <s>, </s>; <s> and </s> play [CLS] and [SEP].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trainyard {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws std::runtime_error if the model does not load.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  // Trains a unigram model on `texts` and writes it to `model_path` (+ ".vocab").
  static void Train(const std::vector<std::string>& texts, const std::string& model_path, int vocab_size);

  std::vector<int32_t> Encode(std::string_view text, int max_len) const override;
  int32_t pad_id() const override { return pad_id_; }
  int vocab_size() const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int32_t pad_id_ = 0, cls_id_ = 0, sep_id_ = 0;
};

}  // namespace trainyard
