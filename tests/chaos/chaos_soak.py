#!/usr/bin/env python3
"""Chaos soak: a coordinator (with its dashboard, and --preemption on) and two worker pools
on 127.0.0.1 run a stream of small real jobs, submitted by two users (alice and bob, each
with a named client key) at priority 0 or 5, so that urgent jobs preempt others, while
this script kill -9s job processes, pool agents and the coordinator, SIGSTOPs them (the
coordinator now and then for 45 s), cancels jobs (as an admin, and as the user who does
not own them), tries to squat live agents' worlds with a worker key, plants FIFOs and
links to /dev/zero in running jobs' run folders, crowds the dashboard with idle and
trickling clients, floods it with a worker key's 4 MB log line, and sends search files
that would expand into gigabytes (a search bomb), for a bounded time. Then it stops the
chaos, lets every job finish, and checks:

  1. every acknowledged submission is exactly one job (idempotency keys: a submission
     retried across a coordinator kill never makes two), and it ended in a terminal state;
  2. nothing is stuck: no job QUEUED or RUNNING, no attempt left open;
  3. a job ended exactly once: at most one attempt succeeded, and only its last; a
     SUCCEEDED job's epochs.csv holds epochs 1..n once each, equal to the store's rows;
  4. no job outside a victim's own job FAILED. A job is a victim when one of its own
     processes (of the mpirun its lead agent started: Note [Job isolation] in
     worker/pool/job_process.h) was killed or stopped, or when one of its agents was
     killed, or stopped past the liveness window. Agents are independent: a killed one
     takes only its own job with it. Pauses of the coordinator, squatters, planted files
     and crowding clients make no victims at all;
  5. the coordinator's memory stays bounded (resident set sampled every few seconds);
  6. every squat attempt was refused, and every query made while FIFOs and links were
     planted, the dashboard was crowded or a log line flooded it was answered within 5 s,
     with the line cut to 2 KiB; every search bomb was refused within 5 s;
  7. every job belongs to the user who submitted it, every cancel by the user who does
     not own the job was refused, and no job was cancelled but by an admin;
  8. every kind of fault was met: the chaos starts with a tour of them all, in a random
     order (the 45 s pause of the coordinator only by draw), then draws them by weight;
     a tour not ended when the time is up goes on for as long again at most.
Preemption makes no victims: a preempted job is requeued without using a restart, so
invariants 3 and 4 cover it.

A killed agent is replaced by one started alone (no mpirun), as a service manager would.
Exit 0 when every invariant holds.
Usage: scripts/chaos.sh [--minutes 15] [--seed N] [--keep]; ctest runs it for 60 s, a fault every
3 s on average (chaos_soak)."""
import argparse
import csv
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, wire  # noqa: E402
from harness.e2e import MPI_ENV, free_port, job_yaml, subset_tsv, terminate, write  # noqa: E402

BIN = os.environ.get("TRAINYARD_BIN", os.path.join(SOURCE_DIR, "build", "bin"))
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
USERS = ["alice", "bob"]
HEARTBEAT, LIVENESS = 0.5, 6  # a rank silent for 3 s of listening time is lost
# In the environment of the soak's agents and so of their jobs' processes: the soak kills
# and stops only its own, whatever other tests run beside it.
SOAK_MARK = "TRAINYARD_CHAOS_SOAK"


class Squatter:
    """A worker-key holder speaking the wire itself (tests/harness/wire.py): a Register
    naming another agent's world, with a world token of its own."""

    def __init__(self, endpoint, keys):
        self.endpoint = endpoint
        self.keys = wire.read_keys(keys, "worker.key")

    def register(self, world):
        """The coordinator's answer (its error message, or "" for any other reply), or None
        when it did not answer within 5 s."""
        rank = wire.message("RankInfo")(world=world, world_size=1, host="squatter", device="cpu")
        body = wire.message("Register")(rank=rank, world_token=os.urandom(16).hex(), rank_token=os.urandom(16).hex())
        reply = wire.ask(self.endpoint, self.keys, wire.envelope(register=body))
        if reply is None:
            return None
        return reply.error.message if reply.WhichOneof("body") == "error" else ""


