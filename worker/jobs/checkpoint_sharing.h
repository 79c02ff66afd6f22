// Checkpoints without a shared filesystem.
//
// Note [Node-local checkpoints]
// Every rank holds the whole model and optimizer state, so any host can keep a
// checkpoint. The ranks settle, once per run, who writes:
//   1. Rank 0 writes a random token to <run>/checkpoints/.shared-probe. The first rank
//      of every other host reads that path on its own disk: where it finds the token,
//      the host sees rank 0's folder (shared storage) and rank 0 writes for it; where
//      it does not, that rank writes its host's checkpoints. So a shared --runs path is
//      written once, and a host of its own keeps a full copy.
//   2. On resume (checkpoint.resume: auto), each rank finds the newest checkpoint that
//      loads in the folder it sees (Note [Resume] 2), and the ranks gather their steps.
//      The newest step any rank holds is the resume point. If some rank lacks it, the
//      lowest rank that holds it broadcasts the file's bytes; for every folder that
//      lacks it, its writer stores the file (atomically, as any checkpoint), and the
//      ranks that lacked it load it from there, checksum and all. A job restarted on
//      a different set of hosts, even without rank 0's old host, thus resumes exactly.
//   3. If no rank holds a valid checkpoint while some rejected one, the job stops with
//      exit 2 on every rank alike and deletes nothing.
// A host that missed a fresh start (checkpoint.resume: none) keeps the older run's
// files; it rejoins a later resume only if they are newer than everything else, so a
// run folder reused across unrelated runs should be cleared on every host.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace trainyard {

struct CheckpointWriters {
  bool mine = false;                                     // this rank writes the checkpoints of the folder it sees
  std::vector<int> writer_of;                            // by rank: the rank that writes the folder that rank sees
  std::vector<int> writers;                              // the writing ranks, ascending
  std::string Describe(const Communicator& comm) const;  // for the log: "h1:0, h2:2"
};

// Collective. `dir` is the run's checkpoints folder; rank 0 makes it.
CheckpointWriters DecideCheckpointWriters(Communicator& comm, const std::string& dir);

// What each rank found on its own (ResolveResume): the step of the checkpoint it
// loaded, or -1, and whether it rejected any.
struct LocalResume {
  int64_t step = -1;
  bool rejected_any = false;
};

// What the ranks settled on (Note [Node-local checkpoints] 2 and 3).
struct SharedResume {
  int64_t step = -1;                // the resume point: the newest step any rank holds; -1: none
  std::optional<std::string> load;  // the file this rank must load: it lacked that step
  bool only_rejected = false;       // no rank holds a valid checkpoint, and some rank rejected one
};

// Collective. `dir` is the run's checkpoints folder as this rank sees it.
SharedResume ShareNewestCheckpoint(Communicator& comm, const CheckpointWriters& writers, const std::string& dir,
                                   const LocalResume& mine);

}  // namespace trainyard
