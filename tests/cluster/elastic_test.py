#!/usr/bin/env python3
"""Elastic data parallel on the cluster rig (tests/harness/rig.py; Note [Elastic
finetune]): the coordinator on h1, one agent on each of h2, h3 and h4, and a job of three
replicas, one a host. One case a run:

  power_off   h4's link goes down and every process on it is killed (no FIN reaches its
              peers, as with a real power cut). The two survivors commit a step within
              5 s of the cut, as the same processes (no restart, no checkpoint read). The
              host comes back with a new agent: the pool starts a replacement replica
              there, which joins at a step boundary, healed from a live replica, and ends
              with the survivors' weights and moments bit for bit. The epoch rows show the
              quorum going from 3 to 2 and back
  stopped     h3's replica is stopped (SIGSTOP) for longer than timeout_s: the others go
              on without it from the vote's deadline; continued, its old view is refused
              (fenced), it commits nothing, joins again, is healed, and every replica ends
              with the same weights
  link_cut    h3's link goes down for longer than timeout_s, then comes back: the same,
              with the replica cut off rather than frozen (its ring sockets half-open)
  two_lost    h4's replica, then h3's, are killed a step apart (min_replicas 1): the ones
              left go on each time within 5 s, and replacements on the freed slots bring
              the job back to three
  coordinator_lost
              h1, the coordinator's host and so the quorum service's, is powered off
              mid-run (no FIN reaches the agents) and back 5 s later with the coordinator
              started again on its own disk: no step commits while it is away, the
              coordinator takes the attempt back, the replicas' old quorum is refused and
              they form a new one at the step they had committed, and every replica ends
              as the same process with the same weights and moments

Every case ends with the job SUCCEEDED as its one attempt, every step in the first
replicas' steps.jsonl once and in order, and each epoch row once. Each prints its time to
recover. Exit 77 (skipped) where the rig cannot be made."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, trained_state, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS  # noqa: E402
from harness.rig import on_rig  # noqa: E402
from harness.rig_pool import RigPool, pool_job_pid  # noqa: E402

HOSTS = ("h2", "h3", "h4")
TIMEOUT_S = 2      # the job's distributed.timeout_s
EXAMPLES = 840     # 2 epochs of 35 steps in global batches of 24 (8 a replica)
TOTAL = 2 * (EXAMPLES // 24)
RECOVERY_S = 5     # the issue's bound: a failure to the survivors' next committed step


class ElasticRig:
    """The pool, the job and what its replicas wrote, on one rig."""

    def __init__(self, c, args, min_replicas=2):
        self.c = c
        # Agents beat every 0.5 s and are lost after 4 silent beats (2 s): a host that is
        # gone leaves its replica's quorum then, or at the vote's deadline, whichever first.
        self.pool = RigPool(c, args, liveness=4)
        self.pool.start_coordinator()
        for host in HOSTS:
            self.pool.start_agents(host, 1)
        wait_for(lambda: len(self.pool.workers()) == 3, 60, "an agent on each of h2, h3, h4")
        job = write(os.path.join(c.shared, "elastic.yaml"), job_yaml("elastic", subset_tsv(c.shared, EXAMPLES), f"""train:
  epochs: 2
  batch_size: 8
checkpoint:
  every_steps: 10
distributed:
  timeout_s: {TIMEOUT_S}
  elastic:
    min_replicas: {min_replicas}
    max_replicas: 3
    join_window_s: 2
debug:
  step_pause_ms: 200
