#!/usr/bin/env python3
"""A pool shared by a team, end to end: a real coordinator with named client keys
(`coordinator --add-client`), real pool agents under mpirun, real jobctl, training real
(small) langid jobs on 127.0.0.1.

Cases:
  preempt      on a 2-rank pool with --preemption on, a priority-10 job arrives while a
               priority-0 job runs: the victim stops after its step in progress with a
               checkpoint, the new job runs, and the victim resumes as attempt 2 with
               final losses equal to an uninterrupted standalone run's; no restart is
               counted (max_restarts is 0), each epoch is logged once, and the victim,
               requeued at priority 0, never preempts the job that preempted it;
  last_step    the victim is asked to stop before the only step of its only epoch: it
               stops after that step with its epoch not yet closed, and the resumed
               attempt closes it (one epoch row, the standalone run's losses);
  grace        the victim's ranks are frozen (SIGSTOP: a planted hang that cannot heed
               the stop); after --preempt-grace its lead agent ends its mpirun, and the
               victim resumes from the checkpoint of its last whole epoch, with the same
               final losses and each epoch logged once;
  equal        two jobs of equal priority do not preempt each other: the second waits,
               saying why, and runs when the first is done;
  fairshare    alice has used more than 10x bob's rank-seconds; at equal priority, bob's
               job, submitted after hers, starts first, and still does after the
               coordinator is killed and restarted while both wait;
  quota        with --user-max-ranks 2 on a 4-rank pool, alice's second 2-rank job waits
               with a QuotaRanks reason while bob's job runs on the free slots;
  owners       jobs belong to the key's user whatever jobctl says; bob cannot cancel
               alice's job (jobctl exits 2, nothing changes), an admin can, and
               --user-max-queued refuses a submission with exit 2."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, wait_for, write  # noqa: E402
from harness.pool import (POOL_FLAGS, Cluster, epoch_column, final_losses_of_standalone_run,  # noqa: E402
                          job_processes, on_cluster)


class SharedCluster(Cluster):
    """A Cluster whose coordinator takes extra flags and whose jobctl can act as a user."""

    def __init__(self, args, work, flags=()):
        super().__init__(args, work)
        self.flags = list(flags)
        for user, role in (("alice", "user"), ("bob", "user"), ("root", "admin")):
            subprocess.run([args.coordinator, "--keys", self.keys, "--add-client", user, "--client-role", role],
                           check=True, capture_output=True)

    def start_coordinator(self):
        log = open(os.path.join(self.work, f"coordinator-{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        self.coordinator = subprocess.Popen(
            [self.args.coordinator, "--listen", self.endpoint, "--state", self.state, "--runs", self.runs,
             "--keys", self.keys, "--heartbeat", "0.5", "--liveness", "10", "--grace", "20",
             "--restart-backoff", "1", *self.flags],
            stdout=log, stderr=subprocess.STDOUT)

    def run_jobctl(self, user, *args):
        keys = os.path.join(self.keys, "clients", user) if user else self.keys
        return subprocess.run([self.args.jobctl, "--coordinator", self.endpoint, "--keys", keys, "--timeout", "3",
                               "--json", *args], capture_output=True, text=True, timeout=60)

    def as_user(self, user, *args):
        r = self.run_jobctl(user, *args)
        check(r.returncode == 0, f"jobctl {' '.join(args)} as {user}: {r.stderr}")
        return json.loads(r.stdout)


def write_job(folder, name, epochs, examples=300, priority=0, ranks=2, extra="", preemptible=True):
    train = os.path.join(folder, f"train_{examples}.tsv")
    if not os.path.exists(train):
        subset_tsv(folder, examples)
    resources = f"""train:
  epochs: {epochs}
  batch_size: 16
{extra}resources:
  ranks: {ranks}
  max_restarts: 0
  priority: {priority}
  preemptible: {"true" if preemptible else "false"}
