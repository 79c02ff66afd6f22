#include "data/byte_level_bpe_tokenizer.h"

#include <unicode/localpointer.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "common/text_line.h"

namespace trainyard {

// How a text becomes ids, step by step as Hugging Face's tokenizers library does it
// (AddedVocabulary, the ByteLevel pre-tokenizer, models/bpe):
//
// 1. Special tokens written literally in the text ("a<s>b") are cut out first and map
//    to their own ids. The leftmost match wins, the longest among those starting at the
//    same byte. A token with lstrip (RoBERTa's <mask>) also swallows the whitespace
//    before it, back to the end of the previous special token. (HF matches tokens with
//    normalized=false in a first pass and the others in a second; with no normalizer
//    and these token sets, one leftmost-longest pass finds the same matches.)
// 2. With add_prefix_space, each remaining stretch of text that does not start with a
//    space gets one in front, so a sentence's first word looks like every other word.
// 3. GPT-2's regex splits each stretch into words: contractions, letters, digits,
//    other symbols (each optionally led by one space) and whitespace runs, where a
//    run followed by a word leaves its last space to that word ("a  b" -> "a", " ",
//    " b").
// 4. Each word's UTF-8 bytes map through bytes_to_unicode to one vocabulary character
//    each (a space is "Ġ"), so every byte sequence is representable and there is no
//    unknown token.
// 5. BPE on each word: starting from single characters, repeatedly merge the adjacent
//    pair whose merges.txt line comes first, the leftmost one on ties, until no pair
//    is in merges.txt. A priority queue holds the candidate pairs; an entry is skipped
//    when its left symbol was absorbed or its pair no longer yields the same token, as
//    in HF's Word::merge_all (which is what makes the ids equal, not just similar).
//    Words are cached: text repeats its words, and the merges dominate the cost.
// 6. The template adds <s> ... </s> (RoBERTa) or nothing (GPT-2), after truncation.
namespace {

// Words this long or longer are not cached (HF's limit too); the cache stops growing
// at kCacheCapacity words, which bounds it to a few tens of MB.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 100'000;
constexpr int64_t kMaxVocabulary = 1'000'000;  // ids above this are refused (as config.json's vocab_size)

// GPT-2's pattern with \s spelled [\p{White_Space}]: ICU's \s is that set too, but its
// user guide documents [\t\n\f\r\p{Z}], which would miss VT and NEL; HF's Oniguruma
// treats VT, NEL, NBSP, U+2028 and U+3000 as whitespace and FS and ZWSP as not.
constexpr const char* kWordRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+)"
                                   R"(|[\p{White_Space}]+(?![^\p{White_Space}])|[\p{White_Space}]+)";

// Compiled once and shared: a RegexPattern is immutable and safe to use from several
// threads, each with a RegexMatcher of its own.
const icu::RegexPattern& WordPattern() {
  static const std::unique_ptr<icu::RegexPattern> pattern = [] {
    UErrorCode status = U_ZERO_ERROR;
    UParseError where;
    std::unique_ptr<icu::RegexPattern> compiled(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kWordRegex), 0, where, status));
    if (U_FAILURE(status))
      throw std::logic_error(std::string("GPT-2 word regex does not compile: ") + u_errorName(status));
    return compiled;
  }();
  return *pattern;
}

// Calls emit(word) for each word of GPT-2's pre-tokenizer regex, in order. The words
// cover `text` (a stretch the regex skipped would be passed on too; it skips none).
template <typename Emit>
void ForEachWord(std::string_view text, Emit emit) {
  if (text.empty()) return;
  UErrorCode status = U_ZERO_ERROR;
  // Over UTF-8 text, ICU's native indexes are byte offsets: no UTF-16 round trip.
  icu::LocalUTextPointer utext(utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status));
  std::unique_ptr<icu::RegexMatcher> matcher(WordPattern().matcher(status));
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU regex matcher: ") + u_errorName(status));
  matcher->reset(utext.getAlias());
  size_t done = 0;
  while (matcher->find(status)) {
    const auto start = static_cast<size_t>(matcher->start64(status));
    const auto end = static_cast<size_t>(matcher->end64(status));
    if (start > done) emit(text.substr(done, start - done));
    emit(text.substr(start, end - start));
    done = end;
  }
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU regex search: ") + u_errorName(status));
  if (done < text.size()) emit(text.substr(done));
}

std::array<std::string, 256> BuildByteToUnicode() {
  std::array<std::string, 256> table;
  UChar32 next_unprintable = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const UChar32 c = printable ? b : next_unprintable++;
    char utf8[U8_MAX_LENGTH];
    int32_t length = 0;
    U8_APPEND_UNSAFE(utf8, length, c);  // c is a valid code point below U+0800
    table[b].assign(utf8, static_cast<size_t>(length));
  }
  return table;
}

