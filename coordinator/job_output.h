// Each job attempt's output, as the coordinator keeps and serves it. Torch-free.
//
// Note [Job output]
// An attempt's ranks' stdout and stderr are kept in <runs>/<job id>/attempt-<n>/output.log,
// beside the attempt's epochs.csv. The pool agent that leads the attempt reads its
// mpirun's output as plain lines ("[rank R] " first when the job has more ranks;
// worker/pool/output_lines.h) and sends them on as JobOutput chunks of whole lines,
// each saying where it starts in the attempt's output. One chunk is in flight at a
// time: the coordinator appends it and acknowledges with the offset it now holds, and
// the agent forgets what is acknowledged. A chunk that starts below that offset is a
// resend (dropped, acknowledged again). One that starts above it follows lines the
// agent had to drop (it keeps at most 4 MiB while the coordinator is away), and the file
// says how many bytes are missing there. After a coordinator restart the first chunk of
// an attempt is taken at its word, so a chunk appended just before a crash, and not yet
// acknowledged, is written twice: output is kept at least once, never silently cut.
// The agent sends what it has before it reports the attempt's end, so the result comes
// after the output it ends.
//
// The file is rotated to output.log.1 when it would grow past --max-output-mb: an attempt
// keeps at most about twice that. `jobctl logs --output` reads it by byte offset through
// the coordinator (a reader whose offset lies past the file's end learns that it was
// rotated and starts again at its start); the dashboard's job page shows its tail.
// Under --slurm no agent stands between the ranks and the coordinator: the batch
// script writes the attempt's output to slurm-<id>.out in the same folder, on the node
// that ran it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace trainyard {

inline constexpr size_t kMaxOutputChunkBytes = 64 << 10;  // of one JobOutput's text
inline constexpr size_t kMaxOutputReadBytes = 256 << 10;  // of one answer to `logs --output`

// What one read of an attempt's output gives.
struct OutputRead {
  std::string text;         // whole lines
  int64_t next_offset = 0;  // where the next read starts
  bool restarted = false;   // the offset lay past the end: the file was rotated, read from 0
};

class OutputFiles {
 public:
  // `runs_dir` is the coordinator's --runs folder; an attempt's folder in it exists
  // before its first chunk comes (the coordinator makes it when the attempt starts).
  OutputFiles(std::string runs_dir, int64_t rotate_bytes);

  // Takes a chunk of job `job`'s attempt `attempt` that starts at `offset` of its
  // output; returns the offset now held (to acknowledge). Throws std::runtime_error when
  // the file cannot be written (nothing is counted as held then). Replica r > 0 of an
  // elastic attempt (its slot's index) has an output of its own, output.replica-<r>.log;
  // Read and Tail read replica 0's, output.log.
  int64_t Append(int64_t job, int attempt, int64_t offset, const std::string& text, int replica = 0);

  // At most `max_bytes` of the attempt's output from byte `offset` of output.log, in
  // whole lines; with `rank` >= 0 only the lines of that job rank and the lines no
  // rank wrote (mpirun's own, or every line of a job of one rank). A missing file reads
  // as empty.
  OutputRead Read(int64_t job, int attempt, int64_t offset, size_t max_bytes, int rank) const;

  // The last whole lines of the attempt's output, at most `max_bytes` of them.
  std::string Tail(int64_t job, int attempt, size_t max_bytes) const;

 private:
  std::string File(int64_t job, int attempt, int replica = 0) const;
  using Key = std::tuple<int64_t, int, int>;  // job, attempt, replica

  std::string runs_dir_;
  int64_t rotate_bytes_;
  // The output offset held, of the attempts heard from most recently (bounded).
  std::map<Key, int64_t> held_;
  std::deque<Key> heard_order_;
};

// Keeps the lines of `text` (each ending in '\n') that job rank `rank` wrote, or that
// no rank did ("[rank R] " is how a rank's line starts).
std::string LinesOfRank(const std::string& text, int rank);

}  // namespace trainyard
