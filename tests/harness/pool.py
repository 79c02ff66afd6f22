"""A coordinator with its keys and pools of agents on 127.0.0.1, as real processes
(Cluster), and what the tests on one share: their command line (POOL_FLAGS), a case run on
a fresh cluster (on_cluster), a 2-rank langid job file, a run's epoch column, a standalone
run's final losses, and the processes of a running job."""
import csv
import json
import os
import signal
import subprocess

from harness import check
from harness.e2e import (MPI_ENV, free_port, job_yaml, print_tails, subset_tsv, terminate, wait_for, world_rank,
                         write)

POOL_FLAGS = ("--coordinator", "--jobctl", "--worker", "--mpirun")


class Cluster:
    """One coordinator and its pools, in a scratch folder. `args` holds the binaries
    (POOL_FLAGS); keys are made at once, processes by the start_* methods. A subclass
    may give the coordinator more flags (coordinator_flags)."""

    coordinator_flags = ()

    AGENT_FLAGS = ["--heartbeat", "0.5", "--liveness", "4"]

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.state = os.path.join(work, "state.db")
        self.runs = os.path.join(work, "runs")
        self.keys = os.path.join(work, "keys")
        subprocess.run([args.coordinator, "--init", "--keys", self.keys], check=True, capture_output=True)
        self.coordinator = None
        self.pool = None
        self.agents = []
        self.logs = []

    def start(self, ranks):
        self.start_coordinator()
        self.start_pool(ranks)

    def start_coordinator(self):
        log = open(os.path.join(self.work, f"coordinator-{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        self.coordinator = subprocess.Popen(
            [self.args.coordinator, "--listen", self.endpoint, "--state", self.state, "--runs", self.runs,
             "--keys", self.keys,
             "--heartbeat", "0.5", "--liveness", "10", "--grace", "20", "--restart-backoff", "1",
             *self.coordinator_flags],
            stdout=log, stderr=subprocess.STDOUT)

    def start_pool(self, ranks, mpirun_flags=(), env=None):
        """`ranks` agents started by one mpirun."""
        log = open(os.path.join(self.work, f"pool-{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        self.pool = subprocess.Popen(
            [self.args.mpirun, *mpirun_flags, "--oversubscribe", "--bind-to", "none", "-n", str(ranks),
             self.args.worker, "--coordinator", self.endpoint, "--keys", self.keys, *self.AGENT_FLAGS],
            stdout=log, stderr=subprocess.STDOUT, env=env or MPI_ENV, start_new_session=True)
        wait_for(lambda: self.coordinator_alive() and len(self.workers()) == ranks, 60, f"{ranks} ranks to register")

    def coordinator_alive(self):
        """True while the coordinator runs (or was never started); AssertionError, at once, once it has exited."""
        if self.coordinator and self.coordinator.poll() is not None:
            raise AssertionError(f"the coordinator exited with {self.coordinator.returncode}")
        return True

    def start_agent(self, *flags, env=None):
        """One agent started alone, as a service manager would: no mpirun."""
        log = open(os.path.join(self.work, f"agent-{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        agent = subprocess.Popen([self.args.worker, "--coordinator", self.endpoint, "--keys", self.keys,
                                  *self.AGENT_FLAGS, *flags],
                                 stdout=log, stderr=subprocess.STDOUT, env=env or MPI_ENV, start_new_session=True)
        self.agents.append(agent)
        return agent

    def stop(self):
        for process in [self.pool] + self.agents:
            if process:
                terminate(process, 20)
        if self.coordinator and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            self.coordinator.wait(timeout=10)

    def jobctl(self, *args, cwd=None):
        """jobctl --json's answer; AssertionError when jobctl fails."""
        r = subprocess.run([self.args.jobctl, "--coordinator", self.endpoint, "--keys", self.keys, "--timeout", "3",
                            "--json", *args],
                           capture_output=True, text=True, timeout=60, cwd=cwd)
        check(r.returncode == 0, f"jobctl {' '.join(args)}: {r.stderr}")
        return json.loads(r.stdout)

    def workers(self):
        try:
            return self.jobctl("workers")
        except AssertionError:
            return []

    def submit(self, path):
        return self.jobctl("submit", path)["job_id"]

    def job(self, job_id):
        return self.jobctl("status", str(job_id))

    def wait_state(self, job_id, states, timeout):
        return wait_for(lambda: (lambda j: j if j["state"] in states else None)(self.job(job_id)), timeout,
                        f"job {job_id} to reach {states}")

    def epochs_done(self, job_id):
        return len(self.jobctl("report", str(job_id))["epochs"])

    def dump_logs(self):
        print_tails(self.logs, 40)


def on_cluster(case, make=Cluster):
    """A run_case() case that runs case(c, work) on a fresh cluster c = make(args, work):
    stopped after it, and its logs printed first when the case fails."""
    def run(args, work):
        c = make(args, work)
        try:
            case(c, work)
        except BaseException:
            c.stop()
            c.dump_logs()
            raise
        c.stop()
    return run


def write_job(folder, name, epochs, examples=300, max_restarts=0, device="cpu", pause_ms=0):
    """A 2-rank langid job; `pause_ms` pauses it after each step (debug.step_pause_ms), for
    a job that must still be running after a given time however fast the CPU. Written
    once: rewriting it would race with jobs already reading it."""
    train = os.path.join(folder, f"train_{examples}.tsv")
    if not os.path.exists(train):
        subset_tsv(folder, examples)
    extra = f"""train:
  epochs: {epochs}
  batch_size: 16
resources:
  ranks: 2
  max_restarts: {max_restarts}
  device: {"cuda" if device == "cuda" else "any"}
"""
    if pause_ms:
        extra += f"debug:\n  step_pause_ms: {pause_ms}\n"
    if device == "cuda":  # two ranks share the one GPU, which NCCL does not allow
        extra += "distributed:\n  backend: mpi\n"
    return write(os.path.join(folder, f"{name}.yaml"), job_yaml(name, train, extra, device=device))


def epoch_column(path):
    """The epoch column of an epochs.csv, as integers."""
    with open(path, encoding="utf-8") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def final_losses_of_standalone_run(c, work, job_file, name):
    """summary.json's final losses of `job_file` run by mpirun -n 2, without a pool."""
    runs = os.path.join(work, "standalone")
    r = subprocess.run([c.args.mpirun, "--oversubscribe", "--bind-to", "none", "-n", "2", c.args.worker,
                        job_file, "--runs-dir", runs], capture_output=True, text=True, env=MPI_ENV, timeout=300,
                       restore_signals=False)
    check(r.returncode == 0, r.stderr)
    with open(os.path.join(runs, name, "summary.json")) as f:
        return json.load(f)["final"]


def descends_from(pid, root):
    while pid > 1:
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def job_process_pids(worker, pool_pid):
    """The pids of the running job processes (`worker --pool-job`, not the mpirun that
    started them) under this cluster's pool only: other tests' pools may run at the same
    time."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == os.fsencode(worker) and b"--pool-job" in argv and descends_from(int(entry), pool_pid):
            found.append(int(entry))
    return sorted(found)


def job_processes(worker, pool_pid):
    """{job rank: pid} of the running job processes under this cluster's pool."""
    found = {}
    for pid in job_process_pids(worker, pool_pid):
        try:
            found[world_rank(str(pid))] = pid
        except (OSError, KeyError, ValueError):
            continue
    return found
