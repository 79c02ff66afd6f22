// The daemon's request loop, in process on a loopback socket: bad frames of every
// kind are counted and dropped, and the daemon keeps serving.
#include "coordinator/server.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <zmq_addon.hpp>

#include "common/curve/curve_keys.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWorldToken = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

// A worker rank speaking the pool protocol by hand over a real CURVE socket, with its
// own rank token (or a forger's, given explicitly).
class ScriptedRank {
 public:
  ScriptedRank(zmq::context_t& context, const std::string& endpoint, int rank, const PeerKeys& keys,
               std::string rank_token = NewSecretToken(), std::string world_token = kWorldToken)
      : socket_(context, zmq::socket_type::dealer),
        rank_(rank),
        rank_token_(std::move(rank_token)),
        world_token_(std::move(world_token)) {
    socket_.set(zmq::sockopt::linger, 0);
    MakeCurveClient(socket_, keys);
    socket_.connect(endpoint);
  }
  // Speaks as a rank of `world` instead of "w".
  ScriptedRank InWorld(std::string world) && {
    world_ = std::move(world);
    return std::move(*this);
  }
  void Send(wire::Envelope e) {
    e.set_version(kProtocolVersion);
    socket_.send(zmq::buffer(e.SerializeAsString()), zmq::send_flags::none);
  }
  void Register(int64_t job = 0, int attempt = 0) {
    wire::Envelope e;
    e.mutable_register_()->mutable_rank()->set_world(world_);
    e.mutable_register_()->mutable_rank()->set_rank(rank_);
    e.mutable_register_()->mutable_rank()->set_world_size(2);
    e.mutable_register_()->mutable_rank()->set_device("cpu");
    e.mutable_register_()->mutable_rank()->set_host("h");
    e.mutable_register_()->mutable_rank()->set_slot(rank_);
    e.mutable_register_()->set_job_id(job);
    e.mutable_register_()->set_attempt(attempt);
    e.mutable_register_()->set_world_token(world_token_);
    e.mutable_register_()->set_rank_token(rank_token_);
    Send(e);
  }
  wire::Envelope HeartbeatMessage(int64_t job, int attempt) const {
    wire::Envelope e;
    e.mutable_heartbeat()->set_world(world_);
    e.mutable_heartbeat()->set_rank(rank_);
    e.mutable_heartbeat()->set_job_id(job);
    e.mutable_heartbeat()->set_attempt(attempt);
    e.mutable_heartbeat()->set_rank_token(rank_token_);
    return e;
  }
  wire::Envelope Result(int64_t job, int attempt, const std::string& outcome = "succeeded") const {
    wire::Envelope result;
    result.mutable_result()->set_job_id(job);
    result.mutable_result()->set_attempt(attempt);
    result.mutable_result()->set_world(world_);
    result.mutable_result()->set_end(OutcomeFromName(outcome));
    result.mutable_result()->set_world_rank(rank_);
    result.mutable_result()->set_rank_token(rank_token_);
    return result;
  }
  wire::Envelope Epoch(int64_t job, int attempt, int epoch, const std::string& line,
                       const std::string& header = "epoch,loss") const {
    wire::Envelope e;
    e.mutable_epoch()->set_job_id(job);
    e.mutable_epoch()->set_attempt(attempt);
    e.mutable_epoch()->set_epoch(epoch);
    e.mutable_epoch()->set_csv_header(header);
    e.mutable_epoch()->set_csv_line(line);
    e.mutable_epoch()->set_world(world_);
    e.mutable_epoch()->set_world_rank(rank_);
    e.mutable_epoch()->set_rank_token(rank_token_);
    return e;
  }
  wire::Envelope Output(int64_t job, int attempt, int64_t offset, const std::string& text) const {
    wire::Envelope e;
    e.mutable_output()->set_job_id(job);
    e.mutable_output()->set_attempt(attempt);
    e.mutable_output()->set_offset(offset);
    e.mutable_output()->set_text(text);
    e.mutable_output()->set_world(world_);
    e.mutable_output()->set_world_rank(rank_);
    e.mutable_output()->set_rank_token(rank_token_);
    return e;
  }
  const std::string& token() const { return rank_token_; }
  wire::Envelope Exit(int signal) const {
    wire::Envelope e;
    e.mutable_rank_exit()->mutable_rank()->set_world(world_);
    e.mutable_rank_exit()->mutable_rank()->set_rank(rank_);
    e.mutable_rank_exit()->set_signal(signal);
    e.mutable_rank_exit()->set_rank_token(rank_token_);
    return e;
  }
  // The next message that is not a pulse, waiting up to `timeout_ms` while heartbeating
  // (naming `job`) as a live rank would.
  std::optional<wire::Envelope> Next(int timeout_ms, int64_t job = 0, int attempt = 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      Send(HeartbeatMessage(job, attempt));
      zmq::pollitem_t items[] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(50));
      zmq::message_t frame;
      while (socket_.recv(frame, zmq::recv_flags::dontwait)) {
        wire::Envelope e;
        EXPECT_TRUE(e.ParseFromArray(frame.data(), static_cast<int>(frame.size())));
        if (!e.has_pulse()) return e;
      }
    }
    return std::nullopt;
  }

 private:
  zmq::socket_t socket_;
  int rank_;
  std::string rank_token_, world_token_;
  std::string world_ = "w";
};

wire::Envelope StatusRequest(int64_t job) {
  wire::Envelope status;
  status.set_version(kProtocolVersion);
  status.mutable_status()->set_job_id(job);
  return status;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_server_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    options_.listen = "tcp://127.0.0.1:*";
    options_.state_path = (dir_ / "state.db").string();
    options_.max_message_bytes = int64_t(64) * 1024;
    options_.runs_dir = (dir_ / "runs").string();
    options_.heartbeat_s = 0.1;
    options_.liveness = 10;
    options_.restart_backoff_s = 0;
    options_.keys_dir = (dir_ / "keys").string();
    InitKeyDir(options_.keys_dir);
    worker_keys_ = LoadPeerKeys(options_.keys_dir, WireRole::kWorker);
    client_keys_ = LoadPeerKeys(options_.keys_dir, WireRole::kClient);
    Start();
  }
  void TearDown() override {
    Stop();
    fs::remove_all(dir_);
  }
  void Start() {
    stop_ = false;
    server_ = std::make_unique<Server>(options_);
    endpoint_ = server_->endpoint();
    reload_keys_ = false;
    thread_ = std::thread([this] { server_->Run(stop_, &reload_keys_); });
  }
  void Stop() {
    if (!server_) return;
    stop_ = true;
    thread_.join();
    server_.reset();
  }

  // A client socket, with the --init client key unless `keys` names another.
  zmq::socket_t Connect(const PeerKeys* keys = nullptr) {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 3000);
    MakeCurveClient(s, keys ? *keys : client_keys_);
    s.connect(endpoint_);
    return s;
  }

  // Sends `frames` and returns the reply envelope (or nullopt on timeout).
  std::optional<wire::Envelope> Send(zmq::socket_t& s, const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    zmq::message_t reply;
    if (!s.recv(reply)) return std::nullopt;
    wire::Envelope e;
    EXPECT_TRUE(e.ParseFromArray(reply.data(), static_cast<int>(reply.size())));
    return e;
  }

  // Asks for the job's status until it is `state` or `timeout_ms` have passed; returns
  // the last reply.
  std::optional<wire::Envelope> WaitForState(zmq::socket_t& client, int64_t job, const std::string& state,
                                             int timeout_ms) {
    const std::string status = StatusRequest(job).SerializeAsString();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      auto reply = Send(client, {status});
      if (!reply || (reply->has_job() && JobStateName(reply->job().job_state()) == state) ||
          std::chrono::steady_clock::now() > deadline)
        return reply;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the polling interval
    }
  }

  // The job's waiting reason once it starts with `prefix` (a scheduling pass sets it), or
  // the last one seen after 3 s.
  std::string WaitingReasonOnceItIs(zmq::socket_t& client, int64_t job, const std::string& prefix) {
    const std::string status = StatusRequest(job).SerializeAsString();
    std::string why;
    for (int poll = 0; poll < 150 && why.rfind(prefix, 0) != 0; ++poll) {
      if (poll > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the polling interval
      auto reply = Send(client, {status});
      if (reply && reply->has_job()) why = reply->job().waiting();
    }
    return why;
  }

  // Client keys for alice and bob (users) and root (an admin), each in dir_/<name>; the
  // server reads them when it starts.
  void AddUsers() {
    for (const char* user : {"alice", "bob"}) AddClientKey(options_.keys_dir, user, "user", (dir_ / user).string());
    AddClientKey(options_.keys_dir, "root", "admin", (dir_ / "root").string());
  }
  // A client socket with the key AddUsers() made for `user`.
  zmq::socket_t ConnectAs(const std::string& user) {
    const PeerKeys keys = LoadPeerKeys((dir_ / user).string(), WireRole::kClient);
    return Connect(&keys);
  }
  // ServerOptions::clock for the next Start(): the system clock plus the returned offset
  // in seconds, which the test sets. The loop's timers run as they would, and setting the
  // offset jumps the clock to a moment of the test's choosing.
  std::shared_ptr<std::atomic<double>> UseClockOffset() {
    auto offset = std::make_shared<std::atomic<double>>(0);
    options_.clock = [offset] { return WallNow() + offset->load(); };
    return offset;
  }

  // A valid 2-rank job (its files in dir_); returns its id, or 0.
  int64_t SubmitTwoRankJob(zmq::socket_t& client, int priority = 0) {
    std::ofstream(dir_ / "train.tsv") << "label\ttext\nen\thello world\n";
    std::ofstream(dir_ / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
    wire::Envelope submit;
    submit.set_version(kProtocolVersion);
    submit.mutable_submit()->set_yaml(
        "name: proto\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
        "resources:\n  ranks: 2\n  max_restarts: 1\n  priority: " +
        std::to_string(priority) + "\n");
    submit.mutable_submit()->set_source("job.yaml");
    submit.mutable_submit()->set_base_dir(dir_.string());
    auto submitted = Send(client, {submit.SerializeAsString()});
    return submitted && submitted->has_submitted() ? submitted->submitted().job_id() : 0;
  }

  // Ranks 0 and 1 of world "w" get attempt 1 of a 2-rank job, then the coordinator
  // stops (and the ranks' sockets close). Returns the job id, or 0.
  int64_t StartAttemptOneThenStop() {
    ScriptedRank r0 = Rank(0), r1 = Rank(1);
    r0.Register();
    r1.Register();
    zmq::socket_t client = Connect();
    const int64_t job = SubmitTwoRankJob(client);
    auto a0 = r0.Next(3000), a1 = r1.Next(3000);
    Stop();
    return a0 && a0->has_assign() && a1 && a1->has_assign() ? job : 0;
  }

  // One dashboard query through the loop's inproc socket, as DashboardServer asks it
  // (Note [Dashboard queries]): {status, content type, body}, or status 0 on timeout.
  WebReply WebQuery(const std::string& target) {
    zmq::socket_t socket(server_->context(), zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvtimeo, 3000);
    socket.connect(Server::kWebEndpoint);
    socket.send(zmq::buffer(target), zmq::send_flags::none);
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(socket, std::back_inserter(frames)) || frames.size() != 3) return {0, "", ""};
    return {std::stoi(frames[0].to_string()), frames[1].to_string(), frames[2].to_string()};
  }

  std::string ListRequest() {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_list();
    return e.SerializeAsString();
  }

  ScriptedRank Rank(int rank, std::string token = NewSecretToken(), std::string world_token = kWorldToken) {
    return ScriptedRank(context_, endpoint_, rank, worker_keys_, std::move(token), std::move(world_token));
  }

  fs::path dir_;
  ServerOptions options_;
  PeerKeys worker_keys_, client_keys_;
  std::unique_ptr<Server> server_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> reload_keys_{false};  // the coordinator's SIGHUP: the loop clears it once done
  std::thread thread_;
  zmq::context_t context_{1};
};

