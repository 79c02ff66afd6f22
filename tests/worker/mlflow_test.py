#!/usr/bin/env python3
"""MLflow tracking against a real `mlflow server` (PyPI, SQLite backend, proxied artifact
store) started here on loopback, read back with MLflow's own Python client:

  - a 2-rank finetune job logs its job-file settings as params, every steps.jsonl number
    as train/<key> at its step, every epochs.csv number as epoch/<column>, the trained
    model folder as artifacts (byte for byte), and ends FINISHED;
  - resumed for more epochs, the job logs into the same run, and each epoch appears once;
  - a tracking server that accepts connections but never answers costs a warning, not
    the job: it finishes, within the bounded flush time of its end;
  - a tracking URI that is not http(s) is refused at validation, exit 2, naming the field."""
import csv
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import MPI_ENV, free_port, job_yaml, subset_tsv, write  # noqa: E402

READER = r"""
import json, sys
from mlflow.tracking import MlflowClient
uri, experiment, out_dir = sys.argv[1:4]
client = MlflowClient(tracking_uri=uri)
exp = client.get_experiment_by_name(experiment)
runs = client.search_runs([exp.experiment_id])
result = []
for run in runs:
    metrics = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
               for key in run.data.metrics}
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "model")]
    local = client.download_artifacts(run.info.run_id, "model", out_dir)
    result.append({"run_id": run.info.run_id, "status": run.info.status, "name": run.info.run_name,
                   "params": run.data.params, "metrics": metrics, "artifacts": artifacts, "local": local})
print(json.dumps(result))
"""


