#include "coordinator/job_output.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "common/regular_file.h"

namespace trainyard {
namespace {

constexpr size_t kMaxAttemptsHeld = 4096;

}  // namespace

OutputFiles::OutputFiles(std::string runs_dir, int64_t rotate_bytes)
    : runs_dir_(std::move(runs_dir)), rotate_bytes_(rotate_bytes) {}

std::string OutputFiles::File(int64_t job, int attempt, int replica) const {
  return std::to_string(job) + "/attempt-" + std::to_string(attempt) + "/output" +
         (replica > 0 ? ".replica-" + std::to_string(replica) : std::string()) + ".log";
}

int64_t OutputFiles::Append(int64_t job, int attempt, int64_t offset, const std::string& text, int replica) {
  const Key key{job, attempt, replica};
  auto held = held_.find(key);
  if (held == held_.end()) {  // first heard of since this coordinator started: taken at its word
    if (heard_order_.size() >= kMaxAttemptsHeld) {
      held_.erase(heard_order_.front());
      heard_order_.pop_front();
    }
    held = held_.emplace(key, offset).first;
    heard_order_.push_back(key);
  }
  const int64_t end = offset + int64_t(text.size());
  if (end <= held->second) return held->second;  // a resend
  std::string bytes;
  if (offset > held->second)
    bytes = "[trainyard: " + std::to_string(offset - held->second) +
            " bytes of this attempt's output were dropped by its agent while the coordinator was unreachable]\n";
  bytes.append(text, size_t(std::max<int64_t>(0, held->second - offset)));
  AppendFileBeneath(runs_dir_, File(job, attempt, replica), bytes, rotate_bytes_);
  held->second = end;
  return end;
}

OutputRead OutputFiles::Read(int64_t job, int attempt, int64_t offset, size_t max_bytes, int rank) const {
  OutputRead out;
  FileRead read = ReadRangeBeneath(runs_dir_, File(job, attempt), offset, max_bytes);
  if (!read.ok()) {
    if (read.status != FileRead::kMissing) throw std::runtime_error(read.why);
    return out;
  }
  int64_t start = offset;
  if (offset > read.size) {  // rotated since: the new file from its start
    out.restarted = true;
    start = 0;
    read = ReadRangeBeneath(runs_dir_, File(job, attempt), 0, max_bytes);
    if (!read.ok()) throw std::runtime_error(read.why);
  }
  const size_t end = read.bytes.rfind('\n');
  const size_t whole = end == std::string::npos ? 0 : end + 1;
  read.bytes.resize(whole);
  out.next_offset = start + int64_t(whole);
  out.text = rank >= 0 ? LinesOfRank(read.bytes, rank) : std::move(read.bytes);
  return out;
}

std::string OutputFiles::Tail(int64_t job, int attempt, size_t max_bytes) const {
  const FileRead size = ReadRangeBeneath(runs_dir_, File(job, attempt), std::numeric_limits<int64_t>::max(), 0);
  if (!size.ok()) return "";
  const int64_t start = std::max<int64_t>(0, size.size - int64_t(max_bytes));
  std::string text = Read(job, attempt, start, max_bytes, -1).text;
  if (start > 0) text.erase(0, std::min(text.size(), text.find('\n') + 1));  // a line cut by the start
  return text;
}

std::string LinesOfRank(const std::string& text, int rank) {
  const std::string mine = "[rank " + std::to_string(rank) + "] ";
  std::string kept;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    end = end == std::string::npos ? text.size() : end + 1;
    const bool ranked = text.compare(begin, 6, "[rank ") == 0;
    if (!ranked || text.compare(begin, mine.size(), mine) == 0) kept.append(text, begin, end - begin);
    begin = end;
  }
  return kept;
}

}  // namespace trainyard
