// Paths into the checkout (configs/, data/prepared/) for the tests that read its files.
// The checkout's root is compiled into source_path.cc alone: a definition on every test
// file would change each one's preprocessed text per clone, and a fresh clone would then
// miss the compiler cache on all of them.
#pragma once

#include <string>
#include <string_view>

namespace trainyard {

// The checkout's root joined with `relative` ("configs/jobs/langid_tiny.yaml").
std::string SourcePath(std::string_view relative);

}  // namespace trainyard
