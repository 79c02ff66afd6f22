// The worker-pool half of the coordinator: registry, heartbeats, assignment, epoch
// reports, results and the life cycle of attempts. See server.h for the protocol.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "coordinator/server.h"

namespace trainyard {
namespace {

// Tokens are 32 hex digits (128 bits); anything shorter is refused, so an empty or
// guessable token can never bind a slot.
bool PlausibleToken(const std::string& token) { return token.size() >= 32 && token.size() <= 128; }

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::string WithLastLine(std::string reason, const std::string& last_line) {
  if (!last_line.empty()) reason += "; its last log line: \"" + last_line + "\"";
  return reason;
}

nlohmann::json BreakdownJson(const wire::StepBreakdown& b) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : b.parts())
    parts.push_back({{"name", p.name()}, {"min_ms", p.min_ms()}, {"median_ms", p.median_ms()}, {"max_ms", p.max_ms()}});
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : b.ranks()) ranks.push_back(std::vector<double>(r.ms().begin(), r.ms().end()));
  return {{"parts", parts},
          {"slowest_rank", b.slowest_rank()},
          {"slowest_ms_per_step", b.slowest_ms_per_step()},
          {"ranks", ranks}};
}

// A StopJob for `attempt` of `job` (Note [Stop agreement]; `preempt`: Note [Preemption]).
wire::Envelope StopFor(int64_t job, int attempt, const std::string& reason, bool preempt = false, double grace_s = 0) {
  wire::Envelope e;
  wire::StopJob* stop = e.mutable_stop();
  stop->set_job_id(job);
  stop->set_attempt(attempt);
  stop->set_reason(reason);
  stop->set_preempt(preempt);
  stop->set_grace_s(grace_s);
  return e;
}

wire::Envelope AckFor(int64_t job, int attempt, const std::string& what, int epoch = 0, int world_rank = 0) {
  wire::Envelope e;
  wire::Ack* ack = e.mutable_ack();
  ack->set_job_id(job);
  ack->set_attempt(attempt);
  ack->set_what(what);
  ack->set_epoch(epoch);
  ack->set_world_rank(world_rank);
  return e;
}

}  // namespace

std::string Server::JobRunsDir(int64_t job) const { return options_.runs_dir + "/" + std::to_string(job); }

std::string Server::AttemptDir(int64_t job, int attempt) const {
  return JobRunsDir(job) + "/attempt-" + std::to_string(attempt);
}

void Server::WriteJobFile(const std::string& folder, const std::string& name, const std::string& bytes,
                          int64_t job) const {
  try {
    // Note [Files a job wrote]: no symlink between the runs folder and the file.
    MakeFoldersBeneath(options_.runs_dir, folder.substr(options_.runs_dir.size() + 1));
    WriteFileAtomically(folder + "/" + name, bytes);
  } catch (const std::exception& e) {
    spdlog::error("job {}: cannot write {}/{}: {}", job, folder, name, e.what());
  }
}

void Server::ReloadRunningAttempts() {
  for (const AttemptRecord& open : store_->OpenAttempts()) {
    auto job = store_->Find(open.job);
    RunningAttempt attempt;
    if (!job || job->state != JobState::kRunning || !ParsePlacement(open.placement, &attempt.slots)) {
      StateStore::Transaction transaction(*store_);
      store_->EndAttempt(open.job, open.attempt, wire::OUTCOME_ABANDONED, "not running after a coordinator restart",
                         started_at_);
      transaction.Commit();
      continue;
    }
    attempt.job = open.job;
    attempt.attempt = open.attempt;
    attempt.started_at = open.started_at;
    attempt.started_listening = listening_.Now();
    attempt.adopted = false;
    attempt.priority = job->priority;
    attempt.user = job->user;
    attempt.preemptible = job->preemptible;
    attempt.preempted_by = open.preempted_by;  // its stop was sent; its grace starts again
    attempt.preempt_asked = listening_.Now();
    attempt.slurm_job = SlurmJobOfWorld(attempt.slots.front().first);
    if (job->estimate_s > 0) attempt.estimated_end = open.started_at + job->estimate_s;
    if (const auto trial = store_->TrialOfJob(open.job)) attempt.search_stop_at = trial->stopped_at;
    OpenQuorumIfElastic(&attempt);
    running_.Add(attempt);
    spdlog::info("job {} attempt {} was running on {}: waiting up to {} s for its ranks", open.job, open.attempt,
                 open.placement, options_.grace_s);
  }
}

