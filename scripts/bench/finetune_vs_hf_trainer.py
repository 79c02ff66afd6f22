#!/usr/bin/env python3
"""The driver of finetune_vs_hf_trainer.sh. For each task it writes the worker's job file,
then runs, in turn and --runs times: the worker (one process), and the Trainer
configurations of --systems (hf_trainer_reference.py): hf_grouped (group_by_length),
hf_default (Trainer's defaults) and hf_compiled (group_by_length and torch_compile). Each
run is a separate process timed from launch to exit; one that outlives --run-timeout, or
--deadline counted from the start, is killed and shown as killed.

On a GPU (--device cuda, --precision bf16) both sides autocast to bf16; the worker runs
with train.cuda_graph as --cuda-graph says. --init-preset writes one fresh Hugging Face
folder of the task's BERT preset (or --preset) for the task (BertForSequenceClassification,
seeded, 512 positions, --dropout, the task's vocabulary and labels) and both sides start
from it: the worker by model.init, Trainer by from_pretrained, so both train the same
initial weights.

The time at which each epoch's dev accuracy became known is taken for the worker from the moment its row appears in epochs.csv (the
file is polled every 20 ms), for Trainer from its on_evaluate callback.

The accuracy target of a task is --target-acc if given, else the lowest final dev
accuracy of all its runs, so that every run reaches it; the time to target is the time at
which a run's first epoch at or above it ended. Figures are medians over the runs."""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

# name: (data folder, preset, max length, peak lr)
TASKS = {"langid": ("langid", "tiny", 64, 1e-3), "topics": ("topics", "mini", 128, 5e-4)}
SYSTEMS = ("trainyard", "hf_grouped", "hf_default", "hf_compiled")
PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


def task_settings(task, a):
    """(data folder, preset, max length, peak lr) of a task, with --preset and --lr applied."""
    folder, preset, max_len, lr = TASKS[task]
    return folder, a.preset or preset, max_len, a.lr or lr


def make_init_folder(a, task):
    """A fresh, seeded BertForSequenceClassification of the task's preset, saved in Hugging
    Face's layout, for both sides to start from. Made by a child Python (the one that runs
    Trainer) so this driver needs no transformers."""
    folder, preset, _, _ = task_settings(task, a)
    data = os.path.abspath(os.path.join("data/prepared", folder))
    out = os.path.join(a.work, f"init-{task}-{preset}")
    hidden, layers, heads, inter = PRESETS[preset]
    code = f"""
import torch
from transformers import BertConfig, BertForSequenceClassification
labels = [l.strip() for l in open({data + '/labels.txt'!r}, encoding="utf-8") if l.strip()]
vocab = sum(1 for _ in open({data + '/vocab.txt'!r}, encoding="utf-8"))
torch.manual_seed({a.seed})
config = BertConfig(vocab_size=vocab, hidden_size={hidden}, num_hidden_layers={layers}, num_attention_heads={heads},
                    intermediate_size={inter}, max_position_embeddings=512, num_labels=len(labels),
                    hidden_dropout_prob={a.dropout}, attention_probs_dropout_prob={a.dropout})
BertForSequenceClassification(config).save_pretrained({out!r})
"""
    subprocess.run([a.python, "-c", code], check=True)
    return out


def model_yaml(preset, a):
    if a.init:
        return f"{{init: {a.init}, dropout: {a.dropout}}}"
    return f"{{preset: {preset}, dropout: {a.dropout}}}"


def job_yaml(name, data, preset, max_len, lr, a):
    graph = "true" if a.cuda_graph else "false"
    return f"""name: {name}
seed: {a.seed}
data:
  train: {data}/train.tsv
  dev: {data}/dev.tsv
  labels: {data}/labels.txt
  max_seq_len: {max_len}
  bucket_batches: 50
  loader_threads: {a.loader_threads}
  tokenizer: {{vocab: {data}/vocab.txt, lowercase: true}}
model: {model_yaml(preset, a)}
train: {{epochs: {a.epochs}, batch_size: {a.batch}, lr: {lr}, warmup_ratio: 0.1, weight_decay: 0.01,
        max_grad_norm: 1.0, precision: {a.precision}, cuda_graph: {graph},
        gradient_accumulation_steps: {a.accumulation}, lr_schedule: {a.schedule}}}
eval: {{every_steps: {a.eval_steps}}}
checkpoint: {{keep: 2{f", best_metric: eval_{a.best_metric}" if a.best_metric else ""}}}
runtime: {{device: {a.device}, threads: {a.threads}}}
log: {{steps_every: 20, progress: false}}
"""


