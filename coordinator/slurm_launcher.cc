// The Slurm launcher (--slurm): each attempt is one Slurm batch job. See Note [Attempts
// as Slurm jobs] in slurm.h for the protocol.
#include "coordinator/slurm_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "common/curve/curve_keys.h"

namespace trainyard {

SlurmLauncher::SlurmLauncher(const SlurmOptions& options, Timing timing, Sources sources)
    : options_(options), timing_(timing), sources_(sources), client_(std::make_unique<SlurmClient>(options)) {}

SlurmLauncher::~SlurmLauncher() = default;

namespace {

// A replica whose Slurm job has not started yet: its start grace has not begun.
constexpr double kNotStarted = std::numeric_limits<double>::infinity();

}  // namespace

void SlurmLauncher::Schedule(double now) {
  for (const JobRecord& job : sources_.store.JobsIn(JobState::kQueued)) {
    if (job.not_before > now || InFlight(job.id)) continue;
    if (const std::optional<ElasticOptions> elastic = sources_.store.ElasticOptionsOf(job.id)) {
      SubmitFirstReplicas(job, elastic->max_replicas, now);
    } else if (sources_.loop.MakeAttemptFolder(job, now)) {
      Submit(job, job.attempts + 1, -1, job.ranks);
    }
  }
  ReplaceLostReplicas(now);
}

bool SlurmLauncher::InFlight(int64_t job) const {
  const auto it = tokens_.lower_bound({job, std::numeric_limits<int>::min()});
  return first_replicas_.count(job) || (it != tokens_.end() && it->first.first == job);
}

void SlurmLauncher::Submit(const JobRecord& job, int attempt, int replica, int ranks) {
  SlurmSubmission s;
  s.job = job.id;
  s.attempt = attempt;
  s.name = job.name;
  s.ranks = ranks;
  s.gpus = job.device == "cuda";
  s.folder = sources_.loop.AttemptDir(job.id, s.attempt);
  s.replica = replica;
  const std::string script = replica >= 0 ? "job.replica-" + std::to_string(replica) + ".sbatch" : "job.sbatch";
  sources_.loop.WriteAttemptFile(job.id, s.attempt, script, SbatchScript(options_, s));
  const std::string token = NewSecretToken();
  tokens_[{job.id, replica}] = token;
  client_->Submit(s, s.folder + "/" + script, token);
}

void SlurmLauncher::SubmitFirstReplicas(const JobRecord& job, int replicas, double now) {
  if (!sources_.loop.MakeAttemptFolder(job, now)) return;
  first_replicas_[job.id].assign(static_cast<size_t>(replicas), {});
  for (int replica = 0; replica < replicas; ++replica) Submit(job, job.attempts + 1, replica, job.ranks / replicas);
}

void SlurmLauncher::Follow(double now) {
  TakeSubmissions(now);
  FollowJobs();
}

void SlurmLauncher::TakeSubmissions(double now) {
  for (const SlurmClient::Submitted& done : client_->TakeSubmitted()) {
    const auto token = tokens_.find({done.job, done.replica});
    if (token == tokens_.end()) continue;
    const std::string world_token = token->second;
    tokens_.erase(token);
    if (done.replica < 0)
      TakeAttemptSubmission(done, world_token, now);
    else if (first_replicas_.count(done.job))
      TakeFirstReplica(done, world_token, now);
    else
      TakeReplacement(done, world_token, now);
  }
}

void SlurmLauncher::FailUnaccepted(int64_t job, const std::string& error, double now) {
  // sbatch refused it (more tasks than the partition has, a bad account): asking again
  // cannot help. The job fails with what Slurm said.
  const std::string reason = "Slurm did not accept the job: " + error;
  StateStore::Transaction transaction(sources_.store);
  sources_.store.SetState(job, JobState::kFailed, reason, now);
  sources_.store.AddEvent(job, reason, now);
  transaction.Commit();
  spdlog::error("job {} failed: {}", job, reason);
}

void SlurmLauncher::TakeAttemptSubmission(const SlurmClient::Submitted& done, const std::string& world_token,
                                          double now) {
  const auto job = sources_.store.Find(done.job);
  if (!job || job->state != JobState::kQueued) {  // cancelled while sbatch ran
    if (!done.slurm_job.empty()) client_->Cancel(done.slurm_job);
    return;
  }
  if (done.slurm_job.empty()) return FailUnaccepted(done.job, done.error, now);
  // The Slurm job's rank 0 registers as this world, with this token (Note [Worlds
  // cannot be squatted]), bound here unless its rank 0 was quicker. Under --slurm no
  // one else can bind a slurm-<id> world (ExpectedWorld); one bound to another token
  // before (by a pool agent of a coordinator without --slurm) makes this Slurm job
  // unusable: it is given up and the job submitted again, under a new id, after a
  // backoff, with an event.
  const std::string world = SlurmWorld(done.slurm_job);
  if (sources_.ranks.BoundElsewhere(world, world_token))
    return GiveUpSquattedJob(*job, done.slurm_job, {done.slurm_job}, now);
  sources_.ranks.Bind(world, world_token, now);  // unless its rank 0 bound it already
  RunningAttempt& attempt =
      sources_.loop.OpenAttempt(*job, {{world, 0}}, "submitted to Slurm as job " + done.slurm_job, now);
  attempt.slurm_job = done.slurm_job;
  const RankEntry* rank = sources_.ranks.Find({world, 0});
  if (rank && rank->job == 0) RankIdle({world, 0});  // it was quicker
}

void SlurmLauncher::TakeFirstReplica(const SlurmClient::Submitted& done, const std::string& world_token, double now) {
  std::vector<FirstReplica>& replicas = first_replicas_[done.job];
  if (done.replica >= static_cast<int>(replicas.size())) return;
  replicas[static_cast<size_t>(done.replica)] = {true, done.slurm_job, world_token, done.error};
  for (const FirstReplica& replica : replicas)
    if (!replica.answered) return;
  const std::vector<FirstReplica> answered = std::move(replicas);
  first_replicas_.erase(done.job);
  OpenElasticAttempt(done.job, answered, now);
}

// Every first replica's sbatch has answered: the attempt opens with one slot per Slurm
// job, unless one was refused (the job fails) or squatted (all are given up).
void SlurmLauncher::OpenElasticAttempt(int64_t job_id, const std::vector<FirstReplica>& replicas, double now) {
  std::vector<std::string> slurm_jobs;
  for (const FirstReplica& replica : replicas)
    if (!replica.slurm_job.empty()) slurm_jobs.push_back(replica.slurm_job);
  const auto cancel_all = [&] {
    for (const std::string& slurm_job : slurm_jobs) client_->Cancel(slurm_job);
  };
  const auto job = sources_.store.Find(job_id);
  if (!job || job->state != JobState::kQueued) return cancel_all();  // cancelled while sbatch ran
  for (size_t i = 0; i < replicas.size(); ++i)
    if (replicas[i].slurm_job.empty()) {
      cancel_all();
      return FailUnaccepted(job_id, "replica " + std::to_string(i) + ": " + replicas[i].error, now);
    }
  for (const FirstReplica& replica : replicas)
    if (sources_.ranks.BoundElsewhere(SlurmWorld(replica.slurm_job), replica.token))
      return GiveUpSquattedJob(*job, replica.slurm_job, slurm_jobs, now);
  std::vector<RankKey> slots;
  for (const FirstReplica& replica : replicas) {
    sources_.ranks.Bind(SlurmWorld(replica.slurm_job), replica.token, now);
    slots.emplace_back(SlurmWorld(replica.slurm_job), 0);
  }
  std::string named;
  for (size_t i = 0; i < slurm_jobs.size(); ++i)
    named += (i == 0 ? "" : i + 1 == slurm_jobs.size() ? " and " : ", ") + slurm_jobs[i];
  RunningAttempt& attempt =
      sources_.loop.OpenAttempt(*job, slots, "submitted to Slurm as jobs " + named + ", one for each replica", now);
  attempt.slurm_job = slurm_jobs.front();
  for (const RankKey& slot : slots) {
    attempt.replica_assigned[slot] = kNotStarted;
    const RankEntry* rank = sources_.ranks.Find(slot);
    if (rank && rank->job == 0) RankIdle(slot);  // it was quicker
  }
}

void SlurmLauncher::ReplaceLostReplicas(double now) {
  for (auto& [id, attempt] : sources_.running) {
    if (attempt.slurm_job.empty() || !TakesReplacements(attempt) || attempt.cancel_sent || InFlight(id)) continue;
    int failures = 0;
    double last = 0;
    for (const auto& [slot, failed] : attempt.slot_failures) {
      failures += failed.count;
      last = std::max(last, failed.at);
    }
    const auto refused = replacement_not_before_.find(id);
    if (now - last < ReplacementBackoffS(failures) ||
        (refused != replacement_not_before_.end() && now < refused->second))
      continue;
    if (const auto job = sources_.store.Find(id))
      Submit(*job, attempt.attempt, attempt.replicas_started, job->ranks / std::max(1, attempt.max_replicas));
  }
}

void SlurmLauncher::TakeReplacement(const SlurmClient::Submitted& done, const std::string& world_token, double now) {
  constexpr double kRefusedBackoffS = 30;
  RunningAttempt* attempt = sources_.running.Find(done.job);
  if (!attempt || attempt->attempt != done.attempt || !TakesReplacements(*attempt) ||
      done.replica != attempt->replicas_started) {  // it ended, or has its replicas again
    if (!done.slurm_job.empty()) client_->Cancel(done.slurm_job);
    return;
  }
  if (done.slurm_job.empty()) {
    replacement_not_before_[done.job] = now + kRefusedBackoffS;
    sources_.store.AddEvent(done.job,
                            "replica " + std::to_string(done.replica) + ": Slurm did not accept its job (" +
                                done.error + "); asking again in " +
                                std::to_string(static_cast<int>(kRefusedBackoffS)) + " s",
                            now);
    return;
  }
  const std::string world = SlurmWorld(done.slurm_job);
  if (sources_.ranks.BoundElsewhere(world, world_token)) {  // submitted again next pass
    sources_.ranks.NoteSquat("the world of Slurm job " + done.slurm_job + " was registered before it was submitted",
                             now);
    client_->Cancel(done.slurm_job);
    sources_.ranks.Remove({world, 0});
    return;
  }
  replacement_not_before_.erase(done.job);
  sources_.ranks.Bind(world, world_token, now);
  const RankKey slot{world, 0};
  sources_.loop.AddReplica(*attempt, slot, now);  // its Assign now if its rank 0 was quicker
  const RankEntry* rank = sources_.ranks.Find(slot);
  if (rank && rank->job == done.job)
    NoteReplicaStart(attempt, slot);
  else
    attempt->replica_assigned[slot] = kNotStarted;
}

void SlurmLauncher::GiveUpSquattedJob(const JobRecord& job, const std::string& squatted,
                                      const std::vector<std::string>& slurm_jobs, double now) {
  const double backoff = std::max(10.0, timing_.restart_backoff_s);
  const std::string what = "the world of Slurm job " + squatted +
                           " was registered before the job was submitted; it is cancelled and the job submitted "
                           "again in " +
                           std::to_string(static_cast<int>(backoff)) + " s";
  sources_.ranks.NoteSquat(what, now);
  spdlog::warn("job {}: {}", job.id, what);
  StateStore::Transaction transaction(sources_.store);
  sources_.store.Requeue(job.id, what, now + backoff);
  sources_.store.AddEvent(job.id, what, now);
  transaction.Commit();
  for (const std::string& slurm_job : slurm_jobs) {
    client_->Cancel(slurm_job);
    sources_.ranks.Remove({SlurmWorld(slurm_job), 0});
  }
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
// Each replica of an elastic attempt is such a slot of its own.
void SlurmLauncher::RankIdle(const RankKey& key) {
  RunningAttempt* attempt = sources_.running.Awaiting(key);
  if (!attempt || attempt->slurm_job.empty() || (!attempt->elastic && attempt->slots.front() != key)) return;
  const auto job = sources_.store.Find(attempt->job);
  if (!job) return;
  if (!attempt->elastic) attempt->adopted = true;  // after a coordinator restart, a rank that had not started yet
  NoteStart(attempt);
  if (attempt->elastic) NoteReplicaStart(attempt, key);
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

void SlurmLauncher::ReplicaEnded(const RunningAttempt& attempt, const RankKey& slot, wire::Outcome end) {
  const std::string slurm_job = SlurmJobOfWorld(slot.first);
  if (!attempt.slurm_job.empty() && !slurm_job.empty() && end != wire::OUTCOME_SUCCEEDED)
    client_->Cancel(slurm_job);  // a replica cut off from the coordinator may still run
}

void SlurmLauncher::Ended(const RunningAttempt& attempt, wire::Outcome outcome) {
  replacement_not_before_.erase(attempt.job);
  if (attempt.slurm_job.empty() || outcome == wire::OUTCOME_SUCCEEDED) return;
  if (!attempt.elastic) return client_->Cancel(attempt.slurm_job);  // its allocation, if any is left
  for (const RankKey& slot : attempt.slots)
    if (!attempt.finished.count(slot)) client_->Cancel(SlurmJobOfWorld(slot.first));
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
// Slurm's words (a result that came first has already ended it). An elastic attempt's
// replicas are followed each on its own.
void SlurmLauncher::FollowJobs() {
  std::set<std::string> watched;
  for (const auto& [id, attempt] : sources_.running) {
    if (attempt.slurm_job.empty()) continue;
    if (!attempt.elastic) watched.insert(attempt.slurm_job);
    for (const RankKey& slot : attempt.slots)
      if (attempt.elastic && !attempt.finished.count(slot)) watched.insert(SlurmJobOfWorld(slot.first));
  }
  client_->Watch(watched);
  const std::map<std::string, SlurmJobState> states = client_->States();
  std::vector<std::pair<int64_t, SlurmAttemptEnd>> ended;
  std::vector<std::tuple<int64_t, RankKey, std::string>> lost;
  for (auto& [id, attempt] : sources_.running) {
    if (attempt.elastic && !attempt.slurm_job.empty()) FollowReplicas(attempt, states, &lost);
    const auto it = states.find(attempt.slurm_job);
    if (attempt.slurm_job.empty() || attempt.elastic || it == states.end()) continue;
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
  for (const auto& [id, slot, reason] : lost)
    if (RunningAttempt* attempt = sources_.running.Find(id)) sources_.loop.ReplicaLost(*attempt, slot, reason);
}

void SlurmLauncher::FollowReplicas(RunningAttempt& attempt, const std::map<std::string, SlurmJobState>& states,
                                   std::vector<std::tuple<int64_t, RankKey, std::string>>* lost) {
  for (const RankKey& slot : attempt.slots) {
    const std::string slurm_job = SlurmJobOfWorld(slot.first);
    const auto it = states.find(slurm_job);
    if (attempt.finished.count(slot) || it == states.end()) continue;
    const SlurmJobState& now = it->second;
    SlurmJobState& was = attempt.replica_slurm_states[slot];
    if (now.state != was.state || now.reason != was.reason) {
      sources_.store.AddEvent(attempt.job,
                              "attempt " + std::to_string(attempt.attempt) + ": replica " +
                                  std::to_string(ReplicaNumber(attempt, slot)) + "'s Slurm job " + slurm_job + " " +
                                  now.Describe(),
                              sources_.loop.Now());
      was = now;
    }
    if (slot == attempt.slots.front()) attempt.slurm_state = now;
    if (now.started()) {
      NoteStart(&attempt);
      NoteReplicaStart(&attempt, slot);
    }
    if (now.ended())
      lost->emplace_back(attempt.job, slot,
                         "its Slurm job " + slurm_job + " ended " + now.Describe() + " before the replica reported");
  }
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

void SlurmLauncher::NoteReplicaStart(RunningAttempt* attempt, const RankKey& slot) {
  const auto assigned = attempt->replica_assigned.find(slot);
  if (assigned != attempt->replica_assigned.end() && assigned->second == kNotStarted)
    assigned->second = sources_.listening.Now();
}

}  // namespace trainyard
