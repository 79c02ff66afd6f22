// The life of an attempt, in process and message by message: the Server's seams (a
// clock moved by hand, an outbox that collects what it sends, HandleFrame for what
// arrives and Step for one turn of its loop) drive registrations, assignments,
// heartbeats, reports, results, silences and backoffs without sockets to peers or sleeps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/server.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr const char* kClient = "client";

// An agent as the coordinator sees it: a world of its own, rank 0, on a host of its own.
struct Agent {
  std::string world;
  std::string identity() const { return "id-" + world; }
  std::string rank_token() const { return std::string(32, 'r') + world; }
  std::string world_token() const { return std::string(32, 'w') + world; }
};

class ServerLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_lifecycle_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "train.tsv") << "label\ttext\nen\thello world\n";
    std::ofstream(dir_ / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
    options_.listen = "inproc://lifecycle-" + std::to_string(::getpid());
    options_.insecure = true;
    options_.state_path = (dir_ / "state.db").string();
    options_.runs_dir = (dir_ / "runs").string();
    options_.heartbeat_s = 1;
    options_.liveness = 3;
    options_.grace_s = 5;
    options_.restart_backoff_s = 4;
    options_.clock = [this] { return now_; };
    options_.outbox = [this](const std::string& identity, const wire::Envelope& message) {
      sent_.emplace_back(identity, message);
    };
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  void Start() { server_ = std::make_unique<Server>(options_); }

  void Deliver(const std::string& identity, const wire::Envelope& message) {
    wire::Envelope copy = message;
    copy.set_version(kProtocolVersion);
    const std::string bytes = copy.SerializeAsString();
    server_->HandleFrame(identity, "", bytes.data(), bytes.size());
  }
  // Turns of the loop, the clock still, until `done` (a submission is checked on a thread
  // of its own); false if it never comes.
  bool StepUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 200 && !done(); ++i) server_->Step(0.01);
    return done();
  }
  // `seconds` pass in turns of one second, as a loop that is never stalled sees them;
  // `beat` (if any) runs before each turn.
  void Pass(double seconds, const std::function<void()>& beat = {}) {
    for (double left = seconds; left > 1e-9; left -= 1) {
      now_ += std::min(1.0, left);
      if (beat) beat();
      server_->Step(0);
    }
  }

  void Register(const Agent& agent, int64_t job = 0, int attempt = 0) {
    wire::Envelope e;
    wire::RankInfo* rank = e.mutable_register_()->mutable_rank();
    rank->set_world(agent.world);
    rank->set_world_size(1);
    rank->set_host("host-" + agent.world);
    rank->set_device("cpu");
    rank->set_pid(100);
    e.mutable_register_()->set_world_token(agent.world_token());
    e.mutable_register_()->set_rank_token(agent.rank_token());
    e.mutable_register_()->set_job_id(job);
    e.mutable_register_()->set_attempt(attempt);
    Deliver(agent.identity(), e);
  }
  void Heartbeat(const Agent& agent, int64_t job = 0, int attempt = 0) {
    wire::Envelope e;
    e.mutable_heartbeat()->set_world(agent.world);
    e.mutable_heartbeat()->set_rank_token(agent.rank_token());
    e.mutable_heartbeat()->set_job_id(job);
    e.mutable_heartbeat()->set_attempt(attempt);
    Deliver(agent.identity(), e);
  }
  // Heartbeats of `agents`, each naming (job, attempt), as a beat for Pass.
  std::function<void()> Beating(std::vector<const Agent*> agents, int64_t job = 0, int attempt = 0) {
    return [this, agents, job, attempt] {
      for (const Agent* agent : agents) Heartbeat(*agent, job, attempt);
    };
  }
  void Epoch(const Agent& lead, int64_t job, int attempt, int epoch) {
    wire::Envelope e;
    wire::EpochReport* report = e.mutable_epoch();
    report->set_job_id(job);
    report->set_attempt(attempt);
    report->set_epoch(epoch);
    report->set_csv_header("epoch,train_loss");
    report->set_csv_line(std::to_string(epoch) + ",0.5");
    report->set_world(lead.world);
    report->set_rank_token(lead.rank_token());
    Deliver(lead.identity(), e);
  }
  void Result(const Agent& agent, int64_t job, int attempt, wire::Outcome end, const std::string& text = "",
              int elastic_replica = 0) {
    wire::Envelope e;
    wire::JobResult* result = e.mutable_result();
    result->set_elastic_replica(elastic_replica);
    result->set_job_id(job);
    result->set_attempt(attempt);
    result->set_end(end);
    result->set_message(text);
    result->set_world(agent.world);
    result->set_rank_token(agent.rank_token());
    Deliver(agent.identity(), e);
  }
  // Submits a job of `ranks` ranks as an admin client; its id once the check is done, or 0.
  int64_t Submit(int ranks, const std::string& key) {
    return SubmitFile(
        "name: proto\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
        "resources:\n  ranks: " +
            std::to_string(ranks) + "\n  max_restarts: 2\n",
        key);
  }
  // Submits a job or search file (its paths in dir_) as an admin client; its id once the
  // check is done, or 0.
  int64_t SubmitFile(const std::string& yaml, const std::string& key = "") {
    wire::Envelope e;
    e.mutable_submit()->set_yaml(yaml);
    e.mutable_submit()->set_source("job.yaml");
    e.mutable_submit()->set_base_dir(dir_.string());
    e.mutable_submit()->set_idempotency_key(key);
    Deliver(kClient, e);
    const wire::Envelope* reply = nullptr;
    StepUntil([&] { return (reply = Last(kClient, wire::Envelope::kSubmitted)) != nullptr; });
    return reply ? reply->submitted().job_id() : 0;
  }

  // A coordinator with agents a and b registered and a two-rank job submitted, after the
  // turn of its loop that places it; the job's id, or 0.
  int64_t StartATwoRankJobOnAAndB() {
    Start();
    Register(a_);
    Register(b_);
    const int64_t job = Submit(2, "k1");
    server_->Step(0);
    return job;
  }

  // The messages of `kind` sent to `identity` since the last Take, which forgets them all.
  std::vector<wire::Envelope> Take(const std::string& identity, wire::Envelope::BodyCase kind) {
    std::vector<wire::Envelope> out;
    for (const auto& [to, message] : sent_)
      if (to == identity && message.body_case() == kind) out.push_back(message);
    sent_.clear();
    return out;
  }
  const wire::Envelope* Last(const std::string& identity, wire::Envelope::BodyCase kind) const {
    for (auto it = sent_.rbegin(); it != sent_.rend(); ++it)
      if (it->first == identity && it->second.body_case() == kind) return &it->second;
    return nullptr;
  }
  std::vector<std::string> Sent(wire::Envelope::BodyCase kind) const {
    std::vector<std::string> to;
    for (const auto& [identity, message] : sent_)
      if (message.body_case() == kind) to.push_back(identity);
    return to;
  }
  // What jobctl status and report say of job `id` (the store is the Server's alone).
  wire::ReportReply Report(int64_t id) {
    wire::Envelope e;
    e.mutable_report()->set_job_id(id);
    Deliver(kClient, e);
    const wire::Envelope* reply = Last(kClient, wire::Envelope::kJobReport);
    return reply ? reply->job_report() : wire::ReportReply();
  }
  wire::JobInfo Job(int64_t id) { return Report(id).job(); }
  std::vector<wire::AttemptInfo> Attempts(int64_t id) {
    const wire::ReportReply report = Report(id);
    return {report.attempts().begin(), report.attempts().end()};
  }

  fs::path dir_;
  ServerOptions options_;
  std::unique_ptr<Server> server_;
  double now_ = 2'000'000'000.0;
  std::vector<std::pair<std::string, wire::Envelope>> sent_;
  const Agent a_{"agent-a"}, b_{"agent-b"}, c_{"agent-c"}, d_{"agent-d"};
};

