// A job attempt's output as lines a person can read: what a pool agent keeps of its
// mpirun's stdout and stderr (Note [Job output] in coordinator/job_output.h). Torch-free.
//
// With more than one rank, mpirun runs with --tag-output and starts each line, and each
// fragment it relays, with "[<jobid>,<rank>]<stdout>:" (or <stderr>, <stddiag>). A
// fragment need not end a line: a progress line of rank 0 can be cut by a fragment of
// rank 1, so tags are looked for anywhere, and each rank's text is put together on its
// own, its stdout apart from its stderr. A line that starts untagged is mpirun's own. A line that is
// rewritten in place with carriage returns (a progress bar) is kept as its last state;
// terminal escape sequences and other control characters are dropped, and invalid
// UTF-8 becomes U+FFFD, so what is kept is plain text.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainyard {

struct OutputLine {
  int rank = -1;  // the job rank that wrote it; -1: untagged (one rank, or mpirun itself)
  std::string text;
};

class OutputLines {
 public:
  static constexpr size_t kMaxLineBytes = 16384;  // a longer line is cut into lines of this size
  static constexpr size_t kMaxSources = 1024;     // tags of more (rank, stream)s count as untagged text

  // `tagged`: the output comes from an mpirun run with --tag-output.
  explicit OutputLines(bool tagged) : tagged_(tagged) {}

  // Takes the next bytes of the output; appends each line they complete to `lines`.
  void Feed(std::string_view bytes, std::vector<OutputLine>* lines);
  // The lines still open at the end of the output (e.g. a progress line never ended).
  void Finish(std::vector<OutputLine>* lines);

 private:
  struct Open {
    std::string text;        // since the last carriage return or newline
    std::string last_state;  // the plain text before the last carriage return
  };
  void Take(char c, std::vector<OutputLine>* lines);
  void Emit(int rank, Open& open, std::vector<OutputLine>* lines);

  // Whose text comes now: a job rank and its stream (stdout 0, stderr 1, diag 2), each
  // put together apart; {-1, 0} for untagged text.
  static constexpr std::pair<int, int> kUntagged{-1, 0};
  bool tagged_;
  std::pair<int, int> source_ = kUntagged;
  std::string carry_;  // the start of a tag cut by the end of the last Feed
  std::map<std::pair<int, int>, Open> open_;
};

// `text` as plain text: escape sequences (CSI, OSC and two-byte ones) and control
// characters other than tab removed, invalid UTF-8 replaced by U+FFFD. Linear time.
std::string PlainText(std::string_view text);

// "[rank R] text" for a tagged line, the text alone otherwise.
std::string RenderedLine(const OutputLine& line);

}  // namespace trainyard
