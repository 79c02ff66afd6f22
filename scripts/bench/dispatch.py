#!/usr/bin/env python3
"""Dispatch benchmark: how fast the coordinator turns submissions into running jobs.

Starts a coordinator and a 2-rank worker pool (mpirun) on 127.0.0.1, submits --jobs
minimal real jobs (tiny model, one training step, 1 rank each) with jobctl from
--submitters parallel clients, waits for all of them, and prints submit->running latency
p50/p99 and sustained jobs/s, from the coordinator's own records (its SQLite state).

With --slurm, and when Debian's slurm-wlm can be started on localhost (slurmctld, slurmd
and munged found), the same count of trivial `sbatch --wrap` jobs goes through a
throw-away one-node Slurm cluster, and the ratios are printed. Slurm's jobs do nothing,
ours train a model for a step: the comparison favours Slurm."""
import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "build", "bin")
LANGID = os.path.join(ROOT, "data", "prepared", "langid")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def minimal_job(work):
    with open(os.path.join(LANGID, "train.tsv"), encoding="utf-8") as f:
        lines = f.readlines()
    for name, count in (("train", 32), ("dev", 16)):
        with open(os.path.join(work, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.writelines(lines[: count + 1])
    path = os.path.join(work, "minimal.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"""name: minimal
data:
  train: train.tsv
  dev: dev.tsv
  labels: {LANGID}/labels.txt
  max_seq_len: 32
  loader_threads: 1
  tokenizer:
    vocab: {LANGID}/vocab.txt
model:
  preset: tiny
train:
  epochs: 1
  batch_size: 8
  max_steps: 1
runtime:
  device: cpu
  threads: 1
log:
  progress: false
resources:
  ranks: 1
""")
    return path


def summarize(name, submits, starts, ends):
    latencies = [s - q for q, s in zip(submits, starts)]
    span = max(ends) - min(submits)
    out = {"name": name, "jobs": len(latencies), "latency_p50_s": percentile(latencies, 50),
           "latency_p99_s": percentile(latencies, 99), "latency_mean_s": statistics.fmean(latencies),
           "jobs_per_s": len(latencies) / span, "span_s": span,
           "submit_s": max(submits) - min(submits)}
    print(f"{name:>10}: {out['jobs']} jobs in {span:.1f} s = {out['jobs_per_s']:.2f} jobs/s sustained; "
          f"submit->running p50 {out['latency_p50_s']:.3f} s, p99 {out['latency_p99_s']:.3f} s "
          f"(all submitted within {out['submit_s']:.1f} s)")
    return out


def run_trainyard(args, work):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    state = os.path.join(work, "state.db")
    keys = os.path.join(work, "keys")
    subprocess.run([os.path.join(BIN, "coordinator"), "--init", "--keys", keys], check=True, capture_output=True)
    log = open(os.path.join(work, "coordinator.log"), "w")
    coordinator = subprocess.Popen([os.path.join(BIN, "coordinator"), "--listen", endpoint, "--state", state,
                                    "--runs", os.path.join(work, "runs"), "--keys", keys], stdout=log, stderr=subprocess.STDOUT)
    pool_log = open(os.path.join(work, "pool.log"), "w")
    pool = subprocess.Popen(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks),
                             os.path.join(BIN, "worker"), "--coordinator", endpoint, "--keys", keys],
                            stdout=pool_log, stderr=subprocess.STDOUT, env={**os.environ, **MPI_ENV},
                            start_new_session=True)
    jobctl = [os.path.join(BIN, "jobctl"), "--coordinator", endpoint, "--keys", keys, "--timeout", "10"]
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            r = subprocess.run(jobctl + ["--json", "workers"], capture_output=True, text=True)
            if r.returncode == 0 and len(json.loads(r.stdout)) == args.ranks:
                break
            time.sleep(0.5)
        else:
            raise SystemExit("the worker pool did not register; see " + pool_log.name)
        job = minimal_job(work)

        def submit(i):
            r = subprocess.run(jobctl + ["submit", job, "--key", f"bench-{i}"], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)

        print(f"trainyard: submitting {args.jobs} jobs from {args.submitters} clients to a {args.ranks}-rank pool")
        with concurrent.futures.ThreadPoolExecutor(args.submitters) as pool_of_clients:
            list(pool_of_clients.map(submit, range(args.jobs)))
        last_report = 0
        while True:
            r = subprocess.run(jobctl + ["--json", "list"], capture_output=True, text=True)
            states = [j["state"] for j in json.loads(r.stdout)]
            done = sum(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states)
            if time.time() - last_report > 10:
                print(f"  {done}/{len(states)} done", flush=True)
                last_report = time.time()
            if done == len(states):
                break
            time.sleep(1)
        failed = [s for s in states if s != "SUCCEEDED"]
        if failed:
            raise SystemExit(f"{len(failed)} jobs did not succeed; see {work}")
    finally:
        pool.send_signal(signal.SIGTERM)
        try:
            pool.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pool.pid, signal.SIGKILL)
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)
    db = sqlite3.connect(state)
    rows = db.execute("SELECT j.submitted_at, a.started_at, a.ended_at, a.placement FROM jobs j JOIN attempts a "
                      "ON a.job = j.id AND a.attempt = 1 ORDER BY j.id").fetchall()
    result = summarize("trainyard", [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    # The coordinator's own overhead: how long a rank sits idle between the end of one
    # job and the start of the next while the queue is not empty.
    by_rank = {}
    for _, start, end, placement in rows:
        by_rank.setdefault(placement, []).append((start, end))
    gaps = [b[0] - a[1] for spans in by_rank.values() for a, b in zip(sorted(spans), sorted(spans)[1:])]
    if gaps:
        result["idle_gap_p50_s"], result["idle_gap_p99_s"] = percentile(gaps, 50), percentile(gaps, 99)
        run_times = [r[2] - r[1] for r in rows]
        print(f"{'':>10}  a rank's idle gap between jobs: p50 {result['idle_gap_p50_s'] * 1000:.1f} ms, "
              f"p99 {result['idle_gap_p99_s'] * 1000:.1f} ms; a job runs for {statistics.median(run_times):.3f} s "
              "(median: parse, load data and vocab, build the model, one step, evaluate, save)")
    return result


def slurm_available():
    return all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged", "squeue"))


def start_slurm(work):
    """A one-node Slurm cluster in `work`, run as the current user; returns the env for its clients."""
    spool = os.path.join(work, "slurm")
    os.makedirs(os.path.join(spool, "state"))
    os.makedirs(os.path.join(spool, "spool"))
    munge_dir = os.path.join(work, "munge")
    os.makedirs(munge_dir, mode=0o700)
    key = os.path.join(munge_dir, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    socket_path = os.path.join(munge_dir, "munge.socket")
    subprocess.run(["munged", "--force", "--key-file", key, "--socket", socket_path,
                    "--pid-file", os.path.join(munge_dir, "munged.pid"), "--log-file", os.path.join(munge_dir, "log"),
                    "--seed-file", os.path.join(munge_dir, "seed")], check=True)
    hostname = socket.gethostname()
    cpus = os.cpu_count()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    conf = os.path.join(spool, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""ClusterName=bench
SlurmctldHost={hostname}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={socket_path}
StateSaveLocation={spool}/state
SlurmdSpoolDir={spool}/spool
SlurmctldPidFile={spool}/slurmctld.pid
SlurmdPidFile={spool}/slurmd.pid
SlurmctldLogFile={spool}/slurmctld.log
SlurmdLogFile={spool}/slurmd.log
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MaxJobCount=100000
NodeName={hostname} CPUs={cpus} State=UNKNOWN
PartitionName=bench Nodes={hostname} Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": conf}
    subprocess.run(["slurmctld", "-f", conf], env=env, check=True)
    subprocess.run(["slurmd", "-f", conf], env=env, check=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() in ("idle", "mixed"):
            return env
        time.sleep(0.5)
    raise RuntimeError("Slurm did not come up; see " + spool)


def stop_slurm(work, env):
    spool = os.path.join(work, "slurm")
    for pid_file in ("slurmd.pid", "slurmctld.pid"):
        try:
            with open(os.path.join(spool, pid_file)) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    try:
        with open(os.path.join(work, "munge", "munged.pid")) as f:
            os.kill(int(f.read().strip()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


def run_slurm(args, work):
    try:
        env = start_slurm(work)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        print(f"slurm: could not start a local cluster ({e}); skipping the comparison")
        return None
    try:
        marks = os.path.join(work, "marks")
        os.makedirs(marks)
        submits = {}
        print(f"slurm: submitting {args.jobs} trivial sbatch jobs from {args.submitters} clients")

        def submit(i):
            submits[i] = time.time()
            subprocess.run(["sbatch", "-Q", "-o", "/dev/null", "-n", "1",
                            "--wrap", f"date +%s.%N > {marks}/{i}.start"], env=env, check=True,
                           capture_output=True)

        with concurrent.futures.ThreadPoolExecutor(args.submitters) as clients:
            list(clients.map(submit, range(args.jobs)))
        deadline = time.time() + 1800
        last_report = 0
        while time.time() < deadline:
            done = len(os.listdir(marks))
            queued = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.count("\n")
            if time.time() - last_report > 10:
                print(f"  {done}/{args.jobs} started, {queued} in squeue", flush=True)
                last_report = time.time()
            if done == args.jobs and queued == 0:
                break
            time.sleep(1)
        ends_at = time.time()
        starts = {}
        for i in range(args.jobs):
            with open(os.path.join(marks, f"{i}.start")) as f:
                starts[i] = float(f.read().strip())
        order = sorted(submits)
        return summarize("slurm", [submits[i] for i in order], [starts[i] for i in order], [ends_at] * len(order))
    finally:
        stop_slurm(work, env)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=2, help="ranks in the worker pool")
    p.add_argument("--submitters", type=int, default=4, help="parallel jobctl / sbatch clients")
    p.add_argument("--slurm", action="store_true", help="also run the jobs through a local Slurm, if installed")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ty_dispatch_")
    try:
        ours = run_trainyard(args, work)
        if args.slurm:
            if not slurm_available():
                print("slurm: slurm-wlm is not installed (apt-get install slurm-wlm); skipping the comparison")
            else:
                theirs = run_slurm(args, work)
                if theirs:
                    print(f"ratio trainyard/slurm: jobs/s {ours['jobs_per_s'] / theirs['jobs_per_s']:.2f}x, "
                          f"p50 latency {ours['latency_p50_s'] / max(1e-9, theirs['latency_p50_s']):.2f}x, "
                          f"p99 latency {ours['latency_p99_s'] / max(1e-9, theirs['latency_p99_s']):.2f}x "
                          "(jobs/s: higher is better; latency: lower is better)")
    finally:
        if args.keep:
            print("scratch folder kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
