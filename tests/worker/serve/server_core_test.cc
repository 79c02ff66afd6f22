// Serving's core in-process (worker/serve/server_core.h): versions, reloads, admission
// and expiry, over the real link (a ZeroMQ PAIR socket on ipc://, model_link.h's
// protocol). The model process's end is scripted here: it answers loads at once and each
// batch after a set time, with logits that say which version computed which rows, and it
// records every message in the order it got them. The real model process (the worker's
// `kind: serve`) is what serve_<case> and serve_overload run against.
#include "worker/serve/server_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/safetensors.h"
#include "tests/common/scratch_dir.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kLabels = 2;

// A version folder as a finetune job writes one, as small as ReadVersion accepts.
void WriteVersion(const fs::path& folder, const std::string& model_type = "bert") {
  fs::create_directories(folder);
  std::ofstream(folder / "config.json") << R"({"model_type": ")" << model_type
                                        << R"(", "architectures": ["BertForSequenceClassification"],
      "id2label": {"0": "no", "1": "yes"}, "max_position_embeddings": 32, "vocab_size": 16, "pad_token_id": 0})";
  std::ofstream(folder / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n";
  const float weight[2] = {0, 0};
  WriteSafetensors((folder / "model.safetensors").string(), {{"w", "F32", {2}, weight}}, {});
}

// The model process's end of the link, scripted. A batch's logits for row r are
// (version, the row's first token), so an answer shows what computed it.
class ScriptedModelProcess {
 public:
  ScriptedModelProcess(const std::string& endpoint, std::chrono::milliseconds per_batch)
      : per_batch_(per_batch), socket_(context_, zmq::socket_type::pair) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~ScriptedModelProcess() {
    done_ = true;
    thread_.join();
  }

  // Every message so far: "load m 1", "run m 1", "unload m 1", "stop".
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  // The first token of every row computed so far.
  std::multiset<int64_t> computed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return computed_;
  }

 private:
  void Loop() {
    while (!done_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 20ms) == 0) continue;
      std::vector<zmq::message_t> frames;
      do {
        frames.emplace_back();
        (void)socket_.recv(frames.back());
      } while (socket_.get(zmq::sockopt::rcvmore));
      const nlohmann::json h = nlohmann::json::parse(frames[0].to_string_view());
      const std::string op = h["op"];
      const std::string what =
          op == "stop" ? op
                       : op + " " + h["model"].get<std::string>() + " " + std::to_string(h["version"].get<int64_t>());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        messages_.push_back(what);
      }
      if (op == "load") Reply({{"op", "loaded"}, {"model", h["model"]}, {"version", h["version"]}, {"ok", true}});
      if (op == "run") Run(h, frames);
    }
  }

  void Run(const nlohmann::json& h, const std::vector<zmq::message_t>& frames) {
    std::this_thread::sleep_for(per_batch_);
    const int rows = h["rows"], seq = h["seq"];
    const auto* ids = static_cast<const int64_t*>(frames.at(1).data());
    std::vector<float> logits;
    for (int r = 0; r < rows; ++r) {
      logits.push_back(float(h["version"].get<int64_t>()));
      logits.push_back(float(ids[size_t(r) * seq]));
      std::lock_guard<std::mutex> lock(mutex_);
      computed_.insert(ids[size_t(r) * seq]);
    }
    const double ms = std::chrono::duration<double, std::milli>(per_batch_).count();
    Reply({{"op", "result"}, {"id", h["id"]}, {"ok", true}, {"compute_ms", ms}, {"labels", kLabels}},
          zmq::message_t(logits.data(), logits.size() * sizeof(float)));
  }

  void Reply(const nlohmann::json& header, std::optional<zmq::message_t> frame = std::nullopt) {
    const std::string text = header.dump();
    socket_.send(zmq::buffer(text), frame ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (frame) socket_.send(*frame, zmq::send_flags::none);
  }

  const std::chrono::milliseconds per_batch_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
  std::multiset<int64_t> computed_;
  std::thread thread_;
};

class ServerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(root_ / "repository");
    spec_.repository = (root_ / "repository").string();
    spec_.poll_s = 0;  // versions load on request only: the test decides when
    spec_.max_batch_size = 1;
    spec_.max_queue_delay_ms = 0;
  }
  void TearDown() override {
    if (core_) core_->Stop();
    core_.reset();
    model_.reset();
  }

  // The core and the scripted model process, each batch taking `per_batch`.
  void Start(std::chrono::milliseconds per_batch) {
    const std::string endpoint = "ipc://" + (root_ / "link").string();
    model_ = std::make_unique<ScriptedModelProcess>(endpoint, per_batch);
    core_ = std::make_unique<ServerCore>(spec_, endpoint);
    core_->Start();
  }

  fs::path Version(const std::string& model, int version) {
    return root_ / "repository" / model / std::to_string(version);
  }

  // A request for `model`'s serving version whose one row starts with `token`.
  RequestPtr Request(const std::string& model, int32_t token, double timeout_ms = 10'000) {
    InferStatus status = InferStatus::kOk;
    std::string message;
    auto meta = core_->Resolve(model, "", &status, &message);
    EXPECT_TRUE(meta) << message;
    if (!meta) return nullptr;
    auto request = std::make_shared<InferRequest>(meta, std::vector<std::vector<int32_t>>{{token, 6, 3}}, 0,
                                                  DeadlineAfter(timeout_ms, timeout_ms));
    core_->Submit(request);
    return request;
  }

  InferStatus LoadModel(const std::string& model) {
    std::string message;
    const InferStatus status = core_->Load(model, &message);
    EXPECT_TRUE(status == InferStatus::kOk || !message.empty());
    last_message_ = message;
    return status;
  }

  ScratchDir scratch_{"ty_server_core_test"};
  const fs::path root_ = scratch_.path();
  ServeSpec spec_;
  std::unique_ptr<ScriptedModelProcess> model_;
  std::unique_ptr<ServerCore> core_;
  std::string last_message_;
};

float VersionThatComputed(const RequestPtr& r) { return r->logits().at(0); }

// The scripted model process's messages once `expected` is among them, or after 5 s.
std::vector<std::string> MessagesOnce(const ScriptedModelProcess& model, const std::string& expected) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::vector<std::string> messages = model.messages();
  while (std::find(messages.begin(), messages.end(), expected) == messages.end() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    messages = model.messages();
  }
  return messages;
}

TEST_F(ServerCoreTest, ServesTheNewestVersionAndReloadsWithoutDroppingARequest) {
  WriteVersion(Version("m", 1));
  Start(100ms);
  ASSERT_EQ(LoadModel("m"), InferStatus::kOk) << last_message_;
  EXPECT_TRUE(core_->ready());

  // Three requests on version 1, one computing and two queued, when version 2 arrives.
  std::vector<RequestPtr> on_one;
  for (int32_t token : {5, 6, 7}) on_one.push_back(Request("m", token));
  WriteVersion(Version("m", 2));
  ASSERT_EQ(LoadModel("m"), InferStatus::kOk) << last_message_;
  const RequestPtr on_two = Request("m", 8);

  for (const RequestPtr& r : on_one) {
    ASSERT_TRUE(r->WaitFor(10s));
    EXPECT_EQ(r->status(), InferStatus::kOk) << r->message();
    EXPECT_EQ(VersionThatComputed(r), 1.0f) << "a request queued for version 1 ran elsewhere";
  }
  ASSERT_TRUE(on_two->WaitFor(10s));
  EXPECT_EQ(on_two->status(), InferStatus::kOk) << on_two->message();
  EXPECT_EQ(VersionThatComputed(on_two), 2.0f);
  EXPECT_EQ(core_->ReadyVersions("m"), std::vector<int64_t>{2});

  // Version 1 is unloaded after its last batch, once no request holds it any longer (a
  // transport still decoding one would): here, once the test lets go of its requests.
  on_one.clear();
  const std::vector<std::string> messages = MessagesOnce(*model_, "unload m 1");
  size_t last_run_of_one = 0, unload_of_one = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i] == "run m 1") last_run_of_one = i;
    if (messages[i] == "unload m 1") unload_of_one = i;
  }
  ASSERT_GT(unload_of_one, 0u) << "version 1 was never unloaded";
  EXPECT_GT(unload_of_one, last_run_of_one);
}

