#!/usr/bin/env python3
"""Worker pools end to end: a real coordinator, real pool agents (`mpirun -n N worker
--coordinator` starts N independent ones; `worker --coordinator` one) and jobctl, all on
127.0.0.1, training real (small) jobs on the langid data.

Cases:
  gang              three 2-rank jobs on a 4-rank pool: two run at once, the third
                    follows, all succeed with their epoch logs under runs/, and the
                    losses equal those of a standalone run of the same job file;
  rank_kill         kill -9 of a job's rank 1 (a process of the job's own mpirun): the
                    attempt fails naming the job rank, its pid and SIGKILL; the pool
                    lives on, unrestarted, and the job resumes on it from its checkpoint
                    as attempt 2, every epoch logged exactly once;
  isolation         on a 4-rank pool, a 2-rank job that fails mid-run (its rank 0
                    cannot write a checkpoint and aborts its MPI world) ends alone: a
                    concurrent job on the other two ranks runs to SUCCEEDED as attempt
                    1, and the pool, still the same processes, then runs a new job;
  coordinator_kill  kill -9 of the coordinator mid-job, restarted ~5 s later: the queue
                    is identical, the running job is re-adopted (no second attempt) and
                    completes, and no epoch row is lost or duplicated;
  cancel            cancelling a running job frees its ranks within a few seconds, and
                    the queued job then starts and succeeds; a job running when its pool
                    is stopped is requeued, not failed;
  agent_kill        kill -9 of one agent of a 4-agent pool, the lead of a running job: that
                    job's attempt ends (requeued), a concurrent job on two other agents
                    runs on to SUCCEEDED as attempt 1, the other agents and their mpirun
                    live on unrestarted, and an agent started alone (no mpirun) joins the
                    pool, which then runs the requeued job to the end;
  pause_45,         the coordinator is stopped (SIGSTOP) for 45 s or 120 s, many times
  pause_120         the time after which a silent rank counts as lost and longer than the
                    agents' reconnect backoff, while a job runs; after SIGCONT the job goes
                    on and succeeds as attempt 1: the coordinator does not blame workers
                    for its own deafness;
  root              (as root only; exit 77 otherwise) agents started by `mpirun
                    --allow-run-as-root`, with no OMPI_ALLOW_RUN_AS_ROOT* in the
                    environment, pass the consent on to their jobs' mpirun, and the job
                    succeeds; an agent started as root without consent fails its job with
                    mpirun's own first line ("... attempt to run as root") as the reason;
  gpu               a 2-rank pool on one GPU (labelled gpu; exit 77 without one) runs a
                    CUDA job end to end over the MPI backend, and its losses equal a
                    standalone run's."""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case, skip  # noqa: E402
from harness.e2e import LANGID, require_cuda, wait_for  # noqa: E402
from harness.pool import (POOL_FLAGS, epoch_column, final_losses_of_standalone_run, job_processes,  # noqa: E402
                          on_cluster, write_job)


def case_gang(c, work):
    c.start(4)
    jobs = [c.submit(write_job(work, f"gang{i}", epochs=3)) for i in range(3)]
    peak = wait_for(lambda: (lambda s: s if s.count("RUNNING") == 2 else None)(
        [c.job(j)["state"] for j in jobs]), 60, "two jobs running at once")
    check(peak.count("QUEUED") == 1, peak)
    for j in jobs:
        c.wait_state(j, {"SUCCEEDED", "FAILED"}, 240)
    reports = [c.jobctl("report", str(j)) for j in jobs]
    for r in reports:
        check(r["state"] == "SUCCEEDED", r)
        check(len(r["attempts"]) == 1, r)
        attempt_dir = os.path.join(c.runs, str(r["id"]), "attempt-1")
        epochs = epoch_column(os.path.join(attempt_dir, "epochs.csv"))
        check(epochs == [1, 2, 3], epochs)
        with open(os.path.join(attempt_dir, "summary.json")) as f:
            status = json.load(f)["status"]
        check(status == "succeeded", f"job {r['id']}'s summary.json: {status}")
    # jobctl list shows each job's metric as its last epoch row gave it.
    listed = {j["id"]: j for j in c.jobctl("list", "--state", "succeeded", "--name", "gang")}
    for r in reports:
        with open(os.path.join(c.runs, str(r["id"]), "attempt-1", "epochs.csv")) as f:
            last = list(csv.DictReader(f))[-1]
        got = listed.get(r["id"], {})
        check(got.get("metric") == "eval_acc" and abs(got.get("metric_value", -1) - float(last["eval_acc"])) < 1e-9,
              (got, last["eval_acc"]))
    starts = sorted((r["attempts"][0]["started_at"], r["attempts"][0]["ended_at"]) for r in reports)
    # The third job started only once one of the first two had ended.
    check(starts[2][0] >= min(starts[0][1], starts[1][1]) - 0.5, starts)
    # The pool runs a job through the same code as standalone mode: same losses, bit for bit.
    standalone = final_losses_of_standalone_run(c, work, os.path.join(work, "gang0.yaml"), "gang0")
    with open(os.path.join(c.runs, str(jobs[0]), "summary.json")) as f:
        pooled = json.load(f)["final"]
    check(pooled == standalone, (pooled, standalone))
    print("gang: 2 of 3 jobs ran at once on 4 ranks, the third followed; all succeeded with 3 epoch rows each; "
          f"the pool's losses equal a standalone run's exactly ({pooled})")