TEST_F(ServerLifecycleTest, AnAttemptRunsToSuccessMessageByMessage) {
  Start();
  Register(a_);
  Register(b_);
  EXPECT_NE(Last(a_.identity(), wire::Envelope::kPulse), nullptr) << "a registration is answered";
  const int64_t job = Submit(2, "k1");
  ASSERT_GT(job, 0);
  server_->Step(0);
  const std::vector<std::string> assigned = Sent(wire::Envelope::kAssign);
  ASSERT_EQ(assigned.size(), 2u);
  const wire::Assign assign = Last(a_.identity(), wire::Envelope::kAssign)->assign();
  EXPECT_EQ(assign.attempt(), 1);
  EXPECT_FALSE(assign.resume());
  ASSERT_EQ(assign.places_size(), 2);
  const Agent& lead = assign.places(0).world() == a_.world ? a_ : b_;
  const Agent& other = &lead == &a_ ? b_ : a_;
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
  sent_.clear();

  Pass(2, Beating({&a_, &b_}, job, 1));
  Epoch(lead, job, 1, 1);
  const wire::Envelope* ack = Last(lead.identity(), wire::Envelope::kAck);
  ASSERT_NE(ack, nullptr);
  EXPECT_EQ(ack->ack().what(), "epoch");
  Epoch(other, job, 1, 2);
  EXPECT_EQ(Last(other.identity(), wire::Envelope::kError)->error().message().find("refused"), 0u)
      << "only the lead reports epochs";

  Result(lead, job, 1, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_SUCCEEDED);
  const std::vector<wire::Envelope> stops = Take(other.identity(), wire::Envelope::kStop);
  ASSERT_EQ(stops.size(), 1u) << "the gang's other slot is freed";
  EXPECT_EQ(stops[0].stop().reason(), "the attempt succeeded: this slot is free");
  ASSERT_EQ(Attempts(job).size(), 1u);
  EXPECT_EQ(Attempts(job)[0].end(), wire::OUTCOME_SUCCEEDED);
  std::ifstream epochs(dir_ / "runs" / std::to_string(job) / "epochs.csv");
  std::string header, row;
  std::getline(epochs, header);
  std::getline(epochs, row);
  EXPECT_EQ(header + "|" + row, "epoch,train_loss|1,0.5");
}