class Flooder:
    """A worker-key holder speaking the wire itself: an agent of its own world, busy with a
    job that does not exist (so that no job is ever placed on it), whose heartbeat carries
    a 4 MB last log line."""

    def __init__(self, endpoint, keys):
        self.endpoint = endpoint
        self.keys = wire.read_keys(keys, "worker.key")

    def flood(self, world):
        rank_token = os.urandom(16).hex()
        rank = wire.message("RankInfo")(world=world, world_size=1, host="flooder", device="cpu")
        register = wire.message("Register")(rank=rank, world_token=os.urandom(16).hex(), rank_token=rank_token,
                                            job_id=10**9, attempt=1)
        if wire.ask(self.endpoint, self.keys, wire.envelope(register=register)) is None:
            return False
        beat = wire.message("Heartbeat")(world=world, rank=0, job_id=10**9, attempt=1, rank_token=rank_token,
                                         last_log_line="x" * (4 << 20))
        wire.ask(self.endpoint, self.keys, wire.envelope(heartbeat=beat), timeout_ms=500)  # no answer comes
        return True


def search_bomb(train):
    """A search file of 1 MB whose 200 trials would hold 200 MB of job files."""
    base = "".join("  " + line + "\n" for line in job_yaml("b", train).splitlines())
    value = "v" * 1_000_000  # the file stays under the 1 MiB a job file may be
    return (f"name: bomb\nkind: search\nbase:\n{base}search:\n  method: random\n  max_trials: 200\n"
            f"  max_concurrent: 1\n  params:\n    data.train: {{choice: [\"{value}\", b]}}\n")


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
        self.tour = []  # the kinds of fault not met yet (run() fills it)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.state = os.path.join(work, "state.db")
        self.runs = os.path.join(work, "runs")
        self.keys = os.path.join(work, "keys")
        subprocess.run([os.path.join(BIN, "coordinator"), "--init", "--keys", self.keys], check=True,
                       capture_output=True)
        for user in USERS:
            subprocess.run([os.path.join(BIN, "coordinator"), "--keys", self.keys, "--add-client", user],
                           check=True, capture_output=True)
        self.owners = {}  # job id -> the user who submitted it
        self.foreign_cancels = []  # (job, refused)
        self.coordinator = None
        self.http_port = free_port()
        self.pools = {}  # pool index -> Popen
        self.agents = []  # replacements started alone
        self.squats = []  # (world, refused)
        self.probes = []  # (what, seconds to answer, answered)
        self.acknowledged = {}  # idempotency key -> job id
        self.victims = set()  # jobs a chaos action hit directly
        self.counts = {k: 0 for k in ("submitted", "foreign_cancels", "job_process_kills", "job_process_stops", "agent_kills",
                                      "agent_stops", "coordinator_kills", "coordinator_stops", "coordinator_long_stops",
                                      "cancels", "squats", "planted_files", "crowds", "agent_replacements",
                                      "log_floods", "search_bombs")}
        self.floods = 0
        self.bombs = []  # (seconds to the answer, refused as it should be, the answer)
        self.memory = []
        self.next_job = 0
        subset_tsv(work, 160)
        self.train = os.path.join(work, "train_160.tsv")

    # --- processes -------------------------------------------------------------------
    def start_coordinator(self):
        log = open(os.path.join(self.work, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(
            [os.path.join(BIN, "coordinator"), "--listen", self.endpoint, "--state", self.state, "--runs", self.runs,
             "--keys", self.keys, "--heartbeat", str(HEARTBEAT), "--liveness", str(LIVENESS), "--grace", "15",
             "--restart-backoff", "0.5", "--http", f"127.0.0.1:{self.http_port}", "--preemption", "on",
             "--preempt-grace", "10", "--user-max-priority", "5"], stdout=log, stderr=subprocess.STDOUT)

    def agent_env(self):
        """MPI_ENV and the soak's mark, which its agents pass on to their jobs' processes."""
        return {**MPI_ENV, SOAK_MARK: self.work}

    def start_pool(self, index):
        log = open(os.path.join(self.work, f"pool-{index}.log"), "a")
        self.pools[index] = subprocess.Popen(
            ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(self.args.ranks), os.path.join(BIN, "worker"),
             "--coordinator", self.endpoint, "--keys", self.keys, "--heartbeat", str(HEARTBEAT), "--liveness", "4"],
            stdout=log, stderr=subprocess.STDOUT, env=self.agent_env(), start_new_session=True)

    def replace_lost_agents(self):
        """An agent killed is replaced by one started alone, as a service manager would."""
        expected = self.args.pools * self.args.ranks
        while expected - self.counts["agent_kills"] + self.counts["agent_replacements"] < expected:
            log = open(os.path.join(self.work, "agents.log"), "a")
            self.agents.append(subprocess.Popen(
                [os.path.join(BIN, "worker"), "--coordinator", self.endpoint, "--keys", self.keys, "--heartbeat",
                 str(HEARTBEAT), "--liveness", "4"], stdout=log, stderr=subprocess.STDOUT, env=self.agent_env(),
                start_new_session=True))
            self.counts["agent_replacements"] += 1

    def run_jobctl(self, *args, timeout=3, user=None):
        """jobctl's CompletedProcess, as `user` (else with the admin key --init made); None on a hang."""
        keys = os.path.join(self.keys, "clients", user) if user else self.keys
        try:
            return subprocess.run([os.path.join(BIN, "jobctl"), "--coordinator", self.endpoint, "--keys", keys,
                                   "--timeout", str(timeout), "--retries", "1", "--json", *args],
                                  capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None

    def jobctl(self, *args, timeout=3, user=None):
        r = self.run_jobctl(*args, timeout=timeout, user=user)
        return json.loads(r.stdout) if r and r.returncode == 0 and r.stdout.strip() else None

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
  priority: {self.rng.choice([0, 0, 5])}
"""
        path = os.path.join(self.work, "jobs", f"{name}.yaml")
        return name, write(path, job_yaml(name, self.train, extra))

    def submit_pending(self, pending):
        """Submits (or resubmits, same key) until acknowledged; keeps the unacknowledged."""
        still = []
        for key, path, user in pending:
            reply = self.jobctl("submit", path, "--key", key, user=user)
            if reply:
                self.acknowledged[key] = reply["job_id"]
                self.owners[reply["job_id"]] = user
            else:
                still.append((key, path, user))
        return still

    # --- chaos -------------------------------------------------------------------------
    def workers(self):
        return self.jobctl("workers") or []

    def job_processes(self):
        """{pid: job id} of every running job process of this soak's pools (`worker --pool-job
        ... --job-id N` whose environment carries the soak's mark): never another test's."""
        worker = os.fsencode(os.path.join(BIN, "worker"))
        mark = os.fsencode(f"{SOAK_MARK}={self.work}")
        found = {}
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if not (entry.isdigit() and worker in argv and b"--pool-job" in argv):
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
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
        self.victims.add(victim["job_id"])  # its own job only: the other agents go on
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

    def stop_coordinator_long(self):
        """45 s: many liveness windows, and longer than the agents' reconnect backoff."""
        self.coordinator.send_signal(signal.SIGSTOP)
        time.sleep(45)
        self.coordinator.send_signal(signal.SIGCONT)
        self.counts["coordinator_long_stops"] += 1

    def squat(self):
        """A worker-key holder registers as a live agent's world with a token of its own."""
        workers = self.workers()
        if not workers:
            return
        world = self.rng.choice(workers)["world"]
        reply = Squatter(self.endpoint, self.keys).register(world)
        self.squats.append((world, reply is not None and "another world token" in reply))
        self.counts["squats"] += 1

    def plant_files(self):
        """FIFOs and links to /dev/zero where the coordinator reads a running job's files."""
        running = [j for j in (self.jobctl("list") or []) if j["state"] == "RUNNING"]
        if not running:
            return
        job = self.rng.choice(running)
        folder = os.path.join(self.runs, str(job["id"]), job["name"])
        os.makedirs(folder, exist_ok=True)
        for name, plant in (("latency_heatmap.svg", "fifo"), ("endpoints.json", "fifo"),
                            ("../summary.json", "zero")):
            path = os.path.join(folder, name)
            if os.path.lexists(path):
                continue
            if plant == "fifo":
                os.mkfifo(path)
            else:
                os.symlink("/dev/zero", path)
        self.counts["planted_files"] += 1
        self.probe("jobctl status with planted files", lambda: self.jobctl("status", str(job["id"])))
        self.probe("jobctl report with planted files", lambda: self.jobctl("report", str(job["id"])))
        self.probe("dashboard job page with planted files", lambda: self.dashboard(f"/api/jobs/{job['id']}"))

    def flood_log_line(self):
        """A worker key's 4 MB log line: the dashboard's workers answer stays small and quick."""
        self.floods += 1
        if not Flooder(self.endpoint, self.keys).flood(f"flood-{self.floods}"):
            return  # the coordinator was down
        def small_answer():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/api/workers", timeout=5) as r:
                    body = r.read()
            except (OSError, urllib.error.URLError):
                return None
            lines = [w["last_log_line"] for w in json.loads(body)["workers"]]
            return r.status == 200 and all(len(line.encode()) <= 2048 for line in lines)
        self.probe("the workers answer after a 4 MB log line", small_answer)
        self.counts["log_floods"] += 1

    def search_bomb(self):
        """A user's search file that would expand into 200 MB of job files, sent over the wire
        (jobctl would refuse it before sending): refused at once, the coordinator unhurt."""
        keys = wire.read_keys(os.path.join(self.keys, "clients", USERS[0]), "client.key")
        submit = wire.message("SubmitRequest")(yaml=search_bomb(self.train), source="bomb.yaml", base_dir=self.work,
                                               idempotency_key=os.urandom(8).hex(), user=USERS[0])
        start = time.time()
        reply = wire.ask(self.endpoint, keys, wire.envelope(submit=submit))
        if reply is None and self.coordinator.poll() is not None:
            return  # the coordinator was down
        refused = (reply is not None and reply.WhichOneof("body") == "error" and reply.error.code == 2 and
                   "MiB of job files" in reply.error.message)
        said = "no answer" if reply is None else str(reply)[:300]
        self.bombs.append((time.time() - start, refused, said))
        self.counts["search_bombs"] += 1

    def crowd_dashboard(self):
        """300 idle and 50 trickling connections to the dashboard while it is asked."""
        crowd = []
        try:
            for i in range(350):
                s = socket.create_connection(("127.0.0.1", self.http_port), timeout=5)
                if i >= 300:
                    s.sendall(b"GET /api/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                crowd.append(s)
            for _ in range(5):
                self.probe("dashboard amid 350 slow clients", lambda: self.dashboard("/api/jobs"))
        except OSError:
            pass  # the coordinator was just killed: nothing to crowd
        finally:
            for s in crowd:
                s.close()
        self.counts["crowds"] += 1

    def dashboard(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return None

    def probe(self, what, ask):
        if self.coordinator.poll() is not None:
            return
        start = time.time()
        answered = bool(ask())
        self.probes.append((what, time.time() - start, answered))

    def cancel_one(self):
        jobs = [j for j in (self.jobctl("list") or []) if j["state"] in ("QUEUED", "RUNNING")]
        if jobs and self.jobctl("cancel", str(self.rng.choice(jobs)["id"])):
            self.counts["cancels"] += 1

    def cancel_foreign(self):
        """The user who does not own a job tries to cancel it: refused with exit 2."""
        jobs = [j for j in (self.jobctl("list") or []) if j["state"] in ("QUEUED", "RUNNING") and j["user"] in USERS]
        if not jobs:
            return
        job = self.rng.choice(jobs)
        other = USERS[1 - USERS.index(job["user"])]
        r = self.run_jobctl("cancel", str(job["id"]), user=other)
        if r is None or "refused" not in r.stderr and r.returncode != 0:
            return  # the coordinator was down: no answer either way
        self.foreign_cancels.append((job["id"], r.returncode == 2 and "belongs to" in r.stderr))
        self.counts["foreign_cancels"] += 1

    def actions(self):
        """Each kind of fault with its weight in the random draw."""
        return [(self.kill_job_process, 3), (self.stop_job_process, 2), (self.kill_agent, 1), (self.stop_agent, 1),
                (self.kill_coordinator, 2), (self.stop_coordinator, 2), (self.stop_coordinator_long, 0.5),
                (self.cancel_one, 2), (self.cancel_foreign, 1), (self.squat, 1), (self.plant_files, 1),
                (self.crowd_dashboard, 1), (self.flood_log_line, 0.5), (self.search_bomb, 0.5)]

    def act(self):
        """The tour first: every kind of fault once, in a random order (the 45 s pause of the
        coordinator only by draw: pool_pause_45 covers it alone), so that even a short soak
        meets each. A fault with nothing to act on (no running job yet) changes no count and
        stays first in the tour. Then faults drawn by weight."""
        if self.tour:
            action = self.tour[-1]
            before = sum(self.counts.values())
            action()
            if sum(self.counts.values()) != before:
                self.tour.pop()
                if not self.tour:
                    print(f"[{time.strftime('%H:%M:%S')}] the tour met every kind of fault", flush=True)
            return action.__name__
        kinds, weights = zip(*self.actions())
        action = self.rng.choices(kinds, weights=weights)[0]
        action()
        return action.__name__

    # --- the soak ----------------------------------------------------------------------
    def run(self):
        self.start_coordinator()
        for index in range(self.args.pools):
            self.start_pool(index)
        pending = []
        self.tour = [kind for kind, _ in self.actions() if kind != self.stop_coordinator_long]
        self.rng.shuffle(self.tour)
        deadline = time.time() + self.args.minutes * 60
        latest = deadline + self.args.minutes * 60  # a tour not ended by the deadline may take as long again
        next_action = time.time() + 10
        last_report = 0
        while time.time() < deadline or (self.tour and time.time() < latest):
            queued = sum(1 for j in (self.jobctl("list") or []) if j["state"] == "QUEUED")
            if queued < 4 and len(pending) < 4:
                name, path = self.job_file()
                pending.append((f"soak-{name}", path, self.rng.choice(USERS)))
                self.counts["submitted"] += 1
            pending = self.submit_pending(pending)
            if time.time() >= next_action:
                self.act()
                next_action = time.time() + self.rng.uniform(0.5, 1.5) * self.args.pace
            self.replace_lost_agents()
            if self.coordinator.poll() is None:
                self.memory.append(rss_mb(self.coordinator.pid))
            if time.time() - last_report > 60:
                last_report = time.time()
                print(f"[{time.strftime('%H:%M:%S')}] {len(self.acknowledged)} jobs acknowledged; {self.counts}",
                      flush=True)
            time.sleep(1)
        while pending:
            pending = self.submit_pending(pending)
            self.replace_lost_agents()
        print("chaos over; letting every job finish", flush=True)
        drain_deadline = time.time() + self.args.drain_minutes * 60
        while time.time() < drain_deadline:
            self.replace_lost_agents()
            jobs = self.jobctl("list") or []
            if jobs and all(j["state"] in TERMINAL for j in jobs):
                break
            time.sleep(2)

    def stop(self):
        for pool in list(self.pools.values()) + self.agents:
            terminate(pool, 30)
        if self.coordinator and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            self.coordinator.wait(timeout=30)

    # --- invariants --------------------------------------------------------------------
    def invariants_hold(self):
        """Whether every invariant of the module's text holds; prints each one's line."""
        db = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True)
        jobs = {row[0]: row for row in db.execute("SELECT id, state, idempotency_key, reason, user FROM jobs")}
        attempts = {}
        for job, attempt, outcome, ended_at in db.execute("SELECT job, attempt, outcome, ended_at FROM attempts"):
            attempts.setdefault(job, []).append((attempt, outcome or "", ended_at or 0))
        checks = {}
        keys = [row[2] for row in jobs.values()]
        # The store scopes each idempotency key by its owner: "<user>/<key>".
        checks["every acknowledged submission is exactly one job"] = (
            len(keys) == len(set(keys)) and
            all(j in jobs and jobs[j][2] == f"{jobs[j][4]}/{k}" for k, j in self.acknowledged.items()))
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
            logged = []
            if os.path.exists(path):
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
        for world, refused in self.squats:
            if not refused:
                print("a squat attempt on", world, "was not refused")
        checks["every squat attempt was refused"] = all(refused for _, refused in self.squats)
        for seconds, refused, said in self.bombs:
            if not refused or seconds > 5:
                print(f"a search bomb was not refused within 5 s: in {seconds:.1f} s, the answer: {said}")
        checks["every search bomb was refused within 5 s"] = all(r and t <= 5 for t, r, _ in self.bombs)
        slow = [(what, round(seconds, 1)) for what, seconds, answered in self.probes if not answered or seconds > 5]
        for what, seconds in slow:
            print("a query went unanswered, or took more than 5 s:", what, seconds)
        checks["planted files and crowding clients stalled no query"] = not slow
        misowned = [(j, row[4], self.owners[j]) for j, row in jobs.items() if j in self.owners and
                    row[4] != self.owners[j]]
        for job, stored, submitter in misowned:
            print("job", job, "belongs to", stored, "but", submitter, "submitted it")
        by_user = [(j, row[3]) for j, row in jobs.items() if row[1] == "CANCELLED" and "by an admin key" not in row[3]]
        for job, reason in by_user:
            print("job", job, "was cancelled but not by an admin:", reason)
        accepted = [job for job, refused in self.foreign_cancels if not refused]
        for job in accepted:
            print("a cancel of job", job, "by the user who does not own it was not refused")
        checks["jobs belong to their submitters, and only an admin cancelled any"] = not (misowned or by_user or
                                                                                         accepted)
        for kind in self.tour:
            print("the soak ended before it met this kind of fault:", kind.__name__)
        checks["every kind of fault was met (the tour ended)"] = not self.tour
        preemptions = db.execute("SELECT COUNT(*) FROM events WHERE text LIKE 'preempted by job %'").fetchone()[0]
        summary = {"jobs": len(jobs), **{s.lower(): n for s, n in states.items() if n},
                   "attempts": sum(len(r) for r in attempts.values()),
                   "restarts": sum(max(0, len(r) - 1) for r in attempts.values()),
                   "victim_jobs": len(self.victims), "preemptions": preemptions, **self.counts,
                   "probes": len(self.probes),
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
    p.add_argument("--pace", type=float, default=8,
                   help="seconds between two faults on average (default 8; each wait is 0.5 to 1.5 times it)")
    p.add_argument("--pools", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2, help="ranks per pool")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, state, runs)")
    p.add_argument("--bin", default=BIN, help="folder of worker, coordinator and jobctl (default: $TRAINYARD_BIN, "
                   "else build/bin)")
    a = p.parse_args()
    globals()["BIN"] = a.bin
    print(f"chaos soak: {a.minutes} min, {a.pools} pools of {a.ranks} ranks, seed {a.seed}", flush=True)
    work = tempfile.mkdtemp(prefix="trainyard-chaos-")
    soak = Soak(a, work)
    try:
        soak.run()
    finally:
        soak.stop()
    ok = soak.invariants_hold()
    if a.keep or not ok:
        print("scratch folder kept:", work)
    else:
        shutil.rmtree(work)
    check(ok, "an invariant failed (the FAIL lines above)")


if __name__ == "__main__":
    main()