def run_budget(a):
    """Seconds a run may take: --run-timeout, cut to what is left of --deadline."""
    left = a.deadline - (time.time() - a.started) if a.deadline else float("inf")
    return min(a.run_timeout, left)


def run_worker(a, task, run):
    folder, preset, max_len, lr = task_settings(task, a)
    data = os.path.abspath(os.path.join("data/prepared", folder))
    name = f"{task}_{run}"
    job = os.path.join(a.work, name + ".yaml")
    with open(job, "w") as f:
        f.write(job_yaml(name, data, preset, max_len, lr, a))
    runs_dir = os.path.join(a.work, "runs")
    csv_path = os.path.join(runs_dir, name, "epochs.csv")
    log = open(os.path.join(a.work, name + ".log"), "w")
    start = time.time()
    proc = subprocess.Popen([a.worker, job, "--runs-dir", runs_dir, "--resume", "none"], stdout=log,
                            stderr=subprocess.STDOUT)
    stamps, seen, budget = [], 0, run_budget(a)
    while True:
        done = proc.poll() is not None
        if not done and time.time() - start > budget:
            proc.kill()
            proc.wait()
            return {"wall_s": float("nan"), "epochs": stamps, "timed_out": True,
                    "killed_after_s": time.time() - start}
        if os.path.exists(csv_path):
            with open(csv_path) as f:
                lines = f.read().splitlines()
            header = lines[0].split(",") if lines else []
            for line in lines[1 + seen:]:
                row = dict(zip(header, line.split(",")))
                stamps.append({"epoch": int(row["epoch"]), "eval_acc": float(row["eval_acc"]),
                               "t": time.time() - start})
                seen += 1
        if done:
            break
        time.sleep(0.02)
    wall = time.time() - start
    if proc.returncode != 0:
        log.close()
        with open(log.name) as f:
            tail = "".join(f.readlines()[-40:])
        sys.exit(f"error: the worker failed on {task} (exit {proc.returncode}); the end of {log.name}:\n{tail}")
    return {"wall_s": wall, "epochs": stamps, "steps": worker_steps(os.path.join(runs_dir, name)),
            **worker_evaluations(os.path.join(runs_dir, name))}


def worker_evaluations(run_folder):
    """The median seconds of one dev evaluation, how many there were, and the best
    evaluation's value under checkpoint.best_metric."""
    with open(os.path.join(run_folder, "evals.jsonl")) as f:
        evals = [json.loads(line) for line in f]
    seconds = [e["eval_runtime"] for e in evals if e["split"] == "eval"]
    with open(os.path.join(run_folder, "summary.json")) as f:
        best = json.load(f).get("best", {}).get("value")
    return {"eval_s": statistics.median(seconds) if seconds else float("nan"), "evaluations": len(seconds),
            "best": best}


def worker_steps(run_folder):
    try:
        with open(os.path.join(run_folder, "summary.json")) as f:
            return json.load(f).get("global_step")
    except (OSError, ValueError):
        return None


