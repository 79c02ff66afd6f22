#!/usr/bin/env python3
"""The same data-parallel job as 1 host x 4 ranks, 2 hosts x 2 and 4 hosts x 1, on the
cluster rig of tests/harness/rig.py (network namespaces joined by veth pairs, mpirun
over ssh, MPI's TCP transport between hosts and shared memory within one). Prints ms/step
(median of the steps after the warm-up, then median over --repeats runs), the exposed
communication as a share of the step (comm%), and each layout's ms/step over 1 x 4's.

What it shows: what crossing hosts costs the worker itself, with the compute held equal
(every layout runs the same 4 ranks on the same cores): TCP through the kernel's network
stack in place of shared memory, and the launch and wire-up across hosts.
What it does not: a datacenter network. A veth pair moves bytes at memory speed with
microseconds of latency, and no switch, NIC or congestion is in the way; on real hosts
the gradient all-reduce's share of the step grows with the link's bandwidth and latency.
Needs root (scripts/bench/multihost_scaling.sh runs it)."""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from harness.rig import Rig, available  # noqa: E402

LAYOUTS = {"1 x 4": {"h1": 4}, "2 x 2": {"h1": 2, "h2": 2}, "4 x 1": {"h1": 1, "h2": 1, "h3": 1, "h4": 1}}


def job_file(c, args):
    data = os.path.join(ROOT, "data", "prepared", "langid")
    path = os.path.join(c.shared, "scaling.yaml")
    with open(path, "w") as f:
        f.write(f"""name: scaling
data:
  train: {args.train}
  max_seq_len: {args.seq}
  bucket_batches: 1
  loader_threads: 1
  tokenizer: {{vocab: {data}/vocab.txt}}
model: {{preset: {args.preset}}}
train: {{epochs: 1, batch_size: {args.batch}, max_steps: {args.steps}, lr: 5.0e-4}}
runtime: {{device: cpu, threads: 1}}
log: {{steps_every: 1, progress: false}}
""")
    return path


def one_run(c, args, job, slots):
    """(median ms/step, median comm ms) of the steps after the warm-up."""
    runs = os.path.join(c.host_dir, "runs")
    r = c.run("h1", c.mpirun(slots, [args.worker, job, "--runs-dir", runs, "--resume", "none"], args.mpirun),
              capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"the job on {slots} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    with open(c.outside("h1", "runs/scaling/steps.jsonl")) as f:
        rows = [json.loads(line) for line in f][args.warmup:]
    return statistics.median(r["ms"] for r in rows), statistics.median(r["comm_ms"] for r in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", required=True)
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--train", required=True, help="a TSV with enough rows for the steps")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    why = available()
    if why:
        sys.exit(f"error: {why}")
    results = {}
    with Rig(4) as c:
        job = job_file(c, args)
        for _ in range(args.repeats):  # layouts interleaved, so drift on the machine hits all alike
            for name, slots in LAYOUTS.items():
                results.setdefault(name, []).append(one_run(c, args, job, slots))
    machine = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    print(f"{args.preset} preset, batch {args.batch} per rank x 4 ranks, seq {args.seq}, {args.steps} steps "
          f"({args.warmup} warm-up), {os.cpu_count()} cores, {machine}; medians of {args.repeats} runs")
    print(f"{'hosts x ranks':<14} {'ms/step':>8} {'comm%':>6} {'vs 1 x 4':>9}")
    base = statistics.median(ms for ms, _ in results["1 x 4"])
    for name, runs in results.items():
        ms = statistics.median(m for m, _ in runs)
        comm = statistics.median(100.0 * c_ / m for m, c_ in runs)
        print(f"{name:<14} {ms:8.1f} {comm:6.1f} {ms / base:8.2f}x")


if __name__ == "__main__":
    main()
