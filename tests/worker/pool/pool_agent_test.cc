// A pool agent's link thread against a real ZeroMQ ROUTER on 127.0.0.1 standing in for
// the coordinator: signals aimed at the agent's threads are left to the main thread,
// and the link goes on heartbeating through them; a coordinator that goes away and comes
// back on the same address gets the agent's registration again.
#include "worker/pool/pool_agent.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "trainyard.pb.h"

namespace trainyard {
namespace {

pthread_t g_main_thread;
std::atomic<int> g_handled_off_main{0};

void RecordHandlingThread(int) {
  if (!pthread_equal(pthread_self(), g_main_thread)) ++g_handled_off_main;
}

std::set<pid_t> ThreadIds() {
  std::set<pid_t> ids;
  DIR* tasks = ::opendir("/proc/self/task");
  for (dirent* entry = ::readdir(tasks); entry; entry = ::readdir(tasks))
    if (entry->d_name[0] != '.') ids.insert(static_cast<pid_t>(std::stoi(entry->d_name)));
  ::closedir(tasks);
  return ids;
}

void DrainFrames(zmq::socket_t& router) {
  for (zmq::message_t frame; router.recv(frame, zmq::recv_flags::dontwait);) {
  }
}

// The body of the next envelope `router` receives within `timeout`; "" if none came.
std::string NextBody(zmq::socket_t& router, std::chrono::milliseconds timeout) {
  zmq::pollitem_t items[] = {{static_cast<void*>(router), 0, ZMQ_POLLIN, 0}};
  if (zmq::poll(items, 1, timeout) == 0) return "";
  zmq::message_t identity, body;
  if (!router.recv(identity) || !router.recv(body)) return "";
  wire::Envelope e;
  if (!e.ParseFromArray(body.data(), static_cast<int>(body.size()))) return "?";
  return e.GetDescriptor()->FindFieldByNumber(e.body_case())->name();
}

RankIdentity TestRank() {
  RankIdentity self;
  self.world = "w";
  self.host = "h";
  self.device = "cpu";
  self.pid = ::getpid();
  self.world_token = "t";
  self.rank_token = "r";
  return self;
}

bool ReceiveWithin(zmq::socket_t& router, std::chrono::milliseconds timeout) {
  zmq::pollitem_t items[] = {{static_cast<void*>(router), 0, ZMQ_POLLIN, 0}};
  if (zmq::poll(items, 1, timeout) == 0) return false;
  DrainFrames(router);
  return true;
}

TEST(PoolAgentTest, SignalsAimedAtItsThreadsRunOnTheMainThreadAndTheLinkKeepsHeartbeating) {
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.bind("tcp://127.0.0.1:*");
  PoolOptions options;
  options.endpoint = router.get(zmq::sockopt::last_endpoint);
  options.insecure = true;
  options.heartbeat_s = 0.05;
  const RankIdentity self = TestRank();

  g_main_thread = pthread_self();
  struct sigaction action {
  }, previous{};
  action.sa_handler = RecordHandlingThread;  // no SA_RESTART: a poll it interrupts fails with EINTR
  ::sigaction(SIGUSR1, &action, &previous);
  const std::set<pid_t> before = ThreadIds();
  {
    PoolAgent agent(options, self);
    ASSERT_TRUE(ReceiveWithin(router, std::chrono::seconds(5))) << "no registration from the agent";
    std::set<pid_t> agent_threads;  // the link thread and the ZeroMQ threads it started
    for (pid_t id : ThreadIds())
      if (!before.count(id)) agent_threads.insert(id);
    ASSERT_FALSE(agent_threads.empty());
    for (int round = 0; round < 50; ++round)
      for (pid_t id : agent_threads) ::syscall(SYS_tgkill, ::getpid(), id, SIGUSR1);
    DrainFrames(router);
    EXPECT_TRUE(ReceiveWithin(router, std::chrono::seconds(5))) << "the link stopped after the signals";
  }
  ::sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(g_handled_off_main.load(), 0) << "a handler ran on one of the agent's threads";
}

// Note [Link liveness]: the coordinator sends nothing unasked, so the agent learns that
// its coordinator went away from its link, and registers with the one that comes back.
TEST(PoolAgentTest, ACoordinatorThatComesBackOnItsAddressGetsTheRegistrationAgain) {
  zmq::context_t context;
  auto router = std::make_unique<zmq::socket_t>(context, zmq::socket_type::router);
  router->bind("tcp://127.0.0.1:*");
  PoolOptions options;
  options.endpoint = router->get(zmq::sockopt::last_endpoint);
  options.insecure = true;
  options.heartbeat_s = 0.05;
  options.liveness = 3;
  PoolAgent agent(options, TestRank());
  ASSERT_EQ(NextBody(*router, std::chrono::seconds(5)), "register");
  router.reset();  // the coordinator is gone: its connections close
  router = std::make_unique<zmq::socket_t>(context, zmq::socket_type::router);
  for (int tries = 0;; ++tries) {  // ZeroMQ's I/O thread closes the old listener a moment later
    try {
      router->bind(options.endpoint);
      break;
    } catch (const zmq::error_t& e) {
      if (e.num() != EADDRINUSE || tries == 200) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const auto back = std::chrono::steady_clock::now();
  std::string body;
  while (body != "register" && std::chrono::steady_clock::now() - back < std::chrono::seconds(10))
    body = NextBody(*router, std::chrono::seconds(1));  // heartbeats may come first
  EXPECT_EQ(body, "register") << "no registration with the coordinator that came back";
  EXPECT_LT(std::chrono::steady_clock::now() - back, std::chrono::seconds(5));
}

}  // namespace
}  // namespace trainyard