// A replica's join, beat and vote (Note [Step quorum]) reach the quorum only from a rank
// of the attempt holding its rank token, and only for an attempt that has a quorum: each
// refusal is an error to the sender, and nothing is answered.
TEST_F(ServerLifecycleTest, AReplicasMessagesAreRefusedFromStrangersAndForAttemptsWithoutAQuorum) {
  Start();
  Register(a_);
  Register(b_);
  Register(c_);
  const int64_t job = Submit(2, "k1");
  ASSERT_GT(job, 0);
  server_->Step(0);
  const std::vector<std::string> assigned = Sent(wire::Envelope::kAssign);
  ASSERT_EQ(assigned.size(), 2u);
  const Agent& stranger = std::find(assigned.begin(), assigned.end(), a_.identity()) == assigned.end()   ? a_
                          : std::find(assigned.begin(), assigned.end(), b_.identity()) == assigned.end() ? b_
                                                                                                         : c_;
  const Agent& member = &stranger == &a_ ? b_ : a_;
  sent_.clear();
  auto join = [&](const Agent& from, const std::string& token) {
    wire::Envelope e;
    wire::ReplicaJoin* m = e.mutable_replica_join();
    m->set_job_id(job);
    m->set_attempt(1);
    m->set_ring_host("198.18.0.1");
    m->set_ring_port(7001);
    m->set_world(from.world);
    m->set_rank_token(token);
    Deliver(from.identity(), e);
    const wire::Envelope* error = Last(from.identity(), wire::Envelope::kError);
    return error ? error->error().message() : std::string("(no error)");
  };
  EXPECT_EQ(join(member, std::string(32, 'x')).find("refused: a replica's join for "), 0u) << "a wrong rank token";
  EXPECT_EQ(join(stranger, stranger.rank_token()), "refused: a replica's join for job " + std::to_string(job) +
                                                       " attempt 1 from a rank that is not one of its ranks");
  EXPECT_EQ(join(member, member.rank_token()),
            "refused: job " + std::to_string(job) + " attempt 1 has no elastic quorum (it is not elastic, or over)");
  wire::Envelope vote;
  vote.mutable_step_vote()->set_job_id(job);
  vote.mutable_step_vote()->set_attempt(1);
  vote.mutable_step_vote()->set_world(member.world);
  vote.mutable_step_vote()->set_rank_token(member.rank_token());
  Deliver(member.identity(), vote);
  EXPECT_EQ(Last(member.identity(), wire::Envelope::kError)->error().message().find("refused: job "), 0u);
  EXPECT_TRUE(Sent(wire::Envelope::kStepDecision).empty());
  EXPECT_TRUE(Sent(wire::Envelope::kFenced).empty());
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "a refused message changes nothing";
}