def agents(c):
    return sorted((w["rank"], w["pid"]) for w in c.workers())


def case_rank_kill(c, work):
    c.start(2)
    before = agents(c)
    job = c.submit(write_job(work, "victim", epochs=6, max_restarts=2))
    wait_for(lambda: c.epochs_done(job) >= 2, 120, "two epochs of attempt 1")
    victim = job_processes(c.args.worker, c.pool.pid)[1]
    os.kill(victim, signal.SIGKILL)
    ended = wait_for(lambda: (lambda j: j if j["attempts"] >= 2 or j["state"] != "RUNNING" else None)(
        c.job(job)), 30, "attempt 1 to end")
    report = c.jobctl("report", str(job))
    reason = report["attempts"][0]["outcome"]
    check("job rank 1" in reason and "SIGKILL" in reason and str(victim) in reason, (reason, ended))
    final = c.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    check(final["state"] == "SUCCEEDED", final)
    report = c.jobctl("report", str(job))
    check([a["attempt"] for a in report["attempts"]] == [1, 2], report["attempts"])
    check("signal 9 (SIGKILL)" in report["attempts"][0]["outcome"], report["attempts"][0])
    epochs = epoch_column(os.path.join(c.runs, str(job), "epochs.csv"))
    check(epochs == [1, 2, 3, 4, 5, 6], epochs)
    first = epoch_column(os.path.join(c.runs, str(job), "attempt-1", "epochs.csv"))
    second = epoch_column(os.path.join(c.runs, str(job), "attempt-2", "epochs.csv"))
    check(first and second and max(first) < min(second) and sorted(first + second) == [1, 2, 3, 4, 5, 6],
          (first, second))
    check(any("resum" in e for e in report["events"]), report["events"])
    check(c.pool.poll() is None and agents(c) == before, (before, agents(c)))
    print(f"rank_kill: attempt 1 failed with '{reason}'; attempt 2 resumed at epoch {min(second)} on the same, "
          f"unrestarted pool; epochs {first} + {second}, each once")


def case_isolation(c, work):
    c.start(4)
    before = agents(c)
    doomed = c.submit(write_job(work, "doomed", epochs=8))
    bystander = c.submit(write_job(work, "bystander", epochs=5))
    wait_for(lambda: c.epochs_done(doomed) >= 1 and c.job(bystander)["state"] == "RUNNING", 120,
             "both jobs running, the first past epoch 1")
    # The doomed job's next checkpoint cannot be written: its rank 0 throws while rank 1
    # waits in a collective, so the job must abort its MPI world.
    checkpoints = os.path.join(c.runs, str(doomed), "doomed", "checkpoints")
    subprocess.run(["rm", "-rf", checkpoints], check=True)
    with open(checkpoints, "w") as f:
        f.write("not a folder\n")
    failed = c.wait_state(doomed, {"FAILED", "SUCCEEDED"}, 120)
    check(failed["state"] == "FAILED" and "checkpoints" in failed["reason"], failed)
    check(c.job(bystander)["state"] == "RUNNING", c.job(bystander))
    done = c.wait_state(bystander, {"SUCCEEDED", "FAILED", "QUEUED"}, 240)
    check(done["state"] == "SUCCEEDED" and done["attempts"] == 1, done)
    epochs = epoch_column(os.path.join(c.runs, str(bystander), "epochs.csv"))
    check(epochs == [1, 2, 3, 4, 5], epochs)
    check(c.pool.poll() is None and agents(c) == before, (before, agents(c)))
    # submit --wait returns when the job ends: exit 0, the final status as its last line
    after = subprocess.run([c.args.jobctl, "--coordinator", c.endpoint, "--keys", c.keys, "submit",
                            write_job(work, "after", epochs=1), "--wait", "--json"],
                           capture_output=True, text=True, timeout=180)
    check(after.returncode == 0 and json.loads(after.stdout.splitlines()[-1])["state"] == "SUCCEEDED",
          (after.returncode, after.stdout, after.stderr))
    check(agents(c) == before, (before, agents(c)))
    print(f"isolation: the failing job ended alone ({failed['reason'][:160]}); the concurrent job succeeded as "
          "attempt 1, and the same pool processes then ran a new job (jobctl submit --wait: exit 0)")


