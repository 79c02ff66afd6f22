#include "data/wordpiece_tokenizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "common/text_line.h"

namespace trainyard {
namespace {

constexpr int kMaxCharsPerWord = 100;

bool IsWhitespace(UChar32 c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType(c) == U_SPACE_SEPARATOR;
}

// Python's str.isspace(), which whitespace_tokenize() splits on.
bool IsPythonSpace(UChar32 c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85) return true;
  int8_t type = u_charType(c);
  if (type == U_SPACE_SEPARATOR || type == U_LINE_SEPARATOR || type == U_PARAGRAPH_SEPARATOR) return true;
  int bidi = u_charDirection(c);
  return bidi == U_WHITE_SPACE_NEUTRAL || bidi == U_BLOCK_SEPARATOR || bidi == U_SEGMENT_SEPARATOR;
}

bool IsControl(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  int8_t type = u_charType(c);
  return type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_UNASSIGNED || type == U_PRIVATE_USE_CHAR ||
         type == U_SURROGATE;
}

bool IsPunctuation(UChar32 c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0;
}

bool IsCjk(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// _clean_text and _tokenize_chinese_chars of the basic tokenizer.
icu::UnicodeString CleanAndSpaceCjk(std::string_view text) {
  icu::UnicodeString in =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  icu::UnicodeString out;
  for (int32_t i = 0; i < in.length(); i = in.moveIndex32(i, 1)) {
    UChar32 c = in.char32At(i);
    if (c == 0 || c == 0xFFFD || IsControl(c)) continue;
    if (IsWhitespace(c)) {
      out.append(UChar32(' '));
    } else if (IsCjk(c)) {
      out.append(UChar32(' ')).append(c).append(UChar32(' '));
    } else {
      out.append(c);
    }
  }
  return out;
}

std::vector<icu::UnicodeString> SplitOnPythonSpace(const icu::UnicodeString& text) {
  std::vector<icu::UnicodeString> words;
  icu::UnicodeString current;
  for (int32_t i = 0; i < text.length(); i = text.moveIndex32(i, 1)) {
    UChar32 c = text.char32At(i);
    if (IsPythonSpace(c)) {
      if (!current.isEmpty()) words.push_back(current);
      current.remove();
    } else {
      current.append(c);
    }
  }
  if (!current.isEmpty()) words.push_back(current);
  return words;
}

icu::UnicodeString LowerAndStripAccents(const icu::UnicodeString& word) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  icu::UnicodeString lowered(word);
  lowered.toLower(icu::Locale::getRoot());
  icu::UnicodeString decomposed = nfd->normalize(lowered, status);
  if (U_FAILURE(status)) throw std::runtime_error("ICU NFD normalization failed");
  icu::UnicodeString out;
  for (int32_t i = 0; i < decomposed.length(); i = decomposed.moveIndex32(i, 1)) {
    UChar32 c = decomposed.char32At(i);
    if (u_charType(c) != U_NON_SPACING_MARK) out.append(c);
  }
  return out;
}

void SplitOnPunctuation(const icu::UnicodeString& word, std::vector<std::string>* out) {
  icu::UnicodeString current;
  auto flush = [&] {
    if (current.isEmpty()) return;
    std::string utf8;
    out->push_back(current.toUTF8String(utf8));
    current.remove();
  };
  for (int32_t i = 0; i < word.length(); i = word.moveIndex32(i, 1)) {
    UChar32 c = word.char32At(i);
    if (IsPunctuation(c)) {
      flush();
      current.append(c);
      flush();
    } else {
      current.append(c);
    }
  }
  flush();
}

std::ifstream OpenVocab(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the vocabulary");
  return in;
}

std::unordered_map<std::string, int32_t> ReadVocab(std::istream& in) {
  std::unordered_map<std::string, int32_t> vocab;
  std::string line;
  int32_t id = 0;
  while (ReadTextLine(in, line)) {
    vocab.emplace(line, id++);
  }
  return vocab;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocab_path, bool lowercase)
    : WordPieceTokenizer(vocab_path, OpenVocab(vocab_path), lowercase) {}

WordPieceTokenizer::WordPieceTokenizer(const std::string& source, std::istream&& vocab, bool lowercase)
    : vocab_(ReadVocab(vocab)), lowercase_(lowercase) {
  auto require = [&](const char* token) {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) throw std::runtime_error(source + ": the vocabulary has no " + token + " token");
    return it->second;
  };
  pad_id_ = require("[PAD]");
  unk_id_ = require("[UNK]");
  cls_id_ = require("[CLS]");
  sep_id_ = require("[SEP]");
}