// An elastic job (Note [Elastic finetune]) runs as a gang of its replicas, each slot
// leading one of its own: each Assign places that slot alone and names the replicas at
// full strength; every replica may report an epoch; one that fails leaves the attempt
// running (it leaves the quorum, and its slot is free), and the attempt succeeds once
// every replica has ended and one succeeded.
TEST_F(ServerLifecycleTest, AnElasticAttemptRunsAReplicaASlotAndOutlivesALostOne) {
  Start();
  for (const Agent* agent : {&a_, &b_, &c_}) Register(*agent);
  const int64_t job = SubmitFile(
      "name: elastic\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
      "distributed:\n  elastic:\n    min_replicas: 2\n    max_replicas: 3\n");
  ASSERT_GT(job, 0);
  server_->Step(0);
  for (const Agent* agent : {&a_, &b_, &c_}) {
    const wire::Envelope* assign = Last(agent->identity(), wire::Envelope::kAssign);
    ASSERT_NE(assign, nullptr) << agent->world;
    ASSERT_EQ(assign->assign().places_size(), 1) << "a replica a slot";
    EXPECT_EQ(assign->assign().places(0).world(), agent->world);
    EXPECT_EQ(assign->assign().elastic_replicas(), 3);
  }
  sent_.clear();
  Pass(2, Beating({&a_, &b_, &c_}, job, 1));
  Epoch(b_, job, 1, 1);
  EXPECT_EQ(Last(b_.identity(), wire::Envelope::kAck)->ack().what(), "epoch") << "any replica reports an epoch";
  Result(c_, job, 1, wire::OUTCOME_FAILED, "killed");
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "a lost replica is not the attempt's end";
  EXPECT_TRUE(Sent(wire::Envelope::kStop).empty()) << "nobody is stopped";
  Result(a_, job, 1, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "b still takes its steps";
  Result(b_, job, 1, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_SUCCEEDED);
  ASSERT_EQ(Attempts(job).size(), 1u);
  bool noted = false;
  const wire::ReportReply report = Report(job);
  for (const std::string& event : report.job().events())
    noted = noted || event.find("replica agent agent-c") != std::string::npos;
  EXPECT_TRUE(noted) << "the lost replica's end is an event";
}

// A pool's elastic replica is one rank: a job whose replicas are several is refused with
// exit 2, naming the field and where such a job runs (under --slurm).
TEST_F(ServerLifecycleTest, APoolRefusesAnElasticJobWhoseReplicasAreSeveralRanks) {
  Start();
  Register(a_);
  const int64_t job = SubmitFile(
      "name: elastic\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
      "resources:\n  ranks: 2\ndistributed:\n  elastic:\n    max_replicas: 2\n");
  EXPECT_EQ(job, 0);
  const wire::Envelope* error = Last(kClient, wire::Envelope::kError);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->error().code(), 2);
  EXPECT_EQ(error->error().message().find("job.yaml: resources.ranks: a pool's elastic replica is one rank"), 0u)
      << error->error().message();
  EXPECT_NE(error->error().message().find("coordinator --slurm"), std::string::npos);
}

// An elastic attempt whose every replica failed has failed, for the reason of the one that
// failed first.
TEST_F(ServerLifecycleTest, AnElasticAttemptFailsOnceEveryReplicaHasForTheFirstOnesReason) {
  Start();
  Register(a_);
  Register(b_);
  const int64_t job = SubmitFile(
      "name: elastic\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
      "resources:\n  max_restarts: 0\ndistributed:\n  elastic:\n    max_replicas: 2\n");
  ASSERT_GT(job, 0);
  server_->Step(0);
  Pass(2, Beating({&a_, &b_}, job, 1));
  Result(b_, job, 1, wire::OUTCOME_FAILED, "b's ring broke");
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
  Result(a_, job, 1, wire::OUTCOME_FAILED, "a's ring broke");
  EXPECT_EQ(Job(job).job_state(), wire::JOB_FAILED);
  ASSERT_EQ(Attempts(job).size(), 1u);
  EXPECT_NE(Attempts(job)[0].end_reason().find("the first: agent agent-b"), std::string::npos)
      << Attempts(job)[0].end_reason();
  EXPECT_NE(Attempts(job)[0].end_reason().find("b's ring broke"), std::string::npos);
}

constexpr const char* kElasticJob =
    "name: elastic\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
    "distributed:\n  elastic:\n    min_replicas: 1\n    max_replicas: 2\n";