class MlflowServer:
    def __init__(self, python, work):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        mlflow = os.path.join(os.path.dirname(python), "mlflow")
        self.log = open(os.path.join(work, "mlflow.log"), "w")
        self.process = subprocess.Popen(
            [mlflow, "server", "--backend-store-uri", f"sqlite:///{work}/mlflow.db",
             "--artifacts-destination", os.path.join(work, "mlartifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server did not start; see {self.log.name}")

    def stop(self):
        os.killpg(self.process.pid, 15)
        self.process.wait(timeout=30)


class SilentServer:
    """Accepts TCP connections and never answers: a tracking server that hangs."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.uri = f"http://127.0.0.1:{self.socket.getsockname()[1]}"


def job_file(work, name, epochs, mlflow_uri, resume="auto"):
    train = os.path.join(work, "train_480.tsv")
    if not os.path.exists(train):
        subset_tsv(work, 480)
    extra = f"""train: {{epochs: {epochs}, batch_size: 16}}
checkpoint: {{resume: {resume}}}
log:
  progress: false
  steps_every: 1
  mlflow: {{uri: "{mlflow_uri}", experiment: trainyard-test}}
"""
    text = job_yaml(name, train, "").replace("log:\n  progress: false\n  steps_every: 1\n", "") + extra
    return write(os.path.join(work, f"{name}_{epochs}.yaml"), text)


def run_job(worker, job, runs, ranks=2):
    start = time.time()
    r = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(ranks), worker, job,
                        "--runs-dir", runs], capture_output=True, text=True, env=MPI_ENV, timeout=600,
                       restore_signals=False)
    return r, time.time() - start


def read_runs(python, uri, out_dir):
    r = subprocess.run([python, "-c", READER, uri, "trainyard-test", out_dir], capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 0, r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_logged(run, run_dir, epochs):
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "steps.jsonl"))]
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == epochs, rows)
    for key in ("loss", "lr", "ms"):
        want = [(s["step"], float(s[key])) for s in steps]
        got = run["metrics"][f"train/{key}"]
        check([st for st, _ in got] == [st for st, _ in want], (key, got[:5], want[:5]))
        check(all(abs(g - w) <= 1e-9 * max(1, abs(w)) for (_, g), (_, w) in zip(got, want)), key)
    end_steps, total = [], 0
    for row in rows:
        total += int(row["steps"])
        end_steps.append(total)
    for column in ("train_loss", "eval_loss", "eval_acc", "ms_per_step", "forward_ms_med"):
        got = run["metrics"][f"epoch/{column}"]
        check([st for st, _ in got] == end_steps, (column, got, end_steps))
        check([v for _, v in got] == [float(r[column]) for r in rows], (column, got, rows))


def test(a, work):
    check(os.path.exists(a.mlflow_python), f"no MLflow venv at {a.mlflow_python}: run scripts/setup.sh")
    server = MlflowServer(a.mlflow_python, work)
    try:
        runs = os.path.join(work, "runs")
        # A 2-rank job, then the same job resumed for one more epoch.
        r, _ = run_job(a.worker, job_file(work, "tracked", 2, server.uri), runs)
        check(r.returncode == 0, r.stderr[-3000:])
        first = read_runs(a.mlflow_python, server.uri, os.path.join(work, "download1"))
        check(len(first) == 1 and first[0]["status"] == "FINISHED", first)
        run = first[0]
        check(run["name"] == "tracked", f"the run's name: {run['name']}")
        params = run["params"]
        check(params["train.epochs"] == "2" and params["ranks"] == "2" and params["model.preset"] == "tiny", params)
        check(params["global_batch"] == "32" and params["data.max_seq_len"] == "64", params)
        check(not any(k.startswith("log.mlflow") for k in params), params)
        run_dir = os.path.join(runs, "tracked")
        check_logged(run, run_dir, 2)
        model = os.path.join(run_dir, "model")
        uploaded = {os.path.basename(p) for p in run["artifacts"]}
        check(uploaded == set(os.listdir(model)), (uploaded, os.listdir(model)))
        for name in os.listdir(model):
            check(sha256(os.path.join(model, name)) == sha256(os.path.join(run["local"], name)), name)
        saved = json.load(open(os.path.join(run_dir, "mlflow_run.json")))
        check(saved["run_id"] == run["run_id"], saved)

        r, _ = run_job(a.worker, job_file(work, "tracked", 3, server.uri), runs)
        check(r.returncode == 0, r.stderr[-3000:])
        resumed = read_runs(a.mlflow_python, server.uri, os.path.join(work, "download2"))
        check([x["run_id"] for x in resumed] == [run["run_id"]], "a resumed job logs into the same run")
        check_logged(resumed[0], run_dir, 3)
        print("logged and resumed: params, step and epoch metrics equal steps.jsonl and epochs.csv; "
              f"{len(uploaded)} model files uploaded byte for byte")

        # Unreachable tracking: a warning, and the job finishes.
        baseline_r, baseline_s = run_job(a.worker, job_file(work, "untracked", 2, server.uri, "none"), runs, 1)
        check(baseline_r.returncode == 0, baseline_r.stderr[-3000:])
        silent = SilentServer()
        r, took = run_job(a.worker, job_file(work, "hung", 2, silent.uri, "none"), runs, 1)
        check(r.returncode == 0, r.stderr[-3000:])
        output = r.stdout + r.stderr
        check("mlflow: cannot" in output and "training goes on" in output, output[-3000:])
        check("were not sent" in output, output[-3000:])
        check(took < baseline_s + 10 + 20, f"{took:.1f} s against {baseline_s:.1f} s without a hung server")
        check(os.path.exists(os.path.join(runs, "hung", "model", "model.safetensors")),
          "the job with a hung tracking server saved its model")
        print(f"a hung tracking server: the job finished in {took:.1f} s (tracked normally: {baseline_s:.1f} s)")

        # A URI that is not http(s): refused before anything runs.
        bad = job_file(work, "bad_uri", 1, "file:///tmp/mlruns")
        r = subprocess.run([a.worker, bad, "--runs-dir", runs], capture_output=True, text=True, timeout=120)
        check(r.returncode == 2 and "log.mlflow.uri" in r.stderr and "http://HOST" in r.stderr,
              (r.returncode, r.stderr))
    finally:
        server.stop()


def options(p):
    p.add_argument("--mlflow-python", required=True, help="python of the venv holding mlflow (scripts/setup.sh)")


if __name__ == "__main__":
    run_test(test, description=__doc__, options=options)
