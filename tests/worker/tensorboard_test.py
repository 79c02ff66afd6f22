"""TensorBoard scalars of a fine-tune job, read back with TensorBoard's own reader.

A 2-rank job writes runs/<job>/tb/. Every record passes the reader's CRC checks
(PyRecordReader, which raises DataLossError on a bad length or payload CRC), and
EventAccumulator returns, for every number of every steps.jsonl line and epochs.csv row
and every metric of every evals.jsonl line, one scalar at the right step equal to the
file's value as float32, and nothing else. A
flipped payload byte is caught by the same reader. Rerunning the job fresh starts the
curves empty rather than appending to the old ones."""
import csv
import glob
import json
import os
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import MPI_ENV, job_yaml, subset_tsv, write  # noqa: E402


def records(path):
    """Every record's payload, through TensorBoard's CRC-checking reader."""
    reader = PyRecordReader_New(path)
    out = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(reader.record())


def expected_scalars(run_dir):
    """tag -> [(step, float32 value)] from steps.jsonl, evals.jsonl and epochs.csv."""
    want = {}
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        for line in f:
            step_line = json.loads(line)
            for key, value in step_line.items():
                if key in ("step", "epoch") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                want.setdefault("train/" + key, []).append((step_line["step"], np.float32(value)))
    with open(os.path.join(run_dir, "evals.jsonl")) as f:
        for line in f:
            evaluation = json.loads(line)
            split = evaluation["split"]
            for key, value in evaluation.items():
                if key.startswith(split + "_"):
                    want.setdefault(f"{split}/{key[len(split) + 1:]}", []).append((evaluation["step"], np.float32(value)))
    end_step = 0
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        for row in csv.DictReader(f):
            end_step += int(row["steps"])
            for column, cell in row.items():
                if column not in ("epoch", "slowest_host") and cell != "":
                    want.setdefault("epoch/" + column, []).append((end_step, np.float32(float(cell))))
    return want


def check_against_files(run_dir):
    files = glob.glob(os.path.join(run_dir, "tb", "events.out.tfevents.*"))
    check(len(files) == 1, files)
    payloads = records(files[0])
    want = expected_scalars(run_dir)
    acc = event_accumulator.EventAccumulator(os.path.join(run_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    got_tags = set(acc.Tags()["scalars"])
    check(got_tags == set(want), f"tags differ: extra {got_tags - set(want)}, missing {set(want) - got_tags}")
    for tag, points in want.items():
        got = [(e.step, np.float32(e.value)) for e in acc.Scalars(tag)]
        check(got == points, f"{tag}: {got[:5]} != {points[:5]}")
    for tag in ("epoch/eval_acc", "epoch/forward_ms_med", "epoch/forward_ms_max", "epoch/slowest_ms_per_step",
                "eval/loss", "eval/f1"):
        check(tag in want, tag)
    steps = sum(1 for line in open(os.path.join(run_dir, "steps.jsonl")))
    evals = sum(1 for line in open(os.path.join(run_dir, "evals.jsonl")))
    epochs = sum(1 for _ in open(os.path.join(run_dir, "epochs.csv"))) - 1
    # + the file-version event
    check(len(payloads) == 1 + steps + evals + epochs, (len(payloads), steps, evals, epochs))
    print(f"{len(want)} tags, {sum(len(p) for p in want.values())} scalars equal the files; "
          f"{len(payloads)} records pass the CRC checks")
    return files[0]


def check_flipped_byte_is_caught(path, folder):
    damaged = os.path.join(folder, "damaged.tfevents")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(damaged, "wb").write(data)
    try:
        records(damaged)
    except errors.DataLossError as e:
        print(f"a flipped byte is caught: {e}")
        return
    raise AssertionError("a flipped byte went unnoticed by TensorBoard's reader")


def test(a, folder):
    extra = "train: {epochs: 2, batch_size: 16, lr: 1.0e-3}\neval: {every_steps: 5}\n"
    job = write(os.path.join(folder, "tb.yaml"),
                job_yaml("tb", subset_tsv(folder, 480), extra).replace("steps_every: 1", "steps_every: 3"))
    runs = os.path.join(folder, "runs")
    cmd = [a.mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none", a.worker, job, "--runs-dir", runs,
           "--resume", "none"]
    for _ in range(2):  # the second, fresh run must replace the first one's curves
        proc = subprocess.run(cmd, capture_output=True, text=True, env=MPI_ENV, timeout=600)
        check(proc.returncode == 0, proc.stderr[-3000:])
        path = check_against_files(os.path.join(runs, "tb"))
    check_flipped_byte_is_caught(path, folder)


if __name__ == "__main__":
    run_test(test, ("--worker", "--mpirun"), __doc__)
