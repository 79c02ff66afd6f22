#!/usr/bin/env python3
"""Evaluations end to end (one rank, CPU, tiny BERT on langid): eval.every_steps, the
metrics, eval.test, checkpoint.best_metric and train.early_stopping.

  best            2 epochs of 75 steps, evaluated every 20 steps (--set eval.every_steps=20)
                  and at epoch ends, kept by eval_f1; its lr is a ${VAR:-default} of an unset
                  variable. runs/best/job.yaml is the job as it ran, both applied. evals.jsonl has one line per evaluation at steps 20, 40, 60, 75,
                  80, ..., 140, 150 (75 and 150 are epoch ends; 140 + ... none twice) and a
                  test line; the epoch rows' eval_acc are those evaluations'; summary.json's
                  best is the first strictly greatest eval_f1; its checkpoint is kept beside
                  the newest (keep: 1) and model/ holds its weights bit for bit. The test
                  line equals scikit-learn's metrics of the predictions an inference job
                  makes with model/ on the same split. A run sent SIGTERM mid-epoch and
                  resumed writes the same evaluations (runtime aside), the same best and the
                  same model/, bit for bit. model/ evaluated on the test split by 2 ranks (a
                  job that names no tokenizer, from a copy of model/ whose only tokenizer
                  file is the tokenizer.json HF saves for it) gives the same metrics (the
                  loss within 1e-12), and exports that vocabulary as vocab.txt.
  early_stopping  evaluated every 10 steps with patience 2, judged by eval_loss with the
                  direction inverted (greater_is_better: true), so that an early evaluation
                  stays the best and the run must stop inside epoch 1 once the loss falls:
                  the step it stops at and the best follow HF's EarlyStoppingCallback rule
                  replayed on evals.jsonl; model/ is the best evaluation's checkpoint's
                  weights, not the last step's; summary.json says why it stopped; a rerun
                  with resume: auto changes no file.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch
import yaml
from safetensors.torch import load_file
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score
from transformers import BertTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import LANGID, MPI_ENV, job_yaml, subset_tsv, tree_digest, weights, write  # noqa: E402

EXAMPLES, BATCH = 1200, 16  # 75 steps an epoch
TIMINGS = ("eval_runtime", "eval_samples_per_second", "test_runtime", "test_samples_per_second")


def read_lines(run_dir, name):
    with open(os.path.join(run_dir, name)) as f:
        return [json.loads(line) for line in f]


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def checkpoint_weights(run_dir, step):
    tensors = load_file(os.path.join(run_dir, "checkpoints", f"step-{step:09d}.safetensors"))
    return {name[len("model."):]: t for name, t in tensors.items() if name.startswith("model.")}


def same_weights(model, checkpoint):
    """model/'s tensors against a checkpoint's (the checkpoint names them as our modules
    do, model/ as HF does): every checkpoint tensor has an equal one in model/."""
    pool = [t for t in model.values()]
    return all(any(t.shape == m.shape and torch.equal(t, m) for m in pool) for t in checkpoint.values())


def run(worker, job, runs, *extra, **kw):
    return subprocess.run([worker, job, "--runs-dir", runs, *extra], capture_output=True, text=True, timeout=600,
                          **kw)


def sklearn_on_inference(worker, work, model_dir, test):
    """scikit-learn's metrics of the predictions our inference job makes with model/ on
    `test`, batched as the evaluation batches it (64 a batch, sorted by length)."""
    job = write(os.path.join(work, "predict.yaml"), f"""name: predict
kind: inference
data:
  labels: {os.path.join(LANGID, "labels.txt")}
  max_seq_len: 64
  tokenizer: {{vocab: {os.path.join(LANGID, "vocab.txt")}}}
model: {{init: {model_dir}}}
runtime: {{device: cpu, threads: 1}}
inference: {{input: {test}, batch_size: 64, sort_by_length: "true"}}
log: {{progress: false}}
""")
    result = run(worker, job, os.path.join(work, "predict_runs"))
    check(result.returncode == 0, f"the inference job failed:\n{result.stderr[-3000:]}")
    with open(os.path.join(work, "predict_runs", "predict", "predictions.tsv")) as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    gold, predicted = [r["gold"] for r in rows], [r["predicted"] for r in rows]
    return {"test_accuracy": accuracy_score(gold, predicted),
            "test_f1": f1_score(gold, predicted, average="macro"),
            "test_precision": precision_score(gold, predicted, average="macro", zero_division=0),
            "test_recall": recall_score(gold, predicted, average="macro", zero_division=0)}


def best_case(args, work):
    train, test = subset_tsv(work, EXAMPLES), subset_tsv(work, 750, split="test")
    # The learning rate comes from the environment, eval.every_steps from the command line.
    extra = f"""train: {{epochs: 2, batch_size: {BATCH}, lr: '${{TY_EVAL_TEST_UNSET:-1.0e-3}}'}}
