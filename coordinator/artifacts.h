// A job's files as jobctl lists and fetches them: the coordinator's side. Torch-free.
//
// Note [Artifacts]
// A job's files lie in <runs>/<job id>/ on several hosts: the coordinator's own (each
// attempt's epochs.csv, summary.json and output.log), the host of the job's rank 0 (its
// run folder: the model, epochs.csv, steps.jsonl, curves, TensorBoard events,
// predictions, reports) and every host of its ranks (their checkpoints). `--runs` need
// not be shared, so the coordinator asks: `jobctl artifacts JOB` makes it list its own
// folder and send ListFiles to one live agent on each other host the job's attempts
// ran on; the agents answer with FileList, and once every host answered, or after
// kFileQuerySeconds, the client gets every file with its size and host, and the hosts
// that could not be asked or did not answer. `jobctl fetch JOB PATH` reads one file in
// chunks of kFetchChunkBytes by offset (ReadFileChunk to an agent on its host, answered
// with FileChunk), so a fetch that broke off resumes where it stopped.
//
// Both are for the job's owner or an admin (Note [Client keys name users]). Every path
// is beneath <runs>/<job id>: a path with an empty, "." or ".." part is refused, and
// neither side follows a symlink or reads anything but a regular file (Note [Files a
// job wrote]). An agent answers only for a job's folder (the first part of `relative`
// is a job id). The reply to the client is deferred: the loop keeps the question and
// answers it when the agents have, so a slow or lost host never stalls the loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "trainyard.pb.h"

namespace trainyard {

inline constexpr double kFileQuerySeconds = 2.0;             // within jobctl's default --timeout (2.5 s)
inline constexpr size_t kFetchChunkBytes = size_t(1) << 20;  // of one FetchReply
inline constexpr size_t kMaxListedFiles = 10000;             // per host
inline constexpr int kMaxListedDepth = 16;
inline constexpr size_t kMaxFileQueries = 256;  // questions waiting on agents at once

// A question waiting on agents.
struct FileQuery {
  std::string client;  // the asker's socket identity
  int64_t job = 0;
  bool fetch = false;
  double deadline = 0;            // steady seconds
  std::set<std::string> waiting;  // hosts not heard from
  wire::ArtifactsReply listing;   // a listing: what has come so far
};

// Whether `path` is a plain path beneath a folder: parts separated by '/', none of them
// empty, "." or "..", and no NUL.
bool PlainRelativePath(const std::string& path);

// Adds `files` (paths beneath the job's folder) as `host`'s to `reply`.
void AddListing(const std::string& host, const google::protobuf::RepeatedPtrField<wire::Artifact>& files,
                wire::ArtifactsReply* reply);

// Sorts a finished listing by host, then path.
void SortListing(wire::ArtifactsReply* reply);

}  // namespace trainyard