TEST_F(ServerTest, GarbageTruncatedAndWrongFrameCountsAreAnsweredWithErrors) {
  zmq::socket_t s = Connect();
  auto garbage = Send(s, {"\xff\xfe not a protobuf at all"});
  ASSERT_TRUE(garbage && garbage->has_error());
  EXPECT_EQ(garbage->error().code(), 2);
  std::string valid = ListRequest();
  wire::Envelope submit;
  submit.set_version(kProtocolVersion);
  submit.mutable_submit()->set_yaml(std::string(200, 'y'));
  std::string truncated = submit.SerializeAsString().substr(0, 20);
  auto cut = Send(s, {truncated});
  ASSERT_TRUE(cut && cut->has_error());
  auto three = Send(s, {valid, valid, valid});
  ASSERT_TRUE(three && three->has_error());
  EXPECT_NE(three->error().message().find("one protobuf Envelope frame"), std::string::npos);
  auto ok = Send(s, {valid});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->has_jobs());
  EXPECT_EQ(server_->bad_frames(), 3);
}

TEST_F(ServerTest, OversizedMessageIsRefusedAndOthersAreStillServed) {
  zmq::socket_t big = Connect();
  big.set(zmq::sockopt::rcvtimeo, 500);
  EXPECT_FALSE(Send(big, {std::string(size_t(200) * 1024, 'x')}).has_value());  // ZeroMQ drops that peer
  // Just over the limit: refused with the reason. Just under it: served (a List with
  // padding in an unknown field, which protobuf keeps and ignores).
  zmq::socket_t over = Connect();
  auto refused = Send(over, {std::string(64 * 1024 + 100, 'x')});
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_NE(refused->error().message().find("over the coordinator's 65536 (--max-message-bytes)"), std::string::npos)
      << refused->error().message();
  wire::Envelope padded;
  padded.set_version(kProtocolVersion);
  padded.mutable_list();
  const std::string padding(64 * 1024 - 64, 'p');
  std::string length;
  for (size_t n = padding.size(); n; n >>= 7) length += char((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
  std::string bytes = padded.SerializeAsString() + "\xfa\x7f" + length + padding;
  ASSERT_LE(bytes.size(), 64u * 1024);
  zmq::socket_t under = Connect();
  auto served = Send(under, {bytes});
  ASSERT_TRUE(served && served->has_jobs()) << (served ? served->DebugString().substr(0, 200) : "no reply");
  zmq::socket_t s = Connect();
  auto ok = Send(s, {ListRequest()});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->has_jobs());
}

// Submissions are checked on another thread against the size, node and depth caps, so
// the loop answers others meanwhile, and a refused one writes nothing.
TEST_F(ServerTest, OversizedAndNodeHeavySubmissionsAreRefusedWithoutStallingTheLoop) {
  Stop();
  options_.max_message_bytes = 4 << 20;
  options_.submit_budget.max_bytes = 256 << 10;
  Start();
  zmq::socket_t s = Connect();
  auto submit = [&](const std::string& yaml) {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_submit()->set_yaml(yaml);
    e.mutable_submit()->set_source("job.yaml");
    return Send(s, {e.SerializeAsString()});
  };
  std::string flat_list = "name: x\ndata: [";
  for (int i = 0; i < 60000; ++i) flat_list += "1,";
  flat_list += "1]\n";
  std::string deep = "name: x\ndata: " + std::string(100, '[') + std::string(100, ']') + "\n";
  const auto started = std::chrono::steady_clock::now();
  auto big = submit("name: x\n#" + std::string(512 << 10, 'x') + "\n");
  auto many = submit(flat_list);
  auto nested = submit(deep);
  ASSERT_TRUE(big && big->has_error() && many && many->has_error() && nested && nested->has_error());
  EXPECT_NE(big->error().message().find("at most 262144 are accepted"), std::string::npos) << big->error().message();
  EXPECT_NE(many->error().message().find("more than 10000 YAML nodes"), std::string::npos) << many->error().message();
  EXPECT_NE(nested->error().message().find("nested deeper than 32"), std::string::npos) << nested->error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  auto list = Send(s, {ListRequest()});
  ASSERT_TRUE(list && list->has_jobs());
  EXPECT_EQ(list->jobs().jobs_size(), 0);
}

TEST_F(ServerTest, WrongProtocolVersionIsRejected) {
  zmq::socket_t s = Connect();
  // A newer peer, and one whose agents still waited for the coordinator's pulses (version 5).
  for (uint32_t version : {99U, kProtocolVersion - 1}) {
    wire::Envelope e;
    e.set_version(version);
    e.mutable_list();
    auto reply = Send(s, {e.SerializeAsString()});
    ASSERT_TRUE(reply && reply->has_error());
    EXPECT_NE(reply->error().message().find("version " + std::to_string(version) + " is not supported"),
              std::string::npos)
        << reply->error().message();
  }
}

TEST_F(ServerTest, PoolLifeCycleOverTheWire) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);

  // Attempt 1 goes to both ranks; then they fall silent.
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  EXPECT_EQ(a0->assign().attempt(), 1);
  EXPECT_FALSE(a0->assign().resume());
  ASSERT_EQ(a0->assign().places_size(), 2);
  EXPECT_EQ(a0->assign().places(0).world(), "w");
  EXPECT_EQ(a0->assign().places(0).rank(), 0);
  EXPECT_EQ(a0->assign().places(1).rank(), 1);
  EXPECT_EQ(a0->assign().places(1).slot(), 1);  // as rank 1 registered it
  // Silent for longer than heartbeat x liveness (1 s): the coordinator gives them up.
  auto requeued = WaitForState(client, job, "QUEUED", 10000);
  ASSERT_TRUE(requeued && requeued->has_job());
  EXPECT_EQ(requeued->job().job_state(), wire::JOB_QUEUED);
  EXPECT_NE(requeued->job().reason().find("stopped heartbeating"), std::string::npos) << requeued->job().reason();

  // The ranks come back: attempt 2 resumes; a resent epoch report is stored once.
  r0.Register();
  r1.Register();
  auto next_assign = [](ScriptedRank& r) {  // skipping attempt 1's stop orders
    auto e = r.Next(3000);
    while (e && e->has_stop() && e->stop().attempt() == 1) e = r.Next(3000);
    return e;
  };
  auto b0 = next_assign(r0), b1 = next_assign(r1);
  ASSERT_TRUE(b0 && b0->has_assign() && b1 && b1->has_assign())
      << (b0 ? b0->DebugString() : "none") << (b1 ? b1->DebugString() : "none");
  EXPECT_EQ(b0->assign().attempt(), 2);
  EXPECT_TRUE(b0->assign().resume());
  const wire::Envelope epoch = r0.Epoch(job, 2, 1, "1,0.5");
  for (int copy = 0; copy < 2; ++copy) {
    r0.Send(epoch);
    auto ack = r0.Next(2000, job, 2);
    ASSERT_TRUE(ack && ack->has_ack());
    EXPECT_EQ(ack->ack().epoch(), 1);
  }
  // The lead (the job's rank 0) ran the attempt and its result decides it; the other
  // rank held its slot and is released by a StopJob, which it answers.
  wire::Envelope result = r0.Result(job, 2);
  result.mutable_result()->set_summary_json("{\"status\":\"succeeded\"}");
  r0.Send(result);
  ASSERT_TRUE(r0.Next(2000).value_or(wire::Envelope()).has_ack());
  auto release = r1.Next(2000, job, 2);
  ASSERT_TRUE(release && release->has_stop()) << (release ? release->DebugString() : "none");
  EXPECT_EQ(release->stop().attempt(), 2);
  r1.Send(r1.Result(job, 2, "released"));
  auto released = r1.Next(2000);
  while (released && released->has_stop()) released = r1.Next(2000);  // repeated while it named the job
  ASSERT_TRUE(released && released->has_ack());
  auto done = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(done && done->has_job());
  EXPECT_EQ(done->job().job_state(), wire::JOB_SUCCEEDED);
  EXPECT_EQ(done->job().attempts(), 2);
  std::ifstream csv(dir_ / "runs" / std::to_string(job) / "attempt-2" / "epochs.csv");
  std::stringstream text;
  text << csv.rdbuf();
  EXPECT_EQ(text.str(), "epoch,loss\n1,0.5\n");
  EXPECT_TRUE(fs::exists(dir_ / "runs" / std::to_string(job) / "summary.json"));
}

wire::Envelope OutputRequest(int64_t job, int attempt, int64_t offset, std::optional<int> rank = std::nullopt) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_logs()->set_job_id(job);
  e.mutable_logs()->set_output(true);
  e.mutable_logs()->set_attempt(attempt);
  e.mutable_logs()->set_offset(offset);
  if (rank) e.mutable_logs()->set_rank(*rank);
  return e;
}