eval: {{test: {test}}}
checkpoint: {{best_metric: eval_f1, keep: 1, resume: auto}}
"""
    job = write(os.path.join(work, "best.yaml"), job_yaml("best", train, extra))
    straight = run(args.worker, job, os.path.join(work, "straight"), "--set", "eval.every_steps=20")
    check(straight.returncode == 0, f"the run failed:\n{straight.stdout[-2000:]}\n{straight.stderr[-3000:]}")
    run_dir = os.path.join(work, "straight", "best")
    with open(os.path.join(run_dir, "job.yaml")) as f:
        ran = yaml.safe_load(f)
    check(ran["eval"]["every_steps"] == 20 and float(ran["train"]["lr"]) == 1e-3 and
          ran["log"]["runs_dir"] == os.path.join(work, "straight"),
          f"job.yaml is the job as it ran: eval {ran['eval']}, train {ran['train']}")
    lines = read_lines(run_dir, "evals.jsonl")
    evals = [l for l in lines if l["split"] == "eval"]
    check([l["step"] for l in evals] == [20, 40, 60, 75, 80, 100, 120, 140, 150],
          f"evaluations at steps {[l['step'] for l in evals]}")
    check(all({"eval_loss", "eval_accuracy", "eval_f1", "eval_precision", "eval_recall"} <= set(l) for l in evals),
          "each evaluation has the loss and the four metrics")
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        rows = list(csv.DictReader(f))
    at_ends = [f"{l['eval_accuracy']:.6f}" for l in evals if l["step"] in (75, 150)]
    check([r["eval_acc"] for r in rows] == at_ends, f"epoch rows' eval_acc {[r['eval_acc'] for r in rows]} "
          f"are the epoch ends' evaluations {at_ends}")
    best = None
    for l in evals:  # the first strictly greatest
        if best is None or l["eval_f1"] > best["eval_f1"]:
            best = l
    got = summary(run_dir).get("best", {})
    check(got.get("step") == best["step"] and got.get("value") == best["eval_f1"] and
          got.get("metric") == "eval_f1", f"summary's best {got} is step {best['step']}'s eval_f1")
    kept = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    wanted = sorted({f"step-{best['step']:09d}.safetensors", "step-000000150.safetensors"})
    check(kept == wanted, f"checkpoints kept: {kept}")
    check(same_weights(weights(run_dir), checkpoint_weights(run_dir, best["step"])),
          f"model/ holds step {best['step']}'s weights bit for bit"
          f"{' (the last step: the best was the last evaluation)' if best['step'] == 150 else ''}")
    test_line = [l for l in lines if l["split"] == "test"]
    reference = sklearn_on_inference(args.worker, work, os.path.join(run_dir, "model"), test)
    agree = len(test_line) == 1 and all(abs(test_line[0][k] - v) <= 4 * 2.0 ** -53 * max(1.0, abs(v))
                                        for k, v in reference.items())
    check(agree, f"test line {({k: test_line[0].get(k) for k in reference} if test_line else None)} equals "
          f"scikit-learn on model/'s predictions {reference}")
    in_summary = summary(run_dir).get("test")
    check(bool(test_line) and in_summary == {k: v for k, v in test_line[0].items() if k.startswith("test_") and
                                             k not in TIMINGS}, f"summary.json's test: {in_summary}")
    if test_line:
        two_ranks_evaluate_alike(args, work, train, test, run_dir, test_line[0])
    signalled_and_resumed(args, work, job, run_dir)


def two_ranks_evaluate_alike(args, work, train, test, run_dir, one_rank):
    """model/ evaluated on the test split by 2 ranks (a job whose only step runs at lr 0,
    the warm-up's first) gives the one-rank run's test metrics: the same predictions
    counted, the loss summed in another order."""
    extra = f"""train: {{epochs: 1, batch_size: 8, max_steps: 1}}
eval: {{test: {test}, batch_size: 32}}
"""
    # No data.tokenizer, and model/'s vocab.txt replaced by the tokenizer.json HF saves for
    # it: the folder's own tokenizer is read from that.
    init = os.path.join(work, "model_saved_by_hf")
    shutil.copytree(os.path.join(run_dir, "model"), init)
    BertTokenizerFast(vocab_file=os.path.join(init, "vocab.txt"), do_lower_case=True).save_pretrained(init)
    os.remove(os.path.join(init, "vocab.txt"))
    text = job_yaml("two", train, extra).replace("  preset: tiny\n", f"  init: {init}\n")
    text = text.replace(f"  tokenizer:\n    vocab: {os.path.join(LANGID, 'vocab.txt')}\n", "")
    check("tokenizer" not in text, text)
    job = write(os.path.join(work, "two.yaml"), text)
    result = subprocess.run([args.mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none", args.worker, job,
                             "--runs-dir", os.path.join(work, "two_runs")], capture_output=True, text=True,
                            timeout=600, env=MPI_ENV, restore_signals=False)
    check(result.returncode == 0, f"the 2-rank job failed:\n{result.stderr[-3000:]}")
    exported = open(os.path.join(work, "two_runs", "two", "model", "vocab.txt"), "rb").read()
    check(exported == open(os.path.join(LANGID, "vocab.txt"), "rb").read(),
          "the model it exports has the tokenizer.json's vocabulary as vocab.txt, byte for byte")
    two = [l for l in read_lines(os.path.join(work, "two_runs", "two"), "evals.jsonl") if l["split"] == "test"]
    counted = ("test_accuracy", "test_f1", "test_precision", "test_recall")
    same = len(two) == 1 and all(two[0][k] == one_rank[k] for k in counted)
    loss = len(two) == 1 and abs(two[0]["test_loss"] - one_rank["test_loss"]) <= 1e-12 * abs(one_rank["test_loss"])
    shown = {k: two[0][k] for k in counted + ("test_loss",)} if two else None
    check(same and loss, f"2 ranks: test metrics {shown} equal one rank's (the loss within 1e-12)")


def signalled_and_resumed(args, work, job, straight_dir):
    with open(job) as f:
        paused = write(os.path.join(work, "paused.yaml"), f.read().replace("eval: {", "eval: {every_steps: 20, ") +
                       "debug: {step_pause_ms: 40}\n")
    runs = os.path.join(work, "signalled")
    proc = subprocess.Popen([args.worker, paused, "--runs-dir", runs], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    steps_file = os.path.join(runs, "best", "steps.jsonl")
    deadline = time.time() + 300
    while not (os.path.exists(steps_file) and sum(1 for _ in open(steps_file)) >= 90):
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"the paused run ended before step 90:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    resumed = run(args.worker, paused, runs)
    if resumed.returncode != 0:
        print(out[-2000:], resumed.stderr[-3000:])
    check(proc.returncode == 3 and resumed.returncode == 0,
          f"SIGTERM at step 90 or so: exit {proc.returncode}; resumed: exit {resumed.returncode}")
    run_dir = os.path.join(runs, "best")

    def untimed(lines):
        return [{k: v for k, v in l.items() if k not in TIMINGS} for l in lines]
    check(untimed(read_lines(run_dir, "evals.jsonl")) == untimed(read_lines(straight_dir, "evals.jsonl")),
          "the resumed run's evaluations are the uninterrupted run's (runtimes aside), each once")
    check(summary(run_dir).get("best") == summary(straight_dir).get("best"), "the same best")
    a, b = weights(run_dir), weights(straight_dir)
    check(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "model/ bit for bit the same")


def replay_early_stopping(evals, patience, threshold, greater):
    """HF's EarlyStoppingCallback and best-metric rule over the evaluations, in order:
    (the step at which the run stops or None, the best step)."""
    best, best_step, without_gain = None, None, 0
    for l in evals:
        value = l["eval_loss"]
        better = best is None or (value > best if greater else value < best)
        gain = best is None or (better and abs(value - best) > threshold)
        without_gain = 0 if gain else without_gain + 1
        if better:
            best, best_step = value, l["step"]
        if without_gain >= patience:
            return l["step"], best_step
    return None, best_step


def early_stopping_case(args, work):
    extra = f"""train:
  epochs: 2
  batch_size: {BATCH}
  lr: 1.0e-3
  early_stopping: {{patience: 2, threshold: 0.0}}
eval: {{every_steps: 10, metrics: [accuracy]}}
checkpoint: {{best_metric: eval_loss, greater_is_better: true, resume: auto}}
"""
    job = write(os.path.join(work, "early.yaml"), job_yaml("early", subset_tsv(work, EXAMPLES), extra))
    runs = os.path.join(work, "early_runs")
    result = run(args.worker, job, runs)
    check(result.returncode == 0, f"the run failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    run_dir = os.path.join(runs, "early")
    evals = read_lines(run_dir, "evals.jsonl")
    stop, best_step = replay_early_stopping(evals, 2, 0.0, True)
    s = summary(run_dir)
    steps = [l["step"] for l in evals]
    check(stop is not None and s["global_step"] == stop < 150 and steps == list(range(10, stop + 1, 10)),
          f"stopped at step {s['global_step']} after evaluations at {steps} (the rule replayed: {stop})")
    check("stopped_early" in s and "in 2 evaluations" in s["stopped_early"],
          f"summary says why: {s.get('stopped_early')}")
    check("early stopping: eval_loss has not bettered" in result.stdout + result.stderr, "the log says so")
    check(s.get("best", {}).get("step") == best_step and best_step < s["global_step"],
          f"the best {s.get('best')} is the replayed rule's, step {best_step}")
    model = weights(run_dir)
    check(same_weights(model, checkpoint_weights(run_dir, best_step)) and
          not same_weights(model, checkpoint_weights(run_dir, s["global_step"])),
          f"model/ holds step {best_step}'s weights, not the last step's")
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        rows = list(csv.DictReader(f))
    check([r["steps"] for r in rows] == [str(stop)], f"one epoch row, of {stop} steps: {[r['steps'] for r in rows]}")
    before = tree_digest(run_dir)
    rerun = run(args.worker, job, runs)
    check(rerun.returncode == 0 and "had already finished" in rerun.stdout + rerun.stderr and
          tree_digest(run_dir) == before, f"a rerun: exit {rerun.returncode}, every file byte for byte")


CASES = {"best": best_case, "early_stopping": early_stopping_case}


if __name__ == "__main__":
    run_case(CASES, description=__doc__)