def queue_view(c):
    return [(j["id"], j["name"], j["state"], j["priority"], j["ranks"], j["attempts"]) for j in c.jobctl("list")]


def case_coordinator_kill(c, work):
    c.start(2)
    # 8 epochs of 10 steps (300 examples, 2 ranks of 16), 200 ms apart: 16 s at least,
    # still running when the coordinator is back (about 7 s after the first epoch),
    # however fast the CPU.
    job = c.submit(write_job(work, "survivor", epochs=8, pause_ms=200))
    waiting = c.submit(write_job(work, "waiting", epochs=1))
    wait_for(lambda: c.epochs_done(job) >= 1, 120, "the first epoch")
    before = queue_view(c)
    c.coordinator.send_signal(signal.SIGKILL)
    c.coordinator.wait(timeout=10)
    time.sleep(5)
    c.start_coordinator()
    after = queue_view(c)
    check(after == before, (before, after))
    final = c.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    check(final["state"] == "SUCCEEDED" and final["attempts"] == 1, final)
    check(any("re-adopted" in e for e in final["events"]), final["events"])
    epochs = epoch_column(os.path.join(c.runs, str(job), "epochs.csv"))
    check(epochs == list(range(1, 9)), epochs)
    def logs(*flags):
        return subprocess.run([c.args.jobctl, "--coordinator", c.endpoint, "--keys", c.keys, "logs", *flags, str(job)],
                              capture_output=True, text=True, timeout=30).stdout.splitlines()
    table, csv_lines, objects = logs(), logs("--csv"), [json.loads(line) for line in logs("--json")]
    check(table[0].split()[:4] == ["epoch", "time_s", "steps", "ms/step"], table)  # the worker's epoch table
    check([int(line.split()[0]) for line in table[1:]] == list(range(1, 9)), table)
    check([int(line.split(",")[0]) for line in csv_lines[1:]] == list(range(1, 9)), csv_lines)
    check([row["epoch"] for row in objects] == list(range(1, 9)) and objects[0]["steps"] > 0, objects)
    ended = c.wait_state(waiting, {"SUCCEEDED", "FAILED"}, 120)
    check(ended["state"] == "SUCCEEDED", ended)
    print("coordinator_kill: queue identical after the restart; the job was re-adopted as attempt 1 and "
          "logged epochs 1..8 exactly once; the queued job then ran")


def case_cancel(c, work):
    c.start(2)
    long_job = c.submit(write_job(work, "long", epochs=50))
    queued = c.submit(write_job(work, "next", epochs=1))
    wait_for(lambda: c.epochs_done(long_job) >= 1, 120, "the long job's first epoch")
    status = c.job(queued)
    check(status["state"] == "QUEUED", status)
    start = time.time()
    cancelled = c.jobctl("cancel", str(long_job))
    check(cancelled["state"] == "CANCELLED", cancelled)
    wait_for(lambda: all(w["job_id"] != long_job for w in c.workers()), 15, "the cancelled job's ranks to stop")
    c.wait_state(queued, {"RUNNING", "SUCCEEDED"}, 15)
    freed_s = time.time() - start
    ended = c.wait_state(queued, {"SUCCEEDED", "FAILED"}, 120)
    check(ended["state"] == "SUCCEEDED", ended)
    done = c.epochs_done(long_job)
    check(done < 50, f"the cancelled job ran all {done} of its epochs")
    print(f"cancel: the running job stopped on both ranks and the queued job started {freed_s:.1f} s after the cancel")
    # Stopping the pool under a running job is not the job's failure: it is requeued
    # without using one of its (zero) restarts.
    third = c.submit(write_job(work, "interrupted", epochs=50))
    wait_for(lambda: c.epochs_done(third) >= 1, 120, "the third job's first epoch")
    c.pool.send_signal(signal.SIGTERM)
    c.pool.wait(timeout=60)
    job = c.wait_state(third, {"QUEUED", "FAILED"}, 30)
    check(job["state"] == "QUEUED" and "interrupted" in job["reason"] and "SIGTERM" in job["reason"], job)
    print(f"cancel: a pool stopped under a running job requeued it: {job['reason']}")


