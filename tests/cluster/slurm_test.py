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
              and the epoch logged once.
  elastic     coordinator --slurm runs an elastic job of three replicas as three Slurm
              jobs of one task. One replica's process is killed mid-run: the other two
              commit a step within 5 s, as the same processes; its Slurm job's end is an
              event, and a replacement is submitted to Slurm as a fourth Slurm job, joins
              and is healed from a live replica. The job ends SUCCEEDED as its one
              attempt, the survivors took every step once, and the three replicas that
              took the last step end with the same weights and AdamW moments.
  elastic_ranks
              the same with two replicas of two ranks each, one Slurm job of two tasks on
              one node a replica: the lost replica's rank 1 is killed, its Slurm job ends,
              the other replica goes on alone, and a replacement of two ranks is healed."""
import glob
import os
import pwd
import re
import signal
import subprocess
import sys
import time

import slurm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case, skip  # noqa: E402
from harness.e2e import job_yaml, steps, subset_tsv, trained_state, wait_for, weights, write  # noqa: E402
from harness.pool import POOL_FLAGS  # noqa: E402
from harness.rig import SUBNET, Rig, skip_unless_available  # noqa: E402
from harness.rig_pool import RigPool  # noqa: E402

# Open MPI's links and MPI's TCP transport on the rig's network, for ranks started by
# srun (which passes the environment on) and by mpirun inside an allocation alike. And
# PMIx's hash store instead of its shared-memory one: a rank started by srun crashed at
# start-up now and then (SIGSEGV at address 0, 2 runs of slurm_queue in about 25), as
# reported of PMIx's shared-memory store (openpmix#1114, ompi#7335), whose workaround
# this is.
RIG_NETWORK = {"OMPI_MCA_oob_tcp_if_include": SUBNET, "OMPI_MCA_btl_tcp_if_include": SUBNET,
               "PMIX_MCA_gds": "hash"}


def job_file(c, name, steps=16, extra=""):
    return write(os.path.join(c.shared, name + ".yaml"),
                 job_yaml(name, subset_tsv(c.shared, 640),
                          f"train:\n  batch_size: 8\n  epochs: 1\n  max_steps: {steps}\n" + extra))


def launch(s, name, argv, host="h1"):
    """Runs `argv` (ending in the worker's arguments) on `host`; the run folder as seen from
    outside, on whichever host ran rank 0, and the output."""
    result = s.client(argv, host=host, timeout=300, **RIG_NETWORK)
    if result.returncode != 0:
        raise AssertionError(f"{name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}\n{s.logs()}")
    for h in s.c.names:
        folder = s.c.outside(h, os.path.join("runs", name))
        if os.path.exists(os.path.join(folder, "summary.json")):
            return folder, h
    raise AssertionError(f"{name}: no host has its run folder")


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
    for name, run, host in (("srun -N2 -n4", srun, srun_host), ("salloc -N2 -n4 mpirun", salloc, salloc_host)):
        got = steps(run)
        check(len(got) == 16 and [x["loss"] for x in got] == [x["loss"] for x in reference],
              f"{name}: {len(got)} steps, every loss bitwise equal to 1 host x 4 ranks "
              f"(last {got[-1]['loss']!r})")
        wa, wb = weights(run), weights(alone)
        check(wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa),
              f"{name}: every final weight bitwise equal ({len(wa)} tensors)")
        named = {x["slowest"] for x in got}
        check(host == "h2" and named and named <= want,
              f"{name}: Slurm placed rank 0 on {host} and the logs name ranks {sorted(named)} (of {sorted(want)})")


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
    check(submitted.returncode == 0, f"sbatch failed: {submitted.stderr}")
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
    check(stopped[:1] == ["srun exited 3 (restart 0)"] and stopped[-1:] == ["srun exited 0 (restart 1)"]
          and at and 5 <= at[0] < 20,
          f"the first allocation's ranks stopped after step {at[:1]} of 20 and exited 3 (preempted), the "
          f"second finished: {stopped}")
    check(job_state(s, jid) == ("COMPLETED", 1), f"Slurm requeued the job once: {job_state(s, jid)}")
    check(numbers == list(range(1, 21)), f"each of the 20 steps logged once: {numbers}")
    check([x["loss"] for x in got] == [x["loss"] for x in want],
          "every step's loss bitwise equal to an uninterrupted run's")
    wa, wb = weights(run), weights(straight)
    check(wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa),
          f"every final weight bitwise equal ({len(wa)} tensors)")
    with open(os.path.join(run, "epochs.csv")) as f:
        rows = f.read().splitlines()[1:]
    check(len(rows) == 1, f"the epoch logged once: {len(rows)} row(s)")


def start_up_without_slurmctld(c, s, pool):
    """`coordinator --slurm` where Slurm is configured but slurmctld does not run."""
    started = time.time()
    r = c.run("h1", pool.coordinator_command(["--slurm"]), capture_output=True, text=True, timeout=60)
    line = r.stderr.strip().splitlines()[-1:] or [""]
    check(r.returncode == 2 and "slurmctld is not reachable" in line[0],
          f"without slurmctld, coordinator --slurm exits {r.returncode} in {time.time() - started:.1f} s: "
          f"{line[0]}")


def first_step_after(c, submitted, job_id, name, runs="runs"):
    """Seconds from `submitted` to the first line of the job's steps.jsonl, on any host."""
    def first_step():
        for h in c.names:
            path = c.outside(h, f"{runs}/{job_id}/{name}/steps.jsonl")
            if os.path.exists(path) and os.path.getsize(path) > 0:
                return time.time()
        return None
    return wait_for(first_step, 120, f"job {job_id}'s first step") - submitted


def queue(c, s, args):
    pool = RigPool(c, args)
    start_up_without_slurmctld(c, s.configure(), pool)
    s.up()

    def body(pool):
        squats = squat_slurm_worlds(c, pool, 8)
        check(all("under --slurm a slurm-<id> world is one of the coordinator's own" in said for said in squats),
              f"a worker key registering slurm-1..8 ahead of their Slurm jobs is refused each time: {squats[:1]}")
        jobs = {}
        submitted = time.time()
        # The 4-rank job waits for the 2-rank ones to end: 40 steps give it seconds in the queue.
        for name, ranks in (("two_a", 2), ("four", 4), ("two_b", 2)):
            path = job_file(c, name, steps=12 if ranks == 4 else 40,
                            extra=f"resources:\n  ranks: {ranks}\n  max_restarts: 0\n")
            jobs[name] = (pool.jobctl("submit", path)["job_id"], ranks, path)
        latency = first_step_after(c, submitted, jobs["two_a"][0], "two_a")
        slurm_shown(pool, jobs["four"][0])
        finals = {name: wait_for(lambda j=job_id: (lambda r: r if r["state"] in ("SUCCEEDED", "FAILED") else None)(
            pool.jobctl("status", str(j))), 150, f"job {name} to end") for name, (job_id, _, _) in jobs.items()}
        for name, (job_id, ranks, _) in jobs.items():
            report = pool.jobctl("report", str(job_id))
            attempts = report["attempts"]
            slurm_job = attempts[0]["placement"].removeprefix("slurm-").removesuffix(":0") if attempts else "?"
            check(finals[name]["state"] == "SUCCEEDED" and len(attempts) == 1,
                  f"{name} ({ranks} ranks): {finals[name]['state']} in {len(attempts)} attempt(s), as Slurm "
                  f"job {slurm_job}: {finals[name]['reason']}")
            epochs = [int(e["epoch"]) for e in report["epochs"]]
            check(epochs == [1], f"{name}: each epoch logged once: {epochs}")
            script = c.outside("h1", f"runs/{job_id}/attempt-1/job.sbatch")
            text = open(script).read() if os.path.exists(script) else ""
            check(f"#SBATCH --ntasks={ranks}" in text and "TRAINYARD_WORLD_TOKEN=" not in text,
                  f"{name}: its generated script is in its folder, without a secret: {script}")
            logs = [c.outside(h, f"runs/{job_id}/attempt-1/slurm-{slurm_job}.out") for h in c.names]
            said = "".join(open(p).read() for p in logs if os.path.exists(p))
            nodes = re.findall(r"tasks on (\S+)", said)
            check(nodes and (ranks < 4 or nodes[0] == "h[2-3]"),
                  f"{name}: Slurm placed its {ranks} tasks on {nodes[:1]}")
            events = [e for e in finals[name].get("events", []) if "Slurm job" in e]
            print(f"     {name}'s Slurm events: {events}")
        waited = [e for e in finals["four"].get("events", []) if "PENDING (" in e]
        check(waited, f"the 4-rank job waited in Slurm's queue, with Slurm's reason: {waited[:1]}")
        # The 4-rank job over two nodes against srun's own 4 ranks of the same job file.
        straight, _ = launch(s, "four", ["srun", "-N2", "-n4", os.path.abspath(args.worker), jobs["four"][2],
                                         "--runs-dir", os.path.join(c.host_dir, "runs")])
        through = [x["loss"] for h in c.names for x in steps_if(c.outside(h, f"runs/{jobs['four'][0]}/four"))]
        check(through and through == [x["loss"] for x in steps(straight)],
              f"the 4-rank job's {len(through)} losses equal srun -N2 -n4 of its file, bit for bit")
        usage_matches_slurm(c, s, pool, {name: job_id for name, (job_id, _, _) in jobs.items()})
        pool_latency = pool_start_latency(c, args)
        print(f"submit to first step, 2 ranks: {latency:.1f} s through Slurm (sched_interval=2), "
              f"{pool_latency:.1f} s on a pool's agents")

    with_slurm_coordinator(c, s, pool, body)


SQUATTER = """
import os, sys
sys.path.insert(0, {tests!r})
from harness import wire
keys = wire.read_keys({keys!r}, "worker.key")
for n in range(1, {count} + 1):
    rank = wire.message("RankInfo")(world=f"slurm-{{n}}", world_size=1, host="squatter", device="cpu")
    body = wire.message("Register")(rank=rank, world_token=os.urandom(16).hex(), rank_token=os.urandom(16).hex())
    reply = wire.ask({endpoint!r}, keys, wire.envelope(register=body))
    print(reply.error.message if reply is not None and reply.WhichOneof("body") == "error" else "not refused")
"""


def squat_slurm_worlds(c, pool, count):
    """A worker-key holder on h1 registers as slurm-1..count, the worlds of the next Slurm
    jobs, before they exist; the coordinator's answer to each."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = SQUATTER.format(tests=tests, keys=pool.keys, endpoint=pool.endpoint, count=count)
    result = c.run("h1", [sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    return result.stdout.splitlines() if result.returncode == 0 else [result.stderr[-500:]]


def with_slurm_coordinator(c, s, pool, body, extra=()):
    """body(pool), run while coordinator --slurm (with `extra`) serves `pool` on h1; sbatch
    passes its environment (the rig's network for MPI) on to the jobs. The coordinator's
    logs and Slurm's are printed when body fails."""
    process = c.popen("h1", pool.coordinator_command(["--slurm", *extra]), env=c.environment(**RIG_NETWORK),
                      stdout=pool.log("coordinator"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: answering(pool), 30, "the coordinator")
        body(pool)
    except BaseException:
        pool.dump_logs()
        print(s.logs())
        raise
    finally:
        process.terminate()


def long_job(c, name, ranks, steps, extra="", pause_ms=0, file=None):
    """A job of `ranks` ranks and `steps` steps (4000 examples, 250 steps an epoch at 2 ranks),
    pausing `pause_ms` after each step (debug.step_pause_ms: it runs that much longer
    without more work), written to `file` (by default <name>.yaml)."""
    epochs = -(-steps * 8 * ranks // 4000)
    pause = f"debug:\n  step_pause_ms: {pause_ms}\n" if pause_ms else ""
    return write(os.path.join(c.shared, (file or name) + ".yaml"), job_yaml(
        name, subset_tsv(c.shared, 4000),
        f"train:\n  batch_size: 8\n  epochs: {epochs}\n  max_steps: {steps}\ncheckpoint:\n  every_steps: 50\n"
        f"resources:\n  ranks: {ranks}\n{extra}{pause}"))


def all_steps(c, run):
    """Every host's steps.jsonl of `run` (rank 0's host may change between attempts), by step."""
    found = [x for h in c.names for x in steps_if(c.outside(h, run))]
    return sorted(found, key=lambda x: x["step"])


def ended(pool, job_id, timeout, what):
    return wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None)(
        pool.jobctl("status", str(job_id))), timeout, what)


TIME_LIMIT_STEPS, TIME_LIMIT_PAUSE_MS = 1000, 60


def time_limit(c, s, args):
    """Each attempt has a 1-minute limit and SIGUSR1 60 s ahead of it: Slurm signals the
    ranks at its first time-limit check (within 30 s of the start). The job needs more
    than that, so attempts are preempted, requeued free (max_restarts 0) and resumed
    until it is done. One rank, so that the test and its uninterrupted reference each hold
    one core (slurm_preempt covers a preempted job of two ranks). 1000 steps (2 epochs)
    with a 60 ms pause after each (debug.step_pause_ms): at least 60 s uninterrupted
    however fast the CPU, twice the longest wait for the first signal, with 24 s of
    training work on a two-core Intel Xeon (24 ms a step). The reference trains the same
    job without the pause, which changes no loss."""
    def body(pool):
        path = long_job(c, "limited", 1, TIME_LIMIT_STEPS, "  max_restarts: 0\n", pause_ms=TIME_LIMIT_PAUSE_MS)
        job_id = pool.jobctl("submit", path)["job_id"]
        final = ended(pool, job_id, 230, "the job to end")
        report = pool.jobctl("report", str(job_id))
        attempts = report["attempts"]
        outcomes = [a["outcome"] for a in attempts]
        check(final["state"] == "SUCCEEDED" and len(attempts) >= 2 and outcomes[-1] == "succeeded"
              and all(o.startswith("interrupted: ") and "was preempted" in o for o in outcomes[:-1]),
              f"the job {final['state']} after {len(attempts)} attempts, each before the last preempted by "
              f"the time limit's signal and requeued without a restart (max_restarts 0): "
              f"{[o[:300] for o in outcomes[:-1]][:2]}")
        got = all_steps(c, f"runs/{job_id}/limited")
        check([x["step"] for x in got] == list(range(1, TIME_LIMIT_STEPS + 1)),
              f"each of the {TIME_LIMIT_STEPS} steps logged once ({len(got)} lines)")
        epochs = [int(e["epoch"]) for e in report["epochs"]]
        check(epochs == [1, 2], f"each epoch reported once: {epochs}")
        unpaused = long_job(c, "limited", 1, TIME_LIMIT_STEPS, "  max_restarts: 0\n", file="limited_unpaused")
        straight, _ = launch(s, "limited", ["srun", "-n1", os.path.abspath(args.worker), unpaused,
                                            "--runs-dir", os.path.join(c.host_dir, "runs")])
        check([x["loss"] for x in got] == [x["loss"] for x in steps(straight)],
              "every step's loss bitwise equal to an uninterrupted srun -n1 of the job file without its pause")

    with_slurm_coordinator(c, s, RigPool(c, args), body, ["--slurm-time", "1", "--slurm-signal", "60"])


def training(c, pool, job_id, name, at_least=20):
    """The Slurm job of `job_id`'s running attempt, once it has logged `at_least` steps."""
    def ready():
        attempts = pool.jobctl("report", str(job_id))["attempts"]
        if not attempts or attempts[-1]["ended_at"] or len(all_steps(c, f"runs/{job_id}/{name}")) < at_least:
            return None
        return attempts[-1]["placement"].removeprefix("slurm-").removesuffix(":0")
    return wait_for(ready, 120, f"{name} to train")


EXTERNAL_PAUSE_MS = 50


def external(c, s, args):
    """An scancel from outside, and a node lost, each mid-run: the attempt ends with
    Slurm's state, and the job is retried or fails as its max_restarts says. The jobs
    pause after each step (debug.step_pause_ms): they only need to be running."""
    def body(pool):
        cancelled = pool.jobctl("submit", long_job(c, "cancelled", 2, 5000, "  max_restarts: 1\n",
                                                       pause_ms=EXTERNAL_PAUSE_MS))["job_id"]
        first = training(c, pool, cancelled, "cancelled")
        s.client(["scancel", first])
        second = wait_for(lambda: (lambda a: a if len(a) >= 2 else None)(
            pool.jobctl("report", str(cancelled))["attempts"]), 60, "the next attempt")
        check(second[0]["outcome"].startswith(f"failed: its Slurm job {first} ended CANCELLED"),
              f"scancel {first}: attempt 1 failed with Slurm's word, and the job was retried "
              f"(restart 1 of 1): {second[0]['outcome'][:300]}")
        again = training(c, pool, cancelled, "cancelled", at_least=1)
        pool.jobctl("cancel", str(cancelled))
        gone = wait_for(lambda: (lambda st: st if st in ("CANCELLED", "COMPLETED") else None)(
            job_state(s, again)[0]), 30, "jobctl cancel to reach Slurm")
        check(gone == "CANCELLED", f"jobctl cancel ends the running Slurm job {again}: {gone}")

        lost = pool.jobctl("submit", long_job(c, "lost", 4, 5000, "  max_restarts: 0\n"
                                              "distributed:\n  timeout_s: 120\n",
                                              pause_ms=EXTERNAL_PAUSE_MS))["job_id"]
        slurm_job = training(c, pool, lost, "lost")
        c.kill("h3", None)  # every process of the host: its slurmd, its ranks
        final = ended(pool, lost, 90, "the job to end after losing h3")
        reason = pool.jobctl("report", str(lost))["attempts"][0]["outcome"]
        check(final["state"] == "FAILED" and re.search(rf"Slurm job {slurm_job} ended (NODE_FAIL|FAILED)", reason),
              f"h3 lost mid-run: the job FAILED (max_restarts 0) with Slurm's state: {reason[:300]}")

    with_slurm_coordinator(c, s, RigPool(c, args), body)


def slurm_shown(pool, job_id):
    """While the job waits in Slurm's queue, jobctl, the dashboard's API and /metrics
    (read with prometheus_client) show its Slurm job, state and reason."""
    from prometheus_client.parser import text_string_to_metric_families

    def pending():
        status = pool.jobctl("status", str(job_id))
        return status if "PENDING" in status.get("slurm", "") or status["state"] not in ("QUEUED", "RUNNING") else None

    def views():
        """jobctl's, the API's and /metrics' views, read one after another; the job may
        leave the queue between two reads, so a view that disagrees is read again while
        jobctl still says PENDING."""
        api = next((j for j in (pool.api("/api/jobs") or {}).get("jobs", []) if j["id"] == job_id), {})
        metrics = pool.http_text("/metrics") or ""
        series = [s.labels for f in text_string_to_metric_families(metrics) if f.name == "trainyard_slurm_job"
                  for s in f.samples if s.labels.get("job") == str(job_id)]
        return api, series

    status = wait_for(pending, 60, "the job pending in Slurm")
    while True:
        shown = status.get("slurm", "")
        api, series = views()
        agree = (shown.startswith("job ") and "PENDING (" in shown and "PENDING" in api.get("slurm", "") and series
                 and series[0]["slurm_job"] == shown.split()[1].rstrip(":") and series[0]["reason"])
        still = pending()
        if agree or not still or "PENDING" not in still.get("slurm", ""):
            break
        status = still
    check(agree, f"while it waits: jobctl status says 'slurm: {shown}', the API '{api.get('slurm')}', "
                 f"/metrics {series[:1]}")


def slurm_spans(s, slurm_jobs):
    """{Slurm job id: (start, end, allocated CPUs)} from Slurm's own records (sacct -c: the rig
    keeps jobcomp/filetxt, not slurmdbd), the times as Unix seconds (SLURM_TIME_FORMAT=%s)."""
    out = s.client(["sacct", "-c", "-n", "-P", "-o", "JobID,Start,End,AllocCPUS", "-j", ",".join(slurm_jobs)],
                   SLURM_TIME_FORMAT="%s").stdout
    found = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 4 and fields[0] in slurm_jobs and fields[1].isdigit() and fields[2].isdigit():
            found[fields[0]] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return found


def usage_matches_slurm(c, s, pool, jobs):
    """jobctl usage --user and /metrics sum each attempt's rank-seconds: its ranks (one CPU
    each in Slurm's records) times the span from when its ranks began to run to its end
    (Note [Usage] in coordinator/state_store.h). That span lies inside the one Slurm's
    records give the job: neither Slurm's queue nor anything after the job is billed.
    Slurm's times are whole seconds, hence 1 s of slack each side. What the span leaves out
    of Slurm's (start-up before the coordinator saw the job run, and the exit after its
    result) is printed, not bounded: it grows with the machine's load."""
    from prometheus_client.parser import text_string_to_metric_families
    user = pwd.getpwuid(os.geteuid()).pw_name
    attempts, slurm_of = {}, {}
    for name, job_id in jobs.items():
        attempts[name] = pool.jobctl("report", str(job_id))["attempts"][0]
        slurm_of[name] = attempts[name]["placement"].removeprefix("slurm-").removesuffix(":0")
    ours = {name: a["rank_seconds"] for name, a in attempts.items()}
    rows = pool.jobctl("usage", "--user")
    mine = next((r for r in rows if r["user"] == user), {})
    metrics = pool.http_text("/metrics") or ""
    counted = [x.value for f in text_string_to_metric_families(metrics) if f.name == "trainyard_rank_seconds"
               for x in f.samples if x.name.endswith("_total") and x.labels.get("user") == user]
    check(mine.get("jobs") == len(jobs) and abs(mine.get("rank_seconds", 0) - sum(ours.values())) < 1e-6 and
          counted and abs(counted[0] - sum(ours.values())) < 1e-6,
          f"jobctl usage --user and /metrics: {user} used {sum(ours.values()):.1f} rank-seconds in "
          f"{mine.get('jobs')} jobs, the sum of their attempts' ({ {k: round(v, 1) for k, v in ours.items()} })")
    theirs = wait_for(lambda: (lambda f: f if len(f) == len(jobs) else None)(slurm_spans(s, slurm_of.values())),
                      30, "Slurm's records of the jobs")
    for name, a in attempts.items():
        start, end, cpus = theirs[slurm_of[name]]
        ran_from = a["ended_at"] - a["rank_seconds"] / cpus
        check(a["rank_seconds"] > 0 and a["ended_at"] > 0 and start - 1 <= ran_from and
              a["ended_at"] <= end + 1,
              f"{name}: {a['rank_seconds']:.1f} rank-seconds here, {cpus} ranks from {ran_from - start:+.1f} s "
              f"to {a['ended_at'] - end:+.1f} s of Slurm's record of its {end - start} s on {cpus} CPUs "
              f"(sacct -c); {(end - start) * cpus - a['rank_seconds']:.1f} CPU-seconds of start-up and "
              f"exit not counted")


def pool_start_latency(c, args):
    """Submit to first step of the same 2-rank job on a pool of two agents on h2 (a second
    coordinator, with a state and runs folder of its own)."""
    pool = RigPool(c, args, port=5556, http=8266, tag="-pool")
    pool.start_coordinator()
    pool.start_agents("h2", 2)
    wait_for(lambda: len(pool.workers()) == 2, 60, "the pool's agents")
    path = job_file(c, "pooled", steps=12, extra="resources:\n  ranks: 2\n")
    submitted = time.time()
    job_id = pool.jobctl("submit", path)["job_id"]
    return first_step_after(c, submitted, job_id, "pooled", runs=pool.runs)


ELASTIC_EXAMPLES = 840  # 2 epochs, in global batches of 8 x the replicas' ranks


def replica_steps(c, job_id):
    """{(host, replica folder): its steps.jsonl steps}, on every host."""
    out = {}
    for h in c.names:
        for path in glob.glob(c.outside(h, f"runs/{job_id}/replica-*/elastic/steps.jsonl")):
            out[(h, path.split(os.sep)[-3])] = [x["step"] for x in steps_if(os.path.dirname(path))]
    return out


def slurm_task_pid(c, host, slurm_job, task):
    """The pid of task `task` (SLURM_PROCID) of Slurm job `slurm_job`'s worker on `host`."""
    for pid in c.pids(host, ("worker",)):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if env.get(b"SLURM_JOB_ID") == slurm_job.encode() and env.get(b"SLURM_PROCID") == str(task).encode():
            return pid
    return None


def elastic_under_slurm(c, s, args, replicas, ranks):
    """An elastic job of `replicas` replicas of `ranks` ranks each under coordinator --slurm;
    the last replica's last rank is killed mid-run."""
    name = "elastic"
    total = 2 * -(-ELASTIC_EXAMPLES // (8 * replicas * ranks))  # an epoch's last batch may be short
    # Without dropout, so that its steps can be compared with today's path's (below).
    job = write(os.path.join(c.shared, name + ".yaml"), no_dropout(job_yaml(name, subset_tsv(c.shared, ELASTIC_EXAMPLES), f"""train:
  epochs: 2
  batch_size: 8
checkpoint:
  every_steps: 10
resources:
  ranks: {ranks}
distributed:
  timeout_s: 2
  elastic:
    min_replicas: {replicas - 1}
    max_replicas: {replicas}
    join_window_s: 2
debug:
  step_pause_ms: 200
""")))
    lost = f"replica-{replicas - 1}"

    def first(folder):
        return int(folder.split("-")[1]) < replicas

    def body(pool):
        job_id = pool.jobctl("submit", job)["job_id"]
        wait_for(lambda: (lambda r: len(r) == replicas and all(len(x) >= 5 for x in r.values()) and r)(
            {k: v for k, v in replica_steps(c, job_id).items() if first(k[1])}), 120, "every replica past step 5")
        placement = pool.jobctl("report", str(job_id))["attempts"][0]["placement"].split(",")
        victim_world = placement[replicas - 1].removesuffix(":0")
        lead = next(w for w in pool.workers() if w["world"] == victim_world)
        pid = slurm_task_pid(c, lead["host"], victim_world.removeprefix("slurm-"), ranks - 1)
        check(pid is not None, f"task {ranks - 1} of {victim_world} on {lead['host']}")
        before = {k: len(v) for k, v in replica_steps(c, job_id).items() if first(k[1]) and k[1] != lost}
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        wait_for(lambda: all(len(replica_steps(c, job_id).get(k, [])) > n for k, n in before.items()), 60,
                 "the survivors' next step", every=0.05)
        recovered = time.time() - killed
        print(f"elastic ({replicas} x {ranks} ranks): the survivors committed a step {recovered:.1f} s after "
              f"task {ranks - 1} of {lost} was killed")
        # A replica of one rank is lost with its process; one of several ranks, once its rank
        # 0's next collective with the dead rank misses its deadline (timeout_s, 2 s here).
        bound = 5 if ranks == 1 else 2 + 5
        check(recovered <= bound, f"the survivors commit a step within {bound} s: {recovered:.1f} s")
        done = ended(pool, job_id, 240, "the elastic job to end")
        events = "\n".join(done.get("events", []))
        report = pool.jobctl("report", str(job_id))
        check(done["state"] == "SUCCEEDED" and len(report["attempts"]) == 1,
              f"{done['state']} in {len(report['attempts'])} attempt(s): {events}")
        check([int(e["epoch"]) for e in report["epochs"]] == [1, 2], f"each epoch once: {report['epochs']}")
        check(all(int(e["ranks"]) == ranks and int(e["global_batch"]) == 8 * replicas * ranks
                  for e in report["epochs"]),
              f"each row from a replica of {ranks} ranks, in global batches of {8 * replicas * ranks}: "
              f"{[(e['ranks'], e['global_batch']) for e in report['epochs']]}")
        slurm_jobs = [cell.removeprefix("slurm-").removesuffix(":0")
                      for cell in report["attempts"][0]["placement"].split(",")]
        check(len(slurm_jobs) == replicas + 1 and "one for each replica" in events and
              f"replica {replicas} starts on agent slurm-" in events,
              f"a Slurm job a replica, then one more for the replacement: {slurm_jobs}: {events}")
        check(f"replica {replicas - 1}'s Slurm job {slurm_jobs[replicas - 1]}" in events,
              f"the lost replica's Slurm job's end: {events}")
        found = replica_steps(c, job_id)
        for (h, folder), taken in found.items():
            if first(folder) and folder != lost:
                check(taken == list(range(1, total + 1)), f"{h}'s {folder} took every step once: {taken}")
        finishers = [k for k, taken in found.items() if taken and taken[-1] == total]
        states = {k: trained_state(c.outside(k[0], f"runs/{job_id}/{k[1]}/{name}/checkpoints/"
                                             f"step-{total:09d}.safetensors")) for k in finishers}
        check(len(states) == replicas and len(set(states.values())) == 1 and
              any(k[1] == f"replica-{replicas}" for k in states),
              f"every replica at the end, the replacement among them, with the same weights and moments: {states}")
        check("healed from" in events, f"the replacement was healed from a live replica: {events}")
        script = open(c.outside("h1", f"runs/{job_id}/attempt-1/job.replica-{replicas}.sbatch")).read()
        check(f"#SBATCH --ntasks={ranks}\n" in script and "#SBATCH --nodes=1\n" in script,
              f"the replacement's script asks for {ranks} tasks on one node: {script}")
        if ranks > 1:
            same_as_one_rank(c, s, args, replicas * ranks, job_id, name)

    with_slurm_coordinator(c, s, RigPool(c, args), body)


def no_dropout(text):
    return text.replace("  dropout: 0.1\n", "  dropout: 0.0\n")


def same_as_one_rank(c, s, args, world, job_id, name):
    """The elastic job's first steps (replica 0's, before the failure) against today's
    path: one standalone rank of the same job taking its whole global batch of 8 x `world`
    examples, with the same steps in all (so the same learning-rate schedule). Each step's
    loss is the global batch's mean in both, and agrees up to the order of the sums."""
    compared = 5
    straight_file = write(os.path.join(c.shared, "straight.yaml"), no_dropout(job_yaml(
        "straight", subset_tsv(c.shared, ELASTIC_EXAMPLES), f"train:\n  epochs: 2\n  batch_size: {8 * world}\n")))
    straight, _ = launch(s, "straight", ["srun", "-N1", "-n1", os.path.abspath(args.worker), straight_file,
                                         "--runs-dir", os.path.join(c.host_dir, "runs")])
    want = [x["loss"] for x in steps(straight)][:compared]
    got = next(steps(os.path.dirname(p))[:compared] for h in c.names
               for p in glob.glob(c.outside(h, f"runs/{job_id}/replica-0/{name}/steps.jsonl")))
    check(len(want) == compared and all(abs(g["loss"] - w) <= 1e-4 * abs(w) for g, w in zip(got, want)),
          f"the first {compared} steps' losses within 1e-4 of one rank's of the whole batch: "
          f"{[g['loss'] for g in got]} against {want}")


def elastic(c, s, args):
    elastic_under_slurm(c, s, args, replicas=3, ranks=1)


def elastic_ranks(c, s, args):
    elastic_under_slurm(c, s, args, replicas=2, ranks=2)


def answering(pool):
    try:
        return pool.jobctl("list") is not None
    except AssertionError:
        return None


def steps_if(run):
    return steps(run) if os.path.exists(os.path.join(run, "steps.jsonl")) else []


def under_slurm(case):
    """A run_case() case that runs case(c, s, args) on a fresh rig c of 3 hosts with Slurm s
    on it (slurmctld on h1, slurmd on h2 and h3), up but for the queue case, which starts
    it itself; skipped (exit 77) where the rig or Slurm cannot run here."""
    def run(args, work):
        skip_unless_available()
        why = slurm.available()
        if why:
            skip(why)
        with Rig(3) as c:
            s = slurm.Slurm(c, controller="h1", nodes=["h2", "h3"])
            case(c, s if case is queue else s.up(), args)
    return run


CASES = {"standalone": under_slurm(standalone), "preempt": under_slurm(preempt), "queue": under_slurm(queue),
         "time_limit": under_slurm(time_limit), "external": under_slurm(external), "elastic": under_slurm(elastic),
         "elastic_ranks": under_slurm(elastic_ranks)}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__)
