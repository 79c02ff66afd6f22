#!/usr/bin/env python3
"""A cluster simulated against a real coordinator: many pool agents, each a CURVE client
of its own speaking the wire (proto/trainyard.proto) as worker/pool/pool_agent.cc does,
whose jobs run no process (a lead reports its result when the job's simulated duration
has passed), a real coordinator and a real SQLite store. See scripts/bench/scale.sh.

Each agent is one rank of a world of its own on a simulated host of --slots-per-host
slots. It registers, heartbeats, answers Reregister with a Register, and on an Assign
names the attempt in its heartbeats at once; the lead reports SUCCEEDED after the job's
duration; a rank told to stop reports CANCELLED, PREEMPTED (a preemption, after
--preempt-delay) or RELEASED (a held slot). Results are resent until acknowledged, as the
agents do. A job's name carries its simulated duration in milliseconds ("sim-<ms>").

Scenarios (--scenario, repeatable):
  steady      jobs arrive at a rate that keeps about half the slots busy, for --seconds;
  burst       --jobs jobs submitted at once, until every one has ended;
  restart     a burst, with the coordinator killed (SIGKILL) and started again on the
              same state file when a third of the jobs have ended;
  lost        steady load, with 10% of the agents gone at once (their sockets closed
              without a word) midway;
  preemption  the cluster filled with preemptible jobs of priority 0, then a wave of
              priority-10 jobs each needing a whole host, under --preemption on;
  users       Kueue's scale test in kind: --users-jobs jobs of 5 users with quotas and
              a few priority-10 jobs under --preemption on, submitted user after user;
              how soon every job has started, and each user's share of what ran;
  search      one random search of --trials trials, --trials-concurrent at once.

It prints one JSON object per scenario and writes them all to --out."""
import argparse
import json
import multiprocessing
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests"))
from harness import wire  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")  # no child inherits a ZeroMQ context
NAME = re.compile(r"^name: sim-(\d+)(?:\.t\d+)?$", re.M)  # a job, or a trial of a search so named


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """One simulated rank: its socket, its registration and the attempt it holds."""

    def __init__(self, context, endpoint, keys, index, slots_per_host, heartbeat_s):
        import zmq
        self.world = f"sim-{index}"
        self.host = f"simhost-{index // slots_per_host}"
        self.slot = index % slots_per_host
        self.world_token, self.rank_token = secrets.token_hex(16), secrets.token_hex(16)
        self.socket = context.socket(zmq.DEALER)
        self.socket.curve_publickey, self.socket.curve_secretkey, self.socket.curve_serverkey = (
            k.encode() for k in keys)
        self.socket.linger = 0
        # As worker/pool/pool_agent.cc does (Note [Link liveness]): ZMTP heartbeats watch the link.
        self.socket.heartbeat_ivl = int(heartbeat_s * 1000)
        self.socket.heartbeat_timeout = self.socket.heartbeat_ttl = int(3 * heartbeat_s * 1000)
        self.socket.connect(endpoint)
        self.job, self.attempt, self.lead, self.done_at, self.ending = 0, 0, False, None, "SUCCEEDED"
        self.unacked = {}  # (job, attempt) -> serialized JobResult envelope

    def send(self, env):
        self.socket.send(env.SerializeToString())

    def register(self):
        rank = wire.message("RankInfo")(world=self.world, rank=0, world_size=1, host=self.host, device="cpu",
                                        pid=os.getpid(), slot=self.slot)
        self.send(wire.envelope(register=wire.message("Register")(
            rank=rank, job_id=self.job, attempt=self.attempt, world_token=self.world_token,
            rank_token=self.rank_token)))
        for data in self.unacked.values():
            self.socket.send(data)

    def heartbeat(self):
        self.send(wire.envelope(heartbeat=wire.message("Heartbeat")(
            world=self.world, rank=0, job_id=self.job, attempt=self.attempt, rank_token=self.rank_token)))

    def finish(self, outcome, message=""):
        env = wire.envelope(result=wire.message("JobResult")(
            job_id=self.job, attempt=self.attempt, world_rank=0, world=self.world, end=outcome, message=message,
            rank_token=self.rank_token))
        data = env.SerializeToString()
        self.unacked[(self.job, self.attempt)] = data
        self.socket.send(data)
        self.job, self.attempt, self.lead, self.done_at = 0, 0, False, None
        self.heartbeat()


