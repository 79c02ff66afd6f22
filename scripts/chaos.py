#!/usr/bin/env python3
"""Chaos soak: a coordinator and two worker pools on 127.0.0.1 run a stream of small real
jobs while this script kill -9s job processes, pool agents and the coordinator, SIGSTOPs
them, and cancels jobs, for a bounded time. Then it stops the chaos, lets every job
finish, and checks:

  1. every acknowledged submission is exactly one job (idempotency keys: a submission
     retried across a coordinator kill never makes two), and it ended in a terminal state;
  2. nothing is stuck: no job QUEUED or RUNNING, no attempt left open;
  3. a job ended exactly once: at most one attempt succeeded, and only its last; a
     SUCCEEDED job's epochs.csv holds epochs 1..n once each, equal to the store's rows;
  4. no job outside a victim's own job FAILED. A job is a victim when one of its own
     processes (of the mpirun its lead agent started: Note [Job isolation] in
     worker/pool/job_process.h) was killed or stopped, or when one of its agents was
     stopped past the liveness window, or when it ran on a pool whose world an agent's
     kill tore down (the agents share one mpirun, and its jobs are requeued as
     interrupted). A job process's death must fail nothing but its own job;
  5. the coordinator's memory stays bounded (resident set sampled every few seconds).

Pools whose mpirun ended (a killed agent ends its world) are started again by this
script, as an operator or a service manager would. Exit 0 when every invariant holds.
Usage: scripts/chaos.sh [--minutes 15] [--seed N] [--keep]"""
import argparse
import csv
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE, "tests", "worker"))
import e2e_common  # noqa: E402
from e2e_common import MPI_ENV, free_port  # noqa: E402

