#!/usr/bin/env python3
"""The Python client (python/, import trainyard) against a real coordinator and a pool of
two mpirun agents, with named users' keys (coordinator --add-client).

It is installed as a user installs it (pip install ./python, which describes the wire
with protoc at build time), then: a job file submitted with overrides and a name, its
epoch rows followed to its end and equal to `jobctl logs --json`'s, its status equal to
`jobctl status --json`'s, its metric in a filtered listing; a job given as a dict queued
behind it and cancelled by its owner; another user's cancel refused (code 2) with the job
unaffected; the job's ranks' output the same from the client, `jobctl logs --output` (whole, as
JSON, and one rank's) and its attempt's output.log, and streamed by `jobctl submit --follow`; its files listed and its model fetched (whole, resumed,
by the client) by its owner only; an unset ${VAR} refused before anything is sent; a key not on the allowlist
refused at once; an unreachable coordinator a clear error after its tries."""
import json
import os
import shutil
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, run_test  # noqa: E402
from harness.e2e import free_port  # noqa: E402
from harness.pool import POOL_FLAGS, Cluster, on_cluster, write_job  # noqa: E402


def install(work):
    """pip install of a copy of python/ (the build writes beside its sources) into a
    folder of its own; returns the imported package."""
    source = shutil.copytree(os.path.join(SOURCE_DIR, "python"), os.path.join(work, "python"),
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "wire.desc", "_protocol.py"))
    site = os.path.join(work, "site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", site, source], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TRAINYARD_PROTO_DIR=os.path.join(SOURCE_DIR, "proto")))
    check(r.returncode == 0, f"pip install ./python failed:\n{r.stdout}\n{r.stderr}")
    sys.path.insert(0, site)
    import trainyard
    check(trainyard.__file__.startswith(site), f"imported {trainyard.__file__}, not the installed package")
    return trainyard


class UsersCluster(Cluster):
    """A Cluster whose key folder also holds keys for alice and bob (users), and whose
    coordinator answers listings a job at a time, so that every list() walks pages."""

    coordinator_flags = ("--list-page", "1")

    def __init__(self, args, work):
        super().__init__(args, work)
        for user in ("alice", "bob"):
            subprocess.run([args.coordinator, "--keys", self.keys, "--add-client", user, "--client-role", "user"],
                           check=True, capture_output=True)

    def user_keys(self, user):
        return os.path.join(self.keys, "clients", user)

    def jobctl_as(self, user, *args, json_output=True):
        r = subprocess.run([self.args.jobctl, "--coordinator", self.endpoint, "--keys", self.user_keys(user),
                            *(["--json"] if json_output else []), *args], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"jobctl {' '.join(args)}: {r.stderr}")
        return r.stdout


def output_checks(c, alice, job):
    """Note [Job output]: the ranks' lines of attempt 1, as the client, jobctl and the
    file in the runs folder give them."""
    lines = list(alice.output(job))
    print(f"job {job}: {len(lines)} output line(s), e.g. {lines[:3]}")
    check(any(line.startswith("[rank 0] ") and "done: " in line for line in lines) and
          any(line.startswith("[rank 1] ") and "planted an inf in rank 1's gradients" in line for line in lines),
          f"both ranks' lines, prefixed: {lines}")
    check(not any("\x1b" in line or "\r" in line for line in lines), "escapes or carriage returns kept")
    with open(os.path.join(c.runs, str(job), "attempt-1", "output.log"), encoding="utf-8") as f:
        check(f.read() == "".join(line + "\n" for line in lines), "output.log differs from what the client read")
    text = c.jobctl_as("alice", "logs", str(job), "--output", json_output=False)
    check(text.splitlines() == lines, "jobctl logs --output differs from the client's")
    objects = [json.loads(line) for line in c.jobctl_as("alice", "logs", str(job), "--output").splitlines()]
    rendered = [(f"[rank {o['rank']}] " if o["rank"] is not None else "") + o["line"] for o in objects]
    check(rendered == lines and {o["attempt"] for o in objects} == {1}, objects[:3])
    rank1 = c.jobctl_as("alice", "logs", str(job), "--output", "--attempt", "1", "--rank", "1",
                        json_output=False).splitlines()
    check(rank1 == [line for line in lines if not line.startswith("[rank ") or line.startswith("[rank 1] ")],
          rank1)
    check(list(alice.output(job, rank=1)) == rank1, "the client's rank=1 differs from jobctl's --rank 1")