"""
    return write(os.path.join(folder, f"{name}.yaml"), job_yaml(name, train, resources))


def events(c, job):
    return c.job(job).get("events", [])


def final_losses(c, job):
    with open(os.path.join(c.runs, str(job), "summary.json")) as f:
        return json.load(f)["final"]


def start_victim(c, work, **job):
    """A 2-rank pool running alice's priority-0 job `victim`; its file and id."""
    c.start(2)
    victim_file = write_job(work, "victim", **job)
    victim = c.as_user("alice", "submit", victim_file)["job_id"]
    c.wait_state(victim, {"RUNNING"}, 60)
    return victim_file, victim


def check_resumed_like_uninterrupted(c, work, victim, job_file, name, epochs):
    report = c.jobctl("report", str(victim))
    check(report["state"] == "SUCCEEDED", report)
    check([a["attempt"] for a in report["attempts"]] == [1, 2], report["attempts"])
    check(report["attempts"][0]["outcome"].startswith("interrupted: preempted by job"), report["attempts"][0])
    logged = epoch_column(os.path.join(c.runs, str(victim), "epochs.csv"))
    check(logged == list(range(1, epochs + 1)), logged)
    reference = final_losses_of_standalone_run(c, work, job_file, name)
    got = final_losses(c, victim)
    check(got == reference, (got, reference))
    print(f"the resumed victim's final losses equal an uninterrupted standalone run's exactly ({got})")


def case_preempt(c, work):
    victim_file, victim = start_victim(c, work, epochs=3)
    wait_for(lambda: c.epochs_done(victim) >= 1, 120, "the victim's first epoch")
    urgent = c.as_user("bob", "submit", write_job(work, "urgent", epochs=1, priority=10))["job_id"]
    asked = time.time()
    wait_for(lambda: c.job(urgent)["state"] == "RUNNING", 60, "the urgent job to start")
    freed = time.time()
    status = c.job(victim)
    check(status["state"] == "QUEUED", status)
    said = [e for e in status["events"] if "preempted" in e]
    check(any(e.startswith("preempted by job %d (priority 10)" % urgent) for e in said), status["events"])
    check(any("checkpoint of step" in e and "not counted as a restart" in e for e in said), status["events"])
    print(f"preempt: from the urgent job's submission to its start: {freed - asked:.1f} s")
    print("preempt: " + next(e for e in said if "checkpoint of step" in e))
    check(status["waiting"].startswith("Priority: behind") or status["waiting"].startswith("Resources"), status)
    c.wait_state(urgent, {"SUCCEEDED", "FAILED"}, 240)
    status = c.job(urgent)
    check(status["state"] == "SUCCEEDED", status)
    check(not any("preempted" in e for e in events(c, urgent)), events(c, urgent))
    c.wait_state(victim, {"SUCCEEDED", "FAILED"}, 300)
    check_resumed_like_uninterrupted(c, work, victim, victim_file, "victim", 3)


def case_last_step(c, work):
    """A stop that lands on the last step of the last epoch: a one-step job asked to stop
    before its first step ends with that step checkpointed but its epoch not yet closed;
    the resumed attempt must still close it (evaluate, log, save), not skip to the end."""
    victim_file, victim = start_victim(c, work, epochs=1, examples=32)  # one step of 16 on each of 2 ranks
    urgent = c.as_user("bob", "submit", write_job(work, "urgent", epochs=1, priority=10))["job_id"]
    c.wait_state(urgent, {"SUCCEEDED", "FAILED"}, 240)
    c.wait_state(victim, {"SUCCEEDED", "FAILED"}, 240)
    interrupted = [e for e in events(c, victim) if "interrupted: preempted" in e]
    print("last_step: " + (interrupted[0] if interrupted else "the victim ended before the preemption reached it"))
    check(interrupted, events(c, victim))
    check_resumed_like_uninterrupted(c, work, victim, victim_file, "victim", 1)


