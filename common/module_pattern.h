// A module-name pattern for LoRA's target_modules written as one string, PEFT's
// `re.fullmatch(target_modules, name)`, on RE2: matching is linear in the name and the
// pattern whatever they hold, and compiling never recurses per nesting level, so a job
// file cannot make a parser or a model build spin or overflow its stack. RE2's syntax is
// Python's without lookaround and backreferences; a pattern that needs them is refused
// with RE2's reason.
#pragma once

#include <memory>
#include <string>

namespace re2 {
class RE2;
}

namespace trainyard {

class ModulePattern {
 public:
  static constexpr size_t kMaxPatternBytes = 4096;

  // Compiles `text`; on failure returns null and sets `*error` to why.
  static std::unique_ptr<ModulePattern> Compile(const std::string& text, std::string* error);
  ~ModulePattern();
  ModulePattern(const ModulePattern&) = delete;
  ModulePattern& operator=(const ModulePattern&) = delete;

  // True when the whole of `name` matches. Thread-safe.
  bool FullMatch(const std::string& name) const;
  const std::string& text() const { return text_; }

 private:
  ModulePattern(std::string text, std::unique_ptr<re2::RE2> re);
  std::string text_;
  std::unique_ptr<re2::RE2> re_;
};

}  // namespace trainyard