// Where the run of whitespace that ends at `end` starts (`end` if there is none).
size_t WhitespaceStart(std::string_view text, size_t end) {
  auto i = static_cast<int32_t>(end);
  while (i > 0) {
    int32_t before = i;
    UChar32 c;
    U8_PREV(text.data(), 0, before, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    i = before;
  }
  return static_cast<size_t>(i);
}

std::ifstream Open(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the " + what);
  return in;
}

std::unordered_map<std::string, int32_t> ReadVocabJson(std::istream& in, const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  if (!json.is_object() || json.empty())
    throw std::runtime_error(path + ": expected a non-empty JSON object of {\"token\": id}");
  std::unordered_map<std::string, int32_t> vocab;
  for (const auto& [token, id] : json.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocabulary)
      throw std::runtime_error(path + ": token '" + token + "': expected an id in [0, " +
                               std::to_string(kMaxVocabulary - 1) + "], got " + id.dump());
    vocab[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  return vocab;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

}  // namespace

const std::array<std::string, 256>& ByteLevelBpeTokenizer::ByteToUnicode() {
  static const std::array<std::string, 256> table = BuildByteToUnicode();
  return table;
}

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const std::string& vocab_path, const std::string& merges_path,
                                             Options options)
    : ByteLevelBpeTokenizer(vocab_path, Open(vocab_path, "vocabulary"), merges_path, Open(merges_path, "merges file"),
                            options) {}

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const std::string& vocab_path, std::istream&& vocab,
                                             const std::string& merges_path, std::istream&& merges, Options options)
    : vocab_(ReadVocabJson(vocab, vocab_path)), add_prefix_space_(options.add_prefix_space) {
  int32_t max_id = 0;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  id_to_token_.resize(static_cast<size_t>(max_id) + 1);
  for (const auto& [token, id] : vocab_) id_to_token_[id] = token;
  for (int b = 0; b < 256; ++b) byte_ids_[b] = IdOf(ByteToUnicode()[b]);
  ReadMerges(merges, merges_path);
  ChooseTemplate(vocab_path, options.sequence_template);
}

