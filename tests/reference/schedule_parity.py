#!/usr/bin/env python3
"""train.lr_schedule against transformers, to the bit: for linear, cosine and constant
schedules after a warm-up, the rate of every optimizer step equals what HF Trainer's
scheduler (get_linear/cosine/constant_schedule_with_warmup, the warm-up's length from
TrainingArguments.get_warmup_steps) sets for that step. The cases include a warm-up
ratio whose product with the step count is not exact in doubles (100 x 0.07 is
7.000000000000001: 8 steps of warm-up), no warm-up,
a warm-up of every step and a one-step run."""
import dataclasses
import json
import os
import subprocess
import sys

import torch
from transformers import TrainingArguments
from transformers.optimization import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                                       get_linear_schedule_with_warmup)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402

PEAK = 3e-4
CASES = [(0.07, 100), (0.1, 30), (0.0, 17), (0.25, 101), (1.0, 8), (0.5, 1)]
KINDS = ("linear", "cosine", "constant")


def hf_rates(kind, ratio, total, work):
    """The lr each of steps 0..total runs at under HF Trainer: the scheduler's rate before
    its step() for that optimizer step."""
    # transformers 4.x takes the share as warmup_ratio; 5.x as a warmup_steps below 1.
    share = "warmup_ratio" if "warmup_ratio" in {f.name for f in dataclasses.fields(TrainingArguments)} else \
        "warmup_steps"
    warmup = TrainingArguments(output_dir=work, report_to=[], **{share: ratio}).get_warmup_steps(total)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    if kind == "linear":
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
    elif kind == "cosine":
        scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total)
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
    rates = []
    for _ in range(total + 1):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test(args, work):
    named = [(kind, ratio, total) for kind in KINDS for ratio, total in CASES]
    argv = [str(x) for kind, ratio, total in named for x in (kind, PEAK, ratio, total)]
    ours = json.loads(subprocess.run([args.probe, "lr-schedule", *argv], check=True, capture_output=True,
                                     text=True, timeout=60).stdout)
    ok = True
    for (kind, ratio, total), got in zip(named, ours):
        want = hf_rates(kind, ratio, total, work)
        first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        same = len(got) == len(want) and first_diff is None
        detail = "" if same else f"; step {first_diff}: ours {got[first_diff]!r}, HF {want[first_diff]!r}"
        print(f"{'ok  ' if same else 'FAIL'} {kind:8s} warmup_ratio {ratio} over {total} steps: "
              f"{len(got)} rates equal to HF's bit for bit{detail}")
        ok &= same
    check(ok, "a schedule's rates differ from HF's (the FAIL lines above)")


if __name__ == "__main__":
    run_test(test, ("--probe",), __doc__)
