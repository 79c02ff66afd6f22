#!/usr/bin/env python3
"""Exact resume (CPU, fp32, fixed seed, dropout on), and what happens to bad checkpoints.

  single      a run killed with SIGKILL after its first checkpoint and resumed with
              `resume: auto` ends with weights bitwise equal to an uninterrupted run,
              and epochs.csv holds each epoch exactly once; a run stopped by --max-steps
              in the middle of an epoch and resumed without it goes on at the next
              batch of that epoch: every step once, every epoch whole
  two_ranks   the same with 2 ranks (mpirun -n 2): weights, every step's loss and the
              epoch rows bitwise equal (each rank's RNG state is in the checkpoint)
  fallback    a finished run whose newest checkpoint is corrupt (2,000 flipped bits in
              its tensor data; a negative global_step; a next_batch beyond the epoch;
              a missing rng_ranks) resumes from the previous checkpoint with a warning
              naming the file and the reason, sets the bad file aside as .rejected and
              ends bitwise equal to the uninterrupted run
  none_valid  when every checkpoint is corrupt, `resume: auto` exits 2 and deletes and
              writes nothing
  finished    rerunning a finished run with `resume: auto` exits 0, says the job had
              finished, shows its epochs, and leaves every file of the run byte for byte
              (no file added either): a run that ended at an epoch's end, and one that
              --max-steps ended inside an epoch, rerun with the same --max-steps
  signal      a run sent SIGTERM (one rank) mid-epoch stops after a step, writes a
              checkpoint there and exits 3; rerun, it ends bitwise equal to an
              uninterrupted run (weights, epoch rows, every step's loss, each once)
  signal_two_ranks  the same with SIGUSR1 to mpirun, which passes it to both ranks
  signal_accumulated  the same with each step in 2 accumulated micro-batches
              (train.gradient_accumulation_steps): the signal stops it between optimizer
              steps, and the resumed run takes the next step's micro-batches
  bf16_weights  2 ranks with bf16 weights and fp32 masters (train.bf16_weights): killed
              and resumed, bitwise equal to an uninterrupted run (the masters are in the
              checkpoint); the saved model holds the fp32 masters; its checkpoints,
              offered to the same job without bf16_weights, exit 2 naming both dtypes
              and the flag, and change nothing
"""
import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness.e2e import (MPI_ENV, dev_subset, flip_bits, job_yaml, rank_pids, set_metadata, subset_tsv,  # noqa: E402
                         tree_digest, weights, write)

EPOCHS, EXAMPLES, BATCH = 2, 1200, 16  # 75 steps an epoch on one rank, 38 on two
EXTRA = f"""train:
  epochs: {EPOCHS}
  batch_size: {BATCH}
  lr: 1.0e-3
checkpoint:
  every_steps: 25
  keep: 2
  resume: auto
"""


def read(path):
    with open(path, "rb") as f:
        return f.read()


