#!/usr/bin/env python3
"""Faults on a real network, on the cluster rig (tests/harness/rig.py). One case a run:

  stopped_rank  standalone, 2 hosts x 2 ranks: SIGSTOP of rank 3 on h2 mid-epoch; every
                report names `h2:3` and says its rank waited timeout_s (within 2 s), and
                the job exits non-zero within timeout_s + 20 s
  link_cut      a pool on h2, h3, h4 (coordinator on h1): a 4-rank job runs on two of
                them; the link of the host without rank 0 goes down. Rank 0's report
                names that host's ranks, the coordinator fails the attempt with that
                reason, and the job resumes on the hosts left from their own disks'
                checkpoints, each epoch reported once
  power_off     the same, but every process of that host is killed at once (kill -9)
  partition     the coordinator's host is cut off from the pool for 6 s (less than its
                liveness window) while a job runs across two hosts: after the link is
                back, the job goes on and succeeds as the attempt that was running

Each case prints its time to recover. Exit 77 (skipped) where the rig cannot be made."""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import TimedOutput, hang_waits, job_yaml, subset_tsv, wait_for, world_rank, write  # noqa: E402
from harness.pool import POOL_FLAGS  # noqa: E402
from harness.rig import on_rig  # noqa: E402
from harness.rig_pool import RigPool  # noqa: E402

TIMEOUT_S = 6  # the jobs' distributed.timeout_s


def rank_pids(c, host):
    """{MPI rank: pid} of the worker processes on `host`."""
    found = {}
    for pid in c.pids(host, ("worker",)):
        try:
            found[world_rank(pid)] = pid
        except (OSError, KeyError, ValueError):
            pass
    return found


def lines_of(path):
    try:
        with open(path) as f:
            return f.read().count("\n")
    except OSError:
        return 0