int32_t ByteLevelBpeTokenizer::IdOf(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

// Rank = the merge's position among the merge lines; a pair listed twice keeps its
// last line, as HF's hash map does.
void ByteLevelBpeTokenizer::ReadMerges(std::istream& in, const std::string& path) {
  std::string line;
  int line_number = 0;
  int32_t rank = 0;
  while (ReadTextLine(in, line)) {
    ++line_number;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const std::string where = path + ":" + std::to_string(line_number) + ": ";
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw std::runtime_error(where + "expected two tokens separated by one space, got '" + line + "'");
    const std::string tokens[3] = {line.substr(0, space), line.substr(space + 1),
                                   line.substr(0, space) + line.substr(space + 1)};
    int32_t ids[3];
    for (int i = 0; i < 3; ++i)
      if ((ids[i] = IdOf(tokens[i])) < 0)
        throw std::runtime_error(where + "'" + tokens[i] + "' is not in the vocabulary");
    merges_[PairKey(ids[0], ids[1])] = Merge{rank++, ids[2]};
  }
}

void ByteLevelBpeTokenizer::ChooseTemplate(const std::string& vocab_path, Template requested) {
  const int32_t s = IdOf("<s>"), end_s = IdOf("</s>");
  template_ = requested != Template::kAuto ? requested : s >= 0 && end_s >= 0 ? Template::kRoberta : Template::kGpt2;
  std::vector<std::pair<const char*, bool>> specials;  // token, lstrip
  if (template_ == Template::kRoberta) {
    if (s < 0 || end_s < 0)
      throw std::runtime_error(vocab_path + ": the roberta template needs <s> and </s>; the vocabulary has no " +
                               (s < 0 ? "<s>" : "</s>"));
    bos_id_ = s;
    eos_id_ = end_s;
    specials = {{"<s>", false}, {"</s>", false}, {"<unk>", false}, {"<pad>", false}, {"<mask>", true}};
  } else {
    bos_id_ = eos_id_ = IdOf("<|endoftext|>");
    specials = {{"<|endoftext|>", false}};
  }
  for (const auto& [token, lstrip] : specials) {
    const int32_t id = IdOf(token);
    if (id < 0) continue;
    specials_.push_back({token, id, lstrip});
    special_first_byte_[static_cast<unsigned char>(token[0])] = true;
  }
  const int32_t pad = IdOf("<pad>");
  pad_id_ = pad >= 0 ? pad : eos_id_ >= 0 ? eos_id_ : 0;
}

const ByteLevelBpeTokenizer::Merge* ByteLevelBpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> ByteLevelBpeTokenizer::Encode(std::string_view text, int max_len) const {
  std::vector<int32_t> pieces = Pieces(text);
  if (template_ == Template::kRoberta) return WrapWithClsSep(std::move(pieces), bos_id_, eos_id_, max_len);
  pieces.resize(std::min(pieces.size(), static_cast<size_t>(std::max(max_len, 0))));
  return pieces;
}

std::vector<int32_t> ByteLevelBpeTokenizer::Pieces(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t done = 0;  // end of the last special token
  for (size_t i = 0; i < text.size();) {
    const SpecialToken* found = nullptr;
    if (special_first_byte_[static_cast<unsigned char>(text[i])])
      for (const auto& special : specials_)
        if (text.compare(i, special.text.size(), special.text) == 0 &&
            (!found || special.text.size() > found->text.size()))
          found = &special;
    if (!found) {
      ++i;
      continue;
    }
    const size_t start = found->lstrip ? std::max(done, WhitespaceStart(text, i)) : i;
    if (start > done) AppendText(text.substr(done, start - done), &ids);
    ids.push_back(found->id);
    done = i = i + found->text.size();
  }
  if (done < text.size()) AppendText(text.substr(done), &ids);
  return ids;
}

void ByteLevelBpeTokenizer::AppendText(std::string_view text, std::vector<int32_t>* ids) const {
  auto append = [&](std::string_view word) { AppendWord(word, ids); };
  if (add_prefix_space_ && !text.empty() && text.front() != ' ') {
    const std::string spaced = " " + std::string(text);
    ForEachWord(spaced, append);
  } else {
    ForEachWord(text, append);
  }
}

void ByteLevelBpeTokenizer::AppendWord(std::string_view word, std::vector<int32_t>* ids) const {
  std::string key(word);  // (C++17 has no heterogeneous lookup; most words fit the small-string buffer)
  {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = MergeWord(word);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (word.size() >= kMaxCachedWordBytes) return;
  std::unique_lock lock(cache_mutex_);
  if (cache_.size() < kCacheCapacity) cache_.emplace(std::move(key), std::move(merged));
}

std::vector<int32_t> ByteLevelBpeTokenizer::MergeWord(std::string_view word) const {
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (unsigned char byte : word) {
    if (byte_ids_[byte] < 0) continue;  // HF drops a character the vocabulary lacks (there is no unk)
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({byte_ids_[byte], n - 1, -1, true});
  }
  // A min-queue on (rank, position): the earliest merge first, the leftmost on ties.
  auto after = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> queue(after);
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const Merge* m = FindMerge(symbols[i].id, symbols[i + 1].id))
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = FindMerge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // a stale entry
    left.id = top.new_id;
    left.next = right.next;
    right.alive = false;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0)
      if (const Merge* m = FindMerge(symbols[left.prev].id, left.id)) queue.push({m->rank, left.prev, m->new_id});
    if (left.next >= 0)
      if (const Merge* m = FindMerge(left.id, symbols[left.next].id)) queue.push({m->rank, top.pos, m->new_id});
  }
  std::vector<int32_t> ids;
  for (const Symbol& symbol : symbols)
    if (symbol.alive) ids.push_back(symbol.id);
  return ids;
}

std::string ByteLevelBpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  static const std::unordered_map<std::string, char> byte_of = [] {
    std::unordered_map<std::string, char> inverse;
    for (int b = 0; b < 256; ++b) inverse[ByteToUnicode()[b]] = static_cast<char>(b);
    return inverse;
  }();
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= id_to_token_.size()) continue;
    const std::string& token = id_to_token_[size_t(id)];
    bool special = false;
    for (const auto& s : specials_) special = special || s.id == id;
    if (special) {
      text += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {  // one UTF-8 character at a time
      const auto lead = static_cast<unsigned char>(token[i]);
      const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      auto it = byte_of.find(token.substr(i, length));
      text += it != byte_of.end() ? std::string(1, it->second) : token.substr(i, length);
      i += length;
    }
  }
  return text;
}

std::vector<std::string> ByteLevelBpeTokenizer::PieceStrings(std::string_view text) const {
  std::vector<std::string> strings;
  for (int32_t id : Pieces(text)) strings.push_back(id_to_token_[id]);
  return strings;
}

std::vector<std::string> ByteLevelBpeTokenizer::ByteLevelWords(std::string_view text) {
  std::vector<std::string> words;
  ForEachWord(text, [&](std::string_view word) {
    std::string mapped;
    for (unsigned char byte : word) mapped += ByteToUnicode()[byte];
    words.push_back(std::move(mapped));
  });
  return words;
}

}  // namespace trainyard
