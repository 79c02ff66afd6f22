#include "worker/jobs/checkpoint_sharing.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <stdexcept>

#include "common/atomic_file.h"
#include "common/log.h"
#include "worker/train/checkpoint.h"

namespace trainyard {
namespace {

constexpr const char* kProbeName = ".shared-probe";
// A checkpoint's bytes travel in pieces of this size: each is its own collective, with
// its own deadline (timeout_s), and MPI counts stay far below INT_MAX.
constexpr int64_t kPieceBytes = int64_t(64) << 20;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A token no earlier run left behind: 48 random bits, exact in a double.
double DrawToken() {
  std::random_device device;
  const uint64_t bits = (uint64_t(device()) << 16) ^ uint64_t(device());
  return double(bits & ((uint64_t(1) << 48) - 1)) + 1;
}

}  // namespace

std::string CheckpointWriters::Describe(const Communicator& comm) const {
  std::string text;
  for (int r : writers) text += (text.empty() ? "" : ", ") + comm.RankName(r);
  return text;
}

CheckpointWriters DecideCheckpointWriters(Communicator& comm, const std::string& dir) {
  namespace fs = std::filesystem;
  const int me = comm.rank(), n = comm.size();
  double token = 0;
  if (me == 0) {
    token = DrawToken();
    fs::create_directories(dir);
    WriteFileAtomically(dir + "/" + kProbeName, std::to_string(int64_t(token)));
  }
  // Rank 0 wrote the probe before any rank gets the token back.
  token = comm.AllGather({token}, "checkpoint writers: rank 0's probe")[0][0];
  bool sees_rank0 = true;
  if (comm.FirstRankOnHost(me) == me && comm.Host(me) != comm.Host(0)) {
    std::ifstream in(dir + "/" + kProbeName);
    int64_t found = -1;
    sees_rank0 = (in >> found) && found == int64_t(token);
  }
  const auto seen = comm.AllGather({sees_rank0 ? 1.0 : 0.0}, "checkpoint writers: shared folders");
  CheckpointWriters writers;
  for (int r = 0; r < n; ++r) {
    const int first = comm.FirstRankOnHost(r);
    writers.writer_of.push_back(seen[first][0] != 0 ? 0 : first);
  }
  std::set<int> distinct(writers.writer_of.begin(), writers.writer_of.end());
  writers.writers.assign(distinct.begin(), distinct.end());
  writers.mine = writers.writer_of[me] == me;
  if (writers.mine) fs::create_directories(dir);
  return writers;
}

SharedResume ShareNewestCheckpoint(Communicator& comm, const CheckpointWriters& writers, const std::string& dir,
                                   const LocalResume& mine) {
  const int me = comm.rank(), n = comm.size();
  const auto all = comm.AllGather({double(mine.step), mine.rejected_any ? 1.0 : 0.0}, "resume point");
  SharedResume out;
  int holder = -1;
  bool rejected = false;
  for (int r = 0; r < n; ++r) {
    if (all[r][0] > double(out.step)) {
      out.step = int64_t(all[r][0]);
      holder = r;
    }
    rejected = rejected || all[r][1] != 0;
  }
  if (out.step < 0) {
    out.only_rejected = rejected;
    return out;
  }
  std::vector<bool> lacks(n);
  for (int r = 0; r < n; ++r) lacks[r] = int64_t(all[r][0]) != out.step;
  if (std::none_of(lacks.begin(), lacks.end(), [](bool b) { return b; })) return out;

  const std::string path = CheckpointPath(dir, out.step);
  std::string bytes;
  if (me == holder) bytes = ReadWholeFile(path);
  const auto size = int64_t(comm.AllGather({double(bytes.size())}, "checkpoint size")[holder][0]);
  bytes.resize(size_t(size));
  if (me == holder)
    LogInfo(StrFormat("resume: sending the checkpoint of step %ld (%.1f MB) to the ranks without it", long(out.step),
                      double(size) / 1e6));
  for (int64_t at = 0; at < size; at += kPieceBytes) {
    const int64_t length = std::min(kPieceBytes, size - at);
    torch::Tensor piece = torch::from_blob(bytes.data() + at, {length}, torch::kByte);
    comm.Broadcast(piece, holder,
                   StrFormat("checkpoint of step %ld, bytes %ld-%ld", long(out.step), long(at), long(at + length)));
  }
  bool store = false;
  for (int r = 0; r < n; ++r) store = store || (lacks[r] && writers.writer_of[r] == me);
  if (store) WriteFileAtomically(path, bytes);
  comm.AnyTrue(false, "checkpoint stored where it lacked");  // every folder has it before anyone loads
  if (lacks[me]) out.load = path;
  return out;
}

}  // namespace trainyard
