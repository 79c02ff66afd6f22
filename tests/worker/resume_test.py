#!/usr/bin/env python3
"""Exact resume: a run killed with SIGKILL after its first checkpoint and resumed with
`resume: auto` ends with weights bitwise equal to an uninterrupted run (CPU, fp32,
fixed seed, dropout on), and epochs.csv holds each epoch exactly once."""
import argparse
import csv
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

from e2e_common import job_yaml, run_worker, subset_tsv, write

EXTRA = """train:
  epochs: 3
  batch_size: 16
  lr: 1.0e-3
checkpoint:
  every_steps: 25
  keep: 2
  resume: auto
"""


def read(path):
    with open(path, "rb") as f:
        return f.read()


def killed_then_resumed(worker, job, runs):
    proc = subprocess.Popen([worker, job, "--runs-dir", runs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pattern = os.path.join(runs, "resume_job", "checkpoints", "step-*.safetensors")
    deadline = time.time() + 120
    while not glob.glob(pattern):
        if proc.poll() is not None or time.time() > deadline:
            sys.exit(f"worker ended before its first checkpoint:\n{proc.stdout.read().decode()}")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = sorted(glob.glob(pattern))
    if os.path.exists(os.path.join(runs, "resume_job", "summary.json")):
        sys.exit("the run finished before the kill; the test proved nothing")
    print(f"killed after checkpoint(s) {[os.path.basename(p) for p in killed_at]}")
    resumed = run_worker(worker, job, runs)
    print(resumed.stdout[-1500:], resumed.stderr[-1500:])
    if resumed.returncode != 0 or "resuming from" not in resumed.stdout + resumed.stderr:
        sys.exit(f"resume failed (exit {resumed.returncode})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        train = subset_tsv(work, 1200)
        job = write(os.path.join(work, "job.yaml"), job_yaml("resume_job", train, EXTRA))
        straight = run_worker(args.worker, job, os.path.join(work, "straight"))
        if straight.returncode != 0:
            sys.exit(f"uninterrupted run failed:\n{straight.stdout}\n{straight.stderr}")
        killed_then_resumed(args.worker, job, os.path.join(work, "killed"))
        a = read(os.path.join(work, "straight", "resume_job", "model", "model.safetensors"))
        b = read(os.path.join(work, "killed", "resume_job", "model", "model.safetensors"))
        with open(os.path.join(work, "killed", "resume_job", "epochs.csv")) as f:
            epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
        print(f"weights bitwise equal: {a == b}; epochs.csv epochs: {epochs}")
        if a != b or epochs != [1, 2, 3]:
            sys.exit(1)


if __name__ == "__main__":
    main()
