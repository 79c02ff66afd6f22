#include "tests/common/source_path.h"

namespace trainyard {

std::string SourcePath(std::string_view relative) {
  std::string path = TRAINYARD_SOURCE_DIR;
  path += '/';
  path += relative;
  return path;
}

}  // namespace trainyard
