// The Slurm half of the coordinator (--slurm): each attempt is one Slurm batch job.
// See Note [Attempts as Slurm jobs] in slurm.h for the protocol.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "common/curve/curve_keys.h"
#include "coordinator/server.h"

namespace trainyard {

// Every due job goes to Slurm at once: Slurm, not the coordinator, decides when and
// where each runs (priority and backfill included).
void Server::ScheduleOnSlurm(double now) {
  for (const JobRecord& job : store_->JobsIn(JobState::kQueued))
    if (job.not_before <= now && !slurm_tokens_.count(job.id)) SubmitToSlurm(job, now);
}

void Server::SubmitToSlurm(const JobRecord& job, double now) {
  if (!MakeAttemptFolder(job, now)) return;
  SlurmSubmission s;
  s.job = job.id;
  s.attempt = job.attempts + 1;
  s.name = job.name;
  s.ranks = job.ranks;
  s.gpus = job.device == "cuda";
  s.folder = AttemptDir(job.id, s.attempt);
  WriteJobFile(s.folder, "job.sbatch", SbatchScript(options_.slurm, s), job.id);
  const std::string token = NewSecretToken();
  slurm_tokens_[job.id] = token;
  slurm_->Submit(s, s.folder + "/job.sbatch", token);
}

void Server::TakeSlurmSubmissions(double now) {
  for (const SlurmClient::Submitted& done : slurm_->TakeSubmitted()) {
    const auto token = slurm_tokens_.find(done.job);
    if (token == slurm_tokens_.end()) continue;
    const std::string world_token = token->second;
    slurm_tokens_.erase(token);
    const auto job = store_->Find(done.job);
    if (!job || job->state != JobState::kQueued) {  // cancelled while sbatch ran
      if (!done.slurm_job.empty()) slurm_->Cancel(done.slurm_job);
      continue;
    }
    if (done.slurm_job.empty()) {
      // sbatch refused it (more tasks than the partition has, a bad account): asking
      // again cannot help. The job fails with what Slurm said.
      const std::string reason = "Slurm did not accept the job: " + done.error;
      StateStore::Transaction transaction(*store_);
      store_->SetState(done.job, JobState::kFailed, reason, now);
      store_->AddEvent(done.job, reason, now);
      transaction.Commit();
      spdlog::error("job {} failed: {}", done.job, reason);
      continue;
    }
    // The Slurm job's rank 0 registers as this world, with this token (Note [Worlds
    // cannot be squatted]), bound here unless its rank 0 was quicker. Under --slurm no
    // one else can bind a slurm-<id> world (ExpectedSlurmWorld); one bound to another
    // token before (by a pool agent of a coordinator without --slurm) makes this Slurm
    // job unusable: it is given up and the job submitted again, under a new id, after a
    // backoff, with an event.
    const std::string world = SlurmWorld(done.slurm_job);
    if (ranks_->BoundElsewhere(world, world_token)) {
      GiveUpSquattedSlurmJob(*job, done.slurm_job, now);
      continue;
    }
    ranks_->Bind(world, world_token, now);  // unless its rank 0 bound it already
    RunningAttempt& attempt = OpenAttempt(*job, {{world, 0}}, "submitted to Slurm as job " + done.slurm_job, now);
    attempt.slurm_job = done.slurm_job;
    const RankEntry* rank = ranks_->Find({world, 0});
    if (rank && rank->job == 0) AssignSlurmLead({world, 0});  // it was quicker
  }
}

void Server::GiveUpSquattedSlurmJob(const JobRecord& job, const std::string& slurm_job, double now) {
  const double backoff = std::max(10.0, options_.restart_backoff_s);
  const std::string what = "the world of Slurm job " + slurm_job +
                           " was registered before the job was submitted; it is cancelled and the job submitted "
                           "again in " +
                           std::to_string(static_cast<int>(backoff)) + " s";
  ranks_->NoteSquat(what, now);
  spdlog::warn("job {}: {}", job.id, what);
  StateStore::Transaction transaction(*store_);
  store_->Requeue(job.id, what, now + backoff);
  store_->AddEvent(job.id, what, now);
  transaction.Commit();
  slurm_->Cancel(slurm_job);
  ranks_->Remove({SlurmWorld(slurm_job), 0});
}

// A "slurm-<id>" world is the coordinator's own: bound already to this token (a rank
// re-registering, after a restart too), or the world token of an sbatch in flight (a
// rank 0 quicker than sbatch's answer). Any other registration as one is a squat.
bool Server::ExpectedSlurmWorld(const std::string& world, const std::string& token) const {
  if (ranks_->IsBound(world)) return !ranks_->BoundElsewhere(world, token);
  for (const auto& [job, pending] : slurm_tokens_)
    if (pending == token) return true;
  return false;
}

// Once the Slurm job's rank 0 has registered (idle), it gets the Assign; from then on
// the attempt runs as a pool attempt whose one slot leads all the ranks srun started.
void Server::AssignSlurmLead(const RankKey& key) {
  RunningAttempt* attempt = AttemptAwaiting(key);
  if (!attempt || attempt->slots.front() != key || attempt->slurm_job.empty()) return;
  const auto job = store_->Find(attempt->job);
  if (!job) return;
  attempt->adopted = true;  // after a coordinator restart, a rank that had not started yet
  NoteSlurmStart(attempt);
  SendAssign(*job, *attempt, key);
}

// squeue's view of each running attempt's Slurm job: state changes become events, and
// a Slurm job that ended while its attempt awaits a result fails the attempt with
// Slurm's words (a result that came first has already ended it).
void Server::FollowSlurmJobs() {
  std::set<std::string> watched;
  for (const auto& [id, attempt] : running_)
    if (!attempt.slurm_job.empty()) watched.insert(attempt.slurm_job);
  slurm_->Watch(watched);
  const std::map<std::string, SlurmJobState> states = slurm_->States();
  std::vector<std::tuple<int64_t, std::string, Retry>> ended;
  for (auto& [id, attempt] : running_) {
    const auto it = states.find(attempt.slurm_job);
    if (attempt.slurm_job.empty() || it == states.end()) continue;
    const SlurmJobState& now = it->second;
    if (now.state != attempt.slurm_state.state || now.reason != attempt.slurm_state.reason) {
      store_->AddEvent(
          id, "attempt " + std::to_string(attempt.attempt) + ": Slurm job " + attempt.slurm_job + " " + now.Describe(),
          Now());
      attempt.slurm_state = now;
    }
    if (now.started()) NoteSlurmStart(&attempt);
    if (!now.ended()) {
      // Its ranks have said how it ended: a Slurm job that lingers (a step stuck on an
      // unreachable node) is ended for them.
      if (attempt.reported != wire::OUTCOME_UNSPECIFIED && !attempt.cancel_sent &&
          listening_.Now() - attempt.reported_at > options_.grace_s) {
        attempt.cancel_sent = true;
        slurm_->Cancel(attempt.slurm_job);
      }
      continue;
    }
    const std::string slurm_job = "its Slurm job " + attempt.slurm_job + " ended " + now.Describe();
    const std::string& said = attempt.reported_reason;
    if (now.state == "CANCELLED" && !attempt.cancel_sent)  // an scancel from outside (SIGTERM, as a preemption sends)
      ended.emplace_back(id, slurm_job + ", cancelled outside the coordinator" + (said.empty() ? "" : "; " + said),
                         Retry::kCounted);
    else if (attempt.reported == wire::OUTCOME_PREEMPTED)  // a time limit ahead, or Slurm's preemption
      ended.emplace_back(id, said + " (" + slurm_job + ")", Retry::kFree);
    else if (attempt.reported == wire::OUTCOME_BAD_INPUT)
      ended.emplace_back(id, said, Retry::kNever);
    else
      ended.emplace_back(id, slurm_job + (said.empty() ? " before the job's rank 0 reported a result" : "; " + said),
                         Retry::kCounted);
  }
  for (const auto& [id, reason, retry] : ended) FailAttempt(id, reason, retry);
}

// The first sign that Slurm started the attempt's job: squeue's state, or its rank 0's
// registration, whichever the coordinator sees first.
void Server::NoteSlurmStart(RunningAttempt* attempt) {
  if (attempt->slurm_started) return;
  attempt->slurm_started = true;
  attempt->started_listening = listening_.Now();  // the start grace counts from here
  if (const auto job = store_->Find(attempt->job))
    store_->StartUsage(job->id, attempt->attempt, Now(), job->ranks, job->device == "cuda" ? job->ranks : 0);
}

}  // namespace trainyard
