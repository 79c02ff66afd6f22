// A Hugging Face tokenizer.json (the `tokenizers` library's one-file format) read as the
// classic files the tokenizers in data/ take: WordPiece's vocab.txt, or byte-level BPE's
// vocab.json and merges.txt, with the settings its normalizer and pre-tokenizer carry.
//
// Only what data/ implements is read: a WordPiece model behind BERT's normalizer and
// pre-tokenizer ("##" continuations, 100 characters a word), or a BPE model behind a
// byte-level pre-tokenizer with no normalizer. Anything else (Unigram, WordLevel, a
// Metaspace or Sequence pre-tokenizer, BPE dropout or byte fallback) is refused with
// the field that decides it, so a model is never tokenized differently from HF without
// a word. Added tokens absent from the model's vocabulary join it at their ids.
// Torch-free; the bytes are untrusted (a model folder from anywhere): the JSON's depth
// and the file's size are bounded, and every walk is a loop.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trainyard {

struct HfTokenizerFiles {
  enum class Model { kWordPiece, kByteLevelBpe };
  Model model = Model::kWordPiece;
  std::string vocab;              // vocab.txt's text (a token a line, in id order), or vocab.json's
  std::string merges;             // merges.txt's text (byte-level BPE only)
  bool lowercase = true;          // WordPiece: BertNormalizer's lowercase (accents stripped with it)
  bool add_prefix_space = false;  // byte-level BPE: its ByteLevel pre-tokenizer's
};

// The largest tokenizer.json read (large multilingual vocabularies are about 20 MB).
inline constexpr size_t kMaxTokenizerJsonBytes = size_t(256) << 20;

// Throws std::runtime_error beginning with `source` and naming the field at fault.
HfTokenizerFiles ConvertTokenizerJson(std::string_view json_text, const std::string& source);

// Reads `path` (a regular file of at most kMaxTokenizerJsonBytes) and converts it.
HfTokenizerFiles ReadTokenizerJson(const std::string& path);

}  // namespace trainyard
