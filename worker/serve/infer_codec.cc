#include "worker/serve/infer_codec.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace trainyard {
namespace {

constexpr int64_t kMaxElements = int64_t(1) << 28;

const TensorIn* Find(const std::vector<TensorIn>& inputs, const std::string& name) {
  for (const TensorIn& t : inputs)
    if (t.name == name) return &t;
  return nullptr;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool AsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The shortest prefix of `text` holding `words` runs of non-space bytes, cut where the
// last one ends (or all of `text`). Both tokenizers split at ASCII spaces first and give
// each run one token or more, so the prefix's first `words` tokens are the whole text's:
// a row is counted and cut from it without tokenizing megabytes it will never keep.
std::string_view LeadingWords(std::string_view text, size_t words) {
  size_t at = 0;
  for (size_t seen = 0; seen < words; ++seen) {
    while (at < text.size() && AsciiSpace(text[at])) ++at;
    if (at == text.size()) return text;
    while (at < text.size() && !AsciiSpace(text[at])) ++at;
  }
  return text.substr(0, at);
}

std::vector<std::vector<int32_t>> TextRows(const TensorIn& text, const VersionMeta& meta, bool truncate) {
  if (text.datatype != "BYTES") throw InferInputError("input 'TEXT': datatype " + text.datatype + ", expected BYTES");
  const bool column = text.shape.size() == 2 && text.shape[1] == 1;
  if (text.shape.size() != 1 && !column)
    throw InferInputError("input 'TEXT': shape " + ShapeText(text.shape) + ", expected [N] or [N, 1]");
  if (int64_t(text.bytes.size()) != text.shape[0])
    throw InferInputError("input 'TEXT': shape " + ShapeText(text.shape) + " but " + std::to_string(text.bytes.size()) +
                          " elements");
  std::vector<std::vector<int32_t>> rows;
  for (size_t i = 0; i < text.bytes.size(); ++i) {
    // One word more than the positions: enough to tell a text that does not fit.
    const std::string_view head = LeadingWords(text.bytes[i], size_t(meta.max_tokens) + 1);
    std::vector<int32_t> ids = meta.tokenizer->Encode(head, 1 << 30);
    if (int(ids.size()) > meta.max_tokens) {
      if (!truncate)
        throw InferInputError("input 'TEXT' element " + std::to_string(i) + ": more tokens than the model's " +
                              std::to_string(meta.max_tokens) + " positions (serve.truncate is off)");
      ids = meta.tokenizer->Encode(head, meta.max_tokens);
    }
    if (ids.empty()) throw InferInputError("input 'TEXT' element " + std::to_string(i) + ": no tokens");
    rows.push_back(std::move(ids));
  }
  return rows;
}

std::vector<std::vector<int32_t>> IdRows(const TensorIn& ids, const TensorIn* mask, const VersionMeta& meta) {
  for (const TensorIn* t : {&ids, mask}) {
    if (!t) continue;
    if (t->datatype != "INT64" && t->datatype != "INT32")
      throw InferInputError("input '" + t->name + "': datatype " + t->datatype + ", expected INT64");
    if (t->shape.size() != 2)
      throw InferInputError("input '" + t->name + "': shape " + ShapeText(t->shape) + ", expected [N, T]");
    if (int64_t(t->ints.size()) != t->shape[0] * t->shape[1])
      throw InferInputError("input '" + t->name + "': shape " + ShapeText(t->shape) + " but " +
                            std::to_string(t->ints.size()) + " elements");
  }
  if (mask && mask->shape != ids.shape)
    throw InferInputError("input 'attention_mask': shape " + ShapeText(mask->shape) + ", expected input_ids' " +
                          ShapeText(ids.shape));
  const int64_t n = ids.shape[0], t = ids.shape[1];
  std::vector<std::vector<int32_t>> rows(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < t; ++c) {
      const int64_t keep = mask ? mask->ints[r * t + c] : 1;
      if (keep != 0 && keep != 1)
        throw InferInputError("input 'attention_mask': element [" + std::to_string(r) + ", " + std::to_string(c) +
                              "] is " + std::to_string(keep) + ", expected 0 or 1");
      const int64_t id = ids.ints[r * t + c];
      if (!keep) continue;
      if (id < 0 || id >= meta.vocab_size)
        throw InferInputError("input 'input_ids': element [" + std::to_string(r) + ", " + std::to_string(c) + "] is " +
                              std::to_string(id) + ", outside the model's vocabulary of " +
                              std::to_string(meta.vocab_size));
      rows[r].push_back(static_cast<int32_t>(id));
    }
    if (rows[r].empty()) throw InferInputError("input 'attention_mask': row " + std::to_string(r) + " has no token");
    if (int(rows[r].size()) > meta.max_tokens)
      throw InferInputError("input 'input_ids': row " + std::to_string(r) + " has " + std::to_string(rows[r].size()) +
                            " tokens, more than the model's " + std::to_string(meta.max_tokens) + " positions");
  }
  return rows;
}

}  // namespace

