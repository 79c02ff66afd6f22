// The pure parts of `coordinator --slurm` (Note [Attempts as Slurm jobs]): the generated
// sbatch script, squeue's answer, the world a Slurm job's rank 0 registers as, and how an
// attempt ends when its Slurm job does.
#include "coordinator/slurm.h"

#include <gtest/gtest.h>

#include "coordinator/slurm_launcher.h"

namespace trainyard {
namespace {

SlurmOptions Options() {
  SlurmOptions o;
  o.enabled = true;
  o.partition = "gpu";
  o.account = "ml";
  o.time_limit_minutes = 90;
  o.signal_lead_s = 120;
  o.worker = "/opt/trainyard/bin/worker";
  o.endpoint = "tcp://10.0.0.1:5555";
  o.keys_dir = "/home/it's/keys";
  return o;
}

SlurmSubmission Submission() {
  SlurmSubmission s;
  s.job = 7;
  s.attempt = 2;
  s.name = "bert";
  s.ranks = 4;
  s.gpus = true;
  s.folder = "/runs/7/attempt-2";
  return s;
}

TEST(SbatchScript, AsksForTheRanksLimitsAndSignalAndQuotesEveryPath) {
  const std::string script = SbatchScript(Options(), Submission());
  const std::string srun =
      "srun --kill-on-bad-exit=1 '/opt/trainyard/bin/worker' --coordinator 'tcp://10.0.0.1:5555' --keys "
      "'/home/it'\\''s/keys' --slurm\n";
  for (const std::string& line :
       {std::string("#!/bin/bash\n"), std::string("#SBATCH --job-name=trainyard-7\n"),
        std::string("#SBATCH --ntasks=4\n"), std::string("#SBATCH --partition=gpu\n"),
        std::string("#SBATCH --account=ml\n"), std::string("#SBATCH --time=90\n"),
        std::string("#SBATCH --gpus-per-task=1\n"), std::string("#SBATCH --signal=USR1@120\n"),
        std::string("#SBATCH --no-requeue\n"), std::string("mkdir -p '/runs/7/attempt-2'\n"), srun})
    EXPECT_NE(script.find(line), std::string::npos) << line << "\nnot in:\n" << script;
  EXPECT_EQ(script.find("TOKEN="), std::string::npos);
}

TEST(SbatchScript, LeavesOutWhatSlurmDefaults) {
  SlurmOptions o = Options();
  o.partition.clear();
  o.account.clear();
  o.time_limit_minutes = 0;
  o.signal_lead_s = 0;
  SlurmSubmission s = Submission();
  s.gpus = false;
  const std::string script = SbatchScript(o, s);
  for (const char* absent : {"--partition", "--account", "--time", "--gpus", "--signal"})
    EXPECT_EQ(script.find(absent), std::string::npos) << absent;
}

TEST(SbatchScript, NamesAnElasticReplicaAndAsksForItsOneTask) {
  SlurmSubmission s = Submission();
  s.ranks = 1;
  s.replica = 3;
  const std::string script = SbatchScript(Options(), s);
  for (const char* line : {"attempt 2, elastic replica 3: one Slurm job", "#SBATCH --job-name=trainyard-7-replica-3\n",
                           "#SBATCH --ntasks=1\n"})
    EXPECT_NE(script.find(line), std::string::npos) << line << "\nnot in:\n" << script;
  EXPECT_EQ(SbatchScript(Options(), Submission()).find("replica"), std::string::npos);
}

TEST(ParseSqueue, ReadsStateAndReasonAndSkipsWhatDoesNotParse) {
  const auto jobs = ParseSqueue("12|PENDING|Resources\n13|RUNNING|None\nnoise\n|X|Y\n14_2|RUNNING|None\n15|TIMEOUT|");
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs.at("12").Describe(), "PENDING (Resources)");
  EXPECT_FALSE(jobs.at("12").started());
  EXPECT_FALSE(jobs.at("12").ended());
  EXPECT_EQ(jobs.at("13").Describe(), "RUNNING");
  EXPECT_TRUE(jobs.at("13").started());
  EXPECT_TRUE(jobs.at("15").ended());
  EXPECT_TRUE(SlurmJobState{}.ended());  // no longer listed
}

TEST(SlurmWorld, RoundTripsOnlyNumericJobIds) {
  EXPECT_EQ(SlurmJobOfWorld(SlurmWorld("42")), "42");
  for (const char* world : {"slurm-", "slurm-4x", "host-slurm-4", "slurm-1-2", "h2-1234-abcd"})
    EXPECT_EQ(SlurmJobOfWorld(world), "") << world;
}

// What rank 0 said, and whether the coordinator itself cancelled the Slurm job, decide how
// the attempt ends: an scancel from outside is the job's failure (counted) even after a
// preemption report; a preemption or time limit is free; bad input is never retried; a
// job that ended before rank 0 said anything is a counted failure naming Slurm's state.
TEST(SlurmLauncherTest, ASlurmJobsEndDecidesHowItsAttemptEnds) {
  RunningAttempt attempt;
  attempt.slurm_job = "42";
  const SlurmJobState node_fail{"NODE_FAIL", "None"}, cancelled{"CANCELLED", "None"}, gone{"", ""};

  SlurmAttemptEnd end = EndOfSlurmAttempt(attempt, node_fail);
  EXPECT_EQ(end.retry, Retry::kCounted);
  EXPECT_EQ(end.reason,
            "its Slurm job 42 ended " + node_fail.Describe() + " before the job's rank 0 reported a result");

  attempt.reported = wire::OUTCOME_PREEMPTED;
  attempt.reported_reason = "the job led by r0 was preempted: time limit ahead";
  end = EndOfSlurmAttempt(attempt, gone);
  EXPECT_EQ(end.retry, Retry::kFree);
  EXPECT_EQ(end.reason, attempt.reported_reason + " (its Slurm job 42 ended " + gone.Describe() + ")");

  end = EndOfSlurmAttempt(attempt, cancelled);  // not the coordinator's scancel
  EXPECT_EQ(end.retry, Retry::kCounted);
  EXPECT_EQ(end.reason, "its Slurm job 42 ended " + cancelled.Describe() + ", cancelled outside the coordinator; " +
                            attempt.reported_reason);

  attempt.cancel_sent = true;  // the coordinator's own, after the report: the report decides
  EXPECT_EQ(EndOfSlurmAttempt(attempt, cancelled).retry, Retry::kFree);

  attempt.reported = wire::OUTCOME_BAD_INPUT;
  attempt.reported_reason = "the job led by r0 rejected its input: no such file";
  end = EndOfSlurmAttempt(attempt, node_fail);
  EXPECT_EQ(end.retry, Retry::kNever);
  EXPECT_EQ(end.reason, attempt.reported_reason);

  attempt.reported = wire::OUTCOME_FAILED;
  attempt.reported_reason = "the job led by r0 failed: boom";
  end = EndOfSlurmAttempt(attempt, node_fail);
  EXPECT_EQ(end.retry, Retry::kCounted);
  EXPECT_EQ(end.reason, "its Slurm job 42 ended " + node_fail.Describe() + "; " + attempt.reported_reason);
}

}  // namespace
}  // namespace trainyard