// Jobs RUNNING without an open attempt cannot be re-adopted and would stay RUNNING for
// ever; they are requeued, without using a restart.
void Server::RequeueRunningWithoutAttempt() {
  std::set<int64_t> open;
  for (const AttemptRecord& a : store_->OpenAttempts()) open.insert(a.job);
  for (const JobRecord& job : store_->JobsIn(JobState::kRunning)) {
    if (open.count(job.id) || job.is_search) continue;  // a search runs no attempt of its own
    const std::string what = "found RUNNING without an open attempt at coordinator start; requeued";
    StateStore::Transaction transaction(*store_);
    store_->Requeue(job.id, what, started_at_);
    store_->AddEvent(job.id, what + " (not counted as a restart)", started_at_);
    transaction.Commit();
    spdlog::warn("job {}: {}", job.id, what);
  }
}

void Server::NoteAdoption(RunningAttempt* attempt, const RankKey& slot) {
  if (attempt->adopted) return;
  attempt->present.insert(slot);
  for (const RankKey& s : attempt->slots)
    if (!attempt->present.count(s)) return;
  Adopt(attempt, "");
}

void Server::Adopt(RunningAttempt* attempt, const std::string& how) {
  attempt->adopted = true;
  store_->AddEvent(attempt->job,
                   "attempt " + std::to_string(attempt->attempt) + " re-adopted after a coordinator restart" + how,
                   Now());
  spdlog::info("job {} attempt {} re-adopted", attempt->job, attempt->attempt);
  if (attempt->preempted_by != 0) SendPreemptStop(*attempt);  // the stop may not have reached it
  if (attempt->search_stop_at != 0) SendSearchStop(*attempt);
}

RankEntry* Server::Authenticated(const std::string& identity, const std::string& world, int rank,
                                 const std::string& token, const char* what) {
  std::string refusal;
  RankEntry* entry = ranks_->Authenticated({world, rank}, token, &refusal);
  if (!entry) Refuse(identity, std::string(what) + " for " + refusal);
  return entry;
}

// World ids go into placements ("<world>:<rank>,...") and logs: letters, digits, '.',
// '_' and '-' only.
std::string CutText(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  const std::string mark = " [cut: " + std::to_string(text.size()) + " bytes in all]";
  size_t keep = max > mark.size() ? max - mark.size() : 0;
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;  // a continuation byte
  return text.substr(0, keep) + mark;
}

void BoundPeerText(wire::Envelope* message) {
  auto cut = [](std::string* text) {
    if (text->size() > kMaxPeerLineBytes) *text = CutText(*text, kMaxPeerLineBytes);
  };
  if (message->has_heartbeat()) cut(message->mutable_heartbeat()->mutable_last_log_line());
  if (message->has_rank_exit()) cut(message->mutable_rank_exit()->mutable_last_log_line());
  if (message->has_result()) cut(message->mutable_result()->mutable_message());
}

