// BERT's WordPiece tokenizer over a vocab.txt, matching Hugging Face BertTokenizer:
// the basic tokenizer (control-character removal, CJK splitting, NFC, lower-casing
// with accent stripping, punctuation splitting) then greedy longest-match-first
// WordPiece with "##" continuations and [UNK] for words over 100 characters.
#pragma once

#include <istream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace trainyard {

class WordPieceTokenizer : public Tokenizer {
 public:
  // Throws std::runtime_error if vocab.txt is unreadable or lacks [PAD]/[UNK]/[CLS]/[SEP].
  WordPieceTokenizer(const std::string& vocab_path, bool lowercase);
  // vocab.txt's lines from a stream (a converted tokenizer.json); `source` names it in
  // errors.
  WordPieceTokenizer(const std::string& source, std::istream&& vocab, bool lowercase);

  std::vector<int32_t> Encode(std::string_view text, int max_len) const override;
  int32_t pad_id() const override { return pad_id_; }
  int vocab_size() const override { return static_cast<int>(vocab_.size()); }

  // The basic tokenizer's words, before WordPiece (exposed for tests).
  std::vector<std::string> BasicTokenize(std::string_view text) const;
  // WordPiece ids of the text without [CLS]/[SEP].
  std::vector<int32_t> TokenIds(std::string_view text) const;

 private:
  void AppendWordPieces(const std::string& word, std::vector<int32_t>* ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  bool lowercase_;
  int32_t pad_id_ = 0, unk_id_ = 0, cls_id_ = 0, sep_id_ = 0;
};

}  // namespace trainyard
