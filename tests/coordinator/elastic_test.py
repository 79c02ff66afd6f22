"""An elastic finetune job on a pool (distributed.elastic; Note [Elastic finetune]): three
replicas, each a one-rank job of its own led by its own agent, agree on every step through
the coordinator's quorum and sum their shares on their ring.

replica_lost: one replica's process is killed (SIGKILL) mid-run. The survivors retry the
step it left and go on as a quorum of two at once; the pool starts a replacement on the
freed slot (Note [Replacement replicas]), which joins at a step boundary, healed from a
live replica, and takes every step from there with the others. The job succeeds as its
one attempt, with no restart and no checkpoint read: every step in a survivor's
steps.jsonl exactly once, two replicas in the step after the kill and three again once
the replacement is in, the replacement's final weights equal to the survivors' bit for
bit, each epoch row once, and the membership changes in the job's events.

coordinator_restart: the coordinator is killed (kill -9) mid-run and started again. The
replicas' agents register again, the attempt is re-adopted with its replicas, whose
quorum forms again from the store's ids, and the job succeeds as its one attempt, each
replica the same process throughout with every step once.

all_lost: every replica's process is killed at once, past a checkpoint. The attempt fails
(no live replica holds the state), and the next attempt's replicas resume from their own
checkpoints and form their first quorum at the step after them: every step once in each
replica's steps.jsonl, each epoch row once."""
import glob
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, trained_state, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS, epoch_column, job_process_pids, on_cluster  # noqa: E402

EXAMPLES = 240  # 2 epochs of 10 steps in global batches of 24 (8 a replica)


def replica_steps(runs, job_id):
    """Each replica's steps.jsonl lines, by its run folder."""
    out = {}
    for path in glob.glob(os.path.join(runs, str(job_id), "replica-*", "elastic", "steps.jsonl")):
        with open(path) as f:
            out[path] = [json.loads(line) for line in f if line.strip()]
    return out


def elastic_job(work):
    """Three replicas (two at least) of a job of 2 epochs of 10 steps, pausing 400 ms a step
    and checkpointing every 4."""
    return write(os.path.join(work, "elastic.yaml"), job_yaml("elastic", subset_tsv(work, EXAMPLES), """train:
  epochs: 2
  batch_size: 8
checkpoint:
  every_steps: 4
resources:
  max_restarts: 1
distributed:
  timeout_s: 20
  elastic:
    min_replicas: 2
    max_replicas: 3
debug:
  step_pause_ms: 400
"""))


def three_replicas_training(c, work):
    """Starts a pool of three and the job; (its id, its replica processes' pids) once a
    replica has committed three steps."""
    c.start(3)
    job_id = c.submit(elastic_job(work))
    c.wait_state(job_id, ["RUNNING"], 60)
    wait_for(lambda: any(len(lines) >= 3 for lines in replica_steps(c.runs, job_id).values()), 120,
             "three steps committed")
    pids = wait_for(lambda: (lambda p: p if len(p) == 3 else None)(job_process_pids(c.args.worker, c.pool.pid)), 30,
                    "three replica processes")
    return job_id, pids


