// The daemon's request loop, in process on a loopback socket: bad frames of every
// kind are counted and dropped, and the daemon keeps serving.
#include "coordinator/server.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_server_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ServerOptions options;
    options.listen = "tcp://127.0.0.1:*";
    options.state_path = (dir_ / "state.db").string();
    options.max_message_bytes = 64 * 1024;
    server_ = std::make_unique<Server>(options);
    endpoint_ = server_->endpoint();
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  void TearDown() override {
    stop_ = true;
    thread_.join();
    server_.reset();
    fs::remove_all(dir_);
  }

  zmq::socket_t Connect() {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 3000);
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

  std::string ListRequest() {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    e.mutable_list();
    return e.SerializeAsString();
  }

  fs::path dir_;
  std::unique_ptr<Server> server_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
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
  EXPECT_FALSE(Send(big, {std::string(200 * 1024, 'x')}).has_value());  // ZeroMQ drops that peer
  zmq::socket_t s = Connect();
  auto ok = Send(s, {ListRequest()});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->has_jobs());
}

TEST_F(ServerTest, WrongProtocolVersionIsRejected) {
  zmq::socket_t s = Connect();
  wire::Envelope e;
  e.set_version(99);
  e.mutable_list();
  auto reply = Send(s, {e.SerializeAsString()});
  ASSERT_TRUE(reply && reply->has_error());
  EXPECT_NE(reply->error().message().find("version 99"), std::string::npos);
}

}  // namespace
}  // namespace trainyard
