// A pool agent's link thread against a real ZeroMQ ROUTER on 127.0.0.1 standing in for
// the coordinator: signals aimed at the agent's threads are left to the main thread,
// and the link goes on heartbeating through them.
#include "worker/pool/pool_agent.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <set>
#include <string>
#include <zmq.hpp>

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
  RankIdentity self;
  self.world = "w";
  self.host = "h";
  self.device = "cpu";
  self.pid = ::getpid();
  self.world_token = "t";
  self.rank_token = "r";

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

}  // namespace
}  // namespace trainyard