// Note [Replacement replicas]: a lost replica is replaced on a free slot, preferring one
// where none of the attempt's replicas failed, as the attempt's next replica; a slot where
// one failed takes another after its backoff; the attempt is one attempt throughout, and
// it succeeds once a replica has taken the last step and the rest have ended.
TEST_F(ServerLifecycleTest, ALostReplicaIsReplacedOnAFreeSlotAsTheAttemptsNextReplica) {
  Start();
  for (const Agent* agent : {&a_, &b_, &c_}) Register(*agent);
  const int64_t job = SubmitFile(kElasticJob);
  ASSERT_GT(job, 0);
  server_->Step(0);
  ASSERT_NE(Last(a_.identity(), wire::Envelope::kAssign), nullptr);
  ASSERT_NE(Last(b_.identity(), wire::Envelope::kAssign), nullptr);
  EXPECT_EQ(Last(b_.identity(), wire::Envelope::kAssign)->assign().elastic_replica(), 1);
  EXPECT_EQ(Last(c_.identity(), wire::Envelope::kAssign), nullptr) << "two replicas at full strength";
  sent_.clear();
  Pass(2, Beating({&a_, &b_, &c_}, job, 1));
  Result(b_, job, 1, wire::OUTCOME_FAILED, "killed");
  Pass(1, [&] {
    Heartbeat(a_, job, 1);
    Heartbeat(b_);
    Heartbeat(c_);
  });
  const std::vector<wire::Envelope> onto_c = Take(c_.identity(), wire::Envelope::kAssign);
  ASSERT_EQ(onto_c.size(), 1u) << "the free slot where no replica failed takes the replacement";
  EXPECT_EQ(onto_c[0].assign().attempt(), 1);
  EXPECT_EQ(onto_c[0].assign().elastic_replica(), 2) << "the attempt's third replica";
  EXPECT_EQ(onto_c[0].assign().elastic_replicas(), 2);
  EXPECT_FALSE(onto_c[0].assign().resume()) << "it starts from nothing and is healed";
  ASSERT_EQ(Attempts(job).size(), 1u);
  EXPECT_EQ(Attempts(job)[0].placement(), "agent-a:0,agent-b:0,agent-c:0");

  // The replacement fails too: b, free since, takes the next one once its backoff is past.
  Result(c_, job, 1, wire::OUTCOME_FAILED, "killed again", 2);
  Pass(2, [&] {
    Heartbeat(a_, job, 1);
    Heartbeat(b_);
    Heartbeat(c_);
  });
  const std::vector<wire::Envelope> onto_b = Take(b_.identity(), wire::Envelope::kAssign);
  ASSERT_EQ(onto_b.size(), 1u);
  EXPECT_EQ(onto_b[0].assign().elastic_replica(), 3);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);

  Result(a_, job, 1, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "replica 3 has not ended";
  Pass(3, Beating({&b_, &c_}));
  EXPECT_TRUE(Sent(wire::Envelope::kAssign).empty()) << "no replacement once a replica took the last step";
  // Replica 1's result, sent again by b's agent (its first ack lost): not replica 3's end.
  Result(b_, job, 1, wire::OUTCOME_FAILED, "replica 1's result, sent again", 1);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "replica 3 runs on b";
  Result(b_, job, 1, wire::OUTCOME_FAILED, "no quorum takes this replica any more", 3);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_SUCCEEDED);
  ASSERT_EQ(Attempts(job).size(), 1u);
  std::string events;
  const wire::ReportReply report = Report(job);
  for (const std::string& event : report.job().events()) events += event + "\n";
  EXPECT_NE(events.find("replica 2 starts on agent agent-c"), std::string::npos) << events;
  EXPECT_NE(events.find("replica 3 starts on agent agent-b"), std::string::npos) << events;
}

// A replacement never takes a slot a queued job waits for.
TEST_F(ServerLifecycleTest, AQueuedJobWaitingForSlotsComesBeforeAReplacementReplica) {
  Start();
  for (const Agent* agent : {&a_, &b_, &c_}) Register(*agent);
  const int64_t job = SubmitFile(kElasticJob);
  ASSERT_GT(job, 0);
  server_->Step(0);
  sent_.clear();
  const int64_t waiting = Submit(3, "three");
  ASSERT_GT(waiting, 0);
  Pass(2, Beating({&a_, &b_, &c_}, job, 1));
  EXPECT_EQ(Job(waiting).waiting().rfind("Resources", 0), 0u) << Job(waiting).waiting();
  sent_.clear();
  Result(b_, job, 1, wire::OUTCOME_FAILED, "killed");
  Pass(3, [&] {
    Heartbeat(a_, job, 1);
    Heartbeat(b_);
    Heartbeat(c_);
  });
  EXPECT_TRUE(Sent(wire::Envelope::kAssign).empty()) << "b and c stay free for the queued job";
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
}

