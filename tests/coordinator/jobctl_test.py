#!/usr/bin/env python3
"""The coordinator daemon and jobctl as real processes on 127.0.0.1:
  - a submission repeated with the same idempotency key makes exactly one job;
  - a malformed or invalid job file is rejected at submit with the worker's file:line
    error (exit 2) and no row is written;
  - kill -9 of the coordinator and a restart ~1 s later: the queue is identical;
  - cancel of a queued job;
  - an unreachable coordinator is a clear error (exit 1) after the retries, not a hang,
    and a malformed endpoint is bad input (exit 2);
  - CURVE: jobctl without keys, with a client key the coordinator does not allow, or in
    --insecure mode, is refused (exit 2 with the reason, or no answer) and writes no
    row; keys are made by `coordinator --init` with 0600 secrets and never overwritten;
  - a corrupt state database is refused (exit 2) unless --fresh; so are a read-only
    state database and a --runs folder that cannot be created;
  - a job left RUNNING without an open attempt (a kill between two writes of an older
    version) is requeued at start;
  - an oversized job file, and one with too many YAML nodes, are refused at once with
    the reason, and the daemon answers other requests meanwhile;
  - jobctl refuses bad options (a NaN or negative --timeout, job id 0) with exit 2,
    relays the coordinator's refusal of a request over its --max-message-bytes, and
    `logs -f` of a failed job ends with its state and reason, exit 1;
  - jobctl for scripts: submit --set/--ranks/--priority/--name reach the stored job,
    ${VAR} is expanded from jobctl's environment (unset: exit 2), flags work after the
    subcommand, $TRAINYARD_COORDINATOR names the coordinator, and submit --wait exits 1
    with the state of a job cancelled meanwhile."""
import atexit
import json
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, run_test  # noqa: E402
from harness.e2e import free_port, wait_for  # noqa: E402


class Daemon:
    # Every coordinator a check started: those still running when the test ends, however
    # it ends (a failed check raises), are killed.
    started = []

    def __init__(self, binary, state, port, *extra):
        self.proc = subprocess.Popen([binary, "--listen", f"tcp://127.0.0.1:{port}", "--state", state, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        Daemon.started.append(self.proc)

    @staticmethod
    def kill_the_rest():
        for proc in Daemon.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)


atexit.register(Daemon.kill_the_rest)


def auth_checks(a, work, jobctl, listing, checks, daemon):
    """Run with a coordinator up (its queue already holds jobs): none of these may add one."""
    before = len(listing())
    job = os.path.join(SOURCE_DIR, "configs", "jobs", "langid_tiny.yaml")
    empty = os.path.join(work, "no-keys")
    os.makedirs(empty)
    no_keys = jobctl("--keys", empty, "submit", job)
    stranger = os.path.join(work, "stranger")
    subprocess.run([a.coordinator, "--init", "--keys", os.path.join(work, "other")], check=True, capture_output=True)
    os.makedirs(stranger)
    for name in ("coordinator.pub", "worker.key"):
        shutil.copy(os.path.join(work, "keys", name), stranger)
    shutil.copy(os.path.join(work, "other", "client.key"), stranger)  # a key pair not on clients.allow
    os.chmod(os.path.join(stranger, "client.key"), 0o600)
    foreign = jobctl("--keys", stranger, "--retries", "1", "submit", job)
    insecure = jobctl("--insecure", "--retries", "1", "--timeout", "1", "submit", job)
    print("no keys:", no_keys.stderr.strip())
    print("foreign key:", foreign.stderr.strip())
    print("insecure client:", insecure.returncode, insecure.stderr.strip().splitlines()[-1])
    checks["jobctl without keys is exit 2, naming the file"] = (
        no_keys.returncode == 2 and "client.key" in no_keys.stderr and "coordinator --init" in no_keys.stderr)
    checks["a client key not on the allowlist is refused"] = (
        foreign.returncode == 2 and "refused this client key" in foreign.stderr)
    checks["an unauthenticated client is not answered"] = insecure.returncode != 0
    checks["refused clients write no row"] = len(listing()) == before
    checks["a key added to the running coordinator's list is admitted after its SIGHUP"] = sighup_admits(
        a, work, jobctl, daemon)


def sighup_admits(a, work, jobctl, daemon):
    """coordinator --add-client while the coordinator runs: the new key is refused, saying
    that the list is re-read on SIGHUP, until the coordinator gets one; then it is served."""
    made = subprocess.run([a.coordinator, "--add-client", "carol"], capture_output=True, text=True, timeout=10)
    carol = os.path.join(work, "keys", "clients", "carol")
    before = jobctl("--keys", carol, "--retries", "1", "list")
    daemon.proc.send_signal(signal.SIGHUP)
    after = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(jobctl("--keys", carol, "list")), 10,
                     "carol's key to be served after the SIGHUP")
    print("new key before the SIGHUP:", before.stderr.strip().replace("\n", " "))
    return (made.returncode == 0 and "kill -HUP" in made.stdout and before.returncode == 2 and
            "SIGHUP" in before.stderr and after.returncode == 0 and daemon.proc.poll() is None)


