// libFuzzer target: bytes -> a tokenizer.json converted to the classic files, as a job
// whose model.init folder holds only a tokenizer.json reads it (ConvertTokenizerJson).
// Every input must end in the files or a std::runtime_error naming the field; a
// conversion that succeeds must give a WordPiece vocabulary of one line per token and
// merges lines of two tokens.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/tokenizer_json.h"

namespace {

void CheckMergesLines(const std::string& merges) {
  size_t begin = merges.find('\n') + 1;  // after "#version: 0.2"
  while (begin < merges.size()) {
    const size_t end = merges.find('\n', begin);
    const std::string_view line(merges.data() + begin, end - begin);
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      std::abort();
    begin = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const trainyard::HfTokenizerFiles files = trainyard::ConvertTokenizerJson(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/tokenizer.json");
    if (files.vocab.empty() || files.vocab.back() != '\n') std::abort();
    if (files.model == trainyard::HfTokenizerFiles::Model::kByteLevelBpe) CheckMergesLines(files.merges);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