BIN = os.environ.get("TRAINYARD_BIN", os.path.join(SOURCE, "build", "bin"))
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
HEARTBEAT, LIVENESS = 0.5, 6  # a rank silent for 3 s of listening time is lost


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Soak:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.rng = random.Random(args.seed)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.state = os.path.join(work, "state.db")
        self.runs = os.path.join(work, "runs")
        self.keys = os.path.join(work, "keys")
        subprocess.run([os.path.join(BIN, "coordinator"), "--init", "--keys", self.keys], check=True,
                       capture_output=True)
        self.coordinator = None
        self.pools = {}  # pool index -> Popen
        self.acknowledged = {}  # idempotency key -> job id
        self.victims = set()  # jobs a chaos action hit directly
        self.counts = {k: 0 for k in ("submitted", "job_process_kills", "job_process_stops", "agent_kills",
                                      "agent_stops", "coordinator_kills", "coordinator_stops", "cancels",
                                      "pool_restarts")}
        self.memory = []
        self.next_job = 0
        e2e_common.subset_tsv(work, 160)
        self.train = os.path.join(work, "train_160.tsv")

    # --- processes -------------------------------------------------------------------
    def start_coordinator(self):
        log = open(os.path.join(self.work, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(
            [os.path.join(BIN, "coordinator"), "--listen", self.endpoint, "--state", self.state, "--runs", self.runs,
             "--keys", self.keys, "--heartbeat", str(HEARTBEAT), "--liveness", str(LIVENESS), "--grace", "15",
             "--restart-backoff", "0.5"], stdout=log, stderr=subprocess.STDOUT)

    def start_pool(self, index):
        log = open(os.path.join(self.work, f"pool-{index}.log"), "a")
        self.pools[index] = subprocess.Popen(
            ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(self.args.ranks), os.path.join(BIN, "worker"),
             "--coordinator", self.endpoint, "--keys", self.keys, "--heartbeat", str(HEARTBEAT), "--liveness", "4"],
            stdout=log, stderr=subprocess.STDOUT, env=MPI_ENV, start_new_session=True)

    def restart_dead_pools(self):
        for index, pool in self.pools.items():
            if pool.poll() is not None:
                self.counts["pool_restarts"] += 1
                self.start_pool(index)

    def jobctl(self, *args, timeout=3):
        try:
            r = subprocess.run([os.path.join(BIN, "jobctl"), "--coordinator", self.endpoint, "--keys", self.keys,
                                "--timeout", str(timeout), "--retries", "1", "--json", *args],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None

    # --- the job stream ----------------------------------------------------------------
    def job_file(self):
        self.next_job += 1
        name = f"chaos{self.next_job}"
        ranks = self.rng.choice([1, 2])
        extra = f"""train:
  epochs: {self.rng.choice([1, 2, 3])}
  batch_size: 16
checkpoint:
  keep: 1
resources:
  ranks: {ranks}
  max_restarts: 3
"""
        path = os.path.join(self.work, "jobs", f"{name}.yaml")
        return name, e2e_common.write(path, e2e_common.job_yaml(name, self.train, extra))

    def submit_pending(self, pending):
        """Submits (or resubmits, same key) until acknowledged; keeps the unacknowledged."""
        still = []
        for key, path in pending:
            reply = self.jobctl("submit", path, "--key", key)
            if reply:
                self.acknowledged[key] = reply["job_id"]
            else:
                still.append((key, path))
        return still

    # --- chaos -------------------------------------------------------------------------
    def workers(self):
        return self.jobctl("workers") or []

    def pool_jobs(self, workers, world):
        return {w["job_id"] for w in workers if w["world"] == world and w["job_id"]}

    def job_processes(self):
        """{pid: job id} of every running job process (`worker --pool-job ... --job-id N`)."""
        worker = os.fsencode(os.path.join(BIN, "worker"))
        found = {}
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if entry.isdigit() and worker in argv and b"--pool-job" in argv:
                    found[int(entry)] = int(argv[argv.index(b"--job-id") + 1])
            except (OSError, ValueError, IndexError):
                continue
        return found

    def kill_job_process(self):
        processes = self.job_processes()
        if not processes:
            return
        pid = self.rng.choice(sorted(processes))
        self.victims.add(processes[pid])  # its own job only: the pool goes on
        try:
            os.kill(pid, signal.SIGKILL)
            self.counts["job_process_kills"] += 1
        except ProcessLookupError:
            pass

    def stop_job_process(self):
        processes = self.job_processes()
        if not processes:
            return
        pid = self.rng.choice(sorted(processes))
        self.victims.add(processes[pid])  # may stall its job's collectives past their timeout
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(self.rng.uniform(0.5, 5.0))
            os.kill(pid, signal.SIGCONT)
            self.counts["job_process_stops"] += 1
        except ProcessLookupError:
            pass

    def kill_agent(self):
        workers = [w for w in self.workers() if w["job_id"]]
        if not workers:
            return
        victim = self.rng.choice(workers)
        # Its pool's mpirun then tears the rest of its world down, with every job it led.
        self.victims |= self.pool_jobs(self.workers(), victim["world"]) | {victim["job_id"]}
        try:
            os.kill(victim["pid"], signal.SIGKILL)
            self.counts["agent_kills"] += 1
        except ProcessLookupError:
            pass

    def stop_agent(self):
        workers = [w for w in self.workers() if w["job_id"]]
        if not workers:
            return
        victim = self.rng.choice(workers)
        pause = self.rng.uniform(0.5, 5.0)
        if pause > 1.5:  # may pass the liveness window (3 s): its job is then lost
            self.victims.add(victim["job_id"])
        try:
            os.kill(victim["pid"], signal.SIGSTOP)
            time.sleep(pause)
            os.kill(victim["pid"], signal.SIGCONT)
            self.counts["agent_stops"] += 1
        except ProcessLookupError:
            pass

    def kill_coordinator(self):
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait(timeout=10)
        time.sleep(self.rng.uniform(0.2, 3.0))
        self.counts["coordinator_kills"] += 1
        self.start_coordinator()

    def stop_coordinator(self):
        self.coordinator.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(1.0, 8.0))
        self.coordinator.send_signal(signal.SIGCONT)
        self.counts["coordinator_stops"] += 1

    def cancel_one(self):
        jobs = [j for j in (self.jobctl("list") or []) if j["state"] in ("QUEUED", "RUNNING")]
        if jobs and self.jobctl("cancel", str(self.rng.choice(jobs)["id"])):
            self.counts["cancels"] += 1

    def act(self):
        action = self.rng.choices([self.kill_job_process, self.stop_job_process, self.kill_agent, self.stop_agent,
                                   self.kill_coordinator, self.stop_coordinator, self.cancel_one],
                                  weights=[3, 2, 1, 1, 2, 2, 2])[0]
        action()
        return action.__name__

    # --- the soak ----------------------------------------------------------------------
    def run(self):
        self.start_coordinator()
        for index in range(self.args.pools):
            self.start_pool(index)
        pending = []
        deadline = time.time() + self.args.minutes * 60
        next_action = time.time() + 10
        last_report = 0
        while time.time() < deadline:
            queued = sum(1 for j in (self.jobctl("list") or []) if j["state"] == "QUEUED")
            if queued < 4 and len(pending) < 4:
                name, path = self.job_file()
                pending.append((f"soak-{name}", path))
                self.counts["submitted"] += 1
            pending = self.submit_pending(pending)
            if time.time() >= next_action:
                self.act()
                next_action = time.time() + self.rng.uniform(4, 12)
            self.restart_dead_pools()
            if self.coordinator.poll() is None:
                self.memory.append(rss_mb(self.coordinator.pid))
            if time.time() - last_report > 60:
                last_report = time.time()
                print(f"[{time.strftime('%H:%M:%S')}] {len(self.acknowledged)} jobs acknowledged; {self.counts}",
                      flush=True)
            time.sleep(1)
        while pending:
            pending = self.submit_pending(pending)
            self.restart_dead_pools()
        print("chaos over; letting every job finish", flush=True)
        drain_deadline = time.time() + self.args.drain_minutes * 60
        while time.time() < drain_deadline:
            self.restart_dead_pools()
            jobs = self.jobctl("list") or []
            if jobs and all(j["state"] in TERMINAL for j in jobs):
                break
            time.sleep(2)

    def stop(self):
        for pool in self.pools.values():
            if pool.poll() is None:
                pool.send_signal(signal.SIGTERM)
                try:
                    pool.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(pool.pid, signal.SIGKILL)
        if self.coordinator and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            self.coordinator.wait(timeout=30)

    # --- invariants --------------------------------------------------------------------
    def check(self):
        db = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True)
        jobs = {row[0]: row for row in db.execute("SELECT id, state, idempotency_key, reason FROM jobs")}
        attempts = {}
        for job, attempt, outcome, ended_at in db.execute("SELECT job, attempt, outcome, ended_at FROM attempts"):
            attempts.setdefault(job, []).append((attempt, outcome or "", ended_at or 0))
        checks = {}
        keys = [row[2] for row in jobs.values()]
        checks["every acknowledged submission is exactly one job"] = (
            len(keys) == len(set(keys)) and all(jobs.get(j, (0, 0, ""))[2] == k for k, j in self.acknowledged.items()))
        states = {s: sum(1 for row in jobs.values() if row[1] == s) for s in
                  ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")}
        checks["every job ended in a terminal state"] = states["QUEUED"] == 0 and states["RUNNING"] == 0
        open_attempts = [(j, a) for j, rows in attempts.items() for a, outcome, ended in rows if not outcome]
        checks["no attempt is left open"] = not open_attempts
        once = True
        for job, rows in attempts.items():
            rows.sort()
            wins = [a for a, outcome, _ in rows if outcome == "succeeded"]
            if len(wins) > 1 or (wins and wins[0] != rows[-1][0]) or (jobs[job][1] == "SUCCEEDED") != bool(wins):
                print("ended more than once, or inconsistently:", job, jobs[job][1], rows)
                once = False
        checks["each job ended exactly once"] = once
        epochs_ok = True
        for job, row in jobs.items():
            if row[1] != "SUCCEEDED":
                continue
            stored = [e for (e,) in db.execute("SELECT epoch FROM epochs WHERE job = ? ORDER BY epoch", (job,))]
            path = os.path.join(self.runs, str(job), "epochs.csv")
            with open(path) as f:
                logged = [int(r["epoch"]) for r in csv.DictReader(f)]
            if logged != stored or logged != list(range(1, len(logged) + 1)) or not logged:
                print("epochs of job", job, "logged", logged, "stored", stored)
                epochs_ok = False
        checks["each epoch is logged once"] = epochs_ok
        bystanders = [(j, row[3]) for j, row in jobs.items() if row[1] == "FAILED" and j not in self.victims]
        for job, reason in bystanders:
            print("a job no chaos action hit FAILED:", job, reason)
        checks["no job outside a victim's own job failed"] = not bystanders
        samples = [m for m in self.memory if m]
        third = max(1, len(samples) // 3)
        early, late = max(samples[:third]), max(samples[-third:])
        checks["coordinator memory stays bounded"] = late < 2 * early + 32 and max(samples) < 512
        summary = {"jobs": len(jobs), **{s.lower(): n for s, n in states.items() if n},
                   "attempts": sum(len(r) for r in attempts.values()),
                   "restarts": sum(max(0, len(r) - 1) for r in attempts.values()),
                   "victim_jobs": len(self.victims), **self.counts,
                   "coordinator_rss_mb": {"early_max": round(early, 1), "late_max": round(late, 1),
                                          "max": round(max(samples), 1)}}
        print(json.dumps(summary, indent=2))
        for name, ok in checks.items():
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
        return all(checks.values())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=15, help="how long the chaos lasts (default 15)")
    p.add_argument("--drain-minutes", type=float, default=10, help="then, how long jobs may take to finish")
    p.add_argument("--pools", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2, help="ranks per pool")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, state, runs)")
    a = p.parse_args()
    print(f"chaos soak: {a.minutes} min, {a.pools} pools of {a.ranks} ranks, seed {a.seed}", flush=True)
    work = tempfile.mkdtemp(prefix="trainyard-chaos-")
    soak = Soak(a, work)
    try:
        soak.run()
    finally:
        soak.stop()
    ok = soak.check()
    if a.keep or not ok:
        print("scratch folder kept:", work)
    else:
        shutil.rmtree(work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
