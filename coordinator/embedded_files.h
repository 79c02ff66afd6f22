// Text files compiled into the binary (cmake/embed_files.cmake writes the definition):
// the dashboard's pages, script and style, so the coordinator serves them wherever it is
// installed.
#pragma once

#include <string_view>
#include <vector>

namespace trainyard {

struct EmbeddedFile {
  std::string_view name;  // the file's name, without its folder
  std::string_view text;
};

const std::vector<EmbeddedFile>& EmbeddedFiles();

}  // namespace trainyard