def handle(agent, env, now, preempt_delay, events):
    """One message from the coordinator to `agent`."""
    body = env.WhichOneof("body")
    if body == "reregister":
        agent.register()
    elif body == "assign":
        a = env.assign
        agent.job, agent.attempt = a.job_id, a.attempt
        agent.lead = a.places[0].world == agent.world
        if agent.lead:
            name = NAME.search(a.yaml)
            agent.ending = "SUCCEEDED"
            agent.done_at = now + (int(name.group(1)) / 1000.0 if name else 1.0)
            events.append(("assigned", a.job_id, a.attempt, now))
        agent.heartbeat()
    elif body == "stop":
        s = env.stop
        if s.job_id != agent.job or s.attempt != agent.attempt:
            return
        if not agent.lead:
            agent.finish(OUTCOME["RELEASED"])
        elif s.preempt:
            agent.done_at = now + preempt_delay  # a step, then a checkpoint
            agent.ending = "PREEMPTED"
        else:
            agent.finish(OUTCOME["CANCELLED"], "stopped on request")
    elif body == "ack":
        agent.unacked.pop((env.ack.job_id, env.ack.attempt), None)


OUTCOME = {}


def load_outcomes():
    enum = wire.message("JobResult").DESCRIPTOR.fields_by_name["end"].enum_type
    for value in enum.values:
        OUTCOME[value.name[len("OUTCOME_"):]] = value.number


def agents_main(endpoint, keys, first, count, slots_per_host, heartbeat_s, preempt_delay, control, seed):
    """A process of `count` agents; `control` takes "lose <fraction>" and "report"."""
    import zmq
    load_outcomes()
    random.seed(seed)
    context = zmq.Context()
    agents = [Agent(context, endpoint, keys, i, slots_per_host, heartbeat_s) for i in range(first, first + count)]
    by_socket = {a.socket: a for a in agents}
    alive = set(by_socket)
    poller = zmq.Poller()
    for a in agents:
        poller.register(a.socket, zmq.POLLIN)
        a.register()
    poller.register(control.fileno(), zmq.POLLIN)
    events = []
    next_beat = time.time() + heartbeat_s
    while True:
        ready = dict(poller.poll(20))
        now = time.time()
        if control.fileno() in ready:
            command = control.recv()
            if command == "report":
                control.send(events)
                events = []
            elif command == "quit":
                break
            elif command.startswith("lose "):
                gone = random.sample(agents, int(len(agents) * float(command.split()[1])))
                for a in gone:
                    alive.discard(a.socket)
                    poller.unregister(a.socket)
                    a.socket.close(linger=0)
                    agents.remove(a)
                control.send([a.world for a in gone])
        for sock, _ in ready.items():
            if sock not in alive:
                continue
            agent = by_socket[sock]
            while True:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                handle(agent, wire.message("Envelope").FromString(data), now, preempt_delay, events)
        for a in agents:
            if a.lead and a.done_at is not None and now >= a.done_at:
                job, attempt, ending = a.job, a.attempt, a.ending
                a.finish(OUTCOME[ending])
                events.append((ending.lower(), job, attempt, now))
        if now >= next_beat:
            next_beat = now + heartbeat_s
            for a in agents:
                a.heartbeat()
                for data in a.unacked.values():
                    a.socket.send(data)
    for a in agents:
        a.socket.close(linger=0)
    context.term()