def run_trainer(a, task, run, system):
    folder, preset, max_len, lr = task_settings(task, a)
    data = os.path.join("data/prepared", folder)
    out = os.path.join(a.work, f"hf_{task}_{run}_{system[3:]}")
    cmd = [a.python, "scripts/bench/hf_trainer_reference.py", "--train", f"{data}/train.tsv", "--dev",
           f"{data}/dev.tsv", "--labels", f"{data}/labels.txt", "--vocab", f"{data}/vocab.txt", "--out", out,
           "--preset", preset, "--max-len", str(max_len), "--epochs", str(a.epochs), "--batch", str(a.batch),
           "--lr", str(lr), "--seed", str(a.seed), "--threads", str(a.threads), "--device", a.device,
           "--precision", a.precision, "--dropout", str(a.dropout)]
    if a.init:
        cmd += ["--init", a.init]
    if system in ("hf_grouped", "hf_compiled"):
        cmd.append("--group-by-length")
    if system == "hf_compiled":
        cmd.append("--torch-compile")
    cmd += ["--accumulation", str(a.accumulation), "--eval-steps", str(a.eval_steps),
            "--schedule", {"constant": "constant_with_warmup"}.get(a.schedule, a.schedule)]
    if a.best_metric:
        cmd += ["--best-metric", a.best_metric]
    start = time.time()
    # A session of its own, so a timed-out run is killed with the compile workers it started.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, run_budget(a)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        return {"wall_s": float("nan"), "epochs": trainer_stamps(stdout, start), "timed_out": True,
                "killed_after_s": time.time() - start}
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"error: HF Trainer ({system}) failed on {task}:\n{stderr[-3000:]}")
    lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{\"")]
    info = next((l for l in lines if "optimizer" in l), {})
    loop = next((l for l in lines if "train_loop_s" in l), {})
    seconds = [l["eval_runtime"] for l in lines if l.get("eval_runtime") is not None]
    return {"wall_s": wall, "epochs": trainer_stamps(stdout, start), "optimizer": info.get("optimizer"),
            "transformers": info.get("transformers"), "steps": loop.get("steps"),
            "eval_s": statistics.median(seconds) if seconds else float("nan"), "evaluations": len(seconds),
            "best": loop.get("best_metric")}


def trainer_stamps(stdout, start):
    lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{\"")]
    return [{"epoch": l["epoch"], "eval_acc": l["eval_acc"], "t": l["t"] - start} for l in lines if "t" in l]


def time_to(result, target):
    return next((e["t"] for e in result["epochs"] if e["eval_acc"] >= target), float("nan"))


def final_acc(result):
    """The last epoch's dev accuracy of a run that finished every epoch, else NaN."""
    return result["epochs"][-1]["eval_acc"] if result["epochs"] and not result.get("timed_out") else float("nan")


def median(values):
    values = [v for v in values if v == v]  # NaN (a timed-out run) is left out
    return statistics.median(values) if values else float("nan")


