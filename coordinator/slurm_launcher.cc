// The Slurm launcher (--slurm): each attempt is one Slurm batch job. See Note [Attempts
// as Slurm jobs] in slurm.h for the protocol.
#include "coordinator/slurm_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "common/curve/curve_keys.h"

namespace trainyard {

SlurmLauncher::SlurmLauncher(const SlurmOptions& options, Timing timing, Sources sources)
    : options_(options), timing_(timing), sources_(sources), client_(std::make_unique<SlurmClient>(options)) {}

SlurmLauncher::~SlurmLauncher() = default;

void SlurmLauncher::Schedule(double now) {
  for (const JobRecord& job : sources_.store.JobsIn(JobState::kQueued))
    if (job.not_before <= now && !tokens_.count(job.id)) Submit(job, now);
}

void SlurmLauncher::Submit(const JobRecord& job, double now) {
  if (!sources_.loop.MakeAttemptFolder(job, now)) return;
  SlurmSubmission s;
  s.job = job.id;
  s.attempt = job.attempts + 1;
  s.name = job.name;
  s.ranks = job.ranks;
  s.gpus = job.device == "cuda";
  s.folder = sources_.loop.AttemptDir(job.id, s.attempt);
  sources_.loop.WriteAttemptFile(job.id, s.attempt, "job.sbatch", SbatchScript(options_, s));
  const std::string token = NewSecretToken();
  tokens_[job.id] = token;
  client_->Submit(s, s.folder + "/job.sbatch", token);
}

void SlurmLauncher::Follow(double now) {
  TakeSubmissions(now);
  FollowJobs();
}

void SlurmLauncher::TakeSubmissions(double now) {
  for (const SlurmClient::Submitted& done : client_->TakeSubmitted()) {
    const auto token = tokens_.find(done.job);
    if (token == tokens_.end()) continue;
    const std::string world_token = token->second;
    tokens_.erase(token);
    const auto job = sources_.store.Find(done.job);
    if (!job || job->state != JobState::kQueued) {  // cancelled while sbatch ran
      if (!done.slurm_job.empty()) client_->Cancel(done.slurm_job);
      continue;
    }
    if (done.slurm_job.empty()) {
      // sbatch refused it (more tasks than the partition has, a bad account): asking
      // again cannot help. The job fails with what Slurm said.
      const std::string reason = "Slurm did not accept the job: " + done.error;
      StateStore::Transaction transaction(sources_.store);
      sources_.store.SetState(done.job, JobState::kFailed, reason, now);
      sources_.store.AddEvent(done.job, reason, now);
      transaction.Commit();
      spdlog::error("job {} failed: {}", done.job, reason);
      continue;
    }
    // The Slurm job's rank 0 registers as this world, with this token (Note [Worlds
    // cannot be squatted]), bound here unless its rank 0 was quicker. Under --slurm no
    // one else can bind a slurm-<id> world (ExpectedWorld); one bound to another token
    // before (by a pool agent of a coordinator without --slurm) makes this Slurm job
    // unusable: it is given up and the job submitted again, under a new id, after a
    // backoff, with an event.
    const std::string world = SlurmWorld(done.slurm_job);
    if (sources_.ranks.BoundElsewhere(world, world_token)) {
      GiveUpSquattedJob(*job, done.slurm_job, now);
      continue;
    }
    sources_.ranks.Bind(world, world_token, now);  // unless its rank 0 bound it already
    RunningAttempt& attempt =
        sources_.loop.OpenAttempt(*job, {{world, 0}}, "submitted to Slurm as job " + done.slurm_job, now);
    attempt.slurm_job = done.slurm_job;
    const RankEntry* rank = sources_.ranks.Find({world, 0});
    if (rank && rank->job == 0) RankIdle({world, 0});  // it was quicker
  }
}

void SlurmLauncher::GiveUpSquattedJob(const JobRecord& job, const std::string& slurm_job, double now) {
  const double backoff = std::max(10.0, timing_.restart_backoff_s);
  const std::string what = "the world of Slurm job " + slurm_job +
                           " was registered before the job was submitted; it is cancelled and the job submitted "
                           "again in " +
                           std::to_string(static_cast<int>(backoff)) + " s";
  sources_.ranks.NoteSquat(what, now);
  spdlog::warn("job {}: {}", job.id, what);
  StateStore::Transaction transaction(sources_.store);
  sources_.store.Requeue(job.id, what, now + backoff);
  sources_.store.AddEvent(job.id, what, now);
  transaction.Commit();
  client_->Cancel(slurm_job);
  sources_.ranks.Remove({SlurmWorld(slurm_job), 0});
}

std::string SlurmLauncher::RegistrationRefusal(const RankKey& key, const std::string& world_token) const {
  if (SlurmJobOfWorld(key.first).empty() || ExpectedWorld(key.first, world_token)) return "";
  return ": under --slurm a slurm-<id> world is one of the coordinator's own Slurm jobs, and no submission of it "
         "carries this world token";
}

// A "slurm-<id>" world is the coordinator's own: bound already to this token (a rank
// re-registering, after a restart too), or the world token of an sbatch in flight (a
// rank 0 quicker than sbatch's answer). Any other registration as one is a squat.
bool SlurmLauncher::ExpectedWorld(const std::string& world, const std::string& token) const {
  if (sources_.ranks.IsBound(world)) return !sources_.ranks.BoundElsewhere(world, token);
  for (const auto& [job, pending] : tokens_)
    if (pending == token) return true;
  return false;
}

// Once the Slurm job's rank 0 has registered (idle), it gets the Assign; from then on
// the attempt runs as a pool attempt whose one slot leads all the ranks srun started.
void SlurmLauncher::RankIdle(const RankKey& key) {
  RunningAttempt* attempt = sources_.running.Awaiting(key);
  if (!attempt || attempt->slots.front() != key || attempt->slurm_job.empty()) return;
  const auto job = sources_.store.Find(attempt->job);
  if (!job) return;
  attempt->adopted = true;  // after a coordinator restart, a rank that had not started yet
  NoteStart(attempt);
  sources_.loop.SendAssign(*job, *attempt, key);
}

bool SlurmLauncher::Started(const RunningAttempt& attempt) const {
  return attempt.slurm_job.empty() || attempt.slurm_started;
}

bool SlurmLauncher::DefersEnd(RunningAttempt* attempt, const RankKey& from, wire::Outcome end,
                              const std::string& reason) {
  if (attempt->slurm_job.empty()) return false;
  attempt->finished.insert(from);
  attempt->reported = end;
  attempt->reported_reason = reason;
  attempt->reported_at = sources_.listening.Now();
  return true;
}

void SlurmLauncher::Ended(const RunningAttempt& attempt, wire::Outcome outcome) {
  if (!attempt.slurm_job.empty() && outcome != wire::OUTCOME_SUCCEEDED)
    client_->Cancel(attempt.slurm_job);  // its allocation, if any is left
}

SlurmAttemptEnd EndOfSlurmAttempt(const RunningAttempt& attempt, const SlurmJobState& slurm) {
  const std::string ended = "its Slurm job " + attempt.slurm_job + " ended " + slurm.Describe();
  const std::string& said = attempt.reported_reason;
  if (slurm.state == "CANCELLED" && !attempt.cancel_sent)  // an scancel from outside (SIGTERM, as a preemption sends)
    return {ended + ", cancelled outside the coordinator" + (said.empty() ? "" : "; " + said), Retry::kCounted};
  if (attempt.reported == wire::OUTCOME_PREEMPTED)  // a time limit ahead, or Slurm's preemption
    return {said + " (" + ended + ")", Retry::kFree};
  if (attempt.reported == wire::OUTCOME_BAD_INPUT) return {said, Retry::kNever};
  return {ended + (said.empty() ? " before the job's rank 0 reported a result" : "; " + said), Retry::kCounted};
}

// squeue's view of each running attempt's Slurm job: state changes become events, and
// a Slurm job that ended while its attempt awaits a result fails the attempt with
// Slurm's words (a result that came first has already ended it).
void SlurmLauncher::FollowJobs() {
  std::set<std::string> watched;
  for (const auto& [id, attempt] : sources_.running)
    if (!attempt.slurm_job.empty()) watched.insert(attempt.slurm_job);
  client_->Watch(watched);
  const std::map<std::string, SlurmJobState> states = client_->States();
  std::vector<std::pair<int64_t, SlurmAttemptEnd>> ended;
  for (auto& [id, attempt] : sources_.running) {
    const auto it = states.find(attempt.slurm_job);
    if (attempt.slurm_job.empty() || it == states.end()) continue;
    const SlurmJobState& now = it->second;
    if (now.state != attempt.slurm_state.state || now.reason != attempt.slurm_state.reason) {
      sources_.store.AddEvent(
          id, "attempt " + std::to_string(attempt.attempt) + ": Slurm job " + attempt.slurm_job + " " + now.Describe(),
          sources_.loop.Now());
      attempt.slurm_state = now;
    }
    if (now.started()) NoteStart(&attempt);
    if (now.ended()) {
      ended.emplace_back(id, EndOfSlurmAttempt(attempt, now));
    } else if (attempt.reported != wire::OUTCOME_UNSPECIFIED && !attempt.cancel_sent &&
               sources_.listening.Now() - attempt.reported_at > timing_.grace_s) {
      // Its ranks have said how it ended: a Slurm job that lingers (a step stuck on an
      // unreachable node) is ended for them.
      attempt.cancel_sent = true;
      client_->Cancel(attempt.slurm_job);
    }
  }
  for (const auto& [id, end] : ended) sources_.loop.FailAttempt(id, end.reason, end.retry);
}

// The first sign that Slurm started the attempt's job: squeue's state, or its rank 0's
// registration, whichever the coordinator sees first.
void SlurmLauncher::NoteStart(RunningAttempt* attempt) {
  if (attempt->slurm_started) return;
  attempt->slurm_started = true;
  attempt->started_listening = sources_.listening.Now();  // the start grace counts from here
  if (const auto job = sources_.store.Find(attempt->job))
    sources_.store.StartUsage(job->id, attempt->attempt, sources_.loop.Now(), job->ranks,
                              job->device == "cuda" ? job->ranks : 0);
}

}  // namespace trainyard