class Sim:
    """A coordinator, its keys and state, and the processes of simulated agents."""

    def __init__(self, args, work, coordinator_flags=(), users=()):
        self.args, self.work = args, work
        self.keys_dir = os.path.join(work, "keys")
        subprocess.run([args.coordinator, "--init", "--keys", self.keys_dir], check=True, capture_output=True)
        self.user_keys = {user: self.add_client(user) for user in users}  # before the coordinator reads the allowlist
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.http = free_port()
        self.flags = list(coordinator_flags)
        self.worker_keys = wire.read_keys(self.keys_dir, "worker.key")
        self.client_keys = wire.read_keys(self.keys_dir, "client.key")
        self.coordinator = None
        self.start_coordinator()
        self.procs, self.pipes = [], []
        per = -(-args.agents // args.procs)
        for p in range(args.procs):
            first, count = p * per, min(per, args.agents - p * per)
            if count <= 0:
                break
            mine, theirs = SPAWN.Pipe()
            proc = SPAWN.Process(target=agents_main, args=(
                self.endpoint, self.worker_keys, first, count, args.slots_per_host, args.heartbeat,
                args.preempt_delay, theirs, args.seed + p), daemon=True)
            proc.start()
            self.procs.append(proc)
            self.pipes.append(mine)
        self.events = []
        self.submitted = {}  # job id -> time its submission was sent

    def start_coordinator(self):
        log = open(os.path.join(self.work, "coordinator.log"), "a")
        self.coordinator = subprocess.Popen(
            [self.args.coordinator, "--listen", self.endpoint, "--state", os.path.join(self.work, "state.db"),
             "--runs", os.path.join(self.work, "runs"), "--keys", self.keys_dir, "--http", f"127.0.0.1:{self.http}",
             "--heartbeat", str(self.args.heartbeat), "--liveness", "3", "--grace", "30", "--restart-backoff", "1",
             *self.flags], stdout=log, stderr=subprocess.STDOUT)

    def wait_registered(self, count, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                up = self.metric_sum("trainyard_worker_up")
            except OSError:
                up = 0
            if up >= count:
                return time.time()
            time.sleep(0.5)
        raise RuntimeError(f"only {up:.0f} of {count} agents registered within {timeout} s")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric_sum(self, name):
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def pass_p99_ms(self):
        """The 99th percentile of trainyard_scheduling_pass_seconds, interpolated within
        its bucket as Prometheus's histogram_quantile does."""
        buckets = []
        for line in self.metrics().splitlines():
            m = re.match(r'trainyard_scheduling_pass_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
            if m:
                buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
        if not buckets or buckets[-1][1] == 0:
            return None
        rank, lower, below = 0.99 * buckets[-1][1], 0.0, 0.0
        for bound, count in buckets:
            if count >= rank:
                if bound == float("inf"):
                    return lower * 1000
                return (lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)) * 1000
            lower, below = bound, count
        return None

    def add_client(self, user):
        """The keys of a new client key pair for `user` (coordinator --add-client)."""
        folder = os.path.join(self.keys_dir, "clients", user)
        subprocess.run([self.args.coordinator, "--add-client", user, "--keys", self.keys_dir], check=True,
                       capture_output=True)
        return wire.read_keys(folder, "client.key")

    def submit(self, jobs, window=64, keys=None):
        """Submits each (name, ranks, priority, preemptible) over one CURVE client (the
        admin's, or `keys`), with up to `window` in flight; returns the ids in order."""
        files = []
        for i, (name, ranks, priority, preemptible) in enumerate(jobs):
            files.append((f"name: {name}\ndata:\n  train: train.tsv\n  tokenizer:\n    vocab: vocab.txt\n"
                          f"model:\n  preset: tiny\nresources:\n  ranks: {ranks}\n  max_restarts: 1\n"
                          f"  priority: {priority}\n  preemptible: {'true' if preemptible else 'false'}\n",
                          f"{name}.yaml"))
        return self.submit_files(files, window, keys)

    def submit_files(self, files, window=64, keys=None):
        """Submits each (job file text, source name); returns the ids in order."""
        import zmq
        context = zmq.Context()
        s = context.socket(zmq.DEALER)
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = (k.encode() for k in keys or self.client_keys)
        s.linger = 0
        s.connect(self.endpoint)
        ids, pending, sent_at, queue = [], 0, {}, list(enumerate(files))
        queue.reverse()
        while queue or pending:
            while queue and pending < window:
                i, (yaml, source) = queue.pop()
                s.send(wire.envelope(submit=wire.message("SubmitRequest")(
                    yaml=yaml, source=source, base_dir=self.work,
                    idempotency_key=f"sim-{time.time_ns()}-{i}")).SerializeToString())
                sent_at[i] = time.time()
                pending += 1
            if not s.poll(30000):
                raise RuntimeError("the coordinator did not answer a submission within 30 s")
            reply = wire.message("Envelope").FromString(s.recv())
            pending -= 1
            if reply.WhichOneof("body") != "submitted":
                raise RuntimeError(f"a submission was refused: {reply}")
            ids.append(reply.submitted.job_id)
        s.close()
        context.term()
        first_sent = min(sent_at.values()) if sent_at else time.time()
        for job in ids:
            self.submitted.setdefault(job, first_sent)
        return ids

    def job_state(self, job):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/api/jobs/{job}", timeout=10) as r:
            return json.loads(r.read())["state"]

    def collect(self):
        for pipe in self.pipes:
            pipe.send("report")
        for pipe in self.pipes:
            self.events.extend(pipe.recv())
        return self.events

    def lose(self, fraction):
        gone = []
        for pipe in self.pipes:
            pipe.send(f"lose {fraction}")
        for pipe in self.pipes:
            gone.extend(pipe.recv())
        return gone

    def usage(self):
        """The coordinator's CPU seconds so far and its resident MiB now, from /proc."""
        cpu = self.cpu_seconds(f"/proc/{self.coordinator.pid}/stat")
        with open(f"/proc/{self.coordinator.pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        return cpu, rss

    def loop_cpu(self):
        """CPU seconds of the coordinator's loop, its main thread (ZeroMQ's I/O thread apart)."""
        return self.cpu_seconds(f"/proc/{self.coordinator.pid}/task/{self.coordinator.pid}/stat")

    @staticmethod
    def cpu_seconds(stat_path):
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def ended_jobs(self):
        """Jobs in an ended state, from one scrape of /metrics."""
        ended = [f'trainyard_jobs{{state="{state}"}} ' for state in ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in self.metrics().splitlines()
                   if any(line.startswith(prefix) for prefix in ended))

    def close(self):
        for pipe in self.pipes:
            try:
                pipe.send("quit")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        if self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            try:
                self.coordinator.wait(10)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()


def job_mix(rng, count, slots_per_host, min_ms, max_ms):
    """`count` jobs of 1 to a host's worth of ranks (most small), each a duration drawn
    between min_ms and max_ms."""
    jobs = []
    for _ in range(count):
        ranks = rng.choice([1, 1, 1, 2, 2, 4, slots_per_host])
        ms = rng.randint(min_ms, max_ms)
        jobs.append((f"sim-{ms}", ranks, 0, True))
    return jobs


def wait_ended(sim, count, timeout, on_progress=None):
    deadline, last = time.time() + timeout, -1
    while time.time() < deadline:
        ended = sim.ended_jobs()
        if on_progress:
            on_progress(ended)
        if ended >= count:
            return True
        if ended != last:
            print(f"  {ended:.0f} of {count} jobs ended", file=sys.stderr, flush=True)
            last = ended
        time.sleep(2)
    return False


def lead_figures(sim, since=0.0):
    """From the agents' events: submit-to-running latencies (ms) of each job's first
    attempt, jobs run twice (an attempt that succeeded after another of the same job had)
    and the first-assignment times."""
    events = sim.collect()
    first_assign, succeeded = {}, {}
    for kind, job, attempt, at in events:
        if kind == "assigned":
            first_assign[job] = min(first_assign.get(job, at), at)
        elif kind == "succeeded":
            succeeded.setdefault(job, set()).add(attempt)
    latencies = sorted((first_assign[j] - sim.submitted[j]) * 1000 for j in first_assign
                       if j in sim.submitted and sim.submitted[j] >= since)
    run_twice = sum(1 for attempts in succeeded.values() if len(attempts) > 1)
    return latencies, run_twice, first_assign


def percentile(values, q):
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def result(sim, scenario, jobs, latencies, run_twice, placed_per_s, cpu_pct, extra=None):
    ended = sim.ended_jobs()
    out = {"scenario": scenario, "agents": sim.args.agents, "jobs": jobs,
           "placed_per_s": round(placed_per_s, 1) if placed_per_s is not None else None,
           "submit_to_running_p50_ms": round(percentile(latencies, 0.5), 1) if latencies else None,
           "submit_to_running_p99_ms": round(percentile(latencies, 0.99), 1) if latencies else None,
           "pass_p99_ms": round(sim.pass_p99_ms() or 0, 2),
           "coordinator_cpu_pct": round(cpu_pct, 1), "coordinator_rss_mb": round(sim.usage()[1], 1),
           "restart_to_scheduling_s": None, "jobs_lost": int(jobs - ended), "jobs_run_twice": run_twice}
    out.update(extra or {})
    return out


def watch_loss(sim, survivors, detected, timeout=60):
    """Sets detected["at"] when /metrics first counts no more than `survivors` ranks up."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if sim.metric_sum("trainyard_worker_up") <= survivors:
                detected["at"] = time.time()
                return
        except OSError:
            pass
        time.sleep(0.1)


def scenario_steady(args, work, lose_fraction=0.0):
    """Poisson arrivals keeping about half the slots busy for args.seconds."""
    rng = random.Random(args.seed)
    sim = Sim(args, work)
    try:
        sim.wait_registered(args.agents)
        mean_ms = (args.min_ms + args.max_ms) / 2
        mean_ranks = (1 + 1 + 1 + 2 + 2 + 4 + args.slots_per_host) / 7
        rate = 0.5 * args.agents / (mean_ranks * mean_ms / 1000)  # jobs a second
        cpu0, loop0, start = sim.usage()[0], sim.loop_cpu(), time.time()
        jobs, lost_at, gone, detected = 0, None, [], {}
        while time.time() - start < args.seconds:
            tick = time.time()
            batch = job_mix(rng, max(1, int(rate)), args.slots_per_host, args.min_ms, args.max_ms)
            jobs += len(sim.submit(batch))
            if lose_fraction and lost_at is None and time.time() - start > args.seconds / 2:
                gone, lost_at = sim.lose(lose_fraction), time.time()
                detector = threading.Thread(target=watch_loss, args=(sim, args.agents - len(gone), detected))
                detector.start()
            time.sleep(max(0.0, 1.0 - (time.time() - tick)))
        cpu, loop = sim.usage()[0] - cpu0, sim.loop_cpu() - loop0
        elapsed = time.time() - start
        wait_ended(sim, jobs, args.max_ms / 1000 * 4 + 120)
        latencies, run_twice, first = lead_figures(sim)
        extra = {"seconds": round(elapsed, 1), "arrivals_per_s": round(rate, 1),
                 "coordinator_loop_cpu_pct": round(100 * loop / elapsed, 1)}
        if lose_fraction:
            detector.join()
            extra.update(agents_lost=len(gone),
                         lost_detected_s=round(detected["at"] - lost_at, 2) if "at" in detected else None)
        return result(sim, "lost" if lose_fraction else "steady", jobs, latencies, run_twice,
                      len(first) / elapsed, 100 * cpu / elapsed, extra)
    finally:
        sim.close()


def scenario_burst(args, work, restart=False):
    rng = random.Random(args.seed)
    sim = Sim(args, work)
    try:
        sim.wait_registered(args.agents)
        jobs = job_mix(rng, args.jobs, args.slots_per_host, args.min_ms // 4, args.max_ms // 4)
        cpu0, start = sim.usage()[0], time.time()
        ids = sim.submit(jobs)
        submitted_in = time.time() - start
        extra = {"submitted_in_s": round(submitted_in, 1)}
        restarted = {}

        def maybe_restart(ended):
            if restart and not restarted and ended >= len(ids) / 3:
                cpu_before = sim.usage()[0]
                sim.coordinator.kill()
                sim.coordinator.wait()
                restarted["at"] = time.time()
                restarted["cpu"] = cpu_before
                sim.start_coordinator()

        ok = wait_ended(sim, len(ids), 60 + args.jobs * args.max_ms / 1000 / args.agents * 8, maybe_restart)
        elapsed = time.time() - start
        cpu = sim.usage()[0] + restarted.get("cpu", 0) - (0 if restarted else cpu0)
        latencies, run_twice, first = lead_figures(sim)
        if restarted:
            after = sorted(at for at in first.values() if at > restarted["at"])
            extra["restart_to_scheduling_s"] = round(after[0] - restarted["at"], 2) if after else None
        extra.update(all_ended=ok, seconds=round(elapsed, 1))
        out = result(sim, "restart" if restart else "burst", len(ids), latencies, run_twice,
                     len(first) / elapsed, 100 * cpu / elapsed)
        out.update(extra)
        return out
    finally:
        sim.close()


def scenario_preemption(args, work):
    rng = random.Random(args.seed)
    sim = Sim(args, work, ["--preemption", "on"])
    try:
        sim.wait_registered(args.agents)
        hosts = args.agents // args.slots_per_host
        low = [(f"sim-{args.max_ms * 20}", args.slots_per_host, 0, True) for _ in range(hosts)]
        sim.submit(low)
        wait_for_running = time.time() + 60
        while time.time() < wait_for_running and sim.metric_sum("trainyard_running_attempts") < hosts:
            time.sleep(0.5)
        cpu0, start = sim.usage()[0], time.time()
        high = [(f"sim-{rng.randint(args.min_ms, args.max_ms)}", args.slots_per_host, 10, True)
                for _ in range(hosts // 2)]
        ids = sim.submit(high)
        deadline = time.time() + 120
        while time.time() < deadline:
            latencies, _, first = lead_figures(sim, since=start)
            if all(j in first for j in ids):
                break
            time.sleep(1)
        elapsed = time.time() - start
        latencies, run_twice, first = lead_figures(sim, since=start)
        placed = [j for j in ids if j in first]
        cpu = sim.usage()[0] - cpu0
        return result(sim, "preemption", len(ids), latencies, run_twice, len(placed) / elapsed, 100 * cpu / elapsed,
                      {"jobs_lost": len(ids) - len(placed), "high_priority_placed": len(placed),
                       "preemptions": sim.metric_sum("trainyard_preemptions_total")})
    finally:
        sim.close()


def scenario_users(args, work):
    """Kueue's scale test in kind: --users-jobs jobs of 5 users, each under a quota of 30%
    of the slots, submitted in turns of 250 a user, 5% of each user's at priority 10
    under --preemption on. The scheduling work is done when every job has started once.
    Each user's share of the rank-seconds run, from the first submission until the first
    user's last job started (while all five had jobs queued), is set beside the policy's:
    equal usage among equal priorities (Note [Fair share] in coordinator/state_store.h)."""
    rng = random.Random(args.seed)
    users = [f"user{u}" for u in range(1, 6)]
    quota = int(0.3 * args.agents)  # each agent is one slot
    sim = Sim(args, work, ["--preemption", "on", "--user-max-ranks", str(quota), "--user-max-priority", "10"], users)
    try:
        sim.wait_registered(args.agents)
        mine = {user: [(name, ranks, 10 if rng.random() < 0.05 else 0, True) for name, ranks, _, _ in
                       job_mix(rng, args.users_jobs // len(users), args.slots_per_host, args.min_ms // 4,
                               args.max_ms // 4)] for user in users}
        owner, ranks_of = {}, {}
        cpu0, start = sim.usage()[0], time.time()
        for turn in range(0, max(len(jobs) for jobs in mine.values()), 250):
            for user in users:
                jobs = mine[user][turn:turn + 250]
                for job_id, job in zip(sim.submit(jobs, keys=sim.user_keys[user]), jobs):
                    owner[job_id], ranks_of[job_id] = user, job[1]
        ids = list(owner)
        ok = wait_ended(sim, len(ids), 60 + len(ids) * args.max_ms / 1000 / args.agents * 8)
        elapsed = time.time() - start
        cpu = sim.usage()[0] - cpu0
        latencies, run_twice, first = lead_figures(sim)
        scheduled_in = max(first.values()) - start if len(first) == len(ids) else None
        shares = user_shares(sim.events, owner, ranks_of, start)
        worst = max(abs(share - 1 / len(users)) * len(users) for share in shares.values()) if shares else None
        return result(sim, "users", len(ids), latencies, run_twice, len(first) / elapsed, 100 * cpu / elapsed,
                      {"all_ended": ok, "seconds": round(elapsed, 1),
                       "scheduled_in_s": round(scheduled_in, 1) if scheduled_in else None,
                       "preemptions": sim.metric_sum("trainyard_preemptions_total"),
                       "user_shares_pct": {u: round(100 * s, 2) for u, s in sorted(shares.items())},
                       "fair_share_error_pct": round(100 * worst, 1) if worst is not None else None})
    finally:
        sim.close()


def attempt_spans(events):
    """Each attempt a lead ran, from the leads' events: (job, start, end), end None while
    it still runs."""
    began, spans = {}, []
    for kind, job, attempt, at in sorted(events, key=lambda e: e[3]):
        if kind == "assigned":
            began[(job, attempt)] = at
        elif (job, attempt) in began:
            spans.append((job, began.pop((job, attempt)), at))
    return spans + [(job, at, None) for (job, _), at in began.items()]


def overlap(span_start, span_end, start, end):
    return max(0.0, min(span_end, end) - max(span_start, start))


def user_shares(events, owner, ranks_of, since):
    """Each user's fraction of the rank-seconds run from `since` until the first user's
    last job started (while every user still had jobs queued), from the leads' events;
    fair_share_error_pct is the largest distance from an equal share, in % of it."""
    spans = [span for span in attempt_spans(events) if span[0] in owner]
    last_start = {}
    for job, start, _ in spans:
        last_start[owner[job]] = max(last_start.get(owner[job], start), start)
    if not last_start:
        return {}
    until = min(last_start.values())
    used = {user: 0.0 for user in set(owner.values())}
    for job, start, end in spans:
        used[owner[job]] += ranks_of[job] * overlap(start, until if end is None else end, since, until)
    total = sum(used.values())
    return {user: value / total for user, value in used.items()} if total > 0 else {}


def scenario_search(args, work):
    """One random search of --trials trials of one rank and --max-ms/4 each,
    --trials-concurrent at once (Note [Search life cycle] in coordinator/search.h): how
    fast the coordinator keeps its trials going (ideal_s: the waves of trials back to
    back), and that each runs once and the search ends."""
    sim = Sim(args, work)
    try:
        sim.wait_registered(args.agents)
        with open(os.path.join(work, "search.yaml"), "w") as f:
            f.write(f"name: sim-{args.max_ms // 4}\nkind: search\nbase:\n  name: sim-{args.max_ms // 4}\n"
                    f"  data:\n    train: train.tsv\n"
                    f"    tokenizer:\n      vocab: vocab.txt\n  model:\n    preset: tiny\n"
                    f"search:\n  method: random\n  metric: train_loss\n  max_trials: {args.trials}\n"
                    f"  max_concurrent: {args.trials_concurrent}\n  params:\n"
                    f"    train.lr: {{log_uniform: [1.0e-5, 1.0e-1]}}\n    seed: {{int_uniform: [1, 1000000]}}\n")
        cpu0, start = sim.usage()[0], time.time()
        with open(os.path.join(work, "search.yaml")) as f:
            search = sim.submit_files([(f.read(), "search.yaml")])[0]
        ok = wait_ended(sim, args.trials + 1, 60 + args.trials * args.max_ms / 4000 / args.trials_concurrent * 4)
        elapsed = time.time() - start
        cpu = sim.usage()[0] - cpu0
        latencies, run_twice, first = lead_figures(sim)
        state = sim.job_state(search)
        return result(sim, "search", args.trials, None, run_twice, len(first) / elapsed, 100 * cpu / elapsed,
                      {"all_ended": ok, "seconds": round(elapsed, 1), "search_state": state,
                       "ideal_s": -(-args.trials // args.trials_concurrent) * args.max_ms / 4000,
                       "jobs_lost": args.trials - len(first)})
    finally:
        sim.close()


def curve_point(args, work, agents):
    """A burst of --jobs jobs on `agents` agents, measured over --curve-window seconds
    from the end of the submissions, while the queue stays deep: placements a second, the
    share of the slots busy (below 100%, the coordinator, not the slots, is the bound),
    the pass's p99 and the coordinator's CPU."""
    point_args = argparse.Namespace(**{**vars(args), "agents": agents})
    rng = random.Random(args.seed)
    sim = Sim(point_args, work)
    try:
        sim.wait_registered(agents, timeout=300)
        jobs = job_mix(rng, args.jobs, args.slots_per_host, args.min_ms // 4, args.max_ms // 4)
        ranks_of = {job_id: job[1] for job_id, job in zip(sim.submit(jobs), jobs)}
        cpu0, start = sim.usage()[0], time.time()
        time.sleep(args.curve_window)
        cpu, end = sim.usage()[0] - cpu0, time.time()
        _, run_twice, first = lead_figures(sim)
        placed = sum(1 for at in first.values() if start <= at < end)
        busy = busy_rank_seconds(sim.events, ranks_of, start, end)
        return {"scenario": "curve", "agents": agents, "jobs": len(jobs), "window_s": args.curve_window,
                "placed_per_s": round(placed / (end - start), 1),
                "slots_busy_pct": round(100 * busy / (agents * (end - start)), 1),
                "pass_p99_ms": round(sim.pass_p99_ms() or 0, 2),
                "coordinator_cpu_pct": round(100 * cpu / (end - start), 1),
                "coordinator_rss_mb": round(sim.usage()[1], 1), "jobs_run_twice": run_twice}
    finally:
        sim.close()


def busy_rank_seconds(events, ranks_of, start, end):
    """Rank-seconds the leads' attempts ran within [start, end); an attempt still running
    counts to `end`."""
    return sum(ranks_of.get(job, 0) * overlap(s, end if e is None else e, start, end)
               for job, s, e in attempt_spans(events))


def curve_svg(points):
    """Placements a second (both axes logarithmic: a straight line of slope 1 is linear
    scaling) and the pass's p99 against the agents: an SVG of two panels."""
    import math
    xs = [p["agents"] for p in points]
    x_lo, x_hi = math.log10(min(xs)), math.log10(max(xs))
    width, height, pad = 360, 240, 48

    def panel(left, title, values, log_y):
        top = max(values)
        if log_y:
            y_lo, y_hi = math.floor(math.log10(min(values))), math.ceil(math.log10(top))
            ticks = [10 ** k for k in range(y_lo, y_hi + 1)]
            scale = lambda v: (math.log10(v) - y_lo) / max(y_hi - y_lo, 1)  # noqa: E731
        else:
            step = 10 ** math.floor(math.log10(top)) / 2
            y_hi = step * math.ceil(top * 1.1 / step)
            ticks = [y_hi * k / 4 for k in range(5)]
            scale = lambda v: v / y_hi  # noqa: E731
        x = lambda a: left + pad + (math.log10(a) - x_lo) / max(x_hi - x_lo, 1e-9) * (width - 2 * pad)  # noqa: E731
        y = lambda v: height - pad - scale(v) * (height - 2 * pad)  # noqa: E731
        out = [f'<text x="{left + width / 2}" y="20" text-anchor="middle" font-weight="bold">{title}</text>',
               f'<line x1="{left + pad}" y1="{height - pad}" x2="{left + width - pad}" y2="{height - pad}" stroke="#333"/>',
               f'<line x1="{left + pad}" y1="{pad}" x2="{left + pad}" y2="{height - pad}" stroke="#333"/>',
               f'<text x="{left + width / 2}" y="{height - 8}" text-anchor="middle">agents</text>']
        out += [f'<text x="{x(a):.1f}" y="{height - pad + 16}" text-anchor="middle">{a}</text>' for a in xs]
        out += [f'<text x="{left + pad - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>' for v in ticks]
        path = " ".join(f"{x(a):.1f},{y(v):.1f}" for a, v in zip(xs, values))
        out.append(f'<polyline points="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
        out += [f'<circle cx="{x(a):.1f}" cy="{y(v):.1f}" r="3" fill="#1f77b4"/>' for a, v in zip(xs, values)]
        return out

    body = panel(0, "placements / s (log)", [p["placed_per_s"] for p in points], True)
    body += panel(width, "scheduling pass p99, ms", [p["pass_p99_ms"] for p in points], False)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def agent_counts(text):
    """--curve's value: positive agent counts, comma-separated."""
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive agent counts such as 100,300,1000, not {text!r}")
    return counts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--procs", type=int, default=4, help="processes the agents are spread over")
    p.add_argument("--slots-per-host", type=int, default=8)
    p.add_argument("--jobs", type=int, default=20000, help="jobs of a burst")
    p.add_argument("--seconds", type=float, default=60, help="length of the steady load")
    p.add_argument("--min-ms", type=int, default=4000, help="shortest simulated job")
    p.add_argument("--max-ms", type=int, default=20000, help="longest simulated job")
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--preempt-delay", type=float, default=0.5, help="seconds a preempted job takes to stop")
    p.add_argument("--users-jobs", type=int, default=15000, help="jobs of the users scenario")
    p.add_argument("--trials", type=int, default=1000, help="trials of the search scenario")
    p.add_argument("--trials-concurrent", type=int, default=500, help="the search's max_concurrent")
    p.add_argument("--scenario", action="append",
                   choices=["steady", "burst", "restart", "lost", "preemption", "users", "search"])
    p.add_argument("--curve", type=agent_counts, help="instead of the scenarios: a burst at each of these agent counts "
                   "(comma-separated, e.g. 100,300,1000,3000), measured over --curve-window seconds")
    p.add_argument("--curve-window", type=float, default=30)
    p.add_argument("--svg", help="with --curve: draw the curve to this SVG file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the figures here as a JSON list")
    args = p.parse_args()
    scenarios = args.scenario or ["steady", "burst", "restart", "lost", "preemption", "users", "search"]
    runs = {"steady": lambda w: scenario_steady(args, w), "burst": lambda w: scenario_burst(args, w),
            "restart": lambda w: scenario_burst(args, w, restart=True),
            "lost": lambda w: scenario_steady(args, w, lose_fraction=0.1),
            "preemption": lambda w: scenario_preemption(args, w), "users": lambda w: scenario_users(args, w),
            "search": lambda w: scenario_search(args, w)}
    if args.curve:
        runs = {f"curve-{n}": (lambda w, n=n: curve_point(args, w, n)) for n in args.curve}
        scenarios = list(runs)
    figures = []
    for name in scenarios:
        with tempfile.TemporaryDirectory(prefix=f"ty_scale_{name}_") as work:
            with open(os.path.join(work, "train.tsv"), "w") as f:
                f.write("label\ttext\nen\thello world\n")
            with open(os.path.join(work, "vocab.txt"), "w") as f:
                f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
            print(f"scenario {name}", file=sys.stderr, flush=True)
            figures.append(runs[name](work))
            print(json.dumps(figures[-1]), flush=True)
    if args.curve and args.svg:
        with open(args.svg, "w") as f:
            f.write(curve_svg(figures))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)
    print(markdown_table(figures))


COLUMNS = [("scenario", "scenario"), ("agents", "agents"), ("jobs", "jobs"), ("placed_per_s", "placed/s"),
           ("submit_to_running_p50_ms", "submit→running p50 ms"), ("submit_to_running_p99_ms", "p99 ms"),
           ("pass_p99_ms", "pass p99 ms"), ("coordinator_cpu_pct", "coordinator CPU %"), ("coordinator_loop_cpu_pct", "its loop %"),
           ("slots_busy_pct", "slots busy %"), ("coordinator_rss_mb", "RSS MB"),
           ("restart_to_scheduling_s", "restart→scheduling s"),
           ("lost_detected_s", "lost agents found s"),
           ("jobs_lost", "lost"), ("jobs_run_twice", "run twice")]


def markdown_table(figures):
    """The figures as the Markdown table docs/coordinator.md shows: the columns some
    figure has."""
    columns = [(key, title) for key, title in COLUMNS if any(f.get(key) is not None for f in figures)]
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    for f in figures:
        lines.append("| " + " | ".join("–" if f.get(key) is None else str(f[key]) for key, _ in columns) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