TEST_F(ServerLifecycleTest, ASilentRankFailsItsAttemptAndTheJobRunsAgainAfterItsBackoff) {
  const int64_t job = StartATwoRankJobOnAAndB();
  ASSERT_GT(job, 0);
  ASSERT_EQ(Sent(wire::Envelope::kAssign).size(), 2u);
  sent_.clear();

  // b falls silent: out of the registry 3 heartbeats later, taking attempt 1 with it.
  Pass(3, Beating({&a_, &b_}, job, 1));
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
  Pass(4, Beating({&a_}, job, 1));
  const wire::JobInfo queued = Job(job);
  EXPECT_EQ(queued.job_state(), wire::JOB_QUEUED);
  EXPECT_NE(queued.reason().find("agent agent-b (pid 100 on host-agent-b) stopped heartbeating"), std::string::npos)
      << queued.reason();
  EXPECT_EQ(queued.waiting().rfind("Backoff: requeued after a failed attempt; eligible again in ", 0), 0u);
  ASSERT_GE(queued.events_size(), 1);
  EXPECT_NE(queued.events(queued.events_size() - 1).find("in 4.0 s (restart 1 of 2)"), std::string::npos)
      << "restart 1's backoff is --restart-backoff's 4 s: " << queued.events(queued.events_size() - 1);
  // a is told to stop, and told again while its heartbeats still name the ended attempt.
  const std::vector<wire::Envelope> stops = Take(a_.identity(), wire::Envelope::kStop);
  ASSERT_GE(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().reason().rfind("attempt ended: agent agent-b", 0), 0u) << stops[0].stop().reason();

  // c joins; a says it is idle. Nothing starts before the backoff is over.
  Register(c_);
  Pass(2, Beating({&a_, &c_}));
  EXPECT_TRUE(Sent(wire::Envelope::kAssign).empty());
  Pass(3, Beating({&a_, &c_}));
  const wire::Envelope* again = Last(c_.identity(), wire::Envelope::kAssign);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->assign().attempt(), 2);
  EXPECT_TRUE(again->assign().resume()) << "a later attempt resumes from its checkpoint";
  const std::vector<wire::AttemptInfo> attempts = Attempts(job);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].end(), wire::OUTCOME_FAILED);
}

TEST_F(ServerLifecycleTest, RanksThatNeverStartTheirAssignmentFailItAfterTheGrace) {
  const int64_t job = StartATwoRankJobOnAAndB();
  ASSERT_GT(job, 0);
  ASSERT_EQ(Sent(wire::Envelope::kAssign).size(), 2u);
  // Both stay alive, but b's heartbeats never name the job (its Assign was lost).
  Pass(4, [&] {
    Heartbeat(a_, job, 1);
    Heartbeat(b_);  // alive, but never running the job
  });
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
  Pass(2, [&] {
    Heartbeat(a_, job, 1);
    Heartbeat(b_);  // alive, but never running the job
  });
  const wire::JobInfo failed = Job(job);
  EXPECT_EQ(failed.job_state(), wire::JOB_QUEUED);
  EXPECT_NE(failed.reason().find("did not start the attempt within 5 s"), std::string::npos) << failed.reason();
}

TEST_F(ServerLifecycleTest, AStallOfTheCoordinatorGivesEveryRankAFreshWindowNotAFailure) {
  const int64_t job = StartATwoRankJobOnAAndB();
  ASSERT_GT(job, 0);
  Pass(2, Beating({&a_, &b_}, job, 1));
  Pass(2, Beating({&a_}, job, 1));  // b silent for 2 of its 3 s when the coordinator stops
  now_ += 120;                      // stopped for two minutes: b's heartbeats wait in the socket, unheard
  server_->Step(0);
  Pass(1, Beating({&a_}, job, 1));  // 4 s since b was heard, but 1 s since the stall
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "the stall gave b a whole window";
  Pass(2, Beating({&a_, &b_}, job, 1));
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING);
  EXPECT_EQ(Attempts(job).size(), 1u);
  // Silent for real after it: the window counts again.
  Pass(5, Beating({&a_}, job, 1));
  EXPECT_EQ(Job(job).job_state(), wire::JOB_QUEUED);
}

TEST_F(ServerLifecycleTest, ARestartedCoordinatorReadoptsTheAttemptWhenItsRanksComeBack) {
  const int64_t job = StartATwoRankJobOnAAndB();
  ASSERT_GT(job, 0);
  Pass(1, Beating({&a_, &b_}, job, 1));
  server_.reset();  // the coordinator's process ends; the store holds the attempt
  sent_.clear();
  Start();
  Heartbeat(a_, job, 1);
  EXPECT_NE(Last(a_.identity(), wire::Envelope::kReregister), nullptr) << "an unknown rank is asked to register";
  Register(a_, job, 1);
  Register(b_, job, 1);
  Pass(8, Beating({&a_, &b_}, job, 1));
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "re-adopted, not given up after the 5 s grace";
  EXPECT_TRUE(Sent(wire::Envelope::kStop).empty());
  EXPECT_TRUE(Sent(wire::Envelope::kAssign).empty()) << "it was never started twice";
}

