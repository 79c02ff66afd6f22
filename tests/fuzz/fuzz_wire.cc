// libFuzzer target: bytes -> the coordinator's message handling. Each input is a
// script of frames (wire_script.h) played through Server::HandleFrame against a fresh
// coordinator whose store holds one running two-rank job. The invariant: whatever
// arrives, HandleFrame returns (no exception, signal or sanitizer report) and the
// coordinator can still answer a List afterwards.
//
// The timers (Server::Tick) are private and not driven here: assignment and liveness
// expiry are outside this target.
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/curve/curve_keys.h"
#include "coordinator/server.h"
#include "coordinator/state_store.h"
#include "tests/fuzz/fuzz_folder.h"
#include "tests/fuzz/wire_script.h"

namespace trainyard::fuzz {
namespace {

namespace fs = std::filesystem;

std::string StatePath() { return ScratchFolder() + "/state.db"; }

// CURVE keys made once: the server loads them and runs its ZAP handler, as the daemon does.
const std::string& KeysFolder() {
  static const std::string* const keys = [] {
    auto* dir = new std::string(ScratchFolder() + "/keys");
    InitKeyDir(*dir);
    return dir;
  }();
  return *keys;
}

// A store with job kJob RUNNING as attempt kAttempt on ranks 0,1 of kWorld, made once
// (closing it folds the write-ahead log into this one file).
const std::string& SeededStore() {
  static const std::string* const path = [] {
    auto* template_path = new std::string(ScratchFolder() + "/seeded.db");
    StateStore store(*template_path, /*start_fresh=*/true);
    NewJob job;
    job.name = "seeded";
    job.idempotency_key = "seeded";
    job.spec_yaml = "name: seeded\n";
    job.source = "seeded.yaml";
    job.base_dir = ScratchFolder();
    job.ranks = 2;
    job.max_restarts = 1;
    bool created = false;
    if (store.Submit(job, WallNow(), &created).id != kJob) std::abort();
    store.SetState(kJob, JobState::kRunning, "", 5.0);
    if (store.StartAttempt(kJob, std::string(kWorld) + ":0,1", WallNow()) != kAttempt) std::abort();
    return template_path;
  }();
  return *path;
}

// Each input starts from a copy of the seeded store: a fresh state, no history. Written
// from memory with plain writes: fs::copy_file's sendfile fails with EINTR when
// libFuzzer's -timeout alarm (a handler without SA_RESTART) lands during it.
void ResetStore() {
  static const std::string* const seeded = [] {
    std::ifstream in(SeededStore(), std::ios::binary);
    return new std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  for (const char* suffix : {"-wal", "-shm"}) fs::remove(StatePath() + suffix);
  std::ofstream out(StatePath(), std::ios::binary | std::ios::trunc);
  out.write(seeded->data(), static_cast<std::streamsize>(seeded->size()));
  if (!out.flush()) std::abort();
}

// The running attempt's folder, as the coordinator made it, without the output.log an
// earlier input wrote.
void ResetRunsFolder() {
  const fs::path attempt =
      fs::path(ScratchFolder()) / "runs" / std::to_string(kJob) / ("attempt-" + std::to_string(kAttempt));
  fs::create_directories(attempt);
  fs::remove(attempt / "output.log");
  fs::remove(attempt / "output.log.1");
}

// The seeds' submissions say base_dir "." for the scratch folder, whose path changes
// from run to run (the process must keep its working directory: libFuzzer writes the
// corpus and artifacts relative to it). Other payloads pass through byte for byte.
std::string RootSubmission(const std::string& payload) {
  wire::Envelope e;
  if (!e.ParseFromString(payload) || !e.has_submit() || e.submit().base_dir() != ".") return payload;
  e.mutable_submit()->set_base_dir(ScratchFolder());
  return e.SerializeAsString();
}

}  // namespace
}  // namespace trainyard::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);  // silences a warning per frame with invalid UTF-8
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainyard;
  fuzz::ResetStore();
  fuzz::ResetRunsFolder();
  ServerOptions options;
  options.listen = "inproc://fuzz_wire";
  options.state_path = fuzz::StatePath();
  options.runs_dir = fuzz::ScratchFolder() + "/runs";
  options.keys_dir = fuzz::KeysFolder();
  Server server(options);
  for (const fuzz::Frame& frame : fuzz::DecodeScript(data, size)) {
    const std::string payload = fuzz::RootSubmission(frame.payload);
    server.HandleFrame(fuzz::kPeers[frame.peer], fuzz::kPeerRoles[frame.peer], payload.data(), payload.size());
  }
  wire::Envelope list;
  list.set_version(kProtocolVersion);
  list.mutable_list();
  const std::string bytes = list.SerializeAsString();
  const int64_t bad_before = server.bad_frames();
  server.HandleFrame("client", "client", bytes.data(), bytes.size());
  if (server.bad_frames() != bad_before) std::abort();  // a valid List must still be served
  return 0;
}
