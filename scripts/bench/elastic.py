#!/usr/bin/env python3
"""Elastic data parallel under failures, on the cluster rig of tests/harness/rig.py: a
coordinator on h1 and one agent on each of h2, h3 and h4, running the same tiny-BERT
finetune three ways, one after the other in one run:

  failure-free  an elastic job of three replicas (one a host) for --duration seconds;
  failures      the same job, with one replica's process killed (SIGKILL, h2, h3, h4 in
                turn) every --every seconds; the pool starts a replacement on the freed
                slot, healed from a live replica;
  restart       the same training as one plain 3-rank job (one mpirun across the three
                hosts, a checkpoint every --checkpoint-steps), with one rank killed once:
                the attempt fails, and the next resumes from the last checkpoint.

Prints, for the failures run against the failure-free one: steps committed in the same
wall time (their ratio is the issue's target, >= 0.90), steps committed / steps
attempted, the time from each kill to the survivors' next committed step (recovery), and
to the first step with three replicas again (heal: the replacement started, joined and
healed). With --accuracy-epochs N (10 by default), the same job trained to its end, N
epochs at a learning rate of 1e-3 (past which the tiny model's dev accuracy holds within
0.005 from epoch to epoch), without failures and with a replica killed every --every
seconds: the final dev accuracy of each (the issue's target: within 0.01). For the restart run: the time from the kill to the first step of the next
attempt, and the steps it repeats. With --repeats N, medians of N runs of each.

What it shows: what a lost replica costs an elastic job against a plain job's restart on
the same hosts, the same model and the same data, with the coordinator's liveness and
restart settings of the rig tests (heartbeats every 0.5 s, an agent lost after 2 s).
What it does not: a real network or real hosts. A killed process closes its sockets at
once, as a crashed process does on a live host; a host that vanishes without closing them
(tests/cluster/elastic_test.py's power_off) costs the ring its timeout_s more.
Needs root (scripts/bench/elastic.sh runs it)."""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from harness.e2e import job_yaml, subset_tsv, wait_for, write  # noqa: E402
from harness.rig import Rig, available  # noqa: E402
from harness.rig_pool import RigPool, pool_job_pid  # noqa: E402

HOSTS = ("h2", "h3", "h4")


def job_file(c, args, name, elastic, epochs=1000, lr="5.0e-4"):
    distributed = (f"distributed:\n  timeout_s: {args.timeout}\n  elastic:\n    min_replicas: 1\n    max_replicas: 3\n"
                   "    join_window_s: 2\n" if elastic else
                   f"distributed:\n  timeout_s: {args.timeout}\nresources:\n  ranks: 3\n  max_restarts: 3\n")
    return write(os.path.join(c.shared, name + ".yaml"), job_yaml(name, subset_tsv(c.shared, args.examples), f"""train:
  epochs: {epochs}
  batch_size: 8
  lr: {lr}
checkpoint:
  every_steps: {args.checkpoint_steps}
{distributed}"""))


def step_files(c, job, pattern):
    """{path: its whole lines} of the steps.jsonl files `pattern` names on every host."""
    out = {}
    for host in HOSTS:
        for path in glob.glob(c.outside(host, f"runs/{job}/{pattern}")):
            with open(path) as f:
                out[path] = [json.loads(line) for line in f if line.endswith("\n")]
    return out


def committed(c, job):
    """The furthest step any replica logged."""
    return max((lines[-1]["step"] for lines in step_files(c, job, "replica-*/*/steps.jsonl").values() if lines),
               default=0)


def end_job(pool, job):
    pool.jobctl("cancel", str(job))
    wait_for(lambda: pool.jobctl("status", str(job))["state"] not in ("QUEUED", "RUNNING"), 120, "the job to end")


def started(pool, c, job):
    """Waits for the job's first committed step; returns its time."""
    wait_for(lambda: committed(c, job) >= 1, 180, "the first step")
    return time.time()