"""))
        self.job = self.pool.jobctl("submit", job)["job_id"]

    def steps(self):
        """{(host, replica folder): its steps.jsonl lines}."""
        out = {}
        for host in HOSTS:
            pattern = self.c.outside(host, f"runs/{self.job}/replica-*/elastic/steps.jsonl")
            for path in glob.glob(pattern):
                try:
                    with open(path) as f:
                        lines = [json.loads(line) for line in f if line.endswith("\n")]
                except (OSError, ValueError):
                    continue
                out[(host, path.split(os.sep)[-3])] = lines
        return out

    def on(self, host):
        """The steps.jsonl lines of the first replica on `host` (replica 0..2)."""
        for (h, folder), lines in self.steps().items():
            if h == host and int(folder.split("-")[1]) < 3:
                return lines
        return []

    def wait_for_step(self, step):
        wait_for(lambda: all(len(self.on(h)) >= step for h in HOSTS), 180, f"three replicas past step {step}")

    def time_to_next_step(self, hosts, since):
        """Seconds from `since` until each of `hosts`' replicas has logged a step past the
        ones it had then (polled every 50 ms)."""
        had = {h: len(self.on(h)) for h in hosts}
        wait_for(lambda: all(len(self.on(h)) > had[h] for h in hosts), 60, f"a step committed on {hosts}",
                 every=0.05)
        return time.time() - since

    def finish(self):
        """The job's end, checked as every case checks it; its events as text."""
        done = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
            self.pool.jobctl("status", str(self.job))), 300, "the job to end")
        report = self.pool.jobctl("report", str(self.job))
        events = "\n".join(done.get("events", []))
        check(done["state"] == "SUCCEEDED", f"the job {done['state']}: {events}")
        check(len(report["attempts"]) == 1, f"one attempt, no restart: {report['attempts']}")
        check([int(e["epoch"]) for e in report["epochs"]] == [1, 2], f"each epoch once: {report['epochs']}")
        self.sizes = [(int(e["replicas_min"]), int(e["replicas_max"]), int(e["replica_changes"]))
                      for e in report["epochs"]]
        return events

    def check_survivor(self, host):
        steps = [line["step"] for line in self.on(host)]
        check(steps == list(range(1, TOTAL + 1)), f"{host}'s replica took every step once, in order: {steps}")

    def check_equal_at_the_end(self):
        """Every replica that took the last step has the same trained state; returns them."""
        finishers = [key for key, lines in self.steps().items() if lines and lines[-1]["step"] == TOTAL]
        states = {(host, folder): trained_state(self.c.outside(
            host, f"runs/{self.job}/{folder}/elastic/checkpoints/step-{TOTAL:09d}.safetensors"))
            for host, folder in finishers}
        check(len(states) == 3 and len(set(states.values())) == 1,
              f"three replicas at the end, with the same weights and moments: {states}")
        return finishers


def run_elastic(case, min_replicas=2):
    def run(c, args):
        rig = ElasticRig(c, args, min_replicas)
        try:
            case(rig)
        except BaseException:
            rig.pool.dump_logs()
            try:
                print("--- the job's events\n" + "\n".join(rig.pool.jobctl("status", str(rig.job)).get("events", [])))
            except AssertionError:
                pass
            raise
    return run


def power_off(rig):
    rig.wait_for_step(5)
    survivors = {h: pool_job_pid(rig.c, h) for h in ("h2", "h3")}
    rig.c.power_off("h4")
    cut = time.time()
    recovered = rig.time_to_next_step(("h2", "h3"), cut)
    print(f"power_off: the survivors committed a step {recovered:.1f} s after h4 went")
    check(recovered <= RECOVERY_S, f"the survivors commit a step within {RECOVERY_S} s: {recovered:.1f} s")
    check(all(len(rig.on(h)) < TOTAL for h in survivors), "the fault came before the end")
    rig.c.power_on("h4")
    back = time.time()
    rig.pool.start_agents("h4", 1)
    wait_for(lambda: any(h == "h4" and f != "replica-2" and lines for (h, f), lines in rig.steps().items()), 120,
             "a replacement on h4")
    print(f"power_off: a replacement on h4 logged its first step {time.time() - back:.1f} s after the host came back")
    events = rig.finish()
    for host, pid in survivors.items():
        rig.check_survivor(host)
        check(pool_job_pid(rig.c, host) in (None, pid), f"{host}'s replica was never restarted")
    finishers = rig.check_equal_at_the_end()
    check(("h4", "replica-3") in finishers, f"the replacement on h4 took the last step: {finishers}")
    check(min(s[0] for s in rig.sizes) == 2 and max(s[1] for s in rig.sizes) == 3 and sum(s[2] for s in rig.sizes) >= 2,
          f"the epoch rows show the quorum's sizes, 3 to 2 and back: {rig.sizes}")
    check("healed from" in events and "replica 3 starts on" in events, f"its start and its heal: {events}")
    outputs = glob.glob(rig.c.outside("h1", f"runs/{rig.job}/attempt-1/output*.log"))
    text = "".join(open(path).read() for path in outputs)
    check(len(outputs) == 4 and "resuming from" not in text,
          f"four replicas' outputs, and none resumed from a checkpoint: {outputs}")