def artifact_checks(trainyard, c, alice, bob, job, work):
    """Note [Artifacts]: the job's files, listed by the client and jobctl alike, and its
    model fetched in chunks, whole, resumed from a broken-off copy, and by the client;
    another user and a path out of the job's folder refused."""
    listing = alice.artifacts(job)
    by_path = {f["path"]: f for f in listing["files"]}
    model = os.path.join(c.runs, str(job), "from-python", "model", "model.safetensors")
    print(f"job {job}: {len(listing['files'])} file(s), e.g. {sorted(by_path)[:4]}; unreachable "
          f"{listing['unreachable']}")
    check("from-python/model/model.safetensors" in by_path and "attempt-1/output.log" in by_path and
          by_path["from-python/model/model.safetensors"]["size"] == os.path.getsize(model) > (1 << 20), by_path)
    check(json.loads(c.jobctl_as("alice", "artifacts", str(job))) == listing, "jobctl artifacts --json differs")
    with open(model, "rb") as f:
        whole = f.read()
    for name, partial in (("whole", b""), ("resumed", whole[:1000])):
        folder = os.path.join(work, f"fetched_{name}")
        os.makedirs(folder)
        if partial:
            with open(os.path.join(folder, "model.safetensors.part"), "wb") as f:
                f.write(partial)
        said = json.loads(c.jobctl_as("alice", "fetch", str(job), "from-python/model/model.safetensors", "--to",
                                      folder))
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            check(f.read() == whole and said["resumed_at"] == len(partial), (name, said))
    fetched = alice.fetch(job, "from-python/model/model.safetensors", to=os.path.join(work, "fetched_whole"))
    with open(fetched, "rb") as f:
        check(f.read() == whole, "the client's fetch differs from the model")
    outside = subprocess.run([c.args.jobctl, "--coordinator", c.endpoint, "--keys", c.user_keys("alice"), "fetch",
                              str(job), "../state.db", "--host", listing["files"][0]["host"]],
                             capture_output=True, text=True, timeout=60)
    check(outside.returncode == 2 and "not a file's place beneath the job's folder" in outside.stderr,
          (outside.returncode, outside.stderr))
    try:
        bob.artifacts(job)
        check(False, "bob listed alice's job's files")
    except trainyard.Refused as e:
        check(e.code == 2 and "belongs to alice" in str(e), str(e))


def follow_check(c, path):
    """submit --follow of a job file named relative to jobctl's folder (not the agents'):
    the job's id, then its output as it comes, then its end."""
    r = subprocess.run([c.args.jobctl, "--coordinator", c.endpoint, "--keys", c.user_keys("alice"), "submit",
                        os.path.basename(path), "--set", "train.epochs=1", "--name", "followed", "--follow"],
                       capture_output=True, text=True, timeout=120, cwd=os.path.dirname(path))
    out = r.stdout.splitlines()
    print("submit --follow:", r.returncode, out[:2], "...", r.stderr.strip())
    check(r.returncode == 0 and out and out[0].isdigit() and f"job {out[0]} SUCCEEDED" in r.stderr and
          any(line.startswith("[rank 0] ") and "done: " in line for line in out[1:]), (r.returncode, out, r.stderr))