def elastic_run(c, pool, args, name, kill_every):
    """{committed, attempted, recoveries, heals} of an elastic job run for --duration s,
    a replica killed every `kill_every` s (0: none)."""
    job = pool.jobctl("submit", job_file(c, args, name, elastic=True))["job_id"]
    began = started(pool, c, job)
    recoveries, heals = [], []
    victim = 0
    while time.time() - began < args.duration:
        next_kill = began + (len(recoveries) + 1) * kill_every if kill_every else began + args.duration
        time.sleep(max(0.0, min(next_kill, began + args.duration) - time.time()))
        if not kill_every or time.time() - began >= args.duration:
            break
        host = HOSTS[victim % len(HOSTS)]
        victim += 1
        pid = pool_job_pid(c, host)
        if pid is None:
            continue
        at_kill = committed(c, job)
        os.kill(pid, signal.SIGKILL)
        killed = time.time()

        def first_step(after, replicas):
            """The first step past `after` that `replicas` (a test on the quorum's size) took."""
            return min((line["step"] for lines in step_files(c, job, "replica-*/*/steps.jsonl").values()
                        for line in lines if line["step"] > after and replicas(line.get("replicas", 0))), default=None)

        # Recovered: a step taken without the lost replica. Healed: one taken by three again.
        without = wait_for(lambda: first_step(at_kill, lambda n: n < 3), 60, "a step after the kill", every=0.05)
        recoveries.append(time.time() - killed)
        wait_for(lambda: first_step(without, lambda n: n == 3), 120, "three replicas again", every=0.1)
        heals.append(time.time() - killed)
    done = committed(c, job)
    end_job(pool, job)
    events = pool.jobctl("status", str(job)).get("events", [])
    failed = sum("did not commit" in e for e in events)
    return {"committed": done, "attempted": done + failed, "recoveries": recoveries, "heals": heals}


def accuracy_run(c, pool, args, name, kill_every):
    """{accuracy, kills}: the final dev accuracy of the elastic job trained to its end
    (--accuracy-epochs epochs at a learning rate of 1e-3), a replica's process killed every
    `kill_every` s while it runs (0: none)."""
    job = pool.jobctl("submit", job_file(c, args, name, elastic=True, epochs=args.accuracy_epochs,
                                         lr="1.0e-3"))["job_id"]
    began = started(pool, c, job)

    def state():
        return pool.jobctl("status", str(job))["state"]

    kills = 0
    while kill_every and state() == "RUNNING":
        time.sleep(max(0.0, began + (kills + 1) * kill_every - time.time()))
        pid = pool_job_pid(c, HOSTS[kills % len(HOSTS)]) if state() == "RUNNING" else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            kills += 1
    ended_as = wait_for(lambda: (lambda s: s if s not in ("QUEUED", "RUNNING") else None)(state()), 900,
                        "the job to end")
    if ended_as != "SUCCEEDED":
        sys.exit(f"{name} ended {ended_as}: {pool.jobctl('status', str(job)).get('reason')}")
    return {"accuracy": float(pool.jobctl("report", str(job))["epochs"][-1]["eval_acc"]), "kills": kills}


def restart_run(c, pool, args):
    """{restart_s, repeated} of a plain 3-rank job with one rank killed once, after
    --every seconds of training."""
    job = pool.jobctl("submit", job_file(c, args, "plain", elastic=False))["job_id"]

    def lines():
        files = step_files(c, job, "*/steps.jsonl")
        return max(files.values(), key=len) if files else []

    wait_for(lambda: len(lines()) >= 1, 180, "the plain job's first step")
    time.sleep(args.every)
    victim = next((pid for pid in (pool_job_pid(c, h) for h in HOSTS[1:]) if pid), None)
    if victim is None:
        sys.exit("no rank of the plain job to kill on h3 or h4")
    before = lines()
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    wait_for(lambda: len(pool.jobctl("report", str(job))["attempts"]) >= 2, 120, "the plain job's next attempt")

    def first_new_step():
        """The first step the next attempt logged, once it has: the resume cuts the file
        back to its checkpoint's step, then appends."""
        now = lines()
        for i, line in enumerate(now):
            if i >= len(before) or line != before[i]:
                return line["step"]
        return None

    resumed_at = wait_for(first_new_step, 180, "the next attempt's first step", every=0.05)
    restart_s = time.time() - killed
    repeated = before[-1]["step"] - resumed_at + 1
    end_job(pool, job)
    return {"restart_s": restart_s, "repeated": repeated}