bool PlausibleWorldId(const std::string& world) {
  return !world.empty() && world.size() <= 256 && std::all_of(world.begin(), world.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// Note [Worlds cannot be squatted] in coordinator/rank_registry.h.
void Server::RefuseSquat(const std::string& identity, const RankKey& key, const std::string& why) {
  const std::string what =
      "a registration as " + DescribeRank(key) +
      (why.empty() ? " with another world token: the world is bound to the token it first registered with" : why);
  ranks_->NoteSquat("refused " + what, Now());
  Refuse(identity, what);
}

void Server::OnRegister(const std::string& identity, const std::string& worker_key, const wire::Register& message) {
  const wire::RankInfo& rank = message.rank();
  if (!PlausibleWorldId(rank.world()) || rank.rank() < 0 || rank.rank() >= std::max(1, rank.world_size()) ||
      rank.slot() < 0 || rank.host().size() > kMaxPeerNameBytes || rank.device().size() > kMaxPeerNameBytes) {
    ++bad_frames_;
    Send(identity, ErrorEnvelope(2,
                                 "a registration needs a world id of letters, digits, '.', '_' and '-', a rank "
                                 "below the world size, a slot of 0 or more, and a host and device of at most " +
                                     std::to_string(kMaxPeerNameBytes) + " bytes"));
    return;
  }
  if (!PlausibleToken(message.world_token()) || !PlausibleToken(message.rank_token()))
    return Refuse(identity, "a registration needs a world token and a rank token of 32 or more characters");
  const RankKey key{rank.world(), rank.rank()};
  if (ranks_->BoundElsewhere(key.first, message.world_token())) return RefuseSquat(identity, key);
  if (const std::string why = launcher_->RegistrationRefusal(key, message.world_token()); !why.empty())
    return RefuseSquat(identity, key, why);
  if (const std::string why = ranks_->HolderRefusal(key, message.rank_token(), worker_key); !why.empty())
    return Refuse(identity, why);
  const bool known = ranks_->Register(message, identity, worker_key, Now());
  const RankEntry& entry = *ranks_->Find(key);
  if (!known)
    spdlog::info("{} registered (slot {} on {}, {}, pid {}{})", DescribeRank(key), entry.info.slot(), entry.info.host(),
                 entry.info.device(), entry.info.pid(), entry.job ? ", running job " + std::to_string(entry.job) : "");
  RunningAttempt* running = running_.Find(entry.job, entry.attempt);
  if (running && std::count(running->slots.begin(), running->slots.end(), key)) {
    NoteAdoption(running, key);
    if (running->elastic && running->adopted && running->finished.count(key)) ReplicaBack(*running, key);
  }
  SendStopIfStale(entry);
  if (entry.job == 0) launcher_->RankIdle(key);
  Send(identity, [] {
    wire::Envelope e;
    e.mutable_pulse();
    return e;
  }());
  schedule_due_ = true;
}

void Server::OnHeartbeat(const std::string& identity, const wire::Heartbeat& message) {
  if (!ranks_->Find({message.world(), message.rank()})) {  // registered with an earlier coordinator process
    wire::Envelope e;
    e.mutable_reregister();
    Send(identity, e);
    return;
  }
  RankEntry* entry = Authenticated(identity, message.world(), message.rank(), message.rank_token(), "a heartbeat");
  if (!entry) return;
  const bool freed = entry->job != 0 && message.job_id() == 0;
  ranks_->NoteHeartbeat(entry, identity, message);
  SendStopIfStale(*entry);
  if (freed) schedule_due_ = true;
}

// A rank running an attempt the coordinator has ended (cancelled, failed, or given up
// on during a restart) is told again to stop: StopJob is idempotent on the worker.
void Server::SendStopIfStale(const RankEntry& rank) {
  if (rank.job == 0) return;
  if (running_.Find(rank.job, rank.attempt)) return;
  Send(rank.identity, StopFor(rank.job, rank.attempt, "the coordinator no longer runs this attempt"));
}

bool Server::IsJobRankZero(int64_t job, int attempt, const std::string& world, int rank) const {
  for (const AttemptRecord& a : store_->Attempts(job)) {
    std::vector<RankKey> slots;
    if (a.attempt == attempt && ParsePlacement(a.placement, &slots)) return slots.front() == RankKey{world, rank};
  }
  return false;
}

// Note [Job output]: from the attempt's job rank 0 only, authenticated, in whole lines
// of a bounded size. A chunk that cannot be written is not acknowledged: the agent sends
// it again.
void Server::OnOutput(const std::string& identity, const wire::JobOutput& message) {
  if (!Authenticated(identity, message.world(), message.world_rank(), message.rank_token(), "an output chunk")) return;
  const std::string what =
      "output of job " + std::to_string(message.job_id()) + " attempt " + std::to_string(message.attempt());
  if (message.text().size() > kMaxOutputChunkBytes || message.offset() < 0 ||
      (!message.text().empty() && message.text().back() != '\n'))
    return Refuse(identity, what + " that is not whole lines of at most 64 KiB at an offset >= 0");
  // An elastic attempt's replicas each lead their own: replica r's goes to its own file.
  const RunningAttempt* running = running_.Find(message.job_id(), message.attempt());
  int replica = 0;
  if (running && running->elastic) {
    const RankKey slot{message.world(), message.world_rank()};
    if (std::count(running->slots.begin(), running->slots.end(), slot) == 0)
      return Refuse(identity, what + " from a rank that is not one of its replicas");
    replica = ReplicaNumber(*running, slot);
  } else if (!IsJobRankZero(message.job_id(), message.attempt(), message.world(), message.world_rank())) {
    return Refuse(identity, what + " from a rank that is not its job rank 0");
  }
  int64_t held = 0;
  try {
    held = outputs_->Append(message.job_id(), message.attempt(), message.offset(), message.text(), replica);
  } catch (const std::exception& e) {
    if (int64_t left_out = 0; log_limiter_.Allow("output", SteadySeconds(), &left_out))
      spdlog::error("job {}: cannot keep its output: {}{}", message.job_id(), e.what(), LeftOutNote(left_out));
    return;
  }
  wire::Envelope ack = AckFor(message.job_id(), message.attempt(), "output", 0);
  ack.mutable_ack()->set_offset(held);
  Send(identity, ack);
}

// Epoch reports come from the attempt's job rank 0 only, authenticated; the attempt
// may have ended since (a report resent after a reconnect), so the store decides.
void Server::OnEpoch(const std::string& identity, const wire::EpochReport& message) {
  if (!Authenticated(identity, message.world(), message.world_rank(), message.rank_token(), "an epoch report")) return;
  // Every replica of an elastic attempt reports each epoch (the first report is kept).
  const RunningAttempt* running = running_.Find(message.job_id(), message.attempt());
  const bool from_replica =
      running && running->elastic &&
      std::count(running->slots.begin(), running->slots.end(), RankKey{message.world(), message.world_rank()}) > 0;
  if (!from_replica && !IsJobRankZero(message.job_id(), message.attempt(), message.world(), message.world_rank()))
    return Refuse(identity, "an epoch report for job " + std::to_string(message.job_id()) + " attempt " +
                                std::to_string(message.attempt()) + " from a rank that is not its job rank 0");
  EpochRecord row{message.attempt(), message.epoch(), message.csv_line(), message.csv_header(),
                  BreakdownJson(message.breakdown()).dump()};
  // A trial's row and its search's verdict on it (Note [ASHA]) commit together.
  StateStore::Transaction transaction(*store_);
  const bool added = store_->AddEpochRow(message.job_id(), row);
  const int stop_at =
      searches_->Judge(message.job_id(), message.epoch(), message.csv_header(), message.csv_line(), Now());
  transaction.Commit();
  if (added) WriteEpochFiles(message.job_id());  // committed first
  Send(identity, AckFor(message.job_id(), message.attempt(), "epoch", message.epoch()));
  if (stop_at > 0) StopTrial(message.job_id(), message.attempt(), stop_at);
  if (const auto trial = store_->TrialOfJob(message.job_id())) searches_->MarkStale(trial->search);
}

void Server::WriteEpochFiles(int64_t job) {
  const auto rows = store_->EpochRows(job);
  if (rows.empty()) return;
  std::map<int, std::string> per_attempt;
  std::string all = rows.front().csv_header + "\n";
  for (const EpochRecord& row : rows) {
    std::string& text = per_attempt[row.attempt];
    if (text.empty()) text = row.csv_header + "\n";
    text += row.csv_line + "\n";
    all += row.csv_line + "\n";
  }
  // The rows are in the store; a file that cannot be written now is rewritten later.
  WriteJobFile(JobRunsDir(job), "epochs.csv", all, job);
  for (const auto& [attempt, text] : per_attempt) WriteJobFile(AttemptDir(job, attempt), "epochs.csv", text, job);
}

void Server::OnResult(const std::string& identity, const wire::JobResult& message) {
  RankEntry* rank =
      Authenticated(identity, message.world(), message.world_rank(), message.rank_token(), "a job result");
  if (!rank) return;
  Send(identity, AckFor(message.job_id(), message.attempt(), "result", 0, message.world_rank()));
  // A rank sends its result after it has gone idle: free it now, not at its next heartbeat.
  if (rank->job == message.job_id() && rank->attempt == message.attempt()) {
    rank->job = 0;
    rank->attempt = 0;
  }
  RunningAttempt* found = running_.Find(message.job_id(), message.attempt());
  if (!found) return;  // already ended
  RunningAttempt& attempt = *found;
  const RankKey from{message.world(), message.world_rank()};
  if (!std::count(attempt.slots.begin(), attempt.slots.end(), from))
    return Refuse(identity, "a result for job " + std::to_string(message.job_id()) + " from " + DescribeRank(from) +
                                ", which is not one of its slots");
  NoteAdoption(&attempt, from);
  if (attempt.elastic && IsEarlierReplica(attempt, from, message.elastic_replica())) return;
  if (attempt.elastic) return ReplicaEnded(attempt, from, message.end(), message.message(), message.summary_json());
  // The lead (job rank 0's agent) ran the attempt as its own mpirun and speaks for
  // it; another slot's result only says that it is free again.
  if (from != attempt.slots.front()) return;
  if (message.end() != wire::OUTCOME_SUCCEEDED && attempt.search_stop_at != 0)
    return EndStoppedTrial(message.job_id(), attempt.search_stop_at);
  if (message.end() != wire::OUTCOME_SUCCEEDED && attempt.preempted_by != 0) {
    FailAttempt(
        message.job_id(),
        "preempted by job " + std::to_string(attempt.preempted_by) + ": " +
            (message.end() == wire::OUTCOME_PREEMPTED ? message.message()
                                                      : "it did not stop with a checkpoint (" + message.message() +
                                                            "); it resumes from its last checkpoint"),
        Retry::kFree);
    return;
  }
  if (message.end() != wire::OUTCOME_SUCCEEDED) {
    const bool bad_input = message.end() == wire::OUTCOME_BAD_INPUT;
    const bool preempted = message.end() == wire::OUTCOME_PREEMPTED;
    const std::string reason = "the job led by " + DescribeRank(from) + " " +
                               (bad_input   ? "rejected its input: "
                                : preempted ? "was preempted: "
                                            : "failed: ") +
                               message.message();
    if (launcher_->DefersEnd(&attempt, from, message.end(), reason)) return;
    FailAttempt(message.job_id(), reason, bad_input ? Retry::kNever : preempted ? Retry::kFree : Retry::kCounted);
    return;
  }
  attempt.finished.insert(from);
  if (!message.summary_json().empty()) attempt.summary_json = message.summary_json();
  SucceedAttempt(attempt);
}

void Server::OnRankExit(const std::string& identity, const wire::RankExit& message) {
  const RankKey key{message.rank().world(), message.rank().rank()};
  if (!Authenticated(identity, key.first, key.second, message.rank_token(), "a rank exit")) return;
  Send(identity, AckFor(0, 0, "rank_exit", 0, message.rank().rank()));
  std::string how = "exited with code " + std::to_string(message.exit_code());
  if (message.signal() != 0) {
    how = "was killed by signal " + std::to_string(message.signal()) + " (" + SignalName(message.signal()) + ")";
    if (message.forwarded()) how += " (forwarded by its supervisor: the agent was being stopped)";
  }
  std::string last_line = message.last_log_line();
  const RankEntry* entry = ranks_->Find(key);
  if (entry && last_line.empty()) last_line = entry->last_log_line;
  const std::string who = DescribeRank(key);
  spdlog::warn("{} {}", who, how);
  ranks_->Remove(key);
  ReplicaGone(key);
  // A signal forwarded by the supervisor came from outside the job: its pool is being
  // stopped (a rank that failed on its own is reported, and ends the attempt, first).
  if (RunningAttempt* attempt = AttemptAwaiting(key); attempt && attempt->elastic)
    ReplicaEnded(*attempt, key, wire::OUTCOME_FAILED, WithLastLine(who + " " + how, last_line), "");
  else if (attempt)
    FailAttempt(attempt->job, WithLastLine(who + " " + how, last_line),
                message.forwarded() ? Retry::kFree : Retry::kCounted);
  schedule_due_ = true;
}

void Server::Tick() {
  const double now = Now();
  if (now - last_liveness_check_ >= options_.heartbeat_s) {
    last_liveness_check_ = now;
    ExpireSilentRanks();
    CheckAttemptsStarted();
    CheckPreemptions();
  }
  launcher_->Follow(now);
  quorums_->Advance(listening_.Now());
  SendQuorumAnswers();
  ExpireFileQueries();
  searches_->Advance(now);
  if (history_left_ || now - last_history_pass_ >= kHistoryPassS) TrimHistory(now);
  if (schedule_due_ || now - last_schedule_ >= 0.5) ScheduleQueued(now);
}

void Server::TrimHistory(double now) {
  if (!history_left_) {  // once a pass, not once a batch
    last_history_pass_ = now;
    std::vector<std::string> in_use;
    for (const auto& [key, entry] : ranks_->entries()) in_use.push_back(key.first);
    store_->TouchWorlds(in_use, now);
    store_->ForgetWorldsRegisteredBefore(now - kWorldTokenDays * 86400.0);
    ranks_->ReloadBindings();
  }
  history_left_ = false;
  if (options_.keep_history_days <= 0) return;
  const double before = now - options_.keep_history_days * 86400.0;
  const int64_t forgotten = store_->PruneHistory(before, now, options_.policy.fairshare_half_life_h * 3600.0,
                                                 SubmitToRunningBounds(), kHistoryBatch);
  if (forgotten == 0) return;
  history_left_ = true;
  spdlog::info("forgot {} jobs that ended more than {} days ago (--keep-history; their run folders stay)", forgotten,
               options_.keep_history_days);
}

void Server::ExpireSilentRanks() {
  for (const RankKey& key : ranks_->Silent()) {
    if (!SlurmJobOfWorld(key.first).empty() && !AttemptAwaiting(key)) {
      ranks_->Remove(key);  // a Slurm job's rank 0 after its attempt ended: gone with its job
      continue;
    }
    const RankEntry& entry = *ranks_->Find(key);
    const std::string reason = WithLastLine(
        DescribeRank(key) + " stopped heartbeating (silent for " + SecondsText(ranks_->SilentFor(entry)) + ")",
        entry.last_log_line);
    spdlog::warn("{}", reason);
    ranks_->Remove(key);
    ReplicaGone(key);
    RunningAttempt* attempt = AttemptAwaiting(key);
    if (attempt && attempt->elastic && attempt->adopted)
      ReplicaEnded(*attempt, key, wire::OUTCOME_FAILED, reason, "");
    else if (attempt && attempt->adopted)
      FailAttempt(attempt->job, reason);  // else: the restart grace decides
    schedule_due_ = true;
  }
}

// Attempts whose ranks never started them (the Assign was lost), or, after a restart,
// never came back naming them, are given up after the grace period.
void Server::CheckAttemptsStarted() {
  std::vector<std::pair<int64_t, std::string>> failed, abandoned;
  std::vector<std::pair<int64_t, RankKey>> replicas_not_started;  // of elastic attempts: each its own
  for (auto& [id, attempt] : running_) {
    if (!launcher_->Started(attempt)) continue;
    if (listening_.Now() - attempt.started_listening < options_.grace_s) continue;
    if (!attempt.adopted && attempt.elastic && !attempt.present.empty()) {
      // An elastic attempt goes on with the replicas that came back; the rest end below.
      Adopt(&attempt, " with " + std::to_string(attempt.present.size()) + " of its replicas");
    } else if (!attempt.adopted) {
      abandoned.emplace_back(id, "its ranks did not come back within " + std::to_string(int(options_.grace_s)) +
                                     " s of a coordinator restart");
      continue;
    }
    for (const RankKey& slot : attempt.slots) {
      const RankEntry* entry = ranks_->Find(slot);
      const bool started = entry && entry->job == id && entry->attempt == attempt.attempt;
      if (!started && !attempt.finished.count(slot) && attempt.elastic) {
        const auto assigned = attempt.replica_assigned.find(slot);
        if (assigned == attempt.replica_assigned.end() || listening_.Now() - assigned->second >= options_.grace_s)
          replicas_not_started.emplace_back(id, slot);
      } else if (!started && !attempt.finished.count(slot)) {
        failed.emplace_back(id, DescribeRank(slot) + " did not start the attempt within " +
                                    std::to_string(int(options_.grace_s)) + " s");
        break;
      }
    }
  }
  for (const auto& [id, reason] : failed) FailAttempt(id, reason);
  for (const auto& [id, reason] : abandoned) FailAttempt(id, reason, Retry::kFree);
  for (const auto& [id, slot] : replicas_not_started)
    if (RunningAttempt* attempt = running_.Find(id))
      ReplicaEnded(*attempt, slot, wire::OUTCOME_FAILED,
                   "was not running its replica " + std::to_string(int(options_.grace_s)) +
                       " s after its start or a coordinator restart",
                   "");
}

void Server::ScheduleQueued(double now) {
  last_schedule_ = now;
  schedule_due_ = false;
  launcher_->Schedule(now);
}

// Note [Preemption]
// The scheduler names the victims (rule 5 in coordinator/scheduler.h). Each gets a StopJob
// with `preempt` set, to its lead only: the lead agent relays it to the job's rank 0, the
// ranks agree to stop after the step in progress (Note [Stop agreement] in
// worker/jobs/job_setup.h), a fine-tune job writes a checkpoint of that step, and rank 0's
// result says OUTCOME_PREEMPTED. The other slots hold on until the attempt ends, so the
// head never starts beside a victim's ranks. The preemption is stored with the attempt
// before the stop is sent, so a restarted coordinator still counts the victim's slots as
// freeing and tells its re-adopted lead again (a stop is idempotent on the agent). Whatever the lead reports then ends
// the attempt as interrupted: requeued at once, resuming from its newest checkpoint, not counted as a restart. The
// StopJob carries --preempt-grace: a job still running that long after it has its mpirun ended by the lead agent (then
// killed 10 s later), and resumes from the checkpoint before. A lead that reports nothing within the grace and another
// 30 s (it died with its host) ends the attempt from here.
void Server::Preempt(int64_t victim, const std::string& head) {
  RunningAttempt* found = running_.Find(victim);
  if (!found) return;
  RunningAttempt& attempt = *found;
  auto head_job = store_->Find(std::stoll(head));
  attempt.preempted_by = std::stoll(head);
  attempt.preempt_asked = listening_.Now();
  ++preemptions_;
  const std::string event = "preempted by job " + head + " (priority " +
                            std::to_string(head_job ? head_job->priority : 0) +
                            "): asked to stop after its step in progress, checkpoint and requeue within " +
                            SecondsText(options_.policy.preempt_grace_s);
  StateStore::Transaction transaction(*store_);
  store_->MarkPreempted(victim, attempt.attempt, attempt.preempted_by);
  store_->AddEvent(victim, event, Now());
  transaction.Commit();  // before the stop is sent
  spdlog::info("job {}: {}", victim, event);
  SendPreemptStop(attempt);
}

void Server::SendPreemptStop(const RunningAttempt& attempt) {
  const wire::Envelope stop =
      StopFor(attempt.job, attempt.attempt, "preempted by job " + std::to_string(attempt.preempted_by), true,
              options_.policy.preempt_grace_s);
  for (const RankKey& slot : attempt.slots) {  // a lead, or every replica of an elastic attempt
    if (attempt.elastic && attempt.finished.count(slot)) continue;
    if (const RankEntry* lead = ranks_->Find(slot)) Send(lead->identity, stop);
    if (!attempt.elastic) break;
  }
}

void Server::CheckPreemptions() {
  constexpr double kReportMarginS = 30;  // past the grace: the lead's kill grace and its report
  std::vector<RunningAttempt> overdue;
  for (const auto& [id, attempt] : running_)
    if (attempt.preempted_by != 0 &&
        listening_.Now() - attempt.preempt_asked > options_.policy.preempt_grace_s + kReportMarginS)
      overdue.push_back(attempt);
  for (const RunningAttempt& attempt : overdue)
    FailAttempt(attempt.job,
                "preempted by job " + std::to_string(attempt.preempted_by) + "; its lead " +
                    DescribeRank(attempt.slots.front()) + " reported no end within " +
                    SecondsText(options_.policy.preempt_grace_s + kReportMarginS),
                Retry::kFree);
}

bool Server::MakeAttemptFolder(const JobRecord& job, double now) {
  try {
    MakeFoldersBeneath(options_.runs_dir, std::to_string(job.id) + "/attempt-" + std::to_string(job.attempts + 1));
    return true;
  } catch (const std::exception& e) {  // the job cannot run here; the daemon goes on
    const std::string reason = "the coordinator cannot create its runs folder: " + std::string(e.what());
    StateStore::Transaction transaction(*store_);
    store_->SetState(job.id, JobState::kFailed, reason, now);
    store_->AddEvent(job.id, reason, now);
    transaction.Commit();
    spdlog::error("job {} failed: {}", job.id, reason);
    return false;
  }
}

RunningAttempt& Server::OpenAttempt(const JobRecord& job, const std::vector<RankKey>& slots, const std::string& how,
                                    double now) {
  RunningAttempt attempt;
  attempt.job = job.id;
  attempt.priority = job.priority;
  attempt.user = job.user;
  attempt.preemptible = job.preemptible;
  attempt.slots = slots;
  attempt.started_at = now;
  attempt.started_listening = listening_.Now();
  if (job.estimate_s > 0) attempt.estimated_end = now + job.estimate_s;
  StateStore::Transaction transaction(*store_);
  attempt.attempt = store_->StartAttempt(job.id, PlacementText(slots), now);
  store_->AddEvent(job.id, "attempt " + std::to_string(attempt.attempt) + " " + how, now);
  transaction.Commit();
  OpenQuorumIfElastic(&attempt);
  spdlog::info("job {} '{}' attempt {} {}", job.id, job.name, attempt.attempt, how);
  return running_.Add(attempt);
}

void Server::SendAssign(const JobRecord& job, const RunningAttempt& attempt, const RankKey& to) {
  wire::Envelope e;
  wire::Assign* assign = e.mutable_assign();
  assign->set_job_id(job.id);
  assign->set_attempt(attempt.attempt);
  assign->set_yaml(job.spec_yaml);
  assign->set_source(job.source);
  assign->set_base_dir(job.base_dir);
  for (const RankKey& slot : attempt.slots) {
    if (attempt.elastic && slot != to) continue;  // each slot leads a replica of its own
    const wire::RankInfo& info = ranks_->entries().at(slot).info;
    wire::JobPlace* place = assign->add_places();
    place->set_world(slot.first);
    place->set_rank(slot.second);
    place->set_host(info.host());
    place->set_slot(info.slot());
  }
  assign->set_runs_dir(JobRunsDir(job.id));
  assign->set_resume(attempt.attempt > 1);
  if (attempt.elastic) {
    assign->set_elastic_replicas(attempt.max_replicas);
    assign->set_elastic_replica(ReplicaNumber(attempt, to));
  }
  Send(ranks_->entries().at(to).identity, e);
}

void Server::EndJobsAttempt(int64_t id, const AttemptEnding& ending) {
  if (const std::optional<RunningAttempt> attempt = running_.End(*store_, id, ending, Now())) {
    quorums_->Close(attempt->job, attempt->attempt);
    StopRanks(*attempt, ending.stop_message);    // the gang's other ranks hold their slots until told
    launcher_->Ended(*attempt, ending.outcome);  // a Slurm allocation, if any is left
  }
  schedule_due_ = true;
  searches_->MarkDue();
}

void Server::SucceedAttempt(RunningAttempt attempt) {  // a copy: ending it erases the running one
  EndJobsAttempt(attempt.job, {wire::OUTCOME_SUCCEEDED, "", JobState::kSucceeded, "", 0,
                               "attempt " + std::to_string(attempt.attempt) + " succeeded",
                               "the attempt succeeded: this slot is free"});
  WriteEpochFiles(attempt.job);  // again: a crash may have come between a row's commit and its file
  if (!attempt.summary_json.empty()) {
    WriteJobFile(JobRunsDir(attempt.job), "summary.json", attempt.summary_json + "\n", attempt.job);
    WriteJobFile(AttemptDir(attempt.job, attempt.attempt), "summary.json", attempt.summary_json + "\n", attempt.job);
  }
  spdlog::info("job {} succeeded (attempt {})", attempt.job, attempt.attempt);
}

void Server::FailAttempt(int64_t id, const std::string& reason, Retry retry) {
  const RunningAttempt* running = running_.Find(id);
  if (!running) return;
  // A trial its search stopped is never retried, however its ranks ended.
  if (running->search_stop_at != 0) return EndStoppedTrial(id, running->search_stop_at);
  const int attempt = running->attempt;
  const bool free = retry == Retry::kFree;
  const std::string what = "attempt " + std::to_string(attempt) + (free ? " interrupted: " : " failed: ") + reason;
  const JobRecord job = *store_->Find(id);
  int restarts_used = free ? 0 : 1;  // failed attempts after the first, this one included; interrupted ones are free
  for (const AttemptRecord& a : store_->Attempts(id)) restarts_used += a.end == wire::OUTCOME_FAILED;
  restarts_used = std::max(0, restarts_used - 1);
  const bool counted_retry_left = retry == Retry::kCounted && restarts_used < job.max_restarts;
  AttemptEnding ending{free ? wire::OUTCOME_INTERRUPTED : wire::OUTCOME_FAILED,
                       reason,
                       JobState::kQueued,
                       what,
                       0,
                       "",
                       "attempt ended: " + reason};
  if (free || counted_retry_left) {
    const double backoff = free ? 0 : std::min(60.0, options_.restart_backoff_s * std::pow(2.0, restarts_used));
    ending.requeue_at = Now() + backoff;
    ending.event = what + "; requeued to resume from its last checkpoint" +
                   (free ? " (not counted as a restart)"
                         : " in " + SecondsText(backoff) + " (restart " + std::to_string(restarts_used + 1) + " of " +
                               std::to_string(job.max_restarts) + ")");
  } else {
    ending.event = what + (retry == Retry::kNever ? " (not retried: the input is at fault)"
                                                  : " (no restarts left: resources.max_restarts is " +
                                                        std::to_string(job.max_restarts) + ")");
    ending.job_state = JobState::kFailed;
    ending.job_reason = ending.event;
  }
  EndJobsAttempt(id, ending);
  spdlog::warn("job {}: {}", id, ending.event);
}

void Server::StopRanks(const RunningAttempt& attempt, const std::string& reason) {
  const wire::Envelope e = StopFor(attempt.job, attempt.attempt, reason);
  for (const RankKey& slot : attempt.slots) {
    if (const RankEntry* entry = ranks_->Find(slot)) Send(entry->identity, e);
  }
}

}  // namespace trainyard
