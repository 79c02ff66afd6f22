#!/usr/bin/env python3
"""Preemption benchmark: what stopping a running fine-tune for an urgent job costs.

Starts a coordinator with --preemption on and a 2-rank worker pool (mpirun) on
127.0.0.1, runs configs/jobs/langid_tiny.yaml (priority 0, checkpoints every 200 steps
and at each epoch's end) and, once it is into its second epoch, submits a small job of
priority 10 that needs the same two ranks. From the coordinator's own records (its
SQLite state) it prints, per run and as medians:
  - stop -> free: from the preemption (the coordinator's stop request) to the victim's
    attempt ending, i.e. its ranks free again;
  - stop -> urgent running: to the urgent job's start;
  - steps lost: steps the victim's next attempt runs again (its stop step minus the step
    of the checkpoint it resumes from), against those a requeue without a checkpoint at
    the stop would run again (Slurm's PreemptMode=REQUEUE, or a victim killed after the
    grace): the steps since the job's last periodic or end-of-epoch checkpoint.
It waits for the victim to finish and checks it succeeded without using a restart."""
import argparse
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
from dispatch import BIN, MPI_ENV, free_port  # noqa: E402


def job_file(work, name, priority, max_steps=0, every_steps=200):
    """langid_tiny.yaml as `name`, with this priority; paths made absolute."""
    with open(os.path.join(ROOT, "configs", "jobs", "langid_tiny.yaml"), encoding="utf-8") as f:
        text = f.read()
    text = text.replace("../../data/", os.path.join(ROOT, "data") + "/")
    text = re.sub(r"^name: \S+", f"name: {name}", text, count=1, flags=re.M)
    text = re.sub(r"^(  priority:\s*)\d+", rf"\g<1>{priority}", text, count=1, flags=re.M)
    text = re.sub(r"^(  max_steps:\s*)\d+", rf"\g<1>{max_steps}", text, count=1, flags=re.M)
    text = re.sub(r"^(  every_steps:\s*)\d+", rf"\g<1>{every_steps}", text, count=1, flags=re.M)
    text = re.sub(r"^(  max_restarts:\s*)\d+", r"\g<1>0", text, count=1, flags=re.M)
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


class Rig:
    def __init__(self, work):
        self.work = work
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.state = os.path.join(work, "state.db")
        self.keys = os.path.join(work, "keys")
        subprocess.run([os.path.join(BIN, "coordinator"), "--init", "--keys", self.keys], check=True,
                       capture_output=True)
        log = open(os.path.join(work, "coordinator.log"), "w")
        self.coordinator = subprocess.Popen(
            [os.path.join(BIN, "coordinator"), "--listen", self.endpoint, "--state", self.state, "--runs",
             os.path.join(work, "runs"), "--keys", self.keys, "--preemption", "on", "--preempt-grace", "60"],
            stdout=log, stderr=subprocess.STDOUT)
        log = open(os.path.join(work, "pool.log"), "w")
        self.pool = subprocess.Popen(
            ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", os.path.join(BIN, "worker"),
             "--coordinator", self.endpoint, "--keys", self.keys],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **MPI_ENV), start_new_session=True)

    def submit(self, path):
        r = subprocess.run([os.path.join(BIN, "jobctl"), "--coordinator", self.endpoint, "--keys", self.keys,
                            "submit", path], capture_output=True, text=True, check=True)
        return int(r.stdout.strip())

    def query(self, sql, *args):
        db = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def wait(self, what, predicate, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise SystemExit(f"timed out waiting for {what}; logs in {self.work}")

    def stop(self):
        for process in (self.pool, self.coordinator):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


def one_run(work):
    rig = Rig(work)
    try:
        victim = rig.submit(job_file(work, "victim", priority=0))
        rig.wait("the victim's first epoch",
                 lambda: rig.query("SELECT COUNT(*) FROM epochs WHERE job = ?", victim)[0][0] >= 1, 600)
        time.sleep(3)  # into its second epoch
        urgent = rig.submit(job_file(work, "urgent", priority=10, max_steps=5))
        asked = rig.wait("the preemption", lambda: rig.query(
            "SELECT at FROM events WHERE job = ? AND text LIKE 'preempted by job%'", victim), 60)[0][0]
        ended, outcome = rig.wait("the victim's attempt to end", lambda: rig.query(
            "SELECT ended_at, outcome FROM attempts WHERE job = ? AND attempt = 1 AND ended_at > 0", victim), 120)[0]
        started = rig.wait("the urgent job to start", lambda: rig.query(
            "SELECT started_at FROM attempts WHERE job = ? AND attempt = 1", urgent), 120)[0][0]
        rig.wait("the victim to finish", lambda: rig.query(
            "SELECT state FROM jobs WHERE id = ? AND state IN ('SUCCEEDED', 'FAILED')", victim), 900)
        state, = rig.query("SELECT state FROM jobs WHERE id = ?", victim)[0]
        row, header = rig.query("SELECT csv_line, csv_header FROM epochs WHERE job = ? ORDER BY epoch", victim)[0]
        steps_per_epoch = int(row.split(",")[header.split(",").index("steps")])
    finally:
        rig.stop()
    match = re.search(r"after step (\d+) of epoch \d+ \(a preemption\); checkpoint of step (\d+)", outcome)
    if state != "SUCCEEDED" or not match or not outcome.startswith("interrupted"):
        raise SystemExit(f"the victim did not stop with a checkpoint and finish: {state}, {outcome}")
    stop_step, checkpoint_step = int(match.group(1)), int(match.group(2))
    last_periodic = max(stop_step // 200 * 200, stop_step // steps_per_epoch * steps_per_epoch)
    return {"free_s": ended - asked, "urgent_s": started - asked, "lost": stop_step - checkpoint_step,
            "lost_without": stop_step - last_periodic, "stop_step": stop_step}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the scratch folders")
    a = p.parse_args()
    results = []
    for i in range(a.runs):
        work = tempfile.mkdtemp(prefix="trainyard-preempt-")
        r = one_run(work)
        results.append(r)
        print(f"run {i + 1}: stop -> free {r['free_s']:.2f} s, stop -> urgent running {r['urgent_s']:.2f} s, "
              f"stopped after step {r['stop_step']}, steps lost {r['lost']} (without a checkpoint at the stop: "
              f"{r['lost_without']})", flush=True)
        if not a.keep:
            shutil.rmtree(work)
    median = lambda key: statistics.median(r[key] for r in results)
    print(f"median of {a.runs}: stop -> free {median('free_s'):.2f} s, stop -> urgent running "
          f"{median('urgent_s'):.2f} s, steps lost {median('lost'):g} against {median('lost_without'):g} for a "
          "requeue from the last periodic checkpoint")


if __name__ == "__main__":
    main()