def stopped_rank(c, args):
    job = write(os.path.join(c.shared, "hang.yaml"), job_yaml(
        "hang", subset_tsv(c.shared, 6000),
        f"train:\n  batch_size: 16\n  epochs: 5\ndistributed:\n  timeout_s: {TIMEOUT_S}\n"))
    run = c.popen("h1", c.mpirun({"h1": 2, "h2": 2}, [args.worker, job, "--runs-dir",
                                                     os.path.join(c.host_dir, "runs")], args.mpirun),
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = TimedOutput(run)
    wait_for(lambda: lines_of(c.outside("h1", "runs/hang/steps.jsonl")) >= 20 or run.poll() is not None, 120,
             "20 steps")
    pids = rank_pids(c, "h2")
    os.kill(pids[3], signal.SIGSTOP)
    stopped = time.time()
    try:
        run.wait(timeout=TIMEOUT_S + 40)
    finally:
        os.kill(pids[3], signal.SIGCONT)
    elapsed = time.time() - stopped
    report = [line for line in output.text().splitlines() if "timed out" in line]
    for line in report[:3]:
        print(line)
    check(report and all("rank h2:3 did not reach it" in line for line in report),
          "every rank that reports names h2:3")
    # The report comes at the collective's deadline (the ranks poll it often); the exit
    # after it is mpirun's teardown across hosts, which a loaded machine slows. A job that
    # does not end on its own runs until wait()'s limit.
    waits = hang_waits(report)
    reported = output.first("timed out", stopped)
    print(f"the ranks waited {waits} s; the first report came {reported:.1f} s after the stop, the exit "
          f"{elapsed:.1f} s after it")
    check(waits and all(TIMEOUT_S <= w <= TIMEOUT_S + 2 for w in waits),
          f"each rank gives up at its deadline, {TIMEOUT_S} s, within 2 s: {waits}")
    check(reported <= TIMEOUT_S + 10, f"the first report came {reported:.1f} s after the stop (timeout_s {TIMEOUT_S})")
    check(run.returncode != 0 and elapsed <= TIMEOUT_S + 20,
          f"the job exits {run.returncode} {elapsed:.1f} s after the stop (timeout_s {TIMEOUT_S})")


def pool_job(c, name, timeout_s=TIMEOUT_S):
    """A 4-rank job of 3 epochs of 32 steps, checkpointed every 10, pausing 120 ms after
    each step (debug.step_pause_ms): however fast the CPU, more than 10 s are left after
    the first checkpoint or the first steps, so the fault comes mid-run; and recovery, not
    training, is the test's time."""
    return write(os.path.join(c.shared, name + ".yaml"), job_yaml(
        name, subset_tsv(c.shared, 1000),
        f"train:\n  batch_size: 8\n  epochs: 3\ncheckpoint:\n  every_steps: 10\n"
        f"distributed:\n  timeout_s: {timeout_s}\nresources:\n  ranks: 4\n  max_restarts: 3\n"
        f"debug:\n  step_pause_ms: 120\n"))


def start_pool(c, args, hosts):
    # Heartbeats every 0.5 s, and 80 of them missed (40 s) before an agent counts as lost:
    # behind a cut link the job's own report must come first, and it takes the collective's
    # deadline (TIMEOUT_S), the agent's abort grace (5 s) and kill grace (10 s) for mpirun,
    # which waits on the unreachable host's daemon, plus whatever a loaded machine adds.
    pool = RigPool(c, args, liveness=80)
    pool.start_coordinator()
    for host in hosts:
        pool.start_agents(host, 2)
    wait_for(lambda: len(pool.workers()) == 2 * len(hosts), 60, "the agents")
    return pool


def placement_hosts(pool, report, attempt):
    host_of = {w["world"]: w["host"] for w in pool.known_workers}
    return [host_of.get(agent.rsplit(":", 1)[0]) for agent in report["attempts"][attempt]["placement"].split(",")]


def lose_a_host(c, args, how):
    pool = start_pool(c, args, ["h2", "h3", "h4"])
    other = None
    try:
        pool.known_workers = pool.workers()
        job_id = pool.jobctl("submit", pool_job(c, "faulted"))["job_id"]

        def training_across_hosts():
            """(attempt index, its hosts) once the running attempt has a checkpoint on
            each of its hosts. On a loaded machine an attempt may fail to start (ssh
            or Open MPI's daemons too slow) and be retried: the fault is for a running one."""
            report = pool.jobctl("report", str(job_id))
            if not report["attempts"] or report["attempts"][-1]["ended_at"]:
                return None
            index = len(report["attempts"]) - 1
            hosts = placement_hosts(pool, report, index)
            folders = [c.outside(h, "runs/1/faulted/checkpoints") for h in set(hosts)]
            ready = all(os.path.isdir(f) and any(n.startswith("step-") for n in os.listdir(f)) for f in folders)
            return (index, hosts) if ready else None

        attempt, first = wait_for(training_across_hosts, 180, "an attempt training with checkpoints on its hosts")
        lead, other = first[0], next(h for h in first if h != first[0])
        if how == "link_cut":
            c.link(other, up=False)
        else:
            c.kill(other, None)
        faulted = time.time()
        print(f"{how}: {other} (the job ran on {first}, rank 0 on {lead})")
        second = wait_for(lambda: (lambda r: r if len(r["attempts"]) > attempt + 1 else None)(
            pool.jobctl("report", str(job_id))), TIMEOUT_S + 60, "the next attempt")
        failed_at = time.time() - faulted
        reason = second["attempts"][attempt]["outcome"]
        # A cut link leaves the ranks there silent: the collective's deadline finds them. A
        # powered-off host's sockets close at once: mpirun loses its daemon there (and
        # names the host), or, when the ssh session to it ends first, reports that a
        # daemon failed (without a host; the attempt still fails at once).
        if how == "link_cut":
            named = f"rank {other}:" in reason and "did not reach it" in reason
        else:
            named = (f"lost contact with host {other}" in reason or
                     "unable to reliably start one or more daemons" in reason) and failed_at < TIMEOUT_S
        check(named, f"attempt {attempt + 1} failed {failed_at:.1f} s later, naming {other}: {reason[:400]}")
        final = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
            pool.jobctl("status", str(job_id))), 300, "the job to end")
        recovered = time.time() - faulted
        report = pool.jobctl("report", str(job_id))
        last = placement_hosts(pool, report, len(report["attempts"]) - 1)
        check(final["state"] == "SUCCEEDED" and other not in last,
              f"the job {final['state']} on {sorted(set(last))} after {len(report['attempts'])} attempts, "
              f"{recovered:.1f} s after the fault")
        epochs = [int(e["epoch"]) for e in report["epochs"]]
        check(epochs == [1, 2, 3], f"each epoch reported once: {epochs}")
        print(f"recovery: failed {failed_at:.1f} s after the fault, succeeded {recovered:.1f} s after it")
    except BaseException:
        pool.dump_logs()
        for host in ("h2", "h3", "h4"):
            pids = ",".join(map(str, c.pids(host)))
            if pids:
                print(f"--- processes on {host}\n" + subprocess.run(
                    ["ps", "-o", "pid,ppid,pgid,stat,etimes,args", "-p", pids], capture_output=True, text=True).stdout)
        raise
    finally:
        if how == "link_cut" and other:
            c.link(other, up=True)


def partition(c, args):
    pool = start_pool(c, args, ["h2", "h3"])
    try:
        # The collectives' deadline is not what this case tests: a generous one keeps a
        # loaded machine's slow step from failing the attempt while the link is cut.
        job_id = pool.jobctl("submit", pool_job(c, "healed", timeout_s=60))["job_id"]

        def training():
            """The number of attempts so far, once the newest runs and has logged steps (on
            a loaded machine an attempt may fail to start and be retried first)."""
            attempts = pool.jobctl("report", str(job_id))["attempts"]
            steps = lines_of(c.outside("h2", "runs/1/healed/steps.jsonl")) + lines_of(
                c.outside("h3", "runs/1/healed/steps.jsonl"))
            return len(attempts) if attempts and not attempts[-1]["ended_at"] and steps >= 3 else None

        running = wait_for(training, 180, "the job to train")
        c.link("h1", up=False)
        time.sleep(6)
        c.link("h1", up=True)
        healed = time.time()
        final = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
            pool.jobctl("status", str(job_id))), 300, "the job to end")
        report = pool.jobctl("report", str(job_id))
        check(final["state"] == "SUCCEEDED" and len(report["attempts"]) == running,
              f"h1 cut off for 6 s during attempt {running}: the job {final['state']} as attempt "
              f"{len(report['attempts'])}, {time.time() - healed:.1f} s after the link came back")
    except BaseException:
        pool.dump_logs()
        raise


CASES = {"stopped_rank": on_rig(3, stopped_rank),
         "link_cut": on_rig(4, lambda c, args: lose_a_host(c, args, "link_cut")),
         "power_off": on_rig(4, lambda c, args: lose_a_host(c, args, "power_off")),
         "partition": on_rig(3, partition)}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__)