def summarize(task, results, target_acc, a):
    finals = [final_acc(r) for rs in results.values() for r in rs]
    finished = [f for f in finals if f == f]
    target = target_acc if target_acc is not None else (min(finished) if finished else float("nan"))
    rows = {}
    for system, rs in results.items():
        rows[system] = {"wall_s": median(r["wall_s"] for r in rs),
                        "to_target_s": median(time_to(r, target) for r in rs),
                        "final_acc": median(final_acc(r) for r in rs),
                        "steps": rs[0].get("steps"),
                        "eval_s": median(r.get("eval_s", float("nan")) for r in rs),
                        "evaluations": rs[0].get("evaluations"),
                        "best": median(r["best"] for r in rs if r.get("best") is not None),
                        "walls": [f"killed after {r['killed_after_s']:.0f} s" if r.get("timed_out")
                                  else round(r["wall_s"], 1) for r in rs],
                        "epoch_accs": [[round(e["eval_acc"], 4) for e in r["epochs"]] for r in rs]}
    folder, preset, max_len, _ = task_settings(task, a)
    start = f"from {a.init}" if a.init else "fresh"
    print(f"\n{task} ({preset}, {start}, max length {max_len}, {a.device}, {a.precision}): dev accuracy target "
          f"{target:.4f}, medians of {len(results['trainyard'])} runs")
    print(f"  {'':12} {'wall s':>8} {'to target s':>12} {'final acc':>10} {'steps':>6} {'evals':>6} "
          f"{'s/eval':>7} {'best':>7}   runs (wall s)")
    for system, row in rows.items():
        print(f"  {system:12} {row['wall_s']:8.1f} {row['to_target_s']:12.1f} {row['final_acc']:10.4f} "
              f"{row['steps'] if row['steps'] is not None else '-':>6} {row['evaluations'] or '-':>6} "
              f"{row['eval_s']:7.3f} {row['best']:7.4f}   {row['walls']}")
    summary = {"target_acc": target, "systems": rows}
    for ref in (s for s in SYSTEMS[1:] if s in rows):
        wall = rows["trainyard"]["wall_s"] / rows[ref]["wall_s"]
        to_target = rows["trainyard"]["to_target_s"] / rows[ref]["to_target_s"]
        per_eval = rows["trainyard"]["eval_s"] / rows[ref]["eval_s"]
        print(f"  trainyard / {ref:10}  wall {wall:.3f}   to target {to_target:.3f}   per evaluation {per_eval:.3f}")
        summary[f"ratio_wall_vs_{ref[3:]}"] = wall
        summary[f"ratio_to_target_vs_{ref[3:]}"] = to_target
        summary[f"ratio_eval_vs_{ref[3:]}"] = per_eval
    summary["settings"] = {"accumulation": a.accumulation, "schedule": a.schedule, "eval_steps": a.eval_steps,
                           "best_metric": a.best_metric, "epochs": a.epochs, "batch": a.batch}
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tasks", default="langid,topics")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--target-acc", type=float)
    p.add_argument("--json", default="")
    p.add_argument("--systems", default="hf_grouped,hf_default",
                   help="the Trainer configurations to run beside ours: hf_grouped, hf_default, hf_compiled")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--cuda-graph", action="store_true", help="the worker's train.cuda_graph: true")
    p.add_argument("--preset", choices=sorted(PRESETS), help="the BERT preset (default: the task's)")
    p.add_argument("--lr", type=float, help="the peak learning rate (default: the task's)")
    p.add_argument("--loader-threads", type=int, default=1, help="the worker's data.loader_threads")
    p.add_argument("--init-preset", action="store_true",
                   help="start both sides from one fresh Hugging Face folder of the preset")
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout, both sides")
    p.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps, both sides")
    p.add_argument("--schedule", default="linear", choices=("linear", "cosine", "constant"),
                   help="the learning-rate schedule after the warm-up, both sides")
    p.add_argument("--eval-steps", type=int, default=0,
                   help="also evaluate (Trainer: and checkpoint) every N optimizer steps; 0: every epoch")
    p.add_argument("--best-metric", default="", choices=("", "f1", "accuracy", "loss"),
                   help="keep the best evaluation's checkpoint by this metric and end with its model")
    p.add_argument("--run-timeout", type=float, default=3600, help="seconds after which a run is killed")
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds from start by which every run must end (a run is killed at it)")
    a = p.parse_args()
    a.started = time.time()
    systems = ["trainyard"] + [s for s in a.systems.split(",") if s]
    for system in systems[1:]:
        if system not in SYSTEMS[1:]:
            sys.exit(f"error: --systems: unknown system '{system}' (expected {', '.join(SYSTEMS[1:])})")
    tasks = a.tasks.split(",")
    for task in tasks:
        if task not in TASKS:
            sys.exit(f"error: --tasks: unknown task '{task}' (expected {', '.join(TASKS)})")
    report = {}
    for task in tasks:
        a.init = make_init_folder(a, task) if a.init_preset else ""
        results = {s: [] for s in systems}
        for run in range(a.runs):
            results["trainyard"].append(run_worker(a, task, run))
            for system in systems[1:]:
                results[system].append(run_trainer(a, task, run, system))
            done = {s: round(results[s][-1]["wall_s"], 1) for s in systems}
            print(f"[{task} run {run + 1}/{a.runs}] wall s {done}", file=sys.stderr, flush=True)
        report[task] = summarize(task, results, a.target_acc, a)
        trainer_runs = next((results[s] for s in systems[1:]), None)
        report[task]["hf_optimizer"] = trainer_runs[0].get("optimizer") if trainer_runs else None
        report[task]["transformers"] = trainer_runs[0].get("transformers") if trainer_runs else None
    print(f"\nTrainer's optimizer: {report[tasks[0]]['hf_optimizer']} (transformers "
          f"{report[tasks[0]]['transformers']}); {a.threads} threads, one process each, batch {a.batch}, "
          f"{a.epochs} epochs, {a.device}, {a.precision}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
