#!/usr/bin/env python3
"""Trainyard under a real Slurm (tests/cluster/slurm.py on the cluster rig: slurmctld on
h1, slurmd on h2 and h3). Exit 77 (skipped) where the rig or Slurm cannot run here.

  standalone  `srun -N2 -n4 worker job.yaml` (Open MPI started by Slurm through PMIx) and
              `salloc -N2 -n4 mpirun worker job.yaml` (mpirun reads the allocation and
              starts its daemons with srun) each train exactly as 1 host x 4 ranks does:
              every step's loss and every final weight bitwise equal (fp32, same seed).
              Slurm decides where the ranks run: block placement, ranks 0-1 on h2 and 2-3
              on h3, so rank 0's host h2 holds the run folder and the logs name those
              ranks.
  preempt     an sbatch job (--requeue; the batch script of docs/many-hosts.md, which
              forwards SIGUSR1 to srun and requeues itself when the worker exits 3) gets
              SIGUSR1 mid-run, as --signal=B:USR1@lead sends it ahead of a time limit: the
              ranks stop after a step, checkpoint and exit 3, the job is requeued
              (Restarts=1), and the second allocation resumes from the checkpoint; every
              step's loss and every final weight equal an uninterrupted run's, each step
              and the epoch logged once."""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "worker"))

import slurm  # noqa: E402
from cluster import SUBNET, Cluster, check, skip_unless_available  # noqa: E402
from e2e_common import job_yaml, steps, subset_tsv, wait_for, weights, write  # noqa: E402

# Open MPI's links and MPI's TCP transport on the rig's network, for ranks started by
# srun (which passes the environment on) and by mpirun inside an allocation alike.
RIG_NETWORK = {"OMPI_MCA_oob_tcp_if_include": SUBNET, "OMPI_MCA_btl_tcp_if_include": SUBNET}


def job_file(c, name, steps=16, extra=""):
    return write(os.path.join(c.shared, name + ".yaml"),
                 job_yaml(name, subset_tsv(c.shared, 640),
                          f"train:\n  batch_size: 8\n  epochs: 1\n  max_steps: {steps}\n" + extra))


def launch(s, name, argv, host="h1"):
    """Runs `argv` (ending in the worker's arguments) on `host`; the run folder as seen from
    outside, on whichever host ran rank 0, and the output."""
    result = s.client(argv, host=host, timeout=300, **RIG_NETWORK)
    if result.returncode != 0:
        sys.exit(f"{name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n"
                 f"{s.logs()}")
    for h in s.c.names:
        folder = s.c.outside(h, os.path.join("runs", name))
        if os.path.exists(os.path.join(folder, "summary.json")):
            return folder, h
    sys.exit(f"{name}: no host has its run folder")


