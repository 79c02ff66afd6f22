#!/usr/bin/env python3
"""The driver of finetune_vs_hf_trainer.sh. For each task it writes the worker's job file,
then runs, in turn and --runs times: the worker (one process), HF Trainer with
group_by_length, and HF Trainer with its defaults (hf_trainer_reference.py). Each run is a
separate process timed from launch to exit. The time at which each epoch's dev accuracy
became known is taken for the worker from the moment its row appears in epochs.csv (the
file is polled every 20 ms), for Trainer from its on_evaluate callback.

The accuracy target of a task is --target-acc if given, else the lowest final dev
accuracy of all its runs, so that every run reaches it; the time to target is the time at
which a run's first epoch at or above it ended. Figures are medians over the runs."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name: (data folder, preset, max length, peak lr)
TASKS = {"langid": ("langid", "tiny", 64, 1e-3), "topics": ("topics", "mini", 128, 5e-4)}
SYSTEMS = ("trainyard", "hf_grouped", "hf_default")


def job_yaml(name, data, preset, max_len, lr, a):
    return f"""name: {name}
seed: {a.seed}
data:
  train: {data}/train.tsv
  dev: {data}/dev.tsv
  labels: {data}/labels.txt
  max_seq_len: {max_len}
  bucket_batches: 50
  tokenizer: {{vocab: {data}/vocab.txt, lowercase: true}}
model: {{preset: {preset}, dropout: 0.1}}
train: {{epochs: {a.epochs}, batch_size: {a.batch}, lr: {lr}, warmup_ratio: 0.1, weight_decay: 0.01,
        max_grad_norm: 1.0, precision: fp32}}
checkpoint: {{keep: 2}}
runtime: {{device: cpu, threads: {a.threads}}}
log: {{steps_every: 20, progress: false}}
"""


def run_worker(a, task, run):
    folder, preset, max_len, lr = TASKS[task]
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
    stamps, seen = [], 0
    while True:
        done = proc.poll() is not None
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
        sys.exit(f"error: the worker failed on {task}; see {log.name}")
    return {"wall_s": wall, "epochs": stamps}


def run_trainer(a, task, run, grouped):
    folder, preset, max_len, lr = TASKS[task]
    data = os.path.join("data/prepared", folder)
    out = os.path.join(a.work, f"hf_{task}_{run}_{'grouped' if grouped else 'default'}")
    cmd = [a.python, "scripts/bench/hf_trainer_reference.py", "--train", f"{data}/train.tsv", "--dev",
           f"{data}/dev.tsv", "--labels", f"{data}/labels.txt", "--vocab", f"{data}/vocab.txt", "--out", out,
           "--preset", preset, "--max-len", str(max_len), "--epochs", str(a.epochs), "--batch", str(a.batch),
           "--lr", str(lr), "--seed", str(a.seed), "--threads", str(a.threads)]
    if grouped:
        cmd.append("--group-by-length")
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"error: HF Trainer failed on {task}:\n{proc.stderr[-3000:]}")
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{\"")]
    stamps = [{"epoch": l["epoch"], "eval_acc": l["eval_acc"], "t": l["t"] - start} for l in lines if "t" in l]
    info = next((l for l in lines if "optimizer" in l), {})
    return {"wall_s": wall, "epochs": stamps, "optimizer": info.get("optimizer")}


def time_to(result, target):
    return next((e["t"] for e in result["epochs"] if e["eval_acc"] >= target), float("nan"))


def summarize(task, results, target_acc):
    finals = [r["epochs"][-1]["eval_acc"] for rs in results.values() for r in rs]
    target = target_acc if target_acc is not None else min(finals)
    rows = {}
    for system, rs in results.items():
        rows[system] = {"wall_s": statistics.median(r["wall_s"] for r in rs),
                        "to_target_s": statistics.median(time_to(r, target) for r in rs),
                        "final_acc": statistics.median(r["epochs"][-1]["eval_acc"] for r in rs),
                        "walls": [round(r["wall_s"], 1) for r in rs]}
    folder, preset, max_len, _ = TASKS[task]
    print(f"\n{task} ({preset}, max length {max_len}): dev accuracy target {target:.4f}, "
          f"medians of {len(results['trainyard'])} runs")
    print(f"  {'':12} {'wall s':>8} {'to target s':>12} {'final acc':>10}   runs (wall s)")
    for system, row in rows.items():
        print(f"  {system:12} {row['wall_s']:8.1f} {row['to_target_s']:12.1f} {row['final_acc']:10.4f}   {row['walls']}")
    summary = {"target_acc": target, "systems": rows}
    for ref in (s for s in SYSTEMS[1:] if s in rows):
        wall = rows["trainyard"]["wall_s"] / rows[ref]["wall_s"]
        to_target = rows["trainyard"]["to_target_s"] / rows[ref]["to_target_s"]
        print(f"  trainyard / {ref:10}  wall {wall:.3f}   to target {to_target:.3f}")
        summary[f"ratio_wall_vs_{ref[3:]}"] = wall
        summary[f"ratio_to_target_vs_{ref[3:]}"] = to_target
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
    p.add_argument("--systems", default=",".join(SYSTEMS[1:]),
                   help="the Trainer configurations to run beside ours: hf_grouped, hf_default")
    a = p.parse_args()
    systems = ["trainyard"] + [s for s in a.systems.split(",") if s]
    for system in systems[1:]:
        if system not in SYSTEMS[1:]:
            sys.exit(f"error: --systems: unknown system '{system}' (expected hf_grouped, hf_default)")
    tasks = a.tasks.split(",")
    for task in tasks:
        if task not in TASKS:
            sys.exit(f"error: --tasks: unknown task '{task}' (expected {', '.join(TASKS)})")
    report = {}
    for task in tasks:
        results = {s: [] for s in systems}
        for run in range(a.runs):
            results["trainyard"].append(run_worker(a, task, run))
            if "hf_grouped" in results:
                results["hf_grouped"].append(run_trainer(a, task, run, grouped=True))
            if "hf_default" in results:
                results["hf_default"].append(run_trainer(a, task, run, grouped=False))
            done = {s: round(results[s][-1]["wall_s"], 1) for s in systems}
            print(f"[{task} run {run + 1}/{a.runs}] wall s {done}", file=sys.stderr, flush=True)
        report[task] = summarize(task, results, a.target_acc)
        trainer_runs = next((results[s] for s in systems[1:]), None)
        report[task]["hf_optimizer"] = trainer_runs[0]["optimizer"] if trainer_runs else None
    print(f"\nTrainer's optimizer: {report[tasks[0]]['hf_optimizer']}; {a.threads} threads, one process each, "
          f"batch {a.batch}, {a.epochs} epochs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
