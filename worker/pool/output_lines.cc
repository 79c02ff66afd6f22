#include "worker/pool/output_lines.h"

#include <utility>

namespace trainyard {
namespace {

enum class TagMatch { kNone, kPartial, kWhole };

// Reads mpirun's "[<jobid>,<rank>]<stdout>:" at the start of `s` (s[0] == '['). The
// numbers are bounded, so a match is never longer than a few dozen bytes.
class TagReader {
 public:
  explicit TagReader(std::string_view s) : s_(s) {}

  TagMatch Read(size_t* length, int* rank, int* stream) {
    long job = 0, number = 0;
    TagMatch m;
    if ((m = Literal("[")) != TagMatch::kWhole || (m = Digits(9, &job)) != TagMatch::kWhole ||
        (m = Literal(",")) != TagMatch::kWhole || (m = Digits(7, &number)) != TagMatch::kWhole ||
        (m = Literal("]<std")) != TagMatch::kWhole || (m = Stream(stream)) != TagMatch::kWhole ||
        (m = Literal(">:")) != TagMatch::kWhole)
      return m;
    *length = p_;
    *rank = static_cast<int>(number);
    return TagMatch::kWhole;
  }

 private:
  TagMatch Literal(std::string_view word) {
    for (char c : word) {
      if (p_ == s_.size()) return TagMatch::kPartial;
      if (s_[p_] != c) return TagMatch::kNone;
      ++p_;
    }
    return TagMatch::kWhole;
  }
  TagMatch Digits(size_t most, long* value) {
    size_t n = 0;
    for (; p_ < s_.size() && n < most && s_[p_] >= '0' && s_[p_] <= '9'; ++p_, ++n)
      *value = *value * 10 + (s_[p_] - '0');
    if (p_ == s_.size()) return TagMatch::kPartial;
    return n > 0 ? TagMatch::kWhole : TagMatch::kNone;
  }
  TagMatch Stream(int* stream) {  // after "<std": out (0), err (1) or diag (2)
    const std::string_view names[] = {"out", "err", "diag"};
    for (int i = 0; i < 3; ++i) {
      const size_t start = p_;
      const TagMatch m = Literal(names[i]);
      *stream = i;
      if (m != TagMatch::kNone) return m;
      p_ = start;
    }
    return TagMatch::kNone;
  }

  std::string_view s_;
  size_t p_ = 0;
};

// The end of the escape sequence that starts at s[i] (an ESC).
size_t SkipEscape(std::string_view s, size_t i) {
  size_t j = i + 1;
  if (j == s.size()) return j;
  if (s[j] == '[') {  // CSI: parameters, intermediates, one final byte
    for (++j; j < s.size() && s[j] >= 0x20 && s[j] <= 0x3f; ++j) {
    }
    return j < s.size() && s[j] >= 0x40 && s[j] <= 0x7e ? j + 1 : j;
  }
  if (s[j] == ']' || s[j] == 'P' || s[j] == '_' || s[j] == '^') {  // a string, ended by BEL or ESC '\'
    for (++j; j < s.size(); ++j) {
      if (s[j] == 0x07) return j + 1;
      if (s[j] == 0x1b && j + 1 < s.size() && s[j + 1] == '\\') return j + 2;
    }
    return j;
  }
  while (j < s.size() && s[j] >= 0x20 && s[j] <= 0x2f) ++j;  // intermediates, then one final byte
  return j < s.size() && s[j] >= 0x30 && s[j] <= 0x7e ? j + 1 : j;
}

bool Continuation(std::string_view s, size_t i, unsigned char low = 0x80, unsigned char high = 0xbf) {
  if (i >= s.size()) return false;
  const auto c = static_cast<unsigned char>(s[i]);
  return c >= low && c <= high;
}

// The length of the valid UTF-8 sequence of two to four bytes at s[i]; 0 if there is none.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c >= 0xc2 && c <= 0xdf) return Continuation(s, i + 1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    const unsigned char low = c == 0xe0 ? 0xa0 : 0x80, high = c == 0xed ? 0x9f : 0xbf;
    return Continuation(s, i + 1, low, high) && Continuation(s, i + 2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const unsigned char low = c == 0xf0 ? 0x90 : 0x80, high = c == 0xf4 ? 0x8f : 0xbf;
    return Continuation(s, i + 1, low, high) && Continuation(s, i + 2) && Continuation(s, i + 3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string PlainText(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0x1b) {
      i = SkipEscape(s, i);
    } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
      ++i;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (const size_t n = Utf8Length(s, i)) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

std::string RenderedLine(const OutputLine& line) {
  return line.rank < 0 ? line.text : "[rank " + std::to_string(line.rank) + "] " + line.text;
}

void OutputLines::Feed(std::string_view bytes, std::vector<OutputLine>* lines) {
  std::string joined;
  std::string_view text = bytes;
  if (!carry_.empty()) {
    joined = std::move(carry_) + std::string(bytes);
    carry_.clear();
    text = joined;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (tagged_ && text[i] == '[') {
      size_t length = 0;
      int rank = -1, stream = 0;
      const TagMatch match = TagReader(text.substr(i)).Read(&length, &rank, &stream);
      if (match == TagMatch::kPartial) {  // the rest of the tag comes with the next bytes
        carry_ = std::string(text.substr(i));
        return;
      }
      if (match == TagMatch::kWhole) {
        const std::pair<int, int> source{rank, stream};
        source_ = open_.count(source) || open_.size() < kMaxSources ? source : kUntagged;
        i += length - 1;
        continue;
      }
    }
    Take(text[i], lines);
  }
}

void OutputLines::Finish(std::vector<OutputLine>* lines) {
  for (const char c : std::exchange(carry_, {})) Take(c, lines);
  for (auto& [source, open] : open_)
    if (!open.text.empty() || !open.last_state.empty()) Emit(source.first, open, lines);
  open_.clear();
}

void OutputLines::Take(char c, std::vector<OutputLine>* lines) {
  Open& open = open_[source_];
  if (c == '\n') {  // mpirun tags every line of a rank: what follows untagged is its own
    Emit(source_.first, open, lines);
    source_ = kUntagged;
    return;
  }
  if (c == '\r') {  // the line is rewritten in place: keep its state so far, if it shows anything
    std::string shown = PlainText(open.text);
    if (!shown.empty()) open.last_state = std::move(shown);
    open.text.clear();
    return;
  }
  open.text.push_back(c);
  if (open.text.size() >= kMaxLineBytes) {
    open.last_state.clear();
    Emit(source_.first, open, lines);
  }
}

void OutputLines::Emit(int rank, Open& open, std::vector<OutputLine>* lines) {
  std::string shown = PlainText(open.text);
  lines->push_back({rank, shown.empty() ? std::move(open.last_state) : std::move(shown)});
  open.text.clear();
  open.last_state.clear();
}

}  // namespace trainyard