// An elastic attempt is re-adopted with the replicas that come back after a restart:
// the one that does not is ended alone, and the attempt goes on.
TEST_F(ServerLifecycleTest, ARestartedCoordinatorReadoptsAnElasticAttemptWithTheReplicasThatCameBack) {
  Start();
  for (const Agent* agent : {&a_, &b_}) Register(*agent);
  const int64_t job = SubmitFile(kElasticJob);
  ASSERT_GT(job, 0);
  server_->Step(0);
  Pass(1, Beating({&a_, &b_}, job, 1));
  server_.reset();
  sent_.clear();
  Start();
  Register(a_, job, 1);
  Pass(8, Beating({&a_}, job, 1));
  EXPECT_EQ(Job(job).job_state(), wire::JOB_RUNNING) << "a's replica goes on";
  ASSERT_EQ(Attempts(job).size(), 1u);
  std::string events;
  const wire::ReportReply report = Report(job);
  for (const std::string& event : report.job().events()) events += event + "\n";
  EXPECT_NE(events.find("re-adopted after a coordinator restart with 1 of its replicas"), std::string::npos) << events;
  EXPECT_NE(events.find("replica agent agent-b ended (failed): was not running its replica"), std::string::npos)
      << events;
  Result(a_, job, 1, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Job(job).job_state(), wire::JOB_SUCCEEDED);
}