def command(args, ranks, job, runs):
    prefix = [args.mpirun, "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] if ranks > 1 else []
    return prefix + [args.worker, job, "--runs-dir", runs]


def run(args, ranks, job, runs):
    return subprocess.run(command(args, ranks, job, runs), capture_output=True, text=True, env=MPI_ENV, timeout=600,
                          restore_signals=False)


def killed_then_resumed(args, ranks, job, runs, name):
    proc = subprocess.Popen(command(args, ranks, job, runs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=MPI_ENV)
    pids = rank_pids(proc.pid, ranks, time.time() + 60) if ranks > 1 else {0: proc.pid}
    pattern = os.path.join(runs, name, "checkpoints", "step-*.safetensors")
    deadline = time.time() + 300
    while not glob.glob(pattern):
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"worker ended before its first checkpoint:\n{proc.stdout.read().decode()}")
        time.sleep(0.005)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    killed_at = sorted(glob.glob(pattern))
    check(not os.path.exists(os.path.join(runs, name, "summary.json")),
          "the run finished before the kill; the test proved nothing")
    print(f"killed {ranks} rank(s) after checkpoint(s) {[os.path.basename(p) for p in killed_at]}")
    resumed = run(args, ranks, job, runs)
    print(resumed.stdout[-1500:], resumed.stderr[-1500:])
    check(resumed.returncode == 0 and "resuming from" in resumed.stdout + resumed.stderr,
          f"resume failed (exit {resumed.returncode})")


def outcome(run_dir):
    """What must be bitwise equal between two runs: weights, epoch losses, step losses."""
    weights = read(os.path.join(run_dir, "model", "model.safetensors"))
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        rows = [(r["epoch"], r["steps"], r["train_loss"], r["eval_loss"], r["eval_acc"]) for r in csv.DictReader(f)]
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        steps = [(s["step"], s["loss"]) for s in map(json.loads, f)]
    return weights, rows, steps


def compare(straight_dir, other_dir, epochs):
    a, b = outcome(straight_dir), outcome(other_dir)
    same = [a[i] == b[i] for i in range(3)]
    print(f"weights bitwise equal: {same[0]}; epoch rows equal: {same[1]} ({[r[0] for r in b[1]]}); "
          f"step losses equal: {same[2]} ({len(b[2])} steps)")
    return all(same) and [int(r[0]) for r in b[1]] == list(range(1, epochs + 1)) and len(b[2]) == len(a[2])


def exact_resume(args, work, ranks):
    name = f"resume_{ranks}"
    train = subset_tsv(work, EXAMPLES)
    job = write(os.path.join(work, "job.yaml"), job_yaml(name, train, EXTRA))
    straight = run(args, ranks, job, os.path.join(work, "straight"))
    check(straight.returncode == 0, f"uninterrupted run failed:\n{straight.stdout}\n{straight.stderr}")
    killed_then_resumed(args, ranks, job, os.path.join(work, "killed"), name)
    ok = compare(os.path.join(work, "straight", name), os.path.join(work, "killed", name), EPOCHS)
    if ranks == 1:
        ok &= stopped_by_max_steps_then_resumed(args, job, work, name)
    check(ok, "a resumed run is not the uninterrupted run (the lines above say how)")


def stopped_by_max_steps_then_resumed(args, job, work, name):
    """1200 examples in batches of 16 are 75 steps an epoch: --max-steps 60 stops inside the
    first; the resumed run must go on at step 61 of epoch 1. (Not bitwise equal to the
    uninterrupted run: max_steps sets the LR schedule's length.)"""
    runs = os.path.join(work, "max_steps")
    stopped = subprocess.run(command(args, 1, job, runs) + ["--max-steps", "60"], capture_output=True, text=True,
                             timeout=600)
    check(stopped.returncode == 0, f"--max-steps run failed:\n{stopped.stdout}\n{stopped.stderr}")
    resumed = run(args, 1, job, runs)
    out = resumed.stdout + resumed.stderr
    at = re.search(r"resuming from .*\(epoch (\d+), step (\d+)\)", out)
    print(f"--max-steps 60, then resumed: exit {resumed.returncode}, {at.group(0) if at else 'no resume line'}")
    _, rows, steps = outcome(os.path.join(runs, name))
    whole = [(r[0], r[1]) for r in rows] == [(str(e), "75") for e in range(1, EPOCHS + 1)]
    once = [s for s, _ in steps] == list(range(1, 75 * EPOCHS + 1))
    print(f"epochs (epoch, steps): {[(r[0], r[1]) for r in rows]}; steps 1..{75 * EPOCHS} each once: {once}")
    return resumed.returncode == 0 and at is not None and at.groups() == ("1", "60") and whole and once


FALLBACK_EXTRA = """train:
  epochs: 2
  batch_size: 16
  lr: 1.0e-3
checkpoint:
  every_steps: 20
  keep: 3
  resume: auto
"""


def finished_run(args, work):
    """A finished 1-rank run of 2 x 50 steps, checkpointed at steps 20, 40, 50, 60, 80 and 100; the
    newest 3 (60, 80, 100) are kept."""
    train = subset_tsv(work, 800)
    job = write(os.path.join(work, "job.yaml"), job_yaml("fb", train, FALLBACK_EXTRA))
    straight = run(args, 1, job, os.path.join(work, "straight"))
    check(straight.returncode == 0, f"uninterrupted run failed:\n{straight.stdout}\n{straight.stderr}")
    kept = sorted(os.path.basename(p) for p in glob.glob(os.path.join(work, "straight", "fb", "checkpoints", "*")))
    print(f"uninterrupted run kept {kept}")
    return job, os.path.join(work, "straight", "fb")


CORRUPTIONS = {
    "2,000 flipped bits": (lambda p: flip_bits(p, 2000), "do not match their checksum"),
    "negative global_step": (lambda p: set_metadata(p, global_step="-5"),
                             "checkpoint metadata 'global_step': expected an integer in \\[0, "),
    "next_batch beyond the epoch": (lambda p: set_metadata(p, next_batch="90", epoch_steps="90"),
                                    "checkpoint metadata 'next_batch': 90 lies beyond this job's 50 batches"),
    "missing rng_ranks": (lambda p: set_metadata(p, rng_ranks=None), "checkpoint metadata 'rng_ranks': missing"),
}


def fallback(args, work):
    job, straight = finished_run(args, work)
    ok = True
    for what, (corrupt, reason) in CORRUPTIONS.items():
        runs = os.path.join(work, "case")
        shutil.rmtree(runs, ignore_errors=True)
        shutil.copytree(straight, os.path.join(runs, "fb"))
        shutil.rmtree(os.path.join(runs, "fb", "model"))
        newest = sorted(glob.glob(os.path.join(runs, "fb", "checkpoints", "step-*.safetensors")))[-1]
        corrupt(newest)
        resumed = run(args, 1, job, runs)
        out = resumed.stdout + resumed.stderr
        warned = re.search(r"resume: rejected " + re.escape(newest) + r": .*" + reason, out)
        previous = re.search(r"resuming from .*step-000000080\.safetensors", out)
        aside = os.path.exists(newest + ".rejected")
        same = resumed.returncode == 0 and compare(straight, os.path.join(runs, "fb"), 2)
        print(f"{'ok  ' if warned and previous and aside and same else 'FAIL'} {what}: exit {resumed.returncode}, "
              f"warned {bool(warned)}, resumed from the previous checkpoint {bool(previous)}, "
              f"set aside {aside}, equal to the uninterrupted run {same}")
        if not (warned and previous and aside and same):
            print(out[-3000:])
            ok = False
    check(ok, "a corrupt newest checkpoint was not set aside for the previous one (the FAIL lines above)")


def rerun_changes_nothing(args, job, runs, name, extra_args=()):
    before = tree_digest(os.path.join(runs, name))
    rerun = subprocess.run(command(args, 1, job, runs) + list(extra_args), capture_output=True, text=True,
                           timeout=600)
    out = rerun.stdout + rerun.stderr
    said = "had already finished" in out and "nothing was changed" in out
    with open(os.path.join(runs, name, "epochs.csv")) as f:
        rows = [r["epoch"] for r in csv.DictReader(f)]
    shown = all(re.search(rf"^\S* *{epoch} ", rerun.stdout, re.M) for epoch in rows)
    untouched = tree_digest(os.path.join(runs, name)) == before
    print(f"rerun {' '.join(extra_args) or '(no flags)'}: exit {rerun.returncode}; said so: {said}; "
          f"epochs {rows} shown: {shown}; every file byte for byte: {untouched}")
    if rerun.returncode != 0 or not said:
        print(out[-2000:])
    return rerun.returncode == 0 and said and shown and bool(rows) and untouched


def finished(args, work):
    job, straight = finished_run(args, work)
    ok = rerun_changes_nothing(args, job, os.path.dirname(straight), "fb")
    # 50 steps an epoch: --max-steps 30 ends inside the first, with a checkpoint there. It
    # says so at the start, and its progress line (printed each tenth off a terminal)
    # counts to 30 of 30 in epoch 1 of 1.
    with open(job) as f:
        shown = write(os.path.join(work, "progress.yaml"), f.read().replace("  progress: false", "  progress: true"))
    runs = os.path.join(work, "max_steps")
    stopped = subprocess.run(command(args, 1, shown, runs) + ["--max-steps", "30"], capture_output=True, text=True,
                             timeout=600)
    check(stopped.returncode == 0, f"--max-steps run failed:\n{stopped.stdout}\n{stopped.stderr}")
    progress = [line for line in stopped.stderr.splitlines() if line.startswith("epoch ")]
    said = "train.max_steps (30) ends the run in epoch 1 of 2: 30 of its 100 steps" in stopped.stdout + stopped.stderr
    counted = bool(progress) and re.match(r"epoch 1/1 30/30 \(100%\) \[\d+:\d\d<0:00\] loss ", progress[-1])
    print(f"{'ok  ' if said and counted else 'FAIL'} --max-steps 30: said at the start {said}; the progress "
          f"line's last: {progress[-1:]}")
    ok &= bool(said and counted)
    ok &= rerun_changes_nothing(args, shown, runs, "fb", ["--max-steps", "30"])
    check(ok, "rerunning a finished run changed it or did not say so (the lines above say how)")


def none_valid(args, work):
    job, straight = finished_run(args, work)
    runs = os.path.join(work, "case")
    shutil.copytree(straight, os.path.join(runs, "fb"))
    checkpoints = sorted(glob.glob(os.path.join(runs, "fb", "checkpoints", "step-*.safetensors")))
    for path in checkpoints:
        flip_bits(path, 1)
    before = tree_digest(runs)
    result = run(args, 1, job, runs)
    last = [l for l in result.stderr.splitlines() if l.strip()][-1:] or [""]
    said = f"none of the {len(checkpoints)} checkpoints" in last[0] and last[0].startswith("error: ")
    untouched = tree_digest(runs) == before
    print(f"all {len(checkpoints)} checkpoints corrupt: exit {result.returncode}; {last[0]}")
    print(f"runs folder untouched: {untouched}")
    check(result.returncode == 2 and said and untouched,
          f"with every checkpoint corrupt: exit {result.returncode} (2 wanted), said so {said}, untouched {untouched}")


def signalled_then_resumed(args, work, ranks, sig, micro=1):
    """`micro` > 1: each step of BATCH a rank in `micro` accumulated micro-batches."""
    name = f"signal_{ranks}"
    extra = EXTRA if micro == 1 else EXTRA.replace(
        f"  batch_size: {BATCH}\n", f"  batch_size: {BATCH // micro}\n  gradient_accumulation_steps: {micro}\n")
    job = write(os.path.join(work, "job.yaml"), job_yaml(name, subset_tsv(work, EXAMPLES), extra))
    per_epoch = -(-EXAMPLES // (BATCH * ranks))
    signal_after = per_epoch + per_epoch // 5  # inside epoch 2
    straight = run(args, ranks, job, os.path.join(work, "straight"))
    check(straight.returncode == 0, f"uninterrupted run failed:\n{straight.stdout}\n{straight.stderr}")
    runs = os.path.join(work, "signalled")
    proc = subprocess.Popen(command(args, ranks, job, runs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=MPI_ENV, text=True)
    steps_file = os.path.join(runs, name, "steps.jsonl")
    deadline = time.time() + 300
    while not (os.path.exists(steps_file) and sum(1 for _ in open(steps_file)) >= signal_after):
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"worker ended before step {signal_after}:\n{proc.stdout.read()}")
        time.sleep(0.01)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    at = re.search(r"checkpoint of step (\d+) written", out)
    print(f"{signal.Signals(sig).name} after step {signal_after} or so: exit {proc.returncode}, "
          f"{at.group(0) if at else 'no checkpoint line'}")
    resumed = run(args, ranks, job, runs)
    print(resumed.stdout[-600:], resumed.stderr[-600:])
    check(proc.returncode == 3 and at is not None and signal_after <= int(at.group(1)) < per_epoch * EPOCHS
          and resumed.returncode == 0 and compare(os.path.join(work, "straight", name), os.path.join(runs, name),
                                                  EPOCHS),
          f"signalled: exit {proc.returncode} (3 wanted) with a checkpoint after step {signal_after}; resumed: exit "
          f"{resumed.returncode}, and the uninterrupted run's outcome (the lines above say how it differs)")


BF16_EXTRA = """train:
  epochs: 2
  batch_size: 16
  lr: 1.0e-3
  precision: bf16
  bf16_weights: true
checkpoint:
  every_steps: 10
  keep: 2
  resume: auto
"""


def bf16_weights(args, work):
    """The `bf16_weights` case: 2 ranks whose linear layers' weights are bf16, trained
    through fp32 masters. A run killed after its first checkpoint and resumed ends
    bitwise equal to an uninterrupted one; the saved model holds fp32 weights that bf16
    cannot represent (the masters, not their rounded copies)."""
    import torch  # here: the other cases need no torch
    name = "resume_bf16"
    train = subset_tsv(work, 640)  # 20 steps an epoch on 2 ranks of 16
    dev = dev_subset(work, 300)  # bf16 products are emulated on this CPU: a short dev set
    text = job_yaml(name, train, BF16_EXTRA, dev=dev)
    job = write(os.path.join(work, "job.yaml"), text)
    straight = run(args, 2, job, os.path.join(work, "straight"))
    check(straight.returncode == 0, f"uninterrupted run failed:\n{straight.stdout}\n{straight.stderr}")
    killed_then_resumed(args, 2, job, os.path.join(work, "killed"), name)
    ok = compare(os.path.join(work, "straight", name), os.path.join(work, "killed", name), 2)
    saved = weights(os.path.join(work, "straight", name))
    query = saved["bert.encoder.layer.0.attention.self.query.weight"]
    beyond = (query.to(torch.bfloat16).float() != query).float().mean().item()
    print(f"saved query weight: {query.dtype}, {beyond:.0%} of its values not representable in bf16")
    check(ok and query.dtype == torch.float32 and beyond > 0.5 and offered_to_fp32_weights(args, work, text, name),
          "the bf16-weights run resumed unlike the uninterrupted one, saved other than its fp32 masters, or its "
          "checkpoints were taken by fp32 weights (the lines above say which)")


def offered_to_fp32_weights(args, work, text, name):
    """The finished bf16-weights run's checkpoints, offered to the same job without
    bf16_weights: exit 2, the warning naming a weight's two dtypes and the flag that
    differs, and the runs folder untouched but for the probe that two ranks rewrite on
    every start (Note [Node-local checkpoints])."""
    runs = os.path.join(work, "fp32_weights")
    shutil.copytree(os.path.join(work, "straight", name), os.path.join(runs, name))
    job = write(os.path.join(work, "fp32_weights.yaml"), text.replace("  bf16_weights: true\n", ""))
    before = tree_digest(runs, skip=[".shared-probe"])
    result = run(args, 2, job, runs)
    said = [line for line in (result.stdout + result.stderr).splitlines() if "train.bf16_weights differs" in line]
    untouched = tree_digest(runs, skip=[".shared-probe"]) == before
    print(f"bf16-weights checkpoints offered to fp32 weights: exit {result.returncode}; "
          f"{said[0] if said else result.stderr[-600:]}; runs folder untouched: {untouched}")
    return (result.returncode == 2 and bool(said) and "BFloat16" in said[0] and "Float" in said[0] and untouched)


CASES = {"signal": lambda a, w: signalled_then_resumed(a, w, 1, signal.SIGTERM),
         "signal_two_ranks": lambda a, w: signalled_then_resumed(a, w, 2, signal.SIGUSR1),
         "signal_accumulated": lambda a, w: signalled_then_resumed(a, w, 2, signal.SIGUSR1, micro=2),
         "single": lambda a, w: exact_resume(a, w, 1), "two_ranks": lambda a, w: exact_resume(a, w, 2),
         "fallback": fallback, "none_valid": none_valid, "finished": finished, "bf16_weights": bf16_weights}


if __name__ == "__main__":
    run_case(CASES, description=__doc__)