def pause(c, work, seconds):
    c.start(2)
    job = c.submit(write_job(work, "paused", epochs=6))
    wait_for(lambda: c.epochs_done(job) >= 1, 120, "the first epoch")
    c.coordinator.send_signal(signal.SIGSTOP)
    # --heartbeat 0.5 x --liveness 10 = 5 s of silence makes a rank lost; the agents give
    # up on the coordinator after 2 s and back off up to 16 s between reconnects.
    time.sleep(seconds)
    c.coordinator.send_signal(signal.SIGCONT)
    final = c.wait_state(job, {"SUCCEEDED", "FAILED", "QUEUED"}, 240)
    check(final["state"] == "SUCCEEDED" and final["attempts"] == 1, final)
    epochs = epoch_column(os.path.join(c.runs, str(job), "epochs.csv"))
    check(epochs == list(range(1, 7)), epochs)
    check(len(c.workers()) == 2, c.workers())
    print(f"pause: a coordinator stopped for {seconds} s (liveness window 5 s) resumed, and the job succeeded as "
          "attempt 1 on the same two agents")


def case_pause_45(c, work):
    pause(c, work, 45)


def case_pause_120(c, work):
    pause(c, work, 120)


def case_agent_kill(c, work):
    c.start(4)
    before = {w["world"]: w["pid"] for w in c.workers()}
    victim_job = c.submit(write_job(work, "orphaned", epochs=4, max_restarts=1))
    bystander = c.submit(write_job(work, "bystander", epochs=5))
    wait_for(lambda: c.job(victim_job)["state"] == "RUNNING" and c.job(bystander)["state"] == "RUNNING", 60,
             "both jobs running")
    wait_for(lambda: c.epochs_done(victim_job) >= 1, 120, "the first job's first epoch")
    placement = c.jobctl("report", str(victim_job))["attempts"][0]["placement"]
    lead = placement.split(",")[0].rsplit(":", 1)[0]
    os.kill(before[lead], signal.SIGKILL)
    ended = wait_for(lambda: (lambda r: r if r["attempts"][0]["outcome"] else None)(
        c.jobctl("report", str(victim_job))), 30, "the killed agent's attempt to end")
    outcome = ended["attempts"][0]["outcome"]
    check("SIGKILL" in outcome and lead in outcome, outcome)
    done = c.wait_state(bystander, {"SUCCEEDED", "FAILED", "QUEUED"}, 240)
    check(done["state"] == "SUCCEEDED" and done["attempts"] == 1, done)
    survivors = {w["world"]: w["pid"] for w in c.workers()}
    check(survivors == {w: p for w, p in before.items() if w != lead}, (before, survivors))
    check(c.pool.poll() is None, "the agents' mpirun ended with one agent")
    c.start_agent()  # a replacement, started alone
    wait_for(lambda: len(c.workers()) == 4, 60, "the replacement agent to register")
    final = c.wait_state(victim_job, {"SUCCEEDED", "FAILED"}, 240)
    check(final["state"] == "SUCCEEDED" and final["attempts"] == 2, final)
    epochs = epoch_column(os.path.join(c.runs, str(victim_job), "epochs.csv"))
    check(epochs == [1, 2, 3, 4], epochs)
    print(f"agent_kill: kill -9 of agent {lead} ended only its job's attempt ({outcome[:120]}); the other job "
          "succeeded as attempt 1, the other three agents and their mpirun lived on, and a replacement agent "
          "started alone let the requeued job finish as attempt 2")