def make_read_only(path):
    """chmod is not enough for root, who ignores it: use the immutable attribute then."""
    os.chmod(path, 0o444)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", path], check=True)


def undo_read_only(path):
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", path], check=True)
    os.chmod(path, 0o644)


def startup_checks(a, work, checks):
    def start(*extra):
        return subprocess.run([a.coordinator, "--listen", f"tcp://127.0.0.1:{free_port()}", *extra],
                              capture_output=True, text=True, timeout=10)

    blocker = os.path.join(work, "a-file")
    open(blocker, "w").write("not a folder\n")
    bad_runs = start("--state", os.path.join(work, "ok.db"), "--runs", os.path.join(blocker, "runs"))
    print("unusable --runs:", bad_runs.stderr.strip())
    checks["a --runs folder that cannot be made is exit 2 at start"] = (
        bad_runs.returncode == 2 and "--runs" in bad_runs.stderr and "cannot be used" in bad_runs.stderr)
    read_only = os.path.join(work, "read-only.db")
    sqlite3.connect(read_only).execute("PRAGMA user_version = 7").connection.commit()
    make_read_only(read_only)
    try:
        refused = start("--state", read_only, "--runs", os.path.join(work, "runs"))
    finally:
        undo_read_only(read_only)
    print("read-only state:", refused.stderr.strip())
    checks["a read-only state database is exit 2 at start"] = (
        refused.returncode == 2 and "cannot be written" in refused.stderr and read_only in refused.stderr)


def sweep_check(a, work, endpoint, port, jobctl, checks):
    state = os.path.join(work, "sweep.db")
    daemon = Daemon(a.coordinator, state, port)
    job = os.path.join(SOURCE_DIR, "configs", "jobs", "langid_tiny.yaml")
    job_id = json.loads(jobctl("--json", "submit", job).stdout)["job_id"]
    daemon.kill(signal.SIGTERM)
    with sqlite3.connect(state) as db:  # what a kill between two writes of an attempt used to leave
        db.execute("UPDATE jobs SET state = 'RUNNING', attempts = 1 WHERE id = ?", (job_id,))
    daemon = Daemon(a.coordinator, state, port)
    status = json.loads(jobctl("--json", "status", str(job_id)).stdout)
    daemon.kill(signal.SIGTERM)
    print("swept:", status["state"], status["events"][-1])
    checks["RUNNING without an open attempt is requeued at start"] = (
        status["state"] == "QUEUED" and "without an open attempt" in status["events"][-1])


