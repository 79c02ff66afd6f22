#!/usr/bin/env python3
"""A standalone job across two hosts of the cluster rig (tests/harness/rig.py):
`mpirun --hostfile` with ssh as the launch agent starts 2 hosts x 2 ranks of the worker,
which must train exactly as 1 host x 4 ranks does (fp32, the same seed: every step's loss
and every final weight bitwise equal), name the slowest rank `<host>:<rank>` in the epoch
table, epochs.csv and steps.jsonl, and write its model and logs on rank 0's host only.
Exit 77 (skipped) where the rig cannot be made."""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import job_yaml, steps, subset_tsv, weights, write  # noqa: E402
from harness.rig import Rig, skip_unless_available  # noqa: E402


def train(c, args, name, slots):
    """Runs the job from h1 over `slots` ({host: ranks}); the run folder, seen from outside."""
    job = write(os.path.join(c.shared, name + ".yaml"),
                job_yaml(name, subset_tsv(c.shared, 640), "train:\n  batch_size: 8\n  epochs: 1\n  max_steps: 16\n"))
    command = c.mpirun(slots, [args.worker, job, "--runs-dir", os.path.join(c.host_dir, "runs")], args.mpirun)
    result = c.run("h1", command, capture_output=True, text=True, timeout=300)
    check(result.returncode == 0, f"{name} on {slots} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n"
                                  f"{result.stderr[-3000:]}")
    return c.outside("h1", os.path.join("runs", name)), result.stdout + result.stderr


def test(args, work):
    skip_unless_available()
    with Rig(2) as c:
        across, table = train(c, args, "two_hosts", {"h1": 2, "h2": 2})
        alone, _ = train(c, args, "one_host", {"h1": 4})
        a, b = steps(across), steps(alone)
        check(len(a) == 16 and [s["loss"] for s in a] == [s["loss"] for s in b],
              f"2 hosts x 2 ranks and 1 host x 4 ranks: {len(a)} steps, every loss bitwise equal "
              f"(first {a[0]['loss']!r}, last {a[-1]['loss']!r})")
        wa, wb = weights(across), weights(alone)
        check(wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa),
              f"and every final weight bitwise equal ({len(wa)} tensors)")
        where = {f"h1:{r}" for r in (0, 1)} | {f"h2:{r}" for r in (2, 3)}
        named = {s["slowest"] for s in a}
        check(named and named <= where, f"steps.jsonl names the slowest rank as host:rank: {sorted(named)}")
        with open(os.path.join(across, "epochs.csv")) as f:
            row = list(csv.DictReader(f))[-1]
        check(f"{row['slowest_host']}:{row['slowest_rank']}" in where,
              f"epochs.csv: slowest_host {row['slowest_host']}, slowest_rank {row['slowest_rank']}")
        line = [text for text in table.splitlines() if text.split("] ", 1)[-1].split()[:1] == ["1"]]  # epoch 1
        check(line and any(w in line[0] for w in where), f"the epoch table names it: {line[:1]}")
        kept = os.listdir(c.outside("h2", "runs/two_hosts"))
        check(kept == ["checkpoints"] and os.listdir(os.path.join(across, "model")),
              f"the model and logs are on rank 0's host; h2's disk holds only its checkpoints: {kept}")


if __name__ == "__main__":
    run_test(test, ("--worker", "--mpirun"), __doc__)