def case_root(c, work):
    if os.geteuid() != 0:
        skip("root: not running as root")
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    plain["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    c.start_coordinator()
    c.start_pool(2, mpirun_flags=["--allow-run-as-root"], env=plain)
    job = c.submit(write_job(work, "as_root", epochs=1))
    final = c.wait_state(job, {"SUCCEEDED", "FAILED"}, 180)
    check(final["state"] == "SUCCEEDED", final)
    c.pool.send_signal(signal.SIGTERM)
    c.pool.wait(timeout=60)
    wait_for(lambda: not c.workers(), 30, "the pool's agents to leave")
    c.start_agent(env=plain)
    c.start_agent(env=plain)
    wait_for(lambda: len(c.workers()) == 2, 60, "two agents started alone")
    refused = c.submit(write_job(work, "no_consent", epochs=1))
    failed = c.wait_state(refused, {"SUCCEEDED", "FAILED"}, 120)
    check(failed["state"] == "FAILED" and "attempt to run as root" in failed["reason"], failed)
    print(f"root: agents of `mpirun --allow-run-as-root` ran a job as root; agents without consent failed theirs "
          f"with: {failed['reason'][-120:]}")


def case_gpu(c, work):
    require_cuda()
    c.start(2)
    workers = c.workers()
    check(all(w["device"] == "cuda" for w in workers), workers)
    job_file = write_job(work, "on_gpu", epochs=2, examples=2000, device="cuda")
    job = c.submit(job_file)
    final = c.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    check(final["state"] == "SUCCEEDED", final)
    with open(os.path.join(c.runs, str(job), "summary.json")) as f:
        summary = json.load(f)
    check(summary["device"].startswith("cuda"), summary)
    standalone = final_losses_of_standalone_run(c, work, job_file, "on_gpu")
    print(f"gpu: a 2-rank pool on {summary['device']} ran the job; final {summary['final']}; "
          f"standalone {standalone}")
    check(summary["final"] == standalone, (summary["final"], standalone))


def case_serve(c, work):
    """A serve job on a pool, submitted as a relative path from its own folder (not the
    agents'), its repository a relative path too: jobctl status lists its endpoints,
    tritonclient gets answers from them, and jobctl cancel stops the server."""
    import numpy as np
    import torch
    import tritonclient.http as thttp
    from transformers import BertConfig, BertForSequenceClassification
    labels = [l.strip() for l in open(os.path.join(LANGID, "labels.txt"), encoding="utf-8") if l.strip()]
    version = os.path.join(work, "repo", "langid", "1")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=sum(1 for _ in open(os.path.join(LANGID, "vocab.txt"), encoding="utf-8")),
                        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    BertForSequenceClassification(config).save_pretrained(version)
    shutil.copy(os.path.join(LANGID, "vocab.txt"), version)
    job = os.path.join(work, "serve.yaml")
    with open(job, "w") as f:
        f.write("""name: served
kind: serve
runtime: {device: cpu, threads: 1}
serve: {repository: repo, http_port: 0, grpc_port: 0, metrics_port: 0}
""")
    c.start(1)
    check(os.path.realpath(os.getcwd()) != os.path.realpath(work), f"the test runs in its own work folder {work}")
    job_id = c.jobctl("submit", os.path.basename(job), cwd=work)["job_id"]
    status = wait_for(lambda: (lambda j: j if j.get("endpoints") else None)(c.job(job_id)), 60,
                      "the serve job to list its endpoints")
    http_url = next(e["url"] for e in status["endpoints"] if e["protocol"] == "http")
    client = thttp.InferenceServerClient(http_url.replace("http://", ""))
    wait_for(lambda: client.is_server_ready(), 30, "the served model to be ready")
    text = thttp.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Guten Morgen"], dtype=object))
    label = client.infer("langid", [text]).as_numpy("label")[0]
    check(label.decode() in labels, label)
    print(f"serve: jobctl status lists {status['endpoints']}; the pool's server answered '{label.decode()}'")
    cancelled = c.jobctl("cancel", str(job_id))
    check(cancelled["state"] == "CANCELLED", cancelled)
    wait_for(lambda: all(w["job_id"] != job_id for w in c.workers()), 30, "the serve job's rank to stop")

    def refused():
        try:
            client.is_server_live()
            return False
        except Exception:
            return True
    wait_for(refused, 30, "the server to stop listening")
    print("serve: jobctl cancel stopped it")


CASES = {name: on_cluster(case) for name, case in (
    ("gang", case_gang), ("rank_kill", case_rank_kill), ("isolation", case_isolation),
    ("coordinator_kill", case_coordinator_kill), ("cancel", case_cancel), ("pause_45", case_pause_45),
    ("pause_120", case_pause_120), ("agent_kill", case_agent_kill), ("root", case_root), ("serve", case_serve),
    ("gpu", case_gpu))}


if __name__ == "__main__":
    run_case(CASES, POOL_FLAGS, __doc__)