def case_grace(c, work):
    victim_file, victim = start_victim(c, work, epochs=3)
    wait_for(lambda: c.epochs_done(victim) >= 1, 120, "the victim's first epoch")
    ranks = wait_for(lambda: (lambda d: d if len(d) == 2 else None)(job_processes(c.args.worker, c.pool.pid)), 30,
                     "the victim's ranks")
    # mpirun sends SIGCONT before it signals its ranks, so the freeze is renewed until
    # they are gone: they never run another step.
    thawed = threading.Event()

    def freeze():
        while not thawed.is_set():
            for pid in ranks.values():
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    freezer = threading.Thread(target=freeze)
    freezer.start()
    try:
        urgent = c.as_user("bob", "submit", write_job(work, "urgent", epochs=1, priority=10))["job_id"]
        asked = time.time()
        wait_for(lambda: c.job(urgent)["state"] == "RUNNING", 90, "the urgent job to start after the grace")
        waited = time.time() - asked
    finally:
        thawed.set()
        freezer.join()
    print(f"grace: the frozen victim's slots were free {waited:.1f} s after the preemption (--preempt-grace 8)")
    check(waited >= 8, waited)
    said = [e for e in events(c, victim) if "interrupted" in e]
    check(said and "it did not stop with a checkpoint" in said[-1], events(c, victim))
    c.wait_state(urgent, {"SUCCEEDED", "FAILED"}, 240)
    c.wait_state(victim, {"SUCCEEDED", "FAILED"}, 300)
    check_resumed_like_uninterrupted(c, work, victim, victim_file, "victim", 3)


def case_equal(c, work):
    c.start(2)
    first = c.as_user("alice", "submit", write_job(work, "first", epochs=2))["job_id"]
    c.wait_state(first, {"RUNNING"}, 60)
    second = c.as_user("bob", "submit", write_job(work, "second", epochs=1))["job_id"]
    waiting = wait_for(lambda: c.job(second).get("waiting", "").startswith("Resources"), 30,
                       "the second job's reason")
    check(waiting, c.job(second))
    c.wait_state(first, {"SUCCEEDED", "FAILED"}, 240)
    c.wait_state(second, {"SUCCEEDED", "FAILED"}, 240)
    for job in (first, second):
        report = c.jobctl("report", str(job))
        check(report["state"] == "SUCCEEDED" and len(report["attempts"]) == 1, report)
        check(not any("preempted" in e for e in events(c, job)), events(c, job))


def usage_by_user(c):
    return {row["user"]: row for row in c.as_user("root", "usage", "--user")}


def case_fairshare(c, work):
    c.start(2)
    heavy = c.as_user("alice", "submit", write_job(work, "heavy", epochs=8, examples=1200))["job_id"]
    c.wait_state(heavy, {"SUCCEEDED", "FAILED"}, 240)
    light = c.as_user("bob", "submit", write_job(work, "light", epochs=1, ranks=1,
                                                 extra="  max_steps: 1\n"))["job_id"]
    c.wait_state(light, {"SUCCEEDED", "FAILED"}, 120)
    usage = usage_by_user(c)
    ratio = usage["alice"]["fairshare_rank_seconds"] / usage["bob"]["fairshare_rank_seconds"]
    print(f"fairshare: alice used {ratio:.1f}x bob's rank-seconds")
    check(ratio > 10, usage)
    # While the pool is held by an admin's job, alice submits, then bob.
    blocker = c.as_user("root", "submit", write_job(work, "blocker", epochs=2))["job_id"]
    c.wait_state(blocker, {"RUNNING"}, 60)
    hers = c.as_user("alice", "submit", write_job(work, "hers", epochs=1, extra="  max_steps: 2\n"))["job_id"]
    his = c.as_user("bob", "submit", write_job(work, "his", epochs=1, extra="  max_steps: 2\n"))["job_id"]
    reason = wait_for(lambda: c.job(hers).get("waiting", "").startswith("FairShare"), 30, "alice's fair-share reason")
    print("fairshare: alice's job waits: " + c.job(hers)["waiting"])
    # The decision must survive a restart: computed from the store.
    c.coordinator.send_signal(signal.SIGKILL)
    c.coordinator.wait()
    c.start_coordinator()
    c.wait_state(his, {"RUNNING", "SUCCEEDED"}, 240)
    check(c.job(hers)["state"] == "QUEUED", c.job(hers))
    for job in (blocker, hers, his):
        c.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
        check(c.job(job)["state"] == "SUCCEEDED", c.job(job))
    first_start = {job: c.jobctl("report", str(job))["attempts"][0]["started_at"] for job in (hers, his)}
    check(first_start[his] < first_start[hers], first_start)
    check(reason, "alice's job waited with a FairShare reason")


