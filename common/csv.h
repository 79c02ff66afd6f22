// The CSV rows Trainyard writes (epochs.csv, benchmark.csv): comma-separated cells that
// never hold a comma, a quote or a newline, so no quoting is needed or read.
#pragma once

#include <string>
#include <vector>

namespace trainyard {

// The cells of one line; "a,,b," gives {"a", "", "b", ""}.
std::vector<std::string> SplitCsv(const std::string& line);

}  // namespace trainyard
