#!/usr/bin/env python3
"""Per-rank traces (log.trace) from a real 2-rank job: one trace.json in the Chrome trace
event format, merged by rank 0 (the per-rank files are gone), with

  - a process per rank, named, with a "step" and an "all-reduce" thread;
  - exactly the last log.trace_steps global steps of each rank, nothing older: the ring
    is bounded whatever the job's length;
  - each step's six phases (wait, h2d, forward, backward, comm, optimizer) in order,
    end to end, adding up to that step's `ms` in steps.jsonl (the same clock);
  - each step's all-reduce of every gradient bucket on the all-reduce thread, ending
    inside the step;
  - a size that does not grow with the job: a job 4x longer writes the same number of
    events."""
import collections
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import MPI_ENV, job_yaml, subset_tsv, write  # noqa: E402

PHASES = ["wait", "h2d", "forward", "backward", "comm", "optimizer"]


def run(worker, work, name, epochs, keep):
    train = subset_tsv(work, 320)
    extra = f"train: {{epochs: {epochs}, batch_size: 16}}\n"
    text = job_yaml(name, train, extra).replace("  steps_every: 1\n", f"  steps_every: 1\n  trace: true\n"
                                                                        f"  trace_steps: {keep}\n")
    job = write(os.path.join(work, f"{name}.yaml"), text)
    runs = os.path.join(work, "runs")
    r = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", worker, job, "--runs-dir", runs],
                       capture_output=True, text=True, env=MPI_ENV, timeout=600, restore_signals=False)
    check(r.returncode == 0, r.stderr[-3000:])
    buckets = int(re.search(r"all-reduce over \w+: (\d+) buckets", r.stdout + r.stderr).group(1))
    return os.path.join(runs, name), buckets


def check_trace(run_dir, buckets, keep):
    """The events of `run_dir`'s trace.json, checked (see the module's text); their count."""
    check(not [f for f in os.listdir(run_dir) if f.startswith("trace.rank")], os.listdir(run_dir))
    with open(os.path.join(run_dir, "trace.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid"), e["name"]): e["args"] for e in events if e["ph"] == "M"}
    for rank in (0, 1):
        check(names[(rank, None, "process_name")] == {"name": f"rank {rank}"}, names)
        check(names[(rank, 0, "thread_name")] == {"name": "step"}, names)
        check(names[(rank, 1, "thread_name")] == {"name": "all-reduce"}, names)
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "steps.jsonl"))]
    last = steps[-1]["step"]
    want_steps = list(range(last - keep + 1, last + 1))
    step_ms = {s["step"]: s["ms"] for s in steps}
    spans = [e for e in events if e["ph"] == "X"]
    for rank in (0, 1):
        by_step = collections.defaultdict(list)
        comm = collections.defaultdict(list)
        for e in spans:
            if e["pid"] != rank:
                continue
            (by_step if e["tid"] == 0 else comm)[e["args"]["step"]].append(e)
        check(sorted(by_step) == want_steps, (rank, sorted(by_step), want_steps))
        check(sorted(comm) == want_steps, (rank, sorted(comm)))
        for step in want_steps:
            phases = sorted(by_step[step], key=lambda e: e["ts"])
            check([e["name"] for e in phases] == PHASES, (rank, step, phases))
            for a, b in zip(phases, phases[1:]):
                check(a["ts"] + a["dur"] == b["ts"], (rank, step, a, b))
            total_ms = sum(e["dur"] for e in phases) / 1000.0
            if rank == 0:  # steps.jsonl is rank 0's
                check(abs(total_ms - step_ms[step]) <= 0.01, (step, total_ms, step_ms[step]))
            reduces = comm[step]
            check(sorted(e["args"]["bucket"] for e in reduces) == list(range(buckets)), reduces)
            start, end = phases[0]["ts"], phases[-1]["ts"] + phases[-1]["dur"]
            for e in reduces:
                check(e["name"] == "allreduce" and e["dur"] >= 0, e)
                check(start <= e["ts"] and e["ts"] + e["dur"] <= end, (step, e, start, end))
    return len(events)


def test(a, work):
    run_dir, buckets = run(a.worker, work, "traced", 1, 8)
    short = check_trace(run_dir, buckets, 8)
    run_dir, buckets = run(a.worker, work, "traced_long", 4, 8)
    long = check_trace(run_dir, buckets, 8)
    check(long == short, f"the trace grew with the job: {short} events for 1 epoch, {long} for 4")
    print(f"the last 8 steps of 2 ranks, {buckets} bucket(s), {short} events for 1 epoch or 4")


if __name__ == "__main__":
    run_test(test, description=__doc__)
