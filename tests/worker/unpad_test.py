#!/usr/bin/env python3
"""model.unpad: always has the host pack each batch's real tokens before the step
(PackOnHost, then ModelImpl::ForwardPacked: the path a GPU takes, there with the varlen
attention kernel). On the CPU, BERT tiny fine-tuned on langid with it (fp32, dropout
off, 40 steps and a dev evaluation) follows the same job with model.unpad: never (every
batch padded): each step's loss within 1e-4 relative, and the dev loss within 1e-4
relative; every step reports packed_tokens equal to its real tokens (the padded run none).
The two differ only in the order of float32 sums, which the in-process suite
(unpadding_test) bounds per operation; this checks that the packing reaches the model
through the pipeline, the training step and the evaluation."""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/..")
from harness import check, run_test  # noqa: E402
from harness.e2e import job_yaml, run_worker, steps, subset_tsv, write  # noqa: E402

STEPS = "train:\n  batch_size: 16\n  max_steps: 40\n  epochs: 1\n  lr: 1.0e-3\n"


def run(args, work, unpad):
    name = f"unpad_{unpad}"
    text = job_yaml(name, subset_tsv(work, 1000), STEPS).replace("  dropout: 0.1", "  dropout: 0.0")
    text = text.replace("  preset: tiny\n", f"  preset: tiny\n  unpad: {unpad}\n")
    job = write(os.path.join(work, name + ".yaml"), text)
    runs = os.path.join(work, "runs")
    result = run_worker(args.worker, job, runs, timeout=600)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
    check(result.returncode == 0, f"{name} failed with exit code {result.returncode}")
    with open(os.path.join(runs, name, "epochs.csv")) as f:
        last = list(csv.DictReader(f))[-1]
    rows = steps(os.path.join(runs, name))
    return [s["loss"] for s in rows], float(last["eval_loss"]), [(s["tokens"], s.get("packed_tokens")) for s in rows]


def test(args, work):
    padded, padded_eval, padded_tokens = run(args, work, "never")
    packed, packed_eval, packed_tokens = run(args, work, "always")
    worst = max(abs(a - b) / abs(b) for a, b in zip(packed, padded))
    eval_gap = abs(packed_eval - padded_eval) / abs(padded_eval)
    print(f"{len(packed)} steps: worst relative loss difference {worst:.2e} (limit 1e-4); "
          f"dev loss {packed_eval:.6f} packed, {padded_eval:.6f} padded ({eval_gap:.2e}, limit 1e-4)")
    print(f"(tokens, packed_tokens) of the first steps: packed {packed_tokens[:3]}, padded {padded_tokens[:3]}")
    check(all(real == computed for real, computed in packed_tokens) and all(p is None for _, p in padded_tokens),
          "the packed run's steps should compute their real tokens exactly, and the padded run's pack none")
    check(len(packed) == len(padded) == 40 and worst <= 1e-4 and eval_gap <= 1e-4 and len(set(padded)) > 30,
          "the host-packed run is off the padded one (the line above)")


if __name__ == "__main__":
    run_test(test)