// Note [Job output]: the lead's chunks are kept once each, in order, and read back by
// offset and rank through `logs --output`; a chunk from the other rank, or one that is
// not whole lines, is refused; the dashboard shows the tail.
TEST_F(ServerTest, AnAttemptsOutputIsKeptFromItsLeadAndReadByOffsetAndRank) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  const std::string first = "[rank 0] hello\n[rank 1] hi\nmpirun: a note\n";
  for (int copy = 0; copy < 2; ++copy) {  // the second is a resend
    r0.Send(r0.Output(job, 1, 0, first));
    auto ack = r0.Next(2000, job, 1);
    ASSERT_TRUE(ack && ack->has_ack()) << (ack ? ack->DebugString() : "none");
    EXPECT_EQ(ack->ack().what(), "output");
    EXPECT_EQ(ack->ack().offset(), int64_t(first.size()));
  }
  for (const wire::Envelope& forged : {r1.Output(job, 1, int64_t(first.size()), "[rank 1] not the lead\n"),
                                       r0.Output(job, 1, int64_t(first.size()), "no newline")}) {
    (forged.output().world_rank() == 1 ? r1 : r0).Send(forged);
    auto refused = (forged.output().world_rank() == 1 ? r1 : r0).Next(2000, job, 1);
    ASSERT_TRUE(refused && refused->has_error()) << (refused ? refused->DebugString() : "none");
    EXPECT_NE(refused->error().message().find("output of job"), std::string::npos) << refused->error().message();
  }
  r0.Send(r0.Output(job, 1, int64_t(first.size()), "[rank 1] bye\n"));
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_ack());

  auto all = Send(client, {OutputRequest(job, 0, 0).SerializeAsString()});
  ASSERT_TRUE(all && all->has_log_rows()) << (all ? all->DebugString() : "none");
  EXPECT_EQ(all->log_rows().output(), first + "[rank 1] bye\n");
  EXPECT_EQ(all->log_rows().attempt(), 1);
  EXPECT_EQ(all->log_rows().attempts(), 1);
  EXPECT_EQ(all->log_rows().job_state(), wire::JOB_RUNNING);
  const int64_t end = all->log_rows().output_offset();
  EXPECT_EQ(end, int64_t(first.size() + 13));
  auto rank1 = Send(client, {OutputRequest(job, 1, 0, 1).SerializeAsString()});
  ASSERT_TRUE(rank1 && rank1->has_log_rows());
  EXPECT_EQ(rank1->log_rows().output(), "[rank 1] hi\nmpirun: a note\n[rank 1] bye\n");
  auto later = Send(client, {OutputRequest(job, 1, end).SerializeAsString()});
  ASSERT_TRUE(later && later->has_log_rows());
  EXPECT_EQ(later->log_rows().output(), "");
  EXPECT_EQ(later->log_rows().output_offset(), end);
  for (const wire::Envelope& bad :
       {OutputRequest(job, 2, 0), OutputRequest(job, 1, -1), OutputRequest(job, 1, 0, -1)}) {
    auto refused = Send(client, {bad.SerializeAsString()});
    ASSERT_TRUE(refused && refused->has_error());
    EXPECT_EQ(refused->error().code(), 2) << refused->error().message();
  }
  const WebReply page = WebQuery("/api/jobs/" + std::to_string(job));
  ASSERT_EQ(page.status, 200) << page.body;
  const auto output = nlohmann::json::parse(page.body)["output"];
  EXPECT_EQ(output["attempt"], 1);
  EXPECT_EQ(output["tail"], first + "[rank 1] bye\n");
}

wire::Envelope ArtifactsOf(int64_t job) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_artifacts()->set_job_id(job);
  return e;
}

wire::Envelope FetchOf(int64_t job, const std::string& path, const std::string& host, int64_t offset) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_fetch()->set_job_id(job);
  e.mutable_fetch()->set_path(path);
  e.mutable_fetch()->set_host(host);
  e.mutable_fetch()->set_offset(offset);
  return e;
}

// The reply to a request sent earlier on `client`, or nullopt after its receive timeout.
std::optional<wire::Envelope> Receive(zmq::socket_t& client) {
  zmq::message_t reply;
  if (!client.recv(reply)) return std::nullopt;
  wire::Envelope e;
  if (!e.ParseFromArray(reply.data(), static_cast<int>(reply.size()))) return std::nullopt;
  return e;
}

// Note [Artifacts]: the owner's listing joins the coordinator's own files with those the
// agent on the job's host lists; a fetch from that host goes through the agent by offset;
// another user, a path out of the job's folder and a silent agent get clear answers.
TEST_F(ServerTest, AJobsFilesAreListedAndFetchedAcrossItsHostsByItsOwner) {
  AddUsers();
  Stop();
  Start();
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob");
  const int64_t job = SubmitTwoRankJob(alice);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  std::ofstream(dir_ / "runs" / std::to_string(job) / "summary.json") << "{}";

  alice.send(zmq::buffer(ArtifactsOf(job).SerializeAsString()));
  auto ask = r0.Next(3000, job, 1);
  ASSERT_TRUE(ask && ask->has_list_files()) << (ask ? ask->DebugString() : "none");
  EXPECT_EQ(ask->list_files().relative(), std::to_string(job));
  wire::Envelope listed;
  wire::FileList* list = listed.mutable_file_list();
  list->set_request_id(ask->list_files().request_id());
  list->set_world("w");
  list->set_world_rank(0);
  wire::Artifact* remote = list->add_files();
  remote->set_path("proto/model/w.bin");
  remote->set_size(5);
  wire::Envelope forged = listed;  // the right request, the wrong token: not taken
  forged.mutable_file_list()->set_rank_token("0123");
  r0.Send(forged);
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_error());
  list->set_rank_token(r0.token());
  r0.Send(listed);
  auto files = Receive(alice);
  ASSERT_TRUE(files && files->has_artifact_list()) << (files ? files->DebugString() : "none");
  std::set<std::string> seen;
  for (const auto& f : files->artifact_list().files()) seen.insert(f.host() + ":" + f.path());
  char here[256] = {};
  ASSERT_EQ(::gethostname(here, sizeof here - 1), 0);
  EXPECT_EQ(seen, (std::set<std::string>{"h:proto/model/w.bin", std::string(here) + ":summary.json"}));
  EXPECT_TRUE(files->artifact_list().unreachable().empty());

  alice.send(zmq::buffer(FetchOf(job, "proto/model/w.bin", "h", 2).SerializeAsString()));
  auto read = r0.Next(3000, job, 1);
  ASSERT_TRUE(read && read->has_read_file()) << (read ? read->DebugString() : "none");
  EXPECT_EQ(read->read_file().relative(), std::to_string(job) + "/proto/model/w.bin");
  EXPECT_EQ(read->read_file().offset(), 2);
  wire::Envelope chunk;
  chunk.mutable_file_chunk()->set_request_id(read->read_file().request_id());
  chunk.mutable_file_chunk()->set_data("345");
  chunk.mutable_file_chunk()->set_size(5);
  chunk.mutable_file_chunk()->set_world("w");
  chunk.mutable_file_chunk()->set_world_rank(0);
  chunk.mutable_file_chunk()->set_rank_token(r0.token());
  r0.Send(chunk);
  auto fetched = Receive(alice);
  ASSERT_TRUE(fetched && fetched->has_fetched()) << (fetched ? fetched->DebugString() : "none");
  EXPECT_EQ(fetched->fetched().data(), "345");
  EXPECT_EQ(fetched->fetched().size(), 5);
  auto local = Send(alice, {FetchOf(job, "summary.json", "", 0).SerializeAsString()});
  ASSERT_TRUE(local && local->has_fetched()) << (local ? local->DebugString() : "none");
  EXPECT_EQ(local->fetched().data(), "{}");

  for (const auto& [socket, request, words] :
       {std::make_tuple(&bob, ArtifactsOf(job), "belongs to alice"),
        std::make_tuple(&alice, FetchOf(job, "../state.db", "", 0), "not a file's place beneath the job's folder"),
        std::make_tuple(&alice, FetchOf(job, "attempt-1", "", 0), "not a regular file")}) {
    auto refused = Send(*socket, {request.SerializeAsString()});
    ASSERT_TRUE(refused && refused->has_error()) << (refused ? refused->DebugString() : "none");
    EXPECT_EQ(refused->error().code(), 2);
    EXPECT_NE(refused->error().message().find(words), std::string::npos) << refused->error().message();
  }
  // An agent that never answers: the listing comes after kFileQuerySeconds, naming its host.
  alice.send(zmq::buffer(ArtifactsOf(job).SerializeAsString()));
  ASSERT_TRUE(r0.Next(3000, job, 1).value_or(wire::Envelope()).has_list_files());
  auto partial = Receive(alice);
  ASSERT_TRUE(partial && partial->has_artifact_list()) << (partial ? partial->DebugString() : "none");
  ASSERT_EQ(partial->artifact_list().unreachable_size(), 1);
  EXPECT_EQ(partial->artifact_list().unreachable(0), "h: its agent did not answer within 2 s");
  EXPECT_EQ(partial->artifact_list().files_size(), 1);
}

