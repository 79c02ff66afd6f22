// The parts of a pool agent's job launch that need no MPI world: the mpirun command
// line, the scrubbed environment, mpirun's report of a dead rank, the relay between an
// agent and its job's rank 0, and a real child process's end and output.
#include "worker/pool/job_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <thread>

#include "worker/pool/job_relay.h"

namespace trainyard {
namespace {

TEST(JobProcessTest, MpirunCommandGroupsRanksByHostWithJobRankZeroFirst) {
  JobLaunch launch;
  launch.worker = "/bin/worker";
  launch.relay = "ipc:///tmp/x/relay";
  launch.hosts = {"b", "a", "b"};
  launch.slots = {2, 0, 3};
  launch.extra_args = {"--log-level", "info"};
  const std::vector<std::string> argv = MpirunCommand(launch);
  // More than one rank: each line of output says whose it is (output_lines.h).
  const std::vector<std::string> expected{
      "mpirun",      "--tag-output", "--oversubscribe", "--bind-to",          "none",        "--host", "b:2,a:1",  "-n",
      "3",           "/bin/worker",  "--pool-job",      "ipc:///tmp/x/relay", "--job-slots", "2,3,0",  "--job-id", "0",
      "--log-level", "info"};
  EXPECT_EQ(argv, expected);
  launch.hosts = {"a"};
  launch.slots = {1};
  const std::vector<std::string> one = MpirunCommand(launch);
  EXPECT_EQ(std::count(one.begin(), one.end(), "--tag-output"), 0);  // one rank: lines as they are
  launch.slots.pop_back();
  EXPECT_THROW(MpirunCommand(launch), std::invalid_argument);
}

TEST(JobProcessTest, ScrubbedEnvironmentDropsWhatTheEnclosingMpirunSet) {
  const std::vector<std::string> env{"PATH=/bin",
                                     "OMPI_COMM_WORLD_RANK=3",
                                     "OMPI_MCA_orte_hnp_uri=123",
                                     "OMPI_MCA_ess_base_jobid=9",
                                     "OMPI_MCA_pmix=^s1",
                                     "OMPI_MCA_mpi_oversubscribe=0",
                                     "PMIX_RANK=3",
                                     "OMPI_ALLOW_RUN_AS_ROOT=1",
                                     "OMPI_MCA_btl_tcp_if_include=lo",
                                     "OPAL_PREFIX=/opt/ompi"};
  const std::vector<std::string> kept{"PATH=/bin", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_MCA_btl_tcp_if_include=lo",
                                      "OPAL_PREFIX=/opt/ompi"};
  EXPECT_EQ(ScrubbedEnvironment(env), kept);
}

TEST(JobProcessTest, ParsesMpirunReportsOfADeadRank) {
  RankEnd killed = ParseMpirunReport(
      {"noise", "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."});
  EXPECT_EQ(killed.rank, 1);
  EXPECT_EQ(killed.signal, 9);
  EXPECT_EQ(killed.node, "vm");
  RankEnd exited = ParseMpirunReport({"the job to be terminated. The first process to do so was:", "",
                                      "  Process name: [[15801,1],3]", "  Exit code:    2"});
  EXPECT_EQ(exited.rank, 3);
  EXPECT_EQ(exited.signal, 0);
  EXPECT_EQ(exited.exit_code, 2);
  EXPECT_EQ(ParseMpirunReport({"all fine"}).rank, -1);
  EXPECT_EQ(SignalName(9), "SIGKILL");
}

// Open MPI 4.1's words when a host's daemon is lost (its help-errmgr-base.txt, node-died).
TEST(JobProcessTest, ParsesTheHostOfALostDaemon) {
  RankEnd lost = ParseMpirunReport(
      {"ORTE has lost communication with a remote daemon.", "  HNP daemon   : [[20416,0],0] on node h2",
       "  Remote daemon: [[20416,0],1] on node h3", "This is usually due to either a failure of the TCP network"});
  EXPECT_EQ(lost.lost_host, "h3");
  EXPECT_EQ(lost.rank, -1);
  EXPECT_EQ(ParseMpirunReport({"  HNP daemon   : [[20416,0],0] on node h2"}).lost_host, "");
}

// A fake "mpirun" (a shell script) stands in for the real one: the process runs, its
// output is kept, and its end is reported. It starts with SIGPIPE ignored (Note [Job
// isolation]), which /proc says of the script's own shell.
TEST(JobProcessTest, RunsTheCommandAndKeepsItsOutputAndEnd) {
  const std::string script = ::testing::TempDir() + "/fake_mpirun_" + std::to_string(::getpid());
  {
    std::ofstream out(script);
    out << "#!/bin/sh\necho \"env ${OMPI_COMM_WORLD_RANK:-clean}\"\n"
           "echo \"ignored $(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status)\"\n"
           "echo 'error: rank 1: job failed: boom' >&2\nexit 3\n";
  }
  ::chmod(script.c_str(), 0700);
  ::setenv("OMPI_COMM_WORLD_RANK", "7", 1);
  JobLaunch launch;
  launch.mpirun = script;
  launch.worker = "w";
  launch.relay = "r";
  launch.hosts = {"h"};
  launch.slots = {0};
  JobProcess job(launch);
  const auto start = std::chrono::steady_clock::now();
  while (!job.Exited()) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_FALSE(job.Succeeded());
  EXPECT_EQ(job.ExitText(), "exited with code 3");
  const std::vector<std::string> tail = job.OutputTail();
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(tail[0], "env clean");
  const uint64_t ignored = std::stoull(tail[1].substr(tail[1].find(' ') + 1), nullptr, 16);
  EXPECT_TRUE(ignored & (uint64_t{1} << (SIGPIPE - 1))) << tail[1];
  EXPECT_EQ(tail[2], "error: rank 1: job failed: boom");
  ::unlink(script.c_str());
}

// mpirun's own refusal (as root, without consent) is framed by lines of dashes: its
// first line becomes the reason; as-root consent is passed on as mpirun's flag.
TEST(JobProcessTest, KeepsMpirunsOwnFirstMessage) {
  const std::string script = ::testing::TempDir() + "/refusing_mpirun_" + std::to_string(::getpid());
  {
    std::ofstream out(script);
    out << "#!/bin/sh\necho \"args $1\"\nprintf '%s\\n' ------------------------------------------------------------ "
           "'mpirun has detected an attempt to run as root.' '' 'Running as root is *strongly* discouraged' "
           "------------------------------------------------------------ >&2\nexit 1\n";
  }
  ::chmod(script.c_str(), 0700);
  JobLaunch launch;
  launch.mpirun = script;
  launch.worker = "w";
  launch.relay = "r";
  launch.hosts = {"h"};
  launch.slots = {0};
  launch.allow_run_as_root = true;
  EXPECT_EQ(MpirunCommand(launch)[1], "--allow-run-as-root");
  JobProcess job(launch);
  const auto start = std::chrono::steady_clock::now();
  while (!job.Exited()) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(job.MpirunMessage(), "mpirun has detected an attempt to run as root.");
  EXPECT_EQ(job.OutputTail().front(), "args --allow-run-as-root");
  ::unlink(script.c_str());
}

TEST(JobProcessTest, TerminateEndsARunningJob) {
  // MpirunCommand puts mpirun's own options first: a script that ignores them stands in.
  const std::string script = ::testing::TempDir() + "/sleepy_" + std::to_string(::getpid());
  {
    std::ofstream out(script);
    out << "#!/bin/sh\nexec sleep 30\n";
  }
  ::chmod(script.c_str(), 0700);
  JobLaunch launch;
  launch.mpirun = script;
  launch.worker = "w";
  launch.relay = "r";
  launch.hosts = {"h"};
  launch.slots = {0};
  JobProcess job(launch);
  EXPECT_FALSE(job.Exited());
  job.Terminate();
  const auto start = std::chrono::steady_clock::now();
  while (!job.Exited()) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(job.ExitText(), "was killed by signal 15 (SIGTERM)");
  ::unlink(script.c_str());
}

// The relay, both ends in one process; the agent is one with no coordinator to reach.
TEST(JobRelayTest, CarriesTheAssignmentAStopAndTheResult) {
  PoolOptions options;
  options.endpoint = "tcp://127.0.0.1:1";
  options.insecure = true;
  RankIdentity self;
  self.world = "w";
  self.rank = 0;
  PoolAgent agent(options, self);
  Assignment assignment{42,  2, "name: x\n", "x.yaml", "/base", "/runs/42", {{"w", 0, "h0", 0}, {"v", 0, "h1", 1}},
                        true};
  JobRelay relay;
  EXPECT_EQ(relay.endpoint().rfind("ipc://", 0), 0u);
  std::atomic<bool> done{false};
  Assignment received;
  bool stopped = false, confirmed = false;
  std::thread job([&] {
    RelayClient client(relay.endpoint());
    received = ParseAssignment(client.Start({{101, "h0"}, {102, "h1"}}, 10));
    while (!client.StopRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stopped = true;
    JobOutcome outcome;
    outcome.end = JobEnd::kCancelled;
    outcome.message = "stopped on request";
    confirmed = client.SendResult(outcome, 10);
    done = true;
  });
  const auto start = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    relay.Pump(20, assignment, agent);
    if (relay.processes().size() == 2) relay.Stop("test", assignment, false);
  }
  job.join();
  relay.Pump(0, assignment, agent);
  EXPECT_EQ(received.job_id, 42);
  EXPECT_EQ(received.attempt, 2);
  EXPECT_EQ(received.yaml, "name: x\n");
  ASSERT_EQ(received.places.size(), 2u);
  EXPECT_EQ(received.places[1].world, "v");
  EXPECT_EQ(received.places[1].host, "h1");
  EXPECT_EQ(received.places[1].slot, 1);
  EXPECT_TRUE(received.resume);
  ASSERT_EQ(relay.processes().size(), 2u);
  EXPECT_EQ(relay.processes()[1].pid, 102);
  EXPECT_EQ(relay.processes()[1].host, "h1");
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(confirmed);
  ASSERT_TRUE(relay.result().has_value());
  EXPECT_EQ(relay.result()->end, JobEnd::kCancelled);
  EXPECT_THROW(ParseAssignment("\x01garbage"), std::invalid_argument);
}

// A rank 0 about to abort the job's MPI world says so without waiting for the agent:
// Aborting() returns while the agent reads nothing (an Aborting() that waited for the
// Ack would block here), and the agent then has a "failed" result naming the culprits.
TEST(JobRelayTest, AnAbortingRankZeroLeavesAFailedResultWithoutWaitingForTheAgent) {
  PoolOptions options;
  options.endpoint = "tcp://127.0.0.1:1";
  options.insecure = true;
  RankIdentity self;
  self.world = "w";
  PoolAgent agent(options, self);
  Assignment assignment{7, 1, "name: x\n", "x.yaml", "/base", "/runs/7", {{"w", 0, "h0", 0}}, false};
  JobRelay relay;
  const std::string error = "rank h0:0: collective #12 (gradients) timed out after 5.0 s; rank h1:1 did not reach it";
  std::atomic<bool> started{false}, aborted{false}, leave{false};
  std::thread job([&] {
    RelayClient client(relay.endpoint());
    client.Start({{101, "h0"}}, 10);
    started = true;
    client.Aborting(error);
    aborted = true;
    while (!leave) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  const auto start = std::chrono::steady_clock::now();
  const auto waited = [&] { return std::chrono::steady_clock::now() - start; };
  while (!started && waited() < std::chrono::seconds(20)) relay.Pump(20, assignment, agent);
  ASSERT_TRUE(started);
  // The agent reads nothing until Aborting() has returned.
  while (!aborted && waited() < std::chrono::seconds(20)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(aborted) << "Aborting() waited for the agent";
  while (!relay.result() && waited() < std::chrono::seconds(20)) relay.Pump(20, assignment, agent);
  leave = true;
  job.join();
  ASSERT_TRUE(relay.result().has_value());
  EXPECT_EQ(relay.result()->end, JobEnd::kFailed);
  EXPECT_EQ(relay.result()->message, error);
}

}  // namespace
}  // namespace trainyard