def others_go_on(rig, case, what, since):
    """h2's and h4's replicas commit a step within timeout_s (the vote's deadline for h3)
    and RECOVERY_S of `since`; h3's stays away past timeout_s."""
    recovered = rig.time_to_next_step(("h2", "h4"), since)
    print(f"{case}: the others committed a step {recovered:.1f} s after {what}")
    check(recovered <= TIMEOUT_S + RECOVERY_S, f"within timeout_s + {RECOVERY_S} s: {recovered:.1f} s")
    time.sleep(TIMEOUT_S)


def stopped(rig):
    rig.wait_for_step(5)
    pid = pool_job_pid(rig.c, "h3")
    os.kill(pid, signal.SIGSTOP)
    stop = time.time()
    try:
        others_go_on(rig, "stopped", "h3's replica stopped", stop)
    finally:
        os.kill(pid, signal.SIGCONT)
    events = rig.finish()
    rig.check_survivor("h2")
    rig.check_survivor("h4")
    steps = [line["step"] for line in rig.on("h3")]
    check(len(steps) == len(set(steps)) and steps[-1] == TOTAL,
          f"h3's replica never took a step twice, and took the last one after it rejoined: {steps}")
    check("is in no quorum" in events or "names no step" in events or "no vote in time" in events,
          f"its old view was refused: {events}")
    rig.check_equal_at_the_end()


def link_cut(rig):
    rig.wait_for_step(5)
    rig.c.link("h3", up=False)
    cut = time.time()
    try:
        others_go_on(rig, "link_cut", "h3's link went down", cut)
    finally:
        rig.c.link("h3", up=True)
    rig.finish()
    rig.check_survivor("h2")
    rig.check_survivor("h4")
    replicas = rig.steps()
    h3 = [line["step"] for (h, f), lines in replicas.items() if h == "h3" for line in lines]
    check(len(h3) == len(set(h3)), f"no step was taken twice on h3: {h3}")
    rig.check_equal_at_the_end()


def two_lost(rig):
    rig.wait_for_step(4)
    os.kill(pool_job_pid(rig.c, "h4"), signal.SIGKILL)
    first = time.time()
    rig.time_to_next_step(("h2", "h3"), first)
    os.kill(pool_job_pid(rig.c, "h3"), signal.SIGKILL)
    second = time.time()
    recovered = rig.time_to_next_step(("h2",), second)
    print(f"two_lost: h2 committed a step {recovered:.1f} s after the second loss")
    check(recovered <= RECOVERY_S, f"within {RECOVERY_S} s of the second loss: {recovered:.1f} s")
    events = rig.finish()
    rig.check_survivor("h2")
    replicas = [line["replicas"] for line in rig.on("h2")]
    check(min(replicas) < 3 and replicas[-1] == 3, f"h2 went on with fewer, and three were back by the end: {replicas}")
    check(events.count("in place of a lost one") >= 2, f"two replacements: {events}")
    rig.check_equal_at_the_end()


def coordinator_lost(rig):
    rig.wait_for_step(5)
    replicas = {h: pool_job_pid(rig.c, h) for h in HOSTS}
    rig.c.power_off("h1")
    time.sleep(1)  # a vote sent before the cut may still be answered
    away = {h: len(rig.on(h)) for h in HOSTS}
    time.sleep(4)
    check({h: len(rig.on(h)) for h in HOSTS} == away, f"no step committed while the quorum service was away: {away}")
    rig.c.power_on("h1")
    rig.c.popen("h1", rig.pool.coordinator_command(), stdout=rig.pool.log("coordinator-after-power-on"),
                stderr=subprocess.STDOUT)
    back = time.time()
    resumed = rig.time_to_next_step(HOSTS, back)
    print(f"coordinator_lost: the replicas committed a step {resumed:.1f} s after the coordinator started again")
    events = rig.finish()
    for host, pid in replicas.items():
        rig.check_survivor(host)
        check(pool_job_pid(rig.c, host) in (None, pid), f"{host}'s replica was never restarted")
    check("re-adopted after a coordinator restart" in events, f"the attempt was taken back: {events}")
    rig.check_equal_at_the_end()


CASES = {"power_off": on_rig(4, run_elastic(power_off)),
         "stopped": on_rig(4, run_elastic(stopped)),
         "link_cut": on_rig(4, run_elastic(link_cut)),
         "two_lost": on_rig(4, run_elastic(two_lost, min_replicas=1)),
         "coordinator_lost": on_rig(4, run_elastic(coordinator_lost))}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__)
