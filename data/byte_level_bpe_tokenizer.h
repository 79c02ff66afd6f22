// Byte-level BPE, the tokenizer of GPT-2 and RoBERTa, over a vocab.json and a
// merges.txt. Gives the ids of Hugging Face's GPT2TokenizerFast / RobertaTokenizerFast
// built from the same two files (tests/reference/bpe_parity.py checks it).
#pragma once

#include <array>
#include <cstdint>
#include <istream>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace trainyard {

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  // The single-sentence template Encode applies, and with it the special tokens that
  // are matched literally in the text (each only if vocab.json has it):
  //   kRoberta  "<s> pieces </s>"; <s> </s> <unk> <pad> <mask> (<mask> also takes the
  //             whitespace before it, as RoBERTa's lstrip=True does)
  //   kGpt2     the pieces alone; <|endoftext|>
  //   kAuto     kRoberta when vocab.json has <s> and </s>, else kGpt2
  enum class Template { kAuto, kRoberta, kGpt2 };

  struct Options {
    bool add_prefix_space = false;  // a space before each stretch between special tokens not starting with one
    Template sequence_template = Template::kAuto;
  };

  // Reads vocab.json ({"token": id}) and merges.txt ("#version" lines skipped, then one
  // "left right" pair a line, highest priority first). Throws std::runtime_error that
  // starts with the file at fault ("merges.txt:12: ..." for a bad line), also when
  // kRoberta is asked of a vocabulary without <s> and </s>.
  ByteLevelBpeTokenizer(const std::string& vocab_path, const std::string& merges_path, Options options);
  // The two files' text from streams (a converted tokenizer.json); the names are what
  // errors start with.
  ByteLevelBpeTokenizer(const std::string& vocab_path, std::istream&& vocab, const std::string& merges_path,
                        std::istream&& merges, Options options);

  // Thread-safe, as are all const methods: words are cached under a shared lock. Bytes
  // that are not valid UTF-8 are encoded as themselves (HF only ever sees valid text).
  std::vector<int32_t> Encode(std::string_view text, int max_len) const override;
  std::vector<int32_t> Pieces(std::string_view text) const override;
  // <pad> if the vocabulary has one, else the eos id, else 0 (padding is masked anyway).
  int32_t pad_id() const override { return pad_id_; }
  // kRoberta: <s> and </s>. kGpt2: <|endoftext|> for both, as GPT-2 uses it; -1 if absent.
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  // The largest id in vocab.json plus one.
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }

  // The text of ids: each token's characters mapped back to the bytes they stand for;
  // special tokens as written. Bytes that are not valid UTF-8 on their own (a token
  // cut mid-character) are kept as they are. Ids outside the vocabulary are skipped.
  std::string Decode(const std::vector<int32_t>& ids) const;

  Template sequence_template() const { return template_; }  // never kAuto
  // The vocabulary strings of Pieces(text), e.g. "Ġworld" (for tests and logs).
  std::vector<std::string> PieceStrings(std::string_view text) const;
  // GPT-2's pre-tokenizer: the regex's words of `text`, each mapped byte by byte
  // through ByteToUnicode(). No special tokens, no prefix space (for tests).
  static std::vector<std::string> ByteLevelWords(std::string_view text);
  // GPT-2's bytes_to_unicode: the printable character, as UTF-8, standing for each byte.
  static const std::array<std::string, 256>& ByteToUnicode();

 private:
  struct SpecialToken {
    std::string text;
    int32_t id;
    bool lstrip;  // also takes the whitespace before it
  };
  struct Merge {
    int32_t rank, new_id;
  };
  using WordCache = std::unordered_map<std::string, std::vector<int32_t>>;

  void ReadMerges(std::istream& in, const std::string& path);
  void ChooseTemplate(const std::string& vocab_path, Template requested);
  int32_t IdOf(const std::string& token) const;  // -1 if absent
  const Merge* FindMerge(int32_t left, int32_t right) const;
  void AppendText(std::string_view text, std::vector<int32_t>* ids) const;
  void AppendWord(std::string_view word, std::vector<int32_t>* ids) const;
  std::vector<int32_t> MergeWord(std::string_view word) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::array<int32_t, 256> byte_ids_{};  // the id of each byte's character; -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<SpecialToken> specials_;
  std::array<bool, 256> special_first_byte_{};
  bool add_prefix_space_;
  Template template_ = Template::kGpt2;
  int32_t pad_id_ = 0, bos_id_ = -1, eos_id_ = -1;

  mutable std::shared_mutex cache_mutex_;
  mutable WordCache cache_;
};

}  // namespace trainyard
