"""An elastic finetune job on a pool (distributed.elastic; Note [Elastic finetune]): three
replicas, each a one-rank job of its own led by its own agent, agree on every step through
the coordinator's quorum and sum their shares on their ring.

replica_lost: one replica's process is killed (SIGKILL) mid-run. The survivors retry the
step it left and go on as a quorum of two: the job succeeds as its one attempt, with no
restart and no checkpoint read, every step in a survivor's steps.jsonl exactly once (and
taken by two replicas after the kill), each epoch row once, and the membership change in
the job's events."""
import glob
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS, epoch_column, job_process_pids, on_cluster  # noqa: E402

EXAMPLES = 240  # 2 epochs of 10 steps in global batches of 24 (8 a replica)


def replica_steps(runs, job_id):
    """Each replica's steps.jsonl lines, by its run folder."""
    out = {}
    for path in glob.glob(os.path.join(runs, str(job_id), "replica-*", "elastic", "steps.jsonl")):
        with open(path) as f:
            out[path] = [json.loads(line) for line in f if line.strip()]
    return out


def replica_lost(c, work):
    c.start(3)
    train = subset_tsv(work, EXAMPLES)
    job = write(os.path.join(work, "elastic.yaml"), job_yaml("elastic", train, """train:
  epochs: 2
  batch_size: 8
distributed:
  timeout_s: 20
  elastic:
    min_replicas: 2
    max_replicas: 3
debug:
  step_pause_ms: 400
"""))
    job_id = c.submit(job)
    c.wait_state(job_id, ["RUNNING"], 60)
    wait_for(lambda: any(len(lines) >= 3 for lines in replica_steps(c.runs, job_id).values()), 120,
             "three steps committed")
    pids = wait_for(lambda: (lambda p: p if len(p) == 3 else None)(job_process_pids(c.args.worker, c.pool.pid)), 30,
                    "three replica processes")
    os.kill(pids[0], signal.SIGKILL)
    killed_at = max(len(lines) for lines in replica_steps(c.runs, job_id).values())
    done = c.wait_state(job_id, ["SUCCEEDED", "FAILED"], 240)
    report = c.jobctl("report", str(job_id))
    events = "\n".join(done.get("events", []))
    check(done["state"] == "SUCCEEDED", f"the job succeeded with two replicas left: {done}\n{events}")
    check(len(report["attempts"]) == 1, f"one attempt, no restart: {report['attempts']}")
    total = 2 * (EXAMPLES // 24)
    survivors = [lines for lines in replica_steps(c.runs, job_id).values() if lines and lines[-1]["step"] == total]
    check(len(survivors) == 2, f"two replicas took every step: {[len(s) for s in replica_steps(c.runs, job_id).values()]}")
    for lines in survivors:
        steps = [line["step"] for line in lines]
        check(steps == list(range(1, total + 1)), f"every step once, in order: {steps}")
        replicas = {line["step"]: line["replicas"] for line in lines}
        check(replicas[1] == 3 and replicas[total] == 2,
              f"three replicas before the kill (after step {killed_at}), two after it: {replicas}")
    check("did not commit" in events, f"the step the lost replica left is retried: {events}")
    check("ended (failed)" in events, f"the lost replica's end is an event: {events}")
    check(epoch_column(os.path.join(c.runs, str(job_id), "epochs.csv")) == [1, 2], "each epoch row once")


if __name__ == "__main__":
    run_case({"replica_lost": on_cluster(replica_lost)}, flags=POOL_FLAGS, description=__doc__)