def standalone(c, s, args):
    runs = os.path.join(c.host_dir, "runs")
    worker = lambda name: [os.path.abspath(args.worker), job_file(c, name), "--runs-dir", runs]  # noqa: E731
    alone, _ = launch(s, "one_host", [args.mpirun, "-n", "4", "--bind-to", "none", "--oversubscribe",
                                      *worker("one_host")], host="h2")
    srun, srun_host = launch(s, "srun", ["srun", "-N2", "-n4", *worker("srun")])
    salloc, salloc_host = launch(s, "salloc", ["salloc", "-N2", "-n4", args.mpirun, "--bind-to", "none",
                                               "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                                               *worker("salloc")])
    reference = steps(alone)
    want = {f"h2:{r}" for r in (0, 1)} | {f"h3:{r}" for r in (2, 3)}
    ok = True
    for name, run, host in (("srun -N2 -n4", srun, srun_host), ("salloc -N2 -n4 mpirun", salloc, salloc_host)):
        got = steps(run)
        ok &= check(len(got) == 16 and [x["loss"] for x in got] == [x["loss"] for x in reference],
                    f"{name}: {len(got)} steps, every loss bitwise equal to 1 host x 4 ranks "
                    f"(last {got[-1]['loss']!r})")
        wa, wb = weights(run), weights(alone)
        ok &= check(wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa),
                    f"{name}: every final weight bitwise equal ({len(wa)} tensors)")
        named = {x["slowest"] for x in got}
        ok &= check(host == "h2" and named and named <= want,
                    f"{name}: Slurm placed rank 0 on {host} and the logs name ranks {sorted(named)} (of {sorted(want)})")
    return ok


# The batch script of docs/many-hosts.md ("Preemption and time limits lose no step").
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks=4
#SBATCH --requeue
#SBATCH --output={out}
#SBATCH --open-mode=append
srun {worker} {job} --runs-dir {runs} &
step=$!
trap 'kill -USR1 $step' USR1
while true; do
  wait $step && status=0 || status=$?
  kill -0 $step 2> /dev/null || break
done
echo "srun exited $status (restart ${{SLURM_RESTART_COUNT:-0}})"
if [[ $status == 3 ]]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit $status
"""


def job_state(s, job):
    out = s.client(["scontrol", "show", "job", job]).stdout
    fields = dict(re.findall(r"(\w+)=(\S*)", out))
    return fields.get("JobState", "?"), int(fields.get("Restarts", "0") or 0)


def preempt(c, s, args):
    runs = os.path.join(c.host_dir, "runs")
    worker = os.path.abspath(args.worker)
    resume = "checkpoint:\n  resume: auto\n"
    job = job_file(c, "requeued", steps=20, extra=resume)
    script = write(os.path.join(c.shared, "requeued.sbatch"), BATCH_SCRIPT.format(
        out=os.path.join(c.shared, "requeued-%j.out"), worker=worker, job=job, runs=runs))
    submitted = s.client(["sbatch", "--parsable", script], **RIG_NETWORK)
    if submitted.returncode != 0:
        raise SystemExit(f"sbatch failed: {submitted.stderr}")
    jid = submitted.stdout.strip().split(";")[0]
    steps_file = c.outside("h2", "runs/requeued/steps.jsonl")
    count = lambda: sum(1 for _ in open(steps_file)) if os.path.exists(steps_file) else 0  # noqa: E731
    wait_for(lambda: count() >= 5, 120, "5 steps of the first allocation")
    s.client(["scancel", "--batch", "--signal=USR1", jid])
    wait_for(lambda: job_state(s, jid)[1] >= 1, 120, "the job to be requeued")
    wait_for(lambda: job_state(s, jid)[0] == "COMPLETED", 150, "the requeued job to complete")
    with open(os.path.join(c.shared, f"requeued-{jid}.out")) as f:
        output = f.read()
    straight, _ = launch(s, "straight", ["srun", "-N2", "-n4", worker, job_file(c, "straight", steps=20),
                                         "--runs-dir", runs])
    run = c.outside("h2", "runs/requeued")
    got, want = steps(run), steps(straight)
    numbers = [x["step"] for x in got]
    stopped = [line for line in output.splitlines() if "srun exited" in line]
    at = [int(n) for n in re.findall(r"checkpoint of step (\d+) written", output)]
    ok = check(stopped[:1] == ["srun exited 3 (restart 0)"] and stopped[-1:] == ["srun exited 0 (restart 1)"]
               and at and 5 <= at[0] < 20,
               f"the first allocation's ranks stopped after step {at[:1]} of 20 and exited 3 (preempted), the "
               f"second finished: {stopped}")
    ok &= check(job_state(s, jid) == ("COMPLETED", 1), f"Slurm requeued the job once: {job_state(s, jid)}")
    ok &= check(numbers == list(range(1, 21)), f"each of the 20 steps logged once: {numbers}")
    ok &= check([x["loss"] for x in got] == [x["loss"] for x in want],
                "every step's loss bitwise equal to an uninterrupted run's")
    wa, wb = weights(run), weights(straight)
    ok &= check(wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa),
                f"every final weight bitwise equal ({len(wa)} tensors)")
    with open(os.path.join(run, "epochs.csv")) as f:
        rows = f.read().splitlines()[1:]
    ok &= check(len(rows) == 1, f"the epoch logged once: {len(rows)} row(s)")
    return ok


CASES = {"standalone": standalone, "preempt": preempt}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()
    skip_unless_available()
    why = slurm.available()
    if why:
        print(f"skipped: {why}")
        sys.exit(77)
    with Cluster(3) as c:
        s = slurm.Slurm(c, controller="h1", nodes=["h2", "h3"]).up()
        ok = CASES[args.case](c, s, args)
    print("PASS" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