def refusals(trainyard, c, work, alice, queued_before):
    """What must be refused before anything is sent or changed."""
    os.environ.pop("CLIENT_TEST_UNSET", None)
    unset = os.path.join(work, "unset.yaml")
    with open(unset, "w") as f:
        f.write("name: ${CLIENT_TEST_UNSET}\n")
    try:
        alice.submit(unset)
        check(False, "a job file with an unset ${VAR} was submitted")
    except trainyard.JobFileError as e:
        print("unset variable:", e)
        check("${CLIENT_TEST_UNSET} is not set" in str(e), str(e))
    check(len(alice.list()) == queued_before, "a refused submission left a job behind")

    stranger = os.path.join(work, "stranger")
    subprocess.run([c.args.coordinator, "--init", "--keys", stranger], check=True, capture_output=True)
    shutil.copy(os.path.join(c.keys, "coordinator.pub"), stranger)  # the right coordinator, a foreign key
    start = time.time()
    try:
        trainyard.Client(c.endpoint, keys=stranger, timeout=5).list()
        check(False, "a key not on clients.allow was served")
    except trainyard.Refused as e:
        print(f"foreign key ({time.time() - start:.1f} s):", e)
        check(e.code == 2 and "refused this client key" in str(e) and time.time() - start < 5, (e.code, str(e)))

    start = time.time()
    try:
        trainyard.Client(f"tcp://127.0.0.1:{free_port()}", keys=c.user_keys("alice"), timeout=0.3, retries=2).list()
        check(False, "a coordinator that is not there answered")
    except trainyard.Unreachable as e:
        print(f"unreachable ({time.time() - start:.1f} s):", e)
        check("did not answer after 2 tries" in str(e) and time.time() - start < 5, str(e))


def client_case(c, work, trainyard):
    c.start(2)
    alice = trainyard.Client(c.endpoint, keys=c.user_keys("alice"), timeout=3)
    bob = trainyard.Client(c.endpoint, keys=c.user_keys("bob"), timeout=3)
    path = write_job(work, "python_job", epochs=3)
    # Rank 1 says one line of its own: an inf planted in its gradients, which the loss
    # scaler skips (the step is not taken; the job goes on).
    job = alice.submit(path, overrides={"train.epochs": 1, "debug.force_loss_scaling": True,
                                        "debug.plant_inf_step": 3, "debug.plant_inf_rank": 1}, name="from-python")
    with open(path) as f:
        as_dict = dict(yaml.safe_load(f), name="as-a-dict")
    behind = alice.submit(as_dict)
    refused = None
    try:
        bob.cancel(job)
    except trainyard.Refused as e:
        refused = e
    print("bob's cancel of alice's job:", refused.code if refused else None, refused)
    check(refused is not None and refused.code == 2 and "belongs to alice" in str(refused), str(refused))
    cancelled = alice.cancel(behind)
    check(cancelled["state"] == "CANCELLED" and cancelled["user"] == "alice", cancelled)

    rows = list(alice.logs(job, follow=True))
    final = alice.wait(job, timeout=60)
    print(f"job {job}: {final['state']}, {len(rows)} epoch row(s) followed; metric {final.get('metric')} "
          f"{final.get('metric_value')}")
    check(final["state"] == "SUCCEEDED" and final["name"] == "from-python", final)
    check([r["epoch"] for r in rows] == [1], f"train.epochs: 1 set at submission: {rows}")
    by_jobctl = [json.loads(line) for line in c.jobctl_as("alice", "logs", str(job)).splitlines()]
    check(rows == by_jobctl, (rows, by_jobctl))
    check(alice.status(job) == json.loads(c.jobctl_as("alice", "status", str(job))),
          "the client's status differs from jobctl status --json's")
    listed = alice.list(state="succeeded", user="alice", name="python")
    check([j["id"] for j in listed] == [job], listed)
    check(listed[0].get("metric") == "eval_acc" and listed[0]["metric_value"] == rows[-1]["eval_acc"], listed)
    check([j["id"] for j in alice.list(state=["cancelled"], limit=1)] == [behind], alice.list())
    every = [j["id"] for j in alice.list()]
    check(len(every) >= 2 and every == [j["id"] for j in json.loads(c.jobctl_as("alice", "list"))] ==
          sorted(every, reverse=True), f"paged listings: the client's {every}, jobctl's differ or repeat")
    output_checks(c, alice, job)
    artifact_checks(trainyard, c, alice, bob, job, work)
    follow_check(c, path)
    refusals(trainyard, c, work, alice, len(alice.list()))


def test(args, work):
    trainyard = install(work)
    on_cluster(lambda c, w: client_case(c, w, trainyard), make=UsersCluster)(args, work)


if __name__ == "__main__":
    run_test(test, POOL_FLAGS, __doc__)
