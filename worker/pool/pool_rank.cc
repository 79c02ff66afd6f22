#include "worker/pool/pool_rank.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "worker/pool/job_process.h"
#include "worker/pool/job_relay.h"

namespace trainyard {
namespace {

constexpr double kOutputDrainS = 5;  // for the coordinator to take a job's last output

JobOutcome Outcome(JobEnd end, const std::string& message) {
  JobOutcome o;
  o.end = end;
  o.message = message;
  return o;
}

// The latest line in which the job says why it failed, without the log's time stamp.
std::string FailureLine(const std::vector<std::string>& tail) {
  for (auto line = tail.rbegin(); line != tail.rend(); ++line) {
    const size_t at = line->find("error: ");
    if (at != std::string::npos) return line->substr(at + 7);
  }
  return "";
}

std::string DescribeJobRank(int rank, const JobRelay& relay, const std::string& node) {
  std::string text = "job rank " + std::to_string(rank);
  if (rank >= 0 && static_cast<size_t>(rank) < relay.processes().size()) {
    const JobRankProcess& p = relay.processes()[static_cast<size_t>(rank)];
    text += " (pid " + std::to_string(p.pid) + " on " + p.host + ")";
  } else if (!node.empty()) {
    text += " (on " + node + ")";
  }
  return text;
}

// How an attempt ended, from what its rank 0 said and what its mpirun did.
// `stuck`: the agent ended an mpirun that did not end a failed job (Lead).
JobOutcome EndOf(const JobProcess& job, const JobRelay& relay, bool stop_asked, bool stuck) {
  const std::optional<JobOutcome>& said = relay.result();
  if (said && (job.Succeeded() || said->end != JobEnd::kSucceeded)) return *said;
  if (stop_asked) return Outcome(JobEnd::kCancelled, "stopped on request; its mpirun " + job.ExitText());
  const std::vector<std::string> tail = job.OutputTail();
  const RankEnd end = ParseMpirunReport(tail);
  std::string what;
  if (end.rank >= 0 && end.signal != 0)
    what = DescribeJobRank(end.rank, relay, end.node) + " was killed by signal " + std::to_string(end.signal) + " (" +
           SignalName(end.signal) + ")";
  else if (end.rank >= 0)
    what = DescribeJobRank(end.rank, relay, end.node) + " exited with code " + std::to_string(end.exit_code);
  else if (!end.lost_host.empty())
    what = "its mpirun lost contact with host " + end.lost_host +
           " (Open MPI's daemon there stopped answering: the host or its link went down)";
  else if (stuck)
    what =
        "its mpirun did not end the job after a rank failed (a host of the job may be unreachable), so the agent "
        "ended it";
  else
    what = "its mpirun " + job.ExitText();
  // The job's own last error line; else what mpirun itself said first (it refused to
  // start, e.g. as root, or could not reach a host).
  std::string why = FailureLine(tail);
  if (why.empty()) why = job.MpirunMessage();
  return Outcome(JobEnd::kFailed, why.empty() ? what : what + ": " + why);
}

std::optional<Clock::time_point> Earliest(std::optional<Clock::time_point> a, std::optional<Clock::time_point> b) {
  if (a && b) return std::min(*a, *b);
  return a ? a : b;
}

// When a lead ends its job's mpirun (PoolRank::Lead's loop calls each check on every
// turn): a stop the coordinator asked for gets the stop grace; a failed rank gets the
// abort grace; an mpirun it ended gets the kill grace, then is killed.
class MpirunEnding {
 public:
  MpirunEnding(JobProcess& job, int64_t job_id) : job_(job), job_id_(job_id) {}

  void AskStop() {
    if (stop_asked_) return;
    stop_asked_ = true;
    asked_at_ = Clock::now();
  }

  void CheckStopGrace(double grace_s) {
    if (stop_asked_ && !terminated_ && SecondsSince(asked_at_) > grace_s)
      Terminate(StrFormat("no stop after %.0f s", grace_s));
  }

  // A failed rank aborts the job, and mpirun then stops the others through each host's
  // daemon. It waits for an unreachable host's daemon without end (a cut link, a
  // powered-off host), so the failure is not left waiting on it. The ending starts when
  // mpirun says a rank failed or when rank 0 says the job failed, whichever comes first:
  // mpirun's own words may never come (its help text can fail to print while a host is
  // unreachable).
  void CheckFailure(const std::optional<JobOutcome>& said, double abort_grace_s) {
    if (!failure_said_ && said && said->end == JobEnd::kFailed) failure_said_ = Clock::now();
    const auto ending = Earliest(job_.EndingSince(), failure_said_);
    if (!ending || terminated_ || SecondsSince(*ending) <= abort_grace_s) return;
    stuck_ = true;
    Terminate(StrFormat(
        "a rank failed and its mpirun had not ended the job %.0f s later (a host of the job may be unreachable)",
        abort_grace_s));
  }