def one_round(args):
    with Rig(4) as c:
        pool = RigPool(c, args, liveness=4)
        try:
            pool.start_coordinator()
            for host in HOSTS:
                pool.start_agents(host, 1)
            wait_for(lambda: len(pool.workers()) == 3, 60, "an agent on each of h2, h3, h4")
            free = elastic_run(c, pool, args, "steady", 0)
            faulted = elastic_run(c, pool, args, "faulted", args.every)
            restart = restart_run(c, pool, args)
            accuracy = ((accuracy_run(c, pool, args, "converged", 0), accuracy_run(c, pool, args, "converged_faulted",
                                                                                    args.every))
                        if args.accuracy_epochs else None)
        except BaseException:
            pool.dump_logs()
            raise
    return free, faulted, restart, accuracy


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", required=True)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--jobctl", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--duration", type=float, default=120, help="seconds each elastic run trains")
    p.add_argument("--every", type=float, default=30, help="seconds between failures")
    p.add_argument("--timeout", type=float, default=2, help="the jobs' distributed.timeout_s")
    p.add_argument("--checkpoint-steps", type=int, default=50, help="the jobs' checkpoint.every_steps")
    p.add_argument("--examples", type=int, default=2400, help="training examples (an epoch: examples / 24 steps)")
    p.add_argument("--accuracy-epochs", type=int, default=10,
                   help="epochs of the runs trained to their end for the final dev accuracy (0: none)")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    if why := available():
        sys.exit(why)
    rounds = [one_round(args) for _ in range(args.repeats)]
    med = statistics.median
    free = med(r[0]["committed"] for r in rounds)
    faulted = med(r[1]["committed"] for r in rounds)
    attempted = med(r[1]["attempted"] for r in rounds)
    recoveries = [s for r in rounds for s in r[1]["recoveries"]]
    heals = [s for r in rounds for s in r[1]["heals"]]
    restart = med(r[2]["restart_s"] for r in rounds)
    repeated = med(r[2]["repeated"] for r in rounds)
    print(f"machine: {subprocess.run(['uname', '-srm'], capture_output=True, text=True).stdout.strip()}, "
          f"{os.cpu_count()} cores; {args.repeats} round(s) of {args.duration:.0f} s, a failure every {args.every:.0f} s")
    print(f"{'':34}{'value':>10}  target")
    print(f"{'steps committed, failure-free':34}{free:>10.0f}")
    print(f"{'steps committed, with failures':34}{faulted:>10.0f}")
    print(f"{'  ratio':34}{faulted / free:>10.3f}  >= 0.90")
    print(f"{'committed / attempted':34}{faulted / attempted:>10.3f}")
    print(f"{'failures':34}{len(recoveries):>10d}")
    print(f"{'recovery s, median (max)':34}{med(recoveries):>10.1f}  ({max(recoveries):.1f}) <= 5")
    print(f"{'heal s, median (max)':34}{med(heals):>10.1f}  ({max(heals):.1f}) <= restart")
    print(f"{'restart s (plain job)':34}{restart:>10.1f}")
    print(f"{'steps the restart repeats':34}{repeated:>10.0f}")
    if args.accuracy_epochs:
        free_acc = [r[3][0]["accuracy"] for r in rounds]
        faulted_acc = [r[3][1]["accuracy"] for r in rounds]
        kills = [r[3][1]["kills"] for r in rounds]
        print(f"final dev accuracy after {args.accuracy_epochs} epochs, failure-free: "
              f"{', '.join(f'{a:.4f}' for a in free_acc)}; with failures ({', '.join(map(str, kills))} kills): "
              f"{', '.join(f'{a:.4f}' for a in faulted_acc)}")
        print(f"{'  largest difference':34}{max(abs(a - b) for a, b in zip(free_acc, faulted_acc)):>10.4f}  <= 0.01")


if __name__ == "__main__":
    main()