def submission_caps(a, work, endpoint, port, jobctl, listing, checks):
    daemon = Daemon(a.coordinator, os.path.join(work, "caps.db"), port)
    huge = os.path.join(work, "huge.yaml")
    with open(huge, "w") as f:
        f.write("name: huge\ndata:\n  train:\n")
        f.write("    - x\n" * (4 << 20 >> 3))  # 4 MiB: under the message cap, over the submission cap
    many = os.path.join(work, "many.yaml")
    with open(many, "w") as f:
        f.write("name: many\nmodel:\n  preset: [" + ",".join(["1"] * 50000) + "]\n")  # 100 kB, 50,000 nodes
    start = time.time()
    too_big, too_many = jobctl("submit", huge), jobctl("submit", many)
    elapsed = time.time() - start
    print("huge:", too_big.stderr.strip()[:160])
    print("many nodes:", too_many.stderr.strip()[:160], f"({elapsed:.2f} s for both)")
    checks["an oversized job file is refused with its size"] = (
        too_big.returncode == 2 and "bytes; at most 1048576 are accepted" in too_big.stderr)
    checks["a job file with too many YAML nodes is refused before parsing"] = (
        too_many.returncode == 2 and "more than 10000 YAML nodes" in too_many.stderr and elapsed < 10)
    checks["refused submissions write no row"] = listing() == []
    daemon.kill(signal.SIGTERM)