// Note [Paged job listing]: /api/jobs walks every job once, newest first, in pages of
// `limit`, with the filters kept from page to page and `total` counting every page's
// jobs; a bad query is a 400 naming the field, not a listing of everything.
TEST_F(ServerTest, TheJobListingIsPagedNewestFirstAndFiltered) {
  Stop();
  AddUsers();
  Start();
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob");
  std::vector<int64_t> ids;  // bob's are ids[0], [3], [6] and [9]
  for (int i = 0; i < 12; ++i) {
    ids.push_back(SubmitTwoRankJob(i % 3 == 0 ? bob : alice));
    ASSERT_GT(ids.back(), 0);
  }
  const auto page = [&](const std::string& target) {
    const WebReply reply = WebQuery(target);
    EXPECT_EQ(reply.status, 200) << target << ": " << reply.body;
    return nlohmann::json::parse(reply.body);
  };
  const auto ids_of = [](const nlohmann::json& listing) {
    std::vector<int64_t> out;
    for (const auto& job : listing["jobs"]) out.push_back(job["id"]);
    return out;
  };
  std::vector<int64_t> walked;
  int pages = 0;
  for (std::string next = "/api/jobs?limit=5"; !next.empty() && pages < 10; ++pages) {
    const auto listing = page(next);
    EXPECT_EQ(listing["total"], 12);
    EXPECT_LE(listing["jobs"].size(), 5u);
    for (int64_t id : ids_of(listing)) walked.push_back(id);
    next = listing["next"].is_null() ? "" : listing["next"].get<std::string>();
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(walked, std::vector<int64_t>(ids.rbegin(), ids.rend()));
  EXPECT_TRUE(page("/api/jobs?limit=12")["next"].is_null());  // exactly one full page
  EXPECT_EQ(page("/api/jobs")["limit"], 200);

  using Ids = std::vector<int64_t>;
  const auto bobs = page("/api/jobs?user=bob&limit=2&state=queued,running");
  EXPECT_EQ(bobs["total"], 4);
  EXPECT_EQ(ids_of(bobs), (Ids{ids[9], ids[6]}));
  EXPECT_EQ(bobs["next"], "/api/jobs?limit=2&before=" + std::to_string(ids[6]) + "&state=QUEUED,RUNNING&user=bob");
  const auto rest = page(bobs["next"].get<std::string>());
  EXPECT_TRUE(ids_of(rest) == (Ids{ids[3], ids[0]}) && rest["next"].is_null()) << rest.dump();
  EXPECT_EQ(page("/api/jobs?state=SUCCEEDED")["total"], 0);

  for (const auto& [target, error] : std::vector<std::pair<std::string, std::string>>{
           {"/api/jobs?limit=0", "limit: expected a whole number from 1 to 1000, got '0'"},
           {"/api/jobs?limit=1001", "limit: expected a whole number from 1 to 1000, got '1001'"},
           {"/api/jobs?limit=-5", "limit: expected a whole number from 1 to 1000, got '-5'"},
           {"/api/jobs?before=x", "before: expected a whole number from 1 to 999999999999999999, got 'x'"},
           {"/api/jobs?state=DONE",
            "state: expected QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED or STOPPED "
            "(comma-separated), got 'DONE'"},
           {"/api/jobs?limit=1&limit=2", "'limit' is given twice in the query"},
           {"/api/jobs?user=%zz", "'%zz' has a '%' not followed by two hexadecimal digits"}}) {
    const WebReply reply = WebQuery(target);
    EXPECT_EQ(reply.status, 400) << target;
    EXPECT_EQ(nlohmann::json::parse(reply.body)["error"], error) << target;
  }
}

// Note [Peer text is bounded at reception]: one worker key holds at most
// --max-ranks-per-worker-key registered ranks; past it a registration is refused and
// stored nothing, a rank it holds still re-registers, and another key is not held back.
TEST_F(ServerTest, AWorkerKeyHoldsAtMostItsRegisteredRanks) {
  Stop();
  options_.max_ranks_per_worker_key = 2;
  const CurveKeyPair other = NewCurveKeyPair();
  std::ofstream(fs::path(options_.keys_dir) / "workers.allow", std::ios::app) << other.public_key << "\n";
  Start();
  const auto worlds_once = [&](const std::multiset<std::string>& want) {  // as /api/workers lists them
    std::multiset<std::string> worlds;
    for (int poll = 0; poll < 150 && worlds != want; ++poll) {
      if (poll > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the polling interval
      const auto workers = nlohmann::json::parse(WebQuery("/api/workers").body);
      worlds.clear();
      for (const auto& w : workers["workers"]) worlds.insert(w["world"].get<std::string>());
    }
    return worlds;
  };
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  ASSERT_EQ(worlds_once({"w", "w"}), (std::multiset<std::string>{"w", "w"}));  // both in before the third
  ScriptedRank third = Rank(0).InWorld("v");
  third.Register();
  const auto refused = third.Next(2000);
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_EQ(refused->error().message(), "refused: worker key " + worker_keys_.own.public_key.substr(0, 8) +
                                            "... already holds 2 registered ranks, the most "
                                            "--max-ranks-per-worker-key allows");
  r0.Register();  // held already: not a third
  EXPECT_FALSE(r0.Next(300).has_value()) << "a re-registration was refused";
  ScriptedRank others =
      ScriptedRank(context_, endpoint_, 0, PeerKeys{other, worker_keys_.server_public_key}).InWorld("u");
  others.Register();
  EXPECT_FALSE(others.Next(300).has_value()) << "another key's registration was refused";
  EXPECT_EQ(worlds_once({"u", "w", "w"}), (std::multiset<std::string>{"u", "w", "w"}));
}

// A listing over the wire is answered a page (--list-page) at a time, newest first, each
// reply naming where the next page starts, so that walking before_id sees every job once;
// a limit under the page is kept, and a negative before_id is refused. /metrics counts all.
TEST_F(ServerTest, AWireListingIsAnsweredAPageAtATime) {
  Stop();
  options_.list_page = 5;
  Start();
  zmq::socket_t client = Connect();
  std::vector<int64_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(SubmitTwoRankJob(client));
  const auto list = [&](int limit, int64_t before_id) {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_list()->set_limit(limit);
    e.mutable_list()->set_before_id(before_id);
    return Send(client, {e.SerializeAsString()}).value_or(wire::Envelope());
  };
  std::vector<int64_t> walked, page_sizes;
  int64_t before_id = 0;
  do {
    const wire::Envelope reply = list(0, before_id);
    ASSERT_TRUE(reply.has_jobs()) << reply.DebugString();
    for (const wire::JobInfo& j : reply.jobs().jobs()) walked.push_back(j.id());
    page_sizes.push_back(reply.jobs().jobs_size());
    before_id = reply.jobs().next_before_id();
  } while (before_id != 0 && page_sizes.size() < 10);
  EXPECT_EQ(page_sizes, (std::vector<int64_t>{5, 5, 2}));
  EXPECT_EQ(walked, std::vector<int64_t>(ids.rbegin(), ids.rend()));

  const wire::Envelope three = list(3, 0);
  EXPECT_EQ(three.jobs().jobs_size(), 3);
  EXPECT_EQ(three.jobs().next_before_id(), ids[9]);
  EXPECT_EQ(list(0, ids[2]).jobs().jobs_size(), 2);
  EXPECT_EQ(list(0, -1).error().message(), "a listing's before_id must be 0 (none) or more");
  // /metrics counts every job, whatever the page.
  const std::string metrics = WebQuery("/metrics").body;
  for (const char* line : {"trainyard_jobs{state=\"QUEUED\"} 12\n", "trainyard_jobs{state=\"RUNNING\"} 0\n",
                           "trainyard_user_jobs{user=\"\",state=\"QUEUED\"} 12\n"})
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
}

// The dashboard's API and /metrics, answered by the loop while a job runs: the job, its
// attempt and epoch row, both ranks alive, and 404 for what does not exist.
TEST_F(ServerTest, DashboardQueriesAreAnsweredFromTheLoopsState) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  r0.Send(r0.Epoch(job, 1, 1, "1,0.5"));
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_ack());

  const WebReply jobs = WebQuery("/api/jobs?ignored=1");
  ASSERT_EQ(jobs.status, 200) << jobs.body;
  EXPECT_EQ(jobs.content_type, "application/json");
  const auto listed = nlohmann::json::parse(jobs.body);
  ASSERT_EQ(listed["jobs"].size(), 1u);
  EXPECT_EQ(listed["jobs"][0]["state"], "RUNNING");
  EXPECT_EQ(listed["jobs"][0]["epochs"], 1);

  const auto one = nlohmann::json::parse(WebQuery("/api/jobs/" + std::to_string(job)).body);
  ASSERT_EQ(one["attempt_list"].size(), 1u);
  EXPECT_EQ(one["attempt_list"][0]["placement"], "w:0,w:1");
  EXPECT_TRUE(one["attempt_list"][0]["ended_at"].is_null());
  ASSERT_EQ(one["epochs"].size(), 1u);
  EXPECT_EQ(one["epochs"][0]["loss"], 0.5);
  EXPECT_TRUE(one["heatmap"].is_null());

  // Each rank names its job in its next heartbeat.
  r1.Send(r1.HeartbeatMessage(job, 1));
  nlohmann::json workers;
  for (int i = 0; i < 100; ++i) {
    workers = nlohmann::json::parse(WebQuery("/api/workers").body);
    if (workers["workers"].size() == 2 && workers["workers"][0]["job"] == job && workers["workers"][1]["job"] == job)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(workers["workers"].size(), 2u);
  for (const auto& w : workers["workers"]) {
    EXPECT_TRUE(w["alive"].get<bool>()) << w.dump();
    EXPECT_EQ(w["job"], job);
  }

  const std::string metrics = WebQuery("/metrics").body;
  for (const std::string& line :
       {std::string("trainyard_jobs{state=\"RUNNING\"} 1"), std::string("trainyard_queue_depth 0"),
        std::string("trainyard_submit_to_running_seconds_count 1"), std::string("trainyard_running_attempts 1"),
        "trainyard_job_ms_per_step{job=\"" + std::to_string(job) + "\",name=\"proto\",user=\"\"} 0"})
    EXPECT_NE(metrics.find(line + "\n"), std::string::npos) << line << " in\n" << metrics;
  // The pass that placed the job, at least, timed on the loop's own histogram.
  const std::string pass_count = "trainyard_scheduling_pass_seconds_count ";
  const size_t passes = metrics.find(pass_count);
  ASSERT_NE(passes, std::string::npos) << metrics;
  EXPECT_GE(std::stoi(metrics.substr(passes + pass_count.size())), 1) << metrics;

  for (const char* missing : {"/api/jobs/9999", "/api/jobs/abc", "/api/jobs/1/other", "/api/nothing", "/metricsx"}) {
    const WebReply reply = WebQuery(missing);
    EXPECT_EQ(reply.status, 404) << missing;
    EXPECT_TRUE(nlohmann::json::parse(reply.body).contains("error")) << missing;
  }
  EXPECT_EQ(nlohmann::json::parse(WebQuery("/api/jobs/9999").body)["error"], "no job 9999");
}

// Note [Files a job wrote]: a FIFO or a link to /dev/zero where the loop reads a job's
// files (the dashboard's heatmap, jobctl status's endpoints.json, a report's
// summary.json), and a symlinked attempt folder where it writes epochs.csv: every query
// is answered at once (a blocked loop would time the 3 s receives out), nothing is
// written through the link, and the job goes on.
TEST(CutText, KeepsShortTextAndCutsLongTextAtACharacterBoundaryWithAMark) {
  EXPECT_EQ(CutText("short", 64), "short");
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";  // U+00E9, two bytes each
  const std::string cut = CutText(accents, 64);
  EXPECT_LE(cut.size(), 64u);
  const size_t mark = cut.find(" [cut: 200 bytes in all]");
  ASSERT_NE(mark, std::string::npos) << cut;
  EXPECT_EQ(mark % 2, 0u) << "a character was split";
  EXPECT_EQ(cut.substr(0, mark), accents.substr(0, mark));
}

// A worker key's 60 KB log line (the test's message bound is 64 KiB; the coordinator's
// default is larger) is kept as at most kMaxPeerLineBytes, in the registry, in the
// dashboard's answer and in the failure reason stored for the job's owner.
TEST_F(ServerTest, APeersLongLogLinesAreCutAtReception) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  const std::string flood(60000, 'x');
  wire::Envelope beat = r0.HeartbeatMessage(job, 1);
  beat.mutable_heartbeat()->set_last_log_line(flood);
  r0.Send(beat);
  std::string line, body;
  for (int i = 0; i < 100 && line.empty(); ++i) {
    body = WebQuery("/api/workers").body;
    const nlohmann::json workers = nlohmann::json::parse(body);
    for (const auto& w : workers["workers"])
      if (w["rank"].get<int>() == 0) line = w["last_log_line"].get<std::string>();
    if (line.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(line.empty()) << body.substr(0, 500);
  EXPECT_LE(line.size(), kMaxPeerLineBytes);
  EXPECT_NE(line.find("[cut: 60000 bytes in all]"), std::string::npos) << line.substr(line.size() - 64);

  wire::Envelope exit = r1.Exit(9);
  exit.mutable_rank_exit()->set_last_log_line(flood);
  r1.Send(exit);
  auto failed = WaitForState(client, job, "QUEUED", 3000);  // requeued: max_restarts 1
  ASSERT_TRUE(failed && failed->has_job());
  std::string reason;
  for (const std::string& event : failed->job().events())
    if (event.find("signal 9") != std::string::npos) reason = event;
  ASSERT_FALSE(reason.empty());
  EXPECT_LT(reason.size(), kMaxPeerLineBytes + 512) << reason.substr(0, 200);
  EXPECT_NE(reason.find("[cut: 60000 bytes in all]"), std::string::npos) << reason.substr(0, 200);
}

TEST_F(ServerTest, FifosAndLinksInARunFolderNeverStallTheLoop) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  const fs::path run = dir_ / "runs" / std::to_string(job);
  fs::create_directories(run / "proto");
  ASSERT_EQ(::mkfifo((run / "proto" / "latency_heatmap.svg").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((run / "proto" / "endpoints.json").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", run / "summary.json");
  fs::create_directories(dir_ / "elsewhere");
  fs::remove_all(run / "attempt-1");
  fs::create_directory_symlink(dir_ / "elsewhere", run / "attempt-1");

  const WebReply one = WebQuery("/api/jobs/" + std::to_string(job));
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_TRUE(nlohmann::json::parse(one.body)["heatmap"].is_null());
  const WebReply svg = WebQuery("/api/jobs/" + std::to_string(job) + "/heatmap.svg");
  EXPECT_EQ(svg.status, 404);
  EXPECT_NE(svg.body.find("not a regular file"), std::string::npos) << svg.body;
  auto status = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(status && status->has_job());
  EXPECT_EQ(status->job().endpoints_size(), 0);
  wire::Envelope report;
  report.set_version(kProtocolVersion);
  report.mutable_report()->set_job_id(job);
  auto reported = Send(client, {report.SerializeAsString()});
  ASSERT_TRUE(reported && reported->has_job_report());
  EXPECT_TRUE(reported->job_report().summary_json().empty());

  r0.Send(r0.Epoch(job, 1, 1, "1,0.5"));
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_ack());  // the row is stored all the same
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere" / "epochs.csv"));
  EXPECT_TRUE(fs::exists(run / "epochs.csv"));
  r0.Send(r0.Result(job, 1));
  ASSERT_TRUE(r0.Next(2000).value_or(wire::Envelope()).has_ack());
  auto done = WaitForState(client, job, "SUCCEEDED", 3000);
  ASSERT_TRUE(done && done->has_job());
  EXPECT_EQ(done->job().job_state(), wire::JOB_SUCCEEDED);
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere" / "summary.json"));
}

// Note [Worlds cannot be squatted]: a worker-key holder who registers as a silent
// agent's world with another token is refused, before and after a coordinator restart,
// counted, and named on the dashboard; the real agent comes back with its own token.
TEST_F(ServerTest, ASilentWorldCannotBeSquatted) {
  {
    ScriptedRank real = Rank(0);
    real.Register();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // its socket closes; the coordinator hears nothing more from it
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // liveness: 10 x 0.1 s
  const std::string squatter_token = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  auto squat = [&] {
    ScriptedRank squatter = Rank(0, NewSecretToken(), squatter_token);
    squatter.Register();
    auto reply = squatter.Next(2000);
    return reply && reply->has_error() && reply->error().message().find("another world token") != std::string::npos;
  };
  EXPECT_TRUE(squat());
  Stop();
  Start();
  EXPECT_TRUE(squat());
  const auto workers = nlohmann::json::parse(WebQuery("/api/workers").body);
  EXPECT_EQ(workers["squat_attempts"], 1);  // counted since this start
  ASSERT_EQ(workers["warnings"].size(), 1u);
  EXPECT_NE(workers["warnings"][0]["text"].get<std::string>().find("agent w"), std::string::npos) << workers.dump();
  EXPECT_NE(WebQuery("/metrics").body.find("trainyard_squat_attempts_total 1\n"), std::string::npos);
  ScriptedRank back = Rank(0);  // the real world token, a new process's rank token
  back.Register();
  auto welcomed = back.Next(2000);
  EXPECT_FALSE(welcomed && welcomed->has_error()) << welcomed->DebugString();
  EXPECT_EQ(nlohmann::json::parse(WebQuery("/api/workers").body)["workers"].size(), 1u);
}

// Each forgery a tester made with hand-written frames, now made by an insider holding
// the worker key but not the ranks' tokens, and by a client key: every one is refused
// with an error, and the real ranks finish the job as attempt 1 with their own rows.
TEST_F(ServerTest, ForgedWorkerMessagesAreRefusedAndTheJobIsUnaffected) {
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t client = Connect();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_GT(job, 0);
  auto a0 = r0.Next(3000), a1 = r1.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
  auto refused = [](std::optional<wire::Envelope> reply, const std::string& what) {
    ASSERT_TRUE(reply && reply->has_error()) << what << ": " << (reply ? reply->DebugString() : "no reply");
    EXPECT_NE(reply->error().message().find("refused"), std::string::npos) << what << ": " << reply->error().message();
  };
  ScriptedRank forger0 = Rank(0, NewSecretToken()), forger1 = Rank(1, NewSecretToken());
  ScriptedRank ghost = Rank(0, NewSecretToken(), "ffffffffffffffffffffffffffffffff");
  for (const char* outcome : {"succeeded", "bad_input"}) {
    forger0.Send(forger0.Result(job, 1, outcome));
    refused(forger0.Next(2000), std::string("a forged ") + outcome + " result");
  }
  wire::Envelope ghost_result = ghost.Result(job, 1);
  ghost_result.mutable_result()->set_world("no-such-world");
  ghost.Send(ghost_result);
  refused(ghost.Next(2000), "a result from a world that does not exist");
  for (int i = 0; i < 3; ++i) {
    forger1.Send(forger1.Exit(SIGKILL));
    refused(forger1.Next(2000), "a forged RankExit");
  }
  forger0.Send(forger0.Epoch(job, 1, 1, "1,9.99"));
  refused(forger0.Next(2000), "a forged epoch report");
  r1.Send(r1.Epoch(job, 1, 1, "1,8.88"));  // a real rank, but not the job's rank 0
  refused(r1.Next(2000, job, 1), "an epoch report from job rank 1");
  forger1.Register();
  refused(forger1.Next(2000), "a registration over a live rank's slot");
  ghost.Register();
  refused(ghost.Next(2000), "a registration with another world token");
  forger1.Send(forger1.HeartbeatMessage(0, 0));  // would steal rank 1's identity and free it
  refused(forger1.Next(2000), "a spoofed heartbeat");
  wire::Envelope from_client = r0.Result(job, 1);
  from_client.set_version(kProtocolVersion);
  auto client_says = Send(client, {from_client.SerializeAsString()});
  refused(client_says, "a worker message from a client key");
  ASSERT_NE(client_says->error().message().find("client key cannot send worker messages"), std::string::npos);
  wire::Envelope submit;
  submit.mutable_submit()->set_yaml("name: x\n");
  r0.Send(submit);
  refused(r0.Next(2000, job, 1), "a client request from a worker key");

  auto still = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(still && still->has_job());
  EXPECT_EQ(still->job().job_state(), wire::JOB_RUNNING);
  EXPECT_EQ(still->job().attempts(), 1);
  // A real rank that is not the job's lead cannot end the attempt either.
  r1.Send(r1.Result(job, 1));
  ASSERT_TRUE(r1.Next(2000).value_or(wire::Envelope()).has_ack());
  auto member_said = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(member_said && member_said->has_job());
  EXPECT_EQ(member_said->job().job_state(), wire::JOB_RUNNING);
  // The lead finishes: its row, its result, attempt 1.
  r0.Send(r0.Epoch(job, 1, 1, "1,0.5"));
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_ack());
  r0.Send(r0.Result(job, 1));
  ASSERT_TRUE(r0.Next(2000).value_or(wire::Envelope()).has_ack());
  auto done = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(done && done->has_job());
  EXPECT_EQ(done->job().job_state(), wire::JOB_SUCCEEDED);
  EXPECT_EQ(done->job().attempts(), 1);
  std::ifstream csv(dir_ / "runs" / std::to_string(job) / "epochs.csv");
  std::stringstream text;
  text << csv.rdbuf();
  EXPECT_EQ(text.str(), "epoch,loss\n1,0.5\n");
  EXPECT_GE(server_->refused_messages(), 13);  // and the forgers' own heartbeats
}

// Without CURVE, or with a key that is not on an allowlist, a peer never gets a frame
// through: no reply, and nothing is stored.
TEST_F(ServerTest, UnauthenticatedPeersAreRefusedDuringTheHandshake) {
  // A refused handshake drops the connection, and a DEALER with no connection blocks in
  // send: the send timeout lets Send() give up instead (it hung under ASan's timing).
  zmq::socket_t plain(context_, zmq::socket_type::dealer);
  plain.set(zmq::sockopt::linger, 0);
  plain.set(zmq::sockopt::rcvtimeo, 1000);
  plain.set(zmq::sockopt::sndtimeo, 1000);
  plain.connect(endpoint_);
  zmq::socket_t stranger(context_, zmq::socket_type::dealer);
  stranger.set(zmq::sockopt::linger, 0);
  stranger.set(zmq::sockopt::rcvtimeo, 1000);
  stranger.set(zmq::sockopt::sndtimeo, 1000);
  PeerKeys unknown = client_keys_;
  unknown.own = NewCurveKeyPair();
  MakeCurveClient(stranger, unknown);
  stranger.connect(endpoint_);
  wire::Envelope submit;
  submit.set_version(kProtocolVersion);
  submit.mutable_submit()->set_yaml("name: x\n");
  for (zmq::socket_t* s : {&plain, &stranger}) EXPECT_FALSE(Send(*s, {submit.SerializeAsString()}).has_value());
  zmq::socket_t client = Connect();
  auto list = Send(client, {ListRequest()});
  ASSERT_TRUE(list && list->has_jobs());
  EXPECT_EQ(list->jobs().jobs_size(), 0);
}

// A job that finished while the coordinator was down: its ranks come back, one naming
// the job and one idle with its result still unacknowledged; the job is re-adopted and
// succeeds as attempt 1.
TEST_F(ServerTest, RestartReadoptsAJobThatFinishedDuringTheOutage) {
  const int64_t job = StartAttemptOneThenStop();
  ASSERT_GT(job, 0);
  Start();  // same state database, new port
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register(job, 1);
  r1.Register();
  r1.Send(r1.Result(job, 1));
  ASSERT_TRUE(r1.Next(2000).value_or(wire::Envelope()).has_ack());
  r0.Send(r0.Result(job, 1));
  ASSERT_TRUE(r0.Next(2000, job, 1).value_or(wire::Envelope()).has_ack());
  zmq::socket_t client = Connect();
  auto done = Send(client, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(done && done->has_job());
  EXPECT_EQ(done->job().job_state(), wire::JOB_SUCCEEDED);
  EXPECT_EQ(done->job().attempts(), 1);
  const auto& events = done->job().events();
  EXPECT_TRUE(std::any_of(events.begin(), events.end(),
                          [](const std::string& e) { return e.find("re-adopted") != std::string::npos; }));
}

// Note [Preemption] across a restart: the victim's lead alone is told to stop with a
// checkpoint; a coordinator restarted meanwhile still knows the attempt was preempted,
// tells the re-adopted lead again, and requeues the victim without a restart when it
// reports, before the urgent job takes the slots.
TEST_F(ServerTest, APreemptionSurvivesACoordinatorRestart) {
  Stop();
  options_.policy.preemption = true;
  Start();
  zmq::socket_t client = Connect();
  int64_t low = 0, urgent = 0;
  {
    ScriptedRank r0 = Rank(0), r1 = Rank(1);
    r0.Register();
    r1.Register();
    low = SubmitTwoRankJob(client);
    ASSERT_TRUE(r0.Next(3000).value_or(wire::Envelope()).has_assign());
    ASSERT_TRUE(r1.Next(3000).value_or(wire::Envelope()).has_assign());
    urgent = SubmitTwoRankJob(client, 10);
    auto stop = r0.Next(3000, low, 1);
    ASSERT_TRUE(stop && stop->has_stop());
    EXPECT_TRUE(stop->stop().preempt());
    EXPECT_EQ(stop->stop().grace_s(), 60);
    EXPECT_FALSE(r1.Next(500, low, 1).has_value());  // the gang's other slot holds on
    Stop();
  }
  Start();  // same state database, new port
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register(low, 1);
  r1.Register(low, 1);
  auto again = r0.Next(3000, low, 1);
  ASSERT_TRUE(again && again->has_stop()) << again.value_or(wire::Envelope()).DebugString();
  EXPECT_TRUE(again->stop().preempt());
  r0.Send(r0.Result(low, 1, "preempted"));
  ASSERT_TRUE(r0.Next(2000).value_or(wire::Envelope()).has_ack());
  auto released = r1.Next(3000, low, 1);
  ASSERT_TRUE(released && released->has_stop());
  r1.Send(r1.Result(low, 1, "released"));
  auto assign = r0.Next(3000);  // after the stop that ends the attempt on every slot
  while (assign && assign->has_stop()) assign = r0.Next(3000);
  ASSERT_TRUE(assign && assign->has_assign()) << assign.value_or(wire::Envelope()).DebugString();
  EXPECT_EQ(assign->assign().job_id(), urgent);
  client = Connect();
  auto status = Send(client, {StatusRequest(low).SerializeAsString()});
  ASSERT_TRUE(status && status->has_job());
  EXPECT_EQ(status->job().job_state(), wire::JOB_QUEUED);
  wire::Envelope report;
  report.set_version(kProtocolVersion);
  report.mutable_report()->set_job_id(low);
  auto attempts = Send(client, {report.SerializeAsString()});
  ASSERT_TRUE(attempts && attempts->has_job_report());
  ASSERT_EQ(attempts->job_report().attempts_size(), 1);
  EXPECT_EQ(attempts->job_report().attempts(0).end(), wire::OUTCOME_INTERRUPTED);
  EXPECT_EQ(attempts->job_report().attempts(0).end_reason().rfind("preempted by job " + std::to_string(urgent), 0), 0u)
      << attempts->job_report().attempts(0).end_reason();
}

// The lead (rank 0) reports `job`'s attempt succeeded and rank 1 is released, as in
// PoolLifeCycleOverTheWire.
void FinishAttempt(ScriptedRank& r0, ScriptedRank& r1, int64_t job, int attempt) {
  r0.Send(r0.Result(job, attempt));
  ASSERT_TRUE(r0.Next(2000).value_or(wire::Envelope()).has_ack());
  auto release = r1.Next(2000, job, attempt);
  ASSERT_TRUE(release && release->has_stop()) << (release ? release->DebugString() : "none");
  r1.Send(r1.Result(job, attempt, "released"));
  auto released = r1.Next(2000);
  while (released && released->has_stop()) released = r1.Next(2000);
  ASSERT_TRUE(released && released->has_ack());
}

// The next message for `r` that is not a StopJob (the release of an attempt that ended
// may be repeated while the rank's heartbeat still named it).
std::optional<wire::Envelope> NextPastStops(ScriptedRank& r) {
  auto e = r.Next(3000);
  while (e && e->has_stop()) e = r.Next(3000);
  return e;
}

// Note [Fair share]: a user's rank-seconds, each decayed by 2^(-age / H), for ranks that
// ran from t0 to t1, at `now`.
double DecayedRankSeconds(int ranks, double t0, double t1, double now, double half_life_s) {
  return ranks * half_life_s / std::log(2.0) *
         (std::exp2(-(now - t1) / half_life_s) - std::exp2(-(now - t0) / half_life_s));
}

// ServerOptions::clock, moved by hand: alice used ten times bob's rank-seconds, but four
// weeks (four half-lives) ago, so her decayed usage is the lower one. Usage and its decay
// are the store's, computed on the coordinator's clock; then, at equal priority, alice's
// job goes before bob's, which was submitted first and says it waits for fair share, and
// still does after a restart. Weeks pass in the test without a sleep.
TEST_F(ServerTest, FairShareDecaysUsageOnTheCoordinatorsClockAndOrdersTheQueueAcrossARestart) {
  Stop();
  AddUsers();
  auto offset = UseClockOffset();
  auto jump_to = [offset](double t) { offset->store(t - WallNow()); };
  options_.grace_s = 1;  // for the ranks to come back after the restart
  Start();
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob"), root = ConnectAs("root");
  const double half_life = options_.policy.fairshare_half_life_h * 3600, t0 = 1.8e9;
  const double t1 = t0 + 36000, t2 = t1 + 4 * half_life, t3 = t2 + 3600;
  int64_t blocker = 0, his = 0, hers = 0;
  {
    ScriptedRank r0 = Rank(0), r1 = Rank(1);
    r0.Register();
    r1.Register();
    auto run = [&](zmq::socket_t& owner, double from, double to) {
      jump_to(from);
      const int64_t job = SubmitTwoRankJob(owner);
      auto a0 = NextPastStops(r0), a1 = NextPastStops(r1);
      ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign());
      jump_to(to);
      FinishAttempt(r0, r1, job, 1);
    };
    run(alice, t0, t1);  // 2 ranks for 10 hours
    run(bob, t2, t3);    // 2 ranks for 1 hour, four weeks later

    wire::Envelope usage;
    usage.set_version(kProtocolVersion);
    usage.mutable_usage()->set_per_user(true);
    auto rows = Send(root, {usage.SerializeAsString()});
    ASSERT_TRUE(rows && rows->has_usage_rows());
    std::map<std::string, wire::UsageRow> by_user;
    for (const auto& row : rows->usage_rows().rows()) by_user[row.user()] = row;
    // Each moment is the jump's, give or take the loop's milliseconds (a second at most
    // is 2 rank-seconds, and moves a decayed figure by less than that).
    EXPECT_NEAR(by_user["alice"].rank_seconds(), 72000, 2);
    EXPECT_NEAR(by_user["bob"].rank_seconds(), 7200, 2);
    const double alice_decayed = DecayedRankSeconds(2, t0, t1, t3, half_life);
    const double bob_decayed = DecayedRankSeconds(2, t2, t3, t3, half_life);
    EXPECT_NEAR(by_user["alice"].fairshare_rank_seconds(), alice_decayed, 2);  // 4390
    EXPECT_NEAR(by_user["bob"].fairshare_rank_seconds(), bob_decayed, 2);      // 7185
    ASSERT_LT(alice_decayed, bob_decayed);

    // An admin's job holds the pool; bob submits, then alice.
    blocker = SubmitTwoRankJob(root);
    ASSERT_TRUE(NextPastStops(r0).value_or(wire::Envelope()).has_assign());
    ASSERT_TRUE(NextPastStops(r1).value_or(wire::Envelope()).has_assign());
    his = SubmitTwoRankJob(bob);
    hers = SubmitTwoRankJob(alice);
    ASSERT_GT(his, 0);
    ASSERT_GT(hers, 0);
    const std::string why = WaitingReasonOnceItIs(bob, his, "FairShare");
    EXPECT_EQ(why.rfind("FairShare: behind job " + std::to_string(hers) + " of alice", 0), 0u) << why;
    Stop();
  }
  Start();  // the same store and clock, a new port
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register(blocker, 1);
  r1.Register(blocker, 1);
  bob = ConnectAs("bob");
  const std::string why = WaitingReasonOnceItIs(bob, his, "FairShare");  // after the first pass since the restart
  EXPECT_EQ(why.rfind("FairShare: behind job " + std::to_string(hers) + " of alice", 0), 0u) << why;
  jump_to(t3 + 60);
  FinishAttempt(r0, r1, blocker, 1);
  auto next = NextPastStops(r0);
  ASSERT_TRUE(next && next->has_assign()) << next.value_or(wire::Envelope()).DebugString();
  EXPECT_EQ(next->assign().job_id(), hers);
}

// ServerOptions::clock again: a failed attempt's job waits out its restart backoff (30 s
// here) on the coordinator's clock, saying so, and is retried once the clock has passed it.
TEST_F(ServerTest, AFailedAttemptWaitsOutItsBackoffOnTheCoordinatorsClock) {
  Stop();
  auto offset = UseClockOffset();
  options_.restart_backoff_s = 30;
  // The scripted ranks send no heartbeats while the test waits out a second of passes
  // below: a liveness window of 10 s instead of the fixture's 1 s keeps them registered
  // however slowly the machine runs that second.
  options_.liveness = 100;
  Start();
  zmq::socket_t client = Connect();
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  const int64_t job = SubmitTwoRankJob(client);
  ASSERT_TRUE(NextPastStops(r0).value_or(wire::Envelope()).has_assign());
  ASSERT_TRUE(NextPastStops(r1).value_or(wire::Envelope()).has_assign());
  r0.Send(r0.Result(job, 1, "failed"));
  const std::string why = WaitingReasonOnceItIs(client, job, "Backoff");
  EXPECT_EQ(why.rfind("Backoff: requeued after a failed attempt; eligible again in ", 0), 0u) << why;
  // A second of the loop's passes brings the result's ack and the failed attempt's stop
  // orders, and no assignment.
  auto early = r0.Next(1000);
  while (early && (early->has_stop() || early->has_ack())) early = r0.Next(1000);
  EXPECT_FALSE(early.has_value()) << early->DebugString();
  offset->store(31);  // the backoff has passed
  auto retried = NextPastStops(r0);
  ASSERT_TRUE(retried && retried->has_assign()) << retried.value_or(wire::Envelope()).DebugString();
  EXPECT_EQ(retried->assign().job_id(), job);
  EXPECT_EQ(retried->assign().attempt(), 2);
}

// Ranks that never come back after a restart: after the grace period the attempt is
// given up and the job requeued, without using one of its restarts.
TEST_F(ServerTest, RestartRequeuesAJobWhoseRanksNeverComeBack) {
  const int64_t job = StartAttemptOneThenStop();
  ASSERT_GT(job, 0);
  options_.grace_s = 1;
  Start();
  zmq::socket_t client = Connect();
  auto status = WaitForState(client, job, "QUEUED", 10000);
  ASSERT_TRUE(status && status->has_job());
  EXPECT_EQ(status->job().job_state(), wire::JOB_QUEUED);
  EXPECT_NE(status->job().reason().find("interrupted"), std::string::npos) << status->job().reason();
  EXPECT_NE(status->job().reason().find("did not come back"), std::string::npos) << status->job().reason();
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

// Note [Client keys name users]: names and roles on clients.allow, checked line by line.
TEST(ClientKeys, NamesAndRolesAreReadAndBadLinesNameTheirFileAndLine) {
  const fs::path dir = fs::temp_directory_path() / ("ty_keys_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  InitKeyDir(dir.string());
  AddClientKey(dir.string(), "alice", "user", (dir / "alice").string());
  AddClientKey(dir.string(), "root", "admin", (dir / "root").string());
  EXPECT_THROW(AddClientKey(dir.string(), "alice", "user", (dir / "again").string()), KeyError);
  EXPECT_THROW(AddClientKey(dir.string(), "bad name", "user", (dir / "bad").string()), KeyError);
  const ServerKeys keys = LoadServerKeys(dir.string());
  ASSERT_EQ(keys.clients.size(), 3u);
  const std::string alice = LoadPeerKeys((dir / "alice").string(), WireRole::kClient).own.public_key;
  EXPECT_EQ(keys.clients.at(alice).user, "alice");
  EXPECT_FALSE(keys.clients.at(alice).admin);
  EXPECT_EQ(ZapUserId(WireRole::kClient, keys.clients.at(alice)), "client:alice:user");
  const std::string legacy = LoadPeerKeys(dir.string(), WireRole::kClient).own.public_key;
  EXPECT_TRUE(keys.clients.at(legacy).admin);  // a key with no name is an admin
  EXPECT_EQ(ZapUserId(WireRole::kClient, keys.clients.at(legacy)), "client");
  std::string role;
  ClientIdentity who;
  ParseZapUserId("client:root:admin", &role, &who);
  EXPECT_EQ(role, "client");
  EXPECT_EQ(who.user, "root");
  EXPECT_TRUE(who.admin);
  // A worker is tagged with its public key, which Z85 may write with ':' in it.
  ParseZapUserId(ZapUserId(WireRole::kWorker, {"a:b=c", true}), &role, &who);
  EXPECT_EQ(role, "worker");
  EXPECT_EQ(who.user, "a:b=c");
  EXPECT_FALSE(who.admin);

  std::ofstream(dir / "clients.allow", std::ios::app) << legacy.substr(0, 39) + "x carol superuser\n";
  try {
    LoadServerKeys(dir.string());
    ADD_FAILURE() << "a bad role was accepted";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("clients.allow:5: role 'superuser': expected user or admin"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Owners: a named key's jobs are its user's whatever jobctl says; another user cannot
// cancel them (and nothing changes), an admin can; a submission past --user-max-queued,
// or of more ranks than --user-max-ranks, is refused and leaves no job behind.
TEST_F(ServerTest, OnlyTheOwnerOrAnAdminCancelsAndQueuedQuotaRefusesCleanly) {
  Stop();
  AddUsers();
  options_.policy.user_max_queued = 1;
  Start();
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob"), root = ConnectAs("root");
  const int64_t job = SubmitTwoRankJob(alice);
  ASSERT_GT(job, 0);
  auto status = Send(alice, {StatusRequest(job).SerializeAsString()});
  ASSERT_TRUE(status && status->has_job());
  EXPECT_EQ(status->job().user(), "alice");
  EXPECT_EQ(status->job().events(0), "submitted by alice (priority 0, 2 ranks)");
  EXPECT_EQ(status->job().waiting(), "Resources: no pool agent is registered");

  EXPECT_EQ(SubmitTwoRankJob(alice), 0);  // over the queued quota
  auto list = Send(bob, {ListRequest()});
  ASSERT_TRUE(list && list->has_jobs());
  EXPECT_EQ(list->jobs().jobs_size(), 1);

  wire::Envelope cancel;
  cancel.set_version(kProtocolVersion);
  cancel.mutable_cancel()->set_job_id(job);
  auto refused = Send(bob, {cancel.SerializeAsString()});
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_EQ(refused->error().code(), 2);
  EXPECT_EQ(refused->error().message(),
            "refused: job " + std::to_string(job) +
                " belongs to alice; only its owner or an admin may cancel it, and bob is neither");
  status = Send(bob, {StatusRequest(job).SerializeAsString()});
  EXPECT_EQ(JobStateName(status->job().job_state()), "QUEUED");

  auto done = Send(root, {cancel.SerializeAsString()});
  ASSERT_TRUE(done && done->has_job()) << (done && done->has_error() ? done->error().message() : "");
  EXPECT_EQ(JobStateName(done->job().job_state()), "CANCELLED");
  EXPECT_EQ(done->job().reason(), "cancelled while queued by root");

  Stop();  // a job larger than one user may run is refused at submission: it could never start
  options_.policy.user_max_queued = 0;
  options_.policy.user_max_ranks = 1;
  Start();
  zmq::socket_t bob_again = ConnectAs("bob");
  EXPECT_EQ(SubmitTwoRankJob(bob_again), 0);
  list = Send(bob_again, {ListRequest()});
  ASSERT_TRUE(list && list->has_jobs());
  EXPECT_EQ(list->jobs().jobs_size(), 1);
}

// A submission of a random search over train.lr whose 2-rank base reads train.tsv and
// vocab.txt in `dir`; `params` replaces the default parameter lines.
wire::Envelope SearchSubmission(const fs::path& dir, int max_trials, int max_concurrent,
                                const std::string& params = "    train.lr: {log_uniform: [1.0e-4, 1.0e-2]}\n") {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_submit()->set_yaml(
      "name: sweep\nkind: search\nbase:\n  name: b\n  data: {train: train.tsv, tokenizer: {vocab: vocab.txt}}\n"
      "  resources: {ranks: 2}\nsearch:\n  method: random\n  metric: train_loss\n  max_trials: " +
      std::to_string(max_trials) + "\n  max_concurrent: " + std::to_string(max_concurrent) + "\n  params:\n" + params);
  e.mutable_submit()->set_source("sweep.yaml");
  e.mutable_submit()->set_base_dir(dir.string());
  return e;
}

TEST_F(ServerTest, AUserKeyMayNotTakeThePoolAndItsIdempotencyKeysAreItsOwn) {
  Stop();
  AddUsers();
  options_.policy.user_max_queued = 3;
  Start();
  std::ofstream(dir_ / "train.tsv") << "label\ttext\nen\thello world\n";
  std::ofstream(dir_ / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob"), root = ConnectAs("root");
  auto submit = [&](zmq::socket_t& client, const std::string& resources, const std::string& key) {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_submit()->set_yaml(
        "name: policy\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\nmodel:\n  preset: tiny\n"
        "resources:\n  ranks: 2\n" +
        resources);
    e.mutable_submit()->set_source("job.yaml");
    e.mutable_submit()->set_base_dir(dir_.string());
    e.mutable_submit()->set_idempotency_key(key);
    return Send(client, {e.SerializeAsString()});
  };
  auto refusal = [](const std::optional<wire::Envelope>& reply) {
    return reply && reply->has_error() && reply->error().code() == 2 ? reply->error().message() : "(not refused)";
  };
  EXPECT_EQ(refusal(submit(bob, "  priority: 1\n", "p1")),
            "refused: priority 1 is above --user-max-priority 0, the most a user key may ask; an admin key "
            "(--client-role admin) may ask more");
  EXPECT_NE(refusal(submit(bob, "  preemptible: false\n  priority: -1000000\n", "p2"))
                .find("preemptible: false is "
                      "for admin keys"),
            std::string::npos);
  auto admins = submit(root, "  priority: 1000\n  preemptible: false\n", "p3");
  ASSERT_TRUE(admins && admins->has_submitted()) << refusal(admins);

  // One key, two owners: two jobs. A resend finds its own; another file under it is refused.
  auto bobs = submit(bob, "", "shared");
  auto alices = submit(alice, "", "shared");
  ASSERT_TRUE(bobs && bobs->has_submitted() && alices && alices->has_submitted());
  EXPECT_TRUE(alices->submitted().created());
  const int64_t alice_job = alices->submitted().job_id();
  EXPECT_NE(alice_job, bobs->submitted().job_id());
  auto resent = submit(alice, "", "shared");
  ASSERT_TRUE(resent && resent->has_submitted());
  EXPECT_EQ(resent->submitted().job_id(), alice_job);
  EXPECT_FALSE(resent->submitted().created());
  EXPECT_EQ(refusal(submit(alice, "  max_restarts: 2\n", "shared")),
            "idempotency key 'shared' already names job " + std::to_string(alice_job) +
                " ('policy'), submitted with another file; a resend must carry the same file: give a new --key, or "
                "none");
  EXPECT_NE(refusal(submit(alice, "", std::string(257, 'k'))).find("at most 256 bytes"), std::string::npos);

  // A search counts as its max_concurrent trials against --user-max-queued (3): alice has 1.
  EXPECT_EQ(refusal(Send(alice, {SearchSubmission(dir_, 40, 40).SerializeAsString()})),
            "refused: user alice has 1 jobs queued and the search queues up to 40 trials at once (max_concurrent); "
            "--user-max-queued allows 3");
  auto list = Send(root, {ListRequest()});
  ASSERT_TRUE(list && list->has_jobs());
  EXPECT_EQ(list->jobs().jobs_size(), 3);  // root's, bob's and alice's
}

// Under --user-max-queued a search's trials wait while their user's queue is full. The
// limit is lowered across a restart below what is queued: a trial that ends then makes
// no room, and a job of the same user that is cancelled does.
TEST_F(ServerTest, ASearchsTrialsWaitWhileTheirUsersQueueIsFull) {
  zmq::socket_t client = Connect();
  const int64_t first_job = SubmitTwoRankJob(client);
  ASSERT_GT(first_job, 0);
  ASSERT_GT(SubmitTwoRankJob(client), 0);
  auto accepted = Send(client, {SearchSubmission(dir_, 4, 2).SerializeAsString()});
  ASSERT_TRUE(accepted && accepted->has_submitted());
  auto jobs_named = [&](const std::string& prefix) {
    std::vector<int64_t> ids;
    auto list = Send(client, {ListRequest()});
    if (list && list->has_jobs())
      for (const auto& j : list->jobs().jobs())
        if (j.name().rfind(prefix, 0) == 0 && !j.is_search()) ids.push_back(j.id());
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  auto trials_once = [&](size_t count, int timeout_ms) {
    std::vector<int64_t> trials = jobs_named("sweep.t");
    for (int waited = 0; trials.size() < count && waited < timeout_ms; waited += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      trials = jobs_named("sweep.t");
    }
    return trials;
  };
  const std::vector<int64_t> trials = trials_once(2, 3000);
  ASSERT_EQ(trials.size(), 2u);

  Stop();  // four queued, and now a limit of three
  options_.policy.user_max_queued = 3;
  Start();
  client = Connect();
  auto cancel = [&](int64_t job) {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_cancel()->set_job_id(job);
    auto reply = Send(client, {e.SerializeAsString()});
    return reply && reply->has_job() && JobStateName(reply->job().job_state()) == "CANCELLED";
  };
  ASSERT_TRUE(cancel(trials[0]));  // three queued: the search may run another trial, but the queue is full
  EXPECT_EQ(trials_once(3, 2500).size(), 2u) << "a trial was queued past --user-max-queued";
  ASSERT_TRUE(cancel(first_job));
  EXPECT_EQ(trials_once(3, 3000).size(), 3u) << "the trial did not take the room a cancelled job made";
}

wire::Envelope ListOf(std::vector<wire::JobState> states, const std::string& user, const std::string& name, int limit) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  for (wire::JobState state : states) e.mutable_list()->add_states(state);
  e.mutable_list()->set_user(user);
  e.mutable_list()->set_name_contains(name);
  e.mutable_list()->set_limit(limit);
  return e;
}

// jobctl list's filters answered by the coordinator, newest first, each job with its
// metric from its newest evaluation (Note [A job's metric]); status gives each event's
// time; a state outside the enum is bad input.
TEST_F(ServerTest, ListFiltersNewestFirstWithEachJobsMetricAndStatusTimesItsEvents) {
  Stop();
  AddUsers();
  Start();
  ScriptedRank r0 = Rank(0), r1 = Rank(1);
  r0.Register();
  r1.Register();
  zmq::socket_t alice = ConnectAs("alice"), bob = ConnectAs("bob");
  const double before = WallNow();
  const int64_t running = SubmitTwoRankJob(alice);
  auto a0 = r0.Next(3000);
  ASSERT_TRUE(a0 && a0->has_assign() && r1.Next(3000));
  const int64_t queued = SubmitTwoRankJob(bob), later = SubmitTwoRankJob(alice);
  r0.Send(r0.Epoch(running, 1, 1, "1,0.7,0.6,0.81,0.77", "epoch,train_loss,eval_loss,eval_acc,eval_f1"));
  ASSERT_TRUE(r0.Next(2000, running, 1).value_or(wire::Envelope()).has_ack());
  r0.Send(r0.Epoch(running, 1, 2, "2,0.5,0.4,0.86,0.83", "epoch,train_loss,eval_loss,eval_acc,eval_f1"));
  ASSERT_TRUE(r0.Next(2000, running, 1).value_or(wire::Envelope()).has_ack());

  auto ids = [&](const wire::Envelope& request) {
    std::vector<int64_t> out;
    auto reply = Send(bob, {request.SerializeAsString()});
    EXPECT_TRUE(reply && reply->has_jobs()) << (reply && reply->has_error() ? reply->error().message() : "");
    if (reply && reply->has_jobs())
      for (const wire::JobInfo& j : reply->jobs().jobs()) out.push_back(j.id());
    return out;
  };
  using Ids = std::vector<int64_t>;
  EXPECT_EQ(ids(ListOf({}, "", "", 0)), (Ids{later, queued, running}));
  EXPECT_EQ(ids(ListOf({}, "alice", "", 0)), (Ids{later, running}));
  EXPECT_EQ(ids(ListOf({wire::JOB_RUNNING}, "", "", 0)), Ids{running});
  EXPECT_EQ(ids(ListOf({wire::JOB_QUEUED}, "alice", "pro", 1)), Ids{later});
  EXPECT_EQ(ids(ListOf({}, "", "nothing-so-named", 0)), Ids{});

  auto list = Send(bob, {ListOf({wire::JOB_RUNNING}, "", "", 0).SerializeAsString()});
  ASSERT_TRUE(list && list->jobs().jobs_size() == 1);
  EXPECT_EQ(list->jobs().jobs(0).metric(), "eval_acc");  // the first besides the loss
  EXPECT_DOUBLE_EQ(list->jobs().jobs(0).metric_value(), 0.86);
  auto status = Send(bob, {StatusRequest(queued).SerializeAsString()});
  ASSERT_TRUE(status && status->has_job());
  EXPECT_EQ(status->job().metric(), "");  // not evaluated yet
  ASSERT_EQ(status->job().event_times_size(), status->job().events_size());
  ASSERT_GE(status->job().events_size(), 1);
  EXPECT_GE(status->job().event_times(0), before);
  EXPECT_LE(status->job().event_times(0), WallNow());

  wire::Envelope bad = ListOf({}, "", "", 0);
  bad.mutable_list()->add_states(static_cast<wire::JobState>(99));
  auto refused = Send(bob, {bad.SerializeAsString()});
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_EQ(refused->error().code(), 2);
  EXPECT_NE(refused->error().message().find("job state 99"), std::string::npos) << refused->error().message();
  refused = Send(bob, {ListOf({}, "", "", -1).SerializeAsString()});
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_EQ(refused->error().code(), 2);
}

// Whether `socket`, a new connection, is answered within `timeout_ms`: a key not on the
// allowlist is refused during the handshake, so its request never gets a reply, and a
// short wait shows it; an admitted key's handshake may take long on a loaded machine.
bool Answered(zmq::socket_t socket, const std::string& request, int timeout_ms) {
  socket.set(zmq::sockopt::rcvtimeo, timeout_ms);
  socket.send(zmq::buffer(request), zmq::send_flags::none);
  zmq::message_t reply;
  return socket.recv(reply).has_value();
}

// Sets the flag the coordinator's SIGHUP sets and waits until the loop has re-read the
// keys.
void SighupAndWait(std::atomic<bool>& reload_keys, const Server& server) {
  const int64_t before = server.key_reloads();
  reload_keys = true;
  for (int i = 0; i < 1000 && server.key_reloads() == before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(server.key_reloads(), before) << "the loop did not re-read the keys";
}

// SIGHUP re-reads the allowlists without a restart: a key added after the start is
// refused, then admitted; a key removed is refused at its next connection while its
// connection already made still works; a list that no longer loads keeps the lists in
// use.
TEST_F(ServerTest, SighupAdmitsAddedClientKeysAndRefusesRemovedOnesForNewConnections) {
  Stop();
  AddUsers();
  Start();
  const std::string list = ListRequest();
  zmq::socket_t bob_before = ConnectAs("bob");
  ASSERT_TRUE(Send(bob_before, {list}).has_value());
  AddClientKey(options_.keys_dir, "carol", "user", (dir_ / "carol").string());
  EXPECT_FALSE(Answered(ConnectAs("carol"), list, 700)) << "admitted before the lists were re-read";

  SighupAndWait(reload_keys_, *server_);
  EXPECT_TRUE(Answered(ConnectAs("carol"), list, 10000));

  // bob's line goes: his next connection is refused, the one he has is not.
  const fs::path allow = fs::path(options_.keys_dir) / "clients.allow";
  std::stringstream kept;
  {
    std::ifstream in(allow);
    for (std::string line; std::getline(in, line);)
      if (line.find(" bob ") == std::string::npos) kept << line << "\n";
  }
  std::ofstream(allow, std::ios::trunc) << kept.str();
  SighupAndWait(reload_keys_, *server_);
  EXPECT_FALSE(Answered(ConnectAs("bob"), list, 700));
  EXPECT_TRUE(Send(bob_before, {list}).has_value());
  EXPECT_TRUE(Answered(ConnectAs("alice"), list, 10000));

  // A bad line: nothing changes, carol is still admitted and bob still refused.
  std::ofstream(allow, std::ios::app) << "not-a-key user\n";
  SighupAndWait(reload_keys_, *server_);
  EXPECT_TRUE(Answered(ConnectAs("carol"), list, 10000));
  EXPECT_FALSE(Answered(ConnectAs("bob"), list, 700));
  EXPECT_FALSE(server_->ReloadKeys());
}

// A search over the wire (Note [Search life cycle] in coordinator/search.h): its trials
// become ordinary queued jobs, at most max_concurrent at once; a restart submits none
// twice; a cancel reaches its trials; a bad search is refused with nothing written.
TEST_F(ServerTest, ASearchQueuesItsTrialsAsJobsOnceAcrossARestart) {
  std::ofstream(dir_ / "train.tsv") << "label\ttext\nen\thello world\n";
  std::ofstream(dir_ / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
  auto submit = [&](zmq::socket_t& client, const std::string& params) {
    return Send(client, {SearchSubmission(dir_, 3, 2, params).SerializeAsString()});
  };
  auto jobs = [&](zmq::socket_t& client) {  // oldest first: the listing's order reversed
    auto list = Send(client, {ListRequest()});
    return list && list->has_jobs()
               ? std::vector<wire::JobInfo>(list->jobs().jobs().rbegin(), list->jobs().jobs().rend())
               : std::vector<wire::JobInfo>{};
  };
  auto wait_for_jobs = [&](zmq::socket_t& client, size_t count) {
    for (int i = 0; i < 100 && jobs(client).size() < count; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return jobs(client);
  };
  zmq::socket_t client = Connect();
  auto refused = submit(client, "    train.lr: {uniform: [0.5, 0.2]}\n");
  ASSERT_TRUE(refused && refused->has_error());
  EXPECT_EQ(refused->error().code(), 2);
  EXPECT_NE(refused->error().message().find("sweep.yaml:13:25: search.params.train.lr.uniform: expected low < high"),
            std::string::npos)
      << refused->error().message();
  EXPECT_TRUE(jobs(client).empty());

  auto accepted = submit(client, "    train.lr: {log_uniform: [1.0e-4, 1.0e-2]}\n");
  ASSERT_TRUE(accepted && accepted->has_submitted()) << (accepted->has_error() ? accepted->error().message() : "");
  const int64_t search = accepted->submitted().job_id();
  auto listed = wait_for_jobs(client, 3);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_TRUE(listed[0].is_search());
  EXPECT_EQ(JobStateName(listed[0].job_state()), "RUNNING");
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(listed[i].search_id(), search);
    EXPECT_EQ(listed[i].name(), "sweep.t0" + std::to_string(i));
    EXPECT_EQ(JobStateName(listed[i].job_state()), "QUEUED");
    EXPECT_EQ(listed[i].ranks(), 2);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(jobs(client).size(), 3u);  // the third waits for one of the first two to end

  Stop();
  Start();
  client = Connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(jobs(client).size(), 3u);  // no trial submitted twice

  wire::Envelope cancel;
  cancel.set_version(kProtocolVersion);
  cancel.mutable_cancel()->set_job_id(search);
  auto cancelled = Send(client, {cancel.SerializeAsString()});
  ASSERT_TRUE(cancelled && cancelled->has_job());
  EXPECT_EQ(JobStateName(cancelled->job().job_state()), "CANCELLED");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  listed = jobs(client);
  ASSERT_EQ(listed.size(), 3u);  // the third trial was never submitted
  for (const auto& j : listed) EXPECT_EQ(JobStateName(j.job_state()), "CANCELLED") << j.name();
}

}  // namespace
}  // namespace trainyard