  void CheckKillGrace(double kill_grace_s) {
    if (terminated_ && SecondsSince(terminated_at_) > kill_grace_s) job_.Kill();
  }

  bool stop_asked() const { return stop_asked_; }
  bool terminated() const { return terminated_; }
  bool stuck() const { return stuck_; }  // ended by the abort grace

 private:
  void Terminate(const std::string& why) {
    LogWarn(StrFormat("job %ld: %s; ending its mpirun", long(job_id_), why.c_str()));
    job_.Terminate();
    terminated_ = true;
    terminated_at_ = Clock::now();
  }

  JobProcess& job_;
  const int64_t job_id_;
  bool stop_asked_ = false, terminated_ = false, stuck_ = false;
  Clock::time_point asked_at_, terminated_at_;
  std::optional<Clock::time_point> failure_said_;
};

}  // namespace

PoolRank::PoolRank(PoolAgent& agent, JobLaunchOptions options) : agent_(agent), options_(std::move(options)) {}

void PoolRank::Serve(const std::atomic<bool>& stop, std::atomic<bool>& busy) {
  while (auto assignment = agent_.WaitForAssignment(stop)) {
    busy = true;
    agent_.Begin(*assignment);
    const RankIdentity& self = agent_.self();
    const bool lead = !assignment->places.empty() && assignment->places.front().world == self.world &&
                      assignment->places.front().rank == self.rank;
    JobOutcome outcome = lead ? Lead(*assignment) : HoldSlot(*assignment);
    // The output first, then the result (Note [Job output] in coordinator/job_output.h).
    if (lead && !agent_.DrainOutput(kOutputDrainS))
      LogWarn(StrFormat("job %ld: the coordinator has not taken all of its output yet; the rest follows the result",
                        long(assignment->job_id)));
    agent_.Finish(outcome);
    busy = false;
  }
}

JobOutcome PoolRank::Lead(const Assignment& a) {
  LogInfo(StrFormat("job %ld attempt %d: starting on %zu rank(s) as its own mpirun%s", long(a.job_id), a.attempt,
                    a.places.size(), a.resume ? ", resuming from its latest checkpoint" : ""));
  JobOutcome outcome;
  try {
    JobRelay relay;
    JobProcess job(LaunchOf(a, relay.endpoint()), [this](const std::string& line) { agent_.AppendOutput(line); });
    MpirunEnding ending(job, a.job_id);
    while (!job.Exited()) {
      relay.Pump(50, a, agent_);
      if (agent_.StopRequested()) ending.AskStop();
      if (ending.stop_asked()) relay.Stop("the coordinator asked", a, agent_.StopIsPreemption());
      ending.CheckStopGrace(agent_.StopGrace() > 0 ? agent_.StopGrace() : options_.stop_grace_s);
      ending.CheckFailure(relay.result(), options_.abort_grace_s);
      ending.CheckKillGrace(options_.kill_grace_s);
    }
    if (ending.terminated()) job.Kill();  // what mpirun left behind (its ssh to a host gone away)
    relay.Pump(0, a, agent_);             // what it said last
    outcome = EndOf(job, relay, ending.stop_asked(), ending.stuck());
  } catch (const std::exception& e) {
    outcome = Outcome(JobEnd::kFailed, std::string("the pool agent could not run the job: ") + e.what());
  }
  LogInfo(StrFormat("job %ld attempt %d: %s%s%s", long(a.job_id), a.attempt, JobEndName(outcome.end).c_str(),
                    outcome.message.empty() ? "" : ": ", outcome.message.c_str()));
  return outcome;
}

// The job's own mpirun over the hosts and slots the assignment names.
JobLaunch PoolRank::LaunchOf(const Assignment& a, const std::string& relay_endpoint) const {
  JobLaunch launch{options_.mpirun,   options_.worker,           {}, {}, relay_endpoint, a.job_id,
                   options_.job_args, options_.allow_run_as_root};
  for (const JobPlace& place : a.places) {
    if (place.host.empty() || place.slot < 0)
      throw std::runtime_error("the assignment names no host or slot for " + place.world);
    launch.hosts.push_back(place.host);
    launch.slots.push_back(place.slot);
  }
  return launch;
}

JobOutcome PoolRank::HoldSlot(const Assignment& a) {
  LogDebug(StrFormat("job %ld attempt %d: holding this slot for the mpirun of %s", long(a.job_id), a.attempt,
                     a.places.empty() ? "?" : a.places.front().world.c_str()));
  while (!agent_.StopRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return Outcome(JobEnd::kReleased, "");
}

}  // namespace trainyard