def submit_checks(a, work, endpoint, port, jobctl, checks):
    """jobctl for scripts: overrides at submission, ${VAR} expanded on the submitter's side,
    flags after the subcommand, the coordinator from $TRAINYARD_COORDINATOR, and
    submit --wait ending with the job. The coordinator answers listings two jobs a page,
    so the three-job listings below are walked page by page."""
    daemon = Daemon(a.coordinator, os.path.join(work, "scripts.db"), port, "--list-page", "2")  # listings page
    job = os.path.join(work, "vars.yaml")
    open(job, "w").write(open(os.path.join(SOURCE_DIR, "configs", "jobs", "langid_tiny.yaml")).read()
                         .replace("../../data", "${DATA_ROOT}").replace("name: langid_tiny", "name: ${JOB_NAME:-plain}"))
    env = dict(os.environ, DATA_ROOT=os.path.join(SOURCE_DIR, "data"), TRAINYARD_COORDINATOR=endpoint)
    env.pop("JOB_NAME", None)

    def run(*args, environment=env):
        return subprocess.run([a.jobctl, "--timeout", "2", *args], capture_output=True, text=True, timeout=30,
                              env=environment)
    submitted = run("submit", job, "--json", "--set", "train.epochs=1", "--ranks", "3", "--priority", "7",
                    "--name", "renamed")
    print("submit with overrides, flags after the subcommand, $TRAINYARD_COORDINATOR:", submitted.stdout.strip(),
          submitted.stderr.strip())
    status = json.loads(run("status", str(json.loads(submitted.stdout)["job_id"]), "--json").stdout) \
        if submitted.returncode == 0 else {}
    checks["submit --set/--ranks/--priority/--name reach the stored job"] = (
        {k: status.get(k) for k in ("name", "ranks", "priority")} == {"name": "renamed", "ranks": 3, "priority": 7})
    plain = run("submit", job, "--json")
    plain_status = json.loads(run("status", str(json.loads(plain.stdout)["job_id"]), "--json").stdout) \
        if plain.returncode == 0 else {}
    checks["${VAR} and ${VAR:-default} are expanded by jobctl from its own environment"] = (
        plain_status.get("name") == "plain")
    unset = run("submit", job, environment={k: v for k, v in env.items() if k != "DATA_ROOT"})
    bad = run("submit", job, "--set", "train.epochs=many")
    search = run("submit", os.path.join(SOURCE_DIR, "configs", "jobs", "langid_search.yaml"), "--set", "train.lr=1")
    print("unset variable:", unset.stderr.strip(), "| bad --set:", bad.stderr.strip(), "| search:", search.stderr.strip())
    checks["an unset variable, a bad --set value and --set on a search are exit 2, no row"] = (
        unset.returncode == 2 and "${DATA_ROOT} is not set" in unset.stderr and
        bad.returncode == 2 and "--set train.epochs=many: train.epochs: expected an integer" in bad.stderr and
        search.returncode == 2 and "apply to job files" in search.stderr and
        len(json.loads(run("list", "--json").stdout)) == 2)
    waiter = subprocess.Popen([a.jobctl, "submit", job, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    waited_id = int(waiter.stdout.readline())
    cancelled = run("cancel", str(waited_id))
    out, err = waiter.communicate(timeout=30)
    print("submit --wait, then cancelled:", waiter.returncode, err.strip())
    checks["submit --wait ends with the job: exit 1 and its state for a cancelled one"] = (
        cancelled.returncode == 0 and waiter.returncode == 1 and f"job {waited_id} CANCELLED" in err)
    filter_checks(run, [json.loads(submitted.stdout)["job_id"], json.loads(plain.stdout)["job_id"], waited_id],
                  checks)
    daemon.kill(signal.SIGTERM)


def filter_checks(run, ids, checks):
    """list's filters, newest first; cancel of several ids and of a user's jobs; event
    times. `ids`: a queued job named renamed, a queued one named plain, a cancelled one."""
    renamed, plain, cancelled = ids
    me = pwd.getpwuid(os.geteuid()).pw_name

    def listed(*args):
        r = run("list", "--json", *args)
        return [j["id"] for j in json.loads(r.stdout)] if r.returncode == 0 else r.stderr.strip()
    seen = {"all": listed(), "queued": listed("--state", "queued"), "queued,cancelled": listed("--state", "QUEUED,cancelled"),
            "--name renam": listed("--name", "renam"), "--limit 1": listed("--limit", "1"),
            "--user": listed("--user", me, "--state", "queued", "--limit", "1"), "nobody": listed("--user", "nobody")}
    print("list filters:", seen)
    checks["list filters by state, user and name, newest first, with a limit"] = seen == {
        "all": [cancelled, plain, renamed], "queued": [plain, renamed], "queued,cancelled": [cancelled, plain, renamed],
        "--name renam": [renamed], "--limit 1": [cancelled], "--user": [plain], "nobody": []}
    bad = run("list", "--state", "sleeping")
    unchosen = run("cancel", "--state", "queued")
    both = run("cancel", str(plain), "--user", me)
    print("bad filters:", bad.stderr.strip(), "|", unchosen.stderr.strip(), "|", both.stderr.strip())
    checks["an unknown state, cancel --state without --user, and ids with filters are exit 2"] = (
        bad.returncode == 2 and "--state 'sleeping': expected queued, running" in bad.stderr and
        unchosen.returncode == 2 and
        "need --user" in unchosen.stderr and both.returncode == 2 and listed("--state", "queued") == [plain, renamed])
    by_user = run("cancel", "--json", "--user", me, "--name", "renam")
    several = run("cancel", "--json", str(plain), "999")
    by_user_ids = [j["id"] for j in json.loads(by_user.stdout)] if by_user.returncode == 0 else by_user.stderr
    several_out = json.loads(several.stdout) if several.stdout.strip() else []
    print("cancel --user --name:", by_user_ids, "| cancel 2 ids, one unknown:", several.returncode,
          [(j["id"], j["state"]) for j in several_out], several.stderr.strip())
    checks["cancel takes a user's jobs by filter, and several ids: the known one is cancelled, exit 2"] = (
        by_user_ids == [renamed] and several.returncode == 2 and
        [(j["id"], j["state"]) for j in several_out] == [(plain, "CANCELLED")] and "job 999: no job 999" in several.stderr
        and listed("--state", "queued") == [])
    status = json.loads(run("status", "--json", str(plain)).stdout)
    times = status.get("event_times", [])
    print("status events with times:", list(zip(times, status["events"])))
    checks["status gives each event's time"] = (
        len(times) == len(status["events"]) >= 2 and times == sorted(times) and abs(times[-1] - time.time()) < 60)


def jobctl_checks(a, work, endpoint, port, jobctl, checks):
    bad = {"nan timeout": ["--timeout", "nan", "list"], "negative timeout": ["--timeout", "-1", "list"],
           "job id 0": ["status", "0"], "zero retries": ["--retries", "0", "list"]}
    codes = {name: subprocess.run([a.jobctl, "--coordinator", endpoint, *args], capture_output=True, text=True,
                                  timeout=10).returncode for name, args in bad.items()}
    print("bad jobctl options:", codes)
    checks["jobctl refuses bad options with exit 2"] = set(codes.values()) == {2}

    state = os.path.join(work, "small.db")
    # Room for the example job, not for the example padded with 15,000 bytes.
    daemon = Daemon(a.coordinator, state, port, "--max-message-bytes", "16384")
    job = os.path.join(SOURCE_DIR, "configs", "jobs", "langid_tiny.yaml")
    # A job goes as it will run (comments dropped): the padding is a value, set at submission.
    too_large = jobctl("submit", job, "--set", "data.text_field=" + "x" * 15000)
    print("oversized request:", too_large.stderr.strip().splitlines()[-1])
    checks["an oversized request is refused naming the coordinator's --max-message-bytes"] = (
        too_large.returncode == 2 and "is over the coordinator's 16384 (--max-message-bytes)" in too_large.stderr)
    job_id = json.loads(jobctl("--json", "submit", job).stdout)["job_id"]
    daemon.kill(signal.SIGTERM)
    with sqlite3.connect(state) as db:
        db.execute("UPDATE jobs SET state = 'FAILED', reason = 'rank 1 of world w failed: boom' WHERE id = ?",
                   (job_id,))
    daemon = Daemon(a.coordinator, state, port)
    follow = jobctl("logs", "-f", str(job_id))
    print("logs -f of a failed job:", follow.returncode, follow.stderr.strip())
    checks["logs -f of a failed job ends with its state, exit 1"] = (
        follow.returncode == 1 and f"job {job_id} FAILED: rank 1 of world w failed: boom" in follow.stderr)
    daemon.kill(signal.SIGTERM)


def test(a, work):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    checks = {}

    def jobctl(*args, timeout=30):
        return subprocess.run([a.jobctl, "--coordinator", endpoint, "--timeout", "2", *args],
                              capture_output=True, text=True, timeout=timeout)

    def listing():
        r = jobctl("--json", "list")
        check(r.returncode == 0, r.stderr)
        return json.loads(r.stdout)

    os.environ["TRAINYARD_KEYS"] = os.path.join(work, "keys")  # for every coordinator and jobctl below
    init = subprocess.run([a.coordinator, "--init"], capture_output=True, text=True, timeout=10)
    again = subprocess.run([a.coordinator, "--init"], capture_output=True, text=True, timeout=10)
    modes = {name: oct(os.stat(os.path.join(work, "keys", name)).st_mode & 0o777)
             for name in ("coordinator.key", "worker.key", "client.key", "coordinator.pub")}
    print("keys:", modes, "| again:", again.stderr.strip())
    checks["coordinator --init makes 0600 secrets and never overwrites them"] = (
        init.returncode == 0 and again.returncode == 2 and "never overwritten" in again.stderr and
        modes == {"coordinator.key": "0o600", "worker.key": "0o600", "client.key": "0o600",
                  "coordinator.pub": "0o644"})
    state = os.path.join(work, "state.db")
    daemon = Daemon(a.coordinator, state, port)
    job = os.path.join(SOURCE_DIR, "configs", "jobs", "langid_tiny.yaml")
    first = jobctl("submit", job, "--key", "same-key")
    again = jobctl("submit", job, "--key", "same-key")
    checks["duplicate key makes one job"] = (first.stdout == again.stdout and len(listing()) == 1)
    auth_checks(a, work, jobctl, listing, checks, daemon)

    bad = os.path.join(work, "bad.yaml")
    text = open(job).read().replace("../../data", os.path.join(SOURCE_DIR, "data"))
    open(bad, "w").write(text.replace("  preset: tiny", "  presett: tiny"))
    rejected = jobctl("submit", bad)
    print("bad job:", rejected.stderr.strip())
    checks["bad job rejected with file:line, no row"] = (
        rejected.returncode == 2 and f"{bad}:" in rejected.stderr and "model.presett: unknown key" in rejected.stderr
        and len(listing()) == 1)
    malformed = os.path.join(work, "malformed.yaml")
    open(malformed, "w").write("name: [unclosed\n")
    checks["malformed job rejected"] = jobctl("submit", malformed).returncode == 2 and len(listing()) == 1

    for name in ("benchmark_grid.yaml", "train_step_bench.yaml"):
        jobctl("submit", os.path.join(SOURCE_DIR, "configs", "jobs", name))
    cancelled = jobctl("--json", "cancel", "2")
    checks["cancel a queued job"] = json.loads(cancelled.stdout)["state"] == "CANCELLED"
    before = listing()
    daemon.kill(signal.SIGKILL)
    time.sleep(1.0)
    daemon = Daemon(a.coordinator, state, port)
    after = listing()
    print("queue before kill -9:", [(j["id"], j["name"], j["state"]) for j in before])
    print("queue after restart: ", [(j["id"], j["name"], j["state"]) for j in after])
    # "waiting" is the scheduler's live explanation, not stored state: a restarted
    # coordinator says "not yet considered" until its first pass, which may come after
    # this listing.
    def stored(jobs):
        return [{k: v for k, v in j.items() if k != "waiting"} for j in jobs]
    checks["queue identical after kill -9 and restart"] = stored(before) == stored(after) and len(after) == 3
    daemon.kill(signal.SIGTERM)

    start = time.time()
    lost = subprocess.run([a.jobctl, "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3",
                           "--retries", "2", "list"], capture_output=True, text=True, timeout=30)
    print("unreachable:", lost.stderr.strip().splitlines()[-1], f"({time.time() - start:.1f} s)")
    checks["unreachable coordinator is a clear error"] = (lost.returncode == 1 and "did not answer" in lost.stderr
                                                         and time.time() - start < 5)
    malformed = subprocess.run([a.jobctl, "--coordinator", "127.0.0.1:5555", "list"], capture_output=True,
                               text=True, timeout=30)
    checks["a malformed endpoint is bad input"] = (malformed.returncode == 2 and
                                                   "not a usable ZeroMQ endpoint" in malformed.stderr)

    corrupt = os.path.join(work, "corrupt.db")
    open(corrupt, "wb").write(b"x" * 8192)
    refused = subprocess.run([a.coordinator, "--listen", f"tcp://127.0.0.1:{free_port()}", "--state", corrupt],
                             capture_output=True, text=True, timeout=10)
    fresh = Daemon(a.coordinator, corrupt, port, "--fresh")
    time.sleep(0.3)
    checks["corrupt database refused unless --fresh"] = (
        refused.returncode == 2 and "corrupt" in refused.stderr and listing() == [])
    fresh.kill(signal.SIGTERM)

    startup_checks(a, work, checks)
    sweep_check(a, work, endpoint, port, jobctl, checks)
    submission_caps(a, work, endpoint, port, jobctl, listing, checks)
    jobctl_checks(a, work, endpoint, port, jobctl, checks)
    submit_checks(a, work, endpoint, port, jobctl, checks)

    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    check(all(checks.values()), f"failed: {[name for name, ok in checks.items() if not ok]}")


if __name__ == "__main__":
    run_test(test, ("--coordinator", "--jobctl"), __doc__)