def replica_lost(c, work):
    job_id, pids = three_replicas_training(c, work)
    os.kill(pids[0], signal.SIGKILL)
    killed_at = max(len(lines) for lines in replica_steps(c.runs, job_id).values())
    done = c.wait_state(job_id, ["SUCCEEDED", "FAILED"], 240)
    report = c.jobctl("report", str(job_id))
    events = "\n".join(done.get("events", []))
    check(done["state"] == "SUCCEEDED", f"the job succeeded with two replicas left: {done}\n{events}")
    check(len(report["attempts"]) == 1, f"one attempt, no restart: {report['attempts']}")
    total = 2 * (EXAMPLES // 24)
    runs = replica_steps(c.runs, job_id)
    survivors = [lines for path, lines in runs.items() if lines and lines[0]["step"] == 1 and lines[-1]["step"] == total]
    check(len(survivors) == 2, f"two first replicas took every step: { {p: len(s) for p, s in runs.items()} }")
    for lines in survivors:
        steps = [line["step"] for line in lines]
        check(steps == list(range(1, total + 1)), f"every step once, in order: {steps}")
        replicas = [line["replicas"] for line in lines]
        check(replicas[0] == 3 and 2 in replicas[killed_at - 1:] and replicas[-1] == 3,
              f"three replicas before the kill (after step {killed_at}), two after it, three once replaced: {replicas}")
    joined = runs.get(os.path.join(c.runs, str(job_id), "replica-3", "elastic", "steps.jsonl"), [])
    check(joined and joined[0]["step"] > killed_at and [line["step"] for line in joined] ==
          list(range(joined[0]["step"], total + 1)) and all(line["replicas"] == 3 for line in joined),
          f"the replacement (replica 3) took every step after it joined, with two others: {joined}")
    finishers = [os.path.dirname(os.path.dirname(path)) for path, lines in runs.items() if lines[-1]["step"] == total]
    finals = {os.path.basename(folder): trained_state(
        os.path.join(folder, "elastic", "checkpoints", f"step-{total:09d}.safetensors")) for folder in finishers}
    check(len(finals) == 3 and all(state == finals["replica-3"] for state in finals.values()),
          f"the healed replacement's weights and moments equal the survivors' bit for bit: {sorted(finals)}")
    check("did not commit" in events, f"the step the lost replica left is retried: {events}")
    check("ended (failed)" in events, f"the lost replica's end is an event: {events}")
    check("replica 3 starts on" in events and "healed from" in events, f"the replacement and its heal: {events}")
    check(epoch_column(os.path.join(c.runs, str(job_id), "epochs.csv")) == [1, 2], "each epoch row once")
    sizes = [(int(e["replicas_min"]), int(e["replicas_max"]), int(e["replica_changes"])) for e in report["epochs"]]
    check(min(s[0] for s in sizes) == 2 and max(s[1] for s in sizes) == 3 and sum(s[2] for s in sizes) >= 2,
          f"the epoch rows show the quorum's sizes, 3 to 2 and back: {sizes}")


def coordinator_restart(c, work):
    job_id, pids = three_replicas_training(c, work)
    c.coordinator.send_signal(signal.SIGKILL)
    c.coordinator.wait()
    time.sleep(2)
    c.start_coordinator()
    done = c.wait_state(job_id, ["SUCCEEDED", "FAILED"], 240)
    events = "\n".join(done.get("events", []))
    check(done["state"] == "SUCCEEDED", f"the job succeeded across the coordinator's restart: {done}\n{events}")
    check(len(c.jobctl("report", str(job_id))["attempts"]) == 1, "one attempt, re-adopted")
    check("re-adopted after a coordinator restart" in events, f"the re-adoption is an event: {events}")
    total = 2 * (EXAMPLES // 24)
    runs = replica_steps(c.runs, job_id)
    for lines in runs.values():
        steps = [line["step"] for line in lines]
        check(steps == list(range(1, total + 1)), f"each replica took every step once, in order: {steps}")
    check(len(runs) == 3, f"the three replicas went on as the same processes: {sorted(runs)}")
    check(all(os.path.exists(f"/proc/{pid}") is False for pid in pids), "and have ended")
    check(epoch_column(os.path.join(c.runs, str(job_id), "epochs.csv")) == [1, 2], "each epoch row once")



def all_lost(c, work):
    job_id, pids = three_replicas_training(c, work)
    wait_for(lambda: min(len(lines) for lines in replica_steps(c.runs, job_id).values()) >= 6, 60,
             "every replica past step 6 (a checkpoint at step 4)")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    done = c.wait_state(job_id, ["SUCCEEDED", "FAILED"], 240)
    report = c.jobctl("report", str(job_id))
    events = "\n".join(done.get("events", []))
    check(done["state"] == "SUCCEEDED", f"the job succeeded: {done}\n{events}")
    check(len(report["attempts"]) == 2, f"every replica lost fails the attempt; the next one finishes: "
                                        f"{report['attempts']}")
    check("every replica ended without success" in report["attempts"][0]["outcome"], report["attempts"][0]["outcome"])
    total = 2 * (EXAMPLES // 24)
    runs = replica_steps(c.runs, job_id)
    check(len(runs) == 3, f"each replica resumed in its own folder: {sorted(runs)}")
    for lines in runs.values():
        steps = [line["step"] for line in lines]
        check(steps == list(range(1, total + 1)), f"every step once, the resumed ones after the checkpoint: {steps}")
    check("quorum" in events and "formed for step 1:" not in events.split("attempt 2")[-1],
          f"attempt 2's first quorum is at the checkpoint's step, not step 1: {events}")
    check(epoch_column(os.path.join(c.runs, str(job_id), "epochs.csv")) == [1, 2], "each epoch row once")


if __name__ == "__main__":
    run_case({"replica_lost": on_cluster(replica_lost), "coordinator_restart": on_cluster(coordinator_restart),
              "all_lost": on_cluster(all_lost)}, flags=POOL_FLAGS, description=__doc__)