std::vector<std::string> WordPieceTokenizer::BasicTokenize(std::string_view text) const {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  icu::UnicodeString normalized = nfc->normalize(CleanAndSpaceCjk(text), status);
  if (U_FAILURE(status)) throw std::runtime_error("ICU NFC normalization failed");
  std::vector<std::string> pieces;
  for (const auto& word : SplitOnPythonSpace(normalized))
    SplitOnPunctuation(lowercase_ ? LowerAndStripAccents(word) : word, &pieces);
  // Lower-casing can produce spaces (never in practice, but the reference re-splits).
  std::vector<std::string> words;
  for (const auto& piece : pieces)
    for (const auto& w : SplitOnPythonSpace(icu::UnicodeString::fromUTF8(piece))) {
      std::string utf8;
      words.push_back(w.toUTF8String(utf8));
    }
  return words;
}

void WordPieceTokenizer::AppendWordPieces(const std::string& word, std::vector<int32_t>* ids) const {
  icu::UnicodeString chars = icu::UnicodeString::fromUTF8(word);
  const int32_t length = chars.countChar32();
  if (length > kMaxCharsPerWord) {
    ids->push_back(unk_id_);
    return;
  }
  std::vector<int32_t> offsets;  // UTF-16 offset of each code point, plus the end
  for (int32_t i = 0; i < chars.length(); i = chars.moveIndex32(i, 1)) offsets.push_back(i);
  offsets.push_back(chars.length());
  std::vector<int32_t> pieces;
  for (int32_t start = 0; start < length;) {
    int32_t found = -1, end = length;
    for (; end > start; --end) {
      std::string candidate = start > 0 ? "##" : "";
      chars.tempSubStringBetween(offsets[start], offsets[end]).toUTF8String(candidate);
      auto it = vocab_.find(candidate);
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {
      ids->push_back(unk_id_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  ids->insert(ids->end(), pieces.begin(), pieces.end());
}

std::vector<int32_t> WordPieceTokenizer::TokenIds(std::string_view text) const {
  std::vector<int32_t> ids;
  for (const auto& word : BasicTokenize(text)) AppendWordPieces(word, &ids);
  return ids;
}

// A text far longer than max_len is tokenized a prefix at a time, the prefix doubling
// until it gives enough pieces. Each prefix ends just before an ASCII space, and every
// stage of the basic tokenizer works within one character or one whitespace-separated
// word (NFC never composes across a space: a space is a starter that nothing composes
// with), so a prefix's pieces are the whole text's first pieces. The work stays under
// three times the whole text's when no prefix suffices (sparse text: long URLs, say),
// and a 2,000-character text cut at 128 tokens costs about half.
std::vector<int32_t> WordPieceTokenizer::Encode(std::string_view text, int max_len) const {
  const size_t room = max_len > 2 ? static_cast<size_t>(max_len - 2) : 0;
  for (size_t prefix = std::max<size_t>(256, 8 * room); prefix < text.size(); prefix *= 2) {
    const size_t cut = text.rfind(' ', prefix);
    if (cut == std::string_view::npos || cut == 0) continue;
    std::vector<int32_t> pieces = TokenIds(text.substr(0, cut));
    if (pieces.size() >= room) return WrapWithClsSep(std::move(pieces), cls_id_, sep_id_, max_len);
  }
  return WrapWithClsSep(TokenIds(text), cls_id_, sep_id_, max_len);
}

std::vector<int32_t> WrapWithClsSep(std::vector<int32_t> pieces, int32_t cls, int32_t sep, int max_len) {
  const size_t room = max_len > 2 ? static_cast<size_t>(max_len - 2) : 0;
  if (pieces.size() > room) pieces.resize(room);
  std::vector<int32_t> ids;
  ids.reserve(pieces.size() + 2);
  ids.push_back(cls);
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  ids.push_back(sep);
  return ids;
}

}  // namespace trainyard