// Note [History retention]: under --keep-history a job that ended long enough ago is
// forgotten (its status is gone, its run folder stays), while /metrics still counts it.
TEST_F(ServerLifecycleTest, KeepHistoryForgetsAnOldJobButNotItsTotals) {
  options_.keep_history_days = 1;
  const int64_t job = StartATwoRankJobOnAAndB();
  ASSERT_GT(job, 0);
  const wire::Envelope* assign = Last(a_.identity(), wire::Envelope::kAssign);
  ASSERT_NE(assign, nullptr);
  Pass(2, Beating({&a_, &b_}, job, 1));
  Result(assign->assign().places(0).world() == a_.world ? a_ : b_, job, 1, wire::OUTCOME_SUCCEEDED);
  ASSERT_EQ(Job(job).job_state(), wire::JOB_SUCCEEDED);
  for (int minute = 0; minute < 36 * 60; ++minute) {  // a day and a half, in wakes a minute apart
    now_ += 60;
    Heartbeat(a_);
    server_->Step(0);
  }
  sent_.clear();
  wire::Envelope status;
  status.mutable_status()->set_job_id(job);
  Deliver(kClient, status);
  const wire::Envelope* gone = Last(kClient, wire::Envelope::kError);
  ASSERT_NE(gone, nullptr) << "the job was forgotten";
  EXPECT_EQ(gone->error().message(), "no job " + std::to_string(job));
  EXPECT_TRUE(fs::exists(dir_ / "runs" / std::to_string(job) / "attempt-1")) << "its run folder stays";
  const std::string metrics = server_->AnswerWebQuery("/metrics").body;
  EXPECT_NE(metrics.find("trainyard_jobs{state=\"SUCCEEDED\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("trainyard_attempts_total{outcome=\"succeeded\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("trainyard_submit_to_running_seconds_count 1"), std::string::npos);
}

// Note [Worlds cannot be squatted]: the worlds table forgets a world unused for 30 days,
// so its id may be registered again with another token, but never a live agent's.
TEST_F(ServerLifecycleTest, AWorldUnusedForThirtyDaysIsForgottenButALiveAgentsIsNot) {
  Start();
  Register(a_);
  Register(c_);
  Pass(5, Beating({&a_}));  // c goes away for good
  for (int hour = 0; hour < 30 * 24 + 1; ++hour) {
    now_ += 3600;
    Heartbeat(a_);
    server_->Step(0);
  }
  wire::Envelope claim;
  wire::RankInfo* rank = claim.mutable_register_()->mutable_rank();
  rank->set_world(c_.world);
  rank->set_world_size(1);
  rank->set_host("elsewhere");
  claim.mutable_register_()->set_world_token(std::string(40, 'n'));
  claim.mutable_register_()->set_rank_token(std::string(40, 'm'));
  Deliver("id-new-c", claim);
  EXPECT_NE(Last("id-new-c", wire::Envelope::kPulse), nullptr) << "an unused world is free again";
  rank->set_world(a_.world);
  Deliver("id-new-a", claim);
  const wire::Envelope* refused = Last("id-new-a", wire::Envelope::kError);
  ASSERT_NE(refused, nullptr) << "a live agent's world stays bound";
  EXPECT_NE(refused->error().message().find("the world is bound to the token it first registered with"),
            std::string::npos);
}

// A search's whole life (Note [Search life cycle] and Note [ASHA] in coordinator/search.h),
// message by message: its trials are queued and placed, each lead's epoch row is judged
// at the rung, the trial that is not among the best is told to stop and ends STOPPED, the
// others run to the end, and the search ends naming its best trial, with search.csv.
TEST_F(ServerLifecycleTest, AnAshaSearchStopsItsWorstTrialAtTheRungAndEndsWithTheBest) {
  Start();
  for (const Agent* agent : {&a_, &b_, &c_}) Register(*agent);
  const int64_t search = SubmitFile(
      "name: sweep\nkind: search\nbase:\n  name: b\n  data: {train: train.tsv, tokenizer: {vocab: vocab.txt}}\n"
      "  resources: {ranks: 1}\nsearch:\n  method: asha\n  metric: train_loss\n  max_trials: 3\n"
      "  max_concurrent: 3\n  params:\n    train.lr: {log_uniform: [1.0e-4, 1.0e-2]}\n"
      "  asha: {min_epochs: 1, reduction_factor: 3, max_epochs: 3}\n");
  ASSERT_GT(search, 0);
  ASSERT_TRUE(StepUntil([&] { return Sent(wire::Envelope::kAssign).size() == 3; })) << "three trials placed";
  std::map<std::string, int64_t> trial_of;  // agent world -> its trial's job
  for (const Agent* agent : {&a_, &b_, &c_})
    trial_of[agent->world] = Last(agent->identity(), wire::Envelope::kAssign)->assign().job_id();
  const auto report = [&](const Agent& agent, int epoch, double loss) {
    wire::Envelope row;
    wire::EpochReport* r = row.mutable_epoch();
    r->set_job_id(trial_of[agent.world]);
    r->set_attempt(1);
    r->set_epoch(epoch);
    r->set_csv_header("epoch,train_loss");
    r->set_csv_line(std::to_string(epoch) + "," + std::to_string(loss));
    r->set_world(agent.world);
    r->set_rank_token(agent.rank_token());
    Deliver(agent.identity(), row);
  };
  sent_.clear();
  report(a_, 1, 0.5);  // the first judged at the rung goes on
  report(b_, 1, 0.9);  // not the best one of two: stopped
  report(c_, 1, 0.3);  // the best one of three goes on
  const std::vector<wire::Envelope> stops = Take(b_.identity(), wire::Envelope::kStop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().reason(), "stopped by its search at epoch 1");
  Result(b_, trial_of[b_.world], 1, wire::OUTCOME_STOPPED);
  EXPECT_EQ(Job(trial_of[b_.world]).job_state(), wire::JOB_STOPPED);
  sent_.clear();
  for (int epoch : {2, 3}) {
    report(a_, epoch, 0.5 - 0.05 * epoch);
    report(c_, epoch, 0.3 - 0.1 * epoch);
  }
  EXPECT_TRUE(Sent(wire::Envelope::kStop).empty()) << "no rung past epoch 1";
  Result(a_, trial_of[a_.world], 1, wire::OUTCOME_SUCCEEDED);
  Result(c_, trial_of[c_.world], 1, wire::OUTCOME_SUCCEEDED);
  Pass(2, Beating({&a_, &b_, &c_}));  // the search pass
  const wire::ReportReply done = Report(search);
  EXPECT_EQ(done.job().job_state(), wire::JOB_SUCCEEDED);
  ASSERT_EQ(done.search().trials_size(), 3);
  const wire::TrialInfo& best = done.search().trials(done.search().best_trial() - 1);
  EXPECT_EQ(best.job_id(), trial_of[c_.world]);
  EXPECT_NEAR(best.best(), 0.0, 1e-6);
  EXPECT_EQ(done.job().events(done.job().events_size() - 1).rfind("search ended: 3 trials: 2 succeeded, 1 stopped", 0),
            0u)
      << done.job().events(done.job().events_size() - 1);
  std::ifstream csv(dir_ / "runs" / std::to_string(search) / "search.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 4) << "a header and a row per trial";
}

}  // namespace
}  // namespace trainyard