def case_quota(c, work):
    c.start(4)
    a1 = c.as_user("alice", "submit", write_job(work, "a1", epochs=2))["job_id"]
    c.wait_state(a1, {"RUNNING"}, 60)
    a2 = c.as_user("alice", "submit", write_job(work, "a2", epochs=1))["job_id"]
    waiting = wait_for(lambda: c.job(a2).get("waiting", "").startswith("QuotaRanks"), 30, "alice's quota reason")
    print("quota: alice's second job waits: " + c.job(a2)["waiting"])
    check("--user-max-ranks 2" in c.job(a2)["waiting"], waiting)
    b1 = c.as_user("bob", "submit", write_job(work, "b1", epochs=1))["job_id"]
    c.wait_state(b1, {"RUNNING", "SUCCEEDED"}, 60)
    check(c.job(a1)["state"] == "RUNNING" and c.job(a2)["state"] == "QUEUED", (c.job(a1), c.job(a2)))
    for job in (a1, a2, b1):
        c.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
        check(c.job(job)["state"] == "SUCCEEDED", c.job(job))


def case_owners(c, work):
    c.start_coordinator()
    wait_for(lambda: c.run_jobctl("root", "list").returncode == 0, 30, "the coordinator")
    job = c.as_user("alice", "submit", write_job(work, "hers", epochs=1))["job_id"]
    status = c.as_user("bob", "status", str(job))
    check(status["user"] == "alice" and status["events"][0].startswith("submitted by alice"), status)
    refused = c.run_jobctl("bob", "cancel", str(job))
    check(refused.returncode == 2, refused)
    check("belongs to alice; only its owner or an admin may cancel it" in refused.stderr, refused.stderr)
    status = c.as_user("alice", "status", str(job))
    check(status["state"] == "QUEUED", status)
    over = c.run_jobctl("alice", "submit", write_job(work, "second", epochs=1))
    check(over.returncode == 2 and "--user-max-queued" in over.stderr, over)
    listed = c.as_user("root", "list")
    check(len(listed) == 1, listed)
    cancelled = c.as_user("root", "cancel", str(job))
    check(cancelled["state"] == "CANCELLED" and cancelled["reason"] == "cancelled while queued by root", cancelled)


def on_shared_cluster(case, flags):
    """`case` run on a SharedCluster whose coordinator takes `flags`."""
    return on_cluster(case, lambda args, work: SharedCluster(args, work, flags))


CASES = {
    "preempt": on_shared_cluster(case_preempt, ["--preemption", "on", "--preempt-grace", "30", "--user-max-priority", "10"]),
    "grace": on_shared_cluster(case_grace, ["--preemption", "on", "--preempt-grace", "8", "--user-max-priority", "10"]),
    "last_step": on_shared_cluster(case_last_step, ["--preemption", "on", "--user-max-priority", "10"]),
    "equal": on_shared_cluster(case_equal, ["--preemption", "on"]),
    "fairshare": on_shared_cluster(case_fairshare, []),
    "quota": on_shared_cluster(case_quota, ["--user-max-ranks", "2"]),
    "owners": on_shared_cluster(case_owners, ["--user-max-queued", "1"]),
}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__)
