#!/usr/bin/env python3
"""Checkpoints without a shared filesystem, on the cluster rig (tests/harness/rig.py).

A job on h1 and h2 (2 ranks each) is killed (every job process on both hosts, SIGKILL)
once both hosts' own disks hold a checkpoint. It is restarted on h3 and h2, with rank 0
now on h3, whose disk holds nothing: h2 sends the newest checkpoint it has over MPI, h3
stores it, and the run ends bitwise as an uninterrupted run on h1 and h2 does (every
later step's loss, every final weight).
The model and summary are on h3, and the summary names it. A run folder every host sees
(a shared path) is written once, by rank 0. Exit 77 (skipped) where the rig cannot be made."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, write  # noqa: E402
from harness.rig import Rig, skip_unless_available  # noqa: E402


def job(c, name):
    return write(os.path.join(c.shared, name + ".yaml"),
                 job_yaml(name, subset_tsv(c.shared, 640),
                          "train:\n  batch_size: 8\n  epochs: 2\ncheckpoint:\n  every_steps: 5\n  resume: auto\n"))


def train(c, args, name, slots, *extra, runs=None):
    runs = runs or os.path.join(c.host_dir, "runs")
    first = next(iter(slots))
    command = c.mpirun(slots, [args.worker, job(c, name), "--runs-dir", runs, *extra], args.mpirun)
    r = c.run(first, command, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "unable to reliably start one or more daemons" in r.stdout + r.stderr:
        # mpirun's ssh launch of an orted failed before any rank ran (seen when the rig's
        # hosts are busy): nothing of the job happened, so it is launched once more.
        print(f"{name}: mpirun could not start its daemons; launching it again")
        r = c.run(first, command, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"{name} on {slots} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def interrupt(c, args, name, slots):
    """Starts the job from its first host and kills every job process on its hosts once
    each host holds a checkpoint (and a step past it ran); the step reached, and the log."""
    log = open(os.path.join(c.shared, name + ".log"), "w+")
    runs = os.path.join(c.host_dir, "runs")
    run = c.popen(next(iter(slots)), c.mpirun(slots, [args.worker, job(c, name), "--runs-dir", runs], args.mpirun),
                  stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not all(checkpoints(c, h, name) for h in slots) or max(steps(c, "h1", name), default=0) < 12:
        if run.poll() is not None or time.time() > deadline:
            raise AssertionError(f"{name} ended (or stalled) before it could be interrupted: exit {run.poll()}")
        time.sleep(0.02)
    for host in slots:
        c.kill(host, ("worker", "orted", "mpirun"))
    run.wait(timeout=30)
    log.seek(0)
    return max(steps(c, "h1", name)), log.read()


def checkpoints(c, host, name):
    folder = c.outside(host, f"runs/{name}/checkpoints")
    return sorted(f for f in os.listdir(folder) if f.startswith("step-")) if os.path.isdir(folder) else []


def steps(c, host, name):
    try:
        with open(c.outside(host, f"runs/{name}/steps.jsonl")) as f:
            return {s["step"]: s["loss"] for s in map(json.loads, f) if s}
    except (OSError, ValueError):  # not yet written, or a line being written
        return {}


def weights(c, host, name):
    from safetensors.torch import load_file
    return load_file(c.outside(host, f"runs/{name}/model/model.safetensors"))


def test(args, work):
    skip_unless_available()
    with Rig(3) as c:
        train(c, args, "ref", {"h1": 2, "h2": 2})
        killed_at, first = interrupt(c, args, "moved", {"h1": 2, "h2": 2})
        on1, on2 = checkpoints(c, "h1", "moved"), checkpoints(c, "h2", "moved")
        check(on1 and on2 and set(on1) & set(on2),
              f"killed at step {killed_at}: h1 and h2 each hold checkpoints on their own disk ({on1} / {on2})")
        check("on each host's own disk, written by h1:0, h2:2" in first, "the log names the writers")
        check(checkpoints(c, "h3", "moved") == [], "h3 holds none")
        second = train(c, args, "moved", {"h3": 2, "h2": 2})
        resumed_at = int(on2[-1][len("step-"):-len(".safetensors")])
        check(f"sending the checkpoint of step {resumed_at}" in second and "resuming from" in second,
              f"restarted on h3 and h2 (rank 0 on h3): h2 sends its newest checkpoint (step {resumed_at}), "
              "every rank resumes from it")
        ref, moved = steps(c, "h1", "ref"), steps(c, "h3", "moved")
        later = sorted(moved)
        check(later and later[0] == resumed_at + 1 and all(moved[s] == ref[s] for s in later),
              f"steps {later[:1]}..{later[-1:]} on h3: every loss bitwise the uninterrupted run's")
        a, b = weights(c, "h1", "ref"), weights(c, "h3", "moved")
        check(a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a),
              f"every final weight bitwise equal ({len(a)} tensors)")
        with open(c.outside("h3", "runs/moved/summary.json")) as f:
            summary = json.load(f)
        check(summary.get("host") == "h3", f"summary.json names the model's host: {summary.get('host')} "
                                           f"({summary.get('model_dir')})")
        check(checkpoints(c, "h3", "moved"), f"h3 now holds checkpoints: {checkpoints(c, 'h3', 'moved')}")
        shared = train(c, args, "shared", {"h1": 2, "h2": 2}, runs=os.path.join(c.shared, "runs"))
        check("written once, by rank 0" in shared and
              os.listdir(os.path.join(c.shared, "runs/shared/checkpoints")),
              "a run folder every host sees is written once, by rank 0")


if __name__ == "__main__":
    run_test(test, ("--worker", "--mpirun"), __doc__)
