#!/usr/bin/env python3
"""Data-parallel tests with real MPI ranks (mpirun --oversubscribe).

  equivalence  4 ranks x batch b and 1 rank x batch 4b agree after 20 steps
               (parameters within 1e-5; fp32, CPU, dropout off)
  accumulation batch 16 in 2 accumulated micro-batches and batch 32 in one agree after
               20 steps, on 1 rank and on 2 (the same bound)
  consistency  parameters are bitwise identical across ranks after every step
  fp16_agree   an inf planted in one rank's gradients makes every rank skip that
               step and halve the loss scale; ranks stay identical afterwards
  overlap      with overlap on, buckets are all-reduced during backward; off, none; same losses
  hang         SIGSTOP one rank mid-epoch: the others name it and the collective, each
               having waited its deadline (within 2 s), and the job exits non-zero within
               timeout + 20 s
  kill         SIGKILL one rank mid-epoch: the job exits non-zero within timeout + 20 s
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_case  # noqa: E402
from harness import e2e  # noqa: E402
from harness.e2e import MPI_ENV, TimedOutput, hang_waits, job_yaml, rank_pids, subset_tsv, write  # noqa: E402


def mpirun(args, ranks):
    return [args.mpirun, "-n", str(ranks), "--oversubscribe", "--bind-to", "none", args.worker]


def run_job(args, work, name, ranks, extra, train_count=1600):
    train = subset_tsv(work, train_count)
    job = write(os.path.join(work, name + ".yaml"), job_yaml(name, train, extra))
    runs = os.path.join(work, "runs")
    result = subprocess.run(mpirun(args, ranks) + [job, "--runs-dir", runs], capture_output=True, text=True,
                            env=MPI_ENV, timeout=600, restore_signals=False)
    check(result.returncode == 0,
          f"{name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return os.path.join(runs, name), result


def load_weights(run_dir):
    from safetensors.torch import load_file
    return load_file(os.path.join(run_dir, "model", "model.safetensors"))


def steps_jsonl(run_dir):
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        return [json.loads(l) for l in f]


def weights_agree(a, b, what):
    """Whether two runs' weights agree within the rounding of summing the same gradients
    in another order. Such runs differ only in that order, so every weight may differ by
    rounding noise that Adam carries forward: at most 1e-5 per element, while one wrong
    gradient (a rank's batch lost, a bucket mis-mapped, a micro-batch counted twice) moves
    weights by about lr = 1e-3 a step. The bound is absolute: a norm-wise relative one
    depends on the vocabulary, which prepare_data.py's WordPiece trainer does not make the
    same way twice (tie order), and a tensor that starts at zero (a LayerNorm bias) has a
    small norm after 20 steps. The attention key bias has no gradient in exact arithmetic
    (softmax ignores a shift shared by all keys), so only noise moves it, which Adam
    amplifies; it is held to 1e-4."""
    noise_only = [k for k in b if k.endswith("attention.self.key.bias")]
    rest = [k for k in b if k not in noise_only]
    diff = {k: (a[k] - b[k]).abs().max().item() for k in rest}
    worst = max(diff, key=diff.get)
    rel = max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in rest)
    noise = max((a[k] - b[k]).abs().max().item() for k in noise_only)
    print(f"{what} after 20 steps: max abs difference {diff[worst]:.2e} in {worst} (largest norm-wise "
          f"relative difference {rel:.2e}); key biases (noise only) differ by at most {noise:.2e}")
    return diff[worst] <= 1e-5 and noise < 1e-4


STEPS_20 = "  max_steps: 20\n  lr: 1.0e-3\n  epochs: 1\n"


def equivalence(args, work):
    four, _ = run_job(args, work, "eq_four", 4, "train:\n  batch_size: 8\n" + STEPS_20)
    one, _ = run_job(args, work, "eq_one", 1, "train:\n  batch_size: 32\n" + STEPS_20)
    check(weights_agree(load_weights(four), load_weights(one), "4x8 vs 1x32"),
          "4 ranks x 8 and 1 rank x 32 disagree (the line above says by how much)")


def accumulation(args, work):
    """train.gradient_accumulation_steps: batch 16 in 2 micro-batches against batch 32 in
    one, on 1 rank and on 2. Each optimizer step sees the same examples, so the weights
    agree as equivalence's do; the steps' rates and tokens are equal, and their losses
    (rank 0's mean over its examples) agree to 1e-5 relative, the weights' rounding."""
    ok = True
    for ranks in (1, 2):
        split, _ = run_job(args, work, f"split_{ranks}", ranks,
                           "train:\n  batch_size: 16\n  gradient_accumulation_steps: 2\n" + STEPS_20)
        whole, _ = run_job(args, work, f"whole_{ranks}", ranks, "train:\n  batch_size: 32\n" + STEPS_20)
        ok &= weights_agree(load_weights(split), load_weights(whole), f"{ranks} rank(s), 16 x 2 accumulated vs 32")
        steps_of = lambda run: [(x["step"], x["lr"], x["tokens"]) for x in steps_jsonl(run)]  # noqa: E731
        same_steps = steps_of(split) == steps_of(whole) and len(steps_of(whole)) == 20
        losses = [(a["loss"], b["loss"]) for a, b in zip(steps_jsonl(split), steps_jsonl(whole))]
        loss_diff = max(abs(a - b) / abs(b) for a, b in losses)
        print(f"{ranks} rank(s): {len(steps_of(split))} optimizer steps, each with the unsplit run's lr and "
              f"tokens: {same_steps}; losses differ by at most {loss_diff:.1e} relative")
        ok &= same_steps and loss_diff <= 1e-5
    check(ok, "accumulated micro-batches disagree with whole batches (the lines above say how)")


def dropout_off(text):
    return text.replace("  dropout: 0.1", "  dropout: 0.0")


def consistency(args, work):
    run, _ = run_job(args, work, "consistent", 4, "train:\n  batch_size: 8\n  max_steps: 30\n  epochs: 1\n"
                     "distributed:\n  check_consistency: true\n  bucket_mb: 1\n")
    with open(os.path.join(run, "summary.json")) as f:
        checks = json.load(f)["consistency_checks"]
    print(f"parameter hashes compared across 4 ranks after {checks} steps: all identical")
    check(checks == 30, f"parameter hashes compared after {checks} steps, not 30")


def fp16_agree(args, work):
    run, result = run_job(args, work, "fp16_agree", 4,
                          "train:\n  batch_size: 8\n  max_steps: 12\n  epochs: 1\n"
                          "  loss_scale:\n    init_scale: 1024\n    growth_interval: 100\n"
                          "distributed:\n  check_consistency: true\n"
                          "debug:\n  force_loss_scaling: true\n  plant_inf_step: 5\n  plant_inf_rank: 2\n")
    steps = steps_jsonl(run)
    skipped = [s["step"] for s in steps if s["skipped"]]
    scales = [s["loss_scale"] for s in steps]
    print(f"skipped steps {skipped}; loss scale by step {scales}")
    planted = "planted an inf in rank 2" in result.stdout + result.stderr
    check(planted and skipped == [5] and scales[3] == 1024 and scales[4] == 512 and scales[-1] == 512,
          f"the inf planted in rank 2 ({'said' if planted else 'not said'}): skipped steps {skipped}, scales {scales}")


def small_vocab(text, work):
    """A 1,000-piece SentencePiece vocabulary, so the embedding (the last gradient
    backward produces, which no schedule can hide) is a small share of the bytes."""
    start = text.index("  tokenizer:")
    end = text.index("model:")
    model = os.path.join(work, "sp1000.model")
    return text[:start] + f"  tokenizer:\n    kind: sentencepiece\n    model: {model}\n    vocab_size: 1000\n" + text[end:]


def overlap(args, work):
    """Overlap is a schedule, not a timing: with it on, buckets are all-reduced while
    backward still runs (steps.jsonl's buckets_in_backward), with it off none are, and
    the two give the same losses. How much exposed time that saves is a benchmark's
    question (scripts/bench/ddp_scaling.sh prints both settings' share of the step)."""
    original = e2e.job_yaml
    globals()["job_yaml"] = lambda *a, **k: small_vocab(original(*a, **k).replace("preset: tiny", "preset: mini"), work)
    steps = {}
    for flag in ("true", "false"):
        run, _ = run_job(args, work, f"overlap_{flag}", 2,
                         "train:\n  batch_size: 16\n  max_steps: 20\n  epochs: 1\n"
                         f"distributed:\n  overlap: {flag}\n  bucket_mb: 1\n")
        steps[flag] = steps_jsonl(run)
        launched = [s["buckets_in_backward"] for s in steps[flag]]
        print(f"overlap {flag:5}: buckets all-reduced during backward, per logged step: {launched}")
    ok = len(steps["true"]) == len(steps["false"]) > 0
    ok &= all(s["buckets_in_backward"] >= 1 for s in steps["true"])
    ok &= all(s["buckets_in_backward"] == 0 for s in steps["false"])
    # The same buckets are summed in the same order either way: only the timing differs.
    for on, off in zip(steps["true"], steps["false"]):
        if on["step"] != off["step"] or abs(on["loss"] - off["loss"]) > 1e-6 * max(1.0, abs(off["loss"])):
            print(f"step {on['step']}: loss {on['loss']} with overlap, {off['loss']} without")
            ok = False
    check(ok, "overlap on and off disagree on the buckets all-reduced during backward or the losses (lines above)")


# How long past the collective's deadline a rank may notice it: the rank measures its own
# wait (the report's "timed out after N s") and polls its deadline every few milliseconds,
# so this holds on a machine that other tests load.
NOTICE_SLACK_S = 2
# The first report reaches mpirun's output a step (or a few, on a loaded machine) after the
# stop plus the deadline: the other ranks finish the step in hand before they wait.
REPORT_SLACK_S = 10
# How long after the deadline the whole job may take to exit: mpirun tears down every
# rank after the first abort, which a loaded machine slows; a job that does not end on
# its own runs until wait()'s limit, well past this.
EXIT_SLACK_S = 20


def fault(args, work, sig):
    timeout_s = 6.0
    name = "hang" if sig == signal.SIGSTOP else "killed"
    train = subset_tsv(work, 6000)
    job = write(os.path.join(work, name + ".yaml"), job_yaml(
        name, train, f"train:\n  batch_size: 16\n  epochs: 5\ndistributed:\n  timeout_s: {timeout_s}\n"))
    runs = os.path.join(work, "runs")
    proc = subprocess.Popen(mpirun(args, 4) + [job, "--runs-dir", runs], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=MPI_ENV, text=True, restore_signals=False)
    output = TimedOutput(proc)
    pids = rank_pids(proc.pid, 4, time.time() + 60)
    steps_file = os.path.join(runs, name, "steps.jsonl")
    while not (os.path.exists(steps_file) and os.path.getsize(steps_file) > 2000):
        if proc.poll() is not None:
            raise AssertionError(output.text())
        time.sleep(0.05)
    os.kill(pids[2], sig)
    faulted = time.time()
    try:
        proc.wait(timeout=timeout_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    elapsed = time.time() - faulted
    out = output.text()
    report = [l for l in out.splitlines() if "timed out" in l]
    for line in report[:4]:
        print(line)
    print(f"{signal.Signals(sig).name} of rank 2: job exited with {proc.returncode} {elapsed:.1f} s later "
          f"(limit {timeout_s + EXIT_SLACK_S:.0f} s)")
    check(proc.returncode != 0 and elapsed <= timeout_s + EXIT_SLACK_S,
          f"the job exited {proc.returncode} {elapsed:.1f} s after the fault (non-zero within "
          f"{timeout_s + EXIT_SLACK_S:.0f} s)")
    if sig == signal.SIGSTOP:
        host = socket.gethostname()
        named = report and all(f"rank {host}:2 did not reach it" in l and "collective #" in l for l in report)
        check(named, f"every report names rank {host}:2 and the collective: {report[:4]}")
        waits = hang_waits(report)
        reported = output.first("timed out", faulted)
        print(f"the ranks waited {waits} s (deadline {timeout_s} s); the first report came {reported:.1f} s after "
              f"the stop")
        check(waits and all(timeout_s <= w <= timeout_s + NOTICE_SLACK_S for w in waits),
              f"each rank gives up at its deadline, {timeout_s} s, within {NOTICE_SLACK_S} s: {waits}")
        check(reported <= timeout_s + REPORT_SLACK_S,
              f"the first report came {reported:.1f} s after the stop, past the deadline {timeout_s} s + "
              f"{REPORT_SLACK_S} s")


def with_dropout_off(case):
    """`case`, its jobs without dropout: runs that are compared numerically."""
    def run(args, work):
        globals()["job_yaml"] = lambda *a, **k: dropout_off(e2e.job_yaml(*a, **k))
        case(args, work)
    return run


CASES = {"equivalence": with_dropout_off(equivalence), "accumulation": with_dropout_off(accumulation),
         "consistency": with_dropout_off(consistency), "fp16_agree": with_dropout_off(fp16_agree),
         "overlap": overlap, "hang": lambda a, w: fault(a, w, signal.SIGSTOP),
         "kill": lambda a, w: fault(a, w, signal.SIGKILL)}


if __name__ == "__main__":
    run_case(CASES, description=__doc__)