TEST_F(ServerCoreTest, ABrokenVersionIsUnavailableWithItsReasonAndTheServingOneServesOn) {
  WriteVersion(Version("m", 1));
  Start(1ms);
  ASSERT_EQ(LoadModel("m"), InferStatus::kOk) << last_message_;
  WriteVersion(Version("m", 2), "t5");
  EXPECT_EQ(LoadModel("m"), InferStatus::kBadInput);
  EXPECT_NE(last_message_.find("not a family we serve"), std::string::npos) << last_message_;
  bool listed = false;
  for (const IndexEntry& entry : core_->Index(/*ready_only=*/false)) {
    if (entry.version != 2) continue;
    listed = true;
    EXPECT_EQ(entry.state, VersionState::kUnavailable);
    EXPECT_NE(entry.reason.find("not a family we serve"), std::string::npos) << entry.reason;
  }
  EXPECT_TRUE(listed);
  const RequestPtr r = Request("m", 5);
  ASSERT_TRUE(r->WaitFor(10s));
  EXPECT_EQ(r->status(), InferStatus::kOk) << r->message();
  EXPECT_EQ(VersionThatComputed(r), 1.0f);
  for (const std::string& m : model_->messages()) EXPECT_NE(m, "load m 2") << "a version that failed its read loaded";
}

TEST_F(ServerCoreTest, AFullQueueRefusesAtOnceAndALateRequestIsNeverComputed) {
  spec_.max_queue = 2;
  WriteVersion(Version("m", 1));
  Start(300ms);
  ASSERT_EQ(LoadModel("m"), InferStatus::kOk) << last_message_;
  const RequestPtr computing = Request("m", 5);
  std::this_thread::sleep_for(50ms);  // sent to the model: the queue is empty again
  const RequestPtr queued = Request("m", 6);
  const RequestPtr late = Request("m", 7, /*timeout_ms=*/100);  // due long before the batch ahead ends
  const RequestPtr refused = Request("m", 8);
  ASSERT_TRUE(refused->WaitFor(50ms)) << "a request beyond max_queue waited";
  EXPECT_EQ(refused->status(), InferStatus::kRejected);

  for (const RequestPtr& r : {computing, queued, late}) ASSERT_TRUE(r->WaitFor(10s));
  EXPECT_EQ(computing->status(), InferStatus::kOk);
  EXPECT_EQ(queued->status(), InferStatus::kOk);
  EXPECT_TRUE(late->status() == InferStatus::kExpired || late->status() == InferStatus::kRejected)
      << OutcomeName(late->status());
  EXPECT_EQ(model_->computed(), (std::multiset<int64_t>{5, 6})) << "a refused or late request was computed";
}

TEST_F(ServerCoreTest, UnloadRetiresTheModelAndStopAnswersWhatIsLeft) {
  WriteVersion(Version("m", 1));
  Start(1ms);
  ASSERT_EQ(LoadModel("m"), InferStatus::kOk) << last_message_;
  std::string message;
  EXPECT_EQ(core_->Unload("m", &message), InferStatus::kOk) << message;
  InferStatus status = InferStatus::kOk;
  EXPECT_EQ(core_->Resolve("m", "", &status, &message), nullptr);
  EXPECT_EQ(status, InferStatus::kUnavailable) << message;
  EXPECT_FALSE(core_->ModelReady("m", ""));
  EXPECT_EQ(core_->Resolve("nope", "", &status, &message), nullptr);
  EXPECT_EQ(status, InferStatus::kNotFound);

  // The dispatcher unloads a retired version when nothing runs on it.
  std::vector<std::string> messages = MessagesOnce(*model_, "unload m 1");
  EXPECT_NE(std::find(messages.begin(), messages.end(), "unload m 1"), messages.end());
  core_->Stop();
  messages = MessagesOnce(*model_, "stop");
  ASSERT_FALSE(messages.empty());
  EXPECT_EQ(messages.back(), "stop");
}

}  // namespace
}  // namespace trainyard