int64_t ElementCount(const std::vector<int64_t>& shape, const std::string& input) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxElements || count * std::max<int64_t>(d, 1) > kMaxElements)
      throw InferInputError("input '" + input + "': shape " + ShapeText(shape) + " is negative or too large");
    count *= d;
  }
  return count;
}

void RawElements(const std::string& raw, TensorIn* t) {
  if (t->datatype == "BYTES") {
    for (size_t at = 0; at < raw.size();) {
      uint32_t n = 0;
      if (raw.size() - at < 4) throw InferInputError("input '" + t->name + "': BYTES data ends inside a length");
      std::memcpy(&n, raw.data() + at, 4);
      at += 4;
      if (n > raw.size() - at)
        throw InferInputError("input '" + t->name + "': a BYTES element of " + std::to_string(n) +
                              " bytes runs past the data sent for it");
      t->bytes.emplace_back(raw.data() + at, n);
      at += n;
    }
    return;
  }
  const size_t count = size_t(ElementCount(t->shape, t->name));
  const size_t width = t->datatype == "INT64" ? 8 : 4;
  if (raw.size() != count * width)
    throw InferInputError("input '" + t->name + "': " + std::to_string(raw.size()) +
                          " bytes of data do not match its shape and datatype (" + std::to_string(count * width) +
                          " bytes)");
  for (size_t i = 0; i < count; ++i) {
    if (width == 8) {
      int64_t v = 0;
      std::memcpy(&v, raw.data() + i * 8, 8);
      t->ints.push_back(v);
    } else {
      int32_t v = 0;
      std::memcpy(&v, raw.data() + i * 4, 4);
      t->ints.push_back(v);
    }
  }
}

std::string RawBytes(const TensorOut& out) {
  if (out.datatype == "FP32")
    return std::string(reinterpret_cast<const char*>(out.fp32.data()), out.fp32.size() * sizeof(float));
  std::string raw;
  for (const std::string& s : out.bytes) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    raw.append(reinterpret_cast<const char*>(&n), 4);
    raw += s;
  }
  return raw;
}

int PriorityLevel(int requested) { return requested <= 0 ? kDefaultPriority : requested; }

std::vector<std::vector<int32_t>> TokenRows(const std::vector<TensorIn>& inputs, const VersionMeta& meta, bool truncate,
                                            int max_rows) {
  for (const TensorIn& t : inputs)
    if (t.name != "TEXT" && t.name != "input_ids" && t.name != "attention_mask")
      throw InferInputError("input '" + t.name + "': unknown (expected TEXT, or input_ids and attention_mask)");
  const TensorIn* text = Find(inputs, "TEXT");
  const TensorIn* ids = Find(inputs, "input_ids");
  const TensorIn* mask = Find(inputs, "attention_mask");
  if (text && (ids || mask)) throw InferInputError("inputs: give TEXT, or input_ids and attention_mask, not both");
  if (!text && !ids) throw InferInputError("inputs: expected TEXT (BYTES) or input_ids (INT64)");
  std::vector<std::vector<int32_t>> rows = text ? TextRows(*text, meta, truncate) : IdRows(*ids, mask, meta);
  if (rows.empty()) throw InferInputError("inputs: no rows (the batch dimension is 0)");
  if (int(rows.size()) > max_rows)
    throw InferInputError("inputs: " + std::to_string(rows.size()) + " rows, more than serve.max_batch_size " +
                          std::to_string(max_rows));
  return rows;
}

std::vector<TensorOut> MakeOutputs(const InferCall& call, const VersionMeta& meta, const std::vector<float>& logits) {
  const int64_t classes = int64_t(meta.labels.size());
  const int64_t rows = classes ? int64_t(logits.size()) / classes : 0;
  std::vector<OutputWanted> wanted = call.outputs;
  if (wanted.empty()) wanted = {{"logits", call.binary_output}, {"label", call.binary_output}};
  std::vector<TensorOut> outputs;
  for (const OutputWanted& w : wanted) {
    TensorOut out;
    out.name = w.name;
    out.binary = w.binary;
    if (w.name == "logits") {
      out.datatype = "FP32";
      out.shape = {rows, classes};
      out.fp32 = logits;
    } else if (w.name == "label") {
      out.datatype = "BYTES";
      out.shape = {rows};
      for (int64_t r = 0; r < rows; ++r) {
        auto row = logits.begin() + r * classes;
        out.bytes.push_back(meta.labels[std::max_element(row, row + classes) - row]);
      }
    } else {
      throw InferInputError("output '" + w.name + "': unknown (expected logits or label)");
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace trainyard
