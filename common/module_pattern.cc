#include "common/module_pattern.h"

#include <re2/re2.h>

namespace trainyard {

std::unique_ptr<ModulePattern> ModulePattern::Compile(const std::string& text, std::string* error) {
  if (text.size() > kMaxPatternBytes) {
    *error = "longer than " + std::to_string(kMaxPatternBytes) + " bytes";
    return nullptr;
  }
  RE2::Options options;
  options.set_log_errors(false);
  auto re = std::make_unique<RE2>(text, options);
  if (!re->ok()) {
    *error = re->error();
    return nullptr;
  }
  return std::unique_ptr<ModulePattern>(new ModulePattern(text, std::move(re)));
}

ModulePattern::ModulePattern(std::string text, std::unique_ptr<re2::RE2> re)
    : text_(std::move(text)), re_(std::move(re)) {}

ModulePattern::~ModulePattern() = default;

bool ModulePattern::FullMatch(const std::string& name) const { return RE2::FullMatch(name, *re_); }

}  // namespace trainyard
